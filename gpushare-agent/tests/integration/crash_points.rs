//! Deterministic crash points (issue 21): the agent, started with `GPUSHARE_CRASH_AT=<point>`,
//! SIGKILLs itself right after the durable step the point names (`gpushare_agent::crash`). After
//! each, a restart over quota holds the workload again (frozen or suspended, and recorded), and a
//! restart under quota brings it back (running, thawed, nothing recorded); no driver limit is
//! left that no quota wants. Nothing is lost, stranded or leaked whichever step the crash split.

use gpushare_agent::crash;
use gpushare_testkit::{TestCgroup, nvml::Scenario};
use serde_json::json;

use crate::suspend::{GIB, SUSPEND, WAIT, cuda_args, cuda_state, driver_limit, scenario};
use crate::util::{
    AgentProcess, agent_dir, cgroup_quota, key, needs_root, sleeping_group, wait_until, workload,
};

const FREEZE: &str = "[defaults]\ngrace = \"0s\"\nladder = [ { action = \"freeze\" } ]\n";

/// Starts the agent with the crash point `point`, runs `trigger`, and waits until the agent has
/// killed itself there; the next start has no crash point.
fn crash_at(agent: &mut AgentProcess, point: &str, trigger: impl FnOnce(&AgentProcess)) {
    agent.set_envs(&[(crash::ENV, point)]);
    agent.spawn_unready();
    trigger(agent);
    assert!(
        agent.wait_exit(WAIT),
        "{point}: the crash point was never reached\n{}",
        agent.log()
    );
    assert!(
        agent.log().contains(&format!("{}={point}", crash::ENV)),
        "{point}: ended, but not at its crash point\n{}",
        agent.log()
    );
    agent.set_envs(&[]);
}

fn recorded(agent: &AgentProcess, cg: &TestCgroup) -> bool {
    std::fs::read_to_string(agent.ledger()).is_ok_and(|l| l.contains(cg.rel_path()))
}

/// After a restart: brought back and forgotten.
fn back(agent: &AgentProcess, cg: &TestCgroup, what: &str) {
    wait_until(
        WAIT,
        || format!("{what}: still frozen or recorded\n{}", agent.log()),
        || !cg.is_frozen() && !recorded(agent, cg),
    );
}

#[test]
fn a_crash_at_each_step_of_a_freeze_or_a_thaw_strands_nothing() {
    needs_root!("a_crash_at_each_step_of_a_freeze_or_a_thaw");
    for point in [
        "freeze-recorded",
        "freeze-marked",
        "freeze-applied",
        "thaw-applied",
        "forgotten",
    ] {
        for restart_over in [true, false] {
            let what = format!(
                "{point}, restart {}",
                if restart_over { "over" } else { "under" }
            );
            let (cg, p) = sleeping_group("crash-f");
            let at = |b: u64| scenario(&[(p.pid(), b)], json!({}));
            let sc = Scenario::create(&at(GIB)).unwrap();
            let quotas = format!("{FREEZE}{}", cgroup_quota(&cg, "2GiB"));
            let mut agent = AgentProcess::unstarted(agent_dir(&quotas), &sc, &[], "200ms");
            crash_at(&mut agent, point, |_| {
                sc.write(&at(3 * GIB)).unwrap();
                if point.starts_with("thaw") || point == "forgotten" {
                    assert!(cg.wait_frozen(true), "{what}: never frozen");
                    sc.write(&at(GIB)).unwrap();
                }
            });
            sc.write(&at(if restart_over { 3 * GIB } else { GIB }))
                .unwrap();
            agent.restart();
            if restart_over {
                agent.wait_state(&key(&cg), "frozen");
                assert!(cg.wait_frozen(true), "{what}");
                assert!(recorded(&agent, &cg), "{what}: frozen and not recorded");
                sc.write(&at(GIB)).unwrap();
            }
            back(&agent, &cg, &what);
        }
    }
}

#[test]
fn a_crash_at_each_step_of_a_suspend_or_a_resume_strands_nothing() {
    needs_root!("a_crash_at_each_step_of_a_suspend_or_a_resume");
    for point in [
        "suspend-recorded",
        "suspend-marked",
        "suspend-checkpointed",
        "suspend-frozen",
        "resume-thawed",
        "resume-restored",
        "resume-done",
    ] {
        for restart_over in [true, false] {
            let what = format!(
                "{point}, restart {}",
                if restart_over { "over" } else { "under" }
            );
            let (cg, p) = sleeping_group("crash-s");
            let at = |b: u64| scenario(&[(p.pid(), b)], json!({}));
            let sc = Scenario::create(&at(GIB)).unwrap();
            let quotas = |q: &str| format!("{SUSPEND}{}", cgroup_quota(&cg, q));
            let args = cuda_args();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut agent =
                AgentProcess::unstarted(agent_dir(&quotas("2GiB")), &sc, &args, "200ms");
            crash_at(&mut agent, point, |agent| {
                sc.write(&at(3 * GIB)).unwrap();
                if point.starts_with("resume") {
                    wait_until(
                        WAIT,
                        || format!("{what}: never suspended\n{}", agent.log()),
                        || cuda_state(&sc, p.pid()) == "checkpointed" && cg.is_frozen(),
                    );
                    agent.write_quotas(&quotas("8GiB"));
                }
            });
            agent.write_quotas(&quotas(if restart_over { "2GiB" } else { "8GiB" }));
            agent.restart();
            if restart_over {
                agent.wait_for(WAIT, |s| {
                    workload(s, &key(&cg), "all")
                        .is_some_and(|w| w.state == "suspended" || w.state == "frozen")
                });
                assert!(recorded(&agent, &cg), "{what}: held and not recorded");
                assert_ne!(cuda_state(&sc, p.pid()), "failed", "{what}");
                agent.write_quotas(&quotas("8GiB"));
            }
            back(&agent, &cg, &what);
            wait_until(
                WAIT,
                || {
                    format!(
                        "{what}: not running: {}\n{}",
                        cuda_state(&sc, p.pid()),
                        agent.log()
                    )
                },
                || cuda_state(&sc, p.pid()) == "running",
            );
        }
    }
}

#[test]
fn a_crash_at_each_step_of_a_driver_limit_leaks_no_limit() {
    needs_root!("a_crash_at_each_step_of_a_driver_limit");
    for point in ["limit-recorded", "limit-set"] {
        for quota_stays in [true, false] {
            let what = format!(
                "{point}, quota {}",
                if quota_stays { "kept" } else { "removed" }
            );
            let (cg, p) = sleeping_group("crash-l");
            let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], json!({}))).unwrap();
            let with = format!("[defaults]\nladder = []\n{}", cgroup_quota(&cg, "2GiB"));
            let mut agent = AgentProcess::unstarted(agent_dir(&with), &sc, &[], "200ms");
            crash_at(&mut agent, point, |_| {});
            if !quota_stays {
                agent.write_quotas("[defaults]\nladder = []\n");
            }
            agent.restart();
            let want: Option<(u64, u64)> = quota_stays.then_some((0, 2 * GIB));
            wait_until(
                WAIT,
                || {
                    format!(
                        "{what}: limit {:?}, not {want:?}\n{}",
                        driver_limit(&sc, "GPU-susp", cg.dir()),
                        agent.log()
                    )
                },
                || driver_limit(&sc, "GPU-susp", cg.dir()) == want,
            );
            assert_eq!(agent.stop(), Some(0));
            assert_eq!(driver_limit(&sc, "GPU-susp", cg.dir()), None, "{what}");
        }
    }
}

/// Every checkpoint call the mock libcuda has, forced to fail: a call shows in the agent's log.
fn no_checkpoint_calls() -> serde_json::Value {
    json!({ "fail": {
        "cuCheckpointProcessLock": 999,
        "cuCheckpointProcessCheckpoint": 999,
        "cuCheckpointProcessRestore": 999,
        "cuCheckpointProcessUnlock": 999,
    } })
}

#[test]
fn a_dry_run_over_an_earlier_runs_suspension_and_limits_clears_nothing_and_calls_no_checkpoint() {
    needs_root!("a_dry_run_over_an_earlier_runs_state");
    let (cg, p) = sleeping_group("crash-dry");
    let (lim, q) = sleeping_group("crash-dry-lim");
    let at = |a: u64, cuda: serde_json::Value| scenario(&[(p.pid(), a), (q.pid(), GIB)], cuda);
    let sc = Scenario::create(&at(GIB, json!({}))).unwrap();
    let quotas = |a: &str, with_lim: bool| {
        let mut text = format!("{SUSPEND}{}", cgroup_quota(&cg, a));
        if with_lim {
            text += &cgroup_quota(&lim, "2GiB");
        }
        text
    };
    let args = cuda_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = AgentProcess::start_in(agent_dir(&quotas("2GiB", true)), &sc, &args, "200ms");
    wait_until(
        WAIT,
        || format!("no limit\n{}", agent.log()),
        || driver_limit(&sc, "GPU-susp", lim.dir()) == Some((0, 2 * GIB)),
    );
    sc.write(&at(3 * GIB, json!({}))).unwrap();
    agent.wait_state(&key(&cg), "suspended");
    agent.sigkill();
    let ledger = std::fs::read_to_string(agent.ledger()).unwrap();
    // The dry run would resume `cg` (its quota now covers it) and clear `lim`'s limit (its
    // quota is gone): it does neither, and calls no checkpoint function.
    agent.write_quotas(&quotas("8GiB", false));
    sc.write(&at(3 * GIB, no_checkpoint_calls())).unwrap();
    let mut dry = AgentProcess::unstarted(
        agent.dir.clone(),
        &sc,
        &[args.as_slice(), &["--dry-run"]].concat(),
        "200ms",
    );
    dry.restart();
    dry.steps_over(std::time::Duration::from_secs(2), |_| {});
    assert_eq!(dry.stop(), Some(0));
    let log = dry.log();
    assert!(log.contains("dry run: would resume"), "{log}");
    for call in [
        "lock of pid",
        "checkpoint of pid",
        "restore of pid",
        "unlock of pid",
    ] {
        assert!(
            !log.contains(call),
            "a dry run called the driver ({call}):\n{log}"
        );
    }
    assert_eq!(cuda_state(&sc, p.pid()), "checkpointed");
    assert!(cg.is_frozen());
    assert_eq!(std::fs::read_to_string(agent.ledger()).unwrap(), ledger);
    assert_eq!(
        driver_limit(&sc, "GPU-susp", lim.dir()),
        Some((0, 2 * GIB)),
        "{log}"
    );
    std::mem::forget(dry); // shares the agent's directory, removed when `agent` drops
    // The real agent again: resumed, and the limit no quota wants cleared.
    sc.write(&at(3 * GIB, json!({}))).unwrap();
    agent.restart();
    back(&agent, &cg, "after the dry run");
    wait_until(
        WAIT,
        || format!("limit left\n{}", agent.log()),
        || driver_limit(&sc, "GPU-susp", lim.dir()).is_none(),
    );
}

#[test]
fn an_invalid_quota_file_at_start_keeps_an_earlier_runs_driver_limits_as_they_are() {
    needs_root!("an_invalid_quota_file_at_start_keeps_driver_limits");
    let (cg, p) = sleeping_group("crash-observe");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], json!({}))).unwrap();
    let quotas = format!("[defaults]\nladder = []\n{}", cgroup_quota(&cg, "2GiB"));
    let mut agent = AgentProcess::start_in(agent_dir(&quotas), &sc, &[], "200ms");
    wait_until(
        WAIT,
        || format!("no limit\n{}", agent.log()),
        || driver_limit(&sc, "GPU-susp", cg.dir()) == Some((0, 2 * GIB)),
    );
    agent.sigkill();
    // Broken, and no last good copy kept: the next start observes only. Its policy wants no
    // limit for anything, and it must not take that as "clear them".
    agent.write_quotas("[[quota]]\ncgroup = \n");
    let _ = std::fs::remove_dir_all(agent.dir.join("state/last-good-quotas"));
    agent.restart();
    let s = agent.steps_over(std::time::Duration::from_secs(1), |_| {});
    assert!(s.health.observe_only, "{:?}", s.health);
    assert_eq!(driver_limit(&sc, "GPU-susp", cg.dir()), Some((0, 2 * GIB)));
}
