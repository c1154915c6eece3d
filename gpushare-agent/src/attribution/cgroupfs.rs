//! cgroup id -> cgroup path, from the cgroup v2 hierarchy.
//!
//! The kernel names a task's cgroup by its v2 id, which is the inode number of the cgroup's
//! directory. The resolver caches id -> path; on a miss it first asks the process itself
//! (`/proc/<pid>/cgroup`, one stat to confirm), then rescans the hierarchy.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::sys::{mountinfo, proc_cgroup};

/// Where the cgroup v2 hierarchy is mounted: `/sys/fs/cgroup/unified` on hybrid systems,
/// `/sys/fs/cgroup` on pure v2. Read from `/proc/self/mountinfo`.
pub fn find_cgroup2_mount() -> Result<PathBuf> {
    let text = mountinfo::read().context("reading /proc/self/mountinfo")?;
    mountinfo::cgroup2_mount(&text).context(
        "no cgroup2 filesystem is mounted; gpushare needs the cgroup v2 hierarchy \
         (pure v2 at /sys/fs/cgroup, or hybrid at /sys/fs/cgroup/unified)",
    )
}

/// The v2 cgroup path of a process, from the `0::` line of `/proc/<pid>/cgroup`.
pub fn cgroup_path_of_pid(pid: u32) -> Result<String> {
    proc_cgroup::v2_path(pid)
        .with_context(|| format!("reading /proc/{pid}/cgroup"))?
        .with_context(|| format!("/proc/{pid}/cgroup has no cgroup v2 (0::) line"))
}

/// Caches cgroup id -> path for one v2 hierarchy.
pub struct CgroupResolver {
    root: PathBuf,
    by_id: HashMap<u64, String>,
    last_scan: Option<Instant>,
    min_rescan_interval: Duration,
}

impl CgroupResolver {
    /// A resolver for the hierarchy mounted at `root`.
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            by_id: HashMap::new(),
            last_scan: None,
            min_rescan_interval: Duration::from_millis(200),
        }
    }

    /// The hierarchy's mount point.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The cgroup id (inode) of a path relative to the root.
    pub fn id_of(&self, rel_path: &str) -> Result<u64> {
        let full = self.full_path(rel_path);
        Ok(fs::metadata(&full)
            .with_context(|| format!("stat {}", full.display()))?
            .ino())
    }

    /// Absolute directory of a path relative to the root.
    pub fn full_path(&self, rel_path: &str) -> PathBuf {
        self.root.join(rel_path.trim_start_matches('/'))
    }

    /// Resolves `id`, using `pid` (a task seen in that cgroup) as a hint. `None` when the cgroup is
    /// gone or the id is unknown even after a rescan.
    pub fn resolve(&mut self, id: u64, pid: Option<u32>) -> Option<String> {
        if id == 1 {
            return Some("/".to_string());
        }
        if let Some(p) = self.by_id.get(&id) {
            // Still the same directory? Inodes are reused once a cgroup is removed.
            if self.id_of(p).ok() == Some(id) {
                return Some(p.clone());
            }
            self.by_id.remove(&id);
        }
        if let Some(pid) = pid
            && let Ok(path) = cgroup_path_of_pid(pid)
            && self.id_of(&path).ok() == Some(id)
        {
            self.by_id.insert(id, path.clone());
            return Some(path);
        }
        let due = self
            .last_scan
            .is_none_or(|t| t.elapsed() >= self.min_rescan_interval);
        if due && self.rescan().is_ok() {
            return self.by_id.get(&id).cloned();
        }
        None
    }

    /// Walks the whole hierarchy and rebuilds the cache.
    pub fn rescan(&mut self) -> Result<usize> {
        self.last_scan = Some(Instant::now());
        if !self.root.is_dir() {
            bail!("cgroup v2 root {} is not a directory", self.root.display());
        }
        let mut by_id = HashMap::new();
        let mut stack = vec![(self.root.clone(), "/".to_string())];
        while let Some((dir, rel)) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(ft) = entry.file_type() else { continue };
                if !ft.is_dir() {
                    continue;
                }
                let Ok(meta) = entry.metadata() else { continue };
                let name = entry.file_name().to_string_lossy().into_owned();
                let child_rel = if rel == "/" {
                    format!("/{name}")
                } else {
                    format!("{rel}/{name}")
                };
                by_id.insert(meta.ino(), child_rel.clone());
                stack.push((entry.path(), child_rel));
            }
        }
        let n = by_id.len();
        self.by_id = by_id;
        Ok(n)
    }

    /// Number of cached entries.
    pub fn cached(&self) -> usize {
        self.by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_real_cgroup_ids_of_this_machine() {
        let Ok(root) = find_cgroup2_mount() else {
            gpushare_testkit::cannot_run(
                "resolves_real_cgroup_ids_of_this_machine",
                "no cgroup2 hierarchy mounted",
            );
            return;
        };
        let mut r = CgroupResolver::new(root);
        let me = std::process::id();
        let path = cgroup_path_of_pid(me).expect("own cgroup");
        let id = r.id_of(&path).expect("own cgroup id");
        assert_eq!(
            r.resolve(id, None).as_deref(),
            Some(path.as_str()),
            "found by rescan"
        );
        assert_eq!(
            r.resolve(id, Some(me)).as_deref(),
            Some(path.as_str()),
            "found in cache"
        );
        assert_eq!(r.resolve(u64::MAX - 7, None), None);
    }
}
