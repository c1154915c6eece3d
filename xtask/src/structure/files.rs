//! No two files of the agent import each other (issue 40): `metrics/cache.rs` and `rows.rs` did,
//! and so did `policy/outcome.rs` and `state.rs`. A file names another when one of its paths
//! (`crate::a::b::X`, `super::b::X`, `self::b::X`, or `b::X` for a child module `b`) leads
//! through that file's module; a pair where each names the other is reported, but for a parent
//! module and its child (the parent declares the child, the child reads the parent's items: how
//! Rust modules are made). Tests aside; comments and strings left out.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::Result;

use super::{is_ident, is_test_file, rust_files, strip_comments, tokenize};

/// A module path: `["policy", "state"]`.
type ModPath = Vec<String>;

/// The module path of a file below `src` (`policy/mod.rs` -> `policy`; `lib.rs` -> the root).
fn module_of(src: &Path, f: &Path) -> ModPath {
    let rel = f.strip_prefix(src).unwrap_or(f);
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The paths a file's code names, as written (`super`, `self`, `crate` kept), `{}` groups
/// expanded.
pub fn paths(code: &str) -> Vec<Vec<String>> {
    let t = tokenize(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        let starts = is_ident(t[i]) && (i == 0 || t[i - 1] != "::");
        if starts && t.get(i + 1) == Some(&"::") {
            i = tree(&t, i, Vec::new(), &mut out);
        } else {
            i += 1;
        }
    }
    out
}

/// Reads the path (tree) at `t[i]` below `prefix` into `out`; the index after it.
fn tree(t: &[&str], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    loop {
        match t.get(i) {
            Some(&"{") => {
                i += 1;
                loop {
                    match t.get(i) {
                        Some(&"}") | None => return i + 1,
                        Some(&",") => i += 1,
                        // `n as o`: the alias is no path.
                        Some(&"as") => i += 2,
                        // `*`, `self` and the like end a path where they stand.
                        Some(_) => i = tree(t, i, prefix.clone(), out).max(i + 1),
                    }
                }
            }
            Some(s) if is_ident(s) => {
                prefix.push((*s).to_string());
                i += 1;
                if t.get(i) == Some(&"::") {
                    i += 1;
                } else {
                    out.push(prefix);
                    return i;
                }
            }
            _ => {
                if !prefix.is_empty() {
                    out.push(prefix);
                }
                return i;
            }
        }
    }
}

/// The absolute module path a path written in module `m` leads to (`None`: another crate's).
fn absolute(m: &[String], p: &[String], children: &BTreeSet<String>) -> Option<ModPath> {
    let first = p.first()?;
    match first.as_str() {
        "crate" => Some(p[1..].to_vec()),
        "self" => Some([m, &p[1..]].concat()),
        "super" => {
            let ups = p.iter().take_while(|s| *s == "super").count();
            let base = m.len().checked_sub(ups)?;
            Some([&m[..base], &p[ups..]].concat())
        }
        c if children.contains(c) => Some([m, p].concat()),
        _ => None,
    }
}

/// Each pair of files (tests aside) below `src` that name each other, but a parent module and
/// its child.
pub fn mutual_imports(src: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut files: BTreeMap<ModPath, PathBuf> = BTreeMap::new();
    for f in rust_files(src)? {
        let rel = f.strip_prefix(src).unwrap_or(&f);
        if is_test_file(rel) || rel == Path::new("main.rs") {
            continue;
        }
        files.insert(module_of(src, &f), f);
    }
    let mut names: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (m, f) in &files {
        let children: BTreeSet<String> = files
            .keys()
            .filter(|k| k.len() == m.len() + 1 && k.starts_with(m))
            .map(|k| k[m.len()].clone())
            .collect();
        let code = strip_comments(&std::fs::read_to_string(f)?);
        let named = names.entry(m.clone()).or_default();
        for p in paths(&code) {
            let Some(abs) = absolute(m, &p, &children) else {
                continue;
            };
            // The longest prefix that is a file of its own: the module the path goes through.
            if let Some(target) = (1..=abs.len())
                .rev()
                .map(|n| abs[..n].to_vec())
                .find(|k| files.contains_key(k))
                && target != *m
            {
                named.insert(target);
            }
        }
    }
    let mut out = Vec::new();
    for (a, targets) in &names {
        for b in targets {
            let parent_child = (b.len() == a.len() + 1 && b.starts_with(a))
                || (a.len() == b.len() + 1 && a.starts_with(b));
            if a < b && !parent_child && names.get(b).is_some_and(|n| n.contains(a)) {
                out.push((files[a].clone(), files[b].clone()));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_paths_with_groups() {
        let code = "use super::{a::B, c::{d::E, F}, self};\nlet x = crate::g::h(1); y::Z;\n\
                    use super::{*, k::{*}}; use m::{n as o};";
        let got = paths(code);
        let want: Vec<Vec<String>> = [
            &["super", "a", "B"][..],
            &["super", "c", "d", "E"],
            &["super", "c", "F"],
            &["super", "self"],
            &["crate", "g", "h"],
            &["y", "Z"],
            &["super"],
            &["super", "k"],
            &["m", "n"],
        ]
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
        assert_eq!(got, want);
    }

    /// The rule seen failing on a deliberate violation: two siblings naming each other, through
    /// `super::` and through `crate::`; a parent and its child are fine, and so is one way.
    #[test]
    fn two_siblings_that_name_each_other_are_found() {
        let src =
            std::env::temp_dir().join(format!("gpushare-structure-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&src);
        let write = |p: &str, text: &str| {
            let p = src.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("lib.rs", "pub mod m;\npub mod n;\n");
        write(
            "m/mod.rs",
            "mod a;\nmod b;\nmod c;\npub use self::a::A;\nstruct P;\n",
        );
        write(
            "m/a.rs",
            "use super::b::B;\nuse super::P;\n// super::c::C\n",
        );
        write(
            "m/b.rs",
            "pub struct B;\nfn f() -> crate::m::a::A { todo!() }\n",
        );
        write("m/c.rs", "use super::a::A;\n");
        write("n.rs", "use crate::m::c;\n");
        let pairs = mutual_imports(&src).unwrap();
        assert_eq!(pairs, [(src.join("m/a.rs"), src.join("m/b.rs"))]);
        write("m/b.rs", "pub struct B;\n");
        assert!(mutual_imports(&src).unwrap().is_empty());
        std::fs::remove_dir_all(&src).unwrap();
    }
}
