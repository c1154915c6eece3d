//! The serde shapes of a quota file: what TOML may hold, before any value is checked. Every field is
//! optional and spanned, so validation can report a missing or wrong value at its place; unknown keys
//! are rejected here (`deny_unknown_fields`) and explained by [`super::explain`].

use serde::Deserialize;
use toml::{Spanned, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileSpec {
    pub(super) protect: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) defaults: Option<Spanned<DefaultsSpec>>,
    pub(super) kubernetes: Option<Spanned<KubernetesSpec>>,
    #[serde(default)]
    pub(super) quota: Vec<Spanned<EntrySpec>>,
}

/// `[kubernetes]`: the agent's sources in the cluster (main file only).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KubernetesSpec {
    // ---- the API server (issue 22b: DRA claims, pod annotations, Events) ----
    pub(super) api: Option<Spanned<bool>>,
    pub(super) events: Option<Spanned<bool>>,
    pub(super) node_name: Option<Spanned<String>>,
    pub(super) service_account_dir: Option<Spanned<String>>,
    pub(super) api_server: Option<Spanned<String>>,
    // ---- pod-resources (the kubelet's socket; issue 22a) ----
    pub(super) pod_resources_socket: Option<Spanned<Value>>,
    pub(super) pod_logs_dir: Option<Spanned<Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DefaultsSpec {
    pub(super) mode: Option<Spanned<Value>>,
    pub(super) tolerance: Option<Spanned<Value>>,
    pub(super) grace: Option<Spanned<Value>>,
    pub(super) ladder: Option<Spanned<Vec<Spanned<StepSpec>>>>,
    pub(super) elastic_reserve: Option<Spanned<Value>>,
    pub(super) gpushare_memory_unit: Option<Spanned<Value>>,
    pub(super) env_quotas: Option<Spanned<bool>>,
    pub(super) context_overhead: Option<Spanned<Value>>,
    pub(super) take_unheld: Option<Spanned<Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EntrySpec {
    pub(super) name: Option<Spanned<String>>,
    pub(super) container: Option<Spanned<String>>,
    pub(super) container_name: Option<Spanned<String>>,
    pub(super) pod_uid: Option<Spanned<String>>,
    pub(super) pod: Option<Spanned<String>>,
    pub(super) cgroup: Option<Spanned<String>>,
    pub(super) unit: Option<Spanned<String>>,
    pub(super) gpu: Option<Spanned<Value>>,
    pub(super) gpu_memory: Option<Spanned<Value>>,
    pub(super) mode: Option<Spanned<Value>>,
    pub(super) tolerance: Option<Spanned<Value>>,
    pub(super) grace: Option<Spanned<Value>>,
    pub(super) ladder: Option<Spanned<Vec<Spanned<StepSpec>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StepSpec {
    pub(super) action: Option<Spanned<String>>,
    pub(super) signal: Option<Spanned<String>>,
    pub(super) after: Option<Spanned<Value>>,
}
