//! No function over [`FN_MAX`] lines outside tests, but today's exceptions, each of which may only
//! shrink (issue 40): a long function is a job that wants its own pieces, and one that grows back
//! does so where nothing checks it.

use std::path::Path;

use anyhow::Result;

use super::{rel, rust_files, strip_comments};

/// Lines a function may have, from its signature to its closing brace.
pub const FN_MAX: usize = 150;

/// The functions over [`FN_MAX`] lines when the rule came (file, function, lines). Each may only
/// shrink: one that grows fails, and one that shrinks must have its entry lowered (or removed
/// once it is within [`FN_MAX`]), so the list always tells the truth and never grows.
pub const EXCEPTIONS: &[(&str, &str, usize)] = &[
    ("gpushare-agent/src/observe/workloads.rs", "attribute", 181),
    ("gpushare-agent/src/main.rs", "run", 151),
    ("gpushare-agent/src/run.rs", "run", 208),
    ("gpushare-agent/src/snapshot/publish.rs", "build_at", 324),
    ("xtask/src/demo.rs", "story", 176),
    ("xtask/src/image.rs", "write_archive", 199),
    ("xtask/src/main.rs", "run", 205),
    ("gpushare-testkit/src/bin/fake_gpu_proc.rs", "main", 188),
];

/// One function: its name, first line (1-based) and length in lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// The functions of a file's code (comments and strings stripped, line structure kept), nested
/// ones included; code from the first `#[cfg(test)]` module with a body on is left out.
pub fn functions(code: &str) -> Vec<Function> {
    let lines: Vec<&str> = code.lines().collect();
    let end = super::tests_start(&lines);
    let mut out = Vec::new();
    for (i, l) in lines[..end].iter().enumerate() {
        let Some(name) = fn_name(l) else { continue };
        // The body: from the first `{` after the signature (a `;` first: a declaration) to the
        // brace that closes it.
        let mut depth = 0usize;
        let mut opened = false;
        let mut close = None;
        'scan: for (j, line) in lines[i..end].iter().enumerate() {
            for c in line.chars() {
                match c {
                    ';' if !opened && depth == 0 => break 'scan,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => {
                        depth = depth.saturating_sub(1);
                        if opened && depth == 0 {
                            close = Some(i + j);
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(c) = close {
            out.push(Function {
                name: name.to_string(),
                line: i + 1,
                lines: c - i + 1,
            });
        }
    }
    out
}

/// The name of the function a line starts to declare, if it does.
fn fn_name(line: &str) -> Option<&str> {
    let mut l = line.trim_start();
    if let Some(rest) = l.strip_prefix("pub") {
        l = match rest.strip_prefix('(') {
            Some(r) => r.split_once(')')?.1.trim_start(),
            None => rest.strip_prefix(' ')?,
        };
    }
    for q in ["const ", "async ", "unsafe ", "extern \"\" ", "extern "] {
        l = l.strip_prefix(q).unwrap_or(l);
    }
    let rest = l.strip_prefix("fn ")?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// The violations among the workspace's sources at `root`: every `src/` of a member crate, test
/// files and modules aside.
pub fn check(root: &Path, exceptions: &[(&str, &str, usize)]) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut seen = vec![false; exceptions.len()];
    for krate in std::fs::read_dir(root)? {
        let src = krate?.path().join("src");
        if !src.is_dir() {
            continue;
        }
        for f in rust_files(&src)? {
            if super::is_test_file(f.strip_prefix(&src).unwrap_or(&f)) {
                continue;
            }
            let file = rel(root, &f);
            let code = strip_comments(&std::fs::read_to_string(&f)?);
            for func in functions(&code) {
                let listed = exceptions
                    .iter()
                    .position(|(p, n, _)| *p == file && *n == func.name);
                match listed {
                    Some(k) => {
                        seen[k] = true;
                        let max = exceptions[k].2;
                        if func.lines > max {
                            problems.push(format!(
                                "{file}:{}: `{}` grew to {} lines, over its {max}: a listed long \
                                 function may only shrink (move a job into a function of its own)",
                                func.line, func.name, func.lines
                            ));
                        } else if func.lines < max {
                            let fix = if func.lines <= FN_MAX {
                                "remove its entry".to_string()
                            } else {
                                format!("lower its entry to {}", func.lines)
                            };
                            problems.push(format!(
                                "{file}:{}: `{}` shrank to {} lines (listed at {max}): {fix} in \
                                 xtask/src/structure/functions.rs, so it cannot grow back",
                                func.line, func.name, func.lines
                            ));
                        }
                    }
                    None if func.lines > FN_MAX => problems.push(format!(
                        "{file}:{}: `{}` is {} lines, over {FN_MAX}: split it into the steps it \
                         reads as",
                        func.line, func.name, func.lines
                    )),
                    None => {}
                }
            }
        }
    }
    for (k, (p, n, _)) in exceptions.iter().enumerate() {
        if !seen[k] {
            problems.push(format!(
                "{p}: `{n}` is listed as a long function but is not there: remove its entry in \
                 xtask/src/structure/functions.rs"
            ));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_every_function_but_declarations_and_tests() {
        let code = strip_comments(
            "pub(crate) fn a(x: u8) -> u8 {\n    let s = \"{\";\n    x\n}\n\
             trait T {\n    fn decl(&self);\n    fn body(&self) {\n        let c = '}';\n    }\n}\n\
             pub async unsafe fn b<'a>()\n    where 'a: 'a,\n{\n    fn inner() {}\n}\n\
             #[cfg(test)]\nfn helper() {}\n#[cfg(test)]\nmod other_tests;\n#[cfg(test)]\nmod tests {\n    fn t() {\n    }\n}\n",
        );
        let got: Vec<_> = functions(&code)
            .into_iter()
            .map(|f| (f.name, f.line, f.lines))
            .collect();
        assert_eq!(
            got,
            [
                ("a".into(), 1, 4),
                ("body".into(), 7, 3),
                ("b".into(), 11, 5),
                ("inner".into(), 14, 1),
                ("helper".into(), 17, 1)
            ],
            "{code}"
        );
    }

    fn tree(files: &[(&str, String)]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "gpushare-structure-fns-{}-{}",
            std::process::id(),
            files.len()
        ));
        let _ = std::fs::remove_dir_all(&root);
        for (p, text) in files {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        root
    }

    fn long(name: &str, lines: usize) -> String {
        format!("fn {name}() {{\n{}}}\n", "    x();\n".repeat(lines - 2))
    }

    /// The rule seen failing on deliberate violations: a new long function, a listed one that
    /// grew, one that shrank, one that is gone; and passing when the list tells the truth.
    #[test]
    fn a_long_function_fails_unless_listed_and_a_listed_one_may_only_shrink() {
        let root = tree(&[
            (
                "k/src/a.rs",
                long("big", FN_MAX + 1) + &long("fine", FN_MAX),
            ),
            ("k/src/b.rs", long("listed", 200)),
            ("k/src/tests.rs", long("in_tests", 400)),
        ]);
        let ok = check(&root, &[("k/src/b.rs", "listed", 200)]).unwrap();
        assert_eq!(ok.len(), 1, "{ok:?}");
        assert!(ok[0].contains("`big` is 151 lines"), "{ok:?}");
        let grew = check(
            &root,
            &[("k/src/b.rs", "listed", 199), ("k/src/a.rs", "big", 151)],
        );
        let grew = grew.unwrap();
        assert!(
            grew.len() == 1 && grew[0].contains("grew to 200"),
            "{grew:?}"
        );
        let shrank = check(
            &root,
            &[("k/src/b.rs", "listed", 201), ("k/src/a.rs", "big", 151)],
        );
        let shrank = shrank.unwrap();
        assert!(
            shrank.len() == 1 && shrank[0].contains("lower its entry to 200"),
            "{shrank:?}"
        );
        let gone = check(
            &root,
            &[
                ("k/src/b.rs", "listed", 200),
                ("k/src/a.rs", "big", 151),
                ("k/src/c.rs", "x", 300),
            ],
        )
        .unwrap();
        assert!(
            gone.len() == 1 && gone[0].contains("is not there"),
            "{gone:?}"
        );
        let within = check(
            &root,
            &[
                ("k/src/b.rs", "listed", 200),
                ("k/src/a.rs", "fine", 151),
                ("k/src/a.rs", "big", 151),
            ],
        )
        .unwrap();
        assert!(
            within.len() == 1 && within[0].contains("remove its entry"),
            "{within:?}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
