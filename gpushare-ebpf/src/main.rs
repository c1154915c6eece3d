//! gpushare's eBPF programs.
//!
//! They keep a table of GPU tasks (`GPU_TASKS`: tgid -> cgroup id, first-open time, comm) and tell the
//! agent through the `EVENTS` ring buffer when a task becomes a GPU task, execs, exits, or issues an
//! RM allocation ioctl. A bitmap with one bit per tgid (`GPU_TGID_BITS`, set before a task enters
//! the table and cleared after it leaves) is tested first, so every other task pays one bit test per
//! exec/exit/ioctl (a hash lookup only for a tgid past the bitmap), a short user-string read per
//! open, and never writes to the ring buffer.
//!
//! Submits use `BPF_RB_NO_WAKEUP`; the agent drains on a short timer. Only events that need a prompt
//! answer (a new GPU task, an allocation) force a wakeup.
#![no_std]
#![no_main]
// BPF inline assembly (for the atomic or/and of `maps::GPU_TGID_BITS`) is a nightly feature; the
// programs are built with nightly anyway.
#![feature(asm_experimental_arch)]

mod maps;
mod probes;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
