//! Shutdown: on SIGTERM, what the agent froze is thawed and what it suspended restored where it fits.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use log::{info, warn};

use super::{ASSUMED_RESTORE_RATE, Agent};
use crate::policy;

impl Agent {
    /// On SIGTERM: thaws what the agent froze, unless told to keep it; a suspended workload is
    /// restored only where its GPUs have room for it now and its restore fits in what is left of
    /// the shutdown restore budget (estimated at the slowest checkpoint speed of this run), else
    /// left suspended and recorded for the next agent.
    pub fn shutdown(&mut self) {
        let t0 = Instant::now();
        self.enforcer.wait_jobs();
        if self.opts.keep_frozen_on_exit {
            let n = self.enforcer.records().len();
            if n > 0 {
                info!(
                    "leaving {n} workload(s) frozen (--keep-frozen-on-exit); the next start reconciles them"
                );
            }
            return;
        }
        let sample = self.sampler.sample();
        // An elastic borrower the policy holds suspended comes back only with the reserve to
        // spare, as the policy's own resume would.
        let reserve = self.quotas.current().defaults().elastic_reserve;
        let keep: BTreeMap<String, u64> = self
            .policy
            .workloads
            .iter()
            .filter(|(_, ws)| {
                ws.suspended.is_some()
                    && ws
                        .scopes
                        .values()
                        .any(|s| s.mode == crate::quota::Mode::Elastic)
            })
            .map(|(k, _)| (k.clone(), reserve))
            .collect();
        let budget = self.opts.shutdown_restore_budget;
        let rate = self.slowest_rate.unwrap_or(ASSUMED_RESTORE_RATE);
        let done = self.enforcer.thaw_all(&mut |rec| {
            let Some(sr) = rec.suspended.as_ref() else {
                return Ok(());
            };
            let pids = sr.live_pids();
            let reserve = keep.get(&rec.workload).copied().unwrap_or(0);
            policy::resume_room_keeping(
                &sr.per_gpu,
                &sample,
                |gpu| policy::listed_for(&sample, &pids, gpu),
                reserve,
            )
            .map_err(|why| format!("no room to restore it: {why}"))?;
            let bytes: u64 = sr.per_gpu.values().sum();
            let estimate = Duration::from_secs_f64(bytes as f64 / rate);
            let left = budget.saturating_sub(t0.elapsed());
            if estimate > left {
                return Err(format!(
                    "its restore (about {estimate:.1?}) does not fit in the {left:.1?} left of the \
                     shutdown restore budget (--shutdown-restore-budget {budget:?})"
                ));
            }
            Ok(())
        });
        info!(
            "on shutdown: {} thawed, {} resumed, {} left suspended, {} failed",
            done.thawed.len(),
            done.resumed.len(),
            done.left_suspended.len(),
            done.failed.len()
        );
        for (w, dir, why) in &done.failed {
            warn!("on shutdown: {w} ({}): {why}", dir.display());
        }
        if let Some(l) = self.limiter.as_mut().filter(|_| !self.opts.dry_run) {
            l.clear_all(&self.sampler);
        }
    }
}
