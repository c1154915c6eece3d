//! The ladder's signal and kill executors, over the pidfd signals of [`super::signal`]. A `signal`
//! step never ends a process (one that does not catch the signal is skipped); a `kill` uses
//! `cgroup.kill` on the workload's v2 root group where it exists, else SIGKILL to each process
//! (and thaws what the agent froze through the v1 freezer, where tasks die only once thawed).

use std::time::Instant;

use log::{info, warn};

use super::{
    Enforcer, Outcome, Target,
    freeze::{self, Freezer},
    signal::{SignalOutcome, send_to},
};
use crate::{attribution::ProcessIdentity, sample::GpuSample};

/// Which of its targets a signal goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum To {
    /// Every target (a `kill` step's signal).
    Every,
    /// Only the targets that catch the signal (a `signal` step's).
    Catching,
}

impl Enforcer {
    /// Sends `sig` to the targets `to` names. Returns the outcome per process. A ladder's
    /// `signal` step uses [`To::Catching`]: the processes that do not catch the signal are skipped
    /// ([`Outcome::NotCaught`]), since the signal would end them and only a `kill` step may.
    pub fn signal(
        &self,
        workload: &str,
        targets: &[Target],
        sig: i32,
        to: To,
    ) -> Vec<(ProcessIdentity, Outcome)> {
        targets
            .iter()
            .map(|t| {
                let id = t.identity;
                if self.dry(workload) {
                    info!(
                        "dry run: would send signal {sig} to {} of {workload}",
                        id.pid
                    );
                    return (id, Outcome::DryRun);
                }
                if to == To::Catching && super::restored::asks_to_exit(sig) && self.was_restored(id)
                {
                    warn!(
                        "not signalling {} of {workload} with {sig}: it was restored from a \
                         checkpoint and may exit on it; {} (the ladder's later steps act on it)",
                        id.pid,
                        super::restored::REFUSAL
                    );
                    return (id, Outcome::Refused);
                }
                let outcome = match send_to(t, sig, to == To::Catching) {
                    Ok(SignalOutcome::Sent) => {
                        info!("sent signal {sig} to {} of {workload}", id.pid);
                        Outcome::Ok
                    }
                    Ok(SignalOutcome::Gone) => Outcome::Noop,
                    Ok(SignalOutcome::NotCaught) => {
                        let name = crate::quota::SIGNALS
                            .iter()
                            .find(|s| s.number == sig)
                            .map_or(sig.to_string(), |s| s.name.to_string());
                        info!(
                            "not signalling {} of {workload}: it does not catch {name}, which \
                             would end it (only a kill step ends a process)",
                            id.pid
                        );
                        Outcome::NotCaught
                    }
                    Ok(SignalOutcome::Reused) => {
                        warn!(
                            "not signalling pid {}: it now belongs to another process",
                            id.pid
                        );
                        Outcome::Refused
                    }
                    Err(e) => {
                        warn!("signal {sig} to {} failed: {e:#}", id.pid);
                        Outcome::Failed
                    }
                };
                (id, outcome)
            })
            .collect()
    }

    /// A `kill` step's signal other than SIGKILL (SIGTERM, say) to every target of the workload
    /// at `rel`: it ends them, so a restored process is made safe first ([`super::restored`];
    /// `sample` is a fresh NVML read), else nothing is sent (each target `refused`) and the
    /// workload is frozen. Returns the outcome per process, as [`Self::signal`] does.
    pub fn end(
        &mut self,
        workload: &str,
        rel: &str,
        targets: &[Target],
        sig: i32,
        sample: &mut dyn FnMut() -> GpuSample,
    ) -> Vec<(ProcessIdentity, Outcome)> {
        if !self.dry(workload)
            && let Err(why) = self.quiesce_restored(workload, rel, sample)
        {
            self.refuse_kill(workload, rel, &why);
            return targets
                .iter()
                .map(|t| (t.identity, Outcome::Refused))
                .collect();
        }
        self.signal(workload, targets, sig, To::Every)
    }

    /// Kills a workload: `cgroup.kill` on its root v2 group where it exists (a frozen group is
    /// killed at once), else SIGKILL to each target. A process of it restored from a checkpoint
    /// is checkpointed again and its device seen empty first ([`super::restored`]; `sample` is a
    /// fresh NVML read); where that cannot be done nothing is killed and the workload is frozen.
    pub fn kill(
        &mut self,
        workload: &str,
        rel: &str,
        targets: &[Target],
        sample: &mut dyn FnMut() -> GpuSample,
    ) -> Outcome {
        if let Err(e) = self.check_target(rel) {
            warn!("kill of {workload}: {e:#}");
            return Outcome::Refused;
        }
        if self.dry(workload) {
            info!("dry run: would kill {workload}");
            return Outcome::DryRun;
        }
        if let Err(why) = self.quiesce_restored(workload, rel, sample) {
            self.refuse_kill(workload, rel, &why);
            return Outcome::Refused;
        }
        let dir = self.v2_dir(rel);
        if dir.join("cgroup.kill").exists() {
            return match freeze::v2_kill(&dir) {
                Ok(()) => {
                    info!("killed {workload} (cgroup.kill on {})", dir.display());
                    Outcome::Ok
                }
                Err(e) => {
                    warn!("kill of {workload} failed: {e:#}");
                    Outcome::Failed
                }
            };
        }
        let results = self.signal(workload, targets, libc::SIGKILL, To::Every);
        // v1-frozen tasks only die once thawed (suspended or not: they are being killed).
        for rec in self.records_of(workload) {
            if rec.freezer != Freezer::V1 {
                continue;
            }
            if self.ours(&rec.cgroup_dir) {
                self.thaw_group(&rec, Instant::now());
            } else {
                self.forget(&rec.cgroup_dir);
            }
        }
        if results.iter().any(|(_, o)| *o == Outcome::Ok) {
            Outcome::Ok
        } else {
            Outcome::Noop
        }
    }
}
