//! The agent proper: one synchronous step, [`Agent::tick`], that reads as observe, decide, act,
//! publish:
//!
//! - **observe**: sample NVML; drop tasks whose process exited (their pidfds); charge each sampled
//!   pid only to the process that held it when the sample was taken
//!   ([`crate::attribution::Attribution::verify_sampled`]); build the workloads at their root
//!   cgroups with names and the grants their containers carry
//!   ([`crate::observe::workloads`]); read what the kernel says about
//!   every group the agent froze or wants frozen ([`Enforcer::observe`]);
//! - **decide**: the pure policy ([`crate::policy::evaluate`]) over all of it: the actions, the
//!   next policy state and the driver limits wanted;
//! - **act**: the executors, which never wait (a freeze that has not settled is `pending` and is
//!   read again by [`Agent::settle`] or the next step); what they report back (done at once,
//!   refused at once) is folded into the policy state by [`crate::policy::fold_reports`] in the
//!   same step; the driver limits go to the driver
//!   ([`crate::enforce::driver_limits`]); the totals are counted
//!   ([`counters`]) and the durations measured ([`Timings`]);
//! - **publish**: an immutable snapshot for every reader ([`crate::snapshot::Publisher`]), the
//!   one door to them: totals and durations travel in it as typed fields, and nothing here
//!   names `metrics` (`cargo xtask structure`).
//!
//! One file a part of the step: `tick.rs` (the step and what it observes and decides), `act.rs`,
//! `publish.rs` (with the agent's health), `shutdown.rs`; this file holds the agent's parts and
//! the operator's requests (release). No file here is over 400 lines (`cargo xtask structure`).
//!
//! The async event loop ([`crate::run`]) only decides *when* to step.

mod act;
pub mod counters;
mod events;
mod faults;
mod publish;
mod shutdown;
mod tick;
mod verify;

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use log::info;

use self::counters::{External, Totals};
use crate::{
    attribution::{Change, tracker::Tracker},
    enforce::{
        Enforcer,
        driver_limits::{Behind, DriverLimiter},
    },
    grants::quota_store::QuotaStore,
    nvml::NvmlSampler,
    observe::workloads::Observer,
    policy::{self, AttributedProcess, ObservedGroup, PolicyState},
    sample::GpuSample,
    snapshot::{Publisher, SharedSnapshot, Timings},
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
    tracker: Tracker,
    sampler: NvmlSampler,
    quotas: QuotaStore,
    enforcer: Enforcer,
    policy: PolicyState,
    /// The policy's outcome carried across steps where nothing it reads changed.
    decider: policy::Incremental,
    opts: AgentOptions,
    started: Instant,
    workloads: Observer,
    /// What the step counted since the start, kept as the snapshot's counters.
    counters: Totals,
    /// How long things took, published with each snapshot.
    timings: Timings,
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
    /// Every grant proven held: what it keeps between steps.
    verifier: verify::Verifier,
    /// The driver's reports of faulted contexts, where the kernel log is read.
    kernel_log: Option<crate::observe::faults::KernelLog>,
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
    /// The driver's context faults reported since the last step.
    faults: Vec<crate::observe::faults::Fault>,
}

impl Agent {
    /// An agent over its parts.
    pub fn new(
        tracker: Tracker,
        sampler: NvmlSampler,
        quotas: QuotaStore,
        enforcer: Enforcer,
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
            verifier: verify::Verifier::new(v2_root.clone()),
            kernel_log: None,
            workloads: Observer::new(v2_root),
            counters: Totals::default(),
            timings: Timings::default(),
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

    /// The kernel programs' ring buffer, to wait on (none without eBPF).
    pub fn events_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.tracker.kernel().map(|k| k.events_fd())
    }

    /// Applies pending kernel events to attribution; returns what changed.
    pub fn poll_kernel(&mut self) -> Vec<Change> {
        self.tracker.poll()
    }

    /// The periodic safety net: reconciles attribution with the kernel's task map, and reads
    /// back the driver limits the agent set (one cleared behind its back is set again at the next
    /// step).
    pub fn reconcile(&mut self) -> crate::attribution::ReconcileReport {
        if let Some(limiter) = self.limiter.as_mut() {
            for b in limiter.read_back(&self.sampler) {
                self.counters.external(match b {
                    Behind::Cleared => External::DriverLimitCleared,
                    Behind::Changed => External::DriverLimitChanged,
                });
            }
        }
        self.tracker.reconcile()
    }

    /// How many events the last drain of the ring buffer read, and the boot time of the newest
    /// event that asked for a prompt step among them (for the drain pace).
    pub fn last_drained(&self) -> (usize, Option<u64>) {
        (
            self.tracker.last_drained(),
            self.tracker.last_drained_prompt_boot_ns(),
        )
    }

    /// The GPU task attribution tracks at `pid`.
    pub fn task(&self, pid: u32) -> Option<&crate::attribution::GpuTaskEntry> {
        self.tracker.table().get(pid)
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

    /// Reads the API server's grants from `watch` (DRA claims, pod annotations).
    pub fn use_kube(&mut self, watch: crate::kube::api::KubeWatch) {
        self.workloads.set_kube(watch);
    }

    /// Posts a Kubernetes Event on the pod for each isolation step and its end.
    pub fn use_events(&mut self, sender: crate::kube::events::EventSender) {
        self.events = Some(sender);
    }

    /// Sets driver-enforced limits (where the NVML library has them) from now on.
    pub fn use_driver_limits(&mut self, limiter: DriverLimiter) {
        self.limiter = Some(limiter);
    }

    /// Sets the CUDA checkpoint API for the `suspend` step (or why there is none).
    pub fn set_checkpointer(&mut self, cuda: Result<Arc<crate::cuda::Checkpointer>, String>) {
        self.enforcer.set_checkpointer(cuda);
    }
}

/// How long after an allocation event the re-sample runs (coalesces bursts).
pub const RESAMPLE_DEBOUNCE: Duration = Duration::from_millis(10);
