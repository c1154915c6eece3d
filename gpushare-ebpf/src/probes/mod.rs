//! One file per domain: process lifetime, nvidia device opens, ioctls; `syscall` holds the
//! programs that see every syscall (raw and BTF-typed `sys_enter`/`sys_exit`), `args` how each
//! kind of program reads syscall arguments.

mod args;
mod cgroup;
mod ioctl;
mod open;
mod process;
mod syscall;
