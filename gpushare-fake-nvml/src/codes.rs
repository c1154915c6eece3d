//! nvmlReturn_t values (nvml.h) and the texts nvmlErrorString gives for them.

use std::ffi::CStr;

pub const SUCCESS: u32 = 0;
pub const ERROR_UNINITIALIZED: u32 = 1;
pub const ERROR_INVALID_ARGUMENT: u32 = 2;
pub const ERROR_NOT_SUPPORTED: u32 = 3;
pub const ERROR_NO_PERMISSION: u32 = 4;
pub const ERROR_ALREADY_INITIALIZED: u32 = 5;
pub const ERROR_NOT_FOUND: u32 = 6;
pub const ERROR_INSUFFICIENT_SIZE: u32 = 7;
pub const ERROR_INSUFFICIENT_POWER: u32 = 8;
pub const ERROR_DRIVER_NOT_LOADED: u32 = 9;
pub const ERROR_TIMEOUT: u32 = 10;
pub const ERROR_IRQ_ISSUE: u32 = 11;
pub const ERROR_LIBRARY_NOT_FOUND: u32 = 12;
pub const ERROR_FUNCTION_NOT_FOUND: u32 = 13;
pub const ERROR_CORRUPTED_INFOROM: u32 = 14;
pub const ERROR_GPU_IS_LOST: u32 = 15;
pub const ERROR_RESET_REQUIRED: u32 = 16;
pub const ERROR_OPERATING_SYSTEM: u32 = 17;
pub const ERROR_LIB_RM_VERSION_MISMATCH: u32 = 18;
pub const ERROR_IN_USE: u32 = 19;
pub const ERROR_MEMORY: u32 = 20;
pub const ERROR_NO_DATA: u32 = 21;
pub const ERROR_VGPU_ECC_NOT_SUPPORTED: u32 = 22;
pub const ERROR_INSUFFICIENT_RESOURCES: u32 = 23;
pub const ERROR_FREQ_NOT_SUPPORTED: u32 = 24;
pub const ERROR_ARGUMENT_VERSION_MISMATCH: u32 = 25;
pub const ERROR_DEPRECATED: u32 = 26;
pub const ERROR_NOT_READY: u32 = 27;
pub const ERROR_GPU_NOT_FOUND: u32 = 28;
pub const ERROR_INVALID_STATE: u32 = 29;
pub const ERROR_UNKNOWN: u32 = 999;

/// NVML_VALUE_NOT_AVAILABLE as an unsigned long long (process used memory).
pub const VALUE_NOT_AVAILABLE_U64: u64 = u64::MAX;

/// The text nvmlErrorString returns for `code`: NVIDIA's wording for 0..=21, 25 and 999 (as in
/// nvidia-ml-py's table); best-effort texts for the rarer codes; "Unknown Error" for codes it does
/// not know, as the real library does.
pub fn error_string(code: u32) -> &'static CStr {
    match code {
        SUCCESS => c"Success",
        ERROR_UNINITIALIZED => c"Uninitialized",
        ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        ERROR_NOT_SUPPORTED => c"Not Supported",
        ERROR_NO_PERMISSION => c"Insufficient Permissions",
        ERROR_ALREADY_INITIALIZED => c"Already Initialized",
        ERROR_NOT_FOUND => c"Not Found",
        ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        ERROR_INSUFFICIENT_POWER => c"Insufficient External Power",
        ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        ERROR_TIMEOUT => c"Timeout",
        ERROR_IRQ_ISSUE => c"Interrupt Request Issue",
        ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        ERROR_CORRUPTED_INFOROM => c"Corrupted infoROM",
        ERROR_GPU_IS_LOST => c"GPU is lost",
        ERROR_RESET_REQUIRED => c"GPU requires restart",
        ERROR_OPERATING_SYSTEM => c"The operating system has blocked the request.",
        ERROR_LIB_RM_VERSION_MISMATCH => c"RM has detected an NVML/RM version mismatch.",
        ERROR_IN_USE => c"In use by another client",
        ERROR_MEMORY => c"Insufficient Memory",
        ERROR_NO_DATA => c"No data",
        ERROR_VGPU_ECC_NOT_SUPPORTED => {
            c"The requested vgpu operation is not available on target device, becasue ECC is enabled"
        }
        ERROR_INSUFFICIENT_RESOURCES => c"Ran out of critical resources, other than memory",
        ERROR_FREQ_NOT_SUPPORTED => c"Frequency not supported",
        ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        ERROR_DEPRECATED => c"The requested functionality has been deprecated",
        ERROR_NOT_READY => c"The system is not ready for the request",
        ERROR_GPU_NOT_FOUND => c"No GPUs were found",
        ERROR_INVALID_STATE => c"Resource not in correct state to perform requested operation",
        _ => c"Unknown Error",
    }
}
