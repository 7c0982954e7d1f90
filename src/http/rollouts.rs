//! `POST /api/rollouts/{scope}/{name}/promote` and `POST /api/rollouts/{scope}/{name}/abort`:
//! the API form of `voodu-agent promote` / `abort` on a deployment's progressive rollout
//! (`canary {}` / `blue_green {}`). The request is left in the store for the reconciler
//! (`Store::request_rollout`: one transaction with its activity row, `rollout.promote` /
//! `rollout.abort`, and its outbox event, `rollout.promoted` / `rollout.aborted`), recorded as
//! made by the caller (origin `http`, or `cli` for a `voodu-agent` command; the actor from
//! `X-Voodu-Actor`), then the deployment is queued for a pass at once (`Store::queue_pass`).
//!
//! Answers (JSON, `{"result": …}`): 202 `requested` with the rollout as it stood; 401
//! `unauthorized`; 403 `forbidden` (a browser's request); 404 `not_found` (no such
//! deployment); 409 `no_rollout` (no canary or blue/green rollout in flight); 400, 413, 500.
//!
//! Invariants: authenticated like `POST /hooks/git`, the agent's other mutating call: with a
//! webhook secret configured (always, off loopback: `bind` refuses otherwise), nothing is read
//! from the store before the request carries it, as `Authorization: Bearer <secret>` or as the
//! generic webhook signature `X-Voodu-Signature: sha256=<hex HMAC-SHA256 of the body>`, both
//! compared in constant time; without a secret (loopback only) requests are accepted, as the
//! webhook's are. A browser's request (one with `Origin`, or `Sec-Fetch-Site` other than
//! `none`) is refused, so a page cannot make a visitor's browser abort a rollout, and the
//! dashboard's Basic password is not taken here. Bounded: the body is at most
//! [`MAX_BODY_BYTES`] and read within the body timeout, names at most `model::names::MAX_NAME`
//! bytes; the store is touched on a blocking thread.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt as _;
use serde::Serialize;

use super::AppState;
use super::webhook::{ACTOR_HEADER, GENERIC_SIGNATURE_HEADER, ORIGIN_HEADER, Provider, verify};
use crate::model::names::MAX_NAME;
use crate::model::{Kind, ResourceKey};
use crate::store::{Origin, RolloutRequest, RolloutState, Who};

/// Largest body read (the body carries nothing; a signed caller may send `{}`).
pub(crate) const MAX_BODY_BYTES: usize = 4096;

/// The routes (their own authentication: not behind the reads' `auth::require_token`).
pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/api/rollouts/{scope}/{name}/{request}", post(request))
}

/// The JSON answer.
#[derive(Debug, Serialize)]
struct Answer {
    /// `requested`, `unauthorized`, `forbidden`, `not_found`, `no_rollout`, `bad_request`,
    /// `too_large`, `error`.
    result: &'static str,
    /// `deployment/SCOPE/NAME`.
    #[serde(skip_serializing_if = "Option::is_none")]
    resource: Option<String>,
    /// `promote` or `abort`.
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<&'static str>,
    /// The rollout the request was left on, as it stood (its step, share, phase, verdict).
    #[serde(skip_serializing_if = "Option::is_none")]
    rollout: Option<RolloutState>,
    reason: String,
}

fn answer(code: StatusCode, result: &'static str, reason: impl Into<String>) -> Response {
    (
        code,
        Json(Answer {
            result,
            resource: None,
            request: None,
            rollout: None,
            reason: reason.into(),
        }),
    )
        .into_response()
}

/// What a caller sent that is not the agent's: refusals before anything is read.
fn from_browser(headers: &HeaderMap) -> bool {
    headers.contains_key(header::ORIGIN)
        || headers
            .get("sec-fetch-site")
            .is_some_and(|value| value.as_bytes() != b"none")
}

/// Whether the request carries the agent's webhook secret (bearer token or generic
/// signature); `true` when none is configured (loopback only).
fn authenticated(state: &AppState, headers: &HeaderMap, body: &[u8]) -> bool {
    let Some(secret) = &state.ctx.options.secret else {
        return true;
    };
    if let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| super::auth::bearer(value.as_bytes()))
    {
        return secret.matches_token(token);
    }
    headers.contains_key(GENERIC_SIGNATURE_HEADER)
        && verify(Provider::Generic, headers, body, secret).is_ok()
}

/// Who asks: a `voodu-agent` command (`X-Voodu-Origin: cli`) or another HTTP client, and the
/// user `X-Voodu-Actor` names (untrusted; `Who::new` bounds it and drops control characters).
fn caller(headers: &HeaderMap) -> Who {
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let origin = if text(ORIGIN_HEADER) == Some("cli") {
        Origin::Cli
    } else {
        Origin::Http
    };
    Who::new(origin, text(ACTOR_HEADER))
}

/// Reads the body up to [`MAX_BODY_BYTES`] within the body timeout.
async fn read_body(state: &AppState, body: Body) -> Result<axum::body::Bytes, Response> {
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    match tokio::time::timeout(state.ctx.options.body_timeout, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => Err(answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("body larger than {MAX_BODY_BYTES} bytes"),
        )),
        Ok(Err(error)) => Err(answer(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("cannot read body: {error}"),
        )),
        Err(_) => Err(answer(
            StatusCode::REQUEST_TIMEOUT,
            "bad_request",
            "body not received in time",
        )),
    }
}

/// What the store said of a request.
enum Outcome {
    Requested(Box<RolloutState>),
    NoDeployment,
    NotInFlight,
}

async fn request(
    State(state): State<Arc<AppState>>,
    Path((scope, name, request)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if from_browser(&headers) {
        return answer(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a browser may not ask this (the dashboard is read-only): use `voodu-agent promote|abort` or curl",
        );
    }
    let body = match read_body(&state, body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    if !authenticated(&state, &headers, &body) {
        tracing::warn!(%scope, %name, %request, "rollout request refused: not authenticated");
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(Answer {
                result: "unauthorized",
                resource: None,
                request: None,
                rollout: None,
                reason: "send the webhook secret as `Authorization: Bearer <secret>` (or sign the body as `X-Voodu-Signature: sha256=<hex HMAC-SHA256>`)".to_owned(),
            }),
        )
            .into_response();
    }
    let (kind, verb) = match request.as_str() {
        "promote" => (RolloutRequest::Promote, "promote"),
        "abort" => (RolloutRequest::Abort, "abort"),
        _ => {
            return answer(
                StatusCode::NOT_FOUND,
                "not_found",
                "the requests are …/promote and …/abort",
            );
        }
    };
    if scope.is_empty() || name.is_empty() || scope.len() > MAX_NAME || name.len() > MAX_NAME {
        return answer(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("scope and name are 1 to {MAX_NAME} bytes"),
        );
    }
    let key = ResourceKey::new(Kind::Deployment, &scope, &name);
    let who = caller(&headers);
    let resource = key.to_string();
    let outcome = crate::store::blocking(&state.ctx.store, move |store| {
        let store = store.for_source(store.source()).acting_as(who);
        if let Some(requested) = store.request_rollout(&key.scope, &key.name, kind)? {
            store.queue_pass(&key)?;
            return Ok(Outcome::Requested(Box::new(requested)));
        }
        let known = store.keys_named(&key.scope, &key.name)?.contains(&key)
            || store.rollout_state(&key.scope, &key.name)?.is_some();
        Ok(if known {
            Outcome::NotInFlight
        } else {
            Outcome::NoDeployment
        })
    })
    .await;
    match outcome {
        Ok(Outcome::Requested(rollout)) => {
            tracing::info!(%resource, request = verb, "rollout request left for the reconciler");
            let reason = match kind {
                RolloutRequest::Promote => "promote requested: the rollout goes on past its pause",
                RolloutRequest::Abort => "abort requested: traffic goes back to the stable release",
            };
            (
                StatusCode::ACCEPTED,
                Json(Answer {
                    result: "requested",
                    resource: Some(resource),
                    request: Some(verb),
                    rollout: Some(*rollout),
                    reason: reason.to_owned(),
                }),
            )
                .into_response()
        }
        Ok(Outcome::NoDeployment) => answer(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no deployment {resource} on this agent"),
        ),
        Ok(Outcome::NotInFlight) => answer(
            StatusCode::CONFLICT,
            "no_rollout",
            format!(
                "{resource}: no canary or blue/green rollout is in flight (see `voodu-agent status`)"
            ),
        ),
        Err(error) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            "error",
            error.to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().expect("header value"));
        }
        map
    }

    #[test]
    fn browsers_are_told_apart_from_commands_and_scripts() {
        assert!(!from_browser(&headers(&[])));
        assert!(!from_browser(&headers(&[("sec-fetch-site", "none")])));
        assert!(from_browser(&headers(&[(
            "origin",
            "https://evil.example"
        )])));
        assert!(from_browser(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(from_browser(&headers(&[("sec-fetch-site", "same-origin")])));
    }

    #[test]
    fn the_caller_is_named_by_its_headers() {
        let cli = caller(&headers(&[(ORIGIN_HEADER, "cli"), (ACTOR_HEADER, "ops")]));
        assert_eq!(cli, Who::new(Origin::Cli, Some("ops")));
        let script = caller(&headers(&[(ACTOR_HEADER, "ci-bot")]));
        assert_eq!(script, Who::new(Origin::Http, Some("ci-bot")));
        assert_eq!(caller(&headers(&[])), Who::new(Origin::Http, None));
    }
}
