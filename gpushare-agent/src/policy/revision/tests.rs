//! A revision changes exactly when something the policy reads of its workload changes.

use std::sync::Arc;

use super::*;
use crate::{
    attribution::{ProcessIdentity, parse_cgroup_path},
    quota::{EnvQuota, Sources, WorkloadMeta},
    sample::{DeviceSample, ProcessSample, Utilization},
};

const GIB: u64 = 1 << 30;

fn process(pid: u32, path: &str) -> AttributedProcess {
    AttributedProcess::new(
        ProcessIdentity {
            pid,
            start_ticks: u64::from(pid),
        },
        WorkloadMeta::new(parse_cgroup_path(path)),
        None,
    )
}

/// Two workloads of two processes each, and a process sample per pid (and one no process has).
fn step() -> (Vec<AttributedProcess>, GpuSample) {
    let procs = vec![
        process(10, "/docker/a"),
        process(11, "/docker/a"),
        process(20, "/docker/b"),
        process(21, "/docker/b"),
    ];
    let rec = |pid: u32| ProcessSample {
        pid,
        device_index: 0,
        device_uuid: "GPU-0".into(),
        used_bytes: Some(GIB),
        utilization: None,
    };
    let sample = GpuSample {
        taken_at: None,
        devices: vec![DeviceSample {
            index: 0,
            uuid: "GPU-0".into(),
            ..Default::default()
        }],
        health: Vec::new(),
        processes: vec![rec(10), rec(11), rec(20), rec(21), rec(99)],
        problems: Vec::new(),
    };
    (procs, sample)
}

fn changed(
    change: impl FnOnce(&mut Vec<AttributedProcess>, &mut GpuSample),
) -> Option<BTreeSet<String>> {
    let (procs, sample) = step();
    let last = Revision::of(&procs, &sample);
    let (mut procs, mut sample) = step();
    change(&mut procs, &mut sample);
    Revision::of(&procs, &sample).changed(&last)
}

fn only(keys: &[&str]) -> Option<BTreeSet<String>> {
    Some(keys.iter().map(|k| k.to_string()).collect())
}

#[test]
fn a_step_with_the_same_inputs_in_new_allocations_changes_no_revision() {
    assert_eq!(changed(|_, _| {}), only(&[]));
    // What the policy does not read: utilization, the GPUs (compared on their own).
    assert_eq!(
        changed(|_, s| {
            s.processes[0].utilization = Some(Utilization { sm: 50, memory: 5 });
            s.devices[0].memory_used += 1;
            s.taken_at = Some(std::time::Instant::now());
        }),
        only(&[])
    );
}

#[test]
fn a_change_to_what_the_policy_reads_of_a_workload_changes_its_revision_only() {
    let a = || only(&["cgroup:///docker/a"]);
    assert_eq!(
        changed(|_, s| s.processes[0].used_bytes = Some(2 * GIB)),
        a()
    );
    assert_eq!(changed(|_, s| s.processes[1].used_bytes = None), a());
    assert_eq!(changed(|_, s| s.processes[0].device_index = 1), a());
    assert_eq!(
        changed(|_, s| s.processes[0].device_uuid = "GPU-1".into()),
        a()
    );
    assert_eq!(
        changed(|p, _| p[0].identity.start_ticks += 1),
        a(),
        "another process at the same pid"
    );
    assert_eq!(
        changed(|p, _| p[0].env_quota = Some(EnvQuota {
            sources: Sources::default(),
            per_gpu: Vec::new(),
            each_gpu: Some(GIB),
        })),
        a(),
        "its environment quota"
    );
    assert_eq!(
        changed(|p, _| {
            let mut meta = WorkloadMeta::clone(&p[0].workload);
            meta.pod_name = Some("trainer".into());
            p[0] = AttributedProcess::new(p[0].identity, Arc::new(meta), None);
        }),
        a(),
        "its names"
    );
    // Two processes of a trading places: the policy's partial step reads them by place.
    assert_eq!(changed(|_, s| s.processes.swap(0, 1)), a());
}

#[test]
fn a_process_that_moves_changes_both_workloads_and_the_unattributed_samples_change_all() {
    let ab = || only(&["cgroup:///docker/a", "cgroup:///docker/b"]);
    assert_eq!(changed(|p, _| p[1] = process(11, "/docker/b")), ab());
    assert_eq!(
        changed(|p, _| p.push(process(12, "/docker/c"))),
        only(&["cgroup:///docker/c"]),
        "a workload that came"
    );
    let (procs, sample) = step();
    let (mut more, _) = step();
    more.push(process(12, "/docker/c"));
    assert_eq!(
        Revision::of(&procs, &sample).changed(&Revision::of(&more, &sample)),
        only(&["cgroup:///docker/c"]),
        "a workload that went"
    );
    assert_eq!(
        changed(|p, _| p.truncate(2)),
        None,
        "its processes gone, their samples are no process's"
    );
    // A sample pid 10 and pid 20 now share: both workloads read it.
    assert_eq!(changed(|_, s| s.processes[4].pid = 10), None);
    assert_eq!(changed(|_, s| s.processes[2].pid = 10), ab());
    assert_eq!(changed(|_, s| s.processes[4].used_bytes = None), None);
}
