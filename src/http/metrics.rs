//! `GET /metrics`: Prometheus text exposition of the in-memory counters (`crate::metrics`)
//! plus figures read from the store at scrape time: resources by phase, pinned resources and
//! the time of the last applied commit and of the last successful fetch (so they are right after a restart too).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::metrics::render_gauge;
use crate::store::{Store, blocking};

/// Store figures for one scrape.
struct StoreFigures {
    phases: BTreeMap<String, usize>,
    n_pinned: usize,
    last_applied_at: Option<i64>,
    last_fetch_success_at: Option<i64>,
    sinks: Vec<crate::store::SinkState>,
    /// With `--sources`: per source, its last applied commit's time, its last successful
    /// fetch and whether its fetches fail now.
    sources: Vec<SourceFigures>,
    /// Image automation: per followed image (resource, image), whether a newer tag is
    /// available.
    images: Vec<(String, String, bool)>,
    /// Per statefulset with data runs: its backups' figures.
    backups: Vec<crate::store::BackupFigures>,
    /// Every recorded progressive rollout.
    rollouts: Vec<crate::store::RolloutState>,
}

/// A source's name, last applied commit time, last successful fetch, and fetch failing.
type SourceFigures = (String, Option<i64>, Option<i64>, bool);

pub(super) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let figures = match blocking(&state.ctx.store, read_figures).await {
        Ok(figures) => figures,
        Err(error) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
        }
    };
    let mut out = String::new();
    state.ctx.metrics.render(&mut out);
    super::process::render(&mut out);
    render_state(&mut out, &figures);
    render_sources(&mut out, &figures.sources);
    render_images(&mut out, &figures.images);
    render_sinks(&mut out, &figures.sinks);
    render_backups(&mut out, &figures.backups);
    render_rollouts(&mut out, &figures.rollouts);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

/// Each progressive rollout's canary share (percent, with its phase), a canary's step (from
/// 1) and its last analysis verdict (1 passed, 0 failed; absent before the first analysis).
fn render_rollouts(out: &mut String, rollouts: &[crate::store::RolloutState]) {
    if rollouts.is_empty() {
        return;
    }
    let resource =
        |row: &crate::store::RolloutState| format!("deployment/{}/{}", row.scope, row.name);
    let shares: Vec<(Vec<String>, f64)> = rollouts
        .iter()
        .map(|row| {
            (
                vec![
                    resource(row),
                    row.strategy.clone(),
                    row.phase.as_str().to_owned(),
                ],
                f64::from(row.share),
            )
        })
        .collect();
    render_gauge(
        out,
        "voodu_rollout_canary_share_percent",
        "The share of a deployment's traffic (its replicas) the new release of a canary or blue/green rollout takes, in percent.",
        &["resource", "strategy", "phase"],
        &shares,
    );
    let steps: Vec<(Vec<String>, f64)> = rollouts
        .iter()
        .filter(|row| row.strategy != "blue_green")
        .map(|row| (vec![resource(row)], f64::from(row.step.saturating_add(1))))
        .collect();
    if !steps.is_empty() {
        render_gauge(
            out,
            "voodu_rollout_step",
            "The step a canary rollout is at, from 1 (the `step {}` blocks in order).",
            &["resource"],
            &steps,
        );
    }
    let verdicts: Vec<(Vec<String>, f64)> = rollouts
        .iter()
        .filter(|row| !row.verdict.is_empty())
        .map(|row| {
            (
                vec![resource(row)],
                if row.verdict == "passed" { 1.0 } else { 0.0 },
            )
        })
        .collect();
    if !verdicts.is_empty() {
        render_gauge(
            out,
            "voodu_rollout_analysis_passed",
            "1 when the last analysis of a rollout's step passed, 0 when it failed.",
            &["resource"],
            &verdicts,
        );
    }
}

/// The figures the store holds, read in one blocking call.
fn read_figures(store: &Store) -> crate::store::Result<StoreFigures> {
    let mut phases = BTreeMap::new();
    for (_, status) in store.statuses()? {
        *phases.entry(status.phase.as_str().to_owned()).or_insert(0) += 1;
    }
    Ok(StoreFigures {
        phases,
        n_pinned: store.pins()?.len(),
        last_applied_at: store
            .commit_summary()?
            .last_applied
            .map(|record| record.seen_at),
        last_fetch_success_at: store
            .health(crate::store::HEALTH_FETCH)?
            .and_then(|health| health.last_success_at),
        sinks: store.sink_states()?,
        sources: store
            .source_names()?
            .into_iter()
            .map(|name| {
                let source = store.for_source(&name);
                let applied = source
                    .commit_summary()?
                    .last_applied
                    .map(|record| record.seen_at);
                let fetch = source.health(&source.source_key(crate::store::HEALTH_FETCH))?;
                Ok((
                    name,
                    applied,
                    fetch.as_ref().and_then(|health| health.last_success_at),
                    fetch.is_some_and(|health| !health.ok),
                ))
            })
            .collect::<crate::store::Result<Vec<_>>>()?,
        images: super::images::build(store)?
            .into_iter()
            .map(|view| (view.resource, view.image, view.update_available))
            .collect(),
        backups: store.backup_figures()?,
        rollouts: store.rollout_states()?,
    })
}

/// Resources by phase, pinned resources, the last applied commit and the last fetch.
fn render_state(out: &mut String, figures: &StoreFigures) {
    let phases: Vec<(Vec<String>, f64)> = figures
        .phases
        .iter()
        .map(|(phase, count)| (vec![phase.clone()], *count as f64))
        .collect();
    render_gauge(
        out,
        "voodu_resources",
        "Resources by the phase of their last reconcile.",
        &["phase"],
        &phases,
    );
    render_gauge(
        out,
        "voodu_pinned_resources",
        "Resources pinned by an operator rollback (auto-sync paused).",
        &[],
        &[(Vec::new(), figures.n_pinned as f64)],
    );
    if let Some(seen_at) = figures.last_applied_at {
        render_gauge(
            out,
            "voodu_last_applied_commit_timestamp_seconds",
            "Unix time at which the last applied commit reached desired state.",
            &[],
            &[(Vec::new(), seen_at as f64)],
        );
    }
    if let Some(success_at) = figures.last_fetch_success_at {
        render_gauge(
            out,
            "voodu_last_successful_fetch_timestamp_seconds",
            "Unix time of the last fetch of the remote that succeeded (a stale value: fetches fail).",
            &[],
            &[(Vec::new(), success_at as f64)],
        );
    }
}

/// Per source (with several): the last applied commit, the last fetch, whether fetches fail.
fn render_sources(out: &mut String, sources: &[SourceFigures]) {
    if !sources.is_empty() {
        let per_source = |value: fn(&SourceFigures) -> Option<f64>| {
            sources
                .iter()
                .filter_map(|source| value(source).map(|value| (vec![source.0.clone()], value)))
                .collect::<Vec<_>>()
        };
        render_gauge(
            out,
            "voodu_source_last_applied_commit_timestamp_seconds",
            "Unix time at which each source's last applied commit reached desired state.",
            &["source"],
            &per_source(|source| source.1.map(|at| at as f64)),
        );
        render_gauge(
            out,
            "voodu_source_last_successful_fetch_timestamp_seconds",
            "Unix time of each source's last fetch that succeeded.",
            &["source"],
            &per_source(|source| source.2.map(|at| at as f64)),
        );
        render_gauge(
            out,
            "voodu_source_fetch_failing",
            "1 while a source's fetches fail, else 0.",
            &["source"],
            &per_source(|source| Some(if source.3 { 1.0 } else { 0.0 })),
        );
    }
}

/// Per resource with an image_update policy: whether a newer tag was found.
fn render_images(out: &mut String, images: &[(String, String, bool)]) {
    if !images.is_empty() {
        let samples: Vec<(Vec<String>, f64)> = images
            .iter()
            .map(|(resource, image, available)| {
                (
                    vec![resource.clone(), image.clone()],
                    if *available { 1.0 } else { 0.0 },
                )
            })
            .collect();
        render_gauge(
            out,
            "voodu_image_update_available",
            "1 when the image_update policy of a resource found a newer tag than the one it runs.",
            &["resource", "image"],
            &samples,
        );
    }
}

/// One figure of a resource's backups, when it has it.
type Figure = fn(&crate::store::BackupFigures) -> Option<f64>;

/// Per resource with backups: the newest successful backup's time, size and duration, the
/// newest successful verify, and whether the newest backup failed.
fn render_backups(out: &mut String, backups: &[crate::store::BackupFigures]) {
    if backups.is_empty() {
        return;
    }
    #[allow(clippy::cast_precision_loss)] // seconds, bytes: far below 2^53
    let samples =
        |value: fn(&crate::store::BackupFigures) -> Option<f64>| -> Vec<(Vec<String>, f64)> {
            backups
                .iter()
                .filter_map(|figures| Some((vec![figures.resource.clone()], value(figures)?)))
                .collect()
        };
    #[allow(clippy::cast_precision_loss)]
    let gauges: [(&str, &str, Figure); 5] = [
        (
            "voodu_backup_last_success_timestamp_seconds",
            "When the newest successful backup of the resource ended (Unix seconds).",
            |figures| figures.last_success.map(|at| at as f64),
        ),
        (
            "voodu_backup_last_verified_timestamp_seconds",
            "When the newest successful verify of the resource's backups ended (Unix seconds).",
            |figures| figures.last_verified.map(|at| at as f64),
        ),
        (
            "voodu_backup_size_bytes",
            "Bytes the newest successful backup of the resource read.",
            |figures| figures.last_success.map(|_| figures.bytes as f64),
        ),
        (
            "voodu_backup_duration_seconds",
            "How long the newest successful backup of the resource took.",
            |figures| figures.last_success.map(|_| figures.seconds as f64),
        ),
        (
            "voodu_backup_failing",
            "1 when the newest backup of the resource failed.",
            |figures| Some(if figures.failing { 1.0 } else { 0.0 }),
        ),
    ];
    for (name, help, value) in gauges {
        render_gauge(out, name, help, &["resource"], &samples(value));
    }
}

/// Per notification sink: backlog, delivered, dropped, last success and last error.
fn render_sinks(out: &mut String, sinks: &[crate::store::SinkState]) {
    let per_sink = |value: fn(&crate::store::SinkState) -> Option<f64>| -> Vec<(Vec<String>, f64)> {
        sinks
            .iter()
            .filter_map(|sink| value(sink).map(|value| (vec![sink.name.clone()], value)))
            .collect()
    };
    for (name, help, value) in [
        (
            "voodu_notify_backlog",
            "Events not yet handled by each notification sink.",
            (|sink| Some(sink.backlog as f64)) as fn(&crate::store::SinkState) -> Option<f64>,
        ),
        (
            "voodu_notify_delivered",
            "Events each notification sink delivered (kept across restarts).",
            |sink| Some(sink.delivered as f64),
        ),
        (
            "voodu_notify_dropped",
            "Events each notification sink dropped unsent (expired, or pruned before it read them).",
            |sink| Some(sink.dropped as f64),
        ),
        (
            "voodu_notify_last_success_timestamp_seconds",
            "Unix time of each notification sink's last delivery.",
            |sink| sink.last_success.map(|at| at as f64),
        ),
        (
            "voodu_notify_last_error_timestamp_seconds",
            "Unix time of each notification sink's last failed delivery.",
            |sink| sink.last_error_at.map(|at| at as f64),
        ),
    ] {
        let samples = per_sink(value);
        if !samples.is_empty() {
            render_gauge(out, name, help, &["sink"], &samples);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RolloutPhase, RolloutState};

    #[test]
    fn rollouts_render_their_share_and_verdict() {
        let mut out = String::new();
        render_rollouts(&mut out, &[]);
        assert!(out.is_empty(), "no rollout, no family");
        let mut row = RolloutState::start("shop", "web", "abc", "canary");
        row.share = 10;
        row.phase = RolloutPhase::Paused;
        row.verdict = "failed".into();
        render_rollouts(&mut out, &[row]);
        assert!(
            out.contains("voodu_rollout_canary_share_percent{resource=\"deployment/shop/web\",strategy=\"canary\",phase=\"paused\"} 10\n"),
            "{out}"
        );
        assert!(
            out.contains("voodu_rollout_analysis_passed{resource=\"deployment/shop/web\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("voodu_rollout_step{resource=\"deployment/shop/web\"} 1\n"),
            "{out}"
        );
    }
}
