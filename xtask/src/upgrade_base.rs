//! The agent an upgrade starts from: `gpushare-agent` built from the main before issue 20's key
//! change (commit [`COMMIT`]), for the integration test of an upgrade across it
//! (`gpushare-agent/tests/integration/upgrade.rs`), which finds it in [`ENV`].
//!
//! Built once into `target/upgrade-base/` (the source from `git archive`, its own target
//! directory: cargo keys the workspace's own packages by path, and the binary must not land on
//! today's `target/debug/gpushare-agent`), and reused while the binary is there. The first build
//! compiles the agent's dependencies again, without debug info (minutes).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// The main before issue 20 (unit keys by name, container identities anywhere in a path).
pub const COMMIT: &str = "d504d15a9fb0965cf742f4707022aa52d57b3b0b";
/// Names the built binary for the tests.
pub const ENV: &str = "GPUSHARE_UPGRADE_BASE_AGENT";

/// Builds the agent of [`COMMIT`] unless it is built already; its path.
pub fn build(root: &Path) -> Result<PathBuf> {
    let base = root.join("target/upgrade-base");
    let target = base.join("target");
    let bin = target.join("debug/gpushare-agent");
    if bin.is_file() {
        eprintln!(
            "xtask: the agent of {} is built: {}",
            &COMMIT[..12],
            bin.display()
        );
        return Ok(bin);
    }
    let src = base.join("src");
    if !src.join("Cargo.lock").is_file() {
        extract(root, &base, &src)?;
    }
    let status = Command::new("cargo")
        .current_dir(&src)
        .args([
            "build",
            "--locked",
            "-p",
            "gpushare-agent",
            "--bin",
            "gpushare-agent",
        ])
        .env("CARGO_TARGET_DIR", &target)
        // Only run by one test, never debugged: no debug info (a faster build, a third of the
        // disk).
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        // Its build script would otherwise ask git, which answers for the enclosing checkout.
        .env("GPUSHARE_BUILD_COMMIT", &COMMIT[..12])
        .status()
        .context("running cargo build for the upgrade's base agent")?;
    crate::check(status, "building the agent of the upgrade's base")?;
    if !bin.is_file() {
        bail!("cargo built no {}", bin.display());
    }
    Ok(bin)
}

/// `git archive COMMIT` unpacked at `src` (through a temporary directory, so a half-made tree is
/// never taken for a whole one).
fn extract(root: &Path, base: &Path, src: &Path) -> Result<()> {
    let tmp = base.join("src.tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = std::fs::remove_dir_all(src);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut archive = Command::new("git")
        .current_dir(root)
        .args(["archive", "--format=tar", COMMIT])
        .stdout(Stdio::piped())
        .spawn()
        .context("running git archive")?;
    let tar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&tmp)
        .stdin(archive.stdout.take().context("git archive's output")?)
        .status()
        .context("running tar")?;
    let git = archive.wait()?;
    if !git.success() {
        bail!(
            "git archive {COMMIT} failed ({git}): the upgrade test needs the commit in this clone's \
             history (a shallow clone lacks it: `git fetch --unshallow`)"
        );
    }
    crate::check(tar, "unpacking the upgrade's base source")?;
    std::fs::rename(&tmp, src).with_context(|| format!("renaming to {}", src.display()))
}
