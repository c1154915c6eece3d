//! cgroup path -> workload identity and the workload's *root* cgroup. Pure string parsing, no I/O.
//!
//! The workload is what the operator's runtime created on the host, never something created inside
//! it: the **outermost** container component names the container (a container's own sub-cgroups,
//! an init or systemd inside it, Docker-in-Docker's inner containers all belong to the outer one),
//! and the outermost systemd unit names the unit (a unit's delegated subtree belongs to it). The
//! root is the path up to and including that component; isolation acts on the root, so on the
//! whole workload. A tenant can create cgroups only below its own root, so nothing it creates can
//! change which workload it is or move the root.
//!
//! Recognised shapes:
//! - Docker: `/docker/<64 hex>` (cgroupfs driver), `/system.slice/docker-<id>.scope` (systemd driver)
//! - containerd / CRI: `cri-containerd-<id>.scope`; CRI-O: `crio-<id>.scope`; Podman: `libpod-<id>.scope`
//! - Kubernetes pods: `kubepods[/<qos>]/pod<uid>/<container id>` (cgroupfs driver) and
//!   `kubepods[-<qos>]-pod<uid with _>.slice/<runtime>-<id>.scope` (systemd driver)
//! - systemd units: a last component ending in `.service` or `.scope`
//! - anything else: the plain path; `/` is the host itself.

use std::fmt;

/// Which container runtime named a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// Docker (moby).
    Docker,
    /// containerd's CRI plugin.
    Containerd,
    /// CRI-O.
    Crio,
    /// Podman.
    Podman,
    /// A container id under a pod, runtime not spelled in the path (cgroupfs driver).
    Unknown,
}

impl Runtime {
    /// The short name used in labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Containerd => "containerd",
            Self::Crio => "crio",
            Self::Podman => "podman",
            Self::Unknown => "unknown",
        }
    }
}

/// Kubernetes QoS class, from the cgroup path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QosClass {
    /// `kubepods/pod<uid>` or `kubepods-pod<uid>.slice`.
    Guaranteed,
    /// `burstable`.
    Burstable,
    /// `besteffort`.
    BestEffort,
}

/// Who a cgroup belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct WorkloadId {
    /// The cgroup path relative to the v2 root, e.g. `/docker/3f2a...`.
    pub cgroup_path: String,
    /// What kind of workload the path names.
    pub kind: WorkloadKind,
}

/// The identity parsed from a cgroup path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WorkloadKind {
    /// A container, possibly inside a Kubernetes pod.
    Container {
        /// Runtime that created it.
        runtime: Runtime,
        /// Full container id (hex).
        container_id: String,
        /// Pod UID (dashed form) when the container is in a pod.
        pod_uid: Option<String>,
        /// QoS class when in a pod.
        qos: Option<QosClass>,
    },
    /// A pod's cgroup itself (pause process or a process placed at pod level).
    Pod {
        /// Pod UID (dashed form).
        pod_uid: String,
        /// QoS class.
        qos: QosClass,
    },
    /// A systemd service or scope (including services started by `gpushare-agent launch`).
    SystemdUnit {
        /// The unit name, e.g. `nginx.service`.
        unit: String,
    },
    /// Some other cgroup, named by its path.
    Cgroup,
    /// The root cgroup: the host itself, never a workload.
    Host,
}

impl WorkloadId {
    /// The stable string used in labels, quotas and the API: `docker://<id>`, `pod://<uid>`,
    /// `unit://<name>`, `cgroup://<path>`, `host`.
    pub fn key(&self) -> String {
        // Asked several times per task and per step: built with one allocation of the right size,
        // not through `format!`.
        let (scheme, id) = match &self.kind {
            WorkloadKind::Container {
                runtime,
                container_id,
                ..
            } => (runtime.as_str(), container_id.as_str()),
            WorkloadKind::Pod { pod_uid, .. } => ("pod", pod_uid.as_str()),
            WorkloadKind::SystemdUnit { unit } => ("unit", unit.as_str()),
            WorkloadKind::Cgroup => ("cgroup", self.cgroup_path.as_str()),
            WorkloadKind::Host => return "host".to_string(),
        };
        let mut key = String::with_capacity(scheme.len() + 3 + id.len());
        key.push_str(scheme);
        key.push_str("://");
        key.push_str(id);
        key
    }

    /// A short name for humans: the 12-character container id, the unit, or the path.
    pub fn short_name(&self) -> String {
        match &self.kind {
            WorkloadKind::Container { container_id, .. } => container_id.chars().take(12).collect(),
            WorkloadKind::Pod { pod_uid, .. } => format!("pod-{pod_uid}"),
            WorkloadKind::SystemdUnit { unit } => unit.clone(),
            WorkloadKind::Cgroup => self.cgroup_path.clone(),
            WorkloadKind::Host => "host".to_string(),
        }
    }

    /// The container id, if this is a container.
    pub fn container_id(&self) -> Option<&str> {
        match &self.kind {
            WorkloadKind::Container { container_id, .. } => Some(container_id),
            _ => None,
        }
    }

    /// The pod UID, if the workload is in a pod.
    pub fn pod_uid(&self) -> Option<&str> {
        match &self.kind {
            WorkloadKind::Container { pod_uid, .. } => pod_uid.as_deref(),
            WorkloadKind::Pod { pod_uid, .. } => Some(pod_uid),
            _ => None,
        }
    }

    /// Whether this is the host's root cgroup (never a workload of its own).
    pub fn is_host(&self) -> bool {
        self.kind == WorkloadKind::Host
    }
}

impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

/// Parses a cgroup v2 path (as in `/proc/<pid>/cgroup`'s `0::` line) into a workload identity,
/// whose `cgroup_path` is the workload's root (see the module note). Never fails: an unrecognised
/// path is a plain [`WorkloadKind::Cgroup`] rooted at the path itself.
pub fn parse_cgroup_path(path: &str) -> WorkloadId {
    let trimmed = path.trim();
    let normalized = if trimmed.is_empty() || trimmed == "/" {
        "/".to_string()
    } else {
        format!("/{}", trimmed.trim_matches('/'))
    };
    let (kind, depth) = parse_kind(&normalized);
    let root = match depth {
        Some(n) => {
            let comps: Vec<&str> = normalized.split('/').filter(|c| !c.is_empty()).collect();
            format!("/{}", comps[..n].join("/"))
        }
        None => normalized,
    };
    WorkloadId {
        cgroup_path: root,
        kind,
    }
}

/// The kind, and how many leading components make up the root (`None`: the whole path).
fn parse_kind(path: &str) -> (WorkloadKind, Option<usize>) {
    if path == "/" {
        return (WorkloadKind::Host, None);
    }
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut pod: Option<(String, QosClass, usize)> = None;
    for (i, comp) in components.iter().enumerate() {
        let parent = i.checked_sub(1).map(|j| components[j]);
        if pod.is_none()
            && let Some((uid, qos)) = pod_component(comp, parent)
        {
            pod = Some((uid, qos, i + 1));
            continue;
        }
        let pod_ref = pod.as_ref().map(|(u, q, _)| (u.clone(), *q));
        if let Some((runtime, container_id)) = container_component(comp, parent, &pod_ref) {
            return (
                WorkloadKind::Container {
                    runtime,
                    container_id,
                    pod_uid: pod.as_ref().map(|(u, _, _)| u.clone()),
                    qos: pod.as_ref().map(|(_, q, _)| *q),
                },
                Some(i + 1),
            );
        }
    }
    if let Some((pod_uid, qos, depth)) = pod {
        return (WorkloadKind::Pod { pod_uid, qos }, Some(depth));
    }
    for (i, comp) in components.iter().enumerate() {
        if (comp.ends_with(".service") || comp.ends_with(".scope")) && comp.len() > ".scope".len() {
            return (
                WorkloadKind::SystemdUnit {
                    unit: comp.to_string(),
                },
                Some(i + 1),
            );
        }
    }
    (WorkloadKind::Cgroup, None)
}

/// `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid_with_underscores>.slice` (systemd).
fn pod_component(comp: &str, parent: Option<&str>) -> Option<(String, QosClass)> {
    if let Some(rest) = comp.strip_prefix("kubepods-")
        && let Some(rest) = rest.strip_suffix(".slice")
    {
        let (qos, uid) = if let Some(uid) = rest.strip_prefix("burstable-pod") {
            (QosClass::Burstable, uid)
        } else if let Some(uid) = rest.strip_prefix("besteffort-pod") {
            (QosClass::BestEffort, uid)
        } else if let Some(uid) = rest.strip_prefix("pod") {
            (QosClass::Guaranteed, uid)
        } else {
            return None;
        };
        let uid = uid.replace('_', "-");
        return is_uid(&uid).then_some((uid, qos));
    }
    let uid = comp.strip_prefix("pod")?;
    if !is_uid(uid) {
        return None;
    }
    let qos = match parent {
        Some("burstable") => QosClass::Burstable,
        Some("besteffort") => QosClass::BestEffort,
        Some(p) if p.starts_with("kubepods") => QosClass::Guaranteed,
        _ => return None,
    };
    Some((uid.to_string(), qos))
}

/// A container component: `<runtime>-<id>.scope`, or a bare id under `docker` or under a pod.
fn container_component(
    comp: &str,
    parent: Option<&str>,
    pod: &Option<(String, QosClass)>,
) -> Option<(Runtime, String)> {
    if let Some(scope) = comp.strip_suffix(".scope") {
        for (prefix, runtime) in [
            ("docker-", Runtime::Docker),
            ("cri-containerd-", Runtime::Containerd),
            ("crio-", Runtime::Crio),
            ("libpod-", Runtime::Podman),
        ] {
            if let Some(id) = scope.strip_prefix(prefix)
                && is_container_id(id)
            {
                return Some((runtime, id.to_string()));
            }
        }
        return None;
    }
    if !is_container_id(comp) {
        return None;
    }
    match parent {
        Some("docker") => Some((Runtime::Docker, comp.to_string())),
        Some(p) if pod.is_some() && p.starts_with("pod") => {
            Some((Runtime::Unknown, comp.to_string()))
        }
        _ => None,
    }
}

/// Container ids are 64 lowercase hex digits (Docker, containerd, CRI-O, Podman all agree).
fn is_container_id(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A pod UID: 36 characters, hex and dashes in the 8-4-4-4-12 shape.
fn is_uid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";
    const UID: &str = "0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a";
    const UID_SYSTEMD: &str = "0f3d8e2a_6b1c_4d5e_9f7a_8b2c1d0e3f4a";

    fn container(runtime: Runtime, pod: Option<(&str, QosClass)>) -> WorkloadKind {
        WorkloadKind::Container {
            runtime,
            container_id: ID.into(),
            pod_uid: pod.map(|(u, _)| u.to_string()),
            qos: pod.map(|(_, q)| q),
        }
    }

    /// Real path shapes, as `/proc/<pid>/cgroup` shows them for each runtime and driver.
    #[test]
    fn parses_the_path_shapes_of_each_runtime_and_driver() {
        use QosClass::*;
        use Runtime::*;
        let cases: Vec<(String, WorkloadKind)> = vec![
            // Docker, cgroupfs driver (this machine) and systemd driver.
            (format!("/docker/{ID}"), container(Docker, None)),
            (
                format!("/system.slice/docker-{ID}.scope"),
                container(Docker, None),
            ),
            // A sub-cgroup a container made for itself still belongs to it.
            (format!("/docker/{ID}/init.scope"), container(Docker, None)),
            // containerd / CRI-O / Podman, systemd driver, outside Kubernetes.
            (
                format!("/system.slice/cri-containerd-{ID}.scope"),
                container(Containerd, None),
            ),
            (
                format!("/machine.slice/libpod-{ID}.scope"),
                container(Podman, None),
            ),
            // Kubernetes, systemd driver: underscores in the pod UID.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice/cri-containerd-{ID}.scope"
                ),
                container(Containerd, Some((UID, Burstable))),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_SYSTEMD}.slice/crio-{ID}.scope"
                ),
                container(Crio, Some((UID, BestEffort))),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/docker-{ID}.scope"),
                container(Docker, Some((UID, Guaranteed))),
            ),
            // Kubernetes, cgroupfs driver: dashes in the UID, bare container id.
            (
                format!("/kubepods/burstable/pod{UID}/{ID}"),
                container(Unknown, Some((UID, Burstable))),
            ),
            (
                format!("/kubepods/besteffort/pod{UID}/{ID}"),
                container(Unknown, Some((UID, BestEffort))),
            ),
            (
                format!("/kubepods/pod{UID}/{ID}"),
                container(Unknown, Some((UID, Guaranteed))),
            ),
            // The pod's own cgroup.
            (
                format!("/kubepods/burstable/pod{UID}"),
                WorkloadKind::Pod {
                    pod_uid: UID.into(),
                    qos: Burstable,
                },
            ),
            // systemd units.
            (
                "/system.slice/nginx.service".into(),
                WorkloadKind::SystemdUnit {
                    unit: "nginx.service".into(),
                },
            ),
            (
                "/user.slice/user-1000.slice/session-3.scope".into(),
                WorkloadKind::SystemdUnit {
                    unit: "session-3.scope".into(),
                },
            ),
            (
                "/gpushare.slice/train-1.scope".into(),
                WorkloadKind::SystemdUnit {
                    unit: "train-1.scope".into(),
                },
            ),
            // Anything else is a plain cgroup; the root is the host.
            ("/gpushare-test/a-1".into(), WorkloadKind::Cgroup),
            ("/".into(), WorkloadKind::Host),
            ("".into(), WorkloadKind::Host),
        ];
        for (path, want) in cases {
            assert_eq!(parse_cgroup_path(&path).kind, want, "path {path}");
        }
    }

    /// The workload is what the host's runtime created: a tenant's own sub-cgroups, nested
    /// containers and delegated units all resolve to the outer workload and its root.
    #[test]
    fn the_root_is_the_outermost_workload_component() {
        let other = "a".repeat(64);
        let cases: Vec<(String, String, &str)> = vec![
            // (path, root, key)
            (
                format!("/docker/{ID}/init.scope"),
                format!("/docker/{ID}"),
                "docker://",
            ),
            (
                format!("/docker/{ID}/system.slice/worker.service"),
                format!("/docker/{ID}"),
                "docker://",
            ),
            // Docker-in-Docker: the inner container is the tenant's; the outer one is the workload.
            (
                format!("/docker/{ID}/docker/{other}"),
                format!("/docker/{ID}"),
                "docker://",
            ),
            (
                format!("/system.slice/docker-{ID}.scope/init.scope"),
                format!("/system.slice/docker-{ID}.scope"),
                "docker://",
            ),
            (
                format!("/kubepods/burstable/pod{UID}/{ID}/sub"),
                format!("/kubepods/burstable/pod{UID}/{ID}"),
                "unknown://",
            ),
            (
                format!("/kubepods/burstable/pod{UID}/sub"),
                format!("/kubepods/burstable/pod{UID}"),
                "pod://",
            ),
            (
                "/system.slice/train.service/worker".into(),
                "/system.slice/train.service".into(),
                "unit://train.service",
            ),
            // A unit's delegated subtree may name units of its own: still the outer unit.
            (
                "/system.slice/hub.service/user-7.scope".into(),
                "/system.slice/hub.service".into(),
                "unit://hub.service",
            ),
            (
                "/gpushare-test/a/b".into(),
                "/gpushare-test/a/b".into(),
                "cgroup://",
            ),
        ];
        for (path, root, key) in cases {
            let w = parse_cgroup_path(&path);
            assert_eq!(w.cgroup_path, root, "root of {path}");
            assert!(w.key().starts_with(key), "key of {path}: {}", w.key());
            if key.ends_with("://") && key != "cgroup://" && key != "pod://" {
                assert!(w.key().ends_with(ID), "{path} names the outer container");
            }
        }
    }

    #[test]
    fn near_misses_are_not_containers_or_pods() {
        // Too short, upper case, or not hex: not a container id.
        for path in [
            "/docker/abc".to_string(),
            format!("/docker/{}", ID.to_uppercase()),
            format!("/docker/{}", &ID[..63]),
            format!("/system.slice/docker-{}x.scope", &ID[..63]),
            "/system.slice/docker.service".to_string(),
            format!("/somewhere/pod{UID}"),
            "/kubepods/burstable/podnot-a-uid".to_string(),
        ] {
            let kind = parse_cgroup_path(&path).kind;
            assert!(
                !matches!(
                    kind,
                    WorkloadKind::Container { .. } | WorkloadKind::Pod { .. }
                ),
                "{path} parsed as {kind:?}"
            );
        }
        assert_eq!(
            parse_cgroup_path("/system.slice/docker.service").kind,
            WorkloadKind::SystemdUnit {
                unit: "docker.service".into()
            }
        );
    }

    #[test]
    fn keys_are_stable_and_paths_normalised() {
        let w = parse_cgroup_path(&format!("docker/{ID}/"));
        assert_eq!(w.cgroup_path, format!("/docker/{ID}"));
        assert_eq!(w.key(), format!("docker://{ID}"));
        assert_eq!(w.short_name(), &ID[..12]);
        assert_eq!(parse_cgroup_path("/a/b").key(), "cgroup:///a/b");
        assert_eq!(parse_cgroup_path("/x/y.service").key(), "unit://y.service");
        assert!(parse_cgroup_path("/").is_host());
    }
}
