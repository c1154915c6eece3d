//! The scenario file: serde types, validation, loading, and change-detecting reload.
//!
//! The format is documented field by field in the README.md of `gpushare-fake-nvml` (NVML) and
//! `gpushare-fake-cuda` (the `cuda` section).

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cuda::CudaScenario;
use crate::statefile::FileKey;

/// Environment variable naming the scenario file.
pub const ENV_VAR: &str = "GPUSHARE_FAKE_NVML_STATE";
/// Most devices a scenario may list (handles point into a static table of this size).
pub const MAX_DEVICES: usize = 64;
/// Longest UUID in bytes (NVML_DEVICE_UUID_BUFFER_SIZE 80, minus the NUL).
pub const MAX_UUID_LEN: usize = 79;
/// Longest device name in bytes (NVML_DEVICE_NAME_BUFFER_SIZE 64, minus the NUL).
pub const MAX_NAME_LEN: usize = 63;
/// Largest `process_list_growth` (the extra records are materialized).
pub const MAX_PROCESS_LIST_GROWTH: u32 = 4096;
/// Longest driver/NVML version string (NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80, minus the NUL).
pub const MAX_VERSION_LEN: usize = 79;

/// The whole scenario file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Returned by nvmlSystemGetDriverVersion.
    #[serde(default = "default_driver_version")]
    pub driver_version: String,
    /// Returned by nvmlSystemGetNVMLVersion.
    #[serde(default = "default_nvml_version")]
    pub nvml_version: String,
    /// Returned by nvmlSystemGetCudaDriverVersion(_v2), e.g. 12040 for CUDA 12.4.
    #[serde(default = "default_cuda_driver_version")]
    pub cuda_driver_version: i32,
    /// false: init (and every later call) returns NVML_ERROR_DRIVER_NOT_LOADED.
    #[serde(default = "default_true")]
    pub driver_loaded: bool,
    /// The GPUs, in NVML index order.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Exported function name -> return code forced for every call of that function.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fail: BTreeMap<FunctionName, u32>,
    /// Directory of `<pid>.<device index>` files holding a decimal byte count each; every such
    /// file adds (or overrides) a compute process of that device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_memory_dir: Option<PathBuf>,
    /// false: nvmlDeviceSetMemoryLimits_v1 / nvmlDeviceGetMemoryLimits_v1 return
    /// NVML_ERROR_NOT_SUPPORTED (a device or kernel without driver-enforced limits).
    #[serde(default = "default_true")]
    pub memory_limits_supported: bool,
    /// The mock libcuda's knobs (checkpoint API failures and delays).
    #[serde(default, skip_serializing_if = "CudaScenario::is_default")]
    pub cuda: CudaScenario,
    /// Pids the mock libcuda has checkpointed (from `cuda-state.json` beside the scenario, not
    /// from the file itself): hidden from every process list and from the memory counters.
    #[serde(skip)]
    pub hidden_pids: BTreeSet<u32>,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            driver_version: default_driver_version(),
            nvml_version: default_nvml_version(),
            cuda_driver_version: default_cuda_driver_version(),
            driver_loaded: true,
            devices: Vec::new(),
            fail: BTreeMap::new(),
            process_memory_dir: None,
            memory_limits_supported: true,
            cuda: CudaScenario::default(),
            hidden_pids: BTreeSet::new(),
        }
    }
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// nvmlDeviceGetUUID, e.g. "GPU-8a5f...". Unique within the scenario.
    pub uuid: String,
    /// nvmlDeviceGetName.
    pub name: String,
    /// nvmlDeviceGetMinorNumber: the `N` of the device's `/dev/nvidia<N>`; absent, the device's
    /// index. NVML's index follows PCI order and the minor the driver's: they differ on some
    /// hosts. Unique within the scenario.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    /// Total framebuffer memory in bytes.
    pub memory_total: u64,
    /// Memory reserved by driver/firmware in bytes (nvmlMemory_v2_t.reserved).
    #[serde(default)]
    pub memory_reserved: u64,
    /// nvmlUtilization_t.gpu, percent.
    #[serde(default)]
    pub utilization_gpu: u32,
    /// nvmlUtilization_t.memory, percent.
    #[serde(default)]
    pub utilization_memory: u32,
    /// true: every call on this device returns NVML_ERROR_GPU_IS_LOST.
    #[serde(default)]
    pub lost: bool,
    /// nvmlDeviceGetComputeRunningProcesses*.
    #[serde(default)]
    pub compute_processes: Vec<Process>,
    /// nvmlDeviceGetGraphicsRunningProcesses*.
    #[serde(default)]
    pub graphics_processes: Vec<Process>,
    /// Simulated processes appearing between the two calls of the size-query protocol.
    #[serde(default)]
    pub process_list_growth: u32,
    /// Pids of compute processes an MPS server serves: nvmlDeviceGetMPSComputeRunningProcesses_v3
    /// lists the compute processes (as `compute_processes` lists them) whose pid is here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mps_clients: Vec<u32>,
    /// nvmlDeviceGetTemperature (NVML_TEMPERATURE_GPU), degrees C.
    #[serde(default = "default_temperature")]
    pub temperature: u32,
    /// nvmlDeviceGetPowerUsage, milliwatts.
    #[serde(default = "default_power_usage")]
    pub power_usage: u32,
    /// nvmlDeviceGetClockInfo(NVML_CLOCK_SM), MHz.
    #[serde(default = "default_sm_clock")]
    pub sm_clock: u32,
    /// false: nvmlDeviceGetUtilizationRates and nvmlDeviceGetProcessUtilization return
    /// NVML_ERROR_NOT_SUPPORTED (as on a MIG-enabled GPU or an old driver).
    #[serde(default = "default_true")]
    pub utilization_supported: bool,
    /// nvmlDeviceGetProcessUtilization's samples (only those newer than the caller's
    /// lastSeenTimeStamp are returned).
    #[serde(default)]
    pub process_utilization: Vec<ProcessUtilization>,
}

/// One per-process utilization sample (nvmlProcessUtilizationSample_t).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessUtilization {
    pub pid: u32,
    /// CPU timestamp, microseconds (NVML's are wall-clock microseconds since the epoch).
    pub timestamp: u64,
    /// SM (compute) utilization, percent.
    pub sm_util: u32,
    /// Frame buffer (memory controller) utilization, percent.
    #[serde(default)]
    pub mem_util: u32,
    /// Encoder utilization, percent.
    #[serde(default)]
    pub enc_util: u32,
    /// Decoder utilization, percent.
    #[serde(default)]
    pub dec_util: u32,
}

impl Device {
    /// nvmlDeviceGetMinorNumber of the device at `index`: its `minor`, else the index.
    pub fn minor_at(&self, index: usize) -> u32 {
        self.minor
            .unwrap_or_else(|| u32::try_from(index).unwrap_or(u32::MAX))
    }

    /// A device with the given identity and every other field at its default.
    pub fn new(uuid: impl Into<String>, name: impl Into<String>, memory_total: u64) -> Self {
        Self {
            uuid: uuid.into(),
            name: name.into(),
            minor: None,
            memory_total,
            memory_reserved: 0,
            utilization_gpu: 0,
            utilization_memory: 0,
            lost: false,
            compute_processes: Vec::new(),
            graphics_processes: Vec::new(),
            process_list_growth: 0,
            mps_clients: Vec::new(),
            temperature: default_temperature(),
            power_usage: default_power_usage(),
            sm_clock: default_sm_clock(),
            utilization_supported: true,
            process_utilization: Vec::new(),
        }
    }
}

/// One process record. `used_memory: null` is reported as NVML_VALUE_NOT_AVAILABLE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    pub pid: u32,
    /// Required; `null` means "not available" (u64::MAX on the wire).
    #[serde(deserialize_with = "required_nullable")]
    pub used_memory: Option<u64>,
}

impl Process {
    pub fn new(pid: u32, used_memory: Option<u64>) -> Self {
        Self { pid, used_memory }
    }
}

fn required_nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<u64>::deserialize(d)
}

fn default_driver_version() -> String {
    "550.54.15".to_owned()
}
fn default_nvml_version() -> String {
    "12.550.54.15".to_owned()
}
fn default_cuda_driver_version() -> i32 {
    12040
}
fn default_true() -> bool {
    true
}
fn default_temperature() -> u32 {
    35
}
fn default_power_usage() -> u32 {
    70_000
}
fn default_sm_clock() -> u32 {
    1980
}

/// A key of `fail`: the name of a function the mock exports (checked while parsing, so a typo
/// is reported with its line and column).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct FunctionName(String);

impl FunctionName {
    /// Fails for names the mock does not export (and for nvmlErrorString, which cannot fail).
    pub fn new(name: &str) -> Result<Self, String> {
        crate::failable("fail", name, crate::NVML_FUNCTIONS, &["nvmlErrorString"]).map(Self)
    }
}

failable_function_name!(FunctionName);

impl Scenario {
    /// Checks what serde cannot: limits, uniqueness, consistency. The message names the field.
    pub fn validate(&self) -> Result<(), String> {
        check_string("driver_version", &self.driver_version, MAX_VERSION_LEN)?;
        check_string("nvml_version", &self.nvml_version, MAX_VERSION_LEN)?;
        if self.devices.len() > MAX_DEVICES {
            return Err(format!(
                "devices: {} devices listed, at most {MAX_DEVICES} supported",
                self.devices.len()
            ));
        }
        let mut uuids = BTreeSet::new();
        let mut minors = BTreeSet::new();
        for (i, d) in self.devices.iter().enumerate() {
            if !minors.insert(d.minor_at(i)) {
                return Err(format!(
                    "devices[{i}].minor: minor {} is another device's (a device without `minor` has its index)",
                    d.minor_at(i)
                ));
            }
            check_string(&format!("devices[{i}].uuid"), &d.uuid, MAX_UUID_LEN)?;
            if d.uuid.is_empty() {
                return Err(format!("devices[{i}].uuid: must not be empty"));
            }
            if !uuids.insert(d.uuid.as_str()) {
                return Err(format!("devices[{i}].uuid: duplicate uuid {:?}", d.uuid));
            }
            check_string(&format!("devices[{i}].name"), &d.name, MAX_NAME_LEN)?;
            if d.memory_reserved > d.memory_total {
                return Err(format!(
                    "devices[{i}].memory_reserved: {} exceeds memory_total {}",
                    d.memory_reserved, d.memory_total
                ));
            }
            if d.process_list_growth > MAX_PROCESS_LIST_GROWTH {
                return Err(format!(
                    "devices[{i}].process_list_growth: {} exceeds {MAX_PROCESS_LIST_GROWTH}",
                    d.process_list_growth
                ));
            }
            for (field, v) in [
                ("utilization_gpu", d.utilization_gpu),
                ("utilization_memory", d.utilization_memory),
            ] {
                if v > 100 {
                    return Err(format!("devices[{i}].{field}: {v} is not a percentage"));
                }
            }
            for (k, u) in d.process_utilization.iter().enumerate() {
                for (field, v) in [
                    ("sm_util", u.sm_util),
                    ("mem_util", u.mem_util),
                    ("enc_util", u.enc_util),
                    ("dec_util", u.dec_util),
                ] {
                    if v > 100 {
                        return Err(format!(
                            "devices[{i}].process_utilization[{k}].{field}: {v} is not a percentage"
                        ));
                    }
                }
            }
            for (field, list) in [
                ("compute_processes", &d.compute_processes),
                ("graphics_processes", &d.graphics_processes),
            ] {
                let mut pids = BTreeSet::new();
                for (k, p) in list.iter().enumerate() {
                    if !pids.insert(p.pid) {
                        return Err(format!(
                            "devices[{i}].{field}[{k}].pid: duplicate pid {}",
                            p.pid
                        ));
                    }
                    if p.used_memory == Some(u64::MAX) {
                        return Err(format!(
                            "devices[{i}].{field}[{k}].used_memory: use null for \"not available\""
                        ));
                    }
                }
            }
        }
        self.cuda.validate()
    }

    /// Compute processes of device `index`: the scenario's list, with `process_memory_dir`
    /// entries overriding same-pid records in place and new pids appended in pid order.
    pub fn compute_processes(&self, index: usize) -> Vec<Process> {
        let Some(device) = self.devices.get(index) else {
            return Vec::new();
        };
        let mut list = device.compute_processes.clone();
        if let Some(dir) = &self.process_memory_dir {
            for entry in read_process_memory_dir(dir) {
                if entry.device_index as usize != index {
                    continue;
                }
                let record = Process::new(entry.pid, Some(entry.used_memory));
                match list.iter_mut().find(|p| p.pid == entry.pid) {
                    Some(p) => *p = record,
                    None => list.push(record),
                }
            }
        }
        list.retain(|p| !self.hidden_pids.contains(&p.pid));
        list
    }

    /// Of the `checkpointed` pids, those NVML no longer lists: all but the ones whose memory
    /// stays on the GPU after a checkpoint (`cuda.processes.<pid>.memory_stays`).
    pub fn hidden_when_checkpointed(&self, mut checkpointed: BTreeSet<u32>) -> BTreeSet<u32> {
        checkpointed.retain(|p| !self.cuda.processes.get(p).is_some_and(|c| c.memory_stays));
        checkpointed
    }

    /// Compute processes of device `index` an MPS server serves (its `mps_clients`).
    pub fn mps_processes(&self, index: usize) -> Vec<Process> {
        let Some(device) = self.devices.get(index) else {
            return Vec::new();
        };
        let mut list = self.compute_processes(index);
        list.retain(|p| device.mps_clients.contains(&p.pid));
        list
    }

    /// Graphics processes of device `index` (without the hidden pids).
    pub fn graphics_processes(&self, index: usize) -> Vec<Process> {
        let mut list = self
            .devices
            .get(index)
            .map(|d| d.graphics_processes.clone())
            .unwrap_or_default();
        list.retain(|p| !self.hidden_pids.contains(&p.pid));
        list
    }

    /// Every pid this scenario lists as a GPU process (compute, graphics, `process_memory_dir`),
    /// on any device, hidden ones included: the processes the mock libcuda knows.
    pub fn gpu_pids(&self) -> BTreeSet<u32> {
        self.unhidden_processes()
            .flat_map(|(_, list)| list)
            .map(|p| p.pid)
            .collect()
    }

    /// What `pid` uses on each device (index, bytes; unknown memory counts 0; a pid in both
    /// lists counts once, with the larger value), hidden or not.
    pub fn process_memory(&self, pid: u32) -> Vec<(usize, u64)> {
        self.unhidden_processes()
            .filter_map(|(i, list)| {
                list.into_iter()
                    .filter(|p| p.pid == pid)
                    .map(|p| p.used_memory.unwrap_or(0))
                    .max()
                    .map(|used| (i, used))
            })
            .collect()
    }

    /// Each device's index and its processes, compute then graphics, hidden ones included.
    fn unhidden_processes(&self) -> impl Iterator<Item = (usize, Vec<Process>)> {
        let all = Scenario {
            hidden_pids: BTreeSet::new(),
            ..self.clone()
        };
        (0..self.devices.len()).map(move |i| {
            let mut list = all.compute_processes(i);
            list.extend(all.graphics_processes(i));
            (i, list)
        })
    }

    /// Memory counters of device `index` (zeroes for an unknown index).
    pub fn memory(&self, index: usize) -> MemoryCounts {
        let Some(device) = self.devices.get(index) else {
            return MemoryCounts::default();
        };
        let shown = |p: &&Process| !self.hidden_pids.contains(&p.pid);
        let used = |acc: u64, p: &Process| acc.saturating_add(p.used_memory.unwrap_or(0));
        // A pid in both lists is counted once, with the larger of its two values (a list has
        // each pid once: `validate`, and `process_memory_dir` overrides in place). Called at
        // every sample of every device: no copy of the list and no map where there are no
        // graphics processes.
        let sum = if !device.graphics_processes.iter().any(|p| shown(&p)) {
            match self.process_memory_dir {
                None => device.compute_processes.iter().filter(shown).fold(0, used),
                Some(_) => self.compute_processes(index).iter().fold(0, used),
            }
        } else {
            let mut by_pid: BTreeMap<u32, u64> = BTreeMap::new();
            let compute = self.compute_processes(index);
            for p in compute.iter().chain(self.graphics_processes(index).iter()) {
                if let Some(used) = p.used_memory {
                    let slot = by_pid.entry(p.pid).or_insert(0);
                    *slot = (*slot).max(used);
                }
            }
            by_pid.values().fold(0u64, |acc, v| acc.saturating_add(*v))
        };
        let available = device.memory_total - device.memory_reserved.min(device.memory_total);
        let used_by_processes = sum.min(available);
        MemoryCounts {
            total: device.memory_total,
            reserved: device.memory_total - available,
            used_by_processes,
            free: available - used_by_processes,
        }
    }
}

/// Memory counters of one device; `total = reserved + used_by_processes + free`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryCounts {
    pub total: u64,
    pub reserved: u64,
    pub used_by_processes: u64,
    pub free: u64,
}

impl MemoryCounts {
    /// nvmlMemory_t.used (v1): reserved memory counts as used.
    pub fn used_v1(&self) -> u64 {
        self.reserved + self.used_by_processes
    }
}

fn check_string(field: &str, s: &str, max: usize) -> Result<(), String> {
    if s.len() > max {
        return Err(format!(
            "{field}: {} bytes long, at most {max} allowed",
            s.len()
        ));
    }
    if s.contains('\0') {
        return Err(format!("{field}: must not contain NUL"));
    }
    Ok(())
}

/// One `<pid>.<device index>` file of `process_memory_dir`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirProcess {
    pub pid: u32,
    pub device_index: u32,
    pub used_memory: u64,
}

/// Reads `<dir>/<pid>.<device index>` files holding a decimal byte count (surrounding
/// whitespace allowed). Other names, unreadable files and bad contents are skipped (a writer
/// may be half-way; write a temporary name and rename). A missing directory means no entries.
/// Sorted by (device index, pid).
pub fn read_process_memory_dir(dir: &Path) -> Vec<DirProcess> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((pid, index)) = name.split_once('.') else {
            continue;
        };
        let (Ok(pid), Ok(device_index)) = (pid.parse::<u32>(), index.parse::<u32>()) else {
            continue;
        };
        let Ok(text) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let Ok(used_memory) = text.trim().parse::<u64>() else {
            continue;
        };
        out.push(DirProcess {
            pid,
            device_index,
            used_memory,
        });
    }
    out.sort_by_key(|e| (e.device_index, e.pid));
    out
}

/// Why a scenario could not be loaded.
#[derive(Debug)]
pub enum ScenarioError {
    Io {
        path: PathBuf,
        error: io::Error,
    },
    Parse {
        path: PathBuf,
        error: serde_json::Error,
    },
    Invalid {
        path: PathBuf,
        message: String,
    },
}

impl ScenarioError {
    /// (line, column) of a syntax or type error, 1-based.
    pub fn line_column(&self) -> Option<(usize, usize)> {
        match self {
            ScenarioError::Parse { error, .. } => Some((error.line(), error.column())),
            _ => None,
        }
    }
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScenarioError::Io { path, error } => {
                write!(f, "scenario {}: cannot read: {error}", path.display())
            }
            // serde_json's message ends with "at line L column C".
            ScenarioError::Parse { path, error } => {
                write!(f, "scenario {}: {error}", path.display())
            }
            ScenarioError::Invalid { path, message } => {
                write!(f, "scenario {}: {message}", path.display())
            }
        }
    }
}

impl std::error::Error for ScenarioError {}

/// Parses and validates scenario text; `path` is only used in messages.
pub fn parse(text: &str, path: &Path) -> Result<Scenario, ScenarioError> {
    let scenario: Scenario = serde_json::from_str(text).map_err(|error| ScenarioError::Parse {
        path: path.to_owned(),
        error,
    })?;
    scenario
        .validate()
        .map_err(|message| ScenarioError::Invalid {
            path: path.to_owned(),
            message,
        })?;
    Ok(scenario)
}

/// Reads, parses and validates the scenario file at `path`.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    let text = fs::read_to_string(path).map_err(|error| ScenarioError::Io {
        path: path.to_owned(),
        error,
    })?;
    parse(&text, path)
}

/// What [`WatchedScenario::refresh`] found.
#[derive(Debug)]
pub enum Refresh {
    /// The file looks as it did at the last look (or its new content parses to the same scenario).
    Unchanged,
    /// A different, valid scenario is now current.
    Reloaded,
    /// The file changed and is missing or invalid; the last good scenario stays current.
    /// Reported once per change of the file.
    Failed(ScenarioError),
}

/// The scenario file, re-read whenever its (dev, inode, size, mtime, ctime) changes.
#[derive(Debug)]
pub struct WatchedScenario {
    path: PathBuf,
    /// Key of the version last examined; `Some(None)`: the file was missing.
    seen: Option<Option<FileKey>>,
    current: Option<Arc<Scenario>>,
    /// The message for the version last examined, when it was bad.
    last_error: Option<String>,
}

impl WatchedScenario {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            seen: None,
            current: None,
            last_error: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last good scenario, if any was ever loaded.
    pub fn current(&self) -> Option<&Arc<Scenario>> {
        self.current.as_ref()
    }

    /// Whether the file, as last examined, was bad (the message) or good (None).
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Cheap check (one stat); re-reads the file only when it changed.
    pub fn refresh(&mut self) -> Refresh {
        let key = fs::metadata(&self.path).ok().map(|m| FileKey::of(&m));
        if self.seen == Some(key) {
            return Refresh::Unchanged;
        }
        self.reload()
    }

    /// Re-reads the file unconditionally.
    pub fn reload(&mut self) -> Refresh {
        // Key and content come from the same open file, so a concurrent rename cannot pair
        // one version's key with another version's content.
        let (key, result) = match fs::File::open(&self.path) {
            Err(error) => (
                None,
                Err(ScenarioError::Io {
                    path: self.path.clone(),
                    error,
                }),
            ),
            Ok(mut file) => {
                let key = file.metadata().ok().map(|m| FileKey::of(&m));
                let mut text = String::new();
                let result = match file.read_to_string(&mut text) {
                    Ok(_) => parse(&text, &self.path),
                    Err(error) => Err(ScenarioError::Io {
                        path: self.path.clone(),
                        error,
                    }),
                };
                (key, result)
            }
        };
        self.seen = Some(key);
        match result {
            Ok(scenario) => {
                self.last_error = None;
                if self.current.as_deref() == Some(&scenario) {
                    Refresh::Unchanged
                } else {
                    self.current = Some(Arc::new(scenario));
                    Refresh::Reloaded
                }
            }
            Err(e) => {
                self.last_error = Some(e.to_string());
                Refresh::Failed(e)
            }
        }
    }
}
