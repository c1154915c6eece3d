//! The dashboards operators already run, against a real Prometheus scraping gpushare: the queries
//! of HAMi's Grafana dashboard, of the pre-2.9 HAMi dashboard on the names Volcano's vGPU monitor
//! exports, and of NVIDIA's dcgm-exporter dashboard, vendored verbatim under
//! `tests/data/dashboards/` (sources and licence there). Each query is marked `must` (returns
//! series, every one with a value the scenario implies) or `exempt` (with the reason). Plus
//! `promtool check metrics` per compat set, clean except its camelCase lint, which the names those
//! dashboards use cannot pass.

use std::{
    io::Write,
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use gpushare_testkit::nvml::Scenario;
use serde_json::json;

use crate::{
    prometheus::{Prometheus, value, which},
    util::{AgentProcess, group, needs_root},
};

const GIB: u64 = 1 << 30;

/// The scenario the fixtures' values are worked out from: one 80 GiB GPU, 50% busy (memory
/// controller 20%), 41 C, 123 W, SM clock 1755 MHz; one workload with a 4 GiB quota on it whose
/// process uses 1 GiB and keeps the SMs 30% busy (memory controller 10%).
fn scenario(pid: u32) -> serde_json::Value {
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    json!({ "devices": [{
        "uuid": "GPU-dash", "name": "NVIDIA Fake H100", "memory_total": 80 * GIB,
        "utilization_gpu": 50, "utilization_memory": 20,
        "temperature": 41, "power_usage": 123_000, "sm_clock": 1755,
        "compute_processes": [{ "pid": pid, "used_memory": GIB }],
        "process_utilization": [{ "pid": pid, "timestamp": now_us, "sm_util": 30, "mem_util": 10 }],
    }] })
}

/// Rewrites the scenario with a fresh per-process sample every 50 ms, as a driver keeps sampling
/// a process that keeps running kernels, until dropped.
struct Feeder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Feeder {
    fn start(sc: Arc<Scenario>, pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                sc.write(&scenario(pid)).unwrap();
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Query {
    must: Option<Vec<f64>>,
    expr: String,
}

fn fixture(name: &str) -> Vec<Query> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/dashboards")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut f = l.splitn(3, '\t');
            let (kind, arg, expr) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            let must = match kind {
                "must" => Some(arg.split(',').map(|v| v.parse().unwrap()).collect()),
                "exempt" => None,
                other => panic!("{}: {other:?} is neither must nor exempt", path.display()),
            };
            Query {
                must,
                expr: expr.to_string(),
            }
        })
        .collect()
}

/// Grafana's template variables as "everything".
fn instantiate(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let skip = if let Some(inner) = after.strip_prefix('{') {
            inner.find('}').map_or(0, |j| j + 2)
        } else {
            after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len())
        };
        out.push_str(".*");
        rest = &after[skip..];
    }
    out.push_str(rest);
    out
}

#[test]
fn the_queries_of_hami_volcano_and_dcgm_dashboards_return_the_scenarios_values() {
    needs_root!("the_queries_of_dashboards");
    if which("prometheus").is_none() {
        return;
    }
    let cg = group("dash");
    let mut p = cg.spawn(&mut crate::util::sleeper()).unwrap();
    let pid = p.id();
    let sc = Arc::new(Scenario::create(&scenario(pid)).unwrap());
    let quotas = format!(
        "\n[[quota]]\ncgroup = \"{}\"\ngpu = 0\ngpu_memory = \"4GiB\"\n",
        cg.rel_path()
    );
    let agent = AgentProcess::start(&sc, &quotas, &["--compat", "hami,volcano,dcgm"]);
    let _feeder = Feeder::start(sc.clone(), pid);
    let prom = Prometheus::start_labelled(&agent.listen, "node_name: gpushare-test")
        .expect("prometheus installed");
    prom.wait(r#"up{job="gpushare"}"#, Duration::from_secs(30), |r| {
        r.len() == 1 && value(&r[0]) == 1.0
    });
    let mut exempt = 0;
    let mut checked = 0;
    for file in [
        "hami-vgpu-dashboard.queries",
        "hami-legacy-vgpu-dashboard.queries",
        "dcgm-exporter-dashboard.queries",
    ] {
        for q in fixture(file) {
            let Some(values) = q.must else {
                exempt += 1;
                continue;
            };
            let expr = instantiate(&q.expr);
            let ok = |r: &[serde_json::Value]| {
                !r.is_empty() && r.iter().all(|s| values.contains(&value(s)))
            };
            prom.wait(&expr, Duration::from_secs(20), ok);
            checked += 1;
        }
    }
    assert!(
        checked >= 30 && exempt >= 10,
        "{checked} checked, {exempt} exempt"
    );
    let _ = (p.kill(), p.wait());
}

/// `promtool check metrics` for each compat set alone: nothing but its camelCase lint (which
/// `HostGPUMemoryUsage`, `modelName` and the like cannot pass) is reported.
#[test]
fn promtool_finds_nothing_but_camel_case_in_each_compat_set() {
    needs_root!("promtool_each_compat_set");
    let Some(promtool) = which("promtool") else {
        return;
    };
    let cg = group("promtool-compat");
    let mut p = cg.spawn(&mut crate::util::sleeper()).unwrap();
    let sc = Scenario::create(&scenario(p.id())).unwrap();
    let quotas = format!(
        "\n[[quota]]\ncgroup = \"{}\"\ngpu = 0\ngpu_memory = \"4GiB\"\n",
        cg.rel_path()
    );
    for set in ["hami", "volcano", "dcgm"] {
        let agent = AgentProcess::start(&sc, &quotas, &["--compat", set]);
        agent.wait_for(Duration::from_secs(10), |s| {
            s.workloads.iter().any(|w| w.gpu_uuid == "GPU-dash")
        });
        let (_, metrics) = agent.get("/metrics");
        let mut child = Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(metrics.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let other: Vec<&str> = report
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.contains("camelCase"))
            .collect();
        assert!(
            other.is_empty(),
            "--compat {set}: promtool reports more than camelCase:\n{report}"
        );
    }
    let _ = (p.kill(), p.wait());
}
