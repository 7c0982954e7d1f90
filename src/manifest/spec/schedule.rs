//! voodu's cron schedule grammar (spec §7.10), checked at parse time so a bad schedule rejects
//! the commit instead of failing on the host.
//!
//! Five fields `min hour dom month dow` (0-59, 0-23, 1-31, 1-12, 0-7 with 7 = Sunday); each a
//! comma list of `*`, `n`, `a-b`, with `/step` on `*` or a range (`n/step` means just `n`);
//! day-of-week names `sun`..`sat` in any case; the macros `@yearly @annually @monthly
//! @weekly @daily @midnight @hourly`. No seconds, no `@every`, no `@reboot`, no month names.

/// The macros voodu accepts and the five-field expressions they stand for.
pub const MACROS: &[(&str, &str)] = &[
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

const DAY_NAMES: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// The five-field form of `expression` (macros expanded, day names turned into numbers), or
/// why voodu would refuse it.
pub fn normalize_schedule(expression: &str) -> Result<String, String> {
    let expression = expression.trim();
    if expression.starts_with('@') {
        return MACROS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(expression))
            .map(|(_, fields)| (*fields).to_owned())
            .ok_or_else(|| {
                format!(
                    "unknown macro; voodu accepts {}",
                    MACROS
                        .iter()
                        .map(|(name, _)| *name)
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            });
    }
    let fields: Vec<&str> = expression.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "needs 5 fields (minute hour day-of-month month day-of-week), got {}",
            fields.len()
        ));
    }
    let mut dow = fields[4].to_ascii_lowercase();
    for (number, name) in DAY_NAMES.iter().enumerate() {
        dow = dow.replace(name, &number.to_string());
    }
    let limits = [
        ("minute", 0, 59),
        ("hour", 0, 23),
        ("day-of-month", 1, 31),
        ("month", 1, 12),
        ("day-of-week", 0, 7),
    ];
    let mut normalized = Vec::with_capacity(5);
    for (index, ((what, low, high), field)) in limits.iter().zip(fields.iter()).enumerate() {
        let field = if index == 4 { dow.as_str() } else { field };
        check_field(field, *low, *high)
            .map_err(|problem| format!("{what} field {field:?}: {problem}"))?;
        normalized.push(field.to_owned());
    }
    Ok(normalized.join(" "))
}

/// Checks a schedule without keeping its normal form.
pub fn check_schedule(expression: &str) -> Result<(), String> {
    normalize_schedule(expression).map(|_| ())
}

fn check_field(field: &str, low: u32, high: u32) -> Result<(), String> {
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        if let Some(step) = step {
            match step.parse::<u32>() {
                Ok(step) if step > 0 => {}
                _ => return Err(format!("step {step:?} must be a positive number")),
            }
        }
        if range == "*" {
            continue;
        }
        let (start, end) = match range.split_once('-') {
            Some((start, end)) => (start, Some(end)),
            None => (range, None),
        };
        let parse = |text: &str| -> Result<u32, String> {
            let value = text
                .parse::<u32>()
                .map_err(|_| format!("{text:?} is not a number"))?;
            if value < low || value > high {
                return Err(format!("{value} is outside {low}-{high}"));
            }
            Ok(value)
        };
        let start = parse(start)?;
        if let Some(end) = end {
            let end = parse(end)?;
            if end < start {
                return Err(format!("range {start}-{end} runs backwards"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_voodus_grammar() {
        for (input, expected) in [
            ("*/5 * * * *", "*/5 * * * *"),
            ("0 9-17 * * mon-fri", "0 9-17 * * 1-5"),
            ("0 0 1,15 * SUN", "0 0 1,15 * 0"),
            ("5/15 0 * * 7", "5/15 0 * * 7"),
            ("@Daily", "0 0 * * *"),
        ] {
            assert_eq!(
                normalize_schedule(input).as_deref(),
                Ok(expected),
                "{input}"
            );
        }
    }

    #[test]
    fn refuses_what_voodu_refuses() {
        for bad in [
            "* * * *",
            "0 * * * * *",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * * jan *",
            "* * * * 8",
            "*/0 * * * *",
            "5-1 * * * *",
            "@every 5m",
            "@reboot",
        ] {
            assert!(normalize_schedule(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
