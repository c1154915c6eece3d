//! Names a tenant chooses (a process's comm, a cgroup's name, a pod's name), made safe for a
//! terminal or a log line: control characters (an escape sequence could rewrite or hide the
//! operator's rows) and the invisible Unicode format characters that reorder or hide text
//! (bidirectional overrides, zero-width marks) are written as Rust escapes (`\u{1b}`, `\n`).
//! A backslash stays as it is, so a name without such characters is shown unchanged.

use std::{borrow::Cow, fmt::Write as _};

use crate::sys::kernel_text;

/// Whether `c` must not reach a terminal as it is.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200b}'..='\u{200f}' // zero-width space, joiners, LRM/RLM
            | '\u{2028}'..='\u{202e}' // line/paragraph separators, bidi embeddings and overrides
            | '\u{2060}'..='\u{2069}' // word joiner, invisible operators, bidi isolates
            | '\u{feff}' // zero-width no-break space
        )
}

/// `name` with every unsafe character escaped; borrowed when there is none. A byte that was not
/// UTF-8 where the kernel gave the name (kept by [`kernel_text`]) is shown as `\xff`.
pub fn shown(name: &str) -> Cow<'_, str> {
    escape(name, false)
}

/// A log message: as [`shown`], except that a line break stays one, with the next line indented
/// by four spaces, so a message that spans lines (a quota file's located error) stays readable
/// and no name can start a line that looks like a record of its own.
pub fn log_message(msg: &str) -> Cow<'_, str> {
    escape(msg, true)
}

fn escape(text: &str, keep_lines: bool) -> Cow<'_, str> {
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == kernel_text::RAW
            && let Some(&b) = chars.peek()
            && ('\u{80}'..='\u{ff}').contains(&b)
        {
            chars.next();
            let _ = write!(out, "\\x{:02x}", b as u32);
        } else if keep_lines && c == '\n' {
            out.push_str("\n    ");
        } else if unsafe_char(c) {
            let _ = write!(out, "{}", c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_are_escaped_and_the_rest_is_kept() {
        assert!(matches!(shown("python3"), Cow::Borrowed("python3")));
        assert_eq!(shown("données-Ω"), "données-Ω", "printable Unicode stays");
        assert_eq!(shown(r"a\b"), r"a\b", "a backslash alone stays");
        assert_eq!(shown("\x1b[2J\x1b[Hok"), r"\u{1b}[2J\u{1b}[Hok");
        assert_eq!(shown("a\nb\rc\td"), r"a\nb\rc\td");
        assert_eq!(
            shown("x\u{7f}y\u{9b}z"),
            r"x\u{7f}y\u{9b}z",
            "DEL and C1 too"
        );
        assert_eq!(shown("evil\u{202e}gpj.exe"), r"evil\u{202e}gpj.exe");
        assert_eq!(
            shown("a\u{200b}b\u{2066}c\u{feff}"),
            r"a\u{200b}b\u{2066}c\u{feff}"
        );
        assert_eq!(shown("\0"), r"\u{0}");
        // A byte the kernel gave that is not UTF-8, as `kernel_text` keeps it.
        let odd = kernel_text::text(b"/a/\xff\x85\x1b");
        assert_eq!(shown(&odd), r"/a/\xff\x85\u{1b}");
        assert_eq!(log_message(&odd), r"/a/\xff\x85\u{1b}");
        assert_eq!(
            shown("\0\u{ff}"),
            r"\xff",
            "the same text, however it was made"
        );
    }

    #[test]
    fn a_log_message_keeps_its_lines_indented_and_escapes_the_rest() {
        assert!(matches!(log_message("froze x"), Cow::Borrowed("froze x")));
        assert_eq!(
            log_message("q.toml:3:1: bad\n  ^ here"),
            "q.toml:3:1: bad\n      ^ here"
        );
        assert_eq!(
            log_message("froze cgroup:///t/a\n[2026-01-01T00:00:00Z INFO x] forged\x1b[2K"),
            "froze cgroup:///t/a\n    [2026-01-01T00:00:00Z INFO x] forged\\u{1b}[2K"
        );
    }
}
