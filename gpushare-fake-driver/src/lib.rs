//! What gpushare's two mock NVIDIA libraries share: the scenario file (named by
//! `GPUSHARE_FAKE_NVML_STATE`), and the state files beside it that carry what one process did
//! through a mock (checkpointed a pid, set a memory limit) to every other process that loads one.
//!
//! The mock libnvidia-ml is `gpushare-fake-nvml`, the mock libcuda `gpushare-fake-cuda`; each is
//! a cdylib of its own and depends on this rlib, not on the other (a cdylib re-exports the
//! `#[no_mangle]` functions of every crate it links).

pub mod checkpoint;
pub mod cuda;
pub mod install;
pub mod limits;
pub mod scenario;
pub mod statefile;

pub use scenario::{Device, ENV_VAR, Process, Scenario};

/// Every function the mock libnvidia-ml exports (and so may name in the scenario's `fail` map).
pub const NVML_FUNCTIONS: &[&str] = &[
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
    "nvmlDeviceSetMemoryLimits_v1",
    "nvmlDeviceGetMemoryLimits_v1",
];

/// Symbols the mock libnvidia-ml must never export: nvitop reads 32-byte process records when
/// `nvmlDeviceGetConfComputeMemSizeInfo` exists without `nvmlDeviceGetRunningProcessDetailList`.
pub const NVML_FORBIDDEN_FUNCTIONS: &[&str] = &["nvmlDeviceGetConfComputeMemSizeInfo"];

/// Every function the mock libcuda exports (and so may name in the scenario's `cuda.fail` map,
/// except the error-text functions).
pub const CUDA_FUNCTIONS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuGetProcAddress_v2",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
];

/// The checkpoint entry points (`cuGetProcAddress` finds them only when the scenario's
/// `cuda_driver_version` is at least [`cuda::CHECKPOINT_API_VERSION`]).
pub const CUDA_CHECKPOINT_FUNCTIONS: &[&str] = &[
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
];
