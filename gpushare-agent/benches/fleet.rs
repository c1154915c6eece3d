//! A fleet of agents against one API server (issue 43): N watchers (the agent's
//! `kube::api::spawn_watcher`, each with its own client and TLS connection, as tasks in one
//! process) against the fake API server of the integration tests (the `gpushare-fake-kube` crate:
//! resourceVersions, bookmarks, 410, dropped connections, requests counted by kind). Each node
//! runs 10 pods with a claim each. Prints, for the fleet:
//! 1. the start (a rollout): lists, claim GETs and watches per node;
//! 2. at rest over a window: requests per node per hour (the watches' renewals come on top, one
//!    per watch per server timeout, ~290 s: ~12 an hour, not in a short window);
//! 3. the view latency after a change (a new pod with its claim): median and slowest node;
//! 4. every watch dropped at once (an API server restart) with a change meanwhile: the time to
//!    every node's view, and the relists it cost (none: each resumes from its resourceVersion);
//! 5. the same with the resourceVersion compacted (410): one relist per node;
//! 6. every workload on one node turning bad at once, ten steps running: the Event writes
//!    (creates and patches) that node's poster makes.
//!
//! Run: `cargo bench -p gpushare-agent --bench fleet` (`GPUSHARE_BENCH_FLEET_N`, default 200;
//! `GPUSHARE_BENCH_FLEET_REST_SECS`, default 20; `GPUSHARE_BENCH_QUICK=1`: 5 nodes, 2 s). No root,
//! no GPU. Base against head in one run: `scripts/bench-fleet-ab.sh BASE_REV` builds this file
//! against the agent of BASE_REV too (it uses only what the polling agent before issue 43 had:
//! `api::connect`, `api::spawn_watcher`, `KubeWatch::current`, `events::spawn_poster`), so it
//! must keep to that.

use std::time::{Duration, Instant};

use gpushare_agent::{
    kube::{
        api::{self, KubeWatch},
        events::{self, PodEvent},
    },
    quota::{GpuShareUnit, KubernetesSettings},
};
use gpushare_fake_kube::{FakeApi, NODE, State, claim, pod};
use serde_json::{Value, json};

fn id(i: usize) -> String {
    format!("{i:064x}")
}

fn one(i: usize) -> (Value, Value, String) {
    let cid = id(0x1000 + i);
    let uid = format!("00000000-0000-0000-0000-{i:012x}");
    let name = format!("p{i}");
    let claim_name = format!("{name}-gpu");
    (
        pod(
            "ml",
            &name,
            &uid,
            json!({}),
            &[("c", &cid, &["gpu"])],
            &[("gpu", &claim_name)],
        ),
        claim("ml", &claim_name, "gpu-0", "1Gi"),
        cid,
    )
}

/// `name` from the environment, else `default`, else (`GPUSHARE_BENCH_QUICK=1`: a smoke run
/// whose figures are not judged, as `cargo xtask test` runs every bench) `quick`.
fn env(name: &str, default: u64, quick: u64) -> u64 {
    let quick_run = std::env::var_os("GPUSHARE_BENCH_QUICK").is_some_and(|v| v == "1");
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick_run { quick } else { default })
}

fn counts(s: &State) -> (usize, usize, usize) {
    (s.lists, s.gets, s.watches)
}

/// Waits until every node's view grants container `cid`; each node's latency from `t0`.
async fn all_see(fleet: &[KubeWatch], cid: &str, t0: Instant) -> Vec<Duration> {
    let mut seen: Vec<Option<Duration>> = vec![None; fleet.len()];
    let end = t0 + Duration::from_secs(120);
    while seen.iter().any(Option::is_none) {
        assert!(Instant::now() < end, "not every node saw {cid} in 120 s");
        for (w, s) in fleet.iter().zip(seen.iter_mut()) {
            if s.is_none() && w.current().containers.contains_key(cid) {
                *s = Some(t0.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut out: Vec<Duration> = seen.into_iter().flatten().collect();
    out.sort();
    out
}

fn said(what: &str, lat: &[Duration]) {
    println!(
        "{what}: median {:?}, slowest {:?}",
        lat[lat.len() / 2],
        lat[lat.len() - 1]
    );
}

async fn bench() {
    let n = env("GPUSHARE_BENCH_FLEET_N", 200, 5) as usize;
    let rest = env("GPUSHARE_BENCH_FLEET_REST_SECS", 20, 2);
    let api = FakeApi::start();
    let mut pods: Vec<(Value, Value, String)> = (0..10).map(one).collect();
    let serve = |pods: &[(Value, Value, String)], s: &mut State| {
        s.replace(
            pods.iter().map(|p| p.0.clone()).collect(),
            pods.iter().map(|p| p.1.clone()).collect(),
        )
    };
    api.with(|s| serve(&pods, s));
    let settings = KubernetesSettings {
        api: true,
        node_name: Some(NODE.into()),
        service_account_dir: api.sa_dir.path().into(),
        api_server: Some(format!("https://127.0.0.1:{}", api.addr.port())),
        ..KubernetesSettings::default()
    };
    let t0 = Instant::now();
    let fleet: Vec<KubeWatch> = (0..n)
        .map(|_| {
            let c = api::connect(&settings).expect("a client");
            api::spawn_watcher(c, GpuShareUnit::GiB)
        })
        .collect();
    let lat = all_see(&fleet, &pods[9].2, t0).await;
    let ((l, g, w), bytes) = api.with(|s| (counts(s), s.bytes));
    println!("fleet of {n} nodes, 10 pods and 10 claims each, one fake API server");
    said("1. start: every node's first view", &lat);
    println!(
        "   per node: {:.1} lists, {:.1} claim GETs, {:.1} watches, {:.1} KiB served",
        l as f64 / n as f64,
        g as f64 / n as f64,
        w as f64 / n as f64,
        bytes as f64 / n as f64 / 1024.0
    );
    // Every node's watch open (an agent that polls opens none): what follows is the steady
    // state.
    let end = Instant::now() + Duration::from_secs(60);
    let polls = Instant::now() + Duration::from_secs(5);
    loop {
        let w = api.with(|s| s.watches);
        if w >= n || (w == 0 && Instant::now() > polls) {
            break;
        }
        assert!(Instant::now() < end, "every node watching");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (before, b, bytes0) = api.with(|s| (s.requests.len(), counts(s), s.bytes));
    tokio::time::sleep(Duration::from_secs(rest)).await;
    let (after, a, bytes1) = api.with(|s| (s.requests.len(), counts(s), s.bytes));
    let during = after - before;
    println!(
        "2. at rest for {rest} s: {during} requests from {n} nodes ({} lists, {} gets, {} watches) \
         = {:.1} per node per hour (a watch's renewals, ~12 an hour, come on top); {:.1} KiB per \
         node per hour served (the fake's bookmarks: one a second, the API server's ~one a minute)",
        a.0 - b.0,
        a.1 - b.1,
        a.2 - b.2,
        during as f64 / n as f64 * 3600.0 / rest as f64,
        (bytes1 - bytes0) as f64 / n as f64 * 3600.0 / rest as f64 / 1024.0
    );
    pods.push(one(10));
    let t1 = Instant::now();
    api.with(|s| serve(&pods, s));
    said(
        "3. a new pod and claim, to every node's view",
        &all_see(&fleet, &pods[10].2, t1).await,
    );
    let (l0, ..) = api.with(|s| counts(s));
    pods.push(one(11));
    let t2 = Instant::now();
    api.with(|s| {
        s.drops += 1;
        serve(&pods, s);
    });
    said(
        "4. every watch dropped, a change meanwhile",
        &all_see(&fleet, &pods[11].2, t2).await,
    );
    let (l1, ..) = api.with(|s| counts(s));
    println!("   list requests (relists): {}", l1 - l0);
    let r1 = api.with(|s| s.requests.len());
    pods.push(one(12));
    let t3 = Instant::now();
    api.with(|s| {
        s.drops += 1;
        serve(&pods, s);
        s.oldest_rv = s.rv;
    });
    said(
        "5. every watch dropped and compacted (410)",
        &all_see(&fleet, &pods[12].2, t3).await,
    );
    let (l2, ..) = api.with(|s| counts(s));
    // A relist is as many list requests as its pages (a paged list's later pages name `continue`).
    let firsts = api.with(|s| {
        s.requests[r1..]
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/pods?") && !r.contains("watch=true"))
            .filter(|r| !r.contains("continue="))
            .count()
    });
    println!(
        "   list requests: {} ({:.2} per node), of which relists (first pages): {firsts} ({:.2} per \
         node)",
        l2 - l1,
        (l2 - l1) as f64 / n as f64,
        firsts as f64 / n as f64,
    );
    drop(fleet);
    events_flood(&api, &settings).await;
}

/// 6.: 100 workloads on one node turn bad at once and stay bad for ten steps (a second apart,
/// squeezed to 50 ms here), each step's verdict naming the memory used (a message that changes
/// every step): the Event writes the node's poster makes, by kind.
async fn events_flood(api: &FakeApi, settings: &KubernetesSettings) {
    let client = api::connect(settings).expect("a client").client;
    let poster = events::spawn_poster(client, NODE.into());
    let (workloads, steps) = (100, 10);
    for step in 0..steps {
        for w in 0..workloads {
            poster.send(PodEvent {
                namespace: "ml".into(),
                pod: format!("p{w}"),
                uid: format!("00000000-0000-0000-0000-{w:012x}"),
                warning: true,
                reason: "GpuMemoryOverQuota".into(),
                message: format!("uses {}.{step} GiB over a 1 GiB grant", 2 + w % 3),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = poster.stats();
    let done = || {
        let r = std::sync::atomic::Ordering::Relaxed;
        s.created_total.load(r)
            + s.patched_total.load(r)
            + s.skipped_total.load(r)
            + s.dropped_total.load(r)
            + s.errors_total.load(r)
    };
    let end = Instant::now() + Duration::from_secs(120);
    while done() < (workloads * steps) as u64 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (posts, patches) = api.with(|s| {
        let n = |m: &str| s.writes.iter().filter(|w| w.0 == m).count();
        (n("POST"), n("PATCH"))
    });
    let r = std::sync::atomic::Ordering::Relaxed;
    println!(
        "6. {workloads} workloads on one node bad at once for {steps} steps ({} occurrences): \
         {} Event writes ({posts} creates, {patches} patches); skipped {}, dropped {}",
        workloads * steps,
        posts + patches,
        s.skipped_total.load(r),
        s.dropped_total.load(r),
    );
}

fn main() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(bench());
}
