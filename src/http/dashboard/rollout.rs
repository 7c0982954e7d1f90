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

use serde::Serialize;

use super::html::{Esc, badge, phase_class, time};
use crate::http::status::RolloutView;
use crate::store::{Activity, Store};

/// Most rows of the history (of the newest activity rows of the resource read).
const HISTORY_ROWS: usize = 20;
/// Activity rows of the resource read to find them.
const ACTIVITY_READ: usize = 200;

/// The section's content, also its part of the page's live document (`app.js` puts each text
/// in with `textContent`).
#[derive(Debug, Serialize)]
pub(super) struct RolloutLive {
    strategy: String,
    release: String,
    /// `step 2/3`; `None` for blue/green.
    step: Option<String>,
    /// The index of the current step among `steps`.
    current: u32,
    /// Every step's share, in percent.
    steps: Vec<u32>,
    share: String,
    phase: String,
    phase_class: &'static str,
    pause: String,
    analysis: String,
    requests: String,
    since: String,
    /// Newest first: when, what, step/share/verdict, by, message.
    history: Vec<[String; 5]>,
    /// Why the history could not be read.
    history_error: Option<String>,
}

/// Deployment `scope/name`'s rollout for its page; `None` when it never rolled out
/// progressively.
pub(super) fn live(
    store: &Store,
    scope: &str,
    name: &str,
) -> crate::store::Result<Option<RolloutLive>> {
    let Some(rollout) = crate::http::status::rollout_view(store, scope, name)? else {
        return Ok(None);
    };
    let (history, history_error) =
        match store.activity_of(&format!("deployment/{scope}/{name}"), ACTIVITY_READ) {
            Ok(entries) => (history(&entries), None),
            Err(error) => (Vec::new(), Some(error.to_string())),
        };
    Ok(Some(of(&rollout, history, history_error)))
}

fn of(
    rollout: &RolloutView,
    history: Vec<[String; 5]>,
    history_error: Option<String>,
) -> RolloutLive {
    let pause = match (rollout.paused_until, rollout.phase) {
        (Some(until), "promoted") => format!("old release kept until {}", time(until)),
        (Some(until), "paused" | "progressing") => format!("paused until {}", time(until)),
        (None, "paused") => "until `voodu-agent promote`".to_owned(),
        _ => "none".to_owned(),
    };
    let analysis = if rollout.verdict.is_empty() {
        "not analysed yet".to_owned()
    } else {
        let values = rollout.analysis_text();
        if values.is_empty() {
            rollout.verdict.clone()
        } else {
            format!("{}: {values}", rollout.verdict)
        }
    };
    let requests: Vec<&str> = [
        (rollout.promote_requested, "promote requested"),
        (rollout.abort_requested, "abort requested"),
    ]
    .into_iter()
    .filter_map(|(asked, text)| asked.then_some(text))
    .collect();
    RolloutLive {
        strategy: rollout.strategy.clone(),
        release: rollout.release_text(),
        step: rollout.step_text(),
        current: rollout.step,
        steps: rollout.steps.clone(),
        share: format!(
            "{} % of the traffic to the new release ({} canary replica(s))",
            rollout.share, rollout.canary_replicas
        ),
        phase: rollout.phase.to_owned(),
        phase_class: phase_class(rollout.phase),
        pause,
        analysis,
        requests: if requests.is_empty() {
            "none".to_owned()
        } else {
            requests.join(", ")
        },
        since: time(rollout.started),
        history,
        history_error,
    }
}

/// The section (nothing when `rollout` is `None`).
pub(super) fn section(rollout: Option<&RolloutLive>) -> String {
    let Some(rollout) = rollout else {
        return String::new();
    };
    let mut out = String::from("<section id=\"rollout\"><h2>Rollout</h2>\n");
    out.push_str("<table class=\"rollout\"><tbody>\n");
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
            "{} of release {}",
            Esc(&rollout.strategy),
            Esc(&rollout.release)
        ),
    );
    if let Some(step) = &rollout.step {
        let mut html = format!("<span id=\"rollout-step-text\">{}</span>", Esc(step));
        if !rollout.steps.is_empty() {
            let shares: Vec<String> = rollout
                .steps
                .iter()
                .enumerate()
                .map(|(index, share)| {
                    let current = u32::try_from(index).is_ok_and(|index| index == rollout.current);
                    format!(
                        "<span class=\"share{}\" data-step=\"{index}\">{share} %</span>",
                        if current { " current" } else { "" }
                    )
                })
                .collect();
            let _ = write!(html, " ({})", shares.join(" → "));
        }
        row("Step", "step", html);
    }
    row("Share", "share", Esc(&rollout.share).to_string());
    row("Phase", "phase", badge(&rollout.phase));
    row("Pause", "pause", Esc(&rollout.pause).to_string());
    row(
        "Last analysis",
        "analysis",
        Esc(&rollout.analysis).to_string(),
    );
    row("Requests", "requests", Esc(&rollout.requests).to_string());
    row("Since", "since", Esc(&rollout.since).to_string());
    out.push_str("</tbody></table>\n<h3>History</h3>\n");
    if let Some(error) = &rollout.history_error {
        let _ = writeln!(
            out,
            "<p class=\"muted\">The activity log could not be read: {}</p>",
            Esc(error)
        );
    }
    let _ = writeln!(
        out,
        "<p class=\"muted\" id=\"rollout-no-history\"{}>No pause, promote or abort recorded yet.</p>",
        if rollout.history.is_empty() {
            ""
        } else {
            " hidden"
        }
    );
    out.push_str(
        "<table class=\"rollout-history\"><thead><tr><th>when</th><th>what</th>\
         <th>step, share, verdict</th><th>by</th><th>message</th></tr></thead>\
         <tbody id=\"rollout-history\">\n",
    );
    for cells in &rollout.history {
        out.push_str("<tr>");
        for cell in cells {
            let _ = write!(out, "<td>{}</td>", Esc(cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n</section>\n");
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

/// The `rollout.*` rows, newest first, as the history's cells.
fn history(entries: &[Activity]) -> Vec<[String; 5]> {
    entries
        .iter()
        .filter(|entry| entry.action.starts_with("rollout."))
        .take(HISTORY_ROWS)
        .map(|entry| {
            let by = match &entry.actor {
                Some(actor) => format!("{} ({actor})", entry.origin),
                None => entry.origin.clone(),
            };
            [
                time(entry.at),
                entry.action.clone(),
                data_text(&entry.data),
                by,
                entry.message.clone(),
            ]
        })
        .collect()
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
        assert!(section(None).is_empty(), "no rollout, no section");
        assert!(live(&store, "shop", "web").expect("read").is_none());

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
        let live = live(&store, "shop", "web")
            .expect("read")
            .expect("recorded");
        let html = section(Some(&live));
        assert!(
            !html.contains("<script>") && !html.contains("<b>abc"),
            "{html}"
        );
        assert!(
            html.contains("<span id=\"rollout-step-text\">step 2</span>"),
            "{html}"
        );
        assert!(html.contains("50 % of the traffic"), "{html}");
        assert!(
            html.contains("<span class=\"badge warn\">paused</span>"),
            "{html}"
        );
        assert!(
            html.contains("passed: http.error_percent=0.0, http.note=&lt;script&gt;"),
            "{html}"
        );
        assert!(html.contains("promote requested"), "{html}");
        let document = serde_json::to_value(&live).expect("json");
        assert_eq!(document["phase"], "paused");
        assert_eq!(document["history"][0][1], "rollout.promote");
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
