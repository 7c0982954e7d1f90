//! The Swarm handlers on the fake runtime (`ReconcileOptions::engine = Swarm`), under
//! paused time: the same reconciler as on containers, what its passes send Swarm, and
//! what a rollout and status make of Swarm's answers. The real engine is `swarm_docker.rs`.

use std::time::Duration;

use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::reconcile::Engine;
use voodu_agent::runtime::{FakeRuntime, Node, NodeState, Runtime, TaskState, labels};
use voodu_agent::store::{FailureReason, ReleasePhase};

use crate::support::{Harness, TestResult};

fn swarm_harness() -> TestResult<Harness> {
    let mut harness = Harness::with_fake(FakeRuntime::with_images(&["busybox"]))?;
    harness.options.engine = Engine::Swarm;
    harness.options.ready_settle = Duration::ZERO;
    Ok(harness)
}

fn web(replicas: u32, version: &str, extra: &str) -> String {
    format!(
        "deployment \"shop\" \"web\" {{\n  image = \"busybox\"\n  command = [\"sleep\", \"3600\"]\n  replicas = {replicas}\n  env = {{ V = \"{version}\" }}\n{extra}}}\n"
    )
}

fn web_key() -> ResourceKey {
    ResourceKey::new(Kind::Deployment, "shop", "web")
}

/// The ids of the service's tasks Swarm wants running.
async fn running_tasks(harness: &Harness, service: &str) -> TestResult<Vec<String>> {
    let services = harness.fake.list_services(&[]).await?;
    let service = services
        .iter()
        .find(|listed| listed.name == service)
        .ok_or("no service")?;
    let mut ids: Vec<String> = harness
        .fake
        .list_tasks(&service.id)
        .await?
        .into_iter()
        .filter(|task| task.desired == TaskState::Running && task.state == TaskState::Running)
        .map(|task| task.id)
        .collect();
    ids.sort();
    Ok(ids)
}

#[tokio::test(start_paused = true)]
async fn a_deployment_is_one_service_scaled_without_churn_and_a_swarm_rollback_fails_its_release()
-> TestResult {
    let mut harness = swarm_harness()?;
    harness.start()?;
    let first = harness.push(&[("web.hcl", &web(2, "1", ""))])?;
    harness
        .status_where(&web_key(), |status| {
            status.phase == "Ready" && status.running_replicas == 2
        })
        .await?;
    let services = harness
        .fake
        .list_services(&[(labels::SCOPE, "shop")])
        .await?;
    assert_eq!(services.len(), 1);
    assert_eq!(services[0].name, "shop-web");
    assert_eq!(services[0].label(labels::KIND), Some("deployment"));
    let release = harness.store.latest_release(&web_key())?.ok_or("release")?;
    assert_eq!(
        (release.commit, release.phase),
        (first, ReleasePhase::Succeeded)
    );
    // No container: the tasks are Swarm's.
    assert!(harness.containers(&web_key()).await?.is_empty());

    // Scale 2 → 3: the two tasks stay.
    let before = running_tasks(&harness, "shop-web").await?;
    harness.push(&[("web.hcl", &web(3, "1", ""))])?;
    harness
        .status_where(&web_key(), |status| {
            status.phase == "Ready" && status.running_replicas == 3
        })
        .await?;
    let after = running_tasks(&harness, "shop-web").await?;
    assert!(
        before.iter().all(|id| after.contains(id)),
        "{before:?} → {after:?}"
    );
    assert_eq!(after.len(), 3);

    // A version whose health check fails: Swarm rolls it back, the release fails with
    // Swarm's reason, the agent rolls back to the last good release and pins it.
    let bad = harness.push(&[(
        "web.hcl",
        &web(
            3,
            "2",
            "  probes {\n    readiness {\n      exec { command = [\"false\"] }\n    }\n  }\n",
        ),
    )])?;
    let failed = crate::support::until(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the bad release failed",
        || {
            Ok(harness
                .store
                .releases(&web_key(), 10)?
                .into_iter()
                .find(|release| release.commit == bad && release.phase == ReleasePhase::Failed))
        },
    )
    .await?;
    assert!(
        failed.message.contains("Docker Swarm gave up on the update of service shop-web (rollback_completed: rollback completed); task slot 1 failed: task: non-zero exit (137): dockerexec: unhealthy container"),
        "{}",
        failed.message
    );
    let status = harness
        .status_where(&web_key(), |status| {
            status.phase == "Ready" && status.message.contains("automatic rollback")
        })
        .await?;
    // The release rolled back to runs as its snapshot says.
    assert_eq!(status.running_replicas, status.desired_replicas);
    assert!(harness.store.pins()?.iter().any(|pin| pin.key == web_key()));
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn what_swarm_cannot_run_is_refused_with_the_reason_and_nothing_is_sent() -> TestResult {
    let mut harness = swarm_harness()?;
    harness.start()?;
    let manifest = "deployment \"shop\" \"web\" {\n  image = \"busybox\"\n  init \"seed\" {\n    command = [\"true\"]\n  }\n}\ningress \"shop\" \"web\" {\n  host = \"shop.example\"\n  service = \"web\"\n  port = 8080\n}\n";
    harness.push(&[("web.hcl", manifest)])?;
    let status = harness
        .status_where(&web_key(), |status| status.phase == "Failed")
        .await?;
    assert_eq!(status.reason, Some(FailureReason::SwarmUnsupported));
    assert!(
        status
            .message
            .contains("cannot run under Docker Swarm: init containers"),
        "{}",
        status.message
    );
    let ingress = harness
        .status_where(&ResourceKey::new(Kind::Ingress, "shop", "web"), |status| {
            status.phase == "Failed"
        })
        .await?;
    assert!(
        ingress
            .message
            .contains("the ingress proxy is not run under Swarm yet"),
        "{}",
        ingress.message
    );
    assert!(harness.fake.list_services(&[]).await?.is_empty());
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn statefulset_pods_are_services_pinned_to_a_node_and_a_lost_node_leaves_its_pod_down()
-> TestResult {
    let mut harness = swarm_harness()?;
    let node = |id: &str, hostname: &str| Node {
        id: id.to_owned(),
        hostname: hostname.to_owned(),
        state: NodeState::Ready,
        availability: "active".to_owned(),
        manager: id == "fakenode1",
    };
    harness
        .fake
        .set_nodes(vec![node("fakenode1", "a"), node("fakenode2", "b")]);
    harness.start()?;
    let db = "statefulset \"data\" \"db\" {\n  image = \"busybox\"\n  command = [\"sleep\", \"3600\"]\n  replicas = 2\n  volume_claim \"data\" {\n    mount_path = \"/data\"\n  }\n}\n";
    harness.push(&[("db.hcl", db)])?;
    let key = ResourceKey::new(Kind::Statefulset, "data", "db");
    harness
        .status_where(&key, |status| {
            status.phase == "Ready" && status.running_replicas == 2
        })
        .await?;
    let mut services = harness
        .fake
        .list_services(&[(labels::SCOPE, "data")])
        .await?;
    services.sort_by(|a, b| a.name.cmp(&b.name));
    let placed: Vec<(String, Vec<String>)> = services
        .iter()
        .map(|service| (service.name.clone(), service.constraints.clone()))
        .collect();
    assert_eq!(
        placed,
        [
            (
                "data-db-0".to_owned(),
                vec!["node.id==fakenode1".to_owned()]
            ),
            (
                "data-db-1".to_owned(),
                vec!["node.id==fakenode2".to_owned()]
            ),
        ]
    );
    // Node b goes down: pod 1 is reported down, pinned there, never moved.
    harness.fake.lose_node("fakenode2");
    let status = harness
        .status_where(&key, |status| status.running_replicas == 1)
        .await?;
    let text = format!("{status:?}");
    assert!(
        text.contains("its node fakenode2 is down; the pod stays pinned there"),
        "{text}"
    );
    let services = harness
        .fake
        .list_services(&[(labels::SCOPE, "data")])
        .await?;
    assert!(
        services
            .iter()
            .any(|service| service.constraints == ["node.id==fakenode2"]),
        "not moved: {services:?}"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_job_run_is_a_replicated_job_service_recorded_as_a_run() -> TestResult {
    let mut harness = swarm_harness()?;
    harness.start()?;
    harness.push(&[(
        "job.hcl",
        "job \"ops\" \"migrate\" {\n  image = \"busybox\"\n  command = [\"sh\", \"-c\", \"echo migrated; exit 0\"]\n}\n",
    )])?;
    let key = ResourceKey::new(Kind::Job, "ops", "migrate");
    harness
        .status_where(&key, |status| status.phase == "Succeeded")
        .await?;
    let runs = harness.store.job_runs(&key)?;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].exit_code, Some(0));
    assert!(runs[0].logs_tail.contains("migrated"), "{:?}", runs[0]);
    let services = harness
        .fake
        .list_services(&[(labels::SCOPE, "ops")])
        .await?;
    assert_eq!(services.len(), 1);
    assert_eq!(services[0].replicas, None, "a replicated job");
    assert_eq!(services[0].name, format!("ops-migrate-{}", runs[0].run_id));
    harness.stop().await
}
