//! `run` wiring: open the store, connect the runtime, and run the sync loop, its triggers
//! (poll ticks, the webhook, local ref changes), the reconciler, the ingress router and the
//! HTTP side until shutdown.
//!
//! The caller binds the HTTP listener and passes it with a shutdown future (mini-redis's
//! `server::run(listener, shutdown)`): a taken port is its error, and whoever bound the
//! listener knows the port.
//!
//! Invariants: every task is spawned on this module's `TaskTracker` and stops on its
//! `CancellationToken`, which the shutdown future cancels; `run` returns only after all of
//! them finished, the sync in flight included (it is asked to stop at its next safe point,
//! never dropped mid-flight). One agent per data dir
//! (`lock`), held from before state.db is opened until `run` returns; the agent never starts
//! with a new identity while an old one of its data dir remains (`identity`).

mod identity;
pub mod image_commit;
mod lock;
pub mod logs;
mod poll;
mod previews;
pub mod sources;
pub(crate) mod systemd;

pub(crate) use systemd::ServiceNotify;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::git::trigger::{self, SyncRequestReceiver};
use crate::git::{Source, SourceOptions};
use crate::http::{self, HttpCtx, HttpOptions};
use crate::metrics::Metrics;
use crate::model::HostSelection;
use crate::model::policy::{OwnedPaths, normalize_path};
use crate::reconcile::{self, ReconcileOptions};
use crate::runtime::{DockerRuntime, Guarded, Informer, Rules, Runtime};
use crate::store::{HEALTH_ENGINE, META_REPO_URL, Origin, SourceRecord, Store, Who};
use crate::sync::{self as sync_stage, SyncOptions, SyncOutcome, Syncer};

pub use sources::SourceConfig;

/// `meta` key under which the agent records the address its HTTP side listens on, so
/// `voodu-agent sync`, `rollback` and `unpin` find it (tests know it: they bound it).
pub const META_HTTP_ADDR: &str = "http_addr";
/// `meta` key of the webhook secret file's path (never the secret), for the same commands.
pub(crate) const META_SECRET_FILE: &str = "webhook_secret_file";
/// `meta` key of the branch the agent tracks, for `plan` (which triggers would fire).
pub(crate) const META_BRANCH: &str = "branch";

/// Everything `run` needs, validated.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub source: SourceOptions,
    /// Which host of a fleet this agent is: the manifests it applies (`model::hosts`).
    pub hosts: HostSelection,
    pub data_dir: PathBuf,
    /// Time between polls of the remote.
    pub interval: Duration,
    pub sync: SyncOptions,
    pub reconcile: ReconcileOptions,
    /// How the HTTP side serves, when `run` is given a listener.
    pub http: HttpConfig,
    /// Watch the refs of a local repository and sync as soon as they change.
    pub watch_local: bool,
    /// `--adopt`: take over the identity this data dir's leftover containers (or identity
    /// file) carry, when state.db was lost.
    pub adopt: bool,
    /// The service manager to tell when the agent is ready and when it stops (systemd's
    /// `NOTIFY_SOCKET`; the default tells nobody).
    pub service: ServiceNotify,
    /// `--notify FILE`: where events go (chat, webhooks, commit statuses); `None`: nowhere
    /// (they are still kept in the outbox).
    pub notify: Option<crate::notify::NotifyConfig>,
    /// `--image-signing-key FILE`: an SSH private key image automation signs its commits with
    /// (add its public key to the trusted signers for `--verify-commits`); `None`: unsigned.
    pub image_signing_key: Option<PathBuf>,
    /// `--sources FILE`: the repositories followed, each owning its scopes; empty: the one
    /// repository of `source`, owning every scope.
    pub sources: Vec<SourceConfig>,
    /// `--preview-*`: the single `--repo` source's branch previews.
    pub previews: Option<crate::model::previews::PreviewRules>,
}

/// How to serve HTTP on the listener `run` is given (the bound address is recorded in the
/// store).
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// Where the secret in `options` was read from, recorded for the local commands.
    pub secret_file: Option<PathBuf>,
    pub options: HttpOptions,
}

impl AgentConfig {
    pub fn state_db(&self) -> PathBuf {
        self.data_dir.join("state.db")
    }

    /// The sources this agent follows: those of `--sources`, or the single `--repo` source
    /// (`""`, owning every scope, polled every `interval`).
    pub fn source_configs(&self) -> Vec<SourceConfig> {
        if !self.sources.is_empty() {
            return self.sources.clone();
        }
        vec![SourceConfig {
            name: String::new(),
            options: self.source.clone(),
            interval: self.interval,
            scopes: vec![crate::model::scopes::ScopePattern::Any],
            secret: None,
            trust: None,
            shared_network: true,
            windows: Vec::new(),
            previews: self.previews.clone(),
        }]
    }
}

/// Where source `name`'s mirror lives: `<data-dir>/repo.git` for the single `--repo` source,
/// `<data-dir>/sources/NAME/repo.git` for a named one.
pub(crate) fn source_dir(data_dir: &Path, name: &str) -> PathBuf {
    if name.is_empty() {
        data_dir.to_owned()
    } else {
        data_dir.join("sources").join(name)
    }
}

/// Fails as `run` would when another agent holds `data_dir`'s lock. The CLI asks before it
/// binds the HTTP address, so a second agent on a data dir is told about the agent, not about
/// the port they share. The lock is released again: `run` takes it.
pub(crate) fn check_data_dir_free(data_dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create data dir {}", data_dir.display()))?;
    lock::lock(data_dir)?;
    Ok(())
}

/// Runs the agent against the local Docker engine, serving HTTP on `listener` (`None`: no
/// HTTP side), until `shutdown` completes; returns once every task has finished.
pub(crate) async fn run(
    config: AgentConfig,
    listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    finish_after(shutdown, |token| run_on_docker(config, listener, token)).await
}

/// Runs the agent with any runtime (tests pass the fake); see `run`.
pub async fn run_with_runtime<R: Runtime>(
    config: AgentConfig,
    runtime: Arc<R>,
    listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    finish_after(shutdown, |token| {
        run_until(config, runtime, listener, token)
    })
    .await
}

/// Drives the work `start` makes of a fresh cancellation token to its end; when `shutdown`
/// completes first, cancels that token (which the work watches) and still drives the work to
/// its end.
async fn finish_after<T, W: Future<Output = T>>(
    shutdown: impl Future<Output = ()>,
    start: impl FnOnce(CancellationToken) -> W,
) -> T {
    let token = CancellationToken::new();
    let work = start(token.clone());
    tokio::pin!(shutdown, work);
    tokio::select! {
        output = &mut work => return output,
        () = &mut shutdown => token.cancel(),
    }
    work.await
}

/// Waits for the Docker engine, then runs the agent on it until `shutdown` is cancelled.
async fn run_on_docker(
    config: AgentConfig,
    listener: Option<TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // An engine that is not there yet (dockerd starting, a wrong DOCKER_HOST) is waited for,
    // and recorded, so `status` says "engine unreachable" with the cause instead of nothing.
    // The data dir's lock is held while waiting: one agent per data dir, waiting or not.
    let runtime = {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
        let _lock = lock::lock(&config.data_dir)?;
        loop {
            match DockerRuntime::connect().await {
                Ok(runtime) => break runtime,
                Err(error) => {
                    let message =
                        format!("{error} (is dockerd running, and may this user use its socket?)");
                    config
                        .service
                        .status(&format!("waiting for the Docker engine: {message}"));
                    tracing::warn!(error = %message, "cannot reach the Docker engine; retrying in {}", humantime::format_duration(ENGINE_PROBE_INTERVAL));
                    // Making state.db here hides no lost identity: once the engine answers,
                    // `open_state` still finds this data dir's containers (or its identity
                    // file) under another id and refuses.
                    let db = config.state_db();
                    tokio::task::spawn_blocking(move || {
                        Store::open(&db)?.record_health(HEALTH_ENGINE, Err(&message))?;
                        anyhow::Ok(())
                    })
                    .await?
                    .context("cannot record that the engine is unreachable")?;
                    tokio::select! {
                        () = tokio::time::sleep(ENGINE_PROBE_INTERVAL) => {}
                        () = shutdown.cancelled() => return Ok(()),
                    }
                }
            }
        }
        // The lock is released here and taken again by `run_until`.
    };
    let marker = identity::marker(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let runtime = runtime.with_labels(std::collections::BTreeMap::from([(
        crate::runtime::labels::DATA_DIR.to_owned(),
        marker,
    )]));
    run_until(config, Arc::new(runtime), listener, shutdown).await
}

/// `--runtime swarm` needs a Swarm manager's engine: services are created on managers.
async fn check_swarm_manager<R: Runtime>(runtime: &R) -> anyhow::Result<()> {
    match runtime.swarm_node().await {
        Ok(Some(node)) if node.manager => {
            tracing::info!(node = %node.node_id, "running workloads as Docker Swarm services");
            Ok(())
        }
        Ok(Some(_)) => anyhow::bail!(
            "--runtime swarm: this engine is a Swarm worker; run the agent against a manager's engine (DOCKER_HOST)"
        ),
        Ok(None) => anyhow::bail!(
            "--runtime swarm: this engine is in no swarm; run `docker swarm init` (or join a swarm as a manager) first"
        ),
        Err(error) => {
            anyhow::bail!("--runtime swarm: cannot ask the engine about its swarm: {error}")
        }
    }
}

/// How often the engine is probed while the agent runs (and how long `run` waits between
/// attempts to connect to it).
const ENGINE_PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// A label no container carries: listing by it is the cheapest round trip to the engine.
const ENGINE_PROBE_FILTER: (&str, &str) = ("label", "voodu.engine-probe=none");

/// Probes the engine every `ENGINE_PROBE_INTERVAL` and records whether it answered, so status
/// tells "engine unreachable since T: cause" apart from a rollout waiting for replicas.
async fn engine_probe<R: Runtime>(runtime: Arc<R>, store: Arc<Store>, shutdown: CancellationToken) {
    loop {
        let outcome = runtime
            .list(&[ENGINE_PROBE_FILTER])
            .await
            .map_err(|error| error.to_string());
        if let Err(error) = &outcome {
            tracing::warn!(%error, "the Docker engine does not answer");
        }
        let store = store.clone();
        let recorded = tokio::task::spawn_blocking(move || {
            store.record_health(
                HEALTH_ENGINE,
                outcome.as_ref().map(|_| ()).map_err(String::as_str),
            )
        })
        .await;
        if let Ok(Err(error)) = recorded {
            tracing::warn!(%error, "cannot record the engine probe");
        }
        tokio::select! {
            () = tokio::time::sleep(ENGINE_PROBE_INTERVAL) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// State.db, opened, and whether the reconciler must wait for a first applied commit.
struct OpenState {
    store: Arc<Store>,
    /// Containers of this identity exist but no commit was ever applied (an adoption): the
    /// reconciler's boot pass would take them for resources deleted from the repo.
    await_first_commit: bool,
}

/// Opens state.db under the data dir's lock, after checking that this data dir has not lost
/// an identity (`identity::decide`), and adopts one when asked to.
async fn open_state<R: Runtime>(config: &AgentConfig, runtime: &R) -> anyhow::Result<OpenState> {
    let db = config.state_db();
    let existing = if db.exists() || wal_of(&db).exists() {
        let db = db.clone();
        Some(tokio::task::spawn_blocking(move || Store::open(&db)).await??)
    } else {
        None
    };
    let own = existing.as_ref().map(Store::agent_id).transpose()?;
    let file = identity::read_file(&config.data_dir).with_context(|| {
        format!(
            "cannot read {}",
            config.data_dir.join(identity::IDENTITY_FILE).display()
        )
    })?;
    let marker = identity::marker(&config.data_dir)?;
    let found = identity::scan(runtime, &marker)
        .await
        .context("cannot list this data dir's containers and volumes on the engine")?;
    let decision = identity::decide(&identity::Situation {
        data_dir: &config.data_dir,
        own: own.as_deref(),
        file: file.as_ref(),
        found: &found,
        adopt: config.adopt,
    })
    .map_err(anyhow::Error::msg)?;
    if existing.is_none() {
        let leftovers: Vec<String> = std::fs::read_dir(&config.data_dir)?
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name != lock::LOCK_FILE && !name.starts_with("state.db"))
            .collect();
        if !leftovers.is_empty() && decision == identity::Decision::Proceed {
            tracing::warn!(
                ?leftovers,
                "no state.db in a used data dir, and no container of it on this engine: starting with a new identity (config buckets and release history start empty)"
            );
        }
    }
    let store = match existing {
        Some(store) => store,
        None => tokio::task::spawn_blocking(move || Store::open(&db)).await??,
    };
    if let identity::Decision::Adopt { agent_id, env_key } = &decision {
        store.adopt_identity(agent_id, env_key.as_deref())?;
        tracing::warn!(
            agent_id,
            digest_key = if env_key.is_some() {
                "restored"
            } else {
                "new: replicas with environment are replaced one slot at a time"
            },
            "--adopt: this agent takes over the identity of this data dir's containers; config buckets and release history start empty"
        );
    }
    let agent_id = store.agent_id()?;
    let await_first_commit = found.contains_key(&agent_id) && !store.any_commit_applied()?;
    identity::write_file(
        &config.data_dir,
        &identity::IdentityFile {
            agent_id,
            env_key: Some(store.env_key()?),
        },
    )
    .with_context(|| {
        format!(
            "cannot write {}",
            config.data_dir.join(identity::IDENTITY_FILE).display()
        )
    })?;
    Ok(OpenState {
        store: Arc::new(store),
        await_first_commit,
    })
}

/// Syncs every source until a commit is applied (or shutdown), before the reconciler
/// starts; see `OpenState::await_first_commit`. False when shutdown came first.
async fn first_commit(
    syncers: &[(&SourceConfig, Arc<Syncer>)],
    store: &Arc<Store>,
    interval: Duration,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    tracing::info!(
        "this identity's containers exist but no commit was applied yet: reconciling starts once the repo's commit is applied (they are kept meanwhile)"
    );
    let interrupt = Arc::new(AtomicBool::new(false));
    loop {
        for (source, syncer) in syncers {
            let syncer_for_task = syncer.clone();
            let interrupt_for_task = interrupt.clone();
            let outcome =
                tokio::task::spawn_blocking(move || syncer_for_task.sync_once(&interrupt_for_task))
                    .await?;
            match outcome {
                Ok(SyncOutcome::Applied { commit, .. }) => {
                    tracing::info!(source = %source.name, commit = commit.short(), "first commit applied");
                }
                Ok(SyncOutcome::Rejected {
                    commit,
                    diagnostics,
                }) => tracing::error!(
                    source = %source.name,
                    commit = commit.short(),
                    "commit rejected; waiting for a good commit before reconciling:\n{diagnostics}"
                ),
                Ok(SyncOutcome::Unchanged(_)) => {}
                Ok(SyncOutcome::Held { commit, why, .. }) => {
                    tracing::info!(source = %source.name, commit = commit.short(), "commit held: {why}");
                }
                Err(error) => {
                    tracing::warn!(source = %source.name, %error, "sync failed; next try in {}", humantime::format_duration(interval))
                }
            }
        }
        let store_for_check = store.clone();
        let applied =
            tokio::task::spawn_blocking(move || store_for_check.any_commit_applied()).await??;
        if applied {
            return Ok(true);
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shutdown.cancelled() => return Ok(false),
        }
    }
}

/// A data dir made with `--repo` started with `--sources`: the single source's history
/// (commits, resources, triggers, fetch state, mirror) becomes the source whose URL is the
/// one `--repo` followed, or else the one source that owns every scope of its resources.
/// Nothing is redeployed: desired rows keep their specs, only their source changes.
fn adopt_single_source(
    store: &Store,
    data_dir: &Path,
    sources: &[SourceConfig],
) -> anyhow::Result<()> {
    if !store.has_source_history("")? {
        return Ok(());
    }
    let recorded = store.meta(META_REPO_URL)?;
    let by_url = recorded.as_deref().and_then(|url| {
        let url = crate::git::repo_identity(url);
        sources
            .iter()
            .find(|source| crate::git::repo_identity(&source.options.url) == url)
    });
    let by_scopes = || {
        let ownership = sources::ownership(sources).ok()?;
        let scopes = store.scopes_of_source("").ok()?;
        let mut owners = scopes.iter().map(|scope| ownership.owner_of(scope));
        let first = owners.next()??;
        owners
            .all(|owner| owner == Some(first))
            .then(|| sources.iter().find(|source| source.name == first))
            .flatten()
    };
    let Some(heir) = by_url.or_else(by_scopes) else {
        tracing::warn!(
            repo = recorded.as_deref().unwrap_or("(not recorded)"),
            "this data dir was run with --repo, and no source of --sources follows that repository: its resources stay until a source declares them"
        );
        return Ok(());
    };
    store.adopt_source_history("", &heir.name)?;
    let mirror = data_dir.join("repo.git");
    let target = source_dir(data_dir, &heir.name);
    if mirror.exists() && !target.join("repo.git").exists() {
        std::fs::create_dir_all(&target)?;
        std::fs::rename(&mirror, target.join("repo.git"))?;
    }
    tracing::info!(source = %heir.name, "the single repository's history of this data dir is now this source's (nothing is redeployed)");
    Ok(())
}

fn wal_of(db: &std::path::Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// The rules every request of this agent passes: its host policy, with its data dir
/// protected, and the paths the agent itself mounts (asset files, the ingress's directories).
fn sink_rules(config: &AgentConfig) -> Rules {
    let (policy, owned) = sink_paths(config);
    Rules::new(policy, owned)
}

/// The host policy the sink judges with (its data dir protected) and the paths the agent
/// itself mounts: the runtime's guard and the backups' restic judge host paths with them.
fn sink_paths(config: &AgentConfig) -> (crate::model::policy::Policy, OwnedPaths) {
    let absolute = |path: &std::path::Path| {
        std::path::absolute(path)
            .unwrap_or_else(|_| path.to_owned())
            .display()
            .to_string()
    };
    let data_dir = absolute(&config.data_dir);
    let mut policy = config.sync.policy.clone();
    if policy.data_dir.is_none() {
        policy.data_dir = Some(data_dir.clone());
    }
    let mut owned = OwnedPaths::for_data_dir(&data_dir);
    if let Some(ingress) = &config.reconcile.ingress {
        owned.exact.extend(
            ["data", "config"]
                .iter()
                .filter_map(|dir| normalize_path(&absolute(&ingress.state_dir.join(dir)))),
        );
    }
    (policy, owned)
}

/// The agent on `runtime` until `shutdown` is cancelled.
async fn run_until<R: Runtime>(
    config: AgentConfig,
    runtime: Arc<R>,
    listener: Option<TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    if let Some(listener) = &listener {
        let address = listener.local_addr()?;
        if config.http.options.secret.is_none() && !http::may_listen_without_secret(&address) {
            return Err(http::Error::InsecureListen { address }.into());
        }
    }
    // Held until `run_until` returns.
    let _lock = lock::lock(&config.data_dir)?;
    let sources = config.source_configs();
    let ownership = Arc::new(sources::ownership(&sources).map_err(anyhow::Error::msg)?);
    // The keys of `--require-signature`, read once: a key file that cannot be read stops the
    // start, never a silent unsigned deploy.
    let signatures = Arc::new(
        crate::assets::cosign::Signatures::load(&config.sync.policy).map_err(anyhow::Error::msg)?,
    );
    let (runtime, store, await_first_commit, agent_id) =
        open_engine_and_state(&config, runtime, &ownership, &signatures).await?;
    record_sources(&config, &store, &sources)?;
    let syncers = syncers(
        &config,
        &store,
        &sources,
        &ownership,
        listener.as_ref(),
        &agent_id,
    )?;
    if await_first_commit && !first_commit(&syncers, &store, config.interval, &shutdown).await? {
        return Ok(());
    }
    let metrics = Arc::new(Metrics::new());
    if let Some(listener) = &listener {
        announce_http(&config, &store, listener).await?;
    }
    let serving_http = listener.is_some();
    let tracker = TaskTracker::new();
    log_ingress(&config);
    start_notifications(&config, &store, &tracker, &shutdown)?;
    tracker.spawn(engine_probe(
        runtime.clone(),
        store.clone(),
        shutdown.clone(),
    ));
    // Each source's sync channel, made before the reconciler so image automation's commits can
    // ask the source they pushed to for a fetch.
    let (channels, sync_requests) = sync_channels(&syncers);
    // `POST /hooks/registry` → the image scanner, at once.
    let registry_pushes = reconcile::wake::RegistryPushes::default();
    let log_source: Arc<dyn http::logs::LogSource> = Arc::new(logs::Follower::new(
        runtime.clone(),
        store.clone(),
        agent_id.clone(),
        Arc::clone(&config.sync.keyring),
    ));
    let mut preview_wakes = previews::spawn(
        &syncers,
        (&config.data_dir, &config.hosts),
        (&ownership, &runtime),
        &tracker,
        &shutdown,
    );
    let deps = reconcile_deps(
        &config,
        &sources,
        (&store, runtime, &metrics),
        &tracker,
        &sync_requests,
        &registry_pushes,
    );
    let reconcile_options = reconcile_options(&config, listener.as_ref(), &ownership, &signatures)?;
    let reconciler = tracker.spawn(reconcile::run(deps, reconcile_options, shutdown.clone()));
    // Kept until `run` returns: dropping a local watch stops it.
    let (mut hook_sources, _local_watches) =
        spawn_sources(&config, syncers, channels, &metrics, &tracker, &shutdown);
    for source in &mut hook_sources {
        source.previews = preview_wakes.remove(&source.name);
    }
    if let Some(listener) = listener {
        let http_ctx = HttpCtx {
            store: store.clone(),
            sources: hook_sources,
            metrics,
            options: config.http.options.clone(),
            on_registry_push: Some(Arc::new(move |repository: &str| {
                registry_pushes.push(repository);
            })),
            logs: Some(log_source),
        };
        spawn_http(&tracker, listener, http_ctx, &shutdown);
    }
    tracker.close();
    until_shutdown(
        &config,
        &sources,
        &store,
        reconciler,
        &tracker,
        &shutdown,
        serving_http,
    )
    .await
}

/// Each source with branch previews, with its previews' policy and caps (`Rules::with_previews`).
fn preview_policies(
    config: &AgentConfig,
) -> Vec<(
    String,
    Option<crate::model::policy::Policy>,
    crate::model::policy::Caps,
)> {
    config
        .source_configs()
        .into_iter()
        .filter_map(|source| {
            let rules = source.previews?;
            Some((source.name, rules.policy, rules.caps))
        })
        .collect()
}

/// The engine behind the host policy's rules, the data dir's state opened (its identity
/// decided), and the agent's own containers held in memory; with whether to await the first
/// commit and the agent id.
async fn open_engine_and_state<R: Runtime>(
    config: &AgentConfig,
    runtime: Arc<R>,
    ownership: &Arc<crate::model::scopes::Ownership>,
    signatures: &crate::assets::cosign::Signatures,
) -> anyhow::Result<(Arc<Informer<Guarded<R>>>, Arc<Store>, bool, String)> {
    // From here on every engine request passes the host policy's rules at the sink, which
    // also seals the sources from each other and lets signed-only images through by a
    // verified digest alone.
    let runtime = Arc::new(Guarded::new(
        runtime,
        sink_rules(config)
            .sealing(Arc::clone(ownership))
            .with_previews(preview_policies(config))
            .requiring_signatures(signatures.fingerprints()),
    ));
    let OpenState {
        store,
        await_first_commit,
    } = open_state(config, runtime.as_ref()).await?;
    runtime.set_ledger(store.clone());
    let agent_id = store.agent_id()?;
    if config.reconcile.engine == reconcile::Engine::Swarm {
        check_swarm_manager(runtime.as_ref()).await?;
    }
    // The agent's own containers held in memory from here on, kept current by their events
    // (with those off, every list goes to the engine).
    let runtime = Arc::new(Informer::new(
        runtime,
        &agent_id,
        config.reconcile.container_events,
    ));
    store.set_meta(
        crate::store::META_RUNTIME,
        Some(match config.reconcile.engine {
            reconcile::Engine::Docker => "docker",
            reconcile::Engine::Swarm => "swarm",
        }),
    )?;
    Ok((runtime, store, await_first_commit, agent_id))
}

/// What the reconciler works with: the store, the engine, the metrics, the assets directory,
/// the task tracker, and the handles of image automation's commits and registry pushes.
fn reconcile_deps<R: Runtime>(
    config: &AgentConfig,
    sources: &[SourceConfig],
    (store, runtime, metrics): (&Arc<Store>, Arc<R>, &Arc<Metrics>),
    tracker: &TaskTracker,
    sync_requests: &std::collections::BTreeMap<String, trigger::SyncRequests>,
    registry_pushes: &reconcile::wake::RegistryPushes,
) -> reconcile::Deps<R> {
    reconcile::Deps {
        store: store.clone(),
        runtime,
        metrics: metrics.clone(),
        // Absolute: asset files are bind sources, and Docker takes a relative source for a
        // volume's name (the rules' own paths are absolute too).
        assets_root: {
            let root = crate::assets::assets_root(&config.data_dir);
            std::path::absolute(&root).unwrap_or(root)
        },
        tracker: tracker.clone(),
        handles: reconcile::Handles {
            image_committer: reconcile::ImageCommitterHandle(Some(std::sync::Arc::new(
                image_commit::GitCommitter::new(config, sources, sync_requests),
            ))),
            registry_pushes: registry_pushes.clone(),
            ..reconcile::Handles::default()
        },
    }
}

/// Checks the notify file's commit status sinks against the sources, and records the sources
/// in the store: the single repository's history handed to its source, claims of a data dir
/// from before claims adopted, resources of sources no longer followed reported.
fn record_sources(
    config: &AgentConfig,
    store: &Store,
    sources: &[SourceConfig],
) -> anyhow::Result<()> {
    if let Some(notify) = &config.notify {
        let names: Vec<String> = sources.iter().map(|source| source.name.clone()).collect();
        notify
            .check_sources(&names)
            .map_err(|error| anyhow::anyhow!("--notify: {error}"))?;
    }
    if !config.sources.is_empty() {
        adopt_single_source(store, &config.data_dir, sources)?;
    }
    // A data dir from before claims: what its desired state holds (hosts, ports, volumes)
    // becomes its declaring source's, oldest declaration first.
    let adopted = store.adopt_claims()?;
    if adopted > 0 {
        tracing::info!(
            claims = adopted,
            "hosts, ports and volumes of the desired state recorded as their sources' own"
        );
    }
    store.record_sources(
        &sources
            .iter()
            .map(|source| SourceRecord {
                name: source.name.clone(),
                url: source.options.url.clone(),
                branch: source.options.branch.clone(),
                scopes: source.scopes.iter().map(ToString::to_string).collect(),
            })
            .collect::<Vec<_>>(),
    )?;
    for (orphan, count) in store.resources_by_source()? {
        if !sources.iter().any(|source| source.name == orphan)
            && crate::model::previews::split_source(&orphan).is_none()
        {
            tracing::warn!(
                source = %orphan,
                resources = count,
                "a source no longer followed applied these resources: they keep running, unmanaged by any commit, until its name is back in the sources (or they are removed by hand)"
            );
        }
    }
    if config.sources.is_empty() {
        store.set_meta(META_REPO_URL, Some(&config.source.url))?;
    }
    Ok(())
}

/// One syncer per source, each with its own store view, seal and options.
fn syncers<'a>(
    config: &AgentConfig,
    store: &Store,
    sources: &'a [SourceConfig],
    ownership: &Arc<crate::model::scopes::Ownership>,
    listener: Option<&TcpListener>,
    agent_id: &str,
) -> anyhow::Result<Vec<(&'a SourceConfig, Arc<Syncer>)>> {
    let mut syncers = Vec::new();
    for source_config in sources {
        let mut source_options = source_config.options.clone();
        source_options.max_file_bytes = config.sync.max_file_bytes;
        let source = Source::new(
            source_options,
            &source_dir(&config.data_dir, &source_config.name),
        )
        .selecting(config.hosts.clone());
        tracing::info!(
            source = %source_config.name,
            repo = source.url(),
            branch = source.branch(),
            host = config.hosts.host.as_deref().unwrap_or("(every host)"),
            data_dir = %config.data_dir.display(),
            agent_id,
            "voodu-agent starting"
        );
        let source_store = Arc::new(store.for_source(&source_config.name));
        source_store.set_meta(&source_store.source_key(META_BRANCH), Some(source.branch()))?;
        let mut sync_options = config.sync.clone();
        sync_options.ownership = ownership.clone();
        sync_options.policy.seal = Some(crate::model::scopes::Seal::new(
            &source_config.name,
            ownership.clone(),
        ));
        if let Some(trust) = &source_config.trust {
            sync_options.trust = Some(trust.clone());
        }
        // `--window` is the single `--repo` source's; a source of `--sources` has its blocks.
        if !config.sources.is_empty() {
            sync_options.windows = source_config.windows.clone();
        }
        if let Some(listener) = listener {
            // `url()` may not fetch from the agent's own HTTP side.
            sync_options.own_address = Some(listener.local_addr()?);
        }
        syncers.push((
            source_config,
            Arc::new(Syncer::new(source, source_store, sync_options)?),
        ));
    }
    Ok(syncers)
}

/// Records where the HTTP side listens and its secret file (for `status`), and says so.
async fn announce_http(
    config: &AgentConfig,
    store: &Arc<Store>,
    listener: &TcpListener,
) -> anyhow::Result<()> {
    let address = listener.local_addr()?;
    let secret_file = config
        .http
        .secret_file
        .as_ref()
        .map(|path| path.display().to_string());
    let store_for_meta = store.clone();
    tokio::task::spawn_blocking(move || {
        store_for_meta.set_meta(META_HTTP_ADDR, Some(&address.to_string()))?;
        store_for_meta.set_meta(META_SECRET_FILE, secret_file.as_deref())
    })
    .await??;
    tracing::info!(%address, "http listening (POST /hooks/git, GET /status /releases /metrics /healthz)");
    Ok(())
}

/// Says how the ingress proxy runs, when there is one.
fn log_ingress(config: &AgentConfig) {
    if let Some(ingress) = &config.reconcile.ingress {
        let proxy = match config.reconcile.engine {
            crate::reconcile::Engine::Docker => {
                "ingress proxy on (Caddy, one container per agent while any ingress exists)"
            }
            crate::reconcile::Engine::Swarm => {
                "ingress proxy on (Caddy, a global Swarm service publishing host ports on every node while any ingress exists)"
            }
        };
        tracing::info!(
            image = %ingress.image,
            http = %ingress.http,
            https = %ingress.https,
            "{proxy}"
        );
    }
}

/// Forgets the sinks no longer configured and starts the notification tasks, if any.
fn start_notifications(
    config: &AgentConfig,
    store: &Arc<Store>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    // Sinks no longer in the notify file (or with no file) are forgotten: `status` shows the
    // sinks this run has.
    let sinks: Vec<String> = config
        .notify
        .iter()
        .flat_map(|notify| notify.sinks.iter().map(|sink| sink.name.clone()))
        .collect();
    store.keep_sinks(&sinks)?;
    if let Some(notify) = config.notify.clone() {
        // A sink configured for the first time starts with the events of this run: read
        // before anything of this run can write one.
        let start = store.outbox_head()?;
        tracing::info!(sinks = notify.sinks.len(), "notifications on");
        tracker.spawn(crate::notify::run(
            store.clone(),
            notify,
            start,
            shutdown.clone(),
        ));
    }
    Ok(())
}

/// Per source: its sync loop, its poll (`poll`: swept with the other local repositories, or
/// its own for a remote) and (for a local repository) its ref watch, on `tracker`; returns
/// the webhook's view of the sources and the watches, which stop when dropped.
fn spawn_sources(
    config: &AgentConfig,
    syncers: Vec<(&SourceConfig, Arc<Syncer>)>,
    channels: Vec<(trigger::SyncRequests, SyncRequestReceiver)>,
    metrics: &Arc<Metrics>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> (Vec<http::HookSource>, Vec<trigger::LocalWatch>) {
    let mut hook_sources = Vec::new();
    let mut local_watches = Vec::new();
    let mut polled = Vec::new();
    let slots = sync_slots();
    for ((source_config, syncer), (requests, receiver)) in syncers.into_iter().zip(channels) {
        let syncer_for_poll = syncer.clone();
        let source_store = syncer.store().clone();
        let store_for_sync = source_store.clone();
        let local_git_dir = trigger::local_git_dir(syncer.source().url());
        let local = local_git_dir.is_some();
        let local_git_dir = local_git_dir.filter(|_| config.watch_local);
        hook_sources.push(http::HookSource {
            name: source_config.name.clone(),
            url: crate::git::repo_identity(syncer.source().url()),
            branch: syncer.source().branch().to_owned(),
            requests: requests.clone(),
            store: source_store,
            secret: source_config.secret.clone(),
            previews: None,
        });
        tracker.spawn(sync_loop(
            move |interrupt: &AtomicBool, who: &Who| {
                if let Err(error) = store_for_sync.notice_external_writes() {
                    tracing::warn!(%error, "cannot check the journal for rollbacks");
                }
                syncer.sync_once_as(interrupt, who)
            },
            receiver,
            metrics.clone(),
            (source_config.name.clone(), source_config.interval),
            (requests.clone(), slots.clone()),
            shutdown.clone(),
        ));
        polled.push(poll::Polled {
            syncer: syncer_for_poll,
            requests: requests.clone(),
            interval: source_config.interval,
            local,
        });
        if let Some(git_dir) = local_git_dir {
            match trigger::watch_local_repo(&git_dir, requests.clone()) {
                Ok(watch) => {
                    tracing::info!(source = %source_config.name, git_dir = %watch.git_dir().display(), "watching the local repository's refs");
                    local_watches.push(watch);
                }
                Err(error) => {
                    tracing::warn!(%error, git_dir = %git_dir.display(), "cannot watch the local repository; polling only");
                }
            }
        }
    }
    poll::spawn(polled, metrics, tracker, shutdown);
    (hook_sources, local_watches)
}

/// Each source's sync channel, and its sender by source name.
fn sync_channels(
    syncers: &[(&SourceConfig, Arc<Syncer>)],
) -> (
    Vec<(trigger::SyncRequests, SyncRequestReceiver)>,
    std::collections::BTreeMap<String, trigger::SyncRequests>,
) {
    let mut channels = Vec::new();
    let mut sync_requests = std::collections::BTreeMap::new();
    for (source_config, _) in syncers {
        let (requests, receiver) = trigger::channel();
        sync_requests.insert(source_config.name.clone(), requests.clone());
        channels.push((requests, receiver));
    }
    (channels, sync_requests)
}

/// The reconciler's options: the configured ones, with the outbound rules of registry scans and
/// webhooks (never the agent's own HTTP side), the sources' ownership and the signature keys.
fn reconcile_options(
    config: &AgentConfig,
    listener: Option<&TcpListener>,
    ownership: &Arc<crate::model::scopes::Ownership>,
    signatures: &Arc<crate::assets::cosign::Signatures>,
) -> anyhow::Result<ReconcileOptions> {
    let mut reconcile_options = config.reconcile.clone();
    // Registry scans connect where `url()` may (`--allow-url-host`), never to the agent's own
    // HTTP side.
    reconcile_options.registry_access = crate::assets::registry::RegistryAccess::new(
        &config.sync.policy.allow_url_host,
        listener.map(TcpListener::local_addr).transpose()?,
    )
    .map_err(anyhow::Error::msg)?;
    // `on_deploy` webhooks likewise.
    reconcile_options.webhooks = crate::assets::url_guard::Outbound::new(
        &config.sync.policy.allow_url_host,
        listener.map(TcpListener::local_addr).transpose()?,
    )
    .map_err(anyhow::Error::msg)?;
    reconcile_options.ownership = ownership.clone();
    reconcile_options.signatures = signatures.clone();
    reconcile_options.host_paths = Some(sink_paths(config));
    Ok(reconcile_options)
}

/// The HTTP server on `tracker` until `shutdown`.
fn spawn_http(
    tracker: &TaskTracker,
    listener: TcpListener,
    http_ctx: HttpCtx,
    shutdown: &CancellationToken,
) {
    let shutdown_for_http = shutdown.clone();
    tracker.spawn(async move {
        if let Err(error) = http::serve(listener, http_ctx, shutdown_for_http).await {
            tracing::error!(%error, "http server stopped");
        }
    });
}

/// Says the agent is ready, waits for `shutdown` (or the reconciler's early end, which stops
/// everything), then for every task on `tracker` to finish.
async fn until_shutdown(
    config: &AgentConfig,
    sources: &[SourceConfig],
    store: &Arc<Store>,
    reconciler: tokio::task::JoinHandle<crate::reconcile::Result<()>>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
    serving_http: bool,
) -> anyhow::Result<()> {
    let watching: Vec<String> = sources
        .iter()
        .map(|source| format!("{} ({})", source.options.url, source.options.branch))
        .collect();
    config.service.ready(&format!(
        "watching {}{}",
        watching.join(", "),
        if serving_http { "; serving HTTP" } else { "" }
    ));
    tokio::select! {
        () = shutdown.cancelled() => {}
        finished = reconciler => {
            // The reconciler only ends early on a store failure: stop everything.
            shutdown.cancel();
            finished.context("reconciler task")?.context("reconciler stopped")?;
        }
    }
    tracing::info!("shutting down: letting in-flight work finish");
    config.service.stopping();
    tracker.wait().await;
    if serving_http {
        let store_for_meta = store.clone();
        let _ = tokio::task::spawn_blocking(move || store_for_meta.set_meta(META_HTTP_ADDR, None))
            .await;
    }
    Ok(())
}

/// How many syncs of the sources run at once before another waits for one to end
/// (`sync_loop`): a blocking thread each, and threads of the blocking pool that a burst started
/// stay (each takes its turn at the next tasks before its idle time runs out), so an agent
/// following 100 sources would keep 100 of them. Enough for the cores.
const SYNC_SLOTS: usize = 4;
/// The longest a sync waits for a slot before it runs beside the others: a slow remote (a
/// fetch taking its timeouts) holds the other sources up this long at most.
const SLOT_WAIT: Duration = Duration::from_secs(5);

/// The slots the sync loops of one agent share (`SYNC_SLOTS`).
fn sync_slots() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(SYNC_SLOTS))
}

/// Runs one `sync` per request from the trigger channel until shutdown. Each runs on a
/// blocking thread with an interrupt flag, in one of the agent's `slots` once one is free
/// (`SLOT_WAIT` at most). On shutdown the flag is set (the sync stops at its
/// next safe point) and the sync in flight is still awaited and reported before the loop
/// returns: dropping it mid-flight (issue 11 bug 4) let `run` return while it still wrote.
async fn sync_loop<S>(
    sync: S,
    mut receiver: SyncRequestReceiver,
    metrics: Arc<Metrics>,
    (source, interval): (String, Duration),
    (requests, slots): (trigger::SyncRequests, Arc<tokio::sync::Semaphore>),
    shutdown: CancellationToken,
) where
    S: Fn(&AtomicBool, &Who) -> Result<SyncOutcome, sync_stage::Error> + Send + Sync + 'static,
{
    let sync = Arc::new(sync);
    let interrupt = Arc::new(AtomicBool::new(false));
    // When the held commit may apply (Unix seconds): a sync is asked for then.
    let mut wake_at: Option<i64> = None;
    loop {
        let generation = tokio::select! {
            generation = receiver.next() => generation,
            () = wake(wake_at) => {
                if wake_at.is_some_and(|at| crate::store::now_unix() >= at) {
                    wake_at = None;
                    requests.request(trigger::SyncRequest {
                        reason: trigger::SyncReason::Poll,
                        commit: None,
                        actor: None,
                    });
                }
                continue;
            }
            () = shutdown.cancelled() => return,
        };
        let who = who_of(&receiver.started_origin());
        let slot = tokio::select! {
            slot = tokio::time::timeout(SLOT_WAIT, slots.clone().acquire_owned()) => {
                slot.ok().and_then(Result::ok)
            }
            () = shutdown.cancelled() => None,
        };
        let started = Instant::now();
        let sync_for_task = sync.clone();
        let interrupt_for_task = interrupt.clone();
        let mut task = std::pin::pin!(crate::pool::run_as_task(move || {
            let _slot = slot;
            sync_for_task(&interrupt_for_task, &who)
        }));
        let finished = tokio::select! {
            outcome = &mut task => Some(outcome),
            () = shutdown.cancelled() => None,
        };
        let outcome = match finished {
            Some(outcome) => outcome,
            None => {
                interrupt.store(true, Ordering::Relaxed);
                tracing::info!("shutting down: waiting for the sync in flight");
                task.await
            }
        };
        let (result, report) = match &outcome {
            Ok(Ok(SyncOutcome::Unchanged(commit))) => ("unchanged", Ok(commit.clone())),
            Ok(Ok(SyncOutcome::Applied { commit, .. })) => ("applied", Ok(commit.clone())),
            Ok(Ok(SyncOutcome::Rejected { commit, .. })) => ("rejected", Ok(commit.clone())),
            Ok(Ok(SyncOutcome::Held { commit, .. })) => ("held", Ok(commit.clone())),
            Ok(Err(error)) => ("error", Err(error.to_string())),
            Err(join_error) => ("error", Err(format!("sync task failed: {join_error}"))),
        };
        metrics.record_sync(result, started.elapsed());
        receiver.finish(generation, report);
        match outcome {
            Ok(Ok(SyncOutcome::Unchanged(commit))) => {
                tracing::debug!(%source, commit = commit.short(), "repo unchanged")
            }
            Ok(Ok(SyncOutcome::Applied {
                commit,
                summary,
                warnings,
                triggers,
            })) => {
                for warning in &warnings {
                    tracing::warn!(%source, commit = commit.short(), "{warning}");
                }
                log_triggers(&commit, &triggers);
                tracing::info!(
                    %source,
                    commit = commit.short(),
                    changed = summary.puts.len(),
                    deleted = summary.deletes.len(),
                    unpinned = ?summary.unpinned,
                    "commit applied"
                );
            }
            Ok(Ok(SyncOutcome::Held { commit, until, why })) => {
                // Woken when it may apply: a held commit needs no new push.
                wake_at = until;
                tracing::info!(
                    %source,
                    commit = commit.short(),
                    until = until.map(crate::manifest::window::rfc3339),
                    "commit held (the last applied commit keeps running): {why}"
                );
            }
            Ok(Ok(SyncOutcome::Rejected {
                commit,
                diagnostics,
            })) => tracing::error!(
                %source,
                commit = commit.short(),
                "commit rejected; the host keeps running the last good commit:\n{diagnostics}"
            ),
            Ok(Err(sync_stage::Error::Git(crate::git::Error::Interrupted))) => {
                tracing::info!("sync interrupted by shutdown")
            }
            Ok(Err(error)) => {
                tracing::warn!(%source, %error, "sync failed; next try in {}", humantime::format_duration(interval))
            }
            Err(join_error) => tracing::error!(%join_error, "sync task failed"),
        }
        if shutdown.is_cancelled() {
            return;
        }
    }
}

/// Completes about when the wall clock reaches `at` (a second after, so the held commit is
/// due then), at most an hour from now (a clock jump is noticed); never without `at`.
async fn wake(at: Option<i64>) {
    let Some(at) = at else {
        return std::future::pending().await;
    };
    let seconds = at
        .saturating_sub(crate::store::now_unix())
        .saturating_add(1);
    let seconds = u64::try_from(seconds).unwrap_or(0).min(3600);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
}

/// Who a fetch runs for, as the activity log records it.
fn who_of(origin: &trigger::RequestOrigin) -> Who {
    let origin_of = match origin.reason {
        trigger::SyncReason::Poll => Origin::Poll,
        trigger::SyncReason::Webhook => Origin::Webhook,
        trigger::SyncReason::LocalChange => Origin::RefWatch,
        trigger::SyncReason::Cli => Origin::Cli,
        trigger::SyncReason::Http => Origin::Http,
    };
    Who::new(origin_of, origin.actor.as_deref())
}

/// Logs what each deploy trigger did for an applied commit.
fn log_triggers(commit: &crate::model::CommitSha, outcomes: &[crate::manifest::triggers::Outcome]) {
    use crate::manifest::triggers::Verdict;
    for outcome in outcomes {
        match &outcome.verdict {
            Verdict::Fired { first } => {
                tracing::info!(commit = commit.short(), trigger = %outcome.name, first, "trigger fired")
            }
            Verdict::Held { replaced } => tracing::info!(
                commit = commit.short(),
                trigger = %outcome.name,
                replaces = replaced.as_ref().map(|sha| sha.short().to_owned()),
                "deploy: manual: commit held until `voodu-agent approve {}`",
                commit.short()
            ),
            Verdict::Approved {
                commit: approved,
                by,
            } => {
                tracing::info!(commit = approved.short(), trigger = %outcome.name, by, "approved commit applied")
            }
            Verdict::Skipped => {
                tracing::debug!(commit = commit.short(), trigger = %outcome.name, "trigger skipped: the commit touches none of its paths")
            }
            Verdict::Inactive(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Mutex, mpsc};

    use futures_util::FutureExt as _;

    use super::*;
    use crate::git::trigger::{SyncReason, SyncRequest};
    use crate::model::CommitSha;

    /// Issue 11 bug 4: on shutdown the sync loop returned at once and dropped the sync in
    /// flight, so `run` could return while that sync still fetched or wrote.
    #[tokio::test]
    async fn shutdown_waits_for_an_in_flight_sync() -> Result<(), Box<dyn std::error::Error>> {
        let tip = CommitSha::new("0123456789abcdef".repeat(3)[..40].to_owned());
        let (entered_sender, entered) = tokio::sync::oneshot::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        let entered_sender = Mutex::new(Some(entered_sender));
        let released = Mutex::new(released);
        let asked_to_stop = Arc::new(AtomicBool::new(false));
        let sync = {
            let asked_to_stop = asked_to_stop.clone();
            let tip = tip.clone();
            move |interrupt: &AtomicBool, _: &Who| {
                if let Some(sender) = crate::base::lock(&entered_sender).take() {
                    let _ = sender.send(());
                }
                // In flight until the test releases it.
                let _ = crate::base::lock(&released).recv();
                asked_to_stop.store(interrupt.load(Ordering::Relaxed), Ordering::Relaxed);
                Ok(SyncOutcome::Unchanged(tip.clone()))
            }
        };
        let (requests, receiver) = trigger::channel();
        let metrics = Arc::new(Metrics::new());
        let shutdown = CancellationToken::new();
        let ticket = requests.request(SyncRequest {
            reason: SyncReason::Poll,
            commit: None,
            actor: None,
        });
        let sync_loop = sync_loop(
            sync,
            receiver,
            metrics.clone(),
            (String::new(), Duration::from_secs(3600)),
            (requests.clone(), sync_slots()),
            shutdown.clone(),
        );
        tokio::pin!(sync_loop);
        tokio::select! {
            () = &mut sync_loop => return Err("the loop ended before its sync started".into()),
            started = entered => started?,
        }

        shutdown.cancel();
        assert!(
            (&mut sync_loop).now_or_never().is_none(),
            "the sync loop returned while its sync was in flight"
        );
        release.send(())?;
        sync_loop.await;
        assert!(
            asked_to_stop.load(Ordering::Relaxed),
            "the sync was asked to stop at a safe point"
        );
        assert_eq!(metrics.syncs_total(), 1, "the sync was recorded");
        let report = requests
            .fetched(ticket)
            .now_or_never()
            .ok_or("the sync's end was not reported")?;
        assert_eq!(report.result, Ok(tip));
        Ok(())
    }
}
