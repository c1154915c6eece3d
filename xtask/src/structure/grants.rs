//! Every grant source in one shape (issue 40): each file directly in `gpushare-agent/src/grants/`
//! but `mod.rs` and the combinator (`merge.rs`) is a source, and its module doc says, as its
//! first bullets do, what it reads (`//! - Reads:`) and what it grants per GPU with which source
//! (`//! - Grants, per GPU`). A source's helpers live below it (`kubelet/`, `claims/`), not
//! beside it.

use std::path::Path;

use anyhow::{Context, Result};

use super::rel;

/// The two bullets a source's module doc holds, as they begin.
pub const SHAPE: [&str; 2] = ["//! - Reads:", "//! - Grants, per GPU"];

/// The files of `grants/` that are no source.
const NOT_SOURCES: [&str; 2] = ["mod.rs", "merge.rs"];

/// Which of [`SHAPE`]'s bullets the module doc (the leading `//!` lines) of `text` lacks.
pub fn missing(text: &str) -> Vec<&'static str> {
    let doc: Vec<&str> = text.lines().take_while(|l| l.starts_with("//!")).collect();
    SHAPE
        .into_iter()
        .filter(|bullet| !doc.iter().any(|l| l.starts_with(bullet)))
        .collect()
}

/// A problem for each source of `grants` (the directory) whose module doc lacks a bullet.
pub fn check(root: &Path, grants: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(grants)
        .with_context(|| format!("reading {}", grants.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if NOT_SOURCES.contains(&name) {
            continue;
        }
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let lacks = missing(&text);
        if !lacks.is_empty() {
            problems.push(format!(
                "{}: a grant source says in its module doc what it reads and what it grants per \
                 GPU with which source, as every source of grants/ does: add {}",
                rel(root, &f),
                lacks
                    .iter()
                    .map(|b| format!("`{b} ...`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_needs_both_bullets_in_its_leading_doc() {
        let both = "//! The kubelet.\n//!\n//! - Reads: its socket.\n//! - Grants, per GPU, with \
                    source `kubelet`: units.\n\nuse x;\n";
        assert!(missing(both).is_empty());
        assert_eq!(missing("//! Just words.\n"), SHAPE.to_vec());
        // A bullet after the module doc (in an item's doc) does not count.
        let late = "//! - Reads: x.\n\n/// - Grants, per GPU: y\n//! - Grants, per GPU: z\n";
        assert_eq!(missing(late), vec![SHAPE[1]]);
    }

    #[test]
    fn every_source_of_this_workspace_is_in_shape_and_a_new_one_without_is_named() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let grants = root.join("gpushare-agent/src/grants");
        assert_eq!(check(root, &grants).unwrap(), Vec::<String>::new());
        let dir = std::env::temp_dir().join(format!("xtask-grants-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("kubelet")).unwrap();
        std::fs::write(dir.join("mod.rs"), "//! The room.\n").unwrap();
        std::fs::write(dir.join("merge.rs"), "//! The combinator.\n").unwrap();
        std::fs::write(dir.join("kubelet/watch.rs"), "//! A helper.\n").unwrap();
        std::fs::write(dir.join("README.txt"), "Not Rust.\n").unwrap();
        std::fs::write(dir.join("mps.rs"), "//! - Reads: the MPS daemon.\n").unwrap();
        let problems = check(&dir, &dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("mps.rs: ")
                && problems[0].contains("`//! - Grants, per GPU ...`"),
            "{problems:?}"
        );
    }
}
