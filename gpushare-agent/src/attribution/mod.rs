//! Who a GPU process belongs to.
//!
//! The [`Attribution`] table holds every known GPU task: its verified identity (pid + start time),
//! a pidfd held since it was discovered, cgroup id and path, workload, comm and ioctl counts. It is
//! fed by kernel events ([`Attribution::apply`]), by `/proc` where eBPF cannot serve
//! ([`Attribution::attribute_pid`]), and corrected by [`Attribution::reconcile`], so a lost open
//! event cannot leave it wrong for longer than one reconcile interval. Exits cannot be lost: each
//! step polls the pidfds ([`Attribution::drop_exited`]).
//!
//! **Identity before memory.** A sampled pid is charged to a table entry only once
//! [`Attribution::verify_sampled`] has shown that the entry's process held the pid when the sample
//! was taken: its pidfd is still alive (so it held the pid all along since it was discovered) and
//! it started before the sample. An entry whose process has exited is dropped and the pid is
//! attributed afresh; a process that started after the sample began cannot own the sample's
//! record, which then counts as unknown for that step.

pub mod cgroupfs;
pub mod docker;
pub mod k8s_names;
pub mod names;
pub mod pidfd;
pub mod procinfo;
pub mod tracker;

use std::collections::BTreeMap;

use gpushare_common::{EventKind, GpuTask, IoctlCounts};
use log::debug;

pub use self::{cgroupfs::CgroupResolver, pidfd::Pidfd, procinfo::ProcessIdentity};
use crate::ebpf::{KernelEvent, decode::comm_to_string};
/// Workload identities live below attribution (quotas select by them too); re-exported here, where
/// tasks are attributed to them.
pub use crate::workload::{self, WorkloadId, WorkloadKind, parse_cgroup_path};

/// How a task came to be known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// An open of an nvidia device node, seen by the eBPF programs.
    Ebpf,
    /// Found in the kernel table by reconciliation (its event was lost).
    Reconciled,
    /// Found through `/proc` (fallback, or a process that opened the GPU before the agent started).
    Procfs,
}

/// One GPU task.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GpuTaskEntry {
    /// pid + start time, verified against `/proc` when the task was added.
    pub identity: ProcessIdentity,
    /// Start time as CLOCK_BOOTTIME ns (tick precision).
    pub start_boot_ns: u64,
    /// A pidfd held since the task was discovered: exit notification and safe signals.
    #[serde(skip)]
    pub pidfd: Option<Pidfd>,
    /// The cgroup the task was in when last seen (its leaf; the workload's root may be above).
    /// cgroup v2 id (0 when only the path is known).
    pub cgroup_id: u64,
    /// cgroup v2 path of that cgroup, when resolved.
    pub cgroup_path: Option<String>,
    /// The workload, when the path is known.
    pub workload: Option<WorkloadId>,
    /// comm.
    pub comm: String,
    /// ioctls issued (all kinds), summed over CPUs.
    pub ioctls: u64,
    /// RM allocation ioctls.
    pub alloc_ioctls: u64,
    /// Allocation events received (after the kernel's rate limit).
    pub alloc_events: u64,
    /// How the task was found.
    pub source: Source,
    /// CLOCK_BOOTTIME ns at which the task was last confirmed alive by
    /// [`Attribution::drop_exited`] (0: not yet): a sample that began before it needs no second
    /// check of its own.
    #[serde(skip)]
    pub alive_at_boot_ns: u64,
}

/// What applying an event changed; the caller reacts (e.g. re-samples on `AllocHint`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A new GPU task.
    Added(u32),
    /// A GPU task exited.
    Removed(u32),
    /// A GPU task's memory may have grown.
    AllocHint(u32),
    /// Comm or cgroup changed.
    Updated(u32),
    /// Nothing (unknown task, or an identity that failed verification).
    None,
}

/// Counters of the attribution layer (exported as metrics).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct AttributionStats {
    /// Events applied, by kind name.
    pub events: BTreeMap<&'static str, u64>,
    /// Events whose pid failed identity verification (exited already, or pid reused).
    pub identity_rejected: u64,
    /// Tasks removed by reconciliation (their exit event was lost or never sent).
    pub reconciled_removed: u64,
    /// Tasks added by reconciliation (their open event was lost).
    pub reconciled_added: u64,
    /// Tasks added from `/proc`.
    pub procfs_added: u64,
    /// Entries dropped because their process had exited (seen through its pidfd).
    pub exited_dropped: u64,
    /// Sample records of a pid whose entry was stale (its process had exited): the pid was
    /// attributed afresh.
    pub stale_identity: u64,
    /// Sample records left unknown because the pid's process started after the sample began.
    pub unverifiable_samples: u64,
}

/// Whether a sampled pid can be charged to the table's entry for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {
    /// The entry's process held the pid when the sample was taken.
    Charged,
    /// A process holds the pid now but started after the sample began: the record may be an
    /// earlier holder's. Its memory counts as unknown for this step.
    Unverifiable,
    /// No process holds the pid (it exited).
    Gone,
}

/// The tasks by pid: found by hash (a step looks a pid up tens of thousands of times at 10,000
/// tasks; a B-tree of entries this size missed the cache at each level), walked in pid order
/// (what reads the table sees its tasks in a fixed order, as before).
#[derive(Default)]
struct TaskMap {
    by_pid: foldhash::HashMap<u32, GpuTaskEntry>,
    order: std::collections::BTreeSet<u32>,
}

impl TaskMap {
    fn get(&self, pid: &u32) -> Option<&GpuTaskEntry> {
        self.by_pid.get(pid)
    }

    fn get_mut(&mut self, pid: &u32) -> Option<&mut GpuTaskEntry> {
        self.by_pid.get_mut(pid)
    }

    fn contains_key(&self, pid: &u32) -> bool {
        self.by_pid.contains_key(pid)
    }

    fn insert(&mut self, pid: u32, entry: GpuTaskEntry) -> Option<GpuTaskEntry> {
        self.order.insert(pid);
        self.by_pid.insert(pid, entry)
    }

    fn remove(&mut self, pid: &u32) -> Option<GpuTaskEntry> {
        self.order.remove(pid);
        self.by_pid.remove(pid)
    }

    /// In pid order.
    fn values(&self) -> impl Iterator<Item = &GpuTaskEntry> {
        self.order.iter().map(|pid| &self.by_pid[pid])
    }

    /// In no order.
    fn values_mut(&mut self) -> impl Iterator<Item = &mut GpuTaskEntry> {
        self.by_pid.values_mut()
    }

    fn len(&self) -> usize {
        self.by_pid.len()
    }

    fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }
}

/// The GPU task table.
pub struct Attribution {
    tasks: TaskMap,
    resolver: CgroupResolver,
    stats: AttributionStats,
    /// Per task, the first-open time of its kernel entry when a reconcile last found the task
    /// alive in `/proc`: while the kernel still holds that very entry, the task has not exited
    /// (the kernel drops the entry when the last thread exits, and a new one has a new time), so
    /// the next reconcile needs no `/proc` read for it.
    confirmed: std::collections::HashMap<u32, (ProcessIdentity, u64)>,
    /// The entries' pidfds, watched for exits in one `epoll_wait` a step.
    exits: pidfd::ExitWatch,
    /// Tasks whose pidfd could not be watched: polled every step.
    unwatched: std::collections::BTreeSet<u32>,
}

impl Attribution {
    /// An empty table resolving cgroups with `resolver`.
    pub fn new(resolver: CgroupResolver) -> Self {
        Self {
            tasks: TaskMap::default(),
            resolver,
            stats: AttributionStats::default(),
            confirmed: std::collections::HashMap::new(),
            exits: pidfd::ExitWatch::default(),
            unwatched: std::collections::BTreeSet::new(),
        }
    }

    /// The cgroup resolver (for its work counters).
    pub fn resolver(&self) -> &CgroupResolver {
        &self.resolver
    }

    /// The task with this pid.
    pub fn get(&self, pid: u32) -> Option<&GpuTaskEntry> {
        self.tasks.get(&pid)
    }

    /// All tasks, by pid.
    pub fn tasks(&self) -> impl Iterator<Item = &GpuTaskEntry> {
        self.tasks.values()
    }

    /// All tasks, in no order (one walk of the hash table: for what does not depend on the
    /// order).
    pub fn tasks_in_any_order(&self) -> impl Iterator<Item = &GpuTaskEntry> {
        self.tasks.by_pid.values()
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> &AttributionStats {
        &self.stats
    }

    /// Applies one kernel event.
    pub fn apply(&mut self, ev: &KernelEvent) -> Change {
        *self.stats.events.entry(ev.kind.name()).or_default() += 1;
        match ev.kind {
            EventKind::GpuOpen => {
                if self.tasks.contains_key(&ev.tgid) {
                    return Change::None;
                }
                match self.verified_entry(
                    ev.tgid,
                    ev.cgroup_id,
                    Some(ev.ktime_boot_ns),
                    Source::Ebpf,
                ) {
                    Some(entry) => {
                        self.insert(ev.tgid, entry);
                        Change::Added(ev.tgid)
                    }
                    None => Change::None,
                }
            }
            EventKind::GpuExit => {
                // The exit of an earlier holder of the pid must not remove a newer process that
                // was attributed through /proc before the event was drained.
                let newer = self.tasks.get(&ev.tgid).is_some_and(|t| match &t.pidfd {
                    Some(fd) => !fd.has_exited(),
                    None => t.start_boot_ns > ev.ktime_boot_ns,
                });
                if !newer && self.tasks.remove(&ev.tgid).is_some() {
                    Change::Removed(ev.tgid)
                } else {
                    Change::None
                }
            }
            // An exec or a move may change the task's group: it is charged to the new one.
            EventKind::AllocIoctl | EventKind::GpuExec | EventKind::GpuMove => {
                let alloc = ev.kind == EventKind::AllocIoctl;
                let Some(cgroup_id) = self.tasks.get(&ev.tgid).map(|t| t.cgroup_id) else {
                    // Known to the kernel but not to us (its open event was lost): reconcile.
                    return Change::None;
                };
                if cgroup_id != ev.cgroup_id {
                    let path = self.resolver.resolve(ev.cgroup_id, Some(ev.tgid));
                    let t = self.tasks.get_mut(&ev.tgid).expect("checked above");
                    t.cgroup_id = ev.cgroup_id;
                    t.workload = path.as_deref().map(parse_cgroup_path);
                    t.cgroup_path = path;
                }
                let t = self.tasks.get_mut(&ev.tgid).expect("checked above");
                if !ev.comm.is_empty() {
                    t.comm.clone_from(&ev.comm);
                }
                if alloc {
                    t.alloc_events += 1;
                    Change::AllocHint(ev.tgid)
                } else {
                    Change::Updated(ev.tgid)
                }
            }
        }
    }

    /// Builds an entry for `pid` after verifying its identity: the process exists, is a process
    /// (not a thread), and started no later than `seen_boot_ns` (so the pid was not reused since).
    /// A pidfd is opened first and kept: see [`procinfo::open_verified`].
    fn verified_entry(
        &mut self,
        pid: u32,
        cgroup_id: u64,
        seen_boot_ns: Option<u64>,
        source: Source,
    ) -> Option<GpuTaskEntry> {
        let (snap, pidfd) = match procinfo::open_verified(pid) {
            Ok(s) => s,
            Err(e) => {
                self.stats.identity_rejected += 1;
                debug!("GPU task {pid} not verified: {e:#}");
                return None;
            }
        };
        if let Some(seen) = seen_boot_ns
            && snap.start_boot_ns > seen.saturating_add(procinfo::tick_ns())
        {
            self.stats.identity_rejected += 1;
            debug!("GPU task {pid}: pid reused (started after the event)");
            return None;
        }
        let (cgroup_id, path) = if cgroup_id != 0 {
            (cgroup_id, self.resolver.resolve(cgroup_id, Some(pid)))
        } else {
            let path = cgroupfs::cgroup_path_of_pid(pid).ok();
            let id = path
                .as_deref()
                .and_then(|p| self.resolver.id_of(p).ok())
                .unwrap_or(0);
            (id, path)
        };
        Some(GpuTaskEntry {
            identity: snap.identity,
            start_boot_ns: snap.start_boot_ns,
            pidfd,
            cgroup_id,
            workload: path.as_deref().map(parse_cgroup_path),
            cgroup_path: path,
            comm: snap.comm,
            ioctls: 0,
            alloc_ioctls: 0,
            alloc_events: 0,
            source,
            alive_at_boot_ns: 0,
        })
    }

    /// Whether the entry's process is still alive: its pidfd, else its start time in `/proc`.
    fn alive(entry: &GpuTaskEntry) -> bool {
        match &entry.pidfd {
            Some(fd) => !fd.has_exited(),
            None => procinfo::is_same_process(entry.identity),
        }
    }

    /// Drops every entry whose process has exited (the pidfds an `epoll_wait` reports readable,
    /// confirmed by one `poll`; every pidfd when the epoll set cannot say; a start-time check for
    /// entries without one). Returns the pids dropped, so the caller can clear kernel state.
    pub fn drop_exited(&mut self) -> Vec<u32> {
        // Before the checks: every survivor was alive at this time or later.
        let checked_at = crate::ebpf::boot_time_ns();
        // The watched pidfds that became readable, and those that are not watched; every one
        // when the watch cannot say.
        let ready = self.exits.ready(self.tasks.len() + 1);
        let with_fd: Vec<(u32, &Pidfd)> = match &ready {
            Some(fds) => {
                let by_fd: std::collections::HashSet<std::os::fd::RawFd> =
                    fds.iter().copied().collect();
                self.tasks
                    .values()
                    .filter_map(|t| t.pidfd.as_ref().map(|fd| (t.identity.pid, fd)))
                    .filter(|(pid, fd)| {
                        self.unwatched.contains(pid)
                            || by_fd.contains(&std::os::fd::AsRawFd::as_raw_fd(*fd))
                    })
                    .collect()
            }
            None => self
                .tasks
                .values()
                .filter_map(|t| t.pidfd.as_ref().map(|fd| (t.identity.pid, fd)))
                .collect(),
        };
        let fds: Vec<&Pidfd> = with_fd.iter().map(|(_, fd)| *fd).collect();
        let mut dead: Vec<u32> = with_fd
            .iter()
            .zip(pidfd::exited(&fds))
            .filter(|(_, exited)| *exited)
            .map(|((pid, _), _)| *pid)
            .collect();
        dead.extend(
            self.tasks
                .values()
                .filter(|t| t.pidfd.is_none() && !procinfo::is_same_process(t.identity))
                .map(|t| t.identity.pid),
        );
        for pid in &dead {
            self.tasks.remove(pid);
        }
        if !self.unwatched.is_empty() {
            let tasks = &self.tasks;
            self.unwatched.retain(|p| tasks.contains_key(p));
        }
        for t in self.tasks.values_mut() {
            t.alive_at_boot_ns = checked_at;
        }
        self.stats.exited_dropped += dead.len() as u64;
        dead
    }

    /// Puts `entry` in the table under `pid`, its pidfd watched for the exit.
    fn insert(&mut self, pid: u32, entry: GpuTaskEntry) {
        let watched = entry.pidfd.as_ref().is_some_and(|fd| self.exits.watch(fd));
        if watched || entry.pidfd.is_none() {
            self.unwatched.remove(&pid);
        } else {
            self.unwatched.insert(pid);
        }
        self.tasks.insert(pid, entry);
    }

    /// Decides whether the record of `pid` in a sample that began at `sample_started_boot_ns`
    /// (CLOCK_BOOTTIME) may be charged to the table's entry for it; attributes the pid through
    /// `/proc` when the table has no live entry. See the module note.
    pub fn verify_sampled(&mut self, pid: u32, sample_started_boot_ns: u64) -> Verified {
        if let Some(entry) = self.tasks.get(&pid) {
            // Alive at a time after the sample began (a sweep since, or a check now) and started
            // before it: it held the pid for the whole sample.
            if entry.alive_at_boot_ns >= sample_started_boot_ns || Self::alive(entry) {
                let before = Self::entry_started_before(entry, sample_started_boot_ns);
                return self.verdict(before);
            }
            self.tasks.remove(&pid);
            self.stats.stale_identity += 1;
            debug!("pid {pid}: its tracked process exited; attributing the pid afresh");
        }
        if self.attribute_pid(pid).is_none() {
            return Verified::Gone;
        }
        self.started_before(pid, sample_started_boot_ns)
    }

    /// Whether the entry for `pid` (verified alive by [`Self::verify_sampled`]) started before
    /// `boot_ns`, and so held the pid for a whole window that began then: what a utilization
    /// sample covering that window needs before it is charged to it. Counts nothing.
    pub fn held_since(&self, pid: u32, boot_ns: u64) -> bool {
        self.tasks
            .get(&pid)
            .is_some_and(|e| e.start_boot_ns.saturating_add(procinfo::tick_ns()) < boot_ns)
    }

    fn started_before(&mut self, pid: u32, sample_started_boot_ns: u64) -> Verified {
        let Some(entry) = self.tasks.get(&pid) else {
            return Verified::Gone;
        };
        let before = Self::entry_started_before(entry, sample_started_boot_ns);
        self.verdict(before)
    }

    /// Start times have tick resolution: a process that started within a tick of the sample
    /// might have started after it.
    fn entry_started_before(entry: &GpuTaskEntry, sample_started_boot_ns: u64) -> bool {
        entry.start_boot_ns.saturating_add(procinfo::tick_ns()) < sample_started_boot_ns
    }

    /// `Charged` for a process that started before the sample, else `Unverifiable` (counted).
    fn verdict(&mut self, started_before: bool) -> Verified {
        if started_before {
            Verified::Charged
        } else {
            self.stats.unverifiable_samples += 1;
            Verified::Unverifiable
        }
    }

    /// Attributes a pid reported by NVML that no kernel event announced, through `/proc`
    /// (the fallback when eBPF cannot load, and for processes that opened the GPU before the agent
    /// started). Returns the entry when the process exists.
    pub fn attribute_pid(&mut self, pid: u32) -> Option<&GpuTaskEntry> {
        if let Some(existing) = self.tasks.get(&pid)
            && Self::alive(existing)
        {
            return self.tasks.get(&pid);
        }
        let entry = self.verified_entry(pid, 0, None, Source::Procfs)?;
        self.stats.procfs_added += 1;
        self.insert(pid, entry);
        self.tasks.get(&pid)
    }

    /// Adds `entry` as it is (no `/proc` check): for tests of what reads the table.
    #[cfg(test)]
    pub(crate) fn insert_for_test(&mut self, entry: GpuTaskEntry) {
        self.insert(entry.identity.pid, entry);
    }

    /// Sets a task's ioctl counts (read from the kernel's per-CPU map).
    pub fn set_ioctl_counts(&mut self, pid: u32, counts: IoctlCounts) {
        if let Some(t) = self.tasks.get_mut(&pid) {
            t.ioctls = counts.calls;
            t.alloc_ioctls = counts.allocs;
        }
    }

    /// Reconciles the table with the kernel's table and `/proc`: drops tasks whose process is gone
    /// or was replaced (a lost exit), adds kernel-known tasks we missed (a lost open). Returns the
    /// pids removed from the userspace table, so the caller can clear kernel state for them.
    pub fn reconcile(&mut self, kernel_tasks: &[(u32, GpuTask)]) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        let kernel_since: std::collections::HashMap<u32, u64> = kernel_tasks
            .iter()
            .map(|(tgid, t)| (*tgid, t.first_open_boot_ns))
            .collect();
        let confirmed = std::mem::take(&mut self.confirmed);
        let mut gone = Vec::new();
        for t in self.tasks.values() {
            let pid = t.identity.pid;
            let since = kernel_since.get(&pid).copied();
            // A held pidfd says exactly whether the process lives (no `/proc` read); without
            // one, an entry the last reconcile confirmed and the kernel still holds unchanged
            // needs no read either.
            let alive = match &t.pidfd {
                Some(fd) => !fd.has_exited(),
                None => {
                    let unchanged = since.is_some()
                        && confirmed.get(&pid) == Some(&(t.identity, since.unwrap_or(0)));
                    unchanged || procinfo::is_same_process(t.identity)
                }
            };
            if alive {
                if let Some(since) = since {
                    self.confirmed.insert(pid, (t.identity, since));
                }
            } else {
                gone.push(pid);
            }
        }
        for pid in gone {
            self.tasks.remove(&pid);
            self.stats.reconciled_removed += 1;
            report.removed.push(pid);
        }
        for (tgid, task) in kernel_tasks {
            if self.tasks.contains_key(tgid) {
                continue;
            }
            match self.verified_entry(
                *tgid,
                task.cgroup_id,
                Some(task.first_open_boot_ns),
                Source::Reconciled,
            ) {
                Some(mut entry) => {
                    if entry.comm.is_empty() {
                        entry.comm = comm_to_string(&task.comm);
                    }
                    self.insert(*tgid, entry);
                    self.stats.reconciled_added += 1;
                    report.added.push(*tgid);
                }
                None => report.stale_kernel_entries.push(*tgid),
            }
        }
        report
    }
}

impl Attribution {
    /// Reads each task's group from `/proc` again and takes a move (`--no-ebpf`: no kernel
    /// program reports one): a process moved to another group is charged to it from here on.
    /// A path read for a process that exited since (its pidfd says, else its start time) is not
    /// taken. Returns the pids moved.
    pub fn follow_moves(&mut self) -> Vec<u32> {
        let mut moved = Vec::new();
        for t in self.tasks.values_mut() {
            let pid = t.identity.pid;
            let Ok(path) = cgroupfs::cgroup_path_of_pid(pid) else {
                continue;
            };
            if t.cgroup_path.as_deref() == Some(path.as_str()) || !Self::alive(t) {
                continue;
            }
            t.cgroup_id = self.resolver.id_of(&path).unwrap_or(0);
            t.workload = Some(parse_cgroup_path(&path));
            t.cgroup_path = Some(path);
            moved.push(pid);
        }
        moved
    }
}

/// What a reconciliation changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Tasks dropped from the table (process gone or pid reused).
    pub removed: Vec<u32>,
    /// Tasks the kernel knew and the table did not.
    pub added: Vec<u32>,
    /// Kernel entries whose process is gone: the caller removes them from the kernel table.
    pub stale_kernel_entries: Vec<u32>,
    /// Tasks found in another group than the table's (without eBPF: see
    /// [`Attribution::follow_moves`]).
    pub moved: Vec<u32>,
}

#[cfg(test)]
impl GpuTaskEntry {
    /// A task of `pid` (start tick 1) in the group `leaf` (its workload as the path says), from
    /// `/proc`, with no pidfd, comm "t" and no ioctl: for tests of what reads the table.
    pub(crate) fn for_test(pid: u32, leaf: Option<&str>) -> Self {
        Self {
            identity: ProcessIdentity {
                pid,
                start_ticks: 1,
            },
            start_boot_ns: 0,
            pidfd: None,
            cgroup_id: 0,
            cgroup_path: leaf.map(str::to_string),
            workload: leaf.map(parse_cgroup_path),
            comm: "t".into(),
            ioctls: 0,
            alloc_ioctls: 0,
            alloc_events: 0,
            source: Source::Procfs,
            alive_at_boot_ns: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap()
    }

    /// Exits are found through the watched pidfds: a reaped process and a zombie are dropped
    /// (each once), a live one stays, and a pid attributed again after its exit is watched anew.
    #[test]
    fn drop_exited_finds_exits_through_the_watched_pidfds() {
        let mut table = Attribution::new(CgroupResolver::new("/sys/fs/cgroup".into()));
        let (mut a, mut b, mut c) = (sleeper(), sleeper(), sleeper());
        for p in [&a, &b, &c] {
            let e = table.attribute_pid(p.id()).expect("a live child");
            assert!(e.pidfd.is_some(), "this kernel gives pidfds");
        }
        assert!(table.unwatched.is_empty(), "every pidfd is watched");
        assert_eq!(table.drop_exited(), Vec::<u32>::new(), "nobody exited");
        a.kill().unwrap();
        a.wait().unwrap();
        b.kill().unwrap();
        // b stays a zombie until waited for: it has exited all the same.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut dropped = Vec::new();
        while dropped.len() < 2 && std::time::Instant::now() < deadline {
            dropped.extend(table.drop_exited());
        }
        dropped.sort();
        let mut want = vec![a.id(), b.id()];
        want.sort();
        assert_eq!(dropped, want);
        assert!(table.get(c.id()).is_some());
        assert_eq!(table.drop_exited(), Vec::<u32>::new(), "each exit once");
        b.wait().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
        assert_eq!(table.drop_exited(), vec![c.id()]);
        assert_eq!(table.tasks().count(), 0);
    }

    /// The table is walked in pid order, whatever the order tasks came and went in; a task
    /// put again under its pid replaces the last one.
    #[test]
    fn tasks_are_walked_in_pid_order() {
        let mut table = Attribution::new(CgroupResolver::new("/nonexistent".into()));
        for pid in [40, 7, 300, 12, 9000, 1] {
            table.insert_for_test(GpuTaskEntry::for_test(pid, None));
        }
        table.tasks.remove(&12);
        let mut again = GpuTaskEntry::for_test(300, None);
        again.ioctls = 5;
        table.insert_for_test(again);
        let pids: Vec<u32> = table.tasks().map(|t| t.identity.pid).collect();
        assert_eq!(pids, vec![1, 7, 40, 300, 9000]);
        assert_eq!(table.len(), 5);
        assert_eq!(table.get(300).map(|t| t.ioctls), Some(5));
        assert!(table.get(12).is_none());
    }
}
