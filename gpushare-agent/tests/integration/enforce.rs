//! Enforcement primitives on the real kernel: cgroup v2 freeze/thaw with the ledger, pidfd signals
//! that refuse reused pids, cgroup.kill, and the groups that must never be touched.

use std::time::{Duration, Instant};

use gpushare_agent::{
    attribution::{ProcessIdentity, cgroupfs, procinfo},
    enforce::{Enforcer, Outcome, Target, To},
    policy::{GpuScope, GroupState},
};
use gpushare_testkit::{FakeGpuProcess, unique};

use crate::util::V1Group;
use crate::util::{group, needs_root};

/// An executor's state directory under the temporary directory, removed when dropped (unless
/// the test is failing, to leave it for a look).
struct StateDir(std::path::PathBuf);

impl StateDir {
    fn new() -> Self {
        Self(std::env::temp_dir().join(unique("gpushare-state")))
    }
}

impl std::ops::Deref for StateDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            std::fs::remove_dir_all(&self.0).unwrap();
        }
    }
}

fn enforcer(dry_run: bool) -> (Enforcer, StateDir) {
    let state = StateDir::new();
    let root = cgroupfs::find_cgroup2_mount().unwrap();
    (Enforcer::new(root, &state, dry_run).unwrap(), state)
}

/// An executor, its state directory, a test cgroup, the fake GPU process in it and its identity.
type Enforced = (
    Enforcer,
    StateDir,
    gpushare_testkit::TestCgroup,
    FakeGpuProcess,
    ProcessIdentity,
);

/// An executor (see [`enforcer`]) and a fake GPU process, with its identity, in a test cgroup
/// named after `name`.
fn enforced(dry_run: bool, name: &str) -> Enforced {
    let (enf, state) = enforcer(dry_run);
    let cg = group(name);
    let p = FakeGpuProcess::spawn(Some(&cg), &[], &[]).unwrap();
    let id = procinfo::snapshot(p.pid()).unwrap().identity;
    (enf, state, cg, p, id)
}

/// [`enforced`] (not a dry run) with the group frozen, settled, as workload `w://<name>`.
fn frozen(name: &str) -> Enforced {
    let (mut enf, state, cg, p, id) = enforced(false, name);
    let key = format!("w://{name}");
    assert_eq!(
        freeze_settled(&mut enf, &key, cg.rel_path(), GpuScope::All, None),
        Outcome::Ok
    );
    (enf, state, cg, p, id)
}

/// The outcome of a freeze once the kernel settled it: a freeze is `pending` until every task of
/// the group has stopped, which the executor does not wait for; the test does, up to 5 s.
fn settled(enf: &mut Enforcer, o: Outcome) -> Outcome {
    if o != Outcome::Pending {
        return o;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while enf.has_pending() && Instant::now() < deadline {
        enf.settle();
        std::thread::sleep(Duration::from_millis(5));
    }
    if enf.has_pending() {
        Outcome::Pending
    } else {
        Outcome::Ok
    }
}

/// `enf.freeze(...)` of the group `rel` now (reason "test"), then [`settled`].
fn freeze_settled(
    enf: &mut Enforcer,
    key: &str,
    rel: &str,
    scope: GpuScope,
    pid: Option<u32>,
) -> Outcome {
    let o = enf.freeze(key, rel, scope, pid, "test", Instant::now());
    settled(enf, o)
}

fn wait_exit(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        // Reaped by the fixture's Drop only; a zombie has state Z.
        match procfs::process::Process::new(pid as i32).and_then(|p| p.stat()) {
            Ok(s) if s.state != 'Z' => std::thread::sleep(Duration::from_millis(10)),
            _ => return true,
        }
    }
    false
}

#[test]
fn freeze_is_recorded_before_it_happens_and_thaw_only_undoes_our_own() {
    needs_root!("freeze_is_recorded");
    let (mut enf, _state) = enforcer(false);
    let ours = group("ours");
    let theirs = group("theirs");
    let _p1 = FakeGpuProcess::spawn(Some(&ours), &[], &[]).unwrap();
    let _p2 = FakeGpuProcess::spawn(Some(&theirs), &[], &[]).unwrap();

    assert_eq!(
        freeze_settled(&mut enf, "w://ours", ours.rel_path(), GpuScope::All, None),
        Outcome::Ok
    );
    assert!(ours.is_frozen(), "kernel reports the group frozen");
    assert!(
        enf.record(ours.dir()).is_some(),
        "the freeze is in the ledger"
    );
    let on_disk = std::fs::read_to_string(enf.ledger_path().unwrap()).unwrap();
    assert!(on_disk.contains(ours.dir().to_str().unwrap()));
    assert_eq!(
        enf.freeze(
            "w://ours",
            ours.rel_path(),
            GpuScope::All,
            None,
            "again",
            Instant::now()
        ),
        Outcome::Noop,
        "idempotent"
    );

    // Someone else (docker pause, an operator) froze the other group: the agent leaves it.
    std::fs::write(theirs.dir().join("cgroup.freeze"), "1").unwrap();
    assert_eq!(
        enf.freeze(
            "w://theirs",
            theirs.rel_path(),
            GpuScope::All,
            None,
            "test",
            Instant::now()
        ),
        Outcome::Noop
    );
    assert_eq!(enf.thaw("w://theirs", Instant::now()), Outcome::Noop);
    assert!(
        theirs.wait_frozen(true),
        "a freeze the agent did not make is never undone"
    );

    assert_eq!(enf.thaw("w://ours", Instant::now()), Outcome::Ok);
    assert!(!ours.is_frozen());
    assert!(enf.record(ours.dir()).is_none());
}

#[test]
fn a_restarted_enforcer_observes_its_earlier_freezes_as_its_own_and_thaws_them_on_request() {
    needs_root!("restarted_enforcer");
    let state = StateDir::new();
    let root = cgroupfs::find_cgroup2_mount().unwrap();
    let keep = group("keep");
    let release = group("release");
    let _a = FakeGpuProcess::spawn(Some(&keep), &[], &[]).unwrap();
    let _b = FakeGpuProcess::spawn(Some(&release), &[], &[]).unwrap();
    {
        let mut enf = Enforcer::new(root.clone(), &state, false).unwrap();
        assert_eq!(
            freeze_settled(&mut enf, "w://keep", keep.rel_path(), GpuScope::All, None),
            Outcome::Ok
        );
        assert_eq!(
            freeze_settled(
                &mut enf,
                "w://release",
                release.rel_path(),
                GpuScope::Gpu(1),
                None
            ),
            Outcome::Ok
        );
        // The agent dies here without thawing (as with SIGKILL).
    }
    let mut enf = Enforcer::new(root, &state, false).unwrap();
    let seen = enf.observe([]);
    assert_eq!(seen.len(), 2, "{seen:?}");
    for (k, scope) in [
        ("w://keep", GpuScope::All),
        ("w://release", GpuScope::Gpu(1)),
    ] {
        let o = &seen[k];
        assert!(o.ours && o.state == GroupState::Frozen, "{k}: {o:?}");
        assert_eq!(
            o.frozen_by,
            Some(scope),
            "the scope that froze it is recorded"
        );
    }
    assert_eq!(enf.thaw("w://release", Instant::now()), Outcome::Ok);
    assert!(keep.is_frozen());
    assert!(!release.is_frozen());
    assert_eq!(enf.thaw_all(&mut |_| Ok(())).thawed.len(), 1);
    assert!(!keep.is_frozen());
    assert!(enf.records().is_empty());
}

#[test]
fn a_group_removed_while_frozen_leaves_no_record() {
    needs_root!("group_removed_while_frozen");
    let (mut enf, _state, cg, p, _) = frozen("gone");
    let dir = cg.dir().to_path_buf();
    drop(p);
    drop(cg); // kills, thaws, removes the directory
    assert!(!dir.exists());
    let seen = enf.observe([]);
    assert_eq!(seen["w://gone"].state, GroupState::Gone);
    assert!(!seen["w://gone"].ours);
    assert!(
        enf.record(&dir).is_none(),
        "the record of a gone group is dropped"
    );
    assert!(enf.observe([]).is_empty());
}

#[test]
fn signals_reach_verified_processes_and_never_a_reused_pid() {
    needs_root!("signals_reach_verified");
    let (enf, _state) = enforcer(false);
    let victim = FakeGpuProcess::spawn(None, &[], &[]).unwrap();
    let id = procinfo::snapshot(victim.pid()).unwrap().identity;
    // Same pid, other start time: what a reused pid looks like. Must not be signalled.
    let impostor = ProcessIdentity {
        pid: id.pid,
        start_ticks: id.start_ticks.wrapping_sub(1),
    };
    let r = enf.signal("w://x", &[impostor.into()], libc::SIGTERM, To::Every);
    assert_eq!(r, vec![(impostor, Outcome::Refused)]);
    assert!(
        procinfo::is_same_process(id),
        "the real process is untouched"
    );
    let r = enf.signal("w://x", &[id.into()], libc::SIGTERM, To::Every);
    assert_eq!(r, vec![(id, Outcome::Ok)]);
    assert!(wait_exit(id.pid), "SIGTERM delivered");
    drop(victim);
    // Gone: a no-op, not an error.
    assert_eq!(
        enf.signal("w://x", &[id.into()], libc::SIGTERM, To::Every),
        vec![(id, Outcome::Noop)]
    );
}

#[test]
fn dry_run_reports_and_touches_nothing() {
    needs_root!("dry_run_reports");
    let (mut enf, _state, cg, _p, id) = enforced(true, "dry");
    assert_eq!(
        enf.freeze(
            "w://dry",
            cg.rel_path(),
            GpuScope::All,
            None,
            "t",
            Instant::now()
        ),
        Outcome::DryRun
    );
    assert_eq!(
        enf.signal("w://dry", &[id.into()], libc::SIGKILL, To::Every),
        vec![(id, Outcome::DryRun)]
    );
    assert_eq!(
        enf.kill("w://dry", cg.rel_path(), &[Target::from(id)], &mut no_nvml),
        Outcome::DryRun
    );
    assert!(!cg.is_frozen());
    assert!(procinfo::is_same_process(id));
    assert!(enf.records().is_empty());
}

#[test]
fn kill_uses_cgroup_kill_even_on_a_frozen_group_and_the_agents_own_groups_are_refused() {
    needs_root!("kill_uses_cgroup_kill");
    let (mut enf, _state, cg, _p, id) = frozen("kill");
    assert_eq!(
        enf.kill("w://kill", cg.rel_path(), &[Target::from(id)], &mut no_nvml),
        Outcome::Ok
    );
    assert!(wait_exit(id.pid), "killed while frozen");
    // The empty group is still the agent's freeze until it is thawed (the next step does that).
    assert!(enf.record(cg.dir()).is_some());
    assert_eq!(enf.thaw("w://kill", Instant::now()), Outcome::Ok);
    assert!(enf.record(cg.dir()).is_none());

    let own = cgroupfs::cgroup_path_of_pid(std::process::id()).unwrap();
    assert_eq!(
        enf.freeze("w://me", &own, GpuScope::All, None, "t", Instant::now()),
        Outcome::Refused
    );
    assert_eq!(enf.kill("w://me", "/", &[], &mut no_nvml), Outcome::Refused);
    if own != "/" {
        let parent = own
            .rsplit_once('/')
            .map(|(p, _)| if p.is_empty() { "/" } else { p })
            .unwrap();
        assert_eq!(
            enf.freeze(
                "w://parent",
                parent,
                GpuScope::All,
                None,
                "t",
                Instant::now()
            ),
            Outcome::Refused
        );
    }
}

#[test]
fn a_group_frozen_by_the_v1_freezer_is_someone_elses_and_is_left_alone_at_once() {
    needs_root!("v1_frozen_group");
    let (mut enf, _state, cg, p, _) = enforced(false, "paused");
    // What `docker pause` does on a hybrid host: the v1 freezer.
    let Some(group) = V1Group::create(&unique("gpushare-test-paused")) else {
        gpushare_testkit::loud_skip("no v1 freezer mounted (pure cgroup v2 host)");
        return;
    };
    group.add(p.pid());
    group.set("FROZEN");
    let v1_state = || group.state();
    let t = Instant::now();
    assert_eq!(
        enf.freeze(
            "w://paused",
            cg.rel_path(),
            GpuScope::All,
            Some(p.pid()),
            "t",
            Instant::now()
        ),
        Outcome::Noop
    );
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "no wait for a v2 freeze that cannot complete"
    );
    assert!(
        enf.record(cg.dir()).is_none(),
        "not recorded: not ours to thaw"
    );
    assert_eq!(enf.thaw("w://paused", Instant::now()), Outcome::Noop);
    assert!(
        matches!(v1_state().as_str(), "FROZEN" | "FREEZING"),
        "left as it was: {}",
        v1_state()
    );
    drop(group);
    drop(p);
}

/// The v1 freezer path of the executors. On this hybrid host the agent itself never takes it:
/// every non-root v2 group has `cgroup.freeze` (kernel 5.2+), a workload's root is the v2 path of
/// a live process, and the v2 root (the only group without `cgroup.freeze`) is refused and its
/// `host` workload protected. The executors do take it for a root that has no v2 group, as on a
/// kernel without the v2 freezer: here, a v2 path with no group and a process in a real v1
/// freezer group.
#[test]
fn without_a_v2_freezer_the_v1_freezer_group_is_frozen_recorded_taken_over_thawed_and_killed() {
    use gpushare_agent::enforce::freeze::Freezer;
    needs_root!("the_v1_freezer_path");
    let name = unique("gpushare-test-v1");
    let Some(group) = V1Group::create(&name) else {
        gpushare_testkit::loud_skip("the v1 freezer path: no v1 freezer mounted (pure v2 host)");
        return;
    };
    let (mut enf, state) = enforcer(false);
    let p = FakeGpuProcess::spawn(None, &[], &[]).unwrap();
    group.add(p.pid());
    let id = procinfo::snapshot(p.pid()).unwrap().identity;
    // The workload's root has no v2 group, only a v1 freezer group of that path.
    let rel = format!("/{name}");
    assert!(!enf.v2_dir(&rel).exists());
    let key = format!("cgroup://{rel}");
    // A v1 group that is not the workload's (another path) is never frozen in its place.
    let elsewhere = format!("/{}", unique("gpushare-test-no-v2-group"));
    assert_eq!(
        enf.freeze(
            &format!("cgroup://{elsewhere}"),
            &elsewhere,
            GpuScope::All,
            Some(p.pid()),
            "t",
            Instant::now()
        ),
        Outcome::Failed
    );
    assert_eq!(group.state(), "THAWED");
    // No process to find the v1 group by: nothing to freeze, nothing recorded.
    assert_eq!(
        enf.freeze(&key, &rel, GpuScope::All, None, "t", Instant::now()),
        Outcome::Failed
    );
    assert!(enf.records().is_empty());
    // With one: its v1 freezer group is frozen, and recorded as such first.
    assert_eq!(
        freeze_settled(&mut enf, &key, &rel, GpuScope::All, Some(p.pid())),
        Outcome::Ok
    );
    assert_eq!(group.state(), "FROZEN");
    let rec = enf.record(&group.0).expect("recorded");
    assert_eq!((rec.freezer, rec.workload.as_str()), (Freezer::V1, &*key));
    let seen = enf.observe([]);
    assert!(
        seen[&key].ours && seen[&key].state == GroupState::Frozen,
        "{seen:?}"
    );
    // A restarted enforcer knows the freeze as its own and thaws it.
    drop(enf);
    let mut enf = Enforcer::new(cgroupfs::find_cgroup2_mount().unwrap(), &state, false).unwrap();
    assert!(
        enf.record(&group.0).is_some(),
        "the freeze survives a restart"
    );
    let o = enf.thaw(&key, Instant::now());
    assert!(matches!(o, Outcome::Ok | Outcome::Pending), "{o:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while group.state() != "THAWED" && Instant::now() < deadline {
        enf.settle();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(group.state(), "THAWED");
    assert!(enf.record(&group.0).is_none(), "a thaw drops the record");
    // Killed while v1-frozen: no cgroup.kill there, so SIGKILL to the process and a thaw, without
    // which a v1-frozen task cannot die.
    assert_eq!(
        freeze_settled(&mut enf, &key, &rel, GpuScope::All, Some(p.pid())),
        Outcome::Ok
    );
    assert_eq!(group.state(), "FROZEN");
    assert_eq!(
        enf.kill(&key, &rel, &[Target::from(id)], &mut no_nvml),
        Outcome::Ok
    );
    assert!(wait_exit(id.pid), "killed while v1-frozen");
    assert_eq!(group.state(), "THAWED");
    drop(p);
    drop(group);
}

/// The NVML read a kill asks for only when the workload holds a process restored from a
/// checkpoint (cuda-checkpoint #53), which none of these tests has.
fn no_nvml() -> gpushare_agent::sample::GpuSample {
    panic!("no restored process here: the kill must not read NVML")
}
