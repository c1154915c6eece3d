//! The mock's C ABI called raw (dlopen + dlsym via libloading): init/shutdown reference
//! counting, UNINITIALIZED, argument validation, struct versions and strides, the two-call
//! protocol, error strings, forced codes for every export, and the exported symbol set.

mod common;

use common::{TestEnv, built_lib, lock, rich_scenario, write_scenario};
use gpushare_fake_nvml::abi::{
    self, Memory, MemoryV2, PciInfo, ProcessInfoV1, ProcessInfoV2, Utilization,
};
use gpushare_fake_nvml::codes::*;
use gpushare_fake_nvml::{EXPORTED_FUNCTIONS, FORBIDDEN_FUNCTIONS, Scenario};
use libloading::Library;
use std::collections::BTreeSet;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ptr::{null, null_mut};
use std::sync::MutexGuard;

type Handle = *const c_void;

struct Nvml {
    lib: Library,
}

macro_rules! sym {
    ($self:ident, $name:literal, $ty:ty) => {{
        // SAFETY: the type is the nvml.h prototype of the symbol.
        #[allow(unused_unsafe)]
        let f: libloading::Symbol<'_, $ty> =
            unsafe { $self.lib.get(concat!($name, "\0").as_bytes()) }
                .expect(concat!("symbol ", $name));
        *f
    }};
}

impl Nvml {
    /// The export `name` as `T`, which must be its nvml.h prototype.
    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the caller names the symbol's prototype.
        *unsafe { self.lib.get::<T>(name.as_bytes()) }
            .unwrap_or_else(|e| panic!("symbol {name}: {e}"))
    }
    fn load() -> Self {
        // SAFETY: the mock has no initialisers with preconditions.
        let lib = unsafe { Library::new(built_lib()) }.expect("dlopen mock");
        let nvml = Self { lib };
        // Start every test from "not initialised", whatever an earlier (failed) test left.
        for _ in 0..100 {
            if nvml.shutdown() == ERROR_UNINITIALIZED {
                break;
            }
        }
        nvml
    }
    /// This binary's lock, held over `scenario`, and the mock loaded and initialised.
    fn initialized(scenario: &Scenario) -> (MutexGuard<'static, ()>, &'static TestEnv, Self) {
        let (guard, env) = lock();
        write_scenario(&env.state, scenario);
        let nvml = Self::load();
        assert_eq!(nvml.init(), SUCCESS);
        (guard, env, nvml)
    }
    fn init(&self) -> u32 {
        unsafe { sym!(self, "nvmlInit_v2", unsafe extern "C" fn() -> c_uint)() }
    }
    fn init_v1(&self) -> u32 {
        unsafe { sym!(self, "nvmlInit", unsafe extern "C" fn() -> c_uint)() }
    }
    fn init_flags(&self, flags: u32) -> u32 {
        unsafe {
            sym!(
                self,
                "nvmlInitWithFlags",
                unsafe extern "C" fn(c_uint) -> c_uint
            )(flags)
        }
    }
    fn shutdown(&self) -> u32 {
        unsafe { sym!(self, "nvmlShutdown", unsafe extern "C" fn() -> c_uint)() }
    }
    fn error_string(&self, code: u32) -> String {
        let f = sym!(
            self,
            "nvmlErrorString",
            unsafe extern "C" fn(c_uint) -> *const c_char
        );
        unsafe { CStr::from_ptr(f(code)) }
            .to_str()
            .unwrap()
            .to_owned()
    }
    fn count(&self) -> (u32, u32) {
        let mut n = 12345;
        let rc = unsafe {
            sym!(
                self,
                "nvmlDeviceGetCount_v2",
                unsafe extern "C" fn(*mut c_uint) -> c_uint
            )(&mut n)
        };
        (rc, n)
    }
    fn handle(&self, index: u32) -> (u32, Handle) {
        let mut h: Handle = null();
        let f = sym!(
            self,
            "nvmlDeviceGetHandleByIndex_v2",
            unsafe extern "C" fn(c_uint, *mut Handle) -> c_uint
        );
        (unsafe { f(index, &mut h) }, h)
    }
    fn handle_ok(&self, index: u32) -> Handle {
        let (rc, h) = self.handle(index);
        assert_eq!(rc, SUCCESS, "handle {index}");
        h
    }
    fn string(
        &self,
        f: unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> c_uint,
        h: Handle,
        len: u32,
    ) -> (u32, String) {
        let mut buf = vec![b'#' as c_char; 128];
        let rc = unsafe { f(h, buf.as_mut_ptr(), len) };
        let s = if rc == SUCCESS {
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_str()
                .unwrap()
                .to_owned()
        } else {
            assert!(
                buf.iter().all(|&c| c == b'#' as c_char),
                "buffer written on error {rc}"
            );
            String::new()
        };
        (rc, s)
    }
}

type ProcFn<R> = unsafe extern "C" fn(Handle, *mut c_uint, *mut R) -> c_uint;

#[test]
fn uninitialized_before_init_and_refcounted_init_shutdown() {
    let (_g, env) = lock();
    write_scenario(&env.state, &rich_scenario());
    let nvml = Nvml::load();

    assert_eq!(nvml.count().0, ERROR_UNINITIALIZED);
    assert_eq!(nvml.handle(0).0, ERROR_UNINITIALIZED);
    let mut v = [0 as c_char; 80];
    let drv = sym!(
        nvml,
        "nvmlSystemGetDriverVersion",
        unsafe extern "C" fn(*mut c_char, c_uint) -> c_uint
    );
    assert_eq!(unsafe { drv(v.as_mut_ptr(), 80) }, ERROR_UNINITIALIZED);
    assert_eq!(
        nvml.error_string(ERROR_UNINITIALIZED),
        "Uninitialized",
        "works before init"
    );
    assert_eq!(
        nvml.shutdown(),
        ERROR_UNINITIALIZED,
        "shutdown with count 0"
    );

    assert_eq!(nvml.init(), SUCCESS);
    assert_eq!(nvml.init_v1(), SUCCESS);
    assert_eq!(nvml.init_flags(0), SUCCESS);
    assert_eq!(nvml.count(), (SUCCESS, 3));
    assert_eq!(nvml.shutdown(), SUCCESS);
    assert_eq!(nvml.shutdown(), SUCCESS);
    assert_eq!(nvml.count(), (SUCCESS, 3), "one init still outstanding");
    assert_eq!(nvml.shutdown(), SUCCESS);
    assert_eq!(nvml.count().0, ERROR_UNINITIALIZED);
    assert_eq!(nvml.shutdown(), ERROR_UNINITIALIZED);

    // A failed init does not count.
    std::fs::remove_file(&env.state).unwrap();
    assert_eq!(nvml.init(), ERROR_DRIVER_NOT_LOADED);
    assert_eq!(nvml.shutdown(), ERROR_UNINITIALIZED);
}

#[test]
fn error_strings() {
    let nvml = {
        let (_g, _env) = lock();
        Nvml::load()
    };
    for (code, text) in [
        (SUCCESS, "Success"),
        (ERROR_UNINITIALIZED, "Uninitialized"),
        (ERROR_INVALID_ARGUMENT, "Invalid Argument"),
        (ERROR_NOT_SUPPORTED, "Not Supported"),
        (ERROR_NOT_FOUND, "Not Found"),
        (ERROR_INSUFFICIENT_SIZE, "Insufficient Size"),
        (ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
        (ERROR_GPU_IS_LOST, "GPU is lost"),
        (ERROR_ARGUMENT_VERSION_MISMATCH, "Argument version mismatch"),
        (ERROR_UNKNOWN, "Unknown Error"),
        (123_456, "Unknown Error"),
    ] {
        assert_eq!(nvml.error_string(code), text, "code {code}");
    }
}

#[test]
fn memory_structs_and_versions() {
    let (_g, _env, nvml) = Nvml::initialized(&rich_scenario());
    let h = nvml.handle_ok(0);
    let v2 = sym!(
        nvml,
        "nvmlDeviceGetMemoryInfo_v2",
        unsafe extern "C" fn(Handle, *mut MemoryV2) -> c_uint
    );
    let v1 = sym!(
        nvml,
        "nvmlDeviceGetMemoryInfo",
        unsafe extern "C" fn(Handle, *mut Memory) -> c_uint
    );

    for bad in [0, 2, 40 | (1 << 24), 32 | (2 << 24), 0x0300_0028] {
        let mut m = MemoryV2 {
            version: bad,
            ..MemoryV2::default()
        };
        assert_eq!(
            unsafe { v2(h, &mut m) },
            ERROR_ARGUMENT_VERSION_MISMATCH,
            "version {bad:#x}"
        );
        assert_eq!(m.total, 0, "nothing written on mismatch");
    }
    let mut m = MemoryV2 {
        version: 0x0200_0028,
        ..MemoryV2::default()
    };
    assert_eq!(unsafe { v2(h, &mut m) }, SUCCESS);
    let (gib, mib) = (1u64 << 30, 1u64 << 20);
    let used = 4 * gib + 256 * mib;
    assert_eq!(
        m,
        MemoryV2 {
            version: 0x0200_0028,
            total: 80 * gib,
            reserved: 512 * mib,
            free: 80 * gib - 512 * mib - used,
            used,
        }
    );
    assert_eq!(m.total, m.reserved + m.free + m.used);

    let mut m1 = Memory::default();
    assert_eq!(unsafe { v1(h, &mut m1) }, SUCCESS);
    assert_eq!(m1.total, 80 * gib);
    assert_eq!(m1.used, 512 * mib + used, "v1 counts reserved as used");
    assert_eq!(m1.free, m.free);
    assert_eq!(m1.total, m1.free + m1.used);

    assert_eq!(unsafe { v1(h, null_mut()) }, ERROR_INVALID_ARGUMENT);
    assert_eq!(unsafe { v2(h, null_mut()) }, ERROR_INVALID_ARGUMENT);
    assert_eq!(nvml.shutdown(), SUCCESS);
}

fn call_list<R: Copy>(f: ProcFn<R>, h: Handle, capacity: usize, sentinel: R) -> (u32, u32, Vec<R>) {
    let mut buf = vec![sentinel; capacity + 2];
    let mut count = capacity as c_uint;
    let ptr = if capacity == 0 {
        null_mut()
    } else {
        buf.as_mut_ptr()
    };
    let rc = unsafe { f(h, &mut count, ptr) };
    (rc, count, buf)
}

#[test]
fn process_lists_two_call_protocol_and_strides() {
    let (_g, _env, nvml) = Nvml::initialized(&rich_scenario());
    let h0 = nvml.handle_ok(0);
    let [v3, v2, g3, g2] = [
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
    ]
    .map(|name| nvml.sym::<ProcFn<ProcessInfoV2>>(name));
    let [v1, g1] = [
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ]
    .map(|name| nvml.sym::<ProcFn<ProcessInfoV1>>(name));
    let s2 = ProcessInfoV2 {
        pid: 0xdead,
        used_gpu_memory: 0xbeef,
        gpu_instance_id: 7,
        compute_instance_id: 7,
    };
    let s1 = ProcessInfoV1 {
        pid: 0xdead,
        used_gpu_memory: 0xbeef,
    };
    let gib = 1u64 << 30;
    let expect_v2 = |pid, used| ProcessInfoV2 {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: abi::NO_MIG_INSTANCE,
        compute_instance_id: abi::NO_MIG_INSTANCE,
    };
    let compute = [
        expect_v2(4_000_001, gib),
        expect_v2(4_000_002, u64::MAX),
        expect_v2(4_000_003, 3 * gib),
    ];

    for f in [v3, v2] {
        // Size query, then too small, then exact, then roomy.
        assert_eq!(call_list(f, h0, 0, s2).0, ERROR_INSUFFICIENT_SIZE);
        assert_eq!(call_list(f, h0, 0, s2).1, 3);
        let (rc, n, buf) = call_list(f, h0, 2, s2);
        assert_eq!((rc, n), (ERROR_INSUFFICIENT_SIZE, 3));
        assert!(
            buf.iter().all(|r| *r == s2),
            "nothing written when too small"
        );
        let (rc, n, buf) = call_list(f, h0, 3, s2);
        assert_eq!((rc, n), (SUCCESS, 3));
        assert_eq!(&buf[..3], &compute);
        assert_eq!(&buf[3..], &[s2, s2], "nothing written past the records");
        let (rc, n, buf) = call_list(f, h0, 10, s2);
        assert_eq!((rc, n), (SUCCESS, 3));
        assert_eq!(&buf[..3], &compute);
        assert!(buf[3..].iter().all(|r| *r == s2));
    }
    // v1: 16-byte records.
    let (rc, n, buf) = call_list(v1, h0, 3, s1);
    assert_eq!((rc, n), (SUCCESS, 3));
    let pairs: Vec<_> = buf[..3]
        .iter()
        .map(|r| (r.pid, r.used_gpu_memory))
        .collect();
    assert_eq!(
        pairs,
        [
            (4_000_001, gib),
            (4_000_002, u64::MAX),
            (4_000_003, 3 * gib)
        ]
    );
    assert_eq!(&buf[3..], &[s1, s1]);

    // Graphics lists.
    for f in [g3, g2] {
        let (rc, n, buf) = call_list(f, h0, 1, s2);
        assert_eq!((rc, n), (SUCCESS, 1));
        assert_eq!(buf[0], expect_v2(4_000_004, 256 << 20));
        assert_eq!(buf[1], s2);
    }
    let (rc, n, buf) = call_list(g1, h0, 4, s1);
    assert_eq!((rc, n, buf[0].pid, buf[1]), (SUCCESS, 1, 4_000_004, s1));

    // No processes: the size query succeeds with 0.
    let h2 = nvml.handle_ok(2);
    for f in [v3, v2, g3, g2] {
        assert_eq!(call_list(f, h2, 0, s2).0, SUCCESS);
        assert_eq!(call_list(f, h2, 0, s2).1, 0);
    }
    assert_eq!(call_list(v1, h2, 0, s1).0, SUCCESS);

    // Null count pointer; NULL infos with a capacity counts as capacity 0.
    assert_eq!(
        unsafe { v3(h0, null_mut(), null_mut()) },
        ERROR_INVALID_ARGUMENT
    );
    let mut count: c_uint = 50;
    assert_eq!(
        unsafe { v3(h0, &mut count, null_mut()) },
        ERROR_INSUFFICIENT_SIZE
    );
    assert_eq!(count, 3);
    assert_eq!(nvml.shutdown(), SUCCESS);
}

#[test]
fn handles_strings_and_pointers_are_validated() {
    let s = rich_scenario();
    let (_g, _env, nvml) = Nvml::initialized(&s);
    let uuid = sym!(
        nvml,
        "nvmlDeviceGetUUID",
        unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> c_uint
    );
    let name = sym!(
        nvml,
        "nvmlDeviceGetName",
        unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> c_uint
    );
    let h = nvml.handle_ok(0);
    let h1 = nvml.handle_ok(1);
    assert_ne!(h, h1);
    assert_eq!(nvml.handle_ok(0), h, "handles are stable");

    // Foreign, null and misaligned handles.
    let local = 0u64;
    for bogus in [
        null(),
        &local as *const u64 as Handle,
        (h as usize + 1) as Handle,
    ] {
        assert_eq!(nvml.string(uuid, bogus, 80).0, ERROR_INVALID_ARGUMENT);
    }
    assert_eq!(nvml.handle(3).0, ERROR_INVALID_ARGUMENT);
    let by_index = sym!(
        nvml,
        "nvmlDeviceGetHandleByIndex_v2",
        unsafe extern "C" fn(c_uint, *mut Handle) -> c_uint
    );
    assert_eq!(unsafe { by_index(0, null_mut()) }, ERROR_INVALID_ARGUMENT);

    // String buffers: exact fit works, one byte less is INSUFFICIENT_SIZE.
    let len = s.devices[0].uuid.len() as u32;
    assert_eq!(
        nvml.string(uuid, h, len + 1),
        (SUCCESS, s.devices[0].uuid.clone())
    );
    assert_eq!(nvml.string(uuid, h, len).0, ERROR_INSUFFICIENT_SIZE);
    assert_eq!(nvml.string(name, h, 0).0, ERROR_INSUFFICIENT_SIZE);
    assert_eq!(
        nvml.string(name, h, 96),
        (SUCCESS, s.devices[0].name.clone())
    );
    assert_eq!(unsafe { name(h, null_mut(), 96) }, ERROR_INVALID_ARGUMENT);

    // By UUID.
    let by_uuid = sym!(
        nvml,
        "nvmlDeviceGetHandleByUUID",
        unsafe extern "C" fn(*const c_char, *mut Handle) -> c_uint
    );
    let mut out: Handle = null();
    let wanted = std::ffi::CString::new(s.devices[1].uuid.clone()).unwrap();
    assert_eq!(unsafe { by_uuid(wanted.as_ptr(), &mut out) }, SUCCESS);
    assert_eq!(out, h1);
    assert_eq!(
        unsafe { by_uuid(c"GPU-nope".as_ptr(), &mut out) },
        ERROR_NOT_FOUND
    );
    assert_eq!(unsafe { by_uuid(null(), &mut out) }, ERROR_INVALID_ARGUMENT);

    // Small getters.
    let u32_getter = |name: &[u8]| {
        // SAFETY: all of these are (nvmlDevice_t, unsigned int*) -> nvmlReturn_t.
        let f: libloading::Symbol<'_, unsafe extern "C" fn(Handle, *mut c_uint) -> c_uint> =
            unsafe { nvml.lib.get(name) }.unwrap();
        let mut v: c_uint = 0xFFFF;
        let rc = unsafe { f(h, &mut v) };
        (rc, v)
    };
    assert_eq!(u32_getter(b"nvmlDeviceGetIndex\0"), (SUCCESS, 0));
    assert_eq!(u32_getter(b"nvmlDeviceGetMinorNumber\0"), (SUCCESS, 0));
    assert_eq!(s.devices[0].minor, None, "no minor: the index");
    assert_eq!(u32_getter(b"nvmlDeviceGetPersistenceMode\0"), (SUCCESS, 1));
    assert_eq!(u32_getter(b"nvmlDeviceGetComputeMode\0"), (SUCCESS, 0));
    assert_eq!(
        u32_getter(b"nvmlDeviceGetBrand\0"),
        (SUCCESS, abi::BRAND_NVIDIA)
    );
    assert_eq!(
        u32_getter(b"nvmlDeviceGetArchitecture\0"),
        (SUCCESS, abi::DEVICE_ARCH_HOPPER)
    );
    assert_eq!(u32_getter(b"nvmlDeviceGetPowerUsage\0"), (SUCCESS, 123_000));
    assert_eq!(
        u32_getter(b"nvmlDeviceGetFanSpeed\0").0,
        ERROR_NOT_SUPPORTED
    );
    let temp = sym!(
        nvml,
        "nvmlDeviceGetTemperature",
        unsafe extern "C" fn(Handle, c_uint, *mut c_uint) -> c_uint
    );
    let mut t: c_uint = 0;
    assert_eq!(unsafe { temp(h, 0, &mut t) }, SUCCESS);
    assert_eq!(t, 41);
    assert_eq!(unsafe { temp(h, 1, &mut t) }, ERROR_INVALID_ARGUMENT);
    let util = sym!(
        nvml,
        "nvmlDeviceGetUtilizationRates",
        unsafe extern "C" fn(Handle, *mut Utilization) -> c_uint
    );
    let mut u = Utilization::default();
    assert_eq!(unsafe { util(h, &mut u) }, SUCCESS);
    assert_eq!(
        u,
        Utilization {
            gpu: 37,
            memory: 12
        }
    );
    let pci = sym!(
        nvml,
        "nvmlDeviceGetPciInfo_v3",
        unsafe extern "C" fn(Handle, *mut PciInfo) -> c_uint
    );
    let mut p: PciInfo = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { pci(h1, &mut p) }, SUCCESS);
    let bus_id = unsafe { CStr::from_ptr(p.bus_id.as_ptr()) };
    let legacy = unsafe { CStr::from_ptr(p.bus_id_legacy.as_ptr()) };
    assert_eq!((bus_id, legacy), (c"00000000:11:00.0", c"0000:11:00.0"));
    assert_eq!(
        (p.domain, p.bus, p.device, p.pci_device_id),
        (0, 0x11, 0, 0x2330_10DE)
    );
    let cuda = sym!(
        nvml,
        "nvmlSystemGetCudaDriverVersion",
        unsafe extern "C" fn(*mut c_int) -> c_uint
    );
    let mut c: c_int = 0;
    assert_eq!(unsafe { cuda(&mut c) }, SUCCESS);
    assert_eq!(c, 12040);
    let nvml_version = sym!(
        nvml,
        "nvmlSystemGetNVMLVersion",
        unsafe extern "C" fn(*mut c_char, c_uint) -> c_uint
    );
    let mut v = [0 as c_char; 80];
    assert_eq!(unsafe { nvml_version(v.as_mut_ptr(), 80) }, SUCCESS);
    assert_eq!(unsafe { CStr::from_ptr(v.as_ptr()) }, c"12.550.54.15");
    assert_eq!(
        unsafe { nvml_version(v.as_mut_ptr(), 12) },
        ERROR_INSUFFICIENT_SIZE
    );
    assert_eq!(nvml.shutdown(), SUCCESS);
}

/// Every export answers with its own `fail` code, which proves each export looks itself up in
/// `fail` under its own name (a copy-pasted name would answer with another function's code).
/// A scenario's `minor` is what nvmlDeviceGetMinorNumber says, whatever the index.
#[test]
fn a_device_minor_differs_from_its_index_where_the_scenario_says() {
    let mut s = rich_scenario();
    s.devices[0].minor = Some(1);
    s.devices[1].minor = Some(0);
    let (_g, _env, nvml) = Nvml::initialized(&s);
    let minor = sym!(
        nvml,
        "nvmlDeviceGetMinorNumber",
        unsafe extern "C" fn(Handle, *mut c_uint) -> c_uint
    );
    for (index, want) in [(0, 1), (1, 0)] {
        let mut v: c_uint = 0xFFFF;
        assert_eq!(unsafe { minor(nvml.handle_ok(index), &mut v) }, SUCCESS);
        assert_eq!(v, want, "device {index}");
    }
    assert_eq!(nvml.shutdown(), SUCCESS);
}

#[test]
fn every_export_honours_its_own_fail_entry() {
    let plain = rich_scenario();
    let (_g, env, nvml) = Nvml::initialized(&plain);
    let names: Vec<&str> = EXPORTED_FUNCTIONS
        .iter()
        .copied()
        .filter(|n| *n != "nvmlErrorString")
        .collect();
    let mut failing = plain.clone();
    failing.fail = names
        .iter()
        .enumerate()
        .map(|(k, n)| {
            (
                gpushare_fake_nvml::scenario::FunctionName::new(n).unwrap(),
                100 + k as u32,
            )
        })
        .collect();
    write_scenario(&env.state, &failing);
    for (k, name) in names.iter().enumerate() {
        let sym = format!("{name}\0");
        // Every export takes at most four integer/pointer arguments and checks `fail` before
        // touching any of them, so calling each with four zeros is sound on the C ABI
        // (integer-register arguments; extra ones are ignored).
        let f: libloading::Symbol<'_, unsafe extern "C" fn(usize, usize, usize, usize) -> c_uint> =
            unsafe { nvml.lib.get(sym.as_bytes()) }.unwrap();
        assert_eq!(unsafe { f(0, 0, 0, 0) }, 100 + k as u32, "{name}");
    }
    write_scenario(&env.state, &plain);
    assert_eq!(
        nvml.shutdown(),
        SUCCESS,
        "the forced shutdown did not count"
    );
    assert_eq!(nvml.shutdown(), ERROR_UNINITIALIZED);
}

#[test]
fn unknown_fail_names_are_rejected_with_a_location() {
    let text = "{\n  \"devices\": [],\n  \"fail\": { \"nvmlDeviceGetMemoryInfo_v3\": 1 }\n}";
    let err =
        gpushare_fake_nvml::scenario::parse(text, std::path::Path::new("/x/s.json")).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("/x/s.json") && msg.contains("nvmlDeviceGetMemoryInfo_v3"),
        "{msg}"
    );
    assert_eq!(err.line_column().map(|(l, _)| l), Some(3), "{msg}");
}

#[test]
fn minimal_scenario_and_defaults() {
    let s: Scenario = gpushare_fake_nvml::scenario::parse(
        r#"{"devices":[{"uuid":"GPU-1","name":"x","memory_total":1000}]}"#,
        std::path::Path::new("s.json"),
    )
    .unwrap();
    assert!(s.driver_loaded);
    assert_eq!(s.devices[0].memory_reserved, 0);
    assert!(s.devices[0].compute_processes.is_empty());
    for (bad, needle) in [
        (
            r#"{"devices":[{"uuid":"GPU-1","name":"x"}]}"#,
            "memory_total",
        ),
        (
            r#"{"devices":[{"uuid":"GPU-1","name":"x","memory_total":1,"lsot":true}]}"#,
            "lsot",
        ),
        (
            r#"{"devices":[{"uuid":"GPU-1","name":"x","memory_total":1,"compute_processes":[{"pid":1}]}]}"#,
            "used_memory",
        ),
        (r#"{"devices":[],"driver_lodaed":false}"#, "driver_lodaed"),
        (
            r#"{"devices":[{"uuid":"GPU-1","name":"x","memory_total":1},{"uuid":"GPU-1","name":"y","memory_total":1}]}"#,
            "duplicate uuid",
        ),
        (
            r#"{"devices":[{"uuid":"GPU-1","name":"x","memory_total":1,"minor":1},{"uuid":"GPU-2","name":"y","memory_total":1}]}"#,
            "devices[1].minor: minor 1 is another device's",
        ),
        (
            r#"{"devices":[{"uuid":"GPU-1","name":"x","memory_total":1,"memory_reserved":2}]}"#,
            "memory_reserved",
        ),
        (
            r#"{"devices":[{"uuid":"GPU-1","name":"x","memory_total":1,"process_list_growth":100000}]}"#,
            "process_list_growth",
        ),
        (
            r#"{"devices":[{"uuid":"GPU-1","name":"x","memory_total":1,"process_utilization":[{"pid":1,"timestamp":1,"sm_util":101}]}]}"#,
            "process_utilization[0].sm_util",
        ),
    ] {
        let err =
            gpushare_fake_nvml::scenario::parse(bad, std::path::Path::new("s.json")).unwrap_err();
        assert!(err.to_string().contains(needle), "{bad}: {err}");
    }
}

#[test]
fn exported_symbols_are_exactly_the_list() {
    let lib = built_lib();
    let out = gpushare_testkit::output_ok(
        std::process::Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(&lib),
        "nm (binutils)",
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let exported: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace().rev();
            let name = parts.next()?;
            let kind = parts.next()?;
            (kind == "T").then_some(name)
        })
        .collect();
    let expected: BTreeSet<&str> = EXPORTED_FUNCTIONS.iter().copied().collect();
    assert_eq!(exported, expected);
    for f in FORBIDDEN_FUNCTIONS {
        assert!(!exported.contains(f), "{f} must not be exported");
    }
    // The soname NVML clients link against.
    let out = std::process::Command::new("readelf")
        .arg("-d")
        .arg(&lib)
        .output()
        .expect("readelf");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Library soname: [libnvidia-ml.so.1]"),
        "soname"
    );
}

#[test]
fn install_into_is_atomic_and_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let built = built_lib();
    let target = dir.path().join("lib");
    for _ in 0..2 {
        let installed = gpushare_fake_nvml::install_into(&built, &target).unwrap();
        assert_eq!(installed, target.join("libnvidia-ml.so.1"));
        assert_eq!(
            std::fs::read(&installed).unwrap(),
            std::fs::read(&built).unwrap()
        );
        assert_eq!(
            std::fs::read_link(target.join("libnvidia-ml.so")).unwrap(),
            std::path::Path::new("libnvidia-ml.so.1")
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let not_elf = dir.path().join("not-elf");
    std::fs::write(&not_elf, "hello").unwrap();
    assert!(gpushare_fake_nvml::install_into(&not_elf, &target).is_err());

    // The binary does the same.
    let bin = env!("CARGO_BIN_EXE_gpushare-fake-nvml-install");
    let other = dir.path().join("other");
    gpushare_testkit::nvml::run_installer(bin, &built, &other);
    assert!(other.join("libnvidia-ml.so.1").is_file());
    let out = std::process::Command::new(bin)
        .arg("--bogus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The README's full example is a valid scenario and sets every field (keeps the docs honest).
#[test]
fn readme_example_parses() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme
        .find("Example (every field):")
        .expect("example heading");
    let block = &readme[start..];
    let json_start = block.find("```json\n").expect("json block") + "```json\n".len();
    let json_end = json_start + block[json_start..].find("```").expect("block end");
    let text = &block[json_start..json_end];
    let s = gpushare_fake_nvml::scenario::parse(text, std::path::Path::new("README.md")).unwrap();
    let value: serde_json::Value = serde_json::from_str(text).unwrap();
    let reserialized = serde_json::to_value(&s).unwrap();
    assert_eq!(value, reserialized, "the example should list every field");
}

/// nvmlDeviceSetMemoryLimits_v1 / nvmlDeviceGetMemoryLimits_v1: validated as nvml.h documents,
/// recorded in memory-limits.json beside the scenario (read back by Get and by other processes),
/// cleared by soft 0 + hard MAX, NOT_SUPPORTED when the scenario says so.
#[test]
fn memory_limits_are_validated_recorded_and_read_back() {
    use abi::{DEVICE_MEMORY_LIMIT_MAX as MAX, GetMemoryLimitsV1, SetMemoryLimitsV1};
    use gpushare_fake_driver::limits::{self, Limit};
    type Set = unsafe extern "C" fn(Handle, *mut SetMemoryLimitsV1) -> c_uint;
    type Get = unsafe extern "C" fn(Handle, *mut GetMemoryLimitsV1) -> c_uint;
    let (_g, env) = lock();
    let mut s = rich_scenario();
    // A real process in a real directory standing for its cgroup: currentUsed counts processes
    // whose cgroup v2 directory is at or below the path given.
    let me = std::process::id();
    s.devices[1]
        .compute_processes
        .push(gpushare_fake_nvml::Process::new(me, Some(5 << 20)));
    write_scenario(&env.state, &s);
    let _ = std::fs::remove_file(limits::path_for(&env.state));
    let nvml = Nvml::load();
    assert_eq!(nvml.init(), SUCCESS);
    let set = sym!(nvml, "nvmlDeviceSetMemoryLimits_v1", Set);
    let get = sym!(nvml, "nvmlDeviceGetMemoryLimits_v1", Get);
    let h = nvml.handle_ok(1);
    let total = s.devices[1].memory_total;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap()
        .to_owned();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let v2 = mountinfo
        .lines()
        .filter(|l| l.contains(" - cgroup2 "))
        .filter_map(|l| l.split_whitespace().nth(4))
        .min_by_key(|p| p.len())
        .unwrap()
        .to_owned();
    let cgroup = std::ffi::CString::new(format!("{v2}{rel}")).unwrap();
    let missing = c"/nonexistent/cgroup";
    let mk = |ns: *const c_char, soft, hard| SetMemoryLimitsV1 {
        name_space: ns,
        soft_limit: soft,
        hard_limit: hard,
    };
    unsafe {
        assert_eq!(set(h, null_mut()), ERROR_INVALID_ARGUMENT);
        assert_eq!(set(h, &mut mk(null(), 0, 1)), ERROR_INVALID_ARGUMENT);
        assert_eq!(
            set(h, &mut mk(cgroup.as_ptr(), 2, 1)),
            ERROR_INVALID_ARGUMENT,
            "soft > hard"
        );
        assert_eq!(
            set(h, &mut mk(cgroup.as_ptr(), 0, total + 1)),
            ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            set(h, &mut mk(missing.as_ptr(), 0, 1)),
            ERROR_OPERATING_SYSTEM
        );
        assert!(
            !limits::path_for(&env.state).exists(),
            "nothing recorded on errors"
        );
        assert_eq!(set(h, &mut mk(cgroup.as_ptr(), 1 << 30, 2 << 30)), SUCCESS);
    }
    let recorded = limits::read(&env.state).unwrap();
    assert_eq!(
        recorded.devices[&s.devices[1].uuid][cgroup.to_str().unwrap()],
        Limit {
            soft: 1 << 30,
            hard: 2 << 30
        }
    );
    let mut out = GetMemoryLimitsV1 {
        name_space: cgroup.as_ptr(),
        soft_limit: 7,
        hard_limit: 7,
        current_used: 7,
    };
    unsafe {
        assert_eq!(get(h, &mut out), SUCCESS);
        assert_eq!(
            (out.soft_limit, out.hard_limit, out.current_used),
            (1 << 30, 2 << 30, 5 << 20)
        );
        // Another device has no limit for this cgroup.
        assert_eq!(get(nvml.handle_ok(0), &mut out), ERROR_NOT_FOUND);
        out.name_space = missing.as_ptr();
        assert_eq!(get(h, &mut out), ERROR_OPERATING_SYSTEM);
        out.name_space = cgroup.as_ptr();
        // Clearing: soft 0, hard MAX.
        assert_eq!(set(h, &mut mk(cgroup.as_ptr(), 0, MAX)), SUCCESS);
        assert_eq!(get(h, &mut out), ERROR_NOT_FOUND);
    }
    assert!(limits::read(&env.state).unwrap().devices.is_empty());
    let mut off = s.clone();
    off.memory_limits_supported = false;
    write_scenario(&env.state, &off);
    unsafe {
        assert_eq!(set(h, &mut mk(cgroup.as_ptr(), 0, 1)), ERROR_NOT_SUPPORTED);
        assert_eq!(get(h, &mut out), ERROR_NOT_SUPPORTED);
    }
    assert_eq!(nvml.shutdown(), SUCCESS);
}
