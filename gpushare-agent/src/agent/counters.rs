//! The agent's monotonic totals: executed actions by (action kind, executor result), changes
//! found made behind the agent's back, suspend steps that fell through, and the GPU memory
//! suspends moved, kept in the snapshot's own counters, so that a publish starts from a copy.

use log::info;

use crate::observe::workloads::IdentityEvent;
use crate::{
    enforce::Outcome as ExecOutcome,
    policy::{ActionKind, Report, Stats},
    snapshot,
};

/// A change found made behind the agent's back to a group it froze, or an earlier run's freeze
/// taken over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum External {
    /// Thawed by someone else.
    Thawed,
    /// Removed.
    Gone,
    /// Recreated under the same path.
    Replaced,
    /// An earlier run's freeze, taken over.
    Adopted,
    /// A driver limit the agent set, cleared by someone else (set again).
    DriverLimitCleared,
    /// A driver limit the agent set, changed by someone else (theirs from then on).
    DriverLimitChanged,
}

impl External {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Thawed => "thawed",
            Self::Gone => "gone",
            Self::Replaced => "replaced",
            Self::Adopted => "adopted",
            Self::DriverLimitCleared => "driver_limit_cleared",
            Self::DriverLimitChanged => "driver_limit_changed",
        }
    }
}

/// Monotonic totals since the agent started, kept in the snapshot's own counters (the fields
/// the step does not count left at their defaults): the step adds to them as it acts, and a
/// publish starts the snapshot's counters from a copy ([`Totals::counters`]).
#[derive(Debug, Default)]
pub struct Totals {
    /// `enforcement_actions` by (action, executor result), a few dozen at most;
    /// `external_changes` by [`External`] kind; `suspend_fallthroughs` by the executor's cause;
    /// `suspended_bytes_total`; `workload_identity` by [`IdentityEvent`] kind.
    kept: snapshot::Counters,
}

impl Totals {
    /// One action of `kind` the executor answered with `result`.
    pub fn action(&mut self, kind: ActionKind, result: ExecOutcome) {
        self.kept
            .enforcement_actions
            .add(kind.name(), result.as_str(), 1);
    }

    /// A change made behind the agent's back that the step did not count itself.
    pub fn external(&mut self, kind: External) {
        self.kept.external_changes.add(kind.as_str(), 1);
    }

    /// A workload-identity event (two roots claiming one identity, a record naming another
    /// group).
    pub fn identity(&mut self, event: IdentityEvent) {
        self.kept.workload_identity.add(event.as_str(), 1);
    }

    /// GPU memory a suspend moved off the GPU.
    pub fn suspended(&mut self, bytes: u64) {
        self.kept.suspended_bytes_total += bytes;
    }

    /// What one step's decision counted, and the suspends refused at once in it.
    pub fn step(&mut self, stats: &Stats, reports: &[Report]) {
        for (kind, n) in [
            (External::Thawed, stats.external_thaws),
            (External::Gone, stats.groups_gone),
            (External::Replaced, stats.groups_replaced),
            (External::Adopted, stats.adopted),
        ] {
            if n > 0 {
                self.kept.external_changes.add(kind.as_str(), n as u64);
                if kind == External::Adopted {
                    info!("took over {n} freeze(s) recorded by an earlier run");
                }
            }
        }
        for r in reports {
            if let Report::SuspendRefused { cause, .. } = r {
                self.kept.suspend_fallthroughs.add(cause.clone(), 1);
            }
        }
        for (cause, n) in &stats.suspend_fallthroughs {
            self.kept.suspend_fallthroughs.add(cause.clone(), *n as u64);
        }
    }

    /// The totals, as the snapshot's counters: the rest of them at their defaults.
    pub fn counters(&self) -> &snapshot::Counters {
        &self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Signal;

    #[test]
    fn the_totals_are_the_snapshots_counters_with_todays_label_values() {
        let mut c = Totals::default();
        c.action(ActionKind::Freeze, ExecOutcome::Ok);
        c.action(ActionKind::Freeze, ExecOutcome::Ok);
        c.action(ActionKind::Freeze, ExecOutcome::Pending);
        c.action(ActionKind::Signal(Signal::KILL), ExecOutcome::NotCaught);
        c.action(
            ActionKind::Signal(Signal::from_name("SIGTERM").unwrap()),
            ExecOutcome::NotCaught,
        );
        c.action(ActionKind::Kill(Signal::KILL), ExecOutcome::DryRun);
        c.action(ActionKind::Resume, ExecOutcome::Failed);
        let stats = Stats {
            external_thaws: 2,
            adopted: 1,
            suspend_fallthroughs: [("host_memory".to_string(), 1)].into(),
            ..Stats::default()
        };
        let refused = Report::SuspendRefused {
            workload: "w".into(),
            cause: "unavailable".into(),
            reason: "no libcuda".into(),
        };
        c.step(&stats, &[refused]);
        c.suspended(4);
        c.suspended(3);
        c.identity(IdentityEvent::Conflict);
        c.identity(IdentityEvent::Mismatch);
        c.identity(IdentityEvent::Conflict);
        let s = c.counters().clone();
        let pairs = |m: &snapshot::Tally| -> Vec<(String, u64)> {
            m.iter().map(|(k, v)| (k.to_string(), v)).collect()
        };
        assert_eq!(
            pairs(&s.workload_identity),
            vec![
                ("conflict".to_string(), 2),
                ("record_mismatch".to_string(), 1)
            ]
        );
        let want = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
        };
        let actions: Vec<(String, u64)> = s
            .enforcement_actions
            .iter()
            .map(|(k, n)| (format!("{}/{}", k.action, k.result), n))
            .collect();
        assert_eq!(
            actions,
            want(&[
                ("freeze/ok", 2),
                ("freeze/pending", 1),
                ("kill/dry_run", 1),
                ("resume/failed", 1),
                ("signal/not_caught", 2),
            ])
        );
        assert_eq!(
            pairs(&s.external_changes),
            want(&[("adopted", 1), ("thawed", 2)])
        );
        assert_eq!(
            pairs(&s.suspend_fallthroughs),
            want(&[("host_memory", 1), ("unavailable", 1)])
        );
        assert_eq!(s.suspended_bytes_total, 7);
    }
}
