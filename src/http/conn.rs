//! The accept loop and the life of one connection, built so that slow or idle clients cannot
//! keep anyone else out (slowloris).
//!
//! A connection is *waiting* from the moment it is accepted until hyper has parsed a whole
//! request head, and again from the moment its answer is ready until the next head. As in
//! nginx (`keepalive_timeout`, `client_header_timeout`), a waiting connection that has sent
//! nothing is idle and may stay `idle_timeout`; once the first byte of a head arrives, the
//! whole head must follow within `header_timeout`. A waiting connection is closed when its
//! time is up. (HTTP clients open spare connections they keep unused in their pools: closing
//! those after the short header timeout would make the clients' next requests on them fail.) A head larger than
//! `max_header_bytes` is answered 431 by hyper.
//!
//! Invariants: a waiting connection holds no serving slot: at most `max_connections`
//! requests are served at once (more are answered 503), and slow clients only ever take
//! places among the `max_connections + max_waiting_connections` open connections; the accept
//! loop never waits, so the kernel's accept queue never fills up behind a full server; when
//! every place is taken, a new connection evicts the connection that has been waiting
//! longest (as nginx reuses kept-alive connections when it runs short), and only when none
//! is waiting, because every place is serving a request, is the new one answered 503 and
//! closed at once. Evicted connections are dropped by their task at its next poll. A write
//! the client takes no byte of for `WRITE_STALL` fails and closes the connection, so an
//! answer read slowly (a streamed log) never keeps its buffers and task for long.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::HttpOptions;

/// What a refused connection reads before it is closed.
const BUSY_ANSWER: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Accepts connections on `listener` and serves `router` on each until `shutdown`; then
/// stops accepting, closes idle connections and waits for in-flight requests.
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    options: &HttpOptions,
    shutdown: CancellationToken,
) {
    let limits = Limits::from(options);
    let waiting = Arc::new(Waiting::default());
    let serving = Arc::new(Semaphore::new(limits.max_serving));
    let tracker = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "accepting an HTTP connection failed");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    () = shutdown.cancelled() => break,
                }
            }
        };
        // Answers are small; do not let Nagle hold them back.
        let _ = stream.set_nodelay(true);
        let slot = Arc::new(Slot::new(limits));
        if !waiting.admit(&slot, limits.max_open) {
            // Every slot is serving a request: say so and close, rather than leave the
            // client in the kernel's queue.
            let _ = stream.try_write(BUSY_ANSWER);
            tracing::debug!("http connection refused: every slot is serving a request");
            continue;
        }
        tracker.spawn(connection(
            stream,
            slot,
            waiting.clone(),
            serving.clone(),
            router.clone(),
            limits,
            shutdown.clone(),
        ));
    }
    tracker.close();
    tracker.wait().await;
}

/// The limits of `HttpOptions` a connection needs.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_serving: usize,
    max_open: usize,
    header_timeout: Duration,
    idle_timeout: Duration,
    max_header_bytes: usize,
}

impl From<&HttpOptions> for Limits {
    fn from(options: &HttpOptions) -> Limits {
        Limits {
            max_serving: options.max_connections.max(1),
            max_open: options
                .max_connections
                .max(1)
                .saturating_add(options.max_waiting_connections.max(1)),
            header_timeout: options.header_timeout,
            idle_timeout: options.idle_timeout,
            // hyper's read buffer cannot be smaller than 8 KiB.
            max_header_bytes: options.max_header_bytes.max(8192),
        }
    }
}

/// Serves one admitted connection: runs hyper on it under the waiting-time watchdog.
async fn connection(
    stream: TcpStream,
    slot: Arc<Slot>,
    waiting: Arc<Waiting>,
    serving: Arc<Semaphore>,
    router: Router,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let _leave = Leave {
        waiting: &waiting,
        slot: &slot,
    };
    let service = {
        let router = TowerToHyperService::new(router);
        let slot = slot.clone();
        let waiting = waiting.clone();
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            waiting.leave(&slot);
            let permit = serving.clone().try_acquire_owned().ok();
            let answer = permit
                .is_some()
                .then(|| hyper::service::Service::call(&router, request));
            let slot = slot.clone();
            let waiting = waiting.clone();
            async move {
                let mut response: Result<_, Infallible> = match answer {
                    Some(answer) => answer.await,
                    None => Ok(busy()),
                };
                if let Ok(response) = &mut response {
                    super::secure_headers(response.headers_mut());
                }
                drop(permit);
                waiting.enter(&slot);
                response
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // hyper also runs this timer while a kept-alive connection is idle; the watchdog
        // below applies `header_timeout` and `idle_timeout` each where it belongs.
        .header_read_timeout(limits.header_timeout.max(limits.idle_timeout))
        .max_buf_size(limits.max_header_bytes)
        .keep_alive(true);
    let stream = Watched {
        stream,
        slot: slot.clone(),
        stall: None,
    };
    let served = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(served);
    let mut stopping = false;
    loop {
        let deadline = slot.deadline();
        tokio::select! {
            result = served.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "http connection ended with an error");
                }
                return;
            }
            () = sleep_until(deadline) => {
                if slot.deadline().is_some_and(|deadline| deadline <= Instant::now()) {
                    tracing::debug!("http connection closed: no request in time");
                    return;
                }
            }
            () = slot.changed.notified() => {}
            () = slot.evicted.cancelled() => {
                tracing::debug!("http connection evicted for a new one");
                return;
            }
            () = shutdown.cancelled(), if !stopping => {
                stopping = true;
                served.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The answer when every serving slot is taken.
fn busy() -> axum::response::Response {
    use axum::response::IntoResponse as _;
    (
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "every request slot is taken; try again\n",
    )
        .into_response()
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// One connection as the watchdog and the eviction see it.
struct Slot {
    limits: Limits,
    state: Mutex<SlotState>,
    /// Woken when the deadline changes.
    changed: Notify,
    evicted: CancellationToken,
    /// Set while the connection waits and has sent nothing: its next byte starts a head.
    idle: AtomicBool,
}

#[derive(Debug, Default)]
struct SlotState {
    /// When waiting: its key in `Waiting` and the time it must be served by.
    waiting: Option<(u64, Instant)>,
}

impl Slot {
    fn new(limits: Limits) -> Slot {
        Slot {
            limits,
            state: Mutex::new(SlotState::default()),
            changed: Notify::new(),
            evicted: CancellationToken::new(),
            idle: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        crate::base::lock(&self.state)
    }

    fn deadline(&self) -> Option<Instant> {
        self.lock().waiting.map(|(_, deadline)| deadline)
    }

    /// The first bytes of a head arrived on an idle connection: the rest must follow within
    /// `header_timeout` (or the idle deadline, if sooner).
    fn head_started(&self) {
        if !self.idle.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut state = self.lock();
        if let Some((key, deadline)) = state.waiting {
            let by = Instant::now() + self.limits.header_timeout;
            state.waiting = Some((key, deadline.min(by)));
        }
        drop(state);
        self.changed.notify_one();
    }
}

/// A write that has waited this long for the client to take bytes closes the connection: a
/// client reading an answer (a log stream) slower than it is written is cut, not waited for.
const WRITE_STALL: Duration = Duration::from_secs(15);

/// The connection's stream, telling its slot when a head starts to arrive, and failing a
/// write that stalls for [`WRITE_STALL`].
struct Watched {
    stream: TcpStream,
    slot: Arc<Slot>,
    /// Set while a write waits for the client.
    stall: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Watched {
    /// `polled` (a write's outcome) as it stands, or a time-out once writes have waited
    /// [`WRITE_STALL`].
    fn watch_stall<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        if polled.is_ready() {
            self.stall = None;
            return polled;
        }
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL)));
        if stall.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client takes no bytes",
            )));
        }
        polled
    }
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.slot.head_started();
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_write(cx, data);
        self.watch_stall(cx, polled)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, data);
        self.watch_stall(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The waiting connections, the longest-waiting first.
#[derive(Default)]
struct Waiting {
    inner: Mutex<WaitingInner>,
}

#[derive(Default)]
struct WaitingInner {
    /// Open connections not evicted.
    n_open: usize,
    next_key: u64,
    slots: BTreeMap<u64, Arc<Slot>>,
}

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, WaitingInner> {
        crate::base::lock(&self.inner)
    }

    /// Counts a new connection in, evicting the longest-waiting one when `max_open` are
    /// open; false when none can be evicted (the new one is then refused).
    fn admit(&self, slot: &Arc<Slot>, max_open: usize) -> bool {
        let mut inner = self.lock();
        if inner.n_open < max_open {
            inner.n_open += 1;
        } else {
            // The evicted connection's place goes to the new one: `n_open` stays.
            let Some((_, evicted)) = inner.slots.pop_first() else {
                return false;
            };
            evicted.lock().waiting = None;
            evicted.evicted.cancel();
        }
        Self::enter_locked(&mut inner, slot);
        true
    }

    /// `slot` starts waiting for a request head.
    fn enter(&self, slot: &Arc<Slot>) {
        let mut inner = self.lock();
        Self::enter_locked(&mut inner, slot);
    }

    fn enter_locked(inner: &mut WaitingInner, slot: &Arc<Slot>) {
        let key = inner.next_key;
        inner.next_key += 1;
        let mut state = slot.lock();
        if let Some((old_key, _)) = state.waiting.take() {
            inner.slots.remove(&old_key);
        }
        // Idle until a byte of the next head arrives (`Slot::head_started`).
        state.waiting = Some((key, Instant::now() + slot.limits.idle_timeout));
        slot.idle.store(true, Ordering::Release);
        drop(state);
        inner.slots.insert(key, slot.clone());
        slot.changed.notify_one();
    }

    /// `slot` is serving a request.
    fn leave(&self, slot: &Slot) {
        slot.idle.store(false, Ordering::Release);
        let mut inner = self.lock();
        if let Some((key, _)) = slot.lock().waiting.take() {
            inner.slots.remove(&key);
        }
        slot.changed.notify_one();
    }

    /// `slot`'s connection is closed; its place is free unless it was evicted (then the
    /// evicting connection has it already).
    fn close(&self, slot: &Slot) {
        let mut inner = self.lock();
        if let Some((key, _)) = slot.lock().waiting.take() {
            inner.slots.remove(&key);
        }
        if !slot.evicted.is_cancelled() {
            inner.n_open = inner.n_open.saturating_sub(1);
        }
    }
}

/// Takes a connection off the waiting list when its task ends, however it ends.
struct Leave<'a> {
    waiting: &'a Waiting,
    slot: &'a Slot,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.waiting.close(self.slot);
    }
}
