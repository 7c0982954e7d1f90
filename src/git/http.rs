//! The http(s) remote's client: gix speaks git's smart-HTTP protocol (`http::Transport`) and
//! this sends its requests through the agent's own HTTP stack, reqwest over HTTP/1.1 on the
//! process's TLS roots (`model::tls`), the stack webhooks, notifications and asset fetches
//! use. gix's own reqwest backend would bring a second configuration of it, with HTTP/2 and
//! charset decoding compiled in for git alone (issue 29).
//!
//! A request's body is buffered (a fetch's negotiation is a few KiB; at most
//! [`MAX_REQUEST_BODY`]) and sent when its response is first read. Errors come out of reading
//! the response's headers, as gix reads them: a 401 as `PermissionDenied` carrying the
//! server's `WWW-Authenticate` values, which makes gix ask for credentials and try again.
//!
//! Redirects are followed on the first request only (git's `http.followRedirects=initial`),
//! at most [`MAX_REDIRECTS`], never from https to http (the token would follow in clear
//! text), and only to a URL that still ends with the path asked for below the repository;
//! the rest of the fetch goes to the repository's new base. reqwest drops the
//! `Authorization` header on a redirect to another host.

use crate::base::lock;
use std::io::{self, BufRead, BufReader, Cursor, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gix::protocol::transport::client::AuthenticationRequired;
use gix::protocol::transport::client::blocking_io::http::{
    GetResponse, Http, PostBodyDataKind, PostResponse,
};
use reqwest::blocking::{RequestBuilder, Response};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, WWW_AUTHENTICATE};

/// The most redirects the first request follows (git's curl allows 20).
pub(super) const MAX_REDIRECTS: usize = 20;
/// The largest request body buffered: a fetch's wants and haves are far below it.
pub(super) const MAX_REQUEST_BODY: usize = 16 << 20;
/// How long a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one request may take, its response's body read to the end: what fetches had
/// under gix's reqwest backend (reqwest's blocking default), now said here.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One remote's HTTP client, for one fetch ([`Http`] for gix's `http::Transport`).
pub(crate) struct Client {
    client: reqwest::blocking::Client,
    redirects: Arc<Redirects>,
}

/// What the redirect policy and the client share.
#[derive(Default)]
struct Redirects {
    /// Whether the first request was sent: later ones follow no redirect.
    done: AtomicBool,
    /// The path below the repository of the request being sent: a redirect must keep it.
    tail: Mutex<String>,
    /// The repository's URL after an accepted redirect.
    base: Mutex<Option<String>>,
}

/// The HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build an HTTP client: {0}")]
pub(crate) struct BuildError(#[source] reqwest::Error);

impl Client {
    /// A client trusting what `tls` trusts.
    pub(crate) fn new(tls: rustls::ClientConfig) -> Result<Client, BuildError> {
        let redirects = Arc::new(Redirects::default());
        let shared = Arc::clone(&redirects);
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if shared.done.load(Ordering::Relaxed) {
                return attempt.stop();
            }
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            let from_https = attempt
                .previous()
                .last()
                .is_some_and(|previous| previous.scheme() == "https");
            if from_https && attempt.url().scheme() != "https" {
                let to = attempt.url().as_str().to_owned();
                return attempt.error(format!("refusing a redirect from https to {to}"));
            }
            let tail = lock(&shared.tail).clone();
            if tail.is_empty() || !attempt.url().as_str().ends_with(&tail) {
                let to = attempt.url().as_str().to_owned();
                return attempt.error(format!(
                    "refusing a redirect to {to}, which does not end with {tail}"
                ));
            }
            attempt.follow()
        });
        let client = reqwest::blocking::Client::builder()
            .tls_backend_preconfigured(tls)
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .redirect(policy)
            .build()
            .map_err(BuildError)?;
        Ok(Client { client, redirects })
    }

    /// The exchange for `url` (below `base_url`), sent when its response is first read.
    fn exchange(
        &mut self,
        request: impl FnOnce(&reqwest::blocking::Client, &str) -> RequestBuilder,
        url: &str,
        base_url: &str,
        headers: impl IntoIterator<Item = impl AsRef<str>>,
        body: Option<Arc<Mutex<Vec<u8>>>>,
    ) -> Exchange {
        // The path asked for below the repository: a redirect must keep it.
        let tail = url.strip_prefix(base_url).unwrap_or_default().to_owned();
        let effective = match lock(&self.redirects.base).as_deref() {
            Some(base) if !tail.is_empty() => format!("{base}{tail}"),
            _ => url.to_owned(),
        };
        let mut header_map = HeaderMap::new();
        for line in headers {
            let Some((name, value)) = line.as_ref().split_once(':') else {
                continue;
            };
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.trim().as_bytes()),
                HeaderValue::from_str(value.trim()),
            ) {
                header_map.append(name, value);
            }
        }
        let request = request(&self.client, &effective).headers(header_map);
        Exchange(Arc::new(Mutex::new(State {
            pending: Some(Pending {
                request,
                body,
                redirects: Arc::clone(&self.redirects),
                effective,
                tail,
            }),
            sent: Sent::default(),
        })))
    }
}

impl Http for Client {
    type Headers = Headers;
    type ResponseBody = Body;
    type PostBody = PostBody;

    fn get(
        &mut self,
        url: &str,
        base_url: &str,
        headers: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> gix::error::Result<GetResponse<Headers, Body>> {
        let exchange = self.exchange(|client, url| client.get(url), url, base_url, headers, None);
        Ok(GetResponse {
            headers: Headers::of(&exchange),
            body: Body::of(&exchange),
        })
    }

    fn post(
        &mut self,
        url: &str,
        base_url: &str,
        headers: impl IntoIterator<Item = impl AsRef<str>>,
        _kind: PostBodyDataKind,
    ) -> gix::error::Result<PostResponse<Headers, Body, PostBody>> {
        let body = Arc::new(Mutex::new(Vec::new()));
        let exchange = self.exchange(
            |client, url| client.post(url),
            url,
            base_url,
            headers,
            Some(Arc::clone(&body)),
        );
        Ok(PostResponse {
            post_body: PostBody(body),
            headers: Headers::of(&exchange),
            body: Body::of(&exchange),
        })
    }

    /// The repository's `http.*` settings are not read: the agent's mirrors are its own, and
    /// what a remote needs (a token, a CA) comes from the source's options.
    fn configure(&mut self, _config: &dyn std::any::Any) -> gix::error::Result {
        Ok(())
    }

    fn redirected_base_url(&self) -> Option<String> {
        lock(&self.redirects.base).clone()
    }
}

/// One request and, once sent, its response: shared by the response's headers and body,
/// whichever is read first sends it.
struct Exchange(Arc<Mutex<State>>);

struct State {
    /// The request until it is sent.
    pending: Option<Pending>,
    sent: Sent,
}

/// A request not sent yet.
struct Pending {
    request: RequestBuilder,
    /// What was written to the request's body (a POST).
    body: Option<Arc<Mutex<Vec<u8>>>>,
    redirects: Arc<Redirects>,
    /// The URL asked for, after an earlier redirect of the repository.
    effective: String,
    /// The part of the URL below the repository.
    tail: String,
}

/// What a sent request left for its readers to take.
#[derive(Default)]
struct Sent {
    /// The response's headers as `name:value` lines, or why there is no response.
    headers: Option<io::Result<Vec<u8>>>,
    response: Option<Response>,
}

impl Exchange {
    /// `take` on what the request left, the request sent first if it was not.
    fn sent<T>(&self, take: impl FnOnce(&mut Sent) -> T) -> T {
        let mut state = lock(&self.0);
        if let Some(pending) = state.pending.take() {
            state.sent = match send(pending) {
                Ok((headers, response)) => Sent {
                    headers: Some(Ok(headers)),
                    response: Some(response),
                },
                Err(error) => Sent {
                    headers: Some(Err(error)),
                    response: None,
                },
            };
        }
        take(&mut state.sent)
    }
}

/// Sends a pending request: its response's header lines and the response, or the error gix
/// expects for a failed request.
fn send(pending: Pending) -> io::Result<(Vec<u8>, Response)> {
    let Pending {
        mut request,
        body,
        redirects,
        effective,
        tail,
    } = pending;
    if let Some(body) = body {
        request = request.body(std::mem::take(&mut *lock(&body)));
    }
    lock(&redirects.tail).clone_from(&tail);
    let response = request.send();
    redirects.done.store(true, Ordering::Relaxed);
    let response = response.map_err(io::Error::other)?;
    // The policy followed only a redirect that kept `tail`.
    let landed = response.url().as_str();
    if landed != effective
        && let Some(base) = landed.strip_suffix(tail.as_str())
    {
        *lock(&redirects.base) = Some(base.to_owned());
    }
    let status = response.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        let www_authenticate = response
            .headers()
            .get_all(WWW_AUTHENTICATE)
            .iter()
            .map(|value| value.as_bytes().into())
            .collect();
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            AuthenticationRequired { www_authenticate },
        ));
    }
    if !status.is_success() {
        // gix retries what it reads as a dropped connection: a server error but 501.
        let kind = if status.is_server_error() && status != reqwest::StatusCode::NOT_IMPLEMENTED {
            io::ErrorKind::ConnectionAborted
        } else {
            io::ErrorKind::Other
        };
        return Err(io::Error::new(
            kind,
            format!("Received HTTP status {}", status.as_str()),
        ));
    }
    let mut lines = Vec::new();
    for (name, value) in response.headers() {
        lines.extend_from_slice(name.as_str().as_bytes());
        lines.push(b':');
        lines.extend_from_slice(value.as_bytes());
        lines.push(b'\n');
    }
    Ok((lines, response))
}

/// `Read` for a reader that sends its request on its first `fill_buf`.
fn read_buffered(reader: &mut impl BufRead, buf: &mut [u8]) -> io::Result<usize> {
    let available = reader.fill_buf()?;
    let n = available.len().min(buf.len());
    buf[..n].copy_from_slice(&available[..n]);
    reader.consume(n);
    Ok(n)
}

/// A response's headers, one `name:value` line each; reading them sends the request, and a
/// failed request is the error of the first read.
pub(crate) struct Headers {
    exchange: Exchange,
    lines: Option<Cursor<Vec<u8>>>,
}

impl Headers {
    fn of(exchange: &Exchange) -> Headers {
        Headers {
            exchange: Exchange(Arc::clone(&exchange.0)),
            lines: None,
        }
    }
}

impl Read for Headers {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        read_buffered(self, buf)
    }
}

impl BufRead for Headers {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.lines.is_none() {
            let lines = self.exchange.sent(|sent| sent.headers.take());
            self.lines = Some(Cursor::new(lines.transpose()?.unwrap_or_default()));
        }
        match &mut self.lines {
            Some(lines) => lines.fill_buf(),
            None => Ok(&[]),
        }
    }

    fn consume(&mut self, amount: usize) {
        if let Some(lines) = &mut self.lines {
            lines.consume(amount);
        }
    }
}

/// A response's body, streamed; reading it sends the request. Empty when the request failed
/// (its headers carry the error).
pub(crate) struct Body {
    exchange: Exchange,
    response: Option<BufReader<Response>>,
}

impl Body {
    fn of(exchange: &Exchange) -> Body {
        Body {
            exchange: Exchange(Arc::clone(&exchange.0)),
            response: None,
        }
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        read_buffered(self, buf)
    }
}

impl BufRead for Body {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.response.is_none() {
            match self.exchange.sent(|sent| sent.response.take()) {
                Some(response) => self.response = Some(BufReader::new(response)),
                None => return Ok(&[]),
            }
        }
        match &mut self.response {
            Some(response) => response.fill_buf(),
            None => Ok(&[]),
        }
    }

    fn consume(&mut self, amount: usize) {
        if let Some(response) = &mut self.response {
            response.consume(amount);
        }
    }
}

/// A request's body, buffered until the response is read.
pub(crate) struct PostBody(Arc<Mutex<Vec<u8>>>);

impl Write for PostBody {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut body = lock(&self.0);
        if body.len().saturating_add(buf.len()) > MAX_REQUEST_BODY {
            return Err(io::Error::other(format!(
                "a request body over {MAX_REQUEST_BODY} bytes"
            )));
        }
        body.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// What the test server was asked: method, path and body of each request.
    type Seen = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

    /// A loopback HTTP server answering each request with `answer(method, path)` (a status
    /// line's code, headers, body), one request a connection.
    fn server(
        answer: impl Fn(&str, &str) -> (u16, Vec<String>, &'static str) + Send + 'static,
    ) -> (String, Seen) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("its address"));
        let seen: Seen = Arc::default();
        let record = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let mut reader = BufReader::new(stream);
                let mut head = String::new();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                    head.push_str(&line);
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let mut words = head.split_whitespace();
                let method = words.next().unwrap_or_default().to_owned();
                let path = words.next().unwrap_or_default().to_owned();
                let (code, headers, text) = answer(&method, &path);
                lock(&record).push((method, path, body));
                let mut response = format!("HTTP/1.1 {code} X\r\nConnection: close\r\n");
                for header in headers {
                    response.push_str(&header);
                    response.push_str("\r\n");
                }
                response.push_str(&format!("Content-Length: {}\r\n\r\n{text}", text.len()));
                let _ = reader.get_mut().write_all(response.as_bytes());
            }
        });
        (base, seen)
    }

    fn client() -> Client {
        let tls = crate::model::tls::client_config().expect("the platform's roots");
        Client::new(tls).expect("a client")
    }

    fn read_headers(mut headers: Headers) -> io::Result<String> {
        let mut text = String::new();
        headers.read_to_string(&mut text)?;
        Ok(text)
    }

    const REFS: &str = "/info/refs?service=git-upload-pack";

    #[test]
    fn the_first_request_follows_a_redirect_and_the_rest_go_to_the_new_base()
    -> Result<(), Box<dyn std::error::Error>> {
        let (base, seen) = server(|method, path| match (method, path) {
            ("GET", path) if path.starts_with("/old/") => (
                301,
                vec![format!("Location: {}", path.replacen("/old/", "/new/", 1))],
                "",
            ),
            ("GET", _) => (200, vec!["Content-Type: application/x-git".into()], "refs"),
            _ => (200, vec![], "result"),
        });
        let mut client = client();
        let repo = format!("{base}/old");
        let response = client.get(&format!("{repo}{REFS}"), &repo, ["Git-Protocol: version=2"])?;
        assert!(read_headers(response.headers)?.contains("content-type:application/x-git"));
        let mut body = String::new();
        { response.body }.read_to_string(&mut body)?;
        assert_eq!(body, "refs");
        assert_eq!(client.redirected_base_url(), Some(format!("{base}/new")));

        let mut post = client.post(
            &format!("{repo}/git-upload-pack"),
            &repo,
            ["Content-Type: application/x-git-upload-pack-request"],
            PostBodyDataKind::BoundedAndFitsIntoMemory,
        )?;
        post.post_body.write_all(b"0000want")?;
        drop(post.post_body);
        read_headers(post.headers)?;
        let requests = lock(&seen).clone();
        let asked: Vec<(&str, &str, &[u8])> = requests
            .iter()
            .map(|(method, path, body)| (method.as_str(), path.as_str(), body.as_slice()))
            .collect();
        assert_eq!(
            asked,
            [
                ("GET", "/old/info/refs?service=git-upload-pack", &b""[..]),
                ("GET", "/new/info/refs?service=git-upload-pack", &b""[..]),
                ("POST", "/new/git-upload-pack", &b"0000want"[..]),
            ]
        );
        Ok(())
    }

    #[test]
    fn only_the_first_request_follows_and_only_below_the_repository()
    -> Result<(), Box<dyn std::error::Error>> {
        let (base, seen) = server(|_, path| match path {
            "/moved/info/refs?service=git-upload-pack" => {
                (302, vec!["Location: /elsewhere".into()], "")
            }
            _ => (200, vec![], "not the repository"),
        });
        let repo = format!("{base}/moved");
        let response = client().get(&format!("{repo}{REFS}"), &repo, [""; 0])?;
        let error = read_headers(response.headers).expect_err("the path below it is gone");
        let chain = super::super::error_chain(&error);
        assert!(
            chain.contains("refusing a redirect to") && chain.contains("/elsewhere"),
            "{chain}"
        );
        assert_eq!(lock(&seen).len(), 1, "the redirect was not followed");

        // A later request (here a POST after a first GET) is not redirected: the 301 is its
        // answer, an error.
        let (base, _) = server(|method, _| match method {
            "GET" => (200, vec![], "refs"),
            _ => (301, vec!["Location: /somewhere/else".into()], ""),
        });
        let mut client = client();
        let repo = format!("{base}/repo");
        read_headers(
            client
                .get(&format!("{repo}{REFS}"), &repo, [""; 0])?
                .headers,
        )?;
        let post = client.post(
            &format!("{repo}/git-upload-pack"),
            &repo,
            [""; 0],
            PostBodyDataKind::BoundedAndFitsIntoMemory,
        )?;
        drop(post.post_body);
        let error = read_headers(post.headers).expect_err("a 301 is not followed");
        assert_eq!(error.to_string(), "Received HTTP status 301");
        assert_eq!(client.redirected_base_url(), None);
        Ok(())
    }

    #[test]
    fn a_401_asks_for_credentials_with_the_server_s_challenge()
    -> Result<(), Box<dyn std::error::Error>> {
        let (base, _) = server(|_, _| {
            (
                401,
                vec!["WWW-Authenticate: Basic realm=\"git\"".into()],
                "",
            )
        });
        let repo = format!("{base}/private");
        let response = client().get(&format!("{repo}{REFS}"), &repo, [""; 0])?;
        let error = read_headers(response.headers).expect_err("401");
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        let challenge = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<AuthenticationRequired>())
            .map(|required| required.www_authenticate.clone());
        assert_eq!(challenge, Some(vec!["Basic realm=\"git\"".into()]));
        let mut body = Vec::new();
        { response.body }.read_to_end(&mut body)?;
        assert!(body.is_empty());
        Ok(())
    }

    #[test]
    fn a_request_body_is_bounded() {
        let mut body = PostBody(Arc::default());
        assert!(body.write_all(&vec![0; MAX_REQUEST_BODY]).is_ok());
        assert!(body.write_all(b"x").is_err());
    }
}
