//! The API server as a grant source: what it grants the containers of this node.
//!
//! - Reads: this node's pods and the ResourceClaims they reference, as the API server returns
//!   them. Pure: objects in, a [`KubeView`] out ([`view`]); the watcher in `kube/`
//!   ([`crate::kube::api`]) fetches them, publishes the view, and the step reads it.
//! - Grants, per GPU: a claim's DRA consumed capacity, with source [`DRA_SOURCE`]
//!   ([`GrantSource::Dra`]), and the pod's annotations, with source [`ANNOTATION_SOURCE`]
//!   ([`GrantSource::Annotation`]), per running container ([`KubeContainer`]) and, for a claim
//!   shared by containers of one pod, per pod ([`KubeView::pod_of`]); where a container has both,
//!   [`crate::grants::merge`] combines them (`kube_container`, `kube_pod`).
//!
//! **DRA.** A ResourceClaim's `status.allocation.devices.results[].consumedCapacity["memory"]` is
//! the memory granted on the result's device. NVIDIA's DRA driver names a GPU `gpu-<minor>` and a
//! MIG device `gpu-<minor>-mig-…` (its `CanonicalName`); the minor is a device minor
//! ([`DeviceRef::Minor`]), which the agent resolves to the GPU NVML gives that minor, as it does
//! the runtime-spec device nodes (a minor no GPU has binds none). Another driver's device, or a
//! name of another shape, cannot be told: its memory then bounds every GPU the container uses
//! (stricter, never looser). Which containers use a claim:
//! `spec.containers[].resources.claims[].name` → `spec.resourceClaims[]`
//! → the claim's name (`resourceClaimName`, else `status.resourceClaimStatuses[]` for a claim made
//! from a template). Native sidecars (`spec.initContainers[]` with `restartPolicy: Always`, their
//! ids in `status.initContainerStatuses[]`) run beside the containers and are read the same way;
//! other init containers are not (they have finished before the containers run). A claim used by
//! one container is that container's quota. A claim shared by several containers of one pod grants
//! its memory to their union, not to each: those containers are one workload, the pod, bounded by
//! the sum of the claims they hold (see [`KubeView::pod_of`]). A claim shared by several pods
//! bounds each pod, not their union (no workload spans pods): said as a problem.
//!
//! **Annotations** (written by the pod's author, changeable after scheduling): NVIDIA's
//! kai-gpu-fractioning `nvidia.com/container.<name>.gpu-memory.limit` (a quantity; `.request` is
//! not a limit), the same under KAI's CDI-era prefix `nvidia.cdi.k8s.io/` (`<name>.` or
//! `container.<name>.gpu-memory.limit`), TensorFusion's `tensor-fusion.ai/vram-limit` (a quantity
//! per GPU, for the containers `tensor-fusion.ai/inject-container` names, else every one;
//! `vram-request` is not a limit) and GPUShare's `ALIYUN_COM_GPU_MEM_POD` (units of `gpushare_memory_unit`, on the
//! GPU `ALIYUN_COM_GPU_MEM_IDX`, else on each GPU; the pod's total, so it bounds each of its
//! containers). They only ever lower a limit (the quota is the smallest of all sources) and are read
//! as they stood when the container was first seen running: [`Pinned`].

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::{
    core::v1::{Container, Pod, PodSpec},
    resource::v1::ResourceClaim,
};

use self::quantity::parse_quantity;
use crate::quota::{DeviceRef, EnvQuota, GpuShareUnit, GrantSource, Limits, Sources};

pub mod quantity;

/// What a claim's grants are marked with.
pub const DRA_SOURCE: GrantSource = GrantSource::Dra;
/// What the annotations' grants are marked with.
pub const ANNOTATION_SOURCE: GrantSource = GrantSource::Annotation;

/// NVIDIA's DRA driver for GPUs.
pub const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";
/// kai-gpu-fractioning's annotation prefix (`<prefix><container>.gpu-memory.limit`).
pub const KAI_PREFIX: &str = "nvidia.com/container.";
/// KAI's CDI-era annotation prefix (`<prefix><container>.gpu-memory.limit`), beside the NRI
/// plugin's CDI device annotation `nvidia.cdi.k8s.io/container.<container>`.
pub const KAI_CDI_PREFIX: &str = "nvidia.cdi.k8s.io/";
/// The same under the NRI plugin's per-container form.
pub const KAI_CDI_CONTAINER_PREFIX: &str = "nvidia.cdi.k8s.io/container.";
/// TensorFusion's per-GPU memory limit of the pod's GPU workers (a quantity, e.g. `4Gi`).
pub const TF_VRAM_LIMIT: &str = "tensor-fusion.ai/vram-limit";
/// TensorFusion's containers that get the GPU (comma-separated names).
pub const TF_INJECT: &str = "tensor-fusion.ai/inject-container";
/// GPUShare's scheduler extender: the pod's GPU memory, in device-plugin units.
pub const GPUSHARE_POD: &str = "ALIYUN_COM_GPU_MEM_POD";
/// GPUShare's scheduler extender: the GPU index it chose.
pub const GPUSHARE_IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";

/// One running container of a pod on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeContainer {
    /// Pod UID.
    pub pod_uid: String,
    /// `namespace/name`.
    pub pod: String,
    /// The container's name in the pod.
    pub name: String,
    /// What its claims grant it alone (`sources` [`DRA_SOURCE`]).
    pub dra: Option<EnvQuota>,
    /// What the pod's annotations say now (`sources` [`ANNOTATION_SOURCE`]); pinned by the
    /// watcher to the value first seen while the container ran.
    pub annotation: Option<EnvQuota>,
}

/// The API server's grants, by container id (hex, without the runtime's scheme).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeView {
    /// Running containers with their grants.
    pub containers: HashMap<String, KubeContainer>,
    /// Pods whose containers share a claim: pod UID → the claims' memory for their union and the
    /// sharing containers' ids.
    pub shared: HashMap<String, (EnvQuota, Vec<String>)>,
    /// What could not be read, in words (each logged once per change by the watcher).
    pub problems: Vec<String>,
    /// Whether the view comes from a successful read (false: nothing is granted; fail open).
    pub fresh: bool,
}

impl KubeView {
    /// The pod UID whose union the container belongs to, when it shares a claim with another
    /// container of its pod.
    pub fn pod_of(&self, container_id: &str) -> Option<&str> {
        self.shared
            .iter()
            .find(|(_, (_, ids))| ids.iter().any(|i| i == container_id))
            .map(|(uid, _)| uid.as_str())
    }
}

/// The container id of a status's `containerID` (`containerd://<hex>`, `cri-o://<hex>`,
/// `docker://<hex>`).
pub fn container_id(status_id: &str) -> Option<&str> {
    let (_, id) = status_id.split_once("://")?;
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// The GPU a DRA result's device is, when it can be told.
pub fn dra_device(driver: &str, device: &str) -> Option<DeviceRef> {
    if driver != NVIDIA_DRA_DRIVER {
        return None;
    }
    let rest = device.strip_prefix("gpu-")?;
    let minor = rest.split_once("-mig-").map_or(rest, |(m, _)| m);
    (!minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()))
        .then(|| minor.parse().ok().map(DeviceRef::Minor))
        .flatten()
}

/// Per-GPU memory of a claim's results (those of `request` only, when a container names one),
/// and problems.
fn claim_memory(claim: &ResourceClaim, request: Option<&str>, problems: &mut Vec<String>) -> Grant {
    let mut g = Grant::default();
    let name = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or(""),
        claim.metadata.name.as_deref().unwrap_or("")
    );
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    for r in results {
        if let Some(want) = request
            && r.request != want
            && r.request
                .split_once('/')
                .is_none_or(|(parent, _)| parent != want)
        {
            continue;
        }
        let Some(memory) = r.consumed_capacity.as_ref().and_then(|c| c.get("memory")) else {
            continue;
        };
        let bytes = match parse_quantity(&memory.0) {
            Ok(b) => b,
            Err(e) => {
                problems.push(format!(
                    "ResourceClaim {name}: consumedCapacity memory of {}: {e}; ignored",
                    r.device
                ));
                continue;
            }
        };
        match dra_device(&r.driver, &r.device) {
            Some(d) => *g.per_gpu.entry(d).or_default() += bytes,
            None => *g.each_gpu.get_or_insert(0) += bytes,
        }
    }
    g
}

#[derive(Clone, Debug, Default)]
struct Grant {
    per_gpu: BTreeMap<DeviceRef, u64>,
    each_gpu: Option<u64>,
}

impl Grant {
    fn add(&mut self, o: &Grant) {
        for (d, v) in &o.per_gpu {
            *self.per_gpu.entry(d.clone()).or_default() += v;
        }
        if let Some(v) = o.each_gpu {
            *self.each_gpu.get_or_insert(0) += v;
        }
    }

    fn quota(self, sources: Sources) -> Option<EnvQuota> {
        (!self.per_gpu.is_empty() || self.each_gpu.is_some()).then(|| EnvQuota {
            sources,
            per_gpu: self.per_gpu.into_iter().collect(),
            each_gpu: self.each_gpu,
        })
    }
}

/// The claim (namespace-local name) a pod's claim entry `entry` resolves to.
pub fn claim_name<'p>(pod: &'p Pod, entry: &str) -> Option<&'p str> {
    let spec = pod.spec.as_ref()?;
    let pc = spec
        .resource_claims
        .as_ref()?
        .iter()
        .find(|c| c.name == entry)?;
    if let Some(n) = &pc.resource_claim_name {
        return Some(n);
    }
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == entry)?
        .resource_claim_name
        .as_deref()
}

/// The annotations that spell a limit on each GPU container `name` uses (quantities): KAI's
/// (`nvidia.com/container.<name>.gpu-memory.limit`, and its CDI-era spellings under
/// `nvidia.cdi.k8s.io/`: `<name>.gpu-memory.limit` and `container.<name>.gpu-memory.limit`) and
/// TensorFusion's `tensor-fusion.ai/vram-limit` (the pod's, for each container it injects, named
/// by `tensor-fusion.ai/inject-container`, comma-separated; every container where none is named).
/// Requests (`.gpu-memory.request`, `tensor-fusion.ai/vram-request`) are never limits.
fn each_gpu_keys(a: &BTreeMap<String, String>, name: &str) -> Vec<String> {
    let mut keys: Vec<String> = [KAI_PREFIX, KAI_CDI_PREFIX, KAI_CDI_CONTAINER_PREFIX]
        .iter()
        .map(|p| format!("{p}{name}.gpu-memory.limit"))
        .collect();
    let injected = a.get(TF_INJECT).is_none_or(|list| {
        let mut named = list.split(',').map(str::trim).filter(|n| !n.is_empty());
        named.clone().next().is_none() || named.any(|n| n == name)
    });
    if injected {
        keys.push(TF_VRAM_LIMIT.to_string());
    }
    keys
}

/// What the pod's annotations say for container `name` now.
pub fn annotation_quota(
    pod: &Pod,
    name: &str,
    unit: GpuShareUnit,
    problems: &mut Vec<String>,
) -> Option<EnvQuota> {
    let a = pod.metadata.annotations.as_ref()?;
    let who = || {
        format!(
            "pod {}/{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        )
    };
    let mut limits = Limits::default();
    for key in each_gpu_keys(a, name) {
        let Some(v) = a.get(&key) else { continue };
        match parse_quantity(v) {
            Ok(b) if b > 0 => limits.each(b),
            Ok(_) => problems.push(format!("{}: `{key}: {v}` is zero; ignored", who())),
            Err(e) => problems.push(format!("{}: `{key}`: {e}; ignored", who())),
        }
    }
    if let Some(v) = a.get(GPUSHARE_POD) {
        match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => {
                let bytes = n.saturating_mul(unit.bytes());
                match a.get(GPUSHARE_IDX).map(|i| i.trim().parse::<u32>()) {
                    Some(Ok(i)) => limits.device(DeviceRef::Index(i), bytes),
                    other => {
                        if let Some(Err(_)) = other {
                            problems.push(format!(
                                "{}: `{GPUSHARE_IDX}` is not a GPU index: its memory bounds every GPU",
                                who()
                            ));
                        }
                        limits.each(bytes)
                    }
                }
            }
            _ => problems.push(format!(
                "{}: `{GPUSHARE_POD}: {v}` is not a positive count; ignored",
                who()
            )),
        }
    }
    limits.into_quota(ANNOTATION_SOURCE.into())
}

/// The containers of a pod whose claims bound them: its containers, its native sidecars (init
/// containers with `restartPolicy: Always`, which run for the pod's life) and its other init
/// containers, which run to completion before the others start (a GPU warm-up, say): each is
/// bounded while the pod's status says it runs, like any container.
pub fn bounded_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
}

/// The grants of `pods` (this node's) from their `claims` (any namespace) and annotations.
pub fn view(pods: &[Pod], claims: &[ResourceClaim], unit: GpuShareUnit) -> KubeView {
    let mut v = KubeView {
        fresh: true,
        ..KubeView::default()
    };
    let claim = |ns: &str, name: &str| {
        claims.iter().find(|c| {
            c.metadata.namespace.as_deref() == Some(ns) && c.metadata.name.as_deref() == Some(name)
        })
    };
    // Which pods use each claim, to say when a claim spans pods.
    let mut pods_of_claim: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in pods {
        let (Some(uid), Some(spec)) = (pod.metadata.uid.as_deref(), pod.spec.as_ref()) else {
            continue;
        };
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let pod_name = format!("{ns}/{}", pod.metadata.name.as_deref().unwrap_or(""));
        let status = pod.status.as_ref();
        let ids: HashMap<&str, &str> = status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .chain(status.and_then(|s| s.init_container_statuses.as_ref()))
            .flatten()
            .filter(|s| s.state.as_ref().is_some_and(|st| st.running.is_some()))
            .filter_map(|s| Some((s.name.as_str(), container_id(s.container_id.as_deref()?)?)))
            .collect();
        // claim name -> the containers (by name) that use it, with their request filter.
        let mut users: BTreeMap<&str, Vec<(&str, Option<&str>)>> = BTreeMap::new();
        for c in bounded_containers(spec) {
            for r in c
                .resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .into_iter()
                .flatten()
            {
                match claim_name(pod, &r.name) {
                    Some(n) => users
                        .entry(n)
                        .or_default()
                        .push((c.name.as_str(), r.request.as_deref())),
                    None => v.problems.push(format!(
                        "pod {pod_name}: claim `{}` of container {} has no ResourceClaim yet",
                        r.name, c.name
                    )),
                }
            }
        }
        let mut own: HashMap<&str, Grant> = HashMap::new();
        let mut union = Grant::default();
        let mut sharers: Vec<&str> = Vec::new();
        for (name, who) in &users {
            pods_of_claim
                .entry(format!("{ns}/{name}"))
                .or_default()
                .push(pod_name.clone());
            let Some(c) = claim(ns, name) else {
                v.problems.push(format!(
                    "pod {pod_name}: ResourceClaim {ns}/{name} not found"
                ));
                continue;
            };
            let mut distinct: Vec<&str> = who.iter().map(|(n, _)| *n).collect();
            distinct.sort();
            distinct.dedup();
            if distinct.len() > 1 {
                union.add(&claim_memory(c, None, &mut v.problems));
                sharers.extend(distinct);
            } else {
                for (n, req) in who {
                    own.entry(n)
                        .or_default()
                        .add(&claim_memory(c, *req, &mut v.problems));
                }
            }
        }
        sharers.sort();
        sharers.dedup();
        // A sharer's own claims join the union it belongs to.
        for s in &sharers {
            if let Some(g) = own.remove(s) {
                union.add(&g);
            }
        }
        for c in bounded_containers(spec) {
            let Some(id) = ids.get(c.name.as_str()) else {
                continue;
            };
            v.containers.insert(
                (*id).to_string(),
                KubeContainer {
                    pod_uid: uid.to_string(),
                    pod: pod_name.clone(),
                    name: c.name.clone(),
                    dra: own
                        .remove(c.name.as_str())
                        .and_then(|g| g.quota(DRA_SOURCE.into())),
                    annotation: annotation_quota(pod, &c.name, unit, &mut v.problems),
                },
            );
        }
        if let Some(q) = union.quota(DRA_SOURCE.into()) {
            let ids: Vec<String> = sharers
                .iter()
                .filter_map(|n| ids.get(n).map(|i| (*i).to_string()))
                .collect();
            if !ids.is_empty() {
                v.shared.insert(uid.to_string(), (q, ids));
            }
        }
    }
    for (claim, by) in pods_of_claim {
        if by.len() > 1 {
            v.problems.push(format!(
                "ResourceClaim {claim} is shared by pods {}: each pod is bounded by the claim, not their union",
                by.join(", ")
            ));
        }
    }
    v.problems.sort();
    v.problems.dedup();
    v
}

/// Annotations as they stood when each container was first seen running: later edits are
/// ignored (and said once per value).
#[derive(Debug, Default)]
pub struct Pinned {
    seen: HashMap<String, (Option<EnvQuota>, Option<EnvQuota>)>,
    edits_total: u64,
}

impl Pinned {
    /// Replaces each container's annotation quota in `view` by the one first seen for it; returns
    /// the edits seen this time (in words) to be logged.
    pub fn apply(&mut self, view: &mut KubeView) -> Vec<String> {
        let mut said = Vec::new();
        for (id, c) in &mut view.containers {
            let (first, last_said) = self
                .seen
                .entry(id.clone())
                .or_insert_with(|| (c.annotation.clone(), c.annotation.clone()));
            if c.annotation != *first && c.annotation != *last_said {
                self.edits_total += 1;
                said.push(format!(
                    "pod {} container {}: its GPU-memory annotations changed after it started ({}); \
                     ignored: they are read as they stood when it started ({})",
                    c.pod,
                    c.name,
                    describe(c.annotation.as_ref()),
                    describe(first.as_ref())
                ));
            }
            last_said.clone_from(&c.annotation);
            c.annotation.clone_from(first);
        }
        self.seen.retain(|id, _| view.containers.contains_key(id));
        said
    }

    /// Edits ignored so far.
    pub fn edits_total(&self) -> u64 {
        self.edits_total
    }
}

/// A quota in words: `GPU 0: 1 GiB, each other GPU: 2 GiB`, or `none`.
pub fn describe(q: Option<&EnvQuota>) -> String {
    let Some(q) = q else {
        return "none".into();
    };
    let mut parts: Vec<String> = q
        .per_gpu
        .iter()
        .map(|(d, b)| format!("{d}: {}", crate::quota::ByteSize(*b)))
        .collect();
    if let Some(b) = q.each_gpu {
        parts.push(format!("each GPU: {}", crate::quota::ByteSize(b)));
    }
    parts.join(", ")
}

#[cfg(test)]
pub(crate) mod tests;
