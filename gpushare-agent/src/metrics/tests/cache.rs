//! Properties of the scrape cache: a scrape served from the cache is byte-identical to one
//! encoded from nothing, after any sequence of edits (rows changed field by field, added,
//! removed, moved, duplicated; GPUs and counters changed), in both formats, with every compat
//! family and with or without per-process series; and what did not change is not re-encoded.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use proptest::prelude::*;

use crate::metrics::{Compat, Metrics};
use crate::snapshot::{
    ActionCounts, Counters, DriverLimitView, GpuView, ProcessView, SharedSnapshot, Snapshot,
    WorkloadEntry, WorkloadView,
};

/// Strings from a small set (so that rows collide and repeat), with what the encoders escape.
fn text() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["", "a", "b", "ns", "x\"y", "l\\n", "nl\nz", "ünï"])
        .prop_map(str::to_string)
}

fn ratio() -> impl Strategy<Value = Option<f64>> {
    prop::sample::select(vec![
        None,
        Some(0.0),
        Some(-0.0),
        Some(0.5),
        Some(1.0 / 3.0),
        Some(0.999),
        Some(f64::NAN),
    ])
}

fn bytes() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![0, 1, 5 << 20, (3 << 20) + 7, 1 << 30, u64::MAX])
}

fn gpu_uuid() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["GPU-a", "GPU-b", "GPU-c", "all", "GPU-gone"])
        .prop_map(str::to_string)
}

fn gpu() -> impl Strategy<Value = GpuView> {
    (
        (
            0u32..3,
            gpu_uuid(),
            text(),
            bytes(),
            bytes(),
            bytes(),
            any::<bool>(),
        ),
        (
            prop::sample::select(vec!["", "soft", "driver_limits"]),
            ratio(),
            ratio(),
            prop::option::of(0u32..100),
            ratio(),
            prop::option::of(0u32..3000),
        ),
    )
        .prop_map(
            |((index, uuid, name, total, used, free, healthy), (backend, u, mu, t, p, c))| {
                GpuView {
                    index,
                    uuid,
                    name,
                    memory_total_bytes: total,
                    memory_used_bytes: used,
                    memory_free_bytes: free,
                    healthy,
                    isolation_backend: backend.into(),
                    utilization: u,
                    memory_utilization: mu,
                    temperature_celsius: t,
                    power_watts: p.map(|p| p * 300.0),
                    sm_clock_mhz: c,
                    ..Default::default()
                }
            },
        )
}

fn workload() -> impl Strategy<Value = WorkloadEntry> {
    (
        (
            prop::sample::select(vec!["docker://a", "docker://b", "pod://u1", "x\"y"]),
            text(),
            text(),
            text(),
            text(),
            text(),
            gpu_uuid(),
            bytes(),
        ),
        (
            prop::option::of(bytes()),
            text(),
            prop::sample::select(vec!["ok", "frozen", "suspended", "killing", "weird"]),
            bytes(),
            ratio(),
            ratio(),
            prop::sample::select(vec!["", "runtime", "degraded"]),
            any::<f64>(),
        ),
    )
        .prop_map(
            |(
                (workload, name, namespace, pod, container, container_id, gpu_uuid, used),
                (quota, trust, state, suspended, u, mu, identity, for_secs),
            )| WorkloadEntry {
                row: Arc::new(WorkloadView {
                    workload: workload.into(),
                    name,
                    namespace,
                    pod,
                    container,
                    container_id,
                    gpu_uuid,
                    used_bytes: used,
                    quota_bytes: quota,
                    quota_trust: trust,
                    state: state.into(),
                    suspended_bytes: suspended,
                    utilization: u,
                    memory_utilization: mu,
                    identity: identity.into(),
                    ..Default::default()
                }),
                // Not exported: changes every step on a real node and must not cost a scrape.
                state_for_secs: for_secs,
            },
        )
}

fn process() -> impl Strategy<Value = ProcessView> {
    (
        0u32..4,
        text(),
        text(),
        gpu_uuid(),
        prop::option::of(bytes()),
        ratio(),
    )
        .prop_map(|(pid, comm, workload, gpu_uuid, used, u)| ProcessView {
            pid,
            comm,
            workload,
            gpu_uuid,
            used_bytes: used,
            utilization: u,
            ..Default::default()
        })
}

fn counts() -> impl Strategy<Value = BTreeMap<String, u64>> {
    prop::collection::btree_map(
        prop::sample::select(vec!["freeze/ok", "kill", "a/b/c", "x\"y"]).prop_map(str::to_string),
        0u64..5,
        0..3,
    )
}

/// Actions by (action, result), label values needing escapes among them.
fn actions() -> impl Strategy<Value = ActionCounts> {
    let pair = prop::sample::select(vec![
        ("freeze", "ok"),
        ("kill", ""),
        ("a/b", "c"),
        ("x\"y", "ok"),
    ]);
    prop::collection::vec((pair, 0u64..5), 0..3).prop_map(|v| {
        let mut a = ActionCounts::default();
        for ((action, result), n) in v {
            a.add(action, result, n);
        }
        a
    })
}

fn counters() -> impl Strategy<Value = Counters> {
    (actions(), counts(), any::<bool>(), 0u64..3).prop_map(|(actions, ioctls, valid, lost)| {
        Counters {
            enforcement_actions: actions,
            gpu_ioctls: Arc::new(ioctls.clone()),
            ebpf_events_lost: lost,
            quota_config_valid: valid,
            env_quota_unit_mismatch: ioctls.keys().map(|k| (k.clone(), "x".into())).collect(),
            ..Default::default()
        }
    })
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    (
        prop::collection::vec(gpu(), 0..4),
        prop::collection::vec(workload(), 0..10),
        prop::collection::vec(process(), 0..10),
        counters(),
        prop::collection::vec((gpu_uuid(), bytes(), bytes()), 0..3),
    )
        .prop_map(|(gpus, workloads, processes, counters, limits)| Snapshot {
            unattributed_bytes: gpus.iter().map(|g| (g.uuid.clone(), 3)).collect(),
            gpus: gpus.into_iter().map(Arc::new).collect(),
            workloads,
            processes: processes.into_iter().map(Arc::new).collect(),
            counters,
            driver_limits: limits
                .into_iter()
                .map(|(gpu_uuid, soft_bytes, hard_bytes)| DriverLimitView {
                    gpu_uuid,
                    cgroup_path: "/kubepods/x".into(),
                    soft_bytes,
                    hard_bytes,
                    source: "agent".into(),
                })
                .collect(),
            ..Default::default()
        })
}

/// One change between two scrapes.
#[derive(Clone, Debug)]
enum Edit {
    /// One field of a workload row (by number) taken from another row.
    WorkloadField(usize, u8, WorkloadEntry),
    Workload(usize, WorkloadEntry),
    InsertWorkload(usize, WorkloadEntry),
    RemoveWorkload(usize),
    SwapWorkloads(usize, usize),
    DuplicateWorkload(usize),
    ProcessField(usize, u8, ProcessView),
    InsertProcess(usize, ProcessView),
    RemoveProcess(usize),
    SwapProcesses(usize, usize),
    Gpu(usize, GpuView),
    RemoveGpu(usize),
    Counters(Counters),
}

fn edit() -> impl Strategy<Value = Edit> {
    let i = || 0usize..12;
    prop_oneof![
        4 => (i(), 0u8..16, workload()).prop_map(|(i, f, w)| Edit::WorkloadField(i, f, w)),
        1 => (i(), workload()).prop_map(|(i, w)| Edit::Workload(i, w)),
        1 => (i(), workload()).prop_map(|(i, w)| Edit::InsertWorkload(i, w)),
        1 => i().prop_map(Edit::RemoveWorkload),
        1 => (i(), i()).prop_map(|(a, b)| Edit::SwapWorkloads(a, b)),
        1 => i().prop_map(Edit::DuplicateWorkload),
        2 => (i(), 0u8..6, process()).prop_map(|(i, f, p)| Edit::ProcessField(i, f, p)),
        1 => (i(), process()).prop_map(|(i, p)| Edit::InsertProcess(i, p)),
        1 => i().prop_map(Edit::RemoveProcess),
        1 => (i(), i()).prop_map(|(a, b)| Edit::SwapProcesses(a, b)),
        1 => (i(), gpu()).prop_map(|(i, g)| Edit::Gpu(i, g)),
        1 => i().prop_map(Edit::RemoveGpu),
        1 => counters().prop_map(Edit::Counters),
    ]
}

fn set_workload_field(w: &mut WorkloadEntry, field: u8, from: WorkloadEntry) {
    match field {
        0 => w.workload = from.workload.clone(),
        1 => w.name = from.name.clone(),
        2 => w.namespace = from.namespace.clone(),
        3 => w.pod = from.pod.clone(),
        4 => w.container = from.container.clone(),
        5 => w.container_id = from.container_id.clone(),
        6 => w.gpu_uuid = from.gpu_uuid.clone(),
        7 => w.used_bytes = from.used_bytes,
        8 => w.quota_bytes = from.quota_bytes,
        9 => w.quota_trust = from.quota_trust.clone(),
        10 => w.state = from.state.clone(),
        11 => w.suspended_bytes = from.suspended_bytes,
        12 => w.utilization = from.utilization,
        13 => w.memory_utilization = from.memory_utilization,
        14 => w.identity = from.identity.clone(),
        _ => w.state_for_secs = from.state_for_secs,
    }
}

fn set_process_field(p: &mut ProcessView, field: u8, from: ProcessView) {
    match field {
        0 => p.pid = from.pid,
        1 => p.comm = from.comm,
        2 => p.workload = from.workload,
        3 => p.gpu_uuid = from.gpu_uuid,
        4 => p.used_bytes = from.used_bytes,
        _ => p.utilization = from.utilization,
    }
}

fn apply(s: &mut Snapshot, e: Edit) {
    fn at<T>(v: &[T], i: usize) -> Option<usize> {
        (!v.is_empty()).then(|| i % v.len())
    }
    match e {
        Edit::WorkloadField(i, f, from) => {
            if let Some(i) = at(&s.workloads, i) {
                set_workload_field(&mut s.workloads[i], f, from);
            }
        }
        Edit::Workload(i, w) => {
            if let Some(i) = at(&s.workloads, i) {
                s.workloads[i] = w;
            }
        }
        Edit::InsertWorkload(i, w) => {
            let i = i % (s.workloads.len() + 1);
            s.workloads.insert(i, w);
        }
        Edit::RemoveWorkload(i) => {
            if let Some(i) = at(&s.workloads, i) {
                s.workloads.remove(i);
            }
        }
        Edit::SwapWorkloads(a, b) => {
            if let (Some(a), Some(b)) = (at(&s.workloads, a), at(&s.workloads, b)) {
                s.workloads.swap(a, b);
            }
        }
        Edit::DuplicateWorkload(i) => {
            if let Some(i) = at(&s.workloads, i) {
                let w = s.workloads[i].clone();
                s.workloads.insert(i, w);
            }
        }
        Edit::ProcessField(i, f, from) => {
            if let Some(i) = at(&s.processes, i) {
                set_process_field(Arc::make_mut(&mut s.processes[i]), f, from);
            }
        }
        Edit::InsertProcess(i, p) => {
            let i = i % (s.processes.len() + 1);
            s.processes.insert(i, Arc::new(p));
        }
        Edit::RemoveProcess(i) => {
            if let Some(i) = at(&s.processes, i) {
                s.processes.remove(i);
            }
        }
        Edit::SwapProcesses(a, b) => {
            if let (Some(a), Some(b)) = (at(&s.processes, a), at(&s.processes, b)) {
                s.processes.swap(a, b);
            }
        }
        Edit::Gpu(i, g) => match at(&s.gpus, i) {
            Some(i) => s.gpus[i] = Arc::new(g),
            None => s.gpus.push(Arc::new(g)),
        },
        Edit::RemoveGpu(i) => {
            if let Some(i) = at(&s.gpus, i) {
                s.gpus.remove(i);
            }
        }
        Edit::Counters(c) => s.counters = c,
    }
}

fn compat() -> impl Strategy<Value = Compat> {
    (any::<bool>(), any::<bool>(), any::<bool>(), text()).prop_map(|(hami, volcano, dcgm, node)| {
        Compat {
            hami,
            volcano,
            dcgm,
            node,
        }
    })
}

fn shared(s: &Snapshot) -> SharedSnapshot {
    Arc::new(RwLock::new(Arc::new(s.clone())))
}

/// Both formats, encoded from nothing (a new registry, so an empty cache).
fn from_scratch(s: &Snapshot, compat: &Compat, process_series: bool) -> (String, String) {
    let m = Metrics::with_options(shared(s), compat.clone(), process_series);
    (m.render_prometheus(), m.render_openmetrics())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// After every step of random edits, the cached scrape equals a scrape from nothing, in
    /// both formats; an unchanged re-scrape of an equal (not the same) snapshot re-encodes no
    /// row and gives the same bytes.
    #[test]
    fn cached_scrapes_equal_scrapes_from_scratch(
        first in snapshot(),
        steps in prop::collection::vec(prop::collection::vec(edit(), 0..4), 1..6),
        compat in compat(),
        process_series in any::<bool>(),
    ) {
        let live = shared(&first);
        let m = Metrics::with_options(live.clone(), compat.clone(), process_series);
        let mut s = first;
        for (n, edits) in steps.into_iter().enumerate() {
            for e in edits {
                apply(&mut s, e);
            }
            *live.write().unwrap() = Arc::new(s.clone());
            let (prom, om) = from_scratch(&s, &compat, process_series);
            prop_assert_eq!(&m.render_prometheus(), &prom, "step {}: prometheus text", n);
            prop_assert_eq!(&m.render_openmetrics(), &om, "step {}: openmetrics text", n);
            // The same content again, in a new allocation: served from the cache.
            *live.write().unwrap() = Arc::new(s.clone());
            let before = m.cache_stats().rows_encoded;
            prop_assert_eq!(&m.render_prometheus(), &prom, "step {}: unchanged", n);
            prop_assert_eq!(&m.render_openmetrics(), &om, "step {}: unchanged", n);
            prop_assert_eq!(m.cache_stats().rows_encoded, before, "step {}: re-encoded", n);
        }
    }
}

/// 1,000 workloads and as many processes: the first scrape encodes every row, an unchanged one
/// none, one after 1 % of the rows changed those only; a removed row leaves the cache.
#[test]
fn only_changed_rows_are_re_encoded_and_removed_rows_leave_the_cache() {
    let mut s = Snapshot::default();
    s.gpus.push(Arc::new(GpuView {
        uuid: "GPU-a".into(),
        name: "H100".into(),
        ..Default::default()
    }));
    for i in 0..1000 {
        s.workloads.push(
            WorkloadView {
                workload: format!("docker://{i}"),
                gpu_uuid: "GPU-a".into(),
                used_bytes: 1 << 30,
                quota_bytes: Some(2 << 30),
                state: "ok".into(),
                ..Default::default()
            }
            .into(),
        );
        s.processes.push(Arc::new(ProcessView {
            pid: i,
            comm: "python".into(),
            workload: format!("docker://{i}"),
            gpu_uuid: "GPU-a".into(),
            used_bytes: Some(1 << 30),
            ..Default::default()
        }));
    }
    let live = shared(&s);
    let compat = Compat {
        hami: true,
        volcano: true,
        dcgm: true,
        node: "n".into(),
    };
    let m = Metrics::with_options(live.clone(), compat, true);
    let scrape = || {
        let before = m.cache_stats().rows_encoded;
        let text = m.render_openmetrics();
        (text, m.cache_stats().rows_encoded - before)
    };
    assert_eq!(
        scrape().1,
        2000,
        "first scrape: every workload and process row"
    );
    let full = m.cache_stats().cached_bytes;
    *live.write().unwrap() = Arc::new(s.clone());
    assert_eq!(scrape().1, 0, "unchanged");
    for i in (0..1000).step_by(100) {
        s.workloads[i].used_bytes += 1;
        Arc::make_mut(&mut s.processes[i]).used_bytes = Some(7);
        // Not exported: no re-encoding for it.
        s.workloads[i + 1].state_for_secs += 1.0;
    }
    *live.write().unwrap() = Arc::new(s.clone());
    let (text, n) = scrape();
    assert_eq!(n, 20, "10 workload and 10 process rows changed");
    assert!(text.contains(
        r#"gpushare_workload_gpu_memory_used_bytes{gpu_uuid="GPU-a",workload="docker://100","#
    ));
    // The first row goes, every other moves up: found where they went, none re-encoded; a row
    // put in front is the only one encoded.
    s.workloads.remove(0);
    *live.write().unwrap() = Arc::new(s.clone());
    assert_eq!(scrape().1, 0, "moved rows are found");
    s.workloads.insert(0, s.workloads[5].clone());
    s.workloads[0].workload = "docker://new".into();
    *live.write().unwrap() = Arc::new(s.clone());
    assert_eq!(scrape().1, 1, "one new row");
    // Half the rows go: the cache shrinks with them.
    s.workloads.truncate(500);
    s.processes.truncate(500);
    *live.write().unwrap() = Arc::new(s.clone());
    assert_eq!(scrape().1, 0, "removed rows are dropped, none re-encoded");
    let half = m.cache_stats().cached_bytes;
    assert!(
        half < full * 6 / 10,
        "{half} of {full} bytes after half the rows left"
    );
    assert_eq!(
        m.cache_stats().rows,
        1000,
        "500 workload + 500 process rows cached"
    );
}
