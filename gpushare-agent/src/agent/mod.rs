//! The agent proper: one synchronous step ([`Agent::tick`]) from a sample to published state:
//! sample NVML, attribute, read environment quotas, evaluate the pure policy, execute its actions,
//! publish a snapshot. The async event loop ([`crate::run`]) only decides *when* to step.

pub mod quota_store;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use log::{debug, info, warn};

use self::quota_store::QuotaStore;
use crate::{
    attribution::{Change, ProcessIdentity, WorkloadKind, tracker::Tracker},
    enforce::{Enforcer, Outcome as ExecOutcome},
    metrics::{Metrics, SharedSnapshot},
    nvml::{DriverStatus, NvmlSampler},
    policy::{self, Action, ActionKind, AttributedProcess, GpuScope, PolicyState, Status},
    quota::{
        EnvQuota, StepAction, WorkloadMeta,
        env::{env_quota, parse_environ},
    },
    sample::GpuSample,
    snapshot::{Counters, GpuView, Health, ProcessView, QuotaView, Snapshot, WorkloadView},
};

/// Options that change what the agent does (not where it reads from).
#[derive(Clone, Debug, Default)]
pub struct AgentOptions {
    /// Decide and report, touch nothing.
    pub dry_run: bool,
    /// On SIGTERM, leave frozen workloads frozen (the ledger keeps them for the next start).
    pub keep_frozen_on_exit: bool,
}

/// The agent's state between steps.
pub struct Agent {
    /// Attribution.
    pub tracker: Tracker,
    sampler: NvmlSampler,
    quotas: QuotaStore,
    enforcer: Enforcer,
    policy: PolicyState,
    opts: AgentOptions,
    started: Instant,
    env_cache: HashMap<ProcessIdentity, Option<EnvQuota>>,
    env_errors: u64,
    enforcement_counts: BTreeMap<String, u64>,
    ioctl_seen: HashMap<ProcessIdentity, (String, u64)>,
    ioctl_totals: BTreeMap<String, u64>,
    metrics: Arc<Metrics>,
    snapshot: SharedSnapshot,
    pending_releases: Vec<String>,
    ledger_reconciled: bool,
    state_since: HashMap<(String, String), (String, Instant)>,
    ready: bool,
    names: NameCache,
}

/// Human names of a workload the node can tell without an API server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadNames {
    /// Kubernetes namespace.
    pub namespace: Option<String>,
    /// Kubernetes pod name.
    pub pod: Option<String>,
    /// Container name (Kubernetes container, or the runtime's container name).
    pub container: Option<String>,
}

/// Names per workload key, looked up on disk (`/var/log/pods`, `/var/log/containers`, the container
/// engine's state) and cached; a miss is retried at most every 10 s.
#[derive(Default)]
struct NameCache(HashMap<String, (WorkloadNames, Instant)>);

impl NameCache {
    const RETRY: Duration = Duration::from_secs(10);

    fn get(&mut self, id: &crate::attribution::WorkloadId) -> WorkloadNames {
        let key = id.key();
        if let Some((names, at)) = self.0.get(&key)
            && (*names != WorkloadNames::default() || at.elapsed() < Self::RETRY)
        {
            return names.clone();
        }
        let names = lookup_names(id);
        self.0.insert(key, (names.clone(), Instant::now()));
        names
    }

    fn retain(&mut self, live: &std::collections::HashSet<String>) {
        self.0.retain(|k, _| live.contains(k));
    }
}

fn lookup_names(id: &crate::attribution::WorkloadId) -> WorkloadNames {
    use crate::attribution::k8s_names::{
        CONTAINER_LOG_ROOT, POD_LOG_ROOT, container_names_from_log_links, pod_names_from_log_dir,
    };
    let mut names = WorkloadNames::default();
    if let Some(cid) = id.container_id()
        && let Some(c) =
            container_names_from_log_links(std::path::Path::new(CONTAINER_LOG_ROOT), cid)
    {
        names.namespace = Some(c.namespace);
        names.pod = Some(c.pod);
        names.container = Some(c.container);
        return names;
    }
    // A plain Docker container: its name from the engine's on-disk config (no API call). In a pod
    // the engine's `k8s_...` name is not the pod spec's, so only plain containers are looked up.
    if let WorkloadKind::Container {
        runtime: crate::attribution::workload::Runtime::Docker,
        container_id,
        pod_uid: None,
        ..
    } = &id.kind
    {
        use crate::attribution::docker::{DAEMON_JSON, data_root_from, docker_container_name};
        let root = data_root_from(std::path::Path::new(DAEMON_JSON));
        names.container = docker_container_name(&root, container_id);
        return names;
    }
    if let Some(uid) = id.pod_uid()
        && let Some(p) = pod_names_from_log_dir(std::path::Path::new(POD_LOG_ROOT), uid)
    {
        names.namespace = Some(p.namespace);
        names.pod = Some(p.pod);
    }
    names
}

impl Agent {
    /// An agent over its parts.
    pub fn new(
        tracker: Tracker,
        sampler: NvmlSampler,
        quotas: QuotaStore,
        enforcer: Enforcer,
        metrics: Arc<Metrics>,
        snapshot: SharedSnapshot,
        opts: AgentOptions,
    ) -> Self {
        Self {
            tracker,
            sampler,
            quotas,
            enforcer,
            policy: PolicyState::default(),
            opts,
            started: Instant::now(),
            env_cache: HashMap::new(),
            env_errors: 0,
            enforcement_counts: BTreeMap::new(),
            ioctl_seen: HashMap::new(),
            ioctl_totals: BTreeMap::new(),
            metrics,
            snapshot,
            pending_releases: Vec::new(),
            ledger_reconciled: false,
            state_since: HashMap::new(),
            ready: false,
            names: NameCache::default(),
        }
    }

    /// The quota store.
    pub fn quotas_mut(&mut self) -> &mut QuotaStore {
        &mut self.quotas
    }

    /// The policy state.
    pub fn policy(&self) -> &PolicyState {
        &self.policy
    }

    /// Whether any of `changes` asks for a prompt re-sample (a new GPU task or an allocation).
    pub fn wants_resample(changes: &[Change]) -> bool {
        changes
            .iter()
            .any(|c| matches!(c, Change::AllocHint(_) | Change::Added(_)))
    }

    /// Queues an operator's release of `name` (a key, a short name, or a unique key prefix) for
    /// the next step. Answers which workload it resolved to.
    pub fn release(&mut self, name: &str) -> Result<String, String> {
        let known: Vec<String> = self.policy.workloads.keys().cloned().collect();
        let matches: Vec<&String> = known
            .iter()
            .filter(|k| {
                *k == name
                    || k.split_once("://").is_some_and(|(_, id)| {
                        id == name || (name.len() >= 6 && id.starts_with(name))
                    })
            })
            .collect();
        match matches.as_slice() {
            [one] => {
                self.pending_releases.push((*one).clone());
                let frozen = self
                    .policy
                    .workloads
                    .get(*one)
                    .is_some_and(|w| w.frozen.is_some());
                Ok(format!(
                    "released {one}{}; its ladder starts again from the grace period",
                    if frozen { " (thawing it)" } else { "" }
                ))
            }
            [] => Err(format!(
                "no workload under a quota matches {name:?}; known: {}",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )),
            many => Err(format!(
                "{name:?} matches several workloads: {}",
                many.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// One step. `trigger` is when the observation that asked for it happened (an allocation
    /// event), for the latency metric; `None` for a periodic step.
    pub fn tick(&mut self, trigger: Option<Instant>) {
        self.tracker.refresh_ioctl_counts();
        let t0 = Instant::now();
        let sample = self.sampler.sample();
        let sampled = t0.elapsed();
        self.metrics.sample_duration.observe(sampled.as_secs_f64());
        let observed_at = trigger.unwrap_or(t0);
        for p in &sample.processes {
            if self.tracker.table().get(p.pid).is_none()
                && self.tracker.table_mut().attribute_pid(p.pid).is_some()
                && let Some(t) = self.tracker.table().get(p.pid)
            {
                info!(
                    "GPU process {} ({}) reported by NVML on GPU {}: cgroup {}",
                    p.pid,
                    t.comm,
                    p.device_index,
                    t.cgroup_path.as_deref().unwrap_or("?")
                );
            }
        }
        // Tasks found through /proc get no exit event: drop the dead ones now, not at the next
        // reconcile, so a workload that is gone is seen gone (and thawed/forgotten) promptly.
        self.tracker
            .table_mut()
            .forget_dead_untraced(&sample.processes.iter().map(|p| p.pid).collect());
        let processes = self.attributed_processes();
        let releases = std::mem::take(&mut self.pending_releases);
        let quotas = self.quotas.current();
        let input = policy::PolicyInput {
            now: self.started.elapsed(),
            sample: &sample,
            processes: &processes,
            quotas,
            releases: &releases,
            agent_pid: Some(std::process::id()),
            dry_run: self.opts.dry_run,
        };
        let mut outcome = policy::evaluate(&self.policy, &input);
        if !self.ledger_reconciled {
            self.reconcile_ledger(&sample, &processes, &mut outcome);
        }
        crate::trace::decided();
        let t1 = Instant::now();
        for action in &outcome.actions {
            self.execute(action, observed_at);
        }
        crate::trace::acted(outcome.actions.len());
        let t2 = Instant::now();
        self.policy = outcome.state;
        self.ready = true;
        self.publish(&sample);
        debug!(
            "step: sample {:?}, attribute+decide {:?}, act {:?}, publish {:?}",
            sampled,
            (t1 - t0).saturating_sub(sampled),
            t2 - t1,
            t2.elapsed()
        );
    }

    fn attributed_processes(&mut self) -> Vec<AttributedProcess> {
        let env_enabled = self.quotas.current().defaults().env_quotas;
        let unit = self.quotas.current().defaults().gpushare_unit;
        let mut out = Vec::new();
        let mut live = std::collections::HashSet::new();
        for t in self.tracker.table().tasks() {
            let Some(w) = &t.workload else { continue };
            live.insert(t.identity);
            let env = if env_enabled && !matches!(w.kind, WorkloadKind::Host | WorkloadKind::Cgroup)
            {
                let errors = &mut self.env_errors;
                self.env_cache
                    .entry(t.identity)
                    .or_insert_with(|| {
                        let bytes =
                            std::fs::read(format!("/proc/{}/environ", t.identity.pid)).ok()?;
                        let vars = parse_environ(&bytes);
                        match env_quota(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())), unit) {
                            Ok(q) => q,
                            Err(e) => {
                                *errors += 1;
                                warn!(
                                    "pid {}: ignoring its environment quota: {e}",
                                    t.identity.pid
                                );
                                None
                            }
                        }
                    })
                    .clone()
            } else {
                None
            };
            let names = self.names.get(w);
            let workload = WorkloadMeta {
                id: w.clone(),
                container_name: names.container,
                pod_namespace: names.namespace,
                pod_name: names.pod,
            };
            out.push(AttributedProcess {
                identity: t.identity,
                workload,
                env_quota: env,
            });
        }
        self.env_cache.retain(|id, _| live.contains(id));
        let live_keys = out.iter().map(|p| p.workload.key()).collect();
        self.names.retain(&live_keys);
        out
    }

    /// First good sample after start: freezes an earlier run recorded are kept where the policy
    /// still finds the workload liable (and the policy state is seeded as frozen), thawed elsewhere.
    fn reconcile_ledger(
        &mut self,
        sample: &GpuSample,
        processes: &[AttributedProcess],
        outcome: &mut policy::Outcome,
    ) {
        let no_driver = matches!(self.sampler.status(), DriverStatus::NoDriver { .. });
        let all_ok =
            !sample.health.is_empty() && sample.health.iter().all(|(i, _)| sample.device_ok(*i));
        if !no_driver && !all_ok {
            return; // wait for data that can be trusted; the records stay responsible meanwhile
        }
        self.ledger_reconciled = true;
        let records: Vec<_> = self.enforcer.ledger().records().cloned().collect();
        if records.is_empty() {
            return;
        }
        let mut keep = Vec::new();
        for rec in &records {
            let Some(ws) = outcome.state.workloads.get_mut(&rec.workload) else {
                continue;
            };
            let Some((scope, ss)) = ws.scopes.iter_mut().find(|(_, s)| s.status != Status::Ok)
            else {
                continue;
            };
            let meta = processes.iter().find(|p| p.workload.key() == rec.workload);
            let ladder = meta
                .and_then(|p| {
                    self.quotas
                        .current()
                        .resolve(&p.workload, p.env_quota.as_ref())
                })
                .and_then(|q| q.limits.first().map(|l| l.enforcement.ladder.clone()))
                .unwrap_or_default();
            let freeze_at = ladder.iter().position(|s| s.action == StepAction::Freeze);
            let Some(freeze_at) = freeze_at else { continue };
            ss.status = Status::Frozen;
            ss.steps_taken = freeze_at + 1;
            let now = self.started.elapsed();
            ss.over_since = Some(now.saturating_sub(ladder[freeze_at].after));
            ws.frozen = Some(*scope);
            keep.push(rec.workload.clone());
        }
        outcome.actions.retain(|a| !keep.contains(&a.workload));
        let (kept, thawed) = self
            .enforcer
            .reconcile_ledger(|r| keep.contains(&r.workload));
        info!(
            "freezes recorded by an earlier run: {kept} kept (still over quota), {thawed} thawed"
        );
    }

    fn execute(&mut self, a: &Action, observed_at: Instant) {
        let (name, outcome) = match a.kind {
            ActionKind::Alert => {
                warn!("ALERT {}: {}", a.workload, a.reason);
                (
                    "alert",
                    if a.dry_run {
                        ExecOutcome::DryRun
                    } else {
                        ExecOutcome::Ok
                    },
                )
            }
            ActionKind::Signal(sig) => {
                info!("signalling {} with {}: {}", a.workload, sig.name, a.reason);
                let r = self.enforcer.signal(&a.workload, &a.targets, sig.number);
                ("signal", summarize(&r))
            }
            ActionKind::Freeze => {
                let hint = a.targets.first().map(|t| t.pid);
                (
                    "freeze",
                    self.enforcer
                        .freeze(&a.workload, &a.cgroup_path, hint, &a.reason),
                )
            }
            ActionKind::Thaw => {
                info!("thawing {}: {}", a.workload, a.reason);
                ("thaw", self.enforcer.thaw(&a.workload, &a.cgroup_path))
            }
            ActionKind::Kill(sig) => {
                warn!("killing {} with {}: {}", a.workload, sig.name, a.reason);
                if sig.number == libc::SIGKILL {
                    (
                        "kill",
                        self.enforcer.kill(&a.workload, &a.cgroup_path, &a.targets),
                    )
                } else {
                    let r = self.enforcer.signal(&a.workload, &a.targets, sig.number);
                    // A frozen task handles the signal only once thawed.
                    self.enforcer.thaw(&a.workload, &a.cgroup_path);
                    ("kill", summarize(&r))
                }
            }
        };
        if a.kind != ActionKind::Thaw && matches!(outcome, ExecOutcome::Ok | ExecOutcome::DryRun) {
            self.metrics
                .enforcement_latency
                .observe(observed_at.elapsed().as_secs_f64());
        }
        *self
            .enforcement_counts
            .entry(format!("{name}/{}", outcome.as_str()))
            .or_default() += 1;
    }

    /// On SIGTERM: thaws what the agent froze, unless told to keep it.
    pub fn shutdown(&mut self) {
        if self.opts.keep_frozen_on_exit {
            let n = self.enforcer.ledger().records().count();
            if n > 0 {
                info!(
                    "leaving {n} workload(s) frozen (--keep-frozen-on-exit); the next start reconciles them"
                );
            }
            return;
        }
        let n = self.enforcer.thaw_all();
        if n > 0 {
            info!("thawed {n} workload(s) on shutdown");
        }
    }

    fn publish(&mut self, sample: &GpuSample) {
        let table = self.tracker.table();
        let uuid_of = |i: u32| {
            sample
                .devices
                .iter()
                .find(|d| d.index == i)
                .map(|d| d.uuid.clone())
                .unwrap_or_default()
        };
        // ioctl totals per workload (monotonic while the workload has tasks).
        let mut live_workloads = std::collections::HashSet::new();
        for t in table.tasks() {
            let key = t.workload.as_ref().map(|w| w.key()).unwrap_or_default();
            live_workloads.insert(key.clone());
            let prev = self
                .ioctl_seen
                .insert(t.identity, (key.clone(), t.ioctls))
                .map_or(0, |(_, c)| c);
            *self.ioctl_totals.entry(key).or_default() += t.ioctls.saturating_sub(prev);
        }
        self.ioctl_seen
            .retain(|id, _| table.get(id.pid).is_some_and(|t| t.identity == *id));
        self.ioctl_totals.retain(|k, _| live_workloads.contains(k));

        let mut usage: BTreeMap<(String, String), (u64, Vec<u32>)> = BTreeMap::new();
        let mut unattributed: BTreeMap<String, u64> = BTreeMap::new();
        let mut processes = Vec::new();
        for p in &sample.processes {
            let t = table.get(p.pid);
            let key = t.and_then(|t| t.workload.as_ref()).map(|w| w.key());
            match &key {
                Some(k) => {
                    let e = usage.entry((k.clone(), p.device_uuid.clone())).or_default();
                    e.0 += p.used_bytes.unwrap_or(0);
                    e.1.push(p.pid);
                }
                None => {
                    *unattributed.entry(p.device_uuid.clone()).or_default() +=
                        p.used_bytes.unwrap_or(0)
                }
            }
            processes.push(ProcessView {
                pid: p.pid,
                comm: t.map(|t| t.comm.clone()).unwrap_or_default(),
                workload: key.unwrap_or_default(),
                gpu_uuid: p.device_uuid.clone(),
                used_bytes: p.used_bytes,
            });
        }
        let ids: HashMap<String, crate::attribution::WorkloadId> = table
            .tasks()
            .filter_map(|t| t.workload.as_ref().map(|w| (w.key(), w.clone())))
            .collect();
        let cached_names: HashMap<String, WorkloadNames> = self
            .names
            .0
            .iter()
            .map(|(k, (n, _))| (k.clone(), n.clone()))
            .collect();
        let names_of = |key: &str| cached_names.get(key).cloned().unwrap_or_default();
        let mut rows: BTreeMap<(String, String), WorkloadView> = BTreeMap::new();
        let view = |key: &str, gpu: String| -> WorkloadView {
            let id = ids.get(key);
            WorkloadView {
                workload: key.to_string(),
                name: id
                    .map(|i| i.short_name())
                    .unwrap_or_else(|| key.to_string()),
                cgroup_path: id.map(|i| i.cgroup_path.clone()).unwrap_or_default(),
                namespace: names_of(key).namespace.unwrap_or_default(),
                pod: names_of(key)
                    .pod
                    .or_else(|| id.and_then(|i| i.pod_uid()).map(str::to_string))
                    .unwrap_or_default(),
                container: names_of(key).container.unwrap_or_default(),
                container_id: id.and_then(|i| i.container_id()).unwrap_or("").to_string(),
                gpu_uuid: gpu,
                state: "ok".into(),
                ..Default::default()
            }
        };
        for ((key, gpu), (bytes, pids)) in &usage {
            let mut v = view(key, gpu.clone());
            v.used_bytes = *bytes;
            v.pids = pids.clone();
            v.ioctls = *self.ioctl_totals.get(key).unwrap_or(&0);
            rows.insert((key.clone(), gpu.clone()), v);
        }
        for (key, ws) in &self.policy.workloads {
            for (scope, ss) in &ws.scopes {
                let gpu = match scope {
                    GpuScope::All => "all".to_string(),
                    GpuScope::Gpu(i) => uuid_of(*i),
                };
                let v = rows
                    .entry((key.clone(), gpu.clone()))
                    .or_insert_with(|| view(key, gpu.clone()));
                if *scope == GpuScope::All {
                    v.used_bytes = ss.usage.unwrap_or(0);
                }
                v.quota_bytes = Some(ss.limit);
                v.quota_source = ws.quota.clone();
                v.state = status_name(ss.status, ws.frozen.is_some()).to_string();
                if v.cgroup_path.is_empty() {
                    v.cgroup_path = ws.cgroup_path.clone();
                }
            }
        }
        // Rows without a quota scope of their own (per-GPU usage under an all-GPU quota) show the
        // workload's overall state: a frozen workload is frozen on every GPU.
        for ((key, gpu), v) in rows.iter_mut() {
            let Some(ws) = self.policy.workloads.get(key) else {
                continue;
            };
            let own_scope = ws.scopes.keys().any(|s| match s {
                GpuScope::All => gpu == "all",
                GpuScope::Gpu(i) => uuid_of(*i) == *gpu,
            });
            if !own_scope {
                let worst = ws
                    .scopes
                    .values()
                    .map(|ss| ss.status)
                    .max_by_key(|s| status_rank(*s));
                v.state = match worst {
                    Some(st) => status_name(st, ws.frozen.is_some()),
                    None if ws.frozen.is_some() => "frozen",
                    None => "ok",
                }
                .to_string();
            }
        }
        let now = Instant::now();
        let mut seen = std::collections::HashSet::new();
        for ((key, gpu), v) in rows.iter_mut() {
            let k = (key.clone(), gpu.clone());
            let entry = self
                .state_since
                .entry(k.clone())
                .or_insert((v.state.clone(), now));
            if entry.0 != v.state {
                *entry = (v.state.clone(), now);
            }
            v.state_for_secs = now.duration_since(entry.1).as_secs_f64();
            seen.insert(k);
        }
        self.state_since.retain(|k, _| seen.contains(k));

        let kc = self.tracker.kernel_counters();
        let stats = self.tracker.table().stats();
        let mut degraded = Vec::new();
        if let crate::attribution::tracker::Mode::Procfs { reason } = self.tracker.mode() {
            degraded.push(format!(
                "eBPF unavailable, attributing through /proc: {reason}"
            ));
        }
        if let DriverStatus::NoDriver { reason } = self.sampler.status() {
            degraded.push(format!("no NVIDIA driver: {reason}"));
        }
        for p in &sample.problems {
            degraded.push(format!("NVML: {p}"));
        }
        for (i, h) in &sample.health {
            if let crate::sample::DeviceHealth::Degraded { reason } = h {
                degraded.push(format!("GPU {i}: {reason}"));
            }
        }
        if !self.quotas.valid() {
            degraded.push(format!(
                "quota configuration invalid: {}",
                self.quotas.errors().join("; ")
            ));
        }
        let snap = Snapshot {
            taken_at_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            version: env!("CARGO_PKG_VERSION").to_string(),
            health: Health {
                ready: self.ready,
                attribution: match self.tracker.mode() {
                    crate::attribution::tracker::Mode::Ebpf => "ebpf".into(),
                    crate::attribution::tracker::Mode::Procfs { .. } => "procfs".into(),
                },
                nvml: match self.sampler.status() {
                    DriverStatus::Ready { .. } => "ready".into(),
                    DriverStatus::NoDriver { .. } => "no_driver".into(),
                },
                degraded,
                dry_run: self.opts.dry_run,
            },
            gpus: sample
                .devices
                .iter()
                .map(|d| GpuView {
                    index: d.index,
                    uuid: d.uuid.clone(),
                    name: d.name.clone(),
                    memory_total_bytes: d.memory_total,
                    memory_used_bytes: d.memory_used,
                    memory_free_bytes: d.memory_free,
                    healthy: sample.device_ok(d.index),
                })
                .collect(),
            workloads: rows.into_values().collect(),
            processes,
            unattributed_bytes: unattributed,
            counters: Counters {
                enforcement_actions: self.enforcement_counts.clone(),
                ebpf_events: stats
                    .events
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect(),
                ebpf_events_lost: kc.events_lost,
                nvml_errors: self
                    .sampler
                    .errors()
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect(),
                gpu_ioctls: self.ioctl_totals.clone(),
                quota_config_valid: self.quotas.valid(),
                quota_config_last_reload_unix: self.quotas.last_reload_unix(),
            },
            quotas: self
                .quotas
                .current()
                .describe()
                .into_iter()
                .map(|r| QuotaView {
                    source: r.origin,
                    selector: r.selector,
                    gpu: r.gpu,
                    gpu_memory_bytes: crate::quota::size::parse_size(&r.memory.replace(' ', ""))
                        .unwrap_or(0),
                })
                .collect(),
        };
        if let Ok(mut w) = self.snapshot.write() {
            *w = Arc::new(snap);
        }
        debug!("published snapshot");
    }
}

fn summarize(r: &[(ProcessIdentity, ExecOutcome)]) -> ExecOutcome {
    if r.iter().any(|(_, o)| *o == ExecOutcome::Ok) {
        ExecOutcome::Ok
    } else if r.iter().any(|(_, o)| *o == ExecOutcome::DryRun) {
        ExecOutcome::DryRun
    } else if r.iter().any(|(_, o)| *o == ExecOutcome::Failed) {
        ExecOutcome::Failed
    } else if r.iter().any(|(_, o)| *o == ExecOutcome::Refused) {
        ExecOutcome::Refused
    } else {
        ExecOutcome::Noop
    }
}

fn status_rank(s: Status) -> u8 {
    match s {
        Status::Ok => 0,
        Status::OverQuota => 1,
        Status::Alerted => 2,
        Status::Signalled => 3,
        Status::Frozen => 4,
        Status::Killed => 5,
    }
}

fn status_name(s: Status, frozen: bool) -> &'static str {
    match s {
        Status::Ok => {
            if frozen {
                "frozen"
            } else {
                "ok"
            }
        }
        Status::OverQuota => "over_quota",
        Status::Alerted => "alerted",
        Status::Signalled => "signalled",
        Status::Frozen => "frozen",
        Status::Killed => "killed",
    }
}

/// How long after an allocation event the re-sample runs (coalesces bursts).
pub const RESAMPLE_DEBOUNCE: Duration = Duration::from_millis(10);
