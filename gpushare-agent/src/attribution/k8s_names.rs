//! Kubernetes names a node can tell without the API server, from the kubelet's log directories.
//!
//! A cgroup path gives a container's pod only by UID (`kubepods/burstable/pod<uid>/<id>`). The
//! kubelet also keeps one directory per pod, `/var/log/pods/<namespace>_<pod name>_<pod uid>/`,
//! with one sub-directory per container name (`<container>/<restart count>.log`), and one symlink
//! per container instance, `/var/log/containers/<pod name>_<namespace>_<container>-<container id>.log`.
//! Namespaces and pod names are DNS names and container names DNS labels, none of which may
//! contain `_`, so both names split unambiguously.
//!
//! Only directory listings are read (never a log file, never a symlink's target). Where the layout
//! is missing or different (an old kubelet used `/var/log/pods/<uid>/`, a node may not keep logs
//! there), the functions return `None` and the caller keeps the pod UID. Each call lists a
//! directory, so callers cache the answers per pod UID / container id.
//!
//! Pure std, no crate dependencies: the unit tests run with `rustc --test` on this file alone too.

use std::path::Path;

/// Where the kubelet keeps per-pod log directories.
pub const POD_LOG_ROOT: &str = "/var/log/pods";
/// Where the kubelet keeps per-container log symlinks.
pub const CONTAINER_LOG_ROOT: &str = "/var/log/containers";

/// A pod's names, from its log directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodNames {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod UID as the directory spells it.
    pub uid: String,
    /// Names of the pod's containers that have a log directory (init containers included),
    /// sorted.
    pub containers: Vec<String>,
}

/// One container instance, from its log symlink's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerNames {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Full container id (lowercase hex).
    pub container_id: String,
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A pod UID: lowercase hex and dashes (dashed v4 UIDs, and the 32-digit hashes of static pods).
fn is_uid(s: &str) -> bool {
    (16..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-')
}

/// Splits a pod log directory name, `<namespace>_<pod>_<uid>`, into its parts; `None` for any
/// other name.
pub fn parse_pod_log_dir_name(name: &str) -> Option<(String, String, String)> {
    let mut parts = name.split('_');
    let (ns, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !is_dns_label(ns) || !is_dns_subdomain(pod) || !is_uid(uid) {
        return None;
    }
    Some((ns.to_string(), pod.to_string(), uid.to_string()))
}

/// The names of the pod with UID `pod_uid` (dashed, as in the cgroup path), from the directory
/// `root` (normally [`POD_LOG_ROOT`]) lists; `None` when no directory names it.
pub fn pod_names_from_log_dir(root: &Path, pod_uid: &str) -> Option<PodNames> {
    let want = pod_uid.trim().to_ascii_lowercase();
    if !is_uid(&want) {
        return None;
    }
    let suffix = format!("_{want}");
    let entry = std::fs::read_dir(root)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(&suffix)))?;
    let name = entry.file_name();
    let (namespace, pod, uid) = parse_pod_log_dir_name(name.to_str()?)?;
    let mut containers: Vec<String> = std::fs::read_dir(entry.path())
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| is_dns_label(n))
                .collect()
        })
        .unwrap_or_default();
    containers.sort();
    Some(PodNames {
        namespace,
        pod,
        uid,
        containers,
    })
}

/// Splits a container log link name, `<pod>_<namespace>_<container>-<container id>.log`.
pub fn parse_container_log_name(name: &str) -> Option<ContainerNames> {
    let stem = name.strip_suffix(".log")?;
    let (front, id) = stem.rsplit_once('-')?;
    if id.len() < 12 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut parts = front.split('_');
    let (pod, ns, container) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || !is_dns_subdomain(pod)
        || !is_dns_label(ns)
        || !is_dns_label(container)
    {
        return None;
    }
    Some(ContainerNames {
        namespace: ns.to_string(),
        pod: pod.to_string(),
        container: container.to_string(),
        container_id: id.to_ascii_lowercase(),
    })
}

/// The names of the container with id `container_id` (full, hex), from the link names in
/// `dir` (normally [`CONTAINER_LOG_ROOT`]); `None` when no link names it.
pub fn container_names_from_log_links(dir: &Path, container_id: &str) -> Option<ContainerNames> {
    let want = container_id.trim().to_ascii_lowercase();
    if want.len() < 12 {
        return None;
    }
    let suffix = format!("-{want}.log");
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.ends_with(&suffix))
        .find_map(|n| parse_container_log_name(&n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_testkit::TempTree;
    use std::fs;

    const UID: &str = "0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a";
    const ID: &str = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";

    #[test]
    fn pod_directory_names_split_into_namespace_pod_and_uid() {
        assert_eq!(
            parse_pod_log_dir_name(&format!("ml_trainer-0_{UID}")),
            Some(("ml".into(), "trainer-0".into(), UID.into()))
        );
        // Pod names may contain dots; static pods have 32-digit hash UIDs.
        assert_eq!(
            parse_pod_log_dir_name(
                "kube-system_etcd-node1.example_6f8d0c2b3a4e5f60718293a4b5c6d7e8"
            ),
            Some((
                "kube-system".into(),
                "etcd-node1.example".into(),
                "6f8d0c2b3a4e5f60718293a4b5c6d7e8".into()
            ))
        );
        for bad in [
            UID.to_string(),                 // old layout: UID only
            format!("ml_trainer_0_{UID}"),   // a name with `_`
            format!("ML_trainer-0_{UID}"),   // upper case
            format!("ml__{UID}"),            // empty pod
            "ml_trainer-0_not-a-uid".into(), // no UID
            format!("ml_-trainer_{UID}"),    // bad DNS label
        ] {
            assert_eq!(parse_pod_log_dir_name(&bad), None, "{bad}");
        }
    }

    #[test]
    fn pod_names_come_from_the_log_directory_and_fall_back_to_nothing() {
        let root = TempTree::new("gpushare-k8s-names-pods-");
        let pod_dir = root.path().join(format!("ml_trainer-0_{UID}"));
        for c in ["server", "init-weights", "sidecar"] {
            fs::create_dir_all(pod_dir.join(c)).unwrap();
            fs::write(pod_dir.join(c).join("0.log"), "log line\n").unwrap();
        }
        fs::write(pod_dir.join("stray-file"), "").unwrap();
        fs::create_dir_all(
            root.path()
                .join("other_pod-1_11111111-2222-3333-4444-555555555555/main"),
        )
        .unwrap();
        let names = pod_names_from_log_dir(root.path(), &UID.to_uppercase()).unwrap();
        assert_eq!(
            names,
            PodNames {
                namespace: "ml".into(),
                pod: "trainer-0".into(),
                uid: UID.into(),
                containers: vec!["init-weights".into(), "server".into(), "sidecar".into()],
            }
        );
        // Unknown pod, old layout, missing root, nonsense UID: no names, the caller keeps the UID.
        let other = "99999999-2222-3333-4444-555555555555";
        assert_eq!(pod_names_from_log_dir(root.path(), other), None);
        fs::create_dir_all(root.path().join(other)).unwrap();
        assert_eq!(pod_names_from_log_dir(root.path(), other), None);
        assert_eq!(
            pod_names_from_log_dir(&root.path().join("missing"), UID),
            None
        );
        assert_eq!(pod_names_from_log_dir(root.path(), "../../etc"), None);
    }

    #[test]
    fn container_links_name_the_container_of_an_id() {
        let dir = TempTree::new("gpushare-k8s-names-containers-");
        let link = format!("trainer-0_ml_server-{ID}.log");
        std::os::unix::fs::symlink(
            format!("/var/log/pods/ml_trainer-0_{UID}/server/0.log"),
            dir.path().join(&link),
        )
        .unwrap();
        fs::write(dir.path().join("garbage.log"), "").unwrap();
        let want = ContainerNames {
            namespace: "ml".into(),
            pod: "trainer-0".into(),
            container: "server".into(),
            container_id: ID.into(),
        };
        assert_eq!(parse_container_log_name(&link), Some(want.clone()));
        assert_eq!(container_names_from_log_links(dir.path(), ID), Some(want));
        assert_eq!(container_names_from_log_links(dir.path(), &ID[..11]), None);
        assert_eq!(
            container_names_from_log_links(dir.path(), &"a".repeat(64)),
            None
        );
        for bad in [
            "trainer-0_ml_server.log".to_string(),
            format!("trainer-0_ml-{ID}.log"),
            format!("trainer-0_ml_server-{ID}.txt"),
            format!("trainer_0_ml_server-{ID}.log"),
        ] {
            assert_eq!(parse_container_log_name(&bad), None, "{bad}");
        }
    }
}
