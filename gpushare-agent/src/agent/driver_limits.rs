//! Driver-enforced GPU memory limits, where the driver has them: NVIDIA's r615+ drivers (CUDA
//! 13.4) take per-cgroup soft and hard limits through `nvmlDeviceSetMemoryLimits_v1` (backed by
//! the kernel's `dmem` cgroup controller). Where the loaded NVML exports it, every workload under
//! a quota also gets its quota as a driver limit on its root cgroup, on each GPU the quota covers:
//! soft at the quota, hard at the quota plus its tolerance (capped at the GPU's memory). An
//! allocation past the hard limit then fails in the driver, before any sample could see it; the
//! soft isolation (the ladder) still runs, for everything the driver does not cover (an all-GPU
//! total, elastic borrowing, nodes without the function).
//!
//! Limits are set when a workload's wanted limits change and cleared (soft 0, hard MAX) when it
//! leaves or its quota goes, and all cleared on SIGTERM. Per GPU, the back end in force is
//! exported: `driver_limits` once a limit was accepted there, `soft` otherwise (the function is
//! missing, or the device answered NOT_SUPPORTED, e.g. without the dmem controller).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use log::{info, warn};

use crate::nvml::{
    NvmlSampler,
    limits::{DriverLimits, MEMORY_LIMIT_MAX, code_name},
};

/// One wanted limit: (GPU index, root cgroup path) -> (soft, hard) bytes.
pub type Wanted = BTreeMap<(u32, String), (u64, u64)>;

/// Sets and clears the driver's limits.
pub struct DriverLimiter {
    api: Option<DriverLimits>,
    v2_root: PathBuf,
    applied: Wanted,
    in_force: BTreeSet<u32>,
    refused: BTreeMap<u32, String>,
}

impl DriverLimiter {
    /// Over the NVML library `lib` (the sampler's) and the v2 hierarchy at `v2_root`.
    pub fn new(lib: Option<&Path>, v2_root: PathBuf) -> Self {
        let api = DriverLimits::open(lib);
        if api.is_some() {
            info!(
                "the NVIDIA driver takes per-cgroup GPU memory limits (nvmlDeviceSetMemoryLimits_v1): \
                 quotas are also set as driver limits"
            );
        }
        Self {
            api,
            v2_root,
            applied: Wanted::new(),
            in_force: BTreeSet::new(),
            refused: BTreeMap::new(),
        }
    }

    /// The back end on GPU `index`: `driver_limits` when the driver accepted a limit there,
    /// `soft` otherwise.
    pub fn backend(&self, index: u32) -> &'static str {
        if self.in_force.contains(&index) {
            "driver_limits"
        } else {
            "soft"
        }
    }

    /// Why the driver refused limits on a GPU, if it did.
    pub fn refused(&self) -> &BTreeMap<u32, String> {
        &self.refused
    }

    /// Makes the driver's limits what `wanted` says: sets new and changed ones, clears the rest.
    pub fn apply(&mut self, sampler: &NvmlSampler, wanted: &Wanted) {
        let Some(api) = &self.api else {
            return;
        };
        let stale: Vec<(u32, String)> = self
            .applied
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for key in stale {
            let dir = self.v2_root.join(key.1.trim_start_matches('/'));
            if dir.exists() {
                // SAFETY: the handle comes from the sampler's live session.
                let r = sampler.with_device_handle(key.0, |dev| unsafe {
                    api.set(dev, &dir, 0, MEMORY_LIMIT_MAX)
                });
                if let Some(Err(rc)) = r {
                    warn!(
                        "clearing the driver limit of {} on GPU {}: {}",
                        key.1,
                        key.0,
                        code_name(rc)
                    );
                }
            }
            self.applied.remove(&key);
        }
        for (key, &(soft, hard)) in wanted {
            if self.applied.get(key) == Some(&(soft, hard)) {
                continue;
            }
            let dir = self.v2_root.join(key.1.trim_start_matches('/'));
            // SAFETY: the handle comes from the sampler's live session.
            match sampler.with_device_handle(key.0, |dev| unsafe { api.set(dev, &dir, soft, hard) })
            {
                Some(Ok(())) => {
                    self.in_force.insert(key.0);
                    self.refused.remove(&key.0);
                    self.applied.insert(key.clone(), (soft, hard));
                }
                Some(Err(rc)) => {
                    let why = format!(
                        "{} ({rc}) for {} (soft {soft}, hard {hard})",
                        code_name(rc),
                        key.1
                    );
                    if self.refused.get(&key.0) != Some(&why) {
                        warn!(
                            "the driver refused a GPU memory limit on GPU {}: {why}",
                            key.0
                        );
                    }
                    if rc == 3 {
                        self.in_force.remove(&key.0);
                    }
                    self.refused.insert(key.0, why);
                    // Not recorded as applied: tried again at the next change or step.
                }
                None => {}
            }
        }
    }

    /// Clears every limit this agent set (SIGTERM).
    pub fn clear_all(&mut self, sampler: &NvmlSampler) {
        self.apply(sampler, &Wanted::new());
    }
}
