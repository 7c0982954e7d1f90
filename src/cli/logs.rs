//! `voodu-agent logs SCOPE/NAME [--replica ID] [-f] [--since 10m] [--tail N] [--release N]`:
//! the output of a resource's containers (replicas, init containers, release hooks, job and
//! cron runs), interleaved, each line prefixed with its container's name as `docker compose
//! logs` does. Read from the running agent (`GET /logs/{scope}/{name}`, `http::logs`), which
//! masks the secrets it knows; when no agent answers, from the engine itself through the same
//! code (`agent::logs`), masking the config values and registry tokens of state.db and the
//! sealed values the `--age-identity` files open.
//!
//! Invariants: every line printed was masked and escaped by `agent::logs` (no control
//! character reaches the terminal); followed through the agent, a stream the agent ends (its
//! connection lifetime) is opened again from the second of the last line, so lines of that
//! second may show twice, none is lost.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use futures_util::StreamExt as _;

use crate::agent::logs::Follower;
use crate::http::logs::{LogItem, LogQuery, LogSource as _, MAX_TAIL};
use crate::model::text::Esc;

#[derive(Debug, Args)]
pub(super) struct LogsArgs {
    /// The resource: SCOPE/NAME (a deployment, statefulset, job or cronjob; a KIND/ prefix
    /// is allowed and ignored).
    #[arg(value_name = "SCOPE/NAME")]
    resource: String,
    /// Only this container: its name (as the prefix shows it) or its replica id.
    #[arg(long, value_name = "ID")]
    replica: Option<String>,
    /// Keep following: new containers (a rolling update's, a cron run's) join, stopped ones
    /// leave.
    #[arg(short = 'f', long)]
    follow: bool,
    /// Only output written in this last span (`10m`, `2h`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    since: Option<Duration>,
    /// Only the last N lines of each container (at most 10000).
    #[arg(long, value_name = "N")]
    tail: Option<usize>,
    /// Only the containers of this release (its replicas, init containers and hooks).
    #[arg(long, value_name = "N")]
    release: Option<i64>,
    /// The agent's HTTP address, HOST:PORT. Default: the address the agent recorded in
    /// state.db, else 127.0.0.1:8687. When no agent answers there, the engine is read
    /// directly.
    #[arg(long = "agent", value_name = "HOST:PORT")]
    address: Option<String>,
    /// The webhook secret file, sent as the bearer token an agent off loopback asks for.
    /// Default: the file the agent recorded in state.db.
    #[arg(long = "webhook-secret-file", value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// Without a running agent: age identity files to open sealed env values with, so they
    /// are masked (as the agent's `--age-identity`).
    #[arg(
        long = "age-identity",
        env = "VOODU_AGE_IDENTITY",
        value_name = "FILE",
        value_delimiter = ','
    )]
    age_identities: Vec<PathBuf>,
}

pub(super) fn run(data_dir: &Path, args: &LogsArgs) -> anyhow::Result<ExitCode> {
    let parts: Vec<&str> = args.resource.split('/').collect();
    let (scope, name) = match parts.as_slice() {
        [scope, name] | [_, scope, name] if !scope.is_empty() && !name.is_empty() => {
            ((*scope).to_owned(), (*name).to_owned())
        }
        _ => anyhow::bail!(
            "{:?} is not SCOPE/NAME (e.g. `voodu-agent logs shop/web`)",
            Esc(&args.resource)
        ),
    };
    if args.tail.is_some_and(|tail| tail > MAX_TAIL) {
        anyhow::bail!("--tail is at most {MAX_TAIL}");
    }
    let since = match args.since {
        Some(span) => Some(
            crate::store::now_unix()
                - i64::try_from(span.as_secs()).context("--since is too long")?,
        ),
        None => None,
    };
    let query = LogQuery {
        scope,
        name,
        replica: args.replica.clone(),
        release: args.release,
        since,
        tail: args.tail,
        follow: args.follow,
    };
    let recorded = |key: &str| super::sync::recorded_meta(data_dir, key);
    let address = super::sync::agent_address(data_dir, args.address.as_deref());
    let token = match &args.secret_file {
        Some(path) => Some(read_secret(path)?),
        None => recorded(crate::agent::META_SECRET_FILE)
            .and_then(|path| read_secret(Path::new(&path)).ok()),
    };
    match through_agent(&address, token.as_deref(), query.clone()) {
        Ok(code) => Ok(code),
        Err(Unreached(why)) => {
            tracing::debug!(%why, "no agent answers; reading the engine");
            from_engine(data_dir, &args.age_identities, query)
        }
    }
}

fn read_secret(path: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text.trim_end_matches(['\r', '\n']).to_owned())
}

/// No agent answered at the address.
struct Unreached(String);

/// Streams the query from the agent, printing each line; `Unreached` when nothing answers.
fn through_agent(
    address: &str,
    token: Option<&str>,
    mut query: LogQuery,
) -> Result<ExitCode, Unreached> {
    let tls = crate::model::tls::client_config().map_err(|error| Unreached(error.to_string()))?;
    let client = reqwest::blocking::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(Duration::from_secs(3))
        .timeout(None)
        .user_agent("voodu-agent-cli")
        .build()
        .map_err(|error| Unreached(error.to_string()))?;
    let mut first = true;
    loop {
        let mut url = reqwest::Url::parse(&format!("http://{address}/logs/"))
            .map_err(|error| Unreached(error.to_string()))?;
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().push(&query.scope).push(&query.name);
        }
        {
            let mut pairs = url.query_pairs_mut();
            if let Some(replica) = &query.replica {
                pairs.append_pair("replica", replica);
            }
            if let Some(release) = query.release {
                pairs.append_pair("release", &release.to_string());
            }
            if let Some(since) = query.since {
                pairs.append_pair("since", &since.to_string());
            }
            if let Some(tail) = query.tail {
                pairs.append_pair("tail", &tail.to_string());
            }
            if query.follow {
                pairs.append_pair("follow", "true");
            }
        }
        let mut request = client.get(url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = match request.send() {
            Ok(response) => response,
            Err(error) if first && error.is_connect() => return Err(Unreached(error.to_string())),
            Err(error) => {
                eprintln!("voodu-agent: the agent at {address}: {error}");
                return Ok(ExitCode::from(1));
            }
        };
        first = false;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().unwrap_or_default();
            eprintln!(
                "voodu-agent: the agent at {address} answered {status}: {}",
                Esc(text.trim())
            );
            return Ok(ExitCode::from(1));
        }
        let mut last = None;
        for line in BufReader::new(response).lines() {
            let Ok(line) = line else { break };
            // The agent escaped every line; escaping again changes nothing that is clean.
            println!("{}", Esc(&line));
            last = Some(crate::store::now_unix());
        }
        if !query.follow {
            return Ok(ExitCode::SUCCESS);
        }
        // The agent ended the stream (its connection lifetime): go on from the last second.
        query.since = Some(last.unwrap_or_else(crate::store::now_unix));
        query.tail = None;
    }
}

/// Streams the query from the engine itself, masking what state.db and the identities give.
fn from_engine(
    data_dir: &Path,
    identities: &[PathBuf],
    query: LogQuery,
) -> anyhow::Result<ExitCode> {
    let store = Arc::new(super::open_store(data_dir, super::Access::ReadOnly)?);
    let agent_id = store.agent_id()?;
    let keyring =
        Arc::new(crate::assets::sops::Keyring::load(identities).map_err(anyhow::Error::msg)?);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let engine = crate::runtime::DockerRuntime::connect()
            .await
            .context("no agent answers and the container engine cannot be reached")?;
        let follower = Follower::new(Arc::new(engine), store, agent_id, keyring);
        let mut lines = follower.open(query);
        while let Some(item) = lines.next().await {
            match item {
                LogItem::Line(line) => println!("{} | {}", line.source, line.text),
                LogItem::Note(note) => println!("-- {note}"),
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
