//! Driver limits that leave nothing behind (issue 21): the real agent over the mock NVML, which
//! records the limits set through `nvmlDeviceSetMemoryLimits_v1` and models soft limits as the
//! reservations NVIDIA documents (added into every ancestor group, left there when a group is
//! deleted before its soft limit is zeroed), and the inode of the group each limit was set on.

use std::{path::Path, process::Command, time::Duration};

use gpushare_testkit::{
    TestCgroup,
    nvml::{SCENARIO_ENV, Scenario, fake_nvml_lib},
    workspace_bin,
};
use serde_json::{Value, json};

use crate::suspend::{GIB, WAIT, driver_limit, scenario, wait_driver_limit};
use crate::util::{
    AgentProcess, agent_dir, cgroup_quota, group, needs_root, sleeping, sleeping_group, wait_until,
};

/// `memory-limits.json` of the mock NVML.
fn recorded(sc: &Scenario) -> Value {
    std::fs::read_to_string(sc.dir().join("memory-limits.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

fn inode(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(dir).unwrap().ino()
}

/// The inode of the group whose limit the mock saw set last at `dir`.
fn limited_inode(sc: &Scenario, dir: &Path) -> Option<u64> {
    recorded(sc)["inodes"][dir.to_str()?].as_u64()
}

#[test]
fn a_group_recreated_at_the_same_path_is_limited_again() {
    needs_root!("a_group_recreated_at_the_same_path_is_limited_again");
    let (cg, p) = sleeping_group("dlim-recreate");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], json!({}))).unwrap();
    let quotas = format!("[defaults]\nladder = []\n{}", cgroup_quota(&cg, "2GiB"));
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    wait_driver_limit(&sc, &cg, Some(2 * GIB), &agent);
    let first = inode(cg.dir());
    assert_eq!(limited_inode(&sc, cg.dir()), Some(first));
    // `docker restart`: the group is deleted and made again at the same path, the workload
    // (its key, its quota, its limit) the same.
    let aside = group("dlim-recreate-aside");
    std::fs::write(aside.procs_file(), p.pid().to_string()).unwrap();
    std::fs::remove_dir(cg.dir()).unwrap();
    std::fs::create_dir(cg.dir()).unwrap();
    std::fs::write(cg.procs_file(), p.pid().to_string()).unwrap();
    let second = inode(cg.dir());
    assert_ne!(first, second);
    wait_until(
        WAIT,
        || {
            format!(
                "the new group at {} was not limited: {}\n{}",
                cg.rel_path(),
                recorded(&sc),
                agent.log()
            )
        },
        || limited_inode(&sc, cg.dir()) == Some(second),
    );
    assert_eq!(driver_limit(&sc, "GPU-susp", cg.dir()), Some((0, 2 * GIB)));
}

#[test]
fn a_limited_group_removed_as_its_last_process_exits_leaves_no_reservation_behind() {
    needs_root!("a_limited_group_removed_leaves_no_reservation");
    // A pod's group and its container's group below it, as a runtime lays them out.
    let pod = group("dlim-leak");
    let ctr = TestCgroup::create(&format!(
        "{}/ctr",
        pod.rel_path().trim_start_matches("/gpushare-test/")
    ))
    .unwrap();
    let p = sleeping(&ctr);
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], json!({}))).unwrap();
    let quotas = format!("[defaults]\nladder = []\n{}", cgroup_quota(&ctr, "2GiB"));
    // The agent at its default interval, 1 s: the group goes when it goes, not when the test
    // has seen the agent step.
    let agent = AgentProcess::start_in(agent_dir(&quotas), &sc, &[], "1s");
    wait_driver_limit(&sc, &ctr, Some(2 * GIB), &agent);
    // The container ends: its last process exits and the runtime deletes its group at once.
    drop(p);
    drop(ctr);
    agent.steps_over(Duration::from_secs(3), |_| {});
    let r = recorded(&sc);
    let reserved = r["reserved"].as_object().map(|m| m.len()).unwrap_or(0);
    assert_eq!(
        reserved,
        0,
        "a reservation outlives the group in its ancestors: {r}\n{}",
        agent.log()
    );
}

#[test]
fn thaw_all_clears_the_driver_limits_a_lost_agent_left() {
    needs_root!("thaw_all_clears_the_driver_limits");
    let (cg, p) = sleeping_group("dlim-thaw");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], json!({}))).unwrap();
    let quotas = format!("[defaults]\nladder = []\n{}", cgroup_quota(&cg, "2GiB"));
    let mut agent = AgentProcess::start(&sc, &quotas, &[]);
    wait_driver_limit(&sc, &cg, Some(2 * GIB), &agent);
    agent.sigkill();
    let out = Command::new(workspace_bin("gpushare-agent"))
        .args(["thaw", "--all", "--state-dir"])
        .arg(agent.dir.join("state"))
        .arg("--nvml-lib")
        .arg(fake_nvml_lib())
        .env(SCENARIO_ENV, sc.path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert_eq!(
        driver_limit(&sc, "GPU-susp", cg.dir()),
        None,
        "a limit outlives the agent: {text}"
    );
    assert!(text.contains("cleared 1 driver limit"), "{text}");
}

#[test]
fn a_limit_the_agent_did_not_set_is_never_changed_or_cleared() {
    needs_root!("a_limit_the_agent_did_not_set");
    let (theirs, p) = sleeping_group("dlim-theirs");
    let (ours, q) = sleeping_group("dlim-ours");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB), (q.pid(), GIB)], json!({}))).unwrap();
    // NVIDIA's container hook (`apply-cuda-memory-limits`): soft = request, hard = limit, on
    // the container's own cgroup, before the agent sees it.
    let hook = (GIB, 3 * GIB);
    let dir = theirs.dir().to_str().unwrap().to_string();
    std::fs::write(
        sc.dir().join("memory-limits.json"),
        json!({ "devices": { "GPU-susp": { dir: { "soft": hook.0, "hard": hook.1 } } } })
            .to_string(),
    )
    .unwrap();
    let quotas = format!(
        "[defaults]\nladder = []\n{}{}",
        cgroup_quota(&theirs, "2GiB"),
        cgroup_quota(&ours, "2GiB")
    );
    let mut agent = AgentProcess::start_in(agent_dir(&quotas), &sc, &[], "200ms");
    wait_driver_limit(&sc, &ours, Some(2 * GIB), &agent);
    agent.steps_over(Duration::from_secs(1), |_| {
        assert_eq!(driver_limit(&sc, "GPU-susp", theirs.dir()), Some(hook));
    });
    let record =
        std::fs::read_to_string(agent.dir.join("state/driver-limits.json")).unwrap_or_default();
    assert!(
        !record.contains(theirs.rel_path()),
        "not recorded as ours: {record}"
    );
    assert!(
        agent.log().contains("the agent did not set"),
        "the log says so\n{}",
        agent.log()
    );
    // Exported, with where it came from.
    let metrics = agent.get("/metrics").1;
    let series = |cg: &TestCgroup, kind: &str, source: &str| {
        format!(
            "gpushare_driver_limit_bytes{{gpu_uuid=\"GPU-susp\",cgroup=\"{}\",kind=\"{kind}\",source=\"{source}\"}}",
            cg.rel_path()
        )
    };
    for (line, value) in [
        (series(&theirs, "soft", "other"), hook.0),
        (series(&theirs, "hard", "other"), hook.1),
        (series(&ours, "hard", "agent"), 2 * GIB),
    ] {
        assert!(
            metrics.contains(&format!("{line} {value}")),
            "{line} {value} not in\n{metrics}"
        );
    }
    assert!(
        !metrics.contains(&series(&ours, "soft", "agent")),
        "no soft limit of the agent's: {metrics}"
    );
    // SIGTERM clears the agent's limits, and only those.
    assert_eq!(agent.stop(), Some(0));
    assert_eq!(driver_limit(&sc, "GPU-susp", ours.dir()), None);
    assert_eq!(driver_limit(&sc, "GPU-susp", theirs.dir()), Some(hook));
}

/// A limit in force and steady (the agent has nothing to do step after step) follows its quota
/// when the file changes under the running agent, and goes when the quota goes.
#[test]
fn a_steady_limit_follows_its_quota_when_the_file_changes() {
    needs_root!("a_steady_limit_follows_its_quota");
    let (cg, p) = sleeping_group("dlim-steady");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], json!({}))).unwrap();
    let quotas = |gib: u64| {
        format!(
            "[defaults]\nladder = []\n{}",
            cgroup_quota(&cg, &format!("{gib}GiB"))
        )
    };
    let agent = AgentProcess::start(&sc, &quotas(2), &[]);
    wait_driver_limit(&sc, &cg, Some(2 * GIB), &agent);
    // Steady: several steps with the same limits wanted and in force.
    agent.steps_over(Duration::from_secs(1), |_| {});
    agent.write_quotas(&quotas(3));
    wait_driver_limit(&sc, &cg, Some(3 * GIB), &agent);
    agent.steps_over(Duration::from_secs(1), |_| {});
    agent.write_quotas("[defaults]\nladder = []\n");
    wait_driver_limit(&sc, &cg, None, &agent);
}

/// Issue 41: the driver limits the agent set are read back (at each reconcile). One cleared
/// behind its back is set again; one someone changed is left as theirs. Before, neither was ever
/// read again: a cleared limit stayed cleared while the agent reported it in force.
#[test]
fn a_driver_limit_cleared_behind_the_agents_back_is_set_again_and_one_changed_is_left() {
    needs_root!("a_driver_limit_cleared_behind_the_agents_back_is_set_again");
    let (cleared, p) = sleeping_group("dlim-cleared");
    let (changed, q) = sleeping_group("dlim-changed");
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB), (q.pid(), GIB)], json!({}))).unwrap();
    let quotas = format!(
        "[defaults]\nladder = []\n{}{}",
        cgroup_quota(&cleared, "2GiB"),
        cgroup_quota(&changed, "3GiB")
    );
    let agent = AgentProcess::start(&sc, &quotas, &["--reconcile-interval", "1s"]);
    wait_driver_limit(&sc, &cleared, Some(2 * GIB), &agent);
    wait_driver_limit(&sc, &changed, Some(3 * GIB), &agent);
    // Behind the agent's back: one limit cleared, one raised (written whole, as a rename, so the
    // mock never reads half a file).
    let path = sc.dir().join("memory-limits.json");
    let mut all = recorded(&sc);
    let limits = all["devices"]["GPU-susp"].as_object_mut().unwrap();
    limits.remove(cleared.dir().to_str().unwrap()).unwrap();
    limits[changed.dir().to_str().unwrap()]["hard"] = json!(5 * GIB);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, all.to_string()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let s = agent.wait_for(WAIT, |s| {
        s.counters.external_changes.get("driver_limit_cleared") == Some(1)
            && s.counters.external_changes.get("driver_limit_changed") == Some(1)
    });
    drop(s);
    wait_driver_limit(&sc, &cleared, Some(2 * GIB), &agent);
    // Theirs stays theirs over further reconciles.
    agent.steps_over(Duration::from_secs(3), |_| {});
    assert_eq!(
        driver_limit(&sc, "GPU-susp", changed.dir()),
        Some((0, 5 * GIB)),
        "{}",
        agent.log()
    );
    assert!(
        agent.log().contains("was cleared: set again"),
        "{}",
        agent.log()
    );
}
