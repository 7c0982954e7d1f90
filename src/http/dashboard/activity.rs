//! The overview's "Activity of the last day" section.
//!
//! MERGE POINT: the activity log (another branch adds it to the store, with the `activity`
//! command) is not in this build. When it lands, `section` reads the last day of it from
//! `store` and renders one line per entry with `super::html::Esc`, as the other views do;
//! the caller (`super::overview`) already passes the store on a blocking thread.

use crate::store::Store;

/// The section's HTML: for now, a note that this agent keeps no activity log.
pub(super) fn section(_store: &Store, _now: i64) -> String {
    "<section id=\"activity\"><h2>Activity of the last day</h2><p class=\"muted\">This agent keeps no activity log yet.</p></section>\n".to_owned()
}
