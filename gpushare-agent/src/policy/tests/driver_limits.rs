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
    let mut sim = Sim::a(&two_limits('a', "3GiB"));
    sim.at(0, &[(10, 0, Some(GIB)), (10, 1, Some(GIB))]);
    let path = sim.state.workloads[&key('a')].cgroup_path.clone();
    let want: WantedLimits = [
        ((0, path.clone()), (0, 2 * GIB + 64 * MIB)),
        ((1, path), (0, 3 * GIB + 64 * MIB)),
    ]
    .into();
    assert_eq!(wanted(&sim), Some(want));
}

#[test]
fn a_limit_includes_the_drivers_context_on_its_gpu() {
    let mut sim = Sim::a(&two_limits('a', "3GiB"));
    sim.overhead = [300 * MIB; 2];
    sim.at(0, &[(10, 0, Some(GIB)), (10, 1, Some(GIB))]);
    let path = sim.state.workloads[&key('a')].cgroup_path.clone();
    let want: WantedLimits = [
        ((0, path.clone()), (0, 2 * GIB + 64 * MIB + 300 * MIB)),
        ((1, path), (0, 3 * GIB + 64 * MIB + 300 * MIB)),
    ]
    .into();
    assert_eq!(wanted(&sim), Some(want));
}

#[test]
fn a_limit_is_capped_at_the_gpus_memory_and_only_on_gpus_in_use() {
    let mut sim = Sim::a(&two_limits('a', "100GiB"));
    sim.at(0, &[(10, 1, Some(GIB))]);
    let path = sim.state.workloads[&key('a')].cgroup_path.clone();
    let want: WantedLimits = [
        ((0, path.clone()), (0, 2 * GIB + 64 * MIB)),
        ((1, path), (0, TOTAL)),
    ]
    .into();
    assert_eq!(wanted(&sim), Some(want));
}

#[test]
fn a_dry_run_or_observe_only_wants_no_driver_limit_at_all() {
    for (dry_run, observe_only) in [(true, false), (false, true)] {
        let mut sim = Sim::a(&two_limits('a', "3GiB"));
        sim.dry_run = dry_run;
        sim.observe_only = observe_only;
        sim.at(0, &[(10, 0, Some(GIB))]);
        assert_eq!(sim.last.as_ref().unwrap().driver_limits, None);
    }
}

#[test]
fn workloads_without_a_quota_or_not_carried_want_none() {
    let mut sim = Sim::ab(&two_limits('a', "3GiB"));
    sim.at(0, &[(20, 0, Some(GIB))]);
    let d = sim.last.as_ref().unwrap().driver_limits.clone().unwrap();
    assert!(!d.contains_key(&key('b')));
    // A workload the folded state no longer carries is left out.
    let per: BTreeMap<String, DriverLimits> = [(key('b'), [(0, (1, 2))].into())].into();
    assert!(wanted_limits(&per, &sim.state).is_empty());
}

/// One evaluation from nothing, over GPUs 0 and 1 with these memory totals.
fn decide_with_totals(
    toml: &str,
    procs: &[AttributedProcess],
    usage: &[(u32, u32, Option<u64>)],
    totals: [u64; 2],
) -> Decision {
    let quotas = QuotaSet::parse(toml, "q.toml").unwrap();
    let mut s = sample(&[(0, 40 * GIB, true), (1, 40 * GIB, true)], usage);
    for (d, total) in s.devices.iter_mut().zip(totals) {
        d.memory_total = total;
    }
    evaluate(
        &PolicyState::default(),
        &PolicyInput {
            now: Duration::ZERO,
            sample: &s,
            processes: procs,
            quotas: &quotas,
            releases: &[],
            agent_pid: None,
            dry_run: false,
            observe_only: false,
            taken: &crate::policy::NONE_TAKEN,
            observed: &BTreeMap::new(),
        },
    )
}

#[test]
fn a_gpu_named_by_uuid_is_limited_there_capped_at_its_own_memory() {
    let a = docker('a');
    let toml = format!(
        "[[quota]]\ncontainer = \"{}\"\ngpu = \"GPU-00000001\"\ngpu_memory = \"60GiB\"\n\
         tolerance = \"64MiB\"\n",
        id('a')
    );
    let d = decide_with_totals(
        &toml,
        &[attributed(10, &a)],
        &[(10, 0, Some(GIB))],
        [80 * GIB, 50 * GIB],
    );
    let per = d.driver_limits.as_ref().unwrap();
    let path = d.state.workloads[&key('a')].cgroup_path.clone();
    let want: WantedLimits = [((1, path), (0, 50 * GIB))].into();
    assert_eq!(wanted_limits(per, &d.state), want);
}

#[test]
fn a_pid_listed_for_two_workloads_places_limits_for_the_last_one_only() {
    // Pid 10 was a's, and is now b's (the input lists the older process first): the GPU it is
    // sampled on counts for b's limits, not a's.
    let toml = format!("{}{}", quota_for('a', ""), quota_for('b', ""));
    let procs = vec![attributed(10, &docker('a')), attributed(10, &docker('b'))];
    let mut sim = Sim::new(&toml, procs);
    sim.at(0, &[(10, 1, Some(GIB))]);
    let d = sim.last.as_ref().unwrap().driver_limits.clone().unwrap();
    let gpus = |c: char| {
        d.get(&key(c))
            .map(|l| l.keys().copied().collect::<Vec<u32>>())
    };
    assert_eq!(gpus('b'), Some(vec![1]), "{d:?}");
    assert!(gpus('a').is_none_or(|g| g.is_empty()), "{d:?}");
}
