//! Publish: the immutable snapshot every reader uses, with the agent's health, counters and
//! timings: the one door to `/metrics`, `/api/v1/state` and `status`.

use std::sync::Arc;

use super::{Agent, Observation};
use crate::{
    enforce::driver_limits::DriverLimiter,
    nvml::DriverStatus,
    sample::GpuSample,
    snapshot::{self, ApiCounters, EventCounters, Health, KubeCounters, StepReport},
};

impl Agent {
    /// The API server's and the Event poster's counters, when they run.
    fn kube_counters(&self) -> KubeCounters {
        use std::sync::atomic::Ordering::Relaxed;
        KubeCounters {
            api: self.workloads.kube_watch().map(|w| {
                let s = w.stats();
                ApiCounters {
                    reads: s.reads_total.load(Relaxed),
                    errors: s.errors_total.load(Relaxed),
                    annotation_edits_ignored: s.annotation_edits_total.load(Relaxed),
                }
            }),
            events: self.events.as_ref().map(|e| {
                let s = e.stats();
                EventCounters {
                    created: s.created_total.load(Relaxed),
                    patched: s.patched_total.load(Relaxed),
                    skipped: s.skipped_total.load(Relaxed),
                    dropped: s.dropped_total.load(Relaxed),
                    errors: s.errors_total.load(Relaxed),
                }
            }),
        }
    }

    fn health(&self, sample: &GpuSample) -> Health {
        let mut degraded = Vec::new();
        if let crate::attribution::tracker::AttributionMode::Procfs { reason } = self.tracker.mode()
        {
            degraded.push(format!(
                "eBPF unavailable, attributing through /proc: {reason}"
            ));
        }
        if let DriverStatus::NoDriver { reason } = self.sampler.status() {
            degraded.push(format!("no NVIDIA driver: {reason}"));
        }
        for p in &sample.problems {
            degraded.push(format!("NVML: {p}"));
        }
        for (i, h) in &sample.health {
            if let crate::sample::DeviceHealth::Degraded { reason } = h {
                degraded.push(format!("GPU {i}: {reason}"));
            }
        }
        for (key, said) in self.workloads.env_quotas().unit_mismatches() {
            degraded.push(format!("{key}: {said}"));
        }
        for (key, said) in self.workloads.env_quotas().disagreements() {
            degraded.push(format!("{key}: {said}"));
        }
        if let Some(k) = self.workloads.kubelet() {
            degraded.extend(k.status.degraded());
            for pod in &k.ambiguous {
                degraded.push(format!(
                    "kubelet pod-resources: pod {pod} has two live pod UIDs: neither gets its grant"
                ));
            }
        }
        if self.quotas.observe_only() {
            degraded.push(
                "observe only: the quota configuration was invalid at start and no last good \
                 configuration is kept; alerts and metrics, no signal, freeze or kill, until a \
                 valid configuration loads"
                    .to_string(),
            );
        }
        if let Some(kept) = self.quotas.kept_in_force() {
            degraded.push(format!(
                "the quota files were invalid at start: the last good configuration kept in {} is \
                 in force",
                kept.display()
            ));
        }
        if !self.quotas.valid() {
            degraded.push(format!(
                "quota configuration invalid: {}",
                self.quotas.errors().join("; ")
            ));
        }
        degraded.extend(self.enforcer.problems().iter().cloned());
        Health {
            ready: self.ready,
            attribution: match self.tracker.mode() {
                crate::attribution::tracker::AttributionMode::Ebpf => "ebpf".into(),
                crate::attribution::tracker::AttributionMode::Procfs { .. } => "procfs".into(),
            },
            nvml: match self.sampler.status() {
                DriverStatus::Ready { .. } => "ready".into(),
                DriverStatus::NoDriver { .. } => "no_driver".into(),
            },
            degraded,
            dry_run: self.opts.dry_run,
            observe_only: self.quotas.observe_only(),
            suspend: match self.enforcer.suspend_unavailable() {
                None => "available".to_string(),
                Some(why) => format!("unavailable: {why}"),
            },
        }
    }

    pub(super) fn publish(&mut self, obs: &Observation) {
        self.ready = true;
        let kc = self.tracker.kernel_counters();
        let stats = self.tracker.table().stats();
        let counters = snapshot::Counters {
            ebpf_events: stats.events.iter().map(|(k, v)| (*k, *v)).collect(),
            ebpf_events_lost: kc.events_lost,
            nvml_errors: self
                .sampler
                .errors()
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect(),
            quota_config_valid: self.quotas.valid(),
            quota_config_last_reload_unix: self.quotas.last_reload_unix(),
            identity: [
                ("exited", stats.exited_dropped),
                ("stale_identity", stats.stale_identity),
                ("unverifiable", stats.unverifiable_samples),
                ("rejected", stats.identity_rejected),
            ]
            .into_iter()
            .collect(),
            attribution_work: self.tracker.work().pairs().into_iter().collect(),
            env_quota_errors: self.workloads.env_quotas().problems_total(),
            env_quota_disagreements: self
                .workloads
                .env_quotas()
                .disagreements_total()
                .into_iter()
                .collect(),
            env_quota_unit_mismatch: self
                .workloads
                .env_quotas()
                .unit_mismatches()
                .into_iter()
                .collect(),
            kubernetes: self.kube_counters(),
            // What the step counted as it acted, kept as the snapshot's counters.
            ..self.counters.counters().clone()
        };
        let mut snap = self.publisher.build(StepReport {
            sample: &obs.sample,
            table: self.tracker.table(),
            processes: &obs.processes,
            policy: &self.policy,
            names: self.workloads.names(),
            quota_trust: self.workloads.quota_trust(),
            identity: self.workloads.identity_notes(),
            health: self.health(&obs.sample),
            counters,
            timings: self.timings,
            quotas: (self.quotas.current(), self.quotas.generation()),
            now: self.started.elapsed(),
            backends: obs
                .sample
                .devices
                .iter()
                .map(|d| {
                    (
                        d.index,
                        self.limiter.as_ref().map_or("soft", |l| l.backend(d.index)),
                    )
                })
                .collect(),
            driver_limits: self
                .limiter
                .as_ref()
                .map(DriverLimiter::in_force)
                .unwrap_or_default(),
            taken: &self.verifier.taken,
        });
        snap.grants = self.verify_grants(&snap);
        self.grant_events(&snap.grants, obs);
        if let Ok(mut w) = self.snapshot.write() {
            *w = Arc::new(snap);
        }
    }
}
