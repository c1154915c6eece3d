//! Which GPU a launched service goes to. Pure: GPUs and quotas in, a choice or a refusal out.
//!
//! A GPU's *free* memory here is what no quota has claimed: its usable memory (total minus what the
//! driver reserves) minus the quotas already granted on it: every quota entry that names that GPU,
//! whether from the operator's files or from other launches' runtime drop-ins. Entries over all GPUs
//! (`gpu = "all"`, the default) claim no particular GPU and are not counted. What processes actually
//! use does not enter: a reservation is a promise, usage is the agent's business.

use std::fmt;

use crate::quota::{ByteSize, DeviceRef, GpuSel, QuotaSet};

/// One GPU as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuCapacity {
    /// NVML index.
    pub index: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Memory quotas may claim: total minus the driver's reserve, bytes.
    pub usable: u64,
    /// Bytes claimed by quotas that name this GPU.
    pub reserved: u64,
    /// How many quota entries claim them.
    pub quotas: usize,
}

impl GpuCapacity {
    /// Unclaimed bytes.
    pub fn free(&self) -> u64 {
        self.usable.saturating_sub(self.reserved)
    }

    fn describe(&self) -> String {
        format!(
            "GPU {} {} ({}): {} free of {} ({} reserved by {} quota{})",
            self.index,
            self.uuid,
            self.name,
            ByteSize(self.free()).approx(),
            ByteSize(self.usable).approx(),
            ByteSize(self.reserved).approx(),
            self.quotas,
            if self.quotas == 1 { "" } else { "s" }
        )
    }
}

/// How to choose among GPUs that can hold a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// The GPU with the least free memory that still fits (keeps big holes for big requests).
    BestFit,
    /// The GPU with the most free memory (balances services over GPUs).
    Spread,
}

/// A GPU the user asked for with `--gpu`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// By NVML index.
    Index(u32),
    /// By UUID.
    Uuid(String),
}

impl Wanted {
    /// `3` is an index, anything else a UUID.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return s
                .parse()
                .map(Wanted::Index)
                .map_err(|_| format!("`{s}` is not a GPU index"));
        }
        if s.starts_with("GPU-") || s.starts_with("MIG-") {
            return Ok(Wanted::Uuid(s.to_string()));
        }
        Err(format!(
            "`{s}` is neither a GPU index (0, 1, ...) nor a UUID like GPU-8f1c2d3e-... (`nvidia-smi -L`)"
        ))
    }

    fn matches(&self, g: &GpuCapacity) -> bool {
        match self {
            Self::Index(i) => g.index == *i,
            Self::Uuid(u) => g.uuid == *u,
        }
    }
}

impl fmt::Display for Wanted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Index(i) => write!(f, "GPU {i}"),
            Self::Uuid(u) => f.write_str(u),
        }
    }
}

/// Why no GPU was chosen. The message names every GPU and its free memory.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// NVML lists no GPU.
    #[error("no GPU found: NVML lists none")]
    NoGpus,
    /// `--gpu` names no GPU of this node.
    #[error("{wanted} is not a GPU of this node; GPUs:\n{list}")]
    NoSuchGpu {
        /// What was asked for.
        wanted: String,
        /// One line per GPU.
        list: String,
    },
    /// Nothing fits.
    #[error(
        "{lead} {request} of GPU memory (free = usable memory minus the quotas granted on the GPU):\n{list}"
    )]
    NoFit {
        /// `no GPU can hold` or `GPU 1 cannot hold`.
        lead: String,
        /// The request, human.
        request: String,
        /// One line per GPU considered.
        list: String,
    },
}

fn listing<'a>(gpus: impl Iterator<Item = &'a GpuCapacity>) -> String {
    gpus.map(|g| format!("  {}", g.describe()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Adds the quotas of `set` that name a GPU to that GPU's reservation.
pub fn add_reservations(set: &QuotaSet, gpus: &mut [GpuCapacity]) {
    for e in set.entries() {
        let GpuSel::Device(d) = &e.gpu else { continue };
        let g = gpus.iter_mut().find(|g| match d {
            DeviceRef::Index(i) => g.index == *i,
            DeviceRef::Uuid(u) => g.uuid == *u,
            // Quota files name no minors.
            DeviceRef::Minor(_) => false,
        });
        if let Some(g) = g {
            g.reserved = g.reserved.saturating_add(e.gpu_memory);
            g.quotas += 1;
        }
    }
}

/// Picks the GPU for a request of `request` bytes; returns its position in `gpus`. Ties go to the
/// lower index.
pub fn choose(
    gpus: &[GpuCapacity],
    request: u64,
    wanted: Option<&Wanted>,
    strategy: Strategy,
) -> Result<usize, PlacementError> {
    if gpus.is_empty() {
        return Err(PlacementError::NoGpus);
    }
    let candidates: Vec<usize> = match wanted {
        Some(w) => {
            let found: Vec<usize> = (0..gpus.len()).filter(|&i| w.matches(&gpus[i])).collect();
            if found.is_empty() {
                return Err(PlacementError::NoSuchGpu {
                    wanted: w.to_string(),
                    list: listing(gpus.iter()),
                });
            }
            found
        }
        None => (0..gpus.len()).collect(),
    };
    let fitting = candidates
        .iter()
        .copied()
        .filter(|&i| gpus[i].free() >= request);
    let best = match strategy {
        Strategy::BestFit => fitting.min_by_key(|&i| (gpus[i].free(), gpus[i].index)),
        Strategy::Spread => {
            fitting.min_by_key(|&i| (std::cmp::Reverse(gpus[i].free()), gpus[i].index))
        }
    };
    best.ok_or_else(|| PlacementError::NoFit {
        lead: match wanted {
            Some(w) => format!("{w} cannot hold"),
            None => "no GPU can hold".to_string(),
        },
        request: ByteSize(request).approx(),
        list: listing(candidates.iter().map(|&i| &gpus[i])),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn gpu(index: u32, usable_gib: u64, reserved_gib: u64) -> GpuCapacity {
        GpuCapacity {
            index,
            uuid: format!("GPU-{index}"),
            name: "Fake".into(),
            usable: usable_gib * GIB,
            reserved: reserved_gib * GIB,
            quotas: usize::from(reserved_gib > 0),
        }
    }

    #[test]
    fn best_fit_takes_the_tightest_gpu_and_spread_the_emptiest() {
        // free: 10, 4, 16
        let gpus = [gpu(0, 16, 6), gpu(1, 8, 4), gpu(2, 16, 0)];
        let pick = |req, s| choose(&gpus, req * GIB, None, s).map(|i| gpus[i].index);
        assert_eq!(pick(4, Strategy::BestFit), Ok(1));
        assert_eq!(pick(5, Strategy::BestFit), Ok(0));
        assert_eq!(pick(11, Strategy::BestFit), Ok(2));
        assert_eq!(pick(1, Strategy::Spread), Ok(2));
        assert_eq!(pick(16, Strategy::Spread), Ok(2));
        // Ties go to the lower index.
        let twins = [gpu(0, 8, 0), gpu(1, 8, 0)];
        assert_eq!(choose(&twins, GIB, None, Strategy::BestFit), Ok(0));
        assert_eq!(choose(&twins, GIB, None, Strategy::Spread), Ok(0));
    }

    #[test]
    fn refusals_name_every_gpu_and_its_free_memory() {
        let gpus = [gpu(0, 16, 12), gpu(1, 8, 0)];
        let err = choose(&gpus, 9 * GIB, None, Strategy::BestFit).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("no GPU can hold 9.0 GiB"), "{text}");
        assert!(
            text.contains(
                "GPU 0 GPU-0 (Fake): 4.0 GiB free of 16.0 GiB (12.0 GiB reserved by 1 quota)"
            ),
            "{text}"
        );
        assert!(
            text.contains("GPU 1 GPU-1 (Fake): 8.0 GiB free of 8.0 GiB (0 B reserved by 0 quotas)"),
            "{text}"
        );
        // A named GPU is the only candidate.
        let w = Wanted::parse("GPU-0").unwrap();
        assert_eq!(choose(&gpus, 4 * GIB, Some(&w), Strategy::BestFit), Ok(0));
        let err = choose(&gpus, 5 * GIB, Some(&w), Strategy::BestFit).unwrap_err();
        assert!(
            err.to_string().starts_with("GPU-0 cannot hold 5.0 GiB"),
            "{err}"
        );
        assert!(!err.to_string().contains("GPU 1 "), "{err}");
        let err = choose(&gpus, GIB, Some(&Wanted::Index(7)), Strategy::BestFit).unwrap_err();
        assert!(matches!(err, PlacementError::NoSuchGpu { .. }), "{err}");
        assert_eq!(
            choose(&[], 1, None, Strategy::Spread),
            Err(PlacementError::NoGpus)
        );
    }

    #[test]
    fn wanted_gpu_is_an_index_or_a_uuid() {
        assert_eq!(Wanted::parse("1"), Ok(Wanted::Index(1)));
        assert_eq!(
            Wanted::parse("GPU-8f1c"),
            Ok(Wanted::Uuid("GPU-8f1c".into()))
        );
        assert!(Wanted::parse("first").is_err());
        assert!(Wanted::parse("").is_err());
    }

    #[test]
    fn quotas_naming_a_gpu_reserve_it_and_all_gpu_quotas_do_not() {
        let set = QuotaSet::parse(
            r#"
[[quota]]
unit = "a.service"
gpu = 0
gpu_memory = "2GiB"

[[quota]]
unit = "b.service"
gpu = "GPU-1"
gpu_memory = "3GiB"

[[quota]]
unit = "b.service"
gpu_memory = "100GiB"

[[quota]]
unit = "c.service"
gpu = 9
gpu_memory = "1GiB"
"#,
            "q.toml",
        )
        .unwrap();
        let mut gpus = [gpu(0, 16, 0), gpu(1, 16, 0)];
        add_reservations(&set, &mut gpus);
        assert_eq!((gpus[0].reserved, gpus[0].quotas), (2 * GIB, 1));
        assert_eq!((gpus[1].reserved, gpus[1].quotas), (3 * GIB, 1));
    }
}
