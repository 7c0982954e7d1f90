//! Deployment handler: converge `<scope>-<name>.<rid>` containers on the desired replica
//! count and spec hash, by executing `plan::plan_replicas` steps through the runtime.
//!
//! Invariants: replacements go one slot at a time: a replacement removes one outdated
//! replica, then creates and starts its successor and checks it runs before the next step;
//! missing replicas (first deploy, scale-up) are created and started together, as voodu does
//! (no pause between them), at most `create_concurrency` at once, then checked after one
//! settle time; a rollout (a spec hash the latest release does not have) opens a release
//! keyed to the desired commit, closed as succeeded once converged or failed on a permanent
//! error.

use std::collections::{BTreeMap, BTreeSet};

use futures_util::StreamExt as _;

use crate::manifest::spec::{DeploymentSpec, Spec};
use crate::model::{Kind, ResourceKey, random_hex, resolve_asset_refs};
use crate::reconcile::plan::{Step, Target, plan_replicas};
use crate::reconcile::{Ctx, Error, Result, blocking};
use crate::runtime::{ContainerSpec, ContainerState, Runtime, labels, parse_ports};
use crate::store::{Desired, Release, ReleasePhase, ResourceStatus, now_unix};

/// Labels that select this agent's containers of one resource.
pub(super) fn container_filter<'a>(
    agent_id: &'a str,
    key: &'a ResourceKey,
) -> [(&'a str, &'a str); 4] {
    [
        (labels::AGENT, agent_id),
        (labels::KIND, key.kind.as_str()),
        (labels::SCOPE, key.scope.as_str()),
        (labels::NAME, key.name.as_str()),
    ]
}

pub(super) async fn reconcile<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<()> {
    let desired = {
        let key = key.clone();
        blocking(&ctx.store, move |store| store.desired(&key)).await?
    };
    let runtime_error = |source| Error::Runtime {
        key: key.clone(),
        source,
    };
    let actual = ctx
        .runtime
        .list(&container_filter(&ctx.agent_id, key))
        .await
        .map_err(runtime_error)?;
    let Some(desired) = desired else {
        for step in plan_replicas(None, &actual) {
            if let Step::Remove { id, name } = step {
                tracing::info!(%key, container = %name, "removing replica: resource left the repo");
                ctx.runtime.remove(&id).await.map_err(runtime_error)?;
            }
        }
        let key = key.clone();
        return blocking(&ctx.store, move |store| store.delete_status(&key)).await;
    };
    let Spec::Deployment(spec) = &desired.spec else {
        return Err(Error::Permanent {
            key: key.clone(),
            message: format!("stored spec is a {}, not a deployment", desired.spec.kind()),
        });
    };
    let target = Target {
        spec_hash: &desired.spec_hash,
        n_replicas: desired.n_replicas,
    };
    let steps = plan_replicas(Some(&target), &actual);
    let release = current_release(ctx, &desired).await?;
    let mut status = ResourceStatus {
        phase: "Progressing".to_owned(),
        message: String::new(),
        desired_replicas: desired.n_replicas,
        running_replicas: count_running(&actual, &desired),
        spec_hash: desired.spec_hash.to_string(),
        release_id: Some(release.id),
        updated_at: now_unix(),
    };
    let taken: BTreeSet<String> = actual
        .iter()
        .map(|container| container.name.clone())
        .collect();
    let result = execute(ctx, &desired, spec, &release, &steps, taken, &mut status).await;
    let actual = ctx
        .runtime
        .list(&container_filter(&ctx.agent_id, key))
        .await
        .map_err(runtime_error)?;
    status.running_replicas = count_running(&actual, &desired);
    status.updated_at = now_unix();
    let converged = plan_replicas(Some(&target), &actual).is_empty();
    let release_end = match &result {
        Ok(()) if converged => {
            status.phase = "Ready".to_owned();
            status.message.clear();
            (release.phase == ReleasePhase::Progressing)
                .then_some((ReleasePhase::Succeeded, String::new()))
        }
        Ok(()) => {
            status.phase = "Degraded".to_owned();
            status.message = "replicas changed while reconciling; another pass follows".to_owned();
            None
        }
        Err(error) => {
            status.phase = if error.is_transient() {
                "Progressing"
            } else {
                "Failed"
            }
            .to_owned();
            status.message = error.to_string();
            (!error.is_transient() && release.phase == ReleasePhase::Progressing)
                .then(|| (ReleasePhase::Failed, error.to_string()))
        }
    };
    let key_for_store = key.clone();
    let release_id = release.id;
    blocking(&ctx.store, move |store| {
        if let Some((phase, message)) = release_end {
            store.finish_release(release_id, phase, &message)?;
        }
        store.put_status(&key_for_store, &status)
    })
    .await?;
    if converged && result.is_ok() {
        Ok(())
    } else {
        result.and(Err(Error::Transient {
            key: key.clone(),
            message: "not converged yet".to_owned(),
        }))
    }
}

/// The release this reconcile works under: the latest one when it has the desired spec hash,
/// else a new progressing release keyed to the desired commit.
async fn current_release<R: Runtime>(ctx: &Ctx<R>, desired: &Desired) -> Result<Release> {
    let desired = desired.clone();
    blocking(&ctx.store, move |store| {
        match store.latest_release(&desired.key)? {
            Some(latest) if latest.spec_hash == desired.spec_hash => Ok(latest),
            _ => {
                let release = store.begin_release(&desired)?;
                tracing::info!(
                    key = %desired.key,
                    commit = desired.commit.short(),
                    spec_hash = desired.spec_hash.short(),
                    release = release.id,
                    "rollout started"
                );
                Ok(release)
            }
        }
    })
    .await
}

async fn execute<R: Runtime>(
    ctx: &Ctx<R>,
    desired: &Desired,
    spec: &DeploymentSpec,
    release: &Release,
    steps: &[Step],
    mut taken: BTreeSet<String>,
    status: &mut ResourceStatus,
) -> Result<()> {
    let key = &desired.key;
    let runtime_error = |source| Error::Runtime {
        key: key.clone(),
        source,
    };
    if steps.is_empty() {
        return Ok(());
    }
    for network in spec.container.effective_networks() {
        ctx.runtime
            .ensure_network(&network)
            .await
            .map_err(runtime_error)?;
    }
    let n_creates = steps
        .iter()
        .filter(|step| matches!(step, Step::Create))
        .count();
    let mut creates_done = false;
    for (index, step) in steps.iter().enumerate() {
        match step {
            // The plan lists creates together; they run as one batch at the first of them.
            Step::Create if creates_done => continue,
            Step::Create => {
                creates_done = true;
                let names =
                    create_replicas(ctx, desired, spec, release, n_creates, &mut taken).await?;
                tracing::info!(%key, containers = ?names, "replicas created");
            }
            Step::Start { id, name } => {
                ctx.runtime.start(id).await.map_err(runtime_error)?;
                check_running(ctx, key, std::slice::from_ref(name)).await?;
                tracing::info!(%key, container = %name, "replica started");
            }
            Step::Replace { id, name } => {
                ctx.runtime.remove(id).await.map_err(runtime_error)?;
                let new_name = create_replicas(ctx, desired, spec, release, 1, &mut taken)
                    .await?
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                tracing::info!(%key, old = %name, new = %new_name, slot = index, "replica replaced");
            }
            Step::Remove { id, name } => {
                ctx.runtime.remove(id).await.map_err(runtime_error)?;
                tracing::info!(%key, container = %name, "replica removed");
            }
        }
        // Keep status live during long rollouts: `status` shows progress slot by slot.
        let actual = ctx
            .runtime
            .list(&container_filter(&ctx.agent_id, key))
            .await
            .map_err(runtime_error)?;
        status.running_replicas = count_running(&actual, desired);
        status.updated_at = now_unix();
        let snapshot = status.clone();
        let key = key.clone();
        blocking(&ctx.store, move |store| store.put_status(&key, &snapshot)).await?;
    }
    Ok(())
}

/// Creates and starts `n` new replicas concurrently (at most `create_concurrency` at once),
/// then, after one settle time, checks that each still runs. Replica ids are unique among
/// `taken` names, which grows by the new ones. Returns the new names; on failure, the first
/// error after every create has ended (replicas that did start stay and count next pass).
async fn create_replicas<R: Runtime>(
    ctx: &Ctx<R>,
    desired: &Desired,
    spec: &DeploymentSpec,
    release: &Release,
    n: usize,
    taken: &mut BTreeSet<String>,
) -> Result<Vec<String>> {
    let mut containers = Vec::with_capacity(n);
    while containers.len() < n {
        let container = container_spec(&ctx.agent_id, &ctx.assets_root, desired, spec, release)?;
        if taken.insert(container.name.clone()) {
            containers.push(container);
        }
    }
    // Collected first: a lazy `map` closure inside the stream makes the handler future's
    // lifetimes too general for `spawn`.
    let creates: Vec<_> = containers
        .iter()
        .map(|container| create_and_start(ctx, &desired.key, container))
        .collect();
    let results: Vec<Result<String>> = futures_util::stream::iter(creates)
        .buffer_unordered(ctx.options.create_concurrency.max(1))
        .collect()
        .await;
    let mut names = Vec::with_capacity(n);
    let mut first_error = None;
    for result in results {
        match result {
            Ok(name) => names.push(name),
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    if let Some(error) = first_error {
        return Err(error);
    }
    check_running(ctx, &desired.key, &names).await?;
    Ok(names)
}

/// Creates and starts one replica; a container that cannot start is removed again.
async fn create_and_start<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    container: &ContainerSpec,
) -> Result<String> {
    let runtime_error = |source| Error::Runtime {
        key: key.clone(),
        source,
    };
    let id = ctx
        .runtime
        .create(container)
        .await
        .map_err(|error| match error {
            crate::runtime::Error::ImageMissing { .. } => Error::Permanent {
                key: key.clone(),
                message: format!("{error}; build or load it on this host"),
            },
            other => runtime_error(other),
        })?;
    if let Err(error) = ctx.runtime.start(&id).await {
        // A created-but-unstartable container would count as a replica: take it away.
        let _ = ctx.runtime.remove(&id).await;
        return Err(match error {
            crate::runtime::Error::Invalid { .. } | crate::runtime::Error::NotFound { .. } => {
                Error::Permanent {
                    key: key.clone(),
                    message: format!("cannot start {}: {error}", container.name),
                }
            }
            other => runtime_error(other),
        });
    }
    Ok(container.name.clone())
}

/// After starts, give the processes `start_settle` to fail fast, then require each running.
async fn check_running<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    names: &[String],
) -> Result<()> {
    if !ctx.options.start_settle.is_zero() {
        tokio::time::sleep(ctx.options.start_settle).await;
    }
    let actual = ctx
        .runtime
        .list(&container_filter(&ctx.agent_id, key))
        .await
        .map_err(|source| Error::Runtime {
            key: key.clone(),
            source,
        })?;
    for name in names {
        match actual.iter().find(|container| &container.name == name) {
            Some(container) if container.state == ContainerState::Running => {}
            Some(container) => {
                return Err(Error::Transient {
                    key: key.clone(),
                    message: format!(
                        "replica {name} is {:?} right after start; check its command and image",
                        container.state
                    ),
                });
            }
            None => {
                return Err(Error::Transient {
                    key: key.clone(),
                    message: format!("replica {name} vanished right after start"),
                });
            }
        }
    }
    Ok(())
}

fn count_running(actual: &[crate::runtime::Container], desired: &Desired) -> usize {
    actual
        .iter()
        .filter(|container| {
            container.state == ContainerState::Running
                && container.label(labels::MANIFEST_HASH) == Some(desired.spec_hash.as_str())
        })
        .count()
}

/// The container for one new replica: voodu's name, labels and `-e` set (spec §4.4, §6).
fn container_spec(
    agent_id: &str,
    assets_root: &std::path::Path,
    desired: &Desired,
    spec: &DeploymentSpec,
    release: &Release,
) -> Result<ContainerSpec> {
    let key = &desired.key;
    let replica_id = random_hex(2);
    // `${asset.…}` becomes the file's host path where voodu resolves it (spec §3.2).
    let resolve = |text: &str| resolve_asset_refs(text, assets_root);
    let mut ports = Vec::new();
    for port in spec.normalized_ports().iter().map(|port| resolve(port)) {
        let mappings = parse_ports(&port).ok_or_else(|| Error::Permanent {
            key: key.clone(),
            message: format!("port {port:?} is not `[ip:][host_port:]container_port[/proto]`"),
        })?;
        ports.extend(mappings);
    }
    let labels = BTreeMap::from([
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
        (
            labels::KIND.to_owned(),
            Kind::Deployment.as_str().to_owned(),
        ),
        (labels::SCOPE.to_owned(), key.scope.clone()),
        (labels::NAME.to_owned(), key.name.clone()),
        (labels::REPLICA_ID.to_owned(), replica_id.clone()),
        (
            labels::MANIFEST_HASH.to_owned(),
            desired.spec_hash.to_string(),
        ),
        (labels::CREATED_AT.to_owned(), rfc3339_seconds(now_unix())),
        (labels::RELEASE_ID.to_owned(), release.id.to_string()),
        (
            labels::ROLE.to_owned(),
            Kind::Deployment.as_str().to_owned(),
        ),
        (labels::AGENT.to_owned(), agent_id.to_owned()),
    ]);
    let mut env = vec![
        format!("VOODU_NAME={}", key.name),
        format!("VOODU_SCOPE={}", key.scope),
    ];
    env.extend(
        spec.container
            .env
            .iter()
            .map(|(name, value)| format!("{name}={}", resolve(value))),
    );
    let aliases = if key.scope.is_empty() {
        vec![key.name.to_lowercase()]
    } else {
        vec![
            format!("{}.{}", key.name, key.scope).to_lowercase(),
            format!("{}.{}.voodu", key.name, key.scope).to_lowercase(),
        ]
    };
    Ok(ContainerSpec {
        name: format!("{}.{replica_id}", key.app_id()),
        image: resolve(&spec.container.effective_image(key)),
        command: spec
            .container
            .command
            .as_ref()
            .map(|command| command.iter().map(|part| resolve(part)).collect()),
        env,
        labels,
        ports,
        binds: spec
            .container
            .volumes
            .iter()
            .map(|volume| resolve(volume))
            .collect(),
        restart: spec.effective_restart().to_owned(),
        networks: spec.container.effective_networks(),
        aliases,
        extra_hosts: spec.container.extra_hosts.clone(),
        cap_add: spec.container.cap_add.clone(),
        ..ContainerSpec::default()
    })
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a Unix time (civil-from-days, proleptic Gregorian).
fn rfc3339_seconds(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let seconds = unix.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        seconds / 3600,
        seconds % 3600 / 60,
        seconds % 60
    )
}

#[cfg(test)]
mod tests {
    use super::rfc3339_seconds;

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_seconds(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339_seconds(951_782_400), "2000-02-29T00:00:00Z");
    }
}
