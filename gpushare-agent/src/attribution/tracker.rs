//! The attribution pipeline: kernel programs (when they load) feeding the [`Attribution`] table,
//! or `/proc` alone when they cannot.

use std::fs;

use anyhow::Result;
use gpushare_common::GpuTask;
use log::{info, warn};

use super::{Attribution, CgroupResolver, Change, ReconcileReport, Source, cgroupfs};
use crate::ebpf::{KernelCounters, KernelEvent, KernelPrograms, LoadOptions};

/// How GPU tasks are found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Mode {
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
    mode: Mode,
    scratch: Vec<KernelEvent>,
    counts: Vec<(u32, gpushare_common::IoctlCounts)>,
    undecodable: u64,
}

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
            mode: Mode::Ebpf,
            scratch: Vec::new(),
            counts: Vec::new(),
            undecodable: 0,
        };
        tracker.bootstrap_from_proc();
        tracker
    }

    /// A tracker without eBPF.
    pub fn procfs_only(resolver: CgroupResolver, reason: String) -> Self {
        Self {
            kernel: None,
            table: Attribution::new(resolver),
            mode: Mode::Procfs { reason },
            scratch: Vec::new(),
            counts: Vec::new(),
            undecodable: 0,
        }
    }

    /// How tasks are found.
    pub fn mode(&self) -> &Mode {
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

    /// Drains pending kernel events into the table and returns what changed.
    pub fn poll(&mut self) -> Vec<Change> {
        let Some(kernel) = self.kernel.as_mut() else {
            return Vec::new();
        };
        kernel.flush_logs();
        self.scratch.clear();
        self.undecodable += kernel.drain_events(&mut self.scratch) as u64;
        let mut changes = Vec::with_capacity(self.scratch.len());
        for ev in &self.scratch {
            let change = self.table.apply(ev);
            match change {
                Change::Removed(pid) => kernel.forget_ioctl_counts(pid),
                Change::AllocHint(_) => crate::trace::alloc_event_seen(ev.ktime_boot_ns),
                _ => {}
            }
            if change != Change::None {
                changes.push(change);
            }
        }
        changes
    }

    /// Copies the kernel's per-task ioctl counts into the table (a few batched map reads, not one
    /// per task).
    pub fn refresh_ioctl_counts(&mut self) {
        let Some(kernel) = self.kernel.as_ref() else {
            return;
        };
        kernel.all_ioctl_counts(&mut self.counts);
        for (pid, c) in &self.counts {
            self.table.set_ioctl_counts(*pid, *c);
        }
    }

    /// Reconciles the table with the kernel and `/proc`, and clears kernel state of dead tasks.
    pub fn reconcile(&mut self) -> ReconcileReport {
        let kernel_tasks: Vec<(u32, GpuTask)> = self
            .kernel
            .as_ref()
            .map(|k| k.gpu_tasks())
            .unwrap_or_default();
        let report = self.table.reconcile(&kernel_tasks);
        if let Some(kernel) = self.kernel.as_mut() {
            for pid in report.removed.iter().chain(&report.stale_kernel_entries) {
                kernel.forget_gpu_task(*pid);
            }
            // Counts of tasks nobody tracks any more (exit handled, or never known).
            for pid in kernel.ioctl_count_keys() {
                if self.table.get(pid).is_none() && !kernel_tasks.iter().any(|(t, _)| *t == pid) {
                    kernel.forget_ioctl_counts(pid);
                }
            }
        }
        if !report.removed.is_empty() || !report.added.is_empty() {
            info!(
                "reconciled GPU task table: {} gone without an exit event, {} found without an open event",
                report.removed.len(),
                report.added.len()
            );
        }
        report
    }

    /// Finds processes that already hold an nvidia device open (started before the agent) and
    /// adds them to both tables, so their ioctls are counted from now on.
    pub fn bootstrap_from_proc(&mut self) -> usize {
        let mut found = 0;
        for pid in super::procinfo::all_pids() {
            if !holds_nvidia_fd(pid) || self.table.get(pid).is_some() {
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
}

/// Whether `/proc/<pid>/fd` holds a link to `/dev/nvidia*`.
pub fn holds_nvidia_fd(pid: u32) -> bool {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    entries.flatten().any(|e| {
        fs::read_link(e.path())
            .is_ok_and(|t| t.as_os_str().as_encoded_bytes().starts_with(b"/dev/nvidia"))
    })
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
