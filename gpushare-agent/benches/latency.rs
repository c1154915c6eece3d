//! Detection-to-action latency at the default 1 s sample interval, measured end to end on the real
//! kernel: the agent binary, the mock NVML, a real cgroup freeze. Two paths, side by side:
//! - sampling: the mock starts reporting over-quota memory; the periodic sample must notice;
//! - allocation ioctl: same, and the process issues an RM_ALLOC ioctl at that moment; the eBPF event
//!   triggers an immediate re-sample.
//!
//! Latency = from the change to the kernel reporting the workload's cgroup frozen.
//! Needs root and `cargo build` first. Run: `cargo bench -p gpushare-agent --bench latency`.

use std::{
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use gpushare_agent::client::{Endpoint, request};
use gpushare_testkit::{FakeDeviceNode, FakeGpuProcess, TestCgroup, nvml::Scenario, unique};
use serde_json::json;

const GIB: u64 = 1 << 30;
const ROUNDS: usize = 20;
const INTERVAL_S: f64 = 1.0;

fn main() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("latency bench: FAILED: needs root (cgroups, eBPF); no figure printed");
        std::process::exit(1);
    }
    let debug = gpushare_testkit::target_profile_dir().join("../debug");
    let agent_bin = debug.join("gpushare-agent");
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
    let dir = std::env::temp_dir().join(unique("lat-agent"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("quotas.toml"),
        format!(
            "[defaults]\ngrace = \"0s\"\nladder = [ {{ action = \"freeze\" }} ]\n\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"2GiB\"\n",
            cg.rel_path()
        ),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{}", gpushare_testkit::free_port());
    let mut agent = AgentGuard(
        gpushare_testkit::agent_command(&agent_bin, Some(&lib), sc.path(), &dir, &listen, "1s")
            .env(
                "RUST_LOG",
                std::env::var("GPUSHARE_BENCH_AGENT_LOG_LEVEL").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(match std::env::var_os("GPUSHARE_BENCH_AGENT_LOG") {
                Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
                None => Stdio::null(),
            })
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
    let mut ioctl = Vec::new();
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
    for round in 0..ROUNDS {
        eprint!("\rround {}/{ROUNDS}", round + 1);
        for via_ioctl in [false, true] {
            std::thread::sleep(phase());
            let t0 = Instant::now();
            sc.write(&scenario(pid, 3 * GIB)).unwrap();
            if via_ioctl {
                proc_.send("alloc 1").unwrap();
            }
            let t = wait_frozen(&cg, true, Duration::from_secs(10)).expect("frozen");
            let lat = (t - t0).as_secs_f64();
            if via_ioctl {
                ioctl.push(lat)
            } else {
                sampling.push(lat)
            }
            sc.write(&scenario(pid, GIB)).unwrap();
            wait_frozen(&cg, false, Duration::from_secs(10)).expect("thawed");
            if via_ioctl {
                assert_eq!(proc_.read_answer().unwrap(), "ok");
            }
        }
    }
    eprintln!();
    if std::env::var_os("GPUSHARE_BENCH_VERBOSE").is_some() {
        eprintln!("sampling: {sampling:.3?}\nioctl: {ioctl:.3?}");
    }
    println!(
        "detection-to-action latency, {ROUNDS} rounds, sample interval {INTERVAL_S} s (change -> cgroup frozen):"
    );
    for (name, v) in [
        ("sampling only", &mut sampling),
        ("allocation ioctl", &mut ioctl),
    ] {
        v.sort_by(|a, b| a.total_cmp(b));
        let med = v[v.len() / 2];
        let p99 = v[((v.len() as f64 * 0.99).ceil() as usize).min(v.len()) - 1];
        println!(
            "  {name:<18} median {:>7.1} ms ({:.3}x interval)   p99 {:>7.1} ms ({:.3}x interval)",
            med * 1e3,
            med / INTERVAL_S,
            p99 * 1e3,
            p99 / INTERVAL_S
        );
    }
    agent.stop();
    let _ = std::fs::remove_dir_all(&dir);
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
        std::thread::sleep(Duration::from_micros(500));
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
