//! `voodu-agent approve SHA`: apply a commit a `deploy: manual` trigger holds. Marks the held
//! commit approved in state.db (`Store::approve`, one transaction, recorded in the activity
//! log), then nudges the running agent, which applies exactly that commit's file for the
//! trigger(s) holding it at its next sync (at once, when the nudge reaches it).
//!
//! `--now`: also apply a commit a deploy window or a freeze holds, outside the window or
//! during the freeze (`Store::release_hold`, recorded in the activity log).

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
    /// Apply it now even outside its deploy window or during a freeze (a commit `status`
    /// shows as HELD until …).
    #[arg(long)]
    now: bool,
    #[command(flatten)]
    agent: AgentArgs,
}

pub(super) fn run(data_dir: &Path, args: &ApproveArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let released = if args.now {
        store.release_hold(&args.sha)?
    } else {
        Vec::new()
    };
    let approved = match store.approve(&args.sha) {
        // `--now` on a commit only a window or a freeze holds.
        Err(crate::store::Error::NotHeld { .. }) if !released.is_empty() => Vec::new(),
        Err(error @ crate::store::Error::NotHeld { .. }) => {
            let held = store.held_commits()?;
            if held.is_empty() {
                return Err(error.into());
            }
            let held: Vec<String> = held
                .iter()
                .map(|hold| hold.commit.short().to_owned())
                .collect();
            anyhow::bail!(
                "{error}; a deploy window or a freeze holds {}: `voodu-agent approve --now SHA` applies it now",
                held.join(", ")
            );
        }
        other => other?,
    };
    drop(store);
    for hold in &released {
        println!(
            "approved commit {} --now{}: applied at once, whatever the deploy windows or a freeze say",
            hold.commit.short(),
            if hold.source.is_empty() {
                String::new()
            } else {
                format!(" for source {}", crate::model::text::escape(&hold.source))
            }
        );
    }
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
