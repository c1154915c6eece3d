//! cgroup paths (and the `/proc/<pid>/cgroup` and mountinfo texts they come from) must never make
//! the agent panic, and the identity parsed from a path must be self-consistent.
//!
//! Input: bytes, as the kernel hands them over (names need not be UTF-8). They are parsed as the
//! bytes of `/proc/<pid>/cgroup` (whose `0::` path is then parsed too) and of
//! `/proc/self/mountinfo`, kept as text by `kernel_text` (which must give every byte back), and,
//! with invalid UTF-8 replaced, parsed as a cgroup path.
#![no_main]

use gpushare_agent::{
    quota::WorkloadMeta,
    sys::{kernel_text, mountinfo, proc_cgroup},
    workload::{WorkloadKind, nested_container, parse_cgroup_path},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let kept = kernel_text::text(data);
    assert_eq!(&*kernel_text::bytes(&kept), data, "{kept:?}");
    let text = String::from_utf8_lossy(data);
    check_path(&text);
    if let Some(path) = proc_cgroup::v2_path_in(data) {
        assert!(!path.contains('\n'), "{path:?}");
        assert!(!kernel_text::bytes(&path).contains(&b'\n'), "{path:?}");
        check_path(&path);
    }
    if let Some(path) = proc_cgroup::v1_path_in(data, "freezer") {
        assert!(!path.contains('\n'), "{path:?}");
    }
    if let Some(mount) = mountinfo::cgroup2_mount(data) {
        assert!(!mount.as_os_str().is_empty());
    }
    if let Some(mount) = mountinfo::cgroup1_mount(data, "freezer") {
        assert!(!mount.as_os_str().is_empty());
    }
});

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn check_path(path: &str) {
    let w = parse_cgroup_path(path);
    let p = &w.cgroup_path;
    assert!(p.starts_with('/'), "{path:?} -> {p:?}");
    assert!(p == "/" || !p.ends_with('/'), "{path:?} -> {p:?}");
    assert_eq!(w.is_host(), p == "/", "{path:?} -> {w:?}");
    let key = w.key();
    let short = w.short_name();
    assert_eq!(w.to_string(), key);
    match &w.kind {
        WorkloadKind::Container {
            runtime,
            container_id,
            pod_uid,
            qos,
        } => {
            assert!(is_container_id(container_id), "{w:?}");
            assert!(p.contains(container_id.as_str()), "{w:?}");
            assert_eq!(key, format!("{}://{container_id}", runtime.as_str()));
            assert_eq!(short, &container_id[..12]);
            assert_eq!(pod_uid.is_some(), qos.is_some(), "{w:?}");
            if let Some(uid) = pod_uid {
                assert!(is_uid(uid), "{w:?}");
            }
            assert_eq!(w.container_id(), Some(container_id.as_str()));
        }
        WorkloadKind::Pod { pod_uid, .. } => {
            assert!(is_uid(pod_uid), "{w:?}");
            assert_eq!(key, format!("pod://{pod_uid}"));
            assert_eq!(w.pod_uid(), Some(pod_uid.as_str()));
        }
        WorkloadKind::SystemdUnit { unit } => {
            assert!(
                unit.ends_with(".service") || unit.ends_with(".scope"),
                "{w:?}"
            );
            assert_eq!(p.rsplit('/').next(), Some(unit.as_str()), "{w:?}");
            assert_eq!(key, format!("unit://{p}"));
            assert_eq!(&short, unit);
        }
        WorkloadKind::Cgroup => {
            assert_eq!(key, format!("cgroup://{p}"));
            assert_eq!(&short, p);
        }
        WorkloadKind::Host => assert_eq!(key, "host"),
    }
    // The normalised path parses to itself, unless normalising exposed whitespace at its end
    // (` /a / ` -> `/a `), which the parser trims.
    if p.trim_end() == p {
        assert_eq!(parse_cgroup_path(p), w, "{path:?}");
    }
    // A nested container is below the root, on the way to the path.
    if let Some(n) = nested_container(path, p) {
        assert!(
            n.starts_with(p.as_str()) && n.len() > p.len(),
            "{path:?} -> {n:?}"
        );
    }
    // Matching code paths reachable from a cgroup path alone.
    let meta = WorkloadMeta::new(w);
    assert_eq!(meta.key(), key);
}
