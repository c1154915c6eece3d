//! The scrape cache: the encoded series of every row (workload, process) kept per metric
//! family, so that a scrape encodes only the rows that changed since the last one and copies
//! the others' text. Rows are compared by value (every field a series is made of), so a snapshot
//! republished with the same content costs no encoding, whatever its allocation.
//!
//! A scrape: each row of the snapshot is looked up among the cached ones (same position first,
//! then by its identity); prometheus-client encodes one message holding every family's
//! descriptor, the series encoded on every scrape (GPUs, counters) and the series of the rows
//! not found; that message is cut into its families and rows, the cache is rebuilt from the
//! found rows' cached text and the new rows' fresh text, and the output assembled from both.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::{MetricType, gauge::ConstGauge},
    registry::Registry,
};

use super::rows::{ProcessRow, Row, WorkloadRow};
use super::{Compat, Family, Labels, Rows};
use crate::snapshot::Snapshot;

/// A series' value: a gauge's float or a counter's integer (which encode differently).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Value {
    Gauge(f64),
    Counter(u64),
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Gauge(v)
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Counter(v)
    }
}

pub(crate) type Series = Vec<(Labels, Value)>;

/// The encoded series of one kind of row, per family of that kind, in the order of the rows
/// last scraped: `texts[f]` holds the rows' series of family `f` one after another, row `i`'s
/// ending at `ends[f][i]`.
#[derive(Debug)]
pub(crate) struct RowCache<O> {
    rows: Vec<O>,
    texts: Vec<String>,
    ends: Vec<Vec<usize>>,
}

impl<O> Default for RowCache<O> {
    fn default() -> Self {
        Self {
            rows: Vec::new(),
            texts: Vec::new(),
            ends: Vec::new(),
        }
    }
}

impl<O> RowCache<O> {
    /// For each of `rows`, the index of a cached row with the same fields, if any.
    pub fn lookup<R: Row<Owned = O>>(&self, rows: &[R]) -> Vec<Option<usize>> {
        let mut by_key: Option<HashMap<u64, usize>> = None;
        rows.iter()
            .enumerate()
            .map(|(i, r)| {
                if let Some(c) = self.rows.get(i) {
                    if r.same(c) {
                        return Some(i);
                    }
                    // The same row with other values: changed in place, no need to search.
                    if R::cached_key(c) == r.key() {
                        return None;
                    }
                }
                let by_key = by_key.get_or_insert_with(|| {
                    self.rows
                        .iter()
                        .enumerate()
                        .map(|(j, c)| (R::cached_key(c), j))
                        .collect()
                });
                by_key
                    .get(&r.key())
                    .copied()
                    .filter(|&j| r.same(&self.rows[j]))
            })
            .collect()
    }

    /// Whether `found` (from [`RowCache::lookup`]) is the cache as it is: nothing to rebuild.
    pub fn unchanged(&self, found: &[Option<usize>]) -> bool {
        found.len() == self.rows.len() && found.iter().enumerate().all(|(i, f)| *f == Some(i))
    }

    /// Cached row `j`'s text in family `f`.
    pub fn text(&self, f: usize, j: usize) -> &str {
        match self.ends.get(f) {
            Some(ends) => {
                let start = if j == 0 { 0 } else { ends[j - 1] };
                &self.texts[f][start..ends[j]]
            }
            None => "",
        }
    }

    /// Every row's text in family `f`, in order.
    pub fn family(&self, f: usize) -> &str {
        self.texts.get(f).map_or("", String::as_str)
    }

    /// Rebuilds the cache for `rows`: a row found (`found[i]`) keeps its cached text, the
    /// others take theirs from `fresh[f]` (per family, the unfound rows' texts in order). Rows
    /// no longer in `rows` leave the cache. Where no row moved, a family whose new texts are as
    /// long as the ones they replace is patched in place (no copy of the others).
    pub fn update<R: Row<Owned = O>>(
        &mut self,
        rows: &[R],
        found: &[Option<usize>],
        fresh: &[Vec<&str>],
    ) {
        let in_place = rows.len() == self.rows.len()
            && self.texts.len() == fresh.len()
            && found
                .iter()
                .enumerate()
                .all(|(i, f)| f.is_none_or(|j| j == i));
        if in_place {
            let changed: Vec<usize> = (0..found.len()).filter(|&i| found[i].is_none()).collect();
            for (f, fresh) in fresh.iter().enumerate() {
                let same_len = changed.len() == fresh.len()
                    && changed
                        .iter()
                        .zip(fresh)
                        .all(|(&i, p)| self.text(f, i).len() == p.len());
                if same_len {
                    for (&i, p) in changed.iter().zip(fresh) {
                        let end = self.ends[f][i];
                        self.texts[f].replace_range(end - p.len()..end, p);
                    }
                } else {
                    (self.texts[f], self.ends[f]) = self.build(f, found, fresh);
                }
            }
            for &i in &changed {
                self.rows[i] = rows[i].to_cached();
            }
            return;
        }
        let (texts, ends) = (0..fresh.len())
            .map(|f| self.build(f, found, &fresh[f]))
            .unzip();
        let mut old: Vec<Option<O>> = std::mem::take(&mut self.rows)
            .into_iter()
            .map(Some)
            .collect();
        self.rows = rows
            .iter()
            .zip(found)
            .map(|(r, found)| match found.and_then(|j| old[j].take()) {
                Some(kept) => kept,
                None => r.to_cached(),
            })
            .collect();
        self.texts = texts;
        self.ends = ends;
    }

    /// Family `f`'s text and ends for rows `found` (cached) or fresh (in `fresh`'s order).
    fn build(&self, f: usize, found: &[Option<usize>], fresh: &[&str]) -> (String, Vec<usize>) {
        let mut fresh = fresh.iter();
        let pieces: Vec<&str> = found
            .iter()
            .map(|found| match found {
                Some(j) => self.text(f, *j),
                None => fresh.next().copied().unwrap_or_default(),
            })
            .collect();
        let mut text = String::with_capacity(pieces.iter().map(|p| p.len()).sum());
        let mut ends = Vec::with_capacity(pieces.len());
        for p in pieces {
            text.push_str(p);
            ends.push(text.len());
        }
        (text, ends)
    }

    /// Rows cached.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Bytes held: texts, ends, rows.
    pub fn bytes<R: Row<Owned = O>>(&self) -> usize {
        self.texts.iter().map(String::capacity).sum::<usize>()
            + self
                .ends
                .iter()
                .map(|e| e.capacity() * size_of::<usize>())
                .sum::<usize>()
            + self.rows.capacity() * size_of::<O>()
            + self.rows.iter().map(R::cached_heap).sum::<usize>()
    }
}

/// How many series a family's every-scrape part and each fresh row got.
pub(crate) type Counts = (usize, Vec<usize>);

/// A scrape's message: every family's descriptor, its series encoded every scrape, and the
/// series of the rows the cache does not hold (`fresh_*`, indices into the snapshot's rows),
/// encoded as they are made (nothing held but one row's series). Records how many series each
/// part got, for [`cut`].
#[derive(Debug)]
pub(crate) struct Message {
    pub snap: Arc<Snapshot>,
    pub families: Arc<[Family]>,
    pub compat: Arc<Compat>,
    pub fresh_workloads: Vec<usize>,
    pub fresh_processes: Vec<usize>,
    /// Per family: whether cached rows have series in it (it is there even without fresh ones).
    pub cached: Vec<bool>,
    /// Per family, once encoded: `None` where left out (a gauge without a series), else the
    /// number of series encoded every scrape and of each fresh row.
    pub counts: Mutex<Vec<Option<Counts>>>,
}

impl Message {
    /// Fresh row `k`'s series of `rows` into `s`.
    fn row(&self, rows: Rows, k: usize, s: &mut Series) {
        match rows {
            Rows::None => {}
            Rows::Workload(f) => {
                let w = &self.snap.workloads[self.fresh_workloads[k]];
                f(&WorkloadRow::of(w, &self.snap.gpus), &self.compat, s)
            }
            Rows::Process(f) => f(
                &ProcessRow::of(&self.snap.processes[self.fresh_processes[k]]),
                s,
            ),
        }
    }

    fn fresh(&self, rows: Rows) -> usize {
        match rows {
            Rows::None => 0,
            Rows::Workload(_) => self.fresh_workloads.len(),
            Rows::Process(_) => self.fresh_processes.len(),
        }
    }
}

fn encode_series(m: &mut MetricEncoder, series: &mut Series) -> std::fmt::Result {
    for (labels, value) in series.drain(..) {
        let mut fam = m.encode_family(&labels)?;
        match value {
            Value::Gauge(v) => ConstGauge::new(v).encode(fam)?,
            Value::Counter(v) => fam.encode_counter::<NoLabelSet, _, f64>(&v, None)?,
        }
    }
    Ok(())
}

impl Collector for Message {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut counts = Vec::with_capacity(self.families.len());
        let mut buf = Series::new();
        for (fam, cached) in self.families.iter().zip(&self.cached) {
            buf.clear();
            if let Some(each) = fam.each {
                each(&self.snap, &self.compat, &mut buf);
            }
            let each = buf.len();
            // Rows up to the first with a series: the descriptor goes out once there is one.
            let (fresh, mut rows) = (self.fresh(fam.rows), Vec::new());
            while buf.is_empty() && rows.len() < fresh {
                self.row(fam.rows, rows.len(), &mut buf);
                rows.push(buf.len());
            }
            if buf.is_empty() && !fam.counter && !cached {
                counts.push(None);
                continue;
            }
            let ty = if fam.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let mut m = e.encode_descriptor(fam.name, fam.help, None, ty)?;
            encode_series(&mut m, &mut buf)?;
            while rows.len() < fresh {
                self.row(fam.rows, rows.len(), &mut buf);
                rows.push(buf.len());
                encode_series(&mut m, &mut buf)?;
            }
            counts.push(Some((each, rows)));
        }
        *self.counts.lock().unwrap_or_else(|p| p.into_inner()) = counts;
        Ok(())
    }
}

/// Encodes `message` with prometheus-client, in the Prometheus text format or OpenMetrics
/// (without its `# EOF`), into a string of `capacity`.
pub(crate) fn encode(message: &Arc<Message>, openmetrics: bool, capacity: usize) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Arc::clone(message)));
    let mut out = String::with_capacity(capacity);
    let _ = if openmetrics {
        prometheus_client::encoding::text::encode_registry(&mut out, &registry)
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
    };
    out
}

/// An encoded family cut up: its descriptor lines, the series encoded every scrape, and each
/// fresh row's series.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Cut<'t> {
    pub header: &'t str,
    pub each: &'t str,
    pub rows: Vec<&'t str>,
}

/// Cuts `text` (what [`encode`] made of the emitted families) into families, each into its
/// descriptor, then `each[f]` series, then one piece per fresh row of `rows[f]` series each.
/// Every series is one line (prometheus-client escapes newlines in label values and help).
/// `None` where the text does not hold that many lines.
pub(crate) fn cut<'t>(text: &'t str, each: &[usize], rows: &[Vec<usize>]) -> Option<Vec<Cut<'t>>> {
    let mut rest = text;
    // The next `n` lines, or for `None` a descriptor: its `# HELP` line and the lines after it
    // that start with '#' (`# TYPE`, `# UNIT`) up to the next `# HELP` (a series never starts
    // with '#').
    let mut lines = |n: Option<usize>| -> Option<&'t str> {
        let mut len = 0;
        let mut taken = 0;
        let descriptor = |len: usize, taken: usize| {
            let line = &rest[len..];
            match taken {
                0 => line.starts_with("# HELP "),
                _ => line.starts_with('#') && !line.starts_with("# HELP "),
            }
        };
        while n.map_or_else(|| descriptor(len, taken), |n| taken < n) {
            len += rest[len..].find('\n')? + 1;
            taken += 1;
        }
        let (piece, tail) = rest.split_at(len);
        rest = tail;
        Some(piece)
    };
    let mut cuts = Vec::with_capacity(each.len());
    for (&each, rows) in each.iter().zip(rows) {
        cuts.push(Cut {
            header: lines(None).filter(|h| !h.is_empty())?,
            each: lines(Some(each))?,
            rows: rows
                .iter()
                .map(|&n| lines(Some(n)))
                .collect::<Option<Vec<_>>>()?,
        });
    }
    rest.is_empty().then_some(cuts)
}
