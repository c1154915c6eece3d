//! `/proc/self/mountinfo`: where the cgroup hierarchies are mounted.
//!
//! A line reads `<id> <parent> <maj:min> <root> <mount point> <options> [optional...] - <fstype>
//! <source> <super options>`; the mount point is octal-escaped (`\040` for a space). Uses only
//! `std`. Read as bytes: see [`read`].

use std::{ffi::OsString, io, os::unix::ffi::OsStringExt, path::PathBuf};

/// One line of mountinfo: what is mounted where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount<'a> {
    /// The mounted filesystem's own directory that appears at the mount point (`/` for its root),
    /// escaped as the kernel writes it.
    pub root: &'a [u8],
    /// Where it is mounted, unescaped: the directory's own bytes.
    pub mount_point: PathBuf,
    /// The filesystem type (`cgroup2`, `cgroup`, `tmpfs`, ...).
    pub fstype: &'a [u8],
    /// The filesystem's options (for `cgroup`: its controllers, e.g. `rw,freezer`).
    pub super_options: &'a [u8],
}

/// The bytes of `/proc/self/mountinfo`. Bytes, not text: any user may mount (FUSE) at a path
/// that is not UTF-8, and reading the file as text would then fail whole (see
/// [`super::kernel_text`]).
pub fn read() -> io::Result<Vec<u8>> {
    std::fs::read("/proc/self/mountinfo")
}

/// The mounts of a mountinfo text, in order; malformed lines are skipped.
pub fn parse(text: &[u8]) -> impl Iterator<Item = Mount<'_>> {
    text.split(|&b| b == b'\n').filter_map(|line| {
        let sep = line.windows(3).position(|w| w == b" - ")?;
        let (left, right) = (&line[..sep], &line[sep + 3..]);
        let mut r = fields(right);
        let fstype = r.next()?;
        let super_options = r.nth(1).unwrap_or(b"");
        let mut l = fields(left);
        let root = l.nth(3)?;
        let point = l.next()?;
        Some(Mount {
            root,
            mount_point: PathBuf::from(OsString::from_vec(unescape(point))),
            fstype,
            super_options,
        })
    })
}

/// The fields of a line, split at runs of spaces and tabs.
fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
}

/// The cgroup v2 hierarchy's mount point in a mountinfo text: `/sys/fs/cgroup/unified` on hybrid
/// systems, `/sys/fs/cgroup` on pure v2. Found by its filesystem type; only a mount of the
/// hierarchy's root counts (a container's bind mount of a sub-tree does not); of several, the
/// shortest path.
pub fn cgroup2_mount(text: &[u8]) -> Option<PathBuf> {
    parse(text)
        .filter(|m| m.fstype == b"cgroup2" && m.root == b"/")
        .map(|m| m.mount_point)
        .min_by_key(|p| p.as_os_str().len())
}

/// Where the cgroup v1 hierarchy of `controller` (`freezer`, `memory`, ...) is mounted in a
/// mountinfo text: the first `cgroup` mount whose options name it.
pub fn cgroup1_mount(text: &[u8], controller: &str) -> Option<PathBuf> {
    parse(text)
        .find(|m| {
            m.fstype == b"cgroup"
                && m.super_options
                    .split(|&b| b == b',')
                    .any(|o| o == controller.as_bytes())
        })
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

/// The kernel's octal escapes (`\040` for a space, `\134` for a backslash: `\` and three octal
/// digits) undone; any other byte, UTF-8 or not, is kept as it is.
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && let Some(d) = s.get(i + 1..i + 4)
            && d.iter().all(|c| (b'0'..=b'7').contains(c))
            && d[0] <= b'3'
        {
            out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &[u8] = b"\
30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct";

    #[test]
    fn picks_the_unified_mount_on_hybrid_and_the_root_on_pure_v2() {
        assert_eq!(cgroup2_mount(HYBRID), Some("/sys/fs/cgroup/unified".into()));
        let pure = b"29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw";
        assert_eq!(cgroup2_mount(pure), Some("/sys/fs/cgroup".into()));
        // A container's bind mount of a sub-tree is not the hierarchy's root.
        let nested = b"40 30 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw";
        assert_eq!(cgroup2_mount(nested), None);
        assert_eq!(cgroup2_mount(b""), None);
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
        let text = b"garbage\n41 30 0:30 / /mnt/my\\040cgroups rw - cgroup2 none rw\n";
        let mounts: Vec<_> = parse(text).collect();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].mount_point, PathBuf::from("/mnt/my cgroups"));
        assert_eq!(mounts[0].super_options, b"rw");
    }

    /// A FUSE mount at a path that is not UTF-8, anywhere on the host, must not hide the
    /// hierarchies (it once stopped the agent: the file was read as text).
    #[test]
    fn a_mount_point_that_is_not_utf8_is_read_and_the_rest_found() {
        use std::os::unix::ffi::OsStrExt;
        let mut text = b"50 30 0:40 / /dev/shm/\xff\\040x rw - fuse.sshfs u@h:/ rw\n".to_vec();
        text.extend_from_slice(HYBRID);
        let mounts: Vec<_> = parse(&text).collect();
        assert_eq!(
            mounts[0].mount_point.as_os_str().as_bytes(),
            b"/dev/shm/\xff x"
        );
        assert_eq!(cgroup2_mount(&text), Some("/sys/fs/cgroup/unified".into()));
        assert_eq!(
            cgroup1_mount(&text, "freezer"),
            Some("/sys/fs/cgroup/freezer".into())
        );
        // The kernel escapes a backslash, tab and line break too; a bad escape is kept.
        assert_eq!(unescape(br"a\134b\011c\012d\9\40"), b"a\\b\tc\nd\\9\\40");
    }

    #[test]
    fn reads_this_process() {
        let text = read().expect("/proc/self/mountinfo");
        assert!(
            parse(&text).any(|m| m.mount_point == std::path::Path::new("/")),
            "no root mount"
        );
        let v2 = cgroup2_root().expect("cgroup2 is mounted (hybrid or pure v2)");
        assert_eq!(Some(v2.clone()), cgroup2_mount(&text));
        assert!(v2.join("cgroup.procs").exists(), "{}", v2.display());
        let freezer = cgroup1_root("freezer");
        assert_eq!(freezer, cgroup1_mount(&text, "freezer"));
        let hybrid = std::path::Path::new("/sys/fs/cgroup/freezer/tasks").exists();
        assert_eq!(freezer.is_some(), hybrid);
    }
}
