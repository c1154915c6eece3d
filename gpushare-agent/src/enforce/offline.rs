//! `gpushare-agent thaw --all`: undoes every freeze of a state directory without a running agent,
//! through an [`Enforcer`] built by the same constructor as the agent's, and its thaw.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use anyhow::{Result, bail};
use log::warn;

use super::{
    Enforcer, Outcome, freeze,
    lock::{LockError, StateLock},
    open_ledger,
};
use crate::{attribution::cgroupfs, cuda::Checkpointer};

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
    let mut enforcer = Enforcer::offline(state_dir, force)?;
    enforcer.set_checkpointer(cuda);
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

impl Enforcer {
    /// The enforcer of `thaw --all`: another holder of the state directory's lock stops it unless
    /// `force`; unlike the agent, it needs a usable ledger; it acts for real (no dry run).
    fn offline(state_dir: &Path, force: bool) -> Result<Self> {
        let lock = match StateLock::acquire(state_dir) {
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
        let ledger = open_ledger(state_dir)?;
        Ok(Self::with_state(
            v2_root,
            state_dir,
            lock,
            Some(ledger),
            Vec::new(),
            false,
        ))
    }
}
