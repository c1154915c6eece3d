//! Types shared by gpushare's eBPF programs and its userspace agent.
//!
//! Everything here is `#[repr(C)]` plain data with explicit padding, so both sides agree on the layout
//! byte for byte. Numbers that cross the boundary (event kinds, counter slots) are stable: a retired
//! number is never reused.
//!
//! The eBPF side compiles this crate `no_std`; the agent enables the `user` feature, which adds
//! `aya::Pod` so the types can be read from maps and ring buffers.
#![no_std]
#![deny(missing_docs)]

pub mod event;
pub mod ioctl;
pub mod maps;

pub use event::{Event, EventKind, GPU_OPEN_UNCONFIRMED};
pub use maps::{Counter, GpuTask, IoctlCounts};
