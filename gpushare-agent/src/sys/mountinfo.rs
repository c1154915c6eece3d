//! `/proc/self/mountinfo`: where the cgroup hierarchies are mounted.
//!
//! A line reads `<id> <parent> <maj:min> <root> <mount point> <options> [optional...] - <fstype>
//! <source> <super options>`; the mount point is octal-escaped (`\040` for a space). Uses only
//! `std`: the test kit compiles this same file.

use std::{io, path::PathBuf};

/// One line of mountinfo: what is mounted where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount<'a> {
    /// The mounted filesystem's own directory that appears at the mount point (`/` for its root).
    pub root: &'a str,
    /// Where it is mounted, unescaped.
    pub mount_point: PathBuf,
    /// The filesystem type (`cgroup2`, `cgroup`, `tmpfs`, ...).
    pub fstype: &'a str,
    /// The filesystem's options (for `cgroup`: its controllers, e.g. `rw,freezer`).
    pub super_options: &'a str,
}

/// The text of `/proc/self/mountinfo`.
pub fn read() -> io::Result<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
}

/// The mounts of a mountinfo text, in order; malformed lines are skipped.
pub fn parse(text: &str) -> impl Iterator<Item = Mount<'_>> {
    text.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let fstype = r.next()?;
        let super_options = r.nth(1).unwrap_or("");
        let mut l = left.split_whitespace();
        let root = l.nth(3)?;
        let point = l.next()?;
        Some(Mount {
            root,
            mount_point: PathBuf::from(unescape(point)),
            fstype,
            super_options,
        })
    })
}

/// The cgroup v2 hierarchy's mount point in a mountinfo text: `/sys/fs/cgroup/unified` on hybrid
/// systems, `/sys/fs/cgroup` on pure v2. Only a mount of the hierarchy's root counts (a
/// container's bind mount of a sub-tree does not); of several, the shortest path.
pub fn cgroup2_mount(text: &str) -> Option<PathBuf> {
    parse(text)
        .filter(|m| m.fstype == "cgroup2" && m.root == "/")
        .map(|m| m.mount_point)
        .min_by_key(|p| p.as_os_str().len())
}

/// Where the cgroup v1 hierarchy of `controller` (`freezer`, `memory`, ...) is mounted in a
/// mountinfo text: the first `cgroup` mount whose options name it.
pub fn cgroup1_mount(text: &str, controller: &str) -> Option<PathBuf> {
    parse(text)
        .find(|m| m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == controller))
        .map(|m| m.mount_point)
}

/// [`cgroup2_mount`] of this process's mountinfo; `None` when none is mounted or it is unreadable.
pub fn cgroup2_root() -> Option<PathBuf> {
    cgroup2_mount(&read().ok()?)
}

/// [`cgroup1_mount`] of this process's mountinfo (`/sys/fs/cgroup/freezer` on hybrid systems);
/// `None` on pure v2.
pub fn cgroup1_root(controller: &str) -> Option<PathBuf> {
    cgroup1_mount(&read().ok()?, controller)
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct";

    #[test]
    fn picks_the_unified_mount_on_hybrid_and_the_root_on_pure_v2() {
        assert_eq!(cgroup2_mount(HYBRID), Some("/sys/fs/cgroup/unified".into()));
        let pure = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw";
        assert_eq!(cgroup2_mount(pure), Some("/sys/fs/cgroup".into()));
        // A container's bind mount of a sub-tree is not the hierarchy's root.
        let nested = "40 30 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw";
        assert_eq!(cgroup2_mount(nested), None);
        assert_eq!(cgroup2_mount(""), None);
    }

    #[test]
    fn finds_a_v1_controller_by_its_options() {
        assert_eq!(
            cgroup1_mount(HYBRID, "freezer"),
            Some("/sys/fs/cgroup/freezer".into())
        );
        assert_eq!(
            cgroup1_mount(HYBRID, "cpuacct"),
            Some("/sys/fs/cgroup/cpu,cpuacct".into())
        );
        assert_eq!(cgroup1_mount(HYBRID, "memory"), None);
    }

    #[test]
    fn mount_points_are_unescaped_and_bad_lines_skipped() {
        let text = "garbage\n41 30 0:30 / /mnt/my\\040cgroups rw - cgroup2 none rw\n";
        let mounts: Vec<_> = parse(text).collect();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].mount_point, PathBuf::from("/mnt/my cgroups"));
        assert_eq!(mounts[0].super_options, "rw");
    }
}
