//! What a grant is, whichever source gives it (pure): limits per GPU with the set of sources
//! that bind ([`EnvQuota`]), how far the environment it came from is trusted ([`Trust`]), the
//! GPUs it names resolved to NVML indices ([`resolve_quota`]), and the limits one reading of one
//! source collects ([`Limits`]). Reading the vendors' variables is `grants::env`'s job, combining
//! grants `grants::merge`'s; the quota file's `gpushare_memory_unit` is a [`GpuShareUnit`].

use std::collections::BTreeMap;

use super::{DeviceRef, Sources};

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

    /// `GiB` or `MiB`, as written in a quota file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GiB => "GiB",
            Self::MiB => "MiB",
        }
    }

    /// The other unit (a 1024x error either way).
    pub fn other(self) -> Self {
        match self {
            Self::GiB => Self::MiB,
            Self::MiB => Self::GiB,
        }
    }
}

/// How far the environment an env quota was read from can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// The container's runtime spec (Docker's `config.v2.json`, the OCI bundle's `config.json`):
    /// what the runtime was told to give the container, which nothing inside it can change.
    RuntimeSpec,
    /// No spec was found: the environment of the container's first process (its init), as the
    /// runtime started it. Lower trust: a process can rewrite its own environment block.
    InitEnviron,
    /// The kubelet's pod-resources API: what the node admitted the pod with, which no pod can
    /// write.
    Kubelet,
}

impl Trust {
    /// Label value: `runtime_spec` or `init_environ`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RuntimeSpec => "runtime_spec",
            Self::InitEnviron => "init_environ",
            Self::Kubelet => "kubelet",
        }
    }
}

/// Per-GPU limits read from a container's environment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct EnvQuota {
    /// Where they came from: the sources that bind on some GPU.
    pub sources: Sources,
    /// Limits for named host devices, bytes, in device order, each device once.
    pub per_gpu: Vec<(DeviceRef, u64)>,
    /// The limit for each other GPU the workload uses, bytes.
    pub each_gpu: Option<u64>,
}

/// One GPU as the env quota sees it: its NVML index, UUID and memory size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// NVML (host) index.
    pub index: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Total memory, bytes.
    pub memory_total: u64,
    /// `nvmlDeviceGetMinorNumber`: the `N` of its `/dev/nvidia<N>` (`None` where NVML did not say).
    pub minor: Option<u32>,
}

/// A device as an NVML index where `gpus` tell which GPU it is (a UUID or a device minor they
/// list); else as it was named. A minor is never taken for an index: one that `gpus` do not list
/// stays a minor, which binds no GPU.
pub fn resolve_device(d: DeviceRef, gpus: &[GpuInfo]) -> DeviceRef {
    let found = match &d {
        DeviceRef::Index(_) => None,
        DeviceRef::Uuid(u) => gpus.iter().find(|g| g.uuid == *u),
        DeviceRef::Minor(m) => gpus.iter().find(|g| g.minor == Some(*m)),
    };
    found.map_or(d, |g| DeviceRef::Index(g.index))
}

/// `q` with its devices resolved ([`resolve_device`]); two names of one GPU keep the smaller limit.
pub fn resolve_quota(q: EnvQuota, gpus: &[GpuInfo]) -> EnvQuota {
    let mut per: BTreeMap<DeviceRef, u64> = BTreeMap::new();
    for (d, b) in q.per_gpu {
        let e = per.entry(resolve_device(d, gpus)).or_insert(b);
        *e = (*e).min(b);
    }
    EnvQuota {
        per_gpu: per.into_iter().collect(),
        ..q
    }
}

/// The limits one reading of one source collects (one container's variables, one pod's
/// annotations): per device (the smallest wins) and for every GPU (the smallest wins). Grants of
/// different reads are combined by `grants::merge`, never here.
#[derive(Default)]
pub struct Limits {
    per_gpu: BTreeMap<DeviceRef, u64>,
    each_gpu: Option<u64>,
}

impl Limits {
    /// A limit on device `d`.
    pub fn device(&mut self, d: DeviceRef, bytes: u64) {
        let e = self.per_gpu.entry(d).or_insert(bytes);
        *e = (*e).min(bytes);
    }

    /// A limit on every GPU.
    pub fn each(&mut self, bytes: u64) {
        self.each_gpu = Some(self.each_gpu.map_or(bytes, |b| b.min(bytes)));
    }

    /// Whether it holds no limit.
    pub fn is_empty(&self) -> bool {
        self.per_gpu.is_empty() && self.each_gpu.is_none()
    }

    /// `other`'s limits too, the smallest per device.
    pub fn add(&mut self, other: Limits) {
        for (d, b) in other.per_gpu {
            self.device(d, b);
        }
        if let Some(b) = other.each_gpu {
            self.each(b);
        }
    }

    /// The limits as a grant of `sources`, each device's capped by the every-GPU one; `None`
    /// without a limit.
    pub fn into_quota(self, sources: Sources) -> Option<EnvQuota> {
        if self.is_empty() {
            return None;
        }
        let each_gpu = self.each_gpu;
        let per_gpu = self
            .per_gpu
            .into_iter()
            .map(|(d, b)| (d, each_gpu.map_or(b, |e| b.min(e))))
            .collect();
        Some(EnvQuota {
            sources,
            per_gpu,
            each_gpu,
        })
    }
}
