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

use prometheus_client::encoding::DescriptorEncoder;

use super::{Labels, gauge};
use crate::snapshot::{GpuView, Snapshot, WorkloadView};

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

/// The GPU a per-GPU workload row is on (`all` rows and GPUs not in the sample have none).
fn gpu_of<'a>(snap: &'a Snapshot, w: &WorkloadView) -> Option<&'a GpuView> {
    snap.gpus.iter().find(|g| g.uuid == w.gpu_uuid)
}

/// HAMi's `pod` is a pod's name; a workload outside Kubernetes shows its short name.
fn pod_or_name(w: &WorkloadView) -> String {
    if w.pod.is_empty() {
        w.name.clone()
    } else {
        w.pod.clone()
    }
}

/// Encodes the series of every system `c` turns on.
pub fn encode(c: &Compat, snap: &Snapshot, e: &mut DescriptorEncoder) -> std::fmt::Result {
    if c.hami {
        hami(c, snap, e)?;
    }
    if c.volcano {
        volcano(snap, e)?;
    }
    if c.dcgm {
        dcgm(c, snap, e)?;
    }
    Ok(())
}

fn hami(c: &Compat, snap: &Snapshot, e: &mut DescriptorEncoder) -> std::fmt::Result {
    let device_type = |g: &GpuView| format!("NVIDIA-{}", g.name);
    let host = |g: &GpuView| -> Labels {
        vec![
            ("node", c.node.clone()),
            ("device_index", g.index.to_string()),
            ("device_uuid", g.uuid.clone()),
            ("device_type", device_type(g)),
        ]
    };
    gauge(
        e,
        "hami_host_gpu_memory_used_bytes",
        "HAMi-compatible: GPU device memory usage in bytes",
        snap.gpus
            .iter()
            .map(|g| (host(g), g.memory_used_bytes as f64)),
    )?;
    gauge(
        e,
        "hami_host_gpu_utilization_ratio",
        "HAMi-compatible: GPU core utilization ratio (0-100)",
        snap.gpus
            .iter()
            .filter_map(|g| Some((host(g), percent(g.utilization?)))),
    )?;
    gauge(
        e,
        "hami_host_gpu_memory_controller_utilization_ratio",
        "HAMi-compatible: GPU memory controller utilization ratio (0-100)",
        snap.gpus.iter().filter_map(|g| {
            let labels = vec![
                ("device_index", g.index.to_string()),
                ("device_uuid", g.uuid.clone()),
                ("device_type", device_type(g)),
            ];
            Some((labels, percent(g.memory_utilization?)))
        }),
    )?;
    // HAMi exports per device: one series per container per GPU, so a sum over devices is the
    // container's total. Rows of all-GPU quotas (`gpu_uuid="all"`, the sum of the per-GPU rows)
    // and rows of a GPU not in the sample have no device and are left out; an all-GPU quota has
    // no per-device limit.
    let ctr = |w: &WorkloadView| -> Option<Labels> {
        let gpu = gpu_of(snap, w)?;
        Some(vec![
            ("namespace", w.namespace.clone()),
            ("pod", pod_or_name(w)),
            ("container", w.container.clone()),
            ("vdevice_index", gpu.index.to_string()),
            ("device_uuid", gpu.uuid.clone()),
        ])
    };
    gauge(
        e,
        "hami_vgpu_memory_used_bytes",
        "HAMi-compatible: GPU memory used by a container on one GPU",
        snap.workloads
            .iter()
            .filter_map(|w| Some((ctr(w)?, w.used_bytes as f64))),
    )?;
    gauge(
        e,
        "hami_vgpu_memory_limit_bytes",
        "HAMi-compatible: GPU memory limit of a container on one GPU (per-GPU quotas)",
        snap.workloads
            .iter()
            .filter_map(|w| Some((ctr(w)?, w.quota_bytes? as f64))),
    )?;
    gauge(
        e,
        "hami_container_device_memory_bytes",
        "HAMi-compatible: container device memory usage in bytes",
        snap.workloads
            .iter()
            .filter_map(|w| Some((ctr(w)?, w.used_bytes as f64))),
    )?;
    gauge(
        e,
        "hami_container_device_utilization_ratio",
        "HAMi-compatible: container device SM utilization ratio (0-100)",
        snap.workloads
            .iter()
            .filter_map(|w| Some((ctr(w)?, percent(w.utilization?)))),
    )
}

fn volcano(snap: &Snapshot, e: &mut DescriptorEncoder) -> std::fmt::Result {
    let zone = || ("zone", "vGPU".to_string());
    let host = |g: &GpuView| -> Labels {
        vec![
            ("deviceidx", g.index.to_string()),
            ("deviceuuid", g.uuid.clone()),
            zone(),
        ]
    };
    gauge(
        e,
        "HostGPUMemoryUsage",
        "Volcano-compatible: GPU device memory usage",
        snap.gpus
            .iter()
            .map(|g| (host(g), g.memory_used_bytes as f64)),
    )?;
    gauge(
        e,
        "HostCoreUtilization",
        "Volcano-compatible: GPU core utilization",
        snap.gpus
            .iter()
            .filter_map(|g| Some((host(g), percent(g.utilization?)))),
    )?;
    let ctr = |w: &WorkloadView| -> Option<Labels> {
        let gpu = gpu_of(snap, w)?;
        Some(vec![
            ("podnamespace", w.namespace.clone()),
            ("podname", pod_or_name(w)),
            ("ctrname", w.container.clone()),
            ("vdeviceid", gpu.index.to_string()),
            ("deviceuuid", gpu.uuid.clone()),
            zone(),
        ])
    };
    gauge(
        e,
        "vGPU_device_memory_usage_in_bytes",
        "Volcano-compatible: vGPU device usage",
        snap.workloads
            .iter()
            .filter_map(|w| Some((ctr(w)?, w.used_bytes as f64))),
    )?;
    gauge(
        e,
        "vGPU_device_memory_limit_in_bytes",
        "Volcano-compatible: vGPU device limit",
        snap.workloads
            .iter()
            .filter_map(|w| Some((ctr(w)?, w.quota_bytes? as f64))),
    )?;
    gauge(
        e,
        "Device_utilization_desc_of_container",
        "Volcano-compatible: container device utilization (0-100)",
        snap.workloads
            .iter()
            .filter_map(|w| Some((ctr(w)?, percent(w.utilization?)))),
    )
}

const MIB: f64 = (1u64 << 20) as f64;

fn dcgm(c: &Compat, snap: &Snapshot, e: &mut DescriptorEncoder) -> std::fmt::Result {
    let device = |g: &GpuView| -> Labels {
        vec![
            ("gpu", g.index.to_string()),
            ("UUID", g.uuid.clone()),
            ("device", format!("nvidia{}", g.index)),
            ("modelName", g.name.clone()),
            // dcgm-exporter said `Hostname` until 2026 and `hostname` since: dashboards of
            // either kind select on theirs.
            ("Hostname", c.node.clone()),
            ("hostname", c.node.clone()),
        ]
    };
    // A workload's series: the device's labels plus who it is. Only memory and utilization are
    // attributed; nothing else is copied to a workload.
    let attributed = |w: &WorkloadView| -> Option<Labels> {
        let mut l = device(gpu_of(snap, w)?);
        l.push(("namespace", w.namespace.clone()));
        l.push(("pod", pod_or_name(w)));
        l.push(("container", w.container.clone()));
        Some(l)
    };
    gauge(
        e,
        "DCGM_FI_DEV_FB_USED",
        "dcgm-exporter-compatible: framebuffer memory used (in MiB); with namespace/pod/container: \
         that workload's",
        snap.gpus
            .iter()
            .map(|g| (device(g), (g.memory_used_bytes as f64 / MIB).floor()))
            .chain(
                snap.workloads
                    .iter()
                    .filter_map(|w| Some((attributed(w)?, (w.used_bytes as f64 / MIB).floor()))),
            ),
    )?;
    gauge(
        e,
        "DCGM_FI_DEV_FB_FREE",
        "dcgm-exporter-compatible: framebuffer memory free (in MiB)",
        snap.gpus
            .iter()
            .map(|g| (device(g), (g.memory_free_bytes as f64 / MIB).floor())),
    )?;
    gauge(
        e,
        "DCGM_FI_DEV_GPU_UTIL",
        "dcgm-exporter-compatible: GPU utilization (in %); with namespace/pod/container: that \
         workload's SM utilization",
        snap.gpus
            .iter()
            .filter_map(|g| Some((device(g), percent(g.utilization?))))
            .chain(
                snap.workloads
                    .iter()
                    .filter_map(|w| Some((attributed(w)?, percent(w.utilization?)))),
            ),
    )?;
    gauge(
        e,
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "dcgm-exporter-compatible: memory utilization (in %); with namespace/pod/container: that \
         workload's",
        snap.gpus
            .iter()
            .filter_map(|g| Some((device(g), percent(g.memory_utilization?))))
            .chain(
                snap.workloads
                    .iter()
                    .filter_map(|w| Some((attributed(w)?, percent(w.memory_utilization?)))),
            ),
    )?;
    gauge(
        e,
        "DCGM_FI_DEV_GPU_TEMP",
        "dcgm-exporter-compatible: GPU temperature (in C)",
        snap.gpus
            .iter()
            .filter_map(|g| Some((device(g), f64::from(g.temperature_celsius?)))),
    )?;
    gauge(
        e,
        "DCGM_FI_DEV_POWER_USAGE",
        "dcgm-exporter-compatible: power draw (in W)",
        snap.gpus
            .iter()
            .filter_map(|g| Some((device(g), g.power_watts?))),
    )?;
    gauge(
        e,
        "DCGM_FI_DEV_SM_CLOCK",
        "dcgm-exporter-compatible: SM clock frequency (in MHz)",
        snap.gpus
            .iter()
            .filter_map(|g| Some((device(g), f64::from(g.sm_clock_mhz?)))),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, RwLock};

    use super::*;
    use crate::metrics::{Metrics, SharedSnapshot};

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
            s.gpus.push(GpuView {
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
            });
        }
        for (key, gpu, util) in [
            ("docker://a", "GPU-a", Some(0.3)),
            ("docker://m", "GPU-m", None),
        ] {
            s.workloads.push(WorkloadView {
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
            });
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
