//! `voodu-agent promote SCOPE/NAME` and `voodu-agent abort SCOPE/NAME`: leave a request on a
//! deployment's progressive rollout (`canary {}` / `blue_green {}`) for the reconciler
//! (`Store::request_rollout`: one transaction with its activity row and outbox event), queue
//! the deployment for a pass (`Store::queue_pass`), then nudge the running agent, which
//! notices the pass at once. `POST /api/rollouts/…` is the same over HTTP. Exit 1 when no
//! rollout of the deployment is in flight.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::sync::{AgentArgs, nudge};
use super::unpin::report_nudge;
use crate::http::status::resolve;
use crate::model::Kind;
use crate::model::text::escape;
use crate::store::RolloutRequest;

// `promote` and `abort` take the same arguments. (No doc comment: on an `Args` struct it
// would replace the subcommand's `about`.)
#[derive(Debug, Args)]
pub(super) struct RolloutArgs {
    /// The deployment: SCOPE/NAME.
    #[arg(value_name = "SCOPE/NAME")]
    resource: String,
    #[command(flatten)]
    agent: AgentArgs,
}

pub(super) fn run(
    data_dir: &Path,
    args: &RolloutArgs,
    request: RolloutRequest,
) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    // Only a deployment rolls out progressively: SCOPE/NAME means the deployment even when
    // an ingress (or another kind) shares its name.
    let key = match args.resource.split_once('/') {
        Some((scope, name)) if !name.contains('/') => {
            crate::model::ResourceKey::new(Kind::Deployment, scope, name)
        }
        _ => resolve(&store, &args.resource)?,
    };
    if key.kind != Kind::Deployment {
        anyhow::bail!("{key}: only a deployment rolls out by canary or blue/green");
    }
    let state = store.request_rollout(&key.scope, &key.name, request)?;
    if state.is_some() {
        // The journal row the nudge makes the agent notice: the rollout moves at once.
        store.queue_pass(&key)?;
    }
    drop(store);
    let Some(state) = state else {
        eprintln!(
            "{}: no canary or blue/green rollout is in flight (see `voodu-agent status`)",
            escape(&key.to_string())
        );
        return Ok(ExitCode::from(1));
    };
    let what = match request {
        RolloutRequest::Promote => "promote requested: the rollout goes on past its pause",
        RolloutRequest::Abort => "abort requested: traffic goes back to the stable release",
    };
    println!(
        "{}: {what} (release {}, {} step {} at {} %)",
        escape(&key.to_string()),
        escape(&state.release),
        state.strategy,
        state.step,
        state.share
    );
    report_nudge(nudge(data_dir, &args.agent, None));
    Ok(ExitCode::SUCCESS)
}
