//! The API server as a source (issue 22): DRA consumed capacity and pod annotations become
//! quotas, and isolation steps become Events on the pod. Real cgroups shaped like a pod's
//! (`kubepods/pod<uid>/<container id>`), real processes, the fake GPU, and a fake API server
//! over TLS ([`gpushare_fake_kube`]) that the agent reaches with the service account the test wrote.

use std::time::Duration;

use gpushare_agent::snapshot::{Snapshot, WorkloadView};
use gpushare_fake_kube::{FakeApi, claim, pod};
use gpushare_testkit::nvml::Scenario;
use serde_json::json;

use crate::util::{
    AgentProcess, PlacedGroup, container_id, counter_value, needs_root, one_gpu, pod_uid, sleeping,
};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const FREEZE: &str = "[defaults]\ngrace = \"200ms\"\nladder = [ { action = \"freeze\" } ]\n";

/// The row of `key` on the fake GPU (a DRA claim names its GPU: the quota is per GPU).
fn row<'a>(s: &'a Snapshot, key: &str) -> Option<&'a WorkloadView> {
    s.workloads
        .iter()
        .find(|w| w.workload == key && w.gpu_uuid != "all")
        .or_else(|| s.workloads.iter().find(|w| w.workload == key))
        .map(|w| &**w)
}

/// Pod `ml/<name>` on this node with one container `a` holding a 1 GiB DRA claim on GPU 0, as
/// `api` serves it, and that container's group and sleeping process: (pod uid, container id,
/// group, process).
pub fn one_pod_with_a_claim(
    api: &FakeApi,
    name: &str,
) -> (String, String, PlacedGroup, crate::util::Reaped) {
    let (uid, a) = (pod_uid(), container_id());
    let ga = PlacedGroup::create(&format!("kubepods/pod{uid}/{a}"));
    let pa = sleeping(ga.cg());
    let claim_name = format!("{name}-gpu");
    api.set(
        vec![pod(
            "ml",
            name,
            &uid,
            json!({}),
            &[("a", &a, &["gpu"])],
            &[("gpu", &claim_name)],
        )],
        vec![claim("ml", &claim_name, "gpu-0", "1Gi")],
    );
    (uid, a, ga, pa)
}

fn wait_row(
    agent: &AgentProcess,
    key: &str,
    what: &str,
    ok: impl Fn(&WorkloadView) -> bool,
) -> WorkloadView {
    let s = agent.wait_for(Duration::from_secs(30), |s| row(s, key).is_some_and(&ok));
    row(&s, key)
        .cloned()
        .unwrap_or_else(|| panic!("{key}: {what}; log:\n{}", agent.log()))
}

/// A DRA claim of 2 GiB on `gpu-0` shared by two containers of one pod bounds their union: each
/// uses 1.5 GiB (3 GiB together, under 2 GiB each), so the pod is frozen, whole, with the claim
/// as its quota from `dra`. A container of another pod with its own 1 GiB claim using 512 MiB is
/// under its quota and left alone. (On main: no quota at all; nothing is frozen.)
#[test]
fn a_dra_claims_memory_becomes_the_quota_of_the_containers_that_share_it() {
    needs_root!("a_dra_claims_memory_becomes_the_quota_of_the_containers_that_share_it");
    let api = FakeApi::start();
    let (uid, a, b) = (pod_uid(), container_id(), container_id());
    let (uid2, c) = (pod_uid(), container_id());
    let ga = PlacedGroup::create(&format!("kubepods/pod{uid}/{a}"));
    let gb = PlacedGroup::create(&format!("kubepods/pod{uid}/{b}"));
    let gc = PlacedGroup::create(&format!("kubepods/pod{uid2}/{c}"));
    let (pa, pb, pc) = (sleeping(ga.cg()), sleeping(gb.cg()), sleeping(gc.cg()));
    api.set(
        vec![
            pod(
                "ml",
                "trainer-0",
                &uid,
                json!({}),
                &[("a", &a, &["gpu"]), ("b", &b, &["gpu"])],
                &[("gpu", "trainer-0-gpu")],
            ),
            pod(
                "ml",
                "solo-0",
                &uid2,
                json!({}),
                &[("c", &c, &["gpu"])],
                &[("gpu", "solo-0-gpu")],
            ),
        ],
        vec![
            claim("ml", "trainer-0-gpu", "gpu-0", "2Gi"),
            claim("ml", "solo-0-gpu", "gpu-0", "1Gi"),
        ],
    );
    let sc = Scenario::create(&one_gpu(&[
        (pa.pid(), 3 * GIB / 2),
        (pb.pid(), 3 * GIB / 2),
        (pc.pid(), 512 * MIB),
    ]))
    .unwrap();
    let agent = AgentProcess::start(&sc, &format!("{FREEZE}{}", api.quota_table(false)), &[]);
    let pod_key = format!("pod://{uid}");
    let w = wait_row(&agent, &pod_key, "the sharing pod is frozen", |w| {
        w.state == "frozen"
    });
    assert_eq!(w.quota_bytes, Some(2 * GIB), "{w:?}");
    assert_eq!(w.used_bytes, 3 * GIB, "the union's usage: {w:?}");
    assert_eq!(w.quota_source, "dra", "{w:?}");
    assert_eq!(w.quota_trust, "api_server", "{w:?}");
    assert!(
        ga.cg().wait_frozen(true) && gb.cg().wait_frozen(true),
        "both sharers frozen"
    );
    let s = agent.wait_next_step();
    let solo = s
        .workloads
        .iter()
        .find(|w| w.container_id == c || w.workload.ends_with(&c))
        .unwrap_or_else(|| panic!("the solo container: {:?}", s.workloads));
    assert_eq!(solo.quota_bytes, Some(GIB), "its own claim: {solo:?}");
    assert_eq!(solo.state, "ok");
    assert!(!gc.cg().is_frozen(), "the solo container is left alone");
    let requests = api.with(|s| s.requests.clone());
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("GET /api/v1/pods?") && r.contains("spec.nodeName")),
        "pods listed by node: {requests:?}"
    );
    assert_eq!(
        api.with(|s| s.unauthorized),
        0,
        "the service account's token is sent"
    );
    drop((pa, pb, pc));
}

/// Annotations only lower, and are read as they stood when the container started: a 1 GiB
/// kai-gpu-fractioning limit under a 4 GiB claim is the quota (from `annotation`) and freezes a
/// container using 2 GiB; an 8 GiB annotation over a 1 GiB claim lifts nothing; raising the first
/// annotation to 8 GiB after the start is ignored (and logged). (On main: no quota at all.)
#[test]
fn an_annotation_lowers_never_raises_and_an_edit_after_the_start_is_ignored() {
    needs_root!("an_annotation_lowers_never_raises_and_an_edit_after_the_start_is_ignored");
    let api = FakeApi::start();
    let (uid, a) = (pod_uid(), container_id());
    let (uid2, b) = (pod_uid(), container_id());
    let ga = PlacedGroup::create(&format!("kubepods/pod{uid}/{a}"));
    let gb = PlacedGroup::create(&format!("kubepods/pod{uid2}/{b}"));
    let (pa, pb) = (sleeping(ga.cg()), sleeping(gb.cg()));
    let pods = |limit_a: &str| {
        vec![
            pod(
                "ml",
                "low-0",
                &uid,
                json!({ "nvidia.com/container.a.gpu-memory.limit": limit_a }),
                &[("a", &a, &["gpu"])],
                &[("gpu", "low-0-gpu")],
            ),
            pod(
                "ml",
                "high-0",
                &uid2,
                json!({ "nvidia.com/container.b.gpu-memory.limit": "8Gi" }),
                &[("b", &b, &["gpu"])],
                &[("gpu", "high-0-gpu")],
            ),
        ]
    };
    let claims = vec![
        claim("ml", "low-0-gpu", "gpu-0", "4Gi"),
        claim("ml", "high-0-gpu", "gpu-0", "1Gi"),
    ];
    api.set(pods("1Gi"), claims.clone());
    let sc = Scenario::create(&one_gpu(&[(pa.pid(), 2 * GIB), (pb.pid(), 3 * GIB / 2)])).unwrap();
    let agent = AgentProcess::start(&sc, &format!("{FREEZE}{}", api.quota_table(false)), &[]);
    let key_of = |id: &str| {
        let s = agent.wait_next_step();
        s.workloads
            .iter()
            .find(|w| w.container_id == id || w.workload.ends_with(id))
            .map(|w| w.workload.clone())
            .unwrap_or_else(|| panic!("{id}: {:?}\n{}", s.workloads, agent.log()))
    };
    let (ka, kb) = (key_of(&a), key_of(&b));
    let wa = wait_row(&agent, &ka, "the annotation's 1 GiB freezes it", |w| {
        w.state == "frozen"
    });
    assert_eq!(
        (wa.quota_bytes, wa.quota_source.as_str()),
        (Some(GIB), "annotation"),
        "{wa:?}"
    );
    let wb = wait_row(
        &agent,
        &kb,
        "the claim's 1 GiB, not the annotation's 8 GiB",
        |w| w.state == "frozen",
    );
    // The claim binds on its GPU, the annotation's 8 GiB on every other: both are named.
    assert_eq!(
        (wb.quota_bytes, wb.quota_source.as_str()),
        (Some(GIB), "dra and annotation (the smallest applies)"),
        "{wb:?}"
    );
    // The author raises a's limit after the start: ignored.
    api.set(pods("8Gi"), claims);
    agent.wait_for(Duration::from_secs(30), |_| {
        agent.log().contains("changed after it started")
    });
    for _ in 0..3 {
        agent.wait_next_step();
    }
    let wa = wait_row(
        &agent,
        &ka,
        "still bounded by the annotation as it stood",
        |_| true,
    );
    assert_eq!(
        (wa.quota_bytes, wa.state.as_str()),
        (Some(GIB), "frozen"),
        "{wa:?}"
    );
    drop((pa, pb));
}

/// Issue 41: a native sidecar (an init container with `restartPolicy: Always`) holding a 1 GiB DRA
/// claim and using 2 GiB is frozen by it (on main its claim was never read: no quota at all), and
/// so is an ordinary init container running with one (a GPU warm-up before the containers); a
/// container of a TensorFusion pod (`tensor-fusion.ai/vram-limit: 1Gi`) and one with KAI's
/// CDI-era annotation (`nvidia.cdi.k8s.io/<name>.gpu-memory.limit`), each using 2 GiB, are frozen by
/// them (on main neither spelling was read).
#[test]
fn a_sidecars_claim_and_the_schedulers_own_annotations_bound_their_containers() {
    needs_root!("a_sidecars_claim_and_the_schedulers_own_annotations_bound_their_containers");
    let api = FakeApi::start();
    let (uid, main, side) = (pod_uid(), container_id(), container_id());
    let (uid2, tf) = (pod_uid(), container_id());
    let (uid3, kai) = (pod_uid(), container_id());
    let (uid4, warm) = (pod_uid(), container_id());
    let g_warm = PlacedGroup::create(&format!("kubepods/pod{uid4}/{warm}"));
    let p_warm = sleeping(g_warm.cg());
    let g_main = PlacedGroup::create(&format!("kubepods/pod{uid}/{main}"));
    let g_side = PlacedGroup::create(&format!("kubepods/pod{uid}/{side}"));
    let g_tf = PlacedGroup::create(&format!("kubepods/pod{uid2}/{tf}"));
    let g_kai = PlacedGroup::create(&format!("kubepods/pod{uid3}/{kai}"));
    let (p_main, p_side) = (sleeping(g_main.cg()), sleeping(g_side.cg()));
    let (p_tf, p_kai) = (sleeping(g_tf.cg()), sleeping(g_kai.cg()));
    // The sidecar: the pod helper's second container moved to `spec.initContainers`.
    let mut sidecar_pod = pod(
        "ml",
        "serve-0",
        &uid,
        json!({}),
        &[("main", &main, &[]), ("proxy", &side, &["gpu"])],
        &[("gpu", "serve-0-gpu")],
    );
    let mut init = sidecar_pod["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .split_off(1);
    init[0]["restartPolicy"] = json!("Always");
    sidecar_pod["spec"]["initContainers"] = json!(init);
    let statuses = sidecar_pod["status"]["containerStatuses"]
        .as_array_mut()
        .unwrap()
        .split_off(1);
    sidecar_pod["status"]["initContainerStatuses"] = json!(statuses);
    // An ordinary init container (a GPU warm-up) running with its claim, before any container.
    let mut warm_pod = pod(
        "ml",
        "warm-0",
        &uid4,
        json!({}),
        &[("warmup", &warm, &["gpu"])],
        &[("gpu", "warm-0-gpu")],
    );
    warm_pod["spec"]["initContainers"] = warm_pod["spec"]["containers"].take();
    warm_pod["spec"]["containers"] = json!([{ "name": "app" }]);
    warm_pod["status"]["initContainerStatuses"] = warm_pod["status"]["containerStatuses"].take();
    warm_pod["status"]["containerStatuses"] = json!([]);
    api.set(
        vec![
            sidecar_pod,
            warm_pod,
            pod(
                "ml",
                "tf-0",
                &uid2,
                json!({ "tensor-fusion.ai/vram-limit": "1Gi", "tensor-fusion.ai/vram-request": "1Gi",
                        "tensor-fusion.ai/inject-container": "python" }),
                &[("python", &tf, &[])],
                &[],
            ),
            pod(
                "ml",
                "kai-0",
                &uid3,
                json!({ "nvidia.cdi.k8s.io/trainer.gpu-memory.limit": "1Gi",
                        "nvidia.cdi.k8s.io/trainer.gpu-memory.request": "512Mi" }),
                &[("trainer", &kai, &[])],
                &[],
            ),
        ],
        vec![
            claim("ml", "serve-0-gpu", "gpu-0", "1Gi"),
            claim("ml", "warm-0-gpu", "gpu-0", "1Gi"),
        ],
    );
    let sc = Scenario::create(&one_gpu(&[
        (p_warm.pid(), 2 * GIB),
        (p_main.pid(), 2 * GIB),
        (p_side.pid(), 2 * GIB),
        (p_tf.pid(), 2 * GIB),
        (p_kai.pid(), 2 * GIB),
    ]))
    .unwrap();
    let agent = AgentProcess::start(&sc, &format!("{FREEZE}{}", api.quota_table(false)), &[]);
    let key_of = |id: &str| {
        let s = agent.wait_next_step();
        s.workloads
            .iter()
            .find(|w| w.container_id == id || w.workload.ends_with(id))
            .map(|w| w.workload.clone())
            .unwrap_or_else(|| panic!("{id}: {:?}\n{}", s.workloads, agent.log()))
    };
    for (id, source, what) in [
        (&side, "dra", "the sidecar's claim freezes it"),
        (
            &warm,
            "dra",
            "the running init container's claim freezes it",
        ),
        (&tf, "annotation", "TensorFusion's vram-limit freezes it"),
        (&kai, "annotation", "KAI's CDI-era limit freezes it"),
    ] {
        let w = wait_row(&agent, &key_of(id), what, |w| w.state == "frozen");
        assert_eq!(
            (w.quota_bytes, w.quota_source.as_str()),
            (Some(GIB), source),
            "{what}: {w:?}"
        );
    }
    assert!(g_side.cg().wait_frozen(true) && g_tf.cg().wait_frozen(true));
    assert!(g_kai.cg().wait_frozen(true) && g_warm.cg().wait_frozen(true));
    // The main container holds no claim and no annotation names it: no quota, left alone.
    let s = agent.wait_next_step();
    let m = s
        .workloads
        .iter()
        .find(|w| w.container_id == main || w.workload.ends_with(&main));
    assert!(
        m.is_none_or(|w| w.quota_bytes.is_none() && w.state == "ok"),
        "{m:?}"
    );
    assert!(!g_main.cg().is_frozen());
    drop((p_main, p_side, p_tf, p_kai, p_warm));
}

/// 100 freeze and release cycles of one pod's container give the Events client-go's spam filter
/// allows: 25 writes at once (two Events created, `GpuMemoryFrozen` and `GpuMemoryThawed`, then
/// PATCHes of their counts), never one Event per occurrence; the counts they carry grow with the
/// occurrences. (On main: no Event at all.)
#[test]
fn a_hundred_freeze_and_release_cycles_give_the_events_the_spam_filter_allows_with_counts() {
    needs_root!("a_hundred_freeze_and_release_cycles_give_the_events");
    let api = FakeApi::start();
    let (uid, a, _ga, pa) = one_pod_with_a_claim(&api, "cycler-0");
    let over = one_gpu(&[(pa.pid(), 2 * GIB)]);
    let under = one_gpu(&[(pa.pid(), 512 * MIB)]);
    let sc = Scenario::create(&under).unwrap();
    let quotas = format!(
        "[defaults]\ngrace = \"0s\"\nladder = [ {{ action = \"freeze\" }} ]\n{}",
        api.quota_table(true)
    );
    let agent = AgentProcess::start_in(crate::util::agent_dir(&quotas), &sc, &[], "50ms");
    let key = {
        let s = agent.wait_for(Duration::from_secs(30), |s| {
            s.workloads
                .iter()
                .any(|w| w.workload.ends_with(&a) && w.quota_bytes.is_some())
        });
        s.workloads
            .iter()
            .find(|w| w.workload.ends_with(&a))
            .unwrap()
            .workload
            .clone()
    };
    for i in 0..100 {
        sc.write(&over).unwrap();
        wait_row(&agent, &key, &format!("cycle {i}: frozen"), |w| {
            w.state == "frozen"
        });
        sc.write(&under).unwrap();
        wait_row(&agent, &key, &format!("cycle {i}: released"), |w| {
            w.state == "ok"
        });
    }
    // Let the poster drain.
    let writes = {
        let mut last = 0;
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let n = api.with(|s| s.writes.len());
            if n == last {
                break api.with(|s| s.writes.clone());
            }
            last = n;
        }
    };
    assert_eq!(
        writes.len(),
        25,
        "the burst, then nothing for 5 minutes: {writes:?}"
    );
    let creates: Vec<_> = writes.iter().filter(|w| w.0 == "POST").collect();
    assert_eq!(
        creates.len(),
        2,
        "one Event per reason, repeats patched: {writes:?}"
    );
    let events = api.with(|s| s.events.clone());
    assert_eq!(events.len(), 2, "{events:?}");
    let by_reason = |r: &str| {
        events
            .values()
            .find(|e| e["reason"] == r)
            .unwrap_or_else(|| panic!("no {r}: {events:?}"))
            .clone()
    };
    let frozen = by_reason("GpuMemoryFrozen");
    let thawed = by_reason("GpuMemoryThawed");
    assert_eq!(frozen["type"], "Warning");
    assert_eq!(thawed["type"], "Normal");
    assert_eq!(frozen["involvedObject"]["uid"], uid.as_str());
    assert_eq!(frozen["involvedObject"]["name"], "cycler-0");
    let msg = frozen["message"].as_str().unwrap();
    assert!(
        msg.contains("container a was frozen") && msg.contains("1.0 GiB quota on GPU 0"),
        "{msg}"
    );
    assert!(msg.contains("dra") && msg.contains("To do:"), "{msg}");
    // The counts carried: every occurrence while the burst lasts is written, each Event's count
    // growing by one per write; the last counts add up to the 25 occurrences of the burst. The
    // occurrences after it (at least 175 of the 200 steps) are skipped, counted.
    let count = |e: &serde_json::Value| e["count"].as_i64().unwrap();
    assert_eq!(count(&frozen) + count(&thawed), 25, "{writes:?}");
    assert!(
        count(&frozen) >= 10 && count(&thawed) >= 10,
        "both alternate: {writes:?}"
    );
    for name in events.keys() {
        let counts: Vec<i64> = writes
            .iter()
            .filter(|w| &w.1 == name)
            .map(|w| w.2)
            .collect();
        assert!(
            counts.iter().zip(1..).all(|(c, n)| *c == n),
            "{name}: {counts:?}"
        );
    }
    let metrics = agent.get("/metrics").1;
    let skipped = counter_value(
        &metrics,
        "gpushare_kubernetes_total",
        "what=\"events_skipped\"",
    );
    assert!(skipped >= 175.0, "{skipped}: {metrics}");
    assert_eq!(
        counter_value(
            &metrics,
            "gpushare_kubernetes_total",
            "what=\"events_dropped\""
        ),
        0.0
    );
    drop(pa);
}

/// A tenant who binds pods to the node can make each ~1.3 MiB (256 KiB of annotations, 1 MiB of
/// container arguments): with 160 of them (~200 MiB of pods) on the node, the agent's peak memory
/// (VmHWM) stays under the DaemonSet's 256 MiB limit, as it reads them in pages and keeps only
/// the fields its grants use (issue 43). The peak is measured once every claim was read, that
/// is after the last page.
#[test]
fn a_hundred_and_sixty_pods_of_a_tenants_megabytes_keep_the_agent_under_its_memory_limit() {
    needs_root!("a_hundred_and_sixty_pods_of_a_tenants_megabytes_keep_the_agent_under_its_limit");
    let api = FakeApi::start();
    let n = 160;
    let pods: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let claim_name = format!("big-{i}-gpu");
            let mut p = pod(
                "ml",
                &format!("big-{i}"),
                &pod_uid(),
                json!({ "tenant.example/junk": "a".repeat(256 << 10) }),
                &[("c", &container_id(), &["gpu"])],
                &[("gpu", &claim_name)],
            );
            p["spec"]["containers"][0]["args"] = json!(["b".repeat(1 << 20)]);
            p
        })
        .collect();
    let claims = (0..n)
        .map(|i| claim("ml", &format!("big-{i}-gpu"), "gpu-0", "1Gi"))
        .collect();
    api.set(pods, claims);
    let sc = Scenario::create(&one_gpu(&[])).unwrap();
    let agent = AgentProcess::start(&sc, &api.quota_table(false), &[]);
    let end = std::time::Instant::now() + Duration::from_secs(180);
    while api.with(|s| s.gets) < n {
        assert!(
            std::time::Instant::now() < end,
            "every claim read: {:?}\n{}",
            api.with(|s| (s.lists, s.gets)),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = agent.pid().expect("the agent runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    eprintln!(
        "160 pods of ~1.3 MiB: the agent's peak memory {} MiB ({} lists)",
        kib >> 10,
        api.with(|s| s.lists)
    );
    assert!(kib < 256 << 10, "peak {kib} KiB");
}
