//! The kernel side seen from userspace: loading and attaching the programs, draining the ring
//! buffer, reading the per-task ioctl counts and the drop counters.

pub mod decode;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use anyhow::{Context, Result};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::TracePoint,
};
use gpushare_common::{
    Counter, GpuTask, IoctlCounts,
    maps::{COUNTERS, EVENTS, GLOBAL_ALLOC_EVENT_MIN_INTERVAL_NS, GPU_TASKS, IOCTL_COUNTS},
};
use log::{info, warn};

pub use self::decode::{DecodeError, KernelEvent, decode};

/// The compiled eBPF object, embedded at build time.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpushare"));

/// (program, tracepoint category, tracepoint name). Program names are the eBPF functions' names.
pub const TRACEPOINTS: &[(&str, &str, &str)] = &[
    ("sched_process_exec", "sched", "sched_process_exec"),
    ("sched_process_exit", "sched", "sched_process_exit"),
    ("sys_enter_openat", "syscalls", "sys_enter_openat"),
    ("sys_exit_openat", "syscalls", "sys_exit_openat"),
    ("sys_enter_open", "syscalls", "sys_enter_open"),
    ("sys_exit_open", "syscalls", "sys_exit_open"),
    ("sys_enter_ioctl", "syscalls", "sys_enter_ioctl"),
];

/// Options for [`KernelPrograms::load`].
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Least time between two allocation events of one task, ns.
    pub alloc_event_min_interval_ns: u64,
    /// Attach only these programs (by name); all when `None`. Benchmarks use it.
    pub only: Option<Vec<&'static str>>,
    /// Ring-buffer size in bytes (a power of two, at least a page); the built-in size when `None`.
    /// Tests shrink it to provoke overflows.
    pub events_bytes: Option<u32>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            alloc_event_min_interval_ns: gpushare_common::maps::DEFAULT_ALLOC_EVENT_MIN_INTERVAL_NS,
            only: None,
            events_bytes: None,
        }
    }
}

/// Totals read from the kernel's drop counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters {
    /// Events dropped because the ring buffer was full.
    pub events_lost: u64,
    /// GPU tasks the kernel could not record because its table was full.
    pub tasks_dropped: u64,
    /// Allocation events suppressed by the per-task rate limit.
    pub alloc_events_rate_limited: u64,
}

/// The loaded and attached programs. Dropping it detaches them.
pub struct KernelPrograms {
    ebpf: Ebpf,
    events: RingBuf<MapData>,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    attached: Vec<&'static str>,
}

impl KernelPrograms {
    /// Loads the embedded object and attaches its tracepoints.
    pub fn load(opts: &LoadOptions) -> Result<Self> {
        let mut loader = EbpfLoader::new();
        if let Some(bytes) = opts.events_bytes {
            loader.map_max_entries(EVENTS, bytes);
        }
        let mut ebpf = loader
            .override_global(
                GLOBAL_ALLOC_EVENT_MIN_INTERVAL_NS,
                &opts.alloc_event_min_interval_ns,
                true,
            )
            .load(OBJECT)
            .context(
                "loading the eBPF object (needs root or CAP_BPF+CAP_PERFMON, and kernel BTF)",
            )?;
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(logger) => Some(logger),
            Err(e) => {
                // No log statement reachable in the object is not an error.
                log::debug!("eBPF logger not started: {e}");
                None
            }
        };
        let mut attached = Vec::new();
        for &(prog, category, name) in TRACEPOINTS {
            if let Some(only) = &opts.only
                && !only.contains(&prog)
            {
                continue;
            }
            let program: &mut TracePoint = ebpf
                .program_mut(prog)
                .with_context(|| format!("program {prog} missing from the eBPF object"))?
                .try_into()?;
            program
                .load()
                .with_context(|| format!("loading program {prog}"))?;
            program
                .attach(category, name)
                .with_context(|| format!("attaching {prog} to tracepoint {category}:{name}"))?;
            attached.push(prog);
        }
        let events = RingBuf::try_from(ebpf.take_map(EVENTS).context("map EVENTS missing")?)?;
        info!("eBPF programs loaded and attached: {}", attached.join(", "));
        Ok(Self {
            ebpf,
            events,
            logger,
            attached,
        })
    }

    /// Names of the attached programs.
    pub fn attached(&self) -> &[&'static str] {
        &self.attached
    }

    /// Raw fd of the event ring buffer (readable when a forced wakeup happened).
    pub fn events_fd(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
    }

    /// Raw fd of the aya-log ring buffer, if the logger runs.
    pub fn log_fd(&self) -> Option<i32> {
        self.logger.as_ref().map(|l| l.as_raw_fd())
    }

    /// Forwards pending eBPF log records to the `log` crate.
    pub fn flush_logs(&mut self) {
        if let Some(logger) = self.logger.as_mut() {
            // aya-log unwraps on a malformed record; a bad record must not take the agent down.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| logger.flush())).is_err() {
                warn!("dropping a malformed eBPF log record");
            }
        }
    }

    /// Drains every pending ring-buffer record, decoded, into `out`. Returns how many records
    /// failed to decode (counted by the caller).
    pub fn drain_events(&mut self, out: &mut Vec<KernelEvent>) -> usize {
        let mut bad = 0;
        while let Some(item) = self.events.next() {
            match decode(&item) {
                Ok(ev) => out.push(ev),
                Err(e) => {
                    bad += 1;
                    log::debug!("undecodable ring-buffer record: {e}");
                }
            }
        }
        bad
    }

    /// The ioctl counts of one task, summed over CPUs.
    pub fn ioctl_counts(&self, tgid: u32) -> Option<IoctlCounts> {
        let map: PerCpuHashMap<_, u32, IoctlCounts> =
            PerCpuHashMap::try_from(self.ebpf.map(IOCTL_COUNTS)?).ok()?;
        let per_cpu = map.get(&tgid, 0).ok()?;
        Some(
            per_cpu
                .iter()
                .fold(IoctlCounts::default(), |acc, c| IoctlCounts {
                    calls: acc.calls + c.calls,
                    allocs: acc.allocs + c.allocs,
                }),
        )
    }

    /// Forgets a task's ioctl counts (after its exit was handled).
    pub fn forget_ioctl_counts(&mut self, tgid: u32) {
        if let Some(map) = self.ebpf.map_mut(IOCTL_COUNTS)
            && let Ok(mut map) = PerCpuHashMap::<_, u32, IoctlCounts>::try_from(map)
        {
            let _ = map.remove(&tgid);
        }
    }

    /// Every tgid the kernel table holds, with its entry.
    pub fn gpu_tasks(&self) -> Vec<(u32, GpuTask)> {
        let Some(map) = self.ebpf.map(GPU_TASKS) else {
            return Vec::new();
        };
        let Ok(map) = HashMap::<_, u32, GpuTask>::try_from(map) else {
            return Vec::new();
        };
        map.iter().filter_map(Result::ok).collect()
    }

    /// Removes a tgid from the kernel table (reconciliation found it dead).
    pub fn forget_gpu_task(&mut self, tgid: u32) {
        if let Some(map) = self.ebpf.map_mut(GPU_TASKS)
            && let Ok(mut map) = HashMap::<_, u32, GpuTask>::try_from(map)
        {
            let _ = map.remove(&tgid);
        }
        self.forget_ioctl_counts(tgid);
    }

    /// Adds a task found through `/proc` to the kernel table, so its ioctls are counted.
    pub fn track_task(&mut self, tgid: u32, cgroup_id: u64, comm: &str) {
        let mut raw_comm = [0u8; gpushare_common::event::COMM_LEN];
        let n = comm.len().min(raw_comm.len() - 1);
        raw_comm[..n].copy_from_slice(&comm.as_bytes()[..n]);
        let task = GpuTask {
            cgroup_id,
            first_open_boot_ns: boot_time_ns(),
            last_alloc_event_ns: 0,
            comm: raw_comm,
        };
        if let Some(map) = self.ebpf.map_mut(GPU_TASKS)
            && let Ok(mut map) = HashMap::<_, u32, GpuTask>::try_from(map)
        {
            let _ = map.insert(tgid, task, 0);
        }
    }

    /// Tgids that have ioctl counts in the kernel.
    pub fn ioctl_count_keys(&self) -> Vec<u32> {
        let Some(map) = self.ebpf.map(IOCTL_COUNTS) else {
            return Vec::new();
        };
        let Ok(map) = PerCpuHashMap::<_, u32, IoctlCounts>::try_from(map) else {
            return Vec::new();
        };
        map.keys().filter_map(Result::ok).collect()
    }

    /// The kernel's drop counters, summed over CPUs.
    pub fn counters(&self) -> KernelCounters {
        let read = |slot: Counter| -> u64 {
            let Some(map) = self.ebpf.map(COUNTERS) else {
                return 0;
            };
            let Ok(arr) = PerCpuArray::<_, u64>::try_from(map) else {
                return 0;
            };
            arr.get(&(slot as u32), 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        KernelCounters {
            events_lost: read(Counter::EventsLost),
            tasks_dropped: read(Counter::TasksDropped),
            alloc_events_rate_limited: read(Counter::AllocEventsRateLimited),
        }
    }
}

/// CLOCK_BOOTTIME now, in ns (the clock the eBPF programs stamp events with).
pub fn boot_time_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl AsRawFd for KernelPrograms {
    fn as_raw_fd(&self) -> i32 {
        self.events.as_raw_fd()
    }
}
