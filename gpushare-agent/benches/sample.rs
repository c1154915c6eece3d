//! Cost of one full NVML sample through the agent's sampler (nvml-wrapper -> mock libnvidia-ml ->
//! merge and distrust checks) for 8 GPUs x 64 processes, next to the bare nvml-wrapper calls it
//! makes, measured side by side in one run.
//!
//! Run: `cargo bench -p gpushare-agent --bench sample` (after `cargo build`), or `cargo xtask bench`.
//! `GPUSHARE_BENCH_QUICK=1`: a few iterations, figures not to be judged (a smoke run).

use gpushare_agent::nvml::NvmlSampler;
use gpushare_testkit::nvml::{SCENARIO_ENV, Scenario};
use serde_json::json;

const DEVICES: usize = 8;
const PROCS: usize = 64;
const ITERS: usize = 2_000;

fn main() {
    let lib = gpushare_testkit::target_profile_dir().join("../debug/libgpushare_fake_nvml.so");
    let lib = if lib.exists() {
        lib
    } else {
        gpushare_testkit::target_profile_dir().join("libgpushare_fake_nvml.so")
    };
    if !lib.exists() {
        eprintln!("sample bench: FAILED: the mock libnvidia-ml is not built (run `cargo build`)");
        std::process::exit(1);
    }
    // Real pids, so the sampler's /proc existence checks do their real work.
    let pids: Vec<u32> = procfs::process::all_processes()
        .expect("/proc")
        .filter_map(|p| p.ok().map(|p| p.pid as u32))
        .take(PROCS)
        .collect();
    assert!(!pids.is_empty());
    let devices: Vec<_> = (0..DEVICES)
        .map(|d| {
            let procs: Vec<_> = (0..PROCS)
                .map(|i| json!({ "pid": pids[i % pids.len()], "used_memory": 1u64 << 20 }))
                .collect::<Vec<_>>();
            let mut seen = std::collections::BTreeSet::new();
            let procs: Vec<_> = procs.into_iter().filter(|p| seen.insert(p["pid"].as_u64())).collect();
            json!({ "uuid": format!("GPU-{d}"), "name": "bench", "memory_total": 80u64 << 30, "compute_processes": procs })
        })
        .collect();
    let n_procs = devices[0]["compute_processes"].as_array().unwrap().len();
    let scenario = Scenario::create(&json!({ "devices": devices })).unwrap();
    unsafe { std::env::set_var(SCENARIO_ENV, scenario.path()) };

    let mut sampler = NvmlSampler::open(Some(&lib));
    let s = sampler.sample();
    assert_eq!(s.devices.len(), DEVICES, "mock not serving the scenario");
    assert_eq!(s.processes.len(), DEVICES * n_procs);

    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap();
    let iters = gpushare_testkit::bench::iters(ITERS, 20);
    let bare = time(iters, || {
        for i in 0..DEVICES as u32 {
            let d = nvml.device_by_index(i).unwrap();
            let _ = std::hint::black_box((
                d.uuid(),
                d.name(),
                d.memory_info(),
                d.running_compute_processes(),
                d.running_graphics_processes(),
            ));
        }
    });
    let full = time(iters, || {
        std::hint::black_box(sampler.sample());
    });
    println!(
        "one full sample, {DEVICES} GPUs x {n_procs} processes, through the mock ({} iterations, median):",
        iters
    );
    println!("  nvml-wrapper calls alone          {:>9.1} us", bare);
    println!(
        "  agent sampler (calls + checks)    {:>9.1} us   ({:.2}x)",
        full,
        full / bare
    );
}

fn time(iters: usize, f: impl FnMut()) -> f64 {
    gpushare_testkit::bench::median_us(iters, f)
}
