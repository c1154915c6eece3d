//! Device enumeration and per-device getters.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{NvmlDevice, call, device_call, fixed_str, put, put_str};
use crate::abi::{
    self, Memory, MemoryV2, PciInfo, ProcessUtilizationInfoV1, ProcessUtilizationSample,
    ProcessesUtilizationInfoV1, Utilization,
};
use crate::codes;
use crate::handles;
use crate::state::Session;
use std::ffi::{CStr, c_char, c_uint};

fn count(s: &Session<'_>) -> c_uint {
    // Validation caps the list at MAX_DEVICES.
    c_uint::try_from(s.scenario.devices.len()).unwrap_or(c_uint::MAX)
}

/// `nvmlDeviceGetCount` and its `_v2`, which NVML keeps as twins.
macro_rules! device_count {
    ($($name:ident),*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device_count: *mut c_uint) -> c_uint {
            call(stringify!($name), |s| unsafe { put(device_count, count(s)) })
        }
    )*};
}

device_count!(nvmlDeviceGetCount, nvmlDeviceGetCount_v2);

/// Index past the end -> INVALID_ARGUMENT; a lost device -> GPU_IS_LOST (as nvidia-smi's
/// "Unable to determine the device handle for GPU ...: GPU is lost").
unsafe fn handle_by_index(
    s: &Session<'_>,
    index: c_uint,
    device: *mut NvmlDevice,
) -> Result<(), u32> {
    let index = index as usize;
    s.device_at(index)?;
    unsafe { put(device, handles::handle_for(index)) }
}

/// `nvmlDeviceGetHandleByIndex` and its `_v2`, which NVML keeps as twins.
macro_rules! handle_by_index {
    ($($name:ident),*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(index: c_uint, device: *mut NvmlDevice) -> c_uint {
            call(stringify!($name), |s| unsafe { handle_by_index(s, index, device) })
        }
    )*};
}

handle_by_index!(nvmlDeviceGetHandleByIndex, nvmlDeviceGetHandleByIndex_v2);

/// Unknown UUID -> NOT_FOUND.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut NvmlDevice,
) -> c_uint {
    call("nvmlDeviceGetHandleByUUID", |s| {
        if uuid.is_null() || device.is_null() {
            return Err(codes::ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null and NUL-terminated per nvml.h.
        let wanted = unsafe { CStr::from_ptr(uuid) }.to_bytes();
        let index = s
            .scenario
            .devices
            .iter()
            .position(|d| d.uuid.as_bytes() == wanted)
            .ok_or(codes::ERROR_NOT_FOUND)?;
        s.device_at(index)?;
        unsafe { put(device, handles::handle_for(index)) }
    })
}

/// Per-device getters that write one value (from the session `s` and the device's index `i`)
/// through one out-pointer.
macro_rules! device_values {
    ($($(#[$doc:meta])* $name:ident($out:ident: $ty:ty) = |$s:pat_param, $i:pat_param| $value:expr;)*) => {$(
        $(#[$doc])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: NvmlDevice, $out: *mut $ty) -> c_uint {
            device_call(stringify!($name), device, |$s, $i| unsafe { put($out, $value) })
        }
    )*};
}

/// Per-device getters that copy one of the device's strings into the caller's buffer of `length`
/// bytes.
macro_rules! device_strings {
    ($($name:ident($out:ident) = $field:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            device: NvmlDevice,
            $out: *mut c_char,
            length: c_uint,
        ) -> c_uint {
            device_call(stringify!($name), device, |s, i| unsafe {
                put_str(&s.scenario.devices[i].$field, $out, length)
            })
        }
    )*};
}

device_values! {
    nvmlDeviceGetIndex(index: c_uint) = |_, i| i as c_uint;
    nvmlDeviceGetPowerUsage(power: c_uint) = |s, i| s.scenario.devices[i].power_usage;
    /// The scenario's `minor` (/dev/nvidia<minor>), else the index.
    nvmlDeviceGetMinorNumber(minor: c_uint) = |s, i| s.scenario.devices[i].minor_at(i);
    nvmlDeviceGetPersistenceMode(mode: c_uint) = |_, _| abi::FEATURE_ENABLED;
    nvmlDeviceGetComputeMode(mode: c_uint) = |_, _| abi::COMPUTEMODE_DEFAULT;
    nvmlDeviceGetBrand(brand: c_uint) = |_, _| abi::BRAND_NVIDIA;
    nvmlDeviceGetArchitecture(arch: c_uint) = |_, _| abi::DEVICE_ARCH_HOPPER;
}

device_strings! {
    nvmlDeviceGetUUID(uuid) = uuid;
    nvmlDeviceGetName(name) = name;
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut Memory,
) -> c_uint {
    device_call("nvmlDeviceGetMemoryInfo", device, |s, i| {
        let m = s.scenario.memory(i);
        let value = Memory {
            total: m.total,
            free: m.free,
            used: m.used_v1(),
        };
        unsafe { put(memory, value) }
    })
}

/// `memory->version` must be nvmlMemory_v2 (0x02000028), else ARGUMENT_VERSION_MISMATCH.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut MemoryV2,
) -> c_uint {
    device_call("nvmlDeviceGetMemoryInfo_v2", device, |s, i| {
        if memory.is_null() {
            return Err(codes::ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller provides an nvmlMemory_v2_t.
        let version = unsafe { std::ptr::addr_of!((*memory).version).read_unaligned() };
        if version != abi::MEMORY_V2_VERSION {
            return Err(codes::ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let m = s.scenario.memory(i);
        let value = MemoryV2 {
            version,
            total: m.total,
            reserved: m.reserved,
            free: m.free,
            used: m.used_by_processes,
        };
        unsafe { put(memory, value) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: NvmlDevice,
    utilization: *mut Utilization,
) -> c_uint {
    device_call("nvmlDeviceGetUtilizationRates", device, |s, i| {
        let d = &s.scenario.devices[i];
        if !d.utilization_supported {
            return Err(codes::ERROR_NOT_SUPPORTED);
        }
        let value = Utilization {
            gpu: d.utilization_gpu,
            memory: d.utilization_memory,
        };
        unsafe { put(utilization, value) }
    })
}

/// Domain 0, bus 0x10 + index, device 0: "00000000:10:00.0" for device 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: NvmlDevice, pci: *mut PciInfo) -> c_uint {
    device_call("nvmlDeviceGetPciInfo_v3", device, |_, i| {
        let bus = 0x10 + i as u32;
        let value = PciInfo {
            bus_id_legacy: fixed_str(&format!("0000:{bus:02X}:00.0")),
            domain: 0,
            bus,
            device: 0,
            pci_device_id: abi::PCI_DEVICE_ID,
            pci_sub_system_id: abi::PCI_SUBSYSTEM_ID,
            bus_id: fixed_str(&format!("00000000:{bus:02X}:00.0")),
        };
        unsafe { put(pci, value) }
    })
}

/// Only NVML_TEMPERATURE_GPU exists; other sensors -> INVALID_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: NvmlDevice,
    sensor: c_uint,
    temp: *mut c_uint,
) -> c_uint {
    device_call("nvmlDeviceGetTemperature", device, |s, i| {
        if sensor != abi::TEMPERATURE_GPU {
            return Err(codes::ERROR_INVALID_ARGUMENT);
        }
        unsafe { put(temp, s.scenario.devices[i].temperature) }
    })
}

/// Passively cooled (like SXM parts): NOT_SUPPORTED.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(device: NvmlDevice, _speed: *mut c_uint) -> c_uint {
    device_call("nvmlDeviceGetFanSpeed", device, |_, _| {
        Err(codes::ERROR_NOT_SUPPORTED)
    })
}

/// The scenario's `process_utilization` samples of device `i` newer than `last_seen`; NOT_SUPPORTED
/// with `utilization_supported: false`, NOT_FOUND when there is none.
fn samples_since(
    s: &Session<'_>,
    i: usize,
    last_seen: u64,
) -> Result<Vec<gpushare_fake_driver::scenario::ProcessUtilization>, u32> {
    let d = &s.scenario.devices[i];
    if !d.utilization_supported {
        return Err(codes::ERROR_NOT_SUPPORTED);
    }
    let newer: Vec<_> = d
        .process_utilization
        .iter()
        .filter(|u| u.timestamp > last_seen)
        .copied()
        .collect();
    if newer.is_empty() {
        return Err(codes::ERROR_NOT_FOUND);
    }
    Ok(newer)
}

/// The scenario's `process_utilization` samples newer than `last_seen_time_stamp`, as nvml.h
/// describes: `utilization` NULL is the size query (`*count` = the number of samples,
/// INSUFFICIENT_SIZE, as the driver answers it); no sample newer -> NOT_FOUND; a buffer of
/// `*count` entries too small -> INSUFFICIENT_SIZE with `*count` = the number needed;
/// `utilization_supported: false` -> NOT_SUPPORTED.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: NvmlDevice,
    utilization: *mut ProcessUtilizationSample,
    process_samples_count: *mut c_uint,
    last_seen_time_stamp: u64,
) -> c_uint {
    device_call("nvmlDeviceGetProcessUtilization", device, |s, i| {
        if process_samples_count.is_null() {
            return Err(codes::ERROR_INVALID_ARGUMENT);
        }
        let newer = samples_since(s, i, last_seen_time_stamp)?;
        let n = c_uint::try_from(newer.len()).unwrap_or(c_uint::MAX);
        // SAFETY: non-null; the caller's count.
        let capacity = unsafe { process_samples_count.read_unaligned() };
        if utilization.is_null() || capacity < n {
            unsafe { put(process_samples_count, n)? };
            return Err(codes::ERROR_INSUFFICIENT_SIZE);
        }
        for (k, u) in newer.into_iter().enumerate() {
            let sample = ProcessUtilizationSample {
                pid: u.pid,
                time_stamp: u.timestamp,
                sm_util: u.sm_util,
                mem_util: u.mem_util,
                enc_util: u.enc_util,
                dec_util: u.dec_util,
            };
            // SAFETY: the caller's buffer holds `capacity >= n` samples.
            unsafe { utilization.add(k).write_unaligned(sample) };
        }
        unsafe { put(process_samples_count, n) }
    })
}

/// The same samples through the versioned struct (`nvmlProcessesUtilizationInfo_t`):
/// `version` must be nvmlProcessesUtilizationInfo_v1 (0x01000018), else ARGUMENT_VERSION_MISMATCH;
/// `procUtilArray` NULL or `processSamplesCount` smaller than the number of samples ->
/// INSUFFICIENT_SIZE with `processSamplesCount` = that number; jpgUtil and ofaUtil are 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(
    device: NvmlDevice,
    info: *mut ProcessesUtilizationInfoV1,
) -> c_uint {
    device_call("nvmlDeviceGetProcessesUtilizationInfo", device, |s, i| {
        if info.is_null() {
            return Err(codes::ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller provides an nvmlProcessesUtilizationInfo_t.
        let mut value = unsafe { info.read_unaligned() };
        if value.version != abi::PROCESSES_UTILIZATION_INFO_V1_VERSION {
            return Err(codes::ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let newer = samples_since(s, i, value.last_seen_time_stamp)?;
        let n = c_uint::try_from(newer.len()).unwrap_or(c_uint::MAX);
        let capacity = value.process_samples_count;
        value.process_samples_count = n;
        if value.proc_util_array.is_null() || capacity < n {
            unsafe { put(info, value)? };
            return Err(codes::ERROR_INSUFFICIENT_SIZE);
        }
        for (k, u) in newer.into_iter().enumerate() {
            let record = ProcessUtilizationInfoV1 {
                time_stamp: u.timestamp,
                pid: u.pid,
                sm_util: u.sm_util,
                mem_util: u.mem_util,
                enc_util: u.enc_util,
                dec_util: u.dec_util,
                jpg_util: 0,
                ofa_util: 0,
            };
            // SAFETY: the caller's array holds `capacity >= n` records.
            unsafe { value.proc_util_array.add(k).write_unaligned(record) };
        }
        unsafe { put(info, value) }
    })
}

/// NVML_CLOCK_SM and NVML_CLOCK_GRAPHICS (one domain on current GPUs): `sm_clock`; the memory and
/// video clocks are not simulated (NOT_SUPPORTED, "cannot report the specified clock"); an
/// unknown clock type -> INVALID_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: NvmlDevice,
    clock_type: c_uint,
    clock: *mut c_uint,
) -> c_uint {
    device_call("nvmlDeviceGetClockInfo", device, |s, i| match clock_type {
        abi::CLOCK_GRAPHICS | abi::CLOCK_SM => unsafe {
            put(clock, s.scenario.devices[i].sm_clock)
        },
        t if t <= abi::CLOCK_VIDEO => Err(codes::ERROR_NOT_SUPPORTED),
        _ => Err(codes::ERROR_INVALID_ARGUMENT),
    })
}
