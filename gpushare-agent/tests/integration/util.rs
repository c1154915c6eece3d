//! Helpers shared by the integration tests.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use gpushare_agent::{
    attribution::{Change, tracker::Tracker},
    client::{Endpoint, request},
    snapshot::Snapshot,
};
use gpushare_testkit::{
    agent_command,
    nvml::{Scenario, fake_nvml_lib},
    unique, workspace_bin,
};

/// Polls the tracker until `done` holds or `timeout` passes; returns every change seen.
pub fn poll_until(
    tracker: &mut Tracker,
    timeout: Duration,
    mut done: impl FnMut(&Tracker, &[Change]) -> bool,
) -> Vec<Change> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        seen.extend(tracker.poll());
        if done(tracker, &seen) || Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free TCP port on loopback: the test kit's.
pub use gpushare_testkit::free_port;

/// The agent binary running against the mock NVML, with every path in a private directory.
/// Stopped with SIGTERM on drop.
pub struct AgentProcess {
    child: Option<Child>,
    /// Private directory: quotas.toml, quotas.d/, runtime/, state/, agent.sock, agent.log.
    pub dir: PathBuf,
    /// `127.0.0.1:<port>`.
    pub listen: String,
    extra: Vec<String>,
    envs: Vec<(String, String)>,
    scenario: PathBuf,
    interval: String,
    starts: u32,
    /// A command the agent is started through (`unshare ... sh -c '...; exec "$@"'`), if any: it
    /// must exec the agent, so that the child's pid is the agent's.
    wrapper: Vec<std::ffi::OsString>,
}

/// A fresh private directory for an agent: `quotas.toml` written, `quotas.d/` created. Tests that
/// need state from "an earlier run" (a ledger) write it under `state/` before starting.
pub fn agent_dir(quotas: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique("gpushare-agent"));
    std::fs::create_dir_all(dir.join("quotas.d")).unwrap();
    std::fs::write(dir.join("quotas.toml"), quotas).unwrap();
    dir
}

impl AgentProcess {
    /// Starts the agent with `quotas` as its main quota file and waits until it is ready.
    pub fn start(scenario: &Scenario, quotas: &str, extra: &[&str]) -> Self {
        Self::start_in(agent_dir(quotas), scenario, extra, "200ms")
    }

    /// Starts the agent over a directory made by [`agent_dir`] (and possibly holding an earlier
    /// run's state), sampling every `interval`, and waits until it is ready.
    pub fn start_in(dir: PathBuf, scenario: &Scenario, extra: &[&str], interval: &str) -> Self {
        let mut a = Self::unstarted(dir, scenario, extra, interval);
        a.spawn();
        a
    }

    /// The agent's command, not started: for tests of what happens when it cannot start.
    pub fn command_in(dir: &Path, scenario: &Scenario, extra: &[&str]) -> Command {
        let mut cmd = agent_command(
            &workspace_bin("gpushare-agent"),
            Some(&fake_nvml_lib()),
            scenario.path(),
            dir,
            &format!("127.0.0.1:{}", free_port()),
            "200ms",
        );
        cmd.args(extra).env("RUST_LOG", "info,gpushare_agent=debug");
        cmd
    }

    /// The agent over a directory made by [`agent_dir`], not started yet: set its environment
    /// with [`Self::env`], then [`Self::restart`] (waits until ready) or [`Self::spawn_unready`].
    pub fn unstarted(dir: PathBuf, scenario: &Scenario, extra: &[&str], interval: &str) -> Self {
        Self {
            child: None,
            listen: format!("127.0.0.1:{}", free_port()),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            envs: Vec::new(),
            scenario: scenario.path().to_path_buf(),
            interval: interval.to_string(),
            starts: 0,
            wrapper: Vec::new(),
        }
    }

    /// Starts the agent (from its next start) through `wrapper`, a command that execs its
    /// arguments: `["unshare", "--mount", ...]`.
    pub fn wrapped<S: AsRef<std::ffi::OsStr>>(mut self, wrapper: &[S]) -> Self {
        self.wrapper = wrapper.iter().map(|s| s.as_ref().to_owned()).collect();
        self
    }

    /// Adds a variable to the agent's environment (from its next start).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_string(), value.to_string()));
        self
    }

    /// Sets the agent's environment variables (from its next start) to `envs`.
    pub fn set_envs(&mut self, envs: &[(&str, &str)]) {
        self.envs = envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// Waits until the agent's process has ended on its own (a crash point), up to `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if !self.is_running() {
                self.child = None;
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Starts it and waits until it is ready. Where the tests run as root the agent must be in
    /// eBPF mode, unless the test asked for `--no-ebpf`: a silent fallback to `/proc` would let
    /// tests of attribution, ioctls and allocation events pass without the kernel programs.
    fn spawn(&mut self) {
        self.spawn_unready();
        let s = self.wait_for(Duration::from_secs(20), |s| s.health.ready);
        // SAFETY: geteuid(2) has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if root && !self.extra.iter().any(|a| a == "--no-ebpf") {
            assert_eq!(
                s.health.attribution,
                "ebpf",
                "the agent is not in eBPF mode (degraded: {:?})\nlog:\n{}",
                s.health.degraded,
                self.log()
            );
        }
    }

    /// Starts the process and returns at once (for tests that kill it during start-up).
    pub fn spawn_unready(&mut self) {
        assert!(self.child.is_none(), "still running");
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .unwrap();
        let default_lib = fake_nvml_lib();
        let lib = (!self.extra.iter().any(|a| a == "--nvml-lib")).then_some(default_lib.as_path());
        let mut cmd = agent_command(
            &workspace_bin("gpushare-agent"),
            lib,
            &self.scenario,
            &self.dir,
            &self.listen,
            &self.interval,
        );
        if let Some((program, args)) = self.wrapper.split_first() {
            let mut outer = Command::new(program);
            outer.args(args).arg(cmd.get_program()).args(cmd.get_args());
            for (k, v) in cmd.get_envs() {
                match v {
                    Some(v) => outer.env(k, v),
                    None => outer.env_remove(k),
                };
            }
            cmd = outer;
        }
        let child = cmd
            .args(&self.extra)
            .env("RUST_LOG", "info,gpushare_agent=debug")
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Starts it again after [`Self::sigkill`] or [`Self::stop`] (or for the first time, after
    /// [`Self::unstarted`]), with the same paths, and waits until it is ready.
    pub fn restart(&mut self) {
        self.spawn();
    }

    /// The agent's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Path of the main quota file.
    pub fn quotas_path(&self) -> PathBuf {
        self.dir.join("quotas.toml")
    }

    /// Replaces the main quota file atomically.
    pub fn write_quotas(&self, text: &str) {
        let tmp = self.dir.join("quotas.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.quotas_path()).unwrap();
    }

    /// The freeze ledger file.
    pub fn ledger(&self) -> PathBuf {
        self.dir.join("state/freezes.json")
    }

    /// GET a path on the TCP listener (`/metrics`, `/healthz`); (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        request(&Endpoint::Tcp(&self.listen), "GET", path, None).unwrap_or((0, String::new()))
    }

    /// The agent's local socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }

    /// GET a path on the local socket (`/api/v1/state`); (status, body).
    pub fn get_local(&self, path: &str) -> (u16, String) {
        request(&Endpoint::Unix(&self.socket()), "GET", path, None).unwrap_or((0, String::new()))
    }

    /// POST to the local socket; (status, body).
    pub fn post_local(&self, path: &str, body: &str) -> (u16, String) {
        request(
            &Endpoint::Unix(&self.dir.join("agent.sock")),
            "POST",
            path,
            Some(body),
        )
        .unwrap()
    }

    /// The agent's state, if it answers.
    pub fn state(&self) -> Option<Snapshot> {
        let (code, body) = self.get_local("/api/v1/state");
        (code == 200).then(|| serde_json::from_str(&body).unwrap())
    }

    /// Waits until `cond` holds for the agent's state; panics with the log after `timeout`.
    pub fn wait_for(&self, timeout: Duration, mut cond: impl FnMut(&Snapshot) -> bool) -> Snapshot {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.state()
                && cond(&s)
            {
                return s;
            }
            if Instant::now() > deadline {
                panic!(
                    "condition not reached in {timeout:?}; state: {:?}\nlog:\n{}",
                    self.state(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (up to 20 s) until the all-GPU row of workload `key` is in `state`.
    pub fn wait_state(&self, key: &str, state: &str) -> Snapshot {
        self.wait_for(Duration::from_secs(20), |s| {
            workload(s, key, "all").is_some_and(|w| w.state == state)
        })
    }

    /// Waits (up to 20 s) until the all-GPU row of workload `key` shows `bytes` used.
    pub fn wait_used(&self, key: &str, bytes: u64) -> Snapshot {
        self.wait_for(Duration::from_secs(20), |s| {
            workload(s, key, "all").is_some_and(|w| w.used_bytes == bytes)
        })
    }

    /// Waits until the agent publishes the result of a new step, and returns it: what a test does
    /// right after has (nearly) a whole sample interval before the next step.
    pub fn wait_next_step(&self) -> Snapshot {
        let before = self.state().map(|s| s.taken_at_unix).unwrap_or(0.0);
        self.wait_for(Duration::from_secs(10), |s| s.taken_at_unix > before)
    }

    /// Waits until the agent has published `n` new steps; the last one.
    pub fn wait_steps(&self, n: u32) -> Snapshot {
        let mut s = self.wait_next_step();
        for _ in 1..n {
            s = self.wait_next_step();
        }
        s
    }

    /// For an assertion that something does NOT happen for a while: calls `check` on each step
    /// the agent publishes until one taken at least `d` after this call, and returns that one.
    /// Where a sleep would also pass with a stalled or dead agent, this needs it to keep
    /// stepping all along.
    pub fn steps_over(&self, d: Duration, mut check: impl FnMut(&Snapshot)) -> Snapshot {
        let until = unix_now() + d.as_secs_f64();
        loop {
            let s = self.wait_next_step();
            check(&s);
            if s.taken_at_unix >= until {
                return s;
            }
        }
    }

    /// Whether the agent's process is still running (not exited, not a zombie).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().is_ok_and(|st| st.is_none()))
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    /// SIGKILL, no cleanup: what a crash looks like.
    pub fn sigkill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        gpushare_testkit::terminate(&mut c, Duration::from_secs(15))?.code()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Seconds since the epoch, as the agent stamps its steps (`taken_at_unix`).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Waits until `cond` holds, polling every 10 ms; after `timeout`, panics with `what()` (what
/// did not happen, and the agent's log or whatever tells why).
pub fn wait_until(
    timeout: Duration,
    what: impl FnOnce() -> String,
    mut cond: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() >= deadline {
            panic!("not within {timeout:?}: {}", what());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the kernel's clock has ticked past the start time of `pid` (start times have
/// clock-tick resolution, 10 ms): a process started from now on has a later start time, so a
/// pid reused by it is told apart by its start time.
pub fn wait_clock_tick_after_start(pid: u32) {
    let start = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .map(|s| s.starttime)
        .expect("the process's start time");
    let tps = procfs::ticks_per_second() as f64;
    wait_until(
        Duration::from_secs(5),
        || "the clock never ticked past the process's start time".into(),
        || {
            let up = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
            let secs: f64 = up
                .split_whitespace()
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0);
            (secs * tps) as u64 > start + 1
        },
    );
}

/// Whether the kernel's table of GPU tasks holds `pid`.
pub fn kernel_holds(tracker: &Tracker, pid: u32) -> bool {
    tracker
        .kernel()
        .unwrap()
        .gpu_tasks()
        .iter()
        .any(|(t, _)| *t == pid)
}

/// The workload row of `key` on GPU `gpu` ("all" for all-GPU quotas).
pub fn workload<'a>(
    s: &'a Snapshot,
    key: &str,
    gpu: &str,
) -> Option<&'a gpushare_agent::snapshot::WorkloadView> {
    s.workloads
        .iter()
        .find(|w| w.workload == key && w.gpu_uuid == gpu)
        .map(|w| &**w)
}

/// A process that survives SIGUSR1 and records each one in `log` (one line per signal).
pub fn usr1_recorder(log: &Path) -> Command {
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(format!(
            "trap 'echo USR1 >> {}' USR1; while :; do sleep 0.05; done",
            log.display()
        ))
        .stdin(Stdio::null());
    c
}

/// A v1 freezer group for a test (what `docker pause` uses on a hybrid host); thawed and removed on
/// drop, its processes moved back to the v1 root first, so a failing test never leaves a process
/// frozen (a v1-frozen task cannot even be killed).
pub struct V1Group(pub PathBuf);

impl V1Group {
    /// Creates `<v1 freezer root>/<name>`; `None` where no v1 freezer is mounted.
    pub fn create(name: &str) -> Option<Self> {
        let root = gpushare_agent::enforce::freeze::v1_freezer_root()?;
        let g = Self(root.join(name));
        std::fs::create_dir_all(&g.0).unwrap();
        Some(g)
    }

    /// Moves `pid` into the group.
    pub fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    /// Writes `FROZEN` or `THAWED`.
    pub fn set(&self, state: &str) {
        std::fs::write(self.0.join("freezer.state"), state).unwrap();
    }

    /// `FROZEN`, `FREEZING` or `THAWED`.
    pub fn state(&self) -> String {
        std::fs::read_to_string(self.0.join("freezer.state"))
            .unwrap()
            .trim()
            .to_string()
    }
}

impl Drop for V1Group {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("freezer.state"), "THAWED");
        empty_and_remove(&self.0);
    }
}

/// Moves a test's cgroup's processes into its parent and removes it (v1 or v2), ignoring errors:
/// for the Drop of fixtures that put processes into groups of their own.
pub fn empty_and_remove(dir: &Path) {
    if let (Some(parent), Ok(procs)) = (
        dir.parent(),
        std::fs::read_to_string(dir.join("cgroup.procs")),
    ) {
        for pid in procs.lines() {
            let _ = std::fs::write(parent.join("cgroup.procs"), pid);
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// A child process killed and reaped on drop.
pub struct Reaped(pub Child);

impl Reaped {
    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Returns from the test, after a loud SKIPPED line, unless it runs as root (see
/// [`gpushare_testkit::require_root`]).
macro_rules! needs_root {
    ($test:expr) => {
        if !gpushare_testkit::require_root($test) {
            return;
        }
    };
}
pub(crate) use needs_root;

/// A test cgroup named after `name` (made unique), removed on drop.
pub fn group(name: &str) -> gpushare_testkit::TestCgroup {
    gpushare_testkit::TestCgroup::create(&gpushare_testkit::unique(name)).unwrap()
}

/// A test cgroup named after `name` with a [`sleeper`] in it.
pub fn sleeping_group(name: &str) -> (gpushare_testkit::TestCgroup, Reaped) {
    let cg = group(name);
    let p = sleeping(&cg);
    (cg, p)
}

/// A [`sleeper`] in `cg`, killed and reaped on drop.
pub fn sleeping(cg: &gpushare_testkit::TestCgroup) -> Reaped {
    Reaped(cg.spawn(&mut sleeper()).unwrap())
}

/// `sleep 300` with no stdin.
pub fn sleeper() -> Command {
    let mut c = Command::new("sleep");
    c.arg("300").stdin(Stdio::null());
    c
}

/// A scenario with one GPU (`GPU-loop`, 80 GiB) listing `procs` as (pid, bytes).
pub fn one_gpu(procs: &[(u32, u64)]) -> serde_json::Value {
    let list: Vec<_> = procs
        .iter()
        .map(|(pid, b)| serde_json::json!({ "pid": pid, "used_memory": b }))
        .collect();
    serde_json::json!({ "devices": [{ "uuid": "GPU-loop", "name": "NVIDIA Fake", "memory_total": 80u64 << 30, "compute_processes": list }] })
}

/// A counter's value in Prometheus text, summed over the series whose labels contain `labels`
/// (e.g. `action="freeze",result="ok"`); 0 when absent.
pub fn counter_value(metrics: &str, name: &str, labels: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter(|l| l.contains(labels))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// Makes the next process spawned by `spawn` get `pid` (through `ns_last_pid`); kills and retries
/// when another process took it first. Panics after 200 tries.
pub fn spawn_with_pid(pid: u32, mut spawn: impl FnMut() -> Child) -> Reaped {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
        let c = Reaped(spawn());
        if c.pid() == pid {
            return c;
        }
    }
    panic!("could not make pid {pid} be reused in 200 tries");
}

/// The workload key of a plain test cgroup.
pub fn key(cg: &gpushare_testkit::TestCgroup) -> String {
    format!("cgroup://{}", cg.rel_path())
}

/// A quota file entry for a plain test cgroup, on all GPUs.
pub fn cgroup_quota(cg: &gpushare_testkit::TestCgroup, size: &str) -> String {
    format!(
        "\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"{size}\"\n",
        cg.rel_path()
    )
}

/// A group at `rel` below the v2 root (outside the test parent: a runtime's place), removed on
/// drop; the parents the test process made for such groups go when the last group in them does.
pub struct PlacedGroup {
    cg: Option<gpushare_testkit::TestCgroup>,
}

/// Parents made for [`PlacedGroup`]s by this test process (removed once empty).
static PLACED_PARENTS: std::sync::Mutex<Vec<std::path::PathBuf>> =
    std::sync::Mutex::new(Vec::new());

impl PlacedGroup {
    pub fn create(rel: &str) -> Self {
        let root = gpushare_testkit::cgroup::v2_root().unwrap();
        let mut made = PLACED_PARENTS.lock().unwrap();
        let mut dir = root.clone();
        let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
        for c in &comps[..comps.len() - 1] {
            dir = dir.join(c);
            if !dir.exists() {
                made.push(dir.clone());
            }
        }
        Self {
            cg: Some(gpushare_testkit::TestCgroup::create_at(&root, rel).unwrap()),
        }
    }

    pub fn cg(&self) -> &gpushare_testkit::TestCgroup {
        self.cg.as_ref().unwrap()
    }
}

impl Drop for PlacedGroup {
    fn drop(&mut self) {
        drop(self.cg.take());
        let mut made = PLACED_PARENTS.lock().unwrap_or_else(|e| e.into_inner());
        // Deepest first; a parent still holding another test's group stays (for now).
        made.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        made.retain(|dir| std::fs::remove_dir(dir).is_err() && dir.exists());
    }
}

impl std::ops::Deref for PlacedGroup {
    type Target = gpushare_testkit::TestCgroup;
    fn deref(&self) -> &gpushare_testkit::TestCgroup {
        self.cg()
    }
}

/// A fresh 64-hex container id.
pub fn container_id() -> String {
    let u = unique("cid");
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut out = String::new();
    for round in 0..4u64 {
        for b in u.bytes().chain(round.to_le_bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// A fresh pod UID (8-4-4-4-12).
pub fn pod_uid() -> String {
    let id = container_id();
    format!(
        "{}-{}-{}-{}-{}",
        &id[..8],
        &id[8..12],
        &id[12..16],
        &id[16..20],
        &id[20..32]
    )
}
