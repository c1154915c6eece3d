//! Observation: the GPU tasks attribution tracks, turned into the policy's input.
//!
//! - [`workloads`]: each task's process to its workload (its root cgroup), with the workload's
//!   names and the grants its containers carry;
//! - [`identity`]: who a group belongs to, proven from the container runtime's own records;
//! - [`overhead`]: what a CUDA context takes per GPU model, allowed beyond every quota.
//!
//! Rule of the room: this reads the node (procfs, cgroupfs, the runtime's state) and the views the
//! grant watchers publish; it never acts on a process.

pub mod identity;
pub mod overhead;
pub mod workloads;
