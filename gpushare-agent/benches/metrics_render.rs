//! Time to render /metrics with 1,000 workloads and 10,000 processes, in both text formats, next to
//! the size of what is rendered: cold (the scrape cache emptied first: every row encoded), after
//! 1 % of the workload and process rows changed since the last scrape (the steady state of a
//! node), and unchanged (the same content republished). Then the same with per-process series
//! (`--process-metrics`), and what the cache holds.
//! Run: `cargo bench -p gpushare-agent --bench metrics_render`.

use std::sync::Arc;

use gpushare_agent::{
    metrics::{Compat, Metrics},
    snapshot::{GpuView, ProcessView, SharedSnapshot, Snapshot, WorkloadView},
};

const WORKLOADS: usize = 1_000;
const PROCESSES: usize = 10_000;
const GPUS: usize = 8;
const ITERS: usize = 30;

fn snapshot() -> Snapshot {
    let mut s = Snapshot::default();
    for g in 0..GPUS {
        s.gpus.push(Arc::new(GpuView {
            index: g as u32,
            uuid: format!("GPU-{g:08}-0000-0000-0000-000000000000"),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_total_bytes: 80 << 30,
            memory_used_bytes: 40 << 30,
            memory_free_bytes: 40 << 30,
            healthy: true,
            isolation_backend: "soft".into(),
            ..Default::default()
        }));
    }
    for w in 0..WORKLOADS {
        s.workloads.push(
            WorkloadView {
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
            }
            .into(),
        );
    }
    for p in 0..PROCESSES {
        s.processes.push(Arc::new(ProcessView {
            pid: 10_000 + p as u32,
            comm: "python3".into(),
            workload: format!("containerd://{:064x}", p % WORKLOADS),
            gpu_uuid: s.gpus[p % GPUS].uuid.clone(),
            used_bytes: Some(100 << 20),
            ..Default::default()
        }));
    }
    s
}

/// `s` with 1 % of its workload and process rows using 1 MiB more.
fn one_percent_changed(s: &Snapshot) -> Snapshot {
    let mut s = s.clone();
    for w in s.workloads.iter_mut().step_by(100) {
        w.used_bytes += 1 << 20;
    }
    for p in s.processes.iter_mut().step_by(100) {
        let p = Arc::make_mut(p);
        p.used_bytes = p.used_bytes.map(|b| b + (1 << 20));
    }
    s
}

fn ms(v: &[f64]) -> String {
    format!(
        "median {:.2} ms, max {:.2} ms",
        v[v.len() / 2] / 1e3,
        v[v.len() - 1] / 1e3
    )
}

fn run(process_series: bool) {
    let a = Arc::new(snapshot());
    let b = Arc::new(one_percent_changed(&a));
    // Equal to `a`, another allocation: what the agent publishes when nothing changed.
    let a2 = Arc::new((*a).clone());
    let shared: SharedSnapshot = Arc::new(std::sync::RwLock::new(a.clone()));
    let m = Metrics::with_options(
        shared.clone(),
        Compat {
            hami: true,
            ..Default::default()
        },
        process_series,
    );
    let publish = |s: &Arc<Snapshot>| *shared.write().unwrap() = s.clone();
    let series = if process_series {
        " with --process-metrics"
    } else {
        ""
    };
    // `GPUSHARE_BENCH_QUICK=1`: a few iterations, figures not to be judged (a smoke run).
    let iters = gpushare_testkit::bench::iters(ITERS, 3);
    for (name, openmetrics) in [("prometheus text", false), ("openmetrics text", true)] {
        let render = || {
            if openmetrics {
                m.render_openmetrics()
            } else {
                m.render_prometheus()
            }
        };
        publish(&a);
        let text = render();
        let (bytes, lines) = (text.len(), text.lines().count());
        let cold = gpushare_testkit::bench::sorted_us(iters, || {
            m.clear_cache();
            render()
        });
        // Each scrape sees the other snapshot: 1 % of the rows changed since the last one.
        let mut flip = false;
        let changed = gpushare_testkit::bench::sorted_us(iters, || {
            flip = !flip;
            publish(if flip { &b } else { &a });
            render()
        });
        let mut flip = false;
        let unchanged = gpushare_testkit::bench::sorted_us(iters, || {
            flip = !flip;
            publish(if flip { &a2 } else { &a });
            render()
        });
        let what = format!(
            "/metrics ({name}) with {WORKLOADS} workloads, {PROCESSES} processes, {GPUS} GPUs{series}"
        );
        println!(
            "{what}: cold {} ({lines} lines, {:.1} MiB)",
            ms(&cold),
            bytes as f64 / (1 << 20) as f64
        );
        println!("{what}: 1 % of rows changed {}", ms(&changed));
        println!("{what}: unchanged {}", ms(&unchanged));
    }
    // Both formats cached (each format's cold runs emptied both).
    publish(&a);
    m.render_prometheus();
    m.render_openmetrics();
    let stats = m.cache_stats();
    println!(
        "scrape cache{series}, both formats scraped: {} rows, {:.1} MiB",
        stats.rows,
        stats.cached_bytes as f64 / (1 << 20) as f64
    );
}

fn main() {
    run(false);
    run(true);
}
