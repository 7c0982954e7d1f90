//! HTTP side of the agent (axum): the git webhook, health, status, releases and metrics.
//!
//! Routes:
//! - `POST /hooks/git`: a push from GitHub, GitLab, Gitea/Forgejo or the generic HMAC form
//!   (`webhook.rs`) → a `SyncRequest`; `?wait=true` answers once the pushed commit was
//!   applied or rejected;
//! - `GET /healthz`, `GET /status` (the document `status --json` prints),
//!   `GET /releases/{scope}/{name}` (`status.rs`), `GET /activity?since=&limit=` (the
//!   activity log, `activity.rs`), `GET /metrics` (`metrics.rs`, with the process figures of
//!   `process.rs`);
//! - `GET /ui…`: the dashboard (`dashboard/`), read-only, live through server-sent events;
//!   `GET /` redirects there;
//! - `GET /logs/{scope}/{name}` and the dashboard's `/ui/resource/…/logs`: a resource's
//!   containers' output, masked, escaped and bounded (`logs.rs`);
//! - `POST /api/rollouts/{scope}/{name}/promote|abort`: `voodu-agent promote|abort` as an API
//!   call (`rollouts.rs`), authenticated like the webhook.
//!
//! Invariants: everything shown is read from the store (on blocking threads); the only things
//! this module can make happen are a sync request and a rollout's promote or abort request
//! (left in the store, the deployment queued for a pass); memory stays bounded under any request
//! rate: at most `max_connections` requests are served at once and
//! `max_waiting_connections` more connections wait for a request head, which must be
//! whole within `header_timeout` of its first byte and fit in `max_header_bytes`, a
//! connection that sends nothing is closed after `idle_timeout`, and slow clients are evicted for new ones
//! (`conn.rs`), bodies are capped at `max_body_bytes` and read under a timeout, and at most
//! `max_waiters` requests wait for an outcome, and at most `dashboard::live::MAX_STREAMS`
//! live streams run, and at most `logs::MAX_CLIENTS` log streams. Off loopback, `/status`, `/releases`, `/activity`, `/metrics`, `/logs` and `/ui`
//! need the webhook secret (`auth.rs`: a bearer token, or a browser's Basic password);
//! `/healthz` is open.

pub(crate) mod activity;
mod auth;
mod conn;
mod dashboard;
pub(crate) mod detail;
mod error;
pub mod images;
pub mod logs;
mod metrics;
mod process;
mod registry;
mod rollouts;
pub mod status;
pub(crate) mod webhook;

pub use error::{Error, Result};
pub use webhook::WebhookSecret;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::git::trigger::SyncRequests;
use crate::metrics::Metrics;
use crate::store::Store;

/// Tunables of the HTTP side.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Webhook secret; without one, requests are not authenticated (loopback only).
    pub secret: Option<WebhookSecret>,
    /// Larger webhook bodies are refused with 413.
    pub max_body_bytes: usize,
    /// How long reading a body may take.
    pub body_timeout: Duration,
    /// `?wait=true` answers 504 after this long unless `?timeout=` asks for less.
    pub wait_timeout: Duration,
    /// Requests served at once; more are answered 503.
    pub max_connections: usize,
    /// Connections waiting for a request head (new or kept alive) beyond those; when all
    /// places are taken, the one that has waited longest is closed for a new one
    /// (`conn.rs`). Each costs a file descriptor: `RLIMIT_NOFILE` must leave room.
    pub max_waiting_connections: usize,
    /// How long a request head may take to arrive whole, from its first byte.
    pub header_timeout: Duration,
    /// How long a connection may send nothing (new, or kept alive between requests).
    pub idle_timeout: Duration,
    /// Larger request heads are answered 431 (at least 8 KiB).
    pub max_header_bytes: usize,
    /// Requests waiting for an outcome at once; more are answered 429.
    pub max_waiters: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            secret: None,
            max_body_bytes: 1024 * 1024,
            body_timeout: Duration::from_secs(10),
            wait_timeout: Duration::from_secs(120),
            max_connections: 512,
            max_waiting_connections: 2048,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_header_bytes: 16 * 1024,
            max_waiters: 256,
        }
    }
}

/// One source (repository) a webhook can sync.
#[derive(Clone)]
pub struct HookSource {
    /// `""`: the single `--repo` source.
    pub name: String,
    /// The identity of the repository it follows (`model::repo_identity`): pushes are
    /// routed by the repository they name.
    pub url: String,
    /// The branch it deploys: pushes to others are answered 202 and ignored.
    pub branch: String,
    pub requests: SyncRequests,
    /// The store handle of this source (its commits).
    pub store: Arc<Store>,
    /// Its webhook secret; `None`: `HttpOptions::secret`.
    pub secret: Option<WebhookSecret>,
    /// Its branch previews: a push to a branch they match wakes their poll at once.
    pub previews: Option<PreviewWake>,
}

/// What a webhook push to a previewed branch wakes: the source's previews task.
#[derive(Clone)]
pub struct PreviewWake {
    pub rules: crate::model::previews::PreviewRules,
    /// Notified once per such push; the previews task polls at once (a push during a poll
    /// makes the next one start right after it).
    pub wake: Arc<tokio::sync::Notify>,
}

impl HookSource {
    /// The single `--repo` source deploying `branch`.
    pub fn single(store: Arc<Store>, requests: SyncRequests, branch: &str) -> HookSource {
        HookSource {
            name: String::new(),
            url: String::new(),
            branch: branch.to_owned(),
            requests,
            store,
            secret: None,
            previews: None,
        }
    }
}

/// What the handlers share.
pub struct HttpCtx {
    pub store: Arc<Store>,
    /// The sources a webhook can sync (at least one).
    pub sources: Vec<HookSource>,
    pub metrics: Arc<Metrics>,
    pub options: HttpOptions,
    /// Told each image repository a registry notification says was pushed to
    /// (`POST /hooks/registry`): the agent's image scanner; `None`: not running.
    pub on_registry_push: Option<RegistryPushed>,
    /// The containers' output (`logs.rs`); `None`: the log routes answer 503.
    pub logs: Option<Arc<dyn logs::LogSource>>,
}

/// What `POST /hooks/registry` tells of a pushed repository.
pub type RegistryPushed = Arc<dyn Fn(&str) + Send + Sync>;

/// Handler state: the context plus the limits and the shutdown signal waiting requests
/// honour.
struct AppState {
    ctx: HttpCtx,
    /// Off loopback, reads other than `/healthz` need the secret as a bearer token.
    reads_need_token: bool,
    waiters: Arc<Semaphore>,
    shutdown: CancellationToken,
    /// The dashboard's live streams running at once.
    streams: Arc<Semaphore>,
    /// Ready replicas of each resource's current rollout, for the dashboard's plot.
    samples: Arc<dashboard::live::RolloutSamples>,
    /// The log streams running at once.
    log_clients: Arc<Semaphore>,
}

/// True when serving `address` without a webhook secret is allowed: only loopback, where
/// nobody off the host can ask for a sync.
pub(crate) fn may_listen_without_secret(address: &SocketAddr) -> bool {
    address.ip().is_loopback()
}

/// Refuses to serve off loopback without a secret, then binds `address`.
pub async fn bind(address: SocketAddr, options: &HttpOptions) -> Result<TcpListener> {
    if options.secret.is_none() && !may_listen_without_secret(&address) {
        return Err(Error::InsecureListen { address });
    }
    TcpListener::bind(address)
        .await
        .map_err(|source| Error::Bind { address, source })
}

/// Serves the routes on `listener` until `shutdown`; then stops accepting, answers waiting
/// requests with 503 and lets in-flight ones finish.
pub async fn serve(
    listener: TcpListener,
    ctx: HttpCtx,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let reads_need_token = !listener.local_addr()?.ip().is_loopback();
    let options = ctx.options.clone();
    let samples = Arc::new(dashboard::live::RolloutSamples::default());
    let sampler = dashboard::live::sample(ctx.store.clone(), samples.clone(), shutdown.clone());
    let state = Arc::new(AppState {
        waiters: Arc::new(Semaphore::new(ctx.options.max_waiters.max(1))),
        reads_need_token,
        ctx,
        shutdown: shutdown.clone(),
        streams: Arc::new(Semaphore::new(dashboard::live::MAX_STREAMS)),
        samples,
        log_clients: Arc::new(Semaphore::new(logs::MAX_CLIENTS)),
    });
    tokio::join!(
        conn::serve(listener, router(state), &options, shutdown),
        sampler
    );
    Ok(())
}

fn router(state: Arc<AppState>) -> Router {
    let reads = Router::new()
        .route("/status", get(status::status))
        .route("/activity", get(activity::activity))
        .route("/releases/{scope}/{name}", get(status::releases))
        .route("/metrics", get(metrics::metrics))
        .merge(dashboard::routes())
        .merge(logs::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    Router::new()
        .route("/hooks/git", post(webhook::hook))
        .route("/hooks/registry", post(registry::hook))
        .merge(rollouts::routes())
        .route("/healthz", get(status::healthz))
        .route("/", get(dashboard::root))
        .merge(reads)
        .with_state(state)
}

/// Puts the headers every answer carries, of the dashboard and the API alike, on one
/// answer: a strict Content-Security-Policy (no inline script or style, nothing from another
/// origin), `nosniff`, no framing, no referrer, and `no-store` unless the handler chose a
/// cache policy. `conn` calls it on every answer a connection sends (a route's, an
/// extractor's rejection, the 404 fallback, the 503 of a full server), so no handler can
/// forget it.
pub(crate) fn secure_headers(headers: &mut axum::http::HeaderMap) {
    use axum::http::{HeaderValue, header};
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(dashboard::CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
}
