//! Each workload on each GPU: utilization, driver limits on its group, memory used, quota, what its
//! identity rests on, and its isolation state (rows cached by the scrape cache).

use super::{Family, ISOLATION_STATES, push, workload_labels, workload_with};

/// The families, in the order they are exported.
pub(super) fn families() -> Vec<Family> {
    vec![
        Family::gauge(
            "gpushare_workload_gpu_utilization_ratio",
            "SM utilization of a workload's processes on a GPU over its last sample window, summed, \
             0-1 (absent where unknown: not supported, MIG, or no process verified for the window)",
        )
        .workloads(|w, _, s| {
            if let Some(u) = w.utilization {
                push(s, workload_labels(w), u.0);
            }
        }),
        Family::gauge(
            "gpushare_workload_gpu_memory_utilization_ratio",
            "Memory-controller utilization of a workload's processes on a GPU, summed, 0-1 (absent \
             where unknown)",
        )
        .workloads(|w, _, s| {
            if let Some(u) = w.memory_utilization {
                push(s, workload_labels(w), u.0);
            }
        }),
        Family::gauge(
            "gpushare_driver_limit_bytes",
            "Driver-enforced GPU memory limits (nvmlDeviceSetMemoryLimits_v1) on the cgroups of \
             workloads under a quota, bytes, by kind (soft, hard) and source (agent: set by gpushare; \
             other: set by someone else, e.g. NVIDIA's container hook, and left as it is)",
        )
        .each(|snap, _, s| {
            for l in snap.driver_limits.iter() {
                let labels = |kind: &'static str| {
                    vec![
                        ("gpu_uuid", l.gpu_uuid.clone()),
                        ("cgroup", l.cgroup_path.clone()),
                        ("kind", kind.to_string()),
                        ("source", l.source.clone()),
                    ]
                };
                if l.soft_bytes > 0 {
                    push(s, labels("soft"), l.soft_bytes as f64);
                }
                if l.hard_bytes != u64::MAX {
                    push(s, labels("hard"), l.hard_bytes as f64);
                }
            }
        }),
        Family::gauge(
            "gpushare_workload_gpu_memory_used_bytes",
            "GPU memory used by a workload, bytes",
        )
        .workloads(|w, _, s| push(s, workload_labels(w), w.used_bytes as f64)),
        Family::gauge(
            "gpushare_workload_gpu_memory_quota_bytes",
            "GPU memory quota of a workload, bytes",
        )
        .workloads(|w, _, s| {
            if let Some(q) = w.quota_bytes {
                push(s, workload_with(w, "quota_trust", &w.quota_trust), q as f64);
            }
        }),
        Family::gauge(
            "gpushare_workload_identity",
            "What a container's or pod's identity rests on, 1 per workload row: identity=runtime (its \
             runtime's record names its group), degraded (its runtime's place alone), conflict \
             (two groups claimed it; a plain cgroup now)",
        )
        .workloads(|w, _, s| {
            if !w.identity.is_empty() {
                push(s, workload_with(w, "identity", &w.identity), 1.0);
            }
        }),
        Family::gauge(
            "gpushare_workload_isolation_state",
            "Isolation state of a workload: one series per state, 1 for the current one",
        )
        .workloads(|w, _, s| {
            let other = (!ISOLATION_STATES.contains(&&*w.state)).then_some(&*w.state);
            for state in ISOLATION_STATES.iter().copied().chain(other) {
                push(s, workload_with(w, "state", state), (state == w.state) as u8 as f64);
            }
        }),
    ]
}
