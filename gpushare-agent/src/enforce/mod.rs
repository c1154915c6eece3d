//! Enforcement: executors for the policy's actions, and the observation of what they did. Matching
//! and deciding happen in [`crate::policy`]; this module only acts, reports what the kernel made of
//! it, and in dry-run mode only reports.
//!
//! One [`Enforcer`] serves every executor; each file adds the `impl Enforcer` block of one job:
//! - `ours.rs`: what is ours, the base every executor uses: the freezes recorded in the [`ledger`]
//!   and marked on their groups ([`marks`]), whether a group is still the one recorded, forgetting
//!   a group, and the marks of an earlier run adopted at start;
//! - `observe.rs`: what the kernel says about the groups ([`Enforcer::observe`], at the start of
//!   every step) and the freezes and thaws still settling ([`Enforcer::settle`]);
//! - `freezing.rs`: freeze and thaw, over the cgroup files of [`freeze`], and the groups never
//!   touched;
//! - `suspension.rs`: the suspend and resume jobs, over the checkpoint worker of [`suspend`];
//! - `kill.rs`: the ladder's signal and kill steps, over the pidfd signals of [`signal`];
//! - [`restored`]: a process restored from a checkpoint is checkpointed again, its device seen
//!   empty, before a signal that ends it (cuda-checkpoint #53), or the kill is refused;
//! - `v1.rs`: which group to freeze, and a workload's group in the v1 freezer hierarchy;
//! - `offline.rs`: `gpushare-agent thaw --all`, without a running agent;
//! - [`lock`]: one agent per state directory.
//!
//! Executors never wait: a freeze is requested and read back once (`done` if the kernel already
//! reports the group frozen, `pending` otherwise); [`Enforcer::settle`] reads pending groups again
//! when the event loop asks, and every step starts with [`Enforcer::observe`], which reports the
//! kernel's view of every group the agent froze (and of the ones it wants frozen) to the policy.
//!
//! Safety rules applied here, whatever the policy says:
//! - signals go through the pidfd the attribution holds for the process since it was verified, or
//!   through a fresh pidfd whose start time is checked after it was opened ([`signal`]);
//! - a freeze is written to the [`ledger`] and marked on the group ([`marks`]) before it is
//!   applied; the agent only thaws groups it froze itself (same inode), so a `docker pause` or an
//!   operator's freeze is never undone by it;
//! - the root group and any group containing the agent itself are never frozen or killed;
//! - a dry run writes nothing: no cgroup file, no ledger, no mark;
//! - one agent per state directory ([`lock`]).

pub mod checkpoint;
pub mod driver_limits;
pub mod freeze;
mod freezing;
mod kill;
pub mod ledger;
pub mod lock;
pub mod marks;
mod observe;
mod offline;
mod ours;
pub mod restored;
pub mod signal;
mod suspension;
mod v1;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use log::warn;

use self::{
    freezing::Pending,
    ledger::FreezeLedger,
    lock::{LockError, StateLock},
};
pub use self::{
    freezing::Unwound,
    kill::To,
    observe::Settled,
    offline::{Room, ThawAllReport, thaw_everything},
    suspension::SuspendEnded,
};
use crate::{
    attribution::{Pidfd, ProcessIdentity, cgroupfs},
    cuda::Checkpointer,
};

/// The result of one executed action, for logs and the `{action, result}` metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done: the kernel reports it.
    Ok,
    /// Requested; the kernel does not report it yet (the step keeps observing).
    Pending,
    /// Dry run: reported, not done.
    DryRun,
    /// Nothing to do (already in that state, or the processes are gone).
    Noop,
    /// Refused by a safety rule (protected group, unverified process, unwritable ledger).
    Refused,
    /// Tried and failed.
    Failed,
    /// A signal step skipped the process: it does not catch the signal, which would end it.
    NotCaught,
}

impl Outcome {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Pending => "pending",
            Self::DryRun => "dry_run",
            Self::Noop => "noop",
            Self::Refused => "refused",
            Self::Failed => "failed",
            Self::NotCaught => "not_caught",
        }
    }
}

/// A process to signal, with the pidfd attribution holds for it (if any).
#[derive(Clone, Debug)]
pub struct Target {
    /// Its verified identity.
    pub identity: ProcessIdentity,
    /// A pidfd held since the identity was verified.
    pub pidfd: Option<Pidfd>,
}

impl From<ProcessIdentity> for Target {
    /// A target without a held pidfd: its start time is checked through a fresh one.
    fn from(identity: ProcessIdentity) -> Self {
        Self {
            identity,
            pidfd: None,
        }
    }
}

/// Executes freezes, thaws, suspensions, signals and kills, and observes groups.
pub struct Enforcer {
    v2_root: PathBuf,
    v1_freezer_root: Option<PathBuf>,
    state_dir: PathBuf,
    ledger: Option<FreezeLedger>,
    problems: Vec<String>,
    dry_run: bool,
    /// In a dry run, the workloads acted on all the same (an auditor that opted in took them).
    taken: BTreeSet<String>,
    agent_cgroup: Option<String>,
    marks_ok: bool,
    pending: BTreeMap<PathBuf, Pending>,
    _lock: Option<StateLock>,
    cuda: Result<Arc<Checkpointer>, String>,
    jobs: BTreeMap<String, checkpoint::Job>,
    /// Suspends that failed since the last observation: (cause, reason) by workload.
    suspend_failures: BTreeMap<String, (checkpoint::Cause, String)>,
    /// Kills refused, by reason (see [`restored`]).
    kill_refusals: BTreeMap<&'static str, u64>,
    /// The restored processes of each workload whose kill was refused (not tried again).
    refused_kills: BTreeMap<String, Vec<ProcessIdentity>>,
}

impl Enforcer {
    /// An enforcer over the v2 hierarchy at `v2_root`, recording freezes in `state_dir`. Fails only
    /// when another agent holds the state directory. A ledger that cannot be used (unwritable
    /// directory) does not stop the agent: freezes are then refused (and reported), thaws still work.
    pub fn new(v2_root: PathBuf, state_dir: &Path, dry_run: bool) -> Result<Self, LockError> {
        let mut problems = Vec::new();
        let lock = match StateLock::acquire(state_dir) {
            Ok(l) => Some(l),
            Err(e @ LockError::Held { .. }) => return Err(e),
            Err(e) => {
                problems.push(format!("{e}; freezes are refused"));
                None
            }
        };
        let ledger = match open_ledger(state_dir) {
            Ok(l) => Some(l),
            Err(e) => {
                problems.push(format!(
                    "the freeze ledger cannot be used ({e:#}); freezes are refused until the \
                     state directory is writable"
                ));
                None
            }
        };
        for p in &problems {
            warn!("{p}");
        }
        Ok(Self::with_state(
            v2_root, state_dir, lock, ledger, problems, dry_run,
        ))
    }

    /// The one constructor, of the agent's enforcer ([`Enforcer::new`]) and of `thaw --all`'s:
    /// over the state directory as it could be taken (its lock and ledger, or why not). Groups
    /// marked by this state directory that the ledger does not list are adopted.
    fn with_state(
        v2_root: PathBuf,
        state_dir: &Path,
        lock: Option<StateLock>,
        ledger: Option<FreezeLedger>,
        problems: Vec<String>,
        dry_run: bool,
    ) -> Self {
        let mut e = Self {
            v2_root,
            v1_freezer_root: freeze::v1_freezer_root(),
            state_dir: state_dir.to_path_buf(),
            ledger,
            problems,
            dry_run,
            taken: BTreeSet::new(),
            agent_cgroup: cgroupfs::cgroup_path_of_pid(std::process::id()).ok(),
            marks_ok: true,
            pending: BTreeMap::new(),
            _lock: lock,
            cuda: Err("no CUDA driver loaded (--cuda-lib)".into()),
            jobs: BTreeMap::new(),
            suspend_failures: BTreeMap::new(),
            kill_refusals: BTreeMap::new(),
            refused_kills: BTreeMap::new(),
        };
        e.adopt_marks();
        e
    }

    /// The CUDA checkpoint API the `suspend` step uses, or why there is none.
    pub fn set_checkpointer(&mut self, cuda: Result<Arc<Checkpointer>, String>) {
        self.cuda = cuda;
    }

    /// Why `suspend` is unavailable, if it is.
    pub fn suspend_unavailable(&self) -> Option<&str> {
        self.cuda.as_ref().err().map(String::as_str)
    }

    /// Whether actions are only reported.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// In a dry run, the workloads to act on all the same from now on (an auditor that opted in
    /// took their grants: `[defaults] take_unheld`). The ledger is written from the first one on.
    pub fn set_taken(&mut self, taken: &BTreeSet<String>) {
        if self.taken != *taken {
            self.taken.clone_from(taken);
        }
        if self.dry_run
            && !taken.is_empty()
            && let Some(l) = self.ledger.as_mut()
        {
            l.set_writable();
        }
    }

    /// Whether an action on `workload` is only reported: a dry run, unless it was taken.
    pub(crate) fn dry(&self, workload: &str) -> bool {
        self.dry_run && !self.taken.contains(workload)
    }

    /// Whether a change to the record of the group at `dir` is only reported: a dry run, unless
    /// its workload was taken.
    pub(super) fn dry_at(&self, dir: &Path) -> bool {
        self.dry_run
            && !self
                .ledger
                .as_ref()
                .and_then(|l| l.get(dir))
                .is_some_and(|r| self.taken.contains(&r.workload))
    }

    /// The workloads the ledger holds a freeze or suspension of.
    pub fn held_workloads(&self) -> BTreeSet<String> {
        self.ledger
            .as_ref()
            .map(|l| l.records().map(|r| r.workload.clone()).collect())
            .unwrap_or_default()
    }

    /// Reasons the enforcer runs degraded (for `/healthz` and `status`).
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// The v2 directory of a group given by its path relative to the root.
    pub fn v2_dir(&self, rel: &str) -> PathBuf {
        crate::sys::kernel_text::under(&self.v2_root, rel)
    }
}

/// The ledger of `state_dir`, its warnings (a repaired or unreadable file) logged.
fn open_ledger(state_dir: &Path) -> anyhow::Result<FreezeLedger> {
    let (ledger, warnings) = FreezeLedger::open(state_dir)?;
    for w in warnings {
        warn!("{w}");
    }
    Ok(ledger)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use proptest::prelude::*;

    use super::*;
    use crate::policy::GpuScope;

    /// A fake cgroup v2 tree of plain files: what the executors would write to shows up as a
    /// changed file.
    fn fake_tree(root: &Path, groups: &[&str]) {
        for g in groups {
            let dir = root.join(g);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.freeze"), "0\n").unwrap();
            std::fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
            std::fs::write(dir.join("cgroup.kill"), "").unwrap();
            std::fs::write(dir.join("cgroup.procs"), "").unwrap();
        }
    }

    /// Every file under `root` with its contents, and every directory's xattrs.
    fn contents(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for name in xattr::list(&dir).into_iter().flatten() {
                let v = xattr::get(&dir, &name).ok().flatten().unwrap_or_default();
                out.insert(dir.join(format!("xattr:{}", name.to_string_lossy())), v);
            }
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    out.insert(e.path(), std::fs::read(e.path()).unwrap());
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// A dry run writes to no cgroup file, sets no mark and records nothing, whatever it is
        /// asked to do.
        #[test]
        fn a_dry_run_writes_nothing(actions in proptest::collection::vec((0u8..5, 0usize..3), 1..20)) {
            let base = std::env::temp_dir().join(format!(
                "gpushare-dry-{}-{}",
                std::process::id(),
                rand_suffix()
            ));
            let root = base.join("v2");
            let groups = ["a", "b/c", "d"];
            fake_tree(&root, &groups);
            let before = contents(&root);
            let state = base.join("state");
            let mut e = Enforcer::new(root.clone(), &state, true).unwrap();
            let me = crate::attribution::procinfo::snapshot(std::process::id()).unwrap().identity;
            for (kind, g) in actions {
                let rel = format!("/{}", groups[g]);
                let key = format!("cgroup://{rel}");
                let o = match kind {
                    0 => e.freeze(&key, &rel, GpuScope::All, None, "t", Instant::now()),
                    1 => e.thaw(&key, Instant::now()),
                    2 => e.kill(&key, &rel, &[Target::from(me)], &mut || unreachable!()),
                    3 => e.end(&key, &rel, &[Target::from(me)], libc::SIGUSR2, &mut || unreachable!())[0].1,
                    _ => {
                        e.observe([(key.as_str(), rel.as_str())]);
                        e.settle();
                        Outcome::Noop
                    }
                };
                prop_assert!(matches!(o, Outcome::DryRun | Outcome::Noop), "{kind}: {o:?}");
            }
            prop_assert_eq!(contents(&root), before);
            prop_assert!(!state.join(ledger::LEDGER_FILE).exists(), "a dry run wrote a ledger");
            drop(e);
            let _ = std::fs::remove_dir_all(&base);
        }
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }
}
