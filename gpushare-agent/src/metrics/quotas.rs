//! Where quotas come from: environment quotas, the Kubernetes clients, the quota files.

use super::{Family, Labels, by_kind, push};

/// The families, in the order they are exported.
pub(super) fn families() -> Vec<Family> {
    vec![
        Family::counter(
            "gpushare_env_quota_errors",
            "Malformed environment-quota variables and unreadable runtime specs (each ignored)",
        )
        .each(|snap, _, s| push(s, Labels::new(), snap.counters.env_quota_errors)),
        Family::counter(
            "gpushare_env_quota_disagreements",
            "Environment-quota variables that disagree with the devices the runtime gave, or hold a value no plugin writes, by kind",
        )
        .each(|snap, _, s| by_kind(s, "kind", &snap.counters.env_quota_disagreements)),
        Family::counter(
            "gpushare_kubernetes",
            "The API server's reads and Kubernetes Events, by what (api_reads, api_errors, annotation_edits_ignored, events_created, events_patched, events_skipped, events_dropped, events_errors)",
        )
        .each(|snap, _, s| by_kind(s, "what", snap.counters.kubernetes.labelled())),
        Family::gauge(
            "gpushare_env_quota_unit_mismatch",
            "1 for a workload whose ALIYUN_COM_GPU_MEM_DEV says the device plugin's unit is not gpushare_memory_unit",
        )
        .each(|snap, _, s| {
            for k in snap.counters.env_quota_unit_mismatch.keys() {
                push(s, vec![("workload", k.clone())], 1.0);
            }
        }),
        Family::gauge(
            "gpushare_quota_config_valid",
            "1 when the quota files loaded cleanly; 0 while the last good configuration is kept",
        )
        .each(|snap, _, s| {
            push(s, Labels::new(), snap.counters.quota_config_valid as u8 as f64)
        }),
        Family::gauge(
            "gpushare_quota_config_last_reload_timestamp_seconds",
            "When the quota configuration was last loaded",
        )
        .each(|snap, _, s| push(s, Labels::new(), snap.counters.quota_config_last_reload_unix)),
    ]
}
