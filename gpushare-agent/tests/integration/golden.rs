//! Golden tests of what users see, for one fixed scenario: the `/metrics` text (with and without
//! `--compat hami`), the `/api/v1/state` JSON, and `gpushare-agent status --json` and `status`.
//! `deploy/prometheus/alerts.yml` and dashboards depend on the metric names and labels; scripts
//! depend on the JSON. A change of any of them must be deliberate: `GPUSHARE_BLESS=1` rewrites the
//! files under `tests/data/golden/`, and the diff is reviewed.
//!
//! The scenario: the real agent binary over the mock NVML (two GPUs) with real test cgroups and
//! processes, and a fixed quota file:
//! - `under`: a quota on all GPUs, used on both, well under it;
//! - `over`: a quota on GPU 0 only, over it, alerted and then frozen by its ladder;
//! - `protected`: over a quota, but named by `protect`, so left alone (and shown without it);
//! - `free`: a plain cgroup no entry names (no quota).
//!
//! Only what truly varies between runs is replaced, by named placeholders: pids, the unique
//! names of the test's cgroups and of the agent's directory, timestamps, durations and
//! histogram observations, the commit the agent was built from, and counts of what every process on the machine did (kernel events,
//! identity checks: other tests' GPU tasks count there too). Series that are there in some runs
//! only are dropped: `freeze` actions with `result="pending"` (whether the kernel had settled the
//! freeze when the agent first looked is a race) and kernel events by kind (whatever ran).
//! Every metric name, label name, fixed label value, series order, JSON key and JSON structure
//! is kept.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use gpushare_testkit::{TestCgroup, nvml::Scenario, nvml::fake_cuda_lib, require_root, unique};
use serde_json::json;

use crate::util::{AgentProcess, Reaped, key, sleeper, workload};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);

/// The four workloads of the scenario, each a test cgroup with one sleeping process.
struct Fixture {
    under: (TestCgroup, Reaped),
    over: (TestCgroup, Reaped),
    protected: (TestCgroup, Reaped),
    free: (TestCgroup, Reaped),
    sc: Scenario,
}

impl Fixture {
    fn create(tag: &str) -> Self {
        let group = |name: &str| {
            // The name first: `status` shows the first three characters of it.
            let cg = TestCgroup::create(&unique(&format!("{name}-golden-{tag}"))).unwrap();
            let p = Reaped(cg.spawn(&mut sleeper()).unwrap());
            (cg, p)
        };
        let (under, over, protected, free) =
            (group("under"), group("over"), group("prot"), group("free"));
        let proc_ = |p: &Reaped, bytes: u64| json!({ "pid": p.pid(), "used_memory": bytes });
        let sc = Scenario::create(&json!({
            // A driver with the CUDA checkpoint API: `suspend` is available (the health field
            // would name the mock's path otherwise).
            "cuda_driver_version": 12080,
            "devices": [
                {
                    "uuid": "GPU-golden-0",
                    "name": "NVIDIA Fake H100",
                    "memory_total": 80 * GIB,
                    "compute_processes": [proc_(&under.1, GIB), proc_(&over.1, 3 * GIB)],
                },
                {
                    "uuid": "GPU-golden-1",
                    "name": "NVIDIA Fake A100",
                    "memory_total": 40 * GIB,
                    "compute_processes": [
                        proc_(&under.1, 512 * MIB),
                        proc_(&protected.1, 6 * GIB),
                        proc_(&free.1, 2 * GIB),
                    ],
                },
            ],
        }))
        .unwrap();
        Self {
            under,
            over,
            protected,
            free,
            sc,
        }
    }

    fn quotas(&self) -> String {
        format!(
            "protect = [\"cgroup://{protected}\"]\n\n\
             [defaults]\n\
             grace = \"0s\"\n\
             ladder = [ {{ action = \"alert\" }}, {{ action = \"freeze\", after = \"1s\" }} ]\n\n\
             [[quota]]\nname = \"under\"\ncgroup = \"{under}\"\ngpu_memory = \"4GiB\"\n\n\
             [[quota]]\nname = \"over\"\ncgroup = \"{over}\"\ngpu = 0\ngpu_memory = \"2GiB\"\n\n\
             [[quota]]\nname = \"protected\"\ncgroup = \"{protected}\"\ngpu_memory = \"2GiB\"\n",
            under = self.under.0.rel_path(),
            over = self.over.0.rel_path(),
            protected = self.protected.0.rel_path(),
        )
    }

    /// Starts the agent and waits until the scenario has played out: `over` alerted and frozen
    /// (by the kernel, and reported so), every workload's row published.
    fn agent(&self, extra: &[&str]) -> AgentProcess {
        let cuda = fake_cuda_lib().display().to_string();
        let mut args = vec!["--cuda-lib", cuda.as_str()];
        args.extend_from_slice(extra);
        // The node name HAMi's and dcgm-exporter's series carry: fixed, not this machine's.
        let mut agent = AgentProcess::unstarted(
            crate::util::agent_dir(&self.quotas()),
            &self.sc,
            &args,
            "200ms",
        )
        .env("NODE_NAME", "golden-node");
        agent.restart();
        assert!(
            self.over.0.wait_frozen(true),
            "`over` was never frozen\n{}",
            agent.log()
        );
        agent.wait_for(WAIT, |s| {
            let row = |cg: &TestCgroup, gpu: &str| workload(s, &key(cg), gpu);
            row(&self.over.0, "GPU-golden-0").is_some_and(|w| w.state == "frozen")
                && row(&self.under.0, "all").is_some_and(|w| w.used_bytes == GIB + 512 * MIB)
                && row(&self.under.0, "GPU-golden-1").is_some()
                && row(&self.protected.0, "GPU-golden-1").is_some_and(|w| w.used_bytes == 6 * GIB)
                && row(&self.free.0, "GPU-golden-1").is_some_and(|w| w.used_bytes == 2 * GIB)
                && s.counters.enforcement_actions.get("alert", "ok") > 0
                && s.counters.enforcement_actions.get("freeze", "ok") > 0
                && s.gpus
                    .iter()
                    .all(|g| g.isolation_backend == "driver_limits")
        });
        // One more whole step with nothing left to do, so that every output below shows the
        // same settled state.
        agent.wait_next_step();
        agent
    }

    /// What varies between runs, and its placeholder; longest first.
    fn normalizer(&self, agent: &AgentProcess) -> Normalizer {
        let mut n = Normalizer::default();
        n.literal(&agent.dir.display().to_string(), "<AGENT_DIR>");
        // `gpushare_build_info`'s commit label: only the value `--version` names is replaced, so
        // a label that lost or garbled it still differs from the golden file.
        n.literal(
            &format!("commit=\"{}\"", built_commit()),
            "commit=\"<COMMIT>\"",
        );
        for (name, (cg, p)) in [
            ("UNDER", &self.under),
            ("OVER", &self.over),
            ("PROTECTED", &self.protected),
            ("FREE", &self.free),
        ] {
            n.literal(cg.rel_path(), &format!("<CGROUP_{name}>"));
            n.pids.push((p.pid(), format!("<PID_{name}>")));
        }
        n
    }
}

/// Replacements of what varies between runs by named placeholders.
#[derive(Default)]
struct Normalizer {
    literals: Vec<(String, String)>,
    pids: Vec<(u32, String)>,
}

impl Normalizer {
    fn literal(&mut self, from: &str, to: &str) {
        self.literals.push((from.to_string(), to.to_string()));
        self.literals
            .sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    }

    /// Unique names, then pids (whole numbers only, never part of a longer number).
    fn names(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (from, to) in &self.literals {
            out = out.replace(from, to);
        }
        for (pid, to) in &self.pids {
            out = replace_whole_number(&out, &pid.to_string(), to);
        }
        out
    }

    /// Prometheus text: values of series that count time or the machine's activity.
    fn metrics(&self, text: &str) -> String {
        let lines: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with(PENDING_FREEZES) && !l.starts_with(EBPF_EVENTS))
            .map(|l| {
                if l.starts_with('#') {
                    return l.to_string();
                }
                let Some((series, _value)) = l.rsplit_once(' ') else {
                    return l.to_string();
                };
                let name = series.split('{').next().unwrap_or(series);
                let placeholder = match name {
                    // Observations: how long things took.
                    n if n.starts_with("gpushare_sample_duration_seconds_") => "<OBSERVED>",
                    "gpushare_enforcement_latency_seconds_bucket"
                    | "gpushare_enforcement_latency_seconds_sum" => "<OBSERVED>",
                    "gpushare_quota_config_last_reload_timestamp_seconds" => "<TIMESTAMP>",
                    // Counts of what every process on the machine did (other tests' GPU tasks
                    // included), not only the scenario's.
                    "gpushare_identity_checks_total" | "gpushare_attribution_work_total" => {
                        "<COUNT>"
                    }
                    _ => return l.to_string(),
                };
                format!("{series} {placeholder}")
            })
            .collect();
        self.names(&(lines.join("\n") + "\n"))
    }

    /// The state JSON, pretty-printed (keys in the agent's order), with times and counts of
    /// kernel events replaced.
    fn state_json(&self, text: &str) -> String {
        let text = drop_member(text, "\"freeze/pending\"");
        let pretty = pretty_json(&text, &|path, value| {
            let last = path.last().map(String::as_str);
            match last? {
                "taken_at_unix" | "quota_config_last_reload_unix" => Some("<TIMESTAMP>".into()),
                "state_for_secs" => Some("<DURATION>".into()),
                "ebpf_events" => Some("<EVENTS_BY_KIND>".into()),
                _ if path.len() >= 2
                    && ["identity", "attribution_work"]
                        .contains(&path[path.len() - 2].as_str()) =>
                {
                    value.parse::<u64>().ok().map(|_| "<COUNT>".into())
                }
                _ => None,
            }
        });
        self.names(&pretty)
    }

    /// The `status` table: the FOR column (time in the state) replaced.
    fn status_table(&self, text: &str) -> String {
        let mut in_workloads = false;
        let lines: Vec<String> = text
            .lines()
            .map(|l| {
                if l.starts_with("WORKLOAD ") {
                    in_workloads = true;
                    return l.to_string();
                }
                if !in_workloads || l.starts_with(' ') || l.starts_with('(') || l.is_empty() {
                    return l.to_string();
                }
                // Columns: WORKLOAD 28, GPU 6, USED 10, QUOTA 10, USE% 6, SM% 4, STATE 11, FOR 8.
                let chars: Vec<char> = l.chars().collect();
                let at = 28 + 1 + 6 + 1 + 10 + 1 + 10 + 1 + 6 + 1 + 4 + 1 + 11 + 1;
                if chars.len() < at + 8 {
                    return l.to_string();
                }
                let head: String = chars[..at].iter().collect();
                let tail: String = chars[at + 8..].iter().collect();
                format!("{head}{:>8}{tail}", "<FOR>")
            })
            .collect();
        self.names(&(lines.join("\n") + "\n"))
    }
}

/// The series of freezes the kernel had not settled when the agent first looked (a race).
const PENDING_FREEZES: &str =
    "gpushare_enforcement_actions_total{action=\"freeze\",result=\"pending\"} ";

/// The series of kernel events by kind: events of every GPU task on the machine (other tests'
/// included), so which kinds are there varies.
const EBPF_EVENTS: &str = "gpushare_ebpf_events_total{";

/// Compact JSON `text` without any object member `key` (quoted) whose value is a number.
fn drop_member(text: &str, key: &str) -> String {
    let mut text = text.to_string();
    while let Some(at) = text.find(&format!("{key}:")) {
        let value = at + key.len() + 1;
        let end = value
            + text[value..]
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(text.len() - value);
        text = if text[end..].starts_with(',') {
            format!("{}{}", &text[..at], &text[end + 1..])
        } else if text[..at].ends_with(',') {
            format!("{}{}", &text[..at - 1], &text[end..])
        } else {
            format!("{}{}", &text[..at], &text[end..])
        };
    }
    text
}

/// `text` with every occurrence of the decimal `number` that is a whole number (no digit or `.`
/// either side) replaced by `to`.
fn replace_whole_number(text: &str, number: &str, to: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    let mut from = 0;
    while let Some(i) = text[from..].find(number).map(|i| i + from) {
        let end = i + number.len();
        let part_of_number = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_digit() || *b == b'.');
        let before = i.checked_sub(1).and_then(|j| bytes.get(j));
        if !part_of_number(before) && !part_of_number(bytes.get(end)) {
            out.push_str(&text[last..i]);
            out.push_str(to);
            last = end;
        }
        from = end;
    }
    out.push_str(&text[last..]);
    out
}

/// Re-indents JSON text two spaces a level, keeping its keys in their order (a JSON value of
/// serde_json would sort them). `replace(path of keys, text of the value)` may return a
/// placeholder for a value (`[]` stands for an index in the path). Panics on text that is not
/// JSON.
fn pretty_json(text: &str, replace: &dyn Fn(&[String], &str) -> Option<String>) -> String {
    struct P<'a> {
        s: &'a [u8],
        i: usize,
        out: String,
        path: Vec<String>,
    }
    impl P<'_> {
        fn ws(&mut self) {
            while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
        }
        fn string(&mut self) -> String {
            let start = self.i;
            assert_eq!(self.s[self.i], b'"', "a string at {start}");
            self.i += 1;
            while self.s[self.i] != b'"' {
                self.i += if self.s[self.i] == b'\\' { 2 } else { 1 };
            }
            self.i += 1;
            String::from_utf8(self.s[start..self.i].to_vec()).unwrap()
        }
        fn indent(&mut self, depth: usize) {
            self.out.push('\n');
            self.out.push_str(&"  ".repeat(depth));
        }
        /// Moves past one value; its text.
        fn skip(&mut self) -> String {
            let start = self.i;
            let mut depth = 0;
            while self.i < self.s.len() {
                match self.s[self.i] {
                    b'"' => {
                        self.string();
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' if depth > 0 => depth -= 1,
                    b',' | b'}' | b']' if depth == 0 => break,
                    _ => {}
                }
                self.i += 1;
                if depth == 0 && matches!(self.s[self.i - 1], b'}' | b']') {
                    break;
                }
            }
            String::from_utf8(self.s[start..self.i].to_vec())
                .unwrap()
                .trim_end()
                .to_string()
        }
        fn value(&mut self, depth: usize, replace: &dyn Fn(&[String], &str) -> Option<String>) {
            self.ws();
            let start = self.i;
            let raw = self.skip();
            if let Some(v) = replace(&self.path, &raw) {
                self.out.push_str(&v);
                return;
            }
            self.i = start;
            match self.s[self.i] {
                open @ (b'{' | b'[') => {
                    let close = if open == b'{' { b'}' } else { b']' };
                    self.out.push(open as char);
                    self.i += 1;
                    self.ws();
                    if self.s[self.i] == close {
                        self.i += 1;
                        self.out.push(close as char);
                        return;
                    }
                    loop {
                        self.indent(depth + 1);
                        if open == b'{' {
                            self.ws();
                            let k = self.string();
                            self.out.push_str(&k);
                            self.out.push_str(": ");
                            self.ws();
                            assert_eq!(self.s[self.i], b':');
                            self.i += 1;
                            self.path.push(k.trim_matches('"').to_string());
                        } else {
                            self.path.push("[]".into());
                        }
                        self.value(depth + 1, replace);
                        self.path.pop();
                        self.ws();
                        match self.s[self.i] {
                            b',' => {
                                self.i += 1;
                                self.out.push(',');
                            }
                            c if c == close => {
                                self.i += 1;
                                self.indent(depth);
                                self.out.push(close as char);
                                return;
                            }
                            c => panic!("unexpected {:?} at {}", c as char, self.i),
                        }
                    }
                }
                _ => {
                    self.i = start;
                    self.out.push_str(&raw);
                    self.skip();
                }
            }
        }
    }
    let mut p = P {
        s: text.as_bytes(),
        i: 0,
        out: String::new(),
        path: Vec::new(),
    };
    p.value(0, replace);
    p.ws();
    assert_eq!(p.i, text.len(), "trailing text after the JSON value");
    p.out.push('\n');
    p.out
}

/// Compares `actual` with `tests/data/golden/<name>`, or rewrites it under `GPUSHARE_BLESS=1`.
/// On a difference, the actual text is left beside the test's temporary files to diff against.
fn check_golden(name: &str, actual: &str) {
    let path = golden_dir().join(name);
    if std::env::var("GPUSHARE_BLESS").as_deref() == Ok("1") {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with GPUSHARE_BLESS=1 to write it",
            path.display()
        )
    });
    if expected == actual {
        return;
    }
    let saved = std::env::temp_dir().join(format!("{name}.actual"));
    std::fs::write(&saved, actual).unwrap();
    let (exp, act): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let first = (0..exp.len().max(act.len()))
        .find(|&i| exp.get(i) != act.get(i))
        .unwrap_or(0);
    panic!(
        "{name} differs from {} at line {}:\n  golden: {:?}\n  actual: {:?}\n\
         (whole output in {}: `diff {} {}`; if the change is deliberate, rerun with \
         GPUSHARE_BLESS=1 and review the diff)",
        path.display(),
        first + 1,
        exp.get(first),
        act.get(first),
        saved.display(),
        path.display(),
        saved.display(),
    );
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden")
}

/// The commit `gpushare-agent --version` names: `gpushare-agent <version> (commit <commit>)`.
fn built_commit() -> String {
    let out = Command::new(gpushare_testkit::workspace_bin("gpushare-agent"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success(), "--version: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let prefix = format!("gpushare-agent {} (commit ", env!("CARGO_PKG_VERSION"));
    text.trim_end()
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("--version printed {text:?}, not {prefix}<commit>)"))
        .to_string()
}

/// `git` in this checkout: its trimmed stdout, or None outside a checkout (a source archive).
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `--version` names the commit the binary was built from (cargo reran build.rs when HEAD
/// moved), marked `-dirty` or not; `unknown` only outside a git checkout.
#[test]
fn the_version_names_the_commit_the_agent_was_built_from() {
    let commit = built_commit();
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(head) => {
            assert!(
                commit == head || commit == format!("{head}-dirty"),
                "--version names commit {commit:?}; HEAD is {head}"
            );
            assert_eq!(head.len(), 12, "{head}");
        }
        None => assert_eq!(commit, "unknown"),
    }
}

/// `gpushare-agent status [--json]` against `agent`: its stdout.
fn status(agent: &AgentProcess, json: bool) -> String {
    let mut cmd = Command::new(gpushare_testkit::workspace_bin("gpushare-agent"));
    cmd.arg("status").arg("--socket").arg(agent.socket());
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "status: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn golden_metrics_state_and_status_with_compat_hami() {
    if !require_root("golden_metrics_state_and_status_with_compat_hami") {
        return;
    }
    let f = Fixture::create("hami");
    // Per-process series too (off by default, as `golden_metrics_without_compat` pins).
    let agent = f.agent(&["--compat", "hami", "--process-metrics"]);
    let n = f.normalizer(&agent);
    let (code, metrics) = agent.get("/metrics");
    assert_eq!(code, 200);
    let (code, state) = agent.get_local("/api/v1/state");
    assert_eq!(code, 200);
    let status_json = status(&agent, true);
    let status_table = status(&agent, false);
    check_golden("metrics-compat-hami.prom", &n.metrics(&metrics));
    check_golden("state.json", &n.state_json(&state));
    check_golden("status.json", &n.state_json(&status_json));
    check_golden("status.txt", &n.status_table(&status_table));
}

#[test]
fn golden_metrics_without_compat() {
    if !require_root("golden_metrics_without_compat") {
        return;
    }
    let f = Fixture::create("plain");
    let agent = f.agent(&[]);
    let n = f.normalizer(&agent);
    let (code, metrics) = agent.get("/metrics");
    assert_eq!(code, 200);
    check_golden("metrics.prom", &n.metrics(&metrics));
}

#[test]
fn the_golden_normalizer_replaces_whole_numbers_and_keeps_key_order() {
    assert_eq!(
        replace_whole_number("pid=\"123\" 1234 0.123 123", "123", "<P>"),
        "pid=\"<P>\" 1234 0.123 <P>"
    );
    assert_eq!(
        drop_member(r#"{"a":{"x/p":2,"y":3},"b":{"z":1,"x/p":4}}"#, "\"x/p\""),
        r#"{"a":{"y":3},"b":{"z":1}}"#
    );
    let pretty = pretty_json(
        r#"{"b":1,"a":{"t":2.5,"x":[1,"s,]"]},"e":[],"o":{"p":[1]},"n":null}"#,
        &|path, _| {
            ["t", "o"]
                .contains(&path.last()?.as_str())
                .then(|| "<T>".into())
        },
    );
    assert_eq!(
        pretty,
        "{\n  \"b\": 1,\n  \"a\": {\n    \"t\": <T>,\n    \"x\": [\n      1,\n      \"s,]\"\n    ]\n  },\n  \"e\": [],\n  \"o\": <T>,\n  \"n\": null\n}\n"
    );
}
