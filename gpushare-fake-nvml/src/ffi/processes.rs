//! nvmlDevice{Compute,Graphics}RunningProcesses{,_v2,_v3} and nvmlDeviceGetMPSComputeRunningProcesses_v3: the two-call INSUFFICIENT_SIZE
//! protocol. `*infoCount` in is the capacity of `infos` (NULL counts as capacity 0); when it is
//! smaller than the number of processes, `*infoCount` is set to that number and the call
//! returns INSUFFICIENT_SIZE (SUCCESS with 0 when there are none); otherwise the records are
//! written, `*infoCount` is set to their number, and the call returns SUCCESS.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{NvmlDevice, device_call};
use crate::abi::{NO_MIG_INSTANCE, ProcessInfoV1, ProcessInfoV2};
use crate::codes;
use crate::scenario::Process;
use crate::state::{ProcessKind, ProcessList};
use std::ffi::c_uint;

fn v1(p: &Process) -> ProcessInfoV1 {
    ProcessInfoV1 {
        pid: p.pid,
        used_gpu_memory: p.used_memory.unwrap_or(codes::VALUE_NOT_AVAILABLE_U64),
    }
}

fn v2(p: &Process) -> ProcessInfoV2 {
    ProcessInfoV2 {
        pid: p.pid,
        used_gpu_memory: p.used_memory.unwrap_or(codes::VALUE_NOT_AVAILABLE_U64),
        gpu_instance_id: NO_MIG_INSTANCE,
        compute_instance_id: NO_MIG_INSTANCE,
    }
}

/// # Safety
/// `info_count` is null or valid for read/write; `infos` is null or valid for writes of
/// `*info_count` records of `R`.
unsafe fn running<R>(
    name: &str,
    device: NvmlDevice,
    kind: ProcessKind,
    info_count: *mut c_uint,
    infos: *mut R,
    record: fn(&Process) -> R,
) -> c_uint {
    device_call(name, device, |s, index| {
        if info_count.is_null() {
            return Err(codes::ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, valid per the contract.
        let capacity = if infos.is_null() {
            0
        } else {
            unsafe { info_count.read_unaligned() }
        };
        match s.process_list(index, kind, capacity) {
            ProcessList::TooSmall(n) => {
                unsafe { info_count.write_unaligned(n) };
                Err(codes::ERROR_INSUFFICIENT_SIZE)
            }
            ProcessList::Fill(list) => {
                for (k, p) in list.iter().enumerate() {
                    // SAFETY: k < list.len() <= capacity, and infos is non-null when capacity > 0.
                    unsafe { infos.add(k).write_unaligned(record(p)) };
                }
                // The list fits in `capacity`, a c_uint.
                unsafe { info_count.write_unaligned(list.len() as c_uint) };
                Ok(())
            }
        }
    })
}

/// One exported entry point per (name, process kind, record version), each a call of [`running`].
macro_rules! running_processes {
    ($($name:ident: $kind:ident, $info:ty, $record:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            device: NvmlDevice,
            info_count: *mut c_uint,
            infos: *mut $info,
        ) -> c_uint {
            unsafe {
                running(
                    stringify!($name),
                    device,
                    ProcessKind::$kind,
                    info_count,
                    infos,
                    $record,
                )
            }
        }
    )*};
}

running_processes! {
    nvmlDeviceGetComputeRunningProcesses: Compute, ProcessInfoV1, v1;
    nvmlDeviceGetComputeRunningProcesses_v2: Compute, ProcessInfoV2, v2;
    nvmlDeviceGetComputeRunningProcesses_v3: Compute, ProcessInfoV2, v2;
    nvmlDeviceGetGraphicsRunningProcesses: Graphics, ProcessInfoV1, v1;
    nvmlDeviceGetGraphicsRunningProcesses_v2: Graphics, ProcessInfoV2, v2;
    nvmlDeviceGetGraphicsRunningProcesses_v3: Graphics, ProcessInfoV2, v2;
    nvmlDeviceGetMPSComputeRunningProcesses_v3: Mps, ProcessInfoV2, v2;
}
