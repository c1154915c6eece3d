//! Real Docker containers end to end: the agent binary, the mock NVML reporting the containers' host
//! pids, a real `dockerd` (started by the testkit when none runs), the fake GPU program inside
//! containers opening a fake `/dev/nvidia0`, and real freezes of the containers' cgroups.
//!
//! Containers, the test image and a daemon the tests started are removed/stopped by the testkit's
//! guards, also when a test fails (see `gpushare_testkit::docker`).

use std::time::Duration;

use gpushare_agent::snapshot::{Snapshot, WorkloadView};
use gpushare_testkit::{
    docker::{Container, GpuContainer, require_docker},
    nvml::Scenario,
};
use serde_json::json;

use crate::util::{AgentProcess, workload};

const GIB: u64 = 1 << 30;
const GPU: &str = "GPU-docker";
const FAST: &str = "[defaults]\ngrace = \"200ms\"\nladder = [ { action = \"freeze\" } ]\n";
const WAIT: Duration = Duration::from_secs(15);

fn scenario(procs: &[(u32, u64)]) -> serde_json::Value {
    let list: Vec<_> = procs
        .iter()
        .map(|(pid, b)| json!({ "pid": pid, "used_memory": b }))
        .collect();
    json!({ "devices": [{ "uuid": GPU, "name": "NVIDIA Fake", "memory_total": 80 * GIB, "compute_processes": list }] })
}

/// The workload key the agent attributes `pid` to, if it lists the process.
fn key_of(s: &Snapshot, pid: u32) -> Option<&str> {
    s.processes
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| p.workload.as_str())
}

/// The container's row under its quota: the all-GPU row of a file quota, else (an environment
/// quota, which is per GPU) its row on the GPU.
fn row<'a>(s: &'a Snapshot, c: &Container) -> Option<&'a WorkloadView> {
    workload(s, &c.key(), "all").or_else(|| workload(s, &c.key(), GPU))
}

fn state_of(s: &Snapshot, c: &Container) -> String {
    row(s, c)
        .map(|w| w.state.clone())
        .unwrap_or_else(|| "absent".into())
}

/// The process's state letter in `/proc/<pid>/stat` (`S`, `R`, ...).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// `docker pause` still holds `c`: Docker says paused, and its freezer says frozen (the v1 freezer
/// where the host has one, as here; the v2 group on a pure cgroup v2 host).
fn assert_still_paused(c: &Container, when: &str) {
    assert!(c.is_paused().unwrap(), "{}: not paused {when}", c.name());
    match c.v1_freezer_state() {
        Some(state) => assert_eq!(state, "FROZEN", "{}: v1 freezer {when}", c.name()),
        None => assert!(c.is_v2_frozen(), "{}: v2 freezer {when}", c.name()),
    }
}

fn ledger_text(agent: &AgentProcess) -> String {
    std::fs::read_to_string(agent.ledger()).unwrap_or_default()
}

#[test]
fn docker_three_containers_share_a_gpu_each_attributed_only_the_offender_frozen_a_paused_one_left_paused()
 {
    let Some(dk) = require_docker("docker_three_containers_share_a_gpu") else {
        return;
    };
    let sc = Scenario::create(&scenario(&[])).unwrap();
    let mut agent = AgentProcess::start(&sc, FAST, &[]);
    // Started after the agent: the eBPF programs see each container open its /dev/nvidia0.
    let mut a = GpuContainer::attached(dk, "a", &[]).unwrap();
    let mut b = GpuContainer::attached(dk, "b", &[]).unwrap();
    let mut c = GpuContainer::attached(dk, "c", &[]).unwrap();
    for x in [&mut a, &mut b, &mut c] {
        x.command("alloc 2").unwrap();
        x.command("ioctl 3").unwrap();
    }
    // A and C are named by their container names, B by its id.
    agent.write_quotas(&format!(
        "{FAST}\n[[quota]]\ncontainer_name = \"{}\"\ngpu_memory = \"2GiB\"\n\n[[quota]]\ncontainer = \"{}\"\ngpu_memory = \"2GiB\"\n\n[[quota]]\ncontainer_name = \"{}\"\ngpu_memory = \"2GiB\"\n",
        a.name(),
        b.id(),
        c.name()
    ));
    sc.write(&scenario(&[(a.pid(), GIB), (b.pid(), GIB), (c.pid(), GIB)]))
        .unwrap();

    // Each host pid is attributed to its own container.
    let s = agent.wait_for(WAIT, |s| {
        [&a, &b, &c]
            .iter()
            .all(|x| key_of(s, x.pid()) == Some(x.key().as_str()))
            && workload(s, &b.key(), "all").is_some_and(|w| w.quota_bytes == Some(2 * GIB))
            // The kernel's ioctl counts are read at the start of a step: a task attributed during
            // the step shows them from the next one. (The agent is in eBPF mode: `AgentProcess`
            // checks it.)
            && [&a, &b, &c].iter().all(|x| {
                workload(s, &x.key(), GPU).is_some_and(|w| w.ioctls >= 5)
            })
    });
    assert_eq!(s.health.attribution, "ebpf");
    for x in [&a, &b, &c] {
        let w = workload(&s, &x.key(), GPU).unwrap_or_else(|| panic!("no row for {}", x.key()));
        assert_eq!(w.container_id, x.id());
        assert_eq!(w.pids, vec![x.pid()]);
        assert_eq!(w.used_bytes, GIB);
        assert_eq!(
            Some(w.cgroup_path.clone()),
            x.v2_rel_path(),
            "cgroup of {}",
            x.name()
        );
    }

    // Someone else pauses C (Docker's v1 freezer).
    c.pause().unwrap();
    assert!(c.is_paused().unwrap());

    // B (quota by id) grows past its quota: frozen; A keeps running; C stays paused, as it was.
    sc.write(&scenario(&[
        (a.pid(), GIB),
        (b.pid(), 3 * GIB),
        (c.pid(), GIB),
    ]))
    .unwrap();
    let s = agent.wait_for(WAIT, |s| state_of(s, &b) == "frozen");
    assert!(
        b.wait_v2_frozen(true, Duration::from_secs(5)),
        "{} cgroup.events: frozen 1",
        b.name()
    );
    assert!(ledger_text(&agent).contains(b.id()), "B's freeze recorded");
    assert!(
        !ledger_text(&agent).contains(c.id()),
        "C is not the agent's"
    );
    assert_ne!(state_of(&s, &a), "frozen");
    assert!(!a.is_v2_frozen());
    a.command("ioctl 1").unwrap();
    assert!(a.responds(), "A answers `docker exec true`");
    assert!(matches!(proc_state(a.pid()), Some('S' | 'R')));
    assert_still_paused(&c, "while B is frozen");

    // B back within quota: the agent thaws what it froze, and only that. C is still paused.
    sc.write(&scenario(&[(a.pid(), GIB), (b.pid(), GIB), (c.pid(), GIB)]))
        .unwrap();
    agent.wait_for(WAIT, |s| state_of(s, &b) == "ok");
    assert!(b.wait_v2_frozen(false, Duration::from_secs(5)));
    b.command("ioctl 1").unwrap();
    assert!(b.responds(), "B runs again");
    assert!(!ledger_text(&agent).contains(b.id()));
    assert_still_paused(&c, "after the agent thawed B");

    // Names: the agent knows each container's name (from the engine's config.v2.json) ...
    let s = agent.wait_for(WAIT, |s| {
        [&a, &b, &c]
            .iter()
            .all(|x| workload(s, &x.key(), GPU).is_some_and(|w| w.container == x.name()))
    });
    assert_eq!(
        workload(&s, &a.key(), "all").map(|w| w.quota_bytes),
        Some(Some(2 * GIB)),
        "A's quota (by name) applies"
    );
    assert!(
        agent.get("/metrics").1.contains(&format!(
            "container=\"{}\",container_id=\"{}\"",
            a.name(),
            a.id()
        )),
        "the container label names it"
    );
    // ... and A, whose quota names it by name, is frozen when it grows past it.
    sc.write(&scenario(&[
        (a.pid(), 3 * GIB),
        (b.pid(), GIB),
        (c.pid(), GIB),
    ]))
    .unwrap();
    agent.wait_for(WAIT, |s| state_of(s, &a) == "frozen");
    assert!(a.wait_v2_frozen(true, Duration::from_secs(5)));
    assert!(b.responds() && !b.is_v2_frozen());
    assert_still_paused(&c, "while A is frozen");

    // SIGTERM thaws what the agent froze (A); the paused container stays paused.
    assert_eq!(agent.stop(), Some(0));
    assert!(a.wait_v2_frozen(false, Duration::from_secs(5)));
    assert!(a.responds());
    assert_still_paused(&c, "after the agent thawed everything it froze on SIGTERM");
    assert!(!ledger_text(&agent).contains(c.id()));
}

#[test]
fn docker_env_quota_of_a_real_container_isolates_it_and_removal_while_frozen_leaves_nothing_behind()
{
    let Some(dk) = require_docker("docker_env_quota") else {
        return;
    };
    // GPUShare's variables, set by `docker run -e` (as its device plugin does); no file entry.
    let over =
        GpuContainer::attached(dk, "env-over", &["-e", "ALIYUN_COM_GPU_MEM_CONTAINER=1"]).unwrap();
    let mut under =
        GpuContainer::attached(dk, "env-under", &["-e", "ALIYUN_COM_GPU_MEM_CONTAINER=4"]).unwrap();
    let sc = Scenario::create(&scenario(&[(over.pid(), 2 * GIB), (under.pid(), 2 * GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, FAST, &[]);

    let s = agent.wait_for(WAIT, |s| state_of(s, &over) == "frozen");
    assert!(
        over.wait_v2_frozen(true, Duration::from_secs(5)),
        "2 GiB over a 1 GiB env quota: frozen"
    );
    let w = row(&s, &over).unwrap();
    assert_eq!(w.quota_bytes, Some(GIB), "{w:?}");
    assert!(w.quota_source.contains("env"), "{w:?}");
    assert_eq!(w.container_id, over.id());
    let w = row(&s, &under).unwrap();
    assert_eq!((w.state.as_str(), w.quota_bytes), ("ok", Some(4 * GIB)));
    assert!(!under.is_v2_frozen());
    under.command("alloc 1").unwrap();
    assert!(under.responds());
    assert!(ledger_text(&agent).contains(over.id()));
    assert!(agent.get("/metrics").1.contains(over.id()));

    // The frozen container is removed (its process dies, NVML stops listing it): no record, no
    // state and no series of it remain.
    let (over_id, over_pid, over_key) = (over.id().to_string(), over.pid(), over.key());
    let over_dir = over.v2_dir().map(|d| d.to_path_buf());
    drop(over);
    sc.write(&scenario(&[(under.pid(), 2 * GIB)])).unwrap();
    let s = agent.wait_for(WAIT, |s| {
        !s.workloads.iter().any(|w| w.workload == over_key)
            && key_of(s, over_pid).is_none()
            && !ledger_text(&agent).contains(&over_id)
    });
    assert!(over_dir.is_some_and(|d| !d.exists()), "cgroup gone");
    assert_eq!(row(&s, &under).map(|w| w.state.as_str()), Some("ok"));
    let metrics = agent.get("/metrics").1;
    assert!(
        !metrics.contains(&over_id),
        "no series of the removed container:\n{metrics}"
    );
    assert!(metrics.contains(under.id()));
    assert!(under.responds());
}

#[test]
fn docker_a_container_restarted_by_its_policy_keeps_its_identity_and_its_quota() {
    let Some(dk) = require_docker("docker_restart_policy") else {
        return;
    };
    let r = GpuContainer::detached(dk, "restart", &["--restart", "always"]).unwrap();
    let p1 = r.pid();
    let sc = Scenario::create(&scenario(&[(p1, GIB)])).unwrap();
    let quotas = format!(
        "{FAST}\n[[quota]]\ncontainer = \"{}\"\ngpu_memory = \"2GiB\"\n",
        &r.id()[..12]
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    agent.wait_for(WAIT, |s| {
        key_of(s, p1) == Some(r.key().as_str()) && state_of(s, &r) == "ok"
    });

    // Its process dies; Docker starts a new one in the same container.
    // SAFETY: kill(2) of the container's main process.
    assert_eq!(unsafe { libc::kill(p1 as i32, libc::SIGKILL) }, 0);
    let p2 = r.wait_new_pid(p1, Duration::from_secs(20)).unwrap();
    assert_ne!(p1, p2);
    assert!(
        r.inspect("{{.RestartCount}}")
            .unwrap()
            .parse::<u32>()
            .unwrap()
            >= 1
    );

    // The new pid is the same workload: attributed to the same key, under the same quota, which
    // still isolates it.
    sc.write(&scenario(&[(p2, 3 * GIB)])).unwrap();
    let s = agent.wait_for(WAIT, |s| {
        key_of(s, p2) == Some(r.key().as_str()) && state_of(s, &r) == "frozen"
    });
    assert!(key_of(&s, p1).is_none(), "the dead process is gone");
    let w = workload(&s, &r.key(), GPU).unwrap();
    assert_eq!(w.pids, vec![p2]);
    assert_eq!(w.container_id, r.id());
    assert_eq!(
        s.workloads
            .iter()
            .filter(|w| w.container_id == r.id())
            .map(|w| w.workload.as_str())
            .collect::<std::collections::BTreeSet<_>>(),
        [r.key().as_str()].into(),
        "one identity across the restart"
    );
    assert!(r.wait_v2_frozen(true, Duration::from_secs(5)));
}

/// `sh -c SCRIPT` in the test image: the entrypoint shell runs the fake GPU program as its child
/// (`; exit` keeps the shell from exec'ing it), with whatever environment the script gives it.
fn shell_entrypoint(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), format!("{script}; exit")]
}

const WORKER: &str = "/usr/local/bin/gpushare-fake-gpu-proc --device /dev/nvidia0";

#[test]
fn docker_env_quota_is_what_the_container_was_given_not_what_its_entrypoint_gives_its_worker() {
    let Some(dk) = require_docker("docker_env_quota_from_the_spec") else {
        return;
    };
    // Both started by GPUShare's device plugin with a 1 GiB request. The first entrypoint starts
    // its worker with the request rewritten to 100 GiB; the second adds a zero HAMi limit, which
    // used to shadow GPUShare's variables and remove the quota.
    let given = ["-e", "ALIYUN_COM_GPU_MEM_CONTAINER=1"];
    let tricks = [
        format!("ALIYUN_COM_GPU_MEM_CONTAINER=100 {WORKER}"),
        format!("CUDA_DEVICE_MEMORY_LIMIT=0 {WORKER}"),
    ];
    let containers: Vec<GpuContainer> = tricks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let cmd = shell_entrypoint(t);
            GpuContainer::attached_cmd(dk, &format!("trick{i}"), &given, &cmd).unwrap()
        })
        .collect();
    let workers: Vec<u32> = containers
        .iter()
        .map(|c| c.gpu_pid().expect("the worker holds the GPU"))
        .collect();
    for (c, w) in containers.iter().zip(&workers) {
        assert_ne!(*w, c.pid(), "the worker is the entrypoint's child");
        let environ = std::fs::read(format!("/proc/{w}/environ")).unwrap();
        let environ = String::from_utf8_lossy(&environ);
        assert!(
            environ.contains("ALIYUN_COM_GPU_MEM_CONTAINER=100")
                || environ.contains("CUDA_DEVICE_MEMORY_LIMIT=0"),
            "the trick is in the worker's environment: {environ}"
        );
    }
    let sc = Scenario::create(&scenario(&[(workers[0], 2 * GIB), (workers[1], 2 * GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, FAST, &[]);
    let s = agent.wait_for(WAIT, |s| {
        containers.iter().all(|c| state_of(s, c) == "frozen")
    });
    for c in &containers {
        assert!(
            c.wait_v2_frozen(true, Duration::from_secs(5)),
            "{}",
            c.name()
        );
        let w = row(&s, c).unwrap();
        assert_eq!(w.quota_bytes, Some(GIB), "the 1 GiB it was given: {w:?}");
        assert!(w.quota_source.contains("gpushare env"), "{w:?}");
    }
    let metrics = agent.get("/metrics").1;
    for c in &containers {
        assert!(
            metrics.lines().any(
                |l| l.starts_with("gpushare_workload_gpu_memory_quota_bytes{")
                    && l.contains(c.id())
                    && l.contains("quota_trust=\"runtime_spec\"")
            ),
            "the quota is labelled as read from the runtime spec:\n{metrics}"
        );
    }
}

#[test]
fn docker_env_quota_held_only_by_the_runtime_spec_is_enforced() {
    let Some(dk) = require_docker("docker_env_quota_only_in_the_spec") else {
        return;
    };
    // The entrypoint drops the variable before exec'ing the worker: no process of the container
    // has it in its environment; only the container's spec (config.v2.json, the bundle) does.
    let cmd = [
        "/bin/sh".to_string(),
        "-c".into(),
        format!("unset ALIYUN_COM_GPU_MEM_CONTAINER; exec {WORKER}"),
    ];
    let c = GpuContainer::attached_cmd(
        dk,
        "spec-only",
        &["-e", "ALIYUN_COM_GPU_MEM_CONTAINER=1"],
        &cmd,
    )
    .unwrap();
    let environ = std::fs::read(format!("/proc/{}/environ", c.pid())).unwrap();
    assert!(!String::from_utf8_lossy(&environ).contains("ALIYUN_COM_GPU_MEM"));
    let sc = Scenario::create(&scenario(&[(c.pid(), 2 * GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, FAST, &[]);
    let s = agent.wait_for(WAIT, |s| state_of(s, &c) == "frozen");
    assert!(c.wait_v2_frozen(true, Duration::from_secs(5)));
    assert_eq!(row(&s, &c).unwrap().quota_bytes, Some(GIB));
}

#[test]
fn docker_runtime_spec_from_the_engine_its_containerd_bundle_or_else_the_init() {
    use gpushare_agent::{
        attribution::{cgroupfs, parse_cgroup_path, workload::Runtime},
        grants::env_quotas::{
            EnvQuotaReader,
            runtime_spec::{SpecKind, SpecRoots, find_init, find_spec},
        },
        quota::{GpuInfo, GpuShareUnit, Trust},
    };
    let Some(dk) = require_docker("docker_runtime_spec_sources") else {
        return;
    };
    // Given 1 GiB; the entrypoint gives its worker 100.
    let cmd = shell_entrypoint(&format!("ALIYUN_COM_GPU_MEM_CONTAINER=100 {WORKER}"));
    let c = GpuContainer::attached_cmd(
        dk,
        "sources",
        &["-e", "ALIYUN_COM_GPU_MEM_CONTAINER=1"],
        &cmd,
    )
    .unwrap();
    let w = parse_cgroup_path(&c.v2_rel_path().unwrap());
    assert_eq!(w.container_id(), Some(c.id()));
    let v2 = cgroupfs::find_cgroup2_mount().unwrap();
    let gpus = [GpuInfo {
        index: 0,
        uuid: GPU.into(),
        memory_total: 80 * GIB,
        minor: Some(0),
    }];
    let quota = |roots: SpecRoots| {
        let (q, trust) = EnvQuotaReader::new(roots, v2.clone())
            .quota_for(&w, GpuShareUnit::GiB, &gpus)
            .expect("an env quota");
        (q.each_gpu, trust)
    };
    // The engine's config.v2.json.
    let system = SpecRoots::system();
    assert_eq!(
        find_spec(&system, Runtime::Docker, c.id()).map(|(k, _)| k),
        Some(SpecKind::DockerConfig)
    );
    assert_eq!(quota(system.clone()), (Some(GIB), Trust::RuntimeSpec));
    // Without Docker's data root: the OCI bundle of the engine's containerd (namespace moby).
    let no_docker = SpecRoots {
        docker_data_root: "/nonexistent-docker-root".into(),
        ..system.clone()
    };
    let (kind, path) = find_spec(&no_docker, Runtime::Docker, c.id())
        .expect("Docker's containerd keeps an OCI bundle for the container");
    assert_eq!(kind, SpecKind::OciBundle);
    assert!(
        path.to_string_lossy().contains("/moby/"),
        "{}",
        path.display()
    );
    assert_eq!(quota(no_docker), (Some(GIB), Trust::RuntimeSpec));
    // No spec at all: the container's init (the entrypoint shell, its pid namespace's 1), never the
    // worker that was given 100.
    let nothing = SpecRoots {
        docker_data_root: "/nonexistent-docker-root".into(),
        containerd_task_roots: Vec::new(),
        crio_container_roots: Vec::new(),
    };
    let init = find_init(c.v2_dir().unwrap()).unwrap();
    assert_eq!(init.pid, c.pid());
    assert_ne!(Some(init.pid), c.gpu_pid());
    assert_eq!(quota(nothing), (Some(GIB), Trust::InitEnviron));
}

/// Issue 22: real containers whose runtime spec carries the limit. The HAMi limit names, through
/// `CUDA_VISIBLE_DEVICES`, a GPU that does not exist (on main: no quota on the GPU in use, never
/// enforced); NVIDIA's and MPS's variables are read in their units; the device Docker gave
/// (`--device ...:/dev/nvidia0`, in `hostconfig.json`) is where the per-device limit lands.
#[test]
fn docker_limits_land_on_the_gpu_the_runtime_gave_in_every_schedulers_variables() {
    let Some(dk) = require_docker("docker_every_schedulers_grant") else {
        return;
    };
    let escape = GpuContainer::attached(
        dk,
        "hami-escape",
        &[
            "-e",
            "CUDA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000",
            "-e",
            "CUDA_DEVICE_MEMORY_LIMIT_0=1024m",
        ],
    )
    .unwrap();
    let nvidia = GpuContainer::attached(
        dk,
        "nv-limit",
        &[
            "-e",
            "NVIDIA_GPU_MEMORY_REQUEST=512",
            "-e",
            "NVIDIA_GPU_MEMORY_LIMIT=1024",
        ],
    )
    .unwrap();
    let mps = GpuContainer::attached(
        dk,
        "mps-under",
        &["-e", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4G"],
    )
    .unwrap();
    let sc = Scenario::create(&scenario(&[
        (escape.pid(), 3 * GIB),
        (nvidia.pid(), 2 * GIB),
        (mps.pid(), 2 * GIB),
    ]))
    .unwrap();
    let agent = AgentProcess::start(&sc, FAST, &[]);
    let s = agent.wait_for(WAIT, |s| {
        state_of(s, &escape) == "frozen" && state_of(s, &nvidia) == "frozen"
    });
    assert!(escape.wait_v2_frozen(true, Duration::from_secs(5)));
    assert!(nvidia.wait_v2_frozen(true, Duration::from_secs(5)));
    let w = row(&s, &escape).unwrap();
    assert_eq!(w.quota_bytes, Some(GIB), "{w:?}");
    assert!(w.quota_source.contains("hami env"), "{w:?}");
    let w = row(&s, &nvidia).unwrap();
    assert_eq!(w.quota_bytes, Some(GIB), "{w:?}");
    assert!(w.quota_source.contains("nvidia env"), "{w:?}");
    let w = row(&s, &mps).unwrap();
    assert_eq!(
        (w.state.as_str(), w.quota_bytes),
        ("ok", Some(4 * GIB)),
        "{w:?}"
    );
    assert!(!mps.is_v2_frozen());
    // The disagreement is shown and counted.
    let shown = gpushare_agent::status::render_status(&s);
    assert!(
        shown.contains(&escape.key()) && shown.contains("did not give"),
        "{shown}"
    );
    let metrics = agent.get("/metrics").1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gpushare_env_quota_disagreements_total{kind=\"not_granted\"}")),
        "{metrics}"
    );
}

/// Issue 41: a device node's number is its minor, not NVML's index (NVML's follows PCI order, the
/// minor the driver's). Here GPU 0 is /dev/nvidia1 and GPU 1 is /dev/nvidia0: a HAMi per-device
/// limit of the container given /dev/nvidia1 binds GPU 0, the one it uses, and the one given
/// /dev/nvidia0 is bounded on GPU 1. On main each limit bound the neighbour's GPU (the one whose
/// index is the node's number) and neither container was ever frozen.
#[test]
fn docker_a_device_node_binds_the_gpu_nvml_gives_its_minor_not_the_gpu_of_that_index() {
    let Some(dk) = require_docker("docker_device_minor_is_not_the_index") else {
        return;
    };
    let limit = ["-e", "CUDA_DEVICE_MEMORY_LIMIT_0=1024m"];
    let on1 = GpuContainer::attached_on(dk, "minor-1", "/dev/nvidia1", &limit).unwrap();
    let on0 = GpuContainer::attached_on(dk, "minor-0", "/dev/nvidia0", &limit).unwrap();
    let process = |pid: u32| json!([{ "pid": pid, "used_memory": 2 * GIB }]);
    let sc = Scenario::create(&json!({ "devices": [
        { "uuid": "GPU-minor-1", "name": "NVIDIA Fake", "memory_total": 80 * GIB, "minor": 1,
          "compute_processes": process(on1.pid()) },
        { "uuid": "GPU-minor-0", "name": "NVIDIA Fake", "memory_total": 80 * GIB, "minor": 0,
          "compute_processes": process(on0.pid()) },
    ] }))
    .unwrap();
    let agent = AgentProcess::start(&sc, FAST, &[]);
    let on = [(&on1, "GPU-minor-1"), (&on0, "GPU-minor-0")];
    let frozen = |s: &Snapshot| {
        on.iter()
            .all(|(c, gpu)| workload(s, &c.key(), gpu).is_some_and(|w| w.state == "frozen"))
    };
    let s = agent.wait_for(WAIT, frozen);
    for (c, gpu) in on {
        assert!(c.wait_v2_frozen(true, Duration::from_secs(5)));
        let w = workload(&s, &c.key(), gpu).unwrap();
        assert_eq!(w.quota_bytes, Some(GIB), "{w:?}");
        assert!(w.quota_source.contains("hami env"), "{w:?}");
    }
}

/// Issue 41: MPS limits by GPU UUID, NVIDIA's recommended spelling, read from real containers'
/// runtime specs: `GPU-<uuid>=1G` naming the container's GPU bounds it (frozen at 2 GiB); one that
/// names a GPU this node does not have makes MPS drop every pinned limit, so it grants nothing and
/// is said (`mps_dropped`), the container left alone. (On main: the UUID form was malformed, ignored
/// in both.)
#[test]
fn docker_mps_limits_by_gpu_uuid_and_a_limit_mps_would_drop() {
    let Some(dk) = require_docker("docker_mps_limits_by_gpu_uuid") else {
        return;
    };
    let by_uuid = GpuContainer::attached(
        dk,
        "mps-uuid",
        &["-e", &format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={GPU}=1G")],
    )
    .unwrap();
    let dropped = GpuContainer::attached(
        dk,
        "mps-dropped",
        &[
            "-e",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G,GPU-7a0e4c1b-elsewhere=1G",
        ],
    )
    .unwrap();
    let sc = Scenario::create(&scenario(&[
        (by_uuid.pid(), 2 * GIB),
        (dropped.pid(), 2 * GIB),
    ]))
    .unwrap();
    let agent = AgentProcess::start(&sc, FAST, &[]);
    let s = agent.wait_for(WAIT, |s| state_of(s, &by_uuid) == "frozen");
    assert!(by_uuid.wait_v2_frozen(true, Duration::from_secs(5)));
    let w = row(&s, &by_uuid).unwrap();
    assert_eq!(w.quota_bytes, Some(GIB), "{w:?}");
    assert!(w.quota_source.contains("mps env"), "{w:?}");
    for _ in 0..3 {
        agent.wait_next_step();
    }
    let s = agent.wait_next_step();
    let w = row(&s, &dropped);
    assert!(
        w.is_none_or(|w| w.quota_bytes.is_none() && w.state == "ok"),
        "{w:?}"
    );
    assert!(!dropped.is_v2_frozen());
    let metrics = agent.get("/metrics").1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gpushare_env_quota_disagreements_total{kind=\"mps_dropped\"}")),
        "{metrics}"
    );
    assert!(
        agent.log().contains("MPS drops every pinned limit"),
        "{}",
        agent.log()
    );
}
