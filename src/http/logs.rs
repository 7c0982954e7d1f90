//! Log streams over HTTP: `GET /logs/{scope}/{name}` (text, one `source | line` a line, what
//! `voodu-agent logs` reads) and `GET /ui/resource/{kind}/{scope}/{name}/logs` (server-sent
//! events the dashboard's resource page tails). Both read the agent's `LogSource`
//! (`agent::logs`: the resource's containers, followed, masked and escaped there).
//!
//! Invariants: at most [`MAX_CLIENTS`] log streams run at once (more are answered 429); each
//! gets at most [`BYTES_PER_SECOND`] (bursts of [`BURST`]): lines past that are dropped and
//! counted in a note, never queued; between the source and the connection at most
//! [`BUFFER`] events wait, and a client that takes none of them for [`SLOW_CLIENT`] ends
//! its stream (the connection's write stall then closes it, `conn.rs`); a stream ends on
//! shutdown and within the connection's idle timeout (the browser reconnects from the last
//! second it saw, `Last-Event-ID`; the CLI likewise with `since`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{Stream, StreamExt as _};
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;

use super::AppState;
use crate::model::Kind;
use crate::model::logs::{Budget, Shown};

/// Log streams served at once.
pub const MAX_CLIENTS: usize = 16;
/// What one stream may send a second, on average.
pub const BYTES_PER_SECOND: u64 = 64 * 1024;
/// What one stream may send at once.
pub const BURST: u64 = 256 * 1024;
/// Events waiting between the source and a connection.
pub const BUFFER: usize = 64;
/// A client that takes no event for this long is cut.
pub const SLOW_CLIENT: Duration = Duration::from_secs(10);
/// The most lines `tail` may ask for.
pub const MAX_TAIL: usize = 10_000;
/// Lines of history the dashboard starts with.
const DASHBOARD_TAIL: usize = 200;

/// Which output of which resource to stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    pub scope: String,
    pub name: String,
    /// One container: its name or its replica id. `None`: all of them.
    pub replica: Option<String>,
    /// Only the containers of this release.
    pub release: Option<i64>,
    /// Only output written at or after this Unix time.
    pub since: Option<i64>,
    /// Only the last lines of each container.
    pub tail: Option<usize>,
    /// Keep going: new containers join, stopped ones leave.
    pub follow: bool,
}

/// What a log stream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogItem {
    /// A line of a container's output, masked and escaped.
    Line(Shown),
    /// What happened to the stream (a container joined or left, an error), written by the
    /// agent from escaped parts.
    Note(String),
}

/// The lines of one query, until they end.
pub type LogLines = Pin<Box<dyn Stream<Item = LogItem> + Send>>;

/// Where log streams come from: the agent's containers (`agent::logs::Follower`).
pub trait LogSource: Send + Sync + 'static {
    fn open(&self, query: LogQuery) -> LogLines;
}

/// The log routes (the caller adds the auth layer).
pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/logs/{scope}/{name}", get(text))
        .route("/ui/resource/{kind}/{scope}/{name}/logs", get(events))
}

/// Query of `GET /logs/…`.
#[derive(Debug, Default, Deserialize)]
struct TextQuery {
    replica: Option<String>,
    release: Option<i64>,
    since: Option<i64>,
    tail: Option<usize>,
    #[serde(default)]
    follow: bool,
}

/// Query of the dashboard's stream.
#[derive(Debug, Default, Deserialize)]
struct EventsQuery {
    replica: Option<String>,
}

/// A refusal as plain text.
fn refuse(status: StatusCode, message: &str) -> Response {
    (status, format!("{message}\n")).into_response()
}

/// The source and a client place, or the status and message refusing them.
fn admit(
    state: &AppState,
) -> Result<(Arc<dyn LogSource>, OwnedSemaphorePermit), (StatusCode, String)> {
    let Some(source) = state.ctx.logs.clone() else {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            "this agent serves no logs".to_owned(),
        ));
    };
    let Ok(permit) = state.log_clients.clone().try_acquire_owned() else {
        return Err((
            StatusCode::TOO_MANY_REQUESTS,
            format!("{MAX_CLIENTS} log streams are open already; try again later"),
        ));
    };
    Ok((source, permit))
}

/// Scope and name as the store keeps them: not empty, bounded.
fn valid_names(scope: &str, name: &str) -> bool {
    [scope, name]
        .iter()
        .all(|part| !part.is_empty() && part.len() <= 253)
}

/// `GET /logs/{scope}/{name}?replica=&release=&since=&tail=&follow=`.
async fn text(
    State(state): State<Arc<AppState>>,
    Path((scope, name)): Path<(String, String)>,
    Query(query): Query<TextQuery>,
) -> Response {
    if !valid_names(&scope, &name) {
        return refuse(StatusCode::BAD_REQUEST, "not a SCOPE/NAME");
    }
    let (source, permit) = match admit(&state) {
        Ok(admitted) => admitted,
        Err((status, message)) => return refuse(status, &message),
    };
    let lines = source.open(LogQuery {
        scope,
        name,
        replica: query.replica,
        release: query.release,
        since: query.since,
        tail: query.tail.map(|tail| tail.min(MAX_TAIL)),
        follow: query.follow,
    });
    let body = relay(lines, permit, &state, |item| {
        Ok::<_, Infallible>(match item {
            LogItem::Line(line) => format!("{} | {}\n", line.source, line.text),
            LogItem::Note(note) => format!("-- {note}\n"),
        })
    });
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// `GET /ui/resource/{kind}/{scope}/{name}/logs?replica=`: `line` events (`{"s": source,
/// "t": text}`) and `note` events (`{"t": text}`), each with the second it was sent as its
/// id; a reconnect (`Last-Event-ID`) goes on from that second.
async fn events(
    State(state): State<Arc<AppState>>,
    Path((kind, scope, name)): Path<(String, String, String)>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Response {
    if Kind::parse(&kind).is_none() || !valid_names(&scope, &name) {
        return refuse(StatusCode::NOT_FOUND, "no such resource");
    }
    let (source, permit) = match admit(&state) {
        Ok(admitted) => admitted,
        Err((status, message)) => return refuse(status, &message),
    };
    let resumed = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<i64>().ok());
    let lines = source.open(LogQuery {
        scope,
        name,
        replica: query.replica.filter(|replica| !replica.is_empty()),
        release: None,
        since: resumed,
        tail: if resumed.is_some() {
            None
        } else {
            Some(DASHBOARD_TAIL)
        },
        follow: true,
    });
    let events = relay(lines, permit, &state, |item| {
        let (kind, data) = match item {
            LogItem::Line(line) => (
                "line",
                serde_json::json!({"s": line.source, "t": line.text}),
            ),
            LogItem::Note(note) => ("note", serde_json::json!({ "t": note })),
        };
        Ok::<_, Infallible>(
            Event::default()
                .event(kind)
                .id(crate::store::now_unix().to_string())
                .retry(Duration::from_secs(2))
                .data(data.to_string()),
        )
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The bytes an item costs against the budget.
fn cost(item: &LogItem) -> u64 {
    let length = match item {
        LogItem::Line(line) => line.source.len() + line.text.len(),
        LogItem::Note(note) => note.len(),
    };
    u64::try_from(length).unwrap_or(u64::MAX).saturating_add(8)
}

/// Milliseconds of a clock that does not go back.
fn monotonic_ms(start: tokio::time::Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Relays `lines` to the connection as `format` writes them, on a task of its own: under the
/// stream's byte budget, through a buffer of [`BUFFER`] events, until the source ends, the
/// client is slow ([`SLOW_CLIENT`]) or gone, the stream's lifetime is over, or shutdown.
/// `permit` is held as long as the task runs.
fn relay<T, F>(
    mut lines: LogLines,
    permit: OwnedSemaphorePermit,
    state: &AppState,
    format: F,
) -> impl Stream<Item = T> + Send + 'static
where
    T: Send + 'static,
    F: Fn(LogItem) -> T + Send + 'static,
{
    let (sender, receiver) = mpsc::channel::<T>(BUFFER);
    let shutdown: CancellationToken = state.shutdown.clone();
    // Under the connection's idle timeout, which also runs while a body streams.
    let lifetime = state.ctx.options.idle_timeout.mul_f64(0.8);
    tokio::spawn(async move {
        let _permit = permit;
        let start = tokio::time::Instant::now();
        let deadline = start + lifetime;
        let mut budget = Budget::new(BYTES_PER_SECOND, BURST, 0);
        let mut dropped: u64 = 0;
        loop {
            let item = tokio::select! {
                item = lines.next() => item,
                () = tokio::time::sleep_until(deadline) => return,
                () = shutdown.cancelled() => return,
                () = sender.closed() => return,
            };
            let Some(item) = item else { return };
            let now = monotonic_ms(start);
            if !budget.spend(cost(&item), now) {
                dropped += 1;
                continue;
            }
            if dropped > 0 {
                let note = LogItem::Note(format!(
                    "{dropped} lines dropped: this stream sends at most {} KiB/s",
                    BYTES_PER_SECOND / 1024
                ));
                if !forward(&sender, format(note)).await {
                    return;
                }
                dropped = 0;
            }
            if !forward(&sender, format(item)).await {
                return;
            }
        }
    });
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        let item = receiver.recv().await?;
        Some((item, receiver))
    })
}

/// Hands `item` to the connection; false when the client is gone or took nothing for
/// [`SLOW_CLIENT`].
async fn forward<T>(sender: &mpsc::Sender<T>, item: T) -> bool {
    match sender.send_timeout(item, SLOW_CLIENT).await {
        Ok(()) => true,
        Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
            tracing::debug!("log stream cut: the client took nothing for {SLOW_CLIENT:?}");
            false
        }
        Err(mpsc::error::SendTimeoutError::Closed(_)) => false,
    }
}
