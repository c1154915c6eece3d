//! The CUDA driver facts the mock libcuda needs (CUresult codes, `CUprocessState`) and the
//! scenario's `cuda` section: the knobs that inject the checkpoint API's failures and delays.
//!
//! Values are NVIDIA's `cuda.h` (PyPI `nvidia-cuda-runtime` 13.5.37, `nvidia/cu13/include/cuda.h`;
//! the checkpoint API first appears in CUDA 12.8, `nvidia-cuda-runtime-cu12` 12.8.90). The C
//! check in `gpushare-fake-cuda/abi/` compares them with the header.

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// First CUDA driver version with the checkpoint driver API (`cuDriverGetVersion` value; CUDA
/// 12.8, NVIDIA driver r570): the `PFN_cuCheckpointProcess*_v12080` typedefs of cudaTypedefs.h.
pub const CHECKPOINT_API_VERSION: i32 = 12080;
/// Longest injected delay.
pub const MAX_DELAY_MS: u64 = 600_000;

/// CUresult values used by the mock.
pub mod code {
    pub const SUCCESS: u32 = 0;
    pub const ERROR_INVALID_VALUE: u32 = 1;
    pub const ERROR_OUT_OF_MEMORY: u32 = 2;
    pub const ERROR_NOT_INITIALIZED: u32 = 3;
    pub const ERROR_DEINITIALIZED: u32 = 4;
    pub const ERROR_NO_DEVICE: u32 = 100;
    pub const ERROR_INVALID_DEVICE: u32 = 101;
    pub const ERROR_INVALID_CONTEXT: u32 = 201;
    pub const ERROR_OPERATING_SYSTEM: u32 = 304;
    pub const ERROR_INVALID_HANDLE: u32 = 400;
    pub const ERROR_ILLEGAL_STATE: u32 = 401;
    pub const ERROR_NOT_FOUND: u32 = 500;
    pub const ERROR_NOT_READY: u32 = 600;
    pub const ERROR_NOT_PERMITTED: u32 = 800;
    pub const ERROR_NOT_SUPPORTED: u32 = 801;
    pub const ERROR_SYSTEM_DRIVER_MISMATCH: u32 = 803;
    pub const ERROR_TIMEOUT: u32 = 909;
    pub const ERROR_UNKNOWN: u32 = 999;
}

/// (code, `cuGetErrorName`, `cuGetErrorString`) of every CUresult the mock knows; other codes
/// make both functions return CUDA_ERROR_INVALID_VALUE, as the real ones do. The texts are the
/// driver's wording where it was seen in public reports (304, 2, 3), the runtime's
/// `cudaGetErrorString` wording otherwise.
pub const RESULTS: &[(u32, &str, &str)] = &[
    (code::SUCCESS, "CUDA_SUCCESS", "no error"),
    (
        code::ERROR_INVALID_VALUE,
        "CUDA_ERROR_INVALID_VALUE",
        "invalid argument",
    ),
    (
        code::ERROR_OUT_OF_MEMORY,
        "CUDA_ERROR_OUT_OF_MEMORY",
        "out of memory",
    ),
    (
        code::ERROR_NOT_INITIALIZED,
        "CUDA_ERROR_NOT_INITIALIZED",
        "initialization error",
    ),
    (
        code::ERROR_DEINITIALIZED,
        "CUDA_ERROR_DEINITIALIZED",
        "driver shutting down",
    ),
    (
        code::ERROR_NO_DEVICE,
        "CUDA_ERROR_NO_DEVICE",
        "no CUDA-capable device is detected",
    ),
    (
        code::ERROR_INVALID_DEVICE,
        "CUDA_ERROR_INVALID_DEVICE",
        "invalid device ordinal",
    ),
    (
        code::ERROR_INVALID_CONTEXT,
        "CUDA_ERROR_INVALID_CONTEXT",
        "invalid device context",
    ),
    (
        code::ERROR_OPERATING_SYSTEM,
        "CUDA_ERROR_OPERATING_SYSTEM",
        "OS call failed or operation not supported on this OS",
    ),
    (
        code::ERROR_INVALID_HANDLE,
        "CUDA_ERROR_INVALID_HANDLE",
        "invalid resource handle",
    ),
    (
        code::ERROR_ILLEGAL_STATE,
        "CUDA_ERROR_ILLEGAL_STATE",
        "the operation cannot be performed in the present state",
    ),
    (
        code::ERROR_NOT_FOUND,
        "CUDA_ERROR_NOT_FOUND",
        "named symbol not found",
    ),
    (
        code::ERROR_NOT_READY,
        "CUDA_ERROR_NOT_READY",
        "device not ready",
    ),
    (
        code::ERROR_NOT_PERMITTED,
        "CUDA_ERROR_NOT_PERMITTED",
        "operation not permitted",
    ),
    (
        code::ERROR_NOT_SUPPORTED,
        "CUDA_ERROR_NOT_SUPPORTED",
        "operation not supported",
    ),
    (
        code::ERROR_SYSTEM_DRIVER_MISMATCH,
        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        "system has unsupported display driver / cuda driver combination",
    ),
    (
        code::ERROR_TIMEOUT,
        "CUDA_ERROR_TIMEOUT",
        "the operation timed out",
    ),
    (code::ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"),
];

/// (name, text) of `code`, when the mock knows it.
pub fn result(code: u32) -> Option<(&'static str, &'static str)> {
    RESULTS
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, t)| (*n, *t))
}

/// `CUprocessState` (cuda.h). CHECKPOINTING (4) and RESTORING (5) exist from CUDA 13.4 on, only
/// for checkpoints to custom storage, which the mock does not implement.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum ProcessState {
    /// CU_PROCESS_STATE_RUNNING = 0.
    #[default]
    Running = 0,
    /// CU_PROCESS_STATE_LOCKED = 1.
    Locked = 1,
    /// CU_PROCESS_STATE_CHECKPOINTED = 2.
    Checkpointed = 2,
    /// CU_PROCESS_STATE_FAILED = 3.
    Failed = 3,
}

/// The scenario's `cuda` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaScenario {
    /// Time every `cuCheckpointProcessCheckpoint` takes before it answers (ms).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checkpoint_delay_ms: u64,
    /// Time every `cuCheckpointProcessRestore` takes before it answers (ms).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restore_delay_ms: u64,
    /// true: restore works without a `cuInit` in the calling process (persistence mode on).
    #[serde(default, skip_serializing_if = "is_false")]
    pub persistence_mode: bool,
    /// The state a restore that runs out of GPU memory leaves the process in: `checkpointed`
    /// (default, restorable later) or `failed` (driver 580.95, cuda-checkpoint#44: such a process
    /// cannot be restored any more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_memory_state: Option<ProcessState>,
    /// Exported function -> CUresult forced on every call of it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fail: BTreeMap<CudaFunctionName, CuResult>,
    /// Per-pid behaviour of the checkpoint API (keys are pids).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub processes: BTreeMap<u32, CudaProcess>,
}

/// How the checkpoint API treats one process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaProcess {
    /// true: the process never gets to a point where it can be locked (a kernel that never ends,
    /// a thread stuck in the driver): a lock waits its whole timeout and fails with
    /// CUDA_ERROR_NOT_READY, as a lock of a frozen process does.
    #[serde(default, skip_serializing_if = "is_false")]
    pub lock_timeout: bool,
    /// true: a checkpoint succeeds but NVML keeps listing the process's memory (what the driver
    /// did not move off the GPU, or memory that leaves late): the mock NVML does not hide it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub memory_stays: bool,
    /// `cuCheckpointProcessCheckpoint` fails with this error (e.g. 801 NOT_SUPPORTED for a
    /// process using UVM or IPC memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_error: Option<InjectedError>,
    /// `cuCheckpointProcessRestore` fails with this error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_error: Option<InjectedError>,
    /// Overrides `checkpoint_delay_ms` for this process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_delay_ms: Option<u64>,
    /// Overrides `restore_delay_ms` for this process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_delay_ms: Option<u64>,
}

/// An error a call returns, and the state it leaves the process in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InjectedError {
    /// The CUresult.
    pub code: CuResult,
    /// The state afterwards: for a checkpoint `locked` (default) or `failed`; for a restore
    /// `checkpointed` (default) or `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ProcessState>,
}

/// A CUresult error code the mock knows (not CUDA_SUCCESS), checked while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct CuResult(u32);

impl CuResult {
    /// Fails for 0 and for codes without a name in [`RESULTS`].
    pub fn new(code: u32) -> Result<Self, String> {
        if code != code::SUCCESS && result(code).is_some() {
            Ok(Self(code))
        } else {
            Err(format!(
                "CUresult {code} is not an error code this mock knows (one of: {})",
                RESULTS
                    .iter()
                    .skip(1)
                    .map(|(c, n, _)| format!("{c} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    }

    /// The code.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl<'de> Deserialize<'de> for CuResult {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        CuResult::new(u32::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A key of `cuda.fail`: a function the mock libcuda exports (except the two error-text
/// functions, which cannot fail).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct CudaFunctionName(String);

const NEVER_FAIL: &[&str] = &["cuGetErrorName", "cuGetErrorString"];

impl CudaFunctionName {
    /// Fails for names the mock libcuda does not export.
    pub fn new(name: &str) -> Result<Self, String> {
        crate::failable("cuda.fail", name, crate::CUDA_FUNCTIONS, NEVER_FAIL).map(Self)
    }
}

failable_function_name!(CudaFunctionName);

fn is_zero(v: &u64) -> bool {
    *v == 0
}
fn is_false(v: &bool) -> bool {
    !*v
}

impl CudaScenario {
    /// Whether nothing is set (the section is then left out when serialized).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks what serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        for (field, v) in [
            ("cuda.checkpoint_delay_ms", self.checkpoint_delay_ms),
            ("cuda.restore_delay_ms", self.restore_delay_ms),
        ] {
            check_delay(field, v)?;
        }
        check_after(
            "cuda.out_of_memory_state",
            self.out_of_memory_state,
            &[ProcessState::Checkpointed, ProcessState::Failed],
        )?;
        for (pid, p) in &self.processes {
            if *pid == 0 || *pid > i32::MAX as u32 {
                return Err(format!("cuda.processes.{pid}: not a valid pid"));
            }
            for (field, v) in [
                ("checkpoint_delay_ms", p.checkpoint_delay_ms),
                ("restore_delay_ms", p.restore_delay_ms),
            ] {
                if let Some(v) = v {
                    check_delay(&format!("cuda.processes.{pid}.{field}"), v)?;
                }
            }
            for (field, error, allowed) in [
                (
                    "checkpoint_error",
                    p.checkpoint_error,
                    [ProcessState::Locked, ProcessState::Failed],
                ),
                (
                    "restore_error",
                    p.restore_error,
                    [ProcessState::Checkpointed, ProcessState::Failed],
                ),
            ] {
                if let Some(e) = error {
                    check_after(
                        &format!("cuda.processes.{pid}.{field}.state"),
                        e.state,
                        &allowed,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// The knobs of `pid` (defaults when it has none).
    pub fn process(&self, pid: u32) -> CudaProcess {
        self.processes.get(&pid).cloned().unwrap_or_default()
    }
}

fn check_delay(field: &str, v: u64) -> Result<(), String> {
    if v > MAX_DELAY_MS {
        return Err(format!("{field}: {v} ms exceeds {MAX_DELAY_MS} ms"));
    }
    Ok(())
}

fn check_after(
    field: &str,
    state: Option<ProcessState>,
    allowed: &[ProcessState],
) -> Result<(), String> {
    match state {
        Some(s) if !allowed.contains(&s) => Err(format!(
            "{field}: {s:?} is not a state this call can leave a process in (one of: {})",
            allowed
                .iter()
                .map(|s| format!("{s:?}").to_lowercase())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => Ok(()),
    }
}
