//! Kubernetes as a source of truth for quotas: what the node's kubelet says each container was
//! given ([`podresources`], read over its pod-resources socket) and the device ids of its replies
//! ([`devices`]).
//!
//! Layer: a source, like [`crate::quota`] and [`crate::attribution`] (which it uses); the agent
//! reads its published results, never the other way round.

pub mod devices;
pub mod podresources;

/// The kubelet's pod-resources `v1` API, generated at build time from the vendored
/// `proto/podresources/v1/api.proto` (Apache-2.0, the Kubernetes Authors).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("v1");
}
