//! Syscall arguments as each kind of program sees them, and this architecture's syscall numbers.
//!
//! - `syscalls:sys_enter_*` tracepoints: a record built by the kernel, argument `n` at `16 + 8n`.
//! - `tp_btf/sys_enter` (BTF-typed raw tracepoint): `struct pt_regs *` the verifier knows the type
//!   of, so a register is one direct load.
//! - `raw_tp/sys_enter`: the same pointer, untyped: each register costs a `bpf_probe_read_kernel`.

use aya_ebpf::{helpers::bpf_probe_read_kernel, programs::TracePointContext};

/// Syscall numbers (x86_64): the generic programs test these first, before anything else.
#[cfg(bpf_target_arch = "x86_64")]
pub mod nr {
    pub const IOCTL: i64 = 16;
    pub const OPEN: i64 = 2;
    pub const OPENAT: i64 = 257;
    pub const OPENAT2: i64 = 437;
}

/// Syscall numbers (aarch64, the generic table: no `open`).
#[cfg(bpf_target_arch = "aarch64")]
pub mod nr {
    pub const IOCTL: i64 = 29;
    pub const OPEN: i64 = -1;
    pub const OPENAT: i64 = 56;
    pub const OPENAT2: i64 = 437;
}

#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
compile_error!("gpushare's eBPF programs know the syscall numbers of x86_64 and aarch64 only");

/// Byte offset of syscall argument `n` (0..=2) in the kernel's `struct pt_regs`.
#[cfg(bpf_target_arch = "x86_64")]
const fn arg_offset(n: usize) -> usize {
    use aya_ebpf::bindings::pt_regs;
    match n {
        0 => core::mem::offset_of!(pt_regs, rdi),
        1 => core::mem::offset_of!(pt_regs, rsi),
        _ => core::mem::offset_of!(pt_regs, rdx),
    }
}

/// Byte offset of syscall argument `n` (0..=2) in the kernel's `struct pt_regs` (`regs[n]`).
#[cfg(bpf_target_arch = "aarch64")]
const fn arg_offset(n: usize) -> usize {
    n * 8
}

/// x86_64: `pt_regs.orig_ax` holds the syscall number during the syscall.
#[cfg(bpf_target_arch = "x86_64")]
const NR_OFFSET: usize = core::mem::offset_of!(aya_ebpf::bindings::pt_regs, orig_rax);
/// aarch64: `struct pt_regs { user_pt_regs (272 bytes); u64 orig_x0; s32 syscallno; ... }`.
#[cfg(bpf_target_arch = "aarch64")]
const NR_OFFSET: usize = 280;

/// x86_64: `pt_regs.cs` is `__USER_CS` (0x33) for a 64-bit syscall; a 32-bit task's syscalls use
/// other numbers, which the `syscalls:*` tracepoints ignore too.
#[cfg(bpf_target_arch = "x86_64")]
const NATIVE_CHECK: (usize, u64, u64) = (
    core::mem::offset_of!(aya_ebpf::bindings::pt_regs, cs),
    0xffff,
    0x33,
);
/// aarch64: `pstate` bit 4 (PSR_MODE32_BIT) is clear for a 64-bit task.
#[cfg(bpf_target_arch = "aarch64")]
const NATIVE_CHECK: (usize, u64, u64) = (264, 0x10, 0);

/// Arguments of the syscall being entered.
pub trait SyscallArgs {
    /// Argument `n` (0..=2), or `None` when it cannot be read.
    fn arg(&self, n: usize) -> Option<u64>;
}

/// The registers of a syscall being entered or left (`sys_enter` / `sys_exit` programs).
pub trait Regs: SyscallArgs {
    /// Whether the syscall is a native (64-bit) one.
    fn native(&self) -> bool;
    /// The syscall number (on exit, where it is not an argument).
    fn nr(&self) -> i64;
}

/// A `syscalls:sys_enter_*` record.
pub struct Record<'a>(pub &'a TracePointContext);

impl SyscallArgs for Record<'_> {
    #[inline(always)]
    fn arg(&self, n: usize) -> Option<u64> {
        unsafe { self.0.read_at::<u64>(16 + 8 * n) }.ok()
    }
}

/// `struct pt_regs *` of a `tp_btf` program: typed, read directly.
pub struct BtfRegs(pub *const u8);

impl BtfRegs {
    #[inline(always)]
    fn load<T: Copy>(&self, offset: usize) -> T {
        // SAFETY: the verifier types this pointer (BTF) and turns the load into a checked one.
        unsafe { *self.0.add(offset).cast::<T>() }
    }
}

impl Regs for BtfRegs {
    #[inline(always)]
    fn native(&self) -> bool {
        let (off, mask, want) = NATIVE_CHECK;
        self.load::<u64>(off) & mask == want
    }

    #[inline(always)]
    fn nr(&self) -> i64 {
        #[cfg(bpf_target_arch = "aarch64")]
        return self.load::<i32>(NR_OFFSET) as i64;
        #[cfg(not(bpf_target_arch = "aarch64"))]
        return self.load::<i64>(NR_OFFSET);
    }
}

impl SyscallArgs for BtfRegs {
    #[inline(always)]
    fn arg(&self, n: usize) -> Option<u64> {
        Some(self.load::<u64>(arg_offset(n)))
    }
}

/// `struct pt_regs *` of a `raw_tp` program: untyped, read with `bpf_probe_read_kernel`.
pub struct RawRegs(pub *const u8);

impl RawRegs {
    #[inline(always)]
    fn load<T: Copy>(&self, offset: usize) -> Option<T> {
        unsafe { bpf_probe_read_kernel(self.0.add(offset).cast::<T>()) }.ok()
    }
}

impl Regs for RawRegs {
    #[inline(always)]
    fn native(&self) -> bool {
        let (off, mask, want) = NATIVE_CHECK;
        self.load::<u64>(off).is_some_and(|v| v & mask == want)
    }

    /// -1 when unreadable.
    #[inline(always)]
    fn nr(&self) -> i64 {
        #[cfg(bpf_target_arch = "aarch64")]
        return self.load::<i32>(NR_OFFSET).map_or(-1, |n| n as i64);
        #[cfg(not(bpf_target_arch = "aarch64"))]
        return self.load::<i64>(NR_OFFSET).unwrap_or(-1);
    }
}

impl SyscallArgs for RawRegs {
    #[inline(always)]
    fn arg(&self, n: usize) -> Option<u64> {
        self.load::<u64>(arg_offset(n))
    }
}

/// Which argument holds the path of an open-family syscall `id`, if it is one.
#[inline(always)]
pub fn open_path_arg(id: i64) -> Option<usize> {
    if id == nr::OPENAT || id == nr::OPENAT2 {
        Some(1)
    } else if id == nr::OPEN {
        Some(0)
    } else {
        None
    }
}
