//! `/proc/<pid>/status`, whose first line is a name the process chose (any bytes but NUL and a
//! line break), must never make the agent panic, and a field the bytes spell must be read as
//! spelled whatever precedes it.
//!
//! Input: the bytes of a status file. A `Tgid` line with a known value is appended: it must be
//! read back, whatever the input held (the kernel writes its own line after the name).
#![no_main]

use gpushare_agent::sys::proc_status;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = proc_status::parse(data);
    if let Some(mask) = s.sig_cgt {
        let _ = mask.count_ones();
    }
    let mut with = data.to_vec();
    with.extend_from_slice(b"\nTgid:\t4242\n");
    assert_eq!(proc_status::parse(&with).tgid, Some(4242), "{data:?}");
});
