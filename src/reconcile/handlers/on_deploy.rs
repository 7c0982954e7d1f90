//! `on_deploy` webhooks (spec §7.11): when a release of a deployment ends, its `success` or
//! `failure` targets get voodu's payload (or the target's own `body` / `file` template with
//! `{{token}}`s filled in), with up to 3 attempts (pauses of 1 s and 5 s), 10 s per attempt and
//! a 2-minute budget. voodu never wires its poster; the agent does.
//!
//! Invariants: delivery never blocks or fails a rollout (handlers only enqueue; a tracked task
//! delivers); headers set by the operator are sent, then `User-Agent: voodu-deploy-webhook`
//! replaces any; environment values are never part of a payload unless the template puts them
//! there; a log line names a target by its `scheme://host[:port]` only (the manifest may put
//! a secret in the URL's path, query or user), and a client error without its URL. Sealed
//! from the host: a request connects only where `url()` may (`Outbound`: an address host
//! judged before any connection, a name on every address it resolves to, every redirect
//! hop), and a `file` template is read only from an asset file of a scope the resource's own
//! source owns, named by one reference in voodu's grammar (nothing else is ever opened).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::assets::url_guard::Outbound;
use crate::manifest::spec::WebhookTarget;
use crate::model::scopes::Ownership;
use crate::model::{ResourceKey, asset_dir, is_ref_segment};
use crate::reconcile::run::timer::{Timer, What};

/// Pauses between attempts, and the limits of one delivery.
const RETRY_PAUSES: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(5)];
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
const BUDGET: Duration = Duration::from_secs(120);
const USER_AGENT: &str = "voodu-deploy-webhook";

/// How a release ended, for its webhooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) key: ResourceKey,
    pub(crate) success: bool,
    pub(crate) release_id: String,
    pub(crate) image: String,
    pub(crate) started_at: String,
    pub(crate) completed_at: String,
    pub(crate) error: String,
}

impl Outcome {
    /// voodu's default payload, in its field order (empty fields omitted).
    pub(crate) fn payload(&self) -> String {
        #[derive(serde::Serialize)]
        struct Payload<'a> {
            kind: &'a str,
            scope: &'a str,
            name: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            release_id: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            image: &'a str,
            status: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            started_at: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            completed_at: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            error: &'a str,
        }
        serde_json::to_string(&Payload {
            kind: "deployment",
            scope: &self.key.scope,
            name: &self.key.name,
            release_id: &self.release_id,
            image: &self.image,
            status: if self.success { "success" } else { "failure" },
            started_at: &self.started_at,
            completed_at: &self.completed_at,
            error: &self.error,
        })
        .expect("a struct of strings serialises")
    }

    /// The `{{token}}`s of spec §3.3 and their values.
    fn tokens(&self) -> [(&'static str, String); 9] {
        [
            ("{{kind}}", "deployment".to_owned()),
            ("{{scope}}", self.key.scope.clone()),
            ("{{name}}", self.key.name.clone()),
            ("{{release_id}}", self.release_id.clone()),
            ("{{image}}", self.image.clone()),
            (
                "{{status}}",
                (if self.success { "success" } else { "failure" }).to_owned(),
            ),
            ("{{error}}", self.error.clone()),
            ("{{started_at}}", self.started_at.clone()),
            ("{{completed_at}}", self.completed_at.clone()),
        ]
    }

    /// Fills `{{token}}`s in every string value of `template` (keys untouched).
    pub(crate) fn fill(&self, template: &Value) -> Value {
        match template {
            Value::String(text) => {
                let mut text = text.clone();
                for (token, value) in self.tokens() {
                    text = text.replace(token, &value);
                }
                Value::String(text)
            }
            Value::Array(items) => Value::Array(items.iter().map(|item| self.fill(item)).collect()),
            Value::Object(map) => {
                // Inserted, not collected: see `model::map_of`.
                let mut filled = serde_json::Map::new();
                for (key, value) in map {
                    filled.insert(key.clone(), self.fill(value));
                }
                Value::Object(filled)
            }
            other => other.clone(),
        }
    }
}

/// One delivery to make.
#[derive(Debug, Clone)]
struct Delivery {
    outcome: Outcome,
    targets: Vec<WebhookTarget>,
}

/// Where handlers hand release outcomes over for delivery.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    sender: mpsc::UnboundedSender<Delivery>,
}

impl Notifier {
    /// A notifier and the task that delivers what it is given (run it on the agent's
    /// tracker; it ends at `shutdown` after the delivery in progress).
    pub(crate) fn new(
        reach: Reach,
        timer: Timer,
        shutdown: CancellationToken,
    ) -> (Notifier, impl std::future::Future<Output = ()> + Send) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (
            Notifier { sender },
            deliver_all(receiver, reach, timer, shutdown),
        )
    }

    /// Queues `outcome` for `targets` (nothing when there are none).
    pub(crate) fn notify(&self, outcome: Outcome, targets: Vec<WebhookTarget>) {
        if targets.is_empty() {
            return;
        }
        if self.sender.send(Delivery { outcome, targets }).is_err() {
            tracing::debug!("webhook notifier stopped; a delivery was dropped");
        }
    }
}

/// What deliveries may reach: where they may connect, and the asset files they may read.
#[derive(Debug, Clone)]
pub(crate) struct Reach {
    pub(crate) outbound: Outbound,
    /// `<data-dir>/assets`.
    pub(crate) assets_root: PathBuf,
    pub(crate) ownership: std::sync::Arc<Ownership>,
}

async fn deliver_all(
    mut receiver: mpsc::UnboundedReceiver<Delivery>,
    reach: Reach,
    timer: Timer,
    shutdown: CancellationToken,
) {
    let client = match reach.outbound.client(ATTEMPT_TIMEOUT) {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "cannot build the webhook HTTP client; on_deploy webhooks are off");
            return;
        }
    };
    loop {
        let delivery = tokio::select! {
            delivery = receiver.recv() => match delivery {
                Some(delivery) => delivery,
                None => return,
            },
            () = shutdown.cancelled() => return,
        };
        // Targets of one delivery go out side by side, each with its own retries.
        let sends = delivery
            .targets
            .iter()
            .map(|target| deliver(&client, &reach, &timer, &delivery.outcome, target));
        futures_util::future::join_all(sends).await;
    }
}

/// Sends one target, retrying; failures are logged and dropped.
async fn deliver(
    client: &reqwest::Client,
    reach: &Reach,
    timer: &Timer,
    outcome: &Outcome,
    target: &WebhookTarget,
) {
    let url = origin(&target.url);
    if reach.outbound.check(&target.url).is_err() {
        tracing::error!(key = %outcome.key, %url, "on_deploy webhook refused by the address rules (--allow-url-host): nothing sent");
        return;
    }
    let body = match body(reach, outcome, target) {
        Ok(body) => body,
        Err(problem) => {
            tracing::warn!(key = %outcome.key, %url, %problem, "webhook template unusable; sending the default payload");
            outcome.payload()
        }
    };
    let method = reqwest::Method::from_bytes(if target.method.is_empty() {
        b"POST"
    } else {
        target.method.as_bytes()
    })
    .unwrap_or(reqwest::Method::POST);
    let started = Instant::now();
    for attempt in 0..=RETRY_PAUSES.len() {
        let mut request = client
            .request(method.clone(), &target.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        for (name, value) in &target.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        request = request
            .header(reqwest::header::USER_AGENT, USER_AGENT)
            .body(body.to_string());
        match request.send().await {
            Ok(response) if response.status().is_success() => {
                tracing::info!(key = %outcome.key, %url, status = response.status().as_u16(), "on_deploy webhook delivered");
                return;
            }
            Ok(response) => {
                tracing::warn!(key = %outcome.key, %url, status = response.status().as_u16(), attempt = attempt + 1, "on_deploy webhook refused")
            }
            Err(error) => {
                if Outbound::refusal(&error).is_some() {
                    tracing::error!(key = %outcome.key, %url, "on_deploy webhook refused by the address rules (--allow-url-host): nothing sent");
                    return;
                }
                let error = causes(error);
                tracing::warn!(key = %outcome.key, %url, %error, attempt = attempt + 1, "on_deploy webhook failed")
            }
        }
        let Some(pause) = RETRY_PAUSES.get(attempt) else {
            break;
        };
        if started.elapsed() + *pause > BUDGET {
            break;
        }
        timer.sleep(What::Notify, *pause).await;
    }
    tracing::error!(key = %outcome.key, %url, "on_deploy webhook given up");
}

/// What a log line may say of `url`: `scheme://host[:port]`, never its user, path or query.
fn origin(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(parsed) => match (parsed.host_str(), parsed.port()) {
            (Some(host), Some(port)) => format!("{}://{host}:{port}", parsed.scheme()),
            (Some(host), None) => format!("{}://{host}", parsed.scheme()),
            (None, _) => format!("{}:", parsed.scheme()),
        },
        Err(_) => "(not a URL)".to_owned(),
    }
}

/// A client error's causes (`connection refused`, `operation timed out`) without its URL.
fn causes(error: reqwest::Error) -> String {
    let mut chain = String::new();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // hyper's wrappers repeat what they wrap; once is enough.
        if !chain.ends_with(&cause_text) {
            chain.push_str(": ");
            chain.push_str(&cause_text);
        }
        source = cause.source();
    }
    format!("{}{chain}", error.without_url())
}

/// The body of one target: its `body` object, its `file` template (an asset), or voodu's
/// default payload; `{{token}}`s filled in.
fn body(reach: &Reach, outcome: &Outcome, target: &WebhookTarget) -> Result<String, TemplateError> {
    if let Some(template) = &target.body {
        return Ok(outcome.fill(template).to_string());
    }
    if !target.file.is_empty() {
        let path = template_path(reach, &outcome.key, &target.file)?;
        let bytes = read_bounded(&path).map_err(|error| TemplateError::Read {
            path: path.clone(),
            error,
        })?;
        let template: Value = serde_json::from_slice(&bytes)
            .map_err(|error| TemplateError::NotJson { path, error })?;
        return Ok(outcome.fill(&template).to_string());
    }
    Ok(outcome.payload())
}

/// Why a `file` template cannot be used (the default payload is sent instead).
#[derive(Debug, thiserror::Error)]
enum TemplateError {
    #[error("file {0:?} is not one asset reference")]
    NotOneReference(String),
    /// The asset belongs to a scope of another source (`model::scopes::foreign` says whose).
    #[error("{0}")]
    Foreign(String),
    #[error("reading {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{} is not JSON: {error}", path.display())]
    NotJson {
        path: PathBuf,
        error: serde_json::Error,
    },
}

/// The largest `file` template read.
const MAX_TEMPLATE_BYTES: u64 = 1024 * 1024;

/// The asset file `file` names for a resource `key`: exactly one `${asset.<scope>.<name>.<key>}`
/// or `${asset.<name>.<key>}` in voodu's grammar, of a scope `key`'s source owns.
fn template_path(reach: &Reach, key: &ResourceKey, file: &str) -> Result<PathBuf, TemplateError> {
    let not_one = || TemplateError::NotOneReference(file.to_owned());
    let inner = file
        .strip_prefix("${asset.")
        .and_then(|rest| rest.strip_suffix('}'))
        .filter(|inner| !inner.contains(['{', '}']))
        .ok_or_else(not_one)?;
    let segments: Vec<&str> = inner.split('.').collect();
    if !segments.iter().all(|segment| is_ref_segment(segment)) {
        return Err(not_one());
    }
    let (scope, name, asset_key) = match segments.as_slice() {
        [scope, name, asset_key] => (*scope, *name, *asset_key),
        [name, asset_key] => ("", *name, *asset_key),
        _ => return Err(not_one()),
    };
    if !reach.ownership.same_owner(scope, &key.scope) {
        return Err(TemplateError::Foreign(crate::model::scopes::foreign(
            &format!("asset {file}"),
            reach.ownership.owner_of(&key.scope).unwrap_or_default(),
            reach.ownership.owner_of(scope),
        )));
    }
    Ok(asset_dir(&reach.assets_root, scope, name).join(asset_key))
}

/// Reads at most `MAX_TEMPLATE_BYTES` of `path`, a regular file that is not a link.
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let metadata = std::fs::symlink_metadata(path)?;
    if !metadata.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_TEMPLATE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_TEMPLATE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_TEMPLATE_BYTES} bytes"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    fn outcome(success: bool) -> Outcome {
        Outcome {
            key: ResourceKey::new(Kind::Deployment, "prod", "api"),
            success,
            release_id: "7".into(),
            image: "api:2".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            completed_at: "2026-01-01T00:01:00Z".into(),
            error: if success {
                String::new()
            } else {
                "boom".into()
            },
        }
    }

    /// Where a test's log lines go.
    #[derive(Clone, Default)]
    struct Written(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .expect("not poisoned")
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Written {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
        }
    }

    /// Issue 47: a manifest's webhook URL may carry a secret in its user, path or query; the
    /// log names the target by `scheme://host:port` only, whether it refused (a 404 page that
    /// echoes the path) or could not be reached.
    #[tokio::test]
    async fn log_lines_name_a_target_by_its_origin_only() -> Result<(), Box<dyn std::error::Error>>
    {
        use std::io::{BufRead as _, Write as _};
        let written = Written::default();
        let writer = written.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .finish();
        let _logging = tracing::subscriber::set_default(subscriber);
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut line = String::new();
                let mut reader = std::io::BufReader::new(&stream);
                let _ = reader.read_line(&mut line);
                let page = format!("Cannot POST {}", line.split(' ').nth(1).unwrap_or_default());
                let _ = (&stream).write_all(
                    format!(
                        "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                        page.len()
                    )
                    .as_bytes(),
                );
            }
        });
        // A port nothing listens on: bound, then let go.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(crate::model::tls::client_config()?)
            .timeout(ATTEMPT_TIMEOUT)
            .build()?;
        let dir = tempfile::tempdir()?;
        // Loopback receivers: allowed as the host would allow them.
        let reach = Reach {
            outbound: Outbound::new(&["127.0.0.1".to_owned()], None)?,
            assets_root: dir.path().to_owned(),
            ownership: std::sync::Arc::new(Ownership::single()),
        };
        for (port, logged) in [
            (port, "on_deploy webhook refused"),
            (closed, "on_deploy webhook failed"),
        ] {
            let target = WebhookTarget {
                url: format!("http://us3r:pa55w0rd@127.0.0.1:{port}/hooks/s3cret?token=s3cret"),
                ..WebhookTarget::default()
            };
            // No task serves this timer: the delivery stops at its first pause.
            let timer = Timer::default();
            let failed = outcome(false);
            tokio::select! {
                () = deliver(&client, &reach, &timer, &failed, &target) => {
                    return Err("the delivery ended without a retry".into());
                }
                () = async {
                    while !written.text().contains(logged) {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                } => {}
            }
            let logs = written.text();
            assert!(
                logs.contains(&format!("url=http://127.0.0.1:{port} ")),
                "{logs}"
            );
        }
        let logs = written.text();
        assert!(logs.contains("Connection refused"), "the cause: {logs}");
        for secret in ["s3cret", "us3r", "pa55w0rd"] {
            assert!(!logs.contains(secret), "{secret} in: {logs}");
        }
        Ok(())
    }

    #[test]
    fn the_default_payload_is_voodus() {
        assert_eq!(
            outcome(true).payload(),
            r#"{"kind":"deployment","scope":"prod","name":"api","release_id":"7","image":"api:2","status":"success","started_at":"2026-01-01T00:00:00Z","completed_at":"2026-01-01T00:01:00Z"}"#
        );
        assert!(outcome(false).payload().ends_with(r#","error":"boom"}"#));
    }

    #[test]
    fn tokens_fill_string_values_only() {
        let template = serde_json::json!({
            "text": "{{name}} {{status}}: {{error}} ({{unknown}})",
            "tags": ["env:{{scope}}", 3],
            "{{name}}": {"when": "{{completed_at}}"}
        });
        assert_eq!(
            outcome(false).fill(&template),
            serde_json::json!({
                "text": "api failure: boom ({{unknown}})",
                "tags": ["env:prod", 3],
                "{{name}}": {"when": "2026-01-01T00:01:00Z"}
            })
        );
    }

    #[test]
    fn a_file_template_is_read_from_the_asset() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("prod/hooks"))?;
        std::fs::write(
            dir.path().join("prod/hooks/pd"),
            r#"{"summary": "{{name}} failed: {{error}}"}"#,
        )?;
        let target = WebhookTarget {
            url: "http://x".into(),
            file: "${asset.prod.hooks.pd}".into(),
            ..WebhookTarget::default()
        };
        let reach = Reach {
            outbound: Outbound::default(),
            assets_root: dir.path().to_owned(),
            ownership: std::sync::Arc::new(Ownership::single()),
        };
        assert_eq!(
            body(&reach, &outcome(false), &target)?,
            r#"{"summary":"api failed: boom"}"#
        );
        Ok(())
    }

    #[test]
    fn a_file_template_is_one_reference_of_the_resources_own_source()
    -> Result<(), Box<dyn std::error::Error>> {
        use crate::model::scopes::ScopePattern;
        let ownership = Ownership::new(vec![
            ("shop".to_owned(), vec![ScopePattern::parse("shop")?]),
            ("blog".to_owned(), vec![ScopePattern::parse("blog")?]),
        ])?;
        let reach = Reach {
            outbound: Outbound::default(),
            assets_root: PathBuf::from("/data/assets"),
            ownership: std::sync::Arc::new(ownership),
        };
        let blog = ResourceKey::new(Kind::Deployment, "blog", "web");
        assert_eq!(
            template_path(&reach, &blog, "${asset.blog.hooks.pd}")?,
            PathBuf::from("/data/assets/blog/hooks/pd")
        );
        for refused in [
            "${asset.shop.cfg.json}",
            "${asset.a.b./etc/shadow}",
            "${asset.blog.hooks.pd}x",
            "/etc/shadow",
            "${asset.blog.hooks.pd}${asset.blog.hooks.pd}",
            "${asset.blog.hooks.../../x}",
        ] {
            assert!(
                template_path(&reach, &blog, refused).is_err(),
                "{refused} accepted"
            );
        }
        Ok(())
    }

    /// Issue 47: a target the address rules refuse (loopback, by address or by a name that
    /// resolves to it) is never connected to, and its delivery ends at once.
    #[tokio::test]
    async fn a_refused_target_sees_no_connection() -> Result<(), Box<dyn std::error::Error>> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let dir = tempfile::tempdir()?;
        let reach = Reach {
            outbound: Outbound::default(),
            assets_root: dir.path().to_owned(),
            ownership: std::sync::Arc::new(Ownership::single()),
        };
        let client = reach.outbound.client(ATTEMPT_TIMEOUT)?;
        for url in [
            format!("http://127.0.0.1:{port}/admin"),
            format!("http://localhost:{port}/admin"),
            format!("http://[::ffff:127.0.0.1]:{port}/admin"),
        ] {
            let target = WebhookTarget {
                url: url.clone(),
                method: "DELETE".to_owned(),
                ..WebhookTarget::default()
            };
            // No task serves this timer: a delivery that retried would never end.
            let timer = Timer::default();
            tokio::time::timeout(
                std::time::Duration::from_secs(20),
                deliver(&client, &reach, &timer, &outcome(true), &target),
            )
            .await
            .map_err(|_| format!("{url}: the delivery was retried instead of refused"))?;
            match listener.accept() {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                other => return Err(format!("{url}: a connection was made: {other:?}").into()),
            }
        }
        Ok(())
    }
}
