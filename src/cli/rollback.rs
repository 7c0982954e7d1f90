//! `voodu-agent rollback SCOPE/NAME [--to SHA]`: the emergency rollback. Re-applies the spec
//! snapshot of an earlier release and pins the resource (auto-sync paused for it), in one
//! state.db transaction (`Store::rollback`), then nudges the running agent so it acts at
//! once. The agent also picks the change up at its next poll, or when it starts.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use super::sync::{AgentArgs, nudge};
use crate::http::status::resolve;

#[derive(Debug, Args)]
pub(super) struct RollbackArgs {
    /// The resource: SCOPE/NAME, or KIND/SCOPE/NAME when several kinds share the name.
    #[arg(value_name = "SCOPE/NAME")]
    resource: String,
    /// The commit (full SHA or a prefix of at least 4 hex digits) whose release to re-apply.
    /// Default: the newest release that ran with a spec other than the current one.
    #[arg(long, value_name = "SHA", conflicts_with = "release")]
    to: Option<String>,
    /// The release (its number, as `releases` lists it) to re-apply: its spec and the very
    /// images it ran (their digests), whatever the tags name now.
    #[arg(long, value_name = "N")]
    release: Option<u64>,
    /// Also put the data back: restore the statefulset's claims from the `before_release`
    /// backup of the release that followed the one rolled back to (what the data was before
    /// the change being undone). Refused when no such backup exists.
    #[arg(long)]
    with_data: bool,
    /// Print what was done as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    agent: AgentArgs,
}

/// `rollback --json`.
#[derive(Debug, serde::Serialize)]
struct RollbackView {
    resource: String,
    /// The release re-applied, and its commit.
    target_release: i64,
    target_commit: String,
    /// The rollback's own release.
    release: i64,
    /// The restore run `--with-data` asked for.
    restore_run: Option<i64>,
    /// Always true: auto-sync is paused for the resource until git changes it or `unpin`.
    pinned: bool,
    /// True when git declares something else than what now runs.
    git_differs: bool,
    nudge: super::unpin::NudgeView,
}

pub(super) fn run(data_dir: &Path, args: &RollbackArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let key = resolve(&store, &args.resource)?;
    let to = match args.release {
        Some(release) => Some(format!("#{release}")),
        None => args.to.clone(),
    };
    // The data to put back is found before anything changes: a rollback that cannot bring
    // its data back is refused whole.
    let data = if args.with_data {
        let target = store.rollback_target_of(&key, to.as_deref())?;
        let backup = store.backup_after_release(&key, target)?.with_context(|| {
            format!(
                "no before_release backup was taken for a release of {key} after #{target}: there is no data to put back (roll back without --with-data, or `restore --snapshot`)"
            )
        })?;
        let mut request =
            super::backup::restore_request(&store, &key, None, backup.release_id, None)?;
        request.reason = crate::store::DataReason::Rollback;
        Some(request)
    } else {
        None
    };
    let outcome = store.rollback(&key, to.as_deref())?;
    let restore = match data {
        Some(request) => Some(store.request_data_run(&key, &request)?),
        None => None,
    };
    drop(store);
    if args.json {
        let view = RollbackView {
            resource: key.to_string(),
            target_release: outcome.target.id,
            target_commit: outcome.target.commit.to_string(),
            release: outcome.release.id,
            restore_run: restore,
            pinned: true,
            git_differs: outcome.git_differs,
            nudge: super::unpin::NudgeView::of(nudge(data_dir, &args.agent, None)),
        };
        println!("{}", serde_json::to_string_pretty(&view)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{key}: rolling back to release #{} (commit {}) as release #{}",
        outcome.target.id,
        outcome.target.commit.short(),
        outcome.release.id
    );
    println!(
        "pinned: auto-sync is paused for it{}; the next commit that changes it in git, or `voodu-agent unpin {}/{}`, hands it back",
        if outcome.git_differs {
            " and git now differs"
        } else {
            ""
        },
        key.scope,
        key.name
    );
    if let Some(run) = restore {
        println!(
            "with data: restore run #{run} puts the claims back as they were before the release that followed #{}",
            outcome.target.id
        );
    }
    super::unpin::report_nudge(nudge(data_dir, &args.agent, None));
    Ok(ExitCode::SUCCESS)
}
