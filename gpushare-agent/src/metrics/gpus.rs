//! The GPUs' own series: memory, context overhead, health, isolation back end, utilization.

use super::{Family, gpu_labels, push};

/// The families, in the order they are exported.
pub(super) fn families() -> Vec<Family> {
    vec![
        Family::gauge("gpushare_gpu_memory_total_bytes", "GPU memory in total, bytes").each(
            |snap, _, s| {
                for g in &snap.gpus {
                    push(s, gpu_labels(g), g.memory_total_bytes as f64);
                }
            },
        ),
        Family::gauge("gpushare_gpu_memory_used_bytes", "GPU memory in use, bytes").each(
            |snap, _, s| {
                for g in &snap.gpus {
                    push(s, gpu_labels(g), g.memory_used_bytes as f64);
                }
            },
        ),
        Family::gauge(
            "gpushare_gpu_context_overhead_bytes",
            "The driver's memory (a CUDA context) allowed beyond every quota on a GPU, once per \
             workload, bytes; source: learned, set, learning or none",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                let mut labels = gpu_labels(g);
                labels.push(("source", g.context_overhead_source.clone()));
                push(s, labels, g.context_overhead_bytes as f64);
            }
        }),
        Family::gauge(
            "gpushare_gpu_healthy",
            "1 when the last NVML sample read the GPU completely",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                push(s, gpu_labels(g), g.healthy as u8 as f64);
            }
        }),
        Family::gauge(
            "gpushare_gpu_isolation_backend",
            "How quotas are enforced on a GPU: soft (the agent's ladder) or driver_limits (also the \
             NVIDIA driver's per-cgroup limits, r615+); 1 for the one in force",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                let mut l = gpu_labels(g);
                let backend = if g.isolation_backend.is_empty() {
                    "soft".to_string()
                } else {
                    g.isolation_backend.clone()
                };
                l.push(("backend", backend));
                push(s, l, 1.0);
            }
        }),
        Family::gauge(
            "gpushare_gpu_utilization_ratio",
            "Share of NVML's last sample period in which a kernel ran on the GPU, 0-1 (absent where \
             NVML does not report it: not supported, MIG)",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                if let Some(u) = g.utilization {
                    push(s, gpu_labels(g), u);
                }
            }
        }),
        Family::gauge(
            "gpushare_gpu_memory_utilization_ratio",
            "Share of NVML's last sample period in which GPU memory was read or written, 0-1 \
             (absent where not reported)",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                if let Some(u) = g.memory_utilization {
                    push(s, gpu_labels(g), u);
                }
            }
        }),
    ]
}
