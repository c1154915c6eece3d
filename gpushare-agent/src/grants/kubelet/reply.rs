//! A reply of the kubelet read, and bound to pod UIDs: pure but for listing the kubelet's log
//! directories and looking for pod cgroups.
//!
//! The kubelet names pods by namespace and name only. At each answer, the pod UIDs are bound from
//! the kubelet's log directories `<pod_logs_dir>/<ns>_<name>_<uid>` listed **before** the call (a
//! pod created after the kubelet answered is not covered by that answer) and whose pod cgroup is
//! still live after it. Two live UIDs for one name, or two entries for one name in one answer,
//! bind neither (counted as ambiguous): a pod recreated under the same name never inherits its
//! predecessor's grant.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::Path,
    sync::Arc,
};

use super::{
    ContainerAssignment, DraClaim, DraDevice, PodAssignment, devices::container_grant, proto,
};
use crate::attribution::k8s_names;

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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::grants::kubelet::container_logs_dir;

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
}
