//! Cron: when a cronjob fires. `decide` is the pure scheduling decision the cronjob handler
//! acts on (first sighting, due ticks, suspend, `Forbid`, runs missed while the agent was not
//! running); `schedule` is the scheduler task, which only sleeps until the earliest next fire
//! and then requeues the cronjobs that are due; `Clock` is where "now" comes from.
//!
//! Invariants:
//! - the scheduler never starts a run itself: it requeues the key, and the cronjob handler
//!   (one key at a time, like every handler) reads the persisted position in `cron_state`,
//!   decides with `decide` and acts, so a tick and a delete or spec change never race;
//! - a first sighting, or a changed schedule or time zone, only computes the next time
//!   strictly after now; it never fires (as voodu);
//! - at most one run per scheduled time: the position is written before the run starts, so a
//!   crash in between loses that tick rather than running it twice;
//! - runs missed while the agent was not running are never replayed one by one: only the
//!   most recent scheduled time runs, and only when it is at most the catch-up window old
//!   (`ReconcileOptions::cron_catch_up`; a tick is always on time within `ON_TIME`); the older
//!   ones are reported as missed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

pub(crate) mod clock;

pub use clock::{Clock, DEFAULT_CATCH_UP};

use crate::manifest::spec::schedule::Schedule;
use crate::model::ResourceKey;
use crate::reconcile::context::Ctx;
use crate::reconcile::run::timer::What;
use crate::runtime::Runtime;
use crate::store::CronState;

/// How late a tick may be handled and still count as on time (queue delays, a restart of a
/// few seconds): with `--cron-catch-up 0` this is the whole window.
pub(crate) const ON_TIME: Duration = Duration::from_secs(60);

/// The longest the scheduler sleeps before it looks at the clock again, so a wall-clock
/// step (NTP, a resumed VM) delays a tick by at most this much.
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// The schedule and its zone as `cron_state` keeps them: a change of either starts afresh.
pub(crate) fn schedule_key(schedule: &str, timezone: &str) -> String {
    let zone = if timezone.is_empty() { "UTC" } else { timezone };
    format!("{} {zone}", schedule.trim())
}

/// What the cronjob handler knows when it decides.
#[derive(Debug, Clone)]
pub(crate) struct CronInputs<'a> {
    pub(crate) schedule: &'a Schedule,
    /// `schedule_key` of the desired schedule.
    pub(crate) schedule_key: &'a str,
    /// The persisted position, if any.
    pub(crate) state: Option<&'a CronState>,
    pub(crate) now: DateTime<Utc>,
    pub(crate) suspend: bool,
    /// `concurrency_policy = "Forbid"`.
    pub(crate) forbid: bool,
    /// A run of this cronjob is still running.
    pub(crate) running: bool,
    /// How old the most recent missed time may be and still run.
    pub(crate) catch_up: Duration,
}

/// Why scheduled times did not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Skip {
    /// Times that passed while the agent was not running (or too long ago to catch up).
    Missed { n_times: u64, first: i64, last: i64 },
    /// `suspend = true`.
    Suspended { n_times: u64, last: i64 },
    /// `Forbid`: the previous run was still running.
    Forbidden { scheduled_at: i64 },
}

/// The decision: the position to persist, the scheduled time to run now, what was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CronDecision {
    pub(crate) state: CronState,
    /// Run now, for this scheduled time (Unix seconds).
    pub(crate) fire: Option<i64>,
    pub(crate) skips: Vec<Skip>,
}

/// Most scheduled times counted one by one when reporting missed ones.
const MAX_COUNTED: u64 = 100_000;

/// Decides what a cronjob does now.
pub(crate) fn decide(inputs: &CronInputs<'_>) -> CronDecision {
    let now = inputs.now;
    let next_after_now = inputs.schedule.next_after(now).map(|time| time.timestamp());
    let fresh = |last_scheduled| CronDecision {
        state: CronState {
            schedule: inputs.schedule_key.to_owned(),
            last_scheduled,
            next_run: next_after_now,
        },
        fire: None,
        skips: Vec::new(),
    };
    let Some(state) = inputs
        .state
        .filter(|state| state.schedule == inputs.schedule_key)
    else {
        // First sighting, or the schedule changed: start from now, do not fire.
        return fresh(None);
    };
    let Some(next) = state.next_run.and_then(unix) else {
        // No time was ahead when last computed: look again.
        return fresh(state.last_scheduled);
    };
    if now < next {
        return CronDecision {
            state: state.clone(),
            fire: None,
            skips: Vec::new(),
        };
    }
    // Every scheduled time in [next, now] is due; the most recent one may run.
    let latest = inputs
        .schedule
        .last_at_or_before(now)
        .filter(|latest| *latest >= next)
        .unwrap_or(next);
    let mut n_older = 0_u64;
    let mut last_older = None;
    let mut cursor = next;
    while cursor < latest && n_older < MAX_COUNTED {
        n_older += 1;
        last_older = Some(cursor.timestamp());
        match inputs.schedule.next_after(cursor) {
            Some(following) => cursor = following,
            None => break,
        }
    }
    let latest_unix = latest.timestamp();
    let window = inputs.catch_up.max(ON_TIME);
    let late = (now - latest).to_std().unwrap_or(Duration::ZERO);
    let mut skips = Vec::new();
    let mut missed = last_older.map(|last| Skip::Missed {
        n_times: n_older,
        first: next.timestamp(),
        last,
    });
    let fire = if inputs.suspend {
        missed = None;
        skips.push(Skip::Suspended {
            n_times: n_older + 1,
            last: latest_unix,
        });
        None
    } else if late > window {
        missed = Some(Skip::Missed {
            n_times: n_older + 1,
            first: next.timestamp(),
            last: latest_unix,
        });
        None
    } else if inputs.forbid && inputs.running {
        skips.push(Skip::Forbidden {
            scheduled_at: latest_unix,
        });
        None
    } else {
        Some(latest_unix)
    };
    if let Some(missed) = missed {
        skips.insert(0, missed);
    }
    CronDecision {
        state: CronState {
            schedule: inputs.schedule_key.to_owned(),
            last_scheduled: Some(latest_unix),
            next_run: next_after_now,
        },
        fire,
        skips,
    }
}

fn unix(seconds: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(seconds, 0)
}

/// The scheduler: sleeps until the earliest next fire (or a change of the fire times, or at
/// most `MAX_SLEEP`), then requeues every cronjob that is due. A key stays due until its
/// handler moves it on; it is requeued once per fire time, and again every `MAX_SLEEP`
/// while its handler keeps failing before it decides.
pub(crate) async fn schedule<R: Runtime>(ctx: Arc<Ctx<R>>, shutdown: CancellationToken) {
    let times = ctx.runs.cron();
    let mut requeued: BTreeMap<ResourceKey, (i64, tokio::time::Instant)> = BTreeMap::new();
    loop {
        let changed = times.changed.notified();
        let now = ctx.options.clock.now();
        let entries = times.snapshot();
        requeued.retain(|key, _| entries.contains_key(key));
        let mut sleep: Option<Duration> = None;
        for (key, next) in entries {
            let wait = match unix(next) {
                Some(at) if at > now => (at - now).to_std().unwrap_or(Duration::ZERO),
                _ => {
                    let fresh = requeued
                        .get(&key)
                        .is_none_or(|(time, when)| *time != next || when.elapsed() >= MAX_SLEEP);
                    if fresh {
                        tracing::debug!(%key, "cronjob due");
                        ctx.timer.requeue(key.clone());
                        requeued.insert(key, (next, tokio::time::Instant::now()));
                    }
                    MAX_SLEEP
                }
            };
            sleep = Some(sleep.map_or(wait, |sleep| sleep.min(wait)));
        }
        let sleep = sleep.map(|sleep| sleep.min(MAX_SLEEP));
        tokio::select! {
            () = changed => {}
            () = async {
                match sleep {
                    Some(sleep) => ctx.timer.sleep(What::Cron, sleep).await,
                    None => std::future::pending().await,
                }
            } => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("a valid instant")
            .with_timezone(&Utc)
    }

    fn ts(text: &str) -> i64 {
        at(text).timestamp()
    }

    /// A cronjob's situation; `check` decides it.
    struct Case<'a> {
        schedule: &'a str,
        timezone: &'a str,
        /// `(last_scheduled, next_run)` persisted, under the same schedule.
        state: Option<(Option<&'a str>, Option<&'a str>)>,
        now: &'a str,
        suspend: bool,
        forbid: bool,
        running: bool,
        catch_up: Duration,
    }

    impl Default for Case<'_> {
        fn default() -> Self {
            Case {
                schedule: "* * * * *",
                timezone: "",
                state: None,
                now: "2026-01-01T10:00:30Z",
                suspend: false,
                forbid: false,
                running: false,
                catch_up: DEFAULT_CATCH_UP,
            }
        }
    }

    fn check(case: &Case<'_>) -> Result<CronDecision, String> {
        let schedule = Schedule::parse(case.schedule, case.timezone)?;
        let key = schedule_key(case.schedule, case.timezone);
        let state = case.state.map(|(last, next)| CronState {
            schedule: key.clone(),
            last_scheduled: last.map(ts),
            next_run: next.map(ts),
        });
        Ok(decide(&CronInputs {
            schedule: &schedule,
            schedule_key: &key,
            state: state.as_ref(),
            now: at(case.now),
            suspend: case.suspend,
            forbid: case.forbid,
            running: case.running,
            catch_up: case.catch_up,
        }))
    }

    #[test]
    fn first_sighting_computes_the_next_time_and_does_not_fire() -> Result<(), String> {
        let decision = check(&Case {
            schedule: "*/5 * * * *",
            now: "2026-01-01T10:05:00Z",
            ..Case::default()
        })?;
        assert_eq!(decision.fire, None);
        assert!(decision.skips.is_empty());
        assert_eq!(
            decision.state,
            CronState {
                schedule: "*/5 * * * * UTC".into(),
                last_scheduled: None,
                next_run: Some(ts("2026-01-01T10:10:00Z")),
            },
            "strictly after now, even on a scheduled minute"
        );
        Ok(())
    }

    #[test]
    fn a_changed_schedule_or_zone_starts_afresh_without_firing() -> Result<(), String> {
        let schedule = Schedule::parse("0 9 * * *", "Europe/Lisbon")?;
        let old = CronState {
            schedule: schedule_key("0 9 * * *", ""),
            last_scheduled: Some(ts("2026-07-10T09:00:00Z")),
            next_run: Some(ts("2026-07-11T09:00:00Z")),
        };
        let key = schedule_key("0 9 * * *", "Europe/Lisbon");
        let decision = decide(&CronInputs {
            schedule: &schedule,
            schedule_key: &key,
            state: Some(&old),
            now: at("2026-07-11T09:30:00Z"),
            suspend: false,
            forbid: false,
            running: false,
            catch_up: DEFAULT_CATCH_UP,
        });
        assert_eq!(
            decision.fire, None,
            "the old position was due, but it is stale"
        );
        assert_eq!(
            decision.state.next_run,
            Some(ts("2026-07-12T08:00:00Z")),
            "09:00 in Lisbon's summer"
        );
        assert_eq!(decision.state.schedule, "0 9 * * * Europe/Lisbon");
        Ok(())
    }

    #[test]
    fn not_yet_due_keeps_the_position() -> Result<(), String> {
        let decision = check(&Case {
            state: Some((None, Some("2026-01-01T10:01:00Z"))),
            now: "2026-01-01T10:00:59Z",
            ..Case::default()
        })?;
        assert_eq!(decision.fire, None);
        assert_eq!(decision.state.next_run, Some(ts("2026-01-01T10:01:00Z")));
        assert_eq!(decision.state.last_scheduled, None);
        Ok(())
    }

    #[test]
    fn a_due_tick_fires_once_and_moves_on() -> Result<(), String> {
        let decision = check(&Case {
            state: Some((None, Some("2026-01-01T10:01:00Z"))),
            now: "2026-01-01T10:01:00Z",
            ..Case::default()
        })?;
        assert_eq!(decision.fire, Some(ts("2026-01-01T10:01:00Z")));
        assert!(decision.skips.is_empty());
        assert_eq!(
            decision.state.last_scheduled,
            Some(ts("2026-01-01T10:01:00Z"))
        );
        assert_eq!(decision.state.next_run, Some(ts("2026-01-01T10:02:00Z")));
        // Deciding again at the same instant on the new position fires nothing.
        let again = check(&Case {
            state: Some((Some("2026-01-01T10:01:00Z"), Some("2026-01-01T10:02:00Z"))),
            now: "2026-01-01T10:01:00Z",
            ..Case::default()
        })?;
        assert_eq!(again.fire, None);
        Ok(())
    }

    #[test]
    fn suspend_skips_and_still_moves_on() -> Result<(), String> {
        let decision = check(&Case {
            state: Some((None, Some("2026-01-01T10:01:00Z"))),
            now: "2026-01-01T10:03:10Z",
            suspend: true,
            ..Case::default()
        })?;
        assert_eq!(decision.fire, None);
        assert_eq!(
            decision.skips,
            [Skip::Suspended {
                n_times: 3,
                last: ts("2026-01-01T10:03:00Z")
            }]
        );
        assert_eq!(decision.state.next_run, Some(ts("2026-01-01T10:04:00Z")));
        Ok(())
    }

    #[test]
    fn forbid_skips_while_the_previous_run_runs_and_allow_overlaps() -> Result<(), String> {
        let due = Case {
            state: Some((Some("2026-01-01T10:00:00Z"), Some("2026-01-01T10:01:00Z"))),
            now: "2026-01-01T10:01:01Z",
            running: true,
            ..Case::default()
        };
        let forbid = check(&Case {
            forbid: true,
            ..due
        })?;
        assert_eq!(forbid.fire, None);
        assert_eq!(
            forbid.skips,
            [Skip::Forbidden {
                scheduled_at: ts("2026-01-01T10:01:00Z")
            }]
        );
        assert_eq!(forbid.state.next_run, Some(ts("2026-01-01T10:02:00Z")));
        let allow = check(&Case {
            state: Some((Some("2026-01-01T10:00:00Z"), Some("2026-01-01T10:01:00Z"))),
            now: "2026-01-01T10:01:01Z",
            running: true,
            ..Case::default()
        })?;
        assert_eq!(allow.fire, Some(ts("2026-01-01T10:01:00Z")));
        let forbid_idle = check(&Case {
            state: Some((Some("2026-01-01T10:00:00Z"), Some("2026-01-01T10:01:00Z"))),
            now: "2026-01-01T10:01:01Z",
            forbid: true,
            ..Case::default()
        })?;
        assert_eq!(forbid_idle.fire, Some(ts("2026-01-01T10:01:00Z")));
        Ok(())
    }

    #[test]
    fn missed_runs_inside_the_window_run_once_for_the_latest_time() -> Result<(), String> {
        // Hourly; the agent was down from 10:30 to 13:10: 11:00, 12:00 and 13:00 passed.
        let decision = check(&Case {
            schedule: "0 * * * *",
            state: Some((Some("2026-01-01T10:00:00Z"), Some("2026-01-01T11:00:00Z"))),
            now: "2026-01-01T13:10:00Z",
            ..Case::default()
        })?;
        assert_eq!(decision.fire, Some(ts("2026-01-01T13:00:00Z")));
        assert_eq!(
            decision.skips,
            [Skip::Missed {
                n_times: 2,
                first: ts("2026-01-01T11:00:00Z"),
                last: ts("2026-01-01T12:00:00Z"),
            }]
        );
        assert_eq!(decision.state.next_run, Some(ts("2026-01-01T14:00:00Z")));
        assert_eq!(
            decision.state.last_scheduled,
            Some(ts("2026-01-01T13:00:00Z"))
        );
        Ok(())
    }

    #[test]
    fn missed_runs_outside_the_window_do_not_run() -> Result<(), String> {
        let decision = check(&Case {
            schedule: "0 * * * *",
            state: Some((Some("2026-01-01T10:00:00Z"), Some("2026-01-01T11:00:00Z"))),
            now: "2026-01-01T13:20:00Z",
            ..Case::default()
        })?;
        assert_eq!(decision.fire, None);
        assert_eq!(
            decision.skips,
            [Skip::Missed {
                n_times: 3,
                first: ts("2026-01-01T11:00:00Z"),
                last: ts("2026-01-01T13:00:00Z"),
            }]
        );
        assert_eq!(decision.state.next_run, Some(ts("2026-01-01T14:00:00Z")));
        Ok(())
    }

    #[test]
    fn catch_up_zero_still_runs_a_tick_that_is_only_a_little_late() -> Result<(), String> {
        let base = Case {
            state: Some((None, Some("2026-01-01T10:01:00Z"))),
            catch_up: Duration::ZERO,
            ..Case::default()
        };
        let on_time = check(&Case {
            now: "2026-01-01T10:01:40Z",
            ..base
        })?;
        assert_eq!(on_time.fire, Some(ts("2026-01-01T10:01:00Z")));
        let too_late = check(&Case {
            schedule: "0 * * * *",
            state: Some((None, Some("2026-01-01T11:00:00Z"))),
            now: "2026-01-01T11:02:00Z",
            catch_up: Duration::ZERO,
            ..Case::default()
        })?;
        assert_eq!(too_late.fire, None);
        assert_eq!(
            too_late.skips,
            [Skip::Missed {
                n_times: 1,
                first: ts("2026-01-01T11:00:00Z"),
                last: ts("2026-01-01T11:00:00Z"),
            }]
        );
        Ok(())
    }

    #[test]
    fn a_long_outage_of_a_minutely_schedule_is_counted_not_replayed() -> Result<(), String> {
        let decision = check(&Case {
            state: Some((None, Some("2026-01-01T00:01:00Z"))),
            now: "2026-01-03T00:00:30Z",
            ..Case::default()
        })?;
        assert_eq!(decision.fire, Some(ts("2026-01-03T00:00:00Z")));
        assert_eq!(
            decision.skips,
            [Skip::Missed {
                n_times: 2 * 24 * 60 - 1,
                first: ts("2026-01-01T00:01:00Z"),
                last: ts("2026-01-02T23:59:00Z"),
            }]
        );
        Ok(())
    }

    #[test]
    fn time_zones_and_dst_days() -> Result<(), String> {
        // New York springs forward on 2026-03-08 at 02:00 (to 03:00 EDT): 02:30 does not exist
        // that day, so the daily 02:30 job runs at the first instant after the gap.
        let first = check(&Case {
            schedule: "30 2 * * *",
            timezone: "America/New_York",
            now: "2026-03-07T12:00:00Z",
            ..Case::default()
        })?;
        assert_eq!(first.state.next_run, Some(ts("2026-03-08T07:00:00Z")));
        let fired = check(&Case {
            schedule: "30 2 * * *",
            timezone: "America/New_York",
            state: Some((None, Some("2026-03-08T07:00:00Z"))),
            now: "2026-03-08T07:00:05Z",
            ..Case::default()
        })?;
        assert_eq!(fired.fire, Some(ts("2026-03-08T07:00:00Z")));
        assert_eq!(
            fired.state.next_run,
            Some(ts("2026-03-09T06:30:00Z")),
            "02:30 EDT the next day"
        );
        // It falls back on 2026-11-01 at 02:00 EDT (to 01:00 EST): 01:30 happens twice, and a
        // daily 01:30 job runs once, at the first of them.
        let before = check(&Case {
            schedule: "30 1 * * *",
            timezone: "America/New_York",
            now: "2026-10-31T12:00:00Z",
            ..Case::default()
        })?;
        assert_eq!(before.state.next_run, Some(ts("2026-11-01T05:30:00Z")));
        let after_first = check(&Case {
            schedule: "30 1 * * *",
            timezone: "America/New_York",
            state: Some((None, Some("2026-11-01T05:30:00Z"))),
            now: "2026-11-01T05:30:01Z",
            ..Case::default()
        })?;
        assert_eq!(after_first.fire, Some(ts("2026-11-01T05:30:00Z")));
        assert_eq!(
            after_first.state.next_run,
            Some(ts("2026-11-02T06:30:00Z")),
            "not again at 01:30 EST the same night"
        );
        Ok(())
    }

    #[test]
    fn schedule_key_names_the_zone() {
        assert_eq!(schedule_key(" */5 * * * * ", ""), "*/5 * * * * UTC");
        assert_eq!(
            schedule_key("@daily", "Europe/Lisbon"),
            "@daily Europe/Lisbon"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_virtual_clock_follows_paused_time() {
        let clock = Clock::starting_at(at("2026-01-01T10:00:00Z"));
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(clock.now(), at("2026-01-01T10:01:30Z"));
    }
}
