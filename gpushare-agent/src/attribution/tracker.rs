//! The attribution pipeline: kernel programs (when they load) feeding the [`Attribution`] table,
//! or `/proc` alone when they cannot.

use std::time::{Duration, Instant};

use anyhow::Result;
use gpushare_common::{EventKind, GPU_OPEN_UNCONFIRMED, GpuTask};
use log::{info, warn};

use super::{
    Attribution, CgroupResolver, Change, ReconcileReport, Source, cgroupfs,
    procinfo::{OpenState, open_state},
};
use crate::ebpf::{KernelCounters, KernelEvent, KernelPrograms, LoadOptions};

/// How GPU tasks are found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum AttributionMode {
    /// eBPF programs loaded: attribution is a map lookup.
    Ebpf,
    /// eBPF unavailable: the pids NVML reports are looked up in `/proc`.
    Procfs {
        /// Why eBPF is not used.
        reason: String,
    },
}

/// Feeds the attribution table.
pub struct Tracker {
    kernel: Option<KernelPrograms>,
    table: Attribution,
    mode: AttributionMode,
    scratch: Vec<KernelEvent>,
    counts: Vec<(u32, gpushare_common::IoctlCounts)>,
    undecodable: u64,
    /// Opens sent on their entry whose result is not known yet: (event, when first checked).
    unconfirmed: Vec<(KernelEvent, Instant)>,
    work: Work,
}

/// What attribution did whose amount a tenant chooses (how many fds it holds, how often it opens
/// a missing node, how many cgroups it makes): typed totals since the start, so tests assert
/// counts instead of times.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Unconfirmed opens checked in `/proc` (probe sets without an exit probe only).
    pub open_checks: u64,
    /// Of those, opens found to have failed (their kernel entries were dropped).
    pub failed_opens: u64,
    /// `/proc/<pid>/fd` entries read: checking opens, reconciling, at start.
    pub fd_entries_read: u64,
    /// cgroup ids resolved by opening the group by its id (one syscall each).
    pub cgroup_id_lookups: u64,
    /// Whole walks of the cgroup hierarchy (to resolve a cgroup id where it cannot be opened).
    pub cgroup_rescans: u64,
    /// Directories those walks read.
    pub cgroup_dirs_walked: u64,
}

impl Work {
    /// (label value, total) pairs, as `gpushare_attribution_work_total{kind}` shows them.
    pub fn pairs(&self) -> [(&'static str, u64); 6] {
        [
            ("open_checks", self.open_checks),
            ("failed_opens", self.failed_opens),
            ("fd_entries_read", self.fd_entries_read),
            ("cgroup_id_lookups", self.cgroup_id_lookups),
            ("cgroup_rescans", self.cgroup_rescans),
            ("cgroup_dirs_walked", self.cgroup_dirs_walked),
        ]
    }
}

/// How long a thread that keeps running after an unconfirmed open is waited for before its fds
/// alone decide (a thread blocked in the open is waited for as long as it stays there).
const RUNNING_OPEN_WAIT: Duration = Duration::from_secs(10);

impl Tracker {
    /// Loads the eBPF programs; on failure falls back to `/proc` and says so once, clearly.
    /// `disable_ebpf` forces the fallback.
    pub fn start(opts: &LoadOptions, disable_ebpf: bool) -> Result<Self> {
        let root = cgroupfs::find_cgroup2_mount()?;
        let resolver = CgroupResolver::new(root);
        if disable_ebpf {
            return Ok(Self::procfs_only(resolver, "disabled by --no-ebpf".into()));
        }
        match KernelPrograms::load(opts) {
            Ok(kernel) => Ok(Self::with_kernel(kernel, resolver)),
            Err(e) => {
                let reason = format!("{e:#}");
                warn!(
                    "eBPF programs could not be loaded ({reason}); FALLING BACK to /proc: GPU \
                     processes are attributed when NVML reports them, new GPU processes and \
                     allocation ioctls are not seen between samples, ioctls are not counted"
                );
                Ok(Self::procfs_only(resolver, reason))
            }
        }
    }

    /// A tracker over loaded programs.
    pub fn with_kernel(kernel: KernelPrograms, resolver: CgroupResolver) -> Self {
        let mut tracker = Self {
            kernel: Some(kernel),
            table: Attribution::new(resolver),
            mode: AttributionMode::Ebpf,
            scratch: Vec::new(),
            counts: Vec::new(),
            undecodable: 0,
            unconfirmed: Vec::new(),
            work: Work::default(),
        };
        tracker.bootstrap_from_proc();
        tracker
    }

    /// A tracker without eBPF.
    pub fn procfs_only(resolver: CgroupResolver, reason: String) -> Self {
        Self {
            kernel: None,
            table: Attribution::new(resolver),
            mode: AttributionMode::Procfs { reason },
            scratch: Vec::new(),
            counts: Vec::new(),
            undecodable: 0,
            unconfirmed: Vec::new(),
            work: Work::default(),
        }
    }

    /// How tasks are found.
    pub fn mode(&self) -> &AttributionMode {
        &self.mode
    }

    /// The table.
    pub fn table(&self) -> &Attribution {
        &self.table
    }

    /// The table, mutable (for `/proc` lookups of NVML-reported pids).
    pub fn table_mut(&mut self) -> &mut Attribution {
        &mut self.table
    }

    /// The kernel programs, when loaded.
    pub fn kernel(&self) -> Option<&KernelPrograms> {
        self.kernel.as_ref()
    }

    /// The kernel programs, mutable.
    pub fn kernel_mut(&mut self) -> Option<&mut KernelPrograms> {
        self.kernel.as_mut()
    }

    /// Ring-buffer records that failed to decode.
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// The kernel's drop counters (zero without eBPF).
    pub fn kernel_counters(&self) -> KernelCounters {
        self.kernel
            .as_ref()
            .map(|k| k.counters())
            .unwrap_or_default()
    }

    /// Cgroups removed on the host since the programs were loaded (`None`: not counted, e.g.
    /// without eBPF).
    pub fn cgroups_removed(&self) -> Option<u64> {
        self.kernel.as_ref().and_then(|k| k.cgroups_removed())
    }

    /// Opens of nvidia nodes that turned out to have failed (their kernel entries were dropped).
    pub fn failed_opens(&self) -> u64 {
        self.work.failed_opens
    }

    /// What attribution did, in totals a tenant's choices size.
    pub fn work(&self) -> Work {
        let resolver = self.table.resolver();
        Work {
            cgroup_id_lookups: resolver.handle_lookups(),
            cgroup_rescans: resolver.rescans(),
            cgroup_dirs_walked: resolver.dirs_walked(),
            ..self.work
        }
    }

    /// How many kernel events the last [`Self::poll`] drained.
    pub fn last_drained(&self) -> usize {
        self.scratch.len()
    }

    /// When the oldest event the last [`Self::poll`] drained that the kernel sends with a wake-up
    /// (a new GPU task's open, an allocation) fired (CLOCK_BOOTTIME ns).
    pub fn last_drained_prompt_boot_ns(&self) -> Option<u64> {
        self.scratch
            .iter()
            .filter(|e| matches!(e.kind, EventKind::GpuOpen | EventKind::AllocIoctl))
            .map(|e| e.ktime_boot_ns)
            .min()
    }

    /// Drains pending kernel events into the table and returns what changed. An open sent on its
    /// entry is taken only once its result is known (checked now and at each later poll).
    pub fn poll(&mut self) -> Vec<Change> {
        let Some(kernel) = self.kernel.as_mut() else {
            return Vec::new();
        };
        kernel.flush_logs();
        self.scratch.clear();
        self.undecodable += kernel.drain_events(&mut self.scratch) as u64;
        let mut changes = Vec::with_capacity(self.scratch.len());
        let events = std::mem::take(&mut self.scratch);
        for ev in &events {
            if ev.kind == EventKind::GpuOpen && ev.arg & GPU_OPEN_UNCONFIRMED != 0 {
                if self.table.get(ev.tgid).is_none()
                    && !self.unconfirmed.iter().any(|(e, _)| e.tgid == ev.tgid)
                {
                    self.unconfirmed.push((ev.clone(), Instant::now()));
                }
                continue;
            }
            if ev.kind == EventKind::GpuExit {
                self.unconfirmed.retain(|(e, _)| e.tgid != ev.tgid);
            }
            self.apply(ev, &mut changes);
        }
        self.scratch = events;
        self.check_unconfirmed(&mut changes);
        changes
    }

    fn apply(&mut self, ev: &KernelEvent, changes: &mut Vec<Change>) {
        let change = self.table.apply(ev);
        match change {
            Change::Removed(pid) => {
                if let Some(k) = self.kernel.as_mut() {
                    k.forget_ioctl_counts(pid)
                }
            }
            Change::AllocHint(_) => crate::trace::alloc_event_seen(ev.ktime_boot_ns),
            _ => {}
        }
        if change != Change::None {
            changes.push(change);
        }
    }

    /// Decides the unconfirmed opens whose result is known: a held nvidia fd makes a GPU task; a
    /// failed open's kernel entry is dropped, then the fds are looked at once more, since another
    /// open may have been entered while the entry still stood (it then sent nothing).
    fn check_unconfirmed(&mut self, changes: &mut Vec<Change>) {
        let pending = std::mem::take(&mut self.unconfirmed);
        for (ev, since) in pending {
            let tid = (ev.arg & 0xffff_ffff) as u32;
            let waited_enough = since.elapsed() >= RUNNING_OPEN_WAIT;
            self.work.open_checks += 1;
            let fds = &mut self.work.fd_entries_read;
            let mut state = open_state(ev.tgid, tid, waited_enough, fds);
            if state == OpenState::Failed
                && let Some(kernel) = self.kernel.as_mut()
            {
                kernel.forget_gpu_task(ev.tgid);
                state = open_state(ev.tgid, tid, true, fds);
                if state != OpenState::Failed {
                    // Put the entry back: the task's ioctls count again.
                    kernel.track_task(ev.tgid, ev.cgroup_id, &ev.comm);
                }
            }
            match state {
                OpenState::Opened => {
                    let confirmed = KernelEvent {
                        arg: 0,
                        ..ev.clone()
                    };
                    self.apply(&confirmed, changes);
                }
                OpenState::InProgress => self.unconfirmed.push((ev, since)),
                OpenState::Failed => {
                    self.work.failed_opens += 1;
                    log::debug!("GPU task {}: its nvidia open failed", ev.tgid);
                }
            }
        }
    }

    /// Copies the kernel's per-task ioctl counts into the table (a few batched map reads, not one
    /// per task).
    pub fn refresh_ioctl_counts(&mut self) {
        let Some(kernel) = self.kernel.as_mut() else {
            return;
        };
        kernel.all_ioctl_counts(&mut self.counts);
        for (pid, c) in &self.counts {
            self.table.set_ioctl_counts(*pid, *c);
        }
    }

    /// Reconciles the table with the kernel and `/proc`, and clears kernel state of dead tasks.
    pub fn reconcile(&mut self) -> ReconcileReport {
        let mut kernel_tasks: Vec<(u32, GpuTask)> = self
            .kernel
            .as_ref()
            .map(|k| k.gpu_tasks())
            .unwrap_or_default();
        // Entries the table does not know may be opens sent on their entry whose event was lost:
        // only a process holding an nvidia fd (or whose open is still being decided) counts.
        // Where an exit probe confirms opens, an entry is itself the proof of one that succeeded.
        let mut not_gpu = Vec::new();
        let unconfirmed_opens = self
            .kernel
            .as_ref()
            .is_some_and(|k| k.sends_unconfirmed_opens());
        let fds = &mut self.work.fd_entries_read;
        kernel_tasks.retain(|(tgid, _)| {
            if self.table.get(*tgid).is_some() || !unconfirmed_opens || holds_nvidia_fd(*tgid, fds)
            {
                return true;
            }
            if !self.unconfirmed.iter().any(|(e, _)| e.tgid == *tgid) {
                not_gpu.push(*tgid);
            }
            false
        });
        let mut report = self.table.reconcile(&kernel_tasks);
        report.stale_kernel_entries.extend(not_gpu);
        if self.kernel.is_none() {
            report.moved = self.table.follow_moves();
        }
        if let Some(kernel) = self.kernel.as_mut() {
            for pid in report.removed.iter().chain(&report.stale_kernel_entries) {
                kernel.forget_gpu_task(*pid);
            }
            // Counts of tasks nobody tracks any more (exit handled, or never known).
            let in_kernel: std::collections::HashSet<u32> =
                kernel_tasks.iter().map(|(t, _)| *t).collect();
            kernel.all_ioctl_counts(&mut self.counts);
            for &(pid, _) in &self.counts {
                if self.table.get(pid).is_none()
                    && !in_kernel.contains(&pid)
                    && !self.unconfirmed.iter().any(|(e, _)| e.tgid == pid)
                {
                    kernel.forget_ioctl_counts(pid);
                }
            }
        }
        if !report.removed.is_empty() || !report.added.is_empty() || !report.moved.is_empty() {
            info!(
                "reconciled GPU task table: {} gone without an exit event, {} found without an open event, {} moved to another group",
                report.removed.len(),
                report.added.len(),
                report.moved.len()
            );
        }
        report
    }

    /// Finds processes that already hold an nvidia device open (started before the agent) and
    /// adds them to both tables, so their ioctls are counted from now on.
    pub fn bootstrap_from_proc(&mut self) -> usize {
        let mut found = 0;
        for pid in super::procinfo::all_pids() {
            if self.table.get(pid).is_some()
                || !holds_nvidia_fd(pid, &mut self.work.fd_entries_read)
            {
                continue;
            }
            let Some(entry) = self.table.attribute_pid(pid).cloned() else {
                continue;
            };
            found += 1;
            if let Some(kernel) = self.kernel.as_mut() {
                kernel.track_task(pid, entry.cgroup_id, &entry.comm);
            }
        }
        if found > 0 {
            info!("found {found} GPU processes that started before the agent");
        }
        found
    }

    /// Adds the processes `ids` (pid and start time, checked: a reused pid is not taken) to both
    /// tables, where they still run and are not tracked yet; how many were added. For the
    /// processes of a suspension an earlier run recorded: a checkpointed process holds no device
    /// and NVML lists none of it, so neither the kernel, `/proc`'s fds nor a sample brings it back,
    /// and without it its workload would look gone (and be resumed at once).
    pub fn track_processes(&mut self, ids: &[super::ProcessIdentity]) -> usize {
        let mut found = 0;
        for id in ids {
            if self.table.get(id.pid).is_some() || !super::procinfo::is_same_process(*id) {
                continue;
            }
            let Some(entry) = self.table.attribute_pid(id.pid).cloned() else {
                continue;
            };
            if entry.identity != *id {
                continue; // replaced between the two reads
            }
            found += 1;
            if let Some(kernel) = self.kernel.as_mut() {
                kernel.track_task(id.pid, entry.cgroup_id, &entry.comm);
            }
        }
        found
    }
}

/// Whether `/proc/<pid>/fd` holds a link to `/dev/nvidia*`; adds the entries read to `fd_entries`.
pub fn holds_nvidia_fd(pid: u32, fd_entries: &mut u64) -> bool {
    super::procinfo::holds_nvidia_fd_in(&format!("/proc/{pid}/fd"), fd_entries)
}

impl Source {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::Reconciled => "reconciled",
            Self::Procfs => "procfs",
        }
    }
}
