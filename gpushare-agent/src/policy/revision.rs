//! What the policy reads of each workload at one step, as one revision per workload: computed
//! once from the step's attributed processes and sample, compared by [`super::Incremental`] with
//! the last step's to find the workloads whose inputs changed.
//!
//! A workload's revision is a hash of its processes (their place in the list, identity,
//! workload and environment quota) and of the process samples of their pids (their place in the
//! sample and every field the policy reads). The samples no process has share one more revision.
//! Equal inputs give equal revisions whatever their allocations; a change to anything the
//! policy reads of a workload gives it another (a 64-bit hash: a collision is possible but not
//! chosen by a tenant, the seed being random per process).

use std::{
    collections::BTreeSet,
    hash::{BuildHasher, Hash, Hasher},
};

use foldhash::{HashMap, HashMapExt};

use super::input::AttributedProcess;
use crate::sample::GpuSample;

/// One step's revisions (see the module note).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Revision {
    /// Per workload key.
    workloads: HashMap<String, u64>,
    /// The process samples whose pid no process has.
    unattributed: u64,
}

impl Revision {
    /// The revisions of `processes` and `sample`.
    pub fn of(processes: &[AttributedProcess], sample: &GpuSample) -> Self {
        let seed = seed();
        let mut hashers: HashMap<&str, foldhash::fast::FoldHasher> = HashMap::new();
        // Each pid's workloads (usually one).
        let mut of_pid: HashMap<u32, Vec<&str>> = HashMap::with_capacity(processes.len());
        for (i, p) in processes.iter().enumerate() {
            let h = hashers
                .entry(p.key())
                .or_insert_with(|| seed.build_hasher());
            (i, &p.identity, &*p.workload, &p.env_quota).hash(h);
            let keys = of_pid.entry(p.identity.pid).or_default();
            if !keys.contains(&p.key()) {
                keys.push(p.key());
            }
        }
        let mut unattributed = seed.build_hasher();
        for (i, s) in sample.processes.iter().enumerate() {
            let crate::sample::ProcessSample {
                pid,
                device_index,
                device_uuid,
                used_bytes,
                // Not read by the policy: reports only.
                utilization: _,
            } = s;
            let fields = (i, pid, device_index, &**device_uuid, used_bytes);
            match of_pid.get(pid) {
                Some(keys) => {
                    for key in keys {
                        if let Some(h) = hashers.get_mut(key) {
                            fields.hash(h);
                        }
                    }
                }
                None => fields.hash(&mut unattributed),
            }
        }
        Self {
            workloads: hashers
                .into_iter()
                .map(|(k, h)| (k.to_string(), h.finish()))
                .collect(),
            unattributed: unattributed.finish(),
        }
    }

    /// The workloads whose revision is not the same in `self` and `last` (on either side);
    /// `None` when the samples no process has changed.
    pub fn changed(&self, last: &Self) -> Option<BTreeSet<String>> {
        if self.unattributed != last.unattributed {
            return None;
        }
        let mut out = BTreeSet::new();
        for (k, r) in &self.workloads {
            if last.workloads.get(k) != Some(r) {
                out.insert(k.clone());
            }
        }
        for k in last.workloads.keys() {
            if !self.workloads.contains_key(k) {
                out.insert(k.clone());
            }
        }
        Some(out)
    }
}

/// The hasher's seed: random, the same for the agent's life (revisions of two steps compare).
fn seed() -> foldhash::fast::FixedState {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let s = *SEED.get_or_init(|| foldhash::fast::RandomState::default().hash_one(0u8));
    foldhash::fast::FixedState::with_seed(s)
}

#[cfg(test)]
mod tests;
