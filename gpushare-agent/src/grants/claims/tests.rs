use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use serde_json::{Value, json};

use super::*;

pub(crate) const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;
pub(crate) const UID: &str = "8f2c1d3e-0000-4000-8000-00000000a1b2";

/// The one grant the API server gives container `id` (its claims' or its pod's annotations);
/// where it gives both, `grants::merge` combines them (tested there).
fn grant(v: &KubeView, id: &str) -> Option<EnvQuota> {
    let c = v.containers.get(id)?;
    assert!(c.dra.is_none() || c.annotation.is_none(), "{c:?}");
    c.dra.clone().or(c.annotation.clone())
}

/// The claims' union of a pod whose containers share a claim, where no sharer's annotation
/// lowers it (`grants::merge` combines those, tested there).
fn pod_grant(v: &KubeView, uid: &str) -> Option<EnvQuota> {
    let (q, ids) = v.shared.get(uid)?;
    assert!(
        ids.iter()
            .all(|i| v.containers.get(i).is_none_or(|c| c.annotation.is_none()))
    );
    Some(q.clone())
}

pub(crate) fn cid(n: u8) -> String {
    format!("{:064x}", u64::from(n) + 0xabc000)
}

/// A running pod on `node-1`: `containers` are (name, claim entries it uses).
pub(crate) fn pod(
    annotations: Value,
    containers: &[(&str, &[&str])],
    claims: &[(&str, &str)],
) -> Pod {
    let spec_containers: Vec<Value> = containers
        .iter()
        .map(|(name, uses)| {
            let claims: Vec<Value> = uses.iter().map(|u| json!({ "name": u })).collect();
            json!({ "name": name, "image": "cuda", "resources": { "claims": claims } })
        })
        .collect();
    let statuses: Vec<Value> = containers
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            json!({
                "name": name, "image": "cuda", "imageID": "", "ready": true, "restartCount": 0,
                "containerID": format!("containerd://{}", cid(i as u8)),
                "state": { "running": { "startedAt": "2026-12-02T07:00:00Z" } }
            })
        })
        .collect();
    let pod_claims: Vec<Value> = claims
        .iter()
        .map(|(entry, _)| json!({ "name": entry, "resourceClaimTemplateName": "gpu" }))
        .collect();
    let claim_statuses: Vec<Value> = claims
        .iter()
        .map(|(entry, name)| json!({ "name": entry, "resourceClaimName": name }))
        .collect();
    serde_json::from_value(json!({
        "metadata": { "name": "trainer-0", "namespace": "ml", "uid": UID, "annotations": annotations },
        "spec": { "nodeName": "node-1", "containers": spec_containers, "resourceClaims": pod_claims },
        "status": { "phase": "Running", "containerStatuses": statuses,
                    "resourceClaimStatuses": claim_statuses }
    }))
    .unwrap()
}

/// A claim in `ml` allocated `results`: (driver, device, memory).
pub(crate) fn claim(name: &str, results: &[(&str, &str, Option<&str>)]) -> ResourceClaim {
    let results: Vec<Value> = results
        .iter()
        .map(|(driver, device, memory)| {
            let mut r =
                json!({ "request": "gpu", "driver": driver, "pool": "node-1", "device": device });
            if let Some(m) = memory {
                r["consumedCapacity"] = json!({ "memory": m });
            }
            r
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "ml" },
        "spec": { "devices": { "requests": [ { "name": "gpu", "exactly": { "deviceClassName": "gpu.nvidia.com" } } ] } },
        "status": { "allocation": { "devices": { "results": results } } }
    }))
    .unwrap()
}

/// A DRA quota on GPUs named by their device minors (`gpu-<minor>`).
pub(crate) fn dra(per_gpu: &[(u32, u64)], each: Option<u64>) -> EnvQuota {
    EnvQuota {
        sources: GrantSource::Dra.into(),
        per_gpu: per_gpu
            .iter()
            .map(|(m, b)| (DeviceRef::Minor(*m), *b))
            .collect(),
        each_gpu: each,
    }
}

#[test]
fn a_claim_used_by_one_container_is_its_quota_on_the_gpu_it_names() {
    let p = pod(
        json!({}),
        &[("a", &["gpu"]), ("b", &[])],
        &[("gpu", "trainer-0-gpu-x1")],
    );
    let c = claim(
        "trainer-0-gpu-x1",
        &[(NVIDIA_DRA_DRIVER, "gpu-1", Some("6Gi"))],
    );
    let v = view(&[p], &[c], GpuShareUnit::GiB);
    assert!(v.fresh && v.problems.is_empty(), "{v:?}");
    assert_eq!(grant(&v, &cid(0)), Some(dra(&[(1, 6 * GI)], None)));
    assert_eq!(grant(&v, &cid(1)), None, "b uses no claim");
    assert_eq!(v.containers[&cid(1)].pod, "ml/trainer-0");
    assert!(v.shared.is_empty() && v.pod_of(&cid(0)).is_none());
}

#[test]
fn a_claim_shared_by_two_containers_bounds_their_union_the_pod() {
    let p = pod(
        json!({}),
        &[("a", &["gpu"]), ("b", &["gpu", "own"]), ("c", &["solo"])],
        &[("gpu", "shared"), ("own", "b-own"), ("solo", "c-solo")],
    );
    let claims = [
        claim("shared", &[(NVIDIA_DRA_DRIVER, "gpu-0", Some("4Gi"))]),
        claim("b-own", &[(NVIDIA_DRA_DRIVER, "gpu-0", Some("1Gi"))]),
        claim("c-solo", &[(NVIDIA_DRA_DRIVER, "gpu-0", Some("2Gi"))]),
    ];
    let v = view(&[p], &claims, GpuShareUnit::GiB);
    assert_eq!(v.pod_of(&cid(0)), Some(UID));
    assert_eq!(v.pod_of(&cid(1)), Some(UID));
    assert_eq!(v.pod_of(&cid(2)), None, "c shares nothing");
    // The union holds the shared claim and b's own: 5 GiB on GPU 0, once, not per container.
    assert_eq!(pod_grant(&v, UID), Some(dra(&[(0, 5 * GI)], None)));
    assert_eq!(v.shared[UID].1, vec![cid(0), cid(1)]);
    assert_eq!(grant(&v, &cid(0)), None);
    assert_eq!(grant(&v, &cid(1)), None);
    assert_eq!(grant(&v, &cid(2)), Some(dra(&[(0, 2 * GI)], None)));
    assert_eq!(pod_grant(&v, "other"), None);
}

#[test]
fn results_add_up_and_an_unknown_device_bounds_every_gpu() {
    let p = pod(json!({}), &[("a", &["gpu"])], &[("gpu", "x")]);
    let c = claim(
        "x",
        &[
            (NVIDIA_DRA_DRIVER, "gpu-0", Some("1Gi")),
            (NVIDIA_DRA_DRIVER, "gpu-0-mig-9-4-2", Some("512Mi")),
            (NVIDIA_DRA_DRIVER, "gpu-2", None),
            ("gpu.example.com", "gpu-3", Some("2Gi")),
            (NVIDIA_DRA_DRIVER, "vfio-1", Some("1Gi")),
        ],
    );
    let v = view(&[p], &[c], GpuShareUnit::GiB);
    assert_eq!(
        grant(&v, &cid(0)),
        Some(dra(&[(0, GI + 512 * MI)], Some(3 * GI)))
    );
}

#[test]
fn a_bad_quantity_or_a_missing_claim_is_said_and_grants_nothing() {
    let p = pod(
        json!({}),
        &[("a", &["gpu", "gone"]), ("b", &["nostatus"])],
        &[("gpu", "x"), ("gone", "y")],
    );
    let c = claim("x", &[(NVIDIA_DRA_DRIVER, "gpu-0", Some("4GB"))]);
    let v = view(&[p], &[c], GpuShareUnit::GiB);
    assert_eq!(grant(&v, &cid(0)), None);
    let said = v.problems.join("\n");
    assert!(said.contains("unknown suffix `GB`"), "{said}");
    assert!(said.contains("ResourceClaim ml/y not found"), "{said}");
    assert!(
        said.contains("claim `nostatus` of container b has no ResourceClaim yet"),
        "{said}"
    );
}

#[test]
fn a_claim_shared_by_two_pods_is_said() {
    let p1 = pod(json!({}), &[("a", &["gpu"])], &[("gpu", "x")]);
    let mut p2 = pod(json!({}), &[("a", &["gpu"])], &[("gpu", "x")]);
    p2.metadata.name = Some("trainer-1".into());
    p2.metadata.uid = Some("other-uid".into());
    let c = claim("x", &[(NVIDIA_DRA_DRIVER, "gpu-0", Some("4Gi"))]);
    let v = view(&[p1, p2], &[c], GpuShareUnit::GiB);
    assert!(
        v.problems
            .iter()
            .any(|p| p.contains("shared by pods ml/trainer-0, ml/trainer-1")),
        "{:?}",
        v.problems
    );
}

#[test]
fn a_container_that_is_not_running_is_not_in_the_view() {
    let mut p = pod(json!({}), &[("a", &["gpu"])], &[("gpu", "x")]);
    p.status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .state = None;
    let c = claim("x", &[(NVIDIA_DRA_DRIVER, "gpu-0", Some("4Gi"))]);
    assert!(view(&[p], &[c], GpuShareUnit::GiB).containers.is_empty());
}

#[test]
fn container_ids_and_device_names() {
    assert_eq!(
        container_id(&format!("containerd://{}", cid(1))),
        Some(cid(1).as_str())
    );
    assert_eq!(container_id("cri-o://0123456789ab"), Some("0123456789ab"));
    assert_eq!(container_id("docker://0123456789a"), None);
    assert_eq!(container_id("0123456789abcdef"), None);
    assert_eq!(container_id("docker://0123456789zz"), None);
    assert_eq!(
        dra_device(NVIDIA_DRA_DRIVER, "gpu-7"),
        Some(DeviceRef::Minor(7))
    );
    assert_eq!(
        dra_device(NVIDIA_DRA_DRIVER, "gpu-12-mig-1-0-1"),
        Some(DeviceRef::Minor(12))
    );
    for bad in [
        "gpu-",
        "gpu-x",
        "gpu-1x",
        "cpu-1",
        "gpu--mig-1",
        "gpu-99999999999",
    ] {
        assert_eq!(dra_device(NVIDIA_DRA_DRIVER, bad), None, "{bad}");
    }
    assert_eq!(dra_device("gpu.example.com", "gpu-1"), None);
}

pub(crate) fn ann(each: Option<u64>, per: &[(u32, u64)]) -> EnvQuota {
    EnvQuota {
        sources: GrantSource::Annotation.into(),
        per_gpu: per
            .iter()
            .map(|(i, b)| (DeviceRef::Index(*i), *b))
            .collect(),
        each_gpu: each,
    }
}

#[test]
fn annotations_kai_and_gpushare() {
    let p = pod(
        json!({
            "nvidia.com/container.a.gpu-memory.limit": "3Gi",
            "nvidia.com/container.a.gpu-memory.request": "1Gi",
            "nvidia.com/container.b.gpu-memory.limit": "junk",
            "ALIYUN_COM_GPU_MEM_POD": "2",
            "ALIYUN_COM_GPU_MEM_IDX": "1",
        }),
        &[("a", &[]), ("b", &[]), ("c", &[])],
        &[],
    );
    let mut problems = Vec::new();
    // a: 3 GiB on each GPU, the pod's 2 GiB on GPU 1.
    assert_eq!(
        annotation_quota(&p, "a", GpuShareUnit::GiB, &mut problems),
        Some(ann(Some(3 * GI), &[(1, 2 * GI)]))
    );
    assert_eq!(
        annotation_quota(&p, "c", GpuShareUnit::MiB, &mut problems),
        Some(ann(None, &[(1, 2 * MI)]))
    );
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        annotation_quota(&p, "b", GpuShareUnit::GiB, &mut problems),
        Some(ann(None, &[(1, 2 * GI)]))
    );
    assert!(problems[0].contains("gpu-memory.limit"), "{problems:?}");
    let mut problems = Vec::new();
    let p = pod(
        json!({ "ALIYUN_COM_GPU_MEM_POD": "0", "nvidia.com/container.a.gpu-memory.limit": "0" }),
        &[("a", &[])],
        &[],
    );
    assert_eq!(
        annotation_quota(&p, "a", GpuShareUnit::GiB, &mut problems),
        None
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    let mut problems = Vec::new();
    let p = pod(
        json!({ "ALIYUN_COM_GPU_MEM_POD": "4", "ALIYUN_COM_GPU_MEM_IDX": "x" }),
        &[("a", &[])],
        &[],
    );
    assert_eq!(
        annotation_quota(&p, "a", GpuShareUnit::GiB, &mut problems),
        Some(ann(Some(4 * GI), &[]))
    );
    assert!(problems[0].contains("bounds every GPU"), "{problems:?}");
    let p = pod(json!({ "ALIYUN_COM_GPU_MEM_POD": "4" }), &[("a", &[])], &[]);
    let mut problems = Vec::new();
    assert_eq!(
        annotation_quota(&p, "a", GpuShareUnit::GiB, &mut problems),
        Some(ann(Some(4 * GI), &[]))
    );
    assert!(problems.is_empty());
}

/// A view of one container holding `dra` and `annotation` (and, as the pod's union, `dra`).
pub(crate) fn one(dra: Option<EnvQuota>, annotation: Option<EnvQuota>) -> KubeView {
    KubeView {
        containers: [(
            cid(0),
            KubeContainer {
                pod_uid: UID.into(),
                pod: "ml/trainer-0".into(),
                name: "a".into(),
                dra: dra.clone(),
                annotation,
            },
        )]
        .into(),
        shared: dra
            .map(|d| [(UID.to_string(), (d, vec![cid(0)]))].into())
            .unwrap_or_default(),
        ..KubeView::default()
    }
}

#[test]
fn annotations_are_pinned_to_what_they_said_when_the_container_started() {
    let claims = [claim("x", &[(NVIDIA_DRA_DRIVER, "gpu-0", Some("4Gi"))])];
    let at = |limit: &str| {
        let p = pod(
            json!({ "nvidia.com/container.a.gpu-memory.limit": limit }),
            &[("a", &["gpu"])],
            &[("gpu", "x")],
        );
        view(&[p], &claims, GpuShareUnit::GiB)
    };
    let annotated = |v: &KubeView| {
        v.containers[&cid(0)]
            .annotation
            .as_ref()
            .unwrap()
            .each_gpu
            .unwrap()
    };
    let mut pinned = Pinned::default();
    let mut v = at("1Gi");
    assert!(pinned.apply(&mut v).is_empty());
    assert_eq!(annotated(&v), GI);
    // Raised after the start: ignored, said once.
    let mut v = at("8Gi");
    let said = pinned.apply(&mut v);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("changed after it started"), "{said:?}");
    assert_eq!(annotated(&v), GI);
    let mut v = at("8Gi");
    assert!(pinned.apply(&mut v).is_empty(), "said once per value");
    assert_eq!(pinned.edits_total(), 1);
    // Lowered after the start: ignored too (as it stood at the start).
    let mut v = at("512Mi");
    assert_eq!(pinned.apply(&mut v).len(), 1);
    assert_eq!(annotated(&v), GI);
    // Back to the first value: nothing to say.
    let mut v = at("1Gi");
    assert!(pinned.apply(&mut v).is_empty());
    assert_eq!(pinned.edits_total(), 2);
    // A container gone is forgotten: a new one with that id reads afresh.
    let mut empty = KubeView::default();
    pinned.apply(&mut empty);
    let mut v = at("2Gi");
    assert!(pinned.apply(&mut v).is_empty());
    assert_eq!(annotated(&v), 2 * GI);
}

/// A container that names one request of a claim (`resources.claims[].request`) is granted that
/// request's results and its subrequests' (`<request>/<sub>`, a prioritized list's choice), not
/// the other requests' (nor one whose name merely starts with it).
#[test]
fn a_container_naming_a_request_gets_only_that_requests_results() {
    let mut p = pod(json!({}), &[("a", &["gpu"])], &[("gpu", "x")]);
    p.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .claims
        .as_mut()
        .unwrap()[0]
        .request = Some("big".into());
    let mut c = claim(
        "x",
        &[
            (NVIDIA_DRA_DRIVER, "gpu-0", Some("4Gi")),
            (NVIDIA_DRA_DRIVER, "gpu-1", Some("1Gi")),
            (NVIDIA_DRA_DRIVER, "gpu-2", Some("2Gi")),
            (NVIDIA_DRA_DRIVER, "gpu-3", Some("8Gi")),
        ],
    );
    let results = c
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap();
    for (r, request) in results
        .iter_mut()
        .zip(["big", "small", "big/a100", "bigger"])
    {
        r.request = request.into();
    }
    let v = view(&[p], &[c], GpuShareUnit::GiB);
    assert_eq!(
        grant(&v, &cid(0)),
        Some(dra(&[(0, 4 * GI), (2, 2 * GI)], None))
    );
}

/// `p` with its containers from `from` on moved to `spec.initContainers` (and their statuses to
/// `status.initContainerStatuses`), the first `sidecars` of them with `restartPolicy: Always`.
fn with_init_containers(p: Pod, from: usize, sidecars: usize) -> Pod {
    let mut v = serde_json::to_value(&p).unwrap();
    let mut init: Vec<Value> = v["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .drain(from..)
        .collect();
    for c in init.iter_mut().take(sidecars) {
        c["restartPolicy"] = json!("Always");
    }
    let statuses: Vec<Value> = v["status"]["containerStatuses"]
        .as_array_mut()
        .unwrap()
        .drain(from..)
        .collect();
    v["spec"]["initContainers"] = json!(init);
    v["status"]["initContainerStatuses"] = json!(statuses);
    serde_json::from_value(v).unwrap()
}

/// Issue 41: a native sidecar (an init container with `restartPolicy: Always`, GA in 1.33) that
/// holds a claim is bounded by it like a container (on main its claim was never read); so is an
/// ordinary init container while it runs (a GPU warm-up before the containers start), and once it
/// has finished nothing of it is read.
#[test]
fn a_native_sidecars_and_a_running_init_containers_claims_bound_them() {
    let p = pod(
        json!({ "nvidia.com/container.side.gpu-memory.limit": "1Gi" }),
        &[("main", &[]), ("side", &["gpu"]), ("init", &["warm"])],
        &[("gpu", "x"), ("warm", "y")],
    );
    let p = with_init_containers(p, 1, 1);
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(spec.containers.len(), 1);
    assert_eq!(spec.init_containers.as_ref().unwrap().len(), 2);
    let x = claim("x", &[(NVIDIA_DRA_DRIVER, "gpu-1", Some("2Gi"))]);
    let y = claim("y", &[(NVIDIA_DRA_DRIVER, "gpu-0", Some("4Gi"))]);
    let v = view(std::slice::from_ref(&p), &[x, y], GpuShareUnit::GiB);
    let side = v.containers.get(&cid(1)).expect("the sidecar is read");
    assert_eq!(side.name, "side");
    assert_eq!(side.dra, Some(dra(&[(1, 2 * GI)], None)));
    assert_eq!(side.annotation, Some(ann(Some(GI), &[])));
    assert!(side.dra.is_some() && side.annotation.is_some());
    let init = v
        .containers
        .get(&cid(2))
        .expect("the running init container is read");
    assert_eq!(init.name, "init");
    assert_eq!(init.dra, Some(dra(&[(0, 4 * GI)], None)));
    assert_eq!(grant(&v, &cid(0)), None);
    assert_eq!(v.problems, Vec::<String>::new());
    // Finished: not read.
    let mut done = serde_json::to_value(&p).unwrap();
    done["status"]["initContainerStatuses"][1]["state"] =
        json!({ "terminated": { "exitCode": 0 } });
    let done: Pod = serde_json::from_value(done).unwrap();
    let (x, y) = (
        claim("x", &[(NVIDIA_DRA_DRIVER, "gpu-1", Some("2Gi"))]),
        claim("y", &[(NVIDIA_DRA_DRIVER, "gpu-0", Some("4Gi"))]),
    );
    let v = view(&[done], &[x, y], GpuShareUnit::GiB);
    assert!(!v.containers.contains_key(&cid(2)), "{v:?}");
    assert!(v.containers.contains_key(&cid(1)));
}

/// Issue 41: the schedulers' own spellings. KAI's CDI-era annotations under `nvidia.cdi.k8s.io/`
/// and TensorFusion's `tensor-fusion.ai/vram-limit` (on the containers it injects) are limits on
/// each GPU; their requests are not; the smallest of several applies; a broken one is said.
#[test]
fn kai_cdi_and_tensorfusion_annotations_are_limits_in_their_spelling() {
    let p = pod(
        json!({
            "nvidia.cdi.k8s.io/a.gpu-memory.limit": "3Gi",
            "nvidia.cdi.k8s.io/a.gpu-memory.request": "1Gi",
            "nvidia.cdi.k8s.io/container.b.gpu-memory.limit": "2048Mi",
            "nvidia.cdi.k8s.io/container.b": "nvidia.com/gpu=0",
            "tensor-fusion.ai/vram-request": "1Gi",
        }),
        &[("a", &[]), ("b", &[]), ("c", &[])],
        &[],
    );
    let mut problems = Vec::new();
    let q = |p: &Pod, n: &str, problems: &mut Vec<String>| {
        annotation_quota(p, n, GpuShareUnit::GiB, problems)
    };
    assert_eq!(q(&p, "a", &mut problems), Some(ann(Some(3 * GI), &[])));
    assert_eq!(q(&p, "b", &mut problems), Some(ann(Some(2 * GI), &[])));
    assert_eq!(q(&p, "c", &mut problems), None, "a request is no limit");
    assert!(problems.is_empty(), "{problems:?}");
    // TensorFusion: the pod's limit, on each container it injects.
    let p = pod(
        json!({
            "tensor-fusion.ai/vram-limit": "4Gi",
            "tensor-fusion.ai/vram-request": "4Gi",
            "tensor-fusion.ai/inject-container": "python, b",
            "nvidia.com/container.b.gpu-memory.limit": "6Gi",
            "nvidia.cdi.k8s.io/b.gpu-memory.limit": "5Gi",
        }),
        &[("python", &[]), ("b", &[]), ("c", &[])],
        &[],
    );
    assert_eq!(q(&p, "python", &mut problems), Some(ann(Some(4 * GI), &[])));
    assert_eq!(q(&p, "b", &mut problems), Some(ann(Some(4 * GI), &[])));
    assert_eq!(q(&p, "c", &mut problems), None, "not injected");
    let p = pod(
        json!({ "tensor-fusion.ai/vram-limit": "512Mi" }),
        &[("x", &[])],
        &[],
    );
    assert_eq!(q(&p, "x", &mut problems), Some(ann(Some(512 * MI), &[])));
    assert!(problems.is_empty(), "{problems:?}");
    // Broken or zero: said, and nothing granted from it.
    let p = pod(
        json!({ "tensor-fusion.ai/vram-limit": "4 gigs", "nvidia.cdi.k8s.io/x.gpu-memory.limit": "0" }),
        &[("x", &[])],
        &[],
    );
    assert_eq!(q(&p, "x", &mut problems), None);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems
            .iter()
            .any(|p| p.contains("tensor-fusion.ai/vram-limit"))
    );
}
