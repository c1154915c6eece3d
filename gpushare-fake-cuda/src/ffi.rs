//! The exported C ABI. Every export catches panics (CUDA_ERROR_UNKNOWN), validates pointers and
//! argument structs before anything else is looked at, and writes through caller pointers only
//! on success.
//!
//! Safety contract of every `unsafe extern "C"` function here: the one cuda.h documents for the
//! function of the same name (pointers are null or valid for the documented reads and writes;
//! strings are NUL-terminated).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use crate::abi::{
    LockArgs, PROC_ADDRESS_SUCCESS, PROC_ADDRESS_SYMBOL_NOT_FOUND,
    PROC_ADDRESS_VERSION_NOT_SUFFICIENT, ReservedArgs,
};
use crate::driver::{self, Ctx};
use gpushare_fake_driver::cuda::{CHECKPOINT_API_VERSION, RESULTS, code};
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

/// CUresult.
type CuResult = c_uint;

fn guarded(f: impl FnOnce() -> Result<(), u32>) -> CuResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(c)) => c,
        Err(_) => code::ERROR_UNKNOWN,
    }
}

/// Writes through an out-pointer; null -> INVALID_VALUE.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, value: T) -> Result<(), u32> {
    if p.is_null() {
        return Err(code::ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and valid per the caller's contract.
    unsafe { p.write_unaligned(value) };
    Ok(())
}

/// The optional 64-byte argument struct: NULL is all zeroes.
///
/// # Safety
/// `p` is null or valid for a read of `T`.
unsafe fn args<T: Default>(p: *const T) -> T {
    if p.is_null() {
        T::default()
    } else {
        // SAFETY: non-null and valid per the caller's contract.
        unsafe { p.read_unaligned() }
    }
}

/// CUDA_ERROR_INVALID_VALUE unless every reserved word is zero.
fn zeroed(a: &ReservedArgs) -> Result<(), u32> {
    if a.reserved.iter().all(|w| *w == 0) {
        Ok(())
    } else {
        Err(code::ERROR_INVALID_VALUE)
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CuResult {
    guarded(|| {
        if flags != 0 {
            return Err(code::ERROR_INVALID_VALUE);
        }
        let (s, _) = driver::scenario().map_err(|()| code::ERROR_NO_DEVICE)?;
        if let Some(c) = s.cuda.fail.get("cuInit") {
            return Err(c.get());
        }
        if !s.driver_loaded || s.devices.is_empty() {
            return Err(code::ERROR_NO_DEVICE);
        }
        driver::set_initialized();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(driver_version: *mut c_int) -> CuResult {
    guarded(|| {
        if driver_version.is_null() {
            return Err(code::ERROR_INVALID_VALUE);
        }
        let (s, _) = driver::scenario().map_err(|()| code::ERROR_NOT_INITIALIZED)?;
        if let Some(c) = s.cuda.fail.get("cuDriverGetVersion") {
            return Err(c.get());
        }
        unsafe { put(driver_version, s.cuda_driver_version) }
    })
}

/// (code, name, text) as C strings, built once.
fn c_results() -> &'static [(u32, CString, CString)] {
    static TABLE: OnceLock<Vec<(u32, CString, CString)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        RESULTS
            .iter()
            .filter_map(|(c, n, t)| Some((*c, CString::new(*n).ok()?, CString::new(*t).ok()?)))
            .collect()
    })
}

/// # Safety
/// `p_str` is null or valid for a write of a pointer.
unsafe fn error_text(error: CuResult, p_str: *mut *const c_char, name: bool) -> CuResult {
    guarded(|| {
        if p_str.is_null() {
            return Err(code::ERROR_INVALID_VALUE);
        }
        match c_results().iter().find(|(c, _, _)| *c == error) {
            Some((_, n, t)) => unsafe { put(p_str, if name { n.as_ptr() } else { t.as_ptr() }) },
            None => {
                unsafe { put(p_str, std::ptr::null()) }?;
                Err(code::ERROR_INVALID_VALUE)
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CuResult, p_str: *mut *const c_char) -> CuResult {
    unsafe { error_text(error, p_str, true) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CuResult, p_str: *mut *const c_char) -> CuResult {
    unsafe { error_text(error, p_str, false) }
}

/// (base name, CUDA version that introduced the ABI the pointer has, pointer).
fn entry_points() -> [(&'static str, i32, *mut c_void); 10] {
    [
        ("cuInit", 2000, cuInit as *mut c_void),
        (
            "cuDriverGetVersion",
            2020,
            cuDriverGetVersion as *mut c_void,
        ),
        ("cuGetErrorName", 6000, cuGetErrorName as *mut c_void),
        ("cuGetErrorString", 6000, cuGetErrorString as *mut c_void),
        (
            "cuGetProcAddress",
            12000,
            cuGetProcAddress_v2 as *mut c_void,
        ),
        (
            "cuCheckpointProcessGetState",
            CHECKPOINT_API_VERSION,
            cuCheckpointProcessGetState as *mut c_void,
        ),
        (
            "cuCheckpointProcessLock",
            CHECKPOINT_API_VERSION,
            cuCheckpointProcessLock as *mut c_void,
        ),
        (
            "cuCheckpointProcessCheckpoint",
            CHECKPOINT_API_VERSION,
            cuCheckpointProcessCheckpoint as *mut c_void,
        ),
        (
            "cuCheckpointProcessRestore",
            CHECKPOINT_API_VERSION,
            cuCheckpointProcessRestore as *mut c_void,
        ),
        (
            "cuCheckpointProcessUnlock",
            CHECKPOINT_API_VERSION,
            cuCheckpointProcessUnlock as *mut c_void,
        ),
    ]
}

/// `cuGetProcAddress_v2` (what cuda.h's `cuGetProcAddress` means since CUDA 12.0). As documented:
/// `cudaVersion` above the driver's -> CUDA_ERROR_INVALID_VALUE; a symbol this driver does not
/// have (the checkpoint API below `cuda_driver_version` 12080) -> SUCCESS, `*pfn = NULL`, status
/// SYMBOL_NOT_FOUND; a symbol newer than `cudaVersion` -> SUCCESS, NULL, VERSION_NOT_SUFFICIENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CuResult {
    guarded(|| {
        if symbol.is_null() || pfn.is_null() || flags > 0b11 {
            return Err(code::ERROR_INVALID_VALUE);
        }
        let (s, _) = driver::scenario().map_err(|()| code::ERROR_NOT_INITIALIZED)?;
        if let Some(c) = s.cuda.fail.get("cuGetProcAddress_v2") {
            return Err(c.get());
        }
        if cuda_version > s.cuda_driver_version {
            return Err(code::ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null, NUL-terminated per the contract.
        let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
        let found = entry_points()
            .into_iter()
            .find(|(n, since, _)| *n == name && *since <= s.cuda_driver_version);
        let (pointer, status) = match found {
            None => (std::ptr::null_mut(), PROC_ADDRESS_SYMBOL_NOT_FOUND),
            Some((_, since, _)) if since > cuda_version => {
                (std::ptr::null_mut(), PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
            }
            Some((_, _, p)) => (p, PROC_ADDRESS_SUCCESS),
        };
        unsafe { put(pfn, pointer) }?;
        if !symbol_status.is_null() {
            unsafe { put(symbol_status, status) }?;
        }
        Ok(())
    })
}

fn with_ctx(name: &str, pid: c_int, f: impl FnOnce(&Ctx) -> Result<(), u32>) -> CuResult {
    guarded(|| f(&driver::checkpoint_ctx(name, pid)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessGetState(pid: c_int, state: *mut c_int) -> CuResult {
    with_ctx("cuCheckpointProcessGetState", pid, |ctx| {
        if state.is_null() {
            return Err(code::ERROR_INVALID_VALUE);
        }
        let s = ctx.state()?;
        unsafe { put(state, s as c_int) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessLock(pid: c_int, args_in: *mut LockArgs) -> CuResult {
    guarded(|| {
        let a = unsafe { args(args_in) };
        if a.reserved0 != 0 || a.reserved1.iter().any(|w| *w != 0) {
            return Err(code::ERROR_INVALID_VALUE);
        }
        driver::lock("cuCheckpointProcessLock", pid, a.timeout_ms)
    })
}

/// The checkpoint calls that take a reserved (all-zero) argument struct and act on the process's
/// context.
macro_rules! with_reserved_args {
    ($($name:ident => |$ctx:ident| $body:expr;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(pid: c_int, args_in: *mut ReservedArgs) -> CuResult {
            let a = unsafe { args(args_in) };
            with_ctx(stringify!($name), pid, |$ctx| {
                zeroed(&a)?;
                $body
            })
        }
    )*};
}

with_reserved_args! {
    cuCheckpointProcessCheckpoint => |ctx| driver::checkpoint(ctx);
    cuCheckpointProcessRestore => |ctx| driver::restore(ctx);
    cuCheckpointProcessUnlock => |ctx| ctx.transition(
        gpushare_fake_driver::cuda::ProcessState::Locked,
        gpushare_fake_driver::cuda::ProcessState::Running,
    );
}
