//! Elastic pressure GPU by GPU: which GPU's shortfall a borrower answers for, and how the room
//! a suspended borrower needs is counted when several wait (stage 3, `pressure.rs`); and a
//! quota's GPU named by UUID that this node does not have (stage 2, `plan.rs`).

use super::*;

const ELASTIC_FREEZE: &str = "mode = \"elastic\"\nelastic_reserve = \"4GiB\"\ngrace = \"0s\"\nladder = [{ action = \"freeze\" }]";
const ELASTIC_SUSPEND: &str = "mode = \"elastic\"\nelastic_reserve = \"4GiB\"\ngrace = \"0s\"\nladder = [{ action = \"suspend\" }]";

/// `defaults`, then a 2 GiB quota for container a with `extra` lines.
fn quota_a(defaults: &str, extra: &str) -> String {
    format!("[defaults]\n{defaults}\n{}", quota_for('a', extra))
}

#[test]
fn a_per_gpu_borrower_answers_only_for_the_pressure_on_its_own_gpu() {
    // a borrows 3 GiB on GPU 1 under a GPU 1 quota.
    let over_on_1 = [(10, 1, Some(5 * GIB))];
    let mut sim = Sim::a(&quota_a(ELASTIC_FREEZE, "gpu = 1"));
    sim.gpus[0].1 = 0;
    assert!(
        sim.run(0, 2, &over_on_1).is_empty(),
        "GPU 0 is full, but a borrows nothing there"
    );
    sim.gpus[0].1 = 40 * GIB;
    sim.gpus[1].1 = GIB;
    let actions = sim.at(3000, &over_on_1);
    assert_eq!(by_workload(&actions), vec![(key('a'), ActionKind::Freeze)]);
    assert_eq!(actions[0].gpu, GpuScope::Gpu(1));
}

#[test]
fn an_all_gpu_borrower_answers_only_for_the_pressure_on_gpus_it_uses() {
    // a borrows 3 GiB over its all-GPU quota, all of it on GPU 1.
    let over_on_1 = [(10, 1, Some(5 * GIB))];
    let mut sim = Sim::a(&quota_a(ELASTIC_FREEZE, ""));
    sim.gpus[0].1 = 0;
    assert!(
        sim.run(0, 2, &over_on_1).is_empty(),
        "GPU 0 is full, but a uses nothing there"
    );
    sim.gpus[0].1 = 40 * GIB;
    sim.gpus[1].1 = GIB;
    assert_eq!(
        by_workload(&sim.at(3000, &over_on_1)),
        vec![(key('a'), ActionKind::Freeze)]
    );
}

/// a suspended with its footprint on `gpu` only, over its quota there.
fn suspended_on(gpu: u32, extra: &str) -> Sim {
    let mut sim = Sim::a(&quota_a(ELASTIC_SUSPEND, extra));
    sim.gpus[gpu as usize].1 = GIB;
    let s = sim.at(0, &[(10, gpu, Some(5 * GIB))]);
    assert_eq!(kinds(&s), vec![ActionKind::Suspend]);
    assert_eq!(s[0].footprint, BTreeMap::from([(gpu, 5 * GIB)]));
    sim
}

#[test]
fn a_suspended_per_gpu_borrower_waits_for_room_on_its_own_gpu_only() {
    let mut sim = suspended_on(1, "gpu = 1");
    // GPU 0 is full, GPU 1 has room for its 5 GiB and the reserve.
    sim.gpus[0].1 = 0;
    sim.gpus[1].1 = 20 * GIB;
    assert_eq!(kinds(&sim.at(1000, &[])), vec![ActionKind::Resume]);
}

#[test]
fn a_suspended_all_gpu_borrower_waits_for_room_on_the_gpus_it_used_only() {
    let mut sim = suspended_on(1, "");
    sim.gpus[0].1 = 0;
    sim.gpus[1].1 = 20 * GIB;
    assert_eq!(kinds(&sim.at(1000, &[])), vec![ActionKind::Resume]);
}

/// a (3 GiB) and b (5 GiB) suspended by an earlier run on GPU 0, elastic, 4 GiB reserve.
fn a_and_b_suspended() -> Sim {
    let mut sim = Sim::ab(&format!(
        "[defaults]\n{ELASTIC_SUSPEND}\n{}{}",
        quota_for('a', ""),
        quota_for('b', "")
    ));
    for (k, bytes) in [('a', 3 * GIB), ('b', 5 * GIB)] {
        suspended_by_an_earlier_run(&mut sim, k, bytes);
    }
    sim
}

#[test]
fn suspended_borrowers_come_back_smallest_first_each_taking_its_room() {
    // 10 GiB free: a (3 + 4 reserve) fits, leaving 7; b needs 5 + 4.
    let mut sim = a_and_b_suspended();
    sim.gpus[0].1 = 10 * GIB;
    assert_eq!(
        by_workload(&sim.at(1000, &[])),
        vec![(key('a'), ActionKind::Resume)]
    );
    assert_eq!(reported(&sim, 'b'), "suspended");
    // 20 GiB free: room for both and the reserve.
    let mut sim = a_and_b_suspended();
    sim.gpus[0].1 = 20 * GIB;
    assert_eq!(
        by_workload(&sim.at(1000, &[])),
        vec![
            (key('a'), ActionKind::Resume),
            (key('b'), ActionKind::Resume)
        ]
    );
}

/// A quota on GPU-00000001 for container a, 1 GiB, no grace (alert).
fn by_uuid() -> Sim {
    Sim::a(&format!(
        "[[quota]]\ncontainer = \"{}\"\ngpu = \"GPU-00000001\"\ngpu_memory = \"1GiB\"\ngrace = \"0s\"\n",
        id('a')
    ))
}

#[test]
fn a_uuid_this_healthy_node_lacks_is_no_quota_here_not_a_reason_to_fail_open() {
    let mut sim = by_uuid();
    sim.gpus = vec![(0, 40 * GIB, true)];
    assert!(sim.at(0, &[(10, 0, Some(9 * GIB))]).is_empty());
    assert_eq!(sim.stats().fail_open, 0);
}

#[test]
fn a_uuid_found_is_enforced_though_another_gpu_is_degraded() {
    let mut sim = by_uuid();
    sim.gpus.push((2, 40 * GIB, false));
    let actions = sim.at(0, &[(10, 1, Some(2 * GIB))]);
    assert_eq!(kinds(&actions), vec![ActionKind::Alert]);
    assert_eq!(actions[0].gpu, GpuScope::Gpu(1));
}
