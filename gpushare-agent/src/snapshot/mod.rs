//! The agent's state as readers see it: an immutable snapshot published after each step to the
//! HTTP API, `/metrics` and `status`. Readers never reach back upstream.
//!
//! [`Publisher::build`] turns what one step observed and decided ([`StepReport`]) into a
//! [`Snapshot`]; it keeps what reports need across steps (how long a row has been in its state,
//! monotonic ioctl totals) and the last snapshot's rows. A row (GPU, workload, process) whose
//! fields are the same as in the last snapshot is that row, shared (`Arc`), not a copy: a step
//! on a steady node allocates no row. What changes every step, how long a workload has been in
//! its state, is kept beside its shared row ([`WorkloadEntry`]).
//!
//! A workload's `state` is what the kernel says about its root group (see
//! [`crate::policy::WorkloadState::reported`]): `frozen` only while the kernel reports the
//! group frozen.

use std::{
    collections::BTreeMap,
    ops::{Deref, DerefMut},
    sync::{Arc, RwLock},
};

use crate::{
    attribution::{Attribution, names::NameCache},
    policy::{AttributedProcess, PolicyState},
    quota::QuotaSet,
    sample::GpuSample,
    verify::{GrantVerdict, MechanismCheck},
};

mod counters;
mod publish;
#[cfg(test)]
mod tests;
mod timings;

pub use counters::{
    ActionCounts, ActionResult, ApiCounters, Counters, EventCounters, KubeCounters, Tally,
};
pub use publish::Publisher;
pub use timings::{Observations, Timings};

/// The latest snapshot, shared between the agent loop (its one writer) and the readers.
pub type SharedSnapshot = Arc<RwLock<Arc<Snapshot>>>;

/// The latest published snapshot (an empty one if a writer panicked while holding the lock).
pub fn latest(shared: &SharedSnapshot) -> Arc<Snapshot> {
    shared.read().map(|s| Arc::clone(&s)).unwrap_or_default()
}

/// Everything a reader can ask about.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// Seconds since the epoch when it was built.
    pub taken_at_unix: f64,
    /// Agent version.
    pub version: String,
    /// Readiness and degraded modes.
    pub health: Health,
    /// GPUs.
    pub gpus: Vec<Arc<GpuView>>,
    /// Workloads with GPU processes or quotas, by workload key and GPU UUID.
    pub workloads: Vec<WorkloadEntry>,
    /// GPU processes.
    pub processes: Vec<Arc<ProcessView>>,
    /// Memory NVML reports for processes no workload could be found for, per GPU UUID.
    pub unattributed_bytes: BTreeMap<String, u64>,
    /// Monotonic totals since the agent started.
    pub counters: Counters,
    /// How long things took since the agent started (`/metrics` only: not in the JSON).
    #[serde(skip)]
    pub timings: Timings,
    /// The effective quotas, for `check`-like listings.
    pub quotas: Arc<[QuotaView]>,
    /// Driver-enforced limits on the groups of workloads under a quota: the agent's, and those
    /// someone else set (left as they are).
    #[serde(default)]
    pub driver_limits: Arc<[DriverLimitView]>,
    /// Each grant (a workload's limit on one GPU), the mechanisms that claim it and its verdict
    /// ([`crate::verify`]), by workload key and GPU UUID.
    #[serde(default)]
    pub grants: Arc<[GrantView]>,
}

/// One grant proven held, or not ([`crate::verify`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GrantView {
    /// The workload's key.
    pub workload: String,
    /// The GPU.
    pub gpu_uuid: String,
    /// The grant, bytes.
    pub grant_bytes: u64,
    /// Usage on the GPU, bytes.
    pub used_bytes: u64,
    /// The verdict.
    pub verdict: GrantVerdict,
    /// Each mechanism listed, with its state and why.
    pub mechanisms: Vec<MechanismCheck>,
}

impl Snapshot {
    /// How many grants have each verdict (every verdict, zeros included).
    pub fn verdict_counts(&self) -> [(GrantVerdict, u64); 3] {
        GrantVerdict::ALL.map(|v| {
            (
                v,
                self.grants.iter().filter(|g| g.verdict == v).count() as u64,
            )
        })
    }
}

/// One driver-enforced GPU memory limit on one cgroup and GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DriverLimitView {
    /// GPU UUID.
    pub gpu_uuid: String,
    /// The cgroup (path relative to the v2 root).
    pub cgroup_path: String,
    /// Soft limit, bytes (0: none).
    pub soft_bytes: u64,
    /// Hard limit, bytes (`u64::MAX`: none).
    pub hard_bytes: u64,
    /// `agent` (set by this agent) or `other` (set by someone else: NVIDIA's container hook, an
    /// operator; never changed by the agent).
    pub source: String,
}

/// Readiness and degraded modes.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Health {
    /// Programs loaded (or the /proc fallback chosen) and the first sample done.
    pub ready: bool,
    /// `ebpf` or `procfs`.
    pub attribution: String,
    /// `ready`, or `no_driver`.
    pub nvml: String,
    /// Human-readable reasons the agent is degraded (empty when it is not).
    pub degraded: Vec<String>,
    /// Whether enforcement only reports (`--dry-run`).
    pub dry_run: bool,
    /// Whether no operator configuration is in force (invalid at start, none kept): alerts and
    /// metrics only, no signal, freeze or kill.
    #[serde(default)]
    pub observe_only: bool,
    /// Whether the `suspend` step can be used: `available`, or why not.
    #[serde(default)]
    pub suspend: String,
}

/// One GPU.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpuView {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Total memory, bytes.
    pub memory_total_bytes: u64,
    /// Used memory, bytes.
    pub memory_used_bytes: u64,
    /// Free memory, bytes.
    pub memory_free_bytes: u64,
    /// Whether the last sample read it completely.
    pub healthy: bool,
    /// How quotas are enforced on it: `soft` (the agent's ladder), or `driver_limits` (also the
    /// driver's per-cgroup limits, r615+).
    #[serde(default)]
    pub isolation_backend: String,
    /// Share of NVML's last sample period with a kernel running, 0-1; absent where NVML does not
    /// report it (not supported, MIG).
    #[serde(default)]
    pub utilization: Option<f64>,
    /// Share of that period with device memory being read or written, 0-1; absent likewise.
    #[serde(default)]
    pub memory_utilization: Option<f64>,
    /// Whether NVML reports per-process utilization for it (false: not supported, MIG, or the
    /// read failed; the per-process and per-workload values are then absent).
    #[serde(default)]
    pub process_utilization: bool,
    /// Temperature, degrees C (read with `--compat dcgm`).
    #[serde(default)]
    pub temperature_celsius: Option<u32>,
    /// Power draw, watts (read with `--compat dcgm`).
    #[serde(default)]
    pub power_watts: Option<f64>,
    /// SM clock, MHz (read with `--compat dcgm`).
    #[serde(default)]
    pub sm_clock_mhz: Option<u32>,
    /// The driver's memory allowed beyond every quota on it, once per workload (a CUDA context),
    /// bytes.
    #[serde(default)]
    pub context_overhead_bytes: u64,
    /// Where that figure comes from: `learned` (the smallest process seen on this model), `set`
    /// (the quota file), `learning` (not enough small processes seen yet) or `none`.
    #[serde(default)]
    pub context_overhead_source: String,
}

/// One workload on one GPU (or on all GPUs, for an all-GPU quota): everything but how long it
/// has been in its state (see [`WorkloadEntry`]).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct WorkloadView {
    /// Stable key, e.g. `docker://<id>`.
    pub workload: String,
    /// Short human name.
    pub name: String,
    /// cgroup v2 path.
    pub cgroup_path: String,
    /// Kubernetes namespace, when known.
    pub namespace: String,
    /// Kubernetes pod name (or UID when the name is unknown), when in a pod.
    pub pod: String,
    /// Container name, when known.
    pub container: String,
    /// Container id, when a container.
    pub container_id: String,
    /// GPU UUID, or `all`.
    pub gpu_uuid: String,
    /// Used bytes (summed over the workload's processes on that GPU).
    pub used_bytes: u64,
    /// Quota bytes, when a quota applies.
    pub quota_bytes: Option<u64>,
    /// Where the quota comes from (`file:line`, `env:ALIYUN_COM_GPU_MEM_CONTAINER`, ...).
    pub quota_source: String,
    /// How far that source is trusted: `file`, `runtime_spec` or `init_environ` (empty without a
    /// quota).
    #[serde(default)]
    pub quota_trust: String,
    /// Isolation state as the kernel has it (`ok`, `over_quota`, `alerted`, `signalled`,
    /// `freezing`, `frozen`, `killing`).
    pub state: String,
    /// What is in progress, in words (a freeze that has not settled, a thaw being retried), or
    /// empty.
    #[serde(default)]
    pub detail: String,
    /// GPU memory of the workload held in host memory while it is suspended, bytes.
    #[serde(default)]
    pub suspended_bytes: u64,
    /// Share of time the workload's processes kept the GPU's SMs busy, summed over them (capped
    /// at 1), over the GPU's last per-process sample window; absent where unknown (not supported,
    /// MIG, only processes that may not have held their pid for the window) and on `all` rows.
    #[serde(default)]
    pub utilization: Option<f64>,
    /// The same for the memory controller.
    #[serde(default)]
    pub memory_utilization: Option<f64>,
    /// What its identity rests on: `runtime` (its runtime's record names its group), `degraded`
    /// (its runtime's place alone: no record could be read), `conflict` (two groups claimed one
    /// identity; this is a plain cgroup now); empty for units and plain cgroups.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
    /// Groups below its root named like containers or pods (nested containers: part of this
    /// workload, under its quota).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nested: Vec<String>,
    /// Processes of the workload on that GPU.
    pub pids: Vec<u32>,
    /// ioctls of the workload's GPU tasks.
    pub ioctls: u64,
}

/// One GPU process on one GPU.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProcessView {
    /// pid.
    pub pid: u32,
    /// comm.
    pub comm: String,
    /// Workload key, or empty when unattributed.
    pub workload: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// Used bytes, when NVML knows.
    pub used_bytes: Option<u64>,
    /// SM utilization over the GPU's last sample window, 0-1 (0: no sample, idle); absent where
    /// unknown.
    #[serde(default)]
    pub utilization: Option<f64>,
    /// Memory-controller utilization likewise.
    #[serde(default)]
    pub memory_utilization: Option<f64>,
}

/// One effective quota.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QuotaView {
    /// Where it comes from.
    pub source: String,
    /// What it selects.
    pub selector: String,
    /// GPU scope.
    pub gpu: String,
    /// Bytes.
    pub gpu_memory_bytes: u64,
}

/// What a workload's identity rests on and the containers nested in it, as the agent found them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdentityNote {
    /// `runtime`, `degraded`, `conflict`, or empty (a unit or a plain cgroup claims no runtime
    /// identity).
    pub identity: &'static str,
    /// Groups below the root shaped like containers or pods: part of this workload.
    pub nested: Vec<String>,
}

/// What one step observed and decided, borrowed for [`Publisher::build`].
pub struct StepReport<'a> {
    /// The sample.
    pub sample: &'a GpuSample,
    /// The task table.
    pub table: &'a Attribution,
    /// The policy's view of the tasks (workloads at their roots).
    pub processes: &'a [AttributedProcess],
    /// The policy state after the step.
    pub policy: &'a PolicyState,
    /// Names of workloads.
    pub names: &'a NameCache,
    /// How far each workload's quota source is trusted (`file`, `runtime_spec`, `init_environ`).
    pub quota_trust: &'a foldhash::HashMap<String, &'static str>,
    /// What each workload's identity rests on, and its nested containers.
    pub identity: &'a foldhash::HashMap<String, IdentityNote>,
    /// Health: readiness and degraded modes.
    pub health: Health,
    /// Monotonic totals kept by the agent (this builder adds the ioctl totals).
    pub counters: Counters,
    /// How long things took, as the agent measured them.
    pub timings: Timings,
    /// The quota set in force, and a number that changes whenever it is replaced (its views
    /// are rebuilt only then).
    pub quotas: (&'a QuotaSet, u64),
    /// Time since the agent started (the policy's clock).
    pub now: std::time::Duration,
    /// The isolation back end per GPU index (`soft` when absent).
    pub backends: BTreeMap<u32, &'static str>,
    /// Driver limits in force: (GPU index, cgroup, soft, hard, source).
    pub driver_limits: Vec<(u32, &'a str, u64, u64, &'static str)>,
    /// In a dry run, the workloads acted on all the same (reported as done, not as would-be).
    pub taken: &'a std::collections::BTreeSet<String>,
}

/// One workload row of a snapshot: the row, shared with the snapshots before it while none of
/// its fields changed, and how long it has been in its state (which changes every step, so is
/// kept out of the shared row). Reads as a [`WorkloadView`]; serialized as one object, with
/// `state_for_secs` among the row's fields as it always was.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadEntry {
    /// The row.
    pub row: Arc<WorkloadView>,
    /// Seconds in its state.
    pub state_for_secs: f64,
}

impl From<WorkloadView> for WorkloadEntry {
    fn from(row: WorkloadView) -> Self {
        Self {
            row: Arc::new(row),
            state_for_secs: 0.0,
        }
    }
}

impl Deref for WorkloadEntry {
    type Target = WorkloadView;

    fn deref(&self) -> &WorkloadView {
        &self.row
    }
}

/// A change through an entry changes its own copy of the row (never a row another snapshot
/// shares).
impl DerefMut for WorkloadEntry {
    fn deref_mut(&mut self) -> &mut WorkloadView {
        Arc::make_mut(&mut self.row)
    }
}

impl serde::Serialize for WorkloadEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        // Every field named (no `..`): a field added to the row fails to compile here until it
        // is serialized.
        let WorkloadView {
            workload,
            name,
            cgroup_path,
            namespace,
            pod,
            container,
            container_id,
            gpu_uuid,
            used_bytes,
            quota_bytes,
            quota_source,
            quota_trust,
            state,
            detail,
            suspended_bytes,
            utilization,
            memory_utilization,
            identity,
            nested,
            pids,
            ioctls,
        } = &*self.row;
        let mut o = s.serialize_struct("WorkloadView", 22)?;
        o.serialize_field("workload", workload)?;
        o.serialize_field("name", name)?;
        o.serialize_field("cgroup_path", cgroup_path)?;
        o.serialize_field("namespace", namespace)?;
        o.serialize_field("pod", pod)?;
        o.serialize_field("container", container)?;
        o.serialize_field("container_id", container_id)?;
        o.serialize_field("gpu_uuid", gpu_uuid)?;
        o.serialize_field("used_bytes", used_bytes)?;
        o.serialize_field("quota_bytes", quota_bytes)?;
        o.serialize_field("quota_source", quota_source)?;
        o.serialize_field("quota_trust", quota_trust)?;
        o.serialize_field("state", state)?;
        o.serialize_field("detail", detail)?;
        o.serialize_field("state_for_secs", &self.state_for_secs)?;
        o.serialize_field("suspended_bytes", suspended_bytes)?;
        o.serialize_field("utilization", utilization)?;
        o.serialize_field("memory_utilization", memory_utilization)?;
        if identity.is_empty() {
            o.skip_field("identity")?;
        } else {
            o.serialize_field("identity", identity)?;
        }
        if nested.is_empty() {
            o.skip_field("nested")?;
        } else {
            o.serialize_field("nested", nested)?;
        }
        o.serialize_field("pids", pids)?;
        o.serialize_field("ioctls", ioctls)?;
        o.end()
    }
}

impl<'de> serde::Deserialize<'de> for WorkloadEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Wire {
            #[serde(flatten)]
            row: WorkloadView,
            state_for_secs: f64,
        }
        let w = Wire::deserialize(d)?;
        Ok(Self {
            row: Arc::new(w.row),
            state_for_secs: w.state_for_secs,
        })
    }
}
