//! Kubernetes Events on a pod for each isolation step and its end, as client-go's recorder
//! posts them: a spam filter per source and object (a burst of [`SPAM_BURST`], then one token
//! every [`SPAM_REFILL`]; client-go's `EventSourceObjectSpamFilter` with `defaultSpamBurst` and
//! `defaultSpamQPS`), and repeats of one event (same object, type, reason and message) counted on
//! ONE Event by a PATCH of its `count`, `lastTimestamp` and `series` (count and last seen, as
//! the events API records a series) rather than posted anew (client-go's
//! `EventCorrelator`/`eventLogger`). As there, a repeat the filter skips still counts: the next
//! PATCH carries every occurrence.
//!
//! Issue 43 (a fleet: one bad image on thousands of nodes): occurrences are aggregated by
//! (object, type, reason), not by message (a verdict's message carries the memory used, which
//! changes with each): ONE Event per pod and reason, its `count` the occurrences and its
//! `message` the latest (client-go's `EventAggregator` combines similar events the same way); and
//! a node budget ([`NODE_BURST`] at once, then [`NODE_BURST`] a minute) bounds what one node posts
//! when every workload on it turns bad at once. What the budget holds back is skipped and still
//! counted (the next PATCH carries it; `events_skipped` in the metrics).
//!
//! Design note: [`Correlator`] is pure (the clock is passed in); the step hands each event to a
//! bounded channel ([`EventSender::send`], never waits; a full channel drops it, counted) and
//! [`spawn_poster`]'s task correlates and posts.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::{
    api::core::v1::{Event, EventSeries, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
    jiff::Timestamp,
};
use log::{debug, warn};
use tokio::sync::mpsc;

/// Events a source may post about one object at once (client-go's `defaultSpamBurst`).
pub const SPAM_BURST: u32 = 25;
/// One more token every this long (client-go's `defaultSpamQPS` = 1/300).
pub const SPAM_REFILL: Duration = Duration::from_secs(300);
/// Objects and events remembered (client-go's `maxLruCacheEntries`).
pub const CACHE_ENTRIES: usize = 4096;
/// Events waiting for the poster.
pub const QUEUE: usize = 256;
/// Writes (creates and patches) one node may make at once, and per minute after.
pub const NODE_BURST: u32 = 60;
/// The `source.component` and `reportingComponent` of our Events.
pub const COMPONENT: &str = "gpushare-agent";

/// One event about a pod, before correlation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodEvent {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's UID.
    pub uid: String,
    /// `Warning` (an isolation step) or `Normal` (its end).
    pub warning: bool,
    /// CamelCase reason: `GpuMemoryFrozen`, `GpuMemoryThawed`, …
    pub reason: String,
    /// What happened, with used and quota on which GPU, the quota's source and what the
    /// operator can do.
    pub message: String,
}

impl PodEvent {
    fn spam_key(&self) -> (String, String, String) {
        (self.namespace.clone(), self.pod.clone(), self.uid.clone())
    }

    /// What makes occurrences one Event: the object, the type and the reason (not the message).
    fn aggregate_key(&self) -> AggregateKey {
        (
            self.namespace.clone(),
            self.pod.clone(),
            self.uid.clone(),
            self.warning,
            self.reason.clone(),
        )
    }
}

/// What to send for one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Post {
    /// POST a new Event named `name` with `count`.
    Create {
        /// The Event's name.
        name: String,
        /// Occurrences so far (1 unless an earlier create failed).
        count: i32,
    },
    /// PATCH the Event `name` to `count`.
    Patch {
        /// The Event's name.
        name: String,
        /// Occurrences so far.
        count: i32,
    },
    /// The spam filter skipped it (its occurrence is still counted).
    Skip,
}

/// (namespace, pod, uid, warning, reason).
type AggregateKey = (String, String, String, bool, String);

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug)]
struct Seen {
    name: String,
    count: i32,
    used: u64,
}

/// client-go's correlator: the spam filter and the repeat counter.
#[derive(Debug)]
pub struct Correlator {
    burst: u32,
    refill: Duration,
    buckets: HashMap<(String, String, String), (Bucket, u64)>,
    seen: HashMap<AggregateKey, Seen>,
    node: Bucket,
    node_burst: u32,
    tick: u64,
    skipped_total: u64,
}

impl Default for Correlator {
    fn default() -> Self {
        Self::new(SPAM_BURST, SPAM_REFILL)
    }
}

impl Correlator {
    /// A correlator with `burst` tokens per object, one more every `refill`.
    pub fn new(burst: u32, refill: Duration) -> Self {
        Self {
            burst,
            refill,
            buckets: HashMap::new(),
            seen: HashMap::new(),
            node: Bucket {
                tokens: f64::from(NODE_BURST),
                at: Instant::now(),
            },
            node_burst: NODE_BURST,
            tick: 0,
            skipped_total: 0,
        }
    }

    /// The node's budget: `burst` writes at once, then `burst` a minute ([`NODE_BURST`]).
    pub fn with_node_budget(mut self, burst: u32) -> Self {
        self.node_burst = burst;
        self.node.tokens = f64::from(burst);
        self
    }

    /// Events skipped by the spam filter or the node's budget.
    pub fn skipped_total(&self) -> u64 {
        self.skipped_total
    }

    /// What to send for `e`, seen at `now`; `name` names a new Event (client-go:
    /// `<pod>.<unix nanos in hex>`).
    pub fn correlate(&mut self, e: &PodEvent, now: Instant, name: impl FnOnce() -> String) -> Post {
        self.tick += 1;
        let tick = self.tick;
        // Count it first: a repeat the filter skips is still an occurrence.
        let post = match self.seen.get_mut(&e.aggregate_key()) {
            Some(s) => {
                s.count = s.count.saturating_add(1);
                s.used = tick;
                Post::Patch {
                    name: s.name.clone(),
                    count: s.count,
                }
            }
            None => {
                let name = name();
                evict(&mut self.seen, |s| s.used);
                self.seen.insert(
                    e.aggregate_key(),
                    Seen {
                        name: name.clone(),
                        count: 1,
                        used: tick,
                    },
                );
                Post::Create { name, count: 1 }
            }
        };
        let (burst, refill) = (f64::from(self.burst), self.refill.as_secs_f64());
        if !self.buckets.contains_key(&e.spam_key()) {
            evict(&mut self.buckets, |(_, used)| *used);
        }
        let (b, used) = self.buckets.entry(e.spam_key()).or_insert((
            Bucket {
                tokens: burst,
                at: now,
            },
            tick,
        ));
        *used = tick;
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed / refill).min(burst);
        b.at = now.max(b.at);
        // The node's budget: `node_burst` writes at once, then `node_burst` a minute.
        let n = &mut self.node;
        let node_burst = f64::from(self.node_burst);
        let elapsed = now.saturating_duration_since(n.at).as_secs_f64();
        n.tokens = (n.tokens + elapsed * node_burst / 60.0).min(node_burst);
        n.at = now.max(n.at);
        if b.tokens >= 1.0 && n.tokens >= 1.0 {
            b.tokens -= 1.0;
            n.tokens -= 1.0;
            post
        } else {
            self.skipped_total += 1;
            Post::Skip
        }
    }

    /// A create of `e` failed: the next occurrence creates it again (with its count).
    pub fn forget(&mut self, e: &PodEvent) {
        self.seen.remove(&e.aggregate_key());
    }
}

/// Drops the least recently used entry when `m` is full.
fn evict<K: Clone + Eq + std::hash::Hash, V>(m: &mut HashMap<K, V>, used: impl Fn(&V) -> u64) {
    if m.len() >= CACHE_ENTRIES
        && let Some(k) = m
            .iter()
            .min_by_key(|(_, v)| used(v))
            .map(|(k, _)| k.clone())
    {
        m.remove(&k);
    }
}

/// The step's end of the queue: never waits.
#[derive(Clone)]
pub struct EventSender {
    tx: mpsc::Sender<PodEvent>,
    stats: Arc<EventStats>,
}

/// The poster's counters.
#[derive(Debug, Default)]
pub struct EventStats {
    /// Events dropped because the queue was full.
    pub dropped_total: AtomicU64,
    /// Events skipped by the spam filter.
    pub skipped_total: AtomicU64,
    /// Events created.
    pub created_total: AtomicU64,
    /// Events patched (a repeat counted).
    pub patched_total: AtomicU64,
    /// Posts the API server refused or that failed.
    pub errors_total: AtomicU64,
}

impl EventSender {
    /// Queues `e`; a full queue drops it (counted).
    pub fn send(&self, e: PodEvent) {
        if self.tx.try_send(e).is_err() {
            self.stats.dropped_total.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counters.
    pub fn stats(&self) -> &EventStats {
        &self.stats
    }
}

fn now_time() -> Time {
    Time(Timestamp::now())
}

/// The series of an Event seen `count` times (client-go's aggregation: the count and when it
/// was last seen); none for a first occurrence, as the API server requires a series of at
/// least 2.
fn series(count: i32) -> Option<EventSeries> {
    (count >= 2).then(|| EventSeries {
        count: Some(count),
        last_observed_time: Some(MicroTime(Timestamp::now())),
    })
}

/// The Event object for `e` as client-go's recorder makes it.
pub fn event_object(e: &PodEvent, name: &str, count: i32, host: &str) -> Event {
    let now = now_time();
    Event {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(e.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(e.pod.clone()),
            namespace: Some(e.namespace.clone()),
            uid: Some(e.uid.clone()),
            ..ObjectReference::default()
        },
        reason: Some(e.reason.clone()),
        message: Some(e.message.clone()),
        type_: Some(if e.warning { "Warning" } else { "Normal" }.into()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(host.to_string()),
        }),
        count: Some(count),
        series: series(count),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(format!("{COMPONENT}-{host}")),
        event_time: None::<MicroTime>,
        ..Event::default()
    }
}

/// How long one Event write may take: the client has no read timeout (its watches are idle
/// between changes), so a write to a server that never answers would hold the poster.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

async fn bounded<T>(
    f: impl std::future::Future<Output = Result<T, ::kube::Error>>,
) -> Result<T, ::kube::Error> {
    tokio::time::timeout(WRITE_TIMEOUT, f)
        .await
        .unwrap_or_else(|e| Err(::kube::Error::Service(Box::new(e))))
}

/// Starts the poster: Events go to the API server of `client` as `host` (the node).
pub fn spawn_poster(client: ::kube::Client, host: String) -> EventSender {
    let (tx, mut rx) = mpsc::channel::<PodEvent>(QUEUE);
    let stats = Arc::new(EventStats::default());
    let st = stats.clone();
    tokio::spawn(async move {
        let mut c = Correlator::default();
        let mut said = String::new();
        while let Some(e) = rx.recv().await {
            let name = || {
                let nanos = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos();
                format!("{}.{nanos:x}", e.pod)
            };
            let post = c.correlate(&e, Instant::now(), name);
            st.skipped_total.store(c.skipped_total(), Ordering::Relaxed);
            let api: ::kube::Api<Event> = ::kube::Api::namespaced(client.clone(), &e.namespace);
            let result = match &post {
                Post::Skip => {
                    debug!(
                        "event {} on {}/{} skipped by the spam filter",
                        e.reason, e.namespace, e.pod
                    );
                    continue;
                }
                Post::Create { name, count } => {
                    let obj = event_object(&e, name, *count, &host);
                    let r = bounded(api.create(&Default::default(), &obj))
                        .await
                        .map(|_| ());
                    if r.is_ok() {
                        st.created_total.fetch_add(1, Ordering::Relaxed);
                    } else {
                        c.forget(&e);
                    }
                    r
                }
                Post::Patch { name, count } => {
                    // The latest occurrence's message: one Event aggregates its reason's.
                    let patch = serde_json::json!({
                        "count": count,
                        "lastTimestamp": now_time(),
                        "message": e.message,
                        "series": series(*count),
                    });
                    let r = bounded(api.patch(
                        name,
                        &::kube::api::PatchParams::default(),
                        &::kube::api::Patch::Merge(&patch),
                    ))
                    .await
                    .map(|_| ());
                    match r {
                        Ok(()) => {
                            st.patched_total.fetch_add(1, Ordering::Relaxed);
                            Ok(())
                        }
                        // Gone (expired after its TTL): posted anew with its count, as client-go does.
                        Err(::kube::Error::Api(s)) if s.code == 404 => {
                            let obj = event_object(&e, name, *count, &host);
                            let r = bounded(api.create(&Default::default(), &obj))
                                .await
                                .map(|_| ());
                            if r.is_ok() {
                                st.created_total.fetch_add(1, Ordering::Relaxed);
                            }
                            r
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            if let Err(err) = result {
                st.errors_total.fetch_add(1, Ordering::Relaxed);
                let text = err.to_string();
                if text != said {
                    warn!(
                        "cannot post the Event {} on pod {}/{}: {text}",
                        e.reason, e.namespace, e.pod
                    );
                    said = text;
                }
            } else {
                said.clear();
            }
        }
    });
    EventSender { tx, stats }
}

#[cfg(test)]
mod tests;
