//! The kubelet's pod-resources API as a trusted quota source: which devices of which resource
//! each container on this node was given, and which DRA claims it holds.
//!
//! Design note: a background task (never the agent's step) asks the kubelet over its unix socket
//! (`List` every [`REFRESH`], and sooner when a pod the last answer does not cover shows up;
//! `Get` for that pod where the kubelet serves it) and publishes an immutable
//! [`PodResourcesView`] that the step reads without waiting. A kubelet without the socket, or
//! one answering `Unimplemented`, is said once per change of state in the log and shown in the
//! view's [`KubeletStatus`] (the `status` page's degraded lines), never retried in a loop faster
//! than [`REFRESH`].
//!
//! Joining replies to workloads: the kubelet names pods by namespace and name only. At each
//! answer, the pod UIDs are bound from the kubelet's log directories `<pod_logs_dir>/<ns>_<name>_
//! <uid>` listed **before** the call (a pod created after the kubelet answered is not covered by
//! that answer) and whose pod cgroup is still live after it. Two live UIDs for one name, or two
//! entries for one name in one answer, bind neither (counted as ambiguous): a pod recreated under
//! the same name never inherits its predecessor's grant. Containers are matched by name: the
//! runtime spec's annotations, else the kubelet's container log links (`containers/` beside
//! `pod_logs_dir`).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use log::{info, warn};
use tokio::sync::{Notify, watch};

use super::{
    devices::{ContainerGrant, container_grant},
    proto::{self, pod_resources_lister_client::PodResourcesListerClient},
};
use crate::{attribution::k8s_names, quota::KubeletSettings};

/// How often the kubelet is asked in full.
pub const REFRESH: Duration = Duration::from_secs(10);
/// Longest one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest gap between two asks triggered by new pods (coalesces a burst of new pods).
const MIN_GAP: Duration = Duration::from_millis(200);
/// Largest reply read (a node with hundreds of pods answers far less).
const MAX_REPLY_BYTES: usize = 16 << 20;

/// One DRA claim a container holds, as the kubelet names it (not resolved here).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraClaim {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// Per allocated device: driver, pool, device name and its CDI device names.
    pub devices: Vec<DraDevice>,
}

/// One device of a DRA claim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraDevice {
    /// The DRA driver.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
    /// Fully qualified CDI device names (`vendor.com/class=name`).
    pub cdi_devices: Vec<String>,
}

/// What the kubelet says one container was given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerAssignment {
    /// Its device-plugin grant.
    pub grant: ContainerGrant,
    /// Its DRA claims.
    pub dra: Vec<DraClaim>,
}

/// What the kubelet says one pod's containers were given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodAssignment {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Per container name.
    pub containers: BTreeMap<String, ContainerAssignment>,
}

/// The kubelet's pod-resources service, as last seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeletStatus {
    /// Not configured (`[kubernetes] pod_resources_socket` absent).
    Off,
    /// Not asked yet.
    NotYet,
    /// Answering.
    Answering,
    /// No socket at the configured path.
    NoSocket(String),
    /// It answered `Unimplemented` to `List`.
    Unimplemented(String),
    /// Another failure (connect, timeout, status).
    Failed(String),
}

impl KubeletStatus {
    /// A label: `off`, `not_yet`, `ok`, `no_socket`, `unimplemented`, `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::NotYet => "not_yet",
            Self::Answering => "ok",
            Self::NoSocket(_) => "no_socket",
            Self::Unimplemented(_) => "unimplemented",
            Self::Failed(_) => "failed",
        }
    }

    /// In words for `status`'s degraded lines; `None` when there is nothing to say.
    pub fn degraded(&self) -> Option<String> {
        match self {
            Self::NoSocket(s) | Self::Unimplemented(s) | Self::Failed(s) => {
                Some(format!("kubelet pod-resources: {s}"))
            }
            _ => None,
        }
    }
}

/// The last answer, bound to pod UIDs: what the step reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodResourcesView {
    /// The service's state.
    pub status: KubeletStatus,
    /// Assignments by pod UID (dashed, lowercase).
    pub by_uid: HashMap<String, Arc<PodAssignment>>,
    /// `namespace/name` of pods bound to no UID because two live UIDs (or two entries) claim
    /// the name.
    pub ambiguous: BTreeSet<String>,
    /// Whether the kubelet answered `Unimplemented` to `Get` (then only `List` is used).
    pub get_unimplemented: bool,
    /// Device ids of no known shape in the last answer, in words.
    pub problems: Vec<String>,
    /// Answers received and calls failed so far.
    pub answers: u64,
    /// Calls that failed so far.
    pub failures: u64,
    /// Where the kubelet's container log links are (`containers/` beside `pod_logs_dir`).
    pub container_logs_dir: PathBuf,
}

impl PodResourcesView {
    /// A view with nothing in it yet.
    pub fn empty(status: KubeletStatus, settings: &KubeletSettings) -> Self {
        Self {
            status,
            by_uid: HashMap::new(),
            ambiguous: BTreeSet::new(),
            get_unimplemented: false,
            problems: Vec::new(),
            answers: 0,
            failures: 0,
            container_logs_dir: container_logs_dir(&settings.pod_logs_dir),
        }
    }

    /// The pod with UID `uid`, when the last answer covers it.
    pub fn pod(&self, uid: &str) -> Option<&Arc<PodAssignment>> {
        self.by_uid.get(&uid.to_ascii_lowercase())
    }

    /// The name of container `container_id` of `pod`, from the kubelet's log links (when the
    /// runtime spec does not say).
    pub fn container_name_from_links(
        &self,
        pod: &PodAssignment,
        container_id: &str,
    ) -> Option<String> {
        k8s_names::container_names_from_log_links(&self.container_logs_dir, container_id)
            .filter(|c| c.namespace == pod.namespace && c.pod == pod.name)
            .map(|c| c.container)
    }
}

/// `containers/` beside the pod log directory (`/var/log/containers` for `/var/log/pods`).
pub fn container_logs_dir(pod_logs_dir: &Path) -> PathBuf {
    pod_logs_dir.parent().map_or_else(
        || PathBuf::from(k8s_names::CONTAINER_LOG_ROOT),
        |p| p.join("containers"),
    )
}

/// One pod of a reply, read (device ids parsed, problems collected).
pub fn pod_from_proto(p: &proto::PodResources, problems: &mut Vec<String>) -> PodAssignment {
    let mut containers = BTreeMap::new();
    for c in &p.containers {
        let grant = container_grant(c.devices.iter().map(|d| {
            (
                d.resource_name.as_str(),
                d.device_ids.iter().map(String::as_str),
            )
        }));
        problems.extend(
            grant
                .problems
                .iter()
                .map(|e| format!("{}/{} container {}: {e}", p.namespace, p.name, c.name)),
        );
        let dra = c
            .dynamic_resources
            .iter()
            .map(|r| DraClaim {
                namespace: r.claim_namespace.clone(),
                name: r.claim_name.clone(),
                devices: r
                    .claim_resources
                    .iter()
                    .map(|cr| DraDevice {
                        driver: cr.driver_name.clone(),
                        pool: cr.pool_name.clone(),
                        device: cr.device_name.clone(),
                        cdi_devices: cr.cdi_devices.iter().map(|d| d.name.clone()).collect(),
                    })
                    .collect(),
            })
            .collect();
        containers.insert(c.name.clone(), ContainerAssignment { grant, dra });
    }
    PodAssignment {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        containers,
    }
}

/// The pods' log directories: `(namespace, name) -> UIDs`.
pub fn pod_log_dirs(root: &Path) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        if let Some((ns, pod, uid)) = e
            .file_name()
            .to_str()
            .and_then(k8s_names::parse_pod_log_dir_name)
        {
            out.entry((ns, pod))
                .or_default()
                .insert(uid.to_ascii_lowercase());
        }
    }
    out
}

/// Whether the pod with UID `uid` has a live pod cgroup under the cgroup v2 root `v2_root`
/// (the kubelet's cgroupfs and systemd layouts, every QoS class).
pub fn pod_cgroup_live(v2_root: &Path, uid: &str) -> bool {
    let under = uid.replace('-', "_");
    let mut candidates = vec![
        format!("kubepods/pod{uid}"),
        format!("kubepods.slice/kubepods-pod{under}.slice"),
    ];
    for qos in ["burstable", "besteffort"] {
        candidates.push(format!("kubepods/{qos}/pod{uid}"));
        candidates.push(format!(
            "kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{under}.slice"
        ));
    }
    candidates.iter().any(|c| v2_root.join(c).is_dir())
}

/// Binds the pods of one answer to UIDs (see the module note): `before` are the log directories
/// listed before the call, `live` says whether a UID's pod cgroup is live now. Returns the
/// bound pods and the names left ambiguous.
pub fn bind(
    pods: Vec<PodAssignment>,
    before: &BTreeMap<(String, String), BTreeSet<String>>,
    live: impl Fn(&str) -> bool,
) -> (HashMap<String, Arc<PodAssignment>>, BTreeSet<String>) {
    let mut by_name: BTreeMap<(String, String), Vec<PodAssignment>> = BTreeMap::new();
    for p in pods {
        by_name
            .entry((p.namespace.clone(), p.name.clone()))
            .or_default()
            .push(p);
    }
    let mut bound = HashMap::new();
    let mut ambiguous = BTreeSet::new();
    for (key, mut entries) in by_name {
        let uids: Vec<&String> = before
            .get(&key)
            .into_iter()
            .flatten()
            .filter(|u| live(u))
            .collect();
        match (entries.len(), uids.as_slice()) {
            (1, [uid]) => {
                bound.insert((*uid).clone(), Arc::new(entries.remove(0)));
            }
            (_, []) => {}
            _ => {
                ambiguous.insert(format!("{}/{}", key.0, key.1));
            }
        }
    }
    (bound, ambiguous)
}

/// Why a call failed.
#[derive(Debug)]
enum CallError {
    NoSocket(String),
    Unimplemented(String),
    Failed(String),
}

impl CallError {
    fn status(self) -> KubeletStatus {
        match self {
            Self::NoSocket(s) => KubeletStatus::NoSocket(s),
            Self::Unimplemented(s) => KubeletStatus::Unimplemented(s),
            Self::Failed(s) => KubeletStatus::Failed(s),
        }
    }
}

async fn client(
    socket: &Path,
) -> Result<PodResourcesListerClient<tonic::transport::Channel>, CallError> {
    if !socket.exists() {
        return Err(CallError::NoSocket(format!(
            "no socket at {} (is the kubelet's pod-resources directory mounted?)",
            socket.display()
        )));
    }
    let path = socket.to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .map_err(|e| CallError::Failed(format!("cannot connect to {}: {e}", socket.display())))?;
    Ok(PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_REPLY_BYTES))
}

fn status_error(what: &str, socket: &Path, s: &tonic::Status) -> CallError {
    let said = format!(
        "{what} at {}: {:?}: {}",
        socket.display(),
        s.code(),
        s.message()
    );
    if s.code() == tonic::Code::Unimplemented {
        CallError::Unimplemented(said)
    } else {
        CallError::Failed(said)
    }
}

async fn list(socket: &Path) -> Result<Vec<proto::PodResources>, CallError> {
    let mut c = client(socket).await?;
    c.list(proto::ListPodResourcesRequest {})
        .await
        .map(|r| r.into_inner().pod_resources)
        .map_err(|s| status_error("List", socket, &s))
}

async fn get(
    socket: &Path,
    ns: &str,
    name: &str,
) -> Result<Option<proto::PodResources>, CallError> {
    let mut c = client(socket).await?;
    c.get(proto::GetPodResourcesRequest {
        pod_name: name.to_string(),
        pod_namespace: ns.to_string(),
    })
    .await
    .map(|r| r.into_inner().pod_resources)
    .map_err(|s| status_error("Get", socket, &s))
}

/// The background reader: started when `[kubernetes] pod_resources_socket` is set, stopped
/// (its task aborted) when dropped.
pub struct PodResourcesSource {
    settings: KubeletSettings,
    rx: watch::Receiver<Arc<PodResourcesView>>,
    wake: Arc<Notify>,
    wanted: Arc<Mutex<Vec<String>>>,
    /// Pods (container id empty) and containers of covered pods looked at already.
    asked: BTreeSet<(String, String)>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl PodResourcesSource {
    /// Starts reading the kubelet per `settings` (pod cgroups looked for under `v2_root`); with
    /// no socket configured, or outside a tokio runtime, nothing runs and the view says why.
    pub fn start(settings: &KubeletSettings, v2_root: PathBuf) -> Self {
        let initial = match (
            &settings.pod_resources_socket,
            tokio::runtime::Handle::try_current(),
        ) {
            (None, _) => KubeletStatus::Off,
            (Some(_), Err(_)) => KubeletStatus::Failed("no async runtime to read it from".into()),
            (Some(_), Ok(_)) => KubeletStatus::NotYet,
        };
        let (tx, rx) = watch::channel(Arc::new(PodResourcesView::empty(initial.clone(), settings)));
        let wake = Arc::new(Notify::new());
        let wanted = Arc::new(Mutex::new(Vec::new()));
        let task = (initial == KubeletStatus::NotYet).then(|| {
            tokio::spawn(run(
                settings.clone(),
                v2_root,
                tx,
                wake.clone(),
                wanted.clone(),
            ))
        });
        Self {
            settings: settings.clone(),
            rx,
            wake,
            wanted,
            asked: BTreeSet::new(),
            task,
        }
    }

    /// The settings it was started with.
    pub fn settings(&self) -> &KubeletSettings {
        &self.settings
    }

    /// The last published view (never waits).
    pub fn view(&self) -> Arc<PodResourcesView> {
        self.rx.borrow().clone()
    }

    /// Asks for pod `uid` soon when the last answer does not cover it (once per pod), or when
    /// it covers the pod but not its container `container_id` (one started or recreated since:
    /// once per container, its name read from the kubelet's log links).
    pub fn want(&mut self, uid: &str, container_id: Option<&str>) {
        if self.task.is_none() {
            return;
        }
        let view = self.rx.borrow().clone();
        let ask = match (view.by_uid.get(uid), container_id) {
            (None, _) => self.asked.insert((uid.to_string(), String::new())),
            (Some(_), None) => false,
            (Some(pod), Some(cid)) => {
                self.asked.insert((uid.to_string(), cid.to_string()))
                    && view
                        .container_name_from_links(pod, cid)
                        .is_some_and(|name| !pod.containers.contains_key(&name))
            }
        };
        if ask {
            if let Ok(mut w) = self.wanted.lock() {
                w.push(uid.to_string());
            }
            self.wake.notify_one();
        }
    }

    /// Forgets pods no longer running (so a pod seen again is asked for again).
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.asked.retain(|(u, _)| live(u));
    }
}

impl Drop for PodResourcesSource {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Logs a change of the service's state, once per change of kind.
fn say(last: &mut &'static str, status: &KubeletStatus, socket: &Path) {
    if *last == status.as_str() {
        return;
    }
    *last = status.as_str();
    match status {
        KubeletStatus::Answering => info!(
            "kubelet pod-resources at {}: answering; its grants are quota sources",
            socket.display()
        ),
        other => {
            if let Some(s) = other.degraded() {
                warn!(
                    "{s}; its grants are not read until it answers (asked every {}s)",
                    REFRESH.as_secs()
                );
            }
        }
    }
}

async fn run(
    settings: KubeletSettings,
    v2_root: PathBuf,
    tx: watch::Sender<Arc<PodResourcesView>>,
    wake: Arc<Notify>,
    wanted: Arc<Mutex<Vec<String>>>,
) {
    let Some(socket) = settings.pod_resources_socket.clone() else {
        return;
    };
    let mut view = PodResourcesView::empty(KubeletStatus::NotYet, &settings);
    let mut said = "not_yet";
    let mut full_due = true;
    loop {
        let asked: Vec<String> = wanted
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default();
        if !full_due && !view.get_unimplemented && view.status == KubeletStatus::Answering {
            // New pods: `Get` each (the kubelet's `KubeletPodResourcesGet`), else a full `List`.
            let dirs = pod_log_dirs(&settings.pod_logs_dir);
            for uid in &asked {
                let Some((ns, name)) = dirs
                    .iter()
                    .find(|(_, uids)| uids.contains(uid))
                    .map(|(k, _)| k.clone())
                else {
                    continue;
                };
                match get(&socket, &ns, &name).await {
                    Ok(Some(p)) => {
                        let mut problems = Vec::new();
                        let pod = pod_from_proto(&p, &mut problems);
                        view.by_uid
                            .retain(|_, a| !(a.namespace == ns && a.name == name));
                        let (bound, ambiguous) =
                            bind(vec![pod], &dirs, |u| pod_cgroup_live(&v2_root, u));
                        view.by_uid.extend(bound);
                        view.ambiguous.extend(ambiguous);
                        view.problems.extend(problems);
                        view.answers += 1;
                    }
                    Ok(None) => {}
                    Err(CallError::Unimplemented(s)) => {
                        info!(
                            "kubelet pod-resources: Get is not served ({s}); new pods are read with List"
                        );
                        view.get_unimplemented = true;
                        full_due = true;
                        break;
                    }
                    Err(e) => {
                        view.failures += 1;
                        let st = e.status();
                        say(&mut said, &st, &socket);
                        view.status = st;
                        full_due = true;
                        break;
                    }
                }
            }
        } else if !asked.is_empty() {
            full_due = true;
        }
        if full_due {
            let before = pod_log_dirs(&settings.pod_logs_dir);
            match list(&socket).await {
                Ok(pods) => {
                    let mut problems = Vec::new();
                    let pods = pods
                        .iter()
                        .map(|p| pod_from_proto(p, &mut problems))
                        .collect();
                    let (bound, ambiguous) = bind(pods, &before, |u| pod_cgroup_live(&v2_root, u));
                    for a in &ambiguous {
                        if !view.ambiguous.contains(a) {
                            warn!(
                                "kubelet pod-resources: pod {a} has two live pod UIDs (recreated under the same name?): neither gets its grant until one is gone"
                            );
                        }
                    }
                    view.by_uid = bound;
                    view.ambiguous = ambiguous;
                    view.problems = problems;
                    view.status = KubeletStatus::Answering;
                    view.answers += 1;
                }
                Err(e) => {
                    view.failures += 1;
                    view.status = e.status();
                    view.by_uid.clear();
                }
            }
            say(&mut said, &view.status, &socket);
        }
        if tx.send(Arc::new(view.clone())).is_err() {
            return;
        }
        let tick = tokio::time::sleep(REFRESH);
        tokio::select! {
            () = tick => full_due = true,
            () = wake.notified() => {
                full_due = false;
                tokio::time::sleep(MIN_GAP).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str) -> PodAssignment {
        PodAssignment {
            namespace: ns.into(),
            name: name.into(),
            containers: BTreeMap::new(),
        }
    }

    fn dirs(list: &[(&str, &str, &str)]) -> BTreeMap<(String, String), BTreeSet<String>> {
        let mut m: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for (ns, n, u) in list {
            m.entry((ns.to_string(), n.to_string()))
                .or_default()
                .insert(u.to_string());
        }
        m
    }

    #[test]
    fn a_pod_binds_to_its_one_live_uid_and_never_to_a_predecessor() {
        let before = dirs(&[
            ("ns", "a", "u-old"),
            ("ns", "a", "u-new"),
            ("ns", "b", "u-b"),
        ]);
        // The old pod's logs are kept, its cgroup gone: the new UID gets the grant.
        let (bound, amb) = bind(vec![pod("ns", "a")], &before, |u| u != "u-old");
        assert_eq!(bound.keys().collect::<Vec<_>>(), vec!["u-new"]);
        assert!(amb.is_empty());
        // Both live (the old one still terminating): neither.
        let (bound, amb) = bind(vec![pod("ns", "a")], &before, |_| true);
        assert!(bound.is_empty());
        assert_eq!(amb.into_iter().collect::<Vec<_>>(), vec!["ns/a"]);
        // Two entries for one name in one answer: neither.
        let (bound, amb) = bind(vec![pod("ns", "b"), pod("ns", "b")], &before, |_| true);
        assert!(bound.is_empty() && amb.len() == 1);
        // A pod whose log directory appeared after the call started: not covered.
        let (bound, amb) = bind(vec![pod("ns", "c")], &before, |_| true);
        assert!(bound.is_empty() && amb.is_empty());
        // No live UID at all: nothing, not ambiguous.
        let (bound, amb) = bind(vec![pod("ns", "a")], &before, |_| false);
        assert!(bound.is_empty() && amb.is_empty());
    }

    #[test]
    fn log_dirs_and_pod_cgroups_are_read_from_the_given_roots() {
        let d = tempfile::tempdir().unwrap();
        let uid = "0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a";
        std::fs::create_dir_all(d.path().join(format!("pods/ns_web-0_{uid}/main"))).unwrap();
        std::fs::create_dir_all(d.path().join("pods/not-a-pod")).unwrap();
        let m = pod_log_dirs(&d.path().join("pods"));
        assert_eq!(m, dirs(&[("ns", "web-0", uid)]));
        let v2 = d.path().join("cg");
        assert!(!pod_cgroup_live(&v2, uid));
        std::fs::create_dir_all(v2.join(format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        )))
        .unwrap();
        assert!(pod_cgroup_live(&v2, uid));
        assert_eq!(
            container_logs_dir(Path::new("/var/log/pods")),
            PathBuf::from("/var/log/containers")
        );
    }

    #[test]
    fn a_reply_is_read_with_its_dra_claims() {
        let p = proto::PodResources {
            name: "web-0".into(),
            namespace: "ns".into(),
            containers: vec![proto::ContainerResources {
                name: "main".into(),
                devices: vec![proto::ContainerDevices {
                    resource_name: "aliyun.com/gpu-mem".into(),
                    device_ids: vec!["GPU-a-_-0".into(), "GPU-a-_-1".into(), "bad".into()],
                    topology: None,
                }],
                dynamic_resources: vec![proto::DynamicResource {
                    claim_name: "gpu-claim".into(),
                    claim_namespace: "ns".into(),
                    claim_resources: vec![proto::ClaimResource {
                        cdi_devices: vec![proto::CdiDevice {
                            name: "k8s.gpu.nvidia.com/device=gpu-0".into(),
                        }],
                        driver_name: "gpu.nvidia.com".into(),
                        pool_name: "node-a".into(),
                        device_name: "gpu-0".into(),
                        share_id: None,
                    }],
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut problems = Vec::new();
        let a = pod_from_proto(&p, &mut problems);
        let c = &a.containers["main"];
        assert_eq!(c.grant.gpushare_units, Some(2));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(c.dra[0].name, "gpu-claim");
        assert_eq!(
            c.dra[0].devices[0].cdi_devices,
            vec!["k8s.gpu.nvidia.com/device=gpu-0".to_string()]
        );
    }

    /// A fake kubelet: `List` answers `pods`, `Get` the one of them asked for (or
    /// `Unimplemented`); calls counted.
    #[derive(Clone, Default)]
    struct Fake {
        pods: Arc<Mutex<Vec<proto::PodResources>>>,
        get_unimplemented: bool,
        get_fails: Arc<Mutex<bool>>,
        lists: Arc<std::sync::atomic::AtomicU64>,
        gets: Arc<std::sync::atomic::AtomicU64>,
    }

    #[tonic::async_trait]
    impl proto::pod_resources_lister_server::PodResourcesLister for Fake {
        async fn list(
            &self,
            _: tonic::Request<proto::ListPodResourcesRequest>,
        ) -> Result<tonic::Response<proto::ListPodResourcesResponse>, tonic::Status> {
            self.lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(tonic::Response::new(proto::ListPodResourcesResponse {
                pod_resources: self.pods.lock().unwrap().clone(),
            }))
        }

        async fn get_allocatable_resources(
            &self,
            _: tonic::Request<proto::AllocatableResourcesRequest>,
        ) -> Result<tonic::Response<proto::AllocatableResourcesResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("not served"))
        }

        async fn get(
            &self,
            r: tonic::Request<proto::GetPodResourcesRequest>,
        ) -> Result<tonic::Response<proto::GetPodResourcesResponse>, tonic::Status> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.get_unimplemented {
                return Err(tonic::Status::unimplemented("Get disabled"));
            }
            if *self.get_fails.lock().unwrap() {
                return Err(tonic::Status::internal("the fake fails"));
            }
            let r = r.into_inner();
            let p = self
                .pods
                .lock()
                .unwrap()
                .iter()
                .find(|p| p.namespace == r.pod_namespace && p.name == r.pod_name)
                .cloned();
            Ok(tonic::Response::new(proto::GetPodResourcesResponse {
                pod_resources: p,
            }))
        }
    }

    impl Fake {
        fn lists(&self) -> u64 {
            self.lists.load(std::sync::atomic::Ordering::SeqCst)
        }

        fn gets(&self) -> u64 {
            self.gets.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    /// Serves `fake` on `<dir>/kubelet.sock` from this test's runtime.
    fn serve(dir: &Path, fake: &Fake) -> PathBuf {
        let socket = dir.join("kubelet.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let f = fake.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(proto::pod_resources_lister_server::PodResourcesListerServer::new(f))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await
                .unwrap();
        });
        socket
    }

    /// A pod with container `main` holding `units` GPUShare ids.
    fn listed(ns: &str, name: &str, units: usize) -> proto::PodResources {
        proto::PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: vec![proto::ContainerResources {
                name: "main".into(),
                devices: vec![proto::ContainerDevices {
                    resource_name: "aliyun.com/gpu-mem".into(),
                    device_ids: (0..units).map(|i| format!("GPU-a-_-{i}")).collect(),
                    topology: None,
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A running pod: its log directory and its pod cgroup.
    fn running(root: &Path, ns: &str, name: &str, uid: &str) {
        std::fs::create_dir_all(root.join(format!("pods/{ns}_{name}_{uid}"))).unwrap();
        std::fs::create_dir_all(root.join(format!("cg/kubepods/pod{uid}"))).unwrap();
    }

    /// Waits (yielding to the reader) until `done` holds of its view.
    async fn until(src: &PodResourcesSource, what: &str, done: impl Fn(&PodResourcesView) -> bool) {
        for _ in 0..2000 {
            if done(&src.view()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the reader never got to: {what}: {:?}", src.view());
    }

    const U1: &str = "11111111-1111-4111-8111-111111111111";
    const U2: &str = "22222222-2222-4222-8222-222222222222";
    const U3: &str = "33333333-3333-4333-8333-333333333333";

    fn settings(d: &Path, socket: PathBuf) -> KubeletSettings {
        KubeletSettings {
            pod_resources_socket: Some(socket),
            pod_logs_dir: d.join("pods"),
        }
    }

    /// The reader lists the kubelet's pods and binds them to their UIDs; a pod the answer does
    /// not cover is asked for with `Get` (once), not with another full `List`.
    #[tokio::test]
    async fn the_reader_lists_then_gets_a_new_pod_once() {
        let d = tempfile::tempdir().unwrap();
        let fake = Fake::default();
        fake.pods.lock().unwrap().push(listed("ns", "web-0", 2));
        running(d.path(), "ns", "web-0", U1);
        let socket = serve(d.path(), &fake);
        let mut src = PodResourcesSource::start(&settings(d.path(), socket), d.path().join("cg"));
        until(&src, "the first answer", |v| {
            v.status == KubeletStatus::Answering
        })
        .await;
        let v = src.view();
        assert_eq!(
            v.pod(U1).unwrap().containers["main"].grant.gpushare_units,
            Some(2)
        );
        assert_eq!(
            (v.answers, v.failures, fake.lists(), fake.gets()),
            (1, 0, 1, 0)
        );
        src.want(U1, None);
        // A new pod: asked for by `Get`.
        fake.pods.lock().unwrap().push(listed("ns", "new-0", 3));
        running(d.path(), "ns", "new-0", U2);
        src.want(U2, None);
        until(&src, "the new pod", |v| v.pod(U2).is_some()).await;
        assert_eq!(src.view().pod(U2).unwrap().name, "new-0");
        assert_eq!(src.view().answers, 2);
        assert_eq!((fake.lists(), fake.gets()), (1, 1));
        assert!(src.view().pod(U1).is_some(), "the others are kept");
        // A pod the view covers is not asked for.
        src.want(U2, None);
        fake.pods.lock().unwrap().push(listed("ns", "third-0", 1));
        running(d.path(), "ns", "third-0", U3);
        src.want(U3, None);
        until(&src, "the third pod", |v| v.pod(U3).is_some()).await;
        assert_eq!((fake.lists(), fake.gets()), (1, 2));
        assert_eq!(src.settings().pod_logs_dir, d.path().join("pods"));
    }

    /// A container new in a pod the view covers (a sidecar started later, a container
    /// recreated): its grant is asked for with one `Get`, not left to the next full `List`; a
    /// container the answer covers, or one asked for already, is not asked for again.
    #[tokio::test]
    async fn a_new_container_in_a_known_pod_is_asked_for_once() {
        let d = tempfile::tempdir().unwrap();
        let fake = Fake::default();
        fake.pods.lock().unwrap().push(listed("ns", "web-0", 2));
        running(d.path(), "ns", "web-0", U1);
        let link = |name: &str, id: &str| {
            std::fs::create_dir_all(d.path().join("containers")).unwrap();
            std::fs::write(
                d.path()
                    .join(format!("containers/web-0_ns_{name}-{id}.log")),
                "",
            )
            .unwrap();
        };
        let main_id = "a".repeat(64);
        let side_id = "b".repeat(64);
        link("main", &main_id);
        let socket = serve(d.path(), &fake);
        let mut src = PodResourcesSource::start(&settings(d.path(), socket), d.path().join("cg"));
        until(&src, "the first answer", |v| {
            v.status == KubeletStatus::Answering
        })
        .await;
        // `main` is covered: nothing asked.
        src.want(U1, Some(&main_id));
        tokio::time::sleep(MIN_GAP * 3).await;
        assert_eq!((fake.lists(), fake.gets()), (1, 0));
        // A sidecar starts in the same pod.
        {
            let mut pods = fake.pods.lock().unwrap();
            let mut side = listed("ns", "web-0", 1).containers.remove(0);
            side.name = "side".into();
            pods[0].containers.push(side);
        }
        link("side", &side_id);
        src.want(U1, Some(&side_id));
        until(&src, "the sidecar's grant", |v| {
            v.pod(U1).is_some_and(|p| p.containers.contains_key("side"))
        })
        .await;
        assert_eq!((fake.lists(), fake.gets()), (1, 1));
        src.want(U1, Some(&side_id));
        src.want(U1, Some(&main_id));
        tokio::time::sleep(MIN_GAP * 3).await;
        assert_eq!((fake.lists(), fake.gets()), (1, 1), "asked once");
    }

    /// A kubelet that answers `Unimplemented` to `Get`: a new pod is read with `List`, and `Get`
    /// is not asked again.
    #[tokio::test]
    async fn without_get_a_new_pod_is_read_with_list() {
        let d = tempfile::tempdir().unwrap();
        let fake = Fake {
            get_unimplemented: true,
            ..Fake::default()
        };
        let socket = serve(d.path(), &fake);
        let mut src = PodResourcesSource::start(&settings(d.path(), socket), d.path().join("cg"));
        until(&src, "the first answer", |v| {
            v.status == KubeletStatus::Answering
        })
        .await;
        fake.pods.lock().unwrap().push(listed("ns", "new-0", 3));
        running(d.path(), "ns", "new-0", U2);
        src.want(U2, None);
        until(&src, "the new pod", |v| v.pod(U2).is_some()).await;
        assert!(src.view().get_unimplemented);
        assert_eq!((fake.lists(), fake.gets()), (2, 1));
        fake.pods.lock().unwrap().push(listed("ns", "third-0", 1));
        running(d.path(), "ns", "third-0", U3);
        src.want(U3, None);
        until(&src, "the third pod", |v| v.pod(U3).is_some()).await;
        assert_eq!((fake.lists(), fake.gets()), (3, 1));
    }

    #[tokio::test]
    async fn no_socket_or_no_runtime_is_said() {
        let d = tempfile::tempdir().unwrap();
        let src = PodResourcesSource::start(
            &settings(d.path(), d.path().join("none.sock")),
            d.path().join("cg"),
        );
        until(&src, "no socket", |v| {
            matches!(v.status, KubeletStatus::NoSocket(_))
        })
        .await;
        let said = src.view().status.degraded().unwrap();
        assert!(
            said.contains("none.sock") && said.starts_with("kubelet pod-resources: "),
            "{said}"
        );
        assert_eq!(src.view().failures, 1);
        let off = PodResourcesSource::start(&KubeletSettings::default(), d.path().into());
        assert_eq!(off.view().status, KubeletStatus::Off);
        assert_eq!(off.view().status.degraded(), None);
    }

    #[test]
    fn each_state_has_its_label_and_the_degraded_ones_say_why() {
        let states = [
            (KubeletStatus::Off, "off", None),
            (KubeletStatus::NotYet, "not_yet", None),
            (KubeletStatus::Answering, "ok", None),
            (
                KubeletStatus::NoSocket("s1".into()),
                "no_socket",
                Some("s1"),
            ),
            (
                KubeletStatus::Unimplemented("s2".into()),
                "unimplemented",
                Some("s2"),
            ),
            (KubeletStatus::Failed("s3".into()), "failed", Some("s3")),
        ];
        for (s, label, why) in states {
            assert_eq!(s.as_str(), label);
            assert_eq!(
                s.degraded(),
                why.map(|w| format!("kubelet pod-resources: {w}")),
                "{s:?}"
            );
        }
    }

    #[test]
    fn a_containers_name_comes_from_a_log_link_of_its_own_pod() {
        let d = tempfile::tempdir().unwrap();
        let id = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";
        std::fs::create_dir_all(d.path().join("containers")).unwrap();
        std::fs::write(
            d.path().join(format!("containers/web-0_ns_main-{id}.log")),
            "",
        )
        .unwrap();
        let v = PodResourcesView::empty(
            KubeletStatus::Answering,
            &KubeletSettings {
                pod_logs_dir: d.path().join("pods"),
                ..KubeletSettings::default()
            },
        );
        assert_eq!(
            v.container_name_from_links(&pod("ns", "web-0"), id),
            Some("main".into())
        );
        assert_eq!(v.container_name_from_links(&pod("ns", "web-1"), id), None);
        assert_eq!(
            v.container_name_from_links(&pod("other", "web-0"), id),
            None
        );
        assert_eq!(
            v.container_name_from_links(&pod("other", "web-1"), id),
            None
        );
    }

    /// A pod recreated under its name with a new UID, read by `Get`: its old UID's grant goes;
    /// a failing `Get` is counted and the full `List` read instead; a pod forgotten
    /// (`retain`) is asked for again; a dropped reader's task stops.
    #[tokio::test]
    async fn a_recreated_pod_a_failing_get_and_a_forgotten_pod() {
        let d = tempfile::tempdir().unwrap();
        let fake = Fake::default();
        fake.pods.lock().unwrap().push(listed("ns", "web-0", 2));
        running(d.path(), "ns", "web-0", U1);
        let socket = serve(d.path(), &fake);
        let mut src = PodResourcesSource::start(&settings(d.path(), socket), d.path().join("cg"));
        until(&src, "the first answer", |v| v.pod(U1).is_some()).await;
        assert!(
            src.view().pod(&U1.to_ascii_uppercase()).is_some(),
            "UIDs in any case"
        );
        // Recreated: the old pod's cgroup is gone, its logs kept.
        std::fs::remove_dir(d.path().join(format!("cg/kubepods/pod{U1}"))).unwrap();
        running(d.path(), "ns", "web-0", U2);
        src.want(U2, None);
        until(&src, "the new UID", |v| v.pod(U2).is_some()).await;
        assert!(src.view().pod(U1).is_none(), "{:?}", src.view());
        assert_eq!((fake.lists(), fake.gets()), (1, 1));
        // A pod `Get` does not find: asked once, and again once forgotten.
        running(d.path(), "ns", "gone-0", U3);
        src.want(U3, None);
        until(&src, "the Get", |_| fake.gets() == 2).await;
        src.want(U3, None);
        src.retain(|u| u != U3);
        src.want(U3, None);
        until(&src, "the Get again", |_| fake.gets() == 3).await;
        // A failing `Get`: counted, then the full `List`.
        *fake.get_fails.lock().unwrap() = true;
        let u4 = "44444444-4444-4444-8444-444444444444";
        fake.pods.lock().unwrap().push(listed("ns", "four-0", 1));
        running(d.path(), "ns", "four-0", u4);
        src.want(u4, None);
        until(&src, "the List after the failure", |v| v.pod(u4).is_some()).await;
        let v = src.view();
        assert_eq!(
            (v.failures, v.status.clone()),
            (1, KubeletStatus::Answering)
        );
        assert_eq!((fake.lists(), fake.gets()), (2, 4));
        // Dropped: its task is aborted (it held the wake-up's other reference).
        let wake = src.wake.clone();
        drop(src);
        for _ in 0..1000 {
            if Arc::strong_count(&wake) == 1 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the reader's task outlived it");
    }
}
