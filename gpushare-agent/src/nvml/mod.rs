//! GPU memory from NVML (nvml-wrapper), one NVML session for the agent's lifetime.
//!
//! [`NvmlSampler::sample`] never fails: a missing driver, a lost GPU or any NVML error makes the
//! affected device *degraded* in the returned [`GpuSample`] (the policy never enforces on it),
//! is counted per NVML call, and is logged once per change.

pub mod limits;
pub mod merge;
pub mod utilization;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use log::{info, warn};
use nvml_wrapper::{
    Device, Nvml,
    enum_wrappers::device::{Clock, TemperatureSensor},
    enums::device::UsedGpuMemory,
    error::NvmlError,
};

use self::{
    merge::{Distrust, RawProcess, merge_device_processes},
    utilization::UtilizationReader,
};
use crate::sample::{DeviceHealth, DeviceSample, GpuSample, ProcessSample, ProcessUtilization};

/// How often initialisation is retried while no driver is found.
const INIT_RETRY: Duration = Duration::from_secs(30);
/// Attempts at a process list that keeps growing between NVML's two calls.
const LIST_ATTEMPTS: usize = 4;

/// Whether NVML is usable.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DriverStatus {
    /// Initialised.
    Ready {
        /// Driver version string.
        driver_version: String,
    },
    /// No driver (library missing, or driver not loaded).
    NoDriver {
        /// Why.
        reason: String,
    },
}

/// Samples every GPU through one NVML session.
pub struct NvmlSampler {
    lib: Option<PathBuf>,
    nvml: Option<Nvml>,
    status: DriverStatus,
    last_init_attempt: Instant,
    errors: BTreeMap<&'static str, u64>,
    distrusted: BTreeMap<&'static str, u64>,
    list_retries: u64,
    last_problem: BTreeMap<String, String>,
    utilization: UtilizationReader,
    device_extras: bool,
    /// Each GPU's UUID as the last sample shared it with its process samples: the same
    /// allocation while the text is the same, so what compares samples across steps finds it
    /// equal by address.
    uuids: BTreeMap<u32, std::sync::Arc<str>>,
}

impl NvmlSampler {
    /// Opens NVML from `lib` (or the system's libnvidia-ml.so.1). Never fails: without a driver
    /// the sampler reports "no NVIDIA driver" and retries now and then.
    pub fn open(lib: Option<&Path>) -> Self {
        let mut s = Self {
            lib: lib.map(Path::to_path_buf),
            nvml: None,
            status: DriverStatus::NoDriver {
                reason: "not initialised".into(),
            },
            last_init_attempt: Instant::now(),
            errors: BTreeMap::new(),
            distrusted: BTreeMap::new(),
            list_retries: 0,
            last_problem: BTreeMap::new(),
            utilization: UtilizationReader::default(),
            device_extras: false,
            uuids: BTreeMap::new(),
        };
        s.try_init(true);
        s
    }

    fn try_init(&mut self, first: bool) {
        self.last_init_attempt = Instant::now();
        let mut builder = Nvml::builder();
        if let Some(lib) = &self.lib {
            builder.lib_path(lib.as_os_str());
        }
        match builder.init() {
            Ok(nvml) => {
                let driver_version = nvml
                    .sys_driver_version()
                    .unwrap_or_else(|_| "unknown".into());
                let count = nvml.device_count().unwrap_or(0);
                info!("NVML ready: driver {driver_version}, {count} GPU(s)");
                self.status = DriverStatus::Ready { driver_version };
                self.nvml = Some(nvml);
            }
            Err(e) => {
                let which = self
                    .lib
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "libnvidia-ml.so.1".into());
                let reason = format!("{which}: {e}");
                if first {
                    warn!(
                        "no NVIDIA driver found ({reason}); GPU memory is not sampled and no quota \
                         is enforced, GPU processes are still attributed to their containers"
                    );
                }
                self.status = DriverStatus::NoDriver { reason };
            }
        }
    }

    /// The driver's state.
    pub fn status(&self) -> &DriverStatus {
        &self.status
    }

    /// NVML errors so far, per call name (e.g. `nvmlDeviceGetMemoryInfo_v2`).
    pub fn errors(&self) -> &BTreeMap<&'static str, u64> {
        &self.errors
    }

    /// Distrusted process records so far, per reason.
    pub fn distrusted(&self) -> &BTreeMap<&'static str, u64> {
        &self.distrusted
    }

    /// Times a process list grew between NVML's two calls and was read again.
    pub fn list_retries(&self) -> u64 {
        self.list_retries
    }

    /// Also read each GPU's temperature, power draw and SM clock every sample (three NVML calls
    /// a GPU; for `--compat dcgm`).
    pub fn read_device_extras(&mut self, on: bool) {
        self.device_extras = on;
    }

    /// The library path given at open (`None`: the system's libnvidia-ml.so.1).
    pub fn library(&self) -> Option<&Path> {
        self.lib.as_deref()
    }

    /// Runs `f` with the raw NVML handle of device `index` (for calls nvml-wrapper does not
    /// know, e.g. [`limits::MemoryLimitsApi`]); `None` without a session or such a device.
    pub fn with_device_handle<T>(
        &self,
        index: u32,
        f: impl FnOnce(*mut std::ffi::c_void) -> T,
    ) -> Option<T> {
        let nvml = self.nvml.as_ref()?;
        let device = nvml.device_by_index(index).ok()?;
        // SAFETY: the handle stays valid while the session (`self.nvml`) lives, which outlasts
        // `f`.
        let handle = unsafe { device.handle() };
        Some(f(handle.cast()))
    }

    /// The pids an MPS server serves on device `index` (`nvmlDeviceGetMPSComputeRunningProcesses_v3`),
    /// or why they cannot be told (no session, no such device, a driver without the call).
    pub fn mps_clients(&self, index: u32) -> Result<Vec<u32>, String> {
        let nvml = self.nvml.as_ref().ok_or("no NVML session")?;
        let device = nvml.device_by_index(index).map_err(|e| e.to_string())?;
        device
            .mps_running_compute_processes()
            .map(|l| l.into_iter().map(|p| p.pid).collect())
            .map_err(|e| e.to_string())
    }

    /// The driver's version, when a session is open.
    pub fn driver_version(&self) -> Option<&str> {
        match &self.status {
            DriverStatus::Ready { driver_version } => Some(driver_version),
            DriverStatus::NoDriver { .. } => None,
        }
    }

    /// Reads every GPU now.
    pub fn sample(&mut self) -> GpuSample {
        self.sample_knowing(&|_| false)
    }

    /// Reads every GPU now; a listed pid for which `known` answers true (a process attribution
    /// holds a pidfd for) is taken to have a `/proc` entry without asking the kernel: a record
    /// whose process exited meanwhile is dropped by attribution's identity check instead.
    pub fn sample_knowing(&mut self, known: &dyn Fn(u32) -> bool) -> GpuSample {
        let mut sample = GpuSample {
            taken_at: Some(Instant::now()),
            devices: Vec::new(),
            health: Vec::new(),
            processes: Vec::new(),
            problems: Vec::new(),
        };
        if self.nvml.is_none() && self.last_init_attempt.elapsed() >= INIT_RETRY {
            self.try_init(false);
        }
        let Some(nvml) = self.nvml.take() else {
            return sample;
        };
        match nvml.device_count() {
            Ok(count) => {
                self.recovered("count");
                let pids = PidCache {
                    known,
                    asked: Default::default(),
                };
                for index in 0..count {
                    let health = match self.sample_device(&nvml, index, &mut sample, &pids) {
                        Ok(()) => {
                            self.recovered(&format!("device {index}"));
                            DeviceHealth::Ok
                        }
                        Err(reason) => {
                            self.problem(format!("device {index}"), &reason);
                            DeviceHealth::Degraded { reason }
                        }
                    };
                    sample.health.push((index, health));
                }
            }
            Err(e) => {
                self.count_error("nvmlDeviceGetCount_v2");
                let text = format!("nvmlDeviceGetCount_v2: {e}");
                self.problem("count".into(), &text);
                sample.problems.push(text);
            }
        }
        let present: std::collections::BTreeSet<&str> =
            sample.devices.iter().map(|d| d.uuid.as_str()).collect();
        self.utilization.retain(&present);
        self.nvml = Some(nvml);
        crate::trace::sample_done();
        sample
    }

    fn sample_device(
        &mut self,
        nvml: &Nvml,
        index: u32,
        sample: &mut GpuSample,
        pids: &PidCache,
    ) -> Result<(), String> {
        let dev = nvml
            .device_by_index(index)
            .map_err(|e| self.fail("nvmlDeviceGetHandleByIndex_v2", e))?;
        let uuid = dev.uuid().map_err(|e| self.fail("nvmlDeviceGetUUID", e))?;
        let name = dev.name().unwrap_or_else(|e| {
            self.count_error("nvmlDeviceGetName");
            format!("unknown ({e})")
        });
        let mem = dev
            .memory_info()
            .map_err(|e| self.fail("nvmlDeviceGetMemoryInfo_v2", e))?;
        let minor = self.optional("nvmlDeviceGetMinorNumber", dev.minor_number());
        let utilization =
            self.utilization
                .device(&dev, index, &uuid)
                .unwrap_or_else(|(call, e)| {
                    self.count_error(call);
                    log::debug!("GPU {index}: {call}: {e}");
                    None
                });
        let (temperature_c, power_mw, sm_clock_mhz) = if self.device_extras {
            (
                self.optional(
                    "nvmlDeviceGetTemperature",
                    dev.temperature(TemperatureSensor::Gpu),
                ),
                self.optional("nvmlDeviceGetPowerUsage", dev.power_usage()),
                self.optional("nvmlDeviceGetClockInfo", dev.clock_info(Clock::SM)),
            )
        } else {
            (None, None, None)
        };
        // Device data is recorded even when the process lists fail, so metrics still show it.
        sample.devices.push(DeviceSample {
            index,
            uuid: uuid.clone(),
            minor,
            name,
            memory_total: mem.total,
            memory_used: mem.used,
            memory_free: mem.free,
            memory_reserved: mem.reserved,
            utilization,
            process_utilization: ProcessUtilization::Unknown,
            temperature_c,
            power_mw,
            sm_clock_mhz,
            context_overhead: Default::default(),
        });
        let compute = self.process_list(&dev, "nvmlDeviceGetComputeRunningProcesses_v3", |d| {
            d.running_compute_processes()
        })?;
        let graphics =
            self.process_list(&dev, "nvmlDeviceGetGraphicsRunningProcesses_v3", |d| {
                d.running_graphics_processes()
            })?;
        let mut distrusted = Vec::new();
        let exists = |pid: u32| pids.exists(pid);
        let merged =
            merge_device_processes(&compute, &graphics, mem.total, &exists, &mut distrusted);
        for (pid, why) in distrusted {
            *self.distrusted.entry(why.as_str()).or_default() += 1;
            if why == Distrust::ImplausibleMemory || pid != 0 {
                log::debug!(
                    "distrusted NVML record on GPU {index}: pid {pid} ({})",
                    why.as_str()
                );
            }
        }
        // After the process lists: a process listed there and started since has no sample yet.
        let busy = self
            .utilization
            .processes(&dev, index, &uuid)
            .unwrap_or_else(|(call, e)| {
                self.count_error(call);
                log::debug!("GPU {index}: {call}: {e}");
                utilization::ProcessRead::unknown()
            });
        if let Some(d) = sample.devices.last_mut() {
            d.process_utilization = busy.state.clone();
        }
        let shared = match self.uuids.get(&index) {
            Some(last) if **last == *uuid => std::sync::Arc::clone(last),
            _ => {
                let fresh: std::sync::Arc<str> = uuid.as_str().into();
                self.uuids.insert(index, std::sync::Arc::clone(&fresh));
                fresh
            }
        };
        sample
            .processes
            .extend(merged.into_iter().map(|p| ProcessSample {
                pid: p.pid,
                device_index: index,
                device_uuid: std::sync::Arc::clone(&shared),
                used_bytes: p.used_bytes,
                utilization: busy.of(p.pid),
            }));
        Ok(())
    }

    /// A value NVML may not have for this GPU: `None` when not supported (silently) or failed
    /// (counted).
    fn optional(&mut self, call: &'static str, r: Result<u32, NvmlError>) -> Option<u32> {
        match r {
            Ok(v) => Some(v),
            Err(NvmlError::NotSupported) => None,
            Err(_) => {
                self.count_error(call);
                None
            }
        }
    }

    fn process_list(
        &mut self,
        dev: &Device<'_>,
        call: &'static str,
        read: impl Fn(
            &Device<'_>,
        )
            -> Result<Vec<nvml_wrapper::struct_wrappers::device::ProcessInfo>, NvmlError>,
    ) -> Result<Vec<RawProcess>, String> {
        for attempt in 0..LIST_ATTEMPTS {
            match read(dev) {
                Ok(list) => {
                    return Ok(list
                        .into_iter()
                        .map(|p| RawProcess {
                            pid: p.pid,
                            used_bytes: match p.used_gpu_memory {
                                UsedGpuMemory::Used(b) => Some(b),
                                UsedGpuMemory::Unavailable => None,
                            },
                        })
                        .collect());
                }
                // The list grew between NVML's two calls: read it again.
                Err(NvmlError::InsufficientSize(_)) if attempt + 1 < LIST_ATTEMPTS => {
                    self.list_retries += 1
                }
                // Graphics lists are not supported on some compute-only products.
                Err(NvmlError::NotSupported) => return Ok(Vec::new()),
                Err(e) => return Err(self.fail(call, e)),
            }
        }
        Err(format!("{call}: the process list kept growing"))
    }

    fn fail(&mut self, call: &'static str, e: NvmlError) -> String {
        self.count_error(call);
        match e {
            NvmlError::GpuLost => format!("{call}: GPU is lost"),
            e => format!("{call}: {e}"),
        }
    }

    fn count_error(&mut self, call: &'static str) {
        *self.errors.entry(call).or_default() += 1;
    }

    /// Logs a problem once per change of its text.
    fn problem(&mut self, key: String, text: &str) {
        if self.last_problem.get(&key).map(String::as_str) != Some(text) {
            warn!("NVML {key}: {text}; not enforcing on it until it reads cleanly");
            self.last_problem.insert(key, text.to_string());
        }
    }

    fn recovered(&mut self, key: &str) {
        if self.last_problem.remove(key).is_some() {
            info!("NVML {key}: reads cleanly again");
        }
    }
}

/// `/proc/<pid>` existence, asked once per pid per sample (a process is often on several GPUs),
/// and not at all for a pid the caller knows.
struct PidCache<'a> {
    known: &'a dyn Fn(u32) -> bool,
    asked: std::cell::RefCell<std::collections::HashMap<u32, bool>>,
}

impl PidCache<'_> {
    fn exists(&self, pid: u32) -> bool {
        if pid != 0 && (self.known)(pid) {
            return true;
        }
        *self
            .asked
            .borrow_mut()
            .entry(pid)
            .or_insert_with(|| pid_exists(pid))
    }
}

/// Whether a task with this id exists (what `/proc/<pid>` existing means, threads and zombies
/// included): `getpgid(pid)`, one syscall that only looks the id up. A `/proc/<pid>` stat builds a
/// path and walks procfs; `kill(pid, 0)` also runs the signal permission checks (about 40% more
/// here). Asked for every process NVML lists, every sample.
pub(crate) fn pid_exists(pid: u32) -> bool {
    // 0 means the caller to getpgid(2), and a negative pid_t is no process.
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: getpgid(2) only reads.
    if unsafe { libc::getpgid(pid) } >= 0 {
        return true;
    }
    // EPERM: it exists, but a security module does not let the agent see its group.
    std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::pid_exists;

    #[test]
    fn pid_existence_matches_proc() {
        assert!(pid_exists(std::process::id()));
        assert!(pid_exists(1), "init exists");
        // A thread id has a /proc entry too, and kill(2) accepts it.
        let tid = unsafe { libc::gettid() } as u32;
        assert!(pid_exists(tid));
        assert!(
            !pid_exists(0),
            "0 is a process group to kill(2), never a process"
        );
        assert!(!pid_exists(u32::MAX), "a negative pid_t is a process group");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited, not reaped yet: a zombie still has its /proc entry, and still exists.
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(pid_exists(pid), "a zombie exists");
        child.wait().unwrap();
        assert!(!pid_exists(pid), "a reaped child is gone");
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}
