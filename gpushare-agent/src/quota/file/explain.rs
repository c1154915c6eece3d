//! Positions and messages: where in a file something is (`file:line:col`), and serde/toml's
//! complaints rewritten to say how to fix the problem (a suggestion for a misspelt key, where a
//! misplaced key belongs).

use toml::Value;

use crate::quota::Location;

pub(super) fn location(text: &str, origin: &str, offset: usize) -> Location {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Location {
        file: origin.to_string(),
        line: before.matches('\n').count() + 1,
        col: before[line_start..].chars().count() + 1,
    }
}

pub(super) fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The closest candidate within a small edit distance.
pub(super) fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    let candidates: Vec<&str> = candidates.into_iter().collect();
    // An abbreviation (`sig` for `signal`) first, then a small edit distance.
    if word.len() >= 3
        && let Some(c) = candidates.iter().find(|c| c.starts_with(&word))
    {
        return Some(c);
    }
    candidates
        .into_iter()
        .map(|c| (levenshtein(&word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 4) && *d < c.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

pub(super) fn backticked(message: &str) -> Vec<&str> {
    message.split('`').skip(1).step_by(2).collect()
}

/// Makes serde/toml's messages say how to fix the problem.
pub(super) fn explain_toml_message(message: &str) -> String {
    let message = message.trim();
    if message.starts_with("unknown field") {
        let words = backticked(message);
        let Some((field, expected)) = words.split_first() else {
            return message.to_string();
        };
        let in_entry = expected.contains(&"gpu_memory");
        let hint = if expected.contains(&"pod_resources_socket")
            && ["socket", "kubelet_socket", "pod_resources"].contains(field)
        {
            Some("the kubelet's socket is `pod_resources_socket`".to_string())
        } else if *field == "protect" && !expected.contains(&"quota") {
            Some("`protect` is a top-level key: move it above the first [table] header".to_string())
        } else if expected.contains(&"elastic_reserve")
            && ["gpu_memory", "container", "pod", "unit", "cgroup", "gpu"].contains(field)
        {
            Some(format!(
                "`{field}` belongs in a [[quota]] entry, not in [defaults]"
            ))
        } else if in_entry
            && [
                "elastic_reserve",
                "gpushare_memory_unit",
                "env_quotas",
                "context_overhead",
                "take_unheld",
            ]
            .contains(field)
        {
            Some(format!(
                "`{field}` can only be set in [defaults] (in the main file)"
            ))
        } else if expected.contains(&"quota")
            && ["mode", "tolerance", "grace", "ladder", "elastic_reserve"].contains(field)
        {
            Some(format!(
                "put `{field}` under [defaults], or in a [[quota]] entry; top-level keys must come before the first [table]"
            ))
        } else {
            did_you_mean(field, expected.iter().copied()).map(|s| format!("did you mean `{s}`?"))
        };
        let allowed = expected
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", ");
        return match hint {
            Some(h) => format!("unknown key `{field}`: {h} (allowed here: {allowed})"),
            None => format!("unknown key `{field}` (allowed here: {allowed})"),
        };
    }
    if message.contains("invalid type: map, expected a sequence") {
        return format!("{message}: write each entry as [[quota]] (double brackets)");
    }
    if message.contains("expected a sequence") {
        return format!("{message}: write a list, e.g. [\"...\"]");
    }
    format!("invalid TOML: {message}")
}

pub(super) fn value_words(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::Datetime(d) => d.to_string(),
        Value::Array(_) => "a list".to_string(),
        Value::Table(_) => "a table".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_and_positions() {
        assert_eq!(
            did_you_mean("frezze", ["alert", "signal", "freeze", "kill"]),
            Some("freeze")
        );
        assert_eq!(
            did_you_mean("zzz", ["alert", "signal", "freeze", "kill"]),
            None
        );
        assert_eq!(
            location("ab\ncdé\nf", "x", 7),
            Location {
                file: "x".into(),
                line: 2,
                col: 4
            }
        );
    }
}
