//! One-shot runs under Docker Swarm: each run (a job or cronjob run, a deployment's release
//! hook) is a `replicated-job` service (one task, not restarted), named after the run's
//! container name (`<scope>-<name>-<runid>`: a service name has no dot). The one run
//! mechanism (`oneshot.rs`) and the job handler keep runs, waiters, timeouts and history as
//! on containers; this module is the unit's lifecycle on Swarm: list, find, create (started
//! at once), where its task stands (`outcome`; `wait` asks again every `POLL`, in a waiter,
//! never in a pass), its output, when it ended.
//!
//! Invariants: a run's service carries the run's container name (`voodu.container`), so the
//! run records, which name containers, find it; a job lists only services in its own role,
//! so a release hook service (of a deployment `<name>`, role `release`) is never taken for
//! a run, even of a job called `<name>-release`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::container::{Identity, Launch};
use super::{Shape, build_service, service_filter};
use crate::manifest::spec::Container as ContainerSpec;
use crate::model::ResourceKey;
use crate::reconcile::{context::Ctx, error::Error, error::Result};
use crate::runtime::{Container, ContainerState, Runtime, ServiceMode, Task, TaskState, labels};

/// The service label holding the run's container name.
const CONTAINER: &str = "voodu.container";
/// How often a waiter asks Swarm about a run's task.
const POLL: Duration = Duration::from_secs(1);

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
        .map_err(Error::runtime(key))?;
    let mut runs = Vec::with_capacity(services.len());
    for service in services {
        let name = service
            .label(CONTAINER)
            .map_or_else(|| service.name.clone(), ToOwned::to_owned);
        runs.push(as_run(ctx, key, service, name).await?);
    }
    Ok(runs)
}

/// A run's service as a container named `name`: its id, labels, and the state of its task
/// (running until it ended).
async fn as_run<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    service: crate::runtime::Service,
    name: String,
) -> Result<Container> {
    let tasks = ctx
        .runtime
        .list_tasks(&service.id)
        .await
        .map_err(Error::runtime(key))?;
    let state = match task_of(&tasks) {
        Some(task) if task.state.ended() => ContainerState::Exited,
        _ => ContainerState::Running,
    };
    Ok(Container {
        id: service.id,
        name,
        image: service.image,
        labels: service.labels,
        state,
    })
}

/// This agent's services of `key` in `role`, as containers named as their runs (the
/// `voodu.container` label), without their tasks' state.
pub(in crate::reconcile::handlers) async fn in_role<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    role: &str,
) -> Result<Vec<Container>> {
    let mut filter = super::owned_filter(&ctx.agent_id, key).to_vec();
    filter.push((labels::ROLE, role));
    let services = ctx
        .runtime
        .list_services(&filter)
        .await
        .map_err(Error::runtime(key))?;
    Ok(services
        .into_iter()
        .map(|service| Container {
            name: service
                .label(CONTAINER)
                .map_or_else(|| service.name.clone(), ToOwned::to_owned),
            id: service.id,
            image: service.image,
            labels: service.labels,
            state: ContainerState::Running,
        })
        .collect())
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
            // When it was created: a restarted agent gives a run what is left of its
            // timeout (`oneshot::stand`), as the label on a container does.
            labels: BTreeMap::from([
                (CONTAINER.to_owned(), identity.name.clone()),
                (labels::SPEC_HASH.to_owned(), spec_hash.to_owned()),
                (
                    labels::CREATED_AT.to_owned(),
                    crate::base::rfc3339_seconds(crate::store::now_unix()),
                ),
            ]),
            volume_labels: BTreeMap::new(),
        },
    )?;
    built.spec.restart_on_failure = false;
    let (_, id) = super::create_service(ctx, key, &built).await?;
    Ok(id)
}

/// Before a run: the overlay networks exist and the image is on this node.
pub(in crate::reconcile::handlers) async fn prepare<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    container: &ContainerSpec,
) -> Result<()> {
    super::prepare(ctx, key, container).await
}

/// Where the run's task stands, at one look: `Some(exit code)` once it ended, `None` while it
/// runs, an error saying why it has no exit code (rejected: an image no node has, …; or the
/// service is gone).
pub(in crate::reconcile::handlers) async fn outcome<R: Runtime>(
    runtime: &R,
    id: &str,
) -> crate::runtime::Result<Option<i64>> {
    let tasks = runtime.list_tasks(id).await?;
    if let Some(task) = task_of(&tasks)
        && task.state.ended()
    {
        return match (task.exit_code, task.state) {
            (Some(code), _) => Ok(Some(code)),
            (None, TaskState::Complete) => Ok(Some(0)),
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
        && runtime
            .list_services(&[])
            .await
            .is_ok_and(|services| !services.iter().any(|service| service.id == id))
    {
        return Err(crate::runtime::Error::NotFound {
            what: format!("service {id}"),
        });
    }
    Ok(None)
}

/// Waits until the run's task ended: its exit code, or an error saying why it has none.
/// Swarm has no wait for a service: a waiter (never a pass) asks every `POLL`.
pub(in crate::reconcile::handlers) async fn wait<R: Runtime>(
    runtime: &R,
    timer: &crate::reconcile::run::timer::Timer,
    id: &str,
) -> crate::runtime::Result<i64> {
    loop {
        if let Some(code) = outcome(runtime, id).await? {
            return Ok(code);
        }
        timer
            .sleep(crate::reconcile::run::timer::What::Unit, POLL)
            .await;
    }
}

/// The run service called after the run's container `name`, among this agent's services that
/// carry every label of `filter`, as a container named as the run.
pub(in crate::reconcile::handlers) async fn find<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    filter: &[(&str, &str)],
    name: &str,
) -> Result<Option<Container>> {
    let service_name = service_name(name);
    let services = ctx
        .runtime
        .list_services(filter)
        .await
        .map_err(Error::runtime(key))?;
    let Some(service) = services
        .into_iter()
        .find(|service| service.name == service_name)
    else {
        return Ok(None);
    };
    as_run(ctx, key, service, name.to_owned()).await.map(Some)
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
