//! The ingress proxy as a container (`--runtime docker`): Caddy with a boot config and
//! `--resume`, its admin API on a loopback port, its config pushed with `POST /load`.
//!
//! Invariants:
//! - the container is created from `proxy_spec` (its digest in `voodu.manifest_hash`); one
//!   that differs from it, or is not running, is replaced; its state dir (certificates,
//!   config) is bind-mounted and survives it;
//! - `--resume` reloads the last pushed config when Caddy itself restarts;
//! - a config is pushed when it differs from the last one pushed to this container instance
//!   (id and start time), and on each resync when Caddy's live config differs from it;
//! - the admin API is reached only through its published loopback port and with the agent's
//!   origin token;
//! - the proxy is on every source's network (its spec) and, from each pass on, on the own
//!   network of every branch preview an ingress routes to (joined, never made, here).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::{IngressOptions, PassError, ProxyInfo, ROLE, Served, container_name};
use crate::manifest::spec::sha256_hex;
use crate::reconcile::context::Ctx;
use crate::reconcile::router::routes::{
    self, ADMIN_PORT, HTTP_PORT, HTTPS_PORT, RouteTable, caddy_config,
};
use crate::reconcile::run::timer::{Timer, What};
use crate::runtime::{ContainerSpec, Inspection, PortMapping, Runtime, labels};

/// The boot config inside the container (in the bind-mounted config dir).
const BOOT_CONFIG: &str = "/config/voodu-boot.json";
/// How long one admin request may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a fresh Caddy gets to open its admin endpoint.
const ADMIN_STARTUP: Duration = Duration::from_secs(15);
/// How soon `POST /load` is tried again while a fresh Caddy opens its admin endpoint.
const ADMIN_RETRY: Duration = Duration::from_millis(200);

/// The proxy container this agent runs: Caddy with the boot config, `--resume` (the last
/// pushed config survives a Caddy restart), on the shared network, HTTP and HTTPS published
/// where the options say and the admin API on a loopback port the engine picks. `owner` is the
/// uid:gid that owns the state dir; a non-root owner runs Caddy as that user (allowed to bind
/// ports 80 and 443 inside its network namespace), so its files stay the agent's.
pub(crate) fn proxy_spec(
    options: &IngressOptions,
    agent_id: &str,
    owner: Option<(u32, u32)>,
    networks: Vec<String>,
) -> ContainerSpec {
    let publish = |address: &SocketAddr, container_port: u16| PortMapping {
        host_ip: address.ip().to_string(),
        host_port: Some(address.port()).filter(|port| *port != 0),
        container_port,
        protocol: "tcp".to_owned(),
    };
    let mut spec = ContainerSpec {
        name: container_name(agent_id),
        image: options.image.clone(),
        command: Some(
            ["/usr/bin/caddy", "run", "--config", BOOT_CONFIG, "--resume"]
                .map(str::to_owned)
                .to_vec(),
        ),
        env: vec![
            "XDG_DATA_HOME=/data".to_owned(),
            "XDG_CONFIG_HOME=/config".to_owned(),
        ],
        labels: BTreeMap::from([
            (labels::AGENT.to_owned(), agent_id.to_owned()),
            (labels::ROLE.to_owned(), ROLE.to_owned()),
            (
                labels::CREATED_BY.to_owned(),
                labels::CREATED_BY_VALUE.to_owned(),
            ),
        ]),
        ports: vec![
            publish(&options.http, HTTP_PORT),
            publish(&options.https, HTTPS_PORT),
            PortMapping {
                host_ip: "127.0.0.1".to_owned(),
                host_port: None,
                container_port: ADMIN_PORT,
                protocol: "tcp".to_owned(),
            },
        ],
        binds: vec![
            format!("{}:/data", options.state_dir.join("data").display()),
            format!("{}:/config", options.state_dir.join("config").display()),
        ],
        restart: "unless-stopped".to_owned(),
        // `voodu0` first, then every source's own network: the proxy reaches every replica.
        networks,
        ..ContainerSpec::default()
    };
    if let Some((uid, gid)) = owner.filter(|(uid, _)| *uid != 0) {
        spec.options.user = Some(format!("{uid}:{gid}"));
        spec.options.sysctls.insert(
            "net.ipv4.ip_unprivileged_port_start".to_owned(),
            "0".to_owned(),
        );
    }
    // What the container is made of, in a form that does not change with the agent's own
    // types: an agent upgrade alone never replaces the proxy.
    let ports: Vec<String> = spec
        .ports
        .iter()
        .map(|port| {
            format!(
                "{}:{:?}:{}/{}",
                port.host_ip, port.host_port, port.container_port, port.protocol
            )
        })
        .collect();
    let made_of = serde_json::json!({
        "image": spec.image,
        "command": spec.command,
        "env": spec.env,
        "ports": ports,
        "binds": spec.binds,
        "restart": spec.restart,
        "networks": spec.networks,
        "user": spec.options.user,
        "sysctls": spec.options.sysctls,
    });
    let digest = sha256_hex(made_of.to_string().as_bytes());
    spec.labels
        .insert(labels::MANIFEST_HASH.to_owned(), digest[..16].to_owned());
    spec
}

/// The config pushed to one container instance.
struct Pushed {
    container_id: String,
    started_at: String,
    config: Value,
}

/// The admin `Origin` host for this agent: secret, stable across restarts (derived from the
/// agent's key), and never a resolvable name.
fn admin_origin(key: &str) -> String {
    let digest = crate::reconcile::handlers::env::digest(
        key.as_bytes(),
        &["voodu-ingress-admin".to_owned()],
    );
    format!("voodu-{}.invalid", &digest[..24])
}

/// The container proxy's state between passes.
pub(super) struct ContainerProxy {
    options: IngressOptions,
    /// The `Origin` the admin API accepts (derived from the agent's key).
    origin: String,
    client: Option<reqwest::Client>,
    pushed: Option<Pushed>,
}

/// Removes this agent's proxy containers.
pub(super) async fn remove<R: Runtime>(runtime: &R, agent_id: &str) -> crate::runtime::Result<()> {
    for container in runtime
        .list(&[(labels::AGENT, agent_id), (labels::ROLE, ROLE)])
        .await?
    {
        tracing::info!(container = %container.name, "removing the ingress proxy");
        runtime.remove(&container.id).await?;
    }
    Ok(())
}

fn runtime_error(agent_id: &str, source: crate::runtime::Error) -> PassError {
    PassError::Runtime {
        name: container_name(agent_id),
        source,
    }
}

impl ContainerProxy {
    pub(super) fn new(options: IngressOptions, agent_key: &str) -> ContainerProxy {
        ContainerProxy {
            options,
            origin: admin_origin(agent_key),
            client: None,
            pushed: None,
        }
    }

    /// No ingress left: the container goes.
    pub(super) async fn remove_all<R: Runtime>(
        &mut self,
        ctx: &Ctx<R>,
    ) -> std::result::Result<(), PassError> {
        remove(ctx.runtime.as_ref(), &ctx.agent_id)
            .await
            .map_err(|source| runtime_error(&ctx.agent_id, source))?;
        self.pushed = None;
        Ok(())
    }

    /// Makes the container run and serve `table`; with `verify`, Caddy's live config is
    /// compared with it too.
    pub(super) async fn serve<R: Runtime>(
        &mut self,
        ctx: &Ctx<R>,
        table: &RouteTable,
        verify: bool,
    ) -> std::result::Result<Served, PassError> {
        let proxy = self.ensure_proxy(ctx).await?;
        self.join_preview_networks(ctx, &proxy, table).await?;
        let admin = proxy
            .published_tcp_port(ADMIN_PORT)
            .map(|port| format!("http://127.0.0.1:{}", port.host_port))
            .ok_or_else(|| PassError::Proxy {
                name: proxy.name.clone(),
                message: format!("its admin port {ADMIN_PORT} is not published"),
            })?;
        let config = caddy_config(table, &self.origin);
        let same_instance = self.pushed.as_ref().is_some_and(|pushed| {
            pushed.container_id == proxy.id && pushed.started_at == proxy.started_at
        });
        let mut push = !same_instance
            || self
                .pushed
                .as_ref()
                .is_none_or(|pushed| pushed.config != config);
        if !push && verify {
            push = self.live_config(&admin).await? != config;
            if push {
                tracing::warn!(container = %proxy.name, "the proxy's live config differs from the agent's: pushing it again");
            }
        }
        if push {
            self.load(&ctx.timer, &admin, &config).await?;
            tracing::info!(
                container = %proxy.name,
                ingresses = table.ingresses.len(),
                "ingress routes pushed to the proxy"
            );
            self.pushed = Some(Pushed {
                container_id: proxy.id.clone(),
                started_at: proxy.started_at.clone(),
                config,
            });
        }
        let address = |port: u16| {
            proxy
                .published_tcp_port(port)
                .map(|port| format!("{}:{}", port.host_ip, port.host_port))
        };
        Ok(Served {
            proxy: ProxyInfo {
                container: proxy.name.clone(),
                http: address(HTTP_PORT),
                https: address(HTTPS_PORT),
            },
            pushed: push,
            live: true,
        })
    }

    /// Makes the proxy container run as `proxy_spec` says; its inspection.
    async fn ensure_proxy<R: Runtime>(
        &mut self,
        ctx: &Ctx<R>,
    ) -> std::result::Result<Inspection, PassError> {
        let runtime = ctx.runtime.clone();
        let runtime_error = |source| runtime_error(&ctx.agent_id, source);
        let state_dir = self.options.state_dir.clone();
        let owner = {
            let state_dir = state_dir.clone();
            tokio::task::spawn_blocking(move || state_owner(&state_dir))
                .await
                .map_err(|error| PassError::Admin(format!("state dir task: {error}")))??
        };
        let spec = proxy_spec(
            &self.options,
            &ctx.agent_id,
            Some(owner),
            ctx.options.ownership.networks(),
        );
        let existing = runtime
            .list(&[(labels::AGENT, ctx.agent_id.as_str()), (labels::ROLE, ROLE)])
            .await
            .map_err(runtime_error)?;
        let mut current = None;
        for container in existing {
            let wanted = current.is_none()
                && container.name == spec.name
                && container.label(labels::MANIFEST_HASH)
                    == spec.labels.get(labels::MANIFEST_HASH).map(String::as_str)
                && container.state == crate::runtime::ContainerState::Running;
            if wanted {
                current = Some(container.id);
            } else {
                tracing::info!(container = %container.name, state = ?container.state, "replacing the ingress proxy (not running, or created from other options)");
                runtime.remove(&container.id).await.map_err(runtime_error)?;
            }
        }
        let id = match current {
            Some(id) => id,
            None => self.create_proxy(ctx, &spec).await?,
        };
        let inspection = runtime.inspect(&id).await.map_err(runtime_error)?;
        if !inspection.running {
            return Err(PassError::Proxy {
                name: spec.name.clone(),
                message: format!(
                    "not running (exit code {:?}); see `docker logs {}`",
                    inspection.exit_code, spec.name
                ),
            });
        }
        Ok(inspection)
    }

    /// Joins the proxy to the own network of each preview an ingress of `table` routes to
    /// (`Ownership::network_of`), which appear and go with the previews: the proxy's spec
    /// holds only the sources' networks. A removed preview's network is left as it goes
    /// (`Runtime::remove_network` disconnects the proxy first). Runs on every pass (each
    /// wake and resync).
    async fn join_preview_networks<R: Runtime>(
        &self,
        ctx: &Ctx<R>,
        proxy: &Inspection,
        table: &RouteTable,
    ) -> std::result::Result<(), PassError> {
        let wanted: std::collections::BTreeSet<String> = table
            .ingresses
            .iter()
            .map(|view| ctx.options.ownership.network_of(&view.key.scope))
            .filter(|network| crate::model::scopes::is_preview_network(network))
            .collect();
        for network in wanted {
            if proxy.ip_addresses.contains_key(&network) {
                continue;
            }
            // Never made here: the preview's first container makes it, its removal removes
            // it (a route left over from a removed preview must not bring it back).
            match ctx.runtime.connect_network(&proxy.id, &network).await {
                Ok(()) => {
                    tracing::info!(container = %proxy.name, %network, "ingress proxy joined a preview's network");
                }
                Err(crate::runtime::Error::NotFound { .. }) => {
                    tracing::debug!(%network, "a preview's network is not there (yet, or any more)");
                }
                Err(source) => return Err(runtime_error(&ctx.agent_id, source)),
            }
        }
        Ok(())
    }

    async fn create_proxy<R: Runtime>(
        &mut self,
        ctx: &Ctx<R>,
        spec: &ContainerSpec,
    ) -> std::result::Result<String, PassError> {
        let runtime = ctx.runtime.clone();
        let runtime_error = |source| runtime_error(&ctx.agent_id, source);
        {
            let state_dir = self.options.state_dir.clone();
            let boot = serde_json::to_vec_pretty(&routes::boot_config(&self.origin))
                .expect("a JSON value serialises");
            tokio::task::spawn_blocking(move || prepare_state_dir(&state_dir, &boot))
                .await
                .map_err(|error| PassError::Admin(format!("state dir task: {error}")))??;
        }
        for network in &spec.networks {
            runtime
                .ensure_network(network)
                .await
                .map_err(runtime_error)?;
        }
        let present = runtime
            .image_present(&spec.image)
            .await
            .map_err(runtime_error)?;
        if !present {
            tracing::info!(image = %spec.image, "pulling the ingress proxy image");
            runtime
                .pull(&spec.image, None)
                .await
                .map_err(runtime_error)?;
        }
        let id = runtime.create(spec).await.map_err(runtime_error)?;
        if let Err(source) = runtime.start(&id).await {
            let _ = runtime.remove(&id).await;
            return Err(runtime_error(source));
        }
        tracing::info!(container = %spec.name, image = %spec.image, "ingress proxy started");
        self.pushed = None;
        Ok(id)
    }

    fn client(&mut self) -> std::result::Result<reqwest::Client, PassError> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let tls = crate::model::tls::client_config().map_err(PassError::AdminTls)?;
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(ADMIN_TIMEOUT)
            .no_proxy()
            .build()
            .map_err(|error| PassError::Admin(format!("cannot build an HTTP client: {error}")))?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// `POST /load`, retried while a fresh Caddy is still opening its admin endpoint.
    async fn load(
        &mut self,
        timer: &Timer,
        admin: &str,
        config: &Value,
    ) -> std::result::Result<(), PassError> {
        let client = self.client()?;
        let body = serde_json::to_vec(config).expect("a JSON value serialises");
        let origin = format!("http://{}", self.origin);
        let started = tokio::time::Instant::now();
        loop {
            let sent = client
                .post(format!("{admin}/load"))
                .header(reqwest::header::ORIGIN, &origin)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(response) if response.status().is_success() => return Ok(()),
                Ok(response) => {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    return Err(PassError::Admin(format!(
                        "POST /load answered {status}: {}",
                        text.trim()
                    )));
                }
                Err(error) if started.elapsed() < ADMIN_STARTUP => {
                    tracing::debug!(%error, "caddy admin not answering yet");
                    timer.sleep(What::Router, ADMIN_RETRY).await;
                }
                Err(error) => {
                    return Err(PassError::Admin(format!("POST /load: {error}")));
                }
            }
        }
    }

    /// The config Caddy runs now (`GET /config/`).
    async fn live_config(&mut self, admin: &str) -> std::result::Result<Value, PassError> {
        let client = self.client()?;
        let response = client
            .get(format!("{admin}/config/"))
            .header(reqwest::header::ORIGIN, format!("http://{}", self.origin))
            .send()
            .await
            .map_err(|error| PassError::Admin(format!("GET /config/: {error}")))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|error| PassError::Admin(format!("GET /config/: {error}")))?;
        if !status.is_success() {
            return Err(PassError::Admin(format!(
                "GET /config/ answered {status}: {}",
                text.trim()
            )));
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// Creates the state dir and returns who owns it.
fn state_owner(state_dir: &Path) -> std::result::Result<(u32, u32), PassError> {
    use std::os::unix::fs::MetadataExt as _;
    let io = |source| PassError::Io {
        path: state_dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(state_dir).map_err(io)?;
    let metadata = std::fs::metadata(state_dir).map_err(io)?;
    Ok((metadata.uid(), metadata.gid()))
}

/// Writes the boot config and forgets Caddy's autosaved config: a new container starts from
/// the boot config, and the router pushes the routes right after.
fn prepare_state_dir(state_dir: &Path, boot: &[u8]) -> std::result::Result<(), PassError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| PassError::Io { path, source }
    };
    for dir in ["data", "config"] {
        let path = state_dir.join(dir);
        std::fs::create_dir_all(&path).map_err(io(&path))?;
    }
    let boot_path = state_dir.join("config").join("voodu-boot.json");
    std::fs::write(&boot_path, boot).map_err(io(&boot_path))?;
    let autosave = state_dir.join("config").join("caddy").join("autosave.json");
    match std::fs::remove_file(&autosave) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(io(&autosave)(error)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::manifest::spec::DEFAULT_NETWORK;

    #[test]
    fn the_proxy_spec_publishes_http_https_and_a_loopback_admin_port() {
        let mut options = IngressOptions::new(PathBuf::from("/var/lib/voodu/ingress"));
        options.image = "voodu-caddy:latest".to_owned();
        options.http = "127.0.0.1:0".parse().expect("address");
        let spec = proxy_spec(
            &options,
            "a1b2",
            Some((1000, 1000)),
            vec![DEFAULT_NETWORK.to_owned()],
        );
        assert_eq!(spec.name, "voodu-caddy-a1b2");
        let ports: Vec<String> = spec
            .ports
            .iter()
            .map(|port| {
                format!(
                    "{}:{}:{}/{}",
                    port.host_ip,
                    port.host_port
                        .map(|port| port.to_string())
                        .unwrap_or_default(),
                    port.container_port,
                    port.protocol
                )
            })
            .collect();
        assert_eq!(
            ports,
            [
                "127.0.0.1::80/tcp",
                "0.0.0.0:443:443/tcp",
                "127.0.0.1::2019/tcp"
            ]
        );
        assert_eq!(
            spec.binds,
            [
                "/var/lib/voodu/ingress/data:/data",
                "/var/lib/voodu/ingress/config:/config"
            ]
        );
        assert_eq!(
            spec.labels.get(labels::ROLE).map(String::as_str),
            Some("ingress")
        );
        assert_eq!(
            spec.labels.get(labels::AGENT).map(String::as_str),
            Some("a1b2")
        );
        assert_eq!(spec.options.user.as_deref(), Some("1000:1000"));
        assert_eq!(spec.networks, ["voodu0"]);
        // Root runs Caddy as root; the digest tells the two apart, and any option change.
        let as_root = proxy_spec(
            &options,
            "a1b2",
            Some((0, 0)),
            vec![DEFAULT_NETWORK.to_owned()],
        );
        assert_eq!(as_root.options.user, None);
        assert_ne!(
            as_root.labels.get(labels::MANIFEST_HASH),
            spec.labels.get(labels::MANIFEST_HASH)
        );
        let mut moved = options.clone();
        moved.https = "0.0.0.0:8443".parse().expect("address");
        assert_ne!(
            proxy_spec(
                &moved,
                "a1b2",
                Some((1000, 1000)),
                vec![DEFAULT_NETWORK.to_owned()]
            )
            .labels
            .get(labels::MANIFEST_HASH),
            spec.labels.get(labels::MANIFEST_HASH)
        );
        assert_eq!(
            proxy_spec(
                &options,
                "a1b2",
                Some((1000, 1000)),
                vec![DEFAULT_NETWORK.to_owned()]
            ),
            spec
        );
    }

    #[test]
    fn the_admin_origin_is_stable_per_key_and_secret() {
        assert_eq!(admin_origin("k1"), admin_origin("k1"));
        assert_ne!(admin_origin("k1"), admin_origin("k2"));
        assert!(admin_origin("k1").ends_with(".invalid"));
        assert!(!admin_origin("k1").contains("k1"));
    }
}
