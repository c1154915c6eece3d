//! Every grant proven held (issue 42): the real agent over the mock NVML (which lists MPS clients
//! and may lack driver limits), real cgroups named like containerd's, and real processes, some
//! with a stand-in for HAMi-core (`libvgpu.so`, a copy of a test library) really mapped through
//! `LD_PRELOAD`.

use std::{path::PathBuf, process::Command, time::Duration};

use gpushare_agent::{
    snapshot::{GrantView, Snapshot},
    verify::{GrantVerdict, MechanismKind, MechanismState},
};
use gpushare_testkit::{
    nvml::{Scenario, fake_nvml_lib},
    unique, workspace_bin,
};
use serde_json::{Value, json};

use crate::isolation::{Proc, container_cgroup, container_key};
use crate::util::{AgentProcess, needs_root};

const GIB: u64 = 1 << 30;
const U0: &str = "GPU-verify0";
const U1: &str = "GPU-verify1";
/// No ladder step: what the agent does is beside the point here.
const QUIET: &str = "[defaults]\nladder = []\n";

/// Two GPUs; `procs` (pid, bytes) on the first; driver limits as `limits` says; `mps` the pids an
/// MPS server serves there.
fn scenario(procs: &[(u32, u64)], limits: bool, mps: &[u32]) -> Value {
    let list: Vec<_> = procs
        .iter()
        .map(|(pid, b)| json!({ "pid": pid, "used_memory": b }))
        .collect();
    json!({
        "memory_limits_supported": limits,
        "devices": [
            { "uuid": U0, "name": "NVIDIA Fake", "memory_total": 80 * GIB,
              "compute_processes": list, "mps_clients": mps },
            { "uuid": U1, "name": "NVIDIA Fake", "memory_total": 80 * GIB }
        ]
    })
}

fn grant<'a>(s: &'a Snapshot, key: &str, gpu: &str) -> Option<&'a GrantView> {
    s.grants
        .iter()
        .find(|g| g.workload == key && g.gpu_uuid == gpu)
}

fn mechanism(g: &GrantView, k: MechanismKind) -> Option<(MechanismState, String)> {
    g.mechanisms
        .iter()
        .find(|m| m.mechanism == k)
        .map(|m| (m.state, m.reason.clone()))
}

/// Waits until the grant of `key` on the first GPU has `verdict`, and returns it.
fn wait_verdict(agent: &AgentProcess, key: &str, verdict: GrantVerdict) -> GrantView {
    wait_verdict_on(agent, key, U0, verdict)
}

/// Waits until the grant of `key` on `gpu` (a UUID, or `all` for a total) has `verdict`.
fn wait_verdict_on(agent: &AgentProcess, key: &str, gpu: &str, verdict: GrantVerdict) -> GrantView {
    let s = agent.wait_for(Duration::from_secs(20), |s| {
        grant(s, key, gpu).is_some_and(|g| g.verdict == verdict)
    });
    grant(&s, key, gpu).unwrap().clone()
}

/// A copy of a test library named like HAMi-core's, in a directory of its own.
fn fake_hami_core() -> PathBuf {
    let dir = std::env::temp_dir().join(unique("vgpu"));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libvgpu.so");
    std::fs::copy(fake_nvml_lib(), &lib).unwrap();
    lib
}

#[test]
fn plural_only_nvidia_variables_are_unenforced_in_a_dry_run_and_held_by_an_enforcing_agent() {
    needs_root!("plural_only_nvidia_variables");
    let cg = container_cgroup();
    let p = Proc::start(&cg, &[("NVIDIA_GPU_MEMORY_LIMITS", "2147483648")]);
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], false, &[])).unwrap();
    let key = container_key(&cg);
    let plural = (
        MechanismState::Absent,
        "NVIDIA_GPU_MEMORY_LIMITS is set; the toolkit's hook reads NVIDIA_GPU_MEMORY_LIMIT".into(),
    );
    let agent = AgentProcess::start(&sc, QUIET, &["--dry-run"]);
    let g = wait_verdict(&agent, &key, GrantVerdict::Unenforced);
    assert_eq!(
        mechanism(&g, MechanismKind::DriverLimit),
        Some(plural.clone())
    );
    assert_eq!(
        mechanism(&g, MechanismKind::Gpushare).unwrap().0,
        MechanismState::Absent
    );
    let metrics = agent.get("/metrics").1;
    let series = format!(
        "gpushare_grant_enforcement{{workload=\"{key}\",gpu_uuid=\"{U0}\",verdict=\"unenforced\"}} 1"
    );
    assert!(metrics.contains(&series), "{series}\n{metrics}");
    assert!(
        metrics.contains("gpushare_grants{verdict=\"unenforced\"} 1"),
        "{metrics}"
    );
    drop(agent);
    // The same container under an enforcing agent: gpushare holds it.
    let agent = AgentProcess::start(&sc, QUIET, &[]);
    let g = wait_verdict(&agent, &key, GrantVerdict::Held);
    assert_eq!(
        mechanism(&g, MechanismKind::Gpushare),
        Some((MechanismState::InForce, String::new()))
    );
    assert_eq!(mechanism(&g, MechanismKind::DriverLimit), Some(plural));
}

#[test]
fn a_driver_limit_on_a_driver_without_them_is_absent() {
    needs_root!("a_driver_limit_on_a_driver_without_them_is_absent");
    let cg = container_cgroup();
    let p = Proc::start(&cg, &[("NVIDIA_GPU_MEMORY_LIMIT", "2147483648")]);
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], false, &[])).unwrap();
    let agent = AgentProcess::start(&sc, QUIET, &["--dry-run"]);
    let g = wait_verdict(&agent, &container_key(&cg), GrantVerdict::Unenforced);
    assert_eq!(
        mechanism(&g, MechanismKind::DriverLimit),
        Some((
            MechanismState::Absent,
            "driver 550.54.15 has no per-cgroup limits".into()
        ))
    );
    assert_eq!(
        mechanism(&g, MechanismKind::Dmem),
        Some((
            MechanismState::Absent,
            "kernel has no dmem controller".into()
        ))
    );
}

#[test]
fn an_mps_limit_naming_a_gpu_the_process_cannot_see_fails() {
    needs_root!("an_mps_limit_naming_a_gpu_the_process_cannot_see_fails");
    let cg = container_cgroup();
    // A HAMi limit gives the grant (MPS drops every pinned limit, so MPS's grants nothing).
    let p = Proc::start(
        &cg,
        &[
            ("CUDA_VISIBLE_DEVICES", U0),
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                &format!("{U0}=2G,{U1}=2G"),
            ),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "2g"),
        ],
    );
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], false, &[p.pid()])).unwrap();
    let agent = AgentProcess::start(&sc, QUIET, &["--dry-run"]);
    let g = wait_verdict(&agent, &container_key(&cg), GrantVerdict::Unenforced);
    assert_eq!(
        mechanism(&g, MechanismKind::Mps),
        Some((
            MechanismState::Failed,
            format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names GPU {U1}, the process sees only GPU 0")
        ))
    );
}

#[test]
fn an_mps_client_without_a_server_or_its_pipe_directory_fails_and_one_served_is_held() {
    needs_root!("an_mps_client_without_a_server");
    let pipe = std::env::temp_dir().join(unique("mps-pipe"));
    std::fs::create_dir_all(&pipe).unwrap();
    std::fs::write(pipe.join("control"), "").unwrap();
    let pipe_var = pipe.to_str().unwrap().to_string();
    let cg = container_cgroup();
    let p = Proc::start(
        &cg,
        &[
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "2G"),
            ("CUDA_MPS_PIPE_DIRECTORY", &pipe_var),
        ],
    );
    let key = container_key(&cg);
    // No server serves it.
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], false, &[])).unwrap();
    let agent = AgentProcess::start(&sc, QUIET, &["--dry-run"]);
    let g = wait_verdict(&agent, &key, GrantVerdict::Unenforced);
    assert_eq!(
        mechanism(&g, MechanismKind::Mps),
        Some((
            MechanismState::Failed,
            format!("no MPS server serves pid {}", p.pid())
        ))
    );
    // Served, its pipe directory there as it sees it: held.
    sc.write(&scenario(&[(p.pid(), GIB)], false, &[p.pid()]))
        .unwrap();
    let g = wait_verdict(&agent, &key, GrantVerdict::Held);
    assert_eq!(
        mechanism(&g, MechanismKind::Mps),
        Some((MechanismState::InForce, String::new()))
    );
    // A misspelled pipe directory: the client runs unlimited.
    let cg2 = container_cgroup();
    let q = Proc::start(
        &cg2,
        &[
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "2G"),
            ("CUDA_MPS_PIPE_DIRECTORY", &format!("{pipe_var}-typo")),
        ],
    );
    sc.write(&scenario(
        &[(p.pid(), GIB), (q.pid(), GIB)],
        false,
        &[p.pid(), q.pid()],
    ))
    .unwrap();
    let g = wait_verdict(&agent, &container_key(&cg2), GrantVerdict::Unenforced);
    assert_eq!(
        mechanism(&g, MechanismKind::Mps),
        Some((
            MechanismState::Failed,
            format!(
                "the MPS pipe directory is missing as pid {} sees it",
                q.pid()
            )
        ))
    );
    let _ = std::fs::remove_dir_all(&pipe);
}

/// A FUSE mount whose server never answers: every lookup under it blocks until it is dropped
/// (closing its `/dev/fuse` descriptor aborts the connection), and it is then detached. Nothing
/// of this test looks under it.
struct HungFuse {
    dir: PathBuf,
    fuse: Option<std::fs::File>,
}

impl HungFuse {
    fn mount() -> Self {
        use std::{ffi::CString, os::fd::AsRawFd, os::unix::ffi::OsStrExt};
        let dir = std::env::temp_dir().join(unique("hung-fuse"));
        std::fs::create_dir_all(&dir).unwrap();
        // Opened close-on-exec: the agent this test starts does not hold the connection open.
        let fuse = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .unwrap();
        let data = CString::new(format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            fuse.as_raw_fd()
        ))
        .unwrap();
        let target = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let rc = unsafe {
            libc::mount(
                c"hung".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount fuse: {}", std::io::Error::last_os_error());
        Self {
            dir,
            fuse: Some(fuse),
        }
    }
}

impl Drop for HungFuse {
    fn drop(&mut self) {
        use std::{ffi::CString, os::unix::ffi::OsStrExt};
        drop(self.fuse.take());
        let target = CString::new(self.dir.as_os_str().as_bytes()).unwrap();
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A tenant whose GPU process names, as its MPS pipe directory, a FUSE mount that never answers
/// (any user may mount one in its own namespace) does not stop the agent: the look at its pipe
/// directory is bounded, the agent keeps stepping, and a neighbour over its quota is still
/// frozen.
#[test]
fn a_pipe_directory_on_a_fuse_mount_that_never_answers_does_not_stop_the_agent() {
    needs_root!("a_pipe_directory_on_a_fuse_mount_that_never_answers");
    let hung = HungFuse::mount();
    let pipe_var = hung.dir.join("mps").to_str().unwrap().to_string();
    let cg = container_cgroup();
    let p = Proc::start(
        &cg,
        &[
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "2G"),
            ("CUDA_MPS_PIPE_DIRECTORY", &pipe_var),
        ],
    );
    let neighbour = crate::util::group("verify-hung-neighbour");
    let n = crate::util::sleeping(&neighbour);
    let sc = Scenario::create(&scenario(
        &[(p.pid(), GIB), (n.pid(), 3 * GIB)],
        false,
        &[p.pid()],
    ))
    .unwrap();
    let quotas = format!(
        "[defaults]\ngrace = \"0s\"\nladder = [ {{ action = \"freeze\" }} ]\n{}",
        crate::util::cgroup_quota(&neighbour, "2GiB")
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let key = container_key(&cg);
    // The tenant's grant is seen (its pipe directory looked at, and given up on).
    agent.wait_for(Duration::from_secs(20), |s| grant(s, &key, U0).is_some());
    // Still stepping, and still enforcing.
    agent.wait_state(&crate::util::key(&neighbour), "frozen");
    assert!(neighbour.wait_frozen(true), "{}", agent.log());
    let before = agent.state().unwrap().taken_at_unix;
    std::thread::sleep(Duration::from_secs(2));
    let after = agent.state().unwrap().taken_at_unix;
    assert!(
        after > before,
        "the agent stopped stepping\n{}",
        agent.log()
    );
    drop((p, n));
    drop(hung);
}

#[test]
fn a_process_without_the_in_process_limiter_among_processes_with_it_fails_it() {
    needs_root!("a_process_without_the_in_process_limiter");
    let lib = fake_hami_core();
    let preload = lib.to_str().unwrap().to_string();
    let cg = container_cgroup();
    let hami = ("CUDA_DEVICE_MEMORY_LIMIT_0", "2g");
    // The container's init (its environment gives the grant) and a second process, both with
    // the limiter; a third started without it (a static binary, an image without the preload).
    let with = Proc::start(&cg, &[hami, ("LD_PRELOAD", &preload)]);
    let with2 = Proc::start(&cg, &[hami, ("LD_PRELOAD", &preload)]);
    let without = Proc::start(&cg, &[hami]);
    let key = container_key(&cg);
    let sc = Scenario::create(&scenario(
        &[
            (with.pid(), GIB / 2),
            (with2.pid(), GIB / 2),
            (without.pid(), GIB / 2),
        ],
        false,
        &[],
    ))
    .unwrap();
    let quotas = format!("{QUIET}tolerance = \"10%\"\n");
    let agent = AgentProcess::start(&sc, &quotas, &["--dry-run"]);
    let g = wait_verdict(&agent, &key, GrantVerdict::Unenforced);
    assert_eq!(
        mechanism(&g, MechanismKind::InProcess),
        Some((
            MechanismState::Failed,
            format!(
                "HAMi-core not mapped in pid {} (static binary?)",
                without.pid()
            )
        ))
    );
    // Without the process that escaped it: held by HAMi-core.
    drop(without);
    sc.write(&scenario(
        &[(with.pid(), GIB / 2), (with2.pid(), GIB / 2)],
        false,
        &[],
    ))
    .unwrap();
    let g = wait_verdict(&agent, &key, GrantVerdict::Held);
    assert_eq!(
        mechanism(&g, MechanismKind::InProcess),
        Some((MechanismState::InForce, String::new()))
    );
    // Over the grant but within the quota's tolerance (10 %): still held.
    let within = 2 * GIB + 100 * (1 << 20);
    sc.write(&scenario(
        &[(with.pid(), within - GIB), (with2.pid(), GIB)],
        false,
        &[],
    ))
    .unwrap();
    let s = agent.wait_for(Duration::from_secs(20), |s| {
        grant(s, &key, U0).is_some_and(|g| g.used_bytes == within)
    });
    assert_eq!(grant(&s, &key, U0).unwrap().verdict, GrantVerdict::Held);
    // Usage over the grant while the limiter claims to hold it: it failed.
    sc.write(&scenario(
        &[(with.pid(), 2 * GIB), (with2.pid(), GIB)],
        false,
        &[],
    ))
    .unwrap();
    wait_verdict(&agent, &key, GrantVerdict::Violated);
    // `status --verify` says so, for a cron job or a probe.
    let verify = |socket: &std::path::Path| {
        Command::new(workspace_bin("gpushare-agent"))
            .args(["status", "--verify", "--socket"])
            .arg(socket)
            .output()
            .unwrap()
    };
    let out = verify(&agent.socket());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("violated"), "{text}");
    // Back within: every grant held, exit 0.
    sc.write(&scenario(
        &[(with.pid(), GIB / 2), (with2.pid(), GIB / 2)],
        false,
        &[],
    ))
    .unwrap();
    wait_verdict(&agent, &key, GrantVerdict::Held);
    let out = verify(&agent.socket());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // No agent: its own code.
    let out = verify(&agent.dir.join("no-such.sock"));
    assert_eq!(out.status.code(), Some(2));
    drop((with, with2));
    let _ = std::fs::remove_dir_all(lib.parent().unwrap());
}

/// The grant alerts of `deploy/prometheus/alerts.yml` against `alerts_test.yml`: a case per
/// verdict (violated fires after a minute, unenforced after five, held never).
#[test]
fn the_grant_alerts_pass_promtool_test_rules_a_case_per_verdict() {
    let Some(promtool) = crate::prometheus::which("promtool") else {
        return;
    };
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/prometheus/alerts_test.yml");
    gpushare_testkit::output_ok(
        Command::new(&promtool).arg("test").arg("rules").arg(&tests),
        "promtool test rules",
    );
}

/// Under an enforcing agent, usage over a grant is held while the ladder isolates it as the quota
/// says (frozen), and violated once past grace with nothing isolating it (an alert-only ladder).
#[test]
fn over_a_grant_an_enforcing_agent_holds_it_by_isolating_else_it_is_violated() {
    needs_root!("over_a_grant_an_enforcing_agent_holds_it");
    let alert = crate::util::group("verify-alert");
    let freeze = crate::util::group("verify-freeze");
    let a = Proc::start(&alert, &[]);
    let f = Proc::start(&freeze, &[]);
    let sc = Scenario::create(&scenario(
        &[(a.pid(), 3 * GIB), (f.pid(), 3 * GIB)],
        false,
        &[],
    ))
    .unwrap();
    let quotas = format!(
        "[defaults]\ngrace = \"200ms\"\nladder = [ {{ action = \"freeze\" }} ]\n{}\
         [[quota]]\ncgroup = \"{}\"\ngpu_memory = \"2GiB\"\nladder = [ {{ action = \"alert\" }} ]\n",
        crate::util::cgroup_quota(&freeze, "2GiB"),
        alert.rel_path()
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    // Each a total over every GPU (a quota file's entry without a GPU).
    let g = wait_verdict_on(
        &agent,
        &crate::util::key(&alert),
        "all",
        GrantVerdict::Violated,
    );
    assert_eq!(
        mechanism(&g, MechanismKind::Gpushare),
        Some((MechanismState::InForce, String::new()))
    );
    assert!(freeze.wait_frozen(true));
    wait_verdict_on(
        &agent,
        &crate::util::key(&freeze),
        "all",
        GrantVerdict::Held,
    );
}

/// A pod whose grant (a DRA claim's 1 GiB) nothing enforces under an auditing agent (a dry run)
/// gets one Warning Event on its pod naming the grant and why; repeats are not posted again while
/// the verdict stays.
#[test]
fn a_grant_turning_unenforced_gets_an_event_on_its_pod() {
    needs_root!("a_grant_turning_unenforced_gets_an_event_on_its_pod");
    use crate::util::one_gpu;
    use gpushare_fake_kube::FakeApi;
    let api = FakeApi::start();
    let (uid, a, _ga, pa) = crate::kube::one_pod_with_a_claim(&api, "audited-0");
    let sc = Scenario::create(&one_gpu(&[(pa.pid(), 512 << 20)])).unwrap();
    let quotas = format!("{QUIET}{}", api.quota_table(true));
    let agent = AgentProcess::start(&sc, &quotas, &["--dry-run"]);
    let s = agent.wait_for(Duration::from_secs(30), |s| {
        s.grants
            .iter()
            .any(|g| g.workload.ends_with(&a) && g.verdict == GrantVerdict::Unenforced)
    });
    let steps = s.taken_at_unix;
    // A few more steps: the verdict stays, no second Event.
    agent.wait_for(Duration::from_secs(10), |s| s.taken_at_unix > steps + 1.0);
    let events = api.with(|s| s.events.clone());
    let grants: Vec<&Value> = events
        .values()
        .filter(|e| e["reason"] == "GpuMemoryGrantUnenforced")
        .collect();
    assert_eq!(grants.len(), 1, "{events:?}");
    let e = grants[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["involvedObject"]["uid"], uid.as_str());
    assert_eq!(e["count"], 1, "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("container a (1.0 GiB on GPU-")
            && msg.contains("is unenforced")
            && msg.contains("gpushare absent: dry run"),
        "{msg}"
    );
    drop(pa);
}

/// The state of `key`'s row on the first GPU once it reads `state`.
fn wait_row_state(agent: &AgentProcess, key: &str, state: &str) -> Snapshot {
    agent.wait_for(Duration::from_secs(20), |s| {
        crate::util::workload(s, key, U0).is_some_and(|w| w.state == state)
    })
}

/// The operator's opt-in (`[defaults] take_unheld = true`): an auditor (a dry run) takes, with
/// its own ladder, a grant no other mechanism holds. A container over its HAMi grant with
/// HAMi-core mapped in none of its processes (unenforced) is frozen, `gpushare` in force; one with
/// it mapped, within its grant (held), is not taken. Without the opt-in nothing is acted on; a
/// SIGTERM thaws what the auditor froze.
#[test]
fn an_auditor_that_opted_in_takes_an_unenforced_grant_with_its_ladder_and_leaves_a_held_one() {
    needs_root!("an_auditor_that_opted_in_takes_an_unenforced_grant");
    let lib = fake_hami_core();
    let preload = lib.to_str().unwrap().to_string();
    let hami = ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g");
    let (bare, mapped) = (container_cgroup(), container_cgroup());
    let b = Proc::start(&bare, &[hami]);
    let m = Proc::start(&mapped, &[hami, ("LD_PRELOAD", &preload)]);
    let (bare_key, mapped_key) = (container_key(&bare), container_key(&mapped));
    let sc = Scenario::create(&scenario(
        &[(b.pid(), 2 * GIB), (m.pid(), GIB / 2)],
        false,
        &[],
    ))
    .unwrap();
    let ladder = "[defaults]\ngrace = \"200ms\"\nladder = [ { action = \"freeze\" } ]\n";
    let mut agent = AgentProcess::start(&sc, ladder, &["--dry-run"]);
    // Without the opt-in: reported, never acted on, however long it stays over.
    wait_row_state(&agent, &bare_key, "would_freeze");
    agent.steps_over(Duration::from_secs(2), |_| assert!(!bare.is_frozen()));
    let g = wait_verdict(&agent, &bare_key, GrantVerdict::Unenforced);
    let gpushare = mechanism(&g, MechanismKind::Gpushare).unwrap();
    assert_eq!(gpushare.0, MechanismState::Absent);
    // Opted in: the unenforced grant is taken, the held one is not.
    agent.write_quotas(&format!("{ladder}take_unheld = true\n"));
    assert!(bare.wait_frozen(true), "{}", agent.log());
    let s = wait_row_state(&agent, &bare_key, "frozen");
    let g = grant(&s, &bare_key, U0).unwrap();
    assert_eq!(g.verdict, GrantVerdict::Held, "{g:?}");
    assert_eq!(
        mechanism(g, MechanismKind::Gpushare),
        Some((
            MechanismState::InForce,
            "taken: no other mechanism held the grant (take_unheld)".into()
        ))
    );
    // Held by HAMi-core, the other stays untaken, step after step.
    agent.steps_over(Duration::from_secs(2), |s| {
        let g = grant(s, &mapped_key, U0).unwrap();
        assert_eq!(g.verdict, GrantVerdict::Held, "{g:?}");
        let gpushare = mechanism(g, MechanismKind::Gpushare).unwrap();
        assert_eq!(gpushare.0, MechanismState::Absent);
        assert!(!mapped.is_frozen() && bare.is_frozen());
    });
    // SIGTERM thaws what the auditor froze.
    assert_eq!(agent.stop(), Some(0));
    assert!(bare.wait_frozen(false));
    drop((b, m));
    let _ = std::fs::remove_dir_all(lib.parent().unwrap());
}
