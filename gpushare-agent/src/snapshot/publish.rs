//! [`Publisher`]: one step's [`StepReport`] into a [`Snapshot`], sharing every row whose fields
//! are those of the last snapshot's row.
//!
//! Each row's fields are first gathered borrowed from the report (a `Draft`: no string built),
//! then compared with the last snapshot's row of the same identity (a process by position, else
//! by pid and GPU; a workload by key and GPU, in the sorted order both lists share; a GPU by
//! position): the last row is reused when equal, else a new one is built from the draft. What a
//! fresh publisher would build from the same report is what this one builds (rows equal field by
//! field); only the ioctl totals and how long a workload has been in its state depend on the
//! steps before, as they always did.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::{
    DriverLimitView, GpuView, ProcessView, QuotaView, Snapshot, StepReport, WorkloadEntry,
    WorkloadView,
};
use crate::{
    attribution::{Attribution, ProcessIdentity},
    policy::{GpuScope, Retry},
    quota::WorkloadMeta,
    sample::{DeviceSample, ProcessSample, Utilization},
};

/// NVML's percent as a 0-1 ratio (the Prometheus convention).
fn ratio(percent: u32) -> f64 {
    f64::from(percent.min(100)) / 100.0
}

/// A workload's utilization on one GPU, summed over its processes whose value is known.
#[derive(Default)]
pub(super) struct Busy {
    known: bool,
    sm: u32,
    memory: u32,
}

impl Busy {
    pub(super) fn add(&mut self, u: Option<Utilization>) {
        if let Some(u) = u {
            self.known = true;
            self.sm += u.sm;
            self.memory += u.memory;
        }
    }

    /// (SM, memory) as ratios capped at 1 (samples of several processes can add up past the
    /// whole period); absent when no process's value is known.
    pub(super) fn ratios(&self) -> (Option<f64>, Option<f64>) {
        if !self.known {
            return (None, None);
        }
        (Some(ratio(self.sm)), Some(ratio(self.memory)))
    }
}

/// ioctl totals per workload, monotonic while the workload has tasks.
#[derive(Clone, Debug, Default)]
pub(super) struct Ioctls {
    seen: HashMap<ProcessIdentity, Seen>,
    /// How many entries of `seen` were attributed at the last update.
    live: usize,
    totals: BTreeMap<String, u64>,
    /// `totals` as last published: shared while no total changed.
    published: Arc<BTreeMap<String, u64>>,
}

/// A task as the last update saw it.
#[derive(Clone, Debug)]
struct Seen {
    /// The workload it was last attributed to: the key attribution shared then (compared by
    /// allocation in the steady check; by text when counting).
    key: Arc<str>,
    /// Its ioctl count then.
    count: u64,
    /// Attributed at the last update.
    live: bool,
}

impl Ioctls {
    /// Adds what each task of `table` issued since the last step to its workload's total
    /// (`by_pid`: each attributed task's workload). When no task issued an ioctl, came, went,
    /// or changed workload since, one pass over the table finds it and the last totals are
    /// returned as they are; else [`Self::update_all`].
    pub(super) fn update(
        &mut self,
        table: &Attribution,
        by_pid: &HashMap<u32, &Arc<str>>,
    ) -> Arc<BTreeMap<String, u64>> {
        if self.steady(table, by_pid) {
            return Arc::clone(&self.published);
        }
        self.update_all(table, by_pid)
    }

    /// Whether [`Self::update_all`] would change nothing: every attributed task was seen with
    /// the same workload and count, the others were not attributed at the last update, as many
    /// are attributed as were then (so the same ones), and every task seen is still in the table.
    pub(super) fn steady(&self, table: &Attribution, by_pid: &HashMap<u32, &Arc<str>>) -> bool {
        let (mut attributed, mut present) = (0, 0);
        for t in table.tasks_in_any_order() {
            let seen = self.seen.get(&t.identity);
            present += usize::from(seen.is_some());
            match (by_pid.get(&t.identity.pid), seen) {
                (Some(key), Some(s)) if s.count == t.ioctls && Arc::ptr_eq(&s.key, key) => {
                    attributed += 1
                }
                (None, None) => {}
                (None, Some(s)) if !s.live => {}
                _ => return false,
            }
        }
        attributed == self.live && present == self.seen.len()
    }

    /// [`Self::update`] without the steady check. Updated in place: no string is built for a
    /// task or workload already known, and a total is looked up only for a task that issued
    /// ioctls since (then once per workload with tasks, to add the ones without a total yet).
    pub(super) fn update_all(
        &mut self,
        table: &Attribution,
        by_pid: &HashMap<u32, &Arc<str>>,
    ) -> Arc<BTreeMap<String, u64>> {
        let mut changed = false;
        let mut live_workloads: HashSet<&str> = HashSet::new();
        for s in self.seen.values_mut() {
            s.live = false;
        }
        for t in table.tasks() {
            let Some(&key) = by_pid.get(&t.identity.pid) else {
                continue;
            };
            live_workloads.insert(key);
            let prev = match self.seen.get_mut(&t.identity) {
                Some(seen) if seen.key == *key => {
                    // The allocation shared now, for the next steady check.
                    seen.key = Arc::clone(key);
                    seen.live = true;
                    std::mem::replace(&mut seen.count, t.ioctls)
                }
                _ => self
                    .seen
                    .insert(
                        t.identity,
                        Seen {
                            key: Arc::clone(key),
                            count: t.ioctls,
                            live: true,
                        },
                    )
                    .map_or(0, |s| s.count),
            };
            let delta = t.ioctls.saturating_sub(prev);
            if delta == 0 {
                continue;
            }
            changed = true;
            match self.totals.get_mut(&**key) {
                Some(total) => *total += delta,
                None => {
                    self.totals.insert(key.to_string(), delta);
                }
            }
        }
        // A workload whose tasks issued nothing since still has a total (0 for a new one).
        for key in &live_workloads {
            if !self.totals.contains_key(*key) {
                self.totals.insert(key.to_string(), 0);
                changed = true;
            }
        }
        self.seen
            .retain(|id, _| table.get(id.pid).is_some_and(|t| t.identity == *id));
        self.live = self.seen.values().filter(|s| s.live).count();
        let before = self.totals.len();
        self.totals
            .retain(|k, _| live_workloads.contains(k.as_str()));
        changed |= self.totals.len() != before;
        if changed {
            self.published = Arc::new(self.totals.clone());
        }
        debug_assert_eq!(*self.published, self.totals);
        Arc::clone(&self.published)
    }
}

/// The last snapshot's rows, to share with the next one.
#[derive(Debug, Default)]
pub(super) struct LastRows {
    /// Workload rows in the snapshot's order (by key, then GPU UUID).
    workloads: Vec<LastRow>,
    processes: Vec<Arc<ProcessView>>,
    /// Each process row's workload key as attribution shared it (kept alive here, so the same
    /// allocation is the same text: compared without reading the row's copy).
    process_keys: Vec<Option<Arc<str>>>,
    /// Each process row's GPU UUID as the sample shared it (kept alive here likewise: the same
    /// allocation is the row's text).
    process_gpus: Vec<Arc<str>>,
    gpus: Vec<Arc<GpuView>>,
    /// The quota views, and the generation of the set they were built from.
    quotas: Option<(u64, Arc<[QuotaView]>)>,
}

/// A workload row as last published, with when it entered its state and where its identity's
/// fields came from.
#[derive(Debug)]
pub(super) struct LastRow {
    row: Arc<WorkloadView>,
    since: Instant,
    /// The workload's meta the row's facts were read from (kept alive here, so a meta at the
    /// same address is this one, unchanged: metas are never written in place).
    meta: Option<Arc<WorkloadMeta>>,
    /// The name cache's generation then.
    names: u64,
    /// The row's state, quota trust and identity as the step that built or kept it had them:
    /// static strings, so the same address and length is the same text (compared without
    /// reading the row's copies).
    statics: [&'static str; 3],
}

/// `a` is `b` (the same static text) or has its text.
fn same_static(a: &'static str, b: &'static str, text: &str) -> bool {
    std::ptr::eq(a, b) || a == text
}

/// Builds snapshots; remembers what reports need across steps.
#[derive(Debug, Default)]
pub struct Publisher {
    pub(super) ioctls: Ioctls,
    pub(super) rows: LastRows,
    pub(super) order: Order,
    /// The last snapshot's driver limits, shared with the next while they are the same.
    pub(super) limits: Arc<[DriverLimitView]>,
}

/// What is in progress, in words. In a dry run nothing is ever in progress: a transition the
/// policy wants is what it would do.
fn detail(retry: Option<&Retry>, now: std::time::Duration, dry_run: bool) -> String {
    let Some(r) = retry else {
        return String::new();
    };
    let what = r.transition.name();
    if dry_run {
        return format!("dry run: would {what}; nothing was done");
    }
    let next = r.next_at.saturating_sub(now);
    format!(
        "{what} requested {} time(s), not done yet; next attempt in {}",
        r.attempts,
        crate::quota::fmt_duration(std::time::Duration::from_millis(next.as_millis() as u64))
    )
}

/// One GPU's row, borrowed from the sample.
struct GpuDraft<'a> {
    d: &'a DeviceSample,
    healthy: bool,
    backend: &'static str,
}

impl GpuDraft<'_> {
    fn same(&self, v: &GpuView) -> bool {
        let GpuView {
            index,
            uuid,
            name,
            memory_total_bytes,
            memory_used_bytes,
            memory_free_bytes,
            healthy,
            isolation_backend,
            utilization,
            memory_utilization,
            process_utilization,
            temperature_celsius,
            power_watts,
            sm_clock_mhz,
            context_overhead_bytes,
            context_overhead_source,
        } = v;
        let d = self.d;
        *index == d.index
            && *uuid == d.uuid
            && *name == d.name
            && *memory_total_bytes == d.memory_total
            && *memory_used_bytes == d.memory_used
            && *memory_free_bytes == d.memory_free
            && *healthy == self.healthy
            && *isolation_backend == self.backend
            && *utilization == d.utilization.map(|u| ratio(u.sm))
            && *memory_utilization == d.utilization.map(|u| ratio(u.memory))
            && *process_utilization == self.process_utilization()
            && *temperature_celsius == d.temperature_c
            && *power_watts == self.power_watts()
            && *sm_clock_mhz == d.sm_clock_mhz
            && *context_overhead_bytes == d.context_overhead.bytes
            && *context_overhead_source == d.context_overhead.source.as_str()
    }

    fn process_utilization(&self) -> bool {
        self.d.process_utilization != crate::sample::ProcessUtilization::Unknown
    }

    fn power_watts(&self) -> Option<f64> {
        self.d.power_mw.map(|mw| f64::from(mw) / 1000.0)
    }

    fn view(&self) -> GpuView {
        let d = self.d;
        GpuView {
            index: d.index,
            uuid: d.uuid.clone(),
            name: d.name.clone(),
            memory_total_bytes: d.memory_total,
            memory_used_bytes: d.memory_used,
            memory_free_bytes: d.memory_free,
            healthy: self.healthy,
            isolation_backend: self.backend.to_string(),
            utilization: d.utilization.map(|u| ratio(u.sm)),
            memory_utilization: d.utilization.map(|u| ratio(u.memory)),
            process_utilization: self.process_utilization(),
            temperature_celsius: d.temperature_c,
            power_watts: self.power_watts(),
            sm_clock_mhz: d.sm_clock_mhz,
            context_overhead_bytes: d.context_overhead.bytes,
            context_overhead_source: d.context_overhead.source.as_str().to_string(),
        }
    }
}

/// One process's row, borrowed from the sample and the task table.
struct ProcessDraft<'a> {
    p: &'a ProcessSample,
    comm: &'a str,
    workload: &'a str,
    /// The key `workload` is the text of, when attributed.
    key: Option<&'a Arc<str>>,
}

impl ProcessDraft<'_> {
    /// Whether `v`, the last row of this process's pid and GPU UUID (the caller matched them),
    /// built from the key `key`, has this row's fields.
    fn same(&self, v: &ProcessView, key: Option<&Arc<str>>) -> bool {
        let ProcessView {
            pid: _,
            comm,
            workload,
            gpu_uuid: _,
            used_bytes,
            utilization,
            memory_utilization,
        } = v;
        let p = self.p;
        let same_key = matches!((self.key, key), (Some(a), Some(b)) if Arc::ptr_eq(a, b));
        comm == self.comm
            && (same_key || workload == self.workload)
            && *used_bytes == p.used_bytes
            && *utilization == p.utilization.map(|u| ratio(u.sm))
            && *memory_utilization == p.utilization.map(|u| ratio(u.memory))
    }

    fn view(&self) -> ProcessView {
        let p = self.p;
        ProcessView {
            pid: p.pid,
            comm: self.comm.to_string(),
            workload: self.workload.to_string(),
            gpu_uuid: p.device_uuid.to_string(),
            used_bytes: p.used_bytes,
            utilization: p.utilization.map(|u| ratio(u.sm)),
            memory_utilization: p.utilization.map(|u| ratio(u.memory)),
        }
    }
}

/// What a workload row's identity gives it (the same for each of its GPUs), borrowed.
struct Facts<'a> {
    /// The workload key.
    key: &'a str,
    /// The meta the fields below were read from, and the name cache's generation: a row
    /// whose facts came from the same meta and generation has the same facts (see
    /// [`Facts::same_source`]).
    meta: Option<&'a Arc<WorkloadMeta>>,
    names_generation: u64,
    /// The short name in two parts (see `WorkloadId::short_name_parts`).
    name: (&'static str, &'a str),
    namespace: &'a str,
    pod: &'a str,
    container: &'a str,
    container_id: &'a str,
    identity: &'static str,
    nested: &'a [String],
}

impl Facts<'_> {
    /// Whether `last`'s facts (name, namespace, pod, container, container ID, and a cgroup path
    /// its meta gave) were read from the sources these were: then they are equal without
    /// comparing them. The identity note is compared (it is rebuilt every step).
    fn same_source(&self, last: &LastRow) -> bool {
        let meta = match (self.meta, &last.meta) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        meta && self.names_generation == last.names
    }
}

/// One workload row, borrowed from the report (only a retry's `detail` is built).
struct Draft<'a> {
    key: &'a str,
    gpu: &'a str,
    /// The NVML index the row was made for (`None`: an `all` row): where to look first among
    /// a workload's rows for a quota scope's.
    index: Option<u32>,
    /// A quota scope of its workload is on its GPU (the policy's pass found this row for it).
    own_scope: bool,
    cgroup_path: &'a str,
    /// `cgroup_path` is its workload meta's (not the policy's).
    meta_path: bool,
    used_bytes: u64,
    quota_bytes: Option<u64>,
    quota_source: &'a str,
    quota_trust: &'static str,
    state: &'static str,
    detail: String,
    suspended_bytes: u64,
    utilization: Option<f64>,
    memory_utilization: Option<f64>,
    pids: &'a [u32],
    ioctls: u64,
}

impl<'a> Draft<'a> {
    /// A row of `key` on `gpu` with nothing of its own yet.
    fn new(key: &'a str, gpu: &'a str, index: Option<u32>, meta: Option<&'a WorkloadMeta>) -> Self {
        Self {
            key,
            gpu,
            index,
            own_scope: false,
            cgroup_path: meta.map_or("", |m| m.id.cgroup_path.as_str()),
            meta_path: meta.is_some_and(|m| !m.id.cgroup_path.is_empty()),
            used_bytes: 0,
            quota_bytes: None,
            quota_source: "",
            quota_trust: "",
            state: "ok",
            detail: String::new(),
            suspended_bytes: 0,
            utilization: None,
            memory_utilization: None,
            pids: &[],
            ioctls: 0,
        }
    }

    /// Whether `last`, the last row of the same key and GPU (the caller matched them), has this
    /// row's fields.
    fn same(&self, f: &Facts, last: &LastRow) -> bool {
        let v: &WorkloadView = &last.row;
        let WorkloadView {
            workload: _,
            name,
            cgroup_path,
            namespace,
            pod,
            container,
            container_id,
            gpu_uuid: _,
            used_bytes,
            quota_bytes,
            quota_source,
            quota_trust,
            state,
            detail,
            suspended_bytes,
            utilization,
            memory_utilization,
            identity,
            nested,
            pids,
            ioctls,
        } = v;
        // The facts, by their source when it is the last row's (no string compared), else
        // field by field. A cgroup path not from the meta (the policy's) is always compared.
        let same_facts = f.same_source(last) && (self.meta_path || cgroup_path == self.cgroup_path)
            || (name.len() == f.name.0.len() + f.name.1.len()
                && name.starts_with(f.name.0)
                && name.ends_with(f.name.1)
                && cgroup_path == self.cgroup_path
                && namespace == f.namespace
                && pod == f.pod
                && container == f.container
                && container_id == f.container_id);
        same_facts
            && *used_bytes == self.used_bytes
            && *quota_bytes == self.quota_bytes
            && quota_source == self.quota_source
            && same_static(self.quota_trust, last.statics[1], quota_trust)
            && same_static(self.state, last.statics[0], state)
            && *detail == self.detail
            && *suspended_bytes == self.suspended_bytes
            && *utilization == self.utilization
            && *memory_utilization == self.memory_utilization
            && same_static(f.identity, last.statics[2], identity)
            && nested.as_slice() == f.nested
            && pids.as_slice() == self.pids
            && *ioctls == self.ioctls
    }

    fn view(&self, f: &Facts) -> WorkloadView {
        let mut name = String::with_capacity(f.name.0.len() + f.name.1.len());
        name.push_str(f.name.0);
        name.push_str(f.name.1);
        WorkloadView {
            workload: self.key.to_string(),
            name,
            cgroup_path: self.cgroup_path.to_string(),
            namespace: f.namespace.to_string(),
            pod: f.pod.to_string(),
            container: f.container.to_string(),
            container_id: f.container_id.to_string(),
            gpu_uuid: self.gpu.to_string(),
            used_bytes: self.used_bytes,
            quota_bytes: self.quota_bytes,
            quota_source: self.quota_source.to_string(),
            quota_trust: self.quota_trust.to_string(),
            state: self.state.to_string(),
            detail: self.detail.clone(),
            suspended_bytes: self.suspended_bytes,
            utilization: self.utilization,
            memory_utilization: self.memory_utilization,
            identity: f.identity.to_string(),
            nested: f.nested.to_vec(),
            pids: self.pids.to_vec(),
            ioctls: self.ioctls,
        }
    }
}

/// Where the row of a key and GPU is: among the rows with processes (sorted), or the others.
enum At {
    Sorted(usize),
    Extra(usize),
}

/// The row of `key` on `gpu`, added to `extras` when neither list has it. `mine`: the rows
/// with processes of `key` (one per GPU; the one made for `index` looked at first). `extras`
/// are pushed in key order (the policy's map), so a key's rows there are the last ones.
fn row_of<'a, 'd>(
    mine: &'d mut [Draft<'a>],
    extras: &'d mut Vec<Draft<'a>>,
    key: &'a str,
    gpu: &'a str,
    index: Option<u32>,
    meta: Option<&'a WorkloadMeta>,
) -> &'d mut Draft<'a> {
    let found = index
        .and_then(|i| mine.iter().position(|d| d.index == Some(i) && d.gpu == gpu))
        .or_else(|| mine.iter().position(|d| d.gpu == gpu));
    let at = match found {
        Some(i) => At::Sorted(i),
        None => match extras
            .iter()
            .rev()
            .take_while(|d| d.key == key)
            .position(|d| d.gpu == gpu)
        {
            Some(back) => At::Extra(extras.len() - 1 - back),
            None => {
                extras.push(Draft::new(key, gpu, index, meta));
                At::Extra(extras.len() - 1)
            }
        },
    };
    match at {
        At::Sorted(i) => &mut mine[i],
        At::Extra(i) => &mut extras[i],
    }
}

/// What `key`'s identity gives its rows.
fn facts<'a>(
    key: &'a str,
    metas: &HashMap<&str, &'a Arc<WorkloadMeta>>,
    r: &StepReport<'a>,
) -> Facts<'a> {
    let meta = metas.get(key).copied();
    let id = meta.map(|m| &m.id);
    let names = r.names.cached(key);
    let note = r.identity.get(key);
    Facts {
        key,
        meta,
        names_generation: r.names.generation(),
        name: id.map_or(("", key), |i| i.short_name_parts()),
        namespace: names.and_then(|n| n.namespace.as_deref()).unwrap_or(""),
        pod: names
            .and_then(|n| n.pod.as_deref())
            .or_else(|| id.and_then(|i| i.pod_uid()))
            .unwrap_or(""),
        container: names.and_then(|n| n.container.as_deref()).unwrap_or(""),
        container_id: id.and_then(|i| i.container_id()).unwrap_or(""),
        identity: note.map_or("", |n| n.identity),
        nested: note.map(|n| n.nested.as_slice()).unwrap_or_default(),
    }
}

/// `attributed` ((workload key, process) in sample order) sorted by key, then GPU UUID, then
/// sample order, each with its (key, GPU) rank: equal exactly for the same key and UUID.
/// A workload's processes share its key (one address), so keys are told apart by address and
/// only the distinct ones compared as strings; UUIDs are few.
#[cfg(test)]
pub(super) fn by_workload_and_gpu<'a>(
    attributed: &[(&'a str, &'a ProcessSample)],
) -> Vec<((u32, u32), &'a str, &'a ProcessSample)> {
    ranked(attributed)
        .0
        .into_iter()
        .map(|(k, g, i)| {
            let (key, p) = attributed[i as usize];
            ((k, g), key, p)
        })
        .collect()
}

/// [`by_workload_and_gpu`]'s order: (key rank, GPU rank, place in `attributed`), sorted; and the
/// GPU UUIDs in rank order.
fn ranked<'a>(attributed: &[(&'a str, &'a ProcessSample)]) -> (Vec<(u32, u32, u32)>, Vec<&'a str>) {
    // Each distinct key (by address), and its place in `distinct`.
    let mut slot: HashMap<(usize, usize), usize> = HashMap::new();
    let mut distinct: Vec<(&str, usize)> = Vec::new();
    let mut gpus: HashMap<&str, u32> = HashMap::new();
    for (k, p) in attributed {
        let next = distinct.len();
        slot.entry((k.as_ptr() as usize, k.len()))
            .or_insert_with(|| {
                distinct.push((k, next));
                next
            });
        gpus.entry(&*p.device_uuid).or_insert(0);
    }
    // Ranks in string order; equal strings (at other addresses) get equal ranks.
    distinct.sort_unstable();
    let mut rank = vec![0u32; distinct.len()];
    let mut r = 0;
    for (i, (k, at)) in distinct.iter().enumerate() {
        if i > 0 && distinct[i - 1].0 != *k {
            r += 1;
        }
        rank[*at] = r;
    }
    let mut uuids: Vec<&str> = gpus.keys().copied().collect();
    uuids.sort_unstable();
    for (i, u) in uuids.iter().enumerate() {
        gpus.insert(u, i as u32);
    }
    let mut order: Vec<(u32, u32, u32)> = attributed
        .iter()
        .enumerate()
        .map(|(i, (k, p))| {
            let key = rank[slot[&(k.as_ptr() as usize, k.len())]];
            (key, gpus[&*p.device_uuid], i as u32)
        })
        .collect();
    order.sort_unstable();
    (order, uuids)
}

/// The last step's [`by_workload_and_gpu`] order and what it was worked out from: reused while
/// every attributed process has the same key (the same allocation, kept alive here, so the same
/// text) and GPU UUID at the same place (then the distinct keys and UUIDs, so the ranks, are
/// the same too). A step with the same processes sorts nothing.
#[derive(Debug, Default)]
pub(super) struct Order {
    /// Per attributed process, in sample order: its key.
    keys: Vec<Arc<str>>,
    /// Per attributed process: its GPU UUID's rank (its place in `uuids`).
    gpus: Vec<u32>,
    /// The GPU UUIDs in rank (string) order.
    uuids: Vec<String>,
    /// (key rank, GPU rank, place in sample order), sorted.
    order: Vec<(u32, u32, u32)>,
}

impl Order {
    /// `attributed` (each process's shared key) in [`by_workload_and_gpu`]'s order.
    pub(super) fn of<'a>(
        &mut self,
        attributed: &[(&'a Arc<str>, &'a ProcessSample)],
    ) -> Vec<((u32, u32), &'a str, &'a ProcessSample)> {
        if !self.holds(attributed) {
            let text: Vec<(&str, &ProcessSample)> =
                attributed.iter().map(|(k, p)| (&***k, *p)).collect();
            let (order, uuids) = ranked(&text);
            self.gpus = vec![0; attributed.len()];
            for &(_, g, i) in &order {
                self.gpus[i as usize] = g;
            }
            self.keys = attributed.iter().map(|(k, _)| Arc::clone(k)).collect();
            self.uuids = uuids.into_iter().map(str::to_string).collect();
            self.order = order;
        }
        self.order
            .iter()
            .map(|&(k, g, i)| {
                let (key, p) = attributed[i as usize];
                ((k, g), &**key, p)
            })
            .collect()
    }

    /// Whether the kept order is `attributed`'s.
    pub(super) fn holds(&self, attributed: &[(&Arc<str>, &ProcessSample)]) -> bool {
        self.keys.len() == attributed.len()
            && attributed
                .iter()
                .zip(self.keys.iter().zip(&self.gpus))
                .all(|((k, p), (kept, g))| {
                    Arc::ptr_eq(k, kept)
                        && self
                            .uuids
                            .get(*g as usize)
                            .is_some_and(|u| **u == *p.device_uuid)
                })
    }
}

impl Publisher {
    /// The snapshot of one step.
    pub fn build(&mut self, r: StepReport) -> Snapshot {
        self.build_at(r, Instant::now())
    }

    /// The snapshot of one step taken at `now` (how long rows have been in their state is
    /// counted to it).
    pub(super) fn build_at(&mut self, r: StepReport, now: Instant) -> Snapshot {
        let (sample, table) = (r.sample, r.table);
        let dry_run = |key: &str| r.health.dry_run && !r.taken.contains(key);
        let uuid_of = |i: u32| -> &str {
            sample
                .devices
                .iter()
                .find(|d| d.index == i)
                .map_or("", |d| d.uuid.as_str())
        };
        // Each process's workload key, shared by attribution; each workload's meta (of its
        // last process).
        let mut by_pid: HashMap<u32, &Arc<str>> = HashMap::with_capacity(r.processes.len());
        let mut metas: HashMap<&str, &Arc<WorkloadMeta>> = HashMap::new();
        for p in r.processes {
            by_pid.insert(p.identity.pid, p.shared_key());
            metas.insert(p.key(), &p.workload);
        }
        let gpu_ioctls = self.ioctls.update(table, &by_pid);

        // Processes, and the attributed ones by (workload, GPU), in sample order.
        let mut unattributed: BTreeMap<String, u64> = BTreeMap::new();
        let mut attributed: Vec<(&Arc<str>, &ProcessSample)> =
            Vec::with_capacity(sample.processes.len());
        let mut processes = Vec::with_capacity(sample.processes.len());
        let mut process_keys = Vec::with_capacity(sample.processes.len());
        let mut last_by_id: Option<HashMap<(u32, &str), usize>> = None;
        for (i, p) in sample.processes.iter().enumerate() {
            let shared = by_pid.get(&p.pid).copied();
            let key = shared.map(|k| &**k);
            match shared {
                Some(k) => attributed.push((k, p)),
                None => {
                    *unattributed.entry(p.device_uuid.to_string()).or_default() +=
                        p.used_bytes.unwrap_or(0)
                }
            }
            let draft = ProcessDraft {
                p,
                comm: table.get(p.pid).map_or("", |t| t.comm.as_str()),
                workload: key.unwrap_or_default(),
                key: shared,
            };
            let last = match self.rows.processes.get(i) {
                Some(l)
                    if l.pid == p.pid
                        && (self
                            .rows
                            .process_gpus
                            .get(i)
                            .is_some_and(|g| Arc::ptr_eq(g, &p.device_uuid))
                            || *l.gpu_uuid == *p.device_uuid) =>
                {
                    Some(i)
                }
                _ => last_by_id
                    .get_or_insert_with(|| {
                        self.rows
                            .processes
                            .iter()
                            .enumerate()
                            .map(|(j, l)| ((l.pid, l.gpu_uuid.as_str()), j))
                            .collect()
                    })
                    .get(&(p.pid, &*p.device_uuid))
                    .copied(),
            };
            let last_key = |j: usize| self.rows.process_keys.get(j).and_then(Option::as_ref);
            processes.push(match last {
                Some(j) if draft.same(&self.rows.processes[j], last_key(j)) => {
                    Arc::clone(&self.rows.processes[j])
                }
                _ => Arc::new(draft.view()),
            });
            process_keys.push(shared.cloned());
        }
        drop(last_by_id);

        // Per (workload, GPU): bytes, pids (in sample order), utilization. Ordered by key, then
        // GPU UUID, then sample order, through ranks (integers compared, not strings).
        let attributed = self.order.of(&attributed);
        let pids: Vec<u32> = attributed.iter().map(|(_, _, p)| p.pid).collect();
        let mut sorted: Vec<Draft> = Vec::new();
        let mut start = 0;
        while start < attributed.len() {
            let (rank, key, first) = attributed[start];
            let gpu = &*first.device_uuid;
            let end = start
                + attributed[start..]
                    .iter()
                    .take_while(|(r, _, _)| *r == rank)
                    .count();
            let mut busy = Busy::default();
            let mut d = Draft::new(
                key,
                gpu,
                Some(first.device_index),
                metas.get(key).map(|m| &***m),
            );
            for (_, _, p) in &attributed[start..end] {
                d.used_bytes += p.used_bytes.unwrap_or(0);
                busy.add(p.utilization);
            }
            d.pids = &pids[start..end];
            d.ioctls = gpu_ioctls.get(key).copied().unwrap_or(0);
            (d.utilization, d.memory_utilization) = busy.ratios();
            sorted.push(d);
            start = end;
        }

        // The policy's workloads: a row per liability (scope), with its quota and state.
        let mut extras: Vec<Draft> = Vec::new();
        let mut cursor = 0;
        for (key, ws) in &r.policy.workloads {
            let key = key.as_str();
            let meta = metas.get(key).map(|m| &***m);
            // Its rows with processes (both lists in key order: one walk, no search).
            while sorted.get(cursor).is_some_and(|d| d.key < key) {
                cursor += 1;
            }
            let end = cursor + sorted[cursor..].iter().take_while(|d| d.key == key).count();
            let mine = &mut sorted[cursor..end];
            // Frozen with no liability of its own (an earlier run's freeze, processes unseen):
            // one row, so it shows and can be released.
            let lone = ws
                .scopes
                .is_empty()
                .then(|| (ws.frozen.unwrap_or(GpuScope::All), None));
            for (scope, ss) in ws.scopes.iter().map(|(s, ss)| (*s, Some(ss))).chain(lone) {
                let (gpu, index) = match scope {
                    GpuScope::All => ("all", None),
                    GpuScope::Gpu(i) => (uuid_of(i), Some(i)),
                };
                let v = row_of(mine, &mut extras, key, gpu, index, meta);
                if let Some(ss) = ss {
                    v.own_scope = true;
                    if scope == GpuScope::All {
                        v.used_bytes = ss.usage.unwrap_or(0);
                    }
                    v.quota_bytes = Some(ss.limit);
                }
                v.quota_source = &ws.quota;
                v.quota_trust = r.quota_trust.get(key).copied().unwrap_or("");
                v.state = ws.reported_scope(scope, dry_run(key)).as_str();
                v.detail = detail(ws.retry.as_ref(), r.now, dry_run(key));
                if let Some(fp) = ws.suspension.as_ref().and_then(|s| s.footprint()) {
                    v.suspended_bytes = match scope {
                        GpuScope::All => fp.values().sum(),
                        GpuScope::Gpu(i) => fp.get(&i).copied().unwrap_or(0),
                    };
                    // Its memory is in host memory: the usage that counts for its quota.
                    v.used_bytes = v.used_bytes.max(v.suspended_bytes);
                }
                if let Some(why) = &ws.suspend_failed {
                    v.detail = format!("suspend fell through ({why})");
                }
                if let Some(why) = &ws.waiting_for_room {
                    v.detail = format!("waiting for room to resume: {why}");
                }
                if v.cgroup_path.is_empty() {
                    v.cgroup_path = &ws.cgroup_path;
                }
            }
        }
        let mut rows = if extras.is_empty() {
            sorted
        } else {
            extras.sort_by(|a, b| (a.key, a.gpu).cmp(&(b.key, b.gpu)));
            let mut rows = Vec::with_capacity(sorted.len() + extras.len());
            let (mut a, mut b) = (sorted.into_iter().peekable(), extras.into_iter().peekable());
            while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
                let next = if (x.key, x.gpu) < (y.key, y.gpu) {
                    a.next()
                } else {
                    b.next()
                };
                rows.extend(next);
            }
            rows.extend(a);
            rows.extend(b);
            rows
        };
        // Rows without a quota scope of their own (per-GPU usage under an all-GPU quota) show the
        // workload's overall state: a frozen workload is frozen on every GPU.
        // Both in key order: one walk, no lookup per row.
        let mut policy = r.policy.workloads.iter().peekable();
        for v in rows.iter_mut() {
            let ws = loop {
                match policy.peek() {
                    Some((k, ws)) => match k.as_str().cmp(v.key) {
                        std::cmp::Ordering::Less => {
                            policy.next();
                        }
                        std::cmp::Ordering::Equal => break Some(*ws),
                        std::cmp::Ordering::Greater => break None,
                    },
                    None => break None,
                }
            };
            let Some(ws) = ws else {
                continue;
            };
            if !(v.own_scope || (ws.scopes.is_empty() && v.gpu == "all")) {
                v.state = ws.reported(dry_run(v.key)).as_str();
                v.detail = detail(ws.retry.as_ref(), r.now, dry_run(v.key));
            }
        }

        // Each row against the last snapshot's (both sorted by key, then GPU).
        let mut last = self.rows.workloads.iter().peekable();
        let mut kept = Vec::with_capacity(rows.len());
        let mut workloads = Vec::with_capacity(rows.len());
        // A workload's rows are consecutive: its facts are looked up once.
        let mut facts_of: Option<Facts> = None;
        for d in &rows {
            let order = |l: &LastRow| {
                l.row
                    .workload
                    .as_str()
                    .cmp(d.key)
                    .then_with(|| l.row.gpu_uuid.as_str().cmp(d.gpu))
            };
            let mut matched = false;
            while let Some(l) = last.peek() {
                match order(l) {
                    std::cmp::Ordering::Less => {
                        last.next();
                    }
                    o => {
                        matched = o == std::cmp::Ordering::Equal;
                        break;
                    }
                }
            }
            let f: &Facts = match &mut facts_of {
                Some(f) if std::ptr::eq(f.key, d.key) || f.key == d.key => f,
                slot => slot.insert(facts(d.key, &metas, &r)),
            };
            let (row, since) = match last.peek() {
                Some(l) if matched => {
                    let kept = same_static(d.state, l.statics[0], &l.row.state);
                    let since = if kept { l.since } else { now };
                    match d.same(f, l) {
                        true => (Arc::clone(&l.row), since),
                        false => (Arc::new(d.view(f)), since),
                    }
                }
                _ => (Arc::new(d.view(f)), now),
            };
            workloads.push(WorkloadEntry {
                row: Arc::clone(&row),
                state_for_secs: now.duration_since(since).as_secs_f64(),
            });
            kept.push(LastRow {
                row,
                since,
                meta: f.meta.cloned(),
                names: f.names_generation,
                statics: [d.state, d.quota_trust, f.identity],
            });
        }
        drop(rows);
        self.rows.workloads = kept;

        let gpus: Vec<Arc<GpuView>> = sample
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let draft = GpuDraft {
                    d,
                    healthy: sample.device_ok(d.index),
                    backend: r.backends.get(&d.index).copied().unwrap_or("soft"),
                };
                match self.rows.gpus.get(i) {
                    Some(l) if draft.same(l) => Arc::clone(l),
                    _ => Arc::new(draft.view()),
                }
            })
            .collect();
        self.rows.gpus.clone_from(&gpus);
        self.rows.processes.clone_from(&processes);
        self.rows.process_keys = process_keys;
        self.rows.process_gpus.clear();
        self.rows
            .process_gpus
            .extend(sample.processes.iter().map(|p| Arc::clone(&p.device_uuid)));

        let (set, generation) = r.quotas;
        let quotas = match &self.rows.quotas {
            Some((g, q)) if *g == generation => Arc::clone(q),
            _ => {
                let q: Arc<[QuotaView]> = set
                    .entries()
                    .iter()
                    .map(|e| QuotaView {
                        source: format!("{}:{}", e.origin.file, e.origin.line),
                        selector: e.selector.describe(),
                        gpu: e.gpu.to_string(),
                        gpu_memory_bytes: e.gpu_memory,
                    })
                    .collect();
                self.rows.quotas = Some((generation, Arc::clone(&q)));
                q
            }
        };

        let mut counters = r.counters;
        counters.gpu_ioctls = gpu_ioctls;
        Snapshot {
            taken_at_unix: now_unix(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            health: r.health,
            gpus,
            workloads,
            processes,
            unattributed_bytes: unattributed,
            counters,
            timings: r.timings,
            quotas,
            driver_limits: self.limits_of(&r.driver_limits, uuid_of),
            grants: Arc::default(), // the agent's, from these rows ([`crate::verify`])
        }
    }

    /// The driver limits' rows: the last snapshot's (shared) while every limit is the same.
    fn limits_of<'u>(
        &mut self,
        limits: &[(u32, &str, u64, u64, &'static str)],
        uuid_of: impl Fn(u32) -> &'u str,
    ) -> Arc<[DriverLimitView]> {
        let same = limits.len() == self.limits.len()
            && limits.iter().zip(self.limits.iter()).all(
                |(&(gpu, cgroup, soft, hard, source), v)| {
                    v.soft_bytes == soft
                        && v.hard_bytes == hard
                        && v.cgroup_path == cgroup
                        && v.source == source
                        && v.gpu_uuid == uuid_of(gpu)
                },
            );
        if !same {
            self.limits = limits
                .iter()
                .map(|&(gpu, cgroup, soft, hard, source)| DriverLimitView {
                    gpu_uuid: uuid_of(gpu).to_string(),
                    cgroup_path: cgroup.to_string(),
                    soft_bytes: soft,
                    hard_bytes: hard,
                    source: source.to_string(),
                })
                .collect();
        }
        self.limits.clone()
    }
}

/// Seconds since the epoch, now (0 before it).
fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
