//! Human names of a workload (Kubernetes namespace, pod, container; the engine's container name)
//! that the node's own files can tell, without an API server, cached per workload key.

use std::{
    collections::{HashMap, HashSet},
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
pub struct NameCache(HashMap<String, (WorkloadNames, Instant)>);

impl NameCache {
    const RETRY: Duration = Duration::from_secs(10);

    /// The names of `id`, from the cache or looked up.
    pub fn get(&mut self, id: &WorkloadId) -> WorkloadNames {
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

    /// The cached names of a key, if looked up.
    pub fn cached(&self, key: &str) -> Option<&WorkloadNames> {
        self.0.get(key).map(|(n, _)| n)
    }

    /// Forgets the names of every key not in `live`.
    pub fn retain(&mut self, live: &HashSet<String>) {
        self.0.retain(|k, _| live.contains(k));
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
