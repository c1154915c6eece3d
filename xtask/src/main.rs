//! `cargo xtask`: what cargo cannot do alone: set up a fresh machine, run the agent as root, run the
//! whole test suite (lints included) the way CI does, and run the benchmarks.

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, Subcommand};

// The agent's own client.
use gpushare_base::client;
mod deb;
mod demo;
mod fuzzing;
mod image;
mod one_build;
mod structure;
mod upgrade_base;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "gpushare developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the project needs (apt packages, rust-src, bpf-linker, tracefs, test venv).
    Setup,
    /// Build and run the agent as root with its defaults; extra arguments go to the agent.
    Run {
        /// Arguments for gpushare-agent, after `--`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Everything CI checks: fmt, clippy (host crates and the eBPF crate), and all tests.
    Test {
        /// Skip fmt and clippy.
        #[arg(long)]
        no_lint: bool,
        /// Skip the bounded fuzzing run.
        #[arg(long)]
        no_fuzz: bool,
        /// Extra arguments for `cargo test` (e.g. a test name filter), after `--`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the benchmarks and print their tables.
    Bench,
    /// Check the structural limits of the agent's source (file sizes in policy/, enforce/mod.rs,
    /// no import cycle between its modules); a step of `test` too.
    Structure,
    /// Build the mock libnvidia-ml and the mock libcuda and install them as
    /// target/fake-nvml/libnvidia-ml.so.1 and target/fake-nvml/libcuda.so.1.
    FakeNvml,
    /// Build the agent's container image (release build, no base image):
    /// target/image/gpushare-agent-<version>.tar, an OCI layout and a Docker archive in one
    /// (`docker load -i`, `skopeo copy docker-archive:...`, `ctr images import`).
    Image,
    /// A guided end-to-end run without a GPU: launch three services on mock GPUs, start the agent,
    /// grow one past its quota and watch it being signalled and frozen, release it, clean up (root).
    Demo {
        /// Short waits and no pauses (for CI). Without it the demo pauses between acts: until Enter
        /// on a terminal, a few seconds otherwise.
        #[arg(long)]
        fast: bool,
    },
    /// Build (once) the agent an upgrade starts from (commit d504d15, before the workload-key
    /// change) into target/upgrade-base/ and print its path: what `test` does for the upgrade
    /// test. By hand: `GPUSHARE_UPGRADE_BASE_AGENT=$(cargo xtask upgrade-base) cargo test ...`.
    UpgradeBase,
    /// Build the Debian package target/deb/gpushare-agent_<version>_<arch>.deb (dpkg-deb).
    Deb {
        /// Then install it here without starting the service, remove and purge it, and check
        /// what it leaves (root; a step of `test`).
        #[arg(long)]
        test: bool,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let root = gpushare_testkit::workspace_root();
    match cli.command {
        Cmd::Setup => setup(&root, false),
        Cmd::Run { args } => {
            setup(&root, true)?;
            build_release(&root)?;
            let bin = root.join("target/release/gpushare-agent");
            let mut cmd = as_root(&bin);
            cmd.args(&args);
            eprintln!("xtask: running {} {}", bin.display(), args.join(" "));
            let status = cmd.status().context("starting gpushare-agent")?;
            if !status.success() {
                bail!("gpushare-agent exited with {status}");
            }
            Ok(())
        }
        Cmd::Test {
            no_lint,
            no_fuzz,
            args,
        } => {
            step("setup: what this machine lacks (scripts/setup.sh)");
            setup(&root, true)?;
            // Every step runs; failures are collected and reported together at the end, and so
            // is every step that did not run: a skip is never silent.
            let mut failed: Vec<String> = Vec::new();
            let mut skipped: Vec<String> = Vec::new();
            let mut skip = |what: &str| {
                eprintln!("\nxtask: !!! SKIPPED {what} !!!\n");
                skipped.push(what.to_string());
            };
            if no_lint {
                skip("fmt and clippy (--no-lint)");
            }
            let mut run_step = |name: &str, res: Result<()>| {
                if let Err(e) = res {
                    eprintln!("xtask: FAILED: {name}: {e:#}");
                    failed.push(name.to_string());
                }
            };
            if !no_lint {
                step("cargo fmt --check");
                run_step("fmt", cargo(&root, &["fmt", "--all", "--check"]));
                step("clippy (host crates)");
                run_step(
                    "clippy",
                    cargo(&root, &["clippy", "--all-targets", "--", "-D", "warnings"]),
                );
                step("clippy (eBPF crate, nightly, bpfel)");
                run_step("clippy (eBPF)", clippy_ebpf(&root));
                step("fmt and clippy (fuzz/, outside the workspace)");
                run_step("fmt and clippy (fuzz)", lint_fuzz(&root));
            }
            step("structure: sizes, cycles, purity, long functions, copies, one build");
            run_step("structure", structure::check(&root));
            step("build");
            cargo(&root, &["build"])?;
            let lib = install_fake_nvml(&root)?;
            step("deploy: Kubernetes manifests, systemd unit, example quotas, alert rules");
            run_step(
                "deploy/validate.sh",
                Command::new("bash")
                    .arg(root.join("deploy/validate.sh"))
                    .current_dir(&root)
                    .status()
                    .context("running deploy/validate.sh")
                    .and_then(|s| check(s, "deploy/validate.sh")),
            );
            if is_root() {
                step("demo (non-interactive)");
                run_step("demo", demo::run(&root, true, lib.clone()));
            } else {
                skip(
                    "the demo: it needs root (cgroups, a device node, eBPF); run as root, as CI does",
                );
            }
            // Before the tests: gpushare-agent/tests/image.rs runs the archive in Docker.
            step("image: release build, the archive built twice (one digest)");
            run_step("image", image::build_checked(&root).map(drop));
            // Before the tests: the upgrade test starts from the agent of the main before the key
            // change of issue 20.
            step("the agent an upgrade starts from (d504d15; built once into target/upgrade-base)");
            let base = upgrade_base::build(&root);
            let base = match base {
                Ok(bin) => Some(bin),
                Err(e) => {
                    run_step("the upgrade's base agent", Err(e));
                    None
                }
            };
            let fuzz = if no_fuzz {
                skip("the fuzzing run (--no-fuzz)");
                None
            } else {
                step("fuzz (bounded: 15 s per target), beside the tests at nice 19");
                fuzzing::start(&root, 15)
                    .map_err(|e| run_step("fuzz", Err(e)))
                    .ok()
            };
            step("tests");
            let mut test = vec!["test", "--no-fail-fast"];
            test.extend(args.iter().map(String::as_str));
            let mut cmd = Command::new("cargo");
            cmd.current_dir(&root).args(&test);
            if let Some(bin) = &base {
                cmd.env(upgrade_base::ENV, bin);
            }
            if is_root() {
                // Where everything can run (root, as CI), a test that skips fails instead.
                cmd.env(gpushare_testkit::skip::REQUIRE_ENV, "1");
            } else {
                skip(
                    "the tests that need root, and any that lacks something (each says SKIPPED \
                     above); run as root, as CI does",
                );
            }
            run_step(
                "cargo test",
                cmd.status()
                    .context("running cargo test")
                    .and_then(|s| check(s, "cargo test")),
            );
            // Alone, after the tests: it installs and purges a system package.
            if is_root() {
                step("Debian package: build, install, thaw on removal, purge");
                run_step(
                    "deb --test",
                    deb::build(&root).and_then(|d| deb::test(&root, &d, &lib)),
                );
            } else {
                skip("the Debian package's test: it needs root (dpkg -i); run as root, as CI does");
            }
            // Each bench once in its quick mode (a few iterations, figures not judged), so a
            // bench that no longer works fails the run. Debug builds: the tests' build serves.
            for (package, bench, needs_root) in BENCHES {
                if needs_root && !is_root() {
                    skip(&format!("bench {package}/{bench} (quick): it needs root"));
                    continue;
                }
                step(&format!(
                    "bench {package}/{bench} (quick mode, figures not judged)"
                ));
                let mut cmd = Command::new("cargo");
                cmd.current_dir(&root)
                    .args(["test", "--quiet", "-p", package, "--bench", bench])
                    .env("GPUSHARE_BENCH_QUICK", "1");
                run_step(
                    &format!("bench {package}/{bench} (quick)"),
                    cmd.status()
                        .context("running a bench")
                        .and_then(|s| check(s, &format!("bench {bench}"))),
                );
            }
            if let Some(fuzz) = fuzz {
                step("fuzz: waiting for the run beside the tests");
                run_step("fuzz", fuzz.finish());
            }
            verdict(&failed, &skipped)
        }
        Cmd::Bench => {
            setup(&root, true)?;
            cargo(&root, &["build"])?;
            build_release(&root)?;
            install_fake_nvml(&root)?;
            for (package, bench, _) in BENCHES {
                step(&format!("bench {package}/{bench}"));
                let mut cmd = as_root_cargo(&root);
                cmd.args(["bench", "--quiet", "-p", package, "--bench", bench]);
                check(cmd.status()?, &format!("bench {bench}"))?;
            }
            Ok(())
        }
        Cmd::Structure => structure::check(&root),
        Cmd::UpgradeBase => {
            println!("{}", upgrade_base::build(&root)?.display());
            Ok(())
        }
        Cmd::Deb { test } => {
            let deb = deb::build(&root)?;
            if test {
                ensure!(
                    is_root(),
                    "the package's test needs root: `sudo -E cargo xtask deb --test`"
                );
                let lib = build_mocks(&root)?;
                deb::test(&root, &deb, &lib)?;
            }
            Ok(())
        }
        Cmd::FakeNvml => build_mocks(&root).map(drop),
        Cmd::Image => image::build(&root).map(drop),
        Cmd::Demo { fast } => {
            if !is_root() {
                bail!(
                    "the demo needs root (cgroups, a device node, eBPF): run `sudo -E cargo xtask demo`"
                );
            }
            setup(&root, true)?;
            step("build");
            cargo(&root, &["build"])?;
            let lib = install_fake_nvml(&root)?;
            demo::run(&root, fast, lib)
        }
    }
}

/// Builds the mock libnvidia-ml and libcuda and installs them (see [`install_fake_nvml`]).
fn build_mocks(root: &Path) -> Result<PathBuf> {
    cargo(
        root,
        &[
            "build",
            "-p",
            "gpushare-fake-nvml",
            "-p",
            "gpushare-fake-cuda",
        ],
    )?;
    install_fake_nvml(root)
}

/// The end of `cargo xtask test`: where the time went, then what failed and what did not run.
fn verdict(failed: &[String], skipped: &[String]) -> Result<()> {
    eprintln!("xtask: time by step, longest first: {}", step_times());
    if failed.is_empty() && skipped.is_empty() {
        eprintln!("xtask: all checks passed");
        Ok(())
    } else if failed.is_empty() {
        eprintln!(
            "xtask: the checks that ran passed; NOT RUN: {}",
            skipped.join("; ")
        );
        Ok(())
    } else {
        bail!("failed: {}", failed.join(", "))
    }
}

/// The steps begun so far, with when: a long run says where its time went (CI's budget is 45
/// minutes on a 2-core machine).
static STEPS: std::sync::Mutex<Vec<(String, std::time::Instant)>> =
    std::sync::Mutex::new(Vec::new());

fn step(name: &str) {
    let now = std::time::Instant::now();
    let mut steps = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let at = steps
        .first()
        .map_or(0, |(_, t0)| now.duration_since(*t0).as_secs());
    eprintln!("xtask: == {name}   [{}]", minutes(at));
    steps.push((name.to_string(), now));
}

/// `12m05s`.
fn minutes(secs: u64) -> String {
    format!("{}m{:02}s", secs / 60, secs % 60)
}

/// Each step's duration (to the next step's start, the last to now), longest first.
fn step_times() -> String {
    let steps = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    times_of(&steps, std::time::Instant::now())
}

/// What [`step_times`] says of `steps` at `now`.
fn times_of(steps: &[(String, std::time::Instant)], now: std::time::Instant) -> String {
    let mut times: Vec<(&str, u64)> = steps
        .iter()
        .enumerate()
        .map(|(i, (name, t))| {
            let end = steps.get(i + 1).map_or(now, |(_, next)| *next);
            (name.as_str(), end.duration_since(*t).as_secs())
        })
        .collect();
    times.sort_by_key(|t| std::cmp::Reverse(t.1));
    let total: u64 = times.iter().map(|(_, s)| s).sum();
    let each: Vec<String> = times
        .iter()
        .map(|(name, s)| format!("{} {name}", minutes(*s)))
        .collect();
    format!("{} in all: {}", minutes(total), each.join("; "))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

fn as_root(bin: &Path) -> Command {
    if is_root() {
        Command::new(bin)
    } else {
        let mut c = Command::new("sudo");
        c.arg("-E").arg(bin);
        c
    }
}

/// The benchmarks: package, bench, whether it needs root (eBPF, cgroups). `cargo xtask bench` runs
/// them in full; `cargo xtask test` runs each once in quick mode.
const BENCHES: [(&str, &str, bool); 7] = [
    ("gpushare-agent", "overhead", true),
    ("gpushare-agent", "sample", false),
    ("gpushare-fake-nvml", "sample", false),
    ("gpushare-agent", "metrics_render", false),
    ("gpushare-agent", "latency", true),
    ("gpushare-agent", "scale", true),
    ("gpushare-agent", "fleet", false),
];

fn as_root_cargo(root: &Path) -> Command {
    let mut c = if is_root() {
        Command::new("cargo")
    } else {
        let mut c = Command::new("sudo");
        c.args(["-E", "cargo"]);
        c
    };
    c.current_dir(root);
    c
}

/// Runs scripts/setup.sh; with `only_if_missing`, first asks it whether anything is missing.
fn setup(root: &Path, only_if_missing: bool) -> Result<()> {
    let script = root.join("scripts/setup.sh");
    if only_if_missing {
        let ok = Command::new("bash")
            .arg(&script)
            .arg("--check")
            .stderr(std::process::Stdio::null())
            .status()?;
        if ok.success() {
            return Ok(());
        }
        eprintln!(
            "xtask: this machine is missing some of what gpushare needs; running scripts/setup.sh"
        );
    }
    check(
        Command::new("bash")
            .arg(&script)
            .status()
            .context("running scripts/setup.sh")?,
        "setup",
    )
}

fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    let status = Command::new("cargo")
        .current_dir(root)
        .args(args)
        .status()?;
    check(status, &format!("cargo {}", args.join(" ")))
}

/// The agent optimised, and the mock NVML too: it runs inside the agent's process in the footprint.
pub(crate) fn build_release(root: &Path) -> Result<()> {
    cargo(
        root,
        &[
            "build",
            "--release",
            "-p",
            "gpushare-agent",
            "-p",
            "gpushare-fake-nvml",
        ],
    )
}

fn check(status: std::process::ExitStatus, what: &str) -> Result<()> {
    if status.success() {
        Ok(())
    } else {
        bail!("{what} failed ({status})")
    }
}

fn clippy_ebpf(root: &Path) -> Result<()> {
    let status = Command::new("cargo")
        .current_dir(root.join("gpushare-ebpf"))
        .args([
            "+nightly",
            "clippy",
            "-p",
            "gpushare-ebpf",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--release",
            "--",
            "-D",
            "warnings",
        ])
        .env_remove("RUSTUP_TOOLCHAIN")
        .status()?;
    check(status, "clippy of gpushare-ebpf")
}

/// fmt and clippy of the fuzz targets, which are outside the workspace (cargo-fuzz builds them
/// with nightly and sanitizer flags the workspace must never see). Clippy runs on stable, like the
/// workspace's, in the workspace's target directory so the dependencies it already checked are
/// reused (the fuzz crate's own lock file pins the same versions).
fn lint_fuzz(root: &Path) -> Result<()> {
    let manifest = root.join("fuzz/Cargo.toml");
    let manifest = manifest
        .to_str()
        .context("a workspace path that is not UTF-8")?;
    cargo(root, &["fmt", "--check", "--manifest-path", manifest])?;
    let status = Command::new("cargo")
        .current_dir(root)
        // --locked: a lock file that no longer matches fails here, where it was once rewritten
        // by every run (and the tree left dirty).
        .args([
            "clippy",
            "--locked",
            "--manifest-path",
            manifest,
            "--all-targets",
        ])
        .args(["--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", root.join("target"))
        .status()?;
    check(status, "clippy of fuzz/")
}

fn install_fake_nvml(root: &Path) -> Result<PathBuf> {
    install_fake_nvml_profile(root, "debug")
}

/// Copies the built mocks to target/fake-nvml/: libnvidia-ml.so.1 (+ libnvidia-ml.so link) and
/// libcuda.so.1 (+ libcuda.so). Returns the path of the mock libnvidia-ml.
fn install_fake_nvml_profile(root: &Path, profile: &str) -> Result<PathBuf> {
    let dir = root.join("target/fake-nvml");
    for (crate_name, what) in [
        ("fake_nvml", "the mock libnvidia-ml"),
        ("fake_cuda", "the mock libcuda"),
    ] {
        let built = root.join(format!("target/{profile}/libgpushare_{crate_name}.so"));
        let installer = root.join(format!(
            "target/{profile}/gpushare-{}-install",
            crate_name.replace('_', "-")
        ));
        let status = Command::new(&installer)
            .arg("--from")
            .arg(&built)
            .arg("--to")
            .arg(&dir)
            .status()
            .with_context(|| format!("running {}", installer.display()))?;
        check(status, &format!("installing {what}"))?;
    }
    Ok(dir.join("libnvidia-ml.so.1"))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::times_of;

    #[test]
    fn each_step_runs_to_the_next_and_the_longest_comes_first() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let steps = vec![
            ("clippy".to_string(), at(0)),
            ("build".to_string(), at(65)),
            ("tests".to_string(), at(70)),
        ];
        assert_eq!(
            times_of(&steps, at(670)),
            "11m10s in all: 10m00s tests; 1m05s clippy; 0m05s build"
        );
        assert_eq!(times_of(&[], at(1)), "0m00s in all: ");
    }
}
