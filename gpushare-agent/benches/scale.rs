//! Scale, measured on the real kernel:
//! 1. Attribution cost for 10 / 100 / 1,000 / 10,000 GPU processes: the agent's eBPF-fed table
//!    (a map lookup) next to reading and parsing `/proc/<pid>/cgroup` per process (what
//!    dcgm-exporter and HAMi's monitor do), side by side in one run, as a ratio.
//! 2. One in-process agent step at 100 to 10,000 GPU processes: its time and the agent's heap
//!    allocations in it (median), steady and with 1% of the processes' usage changed.
//! 3. The per-step cost of utilization sampling at 1,000 GPU processes on 8 GPUs: agent steps
//!    with every process sampled (fresh per-process samples each step) next to steps on GPUs that
//!    answer NOT_SUPPORTED, alternating in one run.
//! 4. Agent footprint with 1,000 GPU processes in 200 workloads (and 10,000 in 2,000) sampled every
//!    second (the release binary against the mock NVML): CPU share of one core and RSS, over 30 s.
//!
//! Needs root and `cargo build --release` (for the agent) and `cargo build` (mock, fake process).
//! Run: `cargo bench -p gpushare-agent --bench scale` or `cargo xtask bench`. Arguments after `--`
//! pick parts: `attribution`, `step`, `utilization`, `footprint` (default: all). `GPUSHARE_BENCH_AGENT_BIN=A[:B..]`
//! measures other agent binaries (e.g. before and after a change) in alternating rounds over the
//! same processes, `GPUSHARE_BENCH_FOOTPRINT_ROUNDS=N` of them (the median is shown);
//! `GPUSHARE_BENCH_STEP_PROCS=N` runs one size of the step part (`..._STEP_COUNT=N` steps), and
//! `GPUSHARE_BENCH_FOOTPRINT_PROCS=N` one size of the footprint part (1000 or 10000);
//! `GPUSHARE_BENCH_STEP_CHURN=0` leaves out the steps with 1% of the usage changed (`=only`: only
//! those, to profile them);
//! `GPUSHARE_BENCH_FOOTPRINT_SECS=N` widens the footprint's window (to profile the agent meanwhile).
//! `GPUSHARE_BENCH_QUICK=1`: small sizes and a short window, figures not to be judged.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use gpushare_agent::{
    attribution::{CgroupResolver, cgroupfs, parse_cgroup_path, tracker::Tracker},
    ebpf::{KernelPrograms, LoadOptions},
};
use gpushare_testkit::{
    FakeDeviceNode, TestCgroup,
    bench::{median_us, quick},
    nvml::{SCENARIO_ENV, Scenario},
    unique,
};
use serde_json::json;

/// Counts the heap allocations this process makes (the agent's, in the in-process step; the mock
/// NVML is its own library with its own allocator, so its allocations are not counted).
struct Counting;
static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
// SAFETY: every call is passed on to the system allocator unchanged; only a counter is added.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}
#[global_allocator]
static COUNTING: Counting = Counting;

/// Runs `f`, returning its result, the milliseconds it took and the allocations it made.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, u64) {
    let a = ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed);
    let t = Instant::now();
    let out = f();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    (
        out,
        ms,
        ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed) - a,
    )
}

struct Procs(Vec<Child>);
impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

fn main() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("scale bench: FAILED: needs root; no figure printed");
        std::process::exit(1);
    }
    let parts: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |p: &str| parts.is_empty() || parts.iter().any(|a| a == p);
    if let Some(unknown) = parts
        .iter()
        .find(|a| !["attribution", "step", "utilization", "footprint"].contains(&a.as_str()))
    {
        eprintln!(
            "scale bench: FAILED: unknown part {unknown:?} (attribution, step, utilization, footprint)"
        );
        std::process::exit(1);
    }
    if want("attribution") {
        attribution_cost();
    }
    if want("step") {
        per_sample_cost();
    }
    if want("utilization") {
        utilization_cost();
    }
    if want("footprint") {
        footprint();
    }
}

/// The mock libnvidia-ml: the optimised build when there is one (`cargo build --release -p
/// gpushare-fake-nvml`, which `cargo xtask bench` does), else the debug one, whose own cost is
/// several times higher and is counted in the agent's figures (it runs in the agent's process).
fn mock_nvml() -> std::path::PathBuf {
    let release = gpushare_testkit::target_profile_dir().join("libgpushare_fake_nvml.so");
    let lib = if release.exists() {
        release
    } else {
        gpushare_testkit::target_profile_dir().join("../debug/libgpushare_fake_nvml.so")
    };
    eprintln!("scale bench: mock NVML {}", lib.display());
    lib
}

/// One agent step (sample through the mock, attribute, decide, publish) as processes and workloads
/// grow, in-process, median over 20 steps: steady (nothing changes between steps), and with 1% of
/// the processes changing their usage before each step (the scenario is rewritten and re-read by
/// the mock outside the timed step).
fn per_sample_cost() {
    let lib = mock_nvml();
    if !lib.exists() {
        eprintln!("scale bench: FAILED: the mock NVML is not built (`cargo build`)");
        std::process::exit(1);
    }
    let root = cgroupfs::find_cgroup2_mount().unwrap();
    let node = FakeDeviceNode::create(&unique("step")).unwrap();
    println!("one agent step (sample 8 GPUs, attribute, decide, publish), median of the steps");
    println!(
        "{:>10} {:>10} {:>14} {:>16} {:>18} {:>20}",
        "processes",
        "workloads",
        "step (ms)",
        "per process (us)",
        "1% changed (ms)",
        "allocations a step"
    );
    let sizes: &[(usize, usize)] = if quick() {
        &[(100, 20)]
    } else {
        &[(100, 20), (1_000, 200), (4_000, 800), (10_000, 2_000)]
    };
    // GPUSHARE_BENCH_STEP_PROCS=N: only the size with N processes (e.g. to profile one).
    let only: Option<usize> = std::env::var("GPUSHARE_BENCH_STEP_PROCS")
        .ok()
        .and_then(|v| v.parse().ok());
    for &(procs_n, workloads_n) in sizes.iter().filter(|(p, _)| only.is_none_or(|o| o == *p)) {
        let (parent, cgs) = workload_groups(&root, "step", workloads_n);
        let procs = spawn_gpu_procs(procs_n, node.path(), &cgs);
        let pids: Vec<u32> = procs.0.iter().map(|c| c.id()).collect();
        let sc = Scenario::create(&usage_scenario(&pids, &[])).unwrap();
        unsafe { std::env::set_var(SCENARIO_ENV, sc.path()) };
        let dir = agent_dir("step-agent", &parent);
        let (mut agent, snapshot) = bench_agent(&lib, &root, &dir);
        agent.tick(None); // first step attributes every pid through /proc
        let seen = snapshot.read().unwrap().workloads.len();
        if seen < workloads_n {
            // A panic, not `exit`: the guards' destructors remove the processes and cgroups.
            panic!("scale bench: FAILED: the agent saw {seen} of {workloads_n} workloads");
        }
        // GPUSHARE_BENCH_STEP_COUNT: more steps (e.g. to profile them).
        let steps: usize = std::env::var("GPUSHARE_BENCH_STEP_COUNT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        // GPUSHARE_BENCH_STEP_CHURN=only: the changing steps only (one steady step).
        let only_churn = std::env::var("GPUSHARE_BENCH_STEP_CHURN").is_ok_and(|v| v == "only");
        let (mut v, mut va): (Vec<f64>, Vec<u64>) = (0..if only_churn { 1 } else { steps })
            .map(|_| {
                let ((), ms, allocs) = timed(|| agent.tick(None));
                (ms, allocs)
            })
            .unzip();
        v.sort_by(|a, b| a.total_cmp(b));
        va.sort_unstable();
        let med = v[v.len() / 2];
        // 1% of the processes (the next ones in turn) change their usage before each step.
        let poke = nvml_wrapper::Nvml::builder()
            .lib_path(lib.as_os_str())
            .init()
            .expect("the mock NVML");
        let changing = (procs_n / 100).max(1);
        // GPUSHARE_BENCH_STEP_CHURN=0: steady steps only (e.g. to count their instructions).
        let churn = std::env::var("GPUSHARE_BENCH_STEP_CHURN").map_or(true, |v| v != "0");
        let (mut c, mut ca): (Vec<f64>, Vec<u64>) = (0..if churn { steps } else { 1 })
            .map(|i| {
                let from = (i * changing) % procs_n;
                let bumped: Vec<usize> = (from..from + changing).map(|j| j % procs_n).collect();
                sc.write(&usage_scenario(&pids, &bumped)).unwrap();
                poke.device_count().unwrap();
                let ((), ms, allocs) = timed(|| agent.tick(None));
                (ms, allocs)
            })
            .unzip();
        c.sort_by(|a, b| a.total_cmp(b));
        ca.sort_unstable();
        let changed = c[c.len() / 2];
        // The agent's heap allocations in a step (median), steady / 1% changed.
        let allocs = format!("{} / {}", va[va.len() / 2], ca[ca.len() / 2]);
        println!(
            "{procs_n:>10} {workloads_n:>10} {med:>14.2} {:>16.1} {changed:>18.2} {allocs:>20}",
            med * 1e3 / procs_n as f64
        );
        drop(poke);
        drop(agent);
        drop(procs);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The per-step cost of utilization sampling: 1,000 GPU processes in 200 workloads on 8 GPUs,
/// agent steps alternating between GPUs that report per-process utilization (every process with a
/// fresh sample each step: read, verified against the pid's holder, summed per workload, published)
/// and GPUs that answer NOT_SUPPORTED. The scenario is rewritten before every step, in both modes,
/// and the mock (loaded once per process, so shared with the agent) re-reads it before the clock
/// starts.
fn utilization_cost() {
    let lib = mock_nvml();
    let root = cgroupfs::find_cgroup2_mount().unwrap();
    let node = FakeDeviceNode::create(&unique("util")).unwrap();
    let (procs_n, workloads_n) = if quick() { (100, 20) } else { (1_000, 200) };
    let (parent, cgs) = workload_groups(&root, "util", workloads_n);
    let procs = spawn_gpu_procs(procs_n, node.path(), &cgs);
    let pids: Vec<u32> = procs.0.iter().map(|c| c.id()).collect();
    let sc = Scenario::create(&utilization_scenario(&pids, false)).unwrap();
    unsafe { std::env::set_var(SCENARIO_ENV, sc.path()) };
    let dir = agent_dir("util-agent", &parent);
    let (mut agent, snapshot) = bench_agent(&lib, &root, &dir);
    // A second session on the same (process-wide) mock: touching it makes the mock re-read a
    // rewritten scenario outside the timed step.
    let poke = nvml_wrapper::Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("the mock NVML");
    let mut step = |with: bool| -> f64 {
        sc.write(&utilization_scenario(&pids, with)).unwrap();
        poke.device_count().unwrap();
        let t = Instant::now();
        agent.tick(None);
        t.elapsed().as_secs_f64() * 1e3
    };
    // Attribute every pid, and set where each GPU's next per-process read starts.
    step(true);
    step(true);
    let charged = snapshot
        .read()
        .unwrap()
        .workloads
        .iter()
        .filter(|w| w.utilization.is_some_and(|u| u > 0.0))
        .count();
    if charged < workloads_n {
        panic!("scale bench: FAILED: {charged} of {workloads_n} workloads charged their samples");
    }
    // GPUSHARE_BENCH_STEP_COUNT: more rounds (a busy machine needs them).
    let rounds: usize = std::env::var("GPUSHARE_BENCH_STEP_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick() { 3 } else { 20 });
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        without.push(step(false));
        with.push(step(true));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (a, b) = (median(&mut without), median(&mut with));
    println!(
        "utilization sampling, {procs_n} processes in {workloads_n} workloads on 8 GPUs, median of \
         {rounds} alternating steps"
    );
    println!("{:>44} {:>10}", "", "step (ms)");
    println!("{:>44} {a:>10.2}", "GPUs answering NOT_SUPPORTED");
    println!("{:>44} {b:>10.2}", "every process sampled each step");
    println!(
        "{:>44} {:>10.2}  ({:.1} us per process, {:.2}x the step)",
        "cost of utilization sampling",
        b - a,
        (b - a) * 1e3 / procs_n as f64,
        b / a
    );
    drop(poke);
    drop(agent);
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 8 GPUs of 80 GiB, the processes dealt out in turn (256 MiB each); `with`: each process has a
/// per-process sample stamped now (5% SM, 2% memory), else the GPUs answer NOT_SUPPORTED.
fn utilization_scenario(pids: &[u32], with: bool) -> serde_json::Value {
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let devices: Vec<_> = (0..8)
        .map(|d| {
            let mine: Vec<u32> = pids
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 8 == d)
                .map(|(_, p)| *p)
                .collect();
            let list: Vec<_> = mine
                .iter()
                .map(|p| json!({ "pid": p, "used_memory": 256u64 << 20 }))
                .collect();
            let samples: Vec<_> = mine
                .iter()
                .map(|p| json!({ "pid": p, "timestamp": now_us, "sm_util": 5, "mem_util": 2 }))
                .collect();
            json!({ "uuid": format!("GPU-{d}"), "name": "NVIDIA Fake", "memory_total": 80u64 << 30,
                    "compute_processes": list, "utilization_supported": with,
                    "utilization_gpu": 40, "process_utilization": if with { samples } else { Vec::new() } })
        })
        .collect();
    json!({ "devices": devices })
}

/// An in-process agent in dry-run mode over the mock NVML `lib`, with `/proc` attribution and its
/// files under `dir`; and the snapshot it publishes.
fn bench_agent(
    lib: &Path,
    root: &Path,
    dir: &Path,
) -> (
    gpushare_agent::agent::Agent,
    gpushare_agent::snapshot::SharedSnapshot,
) {
    use std::sync::Arc;

    use gpushare_agent::{
        agent::{Agent, AgentOptions},
        enforce::Enforcer,
        grants::quota_store::{QuotaPaths, QuotaStore},
        nvml::NvmlSampler,
        snapshot::SharedSnapshot,
    };
    let tracker = Tracker::procfs_only(CgroupResolver::new(root.to_path_buf()), "bench".into());
    let snapshot: SharedSnapshot = Arc::default();
    let agent = Agent::new(
        tracker,
        NvmlSampler::open(Some(lib)),
        QuotaStore::load(QuotaPaths::new(dir.join("quotas.toml"), None)),
        Enforcer::new(root.to_path_buf(), &dir.join("state"), true).unwrap(),
        snapshot.clone(),
        AgentOptions {
            dry_run: true,
            keep_frozen_on_exit: false,
            ..AgentOptions::default()
        },
    );
    (agent, snapshot)
}

/// A new parent group (`<tag>-...`) with `n` workload groups `w0`, `w1`, ... under it.
fn workload_groups(root: &Path, tag: &str, n: usize) -> (TestCgroup, Vec<TestCgroup>) {
    let parent = TestCgroup::create(&unique(tag)).unwrap();
    let rel = parent.rel_path().trim_start_matches('/').to_string();
    let cgs = (0..n)
        .map(|i| TestCgroup::create_at(root, &format!("{rel}/w{i}")).unwrap())
        .collect();
    (parent, cgs)
}

/// 8 GPUs of 80 GiB, the processes (`pids`) dealt out in turn, 256 MiB each, those at the
/// positions in `bumped` 320 MiB.
fn usage_scenario(pids: &[u32], bumped: &[usize]) -> serde_json::Value {
    let devices: Vec<_> = (0..8)
        .map(|d| {
            let list: Vec<_> = pids
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 8 == d)
                .map(|(i, p)| {
                    let mib: u64 = if bumped.contains(&i) { 320 } else { 256 };
                    json!({ "pid": p, "used_memory": mib << 20 })
                })
                .collect();
            json!({ "uuid": format!("GPU-{d}"), "name": "NVIDIA Fake", "memory_total": 80u64 << 30, "compute_processes": list })
        })
        .collect();
    json!({ "devices": devices })
}

/// The mock's scenario: 8 GPUs of 80 GiB, the processes dealt out in turn, 256 MiB each.
fn scenario_of(procs: &Procs) -> Scenario {
    let devices: Vec<_> = (0..8)
        .map(|d| {
            let list: Vec<_> = procs
                .0
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 8 == d)
                .map(|(_, c)| json!({ "pid": c.id(), "used_memory": 256u64 << 20 }))
                .collect();
            json!({ "uuid": format!("GPU-{d}"), "name": "NVIDIA Fake", "memory_total": 80u64 << 30, "compute_processes": list })
        })
        .collect();
    Scenario::create(&json!({ "devices": devices })).unwrap()
}

/// A fresh agent directory whose quotas.toml gives each workload group under `parent` 4 GiB.
fn agent_dir(tag: &str, parent: &TestCgroup) -> PathBuf {
    let quotas = format!(
        "[[quota]]\ncgroup = \"{}/*\"\ngpu_memory = \"4GiB\"\n",
        parent.rel_path()
    );
    gpushare_testkit::agent_dir(tag, &quotas)
}

fn spawn_gpu_procs(n: usize, node: &std::path::Path, cgs: &[TestCgroup]) -> Procs {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(format!("exec 3<>{}; exec sleep 600", node.display()))
            .stdin(Stdio::null());
        v.push(cgs[i % cgs.len()].spawn(&mut cmd).expect("spawn"));
    }
    // Until every one runs `sleep`: thousands of shells starting would otherwise share the CPUs
    // with the first measured steps (on a busy machine for tens of seconds).
    let deadline = Instant::now() + Duration::from_secs(300);
    for c in &v {
        let comm = format!("/proc/{}/comm", c.id());
        while std::fs::read_to_string(&comm).is_ok_and(|s| s.trim() != "sleep")
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Procs(v)
}

fn attribution_cost() {
    let kernel = KernelPrograms::load(&LoadOptions::default()).expect("load programs");
    let mut tracker = Tracker::with_kernel(
        kernel,
        CgroupResolver::new(cgroupfs::find_cgroup2_mount().unwrap()),
    );
    let node = FakeDeviceNode::create(&unique("scale")).unwrap();
    let cgs: Vec<TestCgroup> = (0..20)
        .map(|i| TestCgroup::create(&unique(&format!("scale{i}"))).unwrap())
        .collect();
    println!("attribution of N GPU processes to their workloads (median of 5 passes)");
    println!(
        "{:>8} {:>22} {:>26} {:>8}",
        "N", "eBPF table (us/pass)", "/proc/<pid>/cgroup (us/pass)", "ratio"
    );
    let mut procs = Procs(Vec::new());
    let ns: &[usize] = if quick() {
        &[10, 100]
    } else {
        &[10, 100, 1_000, 10_000]
    };
    for &n in ns {
        let more = spawn_gpu_procs(n - procs.0.len(), node.path(), &cgs);
        let mut more = more;
        procs.0.append(&mut more.0);
        let pids: Vec<u32> = procs.0.iter().map(|c| c.id()).collect();
        // Let the kernel events arrive (and, as the agent does every reconcile interval, reconcile:
        // a burst of thousands of new GPU tasks overflows the ring buffer).
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut last_reconcile = Instant::now();
        loop {
            tracker.poll();
            if pids.iter().all(|p| tracker.table().get(*p).is_some()) {
                break;
            }
            if last_reconcile.elapsed() > Duration::from_secs(2) {
                tracker.reconcile();
                last_reconcile = Instant::now();
            }
            if Instant::now() > deadline {
                tracker.reconcile();
                let missing = pids
                    .iter()
                    .filter(|p| tracker.table().get(**p).is_none())
                    .count();
                panic!(
                    "scale bench: FAILED: {missing} of {n} GPU processes never reached the table"
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let table = |pids: &[u32]| {
            let mut found = 0;
            for p in pids {
                if let Some(w) = tracker.table().get(*p).and_then(|t| t.workload.as_ref()) {
                    found += w.cgroup_path.len();
                }
            }
            found
        };
        let procfs = |pids: &[u32]| {
            let mut found = 0;
            for p in pids {
                if let Ok(path) = cgroupfs::cgroup_path_of_pid(*p) {
                    found += parse_cgroup_path(&path).cgroup_path.len();
                }
            }
            found
        };
        assert_eq!(
            table(&pids),
            procfs(&pids),
            "both methods must find the same workloads"
        );
        let t = median_us(5, || table(&pids));
        let p = median_us(5, || procfs(&pids));
        println!("{n:>8} {t:>22.1} {p:>26.1} {:>7.0}x", p / t);
    }
    let k = tracker.kernel_counters();
    println!(
        "  (kernel events lost while starting them: {}; recovered by reconciliation)",
        k.events_lost
    );
    drop(procs);
}

/// One agent run: start it, check it sees every workload, measure its CPU over `secs`, stop it.
/// Returns (CPU % of one core, RSS MiB, peak RSS MiB).
fn footprint_once(
    bin: &std::path::Path,
    lib: &std::path::Path,
    sc: &Scenario,
    dir: &std::path::Path,
    workloads_n: usize,
    secs: u64,
) -> (f64, f64, f64) {
    let listen = format!("127.0.0.1:{}", gpushare_testkit::free_port());
    let mut agent = gpushare_testkit::agent_command(bin, Some(lib), sc.path(), dir, &listen, "1s")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(5)); // start-up and first samples
    let pid = agent.id() as i32;
    // Only a working agent's figure counts: it must see every workload (thousands of processes
    // take a while to attribute at start).
    let shown = || {
        gpushare_agent::client::request(
            &gpushare_agent::client::Endpoint::Unix(&dir.join("agent.sock")),
            "GET",
            "/api/v1/state",
            None,
        )
        .ok()
        .and_then(|(code, body)| (code == 200).then_some(body))
        .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
        .and_then(|v| v["workloads"].as_array().map(|w| w.len()))
        .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = shown();
    while seen < workloads_n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
        seen = shown();
    }
    // Past the start-up's attribution.
    std::thread::sleep(Duration::from_secs(2));
    if seen < workloads_n {
        unsafe { libc::kill(pid, libc::SIGTERM) };
        panic!(
            "scale bench: FAILED: the agent ({}) shows {seen} of {workloads_n} workloads",
            bin.display()
        );
    }
    let cpu = || {
        let s = procfs::process::Process::new(pid).unwrap().stat().unwrap();
        (s.utime + s.stime) as f64 / procfs::ticks_per_second() as f64
    };
    let (c0, t0) = (cpu(), Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    let (c1, dt) = (cpu(), t0.elapsed().as_secs_f64());
    let status = procfs::process::Process::new(pid)
        .unwrap()
        .status()
        .unwrap();
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let _ = agent.wait();
    (
        (c1 - c0) / dt * 100.0,
        status.vmrss.unwrap_or(0) as f64 / 1024.0,
        status.vmhwm.unwrap_or(0) as f64 / 1024.0,
    )
}

fn footprint() {
    // GPUSHARE_BENCH_FOOTPRINT_PROCS=N: only the size with N processes.
    let only: Option<usize> = std::env::var("GPUSHARE_BENCH_FOOTPRINT_PROCS")
        .ok()
        .and_then(|v| v.parse().ok());
    let sizes: &[(usize, usize, u64)] = if quick() {
        &[(100, 20, 3)]
    } else {
        &[(1_000, 200, 30), (10_000, 2_000, 30)]
    };
    for &(procs_n, workloads_n, secs) in sizes.iter().filter(|s| only.is_none_or(|o| o == s.0)) {
        footprint_of(procs_n, workloads_n, secs);
    }
}

/// The footprint of `procs_n` GPU processes in `workloads_n` workloads over `secs` seconds.
fn footprint_of(procs_n: usize, workloads_n: usize, secs: u64) {
    // A longer window (e.g. to profile the agent meanwhile): GPUSHARE_BENCH_FOOTPRINT_SECS.
    let secs = std::env::var("GPUSHARE_BENCH_FOOTPRINT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(secs);
    let release = gpushare_testkit::target_profile_dir();
    // GPUSHARE_BENCH_AGENT_BIN=A[:B...]: those agent binaries (e.g. before and after a change),
    // measured in alternating rounds over the same processes; GPUSHARE_BENCH_FOOTPRINT_ROUNDS=N.
    let bins: Vec<std::path::PathBuf> = match std::env::var_os("GPUSHARE_BENCH_AGENT_BIN") {
        Some(v) => std::env::split_paths(&v).collect(),
        None => vec![release.join("gpushare-agent")],
    };
    let rounds: usize = std::env::var("GPUSHARE_BENCH_FOOTPRINT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let lib = mock_nvml();
    if bins.iter().any(|b| !b.exists()) || !lib.exists() {
        eprintln!(
            "scale bench: FAILED: build first: `cargo build --release -p gpushare-agent -p gpushare-fake-nvml && cargo build` ({bins:?})"
        );
        std::process::exit(1);
    }
    let node = FakeDeviceNode::create(&unique("foot")).unwrap();
    let root = cgroupfs::find_cgroup2_mount().unwrap();
    let (parent, cgs) = workload_groups(&root, "foot", workloads_n);
    let procs = spawn_gpu_procs(procs_n, node.path(), &cgs);
    let sc = scenario_of(&procs);
    let dir = agent_dir("foot-agent", &parent);
    let mut cpu_pct: Vec<Vec<f64>> = vec![Vec::new(); bins.len()];
    let mut rss = vec![(0.0, 0.0); bins.len()];
    for round in 0..rounds {
        for (i, bin) in bins.iter().enumerate() {
            eprint!(
                "\rfootprint round {}/{rounds}: {}",
                round + 1,
                bin.display()
            );
            let (pct, now, peak) = footprint_once(bin, &lib, &sc, &dir, workloads_n, secs);
            cpu_pct[i].push(pct);
            rss[i] = (now, peak);
        }
    }
    eprintln!();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    for (i, bin) in bins.iter().enumerate() {
        let v = &mut cpu_pct[i];
        v.sort_by(|a, b| a.total_cmp(b));
        println!(
            "agent footprint{}, {procs_n} GPU processes in {workloads_n} workloads on 8 GPUs, 1 s interval, {secs} s x {rounds}: CPU {:.2}% of one core (median; rounds {}), RSS {:.1} MiB (peak {:.1} MiB); load average {}{}",
            if quick() { " [QUICK MODE]" } else { "" },
            v[v.len() / 2],
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" "),
            rss[i].0,
            rss[i].1,
            load.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
            if bins.len() > 1 {
                format!(" [{}]", bin.display())
            } else {
                String::new()
            }
        );
    }
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}
