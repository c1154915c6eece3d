//! Killing a process that was restored from a checkpoint (cuda-checkpoint #53, driver
//! 595.71.05): SIGKILL or SIGTERM of a restored process whose context is live again hard-hangs
//! the whole host about 35 s later. The reporter's workaround, applied before every signal that
//! ends a process: lock it and checkpoint it again, check through NVML that its device memory
//! left the GPU, and only then kill it. Where that cannot be done the kill is refused: the
//! workload is frozen instead (a freeze can be undone; a hung host cannot), and the refusal is
//! logged with its reason and counted.
//!
//! The processes a resume restores are recorded in the ledger before the restore starts
//! ([`super::ledger::FreezeLedger::remember_restored`]), by the agent's resume, its shutdown
//! and `thaw --all`, so a later agent knows them too.

use std::collections::BTreeMap;

use log::{info, warn};

use super::{
    Enforcer, Target, To,
    checkpoint::{LOCK_TIMEOUT_MS, PinnedProcess, settle},
    freeze,
};
use crate::{
    attribution::{ProcessIdentity, cgroupfs, procinfo},
    cuda::{Checkpointer, CudaError, ErrorKind, ProcessState},
    policy::GroupState,
    quota::ByteSize,
    sample::{DeviceHealth, GpuSample},
};

/// Why a kill is refused, in the log and the refusal's reason.
pub const REFUSAL: &str =
    "killing a restored process with a live context hangs the host: cuda-checkpoint #53";
/// The signals a process is asked to end with (a handler usually exits): a `signal` step does
/// not send them to a restored process, which may exit on them with a live context.
pub fn asks_to_exit(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGTERM | libc::SIGINT | libc::SIGQUIT | libc::SIGHUP
    )
}

/// What the log says of a restored process made safe to kill.
pub const QUIESCED: &str = "checkpointed again before the kill";
/// Why a faulted restored process is ended, in the log.
pub const FAULTED: &str =
    "cuda-checkpoint #53: a restored context that faults hangs the host as it is torn down";
/// Device memory a checkpointed process may still show in NVML and count as gone: none.
pub const EMPTY_DEVICE_BYTES: u64 = 0;

/// What a restored process needs before it is killed, from the driver's state of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Before {
    /// Running: lock it, then checkpoint it.
    LockAndCheckpoint,
    /// Locked already: checkpoint it.
    Checkpoint,
    /// Checkpointed, or no CUDA state: nothing of it is live on the GPU.
    Nothing,
    /// It cannot be made safe: do not kill it.
    Refuse(String),
}

/// The step before a kill for a process in `state` (the driver's answer to GetState).
pub fn before_kill(state: Result<ProcessState, &CudaError>) -> Before {
    match state {
        Ok(ProcessState::Running) => Before::LockAndCheckpoint,
        Ok(ProcessState::Locked) => Before::Checkpoint,
        Ok(ProcessState::Checkpointed) => Before::Nothing,
        Ok(
            s @ (ProcessState::Failed
            | ProcessState::Checkpointing
            | ProcessState::Restoring
            | ProcessState::Unknown(_)),
        ) => Before::Refuse(format!("the driver reports it {s:?}")),
        Err(e) if e.kind() == ErrorKind::NotACudaProcess => Before::Nothing,
        Err(e) => Before::Refuse(format!("its state cannot be read: {e}")),
    }
}

/// The GPU memory NVML shows for `pid` in `sample`, when it is at most [`EMPTY_DEVICE_BYTES`];
/// otherwise why the device is not known to be empty (a sample with problems, a device not read,
/// a usage NVML does not report, or memory still there). Unknown is never taken as empty.
pub fn device_left(sample: &GpuSample, pid: u32) -> Result<u64, String> {
    if !sample.problems.is_empty() {
        return Err(format!(
            "NVML could not be read ({})",
            sample.problems.join("; ")
        ));
    }
    if sample.devices.is_empty() {
        return Err("NVML lists no GPU".into());
    }
    let unread = (sample.health.iter())
        .filter(|(_, h)| *h != DeviceHealth::Ok)
        .map(|(i, _)| *i)
        .chain(
            sample
                .devices
                .iter()
                .map(|d| d.index)
                .filter(|i| !sample.device_ok(*i)),
        );
    if let Some(index) = unread.min() {
        return Err(format!("GPU {index} was not read completely"));
    }
    let mut bytes = 0u64;
    for p in sample.processes.iter().filter(|p| p.pid == pid) {
        let Some(b) = p.used_bytes else {
            return Err(format!(
                "NVML does not report its usage on GPU {}",
                p.device_index
            ));
        };
        bytes = bytes.saturating_add(b);
    }
    if bytes > EMPTY_DEVICE_BYTES {
        return Err(format!(
            "{} of its device memory is still on the GPU",
            ByteSize(bytes).approx()
        ));
    }
    Ok(bytes)
}

/// Locks (where it runs) and checkpoints one restored process; a checkpoint that fails unlocks
/// what this call locked, so nothing is left locked (a locked process blocks in every CUDA call).
/// `Ok(Some(locked_here))`: this call checkpointed it (and locked it first, where `locked_here`);
/// `Ok(None)`: nothing to do (already checkpointed, no CUDA state, or gone).
fn checkpoint_again(cuda: &Checkpointer, p: &PinnedProcess) -> Result<Option<bool>, String> {
    let step = before_kill(cuda.state(p.pid).as_ref().map(|s| *s));
    let locked_here = match step {
        Before::Nothing => return Ok(None),
        Before::Refuse(why) => return Err(why),
        Before::LockAndCheckpoint => {
            if !p.alive() {
                return Ok(None);
            }
            cuda.lock(p.pid, LOCK_TIMEOUT_MS)
                .map_err(|e| format!("lock: {e}"))?;
            true
        }
        Before::Checkpoint => false,
    };
    if !p.alive() {
        return Ok(None); // exited: its context went with it
    }
    if let Err(e) = cuda.checkpoint(p.pid) {
        if locked_here
            && p.alive()
            && let Err(u) = cuda.unlock(p.pid)
        {
            warn!("pid {}: unlock after a failed checkpoint: {u}", p.pid);
        }
        return Err(format!("checkpoint: {e}"));
    }
    Ok(Some(locked_here))
}

/// Undoes [`checkpoint_again`] where a kill it prepared is refused: restores the process (and
/// unlocks it where that call locked it), so nothing is left checkpointed that no suspension
/// records (a thaw, a shutdown or `thaw --all` would leave it blocked in every CUDA call).
fn undo_checkpoint(
    cuda: &Checkpointer,
    id: ProcessIdentity,
    locked_here: bool,
) -> Result<(), String> {
    let Some(p) = PinnedProcess::of(&Target::from(id)) else {
        return Ok(()); // gone
    };
    cuda.restore(p.pid).map_err(|e| format!("restore: {e}"))?;
    if locked_here && p.alive() {
        cuda.unlock(p.pid).map_err(|e| format!("unlock: {e}"))?;
    }
    Ok(())
}

impl Enforcer {
    /// Whether `id` is recorded as restored from a checkpoint.
    pub(super) fn was_restored(&self, id: ProcessIdentity) -> bool {
        self.ledger
            .as_ref()
            .is_some_and(|l| l.restored().any(|r| *r == id))
    }

    /// The processes recorded as restored that still run in the group `rel` or below it.
    fn restored_in(&self, rel: &str) -> Vec<ProcessIdentity> {
        let root = format!("/{}", rel.trim_matches('/'));
        let under =
            |path: &str| root == "/" || path == root || path.starts_with(&format!("{root}/"));
        self.ledger
            .iter()
            .flat_map(|l| l.restored())
            .copied()
            .filter(|id| procinfo::is_same_process(*id))
            .filter(|id| cgroupfs::cgroup_path_of_pid(id.pid).is_ok_and(|p| under(&p)))
            .collect()
    }

    /// Before the kill of the workload at `rel`: each process of it recorded as restored is
    /// locked and checkpointed again (its group thawed for that, if the agent froze it), then
    /// `sample` (a fresh NVML read) must show none of its memory on the GPU. `Err`: why it is not
    /// safe to kill; the caller refuses the kill. The policy repeats a kill that left processes
    /// running; a workload refused once is not thawed and locked again while the same processes
    /// run (it stays frozen), but one whose processes are all checkpointed already (by someone
    /// else) is looked at through NVML again. A refusal after processes were checkpointed here
    /// restores them first: nothing is left checkpointed that no suspension records (a later
    /// thaw, shutdown or `thaw --all` would leave it blocked in every CUDA call).
    pub(super) fn quiesce_restored(
        &mut self,
        workload: &str,
        rel: &str,
        sample: &mut dyn FnMut() -> GpuSample,
    ) -> Result<(), String> {
        let ids = self.restored_in(rel);
        self.quiesce(workload, rel, ids, sample)
    }

    /// [`Self::quiesce_restored`] for the restored processes `ids` of the workload at `rel`.
    fn quiesce(
        &mut self,
        workload: &str,
        rel: &str,
        ids: Vec<ProcessIdentity>,
        sample: &mut dyn FnMut() -> GpuSample,
    ) -> Result<(), String> {
        if ids.is_empty() {
            self.refused_kills.remove(workload);
            return Ok(());
        }
        let r = self
            .checkpoint_all_again(workload, rel, &ids)
            .and_then(|done| {
                let now = sample();
                let left = ids
                    .iter()
                    .filter(|id| procinfo::is_same_process(**id))
                    .map(|id| {
                        device_left(&now, id.pid)
                            .map(|bytes| (id.pid, bytes))
                            .map_err(|e| format!("pid {}: {e}", id.pid))
                    })
                    .collect::<Result<Vec<_>, _>>();
                match left {
                    Ok(left) => {
                        for (pid, bytes) in left {
                            info!(
                                "pid {pid} of {workload} {QUIESCED}: {} on the GPU \
                                 (cuda-checkpoint #53)",
                                ByteSize(bytes).approx()
                            );
                        }
                        Ok(())
                    }
                    Err(why) => Err(self.undo_checkpoints(why, &done)),
                }
            });
        match &r {
            Ok(()) => self.refused_kills.remove(workload),
            Err(_) => self.refused_kills.insert(workload.to_string(), ids),
        };
        r
    }

    /// A kill prepared by [`Self::checkpoint_all_again`] is refused (`why`): the processes it
    /// checkpointed (`done`) are restored, so the refusal leaves them as they were. Returns the
    /// reason, with what was undone.
    fn undo_checkpoints(&self, why: String, done: &[(ProcessIdentity, bool)]) -> String {
        let Ok(cuda) = &self.cuda else {
            return why;
        };
        if done.is_empty() {
            return why;
        }
        let undone: Vec<String> = done
            .iter()
            .map(|(id, locked)| match undo_checkpoint(cuda, *id, *locked) {
                Ok(()) => format!("pid {} restored again", id.pid),
                Err(e) => {
                    warn!(
                        "pid {}: left checkpointed after a refused kill: {e}",
                        id.pid
                    );
                    format!("pid {} left checkpointed ({e})", id.pid)
                }
            })
            .collect();
        format!("{why}; {}", undone.join(", "))
    }

    /// The driver's part of [`Self::quiesce_restored`]: every process of `ids` checkpointed (or
    /// without CUDA state, or gone). `Ok`: the processes this call checkpointed, each with
    /// whether it locked it first.
    fn checkpoint_all_again(
        &self,
        workload: &str,
        rel: &str,
        ids: &[ProcessIdentity],
    ) -> Result<Vec<(ProcessIdentity, bool)>, String> {
        let cuda = match &self.cuda {
            Ok(c) => c.clone(),
            Err(why) => return Err(format!("it cannot be checkpointed again ({why})")),
        };
        let steps: Vec<Before> = ids
            .iter()
            .map(|id| before_kill(cuda.state(id.pid).as_ref().map(|s| *s)))
            .collect();
        if let Some(Before::Refuse(why)) = steps.iter().find(|b| matches!(b, Before::Refuse(_))) {
            return Err(why.clone());
        }
        if steps.iter().all(|b| *b == Before::Nothing) {
            return Ok(Vec::new());
        }
        if let Some(before) = self.refused_kills.get(workload)
            && ids.iter().all(|id| before.contains(id))
        {
            return Err(
                "its processes could not be checkpointed again at an earlier try; not \
                        tried again while they run"
                    .into(),
            );
        }
        let (dir, freezer) = self
            .freezer_for(workload, rel, ids.first().map(|id| id.pid))
            .map_err(|e| format!("{e:#}"))?;
        if matches!(
            freeze::state(&dir, freezer),
            Ok(GroupState::Frozen | GroupState::Freezing)
        ) {
            if !self.ours(&dir) {
                return Err("it is frozen by someone else and cannot be locked".into());
            }
            settle(&dir, freezer, false).map_err(|e| format!("cannot thaw it to lock it: {e}"))?;
        }
        let mut done = Vec::new();
        for id in ids {
            let Some(p) = PinnedProcess::of(&Target::from(*id)) else {
                continue; // gone: its context went with it
            };
            match checkpoint_again(&cuda, &p) {
                Ok(Some(locked)) => done.push((*id, locked)),
                Ok(None) => {}
                Err(e) => return Err(self.undo_checkpoints(format!("pid {}: {e}", id.pid), &done)),
            }
        }
        Ok(done)
    }

    /// A restored process whose context faulted (the driver's Xid `xid` names it): ended as the
    /// kill rung ends one (cuda-checkpoint #53: a restored context that faults hangs the host
    /// as a kill of it does), checkpointed again, its device seen empty in `sample` (a fresh
    /// NVML read), then killed; its workload's other processes are left as they are. Only a
    /// process the ledger records as restored, the same process (pid and start time), in the
    /// workload at `rel`. Where it cannot be checkpointed it is left running, logged and
    /// counted: nothing better is known (a freeze would hold its faulted context on the GPU).
    pub fn end_faulted(
        &mut self,
        workload: &str,
        rel: &str,
        target: &Target,
        xid: u32,
        sample: &mut dyn FnMut() -> GpuSample,
    ) -> Vec<(ProcessIdentity, super::Outcome)> {
        let id = target.identity;
        if !self.restored_in(rel).contains(&id) {
            return Vec::new();
        }
        let pid = id.pid;
        if let Err(e) = self.check_target(rel) {
            warn!("pid {pid} of {workload} (Xid {xid}): {e:#}");
            return vec![(id, super::Outcome::Refused)];
        }
        if self.dry(workload) {
            info!(
                "dry run: would checkpoint pid {pid} of {workload} again and end it: its restored \
                 context faulted (Xid {xid}; {FAULTED})"
            );
            return vec![(id, super::Outcome::DryRun)];
        }
        warn!(
            "pid {pid} of {workload}: its restored context faulted (Xid {xid}); checkpointing it \
             again, then ending it ({FAULTED})"
        );
        match self.quiesce(workload, rel, vec![id], sample) {
            Ok(()) => self.signal(
                workload,
                std::slice::from_ref(target),
                libc::SIGKILL,
                To::Every,
            ),
            Err(why) => {
                *self.kill_refusals.entry("faulted_context").or_default() += 1;
                warn!(
                    "pid {pid} of {workload} (Xid {xid}) left running: {why}; a faulted restored \
                     context may hang the host (cuda-checkpoint #53): drain this node"
                );
                vec![(id, super::Outcome::Refused)]
            }
        }
    }

    /// Counts and logs a refused kill, freezes the workload instead and says what the kernel and
    /// the driver report of it.
    pub(super) fn refuse_kill(&mut self, workload: &str, rel: &str, why: &str) {
        *self.kill_refusals.entry("restored_context").or_default() += 1;
        let ids = self.restored_in(rel);
        let hint = ids.first().map(|id| id.pid);
        let frozen = self.freeze(
            workload,
            rel,
            crate::policy::GpuScope::All,
            hint,
            REFUSAL,
            std::time::Instant::now(),
        );
        let states: Vec<String> = match &self.cuda {
            Ok(c) => ids
                .iter()
                .map(|id| match c.state(id.pid) {
                    Ok(s) => format!("pid {} {s:?}", id.pid),
                    Err(e) => format!("pid {} ({e})", id.pid),
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        let kernel = self
            .freezer_for(workload, rel, hint)
            .ok()
            .map(|(dir, f)| freeze::state(&dir, f));
        warn!(
            "not killing {workload}: {REFUSAL}; {why}; frozen instead ({}); the kernel reports \
             the group {kernel:?}; the driver: [{}]",
            frozen.as_str(),
            states.join(", ")
        );
    }

    /// Whether the last kill of `workload` was refused for a restored process (it is frozen
    /// instead; the policy holds it so).
    pub fn kill_refused(&self, workload: &str) -> bool {
        self.refused_kills.contains_key(workload)
    }

    /// Kills refused, by reason.
    pub fn kill_refusals(&self) -> &BTreeMap<&'static str, u64> {
        &self.kill_refusals
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{DeviceSample, ProcessSample};

    #[test]
    fn only_the_signals_that_ask_a_process_to_end_are_kept_from_a_restored_one() {
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGQUIT, libc::SIGHUP] {
            assert!(asks_to_exit(s), "{s}");
        }
        for s in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGALRM, libc::SIGKILL] {
            assert!(!asks_to_exit(s), "{s}");
        }
    }

    #[test]
    fn each_driver_state_has_its_step_before_a_kill() {
        use ProcessState::*;
        assert_eq!(before_kill(Ok(Running)), Before::LockAndCheckpoint);
        assert_eq!(before_kill(Ok(Locked)), Before::Checkpoint);
        assert_eq!(before_kill(Ok(Checkpointed)), Before::Nothing);
        for s in [Failed, Checkpointing, Restoring, Unknown(7)] {
            assert!(matches!(before_kill(Ok(s)), Before::Refuse(_)), "{s:?}");
        }
        let error = |code: u32| CudaError {
            code,
            name: format!("CUresult {code}"),
            message: String::new(),
        };
        let none = error(1);
        assert_eq!(before_kill(Err(&none)), Before::Nothing, "no CUDA state");
        let unknown = error(999);
        assert!(matches!(before_kill(Err(&unknown)), Before::Refuse(_)));
    }

    fn sample(procs: &[(u32, Option<u64>)], ok: bool) -> GpuSample {
        let device = DeviceSample {
            index: 0,
            uuid: "GPU-0".into(),
            ..Default::default()
        };
        GpuSample {
            taken_at: None,
            devices: vec![device],
            health: vec![(
                0,
                if ok {
                    DeviceHealth::Ok
                } else {
                    DeviceHealth::Degraded {
                        reason: "read failed".into(),
                    }
                },
            )],
            processes: procs
                .iter()
                .map(|(pid, used)| ProcessSample {
                    pid: *pid,
                    device_index: 0,
                    device_uuid: "GPU-0".into(),
                    used_bytes: *used,
                    ..Default::default()
                })
                .collect(),
            problems: Vec::new(),
        }
    }

    #[test]
    fn only_a_device_read_completely_and_empty_of_the_process_counts_as_empty() {
        assert_eq!(device_left(&sample(&[(9, Some(1 << 30))], true), 7), Ok(0));
        assert_eq!(device_left(&sample(&[(7, Some(0))], true), 7), Ok(0));
        let held = device_left(&sample(&[(7, Some(1 << 30))], true), 7).unwrap_err();
        assert!(held.contains("still on the GPU"), "{held}");
        assert!(
            device_left(&sample(&[(7, None)], true), 7).is_err(),
            "unknown usage"
        );
        assert!(
            device_left(&sample(&[], false), 7).is_err(),
            "a GPU not read"
        );
        let mut failed = sample(&[], true);
        failed.problems.push("no device count".into());
        assert!(device_left(&failed, 7).is_err());
        let mut none = sample(&[], true);
        none.devices.clear();
        none.health.clear();
        assert!(device_left(&none, 7).is_err(), "no GPU at all");
    }
}
