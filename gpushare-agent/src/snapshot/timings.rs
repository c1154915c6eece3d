//! What the step measured, typed: how long things took, as counts per bucket. The agent observes
//! into its [`Timings`] and publishes a copy with each snapshot; `/metrics` encodes the copy as
//! histograms. Nothing but the snapshot carries them to a reader.

use std::time::Duration;

/// Buckets one histogram may have, `+Inf` included.
const MAX_BUCKETS: usize = 13;

/// One histogram: observations counted in the first bucket whose upper bound holds them (the
/// last bound is `+Inf`), with their sum and count, as prometheus-client's `Histogram` keeps
/// them. A plain value: copied into every snapshot, never shared.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observations {
    /// Upper bounds, ascending, `+Inf` excluded.
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); `bounds.len()` is the `+Inf` bucket.
    counts: [u64; MAX_BUCKETS],
    /// Sum of every observation, seconds.
    sum: f64,
    /// Observations.
    count: u64,
}

impl Observations {
    const fn new(bounds: &'static [f64]) -> Self {
        assert!(bounds.len() < MAX_BUCKETS);
        Self {
            bounds,
            counts: [0; MAX_BUCKETS],
            sum: 0.0,
            count: 0,
        }
    }

    /// Counts one duration.
    pub fn observe(&mut self, took: Duration) {
        let v = took.as_secs_f64();
        self.sum += v;
        self.count += 1;
        let i = self
            .bounds
            .iter()
            .position(|b| *b >= v)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
    }

    /// The sum of every observation, seconds.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// How many were observed.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Each bucket's upper bound (`f64::INFINITY` last) and its observations (not cumulative).
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let bounds = self.bounds.iter().copied().chain([f64::INFINITY]);
        bounds.zip(self.counts.iter().copied())
    }
}

/// NVML sample durations, seconds.
const SAMPLE: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
/// Enforcement latencies, seconds.
const LATENCY: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Suspend and resume durations, seconds.
const SUSPEND: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// How long things took since the agent started.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timings {
    /// One NVML sample: every GPU and its processes.
    pub sample: Observations,
    /// From the observation that put a workload over quota (or an allocation event) to the
    /// action.
    pub enforcement_latency: Observations,
    /// A suspend: lock every GPU process, checkpoint each, freeze.
    pub suspend: Observations,
    /// A resume: thaw, restore and unlock every checkpointed process.
    pub resume: Observations,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            sample: Observations::new(SAMPLE),
            enforcement_latency: Observations::new(LATENCY),
            suspend: Observations::new(SUSPEND),
            resume: Observations::new(SUSPEND),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_counts_in_the_first_bucket_that_holds_it() {
        let mut t = Timings::default();
        t.sample.observe(Duration::from_micros(500));
        t.sample.observe(Duration::from_millis(3));
        t.sample.observe(Duration::from_secs(2));
        let b: Vec<(f64, u64)> = t.sample.buckets().collect();
        assert_eq!(b.len(), SAMPLE.len() + 1);
        assert_eq!(b[0], (0.0005, 1));
        assert_eq!(b[3], (0.005, 1));
        assert_eq!(b[SAMPLE.len()], (f64::INFINITY, 1));
        assert_eq!(b.iter().map(|(_, n)| n).sum::<u64>(), 3);
        assert_eq!(t.sample.count(), 3);
        assert!((t.sample.sum() - 2.0035).abs() < 1e-9);
        assert_eq!(t.resume.count(), 0);
    }
}
