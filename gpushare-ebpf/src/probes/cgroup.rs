//! Cgroups: removals counted (`cgroup:cgroup_rmdir`: the agent looks again at the groups it set
//! driver limits on only when some group was removed since its last look), and GPU tasks moved
//! between groups of the unified hierarchy followed (`cgroup:cgroup_attach_task`).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use gpushare_common::{Counter, EventKind};

use crate::maps::{GPU_TASKS, bump, maybe_gpu_task, send};

/// `TP_PROTO(struct cgroup *cgrp, const char *path)`: any cgroup of any hierarchy removed.
#[tracepoint]
pub fn cgroup_rmdir(_ctx: TracePointContext) -> u32 {
    bump(Counter::CgroupsRemoved);
    0
}

/// `cgroup_attach_task`'s record (tracefs `events/cgroup/cgroup_attach_task/format`): the
/// hierarchy, the destination group's id and the task's pid.
const ATTACH_DST_ROOT_OFFSET: usize = 8;
const ATTACH_DST_ID_OFFSET: usize = 16;
const ATTACH_PID_OFFSET: usize = 24;
/// The unified hierarchy's id (`cgrp_dfl_root`), the one `bpf_get_current_cgroup_id` reads.
const UNIFIED_HIERARCHY: i32 = 0;

/// `TP_PROTO(struct cgroup *dst_cgrp, const char *path, struct task_struct *task, bool
/// threadgroup)`: a task moved into a group, for each task moved; runs as the writer of
/// `cgroup.procs`, not as the task. A GPU task's thread-group leader moved within the unified
/// hierarchy changes the task's group: recorded, and sent so the agent charges the new group
/// (without it, a task moved away stayed charged to its old group until it exec'd or allocated).
#[tracepoint]
pub fn cgroup_attach_task(ctx: TracePointContext) -> u32 {
    let root: i32 = unsafe { ctx.read_at(ATTACH_DST_ROOT_OFFSET) }.unwrap_or(-1);
    if root != UNIFIED_HIERARCHY {
        return 0;
    }
    let pid: i32 = unsafe { ctx.read_at(ATTACH_PID_OFFSET) }.unwrap_or(0);
    let Ok(tgid) = u32::try_from(pid) else {
        return 0;
    };
    // Other threads' pids are not in the map: the leader moves with them (`cgroup.procs`).
    if tgid == 0 || !maybe_gpu_task(tgid) {
        return 0;
    }
    let Some(task) = GPU_TASKS.get_ptr_mut(tgid) else {
        return 0;
    };
    let Ok(cgroup_id) = (unsafe { ctx.read_at::<u64>(ATTACH_DST_ID_OFFSET) }) else {
        return 0;
    };
    let (before, comm) = unsafe { ((*task).cgroup_id, (*task).comm) };
    if before == cgroup_id {
        return 0;
    }
    unsafe { (*task).cgroup_id = cgroup_id };
    send(EventKind::GpuMove, tgid, cgroup_id, 0, comm, false);
    0
}
