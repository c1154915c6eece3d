//! The agent's event loop: decides *when* the agent steps. Signals, kernel events (prompt re-sample
//! on allocations), the sample and reconcile timers, quota file changes, and release requests.

use std::{
    os::fd::OwnedFd,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use log::{info, warn};
use notify::Watcher;
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
    sync::mpsc,
    time::{MissedTickBehavior, interval},
};

use crate::{
    agent::{Agent, AgentOptions, RESAMPLE_DEBOUNCE},
    api,
    attribution::{Change, cgroupfs, tracker::Tracker},
    cli::RunArgs,
    drain_pace::{self, DrainPace, PaceChange},
    ebpf::LoadOptions,
    enforce::Enforcer,
    grants::quota_store::{QuotaPaths, QuotaStore},
    metrics::{Compat, Metrics},
    nvml::NvmlSampler,
    snapshot::SharedSnapshot,
    ticker::Ticker,
};

/// How often a pending freeze or thaw is read again while one is pending.
const SETTLE_POLL: Duration = Duration::from_millis(5);
/// Backstop for file watching (files on filesystems without inotify, missed events).
const QUOTA_POLL: Duration = Duration::from_secs(10);

/// Hands the agent libcuda (or why there is none) and, with it, the kernel log at `kernel_log`:
/// restored processes exist only where libcuda checkpoints, and the driver's reports of a
/// faulted context are read for them (cuda-checkpoint #53).
fn use_checkpointer(
    agent: &mut Agent,
    cuda: Result<std::sync::Arc<crate::cuda::Checkpointer>, String>,
    kernel_log: &std::path::Path,
) {
    if cuda.is_ok() {
        match crate::observe::faults::KernelLog::open(kernel_log) {
            Ok(log) => agent.use_kernel_log(log),
            Err(e) => warn!(
                "cannot read the kernel log {}: {e}; a restored process whose context faults \
                 is not ended safely (cuda-checkpoint #53)",
                kernel_log.display()
            ),
        }
    }
    agent.set_checkpointer(cuda);
}

/// Runs the agent until SIGINT or SIGTERM.
pub async fn run(args: RunArgs) -> Result<()> {
    // Signal streams first, so a signal during start-up is not lost.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

    enter_host_cgroup_namespace();
    // One agent per state directory, checked before anything is loaded or served.
    let enforcer = Enforcer::new(
        cgroupfs::find_cgroup2_mount()?,
        &args.state_dir,
        args.dry_run,
    )?;
    match crate::attribution::pidfd::raise_fd_limit() {
        Ok(n) if n < 4096 => warn!(
            "the open-file limit is {n}: the agent holds one pidfd per GPU process; raise \
             LimitNOFILE if the node runs more GPU processes than that"
        ),
        Ok(_) => {}
        Err(e) => warn!("cannot raise the open-file limit: {e}"),
    }
    let load = LoadOptions {
        alloc_event_min_interval_ns: args.alloc_event_min_interval.as_nanos() as u64,
        only: None,
        events_bytes: None,
    };
    let tracker = Tracker::start(&load, args.no_ebpf)?;
    let mut sampler = NvmlSampler::open(args.nvml_lib.as_deref());
    sampler.read_device_extras(args.compat.iter().any(|c| c == "dcgm"));
    if let Err(e) = std::fs::create_dir_all(&args.runtime_quotas) {
        warn!(
            "cannot create {}: {e}; launched services' quotas will not be seen",
            args.runtime_quotas.display()
        );
    }
    let paths = QuotaPaths::new(args.quotas.clone(), Some(args.runtime_quotas.clone()));
    let quotas = QuotaStore::load_with_state(paths.clone(), Some(args.state_dir.clone()));
    let snapshot: SharedSnapshot = Arc::default();
    let compat = Compat::from_names(&args.compat);
    let metrics = Arc::new(Metrics::with_options(
        snapshot.clone(),
        compat,
        args.process_metrics,
    ));
    let opts = AgentOptions {
        dry_run: args.dry_run,
        keep_frozen_on_exit: args.keep_frozen_on_exit,
        shutdown_restore_budget: args.shutdown_restore_budget,
    };
    if args.dry_run {
        info!("DRY RUN: decisions are logged and exported, nothing is frozen, signalled or killed");
    }
    // The CUDA checkpoint API, for the `suspend` step only.
    let cuda = match crate::cuda::Checkpointer::open(args.cuda_lib.as_deref()) {
        Ok(c) => {
            info!(
                "CUDA checkpoint API available ({}, driver {}): the suspend step can be used",
                c.path().display(),
                crate::cuda::version_text(c.driver_version())
            );
            Ok(Arc::new(c))
        }
        Err(e) => {
            info!("{e}; a suspend step falls through to the next one");
            Err(e.reason)
        }
    };
    let mut agent = Agent::new(tracker, sampler, quotas, enforcer, snapshot.clone(), opts);

    use_checkpointer(&mut agent, cuda, &args.kernel_log);
    // The API server (`[kubernetes]`, read at start): grants and Events, never waited on.
    let defaults = agent.quotas_mut().current().defaults().clone();
    let k8s = &defaults.kubernetes;
    if k8s.uses_api_server() {
        match crate::kube::api::connect(k8s) {
            Ok(api) => {
                if k8s.api {
                    agent.use_kube(crate::kube::api::spawn_watcher(
                        api.clone(),
                        defaults.gpushare_unit,
                    ));
                }
                if k8s.events {
                    agent.use_events(crate::kube::events::spawn_poster(api.client, api.node));
                }
            }
            Err(e) => warn!("[kubernetes]: {e}; the API server is not used (no grants, no Events)"),
        }
    }
    agent.use_driver_limits(crate::enforce::driver_limits::DriverLimiter::new(
        args.nvml_lib.as_deref(),
        cgroupfs::find_cgroup2_mount()?,
        Some(&args.state_dir),
    ));
    api::serve_tcp(args.listen, snapshot.clone(), metrics.clone()).await?;
    let (release_tx, mut release_rx) = mpsc::channel::<api::ReleaseRequest>(16);
    let socket =
        match api::serve_unix(&args.socket, snapshot.clone(), metrics.clone(), release_tx).await {
            Ok(p) => Some(p),
            Err(e) => {
                warn!("local API unavailable ({e:#}); `gpushare-agent release` will not work");
                None
            }
        };

    // Quota files: inotify on their directories, and a slow poll as a backstop.
    let (qtx, mut qrx) = mpsc::channel::<()>(4);
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok_and(|e| crate::grants::quota_store::is_config_change(&e)) {
            let _ = qtx.try_send(());
        }
    })
    .ok();
    if let Some(w) = watcher.as_mut() {
        for dir in paths.watch_dirs() {
            if dir.is_dir()
                && let Err(e) = w.watch(&dir, notify::RecursiveMode::NonRecursive)
            {
                warn!("not watching {}: {e}", dir.display());
            }
        }
    }

    let events_fd: Option<AsyncFd<OwnedFd>> = match agent.events_fd() {
        Some(fd) => {
            let fd = fd
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

    // The kernel's timer, not tokio's: re-arming the nearest tokio timer wakes the loop twice.
    // Its period follows the ring buffer (drain_pace.rs): slow while wake-ups come on time.
    let mut pace = DrainPace::default();
    let mut drain = Ticker::new(pace.period(Instant::now()));
    let mut sample = interval(args.interval);
    let mut reconcile = interval(args.reconcile_interval);
    let mut quota_poll = interval(QUOTA_POLL);
    let mut settle = interval(SETTLE_POLL);
    for t in [&mut sample, &mut reconcile, &mut quota_poll, &mut settle] {
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
            // Before the kernel events: a storm of GPU task events must not starve an operator.
            Some(req) = release_rx.recv() => {
                let answer = agent.release(&req.workload);
                if answer.is_ok() { agent.tick(None); }
                let _ = req.reply.send(answer);
            }
            ready = readable(&events_fd) => {
                log::trace!("ring buffer readable");
                if let Ok(mut guard) = ready { guard.clear_ready(); }
                let changed = on_changes(&mut agent);
                pace_drain(&mut pace, &mut drain, &agent, false);
                if let Some(at) = changed {
                    resample_now(&mut agent, at).await;
                    sample.reset();
                }
            }
            _ = drain.tick() => {
                let changed = on_changes(&mut agent);
                pace_drain(&mut pace, &mut drain, &agent, true);
                if let Some(at) = changed {
                    resample_now(&mut agent, at).await;
                    sample.reset();
                }
            }
            _ = sample.tick() => agent.tick(None),
            // A freeze or thaw that had not settled when it was issued: read it again soon,
            // without ever waiting on it here.
            _ = settle.tick(), if agent.has_pending() => { agent.settle(); }
            _ = reconcile.tick() => {
                agent.reconcile();
                release_free_heap();
            }
            Some(()) = qrx.recv() => {
                // Let an editor finish writing (several events per save) before reading.
                tokio::time::sleep(Duration::from_millis(100)).await;
                while qrx.try_recv().is_ok() {}
                if agent.quotas_mut().reload(false) { agent.tick(None); }
            }
            _ = quota_poll.tick() => { if agent.quotas_mut().reload(false) { agent.tick(None); } }
        }
    }
    agent.shutdown();
    info!("shutting down: detaching eBPF programs");
    drop(events_fd);
    drop(watcher);
    drop(agent);
    if let Some(p) = socket {
        let _ = std::fs::remove_file(p);
    }
    info!("stopped");
    Ok(())
}

/// After a drain (`by_timer`: the timer's, not a wake-up's): the drain's period as [`DrainPace`]
/// says, the change to fast logged.
fn pace_drain(pace: &mut DrainPace, drain: &mut Ticker, agent: &Agent, by_timer: bool) {
    let now = Instant::now();
    let (drained, prompt_boot_ns) = agent.last_drained();
    let late = by_timer && drain_pace::late(prompt_boot_ns, crate::ebpf::boot_time_ns());
    match pace.drained(now, late, drained) {
        Some(PaceChange::LateWakeup) => info!(
            "a ring-buffer wake-up came late (the {:?} drain found its event): draining every \
             {:?} for the next {:?}",
            drain_pace::SLOW,
            drain_pace::FAST,
            drain_pace::FAST_HOLD
        ),
        Some(PaceChange::Busy(n)) => info!(
            "the ring buffer is busy ({n} events in one drain): draining every {:?} for the next \
             {:?}",
            drain_pace::FAST,
            drain_pace::FAST_HOLD
        ),
        None => {}
    }
    let period = pace.period(now);
    if period != drain.period() {
        log::debug!("draining the ring buffer every {period:?}");
        drain.set_period(period);
    }
}

/// Gives the heap's free pages back to the kernel (glibc's `malloc_trim`). glibc returns only the
/// top of a heap by itself; the start-up attribution of a busy node, or a burst of new containers,
/// leaves free chunks below live ones that stay resident: at 1,000 GPU processes about 1.2 MiB of
/// the agent's 16.7 MiB (docs/performance.md). Called at each reconcile (every 10 s by default),
/// after the reconcile's own allocations are freed. A no-op on other C libraries.
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it takes the allocator's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// In a pod (DaemonSet), `/proc/<pid>/cgroup` shows paths relative to the pod's own cgroup
/// namespace. The agent needs the host's view: join init's cgroup namespace when it differs. The
/// agent's single runtime thread does every read, so joining on it is enough.
fn enter_host_cgroup_namespace() {
    let (Ok(own), Ok(init)) = (
        std::fs::read_link("/proc/self/ns/cgroup"),
        std::fs::read_link("/proc/1/ns/cgroup"),
    ) else {
        return;
    };
    if own == init {
        return;
    }
    let joined = std::fs::File::open("/proc/1/ns/cgroup").and_then(|f| {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid namespace fd; CLONE_NEWCGROUP names its type.
        match unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWCGROUP) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    });
    match joined {
        Ok(()) => info!("joined the host's cgroup namespace (running in a container)"),
        Err(e) => warn!(
            "running in a private cgroup namespace and cannot join the host's ({e}); cgroup paths of other \
             containers will be wrong: run with hostPID and CAP_SYS_ADMIN"
        ),
    }
}

/// Applies pending kernel events; returns when the first one that asks for a prompt re-sample
/// (an allocation, a new GPU task) arrived.
fn on_changes(agent: &mut Agent) -> Option<Instant> {
    let changes = agent.poll_kernel();
    log_changes(agent, &changes);
    if !Agent::wants_resample(&changes) {
        return None;
    }
    // Which events asked for it, each as `wants_resample` judges it alone (tests check that a
    // re-sample came from their own process's event, not another's).
    let causes: Vec<String> = changes
        .iter()
        .filter(|c| Agent::wants_resample(std::slice::from_ref(*c)))
        .map(|c| match c {
            Change::AllocHint(pid) => format!("an allocation ioctl of GPU task {pid}"),
            Change::Added(pid) => format!("new GPU task {pid}"),
            other => format!("{other:?}"),
        })
        .collect();
    log::debug!("re-sample wanted by {}", causes.join(", "));
    Some(Instant::now())
}

/// Re-samples after a short debounce, so a burst of allocations costs one sample.
async fn resample_now(agent: &mut Agent, at: Instant) {
    tokio::time::sleep(RESAMPLE_DEBOUNCE).await;
    let more = agent.poll_kernel();
    log_changes(agent, &more);
    log::debug!("re-sampling {:?} after an allocation event", at.elapsed());
    agent.tick(Some(at));
}

async fn readable(
    fd: &Option<AsyncFd<OwnedFd>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

fn log_changes(agent: &Agent, changes: &[Change]) {
    for change in changes {
        match change {
            Change::Added(pid) => {
                if let Some(t) = agent.task(*pid) {
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

#[cfg(test)]
mod tests {
    /// Resident anonymous memory of this process, in KiB (`/proc/self/smaps_rollup`).
    fn anonymous_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("Anonymous:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// Freed heap memory below a live allocation stays resident until released.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn free_heap_pages_go_back_to_the_kernel() {
        // 32 MiB in 4 KiB blocks (below the mmap threshold: heap memory), each written, and one
        // block kept after them so the heap's top cannot shrink by itself.
        let blocks: Vec<Vec<u8>> = (0..8192).map(|_| vec![1u8; 4096]).collect();
        let keep = vec![1u8; 4096];
        drop(std::hint::black_box(blocks));
        let before = anonymous_kib();
        super::release_free_heap();
        let after = anonymous_kib();
        std::hint::black_box(&keep);
        assert!(
            before >= after + 16 * 1024,
            "released {} KiB of 32 MiB freed ({before} -> {after} KiB)",
            before.saturating_sub(after)
        );
    }
}
