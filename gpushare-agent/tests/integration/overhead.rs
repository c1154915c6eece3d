//! The driver's own memory (a CUDA context per process, KAI-Scheduler #2212) is allowed beyond
//! every quota once per workload and GPU: learned from the smallest processes seen on the GPU's
//! model, or set in the quota file, and shown beside the quotas.

use std::time::Duration;

use gpushare_testkit::nvml::Scenario;

use crate::util::{
    AgentProcess, Reaped, cgroup_quota, key, needs_root, one_gpu, sleeping, sleeping_group,
    workload,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const FREEZE: &str = "[defaults]\ngrace = \"0s\"\nladder = [ { action = \"freeze\" } ]\n";
const WAIT: Duration = Duration::from_secs(10);

#[test]
fn a_workload_within_its_quota_and_one_context_is_left_and_one_past_it_is_frozen() {
    needs_root!("a_workload_within_its_quota_and_one_context_is_left");
    // Three bare contexts (300, 310 and 320 MiB) in a group no quota names: the model's context
    // is learned as 300 MiB.
    let (bare, first) = sleeping_group("ovh-bare");
    let more: Vec<Reaped> = (0..2).map(|_| sleeping(&bare)).collect();
    let (within, w) = sleeping_group("ovh-within");
    let (past, p) = sleeping_group("ovh-past");
    // `within`: its 2 GiB and 250 MiB of context. `past`: 2 GiB and 400 MiB, more than one
    // context. Without the allowance both are over their 2 GiB quota.
    let procs = [
        (first.pid(), 300 * MIB),
        (more[0].pid(), 310 * MIB),
        (more[1].pid(), 320 * MIB),
        (w.pid(), 2 * GIB + 250 * MIB),
        (p.pid(), 2 * GIB + 400 * MIB),
    ];
    let sc = Scenario::create(&one_gpu(&procs)).unwrap();
    let quotas = format!(
        "{FREEZE}{}{}",
        cgroup_quota(&within, "2GiB"),
        cgroup_quota(&past, "2GiB")
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let s = agent.wait_state(&key(&past), "frozen");
    assert!(past.wait_frozen(true), "{}", agent.log());
    let gpu = &s.gpus[0];
    assert_eq!(
        (
            gpu.context_overhead_bytes,
            gpu.context_overhead_source.as_str()
        ),
        (300 * MIB, "learned")
    );
    assert_eq!(workload(&s, &key(&within), "all").unwrap().state, "ok");
    assert!(!within.is_frozen());
    // A few more steps: still left alone.
    std::thread::sleep(Duration::from_millis(600));
    let s = agent.state().unwrap();
    assert_eq!(workload(&s, &key(&within), "all").unwrap().state, "ok");
    assert!(!within.is_frozen() && !bare.is_frozen());
    let metrics = agent.get("/metrics").1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gpushare_gpu_context_overhead_bytes{")
                && l.contains("source=\"learned\"")
                && l.ends_with(&format!(" {}.0", 300 * MIB))),
        "{metrics}"
    );
    let out = std::process::Command::new(gpushare_testkit::workspace_bin("gpushare-agent"))
        .arg("status")
        .arg("--socket")
        .arg(agent.socket())
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("300.0 MiB learned"), "{status}");

    // The operator sets it: 512 MiB on this model; `past` is now within and thawed.
    agent.write_quotas(&format!(
        "{FREEZE}context_overhead = {{ \"NVIDIA Fake\" = \"512MiB\" }}\n{}{}",
        cgroup_quota(&within, "2GiB"),
        cgroup_quota(&past, "2GiB")
    ));
    let s = agent.wait_for(WAIT, |s| {
        workload(s, &key(&past), "all").is_some_and(|w| w.state == "ok")
    });
    assert_eq!(
        (
            s.gpus[0].context_overhead_bytes,
            s.gpus[0].context_overhead_source.as_str()
        ),
        (512 * MIB, "set")
    );
    assert!(past.wait_frozen(false), "{}", agent.log());

    // And none: the driver's memory counts against the quota again; both are frozen.
    agent.write_quotas(&format!(
        "{FREEZE}context_overhead = \"none\"\n{}{}",
        cgroup_quota(&within, "2GiB"),
        cgroup_quota(&past, "2GiB")
    ));
    agent.wait_state(&key(&within), "frozen");
    agent.wait_state(&key(&past), "frozen");
    drop((first, more, w, p));
}
