//! `/proc/<pid>/maps`, read as bytes: whether a library of a given file name is mapped.
//!
//! A mapped file's path is the line's sixth field onwards and need not be UTF-8 (a tenant names
//! its files), so lines are read as bytes and only the last path component is compared. A
//! deleted file's path ends in ` (deleted)`; it still counts as mapped. Uses only `std`.

use std::io;

/// The bytes of `/proc/<pid>/maps`.
pub fn read(pid: u32) -> io::Result<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/maps"))
}

/// The path of each file-backed mapping of a maps text (anonymous and `[heap]`-like ones
/// skipped), in the file's order.
pub fn paths(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    text.split(|&b| b == b'\n').filter_map(|line| {
        // address perms offset dev inode, then the path after spaces.
        let mut rest = line;
        for _ in 0..5 {
            let start = rest.iter().position(|&b| b != b' ')?;
            rest = &rest[start..];
            let end = rest.iter().position(|&b| b == b' ')?;
            rest = &rest[end..];
        }
        let start = rest.iter().position(|&b| b != b' ')?;
        let path = &rest[start..];
        path.starts_with(b"/").then_some(path)
    })
}

/// Whether a file whose name starts with `name` (e.g. `libvgpu.so`, matching `libvgpu.so.1`
/// too) is mapped, by its last path component.
pub fn maps_library(text: &[u8], name: &[u8]) -> bool {
    paths(text).any(|p| {
        let p = p.strip_suffix(b" (deleted)").unwrap_or(p);
        let base = p.rsplit(|&b| b == b'/').next().unwrap_or(p);
        base.starts_with(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &[u8] = b"55d0c7a00000-55d0c7a02000 r--p 00000000 08:01 131 /usr/bin/python3\n\
7f00a0000000-7f00a0021000 rw-p 00000000 00:00 0 \n\
7f00a1000000-7f00a1200000 r-xp 00000000 08:01 9 /usr/local/vgpu/libvgpu.so\n\
7f00a2000000-7f00a2200000 r-xp 00000000 08:01 10 /opt/odd \xff dir/libcuda.so.1 (deleted)\n\
7ffd0000-7ffd1000 rw-p 00000000 00:00 0                          [stack]\n";

    #[test]
    fn file_backed_paths_as_bytes() {
        let p: Vec<&[u8]> = paths(MAPS).collect();
        assert_eq!(
            p,
            vec![
                &b"/usr/bin/python3"[..],
                b"/usr/local/vgpu/libvgpu.so",
                b"/opt/odd \xff dir/libcuda.so.1 (deleted)"
            ]
        );
    }

    #[test]
    fn a_library_by_its_file_name() {
        assert!(maps_library(MAPS, b"libvgpu.so"));
        assert!(maps_library(MAPS, b"libcuda.so"));
        assert!(!maps_library(MAPS, b"libnvidia-ml.so"));
        // A directory named like the library is not the library.
        let dir = b"7f-8f r-xp 00000000 08:01 9 /opt/libvgpu.so/other.so\n";
        assert!(!maps_library(dir, b"libvgpu.so"));
        assert!(!maps_library(b"garbage\n\n", b"libvgpu.so"));
    }
}
