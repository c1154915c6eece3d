//! Map names and value types shared by both sides. Userspace takes maps by these names.

use crate::event::COMM_LEN;

/// `HashMap<u32 tgid, GpuTask>`: the tasks that opened an nvidia device node.
pub const GPU_TASKS: &str = "GPU_TASKS";
/// `PerCpuHashMap<u32 tgid, IoctlCounts>`: ioctls issued by GPU tasks.
pub const IOCTL_COUNTS: &str = "IOCTL_COUNTS";
/// `PerCpuArray<u64>` indexed by [`Counter`].
pub const COUNTERS: &str = "COUNTERS";
/// `RingBuf` of [`crate::Event`].
pub const EVENTS: &str = "EVENTS";
/// `HashMap<u64 pid_tgid, u8>`: opens of nvidia paths in flight (enter seen, exit not yet).
pub const PENDING_OPENS: &str = "PENDING_OPENS";

/// `Array<u64>`, mmap'able: one bit per tgid, set when the tgid may be in `GPU_TASKS`.
pub const GPU_TGID_BITS: &str = "GPU_TGID_BITS";
/// Words of `GPU_TGID_BITS` in the object (pid_max 32768); the loader sizes it from pid_max.
pub const GPU_TGID_WORDS_DEFAULT: u32 = 512;

/// Most GPU tasks tracked at once. Far above what one node runs.
pub const MAX_GPU_TASKS: u32 = 16_384;
/// Ring buffer size in bytes (a power of two multiple of the page size).
pub const EVENTS_BYTES: u32 = 256 * 1024;

/// Global (set by the loader): least time between two `AllocIoctl` events of one task, in ns.
pub const GLOBAL_ALLOC_EVENT_MIN_INTERVAL_NS: &str = "ALLOC_EVENT_MIN_INTERVAL_NS";
/// Default for [`GLOBAL_ALLOC_EVENT_MIN_INTERVAL_NS`]: 20 ms.
pub const DEFAULT_ALLOC_EVENT_MIN_INTERVAL_NS: u64 = 20_000_000;

/// What the kernel keeps per GPU task.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuTask {
    /// cgroup v2 id when the task was last seen opening, exec'ing or allocating.
    pub cgroup_id: u64,
    /// CLOCK_BOOTTIME ns of the first nvidia open. The process started before this; userspace checks
    /// the start time in `/proc/<pid>/stat` against it to verify the pid was not reused.
    pub first_open_boot_ns: u64,
    /// CLOCK_BOOTTIME ns of the last `AllocIoctl` event sent (rate limit).
    pub last_alloc_event_ns: u64,
    /// The task's comm, NUL-padded.
    pub comm: [u8; COMM_LEN],
}

/// ioctl counts of one GPU task on one CPU; userspace sums the CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoctlCounts {
    /// Every ioctl on any file descriptor.
    pub calls: u64,
    /// RM allocation escapes (direct or wrapped in NV_ESC_IOCTL_XFER_CMD).
    pub allocs: u64,
}

/// Slots of the `COUNTERS` per-CPU array. Numbers are stable.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Events dropped because the ring buffer was full.
    EventsLost = 0,
    /// GPU tasks not recorded because `GPU_TASKS` was full.
    TasksDropped = 1,
    /// AllocIoctl events suppressed by the per-task rate limit.
    AllocEventsRateLimited = 2,
    /// Cgroups removed on the host (any hierarchy), since the programs were loaded: while it
    /// stays put, no group was deleted, so none was recreated at its path.
    CgroupsRemoved = 3,
}

/// Number of slots in `COUNTERS`.
pub const COUNTER_SLOTS: u32 = 4;

#[cfg(feature = "user")]
unsafe impl aya::Pod for GpuTask {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for IoctlCounts {}
