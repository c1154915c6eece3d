//! Process handles that a reused pid cannot fool: Linux pidfds (5.3+).
//!
//! Design note: every GPU task the agent tracks holds a pidfd opened when the task was discovered
//! and verified against `/proc` right after (see [`super::procinfo::open_verified`]). From then on
//! the pidfd *is* the task: it becomes readable when the process exits, so an exit can never be
//! missed (one `epoll_wait(2)` over all of them per step, [`ExitWatch`], confirmed by [`exited`]),
//! and a signal sent through it can
//! only reach that process, never a newcomer with the same pid. The alternative, re-reading
//! `/proc/<pid>/stat` and comparing start times, has clock-tick resolution (10 ms) and costs an
//! open, a read and a parse per process per step; a held pidfd costs one fd.
//!
//! A pidfd that cannot be opened (an old kernel, the fd limit) is not fatal: the entry keeps no
//! handle and callers fall back to the start-time check.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    sync::Arc,
};

/// A pidfd, shared by the clones of the table entry that holds it.
#[derive(Clone, Debug)]
pub struct Pidfd(Arc<OwnedFd>);

impl Pidfd {
    /// `pidfd_open(pid, 0)`.
    pub fn open(pid: u32) -> io::Result<Self> {
        // SAFETY: plain syscall; the result is a new fd or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh fd nobody else owns.
        Ok(Self(Arc::new(unsafe {
            OwnedFd::from_raw_fd(raw as RawFd)
        })))
    }

    /// Whether the process has exited (the pidfd is readable). A zombie has exited.
    pub fn has_exited(&self) -> bool {
        exited(&[self]).first().copied().unwrap_or(true)
    }

    /// Sends `signal` to the process through the pidfd. `ESRCH`: it has exited.
    pub fn send_signal(&self, signal: i32) -> io::Result<()> {
        // SAFETY: a pidfd; a null siginfo means "as if by kill(2)".
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsRawFd for Pidfd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Which of `fds` have exited, in one `poll(2)` that does not wait. On a poll error every process
/// counts as alive (the caller's other checks still run).
pub fn exited(fds: &[&Pidfd]) -> Vec<bool> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    if polls.is_empty() {
        return Vec::new();
    }
    // SAFETY: a valid array of pollfd of the given length; timeout 0 never blocks.
    let rc = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 0) };
    if rc < 0 {
        return vec![false; fds.len()];
    }
    polls
        .iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        .collect()
}

/// An epoll set of pidfds: which processes exited since they were added, in one `epoll_wait(2)`
/// whose cost grows with the exits, not with the pidfds held (a `poll(2)` over all of them costs
/// each one every step). A pidfd leaves the set when its last copy is closed.
pub struct ExitWatch {
    epoll: Option<OwnedFd>,
    events: Vec<libc::epoll_event>,
    watched: usize,
}

impl Default for ExitWatch {
    fn default() -> Self {
        // SAFETY: plain syscall; the result is a new fd or -1.
        let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        Self {
            // SAFETY: raw is a fresh fd nobody else owns.
            epoll: (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) }),
            events: Vec::new(),
            watched: 0,
        }
    }
}

impl ExitWatch {
    /// Adds `fd` to the set; false when it could not be (the caller polls it instead).
    pub fn watch(&mut self, fd: &Pidfd) -> bool {
        let Some(ep) = &self.epoll else {
            return false;
        };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd.as_raw_fd() as u64,
        };
        // SAFETY: a valid epoll fd, a valid fd, a valid event.
        let rc = unsafe {
            libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev)
        };
        if rc == 0 {
            self.watched += 1;
        }
        rc == 0
    }

    /// The raw fds of the watched pidfds that are readable now (level-triggered: an exited one
    /// is reported until it is closed), at most `room` of them; `None` when the set cannot be
    /// read or more than `room` are ready (the caller then polls every pidfd).
    pub fn ready(&mut self, room: usize) -> Option<Vec<RawFd>> {
        let ep = self.epoll.as_ref()?;
        let room = room.clamp(1, i32::MAX as usize);
        if self.events.len() < room {
            self.events
                .resize(room, libc::epoll_event { events: 0, u64: 0 });
        }
        // SAFETY: a valid epoll fd and a buffer of `room` events; timeout 0 never blocks.
        let n =
            unsafe { libc::epoll_wait(ep.as_raw_fd(), self.events.as_mut_ptr(), room as i32, 0) };
        if n < 0 || n as usize >= room {
            return None;
        }
        Some(
            self.events[..n as usize]
                .iter()
                .map(|e| e.u64 as RawFd)
                .collect(),
        )
    }
}

/// Raises the soft limit of open files to the hard limit: the agent holds one pidfd per GPU task.
/// Returns the new soft limit.
pub fn raise_fd_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: a valid rlimit; raising the soft limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pidfd_tells_exit_and_signals_only_its_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let fd = Pidfd::open(child.id()).unwrap();
        assert!(!fd.has_exited());
        fd.send_signal(0).unwrap();
        fd.send_signal(libc::SIGKILL).unwrap();
        let _ = child.wait();
        assert!(fd.has_exited(), "reaped: exited");
        let err = fd.send_signal(0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH));
        let me = Pidfd::open(std::process::id()).unwrap();
        assert_eq!(exited(&[&me, &fd]), vec![false, true]);
    }
}
