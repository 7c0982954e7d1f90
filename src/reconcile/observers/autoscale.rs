//! The autoscaler, as voodu's (spec §7.8): every tick, for each deployment with
//! `autoscale {}`, the mean CPU% of its running replicas (100 = one core; zero samples are
//! ignored when any is non-zero) is compared with `cpu_target`: above 1.1× it adds one
//! replica (up to `max`, once `cooldown_up` has passed since the last scale-up), below 0.7×
//! it removes one (down to `min`, once `cooldown_down` has passed since the last scale-down).
//!
//! The step is taken from the deployment's current desired count (its override, or the
//! manifest's `replicas`), not from how many replicas answered: voodu counts the samples, so
//! a replica crashed or mid-replacement makes it scale from too low a number. A tick where a
//! running replica cannot be sampled is skipped rather than decided on part of the picture.
//!
//! Unlike voodu, the count is written as a replica override in the store, never into desired
//! state or git: the spec hash is untouched (scaling never churns replicas), a commit that
//! keeps `autoscale` keeps the count (clamped to new bounds), and removing `autoscale` clears
//! it (`Store::apply_commit`). Cooldowns live in memory, as voodu's do (the first decision
//! after a start is never held back).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::manifest::spec::{Autoscale, Spec};
use crate::model::{ResourceKey, parse_go_duration};
use crate::reconcile::run::timer::What;
use crate::reconcile::{context::Ctx, context::blocking};
use crate::runtime::{ContainerState, Runtime, labels};
use crate::store::{self, Store};

/// voodu's defaults.
const DEFAULT_COOLDOWN_UP: Duration = Duration::from_secs(30);
const DEFAULT_COOLDOWN_DOWN: Duration = Duration::from_secs(300);
const UP_ABOVE: f64 = 1.1;
const DOWN_BELOW: f64 = 0.7;

/// One scaling decision.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Decision {
    pub(crate) replicas: usize,
    pub(crate) up: bool,
    /// Why, for status and logs.
    pub(crate) reason: String,
}

/// When each deployment last scaled up and down.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Cooldowns {
    pub(crate) last_up: Option<Instant>,
    pub(crate) last_down: Option<Instant>,
}

/// The mean CPU% voodu uses: zero samples are left out when any sample is non-zero.
pub(super) fn mean_cpu(samples: &[f64]) -> f64 {
    let busy: Vec<f64> = samples
        .iter()
        .copied()
        .filter(|sample| *sample > 0.0)
        .collect();
    let used = if busy.is_empty() { samples } else { &busy[..] };
    if used.is_empty() {
        return 0.0;
    }
    used.iter().sum::<f64>() / used.len() as f64
}

/// Decides, for a deployment that wants `current` replicas, from one CPU sample per running
/// replica.
pub(super) fn decide(
    current: usize,
    samples: &[f64],
    autoscale: &Autoscale,
    cooldowns: Cooldowns,
    now: Instant,
) -> Option<Decision> {
    if samples.is_empty() {
        return None;
    }
    let min = usize::try_from(autoscale.min.max(1)).unwrap_or(1);
    let max = usize::try_from(autoscale.max).unwrap_or(min).max(min);
    let target = autoscale.cpu_target as f64;
    let mean = mean_cpu(samples);
    let elapsed = |last: Option<Instant>, cooldown: Duration| {
        last.is_none_or(|last| now.saturating_duration_since(last) >= cooldown)
    };
    let cooldown_up = parse_go_duration(&autoscale.cooldown_up).unwrap_or(DEFAULT_COOLDOWN_UP);
    let cooldown_down =
        parse_go_duration(&autoscale.cooldown_down).unwrap_or(DEFAULT_COOLDOWN_DOWN);
    if mean > target * UP_ABOVE && current < max && elapsed(cooldowns.last_up, cooldown_up) {
        return Some(Decision {
            replicas: (current + 1).min(max),
            up: true,
            reason: format!(
                "mean CPU {mean:.0}% above {:.0}% (target {target:.0}%)",
                target * UP_ABOVE
            ),
        });
    }
    if mean < target * DOWN_BELOW && current > min && elapsed(cooldowns.last_down, cooldown_down) {
        return Some(Decision {
            replicas: current.saturating_sub(1).max(min),
            up: false,
            reason: format!(
                "mean CPU {mean:.0}% below {:.0}% (target {target:.0}%)",
                target * DOWN_BELOW
            ),
        });
    }
    None
}

/// Runs until `shutdown`: one pass every `every`, the first at once.
pub(crate) async fn run<R: Runtime>(
    ctx: Arc<Ctx<R>>,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut cooldowns: HashMap<ResourceKey, Cooldowns> = HashMap::new();
    let mut tick = ctx.timer.every(What::Autoscale, Duration::ZERO, every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let scaled = match blocking(&ctx.store, autoscaled).await {
            Ok(scaled) => scaled,
            Err(error) => {
                tracing::warn!(%error, "autoscaler cannot read desired state; next tick");
                continue;
            }
        };
        cooldowns.retain(|key, _| scaled.iter().any(|(scaled, ..)| scaled == key));
        for (key, autoscale, current) in scaled {
            let Some(samples) = sample(&ctx, &key).await else {
                tracing::debug!(%key, "a replica could not be sampled; autoscaling waits a tick");
                continue;
            };
            let entry = cooldowns.entry(key.clone()).or_default();
            let now = Instant::now();
            let Some(decision) = decide(current, &samples, &autoscale, *entry, now) else {
                continue;
            };
            if decision.up {
                entry.last_up = Some(now);
            } else {
                entry.last_down = Some(now);
            }
            tracing::info!(%key, from = current, to = decision.replicas, reason = %decision.reason, "autoscaling");
            let (write_key, replicas, reason) =
                (key.clone(), decision.replicas, decision.reason.clone());
            let written = blocking(&ctx.store, move |store| {
                store.set_replicas_override(&write_key, replicas, &reason)
            })
            .await;
            match written {
                Ok(()) => {
                    ctx.metrics
                        .record_scaling(if decision.up { "up" } else { "down" });
                    ctx.timer.requeue(key);
                }
                Err(error) => {
                    tracing::warn!(%key, %error, "cannot record the autoscaler's decision")
                }
            }
        }
    }
}

/// Every deployment with `autoscale`, its rules and the count it wants now (one read).
fn autoscaled(store: &Store) -> store::Result<Vec<(ResourceKey, Autoscale, usize)>> {
    let mut scaled = Vec::new();
    for desired in store.desired_autoscaling()? {
        let Spec::Deployment(spec) = desired.spec else {
            continue;
        };
        let Some(autoscale) = spec.autoscale.clone() else {
            continue;
        };
        let current = spec.effective_replicas(desired.replicas_override);
        scaled.push((desired.key, autoscale, current));
    }
    Ok(scaled)
}

/// One CPU sample per running replica of `key`, taken concurrently; `None` when the replicas
/// cannot be listed or one of them cannot be sampled (gone or replaced meanwhile).
async fn sample<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Option<Vec<f64>> {
    let filter = [
        (labels::AGENT, ctx.agent_id.as_str()),
        (labels::KIND, key.kind.as_str()),
        (labels::SCOPE, key.scope.as_str()),
        (labels::NAME, key.name.as_str()),
        (labels::ROLE, key.kind.as_str()),
    ];
    let replicas = ctx.runtime.list(&filter).await.ok()?;
    let samples: Vec<_> = replicas
        .iter()
        .filter(|replica| replica.state == ContainerState::Running)
        .map(|replica| ctx.runtime.cpu_percent(&replica.id))
        .collect();
    futures_util::stream::iter(samples)
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<f64>, _>>()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn autoscale(min: i64, max: i64, cpu_target: i64) -> Autoscale {
        Autoscale {
            min,
            max,
            cpu_target,
            ..Autoscale::default()
        }
    }

    #[test]
    fn the_mean_ignores_idle_samples_unless_all_are_idle() {
        assert_eq!(mean_cpu(&[0.0, 80.0, 40.0]), 60.0);
        assert_eq!(mean_cpu(&[0.0, 0.0]), 0.0);
        assert_eq!(mean_cpu(&[]), 0.0);
    }

    #[test]
    fn scales_one_step_beyond_the_bands_within_bounds() {
        let now = Instant::now();
        let rules = autoscale(1, 3, 50);
        let none = Cooldowns::default();
        let up =
            decide(1, &[56.0], &rules, none, now).map(|decision| (decision.replicas, decision.up));
        assert_eq!(up, Some((2, true)), "56% > 55%");
        assert_eq!(
            decide(1, &[55.0], &rules, none, now),
            None,
            "55% is within the band"
        );
        assert_eq!(
            decide(3, &[90.0, 90.0, 90.0], &rules, none, now),
            None,
            "at max"
        );
        let down = decide(2, &[10.0, 20.0], &rules, none, now)
            .map(|decision| (decision.replicas, decision.up));
        assert_eq!(down, Some((1, false)), "15% < 35%");
        assert_eq!(
            decide(2, &[35.0, 35.0], &rules, none, now),
            None,
            "35% is within the band"
        );
        assert_eq!(decide(1, &[1.0], &rules, none, now), None, "at min");
        assert_eq!(decide(0, &[], &rules, none, now), None, "nothing to sample");
    }

    #[test]
    fn steps_from_the_desired_count_not_from_how_many_replicas_answered() {
        let now = Instant::now();
        let rules = autoscale(1, 5, 50);
        let none = Cooldowns::default();
        // Three wanted, one crashed: two samples, but the step is from three.
        let up = decide(3, &[90.0, 90.0], &rules, none, now).map(|decision| decision.replicas);
        assert_eq!(up, Some(4));
        let down = decide(3, &[5.0, 5.0], &rules, none, now).map(|decision| decision.replicas);
        assert_eq!(down, Some(2));
    }

    #[test]
    fn cooldowns_hold_back_repeated_steps_in_the_same_direction() {
        let t0 = Instant::now();
        let rules = Autoscale {
            cooldown_up: "30s".to_owned(),
            cooldown_down: "5m".to_owned(),
            ..autoscale(1, 5, 50)
        };
        let after_up = Cooldowns {
            last_up: Some(t0),
            last_down: None,
        };
        assert_eq!(
            decide(
                2,
                &[90.0, 90.0],
                &rules,
                after_up,
                t0 + Duration::from_secs(29)
            ),
            None
        );
        assert!(
            decide(
                2,
                &[90.0, 90.0],
                &rules,
                after_up,
                t0 + Duration::from_secs(30)
            )
            .is_some()
        );
        // A scale-up does not hold back a scale-down, and the other way round.
        assert!(decide(2, &[5.0, 5.0], &rules, after_up, t0).is_some());
        let after_down = Cooldowns {
            last_up: None,
            last_down: Some(t0),
        };
        assert_eq!(
            decide(
                2,
                &[5.0, 5.0],
                &rules,
                after_down,
                t0 + Duration::from_secs(299)
            ),
            None
        );
        assert!(
            decide(
                2,
                &[5.0, 5.0],
                &rules,
                after_down,
                t0 + Duration::from_secs(300)
            )
            .is_some()
        );
        // Defaults when the manifest leaves them out: 30s up, 5m down.
        let defaults = autoscale(1, 5, 50);
        assert_eq!(
            decide(
                1,
                &[90.0],
                &defaults,
                after_up,
                t0 + Duration::from_secs(29)
            ),
            None
        );
        assert_eq!(
            decide(
                2,
                &[5.0, 5.0],
                &defaults,
                after_down,
                t0 + Duration::from_secs(299)
            ),
            None
        );
    }
}
