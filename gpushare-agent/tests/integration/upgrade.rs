//! An upgrade across the key change of issue 20, with real agents: the agent built from the main
//! before issue 20 (commit d504d15, which keyed units by name and took a container identity
//! anywhere in a path) freezes and suspends workloads, is SIGKILLed, and today's agent starts on
//! its state directory. It must take them over under their new keys (`unit:///<path>`, a nested
//! container shown as its outer unit) and thaw or resume nothing still over quota, and still
//! release what is now within quota.
//!
//! The earlier agent is built by `cargo xtask test` (in `target/upgrade-base/`, once) and named in
//! [`UPGRADE_BASE_ENV`]; without it the test skips loudly (and fails where nothing may be skipped).

use std::{
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use gpushare_agent::client::{Endpoint, request};
use gpushare_testkit::{
    TestCgroup, agent_command, free_port,
    nvml::{Scenario, fake_nvml_lib},
    unique,
};
use serde_json::{Value, json};

use crate::suspend::{GIB, WAIT, cuda_args, cuda_state, scenario};
use crate::util::{
    AgentProcess, agent_dir, container_id, counter_value, needs_root, sleeping, workload,
};

/// The path of the agent built from d504d15 (set by `cargo xtask test`).
pub const UPGRADE_BASE_ENV: &str = "GPUSHARE_UPGRADE_BASE_AGENT";

/// The earlier agent's binary, or a loud skip (a failure where nothing may be skipped).
fn upgrade_base(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os(UPGRADE_BASE_ENV)
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    if found.is_none() {
        gpushare_testkit::skip::cannot_run(
            test,
            &format!(
                "{UPGRADE_BASE_ENV} does not name the agent built from d504d15 (`cargo xtask test` \
                 builds it into target/upgrade-base/ and sets it)"
            ),
        );
    }
    found
}

/// The earlier agent over `dir` (an [`agent_dir`]), in eBPF mode, with the mock NVML and libcuda;
/// SIGKILLed on drop. Its state is read as JSON: its schema is not today's.
struct EarlierAgent {
    child: Child,
    dir: PathBuf,
}

impl EarlierAgent {
    fn start(bin: &Path, dir: &Path, sc: &Scenario) -> Self {
        let log = std::fs::File::create(dir.join("earlier-agent.log")).unwrap();
        let child = agent_command(
            bin,
            Some(&fake_nvml_lib()),
            sc.path(),
            dir,
            &format!("127.0.0.1:{}", free_port()),
            "200ms",
        )
        .args(cuda_args())
        .env("RUST_LOG", "info,gpushare_agent=debug")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
        let a = Self {
            child,
            dir: dir.to_path_buf(),
        };
        let s = a.wait_for(|s| s["health"]["ready"] == json!(true));
        assert_eq!(
            s["health"]["attribution"],
            json!("ebpf"),
            "the earlier agent is not in eBPF mode\n{}",
            a.log()
        );
        a
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("earlier-agent.log")).unwrap_or_default()
    }

    fn state(&self) -> Option<Value> {
        let sock = self.dir.join("agent.sock");
        let (code, body) = request(&Endpoint::Unix(&sock), "GET", "/api/v1/state", None).ok()?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    fn wait_for(&self, mut cond: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(s) = self.state()
                && cond(&s)
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "the earlier agent never got there; state: {:?}\nlog:\n{}",
                self.state(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The state of workload `key`'s all-GPU row, as the earlier agent shows it.
    fn row_state(s: &Value, key: &str) -> Option<String> {
        s["workloads"].as_array()?.iter().find_map(|w| {
            (w["workload"] == json!(key) && w["gpu_uuid"] == json!("all"))
                .then(|| w["state"].as_str().unwrap_or_default().to_string())
        })
    }

    /// SIGKILL, no cleanup: the upgrade's crash (or a `kill -9` during a package upgrade).
    fn sigkill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EarlierAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn name(cg: &TestCgroup) -> String {
    cg.rel_path().rsplit('/').next().unwrap().to_string()
}

fn unit_key(cg: &TestCgroup) -> String {
    format!("unit://{}", cg.rel_path())
}

/// A group `child` below `parent` (a test cgroup).
fn below(parent: &TestCgroup, child: &str) -> TestCgroup {
    TestCgroup::create(&format!(
        "{}/{child}",
        parent.rel_path().trim_start_matches("/gpushare-test/")
    ))
    .unwrap()
}

/// The earlier agent (d504d15) suspends a unit, freezes a container nested in another unit,
/// suspends a container nested in a third, and freezes a fourth unit; it is SIGKILLed. While it is
/// down the fourth unit's usage falls within its quota. Today's agent, on the same state directory,
/// shows the first three under their units' new keys, still frozen or suspended (their processes
/// stay frozen and checkpointed all along), rewrites the ledger under the new keys, and thaws the
/// fourth.
#[test]
fn an_upgrade_from_the_agent_before_the_key_change_keeps_what_is_still_over_quota() {
    needs_root!("an_upgrade_from_the_agent_before_the_key_change");
    let Some(earlier) = upgrade_base("an_upgrade_from_the_agent_before_the_key_change") else {
        return;
    };
    let unit_s = TestCgroup::create(&format!("{}.service", unique("upg-susp"))).unwrap();
    let outer_f = TestCgroup::create(&format!("{}.service", unique("upg-outer"))).unwrap();
    let outer_s = TestCgroup::create(&format!("{}.service", unique("upg-outer-s"))).unwrap();
    let unit_f = TestCgroup::create(&format!("{}.service", unique("upg-fine"))).unwrap();
    let (id_f, id_s) = (container_id(), container_id());
    let nested_f = below(&outer_f, &format!("docker/{id_f}"));
    let nested_s = below(&outer_s, &format!("docker/{id_s}"));
    let ps = sleeping(&unit_s);
    let pnf = sleeping(&nested_f);
    let pns = sleeping(&nested_s);
    let pf = sleeping(&unit_f);
    // The earlier agent keys the nested containers by their ids (their `container` quotas); today's
    // keys them as their outer units (the `unit` quotas). Each by its own ladder.
    let entry = |selector: &str, value: &str, action: &str| {
        format!(
            "\n[[quota]]\n{selector} = \"{value}\"\ngpu_memory = \"2GiB\"\n\
             ladder = [ {{ action = \"{action}\" }} ]\n"
        )
    };
    let quotas = [
        "[defaults]\ngrace = \"0s\"\n".to_string(),
        entry("unit", &name(&unit_s), "suspend"),
        entry("container", &id_f, "freeze"),
        entry("unit", &name(&outer_f), "freeze"),
        entry("container", &id_s, "suspend"),
        entry("unit", &name(&outer_s), "suspend"),
        entry("unit", &name(&unit_f), "freeze"),
    ]
    .concat();
    let usage = |fine: u64| {
        scenario(
            &[
                (ps.pid(), 3 * GIB),
                (pnf.pid(), 3 * GIB),
                (pns.pid(), 3 * GIB),
                (pf.pid(), fine),
            ],
            json!({}),
        )
    };
    let sc = Scenario::create(&usage(3 * GIB)).unwrap();
    let dir = agent_dir(&quotas);
    let before = EarlierAgent::start(&earlier, &dir, &sc);
    let old_keys = [
        (format!("unit://{}", name(&unit_s)), "suspended"),
        (format!("docker://{id_f}"), "frozen"),
        (format!("docker://{id_s}"), "suspended"),
        (format!("unit://{}", name(&unit_f)), "frozen"),
    ];
    before.wait_for(|s| {
        old_keys
            .iter()
            .all(|(k, st)| EarlierAgent::row_state(s, k).as_deref() == Some(*st))
    });
    let old_ledger = std::fs::read_to_string(dir.join("state/freezes.json")).unwrap();
    for (k, _) in &old_keys {
        assert!(old_ledger.contains(k.as_str()), "{k} in {old_ledger}");
    }
    assert_eq!(cuda_state(&sc, ps.pid()), "checkpointed");
    assert_eq!(cuda_state(&sc, pns.pid()), "checkpointed");
    let earlier_log = before.log();
    before.sigkill();
    for cg in [&unit_s, &nested_f, &nested_s, &unit_f] {
        assert!(
            cg.is_frozen(),
            "{} frozen by the earlier agent",
            cg.rel_path()
        );
    }
    // While no agent runs, the fourth unit gives memory back.
    sc.write(&usage(GIB)).unwrap();

    let args = cuda_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = AgentProcess::start_in(dir, &sc, &args, "200ms");
    let why = || format!("{}\nearlier agent's log:\n{earlier_log}", agent.log());
    assert!(
        unit_f.wait_frozen(false),
        "within quota now: thawed\n{}",
        why()
    );
    let kept = [
        (unit_key(&unit_s), "suspended"),
        (unit_key(&outer_f), "frozen"),
        (unit_key(&outer_s), "suspended"),
    ];
    for (k, st) in &kept {
        agent.wait_state(k, st);
    }
    let s = agent.steps_over(Duration::from_secs(2), |s| {
        for (k, st) in &kept {
            let row = workload(s, k, "all");
            assert!(
                row.is_some_and(|r| r.state == *st),
                "{k}: {row:?}\n{}",
                why()
            );
        }
        for cg in [&unit_s, &nested_f, &nested_s] {
            assert!(cg.is_frozen(), "{} thawed\n{}", cg.rel_path(), why());
        }
        for p in [ps.pid(), pns.pid()] {
            assert_eq!(
                cuda_state(&sc, p),
                "checkpointed",
                "{p} restored\n{}",
                why()
            );
        }
    });
    assert_eq!(
        workload(&s, &unit_key(&outer_f), "all").unwrap().nested,
        vec![nested_f.rel_path().to_string()],
        "the nested container is shown as nested in its unit"
    );
    assert_eq!(
        workload(&s, &unit_key(&outer_s), "all")
            .unwrap()
            .suspended_bytes,
        3 * GIB,
        "the suspension's footprint is the earlier agent's record"
    );
    assert!(
        !s.workloads
            .iter()
            .any(|w| w.workload.starts_with("docker://")
                || old_keys.iter().any(|(k, _)| w.workload == *k)),
        "no workload under an earlier key: {:?}",
        s.workloads
    );
    assert!(
        workload(&s, &unit_key(&unit_f), "all").is_some_and(|r| r.state == "ok"),
        "{:?}",
        workload(&s, &unit_key(&unit_f), "all")
    );
    // Not even for a moment: a resume restores the footprint onto the GPU (and one suspended
    // again right after moves it twice), a thaw lets the workload run on.
    let log = agent.log();
    let acted: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("resuming ") || l.contains("thawed "))
        .filter(|l| !l.contains(unit_f.rel_path()))
        .collect();
    assert!(
        acted.is_empty(),
        "resumed or thawed while still over quota:\n{}\n{}",
        acted.join("\n"),
        why()
    );
    assert_eq!(
        counter_value(
            &agent.get("/metrics").1,
            "gpushare_resume_duration_seconds_count",
            ""
        ),
        0.0
    );
    let ledger = std::fs::read_to_string(agent.ledger()).unwrap();
    for (k, _) in &kept {
        assert!(ledger.contains(k.as_str()), "{k} not in {ledger}");
    }
    for (k, _) in &old_keys {
        assert!(
            !ledger.contains(&format!("\"{k}\"")),
            "{k} still in {ledger}"
        );
    }
    drop((ps, pnf, pns, pf));
}
