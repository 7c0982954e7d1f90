//! `POST /hooks/registry`: the distribution registry's notifications (its `notifications:
//! endpoints:` configuration, envelope `application/vnd.docker.distribution.events.v1+json`):
//! a push of a tagged manifest starts the scans of that repository and the look at the tags
//! running releases resolved from it at once, instead of at their interval.
//!
//! Authenticated like the git webhook: with a webhook secret (`--webhook-secret-file`), the
//! request carries it as `Authorization: Bearer <secret>` (the header the registry's endpoint
//! configuration sends); without one, only on loopback. A notification only makes a scan
//! come sooner: what the scan and the tag look find is the registry's answer, never the
//! notification's.
//!
//! Invariants: the body is bounded and read within a deadline (`webhook::read_body`); at most
//! `MAX_EVENTS` events are read; only `push` events of a manifest with a tag count; nothing
//! but a repository name (checked) leaves this handler.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::AppState;
use super::webhook::{HookAnswer, HookResult, answer, read_body};

/// Most events of one envelope looked at.
const MAX_EVENTS: usize = 256;

/// A manifest's media types (a blob push carries none of these).
const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
];

#[derive(serde::Deserialize)]
struct Envelope {
    #[serde(default)]
    events: Vec<EventBody>,
}

#[derive(serde::Deserialize)]
struct EventBody {
    #[serde(default)]
    action: String,
    #[serde(default)]
    target: Target,
    #[serde(default)]
    request: Request,
}

#[derive(Default, serde::Deserialize)]
struct Target {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    #[serde(default)]
    repository: String,
    #[serde(default)]
    tag: String,
}

#[derive(Default, serde::Deserialize)]
struct Request {
    /// The registry host the pusher spoke to (`registry.example:5000`).
    #[serde(default)]
    host: String,
}

pub(super) async fn hook(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(secret) = &state.ctx.options.secret {
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !secret.matches_token(token.trim().as_bytes()) {
            return answer(
                &state,
                StatusCode::UNAUTHORIZED,
                HookAnswer::new(HookResult::Unauthorized)
                    .reason("send the webhook secret as `Authorization: Bearer <secret>` (the registry endpoint's `headers`)"),
            );
        }
    }
    let body = match read_body(&state, &headers, body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let envelope: Envelope = match serde_json::from_slice(&body) {
        Ok(envelope) => envelope,
        Err(error) => {
            return answer(
                &state,
                StatusCode::BAD_REQUEST,
                HookAnswer::new(HookResult::BadRequest)
                    .reason(format!("not a registry notification envelope: {error}")),
            );
        }
    };
    let repositories = pushed(&envelope);
    let Some(notify) = &state.ctx.on_registry_push else {
        return answer(
            &state,
            StatusCode::ACCEPTED,
            HookAnswer::new(HookResult::Ignored).reason("image automation is not running"),
        );
    };
    if repositories.is_empty() {
        return answer(
            &state,
            StatusCode::ACCEPTED,
            HookAnswer::new(HookResult::Ignored).reason("no push of a tagged manifest"),
        );
    }
    for repository in &repositories {
        tracing::info!(
            repository,
            "registry notification: repository pushed; scanning now"
        );
        notify(repository);
    }
    answer(
        &state,
        StatusCode::ACCEPTED,
        HookAnswer::new(HookResult::Accepted)
            .reason(format!("{} repositor(ies) to scan now", repositories.len())),
    )
}

/// The repositories `envelope` says were pushed a tagged manifest, each as an image names it
/// (`host/name`, and `name` alone for the registry images name without a host).
fn pushed(envelope: &Envelope) -> Vec<String> {
    let mut out = Vec::new();
    for event in envelope.events.iter().take(MAX_EVENTS) {
        let target = &event.target;
        if event.action != "push"
            || target.tag.is_empty()
            || !MANIFEST_TYPES.contains(&target.media_type.as_str())
            || !valid_name(&target.repository)
        {
            continue;
        }
        let host = event.request.host.trim();
        if !host.is_empty() && valid_host(host) {
            out.push(format!("{host}/{}", target.repository));
        }
        out.push(target.repository.clone());
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// A repository name as the distribution spec writes them (lower case path components).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.split('/').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
        })
}

fn valid_host(host: &str) -> bool {
    host.len() <= 255
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pushes_of_tagged_manifests_name_a_repository() -> Result<(), serde_json::Error> {
        // As Debian's docker-registry 2.8 posts them (one captured live, shortened).
        let envelope: Envelope = serde_json::from_str(
            r#"{"events":[
              {"action":"push","target":{"mediaType":"application/vnd.docker.distribution.manifest.v2+json","digest":"sha256:08de","repository":"test/busybox","tag":"stable"},"request":{"host":"127.0.0.1:52881","method":"PUT"}},
              {"action":"push","target":{"mediaType":"application/octet-stream","digest":"sha256:aa","repository":"test/busybox"},"request":{"host":"127.0.0.1:52881"}},
              {"action":"pull","target":{"mediaType":"application/vnd.oci.image.manifest.v1+json","repository":"test/busybox","tag":"stable"},"request":{"host":"127.0.0.1:52881"}},
              {"action":"push","target":{"mediaType":"application/vnd.oci.image.manifest.v1+json","repository":"Bad/../name","tag":"x"},"request":{"host":"127.0.0.1:52881"}}
            ]}"#,
        )?;
        assert_eq!(
            pushed(&envelope),
            ["127.0.0.1:52881/test/busybox", "test/busybox"]
        );
        Ok(())
    }
}
