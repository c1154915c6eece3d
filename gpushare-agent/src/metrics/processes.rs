//! GPU processes (with `--process-metrics` only) and the memory of processes no workload was found
//! for.

use super::{Family, process_labels, push};

/// The families, in the order they are exported.
pub(super) fn families() -> Vec<Family> {
    vec![
        Family::gauge(
            "gpushare_process_gpu_memory_used_bytes",
            "GPU memory used by a process, bytes (with --process-metrics only)",
        )
        .processes(|p, s| {
            if let Some(b) = p.used_bytes {
                push(s, process_labels(p), b as f64);
            }
        }),
        Family::gauge(
            "gpushare_process_gpu_utilization_ratio",
            "SM utilization of a process over its GPU's last sample window, 0-1 (0: no sample, \
             idle; absent where unknown; with --process-metrics only)",
        )
        .processes(|p, s| {
            if let Some(u) = p.utilization {
                push(s, process_labels(p), u.0);
            }
        }),
        Family::gauge(
            "gpushare_unattributed_gpu_memory_bytes",
            "GPU memory of processes no workload was found for, bytes",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                let b = *snap.unattributed_bytes.get(&g.uuid).unwrap_or(&0);
                push(s, vec![("gpu_uuid", g.uuid.clone())], b as f64);
            }
        }),
    ]
}
