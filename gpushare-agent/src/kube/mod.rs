//! Kubernetes as a source of truth (issue 22): what the cluster grants the node's containers,
//! and Events on their pods.
//!
//! - [`podresources`]: what the node's kubelet says each container was given, read over its
//!   pod-resources socket, and [`devices`]: the device ids of its replies;
//! - `quantity`: Kubernetes quantities as bytes;
//! - `claims`: pods and ResourceClaims → each container's grant (DRA, annotations), pure;
//! - `auth`: the service account's token, trimmed and re-read as it rotates;
//! - `api`: the API-server client (in-cluster config) and the watcher that publishes a
//!   [`claims::KubeView`] the step reads without waiting;
//! - `watch`: the watcher task (one watch of the node's pods, a GET per claim reference);
//! - `events`: Events on the pod for isolation steps, client-go's spam filter and correlator.
//!
//! Layer: a source, like [`crate::quota`] and [`crate::attribution`] (which it uses); the agent
//! reads its published results, never the other way round.

pub mod api;
pub mod auth;
pub mod claims;
pub mod devices;
pub mod events;
pub mod podresources;
pub mod quantity;
pub mod watch;

/// The kubelet's pod-resources `v1` API, generated at build time from the vendored
/// `proto/podresources/v1/api.proto` (Apache-2.0, the Kubernetes Authors).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("v1");
}
