//! Quotas: how much GPU memory a workload may use, and what happens when it uses more.
//!
//! Design note: everything here is pure data and parsing; reading files is confined to
//! [`file::load_dir_set`]. Quotas come from two places:
//!
//! 1. Operator files (`/etc/gpushare/quotas.toml` plus `quotas.d/*.toml`), parsed strictly into a
//!    [`QuotaSet`] by [`file`](mod@file). A file that fails to parse or validate makes the whole
//!    load fail with located errors; the caller keeps the last good set in force.
//! 2. The environment the container's runtime was given ([`env`](mod@env)): GPUShare's and HAMi's
//!    device-plugin variables, read from the runtime spec (else the container's init) by
//!    `grants::env_quotas`, used only when no file entry matches the workload, and only for
//!    containers and pods (a systemd unit or a plain cgroup is enforced only when a file entry
//!    names it).
//!
//! [`QuotaSet::resolve`] picks, for one workload, the matching file entry whose selector is the
//! hardest to forge (see [`select`]) together with every other entry that has the very same selector (one per GPU scope),
//! else the env quota, else nothing. Each [`Limit`] carries its full [`Enforcement`] (mode, tolerance,
//! grace, ladder) with per-entry overrides already applied over `[defaults]` over the built-in
//! defaults, so the policy never looks anything up.

pub mod duration;
pub mod file;
pub mod grant;
pub mod lint;
pub mod select;
pub mod size;
pub mod sources;

use std::{fmt, time::Duration};

use crate::workload::WorkloadKind;

pub use self::{
    duration::{fmt_duration, parse_duration, parse_nonzero_duration},
    file::{KubernetesPatch, LocatedError, QuotaFile, load_dir_set, parse_str},
    grant::{EnvQuota, GpuInfo, GpuShareUnit, Limits, Trust, resolve_device, resolve_quota},
    select::{PathGlob, PodRef, ProtectPattern, Selector, WorkloadMeta},
    size::{ByteSize, SizeError, parse_size},
    sources::{GrantSource, Sources},
};

/// Where something was written: `file:line:col` (1-based; the column counts characters).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Location {
    /// The file, as given to the parser.
    pub file: String,
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub col: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// How the policy treats a workload over its quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Act whenever the workload is over quota.
    #[default]
    Strict,
    /// Let the workload borrow idle memory; act only while the GPU is under pressure (free memory
    /// below `elastic_reserve`), on the largest borrowers first.
    Elastic,
}

impl Mode {
    /// `strict` or `elastic`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Strict => "strict",
            Self::Elastic => "elastic",
        }
    }
}

/// How far over its quota a workload may go before it counts as over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tolerance {
    /// A fixed number of bytes.
    Bytes(u64),
    /// A share of the quota, in hundredths of a percent (`250` = 2.5%).
    Percent(u32),
}

impl Default for Tolerance {
    fn default() -> Self {
        Self::Bytes(0)
    }
}

impl Tolerance {
    /// The allowance in bytes above a quota of `limit` bytes.
    pub fn allowance(self, limit: u64) -> u64 {
        match self {
            Self::Bytes(b) => b,
            Self::Percent(hundredths) => {
                (limit as u128 * hundredths as u128 / 10_000).min(u64::MAX as u128) as u64
            }
        }
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bytes(b) => write!(f, "{}", ByteSize(*b)),
            Self::Percent(h) if h % 100 == 0 => write!(f, "{}%", h / 100),
            Self::Percent(h) => {
                let frac = format!("{:02}", h % 100);
                write!(f, "{}.{}%", h / 100, frac.trim_end_matches('0'))
            }
        }
    }
}

/// A signal a ladder step may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Signal {
    /// Its name, e.g. `SIGUSR1`.
    pub name: &'static str,
    /// Its number on this platform.
    pub number: i32,
}

/// Signals a ladder may send. Stop/continue signals are left out: they would outlive a thaw.
pub const SIGNALS: [Signal; 9] = [
    Signal {
        name: "SIGHUP",
        number: libc::SIGHUP,
    },
    Signal {
        name: "SIGINT",
        number: libc::SIGINT,
    },
    Signal {
        name: "SIGQUIT",
        number: libc::SIGQUIT,
    },
    Signal {
        name: "SIGABRT",
        number: libc::SIGABRT,
    },
    Signal {
        name: "SIGKILL",
        number: libc::SIGKILL,
    },
    Signal {
        name: "SIGUSR1",
        number: libc::SIGUSR1,
    },
    Signal {
        name: "SIGUSR2",
        number: libc::SIGUSR2,
    },
    Signal {
        name: "SIGALRM",
        number: libc::SIGALRM,
    },
    Signal {
        name: "SIGTERM",
        number: libc::SIGTERM,
    },
];

impl Signal {
    /// `SIGUSR1`.
    pub const USR1: Signal = SIGNALS[5];
    /// `SIGKILL`.
    pub const KILL: Signal = SIGNALS[4];

    /// Looks a signal up by name: `SIGUSR1`, `USR1` or `sigusr1`.
    pub fn from_name(name: &str) -> Option<Signal> {
        let upper = name.trim().to_ascii_uppercase();
        let full = if upper.starts_with("SIG") {
            upper
        } else {
            format!("SIG{upper}")
        };
        SIGNALS.iter().copied().find(|s| s.name == full)
    }
}

/// What one ladder step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepAction {
    /// Report only (log, metrics, API).
    Alert,
    /// Send a signal to the workload's GPU processes, e.g. SIGUSR1 so they can shrink.
    Signal(Signal),
    /// Freeze the workload's cgroup.
    Freeze,
    /// Move the workload's GPU memory to host memory (CUDA checkpoint) and freeze it: the GPU
    /// memory is given back to the neighbours until it is resumed.
    Suspend,
    /// Kill the workload's processes with this signal (SIGKILL unless configured).
    Kill(Signal),
}

impl StepAction {
    /// Every step's name, in ladder order.
    pub const NAMES: [&'static str; 5] = ["alert", "signal", "freeze", "suspend", "kill"];

    /// The step named `name` (one of [`Self::NAMES`]), with `signal` for `signal` (default
    /// SIGUSR1) and `kill` (default SIGKILL) steps.
    pub fn from_name(name: &str, signal: Option<Signal>) -> Option<Self> {
        Some(match name {
            "alert" => Self::Alert,
            "signal" => Self::Signal(signal.unwrap_or(Signal::USR1)),
            "freeze" => Self::Freeze,
            "suspend" => Self::Suspend,
            "kill" => Self::Kill(signal.unwrap_or(Signal::KILL)),
            _ => return None,
        })
    }

    /// `alert`, `signal`, `freeze`, `suspend` or `kill`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Alert => "alert",
            Self::Signal(_) => "signal",
            Self::Freeze => "freeze",
            Self::Suspend => "suspend",
            Self::Kill(_) => "kill",
        }
    }

    /// Escalation rank: steps must appear in non-decreasing rank.
    pub fn rank(self) -> u8 {
        match self {
            Self::Alert => 0,
            Self::Signal(_) => 1,
            Self::Freeze => 2,
            Self::Suspend => 3,
            Self::Kill(_) => 4,
        }
    }
}

/// One rung of the escalation ladder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct LadderStep {
    /// What to do.
    pub action: StepAction,
    /// How long after the workload was first seen over quota (never before the grace period ends).
    pub after: Duration,
}

impl fmt::Display for LadderStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.action {
            StepAction::Signal(s) => {
                write!(f, "signal {} after {}", s.name, fmt_duration(self.after))
            }
            StepAction::Kill(s) if s != Signal::KILL => {
                write!(f, "kill {} after {}", s.name, fmt_duration(self.after))
            }
            a => write!(f, "{} after {}", a.name(), fmt_duration(self.after)),
        }
    }
}

/// Everything the policy needs to treat one quota.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Enforcement {
    /// Strict or elastic.
    pub mode: Mode,
    /// Allowance over the quota.
    pub tolerance: Tolerance,
    /// How long a workload must stay over before any step fires.
    pub grace: Duration,
    /// Steps in escalation order; may be empty (observe only).
    pub ladder: Vec<LadderStep>,
}

impl Default for Enforcement {
    /// Strict, no tolerance, 3 s grace, ladder: alert at once, SIGUSR1 after 5 s, freeze after 15 s.
    /// No kill step: killing is opt-in.
    fn default() -> Self {
        Self {
            mode: Mode::Strict,
            tolerance: Tolerance::Bytes(0),
            grace: Duration::from_secs(3),
            ladder: vec![
                LadderStep {
                    action: StepAction::Alert,
                    after: Duration::ZERO,
                },
                LadderStep {
                    action: StepAction::Signal(Signal::USR1),
                    after: Duration::from_secs(5),
                },
                LadderStep {
                    action: StepAction::Freeze,
                    after: Duration::from_secs(15),
                },
            ],
        }
    }
}

impl Enforcement {
    /// The ladder in one line: `alert after 0s, signal SIGUSR1 after 5s, freeze after 15s`.
    pub fn ladder_text(&self) -> String {
        if self.ladder.is_empty() {
            return "none (observe only)".to_string();
        }
        let steps: Vec<String> = self.ladder.iter().map(ToString::to_string).collect();
        steps.join(", ")
    }
}

/// Settings from `[defaults]` (or built in) that are not per entry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Defaults {
    /// Enforcement of entries that do not override it, and of env quotas.
    pub enforcement: Enforcement,
    /// Elastic mode: a GPU is under pressure when its free memory is below this many bytes.
    pub elastic_reserve: u64,
    /// Unit of GPUShare's env values.
    pub gpushare_unit: GpuShareUnit,
    /// Whether workloads' env quotas are honoured.
    pub env_quotas: bool,
    /// The driver's memory allowed beyond each quota, per GPU.
    pub context_overhead: OverheadSetting,
    /// In a dry run, take with gpushare's own ladder the grants no other mechanism holds (their
    /// verdict `unenforced` or `violated`, [`crate::verify`]); nothing else is acted on.
    pub take_unheld: bool,
    /// `[kubernetes]`: the sources in the cluster (read at start; a change needs a restart).
    pub kubernetes: KubernetesSettings,
}

/// `context_overhead` of `[defaults]`: what a CUDA context takes on a GPU, allowed beyond every
/// quota once per workload and GPU (see [`crate::observe::overhead`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OverheadSetting {
    /// Learn it on this node for GPU models without a size set (`"auto"`, the default).
    pub learn: bool,
    /// A size for every model (`context_overhead = "450MiB"`; `"none"`: 0).
    pub every: Option<u64>,
    /// Sizes per GPU model, by the product name NVML reports (`{ "Tesla T4" = "450MiB" }`).
    pub models: std::collections::BTreeMap<String, u64>,
}

impl Default for OverheadSetting {
    fn default() -> Self {
        Self {
            learn: true,
            every: None,
            models: std::collections::BTreeMap::new(),
        }
    }
}

impl OverheadSetting {
    /// The size set for GPUs of `model`, if any.
    pub fn set_for(&self, model: &str) -> Option<u64> {
        self.models.get(model).copied().or(self.every)
    }
}

/// Where the service account's token and CA are mounted in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// `[kubernetes]` with the built-in defaults applied.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KubernetesSettings {
    // ---- the API server (DRA claims, pod annotations, Events) ----
    /// Read DRA claims and pod annotations from the API server.
    pub api: bool,
    /// Post Kubernetes Events on the pod for each isolation step.
    pub events: bool,
    /// This node's name (else `NODE_NAME`, set by the DaemonSet through the downward API).
    pub node_name: Option<String>,
    /// Where the service account's `token`, `ca.crt` and `namespace` are.
    pub service_account_dir: std::path::PathBuf,
    /// The API server's URL (else `KUBERNETES_SERVICE_HOST`/`_PORT`).
    pub api_server: Option<String>,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        Self {
            api: false,
            events: false,
            node_name: None,
            service_account_dir: SERVICE_ACCOUNT_DIR.into(),
            api_server: None,
        }
    }
}

impl KubernetesSettings {
    /// Applies the keys a `[kubernetes]` table wrote.
    pub fn apply(&mut self, k: &file::KubernetesPatch) {
        self.api = k.api.unwrap_or(self.api);
        self.events = k.events.unwrap_or(self.events);
        if k.node_name.is_some() {
            self.node_name.clone_from(&k.node_name);
        }
        if let Some(d) = &k.service_account_dir {
            self.service_account_dir.clone_from(d);
        }
        if k.api_server.is_some() {
            self.api_server.clone_from(&k.api_server);
        }
    }

    /// Whether the agent talks to the API server at all.
    pub fn uses_api_server(&self) -> bool {
        self.api || self.events
    }
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            enforcement: Enforcement::default(),
            elastic_reserve: 1 << 30,
            gpushare_unit: GpuShareUnit::GiB,
            env_quotas: true,
            context_overhead: OverheadSetting::default(),
            take_unheld: false,
            kubernetes: KubernetesSettings::default(),
        }
    }
}

/// The kubelet's keys of the `[kubernetes]` table of the main quota file (pod-resources).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KubeletSettings {
    // ---- pod-resources (the kubelet's socket; issue 22a) ----
    /// `pod_resources_socket`: the kubelet's pod-resources socket; `None` = not read.
    pub pod_resources_socket: Option<std::path::PathBuf>,
    /// `pod_logs_dir`: the kubelet's per-pod log directories (`<ns>_<pod>_<uid>`), which join its
    /// replies (namespace and name) to pod UIDs; container log links are read in its sibling
    /// `containers`.
    pub pod_logs_dir: std::path::PathBuf,
}

impl Default for KubeletSettings {
    fn default() -> Self {
        Self {
            pod_resources_socket: None,
            // The kubelet's (`attribution::k8s_names::POD_LOG_ROOT`).
            pod_logs_dir: "/var/log/pods".into(),
        }
    }
}

/// One GPU, by NVML index, UUID or device minor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceRef {
    /// NVML (host) index.
    Index(u32),
    /// `GPU-...` UUID.
    Uuid(String),
    /// The minor number of the GPU's device node `/dev/nvidia<minor>` (a runtime spec's device,
    /// NVIDIA's DRA driver's `gpu-<minor>`): not an NVML index (NVML's index follows PCI order,
    /// the minor the driver's), so it is resolved through `nvmlDeviceGetMinorNumber`
    /// ([`env::resolve_device`]); one that NVML does not list binds no GPU (fail open).
    Minor(u32),
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Index(i) => write!(f, "GPU {i}"),
            Self::Uuid(u) => f.write_str(u),
            Self::Minor(m) => write!(f, "/dev/nvidia{m}"),
        }
    }
}

/// Which GPUs a file entry's quota covers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSel {
    /// Usage summed over all GPUs.
    All,
    /// One GPU.
    Device(DeviceRef),
}

impl fmt::Display for GpuSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("all GPUs"),
            Self::Device(d) => d.fmt(f),
        }
    }
}

/// One validated entry of a quota file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QuotaEntry {
    /// Where its `[[quota]]` header is.
    pub origin: Location,
    /// The optional `name` label.
    pub name: Option<String>,
    /// What it applies to.
    pub selector: Selector,
    /// Which GPUs.
    pub gpu: GpuSel,
    /// The quota, bytes.
    pub gpu_memory: u64,
    /// How it is enforced (overrides applied).
    pub enforcement: Enforcement,
}

/// What a limit is measured over.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitScope {
    /// The workload's usage summed over all GPUs.
    AllGpusTotal,
    /// The workload's usage on one GPU.
    Device(DeviceRef),
    /// Separately on each GPU the workload uses that no `Device` limit of the same quota names.
    EachGpu,
}

/// One limit of a resolved quota.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Limit {
    /// What usage it bounds.
    pub scope: LimitScope,
    /// The quota, bytes.
    pub bytes: u64,
    /// How it is enforced.
    pub enforcement: Enforcement,
}

/// Where a resolved quota came from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaSource {
    /// File entries with one selector.
    File {
        /// The first entry's location.
        origin: Location,
        /// The selector, as written.
        selector: String,
        /// The first entry's `name`, if any.
        name: Option<String>,
    },
    /// The workload's environment.
    Env(Sources),
}

/// Which kind of source a workload's quota comes from ([`QuotaSet::resolved_from`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolvedFrom {
    /// The quota files.
    File,
    /// The workload's environment, from this source.
    Env(Sources),
}

impl fmt::Display for QuotaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File {
                origin,
                selector,
                name: Some(name),
            } => write!(f, "quota `{name}` ({selector}) at {origin}"),
            Self::File {
                origin, selector, ..
            } => write!(f, "quota {selector} at {origin}"),
            Self::Env(e) => f.write_str(e.as_str()),
        }
    }
}

/// The quota that applies to one workload.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ResolvedQuota {
    /// Where it came from.
    pub source: QuotaSource,
    /// Its limits (at least one).
    pub limits: Vec<Limit>,
}

/// One row of `gpushare-agent check`'s table.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QuotaRow {
    /// `file:line`.
    pub origin: String,
    /// The entry's `name`, or empty.
    pub name: String,
    /// The selector as written.
    pub selector: String,
    /// `all GPUs`, `GPU 0` or a UUID.
    pub gpu: String,
    /// The quota, e.g. `4 GiB`.
    pub memory: String,
    /// `strict` or `elastic`.
    pub mode: String,
    /// e.g. `64 MiB` or `5%`.
    pub tolerance: String,
    /// e.g. `3s`.
    pub grace: String,
    /// e.g. `alert after 0s, signal SIGUSR1 after 5s, freeze after 15s`.
    pub ladder: String,
}

/// A validated set of quotas: the main file and its drop-ins.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QuotaSet {
    defaults: Defaults,
    entries: Vec<QuotaEntry>,
    protect: Vec<ProtectPattern>,
    kubelet: KubeletSettings,
}

impl QuotaSet {
    /// No entries, no protect list, built-in defaults (env quotas still apply).
    pub fn empty() -> Self {
        Self::default()
    }

    /// Builds a set from parsed parts. Used by [`file::QuotaFile`]'s builder; prefer
    /// [`QuotaSet::build`] or [`QuotaSet::parse`].
    pub(crate) fn from_parts(
        defaults: Defaults,
        entries: Vec<QuotaEntry>,
        protect: Vec<ProtectPattern>,
    ) -> Self {
        Self {
            defaults,
            entries,
            protect,
            kubelet: KubeletSettings::default(),
        }
    }

    /// The same set with the kubelet's `[kubernetes]` settings `k`.
    pub(crate) fn with_kubelet(mut self, k: KubeletSettings) -> Self {
        self.kubelet = k;
        self
    }

    /// The kubelet's `[kubernetes]` settings (the API server's are in [`Defaults::kubernetes`]).
    pub fn kubelet(&self) -> &KubeletSettings {
        &self.kubelet
    }

    /// Parses and validates one main file given as text (no drop-ins). For tests and `check`.
    pub fn parse(text: &str, origin: &str) -> Result<Self, Vec<LocatedError>> {
        Self::build(parse_str(text, origin)?, Vec::new())
    }

    /// Settings not tied to one entry.
    pub fn defaults(&self) -> &Defaults {
        &self.defaults
    }

    /// Every entry, main file first, then drop-ins in name order.
    pub fn entries(&self) -> &[QuotaEntry] {
        &self.entries
    }

    /// The `protect` patterns, as written.
    pub fn protect_patterns(&self) -> Vec<&str> {
        self.protect.iter().map(|p| p.0.pattern()).collect()
    }

    /// Whether the `protect` list covers the workload. (The policy adds the built-in protections:
    /// the agent itself and the host.)
    pub fn is_protected(&self, w: &WorkloadMeta) -> bool {
        self.protect.iter().any(|p| p.matches(w))
    }

    /// Whether some file entry names the workload.
    pub fn named_by_file(&self, w: &WorkloadMeta) -> bool {
        self.entries.iter().any(|e| e.selector.matches(w))
    }

    /// The quota for a workload: the matching file entry whose selector ranks highest (see
    /// [`select`]) with every entry that shares its selector; else (for containers and pods, when env
    /// quotas are enabled) its env quota; else `None`. Ties go to the earlier entry.
    pub fn resolve(&self, w: &WorkloadMeta, env: Option<&EnvQuota>) -> Option<ResolvedQuota> {
        if let Some(best) = self.best_entry(w) {
            let limits = self
                .entries
                .iter()
                .filter(|e| e.selector == best.selector)
                .map(|e| Limit {
                    scope: match &e.gpu {
                        GpuSel::All => LimitScope::AllGpusTotal,
                        GpuSel::Device(d) => LimitScope::Device(d.clone()),
                    },
                    bytes: e.gpu_memory,
                    enforcement: e.enforcement.clone(),
                })
                .collect();
            return Some(ResolvedQuota {
                source: QuotaSource::File {
                    origin: best.origin.clone(),
                    selector: best.selector.describe(),
                    name: best.name.clone(),
                },
                limits,
            });
        }
        if !self.env_applies(w) {
            return None;
        }
        let env = env?;
        let enforcement = &self.defaults.enforcement;
        let mut limits: Vec<Limit> = env
            .per_gpu
            .iter()
            .map(|(d, bytes)| Limit {
                scope: LimitScope::Device(d.clone()),
                bytes: *bytes,
                enforcement: enforcement.clone(),
            })
            .collect();
        if let Some(bytes) = env.each_gpu {
            limits.push(Limit {
                scope: LimitScope::EachGpu,
                bytes,
                enforcement: enforcement.clone(),
            });
        }
        (!limits.is_empty()).then_some(ResolvedQuota {
            source: QuotaSource::Env(env.sources),
            limits,
        })
    }

    /// Where [`QuotaSet::resolve`] takes `w`'s quota from (`None` where it finds none), without
    /// building the quota: no string copied (asked once per workload per step).
    pub fn resolved_from(&self, w: &WorkloadMeta, env: Option<&EnvQuota>) -> Option<ResolvedFrom> {
        if self.best_entry(w).is_some() {
            return Some(ResolvedFrom::File);
        }
        if !self.env_applies(w) {
            return None;
        }
        let env = env?;
        // `resolve` gives a quota where it finds a limit: one per listed GPU, or one for each.
        (!env.per_gpu.is_empty() || env.each_gpu.is_some())
            .then_some(ResolvedFrom::Env(env.sources))
    }

    /// The file entry that sets `w`'s quota: the most specific selector matching it (the first
    /// written, of equally specific ones).
    fn best_entry(&self, w: &WorkloadMeta) -> Option<&QuotaEntry> {
        let mut best: Option<&QuotaEntry> = None;
        for e in self.entries.iter().filter(|e| e.selector.matches(w)) {
            if best.is_none_or(|b| e.selector.specificity() > b.selector.specificity()) {
                best = Some(e);
            }
        }
        best
    }

    /// Whether an environment quota may apply to `w`: only containers and pods, where the
    /// defaults allow them (a unit or a plain cgroup may run many users' processes, and one of
    /// them must not set the quota of all, see `grants::env_quotas`).
    fn env_applies(&self, w: &WorkloadMeta) -> bool {
        self.defaults.env_quotas
            && matches!(
                w.id.kind,
                WorkloadKind::Container { .. } | WorkloadKind::Pod { .. }
            )
    }

    /// Whether some ladder (of an entry, or the defaults used by environment quotas) has a
    /// `suspend` step.
    pub fn uses_suspend(&self) -> bool {
        let has = |e: &Enforcement| e.ladder.iter().any(|s| s.action == StepAction::Suspend);
        has(&self.defaults.enforcement) || self.entries.iter().any(|e| has(&e.enforcement))
    }

    /// One row per entry, for `gpushare-agent check`.
    pub fn describe(&self) -> Vec<QuotaRow> {
        self.entries
            .iter()
            .map(|e| QuotaRow {
                origin: format!("{}:{}", e.origin.file, e.origin.line),
                name: e.name.clone().unwrap_or_default(),
                selector: e.selector.describe(),
                gpu: e.gpu.to_string(),
                memory: ByteSize(e.gpu_memory).to_string(),
                mode: e.enforcement.mode.as_str().to_string(),
                tolerance: e.enforcement.tolerance.to_string(),
                grace: fmt_duration(e.enforcement.grace),
                ladder: e.enforcement.ladder_text(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{
        select::tests::{ID, UID, pod_container as container},
        *,
    };
    use crate::workload::parse_cgroup_path;

    const GIB: u64 = 1 << 30;

    #[test]
    fn most_specific_entry_wins_with_its_siblings() {
        let set = QuotaSet::parse(
            &format!(
                r#"
[[quota]]
cgroup = "/kubepods/**"
gpu_memory = "1GiB"

[[quota]]
pod = "ml/trainer-0"
gpu_memory = "2GiB"

[[quota]]
name = "trainer"
container = "{short}"
gpu = 0
gpu_memory = "3GiB"

[[quota]]
container = "{short}"
gpu_memory = "5GiB"
mode = "elastic"
"#,
                short = &ID[..12]
            ),
            "q.toml",
        )
        .unwrap();
        let q = set.resolve(&container(), None).unwrap();
        assert_eq!(
            q.source,
            QuotaSource::File {
                origin: Location {
                    file: "q.toml".into(),
                    line: 10,
                    col: 1
                },
                selector: format!("container = \"{}\"", &ID[..12]),
                name: Some("trainer".into()),
            }
        );
        let scopes: Vec<(LimitScope, u64, Mode)> = q
            .limits
            .iter()
            .map(|l| (l.scope.clone(), l.bytes, l.enforcement.mode))
            .collect();
        assert_eq!(
            scopes,
            vec![
                (
                    LimitScope::Device(DeviceRef::Index(0)),
                    3 * GIB,
                    Mode::Strict
                ),
                (LimitScope::AllGpusTotal, 5 * GIB, Mode::Elastic),
            ]
        );
        // Without the container entries the pod entry wins over the glob.
        let other = WorkloadMeta {
            id: parse_cgroup_path(&format!("/kubepods/burstable/pod{UID}/{}", "a".repeat(64))),
            ..container()
        };
        let q = set.resolve(&other, None).unwrap();
        assert_eq!(q.limits[0].bytes, 2 * GIB);
        assert!(set.named_by_file(&other));
    }

    #[test]
    fn a_pod_cannot_pick_a_generous_entry_by_naming_its_container() {
        // The pod is under a small pod_uid quota; a generous bare container_name entry exists for a
        // single-tenant convenience. The pod's author chose the container name "main" to match it.
        let set = QuotaSet::parse(
            &format!(
                "[[quota]]\ncontainer_name = \"main\"\ngpu_memory = \"40GiB\"\n\n[[quota]]\npod_uid = \"{UID}\"\ngpu_memory = \"1GiB\"\n\n[[quota]]\npod = \"ml/trainer-0\"\ngpu_memory = \"2GiB\"\n"
            ),
            "q.toml",
        )
        .unwrap();
        let q = set.resolve(&container(), None).unwrap();
        assert_eq!(
            q.limits[0].bytes, GIB,
            "pod_uid wins over pod name and container name"
        );
        // Without the pod_uid entry, the pod name entry wins; without both, the name applies.
        for (text, want) in [
            (
                "[[quota]]\ncontainer_name = \"main\"\ngpu_memory = \"40GiB\"\n\n[[quota]]\npod = \"ml/trainer-0\"\ngpu_memory = \"2GiB\"\n",
                2 * GIB,
            ),
            (
                "[[quota]]\ncontainer_name = \"main\"\ngpu_memory = \"40GiB\"\n",
                40 * GIB,
            ),
        ] {
            let set = QuotaSet::parse(text, "q.toml").unwrap();
            assert_eq!(
                set.resolve(&container(), None).unwrap().limits[0].bytes,
                want,
                "{text}"
            );
        }
    }

    #[test]
    fn env_quota_applies_only_without_a_file_entry_and_only_to_containers_and_pods() {
        let env = EnvQuota {
            sources: GrantSource::Hami.into(),
            per_gpu: vec![(DeviceRef::Index(1), GIB)],
            each_gpu: Some(2 * GIB),
        };
        let empty = QuotaSet::empty();
        let q = empty.resolve(&container(), Some(&env)).unwrap();
        assert_eq!(q.source, QuotaSource::Env(GrantSource::Hami.into()));
        assert_eq!(q.limits.len(), 2);
        assert_eq!(q.limits[1].scope, LimitScope::EachGpu);
        assert_eq!(q.limits[0].enforcement, Enforcement::default());
        let plain = WorkloadMeta::new(parse_cgroup_path("/custom/job"));
        assert_eq!(empty.resolve(&plain, Some(&env)), None);
        // Nor to systemd units: a shared unit's users must not set each other's quota.
        let unit = WorkloadMeta::new(parse_cgroup_path("/system.slice/cron.service"));
        assert_eq!(empty.resolve(&unit, Some(&env)), None);
        let pod = WorkloadMeta::new(parse_cgroup_path(&format!("/kubepods/burstable/pod{UID}")));
        assert!(empty.resolve(&pod, Some(&env)).is_some());
        let host = WorkloadMeta::new(parse_cgroup_path("/"));
        assert_eq!(empty.resolve(&host, Some(&env)), None);
        assert_eq!(empty.resolve(&container(), None), None);
        // A file entry hides the env quota; env quotas can be switched off.
        let set = QuotaSet::parse(
            "[[quota]]\npod = \"ml/trainer-0\"\ngpu_memory = \"8GiB\"\n",
            "q.toml",
        )
        .unwrap();
        assert_eq!(
            set.resolve(&container(), Some(&env)).unwrap().limits[0].bytes,
            8 * GIB
        );
        let off = QuotaSet::parse("[defaults]\nenv_quotas = false\n", "q.toml").unwrap();
        assert_eq!(off.resolve(&container(), Some(&env)), None);
    }

    #[test]
    fn take_unheld_is_off_unless_the_main_file_turns_it_on() {
        assert!(!QuotaSet::empty().defaults().take_unheld);
        let on = QuotaSet::parse("[defaults]\ntake_unheld = true\n", "q.toml").unwrap();
        assert!(on.defaults().take_unheld);
        let off = QuotaSet::parse("[defaults]\ntake_unheld = false\n", "q.toml").unwrap();
        assert!(!off.defaults().take_unheld);
    }

    /// `resolved_from` (asked per workload per step, building nothing) names the source
    /// `resolve` takes the quota from, for every kind of workload, quota set and environment.
    #[test]
    fn resolved_from_names_the_source_resolve_takes() {
        let envs = [
            None,
            Some(EnvQuota {
                sources: GrantSource::Hami.into(),
                per_gpu: vec![(DeviceRef::Index(1), GIB)],
                each_gpu: None,
            }),
            Some(EnvQuota {
                sources: GrantSource::Dra.into(),
                per_gpu: vec![],
                each_gpu: Some(2 * GIB),
            }),
            // No limit at all: `resolve` finds none.
            Some(EnvQuota {
                sources: GrantSource::Annotation.into(),
                per_gpu: vec![],
                each_gpu: None,
            }),
        ];
        let sets = [
            QuotaSet::empty(),
            QuotaSet::parse("[defaults]\nenv_quotas = false\n", "q.toml").unwrap(),
            QuotaSet::parse(
                "[[quota]]\npod = \"ml/trainer-0\"\ngpu_memory = \"8GiB\"\n",
                "q.toml",
            )
            .unwrap(),
            QuotaSet::parse(
                "[[quota]]\ncgroup = \"/custom/*\"\ngpu_memory = \"1GiB\"\n",
                "q.toml",
            )
            .unwrap(),
        ];
        let workloads = [
            container(),
            WorkloadMeta::new(parse_cgroup_path("/custom/job")),
            WorkloadMeta::new(parse_cgroup_path("/system.slice/cron.service")),
            WorkloadMeta::new(parse_cgroup_path(&format!("/kubepods/burstable/pod{UID}"))),
            WorkloadMeta::new(parse_cgroup_path("/")),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for set in &sets {
            for w in &workloads {
                for env in &envs {
                    let want = set.resolve(w, env.as_ref()).map(|q| match q.source {
                        QuotaSource::File { .. } => ResolvedFrom::File,
                        QuotaSource::Env(s) => ResolvedFrom::Env(s),
                    });
                    assert_eq!(set.resolved_from(w, env.as_ref()), want, "{w:?} {env:?}");
                    seen.insert(format!("{want:?}"));
                }
            }
        }
        // Every outcome was met: a file, each environment source with a limit, and none.
        assert_eq!(seen.len(), 4, "{seen:?}");
    }

    #[test]
    fn describe_lists_every_entry() {
        let set = QuotaSet::parse(
            r#"
[defaults]
grace = "2s"

[[quota]]
unit = "train.service"
gpu = "GPU-8f1c2d3e-0000-1111-2222-333344445555"
gpu_memory = "1.5GiB"
tolerance = "2.5%"
ladder = [{ action = "alert" }, { action = "kill", signal = "SIGTERM", after = "1m" }]
"#,
            "/etc/gpushare/quotas.toml",
        )
        .unwrap();
        assert_eq!(
            set.describe(),
            vec![QuotaRow {
                origin: "/etc/gpushare/quotas.toml:5".into(),
                name: "".into(),
                selector: "unit = \"train.service\"".into(),
                gpu: "GPU-8f1c2d3e-0000-1111-2222-333344445555".into(),
                memory: "1.5 GiB".into(),
                mode: "strict".into(),
                tolerance: "2.5%".into(),
                grace: "2s".into(),
                ladder: "alert after 0s, kill SIGTERM after 1m".into(),
            }]
        );
    }

    #[test]
    fn tolerance_and_durations_format() {
        assert_eq!(Tolerance::Percent(500).allowance(1000), 50);
        assert_eq!(Tolerance::Percent(10_000).allowance(u64::MAX), u64::MAX);
        assert_eq!(Tolerance::Bytes(7).allowance(1), 7);
        assert_eq!(Tolerance::Percent(500).to_string(), "5%");
        assert_eq!(Tolerance::Percent(1).to_string(), "0.01%");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_secs(120)), "2m");
        assert_eq!(fmt_duration(Duration::from_secs(90)), "90s");
        assert_eq!(
            Signal::from_name("usr2").map(|s| s.number),
            Some(libc::SIGUSR2)
        );
        assert_eq!(Signal::from_name("SIGSTOP"), None);
        assert_eq!(Signal::KILL.name, "SIGKILL");
        assert_eq!(Signal::USR1.name, "SIGUSR1");
    }
}
