//! The data runs (`backup {}`) of a statefulset's claims or a deployment's named volume:
//! backups, restores and verifies, moved on by the resource's own passes, one step per pass,
//! through the one run mechanism.
//!
//! A run is a row of the store (`store::DataRun`: asked for by the schedule, a release with
//! `before_release`, `backup`, `restore` or `rollback --with-data`). The pass holding the key
//! takes the oldest open run, step by step (`Subject`): a statefulset's pods one ordinal at a
//! time, each with its claims; a deployment's replicas together, with the one named volume
//! they share. At each step:
//! - `stop` mode: stops its pods, snapshots the volumes, starts them, and goes on once they
//!   are Ready again; `live`: snapshots the volumes of running pods (crash-consistent only);
//!   `exec`: runs the dump command in a running pod and snapshots its output stream;
//! - a restore stops and removes the pods, restores the volumes (the old contents kept beside
//!   them until every pod is Ready again) or feeds the dump to the restore command, and lets
//!   the pass create the pods again from the current spec.
//!
//! The restic work of a step is a unit (`Units`): a task on the run mechanism's tracker that
//! the pass starts and never waits for; its end records its outcome and queues the key.
//!
//! Invariants: a worker is never held by restic (a pass returns while a unit runs); while a
//! run is at a pod, the pass does nothing else to the resource (no start, create or rollout
//! step can race the backup); a snapshot is recorded only from a unit that finished (a unit
//! cut by the agent's end kills restic, which then records nothing, and the next start runs
//! the step again); an exec backup whose command failed is never a snapshot (restic is cut
//! before it sees the end of the stream); the repository's password is only ever a file
//! path handed to restic.

mod work;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::replicas::Observed;
use crate::base::lock;
use crate::manifest::spec::{Backup, BackupMode};
use crate::model::ResourceKey;
use crate::model::names::claim_volume;
use crate::reconcile::plan::pod_ordinal;
use crate::reconcile::{context::Ctx, context::blocking, error::Result, run::action::Action};
use crate::restic::{self, Repo};
use crate::runtime::{Container, ContainerState, Runtime};
use crate::store::{DataReason, DataRun, DataState, DataWhat, NewDataRun, Release, now_unix};
use work::Work;

/// How often a pass looks again while a pod it started after its backup becomes Ready (its
/// readiness also queues a pass).
const READY_LOOK: Duration = Duration::from_secs(2);
/// How long after a failed `before_release` backup the held release tries another.
const RETRY_HELD: Duration = Duration::from_secs(60);
/// How long a stopped pod may take to stop before its backup is given up.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// The bytes between an exec's output and restic's input.
const PIPE_BYTES: usize = 64 * 1024;

/// What the data runs ask of the rest of the pass.
pub(super) enum Gate {
    /// Nothing: the pass goes on.
    Open,
    /// The pass ends here with `action`; status says `message`, and `failed` when a release
    /// is held by a failed backup.
    Hold {
        action: Action,
        message: String,
        failed: bool,
    },
}

/// What a backup reads and which containers it touches.
pub(super) enum Subject<'a> {
    /// A statefulset: pods by ordinal, each with its own claim volumes, taken one at a time.
    Pods {
        replicas: usize,
        claims: Vec<&'a str>,
    },
    /// A deployment: its replicas share one named volume, taken together as one step.
    Shared { volume: &'a str },
}

/// What a unit did.
#[derive(Debug, Clone)]
struct Done {
    /// Snapshot ids by volume (or dump name).
    snapshots: BTreeMap<String, String>,
    bytes: u64,
}

/// Outcomes of the units that ended in this process, by unit id, until a pass reads them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Units {
    ended: Arc<Mutex<BTreeMap<String, std::result::Result<Done, String>>>>,
}

impl Units {
    fn take(&self, id: &str) -> Option<std::result::Result<Done, String>> {
        lock(&self.ended).remove(id)
    }

    fn put(&self, id: &str, outcome: std::result::Result<Done, String>) {
        lock(&self.ended).insert(id.to_owned(), outcome);
    }
}

/// The restic repository of `backup`.
fn repo(backup: &Backup) -> Repo {
    Repo {
        repository: backup.repository.clone(),
        password_file: PathBuf::from(&backup.password_file),
    }
}

/// The tags every snapshot of `key` carries, and the one naming what it holds: retention and
/// lookups group by them.
fn tags(key: &ResourceKey, holds: &str) -> Vec<String> {
    vec![
        format!("voodu.resource={key}"),
        format!("voodu.holds={holds}"),
    ]
}

/// The dump a pod's exec backup is stored as.
fn dump_name(key: &ResourceKey, ordinal: i64) -> String {
    format!("{}-{ordinal}.dump", key.app_id())
}

/// Where the old contents of a restored claim wait until the pods are Ready again.
fn aside(path: &Path, run: i64) -> PathBuf {
    path.with_file_name(format!("_data.voodu-before-{run}"))
}

/// The data runs' part of a pass of statefulset `key`: asks for the backup a release with
/// `before_release` needs, then moves the oldest open run on by one step.
pub(super) async fn gate<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    (backup, subject): (&Backup, Subject<'_>),
    release: &Release,
    rolling_out: bool,
    observed: &Observed,
) -> Result<Gate> {
    let owner = key.clone();
    let open = blocking(&ctx.store, move |store| store.open_data_run(&owner)).await?;
    if rolling_out
        && backup.before_release
        && open.is_none()
        && let Some(hold) = before_release(ctx, key, release).await?
    {
        return Ok(hold);
    }
    let Some(run) = open else {
        return Ok(Gate::Open);
    };
    Step {
        ctx,
        key,
        subject,
        backup,
        run,
        observed,
    }
    .next()
    .await
}

/// A release with `before_release` about to replace a pod: held until its backup succeeded
/// (asked for now, or again [`RETRY_HELD`] after it failed); `None` once it did.
async fn before_release<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    release: &Release,
) -> Result<Option<Gate>> {
    let release_id = release.id;
    let taken = blocking(&ctx.store, move |store| store.release_backup(release_id)).await?;
    let wait = match &taken {
        Some(run) if run.state == DataState::Succeeded => return Ok(None),
        Some(run) => {
            let since = now_unix() - run.ended_at.unwrap_or(0);
            RETRY_HELD.saturating_sub(Duration::from_secs(since.max(0).unsigned_abs()))
        }
        None => Duration::ZERO,
    };
    if let Some(failed) = taken.filter(|_| !wait.is_zero()) {
        return Ok(Some(Gate::Hold {
            action: Action::RequeueAfter(wait),
            message: format!(
                "release #{release_id} held: its before_release backup failed ({}); nothing was replaced; trying again in {}s",
                failed.message,
                wait.as_secs()
            ),
            failed: true,
        }));
    }
    request(ctx, key, DataReason::BeforeRelease, Some(release_id)).await?;
    Ok(Some(Gate::Hold {
        action: Action::RequeueAfter(Duration::ZERO),
        message: format!("release #{release_id}: taking its before_release backup"),
        failed: false,
    }))
}

/// Asks for a backup of `key`.
async fn request<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    reason: DataReason,
    release_id: Option<i64>,
) -> Result<i64> {
    let owner = key.clone();
    blocking(&ctx.store, move |store| {
        store.request_data_run(
            &owner,
            &NewDataRun {
                what: DataWhat::Backup,
                reason,
                release_id,
                only_ordinal: None,
                snapshots: BTreeMap::new(),
            },
        )
    })
    .await
}

/// One step of one run.
struct Step<'a, R: Runtime> {
    ctx: &'a Ctx<R>,
    key: &'a ResourceKey,
    subject: Subject<'a>,
    backup: &'a Backup,
    run: DataRun,
    observed: &'a Observed,
}

impl<R: Runtime> Step<'_, R> {
    /// The steps the run takes, in order: a statefulset's ordinals (or the one restored), a
    /// deployment's one step.
    fn ordinals(&self) -> Vec<i64> {
        match (&self.subject, self.run.what, self.run.only_ordinal) {
            // A verify reads the repository only: one unit.
            (_, DataWhat::Verify, _) | (Subject::Shared { .. }, _, _) => vec![0],
            (Subject::Pods { .. }, _, Some(only)) => vec![only],
            (Subject::Pods { replicas, .. }, _, None) => {
                (0..i64::try_from(*replicas).unwrap_or(1)).collect()
            }
        }
    }

    /// The containers step `ordinal` touches: a statefulset's pod, or every replica of a
    /// deployment.
    fn pods(&self, ordinal: i64) -> Vec<Container> {
        self.observed
            .actual
            .iter()
            .filter(|container| match self.subject {
                Subject::Shared { .. } => true,
                Subject::Pods { .. } => {
                    pod_ordinal(container).and_then(|found| i64::try_from(found).ok())
                        == Some(ordinal)
                }
            })
            .cloned()
            .collect()
    }

    /// The volumes step `ordinal` reads or restores.
    fn volumes(&self, ordinal: i64) -> Vec<String> {
        match &self.subject {
            Subject::Pods { claims, .. } => {
                let ordinal = usize::try_from(ordinal).unwrap_or(0);
                claims
                    .iter()
                    .map(|claim| claim_volume(self.key, claim, ordinal))
                    .collect()
            }
            Subject::Shared { volume } => vec![(*volume).to_owned()],
        }
    }

    /// Whether every container of step `ordinal` runs and is Ready (and there is one).
    fn all_ready(&self, ordinal: i64) -> bool {
        let pods = self.pods(ordinal);
        !pods.is_empty() && pods.iter().all(|pod| self.observed.is_ready(pod))
    }

    fn unit_id(&self, ordinal: i64) -> String {
        format!("data-{}-{ordinal}", self.run.id)
    }

    /// Records where the run is, and holds the pass: `action`, saying `message`.
    async fn advance(
        &self,
        ordinal: i64,
        step: &str,
        snapshots: BTreeMap<String, String>,
        bytes: i64,
    ) -> Result<()> {
        let (id, step) = (self.run.id, step.to_owned());
        blocking(&self.ctx.store, move |store| {
            store.advance_data_run(id, ordinal, &step, &snapshots, bytes)
        })
        .await
    }

    /// Moves the run to `step` at `ordinal`, its snapshots and bytes as they are.
    async fn move_to(&self, ordinal: i64, step: &str) -> Result<()> {
        self.advance(ordinal, step, self.run.snapshots.clone(), self.run.bytes)
            .await
    }

    /// The pass ends while pod `ordinal`'s unit works (its end queues the next pass).
    fn in_progress(&self, ordinal: i64) -> Gate {
        self.hold(
            Action::Done,
            format!(
                "{} run #{}: pod {ordinal} in progress",
                self.what(),
                self.run.id
            ),
        )
    }

    fn hold(&self, action: Action, message: String) -> Gate {
        Gate::Hold {
            action,
            message,
            failed: false,
        }
    }

    fn what(&self) -> &'static str {
        self.run.what.as_str()
    }

    async fn next(self) -> Result<Gate> {
        let ordinals = self.ordinals();
        let Some(&ordinal) = ordinals
            .iter()
            .find(|ordinal| **ordinal >= self.run.ordinal)
        else {
            return self.finish().await;
        };
        // A step the run recorded for an earlier ordinal than the ones it takes starts there.
        let step = if ordinal == self.run.ordinal {
            self.run.step.clone()
        } else {
            String::new()
        };
        let pods = self.pods(ordinal);
        // An exec runs in a running pod (a deployment's first running replica).
        let exec_pod = pods
            .iter()
            .find(|pod| pod.state == ContainerState::Running)
            .cloned();
        let mode = self.backup.mode;
        let is_backup = self.run.what == DataWhat::Backup;
        let stops = match self.run.what {
            DataWhat::Backup => mode == BackupMode::Stop,
            DataWhat::Restore => mode != BackupMode::Exec,
            DataWhat::Verify => false,
        };
        match step.as_str() {
            "" => {
                for pod in pods.iter().filter(|_| stops) {
                    if is_backup {
                        if let Err(error) = self.ctx.runtime.stop(&pod.id, STOP_GRACE).await {
                            self.start_again(&pods).await;
                            return self
                                .fail(format!(
                                    "{} could not be stopped for its backup: {error}",
                                    pod.name
                                ))
                                .await;
                        }
                    } else {
                        // A restored pod is made again from the current spec (a rollback's).
                        super::replicated::drain_and_remove(
                            self.ctx, self.key, &pod.id, STOP_GRACE,
                        )
                        .await?;
                    }
                }
                if mode == BackupMode::Exec
                    && self.run.what != DataWhat::Verify
                    && exec_pod.is_none()
                {
                    return self
                        .fail(format!(
                            "pod {ordinal} is not running: an exec {} runs its command in the pod",
                            self.what()
                        ))
                        .await;
                }
                self.move_to(ordinal, "working").await?;
                self.start_unit(ordinal, exec_pod.as_ref()).await?;
                Ok(self.in_progress(ordinal))
            }
            "working" => {
                let unit = self.unit_id(ordinal);
                match self.ctx.data_units().take(&unit) {
                    Some(Ok(done)) => {
                        let mut snapshots = self.run.snapshots.clone();
                        if is_backup {
                            snapshots.extend(done.snapshots);
                        }
                        let bytes = self
                            .run
                            .bytes
                            .saturating_add(i64::try_from(done.bytes).unwrap_or(i64::MAX));
                        // A pod stopped for its backup is started again; a pod never
                        // created has nothing to start.
                        let next = if is_backup && stops && !pods.is_empty() {
                            "start"
                        } else {
                            "done"
                        };
                        self.advance(ordinal, next, snapshots, bytes).await?;
                        Ok(self.hold(
                            Action::RequeueAfter(Duration::ZERO),
                            format!("{} run #{}: pod {ordinal} done", self.what(), self.run.id),
                        ))
                    }
                    Some(Err(error)) => {
                        if is_backup && stops {
                            self.start_again(&pods).await;
                        }
                        self.fail(format!("pod {ordinal}: {error}")).await
                    }
                    None if self.ctx.runs.attached().contains(&unit) => {
                        Ok(self.in_progress(ordinal))
                    }
                    // The unit is gone with an earlier agent (its restic was killed with it
                    // and recorded nothing): the step runs again.
                    None => {
                        self.start_unit(ordinal, exec_pod.as_ref()).await?;
                        Ok(self.in_progress(ordinal))
                    }
                }
            }
            "start" => {
                self.start_again(&pods).await;
                self.move_to(ordinal, "ready").await?;
                Ok(self.hold(
                    Action::RequeueAfter(READY_LOOK),
                    format!("backup run #{}: pod {ordinal} started again", self.run.id),
                ))
            }
            "ready" => {
                if self.all_ready(ordinal) {
                    self.move_to(ordinal, "done").await?;
                    return Ok(self.hold(Action::RequeueAfter(Duration::ZERO), String::new()));
                }
                let since = self.run.started_at.unwrap_or_else(now_unix);
                if now_unix() - since
                    > i64::try_from(self.backup.deadline().as_secs()).unwrap_or(i64::MAX)
                {
                    return self
                        .fail(format!(
                            "pod {ordinal} did not become Ready again after its backup"
                        ))
                        .await;
                }
                self.start_again(&pods).await;
                Ok(self.hold(
                    Action::RequeueAfter(READY_LOOK),
                    format!(
                        "backup run #{}: waiting for pod {ordinal} to be Ready again",
                        self.run.id
                    ),
                ))
            }
            // "done": the next ordinal.
            _ => {
                let next = ordinals
                    .iter()
                    .find(|next| **next > ordinal)
                    .copied()
                    .unwrap_or(i64::MAX);
                self.move_to(next, "").await?;
                Ok(self.hold(Action::RequeueAfter(Duration::ZERO), String::new()))
            }
        }
    }

    /// Starts the pods stopped for their backup (an error is the next pass's to see).
    async fn start_again(&self, pods: &[Container]) {
        for pod in pods
            .iter()
            .filter(|pod| pod.state != ContainerState::Running)
        {
            if let Err(error) = self.ctx.runtime.start(&pod.id).await {
                tracing::warn!(key = %self.key, container = %pod.name, %error, "could not start the pod again after its backup");
            }
        }
    }

    /// All pods done: a backup forgets what its retention drops; a restore waits for the
    /// pods to be Ready again (the pass makes them) and then drops the old contents.
    async fn finish(self) -> Result<Gate> {
        match self.run.what {
            DataWhat::Verify => {
                let message = format!(
                    "restic check passed; {} snapshot(s) restored whole ({} bytes)",
                    self.run.snapshots.len(),
                    self.run.bytes
                );
                self.end(DataState::Succeeded, message).await?;
                Ok(self.hold(Action::RequeueAfter(Duration::ZERO), String::new()))
            }
            DataWhat::Restore => {
                let n = self.ordinals().len();
                let ready = self
                    .ordinals()
                    .iter()
                    .filter(|ordinal| self.all_ready(**ordinal))
                    .count();
                if ready < n {
                    // The pass goes on: it creates the pods the restore removed.
                    return Ok(Gate::Open);
                }
                self.drop_asides().await;
                self.end(
                    DataState::Succeeded,
                    format!(
                        "restored {} snapshot(s); pods Ready again",
                        self.run.snapshots.len()
                    ),
                )
                .await?;
                Ok(Gate::Open)
            }
            _ => {
                let removed = match self.backup.keep {
                    Some(keep) => self.forget(keep).await,
                    None => Ok(0),
                };
                let message = match removed {
                    Ok(removed) => format!(
                        "{} snapshot(s), {} bytes read{}",
                        self.run.snapshots.len(),
                        self.run.bytes,
                        if removed > 0 {
                            format!("; retention forgot {removed}")
                        } else {
                            String::new()
                        }
                    ),
                    Err(error) => format!(
                        "{} snapshot(s); retention failed: {error}",
                        self.run.snapshots.len()
                    ),
                };
                self.end(DataState::Succeeded, message).await?;
                Ok(self.hold(Action::RequeueAfter(Duration::ZERO), String::new()))
            }
        }
    }

    /// Retention: `restic forget` per thing held, keeping `keep`.
    async fn forget(
        &self,
        keep: crate::manifest::spec::Keep,
    ) -> std::result::Result<usize, String> {
        let restic = self.ctx.restic();
        let repo = repo(self.backup);
        let keep = restic::Keep {
            last: keep.last,
            daily: keep.daily,
            weekly: keep.weekly,
            monthly: keep.monthly,
        };
        let mut removed = 0;
        for holds in self.run.snapshots.keys() {
            removed += restic
                .forget(&repo, &tags(self.key, holds), keep, self.backup.deadline())
                .await
                .map_err(|error| error.to_string())?
                .len();
        }
        Ok(removed)
    }

    async fn drop_asides(&self) {
        for volume in self.run.snapshots.keys() {
            if let Ok(Some(path)) = self.ctx.runtime.volume_path(volume).await {
                let aside = aside(&path, self.run.id);
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(aside)).await;
            }
        }
    }

    async fn fail(&self, message: String) -> Result<Gate> {
        self.end(DataState::Failed, message.clone()).await?;
        let held = self.run.reason == DataReason::BeforeRelease;
        Ok(Gate::Hold {
            action: Action::RequeueAfter(Duration::ZERO),
            message: format!("{} run #{} failed: {message}", self.what(), self.run.id),
            failed: held,
        })
    }

    async fn end(&self, state: DataState, message: String) -> Result<()> {
        let id = self.run.id;
        let ended = blocking(&self.ctx.store, move |store| {
            store.finish_data_run(id, state, &message)
        })
        .await?;
        if ended {
            tracing::info!(key = %self.key, run = id, what = self.what(), state = state.as_str(), "data run ended");
        }
        Ok(())
    }

    /// Starts pod `ordinal`'s unit: restic's work on it, on the run mechanism's tracker.
    /// A verify's: the bytes the backup whose snapshots it restores read.
    async fn expected_bytes(&self) -> Result<i64> {
        if self.run.what != DataWhat::Verify {
            return Ok(0);
        }
        let key = self.key.clone();
        let good = blocking(&self.ctx.store, move |store| store.last_good_backup(&key)).await?;
        Ok(good
            .filter(|good| good.snapshots == self.run.snapshots)
            .map_or(0, |good| good.bytes))
    }

    async fn start_unit(&self, ordinal: i64, pod: Option<&Container>) -> Result<()> {
        let unit = self.unit_id(ordinal);
        let work = Work {
            restic: self.ctx.restic(),
            repo: repo(self.backup),
            runtime: self.ctx.runtime.clone(),
            key: self.key.clone(),
            host: self.ctx.agent_id.clone(),
            run: self.run.id,
            what: self.run.what,
            mode: self.backup.mode,
            deadline: self.backup.deadline(),
            volumes: self.volumes(ordinal),
            snapshots: self.run.snapshots.clone(),
            pod: pod.map(|pod| pod.id.clone()),
            dump: dump_name(self.key, ordinal),
            command: self.backup.command.clone(),
            restore_command: self.backup.restore_command.clone(),
            scratch: self.ctx.data_dir().join("restic-verify"),
            expected_bytes: u64::try_from(self.expected_bytes().await?).unwrap_or(0),
        };
        let (units, runs, timer, shutdown, key) = (
            self.ctx.data_units().clone(),
            self.ctx.runs.clone(),
            self.ctx.timer.clone(),
            self.ctx.shutdown.clone(),
            self.key.clone(),
        );
        let id = unit.clone();
        self.ctx.runs.attach(&unit, async move {
            tokio::select! {
                outcome = work.run() => {
                    units.put(&id, outcome);
                    runs.detach(&id);
                    timer.requeue(key);
                }
                // The agent stops: restic is killed with the future (it records nothing),
                // and the next start runs the step again.
                () = shutdown.cancelled() => runs.detach(&id),
            }
        });
        Ok(())
    }
}

/// Whether `backup`'s schedule came round after `after` (Unix seconds) by `now`.
pub(crate) fn due(backup: &Backup, after: i64, now: i64) -> bool {
    if backup.schedule.is_empty() {
        return false;
    }
    let Ok(schedule) =
        crate::manifest::spec::schedule::Schedule::parse(&backup.schedule, &backup.timezone)
    else {
        return false;
    };
    chrono::DateTime::from_timestamp(after, 0)
        .and_then(|after| schedule.next_after(after))
        .is_some_and(|next| next.timestamp() <= now)
}
