//! `gpushare-agent thaw --all`: undoes every freeze of a state directory without a running agent,
//! through an [`Enforcer`] built by the same constructor as the agent's, and its
//! [`Enforcer::thaw_all`]. A suspended workload is restored only where the GPU has room for it
//! ([`crate::policy::resume_room`], judged on an NVML sample), or where the operator says
//! [`Room::Ignore`] (`--restore-without-room`); every other one is named with its reason and
//! stays suspended, frozen and recorded.

use std::{path::Path, sync::Arc};

use anyhow::{Result, bail};
use log::warn;

use super::{
    Enforcer,
    freezing::Unwound,
    lock::{LockError, StateLock},
    open_ledger,
};
use crate::{attribution::cgroupfs, cuda::Checkpointer, policy, sample::GpuSample};

/// What `gpushare-agent thaw --all` did.
pub type ThawAllReport = Unwound;

/// How `thaw --all` judges whether a suspended workload may be restored.
#[derive(Debug)]
pub enum Room {
    /// By the room on its GPUs in this NVML sample.
    Sample(GpuSample),
    /// It cannot be judged (no NVML), in words: nothing is restored.
    Unknown(String),
    /// Restore without looking (`--restore-without-room`): a restore that runs out of GPU memory
    /// can leave the process unrestorable on some drivers (docs/suspend.md).
    Ignore,
}

impl Room {
    /// `Ok` when `rec`'s suspension may be restored now; else why not.
    fn judge(&self, rec: &super::ledger::FreezeRecord) -> Result<(), String> {
        let Some(sr) = rec.suspended.as_ref() else {
            return Ok(());
        };
        match self {
            Self::Ignore => Ok(()),
            Self::Unknown(why) => Err(format!(
                "the room on its GPUs cannot be judged ({why}); restore it without room only \
                 with --restore-without-room"
            )),
            Self::Sample(sample) => {
                let pids = sr.live_pids();
                policy::resume_room(&sr.per_gpu, sample, |gpu| {
                    policy::listed_for(sample, &pids, gpu)
                })
                .map_err(|why| {
                    format!(
                        "no room to restore it: {why}; run this again once there is room, or \
                         restore it anyway with --restore-without-room"
                    )
                })
            }
        }
    }
}

/// Undoes every freeze recorded in `state_dir`'s ledger or marked with it on the cgroups, without
/// a running agent. Takes the state directory's lock first (so it cannot race an agent) unless
/// `force`. Never touches a group it did not freeze (a recreated group has no mark and another
/// inode).
pub fn thaw_everything(
    state_dir: &Path,
    force: bool,
    cuda: Result<Arc<Checkpointer>, String>,
    room: &Room,
) -> Result<ThawAllReport> {
    let mut enforcer = Enforcer::offline(state_dir, force)?;
    enforcer.set_checkpointer(cuda);
    Ok(enforcer.thaw_all(&mut |rec| room.judge(rec)))
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
