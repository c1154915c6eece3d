//! One file per domain: process lifetime, nvidia device opens, ioctls.

mod ioctl;
mod open;
mod process;
