//! Command-line flags. Parsing and validation only: nothing here touches the system.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::quota::{parse_duration, parse_nonzero_duration};

/// The commit the agent was built from: 12 hex digits of `git rev-parse`, `-dirty` when the
/// checkout had changes, `unknown` when built outside a git checkout (build.rs).
pub const COMMIT: &str = env!("GPUSHARE_COMMIT");

/// What `--version` prints after the program's name.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GPUSHARE_COMMIT"),
    ")"
);

/// gpushare node agent: attributes GPU processes to containers with eBPF and enforces per-container
/// GPU-memory quotas.
#[derive(Debug, Parser)]
#[command(name = "gpushare-agent", version = VERSION, about, long_about = None)]
pub struct Cli {
    /// What to do; running the agent is the default.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Options of the agent itself (used when no subcommand is given).
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate quota files and print the effective quotas; exit 0 when valid, 1 otherwise.
    Check {
        /// The main quota file (its sibling `quotas.d/` is read too).
        #[arg(value_name = "PATH", default_value = DEFAULT_QUOTAS)]
        path: PathBuf,
        /// libcuda to check the `suspend` step against (default: the system's libcuda.so.1).
        #[arg(long, value_name = "PATH")]
        cuda_lib: Option<PathBuf>,
    },
    /// Show GPUs, workloads, quotas and isolation states of the running agent.
    Status {
        /// Print the agent's state as JSON.
        #[arg(long)]
        json: bool,
        /// Exit 1 when any grant is unenforced or violated (a cron job's or a probe's check), 2
        /// when no agent answers; 0 when every grant is held (docs/verify.md).
        #[arg(long)]
        verify: bool,
        /// The agent's local socket (root only: the state names every workload's processes).
        #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Release a workload: thaw it if frozen and restart its ladder (root; local socket).
    Release {
        /// Workload key (`docker://<id>`), container id or a unique prefix of it.
        workload: String,
        /// The agent's local socket.
        #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Undo every freeze the agent made, without a running agent (root).
    ///
    /// Thaws each group listed in the state directory's freeze ledger or marked on the cgroups
    /// with that state directory (so it works with a lost or corrupt ledger), and nothing else: a
    /// `docker pause` or an operator's freeze is left alone. A suspended workload is restored only
    /// where its GPUs have room for it now (judged through NVML); each one left suspended is
    /// named with the reason, and the exit status is then 1. Refuses while an agent holds the
    /// state directory (use `release` then).
    Thaw {
        /// Thaw everything the agent froze (required: there is no partial form yet).
        #[arg(long, required = true)]
        all: bool,
        /// The agent's state directory.
        #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// Go on even though an agent seems to hold the state directory.
        #[arg(long)]
        force: bool,
        /// libcuda to restore suspended workloads with (default: the system's libcuda.so.1).
        #[arg(long, value_name = "PATH")]
        cuda_lib: Option<PathBuf>,
        /// libnvidia-ml to judge the room on the GPUs with (default: the system's
        /// libnvidia-ml.so.1).
        #[arg(long, value_name = "PATH")]
        nvml_lib: Option<PathBuf>,
        /// Restore suspended workloads even where the GPU has no room for them (or NVML cannot
        /// tell): a restore that runs out of GPU memory can leave a process unrestorable.
        #[arg(long)]
        restore_without_room: bool,
    },
    /// Run a command as a service with a GPU-memory reservation (root).
    ///
    /// Picks a GPU that can hold the reservation, creates the cgroup /gpushare.slice/NAME.scope,
    /// registers the quota for the agent, runs the command there, and removes both when it exits.
    Launch(Box<crate::launch::LaunchArgs>),
}

pub use crate::{
    api::{DEFAULT_LISTEN, DEFAULT_SOCKET},
    quota::file::{DEFAULT_QUOTAS, RUNTIME_QUOTAS_DIR},
};
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpushare";

/// Options of a running agent.
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// How often NVML is sampled, e.g. `1s`, `500ms`.
    #[arg(long, default_value = "1s", value_parser = parse_nonzero_duration)]
    pub interval: Duration,
    /// How often the GPU task table is reconciled against /proc and the kernel's table.
    #[arg(long, default_value = "10s", value_parser = parse_nonzero_duration)]
    pub reconcile_interval: Duration,
    /// Path of libnvidia-ml to load (default: the system's libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Path of libcuda to load (default: the system's libcuda.so.1); loaded only for the
    /// `suspend` step (CUDA checkpoint API, NVIDIA driver r570+).
    #[arg(long, value_name = "PATH")]
    pub cuda_lib: Option<PathBuf>,
    /// The kernel log the NVIDIA driver writes its Xid reports to: a process restored from a
    /// checkpoint whose context faults is checkpointed again and ended before it can hang the
    /// host (cuda-checkpoint #53). Read only with the `suspend` step's libcuda loaded.
    #[arg(long, value_name = "PATH", default_value = crate::observe::faults::DEFAULT_KERNEL_LOG)]
    pub kernel_log: PathBuf,
    /// Do not load the eBPF programs; attribute GPU processes through /proc only.
    #[arg(long)]
    pub no_ebpf: bool,
    /// Least time between two allocation events of one GPU task.
    #[arg(long, default_value = "20ms", value_parser = parse_nonzero_duration)]
    pub alloc_event_min_interval: Duration,
    /// Main quota file; its sibling `quotas.d/*.toml` and /run/gpushare/quotas.d are read too.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_QUOTAS)]
    pub quotas: PathBuf,
    /// Runtime quota drop-in directory (where `launch` registers quotas).
    #[arg(long, value_name = "DIR", default_value = RUNTIME_QUOTAS_DIR)]
    pub runtime_quotas: PathBuf,
    /// Address of /metrics and /healthz (nothing else is served on TCP).
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    pub listen: std::net::SocketAddr,
    /// Export a GPU-memory series per process (`gpushare_process_gpu_memory_used_bytes`, labelled
    /// with pid and process name). Off by default: whoever reaches the listener reads them.
    #[arg(long)]
    pub process_metrics: bool,
    /// The local API socket (/api/v1/state, release), root only.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Where the freeze ledger and the last good quota configuration are kept.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Decide and report, but freeze, signal and kill nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// On SIGTERM, leave workloads the agent froze frozen (the next start reconciles them).
    #[arg(long)]
    pub keep_frozen_on_exit: bool,
    /// On SIGTERM, restore suspended workloads (where their GPU has room) only while this budget
    /// lasts; the rest stay suspended and recorded for the next agent. Keep it well below the
    /// stop grace (`TimeoutStopSec=` of the unit, `terminationGracePeriodSeconds` of the pod): a
    /// SIGKILL in the middle of a restore can strand the workload.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub shutdown_restore_budget: Duration,
    /// Also export other systems' metric names: `hami` (HAMi v2.9+), `volcano` (Volcano's vGPU
    /// monitor), `dcgm` (dcgm-exporter); repeat or separate with commas.
    #[arg(long, value_name = "SYSTEM", value_delimiter = ',', value_parser = ["hami", "volcano", "dcgm"])]
    pub compat: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_invocation_runs_the_agent_with_documented_defaults() {
        let cli = Cli::try_parse_from(["gpushare-agent"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.interval, Duration::from_secs(1));
        assert!(!cli.run.no_ebpf);
        let cli = Cli::try_parse_from(["gpushare-agent", "--interval", "x"]);
        assert!(cli.is_err());
    }

    #[test]
    fn compat_sets_are_comma_separated_or_repeated_and_known() {
        let cli = Cli::try_parse_from([
            "gpushare-agent",
            "--compat",
            "hami,dcgm",
            "--compat",
            "volcano",
        ])
        .unwrap();
        assert_eq!(cli.run.compat, ["hami", "dcgm", "volcano"]);
        let c = crate::metrics::Compat::from_names(&cli.run.compat);
        assert!(c.hami && c.dcgm && c.volcano);
        assert!(Cli::try_parse_from(["gpushare-agent", "--compat", "hami,dcgmm"]).is_err());
        assert!(
            Cli::try_parse_from(["gpushare-agent"])
                .unwrap()
                .run
                .compat
                .is_empty()
        );
    }
}
