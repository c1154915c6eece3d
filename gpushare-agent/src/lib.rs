//! gpushare-agent: attributes GPU processes to containers (eBPF, with a /proc fallback), samples
//! their GPU memory through NVML, and enforces per-workload quotas.
//!
//! Data flows one way: kernel events and `/proc` feed [`attribution`]; [`nvml`] samples memory;
//! [`run`] ties them to the clock and to signals. See `docs/architecture.md`.
#![deny(missing_docs)]

pub mod agent;
pub mod api;
pub mod attribution;
pub mod cli;
pub mod client;
pub mod cuda;
pub mod ebpf;
pub mod enforce;
pub mod launch;
pub mod metrics;
pub mod nvml;
pub mod policy;
pub mod quota;
pub mod run;
pub mod sample;
pub mod snapshot;
pub mod status;
pub mod sys;
pub mod trace;
pub mod workload;
