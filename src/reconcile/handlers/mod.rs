//! Per-kind handlers, one file a kind (declared by the kind table, `spec::for_each_kind!`,
//! with the dispatch over the closed `Kind` set). A handler gets only a key, reads desired
//! state from the store and actual state from the runtime, and converges them.
//!
//! Invariant: handlers are level-triggered and idempotent; they never see why they were
//! called (kube's hidden `ReconcileReason`).

/// `$desired`'s spec as the `Spec::$kind` variant; a stored spec of another kind ends the
/// calling pass with `wrong_kind`.
macro_rules! spec_of {
    ($key:expr, $desired:expr, $kind:ident) => {
        match &$desired.spec {
            crate::manifest::spec::Spec::$kind(spec) => spec,
            other => return Err(crate::reconcile::handlers::wrong_kind($key, other)),
        }
    };
}

/// `Replicated::set_pins` and `Replicated::pins` of a kind that keeps its pins in the field
/// `self.$field` (`inner.pins` for a Swarm kind wrapping a container kind).
macro_rules! pins_in {
    ($($field:ident).+) => {
        fn set_pins(
            &mut self,
            pins: Option<std::sync::Arc<crate::reconcile::handlers::pins::Pins>>,
        ) {
            self.$($field).+ = pins;
        }

        fn pins(&self) -> Option<&crate::reconcile::handlers::pins::Pins> {
            self.$($field).+.as_deref()
        }
    };
}

pub(crate) mod container;
pub(crate) mod data;
mod engine;
pub(crate) mod env;
mod hooks;
pub(crate) mod images;
mod inits;
pub(crate) mod launch;
pub(crate) mod on_deploy;
mod oneshot;
pub(crate) mod pins;
mod progressive;
mod replicas;
mod replicated;
pub mod requests;
mod rollout;
pub(crate) mod rollout_state;
pub(crate) mod runs;
mod swarm;

use std::sync::Arc;

use crate::manifest::spec::Spec;
use crate::model::{Kind, ResourceKey};
use crate::reconcile::{
    context::Ctx, context::blocking, error::Error, error::Result, run::action::Action,
};
use crate::runtime::Runtime;
use crate::store::Desired;

/// A kind's handler: one pass over one resource of the kind (`S`, its spec type), level
/// triggered; the `Action` says when to look again.
pub(super) trait Handler {
    fn reconcile<R: Runtime>(
        ctx: &Arc<Ctx<R>>,
        key: &ResourceKey,
    ) -> impl Future<Output = Result<Action>> + Send;
}

/// The handlers' modules, one per row of the kind table (`spec::for_each_kind!`), each the
/// kind's `Handler`, and the dispatch over them.
macro_rules! handlers {
    ($($module:ident: $variant:ident($spec:ident)),* $(,)?) => {
        $(mod $module;)*

        /// Reconciles one resource; the `Action` says when to look again.
        pub(crate) async fn reconcile<R: Runtime>(
            ctx: Arc<Ctx<R>>,
            key: ResourceKey,
        ) -> Result<Action> {
            match key.kind {
                $(Kind::$variant => {
                    <crate::manifest::spec::$spec as Handler>::reconcile(&ctx, &key).await
                })*
            }
        }
    };
}
crate::manifest::spec::for_each_kind!(handlers);

/// The desired state of `key`, read off the async threads; `None` once it left the repo.
async fn desired_of<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<Option<Desired>> {
    let key = key.clone();
    blocking(&ctx.store, move |store| store.desired(&key)).await
}

/// The desired state of `key`; `None` once it left the repo and `remove` (the kind's removal
/// of what it left on the host) ran.
async fn desired_or_remove<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    remove: impl Future<Output = Result<()>>,
) -> Result<Option<Desired>> {
    let desired = desired_of(ctx, key).await?;
    if desired.is_none() {
        remove.await?;
    }
    Ok(desired)
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
