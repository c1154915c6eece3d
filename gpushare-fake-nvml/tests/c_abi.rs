//! Compiles abi/nvml_abi_check.c against NVIDIA's nvml.h (from the `nvidia-nvml-dev` wheel in
//! the project venv), links it with `-lnvidia-ml` against the installed mock, runs it on a
//! scenario and compares its canonical output with what the scenario implies. A second build
//! with a deliberately wrong record layout must disagree, proving the comparison is sensitive.

mod common;

use common::{built_lib, memory, rich_scenario, write_scenario};
use gpushare_fake_nvml::abi;
use gpushare_fake_nvml::{ENV_VAR, Process, Scenario};
use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Output;

/// NVIDIA's header and a scratch directory with the mock installed in its `lib/`; `None` (after
/// a loud skip, or failing under `GPUSHARE_REQUIRE`) where the header is missing.
fn prepared() -> Option<(PathBuf, tempfile::TempDir, PathBuf)> {
    gpushare_testkit::c_abi::prepared("nvml-header", &["nvml.h"], |libdir| {
        gpushare_fake_nvml::install_into(&built_lib(), libdir)
    })
}

/// The -D macros carrying the Rust mirrors' layout into the C static asserts.
fn rust_layout_defines() -> Vec<String> {
    [
        (
            "RUST_SIZEOF_PROCESS_INFO_V2",
            size_of::<abi::ProcessInfoV2>(),
        ),
        (
            "RUST_OFFSET_PROCESS_INFO_V2_USED",
            offset_of!(abi::ProcessInfoV2, used_gpu_memory),
        ),
        (
            "RUST_OFFSET_PROCESS_INFO_V2_GI",
            offset_of!(abi::ProcessInfoV2, gpu_instance_id),
        ),
        (
            "RUST_OFFSET_PROCESS_INFO_V2_CI",
            offset_of!(abi::ProcessInfoV2, compute_instance_id),
        ),
        (
            "RUST_SIZEOF_PROCESS_INFO_V1",
            size_of::<abi::ProcessInfoV1>(),
        ),
        ("RUST_SIZEOF_MEMORY", size_of::<abi::Memory>()),
        ("RUST_SIZEOF_MEMORY_V2", size_of::<abi::MemoryV2>()),
        (
            "RUST_OFFSET_MEMORY_V2_RESERVED",
            offset_of!(abi::MemoryV2, reserved),
        ),
        (
            "RUST_OFFSET_MEMORY_V2_USED",
            offset_of!(abi::MemoryV2, used),
        ),
        ("RUST_MEMORY_V2_VERSION", abi::MEMORY_V2_VERSION as usize),
        ("RUST_SIZEOF_UTILIZATION", size_of::<abi::Utilization>()),
        ("RUST_SIZEOF_PCI_INFO", size_of::<abi::PciInfo>()),
        (
            "RUST_SIZEOF_PROCESS_UTILIZATION",
            size_of::<abi::ProcessUtilizationSample>(),
        ),
        (
            "RUST_OFFSET_PROCESS_UTILIZATION_SM",
            offset_of!(abi::ProcessUtilizationSample, sm_util),
        ),
        (
            "RUST_SIZEOF_PROCESS_UTILIZATION_INFO",
            size_of::<abi::ProcessUtilizationInfoV1>(),
        ),
        (
            "RUST_SIZEOF_PROCESSES_UTILIZATION_INFO",
            size_of::<abi::ProcessesUtilizationInfoV1>(),
        ),
        (
            "RUST_PROCESSES_UTILIZATION_INFO_VERSION",
            abi::PROCESSES_UTILIZATION_INFO_V1_VERSION as usize,
        ),
        (
            "RUST_OFFSET_PCI_INFO_BUS_ID",
            offset_of!(abi::PciInfo, bus_id),
        ),
        (
            "RUST_SIZEOF_SET_MEMORY_LIMITS",
            size_of::<abi::SetMemoryLimitsV1>(),
        ),
        (
            "RUST_OFFSET_SET_MEMORY_LIMITS_HARD",
            offset_of!(abi::SetMemoryLimitsV1, hard_limit),
        ),
        (
            "RUST_SIZEOF_GET_MEMORY_LIMITS",
            size_of::<abi::GetMemoryLimitsV1>(),
        ),
        (
            "RUST_OFFSET_GET_MEMORY_LIMITS_USED",
            offset_of!(abi::GetMemoryLimitsV1, current_used),
        ),
    ]
    .iter()
    .map(|(k, v)| format!("-D{k}={v}u"))
    .collect()
}

fn compile(header: &Path, libdir: &Path, out: &Path, extra: &[&str]) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("abi/nvml_abi_check.c");
    let mut args = rust_layout_defines();
    args.extend(extra.iter().map(|e| e.to_string()));
    let result = gpushare_testkit::c_abi::compile(&source, header, &args, libdir, "nvidia-ml", out);
    assert!(
        result.status.success(),
        "compiling {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&result.stderr)
    );
}

fn run(exe: &Path, libdir: &Path, state: Option<&Path>) -> Output {
    gpushare_testkit::c_abi::run(exe, &[], libdir, ENV_VAR, state)
}

fn used_text(used: Option<u64>) -> String {
    used.map_or("n/a".to_owned(), |u| u.to_string())
}

/// What the check must print for `s` (memory worked out here, independently of the mock).
fn expected_output(s: &Scenario) -> String {
    let mut out = String::new();
    writeln!(out, "init 0 Success").unwrap();
    writeln!(out, "driver {}", s.driver_version).unwrap();
    writeln!(out, "count {}", s.devices.len()).unwrap();
    for (i, d) in s.devices.iter().enumerate() {
        let (used, free) = memory(d);
        writeln!(
            out,
            "device {i} uuid={} pci=00000000:{:02X}:00.0 total={} free={free} used={} \
             v2_total={} v2_reserved={} v2_free={free} v2_used={used} util={}/{} name={}",
            d.uuid,
            0x10 + i,
            d.memory_total,
            d.memory_reserved + used,
            d.memory_total,
            d.memory_reserved,
            d.utilization_gpu,
            d.utilization_memory,
            d.name
        )
        .unwrap();
        for (kind, list) in [
            ("compute", &d.compute_processes),
            ("graphics", &d.graphics_processes),
        ] {
            for p in list {
                writeln!(
                    out,
                    "{kind} {i} pid={} used={}",
                    p.pid,
                    used_text(p.used_memory)
                )
                .unwrap();
            }
        }
        for call in ["procutil", "procutilinfo"] {
            if d.process_utilization.is_empty() {
                writeln!(out, "{call} {i} rc=6").unwrap();
            } else {
                writeln!(out, "{call} {i} rc=0").unwrap();
                for u in &d.process_utilization {
                    writeln!(
                        out,
                        "{call} {i} pid={} ts={} sm={} mem={} enc={} dec={}",
                        u.pid, u.timestamp, u.sm_util, u.mem_util, u.enc_util, u.dec_util
                    )
                    .unwrap();
                }
            }
        }
        writeln!(out, "smclock {i} rc=0 mhz={}", d.sm_clock).unwrap();
    }
    if !s.devices.is_empty() {
        writeln!(out, "limits 0 0 0 soft=1048576 hard=2097152 used=0").unwrap();
        writeln!(out, "limits clear 0 6").unwrap();
    }
    writeln!(out, "shutdown 0 1").unwrap();
    out
}

#[test]
fn c_program_built_against_nvidia_header_agrees_with_the_scenario() {
    let Some((header, tmp, libdir)) = prepared() else {
        return;
    };
    let (good, broken) =
        gpushare_testkit::c_abi::good_and_broken(tmp.path(), "nvml_abi_check", |out, extra| {
            compile(&header, &libdir, out, extra)
        });

    let state = tmp.path().join("scenario.json");
    let mut s = rich_scenario();
    // A pid in both lists, and a list long enough for a stride error to show.
    s.devices[1].graphics_processes = vec![
        Process::new(4_000_010, None),
        Process::new(4_000_011, Some(7)),
    ];
    // Two utilization samples (32-byte records), and a clock of its own.
    s.devices[0].process_utilization = vec![
        gpushare_fake_nvml::scenario::ProcessUtilization {
            pid: 4_000_001,
            timestamp: 1_700_000_000_000_001,
            sm_util: 40,
            mem_util: 10,
            enc_util: 1,
            dec_util: 2,
        },
        gpushare_fake_nvml::scenario::ProcessUtilization {
            pid: 4_000_003,
            timestamp: 1_700_000_000_000_002,
            sm_util: 55,
            mem_util: 20,
            enc_util: 3,
            dec_util: 4,
        },
    ];
    s.devices[1].sm_clock = 1410;
    write_scenario(&state, &s);

    let stdout = gpushare_testkit::c_abi::stdout_ok(&run(&good, &libdir, Some(&state)));
    assert_eq!(stdout, expected_output(&s));

    // Sensitivity: the same program reading records with a 16-byte stride must disagree.
    let out = run(&broken, &libdir, Some(&state));
    let broken_stdout = String::from_utf8_lossy(&out.stdout);
    assert_ne!(
        broken_stdout,
        expected_output(&s),
        "the broken layout went unnoticed"
    );
    let differing: Vec<_> = broken_stdout
        .lines()
        .zip(
            expected_output(&s)
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        )
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.to_owned())
        .collect();
    assert!(
        !differing.is_empty()
            && differing
                .iter()
                .all(|l| l.starts_with("compute ") || l.starts_with("graphics ")),
        "only the process records should differ: {differing:?}"
    );
}

#[test]
fn c_program_sees_driver_not_loaded_and_a_located_scenario_error() {
    let Some((header, tmp, libdir)) = prepared() else {
        return;
    };
    let exe = tmp.path().join("nvml_abi_check");
    compile(&header, &libdir, &exe, &[]);

    // Env var unset.
    let out = run(&exe, &libdir, None);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "init 9 Driver Not Loaded\n"
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains(ENV_VAR));

    // Missing file.
    let state = tmp.path().join("scenario.json");
    let out = run(&exe, &libdir, Some(&state));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "init 9 Driver Not Loaded\n"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&*state.to_string_lossy()), "{stderr}");

    // Invalid file: one stderr line naming the file, the error, its line and column.
    std::fs::write(
        &state,
        "{\n  \"devices\": [],\n  \"driver_loded\": true\n}\n",
    )
    .unwrap();
    let out = run(&exe, &libdir, Some(&state));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "init 9 Driver Not Loaded\n"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&*state.to_string_lossy())
            && stderr.contains("driver_loded")
            && stderr.contains("line 3 column"),
        "{stderr}"
    );

    // driver_loaded: false.
    let s = Scenario {
        driver_loaded: false,
        ..rich_scenario()
    };
    write_scenario(&state, &s);
    let out = run(&exe, &libdir, Some(&state));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "init 9 Driver Not Loaded\n"
    );
}
