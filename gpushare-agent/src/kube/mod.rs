//! Kubernetes as a source of truth (issue 22): what the cluster grants the node's containers,
//! and Events on their pods.
//!
//! - `quantity`: Kubernetes quantities as bytes;
//! - `claims`: pods and ResourceClaims → each container's grant (DRA, annotations), pure;
//! - `api`: the API-server client (in-cluster config) and the watcher that publishes a
//!   [`claims::KubeView`] the step reads without waiting;
//! - `events`: Events on the pod for isolation steps, client-go's spam filter and correlator.

pub mod api;
pub mod claims;
pub mod events;
pub mod quantity;
