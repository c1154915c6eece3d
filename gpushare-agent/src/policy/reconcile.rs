//! Stage 7: reconciliation of what a workload should be with what the kernel reported.
//!
//! **Desired and observed.** The ladder decides what the workload's root group *should* be
//! (frozen or not); [`super::PolicyInput::observed`] says what the kernel reported about it at the start of
//! the step, and whether it is a group the agent froze (a ledger record or a mark on the group, with
//! the same inode). Freeze and Thaw actions come from the difference, level-triggered: a freeze the
//! kernel does not show (it failed, it is still settling, someone thawed the group behind the
//! agent's back) is issued again with backoff ([`RETRY_BASE`] doubling to [`RETRY_MAX`]); a thaw that
//! did not take likewise. A group thawed behind the agent's back while its workload is still liable
//! is re-frozen at once and counted ([`super::Stats::external_thaws`]). A group that is gone, or was
//! recreated under the same path (another inode), is forgotten: the workload's state starts afresh.
//! A suspension is reconciled first: while a suspend or resume runs, or the workload is
//! suspended, it owns the group's freeze.

use std::{collections::BTreeMap, time::Duration};

use super::{
    Cx,
    action::ActionKind,
    input::{GroupState, ObservedGroup, Suspension},
    outcome::Action,
    state::{PolicyState, Retry, WorkloadState},
};

/// First delay before a freeze or thaw that did not take is issued again; it doubles per attempt.
pub const RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest delay between two attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// Delay before attempt `attempts + 1` of a transition.
pub(super) fn backoff(attempts: u32) -> Duration {
    RETRY_BASE
        .saturating_mul(1u32 << attempts.saturating_sub(1).min(16))
        .min(RETRY_MAX)
}

/// Wanted frozen and asked for at the last step, and now neither frozen nor asked to be:
/// someone else wrote the thaw (the agent never does while it wants the group frozen).
pub(super) fn thawed_externally(
    prev: &PolicyState,
    key: &str,
    observed: Option<&ObservedGroup>,
) -> bool {
    observed.is_some_and(|o| o.ours && o.state == GroupState::Thawed)
        && prev.workloads.get(key).is_some_and(|p| {
            p.frozen.is_some() && (p.ours || Retry::of(p.retry, ActionKind::Freeze))
        })
}

/// Issues `a`, the next attempt of `kind`, and schedules the one after with backoff.
fn issue(ws: &mut WorkloadState, now: Duration, kind: ActionKind, mut a: Action) -> Action {
    let attempts = ws
        .retry
        .filter(|r| r.transition == kind)
        .map_or(0, |r| r.attempts)
        + 1;
    a.attempt = attempts;
    if attempts > 1 {
        a.reason = format!("attempt {attempts}: {}", a.reason);
    }
    ws.retry = Some(Retry {
        transition: kind,
        attempts,
        next_at: now + backoff(attempts),
    });
    a
}

/// Compares what the workload's state wants (suspended or not) with its observed suspension, and
/// issues the Suspend or Resume that closes the gap. A suspend is not retried when it fails (it
/// falls through, see [`evaluate`]); a resume is, with backoff. Returns whether the suspension owns
/// the group's freeze at this step (a job runs, the workload is suspended, or a suspend is
/// wanted): the freeze reconciliation then stays out of its way.
pub(super) fn reconcile_suspension(
    cx: &Cx,
    ws: &mut WorkloadState,
    observed: Option<&ObservedGroup>,
    suspend_on: Option<(u64, u64, BTreeMap<u32, u64>)>,
    why: &dyn std::fmt::Display,
    actions: &mut Vec<Action>,
) -> bool {
    let now = cx.input.now;
    ws.suspension = observed
        .and_then(|o| o.suspension.clone())
        .filter(|s| !matches!(s, Suspension::Failed { .. }));
    ws.waiting_for_room = None;
    let due = |ws: &WorkloadState, kind: ActionKind| {
        ws.retry
            .filter(|r| r.transition == kind)
            .is_none_or(|r| now >= r.next_at)
    };
    match (&ws.suspension, ws.suspended) {
        (Some(Suspension::InProgress { .. }), _) => true,
        (Some(Suspension::Suspended { .. }), Some(_)) => {
            if ws
                .retry
                .is_some_and(|r| matches!(r.transition, ActionKind::Suspend | ActionKind::Resume))
            {
                ws.retry = None;
            }
            true
        }
        (Some(Suspension::Suspended { per_gpu }), None) => {
            // The one resume rule (`room`): not before every GPU has room for its share.
            let room = super::room::resume_room(per_gpu, cx.input.sample, |dev| {
                cx.dev_usage.get(&dev).map_or(0, |u| u.listed)
            });
            if let Err(why) = &room {
                ws.waiting_for_room = Some(why.clone());
            }
            if room.is_ok() && due(ws, ActionKind::Resume) {
                let scope = observed
                    .and_then(|o| o.frozen_by)
                    .unwrap_or(super::GpuScope::All);
                let total = per_gpu.values().sum();
                let a = cx.act(
                    scope,
                    ActionKind::Resume,
                    cx.all_targets(),
                    Some(total),
                    None,
                    why.to_string().replace("thawed because", "resumed because"),
                );
                actions.push(issue(ws, now, ActionKind::Resume, a));
            }
            true
        }
        (_, Some(scope)) => {
            if cx.input.dry(cx.key) && Retry::of(ws.retry, ActionKind::Suspend) {
                return true; // reported once
            }
            let Some((usage, limit, footprint)) = suspend_on.filter(|_| !cx.input.observe_only)
            else {
                return false; // unknown data (or observe only): the freeze stays as it is
            };
            if due(ws, ActionKind::Suspend) {
                let mut a = cx.act(
                    scope,
                    ActionKind::Suspend,
                    cx.all_targets(),
                    Some(usage),
                    Some(limit),
                    why.to_string(),
                );
                a.footprint = footprint;
                actions.push(issue(ws, now, ActionKind::Suspend, a));
            }
            true
        }
        (_, None) => false,
    }
}

/// Compares what the workload's state wants (frozen or not) with what the kernel reported, and
/// issues the Freeze or Thaw that closes the gap, with backoff for one that did not take. A freeze
/// is issued only when `freeze_on` carries the holding liability's (usage, limit) (good data).
/// Returns the state to carry, `None` when the workload can be forgotten.
pub(super) fn reconcile(
    cx: &Cx,
    mut ws: WorkloadState,
    observed: Option<&ObservedGroup>,
    freeze_on: Option<Option<(u64, u64)>>,
    why: &dyn std::fmt::Display,
    actions: &mut Vec<Action>,
) -> Option<WorkloadState> {
    let now = cx.input.now;
    let ours = observed.is_some_and(|o| o.ours);
    let state = observed.map(|o| o.state);
    ws.observed = state;
    ws.ours = ours;
    let want_frozen = ws.frozen.is_some();
    let in_kernel_frozen = ours && state == Some(GroupState::Frozen);
    let transition = if want_frozen {
        ActionKind::Freeze
    } else {
        ActionKind::Thaw
    };
    // In a dry run nothing is written: a transition reported once counts as done.
    let dry = cx.input.dry(cx.key);
    let reported = dry && Retry::of(ws.retry, transition);
    let settled = reported || if want_frozen { in_kernel_frozen } else { !ours };
    if settled {
        if !dry {
            ws.retry = None;
        }
        let keep = want_frozen || ours || !ws.scopes.is_empty() || ws.killing.is_some();
        return keep.then_some(ws);
    }
    let retry = ws.retry.filter(|r| r.transition == transition);
    let due = retry.is_none_or(|r| now >= r.next_at);
    let (usage, limit) = if want_frozen {
        let Some(ul) = freeze_on.filter(|_| !cx.input.observe_only) else {
            // Unknown data (or observe only): neither a first freeze nor a retry.
            return Some(ws);
        };
        (ul.map(|u| u.0), ul.map(|u| u.1))
    } else {
        (None, None)
    };
    if due {
        let attempts = retry.map_or(0, |r| r.attempts) + 1;
        let mut reason = why.to_string();
        if attempts > 1 {
            let seen = match state {
                Some(GroupState::Freezing) => "still freezing",
                Some(GroupState::Frozen) => "still frozen",
                _ => "not frozen",
            };
            reason = format!("attempt {attempts} (the kernel says {seen}): {reason}");
        }
        let scope = ws
            .frozen
            .or(observed.and_then(|o| o.frozen_by))
            .unwrap_or(super::GpuScope::All);
        let mut a = cx.act(scope, transition, cx.all_targets(), usage, limit, reason);
        a.attempt = attempts;
        actions.push(a);
        ws.retry = Some(Retry {
            transition,
            // A report is no attempt: taken later (an auditor's opt-in), the first real one is 1.
            attempts: if dry { 0 } else { attempts },
            next_at: now + backoff(attempts),
        });
    }
    Some(ws)
}
