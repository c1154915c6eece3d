//! What `/proc` says about one process: its identity (pid + start time) and its comm, through the
//! procfs crate.

use anyhow::{Context, Result, bail};

/// A process identity that survives PID reuse: the pid and its start time.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ProcessIdentity {
    /// The pid (thread-group id).
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_ticks: u64,
}

/// What `/proc/<pid>` says now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcSnapshot {
    /// pid and start time.
    pub identity: ProcessIdentity,
    /// Start time as CLOCK_BOOTTIME ns (tick precision).
    pub start_boot_ns: u64,
    /// comm.
    pub comm: String,
}

/// Reads `/proc/<pid>/stat`. Fails when the process is gone, or when `pid` is a thread of
/// another process rather than a process.
pub fn snapshot(pid: u32) -> Result<ProcSnapshot> {
    let proc = procfs::process::Process::new(pid as i32)
        .with_context(|| format!("process {pid} is gone"))?;
    let stat = proc
        .stat()
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    if stat.pid as u32 != pid {
        bail!("/proc/{pid}/stat names pid {}", stat.pid);
    }
    let status = proc
        .status()
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    if status.tgid as u32 != pid {
        bail!("{pid} is a thread of process {}", status.tgid);
    }
    Ok(ProcSnapshot {
        identity: ProcessIdentity {
            pid,
            start_ticks: stat.starttime,
        },
        start_boot_ns: ticks_to_ns(stat.starttime),
        comm: stat.comm,
    })
}

/// Clock ticks to ns.
pub fn ticks_to_ns(ticks: u64) -> u64 {
    let tps = procfs::ticks_per_second().max(1);
    ticks.saturating_mul(1_000_000_000 / tps)
}

/// One tick in ns.
pub fn tick_ns() -> u64 {
    1_000_000_000 / procfs::ticks_per_second().max(1)
}

/// A pidfd for `pid` and what `/proc/<pid>` says, proven to be about the same process: the pidfd is
/// opened first (it pins whichever process holds the pid), `/proc` is read next, and the pidfd is
/// checked to be still alive after that read, so the process `/proc` described is the one the
/// pidfd holds. Without a pidfd (old kernel, fd limit) the snapshot alone is returned.
pub fn open_verified(pid: u32) -> Result<(ProcSnapshot, Option<super::pidfd::Pidfd>)> {
    let pidfd = match super::pidfd::Pidfd::open(pid) {
        Ok(fd) => Some(fd),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => bail!("process {pid} is gone"),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            bail!("{pid} is not a process (a thread?)")
        }
        Err(e) => {
            log::debug!("no pidfd for {pid} ({e}); falling back to start-time checks");
            None
        }
    };
    let snap = snapshot(pid)?;
    if pidfd.as_ref().is_some_and(|fd| fd.has_exited()) {
        bail!("process {pid} exited while it was being identified");
    }
    Ok((snap, pidfd))
}

/// Whether `/proc/<pid>` still is the process `identity` names.
pub fn is_same_process(identity: ProcessIdentity) -> bool {
    procfs::process::Process::new(identity.pid as i32)
        .and_then(|p| p.stat())
        .is_ok_and(|s| s.starttime == identity.start_ticks)
}

/// Every pid in `/proc`.
pub fn all_pids() -> Vec<u32> {
    let Ok(iter) = procfs::process::all_processes() else {
        return Vec::new();
    };
    iter.filter_map(|p| p.ok()).map(|p| p.pid as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_a_stable_identity() {
        let me = std::process::id();
        let a = snapshot(me).unwrap();
        assert_eq!(a.identity.pid, me);
        assert!(is_same_process(a.identity));
        let other = ProcessIdentity {
            pid: me,
            start_ticks: a.identity.start_ticks + 1,
        };
        assert!(
            !is_same_process(other),
            "a different start time is a different process"
        );
    }

    #[test]
    fn threads_and_missing_pids_are_rejected() {
        let tid = std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            s.spawn(move || {
                tx.send(unsafe { libc::gettid() } as u32).unwrap();
                let _ = done_rx.recv();
            });
            let tid = rx.recv().unwrap();
            let err = snapshot(tid).unwrap_err().to_string();
            done_tx.send(()).unwrap();
            err
        });
        assert!(tid.contains("thread of process"), "{tid}");
        assert!(snapshot(u32::MAX - 1).is_err());
    }
}
