//! Init/shutdown, error strings and system-wide getters.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{call, guarded, put, put_str};
use crate::codes;
use crate::state;
use std::ffi::{c_char, c_int, c_uint};
use std::panic::catch_unwind;

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> c_uint {
    guarded(|| state::init("nvmlInit"))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> c_uint {
    guarded(|| state::init("nvmlInit_v2"))
}

/// Flags (NVML_INIT_FLAG_NO_GPUS, NVML_INIT_FLAG_NO_ATTACH) are accepted and ignored.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> c_uint {
    guarded(|| state::init("nvmlInitWithFlags"))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> c_uint {
    guarded(state::shutdown)
}

/// Static NUL-terminated text; valid before init too.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: c_uint) -> *const c_char {
    catch_unwind(|| codes::error_string(result).as_ptr()).unwrap_or(c"Unknown Error".as_ptr())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> c_uint {
    call("nvmlSystemGetDriverVersion", |s| unsafe {
        put_str(&s.scenario.driver_version, version, length)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> c_uint {
    call("nvmlSystemGetNVMLVersion", |s| unsafe {
        put_str(&s.scenario.nvml_version, version, length)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> c_uint {
    call("nvmlSystemGetCudaDriverVersion", |s| unsafe {
        put(version, s.scenario.cuda_driver_version)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> c_uint {
    call("nvmlSystemGetCudaDriverVersion_v2", |s| unsafe {
        put(version, s.scenario.cuda_driver_version)
    })
}
