//! Signals that cannot hit the wrong process: a pidfd is opened first (it pins the process), the
//! start time is checked through `/proc` after that, and the signal goes through the pidfd.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Result, bail};

use crate::attribution::{ProcessIdentity, procinfo};

/// Outcome of a signal attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignalOutcome {
    /// Delivered to the verified process.
    Sent,
    /// The process is gone: nothing to do.
    Gone,
    /// The pid now belongs to another process: not signalled.
    Reused,
}

/// Sends `signal` to the process `identity` names, only if it still is that process.
pub fn send_verified(identity: ProcessIdentity, signal: i32) -> Result<SignalOutcome> {
    // SAFETY: plain syscall; the result is a new fd or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, identity.pid as libc::pid_t, 0) };
    if raw < 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ESRCH) {
            return Ok(SignalOutcome::Gone);
        }
        bail!("pidfd_open({}): {err}", identity.pid);
    }
    // SAFETY: raw is a fresh pidfd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    // The pidfd pins whatever process had the pid when it was opened. If that process has the
    // expected start time now, the pidfd refers to it and to nothing else: no reuse can slip in
    // between this check and the signal.
    if !procinfo::is_same_process(identity) {
        return Ok(if procinfo::snapshot(identity.pid).is_ok() {
            SignalOutcome::Reused
        } else {
            SignalOutcome::Gone
        });
    }
    // SAFETY: fd is a pidfd; a null siginfo means "as if by kill(2)".
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ESRCH) {
            return Ok(SignalOutcome::Gone);
        }
        bail!("pidfd_send_signal({}, {signal}): {err}", identity.pid);
    }
    Ok(SignalOutcome::Sent)
}

/// Parses a signal name (`SIGUSR1`, `USR1`, `usr1`) or number.
pub fn parse_signal(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let up = s.trim().to_ascii_uppercase();
    let name = up.strip_prefix("SIG").unwrap_or(&up);
    Some(match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "STOP" => libc::SIGSTOP,
        "CONT" => libc::SIGCONT,
        _ => return None,
    })
}
