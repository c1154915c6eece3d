//! Real NVML clients (nvidia-ml-py and nvitop, from the project venv) list the mock's devices,
//! memory and processes; abi/pyclients_check.py prints what they saw as JSON and this test
//! compares it with the scenario.

mod common;

use common::{built_lib, memory, pyenv, rich_scenario, skip_or_fail, write_scenario};
use gpushare_fake_nvml::{ENV_VAR, Scenario};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

fn expected(s: &Scenario) -> Value {
    let list = |l: &[gpushare_fake_nvml::Process]| -> Value {
        l.iter()
            .map(|p| json!({"pid": p.pid, "used": p.used_memory}))
            .collect()
    };
    // What each client sees of each device.
    let (pynvml_devices, nvitop_devices): (Vec<Value>, Vec<Value>) = s
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let (used, free) = memory(d);
            let bus_id = format!("00000000:{:02X}:00.0", 0x10 + i);
            let mut processes = serde_json::Map::new();
            for (kind, l) in [("C", &d.compute_processes), ("G", &d.graphics_processes)] {
                for p in l {
                    processes.insert(
                        p.pid.to_string(),
                        json!({"gpu_memory": p.used_memory, "type": kind}),
                    );
                }
            }
            let pynvml = json!({
                "index": i, "index_by_uuid": i, "uuid": d.uuid, "name": d.name,
                "pci_bus_id": bus_id,
                "memory_v1": {"total": d.memory_total, "free": free, "used": d.memory_reserved + used},
                "memory_v2": {"total": d.memory_total, "reserved": d.memory_reserved, "free": free, "used": used},
                "compute": list(&d.compute_processes),
                "graphics": list(&d.graphics_processes),
            });
            let nvitop = json!({
                "index": i, "uuid": d.uuid, "name": d.name,
                "bus_id": bus_id,
                "memory_total": d.memory_total, "memory_used": used, "memory_free": free,
                "processes": processes,
            });
            (pynvml, nvitop)
        })
        .unzip();
    json!({
        "pynvml": {
            "driver_version": s.driver_version,
            "cuda_driver_version": s.cuda_driver_version,
            "error_string_15": "GPU is lost",
            "devices": pynvml_devices,
        },
        "nvitop": {"devices": nvitop_devices, "unknown_functions": []},
    })
}

#[test]
fn pynvml_and_nvitop_list_what_the_scenario_says() {
    let python = pyenv().join("bin").join("python");
    if !python.is_file() {
        skip_or_fail(&format!("python venv not found at {}", pyenv().display()));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let libdir = tmp.path().join("lib");
    gpushare_fake_nvml::install_into(&built_lib(), &libdir).unwrap();
    let state = tmp.path().join("scenario.json");
    let s = rich_scenario();
    assert!(
        s.devices.iter().all(|d| d
            .compute_processes
            .iter()
            .all(|c| d.graphics_processes.iter().all(|g| g.pid != c.pid))),
        "nvitop merges a pid listed twice; keep the lists disjoint here"
    );
    write_scenario(&state, &s);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("abi/pyclients_check.py");
    let out = Command::new(&python)
        .arg(&script)
        .env("LD_LIBRARY_PATH", &libdir)
        .env(ENV_VAR, &state)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(tmp.path())
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed:\n{stderr}",
        script.display()
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bad JSON ({e}):\n{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let want = expected(&s);
    assert_eq!(
        got,
        want,
        "\n got: {}\nwant: {}\nstderr: {stderr}",
        serde_json::to_string_pretty(&got).unwrap(),
        serde_json::to_string_pretty(&want).unwrap()
    );
}
