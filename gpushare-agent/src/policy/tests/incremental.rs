//! The policy's outcome carried across steps ([`Incremental`]) is the outcome of evaluating from
//! scratch, step after step.

use super::*;

/// Evaluates `input` from both paths' own states; asserts equal decisions and moves each on.
fn both(
    plain: &mut PolicyState,
    inc: &mut Incremental,
    inc_state: &mut PolicyState,
    input: &PolicyInput,
) -> Decision {
    let a = evaluate(plain, input);
    let b = inc.evaluate(std::mem::take(inc_state), input);
    assert_eq!(
        a, b,
        "incremental and from-scratch decisions differ at {:?}",
        input.now
    );
    *plain = a.state.clone();
    *inc_state = b.state;
    a
}

struct Steady {
    quotas: QuotaSet,
    procs: Vec<AttributedProcess>,
    kernel: BTreeMap<String, ObservedGroup>,
    plain: PolicyState,
    inc: Incremental,
    inc_state: PolicyState,
}

impl Steady {
    fn new(toml: &str) -> Self {
        Self {
            quotas: QuotaSet::parse(toml, "q.toml").unwrap(),
            procs: vec![attributed(10, &docker('a')), attributed(20, &docker('b'))],
            kernel: BTreeMap::new(),
            plain: PolicyState::default(),
            inc: Incremental::default(),
            inc_state: PolicyState::default(),
        }
    }

    fn at(&mut self, ms: u64, s: &GpuSample) -> Vec<ActionKind> {
        let d = both(
            &mut self.plain,
            &mut self.inc,
            &mut self.inc_state,
            &PolicyInput {
                now: Duration::from_millis(ms),
                sample: s,
                processes: &self.procs,
                quotas: &self.quotas,
                releases: &[],
                agent_pid: None,
                dry_run: false,
                observe_only: false,
                taken: &crate::policy::NONE_TAKEN,
                observed: &self.kernel,
            },
        );
        apply_to_kernel(&mut self.kernel, &d.actions);
        d.actions.iter().map(|a| a.kind).collect()
    }
}

const TWO_GIB: &str = "[[quota]]\ncgroup = \"/docker/*\"\ngpu_memory = \"2GiB\"\n";

#[test]
fn a_calm_step_is_carried_and_a_changed_one_evaluated() {
    let mut s = Steady::new(TWO_GIB);
    let counts = |s: &Steady| (s.inc.evaluated, s.inc.partial, s.inc.carried);
    let under = sample(
        &[(0, 40 * GIB, true)],
        &[(10, 0, Some(GIB)), (20, 0, Some(GIB))],
    );
    assert!(s.at(0, &under).is_empty());
    assert!(s.at(1_000, &under).is_empty());
    assert_eq!(counts(&s), (2, 0, 0), "the first step changed both states");
    for t in 2..10 {
        assert!(s.at(t * 1_000, &under).is_empty());
    }
    assert_eq!(counts(&s), (2, 0, 8));
    // What the policy does not read (utilization) changes nothing.
    let mut busy = under.clone();
    busy.processes[0].utilization = Some(crate::sample::Utilization { sm: 90, memory: 5 });
    busy.devices[0].temperature_c = Some(80);
    s.at(10_000, &busy);
    assert_eq!(counts(&s), (2, 0, 9));
    // Usage it reads does: only the workload whose usage changed is evaluated, and at the next
    // step again (its state changed), then carried.
    let more = sample(
        &[(0, 40 * GIB, true)],
        &[(10, 0, Some(GIB + MIB)), (20, 0, Some(GIB))],
    );
    s.at(11_000, &more);
    assert_eq!(counts(&s), (2, 1, 9));
    s.at(12_000, &more);
    assert_eq!(counts(&s), (2, 2, 9));
    s.at(13_000, &more);
    assert_eq!(counts(&s), (2, 2, 10));
    // A GPU's free memory changes nothing where no liability is over (only elastic pressure
    // and a resume read it).
    let fuller = sample(
        &[(0, 10 * GIB, true)],
        &[(10, 0, Some(GIB + MIB)), (20, 0, Some(GIB))],
    );
    s.at(14_000, &fuller);
    assert_eq!(counts(&s), (2, 2, 11));
    // Both workloads' usage: evaluated in full.
    let both_more = sample(
        &[(0, 10 * GIB, true)],
        &[(10, 0, Some(GIB)), (20, 0, Some(GIB + MIB))],
    );
    s.at(15_000, &both_more);
    assert_eq!(counts(&s), (3, 2, 11));
}

#[test]
fn a_gpus_free_memory_is_read_where_an_elastic_liability_is_over() {
    let toml = "[[quota]]\ncgroup = \"/docker/*\"\ngpu_memory = \"2GiB\"\nmode = \"elastic\"\n";
    let mut s = Steady::new(toml);
    let counts = |s: &Steady| (s.inc.evaluated, s.inc.partial, s.inc.carried);
    let over = |free| {
        sample(
            &[(0, free, true)],
            &[(10, 0, Some(3 * GIB)), (20, 0, Some(GIB))],
        )
    };
    assert!(
        s.at(0, &over(40 * GIB)).is_empty(),
        "elastic, room to spare"
    );
    s.at(1_000, &over(40 * GIB));
    s.at(2_000, &over(40 * GIB));
    assert_eq!(counts(&s), (2, 0, 1));
    // The other workload's usage changes: an over liability couples the workloads.
    let other = sample(
        &[(0, 40 * GIB, true)],
        &[(10, 0, Some(3 * GIB)), (20, 0, Some(GIB + MIB))],
    );
    s.at(3_000, &other);
    assert_eq!(counts(&s), (3, 0, 1));
    // Then the free memory: evaluated in full, and pressure makes the borrower liable.
    let full = sample(
        &[(0, GIB / 2, true)],
        &[(10, 0, Some(3 * GIB)), (20, 0, Some(GIB + MIB))],
    );
    s.at(5_000, &full);
    assert!(
        s.plain
            .workloads
            .values()
            .any(|w| w.scopes.values().any(|x| x.over_since.is_some())),
        "pressure: the borrower is liable"
    );
    assert_eq!(counts(&s), (4, 0, 1));
}

#[test]
fn a_workload_going_over_alone_climbs_its_ladder_on_time() {
    let toml = format!("{TWO_GIB}grace = \"3s\"\nladder = [{{ action = \"freeze\" }}]\n");
    let mut s = Steady::new(&toml);
    let under = sample(
        &[(0, 40 * GIB, true)],
        &[(10, 0, Some(GIB)), (20, 0, Some(GIB))],
    );
    for t in 0..3 {
        assert!(s.at(t * 1_000, &under).is_empty());
    }
    let over = sample(
        &[(0, 40 * GIB, true)],
        &[(10, 0, Some(3 * GIB)), (20, 0, Some(GIB))],
    );
    let mut seen = Vec::new();
    for t in 3..9 {
        seen.push((t, s.at(t * 1_000, &over)));
    }
    assert_eq!(s.inc.partial, 1, "going over: that workload alone");
    assert!(
        seen.iter()
            .any(|(t, a)| *t == 6 && a == &vec![ActionKind::Freeze]),
        "frozen when its grace ran out: {seen:?}"
    );
}

#[test]
fn a_gpu_only_a_process_sample_names_is_found_by_a_changed_workload() {
    // The quota names GPU 7 by UUID; the sample lists GPU 0 only, but a process of another
    // workload is sampled on GPU 7: the UUID is found there.
    let toml = "[[quota]]\ncgroup = \"/docker/*\"\ngpu = \"GPU-00000007\"\ngpu_memory = \"2GiB\"\n";
    let mut s = Steady::new(toml);
    s.procs = ['a', 'b', 'c', 'd']
        .iter()
        .zip([10, 20, 30, 40])
        .map(|(&c, pid)| attributed(pid, &docker(c)))
        .collect();
    let at = |used| {
        sample(
            &[(0, 40 * GIB, true)],
            &[
                (10, 0, Some(used)),
                (20, 7, Some(GIB)),
                (30, 0, Some(GIB)),
                (40, 0, Some(GIB)),
            ],
        )
    };
    for t in 0..3 {
        s.at(t * 1_000, &at(GIB));
    }
    let scopes = |s: &Steady| {
        s.plain.workloads[&docker('a').key()]
            .scopes
            .keys()
            .copied()
            .collect::<Vec<_>>()
    };
    assert_eq!(scopes(&s), vec![GpuScope::Gpu(7)]);
    // Only `a`'s usage changes: `a` is evaluated alone, and still finds GPU 7.
    let partial = s.inc.partial;
    s.at(3_000, &at(GIB + MIB));
    assert_eq!(s.inc.partial, partial + 1);
    assert_eq!(scopes(&s), vec![GpuScope::Gpu(7)]);
}

#[test]
fn a_pid_shared_with_a_changed_workload_is_evaluated_in_full() {
    let mut s = Steady::new(TWO_GIB);
    let (a, b, c, d) = (docker('a'), docker('b'), docker('c'), docker('d'));
    // pid 10 is attributed to two identities, in `a` and in `b`: its usage is unknown to both.
    let shared = |w: &WorkloadMeta, start| {
        AttributedProcess::new(
            ProcessIdentity {
                pid: 10,
                start_ticks: start,
            },
            w.clone(),
            None,
        )
    };
    s.procs = vec![
        shared(&a, 1),
        shared(&b, 2),
        attributed(30, &c),
        attributed(40, &d),
    ];
    let gpus = sample(
        &[(0, 40 * GIB, true)],
        &[(10, 0, Some(GIB)), (30, 0, Some(GIB)), (40, 0, Some(GIB))],
    );
    for t in 0..3 {
        s.at(t * 1_000, &gpus);
    }
    assert_eq!(s.inc.carried, 1);
    assert_eq!(
        s.plain.workloads[&b.key()]
            .scopes
            .values()
            .next()
            .unwrap()
            .usage,
        None
    );
    // `a`'s process is now another pid: `b` alone owns pid 10, its usage known again.
    s.procs[0] = attributed(11, &a);
    let (evaluated, partial) = (s.inc.evaluated, s.inc.partial);
    s.at(3_000, &gpus);
    assert_eq!(
        (s.inc.evaluated, s.inc.partial),
        (evaluated + 1, partial),
        "a pid on both sides of the split"
    );
    assert_eq!(
        s.plain.workloads[&b.key()]
            .scopes
            .values()
            .next()
            .unwrap()
            .usage,
        Some(GIB)
    );
}

#[test]
fn a_liable_workload_is_evaluated_every_step_and_climbs_its_ladder() {
    let toml = format!(
        "{TWO_GIB}grace = \"0s\"\nladder = [{{ action = \"alert\" }}, {{ action = \"freeze\", after = \"3s\" }}]\n"
    );
    let mut s = Steady::new(&toml);
    let over = sample(
        &[(0, 40 * GIB, true)],
        &[(10, 0, Some(3 * GIB)), (20, 0, Some(GIB))],
    );
    let mut seen = Vec::new();
    for t in 0..6 {
        seen.push((t, s.at(t * 1_000, &over)));
    }
    assert_eq!(seen[0].1, vec![ActionKind::Alert]);
    assert_eq!(seen[3].1, vec![ActionKind::Freeze], "{seen:?}");
    assert_eq!(
        s.inc.carried, 0,
        "a liable workload's state depends on the clock"
    );
}

#[test]
fn a_state_changed_by_the_executors_is_evaluated() {
    let mut s = Steady::new(TWO_GIB);
    let under = sample(
        &[(0, 40 * GIB, true)],
        &[(10, 0, Some(GIB)), (20, 0, Some(GIB))],
    );
    s.at(0, &under);
    s.at(1_000, &under);
    s.at(2_000, &under);
    assert_eq!(s.inc.carried, 1);
    // Someone else's state (an operator's release folded in, an executor's report).
    s.inc_state.workloads.clear();
    s.plain.workloads.clear();
    s.at(3_000, &under);
    assert_eq!(s.inc.carried, 1);
}

/// Each generated step is held for a few steps while the clock runs (a steady node), so the
/// incremental path carries some of them; every decision equals the from-scratch one.
/// `nudges`: MiB added to one process sample at held steps (a few usages change), cycled.
/// `moves`: what else changes at held steps, cycled: 0 nothing; a process moves to another
/// process's workload (1), takes a pid nothing samples (2) or another process's pid (4); a
/// process sample takes a pid no process has (3) or another process's (5).
fn check_world(
    w: &World,
    holds: &[usize],
    dts: &[u64],
    nudges: &[u64],
    moves: &[u8],
) -> (u64, u64, u64) {
    let pool = pool();
    let quotas = QuotaSet::parse(&w.toml, "gen.toml").unwrap();
    let processes = world_processes(w, &pool);
    let (mut plain, mut inc_state) = (PolicyState::default(), PolicyState::default());
    let mut inc = Incremental::default();
    let mut kernel: BTreeMap<String, ObservedGroup> = BTreeMap::new();
    let mut now = Duration::ZERO;
    let mut dt = dts.iter().cycle();
    let mut nudge = nudges.iter().cycle();
    let mut moving = moves.iter().cycle();
    for (i, (_, _, first_dt)) in w.steps.iter().enumerate() {
        let base = world_sample(w, i);
        for hold in 0..holds[i % holds.len()] {
            let mut s = base.clone();
            let n = *nudge.next().unwrap();
            if hold > 0 && n > 0 && !s.processes.is_empty() {
                let j = (i * 3 + hold) % s.processes.len();
                if let Some(b) = s.processes[j].used_bytes.as_mut() {
                    *b += n * MIB;
                }
            }
            let mut procs = processes.clone();
            let m = *moving.next().unwrap();
            if hold > 0 && !procs.is_empty() && !s.processes.is_empty() {
                let n = procs.len();
                let j = (i + hold) % n;
                let other = procs[(j + 1) % n].clone();
                let id = procs[j].identity;
                let e = (i + 2 * hold) % s.processes.len();
                match m {
                    1 => procs[j] = AttributedProcess::new(id, other.workload.clone(), None),
                    2 => {
                        procs[j] = AttributedProcess::new(
                            ident(200 + j as u32),
                            procs[j].workload.clone(),
                            None,
                        )
                    }
                    3 => s.processes[e].pid = 200 + e as u32,
                    4 => {
                        let shared = ProcessIdentity {
                            pid: other.identity.pid,
                            start_ticks: 999,
                        };
                        procs[j] = AttributedProcess::new(shared, procs[j].workload.clone(), None)
                    }
                    5 => s.processes[e].pid = other.identity.pid,
                    _ => {}
                }
            }
            let releases: Vec<String> = if hold == 0 {
                now += Duration::from_millis(*first_dt);
                perturb(&mut kernel, w.perturb[i]);
                w.releases[i].iter().map(|&wi| pool[wi].key()).collect()
            } else {
                now += Duration::from_millis(*dt.next().unwrap());
                Vec::new()
            };
            let d = both(
                &mut plain,
                &mut inc,
                &mut inc_state,
                &PolicyInput {
                    now,
                    sample: &s,
                    processes: &procs,
                    quotas: &quotas,
                    releases: &releases,
                    agent_pid: w.agent,
                    dry_run: false,
                    observe_only: false,
                    taken: &crate::policy::NONE_TAKEN,
                    observed: &kernel,
                },
            );
            kernel.retain(|_, o| o.ours);
            apply_to_kernel(&mut kernel, &d.actions);
        }
    }
    (inc.evaluated, inc.partial, inc.carried)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn incremental_equals_from_scratch(
        w in world(),
        holds in proptest::collection::vec(1usize..5, 1..6),
        dts in proptest::collection::vec(0u64..10_000, 1..8),
        nudges in proptest::collection::vec(prop_oneof![Just(0u64), 1u64..2048], 1..6),
        moves in proptest::collection::vec(prop_oneof![3 => Just(0u8), 5 => 1u8..6], 1..6),
    ) {
        check_world(&w, &holds, &dts, &nudges, &moves);
    }
}

/// The property above is not vacuous: generated worlds carry steps, and carry them across
/// ladder deadlines (steps apart by more than any grace or ladder step).
#[test]
fn generated_worlds_carry_steps() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut evaluated, mut partial, mut carried) = (0, 0, 0);
    for _ in 0..300 {
        let w = world().new_tree(&mut runner).unwrap().current();
        let (e, p, c) = check_world(&w, &[4], &[9_000], &[0, 0, 700], &[0]);
        evaluated += e;
        partial += p;
        carried += c;
    }
    assert!(
        carried > 100,
        "only {carried} of {} steps carried",
        evaluated + carried
    );
    assert!(evaluated > 100, "only {evaluated} steps evaluated");
    assert!(
        partial > 100,
        "only {partial} of {} steps evaluated in part",
        evaluated + partial + carried
    );
}
