//! The service's cgroup v2 group, `<v2 root>/gpushare.slice/<name>.scope`: created empty by the
//! launcher, entered by the service between fork and exec, emptied and removed when it ends.

use std::{
    ffi::CString,
    fs,
    io::ErrorKind,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::spec::PARENT_SLICE;

/// One service's group.
#[derive(Debug)]
pub struct Scope {
    dir: PathBuf,
    rel: String,
}

impl Scope {
    /// Creates `<root>/gpushare.slice/<name>.scope` (and the parent when missing). Fails when the
    /// group exists: another service has that name.
    pub fn create(root: &Path, name: &str) -> Result<Scope> {
        let parent = root.join(PARENT_SLICE);
        let dir = parent.join(format!("{name}.scope"));
        // A finishing launch may remove an empty parent between our two mkdirs: try again.
        for _ in 0..5 {
            match fs::create_dir(&parent) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e).with_context(|| format!("creating {}", parent.display())),
            }
            match fs::create_dir(&dir) {
                Ok(()) => {
                    return Ok(Scope {
                        rel: format!("/{PARENT_SLICE}/{name}.scope"),
                        dir,
                    });
                }
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => bail!(
                    "a service named {name:?} already exists ({}): pick another --name",
                    dir.display()
                ),
                Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
            }
        }
        bail!("creating {}: its parent keeps disappearing", dir.display())
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path below the v2 root, as `/proc/<pid>/cgroup` shows it.
    pub fn rel(&self) -> &str {
        &self.rel
    }

    /// `cgroup.procs`, opened for writing (close-on-exec), for a child to move itself in.
    pub fn open_procs(&self) -> Result<OwnedFd> {
        let path = CString::new(self.dir.join("cgroup.procs").as_os_str().as_encoded_bytes())?;
        // SAFETY: a plain open(2) of a NUL-terminated path; the fd is owned from here on.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("opening {}/cgroup.procs", self.dir.display()));
        }
        // SAFETY: `fd` was just opened and is not owned by anything else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Pids in the group itself (not in sub-groups).
    pub fn pids(&self) -> Vec<u32> {
        pids_of(&self.dir)
    }

    /// Ends every process in the group and its sub-groups, then removes the groups. Waits up to
    /// `timeout` for the kernel to report the group empty.
    pub fn remove(&self, timeout: Duration) -> Result<()> {
        remove_group(&self.dir, timeout)
    }
}

/// Whether `cgroup.procs` lists any process anywhere below `dir` (`cgroup.events: populated`).
pub fn populated(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("cgroup.events")) {
        Ok(text) => text.lines().any(|l| l.trim() == "populated 1"),
        Err(_) => !pids_of(dir).is_empty(),
    }
}

fn pids_of(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// SIGKILL to everything below `dir`: `cgroup.kill` where the kernel has it (5.14+), else each pid,
/// sub-groups included. A frozen group is thawed first (a fatal signal ends frozen tasks in v2 too,
/// but a thawed group also lets a stuck `cgroup.kill`-less kernel make progress).
pub fn kill_group(dir: &Path) {
    let _ = fs::write(dir.join("cgroup.freeze"), "0");
    if fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    for pid in pids_of(dir) {
        // SAFETY: kill(2) with a pid read from cgroup.procs; a reused pid would be in this group.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                kill_group(&e.path());
            }
        }
    }
}

/// Kills what is left in `dir`, waits until it is empty, and removes it with its sub-groups.
pub fn remove_group(dir: &Path, timeout: Duration) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let deadline = Instant::now() + timeout;
    let mut last_kill: Option<Instant> = None;
    loop {
        let late = Instant::now() > deadline;
        if !populated(dir) {
            match remove_tree(dir) {
                Ok(()) => return Ok(()),
                Err(e) if late => {
                    return Err(e).with_context(|| format!("removing {}", dir.display()));
                }
                Err(_) => {}
            }
        } else if late {
            bail!(
                "{} still has processes {:?} after {timeout:?}; left in place",
                dir.display(),
                pids_of(dir)
            );
        } else if last_kill.is_none_or(|t| t.elapsed() > Duration::from_millis(200)) {
            // Again now and then: without cgroup.kill a forking process can slip through once.
            kill_group(dir);
            last_kill = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// rmdir of `dir` after its sub-groups, deepest first.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path())?;
            }
        }
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes `<root>/gpushare.slice` when no service is left in it (quietly does nothing otherwise).
pub fn remove_parent_if_empty(root: &Path) {
    let _ = fs::remove_dir(root.join(PARENT_SLICE));
}

/// Moves the calling process into the group whose `cgroup.procs` is open as `fd`. Only
/// async-signal-safe calls: meant for `pre_exec`.
pub fn enter(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: write(2) of a static one-byte buffer to an open fd.
    let n = unsafe { libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) };
    if n == 1 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
