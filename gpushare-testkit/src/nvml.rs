//! The mock libnvidia-ml, the mock libcuda and their shared scenario file, for tests of the
//! agent's real NVML path and of its CUDA checkpoint loader.

use std::path::{Path, PathBuf};

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
        let tmp = self.dir.join(format!("scenario.json.{}", unique("tmp")));
        std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)?;
        std::fs::rename(&tmp, &self.path).context("replacing the scenario")
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
