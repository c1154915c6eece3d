//! Maps, the loader-set global, and the small helpers every probe shares.

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_ktime_get_boot_ns},
    macros::map,
    maps::{HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use gpushare_common::{
    Counter, Event, EventKind, GpuTask, IoctlCounts,
    maps::{COUNTER_SLOTS, DEFAULT_ALLOC_EVENT_MIN_INTERVAL_NS, EVENTS_BYTES, MAX_GPU_TASKS},
};

/// `bpf_ringbuf_submit` flag: do not wake the reader (it drains on a timer).
pub const BPF_RB_NO_WAKEUP: u64 = 1;
/// `bpf_ringbuf_submit` flag: wake the reader now.
pub const BPF_RB_FORCE_WAKEUP: u64 = 2;

#[map(name = "GPU_TASKS")]
pub static GPU_TASKS: HashMap<u32, GpuTask> = HashMap::with_max_entries(MAX_GPU_TASKS, 0);

#[map(name = "IOCTL_COUNTS")]
pub static IOCTL_COUNTS: PerCpuHashMap<u32, IoctlCounts> =
    PerCpuHashMap::with_max_entries(MAX_GPU_TASKS, 0);

#[map(name = "PENDING_OPENS")]
pub static PENDING_OPENS: HashMap<u64, u8> = HashMap::with_max_entries(1024, 0);

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
