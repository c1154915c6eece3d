//! What the policy carries from one evaluation to the next: per workload, its liabilities'
//! ladder positions, the freeze or suspension it wants, a kill in progress, a transition being
//! retried, and what the kernel said about its group; and the words reports use for all of it
//! ([`Status`]).

use std::{collections::BTreeMap, fmt, time::Duration};

use super::{
    action::ActionKind,
    input::{GpuScope, GroupState, Suspension},
};
use crate::quota::{Mode, Signal};

/// Where a liability stands on its ladder (`Ok` to `Killed`, in ladder order: the later, the
/// further), and, for a whole workload, the states that only reports show (`Freezing` to
/// `Killing`: what the kernel or an executor is in the middle of).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Within quota (or over but not liable, in elastic mode without pressure).
    Ok,
    /// Liable, no step taken yet (in grace).
    OverQuota,
    /// The last step taken was an alert.
    Alerted,
    /// The last step taken was a signal.
    Signalled,
    /// The last step taken was a freeze.
    Frozen,
    /// The last step taken was a suspend (that did not fall through).
    Suspended,
    /// The last step taken was a kill.
    Killed,
    /// Reported only: a freeze is wanted and not (yet) effective.
    Freezing,
    /// Reported only: a suspend runs (or is wanted and not yet effective).
    Suspending,
    /// Reported only: a resume runs.
    Resuming,
    /// Reported only: a kill step's processes still run.
    Killing,
    /// Reported only, in a dry run: a signal step was reached (nothing was sent).
    WouldSignal,
    /// Reported only, in a dry run: a freeze step was reached (nothing was frozen).
    WouldFreeze,
    /// Reported only, in a dry run: a suspend step was reached (nothing was checkpointed).
    WouldSuspend,
    /// Reported only, in a dry run: a kill step was reached (nothing was killed).
    WouldKill,
}

impl Status {
    /// The state's name, as reports and metrics show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::OverQuota => "over_quota",
            Self::Alerted => "alerted",
            Self::Signalled => "signalled",
            Self::Frozen => "frozen",
            Self::Suspended => "suspended",
            Self::Killed => "killed",
            Self::Freezing => "freezing",
            Self::Suspending => "suspending",
            Self::Resuming => "resuming",
            Self::Killing => "killing",
            Self::WouldSignal => "would_signal",
            Self::WouldFreeze => "would_freeze",
            Self::WouldSuspend => "would_suspend",
            Self::WouldKill => "would_kill",
        }
    }

    /// What a dry run reports for a position the ladder reached: a state only an action could
    /// have caused (signalled, frozen, suspended, killed, or on the way there) becomes what the
    /// action would have been; the others are kept.
    pub fn as_would(self) -> Self {
        match self {
            Self::Signalled => Self::WouldSignal,
            Self::Frozen | Self::Freezing => Self::WouldFreeze,
            Self::Suspended | Self::Suspending | Self::Resuming => Self::WouldSuspend,
            Self::Killed | Self::Killing => Self::WouldKill,
            other => other,
        }
    }
}

impl PartialEq<&str> for Status {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One liability's state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ScopeState {
    /// Ladder position.
    pub status: Status,
    /// When it was first seen liable in the current episode.
    pub over_since: Option<Duration>,
    /// How many ladder steps have been taken.
    pub steps_taken: usize,
    /// Usage at the last evaluation, bytes; `None` when unknown.
    pub usage: Option<u64>,
    /// The limit, bytes.
    pub limit: u64,
    /// The mode of the limit.
    pub mode: Mode,
    /// The ladder position if its suspend step falls through (the step before it).
    #[serde(skip)]
    pub without_suspend: Status,
    /// Since when a liability whose clock still runs has been compliant (its cool-down: see
    /// `policy::ladder`); `None` while it is liable or has no clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compliant_since: Option<Duration>,
}

/// A kill step in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Killing {
    /// The liability whose ladder killed.
    pub scope: GpuScope,
    /// When the kill step fired.
    pub since: Duration,
    /// The step's signal.
    pub signal: Signal,
    /// When SIGKILL was last sent (for a step with another signal: after [`super::KILL_GRACE`]).
    pub sigkill_at: Option<Duration>,
}

/// A freeze, thaw, suspend or resume issued and not (yet) seen in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Retry {
    /// What was issued ([`ActionKind::Freeze`], `Thaw`, `Suspend` or `Resume`).
    pub transition: ActionKind,
    /// How many times.
    pub attempts: u32,
    /// Not issued again before this time.
    pub next_at: Duration,
}

impl Retry {
    /// Whether `retry` is one of `kind`.
    pub fn of(retry: Option<Self>, kind: ActionKind) -> bool {
        retry.is_some_and(|r| r.transition == kind)
    }
}

/// One workload's state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WorkloadState {
    /// Its root cgroup path.
    pub cgroup_path: String,
    /// Where its quota came from, in words.
    pub quota: String,
    /// Desired: the scope whose ladder holds it frozen.
    pub frozen: Option<GpuScope>,
    /// Its liabilities.
    pub scopes: BTreeMap<GpuScope, ScopeState>,
    /// A kill step in progress.
    pub killing: Option<Killing>,
    /// A freeze or thaw not seen in the kernel yet.
    pub retry: Option<Retry>,
    /// What the kernel said about its root group at this step (`None`: not looked at, as for a
    /// workload never frozen).
    pub observed: Option<GroupState>,
    /// Whether the group is frozen by the agent (`observed` is about a group of its own).
    pub ours: bool,
    /// Desired: the scope whose ladder holds it suspended.
    pub suspended: Option<GpuScope>,
    /// Why its suspend step fell through in this episode (the ladder went on without it).
    pub suspend_failed: Option<String>,
    /// Its suspension as observed at this step.
    pub suspension: Option<Suspension>,
    /// Suspended and no longer held so, but not resumed: why the GPU cannot hold it yet.
    pub waiting_for_room: Option<String>,
}

impl WorkloadState {
    /// The state to report: what the kernel says first, then the ladder. `frozen` only when the
    /// kernel reports the root group frozen; `freezing` while a freeze is wanted and not (yet)
    /// effective; `killing` while a kill step's processes still run. A dry run never reports a
    /// state that only an action could cause: where the ladder got to is reported as what it
    /// would have done (`would_freeze`, ...: [`Status::as_would`]); what the kernel says of a
    /// group (frozen by an earlier agent, say) is reported as it is.
    pub fn reported(&self, dry_run: bool) -> Status {
        if self.killing.is_some() {
            return if dry_run {
                Status::WouldKill
            } else {
                Status::Killing
            };
        }
        match &self.suspension {
            Some(Suspension::Suspended { .. }) => return Status::Suspended,
            Some(Suspension::InProgress { resuming: true, .. }) => return Status::Resuming,
            Some(Suspension::InProgress { .. }) => return Status::Suspending,
            _ => {}
        }
        // A transition wanted and not seen: what it would be in a dry run (nothing is written),
        // under way otherwise.
        let wanted = |would, doing| if dry_run { would } else { doing };
        if self.suspended.is_some() {
            return wanted(Status::WouldSuspend, Status::Suspending);
        }
        match self.observed {
            Some(GroupState::Frozen) if self.ours => return Status::Frozen,
            Some(GroupState::Frozen) if self.frozen.is_some() => return Status::Frozen,
            Some(GroupState::Freezing) if self.frozen.is_some() || self.ours => {
                return Status::Freezing;
            }
            _ => {}
        }
        if self.frozen.is_some() {
            return wanted(Status::WouldFreeze, Status::Freezing);
        }
        if dry_run {
            self.worst().as_would()
        } else {
            self.worst()
        }
    }

    /// The furthest ladder position of its liabilities.
    pub fn worst(&self) -> Status {
        self.scopes
            .values()
            .map(|s| s.status)
            .max()
            .unwrap_or(Status::Ok)
    }

    /// The state of one liability's row: the workload's reported state when it is frozen,
    /// freezing, killing or in a suspension (those act on the whole workload), else the
    /// liability's own.
    pub fn reported_scope(&self, scope: GpuScope, dry_run: bool) -> Status {
        let whole = self.reported(dry_run);
        if matches!(
            whole,
            Status::Frozen
                | Status::Freezing
                | Status::Killing
                | Status::Suspended
                | Status::Suspending
                | Status::Resuming
                | Status::WouldFreeze
                | Status::WouldSuspend
                | Status::WouldKill
        ) {
            return whole;
        }
        match self.scopes.get(&scope).map(|s| s.status) {
            Some(Status::Frozen | Status::Suspended | Status::Killed) | None => whole,
            Some(s) if dry_run => s.as_would(),
            Some(s) => s,
        }
    }
}

/// State carried from one evaluation to the next. Only quota-covered workloads (and frozen ones)
/// appear.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PolicyState {
    /// By workload key.
    pub workloads: BTreeMap<String, WorkloadState>,
}

impl PolicyState {
    /// Keys of the workloads this state wants frozen.
    pub fn frozen(&self) -> Vec<&str> {
        self.workloads
            .iter()
            .filter(|(_, w)| w.frozen.is_some())
            .map(|(k, _)| k.as_str())
            .collect()
    }
}
