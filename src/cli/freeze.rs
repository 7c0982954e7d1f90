//! `voodu-agent freeze [--until T] [--source S] [--reason TEXT]` and `unfreeze [--source S]`:
//! hold every new commit of a source (or of all of them) until the freeze ends. Each writes
//! its freeze row and an activity-log row in one transaction (`Store::freeze`), then nudges
//! the running agent: a commit held meanwhile applies at once on `unfreeze` (and when
//! `--until` passes, without a nudge). `rollback` and `approve --now` still work while frozen.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::sync::{AgentArgs, nudge};
use crate::manifest::window::{self, MAX_REASON_BYTES};
use crate::model::text::escape;
use crate::store::EVERY_SOURCE;

#[derive(Debug, Args)]
pub(super) struct FreezeArgs {
    /// When the freeze ends by itself: an RFC 3339 time (2026-12-24T18:00:00+01:00) or a
    /// duration from now (2h, 3d). Default: until `voodu-agent unfreeze`.
    #[arg(long, value_name = "TIME|DURATION")]
    until: Option<String>,
    /// Why (shown by `status` with each held commit), at most 512 bytes.
    #[arg(long, value_name = "TEXT", default_value = "")]
    reason: String,
    #[command(flatten)]
    agent: AgentArgs,
}

#[derive(Debug, Args)]
pub(super) struct UnfreezeArgs {
    #[command(flatten)]
    agent: AgentArgs,
}

/// The freeze's target: `--source`, else every source.
fn target(agent: &AgentArgs) -> &str {
    agent.source.as_deref().unwrap_or(EVERY_SOURCE)
}

fn shown(target: &str) -> String {
    if target == EVERY_SOURCE {
        "every source".to_owned()
    } else {
        format!("source {}", escape(target))
    }
}

pub(super) fn run_freeze(data_dir: &Path, args: &FreezeArgs) -> anyhow::Result<ExitCode> {
    if args.reason.len() > MAX_REASON_BYTES {
        anyhow::bail!(
            "--reason is {} bytes; at most {MAX_REASON_BYTES}",
            args.reason.len()
        );
    }
    let now = crate::store::now_unix();
    let until = args
        .until
        .as_deref()
        .map(|text| window::parse_until(text, now))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    if until.is_some_and(|until| until <= now) {
        anyhow::bail!("--until is in the past: the freeze would end before it starts");
    }
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let target = target(&args.agent);
    check_source(&store, target)?;
    store.freeze(target, until, &args.reason)?;
    drop(store);
    println!(
        "froze {} until {}: new commits are held (the last applied commit keeps running)",
        shown(target),
        until.map_or_else(|| "`voodu-agent unfreeze`".to_owned(), window::rfc3339)
    );
    super::unpin::report_nudge(nudge(data_dir, &args.agent, None));
    Ok(ExitCode::SUCCESS)
}

pub(super) fn run_unfreeze(data_dir: &Path, args: &UnfreezeArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let target = target(&args.agent);
    if !store.unfreeze(target)? {
        anyhow::bail!(
            "{} is not frozen (see `voodu-agent status`; a freeze of every source is lifted without --source)",
            shown(target)
        );
    }
    drop(store);
    println!("unfroze {}: a held commit applies now", shown(target));
    super::unpin::report_nudge(nudge(data_dir, &args.agent, None));
    Ok(ExitCode::SUCCESS)
}

/// A `--source` the agent does not follow is a mistake, not a freeze of nothing.
fn check_source(store: &crate::store::Store, target: &str) -> anyhow::Result<()> {
    if target == EVERY_SOURCE {
        return Ok(());
    }
    let known: Vec<String> = store
        .recorded_sources()?
        .into_iter()
        .map(|source| source.name)
        .collect();
    let followed =
        known.iter().any(|name| name == target) || (target.is_empty() && known.is_empty());
    if !followed {
        anyhow::bail!(
            "the agent follows no source {} (its sources: {})",
            escape(target),
            escape(&known.join(", "))
        );
    }
    Ok(())
}
