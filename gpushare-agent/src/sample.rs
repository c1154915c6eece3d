//! What one NVML sample saw: plain data, produced by [`crate::nvml`] and read by the policy,
//! metrics and API. No I/O here.

use std::time::Instant;

/// One GPU as NVML reported it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceSample {
    /// NVML index.
    pub index: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// `nvmlDeviceGetMinorNumber`: the `N` of its `/dev/nvidia<N>`, which need not be its index
    /// (`None` where NVML did not say).
    pub minor: Option<u32>,
    /// Product name.
    pub name: String,
    /// Total memory, bytes.
    pub memory_total: u64,
    /// Used memory, bytes (as NVML counts it; v2 excludes reserved memory).
    pub memory_used: u64,
    /// Free memory, bytes.
    pub memory_free: u64,
    /// Memory reserved by the driver, bytes (0 where only the v1 call works).
    pub memory_reserved: u64,
    /// How busy the GPU was over NVML's last sample period (`nvmlDeviceGetUtilizationRates`);
    /// `None` where the GPU or driver does not say (NOT_SUPPORTED, MIG) or the call failed.
    pub utilization: Option<Utilization>,
    /// Whether per-process utilization was read for this GPU, and since when.
    pub process_utilization: ProcessUtilization,
    /// GPU temperature, degrees C (`None` where not reported).
    pub temperature_c: Option<u32>,
    /// Power draw, milliwatts (`None` where not reported).
    pub power_mw: Option<u32>,
    /// SM clock, MHz (`None` where not reported).
    pub sm_clock_mhz: Option<u32>,
    /// The driver's own memory a workload may hold on this GPU beyond its quota (its CUDA
    /// context), once per workload: not NVML's, filled in by observation
    /// ([`crate::observe::overhead`]); none until then.
    pub context_overhead: ContextOverhead,
}

/// What a CUDA context takes on one GPU, allowed beyond every quota once per workload and GPU
/// (KAI-Scheduler #2212: the context counts in NVML's per-process usage).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ContextOverhead {
    /// Bytes.
    pub bytes: u64,
    /// Where the figure comes from.
    pub source: OverheadSource,
}

/// Where a GPU's [`ContextOverhead`] comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverheadSource {
    /// None is allowed: `context_overhead = "0"`, or nothing learned and nothing set.
    #[default]
    None,
    /// Not enough small processes seen on this model yet to learn it: none allowed meanwhile.
    Learning,
    /// Learned on this node: the smallest process seen on this model.
    Learned,
    /// Set in the quota file.
    Set,
}

impl OverheadSource {
    /// `none`, `learning`, `learned`, `set`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Learning => "learning",
            Self::Learned => "learned",
            Self::Set => "set",
        }
    }
}

/// Percentages of time busy, 0-100, as NVML reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Utilization {
    /// SM (kernels running): `gpu` of nvmlUtilization_t, `smUtil` of a process sample.
    pub sm: u32,
    /// Memory controller (reads and writes of device memory): `memory` / `memUtil`.
    pub memory: u32,
}

/// Per-process utilization of one GPU in one sample.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ProcessUtilization {
    /// Not read: the GPU or driver does not support it (NOT_SUPPORTED, MIG), the call failed,
    /// or this is the first read (it only sets where the next one starts). Processes show no
    /// utilization, never 0.
    #[default]
    Unknown,
    /// Read: every sample newer than the previous read. A process of the GPU without a sample
    /// was idle.
    Read {
        /// CLOCK_BOOTTIME ns at which the window of these samples began (the previous read's
        /// newest sample): a process charged with one must have held its pid since then.
        since_boot_ns: u64,
    },
}

/// One process on one GPU. Compute and graphics records of the same pid are merged.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProcessSample {
    /// Host pid.
    pub pid: u32,
    /// NVML index of the GPU.
    pub device_index: u32,
    /// GPU UUID (one allocation per GPU and sample, shared by its processes).
    pub device_uuid: std::sync::Arc<str>,
    /// Used memory, bytes; `None` when NVML reports it as not available.
    pub used_bytes: Option<u64>,
    /// Utilization over the GPU's sample window (0 when it had no sample: idle); `None` where
    /// the GPU's process utilization is unknown, or the pid's holder may not have held it for
    /// the whole window.
    pub utilization: Option<Utilization>,
}

/// Whether a device's data in a sample can be acted upon.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DeviceHealth {
    /// Read completely.
    Ok,
    /// Some call failed or the GPU is lost: its data is missing or stale, never enforced on.
    Degraded {
        /// What failed.
        reason: String,
    },
}

/// One complete sample.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GpuSample {
    /// When it was taken.
    #[serde(skip)]
    pub taken_at: Option<Instant>,
    /// The GPUs read, in index order.
    pub devices: Vec<DeviceSample>,
    /// Health per device index (same order as `devices`, plus indices that failed to read).
    pub health: Vec<(u32, DeviceHealth)>,
    /// Processes, merged per (pid, device).
    pub processes: Vec<ProcessSample>,
    /// Problems that hit the whole sample (e.g. the device count could not be read).
    pub problems: Vec<String>,
}

impl GpuSample {
    /// CLOCK_BOOTTIME ns at which the per-process utilization window of device `index` began
    /// (0, which no process started before, where it is unknown).
    pub fn utilization_since(&self, index: u32) -> u64 {
        match self.devices.iter().find(|d| d.index == index) {
            Some(DeviceSample {
                process_utilization: ProcessUtilization::Read { since_boot_ns },
                ..
            }) => *since_boot_ns,
            _ => 0,
        }
    }

    /// Whether device `index` was read completely in this sample.
    pub fn device_ok(&self, index: u32) -> bool {
        self.health
            .iter()
            .any(|(i, h)| *i == index && *h == DeviceHealth::Ok)
    }
}
