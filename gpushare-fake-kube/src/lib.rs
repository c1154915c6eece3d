//! A fake Kubernetes API server over TLS, for the agent's `[kubernetes]` sources: a self-signed
//! CA (rcgen) written with a token and a namespace into a service-account directory the test
//! owns; it serves this node's pods (`GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`) and
//! ResourceClaims (`GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>`) as the
//! test sets them, as Kubernetes returns them (lists with `apiVersion`, `kind`, `metadata`), and
//! records the Events posted (`POST`) and patched (`PATCH`). A request without the token is
//! answered 401, as the API server does.
//!
//! Watch semantics (issue 43), as the API server's watch cache gives them: every change [`FakeApi::set`]
//! makes to a pod gets the next resourceVersion; the pod list pages (`limit`, `continue`) and
//! carries the current resourceVersion; `?watch=true` streams the pod changes after the
//! resourceVersion asked for (`0` or none: from now), with a `BOOKMARK` at the start and every
//! second when `allowWatchBookmarks=true`, ends after `timeoutSeconds`, and answers an `ERROR`
//! event with a 410 `Expired` Status when asked to resume before [`State::oldest_rv`] (compacted).
//! The test drops every open watch with [`FakeApi::drop_watches`], takes the server down
//! ([`State::down`]: 503 to everything), fails single claims, rotates the token, and counts
//! requests by kind ([`State::lists`], [`State::gets`], [`State::watches`]).
//!
//! A crate of its own (issue 40), a dev-dependency of the agent: its integration tests
//! (`tests/integration/kube.rs`, `kube_watch.rs`, `verify.rs`) and the fleet bench
//! (`benches/fleet.rs`) use it; the agent itself never does.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
};

use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{
    Request, Response,
    body::{Bytes, Frame},
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

pub const TOKEN: &str = "fake-service-account-token";
pub const NODE: &str = "gpu-node-1";

/// What the server holds and saw.
#[derive(Default)]
pub struct State {
    pub pods: Vec<Value>,
    pub claims: Vec<Value>,
    /// `METHOD path?query` of each request.
    pub requests: Vec<String>,
    /// Events by name, as last written.
    pub events: BTreeMap<String, Value>,
    /// (method, event name, count) of each Event write, in order.
    pub writes: Vec<(String, String, i64)>,
    pub unauthorized: usize,
    /// The token accepted (the one written to `<sa_dir>/token`, trimmed).
    pub token: String,
    /// The latest resourceVersion.
    pub rv: u64,
    /// Watches resuming before this resourceVersion are told 410 Gone.
    pub oldest_rv: u64,
    /// Pod changes: (resourceVersion, `ADDED`/`MODIFIED`/`DELETED`, the pod).
    pub history: Vec<(u64, &'static str, Value)>,
    /// Bumped to end every open watch.
    pub drops: u64,
    /// Every request answered 503 and every watch ended while set.
    pub down: bool,
    /// ResourceClaims (by name) whose GET is answered 500.
    pub failing_claims: Vec<String>,
    /// Pod lists (each page counts), claim GETs, watches opened.
    pub lists: usize,
    pub gets: usize,
    pub watches: usize,
    /// Bytes of every response body served, watch events included.
    pub bytes: u64,
}

/// A pod's identity across changes.
fn key_of(o: &Value) -> String {
    format!(
        "{}/{}",
        o["metadata"]["namespace"].as_str().unwrap_or(""),
        o["metadata"]["name"].as_str().unwrap_or("")
    )
}

impl State {
    /// Replaces the pods and claims, giving each changed object the next resourceVersion and
    /// recording the pod changes for the watches.
    pub fn replace(&mut self, mut pods: Vec<Value>, mut claims: Vec<Value>) {
        let same = |a: &Value, b: &Value| {
            let (mut a, mut b) = (a.clone(), b.clone());
            a["metadata"]["resourceVersion"] = Value::Null;
            b["metadata"]["resourceVersion"] = Value::Null;
            a == b
        };
        for p in &mut pods {
            let old = self.pods.iter().find(|o| key_of(o) == key_of(p));
            match old {
                Some(o) if same(o, p) => {
                    p["metadata"]["resourceVersion"] = o["metadata"]["resourceVersion"].clone()
                }
                _ => {
                    self.rv += 1;
                    p["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                    let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
                    self.history.push((self.rv, kind, p.clone()));
                }
            }
        }
        for o in &self.pods {
            if !pods.iter().any(|p| key_of(p) == key_of(o)) {
                self.rv += 1;
                let mut gone = o.clone();
                gone["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                self.history.push((self.rv, "DELETED", gone));
            }
        }
        for c in &mut claims {
            match self.claims.iter().find(|o| key_of(o) == key_of(c)) {
                Some(o) if same(o, c) => {
                    c["metadata"]["resourceVersion"] = o["metadata"]["resourceVersion"].clone()
                }
                _ => {
                    self.rv += 1;
                    c["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                }
            }
        }
        self.pods = pods;
        self.claims = claims;
    }
}

pub struct FakeApi {
    pub addr: SocketAddr,
    pub sa_dir: tempfile::TempDir,
    pub state: Arc<Mutex<State>>,
}

impl FakeApi {
    pub fn start() -> Self {
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "fake kubernetes CA");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        let sa_dir = tempfile::tempdir().unwrap();
        std::fs::write(sa_dir.path().join("ca.crt"), ca.pem()).unwrap();
        std::fs::write(sa_dir.path().join("token"), TOKEN).unwrap();
        std::fs::write(sa_dir.path().join("namespace"), "gpushare").unwrap();

        let config = tokio_rustls::rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                tokio_rustls::rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der())
                    .unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let state: Arc<Mutex<State>> = Arc::new(Mutex::new(State {
            token: TOKEN.into(),
            rv: 100,
            ..State::default()
        }));
        let st = state.clone();
        // The server runs on its own thread's runtime for as long as the test process lives.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    let acceptor = acceptor.clone();
                    let st = st.clone();
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let svc = service_fn(move |req| {
                            let st = st.clone();
                            async move {
                                let resp = handle(req, &st).await;
                                // A watch's stream says nothing here: its events count as sent.
                                let body = hyper::body::Body::size_hint(resp.body()).exact();
                                st.lock().unwrap().bytes += body.unwrap_or(0);
                                Ok::<_, std::convert::Infallible>(resp)
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), svc)
                            .await;
                    });
                }
            });
        });
        Self {
            addr,
            sa_dir,
            state,
        }
    }

    /// The `[kubernetes]` table that points the agent here.
    pub fn quota_table(&self, events: bool) -> String {
        format!(
            "[kubernetes]\napi = true\nevents = {events}\nnode_name = \"{NODE}\"\n\
             api_server = \"https://127.0.0.1:{}\"\nservice_account_dir = \"{}\"\n",
            self.addr.port(),
            self.sa_dir.path().display()
        )
    }

    pub fn set(&self, pods: Vec<Value>, claims: Vec<Value>) {
        check_schemas(&pods, &claims);
        self.state.lock().unwrap().replace(pods, claims);
    }

    /// Ends every open watch (as a dropped connection or an API server restart does).
    pub fn drop_watches(&self) {
        self.with(|s| s.drops += 1);
    }

    /// Writes `token` (as given: a trailing newline stays) to the token file and accepts only
    /// it, trimmed, from now on.
    pub fn rotate_token(&self, token: &str) {
        let tmp = self.sa_dir.path().join("token.new");
        std::fs::write(&tmp, token).unwrap();
        std::fs::rename(&tmp, self.sa_dir.path().join("token")).unwrap();
        self.with(|s| s.token = token.trim().to_string());
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }
}

type Body = BoxBody<Bytes, std::convert::Infallible>;

fn respond(code: u16, body: Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    respond(
        code,
        json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code }),
    )
}

/// The value of `key` in a query, percent-decoded (enough for selectors and tokens).
fn param(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .map(|v| {
            v.replace("%3D", "=")
                .replace("%3d", "=")
                .replace("%2C", ",")
                .replace("%2c", ",")
        })
}

/// A watch of this node's pods from resourceVersion `from` (see the module note).
fn watch(st: &Arc<Mutex<State>>, s: &mut State, query: &str) -> Response<Body> {
    s.watches += 1;
    let from = param(query, "resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| *v != 0)
        .unwrap_or(s.rv);
    if from < s.oldest_rv {
        let gone = json!({ "type": "ERROR", "object": { "kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
            "message": format!("too old resource version: {from} ({})", s.oldest_rv) } });
        return respond(200, gone);
    }
    let bookmarks = param(query, "allowWatchBookmarks").as_deref() == Some("true");
    let timeout = param(query, "timeoutSeconds")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(290);
    let (tx, rx) =
        tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(256);
    let (st, generation) = (st.clone(), s.drops);
    tokio::spawn(async move {
        let end = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout);
        let (mut at, mut last_mark) = (from, None::<tokio::time::Instant>);
        while tokio::time::Instant::now() < end {
            let lines = {
                let s = st.lock().unwrap();
                if s.drops != generation || s.down {
                    return;
                }
                let mut lines: Vec<Value> = s
                    .history
                    .iter()
                    .filter(|(rv, _, p)| *rv > at && p["spec"]["nodeName"] == NODE)
                    .map(|(_, t, p)| json!({ "type": t, "object": p }))
                    .collect();
                at = s.rv;
                if bookmarks && last_mark.is_none_or(|t| t.elapsed().as_secs() >= 1) {
                    last_mark = Some(tokio::time::Instant::now());
                    lines.push(json!({ "type": "BOOKMARK", "object": { "kind": "Pod",
                        "apiVersion": "v1", "metadata": { "resourceVersion": s.rv.to_string() } } }));
                }
                lines
            };
            for l in lines {
                let data = Bytes::from(format!("{l}\n"));
                st.lock().unwrap().bytes += data.len() as u64;
                let frame = Frame::data(data);
                if tx.send(Ok(frame)).await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(body))
        .unwrap()
}

/// A page of this node's pods (`limit`, `continue`: an offset), with the current resourceVersion.
fn list(s: &mut State, query: &str) -> Response<Body> {
    s.lists += 1;
    let items: Vec<Value> = s
        .pods
        .iter()
        .filter(|p| p["spec"]["nodeName"] == NODE)
        .cloned()
        .collect();
    let start: usize = param(query, "continue")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
        .min(items.len());
    let limit: usize = param(query, "limit")
        .and_then(|c| c.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let end = start.saturating_add(limit).min(items.len());
    let mut meta = json!({ "resourceVersion": s.rv.to_string() });
    if end < items.len() {
        meta["continue"] = json!(end.to_string());
    }
    respond(
        200,
        json!({ "kind": "PodList", "apiVersion": "v1", "metadata": meta,
                "items": items[start..end].to_vec() }),
    )
}

async fn handle(req: Request<hyper::body::Incoming>, st: &Arc<Mutex<State>>) -> Response<Body> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let bearer = req
        .headers()
        .get("authorization")
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut s = st.lock().unwrap();
    s.requests.push(format!("{method} {path}?{query}"));
    if s.down {
        return status(503, "ServiceUnavailable", "the fake is down");
    }
    if bearer != format!("Bearer {}", s.token).as_bytes() {
        s.unauthorized += 1;
        return status(401, "Unauthorized", "Unauthorized");
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["api", "v1", "pods"]) => {
            let want = format!("spec.nodeName={NODE}");
            let selector = param(&query, "fieldSelector").unwrap_or_default();
            if selector != want {
                return status(400, "BadRequest", &format!("want {want}, got `{selector}`"));
            }
            match param(&query, "watch").as_deref() {
                Some("true" | "1") => watch(st, &mut s, &query),
                _ => list(&mut s, &query),
            }
        }
        (
            "GET",
            [
                "apis",
                "resource.k8s.io",
                "v1",
                "namespaces",
                ns,
                "resourceclaims",
                name,
            ],
        ) => {
            s.gets += 1;
            if s.failing_claims.iter().any(|c| c == name) {
                return status(500, "InternalError", "the fake fails this claim");
            }
            match s
                .claims
                .iter()
                .find(|c| c["metadata"]["namespace"] == *ns && c["metadata"]["name"] == *name)
            {
                Some(c) => respond(200, c.clone()),
                None => status(
                    404,
                    "NotFound",
                    &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                ),
            }
        }
        ("POST", ["api", "v1", "namespaces", ns, "events"]) => {
            let mut e: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let name = e["metadata"]["name"].as_str().unwrap_or("").to_string();
            if e["metadata"]["namespace"] != *ns || name.is_empty() {
                return status(400, "BadRequest", "namespace or name");
            }
            if s.events.contains_key(&name) {
                return status(409, "AlreadyExists", "exists");
            }
            e["metadata"]["uid"] = json!(format!("event-{}", s.events.len()));
            let count = e["count"].as_i64().unwrap_or(0);
            s.writes.push(("POST".into(), name.clone(), count));
            s.events.insert(name, e.clone());
            respond(201, e)
        }
        ("PATCH", ["api", "v1", "namespaces", _ns, "events", name]) => {
            let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let name = name.to_string();
            let Some(e) = s.events.get_mut(&name) else {
                return status(404, "NotFound", "no such event");
            };
            for (k, v) in patch.as_object().into_iter().flatten() {
                e[k] = v.clone();
            }
            let e = e.clone();
            let count = e["count"].as_i64().unwrap_or(0);
            s.writes.push(("PATCH".into(), name, count));
            respond(200, e)
        }
        _ => status(404, "NotFound", &format!("{method} {path}")),
    }
}

/// Checks served objects against the Kubernetes schemas `deploy/validate.sh` installs
/// (kubernetes-validate, strict), when they are installed; says so when they are not.
fn check_schemas(pods: &[Value], claims: &[Value]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join("target/deploy-validate/bin/python");
    if !python.exists() {
        eprintln!(
            "SKIP schema check of the fake API server's objects: {} is missing (run deploy/validate.sh once)",
            python.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, o) in pods.iter().chain(claims).enumerate() {
        let f = dir.path().join(format!("{i}.json"));
        std::fs::write(&f, o.to_string()).unwrap();
        files.push(f);
    }
    let script = "import sys, json, kubernetes_validate as kv\n\
        bad = 0\n\
        for f in sys.argv[1:]:\n\
        \x20   o = json.load(open(f))\n\
        \x20   try:\n\
        \x20       kv.validate(o, kv.latest_version(), strict=True)\n\
        \x20   except Exception as e:\n\
        \x20       bad += 1; print(f, o.get('kind'), e)\n\
        sys.exit(bad)\n";
    let out = std::process::Command::new(&python)
        .arg("-c")
        .arg(script)
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "served objects fail the Kubernetes schemas:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running pod on [`NODE`]: `containers` are (name, container id, claim entries it uses);
/// `claims` are (entry, ResourceClaim name).
pub fn pod(
    ns: &str,
    name: &str,
    uid: &str,
    annotations: Value,
    containers: &[(&str, &str, &[&str])],
    claims: &[(&str, &str)],
) -> Value {
    let spec: Vec<Value> = containers
        .iter()
        .map(|(n, _, uses)| {
            let c: Vec<Value> = uses.iter().map(|u| json!({ "name": u })).collect();
            json!({ "name": n, "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "resources": { "claims": c } })
        })
        .collect();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(n, id, _)| {
            json!({ "name": n, "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "imageID": "nvcr.io/nvidia/cuda@sha256:0000", "ready": true,
                    "restartCount": 0, "started": true,
                    "containerID": format!("containerd://{id}"),
                    "state": { "running": { "startedAt": "2026-12-02T07:00:00Z" } } })
        })
        .collect();
    let pc: Vec<Value> = claims
        .iter()
        .map(|(e, _)| json!({ "name": e, "resourceClaimTemplateName": "gpu-memory" }))
        .collect();
    let cs: Vec<Value> = claims
        .iter()
        .map(|(e, c)| json!({ "name": e, "resourceClaimName": c }))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": ns, "uid": uid, "resourceVersion": "42",
                      "creationTimestamp": "2026-12-02T06:59:00Z", "annotations": annotations },
        "spec": { "nodeName": NODE, "containers": spec, "resourceClaims": pc },
        "status": { "phase": "Running", "podIP": "10.0.0.7",
                    "startTime": "2026-12-02T06:59:30Z",
                    "containerStatuses": statuses, "resourceClaimStatuses": cs }
    })
}

/// A ResourceClaim allocated by NVIDIA's DRA driver: `memory` consumed on `device` (`gpu-0`).
pub fn claim(ns: &str, name: &str, device: &str, memory: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": { "name": name, "namespace": ns, "uid": format!("claim-{name}"),
                      "resourceVersion": "7", "creationTimestamp": "2026-12-02T06:59:00Z" },
        "spec": { "devices": { "requests": [ { "name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "capacity": { "requests": { "memory": memory } } } } ] } },
        "status": { "allocation": { "devices": { "results": [ {
            "request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": device,
            "consumedCapacity": { "memory": memory } } ] } } }
    })
}
