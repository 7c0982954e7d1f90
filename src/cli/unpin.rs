//! `voodu-agent unpin SCOPE/NAME`: clear a rollback pin so the resource follows git again
//! (`Store::unpin`, one transaction), then nudge the running agent.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::sync::{AgentArgs, Answer, nudge};
use crate::http::status::resolve;

// `redeploy` takes the same arguments. (No doc comment: on an `Args` struct it would
// replace the subcommand's `about`.)
#[derive(Debug, Args)]
pub(super) struct UnpinArgs {
    /// The resource: SCOPE/NAME, or KIND/SCOPE/NAME when several kinds share the name.
    #[arg(value_name = "SCOPE/NAME")]
    pub(super) resource: String,
    /// Print what was done as JSON.
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    pub(super) agent: AgentArgs,
}

/// `unpin --json`.
#[derive(Debug, serde::Serialize)]
struct UnpinView {
    resource: String,
    /// The commit whose version of the resource git declares (`None`: git does not, so it
    /// is removed).
    git_commit: Option<String>,
    /// Whether the host changes (git declares something other than what ran).
    changed: bool,
    /// How the running agent was told (`None` when nothing changed).
    nudge: Option<NudgeView>,
}

/// Whether the running agent was told of a change.
#[derive(Debug, serde::Serialize)]
pub(super) struct NudgeView {
    /// True when the agent took the request; otherwise it applies the change at its next
    /// poll.
    pub(super) told: bool,
    pub(super) message: String,
}

impl NudgeView {
    pub(super) fn of(answer: anyhow::Result<Answer>) -> NudgeView {
        match answer {
            Ok(answer) if answer.status < 300 => NudgeView {
                told: true,
                message: "the agent is applying it now".to_owned(),
            },
            Ok(answer) => NudgeView {
                told: false,
                message: format!(
                    "the agent answered HTTP {} ({}); it applies the change at its next poll",
                    answer.status,
                    answer.body["reason"].as_str().unwrap_or_default()
                ),
            },
            Err(error) => NudgeView {
                told: false,
                message: format!(
                    "{error:#}; the agent applies the change at its next poll, or when it starts"
                ),
            },
        }
    }
}

pub(super) fn run(data_dir: &Path, args: &UnpinArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let key = resolve(&store, &args.resource)?;
    let outcome = store.unpin(&key)?;
    drop(store);
    if args.json {
        let nudge = outcome
            .changed
            .then(|| NudgeView::of(nudge(data_dir, &args.agent, None)));
        let view = UnpinView {
            resource: key.to_string(),
            git_commit: outcome.git_commit.as_ref().map(ToString::to_string),
            changed: outcome.changed,
            nudge,
        };
        println!("{}", serde_json::to_string_pretty(&view)?);
        return Ok(ExitCode::SUCCESS);
    }
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
    let nudge = NudgeView::of(answer);
    if nudge.told {
        println!("{}", nudge.message);
    } else {
        eprintln!("warning: {}", nudge.message);
    }
}
