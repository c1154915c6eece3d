//! What an action does: one word per rung of the ladder and per way back (thaw, resume).

use crate::quota::Signal;

/// What to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Report.
    Alert,
    /// Send this signal to the targets.
    Signal(Signal),
    /// Freeze the root cgroup.
    Freeze,
    /// Thaw the root cgroup.
    Thaw,
    /// Kill the targets with this signal (SIGKILL: the whole root cgroup).
    Kill(Signal),
    /// Checkpoint the targets' GPU memory to host memory and freeze the root cgroup.
    Suspend,
    /// Thaw the root cgroup, restore and unlock the checkpointed processes.
    Resume,
}

impl ActionKind {
    /// `alert`, `signal`, `freeze`, `thaw`, `kill`, `suspend` or `resume`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Alert => "alert",
            Self::Signal(_) => "signal",
            Self::Freeze => "freeze",
            Self::Thaw => "thaw",
            Self::Kill(_) => "kill",
            Self::Suspend => "suspend",
            Self::Resume => "resume",
        }
    }
}
