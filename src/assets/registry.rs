//! The registry HTTP API v2 client image automation scans with: `GET /v2/<name>/tags/list`,
//! following `Link: <…>; rel="next"` pages, answering a `401` with the challenge it names
//! (`Bearer realm=… service=… scope=…`: a token from the realm, with basic credentials when the
//! matching `registry` block has them; `Basic`: the credentials themselves).
//!
//! A loopback registry (`localhost`, `127.0.0.0/8`, `::1`) is spoken to over plain HTTP, as the
//! Docker engine does by default; every other one over HTTPS.
//!
//! Where a scan may connect is the `url()` rule (`url_guard`, `--allow-url-host`): the image
//! names its registry, and the manifest is hostile while the agent runs as root, so loopback,
//! private and other internal addresses are refused unless the host policy allows them, a
//! link-local address (169.254.0.0/16, fe80::/10: cloud metadata) always, and the agent's own
//! HTTP address always. A token realm is judged the same way.
//!
//! Invariants: nothing connects to a refused address (address hosts are judged before the
//! request, names inside the resolver, on every address they resolve to; no redirect is
//! followed); every request has a deadline (`REQUEST_TIMEOUT`, body included), a whole scan
//! another (`SCAN_DEADLINE`), and every body a size cap (`MAX_BODY`); pages and tags are
//! bounded (`MAX_PAGES`, `MAX_TAGS`) and a listing cut by a bound says so (`Listing::note`),
//! and only valid tags are kept (`model::is_valid_tag`: a tag ends up in a manifest); a next
//! page is
//! only followed on the registry's own origin; a `429` or `503` is returned with its
//! `Retry-After` for the caller's schedule, never waited for here; credentials are never in an
//! error or a log line.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderValue, LINK, RETRY_AFTER, WWW_AUTHENTICATE};
use reqwest::{Client, StatusCode, Url};

use super::url_guard::{ClientError, Guard, GuardedResolver, HostsError, refusal_in};
use crate::model::is_valid_tag;

/// Deadline of one request, connect to last byte.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest body read (a page of tags, a token).
pub(crate) const MAX_BODY: usize = 4 << 20;
/// Most pages followed.
pub(crate) const MAX_PAGES: usize = 50;
/// Most tags listed.
pub(crate) const MAX_TAGS: usize = 20_000;
/// Tags asked for per page.
const PAGE_SIZE: usize = 1000;
/// Deadline of a whole scan (every page and the token).
pub(crate) const SCAN_DEADLINE: Duration = Duration::from_secs(120);

/// Where scans may connect: the host policy's `--allow-url-host` (as for `url()`), never a
/// link-local address, never the agent's own HTTP address. The default allows no internal
/// address.
#[derive(Debug, Clone)]
pub struct RegistryAccess {
    guard: Arc<Guard>,
}

impl Default for RegistryAccess {
    fn default() -> Self {
        RegistryAccess {
            guard: Arc::new(Guard {
                never_link_local: true,
                ..Guard::default()
            }),
        }
    }
}

impl RegistryAccess {
    /// Scans may reach what `allow_url_host` (`--allow-url-host` entries) allows, never
    /// `own_address` (`--listen`).
    pub fn new(
        allow_url_host: &[String],
        own_address: Option<SocketAddr>,
    ) -> Result<RegistryAccess, HostsError> {
        Ok(RegistryAccess {
            guard: Arc::new(Guard::never_link_local(allow_url_host, own_address)?),
        })
    }
}

/// The HTTP client of the scans and the rule it connects by (one per scanner).
#[derive(Clone)]
pub(crate) struct Scanner {
    client: Client,
    guard: Arc<Guard>,
}

/// Basic credentials (a `registry` block's username and token, or a helper's answer).
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) username: String,
    pub(crate) secret: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Why a listing failed; the message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RegistryError {
    #[error("registry {host} is unreachable: {message}")]
    Unreachable { host: String, message: String },
    #[error(
        "registry {host} refused the credentials (HTTP {status}): check the `registry` block whose url is {host}"
    )]
    Denied { host: String, status: u16 },
    #[error("registry {host} has no repository {name} (HTTP 404): check the image name")]
    NotFound { host: String, name: String },
    #[error("registry {host} limits the rate (HTTP {status}); the next scan waits {}s", retry_after.as_secs())]
    RateLimited {
        host: String,
        status: u16,
        retry_after: Duration,
    },
    #[error("registry {host} answered unexpectedly: {message}")]
    Protocol { host: String, message: String },
    #[error("registry {host} is not contacted: {message}")]
    Refused { host: String, message: String },
}

impl RegistryError {
    /// How long the registry asked to be left alone, if it did.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            RegistryError::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// The tags of one repository, and what of the registry's listing was left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listing {
    pub(crate) tags: Vec<String>,
    /// Why tags the registry listed were not considered (`registry listed more than 20000
    /// tags; the first 20000 were considered`); empty when none were left out.
    pub(crate) note: String,
}

/// A client for the scans, connecting only where `access` allows (cheap to clone).
pub(crate) fn client(access: &RegistryAccess) -> Result<Scanner, ClientError> {
    let client = Client::builder()
        .tls_backend_preconfigured(ClientError::tls()?)
        .user_agent(concat!("voodu-agent/", env!("CARGO_PKG_VERSION")))
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(10))
        .dns_resolver(Arc::new(GuardedResolver(Arc::clone(&access.guard))))
        // A redirect would carry the Authorization header's purpose elsewhere: none followed.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(ClientError::build)?;
    Ok(Scanner {
        client,
        guard: Arc::clone(&access.guard),
    })
}

/// The API host and repository path of `repository` (an image without its tag):
/// `ghcr.io/acme/web` → (`ghcr.io`, `acme/web`); `redis` → (`registry-1.docker.io`,
/// `library/redis`).
pub(crate) fn api_location(repository: &str) -> (String, String) {
    let (host, path) = match repository.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first, rest.to_owned())
        }
        _ => ("docker.io", repository.to_owned()),
    };
    if matches!(host, "docker.io" | "index.docker.io") {
        let path = if path.contains('/') {
            path
        } else {
            format!("library/{path}")
        };
        return ("registry-1.docker.io".to_owned(), path);
    }
    (host.to_owned(), path)
}

fn base_url(host: &str) -> Result<Url, RegistryError> {
    let bare = host
        .rsplit_once(':')
        .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
        .map_or(host, |(bare, _)| bare);
    let bare = bare.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare == "localhost"
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback());
    let scheme = if loopback { "http" } else { "https" };
    Url::parse(&format!("{scheme}://{host}/")).map_err(|error| RegistryError::Protocol {
        host: host.to_owned(),
        message: format!("not a registry host: {error}"),
    })
}

/// The `WWW-Authenticate` challenge of a `401` (empty when there is none).
fn challenge_of(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(WWW_AUTHENTICATE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// `path` (`v2/…`) on the registry at `host`.
fn api_url(host: &str, path: &str) -> Result<Url, RegistryError> {
    base_url(host)?
        .join(path)
        .map_err(|error| RegistryError::Protocol {
            host: host.to_owned(),
            message: error.to_string(),
        })
}

/// Lists the tags of `repository` (an image without its tag), every page up to the bounds,
/// within `SCAN_DEADLINE`; tags that are not valid tags are left out.
pub(crate) async fn list_tags(
    client: &Scanner,
    repository: &str,
    credentials: Option<&Credentials>,
) -> Result<Listing, RegistryError> {
    let (host, _) = api_location(repository);
    tokio::time::timeout(SCAN_DEADLINE, list_pages(client, repository, credentials))
        .await
        .unwrap_or_else(|_| {
            Err(RegistryError::Unreachable {
                host,
                message: format!(
                    "the scan did not finish within {}s",
                    SCAN_DEADLINE.as_secs()
                ),
            })
        })
}

async fn list_pages(
    client: &Scanner,
    repository: &str,
    credentials: Option<&Credentials>,
) -> Result<Listing, RegistryError> {
    let (host, name) = api_location(repository);
    let base = base_url(&host)?;
    let protocol = |message: String| RegistryError::Protocol {
        host: host.clone(),
        message,
    };
    let mut next = base
        .join(&format!("v2/{name}/tags/list?n={PAGE_SIZE}"))
        .map_err(|error| protocol(error.to_string()))?;
    let mut authorization: Option<HeaderValue> = None;
    let mut tags = Vec::new();
    for _ in 0..MAX_PAGES {
        let mut response = get(client, &host, &next, authorization.as_ref()).await?;
        if response.status() == StatusCode::UNAUTHORIZED && authorization.is_none() {
            let challenge = challenge_of(&response);
            authorization = Some(authorize(client, &host, &challenge, credentials).await?);
            response = get(client, &host, &next, authorization.as_ref()).await?;
        }
        let status = response.status();
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(RegistryError::Denied {
                    host,
                    status: status.as_u16(),
                });
            }
            StatusCode::NOT_FOUND => return Err(RegistryError::NotFound { host, name }),
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                let retry_after = retry_after(response.headers().get(RETRY_AFTER));
                return Err(RegistryError::RateLimited {
                    host,
                    status: status.as_u16(),
                    retry_after,
                });
            }
            status if !status.is_success() => {
                return Err(protocol(format!("HTTP {} listing tags", status.as_u16())));
            }
            _ => {}
        }
        let link = response
            .headers()
            .get(LINK)
            .and_then(|value| value.to_str().ok())
            .and_then(next_link)
            .map(str::to_owned);
        let body = read_body(&host, response).await?;
        #[derive(serde::Deserialize)]
        struct Page {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let page: Page = serde_json::from_slice(&body)
            .map_err(|error| protocol(format!("the tag list is not JSON: {error}")))?;
        tags.extend(
            page.tags
                .unwrap_or_default()
                .into_iter()
                .filter(|tag| is_valid_tag(tag)),
        );
        if tags.len() > MAX_TAGS || (tags.len() == MAX_TAGS && link.is_some()) {
            tags.truncate(MAX_TAGS);
            return Ok(Listing {
                tags,
                note: format!(
                    "registry listed more than {MAX_TAGS} tags; the first {MAX_TAGS} were considered"
                ),
            });
        }
        let Some(link) = link else {
            return Ok(Listing {
                tags,
                note: String::new(),
            });
        };
        let candidate = next
            .join(&link)
            .map_err(|error| protocol(format!("a bad next-page link: {error}")))?;
        if candidate.origin() != base.origin() {
            return Err(protocol(
                "the next-page link leaves the registry; not followed".to_owned(),
            ));
        }
        next = candidate;
    }
    // The bound of pages reached with a next page still to read.
    Ok(Listing {
        tags,
        note: format!(
            "registry listed more than {MAX_PAGES} pages; the first {MAX_PAGES} were considered"
        ),
    })
}

async fn get(
    client: &Scanner,
    host: &str,
    url: &Url,
    authorization: Option<&HeaderValue>,
) -> Result<reqwest::Response, RegistryError> {
    send(client, host, url, (authorization, None), "").await
}

/// The media types a manifest is asked for in: what `docker pull` asks for, so the digest a
/// tag resolves to is the one the engine records (Docker v2 schema 2, its list, OCI manifest
/// and index; without these a registry answers a converted schema 1 or nothing).
const MANIFEST_TYPES: &str = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json";

/// A manifest as the registry answered it.
#[derive(Debug, Clone)]
pub(crate) struct Manifest {
    /// `sha256:…` of its bytes (what `Docker-Content-Digest` says, checked).
    pub(crate) digest: String,
    pub(crate) bytes: Vec<u8>,
}

/// `GET /v2/<name>/manifests/<reference>` (a tag or a digest) of `repository`, with the
/// credentials for a `401`, within `REQUEST_TIMEOUT` per request; `None` when the registry
/// has no such manifest. The digest is computed from the bytes (a registry's header that
/// says otherwise is refused).
pub(crate) async fn manifest(
    client: &Scanner,
    repository: &str,
    reference: &str,
    credentials: Option<&Credentials>,
) -> Result<Option<Manifest>, RegistryError> {
    let (host, name) = api_location(repository);
    let url = api_url(&host, &format!("v2/{name}/manifests/{reference}"))?;
    let Some(response) = authorized(client, &host, &url, credentials, Some(MANIFEST_TYPES)).await?
    else {
        return Ok(None);
    };
    let claimed = response
        .headers()
        .get("docker-content-digest")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let bytes = read_body(&host, response).await?;
    let digest = sha256_digest(&bytes);
    if let Some(claimed) = claimed
        && claimed != digest
    {
        return Err(RegistryError::Protocol {
            host,
            message: format!(
                "the manifest of {name}:{reference} is {digest}, not {claimed} as the registry says"
            ),
        });
    }
    Ok(Some(Manifest { digest, bytes }))
}

/// `GET /v2/<name>/blobs/<digest>` of `repository`, its bytes checked against `digest`.
pub(crate) async fn blob(
    client: &Scanner,
    repository: &str,
    digest: &str,
    credentials: Option<&Credentials>,
) -> Result<Option<Vec<u8>>, RegistryError> {
    let (host, name) = api_location(repository);
    let url = api_url(&host, &format!("v2/{name}/blobs/{digest}"))?;
    let Some(response) = authorized(client, &host, &url, credentials, None).await? else {
        return Ok(None);
    };
    let bytes = read_body(&host, response).await?;
    if sha256_digest(&bytes) != digest {
        return Err(RegistryError::Protocol {
            host,
            message: format!("the blob {digest} of {name} does not have that digest"),
        });
    }
    Ok(Some(bytes))
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(bytes);
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256:{hex}")
}

/// A GET of `url`, answering a `401` with its challenge once; `None` for a 404, an error for
/// every other failure (denied, rate limited, …).
async fn authorized(
    client: &Scanner,
    host: &str,
    url: &Url,
    credentials: Option<&Credentials>,
    accept: Option<&str>,
) -> Result<Option<reqwest::Response>, RegistryError> {
    let request = |authorization: Option<HeaderValue>| {
        let accept = accept.map(str::to_owned);
        async move {
            send(
                client,
                host,
                url,
                (authorization.as_ref(), accept.as_deref()),
                "",
            )
            .await
        }
    };
    let mut response = request(None).await?;
    if response.status() == StatusCode::UNAUTHORIZED {
        let challenge = challenge_of(&response);
        let authorization = authorize(client, host, &challenge, credentials).await?;
        response = request(Some(authorization)).await?;
    }
    let status = response.status();
    match status {
        StatusCode::NOT_FOUND => Ok(None),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(RegistryError::Denied {
            host: host.to_owned(),
            status: status.as_u16(),
        }),
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
            Err(RegistryError::RateLimited {
                host: host.to_owned(),
                status: status.as_u16(),
                retry_after: retry_after(response.headers().get(RETRY_AFTER)),
            })
        }
        status if !status.is_success() => Err(RegistryError::Protocol {
            host: host.to_owned(),
            message: format!("HTTP {}", status.as_u16()),
        }),
        _ => Ok(Some(response)),
    }
}

/// Sends a GET to `url` (with an `Accept` header when `accept`) once the guard allows it (an
/// address host is judged here, a name by the resolver); `what` prefixes a failure's message.
async fn send(
    client: &Scanner,
    host: &str,
    url: &Url,
    (authorization, accept): (Option<&HeaderValue>, Option<&str>),
    what: &str,
) -> Result<reqwest::Response, RegistryError> {
    let refused = |message: String| RegistryError::Refused {
        host: host.to_owned(),
        message: format!("{what}{message}"),
    };
    client
        .guard
        .check_url(url)
        .map_err(|refusal| refused(refusal.to_string()))?;
    let mut request = client.client.get(url.clone());
    if let Some(accept) = accept {
        request = request.header(reqwest::header::ACCEPT, accept);
    }
    if let Some(authorization) = authorization {
        request = request.header(AUTHORIZATION, authorization.clone());
    }
    request.send().await.map_err(|error| {
        if let Some(refusal) = refusal_in(&error) {
            return refused(refusal.to_string());
        }
        RegistryError::Unreachable {
            host: host.to_owned(),
            message: format!("{what}{}", without_url(&error)),
        }
    })
}

/// The Authorization header the challenge asks for.
async fn authorize(
    client: &Scanner,
    host: &str,
    challenge: &str,
    credentials: Option<&Credentials>,
) -> Result<HeaderValue, RegistryError> {
    let denied = || RegistryError::Denied {
        host: host.to_owned(),
        status: 401,
    };
    let (scheme, parameters) = challenge.split_once(' ').unwrap_or((challenge, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        let credentials = credentials.ok_or_else(denied)?;
        return basic(credentials).ok_or_else(denied);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(denied());
    }
    let parameters = challenge_parameters(parameters);
    let parameter = |name: &str| {
        parameters
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    };
    let realm = parameter("realm").ok_or_else(|| RegistryError::Protocol {
        host: host.to_owned(),
        message: "a Bearer challenge without a realm".to_owned(),
    })?;
    let mut realm = Url::parse(realm).map_err(|error| RegistryError::Protocol {
        host: host.to_owned(),
        message: format!("the token realm is not a URL: {error}"),
    })?;
    if !matches!(realm.scheme(), "https" | "http") {
        return Err(RegistryError::Protocol {
            host: host.to_owned(),
            message: "the token realm is not an HTTP URL".to_owned(),
        });
    }
    {
        let mut query = realm.query_pairs_mut();
        for name in ["service", "scope"] {
            if let Some(value) = parameter(name) {
                query.append_pair(name, value);
            }
        }
    }
    let header = credentials.and_then(basic);
    let response = send(
        client,
        host,
        &realm,
        (header.as_ref(), None),
        "its token service: ",
    )
    .await?;
    if matches!(
        response.status(),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
    ) {
        return Err(denied());
    }
    if !response.status().is_success() {
        return Err(RegistryError::Protocol {
            host: host.to_owned(),
            message: format!(
                "its token service answered HTTP {}",
                response.status().as_u16()
            ),
        });
    }
    let body = read_body(host, response).await?;
    #[derive(serde::Deserialize)]
    struct Token {
        #[serde(default)]
        token: String,
        #[serde(default)]
        access_token: String,
    }
    let token: Token = serde_json::from_slice(&body).map_err(|_| RegistryError::Protocol {
        host: host.to_owned(),
        message: "its token service answered something other than a token".to_owned(),
    })?;
    let token = if token.token.is_empty() {
        token.access_token
    } else {
        token.token
    };
    let mut header =
        HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| RegistryError::Protocol {
            host: host.to_owned(),
            message: "its token is not a header value".to_owned(),
        })?;
    header.set_sensitive(true);
    Ok(header)
}

fn basic(credentials: &Credentials) -> Option<HeaderValue> {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", credentials.username, credentials.secret));
    let mut header = HeaderValue::from_str(&format!("Basic {encoded}")).ok()?;
    header.set_sensitive(true);
    Some(header)
}

/// `key="value", key=value` pairs of a challenge.
fn challenge_parameters(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key.trim().trim_start_matches(',').trim().to_owned();
        let after = after.trim_start();
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (quoted[..end].to_owned(), &quoted[end + 1..]),
                None => (quoted.to_owned(), ""),
            }
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_owned(), &after[end..])
        };
        out.push((key, value));
        rest = after.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// The target of a `Link` header's `rel="next"` entry.
fn next_link(header: &str) -> Option<&str> {
    header.split(',').find_map(|entry| {
        let (target, parameters) = entry.split_once(';')?;
        let next = parameters
            .split(';')
            .any(|parameter| parameter.trim().replace(' ', "") == "rel=\"next\"");
        next.then(|| target.trim().trim_start_matches('<').trim_end_matches('>'))
    })
}

/// `Retry-After` in seconds (an HTTP date counts as a minute), at least 1 s, at most an hour;
/// 60 s when absent.
fn retry_after(value: Option<&HeaderValue>) -> Duration {
    let seconds = value
        .and_then(|value| value.to_str().ok())
        .map(|text| text.trim().parse::<u64>().unwrap_or(60))
        .unwrap_or(60);
    Duration::from_secs(seconds.clamp(1, 3600))
}

async fn read_body(host: &str, mut response: reqwest::Response) -> Result<Vec<u8>, RegistryError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| RegistryError::Unreachable {
            host: host.to_owned(),
            message: format!("reading the answer: {}", without_url(&error)),
        })?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(RegistryError::Protocol {
                host: host.to_owned(),
                message: format!("an answer larger than {MAX_BODY} bytes"),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A reqwest error's text without its URL (a token realm's query could carry a scope the user
/// does not need repeated) and with its causes.
fn without_url(error: &reqwest::Error) -> String {
    let timed_out = format!("no answer within {}s", REQUEST_TIMEOUT.as_secs());
    crate::base::request_error_text(error, &timed_out, false)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// A listener that only counts the connections made to it (none is ever answered).
    struct Counting {
        listener: TcpListener,
    }

    impl Counting {
        fn on(ip: &str) -> std::io::Result<Counting> {
            let listener = TcpListener::bind((ip, 0))?;
            listener.set_nonblocking(true)?;
            Ok(Counting { listener })
        }

        fn port(&self) -> std::io::Result<u16> {
            Ok(self.listener.local_addr()?.port())
        }

        /// Connections made so far (the kernel queues them whether or not they are accepted).
        fn accepted(&self) -> usize {
            let mut n = 0;
            while self.listener.accept().is_ok() {
                n += 1;
            }
            n
        }
    }

    /// A registry on loopback answering each request path (without its query) from `routes`
    /// (status line, headers, body), in a thread, `requests` times at most; counts requests.
    fn serve(
        routes: Vec<(&'static str, String, String)>,
    ) -> std::io::Result<(u16, Arc<AtomicUsize>)> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let count = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&count);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().expect("a clone"));
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) <= 2 {
                        break;
                    }
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let target = line.split(' ').nth(1).unwrap_or_default().to_owned();
                let path = target.split('?').next().unwrap_or_default().to_owned();
                let query = target.split_once('?').map(|(_, query)| query).unwrap_or("");
                let (status, headers, body) = routes
                    .iter()
                    .find(|(route, ..)| {
                        route
                            .split_once('?')
                            .map_or(*route == path, |(p, q)| p == path && query.contains(q))
                    })
                    .map(|(_, head, body)| {
                        let (status, headers) = head.split_once('\n').unwrap_or((head, ""));
                        (status.to_owned(), headers.to_owned(), body.clone())
                    })
                    .unwrap_or(("404 Not Found".to_owned(), String::new(), String::new()));
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Ok((port, count))
    }

    async fn scan(access: &RegistryAccess, repository: &str) -> Result<Listing, RegistryError> {
        let scanner = client(access).map_err(|error| RegistryError::Protocol {
            host: String::new(),
            message: error.to_string(),
        })?;
        list_tags(&scanner, repository, None).await
    }

    fn refused(result: &Result<Listing, RegistryError>) -> bool {
        matches!(result, Err(RegistryError::Refused { .. }))
    }

    /// The manifest names the registry: internal addresses are refused unless allowed, before
    /// any connection (by address, or by what a name resolves to); link-local and the agent's
    /// own address whatever is allowed.
    #[tokio::test]
    async fn refused_registries_are_never_connected_to() -> TestResult {
        let target = Counting::on("127.0.0.1")?;
        let port = target.port()?;
        let deny = RegistryAccess::default();
        for repository in [
            format!("127.0.0.1:{port}/app"),
            format!("localhost:{port}/app"),
            format!("[::ffff:127.0.0.1]:{port}/app"),
        ] {
            let result = scan(&deny, &repository).await;
            assert!(refused(&result), "{repository}: {result:?}");
        }
        let everything = RegistryAccess::new(
            &[
                "127.0.0.0/8".to_owned(),
                "169.254.0.0/16".to_owned(),
                "fe80::/10".to_owned(),
                "metadata.invalid".to_owned(),
            ],
            Some(target.listener.local_addr()?),
        )?;
        for repository in [
            "169.254.169.254/app".to_owned(),
            "169.254.169.254:80/app".to_owned(),
            "[fe80::1]:5000/app".to_owned(),
            "[::ffff:169.254.169.254]/app".to_owned(),
            // The agent's own HTTP address.
            format!("127.0.0.1:{port}/app"),
        ] {
            let result = scan(&everything, &repository).await;
            assert!(refused(&result), "{repository}: {result:?}");
            let message = result
                .err()
                .map(|error| error.to_string())
                .unwrap_or_default();
            assert!(
                message.contains("link-local") || message.contains("own HTTP address"),
                "{message}"
            );
        }
        assert_eq!(target.accepted(), 0, "no connection was made");
        Ok(())
    }

    /// A token realm is where a registry sends the credentials: judged like the registry.
    #[tokio::test]
    async fn a_token_realm_is_judged_like_the_registry() -> TestResult {
        let realm = Counting::on("127.0.0.2")?;
        let realm_port = realm.port()?;
        for realm_url in [
            format!("http://127.0.0.2:{realm_port}/token"),
            "http://169.254.169.254/latest/meta-data".to_owned(),
        ] {
            let (port, requests) = serve(vec![(
                "/v2/app/tags/list",
                format!(
                    "401 Unauthorized\nwww-authenticate: Bearer realm=\"{realm_url}\",service=\"r\"\r\n"
                ),
                String::new(),
            )])?;
            let access = RegistryAccess::new(&["127.0.0.1".to_owned()], None)?;
            let result = scan(&access, &format!("127.0.0.1:{port}/app")).await;
            assert!(refused(&result), "{realm_url}: {result:?}");
            assert_eq!(requests.load(Ordering::SeqCst), 1, "the registry was asked");
        }
        assert_eq!(realm.accepted(), 0, "the realm was never contacted");
        Ok(())
    }

    /// Pages are followed; a tag that is not a tag (a hostile registry's HCL) is left out.
    #[tokio::test]
    async fn pages_are_followed_and_invalid_tags_dropped() -> TestResult {
        let (port, requests) = serve(vec![
            (
                "/v2/app/tags/list?last=1.4.3",
                "200 OK\n".to_owned(),
                r#"{"name":"app","tags":["1.5.0","2.0.0"]}"#.to_owned(),
            ),
            (
                "/v2/app/tags/list",
                "200 OK\nlink: </v2/app/tags/list?last=1.4.3&n=2>; rel=\"next\"\r\n".to_owned(),
                r#"{"name":"app","tags":["1.4.2","1.4.3\"\n command = \"sh","${X}","1.4.3"]}"#
                    .to_owned(),
            ),
        ])?;
        let access = RegistryAccess::new(&["127.0.0.1".to_owned()], None)?;
        let listing = scan(&access, &format!("127.0.0.1:{port}/app")).await?;
        assert_eq!(listing.tags, ["1.4.2", "1.4.3", "1.5.0", "2.0.0"]);
        assert_eq!(listing.note, "", "nothing was left out");
        assert_eq!(requests.load(Ordering::SeqCst), 2);
        Ok(())
    }

    /// Issue 47: a listing cut by a bound says so (it was cut silently): tags past
    /// `MAX_TAGS`, pages past `MAX_PAGES`; exactly `MAX_TAGS` tags and no next page is whole.
    #[tokio::test]
    async fn a_listing_cut_by_a_bound_says_so() -> TestResult {
        let page = |n: usize| {
            let tags: Vec<String> = (0..n).map(|n| format!("1.0.{n}")).collect();
            serde_json::json!({ "name": "app", "tags": tags }).to_string()
        };
        let access = RegistryAccess::new(&["127.0.0.1".to_owned()], None)?;
        for (n_tags, note) in [
            (
                MAX_TAGS + 1,
                format!(
                    "registry listed more than {MAX_TAGS} tags; the first {MAX_TAGS} were considered"
                ),
            ),
            (MAX_TAGS, String::new()),
        ] {
            // A registry that ignores `n` and lists everything at once.
            let (port, _) = serve(vec![(
                "/v2/app/tags/list",
                "200 OK\n".to_owned(),
                page(n_tags),
            )])?;
            let listing = scan(&access, &format!("127.0.0.1:{port}/app")).await?;
            assert_eq!(listing.tags.len(), MAX_TAGS);
            assert_eq!(listing.note, note, "{n_tags} tags");
        }
        // A registry whose every page names a next one.
        let (port, requests) = serve(vec![(
            "/v2/app/tags/list",
            "200 OK\nlink: </v2/app/tags/list?last=x>; rel=\"next\"\r\n".to_owned(),
            page(1),
        )])?;
        let listing = scan(&access, &format!("127.0.0.1:{port}/app")).await?;
        assert_eq!(requests.load(Ordering::SeqCst), MAX_PAGES);
        assert_eq!(
            listing.note,
            format!(
                "registry listed more than {MAX_PAGES} pages; the first {MAX_PAGES} were considered"
            )
        );
        Ok(())
    }

    #[test]
    fn repositories_map_to_their_api() {
        for (repository, host, name) in [
            ("redis", "registry-1.docker.io", "library/redis"),
            ("acme/web", "registry-1.docker.io", "acme/web"),
            ("ghcr.io/acme/web", "ghcr.io", "acme/web"),
            ("127.0.0.1:5000/app", "127.0.0.1:5000", "app"),
        ] {
            assert_eq!(
                api_location(repository),
                (host.to_owned(), name.to_owned()),
                "{repository}"
            );
        }
        for (host, scheme) in [
            ("127.0.0.1:5000", "http"),
            ("localhost:5000", "http"),
            ("[::1]:5000", "http"),
            ("ghcr.io", "https"),
            ("10.0.0.1:5000", "https"),
        ] {
            assert_eq!(
                base_url(host).map(|url| url.scheme().to_owned()),
                Ok(scheme.to_owned()),
                "{host}"
            );
        }
    }

    #[test]
    fn headers_are_read() {
        assert_eq!(
            challenge_parameters(
                r#"realm="https://auth.example/token",service="registry.example",scope="repository:app:pull""#
            ),
            vec![
                ("realm".to_owned(), "https://auth.example/token".to_owned()),
                ("service".to_owned(), "registry.example".to_owned()),
                ("scope".to_owned(), "repository:app:pull".to_owned()),
            ]
        );
        assert_eq!(
            next_link(r#"</v2/app/tags/list?last=1.4.3&n=2>; rel="next""#),
            Some("/v2/app/tags/list?last=1.4.3&n=2")
        );
        assert_eq!(next_link(r#"</x>; rel="prev""#), None);
        assert_eq!(
            retry_after(Some(&HeaderValue::from_static("7"))),
            Duration::from_secs(7)
        );
        assert_eq!(retry_after(None), Duration::from_secs(60));
        assert_eq!(
            retry_after(Some(&HeaderValue::from_static("999999"))),
            Duration::from_secs(3600)
        );
    }
}
