//! States that do not come from climbing a ladder: a workload that is only to be thawed, and a
//! freeze of an earlier run taken over.
//!
//! **Adoption.** An earlier run's freezes are *adopted*: with no state of its own for a workload
//! the agent froze, the policy takes it as frozen by its freeze step (so earlier steps do not fire
//! again) and decides from there: kept while liable or while its usage is unknown, thawed
//! otherwise. Reconciliation after a restart is therefore per workload and per GPU, with the same
//! rules as every step.

use std::{collections::BTreeMap, time::Duration};

use super::{
    Cx,
    input::{GpuScope, ObservedGroup, Suspension},
    plan::Liability,
    state::{ScopeState, Status, WorkloadState},
};
use crate::quota::{ResolvedQuota, StepAction};

/// A state that wants the workload thawed (excluded, released, or without processes).
pub(super) fn thaw_only(cx: &Cx, prev: Option<&WorkloadState>, o: &ObservedGroup) -> WorkloadState {
    WorkloadState {
        cgroup_path: cx.cgroup_path.to_string(),
        quota: prev.map(|p| p.quota.clone()).unwrap_or_default(),
        frozen: None,
        scopes: BTreeMap::new(),
        killing: None,
        retry: prev.and_then(|p| p.retry),
        observed: Some(o.state),
        ours: o.ours,
        suspended: None,
        suspend_failed: None,
        suspension: o.suspension.clone(),
        waiting_for_room: None,
    }
}

/// A state for a workload an earlier run froze: as if its freeze step had fired at the right time,
/// on each liability whose ladder freezes (so earlier steps do not fire again).
pub(super) fn adopt(
    cx: &Cx,
    quota: &ResolvedQuota,
    liabilities: &[Liability],
    o: &ObservedGroup,
    now: Duration,
) -> WorkloadState {
    let mut scopes = BTreeMap::new();
    let suspended = matches!(o.suspension, Some(Suspension::Suspended { .. }));
    let mut suspend_scope = None;
    for l in liabilities {
        let ladder = &l.enforcement.ladder;
        let step = |a: StepAction| ladder.iter().position(|s| s.action == a);
        let (at, status) = match (
            suspended,
            step(StepAction::Suspend),
            step(StepAction::Freeze),
        ) {
            (true, Some(at), _) => {
                suspend_scope.get_or_insert(l.scope);
                (at, Status::Suspended)
            }
            (_, _, Some(at)) => (at, Status::Frozen),
            _ => continue,
        };
        let after = l.enforcement.grace.max(ladder[at].after);
        scopes.insert(
            l.scope,
            ScopeState {
                status,
                over_since: Some(now.saturating_sub(after)),
                steps_taken: at + 1,
                usage: None,
                limit: l.limit,
                mode: l.enforcement.mode,
                without_suspend: Status::Frozen,
                compliant_since: None,
            },
        );
    }
    let frozen = o
        .frozen_by
        .filter(|s| scopes.contains_key(s))
        .or_else(|| scopes.keys().next().copied())
        .or(o.frozen_by)
        .or(Some(GpuScope::All));
    WorkloadState {
        cgroup_path: cx.cgroup_path.to_string(),
        quota: quota.source.to_string(),
        frozen,
        scopes,
        killing: None,
        retry: None,
        observed: Some(o.state),
        ours: true,
        suspended: suspend_scope,
        suspend_failed: None,
        suspension: o.suspension.clone(),
        waiting_for_room: None,
    }
}
