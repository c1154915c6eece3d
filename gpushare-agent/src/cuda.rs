//! The CUDA checkpoint driver API, loaded at run time for the `suspend` ladder step.
//!
//! NVIDIA's driver (r570+, CUDA 12.8 driver API) can move a running process's GPU memory into
//! host memory and release the GPU: lock the process (its CUDA calls block), checkpoint it,
//! later restore it and unlock it. [`Checkpointer::open`] loads `libcuda.so.1` (or `--cuda-lib`)
//! with `dlopen`, takes `cuInit`, `cuDriverGetVersion`, `cuGetProcAddress_v2` and (when present)
//! `cuGetErrorName`/`cuGetErrorString` by name, calls `cuInit(0)`, and asks the driver for the
//! five `cuCheckpointProcess*` entry points at the CUDA 12.8 ABI through `cuGetProcAddress_v2`
//! (cuda.h's `cuGetProcAddress`). A driver older than CUDA 12.8 means `suspend` is unavailable
//! ([`Unavailable`] says why and what is needed); nothing else of the agent depends on libcuda.
//!
//! Ordering the caller must respect (docs/suspend.md): lock every GPU process of a workload
//! *before* freezing its cgroup (a frozen process cannot answer the lock: it waits for its
//! timeout and fails with CUDA_ERROR_NOT_READY, and a lock without a timeout hangs), checkpoint
//! only locked processes, and on resume thaw first, then restore, then unlock.
//!
//! **These calls block.** A lock waits up to its timeout; a checkpoint or restore copies the
//! process's GPU memory (seconds per GPU for large models). Run them off the async runtime, e.g.
//! `tokio::task::spawn_blocking` with an `Arc<Checkpointer>`: the handle is `Send + Sync`, holds
//! only the library and plain function pointers, and assumes nothing about the calling thread
//! (the checkpoint API takes a pid and no context; the driver serializes what it must).
//! The library stays mapped for the life of the process (`RTLD_NODELETE`): once `cuInit` ran,
//! libcuda's threads must not lose their code.

use std::{
    ffi::{CStr, CString, c_char, c_int, c_uint, c_void},
    fmt,
    path::{Path, PathBuf},
};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

/// The library loaded when no `--cuda-lib` is given.
pub const DEFAULT_LIB: &str = "libcuda.so.1";
/// `cuDriverGetVersion` of the first driver with the checkpoint API: CUDA 12.8 (r570).
pub const REQUIRED_DRIVER_VERSION: i32 = 12080;
/// The checkpoint entry points, as `cuGetProcAddress` names them.
pub const ENTRY_POINTS: [&str; 5] = [
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
];

/// CUresult values the agent tells apart (cuda.h).
pub mod code {
    /// CUDA_SUCCESS.
    pub const SUCCESS: u32 = 0;
    /// CUDA_ERROR_INVALID_VALUE: also what the driver answers for a pid without CUDA.
    pub const INVALID_VALUE: u32 = 1;
    /// CUDA_ERROR_OUT_OF_MEMORY: a restore without room on the GPU.
    pub const OUT_OF_MEMORY: u32 = 2;
    /// CUDA_ERROR_NOT_INITIALIZED: also a target that has not finished its own cuInit.
    pub const NOT_INITIALIZED: u32 = 3;
    /// CUDA_ERROR_ILLEGAL_STATE: the process is not in the state the call needs.
    pub const ILLEGAL_STATE: u32 = 401;
    /// CUDA_ERROR_NOT_READY: a lock that reached its timeout.
    pub const NOT_READY: u32 = 600;
    /// CUDA_ERROR_NOT_SUPPORTED: e.g. a process using UVM or IPC memory.
    pub const NOT_SUPPORTED: u32 = 801;
    /// CUDA_ERROR_TIMEOUT.
    pub const TIMEOUT: u32 = 909;
}

/// Why `suspend` cannot be used on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("suspend is unavailable: {reason}")]
pub struct Unavailable {
    /// What is missing, and what would be needed.
    pub reason: String,
}

/// A CUresult other than CUDA_SUCCESS, with the driver's own name and text for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} ({code}): {message}")]
pub struct CudaError {
    /// The CUresult.
    pub code: u32,
    /// `cuGetErrorName`, e.g. `CUDA_ERROR_ILLEGAL_STATE` (`CUresult <code>` when unknown).
    pub name: String,
    /// `cuGetErrorString`, e.g. "the operation cannot be performed in the present state".
    pub message: String,
}

/// What a [`CudaError`] means for the suspend step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The pid has no CUDA state (INVALID_VALUE, or NOT_INITIALIZED while its cuInit runs).
    NotACudaProcess,
    /// The process is not in the state the call needs (ILLEGAL_STATE).
    IllegalState,
    /// The lock reached its timeout (NOT_READY; TIMEOUT accepted too); the process is RUNNING.
    LockTimeout,
    /// The driver cannot checkpoint this process (NOT_SUPPORTED: UVM or IPC memory, ...).
    NotSupported,
    /// Not enough GPU memory to restore (OUT_OF_MEMORY); the process stays CHECKPOINTED.
    OutOfMemory,
    /// Anything else.
    Other,
}

impl CudaError {
    /// The class of the error.
    pub fn kind(&self) -> ErrorKind {
        match self.code {
            code::INVALID_VALUE | code::NOT_INITIALIZED => ErrorKind::NotACudaProcess,
            code::ILLEGAL_STATE => ErrorKind::IllegalState,
            code::NOT_READY | code::TIMEOUT => ErrorKind::LockTimeout,
            code::NOT_SUPPORTED => ErrorKind::NotSupported,
            code::OUT_OF_MEMORY => ErrorKind::OutOfMemory,
            _ => ErrorKind::Other,
        }
    }
}

/// `CUprocessState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// CU_PROCESS_STATE_RUNNING (0).
    Running,
    /// CU_PROCESS_STATE_LOCKED (1): CUDA calls block.
    Locked,
    /// CU_PROCESS_STATE_CHECKPOINTED (2): GPU memory in host memory, GPU released.
    Checkpointed,
    /// CU_PROCESS_STATE_FAILED (3): an uncorrectable error during checkpoint or restore.
    Failed,
    /// CU_PROCESS_STATE_CHECKPOINTING (4, CUDA 13.4+, custom storage only).
    Checkpointing,
    /// CU_PROCESS_STATE_RESTORING (5, CUDA 13.4+, custom storage only).
    Restoring,
    /// A value this agent does not know.
    Unknown(i32),
}

impl ProcessState {
    /// From the C enum value.
    pub fn from_raw(v: i32) -> Self {
        match v {
            0 => Self::Running,
            1 => Self::Locked,
            2 => Self::Checkpointed,
            3 => Self::Failed,
            4 => Self::Checkpointing,
            5 => Self::Restoring,
            v => Self::Unknown(v),
        }
    }
}

/// `CUcheckpointLockArgs` (64 bytes; the C check of the mock pins the layout to cuda.h).
#[repr(C)]
#[derive(Default)]
struct LockArgs {
    timeout_ms: u32,
    reserved0: u32,
    reserved1: [u64; 7],
}

/// `CUcheckpointCheckpointArgs`, `CUcheckpointRestoreArgs`, `CUcheckpointUnlockArgs` at the
/// CUDA 12.8 ABI: 64 reserved bytes, zeroed.
#[repr(C)]
#[derive(Default)]
struct ReservedArgs {
    reserved: [u64; 8],
}

const _: () = assert!(size_of::<LockArgs>() == 64 && size_of::<ReservedArgs>() == 64);

type CuResult = c_uint;
type InitFn = unsafe extern "C" fn(c_uint) -> CuResult;
type VersionFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
type ErrorTextFn = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;
type GetProcAddressFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult;
type GetStateFn = unsafe extern "C" fn(c_int, *mut c_int) -> CuResult;
type LockFn = unsafe extern "C" fn(c_int, *mut LockArgs) -> CuResult;
type ArgsFn = unsafe extern "C" fn(c_int, *mut ReservedArgs) -> CuResult;

/// The loaded checkpoint API. `Send + Sync`; see the module doc for how to call it.
pub struct Checkpointer {
    _lib: Library,
    path: PathBuf,
    driver_version: i32,
    error_name: Option<ErrorTextFn>,
    error_string: Option<ErrorTextFn>,
    get_state: GetStateFn,
    lock: LockFn,
    checkpoint: ArgsFn,
    restore: ArgsFn,
    unlock: ArgsFn,
}

impl fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpointer")
            .field("path", &self.path)
            .field("driver_version", &self.driver_version)
            .finish_non_exhaustive()
    }
}

/// "12.8" for 12080.
pub fn version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn unavailable(reason: impl Into<String>) -> Unavailable {
    Unavailable {
        reason: reason.into(),
    }
}

const NEEDED: &str = "the CUDA checkpoint API needs an NVIDIA driver r570 or later (CUDA 12.8)";

impl Checkpointer {
    /// Loads `path` (default [`DEFAULT_LIB`]), calls `cuInit(0)` and resolves the checkpoint
    /// entry points. Any failure is an [`Unavailable`] with the reason.
    pub fn open(path: Option<&Path>) -> Result<Self, Unavailable> {
        let path = path.map_or_else(|| PathBuf::from(DEFAULT_LIB), Path::to_path_buf);
        let shown = path.display().to_string();
        // SAFETY: loading the NVIDIA driver library (or a mock of it) runs its initializers,
        // which is what every CUDA client does.
        let lib =
            unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_LOCAL | libc::RTLD_NODELETE) }
                .map_err(|e| unavailable(format!("cannot load {shown}: {e}; {NEEDED}")))?;

        // SAFETY (all lookups): the types are cuda.h's prototypes of these names.
        let init: Option<InitFn> = unsafe { lookup(&lib, "cuInit") };
        let version: Option<VersionFn> = unsafe { lookup(&lib, "cuDriverGetVersion") };
        let proc_address: Option<GetProcAddressFn> = unsafe { lookup(&lib, "cuGetProcAddress_v2") };
        let (Some(init), Some(version), Some(proc_address)) = (init, version, proc_address) else {
            let missing: Vec<&str> = [
                ("cuInit", init.is_none()),
                ("cuDriverGetVersion", version.is_none()),
                ("cuGetProcAddress_v2", proc_address.is_none()),
            ]
            .into_iter()
            .filter_map(|(n, m)| m.then_some(n))
            .collect();
            return Err(unavailable(format!(
                "{shown} has no {}: not an NVIDIA CUDA driver library of CUDA 12.0 or later; \
                 {NEEDED}",
                missing.join(", ")
            )));
        };
        let error_name: Option<ErrorTextFn> = unsafe { lookup(&lib, "cuGetErrorName") };
        let error_string: Option<ErrorTextFn> = unsafe { lookup(&lib, "cuGetErrorString") };
        let texts = Texts {
            error_name,
            error_string,
        };

        // SAFETY: cuInit(0) is the documented first call; 0 is the only valid flag value.
        let rc = unsafe { init(0) };
        texts
            .check(rc)
            .map_err(|e| unavailable(format!("cuInit in {shown} failed: {e}")))?;
        let mut driver_version: c_int = 0;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { version(&mut driver_version) };
        texts
            .check(rc)
            .map_err(|e| unavailable(format!("cuDriverGetVersion in {shown} failed: {e}")))?;
        if driver_version < REQUIRED_DRIVER_VERSION {
            return Err(unavailable(format!(
                "the driver of {shown} supports CUDA {}; {NEEDED}",
                version_text(driver_version)
            )));
        }
        let mut pointers = [std::ptr::null_mut::<c_void>(); ENTRY_POINTS.len()];
        for (name, slot) in ENTRY_POINTS.iter().zip(pointers.iter_mut()) {
            let c_name = CString::new(*name).expect("no NUL in entry point names");
            let mut status: c_int = -1;
            // SAFETY: valid NUL-terminated name and out-pointers; flags 0 is
            // CU_GET_PROC_ADDRESS_DEFAULT.
            let rc = unsafe {
                proc_address(
                    c_name.as_ptr(),
                    slot,
                    REQUIRED_DRIVER_VERSION,
                    0,
                    &mut status,
                )
            };
            if let Err(e) = texts.check(rc) {
                return Err(unavailable(format!(
                    "cuGetProcAddress({name}) in {shown} failed: {e}; {NEEDED}"
                )));
            }
            if slot.is_null() {
                let why = match status {
                    1 => "the driver does not have it",
                    2 => "the driver's version of it is not the CUDA 12.8 one",
                    _ => "no address returned",
                };
                return Err(unavailable(format!(
                    "{shown} (CUDA {}) does not provide {name}: {why}; {NEEDED}",
                    version_text(driver_version)
                )));
            }
        }
        // SAFETY: cuGetProcAddress returned these for cuda.h's prototypes at the 12.8 ABI
        // (PFN_cuCheckpointProcess*_v12080 in cudaTypedefs.h), in ENTRY_POINTS order.
        let [get_state, lock, checkpoint, restore, unlock] = pointers;
        unsafe {
            Ok(Self {
                path,
                driver_version,
                error_name,
                error_string,
                get_state: std::mem::transmute::<*mut c_void, GetStateFn>(get_state),
                lock: std::mem::transmute::<*mut c_void, LockFn>(lock),
                checkpoint: std::mem::transmute::<*mut c_void, ArgsFn>(checkpoint),
                restore: std::mem::transmute::<*mut c_void, ArgsFn>(restore),
                unlock: std::mem::transmute::<*mut c_void, ArgsFn>(unlock),
                _lib: lib,
            })
        }
    }

    /// The library loaded.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cuDriverGetVersion`, e.g. 12080 for CUDA 12.8.
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    fn texts(&self) -> Texts {
        Texts {
            error_name: self.error_name,
            error_string: self.error_string,
        }
    }

    /// `cuCheckpointProcessGetState`.
    pub fn state(&self, pid: u32) -> Result<ProcessState, CudaError> {
        let pid = c_pid(pid)?;
        let mut state: c_int = -1;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (self.get_state)(pid, &mut state) };
        self.texts().check(rc)?;
        Ok(ProcessState::from_raw(state))
    }

    /// `cuCheckpointProcessLock` with a timeout (0: wait as long as it takes). Blocks up to
    /// `timeout_ms`; past it the error's kind is [`ErrorKind::LockTimeout`] and the process is
    /// still RUNNING.
    pub fn lock(&self, pid: u32, timeout_ms: u32) -> Result<(), CudaError> {
        let pid = c_pid(pid)?;
        let mut args = LockArgs {
            timeout_ms,
            ..LockArgs::default()
        };
        // SAFETY: a valid, zeroed (but for the timeout) argument struct.
        let rc = unsafe { (self.lock)(pid, &mut args) };
        self.texts().check(rc)
    }

    /// `cuCheckpointProcessCheckpoint` to host memory (the process must be LOCKED). Blocks while
    /// the GPU memory is copied.
    pub fn checkpoint(&self, pid: u32) -> Result<(), CudaError> {
        self.with_reserved(self.checkpoint, pid)
    }

    /// `cuCheckpointProcessRestore` from host memory onto the same GPUs (the process must be
    /// CHECKPOINTED; it is LOCKED afterwards). Blocks while the memory is copied back.
    pub fn restore(&self, pid: u32) -> Result<(), CudaError> {
        self.with_reserved(self.restore, pid)
    }

    /// `cuCheckpointProcessUnlock` (the process must be LOCKED; it is RUNNING afterwards).
    pub fn unlock(&self, pid: u32) -> Result<(), CudaError> {
        self.with_reserved(self.unlock, pid)
    }

    fn with_reserved(&self, f: ArgsFn, pid: u32) -> Result<(), CudaError> {
        let pid = c_pid(pid)?;
        let mut args = ReservedArgs::default();
        // SAFETY: a valid, zeroed argument struct.
        let rc = unsafe { f(pid, &mut args) };
        self.texts().check(rc)
    }
}

fn c_pid(pid: u32) -> Result<c_int, CudaError> {
    c_int::try_from(pid).map_err(|_| CudaError {
        code: code::INVALID_VALUE,
        name: "CUDA_ERROR_INVALID_VALUE".into(),
        message: format!("pid {pid} is out of range"),
    })
}

/// # Safety
/// `T` is the C prototype of `name`.
unsafe fn lookup<T: Copy>(lib: &Library, name: &str) -> Option<T> {
    // SAFETY: per the contract.
    unsafe { lib.get::<T>(name.as_bytes()) }.ok().map(|s| *s)
}

/// The driver's error-text functions, when it has them.
#[derive(Clone, Copy)]
struct Texts {
    error_name: Option<ErrorTextFn>,
    error_string: Option<ErrorTextFn>,
}

impl Texts {
    fn check(&self, rc: CuResult) -> Result<(), CudaError> {
        if rc == code::SUCCESS {
            return Ok(());
        }
        Err(CudaError {
            code: rc,
            name: text(self.error_name, rc).unwrap_or_else(|| format!("CUresult {rc}")),
            message: text(self.error_string, rc).unwrap_or_default(),
        })
    }
}

fn text(f: Option<ErrorTextFn>, rc: CuResult) -> Option<String> {
    let f = f?;
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: a valid out-pointer; on success the driver returns a static NUL-terminated string.
    let ok = unsafe { f(rc, &mut p) } == code::SUCCESS && !p.is_null();
    ok.then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_can_go_to_a_blocking_thread() {
        fn send_sync<T: Send + Sync + 'static>() {}
        send_sync::<Checkpointer>();
        send_sync::<CudaError>();
        send_sync::<Unavailable>();
    }

    #[test]
    fn layouts_are_the_cuda_12_8_ones() {
        assert_eq!(size_of::<LockArgs>(), 64);
        assert_eq!(std::mem::offset_of!(LockArgs, reserved0), 4);
        assert_eq!(std::mem::offset_of!(LockArgs, reserved1), 8);
        assert_eq!(size_of::<ReservedArgs>(), 64);
    }

    #[test]
    fn states_and_error_kinds_follow_cuda_h() {
        let states: Vec<_> = (0..7).map(ProcessState::from_raw).collect();
        assert_eq!(
            states,
            [
                ProcessState::Running,
                ProcessState::Locked,
                ProcessState::Checkpointed,
                ProcessState::Failed,
                ProcessState::Checkpointing,
                ProcessState::Restoring,
                ProcessState::Unknown(6)
            ]
        );
        let kind = |code| {
            CudaError {
                code,
                name: String::new(),
                message: String::new(),
            }
            .kind()
        };
        assert_eq!(kind(1), ErrorKind::NotACudaProcess);
        assert_eq!(kind(3), ErrorKind::NotACudaProcess);
        assert_eq!(kind(401), ErrorKind::IllegalState);
        assert_eq!(kind(600), ErrorKind::LockTimeout);
        assert_eq!(kind(909), ErrorKind::LockTimeout);
        assert_eq!(kind(801), ErrorKind::NotSupported);
        assert_eq!(kind(2), ErrorKind::OutOfMemory);
        assert_eq!(kind(304), ErrorKind::Other);
        assert_eq!(version_text(12080), "12.8");
        assert_eq!(version_text(13050), "13.5");
    }

    #[test]
    fn a_missing_library_or_one_without_cuda_is_unavailable_with_the_reason() {
        let e = Checkpointer::open(Some(Path::new("/nonexistent/libcuda.so.1"))).unwrap_err();
        assert!(
            e.reason
                .starts_with("cannot load /nonexistent/libcuda.so.1: "),
            "{e}"
        );
        assert!(e.reason.contains("r570"), "{e}");
        // libc is a real shared library with none of the driver's symbols.
        let e = Checkpointer::open(Some(Path::new("libc.so.6"))).unwrap_err();
        assert!(
            e.reason
                .contains("has no cuInit, cuDriverGetVersion, cuGetProcAddress_v2"),
            "{e}"
        );
        assert!(e.to_string().starts_with("suspend is unavailable: "), "{e}");
    }
}
