//! Integration tests on the real kernel: real eBPF programs, cgroups, processes.
//! One target (one link step), one module per area.

mod attribution;
mod crash_points;
mod dashboards;
mod docker;
mod driver_limits;
mod enforce;
mod enforce_loop;
mod faults;
mod forged;
mod golden;
mod identity;
mod isolation;
mod kube;
mod kube_watch;
mod kubelet;
mod launch;
mod ledger;
mod nvml;
mod overhead;
mod prometheus;
mod restored_kill;
mod suspend;
mod suspend_room;
mod tenant;
mod upgrade;
mod util;
mod utilization;
mod verify;
