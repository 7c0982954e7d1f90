//! The resource page's plots, as inline SVG made here: the last releases on a timeline
//! (how long each took, how it ended) and the ready replicas of the current rollout.
//!
//! Invariants: only numbers and escaped text reach the SVG; the style comes from classes
//! (the page's CSP allows no inline style); the ready plot's polylines are computed by one
//! function, [`ready_plot`], for the first render and for every live update.

use std::fmt::Write as _;

use serde::Serialize;

use super::html::{Esc, duration, phase_class, short};

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 170.0;
const LEFT: f64 = 40.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 26.0;

/// One release on the timeline.
#[derive(Debug, Clone)]
pub(super) struct ReleaseBar {
    pub(super) id: i64,
    pub(super) commit: String,
    pub(super) phase: String,
    pub(super) started_at: i64,
    pub(super) finished_at: Option<i64>,
}

/// The last releases, oldest on the left: one bar each, its height the time the rollout
/// took (still running: until `now`), its colour how it ended.
pub(super) fn releases_timeline(bars_newest_first: &[ReleaseBar], now: i64) -> String {
    let bars: Vec<&ReleaseBar> = bars_newest_first.iter().rev().collect();
    if bars.is_empty() {
        return "<p class=\"muted\">No release yet.</p>".to_owned();
    }
    let took = |bar: &ReleaseBar| (bar.finished_at.unwrap_or(now) - bar.started_at).max(0);
    let longest = bars.iter().map(|bar| took(bar)).max().unwrap_or(0).max(1);
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let slot = plot_width / bars.len() as f64;
    let bar_width = (slot * 0.62).min(48.0);
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg class=\"plot\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"Duration and outcome of the last releases\">"
    );
    axes(&mut svg, "", &duration(longest), "0s");
    for (index, bar) in bars.iter().enumerate() {
        let seconds = took(bar);
        let height = (seconds as f64 / longest as f64 * plot_height).max(2.0);
        let x = LEFT + slot * index as f64 + (slot - bar_width) / 2.0;
        let y = TOP + plot_height - height;
        let _ = write!(
            svg,
            "<rect class=\"bar {}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bar_width:.1}\" height=\"{height:.1}\" rx=\"2\"><title>#{} {} {} in {}</title></rect>",
            phase_class(&bar.phase),
            bar.id,
            Esc(short(&bar.commit)),
            Esc(&bar.phase),
            duration(seconds)
        );
        let _ = write!(
            svg,
            "<text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">#{}</text>",
            x + bar_width / 2.0,
            HEIGHT - 8.0,
            bar.id
        );
        let _ = write!(
            svg,
            "<text class=\"value\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            x + bar_width / 2.0,
            (y - 4.0).max(TOP - 2.0),
            duration(seconds)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// One reading of a rollout: when, replicas ready, replicas wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) at_ms: i64,
    pub(crate) ready: usize,
    pub(crate) desired: usize,
}

/// The ready plot's variable parts: what the first render draws and each live update sets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct ReadyPlot {
    /// `x,y` pairs of the ready replicas' step line.
    pub(super) ready_points: String,
    /// `x,y` pairs of the wanted replicas' step line.
    pub(super) desired_points: String,
    /// The y axis' top label.
    pub(super) y_max: String,
    /// The x axis' right label: how long the plotted span is.
    pub(super) span: String,
    /// The last reading, e.g. `2/3 ready`.
    pub(super) caption: String,
}

/// Step lines of `samples` from `start_ms` to `end_ms` (`end_ms` extends the last reading:
/// it still holds).
pub(super) fn ready_plot(samples: &[Sample], start_ms: i64, end_ms: i64) -> ReadyPlot {
    let start_ms = samples
        .first()
        .map_or(start_ms, |first| first.at_ms.min(start_ms));
    let end_ms = samples
        .last()
        .map_or(end_ms, |last| last.at_ms.max(end_ms))
        .max(start_ms + 1000);
    let y_max = samples
        .iter()
        .map(|sample| sample.ready.max(sample.desired))
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let x = |at_ms: i64| LEFT + (at_ms - start_ms) as f64 / (end_ms - start_ms) as f64 * plot_width;
    let y = |value: usize| TOP + plot_height - value as f64 / y_max as f64 * plot_height;
    let steps = |value: fn(&Sample) -> usize| -> String {
        let mut points = String::new();
        let mut previous: Option<usize> = None;
        for sample in samples {
            let at = x(sample.at_ms);
            if let Some(previous) = previous {
                let _ = write!(points, "{at:.1},{:.1} ", y(previous));
            }
            let _ = write!(points, "{at:.1},{:.1} ", y(value(sample)));
            previous = Some(value(sample));
        }
        if let Some(previous) = previous {
            let _ = write!(points, "{:.1},{:.1}", x(end_ms), y(previous));
        }
        points.trim_end().to_owned()
    };
    ReadyPlot {
        ready_points: steps(|sample| sample.ready),
        desired_points: steps(|sample| sample.desired),
        y_max: y_max.to_string(),
        span: duration((end_ms - start_ms) / 1000),
        caption: samples.last().map_or_else(
            || "no reading yet".to_owned(),
            |last| format!("{}/{} ready", last.ready, last.desired),
        ),
    }
}

/// The ready plot's SVG; its elements carry ids the page's script updates.
pub(super) fn ready_svg(plot: &ReadyPlot) -> String {
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg class=\"plot\" id=\"ready-plot\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"Ready replicas during the rollout\">"
    );
    axes_with_ids(&mut svg, &plot.y_max, &plot.span);
    let _ = write!(
        svg,
        "<polyline class=\"desired\" id=\"desired-line\" points=\"{}\"/><polyline class=\"ready\" id=\"ready-line\" points=\"{}\"/></svg>",
        Esc(&plot.desired_points),
        Esc(&plot.ready_points)
    );
    svg
}

/// The axes with a top label on the y axis (`y_attributes` added to its element: `""` or
/// ` id="…"`) and `x_label` at the left end of the x axis.
fn axes(svg: &mut String, y_attributes: &str, y_label: &str, x_label: &str) {
    let bottom = HEIGHT - BOTTOM;
    let _ = write!(
        svg,
        "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{bottom}\"/><line class=\"axis\" x1=\"{LEFT}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\"/><text class=\"tick\"{y_attributes} x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text><text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
        WIDTH - RIGHT,
        LEFT - 4.0,
        TOP + 4.0,
        Esc(y_label),
        LEFT - 4.0,
        bottom,
        Esc(x_label)
    );
}

/// The axes with the ids the live page updates: the top label `ready-ymax`, and `span` at the
/// right end of the x axis as `ready-span`.
fn axes_with_ids(svg: &mut String, y_label: &str, span: &str) {
    axes(svg, " id=\"ready-ymax\"", y_label, "0");
    let _ = write!(
        svg,
        "<text class=\"tick\" x=\"{LEFT}\" y=\"{}\">0s</text><text class=\"tick\" id=\"ready-span\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
        HEIGHT - 8.0,
        WIDTH - RIGHT,
        HEIGHT - 8.0,
        Esc(span)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_replicas_are_step_lines_that_end_now() {
        let samples = [
            Sample {
                at_ms: 0,
                ready: 0,
                desired: 2,
            },
            Sample {
                at_ms: 5000,
                ready: 1,
                desired: 2,
            },
        ];
        let plot = ready_plot(&samples, 0, 10_000);
        // x: 40 + t/10s × 588; y: 14 + 130 − v/2 × 130.
        assert_eq!(
            plot.ready_points,
            "40.0,144.0 334.0,144.0 334.0,79.0 628.0,79.0"
        );
        assert_eq!(
            plot.desired_points,
            "40.0,14.0 334.0,14.0 334.0,14.0 628.0,14.0"
        );
        assert_eq!((plot.y_max.as_str(), plot.span.as_str()), ("2", "10s"));
        assert_eq!(plot.caption, "1/2 ready");
        let empty = ready_plot(&[], 0, 0);
        assert_eq!(
            (empty.ready_points.as_str(), empty.caption.as_str()),
            ("", "no reading yet")
        );
    }

    #[test]
    fn release_bars_scale_to_the_longest_and_escape_their_text() {
        let bars = [
            ReleaseBar {
                id: 2,
                commit: "<b>".to_owned(),
                phase: "failed".to_owned(),
                started_at: 100,
                finished_at: Some(130),
            },
            ReleaseBar {
                id: 1,
                commit: "abc".to_owned(),
                phase: "succeeded".to_owned(),
                started_at: 0,
                finished_at: Some(60),
            },
        ];
        let svg = releases_timeline(&bars, 200);
        assert!(
            svg.contains("class=\"bar good\"") && svg.contains("class=\"bar bad\""),
            "{svg}"
        );
        assert!(svg.contains("#2 &lt;b&gt; failed in 30s"), "{svg}");
        assert!(!svg.contains("<b>"), "{svg}");
        // Oldest first: #1 is left of #2.
        assert!(svg.find(">#1<") < svg.find(">#2<"), "{svg}");
        assert_eq!(
            releases_timeline(&[], 0),
            "<p class=\"muted\">No release yet.</p>"
        );
    }
}
