//! A real Prometheus (Debian's package, installed by setup) scrapes the agent running against the
//! mock NVML; assertions go through Prometheus's HTTP query API. Plus promtool on the agent's
//! exposition and on the shipped alert rules.

use std::{
    io::Write,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use gpushare_agent::client::{Endpoint, request};
use gpushare_testkit::{TestCgroup, nvml::Scenario, require_root, unique};
use serde_json::{Value, json};

use gpushare_testkit::free_port;

use crate::util::{AgentProcess, usr1_recorder};
use crate::util::{group, needs_root};

const GIB: u64 = 1 << 30;

pub(crate) struct Prometheus {
    child: Child,
    dir: std::path::PathBuf,
    addr: String,
}

impl Prometheus {
    pub(crate) fn start(target: &str) -> Option<Self> {
        Self::start_labelled(target, "")
    }

    /// Scrapes `target` with `labels` (YAML flow map entries, e.g. `node_name: n1`) added to its
    /// series, as a relabelling scrape configuration does.
    pub(crate) fn start_labelled(target: &str, labels: &str) -> Option<Self> {
        let bin = which("prometheus")?;
        let dir = std::env::temp_dir().join(unique("gpushare-prom"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: gpushare\n    static_configs:\n      - targets: [\"{target}\"]\n        labels: {{{labels}}}\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .unwrap();
        Some(Self { child, dir, addr })
    }

    pub(crate) fn query(&self, q: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", percent_encode(q));
        let Ok((200, body)) = request(&Endpoint::Tcp(&self.addr), "GET", &path, None) else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until `q` returns a vector satisfying `ok`.
    pub(crate) fn wait(
        &self,
        q: &str,
        timeout: Duration,
        ok: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.query(q);
            if ok(&r) {
                return r;
            }
            if Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
                panic!(
                    "Prometheus query {q} never satisfied; last result {r:?}\nprometheus log tail:\n{}",
                    tail(&log)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tail(s: &str) -> String {
    s.lines()
        .rev()
        .take(15)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn which(bin: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|p| p.exists())
    });
    if found.is_none() {
        assert!(
            !gpushare_testkit::skip::required(),
            "{bin} not installed (scripts/setup.sh installs Debian's prometheus package)"
        );
        gpushare_testkit::loud_skip(&format!("{bin} not installed; run scripts/setup.sh"));
    }
    found
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn value(r: &Value) -> f64 {
    r["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

fn scenario(procs: &[(u32, u64)]) -> Value {
    let list: Vec<_> = procs
        .iter()
        .map(|(pid, b)| json!({ "pid": pid, "used_memory": b }))
        .collect();
    json!({ "devices": [{ "uuid": "GPU-prom", "name": "NVIDIA Fake", "memory_total": 80 * GIB, "compute_processes": list }] })
}

#[test]
fn prometheus_scrapes_workload_memory_and_sees_isolation_state_change() {
    if !require_root("prometheus_scrapes_workload_memory") || which("prometheus").is_none() {
        return;
    }
    let a_cg = group("prom-a");
    let b_cg = group("prom-b");
    let log = std::env::temp_dir().join(unique("usr1"));
    let mut a = a_cg.spawn(&mut usr1_recorder(&log)).unwrap();
    let mut b = b_cg.spawn(&mut usr1_recorder(&log)).unwrap();
    let sc = Scenario::create(&scenario(&[(a.id(), GIB), (b.id(), GIB / 2)])).unwrap();
    let quotas = format!(
        "[defaults]\ngrace = \"200ms\"\nladder = [ {{ action = \"freeze\", after = \"1s\" }} ]\n\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"2GiB\"\n\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"2GiB\"\n",
        a_cg.rel_path(),
        b_cg.rel_path()
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let prom = Prometheus::start(&agent.listen).expect("prometheus installed");
    let (ka, kb) = (
        format!("cgroup://{}", a_cg.rel_path()),
        format!("cgroup://{}", b_cg.rel_path()),
    );

    prom.wait(r#"up{job="gpushare"}"#, Duration::from_secs(30), |r| {
        r.len() == 1 && value(&r[0]) == 1.0
    });
    let used = prom.wait(
        r#"gpushare_workload_gpu_memory_used_bytes{gpu_uuid="GPU-prom"}"#,
        Duration::from_secs(20),
        |r| r.len() >= 2,
    );
    let of = |key: &str| {
        used.iter()
            .find(|r| r["metric"]["workload"] == key)
            .map(value)
    };
    assert_eq!(of(&ka), Some(GIB as f64), "{used:?}");
    assert_eq!(of(&kb), Some((GIB / 2) as f64), "{used:?}");
    let quota = prom.query(&format!(
        r#"gpushare_workload_gpu_memory_quota_bytes{{workload="{ka}",gpu_uuid="all"}}"#
    ));
    assert_eq!(quota.first().map(value), Some(2.0 * GIB as f64));
    let state = |s: &str| {
        format!(
            r#"gpushare_workload_isolation_state{{workload="{ka}",gpu_uuid="all",state="{s}"}}"#
        )
    };
    prom.wait(&state("ok"), Duration::from_secs(10), |r| {
        r.first().map(value) == Some(1.0)
    });

    // A grows past its quota: Prometheus sees its isolation state change to frozen.
    sc.write(&scenario(&[(a.id(), 3 * GIB), (b.id(), GIB / 2)]))
        .unwrap();
    prom.wait(&state("frozen"), Duration::from_secs(20), |r| {
        r.first().map(value) == Some(1.0)
    });
    assert_eq!(prom.query(&state("ok")).first().map(value), Some(0.0));
    // Its per-GPU row shows the workload's state too.
    let per_gpu = prom.query(&format!(
        r#"gpushare_workload_isolation_state{{workload="{ka}",gpu_uuid="GPU-prom",state="frozen"}}"#
    ));
    assert_eq!(per_gpu.first().map(value), Some(1.0));
    let b_state = prom.query(&format!(
        r#"gpushare_workload_isolation_state{{workload="{kb}",gpu_uuid="all",state="ok"}}"#
    ));
    assert_eq!(b_state.first().map(value), Some(1.0), "B stays ok");
    let actions = prom.wait(
        r#"gpushare_enforcement_actions_total{action="freeze",result="ok"}"#,
        Duration::from_secs(10),
        |r| r.first().map(value) == Some(1.0),
    );
    assert_eq!(actions.len(), 1);
    let _ = (a.kill(), a.wait(), b.kill(), b.wait());
    let _ = std::fs::remove_file(log);
}

#[test]
fn promtool_accepts_the_agents_metrics_and_the_shipped_alert_rules() {
    needs_root!("promtool_accepts");
    let Some(promtool) = which("promtool") else {
        return;
    };
    let cg = group("promtool");
    // A second workload, with a quota on GPU 0 only (a per-device limit, as HAMi's are).
    let per_gpu = group("promtool-gpu0");
    let log = std::env::temp_dir().join(unique("usr1"));
    let mut p = cg.spawn(&mut usr1_recorder(&log)).unwrap();
    let mut q = per_gpu.spawn(&mut usr1_recorder(&log)).unwrap();
    let sc = Scenario::create(&scenario(&[(p.id(), 3 * GIB), (q.id(), GIB)])).unwrap();
    let quotas = format!(
        "[defaults]\ngrace = \"200ms\"\nladder = [ {{ action = \"freeze\" }} ]\n\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"2GiB\"\n\n[[quota]]\ncgroup = \"{}\"\ngpu = 0\ngpu_memory = \"4GiB\"\n",
        cg.rel_path(),
        per_gpu.rel_path()
    );
    // Every series, the per-process ones (off by default) included.
    let agent = AgentProcess::start(&sc, &quotas, &["--compat", "hami", "--process-metrics"]);
    agent.wait_for(Duration::from_secs(10), |s| {
        s.workloads.iter().any(|w| w.state == "frozen")
    });
    let (_, metrics) = agent.get("/metrics");
    // HAMi's series: per device, with their labels and values; none for the all-GPU row.
    let hami = |name: &str| -> Vec<&str> {
        metrics
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect()
    };
    let labels = |c: &TestCgroup| {
        format!(
            "{{namespace=\"\",pod=\"{}\",container=\"\",vdevice_index=\"0\",device_uuid=\"GPU-prom\"}}",
            c.rel_path()
        )
    };
    assert_eq!(
        hami("hami_vgpu_memory_used_bytes"),
        vec![
            format!("hami_vgpu_memory_used_bytes{} {}.0", labels(&cg), 3 * GIB),
            format!("hami_vgpu_memory_used_bytes{} {}.0", labels(&per_gpu), GIB),
        ],
        "{metrics}"
    );
    assert_eq!(
        hami("hami_vgpu_memory_limit_bytes"),
        vec![format!(
            "hami_vgpu_memory_limit_bytes{} {}.0",
            labels(&per_gpu),
            4 * GIB
        )],
        "only the per-GPU quota has a per-device limit:\n{metrics}"
    );
    for name in [
        "gpushare_gpu_memory_total_bytes",
        "gpushare_gpu_memory_used_bytes",
        "gpushare_workload_gpu_memory_used_bytes",
        "gpushare_workload_gpu_memory_quota_bytes",
        "gpushare_workload_isolation_state",
        "gpushare_process_gpu_memory_used_bytes",
        "gpushare_unattributed_gpu_memory_bytes",
        "gpushare_enforcement_actions_total",
        "gpushare_enforcement_latency_seconds_bucket",
        "gpushare_ebpf_events_lost_total",
        "gpushare_sample_duration_seconds_bucket",
        "gpushare_quota_config_valid",
        "gpushare_quota_config_last_reload_timestamp_seconds",
        "gpushare_build_info",
        "hami_vgpu_memory_used_bytes",
        "hami_vgpu_memory_limit_bytes",
    ] {
        assert!(
            metrics.contains(name),
            "{name} missing from /metrics:\n{metrics}"
        );
    }
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
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/alerts.yml");
    gpushare_testkit::output_ok(
        Command::new(&promtool)
            .arg("check")
            .arg("rules")
            .arg(&rules),
        "promtool check rules",
    );
    let _ = (p.kill(), p.wait(), q.kill(), q.wait());
    let _ = std::fs::remove_file(log);
}
