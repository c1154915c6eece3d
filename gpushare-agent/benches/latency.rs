//! Detection-to-action latency at the default 1 s sample interval, measured end to end on the real
//! kernel: the agent binary, the mock NVML, a real cgroup freeze. Two paths, side by side:
//! - sampling: the mock starts reporting over-quota memory; the periodic sample must notice;
//! - allocation ioctl: same, and the process issues an RM_ALLOC ioctl at that moment; the eBPF event
//!   triggers an immediate re-sample.
//!
//! Sampling latency = from the change to the kernel reporting the workload's cgroup frozen.
//! Allocation latency = from the moment the fake process issues its RM_ALLOC ioctl (it reads
//! CLOCK_BOOTTIME just before, the clock of the eBPF event time) to the cgroup reported frozen,
//! broken down with the agent's own stamps (`gpushare_agent::trace`, logged at debug level): the
//! kernel event, the agent draining it, the re-sample done, the decision, the group frozen.
//!
//! Needs root and `cargo build` first. Run: `cargo bench -p gpushare-agent --bench latency`.
//! `GPUSHARE_BENCH_QUICK=1`: 3 rounds, figures not to be judged. `GPUSHARE_BENCH_AGENT_BIN=PATH`:
//! another agent build (one without the reaction trace gets the totals, then the bench fails).

use std::{
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use gpushare_agent::{
    client::{Endpoint, request},
    ebpf::boot_time_ns,
    trace::ReactionTrace,
};
use gpushare_testkit::{FakeDeviceNode, FakeGpuProcess, TestCgroup, nvml::Scenario, unique};
use serde_json::json;

const GIB: u64 = 1 << 30;
const INTERVAL_S: f64 = 1.0;

fn main() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("latency bench: FAILED: needs root (cgroups, eBPF); no figure printed");
        std::process::exit(1);
    }
    let debug = gpushare_testkit::target_profile_dir().join("../debug");
    // GPUSHARE_BENCH_AGENT_BIN: another agent build (e.g. an older one, for a before and after).
    let agent_bin = std::env::var_os("GPUSHARE_BENCH_AGENT_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| debug.join("gpushare-agent"));
    let lib = debug.join("libgpushare_fake_nvml.so");
    if !agent_bin.exists() || !lib.exists() || !debug.join("gpushare-fake-gpu-proc").exists() {
        eprintln!(
            "latency bench: FAILED: run `cargo build` first (agent, mock NVML, fake GPU process)"
        );
        std::process::exit(1);
    }
    let node = FakeDeviceNode::create(&unique("lat")).unwrap();
    let cg = TestCgroup::create(&unique("lat")).unwrap();
    let mut proc_ = FakeGpuProcess::spawn(Some(&cg), &[node.path()], &[]).unwrap();
    let pid = proc_.pid();
    let sc = Scenario::create(&scenario(pid, GIB)).unwrap();
    let dir = gpushare_testkit::agent_dir(
        "lat-agent",
        &format!(
            "[defaults]\ngrace = \"0s\"\nladder = [ {{ action = \"freeze\" }} ]\n\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"2GiB\"\n",
            cg.rel_path()
        ),
    );
    let quick = std::env::var_os("GPUSHARE_BENCH_QUICK").is_some();
    let rounds = if quick { 3 } else { 20 };
    let listen = format!("127.0.0.1:{}", gpushare_testkit::free_port());
    // The agent's log holds its reaction traces (debug on the trace target only, by default).
    let log_path = std::env::var_os("GPUSHARE_BENCH_AGENT_LOG")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.join("agent.log"));
    let mut agent = AgentGuard(
        gpushare_testkit::agent_command(&agent_bin, Some(&lib), sc.path(), &dir, &listen, "1s")
            .env(
                "RUST_LOG",
                std::env::var("GPUSHARE_BENCH_AGENT_LOG_LEVEL")
                    .unwrap_or_else(|_| "warn,gpushare_agent::trace=debug".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()))
            .spawn()
            .unwrap(),
    );
    let ready = Instant::now();
    while request(&Endpoint::Tcp(&listen), "GET", "/healthz", None)
        .map(|r| r.0)
        .ok()
        != Some(200)
    {
        assert!(
            ready.elapsed() < Duration::from_secs(30),
            "agent did not become ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut sampling = Vec::new();
    // (CLOCK_BOOTTIME ns just before the ioctl, when the bench saw the cgroup frozen)
    let mut ioctl: Vec<(u64, u64)> = Vec::new();
    // Random phase against the sampler's clock (xorshift; no dependency needed for this).
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut phase = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        Duration::from_millis(seed % 1000)
    };
    for round in 0..rounds {
        eprint!("\rround {}/{rounds}", round + 1);
        for via_ioctl in [false, true] {
            std::thread::sleep(phase());
            let t0 = Instant::now();
            sc.write(&scenario(pid, 3 * GIB)).unwrap();
            if via_ioctl {
                proc_.send("talloc").unwrap();
            }
            wait_frozen(&cg, true, Duration::from_secs(10)).expect("frozen");
            let (frozen_at, frozen_boot) = (Instant::now(), boot_time_ns());
            sc.write(&scenario(pid, GIB)).unwrap();
            wait_frozen(&cg, false, Duration::from_secs(10)).expect("thawed");
            if via_ioctl {
                let answer = proc_.read_answer().unwrap();
                let at: u64 = answer
                    .strip_prefix("ok ")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or_else(|| panic!("fake process answered {answer:?} to talloc"));
                ioctl.push((at, frozen_boot));
            } else {
                sampling.push((frozen_at - t0).as_secs_f64());
            }
        }
    }
    eprintln!();
    agent.stop();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let traces: Vec<ReactionTrace> = log.lines().filter_map(ReactionTrace::parse).collect();
    let _ = std::fs::remove_dir_all(&dir);
    if std::env::var_os("GPUSHARE_BENCH_VERBOSE").is_some() {
        eprintln!("sampling: {sampling:.3?}\nioctl: {ioctl:?}\ntraces: {traces:?}");
    }
    println!(
        "detection-to-action latency, {rounds} rounds, sample interval {INTERVAL_S} s{}:",
        if quick {
            " [QUICK MODE: figures not to be judged]"
        } else {
            ""
        }
    );
    let (med, p99) = stats(&mut sampling);
    println!(
        "  sampling only, from the memory change to frozen: median {:.1} ms ({:.3}x interval), p99 {:.1} ms ({:.3}x interval)",
        med * 1e3,
        med / INTERVAL_S,
        p99 * 1e3,
        p99 / INTERVAL_S
    );
    // A round whose regular sample saw the new usage (written just before the ioctl) and froze the
    // process before it issued the ioctl has no ioctl-to-frozen figure: it is counted, not timed
    // (its ioctl ran after the thaw, so its time is after the freeze).
    let mut total: Vec<f64> = ioctl
        .iter()
        .filter(|(at, frozen)| frozen >= at)
        .map(|(at, frozen)| (frozen - at) as f64 / 1e9)
        .collect();
    let early = ioctl.len() - total.len();
    let (med, p99) = stats(&mut total);
    println!(
        "from ioctl to frozen: median {:.1} ms, p99 {:.1} ms{}",
        med * 1e3,
        p99 * 1e3,
        if early > 0 {
            format!(" ({early} round(s) frozen by the regular sample before the ioctl, not timed)")
        } else {
            String::new()
        }
    );
    // Each round's trace: the reaction whose kernel event came after its ioctl and before the
    // bench saw the cgroup frozen, and which acted.
    let matched: Vec<(u64, u64, ReactionTrace)> = ioctl
        .iter()
        .filter_map(|&(at, frozen)| {
            traces
                .iter()
                .find(|t| t.event_ktime >= at && t.event_ktime <= frozen && t.actions > 0)
                .map(|t| (at, frozen, *t))
        })
        .collect();
    if matched.is_empty() {
        eprintln!(
            "latency bench: FAILED: no reaction trace of the agent matched an ioctl round (log: {} lines, {} traces); no breakdown printed",
            log.lines().count(),
            traces.len()
        );
        // `exit` runs no destructors: leave no agent, process, cgroup or device node behind.
        drop(agent);
        drop(proc_);
        drop(cg);
        drop(node);
        let _ = std::fs::remove_dir_all(&dir);
        std::process::exit(1);
    }
    println!(
        "  breakdown ({} of {} rounds traced), median / p99 ms:",
        matched.len(),
        ioctl.len()
    );
    // The legs add up to the total: ioctl -> ... -> decided -> frozen (as the bench saw it).
    type Leg = fn(u64, u64, &ReactionTrace) -> u64;
    let legs: [(&str, Leg); 6] = [
        ("ioctl -> kernel event", |at, _, t| {
            t.event_ktime.saturating_sub(at)
        }),
        ("kernel event -> agent drained it", |_, _, t| {
            t.event_seen.saturating_sub(t.event_ktime)
        }),
        ("drained -> re-sample done", |_, _, t| {
            t.sample_done.saturating_sub(t.event_seen)
        }),
        ("re-sample done -> decided", |_, _, t| {
            t.decided.saturating_sub(t.sample_done)
        }),
        ("decided -> cgroup frozen", |_, frozen, t| {
            frozen.saturating_sub(t.decided)
        }),
        // Not part of the total: the agent issues the freeze and goes on (it reads the
        // group again every few ms until it settles).
        ("(decided -> freeze issued)", |_, _, t| {
            t.acted.saturating_sub(t.decided)
        }),
    ];
    for (name, leg) in legs {
        let mut v: Vec<f64> = matched
            .iter()
            .map(|(at, frozen, t)| leg(*at, *frozen, t) as f64 / 1e9)
            .collect();
        let (med, p99) = stats(&mut v);
        println!("    {name:<38} {:>7.2} {:>7.2}", med * 1e3, p99 * 1e3);
    }
}

/// (median, p99) of `v`, sorted in place.
fn stats(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let med = v[v.len() / 2];
    let p99 = v[((v.len() as f64 * 0.99).ceil() as usize).min(v.len()) - 1];
    (med, p99)
}

fn scenario(pid: u32, bytes: u64) -> serde_json::Value {
    json!({ "devices": [{ "uuid": "GPU-lat", "name": "NVIDIA Fake", "memory_total": 80 * GIB,
        "compute_processes": [{ "pid": pid, "used_memory": bytes }] }] })
}

fn wait_frozen(cg: &TestCgroup, frozen: bool, timeout: Duration) -> Option<Instant> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cg.is_frozen() == frozen {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

struct AgentGuard(Child);

impl AgentGuard {
    fn stop(&mut self) {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

impl Drop for AgentGuard {
    fn drop(&mut self) {
        self.stop();
    }
}
