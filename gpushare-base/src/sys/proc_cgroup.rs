//! `/proc/<pid>/cgroup`: which cgroup a process is in.
//!
//! A line reads `<hierarchy id>:<controllers>:<path>`: `0::<path>` for the v2 hierarchy, e.g.
//! `7:freezer:/docker/<id>` or `4:cpu,cpuacct:/...` for a v1 one. The path is relative to the
//! hierarchy's mount point (see [`super::mountinfo`]). Read as bytes (see [`read`]). Uses only
//! `std`.

use std::io;

use super::kernel_text;

/// One line: a hierarchy and the process's group in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership<'a> {
    /// The hierarchy id (`0` for cgroup v2).
    pub hierarchy: &'a [u8],
    /// Its controllers, comma-separated (empty for v2; `name=systemd` for a named v1 hierarchy).
    pub controllers: &'a [u8],
    /// The group's path within the hierarchy, the kernel's bytes.
    pub path: &'a [u8],
}

/// The bytes of `/proc/<pid>/cgroup`. Bytes, not text: a group's name is whoever made it's (any
/// user makes groups below its own `user@UID.service`) and need not be UTF-8.
pub fn read(pid: u32) -> io::Result<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/cgroup"))
}

/// The lines of a `/proc/<pid>/cgroup` text; malformed ones are skipped.
pub fn parse(text: &[u8]) -> impl Iterator<Item = Membership<'_>> {
    text.split(|&b| b == b'\n').filter_map(|l| {
        let mut f = l.splitn(3, |&b| b == b':');
        Some(Membership {
            hierarchy: f.next()?,
            controllers: f.next()?,
            path: f.next()?,
        })
    })
}

/// The path on the `0::` (cgroup v2) line of a text, without the kernel's ` (deleted)` suffix of
/// a removed group, as [`kernel_text`] spells it.
pub fn v2_path_in(text: &[u8]) -> Option<String> {
    parse(text)
        .find(|m| m.hierarchy == b"0" && m.controllers.is_empty())
        .map(|m| {
            let p = m.path.strip_suffix(b" (deleted)").unwrap_or(m.path);
            kernel_text::string(p)
        })
}

/// The path of the v1 hierarchy whose controllers include `controller` (`freezer`, `memory`), as
/// [`kernel_text`] spells it.
pub fn v1_path_in(text: &[u8], controller: &str) -> Option<String> {
    parse(text)
        .find(|m| {
            m.controllers
                .split(|&b| b == b',')
                .any(|c| c == controller.as_bytes())
        })
        .map(|m| kernel_text::string(m.path))
}

/// `pid`'s cgroup v2 path; `Ok(None)` when it has none (no `0::` line).
pub fn v2_path(pid: u32) -> io::Result<Option<String>> {
    Ok(v2_path_in(&read(pid)?))
}

/// `pid`'s path in the v1 hierarchy of `controller`; `Ok(None)` when that controller is not
/// mounted as v1.
pub fn v1_path(pid: u32, controller: &str) -> io::Result<Option<String>> {
    Ok(v1_path_in(&read(pid)?, controller))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &[u8] = b"12:freezer:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/docker/abc\n";

    #[test]
    fn reads_the_v2_line_of_proc_cgroup() {
        assert_eq!(v2_path_in(HYBRID).as_deref(), Some("/docker/abc"));
        assert_eq!(v2_path_in(b"3:cpu:/\n"), None);
        assert_eq!(
            v2_path_in(b"0::/gone/x (deleted)\n").as_deref(),
            Some("/gone/x")
        );
    }

    #[test]
    fn reads_a_v1_controller_among_several() {
        assert_eq!(
            v1_path_in(HYBRID, "freezer").as_deref(),
            Some("/docker/abc")
        );
        assert_eq!(
            v1_path_in(HYBRID, "cpuacct").as_deref(),
            Some("/docker/abc")
        );
        assert_eq!(v1_path_in(HYBRID, "memory"), None);
        assert_eq!(v1_path_in(b"0::/a:b\n", "freezer"), None);
        let paths: Vec<_> = parse(b"0::/a:b\nnonsense\n").map(|m| m.path).collect();
        assert_eq!(paths, [b"/a:b"]);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let text = read(me).expect("/proc/self/cgroup");
        let v2 = v2_path(me).unwrap();
        assert_eq!(v2, v2_path_in(&text));
        assert!(v2.is_some_and(|p| p.starts_with('/')), "{text:?}");
        let freezer = v1_path(me, "freezer").unwrap();
        assert_eq!(freezer, v1_path_in(&text, "freezer"));
        // Hybrid hosts (this project's) mount the v1 freezer; pure v2 hosts do not.
        let hybrid = std::path::Path::new("/sys/fs/cgroup/freezer/tasks").exists();
        assert_eq!(freezer.is_some(), hybrid, "{text:?}");
    }

    /// A group below the process's own whose name is not UTF-8: the whole file used to fail
    /// (read as text), so the process had no group and its GPU memory was charged to no one.
    #[test]
    fn a_group_name_that_is_not_utf8_is_kept_byte_for_byte() {
        let text = b"12:freezer:/user.slice/u\xff\n0::/user.slice/u\xff/\xfe (deleted)\n";
        let v2 = v2_path_in(text).unwrap();
        assert_eq!(&*kernel_text::bytes(&v2), b"/user.slice/u\xff/\xfe");
        let v1 = v1_path_in(text, "freezer").unwrap();
        assert_eq!(&*kernel_text::bytes(&v1), b"/user.slice/u\xff");
        // A v1 hierarchy named `0` with no controllers is not the v2 line.
        assert_eq!(v2_path_in(b"0:x:/a\n"), None);
    }
}
