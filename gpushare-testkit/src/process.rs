//! Fake GPU processes (the `gpushare-fake-gpu-proc` binary), driven through stdin.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::{TestCgroup, workspace_bin};

/// A running fake GPU process; killed on drop.
pub struct FakeGpuProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pid: u32,
}

impl FakeGpuProcess {
    /// Starts the fake process in `cgroup` (moved there before exec), opening `devices`.
    pub fn spawn(
        cgroup: Option<&TestCgroup>,
        devices: &[&Path],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let mut cmd = Command::new(workspace_bin("gpushare-fake-gpu-proc"));
        for d in devices {
            cmd.arg("--device").arg(d);
        }
        cmd.envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = match cgroup {
            Some(cg) => cg.spawn(&mut cmd)?,
            None => cmd.spawn().context("spawning gpushare-fake-gpu-proc")?,
        };
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let pid = line
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse().ok())
            .with_context(|| format!("fake-gpu-proc did not start: {line:?}"))?;
        Ok(Self {
            child,
            stdin,
            stdout,
            pid,
        })
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends one command without waiting for its answer (read it with [`Self::read_answer`]).
    pub fn send(&mut self, cmd: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        writeln!(stdin, "{cmd}")?;
        stdin.flush()?;
        Ok(())
    }

    /// Reads one answer line.
    pub fn read_answer(&mut self) -> Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        Ok(line.trim().to_string())
    }

    /// Sends one command and waits for `ok`.
    pub fn command(&mut self, cmd: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        writeln!(stdin, "{cmd}")?;
        stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        if line.trim() != "ok" {
            bail!("fake-gpu-proc answered {line:?} to {cmd:?}");
        }
        Ok(())
    }

    /// Closes stdin (the process exits 0) and waits.
    pub fn finish(mut self) -> Result<std::process::ExitStatus> {
        drop(self.stdin.take());
        Ok(self.child.wait()?)
    }

    /// Kills it with SIGKILL and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FakeGpuProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The uid and gid of `nobody`: a flooding tenant has no privilege.
pub const NOBODY: u32 = 65534;

/// An unprivileged (`nobody`), niced process (the fake GPU process binary `bin`) holding `fds`
/// fds and opening the missing node `missing` for ever, counting its tries in a file under
/// `dir`; killed on drop. What a hostile tenant does to make each failed nvidia open expensive.
pub struct Flooder {
    child: Child,
    count: std::path::PathBuf,
}

impl Flooder {
    /// Starts flooder `i` and waits until it holds its fds.
    pub fn spawn(bin: &Path, dir: &Path, i: usize, missing: &str, fds: usize) -> Self {
        use std::os::unix::process::CommandExt;
        let count = dir.join(format!("flood-{i}.count"));
        std::fs::write(&count, "0").unwrap();
        std::os::unix::fs::chown(&count, Some(NOBODY), Some(NOBODY)).unwrap();
        let mut cmd = Command::new(bin);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .uid(NOBODY)
            .gid(NOBODY);
        // SAFETY: nice(2) only, in the child before exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::nice(19);
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with("ready"), "flooder did not start: {line:?}");
        let stdin = child.stdin.as_mut().unwrap();
        writeln!(stdin, "flood {fds} {missing} {}", count.display()).unwrap();
        stdin.flush().unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ok", "flooder could not hold {fds} fds");
        Self { child, count }
    }

    /// Opens tried so far (to the last 1024).
    pub fn tries(&self) -> u64 {
        std::fs::read_to_string(&self.count)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Flooder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.count);
    }
}
