//! Cronjob handler (spec §2.6, §7.10): reads the cronjob's position in its schedule
//! (`cron_state`), lets `cron::decide` say whether a tick is due, skipped or missed, persists
//! the new position, starts the tick's run (the job procedure of `job.rs`, labelled
//! `voodu.kind=cronjob`), trims the history with the cronjob's limits, and publishes the next
//! fire time for the scheduler.
//!
//! Invariants: the position is written before a tick's run starts (at most one run per
//! scheduled time); `Forbid` sees the runs the store says are running, so it holds across
//! restarts; skipped and missed ticks are recorded in the status (`detail.skipped`, newest
//! first, at most `SKIPS_KEPT`); a suspended cronjob keeps moving its position, so resuming it
//! never catches up the ticks it slept through.

use std::sync::Arc;
use std::time::Duration;

use super::Handler;
use super::job::{
    job_runs, keep_history, list_runs, remove_all, run_phase, run_timeout, run_view, running,
    runs_status, settle_runs, start_run, taken_names,
};
use crate::base::rfc3339_seconds;
use crate::manifest::spec::schedule::Schedule;
use crate::manifest::spec::{CronjobSpec, JobSpec};
use crate::model::ResourceKey;
use crate::reconcile::observers::cron::{CronDecision, CronInputs, Skip, decide, schedule_key};
use crate::reconcile::{
    context::Ctx, context::blocking, error::Error, error::Result, run::action::Action,
};
use crate::runtime::{Container, Runtime};
use crate::store::{
    CronState, CronjobDetail, Desired, Detail, FailureReason, JobRun, Phase, ResourceStatus,
    RunStatus, SkipDetail,
};

/// Skipped or missed ticks kept in the status.
const SKIPS_KEPT: usize = 10;

impl Handler for CronjobSpec {
    /// One pass; `Action::Done` between ticks too: the scheduler requeues the key at the next.
    async fn reconcile<R: Runtime>(ctx: &Arc<Ctx<R>>, key: &ResourceKey) -> Result<Action> {
        let Some(desired) = super::desired_or_remove(ctx, key, remove_all(ctx, key)).await? else {
            return Ok(Action::Done);
        };
        let spec = spec_of!(key, desired, Cronjob);
        super::engine::refuse_gaps(ctx, key, &desired.spec)?;
        let (schedule, forbid) = checked_schedule(ctx, key, &desired, spec).await?;
        let timeout = run_timeout(&spec.job.timeout);
        let actual = list_runs(ctx, key).await?;
        settle_runs(ctx, key, &actual, timeout).await?;
        let runs = job_runs(ctx, key).await?;
        let (state, previous) = {
            let key = key.clone();
            blocking(&ctx.store, move |store| {
                Ok((
                    store.cron_state(&key.scope, &key.name)?,
                    store.previous_status(&key)?,
                ))
            })
            .await?
        };
        let now = ctx.options.clock.now();
        let schedule_text = schedule_key(&spec.schedule, &spec.timezone);
        let decision = decide(&CronInputs {
            schedule: &schedule,
            schedule_key: &schedule_text,
            state: state.as_ref(),
            now,
            suspend: spec.suspend,
            forbid,
            running: runs.iter().any(|run| run.status == RunStatus::Running),
            catch_up: ctx.options.cron_catch_up,
        });
        if state.as_ref() != Some(&decision.state) {
            let key = key.clone();
            let position = decision.state.clone();
            blocking(&ctx.store, move |store| {
                store.put_cron_state(&key.scope, &key.name, &position)
            })
            .await?;
        }
        ctx.runs.cron().set(key, decision.state.next_run);
        let mut skipped = skip_events(ctx, key, &decision, &runs, now.timestamp());
        let result = match decision.fire {
            Some(scheduled_at) => {
                let tick = Tick {
                    spec_hash: desired.spec_hash.as_str(),
                    timeout,
                    scheduled_at,
                    now: now.timestamp(),
                };
                fire(ctx, key, &spec.job, &tick, (&actual, &runs), &mut skipped).await
            }
            None => Ok(()),
        };
        keep_history(ctx, key, spec.successful_history(), spec.failed_history()).await?;
        let runs = job_runs(ctx, key).await?;
        if let Some(ResourceStatus {
            detail: Detail::Cronjob(old),
            ..
        }) = previous
        {
            skipped.extend(old.skipped);
        }
        skipped.truncate(SKIPS_KEPT);
        let status = cronjob_status(
            key,
            &desired,
            spec,
            &schedule,
            &decision.state,
            &runs,
            skipped,
            result.as_ref().err(),
        );
        let key_for_store = key.clone();
        blocking(&ctx.store, move |store| {
            store.put_status(&key_for_store, &status)
        })
        .await?;
        result.map(|()| Action::Done)
    }
}

/// The schedule parsed in its zone, and whether runs may overlap (`concurrency_policy`); a
/// schedule or policy voodu would refuse fails the resource (`FailureReason::Schedule`) and
/// clears its next fire time.
async fn checked_schedule<R: Runtime>(
    ctx: &Arc<Ctx<R>>,
    key: &ResourceKey,
    desired: &Desired,
    spec: &CronjobSpec,
) -> Result<(Schedule, bool)> {
    // The zone is looked up in the host's time zone files (the first lookup of a process walks
    // the database): off the async threads.
    let (expression, timezone) = (spec.schedule.clone(), spec.timezone.clone());
    let checked = tokio::task::spawn_blocking(move || Schedule::parse(&expression, &timezone))
        .await
        .map_err(Error::Task)?
        .map_err(|problem| format!("schedule {:?}: {problem}", spec.schedule))
        .and_then(|schedule| {
            let forbid = match spec.concurrency_policy.as_str() {
                "" | "Allow" => false,
                "Forbid" => true,
                other => {
                    return Err(format!(
                        "concurrency_policy {other:?} is not supported (Allow or Forbid)"
                    ));
                }
            };
            Ok((schedule, forbid))
        });
    match checked {
        Ok(checked) => Ok(checked),
        Err(message) => {
            ctx.runs.cron().set(key, None);
            let error = Error::Permanent {
                key: key.clone(),
                reason: FailureReason::Schedule,
                message,
            };
            let status = ResourceStatus {
                spec_hash: desired.spec_hash.to_string(),
                ..ResourceStatus::failed(FailureReason::Schedule, error.to_string())
            };
            let key = key.clone();
            blocking(&ctx.store, move |store| store.put_status(&key, &status)).await?;
            Err(error)
        }
    }
}

/// One tick that fires: its spec hash, the run's timeout, when it was scheduled and now.
struct Tick<'a> {
    spec_hash: &'a str,
    timeout: Option<Duration>,
    scheduled_at: i64,
    now: i64,
}

/// Starts the run of `tick` (its name free among `taken` runs and containers); a run that
/// could not start is listed first among the skipped ticks.
async fn fire<R: Runtime>(
    ctx: &Arc<Ctx<R>>,
    key: &ResourceKey,
    job: &JobSpec,
    tick: &Tick<'_>,
    (actual, runs): (&[Container], &[JobRun]),
    skipped: &mut Vec<SkipDetail>,
) -> Result<()> {
    let taken = taken_names(actual, runs);
    match start_run(ctx, key, job, tick.spec_hash, tick.timeout, &taken).await {
        Ok(run_id) => {
            tracing::info!(%key, run = %run_id, scheduled_at = %rfc3339_seconds(tick.scheduled_at), "cronjob tick");
            Ok(())
        }
        Err(error) => {
            skipped.insert(
                0,
                SkipDetail {
                    reason: "error".to_owned(),
                    scheduled_at: Some(rfc3339_seconds(tick.scheduled_at)),
                    recorded_at: rfc3339_seconds(tick.now),
                    message: format!("the tick could not start: {error}"),
                    first: None,
                    last: None,
                    n_times: None,
                },
            );
            Err(error)
        }
    }
}

/// Status entries for the ticks `decision` skipped (suspended ticks are not listed: the
/// phase says it), newest first, and a log line for each.
fn skip_events<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    decision: &CronDecision,
    runs: &[JobRun],
    now: i64,
) -> Vec<SkipDetail> {
    let mut events = Vec::new();
    for skip in &decision.skips {
        match skip {
            Skip::Missed {
                n_times,
                first,
                last,
            } => {
                let message = format!(
                    "{n_times} scheduled time(s) from {} to {} missed (the agent was not running, or too late); catch-up window {}",
                    rfc3339_seconds(*first),
                    rfc3339_seconds(*last),
                    humantime::format_duration(ctx.options.cron_catch_up)
                );
                tracing::warn!(%key, "{message}");
                events.push(SkipDetail {
                    reason: "missed".to_owned(),
                    n_times: Some(*n_times),
                    first: Some(rfc3339_seconds(*first)),
                    last: Some(rfc3339_seconds(*last)),
                    recorded_at: rfc3339_seconds(now),
                    message,
                    scheduled_at: None,
                });
            }
            Skip::Forbidden { scheduled_at } => {
                let running = runs
                    .iter()
                    .find(|run| run.status == RunStatus::Running)
                    .map_or_else(String::new, |run| format!(" {}", run.run_id));
                let message = format!(
                    "skipped: the previous run{running} was still running (concurrency_policy = \"Forbid\")"
                );
                tracing::info!(%key, scheduled_at = %rfc3339_seconds(*scheduled_at), "{message}");
                events.push(SkipDetail {
                    reason: "forbid".to_owned(),
                    scheduled_at: Some(rfc3339_seconds(*scheduled_at)),
                    recorded_at: rfc3339_seconds(now),
                    message,
                    first: None,
                    last: None,
                    n_times: None,
                });
            }
            Skip::Suspended { n_times, last } => {
                tracing::debug!(%key, n_times, last = %rfc3339_seconds(*last), "suspended: tick skipped");
            }
        }
    }
    events.reverse();
    events
}

#[allow(clippy::too_many_arguments)]
fn cronjob_status(
    key: &ResourceKey,
    desired: &Desired,
    spec: &CronjobSpec,
    schedule: &Schedule,
    position: &CronState,
    runs: &[JobRun],
    skipped: Vec<SkipDetail>,
    error: Option<&Error>,
) -> ResourceStatus {
    let n_running = running(runs);
    let zone = if spec.timezone.is_empty() {
        "UTC"
    } else {
        spec.timezone.as_str()
    };
    let next_local = position
        .next_run
        .and_then(|next| schedule.local_rfc3339(chrono::DateTime::from_timestamp(next, 0)?));
    let (phase, message) = if let Some(error) = error {
        // The error policy then makes it `Failed` unless it is retried.
        (Phase::Pending, error.to_string())
    } else if spec.suspend {
        (Phase::Suspended, "suspended: no tick runs".to_owned())
    } else {
        let next = match (&next_local, position.next_run) {
            (Some(local), _) => format!("next run {local} ({zone})"),
            (None, Some(next)) => format!("next run {}", rfc3339_seconds(next)),
            (None, None) => "no upcoming scheduled time".to_owned(),
        };
        let last = runs.first().map(|run| run_phase(run).1);
        let message = match last {
            Some(last) => format!("{next}; last: {last}"),
            None => next,
        };
        (
            if n_running > 0 {
                Phase::Running
            } else {
                Phase::Scheduled
            },
            message,
        )
    };
    let detail = Detail::Cronjob(CronjobDetail {
        schedule: spec.schedule.clone(),
        timezone: zone.to_owned(),
        suspend: spec.suspend,
        concurrency_policy: if spec.concurrency_policy.is_empty() {
            "Allow"
        } else {
            spec.concurrency_policy.as_str()
        }
        .to_owned(),
        image: spec.job.container.effective_image(key),
        next_run: position.next_run.map(rfc3339_seconds),
        next_run_local: next_local,
        last_scheduled: position.last_scheduled.map(rfc3339_seconds),
        last_run: runs.first().map(run_view),
        history: runs.iter().map(run_view).collect(),
        skipped,
    });
    runs_status(desired, (phase, message), error, n_running, detail)
}
