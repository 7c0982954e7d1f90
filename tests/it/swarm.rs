//! The Swarm handlers on the fake runtime (`ReconcileOptions::engine = Swarm`), under
//! paused time: the same reconciler as on containers, what its passes send Swarm, and
//! what a rollout and status make of Swarm's answers. The real engine is `swarm_docker.rs`.

use std::time::Duration;

use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::reconcile::Engine;
use voodu_agent::reconcile::router::IngressOptions;
use voodu_agent::runtime::{FakeRuntime, Node, NodeState, Runtime, ServiceMode, TaskState, labels};
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
    let manifest = "deployment \"shop\" \"web\" {\n  image = \"busybox\"\n  init \"seed\" {\n    command = [\"true\"]\n  }\n}\n";
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

/// Waits (in the test's paused time) until `check` holds on the fake engine.
async fn until_fake<F, Fut>(what: &str, check: F) -> TestResult
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = TestResult<bool>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await? {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The Caddy config the proxy service `name` runs.
fn proxy_config(harness: &Harness, name: &str) -> TestResult<serde_json::Value> {
    let spec = harness.fake.service_spec(name).ok_or("no proxy service")?;
    let config = spec.configs.first().ok_or("the proxy mounts no config")?;
    let data = harness
        .fake
        .config_data(&config.config_name)
        .ok_or("its config is gone")?;
    Ok(serde_json::from_slice(&data)?)
}

#[tokio::test(start_paused = true)]
async fn an_ingress_is_served_by_a_global_caddy_service_whose_config_rolls_with_the_routes()
-> TestResult {
    let mut harness =
        Harness::with_fake(FakeRuntime::with_images(&["busybox", "voodu-caddy:latest"]))?;
    harness.options.engine = Engine::Swarm;
    harness.options.ready_settle = Duration::ZERO;
    let state = tempfile::tempdir()?;
    harness.options.ingress = Some(IngressOptions {
        image: "voodu-caddy:latest".to_owned(),
        ..IngressOptions::new(state.path().join("ingress"))
    });
    harness.start()?;
    let ingress = |host: &str| {
        format!("ingress \"shop\" \"web\" {{\n  host = \"{host}\"\n  port = 8080\n}}\n")
    };
    harness.push(&[
        ("web.hcl", &web(2, "1", "")),
        ("ingress.hcl", &ingress("shop.example")),
    ])?;
    let key = ResourceKey::new(Kind::Ingress, "shop", "web");
    let status = harness
        .status_where(&key, |status| status.phase == "Ready")
        .await?;
    assert_eq!(
        status.message,
        "http://shop.example → the running tasks of deployment shop/web (tasks.shop-web:8080, resolved by the proxy)"
    );
    let name = format!("voodu-caddy-{}", harness.store.agent_id()?);
    let spec = harness.fake.service_spec(&name).ok_or("no proxy service")?;
    assert_eq!(spec.mode, ServiceMode::Global);
    assert_eq!(spec.task.networks, ["voodu0-swarm"]);
    let published: Vec<(u16, u16)> = spec
        .published
        .iter()
        .map(|port| (port.published, port.target))
        .collect();
    assert_eq!(published, [(80, 80), (443, 443)]);
    let config = proxy_config(&harness, &name)?;
    let routes = config["apps"]["http"]["servers"]
        .as_object()
        .ok_or("no servers")?
        .values()
        .flat_map(|server| server["routes"].as_array().cloned().unwrap_or_default())
        .collect::<Vec<_>>();
    let text = serde_json::to_string(&routes)?;
    assert!(
        text.contains(
            r#""dynamic_upstreams":{"name":"tasks.shop-web","port":"8080","refresh":"2s","source":"a"}"#
        ) && text.contains("shop.example"),
        "{text}"
    );
    assert_eq!(config["admin"], serde_json::json!({"disabled": true}));
    let owned = [(labels::ROLE, "ingress")];

    // A new host: a new config, the service rolled to it. The config before stays while
    // Swarm's previous spec (its rollback) uses it; the one before that goes.
    let mut configs = vec![spec.configs[0].config_name.clone()];
    for host in ["shop2.example", "shop3.example"] {
        harness.push(&[
            ("web.hcl", &web(2, "1", "")),
            ("ingress.hcl", &ingress(host)),
        ])?;
        harness
            .status_where(&key, |status| {
                status.phase == "Ready" && status.message.starts_with(&format!("http://{host} "))
            })
            .await?;
        let spec = harness.fake.service_spec(&name).ok_or("no proxy service")?;
        assert!(!configs.contains(&spec.configs[0].config_name));
        configs.push(spec.configs[0].config_name.clone());
    }
    let kept: Vec<String> = configs[1..].to_vec();
    until_fake(
        "only the current and the previous proxy config kept",
        || async {
            let mut listed: Vec<String> = harness
                .fake
                .list_configs(&owned)
                .await?
                .into_iter()
                .map(|config| config.name)
                .collect();
            listed.sort();
            let mut kept = kept.clone();
            kept.sort();
            Ok(listed == kept)
        },
    )
    .await?;

    // No ingress left: the service and its configs go.
    harness.push(&[("web.hcl", &web(2, "1", ""))])?;
    until_fake("the proxy service and its configs removed", || async {
        let services = harness.fake.list_services(&owned).await?;
        let configs = harness.fake.list_configs(&owned).await?;
        Ok(services.is_empty() && configs.is_empty())
    })
    .await?;
    harness.stop().await
}
