//! Quotas a container carries in its environment, as GPUShare's and HAMi's device plugins set them.
//!
//! - Reads: `(name, value)` pairs, pure ([`env_quota_on`]; where they come from is
//!   [`crate::grants::env_quotas`]'s).
//! - Grants, per GPU, with source the convention's vendor ([`GrantSource::GpuShare`],
//!   [`GrantSource::Hami`], [`GrantSource::Nvidia`], [`GrantSource::Mps`]): a limit per device
//!   ordinal, placed on the GPUs the runtime gave, or one for each GPU, as below.
//!
//! Design note: pure functions over `(name, value)` pairs. Where the pairs come from (the
//! container's runtime spec, else its init process) is [`crate::grants::env_quotas::runtime_spec`]'s job
//! and how far they are trusted is reported beside the quota ([`crate::quota::Trust`]); this module only turns
//! the variables into limits. The variables, their vendors, forms and what each grants are one
//! declared list, [`CONVENTIONS`] (`env/conventions.rs`); [`env_quota_on`] walks it.
//!
//! - GPUShare: `ALIYUN_COM_GPU_MEM_CONTAINER` (an integer in the plugin's `--memory-unit`, GiB unless
//!   configured as MiB) on the host GPU `ALIYUN_COM_GPU_MEM_IDX`; an index of `-1`, no index, or an
//!   index that cannot be read means the device is unknown, so the limit applies to each GPU the
//!   workload uses. `ALIYUN_COM_GPU_MEM_DEV` is the device's size in the same unit: it is checked
//!   against the GPU's real memory ([`UnitCheck`]).
//! - HAMi (also KAI's `hamicore` binder and HAMi's DRA driver): `CUDA_DEVICE_MEMORY_LIMIT_<i>` for
//!   device ordinal `<i>` of the container, and `CUDA_DEVICE_MEMORY_LIMIT` for every device. Values
//!   are `<n>` bytes or `<n>k|m|g` (powers of 1024, either case).
//! - NVIDIA (kai-gpu-fractioning, read by nvidia-container-toolkit's `apply-cuda-memory-limits`
//!   hook): `NVIDIA_GPU_MEMORY_LIMIT` / `_LIMITS`, integer MiB, one value for every device or a
//!   comma-separated one per ordinal; `NVIDIA_GPU_MEMORY_REQUEST` / `_REQUESTS` is reported beside
//!   it ([`EnvQuotaReport::request`]) and is never a limit.
//! - MPS (Amazon ECS's MPS allocation): `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, `<ordinal>=<size>`
//!   and `GPU-<uuid>=<size>` entries (NVIDIA's recommended form), comma-separated and mixed
//!   (`0=4G,GPU-8f6c...=512MB`; K/M/G/T with or without `B`, powers of 1024; a bare number is
//!   bytes), or one size for every device. A UUID naming a GPU the container cannot see makes MPS
//!   drop every pinned limit: such a grant is reported as dropped and grants nothing
//!   ([`DisagreementKind::MpsDropped`]).
//!
//! **Devices from what the runtime gave.** A device ordinal `<i>` is the `<i>`-th GPU the runtime
//! gave the container (`granted` of [`env_quota_on`]: its spec's `/dev/nvidiaN` nodes or CDI
//! devices; a node's `N` is its minor, which becomes an NVML index only through the GPU whose
//! `nvmlDeviceGetMinorNumber` it is, [`resolve_device`]: NVML's index follows PCI order and can
//! differ; a minor no GPU has binds no GPU and is reported, [`DisagreementKind::UnknownMinor`]),
//! never what `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES` alone say: an image sets those too.
//! Where those variables name another device for the ordinal the disagreement is reported
//! ([`Disagreement`]); the limit stays on the runtime's GPU and, when the named one was given too,
//! applies to both (the smaller applies on the GPU really used). With no device list from the
//! runtime, or an ordinal beyond it, a per-device limit bounds every GPU. GPUShare's
//! `ALIYUN_COM_GPU_MEM_IDX` naming a GPU the runtime did not give also bounds every GPU instead.
//!
//! **No escape.** Every variable can only add a limit or lower one; none can remove or raise a limit
//! another variable sets:
//! - a value of 0 means "no limit" (GPUShare shows unset requests as 0), so it adds nothing, and
//!   removes nothing either. HAMi never writes 0, and no plugin grants more than a GPU holds: such a
//!   value is the image's or the pod's (on CRI-O the pod's `env:` replaces the plugin's value of the
//!   same name) and is reported ([`DisagreementKind::NoPluginValue`]); it lifts nothing;
//! - a malformed value (or a HAMi index that cannot be mapped to a host device) is reported in
//!   [`EnvQuotaReport::problems`] and ignored, except that an indexed HAMi limit whose device cannot
//!   be told applies to every GPU (bounded is better than unbounded);
//! - when a name appears more than once, or several conventions' variables are present, every
//!   valid value counts and, per device, the smallest limit applies. A limit for every GPU also caps each
//!   per-device limit.
//!
//! **Units.** GPUShare's values carry no unit. `ALIYUN_COM_GPU_MEM_DEV`, written by the same plugin
//! in the same unit, tells which one it is: when the device size read in the configured
//! `gpushare_memory_unit` is not the GPU's real size but is in the other unit, the plugin's own
//! unit is evidently the other one, and that is the unit applied (a 1024x error either way would
//! leave the container unbounded or freeze it for using 1/1024 of its grant); the mismatch is
//! reported ([`UnitCheck::Mismatch`]) so the operator can fix the setting. Without a usable device
//! size the configured unit applies.
//!
//! Every limit is per GPU: an env quota never sums usage across GPUs.

mod conventions;

pub use self::conventions::{CONVENTIONS, Convention, Form, Grants};
use self::conventions::{CUDA_VISIBLE, GS_DEV, GS_IDX, GS_MEM, Judge, NVIDIA_VISIBLE, Vars};
use crate::quota::{
    DeviceRef, EnvQuota, GpuInfo, GpuShareUnit, GrantSource, Limits, Sources, resolve_device,
};

/// A malformed quota variable. Callers count and log these; the variable is ignored.
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

/// What `ALIYUN_COM_GPU_MEM_DEV` says about the GPUShare unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitCheck {
    /// No GPUShare request, or no device size given: nothing to check.
    NotApplicable,
    /// The device size is given, but the GPU's size is not known (no sample yet, device not found).
    Unknown,
    /// The device size matches the GPU in the configured unit.
    Agrees,
    /// The device size matches the GPU only in the other unit: the plugin runs with `plugin`, the
    /// configuration says `configured`. The plugin's unit was applied.
    Mismatch {
        /// `gpushare_memory_unit`.
        configured: GpuShareUnit,
        /// The unit the device size shows the plugin uses (applied).
        plugin: GpuShareUnit,
        /// `ALIYUN_COM_GPU_MEM_DEV`.
        dev: u64,
        /// The GPU's memory, bytes.
        gpu_bytes: u64,
    },
    /// The device size matches the GPU in neither unit (another GPU, a MIG slice, a stale value):
    /// the configured unit was applied.
    Unexplained {
        /// `ALIYUN_COM_GPU_MEM_DEV`.
        dev: u64,
        /// The GPU's memory, bytes.
        gpu_bytes: u64,
    },
}

impl UnitCheck {
    /// Whether the operator should hear about it.
    pub fn disagrees(&self) -> bool {
        matches!(self, Self::Mismatch { .. } | Self::Unexplained { .. })
    }

    /// In words, for logs and `status`; `None` when there is nothing to say.
    pub fn describe(&self) -> Option<String> {
        match *self {
            Self::Mismatch {
                configured,
                plugin,
                dev,
                gpu_bytes,
            } => Some(format!(
                "ALIYUN_COM_GPU_MEM_DEV={dev} is the GPU's size ({}) in {}, not in the configured gpushare_memory_unit = \"{}\": \
                 the device plugin's --memory-unit is {}, so its values are read in {} (set gpushare_memory_unit = \"{}\")",
                crate::quota::ByteSize(gpu_bytes).approx(),
                plugin.as_str(),
                configured.as_str(),
                plugin.as_str(),
                plugin.as_str(),
                plugin.as_str()
            )),
            Self::Unexplained { dev, gpu_bytes } => Some(format!(
                "ALIYUN_COM_GPU_MEM_DEV={dev} matches the GPU's size ({}) in neither GiB nor MiB: the configured gpushare_memory_unit is applied",
                crate::quota::ByteSize(gpu_bytes).approx()
            )),
            _ => None,
        }
    }
}

/// The result of reading one environment: the quota (if any), every variable that was ignored and
/// why, and the unit cross-check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvQuotaReport {
    /// The quota, `None` when no variable sets a limit.
    pub quota: Option<EnvQuota>,
    /// Malformed variables, ignored.
    pub problems: Vec<EnvQuotaError>,
    /// What `ALIYUN_COM_GPU_MEM_DEV` said.
    pub unit_check: UnitCheck,
    /// Where the variables and the devices the runtime gave disagree, or a value no plugin writes.
    pub disagreements: Vec<Disagreement>,
    /// `NVIDIA_GPU_MEMORY_REQUEST(S)`, bytes (the smallest): shown beside the limit, never a limit.
    pub request: Option<u64>,
}

/// Why a container's variables and what its runtime gave it disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DisagreementKind {
    /// A variable names a GPU the runtime did not give the container (or none at all): the limit
    /// stays on the GPU the runtime gave, or bounds every GPU.
    NotGranted,
    /// The visible-devices variables order the given GPUs differently from the runtime: the limit
    /// applies to both candidates.
    OtherGranted,
    /// A per-device variable for an ordinal beyond the GPUs the runtime gave: it bounds every GPU.
    BeyondGranted,
    /// A value no device plugin writes (HAMi's 0, more than a GPU holds): the image's or the pod's.
    /// It sets no limit that binds and lifts none.
    NoPluginValue,
    /// The kubelet's pod-resources reply names other devices than the runtime spec: per-device
    /// limits are placed both ways and the smaller applies.
    KubeletDevices,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` names a GPU the container cannot see: MPS then drops
    /// every pinned limit of the client, so the variable grants nothing.
    MpsDropped,
    /// The runtime gave a device node (`/dev/nvidia<minor>`) whose minor no GPU NVML lists has:
    /// a limit placed on it binds no GPU (fail open), never the GPU whose index is that number.
    UnknownMinor,
}

impl DisagreementKind {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotGranted => "not_granted",
            Self::OtherGranted => "other_granted",
            Self::BeyondGranted => "beyond_granted",
            Self::NoPluginValue => "no_plugin_value",
            Self::KubeletDevices => "kubelet_devices",
            Self::UnknownMinor => "unknown_minor",
            Self::MpsDropped => "mps_dropped",
        }
    }
}

/// One disagreement, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disagreement {
    /// What kind.
    pub kind: DisagreementKind,
    /// The variable.
    pub var: String,
    /// In words, for logs and `status`.
    pub said: String,
}

/// Whether `name` is one of the variables [`env_quota`] reads (the rest of an environment can be
/// dropped before caching it).
pub fn is_quota_var(name: &str) -> bool {
    name.starts_with("ALIYUN_COM_GPU_MEM_")
        || name.starts_with("CUDA_DEVICE_MEMORY_LIMIT")
        || name.starts_with("NVIDIA_GPU_MEMORY_")
        || name == MPS_LIMIT
        || name == "CUDA_VISIBLE_DEVICES"
        || name == "NVIDIA_VISIBLE_DEVICES"
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

/// A device size agrees with a GPU when it is within a quarter of the GPU's memory (plugins round
/// down to whole units and some subtract reserved memory; GiB and MiB are 1024x apart, so this
/// never matches both).
fn size_agrees(dev: u64, unit: GpuShareUnit, gpu_bytes: u64) -> bool {
    let claimed = dev as u128 * unit.bytes() as u128;
    let real = gpu_bytes as u128;
    real > 0 && claimed * 4 >= real * 3 && claimed * 4 <= real * 5
}

/// Reads the env quota, if any, from a container's environment, with no device list from its
/// runtime: every per-device limit then applies to every GPU ([`env_quota_on`]).
pub fn env_quota<'a, I>(environ: I, gpushare_unit: GpuShareUnit, gpus: &[GpuInfo]) -> EnvQuotaReport
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    env_quota_on(environ, gpushare_unit, gpus, None)
}

/// A per-device limit as a variable states it: the container's device ordinal, the variable (for
/// reports) and the limit in bytes.
struct Ordinal<'a> {
    ordinal: u32,
    var: &'a str,
    value: &'a str,
    bytes: u64,
}

/// Reads the env quota, if any, from a container's environment. `gpus` are the node's GPUs (for
/// UUID-to-index mapping and the unit cross-check; may be empty); `granted` the GPUs the runtime
/// gave the container, in its order (its spec's device nodes or CDI devices; `None` when unknown).
/// See the module note for the rules; the variables read are [`conventions::CONVENTIONS`].
pub fn env_quota_on<'a, I>(
    environ: I,
    gpushare_unit: GpuShareUnit,
    gpus: &[GpuInfo],
    granted: Option<&[DeviceRef]>,
) -> EnvQuotaReport
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut problems = Vec::new();
    let vars = Vars::read(environ, &mut problems);
    let granted: Option<Vec<DeviceRef>> = granted
        .filter(|d| !d.is_empty())
        .map(|d| d.iter().map(|d| resolve_device(d.clone(), gpus)).collect());
    let mut disagreements = Vec::new();
    unknown_minors(granted.as_deref(), gpus, &mut disagreements);
    let mut judge = Judge {
        gpus,
        granted,
        largest: gpus.iter().map(|g| g.memory_total).max().filter(|&b| b > 0),
        problems,
        disagreements,
    };
    let mut got = vars.limits(&mut judge);
    // Place every per-device limit on the device the runtime gave at that ordinal.
    let (cuda_visible, nvidia_visible) = (vars.first(CUDA_VISIBLE), vars.first(NVIDIA_VISIBLE));
    let env_list = env_device_list(cuda_visible, nvidia_visible);
    for (vendor, o) in std::mem::take(&mut got.ordinals) {
        implausible(
            &mut judge.disagreements,
            judge.largest,
            o.var,
            o.value,
            o.bytes,
        );
        let named = env_list.then(|| {
            map_cuda_index(o.ordinal, cuda_visible, nvidia_visible).map(|d| resolve_device(d, gpus))
        });
        place(
            &o,
            named,
            judge.granted.as_deref(),
            got.family(vendor),
            &mut judge.problems,
            &mut judge.disagreements,
        );
    }
    let (gpushare, unit_check) = gpushare_limits(&vars, gpushare_unit, &mut judge);
    got.family(GrantSource::GpuShare).add(gpushare);
    EnvQuotaReport {
        quota: smallest_of_families(got.families),
        problems: judge.problems,
        unit_check,
        disagreements: judge.disagreements,
        request: got.request,
    }
}

/// Every vendor's limits together, the smallest per device, with the vendors that set any.
fn smallest_of_families(families: Vec<(GrantSource, Limits)>) -> Option<EnvQuota> {
    let sources: Sources = families
        .iter()
        .filter(|(_, l)| !l.is_empty())
        .map(|(s, _)| *s)
        .collect();
    let mut all = Limits::default();
    for (_, l) in families {
        all.add(l);
    }
    all.into_quota(sources)
}

/// GPUShare's limit: its amount in the plugin's unit (checked against its device size) on its
/// index's GPU, else on every GPU.
fn gpushare_limits(
    vars: &Vars,
    configured: GpuShareUnit,
    judge: &mut Judge,
) -> (Limits, UnitCheck) {
    let problems = &mut judge.problems;
    let mut amounts: Vec<u64> = Vec::new();
    for v in vars.named(GS_MEM) {
        match v.trim().parse::<u64>() {
            Ok(0) => {}
            Ok(n) => amounts.push(n),
            Err(_) => problems.push(error(
                GS_MEM,
                v,
                "expected a whole number of the plugin's memory unit",
            )),
        }
    }
    let device = gpushare_index(vars, problems);
    let mut devs: Vec<u64> = Vec::new();
    for v in vars.named(GS_DEV) {
        match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => devs.push(n),
            Ok(_) => {}
            Err(_) => problems.push(error(
                GS_DEV,
                v,
                "expected the device's size, a whole number",
            )),
        }
    }
    devs.sort();
    devs.dedup();
    let (unit, unit_check) = if amounts.is_empty() {
        (configured, UnitCheck::NotApplicable)
    } else {
        check_unit(&devs, device, configured, judge.gpus)
    };
    let mut gpushare = Limits::default();
    if let Some(amount) = amounts.iter().min() {
        match amount.checked_mul(unit.bytes()) {
            Some(bytes) => {
                implausible(
                    &mut judge.disagreements,
                    judge.largest,
                    GS_MEM,
                    &amount.to_string(),
                    bytes,
                );
                match gpushare_given(device, judge) {
                    Some(i) => gpushare.device(DeviceRef::Index(i), bytes),
                    None => gpushare.each(bytes),
                }
            }
            None => judge
                .problems
                .push(error(GS_MEM, &amount.to_string(), "too large")),
        }
    }
    (gpushare, unit_check)
}

/// GPUShare's one known device, else `None` (each GPU: a limit on every GPU covers whichever was
/// meant).
fn gpushare_index(vars: &Vars, problems: &mut Vec<EnvQuotaError>) -> Option<u32> {
    let mut indices: Vec<u32> = Vec::new();
    let mut index_unknown = vars.first(GS_IDX).is_none();
    for v in vars.named(GS_IDX) {
        match v.trim() {
            "" | "-1" => index_unknown = true,
            t => match t.parse::<u32>() {
                Ok(i) => indices.push(i),
                Err(_) => {
                    index_unknown = true;
                    problems.push(error(
                        GS_IDX,
                        v,
                        "expected a GPU index (or -1 when the device is unknown); the limit applies to every GPU",
                    ));
                }
            },
        }
    }
    indices.sort();
    indices.dedup();
    match indices.as_slice() {
        [i] if !index_unknown => Some(*i),
        _ => None,
    }
}

/// The index is a variable too: a GPU the runtime did not give gets no limit moved onto it; the
/// limit bounds every GPU instead.
fn gpushare_given(device: Option<u32>, judge: &mut Judge) -> Option<u32> {
    device.filter(|&i| {
        let granted = judge.granted.as_deref();
        let given = granted.is_none_or(|g| g.contains(&DeviceRef::Index(i)));
        if !given {
            judge.disagreements.push(Disagreement {
                kind: DisagreementKind::NotGranted,
                var: GS_IDX.to_string(),
                said: format!(
                    "`{GS_IDX}={i}` names a GPU the runtime did not give the container ({}): the limit applies to every GPU",
                    describe_devices(granted.unwrap_or_default())
                ),
            });
        }
        given
    })
}

const NV_LIMIT: &str = "NVIDIA_GPU_MEMORY_LIMIT";
const NV_LIMITS: &str = "NVIDIA_GPU_MEMORY_LIMITS";
const NV_REQUEST: &str = "NVIDIA_GPU_MEMORY_REQUEST";
const NV_REQUESTS: &str = "NVIDIA_GPU_MEMORY_REQUESTS";
const MPS_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// One `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` entry's device.
enum MpsKey {
    /// No `=`: a size for every device.
    Every,
    /// A device ordinal of the process.
    Ordinal(u32),
    /// `GPU-<uuid>` (NVIDIA's recommended form) or `MIG-<uuid>`.
    Uuid(String),
}

fn mps_key(k: &str) -> Option<MpsKey> {
    let k = k.trim();
    if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) {
        k.parse().ok().map(MpsKey::Ordinal)
    } else if (k.starts_with("GPU-") || k.starts_with("MIG-"))
        && k.len() > 4
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        Some(MpsKey::Uuid(k.to_string()))
    } else {
        None
    }
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` values: comma-separated `<ordinal>=<size>` and
/// `GPU-<uuid>=<size>` entries (mixed as MPS allows), or one size for every device. Returns the
/// ordinal entries (placed on devices like the other conventions') and the limits on GPUs named by
/// UUID and on every GPU.
///
/// MPS drops every pinned limit of a client when one names a GPU the client cannot see: such a
/// value is reported as dropped ([`DisagreementKind::MpsDropped`]) and grants nothing. A GPU is
/// unseen when NVML lists no GPU of that UUID on this node, or when it is not among the GPUs the
/// runtime gave the container (the visible-devices variables, which an image sets too, never drop
/// a limit; a MIG UUID is not checked). Each value is judged alone: one that is dropped takes no
/// other value's limit with it.
fn mps_limits<'a>(
    values: &[&'a str],
    gpus: &[GpuInfo],
    granted: Option<&[DeviceRef]>,
    largest: Option<u64>,
    problems: &mut Vec<EnvQuotaError>,
    disagreements: &mut Vec<Disagreement>,
) -> (Vec<Ordinal<'a>>, Limits) {
    let mut ordinals = Vec::new();
    let mut limits = Limits::default();
    for &value in values {
        let mut unseen: Vec<String> = Vec::new();
        let (o, l) = mps_value(
            value,
            gpus,
            granted,
            largest,
            problems,
            disagreements,
            &mut unseen,
        );
        // An ordinal past the devices the runtime gave names a GPU the client cannot see too.
        if let Some(g) = granted {
            unseen.extend(
                (o.iter())
                    .filter(|o| o.ordinal as usize >= g.len())
                    .map(|o| format!("device {}", o.ordinal)),
            );
        }
        if unseen.is_empty() {
            ordinals.extend(o);
            limits.add(l);
            continue;
        }
        disagreements.push(Disagreement {
            kind: DisagreementKind::MpsDropped,
            var: MPS_LIMIT.to_string(),
            said: format!(
                "`{MPS_LIMIT}={}` names {}, which the container cannot see ({}): MPS drops every pinned limit then, so it grants nothing",
                value.chars().take(64).collect::<String>(),
                unseen.join(", "),
                match granted {
                    Some(g) => format!("its runtime gave {}", describe_devices(g)),
                    None => "no GPU here has that UUID".to_string(),
                }
            ),
        });
    }
    (ordinals, limits)
}

/// One value of [`mps_limits`]; the UUIDs it names that the container cannot see go to `unseen`.
fn mps_value<'a>(
    value: &'a str,
    gpus: &[GpuInfo],
    granted: Option<&[DeviceRef]>,
    largest: Option<u64>,
    problems: &mut Vec<EnvQuotaError>,
    disagreements: &mut Vec<Disagreement>,
    unseen: &mut Vec<String>,
) -> (Vec<Ordinal<'a>>, Limits) {
    let mut ordinals = Vec::new();
    let mut limits = Limits::default();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, size) = match entry.split_once('=') {
            None => (Some(MpsKey::Every), entry),
            Some((k, s)) => (mps_key(k), s),
        };
        let Some(key) = key else {
            problems.push(error(
                MPS_LIMIT,
                value,
                format!(
                    "`{entry}`: expected `<device ordinal>=<size>` or `GPU-<uuid>=<size>`, e.g. `0=4G`"
                ),
            ));
            continue;
        };
        let bytes = match parse_mps_size(size) {
            Some(0) => continue,
            Some(b) => b,
            None => {
                problems.push(error(
                    MPS_LIMIT,
                    value,
                    format!("`{entry}`: expected a size such as `4G`, `512MB` or bytes"),
                ));
                continue;
            }
        };
        implausible(disagreements, largest, MPS_LIMIT, value, bytes);
        match key {
            MpsKey::Every => limits.each(bytes),
            MpsKey::Ordinal(ordinal) => ordinals.push(Ordinal {
                ordinal,
                var: MPS_LIMIT,
                value,
                bytes,
            }),
            MpsKey::Uuid(u) => {
                let d = resolve_device(DeviceRef::Uuid(u.clone()), gpus);
                let on_node = gpus.is_empty() || matches!(d, DeviceRef::Index(_));
                let given = granted.is_none_or(|g| g.contains(&d));
                if u.starts_with("MIG-") || (on_node && given) {
                    limits.device(d, bytes);
                } else {
                    unseen.push(u);
                }
            }
        }
    }
    (ordinals, limits)
}

/// Device nodes whose minor no GPU of `gpus` has (none are said while no GPU is known).
fn unknown_minors(granted: Option<&[DeviceRef]>, gpus: &[GpuInfo], out: &mut Vec<Disagreement>) {
    if gpus.is_empty() {
        return;
    }
    for d in granted.unwrap_or_default() {
        if let DeviceRef::Minor(m) = d {
            out.push(Disagreement {
                kind: DisagreementKind::UnknownMinor,
                var: format!("/dev/nvidia{m}"),
                said: format!(
                    "the runtime gave /dev/nvidia{m}, whose minor no GPU NVML lists has (GPUs: {}): a limit on it binds no GPU",
                    gpus.iter()
                        .map(|g| match g.minor {
                            Some(m) => format!("GPU {} is /dev/nvidia{m}", g.index),
                            None => format!("GPU {} has no minor", g.index),
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    }
}

/// A limit above the largest GPU's memory: no plugin grants it.
fn implausible(
    out: &mut Vec<Disagreement>,
    largest: Option<u64>,
    var: &str,
    value: &str,
    bytes: u64,
) {
    if largest.is_some_and(|l| bytes > l) {
        out.push(Disagreement {
            kind: DisagreementKind::NoPluginValue,
            var: var.to_string(),
            said: format!(
                "`{var}={}` is more than any GPU here holds: no device plugin grants it (a value the image or the pod wrote?)",
                value.chars().take(64).collect::<String>()
            ),
        });
    }
}

/// Whether the visible-devices variables name devices at all (unset, `all`, `none` and `void`
/// name none; a list that cannot be read does).
fn env_device_list(cuda: Option<&str>, nvidia: Option<&str>) -> bool {
    let names = |v: Option<&str>| !matches!(device_list(v), Ok(None));
    names(cuda) || names(nvidia)
}

/// A HAMi variable of 0: HAMi writes a device's whole memory when no limit was asked for, never 0,
/// so a 0 is the image's or the pod's (on CRI-O, the pod's `env:` replaces the plugin's value).
fn zero_from_no_plugin(out: &mut Vec<Disagreement>, var: &str, value: &str) {
    out.push(Disagreement {
        kind: DisagreementKind::NoPluginValue,
        var: var.to_string(),
        said: format!(
            "`{var}={}`: HAMi never writes 0 (a value the image or the pod wrote?); it sets no limit and lifts none",
            value.chars().take(64).collect::<String>()
        ),
    });
}

/// Places one per-device limit: on the GPU the runtime gave the container at that ordinal; where
/// the variables name another device the disagreement is reported, and the limit also applies to
/// that device when the runtime gave it too (the smaller applies on the GPU really used). With no
/// device list from the runtime, or an ordinal beyond it, the limit applies to every GPU.
fn place(
    o: &Ordinal,
    named: Option<Result<DeviceRef, String>>,
    granted: Option<&[DeviceRef]>,
    limits: &mut Limits,
    problems: &mut Vec<EnvQuotaError>,
    disagreements: &mut Vec<Disagreement>,
) {
    let ordinal = o.ordinal;
    let Some(granted) = granted else {
        if let Some(Err(reason)) = named {
            problems.push(error(
                o.var,
                o.value,
                format!("{reason}; the limit applies to every GPU"),
            ));
        }
        limits.each(o.bytes);
        return;
    };
    let mut disagree = |kind, said: String| {
        disagreements.push(Disagreement {
            kind,
            var: o.var.to_string(),
            said: format!("`{}`: {said}", o.var),
        })
    };
    let Some(given) = granted.get(ordinal as usize) else {
        disagree(
            DisagreementKind::BeyondGranted,
            format!(
                "device {ordinal} is beyond the {} the runtime gave the container ({}): the limit applies to every GPU",
                granted.len(),
                describe_devices(granted)
            ),
        );
        limits.each(o.bytes);
        return;
    };
    limits.device(given.clone(), o.bytes);
    match named {
        None => {}
        Some(Ok(named)) if named == *given => {}
        Some(Ok(named)) if granted.contains(&named) => {
            disagree(
                DisagreementKind::OtherGranted,
                format!(
                    "the visible-devices variables make device {ordinal} {named}, the runtime's order {given}: the limit applies to both"
                ),
            );
            limits.device(named, o.bytes);
        }
        Some(named) => {
            let named = named.map_or_else(|e| e, |d| d.to_string());
            disagree(
                DisagreementKind::NotGranted,
                format!(
                    "the visible-devices variables make device {ordinal} {named}, which the runtime did not give the container; the limit applies to {given}, the GPU it gave"
                ),
            );
        }
    }
}

fn describe_devices(devices: &[DeviceRef]) -> String {
    devices
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `NVIDIA_GPU_MEMORY_*`: integer MiB, or a comma-separated list of them (one per device
/// ordinal). `None` entries are 0 (no limit).
fn parse_mib_list(var: &str, value: &str) -> Result<Vec<Option<u64>>, EnvQuotaError> {
    value
        .split(',')
        .map(|e| {
            let e = e.trim();
            if e.is_empty() || !e.bytes().all(|b| b.is_ascii_digit()) {
                return Err(error(
                    var,
                    value,
                    "expected a whole number of MiB (or one per device, comma-separated)",
                ));
            }
            let n: u64 = e.parse().map_err(|_| error(var, value, "too large"))?;
            let bytes = n
                .checked_mul(1 << 20)
                .ok_or_else(|| error(var, value, "too large"))?;
            Ok((bytes > 0).then_some(bytes))
        })
        .collect()
}

/// An MPS size: a whole number with an optional `K`, `KB`, `M`, `MB`, `G`, `GB`, `T` or `TB`
/// (powers of 1024, either case); a bare number is bytes.
fn parse_mps_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits_end = s
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(s.len());
    let (digits, suffix) = s.split_at(digits_end);
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" => 10,
        "M" | "MB" => 20,
        "G" | "GB" => 30,
        "T" | "TB" => 40,
        _ => return None,
    };
    if digits.is_empty() {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The unit GPUShare's values are read in, and what the device size said about it.
fn check_unit(
    devs: &[u64],
    device: Option<u32>,
    configured: GpuShareUnit,
    gpus: &[GpuInfo],
) -> (GpuShareUnit, UnitCheck) {
    let [dev] = devs else {
        // None, or several different values: nothing to go by.
        return (configured, UnitCheck::NotApplicable);
    };
    let candidates: Vec<&GpuInfo> = match device {
        Some(i) => gpus.iter().filter(|g| g.index == i).collect(),
        None => gpus.iter().collect(),
    };
    if candidates.is_empty() {
        return (configured, UnitCheck::Unknown);
    }
    let agrees = |unit| {
        candidates
            .iter()
            .any(|g| size_agrees(*dev, unit, g.memory_total))
    };
    let gpu_bytes = candidates[0].memory_total;
    if agrees(configured) {
        (configured, UnitCheck::Agrees)
    } else if agrees(configured.other()) {
        let plugin = configured.other();
        let gpu_bytes = candidates
            .iter()
            .find(|g| size_agrees(*dev, plugin, g.memory_total))
            .map_or(gpu_bytes, |g| g.memory_total);
        (
            plugin,
            UnitCheck::Mismatch {
                configured,
                plugin,
                dev: *dev,
                gpu_bytes,
            },
        )
    } else {
        (
            configured,
            UnitCheck::Unexplained {
                dev: *dev,
                gpu_bytes,
            },
        )
    }
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
    use proptest::prelude::*;

    use super::*;
    use crate::quota::{Trust, resolve_quota};

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn gpus() -> Vec<GpuInfo> {
        (0..2)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{i}{i}{i}"),
                memory_total: 80 * GIB,
                minor: Some(i),
            })
            .collect()
    }

    fn report(pairs: &[(&str, &str)], unit: GpuShareUnit) -> EnvQuotaReport {
        env_quota(pairs.iter().copied(), unit, &gpus())
    }

    fn quota(pairs: &[(&str, &str)], unit: GpuShareUnit) -> Option<EnvQuota> {
        report(pairs, unit).quota
    }

    /// `(per_gpu, each_gpu)`.
    fn limits(pairs: &[(&str, &str)]) -> (Vec<(DeviceRef, u64)>, Option<u64>) {
        let q = quota(pairs, GpuShareUnit::GiB).expect("a quota");
        (q.per_gpu, q.each_gpu)
    }

    #[test]
    fn gpushare_request_on_a_known_or_unknown_device() {
        let q = quota(
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "3"),
                ("ALIYUN_COM_GPU_MEM_IDX", "1"),
                ("ALIYUN_COM_GPU_MEM_DEV", "80"),
            ],
            GpuShareUnit::GiB,
        )
        .unwrap();
        assert_eq!(q.sources, GrantSource::GpuShare.into());
        assert_eq!(q.per_gpu, vec![(DeviceRef::Index(1), 3 * GIB)]);
        assert_eq!(q.each_gpu, None);

        for idx in [None, Some("-1"), Some("x")] {
            let mut env = vec![("ALIYUN_COM_GPU_MEM_CONTAINER", "2048")];
            env.extend(idx.map(|i| ("ALIYUN_COM_GPU_MEM_IDX", i)));
            let r = report(&env, GpuShareUnit::MiB);
            let q = r.quota.unwrap();
            assert_eq!(q.per_gpu, vec![]);
            assert_eq!(q.each_gpu, Some(2048 * MIB), "{idx:?}");
            // A malformed index is reported, and the limit applies to every GPU.
            assert_eq!(r.problems.len(), usize::from(idx == Some("x")));
        }
        // 0 is "unset", not "nothing allowed".
        assert_eq!(
            quota(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "0")], GpuShareUnit::GiB),
            None
        );
        let r = report(
            &[("ALIYUN_COM_GPU_MEM_CONTAINER", "1.5")],
            GpuShareUnit::GiB,
        );
        assert_eq!((r.quota, r.problems.len()), (None, 1));
        let r = report(
            &[("ALIYUN_COM_GPU_MEM_CONTAINER", "99999999999999999")],
            GpuShareUnit::GiB,
        );
        assert_eq!(r.quota, None);
        assert_eq!(r.problems[0].reason, "too large");
    }

    fn report_on(pairs: &[(&str, &str)], granted: &[DeviceRef]) -> EnvQuotaReport {
        env_quota_on(
            pairs.iter().copied(),
            GpuShareUnit::GiB,
            &gpus(),
            Some(granted),
        )
    }

    /// `(per_gpu, each_gpu)` on the GPUs the runtime gave.
    fn limits_on(
        pairs: &[(&str, &str)],
        granted: &[DeviceRef],
    ) -> (Vec<(DeviceRef, u64)>, Option<u64>) {
        let q = report_on(pairs, granted).quota.expect("a quota");
        (q.per_gpu, q.each_gpu)
    }

    fn kinds(r: &EnvQuotaReport) -> Vec<DisagreementKind> {
        r.disagreements.iter().map(|d| d.kind).collect()
    }

    const G0: DeviceRef = DeviceRef::Index(0);
    const G1: DeviceRef = DeviceRef::Index(1);

    #[test]
    fn hami_limits_map_cuda_indices_to_the_devices_the_runtime_gave() {
        // The runtime's devices, in its order: ordinal i is the i-th.
        let (per, each) = limits_on(
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "2048m"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            ],
            &[G1, G0],
        );
        assert_eq!(per, vec![(G0, 2 * GIB), (G1, GIB)]);
        assert_eq!(each, None);
        // Given by UUID (a CDI name): known UUIDs become indices, others stay.
        let r = report_on(
            &[
                ("NVIDIA_VISIBLE_DEVICES", "GPU-000,GPU-bbb"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "256M"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "512M"),
            ],
            &[
                DeviceRef::Uuid("GPU-000".into()),
                DeviceRef::Uuid("GPU-bbb".into()),
            ],
        );
        assert_eq!(
            r.quota.unwrap().per_gpu,
            vec![
                (G0, 256 * MIB),
                (DeviceRef::Uuid("GPU-bbb".into()), 512 * MIB)
            ]
        );
        assert_eq!(
            r.disagreements,
            vec![],
            "the variables agree with the runtime"
        );
        // Host indices, then a container-local CUDA_VISIBLE_DEVICES on top, agreeing.
        let r = report_on(
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0,1"),
                ("CUDA_VISIBLE_DEVICES", "1"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024k"),
            ],
            &[G1],
        );
        assert_eq!(r.quota.as_ref().unwrap().per_gpu, vec![(G1, MIB)]);
        assert_eq!(r.disagreements, vec![]);
        // No device list from the runtime: the variables alone place nothing, the limit bounds
        // every GPU (the smallest of them, on each).
        for env in [
            vec![
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            ],
            vec![
                ("NVIDIA_VISIBLE_DEVICES", "GPU-111"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            ],
        ] {
            assert_eq!(limits(&env), (vec![], Some(GIB)), "{env:?}");
        }
        // Fallback for all, a bare number is bytes, "all" is identity.
        assert_eq!(
            limits(&[
                ("NVIDIA_VISIBLE_DEVICES", "all"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "1000"),
            ]),
            (vec![], Some(1000))
        );
        assert_eq!(
            quota(&[("CUDA_DEVICE_MEMORY_LIMIT", "0")], GpuShareUnit::GiB),
            None
        );
        assert_eq!(quota(&[("PATH", "/bin")], GpuShareUnit::GiB), None);
    }

    /// Issue 22, problem 1: a visible-devices variable naming no GPU took HAMi's limit off the GPU
    /// in use (3 GiB used under a 1 GiB limit, never enforced).
    /// GPUs whose device minors are not their indices (PCI order differs from the driver's):
    /// GPU 0 is /dev/nvidia1, GPU 1 is /dev/nvidia0.
    fn crossed() -> Vec<GpuInfo> {
        gpus()
            .into_iter()
            .map(|g| GpuInfo {
                minor: Some(g.index ^ 1),
                ..g
            })
            .collect()
    }

    #[test]
    fn a_device_node_is_the_gpu_nvml_gives_its_minor_not_the_gpu_of_that_index() {
        let on = |gpus: &[GpuInfo], granted: &[DeviceRef]| {
            env_quota_on(
                [("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")],
                GpuShareUnit::GiB,
                gpus,
                Some(granted),
            )
        };
        // /dev/nvidia1 is GPU 0.
        let r = on(&crossed(), &[DeviceRef::Minor(1)]);
        assert_eq!(r.quota.unwrap().per_gpu, vec![(G0, GIB)]);
        assert_eq!(r.disagreements, vec![]);
        // The visible-devices variables naming that GPU by index agree with it.
        let r = env_quota_on(
            [
                ("NVIDIA_VISIBLE_DEVICES", "0"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            ],
            GpuShareUnit::GiB,
            &crossed(),
            Some(&[DeviceRef::Minor(1)]),
        );
        assert_eq!(r.quota.unwrap().per_gpu, vec![(G0, GIB)]);
        assert_eq!(r.disagreements, vec![]);
        // A minor no GPU has binds no GPU (fail open), and is said.
        let r = on(&crossed(), &[DeviceRef::Minor(7)]);
        assert_eq!(
            r.quota.clone().unwrap().per_gpu,
            vec![(DeviceRef::Minor(7), GIB)]
        );
        assert_eq!(kinds(&r), vec![DisagreementKind::UnknownMinor]);
        assert!(
            r.disagreements[0].said.contains("GPU 0 is /dev/nvidia1"),
            "{r:?}"
        );
        // NVML without minors: none is resolved, none is guessed.
        let blind: Vec<GpuInfo> = gpus()
            .into_iter()
            .map(|g| GpuInfo { minor: None, ..g })
            .collect();
        let r = on(&blind, &[DeviceRef::Minor(0)]);
        assert_eq!(
            r.quota.clone().unwrap().per_gpu,
            vec![(DeviceRef::Minor(0), GIB)]
        );
        assert!(
            r.disagreements[0].said.contains("GPU 0 has no minor"),
            "{r:?}"
        );
        // No GPU known yet (no sample): nothing to say.
        assert_eq!(on(&[], &[DeviceRef::Minor(1)]).disagreements, vec![]);
    }

    #[test]
    fn resolving_names_each_gpu_once_with_the_smaller_limit() {
        assert_eq!(resolve_device(DeviceRef::Minor(0), &crossed()), G1);
        assert_eq!(
            resolve_device(DeviceRef::Uuid("GPU-111".into()), &crossed()),
            G1
        );
        assert_eq!(resolve_device(G1, &crossed()), G1);
        assert_eq!(
            resolve_device(DeviceRef::Minor(2), &crossed()),
            DeviceRef::Minor(2)
        );
        let q = EnvQuota {
            sources: GrantSource::Dra.into(),
            per_gpu: vec![
                (G1, 3 * GIB),
                (DeviceRef::Uuid("GPU-000".into()), 4 * GIB),
                (DeviceRef::Minor(0), 2 * GIB),
                (DeviceRef::Minor(1), 5 * GIB),
                (DeviceRef::Minor(9), GIB),
            ],
            each_gpu: Some(8 * GIB),
        };
        let r = resolve_quota(q, &crossed());
        assert_eq!(
            r.per_gpu,
            vec![(G0, 4 * GIB), (G1, 2 * GIB), (DeviceRef::Minor(9), GIB)]
        );
        assert_eq!(
            (r.sources, r.each_gpu),
            (Sources::from(GrantSource::Dra), Some(8 * GIB))
        );
    }

    /// NVIDIA's recommended spelling, by GPU UUID, alone and mixed with ordinals; a UUID naming a GPU
    /// the container cannot see makes MPS drop every pinned limit: reported, granting nothing.
    #[test]
    fn mps_limits_by_uuid_and_the_invisible_gpu_rule() {
        const MPS: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
        // GPU-111 is GPU 1.
        assert_eq!(limits(&[(MPS, "GPU-111=2G")]), (vec![(G1, 2 * GIB)], None));
        // Mixed with an ordinal, on the GPUs the runtime gave (its device 0 is GPU 1).
        let r = report_on(&[(MPS, "0=1G, GPU-000=3G")], &[G1, G0]);
        assert_eq!(r.disagreements, vec![]);
        let q = r.quota.unwrap();
        assert_eq!(q.sources, GrantSource::Mps.into());
        assert_eq!(q.per_gpu, vec![(G0, 3 * GIB), (G1, GIB)]);
        // A GPU the runtime did not give: MPS drops every limit, the ordinal's too.
        let r = report_on(&[(MPS, "0=1G,GPU-000=3G")], &[G1]);
        assert_eq!(r.quota, None);
        assert_eq!(kinds(&r), vec![DisagreementKind::MpsDropped]);
        assert!(r.disagreements[0].said.contains("GPU-000"), "{r:?}");
        assert!(r.disagreements[0].said.contains("grants nothing"), "{r:?}");
        // An ordinal past the devices the runtime gave: the same (issue 41).
        let r = report_on(&[(MPS, "0=1G,1=2G")], &[G1]);
        assert_eq!(r.quota, None, "{r:?}");
        assert_eq!(kinds(&r), vec![DisagreementKind::MpsDropped]);
        assert!(r.disagreements[0].said.contains("device 1"), "{r:?}");
        let r = report_on(&[(MPS, "0=1G,2=2G")], &[G1]);
        assert_eq!(
            (r.quota.clone(), kinds(&r)),
            (None, vec![DisagreementKind::MpsDropped])
        );
        // A UUID no GPU here has.
        let r = report(&[(MPS, "2G,GPU-999=1G")], GpuShareUnit::GiB);
        assert_eq!(
            (r.quota.clone(), kinds(&r)),
            (None, vec![DisagreementKind::MpsDropped])
        );
        // Each value alone: a second value (a name given twice) that MPS would drop takes nothing
        // from the first.
        let r = report(&[(MPS, "1G"), (MPS, "GPU-999=512M")], GpuShareUnit::GiB);
        assert_eq!(kinds(&r), vec![DisagreementKind::MpsDropped]);
        assert_eq!(r.quota.unwrap().each_gpu, Some(GIB));
        // Another convention's limit stays.
        let r = report_on(
            &[(MPS, "GPU-000=3G"), ("CUDA_DEVICE_MEMORY_LIMIT", "2g")],
            &[G1],
        );
        let q = r.quota.unwrap();
        assert_eq!(
            (q.sources, q.each_gpu),
            (Sources::from(GrantSource::Hami), Some(2 * GIB))
        );
        // The visible-devices variables never drop a limit (an image sets them too).
        let (per, _) = limits_on(
            &[("CUDA_VISIBLE_DEVICES", "GPU-111"), (MPS, "GPU-000=3G")],
            &[G0, G1],
        );
        assert_eq!(per, vec![(G0, 3 * GIB)]);
        // A MIG device is kept by its UUID, unchecked.
        let (per, _) = limits_on(&[(MPS, "MIG-abc=1G")], &[G0]);
        assert_eq!(per, vec![(DeviceRef::Uuid("MIG-abc".into()), GIB)]);
        // Malformed keys are said and ignored; the rest of the list counts.
        for bad in ["GPU-=1G", "GPU-a b=1G", "gpu-000=1G", "GPU-000:1G"] {
            let r = report(&[(MPS, bad), (MPS, "1=1G")], GpuShareUnit::GiB);
            assert_eq!(r.problems.len(), 1, "{bad}: {r:?}");
            assert_eq!(r.quota.unwrap().each_gpu, Some(GIB), "{bad}");
        }
    }

    #[test]
    fn a_visible_devices_variable_naming_no_gpu_cannot_take_a_hami_limit_off() {
        let env = [
            (
                "CUDA_VISIBLE_DEVICES",
                "GPU-00000000-0000-0000-0000-000000000000",
            ),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
        ];
        // Without the runtime's devices: every GPU.
        let q = quota(&env, GpuShareUnit::GiB).unwrap();
        assert_eq!((q.per_gpu, q.each_gpu), (vec![], Some(GIB)));
        // With them: the GPU the runtime gave, and the disagreement said.
        let r = report_on(&env, &[G0]);
        assert_eq!(r.quota.as_ref().unwrap().per_gpu, vec![(G0, GIB)]);
        assert_eq!(r.quota.as_ref().unwrap().each_gpu, None);
        assert_eq!(kinds(&r), vec![DisagreementKind::NotGranted]);
        assert!(r.disagreements[0].said.contains("GPU-00000000"), "{r:?}");
        assert_eq!(r.disagreements[0].var, "CUDA_DEVICE_MEMORY_LIMIT_0");
    }

    #[test]
    fn a_limit_is_not_moved_to_another_gpu() {
        // The image names GPU 1; the runtime gave GPU 0.
        let env = [
            ("NVIDIA_VISIBLE_DEVICES", "GPU-111"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
        ];
        let r = report_on(&env, &[G0]);
        assert_eq!(r.quota.as_ref().unwrap().per_gpu, vec![(G0, GIB)]);
        assert_eq!(kinds(&r), vec![DisagreementKind::NotGranted]);
        // Both GPUs given, the variables order them otherwise: the limit on both (the smaller
        // applies on whichever is really used).
        let r = report_on(&env, &[G0, G1]);
        assert_eq!(
            r.quota.as_ref().unwrap().per_gpu,
            vec![(G0, GIB), (G1, GIB)]
        );
        assert_eq!(kinds(&r), vec![DisagreementKind::OtherGranted]);
        // An ordinal beyond the devices given: every GPU.
        let r = report_on(&[("CUDA_DEVICE_MEMORY_LIMIT_3", "1g")], &[G0]);
        assert_eq!(r.quota.as_ref().unwrap().each_gpu, Some(GIB));
        assert_eq!(kinds(&r), vec![DisagreementKind::BeyondGranted]);
        // GPUShare's index is a variable too: a GPU not given bounds every GPU instead.
        let gs = [
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "2"),
            ("ALIYUN_COM_GPU_MEM_IDX", "1"),
        ];
        let r = report_on(&gs, &[G0]);
        assert_eq!(r.quota.as_ref().unwrap().each_gpu, Some(2 * GIB));
        assert_eq!(kinds(&r), vec![DisagreementKind::NotGranted]);
        assert_eq!(limits_on(&gs, &[G1]), (vec![(G1, 2 * GIB)], None));
    }

    #[test]
    fn nvidia_mps_and_kai_variables_are_limits_in_their_units() {
        // NVIDIA's pair: integer MiB; the limit is the quota, the request shown beside it.
        for name in ["NVIDIA_GPU_MEMORY_LIMIT", "NVIDIA_GPU_MEMORY_LIMITS"] {
            let r = report(
                &[(name, "1024"), ("NVIDIA_GPU_MEMORY_REQUESTS", "512")],
                GpuShareUnit::GiB,
            );
            let q = r.quota.unwrap();
            assert_eq!(
                (q.sources, q.each_gpu),
                (Sources::from(GrantSource::Nvidia), Some(GIB)),
                "{name}"
            );
            assert_eq!(r.request, Some(512 * MIB));
        }
        let r = report(&[("NVIDIA_GPU_MEMORY_REQUEST", "512")], GpuShareUnit::GiB);
        assert_eq!(
            (r.quota, r.request),
            (None, Some(512 * MIB)),
            "a request is no limit"
        );
        // One per device ordinal, over the devices given.
        assert_eq!(
            limits_on(&[("NVIDIA_GPU_MEMORY_LIMITS", "1024,0")], &[G1, G0]),
            (vec![(G1, GIB)], None)
        );
        // MPS: `<ordinal>=<size>`, sizes in powers of 1024.
        let (per, each) = limits_on(
            &[("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=4G,1=512MB")],
            &[G0, G1],
        );
        assert_eq!((per, each), (vec![(G0, 4 * GIB), (G1, 512 * MIB)], None));
        let q = quota(
            &[("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "2g")],
            GpuShareUnit::GiB,
        )
        .unwrap();
        assert_eq!(
            (q.sources, q.each_gpu),
            (Sources::from(GrantSource::Mps), Some(2 * GIB))
        );
        assert_eq!(parse_mps_size("3k"), Some(3 << 10));
        assert_eq!(parse_mps_size("3KB"), Some(3 << 10));
        assert_eq!(parse_mps_size("5"), Some(5));
        assert_eq!(parse_mps_size("1T"), Some(1 << 40));
        assert_eq!(parse_mps_size("1tb"), Some(1 << 40));
        assert_eq!(parse_mps_size("2b"), Some(2));
        // KAI's hamicore binder: `<MiB>m` for every device.
        let q = quota(&[("CUDA_DEVICE_MEMORY_LIMIT", "2048m")], GpuShareUnit::GiB).unwrap();
        assert_eq!(
            (q.sources, q.each_gpu),
            (Sources::from(GrantSource::Hami), Some(2 * GIB))
        );
        // Malformed: reported, ignored.
        for env in [
            ("NVIDIA_GPU_MEMORY_LIMIT", "1GiB"),
            ("NVIDIA_GPU_MEMORY_LIMIT", ""),
            ("NVIDIA_GPU_MEMORY_LIMIT", "99999999999999999"),
            ("NVIDIA_GPU_MEMORY_LIMITS", "1,,2"),
            ("NVIDIA_GPU_MEMORY_REQUEST", "x"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=lots"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "x=1G"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "+1=1G"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=G"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=99999999999999T"),
        ] {
            let r = report(&[env], GpuShareUnit::GiB);
            assert_eq!((r.quota, r.problems.len()), (None, 1), "{env:?}");
        }
        for v in [
            "NVIDIA_GPU_MEMORY_LIMIT",
            "NVIDIA_GPU_MEMORY_REQUESTS",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        ] {
            assert!(is_quota_var(v), "{v}");
        }
        assert!(!is_quota_var("CUDA_MPS_PIPE_DIRECTORY"));
    }

    #[test]
    fn a_smaller_value_from_one_source_beats_a_larger_one_from_another() {
        for (env, want) in [
            (
                vec![
                    ("NVIDIA_GPU_MEMORY_LIMIT", "8192"),
                    ("CUDA_DEVICE_MEMORY_LIMIT", "2048m"),
                ],
                2 * GIB,
            ),
            (
                vec![
                    ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
                    ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "1G"),
                ],
                GIB,
            ),
            (
                vec![
                    ("ALIYUN_COM_GPU_MEM_CONTAINER", "1"),
                    ("NVIDIA_GPU_MEMORY_LIMIT", "4096"),
                ],
                GIB,
            ),
        ] {
            for env in [env.clone(), env.iter().rev().copied().collect()] {
                let q = quota(&env, GpuShareUnit::GiB).unwrap();
                assert_eq!(
                    (q.sources.as_str(), q.each_gpu),
                    ("several plugins' env (the smallest applies)", Some(want)),
                    "{env:?}"
                );
            }
        }
        // Per device too, whichever convention states it.
        assert_eq!(
            limits_on(
                &[
                    ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=4G,1=1G"),
                    ("CUDA_DEVICE_MEMORY_LIMIT_0", "2g"),
                    ("CUDA_DEVICE_MEMORY_LIMIT_1", "3g"),
                ],
                &[G0, G1],
            ),
            (vec![(G0, 2 * GIB), (G1, GIB)], None)
        );
    }

    /// CRI-O: the kubelet appends the pod's `env:` after the device plugin's variables and CRI-O
    /// replaces a name already set, so the spec holds only the pod's value.
    #[test]
    fn a_value_only_the_pod_could_have_written_lifts_nothing_and_is_said() {
        // Only the pod's `=0` remains: no limit can be read, and the agent says why.
        let r = report_on(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "0")], &[G0]);
        assert_eq!(r.quota, None);
        assert_eq!(kinds(&r), vec![DisagreementKind::NoPluginValue]);
        // Only the pod's 999 (GiB, more than the 80 GiB GPU holds): said too.
        let r = report_on(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "999")], &[G0]);
        assert_eq!(r.quota.as_ref().unwrap().each_gpu, Some(999 * GIB));
        assert_eq!(kinds(&r), vec![DisagreementKind::NoPluginValue]);
        // containerd keeps both: the plugin's value binds, the pod's lifts nothing.
        let r = report_on(
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "999g"),
            ],
            &[G0],
        );
        assert_eq!(r.quota.as_ref().unwrap().per_gpu, vec![(G0, GIB)]);
        assert_eq!(
            kinds(&r),
            vec![
                DisagreementKind::NoPluginValue,
                DisagreementKind::NoPluginValue
            ]
        );
        // A plausible value says nothing.
        assert_eq!(
            report_on(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "80g")], &[G0]).disagreements,
            vec![]
        );
    }

    #[test]
    fn no_variable_removes_or_raises_a_limit_another_sets() {
        let gs = ("ALIYUN_COM_GPU_MEM_CONTAINER", "1");
        // The two tricks of issue 12: a zero or malformed HAMi variable next to GPUShare's.
        for extra in [
            ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "lots"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
            ("CUDA_DEVICE_MEMORY_LIMIT_x", "1g"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "0"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "100"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "abc"),
            ("ALIYUN_COM_GPU_MEM_IDX", "junk"),
            ("NVIDIA_VISIBLE_DEVICES", "junk"),
        ] {
            for env in [vec![gs, extra], vec![extra, gs]] {
                assert_eq!(limits(&env), (vec![], Some(GIB)), "{env:?}");
            }
        }
        // Both families: the smaller applies, per device, whichever it comes from.
        let q = quota(&[gs, ("CUDA_DEVICE_MEMORY_LIMIT", "4g")], GpuShareUnit::GiB).unwrap();
        assert_eq!(
            (q.sources, q.each_gpu),
            (
                [GrantSource::GpuShare, GrantSource::Hami]
                    .into_iter()
                    .collect(),
                Some(GIB)
            )
        );
        assert_eq!(
            limits_on(
                &[
                    ("ALIYUN_COM_GPU_MEM_CONTAINER", "8"),
                    ("ALIYUN_COM_GPU_MEM_IDX", "0"),
                    ("CUDA_DEVICE_MEMORY_LIMIT_0", "2g"),
                    ("CUDA_DEVICE_MEMORY_LIMIT_1", "16g"),
                ],
                &[G0, G1]
            ),
            (
                vec![
                    (DeviceRef::Index(0), 2 * GIB),
                    (DeviceRef::Index(1), 16 * GIB)
                ],
                None
            )
        );
        // A limit for every GPU caps the per-device ones.
        assert_eq!(
            limits_on(
                &[
                    ("CUDA_DEVICE_MEMORY_LIMIT_0", "8g"),
                    ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
                ],
                &[G0]
            ),
            (vec![(DeviceRef::Index(0), 2 * GIB)], Some(2 * GIB))
        );
        // The same device by UUID and by index is one device.
        assert_eq!(
            limits_on(
                &[
                    ("ALIYUN_COM_GPU_MEM_CONTAINER", "1"),
                    ("ALIYUN_COM_GPU_MEM_IDX", "1"),
                    ("NVIDIA_VISIBLE_DEVICES", "GPU-111"),
                    ("CUDA_DEVICE_MEMORY_LIMIT_0", "4g"),
                ],
                &[DeviceRef::Uuid("GPU-111".into())]
            ),
            (vec![(DeviceRef::Index(1), GIB)], None)
        );
        // Repeated names: every value counts, the smallest wins.
        assert_eq!(
            limits(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ]),
            (vec![], Some(GIB))
        );
        // An indexed limit whose device cannot be told bounds every GPU.
        let r = report(
            &[
                ("CUDA_VISIBLE_DEVICES", "0"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "3g"),
            ],
            GpuShareUnit::GiB,
        );
        assert_eq!(r.quota.as_ref().unwrap().each_gpu, Some(3 * GIB));
        assert!(
            r.problems[0].reason.contains("applies to every GPU"),
            "{r:?}"
        );
    }

    /// Kills the surviving mutants of `size_agrees`, the `!index_unknown` and `n > 0` guards and
    /// the placement of NVIDIA's and MPS's limits (issue 22's mutation run).
    #[test]
    fn the_unit_check_accepts_a_quarter_either_side_and_nothing_beyond() {
        let check = |dev: &str| {
            report(
                &[
                    ("ALIYUN_COM_GPU_MEM_CONTAINER", "1"),
                    ("ALIYUN_COM_GPU_MEM_DEV", dev),
                ],
                GpuShareUnit::GiB,
            )
            .unit_check
        };
        // 80 GiB GPUs: 60 and 100 GiB (75% and 125%) agree, 59 and 101 in neither unit.
        for dev in ["60", "100"] {
            assert_eq!(check(dev), UnitCheck::Agrees, "{dev}");
        }
        for dev in ["59", "50", "101", "120"] {
            assert!(
                matches!(check(dev), UnitCheck::Unexplained { .. }),
                "{dev}: {:?}",
                check(dev)
            );
        }
        // A device size of 0 is no size: nothing to check.
        assert_eq!(check("0"), UnitCheck::NotApplicable);
    }

    #[test]
    fn an_index_that_is_also_unknown_bounds_every_gpu() {
        for other in ["-1", "", "junk"] {
            let q = quota(
                &[
                    ("ALIYUN_COM_GPU_MEM_CONTAINER", "2"),
                    ("ALIYUN_COM_GPU_MEM_IDX", "1"),
                    ("ALIYUN_COM_GPU_MEM_IDX", other),
                ],
                GpuShareUnit::GiB,
            )
            .unwrap();
            assert_eq!(
                (q.per_gpu, q.each_gpu),
                (vec![], Some(2 * GIB)),
                "{other:?}"
            );
        }
    }

    #[test]
    fn one_nvidia_value_is_for_every_gpu_and_each_convention_keeps_its_name() {
        // One value: every GPU, also where the runtime's devices are known.
        let r = report_on(&[("NVIDIA_GPU_MEMORY_LIMIT", "1024")], &[G0, G1]);
        let q = r.quota.unwrap();
        assert_eq!((q.per_gpu, q.each_gpu), (vec![], Some(GIB)));
        // Per-ordinal values keep their convention's name.
        for (env, source) in [
            (
                ("NVIDIA_GPU_MEMORY_LIMITS", "1024,2048"),
                GrantSource::Nvidia,
            ),
            (
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1G,1=2G"),
                GrantSource::Mps,
            ),
            (("CUDA_DEVICE_MEMORY_LIMIT_1", "1g"), GrantSource::Hami),
        ] {
            let q = report_on(&[env], &[G0, G1]).quota.unwrap();
            assert_eq!(q.sources, source.into(), "{env:?}");
            assert!(q.each_gpu.is_none(), "{env:?}");
        }
        // GPUs whose size is not known say nothing about a limit being more than one holds.
        let unknown = [GpuInfo {
            index: 0,
            uuid: "GPU-000".into(),
            memory_total: 0,
            minor: Some(0),
        }];
        let r = env_quota_on(
            [("CUDA_DEVICE_MEMORY_LIMIT", "1g")],
            GpuShareUnit::GiB,
            &unknown,
            Some(&[G0]),
        );
        assert_eq!(r.disagreements, vec![]);
        assert_eq!(r.quota.unwrap().each_gpu, Some(GIB));
    }

    #[test]
    fn malformed_values_are_reported_and_ignored() {
        for env in [
            vec![("CUDA_DEVICE_MEMORY_LIMIT", "4gb")],
            vec![("CUDA_DEVICE_MEMORY_LIMIT", "m")],
            vec![("CUDA_DEVICE_MEMORY_LIMIT", "-1m")],
            vec![("CUDA_DEVICE_MEMORY_LIMIT", "99999999999999999999g")],
            vec![("CUDA_DEVICE_MEMORY_LIMIT_x", "1g")],
            vec![("CUDA_DEVICE_MEMORY_LIMIT_+1", "1g")],
            vec![("ALIYUN_COM_GPU_MEM_CONTAINER", "x")],
            vec![
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "1"),
                ("ALIYUN_COM_GPU_MEM_DEV", "x"),
            ],
        ] {
            let r = report(&env, GpuShareUnit::GiB);
            assert_eq!(r.problems.len(), 1, "{env:?}: {r:?}");
            let shown = r.problems[0].to_string();
            assert!(
                shown.starts_with(&format!("`{}=", r.problems[0].var)),
                "{shown}"
            );
        }
    }

    #[test]
    fn a_malformed_size_is_said_to_be_malformed_not_too_large() {
        // An empty or non-numeric value is a format error, whatever the parser would make of it.
        for (var, value) in [
            ("CUDA_DEVICE_MEMORY_LIMIT", ""),
            ("CUDA_DEVICE_MEMORY_LIMIT", "g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "12x"),
            (NV_LIMIT, ""),
            (NV_LIMITS, "1024,"),
            (NV_LIMIT, "4G"),
        ] {
            let r = report(&[(var, value)], GpuShareUnit::GiB);
            assert_eq!(r.problems.len(), 1, "{var}={value}: {r:?}");
            let reason = &r.problems[0].reason;
            assert!(reason.starts_with("expected"), "{var}={value}: {reason}");
        }
    }

    #[test]
    fn each_trust_has_its_own_name() {
        // A trust's label value is the name the state API serializes it as.
        for t in [Trust::RuntimeSpec, Trust::InitEnviron, Trust::Kubelet] {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str(), "{t:?}");
        }
    }

    #[test]
    fn a_unit_check_speaks_only_when_it_disagrees() {
        for quiet in [
            UnitCheck::NotApplicable,
            UnitCheck::Unknown,
            UnitCheck::Agrees,
        ] {
            assert!(!quiet.disagrees(), "{quiet:?}");
            assert_eq!(quiet.describe(), None, "{quiet:?}");
        }
        let odd = UnitCheck::Unexplained {
            dev: 12345,
            gpu_bytes: 80 * GIB,
        };
        assert!(odd.disagrees());
        let said = odd.describe().expect("said");
        assert!(said.contains("ALIYUN_COM_GPU_MEM_DEV=12345"), "{said}");
        assert!(said.contains("neither"), "{said}");
    }

    #[test]
    fn the_unit_is_checked_against_the_gpu_the_index_names() {
        // GPU 0 holds 80 GiB, GPU 1 40 GiB; the plugin says the device holds 40 (GiB) on GPU 0:
        // that is GPU 1's size, not GPU 0's, so nothing explains it.
        let mut gpus = gpus();
        gpus[1].memory_total = 40 * GIB;
        let env = [
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "4"),
            ("ALIYUN_COM_GPU_MEM_IDX", "0"),
            ("ALIYUN_COM_GPU_MEM_DEV", "40"),
        ];
        let r = env_quota(env.iter().copied(), GpuShareUnit::GiB, &gpus);
        assert!(
            matches!(r.unit_check, UnitCheck::Unexplained { dev: 40, gpu_bytes } if gpu_bytes == 80 * GIB),
            "{:?}",
            r.unit_check
        );
        let env = [
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "4"),
            ("ALIYUN_COM_GPU_MEM_IDX", "1"),
            ("ALIYUN_COM_GPU_MEM_DEV", "40"),
        ];
        let r = env_quota(env.iter().copied(), GpuShareUnit::GiB, &gpus);
        assert_eq!(r.unit_check, UnitCheck::Agrees);
    }

    #[test]
    fn a_disagreement_names_the_devices_the_runtime_gave() {
        let r = report_on(&[("CUDA_DEVICE_MEMORY_LIMIT_3", "1g")], &[G1]);
        assert_eq!(kinds(&r), vec![DisagreementKind::BeyondGranted]);
        assert!(
            r.disagreements[0].said.contains("(GPU 1)"),
            "{:?}",
            r.disagreements
        );
        let r = report_on(
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "1"),
                ("ALIYUN_COM_GPU_MEM_IDX", "0"),
            ],
            &[G1, DeviceRef::Uuid("GPU-elsewhere".into())],
        );
        assert_eq!(kinds(&r), vec![DisagreementKind::NotGranted]);
        assert!(
            r.disagreements[0].said.contains("(GPU 1, GPU-elsewhere)"),
            "{:?}",
            r.disagreements
        );
    }

    #[test]
    fn the_device_size_tells_which_unit_the_plugin_uses() {
        let mib_plugin = [
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "4096"),
            ("ALIYUN_COM_GPU_MEM_IDX", "0"),
            ("ALIYUN_COM_GPU_MEM_DEV", "81920"),
        ];
        // Configured right: agrees.
        let r = report(&mib_plugin, GpuShareUnit::MiB);
        assert_eq!(r.unit_check, UnitCheck::Agrees);
        assert_eq!(
            r.quota.unwrap().per_gpu,
            vec![(DeviceRef::Index(0), 4 * GIB)]
        );
        // Configured GiB: 4096 GiB would never bind; the device size shows MiB, which applies.
        let r = report(&mib_plugin, GpuShareUnit::GiB);
        assert!(r.unit_check.disagrees());
        assert!(matches!(
            r.unit_check,
            UnitCheck::Mismatch {
                configured: GpuShareUnit::GiB,
                plugin: GpuShareUnit::MiB,
                dev: 81920,
                ..
            }
        ));
        assert_eq!(
            r.quota.unwrap().per_gpu,
            vec![(DeviceRef::Index(0), 4 * GIB)]
        );
        let said = r.unit_check.describe().unwrap();
        assert!(said.contains("gpushare_memory_unit = \"MiB\""), "{said}");
        // The other way round: a GiB plugin, MiB configured (1 GiB, not 1 MiB).
        let r = report(
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "1"),
                ("ALIYUN_COM_GPU_MEM_DEV", "79"),
            ],
            GpuShareUnit::MiB,
        );
        assert!(r.unit_check.disagrees());
        assert_eq!(r.quota.as_ref().unwrap().each_gpu, Some(GIB));
        // A size that fits neither unit: the configured unit, reported.
        let r = report(
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "2"),
                ("ALIYUN_COM_GPU_MEM_DEV", "5"),
            ],
            GpuShareUnit::GiB,
        );
        assert!(matches!(
            r.unit_check,
            UnitCheck::Unexplained { dev: 5, .. }
        ));
        assert_eq!(r.quota.as_ref().unwrap().each_gpu, Some(2 * GIB));
        // No device size, or no GPU known: the configured unit, nothing to say.
        let r = report(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "2")], GpuShareUnit::MiB);
        assert_eq!(
            (r.unit_check, r.quota.unwrap().each_gpu),
            (UnitCheck::NotApplicable, Some(2 * MIB))
        );
        let r = env_quota(mib_plugin, GpuShareUnit::GiB, &[]);
        assert_eq!(r.unit_check, UnitCheck::Unknown);
        assert_eq!(r.quota.as_ref().unwrap().per_gpu[0].1, 4096 * GIB);
        // HAMi alone: nothing to check.
        assert_eq!(
            report(
                &[
                    ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                    ("ALIYUN_COM_GPU_MEM_DEV", "5")
                ],
                GpuShareUnit::GiB
            )
            .unit_check,
            UnitCheck::NotApplicable
        );
    }

    #[test]
    fn the_unit_is_applied_when_the_quota_is_computed() {
        // The same variables under two units: a reload that changes the unit changes the quota.
        let env = [("ALIYUN_COM_GPU_MEM_CONTAINER", "2")];
        assert_eq!(
            quota(&env, GpuShareUnit::GiB).unwrap().each_gpu,
            Some(2 * GIB)
        );
        assert_eq!(
            quota(&env, GpuShareUnit::MiB).unwrap().each_gpu,
            Some(2 * MIB)
        );
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
        assert!(is_quota_var("ALIYUN_COM_GPU_MEM_DEV"));
        assert!(is_quota_var("CUDA_DEVICE_MEMORY_LIMIT_3"));
        assert!(!is_quota_var("PATH"));
    }

    proptest! {
        #[test]
        fn never_panics_and_extra_variables_only_lower_limits(
            entries in proptest::collection::vec(
                (
                    prop_oneof![
                        Just("ALIYUN_COM_GPU_MEM_CONTAINER".to_string()),
                        Just("ALIYUN_COM_GPU_MEM_IDX".to_string()),
                        Just("ALIYUN_COM_GPU_MEM_DEV".to_string()),
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
            extra_value in "0|[0-9]{1,4}[kmg]?|junk",
            mib in any::<bool>(),
        ) {
            let unit = if mib { GpuShareUnit::MiB } else { GpuShareUnit::GiB };
            let pairs: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let base = env_quota(pairs.iter().copied(), unit, &gpus());
            if let Some(q) = &base.quota {
                prop_assert!(!q.per_gpu.is_empty() || q.each_gpu.is_some());
                prop_assert!(q.per_gpu.iter().all(|(_, b)| *b > 0));
                prop_assert!(q.each_gpu.is_none_or(|b| b > 0));
            }
            // An added CUDA_DEVICE_MEMORY_LIMIT never removes or raises the limit for every GPU.
            let mut more = pairs.clone();
            more.push(("CUDA_DEVICE_MEMORY_LIMIT", extra_value.as_str()));
            let with = env_quota(more.iter().copied(), unit, &gpus());
            if let Some(b) = base.quota.as_ref().and_then(|q| q.each_gpu) {
                let after = with.quota.as_ref().and_then(|q| q.each_gpu);
                prop_assert!(after.is_some_and(|a| a <= b), "{base:?} -> {with:?}");
            }
            for (d, b) in base.quota.iter().flat_map(|q| q.per_gpu.iter()) {
                let after = with.quota.as_ref().and_then(|q| q.per_gpu.iter().find(|(e, _)| e == d)).map(|(_, a)| *a);
                prop_assert!(after.is_some_and(|a| a <= *b), "{base:?} -> {with:?}");
            }
        }

        #[test]
        fn environ_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_environ(&bytes);
        }
    }
}
