//! Deterministic crash points, for tests (debug builds only): where `GPUSHARE_CRASH_AT` names a
//! point, the agent SIGKILLs itself when it gets there, so a test can check that a restart loses,
//! strands and leaks nothing whatever durable step the crash came between. The points, each
//! right after the step it names (docs/architecture.md lists them):
//!
//! - `freeze-recorded` (ledger written), `freeze-marked` (mark set), `freeze-applied`
//!   (`cgroup.freeze` written);
//! - `thaw-applied` (thawed, not yet forgotten: record and mark still there), `forgotten` (mark
//!   cleared, ledger entry not yet removed);
//! - `suspend-recorded`, `suspend-marked` (before the worker starts), `suspend-checkpointed`
//!   (every process checkpointed, the group not yet frozen), `suspend-frozen`;
//! - `resume-thawed` (thawed, nothing restored yet), `resume-restored` (restored, not unlocked),
//!   `resume-done` (resumed, the record not yet forgotten);
//! - `limit-recorded` (`driver-limits.json` written, the driver not asked yet), `limit-set`
//!   (the driver asked, the record not yet rewritten).
//!
//! A release build reads no variable and has no crash point.

/// The environment variable naming the point to crash at.
pub const ENV: &str = "GPUSHARE_CRASH_AT";

/// Crash here if `GPUSHARE_CRASH_AT` names `point` (debug builds).
pub fn point(point: &str) {
    #[cfg(debug_assertions)]
    if std::env::var_os(ENV).is_some_and(|v| v == point) {
        log::warn!("{ENV}={point}: killing the agent here (a test's crash point)");
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    #[cfg(not(debug_assertions))]
    let _ = point;
}
