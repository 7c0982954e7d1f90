//! Registry handler: `registry` resources hold credentials that image pulls use
//! (`reconcile::handlers::images`), so there is nothing to create on the host. The handler records
//! status (never the token) and, when a registry appears or changes, asks the resources that
//! failed for a missing image (`FailureReason::ImageMissing` or `PullFailed` on their status)
//! to try again: declaring the missing registry fixes them without another commit to them.
//!
//! Invariant: the token is not in status, logs or errors.

use std::sync::Arc;

use super::Handler;
use crate::manifest::spec::RegistrySpec;
use crate::model::ResourceKey;
use crate::reconcile::{context::Ctx, context::blocking, error::Result, run::action::Action};
use crate::runtime::Runtime;
use crate::store::{Detail, FailureReason, Phase, RegistryDetail, ResourceStatus};

impl Handler for RegistrySpec {
    async fn reconcile<R: Runtime>(ctx: &Arc<Ctx<R>>, key: &ResourceKey) -> Result<Action> {
        let desired = super::desired_of(ctx, key).await?;
        let Some(desired) = desired else {
            let key = key.clone();
            blocking(&ctx.store, move |store| store.delete_status(&key)).await?;
            return Ok(Action::Done);
        };
        let registry = spec_of!(key, desired, Registry);
        let mut status = ResourceStatus::new(Phase::Ready, "");
        status.spec_hash = desired.spec_hash.to_string();
        status.detail = Detail::Registry(RegistryDetail {
            url: registry.url.clone(),
            username: registry.username.clone(),
            helper: registry.helper.clone(),
            credentials: if registry.helper.is_empty() {
                "token"
            } else {
                "helper"
            }
            .to_owned(),
        });
        let key_for_store = key.clone();
        let waiting = blocking(&ctx.store, move |store| {
            store.put_status(&key_for_store, &status)?;
            store.statuses_failed_with(&[FailureReason::ImageMissing, FailureReason::PullFailed])
        })
        .await?;
        for waiting_key in waiting {
            tracing::info!(%key, resource = %waiting_key, "a registry changed; retrying a failed pull");
            ctx.timer.requeue(waiting_key);
        }
        Ok(Action::Done)
    }
}
