//! Opens of nvidia device nodes.
//!
//! The agent's probes (`sys_enter_open{,at,at2}`) look at the entry only: a path starting with
//! `/dev/nvidia` makes the tgid a GPU task at once (kernel table, ioctls counted from then on) and
//! sends `GpuOpen` flagged [`GPU_OPEN_UNCONFIRMED`] with the thread id; the agent checks the open's
//! result itself (the thread has left the open and holds an nvidia fd) and drops the entry of an
//! open that failed. No exit probe runs, so no other syscall pays for one.
//!
//! The `*_pending` programs and `sys_exit_*` are the other design, measured by the overhead bench:
//! the entry remembers the open in `PENDING_OPENS` and the exit probe checks its return value.
//!
//! The bodies are shared by these `syscalls:*` programs and the generic `sys_enter`/`sys_exit`
//! programs (`syscall.rs`). Every open pays a 16-byte user-string read and a prefix compare.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user_str_bytes},
    macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use gpushare_common::{Counter, EventKind, GPU_OPEN_UNCONFIRMED, GpuTask};

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
    on_enter_unconfirmed(&ctx, &Record(&ctx), 1);
    0
}

#[tracepoint]
pub fn sys_enter_openat2(ctx: TracePointContext) -> u32 {
    on_enter_unconfirmed(&ctx, &Record(&ctx), 1);
    0
}

#[tracepoint]
pub fn sys_enter_open(ctx: TracePointContext) -> u32 {
    on_enter_unconfirmed(&ctx, &Record(&ctx), 0);
    0
}

#[tracepoint]
pub fn sys_enter_openat_pending(ctx: TracePointContext) -> u32 {
    on_enter_pending(&Record(&ctx), 1);
    0
}

#[tracepoint]
pub fn sys_enter_openat2_pending(ctx: TracePointContext) -> u32 {
    on_enter_pending(&Record(&ctx), 1);
    0
}

#[tracepoint]
pub fn sys_enter_open_pending(ctx: TracePointContext) -> u32 {
    on_enter_pending(&Record(&ctx), 0);
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

fn exit_record(ctx: &TracePointContext) {
    let ret: i64 = unsafe { ctx.read_at(EXIT_RET_OFFSET) }.unwrap_or(-1);
    on_exit(ctx, ret);
}

/// Whether the syscall's path argument `path_arg` starts with `/dev/nvidia`.
#[inline(always)]
fn nvidia_path(args: &impl SyscallArgs, path_arg: usize) -> bool {
    let Some(filename) = args.arg(path_arg) else {
        return false;
    };
    let mut buf = [0u8; 16];
    unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, &mut buf) }
        .is_ok_and(|path| path.starts_with(NVIDIA_PREFIX))
}

/// Entry of an open-family syscall: an nvidia path makes the tgid a GPU task now, unconfirmed.
#[inline(always)]
pub fn on_enter_unconfirmed<C: EbpfContext>(ctx: &C, args: &impl SyscallArgs, path_arg: usize) {
    if nvidia_path(args, path_arg) {
        let pid_tgid = bpf_get_current_pid_tgid();
        add_gpu_task(
            ctx,
            (pid_tgid >> 32) as u32,
            GPU_OPEN_UNCONFIRMED | (pid_tgid & 0xffff_ffff),
        );
    }
}

/// Entry of an open-family syscall: an nvidia path is remembered for the exit probe.
#[inline(always)]
pub fn on_enter_pending(args: &impl SyscallArgs, path_arg: usize) {
    if nvidia_path(args, path_arg) {
        let _ = PENDING_OPENS.insert(bpf_get_current_pid_tgid(), 1, 0);
    }
}

/// Exit of an open-family syscall of the current thread that returned `ret`.
#[inline(always)]
pub fn on_exit<C: EbpfContext>(ctx: &C, ret: i64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    if unsafe { PENDING_OPENS.get(pid_tgid) }.is_none() {
        return;
    }
    let _ = PENDING_OPENS.remove(pid_tgid);
    if ret >= 0 {
        add_gpu_task(ctx, (pid_tgid >> 32) as u32, 0);
    }
}

/// Makes `tgid` a GPU task (once: an already known task sends nothing) and tells the agent.
#[inline(always)]
fn add_gpu_task<C: EbpfContext>(ctx: &C, tgid: u32, arg: u64) {
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
    send(
        EventKind::GpuOpen,
        tgid,
        task.cgroup_id,
        arg,
        task.comm,
        true,
    );
}
