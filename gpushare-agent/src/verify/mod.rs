//! Every grant proven held (issue 42): for a workload's grant on one GPU, which mechanisms claim
//! it, whether each is in force as the kernel and the driver show it, and the verdict.
//!
//! Pure: the caller observes (the agent's mode, the ladder's position, the driver's limit read
//! back, the libraries mapped in each GPU process, the MPS server and pipe directory as each
//! process sees them, `dmem.max`) and hands the facts in; [`verify`] decides. No I/O, no clock.
//!
//! - `gpushare` (its own ladder) is always listed: in force only when it would act (enforce
//!   mode), absent in a dry run or observe-only mode.
//! - `driver_limit` is listed where NVIDIA's toolkit variables claim it or the driver shows a
//!   limit on the workload's group; `mps` where `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` claims it;
//!   `in_process` where HAMi's `CUDA_DEVICE_MEMORY_LIMIT*` claims it; `dmem` always (absent where
//!   the kernel has no controller).
//! - The verdict: in enforce mode gpushare holds the grant unless the workload is over it
//!   (tolerance included) past its grace and not isolated (`violated`); otherwise (dry run,
//!   observe only) the other mechanisms' alone: none in force is `unenforced`, one in force with
//!   usage over the grant is `violated` (the mechanism failed), else `held`. Over means over the
//!   grant plus `tolerance` *and* liable by the ladder's own judgment (which applies the quota's
//!   tolerance and elastic borrowing in every mode): a workload the ladder reads `ok` is not over.
//! - The operator's opt-in (`[defaults] take_unheld`): a dry run takes, with gpushare's ladder,
//!   the grants the other mechanisms leave `unenforced` or `violated` ([`Verification::takes`],
//!   for the next step: the verdict of one step decides the next, never its own). A grant taken
//!   has `gpushare` in force and is judged as in enforce mode. It stays taken while the others do
//!   not hold it or the ladder is not at rest (liable, isolating, isolated), so a verdict that
//!   flips never starts and stops the ladder; it is taken only on facts observed (a mechanism a
//!   variable claims that could not be observed might hold it: fail open).

mod mechanisms;
#[cfg(test)]
mod tests;

pub use self::mechanisms::visible_gpus;

/// A mechanism that can hold a grant.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum MechanismKind {
    /// gpushare's own ladder.
    Gpushare,
    /// The driver's per-cgroup limit (set by gpushare or NVIDIA's toolkit hook).
    DriverLimit,
    /// An MPS pinned device memory limit.
    Mps,
    /// HAMi-core or another preloaded limiter.
    InProcess,
    /// The kernel's `dmem` cgroup controller.
    Dmem,
}

impl MechanismKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpushare => "gpushare",
            Self::DriverLimit => "driver_limit",
            Self::Mps => "mps",
            Self::InProcess => "in_process",
            Self::Dmem => "dmem",
        }
    }
}

/// Whether a mechanism holds.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum MechanismState {
    /// Observed in force.
    InForce,
    /// Not there (nothing set it up, or this node cannot have it).
    Absent,
    /// Set up or claimed, and observed not to hold.
    Failed,
}

impl MechanismState {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InForce => "in_force",
            Self::Absent => "absent",
            Self::Failed => "failed",
        }
    }
}

/// One mechanism's state for a grant, with why when it is not in force.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct MechanismCheck {
    /// Which mechanism.
    pub mechanism: MechanismKind,
    /// Its state.
    pub state: MechanismState,
    /// Why, in words (empty when in force and nothing to say).
    pub reason: String,
}

/// The verdict on one grant.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum GrantVerdict {
    /// A mechanism is in force and usage is within the grant (or the ladder isolated it).
    Held,
    /// A grant and no mechanism in force.
    Unenforced,
    /// Usage over the grant past tolerance while a mechanism claims to hold it.
    Violated,
}

impl GrantVerdict {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Unenforced => "unenforced",
            Self::Violated => "violated",
        }
    }

    /// Every verdict, in order (for node-level counts with zeros).
    pub const ALL: [Self; 3] = [Self::Held, Self::Unenforced, Self::Violated];
}

/// How the agent acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentMode {
    /// It acts on what it decides.
    Enforce,
    /// `--dry-run`: it decides and touches nothing.
    DryRun,
    /// The quota configuration was invalid at start: alerts and metrics only.
    ObserveOnly,
}

/// Where gpushare's ladder stands for the workload on this GPU, as the kernel shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LadderPosition {
    /// Not liable by its quota's rules (within it, or elastic without pressure).
    NotLiable,
    /// Liable, in grace or with an isolation under way (freezing, suspending).
    InGrace,
    /// Isolated as its quota says: frozen, suspended, killed or being killed.
    Isolated,
    /// Past grace and not isolated (alerted or signalled only).
    NotIsolated,
}

impl LadderPosition {
    /// The position a reported state (`policy::Status`'s words) means.
    pub fn from_state(state: &str) -> Self {
        match state {
            "ok" => Self::NotLiable,
            "over_quota" | "freezing" | "suspending" | "resuming" => Self::InGrace,
            "frozen" | "suspended" | "killed" | "killing" => Self::Isolated,
            _ => Self::NotIsolated,
        }
    }
}

/// The driver's per-cgroup limit on the workload's group and this GPU, as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverLimitFact {
    /// The driver has no per-cgroup limits API.
    Unsupported {
        /// The driver's version, in words.
        driver: String,
    },
    /// The driver could not be asked (no driver, a failed call).
    Unknown {
        /// Why.
        reason: String,
    },
    /// The driver has the API and reports no limit on the group.
    NotSet,
    /// The driver reports this hard limit, bytes.
    Set {
        /// Its hard limit.
        hard_bytes: u64,
    },
}

/// Whether an MPS control daemon serves a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MpsService {
    /// The driver lists it as an MPS client.
    Served,
    /// The driver lists it, not as an MPS client.
    NotServed,
    /// Not known (the driver could not be asked).
    Unknown,
}

/// What was observed of one GPU process of the workload on this GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessFact {
    /// Its pid.
    pub pid: u32,
    /// Whether an in-process limiter library is mapped in it (`None`: its maps were unreadable).
    pub limiter_mapped: Option<bool>,
    /// Whether the MPS pipe directory exists as it sees it (`None`: not looked at).
    pub mps_pipe_present: Option<bool>,
    /// Whether an MPS server serves it.
    pub mps: MpsService,
}

/// `dmem` as the kernel shows it for the workload's group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DmemFact {
    /// The kernel has no `dmem` controller.
    NoController,
    /// The controller exists but is not enabled on the group, or `dmem.max` could not be read.
    Unreadable {
        /// Why.
        reason: String,
    },
    /// `dmem.max` for this GPU's region: `None` for `max` (no limit).
    Max(Option<u64>),
}

/// Everything observed for one grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts<'a> {
    /// The agent's mode.
    pub mode: AgentMode,
    /// The ladder's position for the workload on this GPU.
    pub ladder: LadderPosition,
    /// The driver's limit on the group.
    pub driver_limit: DriverLimitFact,
    /// The GPU processes of the workload on this GPU.
    pub processes: &'a [ProcessFact],
    /// `dmem` on the group.
    pub dmem: DmemFact,
    /// In a dry run, gpushare's ladder acts on the workload all the same: an auditor that opted
    /// in took the grant at the last step.
    pub taken: bool,
}

/// One grant: a workload's limit on one GPU, with the raw variables its container was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantInput<'a> {
    /// The GPU's NVML index.
    pub gpu_index: u32,
    /// The GPU's UUID.
    pub gpu_uuid: &'a str,
    /// The grant, bytes.
    pub bytes: u64,
    /// Usage above `bytes` still within the grant (the quota's tolerance), bytes.
    pub tolerance: u64,
    /// Usage on this GPU, bytes; `None` when unknown (never judged over: fail open).
    pub usage: Option<u64>,
    /// The raw quota variables the container was given (name, value).
    pub vars: &'a [(String, String)],
    /// The host GPUs (NVML indices) the container's processes see, where known.
    pub visible: Option<&'a [u32]>,
    /// The node's GPUs: (NVML index, UUID).
    pub node_gpus: &'a [(u32, &'a str)],
}

/// The mechanisms of one grant and its verdict.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Verification {
    /// Each mechanism listed, in [`MechanismKind`] order.
    pub mechanisms: Vec<MechanismCheck>,
    /// The verdict.
    pub verdict: GrantVerdict,
    /// Whether a dry run that opted in acts on this grant at the next step (see the module
    /// note; always `false` outside a dry run).
    pub takes: bool,
}

/// The mechanisms that claim `grant` and the verdict (see the module note).
pub fn verify(grant: &GrantInput<'_>, facts: &Facts<'_>) -> Verification {
    let mechanisms = mechanisms::all(grant, facts);
    let verdict = verdict(grant, facts, &mechanisms);
    let takes = takes(grant, facts, &mechanisms);
    Verification {
        mechanisms,
        verdict,
        takes,
    }
}

/// Whether a dry run that opted in acts on the grant at the next step: newly when the other
/// mechanisms leave it unheld on facts observed; still, once taken, until they hold it and the
/// ladder is at rest.
fn takes(grant: &GrantInput<'_>, facts: &Facts<'_>, mechanisms: &[MechanismCheck]) -> bool {
    if facts.mode != AgentMode::DryRun {
        return false;
    }
    let unheld = others_verdict(grant, facts, mechanisms) != GrantVerdict::Held;
    if facts.taken {
        unheld || facts.ladder != LadderPosition::NotLiable
    } else {
        unheld && !mechanisms::unobserved(grant, facts, mechanisms)
    }
}

/// Whether usage is over the grant past its tolerance (unknown usage never is).
fn over(grant: &GrantInput<'_>) -> bool {
    grant
        .usage
        .is_some_and(|u| u > grant.bytes.saturating_add(grant.tolerance))
}

fn verdict(
    grant: &GrantInput<'_>,
    facts: &Facts<'_>,
    mechanisms: &[MechanismCheck],
) -> GrantVerdict {
    // Over by the ladder's own judgment too (it evaluates in a dry run and observe only as well):
    // within the quota's tolerance, or over an elastic quota without pressure, it is not liable.
    if facts.mode == AgentMode::Enforce || (facts.mode == AgentMode::DryRun && facts.taken) {
        let over = over(grant) && facts.ladder != LadderPosition::NotLiable;
        return match (over, facts.ladder) {
            (true, LadderPosition::NotIsolated) => GrantVerdict::Violated,
            _ => GrantVerdict::Held,
        };
    }
    others_verdict(grant, facts, mechanisms)
}

/// The verdict of the mechanisms other than gpushare alone.
fn others_verdict(
    grant: &GrantInput<'_>,
    facts: &Facts<'_>,
    mechanisms: &[MechanismCheck],
) -> GrantVerdict {
    let over = over(grant) && facts.ladder != LadderPosition::NotLiable;
    let others_in_force = mechanisms
        .iter()
        .any(|m| m.mechanism != MechanismKind::Gpushare && m.state == MechanismState::InForce);
    match (others_in_force, over) {
        (false, _) => GrantVerdict::Unenforced,
        (true, true) => GrantVerdict::Violated,
        (true, false) => GrantVerdict::Held,
    }
}
