//! Per-kind handlers: `match` on the closed `Kind` set. A handler gets only a key, reads
//! desired state from the store and actual state from the runtime, and converges them.
//!
//! Invariant: handlers are level-triggered and idempotent; they never see why they were
//! called (kube's hidden `ReconcileReason`).

mod asset;
pub(crate) mod container;
mod cronjob;
mod deployment;
mod engine;
pub(crate) mod env;
mod hooks;
pub(crate) mod images;
mod ingress;
mod inits;
mod job;
pub(crate) mod launch;
pub(crate) mod on_deploy;
mod oneshot;
pub(crate) mod pins;
mod registry;
mod replicas;
mod replicated;
pub mod requests;
mod rollout;
pub(crate) mod rollout_state;
pub(crate) mod runs;
mod statefulset;
mod swarm;

use std::sync::Arc;

use crate::manifest::spec::Spec;
use crate::model::{Kind, ResourceKey};
use crate::reconcile::{
    context::Ctx, context::blocking, error::Error, error::Result, run::action::Action,
};
use crate::runtime::Runtime;
use crate::store::Desired;

/// Reconciles one resource; the `Action` says when to look again.
pub(crate) async fn reconcile<R: Runtime>(ctx: Arc<Ctx<R>>, key: ResourceKey) -> Result<Action> {
    match key.kind {
        Kind::Asset => asset::reconcile(&ctx, &key).await,
        Kind::Cronjob => cronjob::reconcile(&ctx, &key).await,
        Kind::Deployment => engine::deployment(&ctx, &key).await,
        Kind::Ingress => ingress::reconcile(&ctx, &key).await,
        Kind::Job => job::reconcile(&ctx, &key).await,
        Kind::Registry => registry::reconcile(&ctx, &key).await,
        Kind::Statefulset => engine::statefulset(&ctx, &key).await,
    }
}

/// The desired state of `key`, read off the async threads; `None` once it left the repo.
async fn desired_of<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<Option<Desired>> {
    let key = key.clone();
    blocking(&ctx.store, move |store| store.desired(&key)).await
}

/// Refuses a workload that cannot be applied before any of its containers is touched (a
/// plugin-owned block: the agent installs no plugins). Its containers from an earlier commit
/// run on as they are; the status says why, with the block's location.
fn refuse_unappliable(key: &ResourceKey, spec: &Spec) -> Result<()> {
    match crate::reconcile::plan::apply_failure(key, spec) {
        None => Ok(()),
        Some(failure) => {
            // The error prints as `<key>: <message>`: keep the key once.
            let prefix = format!("{key}: ");
            let message = failure.strip_prefix(&prefix).unwrap_or(&failure).to_owned();
            Err(Error::Permanent {
                key: key.clone(),
                reason: crate::store::FailureReason::PluginNotInstalled,
                message,
            })
        }
    }
}

/// A stored spec of another kind than its key's (a store bug): permanent, never retried.
fn wrong_kind(key: &ResourceKey, spec: &Spec) -> Error {
    Error::Permanent {
        key: key.clone(),
        reason: crate::store::FailureReason::Spec,
        message: format!(
            "stored spec is of kind {}, but the key is a {}",
            spec.kind(),
            key.kind
        ),
    }
}
