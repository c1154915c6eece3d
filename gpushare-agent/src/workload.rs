//! cgroup path -> workload identity and the workload's *root* cgroup. Pure string parsing, no I/O.
//!
//! **A workload is who its runtime says it is.** A container or pod identity is taken only where
//! its runtime places its groups ([`Placement`]): Docker right below its cgroup parent (`/docker`)
//! or `/system.slice`, containerd, CRI-O and Podman scopes in `/system.slice` or `/machine.slice`,
//! pods and their containers under the kubelet's `kubepods` root. Anywhere else a name shaped like
//! a container (`.../docker/<id>`, `libpod-<id>.scope` in a user's manager, Docker in an LXD guest)
//! is only a group some tenant made: it belongs to the outer workload (its unit, or the plain
//! path), whose quota keeps applying, and proves nothing (container ids and pod UIDs are public).
//! The agent also checks the runtime's record of the id where it can read one
//! (`attribution::identity`); this module only parses.
//!
//! The workload is what the operator's runtime created on the host, never something created inside
//! it: the container at its runtime's place names the container (its own sub-cgroups, an init or
//! systemd inside it, Docker-in-Docker's inner containers all belong to it), and otherwise the
//! **outermost** systemd unit names the unit (a unit's delegated subtree belongs to it). The root is
//! the path up to and including that component; isolation acts on the root, so on the whole
//! workload. A tenant can create cgroups only below its own root, so nothing it creates can change
//! which workload it is or move the root.
//!
//! Recognised shapes (at the standard places):
//! - Docker: `/docker/<64 hex>` (cgroupfs driver), `/system.slice/docker-<id>.scope` (systemd driver)
//! - containerd: `/system.slice/cri-containerd-<id>.scope`; Podman: `/machine.slice/libpod-<id>.scope`;
//!   CRI-O: `crio-<id>.scope`
//! - Kubernetes pods: `/kubepods[/<qos>]/pod<uid>/<container id>` (cgroupfs driver) and
//!   `/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid with _>.slice/<runtime>-<id>.scope`
//!   (systemd driver)
//! - systemd units: the outermost component ending in `.service` or `.scope`, keyed by its path
//!   (`unit:///system.slice/nginx.service`)
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
    /// `unit://<root path>` (e.g. `unit:///system.slice/nginx.service`), `cgroup://<path>`, `host`.
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
            // Units by their full path: equal unit names under different roots (a `launch`ed
            // `session-2.scope` and logind's) are two workloads.
            WorkloadKind::SystemdUnit { .. } => ("unit", self.cgroup_path.as_str()),
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
        let (prefix, rest) = self.short_name_parts();
        let mut name = String::with_capacity(prefix.len() + rest.len());
        name.push_str(prefix);
        name.push_str(rest);
        name
    }

    /// [`Self::short_name`] in two borrowed parts, a fixed prefix and a part of the identity:
    /// to compare a name without building it.
    pub fn short_name_parts(&self) -> (&'static str, &str) {
        match &self.kind {
            WorkloadKind::Container { container_id, .. } => {
                let end = container_id
                    .char_indices()
                    .nth(12)
                    .map_or(container_id.len(), |(i, _)| i);
                ("", &container_id[..end])
            }
            WorkloadKind::Pod { pod_uid, .. } => ("pod-", pod_uid),
            WorkloadKind::SystemdUnit { unit } => ("", unit),
            WorkloadKind::Cgroup => ("", &self.cgroup_path),
            WorkloadKind::Host => ("host", ""),
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

/// Where each container runtime places its groups: a container or pod identity is taken only
/// there (see the module note). The standard places are [`Placement::default`]; the agent adds
/// what the runtimes' own configuration names (Docker's `cgroup-parent`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Docker's cgroup parents for the cgroupfs driver (`/docker`, or its `cgroup-parent`): a
    /// container is `<parent>/<64 hex>` right below one.
    pub docker_parents: Vec<String>,
    /// The slices systemd-driver runtimes put `<runtime>-<id>.scope` in outside Kubernetes
    /// (`/system.slice` for Docker and containerd, `/machine.slice` for Podman and CRI-O).
    pub scope_slices: Vec<String>,
    /// The kubelet's `--cgroup-root` (`/` by default), under which `kubepods` (cgroupfs driver)
    /// or `kubepods.slice` (systemd driver) is.
    pub kube_root: String,
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            docker_parents: vec!["/docker".into()],
            scope_slices: vec!["/system.slice".into(), "/machine.slice".into()],
            kube_root: "/".into(),
        }
    }
}

impl Placement {
    /// The standard places, with `docker_parent` (Docker's configured `cgroup-parent`, when it is
    /// a cgroupfs path) added.
    pub fn with_docker_parent(docker_parent: Option<&str>) -> Self {
        let mut p = Self::default();
        if let Some(parent) = docker_parent {
            let parent = normalize(parent);
            if parent != "/" && !parent.ends_with(".slice") && !p.docker_parents.contains(&parent) {
                p.docker_parents.push(parent);
            }
        }
        p
    }
}

fn normalize(path: &str) -> String {
    format!("/{}", path.trim().trim_matches('/'))
}

fn components(path: &str) -> Vec<&str> {
    path.split('/').filter(|c| !c.is_empty()).collect()
}

/// Parses a cgroup v2 path (as in `/proc/<pid>/cgroup`'s `0::` line) into a workload identity,
/// whose `cgroup_path` is the workload's root (see the module note), with the standard
/// [`Placement`]. Never fails: an unrecognised path is a plain [`WorkloadKind::Cgroup`] rooted at
/// the path itself.
pub fn parse_cgroup_path(path: &str) -> WorkloadId {
    parse_cgroup_path_in(path, &Placement::default())
}

/// [`parse_cgroup_path`] with the runtimes' places as configured on this node.
pub fn parse_cgroup_path_in(path: &str, placement: &Placement) -> WorkloadId {
    let normalized = normalize(path);
    let (kind, depth) = match runtime_kind(&normalized, placement) {
        Some((kind, depth)) => (kind, Some(depth)),
        None => unit_kind(&normalized),
    };
    WorkloadId {
        cgroup_path: root_of(&normalized, depth),
        kind,
    }
}

/// The identity `path` has when no runtime vouches for it: the outermost systemd unit, or the
/// plain path. Used for a group whose runtime record names another group.
pub fn parse_without_runtime(path: &str) -> WorkloadId {
    let normalized = normalize(path);
    let (kind, depth) = unit_kind(&normalized);
    WorkloadId {
        cgroup_path: root_of(&normalized, depth),
        kind,
    }
}

/// The first group below the workload's root `root` on the way to `leaf` whose name is shaped
/// like a container or a pod (`docker-<id>.scope`, `<64 hex>`, `pod<uid>`, `kubepods...`): a
/// container nested in the workload (rootless Podman in a user's manager, Docker in an LXD
/// guest), which belongs to the outer workload.
pub fn nested_container(leaf: &str, root: &str) -> Option<String> {
    // The common case, asked per workload per step: a workload's processes in its root group,
    // below which nothing is nested.
    if leaf == root {
        return None;
    }
    let leaf = normalize(leaf);
    let root = normalize(root);
    let below = if root == "/" {
        leaf.as_str()
    } else {
        leaf.strip_prefix(root.as_str())
            .filter(|rest| rest.starts_with('/'))?
    };
    let mut path = if root == "/" { String::new() } else { root };
    for comp in components(below) {
        path.push('/');
        path.push_str(comp);
        if scope_container(comp).is_some()
            || is_container_id(comp)
            || comp.starts_with("kubepods")
            || comp.strip_prefix("pod").is_some_and(is_uid)
        {
            return Some(path);
        }
    }
    None
}

fn root_of(normalized: &str, depth: Option<usize>) -> String {
    match depth {
        Some(n) => format!("/{}", components(normalized)[..n].join("/")),
        None => normalized.to_string(),
    }
}

/// A container or pod at its runtime's place, and how many leading components its root has.
fn runtime_kind(path: &str, placement: &Placement) -> Option<(WorkloadKind, usize)> {
    let comps = components(path);
    if let Some(found) = kube_kind(&comps, placement) {
        return Some(found);
    }
    for parent in &placement.docker_parents {
        let pc = components(parent);
        if let Some(&comp) = comps.get(pc.len())
            && comps.starts_with(&pc)
            && !pc.is_empty()
            && is_container_id(comp)
        {
            let kind = WorkloadKind::Container {
                runtime: Runtime::Docker,
                container_id: comp.to_string(),
                pod_uid: None,
                qos: None,
            };
            return Some((kind, pc.len() + 1));
        }
    }
    for slice in &placement.scope_slices {
        let sc = components(slice);
        if let Some(&comp) = comps.get(sc.len())
            && comps.starts_with(&sc)
            && let Some((runtime, container_id)) = scope_container(comp)
        {
            let kind = WorkloadKind::Container {
                runtime,
                container_id,
                pod_uid: None,
                qos: None,
            };
            return Some((kind, sc.len() + 1));
        }
    }
    None
}

/// A pod (and its container) under the kubelet's root: `kubepods[/<qos>]/pod<uid>[/<id>]`
/// (cgroupfs driver) or `kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid>.slice
/// [/<runtime>-<id>.scope]` (systemd driver).
fn kube_kind(comps: &[&str], placement: &Placement) -> Option<(WorkloadKind, usize)> {
    let rc = components(&placement.kube_root);
    if !comps.starts_with(&rc) {
        return None;
    }
    let mut i = rc.len();
    let (uid, qos) = match *comps.get(i)? {
        "kubepods" => {
            i += 1;
            let qos = match *comps.get(i)? {
                "burstable" => Some(QosClass::Burstable),
                "besteffort" => Some(QosClass::BestEffort),
                _ => None,
            };
            if qos.is_some() {
                i += 1;
            }
            let uid = comps.get(i)?.strip_prefix("pod").filter(|u| is_uid(u))?;
            (uid.to_string(), qos.unwrap_or(QosClass::Guaranteed))
        }
        "kubepods.slice" => {
            i += 1;
            let qos = match *comps.get(i)? {
                "kubepods-burstable.slice" => Some((QosClass::Burstable, "kubepods-burstable-pod")),
                "kubepods-besteffort.slice" => {
                    Some((QosClass::BestEffort, "kubepods-besteffort-pod"))
                }
                _ => None,
            };
            if qos.is_some() {
                i += 1;
            }
            let (qos, prefix) = qos.unwrap_or((QosClass::Guaranteed, "kubepods-pod"));
            let uid = comps
                .get(i)?
                .strip_prefix(prefix)?
                .strip_suffix(".slice")?
                .replace('_', "-");
            if !is_uid(&uid) {
                return None;
            }
            (uid, qos)
        }
        _ => return None,
    };
    i += 1;
    let container = comps.get(i).and_then(|&comp| {
        scope_container(comp)
            .or_else(|| is_container_id(comp).then(|| (Runtime::Unknown, comp.to_string())))
    });
    Some(match container {
        Some((runtime, container_id)) => (
            WorkloadKind::Container {
                runtime,
                container_id,
                pod_uid: Some(uid),
                qos: Some(qos),
            },
            i + 1,
        ),
        None => (WorkloadKind::Pod { pod_uid: uid, qos }, i),
    })
}

/// The outermost systemd unit, else the plain path (`None`: rooted at the whole path).
fn unit_kind(path: &str) -> (WorkloadKind, Option<usize>) {
    if path == "/" {
        return (WorkloadKind::Host, None);
    }
    for (i, comp) in components(path).iter().enumerate() {
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

/// `<runtime>-<id>.scope`.
fn scope_container(comp: &str) -> Option<(Runtime, String)> {
    let scope = comp.strip_suffix(".scope")?;
    [
        ("docker-", Runtime::Docker),
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::Crio),
        ("libpod-", Runtime::Podman),
    ]
    .into_iter()
    .find_map(|(prefix, runtime)| {
        scope
            .strip_prefix(prefix)
            .filter(|id| is_container_id(id))
            .map(|id| (runtime, id.to_string()))
    })
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
                "unit:///system.slice/train.service",
            ),
            // A unit's delegated subtree may name units of its own: still the outer unit.
            (
                "/system.slice/hub.service/user-7.scope".into(),
                "/system.slice/hub.service".into(),
                "unit:///system.slice/hub.service",
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
            // Hex, but too short; 36 characters, but not a UID.
            "/kubepods/podabc".to_string(),
            format!("/kubepods/pod{}", "x".repeat(36)),
            format!("/kubepods/pod{}", UID.replace('-', "0")),
            // A container id one level below the top that is not Docker's parent.
            format!("/a/{ID}"),
            format!("/{ID}"),
            // A scope with no name.
            "/a/.scope".to_string(),
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
        assert_eq!(
            parse_cgroup_path("/x/y.service").key(),
            "unit:///x/y.service"
        );
        assert_eq!(parse_cgroup_path("/x/y.service").short_name(), "y.service");
        assert_eq!(parse_cgroup_path("/a/.scope").kind, WorkloadKind::Cgroup);
        assert_eq!(parse_cgroup_path("/a/b.scope").key(), "unit:///a/b.scope");
        assert!(parse_cgroup_path("/").is_host());
        assert_eq!(w.to_string(), w.key());
        let pod = parse_cgroup_path(&format!("/kubepods/pod{UID}"));
        assert_eq!(pod.pod_uid(), Some(UID));
        assert_eq!(pod.container_id(), None);
    }

    /// A container- or pod-shaped name away from its runtime's place is a group a tenant made:
    /// it belongs to the outer workload (the unit, or the plain path), never to the container
    /// or pod it names.
    #[test]
    fn container_shapes_outside_their_runtime_place_belong_to_the_outer_workload() {
        let cases: Vec<(String, &str, WorkloadKind)> = vec![
            // (path, root, kind)
            (
                format!("/system.slice/tenant.service/docker/{ID}"),
                "/system.slice/tenant.service",
                WorkloadKind::SystemdUnit {
                    unit: "tenant.service".into(),
                },
            ),
            (
                format!("/system.slice/tenant.service/kubepods/pod{UID}/{ID}"),
                "/system.slice/tenant.service",
                WorkloadKind::SystemdUnit {
                    unit: "tenant.service".into(),
                },
            ),
            (
                format!("/system.slice/tenant.service/kubepods/burstable/pod{UID}"),
                "/system.slice/tenant.service",
                WorkloadKind::SystemdUnit {
                    unit: "tenant.service".into(),
                },
            ),
            // Rootless Podman: the user's manager is the workload.
            (
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
                ),
                "/user.slice/user-1000.slice/user@1000.service",
                WorkloadKind::SystemdUnit {
                    unit: "user@1000.service".into(),
                },
            ),
            // systemd-nspawn payloads and LXD guests.
            (
                format!("/machine.slice/machine-guest.scope/payload/docker/{ID}"),
                "/machine.slice/machine-guest.scope",
                WorkloadKind::SystemdUnit {
                    unit: "machine-guest.scope".into(),
                },
            ),
            (
                format!("/lxc.payload.c1/docker/{ID}"),
                "/lxc.payload.c1/docker/3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f",
                WorkloadKind::Cgroup,
            ),
            // A scope shaped like a container's, but not in a runtime's slice: a unit.
            (
                format!("/gpushare-test/cri-containerd-{ID}.scope"),
                "/gpushare-test/cri-containerd-3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f.scope",
                WorkloadKind::SystemdUnit {
                    unit: format!("cri-containerd-{ID}.scope"),
                },
            ),
            // Docker's parent must be the top of the hierarchy, not a group of that name.
            (
                format!("/jobs/docker/{ID}"),
                "/jobs/docker/3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f",
                WorkloadKind::Cgroup,
            ),
            // A scope one level too deep in a runtime's slice.
            (
                format!("/system.slice/x/docker-{ID}.scope"),
                "/system.slice/x/docker-3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f.scope",
                WorkloadKind::SystemdUnit {
                    unit: format!("docker-{ID}.scope"),
                },
            ),
            // A pod slice under the wrong QoS slice, or a container one level too deep in a pod.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{UID_SYSTEMD}.slice"
                ),
                "/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod0f3d8e2a_6b1c_4d5e_9f7a_8b2c1d0e3f4a.slice",
                WorkloadKind::Cgroup,
            ),
            (
                format!("/kubepods/pod{UID}/x/{ID}"),
                "/kubepods/pod0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a",
                WorkloadKind::Pod {
                    pod_uid: UID.into(),
                    qos: QosClass::Guaranteed,
                },
            ),
        ];
        for (path, root, kind) in cases {
            let w = parse_cgroup_path(&path);
            assert_eq!(w.kind, kind, "kind of {path}");
            assert_eq!(w.cgroup_path, root, "root of {path}");
        }
    }

    #[test]
    fn the_kubelet_root_and_dockers_cgroup_parent_move_the_runtime_places() {
        let p = Placement {
            kube_root: "/k8s".into(),
            ..Placement::with_docker_parent(Some("/ci/docker"))
        };
        let at = |path: &str| parse_cgroup_path_in(path, &p);
        assert_eq!(
            at(&format!("/ci/docker/{ID}")).key(),
            format!("docker://{ID}")
        );
        assert_eq!(
            at(&format!("/ci/docker/{ID}")).cgroup_path,
            format!("/ci/docker/{ID}")
        );
        assert_eq!(at(&format!("/docker/{ID}")).key(), format!("docker://{ID}"));
        assert_eq!(
            at(&format!("/k8s/kubepods/pod{UID}")).key(),
            format!("pod://{UID}")
        );
        assert_eq!(
            at(&format!("/k8s/kubepods/pod{UID}")).cgroup_path,
            format!("/k8s/kubepods/pod{UID}")
        );
        assert_eq!(
            at(&format!("/kubepods/pod{UID}")).kind,
            WorkloadKind::Cgroup
        );
        // A systemd slice as Docker's parent is the systemd driver's, not a cgroupfs parent; `/`
        // would make every top-level id a container.
        assert_eq!(
            Placement::with_docker_parent(Some("docker.slice")),
            Placement::default()
        );
        assert_eq!(
            Placement::with_docker_parent(Some("/")),
            Placement::default()
        );
        assert_eq!(
            Placement::with_docker_parent(Some("/docker/")),
            Placement::default()
        );
        assert_eq!(Placement::with_docker_parent(None), Placement::default());
        // A root parent, had it been configured, never makes a top-level id a container.
        let root_parent = Placement {
            docker_parents: vec!["/".into()],
            ..Placement::default()
        };
        assert_eq!(
            parse_cgroup_path_in(&format!("/{ID}"), &root_parent).kind,
            WorkloadKind::Cgroup
        );
    }

    #[test]
    fn a_group_made_by_a_runtime_place_is_not_rooted_by_it() {
        // The root cannot be parsed back out of a container id that is only a parent's name.
        assert_eq!(parse_cgroup_path("/docker").kind, WorkloadKind::Cgroup);
        assert_eq!(
            parse_cgroup_path("/kubepods/burstable").kind,
            WorkloadKind::Cgroup
        );
        assert_eq!(
            parse_cgroup_path("/kubepods.slice").kind,
            WorkloadKind::Cgroup
        );
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/pod{UID}")).kind,
            WorkloadKind::Pod {
                pod_uid: UID.into(),
                qos: QosClass::Guaranteed
            }
        );
    }

    #[test]
    fn nested_containers_are_found_below_the_root_only() {
        let root = "/user.slice/user-1000.slice/user@1000.service";
        let leaf = format!("{root}/user.slice/libpod-{ID}.scope/container");
        assert_eq!(
            nested_container(&leaf, root),
            Some(format!("{root}/user.slice/libpod-{ID}.scope"))
        );
        assert_eq!(
            nested_container(&format!("/lxc.payload.c1/docker/{ID}"), "/lxc.payload.c1"),
            Some(format!("/lxc.payload.c1/docker/{ID}"))
        );
        assert_eq!(
            nested_container(&format!("/t.service/kubepods/pod{UID}"), "/t.service"),
            Some("/t.service/kubepods".into())
        );
        assert_eq!(
            nested_container(&format!("/t.service/x/pod{UID}/y"), "/t.service"),
            Some(format!("/t.service/x/pod{UID}"))
        );
        assert_eq!(
            nested_container(&format!("/a/{ID}"), "/"),
            Some(format!("/a/{ID}"))
        );
        assert_eq!(nested_container("/t.service/worker", "/t.service"), None);
        assert_eq!(nested_container("/t.service", "/t.service"), None);
        // A sibling whose name only starts like the root is not below it.
        assert_eq!(
            nested_container(&format!("/t.service2/docker/{ID}"), "/t.service"),
            None
        );
        assert_eq!(nested_container("/t.service/podx", "/t.service"), None);
    }
}
