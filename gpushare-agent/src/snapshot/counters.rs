//! The snapshot's monotonic totals, typed where the agent knows them as types: enforcement
//! actions by (action, result), the Kubernetes clients' counts by name, and totals by kind as a
//! [`Tally`] of the label values the counting module names (`thawed`, `exited`, ...). Each reader
//! labels them from these fields; a counter added is a field here and its series in one family
//! of `metrics/` (one file a subject).

use std::{borrow::Cow, collections::BTreeMap, sync::Arc};

use serde::{Deserialize, Deserializer, Serialize, Serializer, ser::SerializeMap};

/// Monotonic totals.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Enforcement actions by action and the executor's result.
    pub enforcement_actions: ActionCounts,
    /// Kernel events by kind.
    pub ebpf_events: Tally,
    /// Events the kernel could not put in the ring buffer.
    pub ebpf_events_lost: u64,
    /// NVML errors by call.
    pub nvml_errors: Tally,
    /// ioctls by workload (of live GPU tasks); shared with the last snapshot while no total
    /// changed.
    pub gpu_ioctls: Arc<BTreeMap<String, u64>>,
    /// Whether the last quota configuration loaded cleanly.
    pub quota_config_valid: bool,
    /// When the quota configuration was last (re)loaded, seconds since the epoch.
    pub quota_config_last_reload_unix: f64,
    /// Changes the agent found made behind its back, by kind (`thawed`, `gone`, `replaced`,
    /// `adopted`: an earlier run's freeze taken over).
    #[serde(default)]
    pub external_changes: Tally,
    /// Attribution's identity checks, by kind (`exited`, `stale_identity`, `unverifiable`).
    #[serde(default)]
    pub identity: Tally,
    /// Work attribution did whose amount processes choose, by kind (`fd_entries_read`,
    /// `cgroup_rescans`, ...: `attribution::tracker::Work`).
    #[serde(default)]
    pub attribution_work: Tally,
    /// Malformed environment-quota variables and unreadable runtime specs seen.
    #[serde(default)]
    pub env_quota_errors: u64,
    /// Workloads whose `ALIYUN_COM_GPU_MEM_DEV` disagrees with `gpushare_memory_unit`, and what
    /// it says.
    #[serde(default)]
    pub env_quota_unit_mismatch: BTreeMap<String, String>,
    /// Workload-identity events: `conflict` (two roots claimed one container or pod identity),
    /// `record_mismatch` (a container's runtime record names another group).
    #[serde(default)]
    pub workload_identity: Tally,
    /// Where workloads' quota variables and the devices their runtime gave disagree, or hold a
    /// value no plugin writes, by kind (`not_granted`, `other_granted`, `beyond_granted`,
    /// `no_plugin_value`).
    #[serde(default)]
    pub env_quota_disagreements: Tally,
    /// Suspend steps that fell through, by reason.
    #[serde(default)]
    pub suspend_fallthroughs: Tally,
    /// GPU memory moved off the GPU by suspends since the agent started, bytes.
    #[serde(default)]
    pub suspended_bytes_total: u64,
    /// The API server's reads and the Kubernetes Events posted, when they run.
    #[serde(default)]
    pub kubernetes: KubeCounters,
}

/// Totals by kind: each kind a label value the module that counts it names (`thawed`,
/// `exited`, `open_checks`, an NVML call, a suspend's cause), filled from its `(kind, total)`
/// pairs as they come (`collect()`), with no name copied when it is `&'static str`. Serialized as
/// an object keyed by label value, in label order, as the string maps it replaces were.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Tally(BTreeMap<Cow<'static, str>, u64>);

impl Tally {
    /// Adds `n` to `kind`'s total.
    pub fn add(&mut self, kind: impl Into<Cow<'static, str>>, n: u64) {
        *self.0.entry(kind.into()).or_default() += n;
    }

    /// `kind`'s total, `None` when it was never counted.
    pub fn get(&self, kind: &str) -> Option<u64> {
        self.0.get(kind).copied()
    }

    /// Each kind and its total, in label order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.into_iter()
    }
}

impl<K: Into<Cow<'static, str>>> FromIterator<(K, u64)> for Tally {
    fn from_iter<I: IntoIterator<Item = (K, u64)>>(pairs: I) -> Self {
        let mut out = Self::default();
        for (k, n) in pairs {
            out.add(k, n);
        }
        out
    }
}

impl<'t> IntoIterator for &'t Tally {
    type Item = (&'t str, u64);
    type IntoIter = std::iter::Map<
        std::collections::btree_map::Iter<'t, Cow<'static, str>, u64>,
        fn((&'t Cow<'static, str>, &'t u64)) -> (&'t str, u64),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, n)| (k.as_ref(), *n))
    }
}

/// An action and what its executor answered, as labels (`freeze`, `ok`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ActionResult {
    /// The action (`alert`, `signal`, `freeze`, ...).
    pub action: Cow<'static, str>,
    /// The executor's result (`ok`, `pending`, `failed`, ...).
    pub result: Cow<'static, str>,
}

/// Enforcement actions counted by [`ActionResult`], in label order. Serialized as it always was:
/// an object keyed `action/result` (no label value holds a `/` or a character sorting before
/// it, so the order is the keys' order too).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActionCounts(BTreeMap<ActionResult, u64>);

impl ActionCounts {
    /// Adds `n` to `action`'s count with `result`.
    pub fn add(
        &mut self,
        action: impl Into<Cow<'static, str>>,
        result: impl Into<Cow<'static, str>>,
        n: u64,
    ) {
        let key = ActionResult {
            action: action.into(),
            result: result.into(),
        };
        *self.0.entry(key).or_default() += n;
    }

    /// How many `action`s had `result` (0 when none).
    pub fn get(&self, action: &str, result: &str) -> u64 {
        self.iter()
            .find(|(k, _)| k.action == action && k.result == result)
            .map_or(0, |(_, n)| n)
    }

    /// Each (action, result) and its count, in label order.
    pub fn iter(&self) -> impl Iterator<Item = (&ActionResult, u64)> {
        self.0.iter().map(|(k, n)| (k, *n))
    }
}

impl Serialize for ActionCounts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, n) in &self.0 {
            m.serialize_entry(&format_args!("{}/{}", k.action, k.result), n)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for ActionCounts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut out = Self::default();
        for (k, n) in BTreeMap::<String, u64>::deserialize(d)? {
            let (action, result) = k.split_once('/').unwrap_or((&k, ""));
            out.add(action.to_string(), result.to_string(), n);
        }
        Ok(out)
    }
}

/// The API server's watch: what it read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApiCounters {
    /// Objects read (pods, claims).
    pub reads: u64,
    /// Reads that failed.
    pub errors: u64,
    /// Annotation edits on a running container, ignored.
    pub annotation_edits_ignored: u64,
}

/// The Event poster: what became of the Events the step queued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventCounters {
    /// Posted afresh.
    pub created: u64,
    /// Counted on an Event posted before (the correlator).
    pub patched: u64,
    /// Held back by the spam filter.
    pub skipped: u64,
    /// Dropped: the queue was full.
    pub dropped: u64,
    /// Posts that failed.
    pub errors: u64,
}

/// The Kubernetes clients' counts, each where its client runs. Serialized as it always was: an
/// object of the running clients' counts keyed by their label values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KubeCounters {
    /// The API server's watch (`[kubernetes] api`).
    pub api: Option<ApiCounters>,
    /// The Event poster (`[kubernetes] events`).
    pub events: Option<EventCounters>,
}

impl KubeCounters {
    /// Each running client's counts with its label value (`api_reads`, `events_created`, ...),
    /// in label order.
    pub fn labelled(&self) -> impl Iterator<Item = (&'static str, u64)> {
        let (a, e) = (self.api.as_ref(), self.events.as_ref());
        [
            (
                "annotation_edits_ignored",
                a.map(|a| a.annotation_edits_ignored),
            ),
            ("api_errors", a.map(|a| a.errors)),
            ("api_reads", a.map(|a| a.reads)),
            ("events_created", e.map(|e| e.created)),
            ("events_dropped", e.map(|e| e.dropped)),
            ("events_errors", e.map(|e| e.errors)),
            ("events_patched", e.map(|e| e.patched)),
            ("events_skipped", e.map(|e| e.skipped)),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
    }
}

impl Serialize for KubeCounters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.labelled())
    }
}

impl<'de> Deserialize<'de> for KubeCounters {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut out = Self::default();
        for (k, n) in BTreeMap::<String, u64>::deserialize(d)? {
            let (api, events) = (&mut out.api, &mut out.events);
            match k.as_str() {
                "api_reads" => api.get_or_insert_default().reads = n,
                "api_errors" => api.get_or_insert_default().errors = n,
                "annotation_edits_ignored" => {
                    api.get_or_insert_default().annotation_edits_ignored = n
                }
                "events_created" => events.get_or_insert_default().created = n,
                "events_patched" => events.get_or_insert_default().patched = n,
                "events_skipped" => events.get_or_insert_default().skipped = n,
                "events_dropped" => events.get_or_insert_default().dropped = n,
                "events_errors" => events.get_or_insert_default().errors = n,
                _ => {}
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_serialize_as_they_always_did_and_back() {
        let mut c = Counters::default();
        c.enforcement_actions.add("freeze", "pending", 1);
        c.enforcement_actions.add("alert", "ok", 1);
        c.enforcement_actions.add("freeze", "ok", 2);
        c.enforcement_actions.add("freeze", "ok", 1);
        c.kubernetes.events = Some(EventCounters {
            created: 3,
            skipped: 1,
            ..Default::default()
        });
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(
            serde_json::to_string(&json["enforcement_actions"]).unwrap(),
            r#"{"alert/ok":1,"freeze/ok":3,"freeze/pending":1}"#
        );
        assert_eq!(
            serde_json::to_string(&json["kubernetes"]).unwrap(),
            r#"{"events_created":3,"events_dropped":0,"events_errors":0,"events_patched":0,"events_skipped":1}"#
        );
        let back: Counters = serde_json::from_value(json).unwrap();
        assert_eq!(back.enforcement_actions, c.enforcement_actions);
        assert_eq!(back.enforcement_actions.get("freeze", "ok"), 3);
        assert_eq!(back.kubernetes, c.kubernetes);
        let mut t: Tally = [("thawed", 1), ("adopted", 2)].into_iter().collect();
        t.add("thawed", 2);
        t.add(String::from("host_memory"), 1);
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(text, r#"{"adopted":2,"host_memory":1,"thawed":3}"#);
        let back: Tally = serde_json::from_str(&text).unwrap();
        assert_eq!(back, t);
        assert_eq!((back.get("thawed"), back.get("gone")), (Some(3), None));
        let none: KubeCounters = serde_json::from_str("{}").unwrap();
        assert_eq!(none, KubeCounters::default());
        assert_eq!(serde_json::to_string(&none).unwrap(), "{}");
    }
}
