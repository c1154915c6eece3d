//! Marks on the cgroups themselves: every group the agent freezes also carries a `trusted.`
//! extended attribute naming the freeze (as systemd keeps `trusted.invocation_id` on its groups),
//! so the list of what the agent froze can be rebuilt from the hierarchy when the ledger file is
//! lost or unreadable, and undone by `gpushare-agent thaw --all` without a running agent.
//!
//! Design note: `trusted.*` attributes can only be set and read with CAP_SYS_ADMIN, so a tenant
//! cannot forge or remove a mark, even on a delegated subtree it owns. A mark names the state
//! directory of the agent that set it: an agent (or `thaw --all`) adopts only its own marks, never
//! another agent's (tests run many agents side by side; a node should run one). A group recreated
//! under the same path is a new directory without the mark. Marks are written before the freeze
//! (after the ledger) and removed after the thaw; a filesystem without xattr support (EOPNOTSUPP)
//! leaves the ledger as the only list, which is logged once.

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::{freeze::Freezer, ledger::FreezeRecord};

/// The attribute's name.
pub const MARK: &str = "trusted.gpushare.freeze";

/// What a mark says.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mark {
    /// Workload key.
    pub workload: String,
    /// The state directory of the agent that froze it.
    pub state_dir: PathBuf,
    /// Which freezer.
    pub freezer: Freezer,
    /// GPU scope whose ladder froze it.
    #[serde(default)]
    pub scope: Option<String>,
    /// Seconds since the epoch.
    pub frozen_at_unix: u64,
    /// The suspension, when the `suspend` step checkpointed the workload first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<super::ledger::SuspendRecord>,
}

impl Mark {
    /// The mark of a record.
    pub fn of(rec: &FreezeRecord, state_dir: &Path) -> Self {
        Self {
            workload: rec.workload.clone(),
            state_dir: state_dir.to_path_buf(),
            freezer: rec.freezer,
            scope: rec.scope.clone(),
            frozen_at_unix: rec.frozen_at_unix,
            suspended: rec.suspended.clone(),
        }
    }

    /// The record a mark on `dir` stands for.
    pub fn record(&self, dir: &Path) -> FreezeRecord {
        FreezeRecord {
            workload: self.workload.clone(),
            cgroup_dir: dir.to_path_buf(),
            freezer: self.freezer,
            frozen_at_unix: self.frozen_at_unix,
            reason: "found by the mark on its cgroup".to_string(),
            inode: fs::metadata(dir).ok().map(|m| m.ino()),
            scope: self.scope.clone(),
            suspended: self.suspended.clone(),
            extra: Default::default(),
        }
    }
}

/// Puts the mark on `dir`.
pub fn set(dir: &Path, mark: &Mark) -> std::io::Result<()> {
    let value = serde_json::to_vec(mark).map_err(std::io::Error::other)?;
    xattr::set(dir, MARK, &value)
}

/// Removes the mark (no error when there is none or the group is gone).
pub fn clear(dir: &Path) -> std::io::Result<()> {
    match xattr::remove(dir, MARK) {
        Ok(()) => Ok(()),
        Err(e)
            if e.raw_os_error() == Some(libc::ENODATA)
                || e.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The mark on `dir`, if any (and readable).
pub fn read(dir: &Path) -> Option<Mark> {
    let value = xattr::get(dir, MARK).ok()??;
    serde_json::from_slice(&value).ok()
}

/// Every group under `roots` marked by the agent whose state directory is `state_dir`.
pub fn scan(roots: &[PathBuf], state_dir: &Path) -> Vec<(PathBuf, Mark)> {
    let mut found = Vec::new();
    for root in roots {
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            if let Some(m) = read(&dir)
                && m.state_dir == state_dir
            {
                found.push((dir.clone(), m));
            }
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}
