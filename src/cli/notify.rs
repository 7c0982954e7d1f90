//! `voodu-agent notify test NAME --notify FILE`: sends one `notify.test` message to one sink
//! of a notify file, outside the outbox, and says whether the sink took it (exit 0) or why
//! not (exit 1). The secrets are read from the files the sink names, as the agent does.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::model::text::escape;
use crate::notify::NotifyConfig;

#[derive(Debug, Args)]
pub(super) struct NotifyArgs {
    #[command(subcommand)]
    command: NotifyCommand,
}

#[derive(Debug, Subcommand)]
enum NotifyCommand {
    /// Send a test message to the sink NAME of the notify file.
    Test {
        /// The sink: a `notify "NAME"` block of the file.
        name: String,
        /// The notify file (as `--notify` of the agent).
        #[arg(long, env = "VOODU_NOTIFY", value_name = "FILE")]
        notify: PathBuf,
        /// How long the sink has to answer (the agent gives each request 10s).
        #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
}

pub(super) fn run(args: &NotifyArgs) -> anyhow::Result<ExitCode> {
    let NotifyCommand::Test {
        name,
        notify,
        timeout,
    } = &args.command;
    let config = NotifyConfig::load(notify)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match runtime.block_on(crate::notify::send_test(&config, name, *timeout)) {
        Ok(message) => {
            println!("{}", escape(&message));
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("voodu-agent: {}", escape(&error.to_string()));
            Ok(ExitCode::from(1))
        }
    }
}
