//! The suspend and resume executors: the job manager above the checkpoint worker of
//! [`super::checkpoint`]. A suspension is recorded (ledger and mark) before its worker starts; one job
//! runs per workload; the event loop collects finished jobs ([`Enforcer::poll_jobs`]), and a
//! suspend that could not start or failed is reported to the policy at the next observation, so
//! the step falls through.

use std::{collections::BTreeMap, time::Duration};

use log::{info, warn};

use super::{
    Enforcer, Outcome, Target,
    checkpoint::{self, Cause, JobResult},
    freeze,
    ledger::{FreezeRecord, SuspendRecord},
    marks::{self, Mark},
    ours::unix_now,
};
use crate::{
    policy::{GpuScope, GroupState, Suspension},
    quota::ByteSize,
};

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
        /// GPU memory restored, bytes.
        bytes: u64,
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

/// A recorded suspension the driver no longer holds: its processes run again (restored by
/// someone else) or are gone.
pub(super) struct Lapsed;

impl Enforcer {
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
    ) -> (Outcome, Option<(Cause, String)>) {
        let refuse = |e: &mut Self, cause: Cause, why: String| {
            warn!(
                "suspend of {workload} falls through ({}): {why}",
                cause.as_str()
            );
            e.suspend_failures
                .insert(workload.to_string(), (cause, why.clone()));
            (Outcome::Refused, Some((cause, why)))
        };
        if let Err(e) = self.check_target(rel) {
            return refuse(self, Cause::Error, format!("{e:#}"));
        }
        if self.jobs.contains_key(workload) {
            return (Outcome::Pending, None);
        }
        let cuda = match &self.cuda {
            Ok(c) => c.clone(),
            Err(why) => {
                let why = why.clone();
                return refuse(self, Cause::Unavailable, why);
            }
        };
        let pid_hint = targets.first().map(|t| t.identity.pid);
        let (dir, freezer) = match self.freezer_for(workload, rel, pid_hint) {
            Ok(x) => x,
            Err(e) => return refuse(self, Cause::Error, format!("{e:#}")),
        };
        let bytes: u64 = per_gpu.values().sum();
        if let Err(why) = checkpoint::check_host_memory(&self.v2_dir(rel), pid_hint, bytes) {
            return refuse(self, Cause::HostMemory, why);
        }
        if self.dry(workload) {
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
        let now_unix = unix_now();
        let sr = SuspendRecord {
            processes: targets.iter().map(|t| t.identity).collect(),
            per_gpu: per_gpu.clone(),
            since_unix: now_unix,
        };
        let mut rec = self
            .record(&dir)
            .unwrap_or_else(|| Self::new_record(workload, &dir, freezer, scope, reason, now_unix));
        rec.suspended = Some(sr);
        let Some(ledger) = self.ledger.as_mut() else {
            return refuse(
                self,
                Cause::Error,
                "there is no usable freeze ledger to record it in".into(),
            );
        };
        if let Err(e) = ledger.record(rec.clone()) {
            return refuse(
                self,
                Cause::Error,
                format!("the suspension could not be recorded first ({e:#})"),
            );
        }
        crate::crash::point("suspend-recorded");
        let _ = marks::set(&dir, &Mark::of(&rec, &self.state_dir));
        crate::crash::point("suspend-marked");
        info!(
            "suspending {workload} ({}): {} of GPU memory to host memory: {reason}",
            dir.display(),
            ByteSize(bytes).approx()
        );
        let job = checkpoint::start_suspend(
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
        if self.dry(workload) {
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
        // Write-ahead: a process restored is checkpointed again before any kill
        // (cuda-checkpoint #53); one whose restore fails stays checkpointed, which costs nothing.
        if let Some(ledger) = self.ledger.as_mut()
            && let Err(e) = ledger.remember_restored(sr.processes.iter().copied())
        {
            warn!("cannot resume {workload}: its processes could not be recorded first ({e:#})");
            return Outcome::Failed;
        }
        let targets = sr.processes.iter().copied().map(Target::from).collect();
        info!("resuming {workload} ({})", rec.cgroup_dir.display());
        let job = checkpoint::start_resume(
            cuda,
            rec.cgroup_dir.clone(),
            rec.freezer,
            targets,
            sr.per_gpu,
        );
        self.jobs.insert(workload.to_string(), job);
        Outcome::Pending
    }

    /// Collects the suspends and resumes whose workers finished.
    pub fn poll_jobs(&mut self) -> Vec<SuspendEnded> {
        let done: Vec<(String, JobResult)> = self
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
                JobResult::Suspended { took } => {
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
                JobResult::SuspendFailed {
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
                JobResult::Resumed { took } => {
                    crate::crash::point("resume-done");
                    if let Some(dir) = dir {
                        self.forget(&dir);
                    }
                    let bytes = job.per_gpu.values().sum();
                    ended.push(SuspendEnded::Resumed {
                        workload,
                        bytes,
                        took,
                    });
                }
                JobResult::ResumeFailed { reason } => {
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

    /// The suspension of a group of ours, as its job or the driver reports it: a suspend or resume
    /// in progress, a suspension the driver still holds, or none. [`Lapsed`] when the record says
    /// suspended and the driver holds none of its processes any more.
    pub(super) fn observe_suspension(
        &self,
        rec: &FreezeRecord,
    ) -> Result<Option<Suspension>, Lapsed> {
        if let Some(job) = self.jobs.get(&rec.workload) {
            return Ok(Some(Suspension::InProgress {
                resuming: job.resuming,
                per_gpu: job.per_gpu.clone(),
            }));
        }
        let Some(sr) = rec.suspended.as_ref() else {
            return Ok(None);
        };
        let pids = sr.live_pids();
        let held = match &self.cuda {
            Ok(cuda) => checkpoint::any_held(cuda, &pids),
            // Cannot ask the driver: trust the record while its processes live.
            Err(_) => !pids.is_empty(),
        };
        if held {
            Ok(Some(Suspension::Suspended {
                per_gpu: sr.per_gpu.clone(),
            }))
        } else {
            Err(Lapsed)
        }
    }

    /// The suspends that failed since the last observation, as the policy sees them, by workload.
    pub(super) fn take_suspend_failures(&mut self) -> Vec<(String, Suspension)> {
        std::mem::take(&mut self.suspend_failures)
            .into_iter()
            .map(|(key, (cause, reason))| {
                let failed = Suspension::Failed {
                    cause: cause.as_str().to_string(),
                    reason,
                };
                (key, failed)
            })
            .collect()
    }
}
