//! What identifies one version of a file, for caches keyed by a file the agent does not own (a
//! runtime's spec, Docker's container config): writers replace such a file (new inode) or rewrite it
//! (new mtime) when it changes, and a recreated container has a new file.

use std::{os::unix::fs::MetadataExt, path::Path};

/// Device, inode, length and modification time of a file, as `stat` tells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileStamp {
    /// The stamp of `path` now, `None` when it cannot be stat'ed.
    pub fn of(path: &Path) -> Option<Self> {
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        })
    }
}
