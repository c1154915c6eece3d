//! The walk (issue 40): the path a newcomer reads from one NVML sample to a freeze and to its
//! `/metrics` line, kept in `docs/architecture.md` as a ```` ```walk ```` block of
//! `PATH FUNCTION  # what is read there` lines, one a function read in reading order, a callee's
//! return written as its caller again. The check keeps the block true and its cost from growing:
//!
//! - every `PATH` is a file of the workspace that defines `fn FUNCTION` outside its tests (a
//!   rename or a move that the walk does not follow fails, naming the line);
//! - the block's last line, `# files F, rooms R, returns T`, states what [`count`] finds;
//! - rooms and returns are at most [`ROOMS_MAX`] and [`RETURNS_MAX`], which may only shrink.
//!
//! Counting: consecutive lines in one file are one visit; a return is a visit to a file visited
//! before (visits minus files); a room is the first component below `gpushare-agent/src/` (`x.rs`
//! and `x/` are one room), or the crate for a file of another crate. The walk of the base of
//! issue 40 (6b536f4), written by the same method, is kept beside it as ```` ```walk-base ````:
//! counted and its stated counts checked, its functions not (that code is gone).

use std::{collections::BTreeSet, path::Path};

use anyhow::{Context, Result};

use super::{functions::functions, strip_comments};

/// The document that holds the walk.
pub const DOC: &str = "docs/architecture.md";

/// Rooms the walk may cross: today's, and it may only shrink.
pub const ROOMS_MAX: usize = 13;

/// Returns the walk may make: today's, and it may only shrink.
pub const RETURNS_MAX: usize = 27;

/// One line of a walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Line number in the document (1-based).
    pub line: usize,
    pub path: String,
    pub function: String,
}

/// What a walk crosses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub files: usize,
    pub rooms: usize,
    pub returns: usize,
}

/// A walk as a document holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walk {
    pub steps: Vec<Step>,
    /// The `# files F, rooms R, returns T` line, read, and its line number.
    pub stated: Option<(usize, Counts)>,
}

/// What [`check`] found: the problems, and the counts of the walk and of the base's.
pub type Checked = (Vec<String>, Option<(Counts, Counts)>);

/// A fenced block of `doc` opened with ```` ```tag ````, if any. An error names a malformed line.
pub fn block(doc: &str, tag: &str) -> Result<Option<Walk>> {
    let mut lines = doc.lines().enumerate();
    let open = format!("```{tag}");
    if !lines.any(|(_, l)| l.trim_end() == open) {
        return Ok(None);
    }
    let (mut steps, mut stated) = (Vec::new(), None);
    for (i, l) in lines {
        let l = l.trim();
        if l.starts_with("```") {
            return Ok(Some(Walk { steps, stated }));
        }
        if let Some(c) = l.strip_prefix('#') {
            stated = stated_counts(c).map(|c| (i + 1, c)).or(stated);
            continue;
        }
        if l.is_empty() {
            continue;
        }
        let body: Vec<&str> = l
            .split('#')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let [path, function] = body[..] else {
            anyhow::bail!(
                "{DOC}:{}: a walk line is `PATH FUNCTION  # what is read there`, not {l:?}",
                i + 1
            );
        };
        steps.push(Step {
            line: i + 1,
            path: path.to_string(),
            function: function.to_string(),
        });
    }
    anyhow::bail!("{DOC}: the ```{tag} block is not closed")
}

/// `files F, rooms R, returns T`, read.
fn stated_counts(text: &str) -> Option<Counts> {
    let mut n = [None; 3];
    for part in text.split(',') {
        let mut w = part.split_whitespace();
        let (Some(k), Some(v), None) = (w.next(), w.next(), w.next()) else {
            return None;
        };
        let slot = ["files", "rooms", "returns"].iter().position(|x| *x == k)?;
        n[slot] = Some(v.parse().ok()?);
    }
    Some(Counts {
        files: n[0]?,
        rooms: n[1]?,
        returns: n[2]?,
    })
}

/// The room of a workspace path.
pub fn room(path: &str) -> &str {
    match path.strip_prefix("gpushare-agent/src/") {
        Some(rest) => {
            let first = rest.split('/').next().unwrap_or(rest);
            first.strip_suffix(".rs").unwrap_or(first)
        }
        None => path.split('/').next().unwrap_or(path),
    }
}

/// What `steps` cross.
pub fn count(steps: &[Step]) -> Counts {
    let mut visits: Vec<&str> = Vec::new();
    for s in steps {
        if visits.last() != Some(&s.path.as_str()) {
            visits.push(&s.path);
        }
    }
    let files: BTreeSet<&str> = visits.iter().copied().collect();
    let rooms: BTreeSet<&str> = files.iter().map(|f| room(f)).collect();
    Counts {
        files: files.len(),
        rooms: rooms.len(),
        returns: visits.len() - files.len(),
    }
}

/// The problems of the walks in `root`'s [`DOC`], and the counts of the walk and of the base's.
pub fn check(root: &Path) -> Result<Checked> {
    check_within(root, ROOMS_MAX, RETURNS_MAX)
}

/// [`check`] against limits of rooms and returns.
fn check_within(root: &Path, rooms_max: usize, returns_max: usize) -> Result<Checked> {
    let doc = std::fs::read_to_string(root.join(DOC)).with_context(|| format!("reading {DOC}"))?;
    let mut problems = Vec::new();
    let (Some(walk), Some(base)) = (block(&doc, "walk")?, block(&doc, "walk-base")?) else {
        problems.push(format!(
            "{DOC}: no ```walk block and ```walk-base block: the walk from one NVML sample to a \
             freeze and to /metrics is kept there"
        ));
        return Ok((problems, None));
    };
    for s in &walk.steps {
        let code = std::fs::read_to_string(root.join(&s.path)).unwrap_or_default();
        if !functions(&strip_comments(&code))
            .iter()
            .any(|f| f.name == s.function)
        {
            problems.push(format!(
                "{DOC}:{}: the walk reads `fn {}` in {}, which defines no such function outside \
                 its tests: follow the code where it went and write the walk again",
                s.line, s.function, s.path
            ));
        }
    }
    let (now, then) = (count(&walk.steps), count(&base.steps));
    for (tag, counts, stated) in [("walk", now, walk.stated), ("walk-base", then, base.stated)] {
        match stated {
            Some((_, c)) if c == counts => {}
            Some((line, _)) => problems.push(format!(
                "{DOC}:{line}: the ```{tag} block states other counts than its lines give: write \
                 `# files {}, rooms {}, returns {}`",
                counts.files, counts.rooms, counts.returns
            )),
            None => problems.push(format!(
                "{DOC}: the ```{tag} block ends without `# files F, rooms R, returns T`"
            )),
        }
    }
    if now.rooms > rooms_max || now.returns > returns_max {
        problems.push(format!(
            "{DOC}: the walk crosses {} rooms and makes {} returns, over {rooms_max} and \
             {returns_max}: a change on the path from a sample to a freeze and to /metrics sends \
             the reader through more rooms or back more often; keep a job's steps together",
            now.rooms, now.returns
        ));
    } else if now.rooms < rooms_max || now.returns < returns_max {
        problems.push(format!(
            "xtask/src/structure/walk.rs: the walk now crosses {} rooms with {} returns: lower \
             ROOMS_MAX and RETURNS_MAX to them, so the limit keeps what was won",
            now.rooms, now.returns
        ));
    }
    Ok((problems, Some((now, then))))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC_TEXT: &str = "text\n```walk\n# a comment\ngpushare-agent/src/run.rs run  # loop\n\
        gpushare-agent/src/agent/tick.rs tick\ngpushare-agent/src/agent/tick.rs observe  # same file\n\
        gpushare-agent/src/nvml/mod.rs sample\ngpushare-agent/src/agent/tick.rs tick  # (return)\n\
        gpushare-agent/src/agent.rs x\ngpushare-base/src/sys.rs read\n# files 5, rooms 4, returns 1\n```\n";

    #[test]
    fn counts_visits_files_rooms_and_returns_as_documented() {
        let Walk { steps, stated } = block(DOC_TEXT, "walk").unwrap().unwrap();
        assert_eq!(steps.len(), 7);
        assert_eq!(
            (
                steps[0].line,
                steps[0].path.as_str(),
                steps[0].function.as_str()
            ),
            (4, "gpushare-agent/src/run.rs", "run")
        );
        let c = count(&steps);
        // run, tick, nvml, tick again (a return), agent.rs (the room of agent/), base.
        assert_eq!(
            c,
            Counts {
                files: 5,
                rooms: 4,
                returns: 1
            }
        );
        assert_eq!(stated, Some((11, c)));
        assert_eq!(block(DOC_TEXT, "walk-base").unwrap(), None);
    }

    #[test]
    fn a_malformed_line_or_an_open_block_is_an_error_naming_the_line() {
        let e = block("```walk\ngpushare-agent/src/run.rs\n```\n", "walk").unwrap_err();
        assert!(e.to_string().contains(":2:"), "{e}");
        assert!(block("```walk\na b\n", "walk").is_err());
        assert_eq!(stated_counts(" files 1, rooms 2"), None);
        assert_eq!(stated_counts(" files 1, rooms 2, returns x"), None);
        assert_eq!(
            stated_counts(" files 1, rooms 2, returns 3"),
            Some(Counts {
                files: 1,
                rooms: 2,
                returns: 3
            })
        );
    }

    #[test]
    fn rooms_are_top_level_modules_or_crates() {
        assert_eq!(room("gpushare-agent/src/metrics.rs"), "metrics");
        assert_eq!(room("gpushare-agent/src/metrics/cache.rs"), "metrics");
        assert_eq!(room("gpushare-base/src/sys/mod.rs"), "gpushare-base");
    }

    /// A workspace at a scratch root with `doc` as its architecture document.
    fn scratch(name: &str, doc: &str) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!("xtask-walk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in [
            ("gpushare-agent/src/run.rs", "fn run() {}\n"),
            (
                "gpushare-agent/src/agent/tick.rs",
                "pub fn tick() {\n}\n#[cfg(test)]\nmod tests {\n    fn hidden() {}\n}\n",
            ),
            (DOC, doc),
        ] {
            std::fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
            std::fs::write(root.join(path), text).unwrap();
        }
        root
    }

    const BASE: &str =
        "```walk-base\ngpushare-agent/src/mod.rs tick\n# files 1, rooms 1, returns 0\n```\n";

    #[test]
    fn check_keeps_the_walk_true_and_its_counts_from_growing() {
        let walk = |f: &str, stated: &str| {
            format!(
                "# doc\n```walk\ngpushare-agent/src/run.rs run\ngpushare-agent/src/agent/tick.rs {f}\n\
                 gpushare-agent/src/run.rs run  # (return)\n# {stated}\n```\n{BASE}"
            )
        };
        let good = scratch("good", &walk("tick", "files 2, rooms 2, returns 1"));
        let (problems, counts) = check_within(&good, 2, 1).unwrap();
        assert_eq!(problems, Vec::<String>::new());
        let (now, then) = counts.unwrap();
        assert_eq!((now.files, now.rooms, now.returns), (2, 2, 1));
        assert_eq!((then.files, then.rooms, then.returns), (1, 1, 0));
        let over = check_within(&good, 2, 0).unwrap().0;
        assert!(
            over.len() == 1 && over[0].contains("over 2 and 0"),
            "{over:?}"
        );
        let over = check_within(&good, 1, 1).unwrap().0;
        assert!(
            over.len() == 1 && over[0].contains("over 1 and 1"),
            "{over:?}"
        );
        for (rooms, returns) in [(3, 1), (2, 2)] {
            let lower = check_within(&good, rooms, returns).unwrap().0;
            assert!(
                lower.len() == 1 && lower[0].contains("lower ROOMS_MAX"),
                "{lower:?}"
            );
        }
        // A function only its tests define, and counts the lines do not give.
        let bad = scratch("bad", &walk("hidden", "files 2, rooms 2, returns 0"));
        let problems = check_within(&bad, 2, 1).unwrap().0;
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains(":4:") && problems[0].contains("`fn hidden`"));
        assert!(problems[1].contains(":6:") && problems[1].contains("returns 1"));
        // No base block, and a base block with no stated counts.
        let alone = scratch("alone", "```walk\ngpushare-agent/src/run.rs run\n```\n");
        let (problems, counts) = check_within(&alone, 1, 0).unwrap();
        assert!(counts.is_none() && problems[0].contains("no ```walk block"));
        let unstated = scratch(
            "unstated",
            &format!(
                "```walk\ngpushare-agent/src/run.rs run\n```\n{}",
                BASE.replace("# files 1, rooms 1, returns 0\n", "")
            ),
        );
        let problems = check_within(&unstated, 1, 0).unwrap().0;
        assert!(
            problems.len() == 2 && problems.iter().all(|p| p.contains("ends without")),
            "{problems:?}"
        );
        for root in [good, bad, alone, unstated] {
            std::fs::remove_dir_all(root).unwrap();
        }
    }

    #[test]
    fn this_workspaces_walk_is_true_and_within_its_limits() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let (problems, counts) = check(root).unwrap();
        assert_eq!(problems, Vec::<String>::new());
        let (now, _) = counts.expect("the walk and the base's are in docs/architecture.md");
        assert_eq!((now.rooms, now.returns), (ROOMS_MAX, RETURNS_MAX));
    }
}
