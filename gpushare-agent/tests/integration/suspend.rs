//! The `suspend` step end to end: the agent binary with the mock libcuda (the CUDA checkpoint API)
//! and the mock NVML sharing one scenario, real cgroups and processes. A checkpointed process
//! leaves the mock NVML's process lists and its memory leaves the GPU's used memory until it is
//! restored, as with NVIDIA's driver.

use std::{path::Path, time::Duration};

use gpushare_testkit::{TestCgroup, nvml::Scenario, nvml::fake_cuda_lib, unique};
use serde_json::{Value, json};

use crate::util::{
    AgentProcess, agent_dir, cgroup_quota, counter_value, key, sleeping_group, wait_until, workload,
};
use crate::util::{group, needs_root, sleeping};

pub(crate) const GIB: u64 = 1 << 30;
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// One 80 GiB GPU with `procs` (pid, bytes), a driver with the checkpoint API, and `cuda`.
pub(crate) fn scenario(procs: &[(u32, u64)], cuda: Value) -> Value {
    scenario_on(procs, cuda, 12080)
}

fn scenario_on(procs: &[(u32, u64)], cuda: Value, driver: u32) -> Value {
    let list: Vec<_> = procs
        .iter()
        .map(|(pid, b)| json!({ "pid": pid, "used_memory": b }))
        .collect();
    json!({
        "cuda_driver_version": driver,
        "devices": [{ "uuid": "GPU-susp", "name": "NVIDIA Fake", "memory_total": 80 * GIB, "compute_processes": list }],
        "cuda": cuda,
    })
}

pub(crate) fn cuda_args() -> Vec<String> {
    vec!["--cuda-lib".into(), fake_cuda_lib().display().to_string()]
}

fn start(sc: &Scenario, quotas: &str) -> AgentProcess {
    let args = cuda_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    AgentProcess::start(sc, quotas, &args)
}

/// The mock driver's state of `pid` (`running` when it keeps none).
pub(crate) fn cuda_state(sc: &Scenario, pid: u32) -> String {
    std::fs::read_to_string(sc.dir().join("cuda-state.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["processes"][pid.to_string()].as_str().map(str::to_string))
        .unwrap_or_else(|| "running".into())
}

pub(crate) fn used_on_gpu(agent: &AgentProcess) -> u64 {
    agent
        .state()
        .and_then(|s| s.gpus.first().map(|g| g.memory_used_bytes))
        .unwrap_or(0)
}

fn lists(agent: &AgentProcess, pid: u32) -> bool {
    agent
        .state()
        .is_some_and(|s| s.processes.iter().any(|p| p.pid == pid))
}

pub(crate) const SUSPEND: &str =
    "[defaults]\ngrace = \"0s\"\nladder = [ { action = \"suspend\" } ]\n";

#[test]
fn a_workload_over_quota_is_suspended_its_gpu_memory_freed_and_a_release_brings_it_back() {
    needs_root!("a_workload_over_quota_is_suspended");
    let (cg, p) = sleeping_group("susp");
    let (neighbour_cg, n) = sleeping_group("susp-n");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB), (n.pid(), GIB)], json!({}))).unwrap();
    // A release restarts the ladder from the grace period: 5 s leave time to look at the resumed
    // workload before it would be suspended again.
    let quotas = format!(
        "{}{}{}",
        SUSPEND.replace("grace = \"0s\"", "grace = \"5s\""),
        cgroup_quota(&cg, "2GiB"),
        cgroup_quota(&neighbour_cg, "8GiB")
    );
    let agent = start(&sc, &quotas);
    agent.wait_used(&key(&cg), GIB);
    assert_eq!(used_on_gpu(&agent), 2 * GIB);
    sc.write(&scenario(&[(p.pid(), 6 * GIB), (n.pid(), GIB)], json!({})))
        .unwrap();
    let s = agent.wait_state(&key(&cg), "suspended");
    let row = workload(&s, &key(&cg), "all").unwrap();
    assert_eq!(row.suspended_bytes, 6 * GIB, "{row:?}");
    assert_eq!(
        row.used_bytes,
        6 * GIB,
        "its footprint still counts as its usage"
    );
    assert_eq!(cuda_state(&sc, p.pid()), "checkpointed");
    assert!(cg.wait_frozen(true), "suspended means frozen too");
    assert!(!neighbour_cg.is_frozen());
    // The neighbour gets the memory back: the GPU shows only its 1 GiB in use.
    agent.wait_for(WAIT, |_| {
        used_on_gpu(&agent) == GIB && !lists(&agent, p.pid())
    });
    let ledger = std::fs::read_to_string(agent.ledger()).unwrap();
    assert!(ledger.contains("\"suspended\""), "{ledger}");
    let metrics = agent.get("/metrics").1;
    assert_eq!(
        counter_value(&metrics, "gpushare_workloads_suspended", ""),
        1.0,
        "{metrics}"
    );
    assert!(metrics.contains("gpushare_suspend_duration_seconds_count 1"));
    // Released: thawed, restored, unlocked, running; NVML sees its memory again.
    let (code, body) = agent.post_local(
        "/api/v1/release",
        &json!({ "workload": key(&cg) }).to_string(),
    );
    assert_eq!(code, 200, "{body}");
    agent.wait_for(WAIT, |s| {
        workload(s, &key(&cg), "all")
            .is_some_and(|w| w.state != "suspended" && w.state != "resuming")
    });
    assert!(cg.wait_frozen(false), "resumed: not frozen");
    assert_eq!(cuda_state(&sc, p.pid()), "running");
    agent.wait_for(WAIT, |_| {
        used_on_gpu(&agent) == 7 * GIB && lists(&agent, p.pid())
    });
    assert!(
        agent
            .get("/metrics")
            .1
            .contains("gpushare_resume_duration_seconds_count 1")
    );
    assert!(
        !std::fs::read_to_string(agent.ledger())
            .unwrap()
            .contains(cg.rel_path())
    );
}

#[test]
fn a_resume_that_restored_but_could_not_unlock_is_retried_until_it_is_done() {
    needs_root!("a_resume_that_restored_but_could_not_unlock");
    let (cg, p) = sleeping_group("susp-unlock");
    let (neighbour_cg, n) = sleeping_group("susp-unlock-n");
    // An 8 GiB GPU: once p's 6 GiB are restored, 1 GiB is free, less than its footprint.
    let on_small_gpu = |cuda: Value| {
        let mut v = scenario(&[(p.pid(), 6 * GIB), (n.pid(), GIB)], cuda);
        v["devices"][0]["memory_total"] = json!(8 * GIB);
        v
    };
    let sc = Scenario::create(&on_small_gpu(json!({}))).unwrap();
    let quotas = |grace: &str| {
        format!(
            "{}{}{}",
            SUSPEND.replace("grace = \"0s\"", &format!("grace = \"{grace}\"")),
            cgroup_quota(&cg, "2GiB"),
            cgroup_quota(&neighbour_cg, "4GiB")
        )
    };
    let agent = start(&sc, &quotas("0s"));
    agent.wait_state(&key(&cg), "suspended");
    assert_eq!(cuda_state(&sc, p.pid()), "checkpointed");
    // The release restarts the ladder: a 20 s grace leaves the resume time to be retried.
    let loaded = agent
        .state()
        .unwrap()
        .counters
        .quota_config_last_reload_unix;
    agent.write_quotas(&quotas("20s"));
    agent.wait_for(WAIT, |s| {
        s.counters.quota_config_last_reload_unix > loaded && s.counters.quota_config_valid
    });
    // The driver restores it, then refuses the unlock.
    sc.write(&on_small_gpu(
        json!({ "fail": { "cuCheckpointProcessUnlock": 999 } }),
    ))
    .unwrap();
    let (code, body) = agent.post_local(
        "/api/v1/release",
        &json!({ "workload": key(&cg) }).to_string(),
    );
    assert_eq!(code, 200, "{body}");
    wait_until(
        WAIT,
        || "never restored".into(),
        || cuda_state(&sc, p.pid()) == "locked",
    );
    sc.write(&on_small_gpu(json!({}))).unwrap();
    // Its memory is back on the GPU (1 GiB free for a 6 GiB footprint): that is no reason to wait.
    agent.wait_for(WAIT, |s| {
        workload(s, &key(&cg), "all")
            .is_some_and(|w| w.state != "suspended" && w.state != "resuming")
    });
    assert_eq!(cuda_state(&sc, p.pid()), "running");
    assert!(cg.wait_frozen(false), "resumed: not frozen");
}

#[test]
fn elastic_mode_suspends_the_largest_borrower_under_pressure_and_resumes_it_when_room_returns() {
    needs_root!("elastic_mode_suspends_the_largest_borrower");
    let (big, pb) = sleeping_group("el-big");
    let (small, ps) = sleeping_group("el-small");
    let (_other, po) = sleeping_group("el-other");
    let quotas = format!(
        "[defaults]\nmode = \"elastic\"\nelastic_reserve = \"8GiB\"\ngrace = \"0s\"\nladder = [ {{ action = \"suspend\" }} ]\n{}{}",
        cgroup_quota(&big, "2GiB"),
        cgroup_quota(&small, "2GiB")
    );
    // big borrows 18 GiB, small 2 GiB; 76 GiB free: fine.
    let calm = [(pb.pid(), 20 * GIB), (ps.pid(), 4 * GIB), (po.pid(), GIB)];
    let sc = Scenario::create(&scenario(&calm, json!({}))).unwrap();
    let agent = start(&sc, &quotas);
    agent.wait_used(&key(&big), 20 * GIB);
    // Another process takes 52 GiB: 3 GiB free, below the 8 GiB reserve. Suspending big alone
    // covers it.
    let pressed = [
        (pb.pid(), 20 * GIB),
        (ps.pid(), 4 * GIB),
        (po.pid(), 53 * GIB),
    ];
    sc.write(&scenario(&pressed, json!({}))).unwrap();
    agent.wait_state(&key(&big), "suspended");
    let s = agent.steps_over(Duration::from_secs(1), |_| {});
    assert_eq!(
        workload(&s, &key(&small), "all").unwrap().state,
        "ok",
        "the smaller borrower is left alone"
    );
    assert_eq!(cuda_state(&sc, ps.pid()), "running");
    // The other process shrinks to 1 GiB: 55 GiB free >= 20 GiB + 8 GiB reserve: resumed.
    sc.write(&scenario(&calm, json!({}))).unwrap();
    agent.wait_state(&key(&big), "ok");
    assert_eq!(cuda_state(&sc, pb.pid()), "running");
    assert!(big.wait_frozen(false));
}

/// The ladder of the fall-through tests: freeze at once, suspend a second later. A suspend that
/// falls through leaves the workload as the freeze step had it: frozen.
const FREEZE_THEN_SUSPEND: &str = "[defaults]\ngrace = \"0s\"\nladder = [ { action = \"freeze\" }, { action = \"suspend\", after = \"1s\" } ]\n";

/// Waits until the agent counts a fall-through for `reason`; the metrics then.
fn wait_fallthrough(agent: &AgentProcess, reason: &str) -> String {
    let label = format!("reason=\"{reason}\"");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let metrics = agent.get("/metrics").1;
        if counter_value(&metrics, "gpushare_suspend_fallthroughs_total", &label) >= 1.0 {
            return metrics;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {reason} fall-through\n{metrics}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs one injected driver failure: the suspend falls through with `reason`, the workload stays
/// as the freeze step before it left it (frozen), and nothing is left locked or checkpointed.
fn falls_through(name: &str, cuda: impl Fn(u32) -> Value, driver: u32, reason: &str) {
    let cg = TestCgroup::create(&unique(name)).unwrap();
    let p = sleeping(&cg);
    let pid = p.pid();
    let sc = Scenario::create(&scenario_on(&[(pid, GIB)], cuda(pid), driver)).unwrap();
    let quotas = format!("{FREEZE_THEN_SUSPEND}{}", cgroup_quota(&cg, "2GiB"));
    let agent = start(&sc, &quotas);
    agent.wait_used(&key(&cg), GIB);
    sc.write(&scenario_on(&[(pid, 3 * GIB)], cuda(pid), driver))
        .unwrap();
    let metrics = wait_fallthrough(&agent, reason);
    assert_eq!(
        counter_value(&metrics, "gpushare_suspend_fallthroughs_total", ""),
        1.0,
        "{name}: one fall-through, no retry: {metrics}"
    );
    let s = agent.wait_state(&key(&cg), "frozen");
    assert!(
        cg.wait_frozen(true),
        "{name}: frozen as the freeze step left it"
    );
    let row = workload(&s, &key(&cg), "all").unwrap();
    assert_eq!(row.suspended_bytes, 0);
    assert!(
        row.detail.contains("suspend fell through"),
        "{name}: {row:?}"
    );
    assert_eq!(
        cuda_state(&sc, pid),
        "running",
        "{name}: nothing left locked or checkpointed"
    );
    assert!(
        lists(&agent, pid),
        "{name}: the process keeps its GPU memory"
    );
    assert!(
        agent.log().contains("falls through"),
        "{name}: the log says why\n{}",
        agent.log()
    );
}

#[test]
fn each_driver_failure_falls_through_with_its_reason_and_leaves_nothing_locked() {
    needs_root!("each_driver_failure_falls_through");
    falls_through(
        "ft-uvm",
        |pid| json!({ "processes": { pid.to_string(): { "checkpoint_error": { "code": 801 } } } }),
        12080,
        "not_supported",
    );
    falls_through(
        "ft-lock",
        |pid| json!({ "processes": { pid.to_string(): { "lock_timeout": true } } }),
        12080,
        "lock_timeout",
    );
    falls_through("ft-old", |_| json!({}), 12040, "unavailable");
}

#[test]
fn a_container_memory_limit_too_small_for_the_checkpoint_skips_the_step() {
    needs_root!("a_container_memory_limit_too_small");
    let Some(mem_root) = gpushare_agent::enforce::freeze::v1_root("memory") else {
        gpushare_testkit::loud_skip("no v1 memory controller mounted (pure cgroup v2 host)");
        return;
    };
    let (cg, p) = sleeping_group("ft-mem");
    let mem = MemGroup::create(
        &mem_root.join(unique("gpushare-test-mem")),
        64 << 20,
        p.pid(),
    );
    let sc = Scenario::create(&scenario(&[(p.pid(), 3 * GIB)], json!({}))).unwrap();
    let quotas = format!("{FREEZE_THEN_SUSPEND}{}", cgroup_quota(&cg, "2GiB"));
    let agent = start(&sc, &quotas);
    wait_fallthrough(&agent, "host_memory");
    assert!(cg.wait_frozen(true), "frozen as the freeze step left it");
    assert_eq!(cuda_state(&sc, p.pid()), "running");
    assert!(
        agent.log().contains("needs 3.0 GiB of host memory"),
        "{}",
        agent.log()
    );
    drop(mem);
}

#[test]
fn a_sigkilled_agents_suspensions_are_kept_or_resumed_at_the_next_start() {
    needs_root!("a_sigkilled_agents_suspensions");
    let (keep, pk) = sleeping_group("sk-keep");
    let (back, pb) = sleeping_group("sk-back");
    let sc = Scenario::create(&scenario(
        &[(pk.pid(), 3 * GIB), (pb.pid(), 3 * GIB)],
        json!({}),
    ))
    .unwrap();
    let quotas = format!(
        "{SUSPEND}{}{}",
        cgroup_quota(&keep, "2GiB"),
        cgroup_quota(&back, "2GiB")
    );
    let args = cuda_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = AgentProcess::start_in(agent_dir(&quotas), &sc, &args, "200ms");
    agent.wait_for(WAIT, |s| {
        [&keep, &back]
            .iter()
            .all(|cg| workload(s, &key(cg), "all").is_some_and(|w| w.state == "suspended"))
    });
    agent.sigkill();
    // While the agent is down `back`'s quota is raised above its footprint.
    agent.write_quotas(&format!(
        "{SUSPEND}{}{}",
        cgroup_quota(&keep, "2GiB"),
        cgroup_quota(&back, "8GiB")
    ));
    agent.restart();
    agent.wait_for(WAIT, |s| {
        workload(s, &key(&back), "all").is_some_and(|w| w.state == "ok")
            && workload(s, &key(&keep), "all").is_some_and(|w| w.state == "suspended")
    });
    assert_eq!(
        cuda_state(&sc, pb.pid()),
        "running",
        "no longer applies: resumed"
    );
    assert!(back.wait_frozen(false));
    assert_eq!(
        cuda_state(&sc, pk.pid()),
        "checkpointed",
        "still applies: kept"
    );
    assert!(keep.is_frozen());
    // Kept all along: not resumed as a workload that vanished (its checkpointed process holds no
    // device and NVML lists none of it) and suspended again.
    let log = agent.log();
    let resumed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("resuming ") && l.contains(keep.rel_path()))
        .collect();
    assert!(resumed.is_empty(), "{}", resumed.join("\n"));
    // SIGTERM resumes what the agent suspended.
    assert_eq!(agent.stop(), Some(0));
    assert_eq!(cuda_state(&sc, pk.pid()), "running");
    assert!(keep.wait_frozen(false));
}

/// A v1 memory group with a limit, holding one process; the process goes back to the root and
/// the group is removed on drop.
struct MemGroup(std::path::PathBuf);

impl MemGroup {
    fn create(dir: &Path, limit: u64, pid: u32) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        Self(dir.to_path_buf())
    }
}

impl Drop for MemGroup {
    fn drop(&mut self) {
        crate::util::empty_and_remove(&self.0);
    }
}

#[test]
fn a_workload_an_earlier_step_froze_is_thawed_locked_checkpointed_and_frozen_again() {
    needs_root!("a_workload_an_earlier_step_froze_is_suspended");
    let (cg, p) = sleeping_group("susp-frozen");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], json!({}))).unwrap();
    let agent = start(
        &sc,
        &format!("{FREEZE_THEN_SUSPEND}{}", cgroup_quota(&cg, "2GiB")),
    );
    agent.wait_used(&key(&cg), GIB);
    sc.write(&scenario(&[(p.pid(), 3 * GIB)], json!({})))
        .unwrap();
    agent.wait_state(&key(&cg), "frozen");
    // A frozen process could not answer the lock: the suspend thaws it first.
    agent.wait_state(&key(&cg), "suspended");
    assert_eq!(cuda_state(&sc, p.pid()), "checkpointed");
    assert!(cg.wait_frozen(true), "frozen again");
    let metrics = agent.get("/metrics").1;
    assert_eq!(
        counter_value(&metrics, "gpushare_suspend_fallthroughs_total", ""),
        0.0,
        "{metrics}"
    );
}

/// The mock NVML's record of the driver limits: (soft, hard) of the cgroup `dir` on GPU `uuid`.
pub(crate) fn driver_limit(sc: &Scenario, uuid: &str, dir: &Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(sc.dir().join("memory-limits.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let e = &v["devices"][uuid][dir.to_str()?];
    Some((e["soft"].as_u64()?, e["hard"].as_u64()?))
}

/// Waits until the hard driver limit of `cg` on GPU-susp is `want` (`None`: no limit).
pub(crate) fn wait_driver_limit(
    sc: &Scenario,
    cg: &TestCgroup,
    want: Option<u64>,
    agent: &AgentProcess,
) {
    wait_until(
        WAIT,
        || {
            format!(
                "driver limit of {} is {:?}, not {want:?}\n{}",
                cg.rel_path(),
                driver_limit(sc, "GPU-susp", cg.dir()),
                agent.log()
            )
        },
        || driver_limit(sc, "GPU-susp", cg.dir()).map(|(_, hard)| hard) == want,
    );
}

#[test]
fn where_the_driver_takes_per_cgroup_limits_each_quota_is_also_a_driver_limit_on_the_root() {
    needs_root!("driver_limits");
    let cg = group("dlim");
    let worker = TestCgroup::create(&format!(
        "{}/worker",
        cg.rel_path().trim_start_matches("/gpushare-test/")
    ))
    .unwrap();
    let p = sleeping(&worker);
    // A second workload whose quota names no GPU: its limit goes on each GPU it uses.
    let (all, q) = sleeping_group("dlim-all");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB), (q.pid(), GIB)], json!({}))).unwrap();
    let quotas = format!(
        "[defaults]\nladder = []\n\n[[quota]]\ncgroup = \"{}\"\ngpu = 0\ngpu_memory = \"2GiB\"\ntolerance = \"512MiB\"\n{}",
        cg.rel_path(),
        cgroup_quota(&all, "3GiB")
    );
    let agent = start(&sc, &quotas);
    agent.wait_for(WAIT, |s| {
        s.gpus
            .first()
            .is_some_and(|g| g.isolation_backend == "driver_limits")
    });
    assert_eq!(
        driver_limit(&sc, "GPU-susp", cg.dir()),
        Some((0, 2 * GIB + (512 << 20))),
        "no soft limit (a reservation), hard at quota + tolerance, on the workload's root (not its leaf)"
    );
    let (soft, hard) = driver_limit(&sc, "GPU-susp", all.dir())
        .expect("a quota on all GPUs is a driver limit on each GPU the workload uses");
    assert_eq!((soft, hard), (0, 3 * GIB));
    let metrics = agent.get("/metrics").1;
    assert!(
        metrics.contains("backend=\"driver_limits\"} 1"),
        "{metrics}"
    );
    // The quota goes: the limit is cleared.
    agent.write_quotas("[defaults]\nladder = []\n");
    wait_driver_limit(&sc, &cg, None, &agent);
    drop(agent);
    // A driver without the function (or a device that refuses): soft isolation only.
    let mut off = scenario(&[(p.pid(), GIB)], json!({}));
    off["memory_limits_supported"] = json!(false);
    sc.write(&off).unwrap();
    let agent = start(&sc, &quotas);
    let s = agent.steps_over(Duration::from_secs(1), |_| {});
    assert_eq!(s.gpus[0].isolation_backend, "soft");
    assert_eq!(driver_limit(&sc, "GPU-susp", cg.dir()), None);
}

#[test]
fn driver_limits_a_sigkilled_agent_left_are_cleared_at_the_next_start_when_no_longer_wanted() {
    needs_root!("driver_limits_after_sigkill");
    let (gone, p) = sleeping_group("dlim-gone");
    let (kept, q) = sleeping_group("dlim-kept");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB), (q.pid(), GIB)], json!({}))).unwrap();
    let quotas = |kept_gib: u64, with_gone: bool| {
        let mut text = "[defaults]\nladder = []\n".to_string();
        if with_gone {
            text += &cgroup_quota(&gone, "2GiB");
        }
        text + &cgroup_quota(&kept, &format!("{kept_gib}GiB"))
    };
    let mut agent = AgentProcess::start_in(agent_dir(&quotas(3, true)), &sc, &[], "200ms");
    let wait_limit = |cg: &TestCgroup, want: Option<u64>, agent: &AgentProcess| {
        wait_driver_limit(&sc, cg, want, agent)
    };
    wait_limit(&gone, Some(2 * GIB), &agent);
    wait_limit(&kept, Some(3 * GIB), &agent);
    // A crash: nothing is cleared. While the agent is down, one quota goes and one is raised.
    agent.sigkill();
    assert_eq!(
        driver_limit(&sc, "GPU-susp", gone.dir()).map(|l| l.1),
        Some(2 * GIB)
    );
    agent.write_quotas(&quotas(4, false));
    agent.restart();
    wait_limit(&kept, Some(4 * GIB), &agent);
    wait_limit(&gone, None, &agent);
    // SIGTERM clears every limit it set.
    assert_eq!(agent.stop(), Some(0));
    assert_eq!(driver_limit(&sc, "GPU-susp", kept.dir()), None);
}

#[test]
fn a_dry_run_sets_no_driver_limit() {
    needs_root!("driver_limits_dry_run");
    let (cg, p) = sleeping_group("dlim-dry");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], json!({}))).unwrap();
    let quotas = format!("[defaults]\nladder = []\n{}", cgroup_quota(&cg, "2GiB"));
    let agent = AgentProcess::start(&sc, &quotas, &["--dry-run"]);
    agent.wait_for(WAIT, |s| {
        workload(s, &key(&cg), "all").is_some_and(|w| w.quota_bytes == Some(2 * GIB))
    });
    agent.wait_next_step();
    agent.wait_next_step();
    assert_eq!(
        driver_limit(&sc, "GPU-susp", cg.dir()),
        None,
        "a dry run only reports\n{}",
        agent.log()
    );
}

#[test]
fn check_warns_when_a_ladder_suspends_on_a_node_without_the_checkpoint_api() {
    let dir = std::env::temp_dir().join(unique("check-suspend"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("quotas.toml");
    std::fs::write(
        &file,
        "[[quota]]\ncgroup = \"/x\"\ngpu_memory = \"1GiB\"\nladder = [ { action = \"freeze\" }, { action = \"suspend\", after = \"10s\" } ]\n",
    )
    .unwrap();
    let run = |lib: &Path| {
        let out = std::process::Command::new(gpushare_testkit::workspace_bin("gpushare-agent"))
            .arg("check")
            .arg(&file)
            .arg("--cuda-lib")
            .arg(lib)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let without = run(Path::new("/nonexistent/libcuda.so.1"));
    assert!(
        without.contains("warning: a ladder uses `suspend`") && without.contains("falls"),
        "{without}"
    );
    // With a driver that has the API (the mock at CUDA 12.8) there is nothing to warn about.
    let sc = Scenario::create(&scenario(&[], json!({}))).unwrap();
    let with = std::process::Command::new(gpushare_testkit::workspace_bin("gpushare-agent"))
        .arg("check")
        .arg(&file)
        .arg("--cuda-lib")
        .arg(fake_cuda_lib())
        .env(gpushare_testkit::nvml::SCENARIO_ENV, sc.path())
        .output()
        .unwrap();
    let with = String::from_utf8_lossy(&with.stdout);
    assert!(!with.contains("`suspend`"), "{with}");
    let _ = std::fs::remove_dir_all(&dir);
}
