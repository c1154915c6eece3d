//! Which workloads a quota entry or a `protect` pattern names.
//!
//! Design note: a [`Selector`] is matched against a [`WorkloadMeta`]: the cgroup-derived
//! [`WorkloadId`] plus the names only Kubernetes or the runtime know (container name, pod namespace and
//! name), which may be unknown. A selector that needs an unknown name does not match.
//!
//! **Precedence by trust.** When several entries match one workload, the one whose selector is the
//! hardest to forge from inside the workload wins: container id (chosen by the runtime; longer prefix
//! first) > pod UID + container name > pod namespace/name + container name > pod UID > pod
//! namespace/name > bare container name > systemd unit > cgroup glob. A pod's UID is chosen by the
//! API server and its namespace by whoever may create pods there, but a container's name is chosen
//! by the pod's author: a bare `container_name` entry matches that name in every namespace, so it
//! must never outrank an entry that names the pod (else a pod under a small `pod_uid` quota could
//! name its container after a generous entry). A bare `container_name` is a convenience for
//! single-tenant nodes (Docker names are unique per host); `check` warns when such an entry
//! coexists with pod entries.
//!
//! Cgroup globs match the cgroup path; `*` stays within one path component, `**` crosses them.
//! `protect` patterns are globs over workload keys (`unit:///system.slice/sshd.service`,
//! `docker://3f2a*`, `cgroup:///system.slice/*.service`, where `*` crosses `/`), matched against the
//! workload's key, its `cgroup://<path>` form, in a pod `pod://<uid>`, and for a unit
//! `unit://<name>` (`unit://sshd.service`, the unit key before keys carried the path).

use globset::{Glob, GlobBuilder, GlobMatcher};

use crate::workload::{WorkloadId, WorkloadKind};

/// A workload as quota matching sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct WorkloadMeta {
    /// Identity from the cgroup path.
    pub id: WorkloadId,
    /// Container name (Kubernetes container name, or the runtime's name), when known.
    pub container_name: Option<String>,
    /// Pod namespace, when known.
    pub pod_namespace: Option<String>,
    /// Pod name, when known.
    pub pod_name: Option<String>,
}

impl WorkloadMeta {
    /// A workload known only by its cgroup.
    pub fn new(id: WorkloadId) -> Self {
        Self {
            id,
            container_name: None,
            pod_namespace: None,
            pod_name: None,
        }
    }

    /// The workload key (`docker://<id>`, `unit://<path>`, ...).
    pub fn key(&self) -> String {
        self.id.key()
    }

    fn is_container(&self) -> bool {
        matches!(self.id.kind, WorkloadKind::Container { .. })
    }
}

/// A pod, by UID or by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodRef {
    /// The pod UID (dashed, lowercase).
    Uid(String),
    /// `namespace/name`.
    Name {
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
    },
}

impl PodRef {
    fn matches(&self, w: &WorkloadMeta) -> bool {
        match self {
            Self::Uid(uid) => w.id.pod_uid() == Some(uid.as_str()),
            Self::Name { namespace, name } => {
                w.pod_namespace.as_deref() == Some(namespace.as_str())
                    && w.pod_name.as_deref() == Some(name.as_str())
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Uid(uid) => format!("pod_uid = \"{uid}\""),
            Self::Name { namespace, name } => format!("pod = \"{namespace}/{name}\""),
        }
    }
}

/// A compiled glob over cgroup paths or workload keys. Equal when the patterns are equal.
#[derive(Clone, Debug)]
pub struct PathGlob {
    pattern: String,
    matcher: GlobMatcher,
}

impl PathGlob {
    /// Compiles a cgroup-path glob (`*` within one component, `**` across).
    pub fn cgroup(pattern: &str) -> Result<Self, globset::Error> {
        let glob = GlobBuilder::new(pattern).literal_separator(true).build()?;
        Ok(Self {
            pattern: pattern.to_string(),
            matcher: glob.compile_matcher(),
        })
    }

    /// Compiles a workload-key glob (`*` matches anything, `/` included).
    pub fn key(pattern: &str) -> Result<Self, globset::Error> {
        let glob = Glob::new(pattern)?;
        Ok(Self {
            pattern: pattern.to_string(),
            matcher: glob.compile_matcher(),
        })
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether `s` matches.
    pub fn is_match(&self, s: &str) -> bool {
        self.matcher.is_match(s)
    }
}

impl PartialEq for PathGlob {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for PathGlob {}

impl serde::Serialize for PathGlob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.pattern)
    }
}

/// What a quota entry applies to.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selector {
    /// A container id or a prefix of at least 12 hex digits (lowercase).
    ContainerId(String),
    /// One container of one pod.
    PodContainer {
        /// The pod.
        pod: PodRef,
        /// The container's name in the pod spec.
        container_name: String,
    },
    /// Every container with this name (Docker names are unique per host).
    ContainerName(String),
    /// Every container of a pod, by pod UID; each container separately.
    PodUid(String),
    /// Every container of a pod, by `namespace/name`; each container separately.
    PodName {
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
    },
    /// A systemd unit, e.g. `train.service`.
    Unit(String),
    /// Every cgroup whose path matches the glob; each cgroup separately.
    Cgroup(PathGlob),
}

impl Selector {
    /// Whether this selector names the workload. The host's root cgroup is never named.
    pub fn matches(&self, w: &WorkloadMeta) -> bool {
        if w.id.is_host() {
            return false;
        }
        match self {
            Self::ContainerId(prefix) => {
                w.id.container_id()
                    .is_some_and(|id| id.starts_with(prefix.as_str()))
            }
            Self::PodContainer {
                pod,
                container_name,
            } => {
                w.is_container()
                    && pod.matches(w)
                    && w.container_name.as_deref() == Some(container_name.as_str())
            }
            Self::ContainerName(name) => {
                w.is_container() && w.container_name.as_deref() == Some(name.as_str())
            }
            Self::PodUid(uid) => PodRef::Uid(uid.clone()).matches(w),
            Self::PodName { namespace, name } => PodRef::Name {
                namespace: namespace.clone(),
                name: name.clone(),
            }
            .matches(w),
            Self::Unit(unit) => {
                matches!(&w.id.kind, WorkloadKind::SystemdUnit { unit: u } if u == unit)
            }
            Self::Cgroup(glob) => glob.is_match(&w.id.cgroup_path),
        }
    }

    /// Higher wins: `(tier, detail)`; see the module note.
    pub fn specificity(&self) -> (u8, usize) {
        match self {
            Self::ContainerId(prefix) => (8, prefix.len()),
            Self::PodContainer {
                pod: PodRef::Uid(_),
                ..
            } => (7, 0),
            Self::PodContainer {
                pod: PodRef::Name { .. },
                ..
            } => (6, 0),
            Self::PodUid(_) => (5, 0),
            Self::PodName { .. } => (4, 0),
            Self::ContainerName(_) => (3, 0),
            Self::Unit(_) => (2, 0),
            // An exact path (e.g. a `launch`ed service's own quota) beats any glob; among globs, the
            // longer literal prefix is the more specific.
            Self::Cgroup(glob) => {
                let p = glob.pattern();
                match p.find(['*', '?', '[', '{']) {
                    None => (1, usize::MAX),
                    Some(i) => (1, i),
                }
            }
        }
    }

    /// The selector as it is written in a quota file, e.g. `container = "3f2a9c8e7d6b"`.
    pub fn describe(&self) -> String {
        match self {
            Self::ContainerId(id) => format!("container = \"{id}\""),
            Self::PodContainer {
                pod,
                container_name,
            } => format!("{} container_name = \"{container_name}\"", pod.describe()),
            Self::ContainerName(name) => format!("container_name = \"{name}\""),
            Self::PodUid(uid) => PodRef::Uid(uid.clone()).describe(),
            Self::PodName { namespace, name } => format!("pod = \"{namespace}/{name}\""),
            Self::Unit(unit) => format!("unit = \"{unit}\""),
            Self::Cgroup(glob) => format!("cgroup = \"{}\"", glob.pattern()),
        }
    }
}

/// Key schemes a `protect` pattern may start with.
pub const KEY_SCHEMES: [&str; 8] = [
    "docker://",
    "containerd://",
    "crio://",
    "podman://",
    "unknown://",
    "pod://",
    "unit://",
    "cgroup://",
];

/// One entry of a `protect` list.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProtectPattern(pub PathGlob);

impl ProtectPattern {
    /// Whether the pattern covers the workload (by key, `cgroup://<path>`, `pod://<uid>`, or a
    /// unit's `unit://<name>`: the unit key of earlier versions, so a `protect` list written for
    /// them keeps protecting every unit of that name).
    pub fn matches(&self, w: &WorkloadMeta) -> bool {
        let glob = &self.0;
        glob.is_match(&w.key())
            || glob.is_match(&format!("cgroup://{}", w.id.cgroup_path))
            || w.id
                .pod_uid()
                .is_some_and(|uid| glob.is_match(&format!("pod://{uid}")))
            || matches!(&w.id.kind, WorkloadKind::SystemdUnit { unit }
                if glob.is_match(&format!("unit://{unit}")))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::workload::parse_cgroup_path;

    pub(in crate::quota) const ID: &str =
        "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";
    pub(in crate::quota) const UID: &str = "0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a";

    /// Container `main` of pod `ml/trainer-0` (the quota tests' workload too).
    pub(in crate::quota) fn pod_container() -> WorkloadMeta {
        WorkloadMeta {
            id: parse_cgroup_path(&format!("/kubepods/burstable/pod{UID}/{ID}")),
            container_name: Some("main".into()),
            pod_namespace: Some("ml".into()),
            pod_name: Some("trainer-0".into()),
        }
    }

    #[test]
    fn selectors_match_what_they_name() {
        let w = pod_container();
        let pod_name = PodRef::Name {
            namespace: "ml".into(),
            name: "trainer-0".into(),
        };
        let yes = [
            Selector::ContainerId(ID.into()),
            Selector::ContainerId(ID[..12].into()),
            Selector::PodContainer {
                pod: pod_name.clone(),
                container_name: "main".into(),
            },
            Selector::PodContainer {
                pod: PodRef::Uid(UID.into()),
                container_name: "main".into(),
            },
            Selector::ContainerName("main".into()),
            Selector::PodUid(UID.into()),
            Selector::PodName {
                namespace: "ml".into(),
                name: "trainer-0".into(),
            },
            Selector::Cgroup(PathGlob::cgroup("/kubepods/**").unwrap()),
        ];
        for s in &yes {
            assert!(s.matches(&w), "{s:?}");
        }
        let no = [
            Selector::ContainerId("3f2a9c8e7d6c".into()),
            Selector::PodContainer {
                pod: pod_name,
                container_name: "sidecar".into(),
            },
            Selector::ContainerName("sidecar".into()),
            Selector::PodName {
                namespace: "default".into(),
                name: "trainer-0".into(),
            },
            Selector::Unit("main.service".into()),
            // `*` does not cross `/`.
            Selector::Cgroup(PathGlob::cgroup("/kubepods/*").unwrap()),
        ];
        for s in &no {
            assert!(!s.matches(&w), "{s:?}");
        }
        // Unknown Kubernetes names never match name selectors.
        let bare = WorkloadMeta::new(w.id.clone());
        assert!(!Selector::ContainerName("main".into()).matches(&bare));
        assert!(Selector::PodUid(UID.into()).matches(&bare));
        // The host is never named, not even by `/**`.
        let host = WorkloadMeta::new(parse_cgroup_path("/"));
        assert!(!Selector::Cgroup(PathGlob::cgroup("/**").unwrap()).matches(&host));
        assert!(!Selector::Cgroup(PathGlob::cgroup("/").unwrap()).matches(&host));
        let unit = WorkloadMeta::new(parse_cgroup_path("/system.slice/train.service"));
        assert!(Selector::Unit("train.service".into()).matches(&unit));
    }

    /// Container-name selectors name containers only: a pod-level group carrying a container's
    /// name in its metadata is not that container.
    #[test]
    fn container_name_selectors_name_containers_only() {
        let pod_level = WorkloadMeta {
            id: parse_cgroup_path(&format!("/kubepods/burstable/pod{UID}")),
            ..pod_container()
        };
        assert!(Selector::PodUid(UID.into()).matches(&pod_level));
        assert!(!Selector::ContainerName("main".into()).matches(&pod_level));
        let by_pod = Selector::PodContainer {
            pod: PodRef::Uid(UID.into()),
            container_name: "main".into(),
        };
        assert!(!by_pod.matches(&pod_level));
    }

    /// A selector reads as it is written in a quota file (the duplicate-entry error and a
    /// quota's source in `status` quote it).
    #[test]
    fn selectors_describe_themselves_as_written() {
        let by_name = PodRef::Name {
            namespace: "ml".into(),
            name: "trainer-0".into(),
        };
        let cases = [
            (
                Selector::PodContainer {
                    pod: PodRef::Uid(UID.into()),
                    container_name: "main".into(),
                },
                format!("pod_uid = \"{UID}\" container_name = \"main\""),
            ),
            (
                Selector::PodContainer {
                    pod: by_name,
                    container_name: "main".into(),
                },
                "pod = \"ml/trainer-0\" container_name = \"main\"".to_string(),
            ),
            (Selector::PodUid(UID.into()), format!("pod_uid = \"{UID}\"")),
        ];
        for (s, want) in cases {
            assert_eq!(s.describe(), want);
        }
    }

    /// Globs are equal when their patterns are (selectors and protect patterns compare so).
    #[test]
    fn globs_are_equal_when_their_patterns_are() {
        let a = PathGlob::cgroup("/kubepods/*").unwrap();
        assert_eq!(a, PathGlob::cgroup("/kubepods/*").unwrap());
        assert_ne!(a, PathGlob::cgroup("/kubepods/**").unwrap());
        assert_ne!(
            Selector::Cgroup(a),
            Selector::Cgroup(PathGlob::cgroup("/docker/*").unwrap())
        );
    }

    #[test]
    fn an_exact_cgroup_path_beats_globs_and_longer_prefixes_beat_shorter() {
        let exact = Selector::Cgroup(PathGlob::cgroup("/gpushare.slice/train.scope").unwrap());
        let narrow = Selector::Cgroup(PathGlob::cgroup("/gpushare.slice/*").unwrap());
        let broad = Selector::Cgroup(PathGlob::cgroup("/**").unwrap());
        assert!(exact.specificity() > narrow.specificity());
        assert!(narrow.specificity() > broad.specificity());
        assert!(Selector::Unit("x.service".into()).specificity() > exact.specificity());
    }

    #[test]
    fn precedence_follows_how_hard_a_selector_is_to_forge() {
        // Container id (the runtime's), then pod UID + container name, then pod namespace/name +
        // container name, then the rest; a bare container name (which a pod's author chooses)
        // below every pod selector.
        let ordered = [
            Selector::ContainerId(ID.into()),
            Selector::ContainerId(ID[..12].into()),
            Selector::PodContainer {
                pod: PodRef::Uid(UID.into()),
                container_name: "main".into(),
            },
            Selector::PodContainer {
                pod: PodRef::Name {
                    namespace: "a".into(),
                    name: "b".into(),
                },
                container_name: "main".into(),
            },
            Selector::PodUid(UID.into()),
            Selector::PodName {
                namespace: "a".into(),
                name: "b".into(),
            },
            Selector::ContainerName("main".into()),
            Selector::Unit("x.service".into()),
            Selector::Cgroup(PathGlob::cgroup("/**").unwrap()),
        ];
        for pair in ordered.windows(2) {
            assert!(pair[0].specificity() > pair[1].specificity(), "{pair:?}");
        }
    }

    #[test]
    fn protect_patterns_match_keys_paths_and_pods() {
        let w = pod_container();
        let p = |s: &str| ProtectPattern(PathGlob::key(s).unwrap());
        assert!(p(&format!("pod://{UID}")).matches(&w));
        assert!(p("unknown://3f2a*").matches(&w));
        assert!(p("cgroup:///kubepods/*").matches(&w));
        assert!(!p("docker://*").matches(&w));
        let unit = WorkloadMeta::new(parse_cgroup_path("/system.slice/sshd.service"));
        assert!(p("unit://sshd.service").matches(&unit));
        assert!(p("unit:///system.slice/sshd.service").matches(&unit));
        assert!(p("cgroup:///system.slice/*").matches(&unit));
        assert!(!p("unit://ssh.service").matches(&unit));
        assert!(!p("unit:///other.slice/sshd.service").matches(&unit));
        // The unit's name form is for units only: a plain cgroup of that name is not a unit.
        let plain = WorkloadMeta::new(parse_cgroup_path("/jobs/sshd"));
        assert!(!p("unit://sshd").matches(&plain));
    }
}
