//! A private image registry for Docker tests: a minimal Docker Registry HTTP API v2 server
//! (plain HTTP on loopback, which dockerd treats as an insecure registry) that requires HTTP
//! Basic auth on every `/v2/...` request and serves one image — manifest (schema2), config
//! and layer blobs — built from `docker save` of a locally present image. Every request is
//! recorded (method, path, what credentials it carried, status, bytes of body sent) so a
//! test can assert what the engine presented and what was refused.

use std::collections::BTreeMap;
use std::io::{BufReader, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use voodu_agent::manifest::spec::sha256_hex;

use super::TestResult;
use super::http::{RequestHead, read_request_head};

pub const MANIFEST_V2: &str = "application/vnd.docker.distribution.manifest.v2+json";
const CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// Uncompressed layer tars, as `docker save` writes them (allowed in schema2).
const LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";

/// One image as a registry holds it: the manifest bytes and every blob by digest.
#[derive(Debug, Clone)]
pub struct Image {
    pub manifest: Vec<u8>,
    /// `sha256:<hex>` of `manifest`.
    pub manifest_digest: String,
    /// `sha256:<hex>` → bytes: the config and the layers.
    pub blobs: BTreeMap<String, Vec<u8>>,
    /// Digests of the layers, in manifest order (the nonce layer last).
    pub layers: Vec<String>,
    pub config_digest: String,
}

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

impl Image {
    /// The content of the local image `reference` plus one layer of its own: `docker save`,
    /// unpacked with `tar`, its `manifest.json` read; the layer tars are served as they are
    /// (uncompressed, so the config's `rootfs.diff_ids` are their digests). The extra layer
    /// holds the file `/voodu-registry-nonce` with `nonce`, so the config (the image id) and
    /// that layer are new to the engine and a pull has to fetch them: an image whose config
    /// the engine already has is "up to date" after the manifest alone.
    pub fn from_local(reference: &str, nonce: &str) -> TestResult<Image> {
        let dir = tempfile::tempdir()?;
        let archive = dir.path().join("image.tar");
        run(Command::new("docker")
            .args(["save", "-o"])
            .arg(&archive)
            .arg(reference))?;
        let unpacked = dir.path().join("unpacked");
        std::fs::create_dir(&unpacked)?;
        run(Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&unpacked))?;
        let files = dir.path().join("nonce");
        std::fs::create_dir(&files)?;
        std::fs::write(files.join("voodu-registry-nonce"), nonce)?;
        let extra = dir.path().join("nonce.tar");
        run(Command::new("tar")
            .arg("-cf")
            .arg(&extra)
            .arg("-C")
            .arg(&files)
            .arg("voodu-registry-nonce"))?;
        Image::from_saved(&unpacked, std::fs::read(&extra)?)
    }

    /// An image from an unpacked `docker save` archive at `dir`, with `extra` (a layer tar)
    /// on top.
    fn from_saved(dir: &Path, extra: Vec<u8>) -> TestResult<Image> {
        let saved: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json"))?)?;
        let entry = saved
            .as_array()
            .and_then(|entries| entries.first())
            .ok_or("manifest.json lists no image")?;
        let mut layer_tars = Vec::new();
        for path in entry["Layers"].as_array().ok_or("no Layers")? {
            layer_tars.push(std::fs::read(dir.join(path.as_str().ok_or("layer path")?))?);
        }
        let extra_digest = digest_of(&extra);
        layer_tars.push(extra);
        let mut config: Value = serde_json::from_slice(&std::fs::read(
            dir.join(entry["Config"].as_str().ok_or("no Config")?),
        )?)?;
        config["rootfs"]["diff_ids"]
            .as_array_mut()
            .ok_or("config has no rootfs.diff_ids")?
            .push(json!(extra_digest));
        if let Some(history) = config["history"].as_array_mut() {
            history.push(json!({
                "created": "2024-01-01T00:00:00Z",
                "created_by": "voodu registry test: /voodu-registry-nonce",
            }));
        }
        let config = serde_json::to_vec(&config)?;
        let config_digest = digest_of(&config);
        let mut blobs = BTreeMap::new();
        let mut layers = Vec::new();
        let mut descriptors = Vec::new();
        for bytes in layer_tars {
            let digest = digest_of(&bytes);
            descriptors.push(json!({
                "mediaType": LAYER_TAR,
                "size": bytes.len(),
                "digest": digest,
            }));
            layers.push(digest.clone());
            blobs.insert(digest, bytes);
        }
        let manifest = serde_json::to_vec_pretty(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_V2,
            "config": {
                "mediaType": CONFIG,
                "size": config.len(),
                "digest": config_digest,
            },
            "layers": descriptors,
        }))?;
        blobs.insert(config_digest.clone(), config);
        Ok(Image {
            manifest_digest: digest_of(&manifest),
            manifest,
            blobs,
            layers,
            config_digest,
        })
    }

    /// The digest of the layer only this image has (the nonce layer, the last one).
    pub fn own_layer(&self) -> Option<&str> {
        self.layers.last().map(String::as_str)
    }
}

fn run(command: &mut Command) -> TestResult {
    let output = command.output()?;
    if !output.status.success() {
        return Err(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(())
}

/// What credentials a request carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not Basic with the expected user and token.
    Invalid,
    /// Basic with the expected user and token.
    Valid,
}

/// One request the registry answered.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub auth: Auth,
    pub status: u16,
    /// Body bytes sent (0 for HEAD).
    pub bytes: u64,
    /// When the answer was sent.
    pub at: Instant,
}

/// The registry server: serves `image` as `<repository>:<tag>` to `username`/`token` until
/// dropped.
pub struct Registry {
    pub address: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

struct Served {
    repository: String,
    tag: String,
    image: Image,
    /// The exact `Authorization` value a valid request carries.
    expected: String,
}

impl Registry {
    pub fn start(
        repository: &str,
        tag: &str,
        image: Image,
        username: &str,
        token: &str,
    ) -> TestResult<Registry> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(Served {
            repository: repository.to_owned(),
            tag: tag.to_owned(),
            image,
            expected: format!("Basic {}", base64(format!("{username}:{token}").as_bytes())),
        });
        let (keep, stopping) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (served, keep) = (served.clone(), keep.clone());
                std::thread::spawn(move || {
                    let _ = serve_connection(stream, &served, &keep);
                });
            }
        });
        Ok(Registry {
            address,
            seen,
            stop,
        })
    }

    /// `127.0.0.1:<port>`, the registry host of image references.
    pub fn host(&self) -> String {
        self.address.to_string()
    }

    /// Every request answered so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.address);
    }
}

/// Answers requests on one connection (HTTP/1.1 keep-alive) until the client closes it.
fn serve_connection(stream: TcpStream, served: &Served, seen: &Mutex<Vec<Seen>>) -> TestResult {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let Some(RequestHead {
            method,
            target,
            headers,
        }) = read_request_head(&mut reader)?
        else {
            return Ok(());
        };
        let length: u64 = headers
            .get("content-length")
            .map_or(Ok(0), |value| value.parse())?;
        std::io::copy(
            &mut std::io::Read::take(&mut reader, length),
            &mut std::io::sink(),
        )?;
        let path = target.split('?').next().unwrap_or_default().to_owned();
        let auth = match headers.get("authorization") {
            None => Auth::Missing,
            Some(value) if *value == served.expected => Auth::Valid,
            Some(_) => Auth::Invalid,
        };
        let close = headers
            .get("connection")
            .is_some_and(|value| value.eq_ignore_ascii_case("close"));
        let response = respond(served, &method, &path, auth);
        let head_only = method == "HEAD";
        let mut head = format!(
            "HTTP/1.1 {} {}\r\n",
            response.status,
            reason(response.status)
        );
        head.push_str("Docker-Distribution-API-Version: registry/2.0\r\n");
        for (name, value) in &response.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", response.body.len()));
        writer.write_all(head.as_bytes())?;
        let bytes = if head_only {
            0
        } else {
            writer.write_all(response.body)?;
            response.body.len() as u64
        };
        writer.flush()?;
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Seen {
                method,
                path,
                auth,
                status: response.status,
                bytes,
                at: Instant::now(),
            });
        if close {
            return Ok(());
        }
    }
}

/// `GET path` on `address` with `authorization` (if any) as the `Authorization` header, over
/// a plain socket → the status and the `WWW-Authenticate` header (empty when absent).
pub fn probe(
    address: SocketAddr,
    path: &str,
    authorization: Option<&str>,
) -> TestResult<(u16, String)> {
    use std::io::Read as _;
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let authorization = authorization
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    stream.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Connection: close\r\n\r\n"
        )
        .as_bytes(),
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response);
    let (head, _) = response.split_once("\r\n\r\n").ok_or("no end of headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .ok_or("no status code")?
        .parse()?;
    let challenge = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("www-authenticate"))
        .map(|(_, value)| value.trim().to_owned())
        .unwrap_or_default();
    Ok((status, challenge))
}

struct Response<'a> {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: &'a [u8],
}

const UNAUTHORIZED: &[u8] =
    br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}"#;
const UNKNOWN: &[u8] = br#"{"errors":[{"code":"NAME_UNKNOWN","message":"repository name not known to registry","detail":null}]}"#;

fn respond<'a>(served: &'a Served, method: &str, path: &str, auth: Auth) -> Response<'a> {
    let json = || ("Content-Type", "application/json".to_owned());
    if !path.starts_with("/v2/") {
        return Response {
            status: 404,
            headers: vec![json()],
            body: b"{}",
        };
    }
    if auth != Auth::Valid {
        return Response {
            status: 401,
            headers: vec![
                json(),
                ("WWW-Authenticate", r#"Basic realm="voodu-test""#.to_owned()),
            ],
            body: UNAUTHORIZED,
        };
    }
    let not_found = Response {
        status: 404,
        headers: vec![json()],
        body: UNKNOWN,
    };
    if method != "GET" && method != "HEAD" {
        return Response {
            status: 405,
            headers: vec![json()],
            body: b"{}",
        };
    }
    if path == "/v2/" {
        return Response {
            status: 200,
            headers: vec![json()],
            body: b"{}",
        };
    }
    let prefix = format!("/v2/{}/", served.repository);
    let Some(rest) = path.strip_prefix(&prefix) else {
        return not_found;
    };
    let image = &served.image;
    if let Some(reference) = rest.strip_prefix("manifests/") {
        if reference != served.tag && reference != image.manifest_digest {
            return not_found;
        }
        return Response {
            status: 200,
            headers: vec![
                ("Content-Type", MANIFEST_V2.to_owned()),
                ("Docker-Content-Digest", image.manifest_digest.clone()),
            ],
            body: &image.manifest,
        };
    }
    if let Some(digest) = rest.strip_prefix("blobs/")
        && let Some(blob) = image.blobs.get(digest)
    {
        return Response {
            status: 200,
            headers: vec![
                ("Content-Type", "application/octet-stream".to_owned()),
                ("Docker-Content-Digest", digest.to_owned()),
            ],
            body: blob,
        };
    }
    not_found
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Error",
    }
}

/// Standard base64 with padding (RFC 4648), for the expected Basic credentials.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }
}
