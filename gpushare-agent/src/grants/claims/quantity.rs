//! Kubernetes quantities (`4Gi`, `2048Mi`, `1.5G`, `1e9`, `500m`) as whole bytes.
//!
//! The grammar is the API's (`k8s.io/apimachinery/pkg/api/resource`): a non-negative decimal number
//! and one suffix, binary (`Ki` … `Ei`), decimal (`n`, `u`, `m`, ``, `k`, `M` … `E`) or an exponent
//! (`e3`, `E6`). A fraction of a byte is rounded up, as the API's `Value()` does.

/// Bytes `s` stands for, or why it is not a quantity.
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.starts_with('-') {
        return Err(format!("`{s}` is negative"));
    }
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(format!("`{s}` has no number"));
    }
    // value = digits * 10^exp10 * 2^exp2 / 10^frac_len
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        e if e.starts_with(['e', 'E']) => match e[1..].parse::<i32>() {
            Ok(x) if (-30..=30).contains(&x) => (x, 0),
            _ => return Err(format!("`{s}`: bad exponent `{e}`")),
        },
        other => {
            return Err(format!(
                "`{s}`: unknown suffix `{other}` (use Ki, Mi, Gi, Ti, k, M, G, T or an exponent)"
            ));
        }
    };
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let too_big = || format!("`{s}` is too large");
    if digits.len() > 30 {
        return Err(too_big());
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| too_big())?
    };
    let scale = exp10 - frac.len() as i32;
    let mut num = mantissa.checked_shl(exp2).ok_or_else(too_big)?;
    if num >> exp2 != mantissa {
        return Err(too_big());
    }
    let mut den: u128 = 1;
    if scale >= 0 {
        num = num
            .checked_mul(10u128.checked_pow(scale as u32).ok_or_else(too_big)?)
            .ok_or_else(too_big)?;
    } else {
        den = 10u128
            .checked_pow(scale.unsigned_abs())
            .ok_or_else(too_big)?;
    }
    u64::try_from(num.div_ceil(den)).map_err(|_| too_big())
}

#[cfg(test)]
mod tests {
    use super::parse_quantity as q;

    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    #[test]
    fn the_apis_suffixes_in_bytes() {
        assert_eq!(q("4Gi"), Ok(4 * GI));
        assert_eq!(q("2048Mi"), Ok(2048 * MI));
        assert_eq!(q("1Ki"), Ok(1024));
        assert_eq!(q("1Ti"), Ok(1 << 40));
        assert_eq!(q("1Pi"), Ok(1 << 50));
        assert_eq!(q("1Ei"), Ok(1 << 60));
        assert_eq!(q("1024M"), Ok(1_024_000_000));
        assert_eq!(q("1k"), Ok(1000));
        assert_eq!(q("1G"), Ok(1_000_000_000));
        assert_eq!(q("2T"), Ok(2_000_000_000_000));
        assert_eq!(q("1P"), Ok(1_000_000_000_000_000));
        assert_eq!(q("1E"), Ok(1_000_000_000_000_000_000));
        assert_eq!(q("1.5Gi"), Ok(3 * GI / 2));
        assert_eq!(q("0.5Ki"), Ok(512));
        assert_eq!(q("1e9"), Ok(1_000_000_000));
        assert_eq!(q("5E3"), Ok(5000));
        assert_eq!(q("12345"), Ok(12345));
        assert_eq!(q("+7"), Ok(7));
        assert_eq!(q(" 0 "), Ok(0));
        assert_eq!(q(".5k"), Ok(500));
        assert_eq!(q("007Mi"), Ok(7 * MI));
    }

    #[test]
    fn a_fraction_of_a_byte_rounds_up() {
        assert_eq!(q("500m"), Ok(1));
        assert_eq!(q("1500m"), Ok(2));
        assert_eq!(q("1000m"), Ok(1));
        assert_eq!(q("1n"), Ok(1));
        assert_eq!(q("1u"), Ok(1));
        assert_eq!(q("0m"), Ok(0));
        assert_eq!(q("1.1"), Ok(2));
        assert_eq!(q("1e-3"), Ok(1));
        assert_eq!(q("2.5e0"), Ok(3));
    }

    #[test]
    fn what_is_not_a_quantity_says_why() {
        for (bad, why) in [
            ("-1Gi", "negative"),
            ("", "no number"),
            ("Gi", "no number"),
            (".", "no number"),
            ("1.2.3", "no number"),
            ("4GB", "unknown suffix"),
            ("4 Gi", "unknown suffix"),
            ("1e", "bad exponent"),
            ("1e99", "bad exponent"),
            ("99999999999999999999Ei", "too large"),
            ("18446744073709551616", "too large"),
            ("1234567890123456789012345678901", "too large"),
        ] {
            let e = q(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert_eq!(q("18446744073709551615"), Ok(u64::MAX));
        // At most 30 digits, whatever the exponent brings them down to.
        assert_eq!(q("123456789012345678901234567890e-30"), Ok(1));
        let e = q("1234567890123456789012345678901e-30").unwrap_err();
        assert!(e.contains("too large"), "{e}");
        assert_eq!(q("16Ei").unwrap_err(), "`16Ei` is too large");
        assert_eq!(q("15Ei"), Ok(15 << 60));
    }
}
