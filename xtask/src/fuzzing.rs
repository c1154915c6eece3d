//! The bounded fuzzing run of `cargo xtask test`, beside the tests.
//!
//! The fuzz build compiles the agent and every dependency again (release, libFuzzer's
//! instrumentation): minutes of CPU on CI's 2-core machine, where the integration tests mostly
//! wait on the kernel, Docker and the agents they start. So `fuzz/run.sh` starts just before the
//! tests, at the lowest CPU priority (`nice -n 19`: the tests' own processes always come first),
//! writes to a log of its own, and is waited for after the benches; its output is printed then,
//! whole, and a failure fails the run as before.
//!
//! Measured on fresh clones on this 2-core machine (`.ci/run`, 2026-12-06), all green: started
//! just before the tests, 2,172 s (7m48s waited for the fuzzing after the benches) and 2,134 s
//! (2m59s); started before the image, 2,182 s (2m47s). The machine's speed varied between runs
//! by a third (the image's release build 505, 704 and 702 s, the first and the last with nothing
//! beside it), more than the placements differ. It starts before the tests, where no step that
//! is timed on its own shares the CPU with it. (Before, a step of its own: about 47 minutes.)

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Instant,
};

use anyhow::{Context, Result};

/// A fuzzing run going on beside the other steps.
pub struct Background {
    child: Child,
    log: PathBuf,
    started: Instant,
}

/// Starts `fuzz/run.sh SECS` in the background, its output into `fuzz/target/xtask-run.log`.
pub fn start(root: &Path, secs: u32) -> Result<Background> {
    let dir = root.join("fuzz/target");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let log = dir.join("xtask-run.log");
    let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let child = Command::new("nice")
        .args(["-n", "19", "bash"])
        .arg(root.join("fuzz/run.sh"))
        .arg(secs.to_string())
        .current_dir(root)
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting fuzz/run.sh")?;
    Ok(Background {
        child,
        log,
        started: Instant::now(),
    })
}

impl Background {
    /// Waits for the run, prints its output and how long it ran, and says whether it passed.
    pub fn finish(mut self) -> Result<()> {
        let status = self.child.wait().context("waiting for fuzz/run.sh")?;
        let took = self.started.elapsed().as_secs();
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        eprint!("{text}");
        eprintln!(
            "xtask: the fuzzing run took {} beside the other steps (its output: {})",
            crate::minutes(took),
            self.log.display()
        );
        crate::check(status, "fuzz/run.sh")
    }
}
