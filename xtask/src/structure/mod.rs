//! `cargo xtask structure`: the structural limits of the agent's source that later work must not
//! grow back unnoticed (issue 19). Run as a step of `cargo xtask test`.
//!
//! - Every file of `gpushare-agent/src/policy/` but its tests is at most [`POLICY_FILE_MAX`] lines,
//!   and `policy::evaluate` at most [`EVALUATE_MAX`] (it reads as the stages in order).
//! - `gpushare-agent/src/enforce/mod.rs` is at most [`ENFORCE_MOD_MAX`] lines.
//! - Every file of `gpushare-agent/src/agent/` but its tests is at most [`AGENT_FILE_MAX`] lines:
//!   the room is the step alone; sources go to `grants/` and `observe/`, executors to `enforce/`.
//! - The top-level modules of `gpushare-agent/src` form no import cycle: an edge A -> B is any path
//!   `crate::B` (or `super::` that climbs to the crate root, then `B`) in the code of A, comments
//!   left out, tests included.
//! - No module of `quota/` names `attribution`, and no module of `attribution/` names `quota`.
//! - `quota/` and `grants/` never name `enforce`, `snapshot` or `metrics`; `agent/` never names
//!   `metrics`, and no module but `metrics` names `prometheus_client` (see [`reporting`]): one
//!   door for reporting, the snapshot.
//! - Grants are combined in one place: no file of the agent but `grants/merge.rs` names the
//!   smallest-wins combinator (`smallest`, `smallest_of`) outside tests; the others call the
//!   combination `merge.rs` names (issue 40: it was called from three rooms).
//! - Every grant source in one shape: each file of `grants/` but `mod.rs` and `merge.rs` says in
//!   its module doc what it reads and what it grants per GPU with which source: see [`grants`].
//! - No two files of the agent import each other (a parent module and its child aside): see
//!   [`files`].
//! - No function over [`functions::FN_MAX`] lines outside tests, but a list of exceptions that
//!   may only shrink: see [`functions`].
//! - At most [`dupes::BUDGET`] pairs of files sharing a copied run of lines: see [`dupes`].
//! - One name a type: no two public types (struct, enum, type alias, trait) of the agent share a
//!   name (`Counters`, `Mode`, `Cause` each once named two).
//!
//! - Tests in one kind of place: a module's unit tests are inline (`mod tests { .. }`) or in its
//!   own `tests.rs` (and `tests/`); no `*_tests.rs` beside it, no `#[path]` (issue 40: four kinds
//!   of place once), in any crate's `src/`, `tests/`, `benches/`, `examples/`, fuzz targets and
//!   build script (a bench once compiled the integration tests' fake API server with `#[path]`).
//! - The walk from one NVML sample to a freeze and to `/metrics`, kept in `docs/architecture.md`,
//!   names functions that exist, states its counts, and crosses no more rooms and makes no more
//!   returns than it did: see [`walk`].
//! - One build: the agent's build and the whole workspace's resolve every package the agent uses
//!   with the same features (see [`crate::one_build`]).
//!
//! The check reads files as text and asks `cargo tree` (offline, `--locked`): no build.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

mod dupes;
mod files;
mod functions;
mod grants;
mod reporting;
mod walk;

/// Lines a file of `policy/` (tests aside) may have.
pub const POLICY_FILE_MAX: usize = 350;
/// Lines `policy::evaluate` may have, from its signature to its closing brace.
pub const EVALUATE_MAX: usize = 80;
/// Lines `enforce/mod.rs` may have.
pub const ENFORCE_MOD_MAX: usize = 500;
/// Lines a file of `agent/` (the step: tick, act, publish, shutdown) may have, tests aside.
pub const AGENT_FILE_MAX: usize = 400;

/// Modules that must not name each other, in either direction.
const APART: [(&str, &str); 1] = [("quota", "attribution")];

/// Modules that must not name others, and why: what the operator wrote and what grants a limit
/// (`quota`, `grants`) stay pure of how a limit is enforced and reported; the step (`agent`)
/// reports through the snapshot alone (issue 40: histograms once written straight into
/// `Metrics`).
const NEVER: [(&str, &[&str], &str); 3] = [
    (
        "quota",
        &["enforce", "snapshot", "metrics"],
        "keep it pure of enforcement and reporting",
    ),
    (
        "grants",
        &["enforce", "snapshot", "metrics"],
        "keep it pure of enforcement and reporting",
    ),
    (
        "agent",
        &["metrics"],
        "the step reports through the snapshot alone: carry what it counted or measured there \
         as a typed field, and render it in a family of `metrics/`",
    ),
];

/// The one file that combines grants, below `gpushare-agent/src`.
const MERGE_FILE: &str = "grants/merge.rs";

/// The smallest-wins combinator's names.
const COMBINATOR: [&str; 2] = ["smallest", "smallest_of"];

/// Runs every check on the workspace at `root`; the error lists every violation.
pub fn check(root: &Path) -> Result<()> {
    let src = root.join("gpushare-agent/src");
    let mut problems = Vec::new();
    problems.extend(policy_sizes(&src.join("policy"))?);
    let enforce = src.join("enforce/mod.rs");
    let n = line_count(&enforce)?;
    if n > ENFORCE_MOD_MAX {
        problems.push(format!(
            "{}: {n} lines, over {ENFORCE_MOD_MAX}: move a job into its own file",
            rel(root, &enforce)
        ));
    }
    problems.extend(
        oversized(&src.join("agent"), AGENT_FILE_MAX)?
            .into_iter()
            .map(|(f, n)| {
                format!(
                    "{}: {n} lines, over {AGENT_FILE_MAX}: `agent/` is the step alone; move a \
                     source to `grants/` or `observe/`, an executor to `enforce/`, or split the part",
                    rel(root, &f)
                )
            }),
    );
    let graph = module_graph(&src)?;
    for cycle in cycles(&graph) {
        problems.push(format!(
            "import cycle between modules of gpushare-agent/src: {} (an edge A -> B is a `crate::B` \
             path in A; break it by moving the shared part below both)",
            cycle.join(" -> ")
        ));
    }
    for (a, b) in APART {
        for (from, to) in [(a, b), (b, a)] {
            if graph.get(from).is_some_and(|e| e.contains_key(to)) {
                let at = &graph[from][to];
                problems.push(format!(
                    "{}: module `{from}` names `{to}` (they must not depend on each other)",
                    rel(root, at)
                ));
            }
        }
    }
    for (from, tos, why) in NEVER {
        for to in tos {
            if let Some(at) = graph.get(from).and_then(|e| e.get(*to)) {
                problems.push(format!(
                    "{}: module `{from}` names `{to}` (it must not: {why})",
                    rel(root, at)
                ));
            }
        }
    }
    problems.extend(reporting::encoders_elsewhere(root, &src)?);
    problems.extend(merges_elsewhere(root, &src)?);
    problems.extend(grants::check(root, &src.join("grants"))?);
    problems.extend(files::mutual_imports(&src)?.into_iter().map(|(a, b)| {
        format!(
            "{} and {} import each other: move what both need below both",
            rel(root, &a),
            rel(root, &b)
        )
    }));
    problems.extend(functions::check(root, functions::EXCEPTIONS)?);
    let (copies, over) = dupes::check(root)?;
    problems.extend(over);
    problems.extend(crate::one_build::check(root)?);
    problems.extend(test_places(root)?);
    let (walk_problems, walked) = walk::check(root)?;
    problems.extend(walk_problems);
    for (name, at) in same_names(&src)? {
        problems.push(format!(
            "the public type `{name}` is defined in {}: one name a type (rename one for what it \
             is)",
            at.iter()
                .map(|p| rel(root, p))
                .collect::<Vec<_>>()
                .join(" and ")
        ));
    }
    if problems.is_empty() {
        eprintln!(
            "xtask: structure: policy files <= {POLICY_FILE_MAX} lines, evaluate <= {EVALUATE_MAX}, \
             enforce/mod.rs <= {ENFORCE_MOD_MAX}, agent/ files <= {AGENT_FILE_MAX}, {} modules without an import cycle, no two \
             files importing each other, quota/ and grants/ pure, agent/ reporting through the snapshot, \
             prometheus_client in metrics/ alone, grants combined in {MERGE_FILE} alone, every grant source in one shape, one name a type, tests in their places, one build, functions <= {} lines ({} \
             listed exceptions), {copies} pairs of files sharing a copy (budget {}), {}",
            graph.len(),
            functions::FN_MAX,
            functions::EXCEPTIONS.len(),
            dupes::BUDGET,
            walked.map_or(String::new(), |(now, then)| format!(
                "the walk from an NVML sample to a freeze and /metrics: {} files in {} rooms with \
                 {} returns (at most {} and {}; the base of issue 40, 6b536f4: {} files, {} rooms, \
                 {} returns)",
                now.files,
                now.rooms,
                now.returns,
                walk::ROOMS_MAX,
                walk::RETURNS_MAX,
                then.files,
                then.rooms,
                then.returns
            ))
        );
        Ok(())
    } else {
        for p in &problems {
            eprintln!("xtask: structure: {p}");
        }
        bail!("{} structural limit(s) exceeded", problems.len())
    }
}

pub(crate) fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

fn line_count(p: &Path) -> Result<usize> {
    Ok(std::fs::read_to_string(p)
        .with_context(|| format!("reading {}", p.display()))?
        .lines()
        .count())
}

/// `.rs` files below `dir`, sorted.
pub(crate) fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A file of tests: `tests.rs`, `<name>_tests.rs`, or anything under a `tests/` folder.
pub(crate) fn is_test_file(p: &Path) -> bool {
    p.components().any(|c| c.as_os_str() == "tests")
        || p.file_stem()
            .and_then(|s| s.to_str())
            .is_some_and(|s| s == "tests" || s.ends_with("_tests"))
}

/// The name of a public type a line defines (`pub struct Name`, `pub(crate) enum Name<T>`...).
fn type_defined(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let rest = t.strip_prefix("pub ").or_else(|| {
        t.strip_prefix("pub(")
            .and_then(|r| r.split_once(") ").map(|(_, r)| r))
    })?;
    let rest = ["struct ", "enum ", "type ", "trait "]
        .iter()
        .find_map(|k| rest.strip_prefix(k))?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    Some(&rest[..end]).filter(|n| !n.is_empty())
}

/// The first line of a file's inline test module (`#[cfg(test)]` then `mod name {`), or its
/// length: code from there on is tests (`#[cfg(test)]` on an item or on `mod tests;` is not).
pub(crate) fn tests_start(lines: &[&str]) -> usize {
    lines
        .windows(2)
        .position(|w| {
            w[0].trim_start().starts_with("#[cfg(test)]")
                && w[1].trim_start().starts_with("mod ")
                && w[1].contains('{')
        })
        .unwrap_or(lines.len())
}

/// Public type names defined in more than one file below `src` (tests aside), with the files.
fn same_names(src: &Path) -> Result<Vec<(String, Vec<PathBuf>)>> {
    let mut at: BTreeMap<String, BTreeSet<PathBuf>> = BTreeMap::new();
    for f in rust_files(src)? {
        if is_test_file(f.strip_prefix(src).unwrap_or(&f)) {
            continue;
        }
        let code = strip_comments(&std::fs::read_to_string(&f)?);
        let lines: Vec<&str> = code.lines().collect();
        for line in &lines[..tests_start(&lines)] {
            if let Some(name) = type_defined(line) {
                at.entry(name.to_string()).or_default().insert(f.clone());
            }
        }
    }
    Ok(at
        .into_iter()
        .filter(|(_, files)| files.len() > 1)
        .map(|(n, files)| (n, files.into_iter().collect()))
        .collect())
}

/// Where a file of the agent other than [`MERGE_FILE`] names the combinator outside its tests.
fn merges_elsewhere(root: &Path, src: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for f in rust_files(src)? {
        let inside = f.strip_prefix(src).unwrap_or(&f);
        if inside == Path::new(MERGE_FILE) || is_test_file(inside) {
            continue;
        }
        let code = strip_comments(&std::fs::read_to_string(&f)?);
        for n in combinator_lines(&code) {
            problems.push(format!(
                "{}:{n}: the smallest-wins combinator is called outside {MERGE_FILE}: combine \
                 grants there (name the combination in `grants::merge`) and call that",
                rel(root, &f)
            ));
        }
    }
    Ok(problems)
}

/// The lines (1-based) of `code` (comments and strings stripped) before its tests that name the
/// combinator.
pub fn combinator_lines(code: &str) -> Vec<usize> {
    let lines: Vec<&str> = code.lines().collect();
    lines[..tests_start(&lines)]
        .iter()
        .enumerate()
        .filter(|(_, l)| tokenize(l).iter().any(|t| COMBINATOR.contains(t)))
        .map(|(i, _)| i + 1)
        .collect()
}

/// Where a crate keeps its Rust files: library and binaries, integration tests, benches,
/// examples, fuzz targets (the build script aside, see [`crate_rust_files`]).
const RUST_PLACES: [&str; 5] = ["src", "tests", "benches", "examples", "fuzz_targets"];

/// The `.rs` files of the crate at `krate`: below each of [`RUST_PLACES`] it has, and its
/// `build.rs`.
fn crate_rust_files(krate: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for place in RUST_PLACES {
        let dir = krate.join(place);
        if dir.is_dir() {
            out.extend(rust_files(&dir)?);
        }
    }
    let build = krate.join("build.rs");
    if build.is_file() {
        out.push(build);
    }
    Ok(out)
}

/// Unit tests out of their places in the workspace's crates (each folder of `root` with a
/// `Cargo.toml`, every file of [`crate_rust_files`]: `src/`, and `tests/`, `benches/`... too, where
/// a bench once compiled the integration tests' fake API server with `#[path]`): files named
/// `*_tests.rs`, and `#[path]` attributes (a file compiled as a module it is not beside).
fn test_places(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut crates = Vec::new();
    for e in std::fs::read_dir(root)? {
        let krate = e?.path();
        if krate.join("Cargo.toml").is_file() {
            crates.push(krate);
        }
    }
    crates.sort();
    for krate in crates {
        for f in crate_rust_files(&krate)? {
            let shown = rel(root, &f);
            if f.file_stem()
                .and_then(|s| s.to_str())
                .is_some_and(|s| s.ends_with("_tests"))
            {
                problems.push(format!(
                    "{shown}: tests beside their module: move them into the module's own \
                     `tests.rs` (`<module>/tests.rs`, declared `#[cfg(test)] mod tests;`)"
                ));
            }
            let code = strip_comments(&std::fs::read_to_string(&f)?);
            if let Some(n) = code
                .lines()
                .position(|l| l.trim_start().starts_with("#[path"))
            {
                problems.push(format!(
                    "{shown}:{}: `#[path]`: a module is the file of its name (move the file, or \
                     share it through a crate such as gpushare-base or gpushare-fake-kube)",
                    n + 1
                ));
            }
        }
    }
    Ok(problems)
}

/// The files below `dir` (tests aside) over `max` lines, with their sizes.
fn oversized(dir: &Path, max: usize) -> Result<Vec<(PathBuf, usize)>> {
    let mut out = Vec::new();
    for f in rust_files(dir)? {
        if is_test_file(f.strip_prefix(dir).unwrap_or(&f)) {
            continue;
        }
        let n = line_count(&f)?;
        if n > max {
            out.push((f, n));
        }
    }
    Ok(out)
}

fn policy_sizes(dir: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let root = dir.parent().and_then(Path::parent).and_then(Path::parent);
    let shown = |p: &Path| root.map_or_else(|| p.display().to_string(), |r| rel(r, p));
    for f in rust_files(dir)? {
        if is_test_file(f.strip_prefix(dir).unwrap_or(&f)) {
            continue;
        }
        let text = std::fs::read_to_string(&f)?;
        let n = text.lines().count();
        if n > POLICY_FILE_MAX {
            problems.push(format!(
                "{}: {n} lines, over {POLICY_FILE_MAX}: one stage a file",
                shown(&f)
            ));
        }
        if let Some(n) = fn_lines(&text, "evaluate")
            && n > EVALUATE_MAX
        {
            problems.push(format!(
                "{}: `evaluate` is {n} lines, over {EVALUATE_MAX}: it should read as the stages in order",
                shown(&f)
            ));
        }
    }
    Ok(problems)
}

/// Lines of the top-level function `name` (`fn name` at the start of a line, after an optional
/// `pub`), through the first closing brace at the start of a line.
pub fn fn_lines(text: &str, name: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| {
        let l = l.strip_prefix("pub ").unwrap_or(l);
        let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
        l.strip_prefix("fn ").is_some_and(|rest| {
            rest.strip_prefix(name)
                .is_some_and(|r| r.starts_with('(') || r.starts_with('<'))
        })
    })?;
    let end = lines[start..].iter().position(|l| *l == "}")?;
    Some(end + 1)
}

/// Removes `//` comments (doc comments included) and `/* */` blocks, and the contents of string
/// literals, keeping line structure.
pub fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
                i += 2;
            }
            b'"' => {
                out.push('"');
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    } else if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
                out.push('"');
                i += 1;
            }
            // A char literal ('"'), not a lifetime ('a): skip it whole.
            b'\'' if b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\') => {
                let close = b[i + 1..]
                    .iter()
                    .skip(1)
                    .position(|&c| c == b'\'')
                    .map_or(b.len(), |p| i + 2 + p);
                i = close + 1;
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

/// The top-level modules a file's code names. `depth`: how deep the file's module is below the
/// crate root (`quota/env.rs` is 2, `quota/mod.rs` and `status.rs` 1), for `super::` paths.
pub fn named_modules(code: &str, depth: usize) -> BTreeSet<String> {
    let tokens = tokenize(code);
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < tokens.len() {
        // The path's start: `crate`, or a run of `super` that climbs to the root.
        let mut j = i;
        let at_root = if tokens[i] == "crate" {
            j = i + 1;
            true
        } else if tokens[i] == "super" && (i == 0 || tokens[i - 1] != "::") {
            let mut k = 0;
            while tokens.get(j) == Some(&"super") {
                k += 1;
                j += 1;
                if tokens.get(j) == Some(&"::") && tokens.get(j + 1) == Some(&"super") {
                    j += 1;
                }
            }
            k >= depth
        } else {
            false
        };
        if at_root && tokens.get(j) == Some(&"::") {
            match tokens.get(j + 1) {
                Some(&"{") => {
                    // `crate::{a::b, c, d::{e}}`: the names at depth 1.
                    let mut d = 0;
                    let mut expect = true;
                    for t in &tokens[j + 1..] {
                        match *t {
                            "{" => {
                                d += 1;
                                if d == 1 {
                                    expect = true;
                                }
                            }
                            "}" => {
                                d -= 1;
                                if d == 0 {
                                    break;
                                }
                            }
                            "," if d == 1 => expect = true,
                            t if d == 1 && expect => {
                                if is_ident(t) && t != "self" {
                                    out.insert(t.to_string());
                                }
                                expect = false;
                            }
                            _ => {}
                        }
                    }
                }
                Some(t) if is_ident(t) => {
                    out.insert((*t).to_string());
                }
                _ => {}
            }
        }
        i = j.max(i + 1);
    }
    out
}

pub(crate) fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && t.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Identifiers, `::`, and single punctuation characters.
pub(crate) fn tokenize(code: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphanumeric() || c == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(&code[s..i]);
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            out.push("::");
            i += 2;
        } else if c.is_ascii_whitespace() || !c.is_ascii() {
            i += 1;
        } else {
            out.push(&code[i..i + 1]);
            i += 1;
        }
    }
    out
}

/// Module -> (module it names -> the first file that names it).
pub type Graph = BTreeMap<String, BTreeMap<String, PathBuf>>;

/// The graph of the top-level modules of the crate whose `lib.rs` is in `src`.
pub fn module_graph(src: &Path) -> Result<Graph> {
    let mut modules = BTreeMap::new();
    for e in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let p = e?.path();
        let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        if name == "lib" || name == "main" {
            continue;
        }
        if p.is_dir() || p.extension().is_some_and(|x| x == "rs") {
            modules.insert(name.to_string(), p);
        }
    }
    let mut graph = Graph::new();
    for (m, p) in &modules {
        let files = if p.is_dir() {
            rust_files(p)?
        } else {
            vec![p.clone()]
        };
        let edges = graph.entry(m.clone()).or_default();
        for f in files {
            // quota/env.rs -> 2; quota/mod.rs -> 1; status.rs -> 1.
            let below = f.strip_prefix(src).unwrap_or(&f).components().count();
            let depth = if f.file_stem().is_some_and(|s| s == "mod") {
                below - 1
            } else {
                below
            };
            let code = strip_comments(&std::fs::read_to_string(&f)?);
            for n in named_modules(&code, depth) {
                if n != *m && modules.contains_key(&n) {
                    edges.entry(n).or_insert_with(|| f.clone());
                }
            }
        }
    }
    Ok(graph)
}

/// One cycle for each strongly connected component of more than one module, as a path that
/// returns to its start.
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for start in graph.keys() {
        if seen.contains(start) {
            continue;
        }
        // A shortest path from a successor of `start` back to `start`, by breadth first search.
        let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.as_str()]);
        let mut found = false;
        while let Some(v) = queue.pop_front() {
            for w in graph.get(v).into_iter().flat_map(|e| e.keys()) {
                if w == start {
                    prev.insert(start, v);
                    found = true;
                    break;
                }
                if !prev.contains_key(w.as_str()) {
                    prev.insert(w, v);
                    queue.push_back(w);
                }
            }
            if found {
                break;
            }
        }
        if found {
            let mut path = vec![start.clone()];
            let mut v = prev[start.as_str()];
            while v != start {
                path.push(v.to_string());
                v = prev[v];
            }
            path.push(start.clone());
            path.reverse();
            seen.extend(path.iter().cloned());
            out.push(path);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)]) -> Graph {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(a.to_string())
                .or_default()
                .insert(b.to_string(), PathBuf::from(a));
            g.entry(b.to_string()).or_default();
        }
        g
    }

    #[test]
    fn names_paths_use_groups_and_super_chains_but_not_comments_or_strings() {
        let code = strip_comments(
            "use crate::{a::X, b, c::{d::Y}, self};\n\
             // crate::comment\n/// [`crate::doc`]\n/* crate::block */\n\
             let s = \"crate::string\"; let c = '\"'; fn f<'a>(x: &'a crate::e::T) {}\n\
             use super::super::f::Z; use super::g;\n",
        );
        let names = named_modules(&code, 2);
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["a", "b", "c", "e", "f"],
            "{code}"
        );
        // One level deep, `super::g` climbs to the root.
        assert!(named_modules("use super::g;", 1).contains("g"));
        assert!(!named_modules("use super::g;", 2).contains("g"));
    }

    #[test]
    fn finds_each_cycle_once_and_none_in_a_dag() {
        assert!(cycles(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
        let c = cycles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]));
        assert_eq!(c, vec![vec!["a", "b", "c", "a"]]);
        let two = cycles(&graph(&[("a", "b"), ("b", "a"), ("x", "y"), ("y", "x")]));
        assert_eq!(two.len(), 2);
    }

    #[test]
    fn the_combinator_is_found_where_called_used_or_imported_but_not_in_words_or_tests() {
        let code = strip_comments(
            "use crate::grants::merge::smallest_of;\n\
             let q = merge::smallest(&a, &b); // smallest\n\
             let s = \"the smallest applies\"; let smallest_gpu = 1;\n\
             xs.fold(q, merge::smallest_of)\n\
             #[cfg(test)]\nmod tests {\n    smallest_of(a, b);\n}\n",
        );
        assert_eq!(combinator_lines(&code), vec![1, 2, 4]);
    }

    #[test]
    fn measures_a_top_level_function() {
        let text = "x\npub fn evaluate(a: u8) -> u8 {\n    a\n}\nfn other() {}\n";
        assert_eq!(fn_lines(text, "evaluate"), Some(3));
        assert_eq!(fn_lines(text, "evaluate_more"), None);
        assert_eq!(fn_lines("fn evaluate<'a>() {\n}\n", "evaluate"), Some(2));
    }

    #[test]
    fn a_file_over_the_limit_is_found_and_tests_are_not() {
        let dir = std::env::temp_dir().join(format!("xtask-oversized-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("tests")).unwrap();
        std::fs::write(dir.join("mod.rs"), "x\n".repeat(AGENT_FILE_MAX)).unwrap();
        std::fs::write(dir.join("tick.rs"), "x\n".repeat(AGENT_FILE_MAX + 1)).unwrap();
        std::fs::write(dir.join("tests/big.rs"), "x\n".repeat(AGENT_FILE_MAX * 2)).unwrap();
        std::fs::write(dir.join("act_tests.rs"), "x\n".repeat(AGENT_FILE_MAX * 2)).unwrap();
        let found = oversized(&dir, AGENT_FILE_MAX).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, vec![(dir.join("tick.rs"), AGENT_FILE_MAX + 1)]);
    }

    #[test]
    fn a_public_type_name_defined_twice_is_found() {
        assert_eq!(type_defined("pub struct Counters {"), Some("Counters"));
        assert_eq!(type_defined("    pub(crate) enum Mode<T> {"), Some("Mode"));
        assert_eq!(type_defined("pub type Wanted = X;"), Some("Wanted"));
        assert_eq!(type_defined("struct Private;"), None);
        assert_eq!(type_defined("pub fn structure() {}"), None);
        let dir = std::env::temp_dir().join(format!("xtask-names-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(
            dir.join("a/mod.rs"),
            "pub struct Counters;\npub enum Only {}\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("b.rs"),
            "#[cfg(test)]\nmod helpers;\npub struct Counters;\n#[cfg(test)]\nmod tests {\n    pub enum Only {}\n}\n",
        )
        .unwrap();
        std::fs::write(dir.join("c_tests.rs"), "pub struct Counters;\n").unwrap();
        let found = same_names(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            found,
            vec![(
                "Counters".to_string(),
                vec![dir.join("a/mod.rs"), dir.join("b.rs")]
            )]
        );
    }

    #[test]
    fn tests_files_are_not_limited() {
        assert!(is_test_file(Path::new("tests.rs")));
        assert!(is_test_file(Path::new("tests/ladder.rs")));
        assert!(is_test_file(Path::new("claims_tests.rs")));
        assert!(!is_test_file(Path::new("ladder.rs")));
    }

    #[test]
    fn tests_out_of_place_are_found_in_every_crate_folder_but_not_in_comments() {
        let dir = std::env::temp_dir().join(format!("xtask-places-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in [
            "a/src",
            "a/tests/integration",
            "a/benches",
            "a/examples",
            "fz/fuzz_targets",
        ] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::create_dir_all(dir.join("loose/src")).unwrap();
        for (f, text) in [
            ("a/Cargo.toml", ""),
            ("fz/Cargo.toml", ""),
            ("a/src/lib.rs", "// #[path = \"x.rs\"]\nmod x;\n"),
            ("a/src/x.rs", "fn x() {}\n"),
            ("a/src/x_tests.rs", "fn t() {}\n"),
            (
                "a/tests/integration/main.rs",
                "mod util;\n    #[path = \"../f.rs\"]\nmod f;\n",
            ),
            (
                "a/benches/fleet.rs",
                "#[allow(dead_code)]\n#[path = \"../tests/f.rs\"]\nmod f;\n",
            ),
            ("a/examples/e.rs", "#[path=\"y.rs\"] mod y;\n"),
            ("a/build.rs", "fn main() {}\n"),
            (
                "fz/fuzz_targets/t.rs",
                "#[path = \"../../a/src/x.rs\"]\nmod x;\n",
            ),
            // Not a crate: not looked at.
            ("loose/src/l.rs", "#[path = \"m.rs\"]\nmod m;\n"),
        ] {
            std::fs::write(dir.join(f), text).unwrap();
        }
        let found = test_places(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let at: Vec<&str> = found
            .iter()
            .map(|p| p.split(": ").next().unwrap())
            .collect();
        assert_eq!(
            at,
            [
                "a/src/x_tests.rs",
                "a/tests/integration/main.rs:2",
                "a/benches/fleet.rs:2",
                "a/examples/e.rs:1",
                "fz/fuzz_targets/t.rs:1",
            ],
            "{found:#?}"
        );
    }
}
