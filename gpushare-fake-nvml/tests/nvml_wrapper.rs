//! The mock as nvml-wrapper (the agent's NVML binding) sees it, loaded by path.

mod common;

use common::{built_lib, lock, rich_scenario, write_atomic, write_scenario};
use gpushare_fake_nvml::{Device, Process, Scenario};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Brand, ComputeMode, TemperatureSensor};
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

fn open() -> Result<Nvml, NvmlError> {
    let lib = built_lib();
    Nvml::builder().lib_path(lib.as_os_str()).init()
}

fn procs(
    list: Vec<nvml_wrapper::struct_wrappers::device::ProcessInfo>,
) -> Vec<(u32, UsedGpuMemory)> {
    list.into_iter()
        .map(|p| {
            assert_eq!(p.gpu_instance_id, None, "0xFFFFFFFF outside MIG");
            assert_eq!(p.compute_instance_id, None, "0xFFFFFFFF outside MIG");
            (p.pid, p.used_gpu_memory)
        })
        .collect()
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

#[test]
fn lists_devices_memory_and_processes() {
    let (_g, env) = lock();
    let s = rich_scenario();
    write_scenario(&env.state, &s);
    let nvml = open().expect("init");

    assert_eq!(nvml.sys_driver_version().unwrap(), "550.54.15");
    assert_eq!(nvml.sys_nvml_version().unwrap(), "12.550.54.15");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
    assert_eq!(nvml.device_count().unwrap(), 3);

    for (i, d) in s.devices.iter().enumerate() {
        let dev = nvml.device_by_index(i as u32).unwrap();
        assert_eq!(dev.name().unwrap(), d.name);
        assert_eq!(dev.uuid().unwrap(), d.uuid);
        assert_eq!(dev.index().unwrap(), i as u32);
        assert_eq!(dev.minor_number().unwrap(), i as u32);
        let by_uuid = nvml.device_by_uuid(d.uuid.as_str()).unwrap();
        assert_eq!(by_uuid.index().unwrap(), i as u32);
        let pci = dev.pci_info().unwrap();
        assert_eq!(pci.bus_id, format!("00000000:{:02X}:00.0", 0x10 + i));
        assert_eq!(pci.bus, 0x10 + i as u32);
        let util = dev.utilization_rates().unwrap();
        assert_eq!(
            (util.gpu, util.memory),
            (d.utilization_gpu, d.utilization_memory)
        );
        assert_eq!(
            dev.temperature(TemperatureSensor::Gpu).unwrap(),
            d.temperature
        );
        assert_eq!(dev.power_usage().unwrap(), d.power_usage);
        assert_eq!(dev.brand().unwrap(), Brand::Nvidia);
        assert_eq!(dev.architecture().unwrap(), DeviceArchitecture::Hopper);
        assert_eq!(dev.compute_mode().unwrap(), ComputeMode::Default);
        assert!(dev.is_in_persistent_mode().unwrap());
        // Functions the mock does not export surface as FailedToLoadSymbol (fan_speed uses
        // nvmlDeviceGetFanSpeed_v2).
        assert!(matches!(
            dev.fan_speed(0),
            Err(NvmlError::FailedToLoadSymbol(_))
        ));
    }

    // Device 0, numbers worked out by hand: processes known to use 1 GiB + 3 GiB (compute) and
    // 256 MiB (graphics); one compute process reports "not available".
    let dev0 = nvml.device_by_index(0).unwrap();
    let mem = dev0.memory_info().unwrap();
    assert_eq!(mem.total, 80 * GIB);
    assert_eq!(mem.reserved, 512 * MIB);
    assert_eq!(mem.used, 4 * GIB + 256 * MIB);
    assert_eq!(mem.free, 80 * GIB - 512 * MIB - 4 * GIB - 256 * MIB);
    assert_eq!(
        procs(dev0.running_compute_processes().unwrap()),
        vec![
            (4_000_001, UsedGpuMemory::Used(GIB)),
            (4_000_002, UsedGpuMemory::Unavailable),
            (4_000_003, UsedGpuMemory::Used(3 * GIB)),
        ]
    );
    assert_eq!(dev0.running_compute_processes_count().unwrap(), 3);
    assert_eq!(
        procs(dev0.running_graphics_processes().unwrap()),
        vec![(4_000_004, UsedGpuMemory::Used(256 * MIB))]
    );

    // Device 1: 20 GiB used out of 24 GiB - 300 MiB.
    let mem1 = nvml.device_by_index(1).unwrap().memory_info().unwrap();
    assert_eq!(
        (mem1.total, mem1.reserved, mem1.used),
        (24 * GIB, 300 * MIB, 20 * GIB)
    );
    assert_eq!(mem1.free, 4 * GIB - 300 * MIB);

    // Device 2: nothing running -> empty lists (SUCCESS with count 0 on the size query).
    let dev2 = nvml.device_by_index(2).unwrap();
    assert!(dev2.running_compute_processes().unwrap().is_empty());
    assert!(dev2.running_graphics_processes().unwrap().is_empty());
    let mem2 = dev2.memory_info().unwrap();
    assert_eq!(
        (mem2.total, mem2.reserved, mem2.used, mem2.free),
        (1000, 0, 0, 1000)
    );

    assert!(matches!(
        nvml.device_by_index(3),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        nvml.device_by_uuid("GPU-nope"),
        Err(NvmlError::NotFound)
    ));
}

#[test]
fn process_usage_is_capped_at_available_memory() {
    let (_g, env) = lock();
    let mut d = Device::new("GPU-cap", "cap", 1000);
    d.memory_reserved = 100;
    d.compute_processes = vec![Process::new(10, Some(700)), Process::new(11, Some(700))];
    write_scenario(
        &env.state,
        &Scenario {
            devices: vec![d],
            ..Scenario::default()
        },
    );
    let nvml = open().unwrap();
    let mem = nvml.device_by_index(0).unwrap().memory_info().unwrap();
    assert_eq!(
        (mem.total, mem.reserved, mem.used, mem.free),
        (1000, 100, 900, 0)
    );
}

/// `nvmlDeviceGetMPSComputeRunningProcesses_v3` lists the compute processes an MPS server serves
/// (`mps_clients`), and nothing where there are none.
#[test]
fn mps_clients_are_the_compute_processes_named() {
    let (_g, env) = lock();
    let mut d = Device::new("GPU-mps", "mps", 10 * GIB);
    d.compute_processes = vec![
        Process::new(10, Some(GIB)),
        Process::new(11, Some(GIB)),
        Process::new(12, Some(GIB)),
    ];
    d.mps_clients = vec![11, 12, 99];
    write_scenario(
        &env.state,
        &Scenario {
            devices: vec![d, Device::new("GPU-none", "none", GIB)],
            ..Scenario::default()
        },
    );
    let nvml = open().unwrap();
    let mps = nvml
        .device_by_index(0)
        .unwrap()
        .mps_running_compute_processes()
        .unwrap();
    let pids: Vec<u32> = procs(mps).into_iter().map(|(pid, _)| pid).collect();
    assert_eq!(
        pids,
        vec![11, 12],
        "a pid listed that runs no compute process is not a client"
    );
    let none = nvml
        .device_by_index(1)
        .unwrap()
        .mps_running_compute_processes();
    assert_eq!(none.unwrap().len(), 0);
}

#[test]
fn scenario_changes_are_picked_up_after_atomic_rename() {
    let (_g, env) = lock();
    let mut s = rich_scenario();
    write_scenario(&env.state, &s);
    let nvml = open().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 3);
    let dev1_handle = nvml.device_by_index(1).unwrap();
    let dev0 = nvml.device_by_index(0).unwrap();

    s.devices[0].name = "renamed".into();
    s.devices[0].compute_processes = vec![Process::new(99, Some(5 * GIB))];
    s.devices[0].graphics_processes.clear();
    s.devices.truncate(2);
    write_scenario(&env.state, &s);
    assert_eq!(nvml.device_count().unwrap(), 2);
    assert_eq!(dev0.name().unwrap(), "renamed");
    assert_eq!(
        procs(dev0.running_compute_processes().unwrap()),
        vec![(99, UsedGpuMemory::Used(5 * GIB))]
    );
    assert_eq!(dev0.memory_info().unwrap().used, 5 * GIB);

    // A broken file keeps the last good scenario in force.
    write_atomic(&env.state, "{\"devices\": [ {\"uuid\": 1 ");
    assert_eq!(nvml.device_count().unwrap(), 2);
    assert_eq!(dev0.name().unwrap(), "renamed");
    write_atomic(
        &env.state,
        r#"{"devices":[{"uuid":"GPU-a","name":"a","memory_total":1,"typo":1}]}"#,
    );
    assert_eq!(nvml.device_count().unwrap(), 2);
    std::fs::remove_file(&env.state).unwrap();
    assert_eq!(nvml.device_count().unwrap(), 2);

    // The next good version is picked up; a handle past the new end becomes invalid.
    write_atomic(
        &env.state,
        r#"{"devices":[{"uuid":"GPU-only","name":"only","memory_total":1000}]}"#,
    );
    assert_eq!(nvml.device_count().unwrap(), 1);
    assert_eq!(dev0.uuid().unwrap(), "GPU-only");
    assert!(matches!(dev1_handle.uuid(), Err(NvmlError::InvalidArg)));
}

#[test]
fn forced_error_codes() {
    let (_g, env) = lock();
    let mut s = rich_scenario();
    s.fail = serde_json::from_str(
        r#"{"nvmlDeviceGetComputeRunningProcesses_v3": 999,
            "nvmlDeviceGetMemoryInfo_v2": 15,
            "nvmlDeviceGetName": 3,
            "nvmlSystemGetCudaDriverVersion_v2": 12}"#,
    )
    .unwrap();
    write_scenario(&env.state, &s);
    let nvml = open().unwrap();
    let dev = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        dev.running_compute_processes(),
        Err(NvmlError::Unknown)
    ));
    assert!(matches!(dev.memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(dev.name(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        nvml.sys_cuda_driver_version(),
        Err(NvmlError::LibraryNotFound)
    ));
    // Functions not named keep working.
    assert_eq!(dev.uuid().unwrap(), s.devices[0].uuid);
    assert_eq!(dev.running_graphics_processes().unwrap().len(), 1);
    drop(nvml);

    s.fail = serde_json::from_str(r#"{"nvmlInit_v2": 18}"#).unwrap();
    write_scenario(&env.state, &s);
    assert!(matches!(open(), Err(NvmlError::LibRmVersionMismatch)));
}

#[test]
fn lost_device() {
    let (_g, env) = lock();
    let mut s = rich_scenario();
    s.devices[1].lost = true;
    write_scenario(&env.state, &s);
    let nvml = open().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 3, "a lost GPU still counts");
    assert!(matches!(nvml.device_by_index(1), Err(NvmlError::GpuLost)));
    assert!(matches!(
        nvml.device_by_uuid(s.devices[1].uuid.as_str()),
        Err(NvmlError::GpuLost)
    ));
    let dev0 = nvml.device_by_index(0).unwrap();
    assert_eq!(dev0.running_compute_processes().unwrap().len(), 3);

    // Falling off the bus while a handle is held.
    s.devices[0].lost = true;
    write_scenario(&env.state, &s);
    assert!(matches!(dev0.memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        dev0.running_compute_processes(),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(
        dev0.running_graphics_processes(),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(dev0.uuid(), Err(NvmlError::GpuLost)));
    assert!(matches!(dev0.utilization_rates(), Err(NvmlError::GpuLost)));
    assert_eq!(nvml.device_by_index(2).unwrap().name().unwrap(), "x");
}

#[test]
fn driver_not_loaded() {
    let (_g, env) = lock();
    let mut s = rich_scenario();
    s.driver_loaded = false;
    write_scenario(&env.state, &s);
    assert!(matches!(open(), Err(NvmlError::DriverNotLoaded)));

    std::fs::remove_file(&env.state).unwrap();
    assert!(
        matches!(open(), Err(NvmlError::DriverNotLoaded)),
        "missing file"
    );

    write_atomic(&env.state, "{\"devices\": []");
    assert!(
        matches!(open(), Err(NvmlError::DriverNotLoaded)),
        "invalid file"
    );

    // The driver going away under a running client.
    s.driver_loaded = true;
    write_scenario(&env.state, &s);
    let nvml = open().unwrap();
    let dev = nvml.device_by_index(0).unwrap();
    s.driver_loaded = false;
    write_scenario(&env.state, &s);
    assert!(matches!(
        nvml.device_count(),
        Err(NvmlError::DriverNotLoaded)
    ));
    assert!(matches!(dev.memory_info(), Err(NvmlError::DriverNotLoaded)));
}

#[test]
fn process_list_growth_makes_the_second_call_too_small_once() {
    let (_g, env) = lock();
    let mut s = rich_scenario();
    // nvml-wrapper sizes its buffer count + 5: growing by 10 overflows it.
    s.devices[0].process_list_growth = 10;
    write_scenario(&env.state, &s);
    let nvml = open().unwrap();
    let dev = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        dev.running_compute_processes(),
        Err(NvmlError::InsufficientSize(_))
    ));
    assert_eq!(
        dev.running_compute_processes().unwrap().len(),
        3,
        "a retry succeeds"
    );
    assert_eq!(
        dev.running_compute_processes().unwrap().len(),
        3,
        "only once"
    );
    // Each list has its own growth.
    assert!(matches!(
        dev.running_graphics_processes(),
        Err(NvmlError::InsufficientSize(_))
    ));
    assert_eq!(dev.running_graphics_processes().unwrap().len(), 1);
    // Devices without growth are unaffected.
    assert_eq!(
        nvml.device_by_index(1)
            .unwrap()
            .running_compute_processes()
            .unwrap()
            .len(),
        1
    );

    // Growth within the caller's headroom: the second call sees the extra (synthesized) records.
    s.devices[0].process_list_growth = 2;
    write_scenario(&env.state, &s);
    let grown = procs(dev.running_compute_processes().unwrap());
    assert_eq!(grown.len(), 5);
    assert_eq!(
        &grown[3..],
        &[
            (0x7fff_ff00, UsedGpuMemory::Used(0)),
            (0x7fff_ff01, UsedGpuMemory::Used(0))
        ]
    );
    assert_eq!(dev.running_compute_processes().unwrap().len(), 3);
    // Synthesized records do not count as used memory.
    assert_eq!(dev.memory_info().unwrap().used, 4 * GIB + 256 * MIB);

    // A new session re-arms the growth.
    drop(nvml);
    let nvml = open().unwrap();
    let dev = nvml.device_by_index(0).unwrap();
    assert_eq!(dev.running_compute_processes().unwrap().len(), 5);
}

#[test]
fn process_memory_dir_adds_compute_processes() {
    let (_g, env) = lock();
    let dir = env.dir.join("procmem");
    std::fs::create_dir_all(&dir).unwrap();
    let mut s = rich_scenario();
    s.process_memory_dir = Some(dir.clone());
    write_scenario(&env.state, &s);
    let nvml = open().unwrap();
    let dev0 = nvml.device_by_index(0).unwrap();
    let dev1 = nvml.device_by_index(1).unwrap();
    assert_eq!(dev0.running_compute_processes().unwrap().len(), 3);

    std::fs::write(dir.join("4000001.0"), "5000\n").unwrap(); // overrides a listed pid
    std::fs::write(dir.join("777.0"), "123").unwrap();
    std::fs::write(dir.join("778.1"), " 99 ").unwrap();
    std::fs::write(dir.join("779.0.tmp"), "1").unwrap(); // ignored: not <pid>.<index>
    std::fs::write(dir.join("780.0"), "lots").unwrap(); // ignored: not a number
    std::fs::write(dir.join("781.7"), "1").unwrap(); // ignored: no device 7
    assert_eq!(
        procs(dev0.running_compute_processes().unwrap()),
        vec![
            (4_000_001, UsedGpuMemory::Used(5000)),
            (4_000_002, UsedGpuMemory::Unavailable),
            (4_000_003, UsedGpuMemory::Used(3 * GIB)),
            (777, UsedGpuMemory::Used(123)),
        ]
    );
    assert_eq!(
        dev0.memory_info().unwrap().used,
        5000 + 3 * GIB + 123 + 256 * MIB
    );
    assert_eq!(
        procs(dev1.running_compute_processes().unwrap()),
        vec![
            (4_000_010, UsedGpuMemory::Used(20 * GIB)),
            (778, UsedGpuMemory::Used(99))
        ]
    );
    assert_eq!(dev1.memory_info().unwrap().used, 20 * GIB + 99);

    // Changes in the directory are seen without touching the scenario.
    std::fs::remove_file(dir.join("777.0")).unwrap();
    std::fs::write(dir.join("778.1"), "100").unwrap();
    assert_eq!(dev0.running_compute_processes().unwrap().len(), 3);
    assert_eq!(dev1.memory_info().unwrap().used, 20 * GIB + 100);
}

/// A pid the mock libcuda marks CHECKPOINTED in cuda-state.json (beside the scenario) is gone
/// from both process lists, on every device, and its memory is free, until it is back to
/// another state; a bad state file keeps the last good one.
#[test]
fn checkpointed_processes_disappear_until_restored() {
    use gpushare_fake_driver::checkpoint::{self, CheckpointState};
    use gpushare_fake_driver::cuda::ProcessState;
    let (_g, env) = lock();
    let mut d = Device::new("GPU-c", "x", 10 * GIB);
    d.compute_processes = vec![
        Process::new(7001, Some(3 * GIB)),
        Process::new(7002, Some(GIB)),
    ];
    d.graphics_processes = vec![Process::new(7001, Some(GIB))];
    let mut d2 = Device::new("GPU-d", "y", 10 * GIB);
    d2.compute_processes = vec![Process::new(7001, Some(2 * GIB))];
    write_scenario(
        &env.state,
        &Scenario {
            devices: vec![d, d2],
            ..Scenario::default()
        },
    );
    let states = checkpoint::path_for(&env.state);
    let set = |pid, state| {
        let mut s = CheckpointState::default();
        s.set(pid, state);
        gpushare_fake_driver::statefile::write_atomic(&states, &s).unwrap();
    };
    let nvml = open().expect("init");
    let look = |i| {
        let dev = nvml.device_by_index(i).unwrap();
        let mut c: Vec<u32> = dev
            .running_compute_processes()
            .unwrap()
            .iter()
            .map(|p| p.pid)
            .collect();
        c.sort();
        let g: Vec<u32> = dev
            .running_graphics_processes()
            .unwrap()
            .iter()
            .map(|p| p.pid)
            .collect();
        (c, g, dev.memory_info().unwrap().used)
    };
    assert_eq!(look(0), (vec![7001, 7002], vec![7001], 4 * GIB));
    set(7001, ProcessState::Locked);
    assert_eq!(
        look(0),
        (vec![7001, 7002], vec![7001], 4 * GIB),
        "locked: still there"
    );
    set(7001, ProcessState::Checkpointed);
    assert_eq!(look(0), (vec![7002], vec![], GIB));
    assert_eq!(look(1), (vec![], vec![], 0));
    std::fs::write(&states, "{ broken").unwrap();
    assert_eq!(look(0), (vec![7002], vec![], GIB), "last good states kept");
    set(7001, ProcessState::Locked);
    assert_eq!(look(0), (vec![7001, 7002], vec![7001], 4 * GIB));
    assert_eq!(look(1).2, 2 * GIB);
    std::fs::remove_file(&states).unwrap();
}

/// Per-process utilization as nvml.h describes it: only samples newer than the caller's
/// `lastSeenTimeStamp`; none newer is NOT_FOUND (nothing ran since); a GPU without support
/// (`utilization_supported: false`, as on MIG) answers NOT_SUPPORTED to the per-GPU rates too.
/// The SM clock comes from the scenario.
#[test]
fn process_utilization_returns_samples_newer_than_last_seen() {
    use gpushare_fake_nvml::scenario::ProcessUtilization;
    use nvml_wrapper::enum_wrappers::device::Clock;
    let (_g, env) = lock();
    let mut s = rich_scenario();
    let sample = |pid, timestamp, sm_util, mem_util| ProcessUtilization {
        pid,
        timestamp,
        sm_util,
        mem_util,
        enc_util: 0,
        dec_util: 3,
    };
    s.devices[0].process_utilization = vec![
        sample(4_000_001, 1_000, 40, 10),
        sample(4_000_003, 2_000, 55, 20),
    ];
    s.devices[0].sm_clock = 1755;
    s.devices[1].utilization_supported = false;
    write_scenario(&env.state, &s);
    let nvml = open().expect("init");
    let dev0 = nvml.device_by_index(0).unwrap();
    type Row = (u32, u64, u32, u32, u32);
    let got = |since: Option<u64>| -> Result<Vec<Row>, NvmlError> {
        Ok(dev0
            .process_utilization_stats(since)?
            .into_iter()
            .map(|u| (u.pid, u.timestamp, u.sm_util, u.mem_util, u.dec_util))
            .collect())
    };
    assert_eq!(
        got(None).unwrap(),
        vec![(4_000_001, 1_000, 40, 10, 3), (4_000_003, 2_000, 55, 20, 3)]
    );
    assert_eq!(
        got(Some(1_000)).unwrap(),
        vec![(4_000_003, 2_000, 55, 20, 3)]
    );
    assert!(matches!(got(Some(2_000)), Err(NvmlError::NotFound)));
    assert_eq!(dev0.clock_info(Clock::SM).unwrap(), 1755);
    assert_eq!(dev0.clock_info(Clock::Graphics).unwrap(), 1755);
    assert!(matches!(
        dev0.clock_info(Clock::Memory),
        Err(NvmlError::NotSupported)
    ));

    let dev1 = nvml.device_by_index(1).unwrap();
    assert!(matches!(
        dev1.process_utilization_stats(None),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        dev1.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    // A GPU with support but no samples at all: NOT_FOUND, idle.
    let dev2 = nvml.device_by_index(2).unwrap();
    assert!(matches!(
        dev2.process_utilization_stats(None),
        Err(NvmlError::NotFound)
    ));
}
