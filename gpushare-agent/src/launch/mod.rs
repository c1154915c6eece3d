//! `gpushare-agent launch`: run a command as a service with a GPU-memory reservation.
//!
//! Design note. A launch
//!
//! 1. lists the GPUs through NVML and, under an exclusive `flock` on `<runtime dir>/.launch.lock`,
//!    adds up what quotas already claim on each GPU (the operator's files and the runtime drop-ins
//!    other launches wrote), picks a GPU ([`placement`]: best fit, or `--spread`), creates the
//!    service's cgroup `/gpushare.slice/<name>.scope` and writes the runtime drop-in
//!    `launch-<name>.toml` (an exact `cgroup` selector, `gpu = <index>`, the `--action` ladder),
//!    then releases the lock. Concurrent launches are serialized by the lock, not by luck.
//! 2. spawns the command with `CUDA_VISIBLE_DEVICES`/`NVIDIA_VISIBLE_DEVICES` set to the GPU's
//!    UUID; the child moves itself into the group between fork and exec, so nothing it starts can
//!    escape attribution. The launcher stays outside the group, so a freeze of the service never
//!    freezes the process that must clean up after it.
//! 3. waits, passing SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the launcher on to the service
//!    (signals the terminal sent to the whole foreground process group are not sent twice); when
//!    the service has not stopped `--stop-timeout` after SIGINT/SIGTERM (a frozen one cannot), the
//!    group is killed.
//! 4. when the service exits: ends what is left in the group (SIGTERM, then SIGKILL), removes the
//!    group and the drop-in, and exits with the command's status (128+N for a signal N).
//!
//! The agent need not run: it reads runtime drop-ins when it starts and watches their directory.
//! A launcher killed with SIGKILL cannot clean up; its drop-in names its pid and start time, and
//! the next launch removes it once that process is gone and the group is empty.
//!
//! Exit codes of the launcher itself: 125 when nothing was started (no GPU fits, bad arguments,
//! not root), 126 when the command cannot be executed, 127 when it is not found.

pub mod placement;
pub mod registry;
pub mod scope;
pub mod spec;

use std::{
    ffi::OsString,
    os::unix::process::{CommandExt, ExitStatusExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, ExitStatus},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::Args;

use self::{
    placement::{GpuCapacity, Strategy, Wanted},
    registry::Registry,
    scope::Scope,
    spec::{Owner, Registration},
};
use crate::{
    attribution::cgroupfs,
    nvml::{DriverStatus, NvmlSampler},
    quota::{
        ByteSize, LadderStep,
        file::{DEFAULT_QUOTAS, RUNTIME_QUOTAS_DIR},
        load_dir_set, parse_nonzero_duration, parse_size,
    },
};

/// Exit code when nothing was started.
pub const EXIT_LAUNCH_FAILED: u8 = 125;
/// Exit code when the command exists but cannot be executed.
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit code when the command is not found.
pub const EXIT_NOT_FOUND: u8 = 127;

/// `gpushare-agent launch` options.
#[derive(Clone, Debug, Args)]
#[command(override_usage = "gpushare-agent launch --gpu-mem SIZE [OPTIONS] -- COMMAND [ARGS]...")]
#[command(after_help = "\
Examples:
  gpushare-agent launch --gpu-mem 4GiB -- python train.py
  gpushare-agent launch --gpu-mem 20GiB --gpu 1 --name infer --action alert,signal,freeze -- ./serve
  gpushare-agent launch --gpu-mem 8GiB --spread --action signal:SIGTERM@0s,kill@30s -- ./job

--action takes `none` (observe only) or comma-separated steps ACTION[:SIGNAL][@AFTER], ACTION one of
alert, signal (default SIGUSR1), freeze, kill (default SIGKILL), in that order; AFTER is how long the
service has been over quota when the step fires (never before --grace has passed), by default 0s, 5s, 15s
and 30s respectively. Without --action the quota file's [defaults] ladder applies.

Exit status: the command's (128+N when a signal N ended it); 125 when nothing was started, 126 when the
command cannot be executed, 127 when it is not found.")]
pub struct LaunchArgs {
    /// GPU memory to reserve and enforce, e.g. `4GiB`, `512MiB`.
    #[arg(long, value_name = "SIZE", value_parser = parse_gpu_mem)]
    pub gpu_mem: u64,
    /// Put the service on this GPU (NVML index or UUID) instead of choosing one.
    #[arg(long, value_name = "UUID|INDEX", value_parser = Wanted::parse)]
    pub gpu: Option<Wanted>,
    /// Service name; its cgroup is /gpushare.slice/NAME.scope (default: the command's name and a
    /// unique suffix).
    #[arg(long, value_name = "NAME", value_parser = parse_name)]
    pub name: Option<String>,
    /// What the agent does when the service goes over its quota (see below).
    #[arg(long, value_name = "STEPS", value_parser = parse_action)]
    pub action: Option<Ladder>,
    /// How long the service may stay over quota before the first step (default: the quota file's).
    #[arg(long, value_name = "DURATION", value_parser = crate::quota::parse_duration)]
    pub grace: Option<Duration>,
    /// Choose the GPU with the most free memory (balance) instead of the tightest fit.
    #[arg(long)]
    pub spread: bool,
    /// libnvidia-ml to load (default: the system's libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// The operator's main quota file (with its sibling quotas.d/): quotas there that name a GPU
    /// count as reserved.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_QUOTAS)]
    pub quotas: PathBuf,
    /// Runtime drop-in directory, where the registration is written (as the agent's).
    #[arg(long, value_name = "DIR", default_value = RUNTIME_QUOTAS_DIR)]
    pub runtime_quotas: PathBuf,
    /// After SIGINT/SIGTERM, how long the service may take to stop before its group is killed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_nonzero_duration)]
    pub stop_timeout: Duration,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// The command and its arguments (after `--`).
    #[arg(
        value_name = "COMMAND",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(OsString)
    )]
    pub command: Vec<OsString>,
}

fn parse_gpu_mem(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Ok(0) => Err("the reservation must be more than 0".into()),
        Ok(b) => Ok(b),
        Err(e) => Err(e.to_string()),
    }
}

/// A parsed `--action` (a newtype, so clap takes it as one value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ladder(pub Vec<LadderStep>);

fn parse_action(s: &str) -> Result<Ladder, String> {
    spec::parse_actions(s).map(Ladder)
}

fn parse_name(s: &str) -> Result<String, String> {
    spec::validate_name(s).map(|()| s.to_string())
}

/// Runs `launch`; the process's exit code.
pub fn main(args: LaunchArgs) -> ExitCode {
    if std::env::var_os("RUST_LOG").is_none() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    let signals = Signals::block();
    let mut service = match prepare(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpushare-agent launch: error: {e:#}");
            return ExitCode::from(EXIT_LAUNCH_FAILED);
        }
    };
    let code = service.run(&args, &signals);
    let problems = service.cleanup();
    for p in &problems {
        eprintln!("gpushare-agent launch: warning: {p}");
    }
    ExitCode::from(code)
}

/// A registered service: its group and drop-in, removed on [`Service::cleanup`] or drop.
struct Service {
    name: String,
    gpu: GpuCapacity,
    bytes: u64,
    cgroup_root: PathBuf,
    scope: Scope,
    dropin: Option<PathBuf>,
    cleaned: bool,
}

fn gpus_from_nvml(lib: Option<&Path>) -> Result<Vec<GpuCapacity>> {
    let mut sampler = NvmlSampler::open(lib);
    if let DriverStatus::NoDriver { reason } = sampler.status() {
        bail!("cannot list GPUs: no NVIDIA driver ({reason})");
    }
    let sample = sampler.sample();
    Ok(sample
        .devices
        .iter()
        .map(|d| GpuCapacity {
            index: d.index,
            uuid: d.uuid.clone(),
            name: d.name.clone(),
            usable: d.memory_total.saturating_sub(d.memory_reserved),
            reserved: 0,
            quotas: 0,
        })
        .collect())
}

fn load_quotas(args: &LaunchArgs) -> Result<crate::quota::QuotaSet> {
    let dirs = [
        args.quotas
            .parent()
            .unwrap_or(Path::new("/"))
            .join("quotas.d"),
        args.runtime_quotas.clone(),
    ];
    load_dir_set(&args.quotas, &dirs).map_err(|errors| {
        let lines: Vec<String> = errors.iter().map(|e| format!("  {e}")).collect();
        anyhow::anyhow!(
            "the quota configuration is invalid, so reservations cannot be counted (fix it; `gpushare-agent check {}` shows the same):\n{}",
            args.quotas.display(),
            lines.join("\n")
        )
    })
}

fn prepare(args: &LaunchArgs) -> Result<Service> {
    let name = match &args.name {
        Some(n) => n.clone(),
        None => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let suffix = format!("{:x}{:03x}", std::process::id(), nanos >> 20);
            spec::default_name(&args.command[0], &suffix)
        }
    };
    spec::validate_name(&name).map_err(anyhow::Error::msg)?;
    let mut gpus = gpus_from_nvml(args.nvml_lib.as_deref())?;
    let cgroup_root = cgroupfs::find_cgroup2_mount()?;
    let owner_id = registry::own_identity()?;
    let registry = Registry::open(&args.runtime_quotas)?;

    let lock = registry.lock()?;
    registry.collect_stale(&lock, &cgroup_root);
    let set = load_quotas(args)?;
    placement::add_reservations(&set, &mut gpus);
    let strategy = if args.spread {
        Strategy::Spread
    } else {
        Strategy::BestFit
    };
    let pick = placement::choose(&gpus, args.gpu_mem, args.gpu.as_ref(), strategy)?;
    let gpu = gpus[pick].clone();
    let scope = Scope::create(&cgroup_root, &name)?;
    let mut service = Service {
        name: name.clone(),
        gpu: gpu.clone(),
        bytes: args.gpu_mem,
        cgroup_root,
        scope,
        dropin: None,
        cleaned: false,
    };
    let reg = Registration {
        name: name.clone(),
        gpu_index: gpu.index,
        gpu_uuid: gpu.uuid.clone(),
        bytes: args.gpu_mem,
        ladder: args.action.clone().map(|l| l.0),
        grace: args.grace,
        owner: Owner {
            pid: owner_id.pid,
            start_ticks: owner_id.start_ticks,
            cgroup: service.scope.rel().to_string(),
        },
    };
    let text = reg.render();
    let file = spec::file_name(&name);
    crate::quota::parse_str(&text, &file).map_err(|e| {
        anyhow::anyhow!(
            "internal error: the registration does not parse: {}",
            e.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )
    })?;
    service.dropin = Some(registry.write(&lock, &file, &text)?);
    // The agent loads all files or none: make sure this one does not break the set.
    load_quotas(args).context("after registering the service")?;
    drop(lock);
    Ok(service)
}

impl Service {
    /// Starts the command and waits for it; the exit code to report.
    fn run(&mut self, args: &LaunchArgs, signals: &Signals) -> u8 {
        if let Some(sig) = signals.pending_stop() {
            eprintln!(
                "gpushare-agent launch: {} before the service started; not starting it",
                signal_name(sig)
            );
            return 128 + sig as u8;
        }
        let procs = match self.scope.open_procs() {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("gpushare-agent launch: error: {e:#}");
                return EXIT_LAUNCH_FAILED;
            }
        };
        let mut cmd = Command::new(&args.command[0]);
        cmd.args(&args.command[1..])
            .env("CUDA_VISIBLE_DEVICES", &self.gpu.uuid)
            .env("NVIDIA_VISIBLE_DEVICES", &self.gpu.uuid)
            .env("GPUSHARE_LAUNCH_NAME", &self.name)
            .env("GPUSHARE_LAUNCH_CGROUP", self.scope.rel())
            .env("GPUSHARE_LAUNCH_GPU_INDEX", self.gpu.index.to_string())
            .env("GPUSHARE_LAUNCH_GPU_MEM", self.bytes.to_string());
        let unblocked = Signals::empty_set();
        // SAFETY: between fork and exec only async-signal-safe calls: sigprocmask and write(2).
        unsafe {
            cmd.pre_exec(move || {
                if libc::sigprocmask(libc::SIG_SETMASK, &unblocked, std::ptr::null_mut()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                scope::enter(&procs)
            });
        }
        if !args.quiet {
            eprintln!(
                "gpushare-agent launch: {} on GPU {} ({}, {}) with {} reserved; cgroup {}, quota {}",
                self.name,
                self.gpu.index,
                self.gpu.uuid,
                self.gpu.name,
                ByteSize(self.bytes),
                self.scope.rel(),
                self.dropin
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                eprintln!(
                    "gpushare-agent launch: cannot run {}: {e}",
                    args.command[0].to_string_lossy()
                );
                return match e.kind() {
                    std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                    _ => EXIT_CANNOT_EXECUTE,
                };
            }
        };
        drop(cmd); // closes our copy of cgroup.procs
        match supervise(&mut child, &self.scope, signals, args.stop_timeout) {
            Ok(status) => exit_code(status),
            Err(e) => {
                eprintln!("gpushare-agent launch: error: waiting for the service: {e:#}");
                EXIT_LAUNCH_FAILED
            }
        }
    }

    /// Ends what is left of the service and removes its group and drop-in. Idempotent; returns
    /// what could not be done.
    fn cleanup(&mut self) -> Vec<String> {
        if std::mem::replace(&mut self.cleaned, true) {
            return Vec::new();
        }
        let mut problems = Vec::new();
        // Processes the service left behind get SIGTERM and a moment, then SIGKILL.
        let dir = self.scope.dir();
        if scope::populated(dir) {
            for pid in self.scope.pids() {
                // SAFETY: kill(2) of a pid listed in the service's own group.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            let deadline = Instant::now() + Duration::from_secs(1);
            while scope::populated(dir) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if let Err(e) = self.scope.remove(Duration::from_secs(5)) {
            problems.push(format!("{e:#}"));
        }
        if let Some(p) = self.dropin.take()
            && let Err(e) = std::fs::remove_file(&p)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            problems.push(format!("removing {}: {e}", p.display()));
        }
        scope::remove_parent_if_empty(&self.cgroup_root);
        problems
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        for p in self.cleanup() {
            eprintln!("gpushare-agent launch: warning: {p}");
        }
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        _ => EXIT_LAUNCH_FAILED,
    }
}

fn signal_name(sig: i32) -> String {
    crate::quota::SIGNALS
        .iter()
        .find(|s| s.number == sig)
        .map(|s| s.name.to_string())
        .unwrap_or_else(|| format!("signal {sig}"))
}

/// Waits for the service, passing stop signals on; kills its group when it does not stop in time.
fn supervise(
    child: &mut Child,
    scope: &Scope,
    signals: &Signals,
    stop_timeout: Duration,
) -> Result<ExitStatus> {
    let pid = child.id() as i32;
    let mut stop_deadline: Option<Instant> = None;
    let mut killed = false;
    loop {
        if let Some(status) = child.try_wait().context("waitpid")? {
            return Ok(status);
        }
        if let Some((sig, code)) = signals.wait(Duration::from_millis(100))
            && sig != libc::SIGCHLD
        {
            // A signal a process sent (si_code <= 0) is passed on; one the kernel sent to the
            // terminal's foreground process group (Ctrl-C) reached the service already.
            if code <= 0 {
                // SAFETY: kill(2) of our own unreaped child: its pid cannot have been reused.
                unsafe { libc::kill(pid, sig) };
            }
            if matches!(sig, libc::SIGINT | libc::SIGTERM) && stop_deadline.is_none() {
                stop_deadline = Some(Instant::now() + stop_timeout);
            }
        }
        if !killed && stop_deadline.is_some_and(|d| Instant::now() >= d) {
            eprintln!(
                "gpushare-agent launch: the service did not stop within {stop_timeout:?}; killing its group"
            );
            scope::kill_group(scope.dir());
            killed = true;
        }
    }
}

/// The stop signals and SIGCHLD, blocked in the launcher and taken with `sigtimedwait`, so none is
/// lost between the checks and none kills the launcher before it has cleaned up.
struct Signals {
    all: libc::sigset_t,
    stop: libc::sigset_t,
}

const STOP_SIGNALS: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

impl Signals {
    fn empty_set() -> libc::sigset_t {
        // SAFETY: sigemptyset initialises the set it is given.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            set
        }
    }

    fn set_of(sigs: &[i32]) -> libc::sigset_t {
        let mut set = Self::empty_set();
        for &s in sigs {
            // SAFETY: adding a valid signal number to an initialised set.
            unsafe { libc::sigaddset(&mut set, s) };
        }
        set
    }

    /// Blocks them for the rest of the launcher's life (the service gets a clean mask). Also makes
    /// sure SIGCHLD is not ignored (an ignored SIGCHLD would reap the child before we could).
    fn block() -> Self {
        let mut all_sigs = STOP_SIGNALS.to_vec();
        all_sigs.push(libc::SIGCHLD);
        let s = Self {
            all: Self::set_of(&all_sigs),
            stop: Self::set_of(&STOP_SIGNALS),
        };
        // SAFETY: plain signal-mask and disposition calls on initialised sets.
        unsafe {
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            libc::pthread_sigmask(libc::SIG_BLOCK, &s.all, std::ptr::null_mut());
        }
        s
    }

    fn timed_wait(set: &libc::sigset_t, timeout: Duration) -> Option<(i32, i32)> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: sigtimedwait with an initialised set, a zeroed siginfo to fill and a timespec.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let sig = libc::sigtimedwait(set, &mut info, &ts);
            (sig > 0).then_some((sig, info.si_code))
        }
    }

    /// The next blocked signal within `timeout`: (number, si_code).
    fn wait(&self, timeout: Duration) -> Option<(i32, i32)> {
        Self::timed_wait(&self.all, timeout)
    }

    /// A stop signal that arrived already, if any.
    fn pending_stop(&self) -> Option<i32> {
        Self::timed_wait(&self.stop, Duration::ZERO).map(|(s, _)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        l: LaunchArgs,
    }

    #[test]
    fn arguments_parse_and_the_command_keeps_its_own_flags() {
        let t = T::try_parse_from([
            "x",
            "--gpu-mem",
            "4GiB",
            "--gpu",
            "1",
            "--name",
            "train",
            "--action",
            "alert,freeze@2s",
            "--spread",
            "--",
            "python",
            "-u",
            "--gpu-mem",
            "x",
        ])
        .unwrap();
        assert_eq!(t.l.gpu_mem, 4 << 30);
        assert_eq!(t.l.gpu, Some(Wanted::Index(1)));
        assert_eq!(t.l.name.as_deref(), Some("train"));
        assert_eq!(t.l.action.as_ref().map(|l| l.0.len()), Some(2));
        assert!(t.l.spread);
        assert_eq!(t.l.command, ["python", "-u", "--gpu-mem", "x"]);
        assert_eq!(t.l.runtime_quotas, Path::new(RUNTIME_QUOTAS_DIR));
        for bad in [
            vec!["x", "--gpu-mem", "4", "--", "a"],
            vec!["x", "--gpu-mem", "0GiB", "--", "a"],
            vec!["x", "--gpu-mem", "1GiB"],
            vec!["x", "--gpu-mem", "1GiB", "--name", "a/b", "--", "a"],
            vec![
                "x",
                "--gpu-mem",
                "1GiB",
                "--action",
                "freeze,alert",
                "--",
                "a",
            ],
            vec!["x", "--gpu-mem", "1GiB", "--gpu", "first", "--", "a"],
        ] {
            assert!(T::try_parse_from(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn exit_statuses_pass_through() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
