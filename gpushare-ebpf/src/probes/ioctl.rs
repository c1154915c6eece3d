//! ioctls of GPU tasks (`syscalls:sys_enter_ioctl`).
//!
//! A non-GPU task pays one hash lookup. A GPU task has its ioctls counted; an nvidia RM allocation
//! escape (NV_ESC_RM_ALLOC, also wrapped in NV_ESC_IOCTL_XFER_CMD) sends an `AllocIoctl` event that
//! wakes the agent, at most once per task per `ALLOC_EVENT_MIN_INTERVAL_NS`.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::tracepoint,
    programs::TracePointContext,
};
use gpushare_common::{
    Counter, EventKind,
    ioctl::{IoctlXfer, NV_ESC_IOCTL_XFER_CMD, NV_ESC_RM_ALLOC, NV_IOCTL_MAGIC, ioc_nr, ioc_type},
};

use crate::maps::{
    GPU_TASKS, alloc_event_min_interval_ns, bump, count_ioctl, current_cgroup_id, now_boot_ns, send,
};

/// `sys_enter_ioctl`: `unsigned int cmd`.
const CMD_OFFSET: usize = 24;
/// `sys_enter_ioctl`: `unsigned long arg`.
const ARG_OFFSET: usize = 32;
/// Marks an `AllocIoctl` whose escape came wrapped in NV_ESC_IOCTL_XFER_CMD.
const WRAPPED_FLAG: u64 = 1 << 32;

#[tracepoint]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(task) = GPU_TASKS.get_ptr_mut(tgid) else {
        return 0;
    };
    let cmd: u64 = unsafe { ctx.read_at(CMD_OFFSET) }.unwrap_or(0);
    let cmd = cmd as u32;
    let alloc = alloc_escape(&ctx, cmd);
    count_ioctl(tgid, alloc.is_some());
    let Some(arg) = alloc else {
        return 0;
    };
    let now = now_boot_ns();
    let last = unsafe { (*task).last_alloc_event_ns };
    if last != 0 && now.wrapping_sub(last) < alloc_event_min_interval_ns() {
        bump(Counter::AllocEventsRateLimited);
        return 0;
    }
    let cgroup_id = current_cgroup_id();
    let comm = unsafe {
        (*task).last_alloc_event_ns = now;
        (*task).cgroup_id = cgroup_id;
        (*task).comm
    };
    send(EventKind::AllocIoctl, tgid, cgroup_id, arg, comm, true);
    0
}

/// `Some(event arg)` when `cmd` is an RM allocation, direct or wrapped.
fn alloc_escape(ctx: &TracePointContext, cmd: u32) -> Option<u64> {
    if ioc_type(cmd) != NV_IOCTL_MAGIC {
        return None;
    }
    match ioc_nr(cmd) {
        NV_ESC_RM_ALLOC => Some(cmd as u64),
        NV_ESC_IOCTL_XFER_CMD => {
            let arg: u64 = unsafe { ctx.read_at(ARG_OFFSET) }.ok()?;
            let xfer: IoctlXfer = unsafe { bpf_probe_read_user(arg as *const IoctlXfer) }.ok()?;
            (xfer.cmd == NV_ESC_RM_ALLOC).then_some(WRAPPED_FLAG | xfer.cmd as u64)
        }
        _ => None,
    }
}
