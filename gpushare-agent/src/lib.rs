//! gpushare-agent: attributes GPU processes to containers (eBPF, with a /proc fallback), samples
//! their GPU memory through NVML, and enforces per-workload quotas.
//!
//! Modules by layer; each uses only modules of its own layer or the layers above it, with no
//! import circle (`cargo xtask structure` checks), and data flows down this list. See
//! `docs/architecture.md`.
//!
//! Foundations (no other module of the agent):
//! - [`workload`]: cgroup path -> workload identity and root cgroup (pure).
//! - [`sample`]: what one NVML sample saw (plain data).
//! - [`sys`]: `/proc/self/mountinfo`, `/proc/<pid>/cgroup` and `/proc/<pid>/status`, read as
//!   bytes (the `gpushare-base` crate's, shared with the test kit and xtask).
//! - [`shown`]: names a tenant chooses, escaped for a terminal or a log.
//! - [`ebpf`]: loading the kernel programs, draining their ring buffer and counters.
//! - [`cuda`]: the CUDA checkpoint driver API, loaded at run time for `suspend`.
//! - [`client`]: the HTTP client of `status`, `release` and the tests (`gpushare-base`'s).
//!
//! Sources:
//! - [`trace`]: the timeline of the last allocation-triggered reaction.
//! - [`verify`]: every grant proven held: the mechanisms that claim it and the verdict (pure).
//! - [`nvml`]: GPU memory per process from NVML.
//! - [`quota`]: quota files, environment quotas, selectors, sizes and durations (pure).
//! - [`attribution`]: which workload each GPU task belongs to (eBPF events, `/proc`).
//! - [`kube`]: the kubelet's pod-resources API, read in the background (a quota source).
//!
//! Deciding and acting:
//! - [`policy`]: the pure policy core: state, samples, quotas -> state, actions.
//! - [`enforce`]: executors of the policy's actions (freeze, suspend, signal, kill).
//! - [`launch`]: `gpushare-agent launch`, a command run with a GPU-memory reservation.
//!
//! Reporting:
//! - [`snapshot`]: the agent's state as readers see it, rebuilt after each step.
//! - [`metrics`]: `/metrics`, encoded from the latest snapshot; [`metrics::compat`]: other
//!   systems' metric names (HAMi, Volcano, dcgm-exporter) for the same values.
//! - [`status`]: the `status` table and the `check` listing (pure renderings).
//! - [`api`]: the HTTP endpoints and the local socket.
//!
//! The agent:
//! - [`agent`]: one step, observe, decide, act, publish.
//! - [`run`]: the event loop: when the agent steps (timers, kernel events, signals, reloads).
//! - [`cli`]: the command-line flags.
#![deny(missing_docs)]

pub mod agent;
pub mod api;
pub mod attribution;
pub mod cli;
pub use gpushare_base::client;
pub mod crash;
pub mod cuda;
pub mod drain_pace;
pub mod ebpf;
pub mod enforce;
pub mod grants;
pub mod kube;
pub mod launch;
pub mod metrics;
pub mod nvml;
pub mod observe;
pub mod policy;
pub mod quota;
pub mod run;
pub mod sample;
pub mod shown;
pub mod snapshot;
pub mod status;
pub use gpushare_base::sys;
pub mod ticker;
pub mod trace;
pub mod verify;
pub mod workload;
