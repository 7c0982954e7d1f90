//! Jobs and cronjobs on the fake runtime with real SQLite and paused time: a job runs once per
//! spec hash and keeps its history (exit code, log tail, limits), times out, runs again when
//! its spec changes (after a running run ended), and a restarted reconciler finishes the
//! records of runs that were running; cronjobs fire on schedule on a virtual clock, `Forbid`
//! skips an overlapping tick, `suspend` stops ticks, and runs missed while the agent was down
//! are caught up once inside the window and only reported outside it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::reconcile::Clock;
use voodu_agent::runtime::{Container, Containers, labels};
use voodu_agent::store::{CronState, JobRun, ResourceStatus, RunStatus};

use crate::support::{self, TestResult};

/// The shared harness, started with a virtual cron clock that begins at a chosen wall time.
struct Harness {
    base: support::Harness,
    clock: Clock,
}

impl std::ops::Deref for Harness {
    type Target = support::Harness;
    fn deref(&self) -> &support::Harness {
        &self.base
    }
}

impl std::ops::DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut support::Harness {
        &mut self.base
    }
}

impl Harness {
    fn new() -> TestResult<Harness> {
        Ok(Harness {
            base: support::Harness::new()?,
            clock: Clock::System,
        })
    }

    /// Starts the reconciler with cron's clock reading `now` (RFC 3339) at this instant.
    fn start_at(&mut self, now: &str) -> TestResult {
        self.clock = Clock::starting_at(at(now)?);
        self.base.options.clock = self.clock.clone();
        self.base.start()
    }

    fn start(&mut self) -> TestResult {
        self.start_at("2026-01-01T10:00:30Z")
    }

    /// Every container of the resource (runs of a job or cronjob).
    async fn containers(&self, key: &ResourceKey) -> TestResult<Vec<Container>> {
        Ok(self
            .fake
            .list(&[
                (labels::KIND, key.kind.as_str()),
                (labels::SCOPE, key.scope.as_str()),
                (labels::NAME, key.name.as_str()),
            ])
            .await?)
    }

    /// Names of the resource's containers, for `until` closures (which cannot await): the
    /// fake answers `list` without waiting, so one poll completes it.
    fn container_names_now(&self, key: &ResourceKey) -> TestResult<Vec<String>> {
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        let mut listing = std::pin::pin!(self.containers(key));
        match listing.as_mut().poll(&mut context) {
            std::task::Poll::Ready(containers) => Ok(containers?
                .into_iter()
                .map(|container| container.name)
                .collect()),
            std::task::Poll::Pending => Err("the fake runtime answered `list` late".into()),
        }
    }

    fn runs(&self, key: &ResourceKey) -> TestResult<Vec<JobRun>> {
        Ok(self.store.job_runs(key)?)
    }

    /// Waits (a real-time liveness bound; virtual time moves in `POLL`s meanwhile) until
    /// `check` gives a value.
    async fn until<T>(
        &self,
        what: &str,
        mut check: impl FnMut(&Harness) -> TestResult<Option<T>>,
    ) -> TestResult<T> {
        support::until(
            Duration::from_secs(20),
            support::harness::POLL,
            what,
            || check(self),
        )
        .await
        .map_err(|error| format!("{error} (clock at {})", self.clock.now()).into())
    }

    /// Waits until the resource has `n` runs, none running, and a status written after them.
    async fn finished_runs(&self, key: &ResourceKey, n: usize) -> TestResult<Vec<JobRun>> {
        self.until(&format!("{n} finished run(s) of {key}"), |harness| {
            let runs = harness.runs(key)?;
            let settled = runs.len() == n
                && runs.iter().all(|run| run.status != RunStatus::Running)
                && harness.status(key)?.is_some_and(|status| {
                    status.running_replicas == 0 && status.phase != "Running"
                });
            Ok(settled.then_some(runs))
        })
        .await
    }

    fn status(&self, key: &ResourceKey) -> TestResult<Option<ResourceStatus>> {
        Ok(self.store.status(key)?)
    }

    fn cron_state(&self, key: &ResourceKey) -> TestResult<Option<CronState>> {
        Ok(self.store.cron_state(&key.scope, &key.name)?)
    }
}

fn at(text: &str) -> TestResult<DateTime<Utc>> {
    Ok(DateTime::parse_from_rfc3339(text)?.with_timezone(&Utc))
}

fn ts(text: &str) -> TestResult<i64> {
    Ok(at(text)?.timestamp())
}

fn job(body: &str) -> String {
    format!(
        r#"job "ops" "migrate" {{
  image = "busybox"
{body}
}}
"#
    )
}

fn job_key() -> ResourceKey {
    ResourceKey::new(Kind::Job, "ops", "migrate")
}

fn cronjob(body: &str) -> String {
    format!(
        r#"cronjob "ops" "tick" {{
  image = "busybox"
{body}
}}
"#
    )
}

fn cron_key() -> ResourceKey {
    ResourceKey::new(Kind::Cronjob, "ops", "tick")
}

#[tokio::test(start_paused = true)]
async fn a_job_runs_to_completion_once_and_keeps_its_history() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[(
        "job.hcl",
        &job(r#"  command = ["sh", "-c", "echo migrating; echo done"]
  env = { A = "1" }"#),
    )])?;
    let runs = harness.finished_runs(&job_key(), 1).await?;
    let run = &runs[0];
    let desired = harness.store.desired(&job_key())?.ok_or("desired")?;
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.exit_code, Some(0));
    assert_eq!(run.logs_tail, "migrating\ndone\n");
    assert_eq!(run.spec_hash, desired.spec_hash.as_str());
    assert_eq!(run.container, format!("ops-migrate.{}", run.run_id));
    assert!(run.ended_at.is_some_and(|ended| ended >= run.started_at));

    // The container stays (docker logs), labelled as voodu labels job runs.
    let containers = harness.containers(&job_key()).await?;
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    assert_eq!(container.name, run.container);
    for (label, value) in [
        (labels::KIND, "job"),
        (labels::ROLE, "job"),
        (labels::SCOPE, "ops"),
        (labels::NAME, "migrate"),
        (labels::REPLICA_ID, run.run_id.as_str()),
        (labels::SPEC_HASH, desired.spec_hash.as_str()),
        (labels::AGENT, harness.store.agent_id()?.as_str()),
    ] {
        assert_eq!(container.label(label), Some(value), "{label}");
    }
    assert_eq!(container.label(labels::MANIFEST_HASH), None);
    let spec = harness.fake.spec_of(&container.id).ok_or("spec")?;
    assert_eq!(spec.restart, "", "no restart policy");
    assert_eq!(spec.networks, ["voodu0"]);
    assert!(spec.aliases.is_empty(), "jobs get no DNS alias");
    assert_eq!(spec.env, ["A=1"], "no identity variables");

    let status = harness.status(&job_key())?.ok_or("status")?;
    assert_eq!(status.phase, "Succeeded");
    assert_eq!(status.detail.json()["history"][0]["exit_code"], 0);
    assert_eq!(
        status.detail.json()["last_run"]["logs_tail"],
        "migrating\ndone\n"
    );

    // A restart replays the job (paused time moves only once the replay is done): it does
    // not run again.
    harness.stop().await?;
    let mark = harness.fake.calls().len();
    harness.start()?;
    harness.idle_for(Duration::from_secs(5)).await;
    assert_eq!(
        harness.status(&job_key())?.ok_or("status")?.phase,
        "Succeeded"
    );
    assert_eq!(harness.runs(&job_key())?.len(), 1, "one run per spec hash");
    assert!(
        !harness.fake.calls()[mark..]
            .iter()
            .any(|call| call.starts_with("create")),
        "nothing created on replay"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_keeps_its_exit_code_and_the_failed_limit_trims() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[(
        "job.hcl",
        &job(r#"  command = ["sh", "-c", "echo first; exit 3"]"#),
    )])?;
    let runs = harness.finished_runs(&job_key(), 1).await?;
    assert_eq!(
        (runs[0].status, runs[0].exit_code, runs[0].error.as_str()),
        (RunStatus::Failed, Some(3), "exit code 3")
    );
    let first = runs[0].container.clone();
    let status = harness.status(&job_key())?.ok_or("status")?;
    assert_eq!(status.phase, "Failed");
    assert!(status.message.contains("exit code 3"), "{}", status.message);

    // A new spec runs again; the default failed_history_limit (1) keeps only the newest.
    harness.push(&[(
        "job.hcl",
        &job(r#"  command = ["sh", "-c", "echo second; exit 4"]"#),
    )])?;
    let runs = harness
        .until("the second run trimmed the first", |harness| {
            let runs = harness.runs(&job_key())?;
            Ok(
                (runs.len() == 1 && runs[0].container != first && runs[0].exit_code.is_some())
                    .then_some(runs),
            )
        })
        .await?;
    assert_eq!(runs[0].exit_code, Some(4));
    assert_eq!(runs[0].logs_tail, "second\n");
    let names: Vec<String> = harness
        .until("the trimmed run's container removed", |harness| {
            let names = harness.container_names_now(&job_key())?;
            Ok((names.len() == 1).then_some(names))
        })
        .await?;
    assert_eq!(names, [runs[0].container.clone()]);
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn history_limits_keep_the_newest_runs_and_their_containers() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    for n in 1..=4 {
        harness.push(&[(
            "job.hcl",
            &job(&format!(
                r#"  command = ["echo", "{n}"]
  successful_history_limit = 2"#
            )),
        )])?;
        harness
            .until(&format!("run {n}"), |harness| {
                let runs = harness.runs(&job_key())?;
                Ok(runs
                    .first()
                    .filter(|run| run.logs_tail == format!("{n}\n"))
                    .map(|_| ()))
            })
            .await?;
    }
    let runs = harness
        .until("history trimmed to 2", |harness| {
            let runs = harness.runs(&job_key())?;
            Ok((runs.len() == 2).then_some(runs))
        })
        .await?;
    let logs: Vec<&str> = runs.iter().map(|run| run.logs_tail.as_str()).collect();
    assert_eq!(logs, ["4\n", "3\n"], "newest first");
    let mut kept: Vec<String> = runs.iter().map(|run| run.container.clone()).collect();
    kept.sort();
    let mut containers: Vec<String> = harness
        .until("trimmed containers removed", |harness| {
            let names = harness.container_names_now(&job_key())?;
            Ok((names.len() == 2).then_some(names))
        })
        .await?;
    containers.sort();
    assert_eq!(containers, kept);
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_run_past_its_timeout_is_removed_and_fails() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[(
        "job.hcl",
        &job(r#"  command = ["sleep", "3600"]
  timeout = "30s""#),
    )])?;
    let runs = harness.finished_runs(&job_key(), 1).await?;
    assert_eq!(runs[0].status, RunStatus::Failed);
    assert_eq!(runs[0].exit_code, None);
    assert_eq!(runs[0].error, "timed out after 30s");
    assert!(
        harness.containers(&job_key()).await?.is_empty(),
        "the timed-out container is stopped and removed"
    );
    let status = harness.status(&job_key())?.ok_or("status")?;
    assert_eq!(status.phase, "Failed");
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_spec_change_mid_run_runs_once_the_running_run_ended() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("job.hcl", &job(r#"  command = ["sleep", "3600"]"#))])?;
    let first = harness
        .until("the first run running", |harness| {
            Ok(harness
                .runs(&job_key())?
                .into_iter()
                .find(|run| run.status == RunStatus::Running))
        })
        .await?;
    harness.push(&[("job.hcl", &job(r#"  command = ["echo", "v2"]"#))])?;
    let status = harness
        .until("the job waiting for its running run", |harness| {
            Ok(harness
                .status(&job_key())?
                .filter(|status| status.message.contains("previous spec is still running")))
        })
        .await?;
    assert_eq!(status.phase, "Running");
    assert_eq!(harness.runs(&job_key())?.len(), 1, "runs never overlap");
    let container = harness
        .containers(&job_key())
        .await?
        .into_iter()
        .find(|container| container.name == first.container)
        .ok_or("the first run's container")?;
    harness.fake.exit_with(&container.id, 0);
    let runs = harness.finished_runs(&job_key(), 2).await?;
    let desired = harness.store.desired(&job_key())?.ok_or("desired")?;
    assert_eq!(runs[0].spec_hash, desired.spec_hash.as_str());
    assert_eq!(runs[0].logs_tail, "v2\n");
    assert_eq!(runs[1].run_id, first.run_id);
    assert_ne!(runs[1].spec_hash, runs[0].spec_hash);
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_restarted_reconciler_finishes_the_runs_that_were_running() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[
        ("job.hcl", &job(r#"  command = ["sleep", "3600"]"#)),
        (
            "other.hcl",
            r#"job "ops" "backfill" {
  image = "busybox"
  command = ["sleep", "3600"]
}
"#,
        ),
    ])?;
    let other = ResourceKey::new(Kind::Job, "ops", "backfill");
    for key in [job_key(), other.clone()] {
        harness
            .until("a running run", |harness| {
                Ok(harness
                    .runs(&key)?
                    .into_iter()
                    .find(|run| run.status == RunStatus::Running))
            })
            .await?;
    }
    // The agent stops; the runs go on. One ends (exit 5) while it is down.
    harness.stop().await?;
    let migrate = harness.containers(&job_key()).await?;
    harness.fake.exit_with(&migrate[0].id, 5);
    assert_eq!(
        harness.runs(&job_key())?[0].status,
        RunStatus::Running,
        "nobody recorded it yet"
    );
    harness.start()?;
    let runs = harness.finished_runs(&job_key(), 1).await?;
    assert_eq!(
        (runs[0].status, runs[0].exit_code),
        (RunStatus::Failed, Some(5))
    );
    // The other one still runs: the new reconciler waits for it, then records it.
    let backfill = harness.containers(&other).await?;
    assert_eq!(harness.runs(&other)?[0].status, RunStatus::Running);
    harness.fake.exit_with(&backfill[0].id, 0);
    let runs = harness.finished_runs(&other, 1).await?;
    assert_eq!(
        (runs[0].status, runs[0].exit_code),
        (RunStatus::Succeeded, Some(0))
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_job_leaving_the_repo_takes_its_runs_and_status() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("job.hcl", &job(r#"  command = ["echo", "hi"]"#))])?;
    harness.finished_runs(&job_key(), 1).await?;
    harness.push(&[])?;
    harness
        .until("the job gone", |harness| {
            let gone = harness.runs(&job_key())?.is_empty()
                && harness.status(&job_key())?.is_none()
                && harness.container_names_now(&job_key())?.is_empty();
            Ok(gone.then_some(()))
        })
        .await?;
    harness.stop().await
}

/// A harness started at 2026-01-01T10:00:30Z with one cronjob of `body`, once the cronjob
/// has its first position.
async fn first_position(body: &str) -> TestResult<(Harness, CronState)> {
    let mut harness = Harness::new()?;
    harness.start_at("2026-01-01T10:00:30Z")?;
    harness.push(&[("cron.hcl", &cronjob(body))])?;
    let state = harness
        .until("the first position", |harness| {
            harness.cron_state(&cron_key())
        })
        .await?;
    Ok((harness, state))
}

/// A zone is read from the host's database: 09:00 in New York is 14:00 UTC in January, and
/// the status shows the next run at the zone's offset then.
#[tokio::test(start_paused = true)]
async fn a_cronjob_s_time_zone_places_its_runs_and_its_status() -> TestResult {
    let (mut harness, state) = first_position(
        r#"  schedule = "0 9 * * *"
  timezone = "America/New_York"
  command = ["echo", "tick"]"#,
    )
    .await?;
    assert_eq!(state.next_run, Some(ts("2026-01-01T14:00:00Z")?));
    let status = harness.status(&cron_key())?.ok_or("status")?;
    let detail = status.detail.json();
    assert_eq!(detail["timezone"], "America/New_York");
    assert_eq!(detail["next_run"], "2026-01-01T14:00:00Z");
    assert_eq!(detail["next_run_local"], "2026-01-01T09:00:00-05:00");
    assert!(
        status
            .message
            .contains("next run 2026-01-01T09:00:00-05:00 (America/New_York)"),
        "{}",
        status.message
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_cronjob_fires_on_schedule_from_the_next_minute_on() -> TestResult {
    let (mut harness, state) = first_position(
        r#"  schedule = "* * * * *"
  command = ["echo", "tick"]"#,
    )
    .await?;
    // First sighting: the next minute, nothing fired.
    assert_eq!(state.next_run, Some(ts("2026-01-01T10:01:00Z")?));
    assert_eq!(state.last_scheduled, None);
    assert!(harness.runs(&cron_key())?.is_empty());
    let status = harness.status(&cron_key())?.ok_or("status")?;
    assert_eq!(status.phase, "Scheduled");
    assert_eq!(status.detail.json()["next_run"], "2026-01-01T10:01:00Z");
    assert_eq!(status.detail.json()["timezone"], "UTC");

    let runs = harness.finished_runs(&cron_key(), 1).await?;
    assert!(harness.clock.now() >= at("2026-01-01T10:01:00Z")?);
    assert_eq!(
        harness
            .cron_state(&cron_key())?
            .ok_or("state")?
            .last_scheduled,
        Some(ts("2026-01-01T10:01:00Z")?)
    );
    assert_eq!(runs[0].status, RunStatus::Succeeded);
    assert_eq!(runs[0].logs_tail, "tick\n");
    let containers = harness.containers(&cron_key()).await?;
    assert_eq!(containers[0].label(labels::KIND), Some("cronjob"));
    assert_eq!(containers[0].label(labels::ROLE), Some("cronjob"));

    // And again the next minute.
    harness.finished_runs(&cron_key(), 2).await?;
    assert_eq!(
        harness
            .cron_state(&cron_key())?
            .ok_or("state")?
            .last_scheduled,
        Some(ts("2026-01-01T10:02:00Z")?)
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn forbid_skips_a_tick_while_the_previous_run_is_running() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start_at("2026-01-01T10:00:30Z")?;
    harness.push(&[(
        "cron.hcl",
        &cronjob(
            r#"  schedule = "* * * * *"
  concurrency_policy = "Forbid"
  command = ["sleep", "3600"]"#,
        ),
    )])?;
    harness
        .until("the 10:01 tick running", |harness| {
            Ok(harness
                .runs(&cron_key())?
                .into_iter()
                .find(|run| run.status == RunStatus::Running))
        })
        .await?;
    let status = harness
        .until("the 10:02 tick skipped", |harness| {
            Ok(harness.status(&cron_key())?.filter(|status| {
                status.detail.json()["skipped"][0]["reason"] == "forbid"
                    && status.detail.json()["skipped"][0]["scheduled_at"] == "2026-01-01T10:02:00Z"
            }))
        })
        .await?;
    assert_eq!(status.phase, "Running");
    assert_eq!(harness.runs(&cron_key())?.len(), 1, "no overlapping run");
    let running = harness.containers(&cron_key()).await?;
    harness.fake.exit_with(&running[0].id, 0);
    // Once it ended, the next tick (10:03) runs.
    let runs = harness
        .until("the 10:03 tick", |harness| {
            let runs = harness.runs(&cron_key())?;
            Ok((runs.len() == 2).then_some(runs))
        })
        .await?;
    assert_eq!(runs[1].status, RunStatus::Succeeded);
    assert_eq!(
        harness
            .cron_state(&cron_key())?
            .ok_or("state")?
            .last_scheduled,
        Some(ts("2026-01-01T10:03:00Z")?)
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn allow_lets_ticks_overlap() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start_at("2026-01-01T10:00:30Z")?;
    harness.push(&[(
        "cron.hcl",
        &cronjob(
            r#"  schedule = "* * * * *"
  command = ["sleep", "3600"]"#,
        ),
    )])?;
    harness
        .until("two ticks running at once", |harness| {
            let running = harness
                .runs(&cron_key())?
                .into_iter()
                .filter(|run| run.status == RunStatus::Running)
                .count();
            Ok((running == 2).then_some(()))
        })
        .await?;
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_suspended_cronjob_does_not_tick() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start_at("2026-01-01T10:00:30Z")?;
    harness.push(&[(
        "cron.hcl",
        &cronjob(
            r#"  schedule = "* * * * *"
  suspend = true
  command = ["echo", "tick"]"#,
        ),
    )])?;
    let state = harness
        .until("three scheduled minutes passed", |harness| {
            Ok(harness
                .cron_state(&cron_key())?
                .filter(|state| state.last_scheduled == ts("2026-01-01T10:03:00Z").ok()))
        })
        .await?;
    assert_eq!(state.next_run, Some(ts("2026-01-01T10:04:00Z")?));
    assert!(harness.runs(&cron_key())?.is_empty());
    assert_eq!(
        harness.status(&cron_key())?.ok_or("status")?.phase,
        "Suspended"
    );
    harness.stop().await
}

/// An hourly cronjob seen at 10:00:30 (next 11:00); the agent is down until `restart_at`.
async fn after_downtime(restart_at: &str) -> TestResult<(Vec<JobRun>, CronState, ResourceStatus)> {
    let mut harness = Harness::new()?;
    harness.start_at("2026-01-01T10:00:30Z")?;
    harness.push(&[(
        "cron.hcl",
        &cronjob(
            r#"  schedule = "0 * * * *"
  command = ["echo", "tick"]"#,
        ),
    )])?;
    harness
        .until("the first position", |harness| {
            harness.cron_state(&cron_key())
        })
        .await?;
    harness.stop().await?;
    harness.start_at(restart_at)?;
    let state = harness
        .until("the position after the restart", |harness| {
            Ok(harness
                .cron_state(&cron_key())?
                .filter(|state| state.last_scheduled.is_some()))
        })
        .await?;
    let status = harness
        .until("the missed ticks recorded", |harness| {
            Ok(harness
                .status(&cron_key())?
                .filter(|status| status.detail.json()["skipped"][0]["reason"] == "missed")
                .filter(|status| status.running_replicas == 0))
        })
        .await?;
    let runs = harness.runs(&cron_key())?;
    harness.stop().await?;
    Ok((runs, state, status))
}

#[tokio::test(start_paused = true)]
async fn missed_ticks_inside_the_catch_up_window_run_once() -> TestResult {
    // Down from 10:00:30 to 13:10: 11:00, 12:00 and 13:00 passed; 13:00 is 10 min old.
    let (runs, state, status) = after_downtime("2026-01-01T13:10:00Z").await?;
    assert_eq!(runs.len(), 1, "one run, not three");
    assert_eq!(state.last_scheduled, Some(ts("2026-01-01T13:00:00Z")?));
    assert_eq!(state.next_run, Some(ts("2026-01-01T14:00:00Z")?));
    let missed = &status.detail.json()["skipped"][0];
    assert_eq!(missed["n_times"], 2);
    assert_eq!(missed["first"], "2026-01-01T11:00:00Z");
    assert_eq!(missed["last"], "2026-01-01T12:00:00Z");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn missed_ticks_outside_the_catch_up_window_are_only_reported() -> TestResult {
    // Down until 13:20: 13:00 is 20 min old, past the default 15 min window.
    let (runs, state, status) = after_downtime("2026-01-01T13:20:00Z").await?;
    assert!(runs.is_empty());
    assert_eq!(state.next_run, Some(ts("2026-01-01T14:00:00Z")?));
    assert_eq!(status.detail.json()["skipped"][0]["n_times"], 3);
    assert_eq!(
        status.detail.json()["skipped"][0]["last"],
        "2026-01-01T13:00:00Z"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_cronjob_leaving_the_repo_takes_its_runs_position_and_status() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start_at("2026-01-01T10:00:30Z")?;
    harness.push(&[(
        "cron.hcl",
        &cronjob(
            r#"  schedule = "* * * * *"
  command = ["sleep", "3600"]"#,
        ),
    )])?;
    harness
        .until("a tick running", |harness| {
            Ok(harness.runs(&cron_key())?.first().cloned())
        })
        .await?;
    harness.push(&[])?;
    harness
        .until("the cronjob gone", |harness| {
            let gone = harness.runs(&cron_key())?.is_empty()
                && harness.status(&cron_key())?.is_none()
                && harness.cron_state(&cron_key())?.is_none()
                && harness.container_names_now(&cron_key())?.is_empty();
            Ok(gone.then_some(()))
        })
        .await?;
    // No tick fires afterwards.
    harness.idle_for(Duration::from_secs(180)).await;
    assert!(harness.runs(&cron_key())?.is_empty());
    harness.stop().await
}

/// Issue 11, bug 2: a registry, ingress, job or cronjob deleted by a commit that landed while
/// the reconciler was not running kept its status row (and job history, cron position)
/// forever, because boot replay covered only desired keys and keys with containers.
#[tokio::test(start_paused = true)]
async fn a_resource_deleted_while_the_agent_was_down_leaves_no_ghost_state() -> TestResult {
    let web = r#"deployment "shop" "web" {
  image   = "busybox"
  command = ["sleep", "3600"]
}
"#;
    let others = r#"registry "ghcr" {
  url      = "ghcr.io"
  username = "deploy-bot"
  token    = "s3cret"
}
ingress "shop" "web" {
  host = "shop.test"
  port = 8080
}
"#;
    let registry_key = ResourceKey::new(Kind::Registry, "", "ghcr");
    let ingress_key = ResourceKey::new(Kind::Ingress, "shop", "web");
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[
        ("web.hcl", web),
        ("others.hcl", others),
        ("job.hcl", &job(r#"  command = ["sh", "-c", "echo once"]"#)),
        (
            "cron.hcl",
            &cronjob(
                r#"  schedule = "* * * * *"
  command = ["sh", "-c", "echo tick"]"#,
            ),
        ),
    ])?;
    harness.finished_runs(&job_key(), 1).await?;
    harness.finished_runs(&cron_key(), 1).await?;
    harness
        .until("registry and ingress statuses", |harness| {
            let both =
                harness.status(&registry_key)?.is_some() && harness.status(&ingress_key)?.is_some();
            Ok(both.then_some(()))
        })
        .await?;
    assert!(harness.cron_state(&cron_key())?.is_some());
    harness.stop().await?;
    // While the agent is down, everything but the deployment leaves the repo.
    harness.push(&[("web.hcl", web)])?;
    harness.start()?;
    harness
        .until("no ghost of the deleted resources", |harness| {
            let gone = [&registry_key, &ingress_key, &job_key(), &cron_key()]
                .into_iter()
                .map(|key| harness.status(key))
                .collect::<TestResult<Vec<_>>>()?
                .iter()
                .all(Option::is_none)
                && harness.runs(&job_key())?.is_empty()
                && harness.runs(&cron_key())?.is_empty()
                && harness.cron_state(&cron_key())?.is_none();
            Ok(gone.then_some(()))
        })
        .await?;
    let web_key = ResourceKey::new(Kind::Deployment, "shop", "web");
    let keys: Vec<ResourceKey> = harness
        .store
        .statuses()?
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(keys, [web_key], "only the deployment's status is left");
    harness.stop().await
}
