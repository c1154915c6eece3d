//! What the kernel tells about processes (through `/proc`) and files, read once:
//! [`mountinfo`](crate::sys::mountinfo) (where a filesystem or cgroup hierarchy is mounted) and
//! [`proc_cgroup`](crate::sys::proc_cgroup) (which cgroup a process is in); and
//! [`file_stamp`](crate::sys::file_stamp), what `stat` says identifies one version of a file.
//!
//! They use only `std`, so the test kit (and through it xtask) compiles the very same files
//! (`#[path]`): the agent, its tests and the demo cannot drift apart. The mock drivers keep parsers
//! of their own on purpose: a bug shared with the agent would hide in tests.

pub mod file_stamp;
pub mod mountinfo;
pub mod proc_cgroup;
