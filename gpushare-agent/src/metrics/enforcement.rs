//! What enforcement did: actions by (action, result), changes made behind the agent's back,
//! suspends and what they moved.

use super::{Family, Labels, by_kind, push, workload_labels};

/// The families, in the order they are exported.
pub(super) fn families() -> Vec<Family> {
    vec![
        Family::counter(
            "gpushare_enforcement_actions",
            "Enforcement actions by action and result",
        )
        .each(|snap, _, s| {
            for (k, n) in snap.counters.enforcement_actions.iter() {
                let labels = vec![
                    ("action", k.action.to_string()),
                    ("result", k.result.to_string()),
                ];
                push(s, labels, n);
            }
        }),
        Family::counter(
            "gpushare_enforcement_external_changes",
            "Changes found made behind the agent's back to groups it froze (thawed, gone, replaced: \
             recreated under the same path) and earlier runs' freezes taken over (adopted)",
        )
        .each(|snap, _, s| by_kind(s, "change", &snap.counters.external_changes)),
        Family::counter(
            "gpushare_suspend_fallthroughs",
            "Suspend steps that fell through to the next step, by reason (unavailable: no driver \
             with the checkpoint API; host_memory; lock_timeout; not_supported; failed_state; error)",
        )
        .each(|snap, _, s| by_kind(s, "reason", &snap.counters.suspend_fallthroughs)),
        Family::counter(
            "gpushare_suspended_gpu_memory_moved_bytes",
            "GPU memory moved to host memory by suspends since the agent started",
        )
        .each(|snap, _, s| push(s, Labels::new(), snap.counters.suspended_bytes_total)),
        Family::gauge(
            "gpushare_workload_suspended_bytes",
            "GPU memory of a suspended workload held in host memory, bytes",
        )
        .workloads(|w, _, s| {
            if w.suspended_bytes > 0 {
                push(s, workload_labels(w), w.suspended_bytes as f64);
            }
        }),
        Family::gauge(
            "gpushare_workloads_suspended",
            "Workloads suspended (their GPU memory in host memory)",
        )
        .each(|snap, _, s| {
            let n = snap
                .workloads
                .iter()
                .filter(|w| w.state == "suspended")
                .map(|w| w.workload.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            push(s, Labels::new(), n as f64);
        }),
    ]
}
