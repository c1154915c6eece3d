//! `memory-limits.json` beside the scenario file: the per-cgroup GPU memory limits set through
//! the mock NVML's `nvmlDeviceSetMemoryLimits_v1` (recorded, never enforced), so that tests and
//! other processes can read them back.
//!
//! It also models what NVIDIA documents of soft limits: a soft limit is a reservation (the
//! group's `dmem.min`) that adds up into every ancestor group (`reserved`), taken back when the
//! soft limit is lowered or cleared on the same group; a group deleted without its soft limit
//! zeroed first leaves the ancestors' reservation in place (the driver cannot open a deleted
//! group's path to clear it), and a group recreated at the same path (another inode, `inodes`)
//! starts without a limit of its own.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Name of the file, in the scenario's directory.
pub const FILE_NAME: &str = "memory-limits.json";

/// One cgroup's limits on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    /// `softLimit` in bytes.
    pub soft: u64,
    /// `hardLimit` in bytes (`NVML_DEVICE_MEMORY_LIMIT_MAX` = no limit).
    pub hard: u64,
}

/// The file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryLimits {
    /// device UUID -> cgroup path (as given to NVML) -> limits.
    #[serde(default)]
    pub devices: BTreeMap<String, BTreeMap<String, Limit>>,
    /// device UUID -> ancestor cgroup path -> bytes its descendants' soft limits reserve there.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reserved: BTreeMap<String, BTreeMap<String, u64>>,
    /// cgroup path -> the inode of the group whose limit was last set there.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inodes: BTreeMap<String, u64>,
}

/// `<directory of the scenario>/memory-limits.json`.
pub fn path_for(scenario: &Path) -> PathBuf {
    scenario.with_file_name(FILE_NAME)
}

/// Reads the limits beside `scenario` (missing: none).
pub fn read(scenario: &Path) -> Result<MemoryLimits, String> {
    crate::statefile::read(&path_for(scenario))
}
