//! ioctls of GPU tasks.
//!
//! A non-GPU task pays one bit test (`GPU_TGID_BITS`). A GPU task's plain ioctl is counted in its
//! per-CPU slot (`IOCTL_COUNTS`, one lookup); only an allocation looks up `GPU_TASKS`. A GPU task has its ioctls counted; an nvidia RM allocation
//! escape (NV_ESC_RM_ALLOC, also wrapped in NV_ESC_IOCTL_XFER_CMD) sends an `AllocIoctl` event that
//! wakes the agent, at most once per task per `ALLOC_EVENT_MIN_INTERVAL_NS`.
//!
//! The body ([`on_ioctl`]) is shared by the `syscalls:sys_enter_ioctl` program here and the generic
//! `sys_enter` programs (`syscall.rs`).

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::tracepoint,
    programs::TracePointContext,
};
use gpushare_common::{
    Counter, EventKind,
    ioctl::{IoctlXfer, NV_ESC_IOCTL_XFER_CMD, NV_ESC_RM_ALLOC, NV_IOCTL_MAGIC, ioc_nr, ioc_type},
};

use super::args::{Record, SyscallArgs};
use crate::maps::{
    GPU_TASKS, alloc_event_min_interval_ns, bump, count_ioctl, current_cgroup_id, gpu_task_bit,
    now_boot_ns, send,
};

/// Marks an `AllocIoctl` whose escape came wrapped in NV_ESC_IOCTL_XFER_CMD.
const WRAPPED_FLAG: u64 = 1 << 32;

#[tracepoint]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    on_ioctl(&Record(&ctx));
    0
}

/// An ioctl (arguments: fd, cmd, arg) of the current task.
#[inline(always)]
pub fn on_ioctl(args: &impl SyscallArgs) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // Within the bitmap, a set bit is a GPU task (the bit is set before the task enters
    // GPU_TASKS and cleared after it leaves): a plain ioctl is counted with no table lookup.
    // Past it (pid_max raised after the load), the table decides.
    match gpu_task_bit(tgid) {
        Some(false) => return,
        Some(true) => {}
        None if GPU_TASKS.get_ptr(tgid).is_none() => return,
        None => {}
    }
    let cmd = args.arg(1).unwrap_or(0) as u32;
    let arg = alloc_escape(args, cmd);
    count_ioctl(tgid, arg != 0);
    if arg == 0 {
        return;
    }
    let Some(task) = GPU_TASKS.get_ptr_mut(tgid) else {
        return;
    };
    let now = now_boot_ns();
    let last = unsafe { (*task).last_alloc_event_ns };
    if last != 0 && now.wrapping_sub(last) < alloc_event_min_interval_ns() {
        bump(Counter::AllocEventsRateLimited);
        return;
    }
    let cgroup_id = current_cgroup_id();
    let comm = unsafe {
        (*task).last_alloc_event_ns = now;
        (*task).cgroup_id = cgroup_id;
        (*task).comm
    };
    send(EventKind::AllocIoctl, tgid, cgroup_id, arg, comm, true);
}

/// The event's arg when `cmd` is an RM allocation, direct or wrapped; 0 otherwise (a plain `u64`,
/// not an `Option`: LLVM may leave the payload of a `None` in a clobbered register, which the
/// verifier rejects).
#[inline(always)]
fn alloc_escape(args: &impl SyscallArgs, cmd: u32) -> u64 {
    if ioc_type(cmd) != NV_IOCTL_MAGIC {
        return 0;
    }
    match ioc_nr(cmd) {
        NV_ESC_RM_ALLOC => cmd as u64,
        NV_ESC_IOCTL_XFER_CMD => {
            let Some(arg) = args.arg(2) else { return 0 };
            match unsafe { bpf_probe_read_user(arg as *const IoctlXfer) } {
                Ok(xfer) if xfer.cmd == NV_ESC_RM_ALLOC => WRAPPED_FLAG | xfer.cmd as u64,
                _ => 0,
            }
        }
        _ => 0,
    }
}
