//! Prometheus metrics (prometheus-client), encoded at scrape time from the latest [`Snapshot`]
//! and from nothing else: gauges, totals and the histograms of how long things took
//! ([`crate::snapshot::Timings`]) all travel in it, so series of exited processes and removed
//! workloads disappear with them and label cardinality stays bounded by what is alive. The
//! families are grouped by subject, one file each, in the order they are exported: `timings.rs`,
//! `gpus.rs`, `workloads.rs`, `processes.rs`, `enforcement.rs`, `observation.rs`, `quotas.rs`,
//! `health.rs`, `grants.rs`, then `compat.rs`.
//!
//! A scrape re-encodes only what changed since the last one (per format): the series of each
//! workload and process row are cached and copied while the row's fields stay the same
//! (`cache.rs`); GPUs, counters and totals are encoded on every scrape.

use std::sync::{Arc, Mutex, atomic::AtomicU64, atomic::Ordering};

use self::cache::{RowCache, Series, Value};
use self::rows::{ProcessRow, WorkloadRow};
use crate::snapshot::{SharedSnapshot, Snapshot, latest};

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
mod enforcement;
mod gpus;
mod grants;
mod health;
mod observation;
mod processes;
mod quotas;
mod rows;
mod timings;
mod workloads;

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

/// `/metrics` over the shared snapshot, with its scrape cache.
pub struct Metrics {
    snapshot: SharedSnapshot,
    compat: Arc<Compat>,
    process_series: bool,
    families: Arc<[Family]>,
    /// Prometheus text, OpenMetrics.
    caches: [Mutex<FormatCache>; 2],
    rows_encoded: AtomicU64,
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
        let mut families = families();
        families.extend(grants::families());
        families.extend(compat::families(&compat));
        Self {
            snapshot,
            compat: Arc::new(compat),
            process_series,
            families: families.into(),
            caches: Default::default(),
            rows_encoded: AtomicU64::new(0),
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
        timings::encode(&snap.timings, openmetrics, &mut out);
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

/// A counter family of `kind -> count` pairs, labelled `label`.
fn by_kind<K: ToString, N: std::borrow::Borrow<u64>>(
    s: &mut Series,
    label: &'static str,
    pairs: impl IntoIterator<Item = (K, N)>,
) {
    for (k, n) in pairs {
        push(s, vec![(label, k.to_string())], *n.borrow());
    }
}

/// gpushare's own families, subject by subject, in the order they are exported.
fn families() -> Vec<Family> {
    [
        gpus::families(),
        workloads::families(),
        processes::families(),
        enforcement::families(),
        observation::families(),
        quotas::families(),
        health::families(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[cfg(test)]
mod tests;
