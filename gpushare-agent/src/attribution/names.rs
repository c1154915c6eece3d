//! Human names of a workload (Kubernetes namespace, pod, container; the engine's container name)
//! that the node's own files can tell, without an API server, cached per workload key.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use super::{WorkloadId, WorkloadKind, docker, k8s_names, workload::Runtime};

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
pub struct NameCache {
    /// foldhash (looked up per workload row at every step; a random seed per process).
    names: foldhash::HashMap<String, (WorkloadNames, Instant)>,
    /// Changes whenever an entry is added, replaced or forgotten, and is never the same for two
    /// caches with different entries (numbers drawn from one counter): two reads with the same
    /// generation read the same names.
    generation: u64,
}

/// Where generations are drawn from (0 is an empty cache's).
static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl NameCache {
    const RETRY: Duration = Duration::from_secs(10);

    /// The names of `id`, from the cache or looked up.
    pub fn get(&mut self, id: &WorkloadId) -> WorkloadNames {
        self.get_keyed(&id.key(), id).clone()
    }

    /// [`NameCache::get`] where the caller has `id`'s key already: nothing built or copied on a
    /// hit.
    pub fn get_keyed(&mut self, key: &str, id: &WorkloadId) -> &WorkloadNames {
        let fresh = self.names.get(key).is_some_and(|(names, at)| {
            *names != WorkloadNames::default() || at.elapsed() < Self::RETRY
        });
        if !fresh {
            let names = lookup_names(id);
            self.names.insert(key.to_string(), (names, Instant::now()));
            self.bump();
        }
        &self.names[key].0
    }

    /// The cached names of a key, if looked up.
    pub fn cached(&self, key: &str) -> Option<&WorkloadNames> {
        self.names.get(key).map(|(n, _)| n)
    }

    /// A number that changes with the cache's entries (see the field).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Sets the names of `key` (tests: the disk lookups read fixed paths).
    #[cfg(test)]
    pub fn insert_for_test(&mut self, key: &str, names: WorkloadNames) {
        self.names.insert(key.to_string(), (names, Instant::now()));
        self.bump();
    }

    fn bump(&mut self) {
        self.generation = GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Forgets the names of every key not in `live`.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        let before = self.names.len();
        self.names.retain(|k, _| live(k));
        if self.names.len() != before {
            self.bump();
        }
    }
}

fn lookup_names(id: &WorkloadId) -> WorkloadNames {
    use k8s_names::{
        CONTAINER_LOG_ROOT, POD_LOG_ROOT, container_names_from_log_links, pod_names_from_log_dir,
    };
    let mut names = WorkloadNames::default();
    if let Some(cid) = id.container_id()
        && let Some(c) = container_names_from_log_links(Path::new(CONTAINER_LOG_ROOT), cid)
    {
        names.namespace = Some(c.namespace);
        names.pod = Some(c.pod);
        names.container = Some(c.container);
        return names;
    }
    // A plain Docker container: its name from the engine's on-disk config (no API call). In a pod
    // the engine's `k8s_...` name is not the pod spec's, so only plain containers are looked up.
    if let WorkloadKind::Container {
        runtime: Runtime::Docker,
        container_id,
        pod_uid: None,
        ..
    } = &id.kind
    {
        let root = docker::data_root_from(Path::new(docker::DAEMON_JSON));
        names.container = docker::docker_container_name(&root, container_id);
        return names;
    }
    if let Some(uid) = id.pod_uid()
        && let Some(p) = pod_names_from_log_dir(Path::new(POD_LOG_ROOT), uid)
    {
        names.namespace = Some(p.namespace);
        names.pod = Some(p.pod);
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::parse_cgroup_path;

    /// The generation moves with the entries (an entry added, entries forgotten) and only then,
    /// and two caches that were written never share one: a reader that saw a generation can
    /// trust names it read then are the names now.
    #[test]
    fn the_generation_changes_exactly_when_the_entries_do() {
        let mut cache = NameCache::default();
        assert_eq!(cache.generation(), 0);
        let id = parse_cgroup_path("/jobs/a");
        cache.get(&id);
        let added = cache.generation();
        assert_ne!(added, 0);
        // A miss asked again within the retry period is served from the cache: unchanged.
        cache.get(&id);
        assert_eq!(cache.generation(), added);
        // Forgetting nothing changes nothing; forgetting an entry does.
        cache.retain(|k| k == id.key());
        assert_eq!(cache.generation(), added);
        cache.retain(|_| false);
        assert_ne!(cache.generation(), added);
        assert!(cache.cached(&id.key()).is_none());
        let mut other = NameCache::default();
        other.get(&id);
        assert_ne!(other.generation(), cache.generation());
        assert_ne!(other.generation(), added);
    }
}
