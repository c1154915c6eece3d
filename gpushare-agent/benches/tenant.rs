//! What a hostile tenant costs the agent, at a 200 ms interval, on the real kernel: how long an
//! over-quota workload takes to be frozen and how many of its steps the agent completes, under
//! - nothing (the baseline);
//! - an fd flood: 8 unprivileged, niced processes holding 19,000 fds each, opening a made-up
//!   `/dev/nvidia*` path for ever (issue 20, problem 3);
//! - a cgroup storm: 20,000 empty groups under a delegated unit, and a tenant that keeps starting
//!   short-lived GPU processes in fresh groups it removes at once (every event names a cgroup id
//!   the agent has not seen, whose process is gone by the time it is resolved).
//!
//! Prints figures only (no assertion on time); the tests (`tests/integration/tenant.rs`,
//! `attribution::cgroupfs`) assert the work counters. Needs root and `cargo build` first.
//! Run: `cargo bench -p gpushare-agent --bench tenant`. `GPUSHARE_BENCH_QUICK=1`: one round each.
//! `GPUSHARE_BENCH_AGENT_BIN=PATH`: another agent build (for a before and after).

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use gpushare_agent::client::{Endpoint, request};
use gpushare_testkit::{FakeDeviceNode, TestCgroup, nvml::Scenario, process::Flooder, unique};
use serde_json::json;

const GIB: u64 = 1 << 30;
const INTERVAL_S: f64 = 0.2;

fn main() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("tenant bench: FAILED: needs root (cgroups, eBPF); no figure printed");
        std::process::exit(1);
    }
    let debug = gpushare_testkit::target_profile_dir().join("../debug");
    let agent_bin = std::env::var_os("GPUSHARE_BENCH_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| debug.join("gpushare-agent"));
    let lib = debug.join("libgpushare_fake_nvml.so");
    let proc_bin = debug.join("gpushare-fake-gpu-proc");
    if !agent_bin.exists() || !lib.exists() || !proc_bin.exists() {
        eprintln!(
            "tenant bench: FAILED: run `cargo build` first (agent, mock NVML, fake GPU process)"
        );
        std::process::exit(1);
    }
    let rounds = if gpushare_testkit::bench::quick() {
        1
    } else {
        3
    };
    println!(
        "tenant bench: agent {}, interval 200 ms, {rounds} round(s) each; freeze = from the mock \
         reporting the workload over quota to the kernel reporting its group frozen",
        agent_bin.display()
    );
    println!(
        "{:<44} {:>10} {:>12} {:>12} {:>14} {:>14}",
        "load", "freeze s", "steps/s", "share", "fd entries", "dirs walked"
    );
    for load in [Load::None, Load::FdFlood, Load::CgroupStorm] {
        for _ in 0..rounds {
            let r = round(&agent_bin, &lib, &proc_bin, load);
            println!(
                "{:<44} {:>10.2} {:>12.2} {:>12.2} {:>14} {:>14}",
                load.name(),
                r.freeze_s,
                r.steps_per_s,
                r.steps_per_s * INTERVAL_S,
                shown(r.fd_entries),
                shown(r.dirs_walked)
            );
        }
    }
}

fn shown(n: Option<u64>) -> String {
    n.map_or_else(|| "n/a".into(), |n| n.to_string())
}

#[derive(Clone, Copy)]
enum Load {
    None,
    FdFlood,
    CgroupStorm,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::FdFlood => "fd flood (8 x 19,000 fds, failed opens)",
            Self::CgroupStorm => "cgroup storm (20,000 groups, churning opens)",
        }
    }
}

struct Figures {
    freeze_s: f64,
    steps_per_s: f64,
    /// `None`: the agent does not count it (an older build).
    fd_entries: Option<u64>,
    dirs_walked: Option<u64>,
}

fn round(agent_bin: &Path, lib: &Path, proc_bin: &Path, load: Load) -> Figures {
    let victim = TestCgroup::create(&unique("tenant-victim")).unwrap();
    let mut sleeper = victim
        .spawn(Command::new("sleep").arg("300").stdin(Stdio::null()))
        .unwrap();
    let sc = Scenario::create(&gpu(&[])).unwrap();
    let dir = gpushare_testkit::agent_dir(
        "tenant-agent",
        &format!(
            "[defaults]\ngrace = \"0s\"\nladder = [ {{ action = \"freeze\" }} ]\n\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"1GiB\"\n",
            victim.rel_path()
        ),
    );
    let listen = format!("127.0.0.1:{}", gpushare_testkit::free_port());
    let mut agent =
        gpushare_testkit::agent_command(agent_bin, Some(lib), sc.path(), &dir, &listen, "200ms")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    let sock = dir.join("agent.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&sock).is_none_or(|s| s["health"]["ready"] != true) {
        assert!(Instant::now() < deadline, "the agent did not become ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = state(&sock).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut flooders = Vec::new();
    let mut storm = None;
    let mut churn = None;
    match load {
        Load::None => {}
        Load::FdFlood => {
            let missing = format!("/dev/nvidia-{}", unique("missing"));
            for i in 0..8 {
                flooders.push(Flooder::spawn(proc_bin, &dir, i, &missing, 19_000));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        Load::CgroupStorm => {
            let unit = TestCgroup::create(&format!("{}.service", unique("storm"))).unwrap();
            for i in 0..20_000 {
                std::fs::create_dir(unit.dir().join(format!("g{i}"))).unwrap();
            }
            let node = FakeDeviceNode::create(&unique("storm")).unwrap();
            let (stop, unit_dir, bin) = (
                stop.clone(),
                unit.dir().to_path_buf(),
                proc_bin.to_path_buf(),
            );
            let node_path = node.path().to_path_buf();
            churn = Some(std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let g = unit_dir.join(format!("churn{n}"));
                    n += 1;
                    if std::fs::create_dir(&g).is_err() {
                        continue;
                    }
                    let procs = g.join("cgroup.procs");
                    let mut cmd = Command::new(&bin);
                    cmd.arg("--device")
                        .arg(&node_path)
                        .stdin(Stdio::null())
                        .stdout(Stdio::null());
                    // SAFETY: writes to a file and nice(2) in the child before exec.
                    unsafe {
                        cmd.pre_exec(move || {
                            std::fs::write(&procs, "0")?;
                            libc::nice(19);
                            Ok(())
                        });
                    }
                    if let Ok(mut c) = cmd.spawn() {
                        let _ = c.wait();
                    }
                    let _ = std::fs::remove_dir(&g);
                }
                n
            }));
            storm = Some((unit, node));
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let samples0 = samples(&listen);
    let t0 = Instant::now();
    sc.write(&gpu(&[(sleeper.id(), 2 * GIB)])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !victim.is_frozen() {
        assert!(Instant::now() < deadline, "the victim was never frozen");
        std::thread::sleep(Duration::from_millis(5));
    }
    let freeze_s = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(3).saturating_sub(t0.elapsed()));
    let steps = samples(&listen) - samples0;
    let steps_per_s = steps / t0.elapsed().as_secs_f64();
    let after = state(&sock).unwrap();
    let work = |s: &serde_json::Value, k: &str| s["counters"]["attribution_work"][k].as_u64();
    let delta = |k: &str| Some(work(&after, k)? - work(&before, k)?);
    stop.store(true, Ordering::Relaxed);
    if let Some(c) = churn {
        let _ = c.join();
    }
    drop(flooders);
    if let Some((unit, _node)) = storm {
        for i in 0..20_000 {
            let _ = std::fs::remove_dir(unit.dir().join(format!("g{i}")));
        }
        drop(unit);
    }
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let _ = agent.wait();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Figures {
        freeze_s,
        steps_per_s,
        fd_entries: delta("fd_entries_read"),
        dirs_walked: delta("cgroup_dirs_walked"),
    }
}

fn gpu(procs: &[(u32, u64)]) -> serde_json::Value {
    let list: Vec<_> = procs
        .iter()
        .map(|(pid, b)| json!({ "pid": pid, "used_memory": b }))
        .collect();
    json!({ "devices": [{ "uuid": "GPU-tenant", "name": "NVIDIA Fake", "memory_total": 80u64 << 30, "compute_processes": list }] })
}

fn state(sock: &Path) -> Option<serde_json::Value> {
    let (code, body) = request(&Endpoint::Unix(sock), "GET", "/api/v1/state", None).ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

fn samples(listen: &str) -> f64 {
    let Ok((_, m)) = request(&Endpoint::Tcp(listen), "GET", "/metrics", None) else {
        return 0.0;
    };
    m.lines()
        .find(|l| l.starts_with("gpushare_sample_duration_seconds_count"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
