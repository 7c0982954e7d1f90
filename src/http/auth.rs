//! Who may read `/status`, `/releases`, `/activity` and `/metrics`.
//!
//! On a loopback listener everyone on the host may (as they may read `state.db`). Off
//! loopback the status document names images, commits and errors an outsider should not
//! see, so these routes need `Authorization: Bearer <webhook secret>`: binding off loopback
//! already requires that secret, and Prometheus sends it with `authorization.credentials_file`.
//! `/healthz` says only "ok" and stays open, for load balancers and container health checks.
//!
//! Invariant: the token is compared in constant time (`WebhookSecret::matches_token`); with
//! no secret configured off loopback (which `bind` refuses), every read is refused.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// Lets the request through when the listener is loopback or it carries the right token;
/// answers 401 with `WWW-Authenticate: Bearer` otherwise.
pub(super) async fn require_token(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if !state.reads_need_token || authorized(&state, &request) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "this listener is not loopback: send the webhook secret as `Authorization: Bearer <secret>`\n",
    )
        .into_response()
}

fn authorized(state: &AppState, request: &Request) -> bool {
    let Some(secret) = &state.ctx.options.secret else {
        return false;
    };
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| bearer(value.as_bytes()))
        .is_some_and(|token| secret.matches_token(token))
}

/// The token of an `Authorization: Bearer <token>` value (the scheme is case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| token.trim_ascii())
        .filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_taken_from_the_header_value() {
        let cases: &[(&[u8], Option<&[u8]>)] = &[
            (b"Bearer s3cret", Some(b"s3cret")),
            (b"bearer  s3cret ", Some(b"s3cret")),
            (b"Basic czNjcmV0", None),
            (b"Bearer ", None),
            (b"Bearer", None),
            (b"", None),
        ];
        for (value, expected) in cases {
            assert_eq!(
                bearer(value),
                *expected,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }
}
