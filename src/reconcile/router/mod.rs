//! Ingress router: keeps one Caddy 2 proxy per agent (`voodu-caddy-<agent id>`) and its
//! whole config in step with the desired ingresses and the readiness of their deployments'
//! replicas. It rebuilds the route table (`routes`) whenever `RouterWake` is woken (a
//! deployment's readiness changed, an ingress was reconciled) or maintenance changes
//! (`maintenance`: a 503 page instead of the replicas), and every `resync` as a safety
//! net, and hands it to the proxy of the agent's engine: a container whose config is pushed
//! through Caddy's admin API (`container.rs`), or under Docker Swarm a global service whose
//! config is a Swarm config (`service.rs`).
//!
//! Invariants:
//! - the proxy exists exactly while at least one ingress is desired (and the ingress is on);
//!   it is labelled `voodu.agent`, `voodu.role=ingress`, `createdby=voodu`; one that differs
//!   from what the options ask is replaced; removing it never removes Caddy's data
//!   (certificates survive);
//! - the data plane does not depend on the agent: Caddy keeps serving the last config while
//!   the agent is stopped, restarted or killed;
//! - a config the proxy refuses leaves the previous routes serving (Caddy applies a `/load`
//!   atomically; Swarm rolls a proxy service back whose new tasks fail);
//! - the router publishes a `RouterReport` after every pass and asks for a reconcile of each
//!   ingress whose served routes changed, so statuses follow. The engine-specific invariants
//!   are in `container.rs` and `service.rs`.

mod container;
pub(crate) mod maintenance;
pub(crate) mod proxy;
pub(crate) mod routes;
mod service;
pub(crate) mod split;

pub use service::SwarmListenError;

use std::collections::{BTreeMap, BTreeSet, hash_map::DefaultHasher};
use std::hash::{Hash as _, Hasher as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::manifest::spec::{DeploymentSpec, IngressSpec, Spec};
use crate::model::{Kind, ResourceKey};
use crate::reconcile::run::timer::What;
use crate::reconcile::{context::Ctx, context::Engine, context::blocking, error::Result};
use crate::runtime::Runtime;
pub(crate) use proxy::DEFAULT_IMAGE;
pub use proxy::{IngressOptions, ProxyInfo, ROLE, RouterReport, container_name};
use routes::{Backend, IngressView, RouteTable};

/// Whether the proxy service can publish these listen addresses under Swarm (`0.0.0.0` and
/// a fixed port: host-mode ports are published on every interface of the node); else what
/// to give instead.
pub(crate) fn check_swarm_listen(
    http: &SocketAddr,
    https: &SocketAddr,
) -> std::result::Result<(), SwarmListenError> {
    service::host_port("--ingress-http", http)?;
    service::host_port("--ingress-https", https)?;
    Ok(())
}

/// A fingerprint of what one ingress asks of the proxy: the handler compares it with the
/// report's to tell whether its routes are live.
pub(crate) fn fingerprint(view: &IngressView) -> u64 {
    let mut hasher = DefaultHasher::new();
    view.hash(&mut hasher);
    hasher.finish()
}

/// Reads desired ingresses, their deployments and those deployments' ready replicas (under
/// Swarm, their services), and resolves them into the route table (the router and the
/// ingress handler both use it).
pub(crate) async fn current_table<R: Runtime>(ctx: &Ctx<R>) -> Result<RouteTable> {
    let swarm = ctx.options.engine == Engine::Swarm;
    let ownership = ctx.options.ownership.clone();
    // Replicas being drained are left out before they stop (`drain_and_remove`).
    let draining = ctx.memory.draining.ids();
    let canary_token = ctx.memory.canary_token.value().to_owned();
    blocking(&ctx.store, move |store| {
        let desired = store.desired_all()?;
        let hosts = crate::model::map_of(
            store
                .claims(crate::manifest::spec::ClaimKind::Host)?
                .into_iter()
                .map(|(host, holder)| (host, holder.source)),
        );
        let mut ingresses: Vec<(ResourceKey, IngressSpec)> = Vec::new();
        let mut deployments: BTreeMap<ResourceKey, &DeploymentSpec> = BTreeMap::new();
        for resource in &desired {
            match &resource.spec {
                Spec::Ingress(ingress) => ingresses.push((resource.key.clone(), ingress.clone())),
                Spec::Deployment(deployment) => {
                    deployments.insert(resource.key.clone(), deployment);
                }
                _ => {}
            }
        }
        let targets: BTreeSet<ResourceKey> = ingresses
            .iter()
            .map(|(key, ingress)| {
                ResourceKey::new(
                    Kind::Deployment,
                    key.scope.clone(),
                    ingress.effective_service(&key.name),
                )
            })
            .collect();
        let mut backends = BTreeMap::new();
        for target in targets {
            let Some(spec) = deployments.get(&target) else {
                continue;
            };
            // Under Swarm, `tasks.<service>` resolves on the overlay network to the tasks
            // that run (and pass their health check): the proxy balances over them itself
            // (a service's virtual IP needs IPVS, which not every host has).
            let backend = if swarm {
                Backend {
                    spec,
                    ready: Vec::new(),
                    tasks: Some(format!("tasks.{}", target.app_id())),
                    preview: None,
                    canary: None,
                }
            } else {
                let ready: Vec<(String, String)> = store
                    .readiness(&target)?
                    .into_iter()
                    .filter(|row| {
                        row.ready
                            && !row.address.is_empty()
                            && !draining.contains(&row.container_id)
                    })
                    .map(|row| (row.container, row.address))
                    .collect();
                // A progressive rollout keeps its releases apart (`split`).
                let rollout = match spec.strategy.as_deref() {
                    Some(strategy) => {
                        store
                            .rollout_state(&target.scope, &target.name)?
                            .map(|state| {
                                let preview = match strategy {
                                    crate::manifest::spec::Strategy::BlueGreen(blue_green) => {
                                        Some(blue_green.preview_host.clone())
                                    }
                                    crate::manifest::spec::Strategy::Canary(_) => None,
                                };
                                (preview, state)
                            })
                    }
                    None => None,
                };
                let parts = split::split(
                    &ready,
                    rollout.as_ref().map(|(_, state)| state),
                    crate::store::now_unix(),
                );
                Backend {
                    spec,
                    ready: parts.main,
                    tasks: None,
                    preview: rollout.and_then(|(host, _)| host).zip(parts.preview),
                    canary: parts
                        .canary
                        .map(|addresses| (canary_token.clone(), addresses)),
                }
            };
            backends.insert(target, backend);
        }
        let sealing = routes::Sealing {
            ownership: &ownership,
            hosts: &hosts,
        };
        let mut table = routes::route_table(&ingresses, &backends, Some(&sealing));
        maintenance::apply(&mut table, &store.maintenance_all()?);
        Ok(table)
    })
    .await
}

/// Why a router pass failed; reported on every ingress's status.
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    Reconcile(#[from] crate::reconcile::error::Error),
    #[error("proxy {name}: {source}")]
    Runtime {
        name: String,
        #[source]
        source: crate::runtime::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("proxy {name}: {message}")]
    Proxy { name: String, message: String },
    #[error("caddy admin API: {0}")]
    Admin(String),
    /// The admin API's client has no TLS configuration (`model::tls`).
    #[error("caddy admin API: {0}")]
    AdminTls(crate::model::tls::TlsError),
}

/// What a proxy made of one route table: where it listens, whether it pushed a config, and
/// whether it serves the table's routes now.
struct Served {
    proxy: ProxyInfo,
    pushed: bool,
    /// The proxy serves this table (else it is still being rolled out: look again soon).
    live: bool,
}

/// The proxy of this agent's engine: a container (`container.rs`) or, under Docker Swarm, a
/// global service (`service.rs`).
enum Proxy {
    Container(container::ContainerProxy),
    Service(service::ServiceProxy),
}

struct Router<R: Runtime> {
    ctx: Arc<Ctx<R>>,
    proxy: Proxy,
    report: RouterReport,
}

/// How soon a pass looks again while the proxy service is rolled out by Swarm.
const CONVERGING: Duration = Duration::from_secs(1);

/// Runs the router until `shutdown` fires. The proxy keeps running after that.
pub(crate) async fn run<R: Runtime>(
    ctx: Arc<Ctx<R>>,
    options: IngressOptions,
    shutdown: CancellationToken,
) {
    let mut resync = ctx
        .timer
        .every(What::Router, Duration::ZERO, options.resync);
    let proxy = match ctx.options.engine {
        Engine::Docker => match blocking(&ctx.store, |store| store.env_key()).await {
            Ok(key) => Proxy::Container(container::ContainerProxy::new(options, &key)),
            Err(error) => {
                tracing::error!(%error, "ingress router cannot read the agent key; not routing");
                return;
            }
        },
        Engine::Swarm => Proxy::Service(service::ServiceProxy::new(options)),
    };
    let mut wake = ctx.router.subscribe();
    // A maintenance change (this process's, or another's the sync loop noticed).
    let mut maintenance = ctx.store.subscribe_maintenance();
    let mut router = Router {
        ctx,
        proxy,
        report: RouterReport::default(),
    };
    let mut failures: usize = 0;
    let mut converging = false;
    loop {
        // After a failure the next pass follows the backoff, whatever wakes arrive meanwhile.
        let verify = if failures > 0 {
            true
        } else {
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = wake.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    false
                }
                changed = maintenance.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    false
                }
                _ = resync.tick() => true,
                () = async { router.ctx.timer.sleep(What::Router, CONVERGING).await }, if converging => false,
            }
        };
        let served = *wake.borrow_and_update();
        let outcome = tokio::select! {
            () = shutdown.cancelled() => return,
            outcome = router.pass(verify, served) => outcome,
        };
        match outcome {
            Ok(live) => {
                failures = 0;
                converging = !live;
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                // The reconciler's schedule (`RetryPolicy`), repeating its last step.
                let delay = router.ctx.options.retry.backoff(failures);
                tracing::warn!(%error, retry_in = ?delay, "ingress router pass failed");
                let message = error.to_string();
                let mut report = router.report.clone();
                report.passes += 1;
                report.served_wake = served;
                report.error = Some(message);
                router.publish(report);
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = router.ctx.timer.sleep(What::Router, delay) => {}
                }
            }
        }
    }
}

/// Removes this agent's proxy, if any (the ingress is off, or no ingress is left): its
/// container, or under Swarm its service and the configs it ran.
pub(crate) async fn remove_proxy<R: Runtime>(
    runtime: &R,
    agent_id: &str,
    engine: Engine,
) -> crate::runtime::Result<()> {
    match engine {
        Engine::Docker => container::remove(runtime, agent_id).await,
        Engine::Swarm => service::remove(runtime, agent_id).await,
    }
}

impl<R: Runtime> Router<R> {
    fn publish(&mut self, report: RouterReport) {
        // Ingresses whose served routes changed, or all of them when the error changed,
        // reconcile again so their statuses follow.
        let mut keys: BTreeSet<&ResourceKey> = BTreeSet::new();
        for (key, fingerprint) in &report.live {
            if self.report.live.get(key) != Some(fingerprint) {
                keys.insert(key);
            }
        }
        for key in self.report.live.keys() {
            if !report.live.contains_key(key) {
                keys.insert(key);
            }
        }
        let everyone = report.error != self.report.error || report.proxy != self.report.proxy;
        if everyone {
            keys.extend(report.live.keys());
            keys.extend(self.report.live.keys());
        }
        for key in keys {
            self.ctx.timer.requeue(key.clone());
        }
        self.report = report.clone();
        self.ctx.router.publish(report);
    }

    /// One pass: the route table, then the proxy made to serve it. `Ok(false)` while the
    /// proxy is still being rolled out.
    async fn pass(&mut self, verify: bool, served: u64) -> std::result::Result<bool, PassError> {
        let table = current_table(&self.ctx).await?;
        let mut report = RouterReport {
            passes: self.report.passes + 1,
            pushes: self.report.pushes,
            served_wake: served,
            ..RouterReport::default()
        };
        if table.ingresses.is_empty() {
            let ctx = &self.ctx;
            match &mut self.proxy {
                Proxy::Container(proxy) => proxy.remove_all(ctx).await?,
                Proxy::Service(proxy) => proxy.remove_all(ctx).await?,
            }
            // Ingresses that were live need a status pass (they are gone or unrouted).
            if !self.report.live.is_empty() || self.report.proxy.is_some() {
                tracing::info!("no ingress left: the proxy is gone");
            }
            self.publish(report);
            return Ok(true);
        }
        let ctx = &self.ctx;
        let served = match &mut self.proxy {
            Proxy::Container(proxy) => proxy.serve(ctx, &table, verify).await?,
            Proxy::Service(proxy) => proxy.serve(ctx, &table).await?,
        };
        if served.pushed {
            report.pushes += 1;
        }
        report.live = if served.live {
            // An ingress's own view is its first (a preview or canary route follows it).
            let mut live = BTreeMap::new();
            for view in &table.ingresses {
                live.entry(view.key.clone())
                    .or_insert_with(|| fingerprint(view));
            }
            live
        } else {
            // What the proxy served before still serves while its new version rolls out.
            self.report.live.clone()
        };
        report.proxy = Some(served.proxy);
        self.publish(report);
        Ok(served.live)
    }
}
