//! The exported C ABI. Every export catches panics (NVML_ERROR_UNKNOWN), checks initialization
//! (NVML_ERROR_UNINITIALIZED), applies the scenario's forced `fail` codes, validates handles and
//! out-pointers, and only then writes through caller pointers.
//!
//! Safety contract of every `unsafe extern "C"` function here: the one documented in nvml.h for
//! the function of the same name (pointers are null or valid for the documented writes/reads;
//! arrays hold `*infoCount` records; strings are NUL-terminated).

mod device;
mod limits;
mod processes;
mod system;

use crate::codes;
use crate::handles::DeviceSlot;
use crate::state::{self, Session};
use std::ffi::{c_char, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// nvmlDevice_t.
pub type NvmlDevice = *const DeviceSlot;

/// Runs `f`, turning a panic into NVML_ERROR_UNKNOWN (no unwinding across the C boundary).
fn guarded(f: impl FnOnce() -> u32) -> u32 {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(codes::ERROR_UNKNOWN)
}

/// A call that needs an initialized library.
fn call(name: &str, f: impl FnOnce(&mut Session<'_>) -> Result<(), u32>) -> u32 {
    guarded(|| state::with_session(name, f))
}

/// A call on one device: the handle is validated (INVALID_ARGUMENT) and the device must not be
/// lost (GPU_IS_LOST) before `f` runs with the device index.
fn device_call(
    name: &str,
    device: NvmlDevice,
    f: impl FnOnce(&mut Session<'_>, usize) -> Result<(), u32>,
) -> u32 {
    call(name, |s| {
        let index = s.device(device)?;
        f(s, index)
    })
}

/// Writes `value` through an out-pointer; null -> INVALID_ARGUMENT.
///
/// # Safety
/// `p` is null or valid for a write of `T` (alignment not required).
unsafe fn put<T>(p: *mut T, value: T) -> Result<(), u32> {
    if p.is_null() {
        return Err(codes::ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid for writes per the caller's contract.
    unsafe { p.write_unaligned(value) };
    Ok(())
}

/// Copies `s` and a NUL into `buf` of `len` bytes; too small -> INSUFFICIENT_SIZE.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
unsafe fn put_str(s: &str, buf: *mut c_char, len: c_uint) -> Result<(), u32> {
    if buf.is_null() {
        return Err(codes::ERROR_INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if (len as usize) <= bytes.len() {
        return Err(codes::ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds at least `bytes.len() + 1` bytes, checked above.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Writes a fixed-size C string field (truncating; always NUL-terminated).
fn fixed_str<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (dst, src) in out.iter_mut().zip(s.bytes().take(N.saturating_sub(1))) {
        *dst = src as c_char;
    }
    out
}
