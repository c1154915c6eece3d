use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use proptest::prelude::*;

use super::{publish::Busy, *};
use crate::{
    attribution::{
        Attribution, GpuTaskEntry, ProcessIdentity, cgroupfs::CgroupResolver, names::WorkloadNames,
        parse_cgroup_path,
    },
    policy::{
        ActionKind, GpuScope, GroupState, Killing, Retry, ScopeState, Status, Suspension,
        WorkloadState,
    },
    quota::{Mode, WorkloadMeta},
    sample::{DeviceHealth, DeviceSample, ProcessSample, ProcessUtilization, Utilization},
};

fn build(p: &mut Publisher, table: &Attribution, procs: &[AttributedProcess]) -> Snapshot {
    let sample = GpuSample {
        taken_at: None,
        devices: Vec::new(),
        health: Vec::new(),
        processes: Vec::new(),
        problems: Vec::new(),
    };
    build_with(
        p,
        &sample,
        table,
        procs,
        &PolicyState::default(),
        &NameCache::default(),
    )
}

/// One step's snapshot from these inputs, everything else empty (no quota, trust or identity
/// note, no driver limit, at time zero).
fn build_with(
    p: &mut Publisher,
    sample: &GpuSample,
    table: &Attribution,
    processes: &[AttributedProcess],
    policy: &PolicyState,
    names: &NameCache,
) -> Snapshot {
    p.build(StepReport {
        sample,
        table,
        processes,
        policy,
        names,
        quota_trust: &Default::default(),
        identity: &Default::default(),
        health: Health::default(),
        counters: Counters::default(),
        timings: Default::default(),
        quotas: (&QuotaSet::empty(), 0),
        now: Duration::ZERO,
        backends: BTreeMap::new(),
        driver_limits: Vec::new(),
        taken: &crate::policy::NONE_TAKEN,
    })
}

/// A workload's utilization sums its processes' known values, capped at 1; unknown only when
/// no process's value is known (an idle process is 0, not unknown).
#[test]
fn workload_utilization_sums_known_processes_capped_at_one() {
    let u = |sm, memory| Some(Utilization { sm, memory });
    let mut b = Busy::default();
    b.add(None);
    assert_eq!(b.ratios(), (None, None));
    b.add(u(0, 0));
    assert_eq!(b.ratios(), (Some(0.0), Some(0.0)), "idle is 0");
    b.add(u(60, 10));
    b.add(None);
    b.add(u(70, 5));
    assert_eq!(b.ratios(), (Some(1.0), Some(0.15)));
}

#[test]
fn ioctl_totals_add_what_each_task_issued_since_the_last_step_and_follow_a_move() {
    let me = std::process::id();
    let mut table = Attribution::new(CgroupResolver::new("/sys/fs/cgroup".into()));
    let identity = table.attribute_pid(me).expect("this process").identity;
    let counts = |calls| gpushare_common::maps::IoctlCounts { calls, allocs: 0 };
    let proc_in = |path: &str| {
        AttributedProcess::new(identity, WorkloadMeta::new(parse_cgroup_path(path)), None)
    };
    let (a, b) = (proc_in("/jobs/a"), proc_in("/jobs/b"));
    let (ka, kb) = (a.workload.id.key(), b.workload.id.key());
    let mut p = Publisher::default();

    table.set_ioctl_counts(me, counts(10));
    let s = build(&mut p, &table, std::slice::from_ref(&a));
    assert_eq!(s.counters.gpu_ioctls.get(&ka), Some(&10));
    table.set_ioctl_counts(me, counts(15));
    let s = build(&mut p, &table, std::slice::from_ref(&a));
    assert_eq!(
        s.counters.gpu_ioctls.get(&ka),
        Some(&15),
        "5 more, not 15 more"
    );
    let s = build(&mut p, &table, std::slice::from_ref(&a));
    assert_eq!(s.counters.gpu_ioctls.get(&ka), Some(&15), "nothing new");

    // The task moves to another workload: only what it issues from then on counts there, and
    // the workload it left (no task any more) is gone from the totals.
    table.set_ioctl_counts(me, counts(18));
    let s = build(&mut p, &table, std::slice::from_ref(&b));
    assert_eq!(s.counters.gpu_ioctls.get(&kb), Some(&3));
    assert_eq!(s.counters.gpu_ioctls.get(&ka), None);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Totals kept across steps (the steady pass skipping the count when nothing changed) are
    /// at every step the totals counted in full from the same tables: tasks come and go, a pid
    /// is reused by another task, a task moves between workloads or out of attribution, and a
    /// workload's key is the allocation shared last step or an equal new one. A step shares the
    /// last totals exactly when they are unchanged.
    #[test]
    fn ioctl_totals_kept_equal_totals_counted_in_full(
        steps in prop::collection::vec(
            prop::collection::vec(
                (1u32..5, 1u64..3, prop::option::of(0usize..2), any::<bool>(), prop_oneof![3 => Just(0u64), 1 => 1u64..3]),
                0..5,
            ),
            1..30,
        )
    ) {
        let keys = ["cgroup:///jobs/a", "cgroup:///jobs/b"];
        let mut shared: Vec<Arc<str>> = keys.iter().map(|k| Arc::from(*k)).collect();
        let mut counts: HashMap<(u32, u64), u64> = HashMap::new();
        let (mut kept, mut counted) = (publish::Ioctls::default(), publish::Ioctls::default());
        let mut prev: Option<Arc<BTreeMap<String, u64>>> = None;
        for (i, step) in steps.iter().enumerate() {
            let mut table = Attribution::new(CgroupResolver::new("/nonexistent".into()));
            let mut attributed: Vec<(u32, Arc<str>)> = Vec::new();
            for &(pid, start, workload, same_key, more) in step {
                if table.get(pid).is_some() {
                    continue;
                }
                let count = counts.entry((pid, start)).or_default();
                *count += more;
                let mut t = task(pid, "/jobs/a", "python", *count);
                t.identity.start_ticks = start;
                table.insert_for_test(t);
                if let Some(w) = workload {
                    if !same_key {
                        shared[w] = Arc::from(keys[w]);
                    }
                    attributed.push((pid, Arc::clone(&shared[w])));
                }
            }
            let by_pid: foldhash::HashMap<u32, &Arc<str>> =
                attributed.iter().map(|(p, k)| (*p, k)).collect();
            let a = kept.update(&table, &by_pid);
            let b = counted.update_all(&table, &by_pid);
            prop_assert_eq!(&*a, &*b, "step {}", i);
            prop_assert!(kept.steady(&table, &by_pid), "the same step again is steady ({})", i);
            if let Some(p) = &prev {
                prop_assert_eq!(Arc::ptr_eq(p, &a), **p == *a, "step {}", i);
            }
            prev = Some(a);
        }
    }
}

/// A task attributed at the last step and not now, while another, attributed before that and
/// not at the last step, is again (same workload, no new ioctl): as many tasks are attributed,
/// but not the same ones, so the totals change (the workload the first left has no task).
#[test]
fn ioctl_totals_follow_which_tasks_are_attributed_not_how_many() {
    let (ka, kb): (Arc<str>, Arc<str>) = ("cgroup:///jobs/a".into(), "cgroup:///jobs/b".into());
    let mut table = Attribution::new(CgroupResolver::new("/nonexistent".into()));
    table.insert_for_test(task(1, "/jobs/a", "python", 5));
    table.insert_for_test(task(2, "/jobs/b", "python", 7));
    let mut ioctls = publish::Ioctls::default();
    fn by<'a>(v: &[(u32, &'a Arc<str>)]) -> foldhash::HashMap<u32, &'a Arc<str>> {
        v.iter().map(|(p, k)| (*p, *k)).collect()
    }
    ioctls.update(&table, &by(&[(2, &kb)]));
    let t = ioctls.update(&table, &by(&[(1, &ka)]));
    assert_eq!(*t, BTreeMap::from([(ka.to_string(), 5)]));
    let t = ioctls.update(&table, &by(&[(2, &kb)]));
    assert_eq!(
        *t,
        BTreeMap::from([(kb.to_string(), 0)]),
        "task 1's workload left"
    );
}

/// The JSON of a workload row is what it was before rows were shared: `state_for_secs` among
/// the row's fields in its old place, `identity` and `nested` left out when empty, and it reads
/// back as the same entry.
#[test]
fn a_workload_entry_serializes_as_one_object_in_the_old_field_order() {
    let mut e = WorkloadEntry::from(WorkloadView {
        workload: "cgroup:///jobs/a".into(),
        state: "ok".into(),
        pids: vec![7],
        ..Default::default()
    });
    e.state_for_secs = 2.5;
    let text = serde_json::to_string(&e).unwrap();
    assert_eq!(
        text,
        "{\"workload\":\"cgroup:///jobs/a\",\"name\":\"\",\"cgroup_path\":\"\",\"namespace\":\"\",\
         \"pod\":\"\",\"container\":\"\",\"container_id\":\"\",\"gpu_uuid\":\"\",\"used_bytes\":0,\
         \"quota_bytes\":null,\"quota_source\":\"\",\"quota_trust\":\"\",\"state\":\"ok\",\
         \"detail\":\"\",\"state_for_secs\":2.5,\"suspended_bytes\":0,\"utilization\":null,\
         \"memory_utilization\":null,\"pids\":[7],\"ioctls\":0}"
    );
    assert_eq!(serde_json::from_str::<WorkloadEntry>(&text).unwrap(), e);
    e.identity = "runtime".into();
    e.nested = vec!["/x".into()];
    let text = serde_json::to_string(&e).unwrap();
    assert!(text.contains(
        "\"memory_utilization\":null,\"identity\":\"runtime\",\"nested\":[\"/x\"],\"pids\""
    ));
    assert_eq!(serde_json::from_str::<WorkloadEntry>(&text).unwrap(), e);
}

const ID: &str = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";
const ID2: &str = "aa2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";
const UID: &str = "0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a";

/// Workload roots of every kind (container, container in a pod, pod, unit, plain cgroup).
fn leaves() -> Vec<String> {
    vec![
        format!("/docker/{ID}"),
        format!("/kubepods/pod{UID}/{ID2}"),
        format!("/kubepods/besteffort/pod{UID}"),
        "/system.slice/train.service".into(),
        "/jobs/a".into(),
        // The first one's container under the systemd driver: the same key, another cgroup
        // path and short name (a workload's facts change under its key).
        format!("/system.slice/docker-{ID}.scope"),
    ]
}

/// The distinct workload keys of [`leaves`], in their order.
fn leaf_keys() -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for l in leaves() {
        let k = parse_cgroup_path(&l).key();
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys
}

fn task(pid: u32, leaf: &str, comm: &str, ioctls: u64) -> GpuTaskEntry {
    GpuTaskEntry {
        comm: comm.into(),
        ioctls,
        ..GpuTaskEntry::for_test(pid, Some(leaf))
    }
}

/// One workload's policy state, drawn: (scopes: (scope, status, usage, limit), frozen scope,
/// retry (kind, attempts, next in ms), suspension kind, suspend failed, waiting for room,
/// observed state, ours, killing, quota words, cgroup path).
type WsSpec = (
    Vec<(u8, u8, Option<u64>, u64)>,
    Option<u8>,
    Option<(u8, u32, u64)>,
    u8,
    (bool, bool),
    Option<u8>,
    (bool, bool),
    (u8, u8),
);

/// One step, drawn: tasks per pid (leaf, comm, more ioctls), devices (present, used, SM and
/// memory utilization, healthy, driver limits), processes (pid, device, used, utilization),
/// policy workloads, quota trust, identity notes, dry run, time passing, quota set, driver
/// limits.
type StepSpec = (
    Vec<Option<(u8, u8, u64)>>,
    Vec<(bool, u64, Option<(u32, u32)>, bool, bool)>,
    Vec<(u32, u32, Option<u64>, Option<(u32, u32)>)>,
    Vec<(u8, WsSpec)>,
    (Vec<(u8, u8)>, Vec<(u8, u8, u8)>),
    (bool, u64, u8),
    Vec<(u32, u8, u64, u64)>,
);

fn util() -> impl Strategy<Value = Option<(u32, u32)>> {
    proptest::option::of((0u32..3, 0u32..3).prop_map(|(a, b)| (a * 50, b * 40)))
}

fn ws_spec() -> impl Strategy<Value = WsSpec> {
    (
        proptest::collection::vec(
            (0u8..4, 0u8..7, proptest::option::of(0u64..4), 1u64..4),
            0..3,
        ),
        proptest::option::of(0u8..4),
        proptest::option::weighted(0.2, (0u8..4, 1u32..3, 0u64..4000)),
        0u8..4,
        (proptest::bool::weighted(0.1), proptest::bool::weighted(0.1)),
        proptest::option::of(0u8..5),
        (any::<bool>(), proptest::bool::weighted(0.1)),
        (0u8..2, 0u8..2),
    )
}

fn steps() -> impl Strategy<Value = Vec<StepSpec>> {
    let step = (
        proptest::collection::vec(
            proptest::option::weighted(0.8, (0u8..6, 0u8..2, 0u64..3)),
            10,
        ),
        proptest::collection::vec(
            (
                proptest::bool::weighted(0.9),
                0u64..3,
                util(),
                any::<bool>(),
                any::<bool>(),
            ),
            3,
        ),
        proptest::collection::vec(
            (
                1u32..13,
                0u32..3,
                proptest::option::weighted(0.9, 0u64..3),
                util(),
            ),
            0..14,
        ),
        proptest::collection::vec((0u8..6, ws_spec()), 0..4),
        (
            proptest::collection::vec((0u8..6, 0u8..3), 0..3),
            proptest::collection::vec((0u8..6, 0u8..3, 0u8..3), 0..3),
        ),
        (proptest::bool::weighted(0.2), 0u64..3000, 0u8..2),
        proptest::collection::vec((0u32..4, 0u8..2, 0u64..3, 0u64..3), 0..2),
    );
    proptest::collection::vec(step, 1..12)
}

/// Everything a step's report borrows, built from its spec.
struct World {
    table: Attribution,
    processes: Vec<AttributedProcess>,
    sample: GpuSample,
    policy: PolicyState,
    quota_trust: foldhash::HashMap<String, &'static str>,
    identity: foldhash::HashMap<String, IdentityNote>,
}

const GIB: u64 = 1 << 30;

fn scope_of(i: u8) -> GpuScope {
    match i {
        0 => GpuScope::All,
        // GPU 3 is never sampled: a scope whose UUID is unknown.
        i => GpuScope::Gpu(u32::from(i) - 1),
    }
}

fn status_of(i: u8) -> Status {
    [
        Status::Ok,
        Status::OverQuota,
        Status::Alerted,
        Status::Signalled,
        Status::Frozen,
        Status::Suspended,
        Status::Killed,
    ][usize::from(i)]
}

fn workload_state(s: &WsSpec) -> WorkloadState {
    let (scopes, frozen, retry, suspension, (failed, waiting), observed, (ours, killing), words) =
        s;
    let per_gpu: BTreeMap<u32, u64> = [(0, GIB), (1, 2 * GIB)].into();
    WorkloadState {
        cgroup_path: ["/jobs/a", "/gone"][usize::from(words.1)].into(),
        quota: ["quota `a` at q.toml:1:1", "env:GPUSHARE_GPU_MEMORY"][usize::from(words.0)].into(),
        frozen: frozen.map(scope_of),
        scopes: scopes
            .iter()
            .map(|&(scope, status, usage, limit)| {
                (
                    scope_of(scope),
                    ScopeState {
                        status: status_of(status),
                        over_since: None,
                        steps_taken: 0,
                        usage: usage.map(|u| u * GIB),
                        limit: limit * GIB,
                        mode: Mode::Strict,
                        without_suspend: Status::Ok,
                        compliant_since: None,
                    },
                )
            })
            .collect(),
        killing: killing.then_some(Killing {
            scope: GpuScope::All,
            since: Duration::ZERO,
            signal: crate::quota::SIGNALS[0],
            sigkill_at: None,
        }),
        retry: retry.map(|(kind, attempts, next)| Retry {
            transition: [
                ActionKind::Freeze,
                ActionKind::Thaw,
                ActionKind::Suspend,
                ActionKind::Resume,
            ][usize::from(kind)],
            attempts,
            next_at: Duration::from_millis(next),
        }),
        observed: observed.map(|o| {
            [
                GroupState::Frozen,
                GroupState::Freezing,
                GroupState::Thawed,
                GroupState::Gone,
                GroupState::Replaced,
            ][usize::from(o)]
        }),
        ours: *ours,
        suspended: None,
        suspend_failed: failed.then(|| "unavailable".to_string()),
        suspension: match suspension {
            1 => Some(Suspension::Suspended { per_gpu }),
            2 => Some(Suspension::InProgress {
                resuming: false,
                per_gpu,
            }),
            _ => None,
        },
        waiting_for_room: waiting.then(|| "GPU 0 has 1 GiB free".to_string()),
    }
}

/// GPU `dev`'s UUID, one allocation per GPU for the thread's life, as the sampler shares it
/// across steps (so a publisher finds a process's GPU unchanged by address).
fn shared_uuid(dev: u32) -> Arc<str> {
    thread_local! {
        static UUIDS: std::cell::RefCell<BTreeMap<u32, Arc<str>>> = Default::default();
    }
    UUIDS.with(|u| {
        Arc::clone(
            u.borrow_mut()
                .entry(dev)
                .or_insert_with(|| format!("GPU-{dev}").into()),
        )
    })
}

impl World {
    /// The world of `spec`. `metas`: each leaf's workload meta and key, kept across steps as
    /// the agent keeps them (the same `Arc`s while the leaf's workload lives; two leaves of one
    /// workload have equal keys in two allocations).
    fn of(
        spec: &StepSpec,
        keys: &[String],
        ioctls: &mut [u64],
        metas: &mut HashMap<String, (Arc<WorkloadMeta>, Arc<str>)>,
    ) -> Self {
        let (tasks, devices, procs, policy, (trust, notes), _, _) = spec;
        let leaves = leaves();
        let mut table = Attribution::new(CgroupResolver::new("/nonexistent".into()));
        let mut processes = Vec::new();
        for (i, t) in tasks.iter().enumerate() {
            let Some((leaf, comm, more)) = *t else {
                continue;
            };
            let pid = i as u32 + 1;
            ioctls[i] += more;
            let leaf = &leaves[usize::from(leaf)];
            table.insert_for_test(task(
                pid,
                leaf,
                ["python", "train"][usize::from(comm)],
                ioctls[i],
            ));
            let (meta, key) = metas.entry(leaf.clone()).or_insert_with(|| {
                let meta = WorkloadMeta::new(parse_cgroup_path(leaf));
                let key = meta.key().into();
                (Arc::new(meta), key)
            });
            processes.push(AttributedProcess::sharing(
                ProcessIdentity {
                    pid,
                    start_ticks: 1,
                },
                Arc::clone(meta),
                Arc::clone(key),
                None,
            ));
        }
        let present: Vec<u32> = (0..3u32).filter(|&i| devices[i as usize].0).collect();
        let mut seen = std::collections::HashSet::new();
        let sample = GpuSample {
            taken_at: None,
            devices: present
                .iter()
                .map(|&i| {
                    let (_, used, u, _, _) = devices[i as usize];
                    DeviceSample {
                        index: i,
                        uuid: format!("GPU-{i}"),
                        name: "Fake".into(),
                        memory_total: 80 * GIB,
                        memory_used: used * GIB,
                        memory_free: (80 - used) * GIB,
                        utilization: u.map(|(sm, memory)| Utilization { sm, memory }),
                        process_utilization: match u {
                            Some(_) => ProcessUtilization::Read { since_boot_ns: 1 },
                            None => ProcessUtilization::Unknown,
                        },
                        ..Default::default()
                    }
                })
                .collect(),
            health: present
                .iter()
                .map(|&i| {
                    let h = match devices[i as usize].3 {
                        true => DeviceHealth::Ok,
                        false => DeviceHealth::Degraded { reason: "x".into() },
                    };
                    (i, h)
                })
                .collect(),
            processes: procs
                .iter()
                .filter(|(pid, dev, _, _)| present.contains(dev) && seen.insert((*pid, *dev)))
                .map(|&(pid, dev, used, u)| ProcessSample {
                    pid,
                    device_index: dev,
                    device_uuid: shared_uuid(dev),
                    used_bytes: used.map(|u| u * GIB),
                    utilization: u.map(|(sm, memory)| Utilization { sm, memory }),
                })
                .collect(),
            problems: Vec::new(),
        };
        let policy = PolicyState {
            workloads: policy
                .iter()
                .map(|(k, ws)| (keys[usize::from(*k)].clone(), workload_state(ws)))
                .collect(),
        };
        let quota_trust = trust
            .iter()
            .map(|&(k, t)| {
                let t = ["file", "runtime_spec", "init_environ"][usize::from(t)];
                (keys[usize::from(k)].clone(), t)
            })
            .collect();
        let identity = notes
            .iter()
            .map(|&(k, id, nested)| {
                let note = IdentityNote {
                    identity: ["", "runtime", "degraded"][usize::from(id)],
                    nested: (0..nested).map(|n| format!("/nested/{n}")).collect(),
                };
                (keys[usize::from(k)].clone(), note)
            })
            .collect();
        Self {
            table,
            processes,
            sample,
            policy,
            quota_trust,
            identity,
        }
    }

    fn report<'a>(
        &'a self,
        spec: &StepSpec,
        names: &'a NameCache,
        quotas: &'a [QuotaSet],
        now: Duration,
    ) -> StepReport<'a> {
        let (_, devices, _, _, _, (dry_run, _, q), limits) = spec;
        StepReport {
            sample: &self.sample,
            table: &self.table,
            processes: &self.processes,
            policy: &self.policy,
            names,
            quota_trust: &self.quota_trust,
            identity: &self.identity,
            health: Health {
                dry_run: *dry_run,
                ..Health::default()
            },
            counters: Counters::default(),
            timings: Default::default(),
            quotas: (&quotas[usize::from(*q)], u64::from(*q)),
            now,
            backends: (0..3u32)
                .filter(|&i| devices[i as usize].4)
                .map(|i| (i, "driver_limits"))
                .collect(),
            driver_limits: limits
                .iter()
                .map(|&(gpu, path, soft, hard)| {
                    let path = ["/jobs/a", "/docker/x"][usize::from(path)];
                    (gpu, path, soft * GIB, hard * GIB, "agent")
                })
                .collect(),
            taken: &crate::policy::NONE_TAKEN,
        }
    }
}

/// A snapshot without what depends on the wall clock or the steps before.
fn comparable(s: &Snapshot) -> serde_json::Value {
    let mut v = serde_json::to_value(s).unwrap();
    v["taken_at_unix"] = 0.into();
    for w in v["workloads"].as_array_mut().unwrap() {
        w["state_for_secs"] = 0.into();
    }
    v
}

/// Each row of `next` is the row of the same identity in `prev` (the same allocation) exactly
/// when their fields are equal.
fn shared_when_equal(prev: &Snapshot, next: &Snapshot) -> Result<(), TestCaseError> {
    for w in &next.workloads {
        if let Some(p) = prev
            .workloads
            .iter()
            .find(|p| p.workload == w.workload && p.gpu_uuid == w.gpu_uuid)
        {
            prop_assert_eq!(Arc::ptr_eq(&p.row, &w.row), p.row == w.row, "{:?}", w);
        }
    }
    for n in &next.processes {
        if let Some(p) = prev
            .processes
            .iter()
            .find(|p| p.pid == n.pid && p.gpu_uuid == n.gpu_uuid)
        {
            prop_assert_eq!(Arc::ptr_eq(p, n), p == n, "{:?}", n);
        }
    }
    for (p, n) in prev.gpus.iter().zip(&next.gpus) {
        prop_assert_eq!(Arc::ptr_eq(p, n), p == n, "{:?}", n);
    }
    let (p, n) = (&prev.counters.gpu_ioctls, &next.counters.gpu_ioctls);
    prop_assert_eq!(Arc::ptr_eq(p, n), p == n);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// One publisher kept across a random sequence of steps builds, at every step, what a
    /// publisher with no rows of earlier steps (the same ioctl totals) builds from the same
    /// report; a workload's time in its state restarts exactly when its state changes or its
    /// row was gone; and a row is shared with the last snapshot exactly when it is unchanged.
    #[test]
    fn incremental_rows_equal_rows_built_from_scratch(spec in steps()) {
        let mut keys = leaf_keys();
        keys.push("cgroup:///gone".into());
        let names = NameCache::default();
        let quotas = [
            QuotaSet::empty(),
            QuotaSet::parse("[[quota]]\ncgroup = \"/jobs/*\"\ngpu_memory = \"1GiB\"\n", "q.toml")
                .unwrap(),
        ];
        let t0 = Instant::now();
        let mut ioctls = [0u64; 10];
        let mut metas = HashMap::new();
        let mut now = Duration::ZERO;
        let mut incremental = Publisher::default();
        let mut since: BTreeMap<(String, String), (String, Duration)> = BTreeMap::new();
        let mut prev: Option<Snapshot> = None;
        for (i, step) in spec.iter().enumerate() {
            now += Duration::from_millis(step.5.1);
            let world = World::of(step, &keys, &mut ioctls, &mut metas);
            let mut scratch = Publisher { ioctls: incremental.ioctls.clone(), ..Publisher::default() };
            let a = incremental.build_at(world.report(step, &names, &quotas, now), t0 + now);
            let b = scratch.build_at(world.report(step, &names, &quotas, now), t0 + now);
            prop_assert_eq!(comparable(&a), comparable(&b), "step {}", i);

            // Time in the state, as the publisher always counted it.
            let mut next = BTreeMap::new();
            for w in &a.workloads {
                let k = (w.workload.clone(), w.gpu_uuid.clone());
                let started = match since.get(&k) {
                    Some((state, at)) if *state == w.state => *at,
                    _ => now,
                };
                let want = (t0 + now).duration_since(t0 + started).as_secs_f64();
                prop_assert_eq!(w.state_for_secs, want, "step {} {:?}", i, k);
                next.insert(k, (w.state.clone(), started));
            }
            since = next;

            if let Some(prev) = &prev {
                shared_when_equal(prev, &a)?;
            }
            prev = Some(a);
        }
    }
}

/// A step that changes nothing shares every row of the last snapshot; a process whose usage
/// changed gets a new row, and so does its workload's row on that GPU, while the other rows stay
/// shared.
#[test]
fn an_unchanged_step_shares_every_row_and_a_change_renews_only_its_rows() {
    let leaves = leaves();
    let mut table = Attribution::new(CgroupResolver::new("/nonexistent".into()));
    let mut processes = Vec::new();
    for pid in 1..=4u32 {
        let leaf = &leaves[pid as usize % 2];
        table.insert_for_test(task(pid, leaf, "python", 7));
        let meta = WorkloadMeta::new(parse_cgroup_path(leaf));
        processes.push(AttributedProcess::new(
            ProcessIdentity {
                pid,
                start_ticks: 1,
            },
            meta,
            None,
        ));
    }
    let device = |i: u32| DeviceSample {
        index: i,
        uuid: format!("GPU-{i}"),
        name: "Fake".into(),
        memory_total: 80 * GIB,
        ..Default::default()
    };
    let mut sample = GpuSample {
        taken_at: None,
        devices: vec![device(0), device(1)],
        health: vec![(0, DeviceHealth::Ok), (1, DeviceHealth::Ok)],
        processes: (1..=4u32)
            .map(|pid| ProcessSample {
                pid,
                device_index: pid % 2,
                device_uuid: format!("GPU-{}", pid % 2).into(),
                used_bytes: Some(GIB),
                utilization: None,
            })
            .collect(),
        problems: Vec::new(),
    };
    let quotas = QuotaSet::parse(
        "[[quota]]\ncgroup = \"/jobs/*\"\ngpu_memory = \"1GiB\"\n",
        "q.toml",
    )
    .unwrap();
    let names = NameCache::default();
    let (trust, notes) = (foldhash::HashMap::default(), foldhash::HashMap::default());
    let policy = PolicyState::default();
    let mut p = Publisher::default();
    let mut step = |sample: &GpuSample| {
        p.build(StepReport {
            sample,
            table: &table,
            processes: &processes,
            policy: &policy,
            names: &names,
            quota_trust: &trust,
            identity: &notes,
            health: Health::default(),
            counters: Counters::default(),
            timings: Default::default(),
            quotas: (&quotas, 1),
            now: Duration::ZERO,
            backends: BTreeMap::new(),
            driver_limits: Vec::new(),
            taken: &crate::policy::NONE_TAKEN,
        })
    };
    let first = step(&sample);
    assert_eq!((first.workloads.len(), first.processes.len()), (2, 4));
    let second = step(&sample);
    let same = |a: &Snapshot, b: &Snapshot| {
        (
            a.workloads
                .iter()
                .zip(&b.workloads)
                .map(|(x, y)| Arc::ptr_eq(&x.row, &y.row))
                .collect::<Vec<_>>(),
            a.processes
                .iter()
                .zip(&b.processes)
                .map(|(x, y)| Arc::ptr_eq(x, y))
                .collect::<Vec<_>>(),
            a.gpus
                .iter()
                .zip(&b.gpus)
                .map(|(x, y)| Arc::ptr_eq(x, y))
                .collect::<Vec<_>>(),
            Arc::ptr_eq(&a.quotas, &b.quotas),
            Arc::ptr_eq(&a.counters.gpu_ioctls, &b.counters.gpu_ioctls),
        )
    };
    assert_eq!(
        same(&first, &second),
        (vec![true; 2], vec![true; 4], vec![true; 2], true, true),
        "nothing changed: every row shared"
    );

    // Process 3 (on GPU 1, the second workload's) uses more.
    sample.processes[2].used_bytes = Some(2 * GIB);
    let third = step(&sample);
    let changed = third
        .workloads
        .iter()
        .position(|w| w.pids.contains(&3))
        .unwrap();
    let mut want_workloads = vec![true; 2];
    want_workloads[changed] = false;
    assert_eq!(
        same(&second, &third),
        (
            want_workloads,
            vec![true, true, false, true],
            vec![true; 2],
            true,
            true
        )
    );
    assert_eq!(third.processes[2].used_bytes, Some(2 * GIB));
    assert_eq!(third.workloads[changed].used_bytes, 3 * GIB);
}

/// A workload's facts follow the meta its process carries and the names the agent found for
/// it, even under the same key: the row is shared while the meta and the names are the same,
/// and built again when another meta (here the same container under the systemd driver:
/// another cgroup path) takes its place or its names change.
#[test]
fn a_row_follows_its_workloads_meta_and_names_under_the_same_key() {
    let leaves = leaves();
    let (cgroupfs, systemd) = (&leaves[0], &leaves[5]);
    let mut table = Attribution::new(CgroupResolver::new("/nonexistent".into()));
    table.insert_for_test(task(1, cgroupfs, "python", 0));
    let a = Arc::new(WorkloadMeta::new(parse_cgroup_path(cgroupfs)));
    let b = Arc::new(WorkloadMeta::new(parse_cgroup_path(systemd)));
    assert_eq!(a.key(), b.key());
    let sample = GpuSample {
        taken_at: None,
        devices: Vec::new(),
        health: Vec::new(),
        processes: vec![ProcessSample {
            pid: 1,
            device_index: 0,
            device_uuid: "GPU-0".into(),
            used_bytes: Some(GIB),
            utilization: None,
        }],
        problems: Vec::new(),
    };
    let mut p = Publisher::default();
    let mut step = |meta: &Arc<WorkloadMeta>, names: &NameCache| {
        let procs = [AttributedProcess::new(
            ProcessIdentity {
                pid: 1,
                start_ticks: 1,
            },
            Arc::clone(meta),
            None,
        )];
        let s = build_with(
            &mut p,
            &sample,
            &table,
            &procs,
            &PolicyState::default(),
            names,
        );
        assert_eq!(s.workloads.len(), 1);
        Arc::clone(&s.workloads[0].row)
    };
    let mut names = NameCache::default();
    let first = step(&a, &names);
    assert_eq!(first.cgroup_path, *cgroupfs);
    let again = step(&a, &names);
    assert!(
        Arc::ptr_eq(&first, &again),
        "the same meta and names share the row"
    );
    let moved = step(&b, &names);
    assert_eq!(moved.cgroup_path, *systemd);
    let back = step(&a, &names);
    assert_eq!(back.cgroup_path, *cgroupfs);
    let named = |container: &str| WorkloadNames {
        container: Some(container.into()),
        ..WorkloadNames::default()
    };
    names.insert_for_test(&a.key(), named("trainer"));
    assert_eq!(step(&a, &names).container, "trainer");
    names.insert_for_test(&a.key(), named("renamed"));
    assert_eq!(step(&a, &names).container, "renamed");
}

/// A workload the policy holds without processes (an earlier run's freeze) has no meta: its
/// row's cgroup path is the policy's, compared at every step (a state naming another path for
/// the key gets a new row).
#[test]
fn a_row_without_processes_follows_the_policys_cgroup_path() {
    let table = Attribution::new(CgroupResolver::new("/nonexistent".into()));
    let sample = GpuSample {
        taken_at: None,
        devices: Vec::new(),
        health: Vec::new(),
        processes: Vec::new(),
        problems: Vec::new(),
    };
    let names = NameCache::default();
    let mut p = Publisher::default();
    let mut step = |path: &str| {
        let mut policy = PolicyState::default();
        policy.workloads.insert(
            "cgroup:///jobs/b".into(),
            WorkloadState {
                cgroup_path: path.into(),
                quota: String::new(),
                frozen: Some(GpuScope::All),
                scopes: BTreeMap::new(),
                killing: None,
                retry: None,
                observed: None,
                ours: true,
                suspended: None,
                suspend_failed: None,
                suspension: None,
                waiting_for_room: None,
            },
        );
        let s = build_with(&mut p, &sample, &table, &[], &policy, &names);
        assert_eq!(s.workloads.len(), 1);
        Arc::clone(&s.workloads[0].row)
    };
    let first = step("/jobs/b");
    assert_eq!(first.cgroup_path, "/jobs/b");
    assert!(Arc::ptr_eq(&first, &step("/jobs/b")));
    assert_eq!(step("/jobs/b-moved").cgroup_path, "/jobs/b-moved");
}

/// A process sample of `pid` on the GPU of UUID `gpu`, usage unknown.
fn proc(pid: u32, gpu: &str) -> ProcessSample {
    ProcessSample {
        pid,
        device_index: 0,
        device_uuid: gpu.into(),
        used_bytes: None,
        utilization: None,
    }
}

/// Processes ordered by workload key, then GPU UUID, then sample order, equal keys at other
/// addresses together (one rank), as sorting the strings would order them.
#[test]
fn processes_are_grouped_by_key_then_gpu_in_string_order() {
    let samples = [
        proc(1, "GPU-1"),
        proc(2, "GPU-0"),
        proc(3, "GPU-1"),
        proc(4, "GPU-1"),
        proc(5, "GPU-0"),
    ];
    let (b1, a, b2) = (String::from("b"), String::from("a"), String::from("b"));
    let keys = [
        b1.as_str(),
        a.as_str(),
        b2.as_str(),
        a.as_str(),
        b1.as_str(),
    ];
    let attributed: Vec<(&str, &ProcessSample)> = keys.into_iter().zip(&samples).collect();
    let sorted = super::publish::by_workload_and_gpu(&attributed);
    let got: Vec<(&str, &str, u32)> = sorted
        .iter()
        .map(|(_, k, p)| (*k, &*p.device_uuid, p.pid))
        .collect();
    assert_eq!(
        got,
        [
            ("a", "GPU-0", 2),
            ("a", "GPU-1", 4),
            ("b", "GPU-0", 5),
            ("b", "GPU-1", 1),
            ("b", "GPU-1", 3),
        ]
    );
    // One rank per (key, GPU): the two "b" on GPU-1 (other addresses) share theirs.
    let ranks: Vec<(u32, u32)> = sorted.iter().map(|(r, _, _)| *r).collect();
    assert_eq!(ranks, [(0, 0), (0, 1), (1, 0), (1, 1), (1, 1)]);
}

/// The order kept from the last step is reused only while every process has the same key (by
/// allocation) and GPU UUID at the same place, and is then the order worked out afresh: a key
/// of the same text in another allocation, a process on another GPU, one more process, each
/// work it out again.
#[test]
fn the_kept_order_is_reused_only_where_it_is_the_order_worked_out_afresh() {
    let (a, b, b2, c): (Arc<str>, Arc<str>, Arc<str>, Arc<str>) =
        ("a".into(), "b".into(), "b".into(), "c".into());
    let s1 = [proc(1, "GPU-1"), proc(2, "GPU-0"), proc(3, "GPU-1")];
    // The same processes on other GPUs (the UUIDs' ranks swap).
    let s2 = [proc(1, "GPU-0"), proc(2, "GPU-1"), proc(3, "GPU-1")];
    let s3 = [
        proc(1, "GPU-0"),
        proc(2, "GPU-1"),
        proc(3, "GPU-1"),
        proc(4, "GPU-0"),
    ];
    // Each step's attributed processes, and whether the last step's order is reused.
    type Step<'a> = (Vec<(&'a Arc<str>, &'a ProcessSample)>, bool);
    let steps: Vec<Step> = vec![
        (vec![(&b, &s1[0]), (&a, &s1[1]), (&b, &s1[2])], false),
        (vec![(&b, &s1[0]), (&a, &s1[1]), (&b, &s1[2])], true),
        // "b" in another allocation, before "a" would be: worked out again.
        (vec![(&b2, &s1[0]), (&a, &s1[1]), (&b, &s1[2])], false),
        (vec![(&b2, &s1[0]), (&a, &s1[1]), (&b, &s1[2])], true),
        (vec![(&b2, &s2[0]), (&a, &s2[1]), (&b, &s2[2])], false),
        (vec![(&c, &s2[0]), (&a, &s2[1]), (&b, &s2[2])], false),
        (
            vec![(&c, &s3[0]), (&a, &s3[1]), (&b, &s3[2]), (&a, &s3[3])],
            false,
        ),
        (
            vec![(&c, &s3[0]), (&a, &s3[1]), (&b, &s3[2]), (&a, &s3[3])],
            true,
        ),
        (vec![(&c, &s3[0]), (&a, &s3[1]), (&b, &s3[2])], false),
    ];
    let mut order = super::publish::Order::default();
    for (i, (attributed, reused)) in steps.iter().enumerate() {
        assert_eq!(order.holds(attributed), *reused, "step {i}");
        let text: Vec<(&str, &ProcessSample)> =
            attributed.iter().map(|(k, p)| (&***k, *p)).collect();
        let fresh: Vec<((u32, u32), &str, u32)> = super::publish::by_workload_and_gpu(&text)
            .into_iter()
            .map(|(r, k, p)| (r, k, p.pid))
            .collect();
        let kept: Vec<((u32, u32), &str, u32)> = order
            .of(attributed)
            .into_iter()
            .map(|(r, k, p)| (r, k, p.pid))
            .collect();
        assert_eq!(kept, fresh, "step {i}");
    }
}
