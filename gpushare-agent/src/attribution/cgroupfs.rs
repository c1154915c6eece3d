//! cgroup id -> cgroup path, from the cgroup v2 hierarchy.
//!
//! The kernel names a task's cgroup by its v2 id, which is the inode number of the cgroup's
//! directory. The resolver caches id -> path; on a miss it first asks the process itself
//! (`/proc/<pid>/cgroup`, one stat to confirm), then opens the group by its id (cgroup2 exports
//! file handles whose body is the id: `open_by_handle_at`, one syscall whatever the number of
//! groups), and only where that cannot be used (no CAP_DAC_READ_SEARCH) rescans the hierarchy, at
//! most once per [`CgroupResolver::new`]'s interval. A tenant that makes thousands of groups then
//! costs no walk per unknown id.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::sys::{kernel_text, mountinfo, proc_cgroup};

/// Where the cgroup v2 hierarchy is mounted: `/sys/fs/cgroup/unified` on hybrid systems,
/// `/sys/fs/cgroup` on pure v2. Read from `/proc/self/mountinfo` (as bytes: a mount anywhere at
/// a path that is not UTF-8 changes nothing); where that cannot be read, the usual places whose
/// filesystem is cgroup2 (`statfs`), never a guess.
pub fn find_cgroup2_mount() -> Result<PathBuf> {
    let found = match mountinfo::read() {
        Ok(text) => mountinfo::cgroup2_mount(&text),
        Err(e) => {
            log::warn!(
                "reading /proc/self/mountinfo: {e}; looking for cgroup2 where it is usually mounted"
            );
            ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
                .into_iter()
                .map(PathBuf::from)
                .find(|p| is_cgroup2(p))
        }
    };
    found.context(
        "no cgroup2 filesystem is mounted; gpushare needs the cgroup v2 hierarchy \
         (pure v2 at /sys/fs/cgroup, or hybrid at /sys/fs/cgroup/unified)",
    )
}

/// Whether the filesystem at `dir` is cgroup2 (`CGROUP2_SUPER_MAGIC`).
pub fn is_cgroup2(dir: &Path) -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs(2) on a NUL-terminated path into a zeroed struct of the right type.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0) && st.f_type as i64 == CGROUP2_SUPER_MAGIC
}

/// The v2 cgroup path of a process, from the `0::` line of `/proc/<pid>/cgroup`, as
/// [`kernel_text`] spells it (the group's name is the tenant's, and need not be UTF-8).
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
    rescans: u64,
    dirs_walked: u64,
    /// The hierarchy's root, open, for `open_by_handle_at`; `None` once it proved unusable.
    handles: Option<std::os::fd::OwnedFd>,
    handle_lookups: u64,
}

/// `FILEID_KERNFS`: a kernfs (cgroup2) file handle, whose 8 bytes are the node's id.
const FILEID_KERNFS: libc::c_int = 0xfe;

/// `struct file_handle` with the 8 bytes of a kernfs handle.
#[repr(C)]
struct KernfsHandle {
    handle_bytes: libc::c_uint,
    handle_type: libc::c_int,
    id: u64,
}

/// What opening a group by its id said.
enum ByHandle {
    Found(String),
    /// No group has that id (removed, or never was).
    Gone,
    /// The call cannot be used here (privilege, kernel): walk instead.
    Unusable,
}

impl CgroupResolver {
    /// A resolver for the hierarchy mounted at `root`.
    pub fn new(root: PathBuf) -> Self {
        let handles = std::fs::File::open(&root)
            .ok()
            .map(std::os::fd::OwnedFd::from);
        Self {
            root,
            by_id: HashMap::new(),
            last_scan: None,
            min_rescan_interval: Duration::from_millis(200),
            rescans: 0,
            dirs_walked: 0,
            handles,
            handle_lookups: 0,
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
        kernel_text::under(&self.root, rel_path)
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
        match self.open_by_id(id) {
            ByHandle::Found(path) => {
                self.by_id.insert(id, path.clone());
                return Some(path);
            }
            ByHandle::Gone => return None,
            ByHandle::Unusable => {}
        }
        let due = self
            .last_scan
            .is_none_or(|t| t.elapsed() >= self.min_rescan_interval);
        if due && self.rescan().is_ok() {
            return self.by_id.get(&id).cloned();
        }
        None
    }

    /// The path of the group whose id is `id`, opened by its file handle and named by
    /// `/proc/self/fd`: bounded work whatever the size of the hierarchy.
    fn open_by_id(&mut self, id: u64) -> ByHandle {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let Some(root_fd) = self.handles.as_ref().map(|f| f.as_raw_fd()) else {
            return ByHandle::Unusable;
        };
        self.handle_lookups += 1;
        let mut handle = KernfsHandle {
            handle_bytes: 8,
            handle_type: FILEID_KERNFS,
            id,
        };
        // SAFETY: open_by_handle_at(2) with the open root as mount fd and a handle of the size
        // it says; a returned fd is owned below.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_open_by_handle_at,
                root_fd,
                &mut handle as *mut KernfsHandle,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::ESTALE) | Some(libc::ENOENT) => ByHandle::Gone,
                _ => {
                    log::debug!(
                        "cgroup ids cannot be opened by handle ({err}); resolving by walking {}",
                        self.root.display()
                    );
                    self.handles = None;
                    ByHandle::Unusable
                }
            };
        }
        // SAFETY: a new fd returned by the call above, owned from here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let Ok(full) = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
            return ByHandle::Unusable;
        };
        if full.as_os_str().as_encoded_bytes().ends_with(b" (deleted)") {
            return ByHandle::Gone;
        }
        match full.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ByHandle::Found("/".to_string()),
            Ok(rel) => ByHandle::Found(format!("/{}", kernel_text::of_path(rel))),
            // Outside the mount as this process sees it (another cgroup namespace): walk.
            Err(_) => ByHandle::Unusable,
        }
    }

    /// Walks the whole hierarchy and rebuilds the cache.
    pub fn rescan(&mut self) -> Result<usize> {
        self.last_scan = Some(Instant::now());
        self.rescans += 1;
        if !self.root.is_dir() {
            bail!("cgroup v2 root {} is not a directory", self.root.display());
        }
        let mut by_id = HashMap::new();
        let mut stack = vec![(self.root.clone(), "/".to_string())];
        while let Some((dir, rel)) = stack.pop() {
            self.dirs_walked += 1;
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(ft) = entry.file_type() else { continue };
                if !ft.is_dir() {
                    continue;
                }
                let Ok(meta) = entry.metadata() else { continue };
                let name = kernel_text::string(entry.file_name().as_encoded_bytes());
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

    /// Groups opened by their id (no walk).
    pub fn handle_lookups(&self) -> u64 {
        self.handle_lookups
    }

    /// Whole-hierarchy walks since the start.
    pub fn rescans(&self) -> u64 {
        self.rescans
    }

    /// Directories those walks read.
    pub fn dirs_walked(&self) -> u64 {
        self.dirs_walked
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
            "found by its id"
        );
        assert_eq!(
            r.resolve(id, Some(me)).as_deref(),
            Some(path.as_str()),
            "found in cache"
        );
        assert_eq!(r.resolve(u64::MAX - 7, None), None);
    }

    /// A tenant's delegated subtree holds 20,000 empty groups: resolving an id, a removed
    /// group's id or a made-up one walks nothing.
    #[test]
    fn a_storm_of_cgroups_costs_no_walk_to_resolve_an_id() {
        if !gpushare_testkit::require_root("a_storm_of_cgroups_costs_no_walk_to_resolve_an_id") {
            return;
        }
        const GROUPS: usize = 20_000;
        let root = find_cgroup2_mount().unwrap();
        let unit = root.join(format!("{}.service", gpushare_testkit::unique("storm")));
        struct Storm(PathBuf, usize);
        impl Drop for Storm {
            fn drop(&mut self) {
                for i in 0..self.1 {
                    let _ = fs::remove_dir(self.0.join(format!("g{i}")));
                }
                let _ = fs::remove_dir(&self.0);
            }
        }
        fs::create_dir(&unit).unwrap();
        let mut storm = Storm(unit.clone(), 0);
        for i in 0..GROUPS {
            fs::create_dir(unit.join(format!("g{i}"))).unwrap();
            storm.1 = i + 1;
        }
        let rel = |i: usize| {
            format!(
                "/{}/g{i}",
                unit.strip_prefix(&root).unwrap().to_string_lossy()
            )
        };
        let mut r = CgroupResolver::new(root.clone());
        let id = r.id_of(&rel(12_345)).unwrap();
        assert_eq!(r.resolve(id, None), Some(rel(12_345)));
        let gone = r.id_of(&rel(0)).unwrap();
        fs::remove_dir(unit.join("g0")).unwrap();
        assert_eq!(r.resolve(gone, None), None, "a removed group");
        for k in 0..100 {
            assert_eq!(r.resolve(u64::MAX - 1000 - k, None), None, "a made-up id");
        }
        assert_eq!(
            (r.rescans(), r.dirs_walked()),
            (0, 0),
            "ids were resolved by walking the tenant's {GROUPS} groups (rescans, directories)"
        );
        assert!(r.handle_lookups() >= 102, "{}", r.handle_lookups());
        drop(storm);
    }
}
