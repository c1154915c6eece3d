//! Prometheus metrics (prometheus-client). Gauges and totals are encoded at scrape time from the
//! latest [`Snapshot`], so series of exited processes and removed workloads disappear with them
//! and label cardinality stays bounded by what is alive. Histograms are kept here.
//!
//! A scrape re-encodes only what changed since the last one (per format): the series of each
//! workload and process row are cached and copied while the row's fields stay the same
//! (`cache.rs`); GPUs, counters and totals are encoded on every scrape.

use std::sync::{Arc, Mutex, RwLock, atomic::AtomicU64, atomic::Ordering};

use prometheus_client::{metrics::histogram::Histogram, registry::Registry};

use self::cache::{RowCache, Series, Value};
use self::rows::{ProcessRow, WorkloadRow};
use crate::snapshot::Snapshot;

/// The latest snapshot, shared between the agent loop (writer) and readers.
pub type SharedSnapshot = Arc<RwLock<Arc<Snapshot>>>;

/// The latest published snapshot (an empty one if a writer panicked while holding the lock).
pub fn latest(shared: &SharedSnapshot) -> Arc<Snapshot> {
    shared.read().map(|s| Arc::clone(&s)).unwrap_or_default()
}

/// Every isolation state a workload can be in; one series per state.
pub const ISOLATION_STATES: &[&str] = &[
    "ok",
    "over_quota",
    "alerted",
    "signalled",
    "freezing",
    "frozen",
    "suspending",
    "suspended",
    "resuming",
    "killing",
];

mod cache;
pub mod compat;
mod grants;
mod rows;

/// Which other systems' metric names to add (`--compat`).
pub use self::compat::Compat;

/// What the scrape cache holds and has done, both formats together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Rows (workload, process) encoded since the start; a row served from the cache is not.
    pub rows_encoded: u64,
    /// Rows cached.
    pub rows: usize,
    /// Bytes the cache holds: encoded text, row copies, offsets.
    pub cached_bytes: usize,
}

/// The series of one format's last scrape, per row.
#[derive(Debug, Default)]
struct FormatCache {
    workloads: RowCache<WorkloadRow<'static>>,
    processes: RowCache<ProcessRow<'static>>,
    /// Sizes of the last scrape's encoded message and output, to allocate once.
    last_message: usize,
    last_output: usize,
}

/// The registry and the histograms the agent loop observes into.
pub struct Metrics {
    registry: Registry,
    snapshot: SharedSnapshot,
    compat: Arc<Compat>,
    process_series: bool,
    families: Arc<[Family]>,
    /// Prometheus text, OpenMetrics.
    caches: [Mutex<FormatCache>; 2],
    rows_encoded: AtomicU64,
    /// Time of one NVML sample.
    pub sample_duration: Histogram,
    /// From the sample (or allocation event) that showed a workload over quota to the action.
    pub enforcement_latency: Histogram,
    /// How long a suspend (lock, checkpoint, freeze) took.
    pub suspend_duration: Histogram,
    /// How long a resume (thaw, restore, unlock) took.
    pub resume_duration: Histogram,
}

impl Metrics {
    /// A registry over `snapshot`, without per-process series.
    pub fn new(snapshot: SharedSnapshot, compat: Compat) -> Self {
        Self::with_options(snapshot, compat, false)
    }

    /// A registry over `snapshot`; `process_series` adds `gpushare_process_gpu_memory_used_bytes`
    /// (a series per GPU process, labelled with its pid and name: off unless the operator turns
    /// it on, since `/metrics` is served to whoever reaches the listener).
    pub fn with_options(snapshot: SharedSnapshot, compat: Compat, process_series: bool) -> Self {
        let mut registry = Registry::default();
        let sample_duration = Histogram::new([
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
        ]);
        let enforcement_latency = Histogram::new([
            0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ]);
        registry.register(
            "gpushare_sample_duration_seconds",
            "Time to read every GPU and its processes through NVML",
            sample_duration.clone(),
        );
        registry.register(
            "gpushare_enforcement_latency_seconds",
            "From the observation that put a workload over quota to the enforcement action",
            enforcement_latency.clone(),
        );
        let suspend_buckets = [
            0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
        ];
        let suspend_duration = Histogram::new(suspend_buckets);
        let resume_duration = Histogram::new(suspend_buckets);
        registry.register(
            "gpushare_suspend_duration_seconds",
            "How long a suspend took: lock every GPU process, checkpoint each, freeze",
            suspend_duration.clone(),
        );
        registry.register(
            "gpushare_resume_duration_seconds",
            "How long a resume took: thaw, restore and unlock every checkpointed process",
            resume_duration.clone(),
        );
        let mut families = families();
        families.extend(grants::families());
        families.extend(compat::families(&compat));
        Self {
            registry,
            snapshot,
            compat: Arc::new(compat),
            process_series,
            families: families.into(),
            caches: Default::default(),
            rows_encoded: AtomicU64::new(0),
            sample_duration,
            enforcement_latency,
            suspend_duration,
            resume_duration,
        }
    }

    /// Prometheus text format (0.0.4), what `promtool check metrics` reads.
    pub fn render_prometheus(&self) -> String {
        self.render(false)
    }

    /// OpenMetrics text format.
    pub fn render_openmetrics(&self) -> String {
        self.render(true)
    }

    /// What the scrape cache holds and has done.
    pub fn cache_stats(&self) -> CacheStats {
        let mut stats = CacheStats {
            rows_encoded: self.rows_encoded.load(Ordering::Relaxed),
            ..Default::default()
        };
        for c in &self.caches {
            let c = lock(c);
            stats.rows += c.workloads.len() + c.processes.len();
            stats.cached_bytes +=
                c.workloads.bytes::<WorkloadRow>() + c.processes.bytes::<ProcessRow>();
        }
        stats
    }

    /// Forgets every cached row: the next scrapes encode everything, as the first one does.
    pub fn clear_cache(&self) {
        for c in &self.caches {
            let mut c = lock(c);
            c.workloads = RowCache::default();
            c.processes = RowCache::default();
        }
    }

    fn render(&self, openmetrics: bool) -> String {
        let snap = latest(&self.snapshot);
        let mut cache = lock(&self.caches[usize::from(openmetrics)]);
        let mut out = String::with_capacity(cache.last_output.max(64 * 1024));
        let _ = if openmetrics {
            prometheus_client::encoding::text::encode_registry(&mut out, &self.registry)
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        };
        self.encode_snapshot(&snap, &mut cache, openmetrics, &mut out);
        if openmetrics {
            let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        }
        cache.last_output = out.len();
        out
    }

    /// Appends `snap`'s families to `out`, re-encoding the rows `cache` does not hold.
    fn encode_snapshot(
        &self,
        snap: &Arc<Snapshot>,
        cache: &mut FormatCache,
        om: bool,
        out: &mut String,
    ) {
        let wrows: Vec<WorkloadRow> = snap
            .workloads
            .iter()
            .map(|w| WorkloadRow::of(w, &snap.gpus))
            .collect();
        let prows: Vec<ProcessRow> = match self.process_series {
            true => snap.processes.iter().map(|p| ProcessRow::of(p)).collect(),
            false => Vec::new(),
        };
        let wfound = cache.workloads.lookup(&wrows);
        let pfound = cache.processes.lookup(&prows);
        let fresh = |found: &[Option<usize>]| -> Vec<usize> {
            (0..found.len()).filter(|&i| found[i].is_none()).collect()
        };
        // Per family: its row kind and index among that kind's families, and whether rows
        // found in the cache have series in it.
        let (mut slots, mut cached) = (Vec::new(), Vec::new());
        let (mut wslots, mut pslots) = (0, 0);
        for fam in self.families.iter() {
            let (slot, has) = match fam.rows {
                Rows::None => (Slot::None, false),
                Rows::Workload(_) => {
                    wslots += 1;
                    let has = wfound
                        .iter()
                        .flatten()
                        .any(|&j| !cache.workloads.text(wslots - 1, j).is_empty());
                    (Slot::Workload(wslots - 1), has)
                }
                Rows::Process(_) => {
                    pslots += 1;
                    let has = pfound
                        .iter()
                        .flatten()
                        .any(|&j| !cache.processes.text(pslots - 1, j).is_empty());
                    (Slot::Process(pslots - 1), has)
                }
            };
            slots.push(slot);
            cached.push(has);
        }
        let message = Arc::new(cache::Message {
            snap: Arc::clone(snap),
            families: Arc::clone(&self.families),
            compat: Arc::clone(&self.compat),
            fresh_workloads: fresh(&wfound),
            fresh_processes: fresh(&pfound),
            cached,
            counts: Mutex::default(),
        });
        self.rows_encoded.fetch_add(
            (message.fresh_workloads.len() + message.fresh_processes.len()) as u64,
            Ordering::Relaxed,
        );
        let text = cache::encode(&message, om, cache.last_message);
        cache.last_message = text.len();
        let counts = std::mem::take(&mut *message.counts.lock().unwrap_or_else(|p| p.into_inner()));
        let (each, rows): (Vec<usize>, Vec<Vec<usize>>) = counts.iter().flatten().cloned().unzip();
        let Some(cuts) = cache::cut(&text, &each, &rows) else {
            // Not expected (every series is one line); encode everything afresh.
            debug_assert!(false, "unexpected encoding: {text}");
            log::warn!("/metrics: encoded series not one per line; encoding every row afresh");
            *cache = FormatCache::default();
            if wfound.iter().chain(&pfound).any(Option::is_some) {
                return self.encode_snapshot(snap, cache, om, out);
            }
            // Every row was encoded fresh: the text is whole.
            out.push_str(&text);
            return;
        };
        // Each family's cut (`None`: left out), and the fresh rows' pieces per family of each
        // kind, in slot order.
        let mut cuts = cuts.into_iter();
        let cut_of: Vec<Option<cache::Cut>> = counts
            .iter()
            .map(|c| c.as_ref().and_then(|_| cuts.next()))
            .collect();
        let (mut wpieces, mut ppieces) = (vec![Vec::new(); wslots], vec![Vec::new(); pslots]);
        for (slot, c) in slots.iter().zip(&cut_of) {
            match (slot, c) {
                (Slot::Workload(s), Some(c)) => wpieces[*s] = c.rows.clone(),
                (Slot::Process(s), Some(c)) => ppieces[*s] = c.rows.clone(),
                _ => {}
            }
        }
        if !cache.workloads.unchanged(&wfound) {
            cache.workloads.update(&wrows, &wfound, &wpieces);
        }
        if !cache.processes.unchanged(&pfound) {
            cache.processes.update(&prows, &pfound, &ppieces);
        }
        for (slot, c) in slots.iter().zip(cut_of) {
            let Some(c) = c else { continue };
            out.push_str(c.header);
            out.push_str(c.each);
            out.push_str(match slot {
                Slot::None => "",
                Slot::Workload(s) => cache.workloads.family(*s),
                Slot::Process(s) => cache.processes.family(*s),
            });
        }
    }
}

/// A cache's lock; a cache a panicking scrape left is dropped, not trusted.
fn lock(m: &Mutex<FormatCache>) -> std::sync::MutexGuard<'_, FormatCache> {
    m.lock().unwrap_or_else(|poisoned| {
        let mut c = poisoned.into_inner();
        *c = FormatCache::default();
        c
    })
}

/// Where a family's row series are cached.
#[derive(Clone, Copy, Debug)]
enum Slot {
    None,
    Workload(usize),
    Process(usize),
}

pub(crate) type Labels = Vec<(&'static str, String)>;

/// Series encoded on every scrape, from the whole snapshot.
pub(crate) type Each = fn(&Snapshot, &Compat, &mut Series);

/// Series of one row, cached with it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rows {
    None,
    Workload(fn(&WorkloadRow, &Compat, &mut Series)),
    Process(fn(&ProcessRow, &mut Series)),
}

/// One metric family: its descriptor, then its series encoded every scrape, then its rows'.
/// A gauge without a series is left out; a counter is always there.
#[derive(Debug)]
pub(crate) struct Family {
    name: &'static str,
    help: &'static str,
    counter: bool,
    each: Option<Each>,
    rows: Rows,
}

impl Family {
    pub(crate) fn gauge(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            counter: false,
            each: None,
            rows: Rows::None,
        }
    }

    fn counter(name: &'static str, help: &'static str) -> Self {
        Self {
            counter: true,
            ..Self::gauge(name, help)
        }
    }

    pub(crate) fn each(self, each: Each) -> Self {
        Self {
            each: Some(each),
            ..self
        }
    }

    pub(crate) fn workloads(self, f: fn(&WorkloadRow, &Compat, &mut Series)) -> Self {
        Self {
            rows: Rows::Workload(f),
            ..self
        }
    }

    fn processes(self, f: fn(&ProcessRow, &mut Series)) -> Self {
        Self {
            rows: Rows::Process(f),
            ..self
        }
    }
}

/// Pushes a series.
pub(crate) fn push(s: &mut Series, labels: Labels, v: impl Into<Value>) {
    s.push((labels, v.into()));
}

fn workload_labels(w: &WorkloadRow) -> Labels {
    vec![
        ("gpu_uuid", w.gpu_uuid.to_string()),
        ("workload", w.workload.to_string()),
        ("namespace", w.namespace.to_string()),
        ("pod", w.pod.to_string()),
        ("container", w.container.to_string()),
        ("container_id", w.container_id.to_string()),
    ]
}

fn workload_with(w: &WorkloadRow, name: &'static str, value: &str) -> Labels {
    let mut l = workload_labels(w);
    l.push((name, value.to_string()));
    l
}

fn gpu_labels(g: &crate::snapshot::GpuView) -> Labels {
    vec![
        ("gpu_uuid", g.uuid.clone()),
        ("gpu_index", g.index.to_string()),
        ("gpu_name", g.name.clone()),
    ]
}

fn process_labels(p: &ProcessRow) -> Labels {
    vec![
        ("gpu_uuid", p.gpu_uuid.to_string()),
        ("pid", p.pid.to_string()),
        ("comm", p.comm.to_string()),
        ("workload", p.workload.to_string()),
    ]
}

/// A counter family of a `kind -> count` map, labelled `label`.
fn by_kind<'a>(
    s: &mut Series,
    label: &'static str,
    map: impl IntoIterator<Item = (&'a String, &'a u64)>,
) {
    for (k, v) in map {
        push(s, vec![(label, k.clone())], *v);
    }
}

/// The GPUs' own families (memory, health, backend, utilization), in the order they are exported.
fn gpu_families() -> Vec<Family> {
    vec![
        Family::gauge("gpushare_gpu_memory_total_bytes", "GPU memory in total, bytes").each(
            |snap, _, s| {
                for g in &snap.gpus {
                    push(s, gpu_labels(g), g.memory_total_bytes as f64);
                }
            },
        ),
        Family::gauge("gpushare_gpu_memory_used_bytes", "GPU memory in use, bytes").each(
            |snap, _, s| {
                for g in &snap.gpus {
                    push(s, gpu_labels(g), g.memory_used_bytes as f64);
                }
            },
        ),
        Family::gauge(
            "gpushare_gpu_context_overhead_bytes",
            "The driver's memory (a CUDA context) allowed beyond every quota on a GPU, once per \
             workload, bytes; source: learned, set, learning or none",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                let mut labels = gpu_labels(g);
                labels.push(("source", g.context_overhead_source.clone()));
                push(s, labels, g.context_overhead_bytes as f64);
            }
        }),
        Family::gauge(
            "gpushare_gpu_healthy",
            "1 when the last NVML sample read the GPU completely",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                push(s, gpu_labels(g), g.healthy as u8 as f64);
            }
        }),
        Family::gauge(
            "gpushare_gpu_isolation_backend",
            "How quotas are enforced on a GPU: soft (the agent's ladder) or driver_limits (also the \
             NVIDIA driver's per-cgroup limits, r615+); 1 for the one in force",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                let mut l = gpu_labels(g);
                let backend = if g.isolation_backend.is_empty() {
                    "soft".to_string()
                } else {
                    g.isolation_backend.clone()
                };
                l.push(("backend", backend));
                push(s, l, 1.0);
            }
        }),
        Family::gauge(
            "gpushare_gpu_utilization_ratio",
            "Share of NVML's last sample period in which a kernel ran on the GPU, 0-1 (absent where \
             NVML does not report it: not supported, MIG)",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                if let Some(u) = g.utilization {
                    push(s, gpu_labels(g), u);
                }
            }
        }),
        Family::gauge(
            "gpushare_gpu_memory_utilization_ratio",
            "Share of NVML's last sample period in which GPU memory was read or written, 0-1 \
             (absent where not reported)",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                if let Some(u) = g.memory_utilization {
                    push(s, gpu_labels(g), u);
                }
            }
        }),
    ]
}

/// gpushare's own families, in the order they are exported.
fn families() -> Vec<Family> {
    let mut families = gpu_families();
    families.extend(vec![
        Family::gauge(
            "gpushare_workload_gpu_utilization_ratio",
            "SM utilization of a workload's processes on a GPU over its last sample window, summed, \
             0-1 (absent where unknown: not supported, MIG, or no process verified for the window)",
        )
        .workloads(|w, _, s| {
            if let Some(u) = w.utilization {
                push(s, workload_labels(w), u.0);
            }
        }),
        Family::gauge(
            "gpushare_workload_gpu_memory_utilization_ratio",
            "Memory-controller utilization of a workload's processes on a GPU, summed, 0-1 (absent \
             where unknown)",
        )
        .workloads(|w, _, s| {
            if let Some(u) = w.memory_utilization {
                push(s, workload_labels(w), u.0);
            }
        }),
        Family::gauge(
            "gpushare_driver_limit_bytes",
            "Driver-enforced GPU memory limits (nvmlDeviceSetMemoryLimits_v1) on the cgroups of \
             workloads under a quota, bytes, by kind (soft, hard) and source (agent: set by gpushare; \
             other: set by someone else, e.g. NVIDIA's container hook, and left as it is)",
        )
        .each(|snap, _, s| {
            for l in snap.driver_limits.iter() {
                let labels = |kind: &'static str| {
                    vec![
                        ("gpu_uuid", l.gpu_uuid.clone()),
                        ("cgroup", l.cgroup_path.clone()),
                        ("kind", kind.to_string()),
                        ("source", l.source.clone()),
                    ]
                };
                if l.soft_bytes > 0 {
                    push(s, labels("soft"), l.soft_bytes as f64);
                }
                if l.hard_bytes != u64::MAX {
                    push(s, labels("hard"), l.hard_bytes as f64);
                }
            }
        }),
        Family::gauge(
            "gpushare_workload_gpu_memory_used_bytes",
            "GPU memory used by a workload, bytes",
        )
        .workloads(|w, _, s| push(s, workload_labels(w), w.used_bytes as f64)),
        Family::gauge(
            "gpushare_workload_gpu_memory_quota_bytes",
            "GPU memory quota of a workload, bytes",
        )
        .workloads(|w, _, s| {
            if let Some(q) = w.quota_bytes {
                push(s, workload_with(w, "quota_trust", &w.quota_trust), q as f64);
            }
        }),
        Family::gauge(
            "gpushare_workload_identity",
            "What a container's or pod's identity rests on, 1 per workload row: identity=runtime (its \
             runtime's record names its group), degraded (its runtime's place alone), conflict \
             (two groups claimed it; a plain cgroup now)",
        )
        .workloads(|w, _, s| {
            if !w.identity.is_empty() {
                push(s, workload_with(w, "identity", &w.identity), 1.0);
            }
        }),
        Family::gauge(
            "gpushare_workload_isolation_state",
            "Isolation state of a workload: one series per state, 1 for the current one",
        )
        .workloads(|w, _, s| {
            let other = (!ISOLATION_STATES.contains(&&*w.state)).then_some(&*w.state);
            for state in ISOLATION_STATES.iter().copied().chain(other) {
                push(s, workload_with(w, "state", state), (state == w.state) as u8 as f64);
            }
        }),
        Family::gauge(
            "gpushare_process_gpu_memory_used_bytes",
            "GPU memory used by a process, bytes (with --process-metrics only)",
        )
        .processes(|p, s| {
            if let Some(b) = p.used_bytes {
                push(s, process_labels(p), b as f64);
            }
        }),
        Family::gauge(
            "gpushare_process_gpu_utilization_ratio",
            "SM utilization of a process over its GPU's last sample window, 0-1 (0: no sample, \
             idle; absent where unknown; with --process-metrics only)",
        )
        .processes(|p, s| {
            if let Some(u) = p.utilization {
                push(s, process_labels(p), u.0);
            }
        }),
        Family::gauge(
            "gpushare_unattributed_gpu_memory_bytes",
            "GPU memory of processes no workload was found for, bytes",
        )
        .each(|snap, _, s| {
            for g in &snap.gpus {
                let b = *snap.unattributed_bytes.get(&g.uuid).unwrap_or(&0);
                push(s, vec![("gpu_uuid", g.uuid.clone())], b as f64);
            }
        }),
        Family::counter(
            "gpushare_enforcement_actions",
            "Enforcement actions by action and result",
        )
        .each(|snap, _, s| {
            for (k, v) in &snap.counters.enforcement_actions {
                let (action, result) = k.split_once('/').unwrap_or((k.as_str(), ""));
                let labels = vec![
                    ("action", action.to_string()),
                    ("result", result.to_string()),
                ];
                push(s, labels, *v);
            }
        }),
        Family::counter(
            "gpushare_enforcement_external_changes",
            "Changes found made behind the agent's back to groups it froze (thawed, gone, replaced: \
             recreated under the same path) and earlier runs' freezes taken over (adopted)",
        )
        .each(|snap, _, s| by_kind(s, "change", &snap.counters.external_changes)),
        Family::counter(
            "gpushare_suspend_fallthroughs",
            "Suspend steps that fell through to the next step, by reason (unavailable: no driver \
             with the checkpoint API; host_memory; lock_timeout; not_supported; failed_state; error)",
        )
        .each(|snap, _, s| by_kind(s, "reason", &snap.counters.suspend_fallthroughs)),
        Family::counter(
            "gpushare_suspended_gpu_memory_moved_bytes",
            "GPU memory moved to host memory by suspends since the agent started",
        )
        .each(|snap, _, s| push(s, Labels::new(), snap.counters.suspended_bytes_total)),
        Family::gauge(
            "gpushare_workload_suspended_bytes",
            "GPU memory of a suspended workload held in host memory, bytes",
        )
        .workloads(|w, _, s| {
            if w.suspended_bytes > 0 {
                push(s, workload_labels(w), w.suspended_bytes as f64);
            }
        }),
        Family::gauge(
            "gpushare_workloads_suspended",
            "Workloads suspended (their GPU memory in host memory)",
        )
        .each(|snap, _, s| {
            let n = snap
                .workloads
                .iter()
                .filter(|w| w.state == "suspended")
                .map(|w| w.workload.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            push(s, Labels::new(), n as f64);
        }),
        Family::counter(
            "gpushare_workload_identity_events",
            "Workload-identity events: two groups claiming one container or pod identity \
             (conflict), a container's runtime record naming another group (record_mismatch)",
        )
        .each(|snap, _, s| by_kind(s, "kind", &snap.counters.workload_identity)),
        Family::counter(
            "gpushare_identity_checks",
            "GPU tasks dropped because they exited (exited), sampled pids whose tracked process had \
             exited and were attributed afresh (stale_identity), sample records left unknown \
             because their pid's process started after the sample (unverifiable), pids rejected \
             at attribution (rejected)",
        )
        .each(|snap, _, s| by_kind(s, "kind", &snap.counters.identity)),
        Family::counter(
            "gpushare_attribution_work",
            "Work attribution did whose amount processes choose: unconfirmed nvidia opens checked \
             in /proc (open_checks) and found failed (failed_opens), /proc/<pid>/fd entries read \
             (fd_entries_read), cgroup ids resolved by opening the group (cgroup_id_lookups), \
             walks of the cgroup hierarchy (cgroup_rescans) and the directories they read \
             (cgroup_dirs_walked)",
        )
        .each(|snap, _, s| by_kind(s, "kind", &snap.counters.attribution_work)),
        Family::counter(
            "gpushare_gpu_ioctls",
            "ioctls issued by the GPU tasks of a workload",
        )
        .each(|snap, _, s| by_kind(s, "workload", snap.counters.gpu_ioctls.iter())),
        Family::counter("gpushare_ebpf_events", "Kernel events received by kind")
            .each(|snap, _, s| by_kind(s, "kind", &snap.counters.ebpf_events)),
        Family::counter(
            "gpushare_ebpf_events_lost",
            "Kernel events lost because the ring buffer was full",
        )
        .each(|snap, _, s| push(s, Labels::new(), snap.counters.ebpf_events_lost)),
        Family::counter("gpushare_nvml_errors", "NVML calls that failed, by call")
            .each(|snap, _, s| by_kind(s, "call", &snap.counters.nvml_errors)),
        Family::counter(
            "gpushare_env_quota_errors",
            "Malformed environment-quota variables and unreadable runtime specs (each ignored)",
        )
        .each(|snap, _, s| push(s, Labels::new(), snap.counters.env_quota_errors)),
        Family::counter(
            "gpushare_env_quota_disagreements",
            "Environment-quota variables that disagree with the devices the runtime gave, or hold a value no plugin writes, by kind",
        )
        .each(|snap, _, s| by_kind(s, "kind", &snap.counters.env_quota_disagreements)),
        Family::counter(
            "gpushare_kubernetes",
            "The API server's reads and Kubernetes Events, by what (api_reads, api_errors, annotation_edits_ignored, events_created, events_patched, events_skipped, events_dropped, events_errors)",
        )
        .each(|snap, _, s| by_kind(s, "what", &snap.counters.kubernetes)),
        Family::gauge(
            "gpushare_env_quota_unit_mismatch",
            "1 for a workload whose ALIYUN_COM_GPU_MEM_DEV says the device plugin's unit is not gpushare_memory_unit",
        )
        .each(|snap, _, s| {
            for k in snap.counters.env_quota_unit_mismatch.keys() {
                push(s, vec![("workload", k.clone())], 1.0);
            }
        }),
        Family::gauge(
            "gpushare_quota_config_valid",
            "1 when the quota files loaded cleanly; 0 while the last good configuration is kept",
        )
        .each(|snap, _, s| {
            push(s, Labels::new(), snap.counters.quota_config_valid as u8 as f64)
        }),
        Family::gauge(
            "gpushare_quota_config_last_reload_timestamp_seconds",
            "When the quota configuration was last loaded",
        )
        .each(|snap, _, s| push(s, Labels::new(), snap.counters.quota_config_last_reload_unix)),
        Family::gauge(
            "gpushare_agent_ready",
            "1 once the programs are loaded and the first sample is done",
        )
        .each(|snap, _, s| push(s, Labels::new(), snap.health.ready as u8 as f64)),
        Family::gauge(
            "gpushare_agent_degraded",
            "1 while the agent runs in a degraded mode (see /healthz)",
        )
        .each(|snap, _, s| {
            push(s, Labels::new(), (!snap.health.degraded.is_empty()) as u8 as f64)
        }),
        Family::gauge("gpushare_build_info", "Build information").each(|_, _, s| {
            let labels = vec![
                ("version", env!("CARGO_PKG_VERSION").to_string()),
                ("commit", env!("GPUSHARE_COMMIT").to_string()),
            ];
            push(s, labels, 1.0)
        }),
    ]);
    families
}

#[cfg(test)]
mod tests;
