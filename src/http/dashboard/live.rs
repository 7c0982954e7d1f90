//! What makes the dashboard live: the rollout sampler, which keeps the ready replicas of
//! each resource's current release over time (for the plot), and the server-sent events
//! stream a page follows.
//!
//! Neither polls: both wait for the store's change signal (`Store::subscribe_changes`).
//!
//! Invariants: memory is bounded: one series per resource the status table holds, of at
//! most [`MAX_POINTS`] readings (older ones are thinned, never the first or the last); a
//! stream lives at most [`STREAM_LIFETIME`] (shorter than the connection's idle timeout,
//! and the browser reconnects), recomputes at most every [`COALESCE`], sends only what
//! changed, and ends on shutdown; at most [`MAX_STREAMS`] streams run at once (more are
//! answered 503).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::plot::Sample;
use crate::model::ResourceKey;
use crate::store::{Detail, ResourceStatus, Store};

/// Readings kept per series.
pub(crate) const MAX_POINTS: usize = 512;
/// Streams served at once.
pub(crate) const MAX_STREAMS: usize = 32;
/// How long one stream runs before the browser is asked to reconnect.
const STREAM_LIFETIME: Duration = Duration::from_secs(45);
/// Changes closer together than this are sent as one.
const COALESCE: Duration = Duration::from_millis(250);

/// The ready replicas of each resource's current release, as the status table said them.
#[derive(Debug, Default)]
pub(crate) struct RolloutSamples {
    series: Mutex<BTreeMap<ResourceKey, Series>>,
}

#[derive(Debug, Clone)]
struct Series {
    release_id: i64,
    points: Vec<Sample>,
}

impl RolloutSamples {
    /// Adds a reading per resource whose ready or desired count changed, starting a new
    /// series when its release changed; forgets resources no longer in `statuses`.
    pub(crate) fn record(&self, statuses: &[(ResourceKey, ResourceStatus)], at_ms: i64) {
        let mut series = crate::base::lock(&self.series);
        series.retain(|key, _| statuses.iter().any(|(other, _)| other == key));
        for (key, status) in statuses {
            let (Some(release_id), Some(ready)) = (status.release_id, ready_replicas(status))
            else {
                continue;
            };
            let sample = Sample {
                at_ms,
                ready,
                desired: status.desired_replicas,
            };
            let entry = series.entry(key.clone()).or_insert_with(|| Series {
                release_id,
                points: Vec::new(),
            });
            if entry.release_id != release_id {
                *entry = Series {
                    release_id,
                    points: Vec::new(),
                };
            }
            let unchanged = entry
                .points
                .last()
                .is_some_and(|last| (last.ready, last.desired) == (sample.ready, sample.desired));
            if !unchanged {
                entry.points.push(sample);
                thin(&mut entry.points);
            }
        }
    }

    /// The readings of `key`'s current series and its release.
    pub(crate) fn of(&self, key: &ResourceKey) -> Option<(i64, Vec<Sample>)> {
        let series = crate::base::lock(&self.series);
        series
            .get(key)
            .map(|series| (series.release_id, series.points.clone()))
    }
}

/// Replicas ready, for the kinds that publish readiness.
fn ready_replicas(status: &ResourceStatus) -> Option<usize> {
    match &status.detail {
        Detail::Deployment(detail) => Some(detail.ready_replicas),
        Detail::Statefulset(detail) => Some(detail.ready_replicas),
        _ => None,
    }
}

/// Drops every other reading between the first and the last once there are more than
/// [`MAX_POINTS`].
fn thin(points: &mut Vec<Sample>) {
    if points.len() <= MAX_POINTS {
        return;
    }
    let last = points.len() - 1;
    let mut index = 0;
    points.retain(|_| {
        let keep = index == 0 || index == last || index % 2 == 0;
        index += 1;
        keep
    });
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

/// Records a reading after every change of the store until `shutdown`.
pub(crate) async fn sample(
    store: Arc<Store>,
    samples: Arc<RolloutSamples>,
    shutdown: CancellationToken,
) {
    let mut changes = store.subscribe_changes();
    loop {
        let store_for_read = store.clone();
        match tokio::task::spawn_blocking(move || store_for_read.statuses()).await {
            Ok(Ok(statuses)) => samples.record(&statuses, now_ms()),
            Ok(Err(error)) => tracing::debug!(%error, "dashboard: cannot read statuses"),
            Err(error) => tracing::debug!(%error, "dashboard: status read failed"),
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = shutdown.cancelled() => return,
        }
        tokio::time::sleep(COALESCE).await;
    }
}

/// A stream of `update` events: `view()` (a JSON document) now, then after each change of
/// the store when it differs from the last one sent, until [`STREAM_LIFETIME`] or
/// shutdown. `permit` is held while the stream runs.
pub(super) fn stream<F>(
    store: Arc<Store>,
    view: F,
    permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
    lifetime: Duration,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    F: Fn(&Store) -> Option<String> + Send + Sync + 'static,
{
    let view = Arc::new(view);
    let changes = store.subscribe_changes();
    let deadline = tokio::time::Instant::now() + lifetime.min(STREAM_LIFETIME);
    let state = StreamState {
        store,
        view,
        changes,
        last: None,
        first: true,
        permit,
        shutdown,
        deadline,
    };
    let events = futures_util::stream::unfold(state, |mut state| async move {
        loop {
            if !state.first {
                tokio::select! {
                    changed = state.changes.changed() => if changed.is_err() { return None },
                    () = state.shutdown.cancelled() => return None,
                    () = tokio::time::sleep_until(state.deadline) => return None,
                }
                tokio::time::sleep(COALESCE).await;
            }
            state.first = false;
            let store = state.store.clone();
            let view = state.view.clone();
            let document = tokio::task::spawn_blocking(move || view(&store))
                .await
                .ok()
                .flatten();
            let document = document?;
            if state.last.as_ref() == Some(&document) {
                continue;
            }
            state.last = Some(document.clone());
            let event = Event::default()
                .event("update")
                .retry(Duration::from_secs(2))
                .data(document);
            return Some((Ok(event), state));
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

struct StreamState<F> {
    store: Arc<Store>,
    view: Arc<F>,
    changes: tokio::sync::watch::Receiver<u64>,
    last: Option<String>,
    first: bool,
    /// Held for the stream's life: one of [`MAX_STREAMS`].
    #[allow(dead_code)]
    permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
    deadline: tokio::time::Instant,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;
    use crate::store::{DeploymentDetail, Phase};

    fn status(release_id: i64, ready: usize, desired: usize) -> ResourceStatus {
        ResourceStatus {
            release_id: Some(release_id),
            desired_replicas: desired,
            detail: Detail::Deployment(DeploymentDetail {
                autoscaled_replicas: None,
                ready_replicas: ready,
                replicas: Vec::new(),
            }),
            ..ResourceStatus::new(Phase::Progressing, "")
        }
    }

    #[test]
    fn a_series_follows_the_current_release_and_keeps_changes_only() {
        let samples = RolloutSamples::default();
        let key = ResourceKey::new(Kind::Deployment, "s", "web");
        let other = ResourceKey::new(Kind::Deployment, "s", "api");
        samples.record(
            &[
                (key.clone(), status(1, 0, 2)),
                (other.clone(), status(9, 1, 1)),
            ],
            0,
        );
        samples.record(
            &[
                (key.clone(), status(1, 0, 2)),
                (other.clone(), status(9, 1, 1)),
            ],
            10,
        );
        samples.record(&[(key.clone(), status(1, 1, 2))], 20);
        let (release, points) = samples.of(&key).expect("a series");
        assert_eq!(release, 1);
        assert_eq!(
            points
                .iter()
                .map(|p| (p.at_ms, p.ready))
                .collect::<Vec<_>>(),
            [(0, 0), (20, 1)]
        );
        // Gone from the status table: forgotten.
        assert!(samples.of(&other).is_none());
        // A new release starts a new series.
        samples.record(&[(key.clone(), status(2, 1, 3))], 30);
        let (release, points) = samples.of(&key).expect("a series");
        assert_eq!((release, points.len()), (2, 1));
    }

    #[test]
    fn a_long_series_is_thinned_but_keeps_its_ends() {
        let samples = RolloutSamples::default();
        let key = ResourceKey::new(Kind::Deployment, "s", "web");
        for at in 0..2000 {
            samples.record(&[(key.clone(), status(1, (at % 2) as usize, 2))], at);
        }
        let (_, points) = samples.of(&key).expect("a series");
        assert!(points.len() <= MAX_POINTS, "{}", points.len());
        assert_eq!(points.first().map(|p| p.at_ms), Some(0));
        assert_eq!(points.last().map(|p| p.at_ms), Some(1999));
    }
}
