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
}

/// How a step compares with the carried one.
enum Delta {
    /// The same inputs (the GPUs' used and free memory aside where nothing is over), from a
    /// fixed point: the same decision.
    Same,
    /// Some workloads to evaluate again; the others are carried.
    Some(Split),
    /// Evaluate in full.
    All,
}

/// The workloads a step evaluates again, and what their evaluations read.
struct Split {
    /// Their keys.
    k: BTreeSet<String>,
    /// Whether each process of the step is one of theirs (of the last step too: a process that
    /// moved was theirs then and is now).
    inside: Vec<bool>,
    /// The processes (by position) that differ from the last step's: theirs, then and now.
    moved: Vec<usize>,
    /// The process samples their evaluations read, by position (the same in both steps): those
    /// of their pids, then or now, and those that changed. `None`: all of them (a process
    /// sample on a GPU the sample does not list: a quota naming that GPU's UUID finds its index
    /// there).
    samples: Option<Vec<usize>>,
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
                    }
                });
        d
    }

    /// Evaluates the workloads `k` (see the module note: [`Carried::delta`] found the others
    /// carried), and the same workloads at the last step for their part of the counts.
    fn evaluate_some(
        &mut self,
        mut prev: PolicyState,
        input: &PolicyInput,
        split: &Split,
    ) -> Decision {
        let Some(c) = self.last.as_mut() else {
            return evaluate(&prev, input);
        };
        let k = &split.k;

        let theirs = |all: &[AttributedProcess], inside: &[bool]| -> Vec<AttributedProcess> {
            all.iter()
                .zip(inside)
                .filter(|(_, i)| **i)
                .map(|(p, _)| p.clone())
                .collect()
        };
        // A process that moved was theirs then and is now: the same positions.
        let procs_was = theirs(&c.processes, &split.inside);
        let procs_is = theirs(input.processes, &split.inside);
        let read = |all: &GpuSample| -> Option<GpuSample> {
            split.samples.as_ref().map(|at| GpuSample {
                taken_at: None,
                devices: all.devices.clone(),
                health: all.health.clone(),
                processes: at.iter().map(|&i| all.processes[i].clone()).collect(),
                problems: all.problems.clone(),
            })
        };
        let (sample_was, sample_is) = (read(&c.sample), read(input.sample));
        let observed: BTreeMap<String, ObservedGroup> = k
            .iter()
            .filter_map(|key| c.observed.get(key).map(|o| (key.clone(), o.clone())))
            .collect();
        let state_was = PolicyState {
            workloads: k
                .iter()
                .filter_map(|key| {
                    let w = match c.before.get(key) {
                        Some(before) => before.clone(),
                        None => prev.workloads.get(key).cloned(),
                    };
                    w.map(|w| (key.clone(), w))
                })
                .collect(),
        };
        let state_is = PolicyState {
            workloads: k
                .iter()
                .filter_map(|key| prev.workloads.get(key).map(|w| (key.clone(), w.clone())))
                .collect(),
        };
        let sub = |now, sample, processes| PolicyInput {
            now,
            sample,
            processes,
            quotas: input.quotas,
            releases: &[],
            agent_pid: input.agent_pid,
            dry_run: input.dry_run,
            observe_only: input.observe_only,
            observed: &observed,
        };
        let was = evaluate(
            &state_was,
            &sub(c.now, sample_was.as_ref().unwrap_or(&c.sample), &procs_was),
        );
        let is = evaluate(
            &state_is,
            &sub(
                input.now,
                sample_is.as_ref().unwrap_or(input.sample),
                &procs_is,
            ),
        );
        let stats = rebase(&c.stats, &was.stats, &is.stats);
        let driver_limits = match (&c.driver_limits, &was.driver_limits, &is.driver_limits) {
            (Some(all), Some(w), Some(i)) if w != i => {
                let mut m = (**all).clone();
                for key in k {
                    m.remove(key);
                }
                m.extend(i.iter().map(|(key, l)| (key.clone(), l.clone())));
                Some(Arc::new(m))
            }
            (all, _, _) => all.clone(),
        };
        // The decision's state: `prev` with `k`'s entries decided now (the carried copy, equal
        // to `prev`, the same way).
        let Decision {
            state: mut decided,
            actions,
            ..
        } = is;
        let keep = actions.is_empty() && calm(decided.workloads.values());
        let mut before = BTreeMap::new();
        for key in k {
            let old = prev.workloads.remove(key);
            let new = decided.workloads.remove(key);
            match &new {
                Some(w) => c.state.workloads.insert(key.clone(), w.clone()),
                None => c.state.workloads.remove(key),
            };
            if old != new {
                before.insert(key.clone(), old);
            }
            if let Some(w) = new {
                prev.workloads.insert(key.clone(), w);
            }
        }
        debug_assert!(
            decided.workloads.is_empty(),
            "decided outside its workloads"
        );
        if keep {
            c.before = before;
            c.now = input.now;
            c.stats.clone_from(&stats);
            c.driver_limits.clone_from(&driver_limits);
            c.sample.devices.clone_from(&input.sample.devices);
            for (a, b) in c.sample.processes.iter_mut().zip(&input.sample.processes) {
                if !same_process(a, b) {
                    c.listed &= listed(input.sample, b);
                    *a = b.clone();
                }
            }
            for &i in &split.moved {
                c.processes[i] = input.processes[i].clone();
            }
        } else {
            self.last = None;
        }
        Decision {
            state: prev,
            actions,
            stats,
            driver_limits,
        }
    }
}

impl Carried {
    /// How `input` from `prev` compares with the step this outcome came from (see the module
    /// note).
    fn delta(&self, prev: &PolicyState, input: &PolicyInput) -> Delta {
        let (s, c) = (input.sample, &self.sample);
        let frame = input.releases.is_empty()
            && input.agent_pid == self.agent_pid
            && input.dry_run == self.dry_run
            && input.observe_only == self.observe_only
            && *prev == self.state
            && same_gpus(s, c, false)
            && *input.observed == self.observed
            && *input.quotas == self.quotas;
        if !frame
            || input.processes.len() != self.processes.len()
            || s.processes.len() != c.processes.len()
        {
            return Delta::All;
        }
        // Nothing over: nothing outside what changed reads the GPUs' free memory.
        let uncoupled = self.stats.over_quota == 0;
        let memory = same_gpus(s, c, true);
        let moved: Vec<usize> = (0..self.processes.len())
            .filter(|&i| self.processes[i] != input.processes[i])
            .collect();
        let mut pids: foldhash::HashSet<u32> = foldhash::HashSet::default();
        let mut changed = Vec::new();
        for (i, (a, b)) in c.processes.iter().zip(&s.processes).enumerate() {
            if !same_process(a, b) {
                pids.insert(a.pid);
                pids.insert(b.pid);
                changed.push(i);
            }
        }
        if self.before.is_empty() && moved.is_empty() && pids.is_empty() && (memory || uncoupled) {
            return Delta::Same;
        }
        if !uncoupled {
            return Delta::All;
        }
        let mut k: BTreeSet<String> = self.before.keys().cloned().collect();
        let was = |i: &usize| &self.processes[*i];
        for p in moved
            .iter()
            .map(was)
            .chain(moved.iter().map(|&i| &input.processes[i]))
        {
            k.insert(p.key().to_string());
        }
        if !pids.is_empty() {
            for p in input.processes.iter().chain(moved.iter().map(was)) {
                if pids.contains(&p.identity.pid) && !k.contains(p.key()) {
                    k.insert(p.key().to_string());
                }
            }
        }
        // Evaluating more than half the workloads twice costs more than all of them once.
        if k.len() * 2 > self.stats.workloads.max(1) {
            return Delta::All;
        }
        // No pid on both sides of the split.
        let members: foldhash::HashSet<&str> = k.iter().map(String::as_str).collect();
        let inside: Vec<bool> = input
            .processes
            .iter()
            .map(|p| members.contains(p.key()))
            .collect();
        let k_pids: foldhash::HashSet<u32> = input
            .processes
            .iter()
            .zip(&inside)
            .filter(|(_, i)| **i)
            .map(|(p, _)| p.identity.pid)
            .chain(moved.iter().map(|i| was(i).identity.pid))
            .collect();
        if input
            .processes
            .iter()
            .zip(&inside)
            .any(|(p, i)| !i && k_pids.contains(&p.identity.pid))
        {
            return Delta::All;
        }
        // Their samples, and those that changed (so that the samples left out are the same in
        // both steps, each attributed to a workload outside or to none in both).
        let samples =
            (self.listed && changed.iter().all(|&i| listed(s, &s.processes[i]))).then(|| {
                let mut at: Vec<usize> = (0..s.processes.len())
                    .filter(|&i| k_pids.contains(&s.processes[i].pid))
                    .collect();
                at.extend(changed);
                at.sort_unstable();
                at.dedup();
                at
            });
        drop(members);
        Delta::Some(Split {
            k,
            inside,
            moved,
            samples,
        })
    }
}

/// `p` is on a GPU `sample` lists.
fn listed(sample: &GpuSample, p: &ProcessSample) -> bool {
    sample.devices.iter().any(|d| d.uuid == p.device_uuid)
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

/// The counts of a step where the workloads `was` counted at the last step (whose counts are
/// `all`) count `is` now. The GPUs and the releases are the last step's.
fn rebase(all: &Stats, was: &Stats, is: &Stats) -> Stats {
    let Stats {
        workloads,
        protected,
        unquota,
        over_quota,
        fail_open,
        unattributed_samples,
        degraded_devices,
        ignored_releases,
        external_thaws,
        groups_gone,
        groups_replaced,
        adopted,
        suspend_fallthroughs,
    } = all;
    // Added before subtracted: `was` may exceed `all` (the processes outside `K` leave more
    // samples unattributed in `K`'s evaluation than in the whole one).
    let n = |all: usize, was: usize, is: usize| all.saturating_add(is).saturating_sub(was);
    let mut falls = suspend_fallthroughs.clone();
    for (cause, c) in &is.suspend_fallthroughs {
        *falls.entry(cause.clone()).or_default() += c;
    }
    for (cause, c) in &was.suspend_fallthroughs {
        if let Some(v) = falls.get_mut(cause) {
            *v = v.saturating_sub(*c);
        }
    }
    falls.retain(|_, v| *v > 0);
    Stats {
        workloads: n(*workloads, was.workloads, is.workloads),
        protected: n(*protected, was.protected, is.protected),
        unquota: n(*unquota, was.unquota, is.unquota),
        over_quota: n(*over_quota, was.over_quota, is.over_quota),
        fail_open: n(*fail_open, was.fail_open, is.fail_open),
        unattributed_samples: n(
            *unattributed_samples,
            was.unattributed_samples,
            is.unattributed_samples,
        ),
        degraded_devices: *degraded_devices,
        ignored_releases: *ignored_releases,
        external_thaws: n(*external_thaws, was.external_thaws, is.external_thaws),
        groups_gone: n(*groups_gone, was.groups_gone, is.groups_gone),
        groups_replaced: n(*groups_replaced, was.groups_replaced, is.groups_replaced),
        adopted: n(*adopted, was.adopted, is.adopted),
        suspend_fallthroughs: falls,
    }
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
        && (!memory || (*memory_used == b.memory_used && *memory_free == b.memory_free))
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
