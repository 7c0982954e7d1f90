//! A fleet of agents on one repository: `--host` / `--host-label` (which host an agent is,
//! shared by the agent, `plan` and `validate`) and `voodu-agent fleet status`, one table of
//! many agents' `GET /status`.
//!
//! The fleet file lists the agents, one a line: `NAME URL [TOKEN_FILE]` (`#` starts a
//! comment; a relative token file is read from the fleet file's directory). The token is the
//! agent's webhook secret, sent as `Authorization: Bearer` as the agent asks off loopback.
//!
//! Invariants: everything read is bounded (the fleet file, its agents, each token file,
//! each answer's body) and every request has a deadline, so one agent that hangs or answers
//! without end costs its row, never the command; at most `PARALLEL` requests run at once;
//! tokens are never printed (errors name the token file, never its content), and text an
//! agent sends is printed without control characters.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

use crate::http::status::CommitOutcome;
use crate::model::HostSelection;
use crate::model::hosts::{check_name, host_name_of_machine};

/// Which host of a fleet this is (README "Fleet"). Used by the agent, `plan` and `validate`.
#[derive(Debug, Args, Default)]
#[command(next_help_heading = "Fleet")]
pub(super) struct HostArgs {
    /// This host's name in a fleet: besides the shared manifests, it applies those under
    /// `hosts/NAME/` (and no other host's). A DNS label. Default: the machine's host name
    /// (lowercased, up to the first dot).
    #[arg(long, env = "VOODU_HOST", value_name = "NAME")]
    host: Option<String>,
    /// A label of this host (repeatable): it also applies the manifests under
    /// `labels/LABEL/`.
    #[arg(
        long = "host-label",
        env = "VOODU_HOST_LABEL",
        value_name = "LABEL",
        value_delimiter = ','
    )]
    host_labels: Vec<String>,
}

impl HostArgs {
    /// Whether `--host` or `--host-label` was given.
    pub(super) fn given(&self) -> bool {
        self.host.is_some() || !self.host_labels.is_empty()
    }

    /// The selection of `--host` (else `default`, else the machine's host name) with the
    /// labels.
    pub(super) fn to_selection(&self, default: Option<&str>) -> anyhow::Result<HostSelection> {
        let name = match (&self.host, default) {
            (Some(name), _) => name.clone(),
            (None, Some(name)) => name.to_owned(),
            (None, None) => machine_host_name()?,
        };
        HostSelection::for_host(&name, &self.host_labels)
            .map_err(|problem| anyhow::anyhow!("{problem}"))
    }
}

/// The machine's host name as a fleet host name.
fn machine_host_name() -> anyhow::Result<String> {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that much.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    anyhow::ensure!(
        result == 0,
        "cannot read this machine's host name ({}); pass --host NAME",
        std::io::Error::last_os_error()
    );
    let end = buffer
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(buffer.len());
    let reported = String::from_utf8_lossy(&buffer[..end]).into_owned();
    host_name_of_machine(&reported).with_context(|| {
        format!(
            "this machine's host name {reported:?} is not a DNS label (a-z, 0-9, '-'); pass --host NAME"
        )
    })
}

#[derive(Debug, Args)]
pub(super) struct FleetArgs {
    #[command(subcommand)]
    command: FleetCommand,
}

#[derive(Debug, Subcommand)]
enum FleetCommand {
    /// One table of many agents' status: which host runs which commit, which is degraded,
    /// which rejected its latest commit, which is behind, which does not answer.
    Status(FleetStatusArgs),
}

#[derive(Debug, Args)]
struct FleetStatusArgs {
    /// The fleet file: one agent a line, `NAME URL [TOKEN_FILE]` (`#` comments). The token
    /// file holds the agent's webhook secret (needed when it listens off loopback).
    #[arg(long, value_name = "FILE")]
    agents: PathBuf,
    /// Give up on an agent that has not answered after this long.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(args: &FleetArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        FleetCommand::Status(status) => run_status(status),
    }
}

/// The largest fleet file read, in bytes.
const MAX_FLEET_FILE_BYTES: u64 = 1024 * 1024;
/// At most this many agents in one fleet file.
pub(super) const MAX_AGENTS: usize = 1000;
/// The largest token file read, in bytes.
const MAX_TOKEN_BYTES: u64 = 4096;
/// The largest status document read from one agent, in bytes.
const MAX_STATUS_BYTES: usize = 32 * 1024 * 1024;
/// Requests in flight at once.
const PARALLEL: usize = 16;
/// At most this many names of not-ready resources are listed per agent.
const MAX_LISTED: usize = 5;

/// One agent of the fleet file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    name: String,
    /// The base URL, without a trailing `/`.
    url: String,
    token_file: Option<PathBuf>,
}

/// Reads a file of at most `limit` bytes.
fn read_bounded(path: &Path, limit: u64, what: &str) -> anyhow::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    anyhow::ensure!(
        bytes.len() as u64 <= limit,
        "{what} {} is larger than {limit} bytes",
        path.display()
    );
    Ok(bytes)
}

/// Parses a fleet file; every problem as `path:line: message`.
fn parse_fleet(path: &Path, text: &str) -> anyhow::Result<Vec<Member>> {
    let base = path.parent().unwrap_or(Path::new("."));
    let mut members: Vec<Member> = Vec::new();
    let mut problems = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let at = format!("{}:{}", path.display(), index + 1);
        let line = line.split_once('#').map_or(line, |(before, _)| before);
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.is_empty() {
            continue;
        }
        if !(2..=3).contains(&fields.len()) {
            problems.push(format!(
                "{at}: expected `NAME URL [TOKEN_FILE]`, found {} field(s)",
                fields.len()
            ));
            continue;
        }
        let name = fields[0];
        if let Err(problem) = check_name("agent name", name) {
            problems.push(format!("{at}: {problem}"));
            continue;
        }
        if members.iter().any(|member| member.name == name) {
            problems.push(format!("{at}: agent {name} is listed twice"));
            continue;
        }
        let url = fields[1].trim_end_matches('/');
        let valid_url = reqwest::Url::parse(url).is_ok_and(|parsed| {
            matches!(parsed.scheme(), "http" | "https")
                && parsed.host_str().is_some()
                && parsed.query().is_none()
                && parsed.username().is_empty()
                && parsed.password().is_none()
        });
        if !valid_url {
            problems.push(format!(
                "{at}: {url:?} is not an http:// or https:// base URL of an agent (e.g. http://10.0.0.5:8687)"
            ));
            continue;
        }
        if members.len() == MAX_AGENTS {
            problems.push(format!(
                "{at}: more than {MAX_AGENTS} agents in one fleet file"
            ));
            break;
        }
        members.push(Member {
            name: name.to_owned(),
            url: url.to_owned(),
            token_file: fields.get(2).map(|file| base.join(file)),
        });
    }
    if !problems.is_empty() {
        anyhow::bail!("{}", problems.join("\n"));
    }
    anyhow::ensure!(
        !members.is_empty(),
        "{} lists no agent (one a line: NAME URL [TOKEN_FILE])",
        path.display()
    );
    Ok(members)
}

/// The parts of an agent's status document the fleet table needs (`http::status`); unknown
/// fields are ignored, so agents of other versions still answer.
#[derive(Debug, Default, Deserialize)]
struct Remote {
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    host_labels: Vec<String>,
    /// The agent's commits and fetch (of its one repository).
    #[serde(flatten)]
    commits: RemoteCommits,
    #[serde(default)]
    engine: Option<RemoteHealth>,
    #[serde(default)]
    resources: Vec<RemoteResource>,
    /// An agent following several repositories (`--sources`): each one's commits and fetch.
    #[serde(default)]
    sources: Vec<RemoteSource>,
    /// Its branch previews.
    #[serde(default)]
    previews: Vec<RemotePreview>,
}

/// A branch preview, as `/status` lists it.
#[derive(Debug, Clone, Default, Deserialize)]
struct RemotePreview {
    #[serde(default)]
    source: String,
    #[serde(default)]
    slug: String,
    #[serde(default)]
    state: String,
}

#[derive(Debug, Default, Deserialize)]
struct RemoteSource {
    name: String,
    #[serde(flatten)]
    commits: RemoteCommits,
}

/// What an agent (or one of its sources) last saw, applied and rejected, and its fetch.
#[derive(Debug, Default, Deserialize)]
struct RemoteCommits {
    #[serde(default)]
    last_seen: Option<RemoteCommit>,
    #[serde(default)]
    last_applied: Option<RemoteCommit>,
    #[serde(default)]
    last_rejected: Option<RemoteCommit>,
    #[serde(default)]
    fetch: Option<RemoteHealth>,
}

#[derive(Debug, Clone, Deserialize)]
struct RemoteCommit {
    sha: String,
    /// `None` when absent, or a text this build does not know (an agent of another version).
    #[serde(default, deserialize_with = "known_outcome")]
    outcome: Option<CommitOutcome>,
    #[serde(default)]
    seen_at: i64,
    #[serde(default)]
    errors: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct RemoteHealth {
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RemoteResource {
    kind: String,
    scope: String,
    name: String,
    phase: String,
    #[serde(default)]
    source: Option<String>,
}

/// At most this many sources of one agent get a row each: as many as an agent follows.
const MAX_SOURCES_PER_AGENT: usize = crate::agent::sources::MAX_SOURCES;

/// An agent following several repositories is one row per source (`AGENT/SOURCE`), each with
/// that source's commits, fetch and resources, compared with the rows of the same source
/// name (the third list: each row's source, `""` for an agent of one repository).
fn per_source(
    members: &[Member],
    answers: Vec<Result<Remote, String>>,
) -> (Vec<Member>, Vec<Result<Remote, String>>, Vec<String>) {
    let (mut rows, mut remotes, mut groups) = (Vec::new(), Vec::new(), Vec::new());
    for (member, answer) in members.iter().zip(answers) {
        let mut remote = match answer {
            Ok(remote) if !remote.sources.is_empty() => remote,
            other => {
                rows.push(member.clone());
                remotes.push(other);
                groups.push(String::new());
                continue;
            }
        };
        let sources = std::mem::take(&mut remote.sources);
        let resources = std::mem::take(&mut remote.resources);
        for source in sources.into_iter().take(MAX_SOURCES_PER_AGENT) {
            let name = clean(&source.name, 32);
            rows.push(Member {
                name: format!("{}/{name}", member.name),
                ..member.clone()
            });
            remotes.push(Ok(Remote {
                host: remote.host.clone(),
                host_labels: remote.host_labels.clone(),
                commits: source.commits,
                engine: remote.engine.as_ref().map(|engine| RemoteHealth {
                    error: engine.error.clone(),
                }),
                resources: resources
                    .iter()
                    .filter(|resource| resource.source.as_deref() == Some(source.name.as_str()))
                    .map(|resource| RemoteResource {
                        kind: resource.kind.clone(),
                        scope: resource.scope.clone(),
                        name: resource.name.clone(),
                        phase: resource.phase.clone(),
                        source: resource.source.clone(),
                    })
                    .collect(),
                sources: Vec::new(),
                previews: remote
                    .previews
                    .iter()
                    .filter(|preview| preview.source == source.name)
                    .cloned()
                    .collect(),
            }));
            groups.push(source.name);
        }
    }
    (rows, remotes, groups)
}

/// A commit's `outcome` as [`CommitOutcome::parse`] reads it: an unknown text is no outcome,
/// not an unreadable agent.
fn known_outcome<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<CommitOutcome>, D::Error> {
    let text = String::deserialize(deserializer)?;
    Ok(CommitOutcome::parse(&text))
}

/// What `fleet status` makes of an agent: the first that applies, from the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum AgentState {
    Ok,
    Progressing,
    Degraded,
    Behind,
    Rejected,
    Unreachable,
}

impl AgentState {
    fn as_str(self) -> &'static str {
        match self {
            AgentState::Ok => "ok",
            AgentState::Progressing => "progressing",
            AgentState::Degraded => "degraded",
            AgentState::Behind => "behind",
            AgentState::Rejected => "rejected",
            AgentState::Unreachable => "unreachable",
        }
    }
}

/// One row of `fleet status`, and the JSON of one agent.
#[derive(Debug, Serialize)]
struct AgentRow {
    name: String,
    url: String,
    state: AgentState,
    /// The host the agent says it is (`--host`), and its labels.
    host: Option<String>,
    host_labels: Vec<String>,
    applied: Option<String>,
    /// The branch tip the agent last fetched.
    seen: Option<String>,
    seen_at: Option<i64>,
    /// Whether `seen` is not the newest commit any agent of the fleet has seen.
    behind: bool,
    /// The latest commit was rejected: its SHA and its errors (the host runs `applied`).
    rejected: Option<RejectedView>,
    resources: usize,
    /// Resources neither ready nor progressing (`kind/scope/name`), at most a few.
    degraded: Vec<String>,
    n_degraded: usize,
    /// Its branch previews (`slug (state)`), at most a few, and how many there are.
    previews: Vec<String>,
    n_previews: usize,
    n_progressing: usize,
    /// Why the agent could not be read, or what is wrong around it (fetch, engine).
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct RejectedView {
    sha: String,
    errors: Vec<String>,
}

#[derive(Debug, Serialize)]
struct FleetView {
    /// The newest commit any agent has seen (by when it saw it).
    newest: Option<String>,
    agents: Vec<AgentRow>,
}

fn run_status(args: &FleetStatusArgs) -> anyhow::Result<ExitCode> {
    let bytes = read_bounded(&args.agents, MAX_FLEET_FILE_BYTES, "fleet file")?;
    let text = String::from_utf8(bytes)
        .with_context(|| format!("fleet file {} is not UTF-8", args.agents.display()))?;
    let members = parse_fleet(&args.agents, &text)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let answers = runtime.block_on(fetch_all(&members, args.timeout))?;
    let (members, answers, groups) = per_source(&members, answers);
    let view = fleet_view(&members, answers, &groups);
    super::print_view(args.json, &view, |view| print!("{}", table(view)))
}

/// Every member's status document (or why not), in the members' order, `PARALLEL` at once.
async fn fetch_all(
    members: &[Member],
    timeout: Duration,
) -> anyhow::Result<Vec<Result<Remote, String>>> {
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(crate::model::tls::client_config().map_err(anyhow::Error::msg)?)
        .user_agent(concat!("voodu-agent/", env!("CARGO_PKG_VERSION"), " fleet"))
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .build()
        .context("cannot build an HTTP client")?;
    let semaphore = tokio::sync::Semaphore::new(PARALLEL);
    let requests = members.iter().map(|member| {
        let (client, semaphore) = (&client, &semaphore);
        async move {
            let _permit = semaphore
                .acquire()
                .await
                .map_err(|error| error.to_string())?;
            // The whole exchange, body included, within the deadline.
            tokio::time::timeout(timeout, fetch_one(client, member))
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "no answer within {}",
                        humantime::format_duration(timeout)
                    ))
                })
        }
    });
    Ok(futures_util::future::join_all(requests).await)
}

/// One agent's `GET /status`.
async fn fetch_one(client: &reqwest::Client, member: &Member) -> Result<Remote, String> {
    let mut request = client.get(format!("{}/status", member.url));
    if let Some(file) = &member.token_file {
        let bytes = read_bounded(file, MAX_TOKEN_BYTES, "token file")
            .map_err(|error| format!("{error:#}"))?;
        let token = String::from_utf8(bytes)
            .map_err(|_| format!("token file {} is not UTF-8", file.display()))?;
        let token = token.trim();
        if token.is_empty() {
            return Err(format!("token file {} is empty", file.display()));
        }
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| {
                format!(
                    "token file {} holds characters a header cannot carry",
                    file.display()
                )
            })?;
        value.set_sensitive(true);
        request = request.header(reqwest::header::AUTHORIZATION, value);
    }
    let mut response = request
        .send()
        .await
        .map_err(|error| request_error(&error))?;
    let status = response.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(match &member.token_file {
            Some(file) => format!("401: the agent refused the token in {}", file.display()),
            None => {
                "401: the agent listens off loopback and needs its webhook secret: add a TOKEN_FILE"
                    .to_owned()
            }
        });
    }
    if !status.is_success() {
        return Err(format!("GET /status answered {status}"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| request_error(&error))?
    {
        if body.len() + chunk.len() > MAX_STATUS_BYTES {
            return Err(format!(
                "the status document is larger than {MAX_STATUS_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body)
        .map_err(|error| format!("not a voodu-agent status document: {error}"))
}

/// A request error with its causes, without the URL's secrets (there are none: tokens go in
/// a header) and without reqwest's repetition of the URL.
fn request_error(error: &reqwest::Error) -> String {
    crate::base::request_error_text(error, "timed out", false)
}

/// Text from an agent, safe to print: control characters replaced, at most `max` characters.
fn clean(text: &str, max: usize) -> String {
    let mut cleaned: String = text
        .chars()
        .take(max)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().count() > max {
        cleaned.push('…');
    }
    cleaned
}

/// The rows of `members`; `groups[i]` is the source of row `i` (`""`: an agent of one
/// repository): a row is behind when it has not seen the newest commit of its group.
fn fleet_view(
    members: &[Member],
    answers: Vec<Result<Remote, String>>,
    groups: &[String],
) -> FleetView {
    // The newest commit any agent saw of a group: the latest `seen_at` (clocks of a fleet are
    // assumed roughly in step; a tie goes to the SHA more agents saw).
    let newest_of = |group: &str| {
        let seen_in_group = || {
            answers
                .iter()
                .zip(groups)
                .filter(move |(_, other)| other.as_str() == group)
                .filter_map(|(answer, _)| answer.as_ref().ok()?.commits.last_seen.as_ref())
        };
        seen_in_group()
            .max_by_key(|seen| {
                let count = seen_in_group()
                    .filter(|other| other.sha == seen.sha)
                    .count();
                (seen.seen_at, count)
            })
            .map(|seen| seen.sha.clone())
    };
    let newest: Vec<Option<String>> = groups.iter().map(|group| newest_of(group)).collect();
    let overall = newest_of("");
    let agents = members
        .iter()
        .zip(answers)
        .zip(&newest)
        .map(|((member, answer), newest)| row(member, answer, newest.as_deref()))
        .collect();
    FleetView {
        newest: overall.map(|sha| clean(&sha, 64)),
        agents,
    }
}

fn row(member: &Member, answer: Result<Remote, String>, newest: Option<&str>) -> AgentRow {
    let mut row = AgentRow {
        name: member.name.clone(),
        url: member.url.clone(),
        state: AgentState::Unreachable,
        host: None,
        host_labels: Vec::new(),
        applied: None,
        seen: None,
        seen_at: None,
        behind: false,
        rejected: None,
        resources: 0,
        degraded: Vec::new(),
        n_degraded: 0,
        n_progressing: 0,
        previews: Vec::new(),
        n_previews: 0,
        error: None,
    };
    let remote = match answer {
        Ok(remote) => remote,
        Err(error) => {
            row.error = Some(clean(&error, 300));
            return row;
        }
    };
    row.host = remote.host.as_deref().map(|host| clean(host, 63));
    row.host_labels = remote
        .host_labels
        .iter()
        .take(32)
        .map(|label| clean(label, 63))
        .collect();
    row.applied = remote
        .commits
        .last_applied
        .as_ref()
        .map(|commit| clean(&commit.sha, 64));
    row.seen = remote
        .commits
        .last_seen
        .as_ref()
        .map(|commit| clean(&commit.sha, 64));
    row.seen_at = remote
        .commits
        .last_seen
        .as_ref()
        .map(|commit| commit.seen_at);
    row.behind = match (newest, &remote.commits.last_seen) {
        (Some(newest), Some(seen)) => seen.sha != newest,
        (Some(_), None) => true,
        (None, _) => false,
    };
    // The latest commit it saw was rejected: it runs an older one.
    // (The same SHA applied since, under a looser policy say, is not rejected.)
    if let (Some(rejected), Some(seen)) = (&remote.commits.last_rejected, &remote.commits.last_seen)
        && rejected.sha == seen.sha
        && seen.outcome != Some(CommitOutcome::Applied)
    {
        row.rejected = Some(RejectedView {
            sha: clean(&rejected.sha, 64),
            errors: rejected
                .errors
                .iter()
                .take(MAX_LISTED)
                .map(|error| clean(error, 300))
                .collect(),
        });
    }
    row.n_previews = remote.previews.len();
    row.previews = remote
        .previews
        .iter()
        .take(MAX_LISTED)
        .map(|preview| clean(&format!("{} ({})", preview.slug, preview.state), 80))
        .collect();
    row.resources = remote.resources.len();
    for resource in &remote.resources {
        match resource.phase.as_str() {
            "Ready" => {}
            "Progressing" => row.n_progressing += 1,
            _ => {
                row.n_degraded += 1;
                if row.degraded.len() < MAX_LISTED {
                    row.degraded.push(clean(
                        &format!("{}/{}/{}", resource.kind, resource.scope, resource.name),
                        200,
                    ));
                }
            }
        }
    }
    let mut problems = Vec::new();
    if let Some(error) = remote
        .commits
        .fetch
        .as_ref()
        .and_then(|fetch| fetch.error.as_deref())
    {
        problems.push(format!("fetch failing: {}", clean(error, 200)));
    }
    if let Some(error) = remote
        .engine
        .as_ref()
        .and_then(|engine| engine.error.as_deref())
    {
        problems.push(format!("engine unreachable: {}", clean(error, 200)));
    }
    if let Some(host) = &row.host
        && *host != member.name
    {
        problems.push(format!("reports host {host}"));
    }
    row.error = (!problems.is_empty()).then(|| problems.join("; "));
    row.state = if row.rejected.is_some() {
        AgentState::Rejected
    } else if row.behind {
        AgentState::Behind
    } else if row.n_degraded > 0 {
        AgentState::Degraded
    } else if row.n_progressing > 0 {
        AgentState::Progressing
    } else {
        AgentState::Ok
    };
    row
}

fn short(sha: Option<&String>) -> String {
    sha.map_or_else(|| "-".to_owned(), |sha| sha.chars().take(12).collect())
}

/// The table `fleet status` prints; what the agents answered is escaped (`model::text`).
fn table(view: &FleetView) -> String {
    use crate::model::text::Esc;
    let mut out = format!(
        "{:<20} {:<20} {:<12} {:<12} {:<12} {:>9} {:>8}  NOTE\n",
        "AGENT", "HOST", "STATE", "APPLIED", "SEEN", "RESOURCES", "DEGRADED"
    );
    for agent in &view.agents {
        let note = match (&agent.rejected, &agent.error) {
            (Some(rejected), _) => format!(
                "rejected {}: {}",
                short(Some(&rejected.sha)),
                rejected.errors.first().map_or("", String::as_str)
            ),
            (None, Some(error)) => error.clone(),
            (None, None) if !agent.degraded.is_empty() => agent.degraded.join(", "),
            (None, None) => String::new(),
        };
        let note = match (&agent.rejected, &agent.error) {
            (Some(_), Some(error)) => format!("{note}; {error}"),
            _ => note,
        };
        let note = match agent.n_previews {
            0 => note,
            n => {
                let more = n.saturating_sub(agent.previews.len());
                let listed = agent.previews.join(", ");
                let previews = if more > 0 {
                    format!("previews: {listed} and {more} more")
                } else {
                    format!("previews: {listed}")
                };
                if note.is_empty() {
                    previews
                } else {
                    format!("{note}; {previews}")
                }
            }
        };
        out.push_str(&format!(
            "{:<20} {:<20} {:<12} {:<12} {:<12} {:>9} {:>8}  {}\n",
            Esc(&agent.name),
            Esc(agent.host.as_deref().unwrap_or("-")),
            Esc(agent.state.as_str()),
            Esc(&short(agent.applied.as_ref())),
            Esc(&short(agent.seen.as_ref())),
            agent.resources,
            agent.n_degraded,
            Esc(&note),
        ));
    }
    let count = |state: AgentState| {
        view.agents
            .iter()
            .filter(|agent| agent.state == state)
            .count()
    };
    out.push_str(&format!(
        "\n{} agents: {} ok, {} progressing, {} degraded, {} behind, {} rejected, {} unreachable; newest commit seen: {}\n",
        view.agents.len(),
        count(AgentState::Ok),
        count(AgentState::Progressing),
        count(AgentState::Degraded),
        count(AgentState::Behind),
        count(AgentState::Rejected),
        count(AgentState::Unreachable),
        Esc(&short(view.newest.as_ref())),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleet_file_lists_agents_and_every_mistake_is_reported_at_its_line() -> anyhow::Result<()> {
        let path = Path::new("/etc/voodu/fleet");
        let members = parse_fleet(
            path,
            "# the fleet\nweb-1 http://10.0.0.1:8687/ web-1.token\n\n  db  https://db.example:8443  # no token\n",
        )?;
        assert_eq!(
            members,
            [
                Member {
                    name: "web-1".into(),
                    url: "http://10.0.0.1:8687".into(),
                    token_file: Some(PathBuf::from("/etc/voodu/web-1.token")),
                },
                Member {
                    name: "db".into(),
                    url: "https://db.example:8443".into(),
                    token_file: None,
                },
            ]
        );
        let error = parse_fleet(
            path,
            "Web_1 http://a:1\nweb http://a:1\nweb http://b:1\nx ftp://a\ny http://u:p@a:1\nz\n",
        )
        .err()
        .map(|error| error.to_string())
        .unwrap_or_default();
        let lines: Vec<&str> = error.lines().collect();
        assert_eq!(lines.len(), 5, "{error}");
        assert!(
            lines[0].starts_with("/etc/voodu/fleet:1: agent name \"Web_1\" is not a DNS label"),
            "{error}"
        );
        assert_eq!(lines[1], "/etc/voodu/fleet:3: agent web is listed twice");
        assert!(
            lines[2].starts_with("/etc/voodu/fleet:4: \"ftp://a\" is not an http"),
            "{error}"
        );
        assert!(lines[3].starts_with("/etc/voodu/fleet:5: "), "{error}");
        assert_eq!(
            lines[4],
            "/etc/voodu/fleet:6: expected `NAME URL [TOKEN_FILE]`, found 1 field(s)"
        );
        assert!(parse_fleet(path, "# nothing\n").is_err());
        let many: String = (0..=MAX_AGENTS)
            .map(|n| format!("a{n} http://h:1\n"))
            .collect();
        assert!(parse_fleet(path, &many).is_err());
        Ok(())
    }

    fn remote(seen: (&str, i64), applied: &str, rejected: bool, phases: &[&str]) -> Remote {
        let commit = |sha: &str, at: i64| RemoteCommit {
            sha: sha.to_owned(),
            outcome: Some(if rejected {
                CommitOutcome::Rejected
            } else {
                CommitOutcome::Applied
            }),
            seen_at: at,
            errors: vec!["hosts/x/bad.hcl:1:1: unknown block \x1b[31m".to_owned()],
        };
        Remote {
            host: Some("h".into()),
            commits: RemoteCommits {
                last_seen: Some(commit(seen.0, seen.1)),
                last_applied: Some(commit(applied, 0)),
                last_rejected: rejected.then(|| commit(seen.0, seen.1)),
                fetch: None,
            },
            resources: phases
                .iter()
                .enumerate()
                .map(|(index, phase)| RemoteResource {
                    kind: "deployment".into(),
                    scope: "s".into(),
                    name: format!("r{index}"),
                    phase: (*phase).to_owned(),
                    source: None,
                })
                .collect(),
            ..Remote::default()
        }
    }

    #[test]
    fn a_rejected_commit_applied_since_is_not_rejected() {
        let member = Member {
            name: "h".into(),
            url: "http://x:1".into(),
            token_file: None,
        };
        // Rejected under the default policy, then applied once the host allowed it: the last
        // seen record is the applied one, for the same SHA.
        let mut answer = remote(("new", 20), "new", false, &["Ready"]);
        answer.commits.last_rejected = Some(RemoteCommit {
            sha: "new".into(),
            outcome: Some(CommitOutcome::Rejected),
            seen_at: 10,
            errors: vec!["web.hcl:4:3: privileged containers are refused".into()],
        });
        let view = fleet_view(&[member], vec![Ok(answer)], &[String::new()]);
        assert_eq!(view.agents[0].state, AgentState::Ok);
        assert!(view.agents[0].rejected.is_none());
    }

    #[test]
    fn a_commit_outcome_reads_as_the_status_writes_it_and_an_unknown_one_is_no_outcome()
    -> anyhow::Result<()> {
        for outcome in [CommitOutcome::Applied, CommitOutcome::Rejected] {
            // What `GET /status` of this build writes…
            let written = serde_json::to_value(outcome)?;
            assert_eq!(written, outcome.as_str());
            // …is what `fleet status` reads back.
            let read: RemoteCommit = serde_json::from_value(serde_json::json!({
                "sha": "abc", "outcome": written,
            }))?;
            assert_eq!(read.outcome, Some(outcome));
        }
        assert_eq!(serde_json::to_value(CommitOutcome::Applied)?, "applied");
        assert_eq!(serde_json::to_value(CommitOutcome::Rejected)?, "rejected");
        // An agent of another version: an outcome this build does not know, or none, is no
        // outcome; the agent's row is still read.
        for body in [
            r#"{"sha": "abc", "outcome": "quarantined"}"#,
            r#"{"sha": "abc", "outcome": ""}"#,
            r#"{"sha": "abc"}"#,
        ] {
            let read: RemoteCommit = serde_json::from_str(body)?;
            assert_eq!(read.outcome, None, "{body}");
        }
        Ok(())
    }

    #[test]
    fn the_json_of_a_row_names_its_state_as_before() -> anyhow::Result<()> {
        let states = [
            AgentState::Ok,
            AgentState::Progressing,
            AgentState::Degraded,
            AgentState::Behind,
            AgentState::Rejected,
            AgentState::Unreachable,
        ];
        let texts = [
            "ok",
            "progressing",
            "degraded",
            "behind",
            "rejected",
            "unreachable",
        ];
        for (state, text) in states.into_iter().zip(texts) {
            assert_eq!(state.as_str(), text);
            assert_eq!(serde_json::to_value(state)?, text);
        }
        Ok(())
    }

    #[test]
    fn each_agent_gets_the_first_state_that_applies() {
        let member = |name: &str| Member {
            name: name.into(),
            url: "http://x:1".into(),
            token_file: None,
        };
        let members: Vec<Member> = ["a", "b", "c", "d", "e", "h"]
            .iter()
            .map(|name| member(name))
            .collect();
        let answers = vec![
            Ok(remote(("new", 20), "new", false, &["Ready", "Ready"])),
            Ok(remote(("old", 10), "old", false, &["Ready"])),
            Ok(remote(("new", 21), "old", true, &["Ready"])),
            Ok(remote(
                ("new", 22),
                "new",
                false,
                &["Ready", "Failed", "Progressing"],
            )),
            Err("cannot connect: Connection refused".to_owned()),
            Ok(remote(("new", 20), "new", false, &["Progressing"])),
        ];
        let groups = vec![String::new(); members.len()];
        let view = fleet_view(&members, answers, &groups);
        assert_eq!(view.newest.as_deref(), Some("new"));
        let states: Vec<&str> = view
            .agents
            .iter()
            .map(|agent| agent.state.as_str())
            .collect();
        assert_eq!(
            states,
            [
                "ok",
                "behind",
                "rejected",
                "degraded",
                "unreachable",
                "progressing"
            ]
        );
        assert_eq!(view.agents[3].degraded, ["deployment/s/r1"]);
        // Escape sequences an agent sends are not printed as such.
        let rejected = view.agents[2]
            .rejected
            .as_ref()
            .map(|rejected| rejected.errors.join(""));
        assert_eq!(
            rejected.as_deref(),
            Some("hosts/x/bad.hcl:1:1: unknown block  [31m")
        );
        // An agent whose host is not its fleet name says so.
        assert_eq!(view.agents[0].error.as_deref(), Some("reports host h"));
        let text = table(&view);
        assert!(text.contains("6 agents: 1 ok, 1 progressing, 1 degraded, 1 behind, 1 rejected, 1 unreachable; newest commit seen: new"), "{text}");
    }

    /// An agent following several repositories is a row per source, each judged against the
    /// same source on the other agents.
    #[test]
    fn an_agent_with_several_sources_is_a_row_per_source() -> anyhow::Result<()> {
        let member = |name: &str| Member {
            name: name.to_owned(),
            url: format!("http://{name}"),
            token_file: None,
        };
        let document = |shop_seen: &str, shop_seen_at: i64| -> anyhow::Result<Remote> {
            Ok(serde_json::from_value(serde_json::json!({
                "host": null,
                "sources": [
                    { "name": "shop", "last_seen": { "sha": shop_seen, "outcome": "applied", "seen_at": shop_seen_at },
                      "last_applied": { "sha": shop_seen, "outcome": "applied", "seen_at": shop_seen_at } },
                    { "name": "blog", "last_seen": { "sha": "b1", "outcome": "rejected", "seen_at": 5 },
                      "last_applied": { "sha": "b0", "outcome": "applied", "seen_at": 1 },
                      "last_rejected": { "sha": "b1", "outcome": "rejected", "seen_at": 5, "errors": ["blog.hcl:1:1: no"] },
                      "fetch": { "error": "unreachable" } }
                ],
                "resources": [
                    { "kind": "deployment", "scope": "shop", "name": "web", "phase": "Ready", "source": "shop" },
                    { "kind": "deployment", "scope": "blog", "name": "web", "phase": "Failed", "source": "blog" }
                ],
                "previews": [
                    { "source": "shop", "slug": "feat-x", "state": "live", "branch": "preview/feat-x" }
                ]
            }))?)
        };
        let members = [member("one"), member("two")];
        let answers = vec![Ok(document("s2", 10)?), Ok(document("s1", 3)?)];
        let (rows, answers, groups) = per_source(&members, answers);
        let view = fleet_view(&rows, answers, &groups);
        let states: Vec<(&str, &str)> = view
            .agents
            .iter()
            .map(|agent| (agent.name.as_str(), agent.state.as_str()))
            .collect();
        // A source's previews are on its row.
        assert_eq!(view.agents[0].previews, ["feat-x (live)"]);
        assert!(view.agents[1].previews.is_empty());
        assert!(table(&view).contains("previews: feat-x (live)"));
        assert_eq!(
            states,
            vec![
                ("one/shop", "ok"),
                ("one/blog", "rejected"),
                ("two/shop", "behind"),
                ("two/blog", "rejected"),
            ]
        );
        assert_eq!(view.agents[0].resources, 1);
        assert!(
            view.agents[1]
                .error
                .as_deref()
                .is_some_and(|error| error.contains("fetch failing: unreachable"))
        );
        Ok(())
    }
}
