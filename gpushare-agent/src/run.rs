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
    let _nvml = nvml::open(args.nvml_lib.as_deref());

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
            _ = sample.tick() => tracker.refresh_ioctl_counts(),
            _ = reconcile.tick() => { tracker.reconcile(); }
        }
    }
    info!("shutting down: detaching eBPF programs");
    drop(events_fd);
    drop(tracker);
    info!("stopped");
    Ok(())
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
            Change::AllocHint(pid) => log::debug!("GPU task {pid} issued an allocation ioctl"),
            Change::Updated(_) | Change::None => {}
        }
    }
}
