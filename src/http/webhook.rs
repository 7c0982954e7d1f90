//! `POST /hooks/git`: authenticate a push notification, keep only pushes to the deployed
//! branch, and turn it into a sync request.
//!
//! Providers, recognised by their headers (first match wins):
//! - GitLab: `X-Gitlab-Token` must equal the secret;
//! - Forgejo: `X-Forgejo-Signature`, Gitea: `X-Gitea-Signature`: hex HMAC-SHA256 of the body;
//! - GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`;
//! - generic (CI scripts, `voodu-agent sync`): `X-Voodu-Signature: sha256=<hex>`, and a JSON
//!   body with optional `ref` and `after` (an empty body means "fetch now").
//!
//! Invariants: with a secret, nothing is parsed or acted on before the signature or token
//! checks out, and every comparison is constant-time (`Mac::verify_slice`, `subtle`); without
//! a secret (allowed on loopback only) requests are accepted unsigned. The body is read only
//! up to the size cap. A request never queues work of its own: it sets the trigger's
//! coalescing flag (`git::trigger`), so a flood costs one fetch per new SHA.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::BodyExt as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use super::{AppState, Error, blocking};
use crate::git::trigger::{SyncReason, SyncRequest, Ticket};
use crate::model::CommitSha;

/// The header of the generic HMAC form.
pub const GENERIC_SIGNATURE_HEADER: &str = "x-voodu-signature";

/// Longest wait `?timeout=` may ask for.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// The shared webhook secret. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Vec<u8>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

impl WebhookSecret {
    pub fn new(secret: impl Into<Vec<u8>>) -> WebhookSecret {
        WebhookSecret(secret.into())
    }

    /// Reads a secret file; one trailing newline (as editors and `echo` write) is dropped.
    pub fn from_file(path: &Path) -> super::Result<WebhookSecret> {
        let mut bytes = std::fs::read(path).map_err(|source| Error::SecretFile {
            path: path.to_owned(),
            source,
        })?;
        while bytes
            .last()
            .is_some_and(|byte| *byte == b'\n' || *byte == b'\r')
        {
            bytes.pop();
        }
        if bytes.is_empty() {
            return Err(Error::EmptySecret {
                path: path.to_owned(),
            });
        }
        Ok(WebhookSecret(bytes))
    }

    /// `sha256=<hex HMAC-SHA256 of body>`: the GitHub and generic header value.
    pub fn sign(&self, body: &[u8]) -> String {
        format!("sha256={}", self.hmac_hex(body))
    }

    /// Hex HMAC-SHA256 of `body`: the Gitea/Forgejo header value.
    pub fn hmac_hex(&self, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(body);
        to_hex(&mac.finalize().into_bytes())
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC accepts keys of any length")
    }

    /// Constant-time check of a hex HMAC-SHA256 tag.
    fn verify_hex(&self, body: &[u8], hex: &str) -> bool {
        let Some(tag) = from_hex(hex.trim()) else {
            return false;
        };
        let mut mac = self.mac();
        mac.update(body);
        mac.verify_slice(&tag).is_ok()
    }

    /// Constant-time comparison with a plain token; hashing both first also hides the length.
    pub(super) fn matches_token(&self, token: &[u8]) -> bool {
        let expected = Sha256::digest(&self.0);
        let given = Sha256::digest(token);
        expected.as_slice().ct_eq(given.as_slice()).into()
    }
}

/// Who sent a webhook, recognised by its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    GitHub,
    GitLab,
    Gitea,
    Forgejo,
    Generic,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::GitHub => "github",
            Provider::GitLab => "gitlab",
            Provider::Gitea => "gitea",
            Provider::Forgejo => "forgejo",
            Provider::Generic => "generic",
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Recognises the provider; Forgejo also sends Gitea's headers and Gitea GitHub's, so the
/// most specific comes first.
pub fn detect(headers: &HeaderMap) -> Provider {
    let has = |name: &str| headers.contains_key(name);
    if has("x-gitlab-token") || has("x-gitlab-event") {
        Provider::GitLab
    } else if has("x-forgejo-signature") || has("x-forgejo-event") {
        Provider::Forgejo
    } else if has("x-gitea-signature") || has("x-gitea-event") {
        Provider::Gitea
    } else if has("x-hub-signature-256") || has("x-github-event") {
        Provider::GitHub
    } else {
        Provider::Generic
    }
}

/// Checks the provider's signature or token against `secret`; the error says what was wrong
/// (never anything about the secret).
pub fn verify(
    provider: Provider,
    headers: &HeaderMap,
    body: &[u8],
    secret: &WebhookSecret,
) -> Result<(), &'static str> {
    let prefixed = |name: &str| -> Result<(), &'static str> {
        let value = header(headers, name).ok_or("missing signature header")?;
        let hex = value
            .strip_prefix("sha256=")
            .ok_or("signature is not `sha256=<hex>`")?;
        secret
            .verify_hex(body, hex)
            .then_some(())
            .ok_or("signature does not match")
    };
    let bare = |name: &str| -> Result<(), &'static str> {
        let value = header(headers, name).ok_or("missing signature header")?;
        secret
            .verify_hex(body, value)
            .then_some(())
            .ok_or("signature does not match")
    };
    match provider {
        Provider::GitLab => {
            let token = headers
                .get("x-gitlab-token")
                .ok_or("missing X-Gitlab-Token")?;
            secret
                .matches_token(token.as_bytes())
                .then_some(())
                .ok_or("token does not match")
        }
        Provider::Forgejo => bare("x-forgejo-signature"),
        Provider::Gitea => bare("x-gitea-signature"),
        Provider::GitHub => prefixed("x-hub-signature-256"),
        Provider::Generic => prefixed(GENERIC_SIGNATURE_HEADER),
    }
}

/// What kind of notification a request is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Push,
    Ping,
    Other(String),
}

fn event(provider: Provider, headers: &HeaderMap) -> Event {
    let (name, push, ping) = match provider {
        Provider::GitHub => ("x-github-event", "push", Some("ping")),
        Provider::GitLab => ("x-gitlab-event", "Push Hook", None),
        Provider::Gitea => ("x-gitea-event", "push", None),
        Provider::Forgejo => ("x-forgejo-event", "push", None),
        Provider::Generic => return Event::Push,
    };
    match header(headers, name) {
        None => Event::Push,
        Some(value) if value.eq_ignore_ascii_case(push) => Event::Push,
        Some(value) if Some(value) == ping => Event::Ping,
        Some(value) => Event::Other(value.to_owned()),
    }
}

/// The fields of a push payload the agent reads (all providers use these names), and the
/// ones that may name who pushed (kept loose: a field of an unexpected shape names no one,
/// it never fails the push).
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
struct Push {
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    after: Option<String>,
    /// GitHub `{name}`, Gitea and Forgejo `{login, username}`.
    #[serde(default)]
    pusher: serde_json::Value,
    /// GitHub and Gitea `{login}`.
    #[serde(default)]
    sender: serde_json::Value,
    /// GitLab.
    #[serde(default)]
    user_username: serde_json::Value,
    /// The generic form: who runs the script.
    #[serde(default)]
    actor: serde_json::Value,
}

impl Push {
    /// Who pushed, as the payload says (untrusted text; the store makes it safe).
    fn actor(&self) -> Option<String> {
        let text = |value: &serde_json::Value| value.as_str().map(ToOwned::to_owned);
        text(&self.actor)
            .or_else(|| text(&self.user_username))
            .or_else(|| text(&self.pusher["login"]))
            .or_else(|| text(&self.pusher["username"]))
            .or_else(|| text(&self.pusher["name"]))
            .or_else(|| text(&self.sender["login"]))
    }
}

/// The header a `voodu-agent` command adds to its nudge: the request is the operator's, on
/// this host (`cli` in the activity log) rather than another HTTP client's.
pub const ORIGIN_HEADER: &str = "x-voodu-origin";
/// The header naming the user of that command.
pub const ACTOR_HEADER: &str = "x-voodu-actor";

/// Why a push request asks for a sync, and who asks, for the activity log.
fn request_origin(
    provider: Provider,
    headers: &HeaderMap,
    push: &Push,
) -> (SyncReason, Option<String>) {
    match provider {
        Provider::Generic => {
            let reason = if header(headers, ORIGIN_HEADER) == Some("cli") {
                SyncReason::Cli
            } else {
                SyncReason::Http
            };
            let actor = header(headers, ACTOR_HEADER)
                .map(ToOwned::to_owned)
                .or_else(|| push.actor());
            (reason, actor)
        }
        _ => (SyncReason::Webhook, push.actor()),
    }
}

/// Parses a push body: JSON, or GitHub's form encoding (`payload=<json>`); an empty body is
/// a bare "fetch now".
fn parse_push(headers: &HeaderMap, body: &[u8]) -> Result<Push, String> {
    let is_form = header(headers, "content-type")
        .is_some_and(|value| value.starts_with("application/x-www-form-urlencoded"));
    let json = if is_form {
        form_urlencoded::parse(body)
            .find(|(name, _)| name == "payload")
            .map(|(_, value)| value.into_owned().into_bytes())
            .ok_or("form body without a `payload` field")?
    } else {
        body.to_vec()
    };
    if json.iter().all(u8::is_ascii_whitespace) {
        return Ok(Push::default());
    }
    serde_json::from_slice(&json).map_err(|error| format!("body is not a push payload: {error}"))
}

/// A full hex commit id (40 digits for SHA-1, 64 for SHA-256) other than git's all-zero
/// "branch deleted" id; anything else names no commit, and the push is a bare "fetch now".
fn commit_of(after: Option<&str>) -> Option<CommitSha> {
    let after = after?.trim().to_ascii_lowercase();
    let is_sha = matches!(after.len(), 40 | 64) && after.chars().all(|c| c.is_ascii_hexdigit());
    (is_sha && after.chars().any(|c| c != '0')).then(|| CommitSha::new(after))
}

/// Query of `POST /hooks/git`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct HookQuery {
    /// `true` (or `1`, or empty): answer once the commit was applied or rejected.
    wait: Option<String>,
    /// How long to wait (`30s`, `2m`); default `HttpOptions::wait_timeout`, at most 10 min.
    timeout: Option<String>,
}

/// The JSON answer of `POST /hooks/git`. `result` is also the metrics label.
#[derive(Debug, Serialize)]
pub struct HookAnswer {
    pub result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// For `?wait=true`: the branch tip the answering fetch saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch_tip: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For a rejected commit: every problem as `path:line:col: message`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

impl HookAnswer {
    fn new(result: &'static str) -> HookAnswer {
        HookAnswer {
            result,
            provider: None,
            commit: None,
            branch_tip: None,
            reason: None,
            errors: Vec::new(),
        }
    }

    fn reason(mut self, reason: impl Into<String>) -> HookAnswer {
        self.reason = Some(reason.into());
        self
    }
}

fn answer(state: &AppState, code: StatusCode, answer: HookAnswer) -> Response {
    state.ctx.metrics.record_webhook(answer.result);
    (code, Json(answer)).into_response()
}

/// Reads the body up to the cap and within the body timeout.
async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, Response> {
    let max = state.ctx.options.max_body_bytes;
    let too_large = || {
        answer(
            state,
            StatusCode::PAYLOAD_TOO_LARGE,
            HookAnswer::new("too_large").reason(format!("body larger than {max} bytes")),
        )
    };
    let declared = header(headers, "content-length").and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > u64::try_from(max).unwrap_or(u64::MAX)) {
        return Err(too_large());
    }
    let limited = http_body_util::Limited::new(body, max);
    match tokio::time::timeout(state.ctx.options.body_timeout, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(error)) => Err(answer(
            state,
            StatusCode::BAD_REQUEST,
            HookAnswer::new("bad_request").reason(format!("cannot read body: {error}")),
        )),
        Err(_) => Err(answer(
            state,
            StatusCode::REQUEST_TIMEOUT,
            HookAnswer::new("bad_request").reason("body not received in time"),
        )),
    }
}

pub(super) async fn hook(
    State(state): State<Arc<AppState>>,
    Query(query): Query<HookQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = match read_body(&state, &headers, body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let provider = detect(&headers);
    let with_provider = |mut hook_answer: HookAnswer| {
        hook_answer.provider = Some(provider.as_str());
        hook_answer
    };
    if let Some(secret) = &state.ctx.options.secret
        && let Err(why) = verify(provider, &headers, &body, secret)
    {
        tracing::warn!(provider = provider.as_str(), why, "webhook refused");
        return answer(
            &state,
            StatusCode::UNAUTHORIZED,
            with_provider(HookAnswer::new("unauthorized").reason(why)),
        );
    }
    match event(provider, &headers) {
        Event::Push => {}
        Event::Ping => {
            return answer(
                &state,
                StatusCode::OK,
                with_provider(HookAnswer::new("pong")),
            );
        }
        Event::Other(name) => {
            return answer(
                &state,
                StatusCode::ACCEPTED,
                with_provider(
                    HookAnswer::new("ignored")
                        .reason(format!("event {name:?} is not a push; only pushes sync")),
                ),
            );
        }
    }
    let push = match parse_push(&headers, &body) {
        Ok(push) => push,
        Err(why) => {
            return answer(
                &state,
                StatusCode::BAD_REQUEST,
                with_provider(HookAnswer::new("bad_request").reason(why)),
            );
        }
    };
    let wanted_ref = format!("refs/heads/{}", state.ctx.options.branch);
    if let Some(git_ref) = &push.git_ref
        && *git_ref != wanted_ref
    {
        return answer(
            &state,
            StatusCode::ACCEPTED,
            with_provider(HookAnswer::new("ignored").reason(format!(
                "push to {git_ref}; this agent deploys {wanted_ref}"
            ))),
        );
    }
    let commit = commit_of(push.after.as_deref());
    let (reason, actor) = request_origin(provider, &headers, &push);
    let ticket = state.ctx.requests.request(SyncRequest {
        reason,
        commit: commit.clone(),
        actor,
    });
    let wait = query
        .wait
        .as_deref()
        .is_some_and(|wait| matches!(wait, "" | "1" | "true" | "yes"));
    if !wait {
        let mut hook_answer = HookAnswer::new(if ticket.coalesced {
            "coalesced"
        } else {
            "accepted"
        });
        hook_answer.commit = commit.map(|commit| commit.to_string());
        hook_answer.reason = Some(
            if ticket.coalesced {
                "a fetch that covers this push is already pending or done"
            } else {
                "fetch queued"
            }
            .to_owned(),
        );
        return answer(&state, StatusCode::ACCEPTED, with_provider(hook_answer));
    }
    let timeout = match query.timeout.as_deref().map(humantime::parse_duration) {
        None => state.ctx.options.wait_timeout,
        Some(Ok(timeout)) => timeout.min(MAX_WAIT),
        Some(Err(error)) => {
            return answer(
                &state,
                StatusCode::BAD_REQUEST,
                with_provider(HookAnswer::new("bad_request").reason(format!("timeout: {error}"))),
            );
        }
    };
    let (code, hook_answer) = wait_for_outcome(&state, ticket, commit, timeout).await;
    answer(&state, code, with_provider(hook_answer))
}

/// Waits until the fetch of `ticket` has ended, then reads the outcome of `commit` (or of
/// the branch tip it saw, for a push without a SHA) from the store.
async fn wait_for_outcome(
    state: &AppState,
    ticket: Ticket,
    commit: Option<CommitSha>,
    timeout: Duration,
) -> (StatusCode, HookAnswer) {
    let mut pending = HookAnswer::new("timeout");
    pending.commit = commit.as_ref().map(ToString::to_string);
    let Ok(_permit) = state.waiters.clone().try_acquire_owned() else {
        pending.result = "busy";
        pending.reason =
            Some("too many requests are waiting; the sync was requested anyway".to_owned());
        return (StatusCode::TOO_MANY_REQUESTS, pending);
    };
    let report = tokio::select! {
        report = state.ctx.requests.fetched(ticket) => report,
        () = tokio::time::sleep(timeout) => {
            pending.reason = Some(format!(
                "not applied or rejected within {}; the sync goes on in the background",
                humantime::format_duration(timeout)
            ));
            return (StatusCode::GATEWAY_TIMEOUT, pending);
        }
        () = state.shutdown.cancelled() => {
            pending.result = "shutting_down";
            pending.reason = Some("the agent is stopping".to_owned());
            return (StatusCode::SERVICE_UNAVAILABLE, pending);
        }
    };
    let tip = match report.result {
        Ok(tip) => tip,
        Err(message) => {
            pending.result = "error";
            pending.reason = Some(format!("sync failed: {message}"));
            return (StatusCode::BAD_GATEWAY, pending);
        }
    };
    pending.branch_tip = Some(tip.to_string());
    let target = commit.unwrap_or_else(|| tip.clone());
    pending.commit = Some(target.to_string());
    let record = {
        let target = target.clone();
        blocking(&state.ctx.store, move |store| store.commit_record(&target)).await
    };
    match record {
        // The branch has moved past the pushed commit: whatever happened to it once, it is
        // not what the host converges to now.
        Ok(record) if target != tip => {
            pending.result = "superseded";
            let earlier = match record {
                Some(record) if record.applied => "; it was applied before and is no longer",
                Some(_) => "; it was rejected before",
                None => "",
            };
            pending.reason = Some(format!(
                "the branch has moved on to {}; {} is not its tip{earlier}",
                tip.short(),
                target.short()
            ));
            (StatusCode::CONFLICT, pending)
        }
        Ok(Some(record)) if record.applied => {
            pending.result = "applied";
            pending.reason =
                Some("in desired state; the reconciler converges containers from here".to_owned());
            (StatusCode::OK, pending)
        }
        Ok(Some(record)) => {
            pending.result = "rejected";
            pending.reason = Some("the host keeps running the last applied commit".to_owned());
            pending.errors = record.errors.iter().map(ToString::to_string).collect();
            (StatusCode::UNPROCESSABLE_ENTITY, pending)
        }
        Ok(None) => {
            pending.result = "superseded";
            pending.reason = Some(format!(
                "the branch is at {} now; {} was never its tip when fetched",
                tip.short(),
                target.short()
            ));
            (StatusCode::CONFLICT, pending)
        }
        Err(message) => {
            pending.result = "error";
            pending.reason = Some(message);
            (StatusCode::INTERNAL_SERVER_ERROR, pending)
        }
    }
}

fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|index| u8::from_str_radix(text.get(index..index + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const SECRET: &str = "It's a Secret to Everybody";
    const BODY: &[u8] =
        br#"{"ref":"refs/heads/main","after":"0123456789abcdef0123456789abcdef01234567"}"#;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                *name,
                HeaderValue::from_str(value).expect("test header value"),
            );
        }
        map
    }

    fn secret() -> WebhookSecret {
        WebhookSecret::new(SECRET)
    }

    /// `(provider detected, verification result)` for one request.
    fn check(pairs: &[(&'static str, &str)], body: &[u8]) -> (Provider, Result<(), &'static str>) {
        let map = headers(pairs);
        let provider = detect(&map);
        (provider, verify(provider, &map, body, &secret()))
    }

    #[test]
    fn github_signature_matches_githubs_documented_example() {
        // docs.github.com "Validating webhook deliveries": secret and payload above.
        let signature = WebhookSecret::new("It's a Secret to Everybody").sign(b"Hello, World!");
        assert_eq!(
            signature,
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    #[test]
    fn github_correct_wrong_and_missing_signatures() {
        let good = secret().sign(BODY);
        assert_eq!(
            check(
                &[("x-github-event", "push"), ("x-hub-signature-256", &good)],
                BODY
            ),
            (Provider::GitHub, Ok(()))
        );
        let wrong = WebhookSecret::new("other").sign(BODY);
        assert_eq!(
            check(&[("x-hub-signature-256", &wrong)], BODY).1,
            Err("signature does not match")
        );
        assert_eq!(
            check(&[("x-hub-signature-256", &good)], b"tampered").1,
            Err("signature does not match")
        );
        let unprefixed = good.trim_start_matches("sha256=").to_owned();
        assert_eq!(
            check(&[("x-hub-signature-256", &unprefixed)], BODY).1,
            Err("signature is not `sha256=<hex>`")
        );
        assert_eq!(
            check(&[("x-github-event", "push")], BODY),
            (Provider::GitHub, Err("missing signature header"))
        );
    }

    #[test]
    fn gitlab_token_must_equal_the_secret() {
        assert_eq!(
            check(
                &[("x-gitlab-event", "Push Hook"), ("x-gitlab-token", SECRET)],
                BODY
            ),
            (Provider::GitLab, Ok(()))
        );
        assert_eq!(
            check(&[("x-gitlab-token", "It's a Secret to Everybod")], BODY).1,
            Err("token does not match")
        );
        assert_eq!(
            check(&[("x-gitlab-event", "Push Hook")], BODY).1,
            Err("missing X-Gitlab-Token")
        );
    }

    #[test]
    fn gitea_and_forgejo_use_bare_hex_signatures() {
        let hex = secret().hmac_hex(BODY);
        assert_eq!(
            check(
                &[("x-gitea-event", "push"), ("x-gitea-signature", &hex)],
                BODY
            ),
            (Provider::Gitea, Ok(()))
        );
        // Forgejo sends its own and Gitea's headers; its own decide.
        let wrong = WebhookSecret::new("other").hmac_hex(BODY);
        assert_eq!(
            check(
                &[("x-forgejo-signature", &hex), ("x-gitea-signature", &wrong)],
                BODY
            ),
            (Provider::Forgejo, Ok(()))
        );
        assert_eq!(
            check(&[("x-forgejo-signature", &wrong)], BODY).1,
            Err("signature does not match")
        );
        assert_eq!(
            check(&[("x-gitea-signature", "not hex")], BODY).1,
            Err("signature does not match")
        );
    }

    #[test]
    fn generic_form_uses_the_voodu_header() {
        let good = secret().sign(BODY);
        assert_eq!(
            check(&[(GENERIC_SIGNATURE_HEADER, &good)], BODY),
            (Provider::Generic, Ok(()))
        );
        assert_eq!(check(&[], BODY).1, Err("missing signature header"));
        assert_eq!(
            check(&[(GENERIC_SIGNATURE_HEADER, &good)], b"{}").1,
            Err("signature does not match")
        );
    }

    #[test]
    fn events_other_than_push_are_recognised() {
        let map = headers(&[("x-github-event", "ping")]);
        assert_eq!(event(detect(&map), &map), Event::Ping);
        let map = headers(&[("x-gitlab-event", "Merge Request Hook")]);
        assert_eq!(
            event(detect(&map), &map),
            Event::Other("Merge Request Hook".into())
        );
        let map = headers(&[("x-gitea-event", "push")]);
        assert_eq!(event(detect(&map), &map), Event::Push);
    }

    #[test]
    fn push_payloads_parse_from_json_form_and_empty_bodies() -> Result<(), String> {
        let push = parse_push(&HeaderMap::new(), BODY)?;
        assert_eq!(push.git_ref.as_deref(), Some("refs/heads/main"));
        let form: String = form_urlencoded::Serializer::new(String::new())
            .append_pair(
                "payload",
                std::str::from_utf8(BODY).map_err(|e| e.to_string())?,
            )
            .finish();
        let form_headers = headers(&[("content-type", "application/x-www-form-urlencoded")]);
        assert_eq!(parse_push(&form_headers, form.as_bytes())?, push);
        assert_eq!(parse_push(&HeaderMap::new(), b"  \n")?, Push::default());
        assert!(parse_push(&HeaderMap::new(), b"{not json").is_err());
        Ok(())
    }

    #[test]
    fn pushes_name_their_origin_and_pusher() -> Result<(), String> {
        let none = HeaderMap::new();
        let check = |provider, headers: &HeaderMap, body: &[u8], reason, actor: Option<&str>| {
            let push = parse_push(&HeaderMap::new(), body)?;
            assert_eq!(
                request_origin(provider, headers, &push),
                (reason, actor.map(ToOwned::to_owned)),
                "{}",
                String::from_utf8_lossy(body)
            );
            Ok::<(), String>(())
        };
        check(
            Provider::GitHub,
            &none,
            br#"{"ref":"refs/heads/main","pusher":{"name":"octocat","email":"x"},"sender":{"login":"oc"}}"#,
            SyncReason::Webhook,
            Some("octocat"),
        )?;
        // A field of an unexpected shape names no one and does not fail the push.
        check(
            Provider::GitLab,
            &none,
            br#"{"user_username":"jdoe","pusher":"odd"}"#,
            SyncReason::Webhook,
            Some("jdoe"),
        )?;
        check(
            Provider::Gitea,
            &none,
            br#"{"pusher":{"login":"gt","username":"gt2"}}"#,
            SyncReason::Webhook,
            Some("gt"),
        )?;
        check(Provider::GitHub, &none, b"{}", SyncReason::Webhook, None)?;
        let cli = headers(&[(ORIGIN_HEADER, "cli"), (ACTOR_HEADER, "root")]);
        check(
            Provider::Generic,
            &cli,
            b"{}",
            SyncReason::Cli,
            Some("root"),
        )?;
        check(
            Provider::Generic,
            &none,
            br#"{"actor":"ci-bot"}"#,
            SyncReason::Http,
            Some("ci-bot"),
        )?;
        Ok(())
    }

    #[test]
    fn only_real_shas_name_a_commit() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(commit_of(Some(sha)), Some(CommitSha::new(sha)));
        assert_eq!(commit_of(Some(&"0".repeat(40))), None, "branch deleted");
        assert_eq!(commit_of(Some("abc")), None);
        assert_eq!(commit_of(None), None);
    }

    /// Bug 5 (issue 11): any run of 40 or more hex digits was taken for a commit id.
    #[test]
    fn the_webhook_refuses_a_sha_that_is_not_40_or_64_hex() {
        let hex = "0123456789abcdef".repeat(5);
        let sha = |len: usize| hex[..len].to_owned();
        let cases: [(&str, String, bool); 9] = [
            ("39 hex", sha(39), false),
            ("40 hex (SHA-1)", sha(40), true),
            ("41 hex", sha(41), false),
            ("63 hex", sha(63), false),
            ("64 hex (SHA-256)", sha(64), true),
            ("65 hex", sha(65), false),
            ("40 with a non-hex digit", format!("{}g", sha(39)), false),
            ("upper case 40", sha(40).to_ascii_uppercase(), true),
            ("all-zero 64 (branch deleted)", "0".repeat(64), false),
        ];
        for (case, after, names_a_commit) in cases {
            let expected = names_a_commit.then(|| CommitSha::new(after.to_ascii_lowercase()));
            assert_eq!(commit_of(Some(&after)), expected, "{case}");
        }
    }

    #[test]
    fn secret_files_drop_one_trailing_newline_and_never_print() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("secret");
        std::fs::write(&path, "s3cret\n")?;
        let secret = WebhookSecret::from_file(&path).map_err(std::io::Error::other)?;
        assert_eq!(secret, WebhookSecret::new("s3cret"));
        assert_eq!(format!("{secret:?}"), "WebhookSecret(<redacted>)");
        std::fs::write(&path, "\n")?;
        assert!(WebhookSecret::from_file(&path).is_err());
        Ok(())
    }
}
