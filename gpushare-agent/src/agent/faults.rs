//! A restored process whose context faulted (the driver's Xid naming it, from
//! [`crate::observe::faults`]) is ended as the kill rung ends one: checkpointed again, its device
//! seen empty, then killed ([`crate::enforce::Enforcer::end_faulted`]; cuda-checkpoint #53).

use log::debug;

use super::{Agent, Observation, act::summarize};
use crate::{
    enforce::Target,
    observe::faults::{Fault, KernelLog},
    policy::{ActionKind, AttributedProcess},
    quota::Signal,
};

impl Agent {
    /// Reads the driver's reports of faulted contexts from `log` from now on.
    pub fn use_kernel_log(&mut self, log: KernelLog) {
        self.kernel_log = Some(log);
    }

    /// The faults reported since the last step.
    pub(super) fn take_faults(&mut self) -> Vec<Fault> {
        self.kernel_log
            .as_ref()
            .map(KernelLog::take)
            .unwrap_or_default()
    }

    /// Ends each faulted process of `obs` that the ledger records as restored; counts it as a
    /// kill. A fault naming any other process changes nothing.
    pub(super) fn end_faulted(&mut self, obs: &Observation) {
        if obs.faults.is_empty() {
            return;
        }
        // A process faulting again and again is looked at once a step.
        let faulted: std::collections::BTreeMap<u32, &Fault> =
            obs.faults.iter().map(|f| (f.pid, f)).collect();
        let by_pid: std::collections::HashMap<u32, &AttributedProcess> = (obs.processes.iter())
            .filter(|p| faulted.contains_key(&p.identity.pid))
            .map(|p| (p.identity.pid, p))
            .collect();
        for f in faulted.into_values() {
            let Some(p) = by_pid.get(&f.pid) else {
                debug!(
                    "Xid {} names pid {}: no GPU process of a workload",
                    f.xid, f.pid
                );
                continue;
            };
            let target = Target {
                identity: p.identity,
                pidfd: (self.tracker.table().get(f.pid))
                    .filter(|t| t.identity == p.identity)
                    .and_then(|t| t.pidfd.clone()),
            };
            let rel = p.workload.id.cgroup_path.clone();
            let sampler = &mut self.sampler;
            let mut sample = || sampler.sample();
            let ended = self
                .enforcer
                .end_faulted(p.key(), &rel, &target, f.xid, &mut sample);
            if !ended.is_empty() {
                self.counters
                    .action(ActionKind::Kill(Signal::KILL), summarize(&ended));
            }
        }
    }
}
