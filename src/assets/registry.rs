//! The registry HTTP API v2 client image automation scans with: `GET /v2/<name>/tags/list`,
//! following `Link: <…>; rel="next"` pages, answering a `401` with the challenge it names
//! (`Bearer realm=… service=… scope=…`: a token from the realm, with basic credentials when the
//! matching `registry` block has them; `Basic`: the credentials themselves).
//!
//! A loopback registry (`localhost`, `127.0.0.0/8`, `::1`) is spoken to over plain HTTP, as the
//! Docker engine does by default; every other one over HTTPS.
//!
//! Invariants: every request has a deadline (`REQUEST_TIMEOUT`, body included) and every body
//! a size cap (`MAX_BODY`); pages and tags are bounded (`MAX_PAGES`, `MAX_TAGS`); a next page is
//! only followed on the registry's own origin; a `429` or `503` is returned with its
//! `Retry-After` for the caller's schedule, never waited for here; credentials are never in an
//! error or a log line.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderValue, LINK, RETRY_AFTER, WWW_AUTHENTICATE};
use reqwest::{Client, StatusCode, Url};

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

/// A client for the scans (one per scanner; cheap to clone).
pub(crate) fn client() -> Result<Client, String> {
    // reqwest is built without a default crypto provider; the binary installs ring at start,
    // and this covers library users and tests.
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::builder()
        .user_agent(concat!("voodu-agent/", env!("CARGO_PKG_VERSION")))
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(10))
        // A redirect would carry the Authorization header's purpose elsewhere: none followed.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|error| format!("cannot build an HTTP client: {error}"))
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

/// Lists the tags of `repository` (an image without its tag), every page.
pub(crate) async fn list_tags(
    client: &Client,
    repository: &str,
    credentials: Option<&Credentials>,
) -> Result<Vec<String>, RegistryError> {
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
            let challenge = response
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned();
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
        tags.extend(page.tags.unwrap_or_default());
        if tags.len() >= MAX_TAGS {
            tags.truncate(MAX_TAGS);
            break;
        }
        let Some(link) = link else {
            return Ok(tags);
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
    Ok(tags)
}

async fn get(
    client: &Client,
    host: &str,
    url: &Url,
    authorization: Option<&HeaderValue>,
) -> Result<reqwest::Response, RegistryError> {
    let mut request = client.get(url.clone());
    if let Some(authorization) = authorization {
        request = request.header(AUTHORIZATION, authorization.clone());
    }
    request
        .send()
        .await
        .map_err(|error| RegistryError::Unreachable {
            host: host.to_owned(),
            message: without_url(&error),
        })
}

/// The Authorization header the challenge asks for.
async fn authorize(
    client: &Client,
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
    let mut request = client.get(realm);
    if let Some(header) = credentials.and_then(basic) {
        request = request.header(AUTHORIZATION, header);
    }
    let response = request
        .send()
        .await
        .map_err(|error| RegistryError::Unreachable {
            host: host.to_owned(),
            message: format!("its token service: {}", without_url(&error)),
        })?;
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
    let mut text = if error.is_timeout() {
        format!("no answer within {}s", REQUEST_TIMEOUT.as_secs())
    } else if error.is_connect() {
        "cannot connect".to_owned()
    } else {
        "request failed".to_owned()
    };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

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
