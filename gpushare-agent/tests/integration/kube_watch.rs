//! The API server watched, not polled (issue 43): the agent's Kubernetes view against a fake API
//! server with watch semantics ([`gpushare_fake_kube`]: resourceVersions, bookmarks, 410, dropped
//! connections, requests counted by kind). These drive the library's watcher directly (no root,
//! no GPU): what the step reads is [`KubeWatch::current`]. Every wait has a deadline; nothing is
//! slept and then asserted, but for the at-rest window, whose length is the point.

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use gpushare_agent::{
    grants::claims::KubeView,
    kube::api::{self, KubeWatch},
    quota::{GpuShareUnit, KubernetesSettings},
};
use gpushare_fake_kube::{FakeApi, NODE, claim, pod};
use serde_json::{Value, json};

use crate::util::{container_id, pod_uid};

fn settings(api: &FakeApi) -> KubernetesSettings {
    KubernetesSettings {
        api: true,
        node_name: Some(NODE.into()),
        service_account_dir: api.sa_dir.path().into(),
        api_server: Some(format!("https://127.0.0.1:{}", api.addr.port())),
        ..KubernetesSettings::default()
    }
}

fn start(api: &FakeApi, stale: Duration) -> KubeWatch {
    let client = api::connect(&settings(api)).expect("a client");
    api::spawn_watcher_with(client, GpuShareUnit::GiB, stale)
}

/// A running pod `name` whose one container `c` uses its own claim `<name>-gpu` of `memory`.
struct One {
    id: String,
    pod: Value,
    claim: Value,
}

fn one(name: &str, memory: &str) -> One {
    let (uid, id) = (pod_uid(), container_id());
    let claim_name = format!("{name}-gpu");
    One {
        pod: pod(
            "ml",
            name,
            &uid,
            json!({}),
            &[("c", &id, &["gpu"])],
            &[("gpu", &claim_name)],
        ),
        claim: claim("ml", &claim_name, "gpu-0", memory),
        id,
    }
}

fn serve(api: &FakeApi, all: &[&One]) {
    api.set(
        all.iter().map(|o| o.pod.clone()).collect(),
        all.iter().map(|o| o.claim.clone()).collect(),
    );
}

fn has_dra(v: &KubeView, id: &str) -> bool {
    v.containers.get(id).is_some_and(|c| c.dra.is_some())
}

/// Waits (up to `within`) for the published view to satisfy `ok`.
async fn wait_view(
    w: &KubeWatch,
    within: Duration,
    what: &str,
    ok: impl Fn(&KubeView) -> bool,
) -> Arc<KubeView> {
    let end = Instant::now() + within;
    loop {
        let v = w.current();
        if ok(&v) {
            return v;
        }
        assert!(Instant::now() < end, "{what} within {within:?}: {v:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (up to 30 s) for the fake's state to satisfy `ok`.
async fn wait_api(api: &FakeApi, what: &str, ok: impl Fn(&gpushare_fake_kube::State) -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    while !api.with(|s| ok(s)) {
        assert!(
            Instant::now() < end,
            "{what}: {:?}",
            api.with(|s| s.requests.clone())
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const LONG: Duration = Duration::from_secs(60);

/// A token file ending in a newline (as `kubectl create token > file` writes it) is trimmed, as
/// client-go does; a token rotated on disk is used from the next request on, and the server
/// accepts only the new one. (Before: every request failed "invalid bearer token".)
#[tokio::test]
async fn a_token_with_a_trailing_newline_works_and_a_rotated_one_is_picked_up() {
    let api = FakeApi::start();
    api.rotate_token("first-token\n");
    let a = one("tok-a", "1Gi");
    serve(&api, &[&a]);
    let w = start(&api, LONG);
    wait_view(
        &w,
        Duration::from_secs(30),
        "a view read with the trimmed token",
        |v| has_dra(v, &a.id),
    )
    .await;
    assert_eq!(api.with(|s| s.unauthorized), 0);
    api.rotate_token("second-token\n");
    // The server restarts: the next requests must carry the new token.
    api.drop_watches();
    let b = one("tok-b", "1Gi");
    serve(&api, &[&a, &b]);
    wait_view(
        &w,
        Duration::from_secs(30),
        "a change read with the rotated token",
        |v| has_dra(v, &b.id),
    )
    .await;
}

/// At rest (nothing changing) the agent makes no list and no get after the first ones, over a
/// window longer than two of the old polls; a change is then in the view within 2 s (the fake
/// streams it at once). (Before: a list every 3 s and a get per claim each time.)
#[tokio::test]
async fn at_rest_no_list_or_get_and_a_change_is_seen_within_a_bound() {
    let api = FakeApi::start();
    let a = one("rest-a", "1Gi");
    serve(&api, &[&a]);
    let w = start(&api, LONG);
    wait_view(&w, Duration::from_secs(30), "the first view", |v| {
        has_dra(v, &a.id)
    })
    .await;
    let first = api.with(|s| s.requests[0].clone());
    assert!(
        first.contains(&format!("limit={}", api::PAGE)),
        "the first list paged: {first}"
    );
    let before = api.with(|s| (s.lists, s.gets));
    tokio::time::sleep(Duration::from_secs(7)).await;
    let after = api.with(|s| (s.lists, s.gets, s.watches));
    assert_eq!(
        (after.0, after.1),
        before,
        "no list or get at rest: {:?}",
        api.with(|s| s.requests.clone())
    );
    assert_eq!(after.2, 1, "one watch, still open");
    let b = one("rest-b", "2Gi");
    let changed = Instant::now();
    serve(&api, &[&a, &b]);
    wait_view(&w, Duration::from_secs(2), "the new pod's grant", |v| {
        has_dra(v, &b.id)
    })
    .await;
    eprintln!("view latency after a change: {:?}", changed.elapsed());
}

/// A dropped watch is resumed from the last resourceVersion it saw: no relist, and the change
/// made while it was down is in the view. (Before: no watch at all.)
#[tokio::test]
async fn a_dropped_watch_resumes_from_its_resource_version_without_a_relist() {
    let api = FakeApi::start();
    let a = one("drop-a", "1Gi");
    serve(&api, &[&a]);
    let w = start(&api, LONG);
    wait_view(&w, Duration::from_secs(30), "the first view", |v| {
        has_dra(v, &a.id)
    })
    .await;
    wait_api(&api, "a watch open", |s| s.watches == 1).await;
    let (lists, rv) = api.with(|s| (s.lists, s.rv));
    api.drop_watches();
    let b = one("drop-b", "1Gi");
    serve(&api, &[&a, &b]);
    wait_view(
        &w,
        Duration::from_secs(10),
        "the change after the drop",
        |v| has_dra(v, &b.id),
    )
    .await;
    assert_eq!(api.with(|s| s.lists), lists, "no relist");
    let resumed = api.with(|s| {
        s.requests
            .iter()
            .filter(|r| r.contains("watch=true"))
            .nth(1)
            .cloned()
    });
    let resumed = resumed.expect("a second watch");
    assert!(
        resumed.contains(&format!("resourceVersion={rv}")),
        "resumed from {rv}: {resumed}"
    );
}

/// A watch told 410 Gone (its resourceVersion compacted) relists once, then watches again.
#[tokio::test]
async fn a_410_relists_once() {
    let api = FakeApi::start();
    let a = one("gone-a", "1Gi");
    serve(&api, &[&a]);
    let w = start(&api, LONG);
    wait_view(&w, Duration::from_secs(30), "the first view", |v| {
        has_dra(v, &a.id)
    })
    .await;
    wait_api(&api, "a watch open", |s| s.watches == 1).await;
    let lists = api.with(|s| s.lists);
    let b = one("gone-b", "1Gi");
    api.with(|s| {
        s.drops += 1;
        s.replace(
            vec![a.pod.clone(), b.pod.clone()],
            vec![a.claim.clone(), b.claim.clone()],
        );
        s.oldest_rv = s.rv;
    });
    wait_view(
        &w,
        Duration::from_secs(30),
        "the change after the 410",
        |v| has_dra(v, &b.id),
    )
    .await;
    // The watch told 410, then the one after the relist.
    wait_api(&api, "watching again", |s| s.watches >= 3).await;
    assert_eq!(api.with(|s| s.lists), lists + 1, "one relist");
}

/// The API server gone longer than the staleness bound: the running containers' grants are kept
/// (they cannot change while the containers run), said once; when it returns, new pods are seen.
/// (Before: the view was replaced by an empty one.)
#[tokio::test]
async fn a_server_gone_past_the_staleness_bound_keeps_running_grants_said_once() {
    let api = FakeApi::start();
    let a = one("down-a", "1Gi");
    serve(&api, &[&a]);
    let w = start(&api, Duration::from_secs(1));
    wait_view(&w, Duration::from_secs(30), "the first view", |v| {
        has_dra(v, &a.id)
    })
    .await;
    api.with(|s| s.down = true);
    let end = Instant::now() + Duration::from_secs(60);
    while w.stats().errors_total.load(Ordering::Relaxed) < 3 {
        assert!(Instant::now() < end, "errors counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let v = w.current();
    assert!(
        has_dra(&v, &a.id),
        "the running container keeps its grant: {v:?}"
    );
    assert_eq!(
        w.stats().stale_total.load(Ordering::Relaxed),
        1,
        "said once"
    );
    let b = one("down-b", "1Gi");
    api.with(|s| {
        s.replace(
            vec![a.pod.clone(), b.pod.clone()],
            vec![a.claim.clone(), b.claim.clone()],
        );
        s.down = false;
    });
    wait_view(
        &w,
        Duration::from_secs(60),
        "the new pod once it is back",
        |v| has_dra(v, &b.id) && has_dra(v, &a.id),
    )
    .await;
}

/// One claim that fails (500) is that claim's problem: the other pods' grants are published.
/// (Before: one failing GET failed the whole read; nothing was published.)
#[tokio::test]
async fn one_failing_claim_does_not_drop_the_others() {
    let api = FakeApi::start();
    let (a, b) = (one("fail-a", "1Gi"), one("fail-b", "1Gi"));
    api.with(|s| s.failing_claims.push("fail-b-gpu".into()));
    serve(&api, &[&a, &b]);
    let w = start(&api, LONG);
    let v = wait_view(&w, Duration::from_secs(30), "the good claim's grant", |v| {
        has_dra(v, &a.id)
    })
    .await;
    assert!(!has_dra(&v, &b.id), "{v:?}");
    // Once the claim answers, it is read (retried with backoff).
    api.with(|s| s.failing_claims.clear());
    wait_view(
        &w,
        Duration::from_secs(30),
        "the failed claim, retried",
        |v| has_dra(v, &b.id),
    )
    .await;
}

/// A node with more pods than a page is listed in pages (`limit`, `continue`), every pod in the
/// view, then watched.
#[tokio::test]
async fn a_node_with_many_pods_is_listed_in_pages() {
    let api = FakeApi::start();
    let all: Vec<One> = (0..120).map(|i| one(&format!("page-{i}"), "1Gi")).collect();
    serve(&api, &all.iter().collect::<Vec<_>>());
    let w = start(&api, LONG);
    wait_view(
        &w,
        Duration::from_secs(60),
        "every pod of every page",
        |v| all.iter().all(|o| has_dra(v, &o.id)),
    )
    .await;
    let pages = api.with(|s| s.lists);
    assert_eq!(
        pages,
        120usize.div_ceil(api::PAGE as usize),
        "{:?}",
        api.with(|s| s.requests.clone())
    );
}
