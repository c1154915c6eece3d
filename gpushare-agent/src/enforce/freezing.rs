//! The freeze and thaw executors, over the cgroup files of [`super::freeze`]. A freeze is recorded
//! in the ledger and marked on the group before it is requested; a group frozen by someone else
//! (`docker pause`, an operator, a v1 freezer) is left to them; a thaw undoes only a freeze of
//! ours, and never that of a suspended workload (a suspension is undone by a resume, which the
//! policy issues once the GPU has room, on a worker thread; or, with no agent to come, by
//! [`Enforcer::thaw_all`]'s restore where its judge allows). Neither waits: what the kernel has not applied
//! yet is pending, read again by [`Enforcer::settle`]. The root group and any group containing
//! the agent are never touched (`check_target`, also used by suspend and kill).

use std::{path::Path, time::Instant};

use anyhow::{Result, bail};
use log::{info, warn};

use super::{
    Enforcer, Outcome, checkpoint,
    freeze::{self, Freezer},
    ledger::FreezeRecord,
    marks::{self, Mark},
    ours::unix_now,
};
use crate::policy::{ActionKind, GpuScope, GroupState};

/// A freeze or thaw the kernel had not applied when it was requested.
#[derive(Clone, Debug)]
pub(super) struct Pending {
    pub(super) workload: String,
    pub(super) transition: ActionKind,
    pub(super) since: Instant,
    pub(super) trigger: Instant,
    pub(super) freezer: Freezer,
}

impl Enforcer {
    /// Refuses groups that must never be frozen or killed: the root, and the agent's own group
    /// or any of its ancestors.
    pub(super) fn check_target(&self, rel: &str) -> Result<()> {
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
        if self.dry(workload) {
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
        if !ours {
            let rec = Self::new_record(workload, &dir, freezer, scope, reason, unix_now());
            let Some(ledger) = self.ledger.as_mut() else {
                warn!("not freezing {workload}: there is no usable freeze ledger to record it in");
                return Outcome::Refused;
            };
            if let Err(e) = ledger.record(rec.clone()) {
                warn!("not freezing {workload}: the freeze could not be recorded first ({e:#})");
                return Outcome::Refused;
            }
            crate::crash::point("freeze-recorded");
            if let Err(e) = marks::set(&dir, &Mark::of(&rec, &self.state_dir))
                && self.marks_ok
            {
                self.marks_ok = false;
                warn!(
                    "cannot mark {} ({e}); the ledger alone lists the agent's freezes",
                    dir.display()
                );
            }
            crate::crash::point("freeze-marked");
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
        crate::crash::point("freeze-applied");
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
                    transition: ActionKind::Freeze,
                    since: Instant::now(),
                    trigger,
                    freezer,
                });
                Outcome::Pending
            }
        }
    }

    /// Whether a group that is not ours is frozen (or freezing) already: through its own freezer,
    /// or, for a v2 group, through the v1 freezer group of its process `pid_hint`.
    pub(super) fn frozen_by_someone_else(
        &self,
        dir: &Path,
        freezer: Freezer,
        pid_hint: Option<u32>,
    ) -> bool {
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
        let recs = self.records_of(workload);
        if recs.is_empty() {
            return Outcome::Noop;
        }
        if self.dry(workload) {
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

    /// Whether the record is of a suspension whose processes still live: undone only by a
    /// restore (a thaw alone would leave them blocked in CUDA calls, and forget them).
    pub(super) fn holds_suspension(rec: &FreezeRecord) -> bool {
        rec.suspended
            .as_ref()
            .is_some_and(|sr| !sr.live_pids().is_empty())
    }

    /// Thaws the group of one record, if it is still ours (else forgets the record). A suspended
    /// workload is not thawed here (`refused`): it is resumed, once there is room.
    pub(super) fn thaw_record(&mut self, rec: &FreezeRecord, trigger: Instant) -> Outcome {
        let dir = &rec.cgroup_dir;
        if !self.ours(dir) {
            // Gone, or recreated: nothing of ours to thaw there.
            self.forget(dir);
            return Outcome::Ok;
        }
        if Self::holds_suspension(rec) {
            warn!(
                "not thawing {}: it is suspended, and is resumed (restored, then thawed) once its \
                 GPU has room for it",
                rec.workload
            );
            return Outcome::Refused;
        }
        self.thaw_group(rec, trigger)
    }

    /// Thaws the group of one record of ours, whatever it holds (a kill: its processes die
    /// once thawed, checkpointed or not), and forgets it once the kernel shows it thawed.
    pub(super) fn thaw_group(&mut self, rec: &FreezeRecord, trigger: Instant) -> Outcome {
        let dir = &rec.cgroup_dir;
        if let Err(e) = freeze::request(dir, rec.freezer, false) {
            warn!("thawing {} failed: {e:#}", rec.workload);
            return Outcome::Failed;
        }
        crate::crash::point("thaw-applied");
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
                        transition: ActionKind::Thaw,
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

    /// Undoes everything the ledger lists, for good (SIGTERM, `thaw --all`): freezes are thawed;
    /// a suspension is restored on this thread (thaw, restore, unlock) only where `may_restore`
    /// says so (room on its GPUs, a budget), and otherwise left suspended, frozen and recorded,
    /// for the next agent or `thaw --all` to resume once there is room. A dry run undoes nothing.
    pub fn thaw_all(
        &mut self,
        may_restore: &mut dyn FnMut(&FreezeRecord) -> Result<(), String>,
    ) -> Unwound {
        let mut done = Unwound::default();
        for rec in self.records() {
            if self.dry(&rec.workload) {
                continue; // a dry run undoes nothing it did not take
            }
            let entry = (rec.workload.clone(), rec.cgroup_dir.clone());
            if !self.ours(&rec.cgroup_dir) {
                self.forget(&rec.cgroup_dir);
                done.gone.push(entry);
                continue;
            }
            if !Self::holds_suspension(&rec) {
                match self.thaw_record(&rec, Instant::now()) {
                    Outcome::Ok => done.thawed.push(entry),
                    o => done.failed.push((
                        entry.0,
                        entry.1,
                        format!(
                            "{}: the kernel still reports it {:?}",
                            o.as_str(),
                            freeze::state(&rec.cgroup_dir, rec.freezer).ok()
                        ),
                    )),
                }
                continue;
            }
            let cuda = match &self.cuda {
                Ok(c) => c.clone(),
                Err(why) => {
                    let why = format!("its processes cannot be restored without the driver: {why}");
                    done.left_suspended.push((entry.0, entry.1, why));
                    continue;
                }
            };
            if let Err(why) = may_restore(&rec) {
                done.left_suspended.push((entry.0, entry.1, why));
                continue;
            }
            let targets: Vec<super::Target> = rec
                .suspended
                .iter()
                .flat_map(|s| s.processes.iter().copied().map(super::Target::from))
                .collect();
            // Recorded before the restore: a later kill checkpoints them again (#53).
            if let Some(ledger) = self.ledger.as_mut()
                && let Err(e) = ledger.remember_restored(targets.iter().map(|t| t.identity))
            {
                let why = format!("its processes could not be recorded as restored first ({e:#})");
                done.left_suspended.push((entry.0, entry.1, why));
                continue;
            }
            match checkpoint::resume_now(&cuda, &rec.cgroup_dir, rec.freezer, &targets) {
                checkpoint::JobResult::ResumeFailed { reason } => {
                    done.failed
                        .push((entry.0, entry.1, format!("resume failed: {reason}")));
                }
                _ => {
                    self.forget(&rec.cgroup_dir);
                    done.resumed.push(entry);
                }
            }
        }
        for (w, dir, why) in &done.left_suspended {
            warn!(
                "left suspended {w} ({}): {why}; it stays frozen and recorded: the next agent \
                 resumes it once there is room, or `gpushare-agent thaw --all` does",
                dir.display()
            );
        }
        done
    }
}

/// What [`Enforcer::thaw_all`] did: (workload, root group) of each, with why where not undone.
#[derive(Debug, Default)]
pub struct Unwound {
    /// Groups thawed.
    pub thawed: Vec<(String, std::path::PathBuf)>,
    /// Suspended workloads restored and thawed.
    pub resumed: Vec<(String, std::path::PathBuf)>,
    /// Records of groups that no longer exist (or were recreated), forgotten.
    pub gone: Vec<(String, std::path::PathBuf)>,
    /// Suspended workloads left suspended (frozen, recorded), with why.
    pub left_suspended: Vec<(String, std::path::PathBuf, String)>,
    /// Groups that could not be thawed or resumed, with why.
    pub failed: Vec<(String, std::path::PathBuf, String)>,
}

/// A test-only pause point (debug builds): sleeps while the file named by `var` exists, so a test
/// can SIGKILL the agent between recording a freeze and applying it.
#[cfg(debug_assertions)]
fn test_pause(var: &str) {
    if let Some(path) = std::env::var_os(var) {
        let path = std::path::PathBuf::from(path);
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while path.exists() && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
