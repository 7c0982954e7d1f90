//! `voodu-agent activity [--json] [--since DURATION|TIME] [--limit N]`: the activity log,
//! read from state.db (read-only, so it works while the agent runs). The JSON is
//! `http::activity::build`'s, the document `GET /activity` returns.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use crate::http::activity::{ActivityView, DEFAULT_SINCE, build, parse_since};
use crate::store::now_unix;

/// Most rows one listing prints.
const MAX_LIMIT: usize = 100_000;

#[derive(Debug, Args)]
pub(super) struct ActivityArgs {
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
    /// Show entries since this long ago (`24h`, `7d`) or since this RFC 3339 time
    /// (`2026-11-20T08:00:00Z`). The log keeps 30 days.
    #[arg(long, value_name = "DURATION|TIME", default_value = DEFAULT_SINCE)]
    since: String,
    /// Show at most this many entries (the newest).
    #[arg(long, default_value_t = 1000)]
    limit: usize,
}

pub(super) fn run(data_dir: &Path, args: &ActivityArgs) -> anyhow::Result<ExitCode> {
    let since = parse_since(&args.since, now_unix()).map_err(anyhow::Error::msg)?;
    let store = super::open_store(data_dir, super::Access::ReadOnly)?;
    let view = build(&store, since, args.limit.clamp(1, MAX_LIMIT))?;
    super::print_view(args.json, &view, print_lines)
}

fn print_lines(view: &ActivityView) {
    use crate::model::text::Esc;
    if view.truncated {
        println!(
            "(older entries since {} left out; raise --limit)",
            view.since
        );
    }
    if view.entries.is_empty() {
        println!("no activity since {}", view.since);
    }
    for entry in &view.entries {
        let who = match &entry.actor {
            Some(actor) => format!("{}:{actor}", entry.origin),
            None => entry.origin.clone(),
        };
        let commit = entry.commit.as_deref().map_or_else(String::new, |commit| {
            format!(" @{}", &commit[..commit.len().min(12)])
        });
        let resource = entry
            .resource
            .as_deref()
            .map_or_else(String::new, |resource| format!(" {resource}"));
        let resource = if entry.source.is_empty() {
            resource
        } else {
            format!(" [{}]{resource}", entry.source)
        };
        // Every field but the time is data an actor, the repo or the engine wrote.
        println!(
            "{} {:<14} {:<10} {:<16}{}{}{}{}",
            entry.at,
            Esc(&entry.action),
            Esc(entry.outcome.as_str()),
            Esc(&who),
            Esc(&resource),
            Esc(&commit),
            if entry.message.is_empty() { "" } else { ": " },
            Esc(&entry.message)
        );
    }
}
