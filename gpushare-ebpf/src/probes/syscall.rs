//! One program for every syscall: `sys_enter` / `sys_exit` as raw tracepoints (`raw_tp`) and as
//! BTF-typed raw tracepoints (`tp_btf`). They run for every syscall of every task, so the syscall
//! number is tested first: anything but ioctl and the open family returns after two compares.
//!
//! The agent attaches one set of programs (see the agent's `ebpf::PROBE_SETS`); the others stay in
//! the object so the overhead bench can measure them side by side.

use aya_ebpf::{
    EbpfContext,
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};

use super::{
    args::{BtfRegs, RawRegs, Regs, nr, open_path_arg},
    ioctl::on_ioctl,
    open::{on_enter_pending, on_enter_unconfirmed, on_exit},
};

/// What every `sys_enter` program does: an ioctl is counted, an open of the family goes to
/// `on_open` with the index of its path argument, anything else returns after two compares. The
/// registers are built (`regs`) only for those, and a compat (32-bit) syscall is ignored.
#[inline(always)]
fn on_sys_enter<R: Regs>(id: i64, regs: impl Fn() -> R, on_open: impl FnOnce(&R, usize)) {
    if id == nr::IOCTL {
        let regs = regs();
        if regs.native() {
            on_ioctl(&regs);
        }
    } else if let Some(path_arg) = open_path_arg(id) {
        let regs = regs();
        if regs.native() {
            on_open(&regs, path_arg);
        }
    }
}

/// What every `sys_exit` program does: only the open family is looked at.
#[inline(always)]
fn on_sys_exit<C: EbpfContext>(ctx: &C, regs: impl Regs, ret: impl FnOnce() -> i64) {
    if open_path_arg(regs.nr()).is_some() && regs.native() {
        on_exit(ctx, ret());
    }
}

/// `TP_PROTO(struct pt_regs *regs, long id)`, BTF-typed.
#[btf_tracepoint(function = "sys_enter")]
pub fn btf_sys_enter(ctx: BtfTracePointContext) -> i32 {
    on_sys_enter(ctx.arg(1), || BtfRegs(ctx.arg(0)), on_enter_pending);
    0
}

/// `TP_PROTO(struct pt_regs *regs, long ret)`, BTF-typed: only the open family is looked at.
#[btf_tracepoint(function = "sys_exit")]
pub fn btf_sys_exit(ctx: BtfTracePointContext) -> i32 {
    on_sys_exit(&ctx, BtfRegs(ctx.arg(0)), || ctx.arg(1));
    0
}

/// As [`btf_sys_enter`], but an nvidia open counts at once (unconfirmed: the agent checks the
/// result), with no exit probe.
#[btf_tracepoint(function = "sys_enter")]
pub fn btf_sys_enter_noexit(ctx: BtfTracePointContext) -> i32 {
    on_sys_enter(
        ctx.arg(1),
        || BtfRegs(ctx.arg(0)),
        |r, p| on_enter_unconfirmed(&ctx, r, p),
    );
    0
}

/// `TP_PROTO(struct pt_regs *regs, long id)`, untyped: registers come through probe reads.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn raw_sys_enter(ctx: RawTracePointContext) -> i32 {
    on_sys_enter(ctx.arg(1), || RawRegs(ctx.arg(0)), on_enter_pending);
    0
}

/// `TP_PROTO(struct pt_regs *regs, long ret)`, untyped.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn raw_sys_exit(ctx: RawTracePointContext) -> i32 {
    on_sys_exit(&ctx, RawRegs(ctx.arg(0)), || ctx.arg(1));
    0
}

/// An empty `tp_btf/sys_enter` program: the floor of any design that runs a program for every
/// syscall (measurement only).
#[btf_tracepoint(function = "sys_enter")]
pub fn floor_btf_sys_enter(_ctx: BtfTracePointContext) -> i32 {
    0
}
