//! The HTTP side under hostile clients (issue 10, item 5 and the auth of item 9): 1,000
//! slowloris connections on loopback while `/healthz` and the webhook keep answering, each
//! well before a slow client could have been timed out to make room; idle and kept-alive idle
//! connections closed by the server; oversize heads refused; `/status`, `/releases` and
//! `/metrics` need the bearer token off loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use voodu_agent::http::{HttpOptions, WebhookSecret};

use crate::support::TestResult;
use crate::support::http::TestRouter;

/// Sends `request` on a new connection and reads the answer to its end; fails unless it all
/// takes less than 1 s.
async fn exchange(address: SocketAddr, request: &str) -> TestResult<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(address).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        TestResult::Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .map_err(|_| format!("no answer within 1 s to {request:?}"))?
}

/// The status line of an answer.
fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or_default()
}

/// A slowloris client: opens a connection, starts a request and sends one header line every
/// 500 ms, never finishing the head; opens a new connection whenever the server closes it.
async fn slowloris(address: SocketAddr, connected: Arc<AtomicUsize>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let Ok(mut stream) = TcpStream::connect(address).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        connected.fetch_add(1, Ordering::Relaxed);
        let mut line: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: slow\r\n";
        loop {
            if stream.write_all(line).await.is_err() {
                break;
            }
            line = b"X-Slow: 1\r\n";
            let mut byte = [0_u8; 1];
            tokio::select! {
                () = stop.cancelled() => return,
                // The server closed (EOF or reset) or answered: start over.
                _ = stream.read(&mut byte) => break,
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }
}

/// One request on a new connection from a plain OS thread (never the test's runtime, which
/// the thousand slow clients keep busy): the answer and how long it took, or an error once
/// `within` has passed without the whole answer.
fn timed_exchange(
    address: SocketAddr,
    request: &str,
    within: Duration,
) -> TestResult<(String, Duration)> {
    use std::io::{Read as _, Write as _};
    let started = std::time::Instant::now();
    let mut stream = std::net::TcpStream::connect_timeout(&address, within)?;
    stream.set_write_timeout(Some(within))?;
    stream.write_all(request.as_bytes())?;
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 4096];
    loop {
        let left = within
            .checked_sub(started.elapsed())
            .filter(|left| !left.is_zero())
            .ok_or_else(|| format!("no whole answer within {within:?} to {request:?}"))?;
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!("no whole answer within {within:?} to {request:?}").into());
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok((
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    ))
}

/// Twelve seconds of probing (three header timeouts) under a thousand clients: run by
/// scripts/test.
///
/// What it tells apart: a server that lets slow clients take the places requests need answers
/// a probe only once one of them is timed out (`header_timeout`, 4 s here) or evicted; a sound
/// one answers at once. The bound per probe is half the header timeout, so a loaded CI machine
/// (the suite runs Docker tests beside this one on two cores) does not fail it, while the
/// starvation it guards against still does. The probes run on their own thread so that the
/// time measured is the server's, not the scheduling of the test's own busy runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: 1,000 slow clients for 12 s; scripts/test runs it (cargo test -- --include-ignored)"]
async fn healthz_and_the_webhook_answer_before_any_slow_client_could_be_evicted_under_1000()
-> TestResult {
    let header_timeout = Duration::from_secs(4);
    let server = TestRouter::start(
        "127.0.0.1:0",
        HttpOptions {
            header_timeout,
            idle_timeout: header_timeout,
            max_connections: 128,
            ..HttpOptions::default()
        },
    )
    .await?;
    let address = server.address;
    let stop = CancellationToken::new();
    let _stop_on_drop = stop.clone().drop_guard();
    let connected = Arc::new(AtomicUsize::new(0));
    for _ in 0..1000 {
        tokio::spawn(slowloris(address, connected.clone(), stop.clone()));
    }
    tokio::time::timeout(Duration::from_secs(30), async {
        while connected.load(Ordering::Relaxed) < 1000 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .map_err(|_| "1,000 slow clients did not get connected within 30 s")?;

    // Probe for longer than the header timeout, so slow clients are timed out, evicted and
    // back again meanwhile; every probe must be answered before a slow client could have
    // been timed out to make room for it.
    let bound = header_timeout / 2;
    let probing = tokio::task::spawn_blocking(move || -> TestResult<Vec<Duration>> {
        let started = std::time::Instant::now();
        let mut latencies = Vec::new();
        while started.elapsed() < header_timeout * 3 {
            let (health, took) = timed_exchange(
                address,
                "GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n",
                bound,
            )?;
            assert_eq!(status_line(&health), "HTTP/1.1 200 OK", "{health}");
            latencies.push(took);
            let (hook, took) = timed_exchange(
                address,
                "POST /hooks/git HTTP/1.1\r\nHost: probe\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                bound,
            )?;
            assert_eq!(status_line(&hook), "HTTP/1.1 202 Accepted", "{hook}");
            latencies.push(took);
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(latencies)
    });
    let mut latencies = probing.await??;
    latencies.sort();
    let n_probes = latencies.len();
    assert!(n_probes > 20, "only {n_probes} probes");
    eprintln!(
        "slow clients: {n_probes} probes answered, median {:?}, max {:?} (bound {bound:?})",
        latencies[n_probes / 2],
        latencies[n_probes - 1]
    );
    let n_connections = connected.load(Ordering::Relaxed);
    assert!(n_connections > 1000, "{n_connections} slow connections");
    Ok(())
}

/// Reads until the server closes the connection; fails unless it does within `within`.
async fn closed_by_server(stream: &mut TcpStream, within: Duration) -> TestResult<String> {
    let mut answer = Vec::new();
    match tokio::time::timeout(within, stream.read_to_end(&mut answer)).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) if error.kind() == std::io::ErrorKind::ConnectionReset => {}
        Ok(Err(error)) => return Err(error.into()),
        Err(_) => return Err(format!("connection still open after {within:?}").into()),
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test]
async fn idle_connections_are_closed_and_oversize_heads_refused() -> TestResult {
    let timeout = Duration::from_millis(150);
    let server = TestRouter::start(
        "127.0.0.1:0",
        HttpOptions {
            header_timeout: timeout,
            idle_timeout: timeout,
            max_header_bytes: 8192,
            ..HttpOptions::default()
        },
    )
    .await?;
    // Bound: the configured timeout plus slack for a loaded machine.
    let within = timeout + Duration::from_secs(5);

    // Sends nothing at all.
    let mut silent = TcpStream::connect(server.address).await?;
    assert_eq!(closed_by_server(&mut silent, within).await?, "");

    // Starts a head and never finishes it.
    let mut partial = TcpStream::connect(server.address).await?;
    partial.write_all(b"GET /healthz HTTP/1.1\r\n").await?;
    closed_by_server(&mut partial, within).await?;

    // One request kept alive, then idle.
    let mut kept = TcpStream::connect(server.address).await?;
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await?;
    let answer = closed_by_server(&mut kept, within).await?;
    assert_eq!(status_line(&answer), "HTTP/1.1 200 OK", "{answer}");

    // A head larger than the cap.
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(20_000)
    );
    let answer = exchange(server.address, &big).await?;
    assert_eq!(
        status_line(&answer),
        "HTTP/1.1 431 Request Header Fields Too Large",
        "{answer}"
    );
    Ok(())
}

/// nginx's split: a connection that has sent nothing is idle (`idle_timeout`), as the spare
/// connections HTTP clients keep in their pools are; once a head starts, it must be whole
/// within `header_timeout`. (Closing pooled spares after the header timeout made a client's
/// next request on one fail with "connection reset".)
#[tokio::test]
async fn a_silent_connection_is_idle_and_a_started_head_must_finish_in_time() -> TestResult {
    let header_timeout = Duration::from_millis(100);
    let idle_timeout = Duration::from_secs(20);
    let server = TestRouter::start(
        "127.0.0.1:0",
        HttpOptions {
            header_timeout,
            idle_timeout,
            ..HttpOptions::default()
        },
    )
    .await?;

    // Silent for three header timeouts, then a whole request: answered.
    let mut spare = TcpStream::connect(server.address).await?;
    tokio::time::sleep(header_timeout * 3).await;
    spare
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await?;
    let answer = closed_by_server(&mut spare, Duration::from_secs(5)).await?;
    assert_eq!(status_line(&answer), "HTTP/1.1 200 OK", "{answer}");

    // A head started and never finished: closed long before the idle timeout.
    let mut partial = TcpStream::connect(server.address).await?;
    partial.write_all(b"GET /healthz HTTP/1.1\r\n").await?;
    let started = std::time::Instant::now();
    closed_by_server(&mut partial, Duration::from_secs(5)).await?;
    assert!(
        started.elapsed() < idle_timeout / 2,
        "a started head was kept {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn a_new_connection_evicts_the_longest_waiting_when_all_places_are_taken() -> TestResult {
    let server = TestRouter::start(
        "127.0.0.1:0",
        HttpOptions {
            max_connections: 2,
            max_waiting_connections: 2,
            ..HttpOptions::default()
        },
    )
    .await?;
    // Four silent connections take every place (2 + 2), accepted in the order they
    // connected (the kernel's accept queue is first in, first out).
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(server.address).await?);
    }
    // The probe takes the oldest one's place and is answered at once.
    let health = exchange(
        server.address,
        "GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n",
    )
    .await?;
    assert_eq!(status_line(&health), "HTTP/1.1 200 OK", "{health}");
    // The first silent connection was closed for it (long before the 10 s header timeout).
    let oldest = silent.first_mut().ok_or("no connection")?;
    assert_eq!(closed_by_server(oldest, Duration::from_secs(5)).await?, "");
    Ok(())
}

const SECRET: &str = "status-token-secret";

/// `(listen address, path, Authorization value) → status code`, one server per listen
/// address.
async fn check_auth(cases: &[(&str, &str, Option<&str>, &str)]) -> TestResult {
    let mut servers = std::collections::BTreeMap::new();
    for (listen, path, authorization, expected) in cases {
        let server = match servers.entry(*listen) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => entry.insert(
                TestRouter::start(
                    listen,
                    HttpOptions {
                        secret: Some(WebhookSecret::new(SECRET)),
                        ..HttpOptions::default()
                    },
                )
                .await?,
            ),
        };
        let authorization = authorization
            .map(|value| format!("Authorization: {value}\r\n"))
            .unwrap_or_default();
        let answer = exchange(
            server.address,
            &format!("GET {path} HTTP/1.1\r\nHost: t\r\n{authorization}Connection: close\r\n\r\n"),
        )
        .await?;
        assert_eq!(
            status_line(&answer),
            *expected,
            "{listen} {path} {authorization}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn status_releases_and_metrics_need_the_token_off_loopback() -> TestResult {
    let bearer = format!("Bearer {SECRET}");
    let ok = "HTTP/1.1 200 OK";
    let unauthorized = "HTTP/1.1 401 Unauthorized";
    let not_found = "HTTP/1.1 404 Not Found";
    check_auth(&[
        ("0.0.0.0:0", "/healthz", None, ok),
        ("0.0.0.0:0", "/status", None, unauthorized),
        ("0.0.0.0:0", "/status", Some("Bearer wrong"), unauthorized),
        (
            "0.0.0.0:0",
            "/status",
            Some(&format!("Basic {SECRET}")),
            unauthorized,
        ),
        ("0.0.0.0:0", "/status", Some(&bearer), ok),
        ("0.0.0.0:0", "/metrics", None, unauthorized),
        ("0.0.0.0:0", "/metrics", Some(&bearer), ok),
        ("0.0.0.0:0", "/releases/shop/web", None, unauthorized),
        // Past the check: no such resource.
        ("0.0.0.0:0", "/releases/shop/web", Some(&bearer), not_found),
        ("127.0.0.1:0", "/status", None, ok),
        ("127.0.0.1:0", "/metrics", None, ok),
        ("127.0.0.1:0", "/releases/shop/web", None, not_found),
    ])
    .await
}
