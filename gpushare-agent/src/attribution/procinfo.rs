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
    /// comm, for display only: a byte that is not UTF-8 is shown as U+FFFD (the procfs crate
    /// reads `stat` lossily); nothing is decided by a name.
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
    // Read as bytes: the procfs crate's `status()` rejects the whole file when the process's name
    // is not UTF-8, and a process chooses its name (see `sys::proc_status`).
    let status =
        crate::sys::proc_status::of(pid).with_context(|| format!("reading /proc/{pid}/status"))?;
    match status.tgid {
        Some(tgid) if tgid == pid => {}
        Some(tgid) => bail!("{pid} is a thread of process {tgid}"),
        None => bail!("/proc/{pid}/status has no Tgid"),
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
    start_ticks(identity.pid) == Some(identity.start_ticks)
}

/// The start time (`/proc/<pid>/stat` field 22, clock ticks since boot) of `pid`, or `None` when
/// it is gone. Asked for every known task on each reconcile and before every signal, so it is
/// three syscalls on a stack buffer (open, read, close) and no allocation, where the procfs crate
/// opens the `/proc/<pid>` directory, stats both, and parses every field into owned values.
pub fn start_ticks(pid: u32) -> Option<u64> {
    use std::io::Write;
    let mut path = [0u8; 32];
    let mut cursor = std::io::Cursor::new(&mut path[..]);
    write!(cursor, "/proc/{pid}/stat\0").ok()?;
    // SAFETY: a NUL-terminated path in a stack buffer; the fd is closed below.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if fd < 0 {
        return None;
    }
    // Field 22 comes after pid, a comm of at most 64 bytes (kernel threads' names) and 19 numbers.
    let mut buf = [0u8; 1024];
    // SAFETY: reading into a stack buffer of the given length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: the fd opened above.
    unsafe { libc::close(fd) };
    if n <= 0 {
        return None;
    }
    parse_start_ticks(&buf[..n as usize])
}

/// Field 22 of a `/proc/<pid>/stat` line. The comm (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so fields are counted from the last `)`.
fn parse_start_ticks(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    // After ") ": field 3 (state) is the first; field 22 is the 20th.
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    rest.split(' ').nth(19)?.parse().ok()
}

/// Where an open of an nvidia node, seen on its entry, stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenState {
    /// The process holds an nvidia fd: the open succeeded.
    Opened,
    /// The opening thread is still in an open-family syscall (or running, so it cannot be told).
    InProgress,
    /// The thread has left the open (or is gone) and no nvidia fd is held: it failed.
    Failed,
}

/// Open-family syscall numbers of this architecture.
#[cfg(target_arch = "x86_64")]
const OPEN_SYSCALLS: [libc::c_long; 3] = [libc::SYS_open, libc::SYS_openat, libc::SYS_openat2];
#[cfg(not(target_arch = "x86_64"))]
const OPEN_SYSCALLS: [libc::c_long; 2] = [libc::SYS_openat, libc::SYS_openat2];

/// Where thread `tid`'s open of an nvidia node in process `tgid` stands. The thread's syscall is
/// read first (`/proc/<tgid>/task/<tid>/syscall`): once it has left the open, an fd it opened is
/// already in its table. A thread that is running cannot be told apart: `running_is_done` says
/// whether to judge it by its fds anyway (the caller gives up waiting). `fd_entries` counts the fd
/// entries read: a tenant chooses how many fds it holds, so this is the cost it controls.
pub fn open_state(tgid: u32, tid: u32, running_is_done: bool, fd_entries: &mut u64) -> OpenState {
    let syscall = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/syscall"));
    let first = syscall
        .as_deref()
        .ok()
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or("");
    if first
        .parse::<libc::c_long>()
        .is_ok_and(|nr| OPEN_SYSCALLS.contains(&nr))
        || (first == "running" && !running_is_done)
    {
        return OpenState::InProgress;
    }
    // The thread's own table first (it may have unshared it), then the process's.
    if holds_nvidia_fd_in(&format!("/proc/{tgid}/task/{tid}/fd"), fd_entries)
        || holds_nvidia_fd_in(&format!("/proc/{tgid}/fd"), fd_entries)
    {
        OpenState::Opened
    } else {
        OpenState::Failed
    }
}

/// Whether the fd directory `dir` (`/proc/<pid>/fd`) holds a link to `/dev/nvidia*`; adds the
/// entries read to `fd_entries`.
pub fn holds_nvidia_fd_in(dir: &str, fd_entries: &mut u64) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        *fd_entries += 1;
        std::fs::read_link(e.path())
            .is_ok_and(|t| t.as_os_str().as_encoded_bytes().starts_with(b"/dev/nvidia"))
    })
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
    fn start_time_is_field_22_even_when_the_comm_holds_spaces_and_parentheses() {
        let line = b"4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        assert_eq!(parse_start_ticks(line), Some(987_654));
        assert_eq!(parse_start_ticks(b"1 (init) S 1"), None, "too short");
        assert_eq!(parse_start_ticks(b"garbage"), None);
        // A real process whose comm has both: the fast reader agrees with the procfs crate.
        let dir = std::env::temp_dir().join(format!("gpushare-comm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let odd = dir.join("x) y (z");
        std::fs::copy("/bin/sleep", &odd).unwrap();
        let mut child = std::process::Command::new(&odd).arg("5").spawn().unwrap();
        let pid = child.id();
        let want = procfs::process::Process::new(pid as i32)
            .unwrap()
            .stat()
            .unwrap();
        assert_eq!(want.comm, "x) y (z", "the comm really holds them");
        assert_eq!(start_ticks(pid), Some(want.starttime));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(start_ticks(pid), None, "a reaped process has no start time");
        std::fs::remove_dir_all(&dir).unwrap();
        // Every process on the machine: the same answer as the procfs crate.
        for p in procfs::process::all_processes().unwrap().flatten() {
            if let Ok(st) = p.stat() {
                let fast = start_ticks(p.pid as u32);
                assert!(
                    fast == Some(st.starttime) || fast.is_none(),
                    "pid {}: {fast:?} vs {}",
                    p.pid,
                    st.starttime
                );
            }
        }
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
