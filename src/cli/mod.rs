//! Command line: flags → validated config → the command, and its exit code.
//!
//! `voodu-agent --repo URL` runs the agent in the foreground; subcommands inspect its state.
//! Exit codes: 0 success, 1 error (2 is reserved for `plan --detailed-exitcode`).

mod config;
mod plan;
mod run;
mod status;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// GitOps for a Docker host: watches a git repository of voodu HCL manifests and makes the
/// local Docker engine match it.
///
/// `git push` deploys, `git revert` rolls back. Run the agent with `voodu-agent --repo URL`;
/// inspect it with `voodu-agent status`.
#[derive(Debug, Parser)]
#[command(name = "voodu-agent", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: run::RunArgs,
    /// Where the agent keeps its git mirror and state.db. Default: $VOODU_AGENT_DATA_DIR, else
    /// $XDG_STATE_HOME/voodu-agent, else ~/.local/state/voodu-agent.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the last seen, applied and rejected commits and every resource's state. Works
    /// while the agent runs.
    Status(status::StatusArgs),
    /// Edit or read the host-local config buckets: `${VAR}` values and container environment
    /// (`config set SCOPE[/NAME] KEY=VALUE…`, `get`, `unset`, `list`).
    Config(config::ConfigArgs),
    /// Show what this host would create, update, replace, delete or leave if the given
    /// manifests were applied (exit 2 with --detailed-exitcode when there are changes).
    Plan(plan::PlanArgs),
    /// Check a directory of manifests (no git, no agent needed): every problem as
    /// `path:line:col: message`. Exit 0 when the set would be accepted, 1 otherwise.
    Validate(validate::ValidateArgs),
}

/// The data dir from the flag, the environment, or the documented default.
fn data_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = flag {
        return Ok(dir);
    }
    if let Some(dir) = std::env::var_os("VOODU_AGENT_DATA_DIR").filter(|dir| !dir.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|dir| !dir.is_empty()) {
        return Ok(PathBuf::from(state).join("voodu-agent"));
    }
    match std::env::var_os("HOME").filter(|dir| !dir.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/state/voodu-agent")),
        None => anyhow::bail!("no data dir: pass --data-dir or set VOODU_AGENT_DATA_DIR"),
    }
}

/// Parses the command line and runs it. `main` is only this.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("voodu-agent: {error:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let data_dir = data_dir(cli.data_dir)?;
    match cli.command {
        Some(Command::Status(args)) => status::run(&data_dir, &args),
        Some(Command::Validate(args)) => validate::run(&args),
        Some(Command::Plan(args)) => plan::run(&args, &data_dir),
        Some(Command::Config(args)) => config::run(&args, &data_dir),
        None => run::run(cli.run, data_dir),
    }
}
