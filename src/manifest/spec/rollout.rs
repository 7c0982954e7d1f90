//! A deployment's progressive-delivery strategy (an extension: voodu has none): `canary {}`
//! (steps of traffic share, each followed by a pause and the analysis) or `blue_green {}` (the
//! new release whole behind a preview host, switched at promote).
//!
//! Invariant: never part of the deployment's spec hash (voodu's): adding, editing or removing
//! the block never replaces a replica; it only decides how the next release rolls out. The
//! decoder (`decode/kinds/rollout.rs`) has checked every field and bound, so the accessors here
//! only read them (and fall back to the documented defaults).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::common::is_false;
use crate::model::parse_go_duration;

/// `pause = "until_promoted"`: the step waits for `voodu-agent promote`.
pub(crate) const UNTIL_PROMOTED: &str = "until_promoted";
/// Steps in one `canary {}`.
pub(crate) const MAX_CANARY_STEPS: usize = 20;
/// `http.samples`: requests per analysis.
pub(crate) const MAX_HTTP_SAMPLES: i64 = 1000;
/// `prometheus.count`: measurements per analysis.
pub(crate) const MAX_PROMETHEUS_COUNT: i64 = 100;
/// `prometheus.url`, `http.path` and `preview_host` lengths.
pub(crate) const MAX_ANALYSIS_TEXT: usize = 2048;
/// `prometheus.query` length.
pub(crate) const MAX_QUERY: usize = 4096;
/// `analysis.interval`, `prometheus.interval`, `http.max_p95`: at most an hour.
pub(crate) const MAX_ANALYSIS_DURATION: Duration = Duration::from_secs(3600);
/// The analysis interval when the block leaves it out.
pub(crate) const DEFAULT_ANALYSIS_INTERVAL: Duration = Duration::from_secs(30);
/// `keep_old` when the block leaves it out.
pub(crate) const DEFAULT_KEEP_OLD: Duration = Duration::from_secs(600);

/// How a deployment's new release reaches its traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    Canary(Canary),
    BlueGreen(BlueGreen),
}

impl Strategy {
    /// The name as written in a manifest (`plan`, `status`).
    pub fn name(&self) -> &'static str {
        match self {
            Strategy::Canary(_) => "canary",
            Strategy::BlueGreen(_) => "blue_green",
        }
    }

    /// How a release rolls out, in words (`plan`): `as a canary: 10% → 50% (until promoted)
    /// → 100%, judged by http /health`.
    pub fn describe(&self) -> String {
        match self {
            Strategy::Canary(canary) => {
                let steps: Vec<String> = canary
                    .steps
                    .iter()
                    .map(|step| match step.pause() {
                        Pause::None => format!("{}%", step.weight),
                        Pause::For(_) => format!("{}% (pause {})", step.weight, step.pause),
                        Pause::UntilPromoted => format!("{}% (until promoted)", step.weight),
                    })
                    .collect();
                let mut judges = Vec::new();
                if let Some(analysis) = &canary.analysis {
                    if let Some(http) = &analysis.http {
                        judges.push(format!("http {}", http.path));
                    }
                    if analysis.prometheus.is_some() {
                        judges.push("prometheus".to_owned());
                    }
                }
                judges.push("replica health".to_owned());
                format!(
                    "as a canary: {}, judged by {}",
                    steps.join(" → "),
                    judges.join(" and ")
                )
            }
            Strategy::BlueGreen(blue_green) => format!(
                "blue/green: the new release previewed at {}, {}, the old kept {} after",
                blue_green.preview_host,
                if blue_green.auto_promote {
                    "promoted once ready"
                } else {
                    "promoted by `voodu-agent promote`"
                },
                crate::manifest::spec::bounds::show_duration(blue_green.keep_old()),
            ),
        }
    }
}

/// `canary { step {…}… analysis {…} }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Canary {
    /// Increasing shares; the last is 100.
    pub steps: Vec<CanaryStep>,
    /// Run after every step below 100 %, once its pause is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,
}

/// `step { weight = 10 pause = "30s" }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanaryStep {
    /// The canary's share of the replicas (so of the requests), in percent: 1..=100.
    pub weight: u32,
    /// Empty (no pause), a Go duration, or `"until_promoted"`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pause: String,
}

/// What a step waits for before its analysis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    None,
    For(Duration),
    UntilPromoted,
}

impl CanaryStep {
    pub fn pause(&self) -> Pause {
        if self.pause == UNTIL_PROMOTED {
            return Pause::UntilPromoted;
        }
        match parse_go_duration(&self.pause) {
            Some(duration) if !duration.is_zero() => Pause::For(duration),
            _ => Pause::None,
        }
    }
}

/// `analysis { interval http {…} prometheus {…} }`: every check given must pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Analysis {
    /// How long the canary takes traffic before it is judged; empty: 30 s.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interval: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpAnalysis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusAnalysis>,
}

impl Analysis {
    pub fn interval(&self) -> Duration {
        parse_go_duration(&self.interval)
            .filter(|duration| !duration.is_zero())
            .unwrap_or(DEFAULT_ANALYSIS_INTERVAL)
    }
}

/// `http { path samples max_error_rate max_p95 }`: requests straight to the canary replicas.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpAnalysis {
    /// Starts with `/`.
    pub path: String,
    /// 1..=1000 requests.
    pub samples: u32,
    /// The largest share of failed requests (5xx, refused, timed out) allowed, in percent.
    pub max_error_percent: u32,
    /// The largest 95th-percentile latency allowed; empty: not judged.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub max_p95: String,
}

impl HttpAnalysis {
    pub fn max_p95(&self) -> Option<Duration> {
        parse_go_duration(&self.max_p95)
    }
}

/// `prometheus { url query max | min interval count }`: an instant query, `count` times,
/// `interval` apart; every result must hold the bound.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrometheusAnalysis {
    /// The server's base URL (`http://prometheus:9090`).
    pub url: String,
    pub query: String,
    /// The bound as written (a finite number); exactly one of `max` and `min` is set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub max: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub min: String,
    /// Empty: 10 s.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interval: String,
    /// 1..=100; 0 means 1.
    #[serde(default)]
    pub count: u32,
}

/// A Prometheus result's bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    Max(f64),
    Min(f64),
}

impl Bound {
    /// Whether `value` holds the bound (NaN never does).
    pub fn holds(self, value: f64) -> bool {
        match self {
            Bound::Max(max) => value <= max,
            Bound::Min(min) => value >= min,
        }
    }
}

impl PrometheusAnalysis {
    pub fn bound(&self) -> Option<Bound> {
        if let Ok(max) = self.max.parse::<f64>() {
            return Some(Bound::Max(max));
        }
        self.min.parse::<f64>().ok().map(Bound::Min)
    }

    pub fn interval(&self) -> Duration {
        parse_go_duration(&self.interval)
            .filter(|duration| !duration.is_zero())
            .unwrap_or(Duration::from_secs(10))
    }

    pub fn count(&self) -> u32 {
        self.count.max(1)
    }
}

/// `blue_green { preview_host auto_promote keep_old }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlueGreen {
    /// The host the new release answers at before promote.
    pub preview_host: String,
    /// Promote as soon as the new release is ready.
    #[serde(default, skip_serializing_if = "is_false")]
    pub auto_promote: bool,
    /// How long the old release stays up after promote; empty: 10 m.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub keep_old: String,
}

impl BlueGreen {
    pub fn keep_old(&self) -> Duration {
        parse_go_duration(&self.keep_old).unwrap_or(DEFAULT_KEEP_OLD)
    }
}

/// The canary replicas for `weight` percent of `replicas` (the deployment's count), by
/// replica share: at least one, rounded to nearest, and all of them at 100 %. With `c`
/// canary replicas beside `s` stable ones and round-robin balancing, the canary takes
/// `c / (c + s)` of the requests.
pub(crate) fn canary_replicas(weight: u32, replicas: usize) -> usize {
    let replicas = replicas.max(1);
    if weight >= 100 {
        return replicas;
    }
    let share = (replicas * weight as usize + 50) / 100;
    share.clamp(1, replicas)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canary_replicas_follow_the_share() {
        assert_eq!(canary_replicas(10, 10), 1);
        assert_eq!(canary_replicas(50, 10), 5);
        assert_eq!(canary_replicas(100, 10), 10);
        // At least one canary replica, never all of them below 100 %.
        assert_eq!(canary_replicas(1, 3), 1);
        assert_eq!(canary_replicas(99, 1), 1);
        assert_eq!(canary_replicas(25, 2), 1);
    }

    #[test]
    fn pauses_and_bounds_read_as_written() {
        let step = |pause: &str| CanaryStep {
            weight: 10,
            pause: pause.into(),
        };
        assert_eq!(step("").pause(), Pause::None);
        assert_eq!(step("30s").pause(), Pause::For(Duration::from_secs(30)));
        assert_eq!(step("until_promoted").pause(), Pause::UntilPromoted);
        let mut prometheus = PrometheusAnalysis {
            max: "0.5".into(),
            ..PrometheusAnalysis::default()
        };
        assert_eq!(prometheus.bound(), Some(Bound::Max(0.5)));
        assert!(Bound::Max(0.5).holds(0.5) && !Bound::Max(0.5).holds(0.6));
        assert!(!Bound::Min(1.0).holds(f64::NAN));
        prometheus.max.clear();
        prometheus.min = "2".into();
        assert_eq!(prometheus.bound(), Some(Bound::Min(2.0)));
        assert_eq!(prometheus.count(), 1);
        assert_eq!(BlueGreen::default().keep_old(), DEFAULT_KEEP_OLD);
    }

    #[test]
    fn a_strategy_says_how_it_rolls_out() {
        let canary = Strategy::Canary(Canary {
            steps: vec![
                CanaryStep {
                    weight: 10,
                    pause: "30s".into(),
                },
                CanaryStep {
                    weight: 50,
                    pause: UNTIL_PROMOTED.into(),
                },
                CanaryStep {
                    weight: 100,
                    pause: String::new(),
                },
            ],
            analysis: Some(Analysis {
                http: Some(HttpAnalysis {
                    path: "/health".into(),
                    ..HttpAnalysis::default()
                }),
                ..Analysis::default()
            }),
        });
        assert_eq!(
            canary.describe(),
            "as a canary: 10% (pause 30s) → 50% (until promoted) → 100%, judged by http /health and replica health"
        );
        let blue_green = Strategy::BlueGreen(BlueGreen {
            preview_host: "next.example.com".into(),
            ..BlueGreen::default()
        });
        assert_eq!(
            blue_green.describe(),
            "blue/green: the new release previewed at next.example.com, promoted by `voodu-agent promote`, the old kept 10m after"
        );
    }
}
