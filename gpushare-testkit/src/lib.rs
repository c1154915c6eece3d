//! Test support for gpushare: real cgroups, fake nvidia device nodes and fake GPU processes.
//!
//! Every fixture cleans up on drop, so a failing test leaves nothing behind. When a test cannot run
//! on this machine, [`skip`] says whether it skips loudly or fails.
#![deny(missing_docs)]

pub mod bench;
pub mod c_abi;
pub mod cgroup;
pub mod device;
pub mod docker;
pub mod nvml;
pub mod process;
pub mod skip;
/// The agent's own `/proc` readers (mountinfo, `/proc/<pid>/cgroup`), from `gpushare-base`: tests
/// and xtask read the kernel as the agent does.
pub use gpushare_base::sys;

pub use cgroup::TestCgroup;
pub use device::FakeDeviceNode;
pub use process::FakeGpuProcess;
pub use skip::{cannot_run, loud_skip, require_root};

use std::path::PathBuf;

/// The workspace's root directory (this crate's parent), as the source tree has it.
pub fn workspace_root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit is in the workspace")
        .to_path_buf()
}

/// Directory holding the workspace's built binaries (the test executable's `target/<profile>`).
pub fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Path of a binary of this workspace, built by `cargo build` (or `cargo xtask test`). Benchmarks
/// run from `target/release` and fall back to the debug build.
pub fn workspace_bin(name: &str) -> PathBuf {
    let dir = target_profile_dir();
    let path = dir.join(name);
    if path.exists() {
        return path;
    }
    let debug = dir.join("../debug").join(name);
    assert!(
        debug.exists(),
        "{} is not built; run `cargo build` first (`cargo xtask test` does)",
        path.display()
    );
    debug
}

/// A unique suffix for names of test objects: pid and a counter.
pub fn unique(name: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A private temporary directory named `<prefix><random>`, removed on drop.
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("a temporary directory")
}

/// A private temporary directory named `<prefix><random>` that tests write files into; removed on
/// drop.
pub struct TempTree(tempfile::TempDir);

impl TempTree {
    /// A fresh, empty one.
    pub fn new(prefix: &str) -> Self {
        Self(temp_dir(prefix))
    }

    /// Where it is.
    pub fn path(&self) -> &std::path::Path {
        self.0.path()
    }

    /// Writes `text` to `rel` (relative to the tree), creating the directories above it; returns
    /// the file's path.
    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.0.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("a file in a directory")).expect("its directory");
        std::fs::write(&p, text).expect("the file");
        p
    }
}

/// Runs `cmd` to its end and returns what it printed; panics where it cannot start or fails,
/// naming `what` and giving its status and both outputs.
pub fn output_ok(cmd: &mut std::process::Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// SIGTERM to `child` (unless it has already exited), then waits up to `timeout`, then SIGKILL.
/// The exit status if it exited by itself; `None` when it had to be killed.
pub fn terminate(
    child: &mut std::process::Child,
    timeout: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    if let Ok(Some(st)) = child.try_wait() {
        return Some(st);
    }
    // SAFETY: kill(2) of our own unreaped child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A fresh private directory for an agent started with [`agent_command`]: `quotas.toml` holding
/// `quotas`, `quotas.d/` created; named `<tag>-<pid>-<n>` under the temporary directory.
pub fn agent_dir(tag: &str, quotas: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(tag));
    std::fs::create_dir_all(dir.join("quotas.d")).expect("an agent directory");
    std::fs::write(dir.join("quotas.toml"), quotas).expect("quotas.toml");
    dir
}

/// The agent binary's command line for tests and benchmarks: the mock NVML at `nvml_lib` with its
/// scenario at `scenario`, and every path (quotas.toml, runtime drop-ins, state, socket) inside `dir`.
pub fn agent_command(
    agent_bin: &std::path::Path,
    nvml_lib: Option<&std::path::Path>,
    scenario: &std::path::Path,
    dir: &std::path::Path,
    listen: &str,
    interval: &str,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(agent_bin);
    if let Some(lib) = nvml_lib {
        cmd.arg("--nvml-lib").arg(lib);
    }
    cmd.arg("--quotas")
        .arg(dir.join("quotas.toml"))
        .arg("--runtime-quotas")
        .arg(dir.join("runtime"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--socket")
        .arg(dir.join("agent.sock"))
        .args(["--listen", listen, "--interval", interval])
        .env(nvml::SCENARIO_ENV, scenario);
    cmd
}
