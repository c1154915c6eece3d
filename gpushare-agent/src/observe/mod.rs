//! Observation: the GPU tasks attribution tracks, turned into the policy's input.
//!
//! - [`workloads`]: each task's process to its workload (its root cgroup), with the workload's
//!   names and the grants its containers carry;
//! - [`identity`]: who a group belongs to, proven from the container runtime's own records;
//! - [`overhead`]: what a CUDA context takes per GPU model, allowed beyond every quota;
//! - [`mechanisms`]: what the node shows of the mechanisms beside gpushare (a limiter mapped, an
//!   MPS pipe directory, `dmem`), for [`crate::verify`];
//! - [`faults`]: the driver's reports of a faulted context, from the kernel log.
//!
//! Rule of the room: this reads the node (procfs, cgroupfs, the runtime's state) and the views the
//! grant watchers publish; it never acts on a process.

pub mod faults;
pub mod identity;
pub mod mechanisms;
pub mod overhead;
pub mod workloads;
