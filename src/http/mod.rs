//! HTTP side of the agent (axum): the git webhook, health, status, releases and metrics.
//!
//! Routes:
//! - `POST /hooks/git`: a push from GitHub, GitLab, Gitea/Forgejo or the generic HMAC form
//!   (`webhook.rs`) → a `SyncRequest`; `?wait=true` answers once the pushed commit was
//!   applied or rejected;
//! - `GET /healthz`, `GET /status` (the document `status --json` prints),
//!   `GET /releases/{scope}/{name}` (`status.rs`), `GET /metrics` (`metrics.rs`).
//!
//! Invariants: everything shown is read from the store (on blocking threads); the only thing
//! this module can make happen is a sync request; memory stays bounded under any request
//! rate: at most `max_connections` connections are served at once (more wait in the kernel's
//! accept queue), bodies are capped at `max_body_bytes` and read under a timeout, and at most
//! `max_waiters` requests wait for an outcome.

mod error;
mod metrics;
pub mod status;
pub mod webhook;

pub use error::{Error, Result};
pub use webhook::WebhookSecret;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::git::trigger::SyncRequests;
use crate::metrics::Metrics;
use crate::store::Store;

/// Tunables of the HTTP side.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The branch the agent deploys: pushes to others are answered 202 and ignored.
    pub branch: String,
    /// Webhook secret; without one, requests are not authenticated (loopback only).
    pub secret: Option<WebhookSecret>,
    /// Larger webhook bodies are refused with 413.
    pub max_body_bytes: usize,
    /// How long reading a body may take.
    pub body_timeout: Duration,
    /// `?wait=true` answers 504 after this long unless `?timeout=` asks for less.
    pub wait_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Requests waiting for an outcome at once; more are answered 429.
    pub max_waiters: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            branch: "main".to_owned(),
            secret: None,
            max_body_bytes: 1024 * 1024,
            body_timeout: Duration::from_secs(10),
            wait_timeout: Duration::from_secs(120),
            max_connections: 512,
            max_waiters: 256,
        }
    }
}

/// What the handlers share.
pub struct HttpCtx {
    pub store: Arc<Store>,
    pub requests: SyncRequests,
    pub metrics: Arc<Metrics>,
    pub options: HttpOptions,
}

/// Handler state: the context plus the limits and the shutdown signal waiting requests
/// honour.
struct AppState {
    ctx: HttpCtx,
    waiters: Arc<Semaphore>,
    shutdown: CancellationToken,
}

/// True when serving `address` without a webhook secret is allowed: only loopback, where
/// nobody off the host can ask for a sync.
pub fn may_listen_without_secret(address: &SocketAddr) -> bool {
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
    let connections = Arc::new(Semaphore::new(ctx.options.max_connections.max(1)));
    let state = Arc::new(AppState {
        waiters: Arc::new(Semaphore::new(ctx.options.max_waiters.max(1))),
        ctx,
        shutdown: shutdown.clone(),
    });
    let listener = LimitedListener {
        inner: listener,
        connections,
    };
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/hooks/git", post(webhook::hook))
        .route("/healthz", get(status::healthz))
        .route("/status", get(status::status))
        .route("/releases/{scope}/{name}", get(status::releases))
        .route("/metrics", get(metrics::metrics))
        .with_state(state)
}

/// Runs a blocking store read off the async threads.
async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> crate::store::Result<T> + Send + 'static,
) -> std::result::Result<T, String> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || f(&store)).await {
        Ok(result) => result.map_err(|error| error.to_string()),
        Err(join_error) => Err(format!("store task failed: {join_error}")),
    }
}

/// A TCP listener that serves at most `connections` connections at once: `accept` waits
/// for a free slot, and the slot is released when the connection closes.
struct LimitedListener {
    inner: TcpListener,
    connections: Arc<Semaphore>,
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let permit = self
            .connections
            .clone()
            .acquire_owned()
            .await
            .expect("the connection semaphore is never closed");
        loop {
            match self.inner.accept().await {
                Ok((stream, address)) => {
                    // Answers are small; do not let Nagle hold them back.
                    let _ = stream.set_nodelay(true);
                    return (
                        LimitedStream {
                            inner: stream,
                            _permit: permit,
                        },
                        address,
                    );
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection holding its slot of the connection limit.
struct LimitedStream {
    inner: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
