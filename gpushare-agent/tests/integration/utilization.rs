//! Utilization per GPU, process and workload, from the mock NVML's samples through the running
//! agent: a sample is charged only to the process that held its pid for the whole window, a GPU
//! without support shows no series (never 0), and NVML's NOT_FOUND (nothing ran) is idle.

use std::time::Duration;

use gpushare_testkit::nvml::Scenario;
use serde_json::json;

use crate::util::{
    AgentProcess, agent_dir, cgroup_quota, key, needs_root, sleeper, sleeping_group,
    spawn_with_pid, wait_clock_tick_after_start, workload,
};

const GIB: u64 = 1 << 30;
const WAIT: Duration = Duration::from_secs(20);

/// NVML's clock for per-process samples: wall-clock microseconds.
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// One GPU with `pid` using 1 GiB and the per-process samples `samples` as (pid, µs, sm %).
fn gpu_with(pid: u32, samples: &[(u32, u64, u32)]) -> serde_json::Value {
    let samples: Vec<_> = samples
        .iter()
        .map(|(p, ts, sm)| json!({ "pid": p, "timestamp": ts, "sm_util": sm, "mem_util": sm / 2 }))
        .collect();
    json!({ "devices": [{
        "uuid": "GPU-util", "name": "NVIDIA Fake", "memory_total": 80 * GIB,
        "utilization_gpu": 90, "utilization_memory": 40,
        "compute_processes": [{ "pid": pid, "used_memory": GIB }],
        "process_utilization": samples,
    }] })
}

fn util_of(s: &gpushare_agent::snapshot::Snapshot, key: &str) -> Option<f64> {
    workload(s, key, "GPU-util").and_then(|w| w.utilization)
}

/// A GPU process of workload A exits and a process of B takes its pid inside one utilization
/// window. The window's sample (70% SM) may be A's or B's: it is charged to neither, never to A;
/// from the next window on, which B held whole, it is B's.
#[test]
fn utilization_of_a_pid_reused_inside_a_sample_window_is_charged_to_the_right_workload() {
    needs_root!("utilization_of_a_reused_pid");
    let (a, pa) = sleeping_group("util-a");
    let (b, _other) = sleeping_group("util-b");
    let pid = pa.pid();
    let sc = Scenario::create(&gpu_with(pid, &[])).unwrap();
    let quotas = format!("{}{}", cgroup_quota(&a, "8GiB"), cgroup_quota(&b, "8GiB"));
    let agent = AgentProcess::start_in(agent_dir(&quotas), &sc, &["--no-ebpf"], "1s");
    // A holds the pid for a whole window: its 30% is A's.
    agent.wait_next_step();
    sc.write(&gpu_with(pid, &[(pid, now_us(), 30)])).unwrap();
    let s = agent.wait_for(WAIT, |s| util_of(s, &key(&a)) == Some(0.3));
    let gpu = s.gpus.iter().find(|g| g.uuid == "GPU-util").unwrap();
    assert_eq!(
        (gpu.utilization, gpu.memory_utilization),
        (Some(0.9), Some(0.4))
    );
    let p = s.processes.iter().find(|p| p.pid == pid).unwrap();
    assert_eq!(
        (p.utilization, p.memory_utilization),
        (Some(0.3), Some(0.15))
    );

    // A exits, B's next process gets the pid, and the driver's next sample (70%) is taken after
    // that: inside the window that began with A's sample.
    agent.wait_next_step();
    drop(pa);
    let pb = spawn_with_pid(pid, || b.spawn(&mut sleeper()).unwrap());
    wait_clock_tick_after_start(pid);
    sc.write(&gpu_with(pid, &[(pid, now_us(), 70)])).unwrap();
    let never_a = |s: &gpushare_agent::snapshot::Snapshot| {
        assert!(
            util_of(s, &key(&a)).is_none_or(|u| u != 0.7),
            "A was charged B's utilization: {:?}\n{}",
            workload(s, &key(&a), "GPU-util"),
            agent.log()
        );
    };
    // Two steps: the second began after the write, so it has read the sample. B started inside
    // its window: the sample is not shown as B's either (after it, nothing ran: B is idle).
    for _ in 0..2 {
        let s = agent.wait_next_step();
        never_a(&s);
        assert_ne!(util_of(&s, &key(&b)), Some(0.7), "{}", agent.log());
    }
    agent.wait_for(WAIT, |s| {
        never_a(s);
        s.processes
            .iter()
            .any(|p| p.pid == pid && p.workload == key(&b))
    });
    // The next window began after B started: its sample is B's.
    sc.write(&gpu_with(pid, &[(pid, now_us(), 70)])).unwrap();
    let s = agent.wait_for(WAIT, |s| {
        never_a(s);
        util_of(s, &key(&b)) == Some(0.7)
    });
    assert!(
        !agent
            .log()
            .contains("through nvmlDeviceGetProcessUtilization"),
        "read through the versioned call\n{}",
        agent.log()
    );
    let status = gpushare_agent::status::render_status(&s);
    let row = status
        .lines()
        .find(|l| l.starts_with(&key(&b)[..key(&b).len().min(27)]) && l.contains("70%"));
    assert!(row.is_some(), "status shows B's 70% SM:\n{status}");
    drop(pb);
}

/// A GPU that does not report utilization (NOT_SUPPORTED, as with MIG) has no utilization series
/// at all, in gpushare's names or any compat set, and is named once in the log; on the GPU that
/// does, a process with no sample since the last read (NVML's NOT_FOUND) is idle: 0.
#[test]
fn a_gpu_without_utilization_support_shows_no_series_not_zeros() {
    needs_root!("a_gpu_without_utilization_support");
    let (a, pa) = sleeping_group("util-ok");
    let (m, pm) = sleeping_group("util-mig");
    let dev = |uuid: &str, pid: u32, supported: bool| {
        json!({ "uuid": uuid, "name": "NVIDIA Fake", "memory_total": 80 * GIB,
                "utilization_gpu": 25, "utilization_memory": 5,
                "utilization_supported": supported,
                "compute_processes": [{ "pid": pid, "used_memory": GIB }] })
    };
    let sc = Scenario::create(&json!({ "devices": [
        dev("GPU-ok", pa.pid(), true), dev("GPU-mig", pm.pid(), false)
    ] }))
    .unwrap();
    let quotas = format!("{}{}", cgroup_quota(&a, "8GiB"), cgroup_quota(&m, "8GiB"));
    let agent = AgentProcess::start_in(
        agent_dir(&quotas),
        &sc,
        &[
            "--no-ebpf",
            "--process-metrics",
            "--compat",
            "hami,volcano,dcgm",
        ],
        "200ms",
    );
    let s = agent.wait_for(WAIT, |s| {
        workload(s, &key(&a), "GPU-ok").is_some_and(|w| w.utilization == Some(0.0))
            && workload(s, &key(&m), "GPU-mig").is_some()
    });
    agent.wait_steps(3);
    let mig = s.gpus.iter().find(|g| g.uuid == "GPU-mig").unwrap();
    assert_eq!((mig.utilization, mig.memory_utilization), (None, None));
    assert!(!mig.process_utilization);
    assert_eq!(
        workload(&s, &key(&m), "GPU-mig").unwrap().utilization,
        None,
        "unknown, not 0"
    );
    let ok = s.gpus.iter().find(|g| g.uuid == "GPU-ok").unwrap();
    assert_eq!(ok.utilization, Some(0.25));

    let (_, text) = agent.get("/metrics");
    let utilization_series = [
        "gpushare_gpu_utilization_ratio",
        "gpushare_gpu_memory_utilization_ratio",
        "gpushare_workload_gpu_utilization_ratio",
        "gpushare_workload_gpu_memory_utilization_ratio",
        "gpushare_process_gpu_utilization_ratio",
        "hami_host_gpu_utilization_ratio",
        "hami_host_gpu_memory_controller_utilization_ratio",
        "hami_container_device_utilization_ratio",
        "HostCoreUtilization",
        "Device_utilization_desc_of_container",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
    ];
    for name in utilization_series {
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect();
        assert!(
            !series.is_empty(),
            "{name}: the supported GPU has a series\n{text}"
        );
        assert!(
            series.iter().all(|l| !l.contains("GPU-mig")),
            "{name}: the unsupported GPU has a series: {series:#?}"
        );
    }
    // The supported GPU's idle process is 0, in HAMi's 0-100 too.
    assert!(
        text.lines().any(
            |l| l.starts_with("hami_container_device_utilization_ratio{")
                && l.contains("GPU-ok")
                && l.ends_with(" 0.0")
        ),
        "{text}"
    );
    let status = gpushare_agent::status::render_status(&s);
    let mig_line = status.lines().find(|l| l.contains("GPU-mig")).unwrap();
    assert!(
        mig_line.contains(" - "),
        "status shows '-' for its GPU-UTIL: {mig_line}"
    );
    let named = agent
        .log()
        .matches("GPU-mig) does not report utilization")
        .count();
    assert_eq!(named, 1, "named once in the log:\n{}", agent.log());
}

/// Where the library lacks the versioned call (`nvmlDeviceGetProcessesUtilizationInfo`, drivers
/// before r550; here: the mock answering FUNCTION_NOT_FOUND), samples come through
/// `nvmlDeviceGetProcessUtilization`, and the switch is named once.
#[test]
fn utilization_is_read_through_the_older_call_where_the_versioned_one_is_missing() {
    needs_root!("utilization_through_the_older_call");
    let (a, pa) = sleeping_group("util-old");
    let pid = pa.pid();
    let with_fail = |v: serde_json::Value| {
        let mut v = v;
        v["fail"] = json!({ "nvmlDeviceGetProcessesUtilizationInfo": 13 });
        v
    };
    let sc = Scenario::create(&with_fail(gpu_with(pid, &[]))).unwrap();
    let agent = AgentProcess::start_in(
        agent_dir(&cgroup_quota(&a, "8GiB")),
        &sc,
        &["--no-ebpf"],
        "200ms",
    );
    agent.wait_next_step();
    sc.write(&with_fail(gpu_with(pid, &[(pid, now_us(), 45)])))
        .unwrap();
    agent.wait_for(WAIT, |s| util_of(s, &key(&a)) == Some(0.45));
    let log = agent.log();
    assert_eq!(
        log.matches("through nvmlDeviceGetProcessUtilization")
            .count(),
        1,
        "{log}"
    );
}
