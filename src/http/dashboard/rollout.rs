//! A deployment page's "Rollout" section: its progressive rollout (`canary {}` /
//! `blue_green {}`) as the reconciler recorded it (`http::status::RolloutView`): strategy,
//! step n/m with the shares of every step, the new release's share, the phase, the pause, the
//! last analysis's values and verdict, and the requests left; then its history, the
//! `rollout.*` rows of the activity log (pause, promote, abort, by whom) with the step, share
//! and verdict each recorded.
//!
//! Invariant: every stored text (release, verdict, analysis values, actor, message) reaches
//! the page through [`Esc`]; the history is bounded to [`HISTORY_ROWS`] rows.

use std::fmt::Write as _;

use super::html::{Esc, badge, time};
use crate::http::status::RolloutView;
use crate::store::{Activity, Store};

/// Most rows of the history (of the newest activity rows of the resource read).
const HISTORY_ROWS: usize = 20;
/// Activity rows of the resource read to find them.
const ACTIVITY_READ: usize = 200;

/// The section (empty when the deployment never rolled out progressively); a store error is
/// shown in place of the history.
pub(super) fn section(store: &Store, resource: &str, rollout: Option<&RolloutView>) -> String {
    let Some(rollout) = rollout else {
        return String::new();
    };
    let mut out = String::from("<section id=\"rollout\"><h2>Rollout</h2>\n");
    out.push_str(&summary(rollout));
    out.push_str("<h3>History</h3>\n");
    match store.activity_of(resource, ACTIVITY_READ) {
        Ok(entries) => out.push_str(&history(&entries)),
        Err(error) => {
            let _ = writeln!(
                out,
                "<p class=\"muted\">The activity log could not be read: {}</p>",
                Esc(&error.to_string())
            );
        }
    }
    out.push_str("</section>\n");
    out
}

/// The state table: strategy, step, share, phase, pause, analysis, requests.
fn summary(rollout: &RolloutView) -> String {
    let mut out = String::from("<table class=\"rollout\"><tbody>\n");
    let mut row = |name: &str, id: &str, html: String| {
        let _ = writeln!(
            out,
            "<tr><th>{}</th><td id=\"rollout-{}\">{html}</td></tr>",
            Esc(name),
            Esc(id)
        );
    };
    row(
        "Strategy",
        "strategy",
        format!(
            "{} of release <code>{}</code>",
            Esc(&rollout.strategy),
            Esc(&rollout.release)
        ),
    );
    if let Some(step) = rollout.step_text() {
        let mut html = Esc(&step).to_string();
        if !rollout.steps.is_empty() {
            let shares: Vec<String> = rollout
                .steps
                .iter()
                .enumerate()
                .map(|(index, share)| {
                    if u32::try_from(index).is_ok_and(|index| index == rollout.step) {
                        format!("<strong>{share} %</strong>")
                    } else {
                        format!("{share} %")
                    }
                })
                .collect();
            let _ = write!(html, " ({})", shares.join(" → "));
        }
        row("Step", "step", html);
    }
    row(
        "Share",
        "share",
        format!(
            "{} % of the traffic to the new release ({} canary replica(s))",
            rollout.share, rollout.canary_replicas
        ),
    );
    row("Phase", "phase", badge(rollout.phase));
    if let Some(until) = rollout.paused_until {
        let what = if rollout.phase == "promoted" {
            "old release kept until"
        } else {
            "paused until"
        };
        row("Pause", "pause", format!("{what} {}", time(until)));
    }
    let verdict = if rollout.verdict.is_empty() {
        "not analysed yet".to_owned()
    } else {
        let values = rollout.analysis_text();
        if values.is_empty() {
            format!("{}", Esc(&rollout.verdict))
        } else {
            format!("{}: <code>{}</code>", Esc(&rollout.verdict), Esc(&values))
        }
    };
    row("Last analysis", "analysis", verdict);
    let requests: Vec<&str> = [
        (rollout.promote_requested, "promote requested"),
        (rollout.abort_requested, "abort requested"),
    ]
    .into_iter()
    .filter_map(|(asked, text)| asked.then_some(text))
    .collect();
    if !requests.is_empty() {
        row("Requests", "requests", requests.join(", "));
    }
    row("Since", "since", time(rollout.started));
    out.push_str("</tbody></table>\n");
    out
}

/// One `rollout.*` row's data in words: `step 2, 50 %, analysis passed`.
pub(super) fn data_text(data: &serde_json::Value) -> String {
    let mut parts = Vec::new();
    let blue_green = data["strategy"].as_str() == Some("blue_green");
    if let Some(step) = data["step"].as_u64()
        && !blue_green
    {
        parts.push(format!("step {}", step.saturating_add(1)));
    }
    if let Some(share) = data["share"].as_u64() {
        parts.push(format!("{share} %"));
    }
    if let Some(verdict) = data["verdict"]
        .as_str()
        .filter(|verdict| !verdict.is_empty())
    {
        parts.push(format!("analysis {verdict}"));
    }
    parts.join(", ")
}

/// The `rollout.*` rows, newest first.
fn history(entries: &[Activity]) -> String {
    let rows: Vec<&Activity> = entries
        .iter()
        .filter(|entry| entry.action.starts_with("rollout."))
        .take(HISTORY_ROWS)
        .collect();
    if rows.is_empty() {
        return "<p class=\"muted\">No pause, promote or abort recorded yet.</p>\n".to_owned();
    }
    let mut out = String::from(
        "<table class=\"rollout-history\"><thead><tr><th>when</th><th>what</th>\
         <th>step, share, verdict</th><th>by</th><th>message</th></tr></thead><tbody>\n",
    );
    for entry in rows {
        let by = match &entry.actor {
            Some(actor) => format!("{} ({actor})", entry.origin),
            None => entry.origin.clone(),
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            time(entry.at),
            Esc(&entry.action),
            Esc(&data_text(&entry.data)),
            Esc(&by),
            Esc(&entry.message),
        );
    }
    out.push_str("</tbody></table>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Origin, RolloutEvent, RolloutPhase, RolloutRequest, RolloutState, Who};

    #[test]
    fn the_section_shows_the_rollout_and_its_history_escaped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("state.db");
        let store = Store::open(&path).expect("store");
        let web = "deployment/shop/web";
        assert!(
            section(&store, web, None).is_empty(),
            "no rollout, no section"
        );

        let mut state = RolloutState::start("shop", "web", "<b>abc</b>", "canary");
        state.step = 1;
        state.share = 50;
        state.canary_replicas = 2;
        state.phase = RolloutPhase::Paused;
        state.verdict = "passed".into();
        state.analysis =
            serde_json::json!({ "http": { "error_percent": 0.0, "note": "<script>" } });
        store
            .save_rollout(&state, Some(RolloutEvent::Paused("paused at 50 %")))
            .expect("save");
        let command = Store::open(&path)
            .expect("store")
            .acting_as(Who::new(Origin::Http, Some("<i>ops</i>")));
        command
            .request_rollout("shop", "web", RolloutRequest::Promote)
            .expect("request");
        let view = crate::http::status::rollout_view(&store, "shop", "web")
            .expect("read")
            .expect("recorded");
        let html = section(&store, web, Some(&view));
        assert!(
            !html.contains("<script>") && !html.contains("<b>abc"),
            "{html}"
        );
        assert!(html.contains("id=\"rollout-step\">step 2</td>"), "{html}");
        assert!(html.contains("50 % of the traffic"), "{html}");
        assert!(
            html.contains("<span class=\"badge warn\">paused</span>"),
            "{html}"
        );
        assert!(
            html.contains("passed: <code>http.error_percent=0.0, http.note=&lt;script&gt;</code>"),
            "{html}"
        );
        assert!(html.contains("promote requested"), "{html}");
        let history = html.split("<h3>History</h3>").nth(1).expect("history");
        let promote = history.find("rollout.promote").expect("the request");
        let pause = history.find("rollout.pause").expect("the pause");
        assert!(promote < pause, "newest first: {history}");
        assert!(
            history.contains("http (&lt;i&gt;ops&lt;/i&gt;)"),
            "{history}"
        );
        assert!(
            history.contains("<td>step 2, 50 %, analysis passed</td>"),
            "{history}"
        );
    }
}
