//! A fleet of agents against one API server (issue 43): N watchers (the agent's
//! `kube::api::spawn_watcher`, each with its own client and TLS connection, as tasks in one
//! process) against the fake API server of the integration tests (`tests/integration/fake_api.rs`:
//! resourceVersions, bookmarks, 410, dropped connections, requests counted by kind). Each node
//! runs 10 pods with a claim each. Prints, for the fleet:
//! 1. the start (a rollout): lists, claim GETs and watches per node;
//! 2. at rest over a window: requests per node per hour (the watches' renewals come on top, one
//!    per watch per server timeout, ~290 s: ~12 an hour, not in a short window);
//! 3. the view latency after a change (a new pod with its claim): median and slowest node;
//! 4. every watch dropped at once (an API server restart) with a change meanwhile: the time to
//!    every node's view, and the relists it cost (none: each resumes from its resourceVersion);
//! 5. the same with the resourceVersion compacted (410): one relist per node.
//!
//! Run: `cargo bench -p gpushare-agent --bench fleet` (`GPUSHARE_BENCH_FLEET_N`, default 200;
//! `GPUSHARE_BENCH_FLEET_REST_SECS`, default 20; `GPUSHARE_BENCH_QUICK=1`: 5 nodes, 2 s). No root,
//! no GPU.

#[allow(dead_code)]
#[path = "../tests/integration/fake_api.rs"]
mod fake_api;

use std::time::{Duration, Instant};

use fake_api::{FakeApi, NODE, State, claim, pod};
use gpushare_agent::{
    kube::api::{self, KubeWatch},
    quota::{GpuShareUnit, KubernetesSettings},
};
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
    // Every node's watch open: what follows is the steady state.
    let end = Instant::now() + Duration::from_secs(60);
    while api.with(|s| s.watches) < n {
        assert!(Instant::now() < end, "every node watching");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (before, b, bytes0) = api.with(|s| (s.requests.len(), counts(s), s.bytes));
    tokio::time::sleep(Duration::from_secs(rest)).await;
    let (after, a, bytes1) = api.with(|s| (s.requests.len(), counts(s), s.bytes));
    let during = after - before;
    println!(
        "2. at rest for {rest} s: {during} requests from {n} nodes ({} lists, {} gets, {} watches) \
         = {:.1} per node per hour (+ ~12.4 watch renewals an hour by design); {:.1} KiB per \
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
    // A relist is as many list requests as its pages: 13 pods a node are 2 pages of 10.
    let pages = (pods.len() as u32).div_ceil(api::PAGE);
    println!(
        "   list requests: {} ({:.2} per node; one relist of {} pods is {pages} page(s) of {})",
        l2 - l1,
        (l2 - l1) as f64 / n as f64,
        pods.len(),
        api::PAGE
    );
}

fn main() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(bench());
}
