//! Decide the next move of a canary rollout (`canary {}`): from the stored step state
//! (`store::RolloutState`), the step's canary replicas' readiness and health, the analysis's
//! progress and the clock, one decision: scale the canary to the step's share, pause, wait,
//! analyse, advance, complete at 100 %, or abort.
//!
//! Invariants: pure (the handler acts, `status` and the tests read the same answer); an abort
//! request or the canary's own health failing wins over everything else; a step never grows
//! the canary past its share (`canary_replicas` of the step the state names), so a restarted
//! agent resumes the same step with the same share; a pause ends only at its deadline or at
//! `promote`; the analysis judges a step once, after its pause; the last step (100 %) is
//! handed to the ordinary rollout, which replaces the stable replicas.
//!
//! The analyses' judgements are here too (`judge_http`, `judge_prometheus`,
//! `prometheus_values`): what the measuring task saw → the values recorded and the verdict.

use std::time::Duration;

use serde_json::{Value, json};

use crate::manifest::spec::rollout::{
    Bound, Canary, HttpAnalysis, Pause, PrometheusAnalysis, canary_replicas,
};
use crate::store::RolloutPhase;

/// What the decision reads of the stored rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepState {
    pub(crate) step: u32,
    pub(crate) phase: RolloutPhase,
    /// Unix seconds a timed pause ends; set when the pause began.
    pub(crate) paused_until: Option<i64>,
    pub(crate) promote_requested: bool,
    pub(crate) abort_requested: bool,
}

/// Where the step's analysis is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnalysisProgress {
    /// Not started for this step.
    NotStarted,
    /// A task is measuring; its end requeues the key.
    Running,
    Passed,
    Failed,
}

/// What the handler observed this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observed {
    /// The step's canary replicas all run the new spec and are ready.
    pub(crate) canary_ready: bool,
    /// A canary replica failed (crash loop, readiness deadline): the release is bad.
    pub(crate) canary_failed: bool,
    pub(crate) analysis: AnalysisProgress,
    /// Unix seconds.
    pub(crate) now: i64,
}

/// The next move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CanaryDecision {
    /// Run `canary_replicas` new-spec replicas beside the stable ones (the step's share);
    /// check again when they are ready.
    Scale { share: u32, canary_replicas: usize },
    /// The step's replicas are ready: begin its pause (record `paused`); a timed one ends at
    /// `until`, `None` waits for `promote`.
    BeginPause { until: Option<i64> },
    /// Still paused: requeue at `until` (`None`: wait for `promote`, which nudges the agent).
    Wait { until: Option<i64> },
    /// Start the step's analysis off the worker.
    Analyse,
    /// The analysis is running: its end requeues the key.
    AwaitAnalysis,
    /// The step passed: go on to step `step` (record it, then scale).
    Advance { step: u32 },
    /// The step at 100 % is reached: the ordinary rollout replaces the stable replicas.
    Complete,
    /// Stop: the canary replicas go, traffic is back on the stable release, the release
    /// fails (the automatic rollback and pin rules apply).
    Abort { reason: String },
    /// Nothing to do: the rollout is over.
    Done,
}

/// The next move of `canary` for a deployment of `replicas` replicas.
pub(crate) fn decide(
    canary: &Canary,
    replicas: usize,
    state: StepState,
    observed: Observed,
) -> CanaryDecision {
    if state.phase.is_final() {
        return CanaryDecision::Done;
    }
    if state.abort_requested {
        return CanaryDecision::Abort {
            reason: "aborted by `voodu-agent abort`".to_owned(),
        };
    }
    if observed.canary_failed {
        return CanaryDecision::Abort {
            reason: "a canary replica failed its health".to_owned(),
        };
    }
    let index = state.step as usize;
    let Some(step) = canary.steps.get(index) else {
        // A shorter list than the stored step (the block was edited mid-rollout): finish.
        return CanaryDecision::Complete;
    };
    if step.weight >= 100 {
        return CanaryDecision::Complete;
    }
    if !observed.canary_ready {
        return CanaryDecision::Scale {
            share: step.weight,
            canary_replicas: canary_replicas(step.weight, replicas),
        };
    }
    let pause_over = match (state.phase, step.pause()) {
        (_, Pause::None) => true,
        (RolloutPhase::Paused, Pause::UntilPromoted) => state.promote_requested,
        (RolloutPhase::Paused, Pause::For(_)) => {
            // `promote` also ends a timed pause early.
            state.promote_requested || state.paused_until.is_some_and(|end| observed.now >= end)
        }
        (_, Pause::UntilPromoted) if state.paused_until.is_none() => {
            return CanaryDecision::BeginPause { until: None };
        }
        (_, Pause::For(duration)) if state.paused_until.is_none() => {
            let seconds = i64::try_from(duration.as_secs()).unwrap_or(i64::MAX);
            return CanaryDecision::BeginPause {
                until: Some(observed.now.saturating_add(seconds)),
            };
        }
        // Progressing with the pause's deadline recorded: the pause is over.
        _ => true,
    };
    if !pause_over {
        return CanaryDecision::Wait {
            until: match step.pause() {
                Pause::UntilPromoted => None,
                _ => state.paused_until,
            },
        };
    }
    if canary.analysis.is_some() {
        match observed.analysis {
            AnalysisProgress::NotStarted => return CanaryDecision::Analyse,
            AnalysisProgress::Running => return CanaryDecision::AwaitAnalysis,
            AnalysisProgress::Failed => {
                return CanaryDecision::Abort {
                    reason: format!("the analysis failed at {} %", step.weight),
                };
            }
            AnalysisProgress::Passed => {}
        }
    }
    CanaryDecision::Advance {
        step: state.step + 1,
    }
}

/// One request of an `http` analysis: its status (`None`: refused, reset or timed out) and
/// how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) status: Option<u16>,
    pub(crate) latency: Duration,
}

/// An analysis's outcome: the values recorded in the store and whether they pass.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Judgement {
    pub(crate) passed: bool,
    pub(crate) values: Value,
}

/// Judges an `http` analysis: a request fails on no answer or a 5xx; the error share must be
/// at most `max_error_percent`, and the 95th-percentile latency (nearest rank) at most
/// `max_p95` when set. No sample at all fails.
pub(crate) fn judge_http(spec: &HttpAnalysis, samples: &[Sample]) -> Judgement {
    if samples.is_empty() {
        return Judgement {
            passed: false,
            values: json!({ "samples": 0 }),
        };
    }
    let errors = samples
        .iter()
        .filter(|sample| sample.status.is_none_or(|status| status >= 500))
        .count();
    let error_percent = errors as f64 * 100.0 / samples.len() as f64;
    let mut latencies: Vec<Duration> = samples.iter().map(|sample| sample.latency).collect();
    latencies.sort_unstable();
    let rank = (latencies.len() * 95).div_ceil(100).max(1) - 1;
    let p95 = latencies[rank.min(latencies.len() - 1)];
    let errors_ok = error_percent <= f64::from(spec.max_error_percent);
    let latency_ok = spec.max_p95().is_none_or(|max| p95 <= max);
    Judgement {
        passed: errors_ok && latency_ok,
        values: json!({
            "samples": samples.len(),
            "errors": errors,
            "error_percent": error_percent,
            "p95_ms": p95.as_millis() as u64,
        }),
    }
}

/// The numbers of a Prometheus instant query's answer (`/api/v1/query`): a scalar, or each
/// series of a vector. An error status, another result type or an unreadable number is an
/// error, told as the reason.
pub(crate) fn prometheus_values(answer: &Value) -> Result<Vec<f64>, String> {
    if answer["status"] != "success" {
        return Err(format!(
            "prometheus answered {}: {}",
            answer["status"],
            answer["error"].as_str().unwrap_or("no error text")
        ));
    }
    let number = |pair: &Value| -> Result<f64, String> {
        pair[1]
            .as_str()
            .and_then(|text| text.parse::<f64>().ok())
            .ok_or_else(|| format!("prometheus answered an unreadable value {pair}"))
    };
    let data = &answer["data"];
    match data["resultType"].as_str() {
        Some("scalar") => Ok(vec![number(&data["result"])?]),
        Some("vector") => data["result"]
            .as_array()
            .map(|series| series.iter().map(|one| number(&one["value"])).collect())
            .unwrap_or_else(|| Ok(Vec::new())),
        other => Err(format!(
            "the query gives a {} result: write one giving a scalar or an instant vector",
            other.unwrap_or("missing")
        )),
    }
}

/// Judges a `prometheus` analysis: every value of every measurement must hold the bound; a
/// measurement that gave no value (an empty vector) fails, as a canary with no data is not
/// known to be good.
pub(crate) fn judge_prometheus(spec: &PrometheusAnalysis, measurements: &[Vec<f64>]) -> Judgement {
    let bound = spec.bound();
    let passed = !measurements.is_empty()
        && measurements.iter().all(|values| {
            !values.is_empty()
                && values
                    .iter()
                    .all(|value| bound.is_some_and(|bound: Bound| bound.holds(*value)))
        });
    Judgement {
        passed,
        values: json!({ "measurements": measurements }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::spec::rollout::{Analysis, CanaryStep, UNTIL_PROMOTED};

    fn canary(pauses: [&str; 2]) -> Canary {
        Canary {
            steps: vec![
                CanaryStep {
                    weight: 10,
                    pause: pauses[0].into(),
                },
                CanaryStep {
                    weight: 50,
                    pause: pauses[1].into(),
                },
                CanaryStep {
                    weight: 100,
                    pause: String::new(),
                },
            ],
            analysis: Some(Analysis::default()),
        }
    }

    fn at(step: u32, phase: RolloutPhase) -> StepState {
        StepState {
            step,
            phase,
            paused_until: None,
            promote_requested: false,
            abort_requested: false,
        }
    }

    fn seen(ready: bool, analysis: AnalysisProgress, now: i64) -> Observed {
        Observed {
            canary_ready: ready,
            canary_failed: false,
            analysis,
            now,
        }
    }

    use AnalysisProgress::{Failed, NotStarted, Passed, Running};
    use RolloutPhase::{Aborted, Paused, Progressing, Promoted};

    #[test]
    fn a_timed_step_scales_pauses_analyses_then_advances() {
        let canary = canary(["30s", ""]);
        let state = at(0, Progressing);
        assert_eq!(
            decide(&canary, 10, state, seen(false, NotStarted, 100)),
            CanaryDecision::Scale {
                share: 10,
                canary_replicas: 1
            }
        );
        assert_eq!(
            decide(&canary, 10, state, seen(true, NotStarted, 100)),
            CanaryDecision::BeginPause { until: Some(130) }
        );
        let paused = StepState {
            paused_until: Some(130),
            ..at(0, Paused)
        };
        assert_eq!(
            decide(&canary, 10, paused, seen(true, NotStarted, 120)),
            CanaryDecision::Wait { until: Some(130) }
        );
        assert_eq!(
            decide(&canary, 10, paused, seen(true, NotStarted, 130)),
            CanaryDecision::Analyse
        );
        assert_eq!(
            decide(&canary, 10, paused, seen(true, Running, 131)),
            CanaryDecision::AwaitAnalysis
        );
        assert_eq!(
            decide(&canary, 10, paused, seen(true, Passed, 140)),
            CanaryDecision::Advance { step: 1 }
        );
        // Step 1 has no pause: scale, then straight to its analysis.
        let next = at(1, Progressing);
        assert_eq!(
            decide(&canary, 10, next, seen(false, NotStarted, 141)),
            CanaryDecision::Scale {
                share: 50,
                canary_replicas: 5
            }
        );
        assert_eq!(
            decide(&canary, 10, next, seen(true, NotStarted, 150)),
            CanaryDecision::Analyse
        );
        assert_eq!(
            decide(
                &canary,
                10,
                at(2, Progressing),
                seen(false, NotStarted, 160)
            ),
            CanaryDecision::Complete
        );
    }

    #[test]
    fn until_promoted_waits_for_promote_and_a_restart_resumes_the_same_share() {
        let canary = canary([UNTIL_PROMOTED, ""]);
        assert_eq!(
            decide(&canary, 10, at(0, Progressing), seen(true, NotStarted, 0)),
            CanaryDecision::BeginPause { until: None }
        );
        let paused = at(0, Paused);
        assert_eq!(
            decide(&canary, 10, paused, seen(true, NotStarted, 1_000_000)),
            CanaryDecision::Wait { until: None },
            "no deadline: only promote ends it"
        );
        // After a restart the replicas are found not ready yet: the same step's share, never more.
        assert_eq!(
            decide(&canary, 10, paused, seen(false, NotStarted, 5)),
            CanaryDecision::Scale {
                share: 10,
                canary_replicas: 1
            }
        );
        let promoted = StepState {
            promote_requested: true,
            ..paused
        };
        assert_eq!(
            decide(&canary, 10, promoted, seen(true, NotStarted, 6)),
            CanaryDecision::Analyse
        );
    }

    #[test]
    fn abort_health_and_a_failed_analysis_stop_the_rollout() {
        let canary = canary(["", ""]);
        let aborting = StepState {
            abort_requested: true,
            ..at(1, Paused)
        };
        assert!(matches!(
            decide(&canary, 10, aborting, seen(true, Passed, 0)),
            CanaryDecision::Abort { .. }
        ));
        let failing = Observed {
            canary_failed: true,
            ..seen(false, NotStarted, 0)
        };
        assert!(matches!(
            decide(&canary, 10, at(0, Progressing), failing),
            CanaryDecision::Abort { .. }
        ));
        assert_eq!(
            decide(&canary, 10, at(0, Progressing), seen(true, Failed, 0)),
            CanaryDecision::Abort {
                reason: "the analysis failed at 10 %".into()
            }
        );
        for phase in [Aborted, Promoted] {
            assert_eq!(
                decide(&canary, 10, at(0, phase), seen(true, Failed, 0)),
                CanaryDecision::Done
            );
        }
    }

    fn sample(status: Option<u16>, millis: u64) -> Sample {
        Sample {
            status,
            latency: Duration::from_millis(millis),
        }
    }

    #[test]
    fn http_analysis_counts_5xx_and_no_answer_and_takes_the_p95() {
        let spec = HttpAnalysis {
            path: "/".into(),
            samples: 20,
            max_error_percent: 10,
            max_p95: "100ms".into(),
        };
        let mut samples: Vec<Sample> = (0..18).map(|_| sample(Some(200), 10)).collect();
        samples.push(sample(Some(500), 10));
        samples.push(sample(Some(404), 150));
        let judged = judge_http(&spec, &samples);
        assert!(judged.passed, "{judged:?}: 5 % errors, p95 10 ms");
        assert_eq!(judged.values["errors"], 1);
        assert_eq!(judged.values["p95_ms"], 10);
        samples.push(sample(None, 150));
        samples.push(sample(Some(503), 150));
        let judged = judge_http(&spec, &samples);
        assert!(!judged.passed, "{judged:?}: 3 of 22 fail, p95 150 ms");
        let all_bad: Vec<Sample> = (0..10).map(|_| sample(Some(500), 1)).collect();
        assert!(!judge_http(&spec, &all_bad).passed);
        assert!(
            !judge_http(&spec, &[]).passed,
            "no sample, no verdict of good"
        );
    }

    #[test]
    fn prometheus_answers_are_read_and_judged() {
        let vector = json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {}, "value": [1.0, "0.25"]},
            {"metric": {}, "value": [1.0, "0.75"]}
        ]}});
        assert_eq!(prometheus_values(&vector), Ok(vec![0.25, 0.75]));
        let scalar =
            json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "3"]}});
        assert_eq!(prometheus_values(&scalar), Ok(vec![3.0]));
        let failed = json!({"status": "error", "error": "parse error"});
        assert!(prometheus_values(&failed).is_err_and(|why| why.contains("parse error")));
        let matrix = json!({"status": "success", "data": {"resultType": "matrix", "result": []}});
        assert!(prometheus_values(&matrix).is_err());

        let spec = PrometheusAnalysis {
            max: "0.5".into(),
            ..PrometheusAnalysis::default()
        };
        assert!(judge_prometheus(&spec, &[vec![0.1], vec![0.5]]).passed);
        assert!(!judge_prometheus(&spec, &[vec![0.1], vec![0.25, 0.75]]).passed);
        assert!(
            !judge_prometheus(&spec, &[vec![]]).passed,
            "no data is no pass"
        );
        assert!(!judge_prometheus(&spec, &[]).passed);
    }
}
