//! `voodu-agent sync`: ask the running agent to fetch now, through its webhook endpoint in
//! the generic HMAC form; `--wait` prints how the fetched commit ended.
//!
//! Also the nudge `rollback` and `unpin` send, so the agent acts on their state.db change at
//! once instead of at its next poll. The agent's address and secret file come from the
//! flags, else from what the agent recorded in state.db, else `127.0.0.1:8687` unsigned.

use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::agent::{META_HTTP_ADDR, META_SECRET_FILE};
use crate::http::WebhookSecret;
use crate::http::webhook::{ACTOR_HEADER, GENERIC_SIGNATURE_HEADER, ORIGIN_HEADER};

#[derive(Debug, Args)]
pub(super) struct SyncArgs {
    /// Wait until the fetched commit is applied or rejected, and print how it ended. Applied
    /// means it reached desired state; containers converge after that (see `status`).
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long (the sync itself goes on).
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    timeout: Duration,
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
    let commit = answer.field("commit");
    let short = &commit[..commit.len().min(12)];
    match result {
        "accepted" | "coalesced" => {
            println!("sync requested ({})", answer.field("reason"));
            Ok(ExitCode::SUCCESS)
        }
        "applied" => {
            println!("commit {short} applied: {}", answer.field("reason"));
            Ok(ExitCode::SUCCESS)
        }
        "rejected" => {
            println!("commit {short} rejected; the host keeps running the last applied commit:");
            for error in answer.body["errors"].as_array().into_iter().flatten() {
                println!("  {}", error.as_str().unwrap_or_default());
            }
            Ok(ExitCode::from(1))
        }
        _ => anyhow::bail!(
            "the agent answered HTTP {} {result}: {}",
            answer.status,
            answer.field("reason")
        ),
    }
}

/// Asks the agent to fetch now; with `wait`, the answer says how the fetched commit ended.
pub(super) fn nudge(
    data_dir: &Path,
    agent: &AgentArgs,
    wait: Option<Duration>,
) -> anyhow::Result<Answer> {
    let recorded = |key: &str| -> Option<String> {
        let store = super::open_store(data_dir, super::Access::ReadOnly).ok()?;
        store.meta(key).ok().flatten()
    };
    let address = agent
        .address
        .clone()
        .or_else(|| recorded(META_HTTP_ADDR))
        .unwrap_or_else(|| "127.0.0.1:8687".to_owned());
    let address = address
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let secret = match &agent.secret_file {
        Some(path) => Some(WebhookSecret::from_file(path)?),
        // A recorded file this user cannot read: go unsigned; a 401 then says what to pass.
        None => recorded(META_SECRET_FILE)
            .and_then(|path| WebhookSecret::from_file(Path::new(&path)).ok()),
    };
    let body = b"{}";
    let mut target = "/hooks/git".to_owned();
    if let Some(timeout) = wait {
        target.push_str(&format!("?wait=true&timeout={}s", timeout.as_secs().max(1)));
    }
    let mut request = format!(
        "POST {target} HTTP/1.0\r\nHost: {address}\r\nUser-Agent: voodu-agent-cli\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{ORIGIN_HEADER}: cli\r\n",
        body.len()
    );
    // Only printable ASCII goes into a header line; anything else names no one.
    if let Some(user) = super::cli_user()
        .filter(|user| user.len() <= 64 && user.chars().all(|c| c.is_ascii_graphic()))
    {
        request.push_str(&format!("{ACTOR_HEADER}: {user}\r\n"));
    }
    if let Some(secret) = &secret {
        request.push_str(&format!(
            "{GENERIC_SIGNATURE_HEADER}: {}\r\n",
            secret.sign(body)
        ));
    }
    request.push_str("\r\n");
    let socket_address = address
        .to_socket_addrs()
        .with_context(|| format!("agent address {address:?} is not HOST:PORT"))?
        .next()
        .with_context(|| format!("agent address {address:?} resolves to nothing"))?;
    let mut stream = TcpStream::connect_timeout(&socket_address, Duration::from_secs(5))
        .with_context(|| format!("cannot reach the agent at {address} (is it running?)"))?;
    let read_timeout = wait.unwrap_or_default() + Duration::from_secs(15);
    stream.set_read_timeout(Some(read_timeout))?;
    stream.write_all(request.as_bytes())?;
    stream.write_all(body)?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .with_context(|| format!("no answer from the agent at {address}"))?;
    parse_response(&response).with_context(|| format!("unreadable answer from {address}"))
}

/// Status code and JSON body of an HTTP/1.0 response (close-delimited or with a length).
fn parse_response(response: &[u8]) -> anyhow::Result<Answer> {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text.split_once("\r\n\r\n").context("no end of headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .context("no status code")?;
    let body = serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_owned()));
    Ok(Answer { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse_into_status_and_json() -> anyhow::Result<()> {
        let answer = parse_response(
            b"HTTP/1.0 202 Accepted\r\ncontent-type: application/json\r\n\r\n{\"result\":\"accepted\"}",
        )?;
        assert_eq!((answer.status, answer.field("result")), (202, "accepted"));
        assert!(parse_response(b"garbage").is_err());
        Ok(())
    }
}
