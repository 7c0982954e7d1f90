//! Issue 24: a pass never waits. Init containers and release hooks are one-shot runs that a
//! pass starts and returns from; their end (or deadline) queues the next pass. Shown on the
//! fake runtime under paused time (workers held by long runs would starve every other key),
//! and on a real engine (`a_long_init_holds_no_worker_on_docker`).
//!
//! Assertions are on the engine's state and call log, never on wall time: a run "takes
//! 300 s" here because nothing ends it until the test does.

use std::time::Duration;

use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::runtime::{Container, ContainerState, Containers, labels};
use voodu_agent::store::{Phase, ReleasePhase};

use crate::support::{self, Harness, TestResult};

/// A deployment whose one init container runs until it is ended (300 s in a real run).
fn slow_init(name: &str) -> String {
    format!(
        r#"deployment "shop" "{name}" {{
  image   = "busybox"
  command = ["sleep", "3600"]
  init "migrate" {{
    command = ["sleep", "300"]
    timeout = "24h"
  }}
}}
"#
    )
}

/// A deployment whose release `command` runs until it is ended, at version `v`.
fn slow_hook(v: &str) -> String {
    format!(
        r#"deployment "shop" "hooked" {{
  image   = "busybox"
  command = ["sleep", "3600"]
  env     = {{ V = "{v}" }}
  release {{
    command = ["sleep", "300"]
    timeout = "24h"
  }}
}}
"#
    )
}

/// A plain deployment at version `v`.
fn plain(v: &str) -> String {
    format!(
        r#"deployment "shop" "other" {{
  image   = "busybox"
  command = ["sleep", "3600"]
  env     = {{ V = "{v}" }}
}}
"#
    )
}

fn key(name: &str) -> ResourceKey {
    ResourceKey::new(Kind::Deployment, "shop", name)
}

/// Every container of scope `shop`, init and release units included.
async fn shop(harness: &Harness) -> TestResult<Vec<Container>> {
    Ok(harness.fake.list(&[(labels::SCOPE, "shop")]).await?)
}

fn named<'a>(containers: &'a [Container], name: &str) -> Option<&'a Container> {
    containers.iter().find(|container| container.name == name)
}

fn running(containers: &[Container], name: &str) -> bool {
    named(containers, name).is_some_and(|container| container.state == ContainerState::Running)
}

/// The init unit of `name`'s single replica (its name ends in the replica id).
fn init_of<'a>(containers: &'a [Container], name: &str) -> Option<&'a Container> {
    let prefix = format!("shop-{name}-init-migrate-");
    containers
        .iter()
        .find(|container| container.name.starts_with(&prefix))
}

/// The release hook unit of `hooked` (one at a time).
fn hook(containers: &[Container]) -> Option<&Container> {
    containers
        .iter()
        .find(|container| container.name.starts_with("shop-hooked-release."))
}

/// The replicas (role `deployment`) of `name`.
fn replicas<'a>(containers: &'a [Container], name: &str) -> Vec<&'a Container> {
    containers
        .iter()
        .filter(|container| {
            container.label(labels::NAME) == Some(name)
                && container.label(labels::ROLE) == Some("deployment")
        })
        .collect()
}

const INITS: [&str; 4] = ["a1", "a2", "a3", "a4"];

#[tokio::test(start_paused = true)]
async fn long_inits_and_hooks_hold_no_worker_and_a_delete_or_new_spec_supersedes_them() -> TestResult
{
    let mut harness = Harness::new()?;
    // Two workers, five resources whose runs outlast the test: a pass that waited for one
    // would hold a worker for the whole run.
    harness.options.concurrency = 2;
    harness.options.rollout_deadline = Duration::from_secs(3600);
    harness.start()?;
    let files = |hook_version: &str, other_version: &str, with_a1: bool| {
        let mut files: Vec<(String, String)> = INITS
            .iter()
            .filter(|name| with_a1 || **name != "a1")
            .map(|name| (format!("{name}.hcl"), slow_init(name)))
            .collect();
        files.push(("hooked.hcl".to_owned(), slow_hook(hook_version)));
        files.push(("other.hcl".to_owned(), plain(other_version)));
        files
    };
    let push = |harness: &mut Harness, files: Vec<(String, String)>| {
        let borrowed: Vec<(&str, &str)> = files
            .iter()
            .map(|(path, text)| (path.as_str(), text.as_str()))
            .collect();
        harness.push(&borrowed)
    };
    push(&mut harness, files("1", "1", true))?;

    // 1. Every long run started, and the unrelated deployment converged meanwhile.
    let started = until_shop(
        &harness,
        "four inits, the hook and `other` running",
        |containers| {
            let all = INITS.iter().all(|name| {
                init_of(containers, name).is_some_and(|c| c.state == ContainerState::Running)
            }) && hook(containers).is_some_and(|c| c.state == ContainerState::Running)
                && replicas(containers, "other").len() == 1;
            Ok(all.then(|| containers.to_vec()))
        },
    )
    .await?;
    let inits: Vec<String> = INITS
        .iter()
        .filter_map(|name| init_of(&started, name).map(|c| c.id.clone()))
        .collect();
    let old_other = replicas(&started, "other")[0].id.clone();
    let first_hook = hook(&started).ok_or("the hook")?.name.clone();

    // 2. A one-line change to `other` is applied while all five runs still run.
    push(&mut harness, files("1", "2", true))?;
    until_shop(&harness, "`other` rolled to V=2", |containers| {
        let fresh = replicas(containers, "other")
            .into_iter()
            .find(|replica| {
                replica.id != old_other
                    && harness
                        .fake
                        .spec_of(&replica.id)
                        .is_some_and(|spec| spec.env.contains(&"V=2".to_owned()))
            })
            .map(|replica| replica.id.clone());
        Ok(fresh)
    })
    .await?;
    let now = shop(&harness).await?;
    for (name, id) in INITS.iter().zip(&inits) {
        let init = init_of(&now, name).ok_or(format!("{name}'s init"))?;
        assert_eq!(
            (&init.id, init.state),
            (id, ContainerState::Running),
            "{name}: the same init, still running"
        );
        assert!(
            replicas(&now, name).is_empty(),
            "{name}: no replica before its init ended"
        );
    }
    assert!(running(&now, &first_hook), "the hook still runs");
    assert!(
        replicas(&now, "hooked").is_empty(),
        "no replica before the hook ended"
    );
    let status = harness.store.status(&key("a2"))?.ok_or("a2's status")?;
    assert!(
        status.message.contains("init container migrate"),
        "{}",
        status.message
    );
    let status = harness
        .store
        .status(&key("hooked"))?
        .ok_or("hooked's status")?;
    assert!(
        status.message.contains("running its command hook"),
        "{}",
        status.message
    );

    // 3. Deleting a1 during its init removes the init container and the resource.
    push(&mut harness, files("1", "2", false))?;
    until_shop(&harness, "a1's init removed", |containers| {
        Ok(
            (init_of(containers, "a1").is_none() && harness.store.status(&key("a1"))?.is_none())
                .then_some(()),
        )
    })
    .await?;
    assert!(
        harness
            .fake
            .calls()
            .contains(&format!("remove {}", inits[0])),
        "{:?}",
        harness.fake.calls()
    );

    // 4. A new spec of `hooked` during its hook supersedes it: release 1's hook container
    //    goes, release 2's hook starts.
    push(&mut harness, files("2", "2", false))?;
    let superseded = until_shop(
        &harness,
        "release 2's hook running, release 1's gone",
        |containers| {
            Ok((named(containers, &first_hook).is_none()
                && hook(containers).is_some_and(|c| c.state == ContainerState::Running))
            .then(|| containers.to_vec()))
        },
    )
    .await?;
    // The others' inits ran on through all of it.
    for (name, id) in INITS.iter().zip(&inits).skip(1) {
        let init = init_of(&superseded, name).ok_or(format!("{name}'s init"))?;
        assert_eq!(
            (&init.id, init.state),
            (id, ContainerState::Running),
            "{name}"
        );
    }

    // 5. The runs end: each end queues its key, whose pass creates the replica.
    for id in &inits[1..] {
        harness.fake.exit_with(id, 0);
    }
    let second_hook = hook(&superseded).ok_or("release 2's hook")?.id.clone();
    harness.fake.exit_with(&second_hook, 0);
    for name in ["a2", "a3", "a4", "hooked"] {
        harness.converged(&key(name), 1).await?;
    }
    let releases = harness.store.releases(&key("hooked"), 10)?;
    assert_eq!(releases[0].phase, ReleasePhase::Succeeded, "{releases:?}");
    let status = harness.store.status(&key("a2"))?.ok_or("a2's status")?;
    assert_eq!(status.phase, Phase::Ready, "{}", status.message);
    let after = shop(&harness).await?;
    assert!(
        INITS.iter().all(|name| init_of(&after, name).is_none()),
        "succeeded inits go once their replica is created"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_failed_init_attempt_is_retried_after_a_pause_then_fails_the_pass() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    let spec = r#"deployment "shop" "flaky" {
  image   = "busybox"
  command = ["sleep", "3600"]
  init "migrate" {
    command = ["sleep", "300"]
    retries = 1
  }
}
"#;
    harness.push(&[("flaky.hcl", spec)])?;
    let attempt = |n: &'static str| {
        until_shop(&harness, "an init attempt running", move |containers| {
            Ok(init_of(containers, "flaky")
                .filter(|init| {
                    init.state == ContainerState::Running && init.label(labels::ATTEMPT) == Some(n)
                })
                .map(|init| init.id.clone()))
        })
    };
    let first = attempt("1").await?;
    harness.fake.exit_with(&first, 3);
    // The failed attempt is left for inspection until the next one replaces it.
    let second = attempt("2").await?;
    assert_ne!(first, second);
    assert!(
        harness.fake.calls().contains(&format!("remove {first}")),
        "the failed attempt is replaced by the next"
    );
    harness.fake.exit_with(&second, 4);
    let status = support::until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "the used-up chain reported",
        || {
            Ok(harness.store.status(&key("flaky"))?.filter(|status| {
                status.message.contains("init container")
                    && status.message.contains("migrate")
                    && status.message.contains("2 attempt")
            }))
        },
    )
    .await?;
    assert!(status.message.contains("exit code 4"), "{}", status.message);
    let containers = shop(&harness).await?;
    assert!(
        replicas(&containers, "flaky").is_empty(),
        "no replica without its init"
    );
    harness.stop().await
}

/// A statefulset of `replicas` pods whose init runs until it is ended.
fn slow_stateful(replicas: u32) -> String {
    format!(
        r#"statefulset "shop" "db" {{
  image    = "busybox"
  command  = ["sleep", "3600"]
  replicas = {replicas}
  init "migrate" {{
    command = ["sleep", "300"]
    timeout = "24h"
  }}
}}
"#
    )
}

/// The init units of statefulset `db`, with their ordinal.
fn stateful_inits(containers: &[Container]) -> Vec<(String, &Container)> {
    containers
        .iter()
        .filter(|container| {
            container.label(labels::NAME) == Some("db")
                && container.label(labels::ROLE) == Some("init")
        })
        .map(|container| {
            (
                container
                    .label(labels::REPLICA_ID)
                    .unwrap_or_default()
                    .to_owned(),
                container,
            )
        })
        .collect()
}

/// A statefulset scaled down while the init of the pod it no longer wants runs: that init
/// container is removed (it used to run on), and the pods kept are untouched.
#[tokio::test(start_paused = true)]
async fn a_statefulset_scaled_down_during_an_init_removes_that_init() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("db.hcl", &slow_stateful(2))])?;
    // Pod 0's init ends; pod 0 runs; pod 1's init starts.
    let first = until_shop(&harness, "pod 0's init running", |containers| {
        Ok(stateful_inits(containers)
            .into_iter()
            .find(|(ordinal, init)| ordinal == "0" && init.state == ContainerState::Running)
            .map(|(_, init)| init.id.clone()))
    })
    .await?;
    harness.fake.exit_with(&first, 0);
    let second = until_shop(
        &harness,
        "pod 1's init running beside pod 0",
        |containers| {
            let pod0 = containers.iter().any(|container| {
                container.label(labels::ROLE) == Some("statefulset")
                    && container.label(labels::REPLICA_ID) == Some("0")
                    && container.state == ContainerState::Running
            });
            Ok(stateful_inits(containers)
                .into_iter()
                .find(|(ordinal, init)| ordinal == "1" && init.state == ContainerState::Running)
                .filter(|_| pod0)
                .map(|(_, init)| init.id.clone()))
        },
    )
    .await?;
    harness.push(&[("db.hcl", &slow_stateful(1))])?;
    until_shop(&harness, "pod 1's init removed", |containers| {
        Ok(containers
            .iter()
            .all(|container| container.id != second)
            .then_some(()))
    })
    .await?;
    let containers = shop(&harness).await?;
    let pods: Vec<&str> = containers
        .iter()
        .filter(|container| container.label(labels::ROLE) == Some("statefulset"))
        .map(|container| container.label(labels::REPLICA_ID).unwrap_or_default())
        .collect();
    assert_eq!(pods, ["0"], "pod 0 kept, no pod 1");
    assert!(
        stateful_inits(&containers).is_empty(),
        "no init left: {:?}",
        stateful_inits(&containers)
            .iter()
            .map(|(ordinal, init)| (ordinal.clone(), init.name.clone()))
            .collect::<Vec<_>>()
    );
    harness.stop().await
}

/// Polls the scope's containers every 100 ms of (virtual) time until `check` returns `Some`;
/// a liveness bound of 60 s of wall-clock time, not a timing assertion.
async fn until_shop<T>(
    harness: &Harness,
    what: &str,
    check: impl Fn(&[Container]) -> TestResult<Option<T>>,
) -> TestResult<T> {
    let start = std::time::Instant::now();
    loop {
        let containers = shop(harness).await?;
        if let Some(value) = check(&containers)? {
            return Ok(value);
        }
        if start.elapsed() > Duration::from_secs(60) {
            let seen: Vec<(&str, ContainerState)> = containers
                .iter()
                .map(|container| (container.name.as_str(), container.state))
                .collect();
            let calls: Vec<String> = harness
                .fake
                .calls()
                .into_iter()
                .filter(|call| !call.starts_with("list"))
                .collect();
            let calls = calls[calls.len().saturating_sub(40)..].to_vec();
            return Err(format!(
                "timed out waiting for {what}; saw {seen:?}; last calls {calls:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `name` in `scope`: one replica at version `v`, with an init container running `init`.
fn docker_deployment(scope: &str, name: &str, v: &str, init: Option<&str>) -> String {
    let init = init.map_or_else(String::new, |command| {
        format!("  init \"migrate\" {{\n    command = {command}\n    timeout = \"10m\"\n  }}\n")
    });
    crate::refusal_docker::deployment(scope, name, v, &init)
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_long_init_holds_no_worker_on_docker() -> TestResult {
    use crate::e2e_docker::{Env, Row};
    use crate::support::wait_until;
    const LIMIT: Duration = Duration::from_secs(90);
    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();
        let slow = docker_deployment(&scope, "slow", "1", Some(r#"["sleep", "300"]"#));
        env.repo.write("app/slow.hcl", &slow)?;
        env.repo.write(
            "app/other.hcl",
            &docker_deployment(&scope, "other", "1", None),
        )?;
        env.repo.commit("slow init, other v1")?;
        // One worker: a pass that waited for the init would hold it for 300 s.
        env.start_agent_with(&["--concurrency", "1"])?;
        let init_prefix = format!("{scope}-slow-init-migrate-");
        let other_prefix = format!("{scope}-other.");
        let of = |rows: &[Row], prefix: &str| -> Vec<Row> {
            rows.iter()
                .filter(|row| row.name.starts_with(prefix))
                .cloned()
                .collect()
        };
        let (init, other) = wait_until(LIMIT, "the init running and `other` up", || {
            let rows = env.containers().ok()?;
            let init = of(&rows, &init_prefix).into_iter().next()?;
            let other = of(&rows, &other_prefix).into_iter().next()?;
            (init.state == "running" && other.state == "running").then_some((init, other))
        })?;

        // A change to `other` is applied while the init still runs.
        env.repo.write(
            "app/other.hcl",
            &docker_deployment(&scope, "other", "2", None),
        )?;
        env.repo.commit("other v2")?;
        let rolled = wait_until(LIMIT, "`other` at V=2", || {
            let rows = env.containers().ok()?;
            of(&rows, &other_prefix).into_iter().find(|row| {
                row.id != other.id
                    && row.state == "running"
                    && env_of(&row.id).is_ok_and(|vars| vars.contains(&"V=2".to_owned()))
            })
        })?;
        let rows = env.containers()?;
        let still = of(&rows, &init_prefix);
        assert_eq!(
            still
                .iter()
                .map(|row| (&row.id, row.state.as_str()))
                .collect::<Vec<_>>(),
            [(&init.id, "running")],
            "the same init, still running, once `other` rolled ({})",
            rolled.name
        );
        assert!(
            of(&rows, &format!("{scope}-slow.")).is_empty(),
            "no replica of `slow` before its init ended"
        );

        // Deleting `slow` during its init removes the init container.
        env.repo.remove("app/slow.hcl")?;
        env.repo.commit("drop slow")?;
        wait_until(LIMIT, "`slow`'s init removed", || {
            let rows = env.containers().ok()?;
            rows.iter()
                .all(|row| !row.name.starts_with(&format!("{scope}-slow")))
                .then_some(())
        })?;
        Ok(())
    })
}

/// A container's environment, as `docker inspect` shows it.
fn env_of(id: &str) -> TestResult<Vec<String>> {
    let output = std::process::Command::new("docker")
        .args(["inspect", "--format", "{{json .Config.Env}}", id])
        .output()?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned().into());
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}
