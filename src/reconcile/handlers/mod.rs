//! Per-kind handlers: `match` on the closed `Kind` set. A handler gets only a key, reads
//! desired state from the store and actual state from the runtime, and converges them.
//!
//! Invariant: handlers are level-triggered and idempotent; they never see why they were
//! called (kube's hidden `ReconcileReason`).

pub(crate) mod container;
mod deployment;
mod hooks;
pub(crate) mod launch;

use std::sync::Arc;

use super::{Ctx, Result};
use crate::model::{Kind, ResourceKey};
use crate::runtime::Runtime;
use crate::store::ResourceStatus;

/// Reconciles one resource.
pub(crate) async fn reconcile<R: Runtime>(ctx: Arc<Ctx<R>>, key: ResourceKey) -> Result<()> {
    match key.kind {
        Kind::Deployment => deployment::reconcile(&ctx, &key).await,
        Kind::Asset
        | Kind::Cronjob
        | Kind::Ingress
        | Kind::Job
        | Kind::Registry
        | Kind::Statefulset => {
            let status = ResourceStatus::new(
                "Unsupported",
                format!("this agent cannot reconcile {} resources yet", key.kind),
            );
            super::blocking(&ctx.store, move |store| store.put_status(&key, &status)).await
        }
    }
}
