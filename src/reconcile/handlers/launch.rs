//! What every container-running handler does before it creates containers: load the
//! environment sources once per reconcile (`EnvSource`), make the networks and the image
//! available, move a replica's init containers on (`advance_inits`, spec §7.6), and create
//! a container (`create`: the one path every container of a resource takes).
//!
//! Invariants: init containers run in declaration order, per replica, before its main
//! container, each a one-shot unit that no pass waits for; an attempt that exits non-zero is
//! left in place for inspection (as voodu does) and replaced by the next attempt; one that
//! times out is removed; units of a superseded spec are removed; environment values never
//! reach an error or a log line.

use std::collections::BTreeMap;
use std::time::Duration;

use super::container::{Identity, Launch, build, rfc3339_seconds};
use super::oneshot::{self, Exit, OneShot, Stand};
use crate::manifest::spec::{Container, Init, Spec};
use crate::model::{Kind, ResourceKey, parse_go_duration};
use crate::reconcile::env::{
    EnvInputs, bucket_names, container_env, digest, ingress_references, referenced_ingresses,
};
use crate::reconcile::error::refused_ulimits;
use crate::reconcile::images::ensure_image;
use crate::reconcile::{Ctx, Error, Result, blocking};
use crate::runtime::{ContainerSpec, Runtime, labels};
use crate::store::{Buckets, FailureReason, now_unix};

/// voodu's per-attempt init timeout when none is given.
const DEFAULT_INIT_TIMEOUT: Duration = Duration::from_secs(600);
/// voodu's pause between init attempts.
const INIT_RETRY_PAUSE: Duration = Duration::from_secs(2);

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
    ) -> std::result::Result<Vec<(String, String)>, crate::reconcile::env::EnvError> {
        use crate::reconcile::env::EnvError;
        let mut values = Vec::new();
        for sealed in &container.env_sealed {
            let refused =
                |why: String| EnvError::Sealed(format!("env_file {:?}: {why}", sealed.path));
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
                .map_err(refused)?;
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
    for network in container.effective_networks() {
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

/// Builds a create request, turning a spec that cannot become a container into a permanent
/// error for the resource.
pub(crate) fn build_spec<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    identity: &Identity,
    container: &Container,
    launch: &Launch,
) -> Result<ContainerSpec> {
    build(
        key,
        &ctx.agent_id,
        &ctx.assets_root,
        &rfc3339_seconds(now_unix()),
        identity,
        container,
        launch,
    )
    .map_err(|message| Error::Permanent {
        key: key.clone(),
        reason: FailureReason::Spec,
        message,
    })
}

/// Where a pod's init chain stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Inits {
    /// Every init container succeeded (or there are none): the pod's container may be created.
    Done,
    /// One runs, or pauses between attempts: what it waits for, and when to look again
    /// (`None`: the run's end queues the pass).
    Waiting(String, Option<Duration>),
}

/// The unit name of `init` for the pod `pod`.
fn init_name(key: &ResourceKey, init: &Init, pod: &Identity) -> String {
    format!(
        "{}-init-{}-{}",
        key.app_id(),
        init.name,
        pod.ordinal
            .map_or_else(|| pod.replica_id.clone(), |ordinal| ordinal.to_string())
    )
}

/// Moves one replica's init chain on (the pod `pod` is about to be created): the first init
/// that has not succeeded is started, or watched while it runs, or, once it failed, tried
/// again after voodu's pause (`retries` more times); once all succeeded, their units go. A pass never waits for one: each is a
/// one-shot unit (`oneshot.rs`) whose end queues the next pass. An init whose attempts are
/// used up fails the pass (`Error::Init`, retried by the error policy: the retry starts the
/// init afresh); its last attempt stays for inspection until then. Each init runs like its
/// pod (same volumes, networks, aliases and environment) with its own image, command,
/// resources, ulimits and `docker_options` where it sets them.
pub(crate) async fn advance_inits<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    pod: &Identity,
    container: &Container,
    launch: &Launch,
    inits: &[Init],
) -> Result<Inits> {
    for init in inits {
        let name = init_name(key, init, pod);
        let timeout = parse_go_duration(&init.timeout)
            .filter(|timeout| !timeout.is_zero())
            .unwrap_or(DEFAULT_INIT_TIMEOUT);
        let attempts = 1 + u32::try_from(init.retries.clamp(0, 5)).unwrap_or(0);
        let made = ctx.runs.attempts(&name);
        let next = match oneshot::stand(ctx, key, &name, timeout).await? {
            Some(Stand::Running) => {
                return Ok(Inits::Waiting(
                    format!(
                        "replica {}: init container {} is running (attempt {}/{attempts})",
                        pod.name,
                        init.name,
                        made.max(1)
                    ),
                    None,
                ));
            }
            Some(Stand::Ended { exit, .. }) if exit.succeeded() => continue,
            Some(Stand::Ended {
                id, exit, attempt, ..
            }) => {
                let attempt = attempt.max(made);
                if attempt >= attempts {
                    if !ctx.runs.report_once(&id) {
                        // Reported once already: this is the error policy's retry.
                        1
                    } else {
                        tracing::warn!(%key, init = %init.name, attempt, attempts, %exit, "init container failed; its attempts are used up");
                        return Err(Error::Init {
                            key: key.clone(),
                            init: init.name.clone(),
                            attempts: i64::from(attempts),
                            exit_code: exit.code(),
                            timeout,
                        });
                    }
                } else {
                    tracing::warn!(%key, init = %init.name, attempt, attempts, %exit, "init container failed");
                    // A timed-out attempt is gone already: its pause was its timeout.
                    let since = if exit == Exit::TimedOut {
                        INIT_RETRY_PAUSE
                    } else {
                        ctx.runs.ended_for(&id)
                    };
                    if let Some(pause) = INIT_RETRY_PAUSE
                        .checked_sub(since)
                        .filter(|pause| !pause.is_zero())
                    {
                        return Ok(Inits::Waiting(
                            format!(
                                "replica {}: init container {} failed ({exit}); attempt {} of {attempts} starts in {}s",
                                pod.name,
                                init.name,
                                attempt + 1,
                                pause.as_secs().max(1)
                            ),
                            Some(pause),
                        ));
                    }
                    attempt + 1
                }
            }
            // Never started, or a timed-out attempt removed: the next attempt (the first
            // again once a used-up chain was reported).
            None if made >= attempts => 1,
            None => made + 1,
        };
        start_init(ctx, key, pod, container, launch, init, &name, next, timeout).await?;
        return Ok(Inits::Waiting(
            format!(
                "replica {}: init container {} started (attempt {next}/{attempts})",
                pod.name, init.name
            ),
            None,
        ));
    }
    // Every init succeeded: their units go before the pod is created (a create that fails
    // then runs the chain again, as voodu does).
    for init in inits {
        let name = init_name(key, init, pod);
        oneshot::remove_named(ctx, key, &name).await?;
        ctx.runs.set_attempts(&name, 0);
    }
    Ok(Inits::Done)
}

/// Starts attempt `attempt` of `init` (a previous attempt's unit is removed first).
#[allow(clippy::too_many_arguments)]
async fn start_init<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    pod: &Identity,
    container: &Container,
    launch: &Launch,
    init: &Init,
    name: &str,
    attempt: u32,
    timeout: Duration,
) -> Result<()> {
    let mut init_container = container.clone();
    init_container.resources = init.resources.clone();
    if !init.ulimits.is_empty() {
        init_container.ulimits = init.ulimits.clone();
    }
    if !init.docker_options.is_empty() {
        init_container.docker_options = init.docker_options.clone();
    }
    let run = OneShot {
        identity: Identity {
            name: name.to_owned(),
            role: "init".to_owned(),
            ..pod.clone()
        },
        container: &init_container,
        launch: Launch {
            image: Some(if init.image.is_empty() {
                container.effective_image(key)
            } else {
                init.image.clone()
            }),
            command: Some(init.command.clone()),
            restart: String::new(),
            ports: Vec::new(),
            tty: true,
            ..launch.clone()
        },
        spec_hash: pod.spec_hash.as_deref().unwrap_or_default(),
        // Init containers run on containers only (Swarm refuses them).
        asset_digests: &BTreeMap::new(),
        labels: BTreeMap::from([(labels::ATTEMPT.to_owned(), attempt.to_string())]),
        timeout,
    };
    tracing::info!(%key, init = %init.name, pod = %pod.name, attempt, "starting init container");
    oneshot::start(ctx, key, &run).await?;
    ctx.runs.set_attempts(name, attempt);
    Ok(())
}

/// The init containers of `key` in flight, by replica id (a deployment's random id, a
/// statefulset pod's ordinal): the unit ids of each replica still to be created, of the
/// desired spec hash `spec_hash`. Units of another spec hash (a newer spec superseded them)
/// and units of a replica `created` says exists already are removed.
pub(crate) async fn inits_in_flight<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    spec_hash: &str,
    created: impl Fn(&str) -> bool,
) -> Result<BTreeMap<String, Vec<String>>> {
    let units = ctx
        .runtime
        .list(&[
            (labels::AGENT, ctx.agent_id.as_str()),
            (labels::KIND, key.kind.as_str()),
            (labels::SCOPE, key.scope.as_str()),
            (labels::NAME, key.name.as_str()),
            (labels::ROLE, "init"),
        ])
        .await
        .map_err(|source| Error::Runtime {
            key: key.clone(),
            source,
        })?;
    let mut in_flight: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for unit in units {
        let replica = unit
            .label(labels::REPLICA_ID)
            .unwrap_or_default()
            .to_owned();
        if unit.label(labels::MANIFEST_HASH) == Some(spec_hash) && !created(&replica) {
            in_flight.entry(replica).or_default().push(unit.id);
        } else {
            tracing::info!(%key, unit = %unit.name, "removing an init container a newer spec (or its created replica) superseded");
            oneshot::remove(ctx, key, &unit.id).await?;
        }
    }
    Ok(in_flight)
}

/// Removes the init units `ids` of a replica no longer to be created (scaled down while its
/// inits ran).
pub(crate) async fn drop_inits<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    replica: &str,
    ids: &[String],
) -> Result<()> {
    for id in ids {
        tracing::info!(%key, replica, "removing an init container of a replica no longer wanted");
        oneshot::remove(ctx, key, id).await?;
    }
    Ok(())
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

/// Creates and starts a container; one that cannot start is removed again (a created but
/// unstartable replica would count as present). Returns its id.
pub(crate) async fn create_and_start<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    spec: &ContainerSpec,
) -> Result<String> {
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
    use crate::runtime::Error as Engine;
    match error {
        Engine::Invalid { .. } | Engine::NotFound { .. } => Error::Start {
            key: key.clone(),
            name: name.to_owned(),
            source: Box::new(error),
        },
        Engine::Unavailable { .. } if refused_ulimits(&error) => Error::Start {
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
