//! `voodu-agent unpin SCOPE/NAME`: clear a rollback pin so the resource follows git again
//! (`Store::unpin`, one transaction), then nudge the running agent.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::sync::{AgentArgs, Answer, nudge};
use crate::http::status::resolve;

#[derive(Debug, Args)]
pub(super) struct UnpinArgs {
    /// The resource: SCOPE/NAME, or KIND/SCOPE/NAME when several kinds share the name.
    #[arg(value_name = "SCOPE/NAME")]
    resource: String,
    #[command(flatten)]
    agent: AgentArgs,
}

pub(super) fn run(data_dir: &Path, args: &UnpinArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let key = resolve(&store, &args.resource)?;
    let outcome = store.unpin(&key)?;
    drop(store);
    match (&outcome.git_commit, outcome.changed) {
        (Some(commit), true) => println!(
            "{key}: unpinned; back to git's version (commit {})",
            commit.short()
        ),
        (Some(_), false) => println!("{key}: unpinned; git declares what runs already"),
        (None, _) => println!("{key}: unpinned; git does not declare it, so it is removed"),
    }
    if outcome.changed {
        report_nudge(nudge(data_dir, &args.agent, None));
    }
    Ok(ExitCode::SUCCESS)
}

/// Says whether the running agent was told; a failed nudge is not an error, since the state
/// change is already stored.
pub(super) fn report_nudge(answer: anyhow::Result<Answer>) {
    match answer {
        Ok(answer) if answer.status < 300 => println!("the agent is applying it now"),
        Ok(answer) => eprintln!(
            "warning: the agent answered HTTP {} ({}); it applies the change at its next poll",
            answer.status,
            answer.body["reason"].as_str().unwrap_or_default()
        ),
        Err(error) => eprintln!(
            "warning: {error:#}; the agent applies the change at its next poll, or when it starts"
        ),
    }
}
