//! The Swarm handlers on the fake runtime (`ReconcileOptions::engine = Swarm`), under
//! paused time: the same reconciler as on containers, what its passes send Swarm, and
//! what a rollout and status make of Swarm's answers. The real engine is `swarm_docker.rs`.

use std::time::Duration;

use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::reconcile::Engine;
use voodu_agent::reconcile::router::IngressOptions;
use voodu_agent::runtime::{FakeRuntime, Node, NodeState, ServiceMode, Swarm, TaskState, labels};
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

/// `web` with release hooks; `command` runs `command`.
fn web_with_hooks(version: &str, command: &str) -> String {
    web(
        2,
        version,
        &format!(
            "  release {{\n    pre_command = [\"sh\", \"-c\", \"echo pre {version}\"]\n    command = {command}\n    post_command = [\"sh\", \"-c\", \"echo post {version}\"]\n  }}\n"
        ),
    )
}

/// The service verbs that create or update `shop-web…` services, in order.
fn service_writes(harness: &Harness) -> Vec<String> {
    harness
        .fake
        .calls()
        .into_iter()
        .filter(|call| {
            call.starts_with("create_service shop-web")
                || call.starts_with("update_service shop-web")
        })
        .collect()
}

/// Waits for the release of `commit` to reach `phase`.
async fn release_of(
    harness: &Harness,
    commit: &voodu_agent::model::CommitSha,
    phase: ReleasePhase,
) -> TestResult<voodu_agent::store::Release> {
    crate::support::until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        &format!("the release of {commit} {phase:?}"),
        || {
            Ok(harness
                .store
                .releases(&web_key(), 10)?
                .into_iter()
                .find(|release| release.commit == *commit && release.phase == phase))
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn release_hooks_run_as_replicated_job_services_around_the_update_and_a_failed_command_keeps_the_old_spec()
-> TestResult {
    let mut harness = swarm_harness()?;
    harness.start()?;
    let ok = r#"["sh", "-c", "echo migrated"]"#;

    // v1: pre and command before the service is created, post once it converged.
    let v1 = harness.push(&[("web.hcl", &web_with_hooks("1", ok))])?;
    let first = release_of(&harness, &v1, ReleasePhase::Succeeded).await?;
    let id = first.id;
    // post_command runs after the release converged; its outcome is recorded just after.
    crate::support::until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "post_command recorded",
        || {
            Ok(harness
                .store
                .release_hooks(id)?
                .get("post_command")
                .cloned())
        },
    )
    .await?;
    assert_eq!(
        service_writes(&harness),
        [
            format!("create_service shop-web-release-{id}-pre"),
            format!("create_service shop-web-release-{id}"),
            "create_service shop-web".to_owned(),
            format!("create_service shop-web-release-{id}-post"),
        ]
    );
    let hooks = harness.store.release_hooks(id)?;
    for (stage, output) in [
        ("pre_command", "pre 1"),
        ("command", "migrated"),
        ("post_command", "post 1"),
    ] {
        let outcome = hooks.get(stage).ok_or(stage)?;
        assert_eq!(outcome["exit_code"], 0, "{stage}: {outcome}");
        assert_eq!(outcome["timed_out"], false, "{stage}: {outcome}");
        assert!(
            outcome["logs"]
                .as_str()
                .is_some_and(|logs| logs.contains(output)),
            "{stage}: {outcome}"
        );
    }
    // The hook services are gone; the deployment's service is the only one, a replica
    // count of 2 (no hook task counted).
    let services = harness
        .fake
        .list_services(&[(labels::SCOPE, "shop")])
        .await?;
    let names: Vec<&str> = services
        .iter()
        .map(|service| service.name.as_str())
        .collect();
    assert_eq!(names, ["shop-web"]);
    let status = harness
        .status_where(&web_key(), |status| status.phase == "Ready")
        .await?;
    assert_eq!(status.running_replicas, 2);

    // v2: the same order around an update.
    let v2 = harness.push(&[("web.hcl", &web_with_hooks("2", ok))])?;
    let second = release_of(&harness, &v2, ReleasePhase::Succeeded).await?;
    let id2 = second.id;
    crate::support::until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "post_command of v2 recorded",
        || {
            Ok(harness
                .store
                .release_hooks(id2)?
                .get("post_command")
                .cloned())
        },
    )
    .await?;
    assert_eq!(
        service_writes(&harness)[4..],
        [
            format!("create_service shop-web-release-{id2}-pre"),
            format!("create_service shop-web-release-{id2}"),
            "update_service shop-web".to_owned(),
            format!("create_service shop-web-release-{id2}-post"),
        ]
    );
    let running_spec = |services: &[voodu_agent::runtime::Service]| {
        services
            .iter()
            .find(|service| service.name == "shop-web")
            .and_then(|service| service.task_labels.get(labels::MANIFEST_HASH).cloned())
    };
    let v2_spec = running_spec(&harness.fake.list_services(&[]).await?);
    assert_eq!(v2_spec.as_deref(), Some(second.spec_hash.as_str()));

    // v3: `command` exits 3: the release fails with reason hook, no update is sent, the
    // service keeps v2's spec, and post_command does not run.
    let v3 = harness.push(&[(
        "web.hcl",
        &web_with_hooks("3", r#"["sh", "-c", "echo boom; exit 3"]"#),
    )])?;
    let failed = release_of(&harness, &v3, ReleasePhase::Failed).await?;
    assert!(
        failed.message.contains(&format!(
            "release #{} failed in command: exit code 3",
            failed.id
        )),
        "{}",
        failed.message
    );
    let status = harness
        .status_where(&web_key(), |status| status.phase == "Failed")
        .await?;
    assert_eq!(status.reason, Some(FailureReason::Hook), "{status:?}");
    let hooks = harness.store.release_hooks(failed.id)?;
    assert_eq!(hooks["pre_command"]["exit_code"], 0);
    assert_eq!(hooks["command"]["exit_code"], 3);
    assert!(
        hooks["command"]["logs"]
            .as_str()
            .is_some_and(|logs| logs.contains("boom")),
        "{hooks:?}"
    );
    assert!(!hooks.contains_key("post_command"), "{hooks:?}");
    assert_eq!(
        service_writes(&harness)[8..],
        [
            format!("create_service shop-web-release-{}-pre", failed.id),
            format!("create_service shop-web-release-{}", failed.id),
        ]
    );
    assert_eq!(
        running_spec(&harness.fake.list_services(&[]).await?),
        v2_spec
    );

    // Back to v1 (a revert): that spec already rolled out with success, so no hook runs.
    let revert = harness.push(&[("web.hcl", &web_with_hooks("1", ok))])?;
    let reverted = release_of(&harness, &revert, ReleasePhase::Succeeded).await?;
    assert!(
        reverted.message.contains(&format!(
            "release hooks skipped: release #{id} already rolled out this spec"
        )),
        "{}",
        reverted.message
    );
    assert_eq!(service_writes(&harness)[10..], ["update_service shop-web"]);
    assert!(harness.store.release_hooks(reverted.id)?.is_empty());
    let services = harness
        .fake
        .list_services(&[(labels::SCOPE, "shop")])
        .await?;
    assert_eq!(services.len(), 1, "no hook service left: {services:?}");
    harness.stop().await
}

/// This agent's services of scope `shop`: (name, kind label, role label, id).
async fn shop_services(harness: &Harness) -> TestResult<Vec<(String, String, String, String)>> {
    let services = harness
        .fake
        .list_services(&[(labels::SCOPE, "shop")])
        .await?;
    Ok(services
        .into_iter()
        .map(|service| {
            (
                service.name.clone(),
                service.label(labels::KIND).unwrap_or_default().to_owned(),
                service.label(labels::ROLE).unwrap_or_default().to_owned(),
                service.id,
            )
        })
        .collect())
}

/// Waits for a hook service `name` other than `not_id`; returns its id.
async fn hook_service(harness: &Harness, name: &str, not_id: &str) -> TestResult<String> {
    for _ in 0..100 {
        if let Some((.., id)) = shop_services(harness)
            .await?
            .into_iter()
            .find(|(listed, _, role, id)| listed == name && role == "release" && id != not_id)
        {
            return Ok(id);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "no hook service {name}: {:?}",
        shop_services(harness).await?
    )
    .into())
}

#[tokio::test(start_paused = true)]
async fn a_hook_service_left_by_a_shutdown_is_watched_again_on_restart_and_never_taken_for_the_deployment_and_a_hook_that_times_out_fails_its_release()
-> TestResult {
    let mut harness = swarm_harness()?;
    harness.start()?;
    let hung = |version: &str| {
        web(
            1,
            version,
            "  release {\n    command = [\"sleep\", \"3600\"]\n    timeout = \"30s\"\n  }\n",
        )
    };
    let v1 = harness.push(&[("web.hcl", &hung("1"))])?;
    // The hook runs (its task does not end by itself): shutdown interrupts the wait and
    // leaves the service, owned by the deployment in role `release`.
    let leftover = hook_service(&harness, "shop-web-release-1", "").await?;
    harness.stop().await?;
    let services = shop_services(&harness).await?;
    assert_eq!(
        services,
        [(
            "shop-web-release-1".to_owned(),
            "deployment".to_owned(),
            "release".to_owned(),
            leftover.clone()
        )]
    );

    // Restarted: the pass's look at the deployment does not take the leftover for its
    // service (else it would update it); the hook still running is watched again, not
    // started a second time, and its end lets the rollout go on.
    let looked = harness.fake.calls().len();
    harness.start()?;
    let probe = format!("list_tasks {leftover}");
    crate::support::until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "the restarted agent's look at the hook",
        || {
            Ok(harness.fake.calls()[looked..]
                .contains(&probe)
                .then_some(()))
        },
    )
    .await?;
    let task = harness
        .fake
        .list_tasks(&leftover)
        .await?
        .into_iter()
        .next()
        .ok_or("the hook's task")?;
    harness.fake.finish_task(&task.id, 0);
    release_of(&harness, &v1, ReleasePhase::Succeeded).await?;
    assert!(
        harness
            .fake
            .calls()
            .contains(&format!("remove_service {leftover}")),
        "the hook's service goes once its outcome is recorded: {:?}",
        harness.fake.calls()
    );
    let writes = service_writes(&harness);
    assert_eq!(
        writes,
        [
            "create_service shop-web-release-1",
            "create_service shop-web"
        ]
    );
    let names: Vec<String> = shop_services(&harness)
        .await?
        .into_iter()
        .map(|(name, ..)| name)
        .collect();
    assert_eq!(names, ["shop-web"]);

    // v2's hook outlives its 30s timeout: its service is removed, the release fails with
    // reason hook, and the service keeps v1's spec.
    let v2 = harness.push(&[("web.hcl", &hung("2"))])?;
    let failed = release_of(&harness, &v2, ReleasePhase::Failed).await?;
    assert!(
        failed.message.contains(&format!(
            "release #{} failed in command: timed out after 30s",
            failed.id
        )),
        "{}",
        failed.message
    );
    let hooks = harness.store.release_hooks(failed.id)?;
    assert_eq!(hooks["command"]["timed_out"], true, "{hooks:?}");
    assert_eq!(hooks["command"]["timeout_seconds"], 30, "{hooks:?}");
    assert_eq!(
        service_writes(&harness)[2..],
        [format!("create_service shop-web-release-{}", failed.id)]
    );
    let names: Vec<String> = shop_services(&harness)
        .await?
        .into_iter()
        .map(|(name, ..)| name)
        .collect();
    assert_eq!(names, ["shop-web"]);
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
