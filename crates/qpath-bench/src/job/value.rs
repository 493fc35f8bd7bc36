//! Parsers for fio option values: sizes, times, booleans, CPU lists, block sizes.
//!
//! These follow fio 3.33's `parse.c` (`str_to_decimal`, `get_mult_bytes`,
//! `get_mult_time`), including its quirk that with the default `kb_base=1024`
//! the IEC suffixes are read "the other way round": `4k` and `4KB` are 4096
//! bytes but `4KiB` is 4000 bytes (fio HOWTO, "kb_base"). We keep the quirk so
//! a job file means the same thing to fio and to us.

use std::time::Duration;

/// Largest size we accept anywhere (2^60 B); a guard against overflow.
pub const SIZE_MAX: u64 = 1 << 60;

/// Parse a size with fio's suffix rules: `4k`, `1m`, `2G`, `4KB`, `1MiB`, `0x1000`.
///
/// `kb_base` is 1024 (fio's default) or 1000. `%` sizes are rejected.
pub fn parse_size(text: &str, kb_base: u32) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty size".into());
    }
    if s.ends_with('%') {
        return Err(format!("'{s}': percentage sizes are not supported"));
    }
    let (num, suffix) = split_number(s).ok_or_else(|| format!("'{s}' is not a size"))?;
    let mult = size_multiplier(suffix, kb_base).ok_or_else(|| format!("'{s}': unknown size suffix '{suffix}'"))?;
    let v = num.checked_mul(mult).filter(|v| *v <= SIZE_MAX).ok_or_else(|| format!("'{s}' is too large"))?;
    Ok(v)
}

/// Split `0x10k` / `4096` / `16MiB` into the integer and the suffix.
fn split_number(s: &str) -> Option<(u64, &str)> {
    let (digits, radix, rest_start) = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        let end = hex.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(hex.len());
        (&hex[..end], 16, 2 + end)
    } else {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        (&s[..end], 10, end)
    };
    if digits.is_empty() {
        return None;
    }
    let n = u64::from_str_radix(digits, radix).ok()?;
    Some((n, s[rest_start..].trim()))
}

fn size_multiplier(suffix: &str, kb_base: u32) -> Option<u64> {
    let base = u64::from(kb_base);
    // fio: with kb_base=1024 the "iB" forms use 1000, with kb_base=1000 they use 1024.
    let other = if kb_base == 1000 { 1024 } else { 1000 };
    let lower = suffix.to_ascii_lowercase();
    let (pow, mult) = match lower.as_str() {
        "" | "b" => return Some(1),
        "kib" => (1, other),
        "mib" => (2, other),
        "gib" => (3, other),
        "tib" => (4, other),
        "pib" => (5, other),
        "k" | "kb" => (1, base),
        "m" | "mb" => (2, base),
        "g" | "gb" => (3, base),
        "t" | "tb" => (4, base),
        "p" | "pb" => (5, base),
        _ => return None,
    };
    Some(mult.pow(pow))
}

/// Parse a time: `10` (in `default_unit`), `500ms`, `250us`, `2s`, `1m`, `1h`, `1d`.
pub fn parse_time(text: &str, default_unit: Duration) -> Result<Duration, String> {
    let s = text.trim();
    let (num, suffix) = split_number(s).ok_or_else(|| format!("'{s}' is not a time"))?;
    let unit = match suffix.to_ascii_lowercase().as_str() {
        "" => default_unit,
        "us" | "usec" => Duration::from_micros(1),
        "ms" | "msec" => Duration::from_millis(1),
        "s" | "sec" => Duration::from_secs(1),
        "m" | "min" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        "d" => Duration::from_secs(86400),
        other => return Err(format!("'{s}': unknown time unit '{other}'")),
    };
    let n = u32::try_from(num).map_err(|_| format!("'{s}' is too large"))?;
    unit.checked_mul(n).ok_or_else(|| format!("'{s}' is too large"))
}

/// Parse a fio boolean: a bare flag (None) is true; otherwise an integer, non-zero is true.
/// `true`/`false`/`yes`/`no`/`on`/`off` are accepted too.
pub fn parse_bool(value: Option<&str>) -> Result<bool, String> {
    let Some(v) = value else { return Ok(true) };
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "true" | "yes" | "on" => Ok(true),
        "false" | "no" | "off" => Ok(false),
        other => other.parse::<i64>().map(|n| n != 0).map_err(|_| format!("'{v}' is not a boolean")),
    }
}

/// Parse an unsigned integer (decimal or `0x` hex, fio size suffixes allowed as fio does
/// for integer options such as `iodepth=1k`).
pub fn parse_uint(text: &str, max: u64) -> Result<u64, String> {
    let v = parse_size(text, 1024)?;
    if v > max {
        return Err(format!("'{}' is larger than the limit {max}", text.trim()));
    }
    Ok(v)
}

/// A set of CPUs from `cpus_allowed=0-3,5`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuSet {
    /// Sorted, deduplicated CPU numbers.
    pub cpus: Vec<usize>,
}

/// Highest CPU number accepted in a CPU list.
pub const CPU_MAX: usize = 4095;

impl CpuSet {
    /// Parse `0-3,5,7-8` (fio `cpus_allowed`).
    pub fn parse(text: &str) -> Result<CpuSet, String> {
        let mut cpus = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (parse_cpu(a)?, parse_cpu(b)?),
                None => {
                    let c = parse_cpu(part)?;
                    (c, c)
                }
            };
            if lo > hi {
                return Err(format!("cpu range '{part}' is reversed"));
            }
            cpus.extend(lo..=hi);
        }
        if cpus.is_empty() {
            return Err(format!("'{text}' names no CPUs"));
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuSet { cpus })
    }
}

fn parse_cpu(s: &str) -> Result<usize, String> {
    let c: usize = s.trim().parse().map_err(|_| format!("'{s}' is not a CPU number"))?;
    if c > CPU_MAX {
        return Err(format!("CPU {c} is above the limit {CPU_MAX}"));
    }
    Ok(c)
}

/// Split a fio per-direction list `read,write,trim`: `4k` applies to all, `4k,8k` sets
/// read and write, an empty element keeps the previous value.
pub fn split_per_ddir(text: &str) -> [Option<&str>; 2] {
    let mut parts = text.split(',').map(str::trim);
    let r = parts.next().filter(|s| !s.is_empty());
    match parts.next() {
        None => [r, r],
        Some(w) => [r, Some(w).filter(|s| !s.is_empty())],
    }
}

/// Parse a block size range `4k-16k` (or `4k:16k`); a single value means min = max.
pub fn parse_range(text: &str, kb_base: u32) -> Result<(u64, u64), String> {
    let t = text.trim();
    let (a, b) = match t.split_once(['-', ':']) {
        Some((a, b)) => (a, b),
        None => (t, t),
    };
    let lo = parse_size(a, kb_base)?;
    let hi = parse_size(b, kb_base)?;
    if lo > hi {
        return Err(format!("range '{t}' is reversed"));
    }
    Ok((lo, hi))
}

/// Parse fio's `percentile_list` (`99:99.9:99.99`), returning the values sorted and the
/// number of decimals to print (fio's `percentile_precision`: the most decimals used).
pub fn parse_percentiles(text: &str) -> Result<(Vec<f64>, usize), String> {
    const LIST_MAX: usize = 20; // fio's FIO_IO_U_LIST_MAX_LEN
    let mut list = Vec::new();
    let mut precision = 0;
    for p in text.split(':').map(str::trim).filter(|p| !p.is_empty()) {
        let v: f64 = p.parse().map_err(|_| format!("'{p}' is not a percentile"))?;
        if !(0.0..=100.0).contains(&v) || v == 0.0 {
            return Err(format!("percentile {p} is outside (0, 100]"));
        }
        if let Some((_, frac)) = p.split_once('.') {
            precision = precision.max(frac.chars().take_while(char::is_ascii_digit).count());
        }
        list.push(v);
    }
    if list.is_empty() || list.len() > LIST_MAX {
        return Err(format!("percentile_list needs 1 to {LIST_MAX} values"));
    }
    list.sort_by(f64::total_cmp);
    Ok((list, precision))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_fio_kb_base_rules() {
        assert_eq!(parse_size("4k", 1024), Ok(4096));
        assert_eq!(parse_size("4K", 1024), Ok(4096));
        assert_eq!(parse_size("4KB", 1024), Ok(4096));
        assert_eq!(parse_size("4KiB", 1024), Ok(4000));
        assert_eq!(parse_size("4KiB", 1000), Ok(4096));
        assert_eq!(parse_size("4k", 1000), Ok(4000));
        assert_eq!(parse_size("512m", 1024), Ok(512 << 20));
        assert_eq!(parse_size("10G", 1024), Ok(10 << 30));
        assert_eq!(parse_size("1t", 1024), Ok(1 << 40));
        assert_eq!(parse_size("0x1000", 1024), Ok(4096));
        assert_eq!(parse_size("4096", 1024), Ok(4096));
        assert!(parse_size("10%", 1024).unwrap_err().contains("percentage"));
        assert!(parse_size("4q", 1024).is_err());
        assert!(parse_size("", 1024).is_err());
        assert!(parse_size("99999999999p", 1024).is_err());
    }

    #[test]
    fn times_default_to_the_given_unit() {
        let s = Duration::from_secs(1);
        assert_eq!(parse_time("15", s), Ok(Duration::from_secs(15)));
        assert_eq!(parse_time("500ms", s), Ok(Duration::from_millis(500)));
        assert_eq!(parse_time("250us", s), Ok(Duration::from_micros(250)));
        assert_eq!(parse_time("2m", s), Ok(Duration::from_secs(120)));
        assert_eq!(parse_time("1h", s), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_time("3s", s), Ok(Duration::from_secs(3)));
        assert!(parse_time("3x", s).is_err());
    }

    #[test]
    fn cpu_lists_and_ranges() {
        assert_eq!(CpuSet::parse("0-3,5").unwrap().cpus, vec![0, 1, 2, 3, 5]);
        assert_eq!(CpuSet::parse("1").unwrap().cpus, vec![1]);
        assert_eq!(CpuSet::parse("3,1,1").unwrap().cpus, vec![1, 3]);
        assert!(CpuSet::parse("3-1").is_err());
        assert!(CpuSet::parse("x").is_err());
        assert!(CpuSet::parse("99999").is_err());
    }

    #[test]
    fn bools_and_per_ddir_lists() {
        assert_eq!(parse_bool(None), Ok(true));
        assert_eq!(parse_bool(Some("0")), Ok(false));
        assert_eq!(parse_bool(Some("1")), Ok(true));
        assert!(parse_bool(Some("maybe")).is_err());
        assert_eq!(split_per_ddir("4k"), [Some("4k"), Some("4k")]);
        assert_eq!(split_per_ddir("4k,8k"), [Some("4k"), Some("8k")]);
        assert_eq!(split_per_ddir(",8k"), [None, Some("8k")]);
        assert_eq!(parse_range("4k-16k", 1024), Ok((4096, 16384)));
        assert_eq!(parse_range("4k", 1024), Ok((4096, 4096)));
        assert!(parse_range("16k-4k", 1024).is_err());
    }

    #[test]
    fn percentile_lists_carry_their_precision() {
        let (l, p) = parse_percentiles("99.99:50:99.9").unwrap();
        assert_eq!(l, vec![50.0, 99.9, 99.99]);
        assert_eq!(p, 2);
        assert!(parse_percentiles("101").is_err());
    }
}
