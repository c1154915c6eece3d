//! The pure policy core: `(previous state, samples, attribution, quotas, observed enforcement
//! state, now) -> (state, actions)`.
//!
//! Design note: [`evaluate`] does no I/O, reads no clock and keeps no hidden state, so every decision
//! can be replayed in a unit test. Time is a plain [`Duration`] since an arbitrary origin (the agent
//! uses its monotonic start). All maps are ordered, so equal inputs give equal outputs, in any
//! order of `processes`.
//!
//! **Usage.** A process sample counts for the workload its pid is attributed to; usage is summed per
//! workload per GPU, and over all GPUs for an all-GPU quota. A *liability* is one (workload, GPU
//! scope) with a limit. It is *over* when usage > limit + tolerance.
//!
//! **Liable.** In `strict` mode an over liability is liable. In `elastic` mode it is liable only
//! while a GPU it uses is under pressure (free memory < `elastic_reserve`): the over-quota elastic
//! liabilities on that GPU are taken largest borrowing (usage − limit) first, until the borrowing
//! taken covers the shortfall (free + taken ≥ reserve).
//!
//! **Ladder.** A liability's clock starts the first time it is seen liable and restarts whenever it
//! is not. Step *n* fires once, when the clock reaches `max(grace, step.after)`; every step that is
//! due fires in ladder order (after a gap in sampling, several may fire together). Freeze and kill
//! act on the whole workload (its root cgroup); a signal is not sent to a workload that is frozen (it
//! could not be handled). Alerts, signals and kills name the processes on the liability's GPUs.
//!
//! **Desired and observed.** The ladder decides what the workload's root group *should* be
//! (frozen or not); [`PolicyInput::observed`] says what the kernel reported about it at the start of
//! the step, and whether it is a group the agent froze (a ledger record or a mark on the group, with
//! the same inode). Freeze and Thaw actions come from the difference, level-triggered: a freeze the
//! kernel does not show (it failed, it is still settling, someone thawed the group behind the
//! agent's back) is issued again with backoff ([`RETRY_BASE`] doubling to [`RETRY_MAX`]); a thaw that
//! did not take likewise. A group thawed behind the agent's back while its workload is still liable
//! is re-frozen at once and counted ([`Stats::external_thaws`]). A group that is gone, or was
//! recreated under the same path (another inode), is forgotten: the workload's state starts afresh.
//! An earlier run's freezes are *adopted*: with no state of its own for a workload the agent froze,
//! the policy takes it as frozen by its freeze step (so earlier steps do not fire again) and decides
//! from there: kept while liable or while its usage is unknown, thawed otherwise. Reconciliation
//! after a restart is therefore per workload and per GPU, with the same rules as every step.
//!
//! **Kill.** A kill step with SIGKILL kills the whole root group. A kill step with another signal
//! thaws the workload (a frozen process cannot handle a signal) and sends it to the processes; if
//! any of them still runs [`KILL_GRACE`] later, SIGKILL follows. The workload reads `killing` until
//! its processes are gone; then it leaves the attribution and its state is dropped.
//!
//! **Thaw.** A frozen workload is thawed as soon as no liability holds it frozen: usage back within
//! quota + tolerance, quota raised or removed, pressure gone (elastic), the workload now protected, or
//! an operator release. A workload that left the attribution while frozen gets a Thaw with no
//! targets (a cgroup-only operation), unless the sample is blind or a GPU is degraded (its
//! processes might only be unseen); its state is dropped once the group is thawed.
//!
//! **Release** (`releases`, workload keys): thaw if frozen, forget all its liabilities, and escalate
//! nothing in that evaluation; its clock starts afresh, so it gets the whole grace period and ladder
//! again before it could be frozen again. Workloads known only from an earlier run's freezes can be
//! released too.
//!
//! **Safety.** No action other than Thaw for a workload that is protected (the host's root cgroup, the
//! agent's own workload, the `protect` list, a plain cgroup no file entry names) or that no quota
//! covers. Fail open: a liability whose usage is unknown (its GPU degraded, a process with
//! `used_bytes == None`, a pid attributed to two identities, an all-GPU quota while any GPU is
//! degraded, or a sample without any device) keeps its previous state unchanged, escalates nothing,
//! re-freezes nothing, and is counted in [`Stats::fail_open`]; a workload frozen by it stays frozen
//! until the data is good again. Targets are only ever identities from the `processes` input.
//!
//! **Dry run.** The policy decides exactly as usual and copies `dry_run` into each [`Action`]; the
//! executors must not touch anything for such an action. State advances as if the actions were
//! carried out (a desired freeze counts as done), so reports show what would have happened.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use crate::{
    attribution::{ProcessIdentity, WorkloadKind},
    quota::{
        ByteSize, DeviceRef, EnvQuota, LimitScope, Mode, QuotaSet, ResolvedQuota, Signal,
        StepAction, WorkloadMeta, fmt_duration,
    },
    sample::GpuSample,
};

#[cfg(test)]
mod tests;

/// First delay before a freeze or thaw that did not take is issued again; it doubles per attempt.
pub const RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest delay between two attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(60);
/// How long after a kill step's (catchable) signal SIGKILL follows if a process still runs.
pub const KILL_GRACE: Duration = Duration::from_secs(10);

/// One verified GPU process and who it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttributedProcess {
    /// pid + start time, verified by attribution.
    pub identity: ProcessIdentity,
    /// Its workload.
    pub workload: WorkloadMeta,
    /// The quota in its environment, if any (see [`crate::quota::env`]).
    pub env_quota: Option<EnvQuota>,
}

/// What the kernel says about a workload's root group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupState {
    /// Frozen (`frozen 1` in `cgroup.events`, or v1 `FROZEN`).
    Frozen,
    /// Asked to freeze, not frozen yet (a task that cannot stop, e.g. in D state in a driver).
    Freezing,
    /// Not frozen and not asked to be.
    Thawed,
    /// The directory is gone.
    Gone,
    /// A directory of that path exists, but it is another group (another inode) than the one frozen.
    Replaced,
}

/// What the agent knows about a workload's suspension (its GPU memory checkpointed to host memory
/// through the CUDA driver), at the start of the step.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Suspension {
    /// A suspend (or, `resuming`, a resume) runs on a worker thread. `per_gpu`: the GPU memory it
    /// moves, bytes per GPU index.
    InProgress {
        /// A resume rather than a suspend.
        resuming: bool,
        /// Bytes per GPU index.
        per_gpu: BTreeMap<u32, u64>,
    },
    /// Its GPU processes are checkpointed and its group frozen: this much GPU memory per GPU
    /// index is held in host memory, and counts as its usage.
    Suspended {
        /// Bytes per GPU index.
        per_gpu: BTreeMap<u32, u64>,
    },
    /// The last suspend could not be done, and what it had done was undone.
    Failed {
        /// The fall-through's reason, for the metric (`unavailable`, `host_memory`,
        /// `lock_timeout`, `not_supported`, `failed_state`, `error`).
        cause: String,
        /// In words.
        reason: String,
    },
}

impl Suspension {
    /// The GPU memory a suspended (or suspending, or resuming) workload holds off the GPU.
    pub fn footprint(&self) -> Option<&BTreeMap<u32, u64>> {
        match self {
            Self::InProgress { per_gpu, .. } | Self::Suspended { per_gpu } => Some(per_gpu),
            Self::Failed { .. } => None,
        }
    }
}

/// One observed root group, at the start of the step.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ObservedGroup {
    /// The agent froze this very group (a record or mark of its own, same inode). Never true for
    /// [`GroupState::Gone`] or [`GroupState::Replaced`].
    pub ours: bool,
    /// What the kernel says.
    pub state: GroupState,
    /// The scope whose ladder froze it, when the record says.
    pub frozen_by: Option<GpuScope>,
    /// The group's path relative to the v2 root.
    pub cgroup_path: String,
    /// Its suspension, when the agent suspended it (or tried).
    pub suspension: Option<Suspension>,
}

/// Everything one evaluation looks at.
#[derive(Clone, Copy, Debug)]
pub struct PolicyInput<'a> {
    /// Time since an arbitrary fixed origin (monotonic).
    pub now: Duration,
    /// The latest NVML sample.
    pub sample: &'a GpuSample,
    /// Attributed GPU processes.
    pub processes: &'a [AttributedProcess],
    /// The quota set in force.
    pub quotas: &'a QuotaSet,
    /// Workload keys an operator asked to release since the last evaluation.
    pub releases: &'a [String],
    /// The agent's own pid: its workload is never acted on.
    pub agent_pid: Option<u32>,
    /// Copied into every action: decide, report, touch nothing.
    pub dry_run: bool,
    /// No operator configuration is in force (invalid at start, none kept): alert, take no
    /// other ladder step and freeze nothing (they fire once this ends, when due); thaws still
    /// happen.
    pub observe_only: bool,
    /// The root groups of workloads the agent froze or wants frozen, by workload key, as the
    /// kernel reported them at the start of this step.
    pub observed: &'a BTreeMap<String, ObservedGroup>,
}

/// What a liability's usage is measured over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuScope {
    /// Summed over all GPUs.
    All,
    /// One GPU, by NVML index.
    Gpu(u32),
}

impl GpuScope {
    /// `all` or the index, as records store it.
    pub fn label(self) -> String {
        match self {
            Self::All => "all".to_string(),
            Self::Gpu(i) => i.to_string(),
        }
    }

    /// The inverse of [`Self::label`].
    pub fn from_label(s: &str) -> Option<Self> {
        match s {
            "all" => Some(Self::All),
            i => i.parse().ok().map(Self::Gpu),
        }
    }
}

impl fmt::Display for GpuScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("all GPUs"),
            Self::Gpu(i) => write!(f, "GPU {i}"),
        }
    }
}

impl serde::Serialize for GpuScope {
    /// `"all"` or the index as a string, so it can key a JSON object.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.label())
    }
}

/// Where a liability stands on its ladder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
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
}

impl Status {
    /// The ladder position's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::OverQuota => "over_quota",
            Self::Alerted => "alerted",
            Self::Signalled => "signalled",
            Self::Frozen => "frozen",
            Self::Suspended => "suspended",
            Self::Killed => "killed",
        }
    }

    fn rank(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::OverQuota => 1,
            Self::Alerted => 2,
            Self::Signalled => 3,
            Self::Frozen => 4,
            Self::Suspended => 5,
            Self::Killed => 6,
        }
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
    /// When SIGKILL was last sent (for a step with another signal: after [`KILL_GRACE`]).
    pub sigkill_at: Option<Duration>,
}

/// Which transition is being retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transition {
    /// Freeze the root group.
    Freeze,
    /// Thaw it.
    Thaw,
    /// Suspend the workload (checkpoint its GPU processes, freeze it).
    Suspend,
    /// Resume it (thaw, restore, unlock).
    Resume,
}

/// A freeze or thaw issued and not (yet) seen in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Retry {
    /// What was issued.
    pub transition: Transition,
    /// How many times.
    pub attempts: u32,
    /// Not issued again before this time.
    pub next_at: Duration,
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
}

impl WorkloadState {
    /// The state to report: what the kernel says first, then the ladder. `frozen` only when the
    /// kernel reports the root group frozen (or, in a dry run, when the policy would have frozen
    /// it); `freezing` while a freeze is wanted and not (yet) effective; `killing` while a kill
    /// step's processes still run.
    pub fn reported(&self, dry_run: bool) -> &'static str {
        if self.killing.is_some() {
            return "killing";
        }
        match &self.suspension {
            Some(Suspension::Suspended { .. }) => return "suspended",
            Some(Suspension::InProgress { resuming: true, .. }) => return "resuming",
            Some(Suspension::InProgress { .. }) => return "suspending",
            _ => {}
        }
        if self.suspended.is_some() {
            return if dry_run { "suspended" } else { "suspending" };
        }
        match self.observed {
            Some(GroupState::Frozen) if self.ours => return "frozen",
            Some(GroupState::Frozen) if self.frozen.is_some() => return "frozen",
            Some(GroupState::Freezing) if self.frozen.is_some() || self.ours => {
                return "freezing";
            }
            _ => {}
        }
        if self.frozen.is_some() {
            return if dry_run { "frozen" } else { "freezing" };
        }
        self.worst().as_str()
    }

    /// The furthest ladder position of its liabilities.
    pub fn worst(&self) -> Status {
        self.scopes
            .values()
            .map(|s| s.status)
            .max_by_key(|s| s.rank())
            .unwrap_or(Status::Ok)
    }

    /// The state of one liability's row: the workload's reported state when it is frozen,
    /// freezing or killing (those act on the whole workload), else the liability's own.
    pub fn reported_scope(&self, scope: GpuScope, dry_run: bool) -> &'static str {
        let whole = self.reported(dry_run);
        if matches!(
            whole,
            "frozen" | "freezing" | "killing" | "suspended" | "suspending" | "resuming"
        ) {
            return whole;
        }
        match self.scopes.get(&scope).map(|s| s.status) {
            Some(Status::Frozen | Status::Suspended | Status::Killed) | None => whole,
            Some(s) => s.as_str(),
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
    /// Records what an executor reported the kernel did at this step: a freeze or thaw the kernel
    /// already applied (`done`) is what the kernel now says about the group, so reports need not
    /// wait for the next step's observation. A workload left with nothing to carry is dropped.
    pub fn note_done(&mut self, workload: &str, transition: Transition) {
        let Some(ws) = self.workloads.get_mut(workload) else {
            return;
        };
        match transition {
            Transition::Freeze => {
                ws.observed = Some(GroupState::Frozen);
                ws.ours = true;
            }
            Transition::Thaw => {
                ws.observed = Some(GroupState::Thawed);
                ws.ours = false;
            }
            Transition::Suspend | Transition::Resume => {}
        }
        if ws.retry.is_some_and(|r| r.transition == transition) {
            ws.retry = None;
        }
        if ws.scopes.is_empty() && ws.frozen.is_none() && !ws.ours && ws.killing.is_none() {
            self.workloads.remove(workload);
        }
    }

    /// Records a suspend that failed at once (no driver API, not enough host memory): the step
    /// falls through in this very step.
    pub fn note_suspend_failed(&mut self, workload: &str, cause: &str, reason: &str) {
        if let Some(ws) = self.workloads.get_mut(workload) {
            ws.suspended = None;
            ws.suspend_failed = Some(format!("{cause}: {reason}"));
            ws.suspension = None;
            if ws
                .retry
                .is_some_and(|r| r.transition == Transition::Suspend)
            {
                ws.retry = None;
            }
            for ss in ws.scopes.values_mut() {
                if ss.status == Status::Suspended {
                    ss.status = ss.without_suspend;
                }
            }
        }
    }

    /// Keys of the workloads this state wants frozen.
    pub fn frozen(&self) -> Vec<&str> {
        self.workloads
            .iter()
            .filter(|(_, w)| w.frozen.is_some())
            .map(|(k, _)| k.as_str())
            .collect()
    }
}

/// What to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Report.
    Alert,
    /// Send this signal to the targets.
    Signal(Signal),
    /// Freeze the root cgroup.
    Freeze,
    /// Thaw the root cgroup.
    Thaw,
    /// Kill the targets with this signal (SIGKILL: the whole root cgroup).
    Kill(Signal),
    /// Checkpoint the targets' GPU memory to host memory and freeze the root cgroup.
    Suspend,
    /// Thaw the root cgroup, restore and unlock the checkpointed processes.
    Resume,
}

impl ActionKind {
    /// `alert`, `signal`, `freeze`, `thaw`, `kill`, `suspend` or `resume`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Alert => "alert",
            Self::Signal(_) => "signal",
            Self::Freeze => "freeze",
            Self::Thaw => "thaw",
            Self::Kill(_) => "kill",
            Self::Suspend => "suspend",
            Self::Resume => "resume",
        }
    }
}

/// One decision for the executors.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Action {
    /// Workload key.
    pub workload: String,
    /// Its root cgroup path.
    pub cgroup_path: String,
    /// The liability that caused it.
    pub gpu: GpuScope,
    /// What to do.
    pub kind: ActionKind,
    /// The verified processes it is about (from the input; may be empty for a Thaw).
    pub targets: Vec<ProcessIdentity>,
    /// Usage, bytes, when known.
    pub usage: Option<u64>,
    /// Limit, bytes, when one applies.
    pub limit: Option<u64>,
    /// Why, in words with numbers.
    pub reason: String,
    /// Dry run: report only, touch nothing.
    pub dry_run: bool,
    /// Which attempt of this freeze or thaw (1 for the first).
    pub attempt: u32,
    /// For a Suspend: the workload's GPU memory, bytes per GPU index, to be moved.
    pub footprint: BTreeMap<u32, u64>,
}

/// Counts from one evaluation (for metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Workloads with attributed GPU processes.
    pub workloads: usize,
    /// Of those, protected.
    pub protected: usize,
    /// Of those, covered by no quota.
    pub unquota: usize,
    /// Liabilities over quota (liable or not).
    pub over_quota: usize,
    /// Liabilities left alone because their usage was unknown.
    pub fail_open: usize,
    /// Process samples whose pid no attributed process has.
    pub unattributed_samples: usize,
    /// Devices in the sample that are not healthy.
    pub degraded_devices: usize,
    /// Releases naming no known workload.
    pub ignored_releases: usize,
    /// Groups the agent froze that were found thawed by someone else.
    pub external_thaws: usize,
    /// Groups the agent froze that were found removed.
    pub groups_gone: usize,
    /// Groups the agent froze that were found recreated under the same path.
    pub groups_replaced: usize,
    /// Freezes of an earlier run taken over.
    pub adopted: usize,
    /// Suspend steps that fell through this step, by cause.
    pub suspend_fallthroughs: BTreeMap<String, usize>,
}

/// The result of one evaluation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    /// Carry into the next evaluation.
    pub state: PolicyState,
    /// What to do, in workload-key order.
    pub actions: Vec<Action>,
    /// Counts.
    pub stats: Stats,
}

#[derive(Default)]
struct DevUsage {
    bytes: u64,
    /// What NVML lists for it now (`bytes` also counts a suspension's footprint).
    listed: u64,
    unknown: bool,
    procs: BTreeSet<ProcessIdentity>,
}

struct Group<'a> {
    meta: &'a WorkloadMeta,
    identities: BTreeSet<ProcessIdentity>,
    env: Option<&'a EnvQuota>,
}

struct Liability {
    scope: GpuScope,
    limit: u64,
    enforcement: crate::quota::Enforcement,
    usage: u64,
    unknown: bool,
    over: bool,
    liable: bool,
    /// Elastic: the GPU under pressure and its free memory.
    pressure: Option<(u32, u64)>,
    /// Its GPU memory is in host memory (suspended): it may come back only where it fits.
    suspended: bool,
}

enum Plan {
    Excluded(&'static str),
    /// A quota names a GPU by UUID that cannot be found while some GPU is degraded.
    Unresolved,
    Enforce {
        quota: ResolvedQuota,
        liabilities: Vec<Liability>,
    },
}

/// Delay before attempt `attempts + 1` of a transition.
fn backoff(attempts: u32) -> Duration {
    RETRY_BASE
        .saturating_mul(1u32 << attempts.saturating_sub(1).min(16))
        .min(RETRY_MAX)
}

/// Decides what to do now. See the module note for the rules.
pub fn evaluate(prev: &PolicyState, input: &PolicyInput) -> Outcome {
    let sample = input.sample;
    let present: BTreeSet<u32> = sample
        .devices
        .iter()
        .map(|d| d.index)
        .chain(sample.health.iter().map(|(i, _)| *i))
        .collect();
    let degraded: BTreeSet<u32> = present
        .iter()
        .copied()
        .filter(|i| !sample.device_ok(*i))
        .collect();
    let blind = present.is_empty();
    let mut stats = Stats {
        degraded_devices: degraded.len(),
        ..Stats::default()
    };

    // Group processes by workload, in a fixed order.
    let mut procs: Vec<(String, &AttributedProcess)> = input
        .processes
        .iter()
        .map(|p| (p.workload.key(), p))
        .collect();
    procs.sort_by(|a, b| (&a.0, a.1.identity).cmp(&(&b.0, b.1.identity)));
    // Keyed by the keys in `procs`: no string is copied per process.
    let mut groups: BTreeMap<&str, Group> = BTreeMap::new();
    let mut owners: BTreeMap<u32, BTreeSet<(&str, ProcessIdentity)>> = BTreeMap::new();
    for (key, p) in &procs {
        let g = groups.entry(key.as_str()).or_insert_with(|| Group {
            meta: &p.workload,
            identities: BTreeSet::new(),
            env: None,
        });
        g.identities.insert(p.identity);
        if g.env.is_none() {
            g.env = p.env_quota.as_ref();
        }
        owners
            .entry(p.identity.pid)
            .or_default()
            .insert((key.as_str(), p.identity));
    }

    // Usage per workload per device.
    let mut usage: BTreeMap<&str, BTreeMap<u32, DevUsage>> = BTreeMap::new();
    for ps in &sample.processes {
        let Some(set) = owners.get(&ps.pid) else {
            stats.unattributed_samples += 1;
            continue;
        };
        let ambiguous = set.len() > 1;
        for (key, identity) in set {
            let du = usage
                .entry(*key)
                .or_default()
                .entry(ps.device_index)
                .or_default();
            match ps.used_bytes {
                Some(b) if !ambiguous => {
                    du.bytes = du.bytes.saturating_add(b);
                    du.listed = du.bytes;
                }
                _ => du.unknown = true,
            }
            if !sample.device_ok(ps.device_index) {
                du.unknown = true;
            }
            if !ambiguous {
                du.procs.insert(*identity);
            }
        }
    }
    // A suspended (or suspending, or resuming) workload's GPU memory is in host memory: NVML no
    // longer lists it, but it is the workload's usage all the same (else it would be resumed at
    // once and suspended again).
    for (key, o) in input.observed {
        let Some(footprint) = o.suspension.as_ref().and_then(Suspension::footprint) else {
            continue;
        };
        let Some(g) = groups.get(key.as_str()) else {
            continue;
        };
        let per_dev = usage.entry(key.as_str()).or_default();
        for (dev, bytes) in footprint {
            let du = per_dev.entry(*dev).or_default();
            du.bytes = du.bytes.max(*bytes);
            du.procs.extend(g.identities.iter().copied());
            if !sample.device_ok(*dev) {
                du.unknown = true;
            }
        }
    }
    let empty = BTreeMap::new();
    let usage_of = |key: &str| usage.get(key).unwrap_or(&empty);

    let mut plans = plan_workloads(input, &groups, &usage, &degraded, blind, &mut stats);
    apply_elastic_pressure(input, &mut plans, &usage);

    let releases: BTreeSet<&str> = input.releases.iter().map(String::as_str).collect();
    stats.ignored_releases = releases
        .iter()
        .filter(|k| {
            !groups.contains_key(**k)
                && !prev.workloads.contains_key(**k)
                && !input.observed.get(**k).is_some_and(|o| o.ours)
        })
        .count();

    let mut next = PolicyState::default();
    let mut actions = Vec::new();
    let reserve = input.quotas.defaults().elastic_reserve;
    for (key, plan) in &plans {
        let g = &groups[*key];
        let observed = input.observed.get(*key);
        let cx = Cx {
            key,
            cgroup_path: &g.meta.id.cgroup_path,
            all_targets: g.identities.iter().copied().collect(),
            input,
        };
        let mut prev_ws = prev.workloads.get(*key).cloned();
        // The group the state is about is gone or was replaced: start afresh.
        if let Some(o) = observed
            && matches!(o.state, GroupState::Gone | GroupState::Replaced)
        {
            if o.state == GroupState::Gone {
                stats.groups_gone += 1;
            } else {
                stats.groups_replaced += 1;
            }
            prev_ws = None;
        }
        let released = releases.contains(*key);
        if released {
            prev_ws = None;
        }
        let (quota, liabilities) = match plan {
            Plan::Excluded(why) => {
                if let Some(o) = observed.filter(|o| o.ours) {
                    let why = if released {
                        "released by an operator".to_string()
                    } else {
                        format!("thawed because {why}")
                    };
                    let ws = thaw_only(&cx, prev_ws.as_ref(), o);
                    if let Some(ws) = reconcile(&cx, ws, Some(o), None, &why, &mut actions) {
                        next.workloads.insert(key.to_string(), ws);
                    }
                }
                continue;
            }
            Plan::Unresolved => {
                stats.fail_open += 1;
                if let Some(mut p) = prev_ws {
                    p.observed = observed.map(|o| o.state);
                    p.ours = observed.is_some_and(|o| o.ours);
                    next.workloads.insert(key.to_string(), p);
                }
                continue;
            }
            Plan::Enforce { quota, liabilities } => (quota, liabilities),
        };
        // An earlier run froze it and this one has no state of its own: adopt the freeze.
        if prev_ws.is_none()
            && !released
            && let Some(o) = observed.filter(|o| o.ours)
        {
            stats.adopted += 1;
            prev_ws = Some(adopt(&cx, quota, liabilities, o, input.now));
        }
        let mut ws = WorkloadState {
            cgroup_path: g.meta.id.cgroup_path.clone(),
            quota: quota.source.to_string(),
            frozen: prev_ws.as_ref().and_then(|p| p.frozen),
            scopes: BTreeMap::new(),
            killing: prev_ws.as_ref().and_then(|p| p.killing),
            retry: prev_ws.as_ref().and_then(|p| p.retry),
            observed: None,
            ours: false,
            suspended: prev_ws.as_ref().and_then(|p| p.suspended),
            suspend_failed: prev_ws.as_ref().and_then(|p| p.suspend_failed.clone()),
            suspension: None,
        };
        // A suspend that failed since the last step: the step falls through.
        if let Some(Suspension::Failed { cause, reason }) =
            observed.and_then(|o| o.suspension.as_ref())
            && ws.suspended.is_some()
        {
            *stats.suspend_fallthroughs.entry(cause.clone()).or_default() += 1;
            ws.suspended = None;
            ws.suspend_failed = Some(format!("{cause}: {reason}"));
            if ws
                .retry
                .is_some_and(|r| r.transition == Transition::Suspend)
            {
                ws.retry = None;
            }
        }
        let dev_usage = usage_of(key);
        let scope_targets = |scope: GpuScope| -> Vec<ProcessIdentity> {
            let set: BTreeSet<ProcessIdentity> = dev_usage
                .iter()
                .filter(|(dev, _)| scope == GpuScope::All || scope == GpuScope::Gpu(**dev))
                .flat_map(|(_, d)| d.procs.iter().copied())
                .collect();
            set.into_iter().collect()
        };
        // The reason a freeze is wanted, from the liability that holds it.
        let mut freeze_reason: Option<(GpuScope, u64, u64, String)> = None;
        for l in liabilities {
            let prev_ss = prev_ws.as_ref().and_then(|p| p.scopes.get(&l.scope));
            let ok_state = |usage| ScopeState {
                status: Status::Ok,
                over_since: None,
                steps_taken: 0,
                usage,
                limit: l.limit,
                mode: l.enforcement.mode,
                without_suspend: Status::Ok,
            };
            if l.over {
                stats.over_quota += 1;
            }
            if l.unknown {
                stats.fail_open += 1;
                let kept = prev_ss.cloned().map_or(ok_state(None), |mut s| {
                    s.usage = None;
                    s
                });
                ws.scopes.insert(l.scope, kept);
                continue;
            }
            if !l.liable {
                ws.scopes.insert(l.scope, ok_state(Some(l.usage)));
                continue;
            }
            let ladder = &l.enforcement.ladder;
            let (since, mut taken) = match prev_ss {
                Some(ScopeState {
                    over_since: Some(since),
                    steps_taken,
                    ..
                }) => (*since, (*steps_taken).min(ladder.len())),
                _ => (input.now, 0),
            };
            let elapsed = input.now.saturating_sub(since);
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
            if let Some((dev, free)) = l.pressure {
                reason += &format!(
                    ", and GPU {dev} has {} free, below the {} reserve",
                    ByteSize(free).approx(),
                    ByteSize(reserve).approx()
                );
            }
            reason += &format!("; {}", quota.source);
            while !released && taken < ladder.len() {
                let step = ladder[taken];
                if elapsed < l.enforcement.grace.max(step.after)
                    || (input.observe_only && step.action != StepAction::Alert)
                {
                    break;
                }
                taken += 1;
                let (kind, targets) = match step.action {
                    StepAction::Alert => (ActionKind::Alert, scope_targets(l.scope)),
                    StepAction::Signal(_) if ws.frozen.is_some() => continue,
                    StepAction::Signal(sig) => (ActionKind::Signal(sig), scope_targets(l.scope)),
                    StepAction::Freeze => {
                        if ws.frozen.is_none() {
                            ws.frozen = Some(l.scope);
                        }
                        continue; // issued by reconciliation below
                    }
                    StepAction::Suspend => {
                        // A suspend that failed in this episode falls through: the ladder goes on.
                        if ws.suspend_failed.is_none() && ws.suspended.is_none() {
                            ws.suspended = Some(l.scope);
                        }
                        continue; // issued by reconciliation below
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
                        (ActionKind::Kill(sig), cx.all_targets.clone())
                    }
                };
                actions.push(cx.act(
                    l.scope,
                    kind,
                    targets,
                    Some(l.usage),
                    Some(l.limit),
                    reason.clone(),
                ));
            }
            if ws.frozen == Some(l.scope) || (ws.frozen.is_some() && freeze_reason.is_none()) {
                freeze_reason = Some((l.scope, l.usage, l.limit, reason.clone()));
            }
            // The last step that took effect (a suspend that fell through did not).
            let position = |skip_suspend: bool| {
                let effective = ladder[..taken]
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
            };
            let status = position(ws.suspend_failed.is_some());
            let without_suspend = position(true);
            ws.scopes.insert(
                l.scope,
                ScopeState {
                    status,
                    over_since: Some(since),
                    steps_taken: taken,
                    usage: Some(l.usage),
                    limit: l.limit,
                    mode: l.enforcement.mode,
                    without_suspend,
                },
            );
        }
        // Which liability holds the desired freeze (or none does any more).
        let mut thaw_why = None;
        // Why the liability `by` no longer holds the workload; `room`: what an elastic one that
        // is no longer liable got back.
        let no_longer = |by: GpuScope, room: &str, ladder: &str| -> String {
            let why = match liabilities.iter().find(|l| l.scope == by) {
                None => format!("its quota on {by} no longer applies"),
                Some(l) if !l.over => format!(
                    "it is back within quota: uses {} of its {} quota on {by}",
                    ByteSize(l.usage).approx(),
                    ByteSize(l.limit).approx()
                ),
                Some(l) if !l.liable => format!(
                    "{room}: uses {} of its {} quota on {by}",
                    ByteSize(l.usage).approx(),
                    ByteSize(l.limit).approx()
                ),
                Some(_) => ladder.to_string(),
            };
            format!("thawed because {why}; {}", quota.source)
        };
        if let Some(by) = ws.suspended {
            let holding: Vec<GpuScope> = ws
                .scopes
                .iter()
                .filter(|(_, s)| matches!(s.status, Status::Suspended | Status::Killed))
                .map(|(scope, _)| *scope)
                .collect();
            if holding.is_empty() {
                thaw_why = Some(no_longer(
                    by,
                    "the GPU has room for it again",
                    "its ladder no longer suspends",
                ));
                ws.suspended = None;
            } else if !holding.contains(&by) {
                ws.suspended = Some(holding[0]);
            }
        }
        if ws.scopes.values().all(|s| s.status == Status::Ok) {
            // A new episode gets its suspend step back.
            ws.suspend_failed = None;
        }
        if let Some(frozen_by) = ws.frozen {
            let holding: Vec<GpuScope> = ws
                .scopes
                .iter()
                .filter(|(_, s)| {
                    matches!(
                        s.status,
                        Status::Frozen | Status::Suspended | Status::Killed
                    )
                })
                .map(|(scope, _)| *scope)
                .collect();
            if holding.is_empty() {
                thaw_why = Some(no_longer(
                    frozen_by,
                    "GPU memory pressure is gone, so it may borrow again",
                    "its ladder no longer freezes",
                ));
                ws.frozen = None;
            } else if !holding.contains(&frozen_by) {
                ws.frozen = Some(holding[0]);
            }
        }
        if released {
            thaw_why = Some(
                "released by an operator; its ladder starts again from the grace period".into(),
            );
        }
        // A kill step still in progress: SIGKILL when its signal was not enough, as long as the
        // liability is still liable (a process that handled the signal by shrinking has complied).
        if let Some(k) = ws.killing {
            let l = liabilities.iter().find(|l| l.scope == k.scope);
            let complied = l.is_some_and(|l| !l.unknown && !l.liable) || l.is_none();
            if released || complied {
                ws.killing = None;
            } else if let Some(l) = l.filter(|l| !l.unknown && !input.observe_only) {
                let since = k.sigkill_at.unwrap_or(k.since);
                if input.now.saturating_sub(since) >= KILL_GRACE {
                    ws.killing = Some(Killing {
                        sigkill_at: Some(input.now),
                        ..k
                    });
                    actions.push(cx.act(
                        k.scope,
                        ActionKind::Kill(Signal::KILL),
                        cx.all_targets.clone(),
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
        // Whether the liability holding the freeze is known this step: a freeze (first or again)
        // is only issued on good data.
        let known = ws.frozen.is_some_and(|scope| {
            liabilities
                .iter()
                .any(|l| l.scope == scope && !l.unknown && l.liable)
        });
        let why = thaw_why.unwrap_or_else(|| {
            freeze_reason
                .map(|(_, _, _, r)| r)
                .unwrap_or_else(|| format!("{}", quota.source))
        });
        let usage_limit = ws.frozen.and_then(|scope| {
            liabilities
                .iter()
                .find(|l| l.scope == scope)
                .map(|l| (l.usage, l.limit))
        });
        // Wanted frozen and asked for at the last step, and now neither frozen nor asked to be:
        // someone else wrote the thaw (the agent never does while it wants the group frozen).
        let external_thaw = observed.is_some_and(|o| o.ours && o.state == GroupState::Thawed)
            && prev.workloads.get(*key).is_some_and(|p| {
                p.frozen.is_some()
                    && (p.ours || p.retry.is_some_and(|r| r.transition == Transition::Freeze))
            });
        let why = if external_thaw {
            stats.external_thaws += 1;
            if ws.frozen.is_some() {
                format!("thawed behind the agent's back, freezing it again: {why}")
            } else {
                format!("thawed behind the agent's back: {why}")
            }
        } else {
            why
        };
        // Suspension first: while a suspend or resume runs, or the workload is suspended, the
        // suspension owns the group's freeze (a frozen process could not be locked).
        let suspend_on = ws.suspended.and_then(|scope| {
            liabilities
                .iter()
                .find(|l| l.scope == scope && !l.unknown && l.liable)
                .map(|l| {
                    let footprint: BTreeMap<u32, u64> = dev_usage
                        .iter()
                        .filter(|(d, _)| scope == GpuScope::All || scope == GpuScope::Gpu(**d))
                        .map(|(d, u)| (*d, u.bytes))
                        .collect();
                    (l.usage, l.limit, footprint)
                })
        });
        let owned = reconcile_suspension(
            &cx,
            &mut ws,
            observed,
            suspend_on,
            dev_usage,
            &why,
            &mut actions,
        );
        let carried = if owned {
            ws.observed = observed.map(|o| o.state);
            ws.ours = observed.is_some_and(|o| o.ours);
            Some(ws)
        } else {
            reconcile(
                &cx,
                ws,
                observed,
                known.then_some(usage_limit),
                &why,
                &mut actions,
            )
        };
        if let Some(ws) = carried
            && (!ws.scopes.is_empty()
                || ws.frozen.is_some()
                || ws.ours
                || ws.suspended.is_some()
                || ws.suspension.is_some())
        {
            next.workloads.insert(key.to_string(), ws);
        }
    }

    // Workloads with no GPU processes left (or known only from an earlier run's freezes).
    let trustworthy = !blind && degraded.is_empty();
    let mut orphans: BTreeSet<&str> = prev
        .workloads
        .keys()
        .map(String::as_str)
        .filter(|k| !groups.contains_key(*k))
        .collect();
    orphans.extend(
        input
            .observed
            .keys()
            .filter(|k| !groups.contains_key(k.as_str()))
            .map(String::as_str),
    );
    for key in orphans {
        let observed = input.observed.get(key);
        let prev_ws = prev.workloads.get(key);
        match observed.map(|o| o.state) {
            Some(GroupState::Gone) => stats.groups_gone += 1,
            Some(GroupState::Replaced) => stats.groups_replaced += 1,
            _ => {}
        }
        let Some(o) = observed.filter(|o| o.ours) else {
            continue; // not a group the agent froze: nothing to undo, state dropped
        };
        let cx = Cx {
            key,
            cgroup_path: &o.cgroup_path,
            all_targets: Vec::new(),
            input,
        };
        let released = releases.contains(key);
        let ws = thaw_only(&cx, prev_ws, o);
        if !released && !trustworthy {
            // Its processes may only be unseen: keep the freeze until the data is good.
            let mut ws = ws;
            ws.frozen = ws.frozen.or(o.frozen_by).or(Some(GpuScope::All));
            ws.observed = Some(o.state);
            ws.ours = true;
            next.workloads.insert(key.to_string(), ws);
            continue;
        }
        let why = if released {
            "released by an operator".to_string()
        } else {
            "it has no GPU processes left; thawing its cgroup so nothing stays frozen".to_string()
        };
        if let Some(ws) = reconcile(&cx, ws, Some(o), None, &why, &mut actions) {
            next.workloads.insert(key.to_string(), ws);
        }
    }

    Outcome {
        state: next,
        actions,
        stats,
    }
}

/// What one workload's actions share.
struct Cx<'a> {
    key: &'a str,
    cgroup_path: &'a str,
    all_targets: Vec<ProcessIdentity>,
    input: &'a PolicyInput<'a>,
}

impl Cx<'_> {
    fn act(
        &self,
        gpu: GpuScope,
        kind: ActionKind,
        targets: Vec<ProcessIdentity>,
        usage: Option<u64>,
        limit: Option<u64>,
        reason: String,
    ) -> Action {
        Action {
            workload: self.key.to_string(),
            cgroup_path: self.cgroup_path.to_string(),
            gpu,
            kind,
            targets,
            usage,
            limit,
            reason,
            dry_run: self.input.dry_run,
            attempt: 1,
            footprint: BTreeMap::new(),
        }
    }
}

/// Compares what the workload's state wants (suspended or not) with its observed suspension, and
/// issues the Suspend or Resume that closes the gap. A suspend is not retried when it fails (it
/// falls through, see [`evaluate`]); a resume is, with backoff. Returns whether the suspension owns
/// the group's freeze at this step (a job runs, the workload is suspended, or a suspend is
/// wanted): the freeze reconciliation then stays out of its way.
fn reconcile_suspension(
    cx: &Cx,
    ws: &mut WorkloadState,
    observed: Option<&ObservedGroup>,
    suspend_on: Option<(u64, u64, BTreeMap<u32, u64>)>,
    dev_usage: &BTreeMap<u32, DevUsage>,
    why: &str,
    actions: &mut Vec<Action>,
) -> bool {
    let now = cx.input.now;
    ws.suspension = observed
        .and_then(|o| o.suspension.clone())
        .filter(|s| !matches!(s, Suspension::Failed { .. }));
    let due = |ws: &WorkloadState, t: Transition| {
        ws.retry
            .filter(|r| r.transition == t)
            .is_none_or(|r| now >= r.next_at)
    };
    let issue =
        |ws: &mut WorkloadState, t: Transition, mut a: Action, actions: &mut Vec<Action>| {
            let attempts = ws
                .retry
                .filter(|r| r.transition == t)
                .map_or(0, |r| r.attempts)
                + 1;
            a.attempt = attempts;
            if attempts > 1 {
                a.reason = format!("attempt {attempts}: {}", a.reason);
            }
            actions.push(a);
            ws.retry = Some(Retry {
                transition: t,
                attempts,
                next_at: now + backoff(attempts),
            });
        };
    match (&ws.suspension, ws.suspended) {
        (Some(Suspension::InProgress { .. }), _) => true,
        (Some(Suspension::Suspended { .. }), Some(_)) => {
            if ws
                .retry
                .is_some_and(|r| matches!(r.transition, Transition::Suspend | Transition::Resume))
            {
                ws.retry = None;
            }
            true
        }
        (Some(Suspension::Suspended { per_gpu }), None) => {
            // A restore without room on the GPU fails and can leave the process unrestorable on
            // real drivers (cuda-checkpoint#44): wait until every GPU has room for its share. What
            // NVML already lists for it is its own memory back (a resume that restored but could
            // not unlock): that much needs no room again.
            let room = per_gpu.iter().all(|(dev, bytes)| {
                let back = dev_usage.get(dev).map_or(0, |u| u.listed);
                cx.input
                    .sample
                    .devices
                    .iter()
                    .find(|d| d.index == *dev)
                    .is_some_and(|d| d.memory_free.saturating_add(back) >= *bytes)
            });
            if room && due(ws, Transition::Resume) {
                let scope = observed.and_then(|o| o.frozen_by).unwrap_or(GpuScope::All);
                let total = per_gpu.values().sum();
                let a = cx.act(
                    scope,
                    ActionKind::Resume,
                    cx.all_targets.clone(),
                    Some(total),
                    None,
                    why.replace("thawed because", "resumed because"),
                );
                issue(ws, Transition::Resume, a, actions);
            }
            true
        }
        (_, Some(scope)) => {
            if cx.input.dry_run
                && ws
                    .retry
                    .is_some_and(|r| r.transition == Transition::Suspend)
            {
                return true; // reported once
            }
            let Some((usage, limit, footprint)) = suspend_on.filter(|_| !cx.input.observe_only)
            else {
                return false; // unknown data (or observe only): the freeze stays as it is
            };
            if due(ws, Transition::Suspend) {
                let mut a = cx.act(
                    scope,
                    ActionKind::Suspend,
                    cx.all_targets.clone(),
                    Some(usage),
                    Some(limit),
                    why.to_string(),
                );
                a.footprint = footprint;
                issue(ws, Transition::Suspend, a, actions);
            }
            true
        }
        (_, None) => false,
    }
}

/// A state that wants the workload thawed (excluded, released, or without processes).
fn thaw_only(cx: &Cx, prev: Option<&WorkloadState>, o: &ObservedGroup) -> WorkloadState {
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
    }
}

/// A state for a workload an earlier run froze: as if its freeze step had fired at the right time,
/// on each liability whose ladder freezes (so earlier steps do not fire again).
fn adopt(
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
    }
}

/// Compares what the workload's state wants (frozen or not) with what the kernel reported, and
/// issues the Freeze or Thaw that closes the gap, with backoff for one that did not take. A freeze
/// is issued only when `freeze_on` carries the holding liability's (usage, limit) (good data).
/// Returns the state to carry, `None` when the workload can be forgotten.
fn reconcile(
    cx: &Cx,
    mut ws: WorkloadState,
    observed: Option<&ObservedGroup>,
    freeze_on: Option<Option<(u64, u64)>>,
    why: &str,
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
        Transition::Freeze
    } else {
        Transition::Thaw
    };
    // In a dry run nothing is written: a transition reported once counts as done.
    let reported = cx.input.dry_run && ws.retry.is_some_and(|r| r.transition == transition);
    let settled = reported || if want_frozen { in_kernel_frozen } else { !ours };
    if settled {
        if !cx.input.dry_run {
            ws.retry = None;
        }
        let keep = want_frozen || ours || !ws.scopes.is_empty() || ws.killing.is_some();
        return keep.then_some(ws);
    }
    let retry = ws.retry.filter(|r| r.transition == transition);
    let due = retry.is_none_or(|r| now >= r.next_at);
    let (kind, usage, limit) = match transition {
        Transition::Freeze => {
            let Some(ul) = freeze_on.filter(|_| !cx.input.observe_only) else {
                // Unknown data (or observe only): neither a first freeze nor a retry.
                return Some(ws);
            };
            (ActionKind::Freeze, ul.map(|u| u.0), ul.map(|u| u.1))
        }
        _ => (ActionKind::Thaw, None, None),
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
            .unwrap_or(GpuScope::All);
        let mut a = cx.act(scope, kind, cx.all_targets.clone(), usage, limit, reason);
        a.attempt = attempts;
        actions.push(a);
        ws.retry = Some(Retry {
            transition,
            attempts,
            next_at: now + backoff(attempts),
        });
    }
    Some(ws)
}

/// Excluded, unresolved or liable with its liabilities, for every workload with processes.
fn plan_workloads<'a>(
    input: &PolicyInput,
    groups: &'a BTreeMap<&str, Group>,
    usage: &BTreeMap<&str, BTreeMap<u32, DevUsage>>,
    degraded: &BTreeSet<u32>,
    blind: bool,
    stats: &mut Stats,
) -> BTreeMap<&'a str, Plan> {
    let sample = input.sample;
    let empty = BTreeMap::new();
    let mut plans: BTreeMap<&str, Plan> = BTreeMap::new();
    for (key, g) in groups {
        stats.workloads += 1;
        let meta = g.meta;
        let protected = meta.id.kind == WorkloadKind::Host
            || input
                .agent_pid
                .is_some_and(|pid| g.identities.iter().any(|i| i.pid == pid))
            || input.quotas.is_protected(meta)
            || (meta.id.kind == WorkloadKind::Cgroup && !input.quotas.named_by_file(meta));
        if protected {
            stats.protected += 1;
            plans.insert(key, Plan::Excluded("it is protected"));
            continue;
        }
        let Some(quota) = input.quotas.resolve(meta, g.env) else {
            stats.unquota += 1;
            plans.insert(key, Plan::Excluded("no quota covers it any more"));
            continue;
        };
        let dev_usage = usage.get(key).unwrap_or(&empty);
        let mut scopes: Vec<(GpuScope, &crate::quota::Limit)> = Vec::new();
        let mut unresolved = false;
        for limit in &quota.limits {
            let scope = match &limit.scope {
                LimitScope::AllGpusTotal => Some(GpuScope::All),
                LimitScope::Device(DeviceRef::Index(i)) => Some(GpuScope::Gpu(*i)),
                LimitScope::Device(DeviceRef::Uuid(u)) => {
                    let found = sample
                        .devices
                        .iter()
                        .find(|d| d.uuid == *u)
                        .map(|d| d.index)
                        .or_else(|| {
                            sample
                                .processes
                                .iter()
                                .find(|p| p.device_uuid == *u)
                                .map(|p| p.device_index)
                        });
                    if found.is_none() && (blind || !degraded.is_empty()) {
                        unresolved = true;
                    }
                    found.map(GpuScope::Gpu)
                }
                LimitScope::EachGpu => None,
            };
            if let Some(scope) = scope
                && !scopes.iter().any(|(s, _)| *s == scope)
            {
                scopes.push((scope, limit));
            }
        }
        for limit in quota
            .limits
            .iter()
            .filter(|l| l.scope == LimitScope::EachGpu)
        {
            for dev in dev_usage.keys() {
                let scope = GpuScope::Gpu(*dev);
                if !scopes.iter().any(|(s, _)| *s == scope) {
                    scopes.push((scope, limit));
                }
            }
        }
        if unresolved {
            plans.insert(key, Plan::Unresolved);
            continue;
        }
        scopes.sort_by_key(|(s, _)| *s);
        let suspended = input
            .observed
            .get(*key)
            .and_then(|o| o.suspension.as_ref())
            .and_then(Suspension::footprint)
            .is_some();
        let liabilities = scopes
            .into_iter()
            .map(|(scope, limit)| {
                let (used, unknown) = match scope {
                    GpuScope::All => (
                        dev_usage
                            .values()
                            .fold(0u64, |acc, d| acc.saturating_add(d.bytes)),
                        blind || !degraded.is_empty() || dev_usage.values().any(|d| d.unknown),
                    ),
                    GpuScope::Gpu(i) => {
                        let d = dev_usage.get(&i);
                        (
                            d.map_or(0, |d| d.bytes),
                            blind || degraded.contains(&i) || d.is_some_and(|d| d.unknown),
                        )
                    }
                };
                let threshold = limit
                    .bytes
                    .saturating_add(limit.enforcement.tolerance.allowance(limit.bytes));
                let over = !unknown && used > threshold;
                Liability {
                    scope,
                    limit: limit.bytes,
                    enforcement: limit.enforcement.clone(),
                    usage: used,
                    unknown,
                    over,
                    liable: over && limit.enforcement.mode == Mode::Strict,
                    pressure: None,
                    suspended,
                }
            })
            .collect();
        plans.insert(key, Plan::Enforce { quota, liabilities });
    }
    plans
}

/// Elastic: on each GPU under pressure, take the largest borrowers until the shortfall is covered.
fn apply_elastic_pressure(
    input: &PolicyInput,
    plans: &mut BTreeMap<&str, Plan>,
    usage: &BTreeMap<&str, BTreeMap<u32, DevUsage>>,
) {
    let sample = input.sample;
    let reserve = input.quotas.defaults().elastic_reserve;
    let on = |key: &str, dev: u32| {
        usage
            .get(key)
            .and_then(|u| u.get(&dev))
            .map_or((0, 0), |d| (d.bytes, d.listed))
    };
    for dev in &sample.devices {
        if !sample.device_ok(dev.index) {
            continue;
        }
        // Suspended borrowers come back smallest first, and only while the GPU keeps its
        // reserve with them back (free >= footprint + reserve): suspended largest first, resumed
        // last. The others stay suspended (liable). What NVML already lists for one is back on
        // the GPU (a resume that restored but did not finish): only the rest needs room.
        let mut projected = dev.memory_free;
        let mut suspended: Vec<(u64, u64, &str, GpuScope)> = Vec::new();
        for (key, plan) in plans.iter() {
            let Plan::Enforce { liabilities, .. } = plan else {
                continue;
            };
            for l in liabilities
                .iter()
                .filter(|l| l.suspended && l.over && l.enforcement.mode == Mode::Elastic)
            {
                let (fp, listed) = on(key, dev.index);
                let applies = match l.scope {
                    GpuScope::Gpu(i) => i == dev.index,
                    GpuScope::All => fp > 0,
                };
                if applies {
                    suspended.push((fp, fp.saturating_sub(listed), *key, l.scope));
                }
            }
        }
        suspended.sort();
        for (_, missing, key, scope) in suspended {
            if projected >= missing.saturating_add(reserve) {
                projected -= missing;
                continue;
            }
            if let Some(Plan::Enforce { liabilities, .. }) = plans.get_mut(key)
                && let Some(l) = liabilities.iter_mut().find(|l| l.scope == scope)
                && !l.liable
            {
                l.liable = true;
                l.pressure = Some((dev.index, dev.memory_free));
            }
        }
        if projected >= reserve {
            continue;
        }
        let mut candidates: Vec<(u64, &str, GpuScope)> = Vec::new();
        for (key, plan) in plans.iter() {
            let Plan::Enforce { liabilities, .. } = plan else {
                continue;
            };
            for l in liabilities {
                if l.enforcement.mode != Mode::Elastic || !l.over || l.suspended {
                    continue;
                }
                let borrowed = l.usage - l.limit;
                let on_dev = usage
                    .get(key)
                    .and_then(|u| u.get(&dev.index))
                    .map_or(0, |d| d.bytes);
                let share = match l.scope {
                    GpuScope::Gpu(i) if i == dev.index => borrowed,
                    GpuScope::All if on_dev > 0 => borrowed.min(on_dev),
                    _ => continue,
                };
                candidates.push((share, *key, l.scope));
            }
        }
        candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)).then(a.2.cmp(&b.2)));
        for (share, key, scope) in candidates {
            if projected >= reserve {
                break;
            }
            projected = projected.saturating_add(share);
            if let Some(Plan::Enforce { liabilities, .. }) = plans.get_mut(key)
                && let Some(l) = liabilities.iter_mut().find(|l| l.scope == scope)
                && !l.liable
            {
                l.liable = true;
                l.pressure = Some((dev.index, dev.memory_free));
            }
        }
    }
}
