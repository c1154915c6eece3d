//! The watcher task behind [`super::api::spawn_watcher`]: one watch of this node's pods (kube's
//! `runtime::watcher`), a GET of each ResourceClaim when a pod's reference to it first appears,
//! and the [`KubeView`] published after every change. See the design note in [`super::api`].

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use ::kube::{
    Api,
    api::GetParams,
    runtime::{WatchStreamExt, watcher},
};
use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{
        Container, ContainerStatus, Pod, PodResourceClaim, PodResourceClaimStatus, PodSpec,
        PodStatus, ResourceRequirements,
    },
    resource::v1::ResourceClaim,
};
use log::{info, warn};
use tokio::sync::watch;

use crate::grants::claims::{self, KubeView, Pinned};
use crate::quota::GpuShareUnit;

/// The longest wait between retries of a claim that fails.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The page size of the pod lists (a relist of a node with many pods is read in pages).
pub const PAGE: u32 = 10;
/// How long one claim GET may take.
pub const CLAIM_TIMEOUT: Duration = Duration::from_secs(30);

/// The watcher's counters.
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Failed reads (the watch, or one claim).
    pub errors_total: AtomicU64,
    /// Complete pod lists (the first, and a relist after a 410).
    pub reads_total: AtomicU64,
    /// ResourceClaim GETs.
    pub claim_reads_total: AtomicU64,
    /// Annotation edits after a container's start, ignored.
    pub annotation_edits_total: AtomicU64,
    /// Times the view outlived its staleness bound (each said once in the log).
    pub stale_total: AtomicU64,
}

/// How long after the last error the API server counts as answering again (the watcher retries
/// at most 30 s apart while it fails).
const QUIET: Duration = Duration::from_secs(40);

/// Only what the grants are made of: names, uid, the annotations read (KAI's `nvidia.com/container.`
/// and `nvidia.cdi.k8s.io/`, TensorFusion's and GPUShare's), each container's claim entries (and
/// each init container's, with its restart policy), the pod's claim references,
/// and each container's status (id, running). A tenant's other fields (up to 1.5 MiB a pod) are dropped
/// on arrival, so what the agent keeps is bounded by what it reads, not by what a pod carries.
pub fn slim(p: Pod) -> Pod {
    let mut meta = p.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, _| {
            k.starts_with(claims::KAI_PREFIX)
                || k.starts_with(claims::KAI_CDI_PREFIX)
                || k == claims::TF_VRAM_LIMIT
                || k == claims::TF_INJECT
                || k == claims::GPUSHARE_POD
                || k == claims::GPUSHARE_IDX
        });
    }
    // A container as far as its grant goes: its name, its claim entries, and (an init
    // container's) restart policy (a native sidecar's is `Always`).
    let bounded = |c: Container| Container {
        name: c.name,
        resources: c.resources.map(|r| ResourceRequirements {
            claims: r.claims,
            ..ResourceRequirements::default()
        }),
        restart_policy: c.restart_policy,
        ..Container::default()
    };
    let spec = p.spec.map(|s| PodSpec {
        node_name: s.node_name,
        containers: s.containers.into_iter().map(bounded).collect(),
        init_containers: s
            .init_containers
            .map(|v| v.into_iter().map(bounded).collect()),
        resource_claims: s.resource_claims.map(|v| {
            v.into_iter()
                .map(|c| PodResourceClaim {
                    name: c.name,
                    resource_claim_name: c.resource_claim_name,
                    ..PodResourceClaim::default()
                })
                .collect()
        }),
        ..PodSpec::default()
    });
    let running = |v: Vec<ContainerStatus>| {
        v.into_iter()
            .map(|c| ContainerStatus {
                name: c.name,
                container_id: c.container_id,
                state: c.state,
                ..ContainerStatus::default()
            })
            .collect()
    };
    let status = p.status.map(|s| PodStatus {
        container_statuses: s.container_statuses.map(running),
        init_container_statuses: s.init_container_statuses.map(running),
        resource_claim_statuses: s.resource_claim_statuses.map(|v| {
            v.into_iter()
                .map(|c| PodResourceClaimStatus {
                    name: c.name,
                    resource_claim_name: c.resource_claim_name,
                })
                .collect()
        }),
        ..PodStatus::default()
    });
    Pod {
        metadata: meta,
        spec,
        status,
    }
}

/// The (namespace, claim name, pod uid) references of `pod`.
fn references(pod: &Pod) -> Vec<(String, String, String)> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut out: Vec<(String, String, String)> = pod
        .spec
        .iter()
        .flat_map(claims::bounded_containers)
        .flat_map(|c| c.resources.iter().flat_map(|r| r.claims.iter().flatten()))
        .filter_map(|r| claims::claim_name(pod, &r.name))
        .map(|n| (ns.clone(), n.to_string(), uid.clone()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A claim as read, the pods it was read for, and when to read it again (a failed read, a
/// 404, or a claim not allocated yet), with its backoff.
#[derive(Default)]
struct Claim {
    claim: Option<ResourceClaim>,
    pods: BTreeSet<String>,
    retry: Option<(Instant, Duration)>,
}

/// The task's state: the pods (by namespace/name), those of a relist in progress, the claims.
struct Task {
    client: ::kube::Client,
    unit: GpuShareUnit,
    stale: Duration,
    tx: watch::Sender<Arc<KubeView>>,
    st: Arc<WatchStats>,
    pods: BTreeMap<String, Pod>,
    relist: Option<BTreeMap<String, Pod>>,
    claims: BTreeMap<(String, String), Claim>,
    pinned: Pinned,
    said_problems: Vec<String>,
    said_error: String,
    /// (since, last error) of the current outage.
    outage: Option<(Instant, Instant)>,
    said_stale: bool,
    published: bool,
}

fn key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or(""),
        p.metadata.name.as_deref().unwrap_or("")
    )
}

impl Task {
    /// Applies one watcher event; true when the pods changed.
    fn apply(&mut self, ev: watcher::Event<Pod>) -> bool {
        match ev {
            watcher::Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(p) => {
                let p = slim(p);
                match self.relist.as_mut() {
                    Some(r) => r.insert(key(&p), p),
                    None => self.pods.insert(key(&p), p),
                };
                false
            }
            watcher::Event::InitDone => {
                self.pods = self.relist.take().unwrap_or_default();
                self.st.reads_total.fetch_add(1, Ordering::Relaxed);
                true
            }
            watcher::Event::Apply(p) => {
                let p = slim(p);
                self.pods.insert(key(&p), p);
                true
            }
            watcher::Event::Delete(p) => {
                self.pods.remove(&key(&p));
                true
            }
        }
    }

    /// The API server answered: the outage (if any) is over.
    fn answered(&mut self) {
        if self.outage.take().is_some() || !self.said_error.is_empty() {
            info!("API server reachable again");
        }
        self.said_error.clear();
        self.said_stale = false;
    }

    fn failed(&mut self, e: &watcher::Error) {
        self.st.errors_total.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let since = self.outage.map_or(now, |(s, _)| s);
        self.outage = Some((since, now));
        let text = e.to_string();
        if text != self.said_error {
            warn!(
                "API server: {text}; running containers keep their grants, retrying with backoff"
            );
            self.said_error = text;
        }
        self.check_stale();
    }

    /// Says once per outage that it outlived the staleness bound: running containers keep their
    /// grants (they cannot change while they run); pods started since are not seen, and so get
    /// none (fail open) until the API server answers.
    fn check_stale(&mut self) {
        let Some((since, last)) = self.outage else {
            return;
        };
        if last.elapsed() > QUIET {
            // No error for longer than the watcher's longest retry: it is watching again.
            self.answered();
            return;
        }
        if since.elapsed() > self.stale && !self.said_stale {
            self.said_stale = true;
            self.st.stale_total.fetch_add(1, Ordering::Relaxed);
            warn!(
                "API server unreachable for over {:?}: the grants of running containers are kept; \
                 pods started since get none until it answers",
                self.stale
            );
        }
    }

    /// Reads the claims newly referenced and those due a retry; true when any changed.
    async fn read_claims(&mut self) -> bool {
        let mut wanted: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for p in self.pods.values() {
            for (ns, name, uid) in references(p) {
                wanted.entry((ns, name)).or_default().insert(uid);
            }
        }
        let before = self.claims.len();
        self.claims.retain(|k, _| wanted.contains_key(k));
        let mut changed = before != self.claims.len();
        let now = Instant::now();
        for ((ns, name), pods) in wanted {
            let c = self.claims.entry((ns.clone(), name.clone())).or_default();
            let new_pod = !pods.is_subset(&c.pods);
            let due = c.retry.is_some_and(|(at, _)| at <= now);
            if !new_pod && !due {
                continue;
            }
            // First read from the API server's cache (resourceVersion=0); a retry reads the
            // latest (quorum), so a claim not allocated in a lagging cache is read again.
            let gp = if c.retry.is_none() {
                GetParams::any()
            } else {
                GetParams::default()
            };
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &ns);
            let got = tokio::time::timeout(CLAIM_TIMEOUT, api.get_with(&name, &gp)).await;
            self.st.claim_reads_total.fetch_add(1, Ordering::Relaxed);
            let backoff = c
                .retry
                .map_or(Duration::from_secs(1), |(_, b)| (b * 2).min(MAX_BACKOFF));
            c.pods = pods;
            match got {
                Ok(Ok(claim)) => {
                    let allocated = claim
                        .status
                        .as_ref()
                        .is_some_and(|s| s.allocation.is_some());
                    c.retry = (!allocated).then(|| (now + backoff, backoff));
                    changed |= c.claim.as_ref() != Some(&claim);
                    c.claim = Some(claim);
                }
                Ok(Err(::kube::Error::Api(s))) if s.code == 404 => {
                    c.retry = Some((now + backoff, backoff));
                    changed |= c.claim.take().is_some();
                }
                Ok(Err(e)) => {
                    self.st.errors_total.fetch_add(1, Ordering::Relaxed);
                    warn!(
                        "ResourceClaim {ns}/{name}: {e}; retrying in {backoff:?} (this claim only)"
                    );
                    c.retry = Some((now + backoff, backoff));
                }
                Err(_) => {
                    self.st.errors_total.fetch_add(1, Ordering::Relaxed);
                    warn!(
                        "ResourceClaim {ns}/{name}: no answer in {CLAIM_TIMEOUT:?}; retrying in {backoff:?}"
                    );
                    c.retry = Some((now + backoff, backoff));
                }
            }
        }
        changed
    }

    fn publish(&mut self) {
        let pods: Vec<Pod> = self.pods.values().cloned().collect();
        let claims: Vec<ResourceClaim> = self
            .claims
            .values()
            .filter_map(|c| c.claim.clone())
            .collect();
        let mut view = claims::view(&pods, &claims, self.unit);
        for edit in self.pinned.apply(&mut view) {
            warn!("{edit}");
        }
        self.st
            .annotation_edits_total
            .store(self.pinned.edits_total(), Ordering::Relaxed);
        if view.problems != self.said_problems {
            for p in view
                .problems
                .iter()
                .filter(|p| !self.said_problems.contains(p))
            {
                warn!("API server grants: {p}");
            }
            self.said_problems.clone_from(&view.problems);
        }
        self.published = true;
        self.tx.send_replace(Arc::new(view));
    }
}

/// Runs the watcher until the last [`super::api::KubeWatch`] is dropped.
pub async fn run(
    client: ::kube::Client,
    node: String,
    unit: GpuShareUnit,
    stale: Duration,
    tx: watch::Sender<Arc<KubeView>>,
    st: Arc<WatchStats>,
) {
    let pods: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .any_semantic()
        .page_size(PAGE);
    let mut stream = watcher(pods, config).default_backoff().boxed();
    let mut t = Task {
        client,
        unit,
        stale,
        tx,
        st,
        pods: BTreeMap::new(),
        relist: None,
        claims: BTreeMap::new(),
        pinned: Pinned::default(),
        said_problems: Vec::new(),
        said_error: String::new(),
        outage: None,
        said_stale: false,
        published: false,
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let changed = tokio::select! {
            ev = stream.next() => match ev {
                None => return,
                Some(Ok(ev)) => {
                    t.answered();
                    t.apply(ev)
                }
                Some(Err(e)) => {
                    t.failed(&e);
                    false
                }
            },
            _ = tick.tick() => {
                t.check_stale();
                false
            }
        };
        if t.tx.is_closed() {
            return;
        }
        let ready = t.relist.is_none() && (t.published || changed);
        if ready {
            let claims_changed = t.read_claims().await;
            if changed || claims_changed {
                t.publish();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod carrying what a tenant may put in it (1 MiB of annotations, labels, managed fields,
    /// an image and env per container) is kept at the size of what the grants use, and its
    /// grants are the same as the whole pod's.
    #[test]
    fn a_slim_pod_keeps_only_what_the_grants_use_and_grants_the_same() {
        let cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "big-0", "namespace": "ml", "uid": "u-1",
                "labels": { "app": "x".repeat(60) },
                "annotations": {
                    "junk": "x".repeat(1 << 20),
                    "nvidia.com/container.a.gpu-memory.limit": "1Gi" },
                "managedFields": [ { "manager": "kubectl", "operation": "Apply",
                                     "fieldsV1": { "f:x": "y".repeat(4096) } } ] },
            "spec": { "nodeName": "node-1", "containers": [
                { "name": "a", "image": "cuda", "env": [ { "name": "E", "value": "v".repeat(4096) } ],
                  "resources": { "claims": [ { "name": "gpu" } ] } } ],
              "resourceClaims": [ { "name": "gpu", "resourceClaimName": "x" } ] },
            "status": { "containerStatuses": [ {
                "name": "a", "image": "cuda", "imageID": "", "ready": true, "restartCount": 0,
                "containerID": format!("containerd://{cid}"), "state": { "running": {} } } ] }
        }))
        .unwrap();
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "x", "namespace": "ml" },
            "spec": {},
            "status": { "allocation": { "devices": { "results": [ {
                "request": "gpu", "driver": claims::NVIDIA_DRA_DRIVER, "pool": "node-1",
                "device": "gpu-0", "consumedCapacity": { "memory": "2Gi" } } ] } } }
        }))
        .unwrap();
        let whole = serde_json::to_vec(&pod).unwrap().len();
        let slimmed = slim(pod.clone());
        let kept = serde_json::to_vec(&slimmed).unwrap().len();
        assert!(whole > 1 << 20 && kept < 2048, "{whole} -> {kept}");
        let unit = GpuShareUnit::GiB;
        let (a, b) = (
            claims::view(&[pod], std::slice::from_ref(&claim), unit),
            claims::view(&[slimmed], &[claim], unit),
        );
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert!(
            a.containers.get(cid).is_some_and(|c| c.dra.is_some()),
            "{a:?}"
        );
        assert_eq!(references(&slim(Pod::default())), vec![]);
    }
}
