//! `POST /hooks/git`: authenticate a push notification, keep only pushes to the deployed
//! branch, and turn it into a sync request.
//!
//! Providers, recognised by their headers (first match wins):
//! - GitLab: `X-Gitlab-Token` must equal the secret;
//! - Forgejo: `X-Forgejo-Signature`, Gitea: `X-Gitea-Signature`, Gogs: `X-Gogs-Signature`: hex
//!   HMAC-SHA256 of the body (Gitea also sends Gogs's and GitHub's headers, so it is checked
//!   before them);
//! - GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`;
//! - Bitbucket Cloud (`X-Hook-UUID` / `X-Request-UUID` beside `X-Event-Key`) and Bitbucket
//!   Server / Data Center (`X-Event-Key` alone): `X-Hub-Signature: sha256=<hex>`;
//! - Azure DevOps (`X-VSS-ActivityId`): the service hook's basic authentication, whose
//!   password must equal the secret (any user name);
//! - generic (CI scripts, `voodu-agent sync`): `X-Voodu-Signature: sha256=<hex>`, and a JSON
//!   body with optional `ref` and `after` (an empty body means "fetch now").
//!
//! A refusal names the header the detected provider was expected to send.
//!
//! Invariants: with a secret, nothing is parsed or acted on before the signature or token
//! checks out, and every comparison is constant-time (`Mac::verify_slice`, `subtle`); without
//! a secret (allowed on loopback only) requests are accepted unsigned. The body is read only
//! up to the size cap. A request never queues work of its own: it sets the trigger's
//! coalescing flag (`git::trigger`), so a flood costs one fetch per new SHA. The SHA a push
//! names is a hint only: the agent deploys what the branch points to after its own fetch.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use http_body_util::BodyExt as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use super::{AppState, Error, HookSource};
use crate::git::trigger::{SyncReason, SyncRequest, Ticket};
use crate::model::CommitSha;
use crate::store::blocking;

/// The header of the generic HMAC form.
pub(crate) const GENERIC_SIGNATURE_HEADER: &str = "x-voodu-signature";

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
    pub(crate) fn from_file(path: &Path) -> super::Result<WebhookSecret> {
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
        crate::model::text::hex(&mac.finalize().into_bytes())
    }

    fn mac(&self) -> Hmac<Sha256> {
        crate::base::hmac_sha256(&self.0)
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
pub(crate) enum Provider {
    GitHub,
    GitLab,
    Gitea,
    Forgejo,
    Gogs,
    BitbucketCloud,
    BitbucketServer,
    AzureDevOps,
    Generic,
}

impl Provider {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Provider::GitHub => "github",
            Provider::GitLab => "gitlab",
            Provider::Gitea => "gitea",
            Provider::Forgejo => "forgejo",
            Provider::Gogs => "gogs",
            Provider::BitbucketCloud => "bitbucket-cloud",
            Provider::BitbucketServer => "bitbucket-server",
            Provider::AzureDevOps => "azure-devops",
            Provider::Generic => "generic",
        }
    }

    /// The header this provider authenticates with and what its value must be: the words a
    /// refusal uses, so the operator knows what to configure on the sending side.
    fn expects(self) -> (&'static str, &'static str) {
        match self {
            Provider::GitLab => ("X-Gitlab-Token", "the webhook secret"),
            Provider::Forgejo => (
                "X-Forgejo-Signature",
                "hex HMAC-SHA256 of the body, keyed with the webhook secret",
            ),
            Provider::Gitea => (
                "X-Gitea-Signature",
                "hex HMAC-SHA256 of the body, keyed with the webhook secret",
            ),
            Provider::Gogs => (
                "X-Gogs-Signature",
                "hex HMAC-SHA256 of the body, keyed with the webhook secret",
            ),
            Provider::GitHub => (
                "X-Hub-Signature-256",
                "sha256=<hex HMAC-SHA256 of the body>, keyed with the webhook secret",
            ),
            Provider::BitbucketCloud | Provider::BitbucketServer => (
                "X-Hub-Signature",
                "sha256=<hex HMAC-SHA256 of the body>, keyed with the webhook secret",
            ),
            Provider::AzureDevOps => (
                "Authorization",
                "Basic <base64 of user:password>, the service hook's basic authentication with the webhook secret as its password",
            ),
            Provider::Generic => (
                "X-Voodu-Signature",
                "sha256=<hex HMAC-SHA256 of the body>, keyed with the webhook secret (no git host was recognised from the headers)",
            ),
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Recognises the provider; Forgejo also sends Gitea's headers, Gitea Gogs's and GitHub's,
/// and GitHub Bitbucket's `X-Hub-Signature`, so the most specific comes first.
pub(crate) fn detect(headers: &HeaderMap) -> Provider {
    let has = |name: &str| headers.contains_key(name);
    if has("x-gitlab-token") || has("x-gitlab-event") {
        Provider::GitLab
    } else if has("x-forgejo-signature") || has("x-forgejo-event") {
        Provider::Forgejo
    } else if has("x-gitea-signature") || has("x-gitea-event") {
        Provider::Gitea
    } else if has("x-gogs-signature") || has("x-gogs-event") {
        Provider::Gogs
    } else if has("x-hub-signature-256") || has("x-github-event") {
        Provider::GitHub
    } else if has("x-event-key") && (has("x-hook-uuid") || has("x-request-uuid")) {
        Provider::BitbucketCloud
    } else if has("x-event-key") {
        Provider::BitbucketServer
    } else if has("x-vss-activityid") {
        Provider::AzureDevOps
    } else {
        Provider::Generic
    }
}

/// Why a request's signature or token is refused: the header the provider was expected to
/// send and what was wrong with it (never anything about the secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("missing {header} header ({provider} sends {header}: {form})")]
    Missing {
        provider: &'static str,
        header: &'static str,
        form: &'static str,
    },
    #[error("{0} does not match the webhook secret")]
    Token(&'static str),
    #[error("{0} does not match the body and the webhook secret")]
    Signature(&'static str),
    #[error("{0} is not `sha256=<hex>`")]
    NotSha256(&'static str),
    #[error("{0} is not `Basic <base64 of user:password>`")]
    NotBasic(&'static str),
    #[error("{0}: the password does not match the webhook secret")]
    Password(&'static str),
}

/// Why a push's body is not understood.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BadPush {
    #[error("form body without a `payload` field")]
    NoPayload,
    #[error("body is not a push payload: {0}")]
    Json(#[source] serde_json::Error),
}

/// Checks the provider's signature or token against `secret`; the error names the header the
/// provider was expected to send and what was wrong (never anything about the secret).
pub(crate) fn verify(
    provider: Provider,
    headers: &HeaderMap,
    body: &[u8],
    secret: &WebhookSecret,
) -> Result<(), Refusal> {
    let (name, form) = provider.expects();
    let missing = || Refusal::Missing {
        provider: provider.as_str(),
        header: name,
        form,
    };
    let mismatch = || Refusal::Signature(name);
    let value = || header(headers, &name.to_ascii_lowercase()).ok_or_else(missing);
    match provider {
        Provider::GitLab => {
            let token = value()?;
            secret
                .matches_token(token.as_bytes())
                .then_some(())
                .ok_or(Refusal::Token(name))
        }
        Provider::Forgejo | Provider::Gitea | Provider::Gogs => secret
            .verify_hex(body, value()?)
            .then_some(())
            .ok_or_else(mismatch),
        Provider::GitHub
        | Provider::BitbucketCloud
        | Provider::BitbucketServer
        | Provider::Generic => {
            let hex = value()?
                .strip_prefix("sha256=")
                .ok_or(Refusal::NotSha256(name))?;
            secret
                .verify_hex(body, hex)
                .then_some(())
                .ok_or_else(mismatch)
        }
        Provider::AzureDevOps => {
            let password = value()?
                .strip_prefix("Basic ")
                .and_then(basic_password)
                .ok_or(Refusal::NotBasic(name))?;
            secret
                .matches_token(&password)
                .then_some(())
                .ok_or(Refusal::Password(name))
        }
    }
}

/// The password of a basic-authentication credential (`base64(user:password)`).
fn basic_password(encoded: &str) -> Option<Vec<u8>> {
    let decoded = from_base64(encoded.trim())?;
    let colon = decoded.iter().position(|byte| *byte == b':')?;
    Some(decoded[colon + 1..].to_vec())
}

/// Standard base64 (RFC 4648, with padding); `None` for anything else.
fn from_base64(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// What kind of notification a request is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Push,
    Ping,
    Other(String),
}

fn event(provider: Provider, headers: &HeaderMap, body: &[u8]) -> Event {
    let (name, push, ping) = match provider {
        Provider::GitHub => ("x-github-event", "push", Some("ping")),
        Provider::GitLab => ("x-gitlab-event", "Push Hook", None),
        Provider::Gitea => ("x-gitea-event", "push", None),
        Provider::Forgejo => ("x-forgejo-event", "push", None),
        Provider::Gogs => ("x-gogs-event", "push", None),
        Provider::BitbucketCloud => ("x-event-key", "repo:push", None),
        Provider::BitbucketServer => ("x-event-key", "repo:refs_changed", Some("diagnostics:ping")),
        // Azure DevOps names the event in the body only.
        Provider::AzureDevOps => {
            #[derive(Deserialize)]
            struct Envelope {
                #[serde(rename = "eventType")]
                event_type: Option<String>,
            }
            return match serde_json::from_slice::<Envelope>(body)
                .ok()
                .and_then(|envelope| envelope.event_type)
            {
                Some(event_type) if event_type == "git.push" => Event::Push,
                Some(event_type) => Event::Other(event_type),
                None => Event::Other("a body without `eventType`".to_owned()),
            };
        }
        Provider::Generic => return Event::Push,
    };
    match header(headers, name) {
        None => Event::Push,
        Some(value) if value.eq_ignore_ascii_case(push) => Event::Push,
        Some(value) if Some(value) == ping => Event::Ping,
        Some(value) => Event::Other(value.to_owned()),
    }
}

/// The ref a push moved, the commit it names, and who pushed as the payload says (untrusted
/// text; the store makes it safe): the fields the agent reads.
#[derive(Debug, Default, PartialEq, Eq)]
struct Push {
    git_ref: Option<String>,
    after: Option<String>,
    actor: Option<String>,
}

/// The text at `value`, when it is text: a field of an unexpected shape names no one, it
/// never fails the push.
fn text(value: &serde_json::Value) -> Option<String> {
    value.as_str().map(ToOwned::to_owned)
}

/// GitHub, GitLab, Gitea, Forgejo, Gogs and the generic form: top-level `ref` and `after`,
/// and the fields that may name who pushed.
#[derive(Deserialize)]
struct FlatPush {
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    after: Option<String>,
    /// GitHub `{name}`, Gitea, Forgejo and Gogs `{login, username}`.
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

impl FlatPush {
    fn actor(&self) -> Option<String> {
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
pub(crate) const ORIGIN_HEADER: &str = "x-voodu-origin";
/// The header naming the user of that command.
pub(crate) const ACTOR_HEADER: &str = "x-voodu-actor";

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
                .or_else(|| push.actor.clone());
            (reason, actor)
        }
        _ => (SyncReason::Webhook, push.actor.clone()),
    }
}

/// Bitbucket Cloud `repo:push`: `push.changes[].new` is the branch after the push (`null`
/// when it was deleted).
#[derive(Deserialize)]
struct BitbucketCloudPush {
    push: BitbucketCloudChanges,
    /// `{display_name, nickname}`.
    #[serde(default)]
    actor: serde_json::Value,
}

#[derive(Deserialize)]
struct BitbucketCloudChanges {
    #[serde(default)]
    changes: Vec<BitbucketCloudChange>,
}

#[derive(Deserialize)]
struct BitbucketCloudChange {
    new: Option<BitbucketCloudRef>,
}

#[derive(Deserialize)]
struct BitbucketCloudRef {
    #[serde(rename = "type")]
    kind: String,
    name: String,
    target: Option<BitbucketCloudTarget>,
}

#[derive(Deserialize)]
struct BitbucketCloudTarget {
    hash: Option<String>,
}

/// Bitbucket Server / Data Center `repo:refs_changed`: `changes[]` with `refId` and `toHash`.
#[derive(Deserialize)]
struct BitbucketServerPush {
    #[serde(default)]
    changes: Vec<BitbucketServerChange>,
    /// `{name, displayName}`.
    #[serde(default)]
    actor: serde_json::Value,
}

#[derive(Deserialize)]
struct BitbucketServerChange {
    #[serde(rename = "refId")]
    ref_id: Option<String>,
    #[serde(rename = "toHash")]
    to_hash: Option<String>,
}

/// Azure DevOps `git.push`: `resource.refUpdates[]` with `name` and `newObjectId`.
#[derive(Deserialize)]
struct AzurePush {
    resource: AzureResource,
}

#[derive(Deserialize)]
struct AzureResource {
    #[serde(rename = "refUpdates", default)]
    ref_updates: Vec<AzureRefUpdate>,
    /// `{displayName, uniqueName}`.
    #[serde(rename = "pushedBy", default)]
    pushed_by: serde_json::Value,
}

#[derive(Deserialize)]
struct AzureRefUpdate {
    name: Option<String>,
    #[serde(rename = "newObjectId")]
    new_object_id: Option<String>,
}

/// One ref a push moved, and the commit it moved to.
type RefUpdate = (Option<String>, Option<String>);

/// Parses a push body: JSON, or GitHub's form encoding (`payload=<json>`); an empty body is
/// a bare "fetch now". A push that moves several refs (Bitbucket, Azure DevOps) gives the
/// update of `wanted_ref` when it has one, else its first.
/// The JSON of a push: the body, or the `payload` field of a form body (`None`: a form body
/// without one).
fn payload(headers: &HeaderMap, body: &[u8]) -> Option<Vec<u8>> {
    let is_form = header(headers, "content-type")
        .is_some_and(|value| value.starts_with("application/x-www-form-urlencoded"));
    if is_form {
        form_urlencoded::parse(body)
            .find(|(name, _)| name == "payload")
            .map(|(_, value)| value.into_owned().into_bytes())
    } else {
        Some(body.to_vec())
    }
}

fn parse_push(
    provider: Provider,
    headers: &HeaderMap,
    body: &[u8],
    wanted_ref: &str,
) -> Result<Push, BadPush> {
    let json = payload(headers, body).ok_or(BadPush::NoPayload)?;
    if json.iter().all(u8::is_ascii_whitespace) {
        return Ok(Push::default());
    }
    let not_a_push = BadPush::Json;
    let (updates, actor): (Vec<RefUpdate>, Option<String>) = match provider {
        Provider::BitbucketCloud => {
            let push = serde_json::from_slice::<BitbucketCloudPush>(&json).map_err(not_a_push)?;
            let actor = text(&push.actor["nickname"]).or_else(|| text(&push.actor["display_name"]));
            let updates = push
                .push
                .changes
                .into_iter()
                .filter_map(|change| change.new)
                .map(|new| {
                    let git_ref = match new.kind.as_str() {
                        "tag" => format!("refs/tags/{}", new.name),
                        _ => format!("refs/heads/{}", new.name),
                    };
                    (Some(git_ref), new.target.and_then(|target| target.hash))
                })
                .collect();
            (updates, actor)
        }
        Provider::BitbucketServer => {
            let push = serde_json::from_slice::<BitbucketServerPush>(&json).map_err(not_a_push)?;
            let actor = text(&push.actor["name"]).or_else(|| text(&push.actor["displayName"]));
            let updates = push
                .changes
                .into_iter()
                .map(|change| (change.ref_id, change.to_hash))
                .collect();
            (updates, actor)
        }
        Provider::AzureDevOps => {
            let push = serde_json::from_slice::<AzurePush>(&json).map_err(not_a_push)?;
            let pushed_by = &push.resource.pushed_by;
            let actor = text(&pushed_by["uniqueName"]).or_else(|| text(&pushed_by["displayName"]));
            let updates = push
                .resource
                .ref_updates
                .into_iter()
                .map(|update| (update.name, update.new_object_id))
                .collect();
            (updates, actor)
        }
        _ => {
            let flat = serde_json::from_slice::<FlatPush>(&json).map_err(not_a_push)?;
            let actor = flat.actor();
            return Ok(Push {
                git_ref: flat.git_ref,
                after: flat.after,
                actor,
            });
        }
    };
    let first = updates.first().map(|(git_ref, _)| git_ref.clone());
    match updates
        .into_iter()
        .find(|(git_ref, _)| git_ref.as_deref() == Some(wanted_ref))
    {
        Some((git_ref, after)) => Ok(Push {
            git_ref,
            after,
            actor,
        }),
        // A push that moved only other refs is ignored by its ref; one that names none
        // (a deleted branch) is a bare "fetch now".
        None => Ok(Push {
            git_ref: first.flatten(),
            after: None,
            actor,
        }),
    }
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
    /// The source to sync (`--sources`), for senders whose payload names no repository.
    source: Option<String>,
}

/// What became of one `POST /hooks/git`: the answer's `result`, and the `result` label of
/// `voodu_webhook_requests_total`. `voodu-agent sync` reads it back ([`HookResult::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HookResult {
    /// A fetch was queued.
    Accepted,
    /// A fetch that covers the push is already pending or done.
    Coalesced,
    /// (`?wait=true`) The commit is in desired state.
    Applied,
    /// (`?wait=true`) The commit was rejected; the host keeps the last applied one.
    Rejected,
    /// (`?wait=true`) The branch has moved past the pushed commit.
    Superseded,
    /// A provider's ping.
    Pong,
    /// Not a push, or a push to another branch.
    Ignored,
    /// The signature or token does not verify.
    Unauthorized,
    BadRequest,
    TooLarge,
    /// (`?wait=true`) Neither applied nor rejected in time.
    Timeout,
    /// (`?wait=true`) Too many requests are waiting.
    Busy,
    ShuttingDown,
    /// (`?wait=true`) The sync failed, or its outcome cannot be read.
    Error,
}

impl HookResult {
    const ALL: [HookResult; 14] = [
        HookResult::Accepted,
        HookResult::Coalesced,
        HookResult::Applied,
        HookResult::Rejected,
        HookResult::Superseded,
        HookResult::Pong,
        HookResult::Ignored,
        HookResult::Unauthorized,
        HookResult::BadRequest,
        HookResult::TooLarge,
        HookResult::Timeout,
        HookResult::Busy,
        HookResult::ShuttingDown,
        HookResult::Error,
    ];

    /// The answer's and the metric's text.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HookResult::Accepted => "accepted",
            HookResult::Coalesced => "coalesced",
            HookResult::Applied => "applied",
            HookResult::Rejected => "rejected",
            HookResult::Superseded => "superseded",
            HookResult::Pong => "pong",
            HookResult::Ignored => "ignored",
            HookResult::Unauthorized => "unauthorized",
            HookResult::BadRequest => "bad_request",
            HookResult::TooLarge => "too_large",
            HookResult::Timeout => "timeout",
            HookResult::Busy => "busy",
            HookResult::ShuttingDown => "shutting_down",
            HookResult::Error => "error",
        }
    }

    /// The result an answer's `text` names; `None` for a text this build does not know (an
    /// agent of another version).
    pub(crate) fn parse(text: &str) -> Option<HookResult> {
        HookResult::ALL
            .into_iter()
            .find(|result| result.as_str() == text)
    }
}

/// The JSON answer of `POST /hooks/git`.
#[derive(Debug, Serialize)]
pub(crate) struct HookAnswer {
    pub(crate) result: HookResult,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) provider: Option<&'static str>,
    /// The source the push synced (`--sources`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) commit: Option<String>,
    /// For `?wait=true`: the branch tip the answering fetch saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) branch_tip: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// For a rejected commit: every problem as `path:line:col: message`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) errors: Vec<String>,
}

impl HookAnswer {
    pub(super) fn new(result: HookResult) -> HookAnswer {
        HookAnswer {
            result,
            provider: None,
            source: None,
            commit: None,
            branch_tip: None,
            reason: None,
            errors: Vec::new(),
        }
    }

    pub(super) fn reason(mut self, reason: impl Into<String>) -> HookAnswer {
        self.reason = Some(reason.into());
        self
    }
}

pub(super) fn answer(state: &AppState, code: StatusCode, answer: HookAnswer) -> Response {
    state.ctx.metrics.record_webhook(answer.result.as_str());
    (code, Json(answer)).into_response()
}

/// Reads the body up to the cap and within the body timeout.
pub(super) async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, Response> {
    let max = state.ctx.options.max_body_bytes;
    let too_large = || {
        answer(
            state,
            StatusCode::PAYLOAD_TOO_LARGE,
            HookAnswer::new(HookResult::TooLarge).reason(format!("body larger than {max} bytes")),
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
            HookAnswer::new(HookResult::BadRequest).reason(format!("cannot read body: {error}")),
        )),
        Err(_) => Err(answer(
            state,
            StatusCode::REQUEST_TIMEOUT,
            HookAnswer::new(HookResult::BadRequest).reason("body not received in time"),
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
    let request = HookRequest {
        state: &state,
        provider,
        headers: &headers,
        body: &body,
    };
    let routed = match request.authenticate_and_route(query.source.as_deref()) {
        Ok(routed) => routed,
        Err(response) => return *response,
    };
    let (source, push) = match request.choose(routed) {
        Ok(chosen) => chosen,
        Err(response) => return *response,
    };
    request.sync(&query, source, &push).await
}

/// One webhook request, verified, routed and answered.
struct HookRequest<'a> {
    state: &'a AppState,
    provider: Provider,
    headers: &'a HeaderMap,
    body: &'a [u8],
}

impl<'a> HookRequest<'a> {
    fn with_provider(&self, mut hook_answer: HookAnswer) -> HookAnswer {
        hook_answer.provider = Some(self.provider.as_str());
        hook_answer
    }

    fn answer(&self, code: StatusCode, hook_answer: HookAnswer) -> Response {
        answer(self.state, code, self.with_provider(hook_answer))
    }

    fn unauthorized(&self, why: String) -> Response {
        let provider = self.provider;
        tracing::warn!(provider = provider.as_str(), %why, "webhook refused");
        let mut response = self.answer(
            StatusCode::UNAUTHORIZED,
            HookAnswer::new(HookResult::Unauthorized).reason(why),
        );
        if provider == Provider::AzureDevOps {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Basic realm=\"voodu-agent webhook\""),
            );
        }
        response
    }

    /// The sources the request is for (`named`, else all), those whose secret it verifies
    /// with, then, for a push, those that follow the repository it names. `Err`: the answer
    /// (unknown source, unauthorized, a ping or another event, a repository nobody follows).
    fn authenticate_and_route(
        &self,
        named: Option<&str>,
    ) -> Result<Vec<&'a HookSource>, Box<Response>> {
        let (provider, headers, body) = (self.provider, self.headers, self.body);
        let sources = &self.state.ctx.sources;
        let candidates: Vec<&HookSource> = match named {
            Some(name) => sources
                .iter()
                .filter(|source| source.name == name)
                .collect(),
            None => sources.iter().collect(),
        };
        if candidates.is_empty() {
            // Said before any signature is checked: the names of the sources are not told.
            return Err(Box::new(
                self.answer(
                    StatusCode::NOT_FOUND,
                    HookAnswer::new(HookResult::BadRequest).reason(
                        "no source of that name (`voodu-agent status` on the host lists them)",
                    ),
                ),
            ));
        }
        // Before anything is parsed: the request must verify with the secret of a source it
        // may be for (each source's own, else the agent's).
        let mut refusal = None;
        let (verified, unverified): (Vec<&HookSource>, Vec<&HookSource>) =
            candidates.into_iter().partition(|source| {
                let Some(secret) =
                    source
                        .secret
                        .as_ref()
                        .or(self.state.ctx.options.secret.as_ref())
                else {
                    return true;
                };
                match verify(provider, headers, body, secret) {
                    Ok(()) => true,
                    Err(why) => {
                        refusal.get_or_insert(why.to_string());
                        false
                    }
                }
            });
        if verified.is_empty() {
            return Err(Box::new(self.unauthorized(refusal.unwrap_or_default())));
        }
        match event(provider, headers, body) {
            Event::Push => {}
            Event::Ping => {
                return Err(Box::new(
                    self.answer(StatusCode::OK, HookAnswer::new(HookResult::Pong)),
                ));
            }
            Event::Other(name) => {
                return Err(Box::new(
                    self.answer(
                        StatusCode::ACCEPTED,
                        HookAnswer::new(HookResult::Ignored)
                            .reason(format!("event {name:?} is not a push; only pushes sync")),
                    ),
                ));
            }
        }
        // With several sources, a push syncs the sources that follow the repository it names
        // (or the one `?source=` names).
        if sources.len() == 1 || named.is_some() {
            return Ok(verified);
        }
        let named = pushed_repositories(headers, body);
        if named.is_empty() && provider == Provider::Generic {
            // A bare "fetch now" (`voodu-agent sync`, a script): every source it may sync.
            return Ok(verified);
        }
        let following: Vec<&HookSource> = verified
            .into_iter()
            .filter(|source| follows(source, &named))
            .collect();
        if following.is_empty() && unverified.iter().any(|source| follows(source, &named)) {
            // The repository is a source's whose secret this request does not have.
            return Err(Box::new(self.unauthorized(refusal.unwrap_or_default())));
        }
        if following.is_empty() {
            return Err(Box::new(self.answer(
                StatusCode::ACCEPTED,
                HookAnswer::new(HookResult::Ignored).reason(match named.first() {
                    Some(repository) => format!(
                        "the push names repository {repository}; no source of this agent follows it (or add ?source=NAME to the webhook URL)"
                    ),
                    None => "the push names no repository; add ?source=NAME to the webhook URL".to_owned(),
                }),
            )));
        }
        Ok(following)
    }

    /// The first routed source whose branch the push moves, with the push; the others on
    /// that branch get a fetch too. `Err`: the answer (a body that is not a push, a push to
    /// another branch).
    fn choose(&self, routed: Vec<&'a HookSource>) -> Result<(&'a HookSource, Push), Box<Response>> {
        let (provider, headers, body) = (self.provider, self.headers, self.body);
        let mut ignored = None;
        let mut previewed = None;
        let mut chosen: Option<(&HookSource, Push)> = None;
        for source in routed {
            let wanted_ref = format!("refs/heads/{}", source.branch);
            let push = match parse_push(provider, headers, body, &wanted_ref) {
                Ok(push) => push,
                Err(why) => {
                    return Err(Box::new(self.answer(
                        StatusCode::BAD_REQUEST,
                        HookAnswer::new(HookResult::BadRequest).reason(why.to_string()),
                    )));
                }
            };
            if let Some(git_ref) = &push.git_ref
                && *git_ref != wanted_ref
            {
                // A branch the source previews: its previews' poll starts now.
                if let Some(previews) = &source.previews
                    && let Some(branch) = git_ref.strip_prefix("refs/heads/")
                    && previews.rules.slug(branch).is_some()
                {
                    previews.wake.notify_one();
                    previewed.get_or_insert(format!(
                        "push to {git_ref}: its branch preview is polled now"
                    ));
                    continue;
                }
                ignored.get_or_insert(format!(
                    "push to {git_ref}; this agent deploys {wanted_ref}"
                ));
                continue;
            }
            match &chosen {
                // Another source on the same repository and branch (other paths): a fetch too.
                Some(_) => {
                    let (reason, actor) = request_origin(provider, headers, &push);
                    source.requests.request(SyncRequest {
                        reason,
                        commit: commit_of(push.after.as_deref()),
                        actor,
                    });
                }
                None => chosen = Some((source, push)),
            }
        }
        chosen.ok_or_else(|| {
            Box::new(match previewed {
                Some(reason) => self.answer(
                    StatusCode::ACCEPTED,
                    HookAnswer::new(HookResult::Accepted).reason(reason),
                ),
                None => self.answer(
                    StatusCode::ACCEPTED,
                    HookAnswer::new(HookResult::Ignored).reason(ignored.unwrap_or_default()),
                ),
            })
        })
    }

    /// Asks `source` for a fetch of `push`; answers at once, or (`?wait`) once the sync of
    /// the commit ended or the wait timed out.
    async fn sync(&self, query: &HookQuery, source: &HookSource, push: &Push) -> Response {
        let state = self.state;
        let with_source = |mut hook_answer: HookAnswer| {
            if !source.name.is_empty() {
                hook_answer.source = Some(source.name.clone());
            }
            self.with_provider(hook_answer)
        };
        let commit = commit_of(push.after.as_deref());
        let (reason, actor) = request_origin(self.provider, self.headers, push);
        let ticket = source.requests.request(SyncRequest {
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
                HookResult::Coalesced
            } else {
                HookResult::Accepted
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
            return answer(state, StatusCode::ACCEPTED, with_source(hook_answer));
        }
        let timeout = match query.timeout.as_deref().map(humantime::parse_duration) {
            None => state.ctx.options.wait_timeout,
            Some(Ok(timeout)) => timeout.min(MAX_WAIT),
            Some(Err(error)) => {
                return answer(
                    state,
                    StatusCode::BAD_REQUEST,
                    with_source(
                        HookAnswer::new(HookResult::BadRequest).reason(format!("timeout: {error}")),
                    ),
                );
            }
        };
        let (code, hook_answer) = wait_for_outcome(state, source, ticket, commit, timeout).await;
        answer(state, code, with_source(hook_answer))
    }
}

/// Whether `source` follows one of the repositories a push names (`pushed_repositories`):
/// the same repository identity, or its `owner/name` at the end of the source's URL.
fn follows(source: &HookSource, named: &[String]) -> bool {
    names_repository(&source.url, named)
}

/// Whether one of `named` is the repository whose identity is `own`.
fn names_repository(own: &str, named: &[String]) -> bool {
    named.iter().any(|repository| {
        let repository = repository.trim().trim_end_matches('/');
        if crate::model::repo_identity(repository) == own {
            return true;
        }
        // `owner/name` (GitHub's `full_name`, GitLab's `path_with_namespace`): the end of a
        // network URL's path, compared as the host compares it (case-insensitively).
        let full_name = repository.to_ascii_lowercase();
        let full_name = full_name.strip_suffix(".git").unwrap_or(&full_name);
        !own.starts_with('/')
            && full_name.contains('/')
            && !full_name.contains(':')
            && !full_name.starts_with('/')
            && own.ends_with(&format!("/{full_name}"))
    })
}

/// The repository a push payload names, as URLs and `owner/name`s, in the fields of each
/// provider (GitHub, Gitea/Forgejo/Gogs `repository.*_url` and `full_name`; GitLab
/// `project.*`; Bitbucket `repository.full_name`, `links`; Azure DevOps
/// `resource.repository.remoteUrl`; the generic form's `repository`). Untrusted text, read
/// only to choose among this agent's own sources; at most 16 names of at most 512 bytes.
fn pushed_repositories(headers: &HeaderMap, body: &[u8]) -> Vec<String> {
    let json = payload(headers, body).unwrap_or_default();
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&json) else {
        return Vec::new();
    };
    let pointers = [
        "/repository/clone_url",
        "/repository/ssh_url",
        "/repository/html_url",
        "/repository/git_url",
        "/repository/url",
        "/repository/git_http_url",
        "/repository/git_ssh_url",
        "/repository/full_name",
        "/repository/links/html/href",
        "/repository",
        "/project/git_http_url",
        "/project/git_ssh_url",
        "/project/web_url",
        "/project/path_with_namespace",
        "/resource/repository/remoteUrl",
        "/resource/repository/sshUrl",
    ];
    let mut named: Vec<String> = pointers
        .iter()
        .filter_map(|pointer| value.pointer(pointer)?.as_str())
        .filter(|text| !text.is_empty() && text.len() <= 512)
        .map(ToOwned::to_owned)
        .collect();
    // Bitbucket Server: the project key and the repository slug, and its clone links.
    if let (Some(project), Some(slug)) = (
        value
            .pointer("/repository/project/key")
            .and_then(|key| key.as_str()),
        value
            .pointer("/repository/slug")
            .and_then(|slug| slug.as_str()),
    ) {
        named.push(format!("{project}/{slug}"));
    }
    if let Some(links) = value
        .pointer("/repository/links/clone")
        .and_then(|links| links.as_array())
    {
        named.extend(
            links
                .iter()
                .filter_map(|link| link.get("href")?.as_str())
                .filter(|href| href.len() <= 512)
                .map(ToOwned::to_owned),
        );
    }
    named.truncate(16);
    named
}

/// Waits until the fetch of `ticket` has ended, then reads the outcome of `commit` (or of
/// the branch tip it saw, for a push without a SHA) from the store.
async fn wait_for_outcome(
    state: &AppState,
    source: &HookSource,
    ticket: Ticket,
    commit: Option<CommitSha>,
    timeout: Duration,
) -> (StatusCode, HookAnswer) {
    let mut pending = HookAnswer::new(HookResult::Timeout);
    pending.commit = commit.as_ref().map(ToString::to_string);
    let Ok(_permit) = state.waiters.clone().try_acquire_owned() else {
        pending.result = HookResult::Busy;
        pending.reason =
            Some("too many requests are waiting; the sync was requested anyway".to_owned());
        return (StatusCode::TOO_MANY_REQUESTS, pending);
    };
    let report = tokio::select! {
        report = source.requests.fetched(ticket) => report,
        () = tokio::time::sleep(timeout) => {
            pending.reason = Some(format!(
                "not applied or rejected within {}; the sync goes on in the background",
                humantime::format_duration(timeout)
            ));
            return (StatusCode::GATEWAY_TIMEOUT, pending);
        }
        () = state.shutdown.cancelled() => {
            pending.result = HookResult::ShuttingDown;
            pending.reason = Some("the agent is stopping".to_owned());
            return (StatusCode::SERVICE_UNAVAILABLE, pending);
        }
    };
    let tip = match report.result {
        Ok(tip) => tip,
        Err(message) => {
            pending.result = HookResult::Error;
            pending.reason = Some(format!("sync failed: {message}"));
            return (StatusCode::BAD_GATEWAY, pending);
        }
    };
    pending.branch_tip = Some(tip.to_string());
    let target = commit.unwrap_or_else(|| tip.clone());
    pending.commit = Some(target.to_string());
    let record = {
        let target = target.clone();
        blocking(&source.store, move |store| {
            Ok((store.commit_record(&target)?, store.hold()?))
        })
        .await
    };
    match record {
        // The branch has moved past the pushed commit: whatever happened to it once, it is
        // not what the host converges to now.
        Ok((record, _)) if target != tip => {
            pending.result = HookResult::Superseded;
            pending.reason = Some(match record {
                Some(record) => format!(
                    "the branch has moved on to {}; {} is not its tip; {}",
                    tip.short(),
                    target.short(),
                    if record.applied {
                        "it was applied before and is no longer"
                    } else {
                        "it was rejected before"
                    }
                ),
                // Never seen as the tip: a commit of another branch, an intermediate commit
                // of a push, or no commit at all. Nothing of it is deployed.
                None => not_the_tip(&source.branch, &target, &tip),
            });
            (StatusCode::CONFLICT, pending)
        }
        Ok((Some(record), _)) if record.applied => {
            pending.result = HookResult::Applied;
            pending.reason =
                Some("in desired state; the reconciler converges containers from here".to_owned());
            (StatusCode::OK, pending)
        }
        Ok((Some(record), _)) => {
            pending.result = HookResult::Rejected;
            pending.reason = Some("the host keeps running the last applied commit".to_owned());
            pending.errors = record.errors.iter().map(ToString::to_string).collect();
            (StatusCode::UNPROCESSABLE_ENTITY, pending)
        }
        // Accepted, held by a deploy window or a freeze: applied when it opens.
        Ok((None, Some(hold))) if hold.commit == target => {
            pending.result = HookResult::Accepted;
            pending.reason = Some(format!(
                "held until {}: {}",
                hold.until.map_or_else(
                    || "no opening ahead".to_owned(),
                    crate::base::rfc3339_seconds
                ),
                hold.reason
            ));
            (StatusCode::ACCEPTED, pending)
        }
        Ok((None, _)) => {
            pending.result = HookResult::Error;
            pending.reason = Some(format!(
                "{} was fetched as the branch tip but no outcome is recorded for it (the sync failed after the fetch; see `status`)",
                target.short()
            ));
            (StatusCode::BAD_GATEWAY, pending)
        }
        Err(error) => {
            pending.result = HookResult::Error;
            pending.reason = Some(error.to_string());
            (StatusCode::INTERNAL_SERVER_ERROR, pending)
        }
    }
}

/// Why a pushed SHA the branch never had as its tip is not what the agent deploys.
fn not_the_tip(branch: &str, target: &CommitSha, tip: &CommitSha) -> String {
    format!(
        "{} is not the tip of branch {branch:?} after the agent's own fetch (the tip is {}); a push's `after` is only a hint: the agent deploys what the branch points to",
        target.short(),
        tip.short()
    )
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

    #[test]
    fn a_hook_result_is_the_text_answers_and_metrics_have_always_carried() -> serde_json::Result<()>
    {
        // The texts the answer and the metric label carried when they were string literals.
        let texts = [
            "accepted",
            "coalesced",
            "applied",
            "rejected",
            "superseded",
            "pong",
            "ignored",
            "unauthorized",
            "bad_request",
            "too_large",
            "timeout",
            "busy",
            "shutting_down",
            "error",
        ];
        assert_eq!(HookResult::ALL.map(HookResult::as_str), texts);
        for (result, text) in HookResult::ALL.into_iter().zip(texts) {
            assert_eq!(serde_json::to_value(result)?, text, "the JSON is the label");
            assert_eq!(HookResult::parse(text), Some(result), "{text}");
        }
        assert_eq!(
            HookResult::parse("deferred"),
            None,
            "a newer agent's result is not taken for one this build knows"
        );
        assert_eq!(HookResult::parse(""), None);
        Ok(())
    }

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
    fn check(pairs: &[(&'static str, &str)], body: &[u8]) -> (Provider, Result<(), String>) {
        let map = headers(pairs);
        let provider = detect(&map);
        (
            provider,
            verify(provider, &map, body, &secret()).map_err(|refusal| refusal.to_string()),
        )
    }

    /// The refusal of one request (empty when it was accepted).
    fn refusal(pairs: &[(&'static str, &str)], body: &[u8]) -> String {
        check(pairs, body).1.err().unwrap_or_default()
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
            refusal(&[("x-hub-signature-256", &wrong)], BODY),
            "X-Hub-Signature-256 does not match the body and the webhook secret"
        );
        assert_eq!(
            refusal(&[("x-hub-signature-256", &good)], b"tampered"),
            "X-Hub-Signature-256 does not match the body and the webhook secret"
        );
        let unprefixed = good.trim_start_matches("sha256=").to_owned();
        assert_eq!(
            refusal(&[("x-hub-signature-256", &unprefixed)], BODY),
            "X-Hub-Signature-256 is not `sha256=<hex>`"
        );
        assert_eq!(
            check(&[("x-github-event", "push")], BODY),
            (
                Provider::GitHub,
                Err("missing X-Hub-Signature-256 header (github sends X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>, keyed with the webhook secret)".to_owned())
            )
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
            refusal(&[("x-gitlab-token", "It's a Secret to Everybod")], BODY),
            "X-Gitlab-Token does not match the webhook secret"
        );
        assert_eq!(
            refusal(&[("x-gitlab-event", "Push Hook")], BODY),
            "missing X-Gitlab-Token header (gitlab sends X-Gitlab-Token: the webhook secret)"
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
            refusal(&[("x-forgejo-signature", &wrong)], BODY),
            "X-Forgejo-Signature does not match the body and the webhook secret"
        );
        assert_eq!(
            refusal(&[("x-gitea-signature", "not hex")], BODY),
            "X-Gitea-Signature does not match the body and the webhook secret"
        );
        // Gitea also sends Gogs's and GitHub's headers: Gitea's decide.
        assert_eq!(
            check(
                &[
                    ("x-gitea-signature", &hex),
                    ("x-gogs-signature", &wrong),
                    ("x-github-event", "push")
                ],
                BODY
            ),
            (Provider::Gitea, Ok(()))
        );
    }

    #[test]
    fn generic_form_uses_the_voodu_header() {
        let good = secret().sign(BODY);
        assert_eq!(
            check(&[(GENERIC_SIGNATURE_HEADER, &good)], BODY),
            (Provider::Generic, Ok(()))
        );
        let missing = refusal(&[], BODY);
        assert!(
            missing.starts_with("missing X-Voodu-Signature header")
                && missing.contains("no git host was recognised"),
            "{missing}"
        );
        assert_eq!(
            refusal(&[(GENERIC_SIGNATURE_HEADER, &good)], b"{}"),
            "X-Voodu-Signature does not match the body and the webhook secret"
        );
    }

    /// Gogs's documented push example (gogs.io/advancing/webhooks, "Example payload"),
    /// abridged to the fields that matter here; its headers are `X-Gogs-Event: push` and
    /// `X-Gogs-Signature: <hex HMAC-SHA256>`.
    /// Each git host's push names its repository in its own fields; a source follows the
    /// push when one of them is its repository, whatever the URL's form (https, ssh, scp).
    #[test]
    fn each_providers_push_is_routed_by_the_repository_it_names() {
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "github",
                r#"{"repository":{"clone_url":"https://github.com/acme/shop.git","ssh_url":"git@github.com:acme/shop.git","full_name":"acme/shop"}}"#,
                &[
                    "https://github.com/acme/shop.git",
                    "git@github.com:acme/shop.git",
                    "ssh://git@github.com/Acme/Shop",
                ],
            ),
            (
                "gitlab",
                r#"{"project":{"git_http_url":"https://gitlab.example.com/ops/shop.git","git_ssh_url":"git@gitlab.example.com:ops/shop.git","path_with_namespace":"ops/shop"}}"#,
                &[
                    "https://gitlab.example.com/ops/shop.git",
                    "git@gitlab.example.com:ops/shop.git",
                ],
            ),
            (
                "gogs",
                GOGS_PUSH,
                &["https://try.gogs.io/alice/moonlanding.git"],
            ),
            (
                "bitbucket cloud",
                BITBUCKET_CLOUD_PUSH,
                &["git@bitbucket.org:team_name/repo_name.git"],
            ),
            (
                "bitbucket server",
                BITBUCKET_SERVER_PUSH,
                &["https://bitbucket.example.com/scm/proj/repository.git"],
            ),
            (
                "azure devops",
                r#"{"resource":{"repository":{"remoteUrl":"https://dev.azure.com/fabrikam/proj/_git/shop"}}}"#,
                &["https://dev.azure.com/fabrikam/proj/_git/shop"],
            ),
            (
                "generic",
                r#"{"ref":"refs/heads/main","repository":"https://git.example.com/acme/shop.git"}"#,
                &["https://git.example.com/acme/shop"],
            ),
        ];
        for (provider, body, followers) in cases {
            let named = pushed_repositories(&HeaderMap::new(), body.as_bytes());
            for url in *followers {
                assert!(
                    names_repository(&crate::model::repo_identity(url), &named),
                    "{provider}: {url} should follow {named:?}"
                );
            }
            for other in [
                "https://github.com/acme/blog.git",
                "https://elsewhere.example/x/y.git",
            ] {
                assert!(
                    !names_repository(&crate::model::repo_identity(other), &named),
                    "{provider}: {other} follows {named:?}"
                );
            }
        }
        assert!(pushed_repositories(&HeaderMap::new(), b"{}").is_empty());
        assert!(pushed_repositories(&HeaderMap::new(), b"not json").is_empty());
    }

    const GOGS_PUSH: &str = include_str!("../../tests/fixtures/webhooks/gogs-push.json");

    /// Bitbucket Cloud `repo:push` (support.atlassian.com/bitbucket-cloud/docs/event-payloads,
    /// "Push"): `push.changes[]` with `new` and `old` branch states (`type`, `name`,
    /// `target.hash`) and `created`/`forced`/`closed`; abridged, hashes illustrative.
    const BITBUCKET_CLOUD_PUSH: &str =
        include_str!("../../tests/fixtures/webhooks/bitbucket-cloud-push.json");

    /// Bitbucket Data Center `repo:refs_changed` (confluence.atlassian.com/bitbucketserver,
    /// "Event payload", Push), abridged: `changes[]` with `ref`, `refId`, `fromHash`,
    /// `toHash` and `type`.
    const BITBUCKET_SERVER_PUSH: &str =
        include_str!("../../tests/fixtures/webhooks/bitbucket-server-push.json");

    /// Azure DevOps service hook "Code pushed" (`git.push`, learn.microsoft.com
    /// azure/devops/service-hooks/events, "Code pushed"), abridged to the envelope and
    /// `resource.refUpdates`.
    const AZURE_DEVOPS_PUSH: &str =
        include_str!("../../tests/fixtures/webhooks/azure-devops-push.json");

    /// One provider's documented push: detected from its headers, accepted when signed with
    /// the secret, refused naming `expected_header` when signed with another, read as a push
    /// of `after` to main.
    fn check_provider(
        provider: Provider,
        body: &str,
        signed: &dyn Fn(&WebhookSecret) -> Vec<(&'static str, String)>,
        expected_header: &str,
        after: &str,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let body = body.as_bytes();
        let as_headers = |pairs: Vec<(&'static str, String)>| {
            let pairs: Vec<(&'static str, &str)> = pairs
                .iter()
                .map(|(name, value)| (*name, value.as_str()))
                .collect();
            headers(&pairs)
        };
        let good = as_headers(signed(&secret()));
        assert_eq!(detect(&good), provider);
        assert_eq!(
            verify(provider, &good, body, &secret()),
            Ok(()),
            "{provider:?}"
        );
        let wrong = as_headers(signed(&WebhookSecret::new("not the secret")));
        let refusal = verify(provider, &wrong, body, &secret())
            .err()
            .map(|refusal| refusal.to_string())
            .unwrap_or_default();
        assert!(
            refusal.starts_with(expected_header),
            "{provider:?}: {refusal}"
        );
        let tampered = verify(provider, &good, &body[1..], &secret());
        if provider != Provider::AzureDevOps {
            assert!(
                tampered.is_err(),
                "{provider:?}: a changed body must not verify"
            );
        }
        assert_eq!(event(provider, &good, body), Event::Push, "{provider:?}");
        let push = parse_push(provider, &good, body, "refs/heads/main")?;
        assert_eq!(push.git_ref.as_deref(), Some("refs/heads/main"));
        assert_eq!(
            commit_of(push.after.as_deref()),
            Some(CommitSha::new(after))
        );
        Ok(())
    }

    #[test]
    fn gogs_bitbucket_and_azure_devops_pushes_from_their_documented_payloads()
    -> Result<(), Box<dyn std::error::Error>> {
        check_provider(
            Provider::Gogs,
            GOGS_PUSH,
            &|secret| {
                vec![
                    (
                        "x-gogs-delivery",
                        "f6266f16-1bf3-46a5-9ea4-602e06ead473".into(),
                    ),
                    ("x-gogs-event", "push".into()),
                    ("x-gogs-signature", secret.hmac_hex(GOGS_PUSH.as_bytes())),
                ]
            },
            "X-Gogs-Signature",
            "bffeb74224043ba2feb48d137756c8a9331c449a",
        )?;
        check_provider(
            Provider::BitbucketCloud,
            BITBUCKET_CLOUD_PUSH,
            &|secret| {
                vec![
                    ("x-event-key", "repo:push".into()),
                    ("x-hook-uuid", "cb4f6d6e-4b43-4a5b-9c5b-1a1b2c3d4e5f".into()),
                    (
                        "x-request-uuid",
                        "afe5b0e6-9a6c-4c7f-8d2b-0123456789ab".into(),
                    ),
                    ("x-attempt-number", "1".into()),
                    (
                        "x-hub-signature",
                        secret.sign(BITBUCKET_CLOUD_PUSH.as_bytes()),
                    ),
                ]
            },
            "X-Hub-Signature",
            "709d658dc5b6d6afcd46049c2f332ee3f515a67d",
        )?;
        check_provider(
            Provider::BitbucketServer,
            BITBUCKET_SERVER_PUSH,
            &|secret| {
                vec![
                    ("x-event-key", "repo:refs_changed".into()),
                    (
                        "x-request-id",
                        "d5a5b5f8-2f6a-4a6e-9a5e-3b7f1c2d4e6a".into(),
                    ),
                    (
                        "x-hub-signature",
                        secret.sign(BITBUCKET_SERVER_PUSH.as_bytes()),
                    ),
                ]
            },
            "X-Hub-Signature",
            "178864a7d521b6f5e720b386b2c2b0ef8563e0dc",
        )?;
        check_provider(
            Provider::AzureDevOps,
            AZURE_DEVOPS_PUSH,
            &|secret| {
                let credentials = format!("voodu:{}", String::from_utf8_lossy(&secret.0));
                vec![
                    (
                        "x-vss-activityid",
                        "4d3c2b1a-0000-0000-0000-000000000000".into(),
                    ),
                    (
                        "x-vss-subscriptionid",
                        "00000000-0000-0000-0000-000000000000".into(),
                    ),
                    (
                        "authorization",
                        format!("Basic {}", to_base64(credentials.as_bytes())),
                    ),
                ]
            },
            "Authorization",
            "33b55f7cb7e7e245323987634f960cf4a6e6bc74",
        )
    }

    #[test]
    fn a_refusal_names_the_header_the_detected_provider_sends() {
        let cases: [(&[(&'static str, &str)], &str); 5] = [
            (
                &[("x-gogs-event", "push")],
                "missing X-Gogs-Signature header (gogs sends",
            ),
            (
                &[("x-event-key", "repo:push"), ("x-hook-uuid", "x")],
                "missing X-Hub-Signature header (bitbucket-cloud sends",
            ),
            (
                &[("x-event-key", "repo:refs_changed")],
                "missing X-Hub-Signature header (bitbucket-server sends",
            ),
            (
                &[("x-vss-activityid", "x")],
                "missing Authorization header (azure-devops sends Authorization: Basic",
            ),
            (
                &[("x-vss-activityid", "x"), ("authorization", "Bearer abc")],
                "Authorization is not `Basic <base64 of user:password>`",
            ),
        ];
        for (pairs, expected) in cases {
            let refusal = refusal(pairs, BODY);
            assert!(refusal.starts_with(expected), "{pairs:?}: {refusal}");
        }
    }

    #[test]
    fn pushes_that_move_other_refs_are_read_as_such() -> Result<(), Box<dyn std::error::Error>> {
        // A Bitbucket Server push that moved only another branch is ignored by its ref.
        let other = BITBUCKET_SERVER_PUSH.replace("refs/heads/main", "refs/heads/dev");
        let push = parse_push(
            Provider::BitbucketServer,
            &HeaderMap::new(),
            other.as_bytes(),
            "refs/heads/main",
        )?;
        assert_eq!(push.git_ref.as_deref(), Some("refs/heads/dev"));
        // A deleted branch on Bitbucket Cloud (`new: null`) names no commit.
        let deleted =
            r#"{"push":{"changes":[{"new":null,"old":{"type":"branch","name":"main"}}]}}"#;
        let push = parse_push(
            Provider::BitbucketCloud,
            &HeaderMap::new(),
            deleted.as_bytes(),
            "refs/heads/main",
        )?;
        assert_eq!(push, Push::default());
        // Azure DevOps names the event in the body: other service-hook events are ignored.
        let map = headers(&[("x-vss-activityid", "x")]);
        let merged = AZURE_DEVOPS_PUSH.replace("git.push", "git.pullrequest.merged");
        assert_eq!(
            event(Provider::AzureDevOps, &map, merged.as_bytes()),
            Event::Other("git.pullrequest.merged".into())
        );
        let map = headers(&[("x-event-key", "diagnostics:ping")]);
        assert_eq!(event(detect(&map), &map, b""), Event::Ping);
        Ok(())
    }

    /// Standard base64, for building test credentials.
    fn to_base64(bytes: &[u8]) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let group = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let bits = u32::from_be_bytes([0, group[0], group[1], group[2]]);
            for index in 0..4 {
                if index <= chunk.len() {
                    out.push(char::from(
                        ALPHABET[(bits >> (18 - 6 * index)) as usize & 63],
                    ));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[test]
    fn base64_decodes_as_rfc_4648_says() {
        for text in [
            "",
            "f",
            "fo",
            "foo",
            "foob",
            "fooba",
            "foobar",
            "user:p@ss:word",
        ] {
            assert_eq!(
                from_base64(&to_base64(text.as_bytes())).as_deref(),
                Some(text.as_bytes())
            );
        }
        // RFC 4648 section 10 test vector.
        assert_eq!(from_base64("Zm9vYmFy").as_deref(), Some(&b"foobar"[..]));
        assert_eq!(from_base64("Zm9v!mFy"), None);
        assert_eq!(from_base64("Zm9"), None);
        assert_eq!(
            basic_password("dTpzZWNyZXQ=").as_deref(),
            Some(&b"secret"[..])
        );
    }

    #[test]
    fn events_other_than_push_are_recognised() {
        let map = headers(&[("x-github-event", "ping")]);
        assert_eq!(event(detect(&map), &map, b""), Event::Ping);
        let map = headers(&[("x-gitlab-event", "Merge Request Hook")]);
        assert_eq!(
            event(detect(&map), &map, b""),
            Event::Other("Merge Request Hook".into())
        );
        let map = headers(&[("x-gitea-event", "push")]);
        assert_eq!(event(detect(&map), &map, b""), Event::Push);
    }

    #[test]
    fn push_payloads_parse_from_json_form_and_empty_bodies()
    -> Result<(), Box<dyn std::error::Error>> {
        let parse = |headers: &HeaderMap, body: &[u8]| {
            parse_push(Provider::Generic, headers, body, "refs/heads/main")
        };
        let push = parse(&HeaderMap::new(), BODY)?;
        assert_eq!(push.git_ref.as_deref(), Some("refs/heads/main"));
        let form: String = form_urlencoded::Serializer::new(String::new())
            .append_pair(
                "payload",
                std::str::from_utf8(BODY).map_err(|e| e.to_string())?,
            )
            .finish();
        let form_headers = headers(&[("content-type", "application/x-www-form-urlencoded")]);
        assert_eq!(parse(&form_headers, form.as_bytes())?, push);
        assert_eq!(parse(&HeaderMap::new(), b"  \n")?, Push::default());
        assert!(parse(&HeaderMap::new(), b"{not json").is_err());
        Ok(())
    }

    #[test]
    fn pushes_name_their_origin_and_pusher() -> Result<(), Box<dyn std::error::Error>> {
        let none = HeaderMap::new();
        let check = |provider, headers: &HeaderMap, body: &[u8], reason, actor: Option<&str>| {
            let push = parse_push(provider, &HeaderMap::new(), body, "refs/heads/main")?;
            assert_eq!(
                request_origin(provider, headers, &push),
                (reason, actor.map(ToOwned::to_owned)),
                "{}",
                String::from_utf8_lossy(body)
            );
            Ok::<(), BadPush>(())
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
