//! Stage 1: devices present and degraded, the processes grouped by workload, and usage per
//! workload per GPU.
//!
//! **Usage.** A process sample counts for the workload its pid is attributed to; usage is summed per
//! workload per GPU, and over all GPUs for an all-GPU quota. A suspended (or suspending, or
//! resuming) workload's GPU memory is in host memory: NVML no longer lists it, but it is the
//! workload's usage all the same (else it would be resumed at once and suspended again). A pid
//! attributed to two identities, a process with `used_bytes == None` or a degraded GPU makes the
//! usage on that GPU unknown.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    input::{AttributedProcess, PolicyInput, Suspension},
    outcome::Stats,
};
use crate::{
    attribution::ProcessIdentity,
    quota::{EnvQuota, WorkloadMeta},
    sample::GpuSample,
};

/// The devices of the sample.
pub(super) struct Devices {
    /// Not healthy.
    pub degraded: BTreeSet<u32>,
    /// The sample has no device at all.
    pub blind: bool,
}

impl Devices {
    pub fn of(sample: &GpuSample) -> Self {
        let present: BTreeSet<u32> = sample
            .devices
            .iter()
            .map(|d| d.index)
            .chain(sample.health.iter().map(|(i, _)| *i))
            .collect();
        let degraded = present
            .iter()
            .copied()
            .filter(|i| !sample.device_ok(*i))
            .collect();
        Self {
            degraded,
            blind: present.is_empty(),
        }
    }

    /// Whether every GPU's data can be trusted (some device, none degraded).
    pub fn trustworthy(&self) -> bool {
        !self.blind && self.degraded.is_empty()
    }
}

/// One workload's processes.
pub(super) struct Group<'a> {
    pub meta: &'a WorkloadMeta,
    pub identities: BTreeSet<ProcessIdentity>,
    pub env: Option<&'a EnvQuota>,
}

/// Usage on one GPU.
#[derive(Default)]
pub(super) struct DevUsage {
    pub bytes: u64,
    /// What NVML lists for it now (`bytes` also counts a suspension's footprint).
    pub listed: u64,
    /// The device's sample cannot be trusted: nothing about this usage is known.
    pub unknown: bool,
    /// Some process's usage is unknown (NVML gave none) on a device whose sample is good: `bytes`
    /// is a lower bound.
    pub partial: bool,
    pub procs: BTreeSet<ProcessIdentity>,
}

/// Usage per workload key per GPU index.
pub(super) type Usage<'a> = BTreeMap<&'a str, BTreeMap<u32, DevUsage>>;

/// One process with its workload key and its position in the input.
pub(super) type Keyed<'a> = (&'a str, usize, &'a AttributedProcess);

/// The processes with their workload keys, in a fixed order.
pub(super) fn keyed(processes: &[AttributedProcess]) -> Vec<Keyed<'_>> {
    let mut procs: Vec<Keyed> = processes
        .iter()
        .enumerate()
        .map(|(i, p)| (p.key(), i, p))
        .collect();
    procs.sort_by(|a, b| (a.0, a.2.identity).cmp(&(b.0, b.2.identity)));
    procs
}

/// The processes grouped by workload, and who owns each pid. Keyed by the processes' shared keys:
/// no string is copied per process.
pub(super) struct Workloads<'a> {
    pub groups: BTreeMap<&'a str, Group<'a>>,
    owners: BTreeMap<u32, BTreeSet<(&'a str, ProcessIdentity)>>,
    /// Each pid's workload, the last process with that pid in the input deciding.
    last_owner: BTreeMap<u32, (usize, &'a str)>,
}

impl<'a> Workloads<'a> {
    pub fn of(procs: &'a [Keyed<'a>]) -> Self {
        let mut groups: BTreeMap<&str, Group> = BTreeMap::new();
        let mut owners: BTreeMap<u32, BTreeSet<(&str, ProcessIdentity)>> = BTreeMap::new();
        let mut last_owner: BTreeMap<u32, (usize, &str)> = BTreeMap::new();
        for (key, at, p) in procs {
            let g = groups.entry(*key).or_insert_with(|| Group {
                meta: &p.workload,
                identities: BTreeSet::new(),
                env: None,
            });
            g.identities.insert(p.identity);
            if g.env.is_none() {
                g.env = p.env_quota.as_ref();
            }
            owners
                .entry(p.identity.pid)
                .or_default()
                .insert((*key, p.identity));
            let last = last_owner.entry(p.identity.pid).or_insert((*at, *key));
            if *at >= last.0 {
                *last = (*at, *key);
            }
        }
        Self {
            groups,
            owners,
            last_owner,
        }
    }

    /// The GPUs each workload's processes are sampled on, a pid counting for the workload of
    /// the last process with that pid in the input (what driver limits cover for an all-GPU or
    /// per-GPU quota).
    pub fn sampled_on(&self, sample: &GpuSample) -> BTreeMap<&'a str, BTreeSet<u32>> {
        let mut on: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
        for s in &sample.processes {
            if let Some((_, key)) = self.last_owner.get(&s.pid) {
                on.entry(*key).or_default().insert(s.device_index);
            }
        }
        on
    }

    /// Usage per workload per device, with the suspensions' footprints.
    pub fn usage(&self, input: &PolicyInput, stats: &mut Stats) -> Usage<'a> {
        let sample = input.sample;
        let mut usage: Usage = BTreeMap::new();
        for ps in &sample.processes {
            let Some(set) = self.owners.get(&ps.pid) else {
                stats.unattributed_samples += 1;
                continue;
            };
            let ambiguous = set.len() > 1;
            for (key, identity) in set {
                let du = usage
                    .entry(*key)
                    .or_default()
                    .entry(ps.device_index)
                    .or_default();
                match ps.used_bytes {
                    Some(b) if !ambiguous => {
                        du.bytes = du.bytes.saturating_add(b);
                        du.listed = du.bytes;
                    }
                    // A pid that names two identities: whose is the usage? Nothing is known.
                    None if !ambiguous => du.partial = true,
                    _ => du.unknown = true,
                }
                if !sample.device_ok(ps.device_index) {
                    du.unknown = true;
                }
                if !ambiguous {
                    du.procs.insert(*identity);
                }
            }
        }
        for (key, o) in input.observed {
            let Some(footprint) = o.suspension.as_ref().and_then(Suspension::footprint) else {
                continue;
            };
            let Some((key, g)) = self.groups.get_key_value(key.as_str()) else {
                continue;
            };
            let per_dev = usage.entry(*key).or_default();
            for (dev, bytes) in footprint {
                let du = per_dev.entry(*dev).or_default();
                du.bytes = du.bytes.max(*bytes);
                du.procs.extend(g.identities.iter().copied());
                if !sample.device_ok(*dev) {
                    du.unknown = true;
                }
            }
        }
        usage
    }
}
