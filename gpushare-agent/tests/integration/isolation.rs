//! Quotas, policy and soft isolation end to end: the agent binary, the mock NVML, real cgroups and
//! real processes, real freezes and signals.

use std::{path::Path, process::Child, time::Duration};

use gpushare_testkit::{TestCgroup, nvml::Scenario, unique};
use serde_json::json;

use crate::util::{AgentProcess, cgroup_quota, counter_value, key, usr1_recorder, workload};
use crate::util::{PlacedGroup, group, needs_root};

const GIB: u64 = 1 << 30;
const FAST: &str = r#"
[defaults]
grace = "200ms"
ladder = [ { action = "alert" }, { action = "signal", signal = "SIGUSR1", after = "300ms" }, { action = "freeze", after = "800ms" } ]
"#;

pub(crate) struct Proc {
    child: Child,
    log: std::path::PathBuf,
}

impl Proc {
    pub(crate) fn start(cg: &TestCgroup, env: &[(&str, &str)]) -> Self {
        let log = std::env::temp_dir().join(unique("usr1"));
        let mut cmd = usr1_recorder(&log);
        cmd.envs(env.iter().copied());
        Self {
            child: cg.spawn(&mut cmd).unwrap(),
            log,
        }
    }
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
    fn usr1s(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Freeze after a grace period of 200 ms.
const FREEZE: &str = "[defaults]\ngrace = \"200ms\"\nladder = [ { action = \"freeze\" } ]\n";

fn scenario(procs: &[(u32, u64)]) -> serde_json::Value {
    let list: Vec<_> = procs
        .iter()
        .map(|(pid, b)| json!({ "pid": pid, "used_memory": b }))
        .collect();
    json!({ "devices": [{ "uuid": "GPU-iso", "name": "NVIDIA Fake", "memory_total": 80 * GIB, "compute_processes": list }] })
}

/// A test group named like a containerd container's scope (`cri-containerd-<64 hex>.scope`) at
/// containerd's place (`/system.slice`), so the agent sees a container (`containerd://<id>`) with
/// no runtime spec on disk.
pub(crate) fn container_cgroup() -> PlacedGroup {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let id = format!(
        "{:016x}{:016x}{:016x}{:016x}",
        u64::from(std::process::id()),
        N.fetch_add(1, Ordering::Relaxed),
        nanos,
        0x6770_7573_6861_7265u64
    );
    PlacedGroup::create(&format!("system.slice/cri-containerd-{id}.scope"))
}

pub(crate) fn container_key(cg: &TestCgroup) -> String {
    let scope = cg.rel_path().rsplit('/').next().unwrap();
    let id = scope
        .strip_prefix("cri-containerd-")
        .and_then(|s| s.strip_suffix(".scope"))
        .unwrap();
    format!("containerd://{id}")
}

#[test]
fn over_quota_workload_is_signalled_then_frozen_neighbours_untouched_and_raising_the_quota_thaws_it()
 {
    needs_root!("over_quota_workload_is_signalled_then_frozen");
    let a_cg = group("iso-a");
    let b_cg = group("iso-b");
    // Outside any quota: a plain cgroup nobody names, with a huge footprint. Never touched.
    let c_cg = group("iso-c");
    let mut a = Proc::start(&a_cg, &[]);
    let mut b = Proc::start(&b_cg, &[]);
    let mut c = Proc::start(&c_cg, &[]);
    let sc = Scenario::create(&scenario(&[
        (a.pid(), GIB),
        (b.pid(), GIB),
        (c.pid(), 60 * GIB),
    ]))
    .unwrap();
    let quotas = format!(
        "{FAST}{}{}",
        cgroup_quota(&a_cg, "2GiB"),
        cgroup_quota(&b_cg, "2GiB")
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        workload(s, &key(&a_cg), "all").is_some_and(|w| w.used_bytes == GIB)
    });
    assert_eq!(workload(&s, &key(&a_cg), "all").unwrap().state, "ok");

    // A grows past its quota.
    sc.write(&scenario(&[
        (a.pid(), 3 * GIB),
        (b.pid(), GIB),
        (c.pid(), 60 * GIB),
    ]))
    .unwrap();
    let s = agent.wait_state(&key(&a_cg), "frozen");
    assert!(a_cg.wait_frozen(true), "A's cgroup reports frozen");
    assert!(a.usr1s() >= 1, "A was signalled before it was frozen");
    assert!(
        agent.ledger().exists()
            && std::fs::read_to_string(agent.ledger())
                .unwrap()
                .contains(a_cg.rel_path())
    );
    let wb = workload(&s, &key(&b_cg), "all").unwrap();
    assert_eq!(wb.state, "ok");
    assert!(!b_cg.is_frozen() && !c_cg.is_frozen());
    assert_eq!((b.usr1s(), c.usr1s()), (0, 0), "neighbours never signalled");
    assert!(b.alive() && c.alive() && a.alive());
    let metrics = agent.get("/metrics").1;
    assert!(
        metrics.contains(r#"gpushare_enforcement_actions_total{action="freeze",result="ok"} 1"#),
        "{metrics}"
    );

    // Raising A's quota in the file thaws it, without a restart.
    agent.write_quotas(&format!(
        "{FAST}{}{}",
        cgroup_quota(&a_cg, "4GiB"),
        cgroup_quota(&b_cg, "2GiB")
    ));
    agent.wait_state(&key(&a_cg), "ok");
    assert!(a_cg.wait_frozen(false), "A thawed");
    assert!(
        !std::fs::read_to_string(agent.ledger())
            .unwrap()
            .contains(a_cg.rel_path())
    );
    assert!(c.alive() && !c_cg.is_frozen());
}

#[test]
fn elastic_workload_borrows_idle_memory_and_is_isolated_under_pressure() {
    needs_root!("elastic_workload_borrows");
    let a_cg = group("el-a");
    let other_cg = group("el-other");
    let a = Proc::start(&a_cg, &[]);
    let other = Proc::start(&other_cg, &[]);
    let sc = Scenario::create(&scenario(&[(a.pid(), 3 * GIB), (other.pid(), GIB)])).unwrap();
    let quotas = format!(
        "[defaults]\nmode = \"elastic\"\nelastic_reserve = \"10GiB\"\ngrace = \"200ms\"\nladder = [ {{ action = \"freeze\" }} ]\n{}",
        cgroup_quota(&a_cg, "2GiB")
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    agent.wait_for(Duration::from_secs(5), |s| {
        workload(s, &key(&a_cg), "all").is_some_and(|w| w.used_bytes == 3 * GIB)
    });
    // Over its quota but the GPU has 76 GiB free: left alone for several samples.
    let s = agent.steps_over(Duration::from_millis(1500), |_| {});
    assert_eq!(workload(&s, &key(&a_cg), "all").unwrap().state, "ok");
    assert!(!a_cg.is_frozen());
    // Pressure: another process takes 70 GiB, free falls to 7 GiB < 10 GiB reserve.
    sc.write(&scenario(&[(a.pid(), 3 * GIB), (other.pid(), 70 * GIB)]))
        .unwrap();
    agent.wait_state(&key(&a_cg), "frozen");
    assert!(a_cg.wait_frozen(true));
    assert!(
        !other_cg.is_frozen(),
        "the unquota'd process is never touched"
    );
    // Pressure gone: it may borrow again.
    sc.write(&scenario(&[(a.pid(), 3 * GIB), (other.pid(), GIB)]))
        .unwrap();
    agent.wait_state(&key(&a_cg), "ok");
    assert!(a_cg.wait_frozen(false));
}

#[test]
fn quotas_from_the_environment_gpushare_and_hami() {
    needs_root!("quotas_from_the_environment");
    // Env quotas apply to containers and pods: these groups are named like containerd's scopes.
    // No runtime spec exists for them, so the quota comes from each container's first process.
    let cgs: Vec<PlacedGroup> = (0..4).map(|_| container_cgroup()).collect();
    let procs = [
        Proc::start(
            &cgs[0],
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "2"),
                ("ALIYUN_COM_GPU_MEM_IDX", "0"),
            ],
        ),
        Proc::start(
            &cgs[1],
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "2"),
                ("ALIYUN_COM_GPU_MEM_IDX", "0"),
            ],
        ),
        Proc::start(&cgs[2], &[("CUDA_DEVICE_MEMORY_LIMIT_0", "2048m")]),
        Proc::start(&cgs[3], &[("CUDA_DEVICE_MEMORY_LIMIT_0", "2048m")]),
    ];
    let usage = [3 * GIB, GIB, 3 * GIB, GIB];
    let list: Vec<(u32, u64)> = procs.iter().zip(usage).map(|(p, u)| (p.pid(), u)).collect();
    let sc = Scenario::create(&scenario(&list)).unwrap();
    let quotas = "[defaults]\ngrace = \"200ms\"\nladder = [ { action = \"freeze\" } ]\n";
    let agent = AgentProcess::start(&sc, quotas, &[]);
    let unit_key = container_key;
    let s = agent.wait_for(Duration::from_secs(10), |s| {
        [0, 2].iter().all(|&i| {
            s.workloads
                .iter()
                .any(|w| w.workload == unit_key(&cgs[i]) && w.state == "frozen")
        })
    });
    assert!(
        cgs[0].wait_frozen(true),
        "GPUShare env: 3 GiB over 2 GiB is isolated"
    );
    assert!(
        cgs[2].wait_frozen(true),
        "HAMi env: 3 GiB over 2048m is isolated"
    );
    // No runtime spec exists for these: the quota is labelled lower trust, and `status` says so.
    let metrics = agent.get("/metrics").1;
    assert!(
        metrics.lines().any(
            |l| l.starts_with("gpushare_workload_gpu_memory_quota_bytes{")
                && l.contains(&unit_key(&cgs[1]))
                && l.contains("quota_trust=\"init_environ\"")
        ),
        "{metrics}"
    );
    let shown = gpushare_agent::status::render_status(&s);
    assert!(
        shown.contains(&format!(
            "{}: environment quota read from its init process",
            unit_key(&cgs[1])
        )),
        "{shown}"
    );
    for i in [1, 3] {
        let w = s
            .workloads
            .iter()
            .find(|w| w.workload == unit_key(&cgs[i]))
            .unwrap();
        assert_eq!(w.state, "ok", "{w:?}");
        assert_eq!(w.quota_bytes, Some(2 * GIB));
        assert!(
            !cgs[i].is_frozen(),
            "1 GiB under a 2 GiB env quota is left alone"
        );
    }
}

/// A workload (a [`Proc`] in a group named after `tag`) using 3 GiB under a 2 GiB quota with the
/// ladder of `defaults`, and an agent (started with `args`) that has frozen it.
fn frozen_over_quota(
    tag: &str,
    defaults: &str,
    args: &[&str],
) -> (TestCgroup, Proc, Scenario, AgentProcess) {
    let cg = group(tag);
    let a = Proc::start(&cg, &[]);
    let sc = Scenario::create(&scenario(&[(a.pid(), 3 * GIB)])).unwrap();
    let quotas = format!("{defaults}{}", cgroup_quota(&cg, "2GiB"));
    let agent = AgentProcess::start(&sc, &quotas, args);
    agent.wait_state(&key(&cg), "frozen");
    assert!(cg.wait_frozen(true));
    (cg, a, sc, agent)
}

#[test]
fn sigkill_while_frozen_then_restart_keeps_what_still_applies_and_thaws_what_does_not() {
    needs_root!("sigkill_while_frozen");
    let (a_cg, a, sc, mut agent) = frozen_over_quota("crash-a", FREEZE, &[]);

    // Crash: nobody thaws; the ledger says who froze it.
    agent.sigkill();
    assert!(a_cg.is_frozen());
    assert!(
        std::fs::read_to_string(agent.ledger())
            .unwrap()
            .contains(a_cg.rel_path())
    );
    // Restart while it is still over quota: it stays frozen, and the agent owns it again.
    agent.restart();
    let s = agent.wait_state(&key(&a_cg), "frozen");
    assert_eq!(
        workload(&s, &key(&a_cg), "all").unwrap().used_bytes,
        3 * GIB
    );
    agent.steps_over(Duration::from_millis(600), |_| {});
    assert!(
        a_cg.is_frozen(),
        "still liable: kept frozen across the restart"
    );
    assert!(
        agent
            .log()
            .contains("took over 1 freeze(s) recorded by an earlier run"),
        "{}",
        agent.log()
    );

    // Crash again; meanwhile the workload went back under quota. The restarted agent thaws it.
    agent.sigkill();
    sc.write(&scenario(&[(a.pid(), GIB)])).unwrap();
    agent.restart();
    assert!(
        a_cg.wait_frozen(false),
        "no longer liable: thawed at start\n{}",
        agent.log()
    );
    assert!(
        !std::fs::read_to_string(agent.ledger())
            .unwrap()
            .contains(a_cg.rel_path())
    );

    // SIGTERM thaws what the agent froze.
    sc.write(&scenario(&[(a.pid(), 3 * GIB)])).unwrap();
    agent.wait_state(&key(&a_cg), "frozen");
    assert!(a_cg.wait_frozen(true));
    assert_eq!(agent.stop(), Some(0));
    assert!(a_cg.wait_frozen(false), "SIGTERM thawed it");
}

#[test]
fn a_bad_quota_file_is_rejected_with_its_location_and_the_last_good_one_stays() {
    needs_root!("a_bad_quota_file_is_rejected");
    let a_cg = group("bad-a");
    let a = Proc::start(&a_cg, &[]);
    let sc = Scenario::create(&scenario(&[(a.pid(), GIB)])).unwrap();
    let good = format!("{FREEZE}{}", cgroup_quota(&a_cg, "2GiB"));
    let agent = AgentProcess::start(&sc, &good, &[]);
    assert!(
        agent
            .get("/metrics")
            .1
            .contains("gpushare_quota_config_valid 1")
    );
    // A bare number is ambiguous: rejected at line 7, column 14 (the value).
    agent.write_quotas(&good.replace("\"2GiB\"", "2048"));
    agent.wait_for(Duration::from_secs(15), |s| !s.counters.quota_config_valid);
    let log = agent.log();
    let path = agent.quotas_path().display().to_string();
    assert!(
        log.contains(&format!(
            "{path}:7:14: `gpu_memory = 2048` is a bare number"
        )),
        "located error in the log:\n{log}"
    );
    assert!(
        agent
            .get("/metrics")
            .1
            .contains("gpushare_quota_config_valid 0")
    );
    // The last good configuration is still in force: the 2 GiB quota still isolates A.
    sc.write(&scenario(&[(a.pid(), 3 * GIB)])).unwrap();
    agent.wait_state(&key(&a_cg), "frozen");
    assert!(a_cg.wait_frozen(true));
    assert!(Path::new(&path).exists());
}

#[test]
fn an_operator_release_thaws_and_the_ladder_starts_again() {
    needs_root!("an_operator_release_thaws");
    let (a_cg, _a, _sc, agent) = frozen_over_quota(
        "rel-a",
        "[defaults]\ngrace = \"1s\"\nladder = [ { action = \"freeze\" } ]\n",
        &[],
    );
    let (code, body) = agent.post_local(
        "/api/v1/release",
        &json!({ "workload": key(&a_cg) }).to_string(),
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("released"), "{body}");
    assert!(a_cg.wait_frozen(false), "released: thawed");
    // A fresh grace period: not frozen again at once...
    let s = agent.state().unwrap();
    assert_ne!(workload(&s, &key(&a_cg), "all").unwrap().state, "frozen");
    // ...but, still over quota, frozen again once it has passed.
    agent.wait_state(&key(&a_cg), "frozen");
    // Unknown names get a clear answer.
    let (code, body) = agent.post_local("/api/v1/release", r#"{"workload":"docker://nope"}"#);
    assert_eq!(code, 404);
    assert!(body.contains("no workload under a quota matches"), "{body}");
}

#[test]
fn an_env_limit_one_process_of_a_shared_unit_sets_does_not_freeze_the_unit() {
    needs_root!("an_env_limit_of_a_shared_unit");
    // A unit that runs many users' processes (cron.service, a notebook hub): one of them sets a
    // tiny HAMi limit in its own environment. Env quotas are only for containers and pods.
    let unit = TestCgroup::create(&format!("{}.service", unique("shared"))).unwrap();
    let mut tiny = Proc::start(&unit, &[("CUDA_DEVICE_MEMORY_LIMIT", "1m")]);
    let mut other = Proc::start(&unit, &[]);
    let sc = Scenario::create(&scenario(&[(tiny.pid(), GIB), (other.pid(), GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, FAST, &[]);
    let key = format!("unit://{}", unit.rel_path());
    agent.wait_for(Duration::from_secs(10), |s| {
        s.processes.iter().filter(|p| p.workload == key).count() == 2
    });
    // Well past the grace period and every step of the ladder.
    let s = agent.steps_over(Duration::from_millis(2000), |_| {});
    let rows: Vec<_> = s.workloads.iter().filter(|w| w.workload == key).collect();
    assert!(!rows.is_empty());
    for w in &rows {
        assert_eq!((w.quota_bytes, w.state.as_str()), (None, "ok"), "{w:?}");
    }
    assert!(!unit.is_frozen(), "the unit is not frozen");
    assert_eq!((tiny.usr1s(), other.usr1s()), (0, 0), "nobody signalled");
    assert!(tiny.alive() && other.alive());
}

#[test]
fn an_invalid_file_at_start_observes_only_and_a_protected_workload_is_never_signalled() {
    needs_root!("an_invalid_file_at_start");
    // A container with a 1 GiB env quota, using 2 GiB, that the operator protected; the file also
    // has an error. Starting with the built-in defaults would signal it (SIGUSR1 after 5 s).
    let cg = container_cgroup();
    let p = Proc::start(&cg, &[("ALIYUN_COM_GPU_MEM_CONTAINER", "1")]);
    let sc = Scenario::create(&scenario(&[(p.pid(), 2 * GIB)])).unwrap();
    let quotas = format!(
        "protect = [\"{}\"]\n[defaults]\ngrace = \"200ms\"\n\n[[quota]]\nunit = \"x.service\"\ngpu_memory = 5\n",
        container_key(&cg)
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    agent.steps_over(Duration::from_millis(6500), |_| {});
    assert_eq!(
        p.usr1s(),
        0,
        "signalled while the operator's file was invalid"
    );
    assert!(!cg.is_frozen());
    let (_, body) = agent.get_local("/api/v1/state");
    assert!(body.contains("observe only"), "the state says so: {body}");
    assert!(agent.log().contains("observe only"), "{}", agent.log());
    let metrics = agent.get("/metrics").1;
    assert!(
        metrics.contains("gpushare_quota_config_valid 0"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("action=\"signal\""),
        "no signal step ran: {metrics}"
    );
    // A valid file ends observe-only mode: its protect list is now in force.
    agent.write_quotas(&format!(
        "protect = [\"{}\"]\n[defaults]\ngrace = \"200ms\"\n",
        container_key(&cg)
    ));
    agent.wait_for(Duration::from_secs(15), |s| s.counters.quota_config_valid);
    let (_, body) = agent.get_local("/api/v1/state");
    assert!(!body.contains("observe only"), "{body}");
    agent.steps_over(Duration::from_millis(1000), |_| {});
    assert_eq!(p.usr1s(), 0, "protected");
}

#[test]
fn an_invalid_file_at_start_uses_the_last_good_configuration_kept_in_the_state_directory() {
    needs_root!("the_last_good_configuration_is_kept");
    let protected = container_cgroup();
    let p = Proc::start(&protected, &[("ALIYUN_COM_GPU_MEM_CONTAINER", "1")]);
    let b_cg = group("kept-b");
    let b = Proc::start(&b_cg, &[]);
    let sc = Scenario::create(&scenario(&[(p.pid(), 2 * GIB), (b.pid(), GIB)])).unwrap();
    let good = format!(
        "protect = [\"{}\"]\n[defaults]\ngrace = \"200ms\"\nladder = [ {{ action = \"freeze\" }} ]\n{}",
        container_key(&protected),
        cgroup_quota(&b_cg, "2GiB")
    );
    let mut agent = AgentProcess::start(&sc, &good, &[]);
    agent.wait_state(&key(&b_cg), "ok");
    assert_eq!(agent.stop(), Some(0));
    // The operator breaks the file while the agent is down; B grows past its quota.
    agent.write_quotas(&good.replace("\"2GiB\"", "2048"));
    sc.write(&scenario(&[(p.pid(), 2 * GIB), (b.pid(), 3 * GIB)]))
        .unwrap();
    agent.restart();
    assert!(
        agent.log().contains("last good configuration"),
        "the log says which configuration is in force:\n{}",
        agent.log()
    );
    // The kept configuration is enforced: B is frozen by its quota; the protected one is not.
    agent.wait_state(&key(&b_cg), "frozen");
    assert!(b_cg.wait_frozen(true));
    assert!(!protected.is_frozen());
    assert_eq!(p.usr1s(), 0);
}

#[test]
fn a_signal_step_goes_only_to_processes_that_catch_the_signal() {
    needs_root!("a_signal_step_goes_only_to_catchers");
    // The default ladder (alert, SIGUSR1 after 5 s, freeze after 15 s) on two workloads over
    // quota: one process has no handler (SIGUSR1 would kill it), the other catches SIGUSR1.
    let plain_cg = group("sig-plain");
    let catcher_cg = group("sig-catch");
    let mut plain = plain_cg
        .spawn(
            std::process::Command::new("sleep")
                .arg("1000")
                .stdin(std::process::Stdio::null()),
        )
        .unwrap();
    let mut catcher = Proc::start(&catcher_cg, &[]);
    let sc = Scenario::create(&scenario(&[
        (plain.id(), 3 * GIB),
        (catcher.pid(), 3 * GIB),
    ]))
    .unwrap();
    let quotas = format!(
        "[defaults]\ngrace = \"200ms\"\n{}{}",
        cgroup_quota(&plain_cg, "2GiB"),
        cgroup_quota(&catcher_cg, "2GiB")
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(12);
    while catcher.usr1s() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        catcher.usr1s() >= 1,
        "the catcher got SIGUSR1\n{}",
        agent.log()
    );
    // The signal went to both in one step: half a second of steps more, for the one without a
    // handler to have died if it would.
    agent.steps_over(Duration::from_millis(500), |_| {});
    let gone = plain.try_wait().unwrap();
    let _ = plain.kill();
    let _ = plain.wait();
    assert_eq!(
        gone, None,
        "the process without a handler survived the signal step"
    );
    assert!(catcher.alive());
    let metrics = agent.get("/metrics").1;
    assert!(
        metrics.contains(
            r#"gpushare_enforcement_actions_total{action="signal",result="not_caught"} 1"#
        ),
        "the skipped process is counted:\n{metrics}"
    );
    assert!(
        agent.log().contains("does not catch SIGUSR1"),
        "and logged:\n{}",
        agent.log()
    );
}

#[test]
fn a_reload_that_changes_the_gpushare_unit_reaches_running_containers() {
    needs_root!("a_reload_that_changes_the_gpushare_unit");
    // A container granted 2 (GiB, as configured) uses 1 GiB: within quota. The operator finds the
    // device plugin runs with --memory-unit MiB and fixes the setting: the container, still running,
    // is now over its 2 MiB quota.
    let cg = container_cgroup();
    let p = Proc::start(&cg, &[("ALIYUN_COM_GPU_MEM_CONTAINER", "2")]);
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)])).unwrap();
    let fast = "[defaults]\ngrace = \"200ms\"\nladder = [ { action = \"freeze\" } ]\n";
    let agent = AgentProcess::start(&sc, fast, &[]);
    let key = container_key(&cg);
    let row = |s: &gpushare_agent::snapshot::Snapshot| {
        s.workloads
            .iter()
            .find(|w| w.workload == key)
            .map(|w| (w.quota_bytes, w.state.clone()))
    };
    agent.wait_for(Duration::from_secs(10), |s| {
        row(s) == Some((Some(2 * GIB), "ok".to_string()))
    });
    agent.write_quotas(&format!("{fast}gpushare_memory_unit = \"MiB\"\n"));
    agent.wait_for(Duration::from_secs(15), |s| {
        row(s) == Some((Some(2 << 20), "frozen".to_string()))
    });
    assert!(cg.wait_frozen(true));
}

#[test]
fn a_dry_run_decides_and_reports_the_whole_ladder_but_signals_and_freezes_nothing() {
    needs_root!("a_dry_run_decides_and_reports");
    let cg = group("dry");
    let mut a = Proc::start(&cg, &[]);
    let sc = Scenario::create(&scenario(&[(a.pid(), 3 * GIB)])).unwrap();
    let quotas = format!("{FAST}{}", cgroup_quota(&cg, "2GiB"));
    let agent = AgentProcess::start(&sc, &quotas, &["--dry-run"]);
    // It reports what the ladder would have done (never `frozen`: nothing was)...
    let s = agent.wait_state(&key(&cg), "would_freeze");
    assert!(s.health.dry_run);
    // ... and what it would have done, in the metrics and the log ...
    let metrics = agent.get("/metrics").1;
    for action in ["alert", "signal", "freeze"] {
        assert!(
            counter_value(
                &metrics,
                "gpushare_enforcement_actions_total",
                &format!("action=\"{action}\",result=\"dry_run\"")
            ) >= 1.0,
            "{action} reported as a dry run:\n{metrics}"
        );
        assert_eq!(
            counter_value(
                &metrics,
                "gpushare_enforcement_actions_total",
                &format!("action=\"{action}\",result=\"ok\"")
            ),
            0.0,
            "{action} done in a dry run:\n{metrics}"
        );
    }
    let log = agent.log();
    assert!(log.contains("dry run: would send signal"), "{log}");
    assert!(log.contains("dry run: would freeze"), "{log}");
    // ... while nothing was touched: a few more steps, and still no signal, no freeze, no
    // record, no mark.
    agent.steps_over(Duration::from_millis(600), |_| {});
    assert!(!cg.is_frozen(), "frozen in a dry run");
    assert_eq!(
        std::fs::read_to_string(cg.dir().join("cgroup.freeze"))
            .unwrap()
            .trim(),
        "0",
        "cgroup.freeze written in a dry run"
    );
    assert_eq!(a.usr1s(), 0, "signalled in a dry run");
    assert!(a.alive());
    assert!(!agent.ledger().exists(), "a ledger written in a dry run");
    assert!(
        gpushare_agent::enforce::marks::read(cg.dir()).is_none(),
        "a mark set in a dry run"
    );
}

#[test]
fn keep_frozen_on_exit_leaves_the_freeze_to_the_next_start_which_takes_it_over() {
    needs_root!("keep_frozen_on_exit");
    let (cg, a, sc, mut agent) = frozen_over_quota("keep", FREEZE, &["--keep-frozen-on-exit"]);
    // SIGTERM: a clean exit that leaves the freeze, recorded and marked, in place.
    // The agent has exited: nothing can thaw the group after this.
    assert_eq!(agent.stop(), Some(0));
    assert!(
        cg.is_frozen(),
        "thawed on exit despite --keep-frozen-on-exit"
    );
    assert_eq!(
        std::fs::read_to_string(cg.dir().join("cgroup.freeze"))
            .unwrap()
            .trim(),
        "1",
        "the freeze request is left in place"
    );
    assert!(
        std::fs::read_to_string(agent.ledger())
            .unwrap()
            .contains(cg.rel_path()),
        "the freeze left in place is recorded"
    );
    assert!(gpushare_agent::enforce::marks::read(cg.dir()).is_some());
    assert!(
        agent.log().contains("leaving 1 workload(s) frozen"),
        "{}",
        agent.log()
    );
    // The next start takes it over: reported frozen, counted as adopted, and thawed by it once
    // the workload is back within quota.
    agent.restart();
    agent.wait_for(Duration::from_secs(10), |s| {
        workload(s, &key(&cg), "all").is_some_and(|w| w.state == "frozen")
            && s.counters.external_changes.get("adopted") == Some(1)
    });
    assert!(cg.is_frozen());
    sc.write(&scenario(&[(a.pid(), GIB)])).unwrap();
    agent.wait_state(&key(&cg), "ok");
    assert!(
        cg.wait_frozen(false),
        "the adopted freeze is the agent's own"
    );
    assert!(
        !std::fs::read_to_string(agent.ledger())
            .unwrap()
            .contains(cg.rel_path())
    );
}

/// Every state an action could cause (and its way there): what a dry run must never report.
const ACTED: [&str; 8] = [
    "signalled",
    "freezing",
    "frozen",
    "suspending",
    "suspended",
    "resuming",
    "killing",
    "killed",
];

/// Issue 41: a dry run reports what it would do, as what it would do, in the API, `status` and
/// `/metrics`, for every ladder step that acts (signal, freeze, suspend, kill: one workload each,
/// each ladder that one step after an alert). It once reported `frozen` ("freeze requested 1
/// time(s), not done yet") for workloads it never touched.
#[test]
fn a_dry_run_never_reports_a_state_only_an_action_could_cause() {
    needs_root!("a_dry_run_never_reports_a_state_only_an_action_could_cause");
    let steps = [
        (
            "signal",
            r#"{ action = "signal", signal = "SIGUSR1" }"#,
            "would_signal",
        ),
        ("freeze", r#"{ action = "freeze" }"#, "would_freeze"),
        ("suspend", r#"{ action = "suspend" }"#, "would_suspend"),
        (
            "kill",
            r#"{ action = "kill", signal = "SIGKILL" }"#,
            "would_kill",
        ),
    ];
    let groups: Vec<TestCgroup> = steps
        .iter()
        .map(|(n, ..)| group(&format!("dry-{n}")))
        .collect();
    let mut procs: Vec<Proc> = groups.iter().map(|cg| Proc::start(cg, &[])).collect();
    // With the mock libcuda, so that the suspend step is available (and would be taken).
    let sc = Scenario::create(&crate::suspend::scenario(
        &procs.iter().map(|p| (p.pid(), 3 * GIB)).collect::<Vec<_>>(),
        json!({}),
    ))
    .unwrap();
    let mut quotas = String::from("[defaults]\ngrace = \"0s\"\n");
    for ((_, step, _), cg) in steps.iter().zip(&groups) {
        quotas += &format!(
            "{}ladder = [ {{ action = \"alert\" }}, {step} ]\n",
            cgroup_quota(cg, "2GiB")
        );
    }
    let mut args = crate::suspend::cuda_args();
    args.push("--dry-run".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = AgentProcess::start(&sc, &quotas, &args);
    let want = |s: &gpushare_agent::snapshot::Snapshot| {
        steps.iter().zip(&groups).all(|((.., state), cg)| {
            workload(s, &key(cg), "all").is_some_and(|w| w.state == *state)
        })
    };
    agent.wait_for(Duration::from_secs(20), want);
    // A few more steps: it stays so, and nothing was done.
    let s = agent.steps_over(Duration::from_millis(600), |s| assert!(want(s), "{s:?}"));
    for ((name, _, state), cg) in steps.iter().zip(&groups) {
        let row = workload(&s, &key(cg), "all").unwrap();
        assert!(
            row.detail.is_empty() || row.detail.starts_with("dry run: would"),
            "{name}: {:?}",
            row.detail
        );
        assert!(
            !ACTED.contains(&row.state.as_str()),
            "{name}: {}",
            row.state
        );
        assert!(!cg.is_frozen(), "{name}: frozen in a dry run");
        assert_eq!(*state, row.state);
    }
    for p in &mut procs {
        assert!(p.alive(), "killed in a dry run");
        assert_eq!(p.usr1s(), 0, "signalled in a dry run");
    }
    // `status`, as an operator reads it.
    let out = std::process::Command::new(gpushare_testkit::workspace_bin("gpushare-agent"))
        .args(["status", "--socket"])
        .arg(agent.socket())
        .output()
        .unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    for (.., state) in &steps {
        assert!(
            table.contains(state),
            "status does not say {state}:\n{table}"
        );
    }
    for word in ACTED {
        assert!(
            !table.split_whitespace().any(|w| w == word),
            "status says {word} in a dry run:\n{table}"
        );
    }
    // `/metrics`: the isolation state's series at 1 is the would-be one, never an acted one.
    let metrics = agent.get("/metrics").1;
    for ((name, _, state), cg) in steps.iter().zip(&groups) {
        let labels = format!("workload=\"{}\"", key(cg));
        let at = |st: &str| {
            metrics.lines().any(|l| {
                l.starts_with("gpushare_workload_isolation_state{")
                    && l.contains(&labels)
                    && l.contains(&format!("state=\"{st}\""))
                    && l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()) == Some(1.0)
            })
        };
        assert!(at(state), "{name}: no {state} series at 1:\n{metrics}");
        for word in ACTED {
            assert!(!at(word), "{name}: {word} at 1 in a dry run:\n{metrics}");
        }
    }
}
