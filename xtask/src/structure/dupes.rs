//! The duplicate-code budget: at most [`BUDGET`] pairs of files (a file may pair with itself) that
//! share a run of [`MIN_LINES`] or more identical lines of Rust, anywhere in the workspace (tests,
//! benches and the fuzz targets included: a copied test helper drifts as surely as copied code).
//!
//! Lines are compared as written, white space folded; blank lines, comment lines, `use` lines and
//! lines of lone punctuation are passed over (they repeat without being a copy). A run that stands
//! in more than [`TOO_COMMON`] places is an idiom, not a copy, and is not counted. Lines of the
//! same shape with other names are not counted either: the library's `duplicates` command shows
//! those too, and is the tool for a clean-up; this check keeps the copies that came back from
//! growing unseen (issue 40: 19 pairs after one reshaping, 73 after the next).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use super::rel;

/// How many shared lines make a copy.
pub const MIN_LINES: usize = 6;
/// A run standing in more places than this is an idiom.
pub const TOO_COMMON: usize = 8;
/// How many pairs of files may share a copy.
pub const BUDGET: usize = 20;

/// One copy: where it stands in each file of the pair (1-based first and last line), the longest
/// run the pair shares, and how many runs the pair shares in all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    pub a: (PathBuf, usize, usize),
    pub b: (PathBuf, usize, usize),
    pub runs: usize,
}

/// A run of shared windows: its first window in the first file, how many windows, and the offset
/// of its place in the second file.
type Run = (usize, usize, isize);

/// The line as compared, or `None` where it does not count.
fn significant(raw: &str) -> Option<String> {
    let t = raw.trim();
    if t.is_empty()
        || t.starts_with("//")
        || t.starts_with("use ")
        || t.starts_with("pub use ")
        || t.starts_with("pub(crate) use ")
        || t.chars().all(|c| "{}()[];,".contains(c))
    {
        return None;
    }
    Some(t.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The counted lines of a file: (text, 1-based line number).
fn lines_of(text: &str) -> Vec<(String, usize)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| significant(l).map(|s| (s, i + 1)))
        .collect()
}

/// The pairs of files among `files` (path, text) that share a run of [`MIN_LINES`] lines or
/// more, most shared first.
pub fn pairs(files: &[(PathBuf, String)]) -> Vec<Pair> {
    let lines: Vec<Vec<(String, usize)>> = files.iter().map(|(_, t)| lines_of(t)).collect();
    let mut windows: HashMap<Vec<&str>, Vec<(usize, usize)>> = HashMap::new();
    for (f, ls) in lines.iter().enumerate() {
        for (i, w) in ls.windows(MIN_LINES).enumerate() {
            windows
                .entry(w.iter().map(|(s, _)| s.as_str()).collect())
                .or_default()
                .push((f, i));
        }
    }
    // Each shared window as a point on the diagonal of its two places; consecutive points on one
    // diagonal are one run.
    let mut diagonals: BTreeMap<(usize, usize, isize), BTreeSet<usize>> = BTreeMap::new();
    for at in windows.values() {
        if at.len() < 2 || at.len() > TOO_COMMON {
            continue;
        }
        for (k, &(fa, ia)) in at.iter().enumerate() {
            for &(fb, ib) in &at[k + 1..] {
                let ((fa, ia), (fb, ib)) = if (fa, ia) <= (fb, ib) {
                    ((fa, ia), (fb, ib))
                } else {
                    ((fb, ib), (fa, ia))
                };
                // A file against itself: only runs that do not overlap themselves.
                if fa == fb && ib - ia < MIN_LINES {
                    continue;
                }
                diagonals
                    .entry((fa, fb, ib as isize - ia as isize))
                    .or_default()
                    .insert(ia);
            }
        }
    }
    // Runs per pair of files: (start in a, windows in the run, offset to b).
    let mut by_files: BTreeMap<(usize, usize), Vec<Run>> = BTreeMap::new();
    for ((fa, fb, d), starts) in diagonals {
        let mut run: Option<(usize, usize)> = None;
        for s in starts {
            run = match run {
                Some((first, n)) if first + n == s => Some((first, n + 1)),
                Some(r) => {
                    by_files.entry((fa, fb)).or_default().push((r.0, r.1, d));
                    Some((s, 1))
                }
                None => Some((s, 1)),
            };
        }
        if let Some(r) = run {
            by_files.entry((fa, fb)).or_default().push((r.0, r.1, d));
        }
    }
    let mut out: Vec<(usize, Pair)> = by_files
        .into_iter()
        .map(|((fa, fb), runs)| {
            let &(start, n, d) = runs
                .iter()
                .max_by_key(|r| (r.1, std::cmp::Reverse(r.0)))
                .unwrap();
            let len = n + MIN_LINES - 1;
            let span =
                |f: usize, s: usize| (files[f].0.clone(), lines[f][s].1, lines[f][s + len - 1].1);
            let sb = (start as isize + d) as usize;
            (
                len,
                Pair {
                    a: span(fa, start),
                    b: span(fb, sb),
                    runs: runs.len(),
                },
            )
        })
        .collect();
    out.sort_by(|x, y| y.0.cmp(&x.0).then_with(|| x.1.a.cmp(&y.1.a)));
    out.into_iter().map(|(_, p)| p).collect()
}

/// The Rust files of the workspace at `root`: every crate's (a folder with a `Cargo.toml`) and
/// the fuzz targets, build outputs aside.
pub fn workspace_files(root: &Path) -> Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "corpus") {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") {
                let text = std::fs::read_to_string(&p)
                    .with_context(|| format!("reading {}", p.display()))?;
                out.push((p, text));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The budget's problem, if the workspace at `root` is over it, and the count either way.
pub fn check(root: &Path) -> Result<(usize, Option<String>)> {
    let found = pairs(&workspace_files(root)?);
    if found.len() <= BUDGET {
        return Ok((found.len(), None));
    }
    let rows: Vec<String> = found
        .iter()
        .map(|p| {
            format!(
                "  {}:{}-{} ~ {}:{}-{}{}",
                rel(root, &p.a.0),
                p.a.1,
                p.a.2,
                rel(root, &p.b.0),
                p.b.1,
                p.b.2,
                if p.runs > 1 {
                    format!(" (+{} more runs)", p.runs - 1)
                } else {
                    String::new()
                }
            )
        })
        .collect();
    Ok((
        found.len(),
        Some(format!(
            "{} pairs of files share a copy of {MIN_LINES} or more lines, over the budget of \
             {BUDGET}: make one piece of code serve both (a helper, a table, a loop)\n{}",
            found.len(),
            rows.join("\n")
        )),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(tag: &str) -> String {
        (1..=7)
            .map(|i| format!("    let {tag}{i} = compute({i}) + offset;\n"))
            .collect()
    }

    #[test]
    fn a_copied_run_is_one_pair_and_what_does_not_count_is_passed_over() {
        let copied = body("v");
        let a = format!("fn a() {{\n{copied}}}\n");
        // The same run with comments, blank lines, imports and other spacing between its lines.
        let spaced: String = copied
            .lines()
            .map(|l| {
                format!(
                    "{}\n\n// a note\nuse x::y;\n}}\n",
                    l.replace(" = ", "  =  ")
                )
            })
            .collect();
        let b = format!("fn b() {{\n{spaced}}}\n");
        let other = format!("fn c() {{\n{}}}\n", body("w"));
        let found = pairs(&[
            ("a.rs".into(), a),
            ("b.rs".into(), b),
            ("c.rs".into(), other),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].a, ("a.rs".into(), 2, 8));
        assert_eq!(found[0].b.0, PathBuf::from("b.rs"));
        assert_eq!(found[0].runs, 1);
    }

    #[test]
    fn five_lines_are_not_a_copy_and_an_idiom_in_many_places_is_not_either() {
        let five: String = body("v")
            .lines()
            .take(5)
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(pairs(&[("a.rs".into(), five.clone()), ("b.rs".into(), five)]).is_empty());
        let files: Vec<(PathBuf, String)> = (0..=TOO_COMMON)
            .map(|i| (PathBuf::from(format!("f{i}.rs")), body("v")))
            .collect();
        assert!(pairs(&files).is_empty());
        assert_eq!(
            pairs(&files[..TOO_COMMON]).len(),
            TOO_COMMON * (TOO_COMMON - 1) / 2
        );
    }

    #[test]
    fn a_file_repeating_itself_is_a_pair_but_a_run_of_one_line_is_not() {
        let text = format!("{}\nfn x() {{}}\n{}", body("v"), body("v"));
        let found = pairs(&[("a.rs".into(), text)]);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].a.1, found[0].b.1), (1, 10));
        let same: String = "    total += step;\n".repeat(30);
        assert!(pairs(&[("a.rs".into(), same)]).is_empty());
    }
}
