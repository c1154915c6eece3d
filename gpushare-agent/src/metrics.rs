//! Prometheus metrics (prometheus-client). Gauges and totals are encoded at scrape time from the
//! latest [`Snapshot`], so series of exited processes and removed workloads disappear with them
//! and label cardinality stays bounded by what is alive. Histograms are kept here.

use std::sync::{Arc, RwLock};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge, histogram::Histogram},
    registry::Registry,
};

use crate::snapshot::{Snapshot, WorkloadView};

/// The latest snapshot, shared between the agent loop (writer) and readers.
pub type SharedSnapshot = Arc<RwLock<Arc<Snapshot>>>;

/// The latest published snapshot (an empty one if a writer panicked while holding the lock).
pub fn latest(shared: &SharedSnapshot) -> Arc<Snapshot> {
    shared.read().map(|s| Arc::clone(&s)).unwrap_or_default()
}

/// Every isolation state a workload can be in; one series per state.
pub const ISOLATION_STATES: &[&str] = &[
    "ok",
    "over_quota",
    "alerted",
    "signalled",
    "freezing",
    "frozen",
    "suspending",
    "suspended",
    "resuming",
    "killing",
];

pub mod compat;

/// Which other systems' metric names to add (`--compat`).
pub use self::compat::Compat;

/// The registry and the histograms the agent loop observes into.
pub struct Metrics {
    registry: Registry,
    /// Time of one NVML sample.
    pub sample_duration: Histogram,
    /// From the sample (or allocation event) that showed a workload over quota to the action.
    pub enforcement_latency: Histogram,
    /// How long a suspend (lock, checkpoint, freeze) took.
    pub suspend_duration: Histogram,
    /// How long a resume (thaw, restore, unlock) took.
    pub resume_duration: Histogram,
}

impl Metrics {
    /// A registry over `snapshot`, without per-process series.
    pub fn new(snapshot: SharedSnapshot, compat: Compat) -> Self {
        Self::with_options(snapshot, compat, false)
    }

    /// A registry over `snapshot`; `process_series` adds `gpushare_process_gpu_memory_used_bytes`
    /// (a series per GPU process, labelled with its pid and name: off unless the operator turns
    /// it on, since `/metrics` is served to whoever reaches the listener).
    pub fn with_options(snapshot: SharedSnapshot, compat: Compat, process_series: bool) -> Self {
        let mut registry = Registry::default();
        let sample_duration = Histogram::new([
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
        ]);
        let enforcement_latency = Histogram::new([
            0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ]);
        registry.register(
            "gpushare_sample_duration_seconds",
            "Time to read every GPU and its processes through NVML",
            sample_duration.clone(),
        );
        registry.register(
            "gpushare_enforcement_latency_seconds",
            "From the observation that put a workload over quota to the enforcement action",
            enforcement_latency.clone(),
        );
        let suspend_buckets = [
            0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
        ];
        let suspend_duration = Histogram::new(suspend_buckets);
        let resume_duration = Histogram::new(suspend_buckets);
        registry.register(
            "gpushare_suspend_duration_seconds",
            "How long a suspend took: lock every GPU process, checkpoint each, freeze",
            suspend_duration.clone(),
        );
        registry.register(
            "gpushare_resume_duration_seconds",
            "How long a resume took: thaw, restore and unlock every checkpointed process",
            resume_duration.clone(),
        );
        registry.register_collector(Box::new(SnapshotCollector {
            snapshot,
            compat,
            process_series,
        }));
        Self {
            registry,
            sample_duration,
            enforcement_latency,
            suspend_duration,
            resume_duration,
        }
    }

    /// Prometheus text format (0.0.4), what `promtool check metrics` reads.
    pub fn render_prometheus(&self) -> String {
        let mut out = String::with_capacity(64 * 1024);
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }

    /// OpenMetrics text format.
    pub fn render_openmetrics(&self) -> String {
        let mut out = String::with_capacity(64 * 1024);
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[derive(Debug)]
struct SnapshotCollector {
    snapshot: SharedSnapshot,
    compat: Compat,
    process_series: bool,
}

pub(crate) type Labels = Vec<(&'static str, String)>;

pub(crate) fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        ConstGauge::new(value).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in series {
        let mut fam = m.encode_family(&labels)?;
        fam.encode_counter::<prometheus_client::encoding::NoLabelSet, _, f64>(&value, None)?;
    }
    Ok(())
}

fn workload_labels(w: &WorkloadView) -> Labels {
    vec![
        ("gpu_uuid", w.gpu_uuid.clone()),
        ("workload", w.workload.clone()),
        ("namespace", w.namespace.clone()),
        ("pod", w.pod.clone()),
        ("container", w.container.clone()),
        ("container_id", w.container_id.clone()),
    ]
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snap = latest(&self.snapshot);
        let gpu_labels = |g: &crate::snapshot::GpuView| -> Labels {
            vec![
                ("gpu_uuid", g.uuid.clone()),
                ("gpu_index", g.index.to_string()),
                ("gpu_name", g.name.clone()),
            ]
        };
        gauge(
            &mut e,
            "gpushare_gpu_memory_total_bytes",
            "GPU memory in total, bytes",
            snap.gpus
                .iter()
                .map(|g| (gpu_labels(g), g.memory_total_bytes as f64)),
        )?;
        gauge(
            &mut e,
            "gpushare_gpu_memory_used_bytes",
            "GPU memory in use, bytes",
            snap.gpus
                .iter()
                .map(|g| (gpu_labels(g), g.memory_used_bytes as f64)),
        )?;
        gauge(
            &mut e,
            "gpushare_gpu_healthy",
            "1 when the last NVML sample read the GPU completely",
            snap.gpus
                .iter()
                .map(|g| (gpu_labels(g), g.healthy as u8 as f64)),
        )?;
        gauge(
            &mut e,
            "gpushare_gpu_isolation_backend",
            "How quotas are enforced on a GPU: soft (the agent's ladder) or driver_limits (also the \
             NVIDIA driver's per-cgroup limits, r615+); 1 for the one in force",
            snap.gpus.iter().map(|g| {
                let mut l = gpu_labels(g);
                let backend = if g.isolation_backend.is_empty() {
                    "soft".to_string()
                } else {
                    g.isolation_backend.clone()
                };
                l.push(("backend", backend));
                (l, 1.0)
            }),
        )?;
        gauge(
            &mut e,
            "gpushare_gpu_utilization_ratio",
            "Share of NVML's last sample period in which a kernel ran on the GPU, 0-1 (absent where \
             NVML does not report it: not supported, MIG)",
            snap.gpus
                .iter()
                .filter_map(|g| Some((gpu_labels(g), g.utilization?))),
        )?;
        gauge(
            &mut e,
            "gpushare_gpu_memory_utilization_ratio",
            "Share of NVML's last sample period in which GPU memory was read or written, 0-1 \
             (absent where not reported)",
            snap.gpus
                .iter()
                .filter_map(|g| Some((gpu_labels(g), g.memory_utilization?))),
        )?;
        gauge(
            &mut e,
            "gpushare_workload_gpu_utilization_ratio",
            "SM utilization of a workload's processes on a GPU over its last sample window, summed, \
             0-1 (absent where unknown: not supported, MIG, or no process verified for the window)",
            snap.workloads
                .iter()
                .filter_map(|w| Some((workload_labels(w), w.utilization?))),
        )?;
        gauge(
            &mut e,
            "gpushare_workload_gpu_memory_utilization_ratio",
            "Memory-controller utilization of a workload's processes on a GPU, summed, 0-1 (absent \
             where unknown)",
            snap.workloads
                .iter()
                .filter_map(|w| Some((workload_labels(w), w.memory_utilization?))),
        )?;
        gauge(
            &mut e,
            "gpushare_driver_limit_bytes",
            "Driver-enforced GPU memory limits (nvmlDeviceSetMemoryLimits_v1) on the cgroups of \
             workloads under a quota, bytes, by kind (soft, hard) and source (agent: set by gpushare; \
             other: set by someone else, e.g. NVIDIA's container hook, and left as it is)",
            snap.driver_limits.iter().flat_map(|l| {
                let labels = |kind: &'static str| {
                    vec![
                        ("gpu_uuid", l.gpu_uuid.clone()),
                        ("cgroup", l.cgroup_path.clone()),
                        ("kind", kind.to_string()),
                        ("source", l.source.clone()),
                    ]
                };
                let soft = (l.soft_bytes > 0).then(|| (labels("soft"), l.soft_bytes as f64));
                let hard =
                    (l.hard_bytes != u64::MAX).then(|| (labels("hard"), l.hard_bytes as f64));
                soft.into_iter().chain(hard)
            }),
        )?;
        gauge(
            &mut e,
            "gpushare_workload_gpu_memory_used_bytes",
            "GPU memory used by a workload, bytes",
            snap.workloads
                .iter()
                .map(|w| (workload_labels(w), w.used_bytes as f64)),
        )?;
        gauge(
            &mut e,
            "gpushare_workload_gpu_memory_quota_bytes",
            "GPU memory quota of a workload, bytes",
            snap.workloads.iter().filter_map(|w| {
                w.quota_bytes.map(|q| {
                    let mut l = workload_labels(w);
                    l.push(("quota_trust", w.quota_trust.clone()));
                    (l, q as f64)
                })
            }),
        )?;
        gauge(
            &mut e,
            "gpushare_workload_identity",
            "What a container's or pod's identity rests on, 1 per workload row: identity=runtime (its \
             runtime's record names its group), degraded (its runtime's place alone), conflict \
             (two groups claimed it; a plain cgroup now)",
            snap.workloads
                .iter()
                .filter(|w| !w.identity.is_empty())
                .map(|w| {
                    let mut l = workload_labels(w);
                    l.push(("identity", w.identity.clone()));
                    (l, 1.0)
                }),
        )?;
        gauge(
            &mut e,
            "gpushare_workload_isolation_state",
            "Isolation state of a workload: one series per state, 1 for the current one",
            snap.workloads.iter().flat_map(|w| {
                let mut states: Vec<&str> = ISOLATION_STATES.to_vec();
                if !states.contains(&w.state.as_str()) {
                    states.push(w.state.as_str());
                }
                states.into_iter().map(move |s| {
                    let mut l = workload_labels(w);
                    l.push(("state", s.to_string()));
                    (l, (s == w.state) as u8 as f64)
                })
            }),
        )?;
        gauge(
            &mut e,
            "gpushare_process_gpu_memory_used_bytes",
            "GPU memory used by a process, bytes (with --process-metrics only)",
            snap.processes
                .iter()
                .filter(|_| self.process_series)
                .filter_map(|p| {
                    p.used_bytes.map(|b| {
                        (
                            vec![
                                ("gpu_uuid", p.gpu_uuid.clone()),
                                ("pid", p.pid.to_string()),
                                ("comm", p.comm.clone()),
                                ("workload", p.workload.clone()),
                            ],
                            b as f64,
                        )
                    })
                }),
        )?;
        gauge(
            &mut e,
            "gpushare_process_gpu_utilization_ratio",
            "SM utilization of a process over its GPU's last sample window, 0-1 (0: no sample, \
             idle; absent where unknown; with --process-metrics only)",
            snap.processes
                .iter()
                .filter(|_| self.process_series)
                .filter_map(|p| {
                    Some((
                        vec![
                            ("gpu_uuid", p.gpu_uuid.clone()),
                            ("pid", p.pid.to_string()),
                            ("comm", p.comm.clone()),
                            ("workload", p.workload.clone()),
                        ],
                        p.utilization?,
                    ))
                }),
        )?;
        gauge(
            &mut e,
            "gpushare_unattributed_gpu_memory_bytes",
            "GPU memory of processes no workload was found for, bytes",
            snap.gpus.iter().map(|g| {
                (
                    vec![("gpu_uuid", g.uuid.clone())],
                    *snap.unattributed_bytes.get(&g.uuid).unwrap_or(&0) as f64,
                )
            }),
        )?;
        let c = &snap.counters;
        counter(
            &mut e,
            "gpushare_enforcement_actions",
            "Enforcement actions by action and result",
            c.enforcement_actions.iter().map(|(k, v)| {
                let (action, result) = k.split_once('/').unwrap_or((k.as_str(), ""));
                (
                    vec![
                        ("action", action.to_string()),
                        ("result", result.to_string()),
                    ],
                    *v,
                )
            }),
        )?;
        counter(
            &mut e,
            "gpushare_enforcement_external_changes",
            "Changes found made behind the agent's back to groups it froze (thawed, gone, replaced: \
             recreated under the same path) and earlier runs' freezes taken over (adopted)",
            c.external_changes
                .iter()
                .map(|(k, v)| (vec![("change", k.clone())], *v)),
        )?;
        counter(
            &mut e,
            "gpushare_suspend_fallthroughs",
            "Suspend steps that fell through to the next step, by reason (unavailable: no driver \
             with the checkpoint API; host_memory; lock_timeout; not_supported; failed_state; error)",
            c.suspend_fallthroughs
                .iter()
                .map(|(k, v)| (vec![("reason", k.clone())], *v)),
        )?;
        counter(
            &mut e,
            "gpushare_suspended_gpu_memory_moved_bytes",
            "GPU memory moved to host memory by suspends since the agent started",
            [(Labels::new(), c.suspended_bytes_total)],
        )?;
        gauge(
            &mut e,
            "gpushare_workload_suspended_bytes",
            "GPU memory of a suspended workload held in host memory, bytes",
            snap.workloads
                .iter()
                .filter(|w| w.suspended_bytes > 0)
                .map(|w| (workload_labels(w), w.suspended_bytes as f64)),
        )?;
        gauge(
            &mut e,
            "gpushare_workloads_suspended",
            "Workloads suspended (their GPU memory in host memory)",
            [(
                Labels::new(),
                snap.workloads
                    .iter()
                    .filter(|w| w.state == "suspended")
                    .map(|w| w.workload.as_str())
                    .collect::<std::collections::BTreeSet<_>>()
                    .len() as f64,
            )],
        )?;
        counter(
            &mut e,
            "gpushare_workload_identity_events",
            "Workload-identity events: two groups claiming one container or pod identity \
             (conflict), a container's runtime record naming another group (record_mismatch)",
            c.workload_identity
                .iter()
                .map(|(k, v)| (vec![("kind", k.clone())], *v)),
        )?;
        counter(
            &mut e,
            "gpushare_identity_checks",
            "GPU tasks dropped because they exited (exited), sampled pids whose tracked process had \
             exited and were attributed afresh (stale_identity), sample records left unknown \
             because their pid's process started after the sample (unverifiable), pids rejected \
             at attribution (rejected)",
            c.identity
                .iter()
                .map(|(k, v)| (vec![("kind", k.clone())], *v)),
        )?;
        counter(
            &mut e,
            "gpushare_attribution_work",
            "Work attribution did whose amount processes choose: unconfirmed nvidia opens checked \
             in /proc (open_checks) and found failed (failed_opens), /proc/<pid>/fd entries read \
             (fd_entries_read), cgroup ids resolved by opening the group (cgroup_id_lookups), \
             walks of the cgroup hierarchy (cgroup_rescans) and the directories they read \
             (cgroup_dirs_walked)",
            c.attribution_work
                .iter()
                .map(|(k, v)| (vec![("kind", k.clone())], *v)),
        )?;
        counter(
            &mut e,
            "gpushare_gpu_ioctls",
            "ioctls issued by the GPU tasks of a workload",
            c.gpu_ioctls
                .iter()
                .map(|(w, v)| (vec![("workload", w.clone())], *v)),
        )?;
        counter(
            &mut e,
            "gpushare_ebpf_events",
            "Kernel events received by kind",
            c.ebpf_events
                .iter()
                .map(|(k, v)| (vec![("kind", k.clone())], *v)),
        )?;
        counter(
            &mut e,
            "gpushare_ebpf_events_lost",
            "Kernel events lost because the ring buffer was full",
            [(Labels::new(), c.ebpf_events_lost)],
        )?;
        counter(
            &mut e,
            "gpushare_nvml_errors",
            "NVML calls that failed, by call",
            c.nvml_errors
                .iter()
                .map(|(k, v)| (vec![("call", k.clone())], *v)),
        )?;
        counter(
            &mut e,
            "gpushare_env_quota_errors",
            "Malformed environment-quota variables and unreadable runtime specs (each ignored)",
            [(Labels::new(), c.env_quota_errors)],
        )?;
        counter(
            &mut e,
            "gpushare_env_quota_disagreements",
            "Environment-quota variables that disagree with the devices the runtime gave, or hold a value no plugin writes, by kind",
            c.env_quota_disagreements
                .iter()
                .map(|(k, v)| (vec![("kind", k.clone())], *v)),
        )?;
        counter(
            &mut e,
            "gpushare_kubernetes",
            "The API server's reads and Kubernetes Events, by what (api_reads, api_errors, annotation_edits_ignored, events_created, events_patched, events_skipped, events_dropped, events_errors)",
            c.kubernetes
                .iter()
                .map(|(k, v)| (vec![("what", k.clone())], *v)),
        )?;
        gauge(
            &mut e,
            "gpushare_env_quota_unit_mismatch",
            "1 for a workload whose ALIYUN_COM_GPU_MEM_DEV says the device plugin's unit is not gpushare_memory_unit",
            c.env_quota_unit_mismatch
                .keys()
                .map(|k| (vec![("workload", k.clone())], 1.0)),
        )?;
        gauge(
            &mut e,
            "gpushare_quota_config_valid",
            "1 when the quota files loaded cleanly; 0 while the last good configuration is kept",
            [(Labels::new(), c.quota_config_valid as u8 as f64)],
        )?;
        gauge(
            &mut e,
            "gpushare_quota_config_last_reload_timestamp_seconds",
            "When the quota configuration was last loaded",
            [(Labels::new(), c.quota_config_last_reload_unix)],
        )?;
        gauge(
            &mut e,
            "gpushare_agent_ready",
            "1 once the programs are loaded and the first sample is done",
            [(Labels::new(), snap.health.ready as u8 as f64)],
        )?;
        gauge(
            &mut e,
            "gpushare_agent_degraded",
            "1 while the agent runs in a degraded mode (see /healthz)",
            [(
                Labels::new(),
                (!snap.health.degraded.is_empty()) as u8 as f64,
            )],
        )?;
        gauge(
            &mut e,
            "gpushare_build_info",
            "Build information",
            [(
                vec![
                    ("version", env!("CARGO_PKG_VERSION").to_string()),
                    ("commit", env!("GPUSHARE_COMMIT").to_string()),
                ],
                1.0,
            )],
        )?;
        compat::encode(&self.compat, &snap, &mut e)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{GpuView, ProcessView};

    fn snapshot(workloads: &[(&str, u64, Option<u64>, &str)]) -> Snapshot {
        let mut s = Snapshot::default();
        s.gpus.push(GpuView {
            index: 0,
            uuid: "GPU-a".into(),
            name: "H100".into(),
            memory_total_bytes: 100,
            memory_used_bytes: 40,
            memory_free_bytes: 60,
            healthy: true,
            isolation_backend: "soft".into(),
            ..Default::default()
        });
        for (key, used, quota, state) in workloads {
            s.workloads.push(WorkloadView {
                workload: key.to_string(),
                gpu_uuid: "GPU-a".into(),
                used_bytes: *used,
                quota_bytes: *quota,
                state: state.to_string(),
                ..Default::default()
            });
            s.processes.push(ProcessView {
                pid: *used as u32,
                comm: "python".into(),
                workload: key.to_string(),
                gpu_uuid: "GPU-a".into(),
                used_bytes: Some(*used),
                ..Default::default()
            });
        }
        s.counters.enforcement_actions.insert("freeze/ok".into(), 2);
        s
    }

    /// The HAMi series are per device, with HAMi's labels: a workload under an all-GPU quota on
    /// two GPUs has one used series per GPU (their sum is its total) and no limit series; a
    /// per-GPU quota has its limit on its GPU. Nothing is exported for `gpu_uuid="all"` rows.
    #[test]
    fn hami_series_are_per_device_with_their_values_and_labels() {
        let mut s = Snapshot::default();
        for (index, uuid) in [(0, "GPU-a"), (1, "GPU-b")] {
            s.gpus.push(GpuView {
                index,
                uuid: uuid.into(),
                name: "H100".into(),
                memory_total_bytes: 100,
                healthy: true,
                ..Default::default()
            });
        }
        let row = |key: &str, gpu: &str, used: u64, quota: Option<u64>| WorkloadView {
            workload: key.into(),
            name: "short".into(),
            namespace: "ns".into(),
            pod: if key.starts_with("pod") {
                "train-0".into()
            } else {
                String::new()
            },
            container: "worker".into(),
            gpu_uuid: gpu.into(),
            used_bytes: used,
            quota_bytes: quota,
            state: "ok".into(),
            ..Default::default()
        };
        // An all-GPU quota of 50 over 10 + 20 on two GPUs; a per-GPU quota of 15 with 7 used on
        // GPU-b; a GPU that is not in the sample (degraded).
        s.workloads = vec![
            row("pod://u1", "all", 30, Some(50)),
            row("pod://u1", "GPU-a", 10, None),
            row("pod://u1", "GPU-b", 20, None),
            row("docker://c", "GPU-b", 7, Some(15)),
            row("docker://c", "GPU-gone", 0, Some(15)),
        ];
        let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(s)));
        let text = Metrics::new(
            shared,
            Compat {
                hami: true,
                ..Default::default()
            },
        )
        .render_prometheus();
        let series = |name: &str| -> Vec<&str> {
            text.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .collect()
        };
        assert_eq!(
            series("hami_vgpu_memory_used_bytes"),
            vec![
                r#"hami_vgpu_memory_used_bytes{namespace="ns",pod="train-0",container="worker",vdevice_index="0",device_uuid="GPU-a"} 10.0"#,
                r#"hami_vgpu_memory_used_bytes{namespace="ns",pod="train-0",container="worker",vdevice_index="1",device_uuid="GPU-b"} 20.0"#,
                r#"hami_vgpu_memory_used_bytes{namespace="ns",pod="short",container="worker",vdevice_index="1",device_uuid="GPU-b"} 7.0"#,
            ],
            "{text}"
        );
        assert_eq!(
            series("hami_vgpu_memory_limit_bytes"),
            vec![
                r#"hami_vgpu_memory_limit_bytes{namespace="ns",pod="short",container="worker",vdevice_index="1",device_uuid="GPU-b"} 15.0"#,
            ],
            "{text}"
        );
        // gpushare's own series keep the all-GPU row.
        assert!(text.contains(
            r#"gpushare_workload_gpu_memory_quota_bytes{gpu_uuid="all",workload="pod://u1""#
        ));
    }

    #[test]
    fn series_follow_the_snapshot_and_vanish_with_their_workload() {
        let shared: SharedSnapshot = Arc::default();
        let m = Metrics::new(
            shared.clone(),
            Compat {
                hami: true,
                ..Default::default()
            },
        );
        *shared.write().unwrap() = Arc::new(snapshot(&[
            ("docker://a", 10, Some(5), "frozen"),
            ("docker://b", 30, None, "ok"),
        ]));
        let text = m.render_prometheus();
        assert!(text.contains(r#"gpushare_workload_gpu_memory_used_bytes{gpu_uuid="GPU-a",workload="docker://a",namespace="",pod="",container="",container_id=""} 10"#), "{text}");
        assert!(text.contains(
            r#"gpushare_workload_gpu_memory_quota_bytes{gpu_uuid="GPU-a",workload="docker://a""#
        ));
        assert!(
            !text.contains(
                r#"gpushare_workload_gpu_memory_quota_bytes{gpu_uuid="GPU-a",workload="docker://b""#
            ),
            "no quota, no series"
        );
        assert!(text.contains(r#"workload="docker://a",namespace="",pod="",container="",container_id="",state="frozen"} 1"#));
        assert!(text.contains(r#"workload="docker://a",namespace="",pod="",container="",container_id="",state="ok"} 0"#));
        assert!(
            text.contains(r#"gpushare_enforcement_actions_total{action="freeze",result="ok"} 2"#)
        );
        assert!(text.contains("hami_vgpu_memory_limit_bytes{"));
        assert!(text.contains("# TYPE gpushare_sample_duration_seconds histogram"));
        // b exits: its series go with it.
        *shared.write().unwrap() = Arc::new(snapshot(&[("docker://a", 10, Some(5), "frozen")]));
        let text = m.render_prometheus();
        assert!(!text.contains("docker://b"), "{text}");
        assert!(m.render_openmetrics().ends_with("# EOF\n"));
    }
}
