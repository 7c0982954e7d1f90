//! A deployment's `canary {}` or `blue_green {}` block (an extension: voodu has none): the
//! steps of traffic share, their pauses and the analysis; or the preview host, auto-promote
//! and how long the old release is kept.
//!
//! Invariant: every field and bound is checked here, at the line that breaks it; that the
//! deployment has an ingress to shift traffic on is the validator's (it sees every resource).

use std::ops::Range;

use hcl::edit::Span;

use super::super::reader::{DecodeCx, Reader};
use super::super::values;
use crate::manifest::spec::Strategy;
use crate::manifest::spec::bounds::{MAX_TIMEOUT, show_duration};
use crate::manifest::spec::rollout::{
    Analysis, BlueGreen, Canary, CanaryStep, HttpAnalysis, MAX_ANALYSIS_DURATION,
    MAX_ANALYSIS_TEXT, MAX_CANARY_STEPS, MAX_HTTP_SAMPLES, MAX_PROMETHEUS_COUNT, MAX_QUERY,
    PrometheusAnalysis, UNTIL_PROMOTED,
};
use crate::model::parse_go_duration;

/// The deployment body's `canary` or `blue_green` block, if it has one (both is an error).
pub(super) fn strategy(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Option<Strategy> {
    let canary = r.block(cx, "canary");
    let blue_green = r.block(cx, "blue_green");
    if let (Some(_), Some(second)) = (canary, blue_green) {
        cx.error(
            second.ident.span(),
            "a deployment rolls out with `canary` or with `blue_green`, not both: remove one",
        );
        return None;
    }
    if let Some(block) = canary {
        let mut c = r.nested(block, "");
        let canary = decode_canary(cx, &mut c);
        c.finish(cx);
        return Some(Strategy::Canary(canary));
    }
    let block = blue_green?;
    let mut b = r.nested(block, "");
    let preview_host = b.required_string(cx, "preview_host").unwrap_or_default();
    text(cx, &b, "preview_host", &preview_host, MAX_ANALYSIS_TEXT);
    if preview_host.contains(['/', ' ', ':']) {
        cx.error(
            b.span_of("preview_host"),
            format!("`blue_green.preview_host` {preview_host:?} must be a host name only, like \"next.example.com\""),
        );
    }
    let auto_promote = b.bool(cx, "auto_promote").unwrap_or_default();
    let keep_old = b.duration(cx, "keep_old", MAX_TIMEOUT).unwrap_or_default();
    b.finish(cx);
    Some(Strategy::BlueGreen(BlueGreen {
        preview_host,
        auto_promote,
        keep_old,
    }))
}

fn decode_canary(cx: &mut DecodeCx<'_>, c: &mut Reader<'_>) -> Canary {
    let blocks = c.blocks("step");
    if blocks.is_empty() {
        cx.error(
            c.anchor.clone(),
            "canary needs `step` blocks: write e.g. step { weight = 10 } … step { weight = 100 }",
        );
    }
    if blocks.len() > MAX_CANARY_STEPS {
        cx.error(
            blocks[MAX_CANARY_STEPS].ident.span(),
            format!("canary has {} steps, above the limit of {MAX_CANARY_STEPS}: use fewer, larger steps", blocks.len()),
        );
    }
    let mut steps: Vec<CanaryStep> = Vec::new();
    for block in blocks.iter().take(MAX_CANARY_STEPS) {
        let mut s = c.nested(block, "");
        let written = s.int(cx, "weight");
        let weight = match written {
            Some(weight @ 1..=100) => weight as u32,
            Some(other) => {
                cx.error(
                    s.span_of("weight"),
                    format!("`canary.step.weight` is a percentage of the traffic from 1 to 100, got {other}"),
                );
                0
            }
            None => {
                if s.span_of("weight").is_none() {
                    cx.error(
                        s.anchor.clone(),
                        "canary.step needs `weight`: the canary's share in percent, like weight = 10",
                    );
                }
                0
            }
        };
        if weight > 0
            && let Some(previous) = steps.last().map(|step| step.weight)
            && previous > 0
            && weight <= previous
        {
            cx.error(
                s.span_of("weight"),
                format!("`canary.step.weight` {weight} must be above the step before's {previous}: shares only grow"),
            );
        }
        let pause = s.string(cx, "pause").unwrap_or_default();
        if !pause.is_empty() && pause != UNTIL_PROMOTED {
            match parse_go_duration(&pause) {
                None => cx.error(
                    s.span_of("pause"),
                    format!("`canary.step.pause` {pause:?} is neither a duration like \"30s\" nor \"until_promoted\""),
                ),
                Some(duration) if duration > MAX_TIMEOUT => cx.error(
                    s.span_of("pause"),
                    format!("`canary.step.pause` {pause:?} is above the limit of {}: write a shorter pause, or \"until_promoted\"", show_duration(MAX_TIMEOUT)),
                ),
                Some(_) => {}
            }
        }
        let last_span = s.span_of("weight").or(s.anchor.clone());
        s.finish(cx);
        steps.push(CanaryStep { weight, pause });
        if steps.len() == blocks.len().min(MAX_CANARY_STEPS) && weight != 100 && weight > 0 {
            cx.error(
                last_span,
                format!("the last canary step must be weight = 100 (the whole release), got {weight}: add step {{ weight = 100 }}"),
            );
        }
    }
    let analysis = c.block(cx, "analysis").map(|block| {
        let mut a = c.nested(block, "");
        let analysis = decode_analysis(cx, &mut a);
        a.finish(cx);
        analysis
    });
    Canary { steps, analysis }
}

fn decode_analysis(cx: &mut DecodeCx<'_>, a: &mut Reader<'_>) -> Analysis {
    let interval = a
        .duration(cx, "interval", MAX_ANALYSIS_DURATION)
        .unwrap_or_default();
    at_least_a_second(cx, a, "interval", &interval);
    let http = a.block(cx, "http").map(|block| {
        let mut h = a.nested(block, "");
        let path = h.required_string(cx, "path").unwrap_or_default();
        text(cx, &h, "path", &path, MAX_ANALYSIS_TEXT);
        if !path.is_empty() && !path.starts_with('/') {
            cx.error(
                h.span_of("path"),
                format!(
                    "`canary.analysis.http.path` {path:?} must start with `/`, like \"/health\""
                ),
            );
        }
        let samples = bounded(cx, &mut h, "samples", 1, MAX_HTTP_SAMPLES, 20);
        let max_error_percent = bounded(cx, &mut h, "max_error_percent", 0, 100, 0);
        let max_p95 = h
            .duration(cx, "max_p95", MAX_ANALYSIS_DURATION)
            .unwrap_or_default();
        h.finish(cx);
        HttpAnalysis {
            path,
            samples,
            max_error_percent,
            max_p95,
        }
    });
    let prometheus = a.block(cx, "prometheus").map(|block| {
        let mut p = a.nested(block, "");
        let url = p.required_string(cx, "url").unwrap_or_default();
        text(cx, &p, "url", &url, MAX_ANALYSIS_TEXT);
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            cx.error(
                p.span_of("url"),
                format!("`canary.analysis.prometheus.url` {url:?} must be an http:// or https:// URL, like \"http://prometheus:9090\""),
            );
        }
        let query = p.required_string(cx, "query").unwrap_or_default();
        text(cx, &p, "query", &query, MAX_QUERY);
        let max = number(cx, &mut p, "max");
        let min = number(cx, &mut p, "min");
        if max.is_empty() == min.is_empty() && p.span_of("max").is_none() == p.span_of("min").is_none() {
            cx.error(
                p.span_of("min").or(p.anchor.clone()),
                "canary.analysis.prometheus needs exactly one of `max` and `min`: the bound every result must hold",
            );
        }
        let interval = p
            .duration(cx, "interval", MAX_ANALYSIS_DURATION)
            .unwrap_or_default();
        at_least_a_second(cx, &p, "interval", &interval);
        let count = bounded(cx, &mut p, "count", 1, MAX_PROMETHEUS_COUNT, 1);
        p.finish(cx);
        PrometheusAnalysis {
            url,
            query,
            max,
            min,
            interval,
            count,
        }
    });
    if http.is_none() && prometheus.is_none() {
        cx.error(
            a.anchor.clone(),
            "canary.analysis needs an `http {}` or a `prometheus {}` block: what the canary is judged by",
        );
    }
    Analysis {
        interval,
        http,
        prometheus,
    }
}

/// An integer attribute within `low..=high`, `default` when left out.
fn bounded(
    cx: &mut DecodeCx<'_>,
    r: &mut Reader<'_>,
    name: &'static str,
    low: i64,
    high: i64,
    default: u32,
) -> u32 {
    match r.int(cx, name) {
        None => default,
        Some(value) if (low..=high).contains(&value) => value as u32,
        Some(value) => {
            cx.error(
                r.span_of(name),
                format!("`{}` is {value}, outside {low}..={high}", r.field(name)),
            );
            default
        }
    }
}

/// A number attribute (`max = 0.05`), kept as text; anything but a finite number is refused.
fn number(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, name: &'static str) -> String {
    let Some(value) = r.json(cx, name) else {
        return String::new();
    };
    match value.as_f64() {
        Some(number) if number.is_finite() => value.to_string(),
        _ => {
            cx.error(
                r.span_of(name),
                format!("`{}` must be a number, like 0.05", r.field(name)),
            );
            String::new()
        }
    }
}

fn at_least_a_second(cx: &mut DecodeCx<'_>, r: &Reader<'_>, name: &str, written: &str) {
    if parse_go_duration(written).is_some_and(|duration| duration.as_secs() < 1) {
        cx.error(
            r.span_of(name),
            format!(
                "`{}` {written:?} is below 1s: write a longer duration",
                r.field(name)
            ),
        );
    }
}

/// One line of at most `max` characters.
fn text(cx: &mut DecodeCx<'_>, r: &Reader<'_>, name: &str, value: &str, max: usize) {
    let span: Option<Range<usize>> = r.span_of(name);
    if let Err(problem) = values::one_line(value) {
        cx.error(span.clone(), format!("`{}` {problem}", r.field(name)));
    }
    if value.chars().count() > max {
        cx.error(
            span,
            format!(
                "`{}` is longer than {max} characters: shorten it",
                r.field(name)
            ),
        );
    }
}
