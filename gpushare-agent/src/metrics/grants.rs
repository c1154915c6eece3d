//! The grants' series ([`crate::verify`]): each mechanism's state, each grant's verdict, and the
//! node's count per verdict.

use super::{Family, push};

/// The grants' families, in the order they are exported.
pub(super) fn families() -> Vec<Family> {
    vec![
        Family::gauge(
            "gpushare_grant_mechanism",
            "1 for each mechanism that claims a workload's grant on a GPU, by its state (in_force, \
             absent, failed) as the kernel and the driver show it: gpushare (its own ladder, in \
             force only when it would act), driver_limit, mps, in_process, dmem (see docs/verify.md)",
        )
        .each(|snap, _, s| {
            for g in snap.grants.iter() {
                for m in &g.mechanisms {
                    let labels = vec![
                        ("workload", g.workload.clone()),
                        ("gpu_uuid", g.gpu_uuid.clone()),
                        ("mechanism", m.mechanism.as_str().to_string()),
                        ("state", m.state.as_str().to_string()),
                    ];
                    push(s, labels, 1.0);
                }
            }
        }),
        Family::gauge(
            "gpushare_grant_enforcement",
            "1 for each workload's grant on a GPU, by verdict: held (a mechanism in force and usage \
             within the grant), unenforced (no mechanism in force), violated (usage over the grant \
             while a mechanism claims to hold it)",
        )
        .each(|snap, _, s| {
            for g in snap.grants.iter() {
                let labels = vec![
                    ("workload", g.workload.clone()),
                    ("gpu_uuid", g.gpu_uuid.clone()),
                    ("verdict", g.verdict.as_str().to_string()),
                ];
                push(s, labels, 1.0);
            }
        }),
        Family::gauge(
            "gpushare_grants",
            "Grants on this node by verdict (held, unenforced, violated)",
        )
        .each(|snap, _, s| {
            for (v, n) in snap.verdict_counts() {
                push(s, vec![("verdict", v.as_str().to_string())], n as f64);
            }
        }),
    ]
}
