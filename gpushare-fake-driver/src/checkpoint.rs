//! `cuda-state.json` beside the scenario file: the per-process states the mock libcuda keeps,
//! shared by every process that loads a mock library (the agent, tests, pynvml). A process that
//! is not listed is RUNNING. The mock NVML hides CHECKPOINTED processes from its process lists
//! and memory counters until they are restored.
//!
//! It also models cuda-checkpoint issue #53 (driver 595.71.05): a process *restored* from a
//! checkpoint whose context is live again (restored and not checkpointed since) hard-hangs the
//! host when it is killed. The mock remembers each restored process (`restored`: pid -> start
//! time) until it is checkpointed again; one that is found gone while so remembered
//! ([`CheckpointState::sweep`], at every state change and in the tests' own check) is recorded in
//! `hangs`, which a test asserts empty.

use crate::cuda::ProcessState;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Name of the file, in the scenario's directory.
pub const FILE_NAME: &str = "cuda-state.json";

/// The file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointState {
    /// pid -> state, for every process that is not RUNNING.
    #[serde(default)]
    pub processes: BTreeMap<u32, ProcessState>,
    /// Processes restored from a checkpoint whose context is live (not checkpointed since):
    /// pid -> start time (`/proc/<pid>/stat` field 22), so a reused pid is another process.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub restored: BTreeMap<u32, u64>,
    /// The host hangs of cuda-checkpoint #53: restored processes that ended with a live context.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hangs: Vec<Hang>,
}

/// A restored process that ended while its context was live: on driver 595.71.05 the host
/// hard-hangs about 35 s later (cuda-checkpoint #53).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hang {
    /// The process's pid.
    pub pid: u32,
    /// Its start time.
    pub start_ticks: u64,
    /// The driver's state of it when it was found gone.
    pub state: ProcessState,
}

/// The start time of `pid` (`/proc/<pid>/stat` field 22), if it runs: a zombie ('Z', 'X') has
/// exited, and its context went with it.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    // Field 3 (state) is the first after the name; field 22 is 19 further on.
    if matches!(fields.next()?, "Z" | "X" | "x") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

impl CheckpointState {
    /// The state of `pid` (RUNNING when not listed).
    pub fn state(&self, pid: u32) -> ProcessState {
        self.processes.get(&pid).copied().unwrap_or_default()
    }

    /// Sets the state of `pid` (RUNNING removes it).
    pub fn set(&mut self, pid: u32, state: ProcessState) {
        if state == ProcessState::Running {
            self.processes.remove(&pid);
        } else {
            self.processes.insert(pid, state);
        }
    }

    /// Remembers that `pid` was restored: its context is live until it is checkpointed again.
    /// A pid without a `/proc` entry (a scenario-only process) cannot be killed and is not kept.
    pub fn mark_restored(&mut self, pid: u32) {
        if let Some(t) = start_ticks(pid) {
            self.restored.insert(pid, t);
        }
    }

    /// `pid` was checkpointed: its context is no longer live.
    pub fn mark_checkpointed(&mut self, pid: u32) {
        self.restored.remove(&pid);
    }

    /// Records a hang for each restored process with a live context that no longer runs (gone,
    /// or its pid now names another process). Returns whether any was added.
    pub fn sweep(&mut self) -> bool {
        let gone: Vec<(u32, u64)> = self
            .restored
            .iter()
            .filter(|(pid, t)| start_ticks(**pid) != Some(**t))
            .map(|(p, t)| (*p, *t))
            .collect();
        for (pid, start_ticks) in &gone {
            self.restored.remove(pid);
            self.hangs.push(Hang {
                pid: *pid,
                start_ticks: *start_ticks,
                state: self.state(*pid),
            });
        }
        !gone.is_empty()
    }

    /// The pids whose GPU memory is checkpointed (hidden from NVML).
    pub fn checkpointed(&self) -> BTreeSet<u32> {
        self.processes
            .iter()
            .filter(|(_, s)| **s == ProcessState::Checkpointed)
            .map(|(p, _)| *p)
            .collect()
    }
}

/// `<directory of the scenario>/cuda-state.json`.
pub fn path_for(scenario: &Path) -> PathBuf {
    scenario.with_file_name(FILE_NAME)
}

/// Reads the state beside `scenario` (missing: every process RUNNING).
pub fn read(scenario: &Path) -> Result<CheckpointState, String> {
    crate::statefile::read(&path_for(scenario))
}

/// Sweeps the state beside `scenario` ([`CheckpointState::sweep`]) and returns every hang
/// recorded so far: the check a test makes once the processes it cares about are gone.
pub fn host_hangs(scenario: &Path) -> Result<Vec<Hang>, String> {
    crate::statefile::update(&path_for(scenario), |s: &mut CheckpointState| {
        s.sweep();
        Ok::<_, ()>(s.hangs.clone())
    })?
    .map_err(|()| "unreachable".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_process_that_ends_with_a_live_context_is_a_hang_and_a_checkpointed_one_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let mut again = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let (pid, other) = (child.id(), again.id());
        let mut s = CheckpointState::default();
        s.mark_restored(pid);
        s.mark_restored(other);
        s.mark_checkpointed(other);
        s.set(other, ProcessState::Checkpointed);
        assert!(!s.sweep(), "both still run");
        for c in [&mut child, &mut again] {
            c.kill().unwrap();
        }
        // Killed, not reaped yet: a zombie has no context any more.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while start_ticks(pid).is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(s.sweep());
        for c in [&mut child, &mut again] {
            c.wait().unwrap();
        }
        assert_eq!(s.hangs.len(), 1, "{:?}", s.hangs);
        assert_eq!(s.hangs[0].pid, pid);
        assert_eq!(s.hangs[0].state, ProcessState::Running);
        assert!(!s.sweep(), "recorded once");
        // A never-restored process that ends is no hang.
        let mut plain = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        plain.kill().unwrap();
        plain.wait().unwrap();
        assert!(!s.sweep());
    }

    #[test]
    fn a_pid_without_a_process_is_not_remembered() {
        let mut s = CheckpointState::default();
        s.mark_restored(u32::MAX - 1);
        assert!(s.restored.is_empty());
    }
}
