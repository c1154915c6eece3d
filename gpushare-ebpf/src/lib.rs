#![no_std]
// The programs live in the `gpushare` bin (src/main.rs); this empty lib lets the agent name the
// crate as a build-dependency so cargo rebuilds the object when its sources change.
