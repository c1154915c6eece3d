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
    // Another message is another Event.
    let other = ev("a", "GpuMemoryFrozen", "frozen, 5 GiB");
    assert!(matches!(
        c.correlate(&other, t0, || "x".into()),
        Post::Create { .. }
    ));
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
    let mut c = Correlator::new(1000, SPAM_REFILL);
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
