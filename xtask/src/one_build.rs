//! One build (issue 40): the agent's release build shares every unit with a build of the whole
//! workspace, so `cargo xtask run`, `image`, `deb`, the documented `cargo build --release -p
//! gpushare-agent` and a plain `cargo build --release` never build the agent again after one
//! another (a fat-LTO link, minutes). It breaks where a crate the agent uses gets a feature from
//! another member that the agent's own build does not turn on (an empty `default = []` of
//! `gpushare-common` once did): checked with `cargo tree`, which resolves features as a build does.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

use anyhow::{Context, Result, bail};

/// Each package's features (`name version` -> feature sets), as `cargo tree <scope>` resolves them
/// for normal and build dependencies on this host.
fn features(root: &Path, scope: &[&str]) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let out = Command::new("cargo")
        .current_dir(root)
        .args([
            "tree",
            "--locked",
            "--offline",
            "-e",
            "normal,build",
            "--prefix",
            "none",
        ])
        .args(["-f", "{p}|{f}"])
        .args(scope)
        .output()
        .context("running cargo tree")?;
    if !out.status.success() {
        bail!(
            "cargo tree {}: {}",
            scope.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(parse(&String::from_utf8_lossy(&out.stdout)))
}

fn parse(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        let Some((pkg, feats)) = line.split_once('|') else {
            continue;
        };
        // `name v1.2.3 (/path)`: the name and version; ` (*)` marks a repeat.
        let pkg: Vec<&str> = pkg.split_whitespace().take(2).collect();
        let feats = feats
            .trim_end_matches(" (*)")
            .trim_end_matches(" (proc-macro)");
        out.entry(pkg.join(" "))
            .or_default()
            .insert(feats.trim().to_string());
    }
    out
}

/// The packages whose features differ between the agent's build and the workspace's.
fn differences(
    agent: &BTreeMap<String, BTreeSet<String>>,
    workspace: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    agent
        .iter()
        .filter(|(p, f)| workspace.get(*p) != Some(*f))
        .map(|(p, f)| {
            format!(
                "{p}: {:?} in the agent's build, {:?} in the workspace's",
                f,
                workspace.get(p)
            )
        })
        .collect()
}

/// The problem, where the agent's build and the workspace's resolve a package the agent uses
/// with other features.
pub fn check(root: &Path) -> Result<Option<String>> {
    let agent = features(root, &["-p", "gpushare-agent"])?;
    let workspace = features(root, &["--workspace"])?;
    let diff = differences(&agent, &workspace);
    Ok((!diff.is_empty()).then(|| {
        format!(
            "the agent's release build and the workspace's differ (each would build the agent \
             again after the other):\n  {}\n(give the crate the same features in both: no \
             feature that only another member turns on)",
            diff.join("\n  ")
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_package_with_other_features_in_the_workspace_is_a_difference() {
        let agent = parse(
            "gpushare-common v0.1.0 (/w/gpushare-common)|user\nlibc v0.2.1|default,std\n\
             libc v0.2.1|default,std (*)\n",
        );
        let same = parse("libc v0.2.1|default,std\ngpushare-common v0.1.0 (/w/c)|user\nx v1|\n");
        assert!(differences(&agent, &same).is_empty());
        let other = parse("libc v0.2.1|default,std\ngpushare-common v0.1.0 (/w/c)|default,user\n");
        let d = differences(&agent, &other);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].starts_with("gpushare-common v0.1.0"), "{d:?}");
    }
}
