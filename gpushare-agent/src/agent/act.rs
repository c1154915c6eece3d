//! Act: the decision's actions handed to the executors, what they reported folded back into the
//! policy state in the same step, the driver limits handed to the driver.

use std::time::{Duration, Instant};

use log::{info, warn};

use super::{Agent, Observation, events};
use crate::{
    enforce::{Outcome as ExecOutcome, Target, To},
    policy::{self, Action, ActionKind, Decision, Report},
    quota::Signal,
};

impl Agent {
    /// Executes the decision's actions, folds what the executors reported back into the policy
    /// state (in this very step, [`policy::fold_reports`]), counts, and hands the driver limits
    /// the policy wants to the driver. Returns how many actions it executed.
    pub(super) fn act(&mut self, decision: Decision, obs: &Observation) -> usize {
        self.end_faulted(obs);
        let mut reports = Vec::new();
        for a in &decision.actions {
            let outcome = self.execute(a, obs.trigger, &mut reports);
            // Pending: requested, the kernel applies it (a freeze settles in a later poll).
            if matches!(
                outcome,
                ExecOutcome::Ok | ExecOutcome::Pending | ExecOutcome::DryRun
            ) {
                self.pod_event(a, obs);
            }
            if outcome == ExecOutcome::Ok && matches!(a.kind, ActionKind::Freeze | ActionKind::Thaw)
            {
                reports.push(Report::Done {
                    workload: a.workload.clone(),
                    kind: a.kind,
                });
            }
            if matches!(outcome, ExecOutcome::Ok | ExecOutcome::DryRun)
                && !matches!(a.kind, ActionKind::Thaw)
            {
                self.timings
                    .enforcement_latency
                    .observe(obs.trigger.elapsed());
            }
            self.counters.action(a.kind, outcome);
        }
        let n = decision.actions.len();
        crate::trace::acted(n);
        self.counters.step(&decision.stats, &reports);
        self.policy = policy::fold_reports(decision.state, &reports);
        if let (true, Some(per_workload)) = (self.limiter.is_some(), &decision.driver_limits) {
            let wanted = self.wanted_limits(per_workload);
            let removed = self.tracker.cgroups_removed();
            if let Some(limiter) = self.limiter.as_mut() {
                limiter.apply(&self.sampler, &obs.sample.devices, &wanted, removed);
            }
        }
        n
    }

    /// The action's targets with the pidfds attribution holds for them.
    fn targets(&self, a: &Action) -> Vec<Target> {
        let table = self.tracker.table();
        a.targets
            .iter()
            .map(|id| Target {
                identity: *id,
                pidfd: table
                    .get(id.pid)
                    .filter(|t| t.identity == *id)
                    .and_then(|t| t.pidfd.clone()),
            })
            .collect()
    }

    /// Executes one action; a suspend refused at once is reported in `reports`.
    fn execute(&mut self, a: &Action, trigger: Instant, reports: &mut Vec<Report>) -> ExecOutcome {
        match a.kind {
            ActionKind::Alert => {
                warn!("ALERT {}: {}", a.workload, a.reason);
                if a.dry_run {
                    ExecOutcome::DryRun
                } else {
                    ExecOutcome::Ok
                }
            }
            ActionKind::Signal(sig) => {
                info!("signalling {} with {}: {}", a.workload, sig.name, a.reason);
                let r =
                    self.enforcer
                        .signal(&a.workload, &self.targets(a), sig.number, To::Catching);
                summarize(&r)
            }
            ActionKind::Freeze => {
                let hint = a.targets.first().map(|t| t.pid);
                self.enforcer
                    .freeze(&a.workload, &a.cgroup_path, a.gpu, hint, &a.reason, trigger)
            }
            ActionKind::Thaw => {
                info!("thawing {}: {}", a.workload, a.reason);
                self.enforcer.thaw(&a.workload, trigger)
            }
            ActionKind::Suspend => {
                let targets = self.targets(a);
                let (outcome, failed) = self.enforcer.suspend(
                    &a.workload,
                    &a.cgroup_path,
                    a.gpu,
                    &targets,
                    &a.footprint,
                    &a.reason,
                );
                if let Some((cause, why)) = failed {
                    // Falls through in this very step.
                    reports.push(Report::SuspendRefused {
                        workload: a.workload.clone(),
                        cause: cause.as_str().to_string(),
                        reason: why,
                    });
                }
                outcome
            }
            ActionKind::Resume => {
                info!("resuming {}: {}", a.workload, a.reason);
                self.enforcer.resume(&a.workload)
            }
            ActionKind::Kill(sig) => {
                warn!("killing {} with {}: {}", a.workload, sig.name, a.reason);
                let targets = self.targets(a);
                // A fresh NVML read, for a restored process checkpointed again (#53).
                let sampler = &mut self.sampler;
                let mut sample = || sampler.sample();
                let outcome = if sig == Signal::KILL {
                    self.enforcer
                        .kill(&a.workload, &a.cgroup_path, &targets, &mut sample)
                } else {
                    let (w, rel) = (&a.workload, &a.cgroup_path);
                    summarize(&self.enforcer.end(w, rel, &targets, sig.number, &mut sample))
                };
                if self.enforcer.kill_refused(&a.workload) {
                    // Frozen instead, and held so by the kill step.
                    let workload = a.workload.clone();
                    reports.push(Report::KillRefused { workload });
                }
                outcome
            }
        }
    }

    /// Queues the Event of an executed action on its pod (never waits).
    fn pod_event(&self, a: &Action, obs: &Observation) {
        let Some(events) = &self.events else {
            return;
        };
        let meta = obs
            .processes
            .iter()
            .find(|p| p.key() == a.workload)
            .map(|p| &*p.workload);
        let view = self.workloads.kube_view();
        if let Some(e) = events::pod_event(a, meta, view.as_deref()) {
            events.send(e);
        }
    }

    /// Keeps the slowest checkpoint speed seen (for the shutdown restore budget).
    pub(super) fn measured(&mut self, bytes: u64, took: Duration) {
        if bytes > 0 && !took.is_zero() {
            let rate = bytes as f64 / took.as_secs_f64();
            self.slowest_rate = Some(self.slowest_rate.map_or(rate, |r| r.min(rate)));
        }
    }
}

pub(super) fn summarize(r: &[(crate::attribution::ProcessIdentity, ExecOutcome)]) -> ExecOutcome {
    if r.iter().any(|(_, o)| *o == ExecOutcome::Ok) {
        ExecOutcome::Ok
    } else if r.iter().any(|(_, o)| *o == ExecOutcome::DryRun) {
        ExecOutcome::DryRun
    } else if r.iter().any(|(_, o)| *o == ExecOutcome::NotCaught) {
        ExecOutcome::NotCaught
    } else if r.iter().any(|(_, o)| *o == ExecOutcome::Failed) {
        ExecOutcome::Failed
    } else if r.iter().any(|(_, o)| *o == ExecOutcome::Refused) {
        ExecOutcome::Refused
    } else {
        ExecOutcome::Noop
    }
}
