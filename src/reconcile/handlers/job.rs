//! Job handler (spec §2.5, §7.9): a job runs to completion once per spec hash; and the run
//! procedure cronjob ticks share (`start_run`, `settle_runs`, `keep_history`, `remove_all`).
//!
//! A run is a container `<scope>-<name>.<runid>` (runid 4 hex; under Docker Swarm a
//! `replicated-job` service, `swarm/runs.rs`, with the same record and waiter), labelled as voodu labels job
//! runs (`voodu.kind=job` or `cronjob`, `voodu.replica_id=<runid>`, no DNS alias, no restart
//! policy) plus `voodu.spec_hash`, on the job's networks (`voodu0` appended in bridge mode),
//! with the merged environment without identity variables (voodu gives job containers no
//! `-e`), asset references resolved, and each `job_runs` row keeps its exit code, times,
//! error and the last `LOG_LINES` lines of its output.
//!
//! Invariants:
//! - a handler never waits for a run: it starts the container, records the run `running`
//!   (after the create, before the start), hands it to a waiter on `ctx.runs` and returns;
//!   the waiter finishes the record (exit code, or "timed out after …" once `timeout` passed)
//!   and requeues the key, whose handler removes the container of a run that ended while it
//!   still runs (a timeout) and trims the history: waiters never change containers;
//! - a run the store says is running and no waiter of this process watches (the agent was
//!   restarted) is picked up by the next reconcile of its key: finished at once when its
//!   container is gone, started when it was only created, otherwise given a waiter with what
//!   is left of its timeout; so every run ends up finished, exactly once;
//! - a job runs when no run of its desired spec hash has happened since that hash became
//!   desired (the newest run has another hash, or there is none), and never while another of
//!   its runs is running: a spec changed mid-run runs once that run ended;
//! - history keeps the newest `successful_history_limit` succeeded and
//!   `failed_history_limit` failed runs (running ones always); containers of the runs kept
//!   stay (`docker logs` works), every other run container of the resource is removed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::Handler;
use super::container::{Identity, Launch};
use super::launch::EnvSource;
use super::oneshot::{self, End, OneShot};
use crate::base::rfc3339_seconds;
use crate::manifest::spec::JobSpec;
use crate::model::{ResourceKey, parse_go_duration, random_hex};
use crate::reconcile::{
    context::Ctx, context::blocking, error::Error, error::Result, run::action::Action,
};
use crate::runtime::{Container, ContainerState, Runtime, labels};
use crate::store::{
    Desired, Detail, FailureReason, JobDetail, JobRun, Phase, ResourceStatus, RunDetail, RunStatus,
    now_unix,
};

/// Lines of a run's output kept with its history entry.
pub(super) const LOG_LINES: usize = 50;
/// At most this many bytes of those lines (their end) are kept.
const LOG_BYTES: usize = 16 * 1024;

/// What the job handler does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum JobStep {
    /// A run is still running (`run_id`); a newer spec runs once it ended.
    Wait { run_id: String },
    /// No run of the desired spec hash since it became desired: start one.
    Run,
    /// The newest run is of the desired spec hash.
    Done,
}

/// Decides from the runs (newest first) and the desired spec hash.
pub(super) fn plan_job(runs: &[JobRun], spec_hash: &str) -> JobStep {
    if let Some(running) = runs.iter().find(|run| run.status == RunStatus::Running) {
        return JobStep::Wait {
            run_id: running.run_id.clone(),
        };
    }
    match runs.first() {
        Some(newest) if newest.spec_hash == spec_hash => JobStep::Done,
        _ => JobStep::Run,
    }
}

impl Handler for JobSpec {
    /// One pass; a run in flight is `Action::Done` too: its waiter requeues the key when it ends.
    async fn reconcile<R: Runtime>(ctx: &Arc<Ctx<R>>, key: &ResourceKey) -> Result<Action> {
        let Some(desired) = super::desired_or_remove(ctx, key, remove_all(ctx, key)).await? else {
            return Ok(Action::Done);
        };
        let spec = spec_of!(key, desired, Job);
        super::engine::refuse_gaps(ctx, key, &desired.spec)?;
        let timeout = run_timeout(&spec.timeout);
        let actual = list_runs(ctx, key).await?;
        settle_runs(ctx, key, &actual, timeout).await?;
        let runs = job_runs(ctx, key).await?;
        let result = match plan_job(&runs, desired.spec_hash.as_str()) {
            JobStep::Run => {
                let taken = taken_names(&actual, &runs);
                start_run(ctx, key, spec, desired.spec_hash.as_str(), timeout, &taken)
                    .await
                    .map(|_| ())
            }
            JobStep::Wait { .. } | JobStep::Done => Ok(()),
        };
        keep_history(ctx, key, spec.successful_history(), spec.failed_history()).await?;
        let runs = job_runs(ctx, key).await?;
        let status = job_status(key, &desired, spec, &runs, result.as_ref().err());
        let key_for_store = key.clone();
        blocking(&ctx.store, move |store| {
            store.put_status(&key_for_store, &status)
        })
        .await?;
        result.map(|()| Action::Done)
    }
}

/// The job's status: the newest run of its desired spec decides the phase.
fn job_status(
    key: &ResourceKey,
    desired: &Desired,
    spec: &JobSpec,
    runs: &[JobRun],
    error: Option<&Error>,
) -> ResourceStatus {
    let n_running = running(runs);
    let current = runs
        .iter()
        .find(|run| run.spec_hash == desired.spec_hash.as_str());
    let (phase, message) = match (error, current) {
        // The error policy then makes it `Failed` unless it is retried.
        (Some(error), _) => (Phase::Pending, error.to_string()),
        (None, Some(run)) => run_phase(run),
        (None, None) if n_running > 0 => (
            Phase::Running,
            "a run of the previous spec is still running; the new spec runs once it ended"
                .to_owned(),
        ),
        (None, None) => (Phase::Pending, String::new()),
    };
    let detail = Detail::Job(JobDetail {
        image: spec.container.effective_image(key),
        timeout: spec.timeout.clone(),
        last_run: runs.first().map(run_view),
        history: runs.iter().map(run_view).collect(),
    });
    runs_status(desired, (phase, message), error, n_running, detail)
}

/// How many of `runs` are running.
pub(super) fn running(runs: &[JobRun]) -> usize {
    runs.iter()
        .filter(|run| run.status == RunStatus::Running)
        .count()
}

/// A job's or cronjob's status: its `phase` and `message`, why it is so (the pass's `error`,
/// else a failed run), its `n_running` runs and its `detail`.
pub(super) fn runs_status(
    desired: &Desired,
    (phase, message): (Phase, String),
    error: Option<&Error>,
    n_running: usize,
    detail: Detail,
) -> ResourceStatus {
    let reason = match error {
        Some(error) => Some(error.reason()),
        None => (phase == Phase::Failed).then_some(FailureReason::RunFailed),
    };
    ResourceStatus {
        phase,
        reason,
        message,
        desired_replicas: desired.n_replicas,
        running_replicas: n_running,
        spec_hash: desired.spec_hash.to_string(),
        release_id: None,
        updated_at: now_unix(),
        detail,
    }
}

/// The phase and message a run gives its resource.
pub(super) fn run_phase(run: &JobRun) -> (Phase, String) {
    match run.status {
        RunStatus::Running => (
            Phase::Running,
            format!(
                "run {} running since {}",
                run.run_id,
                rfc3339_seconds(run.started_at)
            ),
        ),
        RunStatus::Succeeded => (
            Phase::Succeeded,
            format!(
                "run {} succeeded in {}s",
                run.run_id,
                run.ended_at.unwrap_or(run.started_at) - run.started_at
            ),
        ),
        RunStatus::Failed => (
            Phase::Failed,
            format!("run {} failed: {}", run.run_id, run.error),
        ),
    }
}

/// One history entry of `status --json`.
pub(super) fn run_view(run: &JobRun) -> RunDetail {
    RunDetail {
        run_id: run.run_id.clone(),
        container: run.container.clone(),
        spec_hash: run.spec_hash.clone(),
        status: run.status.as_str().to_owned(),
        exit_code: run.exit_code,
        started_at: rfc3339_seconds(run.started_at),
        ended_at: run.ended_at.map(rfc3339_seconds),
        duration_seconds: run.ended_at.map(|ended| ended - run.started_at),
        error: run.error.clone(),
        logs_tail: run.logs_tail.clone(),
    }
}

/// A job's `timeout` (`None`: no deadline).
pub(super) fn run_timeout(timeout: &str) -> Option<Duration> {
    parse_go_duration(timeout).filter(|timeout| !timeout.is_zero())
}

/// This agent's run containers of the resource (labelled with the resource's kind as role,
/// as replicas are); under Swarm, its runs' services.
pub(super) async fn list_runs<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<Vec<Container>> {
    super::engine::units::list_runs(ctx, key).await
}

/// The resource's runs, newest first.
pub(super) async fn job_runs<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<Vec<JobRun>> {
    let key = key.clone();
    blocking(&ctx.store, move |store| store.job_runs(&key)).await
}

/// Container names a new run must not take.
pub(super) fn taken_names(actual: &[Container], runs: &[JobRun]) -> BTreeSet<String> {
    actual
        .iter()
        .map(|container| container.name.clone())
        .chain(runs.iter().map(|run| run.container.clone()))
        .collect()
}

/// Starts one run of `job` for the resource `key` (a job, or a cronjob tick) and hands it to
/// a waiter; returns its run id. A run whose container cannot start is recorded as failed
/// (that is its outcome); what fails before the run exists (environment, image, network,
/// create) is the handler's error.
pub(super) async fn start_run<R: Runtime>(
    ctx: &Arc<Ctx<R>>,
    key: &ResourceKey,
    job: &JobSpec,
    spec_hash: &str,
    timeout: Option<Duration>,
    taken: &BTreeSet<String>,
) -> Result<String> {
    let env_source = EnvSource::load(ctx, key, &job.container).await?;
    // voodu gives job containers no `-e`: no VOODU_SCOPE / VOODU_NAME.
    let (env, env_digest) = env_source.env(ctx, key, &job.container, Vec::new())?;
    super::engine::units::prepare_run(ctx, key, &job.container).await?;
    // Every run of one spec runs the bytes its first run resolved (a cron tick after the tag
    // moved too); a spec change resolves anew.
    let images = super::launch::images_of(key, &job.container, &[], &ctx.assets_root);
    let pins = crate::reconcile::handlers::pins::of_spec(ctx, key, spec_hash, &images).await?;
    let (run_id, name) = loop {
        let run_id = random_hex(2);
        let name = format!("{}.{run_id}", key.app_id());
        if !taken.contains(&name) {
            break (run_id, name);
        }
    };
    let identity = Identity {
        name: name.clone(),
        kind: key.kind,
        role: key.kind.as_str().to_owned(),
        name_label: key.name.clone(),
        replica_id: run_id.clone(),
        ordinal: None,
        spec_hash: None,
        release_id: None,
        aliases: Vec::new(),
    };
    let launch = Launch {
        env,
        env_digest,
        restart: String::new(),
        default_ulimits: ctx.default_ulimits.clone(),
        pins,
        ..Launch::default()
    };
    // Created, recorded, then started: a run whose unit exists is always in the record.
    let run = OneShot {
        identity,
        container: &job.container,
        launch,
        spec_hash,
        asset_digests: &job.asset_digests,
        labels: BTreeMap::from([(labels::SPEC_HASH.to_owned(), spec_hash.to_owned())]),
        // The waiter below holds the job's own timeout (`None`: no deadline).
        timeout: Duration::ZERO,
    };
    let id = super::engine::units::create_unit(ctx, key, &run).await?;
    let row = {
        let key = key.clone();
        let run_id = run_id.clone();
        let spec_hash = spec_hash.to_owned();
        let name = name.clone();
        blocking(&ctx.store, move |store| {
            store.begin_job_run(&key, &run_id, &spec_hash, &name)
        })
        .await?
    };
    let run = RunRef {
        row,
        container_id: id,
        container: name,
    };
    if !start_container(ctx, key, &run).await? {
        return Ok(run_id);
    }
    tracing::info!(%key, container = %run.container, "run started");
    watch(ctx, key, run, timeout, timeout);
    Ok(run_id)
}

/// A run being watched.
#[derive(Debug, Clone)]
struct RunRef {
    /// `job_runs` row id.
    row: i64,
    container_id: String,
    container: String,
}

/// How a run ended, as recorded.
struct Ended {
    status: RunStatus,
    exit_code: Option<i64>,
    error: String,
    logs: String,
    at: i64,
}

impl Ended {
    /// A run that failed now, without an exit code or output.
    fn failed(error: String) -> Ended {
        Ended {
            status: RunStatus::Failed,
            exit_code: None,
            error,
            logs: String::new(),
            at: now_unix(),
        }
    }
}

/// Starts a recorded run's container; when the engine refuses, removes it and records the run
/// failed. Whether it started.
async fn start_container<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    run: &RunRef,
) -> Result<bool> {
    let Err(error) = super::engine::units::start_unit(ctx, &run.container_id).await else {
        return Ok(true);
    };
    tracing::warn!(%key, container = %run.container, %error, "run could not start");
    let _ = oneshot::remove(ctx, key, &run.container_id).await;
    let error = format!("cannot start {}: {error}", run.container);
    finish_record(ctx, run, Ended::failed(error)).await?;
    Ok(false)
}

/// Runs the store says are running but that no waiter of this process watches (the agent
/// was restarted, or stopped their waiters at shutdown): a run whose container is gone is
/// finished as failed, one whose container was only created is started, and every other one
/// gets a waiter with what is left of `timeout` (one that already exited is finished by its
/// waiter at once).
pub(super) async fn settle_runs<R: Runtime>(
    ctx: &Arc<Ctx<R>>,
    key: &ResourceKey,
    actual: &[Container],
    timeout: Option<Duration>,
) -> Result<()> {
    // Read before the store: a waiter detaches only after finishing its record, so a run
    // still `running` below whose unit is not attached here has no waiter.
    let attached = ctx.runs.attached();
    let runs = job_runs(ctx, key).await?;
    // A run its record says has ended (its waiter saw the timeout pass) whose container still
    // runs: the handler, holding the key, stops and removes it; waiters only record and
    // requeue.
    for run in runs.iter().filter(|run| run.status != RunStatus::Running) {
        if let Some(container) = actual.iter().find(|container| {
            container.name == run.container && container.state == ContainerState::Running
        }) {
            tracing::info!(%key, container = %run.container, "removing the container of a run that ended (timed out)");
            oneshot::remove(ctx, key, &container.id).await?;
        }
    }
    for run in runs.iter().filter(|run| run.status == RunStatus::Running) {
        let Some(container) = actual
            .iter()
            .find(|container| container.name == run.container)
        else {
            // Only the first end of a run counts: a waiter that saw its unit go records
            // nothing more.
            tracing::warn!(%key, container = %run.container, "a running run's container is gone; recording it as failed");
            let run_ref = RunRef {
                row: run.id,
                container_id: String::new(),
                container: run.container.clone(),
            };
            finish_record(
                ctx,
                &run_ref,
                Ended::failed(
                    "its container was gone when the agent looked again (removed while the agent was not running?)".to_owned(),
                ),
            )
            .await?;
            continue;
        };
        if attached.contains(&container.id) {
            continue;
        }
        let run_ref = RunRef {
            row: run.id,
            container_id: container.id.clone(),
            container: run.container.clone(),
        };
        // The agent stopped between recording the run and starting it.
        if container.state == ContainerState::Created
            && !start_container(ctx, key, &run_ref).await?
        {
            continue;
        }
        // A run that already exited is recorded as it ended, even if its timeout passed
        // since; otherwise it has what is left of its timeout.
        let elapsed = Duration::from_secs(u64::try_from(now_unix() - run.started_at).unwrap_or(0));
        let remaining = timeout
            .filter(|_| container.state != ContainerState::Exited)
            .map(|timeout| timeout.saturating_sub(elapsed));
        tracing::info!(%key, container = %run.container, "watching a run that was running before");
        watch(ctx, key, run_ref, remaining, timeout);
    }
    Ok(())
}

/// Hands `run` to a waiter on `ctx.runs` (unless one has it already).
fn watch<R: Runtime>(
    ctx: &Arc<Ctx<R>>,
    key: &ResourceKey,
    run: RunRef,
    remaining: Option<Duration>,
    timeout: Option<Duration>,
) {
    let id = run.container_id.clone();
    let waiter = wait_for_run(ctx.clone(), key.clone(), run, remaining, timeout);
    ctx.runs.attach(&id, waiter);
}

/// The waiter: the one wait of every run (`oneshot::wait_end`), then it finishes the record,
/// detaches, and requeues the key. At shutdown it leaves the run `running` (the container
/// goes on) for the next start of the agent to pick up.
async fn wait_for_run<R: Runtime>(
    ctx: Arc<Ctx<R>>,
    key: ResourceKey,
    run: RunRef,
    remaining: Option<Duration>,
    timeout: Option<Duration>,
) {
    let ended = oneshot::wait_end(
        ctx.runtime.as_ref(),
        ctx.options.engine,
        &ctx.timer,
        &run.container_id,
        remaining,
        &ctx.shutdown,
    )
    .await;
    let Some(end) = ended else {
        ctx.runs.detach(&run.container_id);
        return;
    };
    if let Err(error) = finish_watched(&ctx, &key, &run, end, timeout).await {
        tracing::warn!(%key, container = %run.container, %error, "cannot record how a run ended; the next reconcile looks again");
    }
    ctx.runs.detach(&run.container_id);
    ctx.timer.requeue(key);
}

async fn finish_watched<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    run: &RunRef,
    end: End,
    timeout: Option<Duration>,
) -> Result<()> {
    let logs = logs_tail(ctx, &run.container_id).await;
    let ended = match end {
        End::Exited(code) => Ended {
            status: if code == 0 {
                RunStatus::Succeeded
            } else {
                RunStatus::Failed
            },
            exit_code: Some(code),
            error: if code == 0 {
                String::new()
            } else {
                format!("exit code {code}")
            },
            logs,
            at: super::engine::units::finished_at(ctx, &run.container_id)
                .await
                .unwrap_or_else(now_unix),
        },
        End::TimedOut => {
            // Recorded here; the container is removed by the next pass of the key (the
            // waiter's requeue), which holds the key (`settle_runs`).
            let at = now_unix();
            Ended {
                status: RunStatus::Failed,
                exit_code: None,
                error: format!(
                    "timed out after {}",
                    humantime::format_duration(timeout.unwrap_or_default())
                ),
                logs,
                at,
            }
        }
        End::Vanished(error) => Ended {
            status: RunStatus::Failed,
            exit_code: None,
            error: format!("its container went away before it ended: {error}"),
            logs,
            at: now_unix(),
        },
    };
    let status = ended.status;
    let error = ended.error.clone();
    if finish_record(ctx, run, ended).await? {
        match status {
            RunStatus::Succeeded => {
                tracing::info!(%key, container = %run.container, "run succeeded")
            }
            _ => tracing::warn!(%key, container = %run.container, %error, "run failed"),
        }
    }
    Ok(())
}

/// Writes a run's end (only the first end of a run counts); true when this call wrote it.
async fn finish_record<R: Runtime>(ctx: &Ctx<R>, run: &RunRef, ended: Ended) -> Result<bool> {
    let row = run.row;
    blocking(&ctx.store, move |store| {
        store.finish_job_run(
            row,
            ended.status,
            ended.exit_code,
            &ended.error,
            &ended.logs,
            ended.at,
        )
    })
    .await
}

/// The last `LOG_LINES` lines of a container's output, at most `LOG_BYTES` (their end);
/// empty when the engine cannot say.
async fn logs_tail<R: Runtime>(ctx: &Ctx<R>, id: &str) -> String {
    let text = super::engine::units::logs(ctx, id, LOG_LINES).await;
    if text.len() <= LOG_BYTES {
        return text;
    }
    let mut start = text.len() - LOG_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

/// Trims the history to the limits and removes every run container of the resource that
/// belongs to no run kept (trimmed runs, and containers left by an agent stopped between
/// creating a run's container and recording the run).
pub(super) async fn keep_history<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    keep_succeeded: usize,
    keep_failed: usize,
) -> Result<()> {
    let kept: BTreeSet<String> = {
        let key = key.clone();
        blocking(&ctx.store, move |store| {
            store.trim_job_runs(&key, keep_succeeded, keep_failed)?;
            Ok(store
                .job_runs(&key)?
                .into_iter()
                .map(|run| run.container)
                .collect())
        })
        .await?
    };
    for container in list_runs(ctx, key).await? {
        if kept.contains(&container.name) {
            continue;
        }
        tracing::info!(%key, container = %container.name, "removing a run container no longer in the history");
        oneshot::remove(ctx, key, &container.id).await?;
    }
    Ok(())
}

/// The job or cronjob left the repo: its run containers, run records, schedule position and
/// status go.
pub(super) async fn remove_all<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<()> {
    for container in list_runs(ctx, key).await? {
        tracing::info!(%key, container = %container.name, "removing: resource left the repo");
        oneshot::remove(ctx, key, &container.id).await?;
    }
    let key_for_store = key.clone();
    blocking(&ctx.store, move |store| {
        store.delete_job_runs(&key_for_store)?;
        if key_for_store.kind == crate::model::Kind::Cronjob {
            store.delete_cron_state(&key_for_store.scope, &key_for_store.name)?;
        }
        store.delete_status(&key_for_store)
    })
    .await?;
    if key.kind == crate::model::Kind::Cronjob {
        ctx.runs.cron().set(key, None);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    fn run(id: i64, hash: &str, status: RunStatus) -> JobRun {
        JobRun {
            id,
            key: ResourceKey::new(Kind::Job, "ops", "migrate"),
            run_id: format!("{id:04x}"),
            spec_hash: hash.to_owned(),
            container: format!("ops-migrate.{id:04x}"),
            started_at: 100 * id,
            ended_at: (status != RunStatus::Running).then_some(100 * id + 7),
            exit_code: match status {
                RunStatus::Succeeded => Some(0),
                RunStatus::Failed => Some(1),
                RunStatus::Running => None,
            },
            status,
            error: String::new(),
            logs_tail: String::new(),
        }
    }

    #[test]
    fn a_job_runs_once_per_spec_hash_and_never_overlaps() {
        use RunStatus::{Failed, Running, Succeeded};
        let cases: &[(&[JobRun], JobStep)] = &[
            (&[], JobStep::Run),
            (&[run(1, "h1", Succeeded)], JobStep::Done),
            (&[run(1, "h1", Failed)], JobStep::Done),
            (
                &[run(2, "h0", Succeeded), run(1, "h1", Succeeded)],
                JobStep::Run,
            ),
            (
                &[run(1, "h0", Running)],
                JobStep::Wait {
                    run_id: "0001".into(),
                },
            ),
            (
                &[run(1, "h1", Running)],
                JobStep::Wait {
                    run_id: "0001".into(),
                },
            ),
            // A revert to a spec that ran before runs it again.
            (
                &[run(3, "h0", Succeeded), run(2, "h1", Succeeded)],
                JobStep::Run,
            ),
        ];
        for (runs, expected) in cases {
            assert_eq!(&plan_job(runs, "h1"), expected, "{runs:?}");
        }
    }

    #[test]
    fn a_run_gives_its_phase_and_view() {
        let succeeded = run(2, "h1", RunStatus::Succeeded);
        assert_eq!(
            run_phase(&succeeded),
            (Phase::Succeeded, "run 0002 succeeded in 7s".to_owned())
        );
        let mut failed = run(3, "h1", RunStatus::Failed);
        failed.error = "exit code 1".into();
        assert_eq!(
            run_phase(&failed),
            (Phase::Failed, "run 0003 failed: exit code 1".to_owned())
        );
        let view = run_view(&failed);
        assert_eq!(view.exit_code, Some(1));
        assert_eq!(view.duration_seconds, Some(7));
        assert_eq!(view.started_at, "1970-01-01T00:05:00Z");
        assert_eq!(view.status, "failed");
    }

    #[test]
    fn timeouts_parse_as_go_durations() {
        assert_eq!(run_timeout("90s"), Some(Duration::from_secs(90)));
        assert_eq!(run_timeout("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(run_timeout(""), None);
        assert_eq!(run_timeout("0"), None);
    }
}
