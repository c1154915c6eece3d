//! Maps, the loader-set global, and the small helpers every probe shares.

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_ktime_get_boot_ns},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use gpushare_common::{
    Counter, Event, EventKind, GpuTask, IoctlCounts,
    maps::{
        COUNTER_SLOTS, DEFAULT_ALLOC_EVENT_MIN_INTERVAL_NS, EVENTS_BYTES, GPU_TGID_WORDS_DEFAULT,
        MAX_GPU_TASKS,
    },
};

/// `bpf_ringbuf_submit` flag: do not wake the reader (it drains on a timer).
pub const BPF_RB_NO_WAKEUP: u64 = 1;
/// `bpf_ringbuf_submit` flag: wake the reader now.
pub const BPF_RB_FORCE_WAKEUP: u64 = 2;

#[map(name = "GPU_TASKS")]
pub static GPU_TASKS: HashMap<u32, GpuTask> = HashMap::with_max_entries(MAX_GPU_TASKS, 0);

/// `BPF_F_MMAPABLE`: the agent maps `GPU_TGID_BITS` and sets its own bits atomically.
const BPF_F_MMAPABLE: u32 = 1 << 10;

/// One bit per tgid (word `tgid / 64`, bit `tgid % 64`): set when the tgid may be a GPU task.
/// Checked before the `GPU_TASKS` lookup, so a task that is not one pays an inlined array read
/// instead of a hash lookup. Set before a task enters `GPU_TASKS`, cleared after it leaves, by the
/// kernel and by the agent (mmap), both with atomic ops. A tgid past its end (pid_max raised after
/// the load) is looked up in `GPU_TASKS`.
#[map(name = "GPU_TGID_BITS")]
pub static GPU_TGID_BITS: Array<u64> =
    Array::with_max_entries(GPU_TGID_WORDS_DEFAULT, BPF_F_MMAPABLE);

#[map(name = "IOCTL_COUNTS")]
pub static IOCTL_COUNTS: PerCpuHashMap<u32, IoctlCounts> =
    PerCpuHashMap::with_max_entries(MAX_GPU_TASKS, 0);

/// Opens of nvidia paths between their entry and exit, by thread. Least recently used first out:
/// a tenant that keeps thousands of such opens blocked (a FIFO named `/dev/nvidia-…` in its own
/// mount namespace) pushes out its own oldest entries, never keeps a new open from being seen.
const PENDING_OPENS_MAX: u32 = 4096;

#[map(name = "PENDING_OPENS")]
pub static PENDING_OPENS: LruHashMap<u64, u8> = LruHashMap::with_max_entries(PENDING_OPENS_MAX, 0);

#[map(name = "COUNTERS")]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

#[map(name = "EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Least time between two `AllocIoctl` events of one task; the loader may override it.
#[unsafe(no_mangle)]
static ALLOC_EVENT_MIN_INTERVAL_NS: u64 = DEFAULT_ALLOC_EVENT_MIN_INTERVAL_NS;

pub fn alloc_event_min_interval_ns() -> u64 {
    // Volatile so the compiler keeps the load the loader's value is patched into.
    unsafe { core::ptr::read_volatile(&ALLOC_EVENT_MIN_INTERVAL_NS) }
}

/// `tgid`'s bit: whether it is a GPU task, `None` past the bitmap (look in `GPU_TASKS`).
#[inline(always)]
pub fn gpu_task_bit(tgid: u32) -> Option<bool> {
    GPU_TGID_BITS
        .get_ptr(tgid >> 6)
        .map(|word| (unsafe { core::ptr::read_volatile(word) } >> (tgid & 63)) & 1 != 0)
}

/// Whether `tgid` may be in `GPU_TASKS` (false: it is certainly not).
#[inline(always)]
pub fn maybe_gpu_task(tgid: u32) -> bool {
    gpu_task_bit(tgid) != Some(false)
}

/// Sets `tgid`'s bit (before it enters `GPU_TASKS`).
#[inline(always)]
pub fn mark_gpu_task(tgid: u32) {
    if let Some(word) = GPU_TGID_BITS.get_ptr_mut(tgid >> 6) {
        // SAFETY: a pointer into the map value the lookup returned.
        unsafe { atomic_or(word, 1 << (tgid & 63)) };
    }
}

/// Clears `tgid`'s bit (after it left `GPU_TASKS`).
#[inline(always)]
pub fn unmark_gpu_task(tgid: u32) {
    if let Some(word) = GPU_TGID_BITS.get_ptr_mut(tgid >> 6) {
        // SAFETY: a pointer into the map value the lookup returned.
        unsafe { atomic_and(word, !(1 << (tgid & 63))) };
    }
}

/// `*word |= bits`, atomically (BPF_ATOMIC | BPF_OR). The bpfel target has no compare-and-swap, so
/// `core::sync::atomic` offers no `fetch_or`; the instruction is written out.
#[inline(always)]
unsafe fn atomic_or(word: *mut u64, bits: u64) {
    unsafe {
        core::arch::asm!("lock *(u64 *)({0} + 0) |= {1}", in(reg) word, in(reg) bits, options(nostack))
    };
}

/// `*word &= bits`, atomically (BPF_ATOMIC | BPF_AND).
#[inline(always)]
unsafe fn atomic_and(word: *mut u64, bits: u64) {
    unsafe {
        core::arch::asm!("lock *(u64 *)({0} + 0) &= {1}", in(reg) word, in(reg) bits, options(nostack))
    };
}

pub fn bump(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        unsafe { *slot += 1 };
    }
}

pub fn current_comm() -> [u8; 16] {
    bpf_get_current_comm().unwrap_or([0; 16])
}

pub fn now_boot_ns() -> u64 {
    unsafe { bpf_ktime_get_boot_ns() }
}

pub fn current_cgroup_id() -> u64 {
    unsafe { bpf_get_current_cgroup_id() }
}

/// Sends one event; counts it as lost when the ring buffer is full.
pub fn send(kind: EventKind, tgid: u32, cgroup_id: u64, arg: u64, comm: [u8; 16], wakeup: bool) {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        bump(Counter::EventsLost);
        return;
    };
    entry.write(Event {
        kind: kind as u32,
        tgid,
        cgroup_id,
        ktime_boot_ns: now_boot_ns(),
        arg,
        comm,
    });
    entry.submit(if wakeup {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    });
}

pub fn count_ioctl(tgid: u32, alloc: bool) {
    let add = alloc as u64;
    match IOCTL_COUNTS.get_ptr_mut(tgid) {
        Some(counts) => unsafe {
            (*counts).calls += 1;
            (*counts).allocs += add;
        },
        None => {
            let _ = IOCTL_COUNTS.insert(
                tgid,
                IoctlCounts {
                    calls: 1,
                    allocs: add,
                },
                0,
            );
        }
    }
}
