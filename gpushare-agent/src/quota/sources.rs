//! Which sources a grant came from, as a set (pure).
//!
//! A container's limit may come from one vendor's environment variables, from several, from the
//! kubelet's device assignment, from the API server (a DRA claim, the pod's annotations), or from
//! any mix: the smallest applies per GPU, and the grant keeps the set of the sources that bind
//! somewhere. The set renders as the names reports have always used (`hami env`, `kubelet and env
//! (the smallest applies)`, ...), so a metric label or an API field reads the same whichever way
//! the set was built.
//!
//! ```
//! use gpushare_agent::quota::{GrantSource, Sources};
//!
//! let env = Sources::from(GrantSource::Hami) | GrantSource::GpuShare.into();
//! assert_eq!(env.as_str(), "several plugins' env (the smallest applies)");
//! let node = env | GrantSource::Kubelet.into();
//! assert_eq!(node.as_str(), "kubelet and env (the smallest applies)");
//! ```

use std::{fmt, ops::BitOr};

/// One source of a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GrantSource {
    /// Alibaba GPUShare's device plugin.
    GpuShare,
    /// HAMi (also Volcano vGPU, KAI's `hamicore` binder, HAMi's DRA driver).
    Hami,
    /// NVIDIA's `NVIDIA_GPU_MEMORY_LIMIT(S)` (kai-gpu-fractioning, read by nvidia-container-toolkit).
    Nvidia,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (MPS; Amazon ECS's MPS allocation).
    Mps,
    /// The kubelet's pod-resources grant (GPUShare units counted from its device ids).
    Kubelet,
    /// A DRA ResourceClaim's consumed capacity (`memory`), from the API server.
    Dra,
    /// Pod annotations (kai-gpu-fractioning's, GPUShare's), from the API server: they only lower.
    Annotation,
}

impl GrantSource {
    /// Every source, in bit order.
    pub const ALL: [GrantSource; 7] = [
        Self::GpuShare,
        Self::Hami,
        Self::Nvidia,
        Self::Mps,
        Self::Kubelet,
        Self::Dra,
        Self::Annotation,
    ];

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The sources of a grant: a set of [`GrantSource`]s.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Sources(u8);

/// The vendors' environment conventions.
const ENV: u8 = GrantSource::GpuShare.bit()
    | GrantSource::Hami.bit()
    | GrantSource::Nvidia.bit()
    | GrantSource::Mps.bit();
/// What the node says: the environment and the kubelet.
const NODE: u8 = ENV | GrantSource::Kubelet.bit();
/// What the API server says.
const API: u8 = GrantSource::Dra.bit() | GrantSource::Annotation.bit();

impl Sources {
    /// No source.
    pub const NONE: Sources = Sources(0);

    /// Whether `s` is in the set.
    pub fn contains(self, s: GrantSource) -> bool {
        self.0 & s.bit() != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every source in the set is the API server's (a DRA claim, annotations).
    pub fn only_api_server(self) -> bool {
        !self.is_empty() && self.0 & !API == 0
    }

    /// The sources in the set, in bit order.
    pub fn iter(self) -> impl Iterator<Item = GrantSource> {
        GrantSource::ALL
            .into_iter()
            .filter(move |s| self.contains(*s))
    }

    /// Its one source, when it has exactly one.
    fn single(self) -> Option<GrantSource> {
        let mut it = self.iter();
        match (it.next(), it.next()) {
            (Some(s), None) => Some(s),
            _ => None,
        }
    }

    /// A short name for reports (metric labels and the API carry these bytes).
    pub fn as_str(self) -> &'static str {
        self.names().0
    }

    /// The report name and the serialized name.
    fn names(self) -> (&'static str, &'static str) {
        const SEVERAL: (&str, &str) = ("several sources (the smallest applies)", "several");
        let (node, api) = (Sources(self.0 & NODE), Sources(self.0 & API));
        if !node.is_empty() && !api.is_empty() {
            return SEVERAL;
        }
        if let Some(s) = self.single() {
            return match s {
                GrantSource::GpuShare => ("gpushare env", "gpushare"),
                GrantSource::Hami => ("hami env", "hami"),
                GrantSource::Nvidia => ("nvidia env", "nvidia"),
                GrantSource::Mps => ("mps env", "mps"),
                GrantSource::Kubelet => ("kubelet", "kubelet"),
                GrantSource::Dra => ("dra", "dra"),
                GrantSource::Annotation => ("annotation", "annotation"),
            };
        }
        if api == self && !api.is_empty() {
            (
                "dra and annotation (the smallest applies)",
                "draandannotation",
            )
        } else if self.contains(GrantSource::Kubelet) {
            ("kubelet and env (the smallest applies)", "kubeletandenv")
        } else if !self.is_empty() {
            ("several plugins' env (the smallest applies)", "both")
        } else {
            ("no source", "none")
        }
    }
}

impl From<GrantSource> for Sources {
    fn from(s: GrantSource) -> Self {
        Sources(s.bit())
    }
}

impl BitOr for Sources {
    type Output = Sources;

    fn bitor(self, other: Sources) -> Sources {
        Sources(self.0 | other.0)
    }
}

impl FromIterator<GrantSource> for Sources {
    fn from_iter<I: IntoIterator<Item = GrantSource>>(iter: I) -> Self {
        iter.into_iter().fold(Sources::NONE, |a, s| a | s.into())
    }
}

impl fmt::Debug for Sources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl serde::Serialize for Sources {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.names().1)
    }
}

#[cfg(test)]
mod tests {
    use super::{GrantSource::*, *};

    fn set(s: &[GrantSource]) -> Sources {
        s.iter().copied().collect()
    }

    /// Every name the pair variants had, byte for byte, for the sets that stand for them.
    #[test]
    fn each_set_renders_the_name_reports_always_used() {
        let cases: &[(&[GrantSource], &str, &str)] = &[
            (&[GpuShare], "gpushare env", "gpushare"),
            (&[Hami], "hami env", "hami"),
            (&[Nvidia], "nvidia env", "nvidia"),
            (&[Mps], "mps env", "mps"),
            (&[Kubelet], "kubelet", "kubelet"),
            (&[Dra], "dra", "dra"),
            (&[Annotation], "annotation", "annotation"),
            (
                &[GpuShare, Hami],
                "several plugins' env (the smallest applies)",
                "both",
            ),
            (
                &[Nvidia, Mps, Hami],
                "several plugins' env (the smallest applies)",
                "both",
            ),
            (
                &[Kubelet, Hami],
                "kubelet and env (the smallest applies)",
                "kubeletandenv",
            ),
            (
                &[Kubelet, Hami, GpuShare],
                "kubelet and env (the smallest applies)",
                "kubeletandenv",
            ),
            (
                &[Dra, Annotation],
                "dra and annotation (the smallest applies)",
                "draandannotation",
            ),
            (
                &[Kubelet, Dra],
                "several sources (the smallest applies)",
                "several",
            ),
            (
                &[Mps, Annotation],
                "several sources (the smallest applies)",
                "several",
            ),
            (&[], "no source", "none"),
        ];
        for (s, name, serialized) in cases {
            let s = set(s);
            assert_eq!(s.as_str(), *name, "{s:?}");
            assert_eq!(serde_json::to_value(s).unwrap(), *serialized, "{s:?}");
        }
    }

    #[test]
    fn a_set_holds_what_was_put_in_and_nothing_else() {
        let s = set(&[Hami, Dra]);
        assert!(s.contains(Hami) && s.contains(Dra));
        assert!(!s.contains(Kubelet) && !s.contains(GpuShare));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![Hami, Dra]);
        assert_eq!(format!("{s:?}"), "{Hami, Dra}");
        assert_eq!(s | Hami.into(), s, "a union adds nothing twice");
        assert!(Sources::NONE.is_empty() && !s.is_empty());
        assert_eq!(set(&GrantSource::ALL).iter().count(), 7);
        assert_eq!(
            set(&[Hami, Hami]),
            Hami.into(),
            "a source read twice is in once"
        );
    }

    #[test]
    fn only_the_api_servers_sources_are_the_api_servers() {
        assert!(set(&[Dra]).only_api_server());
        assert!(set(&[Annotation, Dra]).only_api_server());
        assert!(!set(&[Annotation, Kubelet]).only_api_server());
        assert!(!set(&[Hami]).only_api_server());
        assert!(!Sources::NONE.only_api_server());
    }
}
