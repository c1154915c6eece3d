//! Stage 6: which liability holds the workload's freeze or suspension, or why none does any more.
//!
//! **Thaw.** A frozen workload is thawed as soon as no liability holds it frozen: usage back within
//! quota + tolerance, quota raised or removed, pressure gone (elastic), the workload now protected, or
//! an operator release. A suspended one is resumed likewise once no liability holds it suspended.
//! When the liability that held it no longer does but another does, the other holds it.

use super::{
    input::GpuScope,
    plan::Liability,
    state::{Status, WorkloadState},
};
use crate::quota::{ByteSize, ResolvedQuota};

/// Moves the workload's wanted freeze and suspension to a liability that still holds them, or
/// drops them; returns why it is to be thawed (or resumed) when none does any more, or it was
/// released.
pub(super) fn holding(
    ws: &mut WorkloadState,
    liabilities: &[Liability],
    quota: &ResolvedQuota,
    released: bool,
) -> Option<String> {
    let mut thaw_why = None;
    // Why the liability `by` no longer holds the workload; `room`: what an elastic one that
    // is no longer liable got back.
    let no_longer = |by: GpuScope, room: &str, ladder: &str| -> String {
        let why = match liabilities.iter().find(|l| l.scope == by) {
            None => format!("its quota on {by} no longer applies"),
            Some(l) if !l.over => format!(
                "it is back within quota: uses {} of its {} quota on {by}",
                ByteSize(l.usage).approx(),
                ByteSize(l.limit).approx()
            ),
            Some(l) if !l.liable => format!(
                "{room}: uses {} of its {} quota on {by}",
                ByteSize(l.usage).approx(),
                ByteSize(l.limit).approx()
            ),
            Some(_) => ladder.to_string(),
        };
        format!("thawed because {why}; {}", quota.source)
    };
    if let Some(by) = ws.suspended {
        ws.suspended = holder(ws, by, &[Status::Suspended, Status::Killed]);
        if ws.suspended.is_none() {
            thaw_why = Some(no_longer(
                by,
                "the GPU has room for it again",
                "its ladder no longer suspends",
            ));
        }
    }
    if ws
        .scopes
        .values()
        .all(|s| s.status == Status::Ok && s.over_since.is_none())
    {
        // A new episode (no clock runs, not even cooling down) gets its suspend step back.
        ws.suspend_failed = None;
    }
    if let Some(by) = ws.frozen {
        ws.frozen = holder(ws, by, &[Status::Frozen, Status::Suspended, Status::Killed]);
        if ws.frozen.is_none() {
            thaw_why = Some(no_longer(
                by,
                "GPU memory pressure is gone, so it may borrow again",
                "its ladder no longer freezes",
            ));
        }
    }
    if released {
        thaw_why =
            Some("released by an operator; its ladder starts again from the grace period".into());
    }
    thaw_why
}

/// The scope that holds the workload at one of `positions`: `by` while it still does, else the
/// first that does, else none.
fn holder(ws: &WorkloadState, by: GpuScope, positions: &[Status]) -> Option<GpuScope> {
    let holding: Vec<GpuScope> = ws
        .scopes
        .iter()
        .filter(|(_, s)| positions.contains(&s.status))
        .map(|(scope, _)| *scope)
        .collect();
    if holding.contains(&by) {
        Some(by)
    } else {
        holding.first().copied()
    }
}
