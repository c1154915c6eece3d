//! From GPU tasks to the workloads the policy sees: each task's workload at its *root* cgroup, the
//! names only the node's files can tell (Kubernetes, the container engine), and the workload's
//! environment quota.
//!
//! Design note: containers, pods and units are rooted by the cgroup path parser
//! ([`crate::workload::parse_cgroup_path_in`], with the runtimes' places on this node): a
//! container or pod at its runtime's place, confirmed by the runtime's record where one can be
//! read ([`super::identity`]), else the outermost unit. One identity has one root: two roots
//! claiming one are plain cgroups, without the identity's quota, environment quota, names or
//! protection. A group inside a unit that a quota names by its exact path is a workload of its own.
//! A plain cgroup has no such component; its root is the topmost ancestor (or itself) that a
//! `cgroup` glob of the quota file names, so a process in a child group of a named cgroup belongs
//! to (and is isolated with) the named one. An unnamed plain cgroup stays rooted at itself and is
//! protected by the policy anyway.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use log::warn;

use super::{
    identity::{self, Identity, RuntimeRecords, Verdict},
    overhead::Overheads,
};
pub use crate::attribution::names::{NameCache, WorkloadNames};
use crate::{
    attribution::{GpuTaskEntry, WorkloadId, WorkloadKind, docker::DAEMON_JSON},
    grants::{
        claims::KubeView,
        env_quotas::{EnvQuotaReader, runtime_spec::SpecRoots},
        kubelet::{PodResourcesView, watch::PodResourcesSource},
        merge,
    },
    kube::api::KubeWatch,
    policy::AttributedProcess,
    quota::{EnvQuota, GpuInfo, KubeletSettings, QuotaSet, ResolvedFrom, Selector, WorkloadMeta},
    sample::GpuSample,
    snapshot::IdentityNote,
    workload::{Placement, nested_container, parse_cgroup_path_in, parse_without_runtime},
};

/// A map with foldhash's hasher (several times faster than SipHash on short strings): the keys
/// are cgroup paths a tenant names, but the seed is random per process and never shown, so
/// there is no collision to plan.
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The root of a plain cgroup workload: the topmost of `path` and its ancestors that a `cgroup`
/// glob of the quota set names; `path` itself when none does.
pub fn cgroup_root(quotas: &QuotaSet, path: &str) -> String {
    let globs: Vec<_> = quotas
        .entries()
        .iter()
        .filter_map(|e| match &e.selector {
            Selector::Cgroup(g) => Some(g),
            _ => None,
        })
        .collect();
    if globs.is_empty() {
        return path.to_string();
    }
    let mut prefix = String::new();
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        prefix.push('/');
        prefix.push_str(comp);
        if globs.iter().any(|g| g.is_match(&prefix)) {
            return prefix;
        }
    }
    path.to_string()
}

/// The topmost group strictly below a unit's root `root`, on the way to `leaf`, that a quota's
/// exact `cgroup` path names: an operator may name an inner group of a delegated subtree by its
/// full path (a glob never carves one out, so a tenant's own groups cannot leave the unit's quota).
pub fn inner_named_root(quotas: &QuotaSet, leaf: &str, root: &str) -> Option<String> {
    let below = leaf.strip_prefix(root)?;
    let mut prefix = root.to_string();
    for comp in below.split('/').filter(|c| !c.is_empty()) {
        prefix.push('/');
        prefix.push_str(comp);
        let named = quotas.entries().iter().any(|e| {
            matches!(&e.selector, Selector::Cgroup(g)
                if !g.pattern().contains(['*', '?', '[', '{']) && g.is_match(&prefix))
        });
        if named {
            return Some(prefix);
        }
    }
    None
}

/// A unit or plain cgroup at its root: a plain cgroup at the topmost group a `cgroup` glob
/// names, a group inside a unit that a quota names by its exact path on its own.
fn path_rooted(w: WorkloadId, leaf: &str, quotas: &QuotaSet) -> WorkloadId {
    match w.kind {
        WorkloadKind::Cgroup => WorkloadId {
            cgroup_path: cgroup_root(quotas, &w.cgroup_path),
            kind: WorkloadKind::Cgroup,
        },
        WorkloadKind::SystemdUnit { .. } => match inner_named_root(quotas, leaf, &w.cgroup_path) {
            Some(inner) => WorkloadId {
                cgroup_path: inner,
                kind: WorkloadKind::Cgroup,
            },
            None => w,
        },
        _ => w,
    }
}

/// A workload-identity event the agent counts ([`crate::agent::counters::Totals::identity`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum IdentityEvent {
    /// Two roots claimed one container or pod identity.
    Conflict,
    /// A container's runtime record names another group than the one observed.
    Mismatch,
}

impl IdentityEvent {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Conflict => "conflict",
            Self::Mismatch => "record_mismatch",
        }
    }
}

/// Observes the GPU tasks as the policy reads them (each at its workload, with names and grants),
/// step after step.
pub struct Observer {
    names: NameCache,
    env_quotas: EnvQuotaReader,
    /// The kubelet's pod-resources reader, per the quota file's `[kubernetes]` table.
    kubelet: Option<PodResourcesSource>,
    v2_root: std::path::PathBuf,
    quota_trust: FastMap<String, &'static str>,
    placement: Placement,
    records: RuntimeRecords,
    notes: FastMap<String, IdentityNote>,
    conflicts: HashSet<String>,
    mismatches: HashSet<String>,
    events: Vec<IdentityEvent>,
    /// Per leaf group seen at the last step: what its path says (placement only) and its
    /// workload as last built, shared with every process of it while it stays equal.
    leaves: FastMap<String, Leaf>,
    /// The quota set the leaves' roots were found under (a root depends on its globs).
    rooted_under: Option<QuotaSet>,
    /// The API server's grants (DRA claims, pod annotations), when `[kubernetes] api` is on.
    kube: Option<KubeWatch>,
    /// What a CUDA context takes per GPU model, learned from the samples.
    overheads: Overheads,
}

/// The workload a leaf group belongs to (shared with the leaf's memo), and what its identity
/// rests on.
type Found = (Arc<WorkloadId>, Option<Identity>);

/// What the last steps found for one leaf group: the pure parts are kept while the quota set is
/// the same, the workload while it is equal to what the step builds.
struct Leaf {
    /// `parse_cgroup_path_in(leaf, placement)` (placement is fixed for the agent's life).
    /// Shared with each step's result: a steady step copies no workload.
    parsed: Arc<WorkloadId>,
    /// `path_rooted` of `parse_without_runtime(leaf)` and of `parsed`, under `rooted_under`.
    rooted: Option<(Arc<WorkloadId>, Arc<WorkloadId>)>,
    /// The workload and its key as last built.
    meta: Option<(Arc<WorkloadMeta>, Arc<str>)>,
    /// Seen at this step.
    live: bool,
}

/// A container that shares a DRA claim with another container of its pod belongs to the pod: the
/// claim bounds their union (see [`crate::grants::claims`]). Only a container at its runtime's place
/// in that very pod.
fn sharing_pod(found: Found, view: &KubeView) -> Found {
    let (w, identity) = &found;
    if let (
        WorkloadKind::Container {
            container_id,
            pod_uid: Some(uid),
            qos,
            ..
        },
        Some(Identity::Runtime | Identity::Placement),
    ) = (&w.kind, identity)
        && view.pod_of(container_id) == Some(uid.as_str())
        && let Some((pod_path, _)) = w.cgroup_path.rsplit_once('/')
    {
        let pod = WorkloadId {
            cgroup_path: pod_path.to_string(),
            kind: WorkloadKind::Pod {
                pod_uid: uid.clone(),
                qos: qos.unwrap_or(crate::workload::QosClass::BestEffort),
            },
        };
        return (Arc::new(pod), Some(Identity::Placement));
    }
    found
}

/// The API server's quota for a workload: a container's own, or a sharing pod's; its DRA devices'
/// minors resolved to the GPUs NVML gives them ([`crate::quota::resolve_quota`]).
fn kube_quota(id: &WorkloadId, view: &KubeView, gpus: &[GpuInfo]) -> Option<EnvQuota> {
    let q = match &id.kind {
        WorkloadKind::Container { container_id, .. } => merge::kube_container(view, container_id),
        WorkloadKind::Pod { pod_uid, .. } => merge::kube_pod(view, pod_uid),
        _ => None,
    };
    q.map(|q| crate::quota::resolve_quota(q, gpus))
}

impl Observer {
    /// Over the cgroup v2 hierarchy at `v2_root` (where a container's init is looked for when its
    /// runtime spec cannot be found), with the runtimes' places and records of this node.
    pub fn new(v2_root: std::path::PathBuf) -> Self {
        let docker_parent = identity::docker_cgroup_parent(std::path::Path::new(DAEMON_JSON));
        Self::with(
            v2_root,
            Placement::with_docker_parent(docker_parent.as_deref()),
            SpecRoots::system(),
        )
    }

    /// Over explicit places and runtime state (tests).
    pub fn with(v2_root: std::path::PathBuf, placement: Placement, roots: SpecRoots) -> Self {
        Self {
            names: NameCache::default(),
            env_quotas: EnvQuotaReader::new(roots.clone(), v2_root.clone()),
            kubelet: None,
            v2_root,
            quota_trust: FastMap::default(),
            placement,
            records: RuntimeRecords::new(roots),
            notes: FastMap::default(),
            conflicts: HashSet::new(),
            mismatches: HashSet::new(),
            events: Vec::new(),
            leaves: FastMap::default(),
            rooted_under: None,
            kube: None,
            overheads: Overheads::default(),
        }
    }

    /// Reads the API server's grants from `watch` from now on.
    pub fn set_kube(&mut self, watch: KubeWatch) {
        self.kube = Some(watch);
    }

    /// The API server's watcher, when it runs.
    pub fn kube_watch(&self) -> Option<&KubeWatch> {
        self.kube.as_ref()
    }

    /// The API server's latest view, when it is read.
    pub fn kube_view(&self) -> Option<std::sync::Arc<KubeView>> {
        self.kube.as_ref().map(KubeWatch::current)
    }

    /// The name cache (for readers of the snapshot).
    pub fn names(&self) -> &NameCache {
        &self.names
    }

    /// The environment-quota reader (its counters and unit checks, for reports).
    pub fn env_quotas(&self) -> &EnvQuotaReader {
        &self.env_quotas
    }

    /// The kubelet's pod-resources view as of the last step, when it is read.
    pub fn kubelet(&self) -> Option<std::sync::Arc<PodResourcesView>> {
        self.kubelet.as_ref().map(PodResourcesSource::view)
    }

    /// Starts, restarts or stops the kubelet reader when the `[kubernetes]` settings change.
    fn sync_kubelet(&mut self, k: &KubeletSettings) {
        let running = self.kubelet.as_ref().map(PodResourcesSource::settings);
        match (running, &k.pod_resources_socket) {
            (None, None) => {}
            (Some(r), Some(_)) if r == k => {}
            (_, None) => self.kubelet = None,
            (_, Some(_)) => {
                self.kubelet = Some(PodResourcesSource::start(k, self.v2_root.clone()));
            }
        }
    }

    /// How far each workload's quota source is trusted (`file`, `runtime_spec`, `init_environ`).
    pub fn quota_trust(&self) -> &FastMap<String, &'static str> {
        &self.quota_trust
    }

    /// What each workload's identity rests on, and its nested containers.
    pub fn identity_notes(&self) -> &FastMap<String, IdentityNote> {
        &self.notes
    }

    /// The identity events since the last call (each conflict and mismatch once, when it starts).
    pub fn take_events(&mut self) -> Vec<IdentityEvent> {
        std::mem::take(&mut self.events)
    }

    /// The workload of the group `leaf`: at its runtime's place and confirmed by its record
    /// where one can be read; else its unit (or an inner group a quota names by its path), or
    /// the plain path rooted by the quotas' `cgroup` globs. What depends on the path and the quota
    /// set only is worked out once per leaf (while the quota set is the same).
    fn identify(&mut self, leaf: &str, quotas: &QuotaSet) -> Found {
        if !self.leaves.contains_key(leaf) {
            let parsed = Arc::new(parse_cgroup_path_in(leaf, &self.placement));
            self.leaves.insert(
                leaf.to_string(),
                Leaf {
                    parsed,
                    rooted: None,
                    meta: None,
                    live: true,
                },
            );
        }
        let memo = self.leaves.get_mut(leaf).expect("inserted above");
        memo.live = true;
        let rooted = memo.rooted.get_or_insert_with(|| {
            (
                Arc::new(path_rooted(parse_without_runtime(leaf), leaf, quotas)),
                Arc::new(path_rooted(WorkloadId::clone(&memo.parsed), leaf, quotas)),
            )
        });
        let w = &memo.parsed;
        match &w.kind {
            WorkloadKind::Container { .. } => match self.records.check(w) {
                Some(Verdict::Confirmed) => (w.clone(), Some(Identity::Runtime)),
                Some(Verdict::Elsewhere(there)) => {
                    let key = w.key();
                    if self.mismatches.insert(format!("{key} {}", w.cgroup_path)) {
                        warn!(
                            "{}: named like container {key}, whose runtime record puts it at {there}: \
                             not that container; treated as a group of its own",
                            w.cgroup_path
                        );
                        self.events.push(IdentityEvent::Mismatch);
                    }
                    (rooted.0.clone(), None)
                }
                _ => (w.clone(), Some(Identity::Placement)),
            },
            WorkloadKind::Pod { .. } => (w.clone(), Some(Identity::Placement)),
            _ => (rooted.1.clone(), None),
        }
    }

    /// The key the group at `path` (a workload's root, as the ledger records it) has now, by its
    /// runtime's place and the quotas alone: how an earlier version's freezes are taken over.
    pub fn key_of_group(&self, path: &str, quotas: &QuotaSet) -> String {
        path_rooted(parse_cgroup_path_in(path, &self.placement), path, quotas).key()
    }

    /// The step's observation of `sample` (its processes' identities verified): each task of
    /// `tasks` at its workload ([`Self::attribute`], over the sample's GPUs), then each GPU's
    /// context overhead, learned from the sample and written into it.
    pub fn observe<'a>(
        &mut self,
        sample: &mut GpuSample,
        tasks: impl Iterator<Item = &'a GpuTaskEntry>,
        quotas: &QuotaSet,
    ) -> Vec<AttributedProcess> {
        let gpus: Vec<GpuInfo> = sample
            .devices
            .iter()
            .map(|d| GpuInfo {
                index: d.index,
                uuid: d.uuid.clone(),
                memory_total: d.memory_total,
                minor: d.minor,
            })
            .collect();
        let processes = self.attribute(tasks, quotas, &gpus);
        self.overheads
            .fill(sample, &quotas.defaults().context_overhead);
        processes
    }

    /// One [`AttributedProcess`] per task with a known workload, each workload at its root, with
    /// the environment quota its runtime gave it (one lookup per workload per step). A workload
    /// equal to the one built at the last step is shared (the same `Arc`), so a steady step
    /// copies no string per process.
    pub fn attribute<'a>(
        &mut self,
        tasks: impl Iterator<Item = &'a GpuTaskEntry>,
        quotas: &QuotaSet,
        gpus: &[GpuInfo],
    ) -> Vec<AttributedProcess> {
        let env_enabled = quotas.defaults().env_quotas;
        let view = self.kube_view();
        let unit = quotas.defaults().gpushare_unit;
        self.sync_kubelet(quotas.kubelet());
        let kubelet_view = self.kubelet.as_ref().map(PodResourcesSource::view);
        if self.rooted_under.as_ref() != Some(quotas) {
            for l in self.leaves.values_mut() {
                l.rooted = None;
            }
            self.rooted_under = Some(quotas.clone());
        }
        for l in self.leaves.values_mut() {
            l.live = false;
        }
        let tasks: Vec<&GpuTaskEntry> = tasks
            .filter(|t| t.workload.is_some() && t.cgroup_path.is_some())
            .collect();
        // Several tasks share a cgroup: its identity is worked out once per step. Each task's
        // leaf is hashed once, to its slot among the step's leaves.
        // A per-step map, sized once, with foldhash's hasher (several times faster than SipHash
        // on short strings): the keys are cgroup paths a tenant names, but the seed is random
        // per process and never shown, so there is no collision to plan.
        let mut slots: FastMap<&str, usize> =
            FastMap::with_capacity_and_hasher(self.leaves.len(), Default::default());
        let mut of_leaf: Vec<(&str, Found)> = Vec::with_capacity(self.leaves.len());
        let mut slot_of_task = Vec::with_capacity(tasks.len());
        for t in &tasks {
            let leaf = t.cgroup_path.as_deref().unwrap_or("/");
            let slot = *slots.entry(leaf).or_insert_with(|| {
                let mut found = self.identify(leaf, quotas);
                if let Some(v) = &view {
                    found = sharing_pod(found, v);
                }
                of_leaf.push((leaf, found));
                of_leaf.len() - 1
            });
            slot_of_task.push(slot);
        }
        drop(slots);
        self.one_root_per_identity(&mut of_leaf);
        let mut out = Vec::with_capacity(tasks.len());
        let mut env_of: FastMap<Arc<str>, _> =
            FastMap::with_capacity_and_hasher(self.leaves.len(), Default::default());
        type Built = (Arc<WorkloadMeta>, Arc<str>, Option<crate::quota::EnvQuota>);
        let mut metas: Vec<Option<Built>> = vec![None; of_leaf.len()];
        for (t, &slot) in tasks.iter().zip(&slot_of_task) {
            if metas[slot].is_none() {
                let (leaf, (id, identity)) = &of_leaf[slot];
                let leaf = *leaf;
                let claimed = !matches!(identity, None | Some(Identity::Conflict));
                // The key: the one built at the last step where the leaf's workload is the same
                // (no string built at a steady step).
                let key: Arc<str> = match self.leaves.get(leaf).and_then(|l| l.meta.as_ref()) {
                    Some((m, k)) if m.id == **id => k.clone(),
                    _ => id.key().into(),
                };
                // The first leaf of its workload at this step: the workload's note starts afresh.
                let first = !env_of.contains_key(&key);
                let env = env_of
                    .entry(key.clone())
                    .or_insert_with(|| {
                        if claimed
                            && let (Some(k), Some(uid)) = (self.kubelet.as_mut(), id.pod_uid())
                        {
                            k.want(uid, id.container_id());
                        }
                        let env = (env_enabled && claimed)
                            .then(|| {
                                self.env_quotas
                                    .quota_with(id, unit, gpus, kubelet_view.as_deref())
                            })
                            .flatten()
                            .map(|(q, _)| q);
                        // No source lifts another's limit: the smallest per GPU.
                        let granted = view
                            .as_ref()
                            .filter(|_| env_enabled && claimed)
                            .and_then(|v| kube_quota(id, v, gpus));
                        merge::node_and_api_server(env, granted)
                    })
                    .clone();
                const UNNAMED: WorkloadNames = WorkloadNames {
                    namespace: None,
                    pod: None,
                    container: None,
                };
                let names = if claimed {
                    self.names.get_keyed(&key, id)
                } else {
                    &UNNAMED
                };
                // Built only where it differs from the one built at the last step.
                let is_meta = |m: &WorkloadMeta| {
                    m.id == **id
                        && m.container_name == names.container
                        && m.pod_namespace == names.namespace
                        && m.pod_name == names.pod
                };
                let build = || WorkloadMeta {
                    id: WorkloadId::clone(id),
                    container_name: names.container.clone(),
                    pod_namespace: names.namespace.clone(),
                    pod_name: names.pod.clone(),
                };
                // Kept from step to step (its key's allocation with it), emptied at the
                // workload's first leaf, dropped below when no leaf has the workload.
                let note = match self.notes.get_mut(&*key) {
                    Some(note) => note,
                    None => self.notes.entry(key.to_string()).or_default(),
                };
                if first {
                    note.nested.clear();
                }
                note.identity = identity.map_or("", Identity::as_str);
                if let Some(nested) = nested_container(leaf, &id.cgroup_path)
                    && !note.nested.contains(&nested)
                {
                    note.nested.push(nested);
                    note.nested.sort();
                }
                let shared = self.leaves.get_mut(leaf).map(|l| match &l.meta {
                    Some((m, k)) if is_meta(m) => (m.clone(), k.clone()),
                    _ => {
                        let m = Arc::new(build());
                        l.meta = Some((m.clone(), key.clone()));
                        (m, key.clone())
                    }
                });
                let (meta, key) = shared.unwrap_or_else(|| (Arc::new(build()), key));
                metas[slot] = Some((meta, key, env));
            }
            let Some((meta, key, env)) = &metas[slot] else {
                unreachable!("built above")
            };
            out.push(AttributedProcess::sharing(
                t.identity,
                meta.clone(),
                key.clone(),
                env.clone(),
            ));
        }
        self.leaves.retain(|_, l| l.live);
        let live = |key: &str| env_of.contains_key(key);
        self.env_quotas.retain(live);
        self.names.retain(live);
        self.records.retain(live);
        self.notes.retain(|key, _| live(key));
        if let Some(k) = self.kubelet.as_mut() {
            let uids: HashSet<&str> = of_leaf
                .iter()
                .filter_map(|(_, (w, _))| w.pod_uid())
                .collect();
            k.retain(|u| uids.contains(u));
        }
        // Rebuilt in place: a workload's key keeps its allocation from step to step. The leaves
        // of one workload agree (the same workload, names and environment quota).
        self.quota_trust.retain(|key, _| live(key));
        for (workload, key, env) in metas.iter().flatten() {
            let trust = match quotas.resolved_from(workload, env.as_ref()) {
                Some(ResolvedFrom::File) => "file",
                Some(ResolvedFrom::Env(s)) if s.only_api_server() => "api_server",
                Some(ResolvedFrom::Env(_)) => {
                    self.env_quotas.trust_of(key).map_or("", |t| t.as_str())
                }
                None => "",
            };
            match self.quota_trust.get_mut(&**key) {
                Some(t) => *t = trust,
                None => {
                    self.quota_trust.insert(key.to_string(), trust);
                }
            }
        }
        out
    }

    /// One identity, one root: where two roots claim one container or pod identity, neither has
    /// it; each is a plain cgroup at its root (only quotas naming a path apply). Logged and
    /// counted once per conflict, when it starts.
    fn one_root_per_identity(&mut self, of_leaf: &mut [(&str, Found)]) {
        let mut roots: HashMap<String, BTreeSet<&str>> = HashMap::new();
        for (_, (id, identity)) in of_leaf.iter() {
            if identity.is_some() {
                roots.entry(id.key()).or_default().insert(&id.cgroup_path);
            }
        }
        let conflicted: HashSet<String> = roots
            .into_iter()
            .filter(|(_, r)| r.len() > 1)
            .map(|(key, r)| {
                if !self.conflicts.contains(&key) {
                    warn!(
                        "{} groups claim the identity {key}: {}; neither is that workload (only \
                         quotas naming their paths apply)",
                        r.len(),
                        r.iter().copied().collect::<Vec<_>>().join(", ")
                    );
                    self.events.push(IdentityEvent::Conflict);
                }
                key
            })
            .collect();
        for (_, (id, identity)) in of_leaf.iter_mut() {
            if identity.is_some() && conflicted.contains(&id.key()) {
                Arc::make_mut(id).kind = WorkloadKind::Cgroup;
                *identity = Some(Identity::Conflict);
            }
        }
        self.conflicts = conflicted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_cgroup_is_rooted_at_the_topmost_group_a_glob_names() {
        let q = QuotaSet::parse(
            "[[quota]]\ncgroup = \"/jobs/*\"\ngpu_memory = \"1GiB\"\n\n[[quota]]\ncgroup = \"/exact/a\"\ngpu_memory = \"1GiB\"\n",
            "q.toml",
        )
        .unwrap();
        assert_eq!(cgroup_root(&q, "/jobs/a/worker/x"), "/jobs/a");
        assert_eq!(cgroup_root(&q, "/jobs/a"), "/jobs/a");
        assert_eq!(cgroup_root(&q, "/exact/a/sub"), "/exact/a");
        assert_eq!(cgroup_root(&q, "/other/a"), "/other/a");
        assert_eq!(cgroup_root(&QuotaSet::empty(), "/jobs/a/b"), "/jobs/a/b");
    }

    const ID: &str = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";
    const UID: &str = "0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a";

    fn task(pid: u32, path: &str) -> GpuTaskEntry {
        GpuTaskEntry::for_test(pid, Some(path))
    }

    /// A workloads builder over an empty runtime state in `dir` (no records, no specs).
    fn workloads(dir: &std::path::Path) -> Observer {
        Observer::with(
            dir.join("cgroup"),
            Placement::default(),
            SpecRoots {
                docker_data_root: dir.join("docker"),
                containerd_task_roots: vec![dir.join("containerd")],
                crio_container_roots: vec![dir.join("crio")],
            },
        )
    }

    fn write(path: std::path::PathBuf, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn keys(procs: &[AttributedProcess]) -> Vec<(u32, String)> {
        procs
            .iter()
            .map(|p| (p.identity.pid, p.workload.key()))
            .collect()
    }

    #[test]
    fn two_roots_claiming_one_identity_are_neither_and_the_conflict_is_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = workloads(dir.path());
        let q = QuotaSet::parse(
            &format!("protect = [\"pod://{UID}\"]\n[[quota]]\npod_uid = \"{UID}\"\ngpu_memory = \"1GiB\"\n"),
            "q.toml",
        )
        .unwrap();
        let a = format!("/kubepods/pod{UID}");
        let b = format!(
            "/kubepods.slice/kubepods-pod{}.slice",
            UID.replace('-', "_")
        );
        let tasks = [task(1, &a), task(2, &b), task(3, &format!("{a}/sub"))];
        let out = w.attribute(tasks.iter(), &q, &[]);
        assert_eq!(
            keys(&out),
            vec![
                (1, format!("cgroup://{a}")),
                (2, format!("cgroup://{b}")),
                (3, format!("cgroup://{a}"))
            ]
        );
        for p in &out {
            assert_eq!(p.workload.id.kind, WorkloadKind::Cgroup);
            assert_eq!(q.resolve(&p.workload, None), None, "no quota of the pod's");
            assert!(!q.is_protected(&p.workload), "no protection of the pod's");
        }
        assert_eq!(
            w.identity_notes()[&format!("cgroup://{a}")].identity,
            "conflict"
        );
        assert_eq!(w.take_events(), vec![IdentityEvent::Conflict]);
        // Still in conflict: not counted again; resolved and back: counted again.
        w.attribute(tasks.iter(), &q, &[]);
        assert_eq!(w.take_events(), vec![]);
        let out = w.attribute(tasks[..1].iter(), &q, &[]);
        assert_eq!(keys(&out), vec![(1, format!("pod://{UID}"))]);
        assert_eq!(
            w.identity_notes()[&format!("pod://{UID}")].identity,
            "degraded"
        );
        assert!(q.is_protected(&out[0].workload));
        w.attribute(tasks.iter(), &q, &[]);
        assert_eq!(w.take_events(), vec![IdentityEvent::Conflict]);
    }

    #[test]
    fn a_container_whose_record_names_another_group_is_not_that_container() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("docker/containers").join(ID);
        write(data.join("config.v2.json"), "{}");
        write(data.join("hostconfig.json"), r#"{"CgroupParent":"/ci"}"#);
        let mut w = workloads(dir.path());
        let q = QuotaSet::parse(
            &format!("[[quota]]\ncontainer = \"{ID}\"\ngpu_memory = \"1GiB\"\n"),
            "q.toml",
        )
        .unwrap();
        let out = w.attribute([task(1, &format!("/docker/{ID}"))].iter(), &q, &[]);
        assert_eq!(keys(&out), vec![(1, format!("cgroup:///docker/{ID}"))]);
        assert_eq!(q.resolve(&out[0].workload, None), None);
        assert_eq!(
            w.identity_notes()[&format!("cgroup:///docker/{ID}")].identity,
            ""
        );
        assert_eq!(w.take_events(), vec![IdentityEvent::Mismatch]);
        w.attribute([task(1, &format!("/docker/{ID}"))].iter(), &q, &[]);
        assert_eq!(w.take_events(), vec![], "logged and counted once");

        // The record names the group observed: confirmed.
        write(data.join("hostconfig.json"), r#"{"CgroupParent":""}"#);
        let mut w = workloads(dir.path());
        let out = w.attribute([task(1, &format!("/docker/{ID}/init"))].iter(), &q, &[]);
        assert_eq!(keys(&out), vec![(1, format!("docker://{ID}"))]);
        assert_eq!(
            w.identity_notes()[&format!("docker://{ID}")].identity,
            "runtime"
        );
        assert!(q.resolve(&out[0].workload, None).is_some());
    }

    #[test]
    fn nested_containers_are_noted_on_their_outer_workload() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = workloads(dir.path());
        let unit = "/user.slice/user-1000.slice/user@1000.service";
        let inner = format!("{unit}/user.slice/libpod-{ID}.scope");
        let tasks = [
            task(1, &format!("{inner}/container")),
            task(2, &format!("{unit}/app.slice/x")),
            task(3, &inner),
        ];
        let out = w.attribute(tasks.iter(), &QuotaSet::empty(), &[]);
        let key = format!("unit://{unit}");
        assert!(
            out.iter().all(|p| p.workload.key() == key),
            "{:?}",
            keys(&out)
        );
        let note = &w.identity_notes()[&key];
        assert_eq!((note.identity, note.nested.clone()), ("", vec![inner]));
    }

    #[test]
    fn an_operator_names_a_group_inside_a_unit_by_its_exact_path_only() {
        let unit = "/user.slice/user-1000.slice/user@1000.service";
        let exact = QuotaSet::parse(
            &format!("[[quota]]\ncgroup = \"{unit}/app.slice\"\ngpu_memory = \"1GiB\"\n"),
            "q.toml",
        )
        .unwrap();
        let glob = QuotaSet::parse(
            "[[quota]]\ncgroup = \"/user.slice/**\"\ngpu_memory = \"1GiB\"\n",
            "q.toml",
        )
        .unwrap();
        let leaf = format!("{unit}/app.slice/job/leaf");
        assert_eq!(
            inner_named_root(&exact, &leaf, unit),
            Some(format!("{unit}/app.slice"))
        );
        assert_eq!(
            inner_named_root(&glob, &leaf, unit),
            None,
            "a glob carves out nothing"
        );
        assert_eq!(
            inner_named_root(&exact, &format!("{unit}/other"), unit),
            None
        );
        assert_eq!(inner_named_root(&exact, "/elsewhere", unit), None);
        let dir = tempfile::tempdir().unwrap();
        let w = workloads(dir.path());
        assert_eq!(
            w.key_of_group(&leaf, &exact),
            format!("cgroup://{unit}/app.slice")
        );
        assert_eq!(w.key_of_group(&leaf, &glob), format!("unit://{unit}"));
        assert_eq!(
            w.key_of_group(&format!("{unit}/docker/{ID}"), &glob),
            format!("unit://{unit}"),
            "a container nested in a unit is now the unit"
        );
        assert_eq!(
            w.key_of_group(&format!("/docker/{ID}"), &glob),
            format!("docker://{ID}")
        );
    }

    /// `status` says what an identity rests on and which containers are nested in a workload.
    #[test]
    fn status_notes_degraded_and_conflicting_identities_and_nested_containers() {
        use crate::snapshot::{Snapshot, WorkloadView};
        let row = |key: &str, identity: &str, nested: &[&str]| {
            WorkloadView {
                workload: key.into(),
                gpu_uuid: "GPU-0".into(),
                state: "ok".into(),
                identity: identity.into(),
                nested: nested.iter().map(|s| s.to_string()).collect(),
                ..WorkloadView::default()
            }
            .into()
        };
        let snap = Snapshot {
            workloads: vec![
                row(&format!("docker://{ID}"), "degraded", &[]),
                row("cgroup:///docker/x", "conflict", &[]),
                row("unit:///u.service", "", &["/u.service/docker/x"]),
                row("pod://p", "runtime", &[]),
            ],
            ..Snapshot::default()
        };
        let out = crate::status::render_status(&snap);
        assert!(
            out.contains(&format!("note: docker://{ID}: identity degraded")),
            "{out}"
        );
        assert!(
            out.contains("note: cgroup:///docker/x: identity conflict"),
            "{out}"
        );
        assert!(
            out.contains(
                "nested: /u.service/docker/x (part of unit:///u.service, under its quota)"
            ),
            "{out}"
        );
        assert!(!out.contains("note: pod://p"), "{out}");
    }

    /// The incremental path (one `Observer` kept across steps: leaves' identities and roots
    /// kept while the quota set is the same, workloads shared while equal) and the from-scratch
    /// path (a new `Observer` every step), driven by one random sequence of attribution changes
    /// (tasks appearing, leaving, moving between groups), quota changes, samples, reports and the
    /// clock, give identical processes, notes, trust, decisions and snapshots at every step.
    mod incremental_equals_from_scratch {
        use std::{collections::BTreeMap, time::Duration};

        use proptest::prelude::*;

        use super::*;
        use crate::{
            attribution::{Attribution, cgroupfs::CgroupResolver},
            policy::{self, ActionKind, PolicyInput, PolicyState, Report},
            sample::{DeviceHealth, DeviceSample, GpuSample, ProcessSample},
            snapshot::{Counters, Health, Publisher, Snapshot, StepReport},
        };

        const UNIT: &str = "/user.slice/user-1000.slice/user@1000.service";

        fn leaves() -> Vec<String> {
            vec![
                format!("/docker/{ID}"),
                format!("/docker/{ID}/init"),
                format!("/kubepods/pod{UID}/{ID}"),
                "/jobs/a/worker".into(),
                "/jobs/a".into(),
                "/jobs/b/x/y".into(),
                "/system.slice/train.service/sub".into(),
                format!("{UNIT}/app.slice/x"),
                format!("{UNIT}/user.slice/libpod-{ID}.scope/container"),
                "/other/c".into(),
            ]
        }

        fn quota_sets() -> Vec<QuotaSet> {
            [
                String::new(),
                "[[quota]]\ncgroup = \"/jobs/*\"\ngpu_memory = \"1GiB\"\ngrace = \"0s\"\n".into(),
                format!(
                    "[[quota]]\ncgroup = \"{UNIT}/app.slice\"\ngpu_memory = \"1GiB\"\n\
                     [[quota]]\ncgroup = \"/jobs/**\"\ngpu_memory = \"2GiB\"\ngrace = \"0s\"\n\
                     ladder = [{{ action = \"freeze\" }}]\n"
                ),
                format!(
                    "[[quota]]\ncontainer = \"{ID}\"\ngpu_memory = \"1GiB\"\ngrace = \"0s\"\n\
                     [[quota]]\nunit = \"train.service\"\ngpu_memory = \"1GiB\"\n"
                ),
            ]
            .iter()
            .map(|t| QuotaSet::parse(t, "q.toml").unwrap())
            .collect()
        }

        fn sample(usage: &[(u32, u32, u64)]) -> GpuSample {
            GpuSample {
                taken_at: None,
                devices: (0..2)
                    .map(|i| DeviceSample {
                        index: i,
                        uuid: format!("GPU-{i}"),
                        name: "Fake".into(),
                        memory_total: 80 << 30,
                        memory_free: 40 << 30,
                        ..Default::default()
                    })
                    .collect(),
                health: (0..2).map(|i| (i, DeviceHealth::Ok)).collect(),
                processes: usage
                    .iter()
                    .map(|&(pid, dev, mib)| ProcessSample {
                        pid,
                        device_index: dev,
                        device_uuid: format!("GPU-{dev}").into(),
                        used_bytes: Some(mib << 20),
                        utilization: None,
                    })
                    .collect(),
                problems: Vec::new(),
            }
        }

        /// One step: each pid's group (or none), the quota set, usage, reports, time passing.
        type StepSpec = (Vec<Option<usize>>, usize, Vec<(u32, u32, u64)>, bool, u64);

        fn steps() -> impl Strategy<Value = Vec<StepSpec>> {
            let step = (
                proptest::collection::vec(proptest::option::weighted(0.8, 0usize..10), 8),
                0usize..4,
                proptest::collection::vec((1u32..9, 0u32..2, 0u64..3000), 0..10),
                any::<bool>(),
                0u64..3000,
            );
            proptest::collection::vec(step, 1..10)
        }

        /// A snapshot without what depends on the wall clock.
        fn comparable(mut s: Snapshot) -> String {
            s.taken_at_unix = 0.0;
            for w in &mut s.workloads {
                w.state_for_secs = 0.0;
            }
            serde_json::to_string(&s).unwrap()
        }

        struct Path {
            workloads: Option<Observer>,
            policy: PolicyState,
            publisher: Publisher,
        }

        impl Path {
            #[allow(clippy::too_many_arguments)]
            fn step(
                &mut self,
                dir: &std::path::Path,
                tasks: &[GpuTaskEntry],
                quotas: &QuotaSet,
                s: &GpuSample,
                report: bool,
                now: Duration,
                table: &Attribution,
            ) -> String {
                let mut fresh;
                let w = match self.workloads.as_mut() {
                    Some(w) => w,
                    None => {
                        fresh = workloads(dir);
                        &mut fresh
                    }
                };
                let processes = w.attribute(tasks.iter(), quotas, &[]);
                let observed = BTreeMap::new();
                let decision = policy::evaluate(
                    &self.policy,
                    &PolicyInput {
                        now,
                        sample: s,
                        processes: &processes,
                        quotas,
                        releases: &[],
                        agent_pid: None,
                        dry_run: false,
                        observe_only: false,
                        taken: &crate::policy::NONE_TAKEN,
                        observed: &observed,
                    },
                );
                let reports: Vec<Report> = decision
                    .actions
                    .iter()
                    .filter(|a| report && a.kind == ActionKind::Freeze)
                    .map(|a| Report::Done {
                        workload: a.workload.clone(),
                        kind: a.kind,
                    })
                    .collect();
                let out = format!("{:?}\n{:?}", processes, decision);
                self.policy = policy::fold_reports(decision.state, &reports);
                let snap = self.publisher.build(StepReport {
                    sample: s,
                    table,
                    processes: &processes,
                    policy: &self.policy,
                    names: w.names(),
                    quota_trust: w.quota_trust(),
                    identity: w.identity_notes(),
                    health: Health::default(),
                    counters: Counters::default(),
                    timings: Default::default(),
                    // The sets live as long as the test: each one's address names it.
                    quotas: (quotas, std::ptr::from_ref(quotas) as u64),
                    now,
                    backends: BTreeMap::new(),
                    driver_limits: Vec::new(),
                    taken: &crate::policy::NONE_TAKEN,
                });
                let mut trust: Vec<_> = w.quota_trust().iter().collect();
                trust.sort();
                let mut notes: Vec<_> = w.identity_notes().iter().collect();
                notes.sort_by(|a, b| a.0.cmp(b.0));
                format!("{out}\n{trust:?}\n{notes:?}\n{}", comparable(snap))
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

            #[test]
            fn identical_at_every_step(spec in steps()) {
                let dir = tempfile::tempdir().unwrap();
                let leaves = leaves();
                let quotas = quota_sets();
                let table = Attribution::new(CgroupResolver::new(dir.path().join("cgroup")));
                let mut incremental = Path {
                    workloads: Some(workloads(dir.path())),
                    policy: PolicyState::default(),
                    publisher: Publisher::default(),
                };
                let mut scratch = Path {
                    workloads: None,
                    policy: PolicyState::default(),
                    publisher: Publisher::default(),
                };
                let mut now = Duration::ZERO;
                for (i, (groups, q, usage, report, dt)) in spec.iter().enumerate() {
                    now += Duration::from_millis(*dt);
                    let tasks: Vec<GpuTaskEntry> = groups
                        .iter()
                        .enumerate()
                        .filter_map(|(pid, g)| g.map(|g| task(pid as u32 + 1, &leaves[g])))
                        .collect();
                    let s = sample(usage);
                    let a = incremental.step(dir.path(), &tasks, &quotas[*q], &s, *report, now, &table);
                    let b = scratch.step(dir.path(), &tasks, &quotas[*q], &s, *report, now, &table);
                    prop_assert_eq!(a, b, "step {}", i);
                }
            }
        }
    }
}
