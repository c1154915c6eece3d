//! How long things took: the snapshot's [`Timings`] (measured by the step) as histograms, encoded
//! before every other family, through prometheus-client's own histogram encoding.

use prometheus_client::{
    encoding::{EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Registry,
};

use crate::snapshot::{Observations, Timings};

/// One histogram of a snapshot, to encode.
#[derive(Debug)]
struct Histogram(Observations);

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self.0.buckets().collect();
        encoder.encode_histogram::<NoLabelSet>(self.0.sum(), self.0.count(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Appends `t`'s histograms to `out` in the format asked for.
pub(super) fn encode(t: &Timings, openmetrics: bool, out: &mut String) {
    let mut registry = Registry::default();
    for (name, help, h) in [
        (
            "gpushare_sample_duration_seconds",
            "Time to read every GPU and its processes through NVML",
            t.sample,
        ),
        (
            "gpushare_enforcement_latency_seconds",
            "From the observation that put a workload over quota to the enforcement action",
            t.enforcement_latency,
        ),
        (
            "gpushare_suspend_duration_seconds",
            "How long a suspend took: lock every GPU process, checkpoint each, freeze",
            t.suspend,
        ),
        (
            "gpushare_resume_duration_seconds",
            "How long a resume took: thaw, restore and unlock every checkpointed process",
            t.resume,
        ),
    ] {
        registry.register(name, help, Histogram(h));
    }
    let _ = if openmetrics {
        prometheus_client::encoding::text::encode_registry(out, &registry)
    } else {
        prometheus_client::encoding::prometheus_text::encode(out, &registry)
    };
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The histograms read as prometheus-client's own `Histogram` over the same observations,
    /// in both formats (they were such histograms, observed by the agent, until issue 40).
    #[test]
    fn encodes_as_prometheus_clients_histograms_did() {
        let mut t = Timings::default();
        let theirs = [
            [
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            ]
            .to_vec(),
            [
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ]
            .to_vec(),
            [
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]
            .to_vec(),
            [
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]
            .to_vec(),
        ]
        .map(prometheus_client::metrics::histogram::Histogram::new);
        let took = [
            0,
            500,
            1_000,
            2_345,
            100_000,
            1_000_000,
            7_500_000,
            400_000_000,
        ];
        for (i, micros) in took.into_iter().enumerate() {
            let d = Duration::from_micros(micros);
            let (ours, h) = match i % 4 {
                0 => (&mut t.sample, &theirs[0]),
                1 => (&mut t.enforcement_latency, &theirs[1]),
                2 => (&mut t.suspend, &theirs[2]),
                _ => (&mut t.resume, &theirs[3]),
            };
            ours.observe(d);
            h.observe(d.as_secs_f64());
            t.sample.observe(d);
            theirs[0].observe(d.as_secs_f64());
        }
        let names = [
            "gpushare_sample_duration_seconds",
            "gpushare_enforcement_latency_seconds",
            "gpushare_suspend_duration_seconds",
            "gpushare_resume_duration_seconds",
        ];
        for openmetrics in [false, true] {
            let mut ours = String::new();
            encode(&t, openmetrics, &mut ours);
            let mut registry = Registry::default();
            for (name, h) in names.iter().zip(&theirs) {
                // Help texts are compared by name below: only the series are at stake here.
                registry.register(*name, "", h.clone());
            }
            let mut want = String::new();
            let _ = if openmetrics {
                prometheus_client::encoding::text::encode_registry(&mut want, &registry)
            } else {
                prometheus_client::encoding::prometheus_text::encode(&mut want, &registry)
            };
            let series = |s: &str| -> Vec<String> {
                s.lines()
                    .filter(|l| !l.starts_with("# HELP"))
                    .map(str::to_string)
                    .collect()
            };
            assert_eq!(series(&ours), series(&want), "openmetrics: {openmetrics}");
        }
    }
}
