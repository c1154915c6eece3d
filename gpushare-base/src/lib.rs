//! The lowest floor of gpushare, shared by the agent, its test kit and xtask (which must build
//! before the agent can: the agent's build needs what `cargo xtask setup` installs), so that all
//! three read the kernel and speak to the agent with the very same code:
//! - [`sys`]: what the kernel says in `/proc` (mounts, a process's groups and status) and `stat`,
//!   read as bytes, and the text that keeps a kernel name's bytes ([`sys::kernel_text`]).
//! - [`client`] (feature `client`): the HTTP client of the agent's endpoints.
//!
//! The agent re-exports both as `gpushare_agent::sys` and `gpushare_agent::client`.
#![deny(missing_docs)]

#[cfg(feature = "client")]
pub mod client;
pub mod sys;
