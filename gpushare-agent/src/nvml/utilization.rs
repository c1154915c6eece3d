//! Utilization through NVML: per GPU (`nvmlDeviceGetUtilizationRates`) and per process
//! (`nvmlDeviceGetProcessUtilization`, through nvml-wrapper's `process_utilization_stats`).
//!
//! Per-process samples are read incrementally: each read asks for the samples newer than the
//! newest one the previous read returned (NVML's `lastSeenTimeStamp`), so a sample is seen once.
//! Its window began at that previous sample; [`ProcessUtilization::Read`] carries the start as
//! CLOCK_BOOTTIME, so the agent charges a sample only to a process that held the pid since then
//! (see `Attribution::held_since`). The first read of a GPU has no previous one: its samples may
//! be of any age, so they charge nobody (a process without a sample is idle either way).
//!
//! NOT_SUPPORTED (MIG, older drivers, some products) is named once in the log and leaves the
//! values absent, never 0; NOT_FOUND (no sample since the last read) means nothing ran: idle.

use std::collections::{BTreeSet, HashMap};

use log::{info, warn};
use nvml_wrapper::{Device, error::NvmlError};

use crate::sample::{ProcessUtilization, Utilization};

/// What one read of a GPU's per-process utilization gave.
pub struct ProcessRead {
    /// Whether it was read, and the window's start.
    pub state: ProcessUtilization,
    /// The newest sample per pid in the window.
    pub by_pid: HashMap<u32, Utilization>,
}

impl ProcessRead {
    /// Nothing known.
    pub fn unknown() -> Self {
        Self {
            state: ProcessUtilization::Unknown,
            by_pid: HashMap::new(),
        }
    }

    /// A process's utilization in this read: its sample, or 0 (idle) when it had none; `None`
    /// where the GPU's per-process utilization is unknown.
    pub fn of(&self, pid: u32) -> Option<Utilization> {
        match self.state {
            ProcessUtilization::Unknown => None,
            ProcessUtilization::Read { .. } => {
                Some(self.by_pid.get(&pid).copied().unwrap_or_default())
            }
        }
    }
}

/// Reads utilization; remembers per GPU where the next per-process read starts, and which GPUs
/// were already named as unsupported.
pub struct UtilizationReader {
    /// Whether `nvmlDeviceGetProcessesUtilizationInfo` (the versioned call) is used; false once
    /// the library lacks it or refuses its struct version.
    versioned_works: bool,
    /// GPU UUID -> NVML timestamp (µs) of the newest per-process sample read so far.
    last_seen: HashMap<String, u64>,
    /// (GPU UUID, what) already logged as not supported.
    unsupported: BTreeSet<(String, &'static str)>,
}

impl Default for UtilizationReader {
    fn default() -> Self {
        Self {
            versioned_works: true,
            last_seen: HashMap::new(),
            unsupported: BTreeSet::new(),
        }
    }
}

/// One per-process sample, from either call.
struct RawSample {
    pid: u32,
    /// NVML's CPU timestamp, µs.
    timestamp: u64,
    sm: u32,
    memory: u32,
}

fn is_version_mismatch(e: &NvmlError) -> bool {
    // nvml-wrapper 0.13 has no variant of its own for NVML_ERROR_ARGUMENT_VERSION_MISMATCH.
    matches!(e, NvmlError::UnexpectedVariant(25))
}

/// `nvmlDeviceGetProcessUtilization`, through nvml-wrapper.
fn legacy(dev: &Device<'_>, since: Option<u64>) -> Result<Vec<RawSample>, NvmlError> {
    Ok(dev
        .process_utilization_stats(since)?
        .into_iter()
        .map(|s| RawSample {
            pid: s.pid,
            timestamp: s.timestamp,
            sm: s.sm_util,
            memory: s.mem_util,
        })
        .collect())
}

/// `nvmlDeviceGetProcessesUtilizationInfo` (the versioned struct, drivers from r550 on), which
/// nvml-wrapper 0.13 binds but does not wrap; `None` when the library lacks it.
fn versioned(dev: &Device<'_>, since: u64) -> Option<Result<Vec<RawSample>, NvmlError>> {
    use nvml_wrapper_sys::bindings::{
        nvmlProcessUtilizationInfo_v1_t as Record, nvmlProcessesUtilizationInfo_v1_t as Info,
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE as INSUFFICIENT_SIZE,
        nvmlReturn_enum_NVML_SUCCESS as SUCCESS,
    };
    let call = dev
        .nvml()
        .lib()
        .nvmlDeviceGetProcessesUtilizationInfo
        .as_ref()
        .ok()?;
    // SAFETY: the handle is valid while `dev`'s session lives, which outlasts this call.
    let handle = unsafe { dev.handle() };
    let mut info = Info {
        // nvmlProcessesUtilizationInfo_v1 = NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1).
        version: std::mem::size_of::<Info>() as u32 | (1 << 24),
        processSamplesCount: 0,
        lastSeenTimeStamp: since,
        procUtilArray: std::ptr::null_mut(),
    };
    // SAFETY: `info` is a valid nvmlProcessesUtilizationInfo_v1_t with no array: the size query.
    let rc = unsafe { call(handle, &mut info) };
    if rc == SUCCESS {
        return Some(Ok(Vec::new()));
    }
    if rc != INSUFFICIENT_SIZE {
        return Some(Err(NvmlError::from(rc)));
    }
    // Room for a few processes that appear between the two calls; read again if more did.
    for _ in 0..3 {
        let zero = Record {
            timeStamp: 0,
            pid: 0,
            smUtil: 0,
            memUtil: 0,
            encUtil: 0,
            decUtil: 0,
            jpgUtil: 0,
            ofaUtil: 0,
        };
        let mut records = vec![zero; info.processSamplesCount as usize + 8];
        info.processSamplesCount = records.len() as u32;
        info.procUtilArray = records.as_mut_ptr();
        // SAFETY: `procUtilArray` holds `processSamplesCount` records, and outlives the call.
        let rc = unsafe { call(handle, &mut info) };
        if rc == SUCCESS {
            records.truncate(info.processSamplesCount as usize);
            return Some(Ok(records
                .into_iter()
                .map(|r| RawSample {
                    pid: r.pid,
                    timestamp: r.timeStamp,
                    sm: r.smUtil,
                    memory: r.memUtil,
                })
                .collect()));
        }
        if rc != INSUFFICIENT_SIZE {
            return Some(Err(NvmlError::from(rc)));
        }
    }
    Some(Err(NvmlError::InsufficientSize(None)))
}

/// What failed, for the sampler's error counters.
pub type Failure = (&'static str, NvmlError);

impl UtilizationReader {
    /// The GPU's rates; `None` (named once) where not supported, `Err` on another failure.
    pub fn device(
        &mut self,
        dev: &Device<'_>,
        index: u32,
        uuid: &str,
    ) -> Result<Option<Utilization>, Failure> {
        match dev.utilization_rates() {
            Ok(u) => Ok(Some(Utilization {
                sm: u.gpu.min(100),
                memory: u.memory.min(100),
            })),
            Err(NvmlError::NotSupported) => {
                self.name_unsupported(index, uuid, "utilization");
                Ok(None)
            }
            Err(e) => Err(("nvmlDeviceGetUtilizationRates", e)),
        }
    }

    /// The samples newer than the previous read of this GPU.
    pub fn processes(
        &mut self,
        dev: &Device<'_>,
        index: u32,
        uuid: &str,
    ) -> Result<ProcessRead, Failure> {
        let previous = self.last_seen.get(uuid).copied();
        let (now_boot_ns, now_unix_us) = clocks();
        let read = match self.versioned_works {
            true => versioned(dev, previous.unwrap_or(0)),
            false => None,
        };
        let read = match read {
            // A driver with the symbol but another version of the struct: the older call from now on.
            None if !self.versioned_works => legacy(dev, previous),
            None | Some(Err(NvmlError::FunctionNotFound)) => {
                self.use_legacy("the library lacks it");
                legacy(dev, previous)
            }
            Some(Err(e)) if is_version_mismatch(&e) => {
                self.use_legacy("it refuses nvmlProcessesUtilizationInfo_v1");
                legacy(dev, previous)
            }
            Some(r) => r,
        };
        let samples = match read {
            Ok(samples) => samples,
            // No sample since the last read: nothing ran.
            Err(NvmlError::NotFound) => Vec::new(),
            Err(NvmlError::NotSupported) => {
                self.name_unsupported(index, uuid, "per-process utilization");
                return Ok(ProcessRead::unknown());
            }
            // More processes appeared between nvml-wrapper's two calls: unknown this step, read
            // from the same point next step.
            Err(NvmlError::InsufficientSize(_)) => return Ok(ProcessRead::unknown()),
            Err(e) => return Err(("nvmlDeviceGetProcessUtilization", e)),
        };
        let mut by_pid: HashMap<u32, (u64, Utilization)> = HashMap::new();
        let mut newest = previous.unwrap_or(0);
        for s in samples {
            // A driver returning what was not asked for: not this window's.
            if previous.is_some_and(|p| s.timestamp <= p) {
                continue;
            }
            newest = newest.max(s.timestamp);
            let u = Utilization {
                sm: s.sm.min(100),
                memory: s.memory.min(100),
            };
            let e = by_pid.entry(s.pid).or_insert((s.timestamp, u));
            if s.timestamp >= e.0 {
                *e = (s.timestamp, u);
            }
        }
        // Where the next read starts: the newest sample, or now when there was none at all yet.
        self.last_seen.insert(
            uuid.to_string(),
            newest.max(previous.unwrap_or(now_unix_us)),
        );
        let since_boot_ns = match previous {
            // The window began at the previous read's newest sample, on NVML's clock (wall-clock
            // µs), taken back to CLOCK_BOOTTIME.
            Some(p) => {
                let ago_ns = now_unix_us.saturating_sub(p).saturating_mul(1000);
                now_boot_ns.saturating_sub(ago_ns)
            }
            // The first read: samples of any age, which no identity can be shown to cover.
            None => 0,
        };
        Ok(ProcessRead {
            state: ProcessUtilization::Read { since_boot_ns },
            by_pid: by_pid.into_iter().map(|(pid, (_, u))| (pid, u)).collect(),
        })
    }

    /// Forgets GPUs that are gone (by UUID), so a GPU that comes back starts afresh.
    pub fn retain(&mut self, present: &BTreeSet<&str>) {
        self.last_seen.retain(|u, _| present.contains(u.as_str()));
    }

    fn use_legacy(&mut self, why: &str) {
        self.versioned_works = false;
        info!(
            "per-process utilization through nvmlDeviceGetProcessUtilization: \
             nvmlDeviceGetProcessesUtilizationInfo is not usable ({why})"
        );
    }

    fn name_unsupported(&mut self, index: u32, uuid: &str, what: &'static str) {
        if self.unsupported.insert((uuid.to_string(), what)) {
            info!(
                "GPU {index} ({uuid}) does not report {what} (NVML: not supported; MIG or driver): \
                 its {what} series are left out, never shown as 0"
            );
        }
    }
}

/// (CLOCK_BOOTTIME ns, wall-clock µs since the epoch), read back to back.
fn clocks() -> (u64, u64) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    let boot = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_else(|e| {
            warn!("the wall clock is before 1970 ({e}); utilization windows start now");
            0
        });
    (boot, unix)
}
