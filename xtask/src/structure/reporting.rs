//! One door for reporting (issue 40): the step hands what it counted and measured to the
//! snapshot, and `metrics` alone turns the snapshot into Prometheus series. No module of the
//! agent but `metrics` (`metrics.rs` and `metrics/`) names the encoder's crate,
//! `prometheus_client`: a histogram or counter kept beside the snapshot would need it.
//! (`agent/` naming `metrics` at all is the module rule in [`super::NEVER`].)

use std::path::Path;

use anyhow::Result;

use super::{rel, rust_files, strip_comments, tokenize};

/// The Prometheus encoder's crate.
const ENCODER: &str = "prometheus_client";

/// The one module that may name it.
const READER: &str = "metrics";

/// Where a module of the agent but `metrics` names the encoder's crate, tests included.
pub fn encoders_elsewhere(root: &Path, src: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for f in rust_files(src)? {
        let inside = f.strip_prefix(src).unwrap_or(&f);
        let top = inside
            .components()
            .next()
            .and_then(|c| Path::new(c.as_os_str()).file_stem())
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        if top == READER {
            continue;
        }
        let code = strip_comments(&std::fs::read_to_string(&f)?);
        for n in encoder_lines(&code) {
            problems.push(format!(
                "{}:{n}: names `{ENCODER}` outside `{READER}`: report through the snapshot (a \
                 typed field of `snapshot::Counters` or `snapshot::Timings`) and encode it in a \
                 family of `metrics/`",
                rel(root, &f)
            ));
        }
    }
    Ok(problems)
}

/// The lines (1-based) of `code` (comments and strings stripped) that name the encoder's crate.
fn encoder_lines(code: &str) -> Vec<usize> {
    code.lines()
        .enumerate()
        .filter(|(_, l)| tokenize(l).contains(&ENCODER))
        .map(|(i, _)| i + 1)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoder_is_found_in_code_but_not_in_comments_or_strings() {
        let code = strip_comments(
            "use prometheus_client::metrics::histogram::Histogram;\n\
             // prometheus_client is for metrics/\n\
             let s = \"prometheus_client\";\n\
             let h = ::prometheus_client::registry::Registry::default();\n",
        );
        assert_eq!(encoder_lines(&code), vec![1, 4]);
    }
}
