//! Compiles abi/cuda_abi_check.c against NVIDIA's cuda.h and cudaTypedefs.h (PyPI
//! `nvidia-cuda-runtime`, copied by scripts/setup.sh to `$GPUSHARE_PYENV/cuda-header/`), links
//! it with `-lcuda` against the installed mock, runs it on a scenario and compares its output
//! with what the scenario implies. Two deliberate mismatches must be caught: a Rust mirror of
//! the wrong size fails the build, and a wrong lock-argument layout changes the output.

mod common;

use common::{built_lib, lock, write_scenario};
use gpushare_fake_cuda::abi;
use gpushare_fake_driver::ENV_VAR;
use gpushare_fake_driver::cuda::code;
use serde_json::json;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Output;

/// NVIDIA's header and a scratch directory with the mock installed in its `lib/`; `None` (after
/// a loud skip, or failing under `GPUSHARE_REQUIRE`) where the header is missing.
fn prepared() -> Option<(PathBuf, tempfile::TempDir, PathBuf)> {
    gpushare_testkit::c_abi::prepared("cuda-header", &["cuda.h", "cudaTypedefs.h"], |libdir| {
        gpushare_fake_cuda::install_into(&built_lib(), libdir)
    })
}

/// The -D macros carrying the Rust mirrors into the C static asserts.
fn rust_defines() -> Vec<(&'static str, u64)> {
    vec![
        ("RUST_SIZEOF_LOCK_ARGS", size_of::<abi::LockArgs>() as u64),
        (
            "RUST_OFFSET_LOCK_ARGS_TIMEOUT",
            offset_of!(abi::LockArgs, timeout_ms) as u64,
        ),
        (
            "RUST_OFFSET_LOCK_ARGS_RESERVED0",
            offset_of!(abi::LockArgs, reserved0) as u64,
        ),
        (
            "RUST_OFFSET_LOCK_ARGS_RESERVED1",
            offset_of!(abi::LockArgs, reserved1) as u64,
        ),
        (
            "RUST_SIZEOF_RESERVED_ARGS",
            size_of::<abi::ReservedArgs>() as u64,
        ),
        (
            "RUST_PROCESS_STATE_RUNNING",
            abi::PROCESS_STATE_RUNNING as u64,
        ),
        (
            "RUST_PROCESS_STATE_LOCKED",
            abi::PROCESS_STATE_LOCKED as u64,
        ),
        (
            "RUST_PROCESS_STATE_CHECKPOINTED",
            abi::PROCESS_STATE_CHECKPOINTED as u64,
        ),
        (
            "RUST_PROCESS_STATE_FAILED",
            abi::PROCESS_STATE_FAILED as u64,
        ),
        (
            "RUST_CUDA_ERROR_INVALID_VALUE",
            code::ERROR_INVALID_VALUE.into(),
        ),
        (
            "RUST_CUDA_ERROR_OUT_OF_MEMORY",
            code::ERROR_OUT_OF_MEMORY.into(),
        ),
        (
            "RUST_CUDA_ERROR_NOT_INITIALIZED",
            code::ERROR_NOT_INITIALIZED.into(),
        ),
        ("RUST_CUDA_ERROR_NO_DEVICE", code::ERROR_NO_DEVICE.into()),
        (
            "RUST_CUDA_ERROR_OPERATING_SYSTEM",
            code::ERROR_OPERATING_SYSTEM.into(),
        ),
        (
            "RUST_CUDA_ERROR_ILLEGAL_STATE",
            code::ERROR_ILLEGAL_STATE.into(),
        ),
        ("RUST_CUDA_ERROR_NOT_FOUND", code::ERROR_NOT_FOUND.into()),
        ("RUST_CUDA_ERROR_NOT_READY", code::ERROR_NOT_READY.into()),
        (
            "RUST_CUDA_ERROR_NOT_SUPPORTED",
            code::ERROR_NOT_SUPPORTED.into(),
        ),
        ("RUST_CUDA_ERROR_TIMEOUT", code::ERROR_TIMEOUT.into()),
        ("RUST_CUDA_ERROR_UNKNOWN", code::ERROR_UNKNOWN.into()),
        (
            "RUST_PROC_ADDRESS_SYMBOL_NOT_FOUND",
            abi::PROC_ADDRESS_SYMBOL_NOT_FOUND as u64,
        ),
        (
            "RUST_PROC_ADDRESS_VERSION_NOT_SUFFICIENT",
            abi::PROC_ADDRESS_VERSION_NOT_SUFFICIENT as u64,
        ),
    ]
}

fn compile(
    header: &Path,
    libdir: &Path,
    out: &Path,
    defines: &[(&str, u64)],
    extra: &[&str],
) -> Output {
    let args: Vec<String> = defines
        .iter()
        .map(|(k, v)| format!("-D{k}={v}u"))
        .chain(extra.iter().map(|e| e.to_string()))
        .collect();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("abi/cuda_abi_check.c");
    gpushare_testkit::c_abi::compile(&source, header, &args, libdir, "cuda", out)
}

fn compiled(header: &Path, libdir: &Path, out: &Path, extra: &[&str]) {
    let r = compile(header, libdir, out, &rust_defines(), extra);
    assert!(
        r.status.success(),
        "compiling cuda_abi_check.c:\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
}

fn run(exe: &Path, libdir: &Path, state: Option<&Path>) -> Output {
    gpushare_testkit::c_abi::run(exe, &["4242", "4343"], libdir, ENV_VAR, state)
}

/// What the program must print for a CUDA 12.8 driver with pid 4242 on a GPU with room.
fn expected() -> String {
    let mut out = String::from("version rc=0 12080\n");
    for n in [
        "cuCheckpointProcessGetState",
        "cuCheckpointProcessLock",
        "cuCheckpointProcessCheckpoint",
        "cuCheckpointProcessRestore",
        "cuCheckpointProcessUnlock",
    ] {
        out += &format!("procaddress {n} rc=0 status=0 same=1\n");
        out += &format!("procaddress {n}@12000 rc=0 status=2 null=1\n");
    }
    out += "procaddress cuNoSuchFunction rc=0 status=1 null=1\n\
            procaddress newer-than-driver rc=1 CUDA_ERROR_INVALID_VALUE\n\
            start state rc=0 CUDA_SUCCESS state=0\n\
            checkpoint-running rc=401 CUDA_ERROR_ILLEGAL_STATE\n\
            restore-running rc=401 CUDA_ERROR_ILLEGAL_STATE\n\
            unlock-running rc=401 CUDA_ERROR_ILLEGAL_STATE\n\
            stranger state rc=1 CUDA_ERROR_INVALID_VALUE state=-1\n\
            lock-stranger rc=1 CUDA_ERROR_INVALID_VALUE\n\
            lock rc=0 CUDA_SUCCESS\n\
            locked state rc=0 CUDA_SUCCESS state=1\n\
            checkpoint rc=0 CUDA_SUCCESS\n\
            checkpointed state rc=0 CUDA_SUCCESS state=2\n\
            unlock-checkpointed rc=401 CUDA_ERROR_ILLEGAL_STATE\n\
            restore-before-init rc=3 CUDA_ERROR_NOT_INITIALIZED\n\
            init rc=0 CUDA_SUCCESS\n\
            restore rc=0 CUDA_SUCCESS\n\
            restored state rc=0 CUDA_SUCCESS state=1\n\
            unlock rc=0 CUDA_SUCCESS\n\
            end state rc=0 CUDA_SUCCESS state=0\n\
            lock-reserved rc=1 CUDA_ERROR_INVALID_VALUE\n\
            string 401 rc=0 the operation cannot be performed in the present state\n\
            string 12345 rc=1 null=1\n";
    out
}

#[test]
fn c_program_built_against_nvidia_cuda_h_agrees_with_the_mock() {
    let Some((header, tmp, libdir)) = prepared() else {
        return;
    };
    let (_g, env) = lock();
    let (good, broken) =
        gpushare_testkit::c_abi::good_and_broken(tmp.path(), "cuda_abi_check", |out, extra| {
            compiled(&header, &libdir, out, extra)
        });

    write_scenario(
        &env.state,
        &json!({ "cuda_driver_version": 12080,
                 "devices": [{ "uuid": "GPU-a", "name": "x", "memory_total": 1000,
                               "compute_processes": [{ "pid": 4242, "used_memory": 100 }] }] }),
    );
    let stdout = gpushare_testkit::c_abi::stdout_ok(&run(&good, &libdir, Some(&env.state)));
    assert_eq!(stdout, expected());

    // Sensitivity: the timeout put 8 bytes too far lands in a reserved word: the lock is refused.
    let _ = std::fs::remove_file(gpushare_fake_driver::checkpoint::path_for(&env.state));
    let out = run(&broken, &libdir, Some(&env.state));
    let broken_out = String::from_utf8_lossy(&out.stdout);
    let differing: Vec<&str> = broken_out
        .lines()
        .zip(expected().lines())
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a)
        .collect();
    assert_eq!(
        differing.first().copied(),
        Some("lock rc=1 CUDA_ERROR_INVALID_VALUE"),
        "the wrong layout went unnoticed:\n{broken_out}"
    );

    // Without a scenario there is no GPU: cuInit says so.
    let out = run(&good, &libdir, None);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "version rc=3 0\ninit 100 CUDA_ERROR_NO_DEVICE\n"
    );
}

#[test]
fn a_rust_mirror_that_disagrees_with_cuda_h_does_not_build() {
    let Some((header, tmp, libdir)) = prepared() else {
        return;
    };
    for (macro_name, wrong, message) in [
        ("RUST_SIZEOF_LOCK_ARGS", 56, "Rust LockArgs size"),
        (
            "RUST_OFFSET_LOCK_ARGS_RESERVED1",
            4,
            "Rust LockArgs.reserved1",
        ),
        ("RUST_PROCESS_STATE_FAILED", 4, "Rust process states"),
        ("RUST_CUDA_ERROR_NOT_READY", 909, "Rust CUresult codes"),
    ] {
        let defines: Vec<(&str, u64)> = rust_defines()
            .into_iter()
            .map(|(k, v)| (k, if k == macro_name { wrong } else { v }))
            .collect();
        let r = compile(&header, &libdir, &tmp.path().join("x"), &defines, &[]);
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "{macro_name}={wrong} compiled");
        assert!(stderr.contains(message), "{macro_name}: {stderr}");
    }
}
