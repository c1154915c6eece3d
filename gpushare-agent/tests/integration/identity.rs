//! A workload is who its runtime says it is (issue 20, problems 1 and 2): a group named after a
//! real container or pod inside a delegated subtree is part of that subtree's workload, never the
//! container it names; nested containers keep their outer workload's quota; unit keys carry their
//! path; an earlier version's freezes are taken over under the new keys.
//!
//! The "real" containers here are groups at their runtime's place (`/docker/<id>`, `/kubepods/
//! pod<uid>/<id>`), with no runtime record on disk: their identity rests on placement alone and is
//! reported `degraded`.

use std::time::Duration;

use gpushare_testkit::{TestCgroup, nvml::Scenario, unique};
use serde_json::json;

use crate::util::{
    AgentProcess, PlacedGroup, agent_dir, container_id, needs_root, one_gpu, pod_uid, sleeping,
    workload,
};

const GIB: u64 = 1 << 30;
const FREEZE: &str = "[defaults]\ngrace = \"200ms\"\nladder = [ { action = \"freeze\" } ]\n";

fn unit_key(cg: &TestCgroup) -> String {
    format!("unit://{}", cg.rel_path())
}

/// Problem 1: a tenant's unit makes `docker/<id>` after a real container (at Docker's place)
/// and uses 5 GiB. The container keeps its own 4 GiB quota and 1 GiB of usage and is never
/// frozen; the tenant stays under its unit's quota and is frozen there.
#[test]
fn a_docker_shaped_group_in_a_tenants_unit_is_the_unit_not_the_container() {
    needs_root!("a_docker_shaped_group_in_a_tenants_unit");
    let id = container_id();
    let victim = PlacedGroup::create(&format!("docker/{id}"));
    let unit = TestCgroup::create(&format!("{}.service", unique("tenant"))).unwrap();
    let forged = TestCgroup::create(&format!(
        "{}/docker/{id}",
        unit.rel_path().trim_start_matches("/gpushare-test/")
    ))
    .unwrap();
    let v = sleeping(victim.cg());
    let t = sleeping(&forged);
    let unit_name = unit.rel_path().rsplit('/').next().unwrap().to_string();
    let quotas = format!(
        "{FREEZE}\n[[quota]]\ncontainer = \"{id}\"\ngpu_memory = \"4GiB\"\n\
         \n[[quota]]\nunit = \"{unit_name}\"\ngpu_memory = \"4GiB\"\n"
    );
    let sc = Scenario::create(&one_gpu(&[(v.pid(), GIB), (t.pid(), 5 * GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let s = agent.wait_state(&unit_key(&unit), "frozen");
    assert!(
        unit.wait_frozen(true),
        "the tenant's unit is frozen at its root"
    );
    let docker_key = format!("docker://{id}");
    let row = workload(&s, &docker_key, "GPU-loop").expect("the container's row");
    assert_eq!(
        row.used_bytes, GIB,
        "the tenant's usage is not summed into the container"
    );
    assert_eq!(
        row.cgroup_path,
        victim.cg().rel_path(),
        "the container's own group"
    );
    assert_eq!(
        row.identity, "degraded",
        "no runtime record: placement alone"
    );
    let tenant = workload(&s, &unit_key(&unit), "all").unwrap();
    assert_eq!(tenant.used_bytes, 5 * GIB);
    assert_eq!(tenant.nested, vec![forged.rel_path().to_string()]);
    let s = agent.steps_over(Duration::from_secs(1), |s| {
        let row = workload(s, &docker_key, "all");
        assert!(row.is_none_or(|r| r.state == "ok"), "{row:?}");
    });
    assert!(
        !victim.cg().is_frozen(),
        "the real container is never frozen"
    );
    assert!(
        s.processes
            .iter()
            .all(|p| p.pid != t.pid() || p.workload == unit_key(&unit)),
        "the tenant's process belongs to its unit"
    );
    drop((v, t));
}

/// Problem 1: a group shaped like a pod's container (`kubepods/pod<uid>/<id>`) in a tenant's unit
/// takes neither the pod's protection nor its quota: the unit's quota applies and it is frozen;
/// the real pod is not.
#[test]
fn a_pod_shaped_group_in_a_tenants_unit_takes_no_protection_or_quota_from_the_pod() {
    needs_root!("a_pod_shaped_group_in_a_tenants_unit");
    let (uid, cid) = (pod_uid(), container_id());
    let victim = PlacedGroup::create(&format!("kubepods/pod{uid}/{cid}"));
    let unit = TestCgroup::create(&format!("{}.service", unique("podforge"))).unwrap();
    let forged = TestCgroup::create(&format!(
        "{}/kubepods/pod{uid}/{cid}",
        unit.rel_path().trim_start_matches("/gpushare-test/")
    ))
    .unwrap();
    let v = sleeping(victim.cg());
    let t = sleeping(&forged);
    let unit_name = unit.rel_path().rsplit('/').next().unwrap().to_string();
    let quotas = format!(
        "protect = [\"pod://{uid}\"]\n{FREEZE}\
         \n[[quota]]\npod_uid = \"{uid}\"\ngpu_memory = \"64GiB\"\n\
         \n[[quota]]\nunit = \"{unit_name}\"\ngpu_memory = \"2GiB\"\n"
    );
    let sc = Scenario::create(&one_gpu(&[(v.pid(), 3 * GIB), (t.pid(), 3 * GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let s = agent.wait_state(&unit_key(&unit), "frozen");
    assert!(unit.wait_frozen(true), "the tenant's unit is frozen");
    let tenant = workload(&s, &unit_key(&unit), "all").unwrap();
    assert_eq!(
        tenant.quota_bytes,
        Some(2 * GIB),
        "the unit's quota, not the pod's"
    );
    assert!(tenant.pod.is_empty(), "no pod name or UID: {tenant:?}");
    assert!(!victim.cg().is_frozen(), "the real pod is never touched");
    drop((v, t));
}

/// Problem 1, without malice: rootless Podman's containers live in the user's manager
/// (`user@UID.service/.../libpod-<id>.scope`). The operator's unit quota on the user's manager
/// keeps applying to them.
#[test]
fn rootless_podman_containers_stay_under_the_users_unit_quota() {
    needs_root!("rootless_podman_containers_stay_under_the_users_unit_quota");
    let manager = TestCgroup::create(&format!("user@{}.service", unique("1000"))).unwrap();
    let id = container_id();
    let inner = TestCgroup::create(&format!(
        "{}/user.slice/libpod-{id}.scope",
        manager.rel_path().trim_start_matches("/gpushare-test/")
    ))
    .unwrap();
    let p = sleeping(&inner);
    let name = manager.rel_path().rsplit('/').next().unwrap().to_string();
    let quotas = format!("{FREEZE}\n[[quota]]\nunit = \"{name}\"\ngpu_memory = \"2GiB\"\n");
    let sc = Scenario::create(&one_gpu(&[(p.pid(), 3 * GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let s = agent.wait_state(&unit_key(&manager), "frozen");
    assert!(
        manager.wait_frozen(true),
        "the user's manager is frozen at its root"
    );
    let row = workload(&s, &unit_key(&manager), "all").unwrap();
    assert_eq!(
        row.nested,
        vec![inner.rel_path().to_string()],
        "shown as nested"
    );
    assert!(
        !s.workloads
            .iter()
            .any(|w| w.workload.starts_with("podman://")),
        "no workload of its own"
    );
    drop(p);
}

/// Problem 1, without malice: Docker inside an LXD guest (`lxc.payload.<name>/docker/<id>`) is
/// part of the guest; a `cgroup` quota on the guest keeps applying.
#[test]
fn docker_in_an_lxd_guest_stays_under_the_guests_quota() {
    needs_root!("docker_in_an_lxd_guest_stays_under_the_guests_quota");
    let guest = TestCgroup::create(&unique("lxc.payload.g")).unwrap();
    let id = container_id();
    let inner = TestCgroup::create(&format!(
        "{}/docker/{id}",
        guest.rel_path().trim_start_matches("/gpushare-test/")
    ))
    .unwrap();
    let p = sleeping(&inner);
    let quotas = format!(
        "{FREEZE}\n[[quota]]\ncgroup = \"{}\"\ngpu_memory = \"2GiB\"\n",
        guest.rel_path()
    );
    let sc = Scenario::create(&one_gpu(&[(p.pid(), 3 * GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let key = format!("cgroup://{}", guest.rel_path());
    let s = agent.wait_state(&key, "frozen");
    assert!(guest.wait_frozen(true), "the guest is frozen at its root");
    assert_eq!(
        workload(&s, &key, "all").unwrap().nested,
        vec![inner.rel_path().to_string()]
    );
    drop(p);
}

/// Problem 2: two units of one name under different roots (a `launch`ed `session-2.scope` and
/// logind's) are two workloads: one over its quota is frozen, the other is not.
#[test]
fn two_units_of_one_name_under_different_roots_are_two_workloads() {
    needs_root!("two_units_of_one_name_under_different_roots");
    let scope = format!("{}.scope", unique("session"));
    let a = TestCgroup::create(&format!("{}/{scope}", unique("root-a"))).unwrap();
    let b = TestCgroup::create(&format!("{}/{scope}", unique("root-b"))).unwrap();
    let pa = sleeping(&a);
    let pb = sleeping(&b);
    let quotas = format!("{FREEZE}\n[[quota]]\nunit = \"{scope}\"\ngpu_memory = \"2GiB\"\n");
    let sc = Scenario::create(&one_gpu(&[(pa.pid(), 3 * GIB), (pb.pid(), GIB)])).unwrap();
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let s = agent.wait_state(&unit_key(&a), "frozen");
    assert!(a.wait_frozen(true));
    let rb = workload(&s, &unit_key(&b), "all").expect("the other unit is a workload of its own");
    assert_eq!((rb.used_bytes, rb.state.as_str()), (GIB, "ok"));
    agent.steps_over(Duration::from_millis(600), |_| {});
    assert!(!b.is_frozen(), "the other unit is within its quota");
    drop((pa, pb));
}

/// A record as today's main agent (format 2) wrote it.
fn old_record(workload: &str, cg: &TestCgroup) -> serde_json::Value {
    json!({
        "workload": workload,
        "cgroup_dir": cg.dir(),
        "freezer": "v2",
        "frozen_at_unix": 1_700_000_000u64,
        "reason": "over quota",
        "inode": cg.id(),
        "scope": "all",
    })
}

/// Keys that change are migrated: an earlier version froze a unit (keyed by its name) and a
/// container nested in another unit (keyed as the container). The new agent takes both over
/// under the units' new keys and thaws neither, both still over quota; a third freeze whose
/// workload is now within quota is thawed as before.
///
/// The earlier run is played by its ledger, written in the format today's main writes (format 2,
/// its keys), with the groups frozen as it would have frozen them.
#[test]
fn an_earlier_versions_freezes_are_taken_over_under_the_new_keys() {
    needs_root!("an_earlier_versions_freezes_are_taken_over");
    let u1 = TestCgroup::create(&format!("{}.service", unique("up-unit"))).unwrap();
    let u2 = TestCgroup::create(&format!("{}.service", unique("up-outer"))).unwrap();
    let u3 = TestCgroup::create(&format!("{}.service", unique("up-fine"))).unwrap();
    let id = container_id();
    let nested = TestCgroup::create(&format!(
        "{}/docker/{id}",
        u2.rel_path().trim_start_matches("/gpushare-test/")
    ))
    .unwrap();
    let p1 = sleeping(&u1);
    let p2 = sleeping(&nested);
    let p3 = sleeping(&u3);
    let name = |cg: &TestCgroup| cg.rel_path().rsplit('/').next().unwrap().to_string();
    let quotas = format!(
        "[defaults]\ngrace = \"0s\"\nladder = [ {{ action = \"freeze\" }} ]\n\
         \n[[quota]]\nunit = \"{}\"\ngpu_memory = \"2GiB\"\n\
         \n[[quota]]\nunit = \"{}\"\ngpu_memory = \"2GiB\"\n\
         \n[[quota]]\nunit = \"{}\"\ngpu_memory = \"2GiB\"\n",
        name(&u1),
        name(&u2),
        name(&u3)
    );
    let dir = agent_dir(&quotas);
    let ledger = json!({ "version": 2, "freezes": [
        old_record(&format!("unit://{}", name(&u1)), &u1),
        old_record(&format!("docker://{id}"), &nested),
        old_record(&format!("unit://{}", name(&u3)), &u3),
    ]});
    std::fs::create_dir_all(dir.join("state")).unwrap();
    std::fs::write(dir.join("state/freezes.json"), ledger.to_string()).unwrap();
    for cg in [&u1, &nested, &u3] {
        std::fs::write(cg.dir().join("cgroup.freeze"), "1").unwrap();
        assert!(cg.wait_frozen(true));
    }
    let sc = Scenario::create(&one_gpu(&[
        (p1.pid(), 3 * GIB),
        (p2.pid(), 3 * GIB),
        (p3.pid(), GIB),
    ]))
    .unwrap();
    let agent = AgentProcess::start_in(dir, &sc, &[], "200ms");
    assert!(
        u3.wait_frozen(false),
        "within quota now: thawed\n{}",
        agent.log()
    );
    agent.wait_state(&unit_key(&u1), "frozen");
    agent.wait_state(&unit_key(&u2), "frozen");
    let s = agent.steps_over(Duration::from_secs(1), |s| {
        for k in [unit_key(&u1), unit_key(&u2)] {
            let row = workload(s, &k, "all");
            assert!(row.is_some_and(|r| r.state == "frozen"), "{k}: {row:?}");
        }
    });
    assert!(
        u1.is_frozen() && nested.is_frozen(),
        "nothing still over quota thawed"
    );
    assert!(
        !s.workloads
            .iter()
            .any(|w| w.workload.starts_with("docker://")),
        "the nested container is no workload of its own"
    );
    let ledger = std::fs::read_to_string(agent.ledger()).unwrap();
    assert!(
        ledger.contains(&unit_key(&u2)),
        "rewritten under the new key: {ledger}"
    );
    assert!(!ledger.contains(&format!("docker://{id}")), "{ledger}");
    drop((p1, p2, p3));
}
