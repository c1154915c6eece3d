//! The scrape: families, labels, escaping and both formats, from snapshots built by hand;
//! [`cache`]: the scrape cache against encoding from nothing.

mod cache;

use std::sync::RwLock;

use super::*;
use crate::snapshot::{GpuView, ProcessView, SharedSnapshot, WorkloadView};

fn snapshot(workloads: &[(&str, u64, Option<u64>, &str)]) -> Snapshot {
    let mut s = Snapshot::default();
    s.gpus.push(Arc::new(GpuView {
        index: 0,
        uuid: "GPU-a".into(),
        name: "H100".into(),
        memory_total_bytes: 100,
        memory_used_bytes: 40,
        memory_free_bytes: 60,
        healthy: true,
        isolation_backend: "soft".into(),
        ..Default::default()
    }));
    for (key, used, quota, state) in workloads {
        s.workloads.push(
            WorkloadView {
                workload: key.to_string(),
                gpu_uuid: "GPU-a".into(),
                used_bytes: *used,
                quota_bytes: *quota,
                state: state.to_string(),
                ..Default::default()
            }
            .into(),
        );
        s.processes.push(Arc::new(ProcessView {
            pid: *used as u32,
            comm: "python".into(),
            workload: key.to_string(),
            gpu_uuid: "GPU-a".into(),
            used_bytes: Some(*used),
            ..Default::default()
        }));
    }
    s.counters.enforcement_actions.add("freeze", "ok", 2);
    s
}

/// The HAMi series are per device, with HAMi's labels: a workload under an all-GPU quota on
/// two GPUs has one used series per GPU (their sum is its total) and no limit series; a
/// per-GPU quota has its limit on its GPU. Nothing is exported for `gpu_uuid="all"` rows.
#[test]
fn hami_series_are_per_device_with_their_values_and_labels() {
    let mut s = Snapshot::default();
    for (index, uuid) in [(0, "GPU-a"), (1, "GPU-b")] {
        s.gpus.push(Arc::new(GpuView {
            index,
            uuid: uuid.into(),
            name: "H100".into(),
            memory_total_bytes: 100,
            healthy: true,
            ..Default::default()
        }));
    }
    let row = |key: &str, gpu: &str, used: u64, quota: Option<u64>| {
        WorkloadView {
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
        }
        .into()
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
    assert!(text.contains(
        r#"workload="docker://a",namespace="",pod="",container="",container_id="",state="ok"} 0"#
    ));
    assert!(text.contains(r#"gpushare_enforcement_actions_total{action="freeze",result="ok"} 2"#));
    assert!(text.contains("hami_vgpu_memory_limit_bytes{"));
    assert!(text.contains("# TYPE gpushare_sample_duration_seconds histogram"));
    // b exits: its series go with it.
    *shared.write().unwrap() = Arc::new(snapshot(&[("docker://a", 10, Some(5), "frozen")]));
    let text = m.render_prometheus();
    assert!(!text.contains("docker://b"), "{text}");
    assert!(m.render_openmetrics().ends_with("# EOF\n"));
}
