//! `/proc/<pid>/cgroup`: which cgroup a process is in.
//!
//! A line reads `<hierarchy id>:<controllers>:<path>`: `0::<path>` for the v2 hierarchy, e.g.
//! `7:freezer:/docker/<id>` or `4:cpu,cpuacct:/...` for a v1 one. The path is relative to the
//! hierarchy's mount point (see [`super::mountinfo`]). Uses only `std`: the test kit compiles this
//! same file.

use std::io;

/// One line: a hierarchy and the process's group in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership<'a> {
    /// The hierarchy id (`0` for cgroup v2).
    pub hierarchy: &'a str,
    /// Its controllers, comma-separated (empty for v2; `name=systemd` for a named v1 hierarchy).
    pub controllers: &'a str,
    /// The group's path within the hierarchy, as the kernel spells it.
    pub path: &'a str,
}

/// The text of `/proc/<pid>/cgroup`.
pub fn read(pid: u32) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
}

/// The lines of a `/proc/<pid>/cgroup` text; malformed ones are skipped.
pub fn parse(text: &str) -> impl Iterator<Item = Membership<'_>> {
    text.lines().filter_map(|l| {
        let mut f = l.splitn(3, ':');
        Some(Membership {
            hierarchy: f.next()?,
            controllers: f.next()?,
            path: f.next()?,
        })
    })
}

/// The path on the `0::` (cgroup v2) line of a text, without the kernel's ` (deleted)` suffix of
/// a removed group.
pub fn v2_path_in(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end_matches(" (deleted)").to_string())
}

/// The path of the v1 hierarchy whose controllers include `controller` (`freezer`, `memory`).
pub fn v1_path_in(text: &str, controller: &str) -> Option<String> {
    parse(text)
        .find(|m| m.controllers.split(',').any(|c| c == controller))
        .map(|m| m.path.to_string())
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

    const HYBRID: &str = "12:freezer:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/docker/abc\n";

    #[test]
    fn reads_the_v2_line_of_proc_cgroup() {
        assert_eq!(v2_path_in(HYBRID).as_deref(), Some("/docker/abc"));
        assert_eq!(v2_path_in("3:cpu:/\n"), None);
        assert_eq!(
            v2_path_in("0::/gone/x (deleted)\n").as_deref(),
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
        assert_eq!(v1_path_in("0::/a:b\n", "freezer"), None);
        let paths: Vec<_> = parse("0::/a:b\nnonsense\n").map(|m| m.path).collect();
        assert_eq!(paths, ["/a:b"]);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let text = read(me).expect("/proc/self/cgroup");
        assert_eq!(v2_path(me).unwrap(), v2_path_in(&text));
    }
}
