//! What observing found and cost: workload-identity events, identity checks, attribution work,
//! GPU ioctls, kernel events, NVML errors.

use super::{Family, Labels, by_kind, push};

/// The families, in the order they are exported.
pub(super) fn families() -> Vec<Family> {
    vec![
        Family::counter(
            "gpushare_workload_identity_events",
            "Workload-identity events: two groups claiming one container or pod identity \
             (conflict), a container's runtime record naming another group (record_mismatch)",
        )
        .each(|snap, _, s| by_kind(s, "kind", &snap.counters.workload_identity)),
        Family::counter(
            "gpushare_identity_checks",
            "GPU tasks dropped because they exited (exited), sampled pids whose tracked process had \
             exited and were attributed afresh (stale_identity), sample records left unknown \
             because their pid's process started after the sample (unverifiable), pids rejected \
             at attribution (rejected)",
        )
        .each(|snap, _, s| by_kind(s, "kind", &snap.counters.identity)),
        Family::counter(
            "gpushare_attribution_work",
            "Work attribution did whose amount processes choose: unconfirmed nvidia opens checked \
             in /proc (open_checks) and found failed (failed_opens), /proc/<pid>/fd entries read \
             (fd_entries_read), cgroup ids resolved by opening the group (cgroup_id_lookups), \
             walks of the cgroup hierarchy (cgroup_rescans) and the directories they read \
             (cgroup_dirs_walked)",
        )
        .each(|snap, _, s| by_kind(s, "kind", &snap.counters.attribution_work)),
        Family::counter(
            "gpushare_gpu_ioctls",
            "ioctls issued by the GPU tasks of a workload",
        )
        .each(|snap, _, s| by_kind(s, "workload", snap.counters.gpu_ioctls.iter())),
        Family::counter("gpushare_ebpf_events", "Kernel events received by kind")
            .each(|snap, _, s| by_kind(s, "kind", &snap.counters.ebpf_events)),
        Family::counter(
            "gpushare_ebpf_events_lost",
            "Kernel events lost because the ring buffer was full",
        )
        .each(|snap, _, s| push(s, Labels::new(), snap.counters.ebpf_events_lost)),
        Family::counter("gpushare_nvml_errors", "NVML calls that failed, by call")
            .each(|snap, _, s| by_kind(s, "call", &snap.counters.nvml_errors)),
    ]
}
