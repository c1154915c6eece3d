//! Byte sizes with units: `512MiB`, `4GiB`, `1.5GB`.
//!
//! Design note: a size always carries a unit, zero included (`0B`, `0MiB`), because a bare number is
//! exactly the GiB/MiB confusion operators of GPUShare trip over. Decimal SI units (`kB`/`KB`, `MB`,
//! `GB`, `TB`) are powers of 1000; binary units (`KiB`, `MiB`, `GiB`, `TiB`) are powers of 1024; `B`
//! is bytes. Units are case-sensitive (`Gb` is not `GB`), a space between number and unit is allowed,
//! and a fractional value is rounded down to whole bytes. Arithmetic is exact (integers, no floats),
//! so `Display` followed by [`parse_size`] gives back the same number of bytes.

use std::{fmt, str::FromStr};

/// Binary units, largest first, as `Display` uses them.
const BINARY: [(&str, u64); 4] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
];

/// Every accepted unit and its multiplier.
const UNITS: [(&str, u64); 10] = [
    ("B", 1),
    ("kB", 1_000),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

const UNIT_HELP: &str =
    "use B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)";

/// Why a size did not parse. The message says how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Nothing was given.
    #[error("empty size: write e.g. `512MiB` or `4GiB`")]
    Empty,
    /// A minus sign.
    #[error("`{0}`: sizes cannot be negative")]
    Negative(String),
    /// A number without a unit.
    #[error(
        "`{0}` has no unit, which is ambiguous: write `{0}MiB` or `{0}GiB` (or `{0}B` for bytes)"
    )]
    NoUnit(String),
    /// The number part is not a decimal number.
    #[error("`{0}` does not start with a number: write e.g. `512MiB` or `1.5GB`")]
    BadNumber(String),
    /// An unknown unit.
    #[error("`{input}`: unknown unit `{unit}`; {help}", help = UNIT_HELP)]
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit part.
        unit: String,
    },
    /// More than `u64::MAX` bytes.
    #[error("`{0}` is too large (the limit is 16 EiB)")]
    TooLarge(String),
}

/// A number of bytes that formats itself in human units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The number of bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }

    /// A short, rounded form for messages: `3.0 GiB`, `512.0 MiB`, `100 B`. Not exact; use
    /// `Display` where the value must parse back.
    pub fn approx(self) -> String {
        for (name, mult) in BINARY {
            if self.0 >= mult {
                return format!("{:.1} {name}", self.0 as f64 / mult as f64);
            }
        }
        format!("{} B", self.0)
    }
}

impl fmt::Display for ByteSize {
    /// The largest binary unit that shows the value exactly with at most three decimals
    /// (`1.5 GiB`, `513 MiB`), else bytes (`1000001 B`). Always parses back to the same value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0 as u128;
        for (name, mult) in BINARY {
            let mult = mult as u128;
            if n >= mult && (n * 1000).is_multiple_of(mult) {
                let thousandths = n * 1000 / mult;
                let (whole, frac) = (thousandths / 1000, thousandths % 1000);
                return if frac == 0 {
                    write!(f, "{whole} {name}")
                } else {
                    let frac = format!("{frac:03}");
                    write!(f, "{whole}.{} {name}", frac.trim_end_matches('0'))
                };
            }
        }
        write!(f, "{} B", self.0)
    }
}

impl FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_size(s).map(ByteSize)
    }
}

fn unit_multiplier(unit: &str) -> Option<u64> {
    UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, mult)| *mult)
}

/// Parses a size with a unit into bytes. See the module note for the rules.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let input = s.trim();
    if input.is_empty() {
        return Err(SizeError::Empty);
    }
    if input.starts_with('-') {
        return Err(SizeError::Negative(input.to_string()));
    }
    let split = input
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(input.len());
    let (number, unit) = input.split_at(split);
    let unit = unit.trim_start();
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (number, None),
    };
    let well_formed =
        !int_part.is_empty() && frac_part.is_none_or(|f| !f.is_empty() && !f.contains('.'));
    if !well_formed {
        return Err(SizeError::BadNumber(input.to_string()));
    }
    if unit.is_empty() {
        return Err(SizeError::NoUnit(number.to_string()));
    }
    let mult = unit_multiplier(unit).ok_or_else(|| SizeError::UnknownUnit {
        input: input.to_string(),
        unit: unit.to_string(),
    })? as u128;
    // Leading zeros do not make a number larger; strip them before the length checks.
    let int_digits = int_part.trim_start_matches('0');
    let frac_digits = frac_part.unwrap_or("").trim_end_matches('0');
    if int_digits.len() > 20 {
        return Err(SizeError::TooLarge(input.to_string()));
    }
    // Below one byte in 10^18 nothing can change the rounded-down result.
    let frac_digits = &frac_digits[..frac_digits.len().min(18)];
    let int_value: u128 = if int_digits.is_empty() {
        0
    } else {
        int_digits
            .parse()
            .map_err(|_| SizeError::BadNumber(input.to_string()))?
    };
    let frac_value: u128 = if frac_digits.is_empty() {
        0
    } else {
        frac_digits
            .parse()
            .map_err(|_| SizeError::BadNumber(input.to_string()))?
    };
    let scale = 10u128.pow(frac_digits.len() as u32);
    let bytes = int_value * mult + frac_value * mult / scale;
    u64::try_from(bytes).map_err(|_| SizeError::TooLarge(input.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_decimal_and_binary_units() {
        let cases = [
            ("512MiB", 512 << 20),
            ("4GiB", 4 << 30),
            ("4 GiB", 4 << 30),
            ("1.5GB", 1_500_000_000),
            ("1.5GiB", 3 << 29),
            ("2TiB", 2 << 40),
            ("1TB", 1_000_000_000_000),
            ("64kB", 64_000),
            ("64KB", 64_000),
            ("64KiB", 64 << 10),
            ("100B", 100),
            ("0B", 0),
            ("0MiB", 0),
            ("0.1KiB", 102), // 102.4 rounded down
            ("007MiB", 7 << 20),
            (" 3MB ", 3_000_000),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_ambiguous_and_malformed_sizes_with_a_fix() {
        let no_unit = parse_size("4096").unwrap_err();
        assert_eq!(no_unit, SizeError::NoUnit("4096".into()));
        assert!(no_unit.to_string().contains("`4096MiB` or `4096GiB`"));
        assert!(matches!(parse_size("0"), Err(SizeError::NoUnit(_))));
        assert!(matches!(parse_size("-1GiB"), Err(SizeError::Negative(_))));
        assert!(matches!(parse_size(""), Err(SizeError::Empty)));
        assert!(matches!(parse_size("GiB"), Err(SizeError::BadNumber(_))));
        assert!(matches!(parse_size("1.GiB"), Err(SizeError::BadNumber(_))));
        assert!(matches!(parse_size(".5GiB"), Err(SizeError::BadNumber(_))));
        assert!(matches!(
            parse_size("1.2.3GiB"),
            Err(SizeError::BadNumber(_))
        ));
        let unit = parse_size("4Gb").unwrap_err();
        assert!(unit.to_string().contains("unknown unit `Gb`"), "{unit}");
        assert!(matches!(
            parse_size("4 gib"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("16EiB"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("20000000TiB"),
            Err(SizeError::TooLarge(_))
        ));
        assert!(matches!(
            parse_size("999999999999999999999999B"),
            Err(SizeError::TooLarge(_))
        ));
        assert_eq!(parse_size("18446744073709551615B"), Ok(u64::MAX));
        assert!(matches!(
            parse_size("18446744073709551616B"),
            Err(SizeError::TooLarge(_))
        ));
    }

    #[test]
    fn displays_in_exact_human_units() {
        assert_eq!(ByteSize(0).to_string(), "0 B");
        assert_eq!(ByteSize(100).to_string(), "100 B");
        assert_eq!(ByteSize(4 << 30).to_string(), "4 GiB");
        assert_eq!(ByteSize(3 << 29).to_string(), "1.5 GiB");
        assert_eq!(ByteSize(513 << 20).to_string(), "513 MiB");
        assert_eq!(ByteSize(1_000_001).to_string(), "1000001 B");
        assert_eq!(ByteSize(3 << 30).approx(), "3.0 GiB");
        assert_eq!(ByteSize(1_500_000_000).approx(), "1.4 GiB");
        assert_eq!(ByteSize(12).approx(), "12 B");
    }

    proptest! {
        #[test]
        fn display_parses_back(n in any::<u64>()) {
            let shown = ByteSize(n).to_string();
            prop_assert_eq!(parse_size(&shown), Ok(n), "{}", shown);
        }

        #[test]
        fn round_units_parse_back(n in 0u64..100_000, unit in 0usize..4) {
            let (name, mult) = BINARY[unit];
            let text = format!("{n}{name}");
            prop_assert_eq!(parse_size(&text), Ok(n * mult));
        }

        #[test]
        fn never_panics(s in ".{0,40}") {
            let _ = parse_size(&s);
        }

        #[test]
        fn never_panics_on_number_like_input(s in "[-+ 0-9.]{0,30}[A-Za-z]{0,4}") {
            let _ = parse_size(&s);
        }
    }
}
