//! A fake Kubernetes API server over TLS, for the agent's `[kubernetes]` sources: a self-signed
//! CA (rcgen) written with a token and a namespace into a service-account directory the test
//! owns; it serves this node's pods (`GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`) and
//! ResourceClaims (`GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>`) as the
//! test sets them, as Kubernetes returns them (lists with `apiVersion`, `kind`, `metadata`), and
//! records the Events posted (`POST`) and patched (`PATCH`). A request without the token is
//! answered 401, as the API server does.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
};

use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Bytes, service::service_fn};
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
        let state: Arc<Mutex<State>> = Arc::default();
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
                            async move { Ok::<_, std::convert::Infallible>(handle(req, &st).await) }
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
        let mut s = self.state.lock().unwrap();
        s.pods = pods;
        s.claims = claims;
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }
}

fn respond(code: u16, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Response<Full<Bytes>> {
    respond(
        code,
        json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code }),
    )
}

async fn handle(req: Request<hyper::body::Incoming>, st: &Mutex<State>) -> Response<Full<Bytes>> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let authorized = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == format!("Bearer {TOKEN}").as_bytes());
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut s = st.lock().unwrap();
    s.requests.push(format!("{method} {path}?{query}"));
    if !authorized {
        s.unauthorized += 1;
        return status(401, "Unauthorized", "Unauthorized");
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["api", "v1", "pods"]) => {
            let want = format!("spec.nodeName={NODE}");
            let selector = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("fieldSelector="))
                .map(|v| v.replace("%3D", "=").replace("%3d", "="))
                .unwrap_or_default();
            if selector != want {
                return status(400, "BadRequest", &format!("want {want}, got `{selector}`"));
            }
            let items: Vec<Value> = s
                .pods
                .iter()
                .filter(|p| p["spec"]["nodeName"] == NODE)
                .cloned()
                .collect();
            respond(
                200,
                json!({ "kind": "PodList", "apiVersion": "v1",
                        "metadata": { "resourceVersion": "100" }, "items": items }),
            )
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
