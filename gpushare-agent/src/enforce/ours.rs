//! What is ours: the base every executor stands on. A group is the agent's when its [`ledger`]
//! lists it and it is still the same directory (same inode) as when it was recorded; the [`marks`]
//! on the groups rebuild the list when the ledger was lost. Every executor reads and changes that
//! list only through here.
//!
//! [`ledger`]: super::ledger
//! [`marks`]: super::marks

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use log::{info, warn};

use super::{
    Enforcer,
    freeze::Freezer,
    ledger::{FreezeRecord, SuspendRecord},
    marks::{self, Mark},
};
use crate::policy::GpuScope;

impl Enforcer {
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

    /// The records of `workload`.
    pub(super) fn records_of(&self, workload: &str) -> Vec<FreezeRecord> {
        self.records()
            .into_iter()
            .filter(|r| r.workload == workload)
            .collect()
    }

    /// A new record of a freeze of `dir` for `workload` (with the group's inode now), made at
    /// `at_unix`.
    pub(super) fn new_record(
        workload: &str,
        dir: &Path,
        freezer: Freezer,
        scope: GpuScope,
        reason: &str,
        at_unix: u64,
    ) -> FreezeRecord {
        FreezeRecord {
            workload: workload.to_string(),
            cgroup_dir: dir.to_path_buf(),
            freezer,
            frozen_at_unix: at_unix,
            reason: reason.to_string(),
            inode: std::fs::metadata(dir).map(|m| m.ino()).ok(),
            scope: Some(scope.label()),
            suspended: None,
            extra: Default::default(),
        }
    }

    /// The hierarchies the agent's groups live in: v2, and the v1 freezer where it is mounted.
    fn hierarchies(&self) -> Vec<PathBuf> {
        let mut roots = vec![self.v2_root.clone()];
        roots.extend(self.v1_freezer_root.clone());
        roots
    }

    /// Groups marked by this agent's state directory that the ledger does not list (it was lost
    /// or unreadable) are added to it. In a dry run only the in-memory list grows.
    pub(super) fn adopt_marks(&mut self) {
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

    /// Takes over records made under a key other than the one `key_of` gives their group now
    /// (an earlier version's keys: a unit by its name, a container nested in a unit): each is
    /// rewritten under the new key, on disk and on its mark, never thawed. `key_of` gets the
    /// record and its group's path; `None` keeps the record as it is. Returns how many changed.
    pub fn rekey(&mut self, key_of: impl Fn(&FreezeRecord, &str) -> Option<String>) -> usize {
        let mut changed = 0;
        for mut rec in self.records() {
            let rel = self.rel_of(&rec.cgroup_dir);
            let Some(new) = key_of(&rec, &rel).filter(|k| *k != rec.workload) else {
                continue;
            };
            info!(
                "{}: frozen by an earlier version as {}; taken over as {new}",
                rec.cgroup_dir.display(),
                rec.workload
            );
            rec.workload = new;
            changed += 1;
            let dir = rec.cgroup_dir.clone();
            let mark = Mark::of(&rec, &self.state_dir);
            if let Some(l) = self.ledger.as_mut()
                && let Err(e) = l.record(rec)
            {
                warn!("{e:#}");
            }
            if !self.dry_run && marks::read(&dir).is_some() {
                let _ = marks::set(&dir, &mark);
            }
        }
        changed
    }

    /// Whether the group at `dir` is one the agent froze: recorded, and the same directory (inode)
    /// as when it was recorded.
    pub(super) fn ours(&self, dir: &Path) -> bool {
        let Some(rec) = self.ledger.as_ref().and_then(|l| l.get(dir)) else {
            return false;
        };
        match (rec.inode, std::fs::metadata(dir).map(|m| m.ino())) {
            (Some(want), Ok(have)) => want == have,
            (None, Ok(_)) => true,
            (_, Err(_)) => false,
        }
    }

    /// Forgets a group (thawed, gone or recreated): no longer pending, its mark and its record
    /// removed. A dry run only stops watching it.
    pub(super) fn forget(&mut self, dir: &Path) {
        self.pending.remove(dir);
        if self.dry_at(dir) {
            return;
        }
        let _ = marks::clear(dir);
        crate::crash::point("forgotten");
        if let Some(l) = self.ledger.as_mut()
            && let Err(e) = l.remove(dir)
        {
            warn!("{e:#}");
        }
    }

    /// Sets (or clears) the suspension of the record of `dir`, on disk and on its mark.
    pub(super) fn set_suspended(&mut self, dir: &Path, suspended: Option<SuspendRecord>) {
        let Some(mut rec) = self.record(dir) else {
            return;
        };
        rec.suspended = suspended;
        if self.dry_at(dir) {
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

    /// A group's path relative to the root of its hierarchy (v2 or the v1 freezer), as the policy
    /// names it.
    pub(super) fn rel_of(&self, dir: &Path) -> String {
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
}

/// Seconds since the epoch now (0 before it), as records keep time.
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
