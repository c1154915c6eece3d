//! Each mechanism's state for one grant, from the variables that claim it and what was observed.

use super::{
    AgentMode, DmemFact, DriverLimitFact, Facts, GrantInput, MechanismCheck, MechanismKind,
    MechanismState, MpsService, ProcessFact,
};
use crate::quota::ByteSize;

const NV_LIMIT: &str = "NVIDIA_GPU_MEMORY_LIMIT";
const NV_LIMITS: &str = "NVIDIA_GPU_MEMORY_LIMITS";
const MPS_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
const HAMI_PREFIX: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// How many pids a reason names before it says how many more.
const PIDS_NAMED: usize = 3;

/// The listed mechanisms of `grant`, in [`MechanismKind`] order.
pub(super) fn all(grant: &GrantInput<'_>, facts: &Facts<'_>) -> Vec<MechanismCheck> {
    let mut out = vec![gpushare(facts.mode, facts.taken)];
    out.extend(driver_limit(grant, &facts.driver_limit));
    out.extend(mps(grant, facts.processes));
    out.extend(in_process(grant, facts.processes));
    out.push(dmem(grant, &facts.dmem));
    out
}

fn check(
    mechanism: MechanismKind,
    state: MechanismState,
    reason: impl Into<String>,
) -> MechanismCheck {
    MechanismCheck {
        mechanism,
        state,
        reason: reason.into(),
    }
}

fn set(vars: &[(String, String)], name: &str) -> bool {
    vars.iter().any(|(k, v)| k == name && !v.trim().is_empty())
}

fn value<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
    vars.iter()
        .rev()
        .find(|(k, v)| k == name && !v.trim().is_empty())
        .map(|(_, v)| v.as_str())
}

fn gpushare(mode: AgentMode, taken: bool) -> MechanismCheck {
    match mode {
        AgentMode::Enforce => check(MechanismKind::Gpushare, MechanismState::InForce, ""),
        AgentMode::DryRun if taken => check(
            MechanismKind::Gpushare,
            MechanismState::InForce,
            "taken: no other mechanism held the grant (take_unheld)",
        ),
        AgentMode::DryRun => check(
            MechanismKind::Gpushare,
            MechanismState::Absent,
            "dry run: gpushare decides and touches nothing",
        ),
        AgentMode::ObserveOnly => check(
            MechanismKind::Gpushare,
            MechanismState::Absent,
            "observe only: gpushare alerts and touches nothing",
        ),
    }
}

/// The ceiling a limit must be at or under to hold the grant.
fn ceiling(grant: &GrantInput<'_>) -> u64 {
    grant.bytes.saturating_add(grant.tolerance)
}

fn driver_limit(grant: &GrantInput<'_>, fact: &DriverLimitFact) -> Option<MechanismCheck> {
    let singular = set(grant.vars, NV_LIMIT);
    let plural = set(grant.vars, NV_LIMITS);
    let k = MechanismKind::DriverLimit;
    if let DriverLimitFact::Set { hard_bytes } = *fact {
        return Some(if hard_bytes <= ceiling(grant) {
            check(k, MechanismState::InForce, "")
        } else {
            check(
                k,
                MechanismState::Failed,
                format!(
                    "the driver's limit on GPU {} ({}) is above the grant ({})",
                    grant.gpu_index,
                    ByteSize(hard_bytes).approx(),
                    ByteSize(grant.bytes).approx()
                ),
            )
        });
    }
    if !singular && !plural {
        return None;
    }
    Some(if !singular {
        check(
            k,
            MechanismState::Absent,
            format!("{NV_LIMITS} is set; the toolkit's hook reads {NV_LIMIT}"),
        )
    } else {
        match fact {
            DriverLimitFact::Unsupported { driver } => check(
                k,
                MechanismState::Absent,
                format!("driver {driver} has no per-cgroup limits"),
            ),
            DriverLimitFact::Unknown { reason } => check(k, MechanismState::Absent, reason.clone()),
            DriverLimitFact::NotSet | DriverLimitFact::Set { .. } => check(
                k,
                MechanismState::Failed,
                format!(
                    "{NV_LIMIT} is set; the driver shows no limit on the workload's group on GPU {}",
                    grant.gpu_index
                ),
            ),
        }
    })
}

/// The host GPUs (NVML indices) a container's processes see from its variables:
/// `NVIDIA_VISIBLE_DEVICES` (host indices or UUIDs, `all`, `none`, `void`), then
/// `CUDA_VISIBLE_DEVICES` (ordinals into those, or UUIDs) on top. `None` when neither is set or a
/// value names no GPU of the node (the caller then knows nothing better to judge by).
pub fn visible_gpus(vars: &[(String, String)], node: &[(u32, &str)]) -> Option<Vec<u32>> {
    let by_name = |d: &str, within: &[u32]| -> Option<u32> {
        let d = d.trim();
        if let Ok(i) = d.parse::<usize>() {
            return within.get(i).copied();
        }
        node.iter()
            .find(|(i, u)| *u == d && within.contains(i))
            .map(|(i, _)| *i)
    };
    let all: Vec<u32> = node.iter().map(|(i, _)| *i).collect();
    let nvidia = value(vars, "NVIDIA_VISIBLE_DEVICES");
    let cuda = value(vars, "CUDA_VISIBLE_DEVICES");
    if nvidia.is_none() && cuda.is_none() {
        return None;
    }
    let host = match nvidia.map(str::trim) {
        None | Some("all") => all.clone(),
        Some("none" | "void") => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|d| by_name(d, &all))
            .collect::<Option<Vec<u32>>>()?,
    };
    match cuda {
        None => Some(host),
        Some(list) => list
            .split(',')
            .filter(|d| !d.trim().is_empty())
            .map(|d| by_name(d, &host))
            .collect(),
    }
}

fn seen(visible: &[u32]) -> String {
    match visible.len() {
        0 => "the process sees no GPU".to_string(),
        1 => "the process sees only GPU 0".to_string(),
        n => format!(
            "the process sees only GPUs {}",
            (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn named_pids(pids: &[u32]) -> String {
    let mut s = pids
        .iter()
        .take(PIDS_NAMED)
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if pids.len() > PIDS_NAMED {
        s += &format!(" and {} more", pids.len() - PIDS_NAMED);
    }
    s
}

/// Whether the MPS limit covers this GPU, or the reason it fails (a GPU it names is unseen: MPS
/// then drops every pinned limit).
fn mps_covers(grant: &GrantInput<'_>, value: &str) -> Result<bool, String> {
    let all: Vec<u32> = grant.node_gpus.iter().map(|(i, _)| *i).collect();
    let visible = grant.visible.unwrap_or(&all);
    let mut covers = false;
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((key, _)) = entry.split_once('=') else {
            covers = true;
            continue;
        };
        let key = key.trim();
        let host = match key.parse::<usize>() {
            Ok(ordinal) => visible.get(ordinal).copied(),
            Err(_) => grant
                .node_gpus
                .iter()
                .find(|(i, u)| *u == key && visible.contains(i))
                .map(|(i, _)| *i),
        };
        match host {
            Some(h) => covers |= h == grant.gpu_index,
            None if key.starts_with("MIG-") => {}
            None => {
                return Err(format!("{MPS_LIMIT} names GPU {key}, {}", seen(visible)));
            }
        }
    }
    Ok(covers)
}

fn mps(grant: &GrantInput<'_>, processes: &[ProcessFact]) -> Option<MechanismCheck> {
    let value = value(grant.vars, MPS_LIMIT)?;
    let k = MechanismKind::Mps;
    match mps_covers(grant, value) {
        Err(reason) => return Some(check(k, MechanismState::Failed, reason)),
        Ok(false) => {
            return Some(check(
                k,
                MechanismState::Absent,
                format!("{MPS_LIMIT} sets no limit on GPU {}", grant.gpu_index),
            ));
        }
        Ok(true) => {}
    }
    if processes.is_empty() {
        return Some(check(k, MechanismState::Absent, no_process(grant)));
    }
    let unserved: Vec<u32> = processes
        .iter()
        .filter(|p| p.mps == MpsService::NotServed)
        .map(|p| p.pid)
        .collect();
    if !unserved.is_empty() {
        return Some(check(
            k,
            MechanismState::Failed,
            format!("no MPS server serves pid {}", named_pids(&unserved)),
        ));
    }
    let no_pipe: Vec<u32> = processes
        .iter()
        .filter(|p| p.mps_pipe_present == Some(false))
        .map(|p| p.pid)
        .collect();
    if !no_pipe.is_empty() {
        return Some(check(
            k,
            MechanismState::Failed,
            format!(
                "the MPS pipe directory is missing as pid {} sees it",
                named_pids(&no_pipe)
            ),
        ));
    }
    if processes.iter().all(|p| p.mps == MpsService::Unknown) {
        return Some(check(
            k,
            MechanismState::Absent,
            "the driver cannot say which processes an MPS server serves",
        ));
    }
    Some(check(k, MechanismState::InForce, ""))
}

fn no_process(grant: &GrantInput<'_>) -> String {
    format!(
        "no GPU process of the workload on GPU {} to check",
        grant.gpu_index
    )
}

fn in_process(grant: &GrantInput<'_>, processes: &[ProcessFact]) -> Option<MechanismCheck> {
    if !grant
        .vars
        .iter()
        .any(|(k, v)| k.starts_with(HAMI_PREFIX) && !v.trim().is_empty())
    {
        return None;
    }
    let k = MechanismKind::InProcess;
    if processes.is_empty() {
        return Some(check(k, MechanismState::Absent, no_process(grant)));
    }
    let unmapped: Vec<u32> = processes
        .iter()
        .filter(|p| p.limiter_mapped == Some(false))
        .map(|p| p.pid)
        .collect();
    if !unmapped.is_empty() {
        // Loaded in none: it was never there (absent); in some only: it failed for the others.
        let state = if unmapped.len() == processes.len() {
            MechanismState::Absent
        } else {
            MechanismState::Failed
        };
        return Some(check(
            k,
            state,
            format!(
                "HAMi-core not mapped in pid {} (static binary?)",
                named_pids(&unmapped)
            ),
        ));
    }
    let unread: Vec<u32> = processes
        .iter()
        .filter(|p| p.limiter_mapped.is_none())
        .map(|p| p.pid)
        .collect();
    if unread.len() == processes.len() {
        return Some(check(
            k,
            MechanismState::Absent,
            format!("the maps of pid {} could not be read", named_pids(&unread)),
        ));
    }
    Some(check(k, MechanismState::InForce, ""))
}

/// Whether a mechanism a variable claims is absent for want of data (the driver could not be
/// asked, no process's maps could be read, the driver cannot say whom MPS serves): it might hold
/// the grant. (`dmem` is claimed by no variable: a group without `dmem.max` is its absence.)
pub(super) fn unobserved(
    grant: &GrantInput<'_>,
    facts: &Facts<'_>,
    mechanisms: &[MechanismCheck],
) -> bool {
    let procs = facts.processes;
    let all = |f: &dyn Fn(&ProcessFact) -> bool| !procs.is_empty() && procs.iter().all(f);
    mechanisms
        .iter()
        .filter(|m| m.state == MechanismState::Absent)
        .any(|m| match m.mechanism {
            MechanismKind::DriverLimit => {
                set(grant.vars, NV_LIMIT)
                    && matches!(facts.driver_limit, DriverLimitFact::Unknown { .. })
            }
            MechanismKind::Mps => all(&|p| p.mps == MpsService::Unknown),
            MechanismKind::InProcess => all(&|p| p.limiter_mapped.is_none()),
            MechanismKind::Gpushare | MechanismKind::Dmem => false,
        })
}

fn dmem(grant: &GrantInput<'_>, fact: &DmemFact) -> MechanismCheck {
    let k = MechanismKind::Dmem;
    match fact {
        DmemFact::NoController => check(k, MechanismState::Absent, "kernel has no dmem controller"),
        DmemFact::Unreadable { reason } => check(k, MechanismState::Absent, reason.clone()),
        DmemFact::Max(None) => check(
            k,
            MechanismState::Absent,
            "dmem.max of the workload's group is max",
        ),
        DmemFact::Max(Some(b)) if *b <= ceiling(grant) => check(k, MechanismState::InForce, ""),
        DmemFact::Max(Some(b)) => check(
            k,
            MechanismState::Failed,
            format!(
                "dmem.max ({}) is above the grant ({})",
                ByteSize(*b).approx(),
                ByteSize(grant.bytes).approx()
            ),
        ),
    }
}
