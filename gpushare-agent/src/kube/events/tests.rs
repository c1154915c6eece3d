use super::*;

fn ev(pod: &str, reason: &str, message: &str) -> PodEvent {
    PodEvent {
        namespace: "ml".into(),
        pod: pod.into(),
        uid: format!("uid-{pod}"),
        warning: reason != "GpuMemoryThawed",
        reason: reason.into(),
        message: message.into(),
    }
}

/// Posts of `events` at `at` seconds each, names numbered in order of creation.
fn run(c: &mut Correlator, t0: Instant, events: &[(&PodEvent, u64)]) -> Vec<Post> {
    let mut n = 0;
    events
        .iter()
        .map(|(e, at)| {
            c.correlate(e, t0 + Duration::from_secs(*at), || {
                n += 1;
                format!("{}.{n}", e.pod)
            })
        })
        .collect()
}

#[test]
fn a_repeat_is_a_patch_of_one_event_with_its_count() {
    let mut c = Correlator::default();
    let t0 = Instant::now();
    let f = ev("a", "GpuMemoryFrozen", "frozen");
    let t = ev("a", "GpuMemoryThawed", "thawed");
    let posts = run(&mut c, t0, &[(&f, 0), (&t, 1), (&f, 2), (&t, 3), (&f, 4)]);
    assert_eq!(
        posts,
        vec![
            Post::Create {
                name: "a.1".into(),
                count: 1
            },
            Post::Create {
                name: "a.2".into(),
                count: 1
            },
            Post::Patch {
                name: "a.1".into(),
                count: 2
            },
            Post::Patch {
                name: "a.2".into(),
                count: 2
            },
            Post::Patch {
                name: "a.1".into(),
                count: 3
            },
        ]
    );
    // Another message of the same reason on the same pod is the same Event (issue 43): its
    // count grows, its message becomes the latest (the poster's PATCH carries it).
    let other = ev("a", "GpuMemoryFrozen", "frozen, 5 GiB");
    assert_eq!(
        c.correlate(&other, t0, || "x".into()),
        Post::Patch {
            name: "a.1".into(),
            count: 4
        }
    );
}

/// A flood of one bad verdict on one pod (1,000 occurrences within a second, each message with
/// another amount used) is ONE Event: one create, then patches of its count within the pod's
/// burst; every occurrence counted, the skipped ones carried by the next patch.
#[test]
fn a_flood_of_identical_bad_verdicts_posts_one_aggregated_event() {
    let mut c = Correlator::default();
    let t0 = Instant::now();
    let mut posts = Vec::new();
    for i in 0..1000 {
        let e = ev(
            "a",
            "GpuMemoryFrozen",
            &format!("frozen: {i} MiB used over 1 GiB"),
        );
        posts.extend(run(&mut c, t0, &[(&e, 0)]));
    }
    let creates = posts
        .iter()
        .filter(|p| matches!(p, Post::Create { .. }))
        .count();
    assert_eq!(creates, 1, "one Event: {:?}", &posts[..3]);
    let sent = posts.iter().filter(|p| **p != Post::Skip).count();
    assert_eq!(sent, SPAM_BURST as usize, "the pod's burst");
    assert_eq!(c.skipped_total(), 1000 - u64::from(SPAM_BURST));
    let e = ev("a", "GpuMemoryFrozen", "frozen again");
    assert_eq!(
        c.correlate(&e, t0 + SPAM_REFILL, || unreachable!()),
        Post::Patch {
            name: "a.1".into(),
            count: 1001
        },
        "the next write carries every occurrence"
    );
}

/// Every workload of a node turning bad at once (500 pods, one verdict each) is bounded by the
/// node's budget: [`NODE_BURST`] writes at once, the rest skipped and counted, then
/// [`NODE_BURST`] a minute.
#[test]
fn a_node_posts_at_most_its_budget_when_every_workload_turns_bad_at_once() {
    let mut c = Correlator::default();
    let t0 = Instant::now();
    let all: Vec<PodEvent> = (0..500)
        .map(|i| ev(&format!("p{i}"), "GpuMemoryFrozen", "frozen"))
        .collect();
    let posts: Vec<Post> = all
        .iter()
        .flat_map(|e| run(&mut c, t0, &[(e, 0)]))
        .collect();
    let sent = posts.iter().filter(|p| **p != Post::Skip).count();
    assert_eq!(sent, NODE_BURST as usize);
    assert_eq!(c.skipped_total(), 500 - u64::from(NODE_BURST));
    // A minute later, the budget again (and no more).
    let later = all
        .iter()
        .filter(|e| c.correlate(e, t0 + Duration::from_secs(60), || "n".into()) != Post::Skip)
        .count();
    assert_eq!(later, NODE_BURST as usize);
}

#[test]
fn a_burst_of_25_per_pod_then_one_every_5_minutes_and_skipped_ones_still_count() {
    let mut c = Correlator::default();
    let t0 = Instant::now();
    let f = ev("a", "GpuMemoryFrozen", "frozen");
    let t = ev("a", "GpuMemoryThawed", "thawed");
    // 100 freeze and release cycles within a second.
    let mut posts = Vec::new();
    for _ in 0..100 {
        posts.extend(run(&mut c, t0, &[(&f, 0), (&t, 0)]));
    }
    let sent: Vec<&Post> = posts.iter().filter(|p| **p != Post::Skip).collect();
    assert_eq!(sent.len(), 25, "the burst");
    assert_eq!(c.skipped_total(), 175);
    assert_eq!(
        sent[23],
        &Post::Patch {
            name: "a.2".into(),
            count: 12
        }
    );
    assert_eq!(
        sent[24],
        &Post::Patch {
            name: "a.1".into(),
            count: 13
        }
    );
    // Another pod has its own burst.
    let g = ev("b", "GpuMemoryFrozen", "frozen");
    assert!(matches!(
        c.correlate(&g, t0, || "b.1".into()),
        Post::Create { .. }
    ));
    // 299 s later still nothing; at 300 s one token: the 101st freeze, counted 101.
    let at = |s| t0 + Duration::from_secs(s);
    assert_eq!(c.correlate(&f, at(299), || unreachable!()), Post::Skip);
    assert_eq!(
        c.correlate(&f, at(300), || unreachable!()),
        Post::Patch {
            name: "a.1".into(),
            count: 102
        }
    );
    assert_eq!(c.correlate(&t, at(301), || unreachable!()), Post::Skip);
    // Tokens refill to the burst, not beyond: a day later, 25 again.
    let mut later = 0;
    for i in 0..40 {
        if c.correlate(&t, at(86_400 + i), || unreachable!()) != Post::Skip {
            later += 1;
        }
    }
    assert_eq!(later, 25);
}

#[test]
fn a_failed_create_is_created_again_with_its_count_and_caches_are_bounded() {
    let mut c = Correlator::new(1000, SPAM_REFILL).with_node_budget(u32::MAX);
    let t0 = Instant::now();
    let f = ev("a", "GpuMemoryFrozen", "frozen");
    assert_eq!(
        run(&mut c, t0, &[(&f, 0)]),
        vec![Post::Create {
            name: "a.1".into(),
            count: 1
        }]
    );
    c.forget(&f);
    assert_eq!(
        run(&mut c, t0, &[(&f, 0)]),
        vec![Post::Create {
            name: "a.1".into(),
            count: 1
        }]
    );
    for i in 0..CACHE_ENTRIES + 10 {
        let e = ev(&format!("p{i}"), "GpuMemoryFrozen", "frozen");
        c.correlate(&e, t0, || format!("p{i}.1"));
    }
    assert!(c.seen.len() <= CACHE_ENTRIES && c.buckets.len() <= CACHE_ENTRIES);
    // The most recent are kept; the oldest went first.
    let last = ev(
        &format!("p{}", CACHE_ENTRIES + 9),
        "GpuMemoryFrozen",
        "frozen",
    );
    assert!(matches!(
        c.correlate(&last, t0, || "new".into()),
        Post::Patch { count: 2, .. }
    ));
    assert!(matches!(
        c.correlate(&f, t0, || "new".into()),
        Post::Create { .. }
    ));
}

#[test]
fn a_clock_that_goes_back_gives_no_tokens() {
    let mut c = Correlator::new(1, Duration::from_secs(10));
    let t0 = Instant::now() + Duration::from_secs(100);
    let f = ev("a", "GpuMemoryFrozen", "frozen");
    assert_ne!(c.correlate(&f, t0, || "a.1".into()), Post::Skip);
    assert_eq!(
        c.correlate(&f, t0 - Duration::from_secs(50), || unreachable!()),
        Post::Skip
    );
    assert_eq!(
        c.correlate(&f, t0 + Duration::from_secs(9), || unreachable!()),
        Post::Skip
    );
    assert_ne!(
        c.correlate(&f, t0 + Duration::from_secs(10), || unreachable!()),
        Post::Skip
    );
}

#[test]
fn the_event_object_is_client_gos() {
    let e = ev("a", "GpuMemoryFrozen", "frozen");
    let o = event_object(&e, "a.1", 3, "node-1");
    let v = serde_json::to_value(&o).unwrap();
    assert_eq!(v["involvedObject"]["kind"], "Pod");
    assert_eq!(v["involvedObject"]["uid"], "uid-a");
    assert_eq!(v["involvedObject"]["name"], "a");
    assert_eq!(v["involvedObject"]["namespace"], "ml");
    assert_eq!(v["type"], "Warning");
    assert_eq!(v["count"], 3);
    assert_eq!(v["source"]["component"], COMPONENT);
    assert_eq!(v["source"]["host"], "node-1");
    assert_eq!(v["metadata"]["namespace"], "ml");
    assert_eq!(v["metadata"]["name"], "a.1");
    assert_eq!(v["involvedObject"]["apiVersion"], "v1");
    assert_eq!(v["reason"], "GpuMemoryFrozen");
    assert_eq!(v["message"], "frozen");
    assert_eq!(v["reportingComponent"], COMPONENT);
    assert_eq!(v["reportingInstance"], "gpushare-agent-node-1");
    assert!(
        v["firstTimestamp"].is_string() && v["lastTimestamp"].is_string(),
        "{v}"
    );
    let t = ev("a", "GpuMemoryThawed", "thawed");
    assert_eq!(
        serde_json::to_value(event_object(&t, "a.2", 1, "n")).unwrap()["type"],
        "Normal"
    );
}

/// A fake API server as a tower service: records `(method, path, body)` and answers each call
/// with the next status queued for its method (200/201 when none is queued), the body echoed
/// (a `Status` object for an error, as the API server sends).
#[derive(Default)]
struct FakeApi {
    calls: std::sync::Mutex<Vec<(String, String, serde_json::Value)>>,
    answers: std::sync::Mutex<HashMap<String, std::collections::VecDeque<u16>>>,
}

impl FakeApi {
    fn answer(&self, method: &str, code: u16) {
        self.answers
            .lock()
            .unwrap()
            .entry(method.into())
            .or_default()
            .push_back(code);
    }

    fn calls(&self) -> Vec<(String, String, serde_json::Value)> {
        self.calls.lock().unwrap().clone()
    }

    fn client(self: &Arc<Self>) -> ::kube::Client {
        let f = self.clone();
        let svc = tower::service_fn(move |req: hyper::Request<::kube::client::Body>| {
            let f = f.clone();
            async move {
                let method = req.method().to_string();
                let path = req.uri().path().to_string();
                let body = req.into_body().collect_bytes().await.unwrap_or_default();
                let v: serde_json::Value =
                    serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                f.calls
                    .lock()
                    .unwrap()
                    .push((method.clone(), path, v.clone()));
                let queued = f
                    .answers
                    .lock()
                    .unwrap()
                    .get_mut(&method)
                    .and_then(std::collections::VecDeque::pop_front);
                let code = queued.unwrap_or(if method == "POST" { 201 } else { 200 });
                let out = if code < 300 {
                    serde_json::json!({
                        "apiVersion": "v1", "kind": "Event",
                        "metadata": { "name": v["metadata"]["name"], "namespace": "ml" },
                        "involvedObject": {}
                    })
                } else {
                    serde_json::json!({
                        "apiVersion": "v1", "kind": "Status", "status": "Failure",
                        "message": "refused by the fake", "reason": "Refused", "code": code
                    })
                };
                Ok::<_, std::convert::Infallible>(
                    hyper::Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(http_body_util::Full::new(hyper::body::Bytes::from(
                            out.to_string(),
                        )))
                        .unwrap(),
                )
            }
        });
        ::kube::Client::new(svc, "default")
    }
}

/// Waits (yielding to the poster) until `done`; a poster that never gets there fails the test.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the poster never got to: {what}");
}

/// The poster creates an Event, PATCHes a repeat's count, creates a repeat again (with its
/// count) when the PATCH finds it gone (404) but not on another error, and counts each outcome.
#[tokio::test]
async fn the_poster_creates_patches_and_recreates_a_gone_event() {
    let api = Arc::new(FakeApi::default());
    let s = spawn_poster(api.client(), "node-1".into());
    let f = ev("a", "GpuMemoryFrozen", "frozen");
    let n = |k: &str| api.calls().iter().filter(|c| c.0 == k).count();
    s.send(f.clone());
    until("the create", || n("POST") == 1).await;
    let (_, path, body) = api.calls()[0].clone();
    assert_eq!(path, "/api/v1/namespaces/ml/events");
    assert_eq!(
        (body["count"].as_i64(), body["reason"].as_str()),
        (Some(1), Some("GpuMemoryFrozen"))
    );
    // A first occurrence is no series.
    assert!(body.get("series").is_none(), "{body}");
    let name = body["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("a."), "{name}");
    // A repeat: a PATCH of the count on the same Event.
    s.send(f.clone());
    until("the patch", || n("PATCH") == 1).await;
    let (_, path, body) = api.calls()[1].clone();
    assert_eq!(path, format!("/api/v1/namespaces/ml/events/{name}"));
    assert_eq!(body["count"], 2);
    // The series, as client-go's aggregation gives it: the count and when last seen.
    assert_eq!(body["series"]["count"], 2, "{body}");
    assert!(body["series"]["lastObservedTime"].is_string(), "{body}");
    until("patched counted", || {
        s.stats().patched_total.load(Ordering::Relaxed) == 1
    })
    .await;
    // Another error on the PATCH: counted, nothing created.
    api.answer("PATCH", 500);
    s.send(f.clone());
    until("the error counted", || {
        s.stats().errors_total.load(Ordering::Relaxed) == 1
    })
    .await;
    assert_eq!((n("PATCH"), n("POST")), (2, 1));
    // Gone (404): created again under its name with every occurrence.
    api.answer("PATCH", 404);
    s.send(f.clone());
    until("the re-create", || n("POST") == 2).await;
    let (_, path, body) = api.calls().last().unwrap().clone();
    assert_eq!(path, "/api/v1/namespaces/ml/events");
    assert_eq!(
        (body["metadata"]["name"].as_str(), body["count"].as_i64()),
        (Some(name.as_str()), Some(4))
    );
    assert_eq!(body["series"]["count"], 4, "{body}");
    until("created counted", || {
        s.stats().created_total.load(Ordering::Relaxed) == 2
    })
    .await;
    assert_eq!(s.stats().errors_total.load(Ordering::Relaxed), 1);
    assert_eq!(s.stats().dropped_total.load(Ordering::Relaxed), 0);
}

/// The step never waits: events beyond the queue are dropped and counted; the ones queued are
/// posted (the spam filter's burst of them).
#[tokio::test]
async fn a_full_queue_drops_and_counts() {
    let api = Arc::new(FakeApi::default());
    let s = spawn_poster(api.client(), "node-1".into());
    // The poster does not run until this test yields: the queue fills.
    for i in 0..QUEUE + 10 {
        s.send(ev("a", "GpuMemoryFrozen", &format!("frozen {i}")));
    }
    assert_eq!(s.stats().dropped_total.load(Ordering::Relaxed), 10);
    // One Event (one pod, one reason: the messages differ), its count patched within the burst.
    until("the burst posted", || {
        s.stats().created_total.load(Ordering::Relaxed) == 1
            && s.stats().patched_total.load(Ordering::Relaxed) == u64::from(SPAM_BURST) - 1
            && s.stats().skipped_total.load(Ordering::Relaxed)
                == (QUEUE as u64) - u64::from(SPAM_BURST)
    })
    .await;
}

#[test]
fn an_events_time_is_now() {
    let o = event_object(&ev("a", "GpuMemoryFrozen", "frozen"), "a.1", 1, "n");
    let first = o.first_timestamp.unwrap().0;
    assert!(
        first.as_second() > 1_700_000_000,
        "{first}: the Event's time is when it was made"
    );
}
