//! Deploy windows and freezes, pure: given `window` rules, a freeze and the time, may a
//! commit be applied now, and if not, why and when it may next.
//!
//! A rule allows or denies from each time its cron schedule fires (the cronjob grammar and
//! zones, `spec::schedule`) for its duration. With allow rules, a commit applies only inside
//! one of them; a deny rule in force closes even inside an allow window; no rule at all is
//! always open. A freeze in force (no end, or an end still ahead) closes whatever the rules
//! say. Rules are written `KIND SCHEDULE DURATION [TIMEZONE]` on the command line
//! (`allow 0 9 * * 1-5 8h Europe/Berlin`) and as attributes in a sources file or a trigger
//! file (`WindowRule::new` checks them all alike).
//!
//! Invariants: no IO and no clock (the time is an argument); the search for the next opening
//! is bounded ([`MAX_STEPS`] changes of any rule, within [`HORIZON_SECONDS`]): past it, there
//! is no opening to name and the hold waits for an override; at most [`MAX_RULES`] rules per
//! place they are written.

use std::time::Duration;

use super::spec::schedule::Schedule;

/// Most window rules per source, per `--window` list or per trigger file.
pub const MAX_RULES: usize = 32;
/// The longest a window may last.
const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);
/// How far ahead the next opening is looked for.
pub(crate) const HORIZON_SECONDS: i64 = 400 * 24 * 3600;
/// Most rule starts and ends the search for the next opening steps through.
pub(crate) const MAX_STEPS: usize = 20_000;
/// Longest freeze reason kept, in bytes.
pub const MAX_REASON_BYTES: usize = 512;

/// One `window` rule, checked.
#[derive(Debug, Clone)]
pub struct WindowRule {
    /// Its name, as written (`business`), or `--window N` for a flag.
    pub name: String,
    /// Allow (a deploy window) or deny (a blackout).
    pub allow: bool,
    pub(crate) schedule_text: String,
    pub(crate) timezone: String,
    pub(crate) duration: Duration,
    schedule: Schedule,
}

impl PartialEq for WindowRule {
    fn eq(&self, other: &WindowRule) -> bool {
        self.name == other.name
            && self.allow == other.allow
            && self.schedule_text == other.schedule_text
            && self.timezone == other.timezone
            && self.duration == other.duration
    }
}

impl Eq for WindowRule {}

impl WindowRule {
    /// Checks one rule: `kind` is `allow` or `deny`, `schedule` a cron expression (the
    /// cronjob grammar), `timezone` an IANA name (empty: UTC), `duration` a duration (`8h`,
    /// `30m`, 1s to 366 days). The error says what to write.
    pub fn new(
        name: &str,
        kind: &str,
        schedule: &str,
        timezone: &str,
        duration: &str,
    ) -> Result<WindowRule, String> {
        let allow = match kind {
            "allow" => true,
            "deny" => false,
            other => {
                return Err(format!(
                    "window kind {other:?}: write \"allow\" (deploys only inside) or \"deny\" (no deploy inside)"
                ));
            }
        };
        let parsed = Schedule::parse(schedule, timezone)
            .map_err(|error| format!("window schedule {schedule:?}: {error}"))?;
        let length = humantime::parse_duration(duration)
            .ok()
            .filter(|length| !length.is_zero() && *length <= MAX_DURATION)
            .ok_or_else(|| {
                format!("window duration {duration:?}: write a duration from 1s to 366d, e.g. \"8h\" or \"30m\"")
            })?;
        Ok(WindowRule {
            name: name.to_owned(),
            allow,
            schedule_text: schedule.to_owned(),
            timezone: timezone.to_owned(),
            duration: length,
            schedule: parsed,
        })
    }

    /// Parses the flag form `KIND SCHEDULE DURATION [TIMEZONE]`, the schedule being five
    /// cron fields or one `@macro`: `allow 0 9 * * 1-5 8h Europe/Berlin`, `deny @daily 1h`.
    pub fn parse_flag(name: &str, text: &str) -> Result<WindowRule, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let usage = "write KIND SCHEDULE DURATION [TIMEZONE], e.g. 'allow 0 9 * * 1-5 8h Europe/Berlin' or 'deny @daily 1h'";
        let Some((kind, rest)) = words.split_first() else {
            return Err(format!("empty window rule: {usage}"));
        };
        let fields = if rest.first().is_some_and(|word| word.starts_with('@')) {
            1
        } else {
            5
        };
        if rest.len() < fields + 1 || rest.len() > fields + 2 {
            return Err(format!("window rule {text:?}: {usage}"));
        }
        let schedule = rest[..fields].join(" ");
        let duration = rest[fields];
        let timezone = rest.get(fields + 1).copied().unwrap_or("");
        WindowRule::new(name, kind, &schedule, timezone, duration)
            .map_err(|error| format!("window rule {text:?}: {error}"))
    }

    /// The rule as the flag form writes it.
    pub fn describe(&self) -> String {
        let zone = if self.timezone.is_empty() {
            "UTC"
        } else {
            &self.timezone
        };
        format!(
            "{} {} {} {zone}",
            if self.allow { "allow" } else { "deny" },
            self.schedule_text,
            humantime::format_duration(self.duration)
        )
    }

    /// When the occurrence in force at `at` ends, if one is.
    fn in_force_until(&self, at: i64) -> Option<i64> {
        let start = self.schedule.last_at_or_before(utc(at)?)?.timestamp();
        let end = start.saturating_add(i64::try_from(self.duration.as_secs()).ok()?);
        (at < end).then_some(end)
    }

    /// The first start strictly after `at`.
    fn next_start(&self, at: i64) -> Option<i64> {
        Some(self.schedule.next_after(utc(at)?)?.timestamp())
    }
}

fn utc(at: i64) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(at, 0)
}

/// A freeze in force for a source: until when (`None`: until `unfreeze`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freeze {
    pub until: Option<i64>,
    pub reason: String,
}

/// Whether a commit may be applied now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    Open,
    Closed {
        /// The next time it may (Unix seconds), if one is found within the horizon.
        until: Option<i64>,
        /// Why it is closed: the freeze, or which windows.
        why: String,
        /// Closed by a freeze (ended by `unfreeze` too).
        frozen: bool,
    },
}

/// Whether `rules` let a commit apply at `at`.
pub fn is_open(rules: &[WindowRule], at: i64) -> bool {
    let denied = rules
        .iter()
        .any(|rule| !rule.allow && rule.in_force_until(at).is_some());
    let allows: Vec<&WindowRule> = rules.iter().filter(|rule| rule.allow).collect();
    !denied && (allows.is_empty() || allows.iter().any(|rule| rule.in_force_until(at).is_some()))
}

/// The first time at or after `from` when `rules` are open, within the horizon.
pub fn next_open(rules: &[WindowRule], from: i64) -> Option<i64> {
    let horizon = from.saturating_add(HORIZON_SECONDS);
    let mut at = from;
    for _ in 0..MAX_STEPS {
        if is_open(rules, at) {
            return Some(at);
        }
        // Openness changes only where some rule starts or ends.
        let next = rules
            .iter()
            .flat_map(|rule| [rule.next_start(at), rule.in_force_until(at)])
            .flatten()
            .filter(|&change| change > at)
            .min()?;
        if next > horizon {
            return None;
        }
        at = next;
    }
    None
}

/// Why `rules` are closed at `at` (they are): the deny window in force, else the allow
/// windows it is outside of.
fn why_closed(rules: &[WindowRule], at: i64) -> String {
    let named = |rules: Vec<&WindowRule>| {
        rules
            .iter()
            .map(|rule| format!("{:?} ({})", rule.name, rule.describe()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let denying: Vec<&WindowRule> = rules
        .iter()
        .filter(|rule| !rule.allow && rule.in_force_until(at).is_some())
        .collect();
    if denying.is_empty() {
        format!(
            "outside the deploy window {}",
            named(rules.iter().filter(|rule| rule.allow).collect())
        )
    } else {
        format!("inside the deny window {}", named(denying))
    }
}

/// The gate at `now` for each set of `rule_sets` (a source's, each firing trigger's) and
/// `freeze`: open only when no freeze is in force and every set is open. Closed until the
/// latest of their next openings (each set is judged again then).
pub fn gate(rule_sets: &[&[WindowRule]], freeze: Option<&Freeze>, now: i64) -> Gate {
    if let Some(freeze) = freeze.filter(|freeze| freeze.until.is_none_or(|until| now < until)) {
        let until = freeze.until.and_then(|end| {
            rule_sets
                .iter()
                .map(|rules| next_open(rules, end))
                .try_fold(end, |latest, next| next.map(|next| latest.max(next)))
        });
        return Gate::Closed {
            until,
            why: match freeze.until {
                Some(end) => format!("frozen until {}: {}", rfc3339(end), freeze.reason),
                None => format!("frozen until `voodu-agent unfreeze`: {}", freeze.reason),
            },
            frozen: true,
        };
    }
    let closed: Vec<&&[WindowRule]> = rule_sets
        .iter()
        .filter(|rules| !is_open(rules, now))
        .collect();
    if closed.is_empty() {
        return Gate::Open;
    }
    let until = closed
        .iter()
        .map(|rules| next_open(rules, now))
        .try_fold(now, |latest, next| next.map(|next| latest.max(next)));
    Gate::Closed {
        until,
        why: closed
            .iter()
            .map(|rules| why_closed(rules, now))
            .collect::<Vec<_>>()
            .join("; "),
        frozen: false,
    }
}

/// Unix seconds as RFC 3339 in UTC (`2026-07-10T07:00:00Z`), as `status` shows times.
pub fn rfc3339(at: i64) -> String {
    crate::base::rfc3339_seconds(at)
}

/// A freeze's end as `--until` takes it: an RFC 3339 time, or a duration from `now` (`2h`).
pub fn parse_until(text: &str, now: i64) -> Result<i64, String> {
    if let Ok(time) = chrono::DateTime::parse_from_rfc3339(text.trim()) {
        return Ok(time.timestamp());
    }
    let length = humantime::parse_duration(text.trim()).map_err(|_| {
        format!("--until {text:?}: write an RFC 3339 time (2026-12-24T18:00:00+01:00) or a duration (2h, 3d)")
    })?;
    let seconds = i64::try_from(length.as_secs()).unwrap_or(i64::MAX);
    Ok(now.saturating_add(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(text)
            .map(|time| time.timestamp())
            .unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn rule(kind: &str, schedule: &str, duration: &str, zone: &str) -> WindowRule {
        WindowRule::new(kind, kind, schedule, zone, duration)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    #[test]
    fn no_rule_is_always_open() {
        assert!(is_open(&[], at("2026-11-29T03:00:00Z")));
        assert_eq!(gate(&[&[]], None, 5), Gate::Open);
    }

    #[test]
    fn an_allow_window_opens_at_its_start_for_its_duration() {
        // Weekdays 09:00-17:00 UTC; 2026-11-27 is a Friday, 2026-11-28 a Saturday.
        let business = [rule("allow", "0 9 * * 1-5", "8h", "")];
        assert!(!is_open(&business, at("2026-11-27T08:59:59Z")));
        assert!(is_open(&business, at("2026-11-27T09:00:00Z")));
        assert!(is_open(&business, at("2026-11-27T16:59:59Z")));
        assert!(!is_open(&business, at("2026-11-27T17:00:00Z")));
        // Friday evening: next Monday 09:00.
        assert_eq!(
            next_open(&business, at("2026-11-27T18:00:00Z")),
            Some(at("2026-11-30T09:00:00Z"))
        );
        let Gate::Closed { until, why, frozen } =
            gate(&[&business], None, at("2026-11-28T12:00:00Z"))
        else {
            panic!("open on a Saturday");
        };
        assert_eq!(until, Some(at("2026-11-30T09:00:00Z")));
        assert!(!frozen);
        assert!(why.contains("outside the deploy window \"allow\""), "{why}");
    }

    #[test]
    fn a_deny_window_closes_even_inside_an_allow_window() {
        let rules = [
            rule("allow", "0 9 * * 1-5", "8h", ""),
            rule("deny", "0 12 * * *", "30m", ""),
        ];
        assert!(is_open(&rules, at("2026-11-27T11:59:00Z")));
        assert!(!is_open(&rules, at("2026-11-27T12:10:00Z")));
        assert_eq!(
            next_open(&rules, at("2026-11-27T12:10:00Z")),
            Some(at("2026-11-27T12:30:00Z"))
        );
        let Gate::Closed { why, .. } = gate(&[&rules], None, at("2026-11-27T12:10:00Z")) else {
            panic!("open inside the deny window");
        };
        assert!(why.starts_with("inside the deny window \"deny\""), "{why}");
        // Deny rules alone: open outside them.
        let deny = [rule("deny", "0 12 * * *", "30m", "")];
        assert!(is_open(&deny, at("2026-11-27T13:00:00Z")));
    }

    #[test]
    fn windows_follow_their_zone_across_daylight_saving() {
        // 09:00 in Berlin is 08:00 UTC in winter (CET) and 07:00 UTC in summer (CEST).
        let berlin = [rule("allow", "0 9 * * *", "1h", "Europe/Berlin")];
        assert!(is_open(&berlin, at("2026-01-15T08:30:00Z")));
        assert!(!is_open(&berlin, at("2026-01-15T07:30:00Z")));
        assert!(is_open(&berlin, at("2026-07-15T07:30:00Z")));
        assert!(!is_open(&berlin, at("2026-07-15T08:30:00Z")));
        // Across the change of 2026-03-29: the Sunday window opens at 07:00 UTC.
        assert_eq!(
            next_open(&berlin, at("2026-03-28T10:00:00Z")),
            Some(at("2026-03-29T07:00:00Z"))
        );
    }

    #[test]
    fn a_window_that_never_opens_names_no_time() {
        // Allowed only inside a window that a deny window always covers.
        let rules = [
            rule("allow", "0 9 * * *", "1h", ""),
            rule("deny", "0 0 * * *", "24h", ""),
        ];
        assert_eq!(next_open(&rules, at("2026-11-27T12:00:00Z")), None);
        assert!(matches!(
            gate(&[&rules], None, at("2026-11-27T12:00:00Z")),
            Gate::Closed { until: None, .. }
        ));
    }

    #[test]
    fn a_freeze_closes_until_it_ends_and_then_the_windows_decide() {
        let now = at("2026-11-27T10:00:00Z");
        let forever = Freeze {
            until: None,
            reason: "sale".to_owned(),
        };
        assert_eq!(
            gate(&[], Some(&forever), now),
            Gate::Closed {
                until: None,
                why: "frozen until `voodu-agent unfreeze`: sale".to_owned(),
                frozen: true
            }
        );
        let two_hours = Freeze {
            until: Some(at("2026-11-27T12:00:00Z")),
            reason: "sale".to_owned(),
        };
        let business = [rule("allow", "0 13 * * *", "1h", "")];
        let Gate::Closed { until, why, .. } = gate(&[&business], Some(&two_hours), now) else {
            panic!("open while frozen");
        };
        assert_eq!(until, Some(at("2026-11-27T13:00:00Z")));
        assert_eq!(why, "frozen until 2026-11-27T12:00:00Z: sale");
        // Ended: the windows alone decide.
        assert_eq!(
            gate(&[], Some(&two_hours), at("2026-11-27T12:00:00Z")),
            Gate::Open
        );
    }

    #[test]
    fn every_rule_set_must_be_open() {
        let source = [rule("allow", "0 9 * * *", "8h", "")];
        let trigger = [rule("allow", "0 12 * * *", "1h", "")];
        assert_eq!(
            gate(&[&source, &trigger], None, at("2026-11-27T12:30:00Z")),
            Gate::Open
        );
        let Gate::Closed { until, .. } =
            gate(&[&source, &trigger], None, at("2026-11-27T10:00:00Z"))
        else {
            panic!("open outside the trigger's window");
        };
        assert_eq!(until, Some(at("2026-11-27T12:00:00Z")));
    }

    #[test]
    fn the_flag_form_and_its_mistakes() {
        let parsed = WindowRule::parse_flag("--window 1", "allow 0 9 * * 1-5 8h Europe/Berlin")
            .unwrap_or_else(|error| panic!("{error}"));
        assert!(parsed.allow);
        assert_eq!(parsed.describe(), "allow 0 9 * * 1-5 8h Europe/Berlin");
        let daily =
            WindowRule::parse_flag("w", "deny @daily 1h").unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(daily.describe(), "deny @daily 1h UTC");
        for (text, expected) in [
            ("", "empty window rule"),
            ("allow 0 9 * *", "write KIND SCHEDULE DURATION"),
            ("maybe 0 9 * * * 1h", "write \"allow\""),
            ("allow 0 99 * * * 1h", "window schedule"),
            ("allow 0 9 * * * soon", "window duration \"soon\""),
            ("allow 0 9 * * * 1h Mars/Olympus", "Mars/Olympus"),
        ] {
            let error = WindowRule::parse_flag("w", text)
                .err()
                .unwrap_or_else(|| panic!("{text:?} parsed"));
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }

    #[test]
    fn until_takes_a_time_or_a_duration() {
        assert_eq!(parse_until("2h", 1000), Ok(1000 + 7200));
        assert_eq!(
            parse_until("2026-11-27T12:00:00+01:00", 0),
            Ok(at("2026-11-27T11:00:00Z"))
        );
        assert!(parse_until("tomorrow", 0).is_err());
    }
}
