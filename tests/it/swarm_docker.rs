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
use voodu_agent::runtime::{DockerRuntime, Swarm, Task, TaskState, labels};
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

fn statefulset(scope: &str, version: &str) -> String {
    format!(
        r#"statefulset "{scope}" "db" {{
  image    = "{image}"
  command  = ["sh", "-c", "test -f /data/marker || echo first-$VERSION-$VOODU_REPLICA_ORDINAL > /data/marker; exec sleep 3600"]
  replicas = 2
  env      = {{ VERSION = "{version}" }}
  volume_claim "data" {{
    mount_path = "/data"
  }}
}}
"#,
        image = test_image()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine (a single-node swarm is made on it): scripts/test runs it (cargo test -- --include-ignored)"]
async fn a_statefulset_keeps_its_per_ordinal_volumes_across_a_roll() -> TestResult {
    let scope = unique("sw");
    let _containers = DockerGuard::new(&scope);
    let _swarm = SwarmGuard::new(&scope)?;
    let runtime = DockerRuntime::connect().await?;
    let repo = TempRepo::new()?;
    repo.write("db.hcl", &statefulset(&scope, "1"))?;
    let first = repo.commit("two pods")?;
    let dir = tempfile::tempdir()?;
    let (data, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let _agent = Agent::start(
        &repo,
        &data,
        &log,
        &["--runtime", "swarm", "--ready-settle", "1s"],
    )?;
    let key = ResourceKey::new(Kind::Statefulset, &scope, "db");
    wait_status(&data, &key, "Ready", 2, &first, &log)?;
    // One service per ordinal, pinned to this node, with its own volume.
    for ordinal in 0..2 {
        let service = format!("{scope}-db-{ordinal}");
        let placement = docker(&[
            "service",
            "inspect",
            &service,
            "--format",
            "{{json .Spec.TaskTemplate.Placement.Constraints}} {{.Spec.UpdateConfig.Order}}",
        ])?;
        assert!(
            placement.starts_with("[\"node.id==") && placement.ends_with("stop-first"),
            "{placement}"
        );
    }
    let volumes = docker(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("label=voodu.scope={scope}"),
    ])?;
    let mut volumes: Vec<&str> = volumes.lines().collect();
    volumes.sort();
    assert_eq!(
        volumes,
        [
            format!("voodu-{scope}-db-data-0"),
            format!("voodu-{scope}-db-data-1")
        ]
    );
    let markers = |runtime: &DockerRuntime| {
        let runtime = runtime.clone();
        let scope = scope.clone();
        async move {
            let mut markers = Vec::new();
            for ordinal in 0..2 {
                let service = format!("{scope}-db-{ordinal}");
                let id = docker(&["service", "inspect", &service, "--format", "{{.ID}}"])?;
                let tasks = runtime.list_tasks(&id).await?;
                let task = running(&tasks)
                    .into_iter()
                    .next()
                    .ok_or("no running task")?
                    .clone();
                let marker = docker(&["exec", &task.container_id, "cat", "/data/marker"])?;
                markers.push((
                    marker,
                    task.since,
                    task.labels.get(labels::MANIFEST_HASH).cloned(),
                ));
            }
            TestResult::Ok(markers)
        }
    };
    let before = markers(&runtime).await?;
    assert_eq!(
        before
            .iter()
            .map(|(marker, _, _)| marker.as_str())
            .collect::<Vec<_>>(),
        ["first-1-0", "first-1-1"]
    );
    // A roll: each pod gets its new task on its node, with its volume as it was.
    repo.write("db.hcl", &statefulset(&scope, "2"))?;
    let second = repo.commit("version 2")?;
    wait_status(&data, &key, "Ready", 2, &second, &log)?;
    let after = markers(&runtime).await?;
    assert_eq!(
        after
            .iter()
            .map(|(marker, _, _)| marker.as_str())
            .collect::<Vec<_>>(),
        ["first-1-0", "first-1-1"],
        "the volumes outlived the roll"
    );
    assert!(
        after.iter().all(|(_, _, hash)| hash != &before[0].2),
        "every pod runs the new spec"
    );
    // Top-down: ordinal 1's new task started no later than ordinal 0's.
    assert!(after[1].1 <= after[0].1, "{after:?}");
    Ok(())
}

fn with_asset(scope: &str, motd: &str) -> String {
    format!(
        r#"asset "{scope}" "cfg" {{
  motd = "{motd}"
}}
deployment "{scope}" "api" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = 2
  volumes  = ["${{asset.{scope}.cfg.motd}}:/etc/motd:ro"]
}}
job "{scope}" "migrate" {{
  image   = "{image}"
  command = ["sh", "-c", "echo migrated {motd}; exit 0"]
}}
"#,
        image = test_image()
    )
}

/// `docker exec` `cat /etc/motd` in each running task of `service`.
async fn motds(runtime: &DockerRuntime, service: &str) -> TestResult<Vec<String>> {
    let id = docker(&["service", "inspect", service, "--format", "{{.ID}}"])?;
    let tasks = runtime.list_tasks(&id).await?;
    running(&tasks)
        .iter()
        .map(|task| docker(&["exec", &task.container_id, "cat", "/etc/motd"]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine (a single-node swarm is made on it): scripts/test runs it (cargo test -- --include-ignored)"]
async fn a_job_runs_to_completion_and_an_asset_change_rotates_its_config_and_rolls_its_consumers()
-> TestResult {
    let scope = unique("sw");
    let _containers = DockerGuard::new(&scope);
    let _swarm = SwarmGuard::new(&scope)?;
    let runtime = DockerRuntime::connect().await?;
    let repo = TempRepo::new()?;
    repo.write("app.hcl", &with_asset(&scope, "one"))?;
    let first = repo.commit("an asset, its consumer and a job")?;
    let dir = tempfile::tempdir()?;
    let (data, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let _agent = Agent::start(
        &repo,
        &data,
        &log,
        &["--runtime", "swarm", "--ready-settle", "1s"],
    )?;
    let api = ResourceKey::new(Kind::Deployment, &scope, "api");
    let job = ResourceKey::new(Kind::Job, &scope, "migrate");
    wait_status(&data, &api, "Ready", 2, &first, &log)?;

    // The job ran to completion as a replicated-job service, its output recorded.
    let run = wait_until(LIMIT, "the job's run succeeded", || {
        let store = store(&data)?;
        let status = store.status(&job).ok()??;
        (status.phase == "Succeeded").then_some(())?;
        store.job_runs(&job).ok()?.into_iter().next()
    })
    .map_err(|error| {
        format!(
            "{error}\nagent log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    })?;
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    assert!(
        run.logs_tail.contains("migrated") && run.logs_tail.contains("one"),
        "{run:?}"
    );
    let modes = docker(&[
        "service",
        "ls",
        "--filter",
        &format!("label=voodu.scope={scope}"),
        "--filter",
        "label=voodu.kind=job",
        "--format",
        "{{.Mode}}",
    ])?;
    assert_eq!(modes, "replicated job");

    // The asset is a config named after its digest, mounted in every task.
    let configs = |scope: &str| -> TestResult<Vec<String>> {
        let listed = docker(&[
            "config",
            "ls",
            "--filter",
            &format!("label=voodu.scope={scope}"),
            "--format",
            "{{.Name}}",
        ])?;
        Ok(listed.lines().map(ToOwned::to_owned).collect())
    };
    let before = configs(&scope)?;
    assert_eq!(before.len(), 1, "{before:?}");
    assert!(
        before[0].starts_with(&format!("{scope}-cfg-motd-")),
        "{before:?}"
    );
    assert_eq!(
        motds(&runtime, &format!("{scope}-api")).await?,
        ["one", "one"]
    );

    // A change of the asset: a new config, the consumer rolled onto it, the old one gone.
    repo.write("app.hcl", &with_asset(&scope, "two"))?;
    let second = repo.commit("a new motd")?;
    wait_status(&data, &api, "Ready", 2, &second, &log)?;
    assert_eq!(
        motds(&runtime, &format!("{scope}-api")).await?,
        ["two", "two"]
    );
    let after = wait_until(LIMIT, "the old config removed", || {
        let after = configs(&scope).ok()?;
        (after.len() == 1 && after != before).then_some(after)
    })?;
    assert!(
        after[0].starts_with(&format!("{scope}-cfg-motd-")),
        "{after:?}"
    );
    // The job's spec changed: it ran again.
    let rerun = wait_until(LIMIT, "the job ran again", || {
        let runs = store(&data)?.job_runs(&job).ok()?;
        (runs.len() == 2 && runs[0].exit_code == Some(0)).then(|| runs[0].clone())
    })?;
    assert!(rerun.logs_tail.contains("two"), "{rerun:?}");
    Ok(())
}

/// `web` with release hooks that echo (with the service's `VERSION`); `command` as given.
fn with_hooks(scope: &str, version: &str, command: &str) -> String {
    deployment(
        scope,
        2,
        version,
        &format!(
            r#"  release {{
    pre_command  = ["sh", "-c", "echo pre $VERSION"]
    command      = {command}
    post_command = ["sh", "-c", "echo post $VERSION"]
    timeout      = "60s"
  }}
"#
        ),
    )
}

/// The names of the scope's services.
fn service_names(scope: &str) -> TestResult<Vec<String>> {
    let names = docker(&[
        "service",
        "ls",
        "--filter",
        &format!("label=voodu.scope={scope}"),
        "--format",
        "{{.Name}}",
    ])?;
    let mut names: Vec<String> = names.lines().map(ToOwned::to_owned).collect();
    names.sort();
    Ok(names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine (a single-node swarm is made on it): scripts/test runs it (cargo test -- --include-ignored)"]
async fn release_hooks_run_as_replicated_job_services_and_a_failed_command_keeps_the_previous_spec()
-> TestResult {
    let scope = unique("sw");
    let _containers = DockerGuard::new(&scope);
    let _swarm = SwarmGuard::new(&scope)?;
    let runtime = DockerRuntime::connect().await?;
    let repo = TempRepo::new()?;
    repo.write(
        "app.hcl",
        &with_hooks(&scope, "1", r#"["sh", "-c", "echo command $VERSION"]"#),
    )?;
    let first = repo.commit("web with release hooks")?;
    let dir = tempfile::tempdir()?;
    let (data, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let _agent = Agent::start(
        &repo,
        &data,
        &log,
        &["--runtime", "swarm", "--ready-settle", "1s"],
    )?;
    let key = ResourceKey::new(Kind::Deployment, &scope, "web");
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // 1. The hooks ran (pre, command before the service, post after it converged), each
    //    recorded with exit code 0 and its output; no hook service is left.
    wait_status(&data, &key, "Ready", 2, &first, &log)?;
    let release = store(&data)
        .and_then(|store| store.latest_release(&key).ok().flatten())
        .ok_or("the first release")?;
    let hooks = wait_until(LIMIT, "post_command recorded", || {
        let hooks = store(&data)?.release_hooks(release.id).ok()?;
        hooks.contains_key("post_command").then_some(hooks)
    })
    .map_err(|error| format!("{error}\nagent log:\n{}", agent_log()))?;
    println!(
        "hooks of release #{}: {}",
        release.id,
        serde_json::Value::Object(hooks.clone())
    );
    for (stage, output) in [
        ("pre_command", "pre 1"),
        ("command", "command 1"),
        ("post_command", "post 1"),
    ] {
        let outcome = &hooks[stage];
        assert_eq!(outcome["exit_code"], 0, "{stage}: {outcome}");
        assert_eq!(outcome["timed_out"], false, "{stage}: {outcome}");
        assert_eq!(outcome["timeout_seconds"], 60, "{stage}: {outcome}");
        assert!(
            outcome["logs"]
                .as_str()
                .is_some_and(|logs| logs.contains(output)),
            "{stage}: {outcome}"
        );
    }
    let at = |stage: &str| hooks[stage]["at"].as_i64().unwrap_or(i64::MAX);
    assert!(
        at("pre_command") <= at("command") && at("command") <= at("post_command"),
        "{hooks:?}"
    );
    let service = format!("{scope}-web");
    assert_eq!(service_names(&scope)?, [service.as_str()]);
    let agent_id = store(&data).ok_or("the store")?.agent_id()?;
    let hook_services = || {
        docker(&[
            "service",
            "ls",
            "-q",
            "--filter",
            &format!("label=voodu.agent={agent_id}"),
            "--filter",
            "label=voodu.role=release",
        ])
    };
    assert_eq!(hook_services()?, "");
    let service_id = docker(&["service", "inspect", &service, "--format", "{{.ID}}"])?;
    let good: BTreeSet<String> = running(&runtime.list_tasks(&service_id).await?)
        .iter()
        .filter_map(|task| task.labels.get(labels::MANIFEST_HASH).cloned())
        .collect();
    assert_eq!(good, BTreeSet::from([release.spec_hash.to_string()]));

    // 2. `command` exits 3: the release fails (reason hook) before the service is updated;
    //    the service still runs the previous spec; no hook service is left.
    repo.write(
        "app.hcl",
        &with_hooks(&scope, "2", r#"["sh", "-c", "echo failing; exit 3"]"#),
    )?;
    let bad = repo.commit("command exits 3")?;
    let failed = wait_until(LIMIT, "the release of the failing command failed", || {
        store(&data)?
            .releases(&key, 10)
            .ok()?
            .into_iter()
            .find(|release| release.commit.as_str() == bad && release.phase == ReleasePhase::Failed)
    })
    .map_err(|error| format!("{error}\nagent log:\n{}", agent_log()))?;
    println!("failed release: {}", failed.message);
    assert!(
        failed.message.contains("failed in command: exit code 3"),
        "{}",
        failed.message
    );
    // The release ends before the pass writes the resource's status: wait for it (it said
    // `Progressing … running its command hook` for a moment in a loaded CI run).
    let status = wait_until(LIMIT, "the status of the failed hook", || {
        store(&data)?
            .status(&key)
            .ok()
            .flatten()
            .filter(|status| status.reason.is_some())
    })?;
    assert_eq!(
        status.reason,
        Some(voodu_agent::store::FailureReason::Hook),
        "{status:?}"
    );
    let hooks = store(&data).ok_or("the store")?.release_hooks(failed.id)?;
    assert_eq!(hooks["pre_command"]["exit_code"], 0, "{hooks:?}");
    assert_eq!(hooks["command"]["exit_code"], 3, "{hooks:?}");
    assert!(
        hooks["command"]["logs"]
            .as_str()
            .is_some_and(|logs| logs.contains("failing")),
        "{hooks:?}"
    );
    assert!(!hooks.contains_key("post_command"), "{hooks:?}");
    assert_eq!(service_names(&scope)?, [service.as_str()]);
    assert_eq!(hook_services()?, "");
    let tasks = runtime.list_tasks(&service_id).await?;
    let now: BTreeSet<String> = running(&tasks)
        .iter()
        .filter_map(|task| task.labels.get(labels::MANIFEST_HASH).cloned())
        .collect();
    assert_eq!(now, good, "{tasks:#?}");
    assert_eq!(running(&tasks).len(), 2);
    assert_eq!(
        docker(&[
            "service",
            "inspect",
            &service,
            "--format",
            "{{range .Spec.TaskTemplate.ContainerSpec.Env}}{{println .}}{{end}}"
        ])?
        .lines()
        .find(|line| line.starts_with("VERSION=")),
        Some("VERSION=1")
    );
    Ok(())
}

/// Removes the agent's ingress proxy service, its configs and data volume when dropped
/// (they carry the agent's label, not the test's scope). Declared after the `SwarmGuard`,
/// so it runs before the swarm is left.
struct ProxyServiceGuard(String);

impl Drop for ProxyServiceGuard {
    fn drop(&mut self) {
        let agent = &self.0;
        let name = format!("voodu-caddy-{agent}");
        let _ = docker(&["service", "rm", &name]);
        let filter = format!("label=voodu.agent={agent}");
        let configs = docker(&["config", "ls", "-q", "--filter", &filter]).unwrap_or_default();
        for id in configs.split_whitespace() {
            let _ = docker(&["config", "rm", id]);
        }
        // The volume is in use until the task's container is gone.
        for _ in 0..20 {
            if docker(&["volume", "rm", "-f", &format!("{name}-data")]).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// A port free on every address now, below the kernel's ephemeral range (32768 and up): a
/// port the kernel handed out (`bind(0)`) could be handed out again to another test's
/// connection before Swarm publishes it, and a host-mode task whose port is taken stays
/// pending without failing.
fn free_port() -> TestResult<u16> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    for attempt in 0..1000u32 {
        let offset = (seed.wrapping_add(attempt.wrapping_mul(7919)) % 12_000) as u16;
        let port = 20_000 + offset;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port in 20000..32000".into())
}

/// `GET /` for `host` through the proxy's published port: status and body, or the error.
async fn get_through(port: u16, host: &str) -> String {
    let tls = match voodu_agent::model::tls::client_config() {
        Ok(tls) => tls,
        Err(error) => return format!("client: {error}"),
    };
    let client = match reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .resolve(host, std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
    {
        Ok(client) => client,
        Err(error) => return format!("client: {error}"),
    };
    match client.get(format!("http://{host}:{port}/")).send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            format!("{status} {}", body.trim())
        }
        Err(error) => format!("error: {error}"),
    }
}

/// The ingress proxy services' tasks, for a failure's message.
fn proxy_tasks() -> String {
    let services = docker(&[
        "service",
        "ls",
        "-q",
        "--filter",
        "label=voodu.role=ingress",
    ])
    .unwrap_or_default();
    services
        .split_whitespace()
        .map(|id| {
            docker(&[
                "service",
                "ps",
                "--no-trunc",
                "--format",
                "{{.Name}} {{.CurrentState}} {{.Error}}",
                id,
            ])
            .unwrap_or_else(|error| error.to_string())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until `GET /` for `host` answers `expected` (`status body`).
async fn until_served(port: u16, host: &str, expected: &str, log: &Path) -> TestResult {
    let deadline = std::time::Instant::now() + LIMIT;
    let mut last = String::new();
    while std::time::Instant::now() < deadline {
        last = get_through(port, host).await;
        if last == expected {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text
        .lines()
        .filter(|line| !line.contains("sync requested") && !line.contains("repo unchanged"))
        .collect();
    Err(format!(
        "{host} never answered {expected:?}; last {last:?}\nagent log (without polls):\n{}\nproxy tasks:\n{}",
        tail[tail.len().saturating_sub(40)..].join("\n"),
        proxy_tasks()
    )
    .into())
}

fn web_behind_ingress(scope: &str, version: &str, host: &str) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sh", "-c", "mkdir -p /www && echo {version} > /www/index.html && exec httpd -f -p 8080 -h /www"]
  replicas = 2
}}
ingress "{scope}" "web" {{
  host = "{host}"
  port = 8080
}}
"#,
        image = test_image()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine (a single-node swarm is made on it): scripts/test runs it (cargo test -- --include-ignored)"]
async fn an_ingress_is_served_by_a_caddy_service_that_follows_the_routes() -> TestResult {
    let scope = unique("swi");
    let _containers = DockerGuard::new(&scope);
    let _swarm = SwarmGuard::new(&scope)?;
    let host = format!("web.{scope}.test");
    let repo = TempRepo::new()?;
    repo.write("app.hcl", &web_behind_ingress(&scope, "v1", &host))?;
    let first = repo.commit("web behind an ingress")?;
    let dir = tempfile::tempdir()?;
    let (data, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let (http, https) = (free_port()?, free_port()?);
    let caddy =
        std::env::var("VOODU_CADDY_IMAGE").unwrap_or_else(|_| "voodu-caddy:latest".to_owned());
    let _agent = Agent::start(
        &repo,
        &data,
        &log,
        &[
            "--runtime",
            "swarm",
            "--ready-settle",
            "1s",
            "--ingress-image",
            &caddy,
            "--ingress-http",
            &format!("0.0.0.0:{http}"),
            "--ingress-https",
            &format!("0.0.0.0:{https}"),
        ],
    )?;
    let web = ResourceKey::new(Kind::Deployment, &scope, "web");
    wait_status(&data, &web, "Ready", 2, &first, &log)?;
    let agent = wait_until(LIMIT, "the agent's id", || {
        store(&data).and_then(|store| store.agent_id_read_only().ok())
    })?;
    let _proxy = ProxyServiceGuard(agent.clone());
    let ingress = ResourceKey::new(Kind::Ingress, &scope, "web");
    wait_status(&data, &ingress, "Ready", 1, &first, &log)?;
    let proxy = format!("voodu-caddy-{agent}");
    assert_eq!(
        docker(&[
            "service",
            "inspect",
            &proxy,
            "--format",
            "{{if .Spec.Mode.Global}}global{{end}} {{range .Spec.EndpointSpec.Ports}}{{.PublishMode}}:{{.PublishedPort}}->{{.TargetPort}} {{end}}{{.Spec.UpdateConfig.Order}} {{.Spec.UpdateConfig.FailureAction}}"
        ])?,
        format!("global host:{http}->80 host:{https}->443 stop-first rollback")
    );
    // 1. The routes reach the deployment's tasks through its service's virtual IP.
    until_served(http, &host, "200 v1", &log).await?;

    // 2. A new version of the deployment: served without a new proxy config.
    let configs_before = docker(&[
        "config",
        "ls",
        "--filter",
        &format!("label=voodu.agent={agent}"),
        "--format",
        "{{.Name}}",
    ])?;
    repo.write("app.hcl", &web_behind_ingress(&scope, "v2", &host))?;
    let second = repo.commit("v2")?;
    wait_status(&data, &web, "Ready", 2, &second, &log)?;
    until_served(http, &host, "200 v2", &log).await?;
    assert_eq!(
        docker(&[
            "config",
            "ls",
            "--filter",
            &format!("label=voodu.agent={agent}"),
            "--format",
            "{{.Name}}"
        ])?,
        configs_before,
        "a new version of a deployment changes no route"
    );

    // 3. A new host: a new config rolled out to the proxy; the old host is not routed.
    let moved = format!("www.{scope}.test");
    repo.write("app.hcl", &web_behind_ingress(&scope, "v2", &moved))?;
    let third = repo.commit("a new host")?;
    wait_status(&data, &ingress, "Ready", 1, &third, &log)?;
    until_served(http, &moved, "200 v2", &log).await?;
    let old = get_through(http, &host).await;
    assert!(
        old.starts_with("404 voodu: no ingress routes this host"),
        "the old host is not served: {old}"
    );

    // 4. The ingress leaves the repo: the proxy service goes.
    repo.write(
        "app.hcl",
        web_behind_ingress(&scope, "v2", &moved)
            .split("ingress \"")
            .next()
            .ok_or("no deployment")?,
    )?;
    repo.commit("no ingress")?;
    wait_until(LIMIT, "the proxy service removed", || {
        let listed = docker(&["service", "ls", "--filter", &format!("name={proxy}"), "-q"]).ok()?;
        listed.is_empty().then_some(())
    })?;
    Ok(())
}

/// Issue 48 on Swarm: the service's task template names the digest its release resolved, so
/// a scale-up after the tag moved starts tasks of the same bytes; a spec change resolves anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine that may become a swarm manager and docker-registry: scripts/test runs it"]
async fn i48_a_service_runs_the_digest_its_release_resolved() -> TestResult {
    let scope = unique("swd");
    let _containers = DockerGuard::new(&scope);
    let _swarm = SwarmGuard::new(&scope)?;
    let registry = crate::support::distribution::Distribution::start("bot", "s3cret-pw")?;
    let host = registry.host();
    let image = format!("{host}/{scope}/app:stable");
    let push = |content: &str| -> TestResult<String> {
        let context = tempfile::tempdir()?;
        std::fs::write(context.path().join("version"), content)?;
        std::fs::write(
            context.path().join("Dockerfile"),
            format!("FROM {}\nCOPY version /version\n", test_image()),
        )?;
        let path = context.path().display().to_string();
        registry.docker(&["build", "-q", "-t", &image, &path], None)?;
        registry.docker(&["push", "-q", &image], None)?;
        let digests = registry.docker(
            &[
                "image",
                "inspect",
                "--format",
                "{{json .RepoDigests}}",
                &image,
            ],
            None,
        )?;
        let digests: Vec<String> = serde_json::from_str(&digests)?;
        registry.docker(&["rmi", "-f", &image], None)?;
        Ok(digests
            .first()
            .and_then(|reference| reference.split_once('@'))
            .map(|(_, digest)| digest.to_owned())
            .ok_or("no digest")?)
    };
    let digest_a = push("A")?;
    let app = |replicas: u32, version: &str| {
        format!(
            "registry \"test\" {{\n  url = \"{host}\"\n  username = \"bot\"\n  token = \"s3cret-pw\"\n}}\ndeployment \"{scope}\" \"web\" {{\n  image    = \"{image}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = {replicas}\n  env      = {{ VERSION = \"{version}\" }}\n}}\n"
        )
    };
    let repo = TempRepo::new()?;
    repo.write("app.hcl", &app(1, "1"))?;
    let first = repo.commit("one replica of :stable")?;
    let dir = tempfile::tempdir()?;
    let (data, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let _agent = Agent::start(
        &repo,
        &data,
        &log,
        &["--runtime", "swarm", "--ready-settle", "1s"],
    )?;
    let key = ResourceKey::new(Kind::Deployment, &scope, "web");
    wait_status(&data, &key, "Ready", 1, &first, &log)?;
    let service = format!("{scope}-web");
    let template = || {
        docker(&[
            "service",
            "inspect",
            &service,
            "--format",
            "{{.Spec.TaskTemplate.ContainerSpec.Image}}",
        ])
    };
    let pinned = |digest: &str| format!("{host}/{scope}/app@{digest}");
    assert_eq!(template()?, pinned(&digest_a));
    // The tag moves; a scale-up starts tasks of A.
    let digest_b = push("B")?;
    assert_ne!(digest_a, digest_b);
    repo.write("app.hcl", &app(2, "1"))?;
    let scaled = repo.commit("two replicas")?;
    wait_until(LIMIT, "two tasks of A", || {
        let images = docker(&[
            "service",
            "ps",
            &service,
            "--filter",
            "desired-state=running",
            "--format",
            "{{.Image}}",
        ])
        .ok()?;
        let images: Vec<&str> = images.lines().collect();
        (images.len() == 2 && images.iter().all(|found| *found == pinned(&digest_a))).then_some(())
    })?;
    assert_eq!(template()?, pinned(&digest_a));
    let _ = scaled;
    // A spec change resolves anew: B.
    repo.write("app.hcl", &app(2, "2"))?;
    let changed = repo.commit("version 2")?;
    wait_status(&data, &key, "Ready", 2, &changed, &log)?;
    assert_eq!(template()?, pinned(&digest_b));
    Ok(())
}
