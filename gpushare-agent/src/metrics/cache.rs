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
use std::hash::{Hash, Hasher};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet},
    metrics::{MetricType, gauge::ConstGauge},
    registry::Registry,
};

use super::Labels;

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

/// A float compared by its bits: `-0.0` and `0.0` encode differently, and a NaN equals itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bits(pub f64);

impl PartialEq for Bits {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

/// What a cached row is: the fields its series are made of, borrowed from a snapshot or owned
/// by the cache.
pub(crate) trait Row {
    /// The cache's copy.
    type Owned;
    /// Whether the cached copy holds the same fields.
    fn same(&self, cached: &Self::Owned) -> bool;
    /// A copy for the cache.
    fn to_cached(&self) -> Self::Owned;
    /// A hash of who the row is (not of its values), to find a row that moved.
    fn key(&self) -> u64;
    /// [`Row::key`] of a cached copy.
    fn cached_key(cached: &Self::Owned) -> u64;
    /// Heap bytes a cached copy holds besides itself.
    fn cached_heap(cached: &Self::Owned) -> usize;
}

/// A hash of `v` (the cache's own: nothing outside the process sees it).
pub(crate) fn hash_of(v: impl Hash) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

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
                if let Some(c) = self.rows.get(i)
                    && r.same(c)
                {
                    return Some(i);
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
    /// no longer in `rows` leave the cache.
    pub fn update<R: Row<Owned = O>>(
        &mut self,
        rows: &[R],
        found: &[Option<usize>],
        fresh: &[Vec<&str>],
    ) {
        let mut texts = Vec::with_capacity(fresh.len());
        let mut ends = Vec::with_capacity(fresh.len());
        for (f, fresh) in fresh.iter().enumerate() {
            let mut fresh = fresh.iter();
            let mut pieces = Vec::with_capacity(found.len());
            for found in found {
                pieces.push(match found {
                    Some(j) => self.text(f, *j),
                    None => fresh.next().copied().unwrap_or_default(),
                });
            }
            let mut text = String::with_capacity(pieces.iter().map(|p| p.len()).sum());
            let mut end = Vec::with_capacity(pieces.len());
            for p in pieces {
                text.push_str(p);
                end.push(text.len());
            }
            texts.push(text);
            ends.push(end);
        }
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

/// One family of a scrape's message: its descriptor and the series to encode now.
#[derive(Debug)]
pub(crate) struct Job {
    pub name: &'static str,
    pub help: &'static str,
    pub counter: bool,
    /// Whether the family is in the output (a gauge without a single series is left out).
    pub emitted: bool,
    pub series: Series,
}

#[derive(Debug)]
struct JobCollector(Vec<Job>);

impl Collector for JobCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for job in self.0.iter().filter(|j| j.emitted) {
            let ty = if job.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let mut m = e.encode_descriptor(job.name, job.help, None, ty)?;
            for (labels, value) in &job.series {
                let fam = m.encode_family(labels)?;
                match *value {
                    Value::Gauge(v) => ConstGauge::new(v).encode(fam)?,
                    Value::Counter(v) => {
                        let mut fam = fam;
                        fam.encode_counter::<NoLabelSet, _, f64>(&v, None)?
                    }
                }
            }
        }
        Ok(())
    }
}

/// Encodes `jobs` with prometheus-client, in the Prometheus text format or OpenMetrics (without
/// its `# EOF`).
pub(crate) fn encode(jobs: Vec<Job>, openmetrics: bool) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(JobCollector(jobs)));
    let mut out = String::new();
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
