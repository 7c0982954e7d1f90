//! The default command: run the agent in the foreground until SIGTERM or Ctrl-C.
//!
//! The first signal stops new work and lets in-flight steps finish; a second one exits at
//! once (exit code 130).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::agent::{self, AgentConfig, HttpConfig};
use crate::git::SourceOptions;
use crate::http::{HttpOptions, WebhookSecret};
use crate::reconcile::ReconcileOptions;
use crate::reconcile::router::IngressOptions;
use crate::sync::SyncOptions;

#[derive(Debug, Args)]
pub(super) struct RunArgs {
    /// Repository to watch: a local path, file://, https:// or ssh:// URL.
    #[arg(
        help_heading = "Source",
        long,
        env = "VOODU_REPO",
        value_name = "URL|PATH"
    )]
    repo: Option<String>,
    /// Several repositories, each owning its scopes: an HCL file of `source "NAME" { url,
    /// branch, paths, scopes, poll, token_file, webhook_secret_file, verify_commits, … }`
    /// blocks (README "Several repositories"). Instead of --repo.
    #[arg(help_heading = "Source", long, env = "VOODU_SOURCES", value_name = "FILE", value_hint = clap::ValueHint::FilePath, conflicts_with_all = ["repo", "paths", "git_token_file", "git_ca_file", "git_ssh_key_file"])]
    sources: Option<PathBuf>,
    /// A deploy window (repeatable): `KIND SCHEDULE DURATION [TIMEZONE]`, KIND `allow` or
    /// `deny`, SCHEDULE five cron fields or an @macro (the cronjob grammar), e.g.
    /// 'allow 0 9 * * 1-5 8h Europe/Berlin'. A commit outside the allow windows, or inside a
    /// deny window, is held until one opens (README "Deploy windows and freeze"). With
    /// --sources: `window` blocks in the file instead. Several in VOODU_WINDOW: `;`-separated.
    #[arg(
        help_heading = "Source",
        long = "window",
        env = "VOODU_WINDOW",
        value_name = "RULE",
        value_delimiter = ';',
        conflicts_with = "sources"
    )]
    windows: Vec<String>,
    /// A preview per branch of --repo matching this (a name, or a prefix ending in `*`, e.g.
    /// `preview/*`): its resources in scopes `<scope>-pr-<slug>`, its ingress hosts by
    /// --preview-host (README "Branch previews"). With --sources: a `previews {}` block.
    #[arg(
        help_heading = "Previews",
        long,
        env = "VOODU_PREVIEW_BRANCHES",
        value_name = "PATTERN",
        requires = "preview_host",
        conflicts_with = "sources"
    )]
    preview_branches: Option<String>,
    /// The host every ingress of a preview answers at: `{slug}` (and `{scope}`, `{name}`)
    /// filled in, e.g. `{slug}.preview.example.com`.
    #[arg(
        help_heading = "Previews",
        long,
        env = "VOODU_PREVIEW_HOST",
        value_name = "TEMPLATE",
        requires = "preview_branches"
    )]
    preview_host: Option<String>,
    /// The scope a preview's resource takes: `{scope}`, a separator, `{slug}`.
    #[arg(help_heading = "Previews", long, env = "VOODU_PREVIEW_SCOPE", value_name = "TEMPLATE", default_value = agent::sources::DEFAULT_PREVIEW_SCOPE)]
    preview_scope: String,
    /// A preview without a push for this long is removed.
    #[arg(help_heading = "Previews", long, env = "VOODU_PREVIEW_TTL", value_name = "DURATION", default_value = "72h", value_parser = humantime::parse_duration)]
    preview_ttl: Duration,
    /// At most this many previews; a newer branch is refused (the oldest are kept).
    #[arg(
        help_heading = "Previews",
        long,
        env = "VOODU_PREVIEW_MAX",
        value_name = "N",
        default_value_t = 5
    )]
    preview_max: usize,
    /// The previews' host policy (the --policy format, JSON): it narrows the agent's for the
    /// previews' containers, never widens it.
    #[arg(
        help_heading = "Previews",
        long,
        env = "VOODU_PREVIEW_POLICY",
        value_name = "FILE",
        requires = "preview_branches"
    )]
    preview_policy: Option<PathBuf>,
    /// Most replicas of a preview's deployment or statefulset (more is refused at its line).
    #[arg(
        help_heading = "Previews",
        long,
        env = "VOODU_PREVIEW_MAX_REPLICAS",
        value_name = "N",
        requires = "preview_branches"
    )]
    preview_max_replicas: Option<usize>,
    /// Most memory of a preview's container, e.g. 512Mi: more is refused at its line, a
    /// container without a limit gets this one.
    #[arg(help_heading = "Previews", long, env = "VOODU_PREVIEW_MEMORY", value_name = "SIZE", requires = "preview_branches", value_parser = parse_preview_memory)]
    preview_memory: Option<i64>,
    /// Most CPU of a preview's container, in cores (0.5) or millicores (500m): more is
    /// refused at its line, a container without a limit gets this one.
    #[arg(help_heading = "Previews", long, env = "VOODU_PREVIEW_CPUS", value_name = "CORES", requires = "preview_branches", value_parser = parse_preview_cpus)]
    preview_cpus: Option<i64>,
    /// Branch to deploy.
    #[arg(
        help_heading = "Source",
        long,
        env = "VOODU_BRANCH",
        default_value = "main"
    )]
    branch: String,
    /// Directory (repeatable, or comma-separated) inside the repo to read
    /// *.hcl/*.voodu/*.vdu/*.vd manifests from. Default: the whole repo.
    #[arg(
        help_heading = "Source",
        long = "path",
        env = "VOODU_PATH",
        value_name = "DIR",
        value_delimiter = ','
    )]
    paths: Vec<String>,
    /// How often to poll the remote, e.g. 30s, 5m.
    #[arg(help_heading = "Source", long, env = "VOODU_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// For https remotes: file holding an access token, sent as the password of the URL's
    /// user (`https://USER@host/…`: a GitLab deploy token's name, Bitbucket's
    /// `x-token-auth`), else of `x-access-token` (GitHub, Gitea, Forgejo). Refused over
    /// plain http.
    #[arg(help_heading = "Source", long, env = "VOODU_GIT_TOKEN_FILE", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    git_token_file: Option<PathBuf>,
    /// For https remotes: PEM file of CA certificates trusted beside the system's (a private
    /// CA). The system's own store can be replaced with SSL_CERT_FILE / SSL_CERT_DIR.
    #[arg(help_heading = "Source", long, env = "VOODU_GIT_CA_FILE", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    git_ca_file: Option<PathBuf>,
    /// For ssh remotes: accept and remember the key of a host that is not in known_hosts yet
    /// (ssh's StrictHostKeyChecking=accept-new); a changed key is still refused. Without it,
    /// an unknown host is refused: add its key to ~/.ssh/known_hosts first.
    #[arg(help_heading = "Source", long, env = "VOODU_GIT_SSH_ACCEPT_NEW_HOST_KEYS", value_parser = super::boolish())]
    git_ssh_accept_new_host_keys: bool,
    /// For ssh remotes: the private key to authenticate with (a deploy key), instead of the
    /// user's own ssh keys and agent.
    #[arg(help_heading = "Source", long, env = "VOODU_GIT_SSH_KEY_FILE", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    git_ssh_key_file: Option<PathBuf>,
    /// Resources reconciled in parallel (one key is never reconciled twice at once).
    #[arg(help_heading = "Reconcile", long, env = "VOODU_CONCURRENCY", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    concurrency: u16,
    /// Replicas and statefulset pods created and started at once, all resources together (a
    /// first deploy, a scale-up); each resource's pass takes slots from this one pool.
    #[arg(help_heading = "Reconcile", long, env = "VOODU_CREATE_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    create_concurrency: u16,
    /// Threads that run the agent's async tasks: engine calls, webhooks, timers, passes'
    /// decisions. Its blocking work (git, the state database, manifests) has threads of its
    /// own; one is enough for a host, and each more adds wake-ups between them (README
    /// "Sizing").
    #[arg(help_heading = "Reconcile", long, env = "VOODU_ASYNC_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    async_threads: u16,
    /// How long a rollout may take before it is failed and rolled back automatically to the
    /// last release that ran.
    #[arg(help_heading = "Reconcile", long, env = "VOODU_ROLLOUT_DEADLINE", default_value = "5m", value_parser = humantime::parse_duration)]
    rollout_deadline: Duration,
    /// Without a readiness probe, a replica counts as ready once it has run this long
    /// without restarting (the health gate between rollout slots).
    #[arg(help_heading = "Reconcile", long, env = "VOODU_READY_SETTLE", default_value = "3s", value_parser = humantime::parse_duration)]
    ready_settle: Duration,
    /// How often every managed resource is compared with the host and repaired (container
    /// events trigger repairs at once; this catches anything they missed).
    #[arg(help_heading = "Reconcile", long, env = "VOODU_RESYNC", default_value = "5m", value_parser = humantime::parse_duration)]
    resync: Duration,
    /// How often the autoscaler samples CPU of deployments with `autoscale {}`.
    #[arg(help_heading = "Reconcile", long, env = "VOODU_AUTOSCALE_INTERVAL", default_value = "15s", value_parser = humantime::parse_duration)]
    autoscale_interval: Duration,
    /// Do not subscribe to container events: drift is then repaired at the resync only, and
    /// every list of containers goes to the engine (for testing the resync).
    #[arg(help_heading = "Reconcile", long, env = "VOODU_NO_CONTAINER_EVENTS", hide = true, value_parser = super::boolish())]
    no_container_events: bool,
    /// Agent environment variable (repeatable) that manifests may read as `${NAME}`. Nothing
    /// else of the agent's environment is visible to them.
    #[arg(
        help_heading = "Manifests",
        long = "allow-env",
        env = "VOODU_ALLOW_ENV",
        value_name = "NAME",
        value_delimiter = ','
    )]
    allow_env: Vec<String>,
    /// Largest file `file()` or `env_file` may read, in bytes. Larger blobs (and any over
    /// 8 MiB) are not fetched where the git server can leave them out.
    #[arg(help_heading = "Manifests", long, env = "VOODU_MAX_FILE_SIZE", value_name = "BYTES", default_value_t = crate::manifest::DEFAULT_MAX_FILE_BYTES)]
    max_file_size: u64,
    /// Largest body a `url()` asset may fetch, in bytes.
    #[arg(help_heading = "Manifests", long, env = "VOODU_MAX_URL_SIZE", value_name = "BYTES", default_value_t = crate::assets::DEFAULT_MAX_URL_BYTES)]
    max_url_size: u64,
    /// The time all `url()` fetches of one commit may take together (they run 4 at a time;
    /// each key's own timeout is cut to what is left). A commit whose fetches do not finish
    /// in it is rejected, naming each unfinished key. At most 10m.
    #[arg(help_heading = "Manifests", long, env = "VOODU_URL_BUDGET", value_name = "DURATION", default_value = "30s", value_parser = parse_url_budget)]
    url_budget: Duration,
    /// Log filter: a level (`error`, `warn`, `info`, `debug`, `trace`), or `TARGET=LEVEL`
    /// pairs and a level for the rest, comma-separated (`warn,voodu_agent=debug`); RUST_LOG
    /// wins when set.
    #[arg(
        help_heading = "Logging",
        long,
        env = "VOODU_LOG",
        default_value = "info"
    )]
    log: String,
    /// Log line format: `text`, or `json` (one object per line with the event's fields, for
    /// journald and log shippers). Under systemd each line also carries its syslog priority.
    #[arg(help_heading = "Logging", long, env = "VOODU_LOG_FORMAT", value_enum, default_value_t = super::log::LogFormat::Text)]
    log_format: super::log::LogFormat,
    /// Address of the HTTP side (webhook, status, releases, metrics, healthz), or `off`.
    /// Port 0 picks a free port. Off loopback it needs --webhook-secret-file.
    #[arg(help_heading = "HTTP", long, env = "VOODU_LISTEN", value_name = "ADDR|off", default_value = "127.0.0.1:8687", value_parser = parse_listen)]
    listen: Listen,
    /// File holding the webhook secret: the HMAC key of GitHub, Gitea/Forgejo and generic
    /// signatures, or GitLab's token. With it, unsigned or wrongly signed requests get 401.
    #[arg(help_heading = "HTTP", long, env = "VOODU_WEBHOOK_SECRET_FILE", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    webhook_secret_file: Option<PathBuf>,
    /// Where to tell people what happened: an HCL file of `notify` blocks (slack, discord,
    /// teams, ntfy, gotify, alertmanager, generic signed webhooks) and `commit_status` blocks
    /// (github, gitlab, gitea, forgejo, bitbucket). Secrets stay in the files it names. See
    /// README "Notifications"; `voodu-agent notify test NAME` sends a test message.
    #[arg(help_heading = "Notifications", long, env = "VOODU_NOTIFY", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    notify: Option<PathBuf>,
    /// An SSH private key that signs the commits `image_update` (commit mode) pushes; add its
    /// public key to the trusted signers when running with --verify-commits.
    #[arg(help_heading = "Images", long, env = "VOODU_IMAGE_SIGNING_KEY", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    image_signing_key: Option<PathBuf>,
    /// Largest webhook body accepted, in bytes (larger ones get 413).
    #[arg(help_heading = "HTTP", long, env = "VOODU_WEBHOOK_MAX_BODY", value_name = "BYTES", default_value_t = 1024 * 1024)]
    webhook_max_body: usize,
    /// Do not watch a local repository's refs (by default a local --repo syncs as soon as a
    /// branch moves, without waiting for the next poll).
    #[arg(help_heading = "Source", long, env = "VOODU_NO_WATCH", value_parser = super::boolish())]
    no_watch: bool,
    /// A cronjob tick missed while the agent was not running still runs once when its
    /// scheduled time is at most this old (only the most recent one; older ones are reported
    /// as missed). 0 runs only ticks that are at most a minute late.
    #[arg(help_heading = "Reconcile", long, env = "VOODU_CRON_CATCH_UP", value_name = "DURATION", default_value = "15m", value_parser = humantime::parse_duration)]
    cron_catch_up: Duration,
    /// The restic executable that runs statefulsets' `backup {}` (Debian's `restic`
    /// package); found on PATH by default.
    #[arg(
        help_heading = "Backups",
        long,
        env = "VOODU_RESTIC",
        value_name = "PATH",
        value_hint = clap::ValueHint::ExecutablePath,
        default_value = "restic"
    )]
    restic: std::path::PathBuf,
    /// Host address where the ingress proxy (Caddy) serves HTTP. Port 0 lets the engine pick.
    /// Under `--runtime swarm`: 0.0.0.0 and a port, published on every node running the proxy.
    #[arg(
        help_heading = "Ingress",
        long,
        env = "VOODU_INGRESS_HTTP",
        value_name = "ADDR",
        default_value = "0.0.0.0:80"
    )]
    ingress_http: SocketAddr,
    /// Host address where the ingress proxy serves HTTPS (hosts with a `tls {}` block).
    #[arg(
        help_heading = "Ingress",
        long,
        env = "VOODU_INGRESS_HTTPS",
        value_name = "ADDR",
        default_value = "0.0.0.0:443"
    )]
    ingress_https: SocketAddr,
    /// The ingress proxy's image: Caddy 2 (`scripts/docker-setup` builds `voodu-caddy:latest`
    /// from Debian's package for hosts without a registry).
    #[arg(help_heading = "Ingress", long, env = "VOODU_INGRESS_IMAGE", value_name = "IMAGE", default_value = crate::reconcile::router::DEFAULT_IMAGE)]
    ingress_image: String,
    /// Run no ingress proxy: ingresses are accepted but route nothing (their status says so),
    /// and a proxy left from an earlier run is removed.
    #[arg(help_heading = "Ingress", long, env = "VOODU_NO_INGRESS", value_parser = super::boolish())]
    no_ingress: bool,
    /// When state.db was lost: take over the identity (agent id) of this data dir's
    /// containers left on the engine, so they count as this agent's own and the repo is
    /// converged without duplicates. Without it the agent refuses to start in that case.
    #[arg(help_heading = "Reconcile", long, env = "VOODU_ADOPT", value_parser = super::boolish())]
    adopt: bool,

    /// What commits may ask of the host (README "Host policy"); default-deny.
    #[command(flatten)]
    policy: super::validate::PolicyArgs,

    /// Which host of a fleet this is (README "Fleet").
    #[command(flatten)]
    hosts: super::fleet::HostArgs,

    /// What runs the workloads: `docker` (containers on the local engine) or `swarm`
    /// (Docker Swarm services, on a swarm manager's engine; README "Docker Swarm").
    #[arg(
        help_heading = "Reconcile",
        long,
        env = "VOODU_RUNTIME",
        value_name = "docker|swarm",
        default_value = "docker",
        value_parser = super::validate::parse_runtime
    )]
    runtime: crate::reconcile::Engine,

    /// Which commit signatures the agent requires (README "Signed commits").
    #[command(flatten)]
    trust: super::trust::TrustArgs,
}

/// `--url-budget`: a duration from 1s to `MAX_URL_BUDGET`.
fn parse_url_budget(text: &str) -> Result<Duration, String> {
    let budget = humantime::parse_duration(text).map_err(|error| error.to_string())?;
    let max = crate::assets::MAX_URL_BUDGET;
    if budget < Duration::from_secs(1) || budget > max {
        return Err(format!(
            "{text:?} is outside 1s..={}",
            humantime::format_duration(max)
        ));
    }
    Ok(budget)
}

/// `--listen`: an address, or `off`.
#[derive(Debug, Clone)]
pub(super) struct Listen(Option<SocketAddr>);

fn parse_listen(text: &str) -> Result<Listen, String> {
    if text == "off" {
        return Ok(Listen(None));
    }
    text.parse()
        .map(|address| Listen(Some(address)))
        .map_err(|_| format!("{text:?} is not IP:PORT (e.g. 127.0.0.1:8687) or `off`"))
}

/// The `--window` rules, checked; a mistake names the flag and what to write.
fn window_rules(texts: &[String]) -> anyhow::Result<Vec<crate::manifest::window::WindowRule>> {
    use crate::manifest::window::{MAX_RULES, WindowRule};
    if texts.len() > MAX_RULES {
        anyhow::bail!("{} --window rules; at most {MAX_RULES}", texts.len());
    }
    texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            WindowRule::parse_flag(&format!("--window {}", index + 1), text)
                .map_err(|error| anyhow::anyhow!("--window: {error}"))
        })
        .collect()
}

fn parse_preview_memory(text: &str) -> Result<i64, String> {
    crate::model::parse_memory(text).ok_or_else(|| format!("{text:?}: write a size, e.g. 512Mi"))
}

fn parse_preview_cpus(text: &str) -> Result<i64, String> {
    crate::model::parse_cpus(text)
        .ok_or_else(|| format!("{text:?}: write cores or millicores, e.g. 0.5 or 500m"))
}

pub(super) fn run(args: RunArgs, data_dir: PathBuf) -> anyhow::Result<ExitCode> {
    // Before anything starts: no --repo, a token that would go in clear text, an unreadable
    // CA file, a bad policy, a listener off loopback without a secret.
    check(&args)?;
    let source = source_options(&args)?;
    let sources = load_sources(&args)?;
    let previews = args
        .preview_branches
        .as_deref()
        .map(|branches| {
            agent::sources::preview_rules(
                "",
                &[crate::model::scopes::ScopePattern::Any],
                (
                    branches,
                    &args.preview_scope,
                    args.preview_host.as_deref().unwrap_or_default(),
                ),
                (args.preview_ttl, args.preview_max),
            )
            .and_then(|rules| {
                Ok(crate::model::previews::PreviewRules {
                    policy: args
                        .preview_policy
                        .as_deref()
                        .map(agent::sources::load_preview_policy)
                        .transpose()?,
                    caps: crate::model::policy::Caps {
                        max_replicas: args.preview_max_replicas,
                        memory: args.preview_memory,
                        cpus: args.preview_cpus,
                    },
                    ..rules
                })
            })
        })
        .transpose()
        .map_err(|message| anyhow::anyhow!("--preview-*: {message}"))?;
    limit_heap_arenas();
    init_tracing(&args.log, args.log_format)?;
    // reqwest (https fetches) needs a process-wide rustls provider; an error means one is
    // already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut sync = SyncOptions::new(data_dir.clone());
    sync.max_file_bytes = args.max_file_size;
    sync.max_url_bytes = args.max_url_size;
    sync.url_budget = args.url_budget;
    // Before anything else, so a bad policy (or host name) is the error.
    sync.policy = args.policy.to_policy_for(&data_dir)?;
    let hosts = args.hosts.to_selection(None)?;
    sync.trust = args.trust.to_commit_trust()?;
    sync.keyring = args.trust.to_keyring()?;
    sync.windows = window_rules(&args.windows)?;
    for name in &args.allow_env {
        match std::env::var(name) {
            Ok(value) => {
                sync.allowed_env.insert(name.clone(), value);
            }
            Err(_) => tracing::warn!(name, "--allow-env names a variable that is not set"),
        }
    }
    let secret = args
        .webhook_secret_file
        .as_deref()
        .map(WebhookSecret::from_file)
        .transpose()?;
    let http = HttpConfig {
        secret_file: args
            .webhook_secret_file
            .as_ref()
            .map(|path| std::path::absolute(path).unwrap_or_else(|_| path.clone())),
        options: HttpOptions {
            secret,
            max_body_bytes: args.webhook_max_body,
            ..HttpOptions::default()
        },
    };
    // Bind mounts need an absolute path, whatever --data-dir was given as.
    let ingress = (!args.no_ingress).then(|| IngressOptions {
        image: args.ingress_image.clone(),
        http: args.ingress_http,
        https: args.ingress_https,
        ..IngressOptions::new(
            std::path::absolute(data_dir.join("ingress"))
                .unwrap_or_else(|_| data_dir.join("ingress")),
        )
    });
    let keyring = std::sync::Arc::clone(&sync.keyring);
    let notify = args
        .notify
        .as_deref()
        .map(crate::notify::NotifyConfig::load)
        .transpose()
        .context("--notify")?;
    let config = AgentConfig {
        source,
        hosts,
        data_dir,
        interval: args.interval,
        sync,
        reconcile: ReconcileOptions {
            engine: args.runtime,
            concurrency: usize::from(args.concurrency),
            create_concurrency: usize::from(args.create_concurrency),
            rollout_deadline: args.rollout_deadline,
            ready_settle: args.ready_settle,
            resync: args.resync.max(Duration::from_secs(1)),
            autoscale_interval: args.autoscale_interval.max(Duration::from_secs(1)),
            container_events: !args.no_container_events,
            cron_catch_up: args.cron_catch_up,
            restic: args.restic.clone(),
            keyring: std::sync::Arc::clone(&keyring),
            ingress,
            ..ReconcileOptions::default()
        },
        http,
        watch_local: !args.no_watch,
        adopt: args.adopt,
        service: agent::ServiceNotify::from_env(),
        notify,
        image_signing_key: args.image_signing_key.clone(),
        sources,
        previews,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(args.async_threads))
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(async {
        // Bound here, before anything is started, so a taken port or a refused address is the
        // error; another agent on this data dir is the error before that.
        let listener = match args.listen.0 {
            Some(address) => {
                agent::check_data_dir_free(&config.data_dir)?;
                Some(crate::http::bind(address, &config.http.options).await?)
            }
            None => None,
        };
        let shutdown = CancellationToken::new();
        let signals = tokio::spawn(stop_on_signals(shutdown.clone()));
        let watchdog = agent::systemd::watchdog_interval()
            .map(|interval| tokio::spawn(keep_watchdog(config.service.clone(), interval)));
        let result = agent::run(config, listener, shutdown.clone().cancelled_owned()).await;
        signals.abort();
        if let Some(watchdog) = watchdog {
            watchdog.abort();
        }
        result
    });
    // `run` waited for its tasks and the sync in flight; a blocking task still running (an
    // engine call that does not answer) must not hold the exit: 2 s for tokio's blocking
    // threads and the agent's pool (`crate::pool`) together.
    let started = std::time::Instant::now();
    if !crate::pool::settle(Duration::from_secs(2)) {
        tracing::warn!("a blocking call still runs at exit");
    }
    runtime.shutdown_timeout(Duration::from_secs(2).saturating_sub(started.elapsed()));
    result?;
    super::log::flush();
    Ok(ExitCode::SUCCESS)
}

/// Refuses what `run` would refuse before starting anything (also `install`'s check).
pub(super) fn check(args: &RunArgs) -> anyhow::Result<()> {
    if args.sources.is_some() {
        load_sources(args)?;
    } else {
        source_options(args)?.check()?;
    }
    args.policy.to_policy()?;
    window_rules(&args.windows)?;
    let secret = args
        .webhook_secret_file
        .as_deref()
        .map(WebhookSecret::from_file)
        .transpose()?;
    if let Some(listen) = args.listen.0
        && secret.is_none()
        && !crate::http::may_listen_without_secret(&listen)
    {
        return Err(crate::http::Error::InsecureListen { address: listen }.into());
    }
    if args.runtime == crate::reconcile::Engine::Swarm && !args.no_ingress {
        crate::reconcile::router::check_swarm_listen(&args.ingress_http, &args.ingress_https)?;
    }
    Ok(())
}

/// The sources of `--sources FILE`; none without it.
fn load_sources(args: &RunArgs) -> anyhow::Result<Vec<agent::SourceConfig>> {
    let Some(path) = &args.sources else {
        return Ok(Vec::new());
    };
    agent::sources::load(path, args.interval)
        .map_err(|diagnostics| anyhow::anyhow!("--sources:\n{diagnostics}"))
}

fn source_options(args: &RunArgs) -> anyhow::Result<SourceOptions> {
    if args.sources.is_some() {
        // The sources file names every repository.
        return Ok(SourceOptions::default());
    }
    let Some(repo) = &args.repo else {
        anyhow::bail!(
            "no --repo given: run `voodu-agent --repo <URL|PATH>` (or `--sources FILE` for several repositories), or see `voodu-agent --help`"
        );
    };
    Ok(SourceOptions {
        url: repo.clone(),
        branch: args.branch.clone(),
        paths: args.paths.clone(),
        token_file: args.git_token_file.clone(),
        ca_file: args.git_ca_file.clone(),
        ssh_accept_new_host_keys: args.git_ssh_accept_new_host_keys,
        ssh_key_file: args
            .git_ssh_key_file
            .as_ref()
            .map(|path| std::path::absolute(path).unwrap_or_else(|_| path.clone())),
        // The agent's `--max-file-size`, set where the source is made (`agent::start`).
        max_file_bytes: 0,
    })
}

/// At most two glibc malloc arenas. By default glibc gives each new thread its own arena (up
/// to 8 per core), and tokio's blocking threads come and go: what they allocated is then
/// spread over arenas that keep it. Measured when the whole agent allocated from glibc
/// (benches/memory.rs, 16 rejected commits of 2 MB, debug build): idle RSS ×1.72 after them
/// with the default, ×1.17 with two arenas. Since then only C code (SQLite) allocates from
/// glibc; the Rust heap is mimalloc's (main.rs). Before any thread is started.
fn limit_heap_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt has no preconditions; it is called before this process starts threads.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Logs go through a non-blocking sink (`cli::log`): a closed or full stderr never stops a
/// task.
fn init_tracing(default_filter: &str, format: super::log::LogFormat) -> anyhow::Result<()> {
    let filter = super::log::filter(default_filter)?;
    super::log::install(filter, format).context("cannot start the log writer thread")
}

/// Tells systemd's watchdog the agent is alive every `interval` (half of `WatchdogSec=`), as
/// long as the async threads run this task and the blocking pool (where every store read and
/// fetch runs) takes a task within `interval`: a wedged runtime misses its keep-alive and
/// systemd restarts the agent. Runs from before the engine answers until the process ends.
async fn keep_watchdog(service: agent::ServiceNotify, interval: Duration) {
    loop {
        let blocking_pool = tokio::time::timeout(interval, tokio::task::spawn_blocking(|| ()));
        if matches!(blocking_pool.await, Ok(Ok(()))) {
            service.watchdog();
        } else {
            tracing::warn!(
                "the blocking thread pool did not answer in time; skipping a watchdog keep-alive"
            );
        }
        tokio::time::sleep(interval).await;
    }
}

/// First SIGTERM/SIGINT: cancel `shutdown`. Second: exit now.
async fn stop_on_signals(shutdown: CancellationToken) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the agent");
                let _ = tokio::signal::ctrl_c().await;
                shutdown.cancel();
                return;
            }
        };
    for count in 0.. {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        if count == 0 {
            // Cancel first: nothing (not even logging) may stand between a signal and the stop.
            shutdown.cancel();
            tracing::info!("stop requested; a second signal exits at once");
        } else {
            tracing::warn!("second stop signal: exiting now");
            std::process::exit(130);
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    #[test]
    fn boolean_flags_default_to_false_and_set_to_true() {
        let cli =
            super::super::Cli::try_parse_from(["voodu-agent", "--repo", "r"]).expect("parses");
        let args = cli.run;
        assert!(
            !args.no_container_events && !args.no_watch && !args.no_ingress && !args.adopt,
            "{args:?}"
        );
        assert!(!args.git_ssh_accept_new_host_keys && !args.policy.given());
        let cli = super::super::Cli::try_parse_from([
            "voodu-agent",
            "--repo",
            "r",
            "--no-watch",
            "--adopt",
        ])
        .expect("parses");
        assert!(cli.run.no_watch && cli.run.adopt && !cli.run.no_ingress);
    }

    #[test]
    fn the_url_budget_is_bounded_and_url_hosts_are_checked_at_start() -> Result<(), String> {
        use std::time::Duration;
        assert_eq!(super::parse_url_budget("2s"), Ok(Duration::from_secs(2)));
        for bad in ["0s", "500ms", "11m", "soon"] {
            assert!(super::parse_url_budget(bad).is_err(), "{bad}");
        }
        let cli = super::super::Cli::try_parse_from([
            "voodu-agent",
            "--repo",
            "r",
            "--allow-url-host",
            "127.0.0.1,http://x",
        ])
        .map_err(|error| error.to_string())?;
        let error = cli
            .run
            .policy
            .to_policy()
            .err()
            .ok_or("a bad url host passed")?;
        assert_eq!(
            error.to_string(),
            "--allow-url-host \"http://x\" is not a host name, an IP address or a CIDR (10.0.0.0/8)"
        );
        Ok(())
    }
}
