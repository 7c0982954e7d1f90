//! `on_deploy` webhooks (spec §7.11): when a release of a deployment ends, its `success` or
//! `failure` targets get voodu's payload (or the target's own `body` / `file` template with
//! `{{token}}`s filled in), with up to 3 attempts (pauses of 1 s and 5 s), 10 s per attempt and
//! a 2-minute budget. voodu never wires its poster; the agent does.
//!
//! Invariants: delivery never blocks or fails a rollout (handlers only enqueue; a tracked task
//! delivers); headers set by the operator are sent, then `User-Agent: voodu-deploy-webhook`
//! replaces any; environment values are never part of a payload unless the template puts them
//! there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::timer::{Timer, What};
use crate::manifest::spec::WebhookTarget;
use crate::model::{ResourceKey, resolve_asset_refs};

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
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(key, value)| (key.clone(), self.fill(value)))
                    .collect(),
            ),
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
        assets_root: PathBuf,
        timer: Timer,
        shutdown: CancellationToken,
    ) -> (Notifier, impl std::future::Future<Output = ()> + Send) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (
            Notifier { sender },
            deliver_all(receiver, assets_root, timer, shutdown),
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

async fn deliver_all(
    mut receiver: mpsc::UnboundedReceiver<Delivery>,
    assets_root: PathBuf,
    timer: Timer,
    shutdown: CancellationToken,
) {
    let built = crate::model::tls::client_config().and_then(|tls| {
        reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(ATTEMPT_TIMEOUT)
            .build()
            .map_err(|error| error.to_string())
    });
    let client = match built {
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
            .map(|target| deliver(&client, &assets_root, &timer, &delivery.outcome, target));
        futures_util::future::join_all(sends).await;
    }
}

/// Sends one target, retrying; failures are logged and dropped.
async fn deliver(
    client: &reqwest::Client,
    assets_root: &Path,
    timer: &Timer,
    outcome: &Outcome,
    target: &WebhookTarget,
) {
    let body = match body(assets_root, outcome, target) {
        Ok(body) => body,
        Err(problem) => {
            tracing::warn!(key = %outcome.key, url = %target.url, %problem, "webhook template unusable; sending the default payload");
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
                tracing::info!(key = %outcome.key, url = %target.url, status = response.status().as_u16(), "on_deploy webhook delivered");
                return;
            }
            Ok(response) => {
                tracing::warn!(key = %outcome.key, url = %target.url, status = response.status().as_u16(), attempt = attempt + 1, "on_deploy webhook refused")
            }
            Err(error) => {
                tracing::warn!(key = %outcome.key, url = %target.url, %error, attempt = attempt + 1, "on_deploy webhook failed")
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
    tracing::error!(key = %outcome.key, url = %target.url, "on_deploy webhook given up");
}

/// The body of one target: its `body` object, its `file` template (an asset), or voodu's
/// default payload; `{{token}}`s filled in.
fn body(assets_root: &Path, outcome: &Outcome, target: &WebhookTarget) -> Result<String, String> {
    if let Some(template) = &target.body {
        return Ok(outcome.fill(template).to_string());
    }
    if !target.file.is_empty() {
        let path = resolve_asset_refs(&target.file, assets_root);
        let text =
            std::fs::read_to_string(&path).map_err(|error| format!("reading {path}: {error}"))?;
        let template: Value =
            serde_json::from_str(&text).map_err(|error| format!("{path} is not JSON: {error}"))?;
        return Ok(outcome.fill(&template).to_string());
    }
    Ok(outcome.payload())
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
        assert_eq!(
            body(dir.path(), &outcome(false), &target)?,
            r#"{"summary":"api failed: boom"}"#
        );
        Ok(())
    }
}
