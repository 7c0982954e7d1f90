//! `voodu-agent redeploy SCOPE/NAME`: a new release of what the resource declares now, with its
//! images resolved anew (`Store::redeploy`, one transaction): the way to run what a mutable tag
//! names now without a commit. Nudges the running agent so it acts at once.

use std::path::Path;
use std::process::ExitCode;

use super::sync::nudge;
use crate::http::status::resolve;

/// The resource, `--json` and how to reach the agent, as for `unpin`.
pub(super) use super::unpin::UnpinArgs as RedeployArgs;

/// `redeploy --json`.
#[derive(Debug, serde::Serialize)]
struct RedeployView {
    resource: String,
    /// The redeploy's release.
    release: i64,
    commit: String,
    nudge: super::unpin::NudgeView,
}

pub(super) fn run(data_dir: &Path, args: &RedeployArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let key = resolve(&store, &args.resource)?;
    let release = store.redeploy(&key)?;
    drop(store);
    if args.json {
        let view = RedeployView {
            resource: key.to_string(),
            release: release.id,
            commit: release.commit.to_string(),
            nudge: super::unpin::NudgeView::of(nudge(data_dir, &args.agent, None)),
        };
        println!("{}", serde_json::to_string_pretty(&view)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{key}: redeploying commit {} as release #{}: its images are resolved anew (a tag that moved runs what it names now)",
        release.commit.short(),
        release.id
    );
    super::unpin::report_nudge(nudge(data_dir, &args.agent, None));
    Ok(ExitCode::SUCCESS)
}
