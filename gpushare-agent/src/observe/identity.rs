//! A workload is who its runtime says it is: the runtime's own record of a container confirms
//! the group the path parser ([`crate::workload`]) placed it in, and one identity has one root.
//!
//! Design note: the parser takes a container or pod identity only at its runtime's place, which
//! only root and the runtime can write to. Where the runtime keeps a record of the container, that
//! record must also name the group observed: Docker's `hostconfig.json` (`CgroupParent`, empty for
//! the daemon's default, `/docker` or `system.slice`), an OCI bundle's `config.json`
//! (`linux.cgroupsPath`, containerd, CRI-O, Podman, Docker's `moby` bundles). A record merely
//! existing proves nothing, since the ids are public: a record naming another group means the
//! observed group is not that container ([`Verdict::Elsewhere`]), and it is identified as if no
//! runtime had placed it (its unit, or its path). Where no record can be read (another runtime, the
//! agent without the host's `/run` or Docker's data root, a pod, which has no record of its own),
//! the identity rests on placement alone and is reported `degraded` ([`Identity::Placement`]).
//!
//! **One identity, one root.** When two roots claim one key in a step, neither is that workload:
//! both are plain cgroups at their roots ([`Identity::Conflict`]), so only quotas naming a path
//! apply to them, and none of the identity's quota, environment quota, names or protection.
//!
//! Records are read once per workload (at most every 10 s while none is found) and cached while
//! the workload lives; each read is one bounded file ([`docker::MAX_CONFIG_BYTES`]).

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use crate::grants::env_quotas::runtime_spec::{SpecKind, SpecRoots, spec_candidates};
use crate::{
    attribution::docker::MAX_CONFIG_BYTES,
    workload::{Runtime, WorkloadId, WorkloadKind},
};

/// How often a workload whose record could not be read is looked up again.
const RETRY: Duration = Duration::from_secs(10);

/// What a workload's identity rests on (the `identity` field of the API, a line in `status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// The runtime's record names the group observed.
    Runtime,
    /// Placement alone: no record could be read (degraded).
    Placement,
    /// Two roots claimed one identity; neither has it.
    Conflict,
}

impl Identity {
    /// Label value: `runtime`, `degraded`, `conflict`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runtime => "runtime",
            Self::Placement => "degraded",
            Self::Conflict => "conflict",
        }
    }
}

/// What a container's runtime record says about the group observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The record names this group.
    Confirmed,
    /// No record could be read.
    NoRecord,
    /// The record names another group (the path given).
    Elsewhere(String),
}

/// Reads and caches runtime records (see the module note).
pub struct RuntimeRecords {
    roots: SpecRoots,
    cache: HashMap<(String, String), (Verdict, Instant)>,
    reads: u64,
    retry: Duration,
}

impl RuntimeRecords {
    /// Over the runtime state found under `roots`.
    pub fn new(roots: SpecRoots) -> Self {
        Self {
            roots,
            cache: HashMap::new(),
            reads: 0,
            retry: RETRY,
        }
    }

    /// Looks a workload without a confirming record up again after `retry` (tests).
    pub fn with_retry(mut self, retry: Duration) -> Self {
        self.retry = retry;
        self
    }

    /// Record files read so far (for tests: a cached verdict costs none).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// What the runtime's record says about container `id` at its root; `None` for anything
    /// that is not a container.
    pub fn check(&mut self, id: &WorkloadId) -> Option<Verdict> {
        let WorkloadKind::Container {
            runtime,
            container_id,
            ..
        } = &id.kind
        else {
            return None;
        };
        let k = (id.key(), id.cgroup_path.clone());
        if let Some((v, at)) = self.cache.get(&k)
            && (*v == Verdict::Confirmed || at.elapsed() < self.retry)
        {
            return Some(v.clone());
        }
        let (verdict, reads) = record_verdict(&self.roots, *runtime, container_id, &id.cgroup_path);
        self.reads += reads;
        self.cache.insert(k, (verdict.clone(), Instant::now()));
        Some(verdict)
    }

    /// Forgets the records of every key not in `live`.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.cache.retain(|(k, _), _| live(k));
    }
}

/// The verdict of the first record found for container `cid` of `runtime`, and how many files
/// were read.
fn record_verdict(roots: &SpecRoots, runtime: Runtime, cid: &str, root: &str) -> (Verdict, u64) {
    let mut reads = 0;
    for (kind, path) in spec_candidates(roots, runtime, cid) {
        let file = match kind {
            SpecKind::DockerConfig => match path.parent() {
                Some(dir) => dir.join("hostconfig.json"),
                None => continue,
            },
            SpecKind::OciBundle => path,
        };
        let Some(bytes) = read_small(&file) else {
            continue;
        };
        reads += 1;
        let wanted = match kind {
            SpecKind::DockerConfig => docker_cgroups(&bytes, cid),
            SpecKind::OciBundle => oci_cgroup(&bytes),
        };
        let Some(wanted) = wanted else { continue };
        let verdict = if wanted.iter().any(|w| w == root) {
            Verdict::Confirmed
        } else {
            Verdict::Elsewhere(wanted.first().cloned().unwrap_or_default())
        };
        return (verdict, reads);
    }
    (Verdict::NoRecord, reads)
}

fn read_small(path: &Path) -> Option<Vec<u8>> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_CONFIG_BYTES {
        return None;
    }
    std::fs::read(path).ok()
}

/// The groups Docker's `hostconfig.json` puts container `cid` in: below its `CgroupParent` (the
/// cgroupfs driver: `<parent>/<id>`; the systemd driver, a `.slice` parent:
/// `<slice path>/docker-<id>.scope`), or at the daemon's default (`/docker/<id>` or
/// `/system.slice/docker-<id>.scope`). `None` for a file that is not a host config.
pub fn docker_cgroups(bytes: &[u8], cid: &str) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct HostConfig {
        #[serde(rename = "CgroupParent", default)]
        cgroup_parent: Option<String>,
    }
    let hc: HostConfig = serde_json::from_slice(bytes).ok()?;
    let parent = hc.cgroup_parent.unwrap_or_default();
    let scope = format!("docker-{cid}.scope");
    Some(if parent.is_empty() {
        vec![format!("/docker/{cid}"), format!("/system.slice/{scope}")]
    } else if parent.ends_with(".slice") && !parent.contains('/') {
        vec![format!("{}/{scope}", slice_path(&parent))]
    } else {
        vec![format!("/{}/{cid}", parent.trim_matches('/'))]
    })
}

/// The group an OCI runtime config's `linux.cgroupsPath` names: an absolute path as it is, or the
/// systemd form `<slice>:<prefix>:<name>` as `<slice path>/<prefix>-<name>.scope`. `None` for a
/// file that is not an OCI config or names no group.
pub fn oci_cgroup(bytes: &[u8]) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Config {
        linux: Option<Linux>,
    }
    #[derive(serde::Deserialize)]
    struct Linux {
        #[serde(rename = "cgroupsPath")]
        cgroups_path: Option<String>,
    }
    let cfg: Config = serde_json::from_slice(bytes).ok()?;
    let p = cfg.linux?.cgroups_path?;
    if p.starts_with('/') {
        let trimmed = p.trim_end_matches('/');
        return Some(vec![if trimmed.is_empty() {
            "/".into()
        } else {
            trimmed.into()
        }]);
    }
    let mut parts = p.splitn(3, ':');
    let (slice, prefix, name) = (parts.next()?, parts.next()?, parts.next()?);
    let scope = if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}-{name}.scope")
    };
    let slice = if slice.is_empty() {
        "system.slice"
    } else {
        slice
    };
    Some(vec![format!("{}/{scope}", slice_path(slice))])
}

/// Where systemd puts a slice: `a-b-c.slice` is `/a.slice/a-b.slice/a-b-c.slice`; `-.slice` is
/// the root.
pub fn slice_path(slice: &str) -> String {
    let Some(stem) = slice.strip_suffix(".slice") else {
        return format!("/{slice}");
    };
    if stem == "-" || stem.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        out.push('/');
        out.push_str(&prefix);
        out.push_str(".slice");
    }
    out
}

/// Docker's configured cgroup parent (`cgroup-parent` of `/etc/docker/daemon.json`), when set.
pub fn docker_cgroup_parent(daemon_json: &Path) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct DaemonJson {
        #[serde(rename = "cgroup-parent", default)]
        cgroup_parent: Option<String>,
    }
    std::fs::read(daemon_json)
        .ok()
        .and_then(|b| serde_json::from_slice::<DaemonJson>(&b).ok())
        .and_then(|d| d.cgroup_parent)
        .filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::parse_cgroup_path;

    const ID: &str = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";

    struct Roots {
        dir: tempfile::TempDir,
    }

    impl Roots {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
            }
        }
        fn spec_roots(&self) -> SpecRoots {
            SpecRoots {
                docker_data_root: self.dir.path().join("docker"),
                containerd_task_roots: vec![self.dir.path().join("containerd")],
                crio_container_roots: vec![self.dir.path().join("crio")],
            }
        }
        fn write(&self, rel: &str, text: &str) {
            let p = self.dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
    }

    #[test]
    fn systemd_slices_expand_to_their_paths() {
        assert_eq!(slice_path("system.slice"), "/system.slice");
        assert_eq!(
            slice_path("kubepods-burstable-podx.slice"),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice"
        );
        assert_eq!(slice_path("-.slice"), "");
        assert_eq!(slice_path(".slice"), "");
        assert_eq!(slice_path("odd"), "/odd");
    }

    #[test]
    fn docker_host_configs_name_their_groups() {
        let at = |text: &str| docker_cgroups(text.as_bytes(), ID);
        assert_eq!(
            at(r#"{"CgroupParent":""}"#).unwrap(),
            vec![
                format!("/docker/{ID}"),
                format!("/system.slice/docker-{ID}.scope")
            ]
        );
        assert_eq!(at("{}").unwrap().len(), 2);
        assert_eq!(
            at(r#"{"CgroupParent":"/ci/"}"#).unwrap(),
            vec![format!("/ci/{ID}")]
        );
        assert_eq!(
            at(r#"{"CgroupParent":"kubepods-podx.slice"}"#).unwrap(),
            vec![format!(
                "/kubepods.slice/kubepods-podx.slice/docker-{ID}.scope"
            )]
        );
        // A path that ends like a slice is a cgroupfs path.
        assert_eq!(
            at(r#"{"CgroupParent":"/a/b.slice"}"#).unwrap(),
            vec![format!("/a/b.slice/{ID}")]
        );
        assert_eq!(at("not json"), None);
    }

    #[test]
    fn oci_configs_name_their_group_in_either_driver_form() {
        let at = |p: &str| oci_cgroup(format!(r#"{{"linux":{{"cgroupsPath":"{p}"}}}}"#).as_bytes());
        assert_eq!(
            at("/kubepods/burstable/podu/c/").unwrap(),
            vec!["/kubepods/burstable/podu/c"]
        );
        assert_eq!(at("/").unwrap(), vec!["/"]);
        assert_eq!(
            at("kubepods-burstable-podu.slice:cri-containerd:abc").unwrap(),
            vec![
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu.slice/cri-containerd-abc.scope"
            ]
        );
        assert_eq!(
            at(":libpod:abc").unwrap(),
            vec!["/system.slice/libpod-abc.scope"]
        );
        assert_eq!(
            at("machine.slice::abc.scope").unwrap(),
            vec!["/machine.slice/abc.scope"]
        );
        assert_eq!(at("no-colons"), None);
        assert_eq!(oci_cgroup(b"{}"), None);
        assert_eq!(oci_cgroup(br#"{"linux":{}}"#), None);
        assert_eq!(oci_cgroup(b"[]"), None);
    }

    #[test]
    fn a_record_confirms_only_the_group_it_names() {
        let r = Roots::new();
        let mut records = RuntimeRecords::new(r.spec_roots());
        let docker = parse_cgroup_path(&format!("/docker/{ID}"));
        // No record: placement alone.
        assert_eq!(records.check(&docker), Some(Verdict::NoRecord));
        assert_eq!(records.reads(), 0);
        // Not a container: no verdict.
        assert_eq!(
            records.check(&parse_cgroup_path("/system.slice/a.service")),
            None
        );

        let r = Roots::new();
        r.write(&format!("docker/containers/{ID}/config.v2.json"), "{}");
        r.write(
            &format!("docker/containers/{ID}/hostconfig.json"),
            r#"{"CgroupParent":""}"#,
        );
        let mut records = RuntimeRecords::new(r.spec_roots());
        assert_eq!(records.check(&docker), Some(Verdict::Confirmed));
        assert_eq!(records.reads(), 1);
        // Cached while confirmed.
        assert_eq!(records.check(&docker), Some(Verdict::Confirmed));
        assert_eq!(records.reads(), 1);
        let systemd = parse_cgroup_path(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(records.check(&systemd), Some(Verdict::Confirmed));

        // The container's record names another parent: the group observed is not it.
        let r = Roots::new();
        r.write(&format!("docker/containers/{ID}/config.v2.json"), "{}");
        r.write(
            &format!("docker/containers/{ID}/hostconfig.json"),
            r#"{"CgroupParent":"/ci"}"#,
        );
        let mut records = RuntimeRecords::new(r.spec_roots());
        assert_eq!(
            records.check(&docker),
            Some(Verdict::Elsewhere(format!("/ci/{ID}")))
        );
        // Cached until the retry time.
        assert_eq!(records.reads(), 1);
        records.check(&docker);
        assert_eq!(records.reads(), 1);
        records.retain(|_| false);
        records.check(&docker);
        assert_eq!(records.reads(), 2);
    }

    #[test]
    fn a_confirmed_record_is_kept_and_a_missing_one_looked_up_again() {
        let r = Roots::new();
        let dir = format!("docker/containers/{ID}");
        r.write(&format!("{dir}/config.v2.json"), "{}");
        let docker = parse_cgroup_path(&format!("/docker/{ID}"));
        let mut records = RuntimeRecords::new(r.spec_roots()).with_retry(Duration::ZERO);
        assert_eq!(records.check(&docker), Some(Verdict::NoRecord));
        // The record appears (the runtime's state mounted late): found at the next look-up.
        r.write(&format!("{dir}/hostconfig.json"), r#"{"CgroupParent":""}"#);
        assert_eq!(records.check(&docker), Some(Verdict::Confirmed));
        assert_eq!(records.reads(), 1);
        // Confirmed: kept, not read again.
        r.write(
            &format!("{dir}/hostconfig.json"),
            r#"{"CgroupParent":"/ci"}"#,
        );
        assert_eq!(records.check(&docker), Some(Verdict::Confirmed));
        assert_eq!(records.reads(), 1);
    }

    #[test]
    fn a_record_over_the_size_limit_or_not_a_file_is_not_read() {
        let docker = parse_cgroup_path(&format!("/docker/{ID}"));
        let record = |bytes: usize| {
            let r = Roots::new();
            r.write(&format!("docker/containers/{ID}/config.v2.json"), "{}");
            let mut text = r#"{"CgroupParent":""}"#.to_string();
            text.push_str(&" ".repeat(bytes - text.len()));
            r.write(&format!("docker/containers/{ID}/hostconfig.json"), &text);
            RuntimeRecords::new(r.spec_roots()).check(&docker)
        };
        let max = MAX_CONFIG_BYTES as usize;
        assert_eq!(record(max), Some(Verdict::Confirmed), "at the limit: read");
        assert_eq!(
            record(max + 1),
            Some(Verdict::NoRecord),
            "past it: not read"
        );
        let r = Roots::new();
        r.write(&format!("docker/containers/{ID}/config.v2.json"), "{}");
        std::fs::create_dir_all(
            r.dir
                .path()
                .join(format!("docker/containers/{ID}/hostconfig.json")),
        )
        .unwrap();
        assert_eq!(
            RuntimeRecords::new(r.spec_roots()).check(&docker),
            Some(Verdict::NoRecord),
            "a directory is no record"
        );
    }

    #[test]
    fn an_oci_bundle_confirms_its_container_and_a_bad_file_is_no_record() {
        let r = Roots::new();
        let kube = parse_cgroup_path(&format!(
            "/kubepods/burstable/pod0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a/{ID}"
        ));
        r.write(
            &format!("containerd/k8s.io/{ID}/config.json"),
            &format!(
                r#"{{"linux":{{"cgroupsPath":"/kubepods/burstable/pod0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a/{ID}"}}}}"#
            ),
        );
        let mut records = RuntimeRecords::new(r.spec_roots());
        assert_eq!(records.check(&kube), Some(Verdict::Confirmed));

        let r = Roots::new();
        r.write(&format!("crio/{ID}/userdata/config.json"), "not json");
        let podman = parse_cgroup_path(&format!("/machine.slice/libpod-{ID}.scope"));
        let mut records = RuntimeRecords::new(r.spec_roots());
        assert_eq!(records.check(&podman), Some(Verdict::NoRecord));
        assert_eq!(records.reads(), 1);
    }

    #[test]
    fn dockers_cgroup_parent_is_read_from_its_daemon_configuration() {
        let r = Roots::new();
        r.write("daemon.json", r#"{"cgroup-parent":"/ci"}"#);
        assert_eq!(
            docker_cgroup_parent(&r.dir.path().join("daemon.json")).as_deref(),
            Some("/ci")
        );
        r.write("empty.json", r#"{"cgroup-parent":""}"#);
        assert_eq!(docker_cgroup_parent(&r.dir.path().join("empty.json")), None);
        assert_eq!(
            docker_cgroup_parent(&r.dir.path().join("missing.json")),
            None
        );
        assert_eq!(Identity::Placement.as_str(), "degraded");
        assert_eq!(Identity::Runtime.as_str(), "runtime");
        assert_eq!(Identity::Conflict.as_str(), "conflict");
    }
}
