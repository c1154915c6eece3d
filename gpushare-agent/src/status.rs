//! Human renderings of the agent's state: the `status` table (like nvidia-smi's) and the `check`
//! listing. Pure functions of their input.

use std::fmt::Write as _;

use crate::{
    quota::{ByteSize, QuotaRow},
    shown::shown,
    snapshot::Snapshot,
    verify::GrantVerdict,
};

/// Bytes as `12.3 GiB`: [`ByteSize::approx`], the one rounded form.
fn human_bytes(b: u64) -> String {
    ByteSize(b).approx()
}

/// A 0-1 ratio as `37%`; `-` where unknown (never 0).
/// The GPU table: one row a GPU, with the driver's memory allowed beyond each quota on it.
fn render_gpus(out: &mut String, snap: &crate::snapshot::Snapshot) {
    let _ = writeln!(
        out,
        "{:<4} {:<42} {:<24} {:>22} {:>8} {:>5}  CONTEXT",
        "GPU", "UUID", "NAME", "MEMORY USED / TOTAL", "GPU-UTIL", "OK"
    );
    for g in &snap.gpus {
        let _ = writeln!(
            out,
            "{:<4} {:<42} {:<24} {:>22} {:>8} {:>5}  {}",
            g.index,
            g.uuid,
            truncate(&shown(&g.name), 24),
            format!(
                "{} / {}",
                human_bytes(g.memory_used_bytes),
                human_bytes(g.memory_total_bytes)
            ),
            human_ratio(g.utilization),
            if g.healthy { "yes" } else { "NO" },
            context(g)
        );
    }
    if snap.gpus.is_empty() {
        let _ = writeln!(out, "(no GPU sampled)");
    }
}

/// The driver's memory allowed beyond each quota on a GPU: `300.0MiB learned`, `450.0MiB set`,
/// `learning`, or `-`.
fn context(g: &crate::snapshot::GpuView) -> String {
    match (g.context_overhead_bytes, g.context_overhead_source.as_str()) {
        (0, "learning") => "learning".into(),
        (0, _) => "-".into(),
        (b, source) => format!("{} {source}", human_bytes(b)),
    }
}

fn human_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{:.0}%", r * 100.0))
}

fn human_secs(s: f64) -> String {
    let s = s as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// `status --verify`'s exit status when a grant is unenforced or violated.
pub const VERIFY_BAD: u8 = 1;
/// `status --verify`'s exit status when no agent answers (nothing is known of any grant).
pub const VERIFY_NO_AGENT: u8 = 2;

/// `status --verify`'s exit status for `snap`: 0 when every grant is held, [`VERIFY_BAD`]
/// otherwise.
pub fn verify_exit(snap: &Snapshot) -> u8 {
    if snap.grants.iter().all(|g| g.verdict == GrantVerdict::Held) {
        0
    } else {
        VERIFY_BAD
    }
}

/// The verdict column of a workload's row: its grant's on that GPU, `-` without one.
fn verdict_of<'a>(snap: &'a Snapshot, workload: &str, gpu_uuid: &str) -> &'a str {
    snap.grants
        .iter()
        .find(|g| g.workload == workload && g.gpu_uuid == gpu_uuid)
        .map_or("-", |g| g.verdict.as_str())
}

/// Under a workload's row whose grant is not held: each mechanism's state and why.
fn grant_reasons(out: &mut String, snap: &Snapshot, workload: &str, gpu_uuid: &str) {
    let bad = snap.grants.iter().find(|g| {
        g.workload == workload && g.gpu_uuid == gpu_uuid && g.verdict != GrantVerdict::Held
    });
    for m in bad.iter().flat_map(|g| &g.mechanisms) {
        if !m.reason.is_empty() {
            let (k, s) = (m.mechanism.as_str(), m.state.as_str());
            let _ = writeln!(out, "    {k} {s}: {}", shown(&m.reason));
        }
    }
}

/// The row's three largest processes, as `pid(comm) size`.
fn top_processes(snap: &Snapshot, w: &crate::snapshot::WorkloadEntry) -> String {
    let mut procs: Vec<_> = snap
        .processes
        .iter()
        .filter(|p| p.workload == w.workload && (w.gpu_uuid == "all" || p.gpu_uuid == w.gpu_uuid))
        .collect();
    procs.sort_by_key(|p| std::cmp::Reverse(p.used_bytes));
    let top: Vec<String> = procs
        .iter()
        .take(3)
        .map(|p| {
            format!(
                "{}({}) {}",
                p.pid,
                shown(&p.comm),
                p.used_bytes
                    .map(human_bytes)
                    .unwrap_or_else(|| "n/a".into())
            )
        })
        .collect();
    top.join(", ")
}

/// The `status` table.
pub fn render_status(snap: &Snapshot) -> String {
    let mut out = String::new();
    let h = &snap.health;
    let _ = writeln!(
        out,
        "gpushare {}  attribution: {}  nvml: {}{}",
        snap.version,
        h.attribution,
        h.nvml,
        if h.dry_run { "  DRY RUN" } else { "" }
    );
    if h.observe_only {
        let _ = writeln!(
            out,
            "  OBSERVE ONLY: alerts and metrics, no signal, freeze or kill"
        );
    }
    for d in &h.degraded {
        let _ = writeln!(out, "  degraded: {}", shown(d));
    }
    let _ = writeln!(out);
    render_gpus(&mut out, snap);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<28} {:<6} {:>10} {:>10} {:>6} {:>4} {:<11} {:>8} {:<10}  TOP PROCESSES",
        "WORKLOAD", "GPU", "USED", "QUOTA", "USE%", "SM%", "STATE", "FOR", "GRANT"
    );
    for w in &snap.workloads {
        let gpu = if w.gpu_uuid == "all" {
            "all".to_string()
        } else {
            snap.gpus
                .iter()
                .find(|g| g.uuid == w.gpu_uuid)
                .map(|g| g.index.to_string())
                .unwrap_or_else(|| "?".into())
        };
        let (quota, pct) = match w.quota_bytes {
            Some(q) if q > 0 => (
                human_bytes(q),
                format!("{:.0}%", w.used_bytes as f64 * 100.0 / q as f64),
            ),
            Some(q) => (human_bytes(q), "-".into()),
            None => ("-".into(), "-".into()),
        };
        let _ = writeln!(
            out,
            "{:<28} {:<6} {:>10} {:>10} {:>6} {:>4} {:<11} {:>8} {:<10}  {}",
            truncate(&shown(&w.workload), 28),
            gpu,
            human_bytes(w.used_bytes),
            quota,
            pct,
            human_ratio(w.utilization),
            w.state,
            human_secs(w.state_for_secs),
            verdict_of(snap, &w.workload, &w.gpu_uuid),
            top_processes(snap, w)
        );
        grant_reasons(&mut out, snap, &w.workload, &w.gpu_uuid);
        if w.suspended_bytes > 0 {
            let _ = writeln!(
                out,
                "    {} of its GPU memory is held in host memory (suspended)",
                human_bytes(w.suspended_bytes)
            );
        }
        if !w.detail.is_empty() {
            let _ = writeln!(out, "    {}", shown(&w.detail));
        }
    }
    if snap.workloads.is_empty() {
        let _ = writeln!(out, "(no workload on any GPU)");
    }
    let mut noted = std::collections::BTreeSet::new();
    for w in &snap.workloads {
        if !noted.insert(&w.workload) {
            continue;
        }
        if w.quota_trust == "init_environ" {
            let _ = writeln!(
                out,
                "  note: {}: environment quota read from its init process (no runtime spec found): lower trust",
                shown(&w.workload)
            );
        }
        match w.identity.as_str() {
            "degraded" => {
                let _ = writeln!(
                    out,
                    "  note: {}: identity degraded: taken from its runtime's place alone (no runtime record could be read)",
                    w.workload
                );
            }
            "conflict" => {
                let _ = writeln!(
                    out,
                    "  note: {}: identity conflict: another group claims the same container or pod; only quotas naming its path apply",
                    w.workload
                );
            }
            _ => {}
        }
        for n in &w.nested {
            let _ = writeln!(
                out,
                "  nested: {n} (part of {}, under its quota)",
                w.workload
            );
        }
    }
    out
}

/// The `check` listing of effective quotas.
pub fn render_quota_rows(rows: &[QuotaRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<34} {:<36} {:<10} {:>10} {:<8} {:<9} {:<6} LADDER",
        "ORIGIN", "SELECTOR", "GPU", "MEMORY", "MODE", "TOLERANCE", "GRACE"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<34} {:<36} {:<10} {:>10} {:<8} {:<9} {:<6} {}",
            truncate(&shown(&r.origin), 34),
            truncate(&shown(&r.selector), 36),
            r.gpu,
            r.memory,
            r.mode,
            r.tolerance,
            r.grace,
            r.ladder
        );
    }
    if rows.is_empty() {
        let _ = writeln!(
            out,
            "(no quota entries: only quotas from workloads' environments apply)"
        );
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        snapshot::{GrantView, WorkloadView},
        verify::{MechanismCheck, MechanismKind, MechanismState},
    };

    fn snap(verdicts: &[GrantVerdict]) -> Snapshot {
        let mut s = Snapshot::default();
        let mut grants = Vec::new();
        for (i, &verdict) in verdicts.iter().enumerate() {
            let workload = format!("docker://w{i}");
            s.workloads.push(
                WorkloadView {
                    workload: workload.clone(),
                    gpu_uuid: "GPU-0".into(),
                    quota_bytes: Some(1 << 30),
                    state: "ok".into(),
                    ..Default::default()
                }
                .into(),
            );
            grants.push(GrantView {
                workload,
                gpu_uuid: "GPU-0".into(),
                grant_bytes: 1 << 30,
                used_bytes: 0,
                verdict,
                mechanisms: vec![
                    MechanismCheck {
                        mechanism: MechanismKind::Gpushare,
                        state: MechanismState::Absent,
                        reason: "dry run: gpushare decides and touches nothing".into(),
                    },
                    MechanismCheck {
                        mechanism: MechanismKind::Mps,
                        state: MechanismState::Failed,
                        reason: "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names GPU \u{1b}[31m".into(),
                    },
                ],
            });
        }
        s.grants = grants.into();
        s
    }

    #[test]
    fn verify_exits_1_unless_every_grant_is_held() {
        use GrantVerdict::*;
        for (verdicts, code) in [
            (&[][..], 0),
            (&[Held, Held][..], 0),
            (&[Held, Unenforced][..], VERIFY_BAD),
            (&[Violated][..], VERIFY_BAD),
        ] {
            assert_eq!(verify_exit(&snap(verdicts)), code, "{verdicts:?}");
        }
        assert_ne!(VERIFY_BAD, VERIFY_NO_AGENT);
    }

    /// The `GRANT` column, and the mechanisms' reasons (escaped) under a grant not held only.
    #[test]
    fn the_grant_column_and_reasons_under_a_grant_not_held() {
        let text = render_status(&snap(&[GrantVerdict::Held, GrantVerdict::Unenforced]));
        assert!(text.contains(" GRANT "), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        let row = |w: &str| lines.iter().position(|l| l.starts_with(w)).unwrap();
        let (held, bad) = (row("docker://w0"), row("docker://w1"));
        assert!(lines[held].contains(" held "), "{text}");
        assert!(lines[bad].contains(" unenforced "), "{text}");
        assert!(!lines[held + 1].contains("gpushare absent"), "{text}");
        assert_eq!(
            lines[bad + 1],
            "    gpushare absent: dry run: gpushare decides and touches nothing"
        );
        assert!(lines[bad + 2].starts_with("    mps failed: "), "{text}");
        assert!(
            !text.contains('\u{1b}'),
            "a tenant's bytes are escaped: {text}"
        );
    }
}
