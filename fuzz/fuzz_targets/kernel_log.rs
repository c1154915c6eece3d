//! A kernel-log record (`/dev/kmsg`, or the file `--kernel-log` names) must never make the agent
//! panic, and a fault it reads must be one the kernel wrote (facility 0) of a context-fault Xid
//! naming a process.
//!
//! Input: the bytes of one record. The same record with a user-space priority (facility LOG_USER)
//! in front must never read as a fault: the kernel gives a record user space writes that facility.
#![no_main]

use gpushare_agent::observe::faults::{CONTEXT_FAULTS, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(f) = parse(data) {
        assert!(CONTEXT_FAULTS.contains(&f.xid), "{f:?}");
        assert!(f.pid > 0, "{f:?}");
        let head = data.split(|&b| b == b';').next().unwrap_or_default();
        let prio = head.split(|&b| b == b',').next().unwrap_or_default();
        let prio: u32 = std::str::from_utf8(prio).unwrap().parse().unwrap();
        assert_eq!(prio >> 3, 0, "{data:?}");
    }
    let rest = data
        .iter()
        .position(|&b| b == b',')
        .map_or(data, |i| &data[i..]);
    let forged = [b"14".as_slice(), rest].concat();
    assert_eq!(parse(&forged), None, "{forged:?}");
});
