//! `--runtime swarm` on a single-node swarm (issue 16, acceptance 2): the real binary,
//! a real repository, the shared engine made a swarm manager by `SwarmGuard`.
//!
//! State is read as an operator reads it: the agent's state.db (what `status --json` and
//! `releases` print) and the engine's services and tasks. Limits are liveness bounds.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::runtime::{DockerRuntime, Runtime, Task, TaskState, labels};
use voodu_agent::store::{ReleasePhase, Store};

use crate::e2e_docker::Agent;
use crate::support::swarm::{SwarmGuard, docker};
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

const LIMIT: Duration = Duration::from_secs(120);

fn deployment(scope: &str, replicas: u32, version: &str, extra: &str) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = {replicas}
  env      = {{ VERSION = "{version}" }}
{extra}}}
"#,
        image = test_image()
    )
}

/// A readiness probe that never passes: under Swarm, a health check that fails.
const NEVER_HEALTHY: &str = r#"  probes {
    readiness {
      exec { command = ["false"] }
      period = "1s"
      failure_threshold = 1
    }
  }
"#;

fn store(data: &Path) -> Option<Store> {
    Store::open_read_only(&data.join("state.db")).ok()
}

/// Waits until the resource's status is `phase` with `running` replicas and its latest
/// release is `release` (a phase) at `commit`.
fn wait_status(
    data: &Path,
    key: &ResourceKey,
    phase: &str,
    running: usize,
    commit: &str,
    log: &Path,
) -> TestResult {
    wait_until(
        LIMIT,
        &format!("{key} {phase} with {running} running at {commit}"),
        || {
            let store = store(data)?;
            let status = store.status(key).ok()??;
            let release = store.latest_release(key).ok()??;
            (status.phase == phase
                && status.running_replicas == running
                && release.commit.as_str() == commit
                && release.phase == ReleasePhase::Succeeded)
                .then_some(())
        },
    )
    .map_err(|error| {
        let status = store(data).and_then(|store| store.status(key).ok().flatten());
        format!(
            "{error}; status {status:?}\nagent log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
        .into()
    })
}

/// The service's tasks Swarm wants running and that run (a task being stopped is not
/// counted, though it may still serve).
fn running(tasks: &[Task]) -> Vec<&Task> {
    tasks
        .iter()
        .filter(|task| task.state == TaskState::Running && task.desired == TaskState::Running)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine (a single-node swarm is made on it): scripts/test runs it (cargo test -- --include-ignored)"]
async fn a_deployment_rolls_start_first_scales_without_churn_and_a_swarm_rollback_fails_its_release()
-> TestResult {
    let scope = unique("sw");
    let _containers = DockerGuard::new(&scope);
    let _swarm = SwarmGuard::new(&scope)?;
    let runtime = DockerRuntime::connect().await?;
    let repo = TempRepo::new()?;
    repo.write("app.hcl", &deployment(&scope, 3, "1", ""))?;
    let first = repo.commit("three replicas")?;
    let dir = tempfile::tempdir()?;
    let (data, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let _agent = Agent::start(
        &repo,
        &data,
        &log,
        &[
            "--runtime",
            "swarm",
            "--ready-settle",
            "2s",
            "--rollout-deadline",
            "3m",
        ],
    )?;
    let key = ResourceKey::new(Kind::Deployment, &scope, "web");
    wait_status(&data, &key, "Ready", 3, &first, &log)?;
    let service = format!("{scope}-web");
    assert_eq!(
        docker(&[
            "service",
            "inspect",
            &service,
            "--format",
            "{{.Spec.UpdateConfig.Order}} {{.Spec.UpdateConfig.FailureAction}} {{.Spec.UpdateConfig.Parallelism}} {{.Spec.UpdateConfig.Monitor}}"
        ])?,
        "start-first rollback 1 2s"
    );
    let service_id = docker(&["service", "inspect", &service, "--format", "{{.ID}}"])?;

    // 1. A new version rolls start-first: running tasks never below 3 while it does.
    let sampling = Arc::new(AtomicBool::new(true));
    let minimum = Arc::new(AtomicUsize::new(usize::MAX));
    let sampler = {
        let (sampling, minimum, id) = (sampling.clone(), minimum.clone(), service_id.clone());
        let runtime = runtime.clone();
        tokio::spawn(async move {
            let mut samples = 0;
            while sampling.load(Ordering::Relaxed) {
                if let Ok(tasks) = runtime.list_tasks(&id).await {
                    minimum.fetch_min(running(&tasks).len(), Ordering::Relaxed);
                    samples += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            samples
        })
    };
    repo.write("app.hcl", &deployment(&scope, 3, "2", ""))?;
    let second = repo.commit("version 2")?;
    wait_status(&data, &key, "Ready", 3, &second, &log)?;
    sampling.store(false, Ordering::Relaxed);
    let samples = sampler.await?;
    assert!(samples > 10, "only {samples} samples of the roll");
    println!(
        "roll of 3 replicas: {samples} samples of the service's tasks, running (and wanted) never below {}",
        minimum.load(Ordering::Relaxed)
    );
    assert!(
        minimum.load(Ordering::Relaxed) >= 3,
        "running tasks fell to {} during the roll",
        minimum.load(Ordering::Relaxed)
    );
    let tasks = runtime.list_tasks(&service_id).await?;
    let hashes: BTreeSet<String> = running(&tasks)
        .iter()
        .filter_map(|task| task.labels.get(labels::MANIFEST_HASH).cloned())
        .collect();
    assert_eq!(
        hashes.len(),
        1,
        "one version runs: {hashes:?}\n{tasks:#?}\n{}",
        docker(&[
            "service",
            "inspect",
            &service,
            "--format",
            "{{json .UpdateStatus}}"
        ])?
    );
    let good = hashes;

    // 2. Scale to 5: the 3 tasks stay, 2 are added.
    let before: BTreeSet<String> = running(&tasks).iter().map(|task| task.id.clone()).collect();
    repo.write("app.hcl", &deployment(&scope, 5, "2", ""))?;
    let third = repo.commit("five replicas")?;
    wait_until(LIMIT, "5 running tasks", || {
        let store = store(&data)?;
        let status = store.status(&key).ok()??;
        (status.phase == "Ready" && status.running_replicas == 5).then_some(())
    })
    .map_err(|error| {
        let status = store(&data).and_then(|store| store.status(&key).ok().flatten());
        format!(
            "{error}; status {status:?}\nagent log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    })?;
    let tasks = runtime.list_tasks(&service_id).await?;
    let after: BTreeSet<String> = running(&tasks).iter().map(|task| task.id.clone()).collect();
    assert!(
        before.is_subset(&after),
        "scaling replaced tasks: {before:?} → {after:?}"
    );
    assert_eq!(after.len(), 5);
    let latest = store(&data).and_then(|store| store.latest_release(&key).ok().flatten());
    assert_eq!(
        latest.map(|release| release.commit.to_string()),
        Some(second.clone()),
        "a replica count is not a new release: the release of {second} stays current (commit {third} changed only replicas)"
    );

    // 3. A version that never becomes healthy: Swarm rolls its update back, the release
    // fails with the reason, and the agent's own rollback pins the last good release.
    repo.write("app.hcl", &deployment(&scope, 5, "3", NEVER_HEALTHY))?;
    let bad = repo.commit("version 3, never healthy")?;
    let failed =
        wait_until(Duration::from_secs(180), "the bad release failed", || {
            let store = store(&data)?;
            store.releases(&key, 10).ok()?.into_iter().find(|release| {
                release.commit.as_str() == bad && release.phase == ReleasePhase::Failed
            })
        })
        .map_err(|error| {
            format!(
                "{error}\nagent log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })?;
    assert!(
        failed
            .message
            .contains("Docker Swarm gave up on the update")
            && failed.message.contains("rollback"),
        "{}",
        failed.message
    );
    assert!(failed.message.contains("unhealthy"), "{}", failed.message);
    wait_until(LIMIT, "the rollback running and pinned", || {
        let store = store(&data)?;
        let status = store.status(&key).ok()??;
        let pinned = store.pins().ok()?.iter().any(|pin| pin.key == key);
        (status.phase == "Ready" && status.running_replicas == 5 && pinned).then_some(status)
    })
    .map(|status| {
        assert!(
            status.message.contains("automatic rollback to release"),
            "{}",
            status.message
        );
        assert!(
            status.message.contains("Docker Swarm gave up"),
            "{}",
            status.message
        );
    })?;
    // Version 2 runs, as before the bad commit.
    let tasks = runtime.list_tasks(&service_id).await?;
    let hashes: BTreeSet<String> = running(&tasks)
        .iter()
        .filter_map(|task| task.labels.get(labels::MANIFEST_HASH).cloned())
        .collect();
    assert_eq!(hashes, good);
    Ok(())
}
