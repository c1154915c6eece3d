//! Enforcement: idempotent executors for the policy's actions. Matching and deciding happen in
//! [`crate::policy`]; this module only acts, and in dry-run mode only reports.
//!
//! Safety rules applied here, whatever the policy says:
//! - signals go through pidfds after the process's start time is verified ([`signal`]);
//! - a freeze is written to the [`ledger`] before it is applied; the agent only thaws groups its
//!   ledger lists, so a `docker pause` or an operator's freeze is never undone by it;
//! - the root group and any group containing the agent itself are never frozen or killed.

pub mod freeze;
pub mod ledger;
pub mod signal;

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use log::{info, warn};

use self::{
    freeze::Freezer,
    ledger::{FreezeLedger, FreezeRecord},
    signal::{SignalOutcome, send_if_caught, send_verified},
};
use crate::attribution::{ProcessIdentity, cgroupfs};

/// How long a freeze or thaw may take to be reported by the kernel.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

/// The result of one executed action, for logs and the `{action, result}` metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done.
    Ok,
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
            Self::DryRun => "dry_run",
            Self::Noop => "noop",
            Self::Refused => "refused",
            Self::Failed => "failed",
            Self::NotCaught => "not_caught",
        }
    }
}

/// Executes freezes, thaws, signals and kills.
pub struct Enforcer {
    v2_root: PathBuf,
    v1_freezer_root: Option<PathBuf>,
    ledger: FreezeLedger,
    dry_run: bool,
    agent_cgroup: Option<String>,
}

impl Enforcer {
    /// An enforcer over the v2 hierarchy at `v2_root`, recording freezes in `state_dir`.
    pub fn new(v2_root: PathBuf, state_dir: &Path, dry_run: bool) -> Result<Self> {
        let (ledger, warning) = FreezeLedger::open(state_dir)?;
        if let Some(w) = warning {
            warn!("{w}");
        }
        let agent_cgroup = cgroupfs::cgroup_path_of_pid(std::process::id()).ok();
        Ok(Self {
            v2_root,
            v1_freezer_root: freeze::v1_freezer_root(),
            ledger,
            dry_run,
            agent_cgroup,
        })
    }

    /// Whether actions are only reported.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// The freeze ledger.
    pub fn ledger(&self) -> &FreezeLedger {
        &self.ledger
    }

    /// The v2 directory of a group given by its path relative to the root.
    pub fn v2_dir(&self, rel: &str) -> PathBuf {
        self.v2_root.join(rel.trim_start_matches('/'))
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

    /// Freezes the group at `rel` (v2 path) for `workload`. `pid_hint` (a process of the group) is
    /// used to find its v1 freezer group where the group has no v2 freezer.
    pub fn freeze(
        &mut self,
        workload: &str,
        rel: &str,
        pid_hint: Option<u32>,
        reason: &str,
    ) -> Outcome {
        if let Err(e) = self.check_target(rel) {
            warn!("freeze of {workload}: {e:#}");
            return Outcome::Refused;
        }
        let (dir, freezer) = match self.freezer_for(rel, pid_hint) {
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
        let already = match freezer {
            // Asked to freeze counts too: a freeze in progress is someone's freeze.
            Freezer::V2 => {
                freeze::v2_is_frozen(&dir).unwrap_or(false)
                    || freeze::v2_freeze_requested(&dir).unwrap_or(false)
            }
            Freezer::V1 => freeze::v1_state(&dir).is_ok_and(|s| s == "FROZEN" || s == "FREEZING"),
        };
        // A `docker pause` on a hybrid host freezes through the v1 freezer; a v2 freeze of such a
        // group never completes. Someone else's freeze either way: leave it to them.
        let already = already
            || (freezer == Freezer::V2
                && pid_hint
                    .and_then(|pid| self.v1_freezer_dir_of(pid).ok())
                    .is_some_and(|d| {
                        freeze::v1_state(&d).is_ok_and(|s| s == "FROZEN" || s == "FREEZING")
                    }));
        if already && self.ledger.get(&dir).is_some() {
            return Outcome::Noop;
        }
        if already {
            // Frozen by someone else (docker pause, an operator): not ours to record or thaw.
            info!("{workload} is already frozen by someone else; leaving it to them");
            return Outcome::Noop;
        }
        let rec = FreezeRecord {
            workload: workload.to_string(),
            cgroup_dir: dir.clone(),
            freezer,
            frozen_at_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            reason: reason.to_string(),
        };
        if let Err(e) = self.ledger.record(rec) {
            warn!("not freezing {workload}: the freeze could not be recorded first ({e:#})");
            return Outcome::Refused;
        }
        let res = match freezer {
            Freezer::V2 => freeze::v2_freeze(&dir, FREEZE_TIMEOUT),
            Freezer::V1 => freeze::v1_freeze(&dir, FREEZE_TIMEOUT),
        };
        match res {
            Ok(()) => {
                info!("froze {workload} ({}): {reason}", dir.display());
                Outcome::Ok
            }
            Err(e) => {
                warn!("freezing {workload} failed: {e:#}; thawing");
                let _ = self.thaw_dir(&dir, freezer);
                Outcome::Failed
            }
        }
    }

    /// Thaws the group at `rel` if (and only if) the agent froze it.
    pub fn thaw(&mut self, workload: &str, rel: &str) -> Outcome {
        let v2 = self.v2_dir(rel);
        let rec = self.ledger.get(&v2).cloned().or_else(|| {
            self.ledger
                .records()
                .find(|r| r.workload == workload)
                .cloned()
        });
        let Some(rec) = rec else { return Outcome::Noop };
        if self.dry_run {
            info!("dry run: would thaw {workload}");
            return Outcome::DryRun;
        }
        match self.thaw_dir(&rec.cgroup_dir, rec.freezer) {
            Ok(()) => {
                info!("thawed {workload} ({})", rec.cgroup_dir.display());
                Outcome::Ok
            }
            Err(e) => {
                warn!("thawing {workload} failed: {e:#}");
                Outcome::Failed
            }
        }
    }

    fn thaw_dir(&mut self, dir: &Path, freezer: Freezer) -> Result<()> {
        if dir.exists() {
            match freezer {
                Freezer::V2 => freeze::v2_thaw(dir, FREEZE_TIMEOUT)?,
                Freezer::V1 => freeze::v1_thaw(dir, FREEZE_TIMEOUT)?,
            }
        }
        // Gone groups (workload removed while frozen) leave no stale record either.
        self.ledger.remove(dir)
    }

    /// Thaws everything the ledger lists (on SIGTERM). Returns how many were thawed.
    pub fn thaw_all(&mut self) -> usize {
        let recs: Vec<FreezeRecord> = self.ledger.records().cloned().collect();
        let mut n = 0;
        for rec in recs {
            match self.thaw_dir(&rec.cgroup_dir, rec.freezer) {
                Ok(()) => {
                    n += 1;
                    info!("thawed {} on shutdown", rec.workload);
                }
                Err(e) => warn!("thawing {} on shutdown failed: {e:#}", rec.workload),
            }
        }
        n
    }

    /// On start: thaws every recorded freeze `still_liable` rejects and forgets records of groups
    /// that no longer exist. Returns (kept, thawed).
    pub fn reconcile_ledger(
        &mut self,
        still_liable: impl Fn(&FreezeRecord) -> bool,
    ) -> (usize, usize) {
        let recs: Vec<FreezeRecord> = self.ledger.records().cloned().collect();
        let (mut kept, mut thawed) = (0, 0);
        for rec in recs {
            if rec.cgroup_dir.exists() && still_liable(&rec) {
                // Re-apply: a crash between record and freeze leaves a record of an unfrozen group.
                let _ = match rec.freezer {
                    Freezer::V2 => freeze::v2_freeze(&rec.cgroup_dir, FREEZE_TIMEOUT),
                    Freezer::V1 => freeze::v1_freeze(&rec.cgroup_dir, FREEZE_TIMEOUT),
                };
                kept += 1;
            } else if self.thaw_dir(&rec.cgroup_dir, rec.freezer).is_ok() {
                info!(
                    "thawed {}: frozen by an earlier run, no longer liable",
                    rec.workload
                );
                thawed += 1;
            }
        }
        (kept, thawed)
    }

    /// Sends `sig` to each verified process. Returns the outcome per process.
    pub fn signal(
        &self,
        workload: &str,
        targets: &[ProcessIdentity],
        sig: i32,
    ) -> Vec<(ProcessIdentity, Outcome)> {
        self.signal_targets(workload, targets, sig, false)
    }

    /// A ladder's `signal` step: sends `sig` only to the verified processes that catch it; the
    /// others are skipped ([`Outcome::NotCaught`]), since the signal would end them and only a
    /// `kill` step may.
    pub fn signal_step(
        &self,
        workload: &str,
        targets: &[ProcessIdentity],
        sig: i32,
    ) -> Vec<(ProcessIdentity, Outcome)> {
        self.signal_targets(workload, targets, sig, true)
    }

    fn signal_targets(
        &self,
        workload: &str,
        targets: &[ProcessIdentity],
        sig: i32,
        only_if_caught: bool,
    ) -> Vec<(ProcessIdentity, Outcome)> {
        targets
            .iter()
            .map(|id| {
                if self.dry_run {
                    info!(
                        "dry run: would send signal {sig} to {} of {workload}",
                        id.pid
                    );
                    return (*id, Outcome::DryRun);
                }
                let sent = if only_if_caught {
                    send_if_caught(*id, sig)
                } else {
                    send_verified(*id, sig)
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
                            "not signalling {} of {workload}: it does not catch {name}, which would end it (only a kill step ends a process)",
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
                (*id, outcome)
            })
            .collect()
    }

    /// Kills a workload: `cgroup.kill` on its v2 group where it exists, else SIGKILL to each
    /// verified process. A frozen group is killed at once (v2) and its record dropped.
    pub fn kill(&mut self, workload: &str, rel: &str, targets: &[ProcessIdentity]) -> Outcome {
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
                    info!("killed {workload} (cgroup.kill)");
                    if self.ledger.get(&dir).is_some() {
                        let _ = self.thaw_dir(&dir, Freezer::V2);
                    }
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
        let rec = self
            .ledger
            .records()
            .find(|r| r.workload == workload)
            .cloned();
        if let Some(rec) = rec {
            let _ = self.thaw_dir(&rec.cgroup_dir, rec.freezer);
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

    fn freezer_for(&self, rel: &str, pid_hint: Option<u32>) -> Result<(PathBuf, Freezer)> {
        let v2 = self.v2_dir(rel);
        if v2.join("cgroup.freeze").exists() {
            return Ok((v2, Freezer::V2));
        }
        let root = self
            .v1_freezer_root
            .as_ref()
            .context("no cgroup v2 freezer for the group and no v1 freezer mounted")?;
        let pid = pid_hint.context("no process known to find the group's v1 freezer")?;
        let path = v1_freezer_path_of(pid)?;
        self.check_target(&path)?;
        Ok((root.join(path.trim_start_matches('/')), Freezer::V1))
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
