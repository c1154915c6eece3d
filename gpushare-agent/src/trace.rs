//! The timeline of the agent's last allocation-triggered reaction, for the latency bench.
//!
//! Every stamp is CLOCK_BOOTTIME in ns, the clock of the kernel's event time
//! (`bpf_ktime_get_boot_ns`) and of the fake GPU process's stamp before its ioctl, so the whole
//! path from the ioctl to the frozen cgroup lines up on one clock:
//!
//! - `event_ktime`: the kernel's time of the first `AllocIoctl` event of a burst;
//! - `event_seen`: when the agent drained it ([`alloc_event_seen`], from `Tracker::poll`);
//! - `sample_done`: when the re-sample it caused finished ([`sample_done`], from the sampler);
//! - `decided`: when the policy had decided ([`decided`], one call in `Agent::tick`);
//! - `acted`: when the actions had been issued ([`acted`], one call in `Agent::tick`; executors
//!   never wait, so a freeze is issued here and settles later: the bench times the frozen group
//!   itself).
//!
//! The first allocation event arms a trace; the next step fills it and, at `acted`, logs it on the
//! `gpushare_agent::trace` target at debug level as one line the bench parses:
//! `reaction trace: event_ktime_ns=.. event_seen_ns=.. sample_done_ns=.. decided_ns=.. acted_ns=.. actions=N`.
//! Stamps cost a mutex and a clock read, only while a trace is armed.

use std::sync::Mutex;

use crate::ebpf::boot_time_ns;

/// One reaction, stamps in CLOCK_BOOTTIME ns (0: not reached).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReactionTrace {
    /// Kernel time of the allocation event.
    pub event_ktime: u64,
    /// The agent drained the event.
    pub event_seen: u64,
    /// The re-sample finished.
    pub sample_done: u64,
    /// The policy decided.
    pub decided: u64,
    /// The actions were executed (a freeze: settled).
    pub acted: u64,
    /// How many actions the step executed.
    pub actions: usize,
}

struct State {
    armed: Option<ReactionTrace>,
    last: Option<ReactionTrace>,
}

static STATE: Mutex<State> = Mutex::new(State {
    armed: None,
    last: None,
});

fn with(f: impl FnOnce(&mut State)) {
    if let Ok(mut s) = STATE.lock() {
        f(&mut s);
    }
}

/// An allocation event with kernel time `ktime` was drained; arms a trace unless one is armed
/// (the first event of a burst starts the reaction).
pub fn alloc_event_seen(ktime: u64) {
    with(|s| {
        if s.armed.is_none() {
            s.armed = Some(ReactionTrace {
                event_ktime: ktime,
                event_seen: boot_time_ns(),
                ..Default::default()
            });
        }
    });
}

/// A sample finished.
pub fn sample_done() {
    with(|s| {
        if let Some(t) = s.armed.as_mut() {
            t.sample_done = boot_time_ns();
        }
    });
}

/// The policy decided.
pub fn decided() {
    with(|s| {
        if let Some(t) = s.armed.as_mut().filter(|t| t.sample_done != 0) {
            t.decided = boot_time_ns();
        }
    });
}

/// The step executed its `actions` actions: completes and logs an armed trace.
pub fn acted(actions: usize) {
    with(|s| {
        let Some(mut t) = s.armed.take_if(|t| t.decided != 0) else {
            return;
        };
        t.acted = boot_time_ns();
        t.actions = actions;
        log::debug!(target: "gpushare_agent::trace", "{}", t.line());
        s.last = Some(t);
    });
}

/// The last completed trace.
pub fn last() -> Option<ReactionTrace> {
    STATE.lock().ok().and_then(|s| s.last)
}

impl ReactionTrace {
    /// The log line (see the module doc).
    pub fn line(&self) -> String {
        format!(
            "reaction trace: event_ktime_ns={} event_seen_ns={} sample_done_ns={} decided_ns={} acted_ns={} actions={}",
            self.event_ktime,
            self.event_seen,
            self.sample_done,
            self.decided,
            self.acted,
            self.actions
        )
    }

    /// Parses a [`Self::line`] found anywhere in `text` (e.g. a log line with a prefix).
    pub fn parse(text: &str) -> Option<Self> {
        let rest = &text[text.find("reaction trace: ")? + "reaction trace: ".len()..];
        let mut t = Self::default();
        for field in rest.split_whitespace() {
            let (k, v) = field.split_once('=')?;
            match k {
                "event_ktime_ns" => t.event_ktime = v.parse().ok()?,
                "event_seen_ns" => t.event_seen = v.parse().ok()?,
                "sample_done_ns" => t.sample_done = v.parse().ok()?,
                "decided_ns" => t.decided = v.parse().ok()?,
                "acted_ns" => t.acted = v.parse().ok()?,
                "actions" => t.actions = v.parse().ok()?,
                _ => {}
            }
        }
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reaction_is_traced_in_order_once_per_burst_and_its_line_parses_back() {
        // Stamps before an event arms nothing.
        sample_done();
        decided();
        acted(1);
        let before = last();
        alloc_event_seen(42);
        alloc_event_seen(43); // same burst: the first event stays
        sample_done();
        decided();
        acted(1);
        let t = last().expect("completed");
        assert_ne!(Some(t), before);
        assert_eq!(t.event_ktime, 42);
        assert!(t.event_seen <= t.sample_done && t.sample_done <= t.decided);
        assert!(t.decided <= t.acted);
        assert_eq!(t.actions, 1);
        assert_eq!(
            ReactionTrace::parse(&format!("[... DEBUG x] {}", t.line())),
            Some(t)
        );
        // Disarmed: a later step without an event leaves the trace alone.
        sample_done();
        decided();
        acted(0);
        assert_eq!(last(), Some(t));
    }
}
