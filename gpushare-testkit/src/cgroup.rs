//! Real cgroup v2 groups for tests, removed on drop (processes killed first).

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

/// Parent of every test group, under the v2 root.
pub const TEST_PARENT: &str = "gpushare-test";

/// The cgroup v2 mount point: `/sys/fs/cgroup/unified` on hybrid systems, `/sys/fs/cgroup` on pure v2.
pub fn v2_root() -> Result<PathBuf> {
    crate::sys::mountinfo::cgroup2_root().context("no cgroup2 hierarchy mounted")
}

/// A cgroup v2 group created for one test.
pub struct TestCgroup {
    dir: PathBuf,
    rel: String,
}

impl TestCgroup {
    /// Creates `<v2 root>/gpushare-test/<name>`.
    pub fn create(name: &str) -> Result<Self> {
        let root = v2_root()?;
        Self::create_at(&root, &format!("{TEST_PARENT}/{name}"))
    }

    /// Creates `<root>/<rel>` (parents included).
    pub fn create_at(root: &Path, rel: &str) -> Result<Self> {
        let dir = root.join(rel);
        fs::create_dir_all(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
        Ok(Self {
            dir,
            rel: format!("/{}", rel.trim_matches('/')),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path as `/proc/<pid>/cgroup` spells it, e.g. `/gpushare-test/a-1-0`.
    pub fn rel_path(&self) -> &str {
        &self.rel
    }

    /// The cgroup id (directory inode).
    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.dir).map(|m| m.ino()).unwrap_or(0)
    }

    /// The `cgroup.procs` file (write a pid, or `0` for the writer, to move it here).
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Pids in the group.
    pub fn pids(&self) -> Vec<u32> {
        fs::read_to_string(self.procs_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Whether the kernel reports the group frozen (`cgroup.events`: `frozen 1`). Panics when the
    /// file cannot be read (the group is gone, say): an unreadable state is not "thawed".
    pub fn is_frozen(&self) -> bool {
        self.try_is_frozen()
            .unwrap_or_else(|e| panic!("is the test group frozen? {e:#}"))
    }

    /// Whether the kernel reports the group frozen, or why `cgroup.events` could not be read.
    pub fn try_is_frozen(&self) -> Result<bool> {
        let path = self.dir.join("cgroup.events");
        let events =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(events.lines().any(|l| l.trim() == "frozen 1"))
    }
}

impl TestCgroup {
    /// Spawns `cmd` inside this group (moved in between fork and exec).
    pub fn spawn(&self, cmd: &mut std::process::Command) -> Result<std::process::Child> {
        use std::os::unix::process::CommandExt;
        let procs = std::ffi::CString::new(self.procs_file().as_os_str().as_encoded_bytes())?;
        // SAFETY: only async-signal-safe calls (open, write, close) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if n != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(cmd.spawn()?)
    }

    /// Waits up to 5 s for the kernel to report the group frozen (`true`) or thawed (`false`).
    /// Panics when the group's state cannot be read.
    pub fn wait_frozen(&self, frozen: bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.is_frozen() == frozen {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = fs::write(self.dir.join("cgroup.freeze"), "0");
        if fs::write(self.dir.join("cgroup.kill"), "1").is_err() {
            for pid in self.pids() {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.dir.exists() && fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group whose state cannot be read is not reported thawed.
    #[test]
    fn an_unreadable_group_state_is_an_error_not_thawed() {
        if !crate::require_root("an_unreadable_group_state_is_an_error") {
            return;
        }
        let cg = TestCgroup::create(&crate::unique("unreadable")).unwrap();
        assert!(!cg.is_frozen());
        fs::remove_dir(cg.dir()).unwrap();
        let err = cg
            .try_is_frozen()
            .expect_err("a removed group has no state");
        assert!(format!("{err:#}").contains("cgroup.events"), "{err:#}");
        let panicked = std::panic::catch_unwind(|| cg.is_frozen());
        assert!(panicked.is_err(), "is_frozen of a removed group answered");
    }
}
