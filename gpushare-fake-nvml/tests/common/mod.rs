//! The mock NVML's tests use the workspace's one test-support place
//! ([`gpushare_testkit::nvml`]: the built cdylib, one scenario file per test binary behind a
//! lock; [`gpushare_testkit::skip`]: the python venv and when a missing one is a failure); this
//! adds only what is the NVML mock's own.
#![allow(dead_code, unused_imports)]

use std::{path::PathBuf, sync::MutexGuard};

use gpushare_fake_nvml::{ENV_VAR, Scenario};
pub use gpushare_testkit::{
    nvml::{TestEnv, write_atomic, write_scenario},
    skip::{pyenv, skip_or_fail},
};

/// The mock NVML cargo built for this test run (`target/<profile>/deps/`).
pub fn built_lib() -> PathBuf {
    gpushare_testkit::nvml::built_cdylib(gpushare_fake_nvml::install::BUILT_NAME)
}

/// Serializes the tests of this binary, with the scenario variable set on first use.
pub fn lock() -> (MutexGuard<'static, ()>, &'static TestEnv) {
    gpushare_testkit::nvml::lock(ENV_VAR)
}

/// A device's (used, free) memory as NVML reports it, worked out here, independently of the mock:
/// each pid counts once (its largest record), and used never exceeds what is not reserved.
pub fn memory(d: &gpushare_fake_nvml::Device) -> (u64, u64) {
    let mut by_pid: std::collections::BTreeMap<u32, u64> = Default::default();
    for p in d.compute_processes.iter().chain(&d.graphics_processes) {
        if let Some(u) = p.used_memory {
            let e = by_pid.entry(p.pid).or_default();
            *e = (*e).max(u);
        }
    }
    let avail = d.memory_total - d.memory_reserved;
    let used = by_pid.values().sum::<u64>().min(avail);
    (used, avail - used)
}

/// A scenario exercising most fields: two healthy devices with compute and graphics processes
/// (one with unknown usage) and a third with none.
pub fn rich_scenario() -> Scenario {
    use gpushare_fake_nvml::{Device, Process};
    let mut d0 = Device::new(
        "GPU-0b6c1e7a-0000-4000-8000-000000000000",
        "NVIDIA Fake H100 80GB HBM3",
        80 << 30,
    );
    d0.memory_reserved = 512 << 20;
    d0.utilization_gpu = 37;
    d0.utilization_memory = 12;
    d0.temperature = 41;
    d0.power_usage = 123_000;
    d0.compute_processes = vec![
        Process::new(4_000_001, Some(1 << 30)),
        Process::new(4_000_002, None),
        Process::new(4_000_003, Some(3 << 30)),
    ];
    d0.graphics_processes = vec![Process::new(4_000_004, Some(256 << 20))];
    let mut d1 = Device::new(
        "GPU-1f00d000-0000-4000-8000-000000000001",
        "NVIDIA Fake A10",
        24 << 30,
    );
    d1.memory_reserved = 300 << 20;
    d1.compute_processes = vec![Process::new(4_000_010, Some(20 << 30))];
    let d2 = Device::new("GPU-2", "x", 1000);
    Scenario {
        driver_version: "550.54.15".into(),
        nvml_version: "12.550.54.15".into(),
        cuda_driver_version: 12040,
        devices: vec![d0, d1, d2],
        ..Scenario::default()
    }
}
