//! Durations as people write them: the one parser for the command line (`--interval`, ...), quota
//! files (`grace`, ladder `after`) and `launch` (`--grace`, `--action ...@AFTER`).
//!
//! Design note: the grammar is [jiff]'s "friendly" duration format (`500ms`, `1.5s`, `2m`, `1h30m`,
//! `90 seconds`; ISO 8601 `PT5S` too), parsed by `jiff::SignedDuration`'s `FromStr`. jiff is
//! already in the build (env_logger's timestamps use it), is well kept, and parses exactly (no float
//! rounding). Around it this module only adds what gpushare promises its users: a bare number is
//! rejected as ambiguous, negative durations and durations over 24 h are refused, and each error
//! says how to write it instead. [`parse_duration`] allows zero (`0s`, for a ladder step's `after`);
//! [`parse_nonzero_duration`] does not (intervals, timeouts).

use std::time::Duration;

/// The longest duration accepted anywhere.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

const HOW: &str = "write it as e.g. `500ms`, `1.5s`, `2m` or `1h30m`";

/// Parses a duration with a unit: `250ms`, `1s`, `1.5s`, `2m`, `1h30m`, `0s`. A bare number is
/// rejected as ambiguous; so are negative durations and durations over 24 h.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(format!("an empty duration: {HOW}"));
    }
    if t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("`{t}` has no unit: {HOW}"));
    }
    if t.starts_with('-') {
        return Err(format!("`{t}`: durations cannot be negative"));
    }
    let parsed: jiff::SignedDuration = t.parse().map_err(|e: jiff::Error| explain(t, &e))?;
    if parsed.is_negative() {
        return Err(format!("`{t}`: durations cannot be negative"));
    }
    let d = Duration::try_from(parsed).map_err(|_| format!("`{t}` is longer than 24h"))?;
    if d > MAX_DURATION {
        return Err(format!("`{t}` is longer than 24h"));
    }
    Ok(d)
}

/// Like [`parse_duration`], but zero is refused: `--interval 0s` makes no sense.
pub fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("`{}` must be more than 0", s.trim()));
    }
    Ok(d)
}

/// A message that says what is wrong in gpushare's words: an unknown unit is named, anything else
/// keeps jiff's reason.
fn explain(t: &str, e: &jiff::Error) -> String {
    // `<number><word>` with a word jiff does not know: name the word.
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let word = t[num_end..].trim();
    let number = t[..num_end].parse::<f64>().is_ok();
    if number && !word.is_empty() && word.chars().all(|c| c.is_alphabetic()) {
        return format!("`{t}`: unknown unit `{word}` (use ms, s, m or h)");
    }
    let reason = e.to_string();
    let reason = reason
        .strip_prefix("failed to parse input in the \"friendly\" duration format: ")
        .unwrap_or(&reason);
    format!("`{t}` is not a duration ({reason}); {HOW}")
}

/// `0s`, `500ms`, `5s`, `1.5s`, `2m`, `90s`: the shortest of the forms [`parse_duration`] reads
/// back to the same value (to the millisecond).
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".to_string()
    } else if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        let frac = format!("{:03}", ms % 1000);
        format!("{}.{}s", ms / 1000, frac.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Result<Duration, String> {
        Ok(Duration::from_millis(n))
    }

    #[test]
    fn the_forms_people_write() {
        for (text, want) in [
            ("1s", 1000),
            ("250ms", 250),
            ("1.5s", 1500),
            ("2m", 120_000),
            ("2min", 120_000),
            ("1h", 3_600_000),
            ("1h30m", 5_400_000),
            (" 5s ", 5000),
            ("5 s", 5000),
            ("0s", 0),
            ("0.0ms", 0),
            ("24h", 86_400_000),
        ] {
            assert_eq!(parse_duration(text), ms(want), "{text:?}");
        }
    }

    #[test]
    fn errors_say_how_to_write_it() {
        let e = |s: &str| parse_duration(s).unwrap_err();
        assert!(e("5").contains("`5` has no unit"), "{}", e("5"));
        assert!(e("0").contains("has no unit"));
        assert!(e("1.5").contains("has no unit"));
        assert!(e("").contains("empty"));
        assert!(e("-1s").contains("cannot be negative"));
        assert!(e("1s ago").contains("cannot be negative"));
        assert!(
            e("5parsecs").contains("unknown unit `parsecs`"),
            "{}",
            e("5parsecs")
        );
        assert!(e("3 fortnights").contains("unknown unit `fortnights`"));
        assert!(e("1..2s").contains("is not a duration"), "{}", e("1..2s"));
        assert!(e("25h").contains("longer than 24h"));
        assert!(e("1d").contains("is not a duration") || e("1d").contains("unknown unit"));
        assert!(e("s").contains("is not a duration"), "{}", e("s"));
    }

    #[test]
    fn nonzero_refuses_zero() {
        // The flags' parser (`--interval`, `--stop-timeout`, ...): the same grammar, zero refused.
        let forms = [
            ("20ms", 20),
            ("1s", 1000),
            ("250ms", 250),
            ("1.5s", 1500),
            ("2m", 120_000),
        ];
        for (s, millis) in forms {
            assert_eq!(parse_nonzero_duration(s), ms(millis));
        }
        let e = |s: &str| parse_nonzero_duration(s).unwrap_err();
        assert!(e("0s").contains("more than 0"));
        assert!(e("5").contains("no unit"));
        assert!(e("5parsecs").contains("unknown unit"));
        for bad in ["0.000ms", "x", "", "1..2s"] {
            assert!(parse_nonzero_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_read_back() {
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_secs(120)), "2m");
        assert_eq!(fmt_duration(Duration::from_secs(90)), "90s");
        assert_eq!(fmt_duration(Duration::ZERO), "0s");
    }

    proptest! {
        #[test]
        fn never_panics(s in ".{0,24}") {
            let _ = parse_duration(&s);
            let _ = parse_nonzero_duration(&s);
        }

        #[test]
        fn what_is_printed_parses_back(millis in 0u64..86_400_000) {
            let d = Duration::from_millis(millis);
            prop_assert_eq!(parse_duration(&fmt_duration(d)), Ok(d));
        }
    }
}
