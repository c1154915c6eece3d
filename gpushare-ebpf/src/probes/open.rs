//! Opens of nvidia device nodes.
//!
//! On enter, the path is compared with `/dev/nvidia`; a match is remembered per thread in
//! `PENDING_OPENS`. On exit, a successful open of a remembered path makes the tgid a GPU task. Every
//! open pays a short user-string read on enter and one lookup in a nearly empty map on exit.
//!
//! The bodies ([`on_enter`], [`on_exit`]) are shared by the `syscalls:sys_{enter,exit}_open*`
//! programs here and the generic `sys_enter`/`sys_exit` programs (`syscall.rs`).

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user_str_bytes},
    macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use gpushare_common::{Counter, EventKind, GpuTask};

use super::args::{Record, SyscallArgs};
use crate::maps::{
    GPU_TASKS, PENDING_OPENS, bump, current_cgroup_id, current_comm, mark_gpu_task, now_boot_ns,
    send,
};

const NVIDIA_PREFIX: &[u8] = b"/dev/nvidia";
/// `sys_exit_*`: `long ret`.
const EXIT_RET_OFFSET: usize = 16;

#[tracepoint]
pub fn sys_enter_openat(ctx: TracePointContext) -> u32 {
    on_enter_arg(&Record(&ctx), 1);
    0
}

#[tracepoint]
pub fn sys_enter_openat2(ctx: TracePointContext) -> u32 {
    on_enter_arg(&Record(&ctx), 1);
    0
}

#[tracepoint]
pub fn sys_enter_open(ctx: TracePointContext) -> u32 {
    on_enter_arg(&Record(&ctx), 0);
    0
}

#[tracepoint]
pub fn sys_exit_openat(ctx: TracePointContext) -> u32 {
    exit_record(&ctx);
    0
}

#[tracepoint]
pub fn sys_exit_openat2(ctx: TracePointContext) -> u32 {
    exit_record(&ctx);
    0
}

#[tracepoint]
pub fn sys_exit_open(ctx: TracePointContext) -> u32 {
    exit_record(&ctx);
    0
}

/// As `sys_enter_openat`, but an nvidia open counts at once, with no exit probe to check its result.
/// Measurement only (the overhead bench's "no exit probe" rows): it takes failed opens too.
#[tracepoint]
pub fn sys_enter_openat_noexit(ctx: TracePointContext) -> u32 {
    on_enter_arg(&Record(&ctx), 1);
    on_exit(&ctx, 0);
    0
}

fn exit_record(ctx: &TracePointContext) {
    let ret: i64 = unsafe { ctx.read_at(EXIT_RET_OFFSET) }.unwrap_or(-1);
    on_exit(ctx, ret);
}

/// An open-family syscall whose path is argument `path_arg`.
#[inline(always)]
pub fn on_enter_arg(args: &impl SyscallArgs, path_arg: usize) {
    if let Some(filename) = args.arg(path_arg) {
        on_enter(filename as *const u8);
    }
}

/// Enter of an open of `filename` (a user pointer) by the current thread.
#[inline(always)]
pub fn on_enter(filename: *const u8) {
    let mut buf = [0u8; 16];
    let Ok(path) = (unsafe { bpf_probe_read_user_str_bytes(filename, &mut buf) }) else {
        return;
    };
    if !path.starts_with(NVIDIA_PREFIX) {
        return;
    }
    let _ = PENDING_OPENS.insert(bpf_get_current_pid_tgid(), 1, 0);
}

/// Exit of an open-family syscall of the current thread that returned `ret`.
#[inline(always)]
pub fn on_exit<C: EbpfContext>(ctx: &C, ret: i64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    if unsafe { PENDING_OPENS.get(pid_tgid) }.is_none() {
        return;
    }
    let _ = PENDING_OPENS.remove(pid_tgid);
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
    mark_gpu_task(tgid); // before the entry: an ioctl that finds the entry finds the bit
    if GPU_TASKS.insert(tgid, task, 0).is_err() {
        bump(Counter::TasksDropped);
        warn!(ctx, "gpushare: GPU_TASKS full, tgid {} not tracked", tgid);
    }
    // Sent even when the table is full: the agent still learns of the task and can use /proc.
    send(EventKind::GpuOpen, tgid, task.cgroup_id, 0, task.comm, true);
}
