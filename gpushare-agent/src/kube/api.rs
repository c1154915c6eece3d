//! The API server: an in-cluster client (the service account's token and CA from
//! `[kubernetes] service_account_dir`, the server from `api_server` or `KUBERNETES_SERVICE_HOST`
//! and `_PORT`), and a background task that lists this node's pods
//! (`fieldSelector=spec.nodeName=<node>`) and the ResourceClaims they use, and publishes a
//! [`KubeView`] the step reads without waiting ([`KubeWatch::current`]).
//!
//! Design note: the step never waits on HTTP. The task lists every [`POLL`] (the pods of one node,
//! served from the API server's watch cache), and after an error backs off (1 s doubling to
//! [`MAX_BACKOFF`]); errors are counted and logged once per change. A view older than [`STALE`]
//! (the API server unreachable) is replaced by an empty one: nothing is granted (fail open: the
//! API server's grants only ever bound a container, so without them it is bounded by its other
//! sources alone).

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use ::kube::api::{Api, ListParams};
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use log::{info, warn};
use tokio::sync::watch;

use super::claims::{self, KubeView, Pinned};
use crate::quota::{GpuShareUnit, KubernetesSettings};

/// How often the pods and claims are listed.
pub const POLL: Duration = Duration::from_secs(3);
/// The longest wait after errors.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long a view outlives the last successful read.
pub const STALE: Duration = Duration::from_secs(60);

/// A connected client and what it is for.
#[derive(Clone)]
pub struct ApiClient {
    /// The client.
    pub client: ::kube::Client,
    /// This node's name.
    pub node: String,
}

/// Why the API server cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The API server's URL from the settings, else `KUBERNETES_SERVICE_HOST` and `_PORT`.
pub fn server_url(
    s: &KubernetesSettings,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    if let Some(u) = &s.api_server {
        return Ok(u.clone());
    }
    match (
        env("KUBERNETES_SERVICE_HOST"),
        env("KUBERNETES_SERVICE_PORT"),
    ) {
        (Some(h), Some(p)) if !h.is_empty() && !p.is_empty() => Ok(if h.contains(':') {
            format!("https://[{h}]:{p}")
        } else {
            format!("https://{h}:{p}")
        }),
        _ => Err(ConfigError(
            "no API server: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set \
             (not in a pod?); set [kubernetes] api_server"
                .into(),
        )),
    }
}

/// This node's name from the settings, else `NODE_NAME`.
pub fn node_name(
    s: &KubernetesSettings,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    s.node_name
        .clone()
        .or_else(|| env("NODE_NAME").filter(|n| !n.is_empty()))
        .ok_or_else(|| {
            ConfigError(
                "no node name: set NODE_NAME (the DaemonSet sets it from spec.nodeName) or \
                 [kubernetes] node_name"
                    .into(),
            )
        })
}

/// The client configuration: the server, the CA of `<dir>/ca.crt`, the token of `<dir>/token`
/// (re-read as it rotates), the namespace of `<dir>/namespace`.
pub fn config(s: &KubernetesSettings, url: &str) -> Result<::kube::Config, ConfigError> {
    let dir = &s.service_account_dir;
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| ConfigError(format!("API server URL `{url}`: {e}")))?;
    let ca_path = dir.join("ca.crt");
    let ca =
        std::fs::read(&ca_path).map_err(|e| ConfigError(format!("{}: {e}", ca_path.display())))?;
    let certs: Vec<Vec<u8>> = pem::parse_many(&ca)
        .map_err(|e| ConfigError(format!("{}: {e}", ca_path.display())))?
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| p.contents().to_vec())
        .collect();
    if certs.is_empty() {
        return Err(ConfigError(format!(
            "{}: no certificate in it",
            ca_path.display()
        )));
    }
    let token = dir.join("token");
    readable(&token)?;
    let mut c = ::kube::Config::new(uri);
    c.root_cert = Some(certs);
    c.auth_info.token_file = Some(token.display().to_string());
    if let Ok(ns) = std::fs::read_to_string(dir.join("namespace")) {
        c.default_namespace = ns.trim().to_string();
    }
    c.read_timeout = Some(Duration::from_secs(30));
    Ok(c)
}

fn readable(p: &Path) -> Result<(), ConfigError> {
    std::fs::metadata(p)
        .map(|_| ())
        .map_err(|e| ConfigError(format!("{}: {e}", p.display())))
}

/// A client from the settings and the process environment (must run inside the runtime).
pub fn connect(s: &KubernetesSettings) -> Result<ApiClient, ConfigError> {
    let env = |k: &str| std::env::var(k).ok();
    let node = node_name(s, env)?;
    let url = server_url(s, env)?;
    let config = config(s, &url)?;
    let client = ::kube::Client::try_from(config)
        .map_err(|e| ConfigError(format!("API server client: {e}")))?;
    info!(
        "API server {url}: reading this node's ({node}) pods and their ResourceClaims with the \
         service account of {}",
        s.service_account_dir.display()
    );
    Ok(ApiClient { client, node })
}

/// What the watcher publishes and counts.
#[derive(Clone)]
pub struct KubeWatch {
    rx: watch::Receiver<Arc<KubeView>>,
    stats: Arc<WatchStats>,
}

/// The watcher's counters.
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Failed reads.
    pub errors_total: AtomicU64,
    /// Successful reads.
    pub reads_total: AtomicU64,
    /// Annotation edits after a container's start, ignored.
    pub annotation_edits_total: AtomicU64,
}

impl KubeWatch {
    /// The latest view (never waits).
    pub fn current(&self) -> Arc<KubeView> {
        self.rx.borrow().clone()
    }

    /// The counters.
    pub fn stats(&self) -> &WatchStats {
        &self.stats
    }

    /// Waits until a view from a successful read is published (tests, start-up).
    pub async fn wait_fresh(&mut self) {
        let _ = self.rx.wait_for(|v| v.fresh).await;
    }

    /// A watch over a fixed view (tests).
    pub fn fixed(view: KubeView) -> Self {
        let (_tx, rx) = watch::channel(Arc::new(view));
        Self {
            rx,
            stats: Arc::default(),
        }
    }
}

/// Lists this node's pods and the claims they use, once.
pub async fn read(api: &ApiClient) -> Result<(Vec<Pod>, Vec<ResourceClaim>), ::kube::Error> {
    let pods: Api<Pod> = Api::all(api.client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={}", api.node));
    let pods = pods.list(&lp).await?.items;
    let mut names: Vec<(String, String)> = Vec::new();
    for p in &pods {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let uses = p
            .spec
            .iter()
            .flat_map(claims::bounded_containers)
            .flat_map(|c| {
                c.resources
                    .iter()
                    .flat_map(|r| r.claims.iter().flatten())
                    .map(|r| r.name.as_str())
            });
        for entry in uses {
            if let Some(n) = claims::claim_name(p, entry) {
                names.push((ns.clone(), n.to_string()));
            }
        }
    }
    names.sort();
    names.dedup();
    let mut out = Vec::new();
    for (ns, name) in names {
        let api: Api<ResourceClaim> = Api::namespaced(api.client.clone(), &ns);
        if let Some(c) = api.get_opt(&name).await? {
            out.push(c);
        }
    }
    Ok((pods, out))
}

/// Starts the watcher task; `unit` is GPUShare's memory unit (for its annotations).
pub fn spawn_watcher(api: ApiClient, unit: GpuShareUnit) -> KubeWatch {
    let (tx, rx) = watch::channel(Arc::new(KubeView::default()));
    let stats = Arc::new(WatchStats::default());
    let st = stats.clone();
    tokio::spawn(async move {
        let mut pinned = Pinned::default();
        let mut backoff = Duration::from_secs(1);
        let mut last_ok = Instant::now();
        let mut said_error = String::new();
        let mut said_problems: Vec<String> = Vec::new();
        loop {
            let wait = match read(&api).await {
                Ok((pods, claims)) => {
                    st.reads_total.fetch_add(1, Ordering::Relaxed);
                    if !said_error.is_empty() {
                        info!("API server reachable again");
                        said_error.clear();
                    }
                    let mut view = claims::view(&pods, &claims, unit);
                    for edit in pinned.apply(&mut view) {
                        warn!("{edit}");
                    }
                    st.annotation_edits_total
                        .store(pinned.edits_total(), Ordering::Relaxed);
                    if view.problems != said_problems {
                        for p in view.problems.iter().filter(|p| !said_problems.contains(p)) {
                            warn!("API server grants: {p}");
                        }
                        said_problems.clone_from(&view.problems);
                    }
                    last_ok = Instant::now();
                    backoff = Duration::from_secs(1);
                    tx.send_replace(Arc::new(view));
                    POLL
                }
                Err(e) => {
                    st.errors_total.fetch_add(1, Ordering::Relaxed);
                    let text = e.to_string();
                    if text != said_error {
                        warn!(
                            "API server: {text}; its grants are kept for {STALE:?} after the last \
                             read, then dropped (retrying with backoff)"
                        );
                        said_error = text;
                    }
                    if last_ok.elapsed() > STALE && tx.borrow().fresh {
                        warn!("API server unreachable for {STALE:?}: its grants are dropped");
                        tx.send_replace(Arc::new(KubeView::default()));
                    }
                    let w = backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    w
                }
            };
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(wait).await;
        }
    });
    KubeWatch { rx, stats }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| v.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_server_and_node_come_from_the_settings_else_the_pods_environment() {
        let mut s = KubernetesSettings::default();
        let in_pod = env(&[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("NODE_NAME", "gpu-1"),
        ]);
        assert_eq!(server_url(&s, &in_pod).unwrap(), "https://10.96.0.1:443");
        assert_eq!(node_name(&s, &in_pod).unwrap(), "gpu-1");
        let v6 = env(&[
            ("KUBERNETES_SERVICE_HOST", "fd00::1"),
            ("KUBERNETES_SERVICE_PORT", "6443"),
        ]);
        assert_eq!(server_url(&s, &v6).unwrap(), "https://[fd00::1]:6443");
        let none = env(&[("KUBERNETES_SERVICE_HOST", ""), ("NODE_NAME", "")]);
        assert!(server_url(&s, &none).unwrap_err().0.contains("api_server"));
        assert!(node_name(&s, &none).unwrap_err().0.contains("NODE_NAME"));
        s.api_server = Some("https://api.example:6443".into());
        s.node_name = Some("n2".into());
        assert_eq!(server_url(&s, &in_pod).unwrap(), "https://api.example:6443");
        assert_eq!(node_name(&s, &in_pod).unwrap(), "n2");
    }

    #[test]
    fn a_service_account_dir_without_ca_or_token_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let s = KubernetesSettings {
            service_account_dir: dir.path().into(),
            ..KubernetesSettings::default()
        };
        let e = config(&s, "https://127.0.0.1:1").unwrap_err().0;
        assert!(e.contains("ca.crt"), "{e}");
        std::fs::write(dir.path().join("ca.crt"), "not pem").unwrap();
        let e = config(&s, "https://127.0.0.1:1").unwrap_err().0;
        assert!(e.contains("no certificate"), "{e}");
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.path().join("ca.crt"), cert.cert.pem()).unwrap();
        let e = config(&s, "https://127.0.0.1:1").unwrap_err().0;
        assert!(e.contains("token"), "{e}");
        std::fs::write(dir.path().join("token"), "t").unwrap();
        std::fs::write(dir.path().join("namespace"), "gpushare\n").unwrap();
        let c = config(&s, "https://127.0.0.1:1").unwrap();
        assert_eq!(c.default_namespace, "gpushare");
        assert_eq!(c.root_cert.unwrap().len(), 1);
        assert!(config(&s, "not a url").is_err());
    }

    /// A fake API server as a tower service: answers the node's pod list and the claims it
    /// holds (404 for others), or 500 to everything once `down`; records the paths and queries.
    #[derive(Default)]
    struct FakeApi {
        pods: serde_json::Value,
        claims: Vec<serde_json::Value>,
        down: std::sync::atomic::AtomicBool,
        asked: std::sync::Mutex<Vec<String>>,
    }

    impl FakeApi {
        fn client(self: &Arc<Self>) -> ApiClient {
            let f = self.clone();
            let svc =
                tower::service_fn(move |req: hyper::Request<::kube::client::Body>| {
                    let f = f.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        f.asked.lock().unwrap().push(req.uri().to_string());
                        let found =
                            if f.down.load(Ordering::SeqCst) {
                                None
                            } else if path == "/api/v1/pods" {
                                Some(f.pods.clone())
                            } else {
                                f.claims.iter().find(|c| {
                            path == format!(
                                "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}",
                                c["metadata"]["namespace"].as_str().unwrap(),
                                c["metadata"]["name"].as_str().unwrap()
                            )
                        }).cloned()
                            };
                        let code = match &found {
                            Some(_) => 200,
                            None if f.down.load(Ordering::SeqCst) => 500,
                            None => 404,
                        };
                        let body = found.unwrap_or_else(|| {
                            serde_json::json!({
                                "apiVersion": "v1", "kind": "Status", "status": "Failure",
                                "message": "from the fake", "reason": "NotFound", "code": code
                            })
                        });
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .status(code)
                                .header("content-type", "application/json")
                                .body(http_body_util::Full::new(hyper::body::Bytes::from(
                                    body.to_string(),
                                )))
                                .unwrap(),
                        )
                    }
                });
            ApiClient {
                client: ::kube::Client::new(svc, "default"),
                node: "node-1".into(),
            }
        }
    }

    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// Pod `trainer-0` on node-1: container `a` uses claims `x` and `gone` (twice), running.
    fn fake() -> FakeApi {
        let pod = serde_json::json!({
            "metadata": { "name": "trainer-0", "namespace": "ml", "uid": "u-1" },
            "spec": { "nodeName": "node-1", "containers": [
                { "name": "a", "resources": { "claims": [ { "name": "gpu" }, { "name": "old" } ] } },
                { "name": "b", "resources": { "claims": [ { "name": "gpu" } ] } } ],
              "resourceClaims": [ { "name": "gpu", "resourceClaimName": "x" },
                                  { "name": "old", "resourceClaimName": "gone" } ] },
            "status": { "containerStatuses": [ {
                "name": "a", "image": "cuda", "imageID": "", "ready": true, "restartCount": 0,
                "containerID": format!("containerd://{CID}"),
                "state": { "running": {} } } ] }
        });
        let claim = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": "x", "namespace": "ml" },
            "spec": {},
            "status": { "allocation": { "devices": { "results": [ {
                "request": "gpu", "driver": claims::NVIDIA_DRA_DRIVER, "pool": "node-1",
                "device": "gpu-0", "consumedCapacity": { "memory": "2Gi" } } ] } } }
        });
        FakeApi {
            pods: serde_json::json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [pod] }),
            claims: vec![claim],
            ..FakeApi::default()
        }
    }

    #[tokio::test]
    async fn a_read_lists_this_nodes_pods_and_gets_each_claim_they_use_once() {
        let api = Arc::new(fake());
        let (pods, claims) = read(&api.client()).await.unwrap();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].metadata.name.as_deref(), Some("trainer-0"));
        // `gone` answers 404: not there, no error.
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].metadata.name.as_deref(), Some("x"));
        let asked = api.asked.lock().unwrap().clone();
        assert!(
            asked[0].starts_with("/api/v1/pods?")
                && asked[0].contains("fieldSelector=spec.nodeName%3Dnode-1"),
            "{asked:?}"
        );
        // Each claim once, though two containers use `x`.
        assert_eq!(asked.len(), 3, "{asked:?}");
        api.down.store(true, Ordering::SeqCst);
        assert!(read(&api.client()).await.is_err());
    }

    /// The watcher publishes the grants of a read, counts reads and errors, and keeps the last
    /// grants through an error (dropped only after [`STALE`]).
    #[tokio::test]
    async fn the_watcher_publishes_and_keeps_its_grants_through_an_error() {
        let api = Arc::new(fake());
        let mut w = spawn_watcher(api.client(), GpuShareUnit::GiB);
        // Bounded, so a watcher that never publishes fails the test rather than hanging it.
        tokio::time::timeout(Duration::from_secs(30), w.wait_fresh())
            .await
            .expect("a fresh view");
        let v = w.current();
        assert!(v.fresh, "{v:?}");
        // `a` and `b` share claim `x`: the pod is bounded by it.
        let q = v.quota_for_pod("u-1").unwrap();
        assert_eq!(
            q.per_gpu,
            vec![(crate::quota::DeviceRef::Minor(0), 2 << 30)]
        );
        assert_eq!(w.stats().reads_total.load(Ordering::Relaxed), 1);
        api.down.store(true, Ordering::SeqCst);
        // The next read (after POLL) fails: counted, the grants kept.
        for _ in 0..1000 {
            if w.stats().errors_total.load(Ordering::Relaxed) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(w.stats().errors_total.load(Ordering::Relaxed), 1);
        let v = w.current();
        assert!(v.fresh && v.quota_for_pod("u-1").is_some(), "{v:?}");
    }

    #[test]
    fn an_empty_host_or_port_is_no_server() {
        let s = KubernetesSettings::default();
        for (h, p) in [("", "443"), ("10.96.0.1", ""), ("", "")] {
            let vars = [
                ("KUBERNETES_SERVICE_HOST", h),
                ("KUBERNETES_SERVICE_PORT", p),
            ];
            let e = env(&vars);
            assert!(server_url(&s, &e).is_err(), "{h:?} {p:?}");
        }
    }
}
