//! The mock driver's logic: the watched scenario, the per-process state machine of the
//! checkpoint API (kept in `cuda-state.json`, shared across processes), and the freezer checks
//! that make a lock of a frozen process wait.

use gpushare_fake_driver::checkpoint::{self, CheckpointState};
use gpushare_fake_driver::cuda::{
    CHECKPOINT_API_VERSION, CudaProcess, InjectedError, ProcessState, code,
};
use gpushare_fake_driver::scenario::{ENV_VAR, Refresh, Scenario, WatchedScenario};
use gpushare_fake_driver::statefile;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Whether `cuInit` succeeded in this process.
static INITIALIZED: AtomicBool = AtomicBool::new(false);
static WATCHED: Mutex<Option<WatchedScenario>> = Mutex::new(None);
/// How often a waiting lock looks at the process again.
const LOCK_POLL: Duration = Duration::from_millis(10);

/// One line on stderr; never panics.
pub fn say(message: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "gpushare-fake-cuda: {message}");
}

/// The current scenario and its path. No env var, or no good version of the file ever:
/// `Err(())` (reported on stderr).
pub fn scenario() -> Result<(Arc<Scenario>, PathBuf), ()> {
    let path = match std::env::var_os(ENV_VAR) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            say(&format!(
                "{ENV_VAR} is not set: behaving as if no NVIDIA GPU were present"
            ));
            return Err(());
        }
    };
    let mut guard = WATCHED.lock().unwrap_or_else(PoisonError::into_inner);
    let watched = match &mut *guard {
        Some(w) if w.path() == path => w,
        slot => slot.insert(WatchedScenario::new(path.clone())),
    };
    if let Refresh::Failed(e) = watched.refresh() {
        if watched.current().is_some() {
            say(&format!("{e} (keeping the last good scenario)"));
        } else {
            say(&e.to_string());
        }
    }
    watched.current().cloned().map(|s| (s, path)).ok_or(())
}

pub fn set_initialized() {
    INITIALIZED.store(true, Ordering::SeqCst);
}

/// What one checkpoint call works with.
pub struct Ctx {
    pub scenario: Arc<Scenario>,
    pub path: PathBuf,
    pub pid: u32,
    pub knobs: CudaProcess,
}

/// The checks every `cuCheckpointProcess*` call makes, in this order: a usable scenario
/// (NOT_INITIALIZED), a driver that has the API (NOT_SUPPORTED), the forced `cuda.fail` code, a
/// pid the scenario lists as a GPU process (INVALID_VALUE, the real driver's answer for a
/// process without CUDA).
pub fn checkpoint_ctx(fn_name: &str, pid: i32) -> Result<Ctx, u32> {
    let (scenario, path) = scenario().map_err(|()| code::ERROR_NOT_INITIALIZED)?;
    if !scenario.driver_loaded {
        return Err(code::ERROR_NOT_INITIALIZED);
    }
    if scenario.cuda_driver_version < CHECKPOINT_API_VERSION {
        return Err(code::ERROR_NOT_SUPPORTED);
    }
    if let Some(c) = scenario.cuda.fail.get(fn_name) {
        return Err(c.get());
    }
    let pid = u32::try_from(pid)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(code::ERROR_INVALID_VALUE)?;
    if !scenario.gpu_pids().contains(&pid) && !kept(&path, pid) {
        return Err(code::ERROR_INVALID_VALUE);
    }
    let knobs = scenario.cuda.process(pid);
    Ok(Ctx {
        scenario,
        path,
        pid,
        knobs,
    })
}

impl Ctx {
    /// The state of the pid now.
    pub fn state(&self) -> Result<ProcessState, u32> {
        checkpoint::read(&self.path)
            .map(|s| s.state(self.pid))
            .map_err(|e| {
                say(&e);
                code::ERROR_UNKNOWN
            })
    }

    /// Moves the pid from `from` to `to` atomically (ILLEGAL_STATE when it is not in `from`);
    /// entries of pids the scenario no longer lists and that no longer run are dropped on the
    /// way. A restore (CHECKPOINTED -> LOCKED) remembers the process as restored with a live
    /// context, a checkpoint forgets that, and a remembered process found gone is recorded as a
    /// host hang (cuda-checkpoint #53; see `gpushare_fake_driver::checkpoint`).
    pub fn transition(&self, from: ProcessState, to: ProcessState) -> Result<(), u32> {
        let known = self.scenario.gpu_pids();
        statefile::update(
            &checkpoint::path_for(&self.path),
            |s: &mut CheckpointState| {
                // A restored process killed with a live context hangs the host (#53).
                if s.sweep() {
                    say("a restored process ended with a live context: host hang recorded (cuda-checkpoint #53)");
                }
                s.processes
                    .retain(|pid, _| known.contains(pid) || live(*pid));
                if s.state(self.pid) != from {
                    return Err(code::ERROR_ILLEGAL_STATE);
                }
                s.set(self.pid, to);
                match (from, to) {
                    (ProcessState::Checkpointed, ProcessState::Locked) => s.mark_restored(self.pid),
                    (_, ProcessState::Checkpointed) => s.mark_checkpointed(self.pid),
                    _ => {}
                }
                Ok(())
            },
        )
        .map_err(|e| {
            say(&e);
            code::ERROR_UNKNOWN
        })?
    }

    /// Fails with ILLEGAL_STATE unless the pid is in `state`.
    pub fn require(&self, state: ProcessState) -> Result<(), u32> {
        if self.state()? == state {
            Ok(())
        } else {
            Err(code::ERROR_ILLEGAL_STATE)
        }
    }
}

/// Whether the driver keeps a state (not running) for `pid`, a live process the scenario no
/// longer lists: a real driver keeps a process's checkpoint while the process lives.
fn kept(path: &std::path::Path, pid: u32) -> bool {
    live(pid) && checkpoint::read(path).is_ok_and(|s| s.state(pid) != ProcessState::Running)
}

/// Whether `/proc/<pid>` exists.
fn live(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// `cuCheckpointProcessLock`: waits while the process cannot answer (its cgroup is frozen, it is
/// stopped or in uninterruptible sleep, or the scenario says `lock_timeout`), up to `timeout_ms`
/// (0: no limit), then locks it; past the timeout CUDA_ERROR_NOT_READY, the process left RUNNING.
pub fn lock(fn_name: &str, pid: i32, timeout_ms: u32) -> Result<(), u32> {
    let started = Instant::now();
    let timeout = Duration::from_millis(u64::from(timeout_ms));
    let mut ctx = checkpoint_ctx(fn_name, pid)?;
    ctx.require(ProcessState::Running)?;
    while ctx.knobs.lock_timeout || blocked_by_freezer(ctx.pid) {
        let elapsed = started.elapsed();
        if timeout_ms != 0 && elapsed >= timeout {
            return Err(code::ERROR_NOT_READY);
        }
        let wait = if timeout_ms == 0 {
            LOCK_POLL
        } else {
            LOCK_POLL.min(timeout - elapsed)
        };
        std::thread::sleep(wait);
        // The scenario may change while we wait (a knob cleared, the process gone).
        ctx = checkpoint_ctx(fn_name, pid)?;
    }
    ctx.transition(ProcessState::Running, ProcessState::Locked)
}

/// The part checkpoint and restore share: the call takes its delay (the process's own, else the
/// scenario's), then fails with the injected error, if any, leaving the process in the error's
/// state (`from`, where it names none).
fn take_time_or_fail(
    ctx: &Ctx,
    from: ProcessState,
    own_delay_ms: Option<u64>,
    delay_ms: u64,
    error: Option<InjectedError>,
) -> Result<(), u32> {
    std::thread::sleep(Duration::from_millis(own_delay_ms.unwrap_or(delay_ms)));
    if let Some(e) = error {
        ctx.transition(from, e.state.unwrap_or(from))?;
        return Err(e.code.get());
    }
    Ok(())
}

/// `cuCheckpointProcessCheckpoint`.
pub fn checkpoint(ctx: &Ctx) -> Result<(), u32> {
    ctx.require(ProcessState::Locked)?;
    take_time_or_fail(
        ctx,
        ProcessState::Locked,
        ctx.knobs.checkpoint_delay_ms,
        ctx.scenario.cuda.checkpoint_delay_ms,
        ctx.knobs.checkpoint_error,
    )?;
    ctx.transition(ProcessState::Locked, ProcessState::Checkpointed)
}

/// `cuCheckpointProcessRestore`: needs `cuInit` in the caller (or `persistence_mode`), and room
/// on every GPU the process used (CUDA_ERROR_OUT_OF_MEMORY otherwise, the process left
/// CHECKPOINTED, or in `cuda.out_of_memory_state`).
pub fn restore(ctx: &Ctx) -> Result<(), u32> {
    ctx.require(ProcessState::Checkpointed)?;
    if !INITIALIZED.load(Ordering::SeqCst) && !ctx.scenario.cuda.persistence_mode {
        return Err(code::ERROR_NOT_INITIALIZED);
    }
    take_time_or_fail(
        ctx,
        ProcessState::Checkpointed,
        ctx.knobs.restore_delay_ms,
        ctx.scenario.cuda.restore_delay_ms,
        ctx.knobs.restore_error,
    )?;
    let states = checkpoint::read(&ctx.path).map_err(|e| {
        say(&e);
        code::ERROR_UNKNOWN
    })?;
    let now = Scenario {
        hidden_pids: ctx.scenario.hidden_when_checkpointed(states.checkpointed()),
        ..(*ctx.scenario).clone()
    };
    for (index, bytes) in ctx.scenario.process_memory(ctx.pid) {
        if now.memory(index).free < bytes {
            if let Some(to) = ctx.scenario.cuda.out_of_memory_state {
                ctx.transition(ProcessState::Checkpointed, to)?;
            }
            return Err(code::ERROR_OUT_OF_MEMORY);
        }
    }
    ctx.transition(ProcessState::Checkpointed, ProcessState::Locked)
}

/// Whether `pid` cannot answer a lock now: its task is stopped ('T', 't') or in uninterruptible
/// sleep ('D', where the v1 freezer parks tasks), its cgroup v2 group is frozen (`frozen 1` in
/// `cgroup.events`, which also reflects frozen ancestors), or its v1 freezer group is FROZEN or
/// FREEZING. A pid without a /proc entry (a scenario-only process) is never blocked.
pub fn blocked_by_freezer(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let task_state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    if matches!(task_state, Some('T' | 't' | 'D')) {
        return true;
    }
    let Ok(cgroups) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(rel)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let rel = rel.trim_start_matches('/');
        if controllers.is_empty() {
            if let Some(root) = mount_of("cgroup2", None) {
                let events = std::fs::read_to_string(root.join(rel).join("cgroup.events"));
                if events.is_ok_and(|t| t.lines().any(|l| l.trim() == "frozen 1")) {
                    return true;
                }
            }
        } else if controllers.split(',').any(|c| c == "freezer")
            && let Some(root) = mount_of("cgroup", Some("freezer"))
        {
            let state = std::fs::read_to_string(root.join(rel).join("freezer.state"));
            if state.is_ok_and(|t| matches!(t.trim(), "FROZEN" | "FREEZING")) {
                return true;
            }
        }
    }
    false
}

/// Mount point of the hierarchy of type `fstype` (with `option` among its super options, for
/// v1 controllers) whose root is `/`.
fn mount_of(fstype: &str, option: Option<&str>) -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut r = right.split_whitespace();
            (r.next()? == fstype).then_some(())?;
            let super_opts = r.nth(1).unwrap_or("");
            if let Some(o) = option
                && !super_opts.split(',').any(|s| s == o)
            {
                return None;
            }
            let mut f = left.split_whitespace();
            (f.nth(3)? == "/").then_some(())?;
            f.next().map(PathBuf::from)
        })
        .min_by_key(|p| p.as_os_str().len())
}
