//! Time to render /metrics with 1,000 workloads and 10,000 processes, in both text formats, next to
//! the size of what is rendered. Run: `cargo bench -p gpushare-agent --bench metrics_render`.

use std::sync::Arc;

use gpushare_agent::{
    metrics::{Compat, Metrics, SharedSnapshot},
    snapshot::{GpuView, ProcessView, Snapshot, WorkloadView},
};

const WORKLOADS: usize = 1_000;
const PROCESSES: usize = 10_000;
const GPUS: usize = 8;
const ITERS: usize = 30;

fn main() {
    let mut s = Snapshot::default();
    for g in 0..GPUS {
        s.gpus.push(GpuView {
            index: g as u32,
            uuid: format!("GPU-{g:08}-0000-0000-0000-000000000000"),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_total_bytes: 80 << 30,
            memory_used_bytes: 40 << 30,
            memory_free_bytes: 40 << 30,
            healthy: true,
            isolation_backend: "soft".into(),
            ..Default::default()
        });
    }
    for w in 0..WORKLOADS {
        s.workloads.push(WorkloadView {
            workload: format!("containerd://{w:064x}"),
            name: format!("{w:012x}"),
            namespace: "ml".into(),
            pod: format!("trainer-{w}"),
            container: "main".into(),
            container_id: format!("{w:064x}"),
            gpu_uuid: s.gpus[w % GPUS].uuid.clone(),
            used_bytes: 1 << 30,
            quota_bytes: Some(2 << 30),
            state: "ok".into(),
            ..Default::default()
        });
    }
    for p in 0..PROCESSES {
        s.processes.push(ProcessView {
            pid: 10_000 + p as u32,
            comm: "python3".into(),
            workload: format!("containerd://{:064x}", p % WORKLOADS),
            gpu_uuid: s.gpus[p % GPUS].uuid.clone(),
            used_bytes: Some(100 << 20),
            ..Default::default()
        });
    }
    let shared: SharedSnapshot = Arc::new(std::sync::RwLock::new(Arc::new(s)));
    let m = Metrics::new(
        shared,
        Compat {
            hami: true,
            ..Default::default()
        },
    );
    for (name, f) in [
        (
            "prometheus text",
            Box::new(|| m.render_prometheus()) as Box<dyn Fn() -> String>,
        ),
        ("openmetrics text", Box::new(|| m.render_openmetrics())),
    ] {
        let bytes = f().len();
        let lines = f().lines().count();
        // `GPUSHARE_BENCH_QUICK=1`: a few iterations, figures not to be judged (a smoke run).
        let v: Vec<f64> =
            gpushare_testkit::bench::sorted_us(gpushare_testkit::bench::iters(ITERS, 3), &f)
                .into_iter()
                .map(|us| us / 1e3)
                .collect();
        println!(
            "/metrics ({name}) with {WORKLOADS} workloads, {PROCESSES} processes, {GPUS} GPUs: median {:.1} ms, max {:.1} ms ({lines} lines, {:.1} MiB)",
            v[v.len() / 2],
            v[v.len() - 1],
            bytes as f64 / (1 << 20) as f64
        );
    }
}
