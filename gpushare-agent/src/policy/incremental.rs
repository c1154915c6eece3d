//! The policy's outcome carried across steps: a step whose inputs are those of the last one
//! (the clock aside) and whose state is the one the last evaluation left unchanged is decided
//! without evaluating again.
//!
//! **Why it gives the same outcome.** [`super::evaluate`] reads the clock only where a
//! liability is liable (its ladder's grace and steps), for a kill in progress (its grace), for a
//! transition being retried (its backoff) and to adopt an earlier run's freeze. When the last
//! evaluation returned its own input state with no action, and that state is *calm* (no
//! liability liable, no kill, retry, freeze or suspension wanted or in progress), none of those
//! can apply to the same inputs at another time: a liable liability or an adoption would have
//! changed the state, the others need state a calm one has not. So the same inputs give the same
//! decision, at any time. Anything else (other processes, usage, GPUs, quotas, what the kernel
//! reported, a release, a state changed by the executors' reports) evaluates in full.
//!
//! The comparison reads every field the policy reads and allocates nothing; only a full
//! evaluation whose outcome can be carried keeps a copy of its inputs. The property test
//! `policy::tests::incremental_equals_from_scratch` drives both paths with the same random
//! sequences.

use std::{collections::BTreeMap, sync::Arc};

use super::{
    Decision, PolicyState, Stats, evaluate,
    input::{AttributedProcess, ObservedGroup, PolicyInput},
    outcome::DriverLimits,
    state::WorkloadState,
};
use crate::{
    quota::QuotaSet,
    sample::{DeviceSample, GpuSample, ProcessSample},
};

/// Evaluates, or carries the last outcome where it would be the same (see the module note).
#[derive(Default)]
pub struct Incremental {
    last: Option<Carried>,
    /// Steps decided without evaluating.
    pub carried: u64,
    /// Steps evaluated in full.
    pub evaluated: u64,
}

/// A calm fixed point and the inputs that gave it.
struct Carried {
    state: PolicyState,
    stats: Stats,
    driver_limits: Option<Arc<BTreeMap<String, DriverLimits>>>,
    sample: GpuSample,
    processes: Vec<AttributedProcess>,
    quotas: QuotaSet,
    observed: BTreeMap<String, ObservedGroup>,
    agent_pid: Option<u32>,
    dry_run: bool,
    observe_only: bool,
}

impl Incremental {
    /// The decision for `input` from `prev`, the same as [`evaluate`]`(&prev, input)`. Takes
    /// the state by value so a carried step moves it back out without a copy.
    pub fn evaluate(&mut self, prev: PolicyState, input: &PolicyInput) -> Decision {
        if let Some(c) = &self.last
            && c.applies(&prev, input)
        {
            self.carried += 1;
            return Decision {
                state: prev,
                actions: Vec::new(),
                stats: c.stats.clone(),
                driver_limits: c.driver_limits.clone(),
            };
        }
        self.evaluated += 1;
        let d = evaluate(&prev, input);
        // A release counts in its own step's stats only: such a step is not carried.
        let fixed_point =
            input.releases.is_empty() && d.actions.is_empty() && d.state == prev && calm(&d.state);
        self.last = fixed_point.then(|| Carried {
            state: prev,
            stats: d.stats.clone(),
            driver_limits: d.driver_limits.clone(),
            sample: input.sample.clone(),
            processes: input.processes.to_vec(),
            quotas: input.quotas.clone(),
            observed: input.observed.clone(),
            agent_pid: input.agent_pid,
            dry_run: input.dry_run,
            observe_only: input.observe_only,
        });
        d
    }
}

impl Carried {
    /// Whether `input` from `prev` is the step this fixed point came from, the clock aside.
    fn applies(&self, prev: &PolicyState, input: &PolicyInput) -> bool {
        input.releases.is_empty()
            && input.agent_pid == self.agent_pid
            && input.dry_run == self.dry_run
            && input.observe_only == self.observe_only
            && *prev == self.state
            && input.processes == self.processes.as_slice()
            && same_sample(input.sample, &self.sample)
            && *input.observed == self.observed
            && *input.quotas == self.quotas
    }
}

/// Whether the clock cannot matter to this state (see the module note).
fn calm(state: &PolicyState) -> bool {
    state.workloads.values().all(|w| {
        let WorkloadState {
            cgroup_path: _,
            quota: _,
            frozen,
            scopes,
            killing,
            retry,
            observed: _,
            ours,
            suspended,
            suspend_failed: _,
            suspension,
            waiting_for_room,
        } = w;
        frozen.is_none()
            && killing.is_none()
            && retry.is_none()
            && !ours
            && suspended.is_none()
            && suspension.is_none()
            && waiting_for_room.is_none()
            && scopes.values().all(|s| s.over_since.is_none())
    })
}

/// The parts of two samples the policy reads are equal. Destructured in full, so a field added
/// to a sample must be placed here: read by the policy (compared) or not.
fn same_sample(a: &GpuSample, b: &GpuSample) -> bool {
    let GpuSample {
        taken_at: _,
        devices,
        health,
        processes,
        problems,
    } = a;
    *health == b.health
        && *problems == b.problems
        && devices.len() == b.devices.len()
        && devices
            .iter()
            .zip(&b.devices)
            .all(|(x, y)| same_device(x, y))
        && processes.len() == b.processes.len()
        && processes
            .iter()
            .zip(&b.processes)
            .all(|(x, y)| same_process(x, y))
}

fn same_device(a: &DeviceSample, b: &DeviceSample) -> bool {
    let DeviceSample {
        index,
        uuid,
        name,
        memory_total,
        memory_used,
        memory_free,
        memory_reserved,
        // Not read by the policy: reports only.
        utilization: _,
        process_utilization: _,
        temperature_c: _,
        power_mw: _,
        sm_clock_mhz: _,
    } = a;
    *index == b.index
        && *uuid == b.uuid
        && *name == b.name
        && *memory_total == b.memory_total
        && *memory_used == b.memory_used
        && *memory_free == b.memory_free
        && *memory_reserved == b.memory_reserved
}

fn same_process(a: &ProcessSample, b: &ProcessSample) -> bool {
    let ProcessSample {
        pid,
        device_index,
        device_uuid,
        used_bytes,
        // Not read by the policy: reports only.
        utilization: _,
    } = a;
    *pid == b.pid
        && *device_index == b.device_index
        && *used_bytes == b.used_bytes
        && *device_uuid == b.device_uuid
}

#[cfg(test)]
mod tests;
