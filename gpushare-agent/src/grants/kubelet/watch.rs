//! The kubelet's pod-resources client and the background task that reads it: never the agent's
//! step. It asks the kubelet over its unix socket (`List` every [`REFRESH`], and sooner when a pod
//! the last answer does not cover shows up; `Get` for that pod where the kubelet serves it) and
//! publishes an immutable [`PodResourcesView`] that the step reads without waiting. A kubelet
//! without the socket, or one answering `Unimplemented`, is said once per change of state in the
//! log and shown in the view's [`KubeletStatus`] (the `status` page's degraded lines), never
//! retried in a loop faster than [`REFRESH`]. Each answer is read and bound to pod UIDs by
//! [`super::reply`].

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use log::{info, warn};
use tokio::sync::{Notify, watch};

use super::{
    KubeletStatus, PodResourcesView,
    proto::{self, pod_resources_lister_client::PodResourcesListerClient},
    reply::{bind, pod_cgroup_live, pod_from_proto, pod_log_dirs},
};
use crate::quota::KubeletSettings;

/// How often the kubelet is asked in full.
pub const REFRESH: Duration = Duration::from_secs(10);
/// Longest one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest gap between two asks triggered by new pods (coalesces a burst of new pods).
const MIN_GAP: Duration = Duration::from_millis(200);
/// Largest reply read (a node with hundreds of pods answers far less).
const MAX_REPLY_BYTES: usize = 16 << 20;

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
mod tests;
