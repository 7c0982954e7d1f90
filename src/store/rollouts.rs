//! Progressive rollouts (`canary {}` / `blue_green {}`): one row per deployment whose
//! release is rolling out step by step: which release, the strategy, the step and its
//! traffic share, when the step's pause ends, the last analysis values and verdict, the state
//! (progressing, paused, promoted, aborted), and the requests `promote` / `abort` left for
//! the reconciler.
//!
//! Invariants: the row is the rollout's memory: an agent killed mid-canary reads the same
//! step, share and canary replica count back, and sends no more traffic to the canary than
//! that step allows. A request (`request_rollout`) and a transition the reconciler records
//! with an event (`save_rollout`) are each one transaction with their activity row
//! (`rollout.promote`, `rollout.abort`, `rollout.pause`; told to the outbox as
//! `rollout.promoted`, `rollout.aborted`, `rollout.paused`). Analysis values are bounded to
//! [`MAX_ANALYSIS_BYTES`]; a request is refused for a deployment with no rollout in flight; a
//! save that stays on the stored step keeps a request left meanwhile (`SAME_STEP`).

use rusqlite::{OptionalExtension as _, params};
use serde::Serialize;

use super::activity::{self, Entry};
use super::{ActivityOutcome, Error, Result, Store, now_unix};

/// Most bytes of the last analysis values kept.
pub(crate) const MAX_ANALYSIS_BYTES: usize = 4096;

/// Where a rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutPhase {
    /// Bringing the step's replicas up, or judging them.
    Progressing,
    /// Waiting: a timed pause, or for `promote`.
    Paused,
    /// At 100 %: the release is the stable one (blue/green: the old one may still be kept).
    Promoted,
    /// Stopped: traffic back on the stable release, the canary removed, the release failed.
    Aborted,
}

impl RolloutPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutPhase::Progressing => "progressing",
            RolloutPhase::Paused => "paused",
            RolloutPhase::Promoted => "promoted",
            RolloutPhase::Aborted => "aborted",
        }
    }

    fn parse(text: &str) -> Option<RolloutPhase> {
        Some(match text {
            "progressing" => RolloutPhase::Progressing,
            "paused" => RolloutPhase::Paused,
            "promoted" => RolloutPhase::Promoted,
            "aborted" => RolloutPhase::Aborted,
            _ => return None,
        })
    }

    /// Whether the rollout is over (nothing more to request).
    pub fn is_final(self) -> bool {
        matches!(self, RolloutPhase::Promoted | RolloutPhase::Aborted)
    }
}

/// A request left for the reconciler by `voodu-agent promote` / `abort` (or the API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutRequest {
    Promote,
    Abort,
}

/// One deployment's rollout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RolloutState {
    pub scope: String,
    pub name: String,
    /// The new release's spec hash.
    pub release: String,
    /// `canary` or `blue_green`.
    pub strategy: String,
    /// The index of the step (canary), 0 for blue/green.
    pub step: u32,
    /// The canary's traffic share in percent (blue/green: 0 before promote, 100 after).
    pub share: u32,
    /// The canary replicas the share stands for.
    pub canary_replicas: u32,
    /// Unix seconds the step started.
    pub started: i64,
    /// Unix seconds a timed pause (or `keep_old`) ends.
    pub paused_until: Option<i64>,
    pub phase: RolloutPhase,
    /// `passed`, `failed`, or empty before the first analysis.
    pub verdict: String,
    /// The last analysis's values (error rate, p95, query results).
    pub analysis: serde_json::Value,
    pub promote_requested: bool,
    pub abort_requested: bool,
    /// Unix seconds of the last change.
    pub updated: i64,
    /// Blue/green: the container names of the new release's replicas, which the router keeps
    /// apart (the preview host before promote, every host after; none after an abort).
    pub green: Vec<String>,
}

impl RolloutState {
    /// A fresh rollout of `release` at its first step.
    pub fn start(scope: &str, name: &str, release: &str, strategy: &str) -> RolloutState {
        let now = now_unix();
        RolloutState {
            scope: scope.to_owned(),
            name: name.to_owned(),
            release: release.to_owned(),
            strategy: strategy.to_owned(),
            step: 0,
            share: 0,
            canary_replicas: 0,
            started: now,
            paused_until: None,
            phase: RolloutPhase::Progressing,
            verdict: String::new(),
            analysis: serde_json::Value::Null,
            promote_requested: false,
            abort_requested: false,
            updated: now,
            green: Vec::new(),
        }
    }
}

/// A transition worth an activity row and an outbox event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutEvent<'a> {
    /// `rollout.pause` → `rollout.paused`.
    Paused(&'a str),
    /// `rollout.promote` → `rollout.promoted`.
    Promoted(&'a str),
    /// `rollout.abort` → `rollout.aborted`.
    Aborted(&'a str),
}

/// A save that stays on the stored step keeps a request a command left meanwhile; one that
/// moves on (another release or step, or a final phase) has consumed it.
const SAME_STEP: &str = "rollouts.release = excluded.release AND rollouts.step = excluded.step
    AND excluded.phase NOT IN ('promoted', 'aborted')";

const COLUMNS: &str = "scope, name, release, strategy, step, share, canary_replicas, started,
    paused_until, phase, verdict, analysis, promote_requested, abort_requested, updated, green";

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(RolloutState, String)> {
    let analysis: String = row.get(11)?;
    let phase: String = row.get(9)?;
    Ok((
        RolloutState {
            scope: row.get(0)?,
            name: row.get(1)?,
            release: row.get(2)?,
            strategy: row.get(3)?,
            step: u32::try_from(row.get::<_, i64>(4)?).unwrap_or(0),
            share: u32::try_from(row.get::<_, i64>(5)?).unwrap_or(0),
            canary_replicas: u32::try_from(row.get::<_, i64>(6)?).unwrap_or(0),
            started: row.get(7)?,
            paused_until: row.get(8)?,
            phase: RolloutPhase::Progressing,
            verdict: row.get(10)?,
            analysis: serde_json::from_str(&analysis).unwrap_or(serde_json::Value::Null),
            promote_requested: row.get(12)?,
            abort_requested: row.get(13)?,
            updated: row.get(14)?,
            green: serde_json::from_str(&row.get::<_, String>(15)?).unwrap_or_default(),
        },
        phase,
    ))
}

fn with_phase((mut state, phase): (RolloutState, String)) -> Result<RolloutState> {
    state.phase = RolloutPhase::parse(&phase).ok_or(Error::Unknown {
        column: "rollouts.phase",
        text: phase,
    })?;
    Ok(state)
}

fn get(connection: &rusqlite::Connection, scope: &str, name: &str) -> Result<Option<RolloutState>> {
    connection
        .query_row(
            &format!("SELECT {COLUMNS} FROM rollouts WHERE scope = ?1 AND name = ?2"),
            params![scope, name],
            from_row,
        )
        .optional()?
        .map(with_phase)
        .transpose()
}

impl Store {
    /// Deployment `scope/name`'s rollout, if one was recorded.
    pub fn rollout_state(&self, scope: &str, name: &str) -> Result<Option<RolloutState>> {
        self.with(|connection| get(connection, scope, name))
    }

    /// The shares (percent) of the `canary {}` steps deployment `scope/name`'s desired spec
    /// declares, in order (a rollout's `step` indexes them); empty for blue/green, no
    /// strategy, or a deployment not in desired state. For `status` and the dashboard.
    pub fn canary_steps(&self, scope: &str, name: &str) -> Result<Vec<u32>> {
        use crate::manifest::spec::{Spec, Strategy};
        let key = crate::model::ResourceKey::new(crate::model::Kind::Deployment, scope, name);
        Ok(match self.desired(&key)? {
            Some(desired) => match &desired.spec {
                Spec::Deployment(deployment) => match deployment.strategy.as_deref() {
                    Some(Strategy::Canary(canary)) => {
                        canary.steps.iter().map(|step| step.weight).collect()
                    }
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            },
            None => Vec::new(),
        })
    }

    /// Every recorded rollout, by scope and name.
    pub fn rollout_states(&self) -> Result<Vec<RolloutState>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM rollouts ORDER BY scope, name"
            ))?;
            let rows = statement
                .query_map([], from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter().map(with_phase).collect()
        })
    }

    /// Records `state` (the reconciler's step machine), with `event`'s activity row and
    /// outbox event in the same transaction. The requests a command left stay as stored
    /// unless `state` clears them (it read them first).
    pub fn save_rollout(
        &self,
        state: &RolloutState,
        event: Option<RolloutEvent<'_>>,
    ) -> Result<()> {
        let who = self.who.clone();
        let mut analysis = state.analysis.to_string();
        if analysis.len() > MAX_ANALYSIS_BYTES {
            analysis =
                serde_json::json!({ "truncated": true, "bytes": analysis.len() }).to_string();
        }
        self.with(|connection| {
            let tx = connection.transaction()?;
            tx.execute(
                &format!(
                    "INSERT INTO rollouts ({COLUMNS})
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
                     ON CONFLICT (scope, name) DO UPDATE SET release = excluded.release,
                       strategy = excluded.strategy, step = excluded.step,
                       share = excluded.share, canary_replicas = excluded.canary_replicas,
                       started = excluded.started, paused_until = excluded.paused_until,
                       phase = excluded.phase, verdict = excluded.verdict,
                       analysis = excluded.analysis,
                       promote_requested = CASE WHEN {SAME_STEP}
                         THEN MAX(rollouts.promote_requested, excluded.promote_requested)
                         ELSE excluded.promote_requested END,
                       abort_requested = CASE WHEN {SAME_STEP}
                         THEN MAX(rollouts.abort_requested, excluded.abort_requested)
                         ELSE excluded.abort_requested END,
                       updated = excluded.updated, green = excluded.green"
                ),
                params![
                    state.scope,
                    state.name,
                    state.release,
                    state.strategy,
                    i64::from(state.step),
                    i64::from(state.share),
                    i64::from(state.canary_replicas),
                    state.started,
                    state.paused_until,
                    state.phase.as_str(),
                    state.verdict,
                    analysis,
                    state.promote_requested,
                    state.abort_requested,
                    now_unix(),
                    serde_json::to_string(&state.green).unwrap_or_else(|_| "[]".to_owned()),
                ],
            )?;
            if let Some(event) = event {
                let (action, message) = match event {
                    RolloutEvent::Paused(message) => ("rollout.pause", message),
                    RolloutEvent::Promoted(message) => ("rollout.promote", message),
                    RolloutEvent::Aborted(message) => ("rollout.abort", message),
                };
                let resource = format!("deployment/{}/{}", state.scope, state.name);
                let mut entry = Entry::new(action, &who, ActivityOutcome::Succeeded);
                entry.resource = Some(&resource);
                entry.message = message;
                entry.data = serde_json::json!({
                    "release": state.release,
                    "strategy": state.strategy,
                    "step": state.step,
                    "share": state.share,
                    "verdict": state.verdict,
                });
                activity::record(&tx, &entry)?;
            }
            tx.commit()?;
            Ok(())
        })?;
        self.mark_changed();
        Ok(())
    }

    /// `voodu-agent promote` / `abort`: leaves the request on `scope/name`'s rollout for the
    /// reconciler, recorded in the activity log (and the outbox) as this handle's `who`.
    /// `None` when no rollout of the deployment is in flight (nothing is recorded then).
    pub fn request_rollout(
        &self,
        scope: &str,
        name: &str,
        request: RolloutRequest,
    ) -> Result<Option<RolloutState>> {
        let who = self.who.clone();
        let state = self.with(|connection| {
            let tx = connection.transaction()?;
            let Some(mut state) = get(&tx, scope, name)? else {
                return Ok(None);
            };
            // A promoted blue/green release whose old one is still kept can be switched back.
            let switch_back = request == RolloutRequest::Abort
                && state.phase == RolloutPhase::Promoted
                && state.strategy == "blue_green"
                && state.paused_until.is_some();
            if state.phase.is_final() && !switch_back {
                return Ok(None);
            }
            let (column, action, message) = match request {
                RolloutRequest::Promote => (
                    "promote_requested",
                    "rollout.promote",
                    "promote requested: the rollout goes on to its next step",
                ),
                RolloutRequest::Abort => (
                    "abort_requested",
                    "rollout.abort",
                    "abort requested: traffic goes back to the stable release",
                ),
            };
            tx.execute(
                &format!(
                    "UPDATE rollouts SET {column} = 1, updated = ?3 WHERE scope = ?1 AND name = ?2"
                ),
                params![scope, name, now_unix()],
            )?;
            match request {
                RolloutRequest::Promote => state.promote_requested = true,
                RolloutRequest::Abort => state.abort_requested = true,
            }
            let resource = format!("deployment/{scope}/{name}");
            let mut entry = Entry::new(action, &who, ActivityOutcome::Succeeded);
            entry.resource = Some(&resource);
            entry.message = message;
            entry.data = serde_json::json!({
                "release": state.release,
                "step": state.step,
                "share": state.share,
            });
            activity::record(&tx, &entry)?;
            tx.commit()?;
            Ok(Some(state))
        })?;
        if state.is_some() {
            self.mark_changed();
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Origin, Who};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn a_rollout_is_read_back_whole_and_requests_are_recorded() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("state.db");
        let agent = Store::open(&path)?;
        let command = Store::open(&path)?.acting_as(Who::new(Origin::Cli, Some("ops")));
        assert_eq!(
            command.request_rollout("shop", "web", RolloutRequest::Promote)?,
            None,
            "no rollout in flight: nothing to promote"
        );
        let mut state = RolloutState::start("shop", "web", "abc123", "canary");
        state.step = 1;
        state.share = 50;
        state.canary_replicas = 5;
        state.phase = RolloutPhase::Paused;
        state.paused_until = Some(state.started + 30);
        state.verdict = "passed".into();
        state.analysis = serde_json::json!({ "error_rate": 0.0, "p95_ms": 12 });
        agent.save_rollout(&state, Some(RolloutEvent::Paused("paused at 50%")))?;
        let read = agent.rollout_state("shop", "web")?.ok_or("stored")?;
        assert_eq!(
            (read.step, read.share, read.canary_replicas, read.phase),
            (1, 50, 5, RolloutPhase::Paused)
        );
        assert_eq!(read.analysis, state.analysis);
        assert_eq!(read.paused_until, state.paused_until);

        let requested = command
            .request_rollout("shop", "web", RolloutRequest::Promote)?
            .ok_or("in flight")?;
        assert!(requested.promote_requested && !requested.abort_requested);
        assert!(
            agent
                .rollout_state("shop", "web")?
                .ok_or("stored")?
                .promote_requested
        );

        state.phase = RolloutPhase::Aborted;
        agent.save_rollout(&state, Some(RolloutEvent::Aborted("analysis failed")))?;
        assert_eq!(
            command.request_rollout("shop", "web", RolloutRequest::Abort)?,
            None,
            "an aborted canary takes no more requests"
        );
        assert_eq!(agent.rollout_states()?.len(), 1);

        let (rows, _) = agent.activity(0, 10)?;
        let actions: Vec<&str> = rows.iter().map(|row| row.action.as_str()).collect();
        assert_eq!(
            actions,
            ["rollout.pause", "rollout.promote", "rollout.abort"]
        );
        let events: Vec<String> = agent
            .events_after(0, 10)?
            .into_iter()
            .map(|event| event.event)
            .collect();
        assert_eq!(
            events,
            ["rollout.paused", "rollout.promoted", "rollout.aborted"]
        );
        Ok(())
    }
}
