//! The partial step (see the module note of [`super`]): which workloads a step evaluates again,
//! their evaluation, and the counts rebased from their last one.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use super::{Carried, Delta, Incremental, calm, listed, same_gpus, same_process};
use crate::{
    policy::{
        Decision, PolicyState, Stats, evaluate,
        input::{AttributedProcess, ObservedGroup, PolicyInput},
    },
    sample::GpuSample,
};

/// The workloads a step evaluates again, and what their evaluations read.
pub(super) struct Split {
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
    /// Evaluates the workloads `k` (see the module note: [`Carried::delta`] found the others
    /// carried), and the same workloads at the last step for their part of the counts.
    pub(super) fn evaluate_some(
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
            taken: input.taken,
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
    pub(super) fn delta(&self, prev: &PolicyState, input: &PolicyInput) -> Delta {
        let (s, c) = (input.sample, &self.sample);
        let frame = input.releases.is_empty()
            && input.agent_pid == self.agent_pid
            && input.dry_run == self.dry_run
            && input.observe_only == self.observe_only
            && *input.taken == self.taken
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
