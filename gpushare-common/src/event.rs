//! Events sent from the kernel to the agent through the `EVENTS` ring buffer.

/// Length of a task's `comm` (TASK_COMM_LEN in the kernel).
pub const COMM_LEN: usize = 16;

/// What an [`Event`] reports. Numbers are stable and never reused.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A task opened an nvidia device node for the first time: it is now a GPU task. Wakes the agent.
    GpuOpen = 1,
    /// The last thread of a GPU task exited: forget it.
    GpuExit = 2,
    /// A GPU task issued an RM allocation ioctl: its memory may have grown. Wakes the agent.
    /// Rate-limited per task.
    AllocIoctl = 3,
    /// A GPU task called exec: its comm (and maybe its cgroup) changed.
    GpuExec = 4,
    /// A GPU task was moved to another cgroup of the unified hierarchy (`cgroup.procs` written):
    /// it is charged to its new group from now on.
    GpuMove = 5,
}

impl EventKind {
    /// Decodes the raw kind; `None` for a number this build does not know.
    pub const fn from_u32(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::GpuOpen),
            2 => Some(Self::GpuExit),
            3 => Some(Self::AllocIoctl),
            4 => Some(Self::GpuExec),
            5 => Some(Self::GpuMove),
            _ => None,
        }
    }

    /// A short name, used as a metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Self::GpuOpen => "gpu_open",
            Self::GpuExit => "gpu_exit",
            Self::AllocIoctl => "alloc_ioctl",
            Self::GpuExec => "gpu_exec",
            Self::GpuMove => "gpu_move",
        }
    }
}

/// `GpuOpen`'s `arg` flag: sent when the open was entered, before its result was known; the low 32
/// bits name the opening thread. Userspace checks that the open succeeded (an nvidia fd in the
/// thread's table once it has left the open) before it takes the task as a GPU task.
pub const GPU_OPEN_UNCONFIRMED: u64 = 1 << 32;

/// One ring-buffer record. Fixed size: every kind uses the same layout.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    /// An [`EventKind`] as its number.
    pub kind: u32,
    /// Thread-group id (the userspace "pid") the event is about.
    pub tgid: u32,
    /// cgroup v2 id (inode of the cgroup directory) of the task when the event fired.
    pub cgroup_id: u64,
    /// `bpf_ktime_get_boot_ns()` when the event fired (CLOCK_BOOTTIME, ns).
    pub ktime_boot_ns: u64,
    /// Kind-specific: the ioctl request for `AllocIoctl` (the wrapped escape number when it came through
    /// NV_ESC_IOCTL_XFER_CMD, with bit 32 set); for `GpuOpen`, 0 when an exit probe saw the open
    /// succeed, or [`GPU_OPEN_UNCONFIRMED`] | the opening thread's id when it was sent on the
    /// open's entry (userspace checks the result); 0 otherwise.
    pub arg: u64,
    /// The task's comm, NUL-padded.
    pub comm: [u8; COMM_LEN],
}

impl Event {
    /// An all-zero event.
    pub const fn zeroed() -> Self {
        Self {
            kind: 0,
            tgid: 0,
            cgroup_id: 0,
            ktime_boot_ns: 0,
            arg: 0,
            comm: [0; COMM_LEN],
        }
    }
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for Event {}
