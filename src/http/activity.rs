//! The activity log's view: the JSON document of `GET /activity`, also printed by
//! `voodu-agent activity --json`.
//!
//! Invariants: built from store reads only, by one function (`build`), so the command line
//! and HTTP cannot disagree; the page is bounded ([`MAX_LIMIT`] rows) and says when older
//! rows in the window were left out; rows hold no config value (the store never has one
//! there).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::AppState;
use crate::base::rfc3339_seconds;
use crate::store::{Activity, ActivityOutcome, Store, now_unix};

/// The window `since` defaults to.
pub(crate) const DEFAULT_SINCE: &str = "24h";
/// Rows one HTTP page holds by default, and at most.
pub(crate) const DEFAULT_LIMIT: usize = 200;
pub(crate) const MAX_LIMIT: usize = 1000;

/// The JSON document of `GET /activity` and `activity --json`.
#[derive(Debug, Serialize)]
pub(crate) struct ActivityView {
    /// The start of the window, RFC 3339 (UTC).
    pub(crate) since: String,
    /// Oldest first.
    pub(crate) entries: Vec<ActivityEntryView>,
    /// True when older rows of the window were left out (raise the limit, or narrow since).
    pub(crate) truncated: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct ActivityEntryView {
    pub(crate) id: i64,
    /// RFC 3339 (UTC, seconds).
    pub(crate) at: String,
    pub(crate) at_unix: i64,
    pub(crate) action: String,
    /// `poll`, `webhook`, `ref-watch`, `cli`, `http` or `agent`.
    pub(crate) origin: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) actor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) commit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) resource: Option<String>,
    /// The source (`--sources`) whose commit or resource it is; absent for the single
    /// `--repo` source and host-wide rows.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) source: String,
    pub(crate) outcome: ActivityOutcome,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) message: String,
    /// Detail by action: changed resources and trigger verdicts of a commit, config keys
    /// with their digests, a release id.
    #[serde(skip_serializing_if = "is_empty")]
    pub(crate) data: serde_json::Value,
}

fn is_empty(value: &serde_json::Value) -> bool {
    value.is_null() || value.as_object().is_some_and(serde_json::Map::is_empty)
}

/// A `since` that is neither a duration nor a time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "since {0:?} is neither a duration (24h, 30m, 7d) nor an RFC 3339 time (2026-11-20T08:00:00Z)"
)]
pub(crate) struct SinceError(String);

/// `since` as Unix seconds: a duration back from `now` (`24h`, `30m`, `7d`) or an RFC 3339
/// time.
pub(crate) fn parse_since(text: &str, now: i64) -> Result<i64, SinceError> {
    let text = text.trim();
    if let Ok(duration) = humantime::parse_duration(text) {
        let back = i64::try_from(duration.as_secs()).unwrap_or(i64::MAX);
        return Ok(now.saturating_sub(back));
    }
    match humantime::parse_rfc3339_weak(text) {
        Ok(at) => Ok(at.duration_since(std::time::UNIX_EPOCH).map_or(0, |since| {
            i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
        })),
        Err(_) => Err(SinceError(text.to_owned())),
    }
}

fn entry_view(activity: Activity) -> ActivityEntryView {
    ActivityEntryView {
        id: activity.id,
        at: rfc3339_seconds(activity.at.max(0)),
        at_unix: activity.at,
        action: activity.action,
        origin: activity.origin,
        actor: activity.actor,
        commit: activity.commit.map(|commit| commit.to_string()),
        resource: activity.resource,
        source: activity.source,
        outcome: activity.outcome,
        message: activity.message,
        data: activity.data,
    }
}

/// Builds the document: rows at or after `since`, the newest `limit`, oldest first.
pub(crate) fn build(store: &Store, since: i64, limit: usize) -> crate::store::Result<ActivityView> {
    let (entries, truncated) = store.activity(since, limit)?;
    Ok(ActivityView {
        since: rfc3339_seconds(since.max(0)),
        entries: entries.into_iter().map(entry_view).collect(),
        truncated,
    })
}

/// Query of `GET /activity`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ActivityQuery {
    since: Option<String>,
    limit: Option<usize>,
}

pub(super) async fn activity(
    State(state): State<Arc<AppState>>,
    Query(query): Query<ActivityQuery>,
) -> Response {
    let since = match parse_since(query.since.as_deref().unwrap_or(DEFAULT_SINCE), now_unix()) {
        Ok(since) => since,
        Err(error) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({ "error": error.to_string() })),
            )
                .into_response();
        }
    };
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    match crate::store::blocking(&state.ctx.store, move |store| build(store, since, limit)).await {
        Ok(view) => Json(view).into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({ "error": error.to_string() })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_duration_back_or_a_time() {
        assert_eq!(parse_since("24h", 100_000), Ok(100_000 - 86_400));
        assert_eq!(parse_since("7d", 1_000_000), Ok(1_000_000 - 7 * 86_400));
        assert_eq!(parse_since("2026-01-01T00:00:00Z", 0), Ok(1_767_225_600));
        assert!(parse_since("yesterday", 0).is_err());
        assert!(parse_since("1000000000d", 5).is_ok_and(|since| since < 0));
    }
}
