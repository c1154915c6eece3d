//! What one NVML sample saw: plain data, produced by [`crate::nvml`] and read by the policy,
//! metrics and API. No I/O here.

use std::time::Instant;

/// One GPU as NVML reported it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceSample {
    /// NVML index.
    pub index: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
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
}

/// One process on one GPU. Compute and graphics records of the same pid are merged.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProcessSample {
    /// Host pid.
    pub pid: u32,
    /// NVML index of the GPU.
    pub device_index: u32,
    /// GPU UUID.
    pub device_uuid: String,
    /// Used memory, bytes; `None` when NVML reports it as not available.
    pub used_bytes: Option<u64>,
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
    /// Whether device `index` was read completely in this sample.
    pub fn device_ok(&self, index: u32) -> bool {
        self.health
            .iter()
            .any(|(i, h)| *i == index && *h == DeviceHealth::Ok)
    }
}
