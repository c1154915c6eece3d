//! Helpers shared by the integration tests.

use std::time::{Duration, Instant};

use gpushare_agent::attribution::{Change, tracker::Tracker};

/// Polls the tracker until `done` holds or `timeout` passes; returns every change seen.
pub fn poll_until(
    tracker: &mut Tracker,
    timeout: Duration,
    mut done: impl FnMut(&Tracker, &[Change]) -> bool,
) -> Vec<Change> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        seen.extend(tracker.poll());
        if done(tracker, &seen) {
            return seen;
        }
        if Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
