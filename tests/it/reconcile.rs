//! Reconcile behaviours on the fake runtime with real SQLite and paused time: rollout one slot
//! at a time, scaling without churn, prune, retries that re-read desired state, permanent
//! errors, panics, and restart replay without duplicates. Plus one in-process agent run over
//! a real git repo.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::reconcile::{self, ReconcileOptions};
use voodu_agent::runtime::fake::Fault;
use voodu_agent::runtime::{Container, Error as RuntimeError, FakeRuntime, labels};
use voodu_agent::store::{FailureReason, ReleasePhase, Store};

use crate::support::{self, Harness, TempRepo, TestResult};

fn web(replicas: u32, env: &str) -> String {
    format!(
        r#"deployment "shop" "web" {{
  image = "busybox"
  command = ["sleep", "3600"]
  replicas = {replicas}
  env = {{ V = "{env}" }}
}}
"#
    )
}

fn web_key() -> ResourceKey {
    ResourceKey::new(Kind::Deployment, "shop", "web")
}

fn ids(containers: &[Container]) -> Vec<String> {
    let mut ids: Vec<String> = containers
        .iter()
        .map(|container| container.id.clone())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(start_paused = true)]
async fn deploy_creates_replicas_with_voodu_names_labels_and_a_release() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    let commit = harness.push(&[("web.hcl", &web(2, "1"))])?;
    let containers = harness.converged(&web_key(), 2).await?;
    for container in &containers {
        let replica_id = container
            .label(labels::REPLICA_ID)
            .ok_or("replica id label")?;
        assert_eq!(container.name, format!("shop-web.{replica_id}"));
        assert_eq!(replica_id.len(), 4);
        assert_eq!(container.label(labels::CREATED_BY), Some("voodu"));
        assert_eq!(container.label(labels::KIND), Some("deployment"));
        let spec = harness.fake.spec_of(&container.id).ok_or("spec")?;
        assert!(spec.env.contains(&"V=1".to_owned()), "{:?}", spec.env);
        assert_eq!(spec.networks, ["voodu0"]);
        assert_eq!(spec.aliases, ["web.shop", "web.shop.voodu"]);
    }
    let release = harness
        .store
        .latest_release(&web_key())?
        .ok_or("a release")?;
    assert_eq!(
        (release.commit, release.phase),
        (commit, ReleasePhase::Succeeded)
    );
    harness.stop().await
}

/// `web` with a pinned host port: two replicas cannot bind it at once, so a replacement
/// removes the old replica first (no surge).
fn web_pinned(replicas: u32, env: &str) -> String {
    web(replicas, env).replace("  replicas =", "  ports = [\"3000:8080\"]\n  replicas =")
}

/// Deploys three replicas of `manifest(…, "1")`, rolls them to `"2"`, checks every replica
/// was replaced, and returns the creates and removes of the roll in order.
async fn roll_three(
    harness: &mut Harness,
    manifest: fn(u32, &str) -> String,
) -> TestResult<Vec<String>> {
    harness.push(&[("web.hcl", &manifest(3, "1"))])?;
    let before = harness.converged(&web_key(), 3).await?;
    let mark = harness.fake.calls().len();
    harness.push(&[("web.hcl", &manifest(3, "2"))])?;
    let after = harness.converged(&web_key(), 3).await?;
    assert!(
        ids(&before).iter().all(|id| !ids(&after).contains(id)),
        "every replica replaced"
    );
    Ok(harness.churn_since(mark))
}

#[tokio::test(start_paused = true)]
async fn a_spec_change_replaces_every_replica_one_slot_at_a_time() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    assert_eq!(
        roll_three(&mut harness, web_pinned).await?,
        ["remove", "create", "remove", "create", "remove", "create"],
        "one slot at a time"
    );
    assert_eq!(harness.store.releases(&web_key(), 10)?.len(), 2);
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_spec_change_surges_one_replica_at_a_time() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    assert_eq!(
        roll_three(&mut harness, web).await?,
        ["create", "remove", "create", "remove", "create", "remove"],
        "the successor first, one at a time"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn missing_replicas_are_created_together_and_ready_after_one_settle() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    let settle = ReconcileOptions::default().ready_settle;
    let virtual_start = tokio::time::Instant::now();
    harness.push(&[("web.hcl", &web(6, "1"))])?;
    harness.converged(&web_key(), 6).await?;
    let waited = virtual_start.elapsed();
    // One after another with a settle each would take 6 settles; together, one.
    assert!(
        waited >= settle && waited < settle * 3,
        "6 replicas took {waited:?} with a {settle:?} settle"
    );
    // A scale-up creates the 4 missing ones together as well, and touches no survivor.
    let mark = harness.fake.calls().len();
    let virtual_start = tokio::time::Instant::now();
    harness.push(&[("web.hcl", &web(10, "1"))])?;
    harness.converged(&web_key(), 10).await?;
    assert!(virtual_start.elapsed() < settle * 3);
    assert_eq!(harness.churn_since(mark), ["create"; 4]);
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn the_creates_of_every_resource_share_the_agent_s_create_slots() -> TestResult {
    let mut harness = Harness::new()?;
    harness.options.concurrency = 4;
    harness.options.create_concurrency = 5;
    // Slow creates, so that those of different keys overlap.
    harness.fake.set_create_latency(Duration::from_secs(1));
    harness.start()?;
    let files: Vec<(String, String)> = (0..4)
        .map(|n| {
            (
                format!("web{n}.hcl"),
                web(3, "1").replace("\"web\"", &format!("\"web{n}\"")),
            )
        })
        .collect();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(path, text)| (path.as_str(), text.as_str()))
        .collect();
    harness.push(&files)?;
    for n in 0..4 {
        let key = ResourceKey::new(Kind::Deployment, "shop", format!("web{n}"));
        harness.converged(&key, 3).await?;
    }
    // Four keys in parallel wanted 12 creates at once: the five slots were all taken, and no
    // more (a cap per key would have let 12 run).
    assert_eq!(harness.fake.peak_creates(), 5);
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn only_a_later_release_looks_for_hooks_of_older_releases() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    let hook_lists = |calls: &[String]| {
        calls
            .iter()
            .filter(|call| call.starts_with("list ") && call.contains("web-release"))
            .count()
    };
    harness.push(&[("web.hcl", &web(2, "1"))])?;
    harness.converged(&web_key(), 2).await?;
    // The resource's first release: no other release's hook can run.
    assert_eq!(hook_lists(&harness.fake.calls()), 0);
    let mark = harness.fake.calls().len();
    harness.push(&[("web.hcl", &web(2, "2"))])?;
    harness.converged(&web_key(), 2).await?;
    assert_eq!(harness.store.releases(&web_key(), 10)?.len(), 2);
    assert_eq!(
        hook_lists(&harness.fake.calls()[mark..]),
        1,
        "once per release"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn scaling_keeps_surviving_replicas() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("web.hcl", &web(2, "1"))])?;
    let two = ids(&harness.converged(&web_key(), 2).await?);
    harness.push(&[("web.hcl", &web(3, "1"))])?;
    let three = ids(&harness.converged(&web_key(), 3).await?);
    assert!(
        two.iter().all(|id| three.contains(id)),
        "survivors keep their ids"
    );
    harness.push(&[("web.hcl", &web(1, "1"))])?;
    let one = ids(&harness.converged(&web_key(), 1).await?);
    assert!(three.contains(&one[0]));
    assert_eq!(
        harness.store.releases(&web_key(), 10)?.len(),
        1,
        "scaling is not a rollout"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_resource_leaving_the_repo_is_pruned() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("web.hcl", &web(2, "1"))])?;
    harness.converged(&web_key(), 2).await?;
    harness.push(&[])?;
    harness.converged(&web_key(), 0).await?;
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn transient_errors_are_retried_on_the_backoff_schedule() -> TestResult {
    let mut harness = Harness::new()?;
    for _ in 0..3 {
        harness.fake.inject(
            "create",
            Fault::Fail(RuntimeError::Unavailable {
                message: "engine restarting".into(),
            }),
        );
    }
    harness.start()?;
    let virtual_start = tokio::time::Instant::now();
    harness.push(&[("web.hcl", &web(1, "1"))])?;
    harness.converged(&web_key(), 1).await?;
    let waited = virtual_start.elapsed();
    assert!(
        waited >= Duration::from_secs(1 + 2 + 4),
        "backoff 1+2+4 s, waited {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(1 + 2 + 4 + 8),
        "no fourth retry needed, waited {waited:?}"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn each_retry_rereads_desired_so_a_delete_wins() -> TestResult {
    let mut harness = Harness::new()?;
    for _ in 0..6 {
        harness.fake.inject(
            "create",
            Fault::Fail(RuntimeError::Unavailable {
                message: "engine restarting".into(),
            }),
        );
    }
    harness.start()?;
    harness.push(&[("web.hcl", &web(1, "1"))])?;
    harness
        .status_where(&web_key(), |status| {
            status.message.contains("engine restarting")
        })
        .await?;
    harness.push(&[])?;
    harness.converged(&web_key(), 0).await?;
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_is_recorded_and_not_retried() -> TestResult {
    let mut harness = Harness::with_fake(FakeRuntime::with_images(&["busybox"]))?;
    harness.start()?;
    harness.push(&[(
        "web.hcl",
        r#"deployment "shop" "web" {
  image = "nope:1"
}
"#,
    )])?;
    let status = harness
        .status_where(&web_key(), |status| status.phase == "Failed")
        .await?;
    assert!(
        status
            .message
            .contains("image nope:1 is not on this host and pulling it failed"),
        "{}",
        status.message
    );
    harness.idle_for(Duration::from_secs(120)).await;
    let pulls = harness
        .fake
        .calls()
        .iter()
        .filter(|call| call.starts_with("pull"))
        .count();
    assert_eq!(
        pulls, 1,
        "one pull attempt: permanent errors wait for the next change"
    );
    let release = harness.store.latest_release(&web_key())?.ok_or("release")?;
    assert_eq!(release.phase, ReleasePhase::Failed);
    // The next commit gets a fresh chance.
    harness.push(&[(
        "web.hcl",
        r#"deployment "shop" "web" {
  image = "busybox"
  command = ["sleep", "3600"]
}
"#,
    )])?;
    harness.converged(&web_key(), 1).await?;
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_is_recorded_and_the_loop_goes_on() -> TestResult {
    let mut harness = Harness::new()?;
    harness
        .fake
        .inject("create", Fault::Panic("boom in create".into()));
    harness.start()?;
    harness.push(&[("web.hcl", &web(1, "1"))])?;
    let status = harness
        .status_where(&web_key(), |status| status.phase == "Failed")
        .await?;
    assert!(
        status.message.contains("handler panicked: boom in create"),
        "{}",
        status.message
    );
    // The loop still runs: the next change of the same resource converges.
    harness.push(&[("web.hcl", &web(1, "2"))])?;
    harness.converged(&web_key(), 1).await?;
    harness.stop().await
}

/// Issue 10 item 1 ("a resource whose handler fails in any way must never take the agent down
/// with it"): one resource whose stored spec this agent cannot read (written by another
/// version, or damaged) fails alone; a replica of another resource that stops is still
/// repaired (its reconcile reads every desired spec for its environment).
#[tokio::test(start_paused = true)]
async fn i10_an_unreadable_resource_does_not_stop_the_others() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    let api = r#"deployment "shop" "api" {
  image = "busybox"
  command = ["sleep", "3600"]
}
"#;
    harness.push(&[("web.hcl", &web(1, "1")), ("api.hcl", api)])?;
    let before = harness.converged(&web_key(), 1).await?;
    let connection = rusqlite::Connection::open(harness._dir.path().join("state.db"))?;
    connection.execute(
        r#"UPDATE desired SET spec = '{"from": "another version"' WHERE name = 'api'"#,
        [],
    )?;
    let mark = harness.fake.calls().len();
    harness.fake.exit(&before[0].id);
    harness.converged(&web_key(), 1).await?;
    let repairs: Vec<String> = harness
        .fake
        .calls()
        .into_iter()
        .skip(mark)
        .filter(|call| call.starts_with("start ") || call.starts_with("create "))
        .collect();
    assert!(!repairs.is_empty(), "the stopped replica was repaired");
    harness.stop().await
}

/// Issue 11, bug 3: one store error in the journal tail stopped the whole agent (the same
/// error in a worker is a warning). A journal row the store cannot read fails the tail until
/// it is gone; the reconciler keeps running and applies the next commit.
#[tokio::test(start_paused = true)]
async fn a_store_error_in_the_journal_tail_does_not_stop_the_agent() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("web.hcl", &web(1, "1"))])?;
    harness.converged(&web_key(), 1).await?;
    let connection = rusqlite::Connection::open(harness._dir.path().join("state.db"))?;
    connection.execute(
        "INSERT INTO journal (kind, scope, name, op, generation, commit_sha)
         VALUES ('gizmo', 'shop', 'web', 'PUT', 1, 'c0ffee')",
        [],
    )?;
    harness.store.notice_external_writes()?;
    let start = Instant::now();
    while harness.metrics.journal_errors("tail") < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the tail never met the unreadable row"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        harness.reconciler_running(),
        "a store error stopped the reconciler"
    );
    connection.execute("DELETE FROM journal WHERE kind = 'gizmo'", [])?;
    harness.push(&[("web.hcl", &web(2, "1"))])?;
    harness.converged(&web_key(), 2).await?;
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_restart_replays_desired_without_duplicates_and_prunes_what_left() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[
        ("web.hcl", &web(2, "1")),
        (
            "api.hcl",
            r#"deployment "shop" "api" {
  image = "busybox"
  command = ["sleep", "3600"]
}
"#,
        ),
    ])?;
    let before = ids(&harness.converged(&web_key(), 2).await?);
    let api = ResourceKey::new(Kind::Deployment, "shop", "api");
    harness.converged(&api, 1).await?;
    harness.stop().await?;
    // While the agent is down, api leaves the repo.
    harness.push(&[("web.hcl", &web(2, "1"))])?;
    let mark = harness.fake.calls().len();
    harness.start()?;
    harness.converged(&api, 0).await?;
    let after = ids(&harness.converged(&web_key(), 2).await?);
    assert_eq!(before, after, "replay must not touch converged replicas");
    assert!(
        harness
            .churn_since(mark)
            .iter()
            .all(|verb| verb == "remove"),
        "no creates on replay"
    );
    assert_eq!(
        harness.store.cursor(reconcile::CURSOR)?,
        3,
        "cursor past every handled row"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_half_done_rollout_resumes_after_a_crash() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("web.hcl", &web(3, "1"))])?;
    harness.converged(&web_key(), 3).await?;
    harness.stop().await?;
    // Simulate a crash mid-rollout: new desired (a new command, same environment, so the
    // copied env digest label stays right), one old replica gone, one new one created but
    // never started.
    harness.push(&[("web.hcl", &web(3, "1").replace(r#""3600""#, r#""3601""#))])?;
    let desired = harness.store.desired(&web_key())?.ok_or("desired")?;
    let old = harness.containers(&web_key()).await?;
    {
        use voodu_agent::runtime::Containers;
        harness.fake.remove(&old[0].id).await?;
        let mut spec = harness.fake.spec_of(&old[1].id).ok_or("spec")?;
        spec.name = "shop-web.beef".into();
        spec.labels
            .insert(labels::MANIFEST_HASH.into(), desired.spec_hash.to_string());
        harness.fake.create(&spec).await?;
    }
    harness.start()?;
    let after = harness.converged(&web_key(), 3).await?;
    assert!(
        after
            .iter()
            .any(|container| container.name == "shop-web.beef"),
        "the created replica is started, not duplicated"
    );
    harness.stop().await
}

/// The sequence number of the newest journal row (0 for none).
fn journal_head(store: &Store) -> TestResult<i64> {
    Ok(store
        .journal_after(0, usize::MAX)?
        .last()
        .map_or(0, |entry| entry.seq))
}

/// In-process agent over a real git repo: commit → containers; a broken commit is rejected
/// with its location and changes nothing.
#[tokio::test]
async fn agent_applies_commits_and_keeps_the_last_good_one_on_bad_input() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("deploy/web.hcl", &web(2, "1"))?;
    let good = repo.commit("web")?;
    let data = tempfile::tempdir()?;
    let fake = Arc::new(FakeRuntime::new());
    let shutdown = CancellationToken::new();
    let mut config = crate::support::agent::fake_agent_config(&repo, data.path());
    config.source.paths = vec!["deploy".into()];
    let agent = tokio::spawn(voodu_agent::agent::run_with_runtime(
        config,
        fake.clone(),
        None,
        shutdown.clone().cancelled_owned(),
    ));
    let store = Store::open(&data.path().join("state.db"))?;
    let running = |fake: &FakeRuntime| {
        fake.calls()
            .iter()
            .filter(|call| call.starts_with("start "))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while store
        .status(&web_key())?
        .is_none_or(|status| status.phase != "Ready")
    {
        assert!(Instant::now() < deadline, "agent never converged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(running(&fake), 2);
    // The reconciler has handled every journal row there is (it acts on nothing else here:
    // no drift, the resync minutes away), so from now on only a new row could touch the host.
    let head = journal_head(&store)?;
    while store.cursor(reconcile::CURSOR)? < head {
        assert!(Instant::now() < deadline, "journal never handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls_before = fake
        .calls()
        .iter()
        .filter(|call| !call.starts_with("list"))
        .count();
    repo.write(
        "deploy/web.hcl",
        r#"deployment "shop" "web" {
  replicas = 3
  imge = "x"
}
"#,
    )?;
    let bad = repo.commit("typo")?;
    while store.commit_summary()?.last_rejected.is_none() {
        assert!(Instant::now() < deadline, "bad commit never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let summary = store.commit_summary()?;
    let rejected = summary.last_rejected.ok_or("rejected")?;
    assert_eq!(rejected.sha.as_str(), bad);
    assert_eq!(
        rejected
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["deploy/web.hcl:3:3: unknown attribute `imge` in deployment (did you mean `image`?)"]
    );
    assert_eq!(summary.last_applied.ok_or("applied")?.sha.as_str(), good);
    assert_eq!(
        journal_head(&store)?,
        head,
        "a rejected commit writes no journal row"
    );
    let calls_after = fake
        .calls()
        .iter()
        .filter(|call| !call.starts_with("list"))
        .count();
    assert_eq!(
        calls_before, calls_after,
        "a rejected commit changes nothing on the host"
    );
    shutdown.cancel();
    agent.await??;
    Ok(())
}

/// An image from a private registry cannot be pulled until a `registry` declares its
/// credentials; once one does, the deployment is retried without a commit to it, the pull
/// presents the credentials, and the release history shows the failed attempt and the
/// successful one.
#[tokio::test(start_paused = true)]
async fn declaring_a_registry_retries_a_failed_private_pull() -> TestResult {
    let fake = FakeRuntime::with_images(&["busybox"]);
    fake.publish("ghcr.io/acme/api:1", "deploy-bot");
    let mut harness = Harness::with_fake(fake)?;
    harness.start()?;
    let app = r#"deployment "shop" "web" {
  image = "ghcr.io/acme/api:1"
  command = ["sleep", "3600"]
}
"#;
    harness.push(&[("web.hcl", app)])?;
    let status = harness
        .status_where(&web_key(), |status| status.phase == "Failed")
        .await?;
    assert!(
        status.message.contains("declare a `registry` for ghcr.io"),
        "{}",
        status.message
    );
    // The registry handler finds it by this typed reason, not by the message.
    assert_eq!(status.reason, Some(FailureReason::PullFailed));
    let registry = r#"registry "ghcr" {
  url = "ghcr.io"
  username = "deploy-bot"
  token = "s3cret"
}
"#;
    harness.push(&[("web.hcl", app), ("registry.hcl", registry)])?;
    harness.converged(&web_key(), 1).await?;
    let releases = harness.store.releases(&web_key(), 10)?;
    let phases: Vec<ReleasePhase> = releases.iter().map(|release| release.phase).collect();
    assert_eq!(phases, [ReleasePhase::Succeeded, ReleasePhase::Failed]);
    // The pull is told (the resource's timeline shows it), once: the failed attempt is not.
    let pulls: Vec<_> = harness
        .store
        .events_after(0, 1000)?
        .into_iter()
        .filter(|event| event.event == "image.pulled")
        .collect();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0].resource, "deployment/shop/web");
    assert_eq!(pulls[0].data["image"], "ghcr.io/acme/api:1");
    let registry_status = harness
        .store
        .status(&ResourceKey::new(
            voodu_agent::model::Kind::Registry,
            "",
            "ghcr",
        ))?
        .ok_or("registry status")?;
    assert!(
        !registry_status.detail.json().to_string().contains("s3cret"),
        "no token in status: {}",
        registry_status.detail.json()
    );
    harness.stop().await
}

/// Issue 24 item 2: a missing image is pulled on every path that creates a container, not
/// only by a rollout. After the host loses the image (`docker rmi`, a prune, a rebuilt host):
/// a scale-up, the re-creation of a replica removed by hand, and an agent restart each pull it
/// with the `registry`'s credentials and converge, instead of failing `ImageMissing` forever.
#[tokio::test(start_paused = true)]
async fn a_missing_image_is_pulled_by_every_path_that_creates_a_replica() -> TestResult {
    const IMAGE: &str = "ghcr.io/acme/api:1";
    let fake = FakeRuntime::with_images(&["busybox"]);
    fake.publish(IMAGE, "deploy-bot");
    let mut harness = Harness::with_fake(fake)?;
    harness.start()?;
    let app = |replicas: u32| {
        format!(
            "deployment \"shop\" \"web\" {{\n  image = \"{IMAGE}\"\n  command = [\"sleep\", \"3600\"]\n  replicas = {replicas}\n}}\n"
        )
    };
    let registry = "registry \"ghcr\" {\n  url = \"ghcr.io\"\n  username = \"deploy-bot\"\n  token = \"s3cret\"\n}\n";
    // The rollout pulls the tag (resolving it); every repair pulls the digest it pinned.
    let pulls = |harness: &Harness| {
        harness
            .fake
            .calls()
            .iter()
            .filter(|call| {
                *call == &format!("pull {IMAGE}")
                    || call.starts_with("pull ghcr.io/acme/api@sha256:")
            })
            .count()
    };
    harness.push(&[("web.hcl", &app(1)), ("registry.hcl", registry)])?;
    harness.converged(&web_key(), 1).await?;
    assert_eq!(pulls(&harness), 1, "the rollout pulled it");

    // 1. Scale-up after the image was removed from the host.
    harness.fake.remove_image(IMAGE);
    harness.push(&[("web.hcl", &app(2)), ("registry.hcl", registry)])?;
    harness.converged(&web_key(), 2).await?;
    assert_eq!(pulls(&harness), 2, "the scale-up pulled it");

    // 2. A replica removed by hand (`docker rm -f`) after the image was removed again.
    harness.fake.remove_image(IMAGE);
    let replicas = harness.containers(&web_key()).await?;
    let first = replicas.first().ok_or("a replica")?;
    voodu_agent::runtime::Containers::remove(harness.fake.as_ref(), &first.id).await?;
    harness.converged(&web_key(), 2).await?;
    assert_eq!(pulls(&harness), 3, "the drift repair pulled it");

    // 3. An agent restarted on a host whose images were pruned, a replica gone meanwhile.
    harness.stop().await?;
    harness.fake.remove_image(IMAGE);
    let replicas = harness.containers(&web_key()).await?;
    let first = replicas.first().ok_or("a replica")?;
    voodu_agent::runtime::Containers::remove(harness.fake.as_ref(), &first.id).await?;
    harness.start()?;
    harness.converged(&web_key(), 2).await?;
    assert_eq!(pulls(&harness), 4, "the restart's repair pulled it");
    harness.stop().await
}

/// The asset handler keeps an asset's files as the commit declared them: a file edited or
/// deleted on the host is rewritten from the bytes the store kept (on the next reconcile of
/// the asset: here the boot replay), and status says which keys were repaired.
#[tokio::test(start_paused = true)]
async fn asset_files_changed_on_the_host_are_repaired() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[(
        "cfg.hcl",
        "asset \"shop\" \"cfg\" {\n  conf = \"port = 8080\\n\"\n  motd = \"hello\"\n}\n",
    )])?;
    let key = ResourceKey::new(voodu_agent::model::Kind::Asset, "shop", "cfg");
    let first = harness
        .status_where(&key, |status| status.phase == "Ready")
        .await?;
    // This harness skips the sync stage, which writes asset files before the journal: the
    // handler wrote them itself, from the stored bytes.
    assert_eq!(
        first.detail.json()["repaired"],
        serde_json::json!(["conf", "motd"])
    );
    let dir = harness._dir.path().join("assets/shop/cfg");
    assert_eq!(std::fs::read_to_string(dir.join("conf"))?, "port = 8080\n");
    harness.stop().await?;
    harness.store.delete_status(&key)?;
    std::fs::write(dir.join("conf"), "port = 1\n")?;
    std::fs::remove_file(dir.join("motd"))?;
    std::fs::write(dir.join("stray"), "not declared")?;
    harness.start()?;
    let status = harness
        .status_where(&key, |status| {
            status.detail.json()["repaired"]
                .as_array()
                .is_some_and(|keys| !keys.is_empty())
        })
        .await?;
    assert_eq!(
        status.detail.json()["repaired"],
        serde_json::json!(["conf", "motd"])
    );
    assert_eq!(std::fs::read_to_string(dir.join("conf"))?, "port = 8080\n");
    assert_eq!(std::fs::read_to_string(dir.join("motd"))?, "hello");
    assert!(!dir.join("stray").exists(), "an undeclared file is removed");
    harness.stop().await
}

/// Bug 1 of issue 11: a rollout whose environment cannot be built (its only `env_from` bucket
/// is missing) is a failed pass like any other, for both replicated kinds: status says so
/// (never `Ready`), and the release in flight fails while the old replicas run on.
#[tokio::test(start_paused = true)]
async fn an_environment_that_cannot_be_built_is_not_ready() -> TestResult {
    let body = |kind: &str, name: &str, env: &str| {
        format!(
            "{kind} \"shop\" \"{name}\" {{\n  image = \"busybox\"\n  command = [\"sleep\", \"3600\"]\n  replicas = 2\n  {env}\n}}\n"
        )
    };
    let cases = [
        (Kind::Deployment, "deployment", "web"),
        (Kind::Statefulset, "statefulset", "db"),
    ];
    for (kind, word, name) in cases {
        let key = ResourceKey::new(kind, "shop", name);
        let file = format!("{name}.hcl");
        let mut harness = Harness::new()?;
        harness.start()?;
        let good = harness.push(&[(&file, &body(word, name, "env = { V = \"1\" }"))])?;
        let before = ids(&harness.converged(&key, 2).await?);
        let bad = harness.push(&[(&file, &body(word, name, "env_from = [\"missing\"]"))])?;
        let status = harness
            .status_where(&key, |status| status.phase == "Failed")
            .await?;
        assert!(
            status.message.contains("missing"),
            "{key}: {}",
            status.message
        );
        let releases = harness.store.releases(&key, 10)?;
        let phases: Vec<(&str, ReleasePhase)> = releases
            .iter()
            .map(|release| (release.commit.as_str(), release.phase))
            .collect();
        assert!(
            phases.contains(&(bad.as_str(), ReleasePhase::Failed)),
            "{key}: the bad commit's release failed: {phases:?}"
        );
        assert!(
            phases.contains(&(good.as_str(), ReleasePhase::Succeeded)),
            "{key}: {phases:?}"
        );
        assert_eq!(ids(&harness.containers(&key).await?), before, "{key}");
        harness.stop().await?;
    }
    Ok(())
}

/// `web` with a `release {}` that runs `command` before each rollout.
fn web_with_hooks(env: &str) -> String {
    format!(
        r#"deployment "shop" "web" {{
  image = "busybox"
  command = ["sleep", "3600"]
  replicas = 1
  env = {{ V = "{env}" }}
  release {{
    command = ["true"]
  }}
}}
"#
    )
}

#[tokio::test(start_paused = true)]
async fn release_hooks_are_skipped_for_a_spec_that_already_rolled_out() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    let hook_runs = |harness: &Harness| -> Vec<String> {
        harness
            .fake
            .calls_by_name()
            .into_iter()
            .filter(|call| call.starts_with("create shop-web-release."))
            .collect()
    };
    // v1, v2, then v1 again (a `git revert`): the third release rolls out a spec the first
    // already rolled out with success, so its hooks do not run again.
    for (n, version) in ["1", "2", "1"].into_iter().enumerate() {
        let commit = harness.push(&[("web.hcl", &web_with_hooks(version))])?;
        let release = support::until(
            Duration::from_secs(60),
            Duration::from_millis(100),
            "the release succeeded",
            || {
                Ok(harness.store.latest_release(&web_key())?.filter(|release| {
                    release.commit == commit && release.phase == ReleasePhase::Succeeded
                }))
            },
        )
        .await?;
        assert_eq!(release.id, i64::try_from(n)? + 1);
    }
    assert_eq!(
        hook_runs(&harness),
        ["create shop-web-release.1", "create shop-web-release.2"]
    );
    let third = harness
        .store
        .latest_release(&web_key())?
        .ok_or("a release")?;
    assert!(
        third
            .message
            .contains("release hooks skipped: release #1 already rolled out this spec"),
        "{}",
        third.message
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn every_replica_stops_with_its_drain_grace() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    let stops = |harness: &Harness| -> Vec<String> {
        harness
            .fake
            .calls()
            .into_iter()
            .filter_map(|call| {
                let rest = call.strip_prefix("stop ")?;
                Some(rest.split_once(' ')?.1.to_owned())
            })
            .collect()
    };
    let with_grace = |replicas: u32, env: &str| {
        web(replicas, env).replace(
            "  replicas =",
            "  drain {\n    grace = \"7s\"\n  }\n  replicas =",
        )
    };
    // A roll of three, then a scale-down to one, then a prune: each replica that goes gets
    // its grace (Docker's 10 s where none is declared).
    harness.push(&[("web.hcl", &web(2, "1"))])?;
    harness.converged(&web_key(), 2).await?;
    harness.push(&[("web.hcl", &web(2, "2"))])?;
    harness.converged(&web_key(), 2).await?;
    assert_eq!(stops(&harness), ["10s", "10s"]);
    harness.push(&[("web.hcl", &with_grace(3, "3"))])?;
    harness.converged(&web_key(), 3).await?;
    harness.push(&[("web.hcl", &with_grace(1, "3"))])?;
    harness.converged(&web_key(), 1).await?;
    assert_eq!(stops(&harness)[2..], ["7s", "7s", "7s", "7s"]);
    harness.push(&[("other.hcl", "")])?;
    harness.converged(&web_key(), 0).await?;
    assert_eq!(stops(&harness)[6..], ["7s"]);
    harness.stop().await
}
