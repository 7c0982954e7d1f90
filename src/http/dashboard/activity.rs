//! The overview's "Activity of the last day" section: the newest entries of the activity log
//! (`Store::activity`, the rows `activity` and `GET /activity` show), newest first; and a
//! resource page's timeline: the activity log's rows about the resource (commits, releases and
//! rollouts, a progressive rollout's pauses, promotes and aborts with their step, share and
//! verdict, rollbacks, pins, config, images found) with the events the outbox alone records
//! for it ([`TIMELINE_EVENTS`]: drift repairs, moved tags, superseded rollouts, probes failing
//! and recovering), and the notifications sent about it (an outbox event of the resource some
//! sinks delivered: "EVENT sent to SINK, …", `Store::sent_of`), newest first.
//!
//! Invariant: every stored text (action, actor, resource, message: a pusher's name and a
//! commit's text are attacker-controlled) reaches the page through [`Esc`]; the section is
//! bounded to [`MAX_ROWS`] rows and says when more of the day were left out.

use std::fmt::Write as _;

use super::html::{Esc, phase_class, short, time};
use crate::store::Store;

/// The window the section covers.
const WINDOW_SECS: i64 = 24 * 3600;
/// Most rows shown; the full day is `voodu-agent activity` or `GET /activity`.
const MAX_ROWS: usize = 50;

/// Most entries of a resource's timeline.
const TIMELINE_ROWS: usize = 50;
/// The outbox events a timeline shows beside the activity log (those the log has no row for).
const TIMELINE_EVENTS: &[&str] = &[
    "drift.repaired",
    "image.tag_moved",
    "image.unverified",
    "image.pulled",
    "rollout.superseded",
    "probe.failing",
    "probe.recovered",
];

/// One line of a timeline.
struct Line {
    at: i64,
    id: (i64, u8),
    what: String,
    outcome: String,
    commit: String,
    message: String,
}

/// A resource page's "Timeline" section (`resource`: `kind/scope/name`); a store error is shown
/// in place of the rows.
pub(super) fn timeline(store: &Store, resource: &str) -> String {
    let mut out = String::from("<section id=\"timeline\"><h2>Timeline</h2>\n");
    let read = store
        .activity_of(resource, TIMELINE_ROWS)
        .and_then(|entries| {
            let events = store.events_of(resource, TIMELINE_EVENTS, TIMELINE_ROWS)?;
            let sent = store.sent_of(resource, TIMELINE_ROWS)?;
            Ok((entries, events, sent))
        });
    let (entries, events, sent) = match read {
        Ok(read) => read,
        Err(error) => {
            let _ = writeln!(
                out,
                "<p class=\"muted\">The activity log could not be read: {}</p></section>",
                Esc(&error.to_string())
            );
            return out;
        }
    };
    let mut lines: Vec<Line> = entries
        .into_iter()
        .map(|entry| Line {
            at: entry.at,
            id: (entry.id, 0),
            what: entry.action.clone(),
            outcome: entry.outcome.as_str().to_owned(),
            commit: entry
                .commit
                .map(|sha| short(sha.as_str()).to_owned())
                .unwrap_or_default(),
            message: if entry.action.starts_with("rollout.") {
                // A progressive rollout's pause, promote or abort: where it was.
                let data = super::rollout::data_text(&entry.data);
                if data.is_empty() {
                    entry.message
                } else {
                    format!("{} ({data})", entry.message)
                }
            } else {
                entry.message
            },
        })
        .chain(events.into_iter().map(|event| {
            Line {
                at: event.at,
                id: (event.id, 1),
                outcome: match event.event.as_str() {
                    "drift.repaired" => "repaired",
                    "rollout.superseded" => "superseded",
                    "probe.failing" => "failing",
                    "probe.recovered" => "recovered",
                    "image.pulled" => "pulled",
                    _ => "warning",
                }
                .to_owned(),
                what: event.event,
                commit: short(&event.commit).to_owned(),
                message: event.message,
            }
        }))
        .chain(sent.into_iter().map(|(event, sinks)| Line {
            at: event.at,
            id: (event.id, 2),
            what: "notify.sent".to_owned(),
            outcome: "sent".to_owned(),
            commit: short(&event.commit).to_owned(),
            message: format!("{} sent to {}", event.event, sinks.join(", ")),
        }))
        .collect();
    // Newest first; the two logs' rows of one second in their own order.
    lines.sort_unstable_by(|a, b| {
        b.at.cmp(&a.at)
            .then(b.id.1.cmp(&a.id.1))
            .then(b.id.0.cmp(&a.id.0))
    });
    lines.truncate(TIMELINE_ROWS);
    if lines.is_empty() {
        out.push_str("<p class=\"muted\">Nothing recorded about it yet.</p>\n</section>\n");
        return out;
    }
    out.push_str(
        "<table class=\"timeline\"><thead><tr><th>when</th><th>what</th><th>outcome</th>\
         <th>commit</th><th>message</th></tr></thead><tbody>\n",
    );
    for line in &lines {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td><code>{}</code></td><td>{}</td></tr>",
            time(line.at),
            Esc(&line.what),
            phase_class(&line.outcome),
            Esc(&line.outcome),
            Esc(&line.commit),
            Esc(&line.message),
        );
    }
    out.push_str("</tbody></table>\n</section>\n");
    out
}

/// The section's HTML; a store error is shown in place of the rows, not as a failed page.
pub(super) fn section(store: &Store, now: i64) -> String {
    let mut out = String::from("<section id=\"activity\"><h2>Activity of the last day</h2>\n");
    match store.activity(now.saturating_sub(WINDOW_SECS), MAX_ROWS) {
        Err(error) => {
            let _ = writeln!(
                out,
                "<p class=\"muted\">The activity log could not be read: {}</p>",
                Esc(&error.to_string())
            );
        }
        Ok((entries, _)) if entries.is_empty() => {
            out.push_str("<p class=\"muted\">Nothing happened in the last day.</p>\n");
        }
        Ok((entries, truncated)) => {
            out.push_str(
                "<table><thead><tr><th>when</th><th>action</th><th>resource</th>\
                 <th>outcome</th><th>by</th><th>commit</th><th>message</th></tr></thead><tbody>\n",
            );
            for entry in entries.iter().rev() {
                let by = match &entry.actor {
                    Some(actor) => format!("{} ({})", entry.origin, actor),
                    None => entry.origin.clone(),
                };
                let commit = entry.commit.as_ref().map_or("", |sha| short(sha.as_str()));
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td>\
                     <td><code>{}</code></td><td>{}</td></tr>",
                    time(entry.at),
                    Esc(&entry.action),
                    Esc(entry.resource.as_deref().unwrap_or("")),
                    phase_class(entry.outcome.as_str()),
                    Esc(entry.outcome.as_str()),
                    Esc(&by),
                    Esc(commit),
                    Esc(&entry.message),
                );
            }
            out.push_str("</tbody></table>\n");
            if truncated {
                let _ = writeln!(
                    out,
                    "<p class=\"muted\">Only the newest {MAX_ROWS} entries are shown: \
                     <code>voodu-agent activity --since 24h</code> lists the whole day.</p>"
                );
            }
        }
    }
    out.push_str("</section>\n");
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::store::{Origin, Who};

    #[test]
    fn the_section_lists_the_days_entries_escaped_and_newest_first() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(&dir.path().join("state.db")).expect("store");
        let empty = section(&store, crate::store::now_unix());
        assert!(
            empty.contains("Nothing happened in the last day"),
            "{empty}"
        );

        let store = store.acting_as(Who::new(Origin::Cli, Some("<script>alert(1)</script>")));
        let one = BTreeMap::from([("FIRST".to_owned(), "1".to_owned())]);
        store.config_set("shop", "", &one).expect("set");
        let two = BTreeMap::from([("SECOND".to_owned(), "2".to_owned())]);
        store.config_set("shop", "", &two).expect("set");

        let html = section(&store, crate::store::now_unix());
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains("cli (&lt;script&gt;alert(1)&lt;/script&gt;)"),
            "{html}"
        );
        assert_eq!(html.matches("<tr><td>").count(), 2, "{html}");
        let second = html.find("SECOND").expect("the second change is listed");
        let first = html.find("FIRST").expect("the first change is listed");
        assert!(second < first, "newest first: {html}");
        // Past the window, the day is empty again.
        let later = section(&store, crate::store::now_unix() + WINDOW_SECS + 60);
        assert!(later.contains("Nothing happened"), "{later}");
    }

    /// A resource's timeline: its activity rows and the outbox's own events about it (a drift
    /// repair), newest first, escaped, no other resource's and no event twice.
    #[test]
    fn a_timeline_merges_the_activity_log_and_drift_repairs_of_one_resource() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(&dir.path().join("state.db")).expect("store");
        let web = "deployment/shop/web";
        assert!(timeline(&store, web).contains("Nothing recorded"));
        store
            .maintenance_on("shop", "web", "<script>alert(1)</script>", 60)
            .expect("maintenance");
        store
            .record_event(
                "drift.repaired",
                web,
                "replica web-1 was removed; replaced",
                serde_json::Value::Null,
            )
            .expect("event");
        store
            .record_event(
                "drift.repaired",
                "deployment/shop/other",
                "another resource's",
                serde_json::Value::Null,
            )
            .expect("event");
        let html = timeline(&store, web);
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert_eq!(html.matches("maintenance.on").count(), 1, "{html}");
        assert!(!html.contains("another resource"), "{html}");
        let drift = html.find("drift.repaired").expect("the repair is listed");
        let maintenance = html
            .find("maintenance.on")
            .expect("the activity row is listed");
        assert!(drift < maintenance, "newest first: {html}");
    }
}
