//! Whether the loaded NVML can set driver-enforced per-cgroup GPU memory limits:
//! `nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1`, declared by the nvml.h of
//! CUDA 13.4 and later (PyPI `nvidia-nvml-dev` 13.4.61+; NVIDIA drivers r615+, backed by the
//! kernel's `dmem` cgroup controller). nvml-wrapper does not know these functions, so the probe
//! looks them up by name in the same library the sampler loads.
//!
//! The declarations (nvml.h, `nvidia-nvml-dev` 13.5.37), mirrored by [`SetMemoryLimitsV1`] and
//! [`GetMemoryLimitsV1`]; neither struct has a version field:
//!
//! ```c
//! typedef struct {
//!     const char* nameSpace;         //!<[in] Full path to sysfs cgroup file name
//!     unsigned long long softLimit;  //!<[in] Soft memory limit in Bytes.
//!     unsigned long long hardLimit;  //!<[in] Hard memory limit in Bytes.
//! } nvmlSetMemoryLimits_v1_t;                                       /* 24 bytes */
//! typedef struct {
//!     const char* nameSpace;           //!<[in]  Full path to sysfs cgroup file name
//!     unsigned long long softLimit;    //!<[out] Currently set soft memory limit in Bytes.
//!     unsigned long long hardLimit;    //!<[out] Currently set hard memory limit in Bytes.
//!     unsigned long long currentUsed;  //!<[out] Currently used memory in Bytes.
//! } nvmlGetMemoryLimits_v1_t;                                       /* 32 bytes */
//! nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device, nvmlSetMemoryLimits_v1_t *limits);
//! nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t device, nvmlGetMemoryLimits_v1_t *limits);
//! #define NVML_DEVICE_MEMORY_LIMIT_MAX 0xFFFFFFFFFFFFFFFF   /* clear: soft 0, hard MAX */
//! ```

use std::{
    ffi::c_char,
    path::{Path, PathBuf},
};

use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};

/// `nvmlDeviceSetMemoryLimits_v1`.
pub const SET_SYMBOL: &str = "nvmlDeviceSetMemoryLimits_v1";
/// `nvmlDeviceGetMemoryLimits_v1`.
pub const GET_SYMBOL: &str = "nvmlDeviceGetMemoryLimits_v1";
/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: no hard limit.
pub const MEMORY_LIMIT_MAX: u64 = u64::MAX;

/// `nvmlSetMemoryLimits_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SetMemoryLimitsV1 {
    /// Full path of the cgroup directory (NUL-terminated).
    pub name_space: *const c_char,
    /// Soft limit in bytes.
    pub soft_limit: u64,
    /// Hard limit in bytes ([`MEMORY_LIMIT_MAX`]: none).
    pub hard_limit: u64,
}

/// `nvmlGetMemoryLimits_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GetMemoryLimitsV1 {
    /// Full path of the cgroup directory (in).
    pub name_space: *const c_char,
    /// Soft limit in bytes (out).
    pub soft_limit: u64,
    /// Hard limit in bytes (out).
    pub hard_limit: u64,
    /// Memory the cgroup uses on the device (out).
    pub current_used: u64,
}

const _: () = assert!(size_of::<SetMemoryLimitsV1>() == 24 && size_of::<GetMemoryLimitsV1>() == 32);

/// What the library offers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemoryLimitsSupport {
    /// The library probed.
    pub library: PathBuf,
    /// `nvmlDeviceSetMemoryLimits_v1` is exported.
    pub set: bool,
    /// `nvmlDeviceGetMemoryLimits_v1` is exported.
    pub get: bool,
}

impl MemoryLimitsSupport {
    /// Both functions exist: driver-enforced limits can be set and read back. (A device may still
    /// answer NVML_ERROR_NOT_SUPPORTED, e.g. without the kernel's dmem controller.)
    pub fn available(&self) -> bool {
        self.set && self.get
    }
}

/// Looks the two functions up in `lib` (default: the system's libnvidia-ml.so.1, the library
/// [`super::NvmlSampler::open`] loads). Fails only when the library cannot be loaded.
pub fn probe_memory_limits(lib: Option<&Path>) -> Result<MemoryLimitsSupport, String> {
    let library = lib.map_or_else(|| PathBuf::from("libnvidia-ml.so.1"), Path::to_path_buf);
    // SAFETY: the same library nvml-wrapper loads; when it is already loaded this only takes a
    // reference to it, and dropping that reference leaves it loaded.
    let handle = unsafe { Library::open(Some(&library), RTLD_LAZY | RTLD_LOCAL) }
        .map_err(|e| format!("cannot load {}: {e}", library.display()))?;
    // SAFETY: only the presence of the symbols is looked at; nothing is called.
    let has = |name: &str| unsafe { handle.get::<*const ()>(name.as_bytes()) }.is_ok();
    Ok(MemoryLimitsSupport {
        set: has(SET_SYMBOL),
        get: has(GET_SYMBOL),
        library,
    })
}

type SetFn = unsafe extern "C" fn(*mut std::ffi::c_void, *mut SetMemoryLimitsV1) -> i32;
type GetFn = unsafe extern "C" fn(*mut std::ffi::c_void, *mut GetMemoryLimitsV1) -> i32;

/// `nvmlDeviceSetMemoryLimits_v1` (and `nvmlDeviceGetMemoryLimits_v1` where the library has it),
/// loaded from the same library the sampler uses.
pub struct MemoryLimitsApi {
    _lib: Library,
    set: SetFn,
    get: Option<GetFn>,
}

impl MemoryLimitsApi {
    /// The function from `lib`, when it has it (an r615+ driver, CUDA 13.4).
    pub fn open(lib: Option<&Path>) -> Option<Self> {
        let library = lib.map_or_else(|| PathBuf::from("libnvidia-ml.so.1"), Path::to_path_buf);
        // SAFETY: as in `probe_memory_limits`.
        let handle = unsafe { Library::open(Some(&library), RTLD_LAZY | RTLD_LOCAL) }.ok()?;
        // SAFETY: the symbol has nvml.h's declaration (mirrored by `SetFn`).
        let set: SetFn = unsafe { *handle.get::<SetFn>(SET_SYMBOL.as_bytes()).ok()? };
        // SAFETY: the symbol has nvml.h's declaration (mirrored by `GetFn`).
        let get = unsafe { handle.get::<GetFn>(GET_SYMBOL.as_bytes()) }
            .ok()
            .map(|f| *f);
        Some(Self {
            _lib: handle,
            set,
            get,
        })
    }

    /// The driver's limits of the cgroup at `dir` on `device`: (soft, hard), `None` when it has
    /// none (NOT_FOUND, or the cleared values soft 0 and hard [`MEMORY_LIMIT_MAX`]), or the NVML
    /// return code. A library without the getter answers NOT_SUPPORTED (3).
    ///
    /// # Safety
    ///
    /// As for [`Self::set`].
    pub unsafe fn get(
        &self,
        device: *mut std::ffi::c_void,
        dir: &Path,
    ) -> Result<Option<(u64, u64)>, i32> {
        let Some(get) = self.get else {
            return Err(3);
        };
        let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| 2)?;
        let mut limits = GetMemoryLimitsV1 {
            name_space: path.as_ptr(),
            soft_limit: 0,
            hard_limit: MEMORY_LIMIT_MAX,
            current_used: 0,
        };
        // SAFETY: a device handle of this library's session, a valid struct whose string
        // outlives the call.
        match unsafe { get(device, &mut limits) } {
            0 if limits.soft_limit == 0 && limits.hard_limit == MEMORY_LIMIT_MAX => Ok(None),
            0 => Ok(Some((limits.soft_limit, limits.hard_limit))),
            6 => Ok(None),
            rc => Err(rc),
        }
    }

    /// Sets the driver's limits of the cgroup at `dir` on `device`. Soft 0 and hard
    /// [`MEMORY_LIMIT_MAX`] clear them. The NVML return code on failure.
    ///
    /// # Safety
    ///
    /// `device` must be a live `nvmlDevice_t` of the same library's session (see
    /// [`crate::nvml::NvmlSampler::with_device_handle`]).
    pub unsafe fn set(
        &self,
        device: *mut std::ffi::c_void,
        dir: &Path,
        soft: u64,
        hard: u64,
    ) -> Result<(), i32> {
        let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| 2)?;
        let mut limits = SetMemoryLimitsV1 {
            name_space: path.as_ptr(),
            soft_limit: soft,
            hard_limit: hard,
        };
        // SAFETY: a device handle of this library's session, a valid struct whose string
        // outlives the call.
        match unsafe { (self.set)(device, &mut limits) } {
            0 => Ok(()),
            rc => Err(rc),
        }
    }
}

/// NVML's name of a return code the limit functions document.
pub fn code_name(rc: i32) -> &'static str {
    match rc {
        2 => "NVML_ERROR_INVALID_ARGUMENT",
        3 => "NVML_ERROR_NOT_SUPPORTED",
        4 => "NVML_ERROR_NO_PERMISSION",
        6 => "NVML_ERROR_NOT_FOUND",
        17 => "NVML_ERROR_OPERATING_SYSTEM",
        _ => "NVML error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_without_the_symbols_has_no_driver_limits() {
        let s = probe_memory_limits(Some(Path::new("libc.so.6"))).unwrap();
        assert!(!s.set && !s.get && !s.available(), "{s:?}");
        let e = probe_memory_limits(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
        assert!(
            e.starts_with("cannot load /nonexistent/libnvidia-ml.so.1"),
            "{e}"
        );
    }
}
