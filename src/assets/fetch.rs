//! `url()` asset sources: fetched over HTTP(S) with a timeout and a size cap, cached by URL in
//! `<data-dir>/cache/` with voodu's ETag / Last-Modified revalidation (spec §7.15).
//!
//! Invariants: a body larger than the cap is refused, never truncated; a cached copy stands in
//! for a failed fetch only when the manifest allows stale content (`on_failure` other than
//! `error`); HTTP errors (status ≥ 400) never fall back to the cache. Blocking: call from a
//! blocking thread (the sync task), never from async code.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::write::write_atomic;
use crate::manifest::UrlFetcher;
use crate::manifest::spec::sha256_hex;

/// Default cap on one `url()` body.
pub const DEFAULT_MAX_URL_BYTES: u64 = 8 * 1024 * 1024;

/// The `url()` fetcher with its on-disk cache.
pub struct UrlCache {
    dir: PathBuf,
    max_bytes: u64,
    client: OnceLock<Result<reqwest::blocking::Client, String>>,
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
    pub fn new(data_dir: &Path, max_bytes: u64) -> UrlCache {
        UrlCache {
            dir: data_dir.join("cache"),
            max_bytes,
            client: OnceLock::new(),
        }
    }

    fn client(&self) -> Result<&reqwest::blocking::Client, String> {
        self.client
            .get_or_init(|| {
                // reqwest is built without a default crypto provider; the binary installs
                // ring at start, and this covers library users and tests.
                let _ = rustls::crypto::ring::default_provider().install_default();
                reqwest::blocking::Client::builder()
                    .user_agent(concat!("voodu-agent/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .map_err(|error| format!("cannot build an HTTP client: {error}"))
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
        let client = self.client().map_err(Failure::Network)?;
        let mut request = client.get(url).timeout(timeout);
        if let Some(meta) = cached {
            if !meta.etag.is_empty() {
                request = request.header(reqwest::header::IF_NONE_MATCH, &meta.etag);
            }
            if !meta.last_modified.is_empty() {
                request = request.header(reqwest::header::IF_MODIFIED_SINCE, &meta.last_modified);
            }
        }
        let response = request
            .send()
            .map_err(|error| Failure::Network(format!("fetch failed: {error}")))?;
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
}

impl UrlFetcher for UrlCache {
    fn fetch(&self, url: &str, timeout: Duration, stale_ok: bool) -> Result<Vec<u8>, String> {
        let cached = self.cached(url);
        match self.fetch_fresh(url, timeout, cached.as_ref().map(|(_, meta)| meta)) {
            Ok(Fresh::Body(bytes, meta)) => {
                self.store(url, &bytes, &meta);
                Ok(bytes)
            }
            Ok(Fresh::NotModified) => match cached {
                Some((bytes, _)) => Ok(bytes),
                None => {
                    Err("the server answered 304 Not Modified but nothing is cached".to_owned())
                }
            },
            Err(Failure::Network(message)) => match cached {
                Some((bytes, _)) if stale_ok => {
                    tracing::warn!(url, %message, "url() fetch failed; using the cached copy (on_failure = \"stale\")");
                    Ok(bytes)
                }
                _ => Err(message),
            },
            Err(Failure::Http(message)) => Err(message),
        }
    }
}
