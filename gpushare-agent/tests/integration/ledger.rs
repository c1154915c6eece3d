//! The freeze ledger cannot strand a freeze: an unreadable or newer file, a GPU that stays
//! degraded, a dry run, a second agent on the node, an agent that cannot start at all. Each test
//! plays "an earlier run" by writing its ledger (in the format every version since the first
//! reads) and freezing the group as that run would have.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use gpushare_testkit::{TestCgroup, nvml::Scenario, workspace_bin};
use serde_json::json;

use crate::util::needs_root;
use crate::util::{AgentProcess, Reaped, agent_dir, key, one_gpu, sleeping_group};

const GIB: u64 = 1 << 30;
const FREEZE: &str = "[defaults]\ngrace = \"0s\"\nladder = [ { action = \"freeze\" } ]\n";

fn cgroup_quota(cg: &TestCgroup, size: &str, gpu: Option<u32>) -> String {
    let gpu = gpu.map(|g| format!("gpu = {g}\n")).unwrap_or_default();
    format!(
        "\n[[quota]]\ncgroup = \"{}\"\n{gpu}gpu_memory = \"{size}\"\n",
        cg.rel_path()
    )
}

/// A record as the first ledger format wrote it.
fn record(cg: &TestCgroup, reason: &str) -> serde_json::Value {
    json!({
        "workload": key(cg),
        "cgroup_dir": cg.dir(),
        "freezer": "v2",
        "frozen_at_unix": 1_700_000_000u64,
        "reason": reason,
    })
}

/// What an earlier run left: `cg` frozen and `bytes` as its ledger.
fn earlier_run(dir: &Path, frozen: &[&TestCgroup], bytes: &[u8]) {
    std::fs::create_dir_all(dir.join("state")).unwrap();
    std::fs::write(dir.join("state/freezes.json"), bytes).unwrap();
    for cg in frozen {
        std::fs::write(cg.dir().join("cgroup.freeze"), "1").unwrap();
        assert!(cg.wait_frozen(true));
    }
}

/// Two sleeping groups named `names`, each under a 2 GiB quota (on GPU `gpus[k]`, else on all
/// GPUs) with a ladder that freezes at once; and those quotas.
fn two_under_freeze(
    names: [&str; 2],
    gpus: [Option<u32>; 2],
) -> ([(TestCgroup, Reaped); 2], String) {
    let groups = names.map(sleeping_group);
    let quotas = format!(
        "{FREEZE}{}{}",
        cgroup_quota(&groups[0].0, "2GiB", gpus[0]),
        cgroup_quota(&groups[1].0, "2GiB", gpus[1])
    );
    (groups, quotas)
}

fn agent_bin() -> std::path::PathBuf {
    workspace_bin("gpushare-agent")
}

/// Problem 5: one byte that is not UTF-8 (a reason copied from a process name, a disk error)
/// must not stop the agent from starting, and the freezes the file lists are still reconciled.
#[test]
fn a_ledger_with_a_byte_that_is_not_utf8_still_starts_and_reconciles_its_freezes() {
    needs_root!("a_ledger_with_a_byte_that_is_not_utf8");
    let (cg, p) = sleeping_group("ledger-utf8");
    let dir = agent_dir(&format!("{FREEZE}{}", cgroup_quota(&cg, "2GiB", None)));
    let text = json!({ "version": 1, "freezes": [record(&cg, "REASON")] }).to_string();
    let bytes = text.replace("REASON", "over quota \u{1}").into_bytes();
    let bytes: Vec<u8> = bytes
        .into_iter()
        .map(|b| if b == 1 { 0xff } else { b })
        .collect();
    earlier_run(&dir, &[&cg], &bytes);
    let sc = Scenario::create(&one_gpu(&[(p.pid(), GIB)])).unwrap();
    let agent = AgentProcess::start_in(dir, &sc, &[], "200ms");
    assert!(
        cg.wait_frozen(false),
        "within quota now: the earlier freeze must be thawed\n{}",
        agent.log()
    );
}

/// Problem 5: a ledger written by a newer version (fields this one does not know) is read, not
/// moved aside as corrupt: its freezes are reconciled.
#[test]
fn a_ledger_from_a_newer_version_is_read_and_its_freezes_reconciled() {
    needs_root!("a_ledger_from_a_newer_version");
    let ([(thaw, pt), (keep, pk)], quotas) =
        two_under_freeze(["ledger-new-thaw", "ledger-new-keep"], [None, None]);
    let dir = agent_dir(&quotas);
    let mut r1 = record(&thaw, "t");
    r1["checkpointed_bytes"] = json!(123);
    r1["future"] = json!({ "nested": [1, 2] });
    let file = json!({
        "version": 99,
        "written_by": "gpushare 9.9.9",
        "freezes": [r1, record(&keep, "k")],
    });
    earlier_run(&dir, &[&thaw, &keep], file.to_string().as_bytes());
    let sc = Scenario::create(&one_gpu(&[(pt.pid(), GIB), (pk.pid(), 3 * GIB)])).unwrap();
    let agent = AgentProcess::start_in(dir.clone(), &sc, &[], "200ms");
    assert!(
        thaw.wait_frozen(false),
        "within quota: thawed\n{}",
        agent.log()
    );
    agent.wait_state(&key(&keep), "frozen");
    assert!(keep.is_frozen(), "still over quota: kept");
    assert!(
        !dir.join("state/freezes.json.corrupt").exists(),
        "a newer ledger is not corrupt"
    );
}

/// Problem 5: one GPU stays degraded. Reconciliation is per GPU: a freeze on the healthy GPU that
/// no longer applies is thawed, one on the degraded GPU is kept (its usage cannot be known), and
/// `release` knows it.
#[test]
fn reconciliation_is_per_gpu_and_release_knows_the_freezes_of_an_earlier_run() {
    needs_root!("reconciliation_is_per_gpu");
    let ([(on0, p0), (on1, p1)], quotas) =
        two_under_freeze(["ledger-gpu0", "ledger-gpu1"], [Some(0), Some(1)]);
    let dir = agent_dir(&quotas);
    let file = json!({ "version": 1, "freezes": [record(&on0, "a"), record(&on1, "b")] });
    earlier_run(&dir, &[&on0, &on1], file.to_string().as_bytes());
    let sc = Scenario::create(&json!({ "devices": [
        { "uuid": "GPU-l0", "name": "NVIDIA Fake", "memory_total": 80 * GIB,
          "compute_processes": [ { "pid": p0.pid(), "used_memory": GIB } ] },
        { "uuid": "GPU-l1", "name": "NVIDIA Fake", "memory_total": 80 * GIB, "lost": true,
          "compute_processes": [ { "pid": p1.pid(), "used_memory": GIB } ] },
    ]}))
    .unwrap();
    let agent = AgentProcess::start_in(dir, &sc, &[], "200ms");
    assert!(
        on0.wait_frozen(false),
        "GPU 0 is healthy and the workload within quota: thawed although GPU 1 is degraded\n{}",
        agent.log()
    );
    agent.steps_over(Duration::from_secs(1), |_| {});
    assert!(on1.is_frozen(), "its GPU is degraded: kept");
    let (code, body) = agent.post_local(
        "/api/v1/release",
        &json!({ "workload": key(&on1) }).to_string(),
    );
    assert_eq!(code, 200, "release of an earlier run's freeze: {body}");
    assert!(on1.wait_frozen(false), "released: thawed\n{}", agent.log());
}

/// Problem 5: `--dry-run` never writes to a cgroup, also not to re-apply an earlier run's freeze.
#[test]
fn dry_run_does_not_reapply_an_earlier_runs_freeze() {
    needs_root!("dry_run_does_not_reapply");
    let (cg, p) = sleeping_group("ledger-dry");
    let dir = agent_dir(&format!("{FREEZE}{}", cgroup_quota(&cg, "2GiB", None)));
    // The earlier run recorded the freeze and died before applying it.
    let file = json!({ "version": 1, "freezes": [record(&cg, "r")] });
    earlier_run(&dir, &[], file.to_string().as_bytes());
    let before = std::fs::read_to_string(cg.dir().join("cgroup.freeze")).unwrap();
    let sc = Scenario::create(&one_gpu(&[(p.pid(), 3 * GIB)])).unwrap();
    let agent = AgentProcess::start_in(dir, &sc, &["--dry-run"], "200ms");
    agent.wait_used(&key(&cg), 3 * GIB);
    agent.steps_over(Duration::from_secs(1), |_| {});
    assert!(!cg.is_frozen(), "a dry run froze a group\n{}", agent.log());
    assert_eq!(
        std::fs::read_to_string(cg.dir().join("cgroup.freeze")).unwrap(),
        before
    );
    let xattr = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import os; print(os.listxattr({:?}))",
            cg.dir().display()
        ))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&xattr.stdout).trim(),
        "[]",
        "a dry run marked the group"
    );
}

/// Runs a command with a deadline; `None` when it had to be killed.
/// `gpushare-agent thaw --all` on the state directory of the agent directory `dir`, which must
/// end within `limit`.
fn thaw_all(dir: &Path, limit: Duration) -> std::process::Output {
    run_with_deadline(
        Command::new(agent_bin())
            .args(["thaw", "--all", "--state-dir"])
            .arg(dir.join("state")),
        limit,
    )
    .unwrap()
}

fn run_with_deadline(cmd: &mut Command, limit: Duration) -> Option<std::process::Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Problem 5: two agents on one node (a host unit and a DaemonSet pod) would overwrite each
/// other's ledger. The second refuses to start and names the first one's pid; `thaw --all`
/// refuses too while an agent runs.
#[test]
fn a_second_agent_on_the_same_state_directory_refuses_to_start() {
    needs_root!("a_second_agent_refuses");
    let sc = Scenario::create(&one_gpu(&[])).unwrap();
    let first = AgentProcess::start(&sc, "", &[]);
    let pid = first.pid().unwrap();
    let out = run_with_deadline(
        &mut AgentProcess::command_in(&first.dir, &sc, &[]),
        Duration::from_secs(15),
    )
    .expect("the second agent kept running next to the first");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("pid {pid}")) && err.contains("agent.lock"),
        "{err}"
    );
    let out = thaw_all(&first.dir, Duration::from_secs(15));
    assert!(!out.status.success(), "thaw --all next to a running agent");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("pid {pid}")),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Problem 5: the agent was SIGKILLed and its ledger is garbage. A restarted agent rebuilds the
/// list of its freezes from the marks on the cgroups, and `gpushare-agent thaw --all`, with no
/// agent running, undoes every freeze it made and nothing else.
#[test]
fn freezes_survive_a_lost_ledger_and_thaw_all_undoes_them_without_an_agent() {
    needs_root!("thaw_all_without_an_agent");
    let ([(a, pa), (b, pb)], quotas) =
        two_under_freeze(["ledger-lost-a", "ledger-lost-b"], [None, None]);
    let (theirs, _pt) = sleeping_group("ledger-lost-theirs");
    let sc = Scenario::create(&one_gpu(&[(pa.pid(), 3 * GIB), (pb.pid(), 3 * GIB)])).unwrap();
    let mut agent = AgentProcess::start(&sc, &quotas, &[]);
    assert!(a.wait_frozen(true) && b.wait_frozen(true));
    std::fs::write(theirs.dir().join("cgroup.freeze"), "1").unwrap();
    agent.sigkill();
    std::fs::write(agent.ledger(), b"\x00garbage{{{").unwrap();
    // A restart rebuilds the list from the cgroups: `a` is back within quota and thawed, `b` kept.
    sc.write(&one_gpu(&[(pa.pid(), GIB), (pb.pid(), 3 * GIB)]))
        .unwrap();
    agent.restart();
    assert!(
        a.wait_frozen(false),
        "the lost ledger's freeze of a was not found\n{}",
        agent.log()
    );
    agent.wait_state(&key(&b), "frozen");
    // The agent cannot run any more; the operator undoes what it froze.
    agent.sigkill();
    std::fs::write(agent.ledger(), b"garbage").unwrap();
    let out = thaw_all(&agent.dir, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "thaw --all failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(b.wait_frozen(false), "thaw --all left b frozen");
    assert!(
        theirs.is_frozen(),
        "thaw --all thawed a freeze the agent did not make"
    );
    std::fs::write(theirs.dir().join("cgroup.freeze"), "0").unwrap();
}
