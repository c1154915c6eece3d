//! Grants: what limits a container's GPU memory besides the quota file's entries, read from where
//! each scheduler writes it, and the quota file itself as the agent keeps it loaded.
//!
//! - [`env`]: the vendors' environment conventions (declared in `env/conventions.rs`) read into a
//!   grant, pure;
//! - [`env_quotas`]: the grants a container carries (its environment, read from its runtime spec
//!   or its init process, and the kubelet's device assignments), cached per container;
//! - [`merge`]: the one place two grants of a workload are combined (the smallest per GPU, with
//!   the set of sources that bind);
//! - [`quota_store`]: the operator's quota file, loaded, watched and reloaded, with the last good
//!   configuration kept when an edit is broken.
//!
//! Rule of the room: a grant is read and handed to the step as a view; nothing here enforces or
//! reports (`cargo xtask structure` checks that no module here names `enforce`, `snapshot` or
//! `metrics`).

pub mod env;
pub mod env_quotas;
pub mod merge;
pub mod quota_store;
