//! Faults and hostile conditions: ring-buffer overflow, PID reuse, NVML errors and lost GPUs
//! mid-run, no driver at start, an unwritable state directory, SIGKILL at random moments, churn.

use std::{
    io::Write,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use gpushare_agent::{
    attribution::{CgroupResolver, ProcessIdentity, cgroupfs, procinfo, tracker::Tracker},
    ebpf::{KernelPrograms, LoadOptions},
    enforce::{Enforcer, Outcome, To, ledger, marks},
    policy::GpuScope,
    snapshot::Snapshot,
};
use gpushare_testkit::{FakeDeviceNode, FakeGpuProcess, TestCgroup, nvml::Scenario, unique};
use serde_json::json;

use crate::util::{
    AgentProcess, agent_dir, counter_value, key, usr1_recorder, wait_clock_tick_after_start,
    workload,
};
use crate::util::{group, needs_root, wait_until};

const GIB: u64 = 1 << 30;

fn scenario(procs: &[(u32, u64)], extra: serde_json::Value) -> serde_json::Value {
    let list: Vec<_> = procs
        .iter()
        .map(|(pid, b)| json!({ "pid": pid, "used_memory": b }))
        .collect();
    let mut dev = json!({ "uuid": "GPU-f", "name": "NVIDIA Fake", "memory_total": 80 * GIB, "compute_processes": list });
    if let Some(obj) = extra.as_object() {
        for (k, v) in obj {
            dev[k] = v.clone();
        }
    }
    json!({ "devices": [dev] })
}

fn freeze_quota(cg: &TestCgroup) -> String {
    format!(
        "[defaults]\ngrace = \"0s\"\nladder = [ {{ action = \"freeze\" }} ]\n\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"2GiB\"\n",
        cg.rel_path()
    )
}

struct Reaped(Child);
impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn ring_buffer_overflow_is_counted_and_the_table_is_reconciled() {
    needs_root!("ring_buffer_overflow");
    // One page of ring buffer: about 70 events. 200 new GPU tasks overflow it.
    let opts = LoadOptions {
        events_bytes: Some(4096),
        ..LoadOptions::default()
    };
    let kernel = KernelPrograms::load(&opts).unwrap();
    let mut tracker = Tracker::with_kernel(
        kernel,
        CgroupResolver::new(cgroupfs::find_cgroup2_mount().unwrap()),
    );
    let node = FakeDeviceNode::create(&unique("storm")).unwrap();
    let cg = group("storm");
    let procs: Vec<FakeGpuProcess> = (0..200)
        .map(|_| FakeGpuProcess::spawn(Some(&cg), &[node.path()], &[]).unwrap())
        .collect();
    tracker.poll();
    let lost = tracker.kernel_counters().events_lost;
    assert!(
        lost > 0,
        "the storm did not overflow a one-page ring buffer"
    );
    let known = procs
        .iter()
        .filter(|p| tracker.table().get(p.pid()).is_some())
        .count();
    assert!(known < 200, "all events arrived despite {lost} lost");
    // Reconciliation finds the tasks the kernel table holds. It also finds the GPU tasks of tests
    // running beside this one (the programs see every task on the host): only ours are counted.
    let ours: std::collections::HashSet<u32> = procs.iter().map(|p| p.pid()).collect();
    let report = tracker.reconcile();
    assert_eq!(
        report.added.iter().filter(|p| ours.contains(p)).count(),
        200 - known,
        "{} of 200 known before reconciling",
        known
    );
    for p in &procs {
        let t = tracker.table().get(p.pid()).expect("reconciled");
        assert_eq!(t.cgroup_path.as_deref(), Some(cg.rel_path()));
    }
    // They all exit; the exit events overflow too; reconciliation forgets them all.
    let pids: Vec<u32> = procs.iter().map(|p| p.pid()).collect();
    drop(procs);
    tracker.poll();
    tracker.reconcile();
    assert!(pids.iter().all(|p| tracker.table().get(*p).is_none()));
    assert!(
        tracker
            .kernel()
            .unwrap()
            .gpu_tasks()
            .iter()
            .all(|(t, _)| !pids.contains(t))
    );
}

#[test]
fn a_reused_pid_is_never_signalled() {
    needs_root!("a_reused_pid_is_never_signalled");
    let state = std::env::temp_dir().join(unique("gpushare-state"));
    let enf = Enforcer::new(cgroupfs::find_cgroup2_mount().unwrap(), &state, false).unwrap();
    // The process the agent sampled...
    let mut first = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = first.id();
    // It lives a while, as GPU processes do (start times have clock-tick resolution, 10 ms).
    wait_clock_tick_after_start(pid);
    let sampled: ProcessIdentity = procinfo::snapshot(pid).unwrap().identity;
    // ...exits, and an unrelated process is made to get the same pid (ns_last_pid), between the
    // sample and the action.
    let _ = first.kill();
    let _ = first.wait();
    let mut reuser = None;
    for _ in 0..50 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
        let c = Reaped(Command::new("sleep").arg("60").spawn().unwrap());
        if c.0.id() == pid {
            reuser = Some(c);
            break;
        }
    }
    let reuser = reuser.expect("could not make the pid be reused in 50 tries");
    let now = procinfo::snapshot(pid).unwrap().identity;
    assert_eq!(now.pid, sampled.pid);
    assert_ne!(
        now.start_ticks, sampled.start_ticks,
        "same pid, another process"
    );
    let r = enf.signal("w://reuse", &[sampled.into()], libc::SIGKILL, To::Every);
    assert_eq!(r, vec![(sampled, Outcome::Refused)]);
    assert!(
        procinfo::is_same_process(now),
        "the unrelated process was not touched"
    );
    drop(reuser);
    std::fs::remove_dir_all(state).unwrap();
}

#[test]
fn an_unwritable_state_directory_refuses_freezes_rather_than_freezing_unrecorded() {
    needs_root!("an_unwritable_state_directory");
    let state = std::env::temp_dir().join(unique("gpushare-state"));
    let mut enf = Enforcer::new(cgroupfs::find_cgroup2_mount().unwrap(), &state, false).unwrap();
    // The directory goes away and a file takes its place: nothing can be written there.
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::write(&state, "not a directory").unwrap();
    let cg = group("nostate");
    let _p = Reaped(cg.spawn(Command::new("sleep").arg("60")).unwrap());
    assert_eq!(
        enf.freeze(
            "w://nostate",
            cg.rel_path(),
            GpuScope::All,
            None,
            "t",
            Instant::now()
        ),
        Outcome::Refused
    );
    assert!(!cg.is_frozen());
    std::fs::remove_file(&state).unwrap();
}

#[test]
fn nvml_errors_and_a_lost_gpu_inside_the_grace_period_never_lead_to_enforcement() {
    needs_root!("nvml_errors_mid_run");
    // One workload for each fault: a workload back within quota keeps its ladder's clock for a
    // cool-down (a minute), so each fault gets a workload whose grace period starts afresh.
    const FAULTS: usize = 4;
    let groups: Vec<_> = (0..FAULTS).map(|_| group("nvmlerr")).collect();
    let log = std::env::temp_dir().join(unique("usr1"));
    let procs: Vec<Reaped> = groups
        .iter()
        .map(|cg| Reaped(cg.spawn(&mut usr1_recorder(&log)).unwrap()))
        .collect();
    let pids: Vec<u32> = procs.iter().map(|p| p.0.id()).collect();
    // Every workload at `GIB` but the `over`th, at `over_bytes`.
    let usage = |over: usize, over_bytes: u64| -> Vec<(u32, u64)> {
        pids.iter()
            .enumerate()
            .map(|(i, &pid)| (pid, if i == over { over_bytes } else { GIB }))
            .collect()
    };
    let sc = Scenario::create(&scenario(&usage(0, GIB), json!({}))).unwrap();
    // A grace period long enough to hold a fault inside it, then a freeze.
    const GRACE: Duration = Duration::from_millis(1500);
    let mut quotas = format!(
        "[defaults]\ngrace = \"{}ms\"\nladder = [ {{ action = \"freeze\" }} ]\n",
        GRACE.as_millis(),
    );
    for cg in &groups {
        quotas += &format!(
            "\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"2GiB\"\n",
            cg.rel_path()
        );
    }
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let row = |s: &Snapshot, i: usize| {
        workload(s, &key(&groups[i]), "all").map(|w| (w.used_bytes, w.state.clone()))
    };
    agent.wait_for(Duration::from_secs(5), |s| {
        (0..FAULTS).all(|i| row(s, i) == Some((GIB, "ok".into())))
    });
    let freezes = || {
        counter_value(
            &agent.get("/metrics").1,
            "gpushare_enforcement_actions_total",
            "action=\"freeze\"",
        )
    };
    // (what, how the scenario fails, what `degraded` must name)
    let faults = [
        (
            "the compute process list fails",
            json!({ "fail": { "nvmlDeviceGetComputeRunningProcesses_v3": 999 } }),
            &["GPU 0", "nvmlDeviceGetComputeRunningProcesses_v3"][..],
        ),
        (
            "the memory info fails",
            json!({ "fail": { "nvmlDeviceGetMemoryInfo_v2": 15 } }),
            &["GPU 0", "nvmlDeviceGetMemoryInfo_v2"][..],
        ),
        (
            "the device count fails",
            json!({ "fail": { "nvmlDeviceGetCount_v2": 9 } }),
            &["nvmlDeviceGetCount_v2"][..],
        ),
        (
            "the GPU is lost",
            json!({ "lost": true }),
            &["GPU 0", "GPU is lost"][..],
        ),
    ];
    for (i, (what, fault, named)) in faults.into_iter().enumerate() {
        let cg = &groups[i];
        let k = key(cg);
        // Over quota on good data: the grace period starts.
        sc.write(&scenario(&usage(i, 3 * GIB), json!({}))).unwrap();
        agent.wait_for(Duration::from_secs(5), |s| {
            row(s, i) == Some((3 * GIB, "over_quota".into()))
        });
        // Inside the grace period the data goes bad; the failing call would still have said
        // 3 GiB. Held past the end of the grace period: an agent that kept using the last good
        // sample would freeze, one that read the error as zero would find the workload back
        // within quota. Neither may happen: the workload keeps its state, unenforced.
        let mut bad = scenario(&usage(i, 3 * GIB), json!({}));
        if let Some(f) = fault.get("fail") {
            bad["fail"] = f.clone();
        }
        if fault.get("lost").is_some() {
            bad["devices"][0]["lost"] = json!(true);
        }
        sc.write(&bad).unwrap();
        // Checked at every step until past the grace period and a second more.
        agent.steps_over(GRACE + Duration::from_secs(1), |s| {
            assert!(
                !cg.is_frozen(),
                "{what}: froze on failed NVML data\n{}",
                agent.log()
            );
            let state = workload(s, &k, "all").map(|w| w.state.clone());
            assert_eq!(
                state.as_deref(),
                Some("over_quota"),
                "{what}: the workload's state changed on failed NVML data\n{}",
                agent.log()
            );
        });
        let s = agent.wait_next_step();
        assert!(
            s.health
                .degraded
                .iter()
                .any(|d| named.iter().all(|n| d.contains(n))),
            "{what}: degraded does not name it ({named:?}): {:?}",
            s.health.degraded
        );
        assert_eq!(freezes(), 0.0, "{what}: a freeze was counted");
        assert!(
            !std::fs::read_to_string(agent.ledger())
                .unwrap_or_default()
                .contains(cg.rel_path()),
            "{what}: a freeze was recorded"
        );
        // Good data within quota: back to ok and no longer degraded; the next fault is on the
        // next workload.
        sc.write(&scenario(&usage(i, GIB), json!({}))).unwrap();
        agent.wait_for(Duration::from_secs(5), |s| {
            row(s, i) == Some((GIB, "ok".into())) && s.health.degraded.is_empty()
        });
    }
    let metrics = agent.get("/metrics").1;
    for call in [
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetCount_v2",
    ] {
        assert!(
            counter_value(
                &metrics,
                "gpushare_nvml_errors_total",
                &format!("call=\"{call}\"")
            ) > 0.0,
            "{call} errors counted:\n{metrics}"
        );
    }
    // Good data over quota: the same agent enforces it once the grace period is over, so what
    // held it above was the faults.
    sc.write(&scenario(&usage(0, 3 * GIB), json!({}))).unwrap();
    agent.wait_for(Duration::from_secs(10), |s| {
        row(s, 0).is_some_and(|(_, st)| st == "frozen")
    });
    assert!(
        groups[0].wait_frozen(true),
        "enforced once NVML reads cleanly"
    );
    assert_eq!(
        counter_value(
            &agent.get("/metrics").1,
            "gpushare_enforcement_actions_total",
            "action=\"freeze\",result=\"ok\""
        ),
        1.0
    );
    let _ = std::fs::remove_file(log);
}

#[test]
fn no_driver_at_start_keeps_the_agent_running_and_says_so() {
    needs_root!("no_driver_at_start");
    let sc = Scenario::create(&json!({ "devices": [] })).unwrap();
    let agent = AgentProcess::start(&sc, "", &["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"]);
    let (code, body) = agent.get("/healthz");
    assert_eq!(code, 200, "ready without a driver: {body}");
    assert!(body.contains("no NVIDIA driver"), "{body}");
    assert!(body.contains("\"nvml\":\"no_driver\""), "{body}");
    assert!(agent.log().contains("no NVIDIA driver found"));
}

/// xorshift64*: a small deterministic generator, so a failing run can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Where a SIGKILL lands.
#[derive(Clone, Copy, Debug)]
enum Moment {
    /// At a random time after the agent was started, before or after it is ready.
    StartUp,
    /// After the freeze is recorded (ledger and mark) and before `cgroup.freeze` is written (the
    /// agent's debug-build pause point).
    BeforeFreeze,
    /// Around the thaw of a workload back within quota: before it, during it (right after the
    /// kernel reports the group thawed, before the record is dropped) or after it.
    DuringThaw,
    /// At a random time while the freeze is settled.
    Settled,
}

/// Whether a group the agent may have frozen is covered by its ledger (`state_dir`) or by a mark
/// naming that state directory: what a restarted agent or `thaw --all` can undo.
fn covered(dir: &Path, state_dir: &Path) -> bool {
    let ledger = std::fs::read_to_string(state_dir.join(ledger::LEDGER_FILE)).unwrap_or_default();
    let in_ledger = serde_json::from_str::<serde_json::Value>(&ledger).is_ok_and(|v| {
        v["freezes"].as_array().is_some_and(|fs| {
            fs.iter()
                .any(|f| f["cgroup_dir"].as_str() == Some(&*dir.to_string_lossy()))
        })
    });
    in_ledger || marks::read(dir).is_some_and(|m| m.state_dir == state_dir)
}

#[test]
fn sigkill_at_random_moments_never_leaves_a_wrong_freeze() {
    needs_root!("sigkill_at_random_moments");
    let seed = std::env::var("GPUSHARE_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            nanos ^ (u64::from(std::process::id()) << 32)
        })
        | 1;
    let iterations: usize = std::env::var("GPUSHARE_KILL_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    // Straight to stderr, so the seed shows whether the test passes or fails.
    let _ = writeln!(
        std::io::stderr(),
        "sigkill_at_random_moments: seed {seed}, {iterations} iterations \
         (GPUSHARE_KILL_SEED={seed} GPUSHARE_KILL_ITERATIONS={iterations} replays it)"
    );
    let mut rng = Rng(seed);
    let over = group("rk-over");
    let under = group("rk-under");
    let po = Reaped(
        over.spawn(Command::new("sleep").arg("300").stdin(Stdio::null()))
            .unwrap(),
    );
    let pu = Reaped(
        under
            .spawn(Command::new("sleep").arg("300").stdin(Stdio::null()))
            .unwrap(),
    );
    let usage = |over_bytes: u64| scenario(&[(po.0.id(), over_bytes), (pu.0.id(), GIB)], json!({}));
    let sc = Scenario::create(&usage(3 * GIB)).unwrap();
    let quotas = format!(
        "{}\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"2GiB\"\n",
        freeze_quota(&over),
        under.rel_path()
    );
    let dir = agent_dir(&quotas);
    let state_dir = dir.join("state");
    let pause = dir.join("pause-before-freeze");
    let mut agent = AgentProcess::unstarted(dir, &sc, &[], "200ms")
        .env("GPUSHARE_TEST_PAUSE_BEFORE_FREEZE", pause.to_str().unwrap());
    // Dropped before the agent: a failing test never leaves the agent waiting at the pause point.
    struct RemoveOnDrop<'a>(&'a Path);
    impl Drop for RemoveOnDrop<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _unpause = RemoveOnDrop(&pause);
    agent.restart();
    let over_frozen =
        |s: &Snapshot| workload(s, &key(&over), "all").is_some_and(|w| w.state == "frozen");
    agent.wait_for(Duration::from_secs(10), over_frozen);

    // The workload under quota is never frozen, not even for a moment: watched all along.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let under_frozen_seen = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if under.is_frozen() {
                    under_frozen_seen.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let moments = [
                Moment::StartUp,
                Moment::BeforeFreeze,
                Moment::DuringThaw,
                Moment::Settled,
            ];
            let mut order = moments;
            for i in 0..iterations {
                if i % moments.len() == 0 {
                    // A fresh random order each round, so every moment comes up.
                    for j in (1..order.len()).rev() {
                        order.swap(j, rng.below(j as u64 + 1) as usize);
                    }
                }
                let moment = order[i % order.len()];
                let what = format!("seed {seed}, iteration {i}, kill {moment:?}");
                match moment {
                    Moment::StartUp => {
                        agent.sigkill();
                        agent.spawn_unready();
                        std::thread::sleep(Duration::from_millis(rng.below(1500)));
                    }
                    Moment::BeforeFreeze => {
                        // Back within quota (thawed), then over it again with the pause set: the
                        // agent records the freeze and waits before writing cgroup.freeze.
                        sc.write(&usage(GIB)).unwrap();
                        agent.wait_state(&key(&over), "ok");
                        assert!(over.wait_frozen(false), "{what}: thawed within quota");
                        std::fs::write(&pause, "").unwrap();
                        sc.write(&usage(3 * GIB)).unwrap();
                        let deadline = Instant::now() + Duration::from_secs(10);
                        while !covered(over.dir(), &state_dir) && !over.is_frozen() {
                            assert!(
                                Instant::now() < deadline,
                                "{what}: the agent never came to freeze\n{}",
                                agent.log()
                            );
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        std::thread::sleep(Duration::from_millis(rng.below(300)));
                    }
                    Moment::DuringThaw => {
                        sc.write(&usage(GIB)).unwrap();
                        if rng.below(2) == 0 {
                            std::thread::sleep(Duration::from_millis(rng.below(600)));
                        } else {
                            // Right after the kernel reports the thaw: the record may still be
                            // there.
                            assert!(over.wait_frozen(false), "{what}: thawed within quota");
                        }
                    }
                    Moment::Settled => {
                        std::thread::sleep(Duration::from_millis(rng.below(700)));
                    }
                }
                agent.sigkill();
                let _ = std::fs::remove_file(&pause);
                // Between a crash and the restart: nothing frozen that the ledger or a mark does
                // not cover (so a restart or `thaw --all` can undo it).
                for cg in [&over, &under] {
                    if cg.is_frozen() {
                        assert!(
                            covered(cg.dir(), &state_dir),
                            "{what}: {} is frozen and neither the ledger nor a mark covers it\n{}",
                            cg.rel_path(),
                            agent.log()
                        );
                    }
                }
                // Half the time the restart finds it back within quota: it thaws what no longer
                // applies and forgets it. Then (or at once) over quota again: it freezes it again
                // and records it.
                if rng.below(2) == 0 {
                    sc.write(&usage(GIB)).unwrap();
                    agent.restart();
                    agent.wait_state(&key(&over), "ok");
                    assert!(
                        over.wait_frozen(false),
                        "{what}: restart under quota: still frozen"
                    );
                    wait_until(
                        Duration::from_secs(10),
                        || format!("{what}: restart under quota: still recorded"),
                        || !covered(over.dir(), &state_dir),
                    );
                    sc.write(&usage(3 * GIB)).unwrap();
                } else {
                    sc.write(&usage(3 * GIB)).unwrap();
                    agent.restart();
                }
                agent.wait_for(Duration::from_secs(10), over_frozen);
                assert!(
                    over.wait_frozen(true),
                    "{what}: the over-quota workload is left running"
                );
                assert!(
                    covered(over.dir(), &state_dir),
                    "{what}: frozen but not recorded after the restart"
                );
                assert!(
                    !under_frozen_seen.load(std::sync::atomic::Ordering::Relaxed),
                    "{what}: the workload under quota was frozen"
                );
            }
        }));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    });
    assert!(
        !under_frozen_seen.load(std::sync::atomic::Ordering::Relaxed),
        "seed {seed}: the workload under quota was frozen"
    );
    assert_eq!(agent.stop(), Some(0));
    assert!(over.wait_frozen(false), "SIGTERM thaws");
    assert!(!covered(over.dir(), &state_dir), "and drops its record");
}

#[test]
fn churn_leaves_no_series_of_exited_workloads_and_no_leaks() {
    needs_root!("churn_soak");
    let secs: u64 = std::env::var("GPUSHARE_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let parent = group("soak");
    let sc = Scenario::create(&scenario(&[], json!({}))).unwrap();
    let quotas = format!(
        "[defaults]\ngrace = \"0s\"\nladder = [ {{ action = \"freeze\" }} ]\n\n[[quota]]\ncgroup = \"{}/*\"\ngpu_memory = \"2GiB\"\n",
        parent.rel_path()
    );
    let mut agent = AgentProcess::start(&sc, &quotas, &[]);
    let agent_pid = agent.pid().unwrap();
    // The agent must keep stepping throughout: a crashed or stalled agent would leave no series
    // and no record either.
    let steps = |agent: &AgentProcess| {
        counter_value(
            &agent.get("/metrics").1,
            "gpushare_sample_duration_seconds_count",
            "",
        )
    };
    let steps0 = steps(&agent);
    let mut last_step = agent.state().expect("the agent answers").taken_at_unix;
    let rss = || -> u64 {
        procfs::process::Process::new(agent_pid as i32)
            .unwrap()
            .status()
            .unwrap()
            .vmrss
            .unwrap_or(0)
    };
    // The agent's fds, less the pidfds it holds for live processes that are not this test's: the
    // GPU tasks of tests running beside this one, which it rightly tracks (hundreds, for a
    // moment, during the ring-buffer storm). A pidfd of an exited process (`Pid: -1`) counts.
    let ours = std::cell::RefCell::new(std::collections::HashSet::<i64>::new());
    let fds = || {
        std::fs::read_dir(format!("/proc/{agent_pid}/fd"))
            .unwrap()
            .flatten()
            .filter(|e| {
                let info = std::fs::read_to_string(format!(
                    "/proc/{agent_pid}/fdinfo/{}",
                    e.file_name().to_string_lossy()
                ))
                .unwrap_or_default();
                let pid = info
                    .lines()
                    .find_map(|l| l.strip_prefix("Pid:"))
                    .and_then(|p| p.trim().parse::<i64>().ok());
                !pid.is_some_and(|p| p > 0 && !ours.borrow().contains(&p))
            })
            .count()
    };
    let root = cgroupfs::find_cgroup2_mount().unwrap();
    let mut live: Vec<(TestCgroup, Reaped, u64)> = Vec::new();
    let mut gone: Vec<String> = Vec::new();
    let start = Instant::now();
    let mut n = 0u64;
    let mut baseline = None;
    while start.elapsed() < Duration::from_secs(secs) {
        n += 1;
        let cg = TestCgroup::create_at(
            &root,
            &format!("{}/w{n}", parent.rel_path().trim_start_matches('/')),
        )
        .unwrap();
        let p = Reaped(
            cg.spawn(Command::new("sleep").arg("300").stdin(Stdio::null()))
                .unwrap(),
        );
        ours.borrow_mut().insert(i64::from(p.0.id()));
        live.push((cg, p, if n.is_multiple_of(3) { 3 * GIB } else { GIB }));
        if live.len() > 8 {
            let (cg, p, _) = live.remove(0);
            gone.push(format!("cgroup://{}", cg.rel_path()));
            drop(p);
            drop(cg);
        }
        let procs: Vec<(u32, u64)> = live.iter().map(|(_, p, b)| (p.0.id(), *b)).collect();
        sc.write(&scenario(&procs, json!({}))).unwrap();
        // One step of the agent an iteration: it must publish a new one each time.
        let s = agent.wait_next_step();
        assert!(
            s.taken_at_unix > last_step,
            "iteration {n}: the agent's last step did not advance ({} after {last_step})",
            s.taken_at_unix
        );
        last_step = s.taken_at_unix;
        if baseline.is_none() && start.elapsed() > Duration::from_secs(3) {
            baseline = Some((rss(), fds()));
        }
    }
    // A few whole steps after the last change, so that it is all applied.
    agent.wait_steps(3);
    let (rss0, fds0) = baseline.expect("ran long enough for a baseline");
    // Another test's GPU processes that exit at this moment (the storm's 200) are pidfds of
    // exited processes until the agent's next steps see them go: give it up to 20 steps to come
    // back to its baseline. A leak holds its fds whatever the steps do.
    let mut fds1 = fds();
    for _ in 0..20 {
        if fds1 <= fds0 + 2 {
            break;
        }
        agent.wait_next_step();
        fds1 = fds();
    }
    let rss1 = rss();
    let metrics = agent.get("/metrics").1;
    for g in &gone {
        assert!(
            !metrics.contains(&format!("workload=\"{g}\"")),
            "series of exited workload {g} remains"
        );
    }
    let ledger = std::fs::read_to_string(agent.ledger()).unwrap_or_default();
    for g in &gone {
        let path = format!("{}\"", g.trim_start_matches("cgroup://"));
        assert!(
            !ledger.contains(&path),
            "stale freeze record for {g}:\n{ledger}"
        );
    }
    // Still up and reporting at the end.
    assert!(agent.is_running(), "the agent died\n{}", agent.log());
    assert_eq!(agent.get("/healthz").0, 200, "/healthz\n{}", agent.log());
    let steps1 = steps(&agent);
    assert!(
        steps1 >= steps0 + n as f64,
        "the agent took {} steps over {n} iterations",
        steps1 - steps0
    );
    eprintln!(
        "churn: {n} workloads in {secs}s; agent RSS {rss0} -> {rss1} kB, fds {fds0} -> {fds1}"
    );
    assert!(fds1 <= fds0 + 2, "file descriptors leak: {fds0} -> {fds1}");
    assert!(
        rss1 <= rss0 + 4096,
        "memory grows under churn: {rss0} kB -> {rss1} kB"
    );
}

#[test]
fn quota_file_deleted_or_replaced_mid_run() {
    needs_root!("quota_file_deleted_or_replaced");
    let cg = group("qdel");
    let p = Reaped(
        cg.spawn(Command::new("sleep").arg("300").stdin(Stdio::null()))
            .unwrap(),
    );
    let sc = Scenario::create(&scenario(&[(p.0.id(), 3 * GIB)], json!({}))).unwrap();
    let agent = AgentProcess::start(&sc, &freeze_quota(&cg), &[]);
    assert!(cg.wait_frozen(true), "over quota: frozen");
    // Replaced by a half-written file (as an editor without atomic saves might leave it): rejected,
    // the last good configuration stays, the workload stays frozen.
    std::fs::write(
        agent.quotas_path(),
        "[[quota]]\ncgroup = \"/x\"\ngpu_memory = ",
    )
    .unwrap();
    agent.wait_for(Duration::from_secs(15), |s| !s.counters.quota_config_valid);
    agent.steps_over(Duration::from_millis(500), |_| {});
    assert!(cg.is_frozen(), "a broken file must not thaw anything");
    // Deleted: no file means no entries; the quota is gone, so the workload is no longer liable.
    std::fs::remove_file(agent.quotas_path()).unwrap();
    agent.wait_for(Duration::from_secs(15), |s| s.counters.quota_config_valid);
    assert!(
        cg.wait_frozen(false),
        "quota removed: thawed\n{}",
        agent.log()
    );
    // Written again: enforced again.
    agent.write_quotas(&freeze_quota(&cg));
    assert!(cg.wait_frozen(true), "quota back: frozen again");
}
