//! Pure: the HTTP request each sink type sends for a batch of events, and each git host's
//! commit status request. No IO here, so every payload shape is tested against the
//! provider's documented format.
//!
//! Invariants: text that came from outside (commit messages, diagnostics, resource names) is
//! escaped for the medium (terminal controls written out; Slack's `<`, `>`, `&`; Discord
//! mentions off); a secret appears only in the request (a header or the URL it came in) and
//! never in `Request`'s `Debug`.

use hmac::Mac;
use serde_json::{Value, json};

use super::config::{Provider, SinkType};
use crate::model::text::escape;
use crate::store::Event;

/// One HTTP request to send.
pub(crate) struct Request {
    pub(crate) url: String,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Vec<u8>,
    /// The secrets it was built from (the URL file's text, the HMAC key, the token): what an
    /// error about it must never repeat (`super::redact`).
    pub(crate) secrets: Vec<String>,
}

/// Headers whose values are no secret; every other header's value is treated as one.
pub(crate) const PUBLIC_HEADERS: &[&str] = &[
    "content-type",
    "accept",
    "x-github-api-version",
    "x-voodu-event",
    "title",
    "priority",
    "tags",
];

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL of a chat webhook is its secret; headers hold tokens.
        f.debug_struct("Request")
            .field("body_bytes", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// How bad an event is, for sinks that rank messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Severity {
    Info,
    Warning,
    Critical,
}

pub(crate) fn severity(event: &str) -> Severity {
    match event {
        "commit.rejected"
        | "rollout.failed"
        | "rollout.rolled_back"
        | "engine.unreachable"
        | "signature.refused" => Severity::Critical,
        "fetch.failing" | "commit.held" | "drift.repaired" => Severity::Warning,
        _ => Severity::Info,
    }
}

/// One line about one event: `rollout.failed shop/web at abc1234: why`.
pub(crate) fn line(event: &Event) -> String {
    let mut text = event.event.clone();
    if !event.resource.is_empty() {
        text.push(' ');
        text.push_str(&escape(&event.resource));
    }
    if !event.commit.is_empty() {
        text.push_str(" at ");
        text.push_str(&escape(event.commit.get(..7).unwrap_or(&event.commit)));
    }
    if !event.message.is_empty() {
        text.push_str(": ");
        text.push_str(&escape(&event.message));
    }
    text
}

/// Most events listed one by one in a coalesced message.
const LISTED: usize = 10;

/// The title and text of a batch: one event as itself; several as a count by event name and
/// the first [`LISTED`] lines.
pub(crate) fn summary(events: &[Event]) -> (String, String) {
    if let [event] = events {
        return (format!("voodu-agent: {}", event.event), line(event));
    }
    let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for event in events {
        *counts.entry(event.event.as_str()).or_default() += 1;
    }
    let counted: Vec<String> = counts
        .iter()
        .map(|(name, n)| format!("{n} {name}"))
        .collect();
    let mut text = format!("{} events: {}", events.len(), counted.join(", "));
    for event in events.iter().take(LISTED) {
        text.push_str("\n- ");
        text.push_str(&line(event));
    }
    if events.len() > LISTED {
        text.push_str(&format!("\n… and {} more", events.len() - LISTED));
    }
    (format!("voodu-agent: {} events", events.len()), text)
}

/// The request a message sink sends for `events` (at least one).
pub(crate) fn message(
    kind: SinkType,
    url: &str,
    secret: Option<&[u8]>,
    events: &[Event],
    dashboard: Option<&str>,
) -> Request {
    let (title, mut text) = summary(events);
    if let Some(dashboard) = dashboard {
        text.push_str(&format!("\n{dashboard}"));
    }
    let worst = events
        .iter()
        .map(|event| severity(&event.event))
        .max()
        .unwrap_or(Severity::Info);
    let json_request = |body: Value| Request {
        secrets: Vec::new(),
        url: url.to_owned(),
        headers: vec![("content-type", "application/json".to_owned())],
        body: body.to_string().into_bytes(),
    };
    let mut request = match kind {
        SinkType::Generic => generic(url, secret, events),
        // Incoming webhooks: `text`, in mrkdwn, where `<`, `>` and `&` are control characters.
        SinkType::Slack => json_request(json!({ "text": slack_escape(&text) })),
        // Execute Webhook: `content` (at most 2000 characters), mentions parsed from nothing.
        SinkType::Discord => json_request(json!({
            "content": cut_chars(&text, 2000),
            "allowed_mentions": { "parse": [] },
        })),
        // A Workflows webhook: a message with one Adaptive Card attachment.
        SinkType::Teams => json_request(teams_card(&title, &text)),
        // Publish by POST to the topic URL: the body is the message, the rest are headers.
        SinkType::Ntfy => ntfy(url, title, text, worst),
        // `POST /message` (the token in the URL's `token` parameter): title, message, priority.
        SinkType::Gotify => json_request(json!({
            "title": title,
            "message": text,
            "priority": match worst {
                Severity::Critical => 8,
                Severity::Warning => 5,
                Severity::Info => 2,
            },
        })),
        // `POST /api/v2/alerts`: one alert per event; an event that ends a condition resolves
        // the alert that condition raised (same labels, `endsAt` now).
        SinkType::Alertmanager => Request {
            secrets: Vec::new(),
            url: format!("{}/api/v2/alerts", url.trim_end_matches('/')),
            headers: vec![("content-type", "application/json".to_owned())],
            body: Value::Array(events.iter().map(|event| alert(event, dashboard)).collect())
                .to_string()
                .into_bytes(),
        },
    };
    // The URL file's text is the secret of most chat webhooks (a token in its path or query).
    request.secrets.push(url.to_owned());
    if let Some(secret) = secret {
        request
            .secrets
            .push(String::from_utf8_lossy(secret).into_owned());
    }
    request
}

/// The generic sink's request: every event as JSON, signed with `secret` when there is one
/// (`x-voodu-signature`).
fn generic(url: &str, secret: Option<&[u8]>, events: &[Event]) -> Request {
    let body = json!({ "agent": "voodu-agent", "events": events }).to_string();
    let mut request = Request {
        secrets: Vec::new(),
        url: url.to_owned(),
        headers: vec![
            ("content-type", "application/json".to_owned()),
            (
                "x-voodu-event",
                match events {
                    [event] => event.event.clone(),
                    _ => "batch".to_owned(),
                },
            ),
        ],
        body: body.into_bytes(),
    };
    if let Some(secret) = secret {
        request
            .headers
            .push(("x-voodu-signature", sign(secret, &request.body)));
    }
    request
}

/// A Workflows webhook's message: one Adaptive Card attachment with `title` and `text`.
fn teams_card(title: &str, text: &str) -> Value {
    json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "contentUrl": null,
            "content": {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.4",
                "body": [
                    { "type": "TextBlock", "text": title, "weight": "Bolder", "wrap": true },
                    { "type": "TextBlock", "text": text, "wrap": true },
                ],
            },
        }],
    })
}

/// An ntfy publish: the body is the message, the title, priority and tags are headers.
fn ntfy(url: &str, title: String, text: String, worst: Severity) -> Request {
    Request {
        secrets: Vec::new(),
        url: url.to_owned(),
        headers: vec![
            ("title", title),
            (
                "priority",
                match worst {
                    Severity::Critical => "urgent",
                    Severity::Warning => "high",
                    Severity::Info => "default",
                }
                .to_owned(),
            ),
            (
                "tags",
                match worst {
                    Severity::Critical => "rotating_light",
                    Severity::Warning => "warning",
                    Severity::Info => "white_check_mark",
                }
                .to_owned(),
            ),
        ],
        body: text.into_bytes(),
    }
}

/// The Alertmanager alert of `event`.
fn alert(event: &Event, dashboard: Option<&str>) -> Value {
    // The condition an event raises, or the one it ends.
    let (raises, resolves) = match event.event.as_str() {
        "fetch.recovered" => ("fetch.failing", true),
        "engine.back" => ("engine.unreachable", true),
        "rollout.succeeded" => ("rollout.failed", true),
        other => (other, false),
    };
    let at = crate::base::rfc3339_seconds(event.at);
    let mut labels = json!({
        "alertname": alert_name(raises),
        "severity": match severity(raises) {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
            Severity::Info => "info",
        },
        "source": "voodu-agent",
    });
    for (label, value) in [("scope", &event.scope), ("resource", &event.resource)] {
        if !value.is_empty() {
            labels[label] = json!(value);
        }
    }
    let mut alert = json!({
        "labels": labels,
        "annotations": {
            "summary": line(event),
            "description": escape(&event.message),
            "commit": event.commit,
        },
        "startsAt": at,
    });
    if resolves {
        alert["endsAt"] = json!(at);
    }
    if let Some(dashboard) = dashboard {
        alert["generatorURL"] = json!(dashboard);
    }
    alert
}

/// `rollout.failed` → `VooduRolloutFailed`.
fn alert_name(event: &str) -> String {
    let mut name = String::from("Voodu");
    for part in event.split(['.', '_']) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            name.extend(first.to_uppercase());
            name.push_str(chars.as_str());
        }
    }
    name
}

/// A commit status to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Pending,
    Success,
    Failure,
    /// The commit's rollout never ended: a later commit superseded it.
    Error,
}

impl State {
    /// The state in a provider's words: `[pending, success, failure, error]`.
    fn spelled(self, [pending, success, failure, error]: [&'static str; 4]) -> &'static str {
        match self {
            State::Pending => pending,
            State::Success => success,
            State::Failure => failure,
            State::Error => error,
        }
    }
}

/// The request that sets `sha`'s status on `provider` (each provider's documented API; the
/// description cut to the 140 characters GitHub takes).
#[allow(clippy::too_many_arguments)]
pub(crate) fn commit_status(
    provider: Provider,
    api_url: &str,
    repository: &str,
    token: &str,
    sha: &str,
    state: State,
    description: &str,
    context: &str,
    dashboard: Option<&str>,
) -> Request {
    let description = cut_chars(&escape(description), 140);
    let content = ("content-type", "application/json".to_owned());
    let (url, headers, body) = match provider {
        // POST /repos/{owner}/{repo}/statuses/{sha}: pending | success | failure | error (Gitea
        // and Forgejo copy GitHub's API: pending | success | error | failure | warning, but
        // authenticate with `token …`).
        Provider::Github | Provider::Gitea | Provider::Forgejo => (
            format!("{api_url}/repos/{repository}/statuses/{sha}"),
            if provider == Provider::Github {
                vec![
                    content,
                    ("accept", "application/vnd.github+json".to_owned()),
                    ("authorization", format!("Bearer {token}")),
                    ("x-github-api-version", "2022-11-28".to_owned()),
                ]
            } else {
                vec![content, ("authorization", format!("token {token}"))]
            },
            json!({
                "state": state.spelled(["pending", "success", "failure", "error"]),
                "target_url": dashboard,
                "description": description,
                "context": context,
            }),
        ),
        // POST /projects/:id/statuses/:sha (id: the URL-encoded path): pending | running |
        // success | failed | canceled (what an `error` is there).
        Provider::Gitlab => (
            format!(
                "{api_url}/projects/{}/statuses/{sha}",
                form_urlencoded::byte_serialize(repository.as_bytes()).collect::<String>()
            ),
            vec![content, ("private-token", token.to_owned())],
            json!({
                "state": state.spelled(["running", "success", "failed", "canceled"]),
                "name": context,
                "target_url": dashboard,
                "description": description,
            }),
        ),
        // POST /repositories/{workspace}/{repo_slug}/commit/{commit}/statuses/build:
        // INPROGRESS | SUCCESSFUL | FAILED | STOPPED; `key` and `url` are required.
        Provider::Bitbucket => (
            format!("{api_url}/repositories/{repository}/commit/{sha}/statuses/build"),
            vec![content, ("authorization", format!("Bearer {token}"))],
            json!({
                "state": state.spelled(["INPROGRESS", "SUCCESSFUL", "FAILED", "STOPPED"]),
                "key": context,
                "name": context,
                "url": dashboard.unwrap_or(api_url),
                "description": description,
            }),
        ),
    };
    Request {
        secrets: vec![token.to_owned()],
        url,
        headers,
        body: body.to_string().into_bytes(),
    }
}

/// `sha256=<hex HMAC-SHA256 of body>`: what the agent's own webhook receiver checks in
/// `X-Voodu-Signature`.
pub(crate) fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = crate::base::hmac_sha256(secret);
    mac.update(body);
    format!(
        "sha256={}",
        crate::model::text::hex(&mac.finalize().into_bytes())
    )
}

fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn cut_chars(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str, message: &str) -> Event {
        Event {
            id: 7,
            at: 1_790_000_000,
            event: name.into(),
            scope: "shop".into(),
            resource: "deployment/shop/web".into(),
            commit: "0123456789abcdef0123456789abcdef01234567".into(),
            message: message.into(),
            data: serde_json::json!({ "release": 3 }),
        }
    }

    fn body(request: &Request) -> Value {
        serde_json::from_slice(&request.body).expect("a JSON body")
    }

    fn header<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
        request
            .headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Each message format as its provider documents it; outside text escaped for the medium.
    #[test]
    fn message_sinks_send_their_documented_shapes() {
        let failed = [event("rollout.failed", "probe <@here> & \u{1b}[31mred")];
        let url = "https://receiver.example/x";

        let slack = message(SinkType::Slack, url, None, &failed, None);
        let text = body(&slack)["text"].as_str().expect("text").to_owned();
        assert!(text.starts_with("rollout.failed deployment/shop/web at 0123456: probe &lt;@here&gt; &amp; \\x1b[31mred"), "{text}");
        assert_eq!(header(&slack, "content-type"), Some("application/json"));

        let discord = body(&message(SinkType::Discord, url, None, &failed, None));
        assert_eq!(
            discord["allowed_mentions"],
            serde_json::json!({ "parse": [] })
        );
        assert!(
            discord["content"]
                .as_str()
                .is_some_and(|content| content.chars().count() <= 2000)
        );

        let teams = body(&message(
            SinkType::Teams,
            url,
            None,
            &failed,
            Some("https://d.example"),
        ));
        assert_eq!(teams["type"], "message");
        let card = &teams["attachments"][0];
        assert_eq!(
            card["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert_eq!(card["content"]["type"], "AdaptiveCard");
        assert_eq!(
            card["content"]["body"][0]["text"],
            "voodu-agent: rollout.failed"
        );
        assert!(
            card["content"]["body"][1]["text"]
                .as_str()
                .is_some_and(|text| text.ends_with("\nhttps://d.example"))
        );

        let ntfy = message(SinkType::Ntfy, url, None, &failed, None);
        assert_eq!(header(&ntfy, "title"), Some("voodu-agent: rollout.failed"));
        assert_eq!(header(&ntfy, "priority"), Some("urgent"));
        assert!(
            String::from_utf8_lossy(&ntfy.body).starts_with("rollout.failed deployment/shop/web")
        );

        let gotify = body(&message(SinkType::Gotify, url, None, &failed, None));
        assert_eq!(gotify["title"], "voodu-agent: rollout.failed");
        assert_eq!(gotify["priority"], 8);

        let generic = message(SinkType::Generic, url, Some(b"key"), &failed, None);
        assert_eq!(header(&generic, "x-voodu-event"), Some("rollout.failed"));
        assert_eq!(
            header(&generic, "x-voodu-signature").map(str::to_owned),
            Some(sign(b"key", &generic.body))
        );
        let payload = body(&generic);
        assert_eq!(payload["events"][0]["event"], "rollout.failed");
        assert_eq!(payload["events"][0]["data"]["release"], 3);
        assert!(
            !format!("{generic:?}").contains("receiver.example"),
            "Debug hides the URL"
        );
    }

    /// Alertmanager's v2 API: an array of alerts; the event that ends a condition resolves
    /// the alert it raised (same labels, `endsAt`).
    #[test]
    fn alertmanager_alerts_raise_and_resolve_by_labels() {
        let events = [
            event("rollout.failed", "boom"),
            event("rollout.succeeded", "ok"),
        ];
        let request = message(
            SinkType::Alertmanager,
            "http://am:9093/",
            None,
            &events,
            Some("https://d"),
        );
        assert_eq!(request.url, "http://am:9093/api/v2/alerts");
        let alerts = body(&request);
        let (raised, resolved) = (&alerts[0], &alerts[1]);
        assert_eq!(raised["labels"]["alertname"], "VooduRolloutFailed");
        assert_eq!(raised["labels"]["severity"], "critical");
        assert_eq!(raised["labels"]["resource"], "deployment/shop/web");
        assert_eq!(raised["startsAt"], "2026-09-21T14:13:20Z");
        assert!(raised.get("endsAt").is_none());
        assert_eq!(raised["generatorURL"], "https://d");
        assert_eq!(resolved["labels"], raised["labels"], "the same alert");
        assert_eq!(resolved["endsAt"], "2026-09-21T14:13:20Z");
    }

    /// Each git host's commit status API: path, auth header and state names.
    #[test]
    fn commit_statuses_follow_each_providers_api() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let cases = [
            (
                Provider::Github,
                "https://api.github.com",
                "acme/deploy",
                format!("https://api.github.com/repos/acme/deploy/statuses/{sha}"),
                ("authorization", "Bearer T"),
                ["pending", "success", "failure", "error"],
                "state",
            ),
            (
                Provider::Gitlab,
                "https://gitlab.com/api/v4",
                "group/sub/deploy",
                format!("https://gitlab.com/api/v4/projects/group%2Fsub%2Fdeploy/statuses/{sha}"),
                ("private-token", "T"),
                ["running", "success", "failed", "canceled"],
                "state",
            ),
            (
                Provider::Gitea,
                "https://gitea.example/api/v1",
                "acme/deploy",
                format!("https://gitea.example/api/v1/repos/acme/deploy/statuses/{sha}"),
                ("authorization", "token T"),
                ["pending", "success", "failure", "error"],
                "state",
            ),
            (
                Provider::Forgejo,
                "https://codeberg.org/api/v1",
                "acme/deploy",
                format!("https://codeberg.org/api/v1/repos/acme/deploy/statuses/{sha}"),
                ("authorization", "token T"),
                ["pending", "success", "failure", "error"],
                "state",
            ),
            (
                Provider::Bitbucket,
                "https://api.bitbucket.org/2.0",
                "acme/deploy",
                format!(
                    "https://api.bitbucket.org/2.0/repositories/acme/deploy/commit/{sha}/statuses/build"
                ),
                ("authorization", "Bearer T"),
                ["INPROGRESS", "SUCCESSFUL", "FAILED", "STOPPED"],
                "state",
            ),
        ];
        for (provider, api, repository, url, (auth, value), states, field) in cases {
            for (state, wanted) in [State::Pending, State::Success, State::Failure, State::Error]
                .into_iter()
                .zip(states)
            {
                let request = commit_status(
                    provider,
                    api,
                    repository,
                    "T",
                    sha,
                    state,
                    &"x".repeat(300),
                    "voodu-agent",
                    Some("https://d"),
                );
                assert_eq!(request.url, url, "{provider:?}");
                assert_eq!(header(&request, auth), Some(value), "{provider:?}");
                let payload = body(&request);
                assert_eq!(payload[field], wanted, "{provider:?}");
                assert_eq!(
                    payload["description"]
                        .as_str()
                        .map(|text| text.chars().count()),
                    Some(140)
                );
            }
        }
        let bitbucket = body(&commit_status(
            Provider::Bitbucket,
            "https://api.bitbucket.org/2.0",
            "a/b",
            "T",
            sha,
            State::Success,
            "",
            "voodu-agent",
            None,
        ));
        assert_eq!(
            (bitbucket["key"].as_str(), bitbucket["url"].as_str()),
            (Some("voodu-agent"), Some("https://api.bitbucket.org/2.0")),
            "key and url are required"
        );
    }

    /// A storm is one message: counts by name, the first lines, and how many more.
    #[test]
    fn a_batch_is_summarised() {
        let events: Vec<Event> = (0..25).map(|_| event("drift.repaired", "back")).collect();
        let (title, text) = summary(&events);
        assert_eq!(title, "voodu-agent: 25 events");
        assert!(
            text.starts_with("25 events: 25 drift.repaired\n- drift.repaired"),
            "{text}"
        );
        assert!(text.ends_with("… and 15 more"), "{text}");
    }
}
