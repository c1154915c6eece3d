//! `cuda-state.json` beside the scenario file: the per-process states the mock libcuda keeps,
//! shared by every process that loads a mock library (the agent, tests, pynvml). A process that
//! is not listed is RUNNING. The mock NVML hides CHECKPOINTED processes from its process lists
//! and memory counters until they are restored.

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
