//! The rows whose series the scrape cache keeps: the fields of a workload or process row that
//! its series are made of, and nothing else (so a field no series shows, like how long a state
//! has lasted, never costs a re-encoding). Series are encoded from these alone, which keeps
//! what is compared and what is encoded the same set of fields.

use std::{
    borrow::Cow,
    hash::{Hash, Hasher},
    sync::Arc,
};

use crate::snapshot::{GpuView, ProcessView, WorkloadView};

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

/// A workload row as its series see it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WorkloadRow<'a> {
    pub workload: Cow<'a, str>,
    pub name: Cow<'a, str>,
    pub namespace: Cow<'a, str>,
    pub pod: Cow<'a, str>,
    pub container: Cow<'a, str>,
    pub container_id: Cow<'a, str>,
    pub gpu_uuid: Cow<'a, str>,
    pub used_bytes: u64,
    pub quota_bytes: Option<u64>,
    pub quota_trust: Cow<'a, str>,
    pub state: Cow<'a, str>,
    pub suspended_bytes: u64,
    pub utilization: Option<Bits>,
    pub memory_utilization: Option<Bits>,
    pub identity: Cow<'a, str>,
    /// The index and name of the GPU the row is on, when that GPU is in the sample (`all` rows
    /// have none): what the compat families label a row with.
    pub gpu: Option<(u32, Cow<'a, str>)>,
}

fn own(s: &str) -> Cow<'static, str> {
    Cow::Owned(s.to_owned())
}

/// Heap bytes of a cached (owned) string.
fn heap(s: &str) -> usize {
    s.len()
}

impl<'a> WorkloadRow<'a> {
    /// `w`'s fields, with the GPU it is on among `gpus`.
    pub fn of(w: &'a WorkloadView, gpus: &'a [Arc<GpuView>]) -> Self {
        Self {
            workload: Cow::Borrowed(&w.workload),
            name: Cow::Borrowed(&w.name),
            namespace: Cow::Borrowed(&w.namespace),
            pod: Cow::Borrowed(&w.pod),
            container: Cow::Borrowed(&w.container),
            container_id: Cow::Borrowed(&w.container_id),
            gpu_uuid: Cow::Borrowed(&w.gpu_uuid),
            used_bytes: w.used_bytes,
            quota_bytes: w.quota_bytes,
            quota_trust: Cow::Borrowed(&w.quota_trust),
            state: Cow::Borrowed(&w.state),
            suspended_bytes: w.suspended_bytes,
            utilization: w.utilization.map(Bits),
            memory_utilization: w.memory_utilization.map(Bits),
            identity: Cow::Borrowed(&w.identity),
            gpu: gpus
                .iter()
                .find(|g| g.uuid == w.gpu_uuid)
                .map(|g| (g.index, Cow::Borrowed(g.name.as_str()))),
        }
    }
}

impl Row for WorkloadRow<'_> {
    type Owned = WorkloadRow<'static>;

    fn same(&self, cached: &WorkloadRow<'static>) -> bool {
        self == cached
    }

    fn to_cached(&self) -> WorkloadRow<'static> {
        WorkloadRow {
            workload: own(&self.workload),
            name: own(&self.name),
            namespace: own(&self.namespace),
            pod: own(&self.pod),
            container: own(&self.container),
            container_id: own(&self.container_id),
            gpu_uuid: own(&self.gpu_uuid),
            used_bytes: self.used_bytes,
            quota_bytes: self.quota_bytes,
            quota_trust: own(&self.quota_trust),
            state: own(&self.state),
            suspended_bytes: self.suspended_bytes,
            utilization: self.utilization,
            memory_utilization: self.memory_utilization,
            identity: own(&self.identity),
            gpu: self.gpu.as_ref().map(|(i, n)| (*i, own(n))),
        }
    }

    fn key(&self) -> u64 {
        hash_of((&self.workload, &self.gpu_uuid))
    }

    fn cached_key(cached: &WorkloadRow<'static>) -> u64 {
        cached.key()
    }

    fn cached_heap(c: &WorkloadRow<'static>) -> usize {
        [
            &c.workload,
            &c.name,
            &c.namespace,
            &c.pod,
            &c.container,
            &c.container_id,
            &c.gpu_uuid,
            &c.quota_trust,
            &c.state,
            &c.identity,
        ]
        .into_iter()
        .map(|s| heap(s))
        .sum::<usize>()
            + c.gpu.as_ref().map_or(0, |(_, n)| heap(n))
    }
}

/// A process row as its series see it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ProcessRow<'a> {
    pub gpu_uuid: Cow<'a, str>,
    pub pid: u32,
    pub comm: Cow<'a, str>,
    pub workload: Cow<'a, str>,
    pub used_bytes: Option<u64>,
    pub utilization: Option<Bits>,
}

impl<'a> ProcessRow<'a> {
    /// `p`'s fields.
    pub fn of(p: &'a ProcessView) -> Self {
        Self {
            gpu_uuid: Cow::Borrowed(&p.gpu_uuid),
            pid: p.pid,
            comm: Cow::Borrowed(&p.comm),
            workload: Cow::Borrowed(&p.workload),
            used_bytes: p.used_bytes,
            utilization: p.utilization.map(Bits),
        }
    }
}

impl Row for ProcessRow<'_> {
    type Owned = ProcessRow<'static>;

    fn same(&self, cached: &ProcessRow<'static>) -> bool {
        self == cached
    }

    fn to_cached(&self) -> ProcessRow<'static> {
        ProcessRow {
            gpu_uuid: own(&self.gpu_uuid),
            pid: self.pid,
            comm: own(&self.comm),
            workload: own(&self.workload),
            used_bytes: self.used_bytes,
            utilization: self.utilization,
        }
    }

    fn key(&self) -> u64 {
        hash_of((self.pid, &self.gpu_uuid))
    }

    fn cached_key(cached: &ProcessRow<'static>) -> u64 {
        cached.key()
    }

    fn cached_heap(c: &ProcessRow<'static>) -> usize {
        heap(&c.gpu_uuid) + heap(&c.comm) + heap(&c.workload)
    }
}
