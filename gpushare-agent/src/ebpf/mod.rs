//! The kernel side seen from userspace: loading and attaching the programs, draining the ring
//! buffer, reading the per-task ioctl counts and the drop counters.

pub mod decode;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use anyhow::{Context, Result};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{BtfTracePoint, RawTracePoint, TracePoint},
};
use gpushare_common::{
    Counter, GpuTask, IoctlCounts,
    maps::{
        COUNTERS, EVENTS, GLOBAL_ALLOC_EVENT_MIN_INTERVAL_NS, GPU_TASKS, GPU_TGID_BITS,
        IOCTL_COUNTS,
    },
};
use log::{info, warn};

pub use self::decode::{DecodeError, KernelEvent, decode};

/// The compiled eBPF object, embedded at build time.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpushare"));

/// How a program attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A tracepoint (`category:name`, the perf-event interface; for `syscalls:*`, the kernel builds
    /// an argument record first).
    TracePoint(&'static str, &'static str),
    /// A raw tracepoint (`raw_tp`), untyped arguments.
    Raw(&'static str),
    /// A BTF-typed raw tracepoint (`tp_btf`).
    Btf(&'static str),
}

/// Every program of the object, by name (the eBPF function's name), and where it attaches.
pub const PROGRAMS: &[(&str, Attach)] = &[
    (
        "sched_process_exec",
        Attach::TracePoint("sched", "sched_process_exec"),
    ),
    (
        "sched_process_exit",
        Attach::TracePoint("sched", "sched_process_exit"),
    ),
    ("cgroup_rmdir", Attach::TracePoint("cgroup", "cgroup_rmdir")),
    (
        "cgroup_attach_task",
        Attach::TracePoint("cgroup", "cgroup_attach_task"),
    ),
    (
        "sys_enter_openat",
        Attach::TracePoint("syscalls", "sys_enter_openat"),
    ),
    (
        "sys_enter_openat2",
        Attach::TracePoint("syscalls", "sys_enter_openat2"),
    ),
    (
        "sys_enter_open",
        Attach::TracePoint("syscalls", "sys_enter_open"),
    ),
    (
        "sys_enter_ioctl",
        Attach::TracePoint("syscalls", "sys_enter_ioctl"),
    ),
    (
        "sys_enter_openat_pending",
        Attach::TracePoint("syscalls", "sys_enter_openat"),
    ),
    (
        "sys_enter_openat2_pending",
        Attach::TracePoint("syscalls", "sys_enter_openat2"),
    ),
    (
        "sys_enter_open_pending",
        Attach::TracePoint("syscalls", "sys_enter_open"),
    ),
    (
        "sys_exit_openat",
        Attach::TracePoint("syscalls", "sys_exit_openat"),
    ),
    (
        "sys_exit_openat2",
        Attach::TracePoint("syscalls", "sys_exit_openat2"),
    ),
    (
        "sys_exit_open",
        Attach::TracePoint("syscalls", "sys_exit_open"),
    ),
    ("btf_sys_enter", Attach::Btf("sys_enter")),
    ("btf_sys_exit", Attach::Btf("sys_exit")),
    ("btf_sys_enter_noexit", Attach::Btf("sys_enter")),
    ("raw_sys_enter", Attach::Raw("sys_enter")),
    ("raw_sys_exit", Attach::Raw("sys_exit")),
    ("floor_btf_sys_enter", Attach::Btf("sys_enter")),
];

/// The programs that send an nvidia open on its entry, flagged unconfirmed.
const UNCONFIRMED_OPEN_PROGRAMS: [&str; 4] = [
    "sys_enter_openat",
    "sys_enter_openat2",
    "sys_enter_open",
    "btf_sys_enter_noexit",
];

/// The process-lifetime programs every probe set attaches.
const SCHED: [&str; 2] = ["sched_process_exec", "sched_process_exit"];

/// Ways to see nvidia opens and GPU tasks' ioctls, by name: (name, programs, what it is). The
/// first is what the agent attaches; the overhead bench (`--variants`) measures them all. "no
/// exit" sets send an open on its entry, unconfirmed, and the agent checks the result
/// (`attribution::procinfo::open_state`, which lists the opener's fds: a tenant with many fds
/// that keeps failing to open a made-up node stalls the agent, issue 20); the others, the
/// agent's among them, check it in an exit probe, so a failed open costs the agent nothing.
pub const PROBE_SETS: &[(&str, &[&str], &str)] = &[
    (
        "tracepoints",
        &[
            SCHED[0],
            SCHED[1],
            "sys_enter_openat_pending",
            "sys_exit_openat",
            "sys_enter_openat2_pending",
            "sys_exit_openat2",
            "sys_enter_open_pending",
            "sys_exit_open",
            "sys_enter_ioctl",
            "cgroup_rmdir",
            "cgroup_attach_task",
        ],
        "syscalls:sys_{enter,exit}_open{,at,at2} and syscalls:sys_enter_ioctl; an open's result checked on its exit; cgroup:cgroup_rmdir counted; GPU tasks moved between groups followed (cgroup:cgroup_attach_task)",
    ),
    (
        "tracepoints, no exit",
        &[
            SCHED[0],
            SCHED[1],
            "sys_enter_openat",
            "sys_enter_openat2",
            "sys_enter_open",
            "sys_enter_ioctl",
        ],
        "syscalls:sys_enter_open{,at,at2} and syscalls:sys_enter_ioctl; the agent checks an open's result (before issue 20)",
    ),
    (
        "tp_btf, no exit",
        &[SCHED[0], SCHED[1], "btf_sys_enter_noexit"],
        "tp_btf sys_enter only, syscall number tested first; the agent checks an open's result",
    ),
    (
        "tp_btf",
        &[SCHED[0], SCHED[1], "btf_sys_enter", "btf_sys_exit"],
        "tp_btf sys_enter and sys_exit, syscall number tested first",
    ),
    (
        "tp_btf+tp_exit",
        &[
            SCHED[0],
            SCHED[1],
            "btf_sys_enter",
            "sys_exit_openat",
            "sys_exit_openat2",
            "sys_exit_open",
        ],
        "tp_btf sys_enter; the open's result from syscalls:sys_exit_open{,at,at2}",
    ),
    (
        "raw_tp",
        &[SCHED[0], SCHED[1], "raw_sys_enter", "raw_sys_exit"],
        "raw_tp sys_enter and sys_exit, syscall number tested first, registers by probe read",
    ),
];

/// Options for [`KernelPrograms::load`].
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Least time between two allocation events of one task, ns.
    pub alloc_event_min_interval_ns: u64,
    /// Attach these programs (by name, see [`PROGRAMS`]); the agent's probe set (the first of
    /// [`PROBE_SETS`]) when `None`. Benchmarks use it to compare probe sets.
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
    tgid_bits: TgidBits,
    /// The batched reads' buffers, kept from one step to the next (`None` until the first).
    ioctl_batch: Option<BatchBuffers<IoctlCounts>>,
}

/// Keys and values of `BPF_MAP_LOOKUP_BATCH` calls over one map (one allocation, reused).
struct BatchBuffers<V> {
    /// Values per key (the possible CPUs of a per-CPU map, 1 otherwise).
    per_key: usize,
    keys: Vec<u32>,
    values: Vec<V>,
}

impl<V: Copy + Default> BatchBuffers<V> {
    /// For about 64 KiB of values per call, at least 16 entries.
    fn new(per_key: usize) -> Self {
        let chunk = (65_536 / (per_key * size_of::<V>())).max(16);
        Self {
            per_key,
            keys: vec![0; chunk],
            values: vec![V::default(); chunk * per_key],
        }
    }
}

/// `GPU_TGID_BITS`, mapped into the agent: it sets and clears its own tasks' bits with the same
/// atomic ops the kernel uses, so neither side loses the other's update.
struct TgidBits {
    words: *mut u64,
    len: usize,
}

impl TgidBits {
    /// Words for `pid_max`, in whole pages (512 words).
    fn words_for(pid_max: u32) -> u32 {
        pid_max.div_ceil(64).div_ceil(512).max(1) * 512
    }

    fn map(fd: BorrowedFd<'_>, words: u32) -> Result<Self> {
        let len = words as usize * 8;
        // SAFETY: a shared mapping of an mmap'able BPF array of `len` bytes; unmapped on drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping GPU_TGID_BITS");
        }
        Ok(Self {
            words: p.cast(),
            len,
        })
    }

    fn word(&self, tgid: u32) -> Option<&std::sync::atomic::AtomicU64> {
        let i = (tgid / 64) as usize;
        // SAFETY: in bounds of the mapping, 8-byte aligned (page-aligned base); shared with the
        // kernel, which only touches it atomically too.
        (i < self.len / 8)
            .then(|| unsafe { std::sync::atomic::AtomicU64::from_ptr(self.words.add(i)) })
    }

    fn set(&self, tgid: u32) {
        if let Some(w) = self.word(tgid) {
            w.fetch_or(1 << (tgid % 64), std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn clear(&self, tgid: u32) {
        if let Some(w) = self.word(tgid) {
            w.fetch_and(!(1 << (tgid % 64)), std::sync::atomic::Ordering::SeqCst);
        }
    }
}

// SAFETY: the mapping is only accessed through atomics, so sharing it between threads is sound.
unsafe impl Send for TgidBits {}
// SAFETY: as above.
unsafe impl Sync for TgidBits {}

impl Drop for TgidBits {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`.
        unsafe { libc::munmap(self.words.cast(), self.len) };
    }
}

/// The kernel's pid_max (the largest tgid + 1); the 64-bit limit when unreadable.
fn pid_max() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304)
}

impl KernelPrograms {
    /// Loads the embedded object and attaches its tracepoints.
    pub fn load(opts: &LoadOptions) -> Result<Self> {
        let mut loader = EbpfLoader::new();
        if let Some(bytes) = opts.events_bytes {
            loader.map_max_entries(EVENTS, bytes);
        }
        let tgid_words = TgidBits::words_for(pid_max());
        loader.map_max_entries(GPU_TGID_BITS, tgid_words);
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
        let wanted: Vec<&'static str> = match &opts.only {
            Some(only) => only.clone(),
            None => PROBE_SETS[0].1.to_vec(),
        };
        let mut btf = None;
        let mut attached = Vec::new();
        for &(prog, attach) in PROGRAMS {
            if !wanted.contains(&prog) {
                continue;
            }
            let program = ebpf
                .program_mut(prog)
                .with_context(|| format!("program {prog} missing from the eBPF object"))?;
            match attach {
                Attach::TracePoint(category, name) => {
                    let p: &mut TracePoint = program.try_into()?;
                    p.load()
                        .with_context(|| format!("loading program {prog}"))?;
                    p.attach(category, name).with_context(|| {
                        format!("attaching {prog} to tracepoint {category}:{name}")
                    })?;
                }
                Attach::Raw(name) => {
                    let p: &mut RawTracePoint = program.try_into()?;
                    p.load()
                        .with_context(|| format!("loading program {prog}"))?;
                    p.attach(name)
                        .with_context(|| format!("attaching {prog} to raw tracepoint {name}"))?;
                }
                Attach::Btf(name) => {
                    if btf.is_none() {
                        btf = Some(Btf::from_sys_fs().context("reading the kernel's BTF")?);
                    }
                    let p: &mut BtfTracePoint = program.try_into()?;
                    p.load(name, btf.as_ref().expect("read above"))
                        .with_context(|| format!("loading program {prog}"))?;
                    p.attach()
                        .with_context(|| format!("attaching {prog} to tp_btf {name}"))?;
                }
            }
            attached.push(prog);
        }
        if let Some(unknown) = wanted.iter().find(|w| !attached.contains(w)) {
            anyhow::bail!("no program named {unknown} in the eBPF object");
        }
        let events = RingBuf::try_from(ebpf.take_map(EVENTS).context("map EVENTS missing")?)?;
        let tgid_bits = match ebpf.map(GPU_TGID_BITS) {
            Some(aya::maps::Map::Array(data)) => TgidBits::map(data.fd().as_fd(), tgid_words)?,
            _ => anyhow::bail!("map {GPU_TGID_BITS} missing or not an array"),
        };
        info!("eBPF programs loaded and attached: {}", attached.join(", "));
        Ok(Self {
            ebpf,
            events,
            logger,
            attached,
            tgid_bits,
            ioctl_batch: None,
        })
    }

    /// Names of the attached programs.
    pub fn attached(&self) -> &[&'static str] {
        &self.attached
    }

    /// Whether an nvidia open is sent on its entry, before its result is known, so the agent
    /// must check it (the "no exit" probe sets); otherwise an exit probe sends only opens that
    /// succeeded and a failed one costs the agent nothing.
    pub fn sends_unconfirmed_opens(&self) -> bool {
        self.attached
            .iter()
            .any(|p| UNCONFIRMED_OPEN_PROGRAMS.contains(p))
    }

    /// Raw fd of the event ring buffer (readable when a forced wakeup happened).
    pub fn events_fd(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
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

    /// Every task's ioctl counts, summed over CPUs, into `out` (cleared first). Read every step for
    /// every GPU task, so it asks the kernel for many entries per syscall (`BPF_MAP_LOOKUP_BATCH`,
    /// Linux 5.6+) rather than once per task; a kernel without batch lookups gets one per key.
    pub fn all_ioctl_counts(&mut self, out: &mut Vec<(u32, IoctlCounts)>) {
        out.clear();
        let Some(aya::maps::Map::PerCpuHashMap(data)) = self.ebpf.map(IOCTL_COUNTS) else {
            return;
        };
        // The possible CPUs (a file read) and the buffers, once.
        if self.ioctl_batch.is_none() {
            match aya::util::nr_cpus() {
                Ok(cpus) => self.ioctl_batch = Some(BatchBuffers::new(cpus)),
                Err((_, e)) => log::debug!("possible CPUs: {e}"),
            }
        }
        let batched = match self.ioctl_batch.as_mut() {
            Some(buffers) => batch_ioctl_counts(data.fd().as_fd(), buffers, out),
            None => Err(std::io::ErrorKind::Unsupported.into()),
        };
        if batched.is_err() {
            out.clear();
            for tgid in self.ioctl_count_keys() {
                if let Some(c) = self.ioctl_counts(tgid) {
                    out.push((tgid, c));
                }
            }
        }
    }

    /// Forgets a task's ioctl counts (after its exit was handled).
    pub fn forget_ioctl_counts(&mut self, tgid: u32) {
        if let Some(map) = self.ebpf.map_mut(IOCTL_COUNTS)
            && let Ok(mut map) = PerCpuHashMap::<_, u32, IoctlCounts>::try_from(map)
        {
            let _ = map.remove(&tgid);
        }
    }

    /// Every tgid the kernel table holds, with its entry (batched reads; one per key where the
    /// kernel lacks batch lookups).
    pub fn gpu_tasks(&self) -> Vec<(u32, GpuTask)> {
        let Some(map) = self.ebpf.map(GPU_TASKS) else {
            return Vec::new();
        };
        if let aya::maps::Map::HashMap(data) = map {
            let mut out = Vec::new();
            let mut buffers = BatchBuffers::<GpuTask>::new(1);
            if batch_lookup(data.fd().as_fd(), &mut buffers, |tgid, v| {
                out.push((tgid, v[0]))
            })
            .is_ok()
            {
                return out;
            }
        }
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
        self.tgid_bits.clear(tgid); // after the entry left
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
        self.tgid_bits.set(tgid); // before the entry: whoever finds the entry finds the bit
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

    /// Cgroups removed on the host since the programs were loaded; `None` when the program
    /// that counts them is not attached (then nothing can be concluded from it).
    pub fn cgroups_removed(&self) -> Option<u64> {
        if !self.attached.contains(&"cgroup_rmdir") {
            return None;
        }
        let arr = PerCpuArray::<_, u64>::try_from(self.ebpf.map(COUNTERS)?).ok()?;
        arr.get(&(Counter::CgroupsRemoved as u32), 0)
            .ok()
            .map(|v| v.iter().sum())
    }
}

/// `union bpf_attr`'s member for the `BPF_MAP_*_BATCH` commands.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `BPF_MAP_LOOKUP_BATCH` over the per-CPU `IOCTL_COUNTS` map, summing each entry's CPUs.
fn batch_ioctl_counts(
    fd: BorrowedFd<'_>,
    buffers: &mut BatchBuffers<IoctlCounts>,
    out: &mut Vec<(u32, IoctlCounts)>,
) -> std::io::Result<()> {
    batch_lookup(fd, buffers, |tgid, per_cpu| {
        let sum = per_cpu
            .iter()
            .fold(IoctlCounts::default(), |acc, c| IoctlCounts {
                calls: acc.calls + c.calls,
                allocs: acc.allocs + c.allocs,
            });
        out.push((tgid, sum));
    })
}

/// Every entry of a hash map with `u32` keys through `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+), through
/// `buffers`: `visit` gets each key with its `per_key` values (the CPUs of a per-CPU map, 1
/// otherwise). `V` must be the map's value type, a multiple of 8 bytes (the kernel's per-CPU
/// stride).
fn batch_lookup<V: Copy + Default>(
    fd: BorrowedFd<'_>,
    buffers: &mut BatchBuffers<V>,
    mut visit: impl FnMut(u32, &[V]),
) -> std::io::Result<()> {
    const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
    const { assert!(size_of::<V>().is_multiple_of(8)) };
    let BatchBuffers {
        per_key,
        keys,
        values,
    } = buffers;
    let per_key = *per_key;
    let chunk = keys.len();
    // The position token of a hash map is a bucket index (u32).
    let (mut token_in, mut token_out) = (0u32, 0u32);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                (&raw const token_in) as u64
            },
            out_batch: (&raw mut token_out) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: the attr points at buffers of `chunk` keys and `chunk * per_key` values of the
        // map's value type, which is what the kernel writes.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>(),
            )
        };
        let err = (rc < 0).then(std::io::Error::last_os_error);
        let done = match &err {
            None => false,
            // ENOENT: the last entries came with this call (or there were none).
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Some(e) => return Err(std::io::Error::new(e.kind(), e.to_string())),
        };
        for (i, key) in keys.iter().take(attr.count as usize).enumerate() {
            visit(*key, &values[i * per_key..(i + 1) * per_key]);
        }
        if done {
            return Ok(());
        }
        token_in = token_out;
        first = false;
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
