//! The pure policy core: `(previous state, samples, attribution, quotas, observed enforcement
//! state, now) -> (state, actions, driver limits)`.
//!
//! Design note: [`evaluate`] does no I/O, reads no clock and keeps no hidden state, so every decision
//! can be replayed in a unit test. Time is a plain [`Duration`](std::time::Duration) since an
//! arbitrary origin (the agent uses its monotonic start). All maps are ordered, so equal inputs
//! give equal outputs, in any order of `processes`.
//!
//! [`evaluate`] runs these stages in order, one module each:
//!
//! 1. `usage`: devices present and degraded, processes grouped by workload, usage per workload
//!    per GPU (with suspensions' footprints);
//! 2. `plan`: each workload excluded, unresolved or enforced with its liabilities;
//! 3. `pressure`: which elastic liabilities are liable under memory pressure;
//! 4. `workload`: per workload, the preamble (gone, excluded, unresolved, `adopt`ed);
//! 5. `ladder`: its ladder steps (and a kill's escalation);
//! 6. `hold`: which liability holds its freeze or suspension;
//! 7. `reconcile`: external thaws, and the Freeze, Thaw, Suspend or Resume that closes the gap
//!    to what the kernel reported;
//! 8. `orphans`: workloads that left the attribution;
//!
//! and `limits`: the driver limits of the workloads it carries. Its inputs are in `input`, its
//! state in `state`, its result in `outcome`; [`fold_reports`] (`report`) folds what the
//! executors report back into the state within the same step.
//!
//! [`Incremental`] (`incremental`) is how the agent calls it: a step whose inputs are the last
//! step's, the clock aside, from the calm state that step left unchanged, is decided without
//! evaluating again; the decision is the same (a property test drives both paths).

mod action;
mod adopt;
mod hold;
mod incremental;
mod input;
mod ladder;
mod limits;
mod orphans;
mod outcome;
mod plan;
mod pressure;
mod reconcile;
mod report;
mod room;
mod state;
mod usage;
mod workload;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use self::usage::{DevUsage, Devices, Usage, Workloads};
pub use self::{
    action::ActionKind,
    incremental::Incremental,
    input::{
        AttributedProcess, GpuScope, GroupState, NONE_TAKEN, ObservedGroup, PolicyInput, Suspension,
    },
    ladder::{CLOCK_COOLDOWN, KILL_GRACE},
    outcome::{
        Action, Decision, DriverLimits, PerWorkloadLimits, Stats, WantedLimits, wanted_limits,
    },
    reconcile::{RETRY_BASE, RETRY_MAX},
    report::{Report, fold_reports},
    room::{listed_for, resume_room, resume_room_keeping},
    state::{Killing, PolicyState, Retry, ScopeState, Status, WorkloadState},
};
use crate::{attribution::ProcessIdentity, quota::ResolvedQuota};

/// Decides what to do now: the stages in order (see the module note).
pub fn evaluate(prev: &PolicyState, input: &PolicyInput) -> Decision {
    let devices = Devices::of(input.sample);
    let mut out = Out::new(input, devices.degraded.len());
    let keyed = usage::keyed(input.processes);
    let workloads = Workloads::of(&keyed);
    let usage = workloads.usage(input, &mut out.stats);
    let mut plans =
        plan::plan_workloads(input, &workloads.groups, &usage, &devices, &mut out.stats);
    pressure::apply_elastic_pressure(input, &mut plans, &usage);
    let step = Step {
        prev,
        input,
        releases: input.releases.iter().map(String::as_str).collect(),
        sampled_on: if out.driver_limits.is_some() {
            workloads.sampled_on(input.sample)
        } else {
            BTreeMap::new()
        },
        workloads: &workloads,
        usage: &usage,
        devices: &devices,
    };
    out.stats.ignored_releases = step.ignored_releases();
    for (key, plan) in &plans {
        workload::decide(&step, key, plan, &mut out);
    }
    orphans::decide(&step, &mut out);
    Decision {
        state: out.next,
        actions: out.actions,
        stats: out.stats,
        driver_limits: out.driver_limits.map(std::sync::Arc::new),
    }
}

/// What every stage of one evaluation reads.
struct Step<'a> {
    prev: &'a PolicyState,
    input: &'a PolicyInput<'a>,
    /// Workload keys an operator released.
    releases: BTreeSet<&'a str>,
    /// The GPUs each workload's processes are sampled on (for driver limits, when wanted).
    sampled_on: BTreeMap<&'a str, BTreeSet<u32>>,
    workloads: &'a Workloads<'a>,
    usage: &'a Usage<'a>,
    devices: &'a Devices,
}

impl Step<'_> {
    /// Releases naming no known workload.
    fn ignored_releases(&self) -> usize {
        self.releases
            .iter()
            .filter(|k| {
                !self.workloads.groups.contains_key(**k)
                    && !self.prev.workloads.contains_key(**k)
                    && !self.input.observed.get(**k).is_some_and(|o| o.ours)
            })
            .count()
    }
}

/// What the stages produce.
struct Out {
    next: PolicyState,
    actions: Vec<Action>,
    stats: Stats,
    driver_limits: Option<BTreeMap<String, DriverLimits>>,
}

impl Out {
    fn new(input: &PolicyInput, degraded_devices: usize) -> Self {
        Self {
            next: PolicyState::default(),
            actions: Vec::new(),
            stats: Stats {
                degraded_devices,
                ..Stats::default()
            },
            // A dry run only reports, and an observe-only agent acts on nothing: neither sets
            // (nor clears) a driver limit.
            driver_limits: (!input.dry_run && !input.observe_only).then(BTreeMap::new),
        }
    }

    /// Carries `ws` into the next step, with the driver limits of its `quota`.
    fn keep(&mut self, step: &Step, key: &str, ws: WorkloadState, quota: Option<&ResolvedQuota>) {
        if let (Some(limits), Some(quota)) = (self.driver_limits.as_mut(), quota) {
            let wanted = limits::of_workload(quota, step.sampled_on.get(key), step.input.sample);
            limits.insert(key.to_string(), wanted);
        }
        self.next.workloads.insert(key.to_string(), ws);
    }
}

/// What one workload's actions share.
struct Cx<'a> {
    key: &'a str,
    cgroup_path: &'a str,
    /// Its processes (none for a workload without any).
    group: Option<&'a usage::Group<'a>>,
    input: &'a PolicyInput<'a>,
    released: bool,
    /// Its usage per GPU.
    dev_usage: &'a BTreeMap<u32, DevUsage>,
}

/// Usage of a workload without any.
static NO_USAGE: BTreeMap<u32, DevUsage> = BTreeMap::new();

impl<'a> Cx<'a> {
    fn new(step: &'a Step, key: &'a str, cgroup_path: &'a str) -> Self {
        Self {
            key,
            cgroup_path,
            group: step.workloads.groups.get(key),
            input: step.input,
            released: step.releases.contains(key),
            dev_usage: step.usage.get(key).unwrap_or(&NO_USAGE),
        }
    }

    /// Every process of the workload, in identity order: the targets of a step on all of it.
    fn all_targets(&self) -> Vec<ProcessIdentity> {
        self.group
            .map(|g| g.identities.iter().copied().collect())
            .unwrap_or_default()
    }

    fn act(
        &self,
        gpu: GpuScope,
        kind: ActionKind,
        targets: Vec<ProcessIdentity>,
        usage: Option<u64>,
        limit: Option<u64>,
        reason: String,
    ) -> Action {
        Action {
            workload: self.key.to_string(),
            cgroup_path: self.cgroup_path.to_string(),
            gpu,
            kind,
            targets,
            usage,
            limit,
            reason,
            dry_run: self.input.dry(self.key),
            attempt: 1,
            footprint: BTreeMap::new(),
        }
    }
}
