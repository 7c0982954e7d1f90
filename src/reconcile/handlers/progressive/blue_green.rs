//! A deployment's blue/green rollout (`blue_green {}`), one pass at a time: the new release
//! comes up whole beside the old one (its replicas recorded as `green`, which the router
//! sends the preview host to, `router::split`); `promote` (or `auto_promote`) records the
//! switch, and the router sends every host to the new release in one proxy load; the old
//! release is kept for `keep_old`, then the ordinary rollout retires it; `abort` switches
//! the hosts back first and removes the new replicas once the switch had time to reach the
//! proxy (`plan::blue_green::SWITCH`), then fails the release.
//!
//! Invariants: the decision is `plan::blue_green::decide`'s; the `green` list is saved before
//! the router needs it (a preview host reaches only replicas of the new release, the hosts
//! only the old ones until promote); a replica is removed only after the hosts were switched
//! away from it.

use super::{Event, IsCurrent, Move, Subject, count, hold, save, sides, state_of};
use crate::manifest::spec::rollout::BlueGreen;
use crate::reconcile::handlers::replicas::Observed;
use crate::reconcile::plan::blue_green::{self as plan, Decision};
use crate::reconcile::{context::Ctx, error::Result};
use crate::runtime::Runtime;
use crate::store::{RolloutPhase, now_unix};

/// The strategy's name in the store.
const BLUE_GREEN: &str = "blue_green";

/// The next move of `subject`'s blue/green rollout, from what `observed` saw of its replicas
/// (`is_current`: the release's version).
pub(super) async fn drive<R: Runtime>(
    ctx: &Ctx<R>,
    subject: &Subject<'_>,
    blue_green: &BlueGreen,
    observed: &Observed,
    is_current: &IsCurrent<'_>,
) -> Result<Move> {
    let (key, n_replicas) = (subject.key, subject.n_replicas);
    let (current, stable, current_ready, stable_ready) = sides(observed, is_current);
    let fresh = |state: &mut crate::store::RolloutState| state.canary_replicas = count(n_replicas);
    let Some(mut state) = state_of(ctx, subject, BLUE_GREEN, stable_ready, fresh).await? else {
        return Ok(Move::Off);
    };
    let now = now_unix();
    let mut green: Vec<String> = current.iter().map(|c| c.name.clone()).collect();
    green.sort_unstable();
    let seen = plan::Seen {
        new_ready: current.len() >= n_replicas && current_ready >= n_replicas,
        old_left: !stable.is_empty(),
        now,
    };
    let decision = plan::decide(
        blue_green,
        plan::State {
            phase: state.phase,
            until: state.paused_until,
            promote_requested: state.promote_requested,
            abort_requested: state.abort_requested,
        },
        seen,
    );
    let preview = &blue_green.preview_host;
    let target = format!("{}/{}", key.scope, key.name);
    // Before promote, the preview host follows the new replicas as they come.
    if matches!(
        state.phase,
        RolloutPhase::Progressing | RolloutPhase::Paused
    ) && state.green != green
    {
        state.green.clone_from(&green);
        save(ctx, &state, None).await?;
        ctx.router.wake();
    }
    Ok(match decision {
        Decision::Scale => Move::Scale {
            canary: n_replicas,
            message: format!(
                "blue/green: the new release coming up whole at {preview} ({current_ready} of {n_replicas} ready)"
            ),
        },
        Decision::BeginPause => {
            state.phase = RolloutPhase::Paused;
            let message = format!(
                "the new release answers at {preview}; `voodu-agent promote {target}` switches every request to it"
            );
            save(ctx, &state, Some(Event::Paused(message.clone()))).await?;
            hold(None, format!("blue/green: {message}"))
        }
        Decision::Wait => hold(
            None,
            format!(
                "blue/green: the new release answers at {preview}; waiting for `voodu-agent promote {target}`"
            ),
        ),
        Decision::Promote { keep_until } => {
            state.phase = RolloutPhase::Promoted;
            state.share = 100;
            state.paused_until = Some(keep_until);
            state.promote_requested = false;
            state.green = green;
            let message = format!(
                "every request goes to the new release; the old one is kept for {} s (`voodu-agent abort {target}` switches back)",
                keep_until.saturating_sub(now)
            );
            save(ctx, &state, Some(Event::Promoted(message.clone()))).await?;
            ctx.router.wake();
            hold(Some(keep_until), format!("blue/green: promoted: {message}"))
        }
        Decision::Keep { until } => hold(
            Some(until),
            format!(
                "blue/green: promoted; the old release is kept for {} s more (`voodu-agent abort {target}` switches back)",
                until.saturating_sub(now)
            ),
        ),
        Decision::RetireOld | Decision::Done => Move::Off,
        Decision::SwitchBack { until } => {
            if state.phase != RolloutPhase::Aborted {
                state.phase = RolloutPhase::Aborted;
                state.share = 0;
                state.paused_until = Some(until);
                state.abort_requested = false;
                let message = "switched every request back to the old release".to_owned();
                save(ctx, &state, Some(Event::Aborted(message))).await?;
                ctx.router.wake();
            }
            hold(
                Some(until),
                "blue/green: switching every request back to the old release".to_owned(),
            )
        }
        Decision::Abort { reason } => {
            if state.phase != RolloutPhase::Aborted {
                // The hosts never left the old release; the new one's replicas are removed
                // now, and kept apart meanwhile (`router::split`).
                state.phase = RolloutPhase::Aborted;
                state.share = 0;
                state.paused_until = Some(now);
                state.abort_requested = false;
                save(ctx, &state, Some(Event::Aborted(reason.clone()))).await?;
                ctx.router.wake();
            }
            Move::Abort {
                reason: format!("blue/green aborted: {reason}"),
            }
        }
    })
}
