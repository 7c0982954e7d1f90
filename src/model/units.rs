//! Units manifests write: Go durations (`"1m30s"`), CPU amounts (`"1.5"`, `"500m"`), memory
//! sizes (`"512Mi"`, `"1G"`) and Docker CLI byte sizes (`"2g"` in `--shm-size=2g`).

/// Parses a Go duration (`"300ms"`, `"1.5h"`, `"2h45m"`, `"0"`), as voodu's manifests write
/// them. Negative durations are refused.
pub(crate) fn parse_go_duration(text: &str) -> Option<std::time::Duration> {
    let text = text.strip_prefix('+').unwrap_or(text);
    if text == "0" {
        return Some(std::time::Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * seconds;
        rest = tail;
    }
    std::time::Duration::try_from_secs_f64(total).ok()
}

/// A CPU limit as voodu writes it: a decimal number of cores (`"1.5"`) or millicores
/// (`"500m"`), in nano-CPUs (Docker's unit: 10⁹ per core).
pub(crate) fn parse_cpus(text: &str) -> Option<i64> {
    if let Some(milli) = text.strip_suffix('m') {
        if milli.is_empty() || !milli.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        return milli
            .parse::<i64>()
            .ok()?
            .checked_mul(1_000_000)
            .filter(|n| *n > 0);
    }
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (text, ""),
    };
    let digits = |part: &str| part.chars().all(|c| c.is_ascii_digit());
    if whole.is_empty()
        || !digits(whole)
        || !digits(fraction)
        || (text.contains('.') && fraction.is_empty())
    {
        return None;
    }
    let cores: f64 = text.parse().ok()?;
    let nanos = (cores * 1e9).round();
    (1.0..9.0e18).contains(&nanos).then_some(nanos as i64)
}

/// A memory size as voodu writes it: plain bytes, `Ki Mi Gi Ti` (1024-based) or `K M G T`
/// (1000-based); lower-case `m`/`g` are refused, as in voodu.
pub(crate) fn parse_memory(text: &str) -> Option<i64> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits == 0 {
        return None;
    }
    let number: i64 = text[..digits].parse().ok()?;
    let factor: i64 = match &text[digits..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    number.checked_mul(factor)
}

/// A Docker CLI size (`--shm-size=2g`): a number with an optional `b`, `k`, `m` or `g`
/// (1024-based, any case).
pub(crate) fn parse_docker_size(text: &str) -> Option<i64> {
    let lower = text.to_ascii_lowercase();
    let digits = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    if digits == 0 {
        return None;
    }
    let number: i64 = lower[..digits].parse().ok()?;
    let factor: i64 = match &lower[digits..] {
        "" | "b" => 1,
        "k" | "kb" => 1 << 10,
        "m" | "mb" => 1 << 20,
        "g" | "gb" => 1 << 30,
        _ => return None,
    };
    number.checked_mul(factor)
}

/// A ulimit value as `docker run --ulimit name=VALUE` takes it: `soft:hard` or one number
/// for both; `-1` (or `unlimited`) means unlimited. Returns `(soft, hard)`.
pub(crate) fn parse_ulimit(text: &str) -> Option<(i64, i64)> {
    let number = |part: &str| -> Option<i64> {
        match part.trim() {
            "unlimited" | "-1" => Some(-1),
            other => other.parse::<i64>().ok().filter(|n| *n >= 0),
        }
    };
    let (soft, hard) = match text.split_once(':') {
        Some((soft, hard)) => (number(soft)?, number(hard)?),
        None => {
            let both = number(text)?;
            (both, both)
        }
    };
    let unlimited = |n: i64| if n < 0 { i64::MAX } else { n };
    (unlimited(soft) <= unlimited(hard)).then_some((soft, hard))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn go_durations_parse_like_time_parse_duration() {
        for (text, expected) in [
            ("0", Duration::ZERO),
            ("30s", Duration::from_secs(30)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("300ms", Duration::from_millis(300)),
            ("2h45m", Duration::from_secs(9900)),
            ("10us", Duration::from_micros(10)),
        ] {
            assert_eq!(parse_go_duration(text), Some(expected), "{text}");
        }
        for bad in ["", "10", "s", "1x", "-1s", "1..2s", "5 m"] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?} must be refused");
        }
    }

    #[test]
    fn resource_units_parse_like_voodu() {
        assert_eq!(parse_cpus("1.5"), Some(1_500_000_000));
        assert_eq!(parse_cpus("500m"), Some(500_000_000));
        assert_eq!(parse_cpus("2"), Some(2_000_000_000));
        for bad in ["", "two", "1.", ".5", "-1", "0", "5mm", "m"] {
            assert_eq!(parse_cpus(bad), None, "{bad:?}");
        }
        assert_eq!(parse_memory("512Mi"), Some(512 << 20));
        assert_eq!(parse_memory("1G"), Some(1_000_000_000));
        assert_eq!(parse_memory("4096"), Some(4096));
        for bad in ["1gb", "1m", "Mi", "-1", "1.5Gi"] {
            assert_eq!(parse_memory(bad), None, "{bad:?}");
        }
        assert_eq!(parse_docker_size("2g"), Some(2 << 30));
        assert_eq!(parse_docker_size("64M"), Some(64 << 20));
        assert_eq!(parse_docker_size("100"), Some(100));
        assert_eq!(parse_docker_size("1x"), None);
    }

    #[test]
    fn ulimits_parse_like_docker_run() {
        assert_eq!(
            parse_ulimit("1048576:1048576"),
            Some((1_048_576, 1_048_576))
        );
        assert_eq!(parse_ulimit("4096"), Some((4096, 4096)));
        assert_eq!(parse_ulimit("-1"), Some((-1, -1)));
        assert_eq!(parse_ulimit("1024:unlimited"), Some((1024, -1)));
        for bad in ["", "x", "2:1", "1:2:3", "-5"] {
            assert_eq!(parse_ulimit(bad), None, "{bad:?}");
        }
    }
}
