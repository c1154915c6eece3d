//! What one evaluation looks at: the attributed processes, what the kernel reported about the
//! groups the agent froze or wants frozen (and their suspensions), and the scopes a liability
//! is measured over.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    sync::Arc,
    time::Duration,
};

use crate::{
    attribution::ProcessIdentity,
    quota::{EnvQuota, QuotaSet, WorkloadMeta},
    sample::GpuSample,
};

/// One verified GPU process and who it belongs to.
///
/// The workload and its key are shared (`Arc`) by every process of the workload and, in the
/// agent, across steps while the workload is unchanged: a step copies no string per process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttributedProcess {
    /// pid + start time, verified by attribution.
    pub identity: ProcessIdentity,
    /// Its workload.
    pub workload: Arc<WorkloadMeta>,
    /// The quota in its environment, if any (see [`crate::grants::env`]).
    pub env_quota: Option<EnvQuota>,
    /// `workload.key()`, built once (by [`Self::new`] or shared by [`Self::sharing`]).
    key: Arc<str>,
}

impl AttributedProcess {
    /// A process of `workload`, its key built here.
    pub fn new(
        identity: ProcessIdentity,
        workload: impl Into<Arc<WorkloadMeta>>,
        env_quota: Option<EnvQuota>,
    ) -> Self {
        let workload = workload.into();
        let key = workload.key().into();
        Self {
            identity,
            workload,
            env_quota,
            key,
        }
    }

    /// A process of `workload` whose key `key` the caller built from it (`workload.key()`), shared
    /// with the other processes of the workload.
    pub fn sharing(
        identity: ProcessIdentity,
        workload: Arc<WorkloadMeta>,
        key: Arc<str>,
        env_quota: Option<EnvQuota>,
    ) -> Self {
        debug_assert_eq!(*key, workload.key());
        Self {
            identity,
            workload,
            env_quota,
            key,
        }
    }

    /// Its workload's key (`docker://<id>`, ...), without building it.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The same, shared.
    pub fn shared_key(&self) -> &Arc<str> {
        &self.key
    }
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
    /// In a dry run, the workloads acted on all the same: those an auditor that opted in took
    /// (`[defaults] take_unheld`, [`crate::verify`]). Empty otherwise ([`NONE_TAKEN`]).
    pub taken: &'a BTreeSet<String>,
    /// The root groups of workloads the agent froze or wants frozen, by workload key, as the
    /// kernel reported them at the start of this step.
    pub observed: &'a BTreeMap<String, ObservedGroup>,
}

/// No workload taken (every input that is not an auditor's that opted in).
pub static NONE_TAKEN: BTreeSet<String> = BTreeSet::new();

impl PolicyInput<'_> {
    /// Whether the actions on `workload` only report: a dry run, unless the workload was taken.
    pub fn dry(&self, workload: &str) -> bool {
        self.dry_run && !self.taken.contains(workload)
    }
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
