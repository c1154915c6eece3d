//! Driver limits as a policy output: every workload under a quota that the policy carries gets
//! its quota as a driver limit on its root cgroup, on each GPU the quota covers (a GPU by index
//! or UUID; for an all-GPU or per-GPU quota, the GPUs its processes are sampled on): a hard limit
//! at the quota plus its tolerance, capped at the GPU's memory, the lowest where two of its limits
//! meet. The agent hands them to the driver (see [`crate::enforce::driver_limits`]).
//!
//! **Hard limits only** (the soft limit is always 0). NVIDIA documents soft limits as
//! reservations (the `dmem.min` of the group) that add up into every ancestor, and a leaf deleted
//! without its soft limit zeroed first leaves the ancestors' reservation in place; container
//! runtimes delete a container's cgroup before the agent can notice the container is gone, so a
//! soft limit would leak a reservation until reboot. The ladder gives the soft behaviour (grace,
//! alert, freeze, suspend) above the quota; the hard limit stops an allocation past the
//! tolerance.

use std::collections::BTreeSet;

use super::{outcome::DriverLimits, plan::threshold};
use crate::{
    quota::{DeviceRef, LimitScope, ResolvedQuota},
    sample::GpuSample,
};

/// The driver limits `quota` wants, by GPU index; `sampled_on`: the GPUs the workload's
/// processes are sampled on.
pub(super) fn of_workload(
    quota: &ResolvedQuota,
    sampled_on: Option<&BTreeSet<u32>>,
    sample: &GpuSample,
) -> DriverLimits {
    let total = |i: u32| {
        sample
            .devices
            .iter()
            .find(|d| d.index == i)
            .map(|d| d.memory_total)
    };
    let mut limits = DriverLimits::new();
    for l in &quota.limits {
        let devices: Vec<u32> = match &l.scope {
            LimitScope::Device(DeviceRef::Index(i)) => vec![*i],
            LimitScope::Device(DeviceRef::Uuid(u)) => sample
                .devices
                .iter()
                .filter(|d| &d.uuid == u)
                .map(|d| d.index)
                .collect(),
            LimitScope::Device(DeviceRef::Minor(m)) => sample
                .devices
                .iter()
                .filter(|d| d.minor == Some(*m))
                .map(|d| d.index)
                .collect(),
            LimitScope::EachGpu | LimitScope::AllGpusTotal => {
                sampled_on.into_iter().flatten().copied().collect()
            }
        };
        for d in devices {
            let Some(total) = total(d) else { continue };
            let overhead = super::plan::overhead_of(sample, crate::policy::GpuScope::Gpu(d), []);
            let hard = threshold(l).saturating_add(overhead).min(total);
            let e = limits.entry(d).or_insert((0, hard));
            e.1 = e.1.min(hard);
        }
    }
    limits
}
