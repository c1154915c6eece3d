//! The mock libcuda through raw dlopen/dlsym (libloading): its exports and soname, the
//! installer, cuGetProcAddress on an old driver, argument checks, error texts, persistence mode.
//! The state machine itself is tested through the agent's loader
//! (gpushare-agent/tests/cuda_checkpoint.rs) and the C check (tests/c_abi.rs).

mod common;

use common::{TestEnv, built_lib, lock, write_scenario};
use gpushare_fake_cuda::abi::{self, LockArgs, ReservedArgs};
use gpushare_fake_driver::cuda::{RESULTS, code};
use libloading::{Library, Symbol};
use serde_json::json;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ptr::{null, null_mut};
use std::sync::MutexGuard;

type Init = unsafe extern "C" fn(c_uint) -> c_uint;
type Version = unsafe extern "C" fn(*mut c_int) -> c_uint;
type Text = unsafe extern "C" fn(c_uint, *mut *const c_char) -> c_uint;
type ProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_uint;
type GetState = unsafe extern "C" fn(c_int, *mut c_int) -> c_uint;
type Lock = unsafe extern "C" fn(c_int, *mut LockArgs) -> c_uint;
type WithArgs = unsafe extern "C" fn(c_int, *mut ReservedArgs) -> c_uint;

fn lib() -> Library {
    unsafe { Library::new(built_lib()) }.expect("load the mock")
}

fn sym<'a, T>(lib: &'a Library, name: &str) -> Symbol<'a, T> {
    unsafe { lib.get(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The checkpoint API's entry points, by their exported names.
struct Checkpoint<'a> {
    get_state: Symbol<'a, GetState>,
    lock: Symbol<'a, Lock>,
    checkpoint: Symbol<'a, WithArgs>,
    restore: Symbol<'a, WithArgs>,
    unlock: Symbol<'a, WithArgs>,
}

impl<'a> Checkpoint<'a> {
    fn of(lib: &'a Library) -> Self {
        Self {
            get_state: sym(lib, "cuCheckpointProcessGetState"),
            lock: sym(lib, "cuCheckpointProcessLock"),
            checkpoint: sym(lib, "cuCheckpointProcessCheckpoint"),
            restore: sym(lib, "cuCheckpointProcessRestore"),
            unlock: sym(lib, "cuCheckpointProcessUnlock"),
        }
    }
}

/// This binary's lock, held over `scenario(version, cuda)`, and the mock loaded.
fn loaded(
    version: i32,
    cuda: serde_json::Value,
) -> (MutexGuard<'static, ()>, &'static TestEnv, Library) {
    let (guard, env) = lock();
    write_scenario(&env.state, &scenario(version, cuda));
    (guard, env, lib())
}

fn scenario(version: i32, cuda: serde_json::Value) -> serde_json::Value {
    json!({ "cuda_driver_version": version,
            "devices": [{ "uuid": "GPU-a", "name": "x", "memory_total": 1000,
                          "compute_processes": [{ "pid": 4242, "used_memory": 100 }] }],
            "cuda": cuda })
}

#[test]
fn exports_soname_and_nothing_of_nvml() {
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(built_lib())
        .output()
        .unwrap();
    let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|s| s.starts_with("cu") || s.starts_with("nvml"))
        .map(str::to_owned)
        .collect();
    exported.sort();
    let mut expected: Vec<String> = gpushare_fake_cuda::EXPORTED_FUNCTIONS
        .iter()
        .map(|s| s.to_string())
        .collect();
    expected.sort();
    assert_eq!(exported, expected);
    let out = std::process::Command::new("readelf")
        .arg("-d")
        .arg(built_lib())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("Library soname: [libcuda.so.1]"));
}

#[test]
fn installer_puts_libcuda_and_its_link_name_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lib");
    let installed = gpushare_fake_cuda::install_into(&built_lib(), &dir).unwrap();
    assert_eq!(installed, dir.join("libcuda.so.1"));
    assert_eq!(
        std::fs::read_link(dir.join("libcuda.so")).unwrap(),
        std::path::Path::new("libcuda.so.1")
    );
    gpushare_fake_cuda::install_into(&built_lib(), &dir).unwrap();
    let bin = env!("CARGO_BIN_EXE_gpushare-fake-cuda-install");
    let other = tmp.path().join("other");
    gpushare_testkit::nvml::run_installer(bin, &built_lib(), &other);
    assert!(other.join("libcuda.so.1").is_file());
    let not_elf = tmp.path().join("x.so");
    std::fs::write(&not_elf, "hello").unwrap();
    assert!(gpushare_fake_cuda::install_into(&not_elf, &other).is_err());
}

#[test]
fn an_old_driver_does_not_hand_out_the_checkpoint_api() {
    let (_g, _env, lib) = loaded(12040, json!({}));
    let proc_address: Symbol<ProcAddress> = sym(&lib, "cuGetProcAddress_v2");
    for name in gpushare_fake_driver::CUDA_CHECKPOINT_FUNCTIONS {
        let c = std::ffi::CString::new(*name).unwrap();
        let (mut p, mut status) = (std::ptr::dangling_mut::<c_void>(), -1);
        // The agent asks for the 12.8 ABI: more than this driver has.
        let rc = unsafe { proc_address(c.as_ptr(), &mut p, 12080, 0, &mut status) };
        assert_eq!(rc, code::ERROR_INVALID_VALUE, "{name}");
        let rc = unsafe { proc_address(c.as_ptr(), &mut p, 12040, 0, &mut status) };
        assert_eq!(
            (rc, p.is_null(), status),
            (0, true, abi::PROC_ADDRESS_SYMBOL_NOT_FOUND)
        );
    }
    // Called anyway (dlsym finds the mock's exports): not supported.
    let get_state: Symbol<GetState> = sym(&lib, "cuCheckpointProcessGetState");
    let mut st = -1;
    assert_eq!(
        unsafe { get_state(4242, &mut st) },
        code::ERROR_NOT_SUPPORTED
    );
    let version: Symbol<Version> = sym(&lib, "cuDriverGetVersion");
    let mut v = 0;
    assert_eq!(unsafe { version(&mut v) }, 0);
    assert_eq!(v, 12040);
}

#[test]
fn arguments_are_checked_before_anything_happens() {
    let (_g, _env, lib) = loaded(12080, json!({}));
    let init: Symbol<Init> = sym(&lib, "cuInit");
    let version: Symbol<Version> = sym(&lib, "cuDriverGetVersion");
    let proc_address: Symbol<ProcAddress> = sym(&lib, "cuGetProcAddress_v2");
    let Checkpoint {
        get_state,
        lock: lock_fn,
        checkpoint,
        unlock,
        ..
    } = Checkpoint::of(&lib);
    unsafe {
        assert_eq!(
            init(1),
            code::ERROR_INVALID_VALUE,
            "flags must be 0 (and no cuInit here)"
        );
        assert_eq!(version(null_mut()), code::ERROR_INVALID_VALUE);
        let mut p = null_mut();
        assert_eq!(proc_address(null(), &mut p, 12080, 0, null_mut()), 1);
        assert_eq!(
            proc_address(c"cuInit".as_ptr(), null_mut(), 12080, 0, null_mut()),
            1
        );
        assert_eq!(
            proc_address(c"cuInit".as_ptr(), &mut p, 12080, 4, null_mut()),
            1,
            "flags"
        );
        assert_eq!(
            proc_address(c"cuInit".as_ptr(), &mut p, 12080, 0, null_mut()),
            0
        );
        assert_eq!(p, sym::<Init>(&lib, "cuInit").try_as_raw_ptr().unwrap());
        assert_eq!(get_state(4242, null_mut()), code::ERROR_INVALID_VALUE);
        for pid in [0, -1] {
            let mut st = -1;
            assert_eq!(
                get_state(pid, &mut st),
                code::ERROR_INVALID_VALUE,
                "pid {pid}"
            );
        }
        let mut args = LockArgs {
            reserved1: [0, 0, 0, 0, 0, 0, 1],
            ..LockArgs::default()
        };
        assert_eq!(lock_fn(4242, &mut args), code::ERROR_INVALID_VALUE);
        assert_eq!(lock_fn(4242, null_mut()), 0, "NULL arguments: no timeout");
        let mut reserved = ReservedArgs {
            reserved: [1, 0, 0, 0, 0, 0, 0, 0],
        };
        assert_eq!(checkpoint(4242, &mut reserved), code::ERROR_INVALID_VALUE);
        assert_eq!(unlock(4242, &mut reserved), code::ERROR_INVALID_VALUE);
        let mut st = -1;
        assert_eq!(get_state(4242, &mut st), 0);
        assert_eq!(
            st,
            abi::PROCESS_STATE_LOCKED,
            "refused calls changed nothing"
        );
        assert_eq!(unlock(4242, null_mut()), 0);
    }
}

#[test]
fn every_known_code_has_its_name_and_text_and_others_are_refused() {
    let lib = lib();
    let name: Symbol<Text> = sym(&lib, "cuGetErrorName");
    let text: Symbol<Text> = sym(&lib, "cuGetErrorString");
    for (c, n, t) in RESULTS {
        let mut p = null();
        assert_eq!(unsafe { name(*c, &mut p) }, 0);
        assert_eq!(unsafe { CStr::from_ptr(p) }.to_str().unwrap(), *n);
        assert_eq!(unsafe { text(*c, &mut p) }, 0);
        assert_eq!(unsafe { CStr::from_ptr(p) }.to_str().unwrap(), *t);
    }
    let mut p = c"x".as_ptr();
    assert_eq!(unsafe { name(12345, &mut p) }, code::ERROR_INVALID_VALUE);
    assert!(p.is_null());
    assert_eq!(unsafe { text(0, null_mut()) }, code::ERROR_INVALID_VALUE);
}

#[test]
fn persistence_mode_lets_a_process_without_cuinit_restore() {
    // This test binary never calls cuInit (no test here does): restore needs persistence mode.
    let (_g, env, lib) = loaded(12080, json!({}));
    let Checkpoint {
        lock: lock_fn,
        checkpoint,
        restore,
        unlock,
        ..
    } = Checkpoint::of(&lib);
    unsafe {
        assert_eq!(lock_fn(4242, null_mut()), 0);
        assert_eq!(checkpoint(4242, null_mut()), 0);
        assert_eq!(restore(4242, null_mut()), code::ERROR_NOT_INITIALIZED);
        write_scenario(
            &env.state,
            &scenario(12080, json!({ "persistence_mode": true })),
        );
        assert_eq!(restore(4242, null_mut()), 0);
        assert_eq!(unlock(4242, null_mut()), 0);
    }
}

/// The README's `cuda` section example is valid (keeps the docs honest).
#[test]
fn readme_example_parses() {
    let readme = include_str!("../README.md");
    let start = readme.find("```json\n\"cuda\": {").expect("example") + "```json\n".len();
    let end = start + readme[start..].find("```").expect("block end");
    let text = format!("{{ {} }}", &readme[start..end]);
    let s =
        gpushare_fake_driver::scenario::parse(&text, std::path::Path::new("README.md")).unwrap();
    assert_eq!(s.cuda.processes.len(), 4);
    assert_eq!(s.cuda.checkpoint_delay_ms, 1500);
}

/// cuda-checkpoint #53: a process restored through the mock whose context is live (not
/// checkpointed since) is recorded as a host hang once it is killed; one checkpointed again
/// before the kill is not, and neither is a process that was never restored.
#[test]
fn a_restored_process_killed_with_a_live_context_is_recorded_as_a_host_hang() {
    let sleeper = || {
        std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap()
    };
    let (mut live, mut again, mut never) = (sleeper(), sleeper(), sleeper());
    let pids = [live.id(), again.id(), never.id()];
    let (_g, env) = lock();
    let procs: Vec<_> = pids
        .iter()
        .map(|p| json!({ "pid": p, "used_memory": 100 }))
        .collect();
    write_scenario(
        &env.state,
        &json!({ "cuda_driver_version": 12080,
                 "devices": [{ "uuid": "GPU-a", "name": "x", "memory_total": 1000,
                               "compute_processes": procs }],
                 "cuda": { "persistence_mode": true } }),
    );
    let lib = lib();
    let c = Checkpoint::of(&lib);
    let pid = |p: u32| p as c_int;
    unsafe {
        for p in [live.id(), again.id()] {
            assert_eq!((c.lock)(pid(p), null_mut()), 0);
            assert_eq!((c.checkpoint)(pid(p), null_mut()), 0);
            assert_eq!((c.restore)(pid(p), null_mut()), 0);
            assert_eq!((c.unlock)(pid(p), null_mut()), 0);
        }
        // The workaround: lock and checkpoint again before the kill.
        assert_eq!((c.lock)(pid(again.id()), null_mut()), 0);
        assert_eq!((c.checkpoint)(pid(again.id()), null_mut()), 0);
    }
    for child in [&mut again, &mut never] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let hangs = gpushare_fake_driver::checkpoint::host_hangs(&env.state).unwrap();
    assert_eq!(hangs, Vec::new(), "checkpointed again, or never restored");
    live.kill().unwrap();
    live.wait().unwrap();
    let hangs = gpushare_fake_driver::checkpoint::host_hangs(&env.state).unwrap();
    assert_eq!(hangs.len(), 1, "{hangs:?}");
    assert_eq!(hangs[0].pid, pids[0]);
}
