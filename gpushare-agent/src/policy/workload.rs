//! Stage 4: one workload with processes, from its plan to the state carried into the next step.
//!
//! The preamble: a group that is gone or was replaced starts its workload afresh; an excluded
//! workload is only thawed; an unresolved one keeps its state; an earlier run's freeze is adopted
//! ([`super::adopt`]). Then its ladders ([`super::ladder`]), what holds it ([`super::hold`]), a
//! kill's escalation, and the reconciliation with the kernel ([`super::reconcile`]).
//!
//! **Release** (`releases`, workload keys): thaw if frozen, forget all its liabilities, and escalate
//! nothing in that evaluation; its clock starts afresh, so it gets the whole grace period and ladder
//! again before it could be frozen again.

use std::{collections::BTreeMap, fmt};

use super::{
    Cx, Out, Step,
    action::ActionKind,
    adopt::{adopt, thaw_only},
    hold::holding,
    input::{GpuScope, GroupState, ObservedGroup, Suspension},
    ladder::{climb, escalate_kill},
    outcome::Stats,
    plan::{Liability, Plan},
    reconcile::{reconcile, reconcile_suspension, thawed_externally},
    state::{Retry, WorkloadState},
};
use crate::quota::ResolvedQuota;

/// Decides for the workload `key` (with processes) under `plan`; carries its state into
/// `out.next` when there is anything to carry.
pub(super) fn decide(step: &Step, key: &str, plan: &Plan, out: &mut Out) {
    let g = &step.workloads.groups[key];
    let observed = step.input.observed.get(key);
    let cx = Cx::new(step, key, &g.meta.id.cgroup_path);
    let prev_ws = afresh(step, key, observed, cx.released, &mut out.stats);
    let (quota, liabilities) = match plan {
        Plan::Excluded(why) => {
            if let Some(o) = observed.filter(|o| o.ours) {
                let why = if cx.released {
                    "released by an operator".to_string()
                } else {
                    format!("thawed because {why}")
                };
                let ws = thaw_only(&cx, prev_ws.as_ref(), o);
                if let Some(ws) = unwind(&cx, ws, o, &why, &mut out.actions) {
                    let quota = out
                        .driver_limits
                        .is_some()
                        .then(|| step.input.quotas.resolve(g.meta, g.env))
                        .flatten();
                    out.keep(step, key, ws, quota.as_ref());
                }
            }
            return;
        }
        Plan::Unresolved(quota) => {
            out.stats.fail_open += 1;
            if let Some(mut p) = prev_ws {
                p.observed = observed.map(|o| o.state);
                p.ours = observed.is_some_and(|o| o.ours);
                out.keep(step, key, p, Some(quota));
            }
            return;
        }
        Plan::Enforce { quota, liabilities } => (quota, liabilities),
    };
    // An earlier run froze it and this one has no state of its own: adopt the freeze.
    let prev_ws = match (prev_ws, observed.filter(|o| o.ours)) {
        (None, Some(o)) if !cx.released => {
            out.stats.adopted += 1;
            Some(adopt(&cx, quota, liabilities, o, step.input.now))
        }
        (prev_ws, _) => prev_ws,
    };
    let mut ws = carried(prev_ws.as_ref(), &g.meta.id.cgroup_path, quota);
    fall_through(&mut ws, observed, &mut out.stats);
    let freeze_reason = climb(&cx, &mut ws, prev_ws.as_ref(), liabilities, quota, out);
    let thaw_why = holding(&mut ws, liabilities, quota, cx.released);
    escalate_kill(&cx, &mut ws, liabilities, quota, out);
    // In words only when an action carries it: the quota's source is not formatted otherwise.
    let said = thaw_why.or(freeze_reason);
    let why: &dyn fmt::Display = match &said {
        Some(s) => s,
        None => &quota.source,
    };
    let external;
    let why = if thawed_externally(step.prev, key, observed) {
        out.stats.external_thaws += 1;
        external = if ws.frozen.is_some() {
            format!("thawed behind the agent's back, freezing it again: {why}")
        } else {
            format!("thawed behind the agent's back: {why}")
        };
        &external
    } else {
        why
    };
    if let Some(ws) = settle(&cx, ws, observed, liabilities, why, out)
        && (!ws.scopes.is_empty()
            || ws.frozen.is_some()
            || ws.ours
            || ws.suspended.is_some()
            || ws.suspension.is_some())
    {
        out.keep(step, key, ws, Some(quota));
    }
}

/// Undoes what the agent did to a workload it no longer holds (excluded, or without processes):
/// a suspension is resumed by the one resume rule (once there is room, off the event loop, see
/// [`reconcile_suspension`]); a freeze is thawed. Returns the state to carry.
pub(super) fn unwind(
    cx: &Cx,
    mut ws: WorkloadState,
    o: &ObservedGroup,
    why: &str,
    actions: &mut Vec<super::Action>,
) -> Option<WorkloadState> {
    if reconcile_suspension(cx, &mut ws, Some(o), None, &why, actions) {
        ws.observed = Some(o.state);
        ws.ours = o.ours;
        return Some(ws);
    }
    reconcile(cx, ws, Some(o), None, &why, actions)
}

/// The previous state to go on from: none when the group it is about is gone or was replaced,
/// or the workload was released.
fn afresh(
    step: &Step,
    key: &str,
    observed: Option<&ObservedGroup>,
    released: bool,
    stats: &mut Stats,
) -> Option<WorkloadState> {
    let mut prev_ws = step.prev.workloads.get(key).cloned();
    match observed.map(|o| o.state) {
        Some(GroupState::Gone) => {
            stats.groups_gone += 1;
            prev_ws = None;
        }
        Some(GroupState::Replaced) => {
            stats.groups_replaced += 1;
            prev_ws = None;
        }
        _ => {}
    }
    if released {
        prev_ws = None;
    }
    prev_ws
}

/// What carries over from the previous state before the ladders run.
fn carried(
    prev: Option<&WorkloadState>,
    cgroup_path: &str,
    quota: &ResolvedQuota,
) -> WorkloadState {
    WorkloadState {
        cgroup_path: cgroup_path.to_string(),
        quota: quota.source.to_string(),
        frozen: prev.and_then(|p| p.frozen),
        scopes: BTreeMap::new(),
        killing: prev.and_then(|p| p.killing),
        retry: prev.and_then(|p| p.retry),
        observed: None,
        ours: false,
        suspended: prev.and_then(|p| p.suspended),
        suspend_failed: prev.and_then(|p| p.suspend_failed.clone()),
        suspension: None,
        waiting_for_room: None,
    }
}

/// A suspend that failed since the last step: the step falls through.
fn fall_through(ws: &mut WorkloadState, observed: Option<&ObservedGroup>, stats: &mut Stats) {
    if let Some(Suspension::Failed { cause, reason }) = observed.and_then(|o| o.suspension.as_ref())
        && ws.suspended.is_some()
    {
        *stats.suspend_fallthroughs.entry(cause.clone()).or_default() += 1;
        ws.suspended = None;
        ws.suspend_failed = Some(format!("{cause}: {reason}"));
        if Retry::of(ws.retry, ActionKind::Suspend) {
            ws.retry = None;
        }
    }
}

/// Reconciles the suspension first (while a suspend or resume runs, or the workload is
/// suspended, the suspension owns the group's freeze), then the freeze; returns the state to
/// carry.
fn settle(
    cx: &Cx,
    mut ws: WorkloadState,
    observed: Option<&ObservedGroup>,
    liabilities: &[Liability],
    why: &dyn fmt::Display,
    out: &mut Out,
) -> Option<WorkloadState> {
    // The liability holding the scope, when its data is good and it is liable: a freeze or
    // suspend (first or again) is only issued then.
    let holding = |scope: Option<GpuScope>| {
        scope.and_then(|scope| {
            liabilities
                .iter()
                .find(|l| l.scope == scope && !l.unknown && l.liable)
        })
    };
    let suspend_on = holding(ws.suspended).map(|l| {
        let footprint: BTreeMap<u32, u64> = cx
            .dev_usage
            .iter()
            .filter(|(d, _)| l.scope == GpuScope::All || l.scope == GpuScope::Gpu(**d))
            .map(|(d, u)| (*d, u.bytes))
            .collect();
        (l.usage, l.limit, footprint)
    });
    if reconcile_suspension(cx, &mut ws, observed, suspend_on, why, &mut out.actions) {
        ws.observed = observed.map(|o| o.state);
        ws.ours = observed.is_some_and(|o| o.ours);
        return Some(ws);
    }
    let known = holding(ws.frozen).is_some();
    let usage_limit = ws.frozen.and_then(|scope| {
        liabilities
            .iter()
            .find(|l| l.scope == scope)
            .map(|l| (l.usage, l.limit))
    });
    reconcile(
        cx,
        ws,
        observed,
        known.then_some(usage_limit),
        why,
        &mut out.actions,
    )
}
