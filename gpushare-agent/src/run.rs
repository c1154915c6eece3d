//! The agent's event loop: signals, kernel events, periodic sampling and reconciliation.

use std::{os::fd::OwnedFd, time::Duration};

use anyhow::{Context, Result};
use log::info;
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
    time::{MissedTickBehavior, interval},
};

use crate::{
    attribution::{Change, tracker::Tracker},
    cli::RunArgs,
    ebpf::LoadOptions,
    nvml,
};

/// How often pending no-wakeup events are drained.
const DRAIN_INTERVAL: Duration = Duration::from_millis(100);

/// Runs the agent until SIGINT or SIGTERM.
pub async fn run(args: RunArgs) -> Result<()> {
    // Signal streams first, so a signal during start-up is not lost.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

    let load = LoadOptions {
        alloc_event_min_interval_ns: args.alloc_event_min_interval.as_nanos() as u64,
        only: None,
    };
    let mut tracker = Tracker::start(&load, args.no_ebpf)?;
    let mut sampler = nvml::NvmlSampler::open(args.nvml_lib.as_deref());
    let mut last_sample = None;

    let events_fd: Option<AsyncFd<OwnedFd>> = match tracker.kernel() {
        Some(k) => {
            let fd = k
                .events_fd()
                .try_clone_to_owned()
                .context("duplicating the ring-buffer fd")?;
            // SAFETY: the AsyncFd owns the duplicated fd and deregisters it before closing it.
            Some(
                unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                    .map_err(|e| anyhow::anyhow!("registering the ring-buffer fd: {e}"))?,
            )
        }
        None => None,
    };

    let mut drain = interval(DRAIN_INTERVAL);
    let mut sample = interval(args.interval);
    let mut reconcile = interval(args.reconcile_interval);
    for t in [&mut drain, &mut sample, &mut reconcile] {
        t.set_missed_tick_behavior(MissedTickBehavior::Delay);
    }
    info!(
        "gpushare agent running (sample interval {:?}); SIGINT or SIGTERM stops it",
        args.interval
    );

    loop {
        tokio::select! {
            biased;
            _ = sigint.recv() => { info!("SIGINT received"); break; }
            _ = sigterm.recv() => { info!("SIGTERM received"); break; }
            ready = readable(&events_fd) => {
                if let Ok(mut guard) = ready { guard.clear_ready(); }
                let changes = tracker.poll();
                log_changes(&tracker, changes);
            }
            _ = drain.tick() => {
                let changes = tracker.poll();
                log_changes(&tracker, changes);
            }
            _ = sample.tick() => {
                tracker.refresh_ioctl_counts();
                let s = sampler.sample();
                attribute_sampled_pids(&mut tracker, &s);
                log_sample(&tracker, &s);
                last_sample = Some(s);
            }
            _ = reconcile.tick() => { tracker.reconcile(); }
        }
    }
    info!("shutting down: detaching eBPF programs");
    drop(events_fd);
    drop(tracker);
    drop(last_sample);
    info!("stopped");
    Ok(())
}

/// Pids NVML reports that no kernel event announced (eBPF unavailable, or started before the
/// agent) are attributed through /proc.
fn attribute_sampled_pids(tracker: &mut Tracker, sample: &crate::sample::GpuSample) {
    for p in &sample.processes {
        if tracker.table().get(p.pid).is_none()
            && tracker.table_mut().attribute_pid(p.pid).is_some()
            && let Some(t) = tracker.table().get(p.pid)
        {
            info!(
                "GPU process {} ({}) reported by NVML on GPU {}: cgroup {}",
                p.pid,
                t.comm,
                p.device_index,
                t.cgroup_path.as_deref().unwrap_or("?")
            );
        }
    }
}

/// At debug level, one line per GPU and per process of each sample (the GPU smoke test reads them).
fn log_sample(tracker: &Tracker, sample: &crate::sample::GpuSample) {
    if !log::log_enabled!(log::Level::Debug) {
        return;
    }
    for d in &sample.devices {
        log::debug!(
            "sample: GPU {} {} \"{}\" total {} used {} free {} bytes",
            d.index,
            d.uuid,
            d.name,
            d.memory_total,
            d.memory_used,
            d.memory_free
        );
    }
    for p in &sample.processes {
        let t = tracker.table().get(p.pid);
        log::debug!(
            "sample: GPU {} pid {} comm {} used {} bytes cgroup {} workload {}",
            p.device_index,
            p.pid,
            t.map(|t| t.comm.as_str()).unwrap_or("?"),
            p.used_bytes
                .map(|b| b.to_string())
                .unwrap_or_else(|| "n/a".into()),
            t.and_then(|t| t.cgroup_path.as_deref()).unwrap_or("?"),
            t.and_then(|t| t.workload.as_ref())
                .map(|w| w.key())
                .unwrap_or_else(|| "?".into()),
        );
    }
}

async fn readable(
    fd: &Option<AsyncFd<OwnedFd>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

fn log_changes(tracker: &Tracker, changes: Vec<Change>) {
    for change in changes {
        match change {
            Change::Added(pid) => {
                if let Some(t) = tracker.table().get(pid) {
                    let workload = t
                        .workload
                        .as_ref()
                        .map(|w| w.key())
                        .unwrap_or_else(|| "?".into());
                    info!(
                        "GPU task {pid} ({}) opened an nvidia device: cgroup {} -> {workload}",
                        t.comm,
                        t.cgroup_path.as_deref().unwrap_or("?"),
                    );
                }
            }
            Change::Removed(pid) => info!("GPU task {pid} exited"),
            Change::AllocHint(pid) => {
                log::debug!("GPU task {pid} issued an allocation ioctl (RM_ALLOC)")
            }
            Change::Updated(_) | Change::None => {}
        }
    }
}
