//! A group named after a REAL container, made by a tenant in its delegated unit (issue 20,
//! problem 1), never brings any action of the agent onto that container: the forged group climbs
//! its unit's ladder (signal, freeze, suspend, kill) and its unit gets the driver limit of the
//! unit's quota, while the real Docker container next to it (its own quota, its own GPU usage
//! within it) gets no signal, is never frozen or checkpointed, is never killed and keeps the
//! driver limit of its own quota only.
//!
//! Two shapes: `docker/<id>` after a container at Docker's place (`/docker/<id>`), and
//! `kubepods/pod<uid>/<id>` after a container the way a kubelet with Docker (cri-dockerd, cgroupfs
//! driver) places it (`--cgroup-parent /kubepods/pod<uid>`).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use gpushare_testkit::{
    TestCgroup,
    docker::{Container, require_docker},
    nvml::Scenario,
    unique,
};
use serde_json::json;

use crate::suspend::{GIB, cuda_args, cuda_state, driver_limit, scenario};
use crate::util::{AgentProcess, Reaped, pod_uid, usr1_recorder, workload};
use gpushare_agent::snapshot::Snapshot;

/// The real container's GPU (the one `suspend::scenario` makes) and the tenant's.
const GPU: &str = "GPU-susp";
const TENANT_GPU: &str = "GPU-tenant";

/// Every step of the ladder, fast: SIGUSR1 at once, then freeze, suspend and SIGKILL.
const LADDER: &str = "[defaults]\ngrace = \"0s\"\nladder = [ { action = \"signal\", signal = \"SIGUSR1\" },\n\
    { action = \"freeze\", after = \"1s\" },\n{ action = \"suspend\", after = \"2s\" },\n\
    { action = \"kill\", after = \"4s\" } ]\n";

/// What the victim's main process records: each signal it catches, one line in `/out/signals`.
const TRAPPER: &str = "for s in USR1 USR2 TERM INT HUP; do trap \"echo $s >> /out/signals\" $s; done; \
    : > /out/signals; while :; do sleep 0.2; done";

/// The shape the tenant forges.
enum Shape {
    /// `docker/<id>` after a container at `/docker/<id>`.
    Docker,
    /// `kubepods/pod<uid>/<id>` after a container at `/kubepods/pod<uid>/<id>`.
    Pod,
    /// `docker/<id>` after a container at `/docker/<id>` whose quota is in its environment
    /// (GPUShare's `ALIYUN_COM_GPU_MEM_CONTAINER`, Docker's record of it), with no file entry.
    DockerEnv,
}

/// Removes the kubelet-shaped parents Docker made for a `--cgroup-parent` (it leaves them), in
/// every hierarchy, where empty.
struct KubeParents(String);

impl Drop for KubeParents {
    fn drop(&mut self) {
        let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
            return;
        };
        for line in mounts.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2") {
                let root = Path::new(f[1]);
                let _ = std::fs::remove_dir(root.join("kubepods").join(&self.0));
                let _ = std::fs::remove_dir(root.join("kubepods"));
            }
        }
    }
}

fn forged_group_never_reaches_the_real_container(test: &str, shape: Shape) {
    let Some(dk) = require_docker(test) else {
        return;
    };
    let out = std::env::temp_dir().join(unique("gpushare-victim-out"));
    std::fs::create_dir_all(&out).unwrap();
    let mount = format!("{}:/out", out.display());
    let uid = pod_uid();
    let parent = format!("/kubepods/pod{uid}");
    let _kube = matches!(shape, Shape::Pod).then(|| KubeParents(format!("pod{uid}")));
    let mut args = vec!["-v", mount.as_str()];
    match shape {
        Shape::Pod => args.extend(["--cgroup-parent", parent.as_str()]),
        Shape::DockerEnv => args.extend(["-e", "ALIYUN_COM_GPU_MEM_CONTAINER=4"]),
        Shape::Docker => {}
    }
    let victim = Container::run(dk, "victim", &args, &["sh", "-c", TRAPPER]).unwrap();
    let vpid = victim.host_pid().unwrap();
    let vdir: PathBuf = victim.v2_dir().expect("the victim's v2 group").into();
    let vrel = victim.v2_rel_path().unwrap();
    let (expected, forged_rel, victim_quota) = match shape {
        Shape::Docker => (
            format!("/docker/{}", victim.id()),
            format!("docker/{}", victim.id()),
            format!(
                "\n[[quota]]\ncontainer = \"{}\"\ngpu_memory = \"4GiB\"\n",
                victim.id()
            ),
        ),
        Shape::DockerEnv => (
            format!("/docker/{}", victim.id()),
            format!("docker/{}", victim.id()),
            String::new(),
        ),
        Shape::Pod => (
            format!("{parent}/{}", victim.id()),
            format!("kubepods/pod{uid}/{}", victim.id()),
            format!("\n[[quota]]\npod_uid = \"{uid}\"\ngpu_memory = \"4GiB\"\n"),
        ),
    };
    assert_eq!(vrel, expected, "the victim is at its runtime's place");
    // Its trap is set (it has written its empty record) before anything can signal it.
    let signals = out.join("signals");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !signals.exists() {
        assert!(Instant::now() < deadline, "the victim never started");
        std::thread::sleep(Duration::from_millis(20));
    }

    let unit = TestCgroup::create(&format!("{}.service", unique("forger"))).unwrap();
    let forged = TestCgroup::create(&format!(
        "{}/{forged_rel}",
        unit.rel_path().trim_start_matches("/gpushare-test/")
    ))
    .unwrap();
    // The first container-shaped group below the unit is what `status` shows as nested.
    let nested = match shape {
        Shape::Docker | Shape::DockerEnv => forged.rel_path().to_string(),
        Shape::Pod => format!("{}/kubepods", unit.rel_path()),
    };
    let tenant_log = out.join("tenant-signals");
    let mut tenant = Reaped(forged.spawn(&mut usr1_recorder(&tenant_log)).unwrap());
    let tpid = tenant.pid();
    let unit_name = unit.rel_path().rsplit('/').next().unwrap().to_string();
    let unit_key = format!("unit://{}", unit.rel_path());
    let quotas = format!(
        "{LADDER}{victim_quota}\n[[quota]]\nunit = \"{unit_name}\"\ngpu_memory = \"2GiB\"\n"
    );
    // The tenant: 4 GiB, over its unit's 2 GiB; summed into the container's 1 GiB it would put
    // the container over its 4 GiB. On a GPU of its own: a workload's all-GPU quota is a driver
    // limit on each GPU it uses, so one merged with the tenant would be limited there too.
    let mut two_gpus = scenario(&[(vpid, GIB)], json!({}));
    let mut other = two_gpus["devices"][0].clone();
    other["uuid"] = json!(TENANT_GPU);
    other["compute_processes"] = json!([{ "pid": tpid, "used_memory": 4 * GIB }]);
    two_gpus["devices"].as_array_mut().unwrap().push(other);
    let sc = Scenario::create(&two_gpus).unwrap();
    let args = cuda_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = AgentProcess::start(&sc, &quotas, &args);

    // Whatever the agent does to the forged group, the victim must not see, at any step. Each
    // kind of violation is collected (and all are reported together), so that a broken identity
    // shows every action that reaches the real container.
    let mut violations = std::collections::BTreeSet::new();
    let check_victim = |s: Option<&Snapshot>, v: &mut std::collections::BTreeSet<String>| {
        let mut fail = |what: String| {
            v.insert(what);
        };
        match std::fs::read_to_string(vdir.join("cgroup.events")) {
            Ok(events) if events.lines().any(|l| l.trim() == "frozen 1") => {
                fail("the real container was frozen (v2)".into())
            }
            Ok(_) => {}
            Err(e) => fail(format!("the real container's group is gone: {e}")),
        }
        if let Some(state) = victim.v1_freezer_state()
            && state != "THAWED"
        {
            fail(format!("the real container's v1 freezer was {state}"));
        }
        if cuda_state(&sc, vpid) != "running" {
            fail(format!(
                "the real container was {} (mock libcuda)",
                cuda_state(&sc, vpid)
            ));
        }
        let caught = std::fs::read_to_string(&signals).unwrap_or_default();
        if !caught.is_empty() {
            fail(format!("the real container caught {caught:?}"));
        }
        if victim.host_pid().ok() != Some(vpid) {
            fail("the real container's process was killed".into());
        }
        match driver_limit(&sc, GPU, &vdir) {
            None | Some((0, 4_294_967_296)) => {}
            other => fail(format!(
                "the real container's driver limit was {other:?}, not its own quota's"
            )),
        }
        if let Some(l) = driver_limit(&sc, TENANT_GPU, &vdir) {
            fail(format!(
                "a driver limit on the real container on the tenant's GPU: {l:?}"
            ));
        }
        for gpu in [GPU, TENANT_GPU] {
            if let Some(l) = driver_limit(&sc, gpu, forged.dir()) {
                fail(format!("a driver limit on the forged group itself: {l:?}"));
            }
        }
        let Some(s) = s else { return };
        match s.processes.iter().find(|p| p.pid == vpid) {
            // A file quota's row is the all-GPU one, an environment quota's the GPU's.
            Some(p) => {
                match workload(s, &p.workload, "all").or_else(|| workload(s, &p.workload, GPU)) {
                    Some(row) => {
                        if (row.state.as_str(), row.used_bytes, row.quota_bytes)
                            != ("ok", GIB, Some(4 * GIB))
                            || row.cgroup_path != vrel
                        {
                            fail(format!(
                                "the real container's row: {} {} used {} quota {:?} at {}",
                                row.workload,
                                row.state,
                                row.used_bytes,
                                row.quota_bytes,
                                row.cgroup_path
                            ));
                        }
                    }
                    None => fail(format!("no row under its quota for {}", p.workload)),
                }
            }
            None => fail("the real container's process not listed".into()),
        }
        if let Some(p) = s.processes.iter().find(|p| p.pid == tpid)
            && p.workload != unit_key
        {
            fail(format!("the forged group's process in {}", p.workload));
        }
        if let Some(row) = workload(s, &unit_key, "all")
            && (row.quota_bytes != Some(2 * GIB)
                || row.nested != [nested.clone()]
                || !row.pod.is_empty()
                || !row.container_id.is_empty())
        {
            fail(format!("the unit's row: {row:?}"));
        }
        if let Some(row) = workload(s, &unit_key, TENANT_GPU)
            && (row.quota_bytes.is_some() || row.quota_source.contains("env"))
        {
            fail(format!("a quota on the unit's GPU row: {row:?}"));
        }
    };

    // The tenant's ladder runs to its end: signalled, frozen, suspended, killed.
    let (mut signalled, mut frozen, mut suspended, mut limited) = (false, false, false, false);
    let deadline = Instant::now() + Duration::from_secs(30);
    let killed = loop {
        let s = agent.wait_next_step();
        check_victim(Some(&s), &mut violations);
        signalled |= std::fs::read_to_string(&tenant_log).is_ok_and(|t| t.contains("USR1"));
        frozen |= unit.is_frozen();
        suspended |= cuda_state(&sc, tpid) == "checkpointed";
        limited |= driver_limit(&sc, TENANT_GPU, unit.dir()) == Some((0, 2 * GIB));
        if tenant.0.try_wait().unwrap().is_some() {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
    };
    if killed {
        agent.steps_over(Duration::from_secs(1), |s| {
            check_victim(Some(s), &mut violations)
        });
    }
    if !victim.responds() {
        violations.insert("the real container does not respond".into());
    }
    check_victim(None, &mut violations);
    assert!(
        violations.is_empty(),
        "actions reached the real container:\n  {}\n{}",
        violations.iter().cloned().collect::<Vec<_>>().join("\n  "),
        agent.log()
    );
    assert!(
        signalled && frozen && suspended && limited && killed,
        "each action reached the forged group's unit: signalled {signalled}, frozen {frozen}, \
         suspended {suspended}, limited {limited}, killed {killed}\n{}",
        agent.log()
    );
    assert_eq!(driver_limit(&sc, GPU, &vdir), Some((0, 4 * GIB)));
    drop(agent);
    drop(victim);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_docker_shaped_group_never_brings_an_action_onto_the_real_container() {
    forged_group_never_reaches_the_real_container(
        "a_docker_shaped_group_never_brings_an_action_onto_the_real_container",
        Shape::Docker,
    );
}

#[test]
fn a_pod_shaped_group_never_brings_an_action_onto_the_real_container() {
    forged_group_never_reaches_the_real_container(
        "a_pod_shaped_group_never_brings_an_action_onto_the_real_container",
        Shape::Pod,
    );
}

#[test]
fn a_docker_shaped_group_takes_no_environment_quota_from_the_real_container() {
    forged_group_never_reaches_the_real_container(
        "a_docker_shaped_group_takes_no_environment_quota_from_the_real_container",
        Shape::DockerEnv,
    );
}
