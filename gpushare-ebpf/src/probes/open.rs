//! Opens of nvidia device nodes (`syscalls:sys_{enter,exit}_{openat,open}`).
//!
//! On enter, the path is compared with `/dev/nvidia`; a match is remembered per thread in
//! `PENDING_OPENS`. On exit, a successful open of a remembered path makes the tgid a GPU task. Every
//! open pays a short user-string read on enter and one lookup in a nearly empty map on exit.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user_str_bytes},
    macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use gpushare_common::{Counter, EventKind, GpuTask};

use crate::maps::{
    GPU_TASKS, PENDING_OPENS, bump, current_cgroup_id, current_comm, now_boot_ns, send,
};

const NVIDIA_PREFIX: &[u8] = b"/dev/nvidia";
/// `sys_enter_openat`: `const char *filename`.
const OPENAT_FILENAME_OFFSET: usize = 24;
/// `sys_enter_open`: `const char *filename`.
const OPEN_FILENAME_OFFSET: usize = 16;
/// `sys_exit_*`: `long ret`.
const EXIT_RET_OFFSET: usize = 16;

#[tracepoint]
pub fn sys_enter_openat(ctx: TracePointContext) -> u32 {
    on_enter(&ctx, OPENAT_FILENAME_OFFSET);
    0
}

#[tracepoint]
pub fn sys_enter_open(ctx: TracePointContext) -> u32 {
    on_enter(&ctx, OPEN_FILENAME_OFFSET);
    0
}

#[tracepoint]
pub fn sys_exit_openat(ctx: TracePointContext) -> u32 {
    on_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_exit_open(ctx: TracePointContext) -> u32 {
    on_exit(&ctx);
    0
}

fn on_enter(ctx: &TracePointContext, filename_offset: usize) {
    let Ok(filename) = (unsafe { ctx.read_at::<*const u8>(filename_offset) }) else {
        return;
    };
    let mut buf = [0u8; 16];
    let Ok(path) = (unsafe { bpf_probe_read_user_str_bytes(filename, &mut buf) }) else {
        return;
    };
    if !path.starts_with(NVIDIA_PREFIX) {
        return;
    }
    let _ = PENDING_OPENS.insert(bpf_get_current_pid_tgid(), 1, 0);
}

fn on_exit(ctx: &TracePointContext) {
    let pid_tgid = bpf_get_current_pid_tgid();
    if unsafe { PENDING_OPENS.get(pid_tgid) }.is_none() {
        return;
    }
    let _ = PENDING_OPENS.remove(pid_tgid);
    let ret: i64 = unsafe { ctx.read_at(EXIT_RET_OFFSET) }.unwrap_or(-1);
    if ret < 0 {
        return;
    }
    let tgid = (pid_tgid >> 32) as u32;
    if GPU_TASKS.get_ptr(tgid).is_some() {
        return; // already known: one event per task, not per open
    }
    let task = GpuTask {
        cgroup_id: current_cgroup_id(),
        first_open_boot_ns: now_boot_ns(),
        last_alloc_event_ns: 0,
        comm: current_comm(),
    };
    if GPU_TASKS.insert(tgid, task, 0).is_err() {
        bump(Counter::TasksDropped);
        warn!(ctx, "gpushare: GPU_TASKS full, tgid {} not tracked", tgid);
    }
    // Sent even when the table is full: the agent still learns of the task and can use /proc.
    send(EventKind::GpuOpen, tgid, task.cgroup_id, 0, task.comm, true);
}
