//! nvmlDeviceSetMemoryLimits_v1 / nvmlDeviceGetMemoryLimits_v1 (nvml.h of CUDA 13.4+, r615+
//! drivers): per-cgroup soft and hard GPU memory limits. The mock records them in
//! `memory-limits.json` beside the scenario (so every process, and the tests, can read them
//! back) and enforces nothing.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{NvmlDevice, device_call};
use crate::abi::{DEVICE_MEMORY_LIMIT_MAX, GetMemoryLimitsV1, SetMemoryLimitsV1};
use crate::codes;
use crate::state::Session;
use gpushare_fake_driver::limits::{self, Limit, MemoryLimits};
use gpushare_fake_driver::statefile;
use std::ffi::{CStr, c_char, c_uint};
use std::path::{Path, PathBuf};

/// The cgroup path of a limits struct: non-null, UTF-8 (INVALID_ARGUMENT otherwise), an
/// existing directory (OPERATING_SYSTEM otherwise: "the cgroup path cannot be opened").
///
/// # Safety
/// `name_space` is null or a NUL-terminated string.
unsafe fn cgroup_path(name_space: *const c_char) -> Result<String, u32> {
    if name_space.is_null() {
        return Err(codes::ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated per the contract.
    let path = unsafe { CStr::from_ptr(name_space) }
        .to_str()
        .map_err(|_| codes::ERROR_INVALID_ARGUMENT)?;
    if !Path::new(path).is_absolute() || !Path::new(path).is_dir() {
        return Err(codes::ERROR_OPERATING_SYSTEM);
    }
    Ok(path.to_owned())
}

fn supported(s: &Session<'_>) -> Result<(), u32> {
    if s.scenario.memory_limits_supported {
        Ok(())
    } else {
        Err(codes::ERROR_NOT_SUPPORTED)
    }
}

fn limits_file(s: &Session<'_>) -> PathBuf {
    limits::path_for(s.scenario_path)
}

fn unknown(e: String) -> u32 {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "gpushare-fake-nvml: {e}");
    codes::ERROR_UNKNOWN
}

/// What both calls start with: the feature is on, and the caller's struct (valid for a read per
/// the contract; also for a write in the getter), read.
unsafe fn request<T>(s: &Session<'_>, limits: *mut T) -> Result<T, u32> {
    supported(s)?;
    if limits.is_null() {
        return Err(codes::ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, valid for a read per the contract.
    Ok(unsafe { limits.read_unaligned() })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    device: NvmlDevice,
    limits: *mut SetMemoryLimitsV1,
) -> c_uint {
    device_call("nvmlDeviceSetMemoryLimits_v1", device, |s, index| {
        let l = unsafe { request(s, limits) }?;
        let path = unsafe { cgroup_path(l.name_space) }?;
        let d = &s.scenario.devices[index];
        if l.soft_limit > l.hard_limit
            || l.soft_limit > d.memory_total
            || (l.hard_limit != DEVICE_MEMORY_LIMIT_MAX && l.hard_limit > d.memory_total)
        {
            return Err(codes::ERROR_INVALID_ARGUMENT);
        }
        let uuid = d.uuid.clone();
        let clear = l.soft_limit == 0 && l.hard_limit == DEVICE_MEMORY_LIMIT_MAX;
        let inode = {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata(&path).map(|m| m.ino()).unwrap_or(0)
        };
        let ancestors: Vec<String> = match v2_mount() {
            Some(mount) => Path::new(&path)
                .ancestors()
                .skip(1)
                .filter(|a| a.starts_with(&mount))
                .map(|a| a.display().to_string())
                .collect(),
            None => Vec::new(),
        };
        statefile::update(&limits_file(s), |m: &mut MemoryLimits| {
            // The soft limit this very group reserved so far (none if the group at the path is
            // a new one: the deleted group's reservation stays where it was).
            let same_group = m.inodes.get(&path) == Some(&inode);
            let before = m
                .devices
                .get(&uuid)
                .and_then(|d| d.get(&path))
                .filter(|_| same_group)
                .map_or(0, |l| l.soft);
            let reserved = m.reserved.entry(uuid.clone()).or_default();
            for a in &ancestors {
                let r = reserved.entry(a.clone()).or_default();
                *r = r.saturating_sub(before).saturating_add(l.soft_limit);
                if *r == 0 {
                    reserved.remove(a);
                }
            }
            if reserved.is_empty() {
                m.reserved.remove(&uuid);
            }
            m.inodes.insert(path.clone(), inode);
            let per_device = m.devices.entry(uuid.clone()).or_default();
            if clear {
                per_device.remove(&path);
            } else {
                per_device.insert(
                    path,
                    Limit {
                        soft: l.soft_limit,
                        hard: l.hard_limit,
                    },
                );
            }
            if per_device.is_empty() {
                m.devices.remove(&uuid);
            }
            Ok::<(), ()>(())
        })
        .map_err(unknown)?
        .map_err(|()| codes::ERROR_UNKNOWN)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryLimits_v1(
    device: NvmlDevice,
    limits: *mut GetMemoryLimitsV1,
) -> c_uint {
    device_call("nvmlDeviceGetMemoryLimits_v1", device, |s, index| {
        let mut l = unsafe { request(s, limits) }?;
        let path = unsafe { cgroup_path(l.name_space) }?;
        let d = &s.scenario.devices[index];
        let all: MemoryLimits = statefile::read(&limits_file(s)).map_err(unknown)?;
        // A group recreated at the path (another inode) has none of the deleted one's limit.
        let inode = {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata(&path).map(|m| m.ino()).unwrap_or(0)
        };
        if all.inodes.get(&path).is_some_and(|i| *i != inode) {
            return Err(codes::ERROR_NOT_FOUND);
        }
        let limit = all
            .devices
            .get(&d.uuid)
            .and_then(|m| m.get(&path))
            .copied()
            .ok_or(codes::ERROR_NOT_FOUND)?;
        l.soft_limit = limit.soft;
        l.hard_limit = limit.hard;
        l.current_used = used_in_cgroup(s, index, Path::new(&path));
        unsafe { limits.write_unaligned(l) };
        Ok(())
    })
}

/// Memory of the device's (visible) processes whose cgroup v2 directory is `cgroup` or below it.
fn used_in_cgroup(s: &Session<'_>, index: usize, cgroup: &Path) -> u64 {
    let Some(mount) = v2_mount() else { return 0 };
    let mut by_pid = std::collections::BTreeMap::<u32, u64>::new();
    for p in s
        .scenario
        .compute_processes(index)
        .into_iter()
        .chain(s.scenario.graphics_processes(index))
    {
        let e = by_pid.entry(p.pid).or_default();
        *e = (*e).max(p.used_memory.unwrap_or(0));
    }
    by_pid
        .into_iter()
        .filter(|(pid, _)| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .ok()
                .and_then(|t| {
                    t.lines().find_map(|l| {
                        l.strip_prefix("0::")
                            .map(|r| mount.join(r.trim_start_matches('/')))
                    })
                })
                .is_some_and(|dir| dir.starts_with(cgroup))
        })
        .map(|(_, used)| used)
        .fold(0u64, u64::saturating_add)
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup/unified` on hybrid hosts).
fn v2_mount() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2").then_some(())?;
            let mut f = left.split_whitespace();
            (f.nth(3)? == "/").then_some(())?;
            f.next().map(PathBuf::from)
        })
        .min_by_key(|p| p.as_os_str().len())
}
