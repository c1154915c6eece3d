//! The environment a container's runtime was told to give it, read from the runtime's own files by
//! container id, and, where none can be found, the environment of the container's first process.
//!
//! Why: quotas from device-plugin variables (GPUShare's, HAMi's) must be the ones the scheduler
//! granted, never ones a process chose. A process controls its own environment and its children's,
//! so `/proc/<pid>/environ` of a GPU process says what the workload wants, not what it was given.
//! The runtime spec is what the runtime received (from `docker run -e`, the kubelet and the device
//! plugin's Allocate answer) and nothing inside the container can change it.
//!
//! Where (first that exists; all root-owned, written by the runtime, never mounted into the
//! container):
//! - Docker: `<data root>/containers/<id>/config.v2.json`, `Config.Env` (the data root from
//!   `/etc/docker/daemon.json`, see [`crate::attribution::docker`]);
//! - containerd (and Docker, which runs its containers through containerd in namespace `moby`):
//!   the OCI bundle `<task root>/<namespace>/<id>/config.json`, `process.env`, with the task roots
//!   `/run/containerd/io.containerd.runtime.v2.task` (containerd 1.x and 2.x),
//!   `/run/docker/containerd/daemon/io.containerd.runtime.v2.task` (a containerd that dockerd starts
//!   itself) and `/run/containerd/io.containerd.runtime.v1.linux` (shim v1);
//! - CRI-O (and rootful Podman): the bundle `/run/containers/storage/overlay-containers/<id>/userdata/config.json`
//!   (its `runroot`, storage driver `overlay`), `process.env`.
//!
//! **Fallback: the container's init.** Where no spec is found (another runtime, other paths, the
//! agent without the host's `/run` or data root), the environment of the container's first process
//! is read, and only that one. Which process is first: the one in the workload's cgroup subtree
//! whose `NSpid` (in `/proc/<pid>/status`) ends in 1 in the fewest namespaces, which is by
//! definition the init of the container's own pid namespace; where the container shares a pid
//! namespace (`--pid=host`, a pod's shared namespace) none does, and it is the oldest process (by
//! start time) whose parent is outside the subtree: the process the runtime started, since every
//! other process of the container descends from it and runtimes end a container when its init
//! exits. Its environment is what the runtime gave it at exec, unless it rewrote it itself, hence
//! the lower trust ([`Trust::InitEnviron`]). A later process is never read.
//!
//! Bad files (not JSON, oversized, another container's) are errors the caller counts and logs;
//! nothing here panics.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use crate::{
    attribution::{
        ProcessIdentity,
        docker::{self, MAX_CONFIG_BYTES},
        procinfo,
    },
    grants::env::is_quota_var,
    quota::{DeviceRef, Trust},
    workload::Runtime,
};

/// containerd's task roots: each holds `<namespace>/<id>/config.json`.
pub const CONTAINERD_TASK_ROOTS: [&str; 3] = [
    "/run/containerd/io.containerd.runtime.v2.task",
    "/run/docker/containerd/daemon/io.containerd.runtime.v2.task",
    "/run/containerd/io.containerd.runtime.v1.linux",
];
/// CRI-O's (and rootful Podman's) per-container directories: `<id>/userdata/config.json`.
pub const CRIO_CONTAINER_ROOTS: [&str; 1] = ["/run/containers/storage/overlay-containers"];
/// Most processes read from one cgroup subtree when looking for its init.
const MAX_SUBTREE_PIDS: usize = 4096;
/// Deepest subtree walked.
const MAX_SUBTREE_DEPTH: usize = 16;
/// Most groups of one subtree read when looking for its init (a tenant chooses how many it makes).
const MAX_SUBTREE_GROUPS: usize = 256;

/// Where runtime specs are looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecRoots {
    /// Docker's data root (`/var/lib/docker` or daemon.json's `data-root`).
    pub docker_data_root: PathBuf,
    /// containerd task roots.
    pub containerd_task_roots: Vec<PathBuf>,
    /// CRI-O container roots.
    pub crio_container_roots: Vec<PathBuf>,
}

impl SpecRoots {
    /// The system's: Docker's data root from `/etc/docker/daemon.json`, the default paths of
    /// containerd and CRI-O.
    pub fn system() -> Self {
        Self {
            docker_data_root: docker::data_root_from(Path::new(docker::DAEMON_JSON)),
            containerd_task_roots: CONTAINERD_TASK_ROOTS.iter().map(PathBuf::from).collect(),
            crio_container_roots: CRIO_CONTAINER_ROOTS.iter().map(PathBuf::from).collect(),
        }
    }
}

/// Which kind of file a spec is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpecKind {
    /// Docker's `config.v2.json`.
    DockerConfig,
    /// An OCI bundle's `config.json` (containerd, CRI-O).
    OciBundle,
}

/// Where a container's environment was read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EnvOrigin {
    /// Its runtime spec.
    Spec {
        /// Which kind of file.
        kind: SpecKind,
        /// The file.
        path: PathBuf,
    },
    /// Its init process's environment.
    Init(ProcessIdentity),
}

impl EnvOrigin {
    /// How far what was read there can be trusted.
    pub fn trust(&self) -> Trust {
        match self {
            Self::Spec { .. } => Trust::RuntimeSpec,
            Self::Init(_) => Trust::InitEnviron,
        }
    }

    /// In words, for logs.
    pub fn describe(&self) -> String {
        match self {
            Self::Spec { path, .. } => format!("its runtime spec {}", path.display()),
            Self::Init(id) => format!("the environment of its init process {}", id.pid),
        }
    }
}

/// The spec files that may hold container `id`'s environment, most specific first, given the
/// runtime its cgroup path names. Nothing is read; `id` must be a full container id (it becomes a
/// path component).
pub fn spec_candidates(roots: &SpecRoots, runtime: Runtime, id: &str) -> Vec<(SpecKind, PathBuf)> {
    if !docker::is_full_id(id) {
        return Vec::new();
    }
    let docker = || {
        (
            SpecKind::DockerConfig,
            docker::config_path(&roots.docker_data_root, id),
        )
    };
    let containerd = |namespaces_first: &[&str]| -> Vec<(SpecKind, PathBuf)> {
        let mut out = Vec::new();
        for root in &roots.containerd_task_roots {
            let mut namespaces: Vec<String> =
                namespaces_first.iter().map(|s| s.to_string()).collect();
            if let Ok(rd) = std::fs::read_dir(root) {
                let mut more: Vec<String> = rd
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| !namespaces.contains(n) && !n.starts_with('.'))
                    .collect();
                more.sort();
                namespaces.extend(more);
            }
            for ns in namespaces {
                out.push((
                    SpecKind::OciBundle,
                    root.join(ns).join(id).join("config.json"),
                ));
            }
        }
        out
    };
    let crio = || -> Vec<(SpecKind, PathBuf)> {
        roots
            .crio_container_roots
            .iter()
            .map(|r| {
                (
                    SpecKind::OciBundle,
                    r.join(id).join("userdata").join("config.json"),
                )
            })
            .collect()
    };
    let mut out = Vec::new();
    match runtime {
        Runtime::Docker => {
            out.push(docker());
            out.extend(containerd(&["moby"]));
        }
        Runtime::Containerd => out.extend(containerd(&["k8s.io"])),
        Runtime::Crio | Runtime::Podman => out.extend(crio()),
        Runtime::Unknown => {
            out.extend(containerd(&["k8s.io"]));
            out.extend(crio());
            out.push(docker());
        }
    }
    out
}

/// The first candidate that exists as a regular file.
pub fn find_spec(roots: &SpecRoots, runtime: Runtime, id: &str) -> Option<(SpecKind, PathBuf)> {
    spec_candidates(roots, runtime, id)
        .into_iter()
        .find(|(_, p)| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
}

#[derive(serde::Deserialize)]
struct OciConfig {
    #[serde(default)]
    process: Option<OciProcess>,
    #[serde(default)]
    linux: Option<OciLinux>,
    #[serde(default)]
    annotations: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(serde::Deserialize)]
struct OciLinux {
    #[serde(default)]
    devices: Option<Vec<OciDevice>>,
}

#[derive(serde::Deserialize)]
struct OciDevice {
    #[serde(default)]
    path: String,
    #[serde(default)]
    major: Option<i64>,
    #[serde(default)]
    minor: Option<i64>,
}

/// The NVIDIA character devices' major number.
const NVIDIA_MAJOR: i64 = 195;

/// The device minor of a node given to a container: `/dev/nvidia<N>` in the container, `minor`
/// when it is NVIDIA's character device (major 195), else `<N>` (a node of other numbers mapped to
/// that name, as in tests). A minor, not an NVML index: it is resolved through NVML
/// ([`DeviceRef::Minor`]). `nvidiactl`, `nvidia-uvm` and the rest are no GPU.
fn gpu_of_node(path: &str, major: Option<i64>, minor: Option<i64>) -> Option<u32> {
    let n = path.strip_prefix("/dev/nvidia")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match (major, minor) {
        (Some(NVIDIA_MAJOR), Some(m)) => u32::try_from(m).ok(),
        _ => n.parse().ok(),
    }
}

/// A device named by a CDI device name (`nvidia.com/gpu=0`, `nvidia.com/gpu=GPU-...`) or a Docker
/// device request id: an index or a UUID; `all` and other names say nothing.
fn gpu_of_name(name: &str) -> Option<DeviceRef> {
    let name = name.trim();
    if name.starts_with("GPU-") || name.starts_with("MIG-") {
        Some(DeviceRef::Uuid(name.to_string()))
    } else if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
        name.parse().ok().map(DeviceRef::Index)
    } else {
        None
    }
}

fn dedup_in_order(v: Vec<DeviceRef>) -> Option<Vec<DeviceRef>> {
    let mut out: Vec<DeviceRef> = Vec::new();
    for d in v {
        if !out.contains(&d) {
            out.push(d);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Whether annotation `key` names CDI devices for the container named `container`: the CRI's
/// `cdi.k8s.io/*`, and nvidia-container-runtime's `nvidia.cdi.k8s.io/*` (KAI's and the NRI plugin's
/// `nvidia.cdi.k8s.io/container.<name>` only for container `<name>`: a pod's annotations reach each
/// of its containers' specs).
fn cdi_annotation_for(key: &str, container: Option<&str>) -> bool {
    if key.starts_with("cdi.k8s.io/") {
        return true;
    }
    match key.strip_prefix("nvidia.cdi.k8s.io/") {
        Some(rest) => rest
            .strip_prefix("container.")
            .is_none_or(|name| container == Some(name)),
        None => false,
    }
}

/// The GPUs an OCI runtime config gives the container, in its order: its `linux.devices` GPU nodes,
/// else the GPUs its CDI annotations (`cdi.k8s.io/*`, `nvidia.cdi.k8s.io/*`) name; `None` when
/// neither says.
fn devices_from_oci(cfg: &OciConfig) -> Option<Vec<DeviceRef>> {
    let nodes = cfg
        .linux
        .as_ref()
        .and_then(|l| l.devices.as_ref())
        .map(|ds| {
            ds.iter()
                .filter_map(|d| gpu_of_node(&d.path, d.major, d.minor))
                .map(DeviceRef::Minor)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    dedup_in_order(nodes).or_else(|| {
        let names = cfg
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| cdi_annotation_for(k, container_name_of(cfg).as_deref()))
            .flat_map(|(_, v)| v.split(','))
            .filter_map(|qualified| {
                let (kind, name) = qualified.trim().split_once('=')?;
                kind.contains("gpu").then(|| gpu_of_name(name)).flatten()
            })
            .collect();
        dedup_in_order(names)
    })
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerHostConfig {
    #[serde(default)]
    devices: Option<Vec<DockerDevice>>,
    #[serde(default)]
    device_requests: Option<Vec<DockerDeviceRequest>>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerDevice {
    #[serde(default)]
    path_on_host: String,
    #[serde(default)]
    path_in_container: String,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerDeviceRequest {
    #[serde(default, rename = "DeviceIDs")]
    device_ids: Option<Vec<String>>,
}

/// The GPUs Docker gives a container, from the text of its `hostconfig.json`: `--device` nodes
/// named `/dev/nvidia<N>` in the container (device minor `N`, or the host node's minor when it is
/// NVIDIA's), then
/// `--gpus device=...` ids; `None` when neither names one (`--gpus all` names none).
pub fn devices_from_docker_hostconfig(bytes: &[u8]) -> Result<Option<Vec<DeviceRef>>, String> {
    let hc: DockerHostConfig =
        serde_json::from_slice(bytes).map_err(|e| format!("not a Docker host config: {e}"))?;
    let mut out = Vec::new();
    for d in hc.devices.iter().flatten() {
        let (major, minor) = host_node_numbers(Path::new(&d.path_on_host));
        if let Some(m) = gpu_of_node(&d.path_in_container, major, minor) {
            out.push(DeviceRef::Minor(m));
        }
    }
    for r in hc.device_requests.iter().flatten() {
        out.extend(
            r.device_ids
                .iter()
                .flatten()
                .filter_map(|id| gpu_of_name(id)),
        );
    }
    Ok(dedup_in_order(out))
}

/// A host device node's major and minor numbers, when it is a character device.
fn host_node_numbers(path: &Path) -> (Option<i64>, Option<i64>) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_char_device() => {
            let rdev = m.rdev();
            (
                Some(i64::from(libc::major(rdev))),
                Some(i64::from(libc::minor(rdev))),
            )
        }
        _ => (None, None),
    }
}

#[derive(serde::Deserialize)]
struct OciProcess {
    #[serde(default)]
    env: Option<Vec<String>>,
}

/// `process.env` of an OCI bundle's `config.json` text, as `NAME=value` strings.
pub fn env_from_oci_config(bytes: &[u8]) -> Result<Vec<String>, String> {
    let cfg: OciConfig =
        serde_json::from_slice(bytes).map_err(|e| format!("not an OCI runtime config: {e}"))?;
    Ok(cfg.process.and_then(|p| p.env).unwrap_or_default())
}

/// `NAME=value` strings to pairs, keeping only the variables env quotas read.
pub fn quota_vars(env: &[String]) -> Vec<(String, String)> {
    env.iter()
        .filter_map(|e| e.split_once('='))
        .filter(|(k, _)| is_quota_var(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What a container's spec says it was given: its quota variables and the GPUs its runtime gave it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecGrant {
    /// The quota variables, in the spec's order.
    pub vars: Vec<(String, String)>,
    /// The GPUs the runtime gave, in its order; `None` when the spec does not say.
    pub devices: Option<Vec<DeviceRef>>,
    /// The container's name in its pod (the CRI annotations `io.kubernetes.container.name`,
    /// containerd's `io.kubernetes.cri.container-name`), when the spec says.
    pub container_name: Option<String>,
}

/// The CRI annotations that name a container within its pod (CRI-O's, containerd's).
const CONTAINER_NAME_ANNOTATIONS: [&str; 2] = [
    "io.kubernetes.container.name",
    "io.kubernetes.cri.container-name",
];

fn container_name_of(cfg: &OciConfig) -> Option<String> {
    let a = cfg.annotations.as_ref()?;
    CONTAINER_NAME_ANNOTATIONS
        .iter()
        .find_map(|k| a.get(*k))
        .filter(|n| !n.is_empty())
        .cloned()
}

/// Reads the quota variables of container `id` from a spec file.
pub fn read_spec(kind: SpecKind, path: &Path, id: &str) -> Result<Vec<(String, String)>, String> {
    read_spec_grant(kind, path, id).map(|g| g.vars)
}

/// Reads the quota variables of container `id` and the GPUs its runtime gave it from a spec file
/// (for Docker's `config.v2.json`, the devices come from the `hostconfig.json` beside it).
pub fn read_spec_grant(kind: SpecKind, path: &Path, id: &str) -> Result<SpecGrant, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "{}: {} bytes, more than the {MAX_CONFIG_BYTES} read",
            path.display(),
            meta.len()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let at = |e: String| format!("{}: {e}", path.display());
    match kind {
        SpecKind::DockerConfig => {
            let env = docker::env_from_config(&bytes, id).map_err(at)?;
            let host_config = path.with_file_name("hostconfig.json");
            let devices = match std::fs::metadata(&host_config) {
                Ok(m) if m.len() <= MAX_CONFIG_BYTES => std::fs::read(&host_config)
                    .map_err(|e| e.to_string())
                    .and_then(|b| devices_from_docker_hostconfig(&b))
                    .map_err(|e| format!("{}: {e}", host_config.display()))?,
                _ => None,
            };
            Ok(SpecGrant {
                vars: quota_vars(&env),
                devices,
                container_name: None,
            })
        }
        SpecKind::OciBundle => {
            let cfg: OciConfig = serde_json::from_slice(&bytes)
                .map_err(|e| at(format!("not an OCI runtime config: {e}")))?;
            let devices = devices_from_oci(&cfg);
            let container_name = container_name_of(&cfg);
            let env = cfg.process.and_then(|p| p.env).unwrap_or_default();
            Ok(SpecGrant {
                vars: quota_vars(&env),
                devices,
                container_name,
            })
        }
    }
}

/// The processes of a cgroup subtree (`dir` is its v2 directory), at most [`MAX_SUBTREE_PIDS`],
/// from at most [`MAX_SUBTREE_GROUPS`] groups, shallowest first (breadth-first: an init lives at
/// or near the top, and a tenant that makes thousands of groups only makes the walk stop early).
fn subtree_pids(dir: &Path) -> Vec<u32> {
    subtree_pids_within(dir, MAX_SUBTREE_GROUPS).0
}

/// [`subtree_pids`] reading at most `max_groups` groups; also says how many it read.
fn subtree_pids_within(dir: &Path, max_groups: usize) -> (Vec<u32>, usize) {
    let mut pids = Vec::new();
    let mut queue = std::collections::VecDeque::from([(dir.to_path_buf(), 0usize)]);
    let mut groups = 0;
    while let Some((d, depth)) = queue.pop_front() {
        if groups >= max_groups {
            break;
        }
        groups += 1;
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if pids.len() >= MAX_SUBTREE_PIDS {
            pids.truncate(MAX_SUBTREE_PIDS);
            break;
        }
        if depth >= MAX_SUBTREE_DEPTH || queue.len() >= max_groups {
            continue;
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if queue.len() >= max_groups {
                    break;
                }
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    queue.push_back((e.path(), depth + 1));
                }
            }
        }
    }
    (pids, groups)
}

/// One process as the init search sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcFacts {
    /// pid and start time.
    pub identity: ProcessIdentity,
    /// Parent pid.
    pub ppid: u32,
    /// `NSpid`: the pid in each nested pid namespace, outermost first.
    pub nspid: Vec<u32>,
}

fn facts(pid: u32) -> Option<ProcFacts> {
    // `status` as bytes: a process's name need not be UTF-8, and the procfs crate's parse would
    // reject the file, hiding the container's init (see `sys::proc_status`).
    let start_ticks = crate::attribution::procinfo::start_ticks(pid)?;
    let status = crate::sys::proc_status::of(pid).ok()?;
    Some(ProcFacts {
        identity: ProcessIdentity { pid, start_ticks },
        ppid: status.ppid?,
        nspid: status.nspid,
    })
}

/// The init among the processes of one cgroup subtree (see the module note): the init of the
/// outermost pid namespace the subtree's processes are in, else the oldest process whose parent
/// is outside the subtree.
pub fn choose_init(procs: &[ProcFacts]) -> Option<ProcessIdentity> {
    let by_age = |p: &&ProcFacts| (p.identity.start_ticks, p.identity.pid);
    let ns_init = procs
        .iter()
        .filter(|p| p.nspid.len() >= 2 && p.nspid.last() == Some(&1))
        .min_by_key(|p| (p.nspid.len(), p.identity.start_ticks, p.identity.pid));
    if let Some(p) = ns_init {
        return Some(p.identity);
    }
    let inside: HashSet<u32> = procs.iter().map(|p| p.identity.pid).collect();
    procs
        .iter()
        .filter(|p| !inside.contains(&p.ppid))
        .min_by_key(by_age)
        .or_else(|| procs.iter().min_by_key(by_age))
        .map(|p| p.identity)
}

/// The init process of the workload whose cgroup v2 directory is `dir`.
pub fn find_init(dir: &Path) -> Option<ProcessIdentity> {
    let procs: Vec<ProcFacts> = subtree_pids(dir).into_iter().filter_map(facts).collect();
    choose_init(&procs)
}

/// The quota variables in the environment of process `identity`, or `None` when it is gone (or
/// its pid now names another process).
///
/// The environment is read as a stream, one entry at a time (each at most the kernel's 128 KiB),
/// and only the quota variables are kept: a tenant sizes its environment (up to a quarter of its
/// stack limit, unbounded with `ulimit -s unlimited`), never the agent's memory.
pub fn read_init_environ(identity: ProcessIdentity) -> Option<Vec<(String, String)>> {
    use std::io::BufRead;
    let file = std::fs::File::open(format!("/proc/{}/environ", identity.pid)).ok()?;
    let mut vars = Vec::new();
    for entry in std::io::BufReader::new(file).split(0) {
        vars.extend(
            crate::grants::env::parse_environ(&entry.ok()?)
                .into_iter()
                .filter(|(k, _)| is_quota_var(k)),
        );
    }
    // Read first, then check: a pid reused in between is caught here.
    if !procinfo::is_same_process(identity) {
        return None;
    }
    Some(vars)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use gpushare_testkit::TempTree;

    const ID: &str = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";

    fn tree(tag: &str) -> TempTree {
        TempTree::new(&format!("gpushare-runtime-spec-{tag}-"))
    }

    #[test]
    fn a_subtree_of_thousands_of_groups_is_read_shallowest_first_and_only_in_part() {
        // A tenant's subtree: its init at the top, 3,000 empty groups beside one deep worker.
        let t = tree("storm");
        t.write("cgroup.procs", "10\n");
        for i in 0..3000 {
            t.write(&format!("g{i}/cgroup.procs"), "");
        }
        t.write("w/x/cgroup.procs", "11\n");
        let (pids, groups) = subtree_pids_within(t.path(), MAX_SUBTREE_GROUPS);
        assert_eq!(groups, MAX_SUBTREE_GROUPS, "stopped at the bound");
        assert_eq!(pids.first(), Some(&10), "the top group first");
        let (all, groups) = subtree_pids_within(t.path(), 10_000);
        assert_eq!(groups, 3003, "every group, with a bound above the count");
        assert_eq!(all, vec![10, 11]);
    }

    fn roots(t: &TempTree) -> SpecRoots {
        SpecRoots {
            docker_data_root: t.path().join("docker"),
            containerd_task_roots: vec![t.path().join("containerd")],
            crio_container_roots: vec![t.path().join("crio")],
        }
    }

    fn oci(env: &[&str]) -> String {
        serde_json::json!({ "ociVersion": "1.1.0", "process": { "args": ["sh"], "env": env } })
            .to_string()
    }

    #[test]
    fn each_runtime_is_looked_up_where_it_keeps_its_specs() {
        let t = tree("where");
        let r = roots(&t);
        // Nothing there.
        for rt in [
            Runtime::Docker,
            Runtime::Containerd,
            Runtime::Crio,
            Runtime::Unknown,
        ] {
            assert_eq!(find_spec(&r, rt, ID), None, "{rt:?}");
        }
        // Each file written, in turn, is what these runtimes find then, as this kind of spec.
        for (rel, text, kind, runtimes) in [
            // containerd, any namespace.
            (
                format!("containerd/k8s.io/{ID}/config.json"),
                oci(&["A=1"]),
                SpecKind::OciBundle,
                &[Runtime::Containerd, Runtime::Unknown][..],
            ),
            (
                format!("containerd/moby/{ID}/config.json"),
                oci(&[]),
                SpecKind::OciBundle,
                &[Runtime::Docker],
            ),
            // Docker's own file comes first for Docker.
            (
                format!("docker/containers/{ID}/config.v2.json"),
                "{}".into(),
                SpecKind::DockerConfig,
                &[Runtime::Docker],
            ),
            // CRI-O.
            (
                format!("crio/{ID}/userdata/config.json"),
                oci(&[]),
                SpecKind::OciBundle,
                &[Runtime::Crio],
            ),
        ] {
            let p = t.write(&rel, &text);
            for &rt in runtimes {
                assert_eq!(
                    find_spec(&r, rt, ID),
                    Some((kind, p.clone())),
                    "{rel}, {rt:?}"
                );
            }
        }
        // Not an id: never a path.
        assert!(spec_candidates(&r, Runtime::Docker, "../../etc").is_empty());
        assert!(spec_candidates(&r, Runtime::Docker, &ID[..12]).is_empty());
    }

    #[test]
    fn the_specs_environment_keeps_only_quota_variables() {
        let t = tree("env");
        let p = t.write(
            "b/config.json",
            &oci(&[
                "PATH=/bin",
                "ALIYUN_COM_GPU_MEM_CONTAINER=1",
                "NOEQUALS",
                "CUDA_DEVICE_MEMORY_LIMIT_0=2g",
                "NVIDIA_VISIBLE_DEVICES=GPU-a",
            ]),
        );
        assert_eq!(
            read_spec(SpecKind::OciBundle, &p, ID).unwrap(),
            vec![
                ("ALIYUN_COM_GPU_MEM_CONTAINER".into(), "1".into()),
                ("CUDA_DEVICE_MEMORY_LIMIT_0".into(), "2g".into()),
                ("NVIDIA_VISIBLE_DEVICES".into(), "GPU-a".into()),
            ]
        );
        let p = t.write(
            "d/config.v2.json",
            &format!(r#"{{"ID":"{ID}","Name":"/x","Config":{{"Env":["ALIYUN_COM_GPU_MEM_CONTAINER=4","HOME=/"]}}}}"#),
        );
        assert_eq!(
            read_spec(SpecKind::DockerConfig, &p, ID).unwrap(),
            vec![("ALIYUN_COM_GPU_MEM_CONTAINER".into(), "4".into())]
        );
        // A bundle without process.env has an empty environment.
        let p = t.write("e/config.json", r#"{"ociVersion":"1.0.0"}"#);
        assert_eq!(read_spec(SpecKind::OciBundle, &p, ID), Ok(vec![]));
    }

    /// A CRI-O bundle as the kubelet and CRI-O write it: the device plugin's device nodes in
    /// `linux.devices`, NVIDIA's `nvidiactl` and `nvidia-uvm` beside them, and the pod's own
    /// `env:` entry having replaced the plugin's `CUDA_DEVICE_MEMORY_LIMIT_0`.
    fn crio_bundle(env: &[&str]) -> String {
        serde_json::json!({
            "ociVersion": "1.0.2-dev",
            "process": { "args": ["python"], "env": env },
            "linux": {
                "devices": [
                    { "path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255 },
                    { "path": "/dev/nvidia-uvm", "type": "c", "major": 509, "minor": 0 },
                    { "path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1 },
                ],
                "cgroupsPath": "kubepods-burstable-pod0f3d8e2a.slice:crio:3f2a"
            },
            "annotations": { "io.kubernetes.cri-o.ContainerType": "container" }
        })
        .to_string()
    }

    #[test]
    fn the_devices_the_runtime_gave_come_from_the_specs_device_nodes_or_cdi_names() {
        let t = tree("devices");
        // CRI-O: GPU 1 by its node's minor number; the pod's `=0` is all that is left of HAMi's
        // limit (CRI-O keeps the last value of a name).
        let p = t.write(
            "crio/config.json",
            &crio_bundle(&[
                "CUDA_DEVICE_MEMORY_LIMIT_0=0",
                "CUDA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000",
            ]),
        );
        let g = read_spec_grant(SpecKind::OciBundle, &p, ID).unwrap();
        assert_eq!(g.devices, Some(vec![DeviceRef::Minor(1)]));
        assert_eq!(g.vars[0], ("CUDA_DEVICE_MEMORY_LIMIT_0".into(), "0".into()));
        let r = crate::grants::env::env_quota_on(
            g.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            crate::quota::GpuShareUnit::GiB,
            &[],
            g.devices.as_deref(),
        );
        assert_eq!(
            r.quota, None,
            "a 0 lifts nothing, and there is nothing else to read"
        );
        assert_eq!(
            r.disagreements.iter().map(|d| d.kind).collect::<Vec<_>>(),
            vec![crate::grants::env::DisagreementKind::NoPluginValue]
        );
        // A node of other numbers named /dev/nvidiaN (tests, a renamed node) is minor N.
        assert_eq!(gpu_of_node("/dev/nvidia3", Some(1), Some(3)), Some(3));
        assert_eq!(gpu_of_node("/dev/nvidia3", Some(195), Some(7)), Some(7));
        assert_eq!(gpu_of_node("/dev/nvidiactl", Some(195), Some(255)), None);
        assert_eq!(gpu_of_node("/dev/nvidia", None, None), None);
        assert_eq!(
            gpu_of_node("/dev/nvidia-caps/nvidia-cap1", None, None),
            None
        );
        // CDI names where no node is listed (HAMi's DRA driver, NVIDIA's plugin with CDI).
        let p = t.write(
            "cdi/config.json",
            &serde_json::json!({
                "process": { "env": ["CUDA_DEVICE_MEMORY_LIMIT_1=1024m"] },
                "annotations": {
                    "cdi.k8s.io/hami": "hami.io/gpu=GPU-aaa,hami.io/gpu=2",
                    "cdi.k8s.io/other": "vendor.com/nic=0",
                    "unrelated": "nvidia.com/gpu=5"
                }
            })
            .to_string(),
        );
        let g = read_spec_grant(SpecKind::OciBundle, &p, ID).unwrap();
        assert_eq!(
            g.devices,
            Some(vec![DeviceRef::Uuid("GPU-aaa".into()), DeviceRef::Index(2)])
        );
        // KAI's CDI device annotation (NVIDIA's NRI plugin's spelling), which takes the place of
        // NVIDIA_VISIBLE_DEVICES: only the one for this container; the pod's other containers'
        // and the KAI limits under the same prefix name no device.
        let p = t.write(
            "kai/config.json",
            &serde_json::json!({
                "process": { "env": ["CUDA_DEVICE_MEMORY_LIMIT_0=1024m"] },
                "annotations": {
                    "io.kubernetes.cri.container-name": "trainer",
                    "nvidia.cdi.k8s.io/container.trainer": "nvidia.com/gpu=GPU-ccc",
                    "nvidia.cdi.k8s.io/container.sidecar": "nvidia.com/gpu=3",
                    "nvidia.cdi.k8s.io/container.trainer.gpu-memory.limit": "4Gi",
                    "nvidia.cdi.k8s.io/trainer.gpu-memory.limit": "4Gi"
                }
            })
            .to_string(),
        );
        let g = read_spec_grant(SpecKind::OciBundle, &p, ID).unwrap();
        assert_eq!(g.devices, Some(vec![DeviceRef::Uuid("GPU-ccc".into())]));
        assert!(cdi_annotation_for("nvidia.cdi.k8s.io/gpus", None));
        assert!(!cdi_annotation_for("nvidia.cdi.k8s.io/container.a", None));
        assert!(!cdi_annotation_for("example.com/cdi.k8s.io/x", Some("a")));
        // Nothing said: None (not an empty list).
        let p = t.write("none/config.json", &oci(&["A=1"]));
        assert_eq!(
            read_spec_grant(SpecKind::OciBundle, &p, ID)
                .unwrap()
                .devices,
            None
        );
        // Docker: hostconfig.json beside config.v2.json.
        let d = format!(r#"{{"ID":"{ID}","Config":{{"Env":["NVIDIA_GPU_MEMORY_LIMIT=1024"]}}}}"#);
        let p = t.write("docker/config.v2.json", &d);
        assert_eq!(
            read_spec_grant(SpecKind::DockerConfig, &p, ID)
                .unwrap()
                .devices,
            None
        );
        t.write(
            "docker/hostconfig.json",
            r#"{"Devices":[{"PathOnHost":"/nonexistent-gpushare-node","PathInContainer":"/dev/nvidia0","CgroupPermissions":"rwm"}],
                "DeviceRequests":[{"Driver":"nvidia","Count":0,"DeviceIDs":["GPU-bbb","0"],"Capabilities":[["gpu"]]}]}"#,
        );
        let g = read_spec_grant(SpecKind::DockerConfig, &p, ID).unwrap();
        assert_eq!(
            g.devices,
            // The node's minor 0 and NVML's index 0 need not be one GPU: both are kept.
            Some(vec![
                DeviceRef::Minor(0),
                DeviceRef::Uuid("GPU-bbb".into()),
                DeviceRef::Index(0)
            ])
        );
        assert_eq!(
            g.vars,
            vec![("NVIDIA_GPU_MEMORY_LIMIT".into(), "1024".into())]
        );
        // `--gpus all` names none.
        assert_eq!(
            devices_from_docker_hostconfig(br#"{"DeviceRequests":[{"Count":-1}]}"#),
            Ok(None)
        );
        t.write("docker/hostconfig.json", "{");
        assert!(
            read_spec_grant(SpecKind::DockerConfig, &p, ID)
                .unwrap_err()
                .contains("hostconfig.json")
        );
    }

    #[test]
    fn bad_spec_files_are_errors_not_panics() {
        let t = tree("bad");
        for (i, text) in [
            "",
            "{",
            "[1]",
            "\u{0}garbage",
            r#"{"process":{"env":"A=1"}}"#,
        ]
        .iter()
        .enumerate()
        {
            let p = t.write(&format!("{i}/config.json"), text);
            let e = read_spec(SpecKind::OciBundle, &p, ID).unwrap_err();
            assert!(e.contains("config.json"), "{e}");
        }
        let p = t.write(
            "other/config.v2.json",
            r#"{"ID":"0000000000000000000000000000000000000000000000000000000000000001","Config":{"Env":[]}}"#,
        );
        assert!(
            read_spec(SpecKind::DockerConfig, &p, ID)
                .unwrap_err()
                .contains("another container")
        );
        let big = t.path().join("big.json");
        fs::File::create(&big)
            .unwrap()
            .set_len(MAX_CONFIG_BYTES + 1)
            .unwrap();
        assert!(
            read_spec(SpecKind::OciBundle, &big, ID)
                .unwrap_err()
                .contains("more than")
        );
        assert!(read_spec(SpecKind::OciBundle, &t.path().join("missing"), ID).is_err());
    }

    fn f(pid: u32, start: u64, ppid: u32, nspid: &[u32]) -> ProcFacts {
        ProcFacts {
            identity: ProcessIdentity {
                pid,
                start_ticks: start,
            },
            ppid,
            nspid: nspid.to_vec(),
        }
    }

    #[test]
    fn the_init_is_the_pid_namespaces_first_process_else_the_oldest_started_from_outside() {
        // A container with its own pid namespace: its pid 1, even if a child started earlier
        // by the clock (ticks are coarse) or a nested namespace has its own pid 1.
        let procs = [
            f(200, 10, 100, &[200, 1]),
            f(201, 10, 200, &[201, 2]),
            f(202, 11, 201, &[202, 3, 1]),
        ];
        assert_eq!(choose_init(&procs).map(|i| i.pid), Some(200));
        // Sharing the host's pid namespace: the oldest process whose parent is outside.
        let procs = [
            f(301, 12, 300, &[301]),
            f(302, 13, 301, &[302]),
            f(299, 5, 301, &[299]), // odd: older but forked inside; not the init
        ];
        assert_eq!(choose_init(&procs).map(|i| i.pid), Some(301));
        // An orphan reparented outside is younger than the init.
        let procs = [f(310, 20, 1, &[310]), f(311, 30, 1, &[311])];
        assert_eq!(choose_init(&procs).map(|i| i.pid), Some(310));
        assert_eq!(choose_init(&[]), None);
    }

    #[test]
    fn the_init_of_a_real_group_is_found_and_its_environment_read() {
        // A group of its own (this test process's group may be the root, whose init, pid 1, can
        // keep its environment unreadable even to root).
        if !gpushare_testkit::require_root("the_init_of_a_real_group_is_found") {
            return;
        }
        let cg =
            gpushare_testkit::TestCgroup::create(&gpushare_testkit::unique("init-env")).unwrap();
        let mut child = cg
            .spawn(
                std::process::Command::new("sleep")
                    .arg("60")
                    .env("ALIYUN_COM_GPU_MEM_CONTAINER", "3")
                    .env("GPUSHARE_TEST_UNRELATED", "x"),
            )
            .unwrap();
        let init = find_init(cg.dir()).expect("a group with a process has an init");
        assert_eq!(init.pid, child.id());
        let vars = read_init_environ(init).expect("root reads the init's environment");
        assert!(
            vars.contains(&("ALIYUN_COM_GPU_MEM_CONTAINER".into(), "3".into())),
            "{vars:?}"
        );
        assert!(vars.iter().all(|(k, _)| is_quota_var(k)), "{vars:?}");
        let gone = ProcessIdentity {
            pid: init.pid,
            start_ticks: init.start_ticks + 1,
        };
        assert_eq!(
            read_init_environ(gone),
            None,
            "another process by that pid is not read"
        );
        let _ = (child.kill(), child.wait());
    }
}
