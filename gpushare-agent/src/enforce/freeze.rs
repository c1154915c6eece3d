//! Freezing and thawing cgroups: cgroup v2 `cgroup.freeze` (true state from `cgroup.events`), or the
//! v1 freezer (`freezer.state`) where a workload has no v2 group.
//!
//! Plain file writes rather than cgroups-rs: on this hybrid layout cgroups-rs picks v1 by itself, hard-codes
//! the v2 root to /sys/fs/cgroup, reads the v2 state from `cgroup.freeze` (what was asked) rather than
//! `cgroup.events` (what is), and pulls in zbus. The whole job is four files.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

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

/// Freezes a v2 group and waits until the kernel says it is frozen.
pub fn v2_freeze(dir: &Path, timeout: Duration) -> Result<()> {
    write_control(dir, "cgroup.freeze", "1")?;
    wait_for(timeout, || v2_is_frozen(dir))
        .with_context(|| format!("{} did not report frozen", dir.display()))
}

/// Thaws a v2 group and waits until the kernel says it is no longer frozen.
pub fn v2_thaw(dir: &Path, timeout: Duration) -> Result<()> {
    write_control(dir, "cgroup.freeze", "0")?;
    wait_for(timeout, || v2_is_frozen(dir).map(|f| !f))
        .with_context(|| format!("{} did not report thawed", dir.display()))
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

/// Freezes a v1 freezer group.
pub fn v1_freeze(dir: &Path, timeout: Duration) -> Result<()> {
    write_control(dir, "freezer.state", "FROZEN")?;
    wait_for(timeout, || v1_state(dir).map(|s| s == "FROZEN"))
}

/// Thaws a v1 freezer group.
pub fn v1_thaw(dir: &Path, timeout: Duration) -> Result<()> {
    write_control(dir, "freezer.state", "THAWED")?;
    wait_for(timeout, || v1_state(dir).map(|s| s == "THAWED"))
}

/// The v1 freezer mount point, if any (`/sys/fs/cgroup/freezer` on hybrid systems).
pub fn v1_freezer_root() -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        (r.next()? == "cgroup").then_some(())?;
        let opts = r.nth(1)?;
        opts.split(',').any(|o| o == "freezer").then_some(())?;
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

fn write_control(dir: &Path, file: &str, value: &str) -> Result<()> {
    let path = dir.join(file);
    fs::write(&path, value).with_context(|| format!("writing {value:?} to {}", path.display()))
}

fn wait_for(timeout: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if done()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
