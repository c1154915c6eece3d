//! The words reports use ([`WorkloadState::reported`], [`WorkloadState::reported_scope`],
//! [`WorkloadState::worst`]), what the executors report back ([`fold_reports`]) and the retry
//! backoff, pinned case by case.

use std::time::Duration;

use super::super::*;
use crate::quota::Mode;

const LADDER: [Status; 7] = [
    Status::Ok,
    Status::OverQuota,
    Status::Alerted,
    Status::Signalled,
    Status::Frozen,
    Status::Suspended,
    Status::Killed,
];

fn scope_state(status: Status) -> ScopeState {
    ScopeState {
        status,
        over_since: None,
        steps_taken: 0,
        usage: None,
        limit: 1,
        mode: Mode::Strict,
        without_suspend: Status::Alerted,
        compliant_since: None,
    }
}

/// A workload with these liabilities and nothing else going on.
fn ws(scopes: &[(GpuScope, Status)]) -> WorkloadState {
    WorkloadState {
        cgroup_path: "/docker/w".into(),
        quota: String::new(),
        frozen: None,
        scopes: scopes
            .iter()
            .map(|(s, st)| (*s, scope_state(*st)))
            .collect(),
        killing: None,
        retry: None,
        observed: None,
        ours: false,
        suspended: None,
        suspend_failed: None,
        suspension: None,
        waiting_for_room: None,
    }
}

fn killing() -> Killing {
    Killing {
        scope: GpuScope::All,
        since: Duration::ZERO,
        signal: crate::quota::Signal::KILL,
        sigkill_at: None,
    }
}

fn retry(kind: ActionKind) -> Option<Retry> {
    Some(Retry {
        transition: kind,
        attempts: 2,
        next_at: Duration::from_secs(5),
    })
}

fn per_gpu() -> BTreeMap<u32, u64> {
    [(0, 7)].into()
}

/// Both ways: in a dry run and not.
fn both(w: &WorkloadState) -> (Status, Status) {
    (w.reported(false), w.reported(true))
}

#[test]
fn status_names_are_todays_words() {
    let names: Vec<&str> = LADDER
        .into_iter()
        .chain([
            Status::Freezing,
            Status::Suspending,
            Status::Resuming,
            Status::Killing,
        ])
        .map(Status::as_str)
        .collect();
    assert_eq!(
        names,
        [
            "ok",
            "over_quota",
            "alerted",
            "signalled",
            "frozen",
            "suspended",
            "killed",
            "freezing",
            "suspending",
            "resuming",
            "killing"
        ]
    );
    assert_eq!(Status::OverQuota.to_string(), "over_quota");
    assert!(Status::Frozen == "frozen" && Status::Frozen != "freezing");
}

#[test]
fn worst_is_the_furthest_ladder_position() {
    assert_eq!(ws(&[]).worst(), Status::Ok);
    for (i, lo) in LADDER.iter().enumerate() {
        assert_eq!(ws(&[(GpuScope::All, *lo)]).worst(), *lo);
        for hi in &LADDER[i..] {
            let w = ws(&[(GpuScope::All, *lo), (GpuScope::Gpu(0), *hi)]);
            assert_eq!(w.worst(), *hi, "{lo:?} and {hi:?}");
            let w = ws(&[(GpuScope::All, *hi), (GpuScope::Gpu(0), *lo)]);
            assert_eq!(w.worst(), *hi, "{hi:?} and {lo:?}");
        }
    }
}

#[test]
fn reported_puts_killing_then_the_suspension_first() {
    let mut w = ws(&[(GpuScope::All, Status::Alerted)]);
    w.killing = Some(killing());
    w.suspension = Some(Suspension::Suspended { per_gpu: per_gpu() });
    w.frozen = Some(GpuScope::All);
    assert_eq!(both(&w), (Status::Killing, Status::WouldKill));
    w.killing = None;
    assert_eq!(both(&w), (Status::Suspended, Status::Suspended));
    w.suspension = Some(Suspension::InProgress {
        resuming: true,
        per_gpu: per_gpu(),
    });
    assert_eq!(both(&w), (Status::Resuming, Status::Resuming));
    w.suspension = Some(Suspension::InProgress {
        resuming: false,
        per_gpu: per_gpu(),
    });
    assert_eq!(both(&w), (Status::Suspending, Status::Suspending));
    // A failed suspension says nothing: the rest decides.
    w.suspension = Some(Suspension::Failed {
        cause: "error".into(),
        reason: "x".into(),
    });
    w.frozen = None;
    assert_eq!(both(&w), (Status::Alerted, Status::Alerted));
    // A suspend wanted, none observed yet.
    w.suspended = Some(GpuScope::All);
    assert_eq!(both(&w), (Status::Suspending, Status::WouldSuspend));
}

#[test]
fn reported_frozen_only_when_the_kernel_says_so_and_a_dry_run_says_what_it_would_do() {
    let base = ws(&[(GpuScope::All, Status::Signalled)]);
    let with = |observed: Option<GroupState>, ours: bool, frozen: bool| {
        let mut w = base.clone();
        w.observed = observed;
        w.ours = ours;
        w.frozen = frozen.then_some(GpuScope::All);
        both(&w)
    };
    use GroupState::*;
    use Status as S;
    let cases = [
        // (observed, ours, wanted frozen) -> (reported, reported in a dry run)
        ((Some(Frozen), true, false), (S::Frozen, S::Frozen)),
        ((Some(Frozen), false, true), (S::Frozen, S::Frozen)),
        ((Some(Frozen), false, false), (S::Signalled, S::WouldSignal)),
        ((Some(Freezing), false, true), (S::Freezing, S::Freezing)),
        ((Some(Freezing), true, false), (S::Freezing, S::Freezing)),
        (
            (Some(Freezing), false, false),
            (S::Signalled, S::WouldSignal),
        ),
        ((Some(Thawed), true, true), (S::Freezing, S::WouldFreeze)),
        ((Some(Thawed), true, false), (S::Signalled, S::WouldSignal)),
        ((None, false, true), (S::Freezing, S::WouldFreeze)),
        ((Some(Gone), false, false), (S::Signalled, S::WouldSignal)),
    ];
    for ((observed, ours, frozen), want) in cases {
        assert_eq!(
            with(observed, ours, frozen),
            want,
            "observed {observed:?}, ours {ours}, frozen {frozen}"
        );
    }
}

#[test]
fn reported_scope_shows_whole_workload_states_on_every_row() {
    let mut w = ws(&[
        (GpuScope::All, Status::Alerted),
        (GpuScope::Gpu(0), Status::Ok),
    ]);
    w.killing = Some(killing());
    assert_eq!(w.reported_scope(GpuScope::Gpu(0), false), Status::Killing);
    w.killing = None;
    w.suspension = Some(Suspension::Suspended { per_gpu: per_gpu() });
    assert_eq!(w.reported_scope(GpuScope::Gpu(0), false), Status::Suspended);
    w.suspension = Some(Suspension::InProgress {
        resuming: true,
        per_gpu: per_gpu(),
    });
    assert_eq!(w.reported_scope(GpuScope::Gpu(0), false), Status::Resuming);
    w.suspension = Some(Suspension::InProgress {
        resuming: false,
        per_gpu: per_gpu(),
    });
    assert_eq!(
        w.reported_scope(GpuScope::Gpu(0), false),
        Status::Suspending
    );
    w.suspension = None;
    w.frozen = Some(GpuScope::All);
    assert_eq!(w.reported_scope(GpuScope::Gpu(0), false), Status::Freezing);
    assert_eq!(
        w.reported_scope(GpuScope::Gpu(0), true),
        Status::WouldFreeze
    );
    w.frozen = None;
    // Otherwise each row has its own position (in a dry run, what it would have done).
    assert_eq!(w.reported_scope(GpuScope::Gpu(0), false), Status::Ok);
    assert_eq!(w.reported_scope(GpuScope::All, false), Status::Alerted);
    w.scopes.get_mut(&GpuScope::Gpu(0)).unwrap().status = Status::Signalled;
    assert_eq!(w.reported_scope(GpuScope::Gpu(0), false), Status::Signalled);
    assert_eq!(
        w.reported_scope(GpuScope::Gpu(0), true),
        Status::WouldSignal
    );
    w.scopes.get_mut(&GpuScope::Gpu(0)).unwrap().status = Status::Ok;
    // A row without a liability shows the workload's.
    assert_eq!(w.reported_scope(GpuScope::Gpu(1), false), Status::Alerted);
}

#[test]
fn reported_scope_of_a_frozen_suspended_or_killed_liability_is_the_workloads() {
    for own in [Status::Frozen, Status::Suspended] {
        let w = ws(&[(GpuScope::All, own), (GpuScope::Gpu(0), Status::Killed)]);
        assert_eq!(w.reported(false), Status::Killed);
        assert_eq!(w.reported_scope(GpuScope::All, false), Status::Killed);
    }
    let w = ws(&[
        (GpuScope::All, Status::Killed),
        (GpuScope::Gpu(0), Status::Alerted),
    ]);
    assert_eq!(w.reported_scope(GpuScope::All, false), Status::Killed);
    assert_eq!(w.reported_scope(GpuScope::Gpu(0), false), Status::Alerted);
    let w = ws(&[
        (GpuScope::All, Status::Ok),
        (GpuScope::Gpu(0), Status::OverQuota),
    ]);
    assert_eq!(w.reported_scope(GpuScope::All, false), Status::Ok);
    assert_eq!(w.reported_scope(GpuScope::Gpu(0), false), Status::OverQuota);
}

fn state_with(w: WorkloadState) -> PolicyState {
    PolicyState {
        workloads: [("w".to_string(), w)].into(),
    }
}

fn done(kind: ActionKind) -> Report {
    Report::Done {
        workload: "w".into(),
        kind,
    }
}

fn refused() -> Report {
    Report::SuspendRefused {
        workload: "w".into(),
        cause: "unavailable".into(),
        reason: "no libcuda".into(),
    }
}

#[test]
fn a_freeze_done_is_what_the_kernel_says_and_ends_its_retry_only() {
    let mut w = ws(&[(GpuScope::All, Status::Frozen)]);
    w.frozen = Some(GpuScope::All);
    w.observed = Some(GroupState::Thawed);
    w.retry = retry(ActionKind::Freeze);
    let s = fold_reports(state_with(w.clone()), &[done(ActionKind::Freeze)]);
    let got = &s.workloads["w"];
    assert_eq!(got.observed, Some(GroupState::Frozen));
    assert!(got.ours);
    assert_eq!(got.retry, None);
    // A retry of another transition is kept.
    w.retry = retry(ActionKind::Thaw);
    let s = fold_reports(state_with(w), &[done(ActionKind::Freeze)]);
    assert_eq!(s.workloads["w"].retry, retry(ActionKind::Thaw));
}

/// A kill refused for a restored process (cuda-checkpoint #53) froze the workload instead: the
/// kill step holds it frozen (the policy would thaw a freeze it does not want); without a kill
/// in progress the report changes nothing.
#[test]
fn a_kill_refused_for_a_restored_process_is_held_frozen_by_the_kill_step() {
    let refused = Report::KillRefused {
        workload: "w".into(),
    };
    let mut w = ws(&[(GpuScope::All, Status::Killed)]);
    w.killing = Some(killing());
    let s = fold_reports(state_with(w.clone()), std::slice::from_ref(&refused));
    assert_eq!(s.workloads["w"].frozen, Some(killing().scope));
    let idle = ws(&[(GpuScope::All, Status::Ok)]);
    let s = fold_reports(state_with(idle.clone()), &[refused]);
    assert_eq!(s.workloads["w"], idle);
}

#[test]
fn a_thaw_done_drops_a_workload_with_nothing_left_to_carry() {
    let mut w = ws(&[]);
    w.observed = Some(GroupState::Frozen);
    w.ours = true;
    w.retry = retry(ActionKind::Thaw);
    let s = fold_reports(state_with(w.clone()), &[done(ActionKind::Thaw)]);
    assert!(s.workloads.is_empty());
    // Kept while it has liabilities, a wanted freeze or a kill in progress.
    let mut keeps = vec![ws(&[(GpuScope::All, Status::Ok)])];
    keeps.push(WorkloadState {
        frozen: Some(GpuScope::All),
        ..w.clone()
    });
    keeps.push(WorkloadState {
        killing: Some(killing()),
        ..w.clone()
    });
    for k in keeps {
        let s = fold_reports(state_with(k), &[done(ActionKind::Thaw)]);
        let got = &s.workloads["w"];
        assert_eq!(got.observed, Some(GroupState::Thawed));
        assert!(!got.ours);
    }
    let mut thawed_retry = ws(&[(GpuScope::All, Status::Ok)]);
    thawed_retry.retry = retry(ActionKind::Thaw);
    let s = fold_reports(state_with(thawed_retry), &[done(ActionKind::Thaw)]);
    assert_eq!(s.workloads["w"].retry, None);
    // A freeze done keeps even an empty workload: the group is the agent's now.
    let s = fold_reports(state_with(ws(&[])), &[done(ActionKind::Freeze)]);
    assert!(s.workloads["w"].ours);
}

#[test]
fn other_reports_change_only_their_own_retry() {
    let mut w = ws(&[(GpuScope::All, Status::Suspended)]);
    w.observed = Some(GroupState::Frozen);
    w.ours = true;
    w.retry = retry(ActionKind::Resume);
    let s = fold_reports(state_with(w.clone()), &[done(ActionKind::Resume)]);
    let got = &s.workloads["w"];
    assert_eq!(got.retry, None);
    assert_eq!(got.observed, Some(GroupState::Frozen));
    assert!(got.ours);
    let s = fold_reports(state_with(w.clone()), &[done(ActionKind::Alert)]);
    assert_eq!(s.workloads["w"], w);
    // Reports about a workload the state does not carry change nothing.
    let empty = fold_reports(
        PolicyState::default(),
        &[done(ActionKind::Freeze), refused()],
    );
    assert_eq!(empty, PolicyState::default());
}

#[test]
fn reports_fold_in_order() {
    let w = ws(&[(GpuScope::All, Status::Frozen)]);
    let s = fold_reports(
        state_with(w.clone()),
        &[done(ActionKind::Freeze), done(ActionKind::Thaw)],
    );
    assert_eq!(s.workloads["w"].observed, Some(GroupState::Thawed));
    let s = fold_reports(
        state_with(w),
        &[done(ActionKind::Thaw), done(ActionKind::Freeze)],
    );
    assert_eq!(s.workloads["w"].observed, Some(GroupState::Frozen));
}

#[test]
fn a_suspend_refused_falls_through_to_the_step_before_it() {
    let mut w = ws(&[
        (GpuScope::All, Status::Suspended),
        (GpuScope::Gpu(0), Status::Signalled),
    ]);
    w.suspended = Some(GpuScope::All);
    w.suspension = Some(Suspension::InProgress {
        resuming: false,
        per_gpu: per_gpu(),
    });
    w.retry = retry(ActionKind::Suspend);
    let s = fold_reports(state_with(w.clone()), &[refused()]);
    let got = &s.workloads["w"];
    assert_eq!(got.suspended, None);
    assert_eq!(
        got.suspend_failed.as_deref(),
        Some("unavailable: no libcuda")
    );
    assert_eq!(got.suspension, None);
    assert_eq!(got.retry, None);
    assert_eq!(got.scopes[&GpuScope::All].status, Status::Alerted);
    assert_eq!(got.scopes[&GpuScope::Gpu(0)].status, Status::Signalled);
    // A retry of another transition is kept.
    w.retry = retry(ActionKind::Freeze);
    let s = fold_reports(state_with(w), &[refused()]);
    assert_eq!(s.workloads["w"].retry, retry(ActionKind::Freeze));
}

#[test]
fn retries_back_off_doubling_to_the_maximum() {
    let delays: Vec<Duration> = [0, 1, 2, 3, 4, 6, 7, 17, 40, u32::MAX]
        .into_iter()
        .map(reconcile::backoff)
        .collect();
    let s = Duration::from_secs;
    assert_eq!(
        delays,
        [
            s(1),
            s(1),
            s(2),
            s(4),
            s(8),
            s(32),
            RETRY_MAX,
            RETRY_MAX,
            RETRY_MAX,
            RETRY_MAX
        ]
    );
    assert_eq!(RETRY_BASE, s(1));
    assert_eq!(RETRY_MAX, s(60));
}

/// The ledger stores the scope that froze a group as its label; reading it back gives the same
/// scope, and a label that is neither `all` nor an index gives none (the record then says nothing
/// about its scope).
#[test]
fn a_scope_reads_back_from_its_label() {
    for scope in [GpuScope::All, GpuScope::Gpu(0), GpuScope::Gpu(7)] {
        assert_eq!(GpuScope::from_label(&scope.label()), Some(scope));
    }
    assert_eq!(GpuScope::from_label("gpu0"), None);
    assert_eq!(GpuScope::from_label(""), None);
}

/// Issue 41: a dry run never reports a state that only an action could cause, at any ladder
/// position, with any transition wanted, where the kernel says nothing of the group.
#[test]
fn a_dry_run_never_reports_a_state_only_an_action_could_cause() {
    let acted = [
        Status::Signalled,
        Status::Frozen,
        Status::Freezing,
        Status::Suspended,
        Status::Suspending,
        Status::Resuming,
        Status::Killed,
        Status::Killing,
    ];
    for own in LADDER {
        for other in LADDER {
            for bits in 0..8u8 {
                let mut w = ws(&[(GpuScope::All, own), (GpuScope::Gpu(0), other)]);
                w.frozen = (bits & 1 != 0).then_some(GpuScope::All);
                w.suspended = (bits & 2 != 0).then_some(GpuScope::All);
                w.killing = (bits & 4 != 0).then(killing);
                for s in [
                    w.reported(true),
                    w.reported_scope(GpuScope::All, true),
                    w.reported_scope(GpuScope::Gpu(0), true),
                    w.reported_scope(GpuScope::Gpu(1), true),
                ] {
                    assert!(
                        !acted.contains(&s),
                        "{s:?} for {own:?}, {other:?}, {bits:03b}"
                    );
                }
                // And where it acted for real, the same position reads what it is.
                if bits == 1 {
                    assert_eq!(w.reported(false), Status::Freezing);
                    assert_eq!(w.reported(true), Status::WouldFreeze);
                }
            }
        }
    }
}
