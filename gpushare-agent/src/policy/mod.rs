//! The pure policy core. (in progress)
