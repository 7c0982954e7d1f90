//! HTTP helpers: `TestRouter` (the HTTP side alone), a client for the agent's routes, a parser
//! of the Prometheus text format (so `/metrics` is read the way a scraper reads it), and
//! `flood`, which sends signed webhooks.

use std::collections::BTreeMap;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use voodu_agent::git::trigger::{self, SyncRequestReceiver, SyncRequests};
use voodu_agent::http::logs::LogSource;
use voodu_agent::http::{HookSource, HttpCtx, HttpOptions};
use voodu_agent::metrics::Metrics;
use voodu_agent::store::Store;

use super::TestResult;

/// The router alone on `listen` (port 0), over a temp store, with a trigger channel whose
/// receiver the test holds (no sync loop runs). It runs on a runtime and threads of its own,
/// as in the agent, so the test's client tasks cannot starve it; it stops on drop.
pub struct TestRouter {
    _dir: tempfile::TempDir,
    /// Where the test connects (loopback, also for a wildcard listener).
    pub address: SocketAddr,
    pub receiver: SyncRequestReceiver,
    pub requests: SyncRequests,
    pub metrics: Arc<Metrics>,
    /// The router's state.db.
    pub store: Arc<Store>,
    shutdown: CancellationToken,
}

impl TestRouter {
    pub async fn start(listen: &str, options: HttpOptions) -> TestResult<TestRouter> {
        Self::start_with_logs(listen, options, |_| None).await
    }

    /// `start`, serving logs from what `logs` makes of the router's store.
    pub async fn start_with_logs(
        listen: &str,
        options: HttpOptions,
        logs: impl FnOnce(Arc<Store>) -> Option<Arc<dyn LogSource>>,
    ) -> TestResult<TestRouter> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(Store::open(&dir.path().join("state.db"))?);
        let (requests, receiver) = trigger::channel();
        let metrics = Arc::new(Metrics::new());
        let listen: SocketAddr = listen.parse()?;
        let shutdown = CancellationToken::new();
        let (bound, port) = std::sync::mpsc::channel();
        let ctx = HttpCtx {
            store: store.clone(),
            sources: vec![HookSource::single(store.clone(), requests.clone(), "main")],
            metrics: metrics.clone(),
            options,
            on_registry_push: None,
            logs: logs(store.clone()),
        };
        let server_shutdown = shutdown.clone();
        let thread = std::thread::spawn(move || -> TestResult {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = voodu_agent::http::bind(listen, &ctx.options).await?;
                bound.send(listener.local_addr()?.port())?;
                voodu_agent::http::serve(listener, ctx, server_shutdown).await?;
                TestResult::Ok(())
            })
        });
        let port = match tokio::task::spawn_blocking(move || port.recv()).await? {
            Ok(port) => port,
            Err(_) => {
                let outcome = thread.join().map_err(|_| "the server thread panicked")?;
                return Err(format!("the server did not start: {outcome:?}").into());
            }
        };
        Ok(TestRouter {
            _dir: dir,
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            receiver,
            requests,
            metrics,
            store,
            shutdown,
        })
    }

    /// The webhook's URL.
    pub fn hook(&self) -> String {
        format!("http://{}/hooks/git", self.address)
    }

    /// True when a request asked for a fetch since the last call (the fetch is then marked
    /// started and finished, so the next call sees only newer requests). Exact without
    /// waiting: the webhook records its request before it answers, and the test has read
    /// every answer by then.
    pub fn fetch_requested(&mut self) -> bool {
        match self.receiver.try_next() {
            Some(generation) => {
                self.receiver
                    .finish(generation, Err("test: no real fetch".into()));
                true
            }
            None => false,
        }
    }
}

impl Drop for TestRouter {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A reqwest client on the process's shared TLS configuration, as the agent's.
pub fn client() -> TestResult<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .tls_backend_preconfigured(voodu_agent::model::tls::client_config()?)
        .build()?)
}

/// `GET url` → status and body.
pub async fn get(client: &reqwest::Client, url: &str) -> TestResult<(u16, String)> {
    let response = client.get(url).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

/// `POST url` with headers and body → status and JSON body.
pub async fn post(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> TestResult<(u16, serde_json::Value)> {
    let mut request = client.post(url).body(body);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let bytes = response.bytes().await?;
    Ok((status, serde_json::from_slice(&bytes)?))
}

/// A GitHub push payload for `sha` on `branch`.
pub fn push_body(branch: &str, sha: &str) -> Vec<u8> {
    format!(
        r#"{{"ref":"refs/heads/{branch}","before":"{}","after":"{sha}"}}"#,
        "0".repeat(40)
    )
    .into_bytes()
}

/// One sample of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses a text exposition: every sample must belong to a family declared by a `# TYPE`
/// line before it (histogram samples by their `_bucket`/`_sum`/`_count` suffix), and label
/// values are unescaped.
pub fn parse_metrics(text: &str) -> TestResult<Vec<Sample>> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = Vec::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or("TYPE without a kind")?;
            types.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').ok_or("sample without a value")?;
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (
                name,
                parse_labels(rest.strip_suffix('}').ok_or("unclosed labels")?)?,
            ),
            None => (series, BTreeMap::new()),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|family| types.get(*family).is_some_and(|kind| kind == "histogram"))
            })
            .unwrap_or(name);
        if !types.contains_key(family) {
            return Err(format!("sample {name} has no # TYPE line before it").into());
        }
        let value = match value {
            "+Inf" => f64::INFINITY,
            other => other.parse()?,
        };
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    Ok(samples)
}

fn parse_labels(text: &str) -> TestResult<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    while chars.peek().is_some() {
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next() != Some('"') {
            return Err(format!("label {name} value is not quoted").into());
        }
        let mut value = String::new();
        loop {
            match chars.next().ok_or("unterminated label value")? {
                '"' => break,
                '\\' => match chars.next().ok_or("dangling escape")? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                other => value.push(other),
            }
        }
        labels.insert(name, value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Ok(labels)
}

/// The value of the sample `name` whose labels include every `(key, value)` of `labels`,
/// summed when several match; 0 when none does.
pub fn metric(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|sample| {
            sample.name == name
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(*value))
        })
        .map(|sample| sample.value)
        .sum()
}

/// A memory figure of process `pid` from `/proc/<pid>/status` (Linux), in bytes: `VmRSS`
/// (resident now) or `VmHWM` (peak resident).
pub fn memory_of(pid: u32, field: &str) -> TestResult<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|line| line.starts_with(&format!("{field}:")))
        .ok_or_else(|| format!("no {field} line"))?;
    let kib: u64 = line.split_whitespace().nth(1).ok_or("no value")?.parse()?;
    Ok(kib * 1024)
}

/// `GET path` from `address` over a plain socket (HTTP/1.0, for tests without a runtime) →
/// status and body.
pub fn get_blocking(address: &str, path: &str) -> TestResult<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("no end of headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .ok_or("no status code")?
        .parse()?;
    Ok((status, body.to_owned()))
}

/// One request a `Capture` received.
#[derive(Debug, Clone)]
pub struct Captured {
    pub method: String,
    pub path: String,
    /// Header names lower-cased.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// A plain HTTP/1.1 server on loopback that answers every request `200` and keeps it: the
/// receiving end of `on_deploy` webhooks. Serves until the test process ends.
pub struct Capture {
    pub address: std::net::SocketAddr,
    received: std::sync::Arc<std::sync::Mutex<Vec<Captured>>>,
    /// The status every request is answered with (200 unless a test sets it).
    answer: std::sync::Arc<std::sync::atomic::AtomicU16>,
    refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Capture {
    pub fn start() -> TestResult<Capture> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let answer = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(200));
        let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (keep, answer_with, count_refused) =
            (received.clone(), answer.clone(), refused.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let status = answer_with.load(std::sync::atomic::Ordering::SeqCst);
                // Kept before it is answered: a client that got its answer finds its request
                // in `received`. A refused one is only counted.
                let _ = read_request_answering(stream, status, |request| {
                    if status < 300 {
                        keep.lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(request);
                    } else {
                        count_refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
        });
        Ok(Capture {
            address,
            received,
            answer,
            refused,
        })
    }

    /// Answers every later request with `status` (a receiver that is down: 503).
    pub fn answer_with(&self, status: u16) {
        self.answer
            .store(status, std::sync::atomic::Ordering::SeqCst);
    }

    /// Requests answered with a status of 300 or more.
    pub fn refused(&self) -> usize {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Every request received so far, in arrival order.
    pub fn received(&self) -> Vec<Captured> {
        self.received
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The request line and headers of one HTTP/1.1 request (header names lower-cased).
pub struct RequestHead {
    pub method: String,
    pub target: String,
    pub headers: BTreeMap<String, String>,
}

/// Reads one request's line and headers; `None` when the client closed the connection.
pub fn read_request_head(reader: &mut impl std::io::BufRead) -> TestResult<Option<RequestHead>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Ok(None);
    };
    let (method, target) = (method.to_owned(), target.to_owned());
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_lowercase(), value.trim().to_owned());
        }
    }
    Ok(Some(RequestHead {
        method,
        target,
        headers,
    }))
}

/// Reads the body `head`'s `Content-Length` announces.
pub fn read_body(reader: &mut impl std::io::Read, head: &RequestHead) -> TestResult<Vec<u8>> {
    let length: usize = head
        .headers
        .get("content-length")
        .map_or(Ok(0), |value| value.parse())?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(body)
}

/// Reads one request, hands it to `keep`, then answers it `200`.
fn read_request_answering(
    mut stream: std::net::TcpStream,
    status: u16,
    keep: impl FnOnce(Captured),
) -> TestResult {
    use std::io::Write as _;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let mut reader = std::io::BufReader::new(stream.try_clone()?);
    let head = read_request_head(&mut reader)?.ok_or("no request")?;
    let body = read_body(&mut reader, &head)?;
    keep(Captured {
        method: head.method,
        path: head.target,
        headers: head.headers,
        body: String::from_utf8(body)?,
    });
    stream.write_all(
        format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    Ok(())
}

/// Sends `count` GitHub-signed pushes (each padded to 16 KiB), naming `shas` in turn, 200 at
/// a time; returns how many were answered 202, or the first other answer.
pub async fn flood(
    client: &reqwest::Client,
    hook: &str,
    secret: &voodu_agent::http::WebhookSecret,
    shas: &[String],
    count: usize,
) -> TestResult<usize> {
    let padding = "x".repeat(16 * 1024);
    let padding = &padding;
    use futures_util::StreamExt as _;
    futures_util::stream::iter(0..count)
        .map(|index| {
            let sha = &shas[index % shas.len()];
            async move {
                let body =
                    format!(r#"{{"ref":"refs/heads/main","after":"{sha}","padding":"{padding}"}}"#)
                        .into_bytes();
                let headers = vec![
                    ("x-github-event", "push".to_owned()),
                    ("x-hub-signature-256", secret.sign(&body)),
                ];
                post(client, hook, &headers, body).await
            }
        })
        .buffer_unordered(200)
        .fold(Ok::<_, String>(0usize), |count, answer| async move {
            let count = count?;
            match answer {
                Ok((202, _)) => Ok(count + 1),
                Ok((status, body)) => Err(format!("HTTP {status}: {body}")),
                Err(error) => Err(format!("{error:?}")),
            }
        })
        .await
        .map_err(Into::into)
}
