//! The kubelet as a grant source: what the node's kubelet says each container was given.
//!
//! - Reads: the kubelet's pod-resources API (`v1`, over its unix socket): each container's
//!   device-plugin device ids per resource and its DRA claims, bound to pod UIDs ([`reply`]),
//!   asked for by a background task that publishes a [`PodResourcesView`] ([`watch`]).
//! - Grants, per GPU, with source [`SOURCE`] ([`GrantSource::Kubelet`]): GPUShare's
//!   `aliyun.com/gpu-mem` ids counted as units of `gpushare_memory_unit`, on the GPU
//!   `ALIYUN_COM_GPU_MEM_IDX` names among the devices given, else on each GPU the container uses,
//!   as the environment's own value would be ([`part_of`]); and the devices it was given, where
//!   the kubelet names them ([`devices`]: the ids' shapes).
//! - A container is found by pod UID and container name ([`assignment`]): the runtime spec's
//!   annotation, else the kubelet's container log links (`containers/` beside `pod_logs_dir`).
//!
//! Rule: the step reads the last view and never waits on the kubelet; nothing here combines a
//! grant with another source's (that is [`crate::grants::merge`]).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::{
    attribution::{WorkloadId, k8s_names},
    grants::env::env_quota_on,
    quota::{DeviceRef, EnvQuota, GpuInfo, GpuShareUnit, GrantSource, KubeletSettings},
};

pub mod devices;
pub mod reply;
pub mod watch;

/// The kubelet's pod-resources `v1` API, generated at build time from the vendored
/// `proto/podresources/v1/api.proto` (Apache-2.0, the Kubernetes Authors).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("v1");
}

/// What this source's grants are marked with.
pub const SOURCE: GrantSource = GrantSource::Kubelet;

/// One DRA claim a container holds, as the kubelet names it (not resolved here).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraClaim {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// Per allocated device: driver, pool, device name and its CDI device names.
    pub devices: Vec<DraDevice>,
}

/// One device of a DRA claim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraDevice {
    /// The DRA driver.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
    /// Fully qualified CDI device names (`vendor.com/class=name`).
    pub cdi_devices: Vec<String>,
}

/// What the kubelet says one container was given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerAssignment {
    /// Its device-plugin grant.
    pub grant: devices::ContainerGrant,
    /// Its DRA claims.
    pub dra: Vec<DraClaim>,
}

/// What the kubelet says one pod's containers were given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodAssignment {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Per container name.
    pub containers: BTreeMap<String, ContainerAssignment>,
}

/// The kubelet's pod-resources service, as last seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeletStatus {
    /// Not configured (`[kubernetes] pod_resources_socket` absent).
    Off,
    /// Not asked yet.
    NotYet,
    /// Answering.
    Answering,
    /// No socket at the configured path.
    NoSocket(String),
    /// It answered `Unimplemented` to `List`.
    Unimplemented(String),
    /// Another failure (connect, timeout, status).
    Failed(String),
}

impl KubeletStatus {
    /// A label: `off`, `not_yet`, `ok`, `no_socket`, `unimplemented`, `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::NotYet => "not_yet",
            Self::Answering => "ok",
            Self::NoSocket(_) => "no_socket",
            Self::Unimplemented(_) => "unimplemented",
            Self::Failed(_) => "failed",
        }
    }

    /// In words for `status`'s degraded lines; `None` when there is nothing to say.
    pub fn degraded(&self) -> Option<String> {
        match self {
            Self::NoSocket(s) | Self::Unimplemented(s) | Self::Failed(s) => {
                Some(format!("kubelet pod-resources: {s}"))
            }
            _ => None,
        }
    }
}

/// The last answer, bound to pod UIDs: what the step reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodResourcesView {
    /// The service's state.
    pub status: KubeletStatus,
    /// Assignments by pod UID (dashed, lowercase).
    pub by_uid: HashMap<String, Arc<PodAssignment>>,
    /// `namespace/name` of pods bound to no UID because two live UIDs (or two entries) claim
    /// the name.
    pub ambiguous: BTreeSet<String>,
    /// Whether the kubelet answered `Unimplemented` to `Get` (then only `List` is used).
    pub get_unimplemented: bool,
    /// Device ids of no known shape in the last answer, in words.
    pub problems: Vec<String>,
    /// Answers received and calls failed so far.
    pub answers: u64,
    /// Calls that failed so far.
    pub failures: u64,
    /// Where the kubelet's container log links are (`containers/` beside `pod_logs_dir`).
    pub container_logs_dir: PathBuf,
}

impl PodResourcesView {
    /// A view with nothing in it yet.
    pub fn empty(status: KubeletStatus, settings: &KubeletSettings) -> Self {
        Self {
            status,
            by_uid: HashMap::new(),
            ambiguous: BTreeSet::new(),
            get_unimplemented: false,
            problems: Vec::new(),
            answers: 0,
            failures: 0,
            container_logs_dir: container_logs_dir(&settings.pod_logs_dir),
        }
    }

    /// The pod with UID `uid`, when the last answer covers it.
    pub fn pod(&self, uid: &str) -> Option<&Arc<PodAssignment>> {
        self.by_uid.get(&uid.to_ascii_lowercase())
    }

    /// The name of container `container_id` of `pod`, from the kubelet's log links (when the
    /// runtime spec does not say).
    pub fn container_name_from_links(
        &self,
        pod: &PodAssignment,
        container_id: &str,
    ) -> Option<String> {
        k8s_names::container_names_from_log_links(&self.container_logs_dir, container_id)
            .filter(|c| c.namespace == pod.namespace && c.pod == pod.name)
            .map(|c| c.container)
    }
}

/// `containers/` beside the pod log directory (`/var/log/containers` for `/var/log/pods`).
pub fn container_logs_dir(pod_logs_dir: &Path) -> PathBuf {
    pod_logs_dir.parent().map_or_else(
        || PathBuf::from(k8s_names::CONTAINER_LOG_ROOT),
        |p| p.join("containers"),
    )
}

/// What the kubelet says about one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeletPart {
    /// Its GPU-memory grant as a quota (source [`SOURCE`]).
    pub quota: Option<EnvQuota>,
    /// The devices it was given, when the kubelet names them.
    pub devices: Option<Vec<DeviceRef>>,
    /// Why a pod the kubelet covers has no grant here (no container name), in words.
    pub unmatched: Option<String>,
}

/// The container's assignment in `view`: its pod by UID, itself by `name` (the runtime spec's
/// annotation), else by the kubelet's container log links.
pub fn assignment<'v>(
    view: &'v PodResourcesView,
    w: &WorkloadId,
    name: Option<&str>,
) -> Result<Option<&'v ContainerAssignment>, String> {
    let (Some(uid), Some(cid)) = (w.pod_uid(), w.container_id()) else {
        return Ok(None);
    };
    let Some(pod) = view.pod(uid) else {
        return Ok(None);
    };
    let name = match name {
        Some(n) => n.to_string(),
        None => view.container_name_from_links(pod, cid).ok_or_else(|| {
            format!(
                "the kubelet lists pod {}/{} but neither the runtime spec nor a container log link names container {cid}: its grant is not applied",
                pod.namespace, pod.name
            )
        })?,
    };
    Ok(pod.containers.get(&name))
}

/// The quota and devices a container's assignment grants: GPUShare units counted from the ids
/// (in `unit`), placed on the GPU `ALIYUN_COM_GPU_MEM_IDX` (from `vars`) names among the
/// devices given (`granted`), as the environment's own value would be.
pub fn part_of(
    a: &ContainerAssignment,
    vars: &[(String, String)],
    unit: GpuShareUnit,
    gpus: &[GpuInfo],
    granted: Option<&[DeviceRef]>,
) -> KubeletPart {
    let quota = a.grant.gpushare_units.and_then(|n| {
        let n = n.to_string();
        let mut env: Vec<(&str, &str)> = vec![("ALIYUN_COM_GPU_MEM_CONTAINER", n.as_str())];
        env.extend(
            vars.iter()
                .filter(|(k, _)| k == "ALIYUN_COM_GPU_MEM_IDX")
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        env_quota_on(env, unit, gpus, granted)
            .quota
            .map(|q| EnvQuota {
                sources: SOURCE.into(),
                ..q
            })
    });
    KubeletPart {
        quota,
        devices: a.grant.devices.clone(),
        unmatched: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_has_its_label_and_the_degraded_ones_say_why() {
        let states = [
            (KubeletStatus::Off, "off", None),
            (KubeletStatus::NotYet, "not_yet", None),
            (KubeletStatus::Answering, "ok", None),
            (
                KubeletStatus::NoSocket("s1".into()),
                "no_socket",
                Some("s1"),
            ),
            (
                KubeletStatus::Unimplemented("s2".into()),
                "unimplemented",
                Some("s2"),
            ),
            (KubeletStatus::Failed("s3".into()), "failed", Some("s3")),
        ];
        for (s, label, why) in states {
            assert_eq!(s.as_str(), label);
            assert_eq!(
                s.degraded(),
                why.map(|w| format!("kubelet pod-resources: {w}")),
                "{s:?}"
            );
        }
    }

    fn pod(ns: &str, name: &str) -> PodAssignment {
        PodAssignment {
            namespace: ns.into(),
            name: name.into(),
            ..PodAssignment::default()
        }
    }

    #[test]
    fn a_containers_name_comes_from_a_log_link_of_its_own_pod() {
        let d = tempfile::tempdir().unwrap();
        let id = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";
        std::fs::create_dir_all(d.path().join("containers")).unwrap();
        std::fs::write(
            d.path().join(format!("containers/web-0_ns_main-{id}.log")),
            "",
        )
        .unwrap();
        let v = PodResourcesView::empty(
            KubeletStatus::Answering,
            &KubeletSettings {
                pod_logs_dir: d.path().join("pods"),
                ..KubeletSettings::default()
            },
        );
        assert_eq!(
            v.container_name_from_links(&pod("ns", "web-0"), id),
            Some("main".into())
        );
        assert_eq!(v.container_name_from_links(&pod("ns", "web-1"), id), None);
        assert_eq!(
            v.container_name_from_links(&pod("other", "web-0"), id),
            None
        );
        assert_eq!(
            v.container_name_from_links(&pod("other", "web-1"), id),
            None
        );
    }
}
