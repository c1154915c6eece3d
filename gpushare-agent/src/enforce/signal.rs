//! Signals that cannot hit the wrong process: a pidfd is opened first (it pins the process), the
//! start time is checked through `/proc` after that, and the signal goes through the pidfd.
//!
//! A ladder's `signal` step must never end a process: most signals (SIGUSR1 included) terminate a
//! process that has no handler for them. [`send_if_caught`] sends only to a process that catches
//! the signal (its bit in `SigCgt` of `/proc/<pid>/status`, read through the pinned pid); only a
//! `kill` step ([`send_verified`]) ends processes. A process whose pidfd the attribution holds
//! since it was verified is signalled through that pidfd ([`send_to`]).

use anyhow::{Result, bail};

use super::Target;
use crate::attribution::{Pidfd, ProcessIdentity, procinfo};

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

/// Sends `signal` to a target: through the pidfd held since its identity was verified, else as
/// [`send_verified`] does; with `only_if_caught`, only if it catches `signal`, as
/// [`send_if_caught`] does.
pub fn send_to(target: &Target, signal: i32, only_if_caught: bool) -> Result<SignalOutcome> {
    match &target.pidfd {
        Some(fd) => send_held(fd, target.identity.pid, signal, only_if_caught),
        None => send(target.identity, signal, only_if_caught),
    }
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
    // Bytes: the file's first line is the process's name, which need not be UTF-8.
    let mask = crate::sys::proc_status::of(pid)?
        .sig_cgt
        .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/status has no SigCgt"))?;
    caught_in_mask(mask, signal)
}

fn caught_in_mask(mask: u64, signal: i32) -> Result<bool> {
    if !(1..=64).contains(&signal) {
        bail!("no signal {signal}");
    }
    Ok(mask & (1u64 << (signal - 1)) != 0)
}

/// Sends through a pidfd held since the process was verified: it is that process while it has not
/// exited.
fn send_held(fd: &Pidfd, pid: u32, signal: i32, only_if_caught: bool) -> Result<SignalOutcome> {
    // /proc/<pid> read before the pidfd is found alive is about its process.
    let caught = if only_if_caught {
        catches(pid, signal)
    } else {
        Ok(true)
    };
    match (fd.has_exited(), caught) {
        (true, _) => Ok(SignalOutcome::Gone),
        (false, Ok(false)) => Ok(SignalOutcome::NotCaught),
        (false, Err(e)) => Err(e),
        (false, Ok(true)) => match fd.send_signal(signal) {
            Ok(()) => Ok(SignalOutcome::Sent),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(SignalOutcome::Gone),
            Err(e) => Err(anyhow::anyhow!("pidfd_send_signal({pid}): {e}")),
        },
    }
}

fn send(identity: ProcessIdentity, signal: i32, only_if_caught: bool) -> Result<SignalOutcome> {
    let fd = match Pidfd::open(identity.pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(SignalOutcome::Gone),
        Err(e) => bail!("pidfd_open({}): {e}", identity.pid),
    };
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
    match fd.send_signal(signal) {
        Ok(()) => Ok(SignalOutcome::Sent),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(SignalOutcome::Gone),
        Err(e) => bail!("pidfd_send_signal({}, {signal}): {e}", identity.pid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caught_mask_is_read_bit_by_signal() {
        // SIGUSR1 (10) is bit 9; SIGTERM (15) bit 14.
        assert!(caught_in_mask(0x200, libc::SIGUSR1).unwrap());
        assert!(!caught_in_mask(0x200, libc::SIGTERM).unwrap());
        assert!(caught_in_mask(0x4000, libc::SIGTERM).unwrap());
        assert!(!caught_in_mask(0, libc::SIGUSR1).unwrap());
        assert!(caught_in_mask(1 << 63, 64).unwrap());
        assert!(caught_in_mask(0, 0).is_err());
        assert!(caught_in_mask(0, 65).is_err());
        // This test process: whatever it catches, the answer comes without error.
        assert!(catches(std::process::id(), libc::SIGUSR1).is_ok());
    }
}
