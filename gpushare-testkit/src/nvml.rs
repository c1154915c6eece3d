//! The mock libnvidia-ml, the mock libcuda and their shared scenario file: for tests of the
//! agent's real NVML path and of its CUDA checkpoint loader ([`Scenario`], one per test), and for
//! the mocks' own tests ([`lock`]: one scenario per test binary, since the variable naming it is
//! process-global).

use std::{
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard, OnceLock, PoisonError},
};

use anyhow::{Context, Result};

use crate::unique;

/// Env var the mock reads its scenario path from.
pub const SCENARIO_ENV: &str = "GPUSHARE_FAKE_NVML_STATE";

/// Path of the built mock (`cargo build` puts it in `target/<profile>/`).
pub fn fake_nvml_lib() -> PathBuf {
    crate::workspace_bin("libgpushare_fake_nvml.so")
}

/// Path of the built mock libcuda (`cargo build` puts it in `target/<profile>/`). It reads the
/// same scenario (its `cuda` section) and keeps the per-process checkpoint states in
/// [`Scenario::cuda_state_path`].
pub fn fake_cuda_lib() -> PathBuf {
    crate::workspace_bin("libgpushare_fake_cuda.so")
}

/// A scenario file in a private temporary directory, replaced atomically on each write.
pub struct Scenario {
    dir: PathBuf,
    path: PathBuf,
}

impl Scenario {
    /// Creates the directory and writes `initial`.
    pub fn create(initial: &serde_json::Value) -> Result<Self> {
        let dir = std::env::temp_dir().join(unique("gpushare-nvml"));
        std::fs::create_dir_all(&dir)?;
        let s = Self {
            path: dir.join("scenario.json"),
            dir,
        };
        s.write(initial)?;
        Ok(s)
    }

    /// The scenario file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The scenario's directory (for `process_memory_dir` and the like).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the mock libcuda keeps its per-process states (`cuda-state.json` beside the
    /// scenario; absent while every process is running).
    pub fn cuda_state_path(&self) -> PathBuf {
        self.dir.join("cuda-state.json")
    }

    /// Where the mock NVML records driver-enforced memory limits (`memory-limits.json`).
    pub fn memory_limits_path(&self) -> PathBuf {
        self.dir.join("memory-limits.json")
    }

    /// Replaces the scenario atomically.
    pub fn write(&self, value: &serde_json::Value) -> Result<()> {
        replace(&self.path, &serde_json::to_vec_pretty(value)?).context("replacing the scenario")
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Replaces `path` atomically: writes a temporary file beside it, renames it over.
fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(unique("tmp"));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// A cdylib cargo built for this test run. `cargo test` builds it into `target/<profile>/deps/`
/// (next to the test executable) but does not copy it up to `target/<profile>/` the way `cargo
/// build` does, so the copy there may be stale: use deps/.
pub fn built_cdylib(file_name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test executable has a directory");
    let lib = deps.join(file_name);
    assert!(
        lib.is_file(),
        "{} was not built (cargo builds the cdylib with the tests of its package)",
        lib.display()
    );
    lib
}

/// Runs a mock's installer binary (`bin --from BUILT --to DIR`) and asserts that it succeeded.
pub fn run_installer(bin: impl AsRef<std::ffi::OsStr>, built: &Path, to: &Path) {
    crate::output_ok(
        std::process::Command::new(bin)
            .arg("--from")
            .arg(built)
            .arg("--to")
            .arg(to),
        "the installer",
    );
}

/// The scenario file and scratch directory of one test binary of a mock.
pub struct TestEnv {
    /// A private directory (for `process_memory_dir` and the like).
    pub dir: PathBuf,
    /// The scenario file in it, named by the mock's variable.
    pub state: PathBuf,
}

static LOCK: Mutex<()> = Mutex::new(());
static ENV: OnceLock<TestEnv> = OnceLock::new();

/// Serializes the tests of one binary (they share the variable, the scenario file and the loaded
/// library's global state). On first use, creates the directory and points `env_var` (the mock's
/// [`SCENARIO_ENV`]) at the scenario file.
pub fn lock(env_var: &str) -> (MutexGuard<'static, ()>, &'static TestEnv) {
    let guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let env = ENV.get_or_init(|| {
        let dir = std::env::temp_dir().join(unique("gpushare-mock-test"));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let state = dir.join("scenario.json");
        // SAFETY: done once, under LOCK, before any test loads the library; no other test
        // thread touches the environment concurrently.
        unsafe { std::env::set_var(env_var, &state) };
        TestEnv { dir, state }
    });
    (guard, env)
}

/// Replaces `path` atomically with `text` (a test may write a broken scenario on purpose).
pub fn write_atomic(path: &Path, text: &str) {
    replace(path, text.as_bytes()).expect("replace the scenario");
}

/// Replaces the scenario at `path` atomically with `scenario` as JSON.
pub fn write_scenario(path: &Path, scenario: &impl serde::Serialize) {
    write_atomic(
        path,
        &serde_json::to_string_pretty(scenario).expect("serialize"),
    );
}
