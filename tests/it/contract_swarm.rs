//! The runtime contract for Docker Swarm's verbs (`runtime::service`): the same checks run
//! against `FakeRuntime` and a real single-node swarm (`SwarmGuard`), so what the Swarm
//! handlers' tests assume of the fake holds on the engine: tasks per slot carrying the labels
//! of the spec they run, a rolling update that completes, a scale that replaces no task, an
//! update whose new task is unhealthy rolled back by Swarm (`rollback_*`, the previous spec
//! current again), a `replicated-job` that completes or fails with its exit code, configs
//! that cannot be removed while a service uses them.
//!
//! Each check is a generic `check_*` function; `swarm_contract!` makes `fake_*` (always
//! runs) and `docker_*` (ignored unless `--include-ignored`, as scripts/test runs it).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use voodu_agent::runtime::{
    ContainerSpec, DockerRuntime, Error, FakeRuntime, HealthCheck, Runtime, ServiceMode,
    ServiceSpec, Task, TaskState, UpdateOrder, UpdatePolicy, UpdateState, labels,
};

use crate::support::swarm::SwarmGuard;
use crate::support::{DockerGuard, TestResult, test_image, unique};

macro_rules! swarm_contract {
    ($($check:ident => $fake:ident, $docker:ident;)*) => {$(
        #[tokio::test]
        async fn $fake() -> TestResult {
            let scope = unique("t");
            let runtime = FakeRuntime::with_images(&[&test_image()]);
            $check(&runtime, &scope).await
        }

        #[tokio::test]
        #[ignore = "needs a Docker engine (a single-node swarm is made on it): scripts/test runs it (cargo test -- --include-ignored)"]
        async fn $docker() -> TestResult {
            let scope = unique("t");
            // Dropped in reverse: the services go (SwarmGuard), then any container left.
            let _containers = DockerGuard::new(&scope);
            let _swarm = SwarmGuard::new(&scope)?;
            let runtime = DockerRuntime::connect().await?;
            $check(&runtime, &scope).await
        }
    )*};
}

swarm_contract! {
    check_service_scale_and_roll => fake_service_scale_and_roll, docker_service_scale_and_roll;
    check_unhealthy_update_rolls_back => fake_unhealthy_update_rolls_back, docker_unhealthy_update_rolls_back;
    check_jobs_complete_or_fail => fake_jobs_complete_or_fail, docker_jobs_complete_or_fail;
    check_configs => fake_configs, docker_configs;
    check_containers_work_in_a_swarm => fake_containers_work_in_a_swarm, docker_containers_work_in_a_swarm;
}

/// How long the engine may take to converge a service (a liveness bound).
const CONVERGE: Duration = Duration::from_secs(90);

fn service(scope: &str, name: &str, version: &str, replicas: u64) -> ServiceSpec {
    ServiceSpec {
        name: format!("{scope}-{name}"),
        labels: BTreeMap::from([(labels::SCOPE.to_owned(), scope.to_owned())]),
        task: ContainerSpec {
            image: test_image(),
            command: Some(vec!["sleep".to_owned(), "300".to_owned()]),
            labels: BTreeMap::from([
                (labels::SCOPE.to_owned(), scope.to_owned()),
                (labels::MANIFEST_HASH.to_owned(), version.to_owned()),
            ]),
            ..ContainerSpec::default()
        },
        mode: ServiceMode::Replicated { replicas },
        update: UpdatePolicy {
            order: UpdateOrder::StartFirst,
            monitor: Duration::from_secs(1),
            rollback_on_failure: true,
        },
        constraints: Vec::new(),
        configs: Vec::new(),
        published: Vec::new(),
        health: None,
        stop_grace: Duration::from_secs(2),
        restart_on_failure: true,
        volume_labels: BTreeMap::new(),
    }
}

/// Polls the service's tasks until `done` holds; its last answer.
async fn tasks_until<R: Runtime>(
    runtime: &R,
    id: &str,
    what: &str,
    done: impl Fn(&[Task]) -> bool,
) -> TestResult<Vec<Task>> {
    let started = Instant::now();
    loop {
        let tasks = runtime.list_tasks(id).await?;
        if done(&tasks) {
            return Ok(tasks);
        }
        if started.elapsed() > CONVERGE {
            return Err(format!("timed out waiting for {what}: {tasks:#?}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Tasks Swarm wants running and that run, with `version`.
fn running(tasks: &[Task], version: &str) -> Vec<Task> {
    tasks
        .iter()
        .filter(|task| {
            task.desired == TaskState::Running
                && task.state == TaskState::Running
                && task.labels.get(labels::MANIFEST_HASH).map(String::as_str) == Some(version)
        })
        .cloned()
        .collect()
}

async fn one_service<R: Runtime>(
    runtime: &R,
    scope: &str,
) -> TestResult<voodu_agent::runtime::Service> {
    let mut services = runtime.list_services(&[(labels::SCOPE, scope)]).await?;
    assert_eq!(services.len(), 1, "{services:#?}");
    Ok(services.remove(0))
}

async fn check_service_scale_and_roll<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    let spec = service(scope, "web", "a", 2);
    let id = runtime.create_service(&spec, None).await?;
    let duplicate = runtime.create_service(&spec, None).await;
    assert!(
        matches!(duplicate, Err(Error::Conflict { .. })),
        "{duplicate:?}"
    );
    let tasks = tasks_until(runtime, &id, "2 running tasks", |tasks| {
        running(tasks, "a").len() == 2
    })
    .await?;
    let mut slots: Vec<Option<u64>> = running(&tasks, "a").iter().map(|task| task.slot).collect();
    slots.sort();
    assert_eq!(slots, [Some(1), Some(2)]);
    let listed = one_service(runtime, scope).await?;
    assert_eq!(
        (listed.id.as_str(), listed.name.as_str()),
        (id.as_str(), spec.name.as_str())
    );
    assert_eq!(listed.replicas, Some(2));
    assert_eq!(
        listed
            .task_labels
            .get(labels::MANIFEST_HASH)
            .map(String::as_str),
        Some("a")
    );

    // Scale: the two tasks stay, one is added.
    let before: Vec<String> = running(&tasks, "a")
        .into_iter()
        .map(|task| task.id)
        .collect();
    let scaled = service(scope, "web", "a", 3);
    runtime
        .update_service(&id, listed.version, &scaled, None)
        .await?;
    let tasks = tasks_until(runtime, &id, "3 running tasks", |tasks| {
        running(tasks, "a").len() == 3
    })
    .await?;
    let after: Vec<String> = running(&tasks, "a")
        .into_iter()
        .map(|task| task.id)
        .collect();
    assert!(
        before.iter().all(|id| after.contains(id)),
        "{before:?} → {after:?}"
    );
    // A stale version is refused.
    let stale = runtime
        .update_service(&id, listed.version, &scaled, None)
        .await;
    assert!(matches!(stale, Err(Error::Conflict { .. })), "{stale:?}");

    // A new template rolls every slot and completes.
    let listed = one_service(runtime, scope).await?;
    let rolled = service(scope, "web", "b", 3);
    runtime
        .update_service(&id, listed.version, &rolled, None)
        .await?;
    tasks_until(runtime, &id, "3 tasks of b", |tasks| {
        running(tasks, "b").len() == 3 && running(tasks, "a").is_empty()
    })
    .await?;
    let started = Instant::now();
    loop {
        let listed = one_service(runtime, scope).await?;
        match listed.update.as_ref().map(|update| update.state) {
            Some(UpdateState::Completed) => break,
            None | Some(UpdateState::Updating) if started.elapsed() < CONVERGE => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return Err(format!("update state {other:?}").into()),
        }
    }

    runtime.remove_service(&id).await?;
    runtime.remove_service(&id).await?;
    assert!(
        runtime
            .list_services(&[(labels::SCOPE, scope)])
            .await?
            .is_empty()
    );
    Ok(())
}

async fn check_unhealthy_update_rolls_back<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    let spec = service(scope, "api", "good", 1);
    let id = runtime.create_service(&spec, None).await?;
    tasks_until(runtime, &id, "a running task", |tasks| {
        running(tasks, "good").len() == 1
    })
    .await?;
    let listed = one_service(runtime, scope).await?;
    let mut bad = service(scope, "api", "bad", 1);
    bad.health = Some(HealthCheck {
        test: vec!["CMD".to_owned(), "false".to_owned()],
        interval: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        retries: 1,
        start_period: Duration::ZERO,
    });
    runtime
        .update_service(&id, listed.version, &bad, None)
        .await?;
    let started = Instant::now();
    let rolled_back = loop {
        let listed = one_service(runtime, scope).await?;
        match &listed.update {
            Some(update) if update.state == UpdateState::RollbackCompleted => break listed,
            // Swarm sets the update status a moment after the update was accepted.
            None if started.elapsed() < CONVERGE => {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Some(update)
                if started.elapsed() < CONVERGE
                    && !matches!(
                        update.state,
                        UpdateState::Completed | UpdateState::Paused | UpdateState::RollbackPaused
                    ) =>
            {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            other => return Err(format!("expected rollback_completed, got {other:?}").into()),
        }
    };
    let update = rolled_back.update.clone().ok_or("no update status")?;
    // Swarm's message names the failed task while it rolls back, then says only this.
    assert_eq!(update.message, "rollback completed", "{update:?}");
    assert_eq!(
        rolled_back
            .task_labels
            .get(labels::MANIFEST_HASH)
            .map(String::as_str),
        Some("good"),
        "the previous spec is current again"
    );
    let tasks = runtime.list_tasks(&id).await?;
    assert_eq!(running(&tasks, "good").len(), 1, "{tasks:#?}");
    let failed = tasks
        .iter()
        .find(|task| {
            task.labels.get(labels::MANIFEST_HASH).map(String::as_str) == Some("bad")
                && task.state == TaskState::Failed
        })
        .ok_or_else(|| format!("no failed task of the bad spec: {tasks:#?}"))?;
    assert!(failed.error.contains("unhealthy"), "{failed:?}");
    runtime.remove_service(&id).await?;
    Ok(())
}

async fn check_jobs_complete_or_fail<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    let job = |name: &str, script: &str| {
        let mut spec = service(scope, name, "j", 1);
        spec.mode = ServiceMode::ReplicatedJob;
        spec.restart_on_failure = false;
        spec.task.command = Some(vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()]);
        spec
    };
    let ok = runtime
        .create_service(&job("ok", "echo hi; exit 0"), None)
        .await?;
    let bad = runtime
        .create_service(&job("bad", "echo no; exit 3"), None)
        .await?;
    let done = |tasks: &[Task]| tasks.iter().any(|task| task.state.ended());
    let tasks = tasks_until(runtime, &ok, "the job's task to end", done).await?;
    let task = tasks
        .iter()
        .find(|task| task.state.ended())
        .ok_or("no task")?;
    assert_eq!(
        (task.state, task.exit_code),
        (TaskState::Complete, Some(0)),
        "{task:?}"
    );
    assert_eq!(task.slot, None);
    let logs = runtime.task_logs(&task.id, 10).await?;
    assert!(logs.contains("hi"), "{logs:?}");
    let tasks = tasks_until(runtime, &bad, "the failing job's task to end", done).await?;
    let task = tasks
        .iter()
        .find(|task| task.state.ended())
        .ok_or("no task")?;
    assert_eq!(
        (task.state, task.exit_code),
        (TaskState::Failed, Some(3)),
        "{task:?}"
    );
    assert!(task.error.contains("non-zero exit (3)"), "{task:?}");
    let listed = runtime.list_services(&[(labels::SCOPE, scope)]).await?;
    assert!(listed.iter().all(|service| service.replicas.is_none()));
    runtime.remove_service(&ok).await?;
    runtime.remove_service(&bad).await?;
    Ok(())
}

async fn check_configs<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    let scoped = BTreeMap::from([(labels::SCOPE.to_owned(), scope.to_owned())]);
    let name = format!("{scope}-conf-0123abcd");
    let config = runtime
        .create_config(&name, &scoped, b"listen 80\n")
        .await?;
    let again = runtime.create_config(&name, &scoped, b"other").await;
    assert!(matches!(again, Err(Error::Conflict { .. })), "{again:?}");
    let listed = runtime.list_configs(&[(labels::SCOPE, scope)]).await?;
    assert_eq!(
        listed
            .iter()
            .map(|config| config.name.as_str())
            .collect::<Vec<_>>(),
        [name.as_str()]
    );
    let mut spec = service(scope, "uses", "a", 1);
    spec.configs.push(voodu_agent::runtime::ConfigMount {
        config_id: config.clone(),
        config_name: name.clone(),
        target: "/etc/app.conf".to_owned(),
    });
    let id = runtime.create_service(&spec, None).await?;
    let in_use = runtime.remove_config(&config).await;
    assert!(
        matches!(&in_use, Err(Error::Invalid { message }) if message.contains("in use")),
        "{in_use:?}"
    );
    runtime.remove_service(&id).await?;
    runtime.remove_config(&config).await?;
    runtime.remove_config(&config).await?;
    assert!(
        runtime
            .list_configs(&[(labels::SCOPE, scope)])
            .await?
            .is_empty()
    );
    Ok(())
}

/// Ordinary containers (the agent's default engine) keep working on a swarm member: create,
/// start and remove one on a bridge network, beside a service.
async fn check_containers_work_in_a_swarm<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    let node = runtime
        .swarm_node()
        .await?
        .ok_or("the engine is in no swarm")?;
    assert!(node.manager);
    let nodes = runtime.list_nodes().await?;
    assert!(
        nodes.iter().any(|listed| listed.id == node.node_id),
        "{nodes:?}"
    );
    let network = format!("{scope}-net");
    runtime.ensure_network(&network).await?;
    let container = ContainerSpec {
        name: format!("{scope}-plain"),
        image: test_image(),
        command: Some(vec!["sleep".to_owned(), "300".to_owned()]),
        labels: BTreeMap::from([(labels::SCOPE.to_owned(), scope.to_owned())]),
        restart: "no".to_owned(),
        networks: vec![network.clone()],
        ..ContainerSpec::default()
    };
    let id = runtime.create(&container).await?;
    runtime.start(&id).await?;
    assert!(runtime.inspect(&id).await?.running);
    runtime.remove(&id).await?;
    let overlay = format!("{scope}-ov");
    runtime.ensure_overlay(&overlay).await?;
    runtime.ensure_overlay(&overlay).await?;
    let _ = std::process::Command::new("docker")
        .args(["network", "rm", &network, &overlay])
        .output();
    Ok(())
}
