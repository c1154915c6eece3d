//! `#[repr(C)]` mirrors of the nvml.h structs the mock fills. Layouts are pinned here by
//! compile-time assertions and cross-checked against NVIDIA's header by `abi/nvml_abi_check.c`.

use std::ffi::c_char;
use std::mem::{offset_of, size_of};

/// nvmlMemory_t (v1): `used` includes reserved memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// nvmlMemory_v2_t.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// nvmlMemory_v2: NVML_STRUCT_VERSION(Memory, 2) = sizeof(nvmlMemory_v2_t) | 2 << 24.
pub const MEMORY_V2_VERSION: u32 = size_of::<MemoryV2>() as u32 | (2 << 24);

/// nvmlProcessInfo_v1_t: the record of the unversioned process-list functions.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessInfoV1 {
    pub pid: u32,
    pub used_gpu_memory: u64,
}

/// nvmlProcessInfo_v2_t (= nvmlProcessInfo_t): the record of the `_v2` and `_v3` functions.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessInfoV2 {
    pub pid: u32,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// gpuInstanceId / computeInstanceId outside MIG.
pub const NO_MIG_INSTANCE: u32 = 0xFFFF_FFFF;

/// nvmlUtilization_t.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

/// nvmlProcessUtilizationSample_t: 32 bytes (4 bytes of padding after `pid`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessUtilizationSample {
    pub pid: u32,
    pub time_stamp: u64,
    pub sm_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
}

/// nvmlProcessUtilizationInfo_v1_t: one record of nvmlDeviceGetProcessesUtilizationInfo, 40 bytes
/// (36 and 4 of tail padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessUtilizationInfoV1 {
    pub time_stamp: u64,
    pub pid: u32,
    pub sm_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
    pub jpg_util: u32,
    pub ofa_util: u32,
}

/// nvmlProcessesUtilizationInfo_v1_t (= nvmlProcessesUtilizationInfo_t), 24 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessesUtilizationInfoV1 {
    pub version: u32,
    pub process_samples_count: u32,
    pub last_seen_time_stamp: u64,
    pub proc_util_array: *mut ProcessUtilizationInfoV1,
}

/// nvmlProcessesUtilizationInfo_v1: NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1).
pub const PROCESSES_UTILIZATION_INFO_V1_VERSION: u32 =
    size_of::<ProcessesUtilizationInfoV1>() as u32 | (1 << 24);

/// nvmlClockType_t: NVML_CLOCK_GRAPHICS.
pub const CLOCK_GRAPHICS: u32 = 0;
/// nvmlClockType_t: NVML_CLOCK_SM.
pub const CLOCK_SM: u32 = 1;
/// nvmlClockType_t: NVML_CLOCK_VIDEO, the last clock type.
pub const CLOCK_VIDEO: u32 = 3;

/// nvmlPciInfo_t (the struct of nvmlDeviceGetPciInfo_v3).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    pub bus_id: [c_char; 32],
}

/// NVML_TEMPERATURE_GPU.
pub const TEMPERATURE_GPU: u32 = 0;
/// NVML_FEATURE_ENABLED (nvmlEnableState_t).
pub const FEATURE_ENABLED: u32 = 1;
/// NVML_COMPUTEMODE_DEFAULT.
pub const COMPUTEMODE_DEFAULT: u32 = 0;
/// NVML_BRAND_NVIDIA.
pub const BRAND_NVIDIA: u32 = 14;
/// NVML_DEVICE_ARCH_HOPPER.
pub const DEVICE_ARCH_HOPPER: u32 = 9;
/// 0x2330 (H100 SXM5) in the high half, PCI vendor 0x10de (NVIDIA) in the low half.
pub const PCI_DEVICE_ID: u32 = 0x2330_10DE;
pub const PCI_SUBSYSTEM_ID: u32 = 0x16C1_10DE;

const _: () = {
    assert!(size_of::<Memory>() == 24);
    assert!(size_of::<MemoryV2>() == 40);
    assert!(offset_of!(MemoryV2, total) == 8);
    assert!(MEMORY_V2_VERSION == 0x0200_0028);
    assert!(size_of::<ProcessInfoV1>() == 16);
    assert!(offset_of!(ProcessInfoV1, used_gpu_memory) == 8);
    assert!(size_of::<ProcessInfoV2>() == 24);
    assert!(offset_of!(ProcessInfoV2, used_gpu_memory) == 8);
    assert!(offset_of!(ProcessInfoV2, gpu_instance_id) == 16);
    assert!(offset_of!(ProcessInfoV2, compute_instance_id) == 20);
    assert!(size_of::<Utilization>() == 8);
    assert!(size_of::<ProcessUtilizationSample>() == 32);
    assert!(offset_of!(ProcessUtilizationSample, time_stamp) == 8);
    assert!(offset_of!(ProcessUtilizationSample, sm_util) == 16);
    assert!(size_of::<ProcessUtilizationInfoV1>() == 40);
    assert!(offset_of!(ProcessUtilizationInfoV1, pid) == 8);
    assert!(size_of::<ProcessesUtilizationInfoV1>() == 24);
    assert!(offset_of!(ProcessesUtilizationInfoV1, last_seen_time_stamp) == 8);
    assert!(PROCESSES_UTILIZATION_INFO_V1_VERSION == 0x0100_0018);
    assert!(size_of::<PciInfo>() == 68);
    assert!(offset_of!(PciInfo, domain) == 16);
    assert!(offset_of!(PciInfo, bus_id) == 36);
};

/// `nvmlSetMemoryLimits_v1_t` (nvml.h of CUDA 13.4+, driver r615+): 24 bytes, no version field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SetMemoryLimitsV1 {
    /// `nameSpace`: full path of the cgroup's directory.
    pub name_space: *const std::ffi::c_char,
    /// `softLimit` in bytes.
    pub soft_limit: u64,
    /// `hardLimit` in bytes.
    pub hard_limit: u64,
}

/// `nvmlGetMemoryLimits_v1_t`: 32 bytes, no version field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GetMemoryLimitsV1 {
    /// `nameSpace` (in).
    pub name_space: *const std::ffi::c_char,
    /// `softLimit` (out).
    pub soft_limit: u64,
    /// `hardLimit` (out).
    pub hard_limit: u64,
    /// `currentUsed` (out).
    pub current_used: u64,
}

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: "no limit" for `hardLimit`.
pub const DEVICE_MEMORY_LIMIT_MAX: u64 = u64::MAX;
