//! `url()` asset sources: fetched over HTTP(S) with a timeout and a size cap, cached by URL in
//! `<data-dir>/cache/` with voodu's ETag / Last-Modified revalidation (spec §7.15).
//!
//! The agent loads a commit's `url()` sources together (`load_fetching_urls`): a first pass
//! of the manifest stage notes them, they are fetched at most `MAX_PARALLEL_FETCHES` at a time
//! within one per-commit budget (`--url-budget`), and a second pass decodes with the results,
//! so the manifest stage never waits on the network and N slow keys cost one budget, not N
//! timeouts.
//!
//! Invariants: a body larger than the cap is refused, never truncated; a cached copy stands in
//! for a failed fetch only when the manifest allows stale content (`on_failure` other than
//! `error`); HTTP errors (status ≥ 400), refused destinations (`url_guard`) and a spent budget
//! never fall back to the cache. A key's timeout covers the whole request, body included, and
//! is cut to what is left of the budget. Blocking: call from a blocking thread (the sync task),
//! never from async code.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::url_guard::{ClientError, Guard, GuardedResolver, Refused, redirect_policy, refusal_in};
use super::write::write_atomic;
use crate::manifest::spec::sha256_hex;
use crate::manifest::{
    DecodeCache, Diagnostics, LoadOptions, Manifest, Mode, Policy, UrlError, UrlFetcher, UrlHosts,
    UrlRecorder, UrlRequest,
};
use crate::model::{BlobId, Snapshot};

/// Default cap on one `url()` body.
pub(crate) const DEFAULT_MAX_URL_BYTES: u64 = 8 * 1024 * 1024;

/// Default time all `url()` fetches of one commit may take together (`--url-budget`).
pub(crate) const DEFAULT_URL_BUDGET: Duration = Duration::from_secs(30);

/// The largest `--url-budget`: twice a single key's longest timeout.
pub(crate) const MAX_URL_BUDGET: Duration = Duration::from_secs(600);

/// Fetches of one commit that run at the same time.
pub(crate) const MAX_PARALLEL_FETCHES: usize = 4;

/// The `url()` fetcher with its on-disk cache.
pub(crate) struct UrlCache {
    dir: PathBuf,
    max_bytes: u64,
    guard: Arc<Guard>,
    client: OnceLock<Result<reqwest::blocking::Client, ClientError>>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Meta {
    #[serde(default)]
    etag: String,
    #[serde(default)]
    last_modified: String,
}

impl UrlCache {
    /// A cache in `<data_dir>/cache`.
    pub(crate) fn new(data_dir: &Path, max_bytes: u64) -> UrlCache {
        UrlCache {
            dir: data_dir.join("cache"),
            max_bytes,
            guard: Arc::new(Guard::default()),
            client: OnceLock::new(),
        }
    }

    /// This cache, fetching also from the internal hosts `hosts` allows (`--allow-url-host`)
    /// and never from `own_address`, the agent's HTTP side (`--listen`).
    pub(crate) fn guarded(
        self,
        hosts: UrlHosts,
        own_address: Option<std::net::SocketAddr>,
    ) -> UrlCache {
        UrlCache {
            guard: Arc::new(Guard {
                hosts,
                own_address,
                never_link_local: false,
            }),
            client: OnceLock::new(),
            ..self
        }
    }

    fn client(&self) -> Result<&reqwest::blocking::Client, ClientError> {
        self.client
            .get_or_init(|| {
                reqwest::blocking::Client::builder()
                    .tls_backend_preconfigured(ClientError::tls()?)
                    .user_agent(concat!("voodu-agent/", env!("CARGO_PKG_VERSION")))
                    .dns_resolver(Arc::new(GuardedResolver(Arc::clone(&self.guard))))
                    .redirect(redirect_policy(Arc::clone(&self.guard)))
                    .build()
                    .map_err(ClientError::build)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn paths(&self, url: &str) -> (PathBuf, PathBuf) {
        let key = sha256_hex(url.as_bytes());
        (
            self.dir.join(format!("{key}.bytes")),
            self.dir.join(format!("{key}.meta")),
        )
    }

    fn cached(&self, url: &str) -> Option<(Vec<u8>, Meta)> {
        let (bytes_path, meta_path) = self.paths(url);
        let bytes = std::fs::read(bytes_path).ok()?;
        let meta = std::fs::read(meta_path)
            .ok()
            .and_then(|text| serde_json::from_slice(&text).ok())
            .unwrap_or_default();
        Some((bytes, meta))
    }

    fn fetch_fresh(
        &self,
        url: &str,
        timeout: Duration,
        cached: Option<&Meta>,
    ) -> Result<Fresh, Failure> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|error| Failure::Http(format!("not a valid URL: {error}")))?;
        // An address host never reaches the resolver: it is judged here, before connecting.
        self.guard
            .check_url(&parsed)
            .map_err(|Refused(why)| Failure::Refused(why))?;
        let client = self
            .client()
            .map_err(|error| Failure::Network(error.to_string()))?;
        // `timeout` is reqwest's total timeout: it runs from the connect to the body's last
        // byte, so a server trickling bytes is cut at it (test `a_trickle_is_cut_at_the_timeout`).
        let mut request = client.get(parsed).timeout(timeout);
        if let Some(meta) = cached {
            if !meta.etag.is_empty() {
                request = request.header(reqwest::header::IF_NONE_MATCH, &meta.etag);
            }
            if !meta.last_modified.is_empty() {
                request = request.header(reqwest::header::IF_MODIFIED_SINCE, &meta.last_modified);
            }
        }
        let response = request.send().map_err(|error| match refusal_in(&error) {
            Some(Refused(why)) => Failure::Refused(why),
            None => Failure::Network(format!("fetch failed: {error}")),
        })?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_MODIFIED {
            return Ok(Fresh::NotModified);
        }
        if !status.is_success() {
            return Err(Failure::Http(format!(
                "the server answered HTTP {}",
                status.as_u16()
            )));
        }
        let header = |name: reqwest::header::HeaderName| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let meta = Meta {
            etag: header(reqwest::header::ETAG),
            last_modified: header(reqwest::header::LAST_MODIFIED),
        };
        let mut bytes = Vec::new();
        response
            .take(self.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| Failure::Network(format!("reading the body failed: {error}")))?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(Failure::Http(format!(
                "the body is larger than {} bytes (--max-url-size)",
                self.max_bytes
            )));
        }
        Ok(Fresh::Body(bytes, meta))
    }

    fn store(&self, url: &str, bytes: &[u8], meta: &Meta) {
        let (bytes_path, meta_path) = self.paths(url);
        let meta_json = serde_json::to_vec(meta).unwrap_or_default();
        // The cache is an optimisation: a write failure costs a refetch next time, no more.
        if let Err(error) = write_atomic(&self.dir, &bytes_path, bytes)
            .and_then(|()| write_atomic(&self.dir, &meta_path, &meta_json))
        {
            tracing::warn!(%error, "cannot cache a url() body");
        }
    }
}

enum Fresh {
    NotModified,
    Body(Vec<u8>, Meta),
}

enum Failure {
    /// The server could not be reached or the transfer broke: a cached copy may stand in.
    Network(String),
    /// The server said no (status ≥ 400), or the body is too big: no fallback.
    Http(String),
    /// The host policy refuses the destination: no fallback (a refusal is not a failure).
    Refused(String),
}

/// Why a `url()` source was not fetched: the manifest stage reports its text.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("the server answered 304 Not Modified but nothing is cached")]
    NotModifiedUncached,
    #[error(
        "not fetched within the url() budget of {} (--url-budget), which all url() fetches of a commit share; make the server answer sooner, give this key a shorter timeout, or raise --url-budget",
        humantime::format_duration(*.0)
    )]
    OverBudget(Duration),
    /// The network or the server failed (`Failure::Network`, `Failure::Http`).
    #[error("{0}")]
    Failed(String),
    #[error("refused: {0}")]
    Refused(String),
    #[error("not fetched: the first pass of the load did not ask for it")]
    NotAsked,
}

impl UrlCache {
    /// Fetches `url` within `timeout` and settles the outcome with the cache.
    fn fetch_now(
        &self,
        url: &str,
        timeout: Duration,
        stale_ok: bool,
        cut: Option<&Budget>,
    ) -> Result<Vec<u8>, FetchError> {
        let cached = self.cached(url);
        let fresh = self.fetch_fresh(url, timeout, cached.as_ref().map(|(_, meta)| meta));
        match fresh {
            Ok(Fresh::Body(bytes, meta)) => {
                self.store(url, &bytes, &meta);
                Ok(bytes)
            }
            Ok(Fresh::NotModified) => match cached {
                Some((bytes, _)) => Ok(bytes),
                None => Err(FetchError::NotModifiedUncached),
            },
            // The budget ran out under this fetch: the commit waits for no cached copy either.
            Err(Failure::Network(_)) if cut.is_some_and(Budget::spent) => Err(
                FetchError::OverBudget(cut.map(|budget| budget.limit).unwrap_or_default()),
            ),
            Err(Failure::Network(message)) => match cached {
                Some((bytes, _)) if stale_ok => {
                    tracing::warn!(url, %message, "url() fetch failed; using the cached copy (on_failure = \"stale\")");
                    Ok(bytes)
                }
                _ => Err(FetchError::Failed(message)),
            },
            Err(Failure::Http(message)) => Err(FetchError::Failed(message)),
            Err(Failure::Refused(message)) => Err(FetchError::Refused(message)),
        }
    }

    /// Fetches every request, at most `MAX_PARALLEL_FETCHES` at a time, all within `budget`:
    /// each keeps its own timeout cut to what is left of the budget, and a request not
    /// finished when it is spent fails with a message naming the budget and its flag.
    pub(crate) fn prefetch(&self, requests: Vec<UrlRequest>, budget: Duration) -> Prefetched {
        let budget = Budget {
            limit: budget,
            deadline: Instant::now() + budget,
        };
        let next = AtomicUsize::new(0);
        let results = Mutex::new(BTreeMap::new());
        let work = || {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(request) = requests.get(index) else {
                    return;
                };
                let left = budget.deadline.saturating_duration_since(Instant::now());
                let result = if left.is_zero() {
                    Err(FetchError::OverBudget(budget.limit))
                } else {
                    let cut = (left < request.timeout).then_some(&budget);
                    self.fetch_now(
                        &request.url,
                        request.timeout.min(left),
                        request.stale_ok,
                        cut,
                    )
                };
                crate::base::lock(&results).insert(request.clone(), result);
            }
        };
        std::thread::scope(|scope| {
            let helpers = MAX_PARALLEL_FETCHES.min(requests.len()).saturating_sub(1);
            for _ in 0..helpers {
                // A thread that cannot start leaves its share to the others.
                let _ = std::thread::Builder::new()
                    .name("url-fetch".to_owned())
                    .spawn_scoped(scope, work);
            }
            work();
        });
        Prefetched {
            results: results.into_inner().unwrap_or_else(PoisonError::into_inner),
        }
    }
}

/// What is left of one commit's `url()` budget.
struct Budget {
    limit: Duration,
    deadline: Instant,
}

impl Budget {
    /// Whether the budget is (about) spent: a fetch cut to it failed at its end.
    fn spent(&self) -> bool {
        Instant::now() + Duration::from_millis(50) >= self.deadline
    }
}

impl UrlFetcher for UrlCache {
    fn fetch(&self, url: &str, timeout: Duration, stale_ok: bool) -> Result<Vec<u8>, UrlError> {
        self.fetch_now(url, timeout, stale_ok, None)
            .map_err(UrlError::from)
    }
}

/// The outcomes of `UrlCache::prefetch`, handed to the second pass of a load.
pub(crate) struct Prefetched {
    results: BTreeMap<UrlRequest, Result<Vec<u8>, FetchError>>,
}

impl UrlFetcher for Prefetched {
    fn fetch(&self, url: &str, timeout: Duration, stale_ok: bool) -> Result<Vec<u8>, UrlError> {
        let request = UrlRequest {
            url: url.to_owned(),
            timeout,
            stale_ok,
        };
        self.results
            .get(&request)
            .cloned()
            .unwrap_or(Err(FetchError::NotAsked))
            .map_err(UrlError::from)
    }
}

/// `manifest::load_with_policy` with the `url()` sources fetched together: a first pass notes
/// them (and is the load when there are none), `cache` fetches them within `budget`, and a
/// second pass decodes with the results. `options.fetcher` is not used; validate mode fetches
/// nothing. Files with blob ids (`ids[i]` for `snapshot.files[i]`) go through `decoded`
/// (`manifest::load_cached`); a file with a `url()` is never cached, so it sees the fetches.
pub(crate) fn load_fetching_urls(
    cache: &UrlCache,
    budget: Duration,
    (snapshot, ids, decoded): (&Snapshot, &[Option<BlobId>], &DecodeCache),
    options: &LoadOptions<'_>,
    policy: Option<&Policy>,
) -> Result<Manifest, Diagnostics> {
    if options.mode == Mode::Validate {
        return crate::manifest::load_cached(snapshot, ids, options, policy, decoded);
    }
    let recorder = UrlRecorder::default();
    let first = crate::manifest::load_cached(
        snapshot,
        ids,
        &LoadOptions {
            fetcher: Some(&recorder),
            ..*options
        },
        policy,
        decoded,
    );
    let requests = recorder.into_requests();
    if requests.is_empty() {
        return first;
    }
    drop(first);
    let fetched = cache.prefetch(requests, budget);
    crate::manifest::load_cached(
        snapshot,
        ids,
        &LoadOptions {
            fetcher: Some(&fetched),
            ..*options
        },
        policy,
        decoded,
    )
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::net::{SocketAddr, TcpListener};
    use std::sync::atomic::AtomicUsize;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// What the test server answers.
    #[derive(Clone)]
    enum Answer {
        Body(&'static str),
        Redirect(String),
        /// One byte every 100 ms, `n` of them, after headers announcing `n` bytes.
        Trickle(usize),
    }

    /// A loopback HTTP server counting the connections it accepts.
    struct Server {
        address: SocketAddr,
        accepts: Arc<AtomicUsize>,
    }

    impl Server {
        fn start(ip: &str, answer: Answer) -> Result<Server, std::io::Error> {
            let listener = TcpListener::bind((ip, 0))?;
            let address = listener.local_addr()?;
            let accepts = Arc::new(AtomicUsize::new(0));
            let counter = Arc::clone(&accepts);
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(mut stream) = stream else { return };
                    counter.fetch_add(1, Ordering::SeqCst);
                    let answer = answer.clone();
                    std::thread::spawn(move || {
                        let mut reader = BufReader::new(stream.try_clone().expect("a socket"));
                        let mut line = String::new();
                        while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                            line.clear();
                        }
                        let _ = match answer {
                            Answer::Body(body) => write!(
                                stream,
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            ),
                            Answer::Redirect(location) => write!(
                                stream,
                                "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            ),
                            Answer::Trickle(n) => (|| {
                                write!(
                                    stream,
                                    "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
                                )?;
                                for _ in 0..n {
                                    stream.write_all(b"x")?;
                                    stream.flush()?;
                                    std::thread::sleep(Duration::from_millis(100));
                                }
                                Ok::<(), std::io::Error>(())
                            })(),
                        };
                    });
                }
            });
            Ok(Server { address, accepts })
        }

        fn url(&self, path: &str) -> String {
            format!("http://{}{path}", self.address)
        }

        fn accepts(&self) -> usize {
            self.accepts.load(Ordering::SeqCst)
        }
    }

    fn cache(dir: &Path, allowed: &[&str]) -> Result<UrlCache, String> {
        let allowed: Vec<String> = allowed.iter().map(|host| (*host).to_owned()).collect();
        Ok(UrlCache::new(dir, DEFAULT_MAX_URL_BYTES).guarded(
            UrlHosts::parse(&allowed).map_err(|error| error.to_string())?,
            None,
        ))
    }

    fn fetch(cache: &UrlCache, url: &str) -> Result<String, String> {
        cache
            .fetch(url, Duration::from_secs(10), true)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .map_err(|error| error.to_string())
    }

    #[test]
    fn loopback_is_refused_without_connecting_unless_allowed() -> TestResult {
        let dir = tempfile::tempdir()?;
        let server = Server::start("127.0.0.1", Answer::Body("hello"))?;
        let refused = fetch(&cache(dir.path(), &[])?, &server.url("/x"));
        assert_eq!(
            refused,
            Err("refused: 127.0.0.1 is a loopback address; start the agent with --allow-url-host 127.0.0.1 to allow it".to_owned())
        );
        let by_name = fetch(
            &cache(dir.path(), &[])?,
            &format!("http://localhost:{}/x", server.address.port()),
        );
        let by_name = by_name.err().unwrap_or_default();
        assert!(
            by_name.starts_with("refused: localhost resolves to ")
                && by_name.ends_with("a loopback address; start the agent with --allow-url-host localhost to allow it"),
            "{by_name}"
        );
        assert_eq!(server.accepts(), 0, "a refused fetch connected");
        assert_eq!(
            fetch(&cache(dir.path(), &["127.0.0.1"])?, &server.url("/x")),
            Ok("hello".to_owned())
        );
        assert_eq!(server.accepts(), 1);
        Ok(())
    }

    #[test]
    fn a_refusal_never_serves_the_cached_copy() -> TestResult {
        let dir = tempfile::tempdir()?;
        let server = Server::start("127.0.0.1", Answer::Body("cached"))?;
        let url = server.url("/c");
        assert_eq!(
            fetch(&cache(dir.path(), &["127.0.0.1"])?, &url),
            Ok("cached".to_owned())
        );
        // The same data dir, the host no longer allowed, stale content allowed: still refused.
        let refused = fetch(&cache(dir.path(), &[])?, &url);
        assert!(
            refused
                .as_ref()
                .is_err_and(|why| why.starts_with("refused: ")),
            "{refused:?}"
        );
        assert_eq!(server.accepts(), 1);
        Ok(())
    }

    #[test]
    fn a_redirect_to_a_refused_address_is_refused() -> TestResult {
        let dir = tempfile::tempdir()?;
        // All of 127/8 is this host's loopback; only 127.0.0.1 is allowed.
        let target = Server::start("127.0.0.2", Answer::Body("secret"))?;
        let redirect = Server::start("127.0.0.1", Answer::Redirect(target.url("/s")))?;
        let got = fetch(&cache(dir.path(), &["127.0.0.1"])?, &redirect.url("/r"));
        let why = got.err().unwrap_or_default();
        assert!(
            why.contains("127.0.0.2 is a loopback address; start the agent with --allow-url-host 127.0.0.2 to allow it"),
            "{why}"
        );
        assert_eq!(redirect.accepts(), 1);
        assert_eq!(target.accepts(), 0, "the refused hop connected");
        // Allowed, the hop is followed.
        assert_eq!(
            fetch(&cache(dir.path(), &["127.0.0.0/8"])?, &redirect.url("/r")),
            Ok("secret".to_owned())
        );
        Ok(())
    }

    /// reqwest's `timeout` is a deadline for the whole request, body included, not an idle
    /// timeout per read: a server sending a byte every 100 ms for 3 s is cut at 1 s.
    #[test]
    fn a_trickle_is_cut_at_the_timeout() -> TestResult {
        let dir = tempfile::tempdir()?;
        let server = Server::start("127.0.0.1", Answer::Trickle(30))?;
        let cache = cache(dir.path(), &["127.0.0.1"])?;
        let got = cache.fetch(&server.url("/t"), Duration::from_secs(1), false);
        let why = got
            .err()
            .ok_or("the trickle was read to its end")?
            .to_string();
        assert!(why.contains("reading the body failed"), "{why}");
        Ok(())
    }

    #[test]
    fn fetches_that_outlast_the_budget_fail_naming_it() -> TestResult {
        let dir = tempfile::tempdir()?;
        let slow = Server::start("127.0.0.1", Answer::Trickle(100))?;
        let fast = Server::start("127.0.0.1", Answer::Body("quick"))?;
        let cache = cache(dir.path(), &["127.0.0.1"])?;
        // The quick one first: the four fetchers take it and three slow ones, then a fourth
        // slow one; the last two never start.
        let mut requests = vec![UrlRequest {
            url: fast.url("/"),
            timeout: Duration::from_secs(10),
            stale_ok: false,
        }];
        requests.extend((0..6).map(|n| UrlRequest {
            url: slow.url(&format!("/{n}")),
            timeout: Duration::from_secs(10),
            stale_ok: true,
        }));
        let fetched = cache.prefetch(requests.clone(), Duration::from_secs(1));
        let first = &requests[0];
        assert_eq!(
            fetched
                .fetch(&first.url, first.timeout, first.stale_ok)
                .map_err(|error| error.to_string()),
            Ok(b"quick".to_vec())
        );
        for request in &requests[1..] {
            let got = fetched.fetch(&request.url, request.timeout, request.stale_ok);
            let why = got.err().ok_or("a slow key finished")?.to_string();
            assert!(
                why.starts_with("not fetched within the url() budget of 1s (--url-budget)"),
                "{why}"
            );
        }
        Ok(())
    }
}
