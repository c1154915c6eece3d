//! `gpushare-agent launch` end to end: the real binary, the mock NVML, real cgroups under
//! `/gpushare.slice`, real signals; placement (best fit and spread, file quotas that name a GPU),
//! refusals, 20 launches at once, the agent seeing the registration, exit statuses, cleanup.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use gpushare_agent::attribution::cgroupfs::find_cgroup2_mount;
use gpushare_testkit::{
    nvml::{SCENARIO_ENV, Scenario, fake_nvml_lib},
    unique, workspace_bin,
};
use serde_json::json;

use crate::util::needs_root;
use crate::util::{AgentProcess, workload};

const GIB: u64 = 1 << 30;

/// A scenario with GPUs of these sizes (GiB), UUIDs `GPU-<tag>-<index>`, and a
/// `process_memory_dir`; and a private directory for the quota file and the runtime drop-ins.
struct Node {
    scenario: Scenario,
    tag: String,
    quotas: PathBuf,
    runtime: PathBuf,
}

impl Node {
    fn new(sizes_gib: &[u64]) -> Self {
        let tag = unique("l").replace('-', "");
        let devices: Vec<_> = sizes_gib
            .iter()
            .enumerate()
            .map(|(i, g)| json!({ "uuid": format!("GPU-{tag}-{i}"), "name": format!("Fake {g}G"), "memory_total": g * GIB }))
            .collect();
        let scenario = Scenario::create(&json!({ "devices": devices })).unwrap();
        let mem = scenario.dir().join("procmem");
        std::fs::create_dir_all(&mem).unwrap();
        scenario
            .write(&json!({ "devices": devices, "process_memory_dir": mem }))
            .unwrap();
        let quotas = scenario.dir().join("quotas.toml");
        let runtime = scenario.dir().join("runtime");
        Self {
            scenario,
            tag,
            quotas,
            runtime,
        }
    }

    fn uuid(&self, index: usize) -> String {
        format!("GPU-{}-{index}", self.tag)
    }

    fn mem_dir(&self) -> PathBuf {
        self.scenario.dir().join("procmem")
    }

    /// `gpushare-agent launch` with this node's paths.
    fn launch(&self, opts: &[&str], command: &[&str]) -> Command {
        let mut c = Command::new(workspace_bin("gpushare-agent"));
        c.arg("launch")
            .arg("--nvml-lib")
            .arg(fake_nvml_lib())
            .arg("--quotas")
            .arg(&self.quotas)
            .arg("--runtime-quotas")
            .arg(&self.runtime)
            .args(opts)
            .arg("--")
            .args(command)
            .env(SCENARIO_ENV, self.scenario.path())
            .stdin(Stdio::null());
        c
    }

    /// The launch drop-ins now in the runtime directory: file name -> text.
    fn dropins(&self) -> BTreeMap<String, String> {
        std::fs::read_dir(&self.runtime)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".toml"))
                    .map(|e| {
                        (
                            e.file_name().to_string_lossy().into_owned(),
                            std::fs::read_to_string(e.path()).unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn scope_dir(name: &str) -> PathBuf {
    find_cgroup2_mount()
        .unwrap()
        .join(format!("gpushare.slice/{name}.scope"))
}

/// A launched long-running service that reports the GPU it was given.
struct Running {
    child: Child,
    name: String,
    out: PathBuf,
    err: PathBuf,
}

impl Running {
    /// Starts `launch --gpu-mem <mem> <opts> -- sh -c 'echo $CUDA_VISIBLE_DEVICES > out; exec sleep 600'`.
    fn start(node: &Node, mem: &str, opts: &[&str]) -> Self {
        Self::start_with(node, mem, opts, "")
    }

    /// The same, with `prelude` run by the shell first.
    fn start_with(node: &Node, mem: &str, opts: &[&str], prelude: &str) -> Self {
        let name = unique("svc");
        let out = node.scenario.dir().join(format!("{name}.out"));
        let err = node.scenario.dir().join(format!("{name}.err"));
        let script = format!(
            "{prelude}echo \"$CUDA_VISIBLE_DEVICES $(grep ^0:: /proc/self/cgroup)\" > {0}.tmp && mv {0}.tmp {0}; exec sleep 600",
            out.display()
        );
        let mut args = vec!["--gpu-mem", mem, "--name", &name];
        args.extend_from_slice(opts);
        let child = node
            .launch(&args, &["sh", "-c", &script])
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            name,
            out,
            err,
        }
    }

    /// The GPU UUID the service got, or `None` when the launch was refused (then exit code 125).
    fn gpu(&mut self) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(text) = std::fs::read_to_string(&self.out) {
                let mut words = text.split_whitespace();
                let uuid = words.next().unwrap().to_string();
                assert_eq!(
                    words.next(),
                    Some(format!("0::/gpushare.slice/{}.scope", self.name).as_str()),
                    "the service runs in its own group"
                );
                return Some(uuid);
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                assert_eq!(st.code(), Some(125), "{}", self.stderr());
                return None;
            }
            assert!(Instant::now() < deadline, "launch hangs: {}", self.stderr());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// SIGTERM to the launcher; its exit status.
    fn stop(&mut self) -> ExitStatus {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        wait_timeout(&mut self.child, Duration::from_secs(20)).expect("launcher did not exit")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop();
        }
        let _ = std::fs::remove_file(&self.out);
        let _ = std::fs::remove_file(&self.err);
    }
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Nothing of `names` is left: no group, no drop-in.
fn assert_clean(node: &Node, names: &[impl AsRef<str>]) {
    for name in names.iter().map(AsRef::as_ref) {
        assert!(!scope_dir(name).exists(), "group of {name} removed");
    }
    assert_eq!(node.dropins(), BTreeMap::new(), "no drop-in left");
}

#[test]
fn launch_places_services_by_best_fit_and_by_spread_counting_every_reservation() {
    needs_root!("launch_places_services");
    // Free memory: GPU 0 16 GiB, GPU 1 8 GiB, GPU 2 24 GiB.
    let node = Node::new(&[16, 8, 24]);
    let mut a = Running::start(&node, "6GiB", &[]);
    assert_eq!(
        a.gpu(),
        Some(node.uuid(1)),
        "6 GiB: the tightest fit is GPU 1"
    );
    let text = node.dropins()[&format!("launch-{}.toml", a.name)].clone();
    assert!(
        text.contains(&format!("cgroup = \"/gpushare.slice/{}.scope\"", a.name))
            && text.contains("gpu = 1")
            && text.contains("gpu_memory = \"6 GiB\""),
        "{text}"
    );
    // Free: 16, 2, 24.
    let mut b = Running::start(&node, "3GiB", &[]);
    assert_eq!(b.gpu(), Some(node.uuid(0)), "3 GiB no longer fits GPU 1");
    // Free: 13, 2, 24.
    let mut c = Running::start(&node, "20GiB", &[]);
    assert_eq!(c.gpu(), Some(node.uuid(2)));
    // Free: 13, 2, 4.
    let mut d = Running::start(&node, "2GiB", &[]);
    assert_eq!(d.gpu(), Some(node.uuid(1)), "exactly fills GPU 1");
    let mut e = Running::start(&node, "14GiB", &[]);
    assert_eq!(e.gpu(), None, "nothing has 14 GiB free");
    assert!(
        e.stderr().contains("no GPU can hold 14.0 GiB"),
        "{}",
        e.stderr()
    );
    // Spread takes the GPU with the most free memory: GPU 0 (13) over GPU 2 (4).
    let mut f = Running::start(&node, "1GiB", &["--spread"]);
    assert_eq!(f.gpu(), Some(node.uuid(0)));
    // --gpu pins it, by index or UUID.
    let mut g = Running::start(&node, "1GiB", &["--gpu", "2"]);
    assert_eq!(g.gpu(), Some(node.uuid(2)));
    let mut h = Running::start(&node, "4GiB", &["--gpu", &node.uuid(2)]);
    assert_eq!(h.gpu(), None, "GPU 2 has 3 GiB left");
    assert!(
        h.stderr()
            .contains(&format!("{} cannot hold 4.0 GiB", node.uuid(2)))
    );
    assert_eq!(node.dropins().len(), 6);

    // The end of a service frees its reservation.
    assert_eq!(c.stop().code(), Some(143), "SIGTERM reached the service");
    assert!(!scope_dir(&c.name).exists());
    let mut i = Running::start(&node, "20GiB", &[]);
    assert_eq!(i.gpu(), Some(node.uuid(2)));
    let names: Vec<String> = [&a, &b, &c, &d, &e, &f, &g, &h, &i]
        .iter()
        .map(|r| r.name.clone())
        .collect();
    for r in [&mut a, &mut b, &mut d, &mut f, &mut g, &mut i] {
        assert_eq!(r.stop().code(), Some(143));
    }
    assert_clean(&node, &names);
}

#[test]
fn quotas_in_the_operators_files_that_name_a_gpu_count_as_reserved() {
    needs_root!("quotas_in_the_operators_files");
    let node = Node::new(&[16, 16]);
    std::fs::write(
        &node.quotas,
        "[[quota]]\nunit = \"big.service\"\ngpu = 0\ngpu_memory = \"12GiB\"\n\n\
         [[quota]]\nunit = \"all.service\"\ngpu_memory = \"100GiB\"\n",
    )
    .unwrap();
    std::fs::create_dir_all(node.scenario.dir().join("quotas.d")).unwrap();
    std::fs::write(
        node.scenario.dir().join("quotas.d/extra.toml"),
        "[[quota]]\nunit = \"other.service\"\ngpu = \"GPU-00000000-dead-beef-0000-000000000000\"\ngpu_memory = \"1GiB\"\n\n\
         [[quota]]\nunit = \"x.service\"\ngpu = 1\ngpu_memory = \"3GiB\"\n",
    )
    .unwrap();
    // Free: GPU 0 4 GiB (12 reserved in the main file), GPU 1 13 GiB (3 in quotas.d); the
    // all-GPU quota and the unknown GPU claim nothing.
    let mut a = Running::start(&node, "4GiB", &[]);
    assert_eq!(a.gpu(), Some(node.uuid(0)), "best fit: GPU 0's 4 GiB");
    let mut b = Running::start(&node, "1GiB", &[]);
    assert_eq!(b.gpu(), Some(node.uuid(1)));
    let mut c = Running::start(&node, "13GiB", &[]);
    assert_eq!(c.gpu(), None);
    let err = c.stderr();
    assert!(
        err.contains(&format!(
            "GPU 0 {} (Fake 16G): 0 B free of 16.0 GiB (16.0 GiB reserved by 2 quotas)",
            node.uuid(0)
        )) && err.contains(&format!(
            "GPU 1 {} (Fake 16G): 12.0 GiB free of 16.0 GiB (4.0 GiB reserved by 2 quotas)",
            node.uuid(1)
        )),
        "{err}"
    );
    // An invalid configuration is not guessed around.
    std::fs::write(&node.quotas, "[[quota]]\nunit = \"x\"\n").unwrap();
    let mut d = Running::start(&node, "1GiB", &[]);
    assert_eq!(d.gpu(), None);
    assert!(
        d.stderr().contains("the quota configuration is invalid")
            && d.stderr().contains("gpu_memory"),
        "{}",
        d.stderr()
    );
    assert_eq!(a.stop().code(), Some(143));
    assert_eq!(b.stop().code(), Some(143));
    assert_clean(&node, &[&a.name, &b.name, &c.name, &d.name]);
}

#[test]
fn twenty_concurrent_launches_never_overbook_a_gpu() {
    needs_root!("twenty_concurrent_launches");
    // Two 10 GiB GPUs hold three 3 GiB services each: 6 of 20 launches fit, 14 must be refused.
    let node = Node::new(&[10, 10]);
    let mut runs: Vec<Running> = (0..20)
        .map(|i| Running::start(&node, "3GiB", if i % 2 == 0 { &[] } else { &["--spread"] }))
        .collect();
    let mut per_gpu: BTreeMap<String, u64> = BTreeMap::new();
    let mut refused = 0;
    for r in &mut runs {
        match r.gpu() {
            Some(uuid) => *per_gpu.entry(uuid).or_default() += 3,
            None => {
                refused += 1;
                assert!(
                    r.stderr().contains("no GPU can hold 3.0 GiB"),
                    "{}",
                    r.stderr()
                );
            }
        }
    }
    assert_eq!(
        per_gpu,
        BTreeMap::from([(node.uuid(0), 9), (node.uuid(1), 9)]),
        "each GPU got exactly three services"
    );
    assert_eq!(refused, 14);
    assert_eq!(node.dropins().len(), 6);
    let names: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
    drop(runs);
    assert_clean(&node, &names);
}

#[test]
fn the_agent_sees_the_quota_while_the_service_runs_and_forgets_it_after() {
    needs_root!("the_agent_sees_the_quota");
    let node = Node::new(&[16, 16]);
    let agent = AgentProcess::start(&node.scenario, "", &[]);
    let agent_node = Node {
        quotas: agent.quotas_path(),
        runtime: agent.dir.join("runtime"),
        ..node
    };
    let node = &agent_node;
    let name = unique("fake");
    let mem = node.mem_dir();
    let mut launcher = node
        .launch(
            &[
                "--gpu-mem",
                "2GiB",
                "--gpu",
                "1",
                "--name",
                &name,
                "--action",
                "alert",
            ],
            &[
                workspace_bin("gpushare-fake-gpu-proc").to_str().unwrap(),
                "--no-stdin",
                "--mem-dir",
                mem.to_str().unwrap(),
                "--mem",
                &GIB.to_string(),
            ],
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let key = format!("unit:///gpushare.slice/{name}.scope");
    let selector = format!("cgroup = \"/gpushare.slice/{name}.scope\"");
    let s = agent.wait_for(Duration::from_secs(15), |s| {
        workload(s, &key, &node.uuid(1)).is_some_and(|w| w.used_bytes == GIB)
    });
    let q = s
        .quotas
        .iter()
        .find(|q| q.selector == selector)
        .unwrap_or_else(|| panic!("{:?}", s.quotas));
    assert_eq!((q.gpu.as_str(), q.gpu_memory_bytes), ("GPU 1", 2 * GIB));
    let w = workload(&s, &key, &node.uuid(1)).unwrap();
    assert_eq!((w.quota_bytes, w.state.as_str()), (Some(2 * GIB), "ok"));
    assert_eq!(w.cgroup_path, format!("/gpushare.slice/{name}.scope"));

    unsafe { libc::kill(launcher.id() as i32, libc::SIGTERM) };
    let st = wait_timeout(&mut launcher, Duration::from_secs(20)).unwrap();
    assert_eq!(
        st.code(),
        Some(143),
        "the fake process died of the forwarded SIGTERM"
    );
    agent.wait_for(Duration::from_secs(15), |s| {
        !s.quotas.iter().any(|q| q.selector == selector)
            && !s.workloads.iter().any(|w| w.workload == key)
    });
    assert_clean(node, &[&name]);
    assert_eq!(
        std::fs::read_dir(&mem).unwrap().count(),
        0,
        "memory file removed"
    );
}

#[test]
fn exit_statuses_pass_through_and_failures_to_start_leave_nothing() {
    needs_root!("exit_statuses_pass_through");
    let node = Node::new(&[8]);
    let status = |cmd: &[&str]| {
        let out = node
            .launch(&["--gpu-mem", "1GiB", "-q"], cmd)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(status(&["true"]).0, Some(0));
    assert_eq!(status(&["sh", "-c", "exit 7"]).0, Some(7));
    assert_eq!(status(&["sh", "-c", "kill -KILL $$"]).0, Some(137));
    assert_eq!(
        status(&["sh", "-c", "kill -USR2 $$"]).0,
        Some(128 + libc::SIGUSR2)
    );
    let (code, err) = status(&["/nonexistent/command"]);
    assert_eq!(code, Some(127), "{err}");
    let not_executable = node.scenario.dir().join("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let (code, err) = status(&[not_executable.to_str().unwrap()]);
    assert_eq!(code, Some(126), "{err}");
    // The environment names the GPU; the service's children stay in its group; leftovers are
    // ended when the main process exits.
    let out = node
        .launch(
            &["--gpu-mem", "1GiB", "-q", "--name", "envcheck"],
            &[
                "sh",
                "-c",
                // Counted with builtins only, so the count is sh and the background sleep.
                "sleep 600 & echo $CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES $GPUSHARE_LAUNCH_NAME $GPUSHARE_LAUNCH_GPU_INDEX; \
                 n=0; while read p; do n=$((n+1)); done < $CGROOT$GPUSHARE_LAUNCH_CGROUP/cgroup.procs; echo $n",
            ],
        )
        .env("CGROOT", find_cgroup2_mount().unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let uuid = node.uuid(0);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .collect::<Vec<_>>(),
        [format!("{uuid} {uuid} envcheck 0"), "2".to_string()],
        "two processes (sh and the background sleep) in the group"
    );
    // Bad arguments start nothing.
    let (code, err) = status_with(&node, &["--gpu-mem", "1GiB", "--name", "../x"], &["true"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, err) = status_with(
        &node,
        &["--gpu-mem", "1GiB", "--action", "freeze,alert"],
        &["true"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("order"), "{err}");
    assert_clean(&node, &["envcheck"]);
}

fn status_with(node: &Node, opts: &[&str], cmd: &[&str]) -> (Option<i32>, String) {
    let out = node.launch(opts, cmd).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_frozen_service_is_killed_when_the_launcher_is_told_to_stop_and_stale_registrations_are_collected()
 {
    needs_root!("a_frozen_service_is_killed");
    let node = Node::new(&[8]);
    // It ignores SIGTERM (so even a thawed one would not stop) and is frozen.
    let mut frozen = Running::start_with(
        &node,
        "2GiB",
        &["--stop-timeout", "300ms"],
        "trap '' TERM; ",
    );
    assert!(frozen.gpu().is_some());
    let dir = scope_dir(&frozen.name);
    std::fs::write(dir.join("cgroup.freeze"), "1").unwrap();
    let t = Instant::now();
    let st = frozen.stop();
    assert_eq!(
        st.code(),
        Some(137),
        "killed with its group: {}",
        frozen.stderr()
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(frozen.stderr().contains("did not stop within"));
    assert!(!dir.exists());

    // A launcher killed with SIGKILL cannot clean up: its service keeps running, and keeps its
    // reservation; once the service is gone too, the next launch removes the registration.
    let mut orphan = Running::start(&node, "6GiB", &[]);
    assert!(orphan.gpu().is_some());
    let _ = orphan.child.kill();
    let _ = orphan.child.wait();
    let dir = scope_dir(&orphan.name);
    assert!(dir.exists());
    let mut next = Running::start(&node, "4GiB", &[]);
    assert_eq!(next.gpu(), None, "the orphan's 6 GiB are still reserved");
    std::fs::write(dir.join("cgroup.kill"), "1").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty()) {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut after = Running::start(&node, "4GiB", &[]);
    assert!(after.gpu().is_some(), "{}", after.stderr());
    assert!(!dir.exists(), "the orphan's group was collected");
    assert_eq!(node.dropins().len(), 1);
    assert_eq!(after.stop().code(), Some(143));
    assert_clean(
        &node,
        &[&frozen.name, &orphan.name, &next.name, &after.name],
    );
}
