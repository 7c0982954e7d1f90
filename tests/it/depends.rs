//! Start-up order (`depends_on { resources = [...] }`, issue 52) on the fake runtime with
//! paused time: a deployment that depends on a statefulset creates its first replica only once
//! the statefulset's pod is published ready, and says what it waits for meanwhile; on a commit
//! that changes both, the statefulset rolls first. Read from the fake's call log
//! (`FakeRuntime::calls_by_name`). Also under Swarm, and `validate`/`plan` on a directory.
//! The same on a real engine: `depends_docker`.

use std::time::Duration;

use voodu_agent::model::{Kind, ResourceKey};

use crate::support::{Harness, TestResult};

fn db_key() -> ResourceKey {
    ResourceKey::new(Kind::Statefulset, "shop", "db")
}

fn web_key() -> ResourceKey {
    ResourceKey::new(Kind::Deployment, "shop", "web")
}

/// A statefulset whose pod is probed ready only 20 s after it starts, and a deployment that
/// depends on it, both at `version`.
fn manifests(version: &str) -> String {
    format!(
        r#"statefulset "shop" "db" {{
  image   = "busybox"
  command = ["sleep", "3600"]
  env     = {{ V = "{version}" }}
  probes {{
    readiness {{
      exec {{ command = ["true"] }}
      initial_delay = "20s"
      period        = "1s"
    }}
  }}
}}

deployment "shop" "web" {{
  image    = "busybox"
  command  = ["sleep", "3600"]
  replicas = 2
  env      = {{ V = "{version}" }}
  depends_on {{
    resources = ["statefulset/shop/db"]
  }}
}}
"#
    )
}

/// Where in `calls` (by name) the first call matching `matches` is.
fn first(calls: &[String], what: &str, matches: impl Fn(&str) -> bool) -> TestResult<usize> {
    calls
        .iter()
        .position(|call| matches(call))
        .ok_or_else(|| format!("no {what} in {calls:#?}").into())
}

#[tokio::test(start_paused = true)]
async fn a_deployment_starts_after_the_statefulset_it_depends_on_is_ready() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("shop.hcl", &manifests("1"))])?;
    // Meanwhile web says what it waits for, with db's phase, and has no replica.
    let waiting = harness
        .status_where(&web_key(), |status| {
            status
                .message
                .starts_with("waiting for statefulset/shop/db (")
        })
        .await?;
    assert_eq!(waiting.phase, "Progressing", "{waiting:?}");
    assert!(harness.containers(&web_key()).await?.is_empty());
    harness.converged(&db_key(), 1).await?;
    harness.converged(&web_key(), 2).await?;

    // The call log: db's pod created, probed (its first probe passes: readiness recorded),
    // then web's first create.
    let calls = harness.fake.calls_by_name();
    let db_created = first(&calls, "db's create", |call| {
        call.starts_with("create shop-db")
    })?;
    let db_probed = first(&calls, "db's probe", |call| {
        call.starts_with("exec shop-db")
    })?;
    let web_created = first(&calls, "web's create", |call| {
        call.starts_with("create shop-web")
    })?;
    assert!(
        db_created < db_probed && db_probed < web_created,
        "db created {db_created}, probed {db_probed}, web created {web_created}: {calls:#?}"
    );
    let readiness = harness.store.readiness(&db_key())?;
    assert!(
        readiness.iter().any(|row| row.ready),
        "db's readiness is recorded: {readiness:?}"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn on_a_commit_that_changes_both_the_dependency_rolls_first() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("shop.hcl", &manifests("1"))])?;
    harness.converged(&db_key(), 1).await?;
    harness.converged(&web_key(), 2).await?;
    let mark = harness.fake.calls_by_name().len();
    harness.push(&[("shop.hcl", &manifests("2"))])?;
    // web waits for db's rollout of its new spec.
    let waiting = harness
        .status_where(&web_key(), |status| {
            status
                .message
                .starts_with("waiting for statefulset/shop/db (")
        })
        .await?;
    assert_eq!(waiting.phase, "Progressing", "{waiting:?}");
    harness.converged(&db_key(), 1).await?;
    harness.converged(&web_key(), 2).await?;
    let calls: Vec<String> = harness
        .fake
        .calls_by_name()
        .into_iter()
        .skip(mark)
        .collect();
    let db_created = first(&calls, "db's new pod", |call| {
        call.starts_with("create shop-db")
    })?;
    let db_probed = first(&calls[db_created..], "db's new pod's probe", |call| {
        call.starts_with("exec shop-db")
    })? + db_created;
    let web_changed = first(&calls, "web's first replacement", |call| {
        call.starts_with("create shop-web") || call.starts_with("remove shop-web")
    })?;
    assert!(
        db_probed < web_changed,
        "db's new pod probed at {db_probed}, web's first replacement at {web_changed}: {calls:#?}"
    );
    Ok(())
}

/// Once running, a dependency that becomes unready holds nothing: a web replica that exits is
/// started again while db is not ready.
#[tokio::test(start_paused = true)]
async fn a_running_dependent_is_repaired_while_its_dependency_is_unready() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("shop.hcl", &manifests("1"))])?;
    harness.converged(&db_key(), 1).await?;
    let web = harness.converged(&web_key(), 2).await?;
    // db rolls (a new spec: not ready for 20 s); web's spec is unchanged.
    let next = manifests("1").replacen("V = \"1\"", "V = \"2\"", 1);
    harness.push(&[("shop.hcl", &next)])?;
    harness
        .status_where(&db_key(), |status| status.phase == "Progressing")
        .await?;
    let mark = harness.fake.calls_by_name().len();
    harness.fake.exit(&web[0].id);
    harness.idle_for(Duration::from_secs(2)).await;
    let calls: Vec<String> = harness
        .fake
        .calls_by_name()
        .into_iter()
        .skip(mark)
        .collect();
    assert!(
        calls
            .iter()
            .any(|call| call.starts_with("start shop-web") || call.starts_with("create shop-web")),
        "web's exited replica is repaired while db is not ready: {calls:#?}"
    );
    assert!(
        harness
            .store
            .status(&db_key())?
            .is_some_and(|status| status.phase != "Ready"),
        "db was still rolling"
    );
    harness.converged(&web_key(), 2).await?;
    Ok(())
}

/// `voodu-agent validate` on a directory: a cycle, and (as one source of several) a dependency
/// on another source's resource, are errors at the entry that writes them; the fixed repo
/// validates, for Swarm too.
#[test]
fn validate_refuses_a_cycle_and_another_sources_dependency_where_written() -> TestResult {
    let dir = tempfile::tempdir()?;
    let repo = dir.path().join("blog");
    std::fs::create_dir_all(&repo)?;
    let agent = env!("CARGO_BIN_EXE_voodu-agent");
    let data_dir = dir.path().join("data");
    let run = |args: &[&str]| -> TestResult<(Option<i32>, String)> {
        let output = std::process::Command::new(agent)
            .args(args)
            .arg("--data-dir")
            .arg(&data_dir)
            .output()?;
        Ok((
            output.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        ))
    };
    let repo_arg = repo.display().to_string();
    let block = |kind: &str, name: &str, depends: &str| {
        format!(
            "{kind} \"blog\" \"{name}\" {{\n  image = \"busybox\"\n  depends_on {{\n    resources = [\"{depends}\"]\n  }}\n}}\n"
        )
    };
    // A cycle across two files.
    std::fs::write(
        repo.join("a.hcl"),
        block("deployment", "web", "statefulset/blog/db"),
    )?;
    std::fs::write(
        repo.join("b.hcl"),
        block("statefulset", "db", "deployment/web"),
    )?;
    let (code, out) = run(&["validate", &repo_arg])?;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("a.hcl:4:18: depends_on.resources \"statefulset/blog/db\": a cycle: deployment/blog/web → statefulset/blog/db → deployment/blog/web")
            && out.contains("b.hcl:4:18: depends_on.resources \"deployment/web\": a cycle: statefulset/blog/db → deployment/blog/web → statefulset/blog/db"),
        "{out}"
    );
    // No cycle: valid, on Docker and on Swarm.
    std::fs::write(
        repo.join("b.hcl"),
        "statefulset \"blog\" \"db\" {\n  image = \"busybox\"\n}\n",
    )?;
    for runtime in ["docker", "swarm"] {
        let (code, out) = run(&["validate", &repo_arg, "--runtime", runtime])?;
        assert_eq!(code, Some(0), "{runtime}: {out}");
    }
    // `plan` says web waits for the database the same commit creates.
    let (code, out) = run(&["plan", "--repo", &repo_arg])?;
    assert_eq!(code, Some(0), "{out}");
    let web = out
        .split_once("deployment/blog/web")
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("no web in {out}"))?;
    assert!(
        web.contains("waits for: statefulset/blog/db (Ready first)"),
        "{out}"
    );
    // As source `blog` of two: a dependency on `shop`'s database is refused where written.
    let sources = dir.path().join("sources.hcl");
    std::fs::write(
        &sources,
        "source \"shop\" {\n  url = \"/srv/shop\"\n  scopes = [\"shop\"]\n}\nsource \"blog\" {\n  url = \"/srv/blog\"\n  scopes = [\"blog\"]\n}\n",
    )?;
    std::fs::write(
        repo.join("a.hcl"),
        block("deployment", "web", "statefulset/shop/db"),
    )?;
    let sources_arg = sources.display().to_string();
    let (code, out) = run(&[
        "validate",
        &repo_arg,
        "--sources",
        &sources_arg,
        "--source",
        "blog",
    ])?;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("a.hcl:4:18: depends_on.resources: statefulset/shop/db belongs to source `shop`, not to source `blog`"),
        "{out}"
    );
    assert!(
        !out.contains("unresolved dependency"),
        "one error, not two: {out}"
    );
    Ok(())
}

/// Under Swarm the same pass waits: web's service is created only once db's is Ready (its
/// task must run `--ready-settle` first), and web's status says what it waits for meanwhile.
#[tokio::test(start_paused = true)]
async fn under_swarm_a_service_starts_after_its_dependency_is_ready() -> TestResult {
    use voodu_agent::runtime::{FakeRuntime, Swarm};
    let mut harness = Harness::with_fake(FakeRuntime::with_images(&["busybox"]))?;
    harness.options.engine = voodu_agent::reconcile::Engine::Swarm;
    // A Swarm task settles on the fake's wall clock (real time) while virtual time races
    // ahead: 5 s of real time (the margin for the looks below), under a deadline virtual
    // time does not reach.
    harness.options.ready_settle = Duration::from_secs(5);
    harness.options.rollout_deadline = Duration::from_secs(365 * 24 * 3600);
    harness.start()?;
    let db = ResourceKey::new(Kind::Deployment, "shop", "db");
    harness.push(&[(
        "shop.hcl",
        r#"deployment "shop" "db" {
  image   = "busybox"
  command = ["sleep", "3600"]
}

deployment "shop" "web" {
  image   = "busybox"
  command = ["sleep", "3600"]
  depends_on {
    resources = ["deployment/db"]
  }
}
"#,
    )])?;
    harness
        .status_where(&web_key(), |status| {
            status
                .message
                .starts_with("waiting for deployment/shop/db (")
        })
        .await?;
    let names = |services: Vec<voodu_agent::runtime::Service>| -> Vec<String> {
        services.into_iter().map(|service| service.name).collect()
    };
    let services = names(harness.fake.list_services(&[]).await?);
    assert!(
        services.contains(&"shop-db".to_owned()) && !services.contains(&"shop-web".to_owned()),
        "db's service runs, web's waits: {services:?}"
    );
    let db_status = harness.store.status(&db)?.ok_or("db has a status")?;
    assert_ne!(db_status.phase, "Ready", "{db_status:?}");
    harness
        .status_where(&db, |status| status.phase == "Ready")
        .await?;
    harness
        .status_where(&web_key(), |status| {
            status.phase == "Ready" && status.running_replicas == 1
        })
        .await?;
    let services = names(harness.fake.list_services(&[]).await?);
    assert!(services.contains(&"shop-web".to_owned()), "{services:?}");
    harness.stop().await
}
