//! The agent's NVML sampler against the mock libnvidia-ml, loaded through nvml-wrapper by path (the
//! same code path as on a real node), across scenario changes.

use gpushare_agent::{
    nvml::{DriverStatus, NvmlSampler},
    sample::{DeviceHealth, GpuSample, ProcessSample},
};
use gpushare_testkit::{
    FakeGpuProcess,
    nvml::{SCENARIO_ENV, Scenario, fake_nvml_lib},
};
use serde_json::json;

const GIB: u64 = 1 << 30;

fn procs(s: &GpuSample) -> Vec<(u32, u32, Option<u64>)> {
    let mut v: Vec<_> = s
        .processes
        .iter()
        .map(|p: &ProcessSample| (p.pid, p.device_index, p.used_bytes))
        .collect();
    v.sort();
    v
}

fn device(uuid: &str, compute: serde_json::Value) -> serde_json::Value {
    json!({ "uuid": uuid, "name": "NVIDIA Fake H100", "memory_total": 80 * GIB,
            "memory_reserved": GIB / 2, "compute_processes": compute })
}

/// One test walks through every scenario: the mock's scenario path is process-global.
#[test]
fn sampler_follows_the_mock_across_scenario_changes() {
    let a = FakeGpuProcess::spawn(None, &[], &[]).unwrap();
    let b = FakeGpuProcess::spawn(None, &[], &[]).unwrap();
    let (pa, pb) = (a.pid(), b.pid());
    let scenario = Scenario::create(
        &json!({ "devices": [device("GPU-a", json!([])), device("GPU-b", json!([]))] }),
    )
    .unwrap();
    // SAFETY: this is the only test in the binary that touches the variable.
    unsafe { std::env::set_var(SCENARIO_ENV, scenario.path()) };
    let mut sampler = NvmlSampler::open(Some(&fake_nvml_lib()));
    assert!(
        matches!(sampler.status(), DriverStatus::Ready { .. }),
        "{:?}",
        sampler.status()
    );

    // Two GPUs, nobody on them.
    let s = sampler.sample();
    assert_eq!(s.devices.len(), 2);
    assert_eq!(s.devices[1].uuid, "GPU-b");
    assert_eq!(s.devices[0].memory_total, 80 * GIB);
    assert_eq!(s.devices[0].memory_reserved, GIB / 2);
    assert!(s.device_ok(0) && s.device_ok(1));
    assert!(s.processes.is_empty());

    // A process appears on GPU 0, another on both; graphics + compute records of one pid merge.
    let mut d0 = device(
        "GPU-a",
        json!([{ "pid": pa, "used_memory": GIB }, { "pid": pb, "used_memory": 2 * GIB }]),
    );
    d0["graphics_processes"] = json!([{ "pid": pa, "used_memory": GIB }]);
    let d1 = device("GPU-b", json!([{ "pid": pb, "used_memory": 3 * GIB }]));
    scenario.write(&json!({ "devices": [d0, d1] })).unwrap();
    let s = sampler.sample();
    assert_eq!(
        procs(&s),
        vec![
            (pa, 0, Some(GIB)),
            (pb, 0, Some(2 * GIB)),
            (pb, 1, Some(3 * GIB))
        ]
    );
    assert_eq!(s.devices[0].memory_used, 3 * GIB);
    assert_eq!(s.devices[0].memory_free, 80 * GIB - GIB / 2 - 3 * GIB);
    real_clients_agree_with_the_agent(&scenario, &s);

    // Compute and graphics records of one pid with different values: the larger wins, whichever
    // list has it (pynvml reads the compute list only, so this is not cross-checked).
    let mut d0 = device(
        "GPU-a",
        json!([{ "pid": pa, "used_memory": GIB }, { "pid": pb, "used_memory": 3 * GIB }]),
    );
    d0["graphics_processes"] = json!([
        { "pid": pa, "used_memory": 2 * GIB }, { "pid": pb, "used_memory": GIB }
    ]);
    scenario.write(&json!({ "devices": [d0] })).unwrap();
    let s = sampler.sample();
    assert_eq!(
        procs(&s),
        vec![(pa, 0, Some(2 * GIB)), (pb, 0, Some(3 * GIB))],
        "merged by max, graphics larger for one pid, compute for the other"
    );

    // It grows; memory "not available" for the other; a garbage record (R535 stride bug) is dropped.
    let garbage = 0x7ff0_0000u32;
    let d0 = device(
        "GPU-a",
        json!([
        { "pid": pa, "used_memory": 5 * GIB }, { "pid": pb, "used_memory": null },
        { "pid": garbage, "used_memory": 12345 }, { "pid": pa + 1_000_000, "used_memory": 1 }]),
    );
    scenario.write(&json!({ "devices": [d0] })).unwrap();
    let s = sampler.sample();
    assert_eq!(procs(&s), vec![(pa, 0, Some(5 * GIB)), (pb, 0, None)]);
    assert_eq!(sampler.distrusted().get("no_such_pid"), Some(&2));

    // More processes appear between NVML's two calls (beyond nvml-wrapper's +5 headroom): retried.
    let mut d0 = device("GPU-a", json!([{ "pid": pa, "used_memory": GIB }]));
    d0["process_list_growth"] = json!(8);
    scenario.write(&json!({ "devices": [d0] })).unwrap();
    let s = sampler.sample();
    assert!(s.device_ok(0), "{:?}", s.health);
    assert_eq!(
        procs(&s),
        vec![(pa, 0, Some(GIB))],
        "synthetic pids of the growth do not exist"
    );
    assert!(sampler.list_retries() >= 1);

    // A forced error on one call: that device is degraded (never enforced on), counted per call.
    let d0 = device("GPU-a", json!([{ "pid": pa, "used_memory": GIB }]));
    let d1 = device("GPU-b", json!([{ "pid": pb, "used_memory": GIB }]));
    scenario
        .write(&json!({ "devices": [d0.clone(), d1.clone()], "fail": { "nvmlDeviceGetComputeRunningProcesses_v3": 999 } }))
        .unwrap();
    let s = sampler.sample();
    assert!(
        matches!(&s.health[0].1, DeviceHealth::Degraded { reason } if reason.contains("nvmlDeviceGetComputeRunningProcesses_v3"))
    );
    assert!(!s.device_ok(0) && !s.device_ok(1));
    assert!(s.processes.is_empty());
    assert_eq!(
        sampler
            .errors()
            .get("nvmlDeviceGetComputeRunningProcesses_v3"),
        Some(&2)
    );
    assert_eq!(s.devices.len(), 2, "device memory still reported");

    // GPU 1 is lost; GPU 0 keeps working.
    let mut lost = d1.clone();
    lost["lost"] = json!(true);
    scenario
        .write(&json!({ "devices": [d0.clone(), lost] }))
        .unwrap();
    let s = sampler.sample();
    assert!(s.device_ok(0));
    assert!(
        matches!(&s.health[1].1, DeviceHealth::Degraded { reason } if reason.contains("GPU is lost"))
    );
    assert_eq!(procs(&s), vec![(pa, 0, Some(GIB))]);

    // ...and comes back.
    scenario
        .write(&json!({ "devices": [d0.clone(), d1.clone()] }))
        .unwrap();
    let s = sampler.sample();
    assert!(s.device_ok(0) && s.device_ok(1));
    assert_eq!(procs(&s), vec![(pa, 0, Some(GIB)), (pb, 1, Some(GIB))]);

    // The process disappears.
    scenario
        .write(&json!({ "devices": [device("GPU-a", json!([])), d1] }))
        .unwrap();
    drop(a);
    let s = sampler.sample();
    assert_eq!(procs(&s), vec![(pb, 1, Some(GIB))]);

    // The driver goes away under the agent: every device degraded, nothing enforced, no crash.
    scenario
        .write(&json!({ "driver_loaded": false, "devices": [] }))
        .unwrap();
    let s = sampler.sample();
    assert!(s.processes.is_empty() && s.devices.is_empty());
    assert!(sampler.errors().get("nvmlDeviceGetCount_v2").is_some());
    drop(b);
}

/// NVIDIA's Python binding (pynvml) and nvitop, reading the same scenario through the mock under its
/// real name, must see what the agent sees: devices, pids, memory.
fn real_clients_agree_with_the_agent(scenario: &Scenario, agent: &GpuSample) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = gpushare_testkit::skip::pyenv().join("bin/python");
    if !python.exists() {
        assert!(
            !gpushare_testkit::skip::required(),
            "no python venv at {} (scripts/setup.sh creates it)",
            python.display()
        );
        gpushare_testkit::loud_skip(&format!(
            "real-client cross-check: no venv at {}",
            python.display()
        ));
        return;
    }
    let lib_dir = scenario.dir().join("lib");
    gpushare_testkit::nvml::run_installer(
        gpushare_testkit::workspace_bin("gpushare-fake-nvml-install"),
        &fake_nvml_lib(),
        &lib_dir,
    );
    let out = gpushare_testkit::output_ok(
        std::process::Command::new(&python)
            .arg(root.join("gpushare-fake-nvml/abi/pyclients_check.py"))
            .env("LD_LIBRARY_PATH", &lib_dir)
            .env(SCENARIO_ENV, scenario.path()),
        "pyclients_check.py",
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let py = &v["pynvml"]["devices"];
    let top = &v["nvitop"]["devices"];
    assert_eq!(py.as_array().unwrap().len(), agent.devices.len());
    for d in &agent.devices {
        let i = d.index as usize;
        assert_eq!(py[i]["uuid"], d.uuid.as_str());
        assert_eq!(py[i]["name"], d.name.as_str());
        assert_eq!(py[i]["memory_v2"]["total"], d.memory_total);
        assert_eq!(py[i]["memory_v2"]["used"], d.memory_used);
        assert_eq!(py[i]["memory_v2"]["free"], d.memory_free);
        assert_eq!(top[i]["uuid"], d.uuid.as_str());
        let mut py_procs: Vec<(u64, Option<u64>)> = py[i]["compute"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["pid"].as_u64().unwrap(), p["used"].as_u64()))
            .collect();
        py_procs.sort();
        let mut ours: Vec<(u64, Option<u64>)> = agent
            .processes
            .iter()
            .filter(|p| p.device_index == d.index)
            .map(|p| (p.pid as u64, p.used_bytes))
            .collect();
        ours.sort();
        assert_eq!(py_procs, ours, "pynvml and the agent disagree on GPU {i}");
        let top_pids: Vec<u64> = top[i]["processes"]
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.parse().unwrap())
            .collect();
        let mut top_pids = top_pids;
        top_pids.sort();
        assert_eq!(
            top_pids,
            ours.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            "nvitop disagrees on GPU {i}"
        );
    }
}

#[test]
fn a_missing_driver_is_a_state_not_an_error() {
    let mut sampler =
        NvmlSampler::open(Some(std::path::Path::new("/nonexistent/libnvidia-ml.so.1")));
    let DriverStatus::NoDriver { reason } = sampler.status() else {
        panic!("driver found?")
    };
    assert!(
        reason.contains("/nonexistent/libnvidia-ml.so.1"),
        "{reason}"
    );
    let s = sampler.sample();
    assert!(s.devices.is_empty() && s.processes.is_empty() && s.health.is_empty());
}
