//! `#[repr(C)]` mirrors of the cuda.h checkpoint argument structs and the `CUprocessState`
//! values. Layouts are pinned here by size assertions and checked against NVIDIA's cuda.h by
//! `tests/c_abi.rs` (`abi/cuda_abi_check.c`).
//!
//! The structs are the CUDA 12.8 layout (every field after `timeoutMs` reserved, must be zero).
//! Later headers give some reserved words a meaning without changing the size: CUDA 12.9/13.0
//! `CUcheckpointRestoreArgs.gpuPairs`/`gpuPairsCount` (GPU remapping), CUDA 13.4
//! `customStorageInfo_out` in the checkpoint and restore arguments (custom storage). The mock
//! implements neither: a non-zero word is CUDA_ERROR_INVALID_VALUE, as for a 12.8 driver.

/// `CUcheckpointLockArgs`: 64 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockArgs {
    /// Timeout in milliseconds to attempt to lock the process, 0 = no timeout.
    pub timeout_ms: u32,
    /// Must be zero.
    pub reserved0: u32,
    /// Must be zero.
    pub reserved1: [u64; 7],
}

/// `CUcheckpointCheckpointArgs`, `CUcheckpointRestoreArgs`, `CUcheckpointUnlockArgs`: 64 bytes,
/// all zero in the calls the mock accepts.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReservedArgs {
    /// Must be zero.
    pub reserved: [u64; 8],
}

/// `CUcheckpointCheckpointArgs`.
pub type CheckpointArgs = ReservedArgs;
/// `CUcheckpointRestoreArgs`.
pub type RestoreArgs = ReservedArgs;
/// `CUcheckpointUnlockArgs`.
pub type UnlockArgs = ReservedArgs;

const _: () = assert!(size_of::<LockArgs>() == 64);
const _: () = assert!(size_of::<ReservedArgs>() == 64);

/// CU_PROCESS_STATE_RUNNING.
pub const PROCESS_STATE_RUNNING: i32 = 0;
/// CU_PROCESS_STATE_LOCKED.
pub const PROCESS_STATE_LOCKED: i32 = 1;
/// CU_PROCESS_STATE_CHECKPOINTED.
pub const PROCESS_STATE_CHECKPOINTED: i32 = 2;
/// CU_PROCESS_STATE_FAILED.
pub const PROCESS_STATE_FAILED: i32 = 3;

/// `CUdriverProcAddressQueryResult` values.
pub const PROC_ADDRESS_SUCCESS: i32 = 0;
/// The symbol is not known to this driver.
pub const PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
/// The symbol exists but needs a newer `cudaVersion` than the one asked for.
pub const PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;
