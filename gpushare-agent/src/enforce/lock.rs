//! One agent per state directory: an exclusive `flock(2)` on `<state dir>/agent.lock`, held for the
//! agent's life, with the holder's pid written inside for the error message. Two agents on one node
//! (a host unit and a DaemonSet pod sharing `/var/lib/gpushare`) would overwrite each other's ledger
//! and fight over the same groups; the second one refuses to start and names the first.
//!
//! The kernel drops the lock when its holder dies (SIGKILL included), so a stale lock file never
//! blocks a restart. `thaw --all` takes the same lock, so it cannot race a running agent.

use std::{
    fs::{File, OpenOptions},
    io::{Read, Seek, Write},
    path::{Path, PathBuf},
};

/// File name inside the state directory.
pub const LOCK_FILE: &str = "agent.lock";

/// The lock, held until dropped.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
    path: PathBuf,
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error(
        "another gpushare agent (pid {pid}) is running with the state directory {dir} (it holds \
         {lock}); stop it first (`systemctl stop gpushare-agent`, or remove the DaemonSet pod on \
         this node), or give this one another --state-dir"
    )]
    Held {
        /// The holder's pid as it wrote it (`?` when unreadable).
        pid: String,
        /// The state directory.
        dir: String,
        /// The lock file.
        lock: String,
    },
    /// The file could not be opened or locked.
    #[error("cannot lock {lock}: {source}")]
    Io {
        /// The lock file.
        lock: String,
        /// The error.
        source: std::io::Error,
    },
}

impl StateLock {
    /// Takes the lock of `state_dir` (created if missing) without waiting.
    pub fn acquire(state_dir: &Path) -> Result<Self, LockError> {
        let path = state_dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            lock: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // A holder that is going away (a process between fork and exec still shares the lock's
        // open file until its exec closes it) lets go within moments: try for half a second.
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
        let mut attempt = file.try_lock();
        while matches!(attempt, Err(std::fs::TryLockError::WouldBlock))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
            attempt = file.try_lock();
        }
        match attempt {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(LockError::Held {
                    pid: if pid.is_empty() { "?" } else { pid }.to_string(),
                    dir: state_dir.display().to_string(),
                    lock: path.display().to_string(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid_and_a_dead_holder_frees_it() {
        let dir = std::env::temp_dir().join(format!("gpushare-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = StateLock::acquire(&dir).unwrap();
        let err = StateLock::acquire(&dir).unwrap_err().to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())) && err.contains("agent.lock"),
            "{err}"
        );
        drop(first);
        let again = StateLock::acquire(&dir).unwrap();
        assert!(again.path().ends_with(LOCK_FILE));
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
