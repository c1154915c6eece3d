//! `cargo xtask demo`: gpushare end to end on a machine without a GPU, narrated.
//!
//! The mock libnvidia-ml plays two GPUs. Three services start through `gpushare-agent launch`, each
//! a fake GPU process that opens a fake nvidia device node (a char device with /dev/null's numbers,
//! so the eBPF programs see a GPU open) and "allocates" by writing its usage into the mock's
//! `process_memory_dir`. The agent starts after them and picks up their registrations; one service
//! grows past its quota and is signalled, then frozen, while its neighbours run on; an operator
//! releases it; everything is stopped and checked to be gone.
//!
//! Every step is checked: the demo exits non-zero when an expected event does not happen, so it is
//! also an end-to-end test (`--fast` shortens every wait, for CI). Cleanup runs on success, on
//! failure and on Ctrl-C (a SIGINT/SIGTERM handler sets a flag every wait checks; the children run in
//! their own process groups so the terminal's Ctrl-C reaches only the demo, which then stops them in
//! order).

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, IsTerminal},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use gpushare_testkit::sys::mountinfo;

use crate::client;

const GIB: u64 = 1 << 30;
const DEVICE_NODE: &str = "/dev/nvidia-gpushare-demo0";
const SIGINT: i32 = 2;
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static COLOR: AtomicBool = AtomicBool::new(false);

unsafe extern "C" {
    fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
    fn kill(pid: i32, sig: i32) -> i32;
}

extern "C" fn on_signal(_: i32) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// One service of the story.
struct Spec {
    name: &'static str,
    quota_gib: u64,
    uses_gib: u64,
    /// The GPU best fit must choose (GPU 0: 48 GiB, GPU 1: 24 GiB).
    expect_gpu: u32,
    role: &'static str,
}

const SERVICES: [Spec; 3] = [
    Spec {
        name: "trainer",
        quota_gib: 16,
        uses_gib: 12,
        expect_gpu: 1,
        role: "a training job",
    },
    Spec {
        name: "notebook",
        quota_gib: 6,
        uses_gib: 5,
        expect_gpu: 1,
        role: "someone's notebook",
    },
    Spec {
        name: "inference",
        quota_gib: 12,
        uses_gib: 10,
        expect_gpu: 0,
        role: "an inference server",
    },
];

/// How long things take.
struct Pace {
    fast: bool,
    interactive: bool,
    interval: &'static str,
    grace: &'static str,
    signal_after: &'static str,
    freeze_after: &'static str,
    suspend_after: &'static str,
    pause: Duration,
    timeout: Duration,
}

impl Pace {
    fn new(fast: bool) -> Self {
        let interactive = !fast && std::io::stdin().is_terminal();
        if fast {
            Self {
                fast,
                interactive,
                interval: "200ms",
                grace: "300ms",
                signal_after: "500ms",
                freeze_after: "1.5s",
                suspend_after: "3s",
                pause: Duration::ZERO,
                timeout: Duration::from_secs(30),
            }
        } else {
            Self {
                fast,
                interactive,
                interval: "500ms",
                grace: "2s",
                signal_after: "4s",
                freeze_after: "10s",
                suspend_after: "20s",
                pause: Duration::from_secs(10),
                timeout: Duration::from_secs(60),
            }
        }
    }
}

/// A child process stopped with SIGTERM (then SIGKILL) when dropped.
struct Proc {
    child: Option<Child>,
    what: String,
}

impl Proc {
    fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// SIGTERM, then waits up to `timeout` (SIGKILL after that). The exit status, if it exited.
    fn stop(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let status = gpushare_testkit::terminate(&mut child, timeout);
        if status.is_none() {
            eprintln!("demo: {} did not stop; killed it", self.what);
        }
        status
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(15));
    }
}

/// Everything the demo creates; [`Demo::teardown`] (or drop) removes it.
struct Demo {
    pace: Pace,
    agent_bin: PathBuf,
    fake_proc: PathBuf,
    nvml_lib: PathBuf,
    dir: PathBuf,
    cg_root: PathBuf,
    listen: String,
    services: Vec<Proc>,
    agent: Option<Proc>,
    device_made: bool,
    enter: Option<mpsc::Receiver<()>>,
    torn_down: bool,
    keep_dir: bool,
}

/// Runs the demo. `root` is the workspace; the workspace is built and the mock installed already.
pub fn run(root: &Path, fast: bool, nvml_lib: PathBuf) -> Result<()> {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
    }
    COLOR.store(std::io::stdout().is_terminal(), Ordering::Relaxed);
    let started = Instant::now();
    let pace = Pace::new(fast);
    let dir = std::env::temp_dir().join(format!("gpushare-demo-{}", std::process::id()));
    let mut demo = Demo {
        agent_bin: root.join("target/debug/gpushare-agent"),
        fake_proc: root.join("target/debug/gpushare-fake-gpu-proc"),
        nvml_lib,
        cg_root: mountinfo::cgroup2_root().context("no cgroup v2 hierarchy is mounted")?,
        listen: format!("127.0.0.1:{}", gpushare_testkit::free_port()),
        services: Vec::new(),
        agent: None,
        device_made: false,
        enter: None,
        torn_down: false,
        keep_dir: false,
        dir,
        pace,
    };
    let result = demo.story();
    // Keep the logs of a failed run (not of an interrupted one) for inspection.
    demo.keep_dir = result.is_err() && !INTERRUPTED.load(Ordering::SeqCst);
    let cleanup = demo.teardown();
    match (&result, &cleanup) {
        (Ok(()), Ok(())) => {
            println!(
                "\ndemo: done in {:.0}s; every expected event happened and nothing is left behind.",
                started.elapsed().as_secs_f64()
            );
        }
        _ => {
            if let Err(e) = &cleanup {
                eprintln!("demo: cleanup: {e:#}");
            } else if INTERRUPTED.load(Ordering::SeqCst) {
                eprintln!("demo: interrupted; everything it had started and created is removed");
            }
        }
    }
    result.and(cleanup)
}

fn heading(text: &str) {
    if COLOR.load(Ordering::Relaxed) {
        println!("\n\x1b[1m==> {text}\x1b[0m");
    } else {
        println!("\n==> {text}");
    }
}

fn say(text: &str) {
    for line in text.lines() {
        println!("    {line}");
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("      | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// GET over plain HTTP/1.1; (status, body).
fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    client::request(&client::Endpoint::Tcp(addr), "GET", path, None)
}

/// Current isolation state per workload key, from `gpushare_workload_isolation_state`.
fn states(metrics: &str) -> BTreeMap<String, String> {
    let label = |line: &str, name: &str| -> Option<String> {
        let start = line.find(&format!("{name}=\""))? + name.len() + 2;
        let len = line[start..].find('"')?;
        Some(line[start..start + len].to_string())
    };
    metrics
        .lines()
        .filter(|l| l.starts_with("gpushare_workload_isolation_state{"))
        .filter(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v == 1.0)
        })
        .filter_map(|l| Some((label(l, "workload")?, label(l, "state")?)))
        .collect()
}

fn key(name: &str) -> String {
    format!("unit:///gpushare.slice/{name}.scope")
}

impl Demo {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn scope(&self, name: &str) -> PathBuf {
        self.cg_root.join(format!("gpushare.slice/{name}.scope"))
    }

    fn frozen(&self, name: &str) -> bool {
        fs::read_to_string(self.scope(name).join("cgroup.events"))
            .is_ok_and(|t| t.lines().any(|l| l.trim() == "frozen 1"))
    }

    fn service_log(&self, name: &str) -> String {
        fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default()
    }

    fn usr1s(&self, name: &str) -> usize {
        self.service_log(name).matches("SIGUSR1 received").count()
    }

    fn alive(&mut self, i: usize) -> bool {
        self.services[i]
            .child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Waits a little for the reader: Enter when interactive, a few seconds otherwise.
    fn pause(&mut self) -> Result<()> {
        if self.pace.fast {
            return interrupted();
        }
        if self.pace.interactive {
            println!("\n    (press Enter to go on)");
            let rx = self.enter.get_or_insert_with(|| {
                let (tx, rx) = mpsc::channel();
                std::thread::spawn(move || {
                    for line in std::io::stdin().lock().lines() {
                        if line.is_err() || tx.send(()).is_err() {
                            break;
                        }
                    }
                });
                rx
            });
            loop {
                interrupted()?;
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(()) => return Ok(()),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
                }
            }
        }
        self.sleep(self.pace.pause)
    }

    fn sleep(&self, d: Duration) -> Result<()> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            interrupted()?;
            std::thread::sleep(Duration::from_millis(50));
        }
        interrupted()
    }

    /// Polls `cond` every 100 ms until it holds; fails with `what` after the demo's timeout.
    fn wait_for(&mut self, what: &str, mut cond: impl FnMut(&mut Self) -> bool) -> Result<()> {
        let deadline = Instant::now() + self.pace.timeout;
        loop {
            interrupted()?;
            if cond(self) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "expected event did not happen within {:?}: {what}\n--- agent log (tail) ---\n{}",
                    self.pace.timeout,
                    tail(
                        &fs::read_to_string(self.path("agent.log")).unwrap_or_default(),
                        30
                    )
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn metrics_states(&self) -> BTreeMap<String, String> {
        http_get(&self.listen, "/metrics")
            .map(|(_, body)| states(&body))
            .unwrap_or_default()
    }

    fn status_table(&self) -> Result<String> {
        let out = Command::new(&self.agent_bin)
            .args(["status", "--socket"])
            .arg(self.path("agent.sock"))
            .output()
            .context("running gpushare-agent status")?;
        ensure!(
            out.status.success(),
            "gpushare-agent status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn show_status(&self) -> Result<()> {
        println!(
            "\n    $ gpushare-agent status\n{}",
            indent(&self.status_table()?)
        );
        Ok(())
    }

    fn story(&mut self) -> Result<()> {
        let fast = self.pace.fast;
        heading("gpushare demo: GPU-memory quotas enforced on a machine without a GPU");
        say(&format!(
            "The mock libnvidia-ml plays two GPUs. Three services start through `gpushare-agent launch`;\n\
             each is a fake GPU process that opens a fake nvidia device node and reports its memory through\n\
             the mock. The agent watches them; one grows past its quota.{}",
            if fast { " (--fast: short waits)" } else { "" }
        ));
        self.prepare()?;
        self.pause()?;

        heading("1. Launch three services with `gpushare-agent launch`");
        say(
            "launch picks a GPU whose unreserved memory holds the request (best fit), creates the cgroup\n\
             /gpushare.slice/<name>.scope, registers the quota as a runtime drop-in, and runs the command in it.",
        );
        for spec in &SERVICES {
            self.launch(spec)?;
        }
        let dropins: Vec<String> = fs::read_dir(self.path("runtime"))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".toml"))
            .collect();
        ensure!(
            dropins.len() == 3,
            "expected three registrations, found {dropins:?}"
        );
        say(&format!(
            "\nRegistrations in {}/runtime: {}",
            self.dir.display(),
            dropins.join(", ")
        ));
        println!(
            "{}",
            indent(&fs::read_to_string(
                self.path("runtime/launch-trainer.toml")
            )?)
        );
        let refused = Command::new(&self.agent_bin)
            .args(self.launch_args("toobig", "40GiB"))
            .args(["--", "true"])
            .env("GPUSHARE_FAKE_NVML_STATE", self.path("scenario.json"))
            .output()?;
        ensure!(
            refused.status.code() == Some(125),
            "a 40 GiB launch should be refused, got {}",
            refused.status
        );
        say("\nA fourth service asking for 40 GiB does not fit anywhere any more, and is refused:");
        println!(
            "{}",
            indent(String::from_utf8_lossy(&refused.stderr).trim_end())
        );
        self.pause()?;

        heading("2. Start the agent");
        say(
            "The agent was not running when the services were launched: it reads the runtime drop-ins when\n\
             it starts (and watches their directory), attributes each GPU process to its cgroup with eBPF,\n\
             and samples memory through NVML (here, the mock).",
        );
        self.start_agent()?;
        self.wait_for("the agent reports all three services, all ok", |d| {
            let s = d.metrics_states();
            SERVICES
                .iter()
                .all(|spec| s.get(&key(spec.name)).is_some_and(|st| st == "ok"))
        })?;
        self.show_status()?;
        self.pause()?;

        heading("3. trainer grows past its quota");
        let (pid_file, grown) = self.grow("trainer", 18 * GIB)?;
        say(&format!(
            "trainer (quota 16 GiB) now allocates 18 GiB ({} holds {grown} bytes for the mock NVML).\n\
             On a real GPU this is where its neighbour notebook, on the same GPU, would start failing\n\
             its allocations. The ladder (set with launch --action): alert, then SIGUSR1 after {},\n\
             then freeze the cgroup after {}, then suspend it after {} (grace {}).",
            pid_file.display(),
            self.pace.signal_after,
            self.pace.freeze_after,
            self.pace.suspend_after,
            self.pace.grace
        ));
        self.wait_for("trainer is signalled (SIGUSR1)", |d| {
            d.usr1s("trainer") >= 1
        })?;
        say("\ntrainer got SIGUSR1 (its chance to shrink); its log says:");
        let first = self
            .service_log("trainer")
            .lines()
            .find(|l| l.contains("SIGUSR1"))
            .unwrap_or_default()
            .to_string();
        println!("{}", indent(&first));
        self.wait_for("trainer's cgroup is frozen", |d| {
            d.frozen("trainer")
                && d.metrics_states()
                    .get(&key("trainer"))
                    .is_some_and(|s| s == "frozen")
        })?;
        say(&format!(
            "\ntrainer did not shrink, so its cgroup is frozen now ({}: frozen 1).",
            self.scope("trainer").join("cgroup.events").display()
        ));
        self.check_neighbours()?;
        let frozen_free = self.gpu_free(1)?;
        say(&format!(
            "notebook and inference were neither signalled nor frozen, and keep running. But a frozen\n\
             trainer still holds its 18 GiB: GPU 1 has only {} free, so notebook still cannot grow.",
            gib(frozen_free)
        ));
        self.show_status()?;
        self.pause()?;

        heading("4. trainer is suspended: its GPU memory is given back");
        say(
            "The suspend step moves trainer's GPU memory to host memory with the CUDA checkpoint API (here\n\
             the mock libcuda): the agent locks trainer's GPU process, checkpoints it, and keeps it frozen.",
        );
        self.wait_for("trainer is suspended", |d| {
            d.metrics_states()
                .get(&key("trainer"))
                .is_some_and(|s| s == "suspended")
        })?;
        self.wait_for("GPU 1's memory is free again", |d| {
            d.gpu_free(1).is_ok_and(|f| f >= frozen_free + 17 * GIB)
        })?;
        let suspended_free = self.gpu_free(1)?;
        say(&format!(
            "GPU 1 now has {} free (it had {} while trainer was only frozen). notebook grows to its\n\
             full 6 GiB quota, which it could not before:",
            gib(suspended_free),
            gib(frozen_free)
        ));
        self.grow("notebook", 6 * GIB)?;
        self.wait_for("notebook uses 6 GiB and is still ok", |d| {
            d.metrics_states()
                .get(&key("notebook"))
                .is_some_and(|s| s == "ok")
                && d.used_of("notebook").is_ok_and(|u| u == 6 * GIB)
        })?;
        self.show_status()?;
        self.pause()?;

        heading("5. An operator releases trainer");
        let out = Command::new(&self.agent_bin)
            .args(["release", &key("trainer"), "--socket"])
            .arg(self.path("agent.sock"))
            .output()?;
        ensure!(
            out.status.success(),
            "release failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!(
            "    $ gpushare-agent release {}\n{}",
            key("trainer"),
            indent(String::from_utf8_lossy(&out.stdout).trim_end())
        );
        // The job frees what it over-allocated; were it to stay over, the ladder would start again.
        set_memory(&pid_file, 12 * GIB)?;
        say(
            "trainer is resumed (thawed, its memory restored onto GPU 1, unlocked) and frees its extra\n\
             memory (back to 12 GiB of 16 GiB).",
        );
        self.wait_for("trainer is resumed and ok", |d| {
            !d.frozen("trainer")
                && d.metrics_states()
                    .get(&key("trainer"))
                    .is_some_and(|s| s == "ok")
        })?;
        ensure!(self.alive(0), "trainer died");
        self.check_neighbours()?;
        self.show_status()?;
        self.pause()?;

        heading("6. Stop everything");
        say(
            "The agent stops first (on SIGTERM it thaws anything it froze). Then each launcher gets SIGTERM,\n\
             passes it to its service, and when the service has exited removes its cgroup and its quota\n\
             registration.",
        );
        self.teardown()?;
        say("No cgroup, device node, drop-in or process is left.");
        Ok(())
    }

    fn prepare(&mut self) -> Result<()> {
        for bin in [&self.agent_bin, &self.fake_proc, &self.nvml_lib] {
            ensure!(bin.exists(), "{} is missing (build first)", bin.display());
        }
        for spec in &SERVICES {
            let scope = self.scope(spec.name);
            if scope.exists() {
                // A demo that was killed outright: remove its empty groups, refuse to touch live ones.
                fs::remove_dir(&scope).with_context(|| {
                    format!(
                        "{} exists and is busy: is another demo running?",
                        scope.display()
                    )
                })?;
            }
        }
        fs::create_dir_all(self.path("procmem"))?;
        fs::create_dir_all(self.path("runtime"))?;
        let scenario = format!(
            r#"{{
  "driver_version": "570.86.15",
  "cuda_driver_version": 12080,
  "devices": [
    {{ "uuid": "GPU-0d3e0000-demo-4000-8000-000000000000", "name": "NVIDIA Fake L40S", "memory_total": {} }},
    {{ "uuid": "GPU-0d3e0001-demo-4000-8000-000000000001", "name": "NVIDIA Fake A10", "memory_total": {} }}
  ],
  "process_memory_dir": "{}"
}}
"#,
            48 * GIB,
            24 * GIB,
            self.path("procmem").display()
        );
        fs::write(self.path("scenario.json"), scenario)?;
        fs::write(
            self.path("quotas.toml"),
            format!(
                "# The demo's quota file: only defaults; the services' quotas are registered by launch.\n\
                 [defaults]\n\
                 grace = \"{}\"\n\
                 ladder = [{{ action = \"alert\" }}, {{ action = \"signal\", after = \"{}\" }}, {{ action = \"freeze\", after = \"{}\" }}]\n",
                self.pace.grace, self.pace.signal_after, self.pace.freeze_after
            ),
        )?;
        let _ = fs::remove_file(DEVICE_NODE);
        let st = Command::new("mknod")
            .args(["-m", "0666", DEVICE_NODE, "c", "1", "3"])
            .status()
            .context("running mknod")?;
        ensure!(st.success(), "mknod {DEVICE_NODE} failed");
        self.device_made = true;
        say(&format!(
            "\nWorking directory {} (scenario, quotas, runtime drop-ins, agent state and logs).\n\
             Mock GPUs: GPU 0 \"NVIDIA Fake L40S\" 48 GiB, GPU 1 \"NVIDIA Fake A10\" 24 GiB.\n\
             Fake device node: {DEVICE_NODE} (char 1:3, /dev/null's numbers).",
            self.dir.display()
        ));
        Ok(())
    }

    fn launch_args(&self, name: &str, mem: &str) -> Vec<String> {
        let mut v = vec![
            "launch".to_string(),
            "--nvml-lib".into(),
            self.nvml_lib.display().to_string(),
            "--quotas".into(),
            self.path("quotas.toml").display().to_string(),
            "--runtime-quotas".into(),
            self.path("runtime").display().to_string(),
            "--gpu-mem".into(),
            mem.into(),
            "--name".into(),
            name.into(),
        ];
        if name == "trainer" {
            v.extend([
                "--grace".into(),
                self.pace.grace.into(),
                "--action".into(),
                format!(
                    "alert,signal@{},freeze@{},suspend@{}",
                    self.pace.signal_after, self.pace.freeze_after, self.pace.suspend_after
                ),
            ]);
        }
        v
    }

    fn launch(&mut self, spec: &Spec) -> Result<()> {
        let mut cmd = Command::new(&self.agent_bin);
        cmd.args(self.launch_args(spec.name, &format!("{}GiB", spec.quota_gib)))
            .arg("--")
            .arg(&self.fake_proc)
            .args(["--device", DEVICE_NODE, "--no-stdin", "--mem-dir"])
            .arg(self.path("procmem"))
            .args(["--mem", &(spec.uses_gib * GIB).to_string()])
            .env("GPUSHARE_FAKE_NVML_STATE", self.path("scenario.json"))
            .stdin(Stdio::null())
            .stdout(fs::File::create(self.path(&format!("{}.out", spec.name)))?)
            .stderr(fs::File::create(self.path(&format!("{}.log", spec.name)))?)
            .process_group(0);
        let shown = format!(
            "gpushare-agent launch --gpu-mem {}GiB --name {}{} -- gpushare-fake-gpu-proc --mem {}GiB ...",
            spec.quota_gib,
            spec.name,
            if spec.name == "trainer" {
                " --action ..."
            } else {
                ""
            },
            spec.uses_gib
        );
        let child = cmd.spawn().context("starting gpushare-agent launch")?;
        self.services.push(Proc {
            child: Some(child),
            what: format!("the launcher of {}", spec.name),
        });
        let i = self.services.len() - 1;
        let out = self.path(&format!("{}.out", spec.name));
        self.wait_for(&format!("{} starts", spec.name), |d| {
            fs::read_to_string(&out).is_ok_and(|t| t.starts_with("ready")) || !d.alive(i)
        })?;
        let log = self.service_log(spec.name);
        ensure!(self.alive(i), "launch of {} failed:\n{log}", spec.name);
        let line = log.lines().next().unwrap_or_default().to_string();
        println!("\n    $ {shown}\n{}", indent(&line));
        say(&format!(
            "{} ({}) uses {} GiB of its {} GiB quota.",
            spec.name, spec.role, spec.uses_gib, spec.quota_gib
        ));
        ensure!(
            line.contains(&format!("on GPU {} ", spec.expect_gpu)),
            "best fit should have put {} on GPU {}",
            spec.name,
            spec.expect_gpu
        );
        Ok(())
    }

    fn start_agent(&mut self) -> Result<()> {
        let log = fs::File::create(self.path("agent.log"))?;
        // Every path (quotas.toml, runtime drop-ins, state, socket) in the demo's directory, as
        // the tests start it.
        let mut cmd = gpushare_testkit::agent_command(
            &self.agent_bin,
            Some(&self.nvml_lib),
            &self.path("scenario.json"),
            &self.dir,
            &self.listen,
            self.pace.interval,
        );
        cmd.arg("--cuda-lib")
            .arg(self.nvml_lib.with_file_name("libcuda.so.1"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        println!(
            "\n    $ gpushare-agent --nvml-lib {} --quotas {} --runtime-quotas {} --listen {} ...",
            self.nvml_lib.display(),
            self.path("quotas.toml").display(),
            self.path("runtime").display(),
            self.listen
        );
        self.agent = Some(Proc {
            child: Some(cmd.spawn().context("starting the agent")?),
            what: "the agent".into(),
        });
        self.wait_for("the agent is ready (/healthz answers 200)", |d| {
            http_get(&d.listen, "/healthz").is_ok_and(|(c, _)| c == 200)
        })?;
        let log = fs::read_to_string(self.path("agent.log")).unwrap_or_default();
        let interesting: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.contains("NVML ready")
                    || l.contains("quotas loaded")
                    || l.contains("eBPF")
                    || l.contains("opened an nvidia device")
            })
            .take(8)
            .collect();
        println!("{}", indent(&interesting.join("\n")));
        Ok(())
    }

    /// Makes `name`'s fake process report `bytes` through the mock; (its memory file, bytes).
    fn grow(&self, name: &str, bytes: u64) -> Result<(PathBuf, u64)> {
        let procs = fs::read_to_string(self.scope(name).join("cgroup.procs"))?;
        let pid = procs
            .lines()
            .next()
            .context("the service's group is empty")?
            .trim()
            .to_string();
        let file = fs::read_dir(self.path("procmem"))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{pid}.")) && !n.ends_with(".tmp"))
            })
            .with_context(|| format!("no memory file of pid {pid}"))?;
        set_memory(&file, bytes)?;
        Ok((file, bytes))
    }

    /// The agent's state, from its local socket (the only listener that serves it).
    fn local_state(&self) -> Result<(u16, String)> {
        let sock = self.path("agent.sock");
        client::request(&client::Endpoint::Unix(&sock), "GET", "/api/v1/state", None)
    }

    /// Free memory of GPU `index` as the agent last sampled it.
    fn gpu_free(&self, index: u32) -> Result<u64> {
        let (_, body) = self.local_state()?;
        let v: serde_json::Value = serde_json::from_str(&body)?;
        v["gpus"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["index"] == index))
            .and_then(|g| g["memory_free_bytes"].as_u64())
            .with_context(|| format!("no GPU {index} in the agent's state"))
    }

    /// A service's GPU memory as the agent sees it (summed over its per-GPU rows).
    fn used_of(&self, name: &str) -> Result<u64> {
        let (_, body) = self.local_state()?;
        let v: serde_json::Value = serde_json::from_str(&body)?;
        let rows = v["workloads"].as_array().context("no workloads")?;
        Ok(rows
            .iter()
            .filter(|w| w["workload"] == key(name) && w["gpu_uuid"] != "all")
            .filter_map(|w| w["used_bytes"].as_u64())
            .sum())
    }

    fn check_neighbours(&mut self) -> Result<()> {
        let states = self.metrics_states();
        for (i, spec) in SERVICES.iter().enumerate().skip(1) {
            ensure!(
                states.get(&key(spec.name)).is_some_and(|s| s == "ok"),
                "{} should be ok, the agent says {:?}",
                spec.name,
                states.get(&key(spec.name))
            );
            ensure!(!self.frozen(spec.name), "{} was frozen", spec.name);
            ensure!(self.usr1s(spec.name) == 0, "{} was signalled", spec.name);
            ensure!(self.alive(i), "{} is not running", spec.name);
        }
        Ok(())
    }

    /// Stops the services (each launcher cleans up after its own), then the agent; removes the
    /// device node and the working directory; checks that nothing is left. Idempotent.
    fn teardown(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.torn_down, true) {
            return Ok(());
        }
        let mut problems = Vec::new();
        let mut pids = Vec::new();
        // The agent first: on SIGTERM it thaws what it froze, so no service is left frozen (a frozen
        // process cannot act on the SIGTERM its launcher passes on).
        if let Some(mut agent) = self.agent.take() {
            pids.push(agent.pid());
            match agent.stop(Duration::from_secs(20)) {
                Some(st) if st.success() => {}
                other => {
                    problems.push(format!("the agent should exit 0 on SIGTERM, got {other:?}"))
                }
            }
        }
        let mut services = std::mem::take(&mut self.services);
        for (svc, spec) in services.iter_mut().zip(&SERVICES) {
            pids.push(svc.pid());
            match svc.stop(Duration::from_secs(20)) {
                Some(st) if st.code() == Some(128 + SIGTERM) => {}
                Some(st) if INTERRUPTED.load(Ordering::SeqCst) => {
                    eprintln!("demo: {} exited with {st}", spec.name)
                }
                other => problems.push(format!(
                    "{}: the launcher should pass SIGTERM on and exit 143, got {other:?}",
                    spec.name
                )),
            }
        }
        if self.device_made {
            if let Err(e) = fs::remove_file(DEVICE_NODE) {
                problems.push(format!("removing {DEVICE_NODE}: {e}"));
            }
            self.device_made = false;
        }
        for spec in &SERVICES {
            if self.scope(spec.name).exists() {
                problems.push(format!(
                    "{} is left behind",
                    self.scope(spec.name).display()
                ));
            }
        }
        let left: Vec<String> = fs::read_dir(self.path("runtime"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".toml"))
                    .collect()
            })
            .unwrap_or_default();
        if !left.is_empty() {
            problems.push(format!("drop-ins left behind: {left:?}"));
        }
        let mem_left = fs::read_dir(self.path("procmem")).map_or(0, |rd| rd.count());
        if mem_left > 0 {
            problems.push(format!("{mem_left} memory file(s) left in procmem"));
        }
        let alive: Vec<i32> = pids
            .into_iter()
            .filter(|&p| p > 0 && Path::new(&format!("/proc/{p}")).exists())
            .collect();
        if !alive.is_empty() {
            problems.push(format!("processes left: {alive:?}"));
            for p in alive {
                // SAFETY: kill(2); these were our children and are already reaped, so at worst the
                // pid is gone.
                unsafe { kill(p, SIGKILL) };
            }
        }
        // The slice itself goes when no other launched service uses it.
        let _ = fs::remove_dir(self.cg_root.join("gpushare.slice"));
        if self.dir.exists() {
            let keep =
                self.keep_dir || (!problems.is_empty() && !INTERRUPTED.load(Ordering::SeqCst));
            if !keep {
                let _ = fs::remove_dir_all(&self.dir);
            } else {
                eprintln!(
                    "demo: keeping {} for inspection (agent.log, <service>.log)",
                    self.dir.display()
                );
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("cleanup found problems:\n  {}", problems.join("\n  "))
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("demo: {e:#}");
        }
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB as f64)
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Writes a fake process's memory file for the mock NVML atomically (temporary name + rename):
/// a reader (the agent's NVML, the mock libcuda's checks) never sees it empty or half-written.
fn set_memory(file: &Path, bytes: u64) -> Result<()> {
    let tmp = file.with_extension("set.tmp");
    fs::write(&tmp, bytes.to_string())?;
    fs::rename(&tmp, file)?;
    Ok(())
}
