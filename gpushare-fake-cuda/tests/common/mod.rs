//! The mock libcuda's tests use the workspace's one test-support place
//! ([`gpushare_testkit::nvml`]: the built cdylib, one scenario file per test binary behind a
//! lock; [`gpushare_testkit::skip`]: the venv with NVIDIA's cuda.h and when a missing one is a
//! failure); this adds only what is the CUDA mock's own.
#![allow(dead_code, unused_imports)]

use std::{path::PathBuf, sync::MutexGuard};

use gpushare_fake_driver::ENV_VAR;
pub use gpushare_testkit::{
    nvml::{TestEnv, write_scenario},
    skip::{pyenv, skip_or_fail},
};

/// The mock libcuda cargo built for this test run (`target/<profile>/deps/`).
pub fn built_lib() -> PathBuf {
    gpushare_testkit::nvml::built_cdylib(gpushare_fake_cuda::install::BUILT_NAME)
}

/// Serializes the tests of this binary, with the scenario variable set on first use; clears the
/// checkpoint states.
pub fn lock() -> (MutexGuard<'static, ()>, &'static TestEnv) {
    let (guard, env) = gpushare_testkit::nvml::lock(ENV_VAR);
    let _ = std::fs::remove_file(gpushare_fake_driver::checkpoint::path_for(&env.state));
    (guard, env)
}
