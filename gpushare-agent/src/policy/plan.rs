//! Stage 2: each workload with processes is planned as excluded, unresolved or enforced with
//! its liabilities.
//!
//! A *liability* is one (workload, GPU scope) with a limit. It is *over* when usage > limit +
//! tolerance; in `strict` mode an over liability is liable (for `elastic`, see [`super::pressure`]).
//!
//! **Safety.** No action other than Thaw for a workload that is protected (the host's root cgroup, the
//! agent's own workload, the `protect` list, a plain cgroup no file entry names) or that no quota
//! covers. Fail open: a liability whose usage is unknown (its GPU degraded, a process with
//! `used_bytes == None`, a pid attributed to two identities, an all-GPU quota while any GPU is
//! degraded, or a sample without any device) keeps its previous state unchanged, escalates nothing,
//! re-freezes nothing, and is counted in [`Stats::fail_open`]; a workload frozen by it stays frozen
//! until the data is good again. But where the samples are good and only some processes' usage is
//! unknown, the known part is a lower bound: if it alone is over, the liability is over (one
//! process a tenant keeps unreadable no longer shields the rest). Targets are only ever identities
//! from the `processes` input.

use std::collections::BTreeMap;

use super::{
    input::{GpuScope, PolicyInput, Suspension},
    outcome::Stats,
    usage::{Devices, Group, Usage},
};
use crate::{
    attribution::WorkloadKind,
    quota::{DeviceRef, Enforcement, Limit, LimitScope, Mode, ResolvedQuota},
};

/// One (workload, GPU scope) with a limit, at this step.
pub(super) struct Liability {
    pub scope: GpuScope,
    pub limit: u64,
    pub enforcement: Enforcement,
    pub usage: u64,
    /// The driver's memory allowed beyond the limit (a CUDA context per GPU of the scope the
    /// workload uses: [`crate::sample::ContextOverhead`]).
    pub overhead: u64,
    pub unknown: bool,
    pub over: bool,
    pub liable: bool,
    /// Elastic: the GPU under pressure and its free memory.
    pub pressure: Option<(u32, u64)>,
    /// Its GPU memory is in host memory (suspended): it may come back only where it fits.
    pub suspended: bool,
}

/// What the policy does with one workload with processes.
pub(super) enum Plan {
    /// Nothing but thaw what the agent froze, because (in words) ...
    Excluded(&'static str),
    /// A quota names a GPU by UUID that cannot be found while some GPU is degraded.
    Unresolved(ResolvedQuota),
    Enforce {
        quota: ResolvedQuota,
        liabilities: Vec<Liability>,
    },
}

/// The usage above which a limit is over: the limit plus its tolerance.
pub(super) fn threshold(limit: &Limit) -> u64 {
    limit
        .bytes
        .saturating_add(limit.enforcement.tolerance.allowance(limit.bytes))
}

/// The driver's memory allowed beyond a limit over `scope`: one CUDA context on each GPU of the
/// scope (`used_on`: the GPUs the workload's processes are on), however many processes it runs.
pub(super) fn overhead_of<'a>(
    sample: &crate::sample::GpuSample,
    scope: GpuScope,
    used_on: impl IntoIterator<Item = &'a u32>,
) -> u64 {
    let of = |i: u32| {
        sample
            .devices
            .iter()
            .find(|d| d.index == i)
            .map_or(0, |d| d.context_overhead.bytes)
    };
    match scope {
        GpuScope::Gpu(i) => of(i),
        GpuScope::All => used_on
            .into_iter()
            .fold(0u64, |acc, i| acc.saturating_add(of(*i))),
    }
}

/// Excluded, unresolved or liable with its liabilities, for every workload with processes.
pub(super) fn plan_workloads<'a>(
    input: &PolicyInput,
    groups: &'a BTreeMap<&str, Group>,
    usage: &Usage,
    devices: &Devices,
    stats: &mut Stats,
) -> BTreeMap<&'a str, Plan> {
    let mut plans: BTreeMap<&str, Plan> = BTreeMap::new();
    for (key, g) in groups {
        stats.workloads += 1;
        let plan = plan_one(input, key, g, usage, devices, stats);
        plans.insert(key, plan);
    }
    plans
}

fn plan_one(
    input: &PolicyInput,
    key: &str,
    g: &Group,
    usage: &Usage,
    devices: &Devices,
    stats: &mut Stats,
) -> Plan {
    let sample = input.sample;
    let meta = g.meta;
    let protected = meta.id.kind == WorkloadKind::Host
        || input
            .agent_pid
            .is_some_and(|pid| g.identities.iter().any(|i| i.pid == pid))
        || input.quotas.is_protected(meta)
        || (meta.id.kind == WorkloadKind::Cgroup && !input.quotas.named_by_file(meta));
    if protected {
        stats.protected += 1;
        return Plan::Excluded("it is protected");
    }
    let Some(quota) = input.quotas.resolve(meta, g.env) else {
        stats.unquota += 1;
        return Plan::Excluded("no quota covers it any more");
    };
    let empty = BTreeMap::new();
    let dev_usage = usage.get(key).unwrap_or(&empty);
    let blind = devices.blind;
    let mut scopes: Vec<(GpuScope, &Limit)> = Vec::new();
    let mut unresolved = false;
    for limit in &quota.limits {
        let scope = match &limit.scope {
            LimitScope::AllGpusTotal => Some(GpuScope::All),
            LimitScope::Device(DeviceRef::Index(i)) => Some(GpuScope::Gpu(*i)),
            LimitScope::Device(DeviceRef::Uuid(u)) => {
                let found = sample
                    .devices
                    .iter()
                    .find(|d| d.uuid == *u)
                    .map(|d| d.index)
                    .or_else(|| {
                        sample
                            .processes
                            .iter()
                            .find(|p| *p.device_uuid == **u)
                            .map(|p| p.device_index)
                    });
                if found.is_none() && !devices.trustworthy() {
                    unresolved = true;
                }
                found.map(GpuScope::Gpu)
            }
            // A device node's minor: the GPU NVML gives that minor, never the GPU of that index.
            LimitScope::Device(DeviceRef::Minor(m)) => {
                let found = sample
                    .devices
                    .iter()
                    .find(|d| d.minor == Some(*m))
                    .map(|d| d.index);
                if found.is_none() && !devices.trustworthy() {
                    unresolved = true;
                }
                found.map(GpuScope::Gpu)
            }
            LimitScope::EachGpu => None,
        };
        if let Some(scope) = scope
            && !scopes.iter().any(|(s, _)| *s == scope)
        {
            scopes.push((scope, limit));
        }
    }
    for limit in quota
        .limits
        .iter()
        .filter(|l| l.scope == LimitScope::EachGpu)
    {
        for dev in dev_usage.keys() {
            let scope = GpuScope::Gpu(*dev);
            if !scopes.iter().any(|(s, _)| *s == scope) {
                scopes.push((scope, limit));
            }
        }
    }
    if unresolved {
        return Plan::Unresolved(quota);
    }
    scopes.sort_by_key(|(s, _)| *s);
    let suspended = input
        .observed
        .get(key)
        .and_then(|o| o.suspension.as_ref())
        .and_then(Suspension::footprint)
        .is_some();
    let liabilities = scopes
        .into_iter()
        .map(|(scope, limit)| {
            let (used, stale, partial) = match scope {
                GpuScope::All => (
                    dev_usage
                        .values()
                        .fold(0u64, |acc, d| acc.saturating_add(d.bytes)),
                    !devices.trustworthy() || dev_usage.values().any(|d| d.unknown),
                    dev_usage.values().any(|d| d.partial),
                ),
                GpuScope::Gpu(i) => {
                    let d = dev_usage.get(&i);
                    (
                        d.map_or(0, |d| d.bytes),
                        blind || devices.degraded.contains(&i) || d.is_some_and(|d| d.unknown),
                        d.is_some_and(|d| d.partial),
                    )
                }
            };
            let overhead = overhead_of(sample, scope, dev_usage.keys());
            // A lower bound over the threshold is over; under it, nothing is known.
            let over = !stale && used > threshold(limit).saturating_add(overhead);
            let unknown = stale || (partial && !over);
            Liability {
                scope,
                limit: limit.bytes,
                enforcement: limit.enforcement.clone(),
                usage: used,
                overhead,
                unknown,
                over,
                liable: over && limit.enforcement.mode == Mode::Strict,
                pressure: None,
                suspended,
            }
        })
        .collect();
    Plan::Enforce { quota, liabilities }
}
