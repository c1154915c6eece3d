//! The enforcement loop closed on the real kernel: GPU memory charged only to a verified identity,
//! the workload's root cgroup as the unit of enforcement, states reported as the kernel has them,
//! changes made behind the agent's back observed and corrected, and an event loop that never
//! waits on a freeze.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use gpushare_testkit::{
    TestCgroup,
    docker::{GpuContainer, docker, require_docker},
    loud_skip,
    nvml::Scenario,
    unique,
};

use crate::util::{
    AgentProcess, Reaped, V1Group, agent_dir, cgroup_quota, counter_value, key, one_gpu, sleeper,
    sleeping_group, spawn_with_pid, wait_until, workload,
};
use crate::util::{group, needs_root, sleeping};

const GIB: u64 = 1 << 30;
const WAIT: Duration = Duration::from_secs(15);
const FREEZE: &str = "[defaults]\ngrace = \"0s\"\nladder = [ { action = \"freeze\" } ]\n";

fn state_of(agent: &AgentProcess, key: &str) -> String {
    agent
        .state()
        .and_then(|s| workload(&s, key, "all").map(|w| w.state.clone()))
        .unwrap_or_else(|| "absent".into())
}

/// Problem 1: with `/proc` attribution, a GPU process of workload A exits and a process of B takes
/// its pid within one sample interval. The sample's memory is B's; it must never be charged to A.
#[test]
fn a_reused_pid_is_charged_to_its_new_owner_never_to_the_workload_that_held_it() {
    needs_root!("a_reused_pid_is_charged_to_its_new_owner");
    let (a, pa) = sleeping_group("reuse-a");
    let b = group("reuse-b");
    let pid = pa.pid();
    let sc = Scenario::create(&one_gpu(&[(pid, GIB)])).unwrap();
    let quotas = format!(
        "{FREEZE}{}{}",
        cgroup_quota(&a, "2GiB"),
        cgroup_quota(&b, "8GiB")
    );
    let agent = AgentProcess::start_in(agent_dir(&quotas), &sc, &["--no-ebpf"], "1s");
    agent.wait_used(&key(&a), GIB);
    // A's process exits; B's next process gets the same pid and uses 3 GiB: over A's quota, well
    // within B's. All of it between two samples.
    agent.wait_next_step();
    drop(pa);
    let pb = spawn_with_pid(pid, || b.spawn(&mut sleeper()).unwrap());
    sc.write(&one_gpu(&[(pid, 3 * GIB)])).unwrap();
    let s = agent.wait_for(WAIT, |s| {
        assert!(
            !a.is_frozen(),
            "A was frozen for B's memory: {:?}",
            workload(s, &key(&a), "all")
        );
        workload(s, &key(&b), "all").is_some_and(|w| w.used_bytes == 3 * GIB)
    });
    assert!(
        workload(&s, &key(&a), "all").is_none_or(|w| w.used_bytes == 0),
        "A is still charged for B's memory: {:?}",
        workload(&s, &key(&a), "all")
    );
    // Not frozen at any step over the next second (a sample or more).
    let s = agent.steps_over(Duration::from_secs(1), |_| {
        assert!(
            !a.is_frozen() && !b.is_frozen(),
            "a workload was frozen for memory that is not its own\n{}",
            agent.log()
        );
    });
    let owner = s
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| &p.workload);
    assert_eq!(owner, Some(&key(&b)), "the pid is B's now");
    drop(pb);
}

/// The same with the kernel programs: A's GPU process, in the kernel's table, exits and B's GPU
/// process (it opens the device too) takes its pid within one sample interval. The memory NVML
/// reports for the pid is B's; A is never charged or frozen for it.
#[test]
fn in_ebpf_mode_a_reused_pid_is_charged_to_its_new_owner_never_to_the_workload_that_held_it() {
    needs_root!("in_ebpf_mode_a_reused_pid_is_charged_to_its_new_owner");
    let node = gpushare_testkit::FakeDeviceNode::create(&unique("reuse-ebpf")).unwrap();
    let a = group("reuse-ebpf-a");
    let b = group("reuse-ebpf-b");
    let gpu_proc = || {
        let mut c =
            std::process::Command::new(gpushare_testkit::workspace_bin("gpushare-fake-gpu-proc"));
        c.arg("--device")
            .arg(node.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null());
        c
    };
    let pa = Reaped(a.spawn(&mut gpu_proc()).unwrap());
    let pid = pa.pid();
    let sc = Scenario::create(&one_gpu(&[(pid, GIB)])).unwrap();
    let quotas = format!(
        "{FREEZE}{}{}",
        cgroup_quota(&a, "2GiB"),
        cgroup_quota(&b, "8GiB")
    );
    let agent = AgentProcess::start_in(agent_dir(&quotas), &sc, &[], "1s");
    agent.wait_used(&key(&a), GIB);
    agent.wait_next_step();
    drop(pa);
    let pb = spawn_with_pid(pid, || b.spawn(&mut gpu_proc()).unwrap());
    sc.write(&one_gpu(&[(pid, 3 * GIB)])).unwrap();
    let s = agent.wait_for(WAIT, |s| {
        assert!(
            !a.is_frozen(),
            "A was frozen for B's memory: {:?}",
            workload(s, &key(&a), "all")
        );
        workload(s, &key(&b), "all").is_some_and(|w| w.used_bytes == 3 * GIB)
    });
    assert!(
        workload(&s, &key(&a), "all").is_none_or(|w| w.used_bytes == 0),
        "A is still charged for B's memory: {:?}",
        workload(&s, &key(&a), "all")
    );
    let s = agent.steps_over(Duration::from_secs(1), |_| {
        assert!(
            !a.is_frozen() && !b.is_frozen(),
            "a workload was frozen for memory that is not its own\n{}",
            agent.log()
        );
    });
    let owner = s
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| &p.workload);
    assert_eq!(owner, Some(&key(&b)), "the pid is B's now");
    drop(pb);
}

/// Problem 2 (a unit with a delegated subtree): the GPU process lives in a child cgroup of the
/// unit; over quota, the unit's root is frozen, and with it every process of the unit.
#[test]
fn a_unit_whose_gpu_process_lives_in_a_child_cgroup_is_frozen_at_the_units_root() {
    needs_root!("a_unit_whose_gpu_process_lives_in_a_child_cgroup");
    let unit = format!("{}.service", unique("deleg"));
    let root = TestCgroup::create(&unit).unwrap();
    let worker = TestCgroup::create(&format!("{unit}/worker")).unwrap();
    let main = sleeping(&root);
    let gpu = sleeping(&worker);
    let sc = Scenario::create(&one_gpu(&[(gpu.pid(), 3 * GIB)])).unwrap();
    let quotas = format!("{FREEZE}\n[[quota]]\nunit = \"{unit}\"\ngpu_memory = \"2GiB\"\n");
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    assert!(
        root.wait_frozen(true),
        "the unit's root is not frozen (only its worker's leaf?)\n{}",
        agent.log()
    );
    assert!(worker.is_frozen());
    let key = format!("unit://{}", root.rel_path());
    let s = agent.wait_state(&key, "frozen");
    let row = workload(&s, &key, "all").unwrap();
    assert_eq!(row.cgroup_path, root.rel_path(), "the workload is its root");
    assert!(main.pid() > 0);
}

/// Moves a container's process into a child cgroup of its v2 group; the child is removed on drop.
struct ChildGroup(PathBuf);

impl ChildGroup {
    fn create(parent: &Path, name: &str, pid: u32) -> Self {
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        Self(dir)
    }
}

impl Drop for ChildGroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.freeze"), "0");
        crate::util::empty_and_remove(&self.0);
    }
}

/// Problem 2 (a container): its GPU process is in a child cgroup (what an init or systemd inside
/// the container, or Docker-in-Docker, does) and another process sits at the container's root.
/// Over quota, the whole container is frozen.
#[test]
fn a_container_whose_gpu_process_is_in_a_child_cgroup_is_frozen_whole() {
    let Some(dk) = require_docker("a_container_whose_gpu_process_is_in_a_child_cgroup") else {
        return;
    };
    let sc = Scenario::create(&one_gpu(&[])).unwrap();
    let c = GpuContainer::attached(dk, "deleg", &[]).unwrap();
    let root = c.v2_dir().expect("the container's v2 group").to_path_buf();
    docker(&["exec", "-d", c.id(), "sleep", "300"]).unwrap();
    let deadline = Instant::now() + WAIT;
    let side = loop {
        let procs = std::fs::read_to_string(root.join("cgroup.procs")).unwrap();
        if let Some(p) = procs
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .find(|p| *p != c.pid())
        {
            break p;
        }
        assert!(Instant::now() < deadline, "docker exec -d did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let _worker = ChildGroup::create(&root, "worker", c.pid());
    // The agent starts now and finds the GPU process in the container's child group.
    let quotas = format!(
        "{FREEZE}\n[[quota]]\ncontainer = \"{}\"\ngpu_memory = \"2GiB\"\n",
        c.id()
    );
    sc.write(&one_gpu(&[(c.pid(), GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    agent.wait_used(&c.key(), GIB);
    sc.write(&one_gpu(&[(c.pid(), 3 * GIB)])).unwrap();
    assert!(
        c.wait_v2_frozen(true, WAIT),
        "the container's root is not frozen: only the leaf of its GPU process?\n{}",
        agent.log()
    );
    let procs = std::fs::read_to_string(root.join("cgroup.procs")).unwrap();
    assert!(
        procs.lines().any(|l| l.trim() == side.to_string()),
        "the side process is at the root, and so frozen with it"
    );
    let s = agent.wait_state(&c.key(), "frozen");
    assert_eq!(
        Some(workload(&s, &c.key(), "all").unwrap().cgroup_path.clone()),
        c.v2_rel_path()
    );
}

/// A sleeping group (named after `tag`) using 3 GiB under a 2 GiB freeze quota, and an agent that
/// has frozen it.
fn frozen_over_quota(tag: &str) -> (TestCgroup, Reaped, Scenario, AgentProcess) {
    let (cg, p) = sleeping_group(tag);
    let sc = Scenario::create(&one_gpu(&[(p.pid(), 3 * GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, &format!("{FREEZE}{}", cgroup_quota(&cg, "2GiB")), &[]);
    assert!(cg.wait_frozen(true), "frozen over quota");
    (cg, p, sc, agent)
}

/// Problem 3: thawed behind the agent's back (an operator writes 0 to `cgroup.freeze`, `docker
/// unpause` on a pure v2 host), a workload still over quota is frozen again, and that is counted.
#[test]
fn a_workload_thawed_behind_the_agents_back_is_frozen_again_and_counted() {
    needs_root!("a_workload_thawed_behind_the_agents_back");
    let (cg, _p, _sc, agent) = frozen_over_quota("extthaw");
    std::fs::write(cg.dir().join("cgroup.freeze"), "0").unwrap();
    assert!(cg.wait_frozen(false));
    wait_until(
        WAIT,
        || format!("never frozen again after an external thaw\n{}", agent.log()),
        || cg.is_frozen(),
    );
    agent.wait_state(&key(&cg), "frozen");
    let metrics = agent.get("/metrics").1;
    assert!(
        counter_value(
            &metrics,
            "gpushare_enforcement_external_changes_total",
            "change=\"thawed\""
        ) >= 1.0,
        "the external thaw is not counted:\n{metrics}"
    );
    assert!(agent.log().contains("thawed behind the agent's back"));
}

/// Problem 3: a group removed and recreated under the same path (a container recreated) is a new
/// group: the old freeze does not count for it, and over quota it is enforced afresh.
#[test]
fn a_group_recreated_under_the_same_path_is_a_new_group_and_is_enforced_afresh() {
    needs_root!("a_group_recreated_under_the_same_path");
    let name = unique("recreate");
    let cg = TestCgroup::create(&name).unwrap();
    let rel = cg.rel_path().to_string();
    let p = sleeping(&cg);
    let sc = Scenario::create(&one_gpu(&[(p.pid(), 3 * GIB)])).unwrap();
    let agent = AgentProcess::start_in(
        agent_dir(&format!("{FREEZE}{}", cgroup_quota(&cg, "2GiB"))),
        &sc,
        &[],
        "1s",
    );
    assert!(cg.wait_frozen(true), "frozen over quota");
    agent.wait_state(&key(&cg), "frozen");
    let old_inode = cg.id();
    // Between two samples: the group goes and comes back, with a new process over quota.
    agent.wait_next_step();
    drop(p);
    drop(cg);
    let cg = TestCgroup::create(&name).unwrap();
    assert_eq!(cg.rel_path(), rel);
    assert_ne!(cg.id(), old_inode, "a new group");
    let p = sleeping(&cg);
    sc.write(&one_gpu(&[(p.pid(), 3 * GIB)])).unwrap();
    assert!(
        cg.wait_frozen(true),
        "the new group over quota is never frozen: the old freeze was taken for it\n{}",
        agent.log()
    );
    agent.wait_state(&key(&cg), "frozen");
}

/// Problems 3 and 4: one task cannot stop (here it is held by another freezer, as a task in D
/// state inside the driver would be), so the freeze does not settle. The agent reports
/// `freezing`, not `frozen`, keeps answering at once meanwhile, and the freeze completes when the
/// task can stop.
#[test]
fn a_freeze_that_cannot_settle_is_reported_as_freezing_and_never_stalls_the_agent() {
    needs_root!("a_freeze_that_cannot_settle");
    let (cg, stuck) = sleeping_group("stuck");
    let gpu = sleeping(&cg);
    let Some(v1) = V1Group::create(&unique("gpushare-test-stuck")) else {
        loud_skip("a_freeze_that_cannot_settle: no v1 freezer mounted (pure cgroup v2 host)");
        return;
    };
    v1.add(stuck.pid());
    v1.set("FROZEN");
    let sc = Scenario::create(&one_gpu(&[(gpu.pid(), GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, &format!("{FREEZE}{}", cgroup_quota(&cg, "2GiB")), &[]);
    agent.wait_used(&key(&cg), GIB);
    sc.write(&one_gpu(&[(gpu.pid(), 3 * GIB)])).unwrap();
    agent.wait_state(&key(&cg), "freezing");
    let requested = std::fs::read_to_string(cg.dir().join("cgroup.freeze")).unwrap();
    assert_eq!(requested.trim(), "1", "the freeze was asked for");
    // While the freeze cannot settle the agent answers at once and never claims `frozen`: checked
    // at each of 20 steps.
    for _ in 0..20 {
        let t = Instant::now();
        let (code, _) = agent.get("/healthz");
        assert_eq!(code, 200);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "/healthz took {:?} while a freeze was pending",
            t.elapsed()
        );
        assert!(!cg.is_frozen());
        assert_ne!(
            state_of(&agent, &key(&cg)),
            "frozen",
            "reported frozen while it is not"
        );
        agent.wait_next_step();
    }
    let metrics = agent.get("/metrics").1;
    assert!(
        counter_value(
            &metrics,
            "gpushare_enforcement_actions_total",
            "action=\"freeze\",result=\"pending\""
        ) >= 1.0,
        "{metrics}"
    );
    // The task can stop now: the freeze settles and the state follows the kernel.
    v1.set("THAWED");
    assert!(cg.wait_frozen(true), "never frozen\n{}", agent.log());
    agent.wait_state(&key(&cg), "frozen");
}

/// Covers a file with another one (a bind mount), undone on drop.
struct BindMount(PathBuf);

impl BindMount {
    fn new(source: &Path, target: &Path) -> Self {
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let (s, t) = (c(source), c(target));
        // SAFETY: valid NUL-terminated paths; a bind mount needs no fs type or data.
        let rc = unsafe {
            libc::mount(
                s.as_ptr(),
                t.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "bind mount: {}", std::io::Error::last_os_error());
        Self(target.to_path_buf())
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let t = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a path we mounted on.
        unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Problem 3: a thaw the kernel did not apply (here the write to `cgroup.freeze` goes nowhere) is
/// reported as what the kernel says, frozen, and retried until it takes.
#[test]
fn a_thaw_the_kernel_did_not_apply_is_reported_frozen_and_retried() {
    needs_root!("a_thaw_the_kernel_did_not_apply");
    let (cg, p, sc, agent) = frozen_over_quota("nothaw");
    let blocked = BindMount::new(Path::new("/dev/null"), &cg.dir().join("cgroup.freeze"));
    sc.write(&one_gpu(&[(p.pid(), GIB)])).unwrap();
    agent.wait_used(&key(&cg), GIB);
    // For two seconds of steps, each retrying the thaw: still frozen, and reported so.
    agent.steps_over(Duration::from_secs(2), |s| {
        assert!(cg.is_frozen());
        assert_eq!(
            workload(s, &key(&cg), "all").map(|w| w.state.as_str()),
            Some("frozen"),
            "the state must be what the kernel says"
        );
    });
    assert!(cg.is_frozen());
    assert_eq!(
        state_of(&agent, &key(&cg)),
        "frozen",
        "the state must be what the kernel says"
    );
    drop(blocked);
    wait_until(
        Duration::from_secs(30),
        || format!("the failed thaw was never retried\n{}", agent.log()),
        || !cg.is_frozen(),
    );
    agent.wait_state(&key(&cg), "ok");
}

/// Problem 3: a kill step with a catchable signal. The process catches SIGTERM and survives: it is
/// never reported killed while it lives, and SIGKILL follows after the kill step's grace.
#[test]
fn a_kill_step_whose_signal_is_caught_is_followed_by_sigkill_and_reported_as_it_happened() {
    needs_root!("a_kill_step_whose_signal_is_caught");
    let cg = group("term");
    let log = std::env::temp_dir().join(unique("term-log"));
    let mut cmd = std::process::Command::new("bash");
    cmd.arg("-c")
        .arg(format!(
            "trap 'echo TERM >> {}' TERM; while :; do sleep 0.05; done",
            log.display()
        ))
        .stdin(std::process::Stdio::null());
    let mut p = Reaped(cg.spawn(&mut cmd).unwrap());
    let pid = p.pid();
    let sc = Scenario::create(&one_gpu(&[(pid, GIB)])).unwrap();
    let quotas = format!(
        "[defaults]\ngrace = \"0s\"\nladder = [ {{ action = \"kill\", signal = \"SIGTERM\" }} ]\n{}",
        cgroup_quota(&cg, "2GiB")
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    agent.wait_used(&key(&cg), GIB);
    sc.write(&one_gpu(&[(pid, 3 * GIB)])).unwrap();
    wait_until(
        WAIT,
        || format!("no SIGTERM\n{}", agent.log()),
        || std::fs::read_to_string(&log).is_ok_and(|s| s.contains("TERM")),
    );
    // Half a second of steps after the signal (less than the kill step's grace).
    agent.steps_over(Duration::from_millis(500), |_| {});
    assert!(p.0.try_wait().unwrap().is_none(), "it caught SIGTERM");
    let state = state_of(&agent, &key(&cg));
    assert_ne!(state, "killed", "reported killed while it runs");
    assert_eq!(state, "killing");
    wait_until(
        Duration::from_secs(30),
        || {
            format!(
                "a process that caught the kill step's signal is left running\n{}",
                agent.log()
            )
        },
        || p.0.try_wait().unwrap().is_some(),
    );
    let _ = std::fs::remove_file(&log);
}
