//! Device enumeration and per-device getters.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{NvmlDevice, call, device_call, fixed_str, put, put_str};
use crate::abi::{self, Memory, MemoryV2, PciInfo, Utilization};
use crate::codes;
use crate::handles;
use crate::state::Session;
use std::ffi::{CStr, c_char, c_uint};

fn count(s: &Session<'_>) -> c_uint {
    // Validation caps the list at MAX_DEVICES.
    c_uint::try_from(s.scenario.devices.len()).unwrap_or(c_uint::MAX)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(device_count: *mut c_uint) -> c_uint {
    call("nvmlDeviceGetCount", |s| unsafe {
        put(device_count, count(s))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> c_uint {
    call("nvmlDeviceGetCount_v2", |s| unsafe {
        put(device_count, count(s))
    })
}

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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut NvmlDevice,
) -> c_uint {
    call("nvmlDeviceGetHandleByIndex", |s| unsafe {
        handle_by_index(s, index, device)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> c_uint {
    call("nvmlDeviceGetHandleByIndex_v2", |s| unsafe {
        handle_by_index(s, index, device)
    })
}

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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> c_uint {
    device_call("nvmlDeviceGetIndex", device, |_, i| unsafe {
        put(index, i as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: NvmlDevice,
    uuid: *mut c_char,
    length: c_uint,
) -> c_uint {
    device_call("nvmlDeviceGetUUID", device, |s, i| unsafe {
        put_str(&s.scenario.devices[i].uuid, uuid, length)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: NvmlDevice,
    name: *mut c_char,
    length: c_uint,
) -> c_uint {
    device_call("nvmlDeviceGetName", device, |s, i| unsafe {
        put_str(&s.scenario.devices[i].name, name, length)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut Memory,
) -> c_uint {
    device_call("nvmlDeviceGetMemoryInfo", device, |s, i| {
        if memory.is_null() {
            return Err(codes::ERROR_INVALID_ARGUMENT);
        }
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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: NvmlDevice, power: *mut c_uint) -> c_uint {
    device_call("nvmlDeviceGetPowerUsage", device, |s, i| unsafe {
        put(power, s.scenario.devices[i].power_usage)
    })
}

/// Passively cooled (like SXM parts): NOT_SUPPORTED.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(device: NvmlDevice, _speed: *mut c_uint) -> c_uint {
    device_call("nvmlDeviceGetFanSpeed", device, |_, _| {
        Err(codes::ERROR_NOT_SUPPORTED)
    })
}

/// The index (/dev/nvidia<index>).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: NvmlDevice,
    minor: *mut c_uint,
) -> c_uint {
    device_call("nvmlDeviceGetMinorNumber", device, |_, i| unsafe {
        put(minor, i as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: NvmlDevice,
    mode: *mut c_uint,
) -> c_uint {
    device_call("nvmlDeviceGetPersistenceMode", device, |_, _| unsafe {
        put(mode, abi::FEATURE_ENABLED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(device: NvmlDevice, mode: *mut c_uint) -> c_uint {
    device_call("nvmlDeviceGetComputeMode", device, |_, _| unsafe {
        put(mode, abi::COMPUTEMODE_DEFAULT)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(device: NvmlDevice, brand: *mut c_uint) -> c_uint {
    device_call("nvmlDeviceGetBrand", device, |_, _| unsafe {
        put(brand, abi::BRAND_NVIDIA)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: NvmlDevice,
    arch: *mut c_uint,
) -> c_uint {
    device_call("nvmlDeviceGetArchitecture", device, |_, _| unsafe {
        put(arch, abi::DEVICE_ARCH_HOPPER)
    })
}

/// No per-process samples are simulated: NOT_SUPPORTED (nvitop queries this while listing
/// processes and tolerates the error, but logs a missing symbol loudly).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: NvmlDevice,
    _utilization: *mut std::ffi::c_void,
    _process_samples_count: *mut c_uint,
    _last_seen_time_stamp: u64,
) -> c_uint {
    device_call("nvmlDeviceGetProcessUtilization", device, |_, _| {
        Err(codes::ERROR_NOT_SUPPORTED)
    })
}
