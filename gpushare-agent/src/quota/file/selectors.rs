//! Selectors and `protect` patterns: which workloads an entry or a pattern names, checked as written
//! (ids, UIDs, `namespace/name`, globs, unit names).

use std::ops::Range;

use toml::Spanned;

use super::{spec::EntrySpec, validate::Cx};
use crate::quota::{Location, PathGlob, PodRef, ProtectPattern, Selector, select::KEY_SCHEMES};

pub(super) fn is_pod_uid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

pub(super) fn container_id(cx: &mut Cx, v: &Spanned<String>) -> Option<String> {
    let raw = v.get_ref().trim();
    if let Some((scheme, _)) = raw.split_once("://") {
        cx.err(
            &v.span(),
            format!("`container` takes the bare id: remove `{scheme}://`"),
        );
        return None;
    }
    let id = raw.to_ascii_lowercase();
    if !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        cx.err(
            &v.span(),
            format!(
                "`container = \"{raw}\"` is not a container id (hex digits); to select by name use `container_name`"
            ),
        );
        return None;
    }
    if !(12..=64).contains(&id.len()) {
        cx.err(
            &v.span(),
            format!(
                "container id \"{raw}\" has {} digits: give the full id or a prefix of at least 12 (as `docker ps` shows)",
                id.len()
            ),
        );
        return None;
    }
    Some(id)
}

pub(super) fn non_empty(cx: &mut Cx, field: &str, v: &Spanned<String>) -> Option<String> {
    let s = v.get_ref().trim();
    if s.is_empty() {
        cx.err(&v.span(), format!("`{field}` is empty"));
        return None;
    }
    Some(s.to_string())
}

pub(super) fn selector(
    cx: &mut Cx,
    e: &EntrySpec,
    entry_span: &Range<usize>,
) -> Option<(Selector, Location)> {
    let given: Vec<(&str, &Spanned<String>)> = [
        ("container", &e.container),
        ("container_name", &e.container_name),
        ("pod_uid", &e.pod_uid),
        ("pod", &e.pod),
        ("cgroup", &e.cgroup),
        ("unit", &e.unit),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    .collect();
    let names: Vec<&str> = given.iter().map(|(k, _)| *k).collect();
    let pod_with_name = names.len() == 2
        && names.contains(&"container_name")
        && (names.contains(&"pod") || names.contains(&"pod_uid"));
    if given.is_empty() {
        cx.err(
            entry_span,
            "quota entry has no selector: add one of `container`, `container_name`, `pod_uid`, `pod`, `cgroup` or `unit`",
        );
        return None;
    }
    if given.len() > 1 && !pod_with_name {
        let (second, v) = given[1];
        cx.err(
            &v.span(),
            format!(
                "quota entry has two selectors, `{}` and `{second}`: keep one per [[quota]] entry (only `pod` or `pod_uid` may be combined with `container_name`)",
                given[0].0
            ),
        );
        return None;
    }
    let at = cx.at(&given[0].1.span());
    let pod_ref = |cx: &mut Cx| -> Option<PodRef> {
        if let Some(uid) = &e.pod_uid {
            let u = uid.get_ref().trim().to_ascii_lowercase();
            if !is_pod_uid(&u) {
                cx.err(
                    &uid.span(),
                    format!(
                        "`pod_uid = \"{}\"` is not a pod UID like \"0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a\" (kubectl get pod -o jsonpath='{{.metadata.uid}}')",
                        uid.get_ref()
                    ),
                );
                return None;
            }
            return Some(PodRef::Uid(u));
        }
        let pod = e.pod.as_ref()?;
        match pod.get_ref().trim().split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Some(PodRef::Name {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => {
                cx.err(
                    &pod.span(),
                    format!(
                        "`pod = \"{}\"` must be \"namespace/name\", e.g. \"default/trainer-0\"",
                        pod.get_ref()
                    ),
                );
                None
            }
        }
    };
    let sel = if pod_with_name {
        let name = non_empty(cx, "container_name", e.container_name.as_ref()?)?;
        Selector::PodContainer {
            pod: pod_ref(cx)?,
            container_name: name,
        }
    } else {
        let (key, v) = given[0];
        match key {
            "container" => Selector::ContainerId(container_id(cx, v)?),
            "container_name" => {
                Selector::ContainerName(non_empty(cx, key, v)?.trim_start_matches('/').to_string())
            }
            "pod_uid" | "pod" => match pod_ref(cx)? {
                PodRef::Uid(u) => Selector::PodUid(u),
                PodRef::Name { namespace, name } => Selector::PodName { namespace, name },
            },
            "cgroup" => {
                let pattern = non_empty(cx, key, v)?;
                if !pattern.starts_with('/') {
                    cx.err(
                        &v.span(),
                        format!(
                            "`cgroup = \"{pattern}\"` must be an absolute cgroup path glob like \"/gpushare.slice/*\""
                        ),
                    );
                    return None;
                }
                match PathGlob::cgroup(&pattern) {
                    Ok(g) => Selector::Cgroup(g),
                    Err(err) => {
                        cx.err(
                            &v.span(),
                            format!(
                                "`cgroup = \"{pattern}\"` is not a valid glob: {}",
                                err.kind()
                            ),
                        );
                        return None;
                    }
                }
            }
            _ => {
                let unit = non_empty(cx, key, v)?;
                if unit.contains('/') {
                    cx.err(
                        &v.span(),
                        format!(
                            "`unit = \"{unit}\"` must be a unit name like \"train.service\"; to select a cgroup path use `cgroup`"
                        ),
                    );
                    return None;
                }
                Selector::Unit(if unit.contains('.') {
                    unit
                } else {
                    format!("{unit}.service")
                })
            }
        }
    };
    Some((sel, at))
}

pub(super) fn protect_pattern(cx: &mut Cx, v: &Spanned<String>) -> Option<ProtectPattern> {
    let p = v.get_ref().trim();
    if p != "host" && !KEY_SCHEMES.iter().any(|s| p.starts_with(s)) {
        cx.err(
            &v.span(),
            format!(
                "protect pattern \"{p}\" must start with one of {} (e.g. \"unit://sshd.service\", \"cgroup:///batch.slice/*.service\")",
                KEY_SCHEMES.join(", ")
            ),
        );
        return None;
    }
    match PathGlob::key(p) {
        Ok(g) => Some(ProtectPattern(g)),
        Err(e) => {
            cx.err(
                &v.span(),
                format!("protect pattern \"{p}\" is not a valid glob: {}", e.kind()),
            );
            None
        }
    }
}
