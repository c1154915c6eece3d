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

use std::collections::{BTreeSet, HashMap, HashSet};

use log::warn;

use super::{
    env_quotas::{EnvQuotaReader, runtime_spec::SpecRoots},
    identity::{self, Identity, RuntimeRecords, Verdict},
};
pub use crate::attribution::names::{NameCache, WorkloadNames};
use crate::{
    attribution::{GpuTaskEntry, WorkloadId, WorkloadKind, docker::DAEMON_JSON},
    kube::{
        api::KubeWatch,
        claims::{KubeView, smallest},
    },
    policy::AttributedProcess,
    quota::{EnvQuota, EnvSource, GpuInfo, QuotaSet, QuotaSource, Selector, WorkloadMeta},
    snapshot::IdentityNote,
    workload::{Placement, nested_container, parse_cgroup_path_in, parse_without_runtime},
};

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

/// A workload-identity event the agent counts ([`super::counters::Counters::identity`]).
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

/// Builds the policy's view of the GPU tasks, step after step.
pub struct Workloads {
    names: NameCache,
    env_quotas: EnvQuotaReader,
    quota_trust: HashMap<String, &'static str>,
    placement: Placement,
    records: RuntimeRecords,
    notes: HashMap<String, IdentityNote>,
    conflicts: HashSet<String>,
    mismatches: HashSet<String>,
    events: Vec<IdentityEvent>,
    /// The API server's grants (DRA claims, pod annotations), when `[kubernetes] api` is on.
    kube: Option<KubeWatch>,
}

/// A container that shares a DRA claim with another container of its pod belongs to the pod: the
/// claim bounds their union (see [`crate::kube::claims`]). Only a container at its runtime's place
/// in that very pod.
fn sharing_pod(
    found: (WorkloadId, Option<Identity>),
    view: &KubeView,
) -> (WorkloadId, Option<Identity>) {
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
        return (pod, Some(Identity::Placement));
    }
    found
}

/// The API server's quota for a workload: a container's own, or a sharing pod's.
fn kube_quota(id: &WorkloadId, view: &KubeView) -> Option<EnvQuota> {
    match &id.kind {
        WorkloadKind::Container { container_id, .. } => view.quota_for_container(container_id),
        WorkloadKind::Pod { pod_uid, .. } => view.quota_for_pod(pod_uid),
        _ => None,
    }
}

impl Workloads {
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
            env_quotas: EnvQuotaReader::new(roots.clone(), v2_root),
            quota_trust: HashMap::new(),
            placement,
            records: RuntimeRecords::new(roots),
            notes: HashMap::new(),
            conflicts: HashSet::new(),
            mismatches: HashSet::new(),
            events: Vec::new(),
            kube: None,
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

    /// How far each workload's quota source is trusted (`file`, `runtime_spec`, `init_environ`).
    pub fn quota_trust(&self) -> &HashMap<String, &'static str> {
        &self.quota_trust
    }

    /// What each workload's identity rests on, and its nested containers.
    pub fn identity_notes(&self) -> &HashMap<String, IdentityNote> {
        &self.notes
    }

    /// The identity events since the last call (each conflict and mismatch once, when it starts).
    pub fn take_events(&mut self) -> Vec<IdentityEvent> {
        std::mem::take(&mut self.events)
    }

    /// The workload of the group `leaf`: at its runtime's place and confirmed by its record
    /// where one can be read; else its unit (or an inner group a quota names by its path), or
    /// the plain path rooted by the quotas' `cgroup` globs.
    fn identify(&mut self, leaf: &str, quotas: &QuotaSet) -> (WorkloadId, Option<Identity>) {
        let w = parse_cgroup_path_in(leaf, &self.placement);
        let w = match &w.kind {
            WorkloadKind::Container { .. } => match self.records.check(&w) {
                Some(Verdict::Confirmed) => return (w, Some(Identity::Runtime)),
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
                    parse_without_runtime(leaf)
                }
                _ => return (w, Some(Identity::Placement)),
            },
            WorkloadKind::Pod { .. } => return (w, Some(Identity::Placement)),
            _ => w,
        };
        (path_rooted(w, leaf, quotas), None)
    }

    /// The key the group at `path` (a workload's root, as the ledger records it) has now, by its
    /// runtime's place and the quotas alone: how an earlier version's freezes are taken over.
    pub fn key_of_group(&self, path: &str, quotas: &QuotaSet) -> String {
        path_rooted(parse_cgroup_path_in(path, &self.placement), path, quotas).key()
    }

    /// One [`AttributedProcess`] per task with a known workload, each workload at its root, with
    /// the environment quota its runtime gave it (one lookup per workload per step).
    pub fn attribute<'a>(
        &mut self,
        tasks: impl Iterator<Item = &'a GpuTaskEntry>,
        quotas: &QuotaSet,
        gpus: &[GpuInfo],
    ) -> Vec<AttributedProcess> {
        let env_enabled = quotas.defaults().env_quotas;
        let view = self.kube_view();
        let unit = quotas.defaults().gpushare_unit;
        let tasks: Vec<&GpuTaskEntry> = tasks
            .filter(|t| t.workload.is_some() && t.cgroup_path.is_some())
            .collect();
        // Several tasks share a cgroup: its identity is worked out once per step.
        let mut of_leaf: HashMap<&str, (WorkloadId, Option<Identity>)> = HashMap::new();
        for t in &tasks {
            let leaf = t.cgroup_path.as_deref().unwrap_or("/");
            if !of_leaf.contains_key(leaf) {
                let mut found = self.identify(leaf, quotas);
                if let Some(v) = &view {
                    found = sharing_pod(found, v);
                }
                of_leaf.insert(leaf, found);
            }
        }
        self.one_root_per_identity(&mut of_leaf);
        let mut out = Vec::new();
        let mut env_of = HashMap::new();
        let mut metas: HashMap<&str, (WorkloadMeta, Option<_>)> = HashMap::new();
        self.notes.clear();
        for t in &tasks {
            let leaf = t.cgroup_path.as_deref().unwrap_or("/");
            let (id, identity) = &of_leaf[leaf];
            let (workload, env) = metas.entry(leaf).or_insert_with(|| {
                let claimed = !matches!(identity, None | Some(Identity::Conflict));
                let env = env_of
                    .entry(id.key())
                    .or_insert_with(|| {
                        let env = (env_enabled && claimed)
                            .then(|| self.env_quotas.quota_for(id, unit, gpus))
                            .flatten()
                            .map(|(q, _)| q);
                        // No source lifts another's limit: the smallest per GPU.
                        let granted = view
                            .as_ref()
                            .filter(|_| env_enabled && claimed)
                            .and_then(|v| kube_quota(id, v));
                        smallest(env, granted)
                    })
                    .clone();
                let names = if claimed {
                    self.names.get(id)
                } else {
                    WorkloadNames::default()
                };
                let meta = WorkloadMeta {
                    id: id.clone(),
                    container_name: names.container,
                    pod_namespace: names.namespace,
                    pod_name: names.pod,
                };
                let note = self.notes.entry(id.key()).or_default();
                note.identity = identity.map_or("", Identity::as_str);
                if let Some(nested) = nested_container(leaf, &id.cgroup_path)
                    && !note.nested.contains(&nested)
                {
                    note.nested.push(nested);
                    note.nested.sort();
                }
                (meta, env)
            });
            out.push(AttributedProcess {
                identity: t.identity,
                workload: workload.clone(),
                env_quota: env.clone(),
            });
        }
        let live_keys: HashSet<String> = env_of.keys().cloned().collect();
        self.env_quotas.retain(&live_keys);
        self.names.retain(&live_keys);
        self.records.retain(&live_keys);
        self.quota_trust.clear();
        for (workload, env) in metas.values() {
            let key = workload.id.key();
            if self.quota_trust.contains_key(&key) {
                continue;
            }
            let trust = match quotas.resolve(workload, env.as_ref()) {
                Some(q) if matches!(q.source, QuotaSource::File { .. }) => "file",
                Some(q)
                    if matches!(
                        q.source,
                        QuotaSource::Env(EnvSource::Dra | EnvSource::Annotation)
                    ) =>
                {
                    "api_server"
                }
                Some(_) => self.env_quotas.trust_of(&key).map_or("", |t| t.as_str()),
                None => "",
            };
            self.quota_trust.insert(key, trust);
        }
        out
    }

    /// One identity, one root: where two roots claim one container or pod identity, neither has
    /// it; each is a plain cgroup at its root (only quotas naming a path apply). Logged and
    /// counted once per conflict, when it starts.
    fn one_root_per_identity(
        &mut self,
        of_leaf: &mut HashMap<&str, (WorkloadId, Option<Identity>)>,
    ) {
        let mut roots: HashMap<String, BTreeSet<&str>> = HashMap::new();
        for (id, identity) in of_leaf.values() {
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
        for (id, identity) in of_leaf.values_mut() {
            if identity.is_some() && conflicted.contains(&id.key()) {
                id.kind = WorkloadKind::Cgroup;
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
        GpuTaskEntry {
            identity: crate::attribution::ProcessIdentity {
                pid,
                start_ticks: 1,
            },
            start_boot_ns: 0,
            pidfd: None,
            cgroup_id: 0,
            cgroup_path: Some(path.to_string()),
            workload: Some(crate::workload::parse_cgroup_path(path)),
            comm: "t".into(),
            ioctls: 0,
            alloc_ioctls: 0,
            alloc_events: 0,
            source: crate::attribution::Source::Procfs,
            alive_at_boot_ns: 0,
        }
    }

    /// A workloads builder over an empty runtime state in `dir` (no records, no specs).
    fn workloads(dir: &std::path::Path) -> Workloads {
        Workloads::with(
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
        let row = |key: &str, identity: &str, nested: &[&str]| WorkloadView {
            workload: key.into(),
            gpu_uuid: "GPU-0".into(),
            state: "ok".into(),
            identity: identity.into(),
            nested: nested.iter().map(|s| s.to_string()).collect(),
            ..WorkloadView::default()
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
}
