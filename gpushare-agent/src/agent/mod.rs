//! The agent proper: one synchronous step, [`Agent::tick`], that reads as observe, decide, act,
//! publish:
//!
//! - **observe**: sample NVML; drop tasks whose process exited (their pidfds); charge each sampled
//!   pid only to the process that held it when the sample was taken
//!   ([`crate::attribution::Attribution::verify_sampled`]); build the workloads at their root
//!   cgroups with names and environment quotas ([`workloads`]); read what the kernel says about
//!   every group the agent froze or wants frozen ([`Enforcer::observe`]);
//! - **decide**: the pure policy ([`crate::policy::evaluate`]) over all of it: the actions, the
//!   next policy state and the driver limits wanted;
//! - **act**: the executors, which never wait (a freeze that has not settled is `pending` and is
//!   read again by [`Agent::settle`] or the next step); what they report back (done at once,
//!   refused at once) is folded into the policy state by [`crate::policy::fold_reports`] in the
//!   same step; the driver limits go to the driver ([`driver_limits`]); the totals are counted
//!   ([`counters`]);
//! - **publish**: an immutable snapshot for every reader ([`crate::snapshot::Publisher`]).
//!
//! The async event loop ([`crate::run`]) only decides *when* to step.

pub mod counters;
pub mod driver_limits;
pub mod env_quotas;
mod events;
pub mod identity;
pub mod quota_store;
pub mod workloads;

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use log::{debug, info, warn};

use self::{
    counters::Counters, driver_limits::DriverLimiter, quota_store::QuotaStore, workloads::Workloads,
};
use crate::{
    attribution::{Change, Verified, tracker::Tracker},
    ebpf::boot_time_ns,
    enforce::{Enforcer, Outcome as ExecOutcome, SuspendEnded, Target, To},
    metrics::{Metrics, SharedSnapshot},
    nvml::{DriverStatus, NvmlSampler},
    policy::{
        self, Action, ActionKind, AttributedProcess, Decision, ObservedGroup, PolicyState, Report,
    },
    quota::{GpuInfo, Signal},
    sample::{GpuSample, Utilization},
    snapshot::{self, Health, Publisher, StepReport},
};

/// Options that change what the agent does (not where it reads from).
#[derive(Clone, Debug, Default)]
pub struct AgentOptions {
    /// Decide and report, touch nothing.
    pub dry_run: bool,
    /// On SIGTERM, leave frozen workloads frozen (the ledger keeps them for the next start).
    pub keep_frozen_on_exit: bool,
    /// On SIGTERM, how long restores of suspended workloads may take in all.
    pub shutdown_restore_budget: Duration,
}

/// The checkpoint speed assumed before this run has measured one, bytes per second: restores
/// take "seconds per GPU" for large models (criu#2547); 1 GiB/s is a cautious figure.
pub const ASSUMED_RESTORE_RATE: f64 = (1u64 << 30) as f64;

/// The agent's state between steps.
pub struct Agent {
    /// Attribution.
    pub tracker: Tracker,
    sampler: NvmlSampler,
    quotas: QuotaStore,
    enforcer: Enforcer,
    policy: PolicyState,
    /// The policy's outcome carried across steps where nothing it reads changed.
    decider: policy::Incremental,
    opts: AgentOptions,
    started: Instant,
    workloads: Workloads,
    counters: Counters,
    metrics: Arc<Metrics>,
    snapshot: SharedSnapshot,
    publisher: Publisher,
    pending_releases: Vec<String>,
    ready: bool,
    limiter: Option<DriverLimiter>,
    /// The driver limits wanted at the last step and the decision's per-workload limits they
    /// were made from: the same while the decision is carried (see [`Agent::wanted_limits`]).
    wanted: Option<(Arc<policy::PerWorkloadLimits>, Arc<policy::WantedLimits>)>,
    /// Whether this step's decision was carried from the last one (nothing it reads changed).
    carried: bool,
    /// The slowest suspend or resume of this run, bytes per second.
    slowest_rate: Option<f64>,
    /// Kubernetes Events on pods, when `[kubernetes] events` is on.
    events: Option<crate::kube::events::EventSender>,
}

/// What one step saw, for the decision and the report.
struct Observation {
    /// When the observation that asked for this step happened (an allocation event), for the
    /// latency metric; the start of the step otherwise.
    trigger: Instant,
    sample: GpuSample,
    processes: Vec<AttributedProcess>,
    groups: BTreeMap<String, ObservedGroup>,
    releases: Vec<String>,
}

impl Agent {
    /// An agent over its parts.
    pub fn new(
        tracker: Tracker,
        sampler: NvmlSampler,
        quotas: QuotaStore,
        enforcer: Enforcer,
        metrics: Arc<Metrics>,
        snapshot: SharedSnapshot,
        opts: AgentOptions,
    ) -> Self {
        // The hierarchy attribution resolves groups in: found once, by its filesystem type.
        let v2_root = tracker.table().resolver().root().to_path_buf();
        let mut agent = Self {
            tracker,
            sampler,
            quotas,
            enforcer,
            policy: PolicyState::default(),
            decider: policy::Incremental::default(),
            opts,
            started: Instant::now(),
            workloads: Workloads::new(v2_root),
            counters: Counters::default(),
            metrics,
            snapshot,
            publisher: Publisher::default(),
            pending_releases: Vec::new(),
            ready: false,
            limiter: None,
            wanted: None,
            carried: false,
            slowest_rate: None,
            events: None,
        };
        agent.take_over_earlier_keys();
        agent.track_suspended_processes();
        agent
    }

    /// The processes of the suspensions recorded by an earlier run are the agent's GPU tasks again
    /// (see [`Tracker::track_processes`]): a suspension that still applies is kept, not resumed
    /// as a workload that vanished and suspended again.
    fn track_suspended_processes(&mut self) {
        let ids: Vec<_> = self
            .enforcer
            .records()
            .into_iter()
            .filter_map(|r| r.suspended)
            .flat_map(|s| s.processes)
            .collect();
        let n = self.tracker.track_processes(&ids);
        if n > 0 {
            info!("tracking {n} suspended process(es) recorded by an earlier run");
        }
    }

    /// Freezes and suspensions an earlier version recorded under keys that changed (a unit by
    /// its name, a container nested in a unit: now the unit, by its path) are taken over under
    /// the key their group has now, so they are adopted, not thawed as workloads that vanished.
    fn take_over_earlier_keys(&mut self) {
        let (workloads, quotas) = (&self.workloads, self.quotas.current());
        let n = self.enforcer.rekey(|rec, path| {
            let k = rec.workload.as_str();
            (!k.starts_with("cgroup://") && k != "host")
                .then(|| workloads.key_of_group(path, quotas))
        });
        if n > 0 {
            info!("took over {n} freeze(s) recorded under an earlier version's workload keys");
        }
    }

    /// The quota store.
    pub fn quotas_mut(&mut self) -> &mut QuotaStore {
        &mut self.quotas
    }

    /// The policy state.
    pub fn policy(&self) -> &PolicyState {
        &self.policy
    }

    /// Whether any of `changes` asks for a prompt re-sample (a new GPU task or an allocation).
    pub fn wants_resample(changes: &[Change]) -> bool {
        changes
            .iter()
            .any(|c| matches!(c, Change::AllocHint(_) | Change::Added(_)))
    }

    /// Queues an operator's release of `name` (a key, a short name, or a unique key prefix) for
    /// the next step. Answers which workload it resolved to. Workloads known only from the
    /// agent's freezes (an earlier run's, on a GPU whose data is missing) can be released too.
    pub fn release(&mut self, name: &str) -> Result<String, String> {
        let mut known: Vec<String> = self.policy.workloads.keys().cloned().collect();
        for r in self.enforcer.records() {
            if !known.contains(&r.workload) {
                known.push(r.workload);
            }
        }
        known.sort();
        let matches: Vec<&String> = known
            .iter()
            .filter(|k| {
                *k == name
                    || k.split_once("://").is_some_and(|(_, id)| {
                        id == name || (name.len() >= 6 && id.starts_with(name))
                    })
            })
            .collect();
        match matches.as_slice() {
            [one] => {
                self.pending_releases.push((*one).clone());
                let frozen = self
                    .policy
                    .workloads
                    .get(*one)
                    .is_some_and(|w| w.frozen.is_some() || w.ours)
                    || self.enforcer.records().iter().any(|r| &r.workload == *one);
                Ok(format!(
                    "released {one}{}; its ladder starts again from the grace period",
                    if frozen { " (thawing it)" } else { "" }
                ))
            }
            [] => Err(format!(
                "no workload under a quota matches {name:?}; known: {}",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )),
            many => Err(format!(
                "{name:?} matches several workloads: {}",
                many.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

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
                    self.metrics.suspend_duration.observe(took.as_secs_f64());
                    self.counters.suspended_bytes += bytes;
                    self.measured(*bytes, *took);
                    (ActionKind::Suspend, ExecOutcome::Ok)
                }
                SuspendEnded::Resumed { bytes, took, .. } => {
                    self.metrics.resume_duration.observe(took.as_secs_f64());
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
                    self.metrics
                        .enforcement_latency
                        .observe(s.latency.as_secs_f64());
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
        self.metrics
            .sample_duration
            .observe(t0.elapsed().as_secs_f64());
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
        let gpus: Vec<GpuInfo> = sample
            .devices
            .iter()
            .map(|d| GpuInfo {
                index: d.index,
                uuid: d.uuid.clone(),
                memory_total: d.memory_total,
                minor: d.minor,
            })
            .collect();
        let processes =
            self.workloads
                .attribute(self.tracker.table().tasks(), self.quotas.current(), &gpus);
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
    fn wanted_limits(
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

    /// Executes the decision's actions, folds what the executors reported back into the policy
    /// state (in this very step, [`policy::fold_reports`]), counts, and hands the driver limits
    /// the policy wants to the driver. Returns how many actions it executed.
    fn act(&mut self, decision: Decision, obs: &Observation) -> usize {
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
                self.metrics
                    .enforcement_latency
                    .observe(obs.trigger.elapsed().as_secs_f64());
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
                if sig == Signal::KILL {
                    self.enforcer.kill(&a.workload, &a.cgroup_path, &targets)
                } else {
                    summarize(
                        &self
                            .enforcer
                            .signal(&a.workload, &targets, sig.number, To::Every),
                    )
                }
            }
        }
    }

    /// Reads the API server's grants from `watch` (DRA claims, pod annotations).
    pub fn use_kube(&mut self, watch: crate::kube::api::KubeWatch) {
        self.workloads.set_kube(watch);
    }

    /// Posts a Kubernetes Event on the pod for each isolation step and its end.
    pub fn use_events(&mut self, sender: crate::kube::events::EventSender) {
        self.events = Some(sender);
    }

    /// The API server's and the Event poster's counters, when they run.
    fn kube_counters(&self) -> BTreeMap<String, u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut out = BTreeMap::new();
        if let Some(w) = self.workloads.kube_watch() {
            let s = w.stats();
            out.insert("api_reads".into(), s.reads_total.load(Relaxed));
            out.insert("api_errors".into(), s.errors_total.load(Relaxed));
            out.insert(
                "annotation_edits_ignored".into(),
                s.annotation_edits_total.load(Relaxed),
            );
        }
        if let Some(e) = &self.events {
            let s = e.stats();
            out.insert("events_created".into(), s.created_total.load(Relaxed));
            out.insert("events_patched".into(), s.patched_total.load(Relaxed));
            out.insert("events_skipped".into(), s.skipped_total.load(Relaxed));
            out.insert("events_dropped".into(), s.dropped_total.load(Relaxed));
            out.insert("events_errors".into(), s.errors_total.load(Relaxed));
        }
        out
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

    /// Sets driver-enforced limits (where the NVML library has them) from now on.
    pub fn use_driver_limits(&mut self, limiter: DriverLimiter) {
        self.limiter = Some(limiter);
    }

    /// Sets the CUDA checkpoint API for the `suspend` step (or why there is none).
    pub fn set_checkpointer(&mut self, cuda: Result<Arc<crate::cuda::Checkpointer>, String>) {
        self.enforcer.set_checkpointer(cuda);
    }

    /// Keeps the slowest checkpoint speed seen (for the shutdown restore budget).
    fn measured(&mut self, bytes: u64, took: Duration) {
        if bytes > 0 && !took.is_zero() {
            let rate = bytes as f64 / took.as_secs_f64();
            self.slowest_rate = Some(self.slowest_rate.map_or(rate, |r| r.min(rate)));
        }
    }

    /// On SIGTERM: thaws what the agent froze, unless told to keep it; a suspended workload is
    /// restored only where its GPUs have room for it now and its restore fits in what is left of
    /// the shutdown restore budget (estimated at the slowest checkpoint speed of this run), else
    /// left suspended and recorded for the next agent.
    pub fn shutdown(&mut self) {
        let t0 = Instant::now();
        self.enforcer.wait_jobs();
        if self.opts.keep_frozen_on_exit {
            let n = self.enforcer.records().len();
            if n > 0 {
                info!(
                    "leaving {n} workload(s) frozen (--keep-frozen-on-exit); the next start reconciles them"
                );
            }
            return;
        }
        let sample = self.sampler.sample();
        // An elastic borrower the policy holds suspended comes back only with the reserve to
        // spare, as the policy's own resume would.
        let reserve = self.quotas.current().defaults().elastic_reserve;
        let keep: BTreeMap<String, u64> = self
            .policy
            .workloads
            .iter()
            .filter(|(_, ws)| {
                ws.suspended.is_some()
                    && ws
                        .scopes
                        .values()
                        .any(|s| s.mode == crate::quota::Mode::Elastic)
            })
            .map(|(k, _)| (k.clone(), reserve))
            .collect();
        let budget = self.opts.shutdown_restore_budget;
        let rate = self.slowest_rate.unwrap_or(ASSUMED_RESTORE_RATE);
        let done = self.enforcer.thaw_all(&mut |rec| {
            let Some(sr) = rec.suspended.as_ref() else {
                return Ok(());
            };
            let pids = sr.live_pids();
            let reserve = keep.get(&rec.workload).copied().unwrap_or(0);
            policy::resume_room_keeping(
                &sr.per_gpu,
                &sample,
                |gpu| policy::listed_for(&sample, &pids, gpu),
                reserve,
            )
            .map_err(|why| format!("no room to restore it: {why}"))?;
            let bytes: u64 = sr.per_gpu.values().sum();
            let estimate = Duration::from_secs_f64(bytes as f64 / rate);
            let left = budget.saturating_sub(t0.elapsed());
            if estimate > left {
                return Err(format!(
                    "its restore (about {estimate:.1?}) does not fit in the {left:.1?} left of the \
                     shutdown restore budget (--shutdown-restore-budget {budget:?})"
                ));
            }
            Ok(())
        });
        info!(
            "on shutdown: {} thawed, {} resumed, {} left suspended, {} failed",
            done.thawed.len(),
            done.resumed.len(),
            done.left_suspended.len(),
            done.failed.len()
        );
        for (w, dir, why) in &done.failed {
            warn!("on shutdown: {w} ({}): {why}", dir.display());
        }
        if let Some(l) = self.limiter.as_mut().filter(|_| !self.opts.dry_run) {
            l.clear_all(&self.sampler);
        }
    }

    fn health(&self, sample: &GpuSample) -> Health {
        let mut degraded = Vec::new();
        if let crate::attribution::tracker::Mode::Procfs { reason } = self.tracker.mode() {
            degraded.push(format!(
                "eBPF unavailable, attributing through /proc: {reason}"
            ));
        }
        if let DriverStatus::NoDriver { reason } = self.sampler.status() {
            degraded.push(format!("no NVIDIA driver: {reason}"));
        }
        for p in &sample.problems {
            degraded.push(format!("NVML: {p}"));
        }
        for (i, h) in &sample.health {
            if let crate::sample::DeviceHealth::Degraded { reason } = h {
                degraded.push(format!("GPU {i}: {reason}"));
            }
        }
        for (key, said) in self.workloads.env_quotas().unit_mismatches() {
            degraded.push(format!("{key}: {said}"));
        }
        for (key, said) in self.workloads.env_quotas().disagreements() {
            degraded.push(format!("{key}: {said}"));
        }
        if let Some(k) = self.workloads.kubelet() {
            degraded.extend(k.status.degraded());
            for pod in &k.ambiguous {
                degraded.push(format!(
                    "kubelet pod-resources: pod {pod} has two live pod UIDs: neither gets its grant"
                ));
            }
        }
        if self.quotas.observe_only() {
            degraded.push(
                "observe only: the quota configuration was invalid at start and no last good \
                 configuration is kept; alerts and metrics, no signal, freeze or kill, until a \
                 valid configuration loads"
                    .to_string(),
            );
        }
        if let Some(kept) = self.quotas.kept_in_force() {
            degraded.push(format!(
                "the quota files were invalid at start: the last good configuration kept in {} is \
                 in force",
                kept.display()
            ));
        }
        if !self.quotas.valid() {
            degraded.push(format!(
                "quota configuration invalid: {}",
                self.quotas.errors().join("; ")
            ));
        }
        degraded.extend(self.enforcer.problems().iter().cloned());
        Health {
            ready: self.ready,
            attribution: match self.tracker.mode() {
                crate::attribution::tracker::Mode::Ebpf => "ebpf".into(),
                crate::attribution::tracker::Mode::Procfs { .. } => "procfs".into(),
            },
            nvml: match self.sampler.status() {
                DriverStatus::Ready { .. } => "ready".into(),
                DriverStatus::NoDriver { .. } => "no_driver".into(),
            },
            degraded,
            dry_run: self.opts.dry_run,
            observe_only: self.quotas.observe_only(),
            suspend: match self.enforcer.suspend_unavailable() {
                None => "available".to_string(),
                Some(why) => format!("unavailable: {why}"),
            },
        }
    }

    fn publish(&mut self, obs: &Observation) {
        self.ready = true;
        let kc = self.tracker.kernel_counters();
        let stats = self.tracker.table().stats();
        let mut counters = snapshot::Counters {
            ebpf_events: stats
                .events
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            ebpf_events_lost: kc.events_lost,
            nvml_errors: self
                .sampler
                .errors()
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            quota_config_valid: self.quotas.valid(),
            quota_config_last_reload_unix: self.quotas.last_reload_unix(),
            identity: [
                ("exited", stats.exited_dropped),
                ("stale_identity", stats.stale_identity),
                ("unverifiable", stats.unverifiable_samples),
                ("rejected", stats.identity_rejected),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            attribution_work: self
                .tracker
                .work()
                .pairs()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            env_quota_errors: self.workloads.env_quotas().problems_total(),
            env_quota_disagreements: self
                .workloads
                .env_quotas()
                .disagreements_total()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            env_quota_unit_mismatch: self
                .workloads
                .env_quotas()
                .unit_mismatches()
                .into_iter()
                .collect(),
            kubernetes: self.kube_counters(),
            ..snapshot::Counters::default()
        };
        self.counters.render(&mut counters);
        let snap = self.publisher.build(StepReport {
            sample: &obs.sample,
            table: self.tracker.table(),
            processes: &obs.processes,
            policy: &self.policy,
            names: self.workloads.names(),
            quota_trust: self.workloads.quota_trust(),
            identity: self.workloads.identity_notes(),
            health: self.health(&obs.sample),
            counters,
            quotas: (self.quotas.current(), self.quotas.generation()),
            now: self.started.elapsed(),
            backends: obs
                .sample
                .devices
                .iter()
                .map(|d| {
                    (
                        d.index,
                        self.limiter.as_ref().map_or("soft", |l| l.backend(d.index)),
                    )
                })
                .collect(),
            driver_limits: self
                .limiter
                .as_ref()
                .map(DriverLimiter::in_force)
                .unwrap_or_default(),
        });
        if let Ok(mut w) = self.snapshot.write() {
            *w = Arc::new(snap);
        }
    }
}

fn summarize(r: &[(crate::attribution::ProcessIdentity, ExecOutcome)]) -> ExecOutcome {
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

/// How long after an allocation event the re-sample runs (coalesces bursts).
pub const RESAMPLE_DEBOUNCE: Duration = Duration::from_millis(10);
