//! Cgroup lifetime: `cgroup:cgroup_rmdir`, counted (the agent looks again at the groups it set
//! driver limits on only when some group was removed since its last look).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use gpushare_common::Counter;

use crate::maps::bump;

/// `TP_PROTO(struct cgroup *cgrp, const char *path)`: any cgroup of any hierarchy removed.
#[tracepoint]
pub fn cgroup_rmdir(_ctx: TracePointContext) -> u32 {
    bump(Counter::CgroupsRemoved);
    0
}
