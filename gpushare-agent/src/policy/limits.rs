//! Driver limits as a policy output: every workload under a quota that the policy carries gets
//! its quota as a driver limit on its root cgroup, on each GPU the quota covers (a GPU by index
//! or UUID; for an all-GPU or per-GPU quota, the GPUs its processes are sampled on): soft at the
//! quota, hard at the quota plus its tolerance, both capped at the GPU's memory, the lowest where
//! two of its limits meet. The agent hands them to the driver (see
//! [`crate::agent::driver_limits`]).

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
            LimitScope::EachGpu | LimitScope::AllGpusTotal => {
                sampled_on.into_iter().flatten().copied().collect()
            }
        };
        for d in devices {
            let Some(total) = total(d) else { continue };
            let soft = l.bytes.min(total);
            let hard = threshold(l).min(total);
            let e = limits.entry(d).or_insert((soft, hard));
            *e = (e.0.min(soft), e.1.min(hard));
        }
    }
    limits
}
