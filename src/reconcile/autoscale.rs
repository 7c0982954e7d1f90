//! The autoscaler, as voodu's (spec §7.8): every tick, for each deployment with
//! `autoscale {}`, the mean CPU% of its running replicas (100 = one core; zero samples are
//! ignored when any is non-zero) is compared with `cpu_target`: above 1.1× it adds one
//! replica (up to `max`, once `cooldown_up` has passed since the last scale-up), below 0.7×
//! it removes one (down to `min`, once `cooldown_down` has passed since the last scale-down).
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

use super::{Ctx, blocking};
use crate::manifest::spec::{Autoscale, Spec};
use crate::model::{ResourceKey, parse_go_duration};
use crate::runtime::{ContainerState, Runtime, labels};

/// voodu's defaults.
const DEFAULT_COOLDOWN_UP: Duration = Duration::from_secs(30);
const DEFAULT_COOLDOWN_DOWN: Duration = Duration::from_secs(300);
const UP_ABOVE: f64 = 1.1;
const DOWN_BELOW: f64 = 0.7;

/// One scaling decision.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Decision {
    pub replicas: usize,
    pub up: bool,
    /// Why, for status and logs.
    pub reason: String,
}

/// When each deployment last scaled up and down.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Cooldowns {
    pub last_up: Option<Instant>,
    pub last_down: Option<Instant>,
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

/// Decides from one CPU sample per running replica.
pub(super) fn decide(
    samples: &[f64],
    autoscale: &Autoscale,
    cooldowns: Cooldowns,
    now: Instant,
) -> Option<Decision> {
    let current = samples.len();
    if current == 0 {
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
            replicas: current + 1,
            up: true,
            reason: format!(
                "mean CPU {mean:.0}% above {:.0}% (target {target:.0}%)",
                target * UP_ABOVE
            ),
        });
    }
    if mean < target * DOWN_BELOW && current > min && elapsed(cooldowns.last_down, cooldown_down) {
        return Some(Decision {
            replicas: current - 1,
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
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let desired = match blocking(&ctx.store, |store| store.desired_all()).await {
            Ok(desired) => desired,
            Err(error) => {
                tracing::warn!(%error, "autoscaler cannot read desired state; next tick");
                continue;
            }
        };
        let scaled: Vec<(ResourceKey, Autoscale)> = desired
            .into_iter()
            .filter_map(|desired| match desired.spec {
                Spec::Deployment(spec) => spec.autoscale.map(|autoscale| (desired.key, autoscale)),
                _ => None,
            })
            .collect();
        cooldowns.retain(|key, _| scaled.iter().any(|(scaled, _)| scaled == key));
        for (key, autoscale) in scaled {
            let samples = sample(&ctx, &key).await;
            let entry = cooldowns.entry(key.clone()).or_default();
            let now = Instant::now();
            let Some(decision) = decide(&samples, &autoscale, *entry, now) else {
                continue;
            };
            if decision.up {
                entry.last_up = Some(now);
            } else {
                entry.last_down = Some(now);
            }
            tracing::info!(%key, from = samples.len(), to = decision.replicas, reason = %decision.reason, "autoscaling");
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
                    ctx.requeue.now(key);
                }
                Err(error) => {
                    tracing::warn!(%key, %error, "cannot record the autoscaler's decision")
                }
            }
        }
    }
}

/// One CPU sample per running replica of `key`, taken concurrently; replicas that cannot be
/// sampled (gone meanwhile) are left out.
async fn sample<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Vec<f64> {
    let filter = [
        (labels::AGENT, ctx.agent_id.as_str()),
        (labels::KIND, key.kind.as_str()),
        (labels::SCOPE, key.scope.as_str()),
        (labels::NAME, key.name.as_str()),
        (labels::ROLE, key.kind.as_str()),
    ];
    let Ok(replicas) = ctx.runtime.list(&filter).await else {
        return Vec::new();
    };
    let samples: Vec<_> = replicas
        .iter()
        .filter(|replica| replica.state == ContainerState::Running)
        .map(|replica| ctx.runtime.cpu_percent(&replica.id))
        .collect();
    futures_util::stream::iter(samples)
        .buffer_unordered(8)
        .filter_map(|sample| async move { sample.ok() })
        .collect()
        .await
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
            decide(&[56.0], &rules, none, now).map(|decision| (decision.replicas, decision.up));
        assert_eq!(up, Some((2, true)), "56% > 55%");
        assert_eq!(
            decide(&[55.0], &rules, none, now),
            None,
            "55% is within the band"
        );
        assert_eq!(
            decide(&[90.0, 90.0, 90.0], &rules, none, now),
            None,
            "at max"
        );
        let down = decide(&[10.0, 20.0], &rules, none, now)
            .map(|decision| (decision.replicas, decision.up));
        assert_eq!(down, Some((1, false)), "15% < 35%");
        assert_eq!(
            decide(&[35.0, 35.0], &rules, none, now),
            None,
            "35% is within the band"
        );
        assert_eq!(decide(&[1.0], &rules, none, now), None, "at min");
        assert_eq!(decide(&[], &rules, none, now), None, "nothing to sample");
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
                &[90.0, 90.0],
                &rules,
                after_up,
                t0 + Duration::from_secs(29)
            ),
            None
        );
        assert!(
            decide(
                &[90.0, 90.0],
                &rules,
                after_up,
                t0 + Duration::from_secs(30)
            )
            .is_some()
        );
        // A scale-up does not hold back a scale-down, and the other way round.
        assert!(decide(&[5.0, 5.0], &rules, after_up, t0).is_some());
        let after_down = Cooldowns {
            last_up: None,
            last_down: Some(t0),
        };
        assert_eq!(
            decide(
                &[5.0, 5.0],
                &rules,
                after_down,
                t0 + Duration::from_secs(299)
            ),
            None
        );
        assert!(
            decide(
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
            decide(&[90.0], &defaults, after_up, t0 + Duration::from_secs(29)),
            None
        );
        assert_eq!(
            decide(
                &[5.0, 5.0],
                &defaults,
                after_down,
                t0 + Duration::from_secs(299)
            ),
            None
        );
    }
}
