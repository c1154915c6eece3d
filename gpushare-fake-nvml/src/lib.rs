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
pub mod scenario;
mod state;

pub use install::{LIB_NAME, LINK_NAME, install_into};
pub use scenario::{Device, ENV_VAR, Process, Scenario};

/// Every function the mock exports (and so may name in the scenario's `fail` map).
pub const EXPORTED_FUNCTIONS: &[&str] = &[
    "nvmlInit",
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetProcessUtilization",
];

/// Symbols the mock must never export: nvitop reads 32-byte process records when
/// `nvmlDeviceGetConfComputeMemSizeInfo` exists without `nvmlDeviceGetRunningProcessDetailList`.
pub const FORBIDDEN_FUNCTIONS: &[&str] = &["nvmlDeviceGetConfComputeMemSizeInfo"];
