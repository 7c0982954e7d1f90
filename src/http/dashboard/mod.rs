//! The dashboard: a read-only web view of the agent on its HTTP side, under `/ui`.
//!
//! Pages (server-rendered HTML; a page works without JavaScript and then refreshes itself):
//! - `GET /ui`: the applied commit, fetch and engine health, the last rejected commit with
//!   every `path:line:col`, every resource (phase, ready/desired, release, pin, message),
//!   and the activity of the last day (`activity.rs`);
//! - `GET /ui/resource/{kind}/{scope}/{name}`: its state, its timeline (`activity.rs`), the
//!   ready replicas of the current
//!   rollout (plot), its containers with readiness and why, a deployment's progressive
//!   rollout with its history (`rollout.rs`), its releases (timeline, table)
//!   and a form comparing two of them, and a live tail of its containers' logs (`logs.rs`,
//!   the stream is `http::logs`);
//! - `GET /ui/resource/{kind}/{scope}/{name}/diff?from=ID&to=ID`: the line diff of two
//!   release snapshots;
//! - `GET /ui/events[?resource=KIND/SCOPE/NAME]`: server-sent events with the page's live
//!   document (`live.rs`), which `app.js` applies to the page without a reload;
//! - `GET /ui/static/app.css`, `/ui/static/app.js`, `/ui/static/logs.js`: built into the
//!   binary.
//!
//! Invariants: read-only: it reads the store (on blocking threads) and the rollout samples,
//! never writes or asks for anything; the same auth as `/status` (`super::auth`, plus the
//! secret as a Basic password so a browser can log in); every store text is escaped
//! (`html.rs`); every answer carries a strict Content-Security-Policy (no inline script or
//! style, nothing from another origin) and `nosniff`, and is never cached: put on by
//! `super::secure_headers`, on every answer of the port, not here.

mod activity;
mod diff;
mod html;
pub(crate) mod live;
mod logs;
mod plot;
mod rollout;
mod views;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use serde::Deserialize;

use super::AppState;
use super::status::{build, build_releases, build_resource};
use crate::model::{Kind, ResourceKey};
use html::Layout;
use views::Samples;

const CSS: &str = include_str!("app.css");
const JS: &str = include_str!("app.js");

/// The Content-Security-Policy of every answer (`http::secure_headers`).
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The dashboard's routes (the caller adds the auth layer).
pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/ui", get(overview))
        .route("/ui/", get(overview))
        .route("/ui/resource/{kind}/{scope}/{name}", get(resource))
        .route("/ui/resource/{kind}/{scope}/{name}/diff", get(compare))
        .route("/ui/events", get(events))
        .route(
            "/ui/static/app.css",
            get(|| async { asset(CSS, "text/css; charset=utf-8") }),
        )
        .route(
            "/ui/static/app.js",
            get(|| async { asset(JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/ui/static/logs.js",
            get(|| async { asset(logs::JS, "text/javascript; charset=utf-8") }),
        )
}

/// `GET /`: the dashboard.
pub(super) async fn root() -> Redirect {
    Redirect::to("/ui")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    IntoResponse::into_response((
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    ))
}

fn html_page(status: StatusCode, layout: &Layout<'_>, body: &str) -> Response {
    IntoResponse::into_response((
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html::page(layout, body),
    ))
}

fn error_page(status: StatusCode, message: &str) -> Response {
    html_page(
        status,
        &Layout {
            title: "error",
            events: None,
            back: true,
        },
        &format!(
            "<section class=\"rejected\"><h2>{}</h2><p>{}</p></section>",
            status.as_u16(),
            html::Esc(message)
        ),
    )
}

/// The page `page` holds; `Ok(None)`: a 404 page saying `missing`; the store's error: a 500 page.
fn found_page(
    page: crate::store::Result<Option<String>>,
    layout: &Layout<'_>,
    missing: &str,
) -> Response {
    match page {
        Ok(Some(body)) => html_page(StatusCode::OK, layout, &body),
        Ok(None) => error_page(StatusCode::NOT_FOUND, missing),
        Err(error) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string()),
    }
}

/// Query of `GET /ui`.
#[derive(Debug, Default, serde::Deserialize)]
struct OverviewQuery {
    /// With `--sources`: show only this source's resources.
    source: Option<String>,
}

async fn overview(
    State(state): State<Arc<AppState>>,
    Query(query): Query<OverviewQuery>,
) -> Response {
    let page = crate::store::blocking(&state.ctx.store, move |store| {
        let view = build(store)?;
        let activity = activity::section(store, crate::store::now_unix());
        Ok(views::overview_html(
            &view,
            &activity,
            query.source.as_deref(),
        ))
    })
    .await;
    match page {
        Ok(body) => html_page(
            StatusCode::OK,
            &Layout {
                title: "resources",
                events: Some("/ui/events".to_owned()),
                back: false,
            },
            &body,
        ),
        Err(error) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string()),
    }
}

/// The key of a resource page's path; `None` for an unknown kind.
fn key_of(kind: &str, scope: &str, name: &str) -> Option<ResourceKey> {
    Some(ResourceKey::new(Kind::parse(kind)?, scope, name))
}

fn samples_of(state: &AppState, key: &ResourceKey) -> Samples {
    match state.samples.of(key) {
        Some((release_id, points)) => Samples {
            release_id: Some(release_id),
            points,
        },
        None => Samples::default(),
    }
}

async fn resource(
    State(state): State<Arc<AppState>>,
    Path((kind, scope, name)): Path<(String, String, String)>,
) -> Response {
    let Some(key) = key_of(&kind, &scope, &name) else {
        return error_page(StatusCode::NOT_FOUND, &format!("no kind {kind:?}"));
    };
    let samples = samples_of(&state, &key);
    let title = format!("{kind} {scope}/{name}");
    let events = format!(
        "/ui/events?resource={}%2F{}%2F{}",
        html::UrlPart(&kind),
        html::UrlPart(&scope),
        html::UrlPart(&name)
    );
    let tail = logs::section(&kind, &scope, &name);
    let page = crate::store::blocking(&state.ctx.store, move |store| {
        let Some(resource) = build_resource(store, &key)? else {
            return Ok(None);
        };
        let releases = build_releases(store, &key)?;
        let rollout = match key.kind {
            Kind::Deployment => rollout::live(store, &key.scope, &key.name)?,
            _ => None,
        };
        let mut body = views::resource_html(
            &resource,
            &releases,
            &samples,
            live::now_ms(),
            &rollout::section(rollout.as_ref()),
        );
        body.push_str(&tail);
        body.push_str(&activity::timeline(store, &key.to_string()));
        Ok(Some(body))
    })
    .await;
    found_page(
        page,
        &Layout {
            title: &title,
            events: Some(events),
            back: true,
        },
        &format!("no resource {kind}/{scope}/{name} has a status on this agent"),
    )
}

#[derive(Debug, Deserialize)]
struct CompareQuery {
    from: i64,
    to: i64,
}

async fn compare(
    State(state): State<Arc<AppState>>,
    Path((kind, scope, name)): Path<(String, String, String)>,
    Query(query): Query<CompareQuery>,
) -> Response {
    let Some(key) = key_of(&kind, &scope, &name) else {
        return error_page(StatusCode::NOT_FOUND, &format!("no kind {kind:?}"));
    };
    let title = format!("{kind} {scope}/{name}: #{} → #{}", query.from, query.to);
    let page = crate::store::blocking(&state.ctx.store, move |store| {
        let Some(resource) = build_resource(store, &key)? else {
            return Ok(None);
        };
        let releases = build_releases(store, &key)?;
        Ok(views::diff_html(&resource, &releases, query.from, query.to))
    })
    .await;
    found_page(
        page,
        &Layout {
            title: &title,
            events: None,
            back: true,
        },
        "no such resource, or the releases are not among its last ones",
    )
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    resource: Option<String>,
}

async fn events(State(state): State<Arc<AppState>>, Query(query): Query<EventsQuery>) -> Response {
    let Ok(permit) = state.streams.clone().try_acquire_owned() else {
        return IntoResponse::into_response((
            StatusCode::SERVICE_UNAVAILABLE,
            "too many live pages open; try again\n",
        ));
    };
    let store = state.ctx.store.clone();
    let shutdown = state.shutdown.clone();
    // Under the connection's idle timeout, which also runs while a body streams.
    let lifetime = state.ctx.options.idle_timeout.mul_f64(0.8);
    match query.resource {
        None => IntoResponse::into_response(live::stream(
            store,
            move |store| {
                let view = build(store).ok()?;
                serde_json::to_string(&views::overview_live(&view)).ok()
            },
            permit,
            shutdown,
            lifetime,
        )),
        Some(reference) => {
            let parts: Vec<&str> = reference.split('/').collect();
            let Some(key) = (match parts.as_slice() {
                [kind, scope, name] => key_of(kind, scope, name),
                _ => None,
            }) else {
                return IntoResponse::into_response((
                    StatusCode::BAD_REQUEST,
                    "resource is KIND/SCOPE/NAME\n",
                ));
            };
            let state_for_view = state.clone();
            IntoResponse::into_response(live::stream(
                store,
                move |store| {
                    let resource = build_resource(store, &key).ok()??;
                    let releases = build_releases(store, &key).ok()?;
                    let samples = samples_of(&state_for_view, &key);
                    let mut live =
                        views::resource_live(&resource, &releases, &samples, live::now_ms());
                    if key.kind == Kind::Deployment {
                        live.rollout = rollout::live(store, &key.scope, &key.name).ok()?;
                    }
                    serde_json::to_string(&live).ok()
                },
                permit,
                shutdown,
                lifetime,
            ))
        }
    }
}
