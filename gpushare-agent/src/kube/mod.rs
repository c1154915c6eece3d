//! Kubernetes as a transport: the API server's client and the watcher that publishes what it
//! grants, and Events on the node's pods (issue 22).
//!
//! - `auth`: the service account's token, trimmed and re-read as it rotates;
//! - `api`: the API-server client (in-cluster config) and the watcher that publishes a
//!   [`crate::grants::claims::KubeView`] the step reads without waiting;
//! - `watch`: the watcher task (one watch of the node's pods, a GET per claim reference);
//! - `events`: Events on the pod for isolation steps, client-go's spam filter and correlator.
//!
//! What the API server's objects grant is read in [`crate::grants::claims`] (pure), and the
//! kubelet's pod-resources client is a grant source of its own, [`crate::grants::kubelet`].
//!
//! Layer: a source's transport; it names the pure grant code of `grants/` (never the reverse),
//! and the agent reads its published results, never the other way round.

pub mod api;
pub mod auth;
pub mod events;
pub mod watch;
