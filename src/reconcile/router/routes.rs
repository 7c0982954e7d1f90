//! Ingress routes, decided: desired ingresses + their target deployments + the readiness of
//! those deployments' replicas → a route table (one `IngressView` per ingress, which is also
//! what its status shows) → the Caddy JSON config the router pushes with `POST /load`.
//!
//! Invariants:
//! - pure: no IO, no clock; the same inputs give the same table and byte-identical JSON, so
//!   the router decides whether to push by comparing configs;
//! - ingresses are taken in key order, and the first one by key keeps a host + path that a
//!   later one also declares (the manifest stage warns about the later one); hosts are
//!   compared as the proxy compares them, in lower case;
//! - sealed (`Sealing`, several sources): an ingress is routed only when its source holds
//!   its host (the store's claims; every path under a host is its holder's), and the
//!   proxy-wide on-demand TLS `ask` comes only from the source owning the unscoped `""`;
//! - only replicas whose readiness row says ready, with an address, are upstreams; a route
//!   whose deployment has none answers 503 with a short reason instead of disappearing, so a
//!   request never falls through to another route;
//! - a host is served over HTTPS only when its ingress has an enabled `tls {}` block; every
//!   other host stays plain HTTP (it never enters Caddy's automatic HTTPS);
//! - every config carries the same `admin` block as the boot config, so a push never moves or
//!   opens Caddy's admin endpoint.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::manifest::spec::{
    Claim, ClaimKind, DeploymentSpec, IngressSpec, container_port, normalize_host,
};
use crate::model::ResourceKey;
use crate::model::scopes::Ownership;

/// Where Caddy's admin API listens inside its container (published on loopback only).
pub(crate) const ADMIN_PORT: u16 = 2019;
/// The listen ports of Caddy's two servers inside its container.
pub(crate) const HTTP_PORT: u16 = 80;
pub(crate) const HTTPS_PORT: u16 = 443;
/// voodu's default readiness probe period, the health-check interval when a readiness
/// `http_get` probe sets none.
const DEFAULT_PROBE_PERIOD: &str = "10s";
/// A replica that died is still an upstream until its readiness row says so. Caddy then
/// gives each connection attempt `DIAL_TIMEOUT` (the replicas sit on the same bridge, so a
/// live one answers in well under a millisecond), keeps trying other upstreams for
/// `TRY_DURATION`, and after a failed dial leaves that upstream out for `FAIL_DURATION`
/// (passive health check).
const DIAL_TIMEOUT: &str = "1s";
const TRY_DURATION: &str = "3s";
const FAIL_DURATION: &str = "5s";
/// How often the proxy resolves a Swarm service's tasks again.
const TASKS_REFRESH: &str = "2s";

/// One deployment an ingress routes to, as the router sees it.
pub(crate) struct Backend<'a> {
    pub(crate) spec: &'a DeploymentSpec,
    /// Addresses on the shared network of its ready replicas, in container-name order.
    pub(crate) ready: Vec<String>,
    /// Under Swarm: the DNS name whose A records are the service's running tasks
    /// (`tasks.<service>`), which the proxy resolves itself; `ready` is then unused.
    pub(crate) tasks: Option<String>,
    /// A blue/green rollout's preview host and the addresses it reaches (`split`).
    pub(crate) preview: Option<(String, Vec<String>)>,
    /// A canary in flight: the header value of its own route and its replicas' addresses.
    pub(crate) canary: Option<(String, Vec<String>)>,
}

/// What one ingress asks of the proxy, resolved against the host. Its status shows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct IngressView {
    pub(crate) key: ResourceKey,
    pub(crate) host: String,
    /// The deployment (same scope) it routes to.
    pub(crate) service: String,
    pub(crate) port: u16,
    /// `http://host` or `https://host`, as `${ref.ingress.<name>.url}` resolves.
    pub(crate) url: String,
    pub(crate) deployment_found: bool,
    /// Replicas of that deployment (0 when it does not exist).
    pub(crate) n_replicas: usize,
    pub(crate) routes: Vec<RouteView>,
    /// `address:port` of every ready replica (under Swarm, `tasks.<service>:port`).
    pub(crate) upstreams: Vec<String>,
    /// Under Swarm: the name the proxy resolves to the tasks it balances over.
    pub(crate) tasks: Option<String>,
    /// Caddy's selection policy name (voodu's names are Caddy's).
    pub(crate) policy: String,
    pub(crate) health_check: Option<HealthCheck>,
    pub(crate) tls: Option<TlsMode>,
    /// Problems that do not stop the ingress (a shadowed route, an ignored `ask`).
    pub(crate) warnings: Vec<String>,
    /// Its deployment is in maintenance: every route answers this page (`maintenance.rs`).
    pub(crate) maintenance: Option<super::maintenance::Page>,
    /// Only requests with this header (name, value) take these routes: a canary's own route
    /// (`CANARY_HEADER`), tried before the host's other routes.
    pub(crate) match_header: Option<(String, String)>,
}

/// The header whose value (random per agent, `wake::CanaryToken`) routes a request to a
/// canary's own replicas.
pub(crate) const CANARY_HEADER: &str = "X-Voodu-Canary";

/// One `location` (or the catch-all when there is none).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct RouteView {
    /// The path prefix as declared; `None` is the catch-all.
    pub(crate) path: Option<String>,
    pub(crate) strip: bool,
    /// The ingress that routes this host + path first, when it is not this one.
    pub(crate) shadowed_by: Option<ResourceKey>,
}

/// Caddy's active health check for an ingress's upstreams (spec §7.14).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HealthCheck {
    pub(crate) path: String,
    /// The readiness probe's port, when the path comes from it and it differs from the
    /// upstream port; `None` checks the upstream port.
    pub(crate) port: Option<u16>,
    /// A Go duration (Caddy reads the same syntax).
    pub interval: String,
}

/// How a TLS host gets its certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct TlsMode {
    /// `letsencrypt` (ACME) or `internal` (Caddy's own CA).
    pub(crate) provider: String,
    pub(crate) email: String,
    pub(crate) on_demand: bool,
    pub(crate) ask: String,
}

/// Every ingress, resolved, in key order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RouteTable {
    pub(crate) ingresses: Vec<IngressView>,
    /// The on-demand TLS `ask` endpoint (Caddy has one for all hosts): the first by key.
    pub(crate) ask: Option<String>,
}

impl RouteTable {
    pub(crate) fn view(&self, key: &ResourceKey) -> Option<&IngressView> {
        self.ingresses.iter().find(|view| &view.key == key)
    }
}

/// The port an ingress sends to: its own `port`, else the deployment's first container port
/// that parses, else 80 (spec §7.14). `${ref.ingress.<name>.port}` resolves the same way.
pub(crate) fn ingress_port(ingress: &IngressSpec, deployment: Option<&DeploymentSpec>) -> u16 {
    u16::try_from(ingress.port)
        .ok()
        .filter(|port| *port > 0)
        .or_else(|| {
            deployment.and_then(|deployment| {
                deployment
                    .ports
                    .iter()
                    .find_map(|port| container_port(port))
            })
        })
        .unwrap_or(80)
}

/// The URL an ingress serves: `https://host` with an enabled `tls {}` block, else `http://`.
pub(crate) fn ingress_url(ingress: &IngressSpec) -> String {
    let tls = ingress.tls.as_ref().is_some_and(|tls| tls.enabled);
    format!("{}://{}", if tls { "https" } else { "http" }, ingress.host)
}

/// Resolves every ingress against its deployment (same scope, `service` or the ingress's
/// name) in `backends`, keyed by the deployment's key.
/// Which source may route which host: the ownership of scopes and the store's host claims
/// (host → the source holding it).
pub(crate) struct Sealing<'a> {
    pub(crate) ownership: &'a Ownership,
    pub(crate) hosts: &'a BTreeMap<String, String>,
}

impl Sealing<'_> {
    /// Why the ingress `key` may not serve `host`, or `None` when it may.
    fn refusal(&self, key: &ResourceKey, host: &str) -> Option<String> {
        let source = self.ownership.source_of(&key.scope)?;
        let wanted = Claim {
            what: ClaimKind::Host,
            value: normalize_host(host),
        };
        // A wildcard can collide with several held hosts: any of another source's refuses.
        let (held, holder) = self.hosts.iter().find(|(held, holder)| {
            **holder != source
                && wanted.collides(&Claim {
                    what: ClaimKind::Host,
                    value: (*held).clone(),
                })
        })?;
        Some({
            format!(
                "{}; not routed",
                crate::model::scopes::foreign(
                    &format!("ingress host {held}"),
                    &source,
                    Some(holder.as_str())
                )
            )
        })
    }

    /// Whether ingress `key` may set proxy-wide settings (the TLS `ask`).
    fn proxy_wide(&self, key: &ResourceKey) -> bool {
        self.ownership.same_owner(&key.scope, "")
    }
}

pub(crate) fn route_table(
    ingresses: &[(ResourceKey, IngressSpec)],
    backends: &BTreeMap<ResourceKey, Backend<'_>>,
    sealing: Option<&Sealing<'_>>,
) -> RouteTable {
    let mut sorted: Vec<&(ResourceKey, IngressSpec)> = ingresses.iter().collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    // `host + path` (the catch-all counts as "/", as the manifest stage counts it) → owner.
    let mut owners: BTreeMap<String, ResourceKey> = BTreeMap::new();
    let mut table = RouteTable::default();
    for (key, ingress) in sorted {
        let refused = sealing.and_then(|sealing| sealing.refusal(key, &ingress.host));
        let service = ingress.effective_service(&key.name).to_owned();
        let deployment_key =
            ResourceKey::new(crate::model::Kind::Deployment, key.scope.clone(), &service);
        let backend = backends.get(&deployment_key);
        let deployment = backend.map(|backend| backend.spec);
        let port = ingress_port(ingress, deployment);
        let mut warnings = Vec::new();
        let routes = claim_routes(key, ingress, refused.is_some(), &mut owners, &mut warnings);
        let tasks = backend.and_then(|backend| backend.tasks.clone());
        let upstreams = upstreams_of(backend, tasks.as_deref(), port);
        let tls = tls_of(ingress, refused.is_none());
        warnings.extend(refused);
        let proxy_wide = sealing.is_none_or(|sealing| sealing.proxy_wide(key));
        claim_ask(&mut table, tls.as_ref(), proxy_wide, &mut warnings);
        let swarm = tasks.is_some();
        let preview = backend
            .and_then(|backend| backend.preview.as_ref())
            .filter(|_| !swarm);
        table.ingresses.push(IngressView {
            key: key.clone(),
            host: ingress.host.clone(),
            service,
            port,
            url: ingress_url(ingress),
            deployment_found: backend.is_some(),
            n_replicas: deployment.map_or(0, DeploymentSpec::n_replicas),
            routes,
            upstreams,
            tasks,
            policy: ingress
                .lb
                .as_ref()
                .map(|lb| lb.policy.clone())
                .filter(|policy| !policy.is_empty())
                .unwrap_or_else(|| "round_robin".to_owned()),
            health_check: deployment.and_then(|deployment| health_check(ingress, deployment, port)),
            tls,
            warnings,
            maintenance: None,
            match_header: None,
        });
        if let Some((token, addresses)) = backend
            .and_then(|backend| backend.canary.as_ref())
            .filter(|_| !swarm)
            && let Some(main) = table.ingresses.last()
        {
            let view = canary_view(main, token, addresses);
            table.ingresses.push(view);
        }
        if let Some((host, addresses)) = preview
            && let Some(view) = preview_view(
                table.ingresses.last(),
                host,
                addresses,
                sealing,
                &mut owners,
            )
        {
            table.ingresses.push(view);
        }
    }
    table
}

/// A view beside `main` (a canary's own route, a preview host): its routes that serve and its
/// settings, plain HTTP, to `addresses` on its port.
fn beside(main: &IngressView, addresses: &[String]) -> IngressView {
    IngressView {
        routes: main
            .routes
            .iter()
            .filter(|route| route.shadowed_by.is_none())
            .cloned()
            .collect(),
        upstreams: addresses
            .iter()
            .map(|address| format!("{address}:{}", main.port))
            .collect(),
        tls: None,
        warnings: Vec::new(),
        ..main.clone()
    }
}

/// A canary's own route: the main view's host and routes, plain HTTP, to the canary's
/// `addresses`, taken only by requests carrying `CANARY_HEADER: token`.
fn canary_view(main: &IngressView, token: &str, addresses: &[String]) -> IngressView {
    IngressView {
        match_header: Some((CANARY_HEADER.to_owned(), token.to_owned())),
        ..beside(main, addresses)
    }
}

/// The preview host of a blue/green rollout: the main view's routes and settings at `host`
/// (plain HTTP), to the new release's `addresses`. `None` when the host is refused to the
/// ingress's source (another source holds it); a route another ingress holds is left out.
fn preview_view(
    main: Option<&IngressView>,
    host: &str,
    addresses: &[String],
    sealing: Option<&Sealing<'_>>,
    owners: &mut BTreeMap<String, ResourceKey>,
) -> Option<IngressView> {
    let main = main?;
    if host.is_empty()
        || sealing
            .and_then(|sealing| sealing.refusal(&main.key, host))
            .is_some()
    {
        return None;
    }
    let mut view = beside(main, addresses);
    view.routes.retain(|route| {
        let claim = format!(
            "{}{}",
            normalize_host(host),
            route.path.as_deref().unwrap_or("/")
        );
        if owners.get(&claim).is_some_and(|owner| owner != &main.key) {
            return false;
        }
        owners.insert(claim, main.key.clone());
        true
    });
    view.host = host.to_owned();
    view.url = format!("http://{host}");
    Some(view)
}

/// The routes `ingress` asks for (`host + path`, one per location, or the host's catch-all),
/// each claimed in `owners` by the first ingress by key declaring it: a later one is shadowed,
/// and says so in `warnings`. A refused ingress asks for none.
fn claim_routes(
    key: &ResourceKey,
    ingress: &IngressSpec,
    refused: bool,
    owners: &mut BTreeMap<String, ResourceKey>,
    warnings: &mut Vec<String>,
) -> Vec<RouteView> {
    let paths: Vec<(Option<String>, bool)> = if refused {
        Vec::new()
    } else if ingress.locations.is_empty() {
        vec![(None, false)]
    } else {
        ingress
            .locations
            .iter()
            .map(|location| (Some(location.path.clone()), location.strip))
            .collect()
    };
    let mut routes = Vec::with_capacity(paths.len());
    for (path, strip) in paths {
        let route = format!(
            "{}{}",
            normalize_host(&ingress.host),
            path.as_deref().unwrap_or("/")
        );
        let shadowed_by = match owners.get(&route) {
            Some(owner) if owner != key => Some(owner.clone()),
            // The same ingress declaring a path twice: the first location serves it.
            Some(_) => continue,
            None => {
                owners.insert(route.clone(), key.clone());
                None
            }
        };
        if let Some(owner) = &shadowed_by {
            warnings.push(format!(
                "route {route} is also declared by {owner}, which serves it"
            ));
        }
        routes.push(RouteView {
            path,
            strip,
            shadowed_by,
        });
    }
    routes
}

/// Where the proxy dials `backend`: its Swarm service's tasks by name, else each ready
/// replica's address once, on `port`.
fn upstreams_of(backend: Option<&Backend<'_>>, tasks: Option<&str>, port: u16) -> Vec<String> {
    let mut upstreams: Vec<String> = Vec::new();
    if let Some(name) = tasks {
        upstreams.push(format!("{name}:{port}"));
    }
    for address in backend
        .filter(|_| tasks.is_none())
        .map(|backend| backend.ready.as_slice())
        .unwrap_or(&[])
    {
        let dial = format!("{address}:{port}");
        if !address.is_empty() && !upstreams.contains(&dial) {
            upstreams.push(dial);
        }
    }
    upstreams
}

/// The ingress's TLS mode, when it asks for TLS and is `allowed` to.
fn tls_of(ingress: &IngressSpec, allowed: bool) -> Option<TlsMode> {
    ingress
        .tls
        .as_ref()
        .filter(|tls| tls.enabled && allowed)
        .map(|tls| TlsMode {
            provider: if tls.provider.is_empty() {
                "letsencrypt".to_owned()
            } else {
                tls.provider.clone()
            },
            email: tls.email.clone(),
            on_demand: tls.on_demand,
            ask: tls.ask.clone(),
        })
}

/// The proxy's one on-demand TLS `ask` endpoint: the first ingress by key that sets one, and
/// only from the source owning the unscoped resources (`proxy_wide`); another is reported.
fn claim_ask(
    table: &mut RouteTable,
    tls: Option<&TlsMode>,
    proxy_wide: bool,
    warnings: &mut Vec<String>,
) {
    if let Some(tls) = tls
        && tls.on_demand
        && !tls.ask.is_empty()
        && !proxy_wide
    {
        warnings.push(format!(
            "tls.ask {:?} is not used: the proxy-wide on-demand ask endpoint comes only from the source owning the unscoped resources (\"\")",
            tls.ask
        ));
    } else if let Some(tls) = tls
        && tls.on_demand
        && !tls.ask.is_empty()
    {
        match &table.ask {
            None => table.ask = Some(tls.ask.clone()),
            Some(first) if first != &tls.ask => warnings.push(format!(
                "tls.ask {:?} is not used: the proxy has one on-demand ask endpoint, {first:?} (the first ingress by key that sets one)",
                tls.ask
            )),
            Some(_) => {}
        }
    }
}

/// voodu's health check: path = the readiness probe's `http_get.path`, else the deployment's
/// `health_check` ("/" by default); interval = `lb.interval`, else the readiness probe's
/// period when it is an `http_get` probe; no interval, no active check.
fn health_check(
    ingress: &IngressSpec,
    deployment: &DeploymentSpec,
    upstream_port: u16,
) -> Option<HealthCheck> {
    let probe = deployment
        .probes
        .as_ref()
        .and_then(|probes| probes.readiness.as_ref());
    let http_get = probe.and_then(|probe| probe.http_get.as_ref());
    let interval = ingress
        .lb
        .as_ref()
        .map(|lb| lb.interval.clone())
        .filter(|interval| !interval.is_empty())
        .or_else(|| {
            http_get.map(|_| {
                probe
                    .map(|probe| probe.period.clone())
                    .filter(|period| !period.is_empty())
                    .unwrap_or_else(|| DEFAULT_PROBE_PERIOD.to_owned())
            })
        })?;
    let (path, port) = match http_get {
        Some(http_get) => (
            http_get.path.clone(),
            u16::try_from(http_get.port)
                .ok()
                .filter(|port| *port > 0 && *port != upstream_port),
        ),
        None if !deployment.health_check.is_empty() => (deployment.health_check.clone(), None),
        None => ("/".to_owned(), None),
    };
    Some(HealthCheck {
        path,
        port,
        interval,
    })
}

/// The admin block every config carries: reachable through the container's published port,
/// and only with the agent's origin token (Caddy skips its Host check on a wildcard
/// listener, so the Origin check is what keeps other containers on the network out).
fn admin(origin: &str) -> Value {
    json!({
        "listen": format!("0.0.0.0:{ADMIN_PORT}"),
        "enforce_origin": true,
        "origins": [origin],
    })
}

/// The config Caddy starts with: the admin endpoint and nothing else.
pub(crate) fn boot_config(origin: &str) -> Value {
    json!({ "admin": admin(origin) })
}

/// The whole Caddy config for `table`.
pub(crate) fn caddy_config(table: &RouteTable, origin: &str) -> Value {
    struct Entry<'a> {
        view: &'a IngressView,
        route: &'a RouteView,
    }
    let mut entries: Vec<Entry<'_>> = table
        .ingresses
        .iter()
        .flat_map(|view| {
            view.routes
                .iter()
                .filter(|route| route.shadowed_by.is_none())
                .map(move |route| Entry { view, route })
        })
        .collect();
    // Caddy tries routes in order: exact hosts before wildcards, and within a host the
    // longest path prefix first, the catch-all last.
    entries.sort_by(|a, b| {
        let rank = |entry: &Entry<'_>| {
            (
                entry.view.host.starts_with('*'),
                entry.view.host.clone(),
                std::cmp::Reverse(entry.route.path.as_deref().map_or(0, str::len)),
                entry.route.path.clone(),
                // A header-matched route (a canary's own) before the host's others.
                entry.view.match_header.is_none(),
            )
        };
        rank(a).cmp(&rank(b))
    });
    let mut plain = Vec::new();
    let mut secure = Vec::new();
    for entry in &entries {
        let route = caddy_route(entry.view, entry.route);
        if entry.view.tls.is_some() {
            secure.push(route);
        } else {
            plain.push(route);
        }
    }
    let n_secure = secure.len();
    let not_routed = json!({
        "handle": [{
            "handler": "static_response",
            "status_code": 404,
            "headers": {"Content-Type": ["text/plain; charset=utf-8"]},
            "body": "voodu: no ingress routes this host and path\n",
        }],
    });
    plain.push(not_routed.clone());
    secure.push(not_routed);
    let mut servers = serde_json::Map::new();
    servers.insert(
        "http".to_owned(),
        json!({ "listen": [format!(":{HTTP_PORT}")], "routes": plain }),
    );
    if n_secure > 0 {
        servers.insert(
            "https".to_owned(),
            json!({ "listen": [format!(":{HTTPS_PORT}")], "routes": secure }),
        );
    }
    let mut apps = serde_json::Map::new();
    apps.insert("http".to_owned(), json!({ "servers": servers }));
    let policies = tls_policies(table);
    if !policies.is_empty() {
        let mut automation = serde_json::Map::new();
        automation.insert("policies".to_owned(), Value::Array(policies));
        if let Some(ask) = &table.ask {
            automation.insert("on_demand".to_owned(), json!({ "ask": ask }));
        }
        apps.insert("tls".to_owned(), json!({ "automation": automation }));
        // The internal CA's root is not installed into any trust store (there is none to
        // reach from the container).
        apps.insert(
            "pki".to_owned(),
            json!({ "certificate_authorities": { "local": { "install_trust": false } } }),
        );
    }
    json!({ "admin": admin(origin), "apps": apps })
}

/// One Caddy route: host (+ path prefix) → optional prefix strip → the ready replicas, or a
/// 503 that says why there are none; in maintenance, the maintenance page.
fn caddy_route(view: &IngressView, route: &RouteView) -> Value {
    let mut matcher = serde_json::Map::new();
    matcher.insert("host".to_owned(), json!([view.host]));
    let prefix = route
        .path
        .as_deref()
        .map(|path| path.trim_end_matches('*'))
        .filter(|prefix| !prefix.is_empty());
    if let Some(prefix) = prefix {
        matcher.insert("path".to_owned(), json!([format!("{prefix}*")]));
    }
    if let Some((name, value)) = &view.match_header {
        matcher.insert("header".to_owned(), json!({ name.as_str(): [value] }));
    }
    if let Some(page) = &view.maintenance {
        let handle = [super::maintenance::handler(page)];
        return json!({ "match": [matcher], "handle": handle, "terminal": true });
    }
    let mut handle = Vec::new();
    if route.strip
        && let Some(prefix) = prefix
    {
        handle.push(json!({ "handler": "rewrite", "strip_path_prefix": prefix }));
    }
    if view.upstreams.is_empty() {
        let deployment = format!("{}/{}", view.key.scope, view.service);
        let body = if view.deployment_found {
            format!("voodu: no ready replica of deployment {deployment}\n")
        } else {
            format!("voodu: deployment {deployment} does not exist\n")
        };
        handle.push(json!({
            "handler": "static_response",
            "status_code": 503,
            "headers": {"Content-Type": ["text/plain; charset=utf-8"], "Retry-After": ["5"]},
            "body": body,
        }));
    } else {
        let mut proxy = serde_json::Map::new();
        proxy.insert("handler".to_owned(), json!("reverse_proxy"));
        match &view.tasks {
            // Swarm: the tasks' addresses, resolved again every `refresh`.
            Some(name) => proxy.insert(
                "dynamic_upstreams".to_owned(),
                json!({
                    "source": "a",
                    "name": name,
                    "port": view.port.to_string(),
                    "refresh": TASKS_REFRESH,
                }),
            ),
            None => proxy.insert(
                "upstreams".to_owned(),
                Value::Array(
                    view.upstreams
                        .iter()
                        .map(|dial| json!({ "dial": dial }))
                        .collect(),
                ),
            ),
        };
        proxy.insert(
            "transport".to_owned(),
            json!({ "protocol": "http", "dial_timeout": DIAL_TIMEOUT }),
        );
        proxy.insert(
            "load_balancing".to_owned(),
            json!({
                "selection_policy": { "policy": view.policy },
                "try_duration": TRY_DURATION,
            }),
        );
        let mut checks = serde_json::Map::new();
        checks.insert(
            "passive".to_owned(),
            json!({ "fail_duration": FAIL_DURATION }),
        );
        if let Some(check) = &view.health_check {
            let mut active = serde_json::Map::new();
            active.insert("uri".to_owned(), json!(check.path));
            if let Some(port) = check.port {
                active.insert("port".to_owned(), json!(port));
            }
            active.insert("interval".to_owned(), json!(check.interval));
            checks.insert("active".to_owned(), Value::Object(active));
        }
        proxy.insert("health_checks".to_owned(), Value::Object(checks));
        handle.push(Value::Object(proxy));
    }
    json!({ "match": [matcher], "handle": handle, "terminal": true })
}

/// One automation policy per TLS host (the first ingress by key decides a host's issuer).
fn tls_policies(table: &RouteTable) -> Vec<Value> {
    let mut seen = BTreeSet::new();
    let mut policies = Vec::new();
    for view in &table.ingresses {
        let Some(tls) = &view.tls else { continue };
        if view.routes.iter().all(|route| route.shadowed_by.is_some())
            || !seen.insert(view.host.clone())
        {
            continue;
        }
        let issuer = if tls.provider == "internal" {
            json!({ "module": "internal" })
        } else if tls.email.is_empty() {
            json!({ "module": "acme" })
        } else {
            json!({ "module": "acme", "email": tls.email })
        };
        let mut policy = serde_json::Map::new();
        policy.insert("subjects".to_owned(), json!([view.host]));
        policy.insert("issuers".to_owned(), json!([issuer]));
        if tls.on_demand {
            policy.insert("on_demand".to_owned(), json!(true));
        }
        policies.push(Value::Object(policy));
    }
    policies
}

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};

    use super::*;
    use crate::manifest::spec::{HttpGet, LoadBalancing, Location, Probe, Probes, Tls};
    use crate::model::Kind;

    fn ingress(scope: &str, name: &str, spec: IngressSpec) -> (ResourceKey, IngressSpec) {
        (ResourceKey::new(Kind::Ingress, scope, name), spec)
    }

    fn host(host: &str) -> IngressSpec {
        IngressSpec {
            host: host.to_owned(),
            ..IngressSpec::default()
        }
    }

    fn deployment(ports: &[&str]) -> DeploymentSpec {
        DeploymentSpec {
            ports: ports.iter().map(|port| (*port).to_owned()).collect(),
            health_check: "/".to_owned(),
            replicas: Some(2),
            ..DeploymentSpec::default()
        }
    }

    /// Builds the table from `(scope, name, spec, ready addresses)` deployments.
    fn table(
        ingresses: &[(ResourceKey, IngressSpec)],
        deployments: &[(&str, &str, &DeploymentSpec, &[&str])],
    ) -> RouteTable {
        let backends: BTreeMap<ResourceKey, Backend<'_>> = deployments
            .iter()
            .map(|(scope, name, spec, ready)| {
                (
                    ResourceKey::new(Kind::Deployment, *scope, *name),
                    Backend {
                        spec,
                        ready: ready.iter().map(|address| (*address).to_owned()).collect(),
                        tasks: None,
                        preview: None,
                        canary: None,
                    },
                )
            })
            .collect();
        route_table(ingresses, &backends, None)
    }

    fn check(table: &RouteTable, expected: Expect) {
        let config = caddy_config(table, "voodu-test.invalid");
        let text = serde_json::to_string_pretty(&config["apps"]).expect("json");
        expected.assert_eq(&text);
    }

    #[test]
    fn a_catch_all_ingress_proxies_to_the_ready_replicas_on_the_first_container_port() {
        let web = deployment(&["127.0.0.1::8080", "9090"]);
        let table = table(
            &[ingress("shop", "web", host("web.example.com"))],
            &[("shop", "web", &web, &["10.0.0.2", "10.0.0.3"])],
        );
        check(
            &table,
            expect![[r#"
                {
                  "http": {
                    "servers": {
                      "http": {
                        "listen": [
                          ":80"
                        ],
                        "routes": [
                          {
                            "handle": [
                              {
                                "handler": "reverse_proxy",
                                "health_checks": {
                                  "passive": {
                                    "fail_duration": "5s"
                                  }
                                },
                                "load_balancing": {
                                  "selection_policy": {
                                    "policy": "round_robin"
                                  },
                                  "try_duration": "3s"
                                },
                                "transport": {
                                  "dial_timeout": "1s",
                                  "protocol": "http"
                                },
                                "upstreams": [
                                  {
                                    "dial": "10.0.0.2:8080"
                                  },
                                  {
                                    "dial": "10.0.0.3:8080"
                                  }
                                ]
                              }
                            ],
                            "match": [
                              {
                                "host": [
                                  "web.example.com"
                                ]
                              }
                            ],
                            "terminal": true
                          },
                          {
                            "handle": [
                              {
                                "body": "voodu: no ingress routes this host and path\n",
                                "handler": "static_response",
                                "headers": {
                                  "Content-Type": [
                                    "text/plain; charset=utf-8"
                                  ]
                                },
                                "status_code": 404
                              }
                            ]
                          }
                        ]
                      }
                    }
                  }
                }"#]],
        );
    }

    #[test]
    fn the_port_is_explicit_else_the_first_parseable_container_port_else_80() {
        let with_ports = deployment(&["nonsense", "127.0.0.1:8000:3000/udp"]);
        let without = deployment(&[]);
        let mut explicit = host("a.test");
        explicit.port = 9000;
        assert_eq!(ingress_port(&explicit, Some(&with_ports)), 9000);
        assert_eq!(ingress_port(&host("a.test"), Some(&with_ports)), 3000);
        assert_eq!(ingress_port(&host("a.test"), Some(&without)), 80);
        assert_eq!(ingress_port(&host("a.test"), None), 80);
    }

    #[test]
    fn locations_match_path_prefixes_longest_first_and_strip_when_asked() {
        let api = deployment(&["3000"]);
        let mut spec = host("shop.test");
        spec.locations = vec![
            Location {
                path: "/".to_owned(),
                strip: false,
            },
            Location {
                path: "/api".to_owned(),
                strip: true,
            },
            Location {
                path: "/api/v2/".to_owned(),
                strip: false,
            },
        ];
        let table = table(
            &[ingress("shop", "api", spec)],
            &[("shop", "api", &api, &["10.0.0.9"])],
        );
        let config = caddy_config(&table, "voodu-test.invalid");
        let routes = &config["apps"]["http"]["servers"]["http"]["routes"];
        let summary: Vec<String> = routes
            .as_array()
            .expect("routes")
            .iter()
            .map(|route| {
                format!(
                    "{} {}",
                    route["match"][0]["path"],
                    route["handle"]
                        .as_array()
                        .expect("handlers")
                        .iter()
                        .map(|handler| match handler["handler"].as_str() {
                            Some("rewrite") => format!("strip {}", handler["strip_path_prefix"]),
                            Some(other) => other.to_owned(),
                            None => "?".to_owned(),
                        })
                        .collect::<Vec<_>>()
                        .join(" → ")
                )
            })
            .collect();
        expect![[r#"
            [
                "[\"/api/v2/*\"] reverse_proxy",
                "[\"/api*\"] strip \"/api\" → reverse_proxy",
                "[\"/*\"] reverse_proxy",
                "null static_response",
            ]
        "#]]
        .assert_debug_eq(&summary);
    }

    #[test]
    fn wildcard_hosts_pass_through_after_exact_hosts() {
        let web = deployment(&["80"]);
        let table = table(
            &[
                ingress("t", "a-tenants", host("*.tenants.test")),
                ingress("t", "b-admin", host("admin.tenants.test")),
            ],
            &[
                ("t", "a-tenants", &web, &["10.0.0.2"]),
                ("t", "b-admin", &web, &["10.0.0.3"]),
            ],
        );
        let config = caddy_config(&table, "voodu-test.invalid");
        let hosts: Vec<&Value> = config["apps"]["http"]["servers"]["http"]["routes"]
            .as_array()
            .expect("routes")
            .iter()
            .map(|route| &route["match"][0]["host"][0])
            .collect();
        assert_eq!(
            hosts,
            [
                &json!("admin.tenants.test"),
                &json!("*.tenants.test"),
                &Value::Null
            ]
        );
    }

    #[test]
    fn each_lb_policy_is_caddys_policy_of_the_same_name() {
        let web = deployment(&["80"]);
        for policy in ["", "round_robin", "random", "least_conn", "ip_hash"] {
            let mut spec = host("a.test");
            spec.lb = Some(LoadBalancing {
                policy: policy.to_owned(),
                interval: String::new(),
            });
            let table = table(
                &[ingress("s", "web", spec)],
                &[("s", "web", &web, &["10.0.0.2"])],
            );
            let config = caddy_config(&table, "voodu-test.invalid");
            let chosen = &config["apps"]["http"]["servers"]["http"]["routes"][0]["handle"][0]["load_balancing"]
                ["selection_policy"]["policy"];
            let expected = if policy.is_empty() {
                "round_robin"
            } else {
                policy
            };
            assert_eq!(chosen, &json!(expected), "policy {policy:?}");
        }
    }

    fn health_of(spec: &IngressSpec, deployment: &DeploymentSpec) -> Option<HealthCheck> {
        let table = table(
            &[ingress("s", "web", spec.clone())],
            &[("s", "web", deployment, &["10.0.0.2"])],
        );
        table.ingresses[0].health_check.clone()
    }

    #[test]
    fn health_checks_follow_voodu_readiness_probe_then_health_check_with_an_interval() {
        let mut with_interval = host("a.test");
        with_interval.lb = Some(LoadBalancing {
            policy: String::new(),
            interval: "5s".to_owned(),
        });
        let mut plain = deployment(&["8080"]);
        plain.health_check = "/up".to_owned();
        // No interval anywhere: no active check.
        assert_eq!(health_of(&host("a.test"), &plain), None);
        // lb.interval with the deployment's health_check.
        assert_eq!(
            health_of(&with_interval, &plain),
            Some(HealthCheck {
                path: "/up".to_owned(),
                port: None,
                interval: "5s".to_owned()
            })
        );
        // A readiness http_get probe gives the path (and its port) and, without lb.interval,
        // its period (voodu's 10s default when unset).
        let mut probed = plain.clone();
        probed.probes = Some(Box::new(Probes {
            readiness: Some(Probe {
                http_get: Some(HttpGet {
                    path: "/ready".to_owned(),
                    port: 9000,
                    ..HttpGet::default()
                }),
                ..Probe::default()
            }),
            ..Probes::default()
        }));
        assert_eq!(
            health_of(&host("a.test"), &probed),
            Some(HealthCheck {
                path: "/ready".to_owned(),
                port: Some(9000),
                interval: "10s".to_owned()
            })
        );
        assert_eq!(
            health_of(&with_interval, &probed).map(|check| check.interval),
            Some("5s".to_owned())
        );
        // A tcp readiness probe gives no interval and no path.
        let mut tcp = plain.clone();
        tcp.probes = Some(Box::new(Probes {
            readiness: Some(Probe {
                tcp_socket: Some(crate::manifest::spec::TcpSocket { port: 8080 }),
                period: "3s".to_owned(),
                ..Probe::default()
            }),
            ..Probes::default()
        }));
        assert_eq!(health_of(&host("a.test"), &tcp), None);
        let table = table(
            &[ingress("s", "web", with_interval.clone())],
            &[("s", "web", &probed, &["10.0.0.2"])],
        );
        let config = caddy_config(&table, "voodu-test.invalid");
        expect![[r#"
            {
              "active": {
                "interval": "5s",
                "port": 9000,
                "uri": "/ready"
              },
              "passive": {
                "fail_duration": "5s"
              }
            }"#]]
        .assert_eq(
            &serde_json::to_string_pretty(
                &config["apps"]["http"]["servers"]["http"]["routes"][0]["handle"][0]
                    ["health_checks"],
            )
            .expect("json"),
        );
    }

    #[test]
    fn no_ready_replica_or_no_deployment_answers_503_with_the_reason() {
        let web = deployment(&["80"]);
        let table = table(
            &[
                ingress("s", "down", host("down.test")),
                ingress("s", "missing", host("missing.test")),
            ],
            &[("s", "down", &web, &[])],
        );
        assert!(table.ingresses.iter().all(|view| view.upstreams.is_empty()));
        assert!(table.ingresses[0].deployment_found);
        assert!(!table.ingresses[1].deployment_found);
        check(
            &table,
            expect![[r#"
                {
                  "http": {
                    "servers": {
                      "http": {
                        "listen": [
                          ":80"
                        ],
                        "routes": [
                          {
                            "handle": [
                              {
                                "body": "voodu: no ready replica of deployment s/down\n",
                                "handler": "static_response",
                                "headers": {
                                  "Content-Type": [
                                    "text/plain; charset=utf-8"
                                  ],
                                  "Retry-After": [
                                    "5"
                                  ]
                                },
                                "status_code": 503
                              }
                            ],
                            "match": [
                              {
                                "host": [
                                  "down.test"
                                ]
                              }
                            ],
                            "terminal": true
                          },
                          {
                            "handle": [
                              {
                                "body": "voodu: deployment s/missing does not exist\n",
                                "handler": "static_response",
                                "headers": {
                                  "Content-Type": [
                                    "text/plain; charset=utf-8"
                                  ],
                                  "Retry-After": [
                                    "5"
                                  ]
                                },
                                "status_code": 503
                              }
                            ],
                            "match": [
                              {
                                "host": [
                                  "missing.test"
                                ]
                              }
                            ],
                            "terminal": true
                          },
                          {
                            "handle": [
                              {
                                "body": "voodu: no ingress routes this host and path\n",
                                "handler": "static_response",
                                "headers": {
                                  "Content-Type": [
                                    "text/plain; charset=utf-8"
                                  ]
                                },
                                "status_code": 404
                              }
                            ]
                          }
                        ]
                      }
                    }
                  }
                }"#]],
        );
    }

    #[test]
    fn the_first_ingress_by_key_wins_a_host_and_path_clash() {
        let one = deployment(&["80"]);
        let two = deployment(&["81"]);
        let mut later = host("a.test");
        later.locations = vec![
            Location {
                path: "/".to_owned(),
                strip: false,
            },
            Location {
                path: "/only-here".to_owned(),
                strip: false,
            },
        ];
        // Given out of order on purpose: the table sorts by key.
        let table = table(
            &[
                ingress("s", "zeta", later),
                ingress("s", "alpha", host("a.test")),
            ],
            &[
                ("s", "alpha", &one, &["10.0.0.1"]),
                ("s", "zeta", &two, &["10.0.0.2"]),
            ],
        );
        let keys: Vec<String> = table
            .ingresses
            .iter()
            .map(|view| view.key.to_string())
            .collect();
        assert_eq!(keys, ["ingress/s/alpha", "ingress/s/zeta"]);
        let zeta = &table.ingresses[1];
        assert_eq!(
            zeta.routes[0].shadowed_by,
            Some(ResourceKey::new(Kind::Ingress, "s", "alpha"))
        );
        assert_eq!(zeta.routes[1].shadowed_by, None);
        assert_eq!(
            zeta.warnings,
            ["route a.test/ is also declared by ingress/s/alpha, which serves it"]
        );
        let config = caddy_config(&table, "voodu-test.invalid");
        let served: Vec<String> = config["apps"]["http"]["servers"]["http"]["routes"]
            .as_array()
            .expect("routes")
            .iter()
            .filter(|route| route["match"].is_array())
            .map(|route| {
                format!(
                    "{}{} → {}",
                    route["match"][0]["host"][0].as_str().unwrap_or("?"),
                    route["match"][0]["path"][0].as_str().unwrap_or(""),
                    route["handle"][0]["upstreams"][0]["dial"]
                        .as_str()
                        .unwrap_or("?")
                )
            })
            .collect();
        assert_eq!(
            served,
            ["a.test/only-here* → 10.0.0.2:81", "a.test → 10.0.0.1:80"]
        );
    }

    fn tls(provider: &str, email: &str, on_demand: bool, ask: &str) -> Option<Tls> {
        Some(Tls {
            enabled: true,
            provider: provider.to_owned(),
            email: email.to_owned(),
            on_demand,
            ask: ask.to_owned(),
        })
    }

    #[test]
    fn tls_variants_become_https_routes_with_their_issuers() {
        let web = deployment(&["80"]);
        let mut plain = host("plain.test");
        plain.tls = Some(Tls {
            enabled: false,
            ..Tls::default()
        });
        let mut public = host("public.test");
        public.tls = tls("", "ops@example.com", false, "");
        let mut internal = host("internal.test");
        internal.tls = tls("internal", "", false, "");
        let mut tenants = host("*.tenants.test");
        tenants.tls = tls("letsencrypt", "", true, "http://127.0.0.1:9/ask");
        let mut other_ask = host("other.test");
        other_ask.tls = tls("letsencrypt", "", true, "http://127.0.0.1:9/other");
        let ingresses = [
            ingress("s", "a-plain", plain),
            ingress("s", "b-public", public),
            ingress("s", "c-internal", internal),
            ingress("s", "d-tenants", tenants),
            ingress("s", "e-other", other_ask),
        ];
        let deployments: Vec<(&str, &str, &DeploymentSpec, &[&str])> = ingresses
            .iter()
            .map(|(key, _)| ("s", key.name.as_str(), &web, &["10.0.0.2"][..]))
            .collect();
        let table = table(&ingresses, &deployments);
        let urls: Vec<&str> = table
            .ingresses
            .iter()
            .map(|view| view.url.as_str())
            .collect();
        assert_eq!(
            urls,
            [
                "http://plain.test",
                "https://public.test",
                "https://internal.test",
                "https://*.tenants.test",
                "https://other.test"
            ]
        );
        assert_eq!(
            table.ingresses[4].warnings,
            [
                "tls.ask \"http://127.0.0.1:9/other\" is not used: the proxy has one on-demand ask endpoint, \"http://127.0.0.1:9/ask\" (the first ingress by key that sets one)"
            ]
        );
        let config = caddy_config(&table, "voodu-test.invalid");
        let servers = &config["apps"]["http"]["servers"];
        let hosts = |server: &str| -> Vec<String> {
            servers[server]["routes"]
                .as_array()
                .map(|routes| {
                    routes
                        .iter()
                        .map(|route| route["match"][0]["host"][0].to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(hosts("http"), ["\"plain.test\"", "null"]);
        assert_eq!(
            hosts("https"),
            [
                "\"internal.test\"",
                "\"other.test\"",
                "\"public.test\"",
                "\"*.tenants.test\"",
                "null"
            ]
        );
        expect![[r#"
            {
              "pki": {
                "certificate_authorities": {
                  "local": {
                    "install_trust": false
                  }
                }
              },
              "tls": {
                "automation": {
                  "on_demand": {
                    "ask": "http://127.0.0.1:9/ask"
                  },
                  "policies": [
                    {
                      "issuers": [
                        {
                          "email": "ops@example.com",
                          "module": "acme"
                        }
                      ],
                      "subjects": [
                        "public.test"
                      ]
                    },
                    {
                      "issuers": [
                        {
                          "module": "internal"
                        }
                      ],
                      "subjects": [
                        "internal.test"
                      ]
                    },
                    {
                      "issuers": [
                        {
                          "module": "acme"
                        }
                      ],
                      "on_demand": true,
                      "subjects": [
                        "*.tenants.test"
                      ]
                    },
                    {
                      "issuers": [
                        {
                          "module": "acme"
                        }
                      ],
                      "on_demand": true,
                      "subjects": [
                        "other.test"
                      ]
                    }
                  ]
                }
              }
            }"#]]
        .assert_eq(
            &serde_json::to_string_pretty(&json!({
                "tls": config["apps"]["tls"],
                "pki": config["apps"]["pki"],
            }))
            .expect("json"),
        );
    }

    #[test]
    fn every_config_keeps_the_admin_endpoint_of_the_boot_config() {
        let empty = caddy_config(&RouteTable::default(), "voodu-abc.invalid");
        assert_eq!(empty["admin"], boot_config("voodu-abc.invalid")["admin"]);
        expect![[r#"
            {
              "admin": {
                "enforce_origin": true,
                "listen": "0.0.0.0:2019",
                "origins": [
                  "voodu-abc.invalid"
                ]
              }
            }"#]]
        .assert_eq(&serde_json::to_string_pretty(&boot_config("voodu-abc.invalid")).expect("json"));
    }

    #[test]
    fn the_table_is_deterministic_whatever_the_input_order() {
        let web = deployment(&["80"]);
        let a = ingress("s", "a", host("a.test"));
        let b = ingress("s", "b", host("b.test"));
        let deployments: [(&str, &str, &DeploymentSpec, &[&str]); 2] = [
            ("s", "a", &web, &["10.0.0.1"]),
            ("s", "b", &web, &["10.0.0.2"]),
        ];
        let one = table(&[a.clone(), b.clone()], &deployments);
        let two = table(&[b, a], &deployments);
        assert_eq!(one, two);
        assert_eq!(
            caddy_config(&one, "x.invalid").to_string(),
            caddy_config(&two, "x.invalid").to_string()
        );
    }
}
