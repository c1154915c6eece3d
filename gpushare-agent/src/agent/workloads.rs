//! From GPU tasks to the workloads the policy sees: each task's workload at its *root* cgroup, the
//! names only the node's files can tell (Kubernetes, the container engine), and the workload's
//! environment quota.
//!
//! Design note: containers, pods and units are rooted by the cgroup path parser
//! ([`crate::attribution::parse_cgroup_path`]): the outermost component the host's runtime created.
//! A plain cgroup has no such component; its root is the topmost ancestor (or itself) that a
//! `cgroup` glob of the quota file names, so a process in a child group of a named cgroup belongs
//! to (and is isolated with) the named one. An unnamed plain cgroup stays rooted at itself and is
//! protected by the policy anyway.

use std::collections::{HashMap, HashSet};

use super::env_quotas::EnvQuotaReader;
pub use crate::attribution::names::{NameCache, WorkloadNames};
use crate::{
    attribution::{GpuTaskEntry, WorkloadId, WorkloadKind},
    policy::AttributedProcess,
    quota::{GpuInfo, QuotaSet, QuotaSource, Selector, WorkloadMeta},
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

/// Builds the policy's view of the GPU tasks, step after step.
pub struct Workloads {
    names: NameCache,
    env_quotas: EnvQuotaReader,
    quota_trust: HashMap<String, &'static str>,
}

impl Workloads {
    /// Over the cgroup v2 hierarchy at `v2_root` (where a container's init is looked for when its
    /// runtime spec cannot be found).
    pub fn new(v2_root: std::path::PathBuf) -> Self {
        Self {
            names: NameCache::default(),
            env_quotas: EnvQuotaReader::system(v2_root),
            quota_trust: HashMap::new(),
        }
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

    /// One [`AttributedProcess`] per task with a known workload, each workload at its root, with
    /// the environment quota its runtime gave it (one lookup per workload per step).
    pub fn attribute<'a>(
        &mut self,
        tasks: impl Iterator<Item = &'a GpuTaskEntry>,
        quotas: &QuotaSet,
        gpus: &[GpuInfo],
    ) -> Vec<AttributedProcess> {
        let env_enabled = quotas.defaults().env_quotas;
        let unit = quotas.defaults().gpushare_unit;
        let mut out = Vec::new();
        let mut env_of = HashMap::new();
        // Several tasks share a cgroup: its workload (root, names, environment quota) is worked
        // out once per step.
        let mut of_leaf: HashMap<&str, (WorkloadMeta, Option<_>)> = HashMap::new();
        for t in tasks {
            let Some(w) = &t.workload else { continue };
            let (workload, env) = of_leaf.entry(w.cgroup_path.as_str()).or_insert_with(|| {
                let id = match w.kind {
                    WorkloadKind::Cgroup => WorkloadId {
                        cgroup_path: cgroup_root(quotas, &w.cgroup_path),
                        kind: WorkloadKind::Cgroup,
                    },
                    _ => w.clone(),
                };
                let env = env_of
                    .entry(id.key())
                    .or_insert_with(|| {
                        env_enabled
                            .then(|| self.env_quotas.quota_for(&id, unit, gpus))
                            .flatten()
                            .map(|(q, _)| q)
                    })
                    .clone();
                let names = self.names.get(&id);
                let meta = WorkloadMeta {
                    id,
                    container_name: names.container,
                    pod_namespace: names.namespace,
                    pod_name: names.pod,
                };
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
        self.quota_trust.clear();
        for (workload, env) in of_leaf.values() {
            let key = workload.id.key();
            if self.quota_trust.contains_key(&key) {
                continue;
            }
            let trust = match quotas.resolve(workload, env.as_ref()) {
                Some(q) if matches!(q.source, QuotaSource::File { .. }) => "file",
                Some(_) => self.env_quotas.trust_of(&key).map_or("", |t| t.as_str()),
                None => "",
            };
            self.quota_trust.insert(key, trust);
        }
        out
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
}
