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
    let under = sample(
        &[(0, 40 * GIB, true)],
        &[(10, 0, Some(GIB)), (20, 0, Some(GIB))],
    );
    assert!(s.at(0, &under).is_empty());
    assert!(s.at(1_000, &under).is_empty());
    assert_eq!(
        (s.inc.evaluated, s.inc.carried),
        (2, 0),
        "the first step's state was new"
    );
    for t in 2..10 {
        assert!(s.at(t * 1_000, &under).is_empty());
    }
    assert_eq!((s.inc.evaluated, s.inc.carried), (2, 8));
    // What the policy does not read (utilization) changes nothing.
    let mut busy = under.clone();
    busy.processes[0].utilization = Some(crate::sample::Utilization { sm: 90, memory: 5 });
    busy.devices[0].temperature_c = Some(80);
    s.at(10_000, &busy);
    assert_eq!((s.inc.evaluated, s.inc.carried), (2, 9));
    // Usage it reads does.
    let more = sample(
        &[(0, 40 * GIB, true)],
        &[(10, 0, Some(GIB + MIB)), (20, 0, Some(GIB))],
    );
    s.at(11_000, &more);
    assert_eq!((s.inc.evaluated, s.inc.carried), (3, 9));
    // A GPU's free memory (elastic pressure reads it) does too.
    let fuller = sample(
        &[(0, 10 * GIB, true)],
        &[(10, 0, Some(GIB + MIB)), (20, 0, Some(GIB))],
    );
    s.at(12_000, &more);
    s.at(13_000, &fuller);
    assert_eq!((s.inc.evaluated, s.inc.carried), (5, 9));
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
fn check_world(w: &World, holds: &[usize], dts: &[u64]) -> (u64, u64) {
    let pool = pool();
    let quotas = QuotaSet::parse(&w.toml, "gen.toml").unwrap();
    let processes = world_processes(w, &pool);
    let (mut plain, mut inc_state) = (PolicyState::default(), PolicyState::default());
    let mut inc = Incremental::default();
    let mut kernel: BTreeMap<String, ObservedGroup> = BTreeMap::new();
    let mut now = Duration::ZERO;
    let mut dt = dts.iter().cycle();
    for (i, (_, _, first_dt)) in w.steps.iter().enumerate() {
        let s = world_sample(w, i);
        for hold in 0..holds[i % holds.len()] {
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
                    processes: &processes,
                    quotas: &quotas,
                    releases: &releases,
                    agent_pid: w.agent,
                    dry_run: false,
                    observe_only: false,
                    observed: &kernel,
                },
            );
            kernel.retain(|_, o| o.ours);
            apply_to_kernel(&mut kernel, &d.actions);
        }
    }
    (inc.evaluated, inc.carried)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn incremental_equals_from_scratch(
        w in world(),
        holds in proptest::collection::vec(1usize..5, 1..6),
        dts in proptest::collection::vec(0u64..10_000, 1..8),
    ) {
        check_world(&w, &holds, &dts);
    }
}

/// The property above is not vacuous: generated worlds carry steps, and carry them across
/// ladder deadlines (steps apart by more than any grace or ladder step).
#[test]
fn generated_worlds_carry_steps() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut evaluated, mut carried) = (0, 0);
    for _ in 0..300 {
        let w = world().new_tree(&mut runner).unwrap().current();
        let (e, c) = check_world(&w, &[3], &[9_000]);
        evaluated += e;
        carried += c;
    }
    assert!(
        carried > 100,
        "only {carried} of {} steps carried",
        evaluated + carried
    );
    assert!(evaluated > 100, "only {evaluated} steps evaluated");
}
