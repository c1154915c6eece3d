//! GPU memory from NVML (nvml-wrapper), one session for the agent's lifetime.

use std::path::Path;

use log::{info, warn};
use nvml_wrapper::Nvml;

/// Whether NVML is usable, and why not.
pub enum NvmlStatus {
    /// Initialised.
    Ready(Box<Nvml>),
    /// No driver (library missing, or driver not loaded): the agent keeps attributing.
    NoDriver(String),
}

/// Opens NVML from `lib` (or the system's libnvidia-ml.so.1). Never fails: a missing driver is a
/// state the agent runs in, reported once, plainly.
pub fn open(lib: Option<&Path>) -> NvmlStatus {
    let mut builder = Nvml::builder();
    if let Some(lib) = lib {
        builder.lib_path(lib.as_os_str());
    }
    match builder.init() {
        Ok(nvml) => {
            let driver = nvml
                .sys_driver_version()
                .unwrap_or_else(|_| "unknown".into());
            let count = nvml.device_count().unwrap_or(0);
            info!("NVML ready: driver {driver}, {count} GPU(s)");
            NvmlStatus::Ready(Box::new(nvml))
        }
        Err(e) => {
            let which = lib
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "libnvidia-ml.so.1".into());
            let reason = format!("{which}: {e}");
            warn!(
                "no NVIDIA driver found ({reason}); GPU memory is not sampled and no quota is \
                 enforced, GPU processes are still attributed to their containers"
            );
            NvmlStatus::NoDriver(reason)
        }
    }
}
