//! `/proc/<pid>/status`, read as bytes: the few fields the agent needs (`Tgid`, `PPid`, `NSpid`,
//! `SigCgt`).
//!
//! The file's first line is `Name:` with the process's comm, which the process chooses and which
//! need not be UTF-8 (`prctl(PR_SET_NAME, "\xff")`). The procfs crate reads the file as UTF-8
//! lines and rejects all of it on such a name, so a process could hide its identity, and with it
//! its GPU memory, by renaming itself. Only the lines named here are read, as ASCII; the name is
//! never looked at. Uses only `std`.

use std::io;

/// The fields of `/proc/<pid>/status` the agent reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// `Tgid`: the process (thread group) this task belongs to.
    pub tgid: Option<u32>,
    /// `PPid`: the parent process.
    pub ppid: Option<u32>,
    /// `NSpid`: the pid in each nested pid namespace, outermost first (empty when absent).
    pub nspid: Vec<u32>,
    /// `SigCgt`: the mask of signals the process catches (bit n-1 for signal n).
    pub sig_cgt: Option<u64>,
}

/// The bytes of `/proc/<pid>/status`.
pub fn read(pid: u32) -> io::Result<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/status"))
}

/// The fields of a status text; a field that is absent or malformed is `None` (empty).
pub fn parse(text: &[u8]) -> Status {
    let mut s = Status::default();
    for line in text.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (key, value) = (&line[..colon], &line[colon + 1..]);
        // The value of a numeric field is ASCII; anything else makes it malformed.
        let value = std::str::from_utf8(value).ok().map(str::trim);
        match (key, value) {
            (b"Tgid", Some(v)) => s.tgid = v.parse().ok(),
            (b"PPid", Some(v)) => s.ppid = v.parse().ok(),
            (b"NSpid", Some(v)) => {
                s.nspid = v
                    .split_ascii_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .unwrap_or_default()
            }
            (b"SigCgt", Some(v)) => s.sig_cgt = u64::from_str_radix(v, 16).ok(),
            _ => {}
        }
    }
    s
}

/// [`parse`] of `pid`'s status.
pub fn of(pid: u32) -> io::Result<Status> {
    Ok(parse(&read(pid)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &[u8] = b"Name:\t\xff\xfe odd\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\n\
Ngid:\t0\nPid:\t4243\nPPid:\t1\nTracerPid:\t0\nNSpid:\t4243\t7\nSigCgt:\t0000000000004002\n";

    #[test]
    fn reads_the_fields_whatever_the_name_holds() {
        let s = parse(STATUS);
        assert_eq!(s.tgid, Some(4242));
        assert_eq!(s.ppid, Some(1));
        assert_eq!(s.nspid, [4243, 7]);
        assert_eq!(s.sig_cgt, Some(0x4002));
    }

    #[test]
    fn a_name_that_spells_a_field_is_not_that_field() {
        // The comm is at most 15 bytes and cannot hold a line break, but even a name line that
        // read `Tgid:` would come first and be overwritten by the kernel's own line.
        let s = parse(b"Name:\tTgid: 1\nTgid:\t99\n");
        assert_eq!(s.tgid, Some(99));
    }

    #[test]
    fn malformed_or_missing_fields_are_none() {
        let s = parse(b"Tgid:\tx\nPPid:\t-1\nNSpid:\t1 a\nSigCgt:\tzz\n\xff:\t1");
        assert_eq!(s, Status::default());
        assert_eq!(parse(b""), Status::default());
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let s = of(me).unwrap();
        assert_eq!(s.tgid, Some(me));
        assert_eq!(s.ppid, Some(std::os::unix::process::parent_id()));
        assert_eq!(s.nspid.first(), Some(&me));
        assert!(s.sig_cgt.is_some());
    }
}
