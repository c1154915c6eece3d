//! Every grant proven held ([`crate::verify`]): the facts of each grant in the snapshot's rows,
//! observed from the kernel and the driver, and the verdicts added to the snapshot.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{Agent, Observation};
use crate::{
    nvml::limits::code_name,
    observe::mechanisms::MechanismReader,
    snapshot::{GrantView, Snapshot, WorkloadView},
    verify::{
        self, AgentMode, DriverLimitFact, Facts, GrantInput, GrantVerdict, LadderPosition,
        MpsService, ProcessFact, Verification,
    },
};

/// How long a driver limit read back stays the answer (one NVML call a group and GPU each time).
const LIMIT_READ_EVERY: Duration = Duration::from_secs(10);

/// What one step's grants share: the node's GPUs (index, UUID), each GPU's MPS clients as the
/// driver listed them (asked once a step, where a grant wants them), and the time.
struct Step<'a> {
    node: &'a [(u32, &'a str)],
    mps: HashMap<u32, Option<HashSet<u32>>>,
    now: Instant,
}

/// What the verifier keeps between steps.
pub(super) struct Verifier {
    reader: MechanismReader,
    limits: HashMap<(u32, String), (Instant, DriverLimitFact)>,
    /// Each grant's verdict at the last step, by (workload, GPU): an Event goes out when one turns
    /// bad.
    last: HashMap<(String, String), GrantVerdict>,
    /// The last grants, the rows and mode they were verified from, and when: the same rows (the
    /// publisher shares a row while nothing in it changed) in the same mode within [`REVERIFY`]
    /// give the same grants, shared, without reading or allocating anything.
    verified: Option<Verified>,
    /// The grants the Events were last looked for in (the same, shared, need no second look).
    evented: Option<Arc<[GrantView]>>,
    /// In a dry run, the workloads gpushare's ladder acts on all the same (`[defaults]
    /// take_unheld`): decided from the last step's verdicts, read by this step's policy and
    /// executors.
    pub(super) taken: BTreeSet<String>,
}

/// Grants as verified: from these rows, in this mode, with these workloads taken, at this time;
/// and the workloads whose grant [`verify::Verification::takes`].
struct Verified {
    rows: Vec<Arc<WorkloadView>>,
    mode: AgentMode,
    taken: BTreeSet<String>,
    at: Instant,
    grants: Arc<[GrantView]>,
    takes: BTreeSet<String>,
}

/// How long grants verified from unchanged rows stand (the sampling interval's default): the
/// facts beside the rows (driver limits, maps, MPS clients) are read again at least this often.
const REVERIFY: Duration = Duration::from_secs(1);

impl Verifier {
    pub(super) fn new(v2_root: std::path::PathBuf) -> Self {
        Self {
            reader: MechanismReader::new("/proc".into(), v2_root),
            limits: HashMap::new(),
            last: HashMap::new(),
            verified: None,
            evented: None,
            taken: BTreeSet::new(),
        }
    }
}

impl Agent {
    /// Queues an Event on the pod of each grant whose verdict turned bad since the last step (the
    /// poster's spam filter groups them by pod and reason); remembers this step's verdicts.
    pub(super) fn grant_events(&mut self, grants: &Arc<[GrantView]>, obs: &Observation) {
        if self
            .verifier
            .evented
            .as_ref()
            .is_some_and(|e| Arc::ptr_eq(e, grants))
        {
            return;
        }
        self.verifier.evented = Some(Arc::clone(grants));
        let last = std::mem::take(&mut self.verifier.last);
        for g in grants.iter() {
            let key = (g.workload.clone(), g.gpu_uuid.clone());
            let was = last.get(&key).copied();
            self.verifier.last.insert(key, g.verdict);
            if g.verdict == GrantVerdict::Held || was == Some(g.verdict) {
                continue;
            }
            let Some(events) = &self.events else {
                continue;
            };
            let meta = obs
                .processes
                .iter()
                .find(|p| p.key() == g.workload)
                .map(|p| &*p.workload);
            let view = self.workloads.kube_view();
            if let Some(e) = super::events::grant_event(g, meta, view.as_deref()) {
                events.send(e);
            }
        }
    }

    fn mode(&self) -> AgentMode {
        if self.opts.dry_run {
            AgentMode::DryRun
        } else if self.quotas.observe_only() {
            AgentMode::ObserveOnly
        } else {
            AgentMode::Enforce
        }
    }

    /// The driver's limit on `cgroup` on GPU `index`, read back at most every
    /// [`LIMIT_READ_EVERY`].
    fn driver_limit(&mut self, index: u32, cgroup: &str, now: Instant) -> DriverLimitFact {
        let key = (index, cgroup.to_string());
        if let Some((at, fact)) = self.verifier.limits.get(&key)
            && now.duration_since(*at) < LIMIT_READ_EVERY
        {
            return fact.clone();
        }
        let driver = self.sampler.driver_version().unwrap_or("?").to_string();
        let fact = match &self.limiter {
            None => DriverLimitFact::Unknown {
                reason: "driver limits are not read by this agent".into(),
            },
            Some(l) if !l.has_api() => DriverLimitFact::Unsupported { driver },
            Some(l) => match l.read_limit(&self.sampler, index, cgroup) {
                None => DriverLimitFact::Unknown {
                    reason: format!("GPU {index} cannot be asked"),
                },
                Some(Err(3)) => DriverLimitFact::Unsupported { driver },
                Some(Err(rc)) => DriverLimitFact::Unknown {
                    reason: format!("reading the driver limit: {}", code_name(rc)),
                },
                Some(Ok(None)) => DriverLimitFact::NotSet,
                Some(Ok(Some((_, hard)))) => DriverLimitFact::Set { hard_bytes: hard },
            },
        };
        self.verifier.limits.insert(key, (now, fact.clone()));
        fact
    }

    /// The grants of `snap`'s rows (a quota on one GPU, or a total over every GPU), each
    /// verified; then the workloads the next step takes ([`Self::take_unheld`]).
    pub(super) fn verify_grants(&mut self, snap: &Snapshot) -> Arc<[GrantView]> {
        let now = Instant::now();
        let mode = self.mode();
        if let Some(v) = &self.verifier.verified
            && v.mode == mode
            && v.taken == self.verifier.taken
            && now.duration_since(v.at) < REVERIFY
            && v.rows.len() == snap.workloads.len()
            && v.rows
                .iter()
                .zip(&snap.workloads)
                .all(|(a, b)| Arc::ptr_eq(a, &b.row))
        {
            let grants = Arc::clone(&v.grants);
            self.take_unheld(mode);
            return grants;
        }
        let mut takes = BTreeSet::new();
        let grants: Arc<[GrantView]> = self.verify_rows(snap, now, &mut takes).into();
        self.verifier.verified = Some(Verified {
            rows: snap.workloads.iter().map(|e| Arc::clone(&e.row)).collect(),
            mode,
            taken: self.verifier.taken.clone(),
            at: now,
            grants: Arc::clone(&grants),
            takes,
        });
        self.take_unheld(mode);
        grants
    }

    /// The workloads the next step's ladder acts on in a dry run: where the operator opted in
    /// (`[defaults] take_unheld`), those whose grant this step's verdicts take, and every
    /// workload gpushare holds isolated (a freeze or suspension on record); without the opt-in
    /// (turned off since), only those taken before that are still isolated, until the ladder
    /// lets them go. Never in enforce mode (the ladder acts on all) or observe only (on none).
    fn take_unheld(&mut self, mode: AgentMode) {
        let opted = mode == AgentMode::DryRun
            && !self.quotas.observe_only()
            && self.quotas.current().defaults().take_unheld;
        let taken = if !self.opts.dry_run {
            BTreeSet::new()
        } else if opted {
            let mut t = self.enforcer.held_workloads();
            if let Some(v) = &self.verifier.verified {
                t.extend(v.takes.iter().cloned());
            }
            t
        } else if self.verifier.taken.is_empty() {
            return;
        } else {
            let held = self.enforcer.held_workloads();
            self.verifier
                .taken
                .iter()
                .filter(|k| held.contains(*k))
                .cloned()
                .collect()
        };
        self.enforcer.set_taken(&taken);
        self.verifier.taken = taken;
    }

    fn verify_rows(
        &mut self,
        snap: &Snapshot,
        now: Instant,
        takes: &mut BTreeSet<String>,
    ) -> Vec<GrantView> {
        let node: Vec<(u32, String)> = snap
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.clone()))
            .collect();
        let node: Vec<(u32, &str)> = node.iter().map(|(i, u)| (*i, u.as_str())).collect();
        // A total's processes are those of the workload's rows on each GPU.
        let mut pids: HashMap<&str, Vec<u32>> = HashMap::new();
        for e in &snap.workloads {
            pids.entry(e.row.workload.as_str())
                .or_default()
                .extend(&e.row.pids);
        }
        let mut step = Step {
            node: &node,
            mps: HashMap::new(),
            now,
        };
        let mut out = Vec::new();
        for entry in &snap.workloads {
            let row = &entry.row;
            let Some(bytes) = row.quota_bytes else {
                continue;
            };
            let index = node.iter().find(|(_, u)| *u == row.gpu_uuid).map(|g| g.0);
            if index.is_none() && row.gpu_uuid != "all" {
                continue;
            }
            let row_pids = match index {
                Some(_) => &row.pids[..],
                None => pids.get(row.workload.as_str()).map_or(&[][..], |p| &p[..]),
            };
            let v = self.verify_row(row, index, bytes, row_pids, &mut step);
            if v.takes {
                takes.insert(row.workload.clone());
            }
            out.push(GrantView {
                workload: row.workload.clone(),
                gpu_uuid: row.gpu_uuid.clone(),
                grant_bytes: bytes,
                used_bytes: row.used_bytes,
                verdict: v.verdict,
                mechanisms: v.mechanisms,
            });
        }
        let table = self.tracker.table();
        self.verifier.reader.retain(|pid| table.get(pid).is_some());
        self.verifier
            .limits
            .retain(|_, (at, _)| now.duration_since(*at) < LIMIT_READ_EVERY);
        out
    }

    /// One row's grant: on GPU `index`, or (`None`) a total over every GPU, which no per-GPU
    /// mechanism (a driver limit, an MPS pinned limit) holds: only gpushare, an in-process
    /// limiter and `dmem` are judged there.
    fn verify_row(
        &mut self,
        row: &WorkloadView,
        index: Option<u32>,
        bytes: u64,
        pids: &[u32],
        step: &mut Step<'_>,
    ) -> Verification {
        let (node, now) = (step.node, step.now);
        let mut vars = self.workloads.env_quotas().vars_of(&row.workload).to_vec();
        if index.is_none() {
            vars.retain(|(k, _)| {
                !k.starts_with("NVIDIA_GPU_MEMORY_") && !k.starts_with("CUDA_MPS_")
            });
        }
        let wants_mps = vars
            .iter()
            .any(|(k, _)| k == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
        let wants_limiter = vars
            .iter()
            .any(|(k, _)| k.starts_with("CUDA_DEVICE_MEMORY_LIMIT"));
        let clients = match index {
            Some(i) if wants_mps => step
                .mps
                .entry(i)
                .or_insert_with(|| {
                    self.sampler
                        .mps_clients(i)
                        .ok()
                        .map(|l| l.into_iter().collect())
                })
                .clone(),
            _ => None,
        };
        let mut processes = Vec::with_capacity(pids.len());
        for &pid in pids {
            let identity = self.tracker.table().get(pid).map(|t| t.identity);
            let seen = identity.map(|id| {
                self.verifier
                    .reader
                    .process(id, now, wants_limiter, wants_mps)
            });
            processes.push(ProcessFact {
                pid,
                limiter_mapped: seen.and_then(|s| s.limiter_mapped),
                mps_pipe_present: seen.and_then(|s| s.mps_pipe_present),
                mps: match &clients {
                    Some(c) if c.contains(&pid) => MpsService::Served,
                    Some(_) => MpsService::NotServed,
                    None => MpsService::Unknown,
                },
            });
        }
        let visible = verify::visible_gpus(&vars, node);
        let driver_limit = match index {
            Some(i) => self.driver_limit(i, &row.cgroup_path, now),
            None => DriverLimitFact::Unknown {
                reason: "a total over every GPU: the driver limits one GPU at a time".into(),
            },
        };
        let facts = Facts {
            mode: self.mode(),
            ladder: LadderPosition::from_state(&row.state),
            driver_limit,
            processes: &processes,
            dmem: self.verifier.reader.dmem(&row.cgroup_path, None),
            taken: self.verifier.taken.contains(&row.workload),
        };
        let grant = GrantInput {
            gpu_index: index.unwrap_or(u32::MAX),
            gpu_uuid: &row.gpu_uuid,
            bytes,
            tolerance: 0,
            usage: Some(row.used_bytes),
            vars: &vars,
            visible: visible.as_deref(),
            node_gpus: node,
        };
        verify::verify(&grant, &facts)
    }
}
