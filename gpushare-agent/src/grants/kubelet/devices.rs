//! The device ids a kubelet's pod-resources reply names, per resource, and what they grant one
//! container (pure).
//!
//! Shapes in use (2026):
//! - GPUShare (`aliyun.com/gpu-mem`): fake ids `<gpu uuid>-_-<n>`, one per unit of GPU memory. The
//!   kubelet picks any free ids, possibly on several GPUs, and the device plugin's Allocate ignores
//!   which: only their **count** is the grant, in `gpushare_memory_unit`; the GPU is the one the
//!   scheduler extender chose, which the plugin writes into `ALIYUN_COM_GPU_MEM_IDX`.
//! - NVIDIA (`nvidia.com/gpu`, `nvidia.com/mig-*`): `GPU-<uuid>`, `GPU-<uuid>::<n>` (replica `n` of
//!   a time-sliced GPU), `MIG-<uuid>` (and its replicas), or a plain index (`--device-id-strategy
//!   index`). These say which devices the container was given, not how much memory: they resolve
//!   per-device environment limits the way the runtime spec's devices do.
//!
//! An id of no known shape under a known resource is a problem the caller counts; resources of
//! other vendors are ignored.

use crate::quota::DeviceRef;

/// GPUShare's GPU-memory resource.
pub const GPUSHARE_MEMORY: &str = "aliyun.com/gpu-mem";
/// NVIDIA device plugin resources start with this (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`).
pub const NVIDIA_PREFIX: &str = "nvidia.com/";

/// One device id, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceId {
    /// One unit of GPUShare memory (the GPU named in the id is not where it applies).
    GpuShareUnit,
    /// A whole device, or replica `replica` of a time-sliced one.
    Device {
        /// The GPU or MIG device.
        device: DeviceRef,
        /// The replica number, when time-sliced (`::<n>`).
        replica: Option<u32>,
    },
}

fn is_uuid_tail(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

fn digits(s: &str) -> Option<u32> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// Reads device id `id` of resource `resource`. `Ok(None)`: a resource this module does not read;
/// `Err`: a known resource's id of no known shape (in words).
pub fn parse_device_id(resource: &str, id: &str) -> Result<Option<DeviceId>, String> {
    if resource == GPUSHARE_MEMORY {
        return match id.rsplit_once("-_-") {
            Some((gpu, n)) if !gpu.is_empty() && digits(n).is_some() => {
                Ok(Some(DeviceId::GpuShareUnit))
            }
            _ => Err(format!(
                "{resource} device id {id:?} is not GPUShare's `<uuid>-_-<n>`"
            )),
        };
    }
    if !resource.starts_with(NVIDIA_PREFIX) {
        return Ok(None);
    }
    let (base, replica) = match id.split_once("::") {
        Some((base, n)) => match digits(n) {
            Some(n) => (base, Some(n)),
            None => {
                return Err(format!(
                    "{resource} device id {id:?}: the replica after `::` is not a number"
                ));
            }
        },
        None => (id, None),
    };
    let device = if let Some(tail) = base
        .strip_prefix("GPU-")
        .or_else(|| base.strip_prefix("MIG-"))
    {
        if !is_uuid_tail(tail) {
            return Err(format!("{resource} device id {id:?} is not a device UUID"));
        }
        DeviceRef::Uuid(base.to_string())
    } else if let Some(i) = digits(base) {
        DeviceRef::Index(i)
    } else {
        return Err(format!(
            "{resource} device id {id:?} is neither `GPU-<uuid>`, `MIG-<uuid>` nor an index"
        ));
    };
    Ok(Some(DeviceId::Device { device, replica }))
}

/// What a container's device assignments grant it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerGrant {
    /// GPUShare units (the count of `aliyun.com/gpu-mem` ids); `None` when it has none.
    pub gpushare_units: Option<u64>,
    /// The devices it was given (replicas folded into their device), in the reply's order, each
    /// once; `None` when no NVIDIA resource was assigned.
    pub devices: Option<Vec<DeviceRef>>,
    /// Ids of no known shape, in words (counted, never a grant).
    pub problems: Vec<String>,
}

impl ContainerGrant {
    /// Whether it grants nothing this agent reads.
    pub fn is_empty(&self) -> bool {
        self.gpushare_units.is_none() && self.devices.is_none()
    }
}

/// The grant of one container's `(resource, device ids)` assignments.
pub fn container_grant<'a, I, S>(assignments: I) -> ContainerGrant
where
    I: IntoIterator<Item = (&'a str, S)>,
    S: IntoIterator<Item = &'a str>,
{
    let mut g = ContainerGrant::default();
    let mut units = 0u64;
    let mut seen_units = false;
    let mut devices: Vec<DeviceRef> = Vec::new();
    let mut seen_devices = false;
    for (resource, ids) in assignments {
        for id in ids {
            match parse_device_id(resource, id) {
                Ok(Some(DeviceId::GpuShareUnit)) => {
                    seen_units = true;
                    units += 1;
                }
                Ok(Some(DeviceId::Device { device, .. })) => {
                    seen_devices = true;
                    if !devices.contains(&device) {
                        devices.push(device);
                    }
                }
                Ok(None) => {}
                Err(e) => g.problems.push(e),
            }
        }
    }
    g.gpushare_units = seen_units.then_some(units);
    g.devices = seen_devices.then_some(devices);
    g
}

/// Whether two device lists name different devices (order aside): a disagreement between the
/// kubelet and the runtime spec.
pub fn devices_disagree(a: &[DeviceRef], b: &[DeviceRef]) -> bool {
    a.iter().any(|d| !b.contains(d)) || b.iter().any(|d| !a.contains(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "GPU-8f6c2d1e-3b4a-4c5d-9e8f-7a6b5c4d3e2f";

    fn dev(id: &str) -> Result<Option<DeviceId>, String> {
        parse_device_id("nvidia.com/gpu", id)
    }

    #[test]
    fn gpushare_ids_are_units_whatever_gpu_they_name() {
        for id in [
            format!("{UUID}-_-0"),
            format!("{UUID}-_-15"),
            "GPU-x-_-3".to_string(),
        ] {
            assert_eq!(
                parse_device_id(GPUSHARE_MEMORY, &id),
                Ok(Some(DeviceId::GpuShareUnit)),
                "{id}"
            );
        }
        // `+1` parses as a number but is no id a plugin writes.
        for bad in [
            UUID,
            "-_-3",
            "GPU-x-_-",
            "GPU-x-_-a",
            "GPU-x-_--1",
            "GPU-x-_-+1",
            "",
        ] {
            assert!(parse_device_id(GPUSHARE_MEMORY, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nvidia_ids_name_devices_replicas_folded() {
        assert_eq!(
            dev(UUID),
            Ok(Some(DeviceId::Device {
                device: DeviceRef::Uuid(UUID.into()),
                replica: None
            }))
        );
        assert_eq!(
            dev(&format!("{UUID}::3")),
            Ok(Some(DeviceId::Device {
                device: DeviceRef::Uuid(UUID.into()),
                replica: Some(3)
            }))
        );
        let mig = "MIG-4a3b2c1d-0e9f-4a8b-8c7d-6e5f4a3b2c1d";
        assert_eq!(
            parse_device_id("nvidia.com/mig-1g.10gb", &format!("{mig}::0")),
            Ok(Some(DeviceId::Device {
                device: DeviceRef::Uuid(mig.into()),
                replica: Some(0)
            }))
        );
        assert_eq!(
            dev("1"),
            Ok(Some(DeviceId::Device {
                device: DeviceRef::Index(1),
                replica: None
            }))
        );
        for bad in [
            "GPU-",
            "GPU-zz",
            "gpu0",
            "",
            "-1",
            "+1",
            &format!("{UUID}::+1"),
            &format!("{UUID}::"),
            &format!("{UUID}::x"),
            "MIG-",
        ] {
            assert!(dev(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_device_id("example.com/fpga", "anything"), Ok(None));
        assert_eq!(parse_device_id("nvidia.com", "0"), Ok(None));
    }

    #[test]
    fn a_container_grant_counts_units_and_lists_devices_once() {
        let units = [
            format!("{UUID}-_-0"),
            format!("{UUID}-_-1"),
            "GPU-other-_-7".to_string(),
        ];
        let gpus = [format!("{UUID}::0"), format!("{UUID}::1"), "2".to_string()];
        let g = container_grant([
            (
                GPUSHARE_MEMORY,
                units.iter().map(String::as_str).collect::<Vec<_>>(),
            ),
            ("nvidia.com/gpu", gpus.iter().map(String::as_str).collect()),
            ("example.com/nic", vec!["eth9"]),
            ("nvidia.com/gpu", vec!["GPU-zz"]),
        ]);
        assert_eq!(g.gpushare_units, Some(3));
        assert_eq!(
            g.devices,
            Some(vec![DeviceRef::Uuid(UUID.into()), DeviceRef::Index(2)])
        );
        assert_eq!(g.problems.len(), 1, "{:?}", g.problems);
        assert!(!g.is_empty());
        let none = container_grant([("example.com/nic", vec!["eth0"])]);
        assert_eq!(none, ContainerGrant::default());
        assert!(none.is_empty());
        // A resource with no ids grants nothing (not zero units).
        let empty = container_grant([(GPUSHARE_MEMORY, Vec::<&str>::new())]);
        assert_eq!(empty.gpushare_units, None);
        let only_units = container_grant([(GPUSHARE_MEMORY, vec!["GPU-a-_-0"])]);
        assert_eq!(
            (only_units.gpushare_units, only_units.devices.clone()),
            (Some(1), None)
        );
        assert!(!only_units.is_empty());
        let only_devices = container_grant([("nvidia.com/gpu", vec!["0"])]);
        assert!(!only_devices.is_empty());
    }

    #[test]
    fn device_lists_disagree_when_either_names_one_the_other_does_not() {
        let (a, b) = (DeviceRef::Index(0), DeviceRef::Index(1));
        assert!(!devices_disagree(
            &[a.clone(), b.clone()],
            &[b.clone(), a.clone()]
        ));
        assert!(devices_disagree(
            std::slice::from_ref(&a),
            &[a.clone(), b.clone()]
        ));
        assert!(devices_disagree(
            &[a.clone(), b.clone()],
            std::slice::from_ref(&a)
        ));
        assert!(!devices_disagree(&[], &[]));
    }
}
