//! The driver's reports of a faulted GPU context, read from the kernel log (issue 41).
//!
//! cuda-checkpoint #53 (driver 595.71.05): a process restored from a checkpoint hard-hangs the
//! host about 35 s after it is killed while its context is live, and the same happens when a
//! restored context faults by itself. The driver reports a context fault as an Xid in the kernel
//! log, naming the process: `NVRM: Xid (PCI:0000:3b:00): 31, pid=4711, name=python3, Ch 00000008,
//! ...` (NVML's Xid events name the GPU only, not the process). This reads those reports as they
//! come, so the step can treat a faulted restored process as the kill rung treats one: checkpoint
//! it again, see its device memory gone, then end it (see [`crate::enforce::restored`]).
//!
//! Trust: only the kernel's own records count. A record that user space writes to `/dev/kmsg` is
//! given a facility of its own (the kernel enforces `LOG_USER` or the one asked for, never 0), so
//! a process cannot forge a driver report to have a neighbour checkpointed. A tenant's process
//! named `NVRM: Xid ...` does not help either: the driver writes the process name after the pid.
//!
//! Design note: one thread blocks on the log (`/dev/kmsg` answers one record a read, from the end:
//! history is not replayed); the step takes what it queued, at most [`PENDING_MAX`] (the oldest
//! beyond it dropped, counted). Where the log cannot be read the agent says so once and goes on:
//! faults are then not seen (fail open), as on a host without the driver's Xid reports.

use std::{
    collections::VecDeque,
    fs::File,
    io::{ErrorKind, Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use log::warn;

/// The kernel log the driver writes its Xid reports to.
pub const DEFAULT_KERNEL_LOG: &str = "/dev/kmsg";

/// The Xids that end a process's context, from NVIDIA's Xid catalog (the errors it lists as the
/// application's, after which the context cannot go on): 13 graphics engine exception, 31 GPU
/// memory page fault, 43 GPU stopped processing (channel reset), 45 preemptive cleanup after an
/// earlier error, 68 video decoder exception, 69 graphics engine class error, 109 context switch
/// timeout.
pub const CONTEXT_FAULTS: &[u32] = &[13, 31, 43, 45, 68, 69, 109];

/// Faults queued for the step at most; beyond it the oldest is dropped (counted).
pub const PENDING_MAX: usize = 1024;

/// A line is kept to its first this many bytes (a report names its process in its first hundred):
/// `/dev/kmsg` records are at most 8 KiB, a file given instead may hold anything.
const LINE_MAX: usize = 64 * 1024;

/// How long the reader waits at the end of a log that does not block (a regular file).
const AT_END: Duration = Duration::from_millis(100);

/// The driver's report that a process's context faulted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The Xid (one of [`CONTEXT_FAULTS`]).
    pub xid: u32,
    /// The process the driver names.
    pub pid: u32,
    /// The GPU's PCI address as the driver writes it (`0000:3b:00`).
    pub pci: String,
}

/// One kernel-log record as `/dev/kmsg` gives it (`<prio>,<seq>,<usec>,<flags>[,..];<text>`),
/// when it is the kernel's own (facility 0) report of a context fault that names its process.
/// `None` for anything else: another message, another Xid, a fault naming no process
/// (`pid='<unknown>'`), a record user space wrote, a continuation line.
pub fn parse(record: &[u8]) -> Option<Fault> {
    let semi = record.iter().position(|&b| b == b';')?;
    let prio = record[..semi].split(|&b| b == b',').next()?;
    let prio: u32 = std::str::from_utf8(prio).ok()?.parse().ok()?;
    if prio >> 3 != 0 {
        return None; // not the kernel's
    }
    let text = record[semi + 1..].split(|&b| b == b'\n').next()?;
    let rest = after(text, b"NVRM: Xid (")?;
    let close = rest.iter().position(|&b| b == b')')?;
    let pci = std::str::from_utf8(&rest[..close]).ok()?;
    let pci = pci.strip_prefix("PCI:").unwrap_or(pci).to_string();
    let rest = rest[close + 1..].strip_prefix(b": ")?;
    let (xid, rest) = number(rest)?;
    if !CONTEXT_FAULTS.contains(&xid) {
        return None;
    }
    let rest = rest.strip_prefix(b", pid=")?;
    let (pid, rest) = number(rest)?;
    (rest.first() == Some(&b',') && pid > 0).then_some(Fault { xid, pid, pci })
}

/// `text` after the first `pat`.
fn after<'a>(text: &'a [u8], pat: &[u8]) -> Option<&'a [u8]> {
    let i = text.windows(pat.len()).position(|w| w == pat)?;
    Some(&text[i + pat.len()..])
}

/// The decimal number `text` starts with, and what follows it.
fn number(text: &[u8]) -> Option<(u32, &[u8])> {
    let digits = text.iter().take_while(|b| b.is_ascii_digit()).count();
    let n = std::str::from_utf8(&text[..digits]).ok()?.parse().ok()?;
    Some((n, &text[digits..]))
}

#[derive(Debug, Default)]
struct Pending {
    faults: VecDeque<Fault>,
    dropped: u64,
}

/// The faults the reader thread queued, for the step to take.
#[derive(Debug)]
pub struct KernelLog {
    pending: Arc<Mutex<Pending>>,
    path: PathBuf,
}

impl KernelLog {
    /// Opens `path` at its end and starts the reader thread. `Err`: the log cannot be read
    /// (the caller says so once and goes on without it).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let mut file = File::open(path)?;
        // From now on: a fault before the agent started is not replayed. A log that cannot seek
        // (a pipe) starts where it is.
        let _ = file.seek(SeekFrom::End(0));
        let pending = Arc::new(Mutex::new(Pending::default()));
        let weak = Arc::downgrade(&pending);
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("gpushare-kmsg".into())
            .spawn(move || read_log(file, &weak, &shown))?;
        Ok(Self {
            pending,
            path: path.to_path_buf(),
        })
    }

    /// The faults reported since the last call, oldest first.
    pub fn take(&self) -> Vec<Fault> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.faults.drain(..).collect()
    }

    /// Faults dropped because the step did not take them in time.
    pub fn dropped(&self) -> u64 {
        self.pending.lock().map_or(0, |p| p.dropped)
    }

    /// The log read.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The reader thread: records to faults until the [`KernelLog`] is dropped.
fn read_log(mut file: File, pending: &Weak<Mutex<Pending>>, shown: &str) {
    let mut buf = vec![0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    let mut failed = false;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => {
                if pending.strong_count() == 0 {
                    return;
                }
                std::thread::sleep(AT_END);
                continue;
            }
            Ok(n) => n,
            // Records overwritten before they were read (`/dev/kmsg`): go on from the next.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                if !failed {
                    warn!("reading the kernel log {shown}: {e}; context faults are not seen");
                    failed = true;
                }
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        for &b in &buf[..n] {
            if b != b'\n' {
                if line.len() < LINE_MAX {
                    line.push(b);
                }
                continue;
            }
            if let Some(f) = parse(&line) {
                let Some(p) = pending.upgrade() else {
                    return;
                };
                let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
                if p.faults.len() >= PENDING_MAX {
                    p.faults.pop_front();
                    p.dropped += 1;
                }
                p.faults.push_back(f);
            }
            line.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    const XID_31: &[u8] = b"3,1204,987654321,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=4711, \
        name=python3, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS";

    #[test]
    fn the_drivers_report_of_a_context_fault_names_its_process() {
        assert_eq!(
            parse(XID_31),
            Some(Fault {
                xid: 31,
                pid: 4711,
                pci: "0000:3b:00".into()
            })
        );
        let ctx_switch = b"4,2,3,-;NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, \
            name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005";
        assert_eq!(
            parse(ctx_switch).map(|f| (f.xid, f.pid)),
            Some((109, 1797828))
        );
        // Wherever the report starts in the text.
        let prefixed = b"3,7,8,-;nvidia 0000:3b:00.0: NVRM: Xid (PCI:0000:3b:00): 43, pid=12, \
            name=x, Ch 1";
        assert_eq!(parse(prefixed).map(|f| (f.xid, f.pid)), Some((43, 12)));
    }

    #[test]
    fn a_record_user_space_wrote_is_not_the_drivers() {
        // Written to /dev/kmsg from user space: facility LOG_USER (1) or another, never 0.
        for prio in ["11", "14", "8", "191"] {
            let forged = [prio.as_bytes(), &XID_31[1..]].concat();
            assert_eq!(parse(&forged), None, "{prio}");
        }
        assert_eq!(
            parse(b"x,1,2,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=1, n"),
            None
        );
    }

    #[test]
    fn other_xids_reports_without_a_process_and_other_lines_are_not_faults() {
        let other = b"3,1,2,-;NVRM: Xid (PCI:0000:3b:00): 63, pid=4711, name=x, Row remap";
        let unknown = b"3,1,2,-;NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, \
            Graphics SM Warp Exception";
        let zero = b"3,1,2,-;NVRM: Xid (PCI:0000:cb:00): 13, pid=0, name=x, y";
        let cut = b"3,1,2,-;NVRM: Xid (PCI:0000:cb:00): 13, pid=4711";
        for r in [
            &other[..],
            unknown,
            zero,
            cut,
            b" SUBSYSTEM=pci",
            b"6,5,6,-;usb 1-1: new device",
            b"",
        ] {
            assert_eq!(parse(r), None, "{}", String::from_utf8_lossy(r));
        }
        // A process named like a report gains nothing: its name comes after its pid.
        let named = b"3,1,2,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=99, name=NVRM: Xid (PCI:0): \
            31, pid=1, Ch 0";
        assert_eq!(parse(named).map(|f| f.pid), Some(99));
    }

    #[test]
    fn the_reader_queues_new_faults_only_and_bounds_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg");
        let mut f = File::create(&path).unwrap();
        // Before the agent started: not replayed.
        f.write_all(&[XID_31, b"\n"].concat()).unwrap();
        let log = KernelLog::open(&path).unwrap();
        let line =
            |pid: u32| format!("3,9,9,-;NVRM: Xid (PCI:0000:3b:00): 43, pid={pid}, name=x, Ch 1\n");
        // One record in two writes, a continuation line and another message between.
        let first = line(7);
        f.write_all(&first.as_bytes()[..20]).unwrap();
        f.flush().unwrap();
        std::thread::sleep(AT_END * 2);
        f.write_all(&first.as_bytes()[20..]).unwrap();
        f.write_all(b" SUBSYSTEM=pci\n6,1,1,-;eth0: link up\n")
            .unwrap();
        let mut all = String::new();
        for pid in 0..(PENDING_MAX as u32 + 5) {
            all += &line(1000 + pid);
        }
        f.write_all(all.as_bytes()).unwrap();
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while log.dropped() < 6 && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let got = log.take();
        assert_eq!(got.len(), PENDING_MAX);
        assert_eq!(log.dropped(), 6, "pid 7 and the first five of the flood");
        assert_eq!(got[0].pid, 1005);
        assert_eq!(
            got.last().map(|f| f.pid),
            Some(1000 + PENDING_MAX as u32 + 4)
        );
        assert!(log.take().is_empty(), "taken once");
        assert_eq!(log.path(), path);
    }
}
