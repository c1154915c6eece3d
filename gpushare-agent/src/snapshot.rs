//! The agent's state as readers see it: an immutable snapshot rebuilt after each sample and
//! published to the HTTP API, `/metrics` and `status`. Readers never reach back upstream.

use std::collections::BTreeMap;

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
    pub gpus: Vec<GpuView>,
    /// Workloads with GPU processes or quotas.
    pub workloads: Vec<WorkloadView>,
    /// GPU processes.
    pub processes: Vec<ProcessView>,
    /// Memory NVML reports for processes no workload could be found for, per GPU UUID.
    pub unattributed_bytes: BTreeMap<String, u64>,
    /// Monotonic totals since the agent started.
    pub counters: Counters,
    /// The effective quotas, for `check`-like listings.
    pub quotas: Vec<QuotaView>,
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
}

/// One GPU.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
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
}

/// One workload on one GPU (or on all GPUs, for an all-GPU quota).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
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
    /// Isolation state (`ok`, `over_quota`, `alerted`, `signalled`, `frozen`, `killed`, ...).
    pub state: String,
    /// Seconds in that state.
    pub state_for_secs: f64,
    /// Processes of the workload on that GPU.
    pub pids: Vec<u32>,
    /// ioctls of the workload's GPU tasks.
    pub ioctls: u64,
}

/// One GPU process on one GPU.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
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
}

/// One effective quota.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
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

/// Monotonic totals.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Enforcement actions by `action/result`.
    pub enforcement_actions: BTreeMap<String, u64>,
    /// Kernel events by kind.
    pub ebpf_events: BTreeMap<String, u64>,
    /// Events the kernel could not put in the ring buffer.
    pub ebpf_events_lost: u64,
    /// NVML errors by call.
    pub nvml_errors: BTreeMap<String, u64>,
    /// ioctls by workload (of live GPU tasks).
    pub gpu_ioctls: BTreeMap<String, u64>,
    /// Whether the last quota configuration loaded cleanly.
    pub quota_config_valid: bool,
    /// When the quota configuration was last (re)loaded, seconds since the epoch.
    pub quota_config_last_reload_unix: f64,
    /// Malformed environment-quota variables and unreadable runtime specs seen.
    #[serde(default)]
    pub env_quota_errors: u64,
    /// Workloads whose `ALIYUN_COM_GPU_MEM_DEV` disagrees with `gpushare_memory_unit`, and what
    /// it says.
    #[serde(default)]
    pub env_quota_unit_mismatch: BTreeMap<String, String>,
}
