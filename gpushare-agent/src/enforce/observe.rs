//! Observation: what the kernel says about the groups the agent froze (and wants frozen), read at
//! the start of every step and handed to the policy; and the freezes and thaws still settling,
//! read again when the event loop asks.

use std::{collections::BTreeMap, os::unix::fs::MetadataExt, time::Duration};

use log::info;

use super::{Enforcer, freeze};
use crate::policy::{ActionKind, GpuScope, GroupState, ObservedGroup};

/// How long a pending freeze or thaw is watched by [`Enforcer::settle`] before it is left to the
/// steps (which keep observing it and retry with backoff).
const SETTLE_WATCH: Duration = Duration::from_secs(30);

/// A pending freeze or thaw the kernel has now applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// Workload key.
    pub workload: String,
    /// What settled.
    pub transition: ActionKind,
    /// From the observation that asked for it to now.
    pub latency: Duration,
}

impl Enforcer {
    /// What the kernel says about every group the agent froze (its ledger), and about the root
    /// groups of `wanted` (workload key, root path) that it wants frozen but has no record of.
    /// Records of groups that are gone or were recreated (another inode) are dropped here, and
    /// reported as such once.
    pub fn observe<'a>(
        &mut self,
        wanted: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> BTreeMap<String, ObservedGroup> {
        let mut out: BTreeMap<String, ObservedGroup> = BTreeMap::new();
        let mut forget = Vec::new();
        let mut unsuspend = Vec::new();
        for rec in self.records() {
            let rel = self.rel_of(&rec.cgroup_dir);
            let frozen_by = rec.scope.as_deref().and_then(GpuScope::from_label);
            let inode = std::fs::metadata(&rec.cgroup_dir).map(|m| m.ino());
            let (state, ours) = match inode {
                Err(_) => (GroupState::Gone, false),
                Ok(ino) if rec.inode.is_some_and(|r| r != ino) => (GroupState::Replaced, false),
                Ok(_) => match freeze::state(&rec.cgroup_dir, rec.freezer) {
                    Ok(s) => (s, true),
                    Err(_) => (GroupState::Gone, false),
                },
            };
            if !ours {
                info!(
                    "{}: the group the agent froze ({}) is {}; forgetting it",
                    rec.workload,
                    rec.cgroup_dir.display(),
                    if state == GroupState::Gone {
                        "gone"
                    } else {
                        "another group now (recreated under the same path)"
                    }
                );
                forget.push(rec.cgroup_dir.clone());
            }
            let suspension = if !ours {
                None
            } else {
                self.observe_suspension(&rec).unwrap_or_else(|_lapsed| {
                    unsuspend.push(rec.cgroup_dir.clone());
                    None
                })
            };
            let o = ObservedGroup {
                ours,
                state,
                frozen_by,
                cgroup_path: rel,
                suspension,
            };
            // One workload, one root: a record of ours wins over a stale one.
            match out.get(&rec.workload) {
                Some(existing) if existing.ours && !o.ours => {}
                _ => {
                    out.insert(rec.workload.clone(), o);
                }
            }
        }
        for dir in forget {
            self.forget(&dir);
        }
        for dir in unsuspend {
            // Its processes run again (restored by someone else) or are gone.
            info!(
                "{}: the suspended processes are no longer held by the driver; forgetting the suspension",
                dir.display()
            );
            self.set_suspended(&dir, None);
        }
        // Suspends that failed since the last step: the policy lets the step fall through.
        for (key, failed) in self.take_suspend_failures() {
            match out.get_mut(&key) {
                Some(o) => o.suspension = Some(failed),
                None => {
                    let rel = wanted_rel(&key);
                    out.insert(
                        key,
                        ObservedGroup {
                            ours: false,
                            state: GroupState::Thawed,
                            frozen_by: None,
                            cgroup_path: rel,
                            suspension: Some(failed),
                        },
                    );
                }
            }
        }
        for (key, rel) in wanted {
            if out.contains_key(key) {
                continue;
            }
            let dir = self.v2_dir(rel);
            let state = match freeze::v2_state(&dir) {
                Ok(s) => s,
                Err(_) => continue,
            };
            out.insert(
                key.to_string(),
                ObservedGroup {
                    ours: false,
                    state,
                    frozen_by: None,
                    cgroup_path: rel.to_string(),
                    suspension: None,
                },
            );
        }
        out
    }

    /// Whether a freeze or thaw is waiting to settle, or a suspend or resume runs.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty() || self.has_jobs()
    }

    /// Reads the groups whose freeze or thaw was pending; returns those the kernel now reports
    /// done. Stops watching a group after `SETTLE_WATCH` (the steps keep observing it).
    pub fn settle(&mut self) -> Vec<Settled> {
        let mut done = Vec::new();
        let mut forget = Vec::new();
        self.pending.retain(|dir, p| {
            let want = match p.transition {
                ActionKind::Freeze => GroupState::Frozen,
                _ => GroupState::Thawed,
            };
            match freeze::state(dir, p.freezer) {
                Ok(s) if s == want => {
                    done.push(Settled {
                        workload: p.workload.clone(),
                        transition: p.transition,
                        latency: p.trigger.elapsed(),
                    });
                    if p.transition == ActionKind::Thaw {
                        forget.push(dir.clone());
                    }
                    false
                }
                Ok(_) => p.since.elapsed() < SETTLE_WATCH,
                Err(_) => false,
            }
        });
        for dir in forget {
            self.forget(&dir);
        }
        for s in &done {
            info!(
                "{} {} (settled {:?} after it was decided)",
                match s.transition {
                    ActionKind::Freeze => "froze",
                    _ => "thawed",
                },
                s.workload,
                s.latency
            );
        }
        done
    }
}

/// The root path of a workload key, where it can be read off the key (`cgroup://<path>`); the
/// policy takes the path from its own state otherwise.
fn wanted_rel(key: &str) -> String {
    key.strip_prefix("cgroup://").unwrap_or("/").to_string()
}
