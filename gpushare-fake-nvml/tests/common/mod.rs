//! Helpers shared by the integration tests: where the built mock is, one scenario file per test
//! binary (named by GPUSHARE_FAKE_NVML_STATE, which is process-global), a lock that serializes
//! the tests of one binary, and the python venv / NVIDIA header location.
#![allow(dead_code)]

use gpushare_fake_nvml::{ENV_VAR, Scenario};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// The cdylib cargo built for this test run. `cargo test` builds it into
/// `target/<profile>/deps/` (next to the test executable) but does not copy it up to
/// `target/<profile>/` the way `cargo build` does, so the copy there may be stale: use deps/.
pub fn built_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test executable has a directory");
    let lib = deps.join(gpushare_fake_nvml::install::BUILT_NAME);
    assert!(
        lib.is_file(),
        "{} was not built (cargo builds the cdylib with the tests of this package)",
        lib.display()
    );
    lib
}

/// The scenario file and a scratch directory of this test binary.
pub struct TestEnv {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
}

static LOCK: Mutex<()> = Mutex::new(());
static ENV: OnceLock<TestEnv> = OnceLock::new();

/// Serializes the tests of one binary (they share the env var, the scenario file and the
/// library's global state). Also sets the env var on first use.
pub fn lock() -> (MutexGuard<'static, ()>, &'static TestEnv) {
    let guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let env = ENV.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("scenario.json");
        // SAFETY: done once, under LOCK, before any test loads the library; no other test
        // thread touches the environment concurrently.
        unsafe { std::env::set_var(ENV_VAR, &state) };
        TestEnv { dir, state }
    });
    (guard, env)
}

/// Replaces `path` atomically (write a temporary file, rename over).
pub fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, text).expect("write scenario");
    std::fs::rename(&tmp, path).expect("rename scenario");
}

pub fn write_scenario(path: &Path, scenario: &Scenario) {
    write_atomic(
        path,
        &serde_json::to_string_pretty(scenario).expect("serialize"),
    );
}

/// Where the python venv lives: `$GPUSHARE_PYENV`, default `<workspace>/target/pyenv`.
pub fn pyenv() -> PathBuf {
    match std::env::var_os("GPUSHARE_PYENV") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target")
            .join("pyenv"),
    }
}

/// Skips loudly, or fails when `GPUSHARE_REQUIRE_PYENV=1` (CI, where setup creates the venv).
pub fn skip_or_fail(what: &str) {
    if std::env::var("GPUSHARE_REQUIRE_PYENV").as_deref() == Ok("1") {
        panic!("GPUSHARE_REQUIRE_PYENV=1 but {what} (run scripts/setup.sh)");
    }
    // Straight to fd 2: libtest captures eprintln! of passing tests, and this must be seen.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "\n=== SKIPPED: {what}; run scripts/setup.sh or set GPUSHARE_PYENV ===\n"
    );
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
