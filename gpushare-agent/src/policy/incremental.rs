//! The policy's outcome carried across steps: a step whose inputs are those of the last one
//! (the clock aside) and whose state is the one the last evaluation left unchanged is decided
//! without evaluating again; a step where only some workloads' inputs changed evaluates those
//! workloads only.
//!
//! **Why a carried step gives the same outcome.** [`super::evaluate`] reads the clock only where
//! a liability is liable (its ladder's grace and steps), for a kill in progress (its grace), for a
//! transition being retried (its backoff) and to adopt an earlier run's freeze. When the last
//! evaluation returned its own input state with no action, and that state is *calm* (no
//! liability liable, no kill, retry, freeze or suspension wanted or in progress), none of those
//! can apply to the same inputs at another time: a liable liability or an adoption would have
//! changed the state, the others need state a calm one has not. So the same inputs give the same
//! decision, at any time.
//!
//! **Why a partial step does.** The policy decides each workload from its own processes, their
//! samples, its own state and observed group, and what every workload shares (the GPUs' list
//! and health, the quotas, the flags). Three things couple workloads: a pid attributed to
//! processes of two workloads (its usage is unknown to both), elastic pressure (over-quota
//! elastic liabilities compete for a GPU's free memory), and the counts in [`Stats`]. So when the
//! last decision had no action and a calm state, no liability was over, and this step differs
//! from it only in the processes, the process samples and the GPUs' used and free memory, the
//! workloads are split in two: those whose processes, samples or last state changed (`K`), and
//! the others, each of which is a calm fixed point with its inputs unchanged (carried as above).
//! No pid may be shared across the split. `K` is evaluated on its own, with the whole sample;
//! its part of the counts is what the same evaluation of `K` gave at the last step (replayed
//! from the state before it, at its clock), so the counts are the last ones, less `K`'s then,
//! plus `K`'s now. The GPUs' free memory is read only for elastic pressure and for a resume
//! (a suspended workload is not calm): with nothing over outside `K`, the others do not read it.
//! Anything else (GPUs, quotas, what the kernel reported, a release, a state changed by the
//! executors' reports, processes that came or went) evaluates in full.
//!
//! The comparison reads every field the policy reads; only an evaluation whose outcome can be
//! carried keeps a copy of its inputs, updated in place by a partial step. The property test
//! `policy::tests::incremental_equals_from_scratch` drives both paths with the same random
//! sequences, nudging a few processes' usage between steps.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

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

/// Evaluates, or carries the last outcome where it would be the same, or evaluates only the
/// workloads whose inputs changed (see the module note).
#[derive(Default)]
pub struct Incremental {
    last: Option<Carried>,
    /// Steps decided without evaluating.
    pub carried: u64,
    /// Steps decided by evaluating only the workloads whose inputs changed.
    pub partial: u64,
    /// Steps evaluated in full.
    pub evaluated: u64,
}

/// A calm outcome with no action, and the inputs that gave it.
struct Carried {
    /// The state the decision returned (the next step's, no action having run).
    state: PolicyState,
    /// The workloads whose state that decision changed, with their state before it (`None`:
    /// absent): evaluated again at the next step.
    before: BTreeMap<String, Option<WorkloadState>>,
    /// The decision's clock.
    now: Duration,
    stats: Stats,
    driver_limits: Option<Arc<BTreeMap<String, DriverLimits>>>,
    sample: GpuSample,
    /// Every process sample of `sample` is on a GPU it lists (by UUID).
    listed: bool,
    processes: Vec<AttributedProcess>,
    quotas: QuotaSet,
    observed: BTreeMap<String, ObservedGroup>,
    agent_pid: Option<u32>,
    dry_run: bool,
    observe_only: bool,
    taken: BTreeSet<String>,
}

/// How a step compares with the carried one.
enum Delta {
    /// The same inputs (the GPUs' used and free memory aside where nothing is over), from a
    /// fixed point: the same decision.
    Same,
    /// Some workloads to evaluate again; the others are carried.
    Some(partial::Split),
    /// Evaluate in full.
    All,
}

impl Incremental {
    /// The decision for `input` from `prev`, the same as [`evaluate`]`(&prev, input)`. Takes
    /// the state by value so a carried step moves it back out without a copy.
    pub fn evaluate(&mut self, prev: PolicyState, input: &PolicyInput) -> Decision {
        let delta = match &self.last {
            Some(c) => c.delta(&prev, input),
            None => Delta::All,
        };
        match (delta, &self.last) {
            (Delta::Same, Some(c)) => {
                self.carried += 1;
                Decision {
                    state: prev,
                    actions: Vec::new(),
                    stats: c.stats.clone(),
                    driver_limits: c.driver_limits.clone(),
                }
            }
            (Delta::Some(split), Some(_)) => {
                self.partial += 1;
                self.evaluate_some(prev, input, &split)
            }
            _ => {
                self.evaluated += 1;
                self.evaluate_all(prev, input)
            }
        }
    }

    /// Evaluates in full; keeps the outcome when it can be carried.
    fn evaluate_all(&mut self, prev: PolicyState, input: &PolicyInput) -> Decision {
        let d = evaluate(&prev, input);
        // A release counts in its own step's stats only: such a step is not carried.
        self.last =
            (input.releases.is_empty() && d.actions.is_empty() && calm(d.state.workloads.values()))
                .then(|| {
                    let before = changed_entries(&prev, &d.state);
                    let mut state = prev;
                    for key in before.keys() {
                        match d.state.workloads.get(key) {
                            Some(w) => state.workloads.insert(key.clone(), w.clone()),
                            None => state.workloads.remove(key),
                        };
                    }
                    Carried {
                        state,
                        before,
                        now: input.now,
                        stats: d.stats.clone(),
                        driver_limits: d.driver_limits.clone(),
                        sample: input.sample.clone(),
                        listed: input
                            .sample
                            .processes
                            .iter()
                            .all(|p| listed(input.sample, p)),
                        processes: input.processes.to_vec(),
                        quotas: input.quotas.clone(),
                        observed: input.observed.clone(),
                        agent_pid: input.agent_pid,
                        dry_run: input.dry_run,
                        observe_only: input.observe_only,
                        taken: input.taken.clone(),
                    }
                });
        d
    }
}

/// `p` is on a GPU `sample` lists.
fn listed(sample: &GpuSample, p: &ProcessSample) -> bool {
    sample.devices.iter().any(|d| *d.uuid == *p.device_uuid)
}

/// The entries of `prev` that `next` changed, removed or added, with their value in `prev`.
fn changed_entries(
    prev: &PolicyState,
    next: &PolicyState,
) -> BTreeMap<String, Option<WorkloadState>> {
    let mut out = BTreeMap::new();
    let (mut a, mut b) = (
        prev.workloads.iter().peekable(),
        next.workloads.iter().peekable(),
    );
    loop {
        match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some((ka, wa)), Some((kb, wb))) if ka == kb => {
                if wa != wb {
                    out.insert((*ka).clone(), Some((*wa).clone()));
                }
                a.next();
                b.next();
            }
            (Some((ka, wa)), kb) if kb.is_none_or(|(kb, _)| ka < kb) => {
                out.insert((*ka).clone(), Some((*wa).clone()));
                a.next();
            }
            (_, Some((kb, _))) => {
                out.insert((*kb).clone(), None);
                b.next();
            }
            (Some(_), None) => unreachable!("taken by the arm above"),
        }
    }
    out
}

/// Whether the clock cannot matter to these workloads' states (see the module note).
fn calm<'a>(workloads: impl IntoIterator<Item = &'a WorkloadState>) -> bool {
    workloads.into_iter().all(|w| {
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

/// The GPUs of two samples are equal in what the policy reads (`memory`: their used and free
/// memory too); their processes are compared one by one ([`same_process`]). Destructured in
/// full, so a field added to a sample must be placed here: read by the policy (compared) or not.
fn same_gpus(a: &GpuSample, b: &GpuSample, memory: bool) -> bool {
    let GpuSample {
        taken_at: _,
        devices,
        health,
        processes: _,
        problems,
    } = a;
    *health == b.health
        && *problems == b.problems
        && devices.len() == b.devices.len()
        && devices
            .iter()
            .zip(&b.devices)
            .all(|(x, y)| same_device(x, y, memory))
}

/// `memory`: the used and free memory are compared too.
fn same_device(a: &DeviceSample, b: &DeviceSample, memory: bool) -> bool {
    let DeviceSample {
        index,
        uuid,
        minor,
        name,
        memory_total,
        memory_used,
        memory_free,
        memory_reserved,
        context_overhead,
        // Not read by the policy: reports only.
        utilization: _,
        process_utilization: _,
        temperature_c: _,
        power_mw: _,
        sm_clock_mhz: _,
    } = a;
    *index == b.index
        && *uuid == b.uuid
        && *minor == b.minor
        && *name == b.name
        && *memory_total == b.memory_total
        && (!memory || (*memory_used == b.memory_used && *memory_free == b.memory_free))
        && *memory_reserved == b.memory_reserved
        && *context_overhead == b.context_overhead
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

mod partial;

#[cfg(test)]
mod tests;
