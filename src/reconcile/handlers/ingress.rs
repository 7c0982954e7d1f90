//! Ingress handler: checks what only the host can tell (does the target deployment exist, has
//! it ready replicas, does the proxy serve this ingress's routes yet), records it on the
//! ingress's status (`detail`: host, service, port, url, routes, upstreams, …) and wakes the
//! router, which owns the proxy and its config (`reconcile::router`).
//!
//! Invariants: the status is computed from the same route table the router pushes
//! (`router::current_table`), so what it shows is what the proxy serves once the router's
//! fingerprint for this ingress matches; the router asks for a reconcile of every ingress whose
//! served routes change, so the status follows readiness without a journal event. A spec
//! change opens a release keyed to its commit, which succeeds once the proxy serves it. An
//! ingress that leaves the repo loses its status, and the router drops its routes. A pass
//! returns `Action::Done` even while it waits for the proxy: the router wakes it.

use std::sync::Arc;

use super::Handler;
use crate::manifest::spec::IngressSpec;
use crate::model::ResourceKey;
use crate::reconcile::router::routes::IngressView;
use crate::reconcile::router::{self, RouterReport};
use crate::reconcile::{context::Ctx, context::blocking, error::Result, run::action::Action};
use crate::runtime::Runtime;
use crate::store::{
    Desired, Detail, FailureReason, HealthCheckDetail, IngressDetail, Phase, ProxyDetail, Release,
    ReleasePhase, ResourceStatus, RouteDetail, TlsDetail, now_unix,
};

impl Handler for IngressSpec {
    async fn reconcile<R: Runtime>(ctx: &Arc<Ctx<R>>, key: &ResourceKey) -> Result<Action> {
        let desired = super::desired_of(ctx, key).await?;
        let Some(desired) = desired else {
            let key = key.clone();
            blocking(&ctx.store, move |store| store.delete_status(&key)).await?;
            ctx.router.wake();
            return Ok(Action::Done);
        };
        // Says so with the reason (`plan::swarm_gaps`), before anything else.
        super::engine::refuse_gaps(ctx, key, &desired.spec)?;
        if ctx.options.ingress.is_none() {
            let mut status = ResourceStatus::new(
                Phase::Disabled,
                "the ingress proxy is off on this agent (--no-ingress): nothing routes this host",
            );
            status.spec_hash = desired.spec_hash.to_string();
            let key = key.clone();
            blocking(&ctx.store, move |store| store.put_status(&key, &status)).await?;
            return Ok(Action::Done);
        }
        let table = router::current_table(ctx).await?;
        let Some(view) = table.view(key) else {
            return Err(super::wrong_kind(key, &desired.spec));
        };
        let report = ctx.router.report();
        let live = report.live.get(key) == Some(&router::fingerprint(view));
        let release = current_release(ctx, &desired).await?;
        let swarm = super::engine::routes_to_services(ctx);
        let (phase, message) = assess(view, &report, live, swarm);
        if !live {
            ctx.router.wake();
        }
        let status = ResourceStatus {
            phase,
            reason: (phase == Phase::Failed).then_some(FailureReason::Proxy),
            message,
            desired_replicas: view.n_replicas,
            running_replicas: view.upstreams.len(),
            spec_hash: desired.spec_hash.to_string(),
            release_id: Some(release.id),
            updated_at: now_unix(),
            detail: Detail::Ingress(detail(view, &report, live)),
        };
        let key = key.clone();
        let finish = live && release.phase == ReleasePhase::Progressing;
        blocking(&ctx.store, move |store| {
            if finish {
                store.finish_release(release.id, ReleasePhase::Succeeded, "")?;
            }
            store.put_status(&key, &status)
        })
        .await?;
        // Waiting for the proxy or for replicas is no error: the router wakes this key.
        Ok(Action::Done)
    }
}

/// Phase and message. Waiting states are not errors: the router reconciles this ingress
/// again when its routes change (the deployment appears, replicas become ready, the proxy
/// loads the config), so nothing here burns the retry budget.
fn assess(view: &IngressView, report: &RouterReport, live: bool, swarm: bool) -> (Phase, String) {
    let deployment = format!("{}/{}", view.key.scope, view.service);
    let warnings = if view.warnings.is_empty() {
        String::new()
    } else {
        format!(" ({})", view.warnings.join("; "))
    };
    if let Some(error) = &report.error {
        return (Phase::Failed, format!("ingress proxy: {error}"));
    }
    if !live {
        return (
            Phase::Progressing,
            format!(
                "waiting for the ingress proxy to load the routes of {}",
                view.url
            ),
        );
    }
    if view.maintenance.is_some() {
        return (
            Phase::Ready,
            format!(
                "in maintenance: {} answers 503 with the maintenance page (`voodu-agent maintenance off {deployment}`){warnings}",
                view.url
            ),
        );
    }
    if !view.deployment_found {
        return (
            Phase::Progressing,
            format!(
                "waiting for deployment {deployment}: {} answers 503 until it exists{warnings}",
                view.url
            ),
        );
    }
    if view.upstreams.is_empty() {
        return (
            Phase::Degraded,
            format!(
                "no ready replica of deployment {deployment}: {} answers 503{warnings}",
                view.url
            ),
        );
    }
    if view.routes.iter().all(|route| route.shadowed_by.is_some()) {
        return (
            Phase::Degraded,
            format!("every route is served by another ingress{warnings}"),
        );
    }
    if swarm {
        // The proxy resolves the service's running tasks itself (`tasks.<service>`).
        return (
            Phase::Ready,
            format!(
                "{} → the running tasks of deployment {deployment} ({}, resolved by the proxy){warnings}",
                view.url,
                view.upstreams.join(", ")
            ),
        );
    }
    (
        Phase::Ready,
        format!(
            "{} → {} ready replica(s) of {deployment}{warnings}",
            view.url,
            view.upstreams.len()
        ),
    )
}

/// The status `detail`: what this ingress routes, to where, and where the proxy listens.
fn detail(view: &IngressView, report: &RouterReport, live: bool) -> IngressDetail {
    IngressDetail {
        host: view.host.clone(),
        service: view.service.clone(),
        port: view.port,
        url: view.url.clone(),
        routes: view
            .routes
            .iter()
            .map(|route| RouteDetail {
                path: route.path.as_deref().unwrap_or("/").to_owned(),
                strip: route.strip,
                served_by: route.shadowed_by.as_ref().map(ToString::to_string),
            })
            .collect(),
        upstreams: view.upstreams.clone(),
        policy: view.policy.clone(),
        live,
        health_check: view.health_check.as_ref().map(|check| HealthCheckDetail {
            path: check.path.clone(),
            port: check.port,
            interval: check.interval.clone(),
        }),
        tls: view.tls.as_ref().map(|tls| TlsDetail {
            provider: tls.provider.clone(),
            email: tls.email.clone(),
            on_demand: tls.on_demand,
            ask: tls.ask.clone(),
        }),
        warnings: view.warnings.clone(),
        proxy: report.proxy.as_ref().map(|proxy| ProxyDetail {
            container: proxy.container.clone(),
            http: proxy.http.clone(),
            https: proxy.https.clone(),
        }),
    }
}

/// The release this reconcile works under: the latest one when it has the desired spec hash
/// and incarnation, else a new progressing release keyed to the desired commit.
async fn current_release<R: Runtime>(ctx: &Ctx<R>, desired: &Desired) -> Result<Release> {
    let desired = desired.clone();
    blocking(&ctx.store, move |store| {
        match store.latest_release(&desired.key)? {
            Some(latest)
                if latest.spec_hash == desired.spec_hash
                    && latest.incarnation == desired.incarnation =>
            {
                Ok(latest)
            }
            _ => store.begin_release(&desired),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;
    use crate::reconcile::router::ProxyInfo;
    use crate::reconcile::router::routes::RouteView;

    fn view() -> IngressView {
        IngressView {
            key: ResourceKey::new(Kind::Ingress, "shop", "web"),
            host: "shop.test".to_owned(),
            service: "web".to_owned(),
            port: 8080,
            url: "http://shop.test".to_owned(),
            deployment_found: true,
            n_replicas: 2,
            routes: vec![RouteView {
                path: None,
                strip: false,
                shadowed_by: None,
            }],
            upstreams: vec!["10.0.0.2:8080".to_owned(), "10.0.0.3:8080".to_owned()],
            tasks: None,
            policy: "round_robin".to_owned(),
            health_check: None,
            tls: None,
            warnings: Vec::new(),
            maintenance: None,
            match_header: None,
        }
    }

    #[test]
    fn phases_say_what_the_ingress_waits_for() {
        let ok = RouterReport::default();
        let check = |view: &IngressView, report: &RouterReport, live: bool| {
            let (phase, message) = assess(view, report, live, false);
            format!("{phase}: {message}")
        };
        assert_eq!(
            check(&view(), &ok, true),
            "Ready: http://shop.test → 2 ready replica(s) of shop/web"
        );
        let mut vip = view();
        vip.upstreams = vec!["tasks.shop-web:8080".to_owned()];
        assert_eq!(
            {
                let (phase, message) = assess(&vip, &ok, true, true);
                format!("{phase}: {message}")
            },
            "Ready: http://shop.test → the running tasks of deployment shop/web (tasks.shop-web:8080, resolved by the proxy)"
        );
        assert_eq!(
            check(&view(), &ok, false),
            "Progressing: waiting for the ingress proxy to load the routes of http://shop.test"
        );
        let mut down = view();
        down.upstreams.clear();
        assert_eq!(
            check(&down, &ok, true),
            "Degraded: no ready replica of deployment shop/web: http://shop.test answers 503"
        );
        down.deployment_found = false;
        assert_eq!(
            check(&down, &ok, true),
            "Progressing: waiting for deployment shop/web: http://shop.test answers 503 until it exists"
        );
        let failing = RouterReport {
            error: Some("proxy container voodu-caddy-x: image caddy:2 is missing".to_owned()),
            ..RouterReport::default()
        };
        assert_eq!(
            check(&view(), &failing, true),
            "Failed: ingress proxy: proxy container voodu-caddy-x: image caddy:2 is missing"
        );
    }

    #[test]
    fn detail_shows_routes_upstreams_and_the_proxy() {
        let report = RouterReport {
            proxy: Some(ProxyInfo {
                container: "voodu-caddy-x".to_owned(),
                http: Some("0.0.0.0:80".to_owned()),
                https: Some("0.0.0.0:443".to_owned()),
            }),
            ..RouterReport::default()
        };
        expect_test::expect![[r#"
            {
              "host": "shop.test",
              "live": true,
              "policy": "round_robin",
              "port": 8080,
              "proxy": {
                "container": "voodu-caddy-x",
                "http": "0.0.0.0:80",
                "https": "0.0.0.0:443"
              },
              "routes": [
                {
                  "path": "/"
                }
              ],
              "service": "web",
              "upstreams": [
                "10.0.0.2:8080",
                "10.0.0.3:8080"
              ],
              "url": "http://shop.test"
            }"#]]
        .assert_eq(&serde_json::to_string_pretty(&detail(&view(), &report, true)).expect("json"));
    }
}
