//! The step: [`Agent::tick`] reads as observe, decide, act, publish; [`Agent::settle`] steps
//! again when a pending freeze or a suspend job ended.

use std::{sync::Arc, time::Instant};

use log::{debug, info};

use super::{Agent, Observation};
use crate::{
    attribution::Verified,
    ebpf::boot_time_ns,
    enforce::{Outcome as ExecOutcome, SuspendEnded},
    policy::{self, ActionKind, Decision, Report},
    sample::Utilization,
};

impl Agent {
    /// One step: observe, decide, act, publish. `trigger` is when the observation that asked for
    /// it happened (an allocation event), for the latency metric; `None` for a periodic step.
    pub fn tick(&mut self, trigger: Option<Instant>) {
        let t0 = Instant::now();
        let obs = self.observe(trigger.unwrap_or(t0));
        let t1 = Instant::now();
        let decision = self.decide(&obs);
        crate::trace::decided();
        let t2 = Instant::now();
        let actions = self.act(decision, &obs);
        let t3 = Instant::now();
        self.publish(&obs);
        debug!(
            "step: observe {:?}, decide {:?}, act {:?} ({actions} action(s)), publish {:?}",
            t1 - t0,
            t2 - t1,
            t3 - t2,
            t3.elapsed()
        );
    }

    /// Reads pending freezes and thaws again; when one settled, steps (so the state is reported
    /// as the kernel now has it). Returns whether any settled.
    pub fn settle(&mut self) -> bool {
        let settled = self.enforcer.settle();
        let ended = self.enforcer.poll_jobs();
        for e in &ended {
            let (kind, result) = match e {
                SuspendEnded::Suspended { bytes, took, .. } => {
                    self.timings.suspend.observe(*took);
                    self.counters.suspended(*bytes);
                    self.measured(*bytes, *took);
                    (ActionKind::Suspend, ExecOutcome::Ok)
                }
                SuspendEnded::Resumed { bytes, took, .. } => {
                    self.timings.resume.observe(*took);
                    self.measured(*bytes, *took);
                    (ActionKind::Resume, ExecOutcome::Ok)
                }
                SuspendEnded::Failed { .. } => (ActionKind::Suspend, ExecOutcome::Failed),
                SuspendEnded::ResumeFailed { .. } => (ActionKind::Resume, ExecOutcome::Failed),
            };
            self.counters.action(kind, result);
        }
        let mut reports = Vec::with_capacity(settled.len());
        for s in &settled {
            let kind = match s.transition {
                ActionKind::Freeze => {
                    self.timings.enforcement_latency.observe(s.latency);
                    ActionKind::Freeze
                }
                _ => ActionKind::Thaw,
            };
            // It was counted `pending` when issued; now it is done.
            self.counters.action(kind, ExecOutcome::Ok);
            reports.push(Report::Done {
                workload: s.workload.clone(),
                kind: s.transition,
            });
        }
        self.policy = policy::fold_reports(std::mem::take(&mut self.policy), &reports);
        if settled.is_empty() && ended.is_empty() {
            return false;
        }
        self.tick(None);
        true
    }

    /// Whether a freeze or thaw waits to settle (the event loop then calls [`Self::settle`]).
    pub fn has_pending(&self) -> bool {
        self.enforcer.has_pending()
    }

    fn observe(&mut self, trigger: Instant) -> Observation {
        self.tracker.refresh_ioctl_counts();
        let started_boot_ns = boot_time_ns();
        let t0 = Instant::now();
        // A pid attribution holds a pidfd for is known to exist: no syscall to ask (its exit, if
        // it exited meanwhile, is seen by the identity check below).
        let table = self.tracker.table();
        let mut sample = self
            .sampler
            .sample_knowing(&|pid| table.get(pid).is_some_and(|t| t.pidfd.is_some()));
        self.timings.sample.observe(t0.elapsed());
        for pid in self.tracker.table_mut().drop_exited() {
            if let Some(k) = self.tracker.kernel_mut() {
                k.forget_gpu_task(pid);
            }
        }
        // Identity before memory: a record counts for a task only if that task held the pid when
        // the sample was taken.
        let mut keep = Vec::with_capacity(sample.processes.len());
        for mut p in std::mem::take(&mut sample.processes) {
            let known = self.tracker.table().get(p.pid).map(|t| t.identity);
            match self
                .tracker
                .table_mut()
                .verify_sampled(p.pid, started_boot_ns)
            {
                Verified::Charged => {}
                Verified::Unverifiable => {
                    p.used_bytes = None;
                    p.utilization = None;
                }
                Verified::Gone => continue,
            }
            // A utilization sample covers a window that began before this sample (at the previous
            // one): it is the process's only if it held the pid since then. No sample is idle,
            // whoever held the pid.
            if p.utilization.is_some_and(|u| u != Utilization::default())
                && !self
                    .tracker
                    .table()
                    .held_since(p.pid, sample.utilization_since(p.device_index))
            {
                p.utilization = None;
            }
            let table = self.tracker.table();
            if let Some(t) = table.get(p.pid)
                && known != Some(t.identity)
            {
                info!(
                    "GPU process {} ({}) reported by NVML on GPU {}: cgroup {}",
                    p.pid,
                    t.comm,
                    p.device_index,
                    t.cgroup_path.as_deref().unwrap_or("?")
                );
            }
            keep.push(p);
        }
        sample.processes = keep;
        let processes = self.workloads.observe(
            &mut sample,
            self.tracker.table().tasks(),
            self.quotas.current(),
        );
        for e in self.workloads.take_events() {
            self.counters.identity(e);
        }
        let wanted: Vec<(String, String)> = self
            .policy
            .workloads
            .iter()
            .filter(|(_, w)| w.frozen.is_some() || w.killing.is_some())
            .map(|(k, w)| (k.clone(), w.cgroup_path.clone()))
            .collect();
        let groups = self
            .enforcer
            .observe(wanted.iter().map(|(k, p)| (k.as_str(), p.as_str())));
        Observation {
            trigger,
            sample,
            processes,
            groups,
            releases: std::mem::take(&mut self.pending_releases),
            faults: self.take_faults(),
        }
    }

    fn decide(&mut self, obs: &Observation) -> Decision {
        let carried = self.decider.carried;
        let decision = self.decider.evaluate(
            std::mem::take(&mut self.policy),
            &policy::PolicyInput {
                now: self.started.elapsed(),
                sample: &obs.sample,
                processes: &obs.processes,
                quotas: self.quotas.current(),
                releases: &obs.releases,
                agent_pid: Some(std::process::id()),
                dry_run: self.opts.dry_run,
                observe_only: self.quotas.observe_only(),
                taken: &self.verifier.taken,
                observed: &obs.groups,
            },
        );
        self.carried = self.decider.carried != carried;
        decision
    }

    /// The driver limits `per_workload` (the decision's) wants at the workloads' root groups in
    /// the policy state: those of the last step when the decision was carried from it with the
    /// same per-workload limits (the state is then the last step's too: a carried step has no
    /// action, so no report changes it), built afresh otherwise.
    pub(super) fn wanted_limits(
        &mut self,
        per_workload: &Arc<policy::PerWorkloadLimits>,
    ) -> Arc<policy::WantedLimits> {
        let wanted = match &self.wanted {
            Some((from, wanted)) if self.carried && Arc::ptr_eq(from, per_workload) => {
                Arc::clone(wanted)
            }
            _ => Arc::new(policy::wanted_limits(per_workload, &self.policy)),
        };
        self.wanted = Some((Arc::clone(per_workload), Arc::clone(&wanted)));
        wanted
    }
}
