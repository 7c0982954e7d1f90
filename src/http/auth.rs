//! Who may read `/status`, `/releases`, `/activity`, `/metrics` and the dashboard (`/ui`).
//!
//! On a loopback listener everyone on the host may (as they may read `state.db`). Off
//! loopback the status document names images, commits and errors an outsider should not
//! see, so these routes need `Authorization: Bearer <webhook secret>`: binding off loopback
//! already requires that secret, and Prometheus sends it with `authorization.credentials_file`.
//! A browser cannot send a bearer token, so the secret is also taken as the password of
//! Basic auth (any user name), and the dashboard's 401 asks the browser for it.
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
    if request.uri().path().starts_with("/ui") {
        return (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                "Basic realm=\"voodu-agent\", charset=\"UTF-8\"",
            )],
            "this listener is not loopback: log in with the webhook secret as the password\n",
        )
            .into_response();
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
    let Some(value) = request.headers().get(header::AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    if let Some(token) = bearer(value) {
        return secret.matches_token(token);
    }
    basic_password(value).is_some_and(|password| secret.matches_token(&password))
}

/// The password of an `Authorization: Basic base64(user:password)` value.
fn basic_password(value: &[u8]) -> Option<Vec<u8>> {
    let (scheme, encoded) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let decoded = base64_decode(encoded.trim_ascii())?;
    let colon = decoded.iter().position(|&byte| byte == b':')?;
    Some(decoded[colon + 1..].to_vec()).filter(|password| !password.is_empty())
}

/// Standard base64 with padding (RFC 4648 §4), as Basic auth sends it; `None` when malformed.
fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine as _;
    if text.len() > 4096 {
        return None;
    }
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// The token of an `Authorization: Bearer <token>` value (the scheme is case-insensitive).
pub(super) fn bearer(value: &[u8]) -> Option<&[u8]> {
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
    fn basic_passwords_are_taken_from_the_header_value() {
        // base64("admin:s3cret"), base64("x:a:b"), base64(":")
        assert_eq!(
            basic_password(b"Basic YWRtaW46czNjcmV0").as_deref(),
            Some(&b"s3cret"[..])
        );
        assert_eq!(
            basic_password(b"basic eDphOmI=").as_deref(),
            Some(&b"a:b"[..])
        );
        assert_eq!(basic_password(b"Basic Og=="), None);
        assert_eq!(basic_password(b"Basic !!!!"), None);
        assert_eq!(basic_password(b"Basic YWRtaW4"), None);
        assert_eq!(basic_password(b"Bearer YWRtaW46czNjcmV0"), None);
        assert_eq!(base64_decode(b"YQ==").as_deref(), Some(&b"a"[..]));
        assert_eq!(base64_decode(b"YWI=").as_deref(), Some(&b"ab"[..]));
        assert_eq!(base64_decode(b"YQ==YQ=="), None);
    }

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
