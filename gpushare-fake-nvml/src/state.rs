//! Process-global state: the init reference count, the watched scenario file, the watched
//! checkpoint states of the mock libcuda (`cuda-state.json` beside the scenario), and the
//! per-device progress of the simulated process-list growth.

use crate::codes;
use crate::handles::{self, DeviceSlot};
use crate::scenario::{ENV_VAR, Process, Refresh, Scenario, WatchedScenario};
use gpushare_fake_driver::checkpoint::{self, CheckpointState};
use gpushare_fake_driver::statefile::Watched;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Which process list a call asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessKind {
    Compute = 0,
    Graphics = 1,
    /// The compute processes an MPS server serves (no simulated growth).
    Mps = 2,
}

/// `process_list_growth` progress of one (device, list): armed until a call answers
/// INSUFFICIENT_SIZE, then the next call sees the grown list, then spent until the scenario
/// changes or a new session starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Growth {
    Armed,
    Pending,
    Spent,
}

/// The scenario as the last call saw it, with the checkpointed pids it hid.
type Effective = (Arc<Scenario>, BTreeSet<u32>, Arc<Scenario>);

struct State {
    refcount: u32,
    watched: Option<WatchedScenario>,
    checkpoints: Option<Watched<CheckpointState>>,
    effective: Option<Effective>,
    growth: Vec<[Growth; 2]>,
}

static STATE: Mutex<State> = Mutex::new(State {
    refcount: 0,
    watched: None,
    checkpoints: None,
    effective: None,
    growth: Vec::new(),
});

fn lock() -> MutexGuard<'static, State> {
    // A panic inside a call is caught at the boundary; the state stays usable.
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One line on stderr; never panics (a closed or broken stderr is ignored).
fn say(message: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "gpushare-fake-nvml: {message}");
}

impl State {
    fn reset_growth(&mut self) {
        let n = self
            .watched
            .as_ref()
            .and_then(|w| w.current())
            .map_or(0, |s| s.devices.len());
        self.growth = vec![[Growth::Armed; 2]; n];
    }

    /// Looks at the file (one stat), reloads it when it changed, reports a bad new version once.
    fn refresh(&mut self) {
        let Some(watched) = self.watched.as_mut() else {
            return;
        };
        match watched.refresh() {
            Refresh::Unchanged => {}
            Refresh::Reloaded => self.reset_growth(),
            Refresh::Failed(e) => say(&format!("{e} (keeping the last good scenario)")),
        }
    }

    /// The current scenario without the processes the mock libcuda has checkpointed (one stat
    /// of `cuda-state.json` per call; re-read when it changed).
    fn effective(&mut self) -> Option<Arc<Scenario>> {
        let watched = self.watched.as_ref()?;
        let base = watched.current()?.clone();
        let path = checkpoint::path_for(watched.path());
        let checkpoints = match &mut self.checkpoints {
            Some(c) if c.path() == path => c,
            slot => slot.insert(Watched::new(path)),
        };
        if let Err(e) = checkpoints.refresh() {
            say(&format!("{e} (keeping the last good checkpoint states)"));
        }
        let hidden = base.hidden_when_checkpointed(checkpoints.current().checkpointed());
        if hidden.is_empty() {
            return Some(base);
        }
        if let Some((b, h, e)) = &self.effective
            && Arc::ptr_eq(b, &base)
            && *h == hidden
        {
            return Some(e.clone());
        }
        let effective = Arc::new(Scenario {
            hidden_pids: hidden.clone(),
            ..(*base).clone()
        });
        self.effective = Some((base, hidden, effective.clone()));
        Some(effective)
    }
}

/// nvmlInit, nvmlInit_v2, nvmlInitWithFlags.
pub fn init(fn_name: &str) -> u32 {
    let mut st = lock();
    let path = match std::env::var_os(ENV_VAR) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            say(&format!(
                "{ENV_VAR} is not set: behaving as if the NVIDIA driver were not loaded"
            ));
            return codes::ERROR_DRIVER_NOT_LOADED;
        }
    };
    if st.watched.as_ref().is_none_or(|w| w.path() != path) {
        st.watched = Some(WatchedScenario::new(path));
    }
    let Some(watched) = st.watched.as_mut() else {
        return codes::ERROR_UNKNOWN;
    };
    // Init always re-reads: the file must be valid now, whatever was seen before.
    let refreshed = watched.reload();
    if let Refresh::Failed(e) = &refreshed {
        say(&e.to_string());
        return codes::ERROR_DRIVER_NOT_LOADED;
    }
    let Some(scenario) = watched.current().cloned() else {
        return codes::ERROR_UNKNOWN;
    };
    if !scenario.driver_loaded {
        return codes::ERROR_DRIVER_NOT_LOADED;
    }
    if let Some(&code) = scenario.fail.get(fn_name) {
        return code;
    }
    if st.refcount == 0 || matches!(refreshed, Refresh::Reloaded) {
        st.reset_growth();
    }
    st.refcount = st.refcount.saturating_add(1);
    codes::SUCCESS
}

/// nvmlShutdown.
pub fn shutdown() -> u32 {
    let mut st = lock();
    if st.refcount == 0 {
        return codes::ERROR_UNINITIALIZED;
    }
    st.refresh();
    if let Some(&code) = st
        .watched
        .as_ref()
        .and_then(|w| w.current())
        .and_then(|s| s.fail.get("nvmlShutdown"))
    {
        return code;
    }
    st.refcount -= 1;
    codes::SUCCESS
}

/// What one call sees: the current scenario, where its file is, and the growth progress.
pub struct Session<'a> {
    pub scenario: Arc<Scenario>,
    pub scenario_path: &'a std::path::Path,
    growth: &'a mut Vec<[Growth; 2]>,
}

/// Result of a process-list request.
pub enum ProcessList {
    /// The caller's capacity is too small: this many records exist.
    TooSmall(u32),
    /// The records to copy out.
    Fill(Vec<Process>),
}

impl Session<'_> {
    /// Index of a valid handle of an existing device that is not lost.
    pub fn device(&self, handle: *const DeviceSlot) -> Result<usize, u32> {
        let index = handles::index_of(handle).ok_or(codes::ERROR_INVALID_ARGUMENT)?;
        self.device_at(index)?;
        Ok(index)
    }

    /// Device `index`, checked to exist and not to be lost.
    pub fn device_at(&self, index: usize) -> Result<&crate::scenario::Device, u32> {
        let device = self
            .scenario
            .devices
            .get(index)
            .ok_or(codes::ERROR_INVALID_ARGUMENT)?;
        if device.lost {
            return Err(codes::ERROR_GPU_IS_LOST);
        }
        Ok(device)
    }

    /// The two-call protocol for one list, including the simulated growth.
    pub fn process_list(&mut self, index: usize, kind: ProcessKind, capacity: u32) -> ProcessList {
        if kind == ProcessKind::Mps {
            let list = self.scenario.mps_processes(index);
            let n = u32::try_from(list.len()).unwrap_or(u32::MAX);
            return if capacity < n {
                ProcessList::TooSmall(n)
            } else {
                ProcessList::Fill(list)
            };
        }
        let (mut list, growth_by) = match self.scenario.devices.get(index) {
            Some(d) => (
                match kind {
                    ProcessKind::Compute => self.scenario.compute_processes(index),
                    ProcessKind::Graphics | ProcessKind::Mps => {
                        self.scenario.graphics_processes(index)
                    }
                },
                d.process_list_growth,
            ),
            None => (Vec::new(), 0),
        };
        if self.growth.len() <= index {
            self.growth.resize(index + 1, [Growth::Armed; 2]);
        }
        let growth = &mut self.growth[index][kind as usize];
        if *growth == Growth::Pending {
            list.extend(
                (0..growth_by).map(|i| Process::new(0x7fff_ff00_u32.wrapping_add(i), Some(0))),
            );
            *growth = Growth::Spent;
        }
        let n = u32::try_from(list.len()).unwrap_or(u32::MAX);
        if capacity < n {
            if *growth == Growth::Armed && growth_by > 0 {
                *growth = Growth::Pending;
            }
            ProcessList::TooSmall(n)
        } else {
            ProcessList::Fill(list)
        }
    }
}

/// Runs one call of `fn_name`: UNINITIALIZED outside init, DRIVER_NOT_LOADED when the scenario
/// says so, the forced code from `fail`, else `f`'s result.
pub fn with_session(fn_name: &str, f: impl FnOnce(&mut Session<'_>) -> Result<(), u32>) -> u32 {
    let mut st = lock();
    if st.refcount == 0 {
        return codes::ERROR_UNINITIALIZED;
    }
    st.refresh();
    let Some(scenario) = st.effective() else {
        return codes::ERROR_UNKNOWN;
    };
    if !scenario.driver_loaded {
        return codes::ERROR_DRIVER_NOT_LOADED;
    }
    if let Some(&code) = scenario.fail.get(fn_name) {
        return code;
    }
    let st = &mut *st;
    let Some(scenario_path) = st.watched.as_ref().map(|w| w.path()) else {
        return codes::ERROR_UNKNOWN;
    };
    let mut session = Session {
        scenario,
        scenario_path,
        growth: &mut st.growth,
    };
    match f(&mut session) {
        Ok(()) => codes::SUCCESS,
        Err(code) => code,
    }
}
