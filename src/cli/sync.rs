//! `voodu-agent sync`: ask the running agent to fetch now, through its webhook endpoint in
//! the generic HMAC form (an HTTP request made with reqwest); `--wait` prints how the fetched
//! commit ended, `--json` the agent's answer as it is.
//!
//! Also the nudge `rollback` and `unpin` send, so the agent acts on their state.db change at
//! once instead of at its next poll. The agent's address and secret file come from the
//! flags, else from what the agent recorded in state.db, else `127.0.0.1:8687` unsigned.

use crate::model::text::Esc;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::agent::{META_HTTP_ADDR, META_SECRET_FILE};
use crate::http::WebhookSecret;
use crate::http::webhook::{ACTOR_HEADER, GENERIC_SIGNATURE_HEADER, HookResult, ORIGIN_HEADER};

#[derive(Debug, Args)]
pub(super) struct SyncArgs {
    /// Wait until the fetched commit is applied or rejected, and print how it ended. Applied
    /// means it reached desired state; containers converge after that (see `status`).
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long (the sync itself goes on).
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Print the agent's answer as JSON (`result`, `commit`, `reason`, `errors`).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    agent: AgentArgs,
}

/// How to reach the running agent.
#[derive(Debug, Args)]
pub(super) struct AgentArgs {
    /// The agent's HTTP address, HOST:PORT. Default: the address the agent recorded in
    /// state.db, else 127.0.0.1:8687.
    #[arg(long = "agent", value_name = "HOST:PORT")]
    address: Option<String>,
    /// Sign the request with this webhook secret. Default: the secret file the agent was
    /// started with, as recorded in state.db.
    #[arg(long = "webhook-secret-file", value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// With several repositories (`--sources`): sync only this source. Default: every one.
    #[arg(long = "source", value_name = "NAME")]
    pub(super) source: Option<String>,
}

/// The agent's answer to a nudge.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) body: serde_json::Value,
}

impl Answer {
    fn field(&self, name: &str) -> &str {
        self.body[name].as_str().unwrap_or_default()
    }
}

pub(super) fn run(data_dir: &Path, args: &SyncArgs) -> anyhow::Result<ExitCode> {
    let answer = nudge(data_dir, &args.agent, args.wait.then_some(args.timeout))?;
    let result = answer.field("result");
    // A result this build does not know (an agent of another version) is a failure.
    let known = HookResult::parse(result);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer.body)?);
        return Ok(match known {
            Some(HookResult::Accepted | HookResult::Coalesced | HookResult::Applied) => {
                ExitCode::SUCCESS
            }
            _ => ExitCode::from(1),
        });
    }
    let commit = answer.field("commit");
    let short = Esc(commit.get(..12).unwrap_or(commit));
    match known {
        Some(HookResult::Accepted | HookResult::Coalesced) => {
            println!("sync requested ({})", Esc(answer.field("reason")));
            Ok(ExitCode::SUCCESS)
        }
        Some(HookResult::Applied) => {
            println!("commit {short} applied: {}", Esc(answer.field("reason")));
            Ok(ExitCode::SUCCESS)
        }
        Some(HookResult::Rejected) => {
            println!("commit {short} rejected; the host keeps running the last applied commit:");
            for error in answer.body["errors"].as_array().into_iter().flatten() {
                println!("  {}", Esc(error.as_str().unwrap_or_default()));
            }
            Ok(ExitCode::from(1))
        }
        _ => anyhow::bail!(
            "the agent answered HTTP {} {}: {}",
            answer.status,
            Esc(result),
            Esc(answer.field("reason"))
        ),
    }
}

/// A value the agent recorded in state.db's meta (its address, its secret file); `None` when
/// there is none or the store cannot be read.
pub(super) fn recorded_meta(data_dir: &Path, key: &str) -> Option<String> {
    let store = super::open_store(data_dir, super::Access::ReadOnly).ok()?;
    store.meta(key).ok().flatten()
}

/// The running agent's HTTP address, `host:port`: `given` (`--agent`), else the one it
/// recorded, else the default listen address.
pub(super) fn agent_address(data_dir: &Path, given: Option<&str>) -> String {
    given
        .map(ToOwned::to_owned)
        .or_else(|| recorded_meta(data_dir, META_HTTP_ADDR))
        .unwrap_or_else(|| "127.0.0.1:8687".to_owned())
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

/// Asks the agent to fetch now; with `wait`, the answer says how the fetched commit ended.
/// Through the project's HTTP client (reqwest), like every other request the agent makes.
pub(super) fn nudge(
    data_dir: &Path,
    agent: &AgentArgs,
    wait: Option<Duration>,
) -> anyhow::Result<Answer> {
    let recorded = |key: &str| recorded_meta(data_dir, key);
    let address = agent_address(data_dir, agent.address.as_deref());
    let secret = match &agent.secret_file {
        Some(path) => Some(WebhookSecret::from_file(path)?),
        // A recorded file this user cannot read: go unsigned; a 401 then says what to pass.
        None => recorded(META_SECRET_FILE)
            .and_then(|path| WebhookSecret::from_file(Path::new(&path)).ok()),
    };
    let body: &'static [u8] = b"{}";
    let mut url = format!("http://{address}/hooks/git");
    if let Some(timeout) = wait {
        url.push_str(&format!("?wait=true&timeout={}s", timeout.as_secs().max(1)));
    }
    let mut url = reqwest::Url::parse(&url)
        .with_context(|| format!("agent address {address:?} is not HOST:PORT"))?;
    if let Some(source) = &agent.source {
        url.query_pairs_mut().append_pair("source", source);
    }
    let client = reqwest::blocking::Client::builder()
        .tls_backend_preconfigured(crate::model::tls::client_config().map_err(anyhow::Error::msg)?)
        .connect_timeout(Duration::from_secs(5))
        .timeout(wait.unwrap_or_default() + Duration::from_secs(15))
        .user_agent("voodu-agent-cli")
        .build()
        .context("cannot build the HTTP client")?;
    let mut request = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(ORIGIN_HEADER, "cli")
        .body(body);
    // Only printable ASCII goes into a header line; anything else names no one.
    if let Some(user) = super::cli_user()
        .filter(|user| user.len() <= 64 && user.chars().all(|c| c.is_ascii_graphic()))
    {
        request = request.header(ACTOR_HEADER, user);
    }
    if let Some(secret) = &secret {
        request = request.header(GENERIC_SIGNATURE_HEADER, secret.sign(body));
    }
    let response = request
        .send()
        .with_context(|| format!("cannot reach the agent at {address} (is it running?)"))?;
    let status = response.status().as_u16();
    let text = response
        .text()
        .with_context(|| format!("no answer from the agent at {address}"))?;
    let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    Ok(Answer { status, body })
}
