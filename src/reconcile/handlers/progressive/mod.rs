//! A deployment's progressive rollout, one pass at a time: `canary {}` (`canary.rs`: the
//! step's share of replicas beside the stable ones, pauses, analyses) or `blue_green {}`
//! (`blue_green.rs`: the new release whole behind the preview host, switched at promote). Each
//! reads its stored state (`store::RolloutState`), asks its pure machine (`plan::canary`,
//! `plan::blue_green`) for the next move, records it, and tells the replicated pass what to do
//! with the host (`Move`).
//!
//! Invariants: a pass never waits (a pause, a keep or a switch window is a `RequeueAfter`, an
//! analysis a task whose end requeues the key); the state is in the store before the replicas
//! it asks for are created, so a restarted agent resumes where it was; time held never counts
//! against the rollout deadline (`RolloutClock::restart`); a rollback (automatic or the
//! operator's) never rolls out progressively: it goes back at once.

mod blue_green;
mod canary;

use std::time::Duration;

use super::replicas::Observed;
use crate::manifest::spec::rollout::Strategy;
use crate::model::ResourceKey;
use crate::reconcile::run::action::Action;
use crate::reconcile::{context::Ctx, context::blocking, error::Result};
use crate::runtime::{Container, Runtime};
use crate::store::{Release, RolloutEvent, RolloutState, now_unix};

/// A pause or an analysis looks again by itself this often (a restart forgets the tasks).
const RECHECK: Duration = Duration::from_secs(30);

/// What the pass does with the host this time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Move {
    /// No progressive rollout in flight, or it handed over: the ordinary rollout.
    Off,
    /// Bring `canary` replicas of the new release up (and no more) beside the old ones.
    Scale { canary: usize, message: String },
    /// Change nothing now; look again as `action` says.
    Hold { action: Action, message: String },
    /// Remove the new release's replicas and fail the release (`reason`).
    Abort { reason: String },
}

/// The rollout a pass drives: `key`'s `release` of `n_replicas` replicas serving on `port`.
pub(super) struct Subject<'a> {
    pub(super) key: &'a ResourceKey,
    pub(super) release: &'a Release,
    pub(super) n_replicas: usize,
    pub(super) port: u16,
}

/// Whether a replica runs the release's version. A trait object, not a type parameter: each
/// replicated kind passes a closure of its own, and a generic `drive` was compiled once per kind
/// (four copies of the two rollouts' code in the binary, ≈ 69 KB; issue 54).
pub(super) type IsCurrent<'a> = dyn Fn(&Container) -> bool + Sync + 'a;

/// The next move of `subject`'s rollout by `strategy`, from what `observed` saw of its
/// replicas (`is_current`: the release's version).
pub(super) async fn drive<R: Runtime>(
    ctx: &Ctx<R>,
    subject: &Subject<'_>,
    strategy: &Strategy,
    observed: &Observed,
    is_current: &IsCurrent<'_>,
) -> Result<Move> {
    if subject.release.rolled_back_from.is_some() {
        return Ok(Move::Off);
    }
    let next = match strategy {
        Strategy::Canary(canary) => {
            canary::drive(ctx, subject, canary, observed, is_current).await?
        }
        Strategy::BlueGreen(blue_green) => {
            blue_green::drive(ctx, subject, blue_green, observed, is_current).await?
        }
    };
    // Time held never counts against the rollout deadline.
    if let Move::Hold { .. } = next {
        ctx.memory
            .rollouts
            .restart(subject.release.id, tokio::time::Instant::now());
    }
    Ok(next)
}

/// The replicas `observed` saw, split: (the release's, the others), and how many of each
/// are ready.
fn sides<'a>(
    observed: &'a Observed,
    is_current: &IsCurrent<'_>,
) -> (Vec<&'a Container>, Vec<&'a Container>, usize, usize) {
    let (current, stable): (Vec<&Container>, Vec<&Container>) =
        observed.actual.iter().partition(|c| is_current(c));
    let current_ready = current.iter().filter(|c| observed.is_ready(c)).count();
    let stable_ready = stable.iter().filter(|c| observed.is_ready(c)).count();
    (current, stable, current_ready, stable_ready)
}

/// `key`'s stored rollout when it is `release`'s; else a fresh one of `strategy` (saved),
/// unless nothing of an older release serves (a first deploy: nothing to shift from, so
/// `None`, the ordinary rollout).
async fn state_of<R: Runtime>(
    ctx: &Ctx<R>,
    subject: &Subject<'_>,
    strategy: &str,
    stable_ready: usize,
    fresh: impl FnOnce(&mut RolloutState),
) -> Result<Option<RolloutState>> {
    let tag = subject.release.id.to_string();
    let (scope, name) = (subject.key.scope.clone(), subject.key.name.clone());
    let stored = blocking(&ctx.store, move |store| store.rollout_state(&scope, &name)).await?;
    match stored {
        Some(state) if state.release == tag => Ok(Some(state)),
        _ if stable_ready == 0 => Ok(None),
        _ => {
            let mut state =
                RolloutState::start(&subject.key.scope, &subject.key.name, &tag, strategy);
            fresh(&mut state);
            save(ctx, &state, None).await?;
            Ok(Some(state))
        }
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Wait until unix time `until` (`None`: look again after `RECHECK`).
fn hold(until: Option<i64>, message: String) -> Move {
    let wait = until.map_or(RECHECK, |until| {
        Duration::from_secs(u64::try_from(until.saturating_sub(now_unix())).unwrap_or(0))
    });
    Move::Hold {
        action: Action::RequeueAfter(wait.max(Duration::from_millis(100))),
        message,
    }
}

/// A transition worth an activity row and an outbox event (`RolloutEvent`, owned).
enum Event {
    Paused(String),
    Promoted(String),
    Aborted(String),
}

async fn save<R: Runtime>(ctx: &Ctx<R>, state: &RolloutState, event: Option<Event>) -> Result<()> {
    let state = state.clone();
    blocking(&ctx.store, move |store| {
        let event = event.as_ref().map(|event| match event {
            Event::Paused(text) => RolloutEvent::Paused(text),
            Event::Promoted(text) => RolloutEvent::Promoted(text),
            Event::Aborted(text) => RolloutEvent::Aborted(text),
        });
        store.save_rollout(&state, event)
    })
    .await
}
