//! The pure policy core: `(previous state, samples, attribution, quotas, now) -> (state, actions)`.
//!
//! Design note: [`evaluate`] does no I/O, reads no clock and keeps no hidden state, so every decision
//! can be replayed in a unit test. Time is a plain [`Duration`] since an arbitrary origin (the agent
//! uses its monotonic start). All maps are ordered, so equal inputs give equal outputs, in any
//! order of `processes`.
//!
//! **Usage.** A process sample counts for the workload its pid is attributed to; usage is summed per
//! workload per GPU, and over all GPUs for an all-GPU quota. A *liability* is one (workload, GPU
//! scope) with a limit. It is *over* when usage > limit + tolerance.
//!
//! **Liable.** In `strict` mode an over liability is liable. In `elastic` mode it is liable only
//! while a GPU it uses is under pressure (free memory < `elastic_reserve`): the over-quota elastic
//! liabilities on that GPU are taken largest borrowing (usage − limit) first, until the borrowing
//! taken covers the shortfall (free + taken ≥ reserve).
//!
//! **Ladder.** A liability's clock starts the first time it is seen liable and restarts whenever it
//! is not. Step *n* fires once, when the clock reaches `max(grace, step.after)`; every step that is
//! due fires in ladder order (after a gap in sampling, several may fire together). Freeze and kill
//! act on the whole workload (its cgroup); a signal is not sent to a workload that is frozen (it could
//! not be handled). Alerts, signals and kills name the processes on the liability's GPUs; freeze and
//! thaw name all of the workload's processes.
//!
//! **Thaw.** A frozen workload is thawed as soon as no liability holds it frozen: usage back within
//! quota + tolerance, quota raised or removed, pressure gone (elastic), the workload now protected, or
//! an operator release. A workload that vanished from the attribution while frozen gets a Thaw with
//! no targets (a cgroup-only operation), so nothing stays frozen; its state is dropped.
//!
//! **Release** (`releases`, workload keys): thaw if frozen, forget all its liabilities, and escalate
//! nothing in that evaluation; its clock starts afresh, so it gets the whole grace period and ladder
//! again before it could be frozen again.
//!
//! **Safety.** No action other than Thaw for a workload that is protected (the host's root cgroup, the
//! agent's own workload, the `protect` list, a plain cgroup no file entry names) or that no quota
//! covers. Fail open: a liability whose usage is unknown (its GPU degraded, a process with
//! `used_bytes == None`, a pid attributed to two identities, an all-GPU quota while any GPU is
//! degraded, or a sample without any device) keeps its previous state unchanged, escalates nothing
//! and is counted in [`Stats::fail_open`]; a workload frozen by it stays frozen until the data is
//! good again. Targets are only ever identities from the `processes` input.
//!
//! **Dry run.** The policy decides exactly as usual and copies `dry_run` into each [`Action`]; the
//! executors must not touch anything for such an action. State advances as if the actions were
//! carried out, so reports show what would have happened.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use crate::{
    attribution::{ProcessIdentity, WorkloadKind},
    quota::{
        ByteSize, DeviceRef, EnvQuota, LimitScope, Mode, QuotaSet, ResolvedQuota, Signal,
        StepAction, WorkloadMeta, fmt_duration,
    },
    sample::GpuSample,
};

#[cfg(test)]
mod tests;

/// One verified GPU process and who it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttributedProcess {
    /// pid + start time, verified by attribution.
    pub identity: ProcessIdentity,
    /// Its workload.
    pub workload: WorkloadMeta,
    /// The quota in its environment, if any (see [`crate::quota::env`]).
    pub env_quota: Option<EnvQuota>,
}

/// Everything one evaluation looks at.
#[derive(Clone, Copy, Debug)]
pub struct PolicyInput<'a> {
    /// Time since an arbitrary fixed origin (monotonic).
    pub now: Duration,
    /// The latest NVML sample.
    pub sample: &'a GpuSample,
    /// Attributed GPU processes.
    pub processes: &'a [AttributedProcess],
    /// The quota set in force.
    pub quotas: &'a QuotaSet,
    /// Workload keys an operator asked to release since the last evaluation.
    pub releases: &'a [String],
    /// The agent's own pid: its workload is never acted on.
    pub agent_pid: Option<u32>,
    /// Copied into every action: decide, report, touch nothing.
    pub dry_run: bool,
    /// No operator configuration is in force (invalid at start, none kept): alert, take no
    /// other ladder step (they fire once this ends, when due).
    pub observe_only: bool,
}

/// What a liability's usage is measured over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuScope {
    /// Summed over all GPUs.
    All,
    /// One GPU, by NVML index.
    Gpu(u32),
}

impl fmt::Display for GpuScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("all GPUs"),
            Self::Gpu(i) => write!(f, "GPU {i}"),
        }
    }
}

impl serde::Serialize for GpuScope {
    /// `"all"` or the index as a string, so it can key a JSON object.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::All => s.serialize_str("all"),
            Self::Gpu(i) => s.serialize_str(&i.to_string()),
        }
    }
}

/// Where a liability stands on its ladder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Within quota (or over but not liable, in elastic mode without pressure).
    Ok,
    /// Liable, no step taken yet (in grace).
    OverQuota,
    /// The last step taken was an alert.
    Alerted,
    /// The last step taken was a signal.
    Signalled,
    /// The last step taken was a freeze.
    Frozen,
    /// The last step taken was a kill.
    Killed,
}

/// One liability's state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ScopeState {
    /// Ladder position.
    pub status: Status,
    /// When it was first seen liable in the current episode.
    pub over_since: Option<Duration>,
    /// How many ladder steps have been taken.
    pub steps_taken: usize,
    /// Usage at the last evaluation, bytes; `None` when unknown.
    pub usage: Option<u64>,
    /// The limit, bytes.
    pub limit: u64,
    /// The mode of the limit.
    pub mode: Mode,
}

/// One workload's state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WorkloadState {
    /// Its cgroup path.
    pub cgroup_path: String,
    /// Where its quota came from, in words.
    pub quota: String,
    /// The scope whose ladder froze it, while frozen.
    pub frozen: Option<GpuScope>,
    /// Its liabilities.
    pub scopes: BTreeMap<GpuScope, ScopeState>,
}

/// State carried from one evaluation to the next. Only quota-covered workloads (and frozen ones)
/// appear.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PolicyState {
    /// By workload key.
    pub workloads: BTreeMap<String, WorkloadState>,
}

impl PolicyState {
    /// Keys of the workloads this state holds frozen.
    pub fn frozen(&self) -> Vec<&str> {
        self.workloads
            .iter()
            .filter(|(_, w)| w.frozen.is_some())
            .map(|(k, _)| k.as_str())
            .collect()
    }
}

/// What to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Report.
    Alert,
    /// Send this signal to the targets.
    Signal(Signal),
    /// Freeze the cgroup.
    Freeze,
    /// Thaw the cgroup.
    Thaw,
    /// Kill the targets with this signal.
    Kill(Signal),
}

/// One decision for the executors.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Action {
    /// Workload key.
    pub workload: String,
    /// Its cgroup path.
    pub cgroup_path: String,
    /// The liability that caused it.
    pub gpu: GpuScope,
    /// What to do.
    pub kind: ActionKind,
    /// The verified processes it is about (from the input; may be empty for a Thaw).
    pub targets: Vec<ProcessIdentity>,
    /// Usage, bytes, when known.
    pub usage: Option<u64>,
    /// Limit, bytes, when one applies.
    pub limit: Option<u64>,
    /// Why, in words with numbers.
    pub reason: String,
    /// Dry run: report only, touch nothing.
    pub dry_run: bool,
}

/// Counts from one evaluation (for metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Workloads with attributed GPU processes.
    pub workloads: usize,
    /// Of those, protected.
    pub protected: usize,
    /// Of those, covered by no quota.
    pub unquota: usize,
    /// Liabilities over quota (liable or not).
    pub over_quota: usize,
    /// Liabilities left alone because their usage was unknown.
    pub fail_open: usize,
    /// Process samples whose pid no attributed process has.
    pub unattributed_samples: usize,
    /// Devices in the sample that are not healthy.
    pub degraded_devices: usize,
    /// Releases naming no known workload.
    pub ignored_releases: usize,
}

/// The result of one evaluation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    /// Carry into the next evaluation.
    pub state: PolicyState,
    /// What to do, in workload-key order.
    pub actions: Vec<Action>,
    /// Counts.
    pub stats: Stats,
}

#[derive(Default)]
struct DevUsage {
    bytes: u64,
    unknown: bool,
    procs: BTreeSet<ProcessIdentity>,
}

struct Group<'a> {
    meta: &'a WorkloadMeta,
    identities: BTreeSet<ProcessIdentity>,
    env: Option<&'a EnvQuota>,
}

struct Liability {
    scope: GpuScope,
    limit: u64,
    enforcement: crate::quota::Enforcement,
    usage: u64,
    unknown: bool,
    over: bool,
    liable: bool,
    /// Elastic: the GPU under pressure and its free memory.
    pressure: Option<(u32, u64)>,
}

enum Plan {
    Excluded(&'static str),
    /// A quota names a GPU by UUID that cannot be found while some GPU is degraded.
    Unresolved,
    Enforce {
        quota: ResolvedQuota,
        liabilities: Vec<Liability>,
    },
}

/// Decides what to do now. See the module note for the rules.
pub fn evaluate(prev: &PolicyState, input: &PolicyInput) -> Outcome {
    let sample = input.sample;
    let present: BTreeSet<u32> = sample
        .devices
        .iter()
        .map(|d| d.index)
        .chain(sample.health.iter().map(|(i, _)| *i))
        .collect();
    let degraded: BTreeSet<u32> = present
        .iter()
        .copied()
        .filter(|i| !sample.device_ok(*i))
        .collect();
    let blind = present.is_empty();
    let mut stats = Stats {
        degraded_devices: degraded.len(),
        ..Stats::default()
    };

    // Group processes by workload, in a fixed order.
    let mut procs: Vec<(String, &AttributedProcess)> = input
        .processes
        .iter()
        .map(|p| (p.workload.key(), p))
        .collect();
    procs.sort_by(|a, b| (&a.0, a.1.identity).cmp(&(&b.0, b.1.identity)));
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    let mut owners: BTreeMap<u32, BTreeSet<(String, ProcessIdentity)>> = BTreeMap::new();
    for (key, p) in &procs {
        let g = groups.entry(key.clone()).or_insert_with(|| Group {
            meta: &p.workload,
            identities: BTreeSet::new(),
            env: None,
        });
        g.identities.insert(p.identity);
        if g.env.is_none() {
            g.env = p.env_quota.as_ref();
        }
        owners
            .entry(p.identity.pid)
            .or_default()
            .insert((key.clone(), p.identity));
    }

    // Usage per workload per device.
    let mut usage: BTreeMap<&str, BTreeMap<u32, DevUsage>> = BTreeMap::new();
    for ps in &sample.processes {
        let Some(set) = owners.get(&ps.pid) else {
            stats.unattributed_samples += 1;
            continue;
        };
        let ambiguous = set.len() > 1;
        for (key, identity) in set {
            let du = usage
                .entry(key.as_str())
                .or_default()
                .entry(ps.device_index)
                .or_default();
            match ps.used_bytes {
                Some(b) if !ambiguous => du.bytes = du.bytes.saturating_add(b),
                _ => du.unknown = true,
            }
            if !sample.device_ok(ps.device_index) {
                du.unknown = true;
            }
            if !ambiguous {
                du.procs.insert(*identity);
            }
        }
    }
    let empty = BTreeMap::new();
    let usage_of = |key: &str| usage.get(key).unwrap_or(&empty);

    // Plan each workload: excluded, or its liabilities with usage.
    let mut plans: BTreeMap<&str, Plan> = BTreeMap::new();
    for (key, g) in &groups {
        stats.workloads += 1;
        let meta = g.meta;
        let protected = meta.id.kind == WorkloadKind::Host
            || input
                .agent_pid
                .is_some_and(|pid| g.identities.iter().any(|i| i.pid == pid))
            || input.quotas.is_protected(meta)
            || (meta.id.kind == WorkloadKind::Cgroup && !input.quotas.named_by_file(meta));
        if protected {
            stats.protected += 1;
            plans.insert(key.as_str(), Plan::Excluded("it is protected"));
            continue;
        }
        let Some(quota) = input.quotas.resolve(meta, g.env) else {
            stats.unquota += 1;
            plans.insert(key.as_str(), Plan::Excluded("no quota covers it any more"));
            continue;
        };
        let dev_usage = usage_of(key);
        let mut scopes: Vec<(GpuScope, &crate::quota::Limit)> = Vec::new();
        let mut unresolved = false;
        for limit in &quota.limits {
            let scope = match &limit.scope {
                LimitScope::AllGpusTotal => Some(GpuScope::All),
                LimitScope::Device(DeviceRef::Index(i)) => Some(GpuScope::Gpu(*i)),
                LimitScope::Device(DeviceRef::Uuid(u)) => {
                    let found = sample
                        .devices
                        .iter()
                        .find(|d| d.uuid == *u)
                        .map(|d| d.index)
                        .or_else(|| {
                            sample
                                .processes
                                .iter()
                                .find(|p| p.device_uuid == *u)
                                .map(|p| p.device_index)
                        });
                    if found.is_none() && (blind || !degraded.is_empty()) {
                        unresolved = true;
                    }
                    found.map(GpuScope::Gpu)
                }
                LimitScope::EachGpu => None,
            };
            if let Some(scope) = scope
                && !scopes.iter().any(|(s, _)| *s == scope)
            {
                scopes.push((scope, limit));
            }
        }
        for limit in quota
            .limits
            .iter()
            .filter(|l| l.scope == LimitScope::EachGpu)
        {
            for dev in dev_usage.keys() {
                let scope = GpuScope::Gpu(*dev);
                if !scopes.iter().any(|(s, _)| *s == scope) {
                    scopes.push((scope, limit));
                }
            }
        }
        if unresolved {
            plans.insert(key.as_str(), Plan::Unresolved);
            continue;
        }
        scopes.sort_by_key(|(s, _)| *s);
        let liabilities = scopes
            .into_iter()
            .map(|(scope, limit)| {
                let (used, unknown) = match scope {
                    GpuScope::All => (
                        dev_usage
                            .values()
                            .fold(0u64, |acc, d| acc.saturating_add(d.bytes)),
                        blind || !degraded.is_empty() || dev_usage.values().any(|d| d.unknown),
                    ),
                    GpuScope::Gpu(i) => {
                        let d = dev_usage.get(&i);
                        (
                            d.map_or(0, |d| d.bytes),
                            blind || degraded.contains(&i) || d.is_some_and(|d| d.unknown),
                        )
                    }
                };
                let threshold = limit
                    .bytes
                    .saturating_add(limit.enforcement.tolerance.allowance(limit.bytes));
                let over = !unknown && used > threshold;
                Liability {
                    scope,
                    limit: limit.bytes,
                    enforcement: limit.enforcement.clone(),
                    usage: used,
                    unknown,
                    over,
                    liable: over && limit.enforcement.mode == Mode::Strict,
                    pressure: None,
                }
            })
            .collect();
        plans.insert(key.as_str(), Plan::Enforce { quota, liabilities });
    }

    // Elastic: on each GPU under pressure, take the largest borrowers until the shortfall is covered.
    let reserve = input.quotas.defaults().elastic_reserve;
    for dev in &sample.devices {
        if !sample.device_ok(dev.index) || dev.memory_free >= reserve {
            continue;
        }
        let mut candidates: Vec<(u64, &str, GpuScope)> = Vec::new();
        for (key, plan) in &plans {
            let Plan::Enforce { liabilities, .. } = plan else {
                continue;
            };
            for l in liabilities {
                if l.enforcement.mode != Mode::Elastic || !l.over {
                    continue;
                }
                let borrowed = l.usage - l.limit;
                let on_dev = usage_of(key).get(&dev.index).map_or(0, |d| d.bytes);
                let share = match l.scope {
                    GpuScope::Gpu(i) if i == dev.index => borrowed,
                    GpuScope::All if on_dev > 0 => borrowed.min(on_dev),
                    _ => continue,
                };
                candidates.push((share, *key, l.scope));
            }
        }
        candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)).then(a.2.cmp(&b.2)));
        let mut projected = dev.memory_free;
        for (share, key, scope) in candidates {
            if projected >= reserve {
                break;
            }
            projected = projected.saturating_add(share);
            if let Some(Plan::Enforce { liabilities, .. }) = plans.get_mut(key)
                && let Some(l) = liabilities.iter_mut().find(|l| l.scope == scope)
                && !l.liable
            {
                l.liable = true;
                l.pressure = Some((dev.index, dev.memory_free));
            }
        }
    }

    let releases: BTreeSet<&str> = input.releases.iter().map(String::as_str).collect();
    stats.ignored_releases = releases
        .iter()
        .filter(|k| !groups.contains_key(**k) && !prev.workloads.contains_key(**k))
        .count();

    let mut next = PolicyState::default();
    let mut actions = Vec::new();
    for (key, plan) in &plans {
        let g = &groups[*key];
        let cgroup_path = g.meta.id.cgroup_path.clone();
        let all_targets: Vec<ProcessIdentity> = g.identities.iter().copied().collect();
        let act = |gpu: GpuScope,
                   kind: ActionKind,
                   targets: Vec<ProcessIdentity>,
                   usage: Option<u64>,
                   limit: Option<u64>,
                   reason: String| Action {
            workload: key.to_string(),
            cgroup_path: cgroup_path.clone(),
            gpu,
            kind,
            targets,
            usage,
            limit,
            reason,
            dry_run: input.dry_run,
        };
        let released = releases.contains(key);
        let mut prev_ws = prev.workloads.get(*key);
        if released {
            if let Some(scope) = prev_ws.and_then(|p| p.frozen) {
                actions.push(act(
                    scope,
                    ActionKind::Thaw,
                    all_targets.clone(),
                    None,
                    None,
                    "released by an operator; its ladder starts again from the grace period"
                        .to_string(),
                ));
            }
            prev_ws = None;
        }
        let (quota, liabilities) = match plan {
            Plan::Excluded(why) => {
                if let Some(scope) = prev_ws.and_then(|p| p.frozen) {
                    actions.push(act(
                        scope,
                        ActionKind::Thaw,
                        all_targets.clone(),
                        None,
                        None,
                        format!("thawed because {why}"),
                    ));
                }
                continue;
            }
            Plan::Unresolved => {
                stats.fail_open += 1;
                if let Some(p) = prev_ws {
                    next.workloads.insert(key.to_string(), p.clone());
                }
                continue;
            }
            Plan::Enforce { quota, liabilities } => (quota, liabilities),
        };
        let mut ws = WorkloadState {
            cgroup_path: cgroup_path.clone(),
            quota: quota.source.to_string(),
            frozen: prev_ws.and_then(|p| p.frozen),
            scopes: BTreeMap::new(),
        };
        let dev_usage = usage_of(key);
        let scope_targets = |scope: GpuScope| -> Vec<ProcessIdentity> {
            let set: BTreeSet<ProcessIdentity> = dev_usage
                .iter()
                .filter(|(dev, _)| scope == GpuScope::All || scope == GpuScope::Gpu(**dev))
                .flat_map(|(_, d)| d.procs.iter().copied())
                .collect();
            set.into_iter().collect()
        };
        for l in liabilities {
            let prev_ss = prev_ws.and_then(|p| p.scopes.get(&l.scope));
            let ok_state = |usage| ScopeState {
                status: Status::Ok,
                over_since: None,
                steps_taken: 0,
                usage,
                limit: l.limit,
                mode: l.enforcement.mode,
            };
            if l.over {
                stats.over_quota += 1;
            }
            if l.unknown {
                stats.fail_open += 1;
                let kept = prev_ss.cloned().map_or(ok_state(None), |mut s| {
                    s.usage = None;
                    s
                });
                ws.scopes.insert(l.scope, kept);
                continue;
            }
            if !l.liable {
                ws.scopes.insert(l.scope, ok_state(Some(l.usage)));
                continue;
            }
            let ladder = &l.enforcement.ladder;
            let (since, mut taken) = match prev_ss {
                Some(ScopeState {
                    over_since: Some(since),
                    steps_taken,
                    ..
                }) => (*since, (*steps_taken).min(ladder.len())),
                _ => (input.now, 0),
            };
            let elapsed = input.now.saturating_sub(since);
            let mut reason = format!(
                "uses {} of its {} quota on {} for {}",
                ByteSize(l.usage).approx(),
                ByteSize(l.limit).approx(),
                l.scope,
                fmt_duration(elapsed)
            );
            let tolerance = l.enforcement.tolerance.allowance(l.limit);
            if tolerance > 0 {
                reason += &format!(" (tolerance {})", ByteSize(tolerance).approx());
            }
            if let Some((dev, free)) = l.pressure {
                reason += &format!(
                    ", and GPU {dev} has {} free, below the {} reserve",
                    ByteSize(free).approx(),
                    ByteSize(reserve).approx()
                );
            }
            reason += &format!("; {}", quota.source);
            while !released && taken < ladder.len() {
                let step = ladder[taken];
                if elapsed < l.enforcement.grace.max(step.after)
                    || (input.observe_only && step.action != StepAction::Alert)
                {
                    break;
                }
                taken += 1;
                let (kind, targets) = match step.action {
                    StepAction::Alert => (ActionKind::Alert, scope_targets(l.scope)),
                    StepAction::Signal(_) if ws.frozen.is_some() => continue,
                    StepAction::Signal(sig) => (ActionKind::Signal(sig), scope_targets(l.scope)),
                    StepAction::Freeze if ws.frozen.is_some() => continue,
                    StepAction::Freeze => {
                        ws.frozen = Some(l.scope);
                        (ActionKind::Freeze, all_targets.clone())
                    }
                    StepAction::Kill(sig) => (ActionKind::Kill(sig), all_targets.clone()),
                };
                actions.push(act(
                    l.scope,
                    kind,
                    targets,
                    Some(l.usage),
                    Some(l.limit),
                    reason.clone(),
                ));
            }
            let status = match ladder[..taken].last().map(|s| s.action) {
                None => Status::OverQuota,
                Some(StepAction::Alert) => Status::Alerted,
                Some(StepAction::Signal(_)) => Status::Signalled,
                Some(StepAction::Freeze) => Status::Frozen,
                Some(StepAction::Kill(_)) => Status::Killed,
            };
            ws.scopes.insert(
                l.scope,
                ScopeState {
                    status,
                    over_since: Some(since),
                    steps_taken: taken,
                    usage: Some(l.usage),
                    limit: l.limit,
                    mode: l.enforcement.mode,
                },
            );
        }
        if let Some(frozen_by) = ws.frozen {
            let holding: Vec<GpuScope> = ws
                .scopes
                .iter()
                .filter(|(_, s)| matches!(s.status, Status::Frozen | Status::Killed))
                .map(|(scope, _)| *scope)
                .collect();
            if holding.is_empty() {
                let why = match liabilities.iter().find(|l| l.scope == frozen_by) {
                    None => format!("its quota on {frozen_by} no longer applies"),
                    Some(l) if !l.over => format!(
                        "it is back within quota: uses {} of its {} quota on {frozen_by}",
                        ByteSize(l.usage).approx(),
                        ByteSize(l.limit).approx()
                    ),
                    Some(l) if !l.liable => format!(
                        "GPU memory pressure is gone, so it may borrow again: uses {} of its {} quota on {frozen_by}",
                        ByteSize(l.usage).approx(),
                        ByteSize(l.limit).approx()
                    ),
                    Some(_) => "its ladder no longer freezes".to_string(),
                };
                let l = liabilities.iter().find(|l| l.scope == frozen_by);
                actions.push(act(
                    frozen_by,
                    ActionKind::Thaw,
                    all_targets.clone(),
                    l.filter(|l| !l.unknown).map(|l| l.usage),
                    l.map(|l| l.limit),
                    format!("thawed because {why}; {}", quota.source),
                ));
                ws.frozen = None;
            } else if !holding.contains(&frozen_by) {
                ws.frozen = Some(holding[0]);
            }
        }
        if !ws.scopes.is_empty() || ws.frozen.is_some() {
            next.workloads.insert(key.to_string(), ws);
        }
    }

    // Workloads that left the GPU while frozen: thaw the cgroup so nothing stays frozen.
    for (key, p) in &prev.workloads {
        if groups.contains_key(key) {
            continue;
        }
        if let Some(scope) = p.frozen {
            actions.push(Action {
                workload: key.clone(),
                cgroup_path: p.cgroup_path.clone(),
                gpu: scope,
                kind: ActionKind::Thaw,
                targets: Vec::new(),
                usage: None,
                limit: None,
                reason: "it has no GPU processes left; thawing its cgroup so nothing stays frozen"
                    .to_string(),
                dry_run: input.dry_run,
            });
        }
    }

    Outcome {
        state: next,
        actions,
        stats,
    }
}
