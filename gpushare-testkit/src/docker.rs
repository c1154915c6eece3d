//! Real Docker containers for tests: a Docker engine (started when none runs), a local test image
//! built without any network, and containers that clean up after themselves.
//!
//! **Engine.** [`require_docker`] (once per test process) uses the engine that answers on the
//! default socket, or starts `dockerd --iptables=false --bridge=none` (containers use
//! `--network none`), logging to [`dockerd_log`], and waits until `docker version` answers. A daemon
//! the tests started is recorded in `/run/gpushare-test-docker/dockerd.pid`; one that was already
//! running is never stopped.
//!
//! **Image.** [`TEST_IMAGE`] is imported from a tarball (`docker import`), nothing pulled: Debian's
//! static busybox with its applet links in `/bin`, and the workspace's `gpushare-fake-gpu-proc` at
//! [`FAKE_GPU_PROC`] with the shared libraries `ldd` lists for it at their host paths (a static build
//! needs none). The image is labelled with a hash of those files ([`IMAGE_HASH_LABEL`]) and rebuilt
//! only when they change.
//!
//! **Cleanup.** Every container is a guard ([`Container`], [`GpuContainer`]) removed with
//! `docker rm -f` on drop, so a failing (panicking) test removes its containers too. Containers are
//! labelled with the test process's pid ([`OWNER_LABEL`]). When the test process exits (an `atexit`
//! handler, which also runs after failed tests), it removes any container it still owns; then, if no
//! other test process is using the engine (a shared `flock` each user holds), it removes the test
//! image (unless `GPUSHARE_KEEP_TEST_IMAGE=1`), containers and fake device nodes left by earlier
//! runs, and stops the daemon if tests started it. A test process killed with SIGKILL cannot clean
//! up: the next run adopts what it left (the recorded daemon, labelled containers) and cleans it then.

use std::{
    fs::{self, File},
    io::{BufRead, BufReader, Read, Write},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Output, Stdio},
    sync::{
        Mutex, OnceLock,
        mpsc::{self, Receiver},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    FakeDeviceNode,
    sys::{mountinfo, proc_cgroup},
    unique, workspace_bin,
};

/// The test image.
pub const TEST_IMAGE: &str = "gpushare-test/busybox:1";
/// Label holding the hash of the files the image was built from.
pub const IMAGE_HASH_LABEL: &str = "io.gpushare.test.hash";
/// Label holding the pid of the test process that owns a container.
pub const OWNER_LABEL: &str = "io.gpushare.test.owner";
/// The fake GPU program inside [`TEST_IMAGE`].
pub const FAKE_GPU_PROC: &str = "/usr/local/bin/gpushare-fake-gpu-proc";
/// Where a container sees its fake GPU.
pub const CONTAINER_DEVICE: &str = "/dev/nvidia0";
/// Set to `1` to keep [`TEST_IMAGE`] after the run (a cache across runs).
pub const KEEP_IMAGE_ENV: &str = "GPUSHARE_KEEP_TEST_IMAGE";
/// Prefix of the host's fake device nodes mapped into containers.
pub const DEVICE_NODE_PREFIX: &str = "/dev/nvidia-gpushare-docker-";

/// Locks and the record of a test-started daemon, shared by concurrent test processes.
const STATE_DIR: &str = "/run/gpushare-test-docker";
/// Bumped when the image layout changes, so a cached image is rebuilt.
const LAYOUT_VERSION: &str = "gpushare-test-image v1";
/// Default limit of one `docker` CLI call.
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// The engine and image the tests use (see the module documentation).
#[derive(Debug)]
pub struct Docker {
    image: String,
    started_dockerd: Option<u32>,
    image_built: bool,
}

impl Docker {
    /// The test image's reference.
    pub fn image(&self) -> &str {
        &self.image
    }

    /// The pid of the `dockerd` this process started, if it started one.
    pub fn started_dockerd(&self) -> Option<u32> {
        self.started_dockerd
    }

    /// Whether this process built the image (rather than finding it up to date).
    pub fn image_built(&self) -> bool {
        self.image_built
    }
}

static SETUP: OnceLock<Result<Docker, String>> = OnceLock::new();
/// The `dockerd` child this process started (so it can be reaped), if any.
static DAEMON_CHILD: Mutex<Option<Child>> = Mutex::new(None);
/// `(setup lock, users lock)`, held open for the process's life.
static LOCKS: Mutex<Option<(File, File)>> = Mutex::new(None);

/// The Docker engine and the test image, set up once per test process. When Docker cannot be used
/// (not root, no `docker`/`dockerd`, the daemon does not start) prints a loud SKIPPED line and
/// returns `None`; with `GPUSHARE_REQUIRE=1` (CI) it panics instead ([`crate::skip`]).
pub fn require_docker(test: &str) -> Option<&'static Docker> {
    if !crate::require_root(test) {
        return None;
    }
    match SETUP.get_or_init(|| setup().map_err(|e| format!("{e:#}"))) {
        Ok(d) => Some(d),
        Err(e) => {
            crate::cannot_run(test, &format!("Docker cannot be used here: {e}"));
            None
        }
    }
}

/// Where a `dockerd` started by the tests logs.
pub fn dockerd_log() -> PathBuf {
    std::env::temp_dir().join("gpushare-test-dockerd.log")
}

/// Runs `docker ARGS` (limit 60 s); its trimmed stdout, or an error with its stderr.
pub fn docker(args: &[&str]) -> Result<String> {
    let out = run_timeout(Command::new("docker").args(args), CLI_TIMEOUT)?;
    if !out.status.success() {
        bail!(
            "docker {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs `cmd` with piped output, killing it after `timeout`.
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {cmd:?}"))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => Ok(out?),
        Err(_) => {
            // SAFETY: kill(2) of our own child, not yet reaped (the thread reaps it).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = rx.recv();
            bail!("{cmd:?} did not finish in {timeout:?}")
        }
    }
}

fn daemon_answers() -> bool {
    run_timeout(
        Command::new("docker").args(["version", "--format", "{{.Server.Version}}"]),
        Duration::from_secs(10),
    )
    .is_ok_and(|o| o.status.success() && !o.stdout.trim_ascii().is_empty())
}

fn in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/sbin".into(), "/usr/bin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn flock(f: &File, op: libc::c_int) -> bool {
    // SAFETY: flock(2) on an fd we own.
    unsafe { libc::flock(f.as_raw_fd(), op) == 0 }
}

fn open_lock(name: &str) -> Result<File> {
    let path = Path::new(STATE_DIR).join(name);
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))
}

fn pid_file() -> PathBuf {
    Path::new(STATE_DIR).join("dockerd.pid")
}

/// `(comm, state, start time in clock ticks since boot)` of process `pid`.
fn proc_stat(pid: u32) -> Option<(String, char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (comm, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
    // `rest` starts at field 3 (state); field 22 is the start time.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((
        comm.to_string(),
        fields.first()?.chars().next()?,
        fields.get(19)?.parse().ok()?,
    ))
}

/// The start time of a live (not zombie) `dockerd` with this pid.
fn dockerd_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid)
        .filter(|(comm, state, _)| comm == "dockerd" && *state != 'Z')
        .map(|(_, _, start)| start)
}

fn is_dockerd(pid: u32) -> bool {
    dockerd_start_time(pid).is_some()
}

/// The daemon tests started (this run or an earlier one), if it still runs: the pid file names its
/// pid and start time, so a reused pid is not mistaken for it.
fn test_started_dockerd() -> Option<u32> {
    let text = fs::read_to_string(pid_file()).ok()?;
    let mut f = text.split_whitespace().map(|w| w.parse::<u64>().ok());
    if let (Some(Some(pid)), Some(Some(start))) = (f.next(), f.next())
        && dockerd_start_time(pid as u32) == Some(start)
    {
        return Some(pid as u32);
    }
    let _ = fs::remove_file(pid_file());
    None
}

fn setup() -> Result<Docker> {
    let docker_cli = in_path("docker").context("no `docker` CLI in PATH (Debian: docker.io)")?;
    fs::create_dir_all(STATE_DIR).with_context(|| format!("creating {STATE_DIR}"))?;
    let setup_lock = open_lock("setup.lock")?;
    let users_lock = open_lock("users.lock")?;
    if !flock(&setup_lock, libc::LOCK_EX) || !flock(&users_lock, libc::LOCK_SH) {
        bail!("flock in {STATE_DIR}: {}", std::io::Error::last_os_error());
    }
    let result = (|| -> Result<Docker> {
        let mut started_dockerd = None;
        if !daemon_answers() {
            started_dockerd = Some(start_dockerd()?);
        }
        let (image, image_built) = ensure_image()?;
        Ok(Docker {
            image,
            started_dockerd,
            image_built,
        })
    })();
    flock(&setup_lock, libc::LOCK_UN);
    *LOCKS.lock().unwrap_or_else(|e| e.into_inner()) = Some((setup_lock, users_lock));
    // SAFETY: registering a function that does not unwind (it catches panics).
    unsafe { libc::atexit(teardown_at_exit) };
    result.with_context(|| format!("(docker CLI {})", docker_cli.display()))
}

fn start_dockerd() -> Result<u32> {
    let dockerd = in_path("dockerd")
        .context("no Docker engine answers and `dockerd` is not installed (Debian: docker.io)")?;
    let log_path = dockerd_log();
    let log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut child = Command::new(&dockerd)
        .args(["--iptables=false", "--bridge=none"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", dockerd.display()))?;
    let pid = child.id();
    let start = proc_stat(pid).map_or(0, |(_, _, start)| start);
    fs::write(pid_file(), format!("{pid} {start}\n"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait()? {
            let _ = fs::remove_file(pid_file());
            bail!(
                "dockerd exited at start ({st}); log {}:\n{}",
                log_path.display(),
                log_tail(&log_path)
            );
        }
        if daemon_answers() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = fs::remove_file(pid_file());
            bail!(
                "dockerd did not answer within 30 s; log {}:\n{}",
                log_path.display(),
                log_tail(&log_path)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    *DAEMON_CHILD.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
    Ok(pid)
}

fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// FNV-1a, 64 bits: enough to tell whether the image's inputs changed.
fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *hash ^= u64::from(*b);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

/// The shared libraries `ldd` lists for `bin` (absolute paths; none for a static binary).
fn needed_libs(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = run_timeout(Command::new("ldd").arg(bin), Duration::from_secs(30))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let all = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
        if all.contains("not a dynamic executable") || all.contains("statically linked") {
            return Ok(Vec::new());
        }
        bail!("ldd {}: {}", bin.display(), all.trim());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        } else if line.contains("not found") {
            bail!("ldd {}: {line}", bin.display());
        }
    }
    Ok(libs)
}

fn busybox_path() -> Result<PathBuf> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("no busybox (Debian: busybox-static)")
}

/// Builds [`TEST_IMAGE`] unless an image with the same input hash exists. Returns (image, built).
fn ensure_image() -> Result<(String, bool)> {
    let fake = workspace_bin("gpushare-fake-gpu-proc");
    let busybox = busybox_path()?;
    let libs = needed_libs(&fake)?;
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    fnv1a(&mut hash, LAYOUT_VERSION.as_bytes());
    for f in [&fake, &busybox].into_iter().chain(libs.iter()) {
        fnv1a(&mut hash, f.as_os_str().as_encoded_bytes());
        fnv1a(
            &mut hash,
            &fs::read(f).with_context(|| format!("reading {}", f.display()))?,
        );
    }
    let hash = format!("{hash:016x}");
    let current = docker(&[
        "image",
        "inspect",
        "-f",
        &format!("{{{{.Id}}}} {{{{index .Config.Labels \"{IMAGE_HASH_LABEL}\"}}}}"),
        TEST_IMAGE,
    ])
    .ok();
    let old_id = match current.as_deref().and_then(|c| c.split_once(' ')) {
        Some((_, label)) if label == hash => return Ok((TEST_IMAGE.to_string(), false)),
        Some((id, _)) => Some(id.to_string()),
        None => None,
    };

    let root = TempTree::new()?;
    let r = &root.0;
    for d in [
        "bin",
        "usr/local/bin",
        "etc",
        "dev",
        "proc",
        "sys",
        "tmp",
        "root",
    ] {
        fs::create_dir_all(r.join(d))?;
    }
    fs::copy(&busybox, r.join("bin/busybox"))?;
    let list = run_timeout(
        Command::new(&busybox).arg("--list"),
        Duration::from_secs(10),
    )?;
    for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
        if applet != "busybox" && !applet.contains('/') {
            std::os::unix::fs::symlink("busybox", r.join("bin").join(applet))?;
        }
    }
    fs::copy(&fake, r.join(FAKE_GPU_PROC.trim_start_matches('/')))?;
    for lib in &libs {
        let dest = r.join(lib.strip_prefix("/").unwrap_or(lib));
        fs::create_dir_all(dest.parent().context("library path")?)?;
        fs::copy(lib, &dest).with_context(|| format!("copying {}", lib.display()))?;
    }
    fs::write(r.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
    fs::write(r.join("etc/group"), "root:x:0:\n")?;

    let mut tar = Command::new("tar")
        .args(["--numeric-owner", "-C"])
        .arg(r)
        .args(["-cf", "-", "."])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning tar")?;
    let tar_out = tar.stdout.take().context("tar stdout")?;
    let import = Command::new("docker")
        .args([
            "import",
            "-c",
            &format!("LABEL {IMAGE_HASH_LABEL}={hash}"),
            "-c",
            "CMD [\"/bin/sh\"]",
            "-",
            TEST_IMAGE,
        ])
        .stdin(Stdio::from(tar_out))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .context("docker import")?;
    let tar_st = tar.wait()?;
    if !tar_st.success() || !import.status.success() {
        bail!(
            "building {TEST_IMAGE}: tar {tar_st}, docker import {}: {}",
            import.status,
            String::from_utf8_lossy(&import.stderr).trim()
        );
    }
    if let Some(old) = old_id {
        // The previous build, now untagged.
        let _ = docker(&["rmi", &old]);
    }
    Ok((TEST_IMAGE.to_string(), true))
}

/// A temporary directory tree, removed on drop.
struct TempTree(PathBuf);

impl TempTree {
    fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join(unique("gpushare-test-rootfs"));
        fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

extern "C" fn teardown_at_exit() {
    let _ = std::panic::catch_unwind(teardown);
}

/// What the process does at exit; see the module documentation.
fn teardown() {
    let Some((setup_lock, users_lock)) = LOCKS.lock().unwrap_or_else(|e| e.into_inner()).take()
    else {
        return;
    };
    let mut said = Vec::new();
    flock(&setup_lock, libc::LOCK_EX);
    let mine = format!("label={OWNER_LABEL}={}", std::process::id());
    let n = remove_containers(&mine);
    if n > 0 {
        said.push(format!("removed {n} leftover container(s)"));
    }
    flock(&users_lock, libc::LOCK_UN);
    if flock(&users_lock, libc::LOCK_EX | libc::LOCK_NB) {
        // The last user: clean up what any test run left behind.
        let n = remove_containers(&format!("label={OWNER_LABEL}"));
        if n > 0 {
            said.push(format!("removed {n} container(s) of earlier runs"));
        }
        if std::env::var(KEEP_IMAGE_ENV).as_deref() != Ok("1")
            && docker(&["image", "inspect", TEST_IMAGE]).is_ok()
        {
            match docker(&["rmi", "-f", TEST_IMAGE]) {
                Ok(_) => said.push(format!("removed image {TEST_IMAGE}")),
                Err(e) => said.push(format!("could not remove {TEST_IMAGE}: {e:#}")),
            }
        }
        remove_stale_device_nodes();
        if let Some(pid) = test_started_dockerd() {
            said.push(stop_dockerd(pid));
        }
        flock(&users_lock, libc::LOCK_UN);
    }
    flock(&setup_lock, libc::LOCK_UN);
    if !said.is_empty() {
        let _ = writeln!(
            std::io::stderr(),
            "gpushare-testkit docker cleanup: {}",
            said.join("; ")
        );
    }
}

/// `docker rm -f` of the containers matching `filter`; how many.
fn remove_containers(filter: &str) -> usize {
    let Ok(ids) = docker(&["ps", "-aq", "--filter", filter]) else {
        return 0;
    };
    let ids: Vec<&str> = ids.split_whitespace().collect();
    for id in &ids {
        let _ = docker(&["unpause", id]);
        let _ = docker(&["rm", "-f", "-v", id]);
    }
    ids.len()
}

fn remove_stale_device_nodes() {
    let Ok(rd) = fs::read_dir("/dev") else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.to_str()
            .is_some_and(|s| s.starts_with(DEVICE_NODE_PREFIX))
        {
            let _ = fs::remove_file(p);
        }
    }
}

/// Stops the test-started daemon `pid` (SIGTERM, then SIGKILL after 20 s) and waits for it.
fn stop_dockerd(pid: u32) -> String {
    let mut child = DAEMON_CHILD
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    // SAFETY: kill(2); `pid` was checked to be a dockerd the tests recorded.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let gone = |child: &mut Option<Child>| match child {
        Some(c) if c.id() == pid => c.try_wait().ok().flatten().is_some(),
        _ => !is_dockerd(pid),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut how = "stopped";
    while !gone(&mut child) {
        if Instant::now() > deadline {
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            if let Some(c) = child.as_mut() {
                let _ = c.wait();
            }
            // Its containerd would outlive it.
            if let Some(cpid) = fs::read_to_string("/var/run/docker/containerd/containerd.pid")
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                // SAFETY: kill(2) of the engine's own containerd.
                unsafe { libc::kill(cpid, libc::SIGKILL) };
            }
            how = "killed (SIGTERM did not stop it in 20 s)";
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = fs::remove_file(pid_file());
    format!("{how} the dockerd the tests started (pid {pid})")
}

/// A Docker container, removed (`docker rm -f`) on drop.
#[derive(Debug)]
pub struct Container {
    id: String,
    name: String,
    v2_dir: Option<PathBuf>,
}

impl Container {
    /// `docker run -d` of `cmd` in the test image, named `gpushare-test-<hint>-<pid>-<n>`, with
    /// `--network none` and `docker_args` (e.g. `-i`, `--restart always`, `-e K=V`).
    pub fn run(docker: &Docker, hint: &str, docker_args: &[&str], cmd: &[&str]) -> Result<Self> {
        let name = unique(&format!("gpushare-test-{hint}"));
        let owner = format!("{OWNER_LABEL}={}", std::process::id());
        let mut args = vec![
            "run",
            "-d",
            "--name",
            &name,
            "--label",
            &owner,
            "--network",
            "none",
        ];
        args.extend_from_slice(docker_args);
        args.push(docker.image());
        args.extend_from_slice(cmd);
        let guard = RemoveByName(Some(name.clone()));
        let id = self::docker(&args)?;
        Ok(Self::guarding(guard, id))
    }

    /// The container named `name` (already created), as a guard.
    fn adopt(name: String) -> Result<Self> {
        let guard = RemoveByName(Some(name));
        let id = docker(&["inspect", "-f", "{{.Id}}", guard.0.as_deref().unwrap_or("")])?;
        Ok(Self::guarding(guard, id))
    }

    /// The container `id` that `guard` removes by name, as a guard by id (its v2 group found now).
    fn guarding(guard: RemoveByName, id: String) -> Self {
        let mut c = Self {
            id,
            name: guard.disarm(),
            v2_dir: None,
        };
        c.v2_dir = c.find_v2_dir().ok();
        c
    }

    /// Full id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Name (without the leading `/`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The agent's workload key, `docker://<id>`.
    pub fn key(&self) -> String {
        format!("docker://{}", self.id)
    }

    /// `docker inspect -f FORMAT`.
    pub fn inspect(&self, format: &str) -> Result<String> {
        docker(&["inspect", "-f", format, &self.id])
    }

    /// The host pid of the container's main process (`.State.Pid`); an error when not running.
    pub fn host_pid(&self) -> Result<u32> {
        let pid: u32 = self.inspect("{{.State.Pid}}")?.parse()?;
        if pid == 0 {
            bail!("container {} is not running", self.name);
        }
        Ok(pid)
    }

    /// Waits until the container runs a main process other than `old` (a restart); its pid.
    pub fn wait_new_pid(&self, old: u32, timeout: Duration) -> Result<u32> {
        let deadline = Instant::now() + timeout;
        loop {
            let state = self.inspect("{{.State.Running}} {{.State.Restarting}} {{.State.Pid}}")?;
            if let ["true", "false", pid] = state.split_whitespace().collect::<Vec<_>>()[..]
                && let Ok(pid) = pid.parse::<u32>()
                && pid != 0
                && pid != old
            {
                return Ok(pid);
            }
            if Instant::now() > deadline {
                bail!(
                    "container {} has no new process after {timeout:?}: {state}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `docker exec <container> ARGS` (limit `timeout`).
    pub fn exec(&self, args: &[&str], timeout: Duration) -> Result<Output> {
        run_timeout(
            Command::new("docker").arg("exec").arg(&self.id).args(args),
            timeout,
        )
    }

    /// Whether `docker exec <container> true` succeeds within 10 s (the container runs and is
    /// neither paused nor frozen).
    pub fn responds(&self) -> bool {
        self.exec(&["true"], Duration::from_secs(10))
            .is_ok_and(|o| o.status.success())
    }

    /// `docker pause`.
    pub fn pause(&self) -> Result<()> {
        docker(&["pause", &self.id]).map(drop)
    }

    /// `docker unpause`.
    pub fn unpause(&self) -> Result<()> {
        docker(&["unpause", &self.id]).map(drop)
    }

    /// Whether Docker says the container is paused.
    pub fn is_paused(&self) -> Result<bool> {
        Ok(self.inspect("{{.State.Paused}}")? == "true")
    }

    fn find_v2_dir(&self) -> Result<PathBuf> {
        let pid = self.host_pid()?;
        let rel = proc_cgroup::v2_path(pid)?.context("no cgroup v2 line")?;
        Ok(crate::cgroup::v2_root()?.join(rel.trim_start_matches('/')))
    }

    /// The container's cgroup v2 directory (e.g. `/sys/fs/cgroup/unified/docker/<id>`), found
    /// when it started.
    pub fn v2_dir(&self) -> Option<&Path> {
        self.v2_dir.as_deref()
    }

    /// The cgroup v2 path as `/proc/<pid>/cgroup` spells it (e.g. `/docker/<id>`).
    pub fn v2_rel_path(&self) -> Option<String> {
        let root = crate::cgroup::v2_root().ok()?;
        let rel = self.v2_dir.as_deref()?.strip_prefix(&root).ok()?;
        Some(format!("/{}", rel.display()))
    }

    /// Whether the kernel reports the container's v2 group frozen (`frozen 1` in `cgroup.events`).
    /// Panics when the container has no v2 group or its state cannot be read: an unreadable state
    /// is not "thawed".
    pub fn is_v2_frozen(&self) -> bool {
        let dir = self
            .v2_dir
            .as_ref()
            .unwrap_or_else(|| panic!("container {} has no cgroup v2 group", self.name));
        let path = dir.join("cgroup.events");
        let events =
            fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        events.lines().any(|l| l.trim() == "frozen 1")
    }

    /// Waits up to `timeout` for the v2 group to report frozen (`true`) or not (`false`).
    pub fn wait_v2_frozen(&self, frozen: bool, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_v2_frozen() == frozen {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The state of the container's v1 freezer group (`FROZEN`, `THAWED`), which `docker pause`
    /// uses on hosts with a v1 freezer; `None` where there is none (pure cgroup v2).
    pub fn v1_freezer_state(&self) -> Option<String> {
        let pid = self.host_pid().ok()?;
        let rel = proc_cgroup::v1_path(pid, "freezer").ok()??;
        fs::read_to_string(
            mountinfo::cgroup1_root("freezer")?
                .join(rel.trim_start_matches('/'))
                .join("freezer.state"),
        )
        .ok()
        .map(|s| s.trim().to_string())
    }

    /// Removes the container now (`docker rm -f`), reporting errors (drop ignores them).
    pub fn remove(mut self) -> Result<()> {
        let id = std::mem::take(&mut self.id);
        remove_container(&id)
    }
}

fn remove_container(id: &str) -> Result<()> {
    // A paused container is unpaused first (older engines refuse to kill it).
    let _ = run_timeout(
        Command::new("docker").args(["unpause", id]),
        Duration::from_secs(20),
    );
    docker(&["rm", "-f", "-v", id]).map(drop)
}

impl Drop for Container {
    fn drop(&mut self) {
        if !self.id.is_empty() {
            let _ = remove_container(&self.id);
        }
    }
}

/// Removes a container by name on drop, until disarmed.
struct RemoveByName(Option<String>);

impl RemoveByName {
    fn disarm(mut self) -> String {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for RemoveByName {
    fn drop(&mut self) {
        if let Some(name) = self.0.take() {
            let _ = remove_container(&name);
        }
    }
}

/// A container running the fake GPU program on a fake device node mapped as
/// [`CONTAINER_DEVICE`]: it opens the node, then waits for commands on stdin (see
/// `gpushare-fake-gpu-proc`). Removed on drop, with its device node. Dereferences to its
/// [`Container`].
pub struct GpuContainer {
    container: Container,
    pid: u32,
    attached: Option<Attached>,
    node: FakeDeviceNode,
}

struct Attached {
    cli: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: std::sync::Arc<Mutex<String>>,
}

impl GpuContainer {
    /// Runs the fake GPU program attached (`docker run -i`): [`Self::command`] drives it through
    /// the CLI's stdin. `docker_args` go to `docker run` (e.g. `-e K=V`).
    pub fn attached(docker: &Docker, hint: &str, docker_args: &[&str]) -> Result<Self> {
        Self::attached_cmd(
            docker,
            hint,
            docker_args,
            &[FAKE_GPU_PROC, "--device", CONTAINER_DEVICE],
        )
    }

    /// Like [`Self::attached`], with `cmd` as the container's command: it must run the fake GPU
    /// program on [`CONTAINER_DEVICE`] with its stdin and stdout, e.g. from a shell entrypoint
    /// (`sh -c '... FAKE_GPU_PROC --device /dev/nvidia0; exit'`). Then [`Self::pid`] is the
    /// container's main process, and [`Self::gpu_pid`] the fake GPU program.
    pub fn attached_cmd(
        docker: &Docker,
        hint: &str,
        docker_args: &[&str],
        cmd: &[impl AsRef<std::ffi::OsStr>],
    ) -> Result<Self> {
        Self::attached_cmd_on(docker, hint, CONTAINER_DEVICE, docker_args, cmd)
    }

    /// Like [`Self::attached`], with the fake node mapped as `device` in the container (e.g.
    /// `/dev/nvidia1`, a device minor NVML may give another index) and the program opening it.
    pub fn attached_on(
        docker: &Docker,
        hint: &str,
        device: &str,
        docker_args: &[&str],
    ) -> Result<Self> {
        Self::attached_cmd_on(
            docker,
            hint,
            device,
            docker_args,
            &[FAKE_GPU_PROC, "--device", device],
        )
    }

    fn attached_cmd_on(
        docker: &Docker,
        hint: &str,
        device: &str,
        docker_args: &[&str],
        cmd: &[impl AsRef<std::ffi::OsStr>],
    ) -> Result<Self> {
        let node = FakeDeviceNode::create_at(PathBuf::from(format!(
            "{DEVICE_NODE_PREFIX}{}",
            unique(hint)
        )))?;
        let name = unique(&format!("gpushare-test-{hint}"));
        let guard = RemoveByName(Some(name.clone()));
        let mut cli = Command::new("docker")
            .args(["run", "-i", "--name", &name, "--label"])
            .arg(format!("{OWNER_LABEL}={}", std::process::id()))
            .args(["--network", "none", "--device"])
            .arg(format!("{}:{device}", node.path().display()))
            .args(docker_args)
            .arg(docker.image())
            .args(cmd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning docker run")?;
        let stdin = cli.stdin.take();
        let stdout = cli.stdout.take().context("stdout")?;
        let mut err_pipe = cli.stderr.take().context("stderr")?;
        let stderr = std::sync::Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut s) = sink.lock() {
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line.trim().to_string()).is_err() {
                    break;
                }
            }
        });
        let mut attached = Attached {
            cli,
            stdin,
            lines,
            stderr,
        };
        let ready = attached.lines.recv_timeout(Duration::from_secs(30));
        if !matches!(&ready, Ok(l) if l.starts_with("ready ")) {
            let _ = attached.cli.kill();
            let _ = attached.cli.wait();
            bail!(
                "container {name} did not start the fake GPU program ({ready:?}); docker said: {}",
                attached
                    .stderr
                    .lock()
                    .map(|s| s.clone())
                    .unwrap_or_default()
            );
        }
        drop(guard.disarm());
        let container = Container::adopt(name)?;
        let pid = container.host_pid()?;
        Ok(Self {
            container,
            pid,
            attached: Some(attached),
            node,
        })
    }

    /// Runs the fake GPU program detached (`docker run -d -i`: stdin stays open, so it waits
    /// forever). `docker_args` go to `docker run` (e.g. `--restart always`).
    pub fn detached(docker: &Docker, hint: &str, docker_args: &[&str]) -> Result<Self> {
        let node = FakeDeviceNode::create_at(PathBuf::from(format!(
            "{DEVICE_NODE_PREFIX}{}",
            unique(hint)
        )))?;
        let dev = format!("{}:{CONTAINER_DEVICE}", node.path().display());
        let mut args = vec!["-i", "--device", &dev];
        args.extend_from_slice(docker_args);
        let container = Container::run(
            docker,
            hint,
            &args,
            &[FAKE_GPU_PROC, "--device", CONTAINER_DEVICE],
        )?;
        let pid = container.host_pid()?;
        // Started: its device is open once /proc shows it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !holds_device(pid) {
            if Instant::now() > deadline {
                bail!("container {} never opened its device", container.name());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self {
            container,
            pid,
            attached: None,
            node,
        })
    }

    /// The host pid of the fake GPU program when it started.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The host pid of the container's process that holds its fake GPU open (the fake GPU
    /// program, wherever in the container's process tree it runs), if one does.
    pub fn gpu_pid(&self) -> Option<u32> {
        let procs = fs::read_to_string(self.v2_dir()?.join("cgroup.procs")).ok()?;
        procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .find(|&pid| holds_device(pid))
    }

    /// The host's device node mapped into the container.
    pub fn device_node(&self) -> &Path {
        self.node.path()
    }

    /// Sends one command (`ioctl N`, `alloc N`, `xfer N`, ...) and waits up to 10 s for `ok`
    /// (attached containers only; a frozen container does not answer).
    pub fn command(&mut self, cmd: &str) -> Result<()> {
        let a = self
            .attached
            .as_mut()
            .context("not an attached container")?;
        let stdin = a.stdin.as_mut().context("stdin closed")?;
        writeln!(stdin, "{cmd}")?;
        stdin.flush()?;
        match a.lines.recv_timeout(Duration::from_secs(10)) {
            Ok(l) if l == "ok" => Ok(()),
            other => bail!("fake GPU program answered {other:?} to {cmd:?}"),
        }
    }

    /// What `docker run` and the fake GPU program wrote on stderr so far (attached only).
    pub fn stderr(&self) -> String {
        self.attached
            .as_ref()
            .and_then(|a| a.stderr.lock().ok().map(|s| s.clone()))
            .unwrap_or_default()
    }
}

/// Whether process `pid` holds a `/dev/nvidia*` node open (as its own mount namespace names it).
fn holds_device(pid: u32) -> bool {
    fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("/dev/nvidia"))
        })
    })
}

impl std::ops::Deref for GpuContainer {
    type Target = Container;

    fn deref(&self) -> &Container {
        &self.container
    }
}

impl Drop for GpuContainer {
    fn drop(&mut self) {
        // Remove the container first (the attached CLI then ends by itself), then reap the CLI.
        let id = std::mem::take(&mut self.container.id);
        if !id.is_empty() {
            let _ = remove_container(&id);
        }
        if let Some(mut a) = self.attached.take() {
            drop(a.stdin.take());
            let deadline = Instant::now() + Duration::from_secs(10);
            while a.cli.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = a.cli.kill();
            let _ = a.cli.wait();
        }
    }
}
