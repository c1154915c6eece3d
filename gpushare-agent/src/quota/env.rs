//! Quotas a workload carries in its environment, as GPUShare's and HAMi's device plugins set them.
//!
//! Design note: pure functions over `(name, value)` pairs; the caller reads `/proc/<pid>/environ`
//! (see [`parse_environ`]) and counts errors. The first occurrence of a name wins, as with
//! `getenv(3)`.
//!
//! - GPUShare: `ALIYUN_COM_GPU_MEM_CONTAINER` (an integer in the plugin's `--memory-unit`, GiB unless
//!   configured as MiB) on the host GPU `ALIYUN_COM_GPU_MEM_IDX`; an index of `-1` or no index means
//!   the device is unknown, so the limit applies to each GPU the workload uses.
//! - HAMi: `CUDA_DEVICE_MEMORY_LIMIT_<i>` for CUDA device `<i>` inside the container, and
//!   `CUDA_DEVICE_MEMORY_LIMIT` for every other device. Values are `<n>` bytes or `<n>k|m|g` (powers of
//!   1024, either case). CUDA index `<i>` is mapped to a host device through `CUDA_VISIBLE_DEVICES`
//!   (container-local indices or UUIDs) and then `NVIDIA_VISIBLE_DEVICES` (host indices or UUIDs, as
//!   the NVIDIA container runtime reads it); where neither holds a list, the index is the host index.
//! - A value of 0 means "no limit" in both plugins (GPUShare shows unset requests as 0), so it yields
//!   no quota rather than a quota of zero bytes.
//! - When both plugins' variables are present, HAMi's win: they name devices explicitly.
//!
//! Every limit is per GPU: an env quota never sums usage across GPUs.

use super::DeviceRef;

/// The unit of GPUShare's `ALIYUN_COM_GPU_MEM_*` values (the device plugin's `--memory-unit`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub enum GpuShareUnit {
    /// GiB (the plugin's default).
    #[default]
    GiB,
    /// MiB.
    MiB,
}

impl GpuShareUnit {
    /// Bytes in one unit.
    pub fn bytes(self) -> u64 {
        match self {
            Self::GiB => 1 << 30,
            Self::MiB => 1 << 20,
        }
    }
}

/// Which convention an env quota came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvSource {
    /// Alibaba GPUShare's device plugin.
    GpuShare,
    /// HAMi (also Volcano vGPU, KAI).
    Hami,
}

impl EnvSource {
    /// A short name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GpuShare => "gpushare env",
            Self::Hami => "hami env",
        }
    }
}

/// Per-GPU limits read from a process's environment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct EnvQuota {
    /// Where they came from.
    pub source: EnvSource,
    /// Limits for named host devices, bytes, in CUDA index order.
    pub per_gpu: Vec<(DeviceRef, u64)>,
    /// The limit for each other GPU the workload uses, bytes.
    pub each_gpu: Option<u64>,
}

/// A malformed quota variable. Callers count these; the process simply has no env quota.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{var}={value}`: {reason}")]
pub struct EnvQuotaError {
    /// The variable.
    pub var: String,
    /// Its value (truncated to 64 characters).
    pub value: String,
    /// What is wrong.
    pub reason: String,
}

fn error(var: &str, value: &str, reason: impl Into<String>) -> EnvQuotaError {
    EnvQuotaError {
        var: var.to_string(),
        value: value.chars().take(64).collect(),
        reason: reason.into(),
    }
}

/// Splits the bytes of `/proc/<pid>/environ` (NUL-separated `NAME=value`) into pairs. Entries
/// without `=` are skipped; invalid UTF-8 is replaced.
pub fn parse_environ(bytes: &[u8]) -> Vec<(String, String)> {
    bytes
        .split(|&b| b == 0)
        .filter(|e| !e.is_empty())
        .filter_map(|entry| {
            let eq = entry.iter().position(|&b| b == b'=')?;
            let (name, value) = (&entry[..eq], &entry[eq + 1..]);
            Some((
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            ))
        })
        .collect()
}

/// Reads the env quota, if any, from a process's environment. `Ok(None)`: no quota variables (or
/// only zero ones). See the module note for the conventions.
pub fn env_quota<'a, I>(
    environ: I,
    gpushare_unit: GpuShareUnit,
) -> Result<Option<EnvQuota>, EnvQuotaError>
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut gpushare_mem = None;
    let mut gpushare_idx = None;
    let mut hami_all = None;
    let mut hami_indexed: Vec<(u32, &str, &str)> = Vec::new();
    let mut cuda_visible = None;
    let mut nvidia_visible = None;
    let mut seen = std::collections::BTreeSet::new();
    for (name, value) in environ {
        if !seen.insert(name) {
            continue; // getenv(3) returns the first occurrence.
        }
        match name {
            "ALIYUN_COM_GPU_MEM_CONTAINER" => gpushare_mem = Some(value),
            "ALIYUN_COM_GPU_MEM_IDX" => gpushare_idx = Some(value),
            "CUDA_DEVICE_MEMORY_LIMIT" => hami_all = Some(value),
            "CUDA_VISIBLE_DEVICES" => cuda_visible = Some(value),
            "NVIDIA_VISIBLE_DEVICES" => nvidia_visible = Some(value),
            _ => {
                if let Some(index) = name.strip_prefix("CUDA_DEVICE_MEMORY_LIMIT_") {
                    let i = index
                        .parse::<u32>()
                        .ok()
                        .filter(|_| index.bytes().all(|b| b.is_ascii_digit()))
                        .ok_or_else(|| error(name, value, "the suffix must be a CUDA index"))?;
                    hami_indexed.push((i, name, value));
                }
            }
        }
    }

    if hami_all.is_some() || !hami_indexed.is_empty() {
        let each_gpu = match hami_all {
            Some(v) => parse_hami_limit("CUDA_DEVICE_MEMORY_LIMIT", v)?,
            None => None,
        };
        hami_indexed.sort();
        let mut per_gpu = Vec::new();
        for (cuda_index, name, value) in hami_indexed {
            let Some(bytes) = parse_hami_limit(name, value)? else {
                continue;
            };
            let device = map_cuda_index(cuda_index, cuda_visible, nvidia_visible)
                .map_err(|reason| error(name, value, reason))?;
            if per_gpu.iter().any(|(d, _)| *d == device) {
                return Err(error(
                    name,
                    value,
                    format!("names device {device} a second time"),
                ));
            }
            per_gpu.push((device, bytes));
        }
        if each_gpu.is_some() || !per_gpu.is_empty() {
            return Ok(Some(EnvQuota {
                source: EnvSource::Hami,
                per_gpu,
                each_gpu,
            }));
        }
        return Ok(None);
    }

    let Some(mem) = gpushare_mem else {
        return Ok(None);
    };
    const MEM: &str = "ALIYUN_COM_GPU_MEM_CONTAINER";
    let amount: u64 = mem.trim().parse().map_err(|_| {
        error(
            MEM,
            mem,
            "expected a whole number of the plugin's memory unit",
        )
    })?;
    let bytes = amount
        .checked_mul(gpushare_unit.bytes())
        .ok_or_else(|| error(MEM, mem, "too large"))?;
    if bytes == 0 {
        return Ok(None);
    }
    const IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";
    let index = match gpushare_idx.map(str::trim) {
        None | Some("") | Some("-1") => None,
        Some(idx) => Some(idx.parse::<u32>().map_err(|_| {
            error(
                IDX,
                idx,
                "expected a GPU index (or -1 when the device is unknown)",
            )
        })?),
    };
    Ok(Some(match index {
        Some(i) => EnvQuota {
            source: EnvSource::GpuShare,
            per_gpu: vec![(DeviceRef::Index(i), bytes)],
            each_gpu: None,
        },
        None => EnvQuota {
            source: EnvSource::GpuShare,
            per_gpu: Vec::new(),
            each_gpu: Some(bytes),
        },
    }))
}

/// HAMi's limit syntax: bytes, or a number with a `k`/`m`/`g` suffix (powers of 1024). 0 = none.
fn parse_hami_limit(name: &str, value: &str) -> Result<Option<u64>, EnvQuotaError> {
    let v = value.trim();
    let (digits, mult) = match v.as_bytes().last() {
        Some(b'k' | b'K') => (&v[..v.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&v[..v.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(error(
            name,
            value,
            "expected bytes or a number with a k, m or g suffix, e.g. `4096m`",
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| error(name, value, "too large"))?;
    let bytes = n
        .checked_mul(mult)
        .ok_or_else(|| error(name, value, "too large"))?;
    Ok((bytes > 0).then_some(bytes))
}

/// A visible-devices list, or `None` when the variable does not restrict by index or UUID.
fn device_list(value: Option<&str>) -> Result<Option<Vec<DeviceRef>>, String> {
    let Some(value) = value.map(str::trim) else {
        return Ok(None);
    };
    if matches!(value, "all" | "none" | "void" | "") {
        return Ok(None);
    }
    value
        .split(',')
        .map(|entry| {
            let entry = entry.trim();
            if entry.starts_with("GPU-") || entry.starts_with("MIG-") {
                Ok(DeviceRef::Uuid(entry.to_string()))
            } else {
                entry
                    .parse::<u32>()
                    .map(DeviceRef::Index)
                    .map_err(|_| format!("cannot read visible device `{entry}`"))
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn map_cuda_index(
    cuda_index: u32,
    cuda_visible: Option<&str>,
    nvidia_visible: Option<&str>,
) -> Result<DeviceRef, String> {
    let host = device_list(nvidia_visible).map_err(|e| format!("NVIDIA_VISIBLE_DEVICES: {e}"))?;
    let cuda = device_list(cuda_visible).map_err(|e| format!("CUDA_VISIBLE_DEVICES: {e}"))?;
    // A container-local index into the host list (identity when there is none).
    let through_host = |local: u32| -> Result<DeviceRef, String> {
        match &host {
            None => Ok(DeviceRef::Index(local)),
            Some(list) => list.get(local as usize).cloned().ok_or_else(|| {
                format!(
                    "device {local} is not among the {} in NVIDIA_VISIBLE_DEVICES",
                    list.len()
                )
            }),
        }
    };
    match cuda {
        Some(list) => match list.get(cuda_index as usize) {
            Some(DeviceRef::Index(local)) => through_host(*local),
            Some(uuid) => Ok(uuid.clone()),
            None => Err(format!(
                "CUDA device {cuda_index} is not among the {} in CUDA_VISIBLE_DEVICES",
                list.len()
            )),
        },
        None => through_host(cuda_index),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn quota(
        pairs: &[(&str, &str)],
        unit: GpuShareUnit,
    ) -> Result<Option<EnvQuota>, EnvQuotaError> {
        env_quota(pairs.iter().copied(), unit)
    }

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn gpushare_request_on_a_known_or_unknown_device() {
        let q = quota(
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "3"),
                ("ALIYUN_COM_GPU_MEM_IDX", "1"),
                ("ALIYUN_COM_GPU_MEM_DEV", "16"),
            ],
            GpuShareUnit::GiB,
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.source, EnvSource::GpuShare);
        assert_eq!(q.per_gpu, vec![(DeviceRef::Index(1), 3 * GIB)]);
        assert_eq!(q.each_gpu, None);

        for idx in [None, Some("-1")] {
            let mut env = vec![("ALIYUN_COM_GPU_MEM_CONTAINER", "2048")];
            env.extend(idx.map(|i| ("ALIYUN_COM_GPU_MEM_IDX", i)));
            let q = quota(&env, GpuShareUnit::MiB).unwrap().unwrap();
            assert_eq!(q.per_gpu, vec![]);
            assert_eq!(q.each_gpu, Some(2048 * MIB));
        }
        // 0 is "unset", not "nothing allowed".
        assert_eq!(
            quota(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "0")], GpuShareUnit::GiB),
            Ok(None)
        );
        assert!(
            quota(
                &[("ALIYUN_COM_GPU_MEM_CONTAINER", "1.5")],
                GpuShareUnit::GiB
            )
            .is_err()
        );
        let e = quota(
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "1"),
                ("ALIYUN_COM_GPU_MEM_IDX", "x"),
            ],
            GpuShareUnit::GiB,
        )
        .unwrap_err();
        assert_eq!(e.var, "ALIYUN_COM_GPU_MEM_IDX");
        assert!(
            quota(
                &[("ALIYUN_COM_GPU_MEM_CONTAINER", "99999999999999999")],
                GpuShareUnit::GiB
            )
            .is_err()
        );
    }

    #[test]
    fn hami_limits_map_cuda_indices_to_host_devices() {
        // No visible-devices list: identity.
        let q = quota(
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "2048m"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            ],
            GpuShareUnit::GiB,
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.source, EnvSource::Hami);
        assert_eq!(
            q.per_gpu,
            vec![(DeviceRef::Index(0), GIB), (DeviceRef::Index(1), 2 * GIB)]
        );
        // HAMi puts UUIDs in NVIDIA_VISIBLE_DEVICES.
        let q = quota(
            &[
                ("NVIDIA_VISIBLE_DEVICES", "GPU-aaa,GPU-bbb"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "512M"),
            ],
            GpuShareUnit::GiB,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            q.per_gpu,
            vec![(DeviceRef::Uuid("GPU-bbb".into()), 512 * MIB)]
        );
        // Host indices, then a container-local CUDA_VISIBLE_DEVICES on top.
        let q = quota(
            &[
                ("NVIDIA_VISIBLE_DEVICES", "2,3"),
                ("CUDA_VISIBLE_DEVICES", "1"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024k"),
            ],
            GpuShareUnit::GiB,
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.per_gpu, vec![(DeviceRef::Index(3), MIB)]);
        // Fallback for all, a bare number is bytes, "all" is identity.
        let q = quota(
            &[
                ("NVIDIA_VISIBLE_DEVICES", "all"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "1000"),
            ],
            GpuShareUnit::GiB,
        )
        .unwrap()
        .unwrap();
        assert_eq!((q.per_gpu.clone(), q.each_gpu), (vec![], Some(1000)));
        // HAMi wins over GPUShare.
        let q = quota(
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "3"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ],
            GpuShareUnit::GiB,
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.source, EnvSource::Hami);
        // The first occurrence wins.
        let q = quota(
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
            ],
            GpuShareUnit::GiB,
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.each_gpu, Some(GIB));
        assert_eq!(
            quota(&[("CUDA_DEVICE_MEMORY_LIMIT", "0")], GpuShareUnit::GiB),
            Ok(None)
        );
        assert_eq!(quota(&[("PATH", "/bin")], GpuShareUnit::GiB), Ok(None));
    }

    #[test]
    fn malformed_hami_values_are_errors() {
        for env in [
            vec![("CUDA_DEVICE_MEMORY_LIMIT", "4gb")],
            vec![("CUDA_DEVICE_MEMORY_LIMIT", "m")],
            vec![("CUDA_DEVICE_MEMORY_LIMIT", "-1m")],
            vec![("CUDA_DEVICE_MEMORY_LIMIT", "99999999999999999999g")],
            vec![("CUDA_DEVICE_MEMORY_LIMIT_x", "1g")],
            vec![("CUDA_DEVICE_MEMORY_LIMIT_+1", "1g")],
            vec![
                ("CUDA_VISIBLE_DEVICES", "0"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g"),
            ],
            vec![
                ("NVIDIA_VISIBLE_DEVICES", "gpu0"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            ],
            vec![
                ("CUDA_VISIBLE_DEVICES", "0,0"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g"),
            ],
        ] {
            assert!(quota(&env, GpuShareUnit::GiB).is_err(), "{env:?}");
        }
    }

    #[test]
    fn environ_bytes_split_on_nul_and_first_equals() {
        let raw = b"PATH=/bin\0A=b=c\0NOEQUALS\0\0EMPTY=\0X=\xff\0";
        let env = parse_environ(raw);
        assert_eq!(
            env,
            vec![
                ("PATH".into(), "/bin".into()),
                ("A".into(), "b=c".into()),
                ("EMPTY".into(), "".into()),
                ("X".into(), "\u{fffd}".into()),
            ]
        );
        assert!(parse_environ(b"").is_empty());
    }

    proptest! {
        #[test]
        fn never_panics(
            entries in proptest::collection::vec(
                (
                    prop_oneof![
                        Just("ALIYUN_COM_GPU_MEM_CONTAINER".to_string()),
                        Just("ALIYUN_COM_GPU_MEM_IDX".to_string()),
                        Just("CUDA_DEVICE_MEMORY_LIMIT".to_string()),
                        Just("CUDA_VISIBLE_DEVICES".to_string()),
                        Just("NVIDIA_VISIBLE_DEVICES".to_string()),
                        "CUDA_DEVICE_MEMORY_LIMIT_[0-9x]{0,3}",
                        ".{0,8}",
                    ],
                    "[-0-9a-zA-Z,.]{0,12}|.{0,12}",
                ),
                0..6,
            ),
            mib in any::<bool>(),
        ) {
            let unit = if mib { GpuShareUnit::MiB } else { GpuShareUnit::GiB };
            let _ = env_quota(entries.iter().map(|(k, v)| (k.as_str(), v.as_str())), unit);
        }

        #[test]
        fn environ_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_environ(&bytes);
        }
    }
}
