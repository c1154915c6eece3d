//! The checkpoint worker under the `suspend` and `resume` executors ([`super::suspension`]): CUDA
//! checkpoint (see [`crate::cuda`] and docs/suspend.md) on a worker thread, never on the event loop.
//!
//! **Suspend**, in the only order a real driver tolerates: thaw the root group if an earlier step
//! froze it (a frozen process cannot answer the lock), lock every GPU process of the workload
//! (each with a timeout) while it runs, checkpoint each (its GPU memory moves to host memory and
//! the GPU is released), then freeze the root group. A process the driver says has no CUDA state
//! (an NVML client such as `nvidia-smi` or a metrics sidecar, a process still in its `cuInit`)
//! holds no GPU memory to move: it is not locked, and the freeze of the root stops it; the
//! workload is suspended when each of its CUDA processes is. Before each lock, checkpoint,
//! restore and unlock the process's pidfd is checked (the one attribution holds since it verified
//! the process, or one opened at the start of the job whose process had the recorded start
//! time): a process that exited is skipped, and a pid is never acted on once it may name another
//! process. Any failure is undone before the job ends:
//! what was checkpointed is restored, what was locked is unlocked, and a group an earlier step had
//! frozen is frozen again; the step then falls through with its cause. **Resume**: thaw, restore
//! each checkpointed process, unlock each locked one; a failed restore (no room on the GPU) leaves
//! the workload suspended and frozen, to be retried.
//!
//! Before a suspend starts, the host memory the checkpoint needs (the workload's GPU footprint)
//! must fit both the container's memory limit (`memory.max - memory.current` of its v2 group, or
//! `memory.limit_in_bytes - memory.usage_in_bytes` of its v1 memory group) and the node
//! (`MemAvailable`); else the step falls through at once (`host_memory`).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use log::{info, warn};

use super::{Target, freeze, freeze::Freezer};
use crate::{
    attribution::{Pidfd, procinfo},
    cuda::{Checkpointer, CudaError, ErrorKind, ProcessState},
    policy::GroupState,
};

/// A process a job acts on, pinned by a pidfd: its pid names it while the pidfd has not exited.
pub(super) struct PinnedProcess {
    pub(super) pid: u32,
    fd: Pidfd,
}

impl PinnedProcess {
    /// The target pinned: by the pidfd attribution holds, or by one opened now whose process has
    /// the recorded start time. `None`: gone, or the pid names another process now.
    pub(super) fn of(t: &Target) -> Option<Self> {
        let pid = t.identity.pid;
        let fd = match &t.pidfd {
            Some(fd) => fd.clone(),
            None => {
                let fd = Pidfd::open(pid).ok()?;
                // Checked after the open: the pidfd pins whatever had the pid then.
                procinfo::is_same_process(t.identity).then_some(fd)?
            }
        };
        (!fd.has_exited()).then_some(Self { pid, fd })
    }

    /// The check before each driver call: the process has not exited, so its pid is its own.
    pub(super) fn alive(&self) -> bool {
        !self.fd.has_exited()
    }
}

/// How long each process's lock may wait.
pub const LOCK_TIMEOUT_MS: u32 = 5_000;
/// How long a worker waits for a thaw or freeze it asked for to settle.
const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Why a suspend fell through, as the metric's `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// No driver with the checkpoint API.
    Unavailable,
    /// The checkpoint would not fit the container's memory limit or the node.
    HostMemory,
    /// A process could not be locked in time.
    LockTimeout,
    /// The driver cannot checkpoint a process (UVM or IPC memory, ...).
    NotSupported,
    /// A process is in the driver's failed state.
    FailedState,
    /// Any other error.
    Error,
}

impl Cause {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unavailable => "unavailable",
            Self::HostMemory => "host_memory",
            Self::LockTimeout => "lock_timeout",
            Self::NotSupported => "not_supported",
            Self::FailedState => "failed_state",
            Self::Error => "error",
        }
    }

    fn of(e: &CudaError) -> Self {
        match e.kind() {
            ErrorKind::LockTimeout => Self::LockTimeout,
            ErrorKind::NotSupported => Self::NotSupported,
            ErrorKind::IllegalState => Self::FailedState,
            _ => Self::Error,
        }
    }
}

/// What a worker did.
#[derive(Debug)]
pub enum JobResult {
    /// Suspended: every process checkpointed, the group frozen (or asked to be).
    Suspended {
        /// How long it took.
        took: Duration,
    },
    /// The suspend failed and was undone.
    SuspendFailed {
        /// Why, for the metric.
        cause: Cause,
        /// In words.
        reason: String,
        /// Whether the group is frozen again (an earlier step had frozen it).
        refrozen: bool,
    },
    /// Resumed: thawed, restored, unlocked.
    Resumed {
        /// How long it took.
        took: Duration,
    },
    /// The resume failed; still suspended (frozen again).
    ResumeFailed {
        /// In words.
        reason: String,
    },
}

/// One suspend or resume on its worker thread.
pub struct Job {
    /// A resume.
    pub resuming: bool,
    /// The GPU memory moved, bytes per GPU index.
    pub per_gpu: BTreeMap<u32, u64>,
    /// When it started.
    pub started: Instant,
    rx: mpsc::Receiver<JobResult>,
}

impl Job {
    /// Runs `work` on a worker thread of its own (`gpushare-suspend` or `gpushare-resume`).
    fn start(
        resuming: bool,
        per_gpu: BTreeMap<u32, u64>,
        work: impl FnOnce() -> JobResult + Send + 'static,
    ) -> Self {
        let what = if resuming { "resume" } else { "suspend" };
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("gpushare-{what}"))
            .spawn(move || {
                let _ = tx.send(work());
            })
            .map_err(|e| warn!("cannot start the {what} worker: {e}"))
            .ok();
        Self {
            resuming,
            per_gpu,
            started: Instant::now(),
            rx,
        }
    }

    /// The result, once the worker is done.
    pub fn poll(&self) -> Option<JobResult> {
        match self.rx.try_recv() {
            Ok(r) => Some(r),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(JobResult::SuspendFailed {
                cause: Cause::Error,
                reason: "the worker thread ended without a result".into(),
                refrozen: false,
            }),
        }
    }

    /// Waits for the result (shutdown).
    pub fn wait(self) -> Option<JobResult> {
        self.rx.recv().ok()
    }
}

/// Host memory a checkpoint of `bytes` may use for the group at `dir` (v2) or, where its v2 group
/// has no memory controller, the v1 memory group of `pid`; `Ok(())` when it fits.
pub fn check_host_memory(dir: &Path, pid: Option<u32>, bytes: u64) -> Result<(), String> {
    let node = meminfo_available().unwrap_or(u64::MAX);
    let container = container_room(dir, pid);
    let room = container.as_ref().map_or(node, |(c, _)| (*c).min(node));
    if bytes <= room {
        return Ok(());
    }
    let what = match container {
        Some((c, why)) if c < node => format!("{} left under {why}", human(c)),
        _ => format!("{} available on the node", human(node)),
    };
    Err(format!(
        "the checkpoint needs {} of host memory and only {what}",
        human(bytes)
    ))
}

fn human(b: u64) -> String {
    crate::quota::ByteSize(b).approx()
}

fn read_u64(path: &Path) -> Option<u64> {
    let t = std::fs::read_to_string(path).ok()?;
    let t = t.trim();
    if t == "max" {
        return Some(u64::MAX);
    }
    t.parse().ok()
}

/// (room, which limit) of the workload's memory cgroup, if it has a limit.
fn container_room(dir: &Path, pid: Option<u32>) -> Option<(u64, String)> {
    if let (Some(max), Some(cur)) = (
        read_u64(&dir.join("memory.max")),
        read_u64(&dir.join("memory.current")),
    ) && max != u64::MAX
    {
        return Some((
            max.saturating_sub(cur),
            format!("the container's memory.max ({})", human(max)),
        ));
    }
    let path = super::v1::v1_group_of(pid?, "memory").ok()?;
    let root = freeze::v1_root("memory")?;
    let group = crate::sys::kernel_text::under(&root, &path);
    let limit = read_u64(&group.join("memory.limit_in_bytes"))?;
    let usage = read_u64(&group.join("memory.usage_in_bytes"))?;
    // cgroup v1 reports "no limit" as a page-rounded i64::MAX.
    (limit < (1 << 62)).then(|| {
        (
            limit.saturating_sub(usage),
            format!("the container's memory limit ({})", human(limit)),
        )
    })
}

fn meminfo_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines().find_map(|l| {
        let kb: u64 = l
            .strip_prefix("MemAvailable:")?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    })
}

/// Asks for a freeze or thaw and waits (on a worker thread) until the kernel shows it.
pub(super) fn settle(dir: &Path, freezer: Freezer, frozen: bool) -> Result<(), String> {
    freeze::request(dir, freezer, frozen).map_err(|e| format!("{e:#}"))?;
    let want = if frozen {
        GroupState::Frozen
    } else {
        GroupState::Thawed
    };
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        match freeze::state(dir, freezer) {
            Ok(s) if s == want => return Ok(()),
            Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(s) => {
                return Err(format!(
                    "{} still {s:?} after {SETTLE_WAIT:?}",
                    dir.display()
                ));
            }
            Err(e) => return Err(format!("{e:#}")),
        }
    }
}

/// Starts a suspend of the workload whose root group is `dir`: see the module note.
pub fn start_suspend(
    cuda: Arc<Checkpointer>,
    dir: PathBuf,
    freezer: Freezer,
    was_frozen: bool,
    targets: Vec<Target>,
    per_gpu: BTreeMap<u32, u64>,
) -> Job {
    Job::start(false, per_gpu, move || {
        suspend(&cuda, &dir, freezer, was_frozen, &targets)
    })
}

fn suspend(
    cuda: &Checkpointer,
    dir: &Path,
    freezer: Freezer,
    was_frozen: bool,
    targets: &[Target],
) -> JobResult {
    let t0 = Instant::now();
    let fail = |cause: Cause, reason: String| {
        let refrozen = was_frozen && settle(dir, freezer, true).is_ok();
        JobResult::SuspendFailed {
            cause,
            reason,
            refrozen,
        }
    };
    if was_frozen && let Err(e) = settle(dir, freezer, false) {
        return fail(
            Cause::Error,
            format!("cannot thaw it to lock its processes: {e}"),
        );
    }
    let pinned: Vec<PinnedProcess> = targets.iter().filter_map(PinnedProcess::of).collect();
    let mut locked: Vec<&PinnedProcess> = Vec::new();
    let mut without_cuda: Vec<u32> = Vec::new();
    for p in &pinned {
        if !p.alive() {
            continue;
        }
        match cuda.lock(p.pid, LOCK_TIMEOUT_MS) {
            Ok(()) => locked.push(p),
            // Nothing of it on the GPU to move: the freeze of the root stops it.
            Err(e) if e.kind() == ErrorKind::NotACudaProcess => without_cuda.push(p.pid),
            Err(e) => {
                undo(cuda, &[], &locked);
                return fail(Cause::of(&e), format!("lock of pid {}: {e}", p.pid));
            }
        }
    }
    if locked.is_empty() {
        return fail(
            Cause::Error,
            format!(
                "none of its processes has CUDA state to checkpoint (pids {without_cuda:?}: \
                 the driver says they have none)"
            ),
        );
    }
    if !without_cuda.is_empty() {
        info!(
            "pid(s) {without_cuda:?} of {} have no CUDA state: not locked; the freeze of the \
             group stops them",
            dir.display()
        );
    }
    let mut checkpointed: Vec<&PinnedProcess> = Vec::new();
    for (i, &p) in locked.iter().enumerate() {
        if !p.alive() {
            continue; // exited while locked: its GPU memory is gone with it
        }
        if let Err(e) = cuda.checkpoint(p.pid) {
            undo(cuda, &checkpointed, &locked[i..]);
            return fail(Cause::of(&e), format!("checkpoint of pid {}: {e}", p.pid));
        }
        checkpointed.push(p);
    }
    crate::crash::point("suspend-checkpointed");
    if let Err(e) = settle(dir, freezer, true) {
        // The GPU memory is released already; the step observes the group and retries the freeze.
        warn!("suspended, but the freeze did not settle: {e}");
    }
    crate::crash::point("suspend-frozen");
    JobResult::Suspended { took: t0.elapsed() }
}

/// Puts processes back as they were: restores and unlocks the checkpointed ones, unlocks the
/// locked ones. Errors are logged: there is nothing else to fall back to.
fn undo(cuda: &Checkpointer, checkpointed: &[&PinnedProcess], locked: &[&PinnedProcess]) {
    for p in checkpointed {
        if p.alive()
            && let Err(e) = cuda.restore(p.pid)
        {
            warn!("undoing a failed suspend: restore of pid {}: {e}", p.pid);
        }
        if p.alive()
            && let Err(e) = cuda.unlock(p.pid)
        {
            warn!("undoing a failed suspend: unlock of pid {}: {e}", p.pid);
        }
    }
    for p in locked {
        if p.alive()
            && let Err(e) = cuda.unlock(p.pid)
        {
            warn!("undoing a failed suspend: unlock of pid {}: {e}", p.pid);
        }
    }
}

/// Starts a resume of the workload whose root group is `dir` and whose suspended processes are
/// `targets`.
pub fn start_resume(
    cuda: Arc<Checkpointer>,
    dir: PathBuf,
    freezer: Freezer,
    targets: Vec<Target>,
    per_gpu: BTreeMap<u32, u64>,
) -> Job {
    Job::start(true, per_gpu, move || {
        resume(&cuda, &dir, freezer, &targets)
    })
}

/// Resumes on the calling thread (shutdown, `thaw --all`: no event loop waits on it).
pub fn resume_now(
    cuda: &Checkpointer,
    dir: &Path,
    freezer: Freezer,
    targets: &[Target],
) -> JobResult {
    resume(cuda, dir, freezer, targets)
}

fn resume(cuda: &Checkpointer, dir: &Path, freezer: Freezer, targets: &[Target]) -> JobResult {
    let t0 = Instant::now();
    let pinned: Vec<PinnedProcess> = targets.iter().filter_map(PinnedProcess::of).collect();
    if dir.exists()
        && let Err(e) = settle(dir, freezer, false)
    {
        return JobResult::ResumeFailed {
            reason: format!("cannot thaw it: {e}"),
        };
    }
    crate::crash::point("resume-thawed");
    let mut errors = Vec::new();
    for p in &pinned {
        let pid = p.pid;
        if !p.alive() {
            continue; // exited: nothing to bring back
        }
        match cuda.state(pid) {
            Ok(ProcessState::Checkpointed) => {
                if let Err(e) = cuda.restore(pid) {
                    errors.push(format!("restore of pid {pid}: {e}"));
                    continue;
                }
                crate::crash::point("resume-restored");
                if p.alive()
                    && let Err(e) = cuda.unlock(pid)
                {
                    errors.push(format!("unlock of pid {pid}: {e}"));
                }
            }
            Ok(ProcessState::Locked) => {
                if let Err(e) = cuda.unlock(pid) {
                    errors.push(format!("unlock of pid {pid}: {e}"));
                }
            }
            Ok(_) => {}
            // The process is gone (or never had CUDA): nothing to bring back.
            Err(e) if e.kind() == ErrorKind::NotACudaProcess => {}
            Err(e) => errors.push(format!("state of pid {pid}: {e}")),
        }
    }
    if errors.is_empty() {
        info!(
            "resumed {} ({} process(es)) in {:?}",
            dir.display(),
            pinned.len(),
            t0.elapsed()
        );
        return JobResult::Resumed { took: t0.elapsed() };
    }
    // Still suspended: keep it frozen until the next attempt.
    if dir.exists() {
        let _ = settle(dir, freezer, true);
    }
    JobResult::ResumeFailed {
        reason: errors.join("; "),
    }
}

/// Whether any of `pids` is still held by the driver (locked or checkpointed): the suspension of
/// an earlier run is real. Pids the driver does not know (gone) do not count.
pub fn any_held(cuda: &Checkpointer, pids: &[u32]) -> bool {
    pids.iter().any(|&p| {
        matches!(
            cuda.state(p),
            Ok(ProcessState::Checkpointed | ProcessState::Locked)
        )
    })
}
