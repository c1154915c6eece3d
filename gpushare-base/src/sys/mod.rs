//! What the kernel tells about processes (through `/proc`) and files, read once:
//! [`mountinfo`](crate::sys::mountinfo) (where a filesystem or cgroup hierarchy is mounted),
//! [`proc_cgroup`](crate::sys::proc_cgroup) (which cgroup a process is in) and
//! [`proc_status`](crate::sys::proc_status) (a process's group, parent, namespaces, signals),
//! all read as bytes and named as [`kernel_text`](crate::sys::kernel_text) keeps them; and
//! [`file_stamp`](crate::sys::file_stamp), what `stat` says identifies one version of a file.
//!
//! They use only `std`, and the agent, its test kit and xtask use the very same code (this crate):
//! the agent, its tests and the demo cannot drift apart. The mock drivers keep parsers of their
//! own on purpose: a bug shared with the agent would hide in tests.

pub mod file_stamp;
pub mod kernel_text;
pub mod mountinfo;
pub mod proc_cgroup;
pub mod proc_maps;
pub mod proc_status;
