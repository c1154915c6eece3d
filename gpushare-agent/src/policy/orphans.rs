//! Stage 8: workloads that left the attribution (no GPU processes left), or are known only from
//! an earlier run's freezes.
//!
//! A workload that left the attribution while frozen gets a Thaw with no targets (a cgroup-only
//! operation), unless the sample is blind or a GPU is degraded (its processes might only be
//! unseen); its state is dropped once the group is thawed. Those known only from an earlier
//! run's freezes can be released too.

use std::collections::BTreeSet;

use super::{
    Cx, Out, Step,
    adopt::thaw_only,
    input::{GpuScope, GroupState},
    workload::unwind,
};

/// Thaws (or, on bad data, keeps frozen) what the agent froze of workloads without processes.
pub(super) fn decide(step: &Step, out: &mut Out) {
    let (prev, input) = (step.prev, step.input);
    let groups = &step.workloads.groups;
    let mut orphans: BTreeSet<&str> = prev
        .workloads
        .keys()
        .map(String::as_str)
        .filter(|k| !groups.contains_key(*k))
        .collect();
    orphans.extend(
        input
            .observed
            .keys()
            .filter(|k| !groups.contains_key(k.as_str()))
            .map(String::as_str),
    );
    for key in orphans {
        let observed = input.observed.get(key);
        match observed.map(|o| o.state) {
            Some(GroupState::Gone) => out.stats.groups_gone += 1,
            Some(GroupState::Replaced) => out.stats.groups_replaced += 1,
            _ => {}
        }
        let Some(o) = observed.filter(|o| o.ours) else {
            continue; // not a group the agent froze: nothing to undo, state dropped
        };
        let cx = Cx::new(step, key, &o.cgroup_path);
        let ws = thaw_only(&cx, prev.workloads.get(key), o);
        if !cx.released && !step.devices.trustworthy() {
            // Its processes may only be unseen: keep the freeze until the data is good.
            let mut ws = ws;
            ws.frozen = ws.frozen.or(o.frozen_by).or(Some(GpuScope::All));
            ws.observed = Some(o.state);
            ws.ours = true;
            out.next.workloads.insert(key.to_string(), ws);
            continue;
        }
        let why = if cx.released {
            "released by an operator".to_string()
        } else {
            "it has no GPU processes left; thawing its cgroup so nothing stays frozen".to_string()
        };
        if let Some(ws) = unwind(&cx, ws, o, &why, &mut out.actions) {
            out.next.workloads.insert(key.to_string(), ws);
        }
    }
}
