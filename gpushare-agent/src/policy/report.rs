//! What the executors report back, folded into the policy state within the same step (so reports
//! are not a step late): a freeze or thaw the kernel already applied, and a suspend refused at
//! once.

use super::{
    action::ActionKind,
    input::GroupState,
    state::{PolicyState, Retry, Status},
};

/// One executor's report on an action of this step (or a pending one that settled since).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// The kernel applied this freeze or thaw (other kinds change nothing here).
    Done {
        /// Workload key.
        workload: String,
        /// What was done.
        kind: ActionKind,
    },
    /// A suspend the executor refused at once (no driver API, not enough host memory): the
    /// step falls through in this very step.
    SuspendRefused {
        /// Workload key.
        workload: String,
        /// The fall-through's reason, for the metric (e.g. `unavailable`, `host_memory`).
        cause: String,
        /// In words.
        reason: String,
    },
    /// A kill the executor refused because a process of the workload was restored from a
    /// checkpoint and could not be checkpointed again (cuda-checkpoint #53): it froze the
    /// workload instead, which the kill step holds frozen.
    KillRefused {
        /// Workload key.
        workload: String,
    },
}

/// `state` with `reports` folded in, in order.
pub fn fold_reports(mut state: PolicyState, reports: &[Report]) -> PolicyState {
    for r in reports {
        match r {
            Report::Done { workload, kind } => done(&mut state, workload, *kind),
            Report::SuspendRefused {
                workload,
                cause,
                reason,
            } => suspend_refused(&mut state, workload, cause, reason),
            Report::KillRefused { workload } => {
                if let Some(ws) = state.workloads.get_mut(workload)
                    && let Some(k) = ws.killing
                {
                    ws.frozen.get_or_insert(k.scope);
                }
            }
        }
    }
    state
}

/// A freeze or thaw the kernel already applied is what the kernel now says about the group, so
/// reports need not wait for the next step's observation. A workload left with nothing to carry
/// is dropped.
fn done(state: &mut PolicyState, workload: &str, kind: ActionKind) {
    let Some(ws) = state.workloads.get_mut(workload) else {
        return;
    };
    match kind {
        ActionKind::Freeze => {
            ws.observed = Some(GroupState::Frozen);
            ws.ours = true;
        }
        ActionKind::Thaw => {
            ws.observed = Some(GroupState::Thawed);
            ws.ours = false;
        }
        _ => {}
    }
    if Retry::of(ws.retry, kind) {
        ws.retry = None;
    }
    if ws.scopes.is_empty() && ws.frozen.is_none() && !ws.ours && ws.killing.is_none() {
        state.workloads.remove(workload);
    }
}

/// A suspend refused at once falls through: the ladder positions it took go back to the step
/// before it.
fn suspend_refused(state: &mut PolicyState, workload: &str, cause: &str, reason: &str) {
    if let Some(ws) = state.workloads.get_mut(workload) {
        ws.suspended = None;
        ws.suspend_failed = Some(format!("{cause}: {reason}"));
        ws.suspension = None;
        if Retry::of(ws.retry, ActionKind::Suspend) {
            ws.retry = None;
        }
        for ss in ws.scopes.values_mut() {
            if ss.status == Status::Suspended {
                ss.status = ss.without_suspend;
            }
        }
    }
}
