//! Driver limits as the policy decides them ([`Decision::driver_limits`], [`wanted_limits`]).

use super::*;

/// A per-GPU and an all-GPU quota on one container, 64 MiB tolerance each.
fn two_limits(c: char, all_gpus: &str) -> String {
    format!(
        "[[quota]]\ncontainer = \"{0}\"\ngpu = 0\ngpu_memory = \"2GiB\"\ntolerance = \"64MiB\"\n\n\
         [[quota]]\ncontainer = \"{0}\"\ngpu_memory = \"{all_gpus}\"\ntolerance = \"64MiB\"\n",
        id(c)
    )
}

fn wanted(sim: &Sim) -> Option<WantedLimits> {
    let d = sim.last.as_ref().unwrap();
    d.driver_limits
        .as_ref()
        .map(|per| wanted_limits(per, &sim.state))
}

#[test]
fn each_gpu_its_processes_use_gets_the_lowest_limit_with_its_tolerance() {
    let a = docker('a');
    let mut sim = Sim::new(&two_limits('a', "3GiB"), vec![attributed(10, &a)]);
    sim.at(0, &[(10, 0, Some(GIB)), (10, 1, Some(GIB))]);
    let path = sim.state.workloads[&key('a')].cgroup_path.clone();
    let want: WantedLimits = [
        ((0, path.clone()), (2 * GIB, 2 * GIB + 64 * MIB)),
        ((1, path), (3 * GIB, 3 * GIB + 64 * MIB)),
    ]
    .into();
    assert_eq!(wanted(&sim), Some(want));
}

#[test]
fn a_limit_is_capped_at_the_gpus_memory_and_only_on_gpus_in_use() {
    let a = docker('a');
    let mut sim = Sim::new(&two_limits('a', "100GiB"), vec![attributed(10, &a)]);
    sim.at(0, &[(10, 1, Some(GIB))]);
    let path = sim.state.workloads[&key('a')].cgroup_path.clone();
    let want: WantedLimits = [
        ((0, path.clone()), (2 * GIB, 2 * GIB + 64 * MIB)),
        ((1, path), (TOTAL, TOTAL)),
    ]
    .into();
    assert_eq!(wanted(&sim), Some(want));
}

#[test]
fn a_dry_run_or_observe_only_wants_no_driver_limit_at_all() {
    let a = docker('a');
    for (dry_run, observe_only) in [(true, false), (false, true)] {
        let mut sim = Sim::new(&two_limits('a', "3GiB"), vec![attributed(10, &a)]);
        sim.dry_run = dry_run;
        sim.observe_only = observe_only;
        sim.at(0, &[(10, 0, Some(GIB))]);
        assert_eq!(sim.last.as_ref().unwrap().driver_limits, None);
    }
}

#[test]
fn workloads_without_a_quota_or_not_carried_want_none() {
    let a = docker('a');
    let b = docker('b');
    let mut sim = Sim::new(
        &two_limits('a', "3GiB"),
        vec![attributed(10, &a), attributed(20, &b)],
    );
    sim.at(0, &[(20, 0, Some(GIB))]);
    let d = sim.last.as_ref().unwrap().driver_limits.clone().unwrap();
    assert!(!d.contains_key(&key('b')));
    // A workload the folded state no longer carries is left out.
    let per: BTreeMap<String, DriverLimits> = [(key('b'), [(0, (1, 2))].into())].into();
    assert!(wanted_limits(&per, &sim.state).is_empty());
}
