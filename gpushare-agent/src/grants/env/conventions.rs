//! The vendors' environment conventions, declared once ([`CONVENTIONS`]): each variable (or
//! prefix), its vendor, how its value is read and what it grants. [`super::env_quota_on`] reads a
//! container's variables through this list ([`Vars::read`]) and parses each convention's values by
//! its form ([`Vars::limits`]); what no form can say alone (GPUShare's index and unit, placing an
//! ordinal on a device) stays in the functions the module note describes.

use super::{
    Disagreement, EnvQuotaError, GpuInfo, Limits, MPS_LIMIT, NV_LIMIT, NV_LIMITS, NV_REQUEST,
    NV_REQUESTS, Ordinal, error, implausible, mps_limits, parse_hami_limit, parse_mib_list,
    zero_from_no_plugin,
};
use crate::quota::{DeviceRef, GrantSource};

/// How a convention's value is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `<n>` bytes or `<n>k|m|g` (powers of 1024, either case); 0 is no limit.
    HamiSize,
    /// Integer MiB: one value, or a comma-separated one per device ordinal; 0 is no limit.
    MibList,
    /// `<ordinal>=<size>` and `GPU-<uuid>=<size>` entries, comma-separated and mixed, or one size.
    MpsList,
    /// A whole number of the device plugin's memory unit (GiB unless configured as MiB).
    PluginUnits,
    /// A GPU index; `-1` (or none) when the device is unknown.
    GpuIndex,
    /// A device list, read as getenv(3) does: the first occurrence.
    DeviceList,
}

/// What a convention's variable grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grants {
    /// A limit on every GPU, or one per device ordinal where the value lists several.
    Limit,
    /// A limit on the device ordinal its name ends in.
    OrdinalLimit,
    /// A request, reported beside the quota and never a limit.
    Request,
    /// The GPU the vendor's limit is on.
    Index,
    /// The device's size in the vendor's unit, which tells the unit.
    DeviceSize,
    /// Nothing: which GPUs the ordinals name, as the image says (never trusted alone).
    Visible,
}

/// One convention: a variable (or prefix) a vendor writes into a container's environment.
#[derive(Clone, Copy, Debug)]
pub struct Convention {
    /// The variables' names; with [`Grants::OrdinalLimit`] one prefix, followed by an ordinal.
    pub names: &'static [&'static str],
    /// Whose convention; `None` for the device lists every vendor's runtime sets.
    pub vendor: Option<GrantSource>,
    /// How its value is read.
    pub form: Form,
    /// What it grants.
    pub grants: Grants,
}

const fn c(
    names: &'static [&'static str],
    vendor: Option<GrantSource>,
    form: Form,
    grants: Grants,
) -> Convention {
    Convention {
        names,
        vendor,
        form,
        grants,
    }
}

use GrantSource::{GpuShare, Hami, Mps, Nvidia};

/// GPUShare's limit, in the plugin's unit.
pub const GS_MEM: &str = "ALIYUN_COM_GPU_MEM_CONTAINER";
/// GPUShare's GPU index.
pub const GS_IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";
/// GPUShare's device size, in the plugin's unit.
pub const GS_DEV: &str = "ALIYUN_COM_GPU_MEM_DEV";
/// HAMi's limit for every device, and the prefix of its per-ordinal limits.
pub const HAMI_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
const HAMI_PREFIX: &str = "CUDA_DEVICE_MEMORY_LIMIT_";
/// The device lists: which GPUs a container's ordinals name, as its image says.
pub const CUDA_VISIBLE: &str = "CUDA_VISIBLE_DEVICES";
/// See [`CUDA_VISIBLE`].
pub const NVIDIA_VISIBLE: &str = "NVIDIA_VISIBLE_DEVICES";

/// Every convention, in the order their values are read (the order of what a report says).
pub const CONVENTIONS: &[Convention] = &[
    c(&[HAMI_LIMIT], Some(Hami), Form::HamiSize, Grants::Limit),
    c(
        &[HAMI_PREFIX],
        Some(Hami),
        Form::HamiSize,
        Grants::OrdinalLimit,
    ),
    c(
        &[NV_LIMIT, NV_LIMITS],
        Some(Nvidia),
        Form::MibList,
        Grants::Limit,
    ),
    c(
        &[NV_REQUEST, NV_REQUESTS],
        Some(Nvidia),
        Form::MibList,
        Grants::Request,
    ),
    c(&[MPS_LIMIT], Some(Mps), Form::MpsList, Grants::Limit),
    c(&[CUDA_VISIBLE], None, Form::DeviceList, Grants::Visible),
    c(&[NVIDIA_VISIBLE], None, Form::DeviceList, Grants::Visible),
    c(&[GS_MEM], Some(GpuShare), Form::PluginUnits, Grants::Limit),
    c(&[GS_IDX], Some(GpuShare), Form::GpuIndex, Grants::Index),
    c(
        &[GS_DEV],
        Some(GpuShare),
        Form::PluginUnits,
        Grants::DeviceSize,
    ),
];

/// The convention `name` belongs to, with the ordinal its name ends in (or why it cannot).
fn convention_of(name: &str) -> Option<(usize, Result<u32, ()>)> {
    CONVENTIONS.iter().enumerate().find_map(|(i, c)| {
        if c.grants != Grants::OrdinalLimit {
            return c.names.contains(&name).then_some((i, Ok(0)));
        }
        let suffix = name.strip_prefix(c.names[0])?;
        let ordinal = suffix
            .parse::<u32>()
            .ok()
            .filter(|_| suffix.bytes().all(|b| b.is_ascii_digit()));
        Some((i, ordinal.ok_or(())))
    })
}

/// One variable a convention reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Var<'a> {
    /// Its device ordinal, for [`Grants::OrdinalLimit`]; 0 otherwise.
    pub ordinal: u32,
    /// Its name.
    pub name: &'a str,
    /// Its value.
    pub value: &'a str,
}

/// A container's variables by convention (in [`CONVENTIONS`]' order), each in the order the
/// environment has them.
pub struct Vars<'a> {
    by_convention: Vec<Vec<Var<'a>>>,
}

/// What the limit conventions grant: limits per vendor, ordinals to place, the request.
#[derive(Default)]
pub struct Granted<'a> {
    /// Each vendor's limits on every GPU and on devices named by UUID.
    pub families: Vec<(GrantSource, Limits)>,
    /// Per-ordinal limits, with their vendor, to place on the runtime's devices.
    pub ordinals: Vec<(GrantSource, Ordinal<'a>)>,
    /// The smallest request, bytes.
    pub request: Option<u64>,
}

impl Granted<'_> {
    /// The limits of `vendor`, made empty the first time.
    pub fn family(&mut self, vendor: GrantSource) -> &mut Limits {
        let i = match self.families.iter().position(|(v, _)| *v == vendor) {
            Some(i) => i,
            None => {
                self.families.push((vendor, Limits::default()));
                self.families.len() - 1
            }
        };
        &mut self.families[i].1
    }
}

/// Where values are judged: the node's GPUs, what the runtime gave, and what is said about them.
pub struct Judge<'g> {
    /// The node's GPUs.
    pub gpus: &'g [GpuInfo],
    /// The GPUs the runtime gave, resolved to NVML indices where NVML tells.
    pub granted: Option<Vec<DeviceRef>>,
    /// The largest GPU: no plugin grants more than one GPU holds.
    pub largest: Option<u64>,
    /// Malformed values.
    pub problems: Vec<EnvQuotaError>,
    /// What the values and the runtime disagree on.
    pub disagreements: Vec<Disagreement>,
}

impl<'a> Vars<'a> {
    /// Sorts `environ` by convention; a variable no convention reads is passed over, one whose
    /// name ends in no ordinal is a problem.
    pub fn read<I>(environ: I, problems: &mut Vec<EnvQuotaError>) -> Self
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut by_convention = vec![Vec::new(); CONVENTIONS.len()];
        for (name, value) in environ {
            match convention_of(name) {
                Some((i, Ok(ordinal))) => by_convention[i].push(Var {
                    ordinal,
                    name,
                    value,
                }),
                Some((_, Err(()))) => {
                    problems.push(error(name, value, "the suffix must be a CUDA index"))
                }
                None => {}
            }
        }
        Vars { by_convention }
    }

    /// The values of the convention that reads `name`.
    pub fn named(&self, name: &str) -> impl Iterator<Item = &'a str> + '_ {
        let i = convention_of(name).map_or(usize::MAX, |(i, _)| i);
        self.by_convention
            .get(i)
            .into_iter()
            .flatten()
            .map(|v| v.value)
    }

    /// A device list's value, as getenv(3) reads it: the first.
    pub fn first(&self, name: &str) -> Option<&'a str> {
        self.named(name).next()
    }

    /// What every limit and request convention grants, each value read by its form, in
    /// [`CONVENTIONS`]' order.
    pub fn limits(&self, judge: &mut Judge) -> Granted<'a> {
        let mut out = Granted::default();
        for (c, vars) in CONVENTIONS.iter().zip(&self.by_convention) {
            let Some(vendor) = c.vendor else { continue };
            match (c.form, c.grants) {
                (Form::HamiSize, Grants::Limit) => {
                    for v in vars {
                        hami_each(v, vendor, judge, &mut out);
                    }
                }
                (Form::HamiSize, Grants::OrdinalLimit) => {
                    let mut vars = vars.clone();
                    vars.sort();
                    for v in vars {
                        match parse_hami_limit(v.name, v.value) {
                            Ok(Some(bytes)) => out.ordinals.push((vendor, ordinal(&v, bytes))),
                            Ok(None) => {
                                zero_from_no_plugin(&mut judge.disagreements, v.name, v.value)
                            }
                            Err(e) => judge.problems.push(e),
                        }
                    }
                }
                (Form::MibList, Grants::Limit) => {
                    for v in vars {
                        mib_limit(v, vendor, judge, &mut out);
                    }
                }
                (Form::MibList, Grants::Request) => {
                    for v in vars {
                        match parse_mib_list(v.name, v.value) {
                            Ok(list) => {
                                let r = list.into_iter().flatten().min();
                                out.request = match (out.request, r) {
                                    (Some(a), Some(b)) => Some(b.min(a)),
                                    (a, b) => a.or(b),
                                };
                            }
                            Err(e) => judge.problems.push(e),
                        }
                    }
                }
                (Form::MpsList, Grants::Limit) => {
                    let values: Vec<&'a str> = vars.iter().map(|v| v.value).collect();
                    let (ordinals, limits) = mps_limits(
                        &values,
                        judge.gpus,
                        judge.granted.as_deref(),
                        judge.largest,
                        &mut judge.problems,
                        &mut judge.disagreements,
                    );
                    out.ordinals
                        .extend(ordinals.into_iter().map(|o| (vendor, o)));
                    out.family(vendor).add(limits);
                }
                // GPUShare's values are read together (its index and unit): `gpushare_limits`.
                _ => {}
            }
        }
        out
    }
}

fn ordinal<'a>(v: &Var<'a>, bytes: u64) -> Ordinal<'a> {
    Ordinal {
        ordinal: v.ordinal,
        var: v.name,
        value: v.value,
        bytes,
    }
}

/// HAMi's limit for every device.
fn hami_each(v: &Var, vendor: GrantSource, judge: &mut Judge, out: &mut Granted) {
    match parse_hami_limit(v.name, v.value) {
        Ok(Some(b)) => {
            implausible(&mut judge.disagreements, judge.largest, v.name, v.value, b);
            out.family(vendor).each(b)
        }
        Ok(None) => zero_from_no_plugin(&mut judge.disagreements, v.name, v.value),
        Err(e) => judge.problems.push(e),
    }
}

/// NVIDIA's limit: one value for every GPU, or one per device ordinal.
fn mib_limit<'a>(v: &Var<'a>, vendor: GrantSource, judge: &mut Judge, out: &mut Granted<'a>) {
    match parse_mib_list(v.name, v.value) {
        Ok(list) if list.len() == 1 => {
            if let Some(b) = list[0] {
                implausible(&mut judge.disagreements, judge.largest, v.name, v.value, b);
                out.family(vendor).each(b);
            }
        }
        Ok(list) => {
            for (i, bytes) in list.into_iter().enumerate() {
                if let Some(bytes) = bytes {
                    let v = Var {
                        ordinal: i as u32,
                        ..*v
                    };
                    out.ordinals.push((vendor, ordinal(&v, bytes)));
                }
            }
        }
        Err(e) => judge.problems.push(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::env::is_quota_var;

    /// Every variable a convention reads is one the agent caches (`is_quota_var`): a name the list
    /// declares and the cache drops would never be read.
    #[test]
    fn every_declared_variable_is_cached() {
        for c in CONVENTIONS {
            for n in c.names {
                let n = if c.grants == Grants::OrdinalLimit {
                    format!("{n}0")
                } else {
                    n.to_string()
                };
                assert!(is_quota_var(&n), "{n}");
            }
        }
    }

    #[test]
    fn a_variable_finds_its_convention_and_ordinal() {
        let named = |n| convention_of(n).map(|(i, o)| (CONVENTIONS[i].names[0], o));
        assert_eq!(named("CUDA_DEVICE_MEMORY_LIMIT"), Some((HAMI_LIMIT, Ok(0))));
        assert_eq!(
            named("CUDA_DEVICE_MEMORY_LIMIT_12"),
            Some((HAMI_PREFIX, Ok(12)))
        );
        assert_eq!(
            named("CUDA_DEVICE_MEMORY_LIMIT_+1"),
            Some((HAMI_PREFIX, Err(())))
        );
        assert_eq!(
            named("CUDA_DEVICE_MEMORY_LIMIT_x"),
            Some((HAMI_PREFIX, Err(())))
        );
        assert_eq!(named("NVIDIA_GPU_MEMORY_LIMITS"), Some((NV_LIMIT, Ok(0))));
        assert_eq!(
            named("NVIDIA_GPU_MEMORY_REQUEST"),
            Some((NV_REQUEST, Ok(0)))
        );
        assert_eq!(named("ALIYUN_COM_GPU_MEM_DEV"), Some((GS_DEV, Ok(0))));
        assert_eq!(named("ALIYUN_COM_GPU_MEM_POD"), None);
        assert_eq!(named("PATH"), None);
    }

    #[test]
    fn values_keep_the_environments_order_and_a_device_list_its_first() {
        let mut problems = Vec::new();
        let env = [
            (CUDA_VISIBLE, "1"),
            (GS_MEM, "3"),
            ("PATH", "/bin"),
            (CUDA_VISIBLE, "0"),
            (GS_MEM, "2"),
            ("CUDA_DEVICE_MEMORY_LIMIT_a", "1g"),
        ];
        let vars = Vars::read(env, &mut problems);
        assert_eq!(vars.named(GS_MEM).collect::<Vec<_>>(), ["3", "2"]);
        assert_eq!(vars.first(CUDA_VISIBLE), Some("1"));
        assert_eq!(vars.first(NVIDIA_VISIBLE), None);
        assert_eq!(vars.named("PATH").count(), 0);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].var, "CUDA_DEVICE_MEMORY_LIMIT_a");
    }
}
