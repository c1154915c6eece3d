//! What gpushare's two mock NVIDIA libraries share: the scenario file (named by
//! `GPUSHARE_FAKE_NVML_STATE`), and the state files beside it that carry what one process did
//! through a mock (checkpointed a pid, set a memory limit) to every other process that loads one.
//!
//! The mock libnvidia-ml is `gpushare-fake-nvml`, the mock libcuda `gpushare-fake-cuda`; each is
//! a cdylib of its own and depends on this rlib, not on the other (a cdylib re-exports the
//! `#[no_mangle]` functions of every crate it links).

/// A newtype over the name of a function a scenario's `fail` table may make fail, built only by
/// its checking `new`: `as_str`, `Borrow<str>` (to look a name up), and a `Deserialize` that
/// checks through `new` (so a typo is reported with its line and column).
macro_rules! failable_function_name {
    ($name:ident) => {
        impl $name {
            /// The name.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $name::new(&String::deserialize(d)?).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// `name` when it is one of `exported` and not one of `never` (functions that cannot fail), else
/// what is wrong with the key in `table`, listing the names it could be.
fn failable(table: &str, name: &str, exported: &[&str], never: &[&str]) -> Result<String, String> {
    if !never.contains(&name) && exported.contains(&name) {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "`{table}` key {name:?} is not a function this mock can fail (one of: {})",
            exported
                .iter()
                .filter(|n| !never.contains(n))
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

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
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
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
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetProcessesUtilizationInfo",
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
