//! The engine seam: the one place where a handler's work differs between containers on the
//! local engine and Docker Swarm services (`--runtime`). Every `match` on `Engine` of the
//! handlers is in this folder, and the handlers never branch on the engine themselves:
//!
//! - here, whole kinds that Swarm runs its own way (a deployment or statefulset becomes
//!   services, `swarm/`), what Swarm cannot run (`refuse_gaps`), how ingress routes reach a
//!   workload, and the configs an asset becomes;
//! - in `units.rs`, the lifecycle of a one-shot run's unit (init attempts, release hooks,
//!   job and cronjob runs), which the lower layers use.
//!
//! Invariant: adding an engine means adding an arm in this folder, and nowhere else in
//! `handlers/`.

pub(super) mod units;

use std::sync::Arc;

use super::Handler;
use crate::manifest::spec::{DeploymentSpec, Spec, StatefulsetSpec};
use crate::model::ResourceKey;
use crate::reconcile::{context::Ctx, context::Engine, error::Result, run::action::Action};
use crate::runtime::Runtime;

/// One pass of a deployment: replicas as containers, or one Swarm service.
impl Handler for DeploymentSpec {
    async fn reconcile<R: Runtime>(ctx: &Arc<Ctx<R>>, key: &ResourceKey) -> Result<Action> {
        match ctx.options.engine {
            Engine::Docker => super::deployment::reconcile(ctx, key).await,
            Engine::Swarm => super::swarm::deployment::reconcile(ctx, key).await,
        }
    }
}

/// One pass of a statefulset: pods as containers, or one Swarm service per pod.
impl Handler for StatefulsetSpec {
    async fn reconcile<R: Runtime>(ctx: &Arc<Ctx<R>>, key: &ResourceKey) -> Result<Action> {
        match ctx.options.engine {
            Engine::Docker => super::statefulset::reconcile(ctx, key).await,
            Engine::Swarm => super::swarm::statefulset::reconcile(ctx, key).await,
        }
    }
}

/// Refuses, before anything is touched, a spec that this engine cannot run (under Swarm:
/// `plan::swarm_gaps`, with the reason); every spec runs on containers.
pub(super) fn refuse_gaps<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey, spec: &Spec) -> Result<()> {
    match ctx.options.engine {
        Engine::Docker => Ok(()),
        Engine::Swarm => super::swarm::refuse_gaps(key, spec),
    }
}

/// Whether ingress routes reach services through Swarm's routing mesh (else containers).
pub(super) fn routes_to_services<R: Runtime>(ctx: &Ctx<R>) -> bool {
    match ctx.options.engine {
        Engine::Docker => false,
        Engine::Swarm => true,
    }
}

/// An asset's files as the engine needs them besides the files on disk: under Swarm, the
/// configs of earlier versions of its files that no service uses any more go (`current`:
/// the digests' config names of its files; `None`: the asset left the repo, all of them
/// go once unused). Nothing on containers, which bind the files.
pub(super) async fn tidy_asset_configs<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    current: Option<Vec<(String, String)>>,
) {
    match ctx.options.engine {
        Engine::Docker => {}
        Engine::Swarm => match current {
            None => super::swarm::remove_asset_configs(ctx, key).await,
            Some(files) => {
                let names: Vec<String> = files
                    .iter()
                    .map(|(file, digest)| super::swarm::config_name(key, file, digest))
                    .collect();
                super::swarm::remove_asset_configs_but(ctx, key, &names).await;
            }
        },
    }
}
