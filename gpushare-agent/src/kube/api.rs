//! The API server: an in-cluster client (the service account's token and CA from
//! `[kubernetes] service_account_dir`, the server from `api_server` or `KUBERNETES_SERVICE_HOST`
//! and `_PORT`), and a background task that lists this node's pods
//! (`fieldSelector=spec.nodeName=<node>`) and the ResourceClaims they use, and publishes a
//! [`KubeView`] the step reads without waiting ([`KubeWatch::current`]).
//!
//! Design note (issue 43: a fleet of thousands of nodes costs the control plane nothing at rest).
//! The step never waits on HTTP: the watcher task ([`super::watch`]) publishes each view through
//! a `tokio::sync::watch` the step reads with [`KubeWatch::current`].
//! - Pods: one watch (kube's `runtime::watcher`) with `fieldSelector=spec.nodeName=<node>` and
//!   bookmarks; the first list in pages of [`PAGE`] (`limit`, `continue`). The watcher asks for
//!   `resourceVersion=0` semantics (any version, from the watch cache), but kube sends no
//!   `resourceVersion=0` with a `limit`, since the API server ignores the limit there and answers
//!   in one page: the pages win, because an unpaged list of a node whose pods carry a tenant's
//!   megabytes would be deserialised whole before [`super::watch::slim`] drops what is not used.
//!   A list happens at start and after a 410 only;
//!   a dropped watch resumes from the last resourceVersion it saw (an event's or a bookmark's),
//!   and only a 410 Gone relists; retries back off with jitter (kube's `default_backoff`: 0.8 s
//!   doubling to 30 s, jittered, so a fleet never reconnects in lockstep). At rest the only
//!   requests are the watch's renewals (the server ends a watch after its timeout, ~5 minutes):
//!   about 12 an hour.
//! - ResourceClaims: a GET when a pod's reference to a claim first appears (first from the
//!   watch cache, `resourceVersion=0`), none at rest. Chosen over watching claims because a
//!   claim cannot be filtered by node (a watch would be per namespace of this node's pods, each
//!   namespace's every claim streamed to every node running one of its pods), and because a
//!   claim's allocation cannot change while a pod uses it (the scheduler allocates before it
//!   binds the pod, and deallocates only once no pod is reserved on it). A claim that fails, is
//!   not found, or is not allocated yet is read again with its own backoff (1 s doubling to
//!   [`MAX_BACKOFF`], latest, not cached): its pod's grant waits, the others' do not.
//! - Kept: only the fields the grants use ([`super::watch::slim`]), so memory is bounded by
//!   what is read, not by what tenants put in their pods; a page bounds what one reply holds.
//! - The API server unreachable: the view is kept. Grants of running containers cannot change
//!   while they run; pods started since are not seen, so they get nothing (fail open: the API
//!   server's grants only ever bound a container). Past [`STALE`] it is said once per outage
//!   (and counted, `stale_total`); errors are counted and logged once per change.

use std::{path::Path, sync::Arc, time::Duration};

use log::info;
use tokio::sync::watch;

use super::auth;
pub use super::watch::{CLAIM_TIMEOUT, MAX_BACKOFF, PAGE, WatchStats};
use crate::grants::claims::KubeView;
use crate::quota::{GpuShareUnit, KubernetesSettings};

/// How long the API server may be unreachable before it is said (once): running containers keep
/// their grants; pods started since are not seen, and so get none.
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

/// The client configuration: the server, the CA of `<dir>/ca.crt`, the namespace of
/// `<dir>/namespace`; the token of `<dir>/token` must be readable, and is sent by
/// [`auth::TokenLayer`] (trimmed, re-read as it rotates), not by kube's `token_file`.
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
    if let Ok(ns) = std::fs::read_to_string(dir.join("namespace")) {
        c.default_namespace = ns.trim().to_string();
    }
    // No read timeout: a watch is idle between changes. The watcher ends a watch silent past
    // its server-side timeout (kube's idle timeout) and each claim GET has its own deadline.
    c.read_timeout = None;
    // No retries inside the client: kube's default retries a 503 or 429 up to 15 times over
    // minutes, which would hide an outage from the counters and the log and hold the watcher
    // task on one claim GET. The watcher retries with its own jittered backoff, each claim
    // with its own.
    c.default_retry = false;
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
    let token = auth::TokenLayer(Arc::new(auth::TokenFile::new(
        s.service_account_dir.join("token"),
    )));
    let client = ::kube::client::ClientBuilder::try_from(config)
        .map_err(|e| ConfigError(format!("API server client: {e}")))?
        .with_layer(&token)
        .build();
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

/// Starts the watcher task; `unit` is GPUShare's memory unit (for its annotations).
pub fn spawn_watcher(api: ApiClient, unit: GpuShareUnit) -> KubeWatch {
    spawn_watcher_with(api, unit, STALE)
}

/// [`spawn_watcher`] with a staleness bound other than [`STALE`] (tests).
pub fn spawn_watcher_with(api: ApiClient, unit: GpuShareUnit, stale: Duration) -> KubeWatch {
    let (tx, rx) = watch::channel(Arc::new(KubeView::default()));
    let stats = Arc::new(WatchStats::default());
    tokio::spawn(super::watch::run(
        api.client,
        api.node,
        unit,
        stale,
        tx,
        stats.clone(),
    ));
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
