//! Unit tests of what decides whether a step is carried.

use std::time::Duration;

use super::*;
use crate::{
    attribution::{ProcessIdentity, parse_cgroup_path},
    policy::{GpuScope, GroupState, Killing, Retry, ScopeState, Status, Suspension},
    quota::{Mode, Signal, WorkloadMeta},
    sample::{DeviceHealth, Utilization},
};

const GIB: u64 = 1 << 30;

/// A named change to a value.
type Change<T> = (&'static str, fn(&mut T));

/// The whole samples are equal in what the policy reads.
fn same_sample(a: &GpuSample, b: &GpuSample) -> bool {
    same_gpus(a, b, true)
        && a.processes.len() == b.processes.len()
        && a.processes
            .iter()
            .zip(&b.processes)
            .all(|(x, y)| same_process(x, y))
}

fn sample() -> GpuSample {
    GpuSample {
        taken_at: None,
        devices: vec![DeviceSample {
            index: 0,
            uuid: "GPU-0".into(),
            name: "Fake".into(),
            memory_total: 80 * GIB,
            memory_used: 2 * GIB,
            memory_free: 78 * GIB,
            memory_reserved: GIB / 2,
            ..Default::default()
        }],
        health: vec![(0, DeviceHealth::Ok)],
        processes: vec![ProcessSample {
            pid: 10,
            device_index: 0,
            device_uuid: "GPU-0".into(),
            used_bytes: Some(GIB),
            utilization: None,
        }],
        problems: Vec::new(),
    }
}

#[test]
fn every_field_the_policy_reads_tells_samples_apart() {
    let base = sample();
    assert!(same_sample(&base, &base.clone()));
    let changes: Vec<Change<GpuSample>> = vec![
        ("index", |s| s.devices[0].index = 1),
        ("uuid", |s| s.devices[0].uuid = "GPU-1".into()),
        ("name", |s| s.devices[0].name = "Other".into()),
        ("memory_total", |s| s.devices[0].memory_total += 1),
        ("memory_used", |s| s.devices[0].memory_used += 1),
        ("memory_free", |s| s.devices[0].memory_free -= 1),
        ("memory_reserved", |s| s.devices[0].memory_reserved += 1),
        ("a device more", |s| s.devices.push(s.devices[0].clone())),
        ("health", |s| {
            s.health[0].1 = DeviceHealth::Degraded {
                reason: "lost".into(),
            }
        }),
        ("problems", |s| s.problems.push("nvml".into())),
        ("pid", |s| s.processes[0].pid = 11),
        ("device_index", |s| s.processes[0].device_index = 1),
        ("device_uuid", |s| {
            s.processes[0].device_uuid = "GPU-1".into()
        }),
        ("used_bytes", |s| s.processes[0].used_bytes = None),
        ("a process more", |s| {
            s.processes.push(s.processes[0].clone())
        }),
    ];
    for (what, change) in changes {
        let mut other = base.clone();
        change(&mut other);
        assert!(!same_sample(&base, &other), "{what}: told apart");
        assert!(!same_sample(&other, &base), "{what}: told apart both ways");
    }
    // What only reports read.
    let mut other = base.clone();
    other.devices[0].utilization = Some(Utilization { sm: 50, memory: 5 });
    other.devices[0].temperature_c = Some(70);
    other.devices[0].power_mw = Some(100_000);
    other.devices[0].sm_clock_mhz = Some(1_400);
    other.processes[0].utilization = Some(Utilization { sm: 50, memory: 5 });
    other.taken_at = Some(std::time::Instant::now());
    assert!(same_sample(&base, &other));
}

fn calm_workload() -> WorkloadState {
    WorkloadState {
        cgroup_path: "/docker/a".into(),
        quota: "q.toml:1".into(),
        frozen: None,
        scopes: [(
            GpuScope::Gpu(0),
            ScopeState {
                status: Status::Ok,
                over_since: None,
                steps_taken: 0,
                usage: Some(GIB),
                limit: 2 * GIB,
                mode: Mode::Strict,
                without_suspend: Status::Ok,
                compliant_since: None,
            },
        )]
        .into(),
        killing: None,
        retry: None,
        observed: Some(GroupState::Thawed),
        ours: false,
        suspended: None,
        suspend_failed: Some("no driver".into()),
        suspension: None,
        waiting_for_room: None,
    }
}

#[test]
fn only_a_state_without_a_clock_is_calm() {
    let state = |w: WorkloadState| PolicyState {
        workloads: [("docker://a".to_string(), w)].into(),
    };
    assert!(calm(state(calm_workload()).workloads.values()));
    assert!(calm(PolicyState::default().workloads.values()));
    let changes: Vec<Change<WorkloadState>> = vec![
        ("frozen", |w| w.frozen = Some(GpuScope::All)),
        ("killing", |w| {
            w.killing = Some(Killing {
                scope: GpuScope::All,
                since: Duration::ZERO,
                signal: Signal::KILL,
                sigkill_at: None,
            })
        }),
        ("retry", |w| {
            w.retry = Some(Retry {
                transition: crate::policy::ActionKind::Thaw,
                attempts: 1,
                next_at: Duration::from_secs(1),
            })
        }),
        ("ours", |w| w.ours = true),
        ("suspended", |w| w.suspended = Some(GpuScope::Gpu(0))),
        ("suspension", |w| {
            w.suspension = Some(Suspension::Suspended {
                per_gpu: [(0, GIB)].into(),
            })
        }),
        ("waiting_for_room", |w| {
            w.waiting_for_room = Some("GPU 0 is full".into())
        }),
        ("over_since", |w| {
            w.scopes.get_mut(&GpuScope::Gpu(0)).unwrap().over_since = Some(Duration::ZERO)
        }),
    ];
    for (what, change) in changes {
        let mut w = calm_workload();
        change(&mut w);
        assert!(
            !calm(state(w).workloads.values()),
            "{what}: the clock matters"
        );
    }
}

#[test]
fn every_input_the_policy_reads_decides_whether_a_step_is_carried() {
    let w = WorkloadMeta::new(parse_cgroup_path("/docker/a"));
    let procs = vec![AttributedProcess::new(
        ProcessIdentity {
            pid: 10,
            start_ticks: 1,
        },
        w,
        None,
    )];
    let quotas = QuotaSet::parse(
        "[[quota]]\ncgroup = \"/docker/*\"\ngpu_memory = \"2GiB\"\n",
        "q.toml",
    )
    .unwrap();
    let s = sample();
    let observed = BTreeMap::new();
    let input = PolicyInput {
        now: Duration::from_secs(5),
        sample: &s,
        processes: &procs,
        quotas: &quotas,
        releases: &[],
        agent_pid: Some(1),
        dry_run: false,
        observe_only: false,
        taken: &crate::policy::NONE_TAKEN,
        observed: &observed,
    };
    let mut inc = Incremental::default();
    let d = inc.evaluate(PolicyState::default(), &input);
    let d = inc.evaluate(d.state, &input);
    assert_eq!((inc.evaluated, inc.carried), (2, 0));
    let state = inc.evaluate(d.state, &input).state;
    assert_eq!((inc.evaluated, inc.carried), (2, 1));
    let c = inc.last.as_ref().unwrap();
    let same =
        |state: &PolicyState, input: &PolicyInput| matches!(c.delta(state, input), Delta::Same);
    assert!(same(
        &state,
        &PolicyInput {
            now: Duration::from_secs(500),
            ..input
        }
    ));
    let other_s = {
        let mut o = sample();
        o.processes[0].used_bytes = Some(GIB + 1);
        o
    };
    let other_procs = vec![AttributedProcess::new(
        ProcessIdentity {
            pid: 10,
            start_ticks: 2,
        },
        WorkloadMeta::new(parse_cgroup_path("/docker/a")),
        None,
    )];
    let other_quotas = QuotaSet::parse(
        "[[quota]]\ncgroup = \"/docker/*\"\ngpu_memory = \"3GiB\"\n",
        "q.toml",
    )
    .unwrap();
    let other_observed: BTreeMap<String, ObservedGroup> = [(
        "docker://a".to_string(),
        ObservedGroup {
            state: GroupState::Thawed,
            ours: false,
            frozen_by: None,
            cgroup_path: "/docker/a".into(),
            suspension: None,
        },
    )]
    .into();
    let released = ["docker://x".to_string()];
    let differing: Vec<(&str, PolicyInput)> = vec![
        (
            "sample",
            PolicyInput {
                sample: &other_s,
                ..input
            },
        ),
        (
            "processes",
            PolicyInput {
                processes: &other_procs,
                ..input
            },
        ),
        (
            "quotas",
            PolicyInput {
                quotas: &other_quotas,
                ..input
            },
        ),
        (
            "observed",
            PolicyInput {
                observed: &other_observed,
                ..input
            },
        ),
        (
            "releases",
            PolicyInput {
                releases: &released,
                ..input
            },
        ),
        (
            "agent_pid",
            PolicyInput {
                agent_pid: Some(2),
                ..input
            },
        ),
        (
            "dry_run",
            PolicyInput {
                dry_run: true,
                ..input
            },
        ),
        (
            "observe_only",
            PolicyInput {
                observe_only: true,
                ..input
            },
        ),
    ];
    for (what, i) in differing {
        assert!(!same(&state, &i), "{what}: evaluated again");
    }
    let mut changed = state.clone();
    changed
        .workloads
        .values_mut()
        .for_each(|w| w.quota = "moved".into());
    assert!(
        matches!(c.delta(&changed, &input), Delta::All),
        "another state: evaluated again"
    );
}
