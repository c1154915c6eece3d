//! Signals that cannot hit the wrong process: a pidfd is opened first (it pins the process), the
//! start time is checked through `/proc` after that, and the signal goes through the pidfd.
//!
//! A ladder's `signal` step must never end a process: most signals (SIGUSR1 included) terminate a
//! process that has no handler for them. [`send_if_caught`] sends only to a process that catches
//! the signal (its bit in `SigCgt` of `/proc/<pid>/status`, read through the pinned pid); only a
//! `kill` step ([`send_verified`]) ends processes.

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
    /// The process does not catch the signal (no handler), which would end it: not signalled.
    NotCaught,
}

/// Sends `signal` to the process `identity` names, only if it still is that process.
pub fn send_verified(identity: ProcessIdentity, signal: i32) -> Result<SignalOutcome> {
    send(identity, signal, false)
}

/// Like [`send_verified`], and only if the process catches `signal` (has a handler installed);
/// else [`SignalOutcome::NotCaught`] and nothing is sent. For `signal` steps.
pub fn send_if_caught(identity: ProcessIdentity, signal: i32) -> Result<SignalOutcome> {
    send(identity, signal, true)
}

/// Whether process `pid` catches `signal`: its bit in `SigCgt` (hex mask, bit n-1 for signal n)
/// of `/proc/<pid>/status`.
pub fn catches(pid: u32, signal: i32) -> Result<bool> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .map(str::trim)
        .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/status has no SigCgt"))?;
    caught_in_mask(mask, signal)
}

fn caught_in_mask(mask: &str, signal: i32) -> Result<bool> {
    if !(1..=64).contains(&signal) {
        bail!("no signal {signal}");
    }
    let mask = u64::from_str_radix(mask, 16)
        .map_err(|e| anyhow::anyhow!("SigCgt {mask:?} is not a hex mask: {e}"))?;
    Ok(mask & (1u64 << (signal - 1)) != 0)
}

fn send(identity: ProcessIdentity, signal: i32, only_if_caught: bool) -> Result<SignalOutcome> {
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
    // Read after the start time was checked: if the process exited in between, /proc/<pid> may
    // describe another one, but the signal goes through the pidfd, which then fails with ESRCH.
    if only_if_caught {
        match catches(identity.pid, signal) {
            Ok(true) => {}
            Ok(false) => return Ok(SignalOutcome::NotCaught),
            Err(_) if !procinfo::is_same_process(identity) => return Ok(SignalOutcome::Gone),
            Err(e) => return Err(e),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caught_mask_is_read_bit_by_signal() {
        // SIGUSR1 (10) is bit 9; SIGTERM (15) bit 14.
        assert!(caught_in_mask("0000000000000200", libc::SIGUSR1).unwrap());
        assert!(!caught_in_mask("0000000000000200", libc::SIGTERM).unwrap());
        assert!(caught_in_mask("0000000000004000", libc::SIGTERM).unwrap());
        assert!(!caught_in_mask("0000000000000000", libc::SIGUSR1).unwrap());
        assert!(caught_in_mask("zz", libc::SIGUSR1).is_err());
        assert!(caught_in_mask("0", 0).is_err());
        // This test process: whatever it catches, the answer comes without error.
        assert!(catches(std::process::id(), libc::SIGUSR1).is_ok());
    }
}
