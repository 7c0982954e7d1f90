//! Process metrics the stages record and `GET /metrics` renders in the Prometheus text
//! exposition format (version 0.0.4), hand-written: a few counters and histograms need no
//! metrics framework.
//!
//! Invariants: this module depends on nothing else in the crate, so every layer may record
//! into it; one `Metrics` is created by `agent` and passed down (no global registry); label
//! sets are small closed vocabularies (kinds, results), so the maps stay bounded.

use crate::base::lock;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// The crate's version, as `--version` and `voodu_agent_build_info` show it.
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit the binary was built from (12 hex digits), or `unknown` when it was built
/// outside a git checkout (`build.rs`).
pub(crate) const COMMIT: &str = env!("VOODU_AGENT_COMMIT");

/// Bucket bounds (seconds) of the sync duration histogram: a fetch of an unchanged repo is
/// milliseconds, a large commit seconds.
const SYNC_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Bucket bounds (seconds) of the reconcile duration histogram: a converged resource is one
/// list call, a rollout of many replicas minutes.
const RECONCILE_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Everything the agent counts in memory. Store-derived figures (resources by phase, the last
/// applied commit) are read from the store at scrape time instead, so they survive restarts.
pub struct Metrics {
    syncs: Histograms,
    reconciles: Histograms,
    webhook_requests: Counters,
    releases: Counters,
    rollbacks: Counters,
    drift: Counters,
    scaling: Counters,
    journal_errors: Counters,
    /// Images refused for their signature, by reason; digests resolved, by how.
    image_refusals: Counters,
    image_resolutions: Counters,
    /// Entries the reconciler's one timer holds, by what they wait for (a gauge).
    timer_waits: Mutex<BTreeMap<&'static str, usize>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            syncs: Histograms::new(SYNC_BUCKETS),
            reconciles: Histograms::new(RECONCILE_BUCKETS),
            webhook_requests: Counters::default(),
            releases: Counters::default(),
            rollbacks: Counters::default(),
            drift: Counters::default(),
            scaling: Counters::default(),
            journal_errors: Counters::default(),
            image_refusals: Counters::default(),
            image_resolutions: Counters::default(),
            timer_waits: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// One sync (fetch, and apply or reject when the branch moved) ended with `result`
    /// (`applied`, `rejected`, `unchanged` or `error`).
    pub(crate) fn record_sync(&self, result: &str, elapsed: Duration) {
        self.syncs.observe(&[result], elapsed);
    }

    /// One reconcile of a resource of `kind` ended with `result` (`success`, `error`, `panic`).
    pub(crate) fn record_reconcile(&self, kind: &str, result: &str, elapsed: Duration) {
        self.reconciles.observe(&[kind, result], elapsed);
    }

    /// One webhook request was answered with `result` (`accepted`, `ignored`, `unauthorized`, …).
    pub(crate) fn record_webhook(&self, result: &str) {
        self.webhook_requests.add(&[result], 1);
    }

    /// A release of a resource of `kind` ended in `phase` (`succeeded`, `failed`).
    pub(crate) fn record_release(&self, kind: &str, phase: &str) {
        self.releases.add(&[kind, phase], 1);
    }

    /// A failed rollout of a resource of `kind` was rolled back automatically.
    pub(crate) fn record_rollback(&self, kind: &str) {
        self.rollbacks.add(&[kind], 1);
    }

    /// A drift signal (`event`: a container event; `resync`: the periodic comparison) asked
    /// for a resource of `kind` to be repaired.
    pub(crate) fn record_drift(&self, kind: &str, source: &str) {
        self.drift.add(&[kind, source], 1);
    }

    /// The autoscaler changed a deployment's replicas (`up` or `down`).
    pub(crate) fn record_scaling(&self, direction: &str) {
        self.scaling.add(&[direction], 1);
    }

    /// The reconciler could not read the journal (`tail`) or its boot state (`boot`); it
    /// tries again on the retry schedule.
    pub(crate) fn record_journal_error(&self, stage: &str) {
        self.journal_errors.add(&[stage], 1);
    }

    /// An image was refused for its signature (`reason`: `no_signature`, `untrusted_key`,
    /// `other_digest`, `bad_payload`, `registry`).
    pub(crate) fn record_image_refusal(&self, reason: &str) {
        self.image_refusals.add(&[reason], 1);
    }

    /// An image of a release was resolved (`how`: `registry`, `local`, `pinned`,
    /// `host_copy`).
    pub(crate) fn record_image_resolution(&self, how: &str) {
        self.image_resolutions.add(&[how], 1);
    }

    /// Journal read errors counted so far at `stage`.
    pub fn journal_errors(&self, stage: &str) -> u64 {
        lock(&self.journal_errors.values)
            .get(&vec![stage.to_owned()])
            .copied()
            .unwrap_or(0)
    }

    /// Automatic rollbacks counted so far for `kind`.
    pub fn rollbacks(&self, kind: &str) -> u64 {
        lock(&self.rollbacks.values)
            .get(&vec![kind.to_owned()])
            .copied()
            .unwrap_or(0)
    }

    #[cfg(test)]
    /// Syncs counted so far with `result` (tests and the flood check use it).
    pub(crate) fn syncs(&self, result: &str) -> u64 {
        self.syncs.count(&[result])
    }

    /// Every sync counted so far, whatever its result.
    pub fn syncs_total(&self) -> u64 {
        self.syncs.total()
    }

    /// Replaces the timer's pending entries by what they wait for.
    pub(crate) fn set_timer_waits(&self, counts: &[(&'static str, usize)]) {
        let mut waits = lock(&self.timer_waits);
        for (what, n) in counts {
            waits.insert(what, *n);
        }
    }

    /// Appends the in-memory families in text exposition format.
    pub(crate) fn render(&self, out: &mut String) {
        self.syncs.render(
            out,
            "voodu_syncs",
            "Syncs (fetch, then apply or reject when the branch moved) by result.",
            "voodu_sync_duration_seconds",
            "Duration of one sync, by result.",
            &["result"],
        );
        self.reconciles.render(
            out,
            "voodu_reconciles",
            "Reconciles of one resource, by kind and result.",
            "voodu_reconcile_duration_seconds",
            "Duration of one reconcile, by kind and result.",
            &["kind", "result"],
        );
        self.webhook_requests.render(
            out,
            "voodu_webhook_requests_total",
            "Webhook requests by result.",
            &["result"],
        );
        self.releases.render(
            out,
            "voodu_releases_total",
            "Releases that ended, by kind and phase.",
            &["kind", "phase"],
        );
        self.rollbacks.render(
            out,
            "voodu_rollbacks_total",
            "Failed rollouts rolled back automatically, by kind.",
            &["kind"],
        );
        self.drift.render(
            out,
            "voodu_drift_detected_total",
            "Resources queued for repair because the host drifted, by kind and source (event, resync).",
            &["kind", "source"],
        );
        self.scaling.render(
            out,
            "voodu_autoscale_changes_total",
            "Replica changes made by the autoscaler, by direction.",
            &["direction"],
        );
        self.journal_errors.render(
            out,
            "voodu_reconciler_store_errors_total",
            "Times the reconciler could not read the journal (tail) or its boot state (boot); each is retried.",
            &["stage"],
        );
        self.image_refusals.render(
            out,
            "voodu_image_refusals_total",
            "Images not run because their digest has no trusted signature (--require-signature), by reason.",
            &["reason"],
        );
        self.image_resolutions.render(
            out,
            "voodu_image_resolutions_total",
            "Images of releases resolved to what they run as, by how (registry, local, pinned, host_copy).",
            &["how"],
        );
        let waits: Vec<(Vec<String>, f64)> = lock(&self.timer_waits)
            .iter()
            .map(|(what, n)| (vec![(*what).to_owned()], *n as f64))
            .collect();
        render_gauge(
            out,
            "voodu_timer_waits",
            "Waits the reconciler's one timer holds, by what they wait for (pass: a key's delayed pass; resync, autoscale, router, probe, cron: periodic work; unit: run deadlines; notify, store: retry pauses).",
            &["what"],
            &waits,
        );
    }
}

/// Writes one gauge family: `samples` are `(label values, value)` for `label_names`.
pub(crate) fn render_gauge(
    out: &mut String,
    name: &str,
    help: &str,
    label_names: &[&str],
    samples: &[(Vec<String>, f64)],
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    for (values, value) in samples {
        let _ = writeln!(
            out,
            "{name}{} {}",
            labels(label_names, values, None),
            number(*value)
        );
    }
}

/// Counters keyed by label values.
#[derive(Default)]
struct Counters {
    values: Mutex<BTreeMap<Vec<String>, u64>>,
}

impl Counters {
    fn add(&self, label_values: &[&str], n: u64) {
        let key = label_values
            .iter()
            .map(|value| (*value).to_owned())
            .collect();
        *lock(&self.values).entry(key).or_insert(0) += n;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, label_names: &[&str]) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (values, count) in lock(&self.values).iter() {
            let _ = writeln!(out, "{name}{} {count}", labels(label_names, values, None));
        }
    }
}

/// Histograms keyed by label values; each also yields the `_total` counter of its events, so
/// "syncs by result" and "sync duration" come from one observation.
struct Histograms {
    bounds: &'static [f64],
    series: Mutex<BTreeMap<Vec<String>, Series>>,
}

struct Series {
    /// Non-cumulative counts per bucket; the last slot is `+Inf`.
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histograms {
    fn new(bounds: &'static [f64]) -> Histograms {
        Histograms {
            bounds,
            series: Mutex::new(BTreeMap::new()),
        }
    }

    fn observe(&self, label_values: &[&str], elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let key: Vec<String> = label_values
            .iter()
            .map(|value| (*value).to_owned())
            .collect();
        let mut series = lock(&self.series);
        let entry = series.entry(key).or_insert_with(|| Series {
            buckets: vec![0; self.bounds.len() + 1],
            sum: 0.0,
            count: 0,
        });
        let slot = self
            .bounds
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(self.bounds.len());
        entry.buckets[slot] += 1;
        entry.sum += seconds;
        entry.count += 1;
    }

    #[cfg(test)]
    fn count(&self, label_values: &[&str]) -> u64 {
        let key: Vec<String> = label_values
            .iter()
            .map(|value| (*value).to_owned())
            .collect();
        lock(&self.series)
            .get(&key)
            .map_or(0, |series| series.count)
    }

    fn total(&self) -> u64 {
        lock(&self.series).values().map(|series| series.count).sum()
    }

    fn render(
        &self,
        out: &mut String,
        counter: &str,
        counter_help: &str,
        histogram: &str,
        histogram_help: &str,
        label_names: &[&str],
    ) {
        let series = lock(&self.series);
        let _ = writeln!(out, "# HELP {counter}_total {counter_help}");
        let _ = writeln!(out, "# TYPE {counter}_total counter");
        for (values, entry) in series.iter() {
            let _ = writeln!(
                out,
                "{counter}_total{} {}",
                labels(label_names, values, None),
                entry.count
            );
        }
        let _ = writeln!(out, "# HELP {histogram} {histogram_help}");
        let _ = writeln!(out, "# TYPE {histogram} histogram");
        for (values, entry) in series.iter() {
            let mut cumulative = 0;
            for (index, count) in entry.buckets.iter().enumerate() {
                cumulative += count;
                let bound = self
                    .bounds
                    .get(index)
                    .map_or_else(|| "+Inf".to_owned(), |bound| number(*bound));
                let _ = writeln!(
                    out,
                    "{histogram}_bucket{} {cumulative}",
                    labels(label_names, values, Some(&bound))
                );
            }
            let _ = writeln!(
                out,
                "{histogram}_sum{} {}",
                labels(label_names, values, None),
                number(entry.sum)
            );
            let _ = writeln!(
                out,
                "{histogram}_count{} {}",
                labels(label_names, values, None),
                entry.count
            );
        }
    }
}

/// `{a="x",b="y"}` (plus `le` for buckets), values escaped as the format requires; empty when
/// there are no labels.
fn labels(names: &[&str], values: &[String], le: Option<&str>) -> String {
    let mut pairs: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A float as Prometheus prints it: integers without a fraction.
fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_render_cumulative_buckets_sum_count_and_a_total() {
        let metrics = Metrics::new();
        metrics.record_sync("applied", Duration::from_millis(20));
        metrics.record_sync("applied", Duration::from_secs(2));
        metrics.record_sync("unchanged", Duration::from_millis(1));
        metrics.record_webhook("accepted");
        metrics.record_webhook("accepted");
        metrics.record_reconcile("deployment", "success", Duration::from_millis(300));
        let mut out = String::new();
        metrics.render(&mut out);
        for expected in [
            "# TYPE voodu_syncs_total counter",
            "voodu_syncs_total{result=\"applied\"} 2",
            "voodu_syncs_total{result=\"unchanged\"} 1",
            "# TYPE voodu_sync_duration_seconds histogram",
            "voodu_sync_duration_seconds_bucket{result=\"applied\",le=\"0.01\"} 0",
            "voodu_sync_duration_seconds_bucket{result=\"applied\",le=\"0.025\"} 1",
            "voodu_sync_duration_seconds_bucket{result=\"applied\",le=\"2.5\"} 2",
            "voodu_sync_duration_seconds_bucket{result=\"applied\",le=\"+Inf\"} 2",
            "voodu_sync_duration_seconds_sum{result=\"applied\"} 2.02",
            "voodu_sync_duration_seconds_count{result=\"applied\"} 2",
            "voodu_reconciles_total{kind=\"deployment\",result=\"success\"} 1",
            "voodu_webhook_requests_total{result=\"accepted\"} 2",
        ] {
            assert!(
                out.lines().any(|line| line == expected),
                "missing {expected:?} in\n{out}"
            );
        }
        assert_eq!(metrics.syncs("applied"), 2);
        assert_eq!(metrics.syncs_total(), 3);
    }

    #[test]
    fn gauges_and_label_values_are_escaped() {
        let mut out = String::new();
        render_gauge(
            &mut out,
            "voodu_resources",
            "Resources by phase.",
            &["phase"],
            &[(vec!["a\"b\\c\nd".to_owned()], 3.0)],
        );
        assert_eq!(
            out,
            "# HELP voodu_resources Resources by phase.\n# TYPE voodu_resources gauge\nvoodu_resources{phase=\"a\\\"b\\\\c\\nd\"} 3\n"
        );
    }
}
