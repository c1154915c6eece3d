//! A mock `libnvidia-ml.so.1`: the NVML C ABI that gpushare (and pynvml, nvitop, nvml-wrapper)
//! use, driven by a JSON scenario file named by `GPUSHARE_FAKE_NVML_STATE`.
//!
//! The cdylib is the mock itself (install it with [`install_into`] or the
//! `gpushare-fake-nvml-install` binary); the rlib gives tests the scenario types.
//! See README.md for the scenario format and the exact semantics.

pub mod abi;
pub mod codes;
mod ffi;
mod handles;
pub mod install;
mod state;

/// The scenario types (shared with the mock libcuda).
pub use gpushare_fake_driver::scenario;

pub use install::{LIB_NAME, LINK_NAME, install_into};
pub use scenario::{Device, ENV_VAR, Process, Scenario};

/// Symbols the mock must never export: nvitop reads 32-byte process records when
/// `nvmlDeviceGetConfComputeMemSizeInfo` exists without `nvmlDeviceGetRunningProcessDetailList`.
pub use gpushare_fake_driver::NVML_FORBIDDEN_FUNCTIONS as FORBIDDEN_FUNCTIONS;
/// Every function the mock exports (and so may name in the scenario's `fail` map).
pub use gpushare_fake_driver::NVML_FUNCTIONS as EXPORTED_FUNCTIONS;
