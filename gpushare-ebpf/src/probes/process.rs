//! Process lifetime: exec and exit (`sched:sched_process_exec`, `sched:sched_process_exit`).
//!
//! Only GPU tasks are of interest: for everyone else each program is one bit test.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use gpushare_common::EventKind;

use crate::maps::{
    GPU_TASKS, current_cgroup_id, current_comm, maybe_gpu_task, send, unmark_gpu_task,
};

/// `sched_process_exit`: `bool group_dead` (true when the last thread of the group exits).
const EXIT_GROUP_DEAD_OFFSET: usize = 32;

/// `TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`; runs as the task.
#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !maybe_gpu_task(tgid) {
        return 0;
    }
    let Some(task) = GPU_TASKS.get_ptr_mut(tgid) else {
        return 0;
    };
    let comm = current_comm();
    let cgroup_id = current_cgroup_id();
    unsafe {
        (*task).comm = comm;
        (*task).cgroup_id = cgroup_id;
    }
    send(EventKind::GpuExec, tgid, cgroup_id, 0, comm, false);
    0
}

/// `TP_PROTO(struct task_struct *p, bool group_dead)`; runs as the exiting task.
#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !maybe_gpu_task(tgid) {
        return 0;
    }
    let Some(task) = GPU_TASKS.get_ptr(tgid) else {
        return 0;
    };
    let group_dead: u8 = unsafe { ctx.read_at(EXIT_GROUP_DEAD_OFFSET) }.unwrap_or(0);
    if group_dead == 0 {
        return 0;
    }
    let (cgroup_id, comm) = unsafe { ((*task).cgroup_id, (*task).comm) };
    let _ = GPU_TASKS.remove(tgid);
    unmark_gpu_task(tgid); // after the entry left
    // IOCTL_COUNTS stays until the agent has read the final counts.
    send(EventKind::GpuExit, tgid, cgroup_id, 0, comm, false);
    0
}
