use super::*;

const GIB: u64 = 1 << 30;
const U0: &str = "GPU-000";
const U1: &str = "GPU-111";
const NODE: [(u32, &str); 2] = [(0, U0), (1, U1)];

fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn grant<'a>(vars: &'a [(String, String)], usage: u64) -> GrantInput<'a> {
    GrantInput {
        gpu_index: 0,
        gpu_uuid: U0,
        bytes: 2 * GIB,
        tolerance: 0,
        usage: Some(usage),
        vars,
        visible: None,
        node_gpus: &NODE,
    }
}

fn proc(pid: u32, mapped: Option<bool>, mps: MpsService) -> ProcessFact {
    ProcessFact {
        pid,
        limiter_mapped: mapped,
        mps_pipe_present: Some(true),
        mps,
    }
}

fn facts<'a>(mode: AgentMode, processes: &'a [ProcessFact]) -> Facts<'a> {
    Facts {
        mode,
        ladder: LadderPosition::NotLiable,
        driver_limit: DriverLimitFact::NotSet,
        processes,
        dmem: DmemFact::NoController,
        taken: false,
    }
}

fn of(v: &Verification, k: MechanismKind) -> Option<(MechanismState, String)> {
    v.mechanisms
        .iter()
        .find(|m| m.mechanism == k)
        .map(|m| (m.state, m.reason.clone()))
}

fn listed(v: &Verification) -> Vec<MechanismKind> {
    v.mechanisms.iter().map(|m| m.mechanism).collect()
}

#[test]
fn gpushare_is_in_force_only_when_it_would_act() {
    let none = vars(&[]);
    let g = grant(&none, GIB);
    for (mode, state, verdict) in [
        (
            AgentMode::Enforce,
            MechanismState::InForce,
            GrantVerdict::Held,
        ),
        (
            AgentMode::DryRun,
            MechanismState::Absent,
            GrantVerdict::Unenforced,
        ),
        (
            AgentMode::ObserveOnly,
            MechanismState::Absent,
            GrantVerdict::Unenforced,
        ),
    ] {
        let v = verify(&g, &facts(mode, &[]));
        assert_eq!(
            of(&v, MechanismKind::Gpushare).unwrap().0,
            state,
            "{mode:?}"
        );
        assert_eq!(v.verdict, verdict, "{mode:?}");
        // No vendor variable: only gpushare and dmem are listed.
        assert_eq!(
            listed(&v),
            vec![MechanismKind::Gpushare, MechanismKind::Dmem]
        );
    }
}

#[test]
fn enforce_mode_holds_unless_over_past_grace_and_not_isolated() {
    let none = vars(&[]);
    for (usage, ladder, verdict) in [
        (GIB, LadderPosition::NotLiable, GrantVerdict::Held),
        (2 * GIB, LadderPosition::NotIsolated, GrantVerdict::Held),
        (3 * GIB, LadderPosition::InGrace, GrantVerdict::Held),
        (3 * GIB, LadderPosition::Isolated, GrantVerdict::Held),
        (3 * GIB, LadderPosition::NotLiable, GrantVerdict::Held),
        (3 * GIB, LadderPosition::NotIsolated, GrantVerdict::Violated),
        (
            2 * GIB + 1,
            LadderPosition::NotIsolated,
            GrantVerdict::Violated,
        ),
    ] {
        let mut f = facts(AgentMode::Enforce, &[]);
        f.ladder = ladder;
        assert_eq!(
            verify(&grant(&none, usage), &f).verdict,
            verdict,
            "{usage} {ladder:?}"
        );
    }
    // The tolerance counts as within, unknown usage is never over.
    let mut f = facts(AgentMode::Enforce, &[]);
    f.ladder = LadderPosition::NotIsolated;
    let mut g = grant(&none, 2 * GIB + 100);
    g.tolerance = 100;
    assert_eq!(verify(&g, &f).verdict, GrantVerdict::Held);
    g.usage = Some(2 * GIB + 101);
    assert_eq!(verify(&g, &f).verdict, GrantVerdict::Violated);
    g.usage = None;
    assert_eq!(verify(&g, &f).verdict, GrantVerdict::Held);
}

#[test]
fn ladder_positions_from_reported_states() {
    for (s, p) in [
        ("ok", LadderPosition::NotLiable),
        ("over_quota", LadderPosition::InGrace),
        ("freezing", LadderPosition::InGrace),
        ("suspending", LadderPosition::InGrace),
        ("resuming", LadderPosition::InGrace),
        ("frozen", LadderPosition::Isolated),
        ("suspended", LadderPosition::Isolated),
        ("killed", LadderPosition::Isolated),
        ("killing", LadderPosition::Isolated),
        ("alerted", LadderPosition::NotIsolated),
        ("signalled", LadderPosition::NotIsolated),
        ("would_freeze", LadderPosition::NotIsolated),
    ] {
        assert_eq!(LadderPosition::from_state(s), p, "{s}");
    }
}

#[test]
fn plural_only_nvidia_variables_leave_the_driver_limit_absent() {
    let v = vars(&[("NVIDIA_GPU_MEMORY_LIMITS", "2147483648")]);
    let r = verify(&grant(&v, GIB), &facts(AgentMode::ObserveOnly, &[]));
    assert_eq!(
        of(&r, MechanismKind::DriverLimit).unwrap(),
        (
            MechanismState::Absent,
            "NVIDIA_GPU_MEMORY_LIMITS is set; the toolkit's hook reads NVIDIA_GPU_MEMORY_LIMIT"
                .to_string()
        )
    );
    assert_eq!(r.verdict, GrantVerdict::Unenforced);
    // Under an enforcing agent: held, the vendor mechanism still shown absent.
    let r = verify(&grant(&v, GIB), &facts(AgentMode::Enforce, &[]));
    assert_eq!(r.verdict, GrantVerdict::Held);
    assert_eq!(
        of(&r, MechanismKind::DriverLimit).unwrap().0,
        MechanismState::Absent
    );
}

#[test]
fn the_driver_limit_as_the_driver_reports_it() {
    let sing = vars(&[("NVIDIA_GPU_MEMORY_LIMIT", "2147483648")]);
    let none = vars(&[]);
    let cases = [
        (
            &sing,
            DriverLimitFact::Unsupported {
                driver: "580".into(),
            },
            Some((
                MechanismState::Absent,
                "driver 580 has no per-cgroup limits",
            )),
        ),
        (
            &sing,
            DriverLimitFact::Unknown {
                reason: "no driver".into(),
            },
            Some((MechanismState::Absent, "no driver")),
        ),
        (
            &sing,
            DriverLimitFact::NotSet,
            Some((
                MechanismState::Failed,
                "NVIDIA_GPU_MEMORY_LIMIT is set; the driver shows no limit on the workload's group on GPU 0",
            )),
        ),
        (
            &sing,
            DriverLimitFact::Set {
                hard_bytes: 2 * GIB,
            },
            Some((MechanismState::InForce, "")),
        ),
        (
            &sing,
            DriverLimitFact::Set {
                hard_bytes: 3 * GIB,
            },
            Some((
                MechanismState::Failed,
                "the driver's limit on GPU 0 (3.0 GiB) is above the grant (2.0 GiB)",
            )),
        ),
        // gpushare's own limit is shown without a vendor variable; nothing else is.
        (
            &none,
            DriverLimitFact::Set {
                hard_bytes: 2 * GIB,
            },
            Some((MechanismState::InForce, "")),
        ),
        (&none, DriverLimitFact::NotSet, None),
        (
            &none,
            DriverLimitFact::Unsupported {
                driver: "580".into(),
            },
            None,
        ),
    ];
    for (v, fact, want) in cases {
        let mut f = facts(AgentMode::DryRun, &[]);
        f.driver_limit = fact.clone();
        let r = verify(&grant(v, GIB), &f);
        assert_eq!(
            of(&r, MechanismKind::DriverLimit),
            want.map(|(s, r)| (s, r.to_string())),
            "{fact:?}"
        );
        let held = want.is_some_and(|(s, _)| s == MechanismState::InForce);
        assert_eq!(
            r.verdict,
            if held {
                GrantVerdict::Held
            } else {
                GrantVerdict::Unenforced
            },
            "{fact:?}"
        );
    }
}

#[test]
fn an_mps_limit_naming_an_invisible_gpu_fails() {
    let v = vars(&[
        ("CUDA_VISIBLE_DEVICES", "0"),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=2G,1=2G"),
    ]);
    let visible = visible_gpus(&v, &NODE).unwrap();
    assert_eq!(visible, vec![0]);
    let mut g = grant(&v, GIB);
    g.visible = Some(&visible);
    let p = [proc(4711, None, MpsService::Served)];
    let r = verify(&g, &facts(AgentMode::DryRun, &p));
    assert_eq!(
        of(&r, MechanismKind::Mps).unwrap(),
        (
            MechanismState::Failed,
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names GPU 1, the process sees only GPU 0".into()
        )
    );
    assert_eq!(r.verdict, GrantVerdict::Unenforced);
    // By UUID too; a MIG UUID is not judged.
    for (value, failed) in [
        ("GPU-111=1G", true),
        ("GPU-000=1G", false),
        ("MIG-9=1G,1G", false),
    ] {
        let v2 = vars(&[
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", value),
        ]);
        let mut g = grant(&v2, GIB);
        g.visible = Some(&visible);
        let r = verify(&g, &facts(AgentMode::DryRun, &p));
        assert_eq!(
            of(&r, MechanismKind::Mps).unwrap().0 == MechanismState::Failed,
            failed,
            "{value}: {r:?}"
        );
    }
}

#[test]
fn an_mps_client_needs_a_server_and_its_pipe_directory() {
    let v = vars(&[("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "2G")]);
    let served = proc(10, None, MpsService::Served);
    let unserved = proc(4711, None, MpsService::NotServed);
    let mut no_pipe = proc(12, None, MpsService::Served);
    no_pipe.mps_pipe_present = Some(false);
    let unknown = proc(13, None, MpsService::Unknown);
    let cases: [(&[ProcessFact], MechanismState, &str); 6] = [
        (std::slice::from_ref(&served), MechanismState::InForce, ""),
        (
            &[served.clone(), unserved.clone()],
            MechanismState::Failed,
            "no MPS server serves pid 4711",
        ),
        (
            &[served.clone(), no_pipe.clone()],
            MechanismState::Failed,
            "the MPS pipe directory is missing as pid 12 sees it",
        ),
        (
            std::slice::from_ref(&unknown),
            MechanismState::Absent,
            "the driver cannot say which processes an MPS server serves",
        ),
        (
            &[unknown.clone(), served.clone()],
            MechanismState::InForce,
            "",
        ),
        (
            &[],
            MechanismState::Absent,
            "no GPU process of the workload on GPU 0 to check",
        ),
    ];
    for (p, state, reason) in cases {
        let r = verify(&grant(&v, GIB), &facts(AgentMode::DryRun, p));
        assert_eq!(
            of(&r, MechanismKind::Mps).unwrap(),
            (state, reason.to_string()),
            "{p:?}"
        );
    }
    // A limit on another GPU only: absent here.
    let other = vars(&[("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "1=2G")]);
    let r = verify(&grant(&other, GIB), &facts(AgentMode::DryRun, &[served]));
    assert_eq!(
        of(&r, MechanismKind::Mps).unwrap(),
        (
            MechanismState::Absent,
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT sets no limit on GPU 0".into()
        )
    );
}

#[test]
fn a_process_without_the_in_process_limiter_fails_it() {
    let v = vars(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "2g")]);
    let with = proc(10, Some(true), MpsService::Unknown);
    let without = proc(4711, Some(false), MpsService::Unknown);
    let unread = proc(12, None, MpsService::Unknown);
    let cases: [(&[ProcessFact], MechanismState, &str, GrantVerdict); 6] = [
        (
            std::slice::from_ref(&with),
            MechanismState::InForce,
            "",
            GrantVerdict::Held,
        ),
        (
            &[with.clone(), without.clone(), with.clone()],
            MechanismState::Failed,
            "HAMi-core not mapped in pid 4711 (static binary?)",
            GrantVerdict::Unenforced,
        ),
        (
            std::slice::from_ref(&without),
            MechanismState::Absent,
            "HAMi-core not mapped in pid 4711 (static binary?)",
            GrantVerdict::Unenforced,
        ),
        (
            std::slice::from_ref(&unread),
            MechanismState::Absent,
            "the maps of pid 12 could not be read",
            GrantVerdict::Unenforced,
        ),
        (
            &[unread.clone(), with.clone()],
            MechanismState::InForce,
            "",
            GrantVerdict::Held,
        ),
        (
            &[],
            MechanismState::Absent,
            "no GPU process of the workload on GPU 0 to check",
            GrantVerdict::Unenforced,
        ),
    ];
    for (p, state, reason, verdict) in cases {
        let r = verify(&grant(&v, GIB), &facts(AgentMode::DryRun, p));
        assert_eq!(
            of(&r, MechanismKind::InProcess).unwrap(),
            (state, reason.to_string()),
            "{p:?}"
        );
        assert_eq!(r.verdict, verdict, "{p:?}");
    }
    // Many pids: a few named, the rest counted.
    let many: Vec<ProcessFact> = (1..=5)
        .map(|i| proc(i, Some(false), MpsService::Unknown))
        .collect();
    let r = verify(&grant(&v, GIB), &facts(AgentMode::DryRun, &many));
    assert_eq!(
        of(&r, MechanismKind::InProcess).unwrap().1,
        "HAMi-core not mapped in pid 1, 2, 3 and 2 more (static binary?)"
    );
    // A mapped library without a HAMi variable claims nothing.
    let none = vars(&[]);
    let r = verify(&grant(&none, GIB), &facts(AgentMode::DryRun, &[with]));
    assert_eq!(of(&r, MechanismKind::InProcess), None);
}

#[test]
fn usage_over_a_grant_while_a_mechanism_is_in_force_is_violated() {
    let v = vars(&[("CUDA_DEVICE_MEMORY_LIMIT", "2g")]);
    let p = [proc(10, Some(true), MpsService::Unknown)];
    for mode in [AgentMode::DryRun, AgentMode::ObserveOnly] {
        // The ladder (which evaluates in these modes too) reads it liable: over.
        let mut f = facts(mode, &p);
        for ladder in [LadderPosition::InGrace, LadderPosition::NotIsolated] {
            f.ladder = ladder;
            assert_eq!(verify(&grant(&v, 2 * GIB), &f).verdict, GrantVerdict::Held);
            assert_eq!(
                verify(&grant(&v, 2 * GIB + 1), &f).verdict,
                GrantVerdict::Violated,
                "{mode:?} {ladder:?}"
            );
        }
        // The ladder reads it `ok` (within the quota's tolerance, elastic without pressure): not
        // over.
        f.ladder = LadderPosition::NotLiable;
        assert_eq!(
            verify(&grant(&v, 2 * GIB + 1), &f).verdict,
            GrantVerdict::Held
        );
    }
    // Over with nothing in force is unenforced, not violated.
    let none = vars(&[]);
    let mut f = facts(AgentMode::DryRun, &p);
    f.ladder = LadderPosition::NotIsolated;
    assert_eq!(
        verify(&grant(&none, 3 * GIB), &f).verdict,
        GrantVerdict::Unenforced
    );
}

#[test]
fn dmem_as_the_kernel_shows_it() {
    let none = vars(&[]);
    for (fact, state, reason) in [
        (
            DmemFact::NoController,
            MechanismState::Absent,
            "kernel has no dmem controller",
        ),
        (
            DmemFact::Unreadable {
                reason: "not enabled".into(),
            },
            MechanismState::Absent,
            "not enabled",
        ),
        (
            DmemFact::Max(None),
            MechanismState::Absent,
            "dmem.max of the workload's group is max",
        ),
        (DmemFact::Max(Some(2 * GIB)), MechanismState::InForce, ""),
        (
            DmemFact::Max(Some(4 * GIB)),
            MechanismState::Failed,
            "dmem.max (4.0 GiB) is above the grant (2.0 GiB)",
        ),
    ] {
        let mut f = facts(AgentMode::DryRun, &[]);
        f.dmem = fact.clone();
        let r = verify(&grant(&none, GIB), &f);
        assert_eq!(
            of(&r, MechanismKind::Dmem).unwrap(),
            (state, reason.to_string()),
            "{fact:?}"
        );
    }
}

#[test]
fn visible_gpus_from_the_variables() {
    type Case<'a> = (&'a [(&'a str, &'a str)], Option<Vec<u32>>);
    let cases: [Case; 8] = [
        (&[], None),
        (&[("NVIDIA_VISIBLE_DEVICES", "all")], Some(vec![0, 1])),
        (&[("NVIDIA_VISIBLE_DEVICES", "void")], Some(vec![])),
        (&[("NVIDIA_VISIBLE_DEVICES", "GPU-111")], Some(vec![1])),
        (
            &[
                ("NVIDIA_VISIBLE_DEVICES", "1"),
                ("CUDA_VISIBLE_DEVICES", "0"),
            ],
            Some(vec![1]),
        ),
        (
            &[
                ("NVIDIA_VISIBLE_DEVICES", "1"),
                ("CUDA_VISIBLE_DEVICES", "1"),
            ],
            None,
        ),
        (&[("CUDA_VISIBLE_DEVICES", "GPU-000,1")], Some(vec![0, 1])),
        (&[("NVIDIA_VISIBLE_DEVICES", "GPU-999")], None),
    ];
    for (v, want) in cases {
        assert_eq!(visible_gpus(&vars(v), &NODE), want, "{v:?}");
    }
}

#[test]
fn labels() {
    let k: Vec<&str> = [
        MechanismKind::Gpushare,
        MechanismKind::DriverLimit,
        MechanismKind::Mps,
        MechanismKind::InProcess,
        MechanismKind::Dmem,
    ]
    .iter()
    .map(|k| k.as_str())
    .collect();
    assert_eq!(k, ["gpushare", "driver_limit", "mps", "in_process", "dmem"]);
    let s: Vec<&str> = [
        MechanismState::InForce,
        MechanismState::Absent,
        MechanismState::Failed,
    ]
    .iter()
    .map(|s| s.as_str())
    .collect();
    assert_eq!(s, ["in_force", "absent", "failed"]);
    let v: Vec<&str> = GrantVerdict::ALL.iter().map(|v| v.as_str()).collect();
    assert_eq!(v, ["held", "unenforced", "violated"]);
}

#[test]
fn a_dry_run_takes_what_the_others_leave_unheld_on_facts_observed_and_nothing_else() {
    let hami = vars(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "2g")]);
    let mapped = [proc(1, Some(true), MpsService::Unknown)];
    let bare = [proc(1, Some(false), MpsService::Unknown)];
    let unread = [proc(1, None, MpsService::Unknown)];
    let none = vars(&[]);
    for (vars, procs, usage, ladder, takes, why) in [
        (
            &hami,
            &mapped[..],
            GIB,
            LadderPosition::NotLiable,
            false,
            "held",
        ),
        (
            &hami,
            &bare[..],
            GIB,
            LadderPosition::NotLiable,
            true,
            "unenforced",
        ),
        (
            &none,
            &[][..],
            GIB,
            LadderPosition::NotLiable,
            true,
            "no mechanism",
        ),
        (
            &hami,
            &mapped[..],
            3 * GIB,
            LadderPosition::InGrace,
            true,
            "violated",
        ),
        (
            &hami,
            &mapped[..],
            3 * GIB,
            LadderPosition::NotLiable,
            false,
            "ok by the ladder",
        ),
        (
            &hami,
            &unread[..],
            GIB,
            LadderPosition::NotLiable,
            false,
            "maps unread",
        ),
    ] {
        let mut f = facts(AgentMode::DryRun, procs);
        f.ladder = ladder;
        let v = verify(&grant(vars, usage), &f);
        assert_eq!(v.takes, takes, "{why}");
        assert_eq!(
            of(&v, MechanismKind::Gpushare).unwrap().0,
            MechanismState::Absent
        );
        // Never outside a dry run.
        for mode in [AgentMode::Enforce, AgentMode::ObserveOnly] {
            f.mode = mode;
            assert!(!verify(&grant(vars, usage), &f).takes, "{why} {mode:?}");
        }
    }
}

#[test]
fn a_grant_is_held_while_taken_until_the_others_hold_it_and_the_ladder_rests() {
    let hami = vars(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "2g")]);
    let mapped = [proc(1, Some(true), MpsService::Unknown)];
    let bare = [proc(1, Some(false), MpsService::Unknown)];
    let unread = [proc(1, None, MpsService::Unknown)];
    for (procs, usage, ladder, verdict, keeps) in [
        // Nothing else holds it: kept, whatever the ladder (even at rest).
        (
            &bare[..],
            GIB,
            LadderPosition::NotLiable,
            GrantVerdict::Held,
            true,
        ),
        (
            &bare[..],
            3 * GIB,
            LadderPosition::Isolated,
            GrantVerdict::Held,
            true,
        ),
        (
            &unread[..],
            GIB,
            LadderPosition::NotLiable,
            GrantVerdict::Held,
            true,
        ),
        // The others hold it again: kept while the ladder is not at rest, let go once it is.
        (
            &mapped[..],
            GIB,
            LadderPosition::InGrace,
            GrantVerdict::Held,
            true,
        ),
        (
            &mapped[..],
            3 * GIB,
            LadderPosition::Isolated,
            GrantVerdict::Held,
            true,
        ),
        (
            &mapped[..],
            GIB,
            LadderPosition::NotLiable,
            GrantVerdict::Held,
            false,
        ),
        // Past grace and not isolated (an alert-only ladder): gpushare failed it.
        (
            &bare[..],
            3 * GIB,
            LadderPosition::NotIsolated,
            GrantVerdict::Violated,
            true,
        ),
    ] {
        let mut f = facts(AgentMode::DryRun, procs);
        f.ladder = ladder;
        f.taken = true;
        let v = verify(&grant(&hami, usage), &f);
        assert_eq!(
            (v.verdict, v.takes),
            (verdict, keeps),
            "{procs:?} {usage} {ladder:?}"
        );
        assert_eq!(
            of(&v, MechanismKind::Gpushare),
            Some((
                MechanismState::InForce,
                "taken: no other mechanism held the grant (take_unheld)".into()
            ))
        );
    }
}

#[test]
fn a_mechanism_claimed_and_not_observed_might_hold_the_grant() {
    let limit = vars(&[("NVIDIA_GPU_MEMORY_LIMIT", "2g")]);
    let plural = vars(&[("NVIDIA_GPU_MEMORY_LIMITS", "2g")]);
    let mps = vars(&[("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=2G")]);
    let unknown = DriverLimitFact::Unknown {
        reason: "GPU 0 cannot be asked".into(),
    };
    let served_unknown = [proc(1, Some(false), MpsService::Unknown)];
    let not_served = [proc(1, Some(false), MpsService::NotServed)];
    for (vars, driver, procs, takes, why) in [
        (
            &limit,
            unknown.clone(),
            &served_unknown[..],
            false,
            "driver not asked",
        ),
        (
            &limit,
            DriverLimitFact::NotSet,
            &served_unknown[..],
            true,
            "driver shows none",
        ),
        (
            &plural,
            unknown.clone(),
            &served_unknown[..],
            true,
            "plural: known absent",
        ),
        (
            &mps,
            DriverLimitFact::NotSet,
            &served_unknown[..],
            false,
            "MPS clients unknown",
        ),
        (
            &mps,
            DriverLimitFact::NotSet,
            &not_served[..],
            true,
            "MPS: not served",
        ),
    ] {
        let mut f = facts(AgentMode::DryRun, procs);
        f.driver_limit = driver;
        f.dmem = DmemFact::Unreadable {
            reason: "no dmem.max".into(),
        };
        assert_eq!(verify(&grant(vars, GIB), &f).takes, takes, "{why}");
    }
}
