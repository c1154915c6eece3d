//! The kubelet's pod-resources API as a quota source (issue 22): a fake kubelet (a tonic server
//! on a unix socket implementing the vendored `v1` proto, with `Get` answering `Unimplemented`)
//! serves the assignments each test chooses; the pods are real cgroups at the kubelet's place
//! (`kubepods/pod<uid>/<cid>`) with a sleeping process whose environment (read as its init's,
//! there being no runtime spec) carries the device plugin's variables; the kubelet's log
//! directories are in a temporary directory named by `[kubernetes] pod_logs_dir`.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use gpushare_agent::grants::kubelet::proto::{
    self,
    pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
};
use gpushare_testkit::{nvml::Scenario, unique};
use tonic::{Request, Response, Status};

use crate::util::{AgentProcess, PlacedGroup, Reaped, container_id, needs_root, one_gpu, sleeper};

const GIB: u64 = 1 << 30;
const FREEZE: &str = "[defaults]\ngrace = \"200ms\"\nladder = [ { action = \"freeze\" } ]\n";

/// A fake kubelet: `List` answers the pods set, `Get` is `Unimplemented` (the
/// `KubeletPodResourcesGet` gate off); calls are counted.
#[derive(Clone, Default)]
struct Fake {
    pods: Arc<Mutex<Vec<proto::PodResources>>>,
    lists: Arc<AtomicU64>,
    gets: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl PodResourcesLister for Fake {
    async fn list(
        &self,
        _: Request<proto::ListPodResourcesRequest>,
    ) -> Result<Response<proto::ListPodResourcesResponse>, Status> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(proto::ListPodResourcesResponse {
            pod_resources: self.pods.lock().unwrap().clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<proto::AllocatableResourcesRequest>,
    ) -> Result<Response<proto::AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not served by this fake"))
    }

    async fn get(
        &self,
        _: Request<proto::GetPodResourcesRequest>,
    ) -> Result<Response<proto::GetPodResourcesResponse>, Status> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        Err(Status::unimplemented(
            "PodResources API Get method disabled",
        ))
    }
}

/// The fake kubelet serving on `socket` from its own thread, stopped on drop.
struct FakeKubelet {
    fake: Fake,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeKubelet {
    fn serve(socket: &Path) -> Self {
        let fake = Fake::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (f, path) = (fake.clone(), socket.to_path_buf());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path).unwrap();
                ready_tx.send(()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(PodResourcesListerServer::new(f))
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        async {
                            let _ = rx.await;
                        },
                    )
                    .await
                    .unwrap();
            });
        });
        ready_rx.recv().unwrap();
        Self {
            fake,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    fn set(&self, pods: Vec<proto::PodResources>) {
        *self.fake.pods.lock().unwrap() = pods;
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A pod as the kubelet lists it: container `main` with `units` GPUShare ids.
fn pod(ns: &str, name: &str, units: usize) -> proto::PodResources {
    proto::PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![proto::ContainerResources {
            name: "main".into(),
            devices: vec![proto::ContainerDevices {
                resource_name: "aliyun.com/gpu-mem".into(),
                // The kubelet picks any free fake ids, here on two GPUs: only the count counts.
                device_ids: (0..units)
                    .map(|i| format!("GPU-{}-_-{i}", if i % 2 == 0 { "a" } else { "b" }))
                    .collect(),
                topology: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn pod_uid(cid: &str) -> String {
    format!(
        "{}-{}-{}-{}-{}",
        &cid[..8],
        &cid[8..12],
        &cid[12..16],
        &cid[16..20],
        &cid[20..32]
    )
}

/// The kubelet's directories: `pods/` and `containers/` under a temporary root.
struct KubeletDirs {
    root: PathBuf,
}

impl KubeletDirs {
    fn new() -> Self {
        let root = std::env::temp_dir().join(unique("gpushare-kubelet"));
        std::fs::create_dir_all(root.join("pods")).unwrap();
        std::fs::create_dir_all(root.join("containers")).unwrap();
        Self { root }
    }

    fn pods(&self) -> PathBuf {
        self.root.join("pods")
    }

    fn socket(&self) -> PathBuf {
        self.root.join("kubelet.sock")
    }

    /// The log directory of pod `ns/name` (UID `uid`) and the log link of its container `main`.
    fn add(&self, ns: &str, name: &str, uid: &str, cid: &str) {
        std::fs::create_dir_all(self.pods().join(format!("{ns}_{name}_{uid}/main"))).unwrap();
        std::fs::write(
            self.root
                .join("containers")
                .join(format!("{name}_{ns}_main-{cid}.log")),
            "",
        )
        .unwrap();
    }

    fn quotas(&self, socket: &Path) -> String {
        format!(
            "{FREEZE}\n[kubernetes]\npod_resources_socket = \"{}\"\npod_logs_dir = \"{}\"\n",
            socket.display(),
            self.pods().display()
        )
    }
}

impl Drop for KubeletDirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// One pod's container: a group at the kubelet's place with a sleeper whose environment holds
/// `env`.
struct PodContainer {
    cid: String,
    uid: String,
    // Killed before its group is removed.
    proc: Reaped,
    _group: PlacedGroup,
}

impl PodContainer {
    fn start(dirs: &KubeletDirs, ns: &str, name: &str, env: &[(&str, &str)]) -> Self {
        let cid = container_id();
        let uid = pod_uid(&cid);
        let group = PlacedGroup::create(&format!("kubepods/pod{uid}/{cid}"));
        let mut cmd = sleeper();
        cmd.env_clear().env("PATH", "/usr/bin:/bin");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let proc = Reaped(group.cg().spawn(&mut cmd).unwrap());
        dirs.add(ns, name, &uid, &cid);
        Self {
            cid,
            uid,
            proc,
            _group: group,
        }
    }

    fn pid(&self) -> u32 {
        self.proc.pid()
    }
}

/// Workload `key`'s row (the quota of a pod's container applies per GPU: one row for the GPU).
fn row<'a>(
    s: &'a gpushare_agent::snapshot::Snapshot,
    key: &str,
) -> Option<&'a gpushare_agent::snapshot::WorkloadView> {
    s.workloads.iter().find(|w| w.workload == key).map(|w| &**w)
}

fn key_of(s: &gpushare_agent::snapshot::Snapshot, pid: u32) -> Option<String> {
    s.processes
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| p.workload.clone())
}

/// A pod-resources grant beats a larger or a zero environment value, and a smaller environment
/// value beats a larger grant; the quota's source and trust say which applies.
#[test]
fn kubelet_grant_beats_larger_or_zero_env_and_a_smaller_env_beats_the_grant() {
    needs_root!("kubelet_grant_beats_larger_or_zero_env");
    let dirs = KubeletDirs::new();
    let kubelet = FakeKubelet::serve(&dirs.socket());
    let larger = PodContainer::start(
        &dirs,
        "ml",
        "larger",
        &[("ALIYUN_COM_GPU_MEM_CONTAINER", "8")],
    );
    let zero = PodContainer::start(&dirs, "ml", "zero", &[("CUDA_DEVICE_MEMORY_LIMIT", "0")]);
    kubelet.set(vec![pod("ml", "larger", 2), pod("ml", "zero", 2)]);
    let sc = Scenario::create(&one_gpu(&[(larger.pid(), 3 * GIB), (zero.pid(), 3 * GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, &dirs.quotas(&dirs.socket()), &[]);
    agent.wait_for(Duration::from_secs(30), |s| {
        [&larger, &zero].iter().all(|c| {
            key_of(s, c.pid())
                .and_then(|k| row(s, &k).map(|w| w.state == "frozen"))
                .unwrap_or(false)
        })
    });
    // A pod that starts after the kubelet's first answer: asked for with `Get`, which this
    // kubelet does not serve, then with `List`.
    let smaller = PodContainer::start(
        &dirs,
        "ml",
        "smaller",
        &[("ALIYUN_COM_GPU_MEM_CONTAINER", "1")],
    );
    kubelet.set(vec![
        pod("ml", "larger", 2),
        pod("ml", "zero", 2),
        pod("ml", "smaller", 4),
    ]);
    sc.write(&one_gpu(&[
        (larger.pid(), 3 * GIB),
        (zero.pid(), 3 * GIB),
        (smaller.pid(), 3 * GIB),
    ]))
    .unwrap();
    let s = agent.wait_for(Duration::from_secs(30), |s| {
        [&larger, &zero, &smaller].iter().all(|c| {
            key_of(s, c.pid())
                .and_then(|k| row(s, &k).map(|w| w.state == "frozen"))
                .unwrap_or(false)
        })
    });
    let row_of = |c: &PodContainer| {
        let k = key_of(&s, c.pid()).unwrap();
        assert!(k.contains(&c.cid), "{k}");
        row(&s, &k).unwrap().clone()
    };
    let (l, z, sm) = (row_of(&larger), row_of(&zero), row_of(&smaller));
    assert_eq!(
        (
            l.quota_bytes,
            l.quota_source.as_str(),
            l.quota_trust.as_str()
        ),
        (Some(2 * GIB), "kubelet", "kubelet"),
        "the grant (2 units) beats the environment's 8: {l:?}"
    );
    assert_eq!(
        (
            z.quota_bytes,
            z.quota_source.as_str(),
            z.quota_trust.as_str()
        ),
        (Some(2 * GIB), "kubelet", "kubelet"),
        "a zero in the environment lifts nothing: {z:?}"
    );
    assert_eq!(
        (
            sm.quota_bytes,
            sm.quota_source.as_str(),
            sm.quota_trust.as_str()
        ),
        (Some(GIB), "gpushare env", "init_environ"),
        "the environment's 1 beats the grant's 4: {sm:?}"
    );
    // `Get` answered `Unimplemented` once; the agent said so once and used `List`. The smaller
    // pod's environment quota may freeze it before the reader's `Get` (asked 200 ms after the
    // pod shows up): wait for the call, bounded, before reading the log.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while (kubelet.fake.gets.load(Ordering::SeqCst) == 0
        || !agent.log().contains("Get is not served"))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = agent.log();
    assert_eq!(
        log.matches("Get is not served").count(),
        1,
        "said once:\n{log}"
    );
    assert_eq!(kubelet.fake.gets.load(Ordering::SeqCst), 1);
    assert!(kubelet.fake.lists.load(Ordering::SeqCst) >= 1);
    let _ = (&larger.uid, &zero.uid, &smaller.uid);
}

/// A pod recreated under the same name never inherits the old grant: while the old pod's cgroup
/// is live beside the new one's, neither gets it (shown); once the old pod is gone, the new one
/// does.
#[test]
fn kubelet_grant_of_a_recreated_pod_name_goes_to_no_uid_while_two_are_live() {
    needs_root!("kubelet_grant_of_a_recreated_pod_name");
    let dirs = KubeletDirs::new();
    let kubelet = FakeKubelet::serve(&dirs.socket());
    let old = PodContainer::start(&dirs, "ml", "web-0", &[]);
    let new = PodContainer::start(&dirs, "ml", "web-0", &[]);
    kubelet.set(vec![pod("ml", "web-0", 2)]);
    let sc = Scenario::create(&one_gpu(&[(old.pid(), GIB / 2), (new.pid(), 3 * GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, &dirs.quotas(&dirs.socket()), &[]);
    let s = agent.wait_for(Duration::from_secs(30), |s| {
        s.health
            .degraded
            .iter()
            .any(|d| d.contains("pod ml/web-0 has two live pod UIDs"))
    });
    let key = key_of(&s, new.pid()).unwrap();
    let s = agent.steps_over(Duration::from_secs(1), |s| {
        let w = row(s, &key);
        assert!(
            w.is_none_or(|w| w.quota_bytes.is_none() && w.state == "ok"),
            "no grant while ambiguous: {w:?}"
        );
    });
    assert!(
        row(&s, &key).is_none_or(|w| w.quota_bytes.is_none()),
        "no quota from the kubelet while ambiguous"
    );
    // The old pod goes (its logs stay, as the kubelet keeps them a while): the new pod's grant.
    drop(old);
    let s = agent.wait_for(Duration::from_secs(40), |s| {
        row(s, &key).is_some_and(|w| w.state == "frozen")
    });
    assert_eq!(row(&s, &key).unwrap().quota_bytes, Some(2 * GIB));
}

/// A kubelet without the socket is said once (and shown), never an error loop; nothing is
/// enforced from it.
#[test]
fn kubelet_without_a_socket_is_said_once_and_shown() {
    needs_root!("kubelet_without_a_socket_is_said_once_and_shown");
    let dirs = KubeletDirs::new();
    let c = PodContainer::start(&dirs, "ml", "nosock", &[]);
    let sc = Scenario::create(&one_gpu(&[(c.pid(), 3 * GIB)])).unwrap();
    let missing = dirs.root.join("no-such.sock");
    let agent = AgentProcess::start(&sc, &dirs.quotas(&missing), &[]);
    agent.wait_for(Duration::from_secs(20), |s| {
        s.health
            .degraded
            .iter()
            .any(|d| d.contains("kubelet pod-resources: no socket"))
    });
    // Past a second ask (every 10 s), still said once.
    let s = agent.steps_over(Duration::from_secs(11), |_| {});
    let log = agent.log();
    assert_eq!(
        log.matches("kubelet pod-resources: no socket").count(),
        1,
        "said once:\n{log}"
    );
    let key = key_of(&s, c.pid()).unwrap();
    assert!(
        row(&s, &key).is_none_or(|w| w.quota_bytes.is_none() && w.state == "ok"),
        "nothing enforced from a kubelet that is not there"
    );
}
