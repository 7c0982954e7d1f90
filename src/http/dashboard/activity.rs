//! The overview's "Activity of the last day" section: the newest entries of the activity log
//! (`Store::activity`, the rows `activity` and `GET /activity` show), newest first.
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
}
