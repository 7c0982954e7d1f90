//! Telling people: the outbox's events sent to the sinks of `--notify FILE` (chat and
//! webhook messages, commit statuses on the git host).
//!
//! One task per sink reads the outbox from where that sink got to (`sinks.done_id` in the
//! store), keeps the events it wants, and sends them; the reconciler never waits for it.
//!
//! Invariants:
//! - at least once: a sink's position moves only after its request succeeded (a 2xx), so
//!   a receiver that was down gets what it missed, in order, when it is back;
//! - a storm is a few messages: a sink sends at most [`BURST`] messages at once, then one
//!   per its `interval` (20 s unless the file says otherwise); events that arrive meanwhile go out together in the next message (a
//!   commit status sink keeps the latest state per commit);
//! - nothing waits forever: an event older than [`EXPIRY`] when its turn comes is dropped
//!   and counted; a failed send is retried on a back-off up to [`MAX_BACKOFF`]; one request
//!   is bounded by [`REQUEST_TIMEOUT`];
//! - secrets (a chat webhook's URL, a token, an HMAC key) are read from their files for each
//!   send and never logged or recorded: a failed send keeps its status code and its cause
//!   (the client's whole chain of causes, or the start of the receiver's answer), with the
//!   URL and every other secret of the request cut out of it in one place (`send`, through
//!   `redact`), whatever the receiver echoed.

pub mod config;
mod redact;
pub(crate) mod sinks;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use config::{NotifyConfig, Sink, SourcesError, Target};
use sinks::{Request, State};

use crate::store::{Event, Store, blocking, now_unix};

/// Messages a sink may send at once after a quiet spell; then one per its `interval`.
pub const BURST: u32 = 3;
/// An event not sent within this is dropped (and counted).
pub const EXPIRY: Duration = Duration::from_secs(24 * 3600);
/// The longest pause between attempts at a failing sink.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// One request's bound (`notify test --timeout` sets its own).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Most events read (and sent together) at once.
const BATCH: usize = 200;
/// Most bytes of a refusal's body read (its start is recorded as the sink's error).
const ERROR_BODY_BYTES: usize = 1024;
/// Longest secret file read.
const MAX_SECRET_BYTES: u64 = 16 * 1024;

/// Why a send failed; never holds a secret.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {what} file {path}: {message}")]
    Secret {
        what: &'static str,
        path: String,
        message: String,
    },
    /// The request got no answer: the client's causes (`cannot connect: …`).
    #[error("{0}")]
    Request(String),
    #[error("answered {status}: {body}")]
    Refused { status: u16, body: String },
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// Runs one delivery task per sink until `shutdown`. A sink the store has not seen before
/// starts after event `start` (the outbox's head when the agent started): it is told of
/// this run, not of the history before it was configured.
pub async fn run(store: Arc<Store>, config: NotifyConfig, start: i64, shutdown: CancellationToken) {
    let config = Arc::new(config);
    let client = match client(REQUEST_TIMEOUT) {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "cannot build the notification HTTP client; notifications are off");
            return;
        }
    };
    let tasks: Vec<_> = config
        .sinks
        .iter()
        .map(|sink| {
            deliver(
                store.clone(),
                config.clone(),
                sink.clone(),
                client.clone(),
                start,
                shutdown.clone(),
            )
        })
        .collect();
    futures_util::future::join_all(tasks).await;
}

/// Sends one `notify.test` event to sink `name` now, outside the outbox (`notify test`),
/// giving the request `timeout`.
pub async fn send_test(
    config: &NotifyConfig,
    name: &str,
    timeout: Duration,
) -> Result<String, TestError> {
    let sink = config.sink(name).ok_or_else(|| TestError::NoSink {
        name: name.to_owned(),
        names: config.sinks.iter().map(|sink| sink.name.clone()).collect(),
    })?;
    let client = client(timeout)?;
    let event = Event {
        id: 0,
        at: now_unix(),
        event: "notify.test".into(),
        scope: String::new(),
        resource: String::new(),
        commit: String::new(),
        message: "a test message from voodu-agent".into(),
        data: serde_json::Value::Null,
    };
    let request = match &sink.target {
        Target::Message { .. } => {
            message_request(config, sink, std::slice::from_ref(&event)).map_err(TestError::Sink)?
        }
        Target::CommitStatus { .. } => {
            return Err(TestError::CommitStatus(name.to_owned()));
        }
    };
    send(&client, request)
        .await
        .map(|()| format!("{name}: delivered"))
        .map_err(|source| TestError::Send {
            name: name.to_owned(),
            source,
        })
}

/// Why `notify test` sent nothing, or what the sink answered.
#[derive(Debug, thiserror::Error)]
pub enum TestError {
    #[error("no sink called {name:?} (the file has: {})", names.join(", "))]
    NoSink { name: String, names: Vec<String> },
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The sink's URL or secret file cannot be read.
    #[error(transparent)]
    Sink(Error),
    #[error(
        "{0} is a commit_status sink: it sets statuses of applied commits and has no test message"
    )]
    CommitStatus(String),
    #[error("{name}: {source}")]
    Send {
        name: String,
        #[source]
        source: Error,
    },
}

/// Why the sinks' HTTP client was not built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The TLS configuration (the platform's roots, `model::tls`).
    #[error(transparent)]
    Tls(crate::model::tls::TlsError),
    #[error("{0}")]
    Build(#[source] reqwest::Error),
}

fn client(timeout: Duration) -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(crate::model::tls::client_config().map_err(ClientError::Tls)?)
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(ClientError::Build)
}

/// The token bucket of one sink: [`BURST`] at most, one more each `refill`.
struct Bucket {
    tokens: f64,
    at: tokio::time::Instant,
    refill: Duration,
}

impl Bucket {
    fn new(refill: Duration) -> Bucket {
        Bucket {
            tokens: f64::from(BURST),
            at: tokio::time::Instant::now(),
            refill,
        }
    }

    /// How long until a message may go (zero: now, and the token is taken).
    fn take(&mut self) -> Duration {
        let now = tokio::time::Instant::now();
        let earned = (now - self.at).as_secs_f64() / self.refill.as_secs_f64();
        self.tokens = (self.tokens + earned).min(f64::from(BURST));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Duration::ZERO
        } else {
            self.refill.mul_f64(1.0 - self.tokens)
        }
    }
}

async fn deliver(
    store: Arc<Store>,
    config: Arc<NotifyConfig>,
    sink: Sink,
    client: reqwest::Client,
    start: i64,
    shutdown: CancellationToken,
) {
    let mut changes = store.subscribe_changes();
    let mut bucket = Bucket::new(sink.interval);
    let mut failures: u32 = 0;
    // The last event this sink is done with: read from the store once, then kept here.
    let mut done: Option<i64> = None;
    loop {
        let pause = match deliver_once(
            &store,
            &config,
            &sink,
            &client,
            start,
            &mut done,
            &mut bucket,
        )
        .await
        {
            Ok(Progress::Idle) => {
                failures = 0;
                None
            }
            Ok(Progress::Sent) => {
                failures = 0;
                Some(Duration::ZERO)
            }
            Ok(Progress::Limited(wait)) => Some(wait),
            Err(error) => {
                failures = failures.saturating_add(1);
                let wait = Duration::from_secs(1u64 << failures.min(9)).min(MAX_BACKOFF);
                tracing::warn!(sink = %sink.name, %error, retry_in = ?wait, "notification not delivered; will retry");
                if let Err(error) = store.sink_failed(&sink.name, &error.to_string(), now_unix()) {
                    tracing::warn!(sink = %sink.name, %error, "cannot record a notification failure");
                }
                Some(wait)
            }
        };
        match pause {
            Some(Duration::ZERO) => {
                if shutdown.is_cancelled() {
                    return;
                }
            }
            Some(wait) => tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return,
            },
            None => tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                () = shutdown.cancelled() => return,
            },
        }
    }
}

enum Progress {
    /// Nothing left to send.
    Idle,
    /// A message went out (or events were skipped); look again at once.
    Sent,
    /// Events wait for the rate limit.
    Limited(Duration),
}

async fn deliver_once(
    store: &Arc<Store>,
    config: &NotifyConfig,
    sink: &Sink,
    client: &reqwest::Client,
    start: i64,
    done: &mut Option<i64>,
    bucket: &mut Bucket,
) -> Result<Progress, Error> {
    let after = match *done {
        Some(after) => after,
        None => {
            let name = sink.name.clone();
            blocking(store, move |store| store.sink_state(&name, start))
                .await?
                .done_id
        }
    };
    *done = Some(after);
    let events = blocking(store, move |store| store.events_after(after, BATCH)).await?;
    let (Some(first), Some(last)) = (
        events.first().map(|event| event.id),
        events.last().map(|event| event.id),
    ) else {
        return Ok(Progress::Idle);
    };
    // Events pruned before this sink read them (the outbox's bounds) are dropped too.
    let pruned = (first - after - 1).max(0);
    let now = now_unix();
    let expiry = i64::try_from(EXPIRY.as_secs()).unwrap_or(i64::MAX);
    let (fresh, expired): (Vec<Event>, Vec<Event>) = events
        .into_iter()
        .filter(|event| sink.wants(&event.event, &event.scope))
        .partition(|event| now - event.at <= expiry);
    let dropped = i64::try_from(expired.len()).unwrap_or(i64::MAX) + pruned;
    let (requests, sent) = match &sink.target {
        Target::Message { .. } if fresh.is_empty() => (Vec::new(), Vec::new()),
        Target::Message { .. } => (
            vec![message_request(config, sink, &fresh)?],
            fresh.iter().map(|event| event.id).collect(),
        ),
        Target::CommitStatus { .. } => status_requests(store, config, sink, &fresh).await?,
    };
    if requests.is_empty() {
        let name = sink.name.clone();
        blocking(store, move |store| {
            store.sink_done(&name, last, (0, dropped), now, &[])
        })
        .await?;
        *done = Some(last);
        return Ok(Progress::Sent);
    };
    let wait = bucket.take();
    if !wait.is_zero() {
        return Ok(Progress::Limited(wait));
    }
    // All or nothing: after a failure the batch is sent again (a status set twice is the
    // same status).
    for request in requests {
        send(client, request).await?;
    }
    let delivered = i64::try_from(fresh.len()).unwrap_or(i64::MAX);
    tracing::info!(sink = %sink.name, events = delivered, "notification delivered");
    let name = sink.name.clone();
    blocking(store, move |store| {
        store.sink_done(&name, last, (delivered, dropped), now_unix(), &sent)
    })
    .await?;
    *done = Some(last);
    Ok(Progress::Sent)
}

/// A message sink's request for `events`, its secrets read now.
fn message_request(config: &NotifyConfig, sink: &Sink, events: &[Event]) -> Result<Request, Error> {
    let Target::Message {
        kind,
        url_file,
        secret_file,
    } = &sink.target
    else {
        return Err(Error::Request(format!(
            "{} is not a message sink",
            sink.name
        )));
    };
    let url = read_secret("url", url_file)?;
    let secret = secret_file
        .as_ref()
        .map(|file| read_secret("secret", file))
        .transpose()?;
    Ok(sinks::message(
        *kind,
        &url,
        secret.as_deref().map(str::as_bytes),
        events,
        config.dashboard_url.as_deref(),
    ))
}

/// A commit status sink's requests for `events`: for each commit they decide a status for,
/// the latest one (a failure stays: nothing later in the batch turns it back), in the order
/// of their last events; and the ids of the events whose status is sent.
async fn status_requests(
    store: &Arc<Store>,
    config: &NotifyConfig,
    sink: &Sink,
    events: &[Event],
) -> Result<(Vec<Request>, Vec<i64>), Error> {
    let Target::CommitStatus {
        provider,
        api_url,
        repository,
        token_file,
        source,
    } = &sink.target
    else {
        return Ok((Vec::new(), Vec::new()));
    };
    // With several sources, only the commits of the sink's source: the others are not in
    // its repository. A commit's events come in runs: each commit is looked up once.
    let mut decided: Vec<(String, State, String, i64)> = Vec::new();
    let mut ours: HashMap<&str, bool> = HashMap::new();
    let previews = blocking(store, |store| store.previews(None)).await?;
    for event in events.iter().filter(|event| !event.commit.is_empty()) {
        if let Some(source) = source
            && preview_target(&previews, Some(source), &event.commit).is_none()
        {
            let recorded = match ours.get(event.commit.as_str()) {
                Some(recorded) => *recorded,
                None => {
                    let (source, sha) =
                        (source.clone(), crate::model::CommitSha::new(&event.commit));
                    let recorded = blocking(store, move |store| {
                        store.for_source(&source).commit_record(&sha)
                    })
                    .await?
                    .is_some();
                    ours.insert(&event.commit, recorded);
                    recorded
                }
            };
            if !recorded {
                continue;
            }
        }
        let Some((state, description)) = decide(store, event).await? else {
            continue;
        };
        let earlier = decided.iter().position(|(sha, ..)| *sha == event.commit);
        if let Some(index) = earlier {
            if decided[index].1 == State::Failure {
                continue;
            }
            decided.remove(index);
        }
        decided.push((event.commit.clone(), state, description, event.id));
    }
    if decided.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let sent = decided.iter().map(|(.., id)| *id).collect();
    let token = read_secret("token", token_file)?;
    let requests = decided
        .into_iter()
        .map(|(sha, state, description, _)| {
            let preview = preview_target(&previews, source.as_deref(), &sha);
            let (context, target) = match &preview {
                Some((context, url)) => (context.as_str(), Some(url.as_str())),
                None => ("voodu-agent", config.dashboard_url.as_deref()),
            };
            sinks::commit_status(
                *provider,
                api_url,
                repository,
                &token,
                &sha,
                state,
                &description,
                context,
                target,
            )
        })
        .collect();
    Ok((requests, sent))
}

/// For a commit a branch preview runs (of the sink's `source`, or of any with the single
/// `--repo` source): the status context naming the preview and its URL, its first host.
fn preview_target(
    previews: &[crate::store::PreviewRow],
    source: Option<&str>,
    sha: &str,
) -> Option<(String, String)> {
    let preview = previews.iter().find(|preview| {
        preview.commit == sha
            && preview.state == "live"
            && source.is_none_or(|source| preview.source == source)
    })?;
    let host = preview.hosts.split(',').find(|host| !host.is_empty())?;
    Some((
        format!("voodu-agent/preview {}", preview.slug),
        format!("https://{host}/"),
    ))
}

/// The status an event sets on its commit: pending once applied or held, failure when
/// rejected or a rollout of it fails, error when a later commit superseded it before it ended
/// (a rollout of it in flight, or one that never started, or its hold), success once every release it opened succeeded (at once when it changed
/// no workload).
async fn decide(store: &Arc<Store>, event: &Event) -> Result<Option<(State, String)>, Error> {
    let workloads = |data: &serde_json::Value| -> usize {
        data["changed"]
            .as_array()
            .map(|changed| {
                changed
                    .iter()
                    .filter_map(serde_json::Value::as_str)
                    .filter(|key| key.starts_with("deployment/") || key.starts_with("statefulset/"))
                    .count()
            })
            .unwrap_or(0)
    };
    Ok(match event.event.as_str() {
        "commit.applied" => Some(match workloads(&event.data) {
            0 => (State::Success, "applied".to_owned()),
            n => (
                State::Pending,
                format!("applied; rolling out {n} workload(s)"),
            ),
        }),
        "commit.held" => Some((State::Pending, "held: waiting for approval".to_owned())),
        "commit.rejected" => Some((State::Failure, format!("rejected: {}", event.message))),
        // A rollback's own event names the commit rolled back to: the failed commit's
        // status was set by its `rollout.failed`.
        "rollout.failed" => Some((
            State::Failure,
            format!("{} {}: {}", event.event, event.resource, event.message),
        )),
        // A later commit's rollout replaced this commit's before it ended: it never will.
        "rollout.superseded" | "commit.superseded" => {
            let by = event.data["superseded_by"].as_str().unwrap_or_default();
            Some((
                State::Error,
                format!("superseded by {}", by.get(..7).unwrap_or(by)),
            ))
        }
        "rollout.succeeded" => {
            let sha = event.commit.clone();
            let (phases, applied) = blocking(store, move |store| {
                Ok((
                    store.release_phases_of_commit(&sha)?,
                    store.applied_data(&sha)?,
                ))
            })
            .await?;
            let expected = applied.map_or(0, |data| workloads(&data));
            let succeeded = phases
                .iter()
                .filter(|(_, phase)| phase == "succeeded")
                .count();
            (succeeded >= expected.max(1) && succeeded == phases.len()).then(|| {
                (
                    State::Success,
                    format!("{succeeded} workload(s) rolled out and ready"),
                )
            })
        }
        _ => None,
    })
}

fn read_secret(what: &'static str, path: &std::path::Path) -> Result<String, Error> {
    let error = |message: String| Error::Secret {
        what,
        path: path.display().to_string(),
        message,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| error(e.to_string()))?
        .len();
    if size > MAX_SECRET_BYTES {
        return Err(error(format!("{size} bytes; at most {MAX_SECRET_BYTES}")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(error("it is empty".into()));
    }
    Ok(text.to_owned())
}

/// Sends `request`; the one place every sink's request goes through, so the one place its
/// error is made: the status code or the client's causes, and the start of the receiver's
/// answer, each cleaned of the request's secrets (`redact`).
async fn send(client: &reqwest::Client, request: Request) -> Result<(), Error> {
    let redactor = redact::Redactor::new(&request);
    let mut builder = client.post(&request.url);
    for (name, value) in &request.headers {
        builder = builder.header(*name, value);
    }
    builder = builder.header(
        reqwest::header::USER_AGENT,
        concat!("voodu-agent/", env!("CARGO_PKG_VERSION")),
    );
    let response = builder
        .body(request.body)
        .send()
        .await
        .map_err(|error| Error::Request(redactor.clean(&causes(&error), false)))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    // The start of the answer says why; a receiver that sends more is not read further.
    let mut response = response;
    let mut body = Vec::new();
    let mut whole = false;
    while body.len() <= ERROR_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => {
                whole = true;
                break;
            }
            Err(_) => break,
        }
    }
    let cut = !whole || body.len() > ERROR_BODY_BYTES;
    body.truncate(ERROR_BODY_BYTES);
    // A character cut by the read is dropped, so the end is text a secret can be matched in.
    if let Err(error) = std::str::from_utf8(&body)
        && cut
        && error.error_len().is_none()
    {
        body.truncate(error.valid_up_to());
    }
    let body = redactor.clean(&String::from_utf8_lossy(&body), cut);
    Err(Error::Refused {
        status: status.as_u16(),
        body: crate::model::text::escape(body.chars().take(200).collect::<String>().trim())
            .into_owned(),
    })
}

/// What a client error says, cause by cause (`connection refused`, `operation timed out`, a
/// TLS refusal), without its URL: reqwest's own text is only `error sending request`.
fn causes(error: &reqwest::Error) -> String {
    crate::base::request_error_text(error, "no answer in time", true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead as _, Read as _, Write as _};
    use std::sync::Mutex;

    /// Requests a receiver got: (head, body).
    type Received = Arc<Mutex<Vec<(String, String)>>>;

    /// A loopback receiver answering 200; keeps each request's head (the request line, then
    /// the headers with lower-cased names) and body.
    fn receiver() -> (String, Received) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let address = listener.local_addr().expect("bound");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let keep = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = std::io::BufReader::new(&stream);
                let mut length = 0;
                let mut head = String::new();
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    let lower = line.to_ascii_lowercase();
                    if let Some(value) = lower.strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                    head.push_str(if head.is_empty() { &line } else { &lower });
                    line.clear();
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_ok() {
                    keep.lock()
                        .expect("not poisoned")
                        .push((head, String::from_utf8_lossy(&body).into_owned()));
                }
                let _ = (&stream).write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        });
        (format!("http://{address}"), requests)
    }

    /// A loopback receiver answering every request `404` with a page that echoes the whole
    /// request head back (Express's `Cannot POST /path`, and then some).
    fn echoing_receiver() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let address = listener.local_addr().expect("bound");
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = std::io::BufReader::new(&stream);
                let mut head = Vec::new();
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    head.push(line.trim_end().to_owned());
                    line.clear();
                }
                let target = head
                    .first()
                    .and_then(|line| line.split(' ').nth(1))
                    .unwrap_or_default()
                    .to_owned();
                let page = format!(
                    "<!DOCTYPE html>\n<pre>Cannot POST {target}</pre>\n{}",
                    head.join("\n")
                );
                let _ = (&stream).write_all(
                    format!(
                        "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                        page.len()
                    )
                    .as_bytes(),
                );
            }
        });
        format!("http://{address}")
    }

    /// Issue 47: a receiver whose error page echoes the request (the path of a chat
    /// webhook's URL is its secret) leaves no secret in the error, which keeps the status
    /// code and what the page says.
    #[tokio::test]
    async fn a_receiver_echoing_the_request_puts_no_secret_in_the_error()
    -> Result<(), Box<dyn std::error::Error>> {
        let base = echoing_receiver();
        let dir = tempfile::tempdir()?;
        let url_file = dir.path().join("url");
        std::fs::write(
            &url_file,
            format!("{base}/hooks/p4th-s3cret?token=qu3ry-s3cret\n"),
        )?;
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, "hm4c-s3cret\n")?;
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "t0ken-s3cret\n")?;
        let config = NotifyConfig::parse(
            "notify.hcl",
            &format!(
                "notify \"ci\" {{\n  type = \"generic\"\n  url_file = \"{}\"\n  secret_file = \"{}\"\n}}\n",
                url_file.display(),
                key_file.display()
            ),
        )?;
        let event = Event {
            id: 1,
            at: now_unix(),
            event: "commit.applied".into(),
            scope: String::new(),
            resource: String::new(),
            commit: String::new(),
            message: "applied".into(),
            data: serde_json::Value::Null,
        };
        let client = client(REQUEST_TIMEOUT)?;
        let requests = [
            message_request(&config, &config.sinks[0], std::slice::from_ref(&event))?,
            sinks::commit_status(
                config::Provider::Gitlab,
                &format!("{base}/api/v4"),
                "acme/deploy",
                "t0ken-s3cret",
                "0123456789abcdef0123456789abcdef01234567",
                State::Pending,
                "applied",
                "voodu-agent",
                None,
            ),
        ];
        for request in requests {
            let error = send(&client, request)
                .await
                .expect_err("the receiver answers 404")
                .to_string();
            assert!(
                error.starts_with("answered 404: <!DOCTYPE html>") && error.contains("Cannot POST"),
                "{error}"
            );
            assert!(!error.contains("s3cret"), "a secret in: {error}");
        }
        Ok(())
    }

    /// A commit whose rollout a later commit superseded gets a final status, `error`, naming
    /// the commit that did; not `pending` for good.
    #[tokio::test]
    async fn a_superseded_rollout_ends_its_commit_status_in_error()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(Store::open(&dir.path().join("state.db"))?);
        let event = Event {
            id: 1,
            at: 0,
            event: "rollout.superseded".to_owned(),
            scope: "shop".to_owned(),
            resource: "deployment/shop/web".to_owned(),
            commit: "1".repeat(40),
            message: "release #2 superseded by commit 2222222 before its rollout ended".to_owned(),
            data: serde_json::json!({ "release": 2, "superseded_by": "2".repeat(40) }),
        };
        assert_eq!(
            decide(&store, &event).await?,
            Some((State::Error, "superseded by 2222222".to_owned()))
        );
        // A commit replaced before its rollout began (`commit.superseded`): the same.
        let event = Event {
            event: "commit.superseded".to_owned(),
            resource: String::new(),
            data: serde_json::json!({ "superseded_by": "3".repeat(40) }),
            ..event
        };
        assert_eq!(
            decide(&store, &event).await?,
            Some((State::Error, "superseded by 3333333".to_owned()))
        );
        Ok(())
    }

    /// Each git host's status request, sent through the real client to a local receiver:
    /// method, path, the auth header and the state as the provider documents them.
    #[tokio::test]
    async fn commit_statuses_reach_each_provider_as_documented()
    -> Result<(), Box<dyn std::error::Error>> {
        let (base, requests) = receiver();
        let client = client(REQUEST_TIMEOUT)?;
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let cases = [
            (
                config::Provider::Github,
                "acme/deploy",
                format!("POST /repos/acme/deploy/statuses/{sha} "),
                "authorization: bearer t0k",
                r#""state":"failure""#,
            ),
            (
                config::Provider::Gitlab,
                "grp/deploy",
                format!("POST /projects/grp%2Fdeploy/statuses/{sha} "),
                "private-token: t0k",
                r#""state":"failed""#,
            ),
            (
                config::Provider::Gitea,
                "acme/deploy",
                format!("POST /repos/acme/deploy/statuses/{sha} "),
                "authorization: token t0k",
                r#""state":"failure""#,
            ),
            (
                config::Provider::Forgejo,
                "acme/deploy",
                format!("POST /repos/acme/deploy/statuses/{sha} "),
                "authorization: token t0k",
                r#""state":"failure""#,
            ),
            (
                config::Provider::Bitbucket,
                "acme/deploy",
                format!("POST /repositories/acme/deploy/commit/{sha}/statuses/build "),
                "authorization: bearer t0k",
                r#""state":"FAILED""#,
            ),
        ];
        for (provider, repository, line, auth, state) in &cases {
            let request = sinks::commit_status(
                *provider,
                &base,
                repository,
                "t0k",
                sha,
                State::Failure,
                "rollout failed",
                "voodu-agent",
                None,
            );
            send(&client, request).await?;
            let (head, body) = requests
                .lock()
                .expect("not poisoned")
                .pop()
                .ok_or("nothing received")?;
            assert!(head.starts_with(line.as_str()), "{provider:?}: {head}");
            assert!(
                head.lines().any(|header| header.trim() == *auth),
                "{provider:?}: {head}"
            );
            assert!(body.contains(state), "{provider:?}: {body}");
        }
        Ok(())
    }

    /// An event older than the expiry when its turn comes is dropped and counted, not sent;
    /// a fresh one behind it is sent.
    #[tokio::test]
    async fn expired_events_are_dropped_and_counted() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("state.db");
        let store = Arc::new(Store::open(&db)?);
        for n in 0..3 {
            store.record_event(
                "drift.repaired",
                &format!("deployment/shop/old-{n}"),
                "back",
                serde_json::Value::Null,
            )?;
        }
        let expiry = i64::try_from(EXPIRY.as_secs())?;
        rusqlite::Connection::open(&db)?
            .execute("UPDATE outbox SET at = at - ?1 - 60", [expiry])?;
        store.record_event(
            "drift.repaired",
            "deployment/shop/new",
            "back",
            serde_json::Value::Null,
        )?;
        let (url, requests) = receiver();
        let url_file = dir.path().join("url");
        std::fs::write(&url_file, format!("{url}/hook"))?;
        let config = NotifyConfig::parse(
            "notify.hcl",
            &format!(
                "notify \"ops\" {{\n  type = \"generic\"\n  url_file = \"{}\"\n}}\n",
                url_file.display()
            ),
        )?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(store.clone(), config, 0, shutdown.clone()));
        for _ in 0..100 {
            if store
                .sink_states()?
                .first()
                .is_some_and(|state| state.backlog == 0)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        shutdown.cancel();
        task.await?;
        let state = &store.sink_states()?[0];
        assert_eq!((state.delivered, state.dropped, state.backlog), (1, 3, 0));
        let bodies: Vec<String> = requests
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(_, body)| body.clone())
            .collect();
        assert_eq!(bodies.len(), 1);
        assert!(
            bodies[0].contains("deployment/shop/new") && !bodies[0].contains("old-"),
            "{bodies:?}"
        );
        Ok(())
    }

    /// With several sources a commit status sink reports only its source's commits: the
    /// others are not in its repository.
    #[tokio::test]
    async fn a_status_sink_reports_only_the_commits_of_its_source()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(Store::open(&dir.path().join("state.db"))?);
        let (shop, blog) = ("a".repeat(40), "b".repeat(40));
        // No diagnostics (the type is the manifest stage's, which notify does not import).
        let none = Default::default();
        store
            .for_source("shop")
            .reject_commit(&crate::model::CommitSha::new(&shop), &none)?;
        store
            .for_source("blog")
            .reject_commit(&crate::model::CommitSha::new(&blog), &none)?;
        let events = store.events_after(0, 100)?;
        assert_eq!(
            events
                .iter()
                .filter(|e| e.event == "commit.rejected")
                .count(),
            2
        );
        let token = dir.path().join("token");
        std::fs::write(&token, "t0ken\n")?;
        let config = |source: &str| {
            NotifyConfig::parse(
                "notify.hcl",
                &format!(
                    "commit_status \"origin\" {{\n  provider = \"github\"\n  api_url = \"https://git.example\"\n  repository = \"acme/shop\"\n  token_file = \"{}\"\n  {source}\n}}\n",
                    token.display()
                ),
            )
        };
        for (source, wanted) in [
            (r#"source = "shop""#, vec![shop.clone()]),
            ("", vec![shop.clone(), blog.clone()]),
        ] {
            let config = config(source)?;
            let (requests, _) = status_requests(&store, &config, &config.sinks[0], &events).await?;
            let shas: Vec<String> = requests
                .iter()
                .filter_map(|request| request.url.rsplit('/').next().map(str::to_owned))
                .collect();
            assert_eq!(shas, wanted, "{source}");
        }
        Ok(())
    }

    /// A storm of 200 drift repairs over several intervals reaches a sink as a handful of
    /// messages (the burst of 3, then one an interval), and every event is in one of them.
    /// The file says 1 s (the shortest it may); the sink then runs at a quarter of that, so
    /// the storm spans as many intervals in a quarter of the time (the bucket is the same at
    /// any scale).
    #[tokio::test]
    async fn a_storm_of_drift_repairs_is_a_handful_of_messages()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(Store::open(&dir.path().join("state.db"))?);
        let (url, bodies) = receiver();
        let url_file = dir.path().join("url");
        std::fs::write(&url_file, format!("{url}/storm"))?;
        let mut config = NotifyConfig::parse(
            "notify.hcl",
            &format!(
                "notify \"ops\" {{\n  type = \"generic\"\n  url_file = \"{}\"\n  interval = \"1s\"\n}}\n",
                url_file.display()
            ),
        )?;
        assert_eq!(config.sinks[0].interval, Duration::from_secs(1));
        let interval = Duration::from_millis(250);
        config.sinks[0].interval = interval;
        let shutdown = CancellationToken::new();
        let start = store.outbox_head()?;
        let task = tokio::spawn(run(store.clone(), config, start, shutdown.clone()));
        let began = std::time::Instant::now();
        for n in 0..200 {
            let resource = format!("deployment/shop/web-{}", n % 20);
            let writer = store.clone();
            tokio::task::spawn_blocking(move || {
                writer.record_event("drift.repaired", &resource, "back", serde_json::Value::Null)
            })
            .await??;
            tokio::time::sleep(Duration::from_micros(2500)).await;
        }
        let mut delivered = 0;
        for _ in 0..400 {
            delivered = bodies
                .lock()
                .expect("not poisoned")
                .iter()
                .map(|(_, body)| {
                    serde_json::from_str::<serde_json::Value>(body)
                        .map(|body| body["events"].as_array().map_or(0, Vec::len))
                        .unwrap_or(0)
                })
                .sum::<usize>();
            if delivered == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let messages = bodies.lock().expect("not poisoned").len();
        let seconds = began.elapsed().as_secs_f64();
        shutdown.cancel();
        task.await?;
        assert_eq!(delivered, 200, "every event, once");
        // The burst, then at most one an interval while the storm and its tail lasted.
        let bound = f64::from(BURST) + (seconds / interval.as_secs_f64()).ceil();
        assert!(
            (messages as f64) <= bound,
            "{messages} messages for a storm of 200 in {seconds:.1}s (at most {bound})"
        );
        let state = store.sink_states()?;
        assert_eq!((state[0].delivered, state[0].dropped), (200, 0));
        Ok(())
    }

    #[test]
    fn a_preview_commit_s_status_points_at_the_preview() {
        let row = crate::store::PreviewRow {
            source: "shop".to_owned(),
            slug: "feat-x".to_owned(),
            branch: "preview/feat-x".to_owned(),
            commit: "abc".to_owned(),
            state: "live".to_owned(),
            message: String::new(),
            hosts: "feat-x.preview.example.com".to_owned(),
            scopes: "shop-pr-feat-x".to_owned(),
            created: 0,
            pushed: 0,
            expires: 0,
        };
        let previews = [row.clone()];
        assert_eq!(
            preview_target(&previews, Some("shop"), "abc"),
            Some((
                "voodu-agent/preview feat-x".to_owned(),
                "https://feat-x.preview.example.com/".to_owned()
            ))
        );
        assert_eq!(preview_target(&previews, Some("blog"), "abc"), None);
        assert_eq!(preview_target(&previews, None, "def"), None);
        let refused = [crate::store::PreviewRow {
            state: "refused".to_owned(),
            ..row
        }];
        assert_eq!(preview_target(&refused, None, "abc"), None);
    }
}
