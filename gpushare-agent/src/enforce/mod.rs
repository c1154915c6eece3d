//! Enforcement: executors for the policy's actions, and the observation of what they did. Matching
//! and deciding happen in [`crate::policy`]; this module only acts, reports what the kernel made of
//! it, and in dry-run mode only reports.
//!
//! Executors never wait: a freeze is requested and read back once (`done` if the kernel already
//! reports the group frozen, `pending` otherwise); [`Enforcer::settle`] reads pending groups again
//! when the event loop asks, and every step starts with [`Enforcer::observe`], which reports the
//! kernel's view of every group the agent froze (and of the ones it wants frozen) to the policy.
//!
//! Safety rules applied here, whatever the policy says:
//! - signals go through the pidfd the attribution holds for the process since it was verified, or
//!   through a fresh pidfd whose start time is checked after it was opened ([`signal`]);
//! - a freeze is written to the [`ledger`] and marked on the group ([`marks`]) before it is
//!   applied; the agent only thaws groups it froze itself (same inode), so a `docker pause` or an
//!   operator's freeze is never undone by it;
//! - the root group and any group containing the agent itself are never frozen or killed;
//! - a dry run writes nothing: no cgroup file, no ledger, no mark;
//! - one agent per state directory ([`lock`]).

pub mod freeze;
pub mod ledger;
pub mod lock;
pub mod marks;
pub mod signal;
pub mod suspend;

use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use log::{info, warn};

use self::{
    freeze::Freezer,
    ledger::{FreezeLedger, FreezeRecord, SuspendRecord},
    lock::{LockError, StateLock},
    marks::Mark,
    signal::{SignalOutcome, catches, send_if_caught, send_verified},
};
use crate::{
    attribution::{Pidfd, ProcessIdentity, cgroupfs, parse_cgroup_path, procinfo},
    cuda::Checkpointer,
    policy::{GpuScope, GroupState, ObservedGroup, Suspension, Transition},
    quota::ByteSize,
};

/// How long a pending freeze or thaw is watched by [`Enforcer::settle`] before it is left to the
/// steps (which keep observing it and retry with backoff).
const SETTLE_WATCH: Duration = Duration::from_secs(30);

/// The result of one executed action, for logs and the `{action, result}` metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done: the kernel reports it.
    Ok,
    /// Requested; the kernel does not report it yet (the step keeps observing).
    Pending,
    /// Dry run: reported, not done.
    DryRun,
    /// Nothing to do (already in that state, or the processes are gone).
    Noop,
    /// Refused by a safety rule (protected group, unverified process, unwritable ledger).
    Refused,
    /// Tried and failed.
    Failed,
    /// A signal step skipped the process: it does not catch the signal, which would end it.
    NotCaught,
}

impl Outcome {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Pending => "pending",
            Self::DryRun => "dry_run",
            Self::Noop => "noop",
            Self::Refused => "refused",
            Self::Failed => "failed",
            Self::NotCaught => "not_caught",
        }
    }
}

/// A freeze or thaw the kernel had not applied when it was requested.
#[derive(Clone, Debug)]
struct Pending {
    workload: String,
    transition: Transition,
    since: Instant,
    trigger: Instant,
    freezer: Freezer,
}

/// A pending freeze or thaw the kernel has now applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// Workload key.
    pub workload: String,
    /// What settled.
    pub transition: Transition,
    /// From the observation that asked for it to now.
    pub latency: Duration,
}

/// A suspend or resume that ended, for metrics and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuspendEnded {
    /// Suspended: `bytes` moved off the GPU in `took`.
    Suspended {
        /// Workload key.
        workload: String,
        /// GPU memory moved, bytes.
        bytes: u64,
        /// How long it took.
        took: Duration,
    },
    /// Resumed in `took`.
    Resumed {
        /// Workload key.
        workload: String,
        /// How long it took.
        took: Duration,
    },
    /// A suspend fell through (counted by cause in the step's policy stats).
    Failed {
        /// Workload key.
        workload: String,
    },
    /// A resume failed (retried by the steps).
    ResumeFailed {
        /// Workload key.
        workload: String,
    },
}

/// A process to signal, with the pidfd attribution holds for it (if any).
#[derive(Clone, Debug)]
pub struct Target {
    /// Its verified identity.
    pub identity: ProcessIdentity,
    /// A pidfd held since the identity was verified.
    pub pidfd: Option<Pidfd>,
}

impl From<ProcessIdentity> for Target {
    /// A target without a held pidfd: its start time is checked through a fresh one.
    fn from(identity: ProcessIdentity) -> Self {
        Self {
            identity,
            pidfd: None,
        }
    }
}

/// Executes freezes, thaws, signals and kills, and observes groups.
pub struct Enforcer {
    v2_root: PathBuf,
    v1_freezer_root: Option<PathBuf>,
    state_dir: PathBuf,
    ledger: Option<FreezeLedger>,
    problems: Vec<String>,
    dry_run: bool,
    agent_cgroup: Option<String>,
    marks_ok: bool,
    pending: BTreeMap<PathBuf, Pending>,
    _lock: Option<StateLock>,
    cuda: Result<Arc<Checkpointer>, String>,
    jobs: BTreeMap<String, suspend::Job>,
    /// Suspends that failed since the last observation: (cause, reason) by workload.
    suspend_failures: BTreeMap<String, (suspend::Cause, String)>,
}

impl Enforcer {
    /// An enforcer over the v2 hierarchy at `v2_root`, recording freezes in `state_dir`. Fails only
    /// when another agent holds the state directory. A ledger that cannot be used (unwritable
    /// directory) does not stop the agent: freezes are then refused (and reported), thaws still work.
    pub fn new(v2_root: PathBuf, state_dir: &Path, dry_run: bool) -> Result<Self, LockError> {
        let mut problems = Vec::new();
        let lock = match StateLock::acquire(state_dir) {
            Ok(l) => Some(l),
            Err(e @ LockError::Held { .. }) => return Err(e),
            Err(e) => {
                problems.push(format!("{e}; freezes are refused"));
                None
            }
        };
        let ledger = match FreezeLedger::open(state_dir) {
            Ok((l, warnings)) => {
                for w in warnings {
                    warn!("{w}");
                }
                Some(l)
            }
            Err(e) => {
                problems.push(format!(
                    "the freeze ledger cannot be used ({e:#}); freezes are refused until the \
                     state directory is writable"
                ));
                None
            }
        };
        for p in &problems {
            warn!("{p}");
        }
        let agent_cgroup = cgroupfs::cgroup_path_of_pid(std::process::id()).ok();
        let mut e = Self {
            v2_root,
            v1_freezer_root: freeze::v1_freezer_root(),
            state_dir: state_dir.to_path_buf(),
            ledger,
            problems,
            dry_run,
            agent_cgroup,
            marks_ok: true,
            pending: BTreeMap::new(),
            _lock: lock,
            cuda: Err("no CUDA driver loaded (--cuda-lib)".into()),
            jobs: BTreeMap::new(),
            suspend_failures: BTreeMap::new(),
        };
        e.adopt_marks();
        Ok(e)
    }

    /// The CUDA checkpoint API the `suspend` step uses, or why there is none.
    pub fn set_checkpointer(&mut self, cuda: Result<Arc<Checkpointer>, String>) {
        self.cuda = cuda;
    }

    /// Why `suspend` is unavailable, if it is.
    pub fn suspend_unavailable(&self) -> Option<&str> {
        self.cuda.as_ref().err().map(String::as_str)
    }

    /// Whether actions are only reported.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Reasons the enforcer runs degraded (for `/healthz` and `status`).
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// Every recorded freeze (empty without a ledger).
    pub fn records(&self) -> Vec<FreezeRecord> {
        self.ledger
            .as_ref()
            .map(|l| l.records().cloned().collect())
            .unwrap_or_default()
    }

    /// The record of a group, if the agent froze it.
    pub fn record(&self, dir: &Path) -> Option<FreezeRecord> {
        self.ledger.as_ref().and_then(|l| l.get(dir).cloned())
    }

    /// The ledger file, when there is a ledger.
    pub fn ledger_path(&self) -> Option<&Path> {
        self.ledger.as_ref().map(|l| l.path())
    }

    /// The v2 directory of a group given by its path relative to the root.
    pub fn v2_dir(&self, rel: &str) -> PathBuf {
        self.v2_root.join(rel.trim_start_matches('/'))
    }

    fn hierarchies(&self) -> Vec<PathBuf> {
        let mut roots = vec![self.v2_root.clone()];
        roots.extend(self.v1_freezer_root.clone());
        roots
    }

    /// Groups marked by this agent's state directory that the ledger does not list (it was lost
    /// or unreadable) are added to it. In a dry run only the in-memory list grows.
    fn adopt_marks(&mut self) {
        let found: Vec<FreezeRecord> = marks::scan(&self.hierarchies(), &self.state_dir)
            .into_iter()
            .map(|(dir, m)| m.record(&dir))
            .collect();
        let Some(ledger) = self.ledger.as_mut() else {
            return;
        };
        if self.dry_run {
            ledger.set_read_only();
        }
        match ledger.merge(found) {
            Ok(0) => {}
            Ok(n) => info!(
                "found {n} freeze(s) of an earlier run from the marks on their cgroups (not in {})",
                ledger.path().display()
            ),
            Err(e) => warn!("could not add freezes found from marks to the ledger: {e:#}"),
        }
    }

    /// Refuses groups that must never be frozen or killed: the root, and the agent's own group
    /// or any of its ancestors.
    fn check_target(&self, rel: &str) -> Result<()> {
        let rel = format!("/{}", rel.trim_matches('/'));
        if rel == "/" {
            bail!("refusing to act on the root cgroup");
        }
        if let Some(own) = &self.agent_cgroup
            && (own == &rel || own.starts_with(&format!("{rel}/")))
        {
            bail!("refusing to act on {rel}: it contains the agent itself ({own})");
        }
        Ok(())
    }

    /// What the kernel says about every group the agent froze (its ledger), and about the root
    /// groups of `wanted` (workload key, root path) that it wants frozen but has no record of.
    /// Records of groups that are gone or were recreated (another inode) are dropped here, and
    /// reported as such once.
    pub fn observe<'a>(
        &mut self,
        wanted: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> BTreeMap<String, ObservedGroup> {
        let mut out: BTreeMap<String, ObservedGroup> = BTreeMap::new();
        let mut forget = Vec::new();
        let mut unsuspend = Vec::new();
        for rec in self.records() {
            let rel = self.rel_of(&rec.cgroup_dir);
            let frozen_by = rec.scope.as_deref().and_then(GpuScope::from_label);
            let inode = std::fs::metadata(&rec.cgroup_dir).map(|m| m.ino());
            let (state, ours) = match inode {
                Err(_) => (GroupState::Gone, false),
                Ok(ino) if rec.inode.is_some_and(|r| r != ino) => (GroupState::Replaced, false),
                Ok(_) => match freeze::state(&rec.cgroup_dir, rec.freezer) {
                    Ok(s) => (s, true),
                    Err(_) => (GroupState::Gone, false),
                },
            };
            if !ours {
                info!(
                    "{}: the group the agent froze ({}) is {}; forgetting it",
                    rec.workload,
                    rec.cgroup_dir.display(),
                    if state == GroupState::Gone {
                        "gone"
                    } else {
                        "another group now (recreated under the same path)"
                    }
                );
                forget.push(rec.cgroup_dir.clone());
            }
            let suspension = if !ours {
                None
            } else if let Some(job) = self.jobs.get(&rec.workload) {
                Some(Suspension::InProgress {
                    resuming: job.resuming,
                    per_gpu: job.per_gpu.clone(),
                })
            } else {
                rec.suspended.as_ref().and_then(|sr| {
                    let pids: Vec<u32> = sr
                        .processes
                        .iter()
                        .filter(|id| procinfo::is_same_process(**id))
                        .map(|id| id.pid)
                        .collect();
                    let held = match &self.cuda {
                        Ok(cuda) => suspend::any_held(cuda, &pids),
                        // Cannot ask the driver: trust the record while its processes live.
                        Err(_) => !pids.is_empty(),
                    };
                    if held {
                        Some(Suspension::Suspended {
                            per_gpu: sr.per_gpu.clone(),
                        })
                    } else {
                        unsuspend.push(rec.cgroup_dir.clone());
                        None
                    }
                })
            };
            let o = ObservedGroup {
                ours,
                state,
                frozen_by,
                cgroup_path: rel,
                suspension,
            };
            // One workload, one root: a record of ours wins over a stale one.
            match out.get(&rec.workload) {
                Some(existing) if existing.ours && !o.ours => {}
                _ => {
                    out.insert(rec.workload.clone(), o);
                }
            }
        }
        for dir in forget {
            self.forget(&dir);
        }
        for dir in unsuspend {
            // Its processes run again (restored by someone else) or are gone.
            info!(
                "{}: the suspended processes are no longer held by the driver; forgetting the suspension",
                dir.display()
            );
            self.set_suspended(&dir, None);
        }
        // Suspends that failed since the last step: the policy lets the step fall through.
        for (key, (cause, reason)) in std::mem::take(&mut self.suspend_failures) {
            let failed = Suspension::Failed {
                cause: cause.as_str().to_string(),
                reason,
            };
            match out.get_mut(&key) {
                Some(o) => o.suspension = Some(failed),
                None => {
                    let rel = wanted_rel(&key);
                    out.insert(
                        key,
                        ObservedGroup {
                            ours: false,
                            state: GroupState::Thawed,
                            frozen_by: None,
                            cgroup_path: rel,
                            suspension: Some(failed),
                        },
                    );
                }
            }
        }
        for (key, rel) in wanted {
            if out.contains_key(key) {
                continue;
            }
            let dir = self.v2_dir(rel);
            let state = match freeze::v2_state(&dir) {
                Ok(s) => s,
                Err(_) => continue,
            };
            out.insert(
                key.to_string(),
                ObservedGroup {
                    ours: false,
                    state,
                    frozen_by: None,
                    cgroup_path: rel.to_string(),
                    suspension: None,
                },
            );
        }
        out
    }

    /// Sets (or clears) the suspension of the record of `dir`, on disk and on its mark.
    fn set_suspended(&mut self, dir: &Path, suspended: Option<SuspendRecord>) {
        let Some(mut rec) = self.record(dir) else {
            return;
        };
        rec.suspended = suspended;
        if self.dry_run {
            return;
        }
        let mark = Mark::of(&rec, &self.state_dir);
        if let Some(l) = self.ledger.as_mut()
            && let Err(e) = l.record(rec)
        {
            warn!("{e:#}");
        }
        let _ = marks::set(dir, &mark);
    }

    /// Starts the suspend of `workload` (root group `rel`): see [`suspend`]. Never waits: the
    /// result is `pending` while a worker runs; a suspend that cannot start (no checkpoint API,
    /// not enough host memory) is `refused`, and its cause is observed at the next step (and
    /// returned, for the step that issued it).
    #[allow(clippy::too_many_arguments)]
    pub fn suspend(
        &mut self,
        workload: &str,
        rel: &str,
        scope: GpuScope,
        targets: &[Target],
        per_gpu: &BTreeMap<u32, u64>,
        reason: &str,
    ) -> (Outcome, Option<(suspend::Cause, String)>) {
        let refuse = |e: &mut Self, cause: suspend::Cause, why: String| {
            warn!(
                "suspend of {workload} falls through ({}): {why}",
                cause.as_str()
            );
            e.suspend_failures
                .insert(workload.to_string(), (cause, why.clone()));
            (Outcome::Refused, Some((cause, why)))
        };
        if let Err(e) = self.check_target(rel) {
            return refuse(self, suspend::Cause::Error, format!("{e:#}"));
        }
        if self.jobs.contains_key(workload) {
            return (Outcome::Pending, None);
        }
        let cuda = match &self.cuda {
            Ok(c) => c.clone(),
            Err(why) => {
                let why = why.clone();
                return refuse(self, suspend::Cause::Unavailable, why);
            }
        };
        let pid_hint = targets.first().map(|t| t.identity.pid);
        let (dir, freezer) = match self.freezer_for(workload, rel, pid_hint) {
            Ok(x) => x,
            Err(e) => return refuse(self, suspend::Cause::Error, format!("{e:#}")),
        };
        let bytes: u64 = per_gpu.values().sum();
        if let Err(why) = suspend::check_host_memory(&self.v2_dir(rel), pid_hint, bytes) {
            return refuse(self, suspend::Cause::HostMemory, why);
        }
        if self.dry_run {
            info!(
                "dry run: would suspend {workload} ({}, {} of GPU memory to host memory): {reason}",
                dir.display(),
                ByteSize(bytes).approx()
            );
            return (Outcome::DryRun, None);
        }
        let ours = self.ours(&dir);
        let was_frozen = ours
            && matches!(
                freeze::state(&dir, freezer),
                Ok(GroupState::Frozen | GroupState::Freezing)
            );
        if !ours && self.frozen_by_someone_else(&dir, freezer, pid_hint) {
            info!("{workload} is frozen by someone else; not suspending it");
            return (Outcome::Noop, None);
        }
        // Write-ahead: the suspension (and the freeze it ends with) is recorded before it starts.
        let now_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let sr = SuspendRecord {
            processes: targets.iter().map(|t| t.identity).collect(),
            per_gpu: per_gpu.clone(),
            since_unix: now_unix,
        };
        let mut rec = self.record(&dir).unwrap_or(FreezeRecord {
            workload: workload.to_string(),
            cgroup_dir: dir.clone(),
            freezer,
            frozen_at_unix: now_unix,
            reason: reason.to_string(),
            inode: std::fs::metadata(&dir).map(|m| m.ino()).ok(),
            scope: Some(scope.label()),
            suspended: None,
            extra: Default::default(),
        });
        rec.suspended = Some(sr);
        let Some(ledger) = self.ledger.as_mut() else {
            return refuse(
                self,
                suspend::Cause::Error,
                "there is no usable freeze ledger to record it in".into(),
            );
        };
        if let Err(e) = ledger.record(rec.clone()) {
            return refuse(
                self,
                suspend::Cause::Error,
                format!("the suspension could not be recorded first ({e:#})"),
            );
        }
        let _ = marks::set(&dir, &Mark::of(&rec, &self.state_dir));
        info!(
            "suspending {workload} ({}): {} of GPU memory to host memory: {reason}",
            dir.display(),
            ByteSize(bytes).approx()
        );
        let job = suspend::start_suspend(
            cuda,
            dir,
            freezer,
            was_frozen,
            targets.to_vec(),
            per_gpu.clone(),
        );
        self.jobs.insert(workload.to_string(), job);
        (Outcome::Pending, None)
    }

    /// Starts the resume of `workload` (thaw, restore, unlock). Never waits.
    pub fn resume(&mut self, workload: &str) -> Outcome {
        if self.jobs.contains_key(workload) {
            return Outcome::Pending;
        }
        let Some(rec) = self
            .records()
            .into_iter()
            .find(|r| r.workload == workload && r.suspended.is_some())
        else {
            return Outcome::Noop;
        };
        if self.dry_run {
            info!("dry run: would resume {workload}");
            return Outcome::DryRun;
        }
        let cuda = match &self.cuda {
            Ok(c) => c.clone(),
            Err(why) => {
                warn!("cannot resume {workload}: {why}");
                return Outcome::Failed;
            }
        };
        let sr = rec.suspended.clone().unwrap_or_else(|| SuspendRecord {
            processes: Vec::new(),
            per_gpu: BTreeMap::new(),
            since_unix: 0,
        });
        let pids = sr
            .processes
            .iter()
            .filter(|id| procinfo::is_same_process(**id))
            .map(|id| id.pid)
            .collect();
        info!("resuming {workload} ({})", rec.cgroup_dir.display());
        let job =
            suspend::start_resume(cuda, rec.cgroup_dir.clone(), rec.freezer, pids, sr.per_gpu);
        self.jobs.insert(workload.to_string(), job);
        Outcome::Pending
    }

    /// Collects the suspends and resumes whose workers finished.
    pub fn poll_jobs(&mut self) -> Vec<SuspendEnded> {
        let done: Vec<(String, suspend::JobResult)> = self
            .jobs
            .iter()
            .filter_map(|(k, j)| j.poll().map(|r| (k.clone(), r)))
            .collect();
        let mut ended = Vec::new();
        for (workload, result) in done {
            let Some(job) = self.jobs.remove(&workload) else {
                continue;
            };
            let dir = self
                .records()
                .into_iter()
                .find(|r| r.workload == workload)
                .map(|r| r.cgroup_dir);
            match result {
                suspend::JobResult::Suspended { took } => {
                    let bytes = job.per_gpu.values().sum();
                    info!(
                        "suspended {workload}: {} of GPU memory moved to host memory in {took:?}",
                        ByteSize(bytes).approx()
                    );
                    ended.push(SuspendEnded::Suspended {
                        workload,
                        bytes,
                        took,
                    });
                }
                suspend::JobResult::SuspendFailed {
                    cause,
                    reason,
                    refrozen,
                } => {
                    warn!(
                        "suspend of {workload} failed ({}): {reason}; undone, the step falls through",
                        cause.as_str()
                    );
                    if let Some(dir) = dir {
                        if refrozen {
                            self.set_suspended(&dir, None);
                        } else {
                            self.forget(&dir);
                        }
                    }
                    self.suspend_failures
                        .insert(workload.clone(), (cause, reason));
                    ended.push(SuspendEnded::Failed { workload });
                }
                suspend::JobResult::Resumed { took } => {
                    if let Some(dir) = dir {
                        self.forget(&dir);
                    }
                    ended.push(SuspendEnded::Resumed { workload, took });
                }
                suspend::JobResult::ResumeFailed { reason } => {
                    warn!("resume of {workload} failed: {reason}; it stays suspended");
                    ended.push(SuspendEnded::ResumeFailed { workload });
                }
            }
        }
        ended
    }

    /// Waits for running suspend and resume workers (shutdown): their results are applied to the
    /// ledger, so what follows sees the final state.
    pub fn wait_jobs(&mut self) {
        while !self.jobs.is_empty() {
            self.poll_jobs();
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether a suspend or resume worker runs.
    pub fn has_jobs(&self) -> bool {
        !self.jobs.is_empty()
    }

    fn rel_of(&self, dir: &Path) -> String {
        let rel = dir
            .strip_prefix(&self.v2_root)
            .ok()
            .or_else(|| {
                self.v1_freezer_root
                    .as_ref()
                    .and_then(|r| dir.strip_prefix(r).ok())
            })
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        format!("/{}", rel.trim_start_matches('/'))
    }

    fn forget(&mut self, dir: &Path) {
        self.pending.remove(dir);
        if self.dry_run {
            return;
        }
        let _ = marks::clear(dir);
        if let Some(l) = self.ledger.as_mut()
            && let Err(e) = l.remove(dir)
        {
            warn!("{e:#}");
        }
    }

    /// Freezes the root group at `rel` (v2 path) of `workload`. `pid_hint` (a process of the
    /// workload) finds its v1 freezer group where the group has no v2 freezer. Never waits.
    pub fn freeze(
        &mut self,
        workload: &str,
        rel: &str,
        scope: GpuScope,
        pid_hint: Option<u32>,
        reason: &str,
        trigger: Instant,
    ) -> Outcome {
        if let Err(e) = self.check_target(rel) {
            warn!("freeze of {workload}: {e:#}");
            return Outcome::Refused;
        }
        let (dir, freezer) = match self.freezer_for(workload, rel, pid_hint) {
            Ok(x) => x,
            Err(e) => {
                warn!("freeze of {workload}: {e:#}");
                return Outcome::Failed;
            }
        };
        if self.dry_run {
            info!(
                "dry run: would freeze {workload} ({}): {reason}",
                dir.display()
            );
            return Outcome::DryRun;
        }
        let ours = self.ours(&dir);
        if !ours && self.frozen_by_someone_else(&dir, freezer, pid_hint) {
            // docker pause, an operator: not ours to record or thaw. (A v2 freeze of a group a
            // v1 freezer holds would never complete either.)
            info!("{workload} is already frozen by someone else; leaving it to them");
            return Outcome::Noop;
        }
        if ours && matches!(freeze::state(&dir, freezer), Ok(GroupState::Frozen)) {
            return Outcome::Noop;
        }
        let inode = std::fs::metadata(&dir).map(|m| m.ino()).ok();
        if !ours {
            let rec = FreezeRecord {
                workload: workload.to_string(),
                cgroup_dir: dir.clone(),
                freezer,
                frozen_at_unix: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
                reason: reason.to_string(),
                inode,
                scope: Some(scope.label()),
                suspended: None,
                extra: Default::default(),
            };
            let Some(ledger) = self.ledger.as_mut() else {
                warn!("not freezing {workload}: there is no usable freeze ledger to record it in");
                return Outcome::Refused;
            };
            if let Err(e) = ledger.record(rec.clone()) {
                warn!("not freezing {workload}: the freeze could not be recorded first ({e:#})");
                return Outcome::Refused;
            }
            if let Err(e) = marks::set(&dir, &Mark::of(&rec, &self.state_dir))
                && self.marks_ok
            {
                self.marks_ok = false;
                warn!(
                    "cannot mark {} ({e}); the ledger alone lists the agent's freezes",
                    dir.display()
                );
            }
            #[cfg(debug_assertions)]
            test_pause("GPUSHARE_TEST_PAUSE_BEFORE_FREEZE");
        }
        if let Err(e) = freeze::request(&dir, freezer, true) {
            warn!("freezing {workload} failed: {e:#}");
            if !ours {
                self.forget(&dir);
            }
            return Outcome::Failed;
        }
        match freeze::state(&dir, freezer) {
            Ok(GroupState::Frozen) => {
                self.pending.remove(&dir);
                info!("froze {workload} ({}): {reason}", dir.display());
                Outcome::Ok
            }
            _ => {
                info!(
                    "asked the kernel to freeze {workload} ({}); not frozen yet: {reason}",
                    dir.display()
                );
                self.pending.entry(dir).or_insert(Pending {
                    workload: workload.to_string(),
                    transition: Transition::Freeze,
                    since: Instant::now(),
                    trigger,
                    freezer,
                });
                Outcome::Pending
            }
        }
    }

    fn ours(&self, dir: &Path) -> bool {
        let Some(rec) = self.ledger.as_ref().and_then(|l| l.get(dir)) else {
            return false;
        };
        match (rec.inode, std::fs::metadata(dir).map(|m| m.ino())) {
            (Some(want), Ok(have)) => want == have,
            (None, Ok(_)) => true,
            (_, Err(_)) => false,
        }
    }

    fn frozen_by_someone_else(&self, dir: &Path, freezer: Freezer, pid_hint: Option<u32>) -> bool {
        let own = !matches!(freeze::state(dir, freezer), Ok(GroupState::Thawed) | Err(_));
        own || (freezer == Freezer::V2
            && pid_hint
                .and_then(|pid| self.v1_freezer_dir_of(pid).ok())
                .is_some_and(|d| {
                    matches!(
                        freeze::v1_group_state(&d),
                        Ok(GroupState::Frozen | GroupState::Freezing)
                    )
                }))
    }

    /// Thaws the group the agent froze for `workload` (and only such a group). Never waits.
    pub fn thaw(&mut self, workload: &str, trigger: Instant) -> Outcome {
        let recs: Vec<FreezeRecord> = self
            .records()
            .into_iter()
            .filter(|r| r.workload == workload)
            .collect();
        if recs.is_empty() {
            return Outcome::Noop;
        }
        if self.dry_run {
            info!("dry run: would thaw {workload}");
            return Outcome::DryRun;
        }
        let mut outcome = Outcome::Noop;
        for rec in recs {
            let o = self.thaw_record(&rec, trigger);
            if matches!(o, Outcome::Failed | Outcome::Pending) || outcome == Outcome::Noop {
                outcome = o;
            }
        }
        outcome
    }

    fn thaw_record(&mut self, rec: &FreezeRecord, trigger: Instant) -> Outcome {
        let dir = &rec.cgroup_dir;
        if !self.ours(dir) {
            // Gone, or recreated: nothing of ours to thaw there.
            self.forget(dir);
            return Outcome::Ok;
        }
        if let Some(sr) = &rec.suspended {
            // A suspended workload thawed without a restore would stay blocked in CUDA calls:
            // resume it here (this thread waits; used on shutdown, `thaw --all`, and for a
            // workload whose processes are gone).
            let pids: Vec<u32> = sr
                .processes
                .iter()
                .filter(|id| procinfo::is_same_process(**id))
                .map(|id| id.pid)
                .collect();
            match &self.cuda {
                Ok(cuda) if !pids.is_empty() => {
                    if let suspend::JobResult::ResumeFailed { reason } =
                        suspend::resume_now(cuda, dir, rec.freezer, &pids)
                    {
                        warn!("resuming {} failed: {reason}", rec.workload);
                        return Outcome::Failed;
                    }
                }
                Err(why) if !pids.is_empty() => warn!(
                    "{}: its checkpointed processes cannot be restored ({why}); thawing only: \
                     they stay blocked in CUDA calls until restored",
                    rec.workload
                ),
                _ => {}
            }
        }
        if let Err(e) = freeze::request(dir, rec.freezer, false) {
            warn!("thawing {} failed: {e:#}", rec.workload);
            return Outcome::Failed;
        }
        match freeze::state(dir, rec.freezer) {
            Ok(GroupState::Thawed) => {
                info!("thawed {} ({})", rec.workload, dir.display());
                self.forget(dir);
                Outcome::Ok
            }
            Ok(s) => {
                warn!(
                    "asked the kernel to thaw {} ({}); it still says {s:?}",
                    rec.workload,
                    dir.display()
                );
                self.pending.insert(
                    dir.clone(),
                    Pending {
                        workload: rec.workload.clone(),
                        transition: Transition::Thaw,
                        since: Instant::now(),
                        trigger,
                        freezer: rec.freezer,
                    },
                );
                Outcome::Pending
            }
            Err(_) => {
                self.forget(dir);
                Outcome::Ok
            }
        }
    }

    /// Whether a freeze or thaw is waiting to settle, or a suspend or resume runs.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty() || !self.jobs.is_empty()
    }

    /// Reads the groups whose freeze or thaw was pending; returns those the kernel now reports
    /// done. Stops watching a group after [`SETTLE_WATCH`] (the steps keep observing it).
    pub fn settle(&mut self) -> Vec<Settled> {
        let mut done = Vec::new();
        let mut forget = Vec::new();
        self.pending.retain(|dir, p| {
            let want = match p.transition {
                Transition::Freeze => GroupState::Frozen,
                _ => GroupState::Thawed,
            };
            match freeze::state(dir, p.freezer) {
                Ok(s) if s == want => {
                    done.push(Settled {
                        workload: p.workload.clone(),
                        transition: p.transition,
                        latency: p.trigger.elapsed(),
                    });
                    if p.transition == Transition::Thaw {
                        forget.push(dir.clone());
                    }
                    false
                }
                Ok(_) => p.since.elapsed() < SETTLE_WATCH,
                Err(_) => false,
            }
        });
        for dir in forget {
            self.forget(&dir);
        }
        for s in &done {
            info!(
                "{} {} (settled {:?} after it was decided)",
                match s.transition {
                    Transition::Freeze => "froze",
                    _ => "thawed",
                },
                s.workload,
                s.latency
            );
        }
        done
    }

    /// Thaws everything the ledger lists (on SIGTERM). Returns how many were thawed.
    pub fn thaw_all(&mut self) -> usize {
        if self.dry_run {
            return 0;
        }
        let mut n = 0;
        for rec in self.records() {
            match self.thaw_record(&rec, Instant::now()) {
                Outcome::Ok => {
                    n += 1;
                    info!("thawed {} on shutdown", rec.workload);
                }
                o => warn!("thawing {} on shutdown: {}", rec.workload, o.as_str()),
            }
        }
        n
    }

    /// Sends `sig` to each target. Returns the outcome per process.
    pub fn signal(
        &self,
        workload: &str,
        targets: &[Target],
        sig: i32,
    ) -> Vec<(ProcessIdentity, Outcome)> {
        self.signal_targets(workload, targets, sig, false)
    }

    /// A ladder's `signal` step: sends `sig` only to the processes that catch it; the others are
    /// skipped ([`Outcome::NotCaught`]), since the signal would end them and only a `kill` step may.
    pub fn signal_step(
        &self,
        workload: &str,
        targets: &[Target],
        sig: i32,
    ) -> Vec<(ProcessIdentity, Outcome)> {
        self.signal_targets(workload, targets, sig, true)
    }

    fn signal_targets(
        &self,
        workload: &str,
        targets: &[Target],
        sig: i32,
        only_if_caught: bool,
    ) -> Vec<(ProcessIdentity, Outcome)> {
        targets
            .iter()
            .map(|t| {
                let id = t.identity;
                if self.dry_run {
                    info!(
                        "dry run: would send signal {sig} to {} of {workload}",
                        id.pid
                    );
                    return (id, Outcome::DryRun);
                }
                let sent = match &t.pidfd {
                    Some(fd) => {
                        // /proc/<pid> read before the pidfd is found alive is about its process.
                        let caught = if only_if_caught {
                            catches(id.pid, sig)
                        } else {
                            Ok(true)
                        };
                        match (fd.has_exited(), caught) {
                            (true, _) => Ok(SignalOutcome::Gone),
                            (false, Ok(false)) => Ok(SignalOutcome::NotCaught),
                            (false, Err(e)) => Err(e),
                            (false, Ok(true)) => match fd.send_signal(sig) {
                                Ok(()) => Ok(SignalOutcome::Sent),
                                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                                    Ok(SignalOutcome::Gone)
                                }
                                Err(e) => {
                                    Err(anyhow::anyhow!("pidfd_send_signal({}): {e}", id.pid))
                                }
                            },
                        }
                    }
                    None if only_if_caught => send_if_caught(id, sig),
                    None => send_verified(id, sig),
                };
                let outcome = match sent {
                    Ok(SignalOutcome::Sent) => {
                        info!("sent signal {sig} to {} of {workload}", id.pid);
                        Outcome::Ok
                    }
                    Ok(SignalOutcome::Gone) => Outcome::Noop,
                    Ok(SignalOutcome::NotCaught) => {
                        let name = crate::quota::SIGNALS
                            .iter()
                            .find(|s| s.number == sig)
                            .map_or(sig.to_string(), |s| s.name.to_string());
                        info!(
                            "not signalling {} of {workload}: it does not catch {name}, which \
                             would end it (only a kill step ends a process)",
                            id.pid
                        );
                        Outcome::NotCaught
                    }
                    Ok(SignalOutcome::Reused) => {
                        warn!(
                            "not signalling pid {}: it now belongs to another process",
                            id.pid
                        );
                        Outcome::Refused
                    }
                    Err(e) => {
                        warn!("signal {sig} to {} failed: {e:#}", id.pid);
                        Outcome::Failed
                    }
                };
                (id, outcome)
            })
            .collect()
    }

    /// Kills a workload: `cgroup.kill` on its root v2 group where it exists (a frozen group is
    /// killed at once), else SIGKILL to each target.
    pub fn kill(&mut self, workload: &str, rel: &str, targets: &[Target]) -> Outcome {
        if let Err(e) = self.check_target(rel) {
            warn!("kill of {workload}: {e:#}");
            return Outcome::Refused;
        }
        if self.dry_run {
            info!("dry run: would kill {workload}");
            return Outcome::DryRun;
        }
        let dir = self.v2_dir(rel);
        if dir.join("cgroup.kill").exists() {
            return match freeze::v2_kill(&dir) {
                Ok(()) => {
                    info!("killed {workload} (cgroup.kill on {})", dir.display());
                    Outcome::Ok
                }
                Err(e) => {
                    warn!("kill of {workload} failed: {e:#}");
                    Outcome::Failed
                }
            };
        }
        let results = self.signal(workload, targets, libc::SIGKILL);
        // v1-frozen tasks only die once thawed.
        let recs: Vec<FreezeRecord> = self
            .records()
            .into_iter()
            .filter(|r| r.workload == workload && r.freezer == Freezer::V1)
            .collect();
        for rec in recs {
            self.thaw_record(&rec, Instant::now());
        }
        if results.iter().any(|(_, o)| *o == Outcome::Ok) {
            Outcome::Ok
        } else {
            Outcome::Noop
        }
    }

    /// The v1 freezer group of a process.
    fn v1_freezer_dir_of(&self, pid: u32) -> Result<PathBuf> {
        let root = self
            .v1_freezer_root
            .as_ref()
            .context("no v1 freezer mounted")?;
        let path = v1_freezer_path_of(pid)?;
        Ok(root.join(path.trim_start_matches('/')))
    }

    /// The group to freeze and its freezer: the v2 root group, else the workload's root in the v1
    /// freezer hierarchy (the root of the v1 path of one of its processes, which must name the
    /// same workload).
    fn freezer_for(
        &self,
        workload: &str,
        rel: &str,
        pid_hint: Option<u32>,
    ) -> Result<(PathBuf, Freezer)> {
        let v2 = self.v2_dir(rel);
        if v2.join("cgroup.freeze").exists() {
            return Ok((v2, Freezer::V2));
        }
        let root = self
            .v1_freezer_root
            .as_ref()
            .context("no cgroup v2 freezer for the group and no v1 freezer mounted")?;
        let pid = pid_hint.context("no process known to find the group's v1 freezer")?;
        let v1_path = v1_freezer_path_of(pid)?;
        let id = parse_cgroup_path(&v1_path);
        // The v1 group must be the workload's own: the same key for a container, pod or unit;
        // the workload's root or below it for a plain cgroup (whose root is then frozen).
        let group = if workload.starts_with("cgroup://") {
            let root_rel = format!("/{}", rel.trim_matches('/'));
            if v1_path != root_rel && !v1_path.starts_with(&format!("{root_rel}/")) {
                bail!("the v1 freezer group of pid {pid} ({v1_path}) is not under {root_rel}");
            }
            root_rel
        } else if id.key() == workload {
            id.cgroup_path
        } else {
            bail!("the v1 freezer group of pid {pid} ({v1_path}) is not {workload}'s");
        };
        self.check_target(&group)?;
        Ok((root.join(group.trim_start_matches('/')), Freezer::V1))
    }
}

/// The root path of a workload key, where it can be read off the key (`cgroup://<path>`); the
/// policy takes the path from its own state otherwise.
fn wanted_rel(key: &str) -> String {
    key.strip_prefix("cgroup://").unwrap_or("/").to_string()
}

/// A test-only pause point (debug builds): sleeps while the file named by `var` exists, so a test
/// can SIGKILL the agent between recording a freeze and applying it.
#[cfg(debug_assertions)]
fn test_pause(var: &str) {
    if let Some(path) = std::env::var_os(var) {
        let path = PathBuf::from(path);
        let deadline = Instant::now() + Duration::from_secs(30);
        while path.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The v1 freezer group of a process, as `/proc/<pid>/cgroup` spells it.
fn v1_freezer_path_of(pid: u32) -> Result<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    text.lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            ctrl.split(',')
                .any(|c| c == "freezer")
                .then(|| path.to_string())
        })
        .context("process has no v1 freezer group")
}

/// What `gpushare-agent thaw --all` did.
#[derive(Debug, Default)]
pub struct ThawAllReport {
    /// Groups thawed (workload, directory).
    pub thawed: Vec<(String, PathBuf)>,
    /// Records of groups that no longer exist (forgotten).
    pub gone: Vec<(String, PathBuf)>,
    /// Groups that could not be thawed, with why.
    pub failed: Vec<(String, PathBuf, String)>,
}

/// Undoes every freeze recorded in `state_dir`'s ledger or marked with it on the cgroups, without
/// a running agent. Takes the state directory's lock first (so it cannot race an agent) unless
/// `force`. Never touches a group it did not freeze (a recreated group has no mark and another
/// inode).
pub fn thaw_everything(
    state_dir: &Path,
    force: bool,
    cuda: Result<Arc<Checkpointer>, String>,
) -> Result<ThawAllReport> {
    let _lock = match StateLock::acquire(state_dir) {
        Ok(l) => Some(l),
        Err(e @ LockError::Held { .. }) if !force => {
            bail!("{e}; use `gpushare-agent release` with a running agent, or --force")
        }
        Err(e) => {
            warn!("{e}; going on without the lock (--force)");
            None
        }
    };
    let v2_root = cgroupfs::find_cgroup2_mount()?;
    let mut enforcer = Enforcer {
        v1_freezer_root: freeze::v1_freezer_root(),
        v2_root,
        state_dir: state_dir.to_path_buf(),
        ledger: None,
        problems: Vec::new(),
        dry_run: false,
        agent_cgroup: None,
        marks_ok: true,
        pending: BTreeMap::new(),
        _lock: None,
        cuda,
        jobs: BTreeMap::new(),
        suspend_failures: BTreeMap::new(),
    };
    let (ledger, warnings) = FreezeLedger::open(state_dir)?;
    for w in warnings {
        warn!("{w}");
    }
    enforcer.ledger = Some(ledger);
    enforcer.adopt_marks();
    let mut report = ThawAllReport::default();
    for rec in enforcer.records() {
        let entry = (rec.workload.clone(), rec.cgroup_dir.clone());
        if !enforcer.ours(&rec.cgroup_dir) {
            enforcer.forget(&rec.cgroup_dir);
            report.gone.push(entry);
            continue;
        }
        match enforcer.thaw_record(&rec, Instant::now()) {
            Outcome::Ok => report.thawed.push(entry),
            o => report.failed.push((
                entry.0,
                entry.1,
                format!(
                    "{}: the kernel still reports it {:?}",
                    o.as_str(),
                    freeze::state(&rec.cgroup_dir, rec.freezer).ok()
                ),
            )),
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A fake cgroup v2 tree of plain files: what the executors would write to shows up as a
    /// changed file.
    fn fake_tree(root: &Path, groups: &[&str]) {
        for g in groups {
            let dir = root.join(g);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.freeze"), "0\n").unwrap();
            std::fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
            std::fs::write(dir.join("cgroup.kill"), "").unwrap();
            std::fs::write(dir.join("cgroup.procs"), "").unwrap();
        }
    }

    /// Every file under `root` with its contents, and every directory's xattrs.
    fn contents(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for name in xattr::list(&dir).into_iter().flatten() {
                let v = xattr::get(&dir, &name).ok().flatten().unwrap_or_default();
                out.insert(dir.join(format!("xattr:{}", name.to_string_lossy())), v);
            }
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    out.insert(e.path(), std::fs::read(e.path()).unwrap());
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// A dry run writes to no cgroup file, sets no mark and records nothing, whatever it is
        /// asked to do.
        #[test]
        fn a_dry_run_writes_nothing(actions in proptest::collection::vec((0u8..5, 0usize..3), 1..20)) {
            let base = std::env::temp_dir().join(format!(
                "gpushare-dry-{}-{}",
                std::process::id(),
                rand_suffix()
            ));
            let root = base.join("v2");
            let groups = ["a", "b/c", "d"];
            fake_tree(&root, &groups);
            let before = contents(&root);
            let state = base.join("state");
            let mut e = Enforcer::new(root.clone(), &state, true).unwrap();
            let me = crate::attribution::procinfo::snapshot(std::process::id()).unwrap().identity;
            for (kind, g) in actions {
                let rel = format!("/{}", groups[g]);
                let key = format!("cgroup://{rel}");
                let o = match kind {
                    0 => e.freeze(&key, &rel, GpuScope::All, None, "t", Instant::now()),
                    1 => e.thaw(&key, Instant::now()),
                    2 => e.kill(&key, &rel, &[Target::from(me)]),
                    3 => e.signal(&key, &[Target::from(me)], libc::SIGUSR2)[0].1,
                    _ => {
                        e.observe([(key.as_str(), rel.as_str())]);
                        e.settle();
                        Outcome::Noop
                    }
                };
                prop_assert!(matches!(o, Outcome::DryRun | Outcome::Noop), "{kind}: {o:?}");
            }
            prop_assert_eq!(contents(&root), before);
            prop_assert!(!state.join(ledger::LEDGER_FILE).exists(), "a dry run wrote a ledger");
            drop(e);
            let _ = std::fs::remove_dir_all(&base);
        }
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }
}
