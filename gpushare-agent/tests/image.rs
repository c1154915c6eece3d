//! The agent's container image (`cargo xtask image`, target/image/gpushare-agent-<version>.tar),
//! loaded into a real Docker engine and run the way deploy/kubernetes/daemonset.yaml runs it.
//!
//! - [`image_runs_as_the_daemonset_runs_it_attributes_another_containers_gpu_process_freezes_it_and_thaws_it_on_sigterm`]:
//!   `docker run` with the DaemonSet's own settings, read from the manifest (security context and
//!   capabilities, host PID, host network or none, every volume mount, environment, resource
//!   limits, arguments, the grace period of `docker stop`), the mock libnvidia-ml bind-mounted
//!   where the NVIDIA container runtime puts the real one (the agent finds it by its soname, as on
//!   a node), then a GPU process in another container (the testkit's busybox image, a fake
//!   `/dev/nvidia0`): the agent in the image reports eBPF mode, attributes the process to that
//!   container, freezes it over its quota, and thaws it when `docker stop` sends SIGTERM.
//!   Host paths under /sys are the host's own; the others (state, run, logs, runtime bundles) are
//!   rebased under a private directory, so the test takes no host lock and leaves no file.
//! - [`image_runtime_set_loads_a_library_linking_libdl_libpthread_librt_libm_libstdcxx_libgcc_s`]:
//!   a C++ library compiled here (g++) and linked with libdl, libpthread, librt, libm and libstdc++ resolves
//!   in the image (`ld.so --list`) and runs there (`LD_PRELOAD` into the agent: threads, a clock,
//!   `dlopen`, `sqrt`, a C++ exception): what NVIDIA's libraries need of the image.
//!
//! The archive must be built first: `cargo xtask test` builds it before the tests; without it the
//! tests skip loudly (fail under `GPUSHARE_REQUIRE=1`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
    time::{Duration, Instant},
};

use gpushare_agent::snapshot::Snapshot;
use gpushare_testkit::{
    docker::{Docker, GpuContainer, OWNER_LABEL, docker, require_docker, run_timeout},
    nvml::{SCENARIO_ENV, Scenario, fake_nvml_lib},
    skip, temp_dir, unique,
};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;
const GPU: &str = "GPU-image";
const WAIT: Duration = Duration::from_secs(30);
const FAST: &str = "[defaults]\ngrace = \"200ms\"\nladder = [ { action = \"freeze\" } ]\n";
/// Where the NVIDIA container runtime puts libnvidia-ml in a Debian-layout image.
const NVML_IN_IMAGE: &str = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";
const SCENARIO_IN_IMAGE: &str = "/run/gpushare-fake-nvml";

fn archive() -> PathBuf {
    gpushare_testkit::workspace_root().join(format!(
        "target/image/gpushare-agent-{}.tar",
        env!("CARGO_PKG_VERSION")
    ))
}

/// Tests of this process using the loaded image; the last one removes it.
static USERS: Mutex<usize> = Mutex::new(0);

/// The image loaded into Docker (`docker load`) for one test; removed when the last test of
/// this process using it is done.
struct Image {
    reference: String,
}

impl Image {
    /// Docker and the loaded image, or a loud skip (a failure under `GPUSHARE_REQUIRE=1`).
    fn load(test: &str) -> Option<(&'static Docker, Self)> {
        let dk = require_docker(test)?;
        let path = archive();
        if !path.is_file() {
            skip::cannot_run(
                test,
                &format!(
                    "no image archive at {}; build it with `cargo xtask image` (`cargo xtask test` does)",
                    path.display()
                ),
            );
            return None;
        }
        let mut users = USERS.lock().unwrap_or_else(|e| e.into_inner());
        let out = docker(&["load", "-i", path.to_str().unwrap()]).expect("docker load");
        *users += 1;
        let reference = out
            .lines()
            .find_map(|l| l.strip_prefix("Loaded image: "))
            .unwrap_or_else(|| panic!("docker load named no image: {out}"))
            .trim()
            .to_string();
        assert_eq!(
            reference,
            format!("gpushare-agent:{}", env!("CARGO_PKG_VERSION")),
            "the tag the archive carries"
        );
        Some((dk, Self { reference }))
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let mut users = USERS.lock().unwrap_or_else(|e| e.into_inner());
        *users -= 1;
        if *users == 0 {
            let _ = docker(&["rmi", &self.reference]);
        }
    }
}

/// A container removed (`docker rm -f`) on drop.
struct Removed(String);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = run_timeout(
            Command::new("docker").args(["rm", "-f", "-v", &self.0]),
            Duration::from_secs(60),
        );
    }
}

/// How `docker run` runs the DaemonSet's container: everything the manifest says that Docker can
/// express. Panics on settings it does not know, so a manifest change is never silently ignored.
struct PodSettings {
    image: String,
    run_args: Vec<String>,
    args: Vec<String>,
    grace_secs: u64,
    /// The container path of the ConfigMap `gpushare-quotas`.
    config_mount: String,
}

fn daemonset() -> Value {
    let path = gpushare_testkit::workspace_root().join("deploy/kubernetes/daemonset.yaml");
    serde_yaml_ng::from_str(&fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn str_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("not a scalar: {other}"),
    }
}

/// Kubernetes quantities Docker takes: memory (`256Mi`, `1Gi`) and CPU (`500m`, `2`).
fn docker_memory(q: &str) -> String {
    for (suffix, unit) in [("Ki", "k"), ("Mi", "m"), ("Gi", "g")] {
        if let Some(n) = q.strip_suffix(suffix) {
            return format!("{n}{unit}");
        }
    }
    q.to_string()
}

fn docker_cpus(q: &str) -> String {
    match q.strip_suffix('m') {
        Some(milli) => format!("{}", milli.parse::<f64>().unwrap() / 1000.0),
        None => q.to_string(),
    }
}

/// Reads the DaemonSet. Host paths under /sys are used as they are; the others are rebased under
/// `host_root` (created there as `DirectoryOrCreate` would); the ConfigMap is `config_dir`.
fn pod_settings(host_root: &Path, config_dir: &Path) -> PodSettings {
    let ds = daemonset();
    let pod = &ds["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "one container");
    let c = &containers[0];
    let mut run = Vec::new();
    if pod["hostPID"] == json!(true) {
        run.push("--pid=host".into());
    }
    run.push(if pod["hostNetwork"] == json!(true) {
        "--network=host".into()
    } else {
        // A pod network Docker here does not have (--bridge=none): only loopback, which is all
        // the test needs (it asks the agent from inside its container).
        "--network=none".into()
    });
    let annotations = ds["spec"]["template"]["metadata"]["annotations"].clone();
    let apparmor = format!(
        "container.apparmor.security.beta.kubernetes.io/{}",
        str_of(&c["name"])
    );
    if let Some(profile) = annotations.get(&apparmor) {
        assert_eq!(profile, &json!("unconfined"), "{apparmor}");
        run.push("--security-opt=apparmor=unconfined".into());
    }
    let sc = c["securityContext"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (k, v) in &sc {
        match k.as_str() {
            "privileged" if v == &json!(true) => run.push("--privileged".into()),
            "privileged" => {}
            "runAsUser" => run.push(format!("--user={}", str_of(v))),
            "readOnlyRootFilesystem" if v == &json!(true) => run.push("--read-only".into()),
            "readOnlyRootFilesystem" => {}
            "allowPrivilegeEscalation" if v == &json!(false) => {
                run.push("--security-opt=no-new-privileges".into())
            }
            "allowPrivilegeEscalation" => {}
            "capabilities" => {
                for cap in v["add"].as_array().into_iter().flatten() {
                    run.push(format!("--cap-add={}", str_of(cap)));
                }
                for cap in v["drop"].as_array().into_iter().flatten() {
                    run.push(format!("--cap-drop={}", str_of(cap)));
                }
            }
            "seccompProfile" if v["type"] == json!("Unconfined") => {
                run.push("--security-opt=seccomp=unconfined".into())
            }
            other => panic!("securityContext.{other} = {v}: the test cannot express it in Docker"),
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        // The downward API: only the node's name is known to the test (a name of its own).
        let value = match e.get("valueFrom") {
            None => str_of(&e["value"]),
            Some(v) if v["fieldRef"]["fieldPath"] == json!("spec.nodeName") => {
                TEST_NODE_NAME.to_string()
            }
            Some(v) => panic!("env {e}: valueFrom {v}: the test cannot express it in Docker"),
        };
        run.push(format!("--env={}={value}", str_of(&e["name"])));
    }
    let limits = &c["resources"]["limits"];
    if let Some(m) = limits.get("memory") {
        run.push(format!("--memory={}", docker_memory(&str_of(m))));
    }
    if let Some(cpu) = limits.get("cpu") {
        run.push(format!("--cpus={}", docker_cpus(&str_of(cpu))));
    }
    let volumes = pod["volumes"].as_array().unwrap();
    let mut config_mount = None;
    for m in c["volumeMounts"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let target = m["mountPath"].as_str().unwrap();
        let v = volumes
            .iter()
            .find(|v| v["name"] == json!(name))
            .unwrap_or_else(|| panic!("volume {name} is not defined"));
        let source = if let Some(hp) = v.get("hostPath") {
            let path = hp["path"].as_str().unwrap();
            let ty = hp.get("type").and_then(Value::as_str).unwrap_or("");
            let source = if path == "/sys" || path.starts_with("/sys/") {
                PathBuf::from(path)
            } else {
                host_root.join(path.trim_start_matches('/'))
            };
            match ty {
                "Directory" => assert!(
                    source.is_dir(),
                    "hostPath {path} (type Directory) does not exist here"
                ),
                "DirectoryOrCreate" => fs::create_dir_all(&source).unwrap(),
                other => panic!("hostPath type {other:?} of {name}"),
            }
            source
        } else if let Some(cm) = v.get("configMap") {
            assert_eq!(cm["name"], json!("gpushare-quotas"));
            config_mount = Some(target.to_string());
            config_dir.to_path_buf()
        } else {
            panic!("volume {name}: only hostPath and configMap are known to the test: {v}");
        };
        let ro = if m["readOnly"] == json!(true) {
            ",readonly"
        } else {
            ""
        };
        run.push(format!(
            "--mount=type=bind,source={},target={target}{ro}",
            source.display()
        ));
    }
    PodSettings {
        image: c["image"].as_str().unwrap().to_string(),
        run_args: run,
        args: c["args"].as_array().unwrap().iter().map(str_of).collect(),
        grace_secs: pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30),
        config_mount: config_mount.expect("the ConfigMap is mounted"),
    }
}

fn scenario(procs: &[(u32, u64)]) -> Value {
    let list: Vec<_> = procs
        .iter()
        .map(|(pid, b)| json!({ "pid": pid, "used_memory": b }))
        .collect();
    json!({ "devices": [{ "uuid": GPU, "name": "NVIDIA Fake", "memory_total": 80 * GIB, "compute_processes": list }] })
}

/// What `spec.nodeName` is for the DaemonSet's pod in this test.
const TEST_NODE_NAME: &str = "gpushare-image-test-node";

/// Replaces `dir/quotas.toml` atomically, as the kubelet updates a ConfigMap.
fn write_quotas(dir: &Path, text: &str) {
    let tmp = dir.join(".quotas.toml.tmp");
    fs::write(&tmp, text).unwrap();
    fs::rename(&tmp, dir.join("quotas.toml")).unwrap();
}

/// The agent in its container.
struct Agent {
    name: String,
    _guard: Removed,
}

impl Agent {
    /// `gpushare-agent status --json` inside the container (the image's own client).
    fn state(&self) -> Result<Snapshot, String> {
        let out = run_timeout(
            Command::new("docker").args(["exec", &self.name, "gpushare-agent", "status", "--json"]),
            Duration::from_secs(20),
        )
        .map_err(|e| format!("{e:#}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}"))
    }

    fn logs(&self) -> String {
        run_timeout(
            Command::new("docker").args(["logs", "--tail", "60", &self.name]),
            Duration::from_secs(20),
        )
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_default()
    }

    /// Polls the state until `pred` holds; panics with the last state and the agent's log.
    fn wait_for(&self, what: &str, pred: impl Fn(&Snapshot) -> bool) -> Snapshot {
        let deadline = Instant::now() + WAIT;
        let mut last = Err("not asked yet".to_string());
        while Instant::now() < deadline {
            last = self.state();
            if let Ok(s) = &last
                && pred(s)
            {
                return last.unwrap();
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!(
            "{what}: not within {WAIT:?}; last state: {last:#?}\nagent log:\n{}",
            self.logs()
        );
    }
}

fn state_of(s: &Snapshot, key: &str) -> String {
    s.workloads
        .iter()
        .find(|w| w.workload == key && w.gpu_uuid == "all")
        .map_or_else(|| "absent".into(), |w| w.state.clone())
}

#[test]
fn image_runs_as_the_daemonset_runs_it_attributes_another_containers_gpu_process_freezes_it_and_thaws_it_on_sigterm()
 {
    let test = "image_runs_as_the_daemonset_runs_it";
    let Some((dk, image)) = Image::load(test) else {
        return;
    };
    let host = temp_dir("gpushare-image-host-");
    let config = temp_dir("gpushare-image-config-");
    write_quotas(config.path(), FAST);
    let pod = pod_settings(host.path(), config.path());
    assert_eq!(
        pod.image, image.reference,
        "the DaemonSet runs the built image"
    );
    assert!(
        pod.args
            .windows(2)
            .any(|w| w[0] == "--quotas" && w[1].starts_with(&pod.config_mount)),
        "the agent reads the ConfigMap: {:?}",
        pod.args
    );

    let sc = Scenario::create(&scenario(&[])).unwrap();
    let name = unique("gpushare-test-image-agent");
    let guard = Removed(name.clone());
    let mut cmd = Command::new("docker");
    cmd.args(["run", "-d", "--name", &name, "--label"])
        .arg(format!("{OWNER_LABEL}={}", std::process::id()))
        .args(&pod.run_args)
        // What the NVIDIA container runtime would inject: libnvidia-ml (the mock), by its soname.
        .arg(format!(
            "--mount=type=bind,source={},target={NVML_IN_IMAGE},readonly",
            fake_nvml_lib().display()
        ))
        .arg(format!(
            "--mount=type=bind,source={},target={SCENARIO_IN_IMAGE}",
            sc.dir().display()
        ))
        .arg(format!(
            "--env={SCENARIO_ENV}={SCENARIO_IN_IMAGE}/scenario.json"
        ))
        .arg(&pod.image)
        .args(&pod.args);
    let out = run_timeout(&mut cmd, Duration::from_secs(60)).unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let agent = Agent {
        name,
        _guard: guard,
    };
    let s = agent.wait_for("the agent ready", |s| s.health.ready);
    assert_eq!(s.health.attribution, "ebpf", "eBPF mode in the container");
    assert_eq!(s.version, env!("CARGO_PKG_VERSION"));

    // Another container on the host opens its GPU (after the agent: eBPF sees the open) and
    // issues ioctls.
    let mut w = GpuContainer::attached(dk, "image-workload", &[]).unwrap();
    w.command("alloc 1").unwrap();
    w.command("ioctl 3").unwrap();
    write_quotas(
        config.path(),
        &format!(
            "{FAST}\n[[quota]]\ncontainer = \"{}\"\ngpu_memory = \"2GiB\"\n",
            w.id()
        ),
    );
    sc.write(&scenario(&[(w.pid(), GIB)])).unwrap();
    let key = w.key();
    let s = agent.wait_for(
        "the workload's GPU process attributed to its container",
        |s| {
            s.processes
                .iter()
                .any(|p| p.pid == w.pid() && p.workload == key)
                && s.workloads.iter().any(|r| {
                    r.workload == key && r.gpu_uuid == GPU && r.ioctls >= 3 && r.used_bytes == GIB
                })
                && s.workloads
                    .iter()
                    .any(|r| r.workload == key && r.quota_bytes == Some(2 * GIB))
        },
    );
    let row = s
        .workloads
        .iter()
        .find(|r| r.workload == key && r.gpu_uuid == GPU)
        .unwrap();
    assert_eq!(row.container_id, w.id());
    assert_eq!(row.pids, vec![w.pid()]);
    assert_eq!(Some(row.cgroup_path.clone()), w.v2_rel_path());
    assert_eq!(s.health.attribution, "ebpf");

    // Over its quota: frozen (the kernel says so).
    sc.write(&scenario(&[(w.pid(), 3 * GIB)])).unwrap();
    agent.wait_for("the workload frozen", |s| state_of(s, &key) == "frozen");
    assert!(
        w.wait_v2_frozen(true, Duration::from_secs(5)),
        "{}: cgroup.events says frozen 1",
        w.name()
    );
    let ledger = host.path().join("var/lib/gpushare/freezes.json");
    assert!(
        fs::read_to_string(&ledger).is_ok_and(|l| l.contains(w.id())),
        "the freeze is in the ledger on the host path"
    );

    // `docker stop` (SIGTERM, the pod's grace period): the agent thaws it and exits 0.
    let stop = run_timeout(
        Command::new("docker").args(["stop", "-t", &pod.grace_secs.to_string(), &agent.name]),
        Duration::from_secs(pod.grace_secs + 30),
    )
    .unwrap();
    assert!(stop.status.success(), "docker stop: {stop:?}");
    let exit = docker(&["inspect", "-f", "{{.State.ExitCode}}", &agent.name]).unwrap();
    assert_eq!(exit, "0", "the agent's exit status; log:\n{}", agent.logs());
    assert!(
        w.wait_v2_frozen(false, Duration::from_secs(5)),
        "{}: thawed on SIGTERM; agent log:\n{}",
        w.name(),
        agent.logs()
    );
    w.command("ioctl 1").unwrap();
    assert!(w.responds());
}

const MOCK_RUNTIME_LIB: &str = r#"
#include <cmath>
#include <cstdio>
#include <string>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>

static void *work(void *) { return nullptr; }

__attribute__((constructor)) static void loaded() {
    std::string what = "gpushare-mock-runtime";
    try {
        throw std::string("c++ exception caught");
    } catch (const std::string &e) {
        what += ": " + e;
    }
    pthread_t t;
    int thread = pthread_create(&t, nullptr, work, nullptr) == 0 && pthread_join(t, nullptr) == 0;
    struct timespec ts;
    int clock = clock_gettime(CLOCK_MONOTONIC, &ts) == 0;
    int dl = dlopen(nullptr, RTLD_NOW) != nullptr;
    int shm = shm_open("/gpushare-mock-runtime-absent", O_RDONLY, 0) < 0;
    volatile double two = 2.0;
    fprintf(stderr, "%s, sqrt(2)=%.3f thread=%d clock=%d dlopen=%d shm_open=%d\n", what.c_str(),
            std::sqrt(two), thread, clock, dl, shm);
}
"#;

#[test]
fn image_runtime_set_loads_a_library_linking_libdl_libpthread_librt_libm_libstdcxx_libgcc_s() {
    let test = "image_runtime_set_loads_a_library";
    let Some((_dk, image)) = Image::load(test) else {
        return;
    };
    let dir = temp_dir("gpushare-image-lib-");
    let src = dir.path().join("mock.cc");
    let lib = dir.path().join("libgpushare-mock-runtime.so");
    fs::write(&src, MOCK_RUNTIME_LIB).unwrap();
    let cc = Command::new("g++")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        // Every library named, used or not, is a NEEDED entry, as in NVIDIA's libraries. Since
        // glibc 2.34 `-ldl`, `-lpthread` and `-lrt` link empty archives (their functions are in
        // libc); libraries built against an older glibc name the shared objects, so name them.
        .args([
            "-Wl,--no-as-needed",
            "-l:libdl.so.2",
            "-l:libpthread.so.0",
            "-l:librt.so.1",
            "-lm",
            "-lstdc++",
        ])
        .output();
    let cc = match cc {
        Ok(o) => o,
        Err(e) => {
            skip::cannot_run(test, &format!("no g++ here ({e}); Debian: g++"));
            return;
        }
    };
    assert!(
        cc.status.success(),
        "g++: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let mount = format!(
        "--mount=type=bind,source={},target=/opt/gpushare-mock/libmock.so,readonly",
        lib.display()
    );
    let run = |entrypoint: Option<&str>, env: &[&str], args: &[&str]| {
        let mut cmd = Command::new("docker");
        cmd.args(["run", "--rm", "--network", "none", "--read-only", "--label"])
            .arg(format!("{OWNER_LABEL}={}", std::process::id()))
            .arg(&mount);
        if let Some(e) = entrypoint {
            cmd.args(["--entrypoint", e]);
        }
        for e in env {
            cmd.args(["--env", e]);
        }
        cmd.arg(&image.reference).args(args);
        let out = run_timeout(&mut cmd, Duration::from_secs(60)).unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };

    // The image's loader resolves every dependency inside the image.
    let (ok, list) = run(
        Some("/lib64/ld-linux-x86-64.so.2"),
        &[],
        &["--list", "/opt/gpushare-mock/libmock.so"],
    );
    assert!(ok && !list.contains("not found"), "ld.so --list:\n{list}");
    for so in [
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
        "libm.so.6",
        "libstdc++.so.6",
        "libgcc_s.so.1",
        "libc.so.6",
    ] {
        assert!(
            list.lines().any(|l| l.trim().starts_with(so)
                && (l.contains(&format!("=> /usr/lib/x86_64-linux-gnu/{so}"))
                    || l.contains(&format!("=> /lib/x86_64-linux-gnu/{so}")))),
            "{so} resolved in the image:\n{list}"
        );
    }

    // And it runs: loaded into the agent, its constructor uses each of them.
    let (ok, out) = run(
        None,
        &["LD_PRELOAD=/opt/gpushare-mock/libmock.so"],
        &["--version"],
    );
    assert!(ok, "the agent with the mock preloaded:\n{out}");
    assert!(
        out.contains(
            "gpushare-mock-runtime: c++ exception caught, sqrt(2)=1.414 thread=1 clock=1 dlopen=1 shm_open=1"
        ),
        "{out}"
    );
    assert!(out.contains(env!("CARGO_PKG_VERSION")), "{out}");
}
