//! The reader against a fake kubelet served on a unix socket from the test's runtime.

use super::*;

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
