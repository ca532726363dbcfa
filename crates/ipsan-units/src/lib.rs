//! Sizes and durations as people write them in ipsan's flags and configuration files: the
//! one grammar behind a backend spec's `mem:256MiB`, a lab plan's `block = "64KiB"` and
//! `delay = "16ms"`, `ipsan bench --time 30s`, `ipsan wan --delay 8ms` and `--tcp-sndbuf 8MiB`.
//!
//! # Layout
//! - [`parse_size`]: a byte count, binary (`KiB`, `K`) or decimal (`KB`) multiples.
//! - [`parse_duration`]: a span with a unit (`ns` … `h`); only `0` may go without one.
//! - [`parse_duration_or_secs`]: the same, where a bare number means seconds (CLI flags).
//! - [`ParseError`]: why a string is not one of those.
//!
//! Callers keep their own ranges (a LUN of 0 bytes, a delay over an hour): this crate only
//! knows what the text means. Arithmetic is exact (integers, no floating point), so
//! `1.5MiB` is 1572864 bytes and `0.1ms` 100000 ns, and nothing overflows silently.

use std::time::Duration;

/// Why a size or duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// No number where one was expected (`MiB`, `-5`, `lots`).
    #[error("{0:?} is not a number with a unit (e.g. {1})")]
    NotANumber(String, &'static str),
    /// A unit this grammar does not know.
    #[error("unknown {kind} unit {unit:?} in {text:?} (use {expected})")]
    UnknownUnit {
        /// `size` or `duration`.
        kind: &'static str,
        text: String,
        unit: String,
        expected: &'static str,
    },
    /// A non-zero duration without a unit where one is required.
    #[error("{0:?}: give a unit (ns, us, ms, s, m, h)")]
    MissingUnit(String),
    /// Not a whole number of the smallest unit (bytes, nanoseconds).
    #[error("{0:?} is not a whole number of {1}")]
    Fractional(String, &'static str),
    /// Larger than the type holds.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

const SIZE_EXAMPLE: &str = "64KiB, 1MiB or 4096";
const SIZE_UNITS: &str = "B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB";

/// Splits `" 12.5 ms "` into the digits before the point, the digits after it, and the unit.
fn split(s: &str) -> Option<(&str, &str, &str)> {
    let t = s.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let ok = !(frac.contains('.') || int.is_empty() && frac.is_empty());
    ok.then_some((int, frac, unit.trim()))
}

/// `int.frac × mult`, exactly: `None` when it overflows `u128` or is not a whole number.
fn scale(int: &str, frac: &str, mult: u128) -> Option<Result<u128, ()>> {
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let whole = int.checked_mul(mult)?;
    if frac.is_empty() {
        return Some(Ok(whole));
    }
    let digits = u32::try_from(frac.len()).ok()?;
    let den = 10u128.checked_pow(digits)?;
    let num = frac.parse::<u128>().ok()?.checked_mul(mult)?;
    if num % den != 0 {
        return Some(Err(()));
    }
    Some(Ok(whole.checked_add(num / den)?))
}

/// Parses a byte count: `4096`, `512K`, `64KiB`, `1.5MiB`, `10GiB`, `1TiB` (binary multiples;
/// `K`/`M`/`G`/`T` alone are binary too), or `64KB`, `1MB`, `1GB`, `1TB` (decimal). Units are
/// case-insensitive and may follow a space. The result must be a whole number of bytes.
pub fn parse_size(s: &str) -> Result<u64, ParseError> {
    let (int, frac, unit) =
        split(s).ok_or_else(|| ParseError::NotANumber(s.to_owned(), SIZE_EXAMPLE))?;
    let mult: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(ParseError::UnknownUnit {
                kind: "size",
                text: s.to_owned(),
                unit: unit.to_owned(),
                expected: SIZE_UNITS,
            })
        }
    };
    match scale(int, frac, mult) {
        None => Err(ParseError::TooLarge(s.to_owned())),
        Some(Err(())) => Err(ParseError::Fractional(s.to_owned(), "bytes")),
        Some(Ok(b)) => u64::try_from(b).map_err(|_| ParseError::TooLarge(s.to_owned())),
    }
}

/// Nanoseconds per unit; `None` for an unknown unit.
fn duration_unit(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

fn duration(s: &str, bare_secs: bool) -> Result<Duration, ParseError> {
    let (int, frac, unit) =
        split(s).ok_or_else(|| ParseError::NotANumber(s.to_owned(), "8ms, 1.5s or 250us"))?;
    let per_unit = match (unit, bare_secs) {
        ("", true) => 1_000_000_000,
        ("", false) => {
            // Only zero is the same in every unit.
            if int.bytes().chain(frac.bytes()).any(|b| b != b'0') {
                return Err(ParseError::MissingUnit(s.to_owned()));
            }
            1
        }
        (u, _) => duration_unit(u).ok_or_else(|| ParseError::UnknownUnit {
            kind: "duration",
            text: s.to_owned(),
            unit: u.to_owned(),
            expected: "ns, us, ms, s, m or h",
        })?,
    };
    match scale(int, frac, per_unit) {
        None => Err(ParseError::TooLarge(s.to_owned())),
        Some(Err(())) => Err(ParseError::Fractional(s.to_owned(), "nanoseconds")),
        Some(Ok(ns)) => {
            let secs = u64::try_from(ns / 1_000_000_000)
                .map_err(|_| ParseError::TooLarge(s.to_owned()))?;
            // The remainder is below 10^9 and fits.
            let sub = u32::try_from(ns % 1_000_000_000).unwrap_or(0);
            Ok(Duration::new(secs, sub))
        }
    }
}

/// Parses a duration with its unit: `100ns`, `250us` (or `µs`), `0.5ms`, `16ms`, `1.5s`, `2m`
/// (or `min`), `1h`. A bare number is refused (is `16` milliseconds or seconds?), except `0`.
/// Negative values are not numbers here.
pub fn parse_duration(s: &str) -> Result<Duration, ParseError> {
    duration(s, false)
}

/// [`parse_duration`] where a bare number means seconds, as in `ipsan bench --time 10`.
pub fn parse_duration_or_secs(s: &str) -> Result<Duration, ParseError> {
    duration(s, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_binary_and_decimal_sizes() {
        for (s, want) in [
            ("4096", 4096),
            ("0", 0),
            ("512K", 512 << 10),
            ("4k", 4096),
            ("64KiB", 65536),
            ("64kib", 65536),
            ("1MiB", 1 << 20),
            ("1M", 1 << 20),
            ("1.5MiB", 3 << 19),
            ("256 MiB", 256 << 20),
            ("1GiB", 1 << 30),
            ("1TiB", 1 << 40),
            ("64KB", 64_000),
            ("1MB", 1_000_000),
            ("1GB", 1_000_000_000),
            ("2TB", 2_000_000_000_000),
            ("16B", 16),
            (" 8MiB ", 8 << 20),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn rejects_sizes_that_are_not_whole_bytes_or_overflow() {
        for s in [
            "",
            "GiB",
            "-5",
            "lots",
            "1XB",
            "1.2.3K",
            ".",
            "1.3",
            "0.1K",
            "5 parsecs",
        ] {
            assert!(parse_size(s).is_err(), "{s}");
        }
        assert_eq!(
            parse_size("99999999999999999999"),
            Err(ParseError::TooLarge("99999999999999999999".into()))
        );
        assert!(parse_size("16777216TiB").is_err(), "2^64 bytes");
        assert_eq!(parse_size("16777215TiB"), Ok(16_777_215 << 40));
        let e = parse_size("1XB").unwrap_err().to_string();
        assert!(
            e.contains("unknown size unit \"XB\"") && e.contains("MiB"),
            "{e}"
        );
    }

    #[test]
    fn accepts_durations_with_every_unit() {
        for (s, want) in [
            ("100ns", Duration::from_nanos(100)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("0.5ms", Duration::from_micros(500)),
            ("16ms", Duration::from_millis(16)),
            ("1.5s", Duration::from_millis(1500)),
            ("2m", Duration::from_secs(120)),
            ("2min", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("0", Duration::ZERO),
            ("0.0", Duration::ZERO),
            (" 30 s", Duration::from_secs(30)),
        ] {
            assert_eq!(parse_duration(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn rejects_durations_without_unit_or_number() {
        for s in ["16", "-1ms", "5 parsecs", "ms", "", "1.5ns", "1d"] {
            assert!(parse_duration(s).is_err(), "{s}");
        }
        assert_eq!(
            parse_duration("16"),
            Err(ParseError::MissingUnit("16".into()))
        );
        assert!(parse_duration("99999999999999999999999h").is_err());
    }

    #[test]
    fn bare_number_is_seconds_only_where_asked() {
        assert_eq!(parse_duration_or_secs("10"), Ok(Duration::from_secs(10)));
        assert_eq!(
            parse_duration_or_secs("2.5"),
            Ok(Duration::from_millis(2500))
        );
        assert_eq!(
            parse_duration_or_secs("500ms"),
            Ok(Duration::from_millis(500))
        );
        assert!(parse_duration_or_secs("5 parsecs").is_err());
    }
}
