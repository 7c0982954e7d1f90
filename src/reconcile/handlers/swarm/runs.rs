//! Job and cronjob runs under Docker Swarm: each run is a `replicated-job` service (one
//! task, not restarted), named after the run's container name (`<scope>-<name>-<runid>`:
//! a service name has no dot). The job handler keeps its runs, waiters, timeouts and
//! history as on containers (`job.rs`); this module is the run's lifecycle on Swarm, which
//! `job.rs` calls through `Runs`: list, create (started at once), wait for its task to end,
//! its output, when it ended, remove. A deployment's release hook runs the same way
//! (`run_hook`: create, wait under its timeout, output, remove), as a service of the
//! deployment in role `release`.
//!
//! Invariants: a run's service carries the run's container name (`voodu.container`), so the
//! run records, which name containers, find it; a job lists only services in its own role,
//! so a release hook service (of a deployment `<name>`, role `release`) is never taken for
//! a run, even of a job called `<name>-release`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::container::{Identity, Launch};
use super::super::hooks::{OneShot, Ran};
use super::super::launch::start_error;
use super::{Shape, build_service, owned_filter, service_filter, with_configs};
use crate::manifest::spec::Container as ContainerSpec;
use crate::model::ResourceKey;
use crate::reconcile::{Ctx, Error, Result};
use crate::runtime::{Container, ContainerState, Runtime, ServiceMode, Task, TaskState, labels};

/// The service label holding the run's container name.
const CONTAINER: &str = "voodu.container";
/// How often a waiter asks Swarm about a run's task.
const POLL: Duration = Duration::from_secs(1);

fn runtime_error(key: &ResourceKey) -> impl Fn(crate::runtime::Error) -> Error + '_ {
    move |source| Error::Runtime {
        key: key.clone(),
        source,
    }
}

/// The service of the run whose container name is `container_name`.
fn service_name(container_name: &str) -> String {
    container_name.replace('.', "-")
}

/// The run's task: the newest one (a job has one).
fn task_of(tasks: &[Task]) -> Option<&Task> {
    tasks.iter().max_by_key(|task| task.since)
}

/// The key's runs, as containers named as their run records: the service id, and the
/// state of its task (running until it ended).
pub(in crate::reconcile::handlers) async fn list<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<Vec<Container>> {
    let services = ctx
        .runtime
        .list_services(&service_filter(&ctx.agent_id, key))
        .await
        .map_err(runtime_error(key))?;
    let mut runs = Vec::with_capacity(services.len());
    for service in services {
        let tasks = ctx
            .runtime
            .list_tasks(&service.id)
            .await
            .map_err(runtime_error(key))?;
        let state = match task_of(&tasks) {
            Some(task) if task.state.ended() => ContainerState::Exited,
            _ => ContainerState::Running,
        };
        runs.push(Container {
            id: service.id.clone(),
            name: service
                .label(CONTAINER)
                .map_or_else(|| service.name.clone(), ToOwned::to_owned),
            image: service.image.clone(),
            labels: service.labels.clone(),
            state,
        });
    }
    Ok(runs)
}

/// Creates the run's service (its task starts at once); returns its id.
#[allow(clippy::too_many_arguments)]
pub(in crate::reconcile::handlers) async fn create<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    identity: &Identity,
    container: &ContainerSpec,
    launch: &Launch,
    spec_hash: &str,
    asset_digests: &BTreeMap<String, String>,
) -> Result<String> {
    let mut service_identity = identity.clone();
    service_identity.name = service_name(&identity.name);
    let mut built = build_service(
        ctx,
        key,
        &service_identity,
        container,
        launch,
        Shape {
            mode: ServiceMode::ReplicatedJob,
            probes: None,
            drain: None,
            stop_first: false,
            constraints: Vec::new(),
            asset_digests,
            labels: BTreeMap::from([
                (CONTAINER.to_owned(), identity.name.clone()),
                (labels::SPEC_HASH.to_owned(), spec_hash.to_owned()),
            ]),
            volume_labels: BTreeMap::new(),
        },
    )?;
    built.spec.restart_on_failure = false;
    let spec = with_configs(ctx, key, &built).await?;
    let auth = super::deployment::registry_auth(ctx, key, &spec.task.image).await?;
    ctx.runtime
        .create_service(&spec, auth.as_ref())
        .await
        .map_err(runtime_error(key))
}

/// Before a run: the overlay networks exist and the image is on this node.
pub(in crate::reconcile::handlers) async fn prepare<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    container: &ContainerSpec,
) -> Result<()> {
    super::deployment::prepare(ctx, key, container).await
}

/// Waits until the run's task ended: its exit code, or an error saying why it has none
/// (rejected: an image no node has, …).
pub(in crate::reconcile::handlers) async fn wait<R: Runtime>(
    ctx: &Ctx<R>,
    id: &str,
) -> crate::runtime::Result<i64> {
    loop {
        let tasks = ctx.runtime.list_tasks(id).await?;
        if let Some(task) = task_of(&tasks)
            && task.state.ended()
        {
            return match (task.exit_code, task.state) {
                (Some(code), _) => Ok(code),
                (None, TaskState::Complete) => Ok(0),
                (None, state) => Err(crate::runtime::Error::Invalid {
                    message: format!(
                        "its task {}: {}",
                        state.as_str(),
                        if task.error.is_empty() {
                            &task.message
                        } else {
                            &task.error
                        }
                    ),
                }),
            };
        }
        if tasks.is_empty()
            && ctx
                .runtime
                .list_services(&[])
                .await
                .is_ok_and(|services| !services.iter().any(|service| service.id == id))
        {
            return Err(crate::runtime::Error::NotFound {
                what: format!("service {id}"),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The last `tail` lines of the run's output.
pub(in crate::reconcile::handlers) async fn logs<R: Runtime>(
    ctx: &Ctx<R>,
    id: &str,
    tail: usize,
) -> crate::runtime::Result<String> {
    let tasks = ctx.runtime.list_tasks(id).await?;
    match task_of(&tasks) {
        Some(task) => ctx.runtime.task_logs(&task.id, tail).await,
        None => Ok(String::new()),
    }
}

/// When the run's task ended (Unix seconds), if it did.
pub(in crate::reconcile::handlers) async fn finished_at<R: Runtime>(
    ctx: &Ctx<R>,
    id: &str,
) -> Option<i64> {
    let tasks = ctx.runtime.list_tasks(id).await.ok()?;
    task_of(&tasks)
        .filter(|task| task.state.ended())
        .map(|task| task.since)
        .filter(|since| *since > 0)
}

/// A deployment's release hook under Swarm: a `replicated-job` service of the deployment
/// (a leftover of the same name, from an interrupted pass, removed first), waited for at
/// most the hook's timeout (then removed, its outcome a timeout), its last `tail` lines of
/// output read, then removed. Shutdown interrupts the wait (the service is left for the
/// next pass to remove); a task Swarm could not run fails as a container that cannot start.
pub(in crate::reconcile::handlers) async fn run_hook<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    run: &OneShot<'_>,
    tail: usize,
) -> Result<Ran> {
    let name = service_name(&run.identity.name);
    remove_named(ctx, key, &name).await?;
    let id = create(
        ctx,
        key,
        &run.identity,
        run.container,
        &run.launch,
        run.spec_hash,
        run.asset_digests,
    )
    .await?;
    let exit_code = tokio::select! {
        waited = tokio::time::timeout(run.timeout, wait(ctx, &id)) => match waited {
            Ok(Ok(code)) => Some(code),
            Ok(Err(error)) => {
                if let Err(removal) = ctx.runtime.remove_service(&id).await {
                    tracing::debug!(%key, service = %name, %removal, "hook service not removed; the next run removes it");
                }
                return Err(start_error(key, &name, error));
            }
            Err(_) => None,
        },
        () = ctx.shutdown.cancelled() => {
            return Err(Error::Stopped {
                key: key.clone(),
                waiting_for: format!("waiting for service {name}"),
            });
        }
    };
    let logs = match exit_code {
        Some(_) => logs(ctx, &id, tail).await.unwrap_or_default(),
        None => String::new(),
    };
    ctx.runtime
        .remove_service(&id)
        .await
        .map_err(runtime_error(key))?;
    Ok(Ran { exit_code, logs })
}

/// Removes this agent's service of `key` called `name`, if any.
async fn remove_named<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey, name: &str) -> Result<()> {
    let services = ctx
        .runtime
        .list_services(&owned_filter(&ctx.agent_id, key))
        .await
        .map_err(runtime_error(key))?;
    for service in services.iter().filter(|service| service.name == name) {
        tracing::info!(%key, service = %name, "removing a hook service left by an interrupted pass");
        ctx.runtime
            .remove_service(&service.id)
            .await
            .map_err(runtime_error(key))?;
    }
    Ok(())
}
