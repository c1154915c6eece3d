//! Freezing and thawing cgroups: cgroup v2 `cgroup.freeze` (true state from `cgroup.events`), or the
//! v1 freezer (`freezer.state`) where a workload has no v2 group. Nothing here waits: a request is
//! written, and what the kernel made of it is read back, now or at a later step. A freeze can take
//! long to settle (a task in D state inside a driver stops only when it leaves the driver), and the
//! agent's only thread must not wait for it.
//!
//! Plain file writes rather than cgroups-rs: on this hybrid layout cgroups-rs picks v1 by itself, hard-codes
//! the v2 root to /sys/fs/cgroup, reads the v2 state from `cgroup.freeze` (what was asked) rather than
//! `cgroup.events` (what is), and pulls in zbus. The whole job is four files.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

pub use crate::policy::GroupState;

/// Which freezer a record refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Freezer {
    /// `<v2 dir>/cgroup.freeze`.
    V2,
    /// `<v1 freezer dir>/freezer.state`.
    V1,
}

/// Whether a v2 group is frozen, as the kernel reports it (`frozen 1` in `cgroup.events`).
pub fn v2_is_frozen(dir: &Path) -> Result<bool> {
    let events = fs::read_to_string(dir.join("cgroup.events"))
        .with_context(|| format!("reading {}/cgroup.events", dir.display()))?;
    Ok(events.lines().any(|l| l.trim() == "frozen 1"))
}

/// Whether a v2 group was asked to freeze (`cgroup.freeze` holds 1).
pub fn v2_freeze_requested(dir: &Path) -> Result<bool> {
    Ok(fs::read_to_string(dir.join("cgroup.freeze"))?.trim() == "1")
}

/// What the kernel says about a v2 group: frozen, asked to freeze but not yet, or neither.
pub fn v2_state(dir: &Path) -> Result<GroupState> {
    if v2_is_frozen(dir)? {
        return Ok(GroupState::Frozen);
    }
    Ok(if v2_freeze_requested(dir)? {
        GroupState::Freezing
    } else {
        GroupState::Thawed
    })
}

/// Asks the kernel to freeze (`true`) or thaw a v2 group; does not wait. The state to expect is
/// read back with [`v2_state`].
pub fn v2_request(dir: &Path, frozen: bool) -> Result<()> {
    write_control(dir, "cgroup.freeze", if frozen { "1" } else { "0" })
}

/// Kills every process of a v2 group at once (`cgroup.kill`, kernel 5.14+).
pub fn v2_kill(dir: &Path) -> Result<()> {
    write_control(dir, "cgroup.kill", "1")
}

/// The v1 freezer state (`FROZEN`, `FREEZING`, `THAWED`).
pub fn v1_state(dir: &Path) -> Result<String> {
    Ok(fs::read_to_string(dir.join("freezer.state"))
        .with_context(|| format!("reading {}/freezer.state", dir.display()))?
        .trim()
        .to_string())
}

/// The v1 freezer state as a [`GroupState`].
pub fn v1_group_state(dir: &Path) -> Result<GroupState> {
    Ok(match v1_state(dir)?.as_str() {
        "FROZEN" => GroupState::Frozen,
        "FREEZING" => GroupState::Freezing,
        _ => GroupState::Thawed,
    })
}

/// Asks the v1 freezer to freeze (`true`) or thaw a group; does not wait.
pub fn v1_request(dir: &Path, frozen: bool) -> Result<()> {
    write_control(
        dir,
        "freezer.state",
        if frozen { "FROZEN" } else { "THAWED" },
    )
}

/// What the kernel says about a group through `freezer`.
pub fn state(dir: &Path, freezer: Freezer) -> Result<GroupState> {
    match freezer {
        Freezer::V2 => v2_state(dir),
        Freezer::V1 => v1_group_state(dir),
    }
}

/// Asks `freezer` to freeze or thaw a group; does not wait.
pub fn request(dir: &Path, freezer: Freezer, frozen: bool) -> Result<()> {
    match freezer {
        Freezer::V2 => v2_request(dir, frozen),
        Freezer::V1 => v1_request(dir, frozen),
    }
}

/// The v1 freezer mount point, if any (`/sys/fs/cgroup/freezer` on hybrid systems).
pub fn v1_freezer_root() -> Option<PathBuf> {
    v1_root("freezer")
}

/// Where the v1 hierarchy of `controller` is mounted, if it is.
pub fn v1_root(controller: &str) -> Option<PathBuf> {
    crate::sys::mountinfo::cgroup1_root(controller)
}

fn write_control(dir: &Path, file: &str, value: &str) -> Result<()> {
    let path = dir.join(file);
    fs::write(&path, value).with_context(|| format!("writing {value:?} to {}", path.display()))
}
