//! Grants: what limits a container's GPU memory besides the quota file's entries, read from where
//! each scheduler writes it, and the quota file itself as the agent keeps it loaded.
//!
//! Every source is one file (with a folder for its parts and tests), in one shape: its module
//! doc says what it reads and what it grants per GPU with its source ([`GrantSource`]), and its
//! code marks each grant with that source.
//!
//! - [`env`](mod@env): the vendors' environment conventions (declared in `env/conventions.rs`)
//!   read into a grant, pure;
//! - [`env_quotas`]: the grants a container carries (its environment, read from its runtime spec
//!   or its init process, joined with the kubelet's), cached per container;
//! - [`kubelet`]: the kubelet's pod-resources view (its client and background task in
//!   `kubelet/watch.rs`) and a container's grant from it;
//! - [`claims`]: the API server's grant (DRA consumed capacity, annotations) from pods and
//!   ResourceClaims, pure; the watcher in [`crate::kube`] publishes it;
//! - [`merge`]: the one place two grants of a workload are combined (the smallest per GPU, with
//!   the set of sources that bind);
//! - [`quota_store`]: the operator's quota file, loaded, watched and reloaded, with the last good
//!   configuration kept when an edit is broken.
//!
//! Rule of the room: a grant is read and handed to the step as a view; nothing here enforces or
//! reports (`cargo xtask structure` checks that no module here names `enforce`, `snapshot` or
//! `metrics`), and nothing here names [`crate::kube`], whose watcher names the pure code here
//! (the reverse would be an import cycle, checked). What the operator wrote about Kubernetes
//! (the `[kubernetes]` keys) is validated in `quota/`.
//!
//! [`GrantSource`]: crate::quota::GrantSource

pub mod claims;
pub mod env;
pub mod env_quotas;
pub mod kubelet;
pub mod merge;
pub mod quota_store;
