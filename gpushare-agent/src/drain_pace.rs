//! How often the event loop drains the ring buffer on its timer.
//!
//! Events that need a prompt answer (a new GPU task, an allocation) wake the agent through the ring
//! buffer's fd; the others (execs, exits) are submitted without a wake-up and matter only to the next
//! step (an exit is also seen on the task's pidfd), so a drain a quarter-second is enough for them.
//! Two things make the timer drain often (every 25 ms) for a while:
//! - a timer drain found an event that should have woken the agent: some kernels defer the ring
//!   buffer's wake-up (irq_work) to the next interrupt, and then the timer is what bounds the delay
//!   of an allocation's answer (seen on an earlier VM of this project; on the current one the wake-up
//!   arrives in 0.1-0.4 ms, docs/performance.md);
//! - a drain took many events (a quarter of the ring buffer's room): the ring buffer is busy, and
//!   a full one loses events, the prompt ones included.
//!
//! Each wake-up costs about 60 µs of CPU on the project's VM; 40 a second were a third of the agent's
//! CPU at 1,000 GPU processes, for no event at all on a quiet node.

use std::time::{Duration, Instant};

/// The drain's period while wake-ups arrive and the ring buffer is quiet.
pub const SLOW: Duration = Duration::from_millis(250);
/// The drain's period after a late wake-up or a busy drain (the bound it puts on a late wake-up).
pub const FAST: Duration = Duration::from_millis(25);
/// How long the fast period holds after its last cause.
pub const FAST_HOLD: Duration = Duration::from_secs(60);
/// How old an event that asks for a prompt answer must be when a timer drain finds it for its
/// wake-up to count as late: one submitted just before the drain, its wake-up under way, is not.
pub const LATE_AFTER: Duration = Duration::from_millis(5);
/// Events in one drain that make the ring buffer busy: a quarter of its 256 KiB at 56 bytes an
/// event (its header included).
pub const BUSY_EVENTS: usize = 1_170;

/// Why the drain went fast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaceChange {
    /// A timer drain found an event that asks for a prompt answer: its wake-up did not come.
    LateWakeup,
    /// One drain took this many events.
    Busy(usize),
}

/// Whether a timer drain at `now_boot_ns` (CLOCK_BOOTTIME) that found events asking for a prompt
/// answer, the oldest fired at `oldest_prompt_boot_ns`, found one whose wake-up came late.
pub fn late(oldest_prompt_boot_ns: Option<u64>, now_boot_ns: u64) -> bool {
    oldest_prompt_boot_ns
        .is_some_and(|at| now_boot_ns.saturating_sub(at) >= LATE_AFTER.as_nanos() as u64)
}

/// The drain's pace (pure: the event loop gives it the clock).
#[derive(Debug, Default)]
pub struct DrainPace {
    fast_until: Option<Instant>,
}

impl DrainPace {
    /// The period at `now`.
    pub fn period(&self, now: Instant) -> Duration {
        match self.fast_until {
            Some(until) if now < until => FAST,
            _ => SLOW,
        }
    }

    /// After a drain at `now` that took `events` events; `late_wakeup`: it was a timer drain and
    /// it found an event asking for a prompt answer whose wake-up came [`late`]. Returns the cause when this drain made
    /// the pace fast (it was slow), so the caller logs it once.
    pub fn drained(
        &mut self,
        now: Instant,
        late_wakeup: bool,
        events: usize,
    ) -> Option<PaceChange> {
        let cause = if late_wakeup {
            PaceChange::LateWakeup
        } else if events >= BUSY_EVENTS {
            PaceChange::Busy(events)
        } else {
            return None;
        };
        let was = self.period(now);
        self.fast_until = Some(now + FAST_HOLD);
        (was == SLOW).then_some(cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_until_a_late_wakeup_then_fast_for_the_hold_after_the_last_cause() {
        let t0 = Instant::now();
        let mut p = DrainPace::default();
        assert_eq!(p.period(t0), SLOW);
        assert_eq!(
            p.drained(t0, false, 3),
            None,
            "a quiet drain changes nothing"
        );
        assert_eq!(p.period(t0), SLOW);
        assert_eq!(p.drained(t0, true, 1), Some(PaceChange::LateWakeup));
        assert_eq!(p.period(t0), FAST);
        // Another late one while fast: not reported again, but it extends the hold.
        let t1 = t0 + FAST_HOLD / 2;
        assert_eq!(p.drained(t1, true, 1), None);
        assert_eq!(p.period(t0 + FAST_HOLD), FAST);
        assert_eq!(p.period(t1 + FAST_HOLD - Duration::from_millis(1)), FAST);
        assert_eq!(p.period(t1 + FAST_HOLD), SLOW);
        // Slow again: the next cause is reported again.
        assert_eq!(
            p.drained(t1 + FAST_HOLD, true, 0),
            Some(PaceChange::LateWakeup)
        );
    }

    #[test]
    fn a_busy_drain_makes_it_fast_a_busy_one_short_of_the_mark_does_not() {
        let t0 = Instant::now();
        let mut p = DrainPace::default();
        assert_eq!(p.drained(t0, false, BUSY_EVENTS - 1), None);
        assert_eq!(p.period(t0), SLOW);
        assert_eq!(
            p.drained(t0, false, BUSY_EVENTS),
            Some(PaceChange::Busy(BUSY_EVENTS))
        );
        assert_eq!(p.period(t0 + FAST_HOLD - Duration::from_millis(1)), FAST);
        assert_eq!(p.period(t0 + FAST_HOLD), SLOW);
    }

    /// An event asking for a prompt answer found by the timer is late once it is `LATE_AFTER`
    /// old; one just submitted (its wake-up under way) or none is not; a clock read before the
    /// event's time (another CPU's) is not either.
    #[test]
    fn a_prompt_event_is_late_once_it_waited_the_mark() {
        let mark = LATE_AFTER.as_nanos() as u64;
        let at = 1_000_000_000;
        assert!(!late(None, at + 10 * mark));
        assert!(!late(Some(at), at));
        assert!(!late(Some(at), at + mark - 1));
        assert!(late(Some(at), at + mark));
        assert!(!late(Some(at + 5), at), "a clock behind the event's");
    }

    /// The busy mark is a quarter of the ring buffer's room, whatever its size.
    #[test]
    fn the_busy_mark_is_a_quarter_of_the_ring_buffer() {
        let per_event = std::mem::size_of::<gpushare_common::Event>() + 8;
        let room = gpushare_common::maps::EVENTS_BYTES as usize / per_event;
        assert!(
            BUSY_EVENTS.abs_diff(room / 4) <= room / 100,
            "{BUSY_EVENTS} vs a quarter of {room} events"
        );
    }
}
