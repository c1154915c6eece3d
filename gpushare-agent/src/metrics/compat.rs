//! Other systems' metric names (`--compat hami,volcano,dcgm`), so dashboards and alerts built on
//! HAMi's vGPU monitor, Volcano's vGPU device plugin or NVIDIA's dcgm-exporter keep working when
//! gpushare replaces them. Encoded from the same [`Snapshot`] as gpushare's own series; a series
//! without an honest gpushare value is left out (docs/metrics.md lists which and why).
//!
//! - HAMi v2.9+ (`cmd/vGPUmonitor/metrics.go`): its names and exact label sets; its `_ratio`
//!   series are 0-100 (HAMi's convention, not Prometheus's).
//! - Volcano (pre-2.9 HAMi names, as `volcano-vgpu-device-plugin`'s `cmd/vgpu-monitor` exports
//!   them, with the `zone="vGPU"` label its registerer adds).
//! - dcgm-exporter: `DCGM_FI_DEV_*` fields NVML can give, per GPU with dcgm-exporter's labels;
//!   memory and utilization also per workload, with `namespace`, `pod`, `container` only on those
//!   (dcgm-exporter copies a device's values to every pod on it; gpushare does not).

use super::rows::WorkloadRow;
use super::{Family, Labels, push};
use crate::snapshot::GpuView;

/// Which other systems' names to export, and the node name some of them carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compat {
    /// HAMi v2.9+ names.
    pub hami: bool,
    /// Volcano's (pre-2.9 HAMi) names.
    pub volcano: bool,
    /// dcgm-exporter's names.
    pub dcgm: bool,
    /// The node's name (`NODE_NAME`, else the host name): HAMi's `node`, dcgm-exporter's
    /// `Hostname`/`hostname`.
    pub node: String,
}

impl Compat {
    /// From `--compat` values (`hami`, `volcano`, `dcgm`); the node name from `NODE_NAME` (as
    /// HAMi reads it) or the host name.
    pub fn from_names(names: &[String]) -> Self {
        let has = |n: &str| names.iter().any(|x| x == n);
        Self {
            hami: has("hami"),
            volcano: has("volcano"),
            dcgm: has("dcgm"),
            node: node_name(),
        }
    }

    /// Whether any is on.
    pub fn any(&self) -> bool {
        self.hami || self.volcano || self.dcgm
    }
}

fn node_name() -> String {
    if let Ok(n) = std::env::var("NODE_NAME")
        && !n.is_empty()
    {
        return n;
    }
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it (or
    // truncates, which the search below tolerates).
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        return String::from_utf8_lossy(&buf[..end]).into_owned();
    }
    String::new()
}

/// A NVML 0-1 ratio as HAMi's and dcgm-exporter's 0-100.
fn percent(r: f64) -> f64 {
    (r * 100.0).round()
}

/// HAMi's `pod` is a pod's name; a workload outside Kubernetes shows its short name.
fn pod_or_name(w: &WorkloadRow) -> String {
    if w.pod.is_empty() {
        w.name.to_string()
    } else {
        w.pod.to_string()
    }
}

/// The families of every system `c` turns on, in the order they are exported.
pub(crate) fn families(c: &Compat) -> Vec<Family> {
    let mut f = Vec::new();
    if c.hami {
        f.extend(hami());
    }
    if c.volcano {
        f.extend(volcano());
    }
    if c.dcgm {
        f.extend(dcgm());
    }
    f
}

fn device_type(g: &GpuView) -> String {
    format!("NVIDIA-{}", g.name)
}

fn hami_host(c: &Compat, g: &GpuView) -> Labels {
    vec![
        ("node", c.node.clone()),
        ("device_index", g.index.to_string()),
        ("device_uuid", g.uuid.clone()),
        ("device_type", device_type(g)),
    ]
}

/// HAMi exports per device: one series per container per GPU, so a sum over devices is the
/// container's total. Rows of all-GPU quotas (`gpu_uuid="all"`, the sum of the per-GPU rows)
/// and rows of a GPU not in the sample have no device and are left out; an all-GPU quota has
/// no per-device limit.
fn hami_ctr(w: &WorkloadRow) -> Option<Labels> {
    let (index, _) = w.gpu.as_ref()?;
    Some(vec![
        ("namespace", w.namespace.to_string()),
        ("pod", pod_or_name(w)),
        ("container", w.container.to_string()),
        ("vdevice_index", index.to_string()),
        ("device_uuid", w.gpu_uuid.to_string()),
    ])
}

fn hami() -> Vec<Family> {
    vec![
        Family::gauge(
            "hami_host_gpu_memory_used_bytes",
            "HAMi-compatible: GPU device memory usage in bytes",
        )
        .each(|snap, c, s| {
            for g in &snap.gpus {
                push(s, hami_host(c, g), g.memory_used_bytes as f64);
            }
        }),
        Family::gauge(
            "hami_host_gpu_utilization_ratio",
            "HAMi-compatible: GPU core utilization ratio (0-100)",
        )
        .each(|snap, c, s| {
            for g in &snap.gpus {
                if let Some(u) = g.utilization {
                    push(s, hami_host(c, g), percent(u));
                }
            }
        }),
        Family::gauge(
            "hami_host_gpu_memory_controller_utilization_ratio",
            "HAMi-compatible: GPU memory controller utilization ratio (0-100)",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                if let Some(u) = g.memory_utilization {
                    let labels = vec![
                        ("device_index", g.index.to_string()),
                        ("device_uuid", g.uuid.clone()),
                        ("device_type", device_type(g)),
                    ];
                    push(s, labels, percent(u));
                }
            }
        }),
        Family::gauge(
            "hami_vgpu_memory_used_bytes",
            "HAMi-compatible: GPU memory used by a container on one GPU",
        )
        .workloads(|w, _, s| {
            if let Some(l) = hami_ctr(w) {
                push(s, l, w.used_bytes as f64);
            }
        }),
        Family::gauge(
            "hami_vgpu_memory_limit_bytes",
            "HAMi-compatible: GPU memory limit of a container on one GPU (per-GPU quotas)",
        )
        .workloads(|w, _, s| {
            if let (Some(l), Some(q)) = (hami_ctr(w), w.quota_bytes) {
                push(s, l, q as f64);
            }
        }),
        Family::gauge(
            "hami_container_device_memory_bytes",
            "HAMi-compatible: container device memory usage in bytes",
        )
        .workloads(|w, _, s| {
            if let Some(l) = hami_ctr(w) {
                push(s, l, w.used_bytes as f64);
            }
        }),
        Family::gauge(
            "hami_container_device_utilization_ratio",
            "HAMi-compatible: container device SM utilization ratio (0-100)",
        )
        .workloads(|w, _, s| {
            if let (Some(l), Some(u)) = (hami_ctr(w), w.utilization) {
                push(s, l, percent(u.0));
            }
        }),
    ]
}

fn volcano_host(g: &GpuView) -> Labels {
    vec![
        ("deviceidx", g.index.to_string()),
        ("deviceuuid", g.uuid.clone()),
        ("zone", "vGPU".to_string()),
    ]
}

fn volcano_ctr(w: &WorkloadRow) -> Option<Labels> {
    let (index, _) = w.gpu.as_ref()?;
    Some(vec![
        ("podnamespace", w.namespace.to_string()),
        ("podname", pod_or_name(w)),
        ("ctrname", w.container.to_string()),
        ("vdeviceid", index.to_string()),
        ("deviceuuid", w.gpu_uuid.to_string()),
        ("zone", "vGPU".to_string()),
    ])
}

fn volcano() -> Vec<Family> {
    vec![
        Family::gauge(
            "HostGPUMemoryUsage",
            "Volcano-compatible: GPU device memory usage",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                push(s, volcano_host(g), g.memory_used_bytes as f64);
            }
        }),
        Family::gauge(
            "HostCoreUtilization",
            "Volcano-compatible: GPU core utilization",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                if let Some(u) = g.utilization {
                    push(s, volcano_host(g), percent(u));
                }
            }
        }),
        Family::gauge(
            "vGPU_device_memory_usage_in_bytes",
            "Volcano-compatible: vGPU device usage",
        )
        .workloads(|w, _, s| {
            if let Some(l) = volcano_ctr(w) {
                push(s, l, w.used_bytes as f64);
            }
        }),
        Family::gauge(
            "vGPU_device_memory_limit_in_bytes",
            "Volcano-compatible: vGPU device limit",
        )
        .workloads(|w, _, s| {
            if let (Some(l), Some(q)) = (volcano_ctr(w), w.quota_bytes) {
                push(s, l, q as f64);
            }
        }),
        Family::gauge(
            "Device_utilization_desc_of_container",
            "Volcano-compatible: container device utilization (0-100)",
        )
        .workloads(|w, _, s| {
            if let (Some(l), Some(u)) = (volcano_ctr(w), w.utilization) {
                push(s, l, percent(u.0));
            }
        }),
    ]
}

const MIB: f64 = (1u64 << 20) as f64;

fn dcgm_device(c: &Compat, index: u32, uuid: &str, name: &str) -> Labels {
    vec![
        ("gpu", index.to_string()),
        ("UUID", uuid.to_string()),
        ("device", format!("nvidia{index}")),
        ("modelName", name.to_string()),
        // dcgm-exporter said `Hostname` until 2026 and `hostname` since: dashboards of
        // either kind select on theirs.
        ("Hostname", c.node.clone()),
        ("hostname", c.node.clone()),
    ]
}

fn dcgm_gpu(c: &Compat, g: &GpuView) -> Labels {
    dcgm_device(c, g.index, &g.uuid, &g.name)
}

/// A workload's series: the device's labels plus who it is. Only memory and utilization are
/// attributed; nothing else is copied to a workload.
fn dcgm_attributed(c: &Compat, w: &WorkloadRow) -> Option<Labels> {
    let (index, name) = w.gpu.as_ref()?;
    let mut l = dcgm_device(c, *index, &w.gpu_uuid, name);
    l.push(("namespace", w.namespace.to_string()));
    l.push(("pod", pod_or_name(w)));
    l.push(("container", w.container.to_string()));
    Some(l)
}

fn dcgm() -> Vec<Family> {
    vec![
        Family::gauge(
            "DCGM_FI_DEV_FB_USED",
            "dcgm-exporter-compatible: framebuffer memory used (in MiB); with namespace/pod/container: \
             that workload's",
        )
        .each(|snap, c, s| {
            for g in &snap.gpus {
                push(s, dcgm_gpu(c, g), (g.memory_used_bytes as f64 / MIB).floor());
            }
        })
        .workloads(|w, c, s| {
            if let Some(l) = dcgm_attributed(c, w) {
                push(s, l, (w.used_bytes as f64 / MIB).floor());
            }
        }),
        Family::gauge(
            "DCGM_FI_DEV_FB_FREE",
            "dcgm-exporter-compatible: framebuffer memory free (in MiB)",
        )
        .each(|snap, c, s| {
            for g in &snap.gpus {
                push(s, dcgm_gpu(c, g), (g.memory_free_bytes as f64 / MIB).floor());
            }
        }),
        Family::gauge(
            "DCGM_FI_DEV_GPU_UTIL",
            "dcgm-exporter-compatible: GPU utilization (in %); with namespace/pod/container: that \
             workload's SM utilization",
        )
        .each(|snap, c, s| {
            for g in &snap.gpus {
                if let Some(u) = g.utilization {
                    push(s, dcgm_gpu(c, g), percent(u));
                }
            }
        })
        .workloads(|w, c, s| {
            if let (Some(l), Some(u)) = (dcgm_attributed(c, w), w.utilization) {
                push(s, l, percent(u.0));
            }
        }),
        Family::gauge(
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "dcgm-exporter-compatible: memory utilization (in %); with namespace/pod/container: that \
             workload's",
        )
        .each(|snap, c, s| {
            for g in &snap.gpus {
                if let Some(u) = g.memory_utilization {
                    push(s, dcgm_gpu(c, g), percent(u));
                }
            }
        })
        .workloads(|w, c, s| {
            if let (Some(l), Some(u)) = (dcgm_attributed(c, w), w.memory_utilization) {
                push(s, l, percent(u.0));
            }
        }),
        Family::gauge(
            "DCGM_FI_DEV_GPU_TEMP",
            "dcgm-exporter-compatible: GPU temperature (in C)",
        )
        .each(|snap, c, s| {
            for g in &snap.gpus {
                if let Some(t) = g.temperature_celsius {
                    push(s, dcgm_gpu(c, g), f64::from(t));
                }
            }
        }),
        Family::gauge(
            "DCGM_FI_DEV_POWER_USAGE",
            "dcgm-exporter-compatible: power draw (in W)",
        )
        .each(|snap, c, s| {
            for g in &snap.gpus {
                if let Some(p) = g.power_watts {
                    push(s, dcgm_gpu(c, g), p);
                }
            }
        }),
        Family::gauge(
            "DCGM_FI_DEV_SM_CLOCK",
            "dcgm-exporter-compatible: SM clock frequency (in MHz)",
        )
        .each(|snap, c, s| {
            for g in &snap.gpus {
                if let Some(m) = g.sm_clock_mhz {
                    push(s, dcgm_gpu(c, g), f64::from(m));
                }
            }
        }),
    ]
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, RwLock};

    use super::*;
    use crate::snapshot::{Snapshot, WorkloadView};
    use crate::{metrics::Metrics, snapshot::SharedSnapshot};

    fn render(snap: Snapshot, compat: Compat) -> String {
        let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(snap)));
        Metrics::new(shared, compat).render_prometheus()
    }

    fn series<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect()
    }

    /// Two GPUs, one without utilization; one workload on each, the first 30% busy.
    fn snapshot() -> Snapshot {
        let mut s = Snapshot::default();
        for (index, uuid, util) in [(0, "GPU-a", Some(0.5)), (1, "GPU-m", None)] {
            s.gpus.push(Arc::new(GpuView {
                index,
                uuid: uuid.into(),
                name: "H100".into(),
                memory_total_bytes: 80 << 30,
                memory_used_bytes: 3 << 30,
                memory_free_bytes: 77 << 30,
                healthy: true,
                utilization: util,
                memory_utilization: util.map(|u| u / 2.0),
                temperature_celsius: Some(41),
                power_watts: Some(123.5),
                sm_clock_mhz: Some(1755),
                ..Default::default()
            }));
        }
        for (key, gpu, util) in [
            ("docker://a", "GPU-a", Some(0.3)),
            ("docker://m", "GPU-m", None),
        ] {
            s.workloads.push(
                WorkloadView {
                    workload: key.into(),
                    name: key[9..].into(),
                    namespace: "ns".into(),
                    pod: "p".into(),
                    container: "c".into(),
                    gpu_uuid: gpu.into(),
                    used_bytes: 1 << 30,
                    quota_bytes: Some(4 << 30),
                    utilization: util,
                    memory_utilization: util.map(|u| u / 3.0),
                    state: "ok".into(),
                    ..Default::default()
                }
                .into(),
            );
        }
        s
    }

    /// HAMi's ratios are 0-100 with its label sets; nothing for what is unknown.
    #[test]
    fn hami_utilization_is_0_to_100_with_hamis_labels_and_absent_where_unknown() {
        let c = Compat {
            hami: true,
            node: "n1".into(),
            ..Default::default()
        };
        let text = render(snapshot(), c);
        assert_eq!(
            series(&text, "hami_host_gpu_utilization_ratio"),
            vec![
                r#"hami_host_gpu_utilization_ratio{node="n1",device_index="0",device_uuid="GPU-a",device_type="NVIDIA-H100"} 50.0"#
            ]
        );
        assert_eq!(
            series(&text, "hami_host_gpu_memory_controller_utilization_ratio"),
            vec![
                r#"hami_host_gpu_memory_controller_utilization_ratio{device_index="0",device_uuid="GPU-a",device_type="NVIDIA-H100"} 25.0"#
            ]
        );
        assert_eq!(
            series(&text, "hami_container_device_utilization_ratio"),
            vec![
                r#"hami_container_device_utilization_ratio{namespace="ns",pod="p",container="c",vdevice_index="0",device_uuid="GPU-a"} 30.0"#
            ]
        );
        assert_eq!(series(&text, "hami_host_gpu_memory_used_bytes").len(), 2);
        assert!(
            series(&text, "DCGM_FI_DEV_GPU_UTIL").is_empty(),
            "only hami"
        );
    }

    /// dcgm-exporter's labels per GPU; namespace/pod/container only on the attributed series
    /// (memory, utilization), never on temperature, power, clock or free memory.
    #[test]
    fn dcgm_series_add_pod_labels_only_where_attributed() {
        let c = Compat {
            dcgm: true,
            node: "n1".into(),
            ..Default::default()
        };
        let text = render(snapshot(), c);
        let dev =
            r#"gpu="0",UUID="GPU-a",device="nvidia0",modelName="H100",Hostname="n1",hostname="n1""#;
        assert_eq!(
            series(&text, "DCGM_FI_DEV_GPU_UTIL"),
            vec![
                format!("DCGM_FI_DEV_GPU_UTIL{{{dev}}} 50.0"),
                format!(
                    r#"DCGM_FI_DEV_GPU_UTIL{{{dev},namespace="ns",pod="p",container="c"}} 30.0"#
                ),
            ]
        );
        assert_eq!(
            series(&text, "DCGM_FI_DEV_FB_USED")[0],
            format!("DCGM_FI_DEV_FB_USED{{{dev}}} 3072.0")
        );
        assert_eq!(series(&text, "DCGM_FI_DEV_FB_USED").len(), 4, "{text}");
        for name in [
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_SM_CLOCK",
            "DCGM_FI_DEV_FB_FREE",
        ] {
            let s = series(&text, name);
            assert_eq!(s.len(), 2, "{name}: per GPU only\n{text}");
            assert!(s.iter().all(|l| !l.contains("pod=")), "{name}: {s:?}");
        }
        assert_eq!(
            series(&text, "DCGM_FI_DEV_POWER_USAGE")[0],
            format!("DCGM_FI_DEV_POWER_USAGE{{{dev}}} 123.5")
        );
        assert!(
            series(&text, "DCGM_FI_DEV_MEM_COPY_UTIL")
                .iter()
                .all(|l| !l.contains("GPU-m")),
            "unknown utilization is absent"
        );
    }

    /// Volcano's names carry `zone="vGPU"` and its pre-2.9 label names.
    #[test]
    fn volcano_series_carry_zone_vgpu_and_pre_2_9_labels() {
        let c = Compat {
            volcano: true,
            ..Default::default()
        };
        let text = render(snapshot(), c);
        assert_eq!(
            series(&text, "vGPU_device_memory_limit_in_bytes")[0],
            r#"vGPU_device_memory_limit_in_bytes{podnamespace="ns",podname="p",ctrname="c",vdeviceid="0",deviceuuid="GPU-a",zone="vGPU"} 4294967296.0"#
        );
        assert_eq!(
            series(&text, "HostCoreUtilization"),
            vec![r#"HostCoreUtilization{deviceidx="0",deviceuuid="GPU-a",zone="vGPU"} 50.0"#]
        );
    }
}
