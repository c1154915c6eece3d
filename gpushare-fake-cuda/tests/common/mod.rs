//! Helpers of the mock libcuda's tests: the built cdylib, one scenario file per test binary
//! (GPUSHARE_FAKE_NVML_STATE is process-global), a lock serializing the tests of one binary, and
//! the venv with NVIDIA's cuda.h.
#![allow(dead_code)]

use gpushare_fake_driver::ENV_VAR;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// The cdylib cargo built for this test run (`target/<profile>/deps/`, next to the test).
pub fn built_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let lib = exe
        .parent()
        .expect("test executable has a directory")
        .join(gpushare_fake_cuda::install::BUILT_NAME);
    assert!(lib.is_file(), "{} was not built", lib.display());
    lib
}

/// The scenario file and scratch directory of this test binary.
pub struct TestEnv {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
}

static LOCK: Mutex<()> = Mutex::new(());
static ENV: OnceLock<TestEnv> = OnceLock::new();

/// Serializes the tests of one binary; sets the env var on first use; clears the checkpoint
/// states.
pub fn lock() -> (MutexGuard<'static, ()>, &'static TestEnv) {
    let guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let env = ENV.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("scenario.json");
        // SAFETY: once, under LOCK, before any test loads the library.
        unsafe { std::env::set_var(ENV_VAR, &state) };
        TestEnv { dir, state }
    });
    let _ = std::fs::remove_file(gpushare_fake_driver::checkpoint::path_for(&env.state));
    (guard, env)
}

/// Replaces the scenario atomically.
pub fn write_scenario(path: &Path, value: &serde_json::Value) {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(value).unwrap()).expect("write scenario");
    std::fs::rename(&tmp, path).expect("rename scenario");
}

/// `$GPUSHARE_PYENV`, default `<workspace>/target/pyenv`.
pub fn pyenv() -> PathBuf {
    match std::env::var_os("GPUSHARE_PYENV") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/pyenv"),
    }
}

/// Skips loudly, or fails when `GPUSHARE_REQUIRE_PYENV=1`.
pub fn skip_or_fail(what: &str) {
    if std::env::var("GPUSHARE_REQUIRE_PYENV").as_deref() == Ok("1") {
        panic!("GPUSHARE_REQUIRE_PYENV=1 but {what} (run scripts/setup.sh)");
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "\n=== SKIPPED: {what} (run scripts/setup.sh) ===\n"
    );
}
