//! The kubelet's grant of one container, from the last pod-resources view
//! ([`crate::kube::podresources`]): found by pod UID and container name, turned into a quota in
//! the same terms as the environment's.

use crate::{
    attribution::WorkloadId,
    grants::env::env_quota_on,
    kube::podresources::{ContainerAssignment, PodResourcesView},
    quota::{DeviceRef, EnvQuota, GpuInfo, GpuShareUnit, GrantSource},
};

/// What the kubelet says about one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeletPart {
    /// Its GPU-memory grant as a quota (source [`GrantSource::Kubelet`]).
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
                sources: GrantSource::Kubelet.into(),
                ..q
            })
    });
    KubeletPart {
        quota,
        devices: a.grant.devices.clone(),
        unmatched: None,
    }
}
