//! Status and release views: the JSON documents of `GET /status`, `GET /releases/…` and
//! `GET /healthz`, also printed by `voodu-agent status --json` and `releases --json`.
//!
//! Invariants: views are built from store reads only, and from one function each (`build`,
//! `build_releases`), so the command line and HTTP cannot disagree; they are dedicated
//! serialisable types, never internal ones, so changing an internal type never changes the
//! documents scripts read; a resource's kind-specific `detail` is shaped by `super::detail`
//! from the typed detail its handler stored.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AppState;
use super::detail::DetailView;
use crate::model::{Kind, ResourceKey};
use crate::store::blocking;
use std::collections::BTreeMap;

use crate::store::{CommitRecord, HEALTH_ENGINE, HEALTH_FETCH, Pin, Release, Store};

/// The JSON document `status --json` prints and `GET /status` returns.
#[derive(Debug, Serialize)]
pub struct StatusView {
    /// Which host of a fleet the agent is (`--host`); `None` before its first start, or
    /// when it applies every host's manifests.
    pub(crate) host: Option<String>,
    /// Its `--host-label`s (which `labels/<label>/` directories it applies).
    pub(crate) host_labels: Vec<String>,
    /// What runs its workloads: `docker` (containers) or `swarm` (Docker Swarm services).
    pub(crate) runtime: Option<String>,
    pub(crate) last_seen: Option<CommitView>,
    pub(crate) last_applied: Option<CommitView>,
    pub last_rejected: Option<CommitView>,
    /// The last fetch of the remote: its error with the whole cause chain while it fails.
    pub(crate) fetch: Option<FetchView>,
    /// Whether the container engine answered the agent's last probe.
    pub(crate) engine: Option<EngineView>,
    /// The repository's deploy trigger files (`.voodu/**/*.yml`) as of the last applied
    /// commit; empty without trigger files.
    pub triggers: Vec<TriggerView>,
    /// The notification sinks (`--notify`) the agent has run: each one's last success and
    /// error, and how many events wait for it.
    pub notify: Vec<crate::store::SinkState>,
    /// The commit a deploy window or a freeze holds (the single `--repo` source's; a named
    /// source's is in `sources`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<HoldView>,
    /// The freezes in force (`voodu-agent freeze`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub freezes: Vec<FreezeView>,
    /// With `--sources`: each source (repository) with its commits, fetch and triggers (the
    /// fields above are then empty); empty for the single `--repo` source.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceView>,
    /// Image automation (`image_update`): each followed image, its current and newer tag, its
    /// last scan (`super::images`); absent when no resource follows its image.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<super::images::ImageView>,
    /// The deployments in maintenance (`voodu-agent maintenance`): their ingress routes
    /// answer 503 with a page; absent when none is.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub maintenance: Vec<crate::store::Maintenance>,
    /// Branch previews (`previews {}`): each with its branch, slug, scopes, hosts, commit and
    /// times; absent when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub previews: Vec<crate::store::PreviewRow>,
    /// Progressive rollouts (`canary {}` / `blue_green {}`): each deployment's release, step,
    /// share, pause, last analysis values and verdict; absent when none was recorded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rollouts: Vec<RolloutView>,
    pub(crate) resources: Vec<ResourceView>,
}

/// One deployment's progressive rollout (`canary {}` / `blue_green {}`), as the reconciler
/// recorded it (`store::RolloutState`), with the shares of its steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RolloutView {
    pub scope: String,
    pub name: String,
    /// The new release's spec hash.
    pub release: String,
    /// `canary` or `blue_green`.
    pub strategy: String,
    /// The index of the step (canary, from 0), 0 for blue/green.
    pub step: u32,
    /// The new release's traffic share in percent.
    pub share: u32,
    /// The canary replicas the share stands for.
    pub canary_replicas: u32,
    /// Unix seconds the step started.
    pub started: i64,
    /// Unix seconds a timed pause (or blue/green's `keep_old`) ends.
    pub paused_until: Option<i64>,
    /// `progressing`, `paused`, `promoted` or `aborted`.
    pub phase: &'static str,
    /// `passed`, `failed`, or empty before the first analysis.
    pub verdict: String,
    /// The last analysis's values (error rate, p95, query results).
    pub analysis: serde_json::Value,
    pub promote_requested: bool,
    pub abort_requested: bool,
    /// Unix seconds of the last change.
    pub updated: i64,
    /// The shares (percent) of the deployment's `canary {}` steps, which `step` indexes;
    /// absent for blue/green, or when the manifest no longer declares the canary.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<u32>,
}

impl RolloutView {
    fn of(state: crate::store::RolloutState, steps: Vec<u32>) -> RolloutView {
        RolloutView {
            scope: state.scope,
            name: state.name,
            release: state.release,
            strategy: state.strategy,
            step: state.step,
            share: state.share,
            canary_replicas: state.canary_replicas,
            started: state.started,
            paused_until: state.paused_until,
            phase: state.phase.as_str(),
            verdict: state.verdict,
            analysis: state.analysis,
            promote_requested: state.promote_requested,
            abort_requested: state.abort_requested,
            updated: state.updated,
            steps,
        }
    }

    /// The release as the pages name it: `#2` for a release id (what the canary records),
    /// else as recorded (a spec hash).
    pub fn release_text(&self) -> String {
        if !self.release.is_empty() && self.release.bytes().all(|byte| byte.is_ascii_digit()) {
            format!("#{}", self.release)
        } else {
            self.release.clone()
        }
    }

    /// The step in words, 1-based as the reconciler's messages say it: `step 2/3`, or
    /// `step 2` when the steps are not known; `None` for blue/green (it has no steps).
    pub fn step_text(&self) -> Option<String> {
        if self.strategy == "blue_green" {
            return None;
        }
        let step = self.step.saturating_add(1);
        Some(match self.steps.len() {
            0 => format!("step {step}"),
            total => format!("step {step}/{total}"),
        })
    }

    /// The last analysis's values as `name=value` pairs, a check's own values under its
    /// name (`http.error_percent=0, http.p95_ms=12, prometheus.measurements=[[0.1]]`), by
    /// name; empty when there are none. (The store bounds the values.)
    pub fn analysis_text(&self) -> String {
        fn pairs(prefix: &str, value: &serde_json::Value, depth: usize, out: &mut Vec<String>) {
            match value {
                serde_json::Value::Null if prefix.is_empty() => {}
                serde_json::Value::Object(values) if depth < 2 => {
                    for (name, value) in values {
                        let name = if prefix.is_empty() {
                            name.clone()
                        } else {
                            format!("{prefix}.{name}")
                        };
                        pairs(&name, value, depth + 1, out);
                    }
                }
                serde_json::Value::String(text) if !prefix.is_empty() => {
                    out.push(format!("{prefix}={text}"));
                }
                other if prefix.is_empty() => out.push(other.to_string()),
                other => out.push(format!("{prefix}={other}")),
            }
        }
        let mut out = Vec::new();
        pairs("", &self.analysis, 0, &mut out);
        out.join(", ")
    }
}

/// Every recorded rollout with its deployment's steps (the spec of its desired row).
pub(crate) fn rollout_views(store: &Store) -> crate::store::Result<Vec<RolloutView>> {
    store
        .rollout_states()?
        .into_iter()
        .map(|state| {
            let steps = store.canary_steps(&state.scope, &state.name)?;
            Ok(RolloutView::of(state, steps))
        })
        .collect()
}

/// Deployment `scope/name`'s rollout, if one was recorded.
pub(crate) fn rollout_view(
    store: &Store,
    scope: &str,
    name: &str,
) -> crate::store::Result<Option<RolloutView>> {
    let Some(state) = store.rollout_state(scope, name)? else {
        return Ok(None);
    };
    let steps = store.canary_steps(scope, name)?;
    Ok(Some(RolloutView::of(state, steps)))
}

/// One source of `--sources`: what it follows, may deploy, and did last.
#[derive(Debug, Serialize)]
pub struct SourceView {
    pub name: String,
    pub(crate) url: String,
    pub(crate) branch: String,
    /// The scopes it may deploy, as written (`shop-*`, `""` for unscoped resources).
    pub(crate) scopes: Vec<String>,
    pub(crate) last_seen: Option<CommitView>,
    pub(crate) last_applied: Option<CommitView>,
    pub last_rejected: Option<CommitView>,
    pub(crate) fetch: Option<FetchView>,
    pub triggers: Vec<TriggerView>,
    /// The commit a deploy window or a freeze holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<HoldView>,
}

/// A commit held by a deploy window or a freeze: accepted, not applied yet.
#[derive(Debug, Serialize)]
pub struct HoldView {
    pub commit: String,
    /// Unix time it was first held.
    pub since: i64,
    /// When it applies (the window's opening, the freeze's end), Unix time and RFC 3339;
    /// `None`: no opening ahead (`unfreeze`, `approve --now`).
    pub until: Option<i64>,
    pub until_text: Option<String>,
    /// Why: which window, or the freeze and its reason.
    pub reason: String,
    pub frozen: bool,
    /// Released by `approve --now` (by whom): applied at the next sync.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_by: Option<String>,
}

/// A freeze in force.
#[derive(Debug, Serialize)]
pub struct FreezeView {
    /// The source frozen (`""`: the single `--repo` source), or `*` for every source.
    pub source: String,
    pub until: Option<i64>,
    pub reason: String,
    pub by: String,
    pub at: i64,
}

fn hold_view(hold: crate::store::Hold) -> HoldView {
    HoldView {
        commit: hold.commit.to_string(),
        since: hold.since,
        until: hold.until,
        until_text: hold.until.map(crate::base::rfc3339_seconds),
        reason: hold.reason,
        frozen: hold.frozen,
        released_by: hold.released_by,
    }
}

/// The freezes still in force.
fn freeze_views(store: &Store) -> crate::store::Result<Vec<FreezeView>> {
    let now = crate::store::now_unix();
    Ok(store
        .freezes()?
        .into_iter()
        .filter(|freeze| freeze.until.is_none_or(|until| now < until))
        .map(|freeze| FreezeView {
            source: freeze.target,
            until: freeze.until,
            reason: freeze.reason,
            by: freeze.by,
            at: freeze.at,
        })
        .collect())
}

/// One deploy trigger: what it applied, what it holds, whether it can fire on this host.
#[derive(Debug, Serialize)]
pub struct TriggerView {
    pub name: String,
    /// The trigger file.
    pub(crate) file: String,
    /// `active`, `held` (a commit waits for `voodu-agent approve`), or `inactive` (it never
    /// fires on this host; `inactive_reason` says why).
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) inactive_reason: Option<String>,
    /// The commit it last fired (or was approved) at and the manifest it applied then.
    pub(crate) applied: Option<TriggerCommitView>,
    /// The held commit, if any.
    pub(crate) held: Option<HeldView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct TriggerCommitView {
    pub(crate) commit: String,
    pub(crate) apply_file: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct HeldView {
    pub(crate) commit: String,
    pub(crate) apply_file: String,
    /// Unix time it was held.
    pub(crate) since: i64,
    /// True once `voodu-agent approve` marked it; the agent applies it at its next sync.
    pub(crate) approved: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) approved_by: Option<String>,
    /// What to run to apply it.
    pub(crate) approve_with: String,
}

/// How the last fetch of the remote went.
#[derive(Debug, Serialize)]
pub(crate) struct FetchView {
    /// `ok` or `failing`.
    pub(crate) state: &'static str,
    /// The last failure, every cause joined with `: ` (the root cause last); `None` when ok.
    pub(crate) error: Option<String>,
    /// Unix time of the first failure of the current streak; `None` when ok.
    pub(crate) failing_since: Option<i64>,
    pub(crate) checked_at: i64,
    pub(crate) last_success_at: Option<i64>,
}

/// Whether the container engine answers.
#[derive(Debug, Serialize)]
pub(crate) struct EngineView {
    /// `reachable` or `unreachable`.
    pub(crate) state: &'static str,
    /// Why the last probe failed; `None` when reachable.
    pub(crate) error: Option<String>,
    /// Unix time since which the engine does not answer; `None` when reachable.
    pub(crate) unreachable_since: Option<i64>,
    pub(crate) checked_at: i64,
}

/// How a commit the agent saw ended: a commit's `outcome` in `GET /status`, which `status`
/// prints and `fleet status` reads from other agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CommitOutcome {
    /// In desired state.
    Applied,
    /// Refused; the host keeps running the last applied commit.
    Rejected,
}

impl CommitOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CommitOutcome::Applied => "applied",
            CommitOutcome::Rejected => "rejected",
        }
    }

    /// The outcome `text` names; `None` for a text this build does not know (an agent of
    /// another version).
    pub(crate) fn parse(text: &str) -> Option<CommitOutcome> {
        [CommitOutcome::Applied, CommitOutcome::Rejected]
            .into_iter()
            .find(|outcome| outcome.as_str() == text)
    }
}

#[derive(Debug, Serialize)]
pub struct CommitView {
    pub(crate) sha: String,
    pub(crate) outcome: CommitOutcome,
    pub(crate) seen_at: i64,
    /// `path:line:col: message`, one per problem (rejected commits only).
    pub errors: Vec<String>,
    pub(crate) diagnostics: Vec<DiagnosticView>,
    /// `path:line:col: warning: message`, one per warning the commit was applied with (a
    /// resource declared in two files, …).
    pub(crate) warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct DiagnosticView {
    pub(crate) path: String,
    pub(crate) line: usize,
    pub(crate) col: usize,
    pub(crate) message: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct ResourceView {
    pub(crate) kind: String,
    pub(crate) scope: String,
    pub(crate) name: String,
    pub(crate) phase: &'static str,
    /// Why it failed (`ImageMissing`, `RolloutDeadline`, …); absent unless something failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<&'static str>,
    pub(crate) message: String,
    pub(crate) desired_replicas: usize,
    pub(crate) running_replicas: usize,
    pub(crate) spec_hash: String,
    pub(crate) release: Option<ReleaseView>,
    /// Set while an operator rollback pins the resource (auto-sync paused for it).
    pub(crate) pin: Option<PinView>,
    pub(crate) updated_at: i64,
    /// Kind-specific state as the handler recorded it (a job's run history, a cronjob's
    /// schedule and next run, …); absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) detail: Option<DetailView>,
    /// The source that applied it (`--sources`); absent for the single `--repo` source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<String>,
    /// A statefulset's backups (`backup {}`): the last backup and verify, and the run in
    /// flight; absent when it never had a data run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) backup: Option<BackupView>,
}

/// What `status` says of a resource's backups.
#[derive(Debug, Serialize)]
pub(crate) struct BackupView {
    /// The newest backup that ended (succeeded or failed).
    pub(crate) last: Option<DataRunView>,
    /// The newest backup that succeeded, when the newest ended one failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_good: Option<DataRunView>,
    /// The newest verify that ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_verify: Option<DataRunView>,
    /// The run being worked on (or asked for), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) in_flight: Option<DataRunView>,
}

/// One data run as `status` and `releases` show it.
#[derive(Debug, Serialize)]
pub(crate) struct DataRunView {
    pub(crate) id: i64,
    pub(crate) what: &'static str,
    pub(crate) reason: &'static str,
    pub(crate) state: &'static str,
    pub(crate) snapshots: BTreeMap<String, String>,
    pub(crate) bytes: i64,
    pub(crate) message: String,
    pub(crate) ended_at: Option<i64>,
}

impl DataRunView {
    fn of(run: &crate::store::DataRun) -> DataRunView {
        DataRunView {
            id: run.id,
            what: run.what.as_str(),
            reason: run.reason.as_str(),
            state: run.state.as_str(),
            snapshots: run.snapshots.clone(),
            bytes: run.bytes,
            message: run.message.clone(),
            ended_at: run.ended_at,
        }
    }
}

/// The most runs `status` reads per resource to find its last backup and verify.
const STATUS_DATA_RUNS: usize = 20;

/// A statefulset's (or deployment's) backups, from its newest data runs; `None` when it has
/// none.
fn backup_view(store: &Store, key: &ResourceKey) -> crate::store::Result<Option<BackupView>> {
    use crate::store::{DataState, DataWhat};
    if !matches!(
        key.kind,
        crate::model::Kind::Statefulset | crate::model::Kind::Deployment
    ) {
        return Ok(None);
    }
    let runs = store.data_runs(key, STATUS_DATA_RUNS)?;
    if runs.is_empty() {
        return Ok(None);
    }
    let ended_backup = |run: &&crate::store::DataRun| {
        run.what == DataWhat::Backup
            && matches!(run.state, DataState::Succeeded | DataState::Failed)
    };
    let last = runs.iter().find(ended_backup);
    let last_good = match last {
        Some(last) if last.state == DataState::Failed => store.last_good_backup(key)?,
        _ => None,
    };
    Ok(Some(BackupView {
        last: last.map(DataRunView::of),
        last_good: last_good.as_ref().map(DataRunView::of),
        last_verify: runs
            .iter()
            .find(|run| run.what == DataWhat::Verify && run.state.ended())
            .map(DataRunView::of),
        in_flight: runs
            .iter()
            .find(|run| !run.state.ended())
            .map(DataRunView::of),
    }))
}

#[derive(Debug, Serialize)]
pub(crate) struct ReleaseView {
    pub(crate) id: i64,
    pub(crate) commit: String,
    pub(crate) phase: &'static str,
    /// What each image of the release runs as (see `ReleaseRecordView::images`).
    pub(crate) images: ImagesView,
}

/// What the images of a release run as.
#[derive(Debug, Serialize)]
pub(crate) struct ImagesView {
    /// False for a release recorded before digests were ("digest unknown": it runs its tags
    /// until the next rollout), and for one that has not resolved them yet.
    pub(crate) resolved: bool,
    /// Each image as the spec names it, with what it runs as (`name@sha256:…`, or the image
    /// id of a local-only image) and that digest's first 12 hex digits.
    pub(crate) images: Vec<ImageView>,
    /// Tags whose registry names another digest now than the release resolved (`status`:
    /// a mutable tag moved; `voodu-agent redeploy` runs what it names now).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) moved: Vec<TagMovedView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ImageView {
    pub(crate) image: String,
    pub(crate) runs: String,
    pub(crate) digest: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct TagMovedView {
    pub(crate) image: String,
    pub(crate) recorded: String,
    pub(crate) current: String,
    pub(crate) checked_at: i64,
}

impl ImagesView {
    /// `release`'s images, with the tags the store saw move (`tag_digests`).
    pub(crate) fn of(release: &Release, moved: &BTreeMap<String, (String, i64)>) -> ImagesView {
        let Some(images) = &release.images else {
            return ImagesView {
                resolved: false,
                images: Vec::new(),
                moved: Vec::new(),
            };
        };
        let mut moved_views = Vec::new();
        for (image, runs) in images {
            let Some((current, checked_at)) = moved.get(image) else {
                continue;
            };
            let recorded = crate::model::image_policy::split_digest(runs).map(|(_, digest)| digest);
            if recorded.is_some_and(|recorded| recorded != current) {
                moved_views.push(TagMovedView {
                    image: image.clone(),
                    recorded: recorded.unwrap_or_default().to_owned(),
                    current: current.clone(),
                    checked_at: *checked_at,
                });
            }
        }
        ImagesView {
            resolved: true,
            images: images
                .iter()
                .map(|(image, runs)| ImageView {
                    image: image.clone(),
                    runs: runs.clone(),
                    digest: crate::model::image_policy::short_digest(runs).to_owned(),
                })
                .collect(),
            moved: moved_views,
        }
    }

    /// The short digests, `a1b2c3d4e5f6` or `digest unknown`.
    pub(crate) fn short(&self) -> String {
        if !self.resolved {
            return "digest unknown".to_owned();
        }
        self.images
            .iter()
            .map(|image| image.digest.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct PinView {
    /// The rollback release that made the pin.
    pub(crate) release_id: i64,
    /// The commit of the release rolled back to.
    pub(crate) commit: String,
    pub(crate) spec_hash: String,
    pub(crate) pinned_at: i64,
    /// The commit whose version of the resource git declares (`None`: git does not).
    pub(crate) git_commit: Option<String>,
    /// True when git declares something other than what runs: unpinning changes the host.
    pub(crate) git_differs: bool,
}

/// The JSON document `releases --json` prints and `GET /releases/{scope}/{name}` returns.
#[derive(Debug, Serialize)]
pub(crate) struct ReleasesView {
    pub(crate) kind: String,
    pub(crate) scope: String,
    pub(crate) name: String,
    pub(crate) pin: Option<PinView>,
    /// Newest first; at most `store::RELEASE_HISTORY_LIMIT`.
    pub(crate) releases: Vec<ReleaseRecordView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ReleaseRecordView {
    pub(crate) id: i64,
    pub(crate) commit: String,
    pub(crate) spec_hash: String,
    /// `progressing`, `succeeded`, `failed` or `rolled-back`.
    pub(crate) phase: &'static str,
    pub(crate) started_at: i64,
    pub(crate) finished_at: Option<i64>,
    pub(crate) message: String,
    /// For a rollback release: the release that was current when it was made.
    pub(crate) rolled_back_from: Option<i64>,
    /// The spec rolled out, as stored.
    pub(crate) snapshot: serde_json::Value,
    /// Outcomes of its `release {}` hooks by stage (`pre_command`, `command`,
    /// `post_command`): exit code, whether it timed out, the tail of its output, when.
    pub(crate) hooks: serde_json::Map<String, serde_json::Value>,
    /// What its images ran as (a rollback to it runs these again).
    pub(crate) images: ImagesView,
    /// The backup taken before it touched a pod (`before_release`), with its snapshots:
    /// what `rollback --with-data` to the release before it puts back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) backup: Option<DataRunView>,
}

fn commit_view(record: CommitRecord) -> CommitView {
    CommitView {
        sha: record.sha.to_string(),
        outcome: if record.applied {
            CommitOutcome::Applied
        } else {
            CommitOutcome::Rejected
        },
        seen_at: record.seen_at,
        errors: record.errors.iter().map(ToString::to_string).collect(),
        warnings: record
            .warnings
            .iter()
            .map(|warning| {
                format!(
                    "{}:{}:{}: warning: {}",
                    warning.path, warning.line, warning.col, warning.message
                )
            })
            .collect(),
        diagnostics: record
            .errors
            .into_iter()
            .map(|diagnostic| DiagnosticView {
                path: diagnostic.path,
                line: diagnostic.line,
                col: diagnostic.col,
                message: diagnostic.message,
            })
            .collect(),
    }
}

fn pin_view(store: &Store, pin: Pin) -> crate::store::Result<PinView> {
    let running_spec = store.desired(&pin.key)?.map(|desired| desired.spec_json);
    Ok(PinView {
        release_id: pin.release_id,
        commit: pin.commit.to_string(),
        spec_hash: pin.spec_hash.to_string(),
        pinned_at: pin.pinned_at,
        git_commit: pin.git_commit.map(|commit| commit.to_string()),
        git_differs: pin.git_spec != running_spec,
    })
}

/// Builds the status document from the store.
pub fn build(store: &Store) -> crate::store::Result<StatusView> {
    let commits = store.commit_summary()?;
    let mut pins = store.pins()?;
    let mut resources = Vec::new();
    let sources = source_views(store)?;
    let mut owners = if sources.is_empty() {
        std::collections::BTreeMap::new()
    } else {
        store.sources_of_desired()?
    };
    for (key, status) in store.statuses()? {
        let pin = match pins.iter().position(|pin| pin.key == key) {
            Some(index) => Some(pin_view(store, pins.swap_remove(index))?),
            None => None,
        };
        let source = owners.remove(&key).filter(|source| !source.is_empty());
        let mut view = resource_view(store, key, status, pin)?;
        view.source = source;
        resources.push(view);
    }
    let hosts = store.host_selection()?.unwrap_or_default();
    Ok(StatusView {
        host: hosts.host,
        host_labels: hosts.labels,
        runtime: store.meta(crate::store::META_RUNTIME)?,
        last_seen: commits.last_seen.map(commit_view),
        last_applied: commits.last_applied.map(commit_view),
        last_rejected: commits.last_rejected.map(commit_view),
        fetch: store.health(HEALTH_FETCH)?.map(fetch_view),
        engine: store.health(HEALTH_ENGINE)?.map(|health| EngineView {
            state: if health.ok {
                "reachable"
            } else {
                "unreachable"
            },
            error: (!health.ok).then_some(health.error),
            unreachable_since: health.failing_since,
            checked_at: health.checked_at,
        }),
        notify: store.sink_states()?,
        held: store.for_source("").hold()?.map(hold_view),
        freezes: freeze_views(store)?,
        sources,
        triggers: store
            .trigger_states()?
            .into_iter()
            .map(trigger_view)
            .collect(),
        images: super::images::build(store)?,
        maintenance: store.maintenance_all()?,
        previews: store.previews(None)?,
        rollouts: rollout_views(store)?,
        resources,
    })
}

/// The named sources the agent last ran with, each read through its own store handle;
/// empty for the single `--repo` source.
fn source_views(store: &Store) -> crate::store::Result<Vec<SourceView>> {
    let mut views = Vec::new();
    for meta in store.recorded_sources()? {
        let source = store.for_source(&meta.name);
        let commits = source.commit_summary()?;
        views.push(SourceView {
            last_seen: commits.last_seen.map(commit_view),
            last_applied: commits.last_applied.map(commit_view),
            last_rejected: commits.last_rejected.map(commit_view),
            fetch: source
                .health(&source.source_key(HEALTH_FETCH))?
                .map(fetch_view),
            triggers: source
                .trigger_states()?
                .into_iter()
                .map(trigger_view)
                .collect(),
            held: source.hold()?.map(hold_view),
            name: meta.name,
            url: meta.url,
            branch: meta.branch,
            scopes: meta.scopes,
        });
    }
    Ok(views)
}

fn fetch_view(health: crate::store::Health) -> FetchView {
    FetchView {
        state: if health.ok { "ok" } else { "failing" },
        error: (!health.ok).then_some(health.error),
        failing_since: health.failing_since,
        checked_at: health.checked_at,
        last_success_at: health.last_success_at,
    }
}

fn trigger_view(state: crate::store::TriggerState) -> TriggerView {
    TriggerView {
        state: if !state.inactive.is_empty() {
            "inactive"
        } else if state.held.is_some() {
            "held"
        } else {
            "active"
        },
        inactive_reason: (!state.inactive.is_empty()).then_some(state.inactive),
        applied: state.applied.map(|applied| TriggerCommitView {
            commit: applied.commit.to_string(),
            apply_file: applied.file,
        }),
        held: state.held.map(|held| HeldView {
            approve_with: format!("voodu-agent approve {}", held.commit),
            commit: held.commit.to_string(),
            apply_file: held.file,
            since: held.since,
            approved: held.approval.is_some(),
            approved_by: held
                .approval
                .map(|approval| approval.by)
                .filter(|by| !by.is_empty()),
        }),
        name: state.name,
        file: state.path,
    }
}

/// One resource's entry of the status document; `None` when it has no status row.
pub(crate) fn build_resource(
    store: &Store,
    key: &ResourceKey,
) -> crate::store::Result<Option<ResourceView>> {
    let Some(status) = store.status(key)? else {
        return Ok(None);
    };
    let pin = match store.pin(key)? {
        Some(pin) => Some(pin_view(store, pin)?),
        None => None,
    };
    resource_view(store, key.clone(), status, pin).map(Some)
}

fn resource_view(
    store: &Store,
    key: ResourceKey,
    status: crate::store::ResourceStatus,
    pin: Option<PinView>,
) -> crate::store::Result<ResourceView> {
    let moved = store.tag_digests()?;
    let release = store.latest_release(&key)?.map(|release| ReleaseView {
        id: release.id,
        commit: release.commit.to_string(),
        phase: release.phase.as_str(),
        images: ImagesView::of(&release, &moved),
    });
    let backup = backup_view(store, &key)?;
    Ok(ResourceView {
        kind: key.kind.to_string(),
        scope: key.scope,
        name: key.name,
        phase: status.phase.as_str(),
        reason: status.reason.map(|reason| reason.as_str()),
        message: status.message,
        desired_replicas: status.desired_replicas,
        running_replicas: status.running_replicas,
        spec_hash: status.spec_hash,
        release,
        pin,
        updated_at: status.updated_at,
        detail: DetailView::of(status.detail),
        source: None,
        backup,
    })
}

fn release_record_view(
    release: Release,
    hooks: serde_json::Map<String, serde_json::Value>,
) -> ReleaseRecordView {
    ReleaseRecordView {
        hooks,
        images: ImagesView::of(&release, &BTreeMap::new()),
        id: release.id,
        commit: release.commit.to_string(),
        spec_hash: release.spec_hash.to_string(),
        phase: release.phase.as_str(),
        started_at: release.started_at,
        finished_at: release.finished_at,
        message: release.message,
        rolled_back_from: release.rolled_back_from,
        snapshot: serde_json::from_str(&release.snapshot)
            .unwrap_or(serde_json::Value::String(release.snapshot)),
        backup: None,
    }
}

/// Builds the release history of one resource from the store.
pub(crate) fn build_releases(
    store: &Store,
    key: &ResourceKey,
) -> crate::store::Result<ReleasesView> {
    let pin = match store.pin(key)? {
        Some(pin) => Some(pin_view(store, pin)?),
        None => None,
    };
    let releases = store
        .releases(key, crate::store::RELEASE_HISTORY_LIMIT)?
        .into_iter()
        .map(|release| {
            let hooks = store.release_hooks(release.id)?;
            let backup = store.release_backup(release.id)?;
            let mut view = release_record_view(release, hooks);
            view.backup = backup.as_ref().map(DataRunView::of);
            Ok(view)
        })
        .collect::<crate::store::Result<_>>()?;
    Ok(ReleasesView {
        kind: key.kind.to_string(),
        scope: key.scope.clone(),
        name: key.name.clone(),
        pin,
        releases,
    })
}

/// Why a `SCOPE/NAME` reference names no single resource.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LookupError {
    #[error("no resource {0} is known to this agent (not in desired state, no releases)")]
    NotFound(String),
    #[error("{reference} names several resources ({kinds}); write KIND/SCOPE/NAME")]
    Ambiguous { reference: String, kinds: String },
    #[error("{0:?} is not SCOPE/NAME or KIND/SCOPE/NAME")]
    Malformed(String),
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// Resolves `SCOPE/NAME` (any kind the store knows by that name, which must be one) or
/// `KIND/SCOPE/NAME`.
pub(crate) fn resolve(store: &Store, reference: &str) -> Result<ResourceKey, LookupError> {
    let parts: Vec<&str> = reference.split('/').collect();
    match parts.as_slice() {
        [kind, scope, name] => {
            let kind =
                Kind::parse(kind).ok_or_else(|| LookupError::Malformed(reference.to_owned()))?;
            Ok(ResourceKey::new(kind, *scope, *name))
        }
        [scope, name] if !name.is_empty() => {
            let keys = store.keys_named(scope, name)?;
            match keys.as_slice() {
                [] => Err(LookupError::NotFound(reference.to_owned())),
                [key] => Ok(key.clone()),
                several => Err(LookupError::Ambiguous {
                    reference: reference.to_owned(),
                    kinds: several
                        .iter()
                        .map(|key| key.kind.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
            }
        }
        _ => Err(LookupError::Malformed(reference.to_owned())),
    }
}

/// The JSON error body of the read endpoints.
#[derive(Debug, Serialize)]
struct ErrorView {
    error: String,
}

fn error_response(code: StatusCode, error: String) -> Response {
    (code, Json(ErrorView { error })).into_response()
}

/// `GET /healthz`.
#[derive(Debug, Serialize)]
struct HealthView {
    status: &'static str,
}

pub(super) async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    // One store read proves the database answers, which is all the agent needs to work.
    match blocking(&state.ctx.store, |store| store.commit_summary()).await {
        Ok(_) => Json(HealthView { status: "ok" }).into_response(),
        Err(error) => error_response(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
    }
}

pub(super) async fn status(State(state): State<Arc<AppState>>) -> Response {
    match blocking(&state.ctx.store, build).await {
        Ok(view) => Json(view).into_response(),
        Err(error) => error_response(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

pub(super) async fn releases(
    State(state): State<Arc<AppState>>,
    Path((scope, name)): Path<(String, String)>,
) -> Response {
    let reference = format!("{scope}/{name}");
    let store = state.ctx.store.clone();
    let result = tokio::task::spawn_blocking(move || {
        let key = resolve(&store, &reference)?;
        Ok::<_, LookupError>(build_releases(&store, &key)?)
    })
    .await;
    match result {
        Ok(Ok(view)) => Json(view).into_response(),
        Ok(Err(error @ LookupError::NotFound(_))) => {
            error_response(StatusCode::NOT_FOUND, error.to_string())
        }
        Ok(Err(error @ LookupError::Ambiguous { .. })) => {
            error_response(StatusCode::CONFLICT, error.to_string())
        }
        Ok(Err(error @ LookupError::Malformed(_))) => {
            error_response(StatusCode::BAD_REQUEST, error.to_string())
        }
        Ok(Err(error)) => error_response(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
        Err(join_error) => {
            error_response(StatusCode::INTERNAL_SERVER_ERROR, join_error.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RolloutState;

    #[test]
    fn a_rollout_says_its_step_from_one_and_its_analysis_as_pairs() {
        let mut state = RolloutState::start("shop", "web", "abc", "canary");
        state.step = 1;
        state.analysis = serde_json::json!({
            "http": { "samples": 50, "error_percent": 2.0, "p95_ms": 12 },
            "prometheus": { "measurements": [[0.25]], "error": "no <answer>" },
        });
        let mut view = RolloutView::of(state.clone(), Vec::new());
        assert_eq!(view.release_text(), "abc");
        assert_eq!(view.step_text().as_deref(), Some("step 2"));
        view.steps = vec![10, 50, 100];
        assert_eq!(view.step_text().as_deref(), Some("step 2/3"));
        assert_eq!(
            view.analysis_text(),
            "http.error_percent=2.0, http.p95_ms=12, http.samples=50, \
             prometheus.error=no <answer>, prometheus.measurements=[[0.25]]"
        );
        state.analysis = serde_json::Value::Null;
        state.strategy = "blue_green".into();
        state.release = "12".into();
        let view = RolloutView::of(state, Vec::new());
        assert_eq!(view.release_text(), "#12");
        assert_eq!(
            (view.step_text(), view.analysis_text()),
            (None, String::new())
        );
    }
}
