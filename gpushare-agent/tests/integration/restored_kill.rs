//! The kill rung after a restore (issue 41, cuda-checkpoint #53: on driver 595.71.05, SIGKILL or
//! SIGTERM of a process restored from a checkpoint whose context is live again hard-hangs the
//! host about 35 s later). The mock libcuda records such a kill as a host hang; the agent must
//! lock and checkpoint a restored process again, see through NVML that its device memory left
//! the GPU, and only then kill it; where it cannot, it does not kill.

use gpushare_fake_driver::checkpoint::{self, Hang};
use gpushare_testkit::nvml::Scenario;
use serde_json::{Value, json};

use crate::suspend::{GIB, SUSPEND, WAIT, cuda_args, cuda_state, scenario};
use crate::suspend_room::thaw_all;
use crate::util::{
    AgentProcess, Reaped, agent_dir, cgroup_quota, counter_value, key, needs_root, sleeping_group,
    wait_until, workload,
};

const KILL: &str = "[defaults]\ngrace = \"0s\"\nladder = [ { action = \"kill\" } ]\n";

/// What the agent logs once a restored process is checkpointed again and NVML shows none of its
/// memory on the GPU.
const QUIESCED: &str = "checkpointed again before the kill";

/// The host hangs the mock recorded so far (restored processes that ended with a live context).
fn hangs(sc: &Scenario) -> Vec<Hang> {
    checkpoint::host_hangs(sc.path()).unwrap()
}

/// Whether `pid` has exited (a zombie counts: its context is gone).
fn ended(pid: u32) -> bool {
    checkpoint::start_ticks(pid).is_none()
}

/// The simulated driver's kernel log of `sc`, which the agent reads (`--kernel-log`).
fn kernel_log(sc: &Scenario) -> std::path::PathBuf {
    sc.dir().join("kmsg")
}

/// Appends a kernel-log record of priority `prio` (facility 0: the kernel's own) with the
/// driver's report of Xid `xid` naming `pid`, as `/dev/kmsg` gives it.
fn xid(sc: &Scenario, prio: u32, xid: u32, pid: u32) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(kernel_log(sc))
        .unwrap();
    writeln!(
        f,
        "{prio},1204,987654321,-;NVRM: Xid (PCI:0000:3b:00): {xid}, pid={pid}, name=sleep, \
         Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted"
    )
    .unwrap();
}

fn start(sc: &Scenario, quotas: &str) -> AgentProcess {
    std::fs::write(kernel_log(sc), b"").unwrap();
    let mut args = cuda_args();
    args.extend(["--kernel-log".into(), kernel_log(sc).display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    AgentProcess::start_in(agent_dir(quotas), sc, &args, "200ms")
}

/// A workload of one sleeping process holding 6 GiB, suspended over its 2 GiB quota and resumed
/// by a quota raise: its process is restored and its context live.
fn suspended_then_resumed(
    name: &str,
    cuda: Value,
) -> (gpushare_testkit::TestCgroup, Reaped, Scenario, AgentProcess) {
    let (cg, p) = sleeping_group(name);
    resumed(cg, p, cuda)
}

/// [`suspended_then_resumed`] for the process `p` of the group `cg`.
fn resumed(
    cg: gpushare_testkit::TestCgroup,
    p: Reaped,
    cuda: Value,
) -> (gpushare_testkit::TestCgroup, Reaped, Scenario, AgentProcess) {
    let sc = Scenario::create(&scenario(&[(p.pid(), 6 * GIB)], cuda)).unwrap();
    let agent = start(&sc, &format!("{SUSPEND}{}", cgroup_quota(&cg, "2GiB")));
    agent.wait_state(&key(&cg), "suspended");
    assert_eq!(cuda_state(&sc, p.pid()), "checkpointed");
    agent.write_quotas(&format!("{SUSPEND}{}", cgroup_quota(&cg, "8GiB")));
    agent.wait_for(WAIT, |s| {
        workload(s, &key(&cg), "all").is_some_and(|w| w.state == "ok")
    });
    assert!(cg.wait_frozen(false));
    assert_eq!(cuda_state(&sc, p.pid()), "running", "restored and unlocked");
    (cg, p, sc, agent)
}

/// The kill of a restored process came after a checkpoint and an empty device: it ended
/// checkpointed, no hang was recorded, and the agent says so.
fn killed_quiesced(sc: &Scenario, agent: &AgentProcess, pid: u32) {
    wait_until(WAIT, || agent.log(), || ended(pid));
    assert_eq!(hangs(sc), Vec::new(), "host hang (#53)\n{}", agent.log());
    assert_eq!(
        cuda_state(sc, pid),
        "checkpointed",
        "the kill came after a checkpoint"
    );
    let log = agent.log();
    let line = log
        .lines()
        .find(|l| l.contains(QUIESCED) && l.contains(&pid.to_string()))
        .unwrap_or_else(|| panic!("no re-checkpoint logged\n{log}"));
    assert!(line.contains("0 B on the GPU"), "{line}");
}

#[test]
fn a_restored_process_over_quota_again_is_checkpointed_again_and_its_device_empty_before_the_kill()
{
    needs_root!("a_restored_process_over_quota_again_is_checkpointed_again");
    let (cg, p, sc, agent) = suspended_then_resumed("rk-kill", json!({}));
    // Over quota again, and the ladder now kills.
    agent.write_quotas(&format!("{KILL}{}", cgroup_quota(&cg, "2GiB")));
    killed_quiesced(&sc, &agent, p.pid());
}

#[test]
fn a_kill_step_with_sigterm_checkpoints_a_restored_process_first_too() {
    needs_root!("a_kill_step_with_sigterm_checkpoints_a_restored_process_first_too");
    let (cg, p, sc, agent) = suspended_then_resumed("rk-term", json!({}));
    let term = KILL.replace(
        "action = \"kill\"",
        "action = \"kill\", signal = \"SIGTERM\"",
    );
    agent.write_quotas(&format!("{term}{}", cgroup_quota(&cg, "2GiB")));
    killed_quiesced(&sc, &agent, p.pid());
}

/// A restored process whose context faults by itself (cuda-checkpoint #53: the host hangs as it
/// is torn down, as after a kill) is treated as the kill rung treats one: the driver's Xid naming
/// it in the kernel log has it checkpointed again, its device seen empty, then ended. A record
/// that user space wrote (facility LOG_USER) and an Xid that is not a context fault change
/// nothing: the one fault handled is the kernel's.
#[test]
fn a_restored_process_whose_context_faults_is_checkpointed_again_and_its_device_empty_before_it_ends()
 {
    needs_root!("a_restored_process_whose_context_faults_is_checkpointed_again");
    let (_cg, p, sc, agent) = suspended_then_resumed("rk-xid", json!({}));
    let pid = p.pid();
    // Within its quota: no step of the ladder asks for anything.
    xid(&sc, 11, 13, pid); // forged from user space
    xid(&sc, 3, 63, pid); // a row remapping: not a context fault
    xid(&sc, 3, 31, pid); // the driver's MMU fault report
    killed_quiesced(&sc, &agent, pid);
    let log = agent.log();
    assert_eq!(
        log.matches("its restored context faulted (Xid").count(),
        1,
        "the kernel's report alone, and once\n{log}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("its restored context faulted"))
        .unwrap();
    assert!(line.contains("(Xid 31)"), "the kernel's own report: {line}");
    let metrics = agent.get("/metrics").1;
    let killed = "action=\"kill\",result=\"ok\"";
    assert!(
        counter_value(&metrics, "gpushare_enforcement_actions_total", killed) >= 1.0,
        "{metrics}"
    );
}

/// A signal step never ends a process, but one that catches SIGTERM may exit on it: a restored
/// one is not sent the signals that ask a process to end.
#[test]
fn a_signal_step_does_not_send_sigterm_to_a_restored_process_that_would_exit_on_it() {
    needs_root!("a_signal_step_does_not_send_sigterm_to_a_restored_process");
    let cg = crate::util::group("rk-sig");
    let exits_on_term = || {
        let mut c = std::process::Command::new("bash");
        c.arg("-c")
            .arg("trap 'exit 0' TERM; while :; do sleep 0.05; done")
            .stdin(std::process::Stdio::null());
        c
    };
    let p = Reaped(cg.spawn(&mut exits_on_term()).unwrap());
    let pid = p.pid();
    let (cg, p, sc, agent) = resumed(cg, p, json!({}));
    let signal =
        "[defaults]\ngrace = \"0s\"\nladder = [ { action = \"signal\", signal = \"SIGTERM\" } ]\n";
    agent.write_quotas(&format!("{signal}{}", cgroup_quota(&cg, "2GiB")));
    wait_until(
        WAIT,
        || agent.log(),
        || {
            ended(pid)
                || agent
                    .log()
                    .lines()
                    .any(|l| l.contains("not signalling") && l.contains(&pid.to_string()))
        },
    );
    assert_eq!(hangs(&sc), Vec::new(), "host hang (#53)");
    assert!(!ended(pid), "it exited on SIGTERM\n{}", agent.log());
    drop(p);
}

#[test]
fn a_restored_process_whose_checkpoint_fails_is_not_killed_but_left_frozen_with_the_reason() {
    needs_root!("a_restored_process_whose_checkpoint_fails_is_not_killed");
    let (cg, p, sc, agent) = suspended_then_resumed("rk-refuse", json!({}));
    let pid = p.pid();
    // The driver now refuses to checkpoint it (UVM memory, say).
    sc.write(&scenario(
        &[(pid, 6 * GIB)],
        json!({ "processes": { pid.to_string(): { "checkpoint_error": { "code": 801 } } } }),
    ))
    .unwrap();
    agent.write_quotas(&format!("{KILL}{}", cgroup_quota(&cg, "2GiB")));
    wait_until(
        WAIT,
        || agent.log(),
        || agent.log().contains("cuda-checkpoint #53"),
    );
    assert!(cg.wait_frozen(true), "left frozen\n{}", agent.log());
    assert!(!ended(pid), "not killed\n{}", agent.log());
    assert_eq!(hangs(&sc), Vec::new());
    let metrics = agent.get("/metrics").1;
    let refused = "action=\"kill\",result=\"refused\"";
    assert!(
        counter_value(&metrics, "gpushare_enforcement_actions_total", refused) >= 1.0,
        "{metrics}"
    );
    let log = agent.log();
    let line = log
        .lines()
        .find(|l| l.contains("not killing") && l.contains("cuda-checkpoint #53"))
        .unwrap_or_else(|| panic!("no refusal logged\n{log}"));
    assert!(line.contains("checkpoint"), "the reason: {line}");
    assert!(
        line.contains("the kernel reports"),
        "what the kernel says: {line}"
    );
    assert_eq!(cuda_state(&sc, pid), "running", "nothing left locked");
    // The policy repeats the kill: the workload stays frozen, and is not thawed and locked again.
    wait_until(
        std::time::Duration::from_secs(30),
        || agent.log(),
        || agent.log().contains("not tried again"),
    );
    assert!(cg.is_frozen(), "still frozen\n{}", agent.log());
    assert!(!ended(pid));
    assert_eq!(hangs(&sc), Vec::new());
    let log = agent.log();
    let thaws: Vec<&str> = log.lines().filter(|l| l.contains("thawing ")).collect();
    assert!(
        thaws.is_empty(),
        "the policy thawed what the refused kill froze: {thaws:?}"
    );
}

#[test]
fn a_restored_process_whose_memory_stays_after_the_checkpoint_is_restored_not_left_checkpointed() {
    needs_root!("a_restored_process_whose_memory_stays_after_the_checkpoint");
    let (cg, p, sc, agent) = suspended_then_resumed("rk-stays", json!({}));
    let pid = p.pid();
    // The checkpoint now succeeds but NVML still lists the process's memory (what the driver did
    // not move off the GPU): the kill is refused, and the process must not be left checkpointed
    // (locked in every CUDA call, and no suspension recorded that a thaw or `thaw --all` undoes).
    sc.write(&scenario(
        &[(pid, 6 * GIB)],
        json!({ "processes": { pid.to_string(): { "memory_stays": true } } }),
    ))
    .unwrap();
    agent.write_quotas(&format!("{KILL}{}", cgroup_quota(&cg, "2GiB")));
    wait_until(WAIT, || agent.log(), || agent.log().contains("not killing"));
    let log = agent.log();
    let line = log
        .lines()
        .find(|l| l.contains("not killing") && l.contains("still on the GPU"))
        .unwrap_or_else(|| panic!("no refusal for the memory left\n{log}"));
    assert!(line.contains("restored again"), "what was undone: {line}");
    assert!(cg.wait_frozen(true), "left frozen\n{}", agent.log());
    assert!(!ended(pid), "not killed\n{}", agent.log());
    assert_eq!(hangs(&sc), Vec::new());
    assert_eq!(
        cuda_state(&sc, pid),
        "running",
        "restored and unlocked after the refused kill\n{}",
        agent.log()
    );
    // Back under quota: thawed, and its CUDA calls work (nothing stranded).
    agent.write_quotas(&format!("{KILL}{}", cgroup_quota(&cg, "8GiB")));
    agent.wait_for(WAIT, |s| {
        workload(s, &key(&cg), "all").is_some_and(|w| w.state == "ok")
    });
    assert!(cg.wait_frozen(false), "thawed\n{}", agent.log());
    assert_eq!(cuda_state(&sc, pid), "running");
    assert!(!ended(pid));
    assert_eq!(hangs(&sc), Vec::new());
}

#[test]
fn shutdown_leaves_a_restored_process_alive_and_a_later_agents_kill_checkpoints_it_first() {
    needs_root!("shutdown_leaves_a_restored_process_alive");
    let (cg, p) = sleeping_group("rk-stop");
    let pid = p.pid();
    let sc = Scenario::create(&scenario(&[(pid, 6 * GIB)], json!({}))).unwrap();
    let mut agent = start(&sc, &format!("{SUSPEND}{}", cgroup_quota(&cg, "2GiB")));
    agent.wait_state(&key(&cg), "suspended");
    // SIGTERM restores what the agent suspended, and signals nothing.
    assert_eq!(agent.stop(), Some(0));
    assert_eq!(cuda_state(&sc, pid), "running");
    assert!(!ended(pid), "shutdown does not kill");
    assert_eq!(hangs(&sc), Vec::new());
    // The next agent remembers that it was restored (the ledger survives the restart).
    agent.write_quotas(&format!("{KILL}{}", cgroup_quota(&cg, "2GiB")));
    agent.restart();
    killed_quiesced(&sc, &agent, pid);
}

#[test]
fn thaw_all_leaves_a_restored_process_alive_and_a_later_agents_kill_checkpoints_it_first() {
    needs_root!("thaw_all_leaves_a_restored_process_alive");
    let (cg, p) = sleeping_group("rk-thaw");
    let pid = p.pid();
    let sc = Scenario::create(&scenario(&[(pid, 6 * GIB)], json!({}))).unwrap();
    let mut agent = start(&sc, &format!("{SUSPEND}{}", cgroup_quota(&cg, "2GiB")));
    agent.wait_state(&key(&cg), "suspended");
    agent.sigkill();
    let (code, text) = thaw_all(&agent.dir, &sc, true, &[]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(cuda_state(&sc, pid), "running", "{text}");
    assert!(!ended(pid), "thaw --all does not kill");
    assert_eq!(hangs(&sc), Vec::new());
    agent.write_quotas(&format!("{KILL}{}", cgroup_quota(&cg, "2GiB")));
    agent.restart();
    killed_quiesced(&sc, &agent, pid);
}
