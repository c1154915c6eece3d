//! What one evaluation decides ([`Decision`]): the next state, the actions for the executors,
//! the driver limits wanted, and counts for metrics.
//!
//! **Dry run.** The policy decides exactly as usual and copies `dry_run` into each [`Action`]; the
//! executors must not touch anything for such an action. State advances as if the actions were
//! carried out (a desired freeze counts as done), so reports show what would have happened. A
//! dry run (like an observe-only agent) wants no driver limit set or cleared
//! ([`Decision::driver_limits`] is `None`).

use std::collections::BTreeMap;

use super::{action::ActionKind, input::GpuScope, state::PolicyState};
use crate::attribution::ProcessIdentity;

/// One decision for the executors.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Action {
    /// Workload key.
    pub workload: String,
    /// Its root cgroup path.
    pub cgroup_path: String,
    /// The liability that caused it.
    pub gpu: GpuScope,
    /// What to do.
    pub kind: ActionKind,
    /// The verified processes it is about (from the input; may be empty for a Thaw).
    pub targets: Vec<ProcessIdentity>,
    /// Usage, bytes, when known.
    pub usage: Option<u64>,
    /// Limit, bytes, when one applies.
    pub limit: Option<u64>,
    /// Why, in words with numbers.
    pub reason: String,
    /// Dry run: report only, touch nothing.
    pub dry_run: bool,
    /// Which attempt of this freeze or thaw (1 for the first).
    pub attempt: u32,
    /// For a Suspend: the workload's GPU memory, bytes per GPU index, to be moved.
    pub footprint: BTreeMap<u32, u64>,
}

/// Counts from one evaluation (for metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Workloads with attributed GPU processes.
    pub workloads: usize,
    /// Of those, protected.
    pub protected: usize,
    /// Of those, covered by no quota.
    pub unquota: usize,
    /// Liabilities over quota (liable or not).
    pub over_quota: usize,
    /// Liabilities left alone because their usage was unknown.
    pub fail_open: usize,
    /// Process samples whose pid no attributed process has.
    pub unattributed_samples: usize,
    /// Devices in the sample that are not healthy.
    pub degraded_devices: usize,
    /// Releases naming no known workload.
    pub ignored_releases: usize,
    /// Groups the agent froze that were found thawed by someone else.
    pub external_thaws: usize,
    /// Groups the agent froze that were found removed.
    pub groups_gone: usize,
    /// Groups the agent froze that were found recreated under the same path.
    pub groups_replaced: usize,
    /// Freezes of an earlier run taken over.
    pub adopted: usize,
    /// Suspend steps that fell through this step, by cause.
    pub suspend_fallthroughs: BTreeMap<String, usize>,
}

/// One GPU's driver limit for one workload: (soft, hard) bytes, by GPU index.
pub type DriverLimits = BTreeMap<u32, (u64, u64)>;

/// Driver limits for the driver, merged over workloads: (GPU index, root cgroup path) -> (soft,
/// hard) bytes.
pub type WantedLimits = BTreeMap<(u32, String), (u64, u64)>;

/// Each workload's driver limits (by key), as [`Decision::driver_limits`] carries them.
pub type PerWorkloadLimits = BTreeMap<String, DriverLimits>;

/// The result of one evaluation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Decision {
    /// Carry into the next evaluation.
    pub state: PolicyState,
    /// What to do, in workload-key order.
    pub actions: Vec<Action>,
    /// Counts.
    pub stats: Stats,
    /// The driver limits each workload under a quota should have, by workload key (its quota
    /// on each GPU the quota covers: hard at the quota plus its tolerance, capped at the GPU's
    /// memory; soft 0, hard limits only); `None` in a dry run or observe only (set and clear
    /// nothing).
    pub driver_limits: Option<std::sync::Arc<BTreeMap<String, DriverLimits>>>,
}

/// The driver limits wanted at the root cgroups of the workloads `state` carries (the
/// decision's state, once the executors' reports are folded in), from each one's
/// [`Decision::driver_limits`], the lowest where two meet.
pub fn wanted_limits(
    per_workload: &BTreeMap<String, DriverLimits>,
    state: &PolicyState,
) -> WantedLimits {
    let mut wanted = WantedLimits::new();
    for (key, ws) in &state.workloads {
        for (dev, (soft, hard)) in per_workload.get(key).into_iter().flatten() {
            let e = wanted
                .entry((*dev, ws.cgroup_path.clone()))
                .or_insert((*soft, *hard));
            *e = (e.0.min(*soft), e.1.min(*hard));
        }
    }
    wanted
}
