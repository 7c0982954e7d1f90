//! voodu's cron schedule grammar (spec §7.10), checked at parse time so a bad schedule rejects
//! the commit instead of failing on the host.
//!
//! Five fields `min hour dom month dow` (0-59, 0-23, 1-31, 1-12, 0-7 with 7 = Sunday); each a
//! comma list of `*`, `n`, `a-b`, with `/step` on `*` or a range (`n/step` means just `n`);
//! day-of-week names `sun`..`sat` in any case; the macros `@yearly @annually @monthly
//! @weekly @daily @midnight @hourly`. No seconds, no `@every`, no `@reboot`, no month names.
//!
//! `Schedule` evaluates a checked expression in an IANA time zone with croner (classic cron
//! semantics: when both day fields are restricted, either may match). The voodu form is
//! normalised first, because croner reads `n/step` as "from n every step" where voodu means
//! just `n`.
//!
//! Time zones come from the host's time zone database (`/usr/share/zoneinfo`, or `TZDIR`),
//! read through jiff, as voodu's Go `time.LoadLocation` reads it: the rules the host's tzdata
//! package keeps current, not a copy frozen into the binary. A name is looked up as written
//! (`europe/lisbon` is refused, as on voodu's case-sensitive file systems).

/// The macros voodu accepts and the five-field expressions they stand for.
pub(crate) const MACROS: &[(&str, &str)] = &[
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

const DAY_NAMES: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// Why a `schedule` or `timezone` is refused. Display is the reason alone; the manifest stage
/// reports it at the field's `path:line:col`.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("unknown macro; voodu accepts {}", macro_names())]
    UnknownMacro,
    #[error("needs 5 fields (minute hour day-of-month month day-of-week), got {0}")]
    FieldCount(usize),
    #[error("{what} field {field:?}: {problem}")]
    Field {
        what: &'static str,
        field: String,
        problem: FieldProblem,
    },
    /// The normal form is one croner cannot read (a gap between voodu's grammar and its).
    #[error("cannot evaluate {normalized:?}: {error}")]
    Evaluate {
        normalized: String,
        error: croner::errors::CronError,
    },
    #[error(
        "{0:?} is not an IANA time zone name such as \"Europe/Lisbon\" or \"America/New_York\" in this host's time zone database"
    )]
    TimeZone(String),
    #[error(
        "{0:?} cannot be looked up: this host has no time zone database (install the tzdata package, or set TZDIR to one)"
    )]
    NoTimeZoneDatabase(String),
}

/// What is wrong with one of the five fields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldProblem {
    #[error("step {0:?} must be a positive number")]
    Step(String),
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("{value} is outside {low}-{high}")]
    OutOfRange { value: u32, low: u32, high: u32 },
    #[error("range {start}-{end} runs backwards")]
    Backwards { start: u32, end: u32 },
}

/// For callers whose own errors are still text (the reconciler's cron handler and tests).
impl From<ScheduleError> for String {
    fn from(error: ScheduleError) -> String {
        error.to_string()
    }
}

fn macro_names() -> String {
    MACROS
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The five-field form of `expression` (macros expanded, day names turned into numbers), or
/// why voodu would refuse it.
pub(crate) fn normalize_schedule(expression: &str) -> Result<String, ScheduleError> {
    let expression = expression.trim();
    if expression.starts_with('@') {
        return MACROS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(expression))
            .map(|(_, fields)| (*fields).to_owned())
            .ok_or(ScheduleError::UnknownMacro);
    }
    let fields: Vec<&str> = expression.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(ScheduleError::FieldCount(fields.len()));
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
        check_field(field, *low, *high).map_err(|problem| ScheduleError::Field {
            what,
            field: field.to_owned(),
            problem,
        })?;
        // voodu: a single number with a step means only that number.
        let items: Vec<&str> = field
            .split(',')
            .map(|item| match item.split_once('/') {
                Some((start, _)) if start.parse::<u32>().is_ok() => start,
                _ => item,
            })
            .collect();
        normalized.push(items.join(","));
    }
    Ok(normalized.join(" "))
}

/// A checked schedule in a time zone.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    cron: croner::Cron,
    zone: jiff::tz::TimeZone,
}

impl Schedule {
    /// Parses voodu's `schedule` and `timezone` (IANA name; empty means UTC).
    pub(crate) fn parse(expression: &str, timezone: &str) -> Result<Schedule, ScheduleError> {
        let normalized = normalize_schedule(expression)?;
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Disallowed)
            .build()
            .parse(&normalized)
            .map_err(|error| ScheduleError::Evaluate {
                normalized: normalized.clone(),
                error,
            })?;
        Ok(Schedule {
            cron,
            zone: parse_timezone(timezone)?,
        })
    }

    /// The first scheduled minute strictly after `after`.
    pub(crate) fn next_after(
        &self,
        after: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let local = zoned(after, &self.zone)?;
        let next = self.cron.find_next_occurrence(&local, false).ok()?;
        utc(&next)
    }

    /// The last scheduled minute at or before `at`.
    pub(crate) fn last_at_or_before(
        &self,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let local = zoned(at, &self.zone)?;
        let previous = self.cron.find_previous_occurrence(&local, true).ok()?;
        utc(&previous)
    }

    /// `at` as RFC 3339 with the offset the schedule's zone has then
    /// (`2026-07-10T09:00:00+01:00`).
    pub(crate) fn local_rfc3339(&self, at: chrono::DateTime<chrono::Utc>) -> Option<String> {
        let local = zoned(at, &self.zone)?;
        let offset = chrono::FixedOffset::east_opt(local.offset().seconds())?;
        Some(at.with_timezone(&offset).to_rfc3339())
    }
}

fn zoned(at: chrono::DateTime<chrono::Utc>, zone: &jiff::tz::TimeZone) -> Option<jiff::Zoned> {
    let instant = jiff::Timestamp::new(
        at.timestamp(),
        i32::try_from(at.timestamp_subsec_nanos()).ok()?,
    )
    .ok()?;
    Some(instant.to_zoned(zone.clone()))
}

fn utc(at: &jiff::Zoned) -> Option<chrono::DateTime<chrono::Utc>> {
    let instant = at.timestamp();
    chrono::DateTime::from_timestamp(
        instant.as_second(),
        u32::try_from(instant.subsec_nanosecond()).ok()?,
    )
}

/// An IANA time zone name (`Europe/Lisbon`); empty and `UTC` mean UTC. Anything else is
/// looked up in the host's database, exactly as written; a name is only ever a key of that
/// database, never a path of its own (`..`, a leading `/` and other characters are refused
/// before the lookup).
pub(crate) fn parse_timezone(timezone: &str) -> Result<jiff::tz::TimeZone, ScheduleError> {
    if timezone.is_empty() || timezone == "UTC" {
        return Ok(jiff::tz::TimeZone::UTC);
    }
    let name_like = timezone.len() <= 64
        && timezone.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_+-.".contains(&b))
        });
    if !name_like {
        return Err(ScheduleError::TimeZone(timezone.to_owned()));
    }
    lookup(jiff::tz::db(), timezone)
}

fn lookup(
    database: &jiff::tz::TimeZoneDatabase,
    timezone: &str,
) -> Result<jiff::tz::TimeZone, ScheduleError> {
    match database.get(timezone) {
        Ok(zone) if zone.iana_name() == Some(timezone) => Ok(zone),
        _ if database.is_definitively_empty() => {
            Err(ScheduleError::NoTimeZoneDatabase(timezone.to_owned()))
        }
        _ => Err(ScheduleError::TimeZone(timezone.to_owned())),
    }
}

/// Checks a schedule without keeping its normal form.
pub(crate) fn check_schedule(expression: &str) -> Result<(), ScheduleError> {
    normalize_schedule(expression).map(|_| ())
}

fn check_field(field: &str, low: u32, high: u32) -> Result<(), FieldProblem> {
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        if let Some(step) = step {
            match step.parse::<u32>() {
                Ok(step) if step > 0 => {}
                _ => return Err(FieldProblem::Step(step.to_owned())),
            }
        }
        if range == "*" {
            continue;
        }
        let (start, end) = match range.split_once('-') {
            Some((start, end)) => (start, Some(end)),
            None => (range, None),
        };
        let parse = |text: &str| -> Result<u32, FieldProblem> {
            let value = text
                .parse::<u32>()
                .map_err(|_| FieldProblem::NotANumber(text.to_owned()))?;
            if value < low || value > high {
                return Err(FieldProblem::OutOfRange { value, low, high });
            }
            Ok(value)
        };
        let start = parse(start)?;
        if let Some(end) = end {
            let end = parse(end)?;
            if end < start {
                return Err(FieldProblem::Backwards { start, end });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn at(text: &str) -> chrono::DateTime<Utc> {
        chrono::DateTime::parse_from_rfc3339(text)
            .expect("a valid instant")
            .with_timezone(&Utc)
    }

    #[test]
    fn next_and_previous_fire_times_follow_the_zone() -> Result<(), ScheduleError> {
        let every_5 = Schedule::parse("*/5 * * * *", "")?;
        assert_eq!(
            every_5.next_after(at("2026-01-01T10:02:30Z")),
            Some(at("2026-01-01T10:05:00Z"))
        );
        assert_eq!(
            every_5.next_after(at("2026-01-01T10:05:00Z")),
            Some(at("2026-01-01T10:10:00Z")),
            "strictly after"
        );
        assert_eq!(
            every_5.last_at_or_before(at("2026-01-01T10:05:00Z")),
            Some(at("2026-01-01T10:05:00Z"))
        );
        // 09:00 in Lisbon is 09:00 UTC in winter and 08:00 UTC in summer.
        let lisbon = Schedule::parse("0 9 * * *", "Europe/Lisbon")?;
        assert_eq!(
            lisbon.next_after(at("2026-01-10T12:00:00Z")),
            Some(at("2026-01-11T09:00:00Z"))
        );
        assert_eq!(
            lisbon.next_after(at("2026-07-10T12:00:00Z")),
            Some(at("2026-07-11T08:00:00Z"))
        );
        // voodu's `5/15` is minute 5 only.
        let five = Schedule::parse("5/15 * * * *", "")?;
        assert_eq!(
            five.next_after(at("2026-01-01T10:06:00Z")),
            Some(at("2026-01-01T11:05:00Z"))
        );
        // Day of month or day of week (classic cron): the 13th, or any Friday.
        let either = Schedule::parse("0 0 13 * fri", "")?;
        assert_eq!(
            either.next_after(at("2026-02-01T00:00:00Z")),
            Some(at("2026-02-06T00:00:00Z")),
            "Friday the 6th"
        );
        assert_eq!(
            either.next_after(at("2026-02-10T00:00:00Z")),
            Some(at("2026-02-13T00:00:00Z"))
        );
        assert_eq!(
            Utc.timestamp_opt(0, 0).single().map(|t| t.timestamp()),
            Some(0)
        );
        assert!(Schedule::parse("* * * * *", "Mars/Olympus").is_err());
        Ok(())
    }

    #[test]
    fn a_time_zone_is_a_name_in_the_host_database_as_written() {
        for name in ["", "UTC", "Europe/Lisbon", "America/New_York", "Etc/GMT+5"] {
            assert!(parse_timezone(name).is_ok(), "{name:?}");
        }
        for name in [
            "europe/lisbon",
            "Mars/Olympus",
            "Local",
            "../../../../etc/passwd",
            "/usr/share/zoneinfo/Europe/Lisbon",
            "Europe/../Europe/Lisbon",
            "Europe//Lisbon",
            "Europe/Lisbon/",
            "Europe/Lisbon\0",
            &"A/".repeat(40),
        ] {
            assert!(
                matches!(parse_timezone(name), Err(ScheduleError::TimeZone(ref refused)) if refused == name),
                "{name:?}"
            );
        }
        let none = jiff::tz::TimeZoneDatabase::none();
        let error = lookup(&none, "Europe/Lisbon").map(|_| ());
        assert!(
            matches!(error, Err(ScheduleError::NoTimeZoneDatabase(_))),
            "{error:?}"
        );
        assert!(
            error
                .map_err(|error| error.to_string())
                .is_err_and(|text| text.contains("install the tzdata package")),
        );
    }

    #[test]
    fn a_local_time_carries_the_zone_s_offset_then() -> Result<(), ScheduleError> {
        let lisbon = Schedule::parse("0 9 * * *", "Europe/Lisbon")?;
        assert_eq!(
            lisbon.local_rfc3339(at("2026-07-10T08:00:00Z")).as_deref(),
            Some("2026-07-10T09:00:00+01:00")
        );
        assert_eq!(
            lisbon.local_rfc3339(at("2026-01-10T09:00:00Z")).as_deref(),
            Some("2026-01-10T09:00:00+00:00")
        );
        let utc = Schedule::parse("0 9 * * *", "")?;
        assert_eq!(
            utc.local_rfc3339(at("2026-01-10T09:00:00Z")).as_deref(),
            Some("2026-01-10T09:00:00+00:00")
        );
        Ok(())
    }

    #[test]
    fn accepts_voodus_grammar() -> Result<(), ScheduleError> {
        for (input, expected) in [
            ("*/5 * * * *", "*/5 * * * *"),
            ("0 9-17 * * mon-fri", "0 9-17 * * 1-5"),
            ("0 0 1,15 * SUN", "0 0 1,15 * 0"),
            ("5/15 0 * * 7", "5 0 * * 7"),
            ("*/15,3/2 1-5/2 * * *", "*/15,3 1-5/2 * * *"),
            ("@Daily", "0 0 * * *"),
        ] {
            assert_eq!(normalize_schedule(input)?, expected, "{input}");
        }
        Ok(())
    }

    #[test]
    fn refuses_what_voodu_refuses_and_says_which_field() {
        use FieldProblem::{Backwards, NotANumber, OutOfRange, Step};
        let field = |what: &'static str, problem: FieldProblem| Some((what, problem));
        for (bad, expected) in [
            ("* * * *", None),
            ("0 * * * * *", None),
            (
                "60 * * * *",
                field(
                    "minute",
                    OutOfRange {
                        value: 60,
                        low: 0,
                        high: 59,
                    },
                ),
            ),
            (
                "* 24 * * *",
                field(
                    "hour",
                    OutOfRange {
                        value: 24,
                        low: 0,
                        high: 23,
                    },
                ),
            ),
            (
                "* * 0 * *",
                field(
                    "day-of-month",
                    OutOfRange {
                        value: 0,
                        low: 1,
                        high: 31,
                    },
                ),
            ),
            ("* * * jan *", field("month", NotANumber("jan".to_owned()))),
            (
                "* * * * 8",
                field(
                    "day-of-week",
                    OutOfRange {
                        value: 8,
                        low: 0,
                        high: 7,
                    },
                ),
            ),
            ("*/0 * * * *", field("minute", Step("0".to_owned()))),
            (
                "5-1 * * * *",
                field("minute", Backwards { start: 5, end: 1 }),
            ),
            ("@every 5m", None),
            ("@reboot", None),
        ] {
            let error = normalize_schedule(bad).expect_err(bad);
            match (&error, expected) {
                (ScheduleError::Field { what, problem, .. }, Some(expected)) => {
                    assert_eq!((*what, problem.clone()), expected, "{bad:?}");
                }
                (ScheduleError::FieldCount(_) | ScheduleError::UnknownMacro, None) => {}
                _ => panic!("{bad:?}: unexpected {error:?}"),
            }
        }
        for (bad, message) in [
            (
                "* * * *",
                "needs 5 fields (minute hour day-of-month month day-of-week), got 4",
            ),
            (
                "* * * jan *",
                "month field \"jan\": \"jan\" is not a number",
            ),
            (
                "@reboot",
                "unknown macro; voodu accepts @yearly @annually @monthly @weekly @daily @midnight @hourly",
            ),
        ] {
            let error = normalize_schedule(bad).expect_err(bad);
            assert_eq!(error.to_string(), message, "{bad:?}");
        }
    }
}
