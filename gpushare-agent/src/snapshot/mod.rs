//! The agent's state as readers see it: an immutable snapshot rebuilt after each step and
//! published to the HTTP API, `/metrics` and `status`. Readers never reach back upstream.
//!
//! [`Publisher::build`] turns what one step observed and decided ([`StepReport`]) into a
//! [`Snapshot`]; it keeps only what reports need across steps (how long a row has been in its
//! state, monotonic ioctl totals). A workload's `state` is what the kernel says about its root
//! group (see [`crate::policy::WorkloadState::reported`]): `frozen` only while the kernel reports
//! the group frozen.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use crate::{
    attribution::{Attribution, ProcessIdentity, names::NameCache},
    policy::{AttributedProcess, GpuScope, PolicyState, Retry},
    sample::GpuSample,
};

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
    /// Driver-enforced limits on the groups of workloads under a quota: the agent's, and those
    /// someone else set (left as they are).
    #[serde(default)]
    pub driver_limits: Vec<DriverLimitView>,
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
    /// Isolation state as the kernel has it (`ok`, `over_quota`, `alerted`, `signalled`,
    /// `freezing`, `frozen`, `killing`).
    pub state: String,
    /// What is in progress, in words (a freeze that has not settled, a thaw being retried), or
    /// empty.
    #[serde(default)]
    pub detail: String,
    /// Seconds in that state.
    pub state_for_secs: f64,
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
    /// SM utilization over the GPU's last sample window, 0-1 (0: no sample, idle); absent where
    /// unknown.
    #[serde(default)]
    pub utilization: Option<f64>,
    /// Memory-controller utilization likewise.
    #[serde(default)]
    pub memory_utilization: Option<f64>,
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
    /// Changes the agent found made behind its back, by kind (`thawed`, `gone`, `replaced`,
    /// `adopted`: an earlier run's freeze taken over).
    #[serde(default)]
    pub external_changes: BTreeMap<String, u64>,
    /// Attribution's identity checks, by kind (`exited`, `stale_identity`, `unverifiable`).
    #[serde(default)]
    pub identity: BTreeMap<String, u64>,
    /// Work attribution did whose amount processes choose, by kind (`fd_entries_read`,
    /// `cgroup_rescans`, ...: `attribution::tracker::Work`).
    #[serde(default)]
    pub attribution_work: BTreeMap<String, u64>,
    /// Malformed environment-quota variables and unreadable runtime specs seen.
    #[serde(default)]
    pub env_quota_errors: u64,
    /// Workloads whose `ALIYUN_COM_GPU_MEM_DEV` disagrees with `gpushare_memory_unit`, and what
    /// it says.
    #[serde(default)]
    pub env_quota_unit_mismatch: BTreeMap<String, String>,
    /// Workload-identity events: `conflict` (two roots claimed one container or pod identity),
    /// `record_mismatch` (a container's runtime record names another group).
    #[serde(default)]
    pub workload_identity: BTreeMap<String, u64>,
    /// Where workloads' quota variables and the devices their runtime gave disagree, or hold a
    /// value no plugin writes, by kind (`not_granted`, `other_granted`, `beyond_granted`,
    /// `no_plugin_value`).
    #[serde(default)]
    pub env_quota_disagreements: BTreeMap<String, u64>,
    /// Suspend steps that fell through, by reason.
    #[serde(default)]
    pub suspend_fallthroughs: BTreeMap<String, u64>,
    /// GPU memory moved off the GPU by suspends since the agent started, bytes.
    #[serde(default)]
    pub suspended_bytes_total: u64,
    /// The API server's reads and Events: `api_reads`, `api_errors`, `annotation_edits_ignored`,
    /// `events_created`, `events_patched`, `events_skipped` (spam filter), `events_dropped`
    /// (queue full), `events_errors`.
    #[serde(default)]
    pub kubernetes: BTreeMap<String, u64>,
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
    pub quota_trust: &'a HashMap<String, &'static str>,
    /// What each workload's identity rests on, and its nested containers.
    pub identity: &'a HashMap<String, IdentityNote>,
    /// Health: readiness and degraded modes.
    pub health: Health,
    /// Monotonic totals kept by the agent (this builder adds the ioctl totals).
    pub counters: Counters,
    /// The effective quotas.
    pub quotas: Vec<QuotaView>,
    /// Time since the agent started (the policy's clock).
    pub now: std::time::Duration,
    /// The isolation back end per GPU index (`soft` when absent).
    pub backends: BTreeMap<u32, &'static str>,
    /// Driver limits in force: (GPU index, cgroup, soft, hard, source).
    pub driver_limits: Vec<(u32, String, u64, u64, &'static str)>,
}

/// NVML's percent as a 0-1 ratio (the Prometheus convention).
fn ratio(percent: u32) -> f64 {
    f64::from(percent.min(100)) / 100.0
}

/// A workload's utilization on one GPU, summed over its processes whose value is known.
#[derive(Default)]
struct Busy {
    known: bool,
    sm: u32,
    memory: u32,
}

impl Busy {
    fn add(&mut self, u: Option<crate::sample::Utilization>) {
        if let Some(u) = u {
            self.known = true;
            self.sm += u.sm;
            self.memory += u.memory;
        }
    }

    /// (SM, memory) as ratios capped at 1 (samples of several processes can add up past the
    /// whole period); absent when no process's value is known.
    fn ratios(&self) -> (Option<f64>, Option<f64>) {
        if !self.known {
            return (None, None);
        }
        (Some(ratio(self.sm)), Some(ratio(self.memory)))
    }
}

/// Builds snapshots; remembers what reports need across steps.
#[derive(Default)]
pub struct Publisher {
    state_since: HashMap<(String, String), (String, Instant)>,
    ioctl_seen: HashMap<ProcessIdentity, (String, u64)>,
    ioctl_totals: BTreeMap<String, u64>,
}

fn detail(retry: Option<&Retry>, now: std::time::Duration) -> String {
    let Some(r) = retry else {
        return String::new();
    };
    let what = r.transition.name();
    let next = r.next_at.saturating_sub(now);
    format!(
        "{what} requested {} time(s), not done yet; next attempt in {}",
        r.attempts,
        crate::quota::fmt_duration(std::time::Duration::from_millis(next.as_millis() as u64))
    )
}

impl Publisher {
    /// The snapshot of one step.
    pub fn build(&mut self, r: StepReport) -> Snapshot {
        let sample = r.sample;
        let dry_run = r.health.dry_run;
        let uuid_of = |i: u32| {
            sample
                .devices
                .iter()
                .find(|d| d.index == i)
                .map(|d| d.uuid.clone())
                .unwrap_or_default()
        };
        // Each process's workload key, shared by attribution.
        let by_pid: HashMap<u32, &str> = r
            .processes
            .iter()
            .map(|p| (p.identity.pid, p.key()))
            .collect();
        // ioctl totals per workload (monotonic while the workload has tasks).
        // Updated in place: no string is built for a task or workload already known.
        let mut live_workloads: HashSet<&str> = HashSet::new();
        for t in r.table.tasks() {
            let Some(&key) = by_pid.get(&t.identity.pid) else {
                continue;
            };
            live_workloads.insert(key);
            let prev = match self.ioctl_seen.get_mut(&t.identity) {
                Some(seen) if seen.0 == key => std::mem::replace(&mut seen.1, t.ioctls),
                _ => self
                    .ioctl_seen
                    .insert(t.identity, (key.to_string(), t.ioctls))
                    .map_or(0, |(_, c)| c),
            };
            let delta = t.ioctls.saturating_sub(prev);
            match self.ioctl_totals.get_mut(key) {
                Some(total) => *total += delta,
                None => {
                    self.ioctl_totals.insert(key.to_string(), delta);
                }
            }
        }
        let table = r.table;
        self.ioctl_seen
            .retain(|id, _| table.get(id.pid).is_some_and(|t| t.identity == *id));
        self.ioctl_totals
            .retain(|k, _| live_workloads.contains(k.as_str()));

        // Per (workload, GPU): bytes, pids, utilization.
        let mut usage: BTreeMap<(&str, &str), (u64, Vec<u32>, Busy)> = BTreeMap::new();
        let mut unattributed: BTreeMap<String, u64> = BTreeMap::new();
        let mut processes = Vec::with_capacity(sample.processes.len());
        for p in &sample.processes {
            let key = by_pid.get(&p.pid).copied();
            match key {
                Some(k) => {
                    let e = usage.entry((k, p.device_uuid.as_str())).or_default();
                    e.0 += p.used_bytes.unwrap_or(0);
                    e.1.push(p.pid);
                    e.2.add(p.utilization);
                }
                None => {
                    *unattributed.entry(p.device_uuid.clone()).or_default() +=
                        p.used_bytes.unwrap_or(0)
                }
            }
            processes.push(ProcessView {
                pid: p.pid,
                comm: table.get(p.pid).map(|t| t.comm.clone()).unwrap_or_default(),
                workload: key.unwrap_or_default().to_string(),
                gpu_uuid: p.device_uuid.clone(),
                used_bytes: p.used_bytes,
                utilization: p.utilization.map(|u| ratio(u.sm)),
                memory_utilization: p.utilization.map(|u| ratio(u.memory)),
            });
        }
        let metas: HashMap<&str, &crate::quota::WorkloadMeta> = r
            .processes
            .iter()
            .map(|p| (p.key(), &*p.workload))
            .collect();
        let view = |key: &str, gpu: String| -> WorkloadView {
            let meta = metas.get(key);
            let note = r.identity.get(key);
            let id = meta.map(|m| &m.id);
            let names = r.names.cached(key).cloned().unwrap_or_default();
            WorkloadView {
                workload: key.to_string(),
                name: id
                    .map(|i| i.short_name())
                    .unwrap_or_else(|| key.to_string()),
                cgroup_path: id.map(|i| i.cgroup_path.clone()).unwrap_or_default(),
                namespace: names.namespace.unwrap_or_default(),
                pod: names
                    .pod
                    .or_else(|| id.and_then(|i| i.pod_uid()).map(str::to_string))
                    .unwrap_or_default(),
                container: names.container.unwrap_or_default(),
                container_id: id.and_then(|i| i.container_id()).unwrap_or("").to_string(),
                gpu_uuid: gpu,
                state: "ok".into(),
                identity: note.map_or("", |n| n.identity).to_string(),
                nested: note.map(|n| n.nested.clone()).unwrap_or_default(),
                ..Default::default()
            }
        };
        let mut rows: BTreeMap<(String, String), WorkloadView> = BTreeMap::new();
        for ((key, gpu), (bytes, pids, busy)) in usage {
            let mut v = view(key, gpu.to_string());
            v.used_bytes = bytes;
            v.pids = pids;
            v.ioctls = *self.ioctl_totals.get(key).unwrap_or(&0);
            (v.utilization, v.memory_utilization) = busy.ratios();
            rows.insert((key.to_string(), gpu.to_string()), v);
        }
        for (key, ws) in &r.policy.workloads {
            let scope_rows: Vec<(GpuScope, Option<&crate::policy::ScopeState>)> =
                if ws.scopes.is_empty() {
                    // Frozen with no liability of its own (an earlier run's freeze, processes
                    // unseen): one row, so it shows and can be released.
                    vec![(ws.frozen.unwrap_or(GpuScope::All), None)]
                } else {
                    ws.scopes.iter().map(|(s, ss)| (*s, Some(ss))).collect()
                };
            for (scope, ss) in scope_rows {
                let gpu = match scope {
                    GpuScope::All => "all".to_string(),
                    GpuScope::Gpu(i) => uuid_of(i),
                };
                let v = rows
                    .entry((key.clone(), gpu.clone()))
                    .or_insert_with(|| view(key, gpu.clone()));
                if let Some(ss) = ss {
                    if scope == GpuScope::All {
                        v.used_bytes = ss.usage.unwrap_or(0);
                    }
                    v.quota_bytes = Some(ss.limit);
                }
                v.quota_source = ws.quota.clone();
                v.quota_trust = r.quota_trust.get(key).copied().unwrap_or("").to_string();
                v.state = ws.reported_scope(scope, dry_run).to_string();
                v.detail = detail(ws.retry.as_ref(), r.now);
                if let Some(fp) = ws.suspension.as_ref().and_then(|s| s.footprint()) {
                    v.suspended_bytes = match scope {
                        GpuScope::All => fp.values().sum(),
                        GpuScope::Gpu(i) => fp.get(&i).copied().unwrap_or(0),
                    };
                    // Its memory is in host memory: the usage that counts for its quota.
                    v.used_bytes = v.used_bytes.max(v.suspended_bytes);
                }
                if let Some(why) = &ws.suspend_failed {
                    v.detail = format!("suspend fell through ({why})");
                }
                if let Some(why) = &ws.waiting_for_room {
                    v.detail = format!("waiting for room to resume: {why}");
                }
                if v.cgroup_path.is_empty() {
                    v.cgroup_path = ws.cgroup_path.clone();
                }
            }
        }
        // Rows without a quota scope of their own (per-GPU usage under an all-GPU quota) show the
        // workload's overall state: a frozen workload is frozen on every GPU.
        for ((key, gpu), v) in rows.iter_mut() {
            let Some(ws) = r.policy.workloads.get(key) else {
                continue;
            };
            let own_scope = ws.scopes.keys().any(|s| match s {
                GpuScope::All => gpu == "all",
                GpuScope::Gpu(i) => uuid_of(*i) == *gpu,
            }) || (ws.scopes.is_empty() && gpu == "all");
            if !own_scope {
                v.state = ws.reported(dry_run).to_string();
                v.detail = detail(ws.retry.as_ref(), r.now);
            }
        }
        let now = Instant::now();
        for (k, v) in rows.iter_mut() {
            let since = match self.state_since.get_mut(k) {
                Some(entry) => {
                    if entry.0 != v.state {
                        *entry = (v.state.clone(), now);
                    }
                    entry.1
                }
                None => {
                    self.state_since.insert(k.clone(), (v.state.clone(), now));
                    now
                }
            };
            v.state_for_secs = now.duration_since(since).as_secs_f64();
        }
        self.state_since.retain(|k, _| rows.contains_key(k));
        let mut counters = r.counters;
        counters.gpu_ioctls = self.ioctl_totals.clone();
        Snapshot {
            taken_at_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            version: env!("CARGO_PKG_VERSION").to_string(),
            health: r.health,
            gpus: sample
                .devices
                .iter()
                .map(|d| GpuView {
                    index: d.index,
                    uuid: d.uuid.clone(),
                    name: d.name.clone(),
                    memory_total_bytes: d.memory_total,
                    memory_used_bytes: d.memory_used,
                    memory_free_bytes: d.memory_free,
                    healthy: sample.device_ok(d.index),
                    isolation_backend: r
                        .backends
                        .get(&d.index)
                        .copied()
                        .unwrap_or("soft")
                        .to_string(),
                    utilization: d.utilization.map(|u| ratio(u.sm)),
                    memory_utilization: d.utilization.map(|u| ratio(u.memory)),
                    process_utilization: d.process_utilization
                        != crate::sample::ProcessUtilization::Unknown,
                    temperature_celsius: d.temperature_c,
                    power_watts: d.power_mw.map(|mw| f64::from(mw) / 1000.0),
                    sm_clock_mhz: d.sm_clock_mhz,
                })
                .collect(),
            workloads: rows.into_values().collect(),
            processes,
            unattributed_bytes: unattributed,
            counters,
            quotas: r.quotas,
            driver_limits: r
                .driver_limits
                .into_iter()
                .map(|(gpu, cgroup_path, soft, hard, source)| DriverLimitView {
                    gpu_uuid: uuid_of(gpu),
                    cgroup_path,
                    soft_bytes: soft,
                    hard_bytes: hard,
                    source: source.to_string(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        attribution::{Attribution, cgroupfs::CgroupResolver, parse_cgroup_path},
        quota::WorkloadMeta,
    };

    fn build(p: &mut Publisher, table: &Attribution, procs: &[AttributedProcess]) -> Snapshot {
        let sample = GpuSample {
            taken_at: None,
            devices: Vec::new(),
            health: Vec::new(),
            processes: Vec::new(),
            problems: Vec::new(),
        };
        p.build(StepReport {
            sample: &sample,
            table,
            processes: procs,
            policy: &PolicyState::default(),
            names: &NameCache::default(),
            quota_trust: &HashMap::new(),
            identity: &HashMap::new(),
            health: Health::default(),
            counters: Counters::default(),
            quotas: Vec::new(),
            now: std::time::Duration::ZERO,
            backends: BTreeMap::new(),
            driver_limits: Vec::new(),
        })
    }

    /// A workload's utilization sums its processes' known values, capped at 1; unknown only when
    /// no process's value is known (an idle process is 0, not unknown).
    #[test]
    fn workload_utilization_sums_known_processes_capped_at_one() {
        use crate::sample::Utilization;
        let u = |sm, memory| Some(Utilization { sm, memory });
        let mut b = Busy::default();
        b.add(None);
        assert_eq!(b.ratios(), (None, None));
        b.add(u(0, 0));
        assert_eq!(b.ratios(), (Some(0.0), Some(0.0)), "idle is 0");
        b.add(u(60, 10));
        b.add(None);
        b.add(u(70, 5));
        assert_eq!(b.ratios(), (Some(1.0), Some(0.15)));
    }

    #[test]
    fn ioctl_totals_add_what_each_task_issued_since_the_last_step_and_follow_a_move() {
        let me = std::process::id();
        let mut table = Attribution::new(CgroupResolver::new("/sys/fs/cgroup".into()));
        let identity = table.attribute_pid(me).expect("this process").identity;
        let counts = |calls| gpushare_common::maps::IoctlCounts { calls, allocs: 0 };
        let proc_in = |path: &str| {
            AttributedProcess::new(identity, WorkloadMeta::new(parse_cgroup_path(path)), None)
        };
        let (a, b) = (proc_in("/jobs/a"), proc_in("/jobs/b"));
        let (ka, kb) = (a.workload.id.key(), b.workload.id.key());
        let mut p = Publisher::default();

        table.set_ioctl_counts(me, counts(10));
        let s = build(&mut p, &table, std::slice::from_ref(&a));
        assert_eq!(s.counters.gpu_ioctls.get(&ka), Some(&10));
        table.set_ioctl_counts(me, counts(15));
        let s = build(&mut p, &table, std::slice::from_ref(&a));
        assert_eq!(
            s.counters.gpu_ioctls.get(&ka),
            Some(&15),
            "5 more, not 15 more"
        );
        let s = build(&mut p, &table, std::slice::from_ref(&a));
        assert_eq!(s.counters.gpu_ioctls.get(&ka), Some(&15), "nothing new");

        // The task moves to another workload: only what it issues from then on counts there, and
        // the workload it left (no task any more) is gone from the totals.
        table.set_ioctl_counts(me, counts(18));
        let s = build(&mut p, &table, std::slice::from_ref(&b));
        assert_eq!(s.counters.gpu_ioctls.get(&kb), Some(&3));
        assert_eq!(s.counters.gpu_ioctls.get(&ka), None);
    }
}
