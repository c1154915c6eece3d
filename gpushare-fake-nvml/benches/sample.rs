//! Cost of one full NVML sample through the mock, as the agent takes it with nvml-wrapper:
//! for each of 8 devices, memory_info + running_compute_processes + running_graphics_processes
//! (64 compute processes per device). Prints median/mean/p99 and the parts side by side.
//!
//! `cargo bench -p gpushare-fake-nvml --bench sample` (plain std::time; no timed assertions).

use gpushare_fake_nvml::{Device, ENV_VAR, Process, Scenario};
use nvml_wrapper::Nvml;
use std::time::{Duration, Instant};

const DEVICES: usize = 8;
const PROCESSES: u32 = 64;

fn scenario() -> Scenario {
    let devices = (0..DEVICES)
        .map(|i| {
            let mut d = Device::new(format!("GPU-bench-{i}"), "NVIDIA Fake H100", 80 << 30);
            d.memory_reserved = 512 << 20;
            d.compute_processes = (0..PROCESSES)
                .map(|p| Process::new(100_000 + i as u32 * 1000 + p, Some(64 << 20)))
                .collect();
            d
        })
        .collect();
    Scenario {
        devices,
        ..Scenario::default()
    }
}

struct Stats {
    median: Duration,
    mean: Duration,
    p99: Duration,
    n: usize,
}

fn measure(budget: Duration, mut f: impl FnMut()) -> Stats {
    for _ in 0..50 {
        f();
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < budget || samples.len() < 100 {
        let t = Instant::now();
        f();
        samples.push(t.elapsed());
    }
    samples.sort();
    let n = samples.len();
    Stats {
        median: samples[n / 2],
        mean: samples.iter().sum::<Duration>() / n as u32,
        p99: samples[(n * 99 / 100).min(n - 1)],
        n,
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    // `cargo bench` passes --bench; a filter argument that does not match skips the run.
    if let Some(filter) = std::env::args().skip(1).find(|a| !a.starts_with('-'))
        && !"sample".contains(filter.as_str())
    {
        return;
    }
    let (_g, env) = gpushare_testkit::nvml::lock(ENV_VAR);
    gpushare_testkit::nvml::write_scenario(&env.state, &scenario());

    // `cargo bench` builds the cdylib into target/<profile>/deps/, next to this executable.
    let lib = gpushare_testkit::nvml::built_cdylib(gpushare_fake_nvml::install::BUILT_NAME);
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("init mock");
    let devices: Vec<_> = (0..DEVICES as u32)
        .map(|i| nvml.device_by_index(i).expect("device"))
        .collect();

    // `GPUSHARE_BENCH_QUICK=1`: a short budget, figures not to be judged (a smoke run).
    let budget = if std::env::var_os("GPUSHARE_BENCH_QUICK").is_some() {
        Duration::from_millis(50)
    } else {
        Duration::from_secs(2)
    };
    let full = measure(budget, || {
        for d in &devices {
            let m = d.memory_info().expect("memory_info");
            let c = d.running_compute_processes().expect("compute");
            let g = d.running_graphics_processes().expect("graphics");
            std::hint::black_box((m, c, g));
        }
    });
    let memory_only = measure(budget / 2, || {
        for d in &devices {
            std::hint::black_box(d.memory_info().expect("memory_info"));
        }
    });
    let compute_only = measure(budget / 2, || {
        for d in &devices {
            std::hint::black_box(d.running_compute_processes().expect("compute"));
        }
    });
    let count_only = measure(budget / 2, || {
        std::hint::black_box(nvml.device_count().expect("count"));
    });

    println!(
        "full sample {DEVICES} devices x {PROCESSES} processes: median {:.1} us, mean {:.1} us, p99 {:.1} us ({} iterations)",
        us(full.median),
        us(full.mean),
        us(full.p99),
        full.n
    );
    for (what, s) in [
        ("memory_info x8", &memory_only),
        ("running_compute_processes x8", &compute_only),
        ("device_count x1 (per-call floor)", &count_only),
    ] {
        println!(
            "  {what}: median {:.2} us ({:.2}x of the full sample, {} iterations)",
            us(s.median),
            us(s.median) / us(full.median),
            s.n
        );
    }
}
