//! `voodu-agent approve SHA`: apply a commit a `deploy: manual` trigger holds. Marks the held
//! commit approved in state.db (`Store::approve`, one transaction, recorded in the activity
//! log), then nudges the running agent, which applies exactly that commit's file for the
//! trigger(s) holding it at its next sync (at once, when the nudge reaches it).

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::sync::{AgentArgs, nudge};

#[derive(Debug, Args)]
pub(super) struct ApproveArgs {
    /// The held commit: its full SHA, or a prefix of at least 7 hex digits (`status` shows
    /// the held commits).
    #[arg(value_name = "SHA")]
    sha: String,
    #[command(flatten)]
    agent: AgentArgs,
}

pub(super) fn run(data_dir: &Path, args: &ApproveArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let approved = store.approve(&args.sha)?;
    drop(store);
    for hold in &approved {
        println!(
            "approved commit {} for trigger {} ({}: {})",
            hold.commit.short(),
            hold.trigger,
            hold.path,
            hold.file
        );
    }
    super::unpin::report_nudge(nudge(data_dir, &args.agent, None));
    Ok(ExitCode::SUCCESS)
}
