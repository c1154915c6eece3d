//! What a freeze says and when a thaw is someone else's: the liability whose reason a freeze
//! carries (`ladder.rs`), the attempt number in a retry's reason and the external-thaw test
//! (`reconcile.rs`).

use super::*;

/// Container a: 2 GiB on GPU 0 and 3 GiB over all GPUs, freeze at once.
fn gpu0_and_total() -> Sim {
    Sim::a(&format!(
        "[defaults]\ngrace = \"0s\"\nladder = [{{ action = \"freeze\" }}]\n[[quota]]\ncontainer = \"{0}\"\ngpu = 0\ngpu_memory = \"2GiB\"\n\n[[quota]]\ncontainer = \"{0}\"\ngpu_memory = \"3GiB\"\n",
        id('a')
    ))
}

#[test]
fn a_freeze_carries_the_reason_of_the_liability_that_froze_it() {
    // Over on GPU 0 (4 of 2 GiB) and in total (4 of 3 GiB) at once: the all-GPU liability comes
    // first and freezes; GPU 0's reason does not replace its reason.
    let mut sim = gpu0_and_total();
    let f = sim.at(0, &[(10, 0, Some(4 * GIB))]);
    assert_eq!(kinds(&f), vec![ActionKind::Freeze]);
    assert_reason(&f[0], "quota on all GPUs");
    assert!(!f[0].reason.contains("on GPU 0"), "{}", f[0].reason);
}

#[test]
fn a_freeze_held_by_another_liability_carries_that_ones_reason() {
    // GPU 0 alone over (2.5 of 2 GiB, 2.5 of 3 GiB in total): frozen for GPU 0.
    let mut sim = gpu0_and_total();
    let f = sim.at(0, &[(10, 0, Some(5 * GIB / 2))]);
    assert_eq!(kinds(&f), vec![ActionKind::Freeze]);
    assert_reason(&f[0], "quota on GPU 0");
    // GPU 0 back within, but 1.5 + 2 GiB is over the total: the freeze is held, for the total;
    // an operator's thaw at that step is undone for the total's reason.
    let now_total = [(10, 0, Some(3 * GIB / 2)), (10, 1, Some(2 * GIB))];
    sim.kernel.get_mut(&key('a')).unwrap().state = GroupState::Thawed;
    let again = sim.at(1000, &now_total);
    assert_eq!(kinds(&again), vec![ActionKind::Freeze]);
    assert_reason(
        &again[0],
        "freezing it again: uses 3.5 GiB of its 3.0 GiB quota on all GPUs",
    );
}

#[test]
fn a_thaw_right_after_the_freeze_was_asked_for_is_someone_elses() {
    let over = [(10, 0, Some(3 * GIB))];
    let mut sim = Sim::a(&freeze_at_once('a'));
    assert_eq!(kinds(&sim.at(0, &over)), vec![ActionKind::Freeze]);
    assert_eq!(sim.stats().external_thaws, 0);
    // Thawed before the agent saw its own freeze settle.
    sim.kernel.get_mut(&key('a')).unwrap().state = GroupState::Thawed;
    let again = sim.at(1000, &over);
    assert_eq!(kinds(&again), vec![ActionKind::Freeze]);
    assert_reason(&again[0], "thawed behind the agent's back");
    assert_eq!(sim.stats().external_thaws, 1);
    // Frozen again and left so: nobody thawed it.
    for t in 2..5 {
        assert!(sim.at(t * 1000, &over).is_empty());
        assert_eq!(sim.stats().external_thaws, 0, "at {t}s");
    }
    // Back within quota: the agent thaws it; the group, still marked ours, reads thawed.
    sim.kernel_applies = false;
    let within = [(10, 0, Some(GIB))];
    assert_eq!(kinds(&sim.at(5000, &within)), vec![ActionKind::Thaw]);
    sim.kernel.get_mut(&key('a')).unwrap().state = GroupState::Thawed;
    sim.at(6000, &within);
    assert_eq!(sim.stats().external_thaws, 0, "the agent's own thaw");
}

#[test]
fn only_a_retry_says_which_attempt_it_is() {
    // A freeze that does not settle.
    let over = [(10, 0, Some(3 * GIB))];
    let mut sim = Sim::a(&freeze_at_once('a'));
    sim.kernel_applies = false;
    let first = sim.at(0, &over);
    assert_eq!(first[0].attempt, 1);
    assert!(
        !first[0].reason.starts_with("attempt"),
        "{}",
        first[0].reason
    );
    sim.kernel
        .insert(key('a'), observed(GroupState::Freezing, true, 'a'));
    let second = sim.at(1000, &over);
    assert_eq!(second[0].attempt, 2);
    assert_reason(&second[0], "attempt 2 (the kernel says still freezing): ");
    // A resume that does not finish.
    let mut sim = suspended_at_10s();
    sim.releases = vec![key('a')];
    sim.kernel_applies = false;
    let first = sim.at(11_000, &[]);
    assert_eq!(kinds(&first), vec![ActionKind::Resume]);
    assert!(
        !first[0].reason.starts_with("attempt"),
        "{}",
        first[0].reason
    );
    let retries: Vec<Action> = (12..20)
        .flat_map(|t| sim.at(t * 1000, &[]))
        .filter(|a| a.kind == ActionKind::Resume)
        .collect();
    assert!(retries.len() >= 2, "{retries:?}");
    assert!(
        retries[0].reason.starts_with("attempt 2: "),
        "{}",
        retries[0].reason
    );
    assert!(
        retries[1].reason.starts_with("attempt 3: "),
        "{}",
        retries[1].reason
    );
}

/// A quota for container a on a GPU this node does not have: it covers a, with no liability.
fn on_an_absent_gpu(ladder: &str) -> QuotaSet {
    let toml = format!(
        "[[quota]]\ncontainer = \"{}\"\ngpu = \"GPU-00000009\"\ngpu_memory = \"1GiB\"\ngrace = \"0s\"\nladder = [{ladder}]\n",
        id('a')
    );
    QuotaSet::parse(&toml, "q.toml").unwrap()
}

#[test]
fn a_thaw_of_a_workload_left_with_no_liability_is_retried_with_backoff_not_adopted() {
    let over = [(10, 0, Some(3 * GIB))];
    let mut sim = Sim::a(&freeze_at_once('a'));
    assert_eq!(kinds(&sim.at(0, &over)), vec![ActionKind::Freeze]);
    // Its quota now names a GPU this node lacks: nothing holds the freeze. The thaw does not take.
    sim.quotas = on_an_absent_gpu("{ action = \"freeze\" }");
    sim.kernel_applies = false;
    let thaw = sim.at(1000, &over);
    assert_eq!(kinds(&thaw), vec![ActionKind::Thaw]);
    assert_eq!(reported(&sim, 'a'), "frozen");
    assert!(sim.at(1500, &over).is_empty(), "not before the backoff");
    assert_eq!(
        sim.stats().adopted,
        0,
        "its own freeze, not an earlier run's"
    );
    let retry = sim.at(2000, &over);
    assert_eq!((retry[0].kind, retry[0].attempt), (ActionKind::Thaw, 2));
}

#[test]
fn a_workload_whose_suspend_runs_stays_in_the_state_though_no_liability_is_left() {
    let over = [(10, 0, Some(3 * GIB))];
    let mut sim = Sim::a(&suspend_at_once('a', ""));
    sim.kernel_applies = false;
    assert_eq!(kinds(&sim.at(0, &over)), vec![ActionKind::Suspend]);
    // The worker has thawed the group to lock its processes: not frozen, not yet marked ours.
    sim.kernel.insert(
        key('a'),
        ObservedGroup {
            suspension: Some(Suspension::InProgress {
                resuming: false,
                per_gpu: BTreeMap::from([(0, 3 * GIB)]),
            }),
            ..observed(GroupState::Thawed, false, 'a')
        },
    );
    sim.quotas = on_an_absent_gpu("{ action = \"suspend\" }");
    assert!(sim.at(1000, &[]).is_empty());
    assert_eq!(reported(&sim, 'a'), "suspending");
}

#[test]
fn a_suspend_the_worker_never_reported_on_is_issued_again_after_the_backoff() {
    let over = [(10, 0, Some(3 * GIB))];
    let mut sim = Sim::a(&suspend_at_once('a', ""));
    // The kernel shows no suspension, running or done, and no failure: the job was lost.
    sim.kernel_applies = false;
    assert_eq!(sim.at(0, &over)[0].kind, ActionKind::Suspend);
    assert!(sim.at(500, &over).is_empty(), "not before the backoff");
    let again = sim.at(1000, &over);
    assert_eq!(kinds(&again), vec![ActionKind::Suspend]);
    assert_eq!(again[0].attempt, 2);
}
