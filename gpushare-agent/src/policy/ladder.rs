//! Stage 5: each liability's ladder, and a kill step's escalation to SIGKILL.
//!
//! **Ladder.** A liability's clock starts the first time it is seen liable and restarts only once
//! it has been compliant for [`CLOCK_COOLDOWN`] on end: a tenant that dips under its quota for a
//! sample just before the step it fears (or moves its allocation between GPUs) finds the clock
//! where it left it, and the step it dodged fires the next time it is liable. While it cools down
//! it reads `ok`; the alerts and signals already sent are not sent again, but a freeze, suspend or
//! kill step is taken anew (the workload was thawed meanwhile). A liability that starts a clock
//! takes the oldest one still running on another GPU scope of the same workload: per-GPU scopes
//! share one clock. Step *n* fires once, when the clock reaches `max(grace, step.after)`; every
//! step that is due fires in ladder order (after a gap in sampling, several may fire together).
//! Freeze and kill act on the whole workload (its root cgroup); a signal is not sent to a workload
//! that is frozen (it could not be handled). Alerts, signals and kills name the processes on the
//! liability's GPUs.
//! A freeze or suspend step only sets what the workload *should* be: the Freeze or Suspend itself
//! is issued by reconciliation ([`super::reconcile`]).
//!
//! **Kill.** A kill step with SIGKILL kills the whole root group. A kill step with another signal
//! thaws the workload (a frozen process cannot handle a signal) and sends it to the processes; if
//! any of them still runs [`KILL_GRACE`] later, SIGKILL follows. The workload reads `killing` until
//! its processes are gone; then it leaves the attribution and its state is dropped.

use std::{collections::BTreeSet, time::Duration};

use super::{
    Cx, Out,
    action::ActionKind,
    input::GpuScope,
    plan::Liability,
    state::{Killing, ScopeState, Status, WorkloadState},
};
use crate::{
    attribution::ProcessIdentity,
    quota::{ByteSize, LadderStep, ResolvedQuota, Signal, StepAction, fmt_duration},
};

/// How long after a kill step's (catchable) signal SIGKILL follows if a process still runs.
pub const KILL_GRACE: Duration = Duration::from_secs(10);

/// How long a liability must stay compliant on end before its ladder's clock restarts.
pub const CLOCK_COOLDOWN: Duration = Duration::from_secs(60);

/// Climbs each liability's ladder from `prev`'s positions into `ws`, issuing the alerts, signals
/// and kills that are due. Returns why a freeze is wanted, from the liability that holds it.
pub(super) fn climb(
    cx: &Cx,
    ws: &mut WorkloadState,
    prev: Option<&WorkloadState>,
    liabilities: &[Liability],
    quota: &ResolvedQuota,
    out: &mut Out,
) -> Option<String> {
    let input = cx.input;
    let mut freeze_reason: Option<String> = None;
    for l in liabilities {
        let prev_ss = prev.and_then(|p| p.scopes.get(&l.scope));
        let ok_state = |usage| ScopeState {
            status: Status::Ok,
            over_since: None,
            steps_taken: 0,
            usage,
            limit: l.limit,
            mode: l.enforcement.mode,
            without_suspend: Status::Ok,
            compliant_since: None,
        };
        if l.over {
            out.stats.over_quota += 1;
        }
        if l.unknown {
            out.stats.fail_open += 1;
            let kept = prev_ss.cloned().map_or(ok_state(None), |mut s| {
                s.usage = None;
                s
            });
            ws.scopes.insert(l.scope, kept);
            continue;
        }
        let ladder = &l.enforcement.ladder;
        if !l.liable {
            let cooling = prev_ss.and_then(|p| cooling(p, input.now, ladder));
            let state = ok_state(Some(l.usage));
            let state = cooling.map_or(state.clone(), |c| state.with_clock(c));
            ws.scopes.insert(l.scope, state);
            continue;
        }
        let (since, mut taken) = match prev_ss.and_then(|p| running(p, input.now)) {
            Some((since, taken)) => (since, taken.min(ladder.len())),
            None => (shared_clock(prev, input.now).unwrap_or(input.now), 0),
        };
        let elapsed = input.now.saturating_sub(since);
        let reason = reason(cx, l, elapsed, quota);
        while !cx.released && taken < ladder.len() {
            let step = ladder[taken];
            if elapsed < l.enforcement.grace.max(step.after)
                || (input.observe_only && step.action != StepAction::Alert)
            {
                break;
            }
            taken += 1;
            let (kind, targets) = match step.action {
                StepAction::Alert => (ActionKind::Alert, scope_targets(cx, l.scope)),
                StepAction::Signal(_) if ws.frozen.is_some() => continue,
                StepAction::Signal(sig) => (ActionKind::Signal(sig), scope_targets(cx, l.scope)),
                StepAction::Freeze => {
                    if ws.frozen.is_none() {
                        ws.frozen = Some(l.scope);
                    }
                    continue; // issued by reconciliation
                }
                StepAction::Suspend => {
                    // A suspend that failed in this episode falls through: the ladder goes on.
                    if ws.suspend_failed.is_none() && ws.suspended.is_none() {
                        ws.suspended = Some(l.scope);
                    }
                    continue; // issued by reconciliation
                }
                StepAction::Kill(sig) => {
                    ws.killing = Some(Killing {
                        scope: l.scope,
                        since: input.now,
                        signal: sig,
                        sigkill_at: (sig == Signal::KILL).then_some(input.now),
                    });
                    if sig != Signal::KILL {
                        // A frozen process cannot handle the signal: thaw it first.
                        ws.frozen = None;
                    }
                    (ActionKind::Kill(sig), cx.all_targets())
                }
            };
            out.actions.push(cx.act(
                l.scope,
                kind,
                targets,
                Some(l.usage),
                Some(l.limit),
                reason.clone(),
            ));
        }
        if ws.frozen == Some(l.scope) || (ws.frozen.is_some() && freeze_reason.is_none()) {
            freeze_reason = Some(reason);
        }
        let steps = &ladder[..taken];
        ws.scopes.insert(
            l.scope,
            ScopeState {
                status: position(steps, ws.suspend_failed.is_some()),
                over_since: Some(since),
                steps_taken: taken,
                usage: Some(l.usage),
                limit: l.limit,
                mode: l.enforcement.mode,
                without_suspend: position(steps, true),
                compliant_since: None,
            },
        );
    }
    freeze_reason
}

/// A clock kept through a cool-down: when it started, the steps it keeps, and since when the
/// liability has been compliant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Clock {
    since: Duration,
    steps_taken: usize,
    compliant_since: Duration,
}

impl ScopeState {
    fn with_clock(self, c: Clock) -> Self {
        Self {
            over_since: Some(c.since),
            steps_taken: c.steps_taken,
            compliant_since: Some(c.compliant_since),
            ..self
        }
    }
}

/// The clock a liability that is compliant now keeps from `prev`, while its cool-down lasts: the
/// steps that only told (alerts, signals) stay taken, the first that acted and those after it are
/// to be taken again.
fn cooling(prev: &ScopeState, now: Duration, ladder: &[LadderStep]) -> Option<Clock> {
    let since = prev.over_since?;
    let compliant_since = prev.compliant_since.unwrap_or(now);
    if now.saturating_sub(compliant_since) >= CLOCK_COOLDOWN {
        return None;
    }
    let told = ladder
        .iter()
        .take(prev.steps_taken)
        .take_while(|s| matches!(s.action, StepAction::Alert | StepAction::Signal(_)))
        .count();
    Some(Clock {
        since,
        steps_taken: told,
        compliant_since,
    })
}

/// The clock (start, steps taken) a liability that is liable now goes on with: its own, unless it
/// cooled down for [`CLOCK_COOLDOWN`].
fn running(prev: &ScopeState, now: Duration) -> Option<(Duration, usize)> {
    let since = prev.over_since?;
    match prev.compliant_since {
        Some(c) if now.saturating_sub(c) >= CLOCK_COOLDOWN => None,
        _ => Some((since, prev.steps_taken)),
    }
}

/// The oldest clock still running (liable or cooling down) on any GPU scope of the workload: a
/// new liability of the same workload starts from it, so moving an allocation between GPUs
/// restarts nothing.
fn shared_clock(prev: Option<&WorkloadState>, now: Duration) -> Option<Duration> {
    prev?
        .scopes
        .values()
        .filter_map(|s| running(s, now).map(|(since, _)| since))
        .min()
}

/// Why a liable liability's steps fire, in words with numbers.
fn reason(cx: &Cx, l: &Liability, elapsed: Duration, quota: &ResolvedQuota) -> String {
    let mut reason = format!(
        "uses {} of its {} quota on {} for {}",
        ByteSize(l.usage).approx(),
        ByteSize(l.limit).approx(),
        l.scope,
        fmt_duration(elapsed)
    );
    let tolerance = l.enforcement.tolerance.allowance(l.limit);
    if tolerance > 0 {
        reason += &format!(" (tolerance {})", ByteSize(tolerance).approx());
    }
    if l.overhead > 0 {
        reason += &format!(" (the driver's context {})", ByteSize(l.overhead).approx());
    }
    if let Some((dev, free)) = l.pressure {
        reason += &format!(
            ", and GPU {dev} has {} free, below the {} reserve",
            ByteSize(free).approx(),
            ByteSize(cx.input.quotas.defaults().elastic_reserve).approx()
        );
    }
    reason += &format!("; {}", quota.source);
    reason
}

/// The processes on the liability's GPUs.
fn scope_targets(cx: &Cx, scope: GpuScope) -> Vec<ProcessIdentity> {
    let set: BTreeSet<ProcessIdentity> = cx
        .dev_usage
        .iter()
        .filter(|(dev, _)| scope == GpuScope::All || scope == GpuScope::Gpu(**dev))
        .flat_map(|(_, d)| d.procs.iter().copied())
        .collect();
    set.into_iter().collect()
}

/// The ladder position after `steps`: the last step that took effect (`skip_suspend`: a suspend
/// that fell through did not).
pub(super) fn position(steps: &[LadderStep], skip_suspend: bool) -> Status {
    let effective = steps
        .iter()
        .rev()
        .map(|s| s.action)
        .find(|a| *a != StepAction::Suspend || !skip_suspend);
    match effective {
        None => Status::OverQuota,
        Some(StepAction::Alert) => Status::Alerted,
        Some(StepAction::Signal(_)) => Status::Signalled,
        Some(StepAction::Freeze) => Status::Frozen,
        Some(StepAction::Suspend) => Status::Suspended,
        Some(StepAction::Kill(_)) => Status::Killed,
    }
}

/// A kill step still in progress: SIGKILL when its signal was not enough, as long as the
/// liability is still liable (a process that handled the signal by shrinking has complied).
pub(super) fn escalate_kill(
    cx: &Cx,
    ws: &mut WorkloadState,
    liabilities: &[Liability],
    quota: &ResolvedQuota,
    out: &mut Out,
) {
    let Some(k) = ws.killing else { return };
    let input = cx.input;
    let l = liabilities.iter().find(|l| l.scope == k.scope);
    let complied = l.is_some_and(|l| !l.unknown && !l.liable) || l.is_none();
    if cx.released || complied {
        ws.killing = None;
    } else if let Some(l) = l.filter(|l| !l.unknown && !input.observe_only) {
        let since = k.sigkill_at.unwrap_or(k.since);
        if input.now.saturating_sub(since) >= KILL_GRACE {
            ws.killing = Some(Killing {
                sigkill_at: Some(input.now),
                ..k
            });
            out.actions.push(cx.act(
                k.scope,
                ActionKind::Kill(Signal::KILL),
                cx.all_targets(),
                Some(l.usage),
                Some(l.limit),
                format!(
                    "still running {} after the kill step's {}; {}",
                    fmt_duration(input.now.saturating_sub(k.since)),
                    k.signal.name,
                    quota.source
                ),
            ));
        }
    }
}
