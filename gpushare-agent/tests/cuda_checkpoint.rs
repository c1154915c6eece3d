//! The agent's CUDA checkpoint loader (`gpushare_agent::cuda`) against the mock libcuda, which
//! shares the mock NVML's scenario: every state transition and refusal of the checkpoint API,
//! the lock of a frozen process timing out, each injected driver failure, an old driver, and the
//! agent's own NVML sampler seeing a checkpointed process gone (and its memory free) until it is
//! restored.
//!
//! The scenario path (GPUSHARE_FAKE_NVML_STATE) is process-global: this binary sets it once and
//! runs its tests one at a time.

use std::{
    process::{Child, Command},
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError},
    time::{Duration, Instant},
};

use gpushare_agent::cuda::{Checkpointer, ErrorKind, ProcessState};
use gpushare_agent::nvml::NvmlSampler;
use gpushare_testkit::nvml::{SCENARIO_ENV, Scenario, fake_cuda_lib, fake_nvml_lib};
use gpushare_testkit::{TestCgroup, require_root};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;

/// The binary's scenario, created (and the env var set) on first use, and the test lock.
fn setup() -> (MutexGuard<'static, ()>, &'static Scenario) {
    static LOCK: Mutex<()> = Mutex::new(());
    static SCENARIO: OnceLock<Scenario> = OnceLock::new();
    let guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let s = SCENARIO.get_or_init(|| {
        let s = Scenario::create(&json!({ "devices": [] })).unwrap();
        // SAFETY: set once, under LOCK, before any library reads it.
        unsafe { std::env::set_var(SCENARIO_ENV, s.path()) };
        // A static is never dropped: remove the scenario's directory when the binary exits.
        extern "C" fn remove_scenario_dir() {
            if let Some(s) = SCENARIO.get() {
                let _ = std::fs::remove_dir_all(s.dir());
            }
        }
        // SAFETY: registering a plain function without captures.
        unsafe { libc::atexit(remove_scenario_dir) };
        s
    });
    let _ = std::fs::remove_file(s.cuda_state_path());
    (guard, s)
}

/// A 10 GiB GPU whose compute processes are `procs` (pid, bytes), with a CUDA 12.8 driver and
/// the given `cuda` section.
fn scenario(procs: &[(u32, u64)], cuda: Value) -> Value {
    let list: Vec<Value> = procs
        .iter()
        .map(|(pid, used)| json!({ "pid": pid, "used_memory": used }))
        .collect();
    json!({
        "cuda_driver_version": 12080,
        "devices": [{ "uuid": "GPU-a", "name": "NVIDIA Fake H100", "memory_total": 10 * GIB,
                      "compute_processes": list }],
        "cuda": cuda,
    })
}

fn open() -> Checkpointer {
    Checkpointer::open(Some(&fake_cuda_lib())).expect("the mock libcuda loads")
}

/// A real process (the NVML sampler distrusts pids without a /proc entry), killed on drop.
struct Sleeper(Child);

impl Sleeper {
    fn spawn() -> Self {
        Self(Command::new("sleep").arg("600").spawn().unwrap())
    }
    fn in_cgroup(cg: &TestCgroup) -> Self {
        Self(cg.spawn(Command::new("sleep").arg("600")).unwrap())
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to 5 s for the task state letter of /proc/<pid>/stat to be `want`.
fn wait_task_state(pid: u32, want: char) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if state == Some(want) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn kind(r: Result<(), gpushare_agent::cuda::CudaError>) -> ErrorKind {
    r.expect_err("the call should fail").kind()
}

#[test]
fn every_transition_and_every_refusal() {
    let (_g, s) = setup();
    s.write(&scenario(&[(4001, GIB)], json!({}))).unwrap();
    let cuda = open();
    assert_eq!(cuda.driver_version(), 12080);
    let pid = 4001;
    assert_eq!(cuda.state(pid), Ok(ProcessState::Running));

    // Refusals from RUNNING: checkpoint before lock, restore and unlock of a running process.
    for (what, r) in [
        ("checkpoint", cuda.checkpoint(pid)),
        ("restore", cuda.restore(pid)),
        ("unlock", cuda.unlock(pid)),
    ] {
        let e = r.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::IllegalState, "{what}: {e}");
        assert_eq!(e.code, 401, "{what}");
        assert_eq!(e.name, "CUDA_ERROR_ILLEGAL_STATE");
        assert_eq!(
            e.message,
            "the operation cannot be performed in the present state"
        );
    }
    assert_eq!(cuda.state(pid), Ok(ProcessState::Running));

    // RUNNING -> LOCKED -> RUNNING.
    cuda.lock(pid, 1000).unwrap();
    assert_eq!(cuda.state(pid), Ok(ProcessState::Locked));
    assert_eq!(
        kind(cuda.lock(pid, 1000)),
        ErrorKind::IllegalState,
        "lock twice"
    );
    assert_eq!(
        kind(cuda.restore(pid)),
        ErrorKind::IllegalState,
        "restore a locked one"
    );
    cuda.unlock(pid).unwrap();
    assert_eq!(cuda.state(pid), Ok(ProcessState::Running));

    // RUNNING -> LOCKED -> CHECKPOINTED -> LOCKED -> RUNNING.
    cuda.lock(pid, 0).unwrap();
    cuda.checkpoint(pid).unwrap();
    assert_eq!(cuda.state(pid), Ok(ProcessState::Checkpointed));
    assert_eq!(
        kind(cuda.unlock(pid)),
        ErrorKind::IllegalState,
        "unlock a checkpointed one"
    );
    assert_eq!(
        kind(cuda.checkpoint(pid)),
        ErrorKind::IllegalState,
        "checkpoint twice"
    );
    assert_eq!(
        kind(cuda.lock(pid, 100)),
        ErrorKind::IllegalState,
        "lock a checkpointed one"
    );
    assert_eq!(cuda.state(pid), Ok(ProcessState::Checkpointed));
    cuda.restore(pid).unwrap();
    assert_eq!(cuda.state(pid), Ok(ProcessState::Locked));
    cuda.unlock(pid).unwrap();
    assert_eq!(cuda.state(pid), Ok(ProcessState::Running));

    // The states are in the file beside the scenario, for every process to see.
    cuda.lock(pid, 0).unwrap();
    let text = std::fs::read_to_string(s.cuda_state_path()).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v, json!({ "processes": { "4001": "locked" } }));
    cuda.unlock(pid).unwrap();
}

#[test]
fn pids_the_driver_does_not_know_are_not_cuda_processes() {
    let (_g, s) = setup();
    s.write(&scenario(&[(4001, GIB)], json!({}))).unwrap();
    let cuda = open();
    for pid in [4002, u32::MAX] {
        let e = cuda.state(pid).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotACudaProcess, "{e}");
        assert_eq!(e.code, 1);
        for r in [
            cuda.lock(pid, 10),
            cuda.checkpoint(pid),
            cuda.restore(pid),
            cuda.unlock(pid),
        ] {
            assert_eq!(kind(r), ErrorKind::NotACudaProcess);
        }
    }
    let e = cuda.state(4002).unwrap_err();
    assert_eq!(
        e.to_string(),
        "CUDA_ERROR_INVALID_VALUE (1): invalid argument"
    );
}

#[test]
fn nvml_sees_the_checkpointed_process_gone_and_its_memory_free_until_restore() {
    let (_g, s) = setup();
    let (a, b) = (Sleeper::spawn(), Sleeper::spawn());
    s.write(&scenario(
        &[(a.pid(), 3 * GIB), (b.pid(), 2 * GIB)],
        json!({}),
    ))
    .unwrap();
    let mut nvml = NvmlSampler::open(Some(&fake_nvml_lib()));
    let pids = |smp: &gpushare_agent::sample::GpuSample| {
        let mut v: Vec<(u32, Option<u64>)> = smp
            .processes
            .iter()
            .map(|p| (p.pid, p.used_bytes))
            .collect();
        v.sort();
        v
    };
    let before = nvml.sample();
    assert_eq!(before.devices[0].memory_used, 5 * GIB);
    assert_eq!(before.devices[0].memory_free, 5 * GIB);
    let mut both = vec![(a.pid(), Some(3 * GIB)), (b.pid(), Some(2 * GIB))];
    both.sort();
    assert_eq!(pids(&before), both);

    let cuda = open();
    cuda.lock(a.pid(), 1000).unwrap();
    assert_eq!(
        nvml.sample().devices[0].memory_used,
        5 * GIB,
        "a lock frees nothing"
    );
    cuda.checkpoint(a.pid()).unwrap();
    let during = nvml.sample();
    assert_eq!(pids(&during), [(b.pid(), Some(2 * GIB))]);
    assert_eq!(during.devices[0].memory_used, 2 * GIB);
    assert_eq!(during.devices[0].memory_free, 8 * GIB);

    cuda.restore(a.pid()).unwrap();
    let after = nvml.sample();
    assert_eq!(pids(&after), both);
    assert_eq!(after.devices[0].memory_used, 5 * GIB);
    cuda.unlock(a.pid()).unwrap();
}

#[test]
fn a_restore_without_room_can_leave_the_process_failed_for_good_as_driver_580_does() {
    let (_g, s) = setup();
    let breaks = json!({ "out_of_memory_state": "failed" });
    s.write(&scenario(&[(4011, 6 * GIB)], breaks.clone()))
        .unwrap();
    let cuda = open();
    cuda.lock(4011, 0).unwrap();
    cuda.checkpoint(4011).unwrap();
    s.write(&scenario(
        &[(4011, 6 * GIB), (4012, 6 * GIB)],
        breaks.clone(),
    ))
    .unwrap();
    assert_eq!(
        cuda.restore(4011).unwrap_err().kind(),
        ErrorKind::OutOfMemory
    );
    assert_eq!(cuda.state(4011), Ok(ProcessState::Failed));
    s.write(&scenario(&[(4011, 6 * GIB)], breaks)).unwrap();
    assert!(cuda.restore(4011).is_err(), "unrestorable, room or not");
}

#[test]
fn a_live_process_keeps_its_checkpoint_when_the_scenario_stops_listing_it() {
    let (_g, s) = setup();
    let p = Sleeper::spawn();
    let gone = 4_194_000; // a pid without a /proc entry (above the usual pid_max)
    s.write(&scenario(&[(p.pid(), GIB), (gone, GIB)], json!({})))
        .unwrap();
    let cuda = open();
    for pid in [p.pid(), gone] {
        cuda.lock(pid, 0).unwrap();
        cuda.checkpoint(pid).unwrap();
    }
    // The scenario lists neither any more, and another write of the state happens.
    s.write(&scenario(&[(4013, GIB)], json!({}))).unwrap();
    cuda.lock(4013, 0).unwrap();
    assert_eq!(
        cuda.state(p.pid()),
        Ok(ProcessState::Checkpointed),
        "kept while it lives"
    );
    assert_eq!(
        kind(cuda.state(gone).map(|_| ())),
        ErrorKind::NotACudaProcess
    );
    cuda.restore(p.pid()).unwrap();
    cuda.unlock(p.pid()).unwrap();
}

#[test]
fn a_restore_without_room_fails_and_keeps_the_checkpoint() {
    let (_g, s) = setup();
    s.write(&scenario(&[(4001, 6 * GIB)], json!({}))).unwrap();
    let cuda = open();
    cuda.lock(4001, 0).unwrap();
    cuda.checkpoint(4001).unwrap();
    // Another process takes the memory meanwhile.
    s.write(&scenario(&[(4001, 6 * GIB), (4002, 6 * GIB)], json!({})))
        .unwrap();
    let e = cuda.restore(4001).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e}");
    assert_eq!(e.message, "out of memory");
    assert_eq!(cuda.state(4001), Ok(ProcessState::Checkpointed));
    // Room again.
    s.write(&scenario(&[(4001, 6 * GIB), (4002, 4 * GIB)], json!({})))
        .unwrap();
    cuda.restore(4001).unwrap();
    cuda.unlock(4001).unwrap();
}

#[test]
fn injected_driver_failures_and_delays() {
    let (_g, s) = setup();
    let procs = [
        (4001, GIB),
        (4002, GIB),
        (4003, GIB),
        (4004, GIB),
        (4005, GIB),
        (4006, GIB),
    ];
    s.write(&scenario(
        &procs,
        json!({
            "checkpoint_delay_ms": 300,
            "processes": {
                "4001": { "checkpoint_error": { "code": 801 } },
                "4002": { "checkpoint_error": { "code": 999, "state": "failed" } },
                "4003": { "restore_error": { "code": 304 }, "restore_delay_ms": 200,
                          "checkpoint_delay_ms": 0 },
                "4004": { "lock_timeout": true },
                "4006": { "restore_error": { "code": 304, "state": "failed" },
                          "checkpoint_delay_ms": 0 },
            }
        }),
    ))
    .unwrap();
    let cuda = open();

    // Not supported (UVM / IPC memory): the checkpoint fails, the process stays locked and can
    // be unlocked.
    cuda.lock(4001, 0).unwrap();
    let e = cuda.checkpoint(4001).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    assert_eq!(
        e.to_string(),
        "CUDA_ERROR_NOT_SUPPORTED (801): operation not supported"
    );
    assert_eq!(cuda.state(4001), Ok(ProcessState::Locked));
    cuda.unlock(4001).unwrap();

    // A failed state: nothing works on it any more.
    cuda.lock(4002, 0).unwrap();
    assert_eq!(cuda.checkpoint(4002).unwrap_err().code, 999);
    assert_eq!(cuda.state(4002), Ok(ProcessState::Failed));
    for r in [cuda.unlock(4002), cuda.restore(4002), cuda.lock(4002, 10)] {
        assert_eq!(kind(r), ErrorKind::IllegalState);
    }

    // A restore error leaves the checkpoint in place; the per-process delay applies.
    cuda.lock(4003, 0).unwrap();
    cuda.checkpoint(4003).unwrap();
    let t = Instant::now();
    let e = cuda.restore(4003).unwrap_err();
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "restore_delay_ms"
    );
    assert_eq!(e.name, "CUDA_ERROR_OPERATING_SYSTEM");
    assert_eq!(cuda.state(4003), Ok(ProcessState::Checkpointed));

    // A restore that leaves the process failed.
    cuda.lock(4006, 0).unwrap();
    cuda.checkpoint(4006).unwrap();
    assert_eq!(cuda.restore(4006).unwrap_err().code, 304);
    assert_eq!(cuda.state(4006), Ok(ProcessState::Failed));
    assert_eq!(kind(cuda.unlock(4006)), ErrorKind::IllegalState);

    // A process that never becomes lockable: the lock waits its timeout, the process stays
    // running.
    let t = Instant::now();
    let e = cuda.lock(4004, 250).unwrap_err();
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "waited its timeout"
    );
    assert_eq!(e.kind(), ErrorKind::LockTimeout, "{e}");
    assert_eq!(e.name, "CUDA_ERROR_NOT_READY");
    assert_eq!(cuda.state(4004), Ok(ProcessState::Running));

    // A slow checkpoint.
    cuda.lock(4005, 0).unwrap();
    let t = Instant::now();
    cuda.checkpoint(4005).unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "checkpoint_delay_ms"
    );
    cuda.restore(4005).unwrap();
    cuda.unlock(4005).unwrap();

    // A forced code on one entry point.
    s.write(&scenario(
        &procs,
        json!({ "fail": { "cuCheckpointProcessLock": 999 } }),
    ))
    .unwrap();
    let e = cuda.lock(4005, 0).unwrap_err();
    assert_eq!((e.code, e.kind()), (999, ErrorKind::Other));
    assert_eq!(e.message, "unknown error");
}

#[test]
fn a_lock_waits_while_the_process_cannot_answer_and_fails_at_its_timeout() {
    if !require_root("a_lock_waits_while_the_process_cannot_answer_and_fails_at_its_timeout") {
        return;
    }
    let (_g, s) = setup();
    let cg = TestCgroup::create(&gpushare_testkit::unique("cuda-lock")).unwrap();
    let frozen = Sleeper::in_cgroup(&cg);
    let stopped = Sleeper::spawn();
    let other = Sleeper::spawn();
    s.write(&scenario(
        &[
            (frozen.pid(), GIB),
            (stopped.pid(), GIB),
            (other.pid(), GIB),
        ],
        json!({}),
    ))
    .unwrap();
    let cuda = Arc::new(open());

    // cgroup v2 freeze.
    std::fs::write(cg.dir().join("cgroup.freeze"), "1").unwrap();
    assert!(cg.wait_frozen(true));
    let t = Instant::now();
    let e = cuda.lock(frozen.pid(), 300).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(e.kind(), ErrorKind::LockTimeout, "{e}");
    assert_eq!(cuda.state(frozen.pid()), Ok(ProcessState::Running));

    // A lock without a timeout waits on a blocking thread while other processes are handled;
    // it goes through once the group is thawed.
    let waiting = {
        let cuda = Arc::clone(&cuda);
        let pid = frozen.pid();
        std::thread::spawn(move || cuda.lock(pid, 0))
    };
    cuda.lock(other.pid(), 1000).unwrap();
    cuda.checkpoint(other.pid()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !waiting.is_finished(),
        "the lock of a frozen process must wait"
    );
    std::fs::write(cg.dir().join("cgroup.freeze"), "0").unwrap();
    assert!(cg.wait_frozen(false));
    waiting.join().unwrap().unwrap();
    assert_eq!(cuda.state(frozen.pid()), Ok(ProcessState::Locked));
    cuda.unlock(frozen.pid()).unwrap();
    cuda.restore(other.pid()).unwrap();
    cuda.unlock(other.pid()).unwrap();

    // A stopped task (SIGSTOP: 'T' in /proc/<pid>/stat; the signal is asynchronous).
    unsafe { libc::kill(stopped.pid() as i32, libc::SIGSTOP) };
    assert!(wait_task_state(stopped.pid(), 'T'), "SIGSTOP took effect");
    let e = cuda.lock(stopped.pid(), 200).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockTimeout, "{e}");
    unsafe { libc::kill(stopped.pid() as i32, libc::SIGCONT) };
    cuda.lock(stopped.pid(), 1000).unwrap();
    cuda.unlock(stopped.pid()).unwrap();

    // The v1 freezer (hybrid hosts: /sys/fs/cgroup/freezer), when there is one.
    let v1 = std::path::Path::new("/sys/fs/cgroup/freezer");
    if v1.join("freezer.state").exists() || v1.join("cgroup.procs").exists() {
        let dir = v1.join(gpushare_testkit::unique("gpushare-test-cuda"));
        std::fs::create_dir(&dir).unwrap();
        let p = Sleeper::spawn();
        std::fs::write(dir.join("cgroup.procs"), p.pid().to_string()).unwrap();
        s.write(&scenario(&[(p.pid(), GIB)], json!({}))).unwrap();
        std::fs::write(dir.join("freezer.state"), "FROZEN").unwrap();
        let e = cuda.lock(p.pid(), 200);
        std::fs::write(dir.join("freezer.state"), "THAWED").unwrap();
        assert_eq!(kind(e), ErrorKind::LockTimeout);
        cuda.lock(p.pid(), 1000).unwrap();
        cuda.unlock(p.pid()).unwrap();
        drop(p);
        let _ = std::fs::remove_dir(&dir);
    }
}

#[test]
fn a_driver_without_the_checkpoint_api_makes_suspend_unavailable() {
    let (_g, s) = setup();
    // An r550 driver: CUDA 12.4.
    let mut old = scenario(&[(4001, GIB)], json!({}));
    old["cuda_driver_version"] = json!(12040);
    s.write(&old).unwrap();
    let e = Checkpointer::open(Some(&fake_cuda_lib())).unwrap_err();
    assert!(e.reason.contains("supports CUDA 12.4"), "{e}");
    assert!(e.reason.contains("r570 or later (CUDA 12.8)"), "{e}");

    // A driver that reports 12.8 but answers cuGetProcAddress with an error.
    s.write(&scenario(
        &[(4001, GIB)],
        json!({ "fail": { "cuGetProcAddress_v2": 500 } }),
    ))
    .unwrap();
    let e = Checkpointer::open(Some(&fake_cuda_lib())).unwrap_err();
    assert!(
        e.reason
            .contains("cuGetProcAddress(cuCheckpointProcessGetState)")
            && e.reason.contains("CUDA_ERROR_NOT_FOUND (500)"),
        "{e}"
    );

    // No GPU: cuInit fails.
    s.write(&json!({ "cuda_driver_version": 12080, "devices": [] }))
        .unwrap();
    let e = Checkpointer::open(Some(&fake_cuda_lib())).unwrap_err();
    assert!(
        e.reason.contains("cuInit")
            && e.reason
                .contains("CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected"),
        "{e}"
    );
}
