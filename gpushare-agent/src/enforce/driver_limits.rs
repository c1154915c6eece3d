//! Driver-enforced GPU memory limits, where the driver has them: NVIDIA's r615+ drivers (CUDA
//! 13.4) take per-cgroup soft and hard limits through `nvmlDeviceSetMemoryLimits_v1` (backed by
//! the kernel's `dmem` cgroup controller). Where the loaded NVML exports it, every workload under
//! a quota also gets its quota as a driver limit on its root cgroup, on each GPU the quota covers:
//! a hard limit at the quota plus its tolerance (capped at the GPU's memory), and no soft limit (a
//! soft limit is a reservation that outlives a deleted group, see [`crate::policy`]'s `limits`). An
//! allocation past the hard limit then fails in the driver, before any sample could see it; the
//! soft isolation (the ladder) still runs, for everything the driver does not cover (an all-GPU
//! total, elastic borrowing, nodes without the function).
//!
//! Which limits are wanted is the policy's decision ([`crate::policy::Decision::driver_limits`]);
//! this module only sets them. Limits are set when a workload's wanted limits change and cleared (soft 0, hard MAX) when it
//! leaves or its quota goes, and all cleared on SIGTERM. Per GPU, the back end in force is
//! exported: `driver_limits` once a limit was accepted there, `soft` otherwise (the function is
//! missing, or the device answered NOT_SUPPORTED, e.g. without the dmem controller).
//!
//! The driver keeps a limit after the agent dies, so every limit is recorded in
//! `driver-limits.json` in the state directory (by GPU UUID, with the boot it was set in) before
//! it is set, and forgotten after it is cleared. The next start takes the records of this boot
//! as limits it set: those its quotas still want are kept (or changed), the others cleared. A
//! dry run or an observe-only agent sets and clears nothing.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use log::{info, warn};
use serde::{Deserialize, Serialize};

use crate::{
    nvml::{
        NvmlSampler,
        limits::{MEMORY_LIMIT_MAX, MemoryLimitsApi, code_name},
    },
    // The limits wanted: (GPU index, root cgroup path) -> (soft, hard) bytes, as the policy
    // decides them.
    policy::WantedLimits,
    sample::DeviceSample,
};

/// The record's name in the state directory.
pub const FILE_NAME: &str = "driver-limits.json";

/// `driver-limits.json`: the limits this node's agent set, in the boot it set them in.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct RecordFile {
    /// `/proc/sys/kernel/random/boot_id` when they were set (the driver forgets at reboot).
    boot_id: String,
    limits: Vec<Record>,
}

/// One limit set on one GPU's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    gpu_uuid: String,
    cgroup: String,
    soft: u64,
    hard: u64,
    /// The inode of the group it was set on (absent in records of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inode: Option<u64>,
}

/// A limit the agent set that the driver no longer holds as set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behind {
    /// Cleared by someone else: set again.
    Cleared,
    /// Changed by someone else: theirs from then on.
    Changed,
}

/// Sets and clears the driver's limits.
pub struct DriverLimiter {
    api: Option<MemoryLimitsApi>,
    v2_root: PathBuf,
    applied: WantedLimits,
    /// The inode of the group each applied limit was set on: a group recreated at the same path
    /// (another inode) has none of the old one's limit.
    inodes: BTreeMap<(u32, String), u64>,
    /// Limits someone else set (NVIDIA's container hook, an operator) on a group a quota wants
    /// limited: (soft, hard) as the driver reports them; left as they are.
    foreign: BTreeMap<(u32, String), (u64, u64)>,
    /// Limits of ours set again at the next apply: their group's inode is not known (a record
    /// written before the driver was asked, or by an older version).
    reset: BTreeSet<(u32, String)>,
    in_force: BTreeSet<u32>,
    refused: BTreeMap<u32, String>,
    /// Where the limits are recorded (`None`: nowhere, e.g. in unit tests).
    record: Option<PathBuf>,
    /// An earlier run's limits not yet matched to a GPU of this run's samples.
    inherited: Vec<Record>,
    /// GPU index -> UUID, from the latest sample.
    uuids: BTreeMap<u32, String>,
    /// What the record holds now (not written again when unchanged).
    written: Option<RecordFile>,
    /// The kernel's count of removed cgroups at the last look at the limited groups' inodes.
    looked_at: Option<u64>,
    /// Groups looked at (a `stat` each), in total.
    looks: u64,
    /// The wanted limits the last apply found in force exactly (each set by the agent, nothing
    /// else to set, clear, reset or take over, no limit of someone else's): while the same ones
    /// (the same allocation: never written in place) are wanted and no group can have been
    /// recreated, there is nothing to do.
    in_sync: Option<Arc<WantedLimits>>,
}

/// Whether the limited groups' inodes must be looked at now: a group can only have been
/// recreated at its path if some group was removed since the last look (`removed`: the kernel's
/// count of removed cgroups, `None` when it is not counted: then always), or if limits were just
/// taken over from an earlier run's record (removed before this run counted anything).
fn must_look(last: Option<u64>, removed: Option<u64>, took_over: bool) -> bool {
    took_over || removed.is_none() || removed != last
}

impl DriverLimiter {
    /// Over the NVML library `lib` (the sampler's) and the v2 hierarchy at `v2_root`; the limits
    /// are recorded in `state_dir` (and an earlier run's records taken over from there).
    pub fn new(lib: Option<&Path>, v2_root: PathBuf, state_dir: Option<&Path>) -> Self {
        let api = MemoryLimitsApi::open(lib);
        if api.is_some() {
            info!(
                "the NVIDIA driver takes per-cgroup GPU memory limits (nvmlDeviceSetMemoryLimits_v1): \
                 quotas are also set as driver limits"
            );
        }
        let record = state_dir.map(|d| d.join(FILE_NAME));
        let inherited = match (&record, &api) {
            (Some(path), Some(_)) => load(path),
            _ => Vec::new(),
        };
        if !inherited.is_empty() {
            info!(
                "{} driver limit(s) set by an earlier run ({}): kept where a quota still wants them, \
                 cleared otherwise",
                inherited.len(),
                record.as_deref().unwrap_or(Path::new("")).display()
            );
        }
        Self {
            api,
            v2_root,
            applied: WantedLimits::new(),
            inodes: BTreeMap::new(),
            foreign: BTreeMap::new(),
            reset: BTreeSet::new(),
            in_force: BTreeSet::new(),
            refused: BTreeMap::new(),
            record,
            inherited,
            uuids: BTreeMap::new(),
            written: None,
            looked_at: None,
            looks: 0,
            in_sync: None,
        }
    }

    /// The back end on GPU `index`: `driver_limits` when the driver accepted a limit there,
    /// `soft` otherwise.
    pub fn backend(&self, index: u32) -> &'static str {
        if self.in_force.contains(&index) {
            "driver_limits"
        } else {
            "soft"
        }
    }

    /// Limited groups looked at (a `stat` each) to notice one recreated at its path, in total.
    pub fn looks(&self) -> u64 {
        self.looks
    }

    /// Why the driver refused limits on a GPU, if it did.
    pub fn refused(&self) -> &BTreeMap<u32, String> {
        &self.refused
    }

    /// Makes the driver's limits what `wanted` says: sets new and changed ones, clears the rest
    /// (an earlier run's included, once `devices` shows their GPU). `devices`: the latest sample's.
    /// `removed`: the kernel's count of removed cgroups, read before this call (see
    /// [`must_look`]).
    pub fn apply(
        &mut self,
        sampler: &NvmlSampler,
        devices: &[DeviceSample],
        wanted_now: &Arc<WantedLimits>,
        removed: Option<u64>,
    ) {
        if self.api.is_none() {
            return;
        }
        let wanted: &WantedLimits = wanted_now;
        for d in devices {
            self.uuids.insert(d.index, d.uuid.clone());
        }
        // An earlier run's limits, on the GPUs this sample shows, are taken as set by this one.
        let uuids = &self.uuids;
        let applied = &mut self.applied;
        let inodes = &mut self.inodes;
        let before = self.inherited.len();
        self.inherited.retain(|r| {
            let Some((&index, _)) = uuids.iter().find(|(_, u)| **u == r.gpu_uuid) else {
                return true;
            };
            applied
                .entry((index, r.cgroup.clone()))
                .or_insert((r.soft, r.hard));
            if let Some(inode) = r.inode {
                inodes.entry((index, r.cgroup.clone())).or_insert(inode);
            }
            false
        });
        // A limit belongs to the group it was set on: a group recreated at its path (`docker
        // restart`, a restart policy, `launch` reusing a name) is a new group, limited afresh
        // (unless someone else limited it); one of ours whose group's inode is not known is set
        // again. Only when a group could have been recreated since the last look (`must_look`).
        let look = must_look(self.looked_at, removed, self.inherited.len() != before);
        if !look
            && self
                .in_sync
                .as_ref()
                .is_some_and(|w| Arc::ptr_eq(w, wanted_now))
        {
            return;
        }
        self.in_sync = None;
        let v2_root = &self.v2_root;
        let (inodes, reset, looks) = (&mut self.inodes, &mut self.reset, &mut self.looks);
        self.applied.retain(|k, _| {
            if !wanted.contains_key(k) {
                return true;
            }
            match inodes.get(k) {
                Some(_) if !look => true,
                Some(i) => {
                    *looks += 1;
                    if inode_of(&crate::sys::kernel_text::under(v2_root, &k.1)) == Some(*i) {
                        return true;
                    }
                    inodes.remove(k);
                    false
                }
                None => {
                    reset.insert(k.clone());
                    true
                }
            }
        });
        if look {
            self.looked_at = removed;
        }
        // Never change a limit the agent did not set: where a group already has one, the quota's
        // is not set (and nothing is cleared there).
        self.observe_foreign(sampler, wanted);
        let ours: WantedLimits;
        let wanted = if self.foreign.is_empty() {
            wanted
        } else {
            ours = wanted
                .iter()
                .filter(|(k, _)| !self.foreign.contains_key(*k))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            &ours
        };
        let changes = !self.reset.is_empty()
            || self.applied.iter().any(|(k, v)| wanted.get(k) != Some(v))
            || wanted.iter().any(|(k, v)| self.applied.get(k) != Some(v));
        if !changes {
            if self.foreign.is_empty() && self.inherited.is_empty() {
                self.in_sync = Some(Arc::clone(wanted_now));
            }
            return;
        }
        // Recorded before the driver is asked (what the next start must know of), and again after.
        let mut intent = self.applied.clone();
        intent.extend(wanted.iter().map(|(k, v)| (k.clone(), *v)));
        self.persist(&intent);
        crate::crash::point("limit-recorded");
        self.set_all(sampler, wanted);
        crate::crash::point("limit-set");
        // What is set, and what is wanted but was refused (tried again; clearing it at the next
        // start would be harmless): unchanged while a refusal lasts, so not written every step.
        intent.retain(|k, _| wanted.contains_key(k) || self.applied.contains_key(k));
        self.persist(&intent);
    }

    /// Limits set by others: the driver's limits of each wanted group the agent has not set
    /// itself (read again at every step, so one that goes is replaced by the quota's).
    fn observe_foreign(&mut self, sampler: &NvmlSampler, wanted: &WantedLimits) {
        let Some(api) = &self.api else {
            return;
        };
        self.foreign.retain(|k, _| wanted.contains_key(k));
        for key in wanted.keys().filter(|k| !self.applied.contains_key(*k)) {
            let dir = crate::sys::kernel_text::under(&self.v2_root, &key.1);
            // SAFETY: the handle comes from the sampler's live session.
            match sampler.with_device_handle(key.0, |dev| unsafe { api.get(dev, &dir) }) {
                Some(Ok(Some(theirs))) => {
                    if self.foreign.insert(key.clone(), theirs) != Some(theirs) {
                        warn!(
                            "{} has a driver limit on GPU {} the agent did not set (soft {}, hard \
                             {}): left as it is, the quota's is not set there",
                            key.1, key.0, theirs.0, theirs.1
                        );
                    }
                }
                _ => {
                    self.foreign.remove(key);
                }
            }
        }
    }

    /// Reads back every limit the agent set, and forgets those the driver no longer holds as set:
    /// one cleared behind the agent's back is set again at the next step; one someone changed
    /// is theirs from then on (left as it is, reported `other`, as a limit the agent never set).
    /// Called at each reconcile (every 10 s by default), not at each step: one NVML call a limit.
    /// A limit that cannot be read is kept as it is. Returns what changed behind the agent's back.
    pub fn read_back(&mut self, sampler: &NvmlSampler) -> Vec<Behind> {
        let Some(api) = &self.api else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for (key, &ours) in &self.applied {
            if self.reset.contains(key) {
                continue;
            }
            let dir = crate::sys::kernel_text::under(&self.v2_root, &key.1);
            // SAFETY: the handle comes from the sampler's live session.
            let now = match sampler.with_device_handle(key.0, |dev| unsafe { api.get(dev, &dir) }) {
                Some(Ok(now)) if now != Some(ours) => now,
                _ => continue,
            };
            // A group removed or recreated is not a change of its limit (`apply` handles it).
            if !dir.exists()
                || self
                    .inodes
                    .get(key)
                    .is_some_and(|i| inode_of(&dir) != Some(*i))
            {
                continue;
            }
            let (what, kind) = match now {
                None => ("cleared: set again", Behind::Cleared),
                Some(_) => ("changed: left as it is", Behind::Changed),
            };
            warn!(
                "the driver limit the agent set on {} on GPU {} (soft {}, hard {}) was {what} \
                 (the driver now has {:?})",
                key.1, key.0, ours.0, ours.1, now
            );
            found.push((key.clone(), kind));
        }
        for (key, _) in &found {
            self.applied.remove(key);
            self.inodes.remove(key);
        }
        if !found.is_empty() {
            self.in_sync = None;
        }
        found.into_iter().map(|(_, k)| k).collect()
    }

    /// The limits in force on groups of workloads under a quota: (GPU index, cgroup, soft,
    /// hard, `agent` or `other`), the agent's first.
    pub fn in_force(&self) -> Vec<(u32, &str, u64, u64, &'static str)> {
        let ours = self.applied.iter().map(|(k, v)| (k, v, "agent"));
        let theirs = self.foreign.iter().map(|(k, v)| (k, v, "other"));
        ours.chain(theirs)
            .map(|((gpu, cgroup), &(soft, hard), source)| {
                (*gpu, cgroup.as_str(), soft, hard, source)
            })
            .collect()
    }

    /// Whether the loaded NVML has the per-cgroup limits API.
    pub fn has_api(&self) -> bool {
        self.api.is_some()
    }

    /// The driver's limit on the group at `cgroup` (a v2 path) on GPU `index`, read back now
    /// (`nvmlDeviceGetMemoryLimits_v1`): (soft, hard), `None` when it has none, or the NVML
    /// return code (NOT_SUPPORTED, 3, on a device without them). `None` outside: no API or no
    /// such device.
    pub fn read_limit(
        &self,
        sampler: &NvmlSampler,
        index: u32,
        cgroup: &str,
    ) -> Option<Result<Option<(u64, u64)>, i32>> {
        let api = self.api.as_ref()?;
        let dir = crate::sys::kernel_text::under(&self.v2_root, cgroup);
        // SAFETY: the handle comes from the sampler's live session.
        sampler.with_device_handle(index, |dev| unsafe { api.get(dev, &dir) })
    }

    /// Limits set by others on groups a quota wants limited: (GPU index, cgroup) -> (soft, hard).
    pub fn foreign(&self) -> &BTreeMap<(u32, String), (u64, u64)> {
        &self.foreign
    }

    fn set_all(&mut self, sampler: &NvmlSampler, wanted: &WantedLimits) {
        let Some(api) = &self.api else {
            return;
        };
        let stale: Vec<(u32, String)> = self
            .applied
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for key in stale {
            let dir = crate::sys::kernel_text::under(&self.v2_root, &key.1);
            if dir.exists() {
                // SAFETY: the handle comes from the sampler's live session.
                let r = sampler.with_device_handle(key.0, |dev| unsafe {
                    api.set(dev, &dir, 0, MEMORY_LIMIT_MAX)
                });
                if let Some(Err(rc)) = r {
                    warn!(
                        "clearing the driver limit of {} on GPU {}: {}",
                        key.1,
                        key.0,
                        code_name(rc)
                    );
                }
            }
            self.applied.remove(&key);
            self.inodes.remove(&key);
        }
        self.reset.retain(|k| wanted.contains_key(k));
        for (key, &(soft, hard)) in wanted {
            if self.applied.get(key) == Some(&(soft, hard)) && !self.reset.contains(key) {
                continue;
            }
            let dir = crate::sys::kernel_text::under(&self.v2_root, &key.1);
            // SAFETY: the handle comes from the sampler's live session.
            match sampler.with_device_handle(key.0, |dev| unsafe { api.set(dev, &dir, soft, hard) })
            {
                Some(Ok(())) => {
                    self.in_force.insert(key.0);
                    self.refused.remove(&key.0);
                    self.applied.insert(key.clone(), (soft, hard));
                    self.reset.remove(key);
                    match inode_of(&dir) {
                        Some(i) => self.inodes.insert(key.clone(), i),
                        None => self.inodes.remove(key),
                    };
                }
                Some(Err(rc)) => {
                    let why = format!(
                        "{} ({rc}) for {} (soft {soft}, hard {hard})",
                        code_name(rc),
                        key.1
                    );
                    if self.refused.get(&key.0) != Some(&why) {
                        warn!(
                            "the driver refused a GPU memory limit on GPU {}: {why}",
                            key.0
                        );
                    }
                    if rc == 3 {
                        self.in_force.remove(&key.0);
                    }
                    self.refused.insert(key.0, why);
                    // Not recorded as applied: tried again at the next change or step.
                }
                None => {}
            }
        }
    }

    /// Clears every limit the records of this boot list (`thaw --all`, no agent running), on the
    /// GPUs `devices` shows; returns how many.
    pub fn clear_recorded(&mut self, sampler: &NvmlSampler, devices: &[DeviceSample]) -> usize {
        let before = self.inherited.len();
        self.apply(sampler, devices, &Arc::default(), None);
        before - self.inherited.len()
    }

    /// Clears every limit this agent set (SIGTERM), on the GPUs the samples showed.
    pub fn clear_all(&mut self, sampler: &NvmlSampler) {
        self.apply(sampler, &[], &Arc::default(), None);
    }

    /// Writes the records of `limits` (those whose GPU UUID is known) and the inherited ones not
    /// matched yet; a failure is logged (the limits themselves are set all the same).
    fn persist(&mut self, limits: &WantedLimits) {
        let Some(path) = &self.record else {
            return;
        };
        let mut records: Vec<Record> = limits
            .iter()
            .filter_map(|((index, cgroup), &(soft, hard))| {
                Some(Record {
                    gpu_uuid: self.uuids.get(index)?.clone(),
                    cgroup: cgroup.clone(),
                    soft,
                    hard,
                    inode: self.inodes.get(&(*index, cgroup.clone())).copied(),
                })
            })
            .collect();
        records.extend(self.inherited.iter().cloned());
        let file = RecordFile {
            boot_id: boot_id(),
            limits: records,
        };
        if self.written.as_ref() == Some(&file) {
            return;
        }
        let tmp = path.with_extension("json.tmp");
        let write = || -> std::io::Result<()> {
            std::fs::write(&tmp, serde_json::to_vec_pretty(&file)?)?;
            std::fs::rename(&tmp, path)
        };
        match write() {
            Ok(()) => self.written = Some(file),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                warn!(
                    "cannot record the driver limits in {}: {e}; a restart after a crash would not \
                 clear the ones no longer wanted",
                    path.display()
                );
            }
        }
    }
}

/// The inode of the directory at `dir`, if it exists.
fn inode_of(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(dir).ok().map(|m| m.ino())
}

/// This boot's id (empty where it cannot be read).
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The records at `path` set in this boot; a missing file is none, a bad one is reported and
/// taken as none (the limits it named stay until their cgroups go).
fn load(path: &Path) -> Vec<Record> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            warn!(
                "cannot read {}: {e}; earlier driver limits are not cleared",
                path.display()
            );
            return Vec::new();
        }
    };
    match serde_json::from_slice::<RecordFile>(&bytes) {
        Ok(f) if f.boot_id == boot_id() => f.limits,
        Ok(_) => Vec::new(), // another boot: the driver has forgotten them
        Err(e) => {
            warn!(
                "{} is not a driver-limit record ({e}); earlier driver limits are not cleared",
                path.display()
            );
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, boot: &str) -> PathBuf {
        let path = dir.join(FILE_NAME);
        let file = RecordFile {
            boot_id: boot.to_string(),
            limits: vec![Record {
                gpu_uuid: "GPU-a".into(),
                cgroup: "/kubepods/pod1".into(),
                soft: 1,
                hard: 2,
                inode: None,
            }],
        };
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        path
    }

    /// The limited groups are looked at on the first apply, then only when the kernel's count
    /// of removed cgroups moved or limits were taken over from a record; always when nothing
    /// counts removals.
    #[test]
    fn groups_are_looked_at_only_when_one_could_have_been_recreated() {
        // The first apply: nothing looked at yet.
        assert!(must_look(None, Some(5), false));
        // Nothing removed since the last look.
        assert!(!must_look(Some(5), Some(5), false));
        // A group removed somewhere since.
        assert!(must_look(Some(5), Some(6), false));
        // An earlier run's limits taken over: their groups may have gone before this run.
        assert!(must_look(Some(5), Some(5), true));
        // Removals not counted (no eBPF, or the program not attached): every step, as before.
        assert!(must_look(None, None, false));
        assert!(must_look(Some(5), None, false));
    }

    #[test]
    fn records_of_this_boot_are_taken_over_and_others_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), &boot_id());
        assert_eq!(
            load(&path).len(),
            1,
            "this boot's limits are still in the driver"
        );
        let path = write(dir.path(), "another-boot");
        assert!(
            load(&path).is_empty(),
            "a reboot cleared the driver's limits"
        );
        std::fs::write(&path, b"{ not json").unwrap();
        assert!(
            load(&path).is_empty(),
            "a bad record is reported, not fatal"
        );
        assert!(load(&dir.path().join("missing.json")).is_empty());
    }
}
