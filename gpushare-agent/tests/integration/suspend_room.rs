//! Suspensions that never strand a workload (issue 21). One resume rule on every path: no restore while the GPU lacks room for a suspended
//! workload's footprint, whether the agent stops (SIGTERM), an operator runs `thaw --all`, or the
//! workload stops being liable (its quota removed); each brings the workload back once room
//! returns. The mock driver is told to behave as driver 580.95 does (cuda-checkpoint#44): a
//! restore that runs out of memory leaves the process `failed`, unrestorable for good, so a
//! restore tried without room shows as a stranded workload and not only as a line in a log.
//! And a suspend moves what holds GPU memory: a helper without CUDA state does not opt the
//! workload out.

use std::{path::Path, process::Command, time::Duration};

use gpushare_testkit::{
    FakeDeviceNode, FakeGpuProcess, TestCgroup,
    nvml::{SCENARIO_ENV, Scenario, fake_cuda_lib, fake_nvml_lib},
    unique, workspace_bin,
};
use serde_json::{Value, json};

use crate::suspend::{GIB, SUSPEND, WAIT, cuda_args, cuda_state, scenario, used_on_gpu};
use crate::util::{
    AgentProcess, agent_dir, cgroup_quota, key, needs_root, sleeping_group, wait_until, workload,
};

/// A (`a` bytes) and its neighbour N (`n` bytes) on one 80 GiB GPU; a restore without room
/// breaks the process for good.
fn two(a: u32, a_bytes: u64, n: u32, n_bytes: u64) -> Value {
    scenario(
        &[(a, a_bytes), (n, n_bytes)],
        json!({ "out_of_memory_state": "failed" }),
    )
}

/// A suspended with its 6 GiB in host memory, then N grown to 76 GiB: 4 GiB free, less than
/// A's footprint. Returns the agent (sampling every 200 ms, over `quotas`).
fn suspended_without_room(
    sc: &Scenario,
    a: (&TestCgroup, u32),
    n: u32,
    quotas: &str,
) -> AgentProcess {
    let args = cuda_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = AgentProcess::start_in(agent_dir(quotas), sc, &args, "200ms");
    agent.wait_used(&key(a.0), GIB);
    sc.write(&two(a.1, 6 * GIB, n, GIB)).unwrap();
    agent.wait_state(&key(a.0), "suspended");
    assert_eq!(cuda_state(sc, a.1), "checkpointed");
    sc.write(&two(a.1, 6 * GIB, n, 76 * GIB)).unwrap();
    agent.wait_for(WAIT, |_| used_on_gpu(&agent) == 76 * GIB);
    agent
}

/// The agent tried no restore: no driver answer about one is in its log.
fn tried_no_restore(log: &str) {
    assert!(
        !log.contains("restore of pid") && !log.contains("OUT_OF_MEMORY"),
        "a restore was tried without room:\n{log}"
    );
}

#[test]
fn a_restart_without_room_keeps_the_suspension_and_the_next_agent_resumes_it_when_room_returns() {
    needs_root!("a_restart_without_room_keeps_the_suspension");
    let (cg, p) = sleeping_group("room-restart");
    let (ncg, n) = sleeping_group("room-restart-n");
    let sc = Scenario::create(&two(p.pid(), GIB, n.pid(), GIB)).unwrap();
    let quotas = |a: &str| {
        format!(
            "{SUSPEND}{}{}",
            cgroup_quota(&cg, a),
            cgroup_quota(&ncg, "80GiB")
        )
    };
    let mut agent = suspended_without_room(&sc, (&cg, p.pid()), n.pid(), &quotas("2GiB"));
    // A rollout: SIGTERM with no room. A stays suspended, frozen and recorded.
    assert_eq!(agent.stop(), Some(0));
    assert_eq!(
        cuda_state(&sc, p.pid()),
        "checkpointed",
        "SIGTERM restored without room\n{}",
        agent.log()
    );
    tried_no_restore(&agent.log());
    assert!(cg.is_frozen(), "left suspended means left frozen");
    let ledger = std::fs::read_to_string(agent.ledger()).unwrap();
    assert!(ledger.contains(cg.rel_path()), "{ledger}");
    assert!(
        agent.log().contains("left suspended"),
        "the log names what it left\n{}",
        agent.log()
    );
    // The next agent: A's quota now covers its footprint, but there is still no room.
    agent.write_quotas(&quotas("8GiB"));
    agent.restart();
    agent.wait_for(WAIT, |s| {
        workload(s, &key(&cg), "all")
            .is_some_and(|w| w.state == "suspended" && w.detail.contains("waiting for room"))
    });
    agent.steps_over(Duration::from_secs(1), |_| {});
    assert_eq!(cuda_state(&sc, p.pid()), "checkpointed");
    // N shrinks: room. A comes back.
    sc.write(&two(p.pid(), 6 * GIB, n.pid(), GIB)).unwrap();
    agent.wait_state(&key(&cg), "ok");
    assert_eq!(cuda_state(&sc, p.pid()), "running");
    assert!(cg.wait_frozen(false));
    tried_no_restore(&agent.log());
}

#[test]
fn a_quota_removed_without_room_waits_for_room_off_the_event_loop_and_then_resumes() {
    needs_root!("a_quota_removed_without_room_waits_for_room");
    let (cg, p) = sleeping_group("room-unquota");
    let (ncg, n) = sleeping_group("room-unquota-n");
    let sc = Scenario::create(&two(p.pid(), GIB, n.pid(), GIB)).unwrap();
    let neighbour = cgroup_quota(&ncg, "80GiB");
    let agent = suspended_without_room(
        &sc,
        (&cg, p.pid()),
        n.pid(),
        &format!("{SUSPEND}{}{neighbour}", cgroup_quota(&cg, "2GiB")),
    );
    // A's quota goes: it is no longer liable, but the GPU cannot hold it.
    agent.write_quotas(&format!("{SUSPEND}{neighbour}"));
    let s = agent.wait_for(WAIT, |s| {
        workload(s, &key(&cg), "all").is_some_and(|w| w.detail.contains("waiting for room"))
    });
    let row = workload(&s, &key(&cg), "all").unwrap();
    assert_eq!(row.state, "suspended", "{row:?}");
    assert!(row.detail.contains("GiB"), "says how much: {row:?}");
    agent.steps_over(Duration::from_secs(2), |_| {
        assert_eq!(cuda_state(&sc, p.pid()), "checkpointed");
    });
    tried_no_restore(&agent.log());
    sc.write(&two(p.pid(), 6 * GIB, n.pid(), GIB)).unwrap();
    wait_until(
        WAIT,
        || format!("not resumed\n{}", agent.log()),
        || cuda_state(&sc, p.pid()) == "running" && !cg.is_frozen(),
    );
    wait_until(
        WAIT,
        || format!("still recorded\n{}", agent.log()),
        || {
            !std::fs::read_to_string(agent.ledger())
                .unwrap()
                .contains(cg.rel_path())
        },
    );
    assert!(
        agent.log().contains("resumed because"),
        "resumed by the policy's resume, not by a thaw\n{}",
        agent.log()
    );
}

/// `gpushare-agent thaw --all` over the agent directory `dir`, with the mock libraries (NVML
/// unless `nvml` is false) and `extra` arguments: (exit code, stdout + stderr).
pub(crate) fn thaw_all(
    dir: &Path,
    sc: &Scenario,
    nvml: bool,
    extra: &[&str],
) -> (Option<i32>, String) {
    let mut cmd = Command::new(workspace_bin("gpushare-agent"));
    cmd.args(["thaw", "--all", "--state-dir"])
        .arg(dir.join("state"))
        .arg("--cuda-lib")
        .arg(fake_cuda_lib())
        .args(extra)
        .env(SCENARIO_ENV, sc.path());
    if nvml {
        cmd.arg("--nvml-lib").arg(fake_nvml_lib());
    } else {
        cmd.arg("--nvml-lib").arg("/nonexistent/libnvidia-ml.so.1");
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn thaw_all_resumes_only_where_there_is_room_and_names_what_it_left_suspended() {
    needs_root!("thaw_all_resumes_only_where_there_is_room");
    let (cg, p) = sleeping_group("room-thaw");
    let (ncg, n) = sleeping_group("room-thaw-n");
    let sc = Scenario::create(&two(p.pid(), GIB, n.pid(), GIB)).unwrap();
    let quotas = format!(
        "{SUSPEND}{}{}",
        cgroup_quota(&cg, "2GiB"),
        cgroup_quota(&ncg, "80GiB")
    );
    let mut agent = suspended_without_room(&sc, (&cg, p.pid()), n.pid(), &quotas);
    // The agent is lost for good (a crash, then an uninstall).
    agent.sigkill();
    let (code, out) = thaw_all(&agent.dir, &sc, true, &[]);
    assert_ne!(code, Some(0), "something was left undone: {out}");
    assert!(
        out.contains("left suspended") && out.contains(&key(&cg)) && out.contains("free"),
        "names it with the reason: {out}"
    );
    assert_eq!(cuda_state(&sc, p.pid()), "checkpointed", "{out}");
    assert!(cg.is_frozen());
    // Without NVML room cannot be judged: still nothing restored ...
    let (code, out) = thaw_all(&agent.dir, &sc, false, &[]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("left suspended"), "{out}");
    assert_eq!(cuda_state(&sc, p.pid()), "checkpointed", "{out}");
    // ... unless the operator says so, once room returns.
    sc.write(&two(p.pid(), 6 * GIB, n.pid(), GIB)).unwrap();
    let (code, out) = thaw_all(&agent.dir, &sc, false, &["--restore-without-room"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(cuda_state(&sc, p.pid()), "running", "{out}");
    assert!(cg.wait_frozen(false));
    // And with room judged by NVML: a second suspension (a fresh agent) comes back on its own.
    sc.write(&two(p.pid(), GIB, n.pid(), GIB)).unwrap();
    agent.restart();
    agent.wait_used(&key(&cg), GIB);
    sc.write(&two(p.pid(), 6 * GIB, n.pid(), GIB)).unwrap();
    agent.wait_state(&key(&cg), "suspended");
    agent.sigkill();
    let (code, out) = thaw_all(&agent.dir, &sc, true, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(cuda_state(&sc, p.pid()), "running", "{out}");
    assert!(cg.wait_frozen(false));
}

#[test]
fn a_workload_with_an_nvml_only_helper_is_suspended_the_helper_frozen_not_locked() {
    needs_root!("a_workload_with_an_nvml_only_helper_is_suspended");
    let node = FakeDeviceNode::create(&unique("helper")).unwrap();
    let (cg, p) = sleeping_group("susp-helper");
    // `nvidia-smi` in a loop, a metrics sidecar: it opened the device, NVML lists no memory of
    // it, and the driver says it has no CUDA state.
    let helper = FakeGpuProcess::spawn(Some(&cg), &[node.path()], &[]).unwrap();
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], json!({}))).unwrap();
    let args = cuda_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = AgentProcess::start(
        &sc,
        &format!("{SUSPEND}{}", cgroup_quota(&cg, "2GiB")),
        &args,
    );
    agent.wait_used(&key(&cg), GIB);
    sc.write(&scenario(&[(p.pid(), 3 * GIB)], json!({})))
        .unwrap();
    let s = agent.wait_state(&key(&cg), "suspended");
    assert_eq!(
        workload(&s, &key(&cg), "all").unwrap().suspended_bytes,
        3 * GIB
    );
    assert_eq!(cuda_state(&sc, p.pid()), "checkpointed");
    assert!(
        cg.wait_frozen(true),
        "the freeze of the root stops the helper too"
    );
    assert!(
        agent.log().contains(&format!("[{}]", helper.pid()))
            && agent.log().contains("no CUDA state"),
        "the log says which pid was not locked and why\n{}",
        agent.log()
    );
}

#[test]
fn sigterm_keeps_an_elastic_borrower_suspended_while_its_restore_would_eat_the_reserve() {
    needs_root!("sigterm_keeps_an_elastic_borrower_suspended");
    let (big, pb) = sleeping_group("room-el-big");
    let (small, ps) = sleeping_group("room-el-small");
    let (_other, po) = sleeping_group("room-el-other");
    let quotas = format!(
        "[defaults]\nmode = \"elastic\"\nelastic_reserve = \"8GiB\"\ngrace = \"0s\"\nladder = [ {{ action = \"suspend\" }} ]\n{}{}",
        cgroup_quota(&big, "2GiB"),
        cgroup_quota(&small, "2GiB")
    );
    let at = |other: u64| {
        scenario(
            &[(pb.pid(), 20 * GIB), (ps.pid(), 4 * GIB), (po.pid(), other)],
            json!({}),
        )
    };
    let sc = Scenario::create(&at(GIB)).unwrap();
    let args = cuda_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = AgentProcess::start(&sc, &quotas, &args);
    agent.wait_used(&key(&big), 20 * GIB);
    // Pressure: 3 GiB free, below the 8 GiB reserve: the largest borrower is suspended.
    sc.write(&at(53 * GIB)).unwrap();
    agent.wait_state(&key(&big), "suspended");
    // Its 20 GiB off the GPU, 23 GiB are free: enough for its restore, not with the 8 GiB
    // reserve besides. The agent keeps it suspended, and so does its SIGTERM.
    agent.steps_over(Duration::from_secs(1), |s| {
        assert_eq!(workload(s, &key(&big), "all").unwrap().state, "suspended");
    });
    assert_eq!(agent.stop(), Some(0));
    assert_eq!(
        cuda_state(&sc, pb.pid()),
        "checkpointed",
        "restored at shutdown into the reserve\n{}",
        agent.log()
    );
    assert!(agent.log().contains("elastic reserve"), "{}", agent.log());
    // Enough room with the reserve: the next agent (or this one's SIGTERM) brings it back.
    sc.write(&at(GIB)).unwrap();
    agent.restart();
    agent.wait_state(&key(&big), "ok");
    assert_eq!(cuda_state(&sc, pb.pid()), "running");
}

#[test]
fn sigterm_leaves_suspended_what_its_restore_budget_cannot_cover() {
    needs_root!("sigterm_leaves_suspended_what_its_restore_budget_cannot_cover");
    let (cg, p) = sleeping_group("room-budget");
    // Checkpoints take 2 s here: the agent measures that speed and expects restores to match.
    let slow = json!({ "checkpoint_delay_ms": 2000 });
    let sc = Scenario::create(&scenario(&[(p.pid(), GIB)], slow.clone())).unwrap();
    let mut args = cuda_args();
    args.extend(["--shutdown-restore-budget".to_string(), "1s".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = AgentProcess::start(
        &sc,
        &format!("{SUSPEND}{}", cgroup_quota(&cg, "2GiB")),
        &args,
    );
    agent.wait_used(&key(&cg), GIB);
    sc.write(&scenario(&[(p.pid(), 6 * GIB)], slow)).unwrap();
    agent.wait_for(WAIT, |s| {
        workload(s, &key(&cg), "all").is_some_and(|w| w.state == "suspended")
            && s.counters.suspended_bytes_total > 0
    });
    // Room on the GPU, but a restore of about 2 s does not fit a 1 s budget.
    assert_eq!(agent.stop(), Some(0));
    assert_eq!(cuda_state(&sc, p.pid()), "checkpointed", "{}", agent.log());
    assert!(cg.is_frozen());
    assert!(
        agent.log().contains("shutdown restore budget"),
        "{}",
        agent.log()
    );
    tried_no_restore(&agent.log());
}
