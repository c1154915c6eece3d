//! The agent's own health: ready, degraded, build.

use super::{Family, Labels, push};

/// The families, in the order they are exported.
pub(super) fn families() -> Vec<Family> {
    vec![
        Family::gauge(
            "gpushare_agent_ready",
            "1 once the programs are loaded and the first sample is done",
        )
        .each(|snap, _, s| push(s, Labels::new(), snap.health.ready as u8 as f64)),
        Family::gauge(
            "gpushare_agent_degraded",
            "1 while the agent runs in a degraded mode (see /healthz)",
        )
        .each(|snap, _, s| {
            push(
                s,
                Labels::new(),
                (!snap.health.degraded.is_empty()) as u8 as f64,
            )
        }),
        Family::gauge("gpushare_build_info", "Build information").each(|_, _, s| {
            let labels = vec![
                ("version", env!("CARGO_PKG_VERSION").to_string()),
                ("commit", env!("GPUSHARE_COMMIT").to_string()),
            ];
            push(s, labels, 1.0)
        }),
    ]
}
