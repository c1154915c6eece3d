//! A periodic timer the kernel keeps: a timerfd in the runtime's epoll set.
//!
//! Why not `tokio::time::interval`: on the current-thread runtime, an interval that fires re-arms
//! its timer in tokio's wheel, and when that new deadline is the nearest one (the 25 ms ring-buffer
//! drain's always is), re-arming it unparks the driver: an eventfd write, and the loop wakes a second
//! time for nothing. At 1,000 GPU processes that was 94 `epoll_wait` and 37 `write` calls a second,
//! half of the agent's wake-ups (`strace -c -p <agent>`, docs/performance.md). A timerfd re-arms
//! itself in the kernel: one wake-up and one 8-byte read a tick.
//!
//! Where a timerfd cannot be made or read (a seccomp profile that refuses it, say), the ticker falls
//! back to tokio's interval, logged once: it costs the extra wake-up, nothing else.

use std::{io, os::fd::OwnedFd, time::Duration};

use log::warn;
use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
    timerfd_settime,
};
use tokio::{
    io::{Interest, unix::AsyncFd},
    time::{Interval, MissedTickBehavior},
};

/// Ticks every `period`; missed ticks are not replayed (a busy loop gets one tick, which says how
/// many periods ended).
#[derive(Debug)]
pub struct Ticker {
    period: Duration,
    inner: Inner,
    /// Reads of the timerfd, those that found nothing included (one a tick is the aim).
    reads: u64,
}

#[derive(Debug)]
enum Inner {
    Timerfd(AsyncFd<OwnedFd>),
    Interval(Interval),
}

impl Ticker {
    /// A ticker whose first tick comes one `period` from now (a zero period is taken as 1 ms). Must
    /// be called within a tokio runtime with I/O and time enabled.
    pub fn new(period: Duration) -> Self {
        let period = period.max(Duration::from_millis(1));
        let inner = match timerfd(period) {
            Ok(fd) => Inner::Timerfd(fd),
            Err(e) => {
                warn!("no timerfd ({e}): ticking every {period:?} with tokio's timer instead");
                Inner::Interval(interval(period))
            }
        };
        Self {
            period,
            inner,
            reads: 0,
        }
    }

    /// The same ticker on tokio's timer (the fallback), for tests.
    #[cfg(test)]
    fn tokio(period: Duration) -> Self {
        let period = period.max(Duration::from_millis(1));
        Self {
            period,
            inner: Inner::Interval(interval(period)),
            reads: 0,
        }
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Ticks every `period` from now on, the first tick one `period` from now (a zero period is
    /// taken as 1 ms); a no-op when it is the period already. A timerfd that cannot be set falls
    /// back to tokio's timer, logged.
    pub fn set_period(&mut self, period: Duration) {
        let period = period.max(Duration::from_millis(1));
        if period == self.period {
            return;
        }
        self.period = period;
        match &mut self.inner {
            Inner::Timerfd(fd) => {
                if let Err(e) = arm(fd.get_ref(), period) {
                    warn!(
                        "setting the timerfd failed ({e}): ticking every {period:?} with tokio's \
                         timer from now on"
                    );
                    self.inner = Inner::Interval(interval(period));
                }
            }
            Inner::Interval(i) => *i = interval(period),
        }
    }

    /// Whether the kernel keeps this ticker's time (a timerfd), not tokio's wheel.
    pub fn is_kernel_timer(&self) -> bool {
        matches!(self.inner, Inner::Timerfd(_))
    }

    /// Waits for the next tick; returns how many periods ended since the last one (more than one
    /// when the caller was busy). Cancel-safe: a tick is consumed only when this returns.
    pub async fn tick(&mut self) -> u64 {
        loop {
            let fd = match &mut self.inner {
                Inner::Timerfd(fd) => fd,
                Inner::Interval(i) => {
                    i.tick().await;
                    return 1;
                }
            };
            let read = match fd.readable().await {
                Ok(mut guard) => {
                    self.reads += 1;
                    match read_expirations(guard.get_inner()) {
                        // The read took every expiration: not readable until the next one (whose
                        // edge the next wait sees), so the next call waits instead of reading again.
                        Ok(n) => {
                            guard.clear_ready();
                            Ok(n)
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            guard.clear_ready();
                            continue;
                        }
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            match read {
                Ok(n) => return n,
                Err(e) => {
                    warn!(
                        "reading the timerfd failed ({e}): ticking every {:?} with tokio's timer \
                         from now on",
                        self.period
                    );
                    self.inner = Inner::Interval(interval(self.period));
                }
            }
        }
    }
}

fn interval(period: Duration) -> Interval {
    let mut i = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    i.set_missed_tick_behavior(MissedTickBehavior::Delay);
    i
}

/// A non-blocking periodic timerfd on the monotonic clock, registered with the runtime.
fn timerfd(period: Duration) -> io::Result<AsyncFd<OwnedFd>> {
    let fd = timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )?;
    arm(&fd, period)?;
    // SAFETY: the AsyncFd owns the fd and deregisters it before closing it.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| e.into_parts().1)
}

/// Arms the timerfd `fd` to expire every `period`, the first one `period` from now (a pending
/// expiration count is cleared).
fn arm(fd: &OwnedFd, period: Duration) -> io::Result<()> {
    let ts = Timespec::try_from(period)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "period out of range"))?;
    timerfd_settime(
        fd,
        TimerfdTimerFlags::empty(),
        &Itimerspec {
            it_interval: ts,
            it_value: ts,
        },
    )?;
    Ok(())
}

/// The timerfd's count of expirations since the last read (`WouldBlock` when none).
fn read_expirations(fd: &OwnedFd) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    match rustix::io::read(fd, &mut buf)? {
        8 => Ok(u64::from_ne_bytes(buf)),
        n => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("a timerfd read gave {n} bytes"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Not ready before its period ends; ready after; and a caller busy for several periods gets
    /// one tick counting them, then waits a whole period again (no burst of replayed ticks).
    fn ticks_once_per_period_without_replay(make: fn(Duration) -> Ticker, kernel: bool) {
        rt().block_on(async move {
            let mut t = make(Duration::from_millis(300));
            assert_eq!(t.is_kernel_timer(), kernel);
            assert_eq!(t.reads, 0);
            assert!(
                tokio::time::timeout(Duration::from_millis(20), t.tick())
                    .await
                    .is_err(),
                "ticked before its period (300 ms) ended"
            );
            assert!(t.tick().await >= 1);
            // Busy (blocking the thread) for more than three periods.
            std::thread::sleep(Duration::from_millis(1000));
            let n = t.tick().await;
            if kernel {
                assert!(
                    n >= 3,
                    "a busy second of a 300 ms ticker counted {n} periods"
                );
            }
            assert!(
                tokio::time::timeout(Duration::from_millis(20), t.tick())
                    .await
                    .is_err(),
                "missed ticks were replayed"
            );
            if kernel {
                // One read a tick: a tick's read clears the readiness it came with.
                assert_eq!(t.reads, 2);
            }
        });
    }

    #[test]
    fn the_kernel_timer_ticks_once_per_period_without_replay() {
        ticks_once_per_period_without_replay(Ticker::new, true);
    }

    #[test]
    fn the_fallback_ticks_once_per_period_without_replay() {
        ticks_once_per_period_without_replay(Ticker::tokio, false);
    }

    /// A new period takes effect at once: a 10 s ticker set to 50 ms ticks within a few of them,
    /// and set back to 10 s does not tick again soon (a pending tick is not carried over).
    fn a_new_period_takes_effect_at_once(make: fn(Duration) -> Ticker) {
        rt().block_on(async move {
            let mut t = make(Duration::from_secs(10));
            t.set_period(Duration::from_millis(50));
            assert_eq!(t.period(), Duration::from_millis(50));
            assert!(
                tokio::time::timeout(Duration::from_millis(2_000), t.tick())
                    .await
                    .is_ok(),
                "no tick within 2 s of a 50 ms period"
            );
            assert!(t.tick().await >= 1);
            t.set_period(Duration::from_secs(10));
            assert!(
                tokio::time::timeout(Duration::from_millis(200), t.tick())
                    .await
                    .is_err(),
                "ticked at the old period after being set to 10 s"
            );
        });
    }

    #[test]
    fn the_kernel_timer_takes_a_new_period_at_once() {
        a_new_period_takes_effect_at_once(Ticker::new);
    }

    #[test]
    fn the_fallback_takes_a_new_period_at_once() {
        a_new_period_takes_effect_at_once(Ticker::tokio);
    }

    /// A read error (here: the fd is not a timerfd) degrades to tokio's timer, which then ticks.
    #[test]
    fn a_timerfd_that_fails_falls_back_to_tokio_timer() {
        rt().block_on(async {
            let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            // Readable at once (the peer wrote 3 bytes): the short read is the failure.
            use std::io::Write;
            (&_b).write_all(b"abc").unwrap();
            let mut t = Ticker {
                period: Duration::from_millis(10),
                reads: 0,
                // SAFETY: the AsyncFd owns the fd.
                inner: Inner::Timerfd(unsafe {
                    AsyncFd::register_with_interest(OwnedFd::from(a), Interest::READABLE).unwrap()
                }),
            };
            assert_eq!(t.tick().await, 1);
            assert!(!t.is_kernel_timer());
        });
    }
}
