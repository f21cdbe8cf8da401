//! Parsing and formatting of the sizes and durations that appear on the
//! command line and in reports. Sizes are counted in bytes and use binary
//! multiples only: `K`, `M` and `G` mean 1024, 1024² and 1024³ bytes, with an
//! optional trailing `B` or `iB` (`4K`, `4KB` and `4KiB` are all 4096 bytes).
//! Durations accept `ns`, `us` (or `µs`), `ms`, `s`, `m`/`min` and `h`, and a
//! bare number means seconds. Parsing is exact: sizes are computed with
//! integer arithmetic so `1.5K` is exactly 1536 bytes, and a text that does
//! not name a whole number of bytes (`1.1K`) is rejected rather than rounded.
//! Parsers do not range-check: zero is returned as zero and callers decide
//! whether it is acceptable.

use std::time::Duration;

/// The largest number of distinct sizes [`parse_size_list`] will return.
///
/// Invariant: a list expanding to more sizes than this is an error, which
/// keeps a typo such as `1..4G:x2,...` repeated many times from producing an
/// unbounded plan.
pub const MAX_SIZES: usize = 10_000;

/// Why a size, size list or duration could not be parsed.
///
/// Every message names the offending text so the user can find it on their
/// command line.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UnitError {
    /// The size text was empty (or only whitespace).
    #[error("empty size: expected a number of bytes such as 64, 4K or 1M")]
    EmptySize,
    /// The size text started with a minus sign.
    #[error("invalid size \"{text}\": sizes cannot be negative")]
    NegativeSize {
        /// The text as given.
        text: String,
    },
    /// The size text did not start with a number.
    #[error(
        "invalid size \"{text}\": expected a number of bytes with an optional K, M or G suffix, \
         such as 64, 4K or 1M"
    )]
    InvalidSizeNumber {
        /// The text as given.
        text: String,
    },
    /// The number was followed by something other than K, M or G.
    #[error("invalid size \"{text}\": unknown suffix \"{suffix}\" (use K, M or G)")]
    UnknownSizeSuffix {
        /// The text as given.
        text: String,
        /// The part after the number.
        suffix: String,
    },
    /// The size had a fraction that does not come to a whole number of bytes.
    #[error("invalid size \"{text}\": not a whole number of bytes")]
    FractionalSize {
        /// The text as given.
        text: String,
    },
    /// The size does not fit in 64 bits.
    #[error("invalid size \"{text}\": larger than the largest supported size (2^64 - 1 bytes)")]
    SizeOverflow {
        /// The text as given.
        text: String,
    },
    /// A size list had an empty item (`1,,64`, a trailing comma, or nothing at all).
    #[error("invalid size list \"{list}\": empty item (expected e.g. 1,64,1K or 1..4M)")]
    EmptyListItem {
        /// The whole list as given.
        list: String,
    },
    /// A range item was not of the form `START..END` or `START..END:xFACTOR`.
    #[error(
        "invalid size range \"{text}\": expected START..END or START..END:xFACTOR, \
         such as 1..4M or 1..4M:x4"
    )]
    MalformedRange {
        /// The range item as given.
        text: String,
    },
    /// A range started at 0, which multiplying never moves away from.
    #[error(
        "invalid size range \"{text}\": a range cannot start at 0 (list 0 on its own instead)"
    )]
    RangeStartZero {
        /// The range item as given.
        text: String,
    },
    /// A range's start was larger than its end.
    #[error(
        "invalid size range \"{text}\": start ({start} bytes) is larger than end ({end} bytes)"
    )]
    RangeReversed {
        /// The range item as given.
        text: String,
        /// The parsed start, in bytes.
        start: u64,
        /// The parsed end, in bytes.
        end: u64,
    },
    /// A range's factor was not a whole number of at least 2.
    #[error(
        "invalid size range \"{text}\": factor \"{factor}\" must be a whole number of at least 2, \
         as in 1..4M:x4"
    )]
    BadFactor {
        /// The range item as given.
        text: String,
        /// The factor part as given (after the colon).
        factor: String,
    },
    /// The list expanded to more than [`MAX_SIZES`] distinct sizes.
    #[error("invalid size list \"{list}\": it expands to more than {limit} sizes")]
    TooManySizes {
        /// The whole list as given.
        list: String,
        /// The limit that was exceeded ([`MAX_SIZES`]).
        limit: usize,
    },
    /// The duration text was empty (or only whitespace).
    #[error("empty duration: expected a time such as 50ms, 2s or 1m")]
    EmptyDuration,
    /// The duration text started with a minus sign.
    #[error("invalid duration \"{text}\": durations cannot be negative")]
    NegativeDuration {
        /// The text as given.
        text: String,
    },
    /// The duration text did not start with a number.
    #[error(
        "invalid duration \"{text}\": expected a number with an optional unit, \
         such as 50ms, 2s, 1.5s or 1m"
    )]
    InvalidDurationNumber {
        /// The text as given.
        text: String,
    },
    /// The number was followed by an unknown unit.
    #[error("invalid duration \"{text}\": unknown unit \"{unit}\" (use ns, us, ms, s, m or h)")]
    UnknownDurationUnit {
        /// The text as given.
        text: String,
        /// The part after the number.
        unit: String,
    },
    /// The duration does not fit in a [`Duration`].
    #[error("invalid duration \"{text}\": too long")]
    DurationOverflow {
        /// The text as given.
        text: String,
    },
}

/// A non-negative decimal number split into its parts, plus what follows it.
struct Decimal<'a> {
    /// The digits before the point; never empty.
    int_digits: &'a str,
    /// The digits after the point with trailing zeros removed; may be empty.
    frac_digits: &'a str,
    /// Everything after the number, with leading whitespace removed.
    suffix: &'a str,
}

/// Splits `text` into a decimal number (`DIGITS` or `DIGITS.DIGITS`) and the
/// suffix after it. Returns `None` if `text` does not start with such a number.
fn split_decimal(text: &str) -> Option<Decimal<'_>> {
    let number_len = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_len);
    let (int_digits, frac_digits) = match number.split_once('.') {
        Some((int, frac)) => (int, frac),
        None => (number, ""),
    };
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let had_point = number.contains('.');
    if int_digits.is_empty()
        || !all_digits(int_digits)
        || !all_digits(frac_digits)
        || (had_point && frac_digits.is_empty())
    {
        return None;
    }
    Some(Decimal {
        int_digits,
        frac_digits: frac_digits.trim_end_matches('0'),
        suffix: suffix.trim_start(),
    })
}

/// Nanoseconds since `t0`, saturating at `u64::MAX` (585 years).
pub fn ns_since(t0: std::time::Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Payload rate in Gbit/s (10^9 bit/s) of `bytes` moved in `elapsed_ns`
/// nanoseconds: bits per nanosecond; 0 when no time passed. The one place
/// netgap turns bytes and time into Gbit/s.
pub fn gbps(bytes: f64, elapsed_ns: f64) -> f64 {
    if elapsed_ns > 0.0 {
        bytes * 8.0 / elapsed_ns
    } else {
        0.0
    }
}

/// Parses a size in bytes: a whole or decimal number with an optional
/// case-insensitive binary suffix `K`, `M` or `G` (powers of 1024), which may
/// be followed by `B` or `iB` (`64`, `1k`, `64KiB`, `4M`, `1GB`, `1.5K`).
///
/// Surrounding whitespace is ignored. A fractional number is accepted only
/// when it comes to a whole number of bytes (`1.5K` = 1536, but `1.1K` and
/// `1.5` are errors). `0` parses as 0: callers range-check.
///
/// # Errors
/// [`UnitError`] naming the text for an empty, negative, non-numeric,
/// fractional or overflowing size, or an unknown suffix.
pub fn parse_size_bytes(s: &str) -> Result<u64, UnitError> {
    let text = s.trim();
    if text.is_empty() {
        return Err(UnitError::EmptySize);
    }
    if text.starts_with('-') {
        return Err(UnitError::NegativeSize { text: text.into() });
    }
    let Some(decimal) = split_decimal(text) else {
        return Err(UnitError::InvalidSizeNumber { text: text.into() });
    };
    let shift: u32 = match decimal.suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => {
            return Err(UnitError::UnknownSizeSuffix {
                text: text.into(),
                suffix: decimal.suffix.into(),
            })
        }
    };
    let overflow = || UnitError::SizeOverflow { text: text.into() };
    // All digits were checked above, so the only possible failure is overflow.
    let whole: u64 = decimal.int_digits.parse().map_err(|_| overflow())?;
    let whole_bytes = whole.checked_mul(1u64 << shift).ok_or_else(overflow)?;

    // The fraction f / 10^k times 2^shift is a whole number iff 5^k divides f
    // and k <= shift: f has no trailing zeros, so it cannot be divisible by
    // both 2 and 5, and divisibility by 5 is needed for any k >= 1. Then the
    // value is (f / 5^k) * 2^(shift - k), which is below 2^shift.
    let k = decimal.frac_digits.len();
    let frac_bytes: u64 = if k == 0 {
        0
    } else {
        let fractional = || UnitError::FractionalSize { text: text.into() };
        let k = u32::try_from(k).map_err(|_| fractional())?;
        if k > shift {
            return Err(fractional());
        }
        // k <= 30 digits, so f < 10^30 fits in a u128 and 5^k <= 5^30 too.
        let f: u128 = decimal.frac_digits.parse().map_err(|_| fractional())?;
        let five_k = 5u128.pow(k);
        if !f.is_multiple_of(five_k) {
            return Err(fractional());
        }
        let units = u64::try_from(f / five_k).map_err(|_| fractional())?;
        units << (shift - k)
    };
    whole_bytes.checked_add(frac_bytes).ok_or_else(overflow)
}

/// Formats a size in bytes compactly: exact multiples of 1024³, 1024² or
/// 1024 get a `G`, `M` or `K` suffix (`64K`, `4M`, `1G`), anything else is
/// the plain number of bytes (`0`, `1`, `1536`).
///
/// Invariant: `parse_size_bytes(&format_size(b)) == Ok(b)` for every `b`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 3] = [(30, "G"), (20, "M"), (10, "K")];
    if bytes != 0 {
        for (shift, suffix) in UNITS {
            let unit = 1u64 << shift;
            if bytes.is_multiple_of(unit) {
                return format!("{}{suffix}", bytes / unit);
            }
        }
    }
    bytes.to_string()
}

/// Appends the sizes of one range item (`START..END` or
/// `START..END:xFACTOR`) to `out`: start, then multiplied by the factor (2
/// if not given) while the result is at most end; end is appended last if
/// the steps did not land on it exactly.
fn expand_range(item: &str, start: &str, rest: &str, out: &mut Vec<u64>) -> Result<(), UnitError> {
    let malformed = || UnitError::MalformedRange { text: item.into() };
    let (end, factor_text) = match rest.split_once(':') {
        Some((end, factor)) => (end, Some(factor.trim())),
        None => (rest, None),
    };
    if start.trim().is_empty() || end.trim().is_empty() || end.contains("..") {
        return Err(malformed());
    }
    let factor = match factor_text {
        None => 2,
        Some(f) => {
            let digits = f.strip_prefix(['x', 'X']).unwrap_or(f);
            match digits.parse::<u64>() {
                Ok(n) if n >= 2 && !digits.starts_with('+') => n,
                _ => {
                    return Err(UnitError::BadFactor {
                        text: item.into(),
                        factor: f.into(),
                    })
                }
            }
        }
    };
    let start = parse_size_bytes(start)?;
    let end = parse_size_bytes(end)?;
    if start == 0 {
        return Err(UnitError::RangeStartZero { text: item.into() });
    }
    if start > end {
        return Err(UnitError::RangeReversed {
            text: item.into(),
            start,
            end,
        });
    }
    // start >= 1 and factor >= 2, so this takes at most 64 steps.
    let mut size = start;
    loop {
        out.push(size);
        match size.checked_mul(factor) {
            Some(next) if next <= end => size = next,
            _ => break,
        }
    }
    if size != end {
        out.push(end);
    }
    Ok(())
}

/// A rate in bit/s as the CLI's rate flags take it: `2.5G`, `600M`,
/// `40K`, or plain bit/s below a kilobit.
pub fn rate_text(bps: u64) -> String {
    let (unit, div) = match bps {
        b if b >= 1_000_000_000 => ("G", 1e9),
        b if b >= 1_000_000 => ("M", 1e6),
        b if b >= 1_000 => ("K", 1e3),
        _ => ("", 1.0),
    };
    let v = bps as f64 / div;
    if (v - v.round()).abs() < 1e-9 {
        format!("{}{unit}", v.round())
    } else {
        format!("{v}{unit}")
    }
}

/// Parses the `--sizes` syntax into byte counts, sorted ascending without
/// duplicates.
///
/// The text is a comma-separated list whose items are each either a single
/// size as accepted by [`parse_size_bytes`] (`64`, `1K`), a range of
/// doublings `START..END` (`1..4M` is 1, 2, 4, …, 4M), or a range with an
/// integer factor of at least 2, `START..END:xFACTOR` (`1..4M:x4` is 1, 4,
/// 16, …). A range steps from START while the value stays at most END and
/// then includes END itself if the steps did not reach it exactly
/// (`3..10` is 3, 6, 10). Items may be mixed: `1,1K..8K`.
///
/// A size of 0 may appear as a single item and is returned: callers
/// range-check. A range cannot start at 0.
///
/// # Errors
/// [`UnitError`] for an empty item, a malformed or reversed range, a factor
/// below 2 or not a whole number, any invalid size, or a list expanding to
/// more than [`MAX_SIZES`] distinct sizes.
pub fn parse_size_list(s: &str) -> Result<Vec<u64>, UnitError> {
    let mut sizes = Vec::new();
    for raw_item in s.split(',') {
        let item = raw_item.trim();
        if item.is_empty() {
            return Err(UnitError::EmptyListItem { list: s.into() });
        }
        match item.split_once("..") {
            Some((start, rest)) => expand_range(item, start, rest, &mut sizes)?,
            None if item.contains(':') => {
                return Err(UnitError::MalformedRange { text: item.into() })
            }
            None => sizes.push(parse_size_bytes(item)?),
        }
    }
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.len() > MAX_SIZES {
        return Err(UnitError::TooManySizes {
            list: s.into(),
            limit: MAX_SIZES,
        });
    }
    Ok(sizes)
}

/// Parses a duration: a whole or decimal number followed by an optional unit
/// `ns`, `us` (or `µs`), `ms`, `s`, `m` (or `min`) or `h`; a bare number
/// means seconds (`50ms`, `2s`, `1.5s`, `200us`, `1m`, `10`). Several such
/// parts, each with its unit, add up (`4m3s`, `1h 30m`, as netgap prints
/// durations).
///
/// Units are lower case; surrounding whitespace is ignored. The result is
/// exact to the nanosecond, rounded down below that. Zero is returned as
/// [`Duration::ZERO`]: callers range-check.
///
/// # Errors
/// [`UnitError`] naming the text for an empty, negative, non-numeric or
/// too-long duration, or an unknown unit.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let text = s.trim();
    if text.is_empty() {
        return Err(UnitError::EmptyDuration);
    }
    if text.starts_with('-') {
        return Err(UnitError::NegativeDuration { text: text.into() });
    }
    let parts = duration_parts(text);
    if parts.len() == 1 {
        return parse_duration_part(text, text);
    }
    let mut total = Duration::ZERO;
    for part in parts {
        // Every part of a sum names its unit: "1h30" is no duration.
        if split_decimal(part).is_some_and(|d| d.suffix.is_empty()) {
            return Err(UnitError::InvalidDurationNumber { text: text.into() });
        }
        total = total
            .checked_add(parse_duration_part(part, text)?)
            .ok_or_else(|| UnitError::DurationOverflow { text: text.into() })?;
    }
    Ok(total)
}

/// The parts of a duration: a new part starts at a digit that follows a
/// unit (`4m3s` is `4m` and `3s`; spaces between parts are dropped).
fn duration_parts(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut in_unit) = (0, false);
    for (i, c) in text.char_indices() {
        if c.is_ascii_digit() || c == '.' {
            if in_unit {
                parts.push(text[start..i].trim());
                (start, in_unit) = (i, false);
            }
        } else if !c.is_whitespace() {
            in_unit = true;
        }
    }
    parts.push(text[start..].trim());
    parts
}

/// One number and its unit of the duration `text` (errors name `text`).
fn parse_duration_part(part: &str, text: &str) -> Result<Duration, UnitError> {
    const NS_PER_S: u128 = 1_000_000_000;
    let Some(decimal) = split_decimal(part) else {
        return Err(UnitError::InvalidDurationNumber { text: text.into() });
    };
    let unit_ns: u128 = match decimal.suffix {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "" | "s" => NS_PER_S,
        "m" | "min" => 60 * NS_PER_S,
        "h" => 3_600 * NS_PER_S,
        _ => {
            return Err(UnitError::UnknownDurationUnit {
                text: text.into(),
                unit: decimal.suffix.into(),
            })
        }
    };
    let overflow = || UnitError::DurationOverflow { text: text.into() };
    // All digits were checked by split_decimal, so parsing fails only on overflow.
    let whole: u64 = decimal.int_digits.parse().map_err(|_| overflow())?;
    let whole_ns = u128::from(whole) * unit_ns;
    // Digits past the 20th change the result by less than unit_ns / 10^20,
    // i.e. under a nanosecond, so they are dropped. With at most 20 digits,
    // f < 10^20 and f * unit_ns < 10^20 * 3.6 * 10^12 fits easily in a u128.
    let frac = &decimal.frac_digits[..decimal.frac_digits.len().min(20)];
    let frac_ns = if frac.is_empty() {
        0
    } else {
        let f: u128 = frac.parse().map_err(|_| overflow())?;
        // frac.len() <= 20, so the conversion cannot fail.
        let k = u32::try_from(frac.len()).map_err(|_| overflow())?;
        f * unit_ns / 10u128.pow(k)
    };
    let total_ns = whole_ns + frac_ns;
    let secs = u64::try_from(total_ns / NS_PER_S).map_err(|_| overflow())?;
    // The remainder is below 10^9, so it fits in a u32.
    let nanos = u32::try_from(total_ns % NS_PER_S).map_err(|_| overflow())?;
    Ok(Duration::new(secs, nanos))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_the_rate_flags_take_them() {
        assert_eq!(rate_text(2_700_000_000), "2.7G");
        assert_eq!(rate_text(600_000_000), "600M");
        assert_eq!(rate_text(10_000_000_000), "10G");
        assert_eq!(rate_text(40_000), "40K");
        assert_eq!(rate_text(999), "999");
    }
    use proptest::prelude::*;

    const K: u64 = 1 << 10;

    #[test]
    fn gbps_is_bits_per_nanosecond() {
        assert_eq!(gbps(1e9, 8e9), 1.0);
        assert_eq!(gbps(1.0, 0.0), 0.0);
    }

    #[test]
    fn ns_since_counts_forward() {
        let t0 = std::time::Instant::now();
        let a = ns_since(t0);
        assert!(ns_since(t0) >= a);
    }
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;

    #[test]
    fn sizes_plain_and_suffixed() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("1", 1),
            ("64", 64),
            ("1K", K),
            ("1k", K),
            ("64KiB", 64 * K),
            ("64kib", 64 * K),
            ("64KB", 64 * K),
            ("4M", 4 * M),
            ("4mb", 4 * M),
            ("1G", G),
            ("1GiB", G),
            ("100B", 100),
            (" 8K ", 8 * K),
            ("4 K", 4 * K),
            ("007", 7),
            ("18446744073709551615", u64::MAX),
            ("17179869183G", 17_179_869_183 * G),
        ];
        for &(text, want) in cases {
            assert_eq!(parse_size_bytes(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn sizes_fractional_only_when_whole_bytes() {
        assert_eq!(parse_size_bytes("1.5K"), Ok(1536));
        assert_eq!(parse_size_bytes("0.5K"), Ok(512));
        assert_eq!(parse_size_bytes("0.25M"), Ok(256 * K));
        assert_eq!(parse_size_bytes("1.0"), Ok(1));
        assert_eq!(parse_size_bytes("2.000K"), Ok(2 * K));
        assert_eq!(parse_size_bytes("0.0009765625M"), Ok(K));
        assert_eq!(parse_size_bytes("0.000000000931322574615478515625G"), Ok(1));
        for text in ["1.5", "1.1K", "0.3M", "0.0000000009313225746154785156G"] {
            assert_eq!(
                parse_size_bytes(text),
                Err(UnitError::FractionalSize { text: text.into() }),
                "{text}"
            );
        }
    }

    #[test]
    fn sizes_rejected() {
        assert_eq!(parse_size_bytes(""), Err(UnitError::EmptySize));
        assert_eq!(parse_size_bytes("  "), Err(UnitError::EmptySize));
        assert_eq!(
            parse_size_bytes("-1"),
            Err(UnitError::NegativeSize { text: "-1".into() })
        );
        for text in ["K", "abc", ".5K", "5.K", "1.2.3", "+5", "１"] {
            assert_eq!(
                parse_size_bytes(text),
                Err(UnitError::InvalidSizeNumber { text: text.into() }),
                "{text}"
            );
        }
        assert_eq!(
            parse_size_bytes("12Q"),
            Err(UnitError::UnknownSizeSuffix {
                text: "12Q".into(),
                suffix: "Q".into()
            })
        );
        assert_eq!(
            parse_size_bytes("1e3"),
            Err(UnitError::UnknownSizeSuffix {
                text: "1e3".into(),
                suffix: "e3".into()
            })
        );
        assert!(matches!(
            parse_size_bytes("1iB"),
            Err(UnitError::UnknownSizeSuffix { .. })
        ));
        assert!(matches!(
            parse_size_bytes("1T"),
            Err(UnitError::UnknownSizeSuffix { .. })
        ));
        for text in [
            "18446744073709551616",
            "17179869184G",
            "99999999999999999999999K",
        ] {
            assert_eq!(
                parse_size_bytes(text),
                Err(UnitError::SizeOverflow { text: text.into() }),
                "{text}"
            );
        }
    }

    #[test]
    fn size_error_messages_name_the_text() {
        assert_eq!(
            parse_size_bytes("12Q").unwrap_err().to_string(),
            "invalid size \"12Q\": unknown suffix \"Q\" (use K, M or G)"
        );
        assert!(parse_size_bytes("1.1K")
            .unwrap_err()
            .to_string()
            .contains("\"1.1K\""));
        assert!(parse_size_list("8K..1K")
            .unwrap_err()
            .to_string()
            .contains("\"8K..1K\""));
    }

    #[test]
    fn format_sizes() {
        assert_eq!(format_size(0), "0");
        assert_eq!(format_size(1), "1");
        assert_eq!(format_size(64), "64");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(1536), "1536");
        assert_eq!(format_size(K), "1K");
        assert_eq!(format_size(64 * K), "64K");
        assert_eq!(format_size(1536 * K), "1536K");
        assert_eq!(format_size(4 * M), "4M");
        assert_eq!(format_size(G), "1G");
        assert_eq!(format_size(3 * G), "3G");
        assert_eq!(format_size(u64::MAX), u64::MAX.to_string());
        assert_eq!(format_size(u64::MAX - (G - 1)), "17179869183G");
    }

    #[test]
    fn size_list_commas() {
        assert_eq!(parse_size_list("1,64,1K,64K"), Ok(vec![1, 64, K, 64 * K]));
        assert_eq!(parse_size_list("64K, 1 ,64,1"), Ok(vec![1, 64, 64 * K]));
        assert_eq!(parse_size_list("0"), Ok(vec![0]));
        assert_eq!(parse_size_list("0,1"), Ok(vec![0, 1]));
    }

    #[test]
    fn size_list_doubling_range() {
        let want: Vec<u64> = (0..=22).map(|e| 1u64 << e).collect();
        assert_eq!(parse_size_list("1..4M"), Ok(want));
        assert_eq!(parse_size_list("3..10"), Ok(vec![3, 6, 10]));
        assert_eq!(parse_size_list("4K..4K"), Ok(vec![4 * K]));
        assert_eq!(parse_size_list("1..1"), Ok(vec![1]));
        assert_eq!(parse_size_list("1K..8K"), Ok(vec![K, 2 * K, 4 * K, 8 * K]));
        // Stepping must not overflow near the top of the range.
        let top = parse_size_list("1..18446744073709551615").unwrap();
        assert_eq!(top.len(), 65);
        assert_eq!(top[63], 1u64 << 63);
        assert_eq!(top[64], u64::MAX);
    }

    #[test]
    fn size_list_factor_range() {
        assert_eq!(
            parse_size_list("1..4M:x4"),
            Ok((0..=11).map(|e| 1u64 << (2 * e)).collect())
        );
        assert_eq!(parse_size_list("1..100:x10"), Ok(vec![1, 10, 100]));
        assert_eq!(parse_size_list("1..50:x10"), Ok(vec![1, 10, 50]));
        assert_eq!(parse_size_list("1..8:X2"), Ok(vec![1, 2, 4, 8]));
        assert_eq!(parse_size_list("1..8:2"), Ok(vec![1, 2, 4, 8]));
        assert_eq!(parse_size_list("1..8: x2"), Ok(vec![1, 2, 4, 8]));
    }

    #[test]
    fn size_list_mixed_sorted_dedup() {
        assert_eq!(
            parse_size_list("1,1K..8K"),
            Ok(vec![1, K, 2 * K, 4 * K, 8 * K])
        );
        assert_eq!(
            parse_size_list("4K..16K,1,2K,1..4,8K"),
            Ok(vec![1, 2, 4, 2 * K, 4 * K, 8 * K, 16 * K])
        );
    }

    #[test]
    fn size_list_errors() {
        for list in ["", "1,,2", "1,", ",1", " , "] {
            assert_eq!(
                parse_size_list(list),
                Err(UnitError::EmptyListItem { list: list.into() }),
                "{list:?}"
            );
        }
        assert_eq!(
            parse_size_list("8K..1K"),
            Err(UnitError::RangeReversed {
                text: "8K..1K".into(),
                start: 8 * K,
                end: K
            })
        );
        for factor in ["x1", "x0", "1", "x", "x1.5", "x-2", "x+4", "two", ""] {
            let item = format!("1..4M:{factor}");
            assert_eq!(
                parse_size_list(&item),
                Err(UnitError::BadFactor {
                    text: item.clone(),
                    factor: factor.into()
                }),
                "{item}"
            );
        }
        for item in ["..4M", "1..", "1..2..4", "64:x2", "..", "1..:x2"] {
            assert_eq!(
                parse_size_list(item),
                Err(UnitError::MalformedRange { text: item.into() }),
                "{item}"
            );
        }
        assert_eq!(
            parse_size_list("0..4K"),
            Err(UnitError::RangeStartZero {
                text: "0..4K".into()
            })
        );
        assert_eq!(
            parse_size_list("1,12Q"),
            Err(UnitError::UnknownSizeSuffix {
                text: "12Q".into(),
                suffix: "Q".into()
            })
        );
        assert!(matches!(
            parse_size_list("1..1.1K"),
            Err(UnitError::FractionalSize { .. })
        ));
    }

    #[test]
    fn size_list_limit() {
        let at_limit: Vec<String> = (1..=MAX_SIZES).map(|n| n.to_string()).collect();
        assert_eq!(
            parse_size_list(&at_limit.join(",")).unwrap().len(),
            MAX_SIZES
        );
        // Duplicates do not count towards the limit.
        let repeated = format!("{},1,2,3", at_limit.join(","));
        assert_eq!(parse_size_list(&repeated).unwrap().len(), MAX_SIZES);
        let over = format!("{},{}", at_limit.join(","), MAX_SIZES + 1);
        assert_eq!(
            parse_size_list(&over),
            Err(UnitError::TooManySizes {
                list: over.clone(),
                limit: MAX_SIZES
            })
        );
    }

    #[test]
    fn durations() {
        let cases: &[(&str, Duration)] = &[
            ("50ms", Duration::from_millis(50)),
            ("2s", Duration::from_secs(2)),
            ("1.5s", Duration::from_millis(1500)),
            ("200us", Duration::from_micros(200)),
            ("200µs", Duration::from_micros(200)),
            ("7ns", Duration::from_nanos(7)),
            ("1m", Duration::from_secs(60)),
            ("2min", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("0.5h", Duration::from_secs(1800)),
            ("10", Duration::from_secs(10)),
            ("0.25", Duration::from_millis(250)),
            ("0", Duration::ZERO),
            ("0ms", Duration::ZERO),
            (" 3 s ", Duration::from_secs(3)),
            ("1.5ns", Duration::from_nanos(1)),
            ("0.000000001", Duration::from_nanos(1)),
            ("0.0000000019999999999999999999999", Duration::from_nanos(1)),
            ("0.1m", Duration::from_secs(6)),
            ("18446744073709551615", Duration::from_secs(u64::MAX)),
            ("4m3s", Duration::from_secs(243)),
            ("4m 3s", Duration::from_secs(243)),
            ("1h 30m", Duration::from_secs(5400)),
            ("1s500ms", Duration::from_millis(1500)),
        ];
        for &(text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn durations_rejected() {
        assert_eq!(parse_duration(""), Err(UnitError::EmptyDuration));
        assert_eq!(
            parse_duration("-1s"),
            Err(UnitError::NegativeDuration { text: "-1s".into() })
        );
        for text in [
            "s", "ms", "abc", ".5s", "1.s", "1.2.3s", "+1s", "1h30", "4m 3",
        ] {
            assert_eq!(
                parse_duration(text),
                Err(UnitError::InvalidDurationNumber { text: text.into() }),
                "{text}"
            );
        }
        for (text, unit) in [("5x", "x"), ("1S", "S"), ("3sec", "sec"), ("1d", "d")] {
            assert_eq!(
                parse_duration(text),
                Err(UnitError::UnknownDurationUnit {
                    text: text.into(),
                    unit: unit.into()
                }),
                "{text}"
            );
        }
        assert_eq!(
            parse_duration("4m3x"),
            Err(UnitError::UnknownDurationUnit {
                text: "4m3x".into(),
                unit: "x".into()
            })
        );
        for text in [
            "18446744073709551616",
            "18446744073709551615m",
            "18446744073709551615s 1s",
        ] {
            assert_eq!(
                parse_duration(text),
                Err(UnitError::DurationOverflow { text: text.into() }),
                "{text}"
            );
        }
        assert_eq!(
            parse_duration("5x").unwrap_err().to_string(),
            "invalid duration \"5x\": unknown unit \"x\" (use ns, us, ms, s, m or h)"
        );
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(bytes in any::<u64>(), shift in 0u32..40) {
            let b = bytes >> shift << (shift % 31);
            prop_assert_eq!(parse_size_bytes(&format_size(b)), Ok(b));
        }

        #[test]
        fn size_list_is_sorted_unique_and_bounded(
            start in 1u64..1_000_000, span in 0u64..1_000_000_000, factor in 2u64..10
        ) {
            let end = start + span;
            let list = parse_size_list(&format!("{start}..{end}:x{factor}")).unwrap();
            prop_assert_eq!(list[0], start);
            prop_assert_eq!(*list.last().unwrap(), end);
            prop_assert!(list.windows(2).all(|w| w[0] < w[1]));
        }

        #[test]
        fn parsers_never_panic(s in "\\PC{0,12}") {
            let _ = parse_size_bytes(&s);
            let _ = parse_size_list(&s);
            let _ = parse_duration(&s);
        }
    }
}
