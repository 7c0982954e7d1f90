//! What every container-running handler does before it creates containers: load the
//! environment sources once per reconcile (`EnvSource`), make the networks and the image
//! available, and create a container (`create`: the one path every container of a resource
//! takes, which pulls an image the host lost).
//!
//! Invariant: environment values never reach an error or a log line.

use std::collections::BTreeMap;

use super::container::{Identity, Launch, build, on_own_network};
use crate::base::rfc3339_seconds;
use crate::manifest::spec::{Container, Init, Spec};
use crate::model::{Kind, ResourceKey};
use crate::reconcile::error::refused_ulimits;
use crate::reconcile::handlers::env::{
    EnvInputs, bucket_names, container_env, digest, ingress_references, referenced_ingresses,
};
use crate::reconcile::handlers::images::ensure_image;
use crate::reconcile::{context::Ctx, context::blocking, error::Error, error::Result};
use crate::runtime::{ContainerSpec, Runtime};
use crate::store::{Buckets, FailureReason, now_unix};

/// The environment sources of one reconcile: config buckets, `${ref.…}` values, the digest key.
pub(crate) struct EnvSource {
    buckets: Buckets,
    references: BTreeMap<String, String>,
    key: Vec<u8>,
    /// The encrypted bytes of the container's SOPS env files, by digest (`None`: gone).
    sealed: BTreeMap<String, Option<Vec<u8>>>,
}

impl EnvSource {
    /// Reads what `container`'s environment is made of, and nothing else: the buckets it
    /// names (`env::bucket_names`), the ingresses of its scope its `env` refers to and the
    /// deployments they route to (`env::referenced_ingresses`), and the agent's digest key.
    /// `env` must be called with the same container.
    pub(crate) async fn load<R: Runtime>(
        ctx: &Ctx<R>,
        key: &ResourceKey,
        container: &Container,
    ) -> Result<EnvSource> {
        let scope = key.scope.clone();
        let names = bucket_names(key, container);
        // A bucket of a scope another source owns is never read for this one (the manifest
        // stage refuses such an `env_from` at its place; this holds for any stored spec).
        let ownership = &ctx.options.ownership;
        if let Some((bucket_scope, bucket)) = names
            .iter()
            .find(|(bucket_scope, _)| !ownership.same_owner(bucket_scope, &scope))
        {
            return Err(Error::Permanent {
                key: key.clone(),
                reason: FailureReason::Spec,
                message: crate::model::scopes::foreign(
                    &format!("config bucket {bucket_scope}/{bucket}"),
                    ownership.owner_of(&scope).unwrap_or_default(),
                    ownership.owner_of(bucket_scope),
                ),
            });
        }
        let sealed_digests: Vec<String> = container
            .env_sealed
            .iter()
            .map(|sealed| sealed.digest.clone())
            .collect();
        let ingresses: Vec<ResourceKey> = referenced_ingresses(container)
            .into_iter()
            .map(|name| ResourceKey::new(Kind::Ingress, &scope, name))
            .collect();
        blocking(&ctx.store, move |store| {
            let mut desired = store.desired_of(&ingresses)?;
            let services: Vec<ResourceKey> = desired
                .iter()
                .filter_map(|resource| match &resource.spec {
                    Spec::Ingress(ingress) => Some(ResourceKey::new(
                        Kind::Deployment,
                        &scope,
                        ingress.effective_service(&resource.key.name),
                    )),
                    _ => None,
                })
                .collect();
            desired.extend(store.desired_of(&services)?);
            let mut sealed = BTreeMap::new();
            for digest in sealed_digests {
                let bytes = store.blob(&digest)?;
                sealed.insert(digest, bytes);
            }
            Ok(EnvSource {
                buckets: store.buckets_of(&names)?,
                references: ingress_references(&desired, &scope),
                key: store.env_key()?.into_bytes(),
                sealed,
            })
        })
        .await
    }

    /// The merged environment of one container and its keyed digest.
    pub(crate) fn env<R: Runtime>(
        &self,
        ctx: &Ctx<R>,
        key: &ResourceKey,
        container: &Container,
        identity: Vec<(String, String)>,
    ) -> Result<(Vec<String>, String)> {
        let sealed = self
            .sealed_values(ctx, container)
            .map_err(|source| Error::Env {
                key: key.clone(),
                source,
            })?;
        let inputs = EnvInputs {
            key,
            buckets: &self.buckets,
            identity,
            assets_root: &ctx.assets_root,
            references: &self.references,
            sealed: &sealed,
        };
        match container_env(&inputs, container) {
            Ok(env) => {
                let env_digest = digest(&self.key, &env);
                Ok((env, env_digest))
            }
            Err(source) => Err(Error::Env {
                key: key.clone(),
                source,
            }),
        }
    }
}

impl EnvSource {
    /// The variables `container`'s SOPS env files supply, decrypted with the agent's age
    /// identities. They live in this pass's memory only: the spec holds digests, state.db the
    /// encrypted bytes.
    fn sealed_values<R: Runtime>(
        &self,
        ctx: &Ctx<R>,
        container: &Container,
    ) -> std::result::Result<Vec<(String, String)>, crate::reconcile::handlers::env::EnvError> {
        use crate::reconcile::handlers::env::EnvError;
        let mut values = Vec::new();
        for sealed in &container.env_sealed {
            let refused =
                |why: String| EnvError::Encrypted(format!("env_file {:?}: {why}", sealed.path));
            let bytes = self
                .sealed
                .get(&sealed.digest)
                .and_then(Option::as_ref)
                .ok_or_else(|| {
                    refused(
                        "its encrypted bytes are not in state.db; push the commit again".to_owned(),
                    )
                })?;
            let file = crate::manifest::sops::parse(bytes)
                .ok_or_else(|| refused("is not a SOPS file".to_owned()))?
                .map_err(|error| refused(error.to_string()))?;
            let plain = ctx
                .options
                .keyring
                .open(&file)
                .map_err(|error| refused(error.to_string()))?;
            let env = plain.env().map_err(|error| refused(error.to_string()))?;
            values.extend(
                env.into_iter()
                    .filter(|(name, _)| sealed.keys.contains(name)),
            );
        }
        Ok(values)
    }
}

/// `VOODU_SCOPE` and `VOODU_NAME`, the identity every replica gets (spec §4.4).
pub(crate) fn identity_vars(key: &ResourceKey) -> Vec<(String, String)> {
    vec![
        ("VOODU_SCOPE".to_owned(), key.scope.clone()),
        ("VOODU_NAME".to_owned(), key.name.clone()),
    ]
}

/// Makes the container's networks exist and its image present (pulling it when missing).
pub(crate) async fn ready_to_create<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    container: &Container,
    images: &[String],
) -> Result<()> {
    for network in networks_of(ctx, key, container) {
        ctx.runtime
            .ensure_network(&network)
            .await
            .map_err(|source| Error::Runtime {
                key: key.clone(),
                source,
            })?;
    }
    for image in images {
        ensure_image(ctx, key, image).await?;
    }
    Ok(())
}

/// The images a container spec and its init containers run.
pub(crate) fn images_of(
    key: &ResourceKey,
    container: &Container,
    inits: &[Init],
    assets_root: &std::path::Path,
) -> Vec<String> {
    let main = crate::model::resolve_asset_refs(&container.effective_image(key), assets_root);
    let mut images = vec![main.clone()];
    for init in inits {
        if !init.image.is_empty() && !images.contains(&init.image) {
            images.push(init.image.clone());
        }
    }
    images
}

/// The networks `container` of `key` joins: its own, with `voodu0` standing for its source's
/// network (`Ownership::network_of`: `voodu0` itself unless its source has its own).
pub(crate) fn networks_of<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    container: &Container,
) -> Vec<String> {
    on_own_network(
        container.effective_networks(),
        &ctx.options.ownership.network_of(&key.scope),
    )
}

/// `container::build` with this agent's id and assets, labelled `created_at`; a spec that
/// cannot become a container is a permanent error for the resource.
pub(crate) fn build_or_refuse<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    created_at: &str,
    identity: &Identity,
    container: &Container,
    launch: &Launch,
) -> Result<ContainerSpec> {
    build(
        key,
        &ctx.agent_id,
        &ctx.assets_root,
        created_at,
        identity,
        container,
        launch,
    )
    .map_err(|error| Error::Permanent {
        key: key.clone(),
        reason: FailureReason::Spec,
        message: error.to_string(),
    })
}

/// Builds a create request, turning a spec that cannot become a container into a permanent
/// error for the resource.
pub(crate) fn build_spec<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    identity: &Identity,
    container: &Container,
    launch: &Launch,
) -> Result<ContainerSpec> {
    let created_at = rfc3339_seconds(now_unix());
    let mut spec = build_or_refuse(ctx, key, &created_at, identity, container, launch)?;
    if !spec.networks.is_empty() {
        spec.networks = networks_of(ctx, key, container);
    }
    Ok(spec)
}

/// Creates a container: the one path every container of a resource takes (first deploy,
/// rollout, scale-up, drift re-creation, restart repair, statefulset pod, init, job run,
/// release step). An image the host lacks (pruned since the rollout pulled it, a rebuilt host)
/// is pulled with the matching `registry`'s credentials and the create tried once more; one
/// that cannot be pulled is permanent, with what to do. Returns its id.
pub(crate) async fn create<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    spec: &ContainerSpec,
) -> Result<String> {
    let classify = |error| match error {
        crate::runtime::Error::ImageMissing { .. } => Error::ImageMissing {
            key: key.clone(),
            source: error,
        },
        other => Error::Runtime {
            key: key.clone(),
            source: other,
        },
    };
    match ctx.runtime.create(spec).await {
        Err(crate::runtime::Error::ImageMissing { .. }) => {
            ensure_image(ctx, key, &spec.image).await?;
            ctx.runtime.create(spec).await.map_err(classify)
        }
        created => created.map_err(classify),
    }
}

/// Creates and starts a container in one of the agent's create slots
/// (`ReconcileOptions::create_concurrency`); one that cannot start is removed again (a
/// created but unstartable replica would count as present). Returns its id.
pub(crate) async fn create_and_start<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    spec: &ContainerSpec,
) -> Result<String> {
    // The semaphore is never closed; were it, the create would go on without a slot.
    let _slot = ctx.creates.acquire().await.ok();
    let id = create(ctx, key, spec).await?;
    if let Err(error) = ctx.runtime.start(&id).await {
        // Its destroy event is no drift: a pass it queued would create, fail and remove again.
        ctx.memory.own_removals.note(&id);
        let _ = ctx.runtime.remove(&id).await;
        return Err(start_error(key, &spec.name, error));
    }
    Ok(id)
}

/// Classifies a failed start: what a retry cannot fix is permanent, with what to do.
pub(crate) fn start_error(key: &ResourceKey, name: &str, error: crate::runtime::Error) -> Error {
    use crate::runtime::Error as RuntimeError;
    match error {
        RuntimeError::Invalid { .. } | RuntimeError::NotFound { .. } => Error::Start {
            key: key.clone(),
            name: name.to_owned(),
            source: Box::new(error),
        },
        RuntimeError::Unavailable { .. } if refused_ulimits(&error) => Error::Start {
            key: key.clone(),
            name: name.to_owned(),
            source: Box::new(error),
        },
        other => Error::Runtime {
            key: key.clone(),
            source: other,
        },
    }
}
