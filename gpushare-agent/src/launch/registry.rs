//! The runtime drop-in directory as launches share it: an exclusive lock that serializes
//! "read reservations, choose, register", atomic writes, and removal of drop-ins whose launcher
//! died without cleaning up.

use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result};

use super::{
    scope,
    spec::{FILE_PREFIX, Owner},
};
use crate::attribution::{ProcessIdentity, procinfo};

/// Name of the lock file inside the runtime directory (not `*.toml`: the agent ignores it).
pub const LOCK_FILE: &str = ".launch.lock";

/// The runtime drop-in directory.
pub struct Registry {
    dir: PathBuf,
}

/// Held while a launch reads reservations and registers its own; released on drop.
pub struct RegistryLock {
    _file: File,
}

impl Registry {
    /// The directory, created (mode 0755) when missing.
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| {
            format!(
                "creating the runtime quota directory {} (--runtime-quotas; launch needs root)",
                dir.display()
            )
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the exclusive lock (blocking). Every launch that uses this directory takes it before
    /// reading the reservations and keeps it until its own drop-in is in place, so two launches
    /// can never both count the same free memory.
    pub fn lock(&self) -> Result<RegistryLock> {
        let path = self.dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        loop {
            // SAFETY: flock(2) on an fd we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(RegistryLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
        }
    }

    /// Writes `text` as `file_name` atomically (temporary name, fsync, rename), so the agent never
    /// reads half a file.
    pub fn write(&self, _lock: &RegistryLock, file_name: &str, text: &str) -> Result<PathBuf> {
        let path = self.dir.join(file_name);
        let tmp = self.dir.join(format!(".{file_name}.tmp"));
        let result = (|| -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("writing {}", path.display()));
        }
        Ok(path)
    }

    /// Removes the drop-ins (and empty groups) of launchers that are gone: a drop-in is stale
    /// when the process it names (pid and start time) no longer exists and its cgroup holds no
    /// process. A service still running after its launcher was killed keeps its reservation.
    /// Returns the files removed.
    pub fn collect_stale(&self, _lock: &RegistryLock, cgroup_root: &Path) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return removed;
        };
        for entry in rd.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !(name.starts_with(FILE_PREFIX) && name.ends_with(".toml")) {
                continue;
            }
            let Some(owner) = fs::read_to_string(&path)
                .ok()
                .and_then(|t| Owner::from_text(&t))
            else {
                continue;
            };
            let alive = procinfo::is_same_process(ProcessIdentity {
                pid: owner.pid,
                start_ticks: owner.start_ticks,
            });
            let dir = crate::sys::kernel_text::under(cgroup_root, &owner.cgroup);
            if alive || (dir.exists() && scope::populated(&dir)) {
                continue;
            }
            if scope::remove_group(&dir, Duration::from_secs(1)).is_ok()
                && fs::remove_file(&path).is_ok()
            {
                log::info!(
                    "removed the stale launch registration {} (launcher {} is gone)",
                    path.display(),
                    owner.pid
                );
                removed.push(path);
            }
        }
        removed
    }
}

/// This process's identity (pid and start time), for the ownership line.
pub fn own_identity() -> Result<ProcessIdentity> {
    Ok(procinfo::snapshot(std::process::id())?.identity)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::launch::spec::{Owner, Registration};

    struct Temp(PathBuf);

    impl Temp {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!(
                "gpushare-registry-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&p);
            Self(p)
        }
    }

    impl Drop for Temp {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn registration(name: &str, owner: ProcessIdentity) -> String {
        Registration {
            name: name.into(),
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            bytes: 1 << 30,
            ladder: None,
            grace: None,
            owner: Owner {
                pid: owner.pid,
                start_ticks: owner.start_ticks,
                cgroup: format!("/gpushare.slice/{name}.scope"),
            },
        }
        .render()
    }

    #[test]
    fn the_lock_is_exclusive_between_open_files() {
        let t = Temp::new("lock");
        let reg = Registry::open(&t.0.join("rt")).unwrap();
        let held = reg.lock().unwrap();
        let dir = reg.dir().to_path_buf();
        let start = Instant::now();
        let waiter = std::thread::spawn(move || {
            let other = Registry::open(&dir).unwrap();
            let _l = other.lock().unwrap();
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(300));
        drop(held);
        assert!(waiter.join().unwrap() >= Duration::from_millis(300));
        assert!(reg.dir().join(LOCK_FILE).exists());
    }

    #[test]
    fn registrations_of_dead_launchers_are_collected_and_live_ones_kept() {
        let t = Temp::new("stale");
        let reg = Registry::open(&t.0.join("rt")).unwrap();
        let cgroups = t.0.join("cgroup");
        let lock = reg.lock().unwrap();
        let me = own_identity().unwrap();
        let dead = ProcessIdentity {
            pid: me.pid,
            start_ticks: me.start_ticks + 1,
        };
        let live = reg
            .write(&lock, "launch-live.toml", &registration("live", me))
            .unwrap();
        let stale = reg
            .write(&lock, "launch-stale.toml", &registration("stale", dead))
            .unwrap();
        // Not ours to judge: no ownership line, or not a launch file.
        let foreign = reg.write(&lock, "launch-x.toml", "[[quota]]\n").unwrap();
        let other = reg
            .write(&lock, "operator.toml", &registration("op", dead))
            .unwrap();
        assert_eq!(reg.collect_stale(&lock, &cgroups), vec![stale.clone()]);
        assert!(live.exists() && foreign.exists() && other.exists() && !stale.exists());
        assert!(
            !fs::read_dir(reg.dir())
                .unwrap()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".tmp")),
            "no temporary file left"
        );
    }
}
