//! Issue 6 on the fake runtime with paused time: health-gated rollouts, automatic rollback
//! (deadline and crash loop), a commit superseding a slow rollout, drift repair through
//! events and through the resync, the crash-loop back-off, and the autoscaler with its
//! cooldowns. The same behaviours run against Docker in `health_docker`.

use std::collections::BTreeSet;
use std::time::Duration;

use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::runtime::{ContainerSpec, ContainerState, Containers, labels};
use voodu_agent::store::ReleasePhase;

use crate::support::{Harness, TestResult};

fn key() -> ResourceKey {
    ResourceKey::new(Kind::Deployment, "shop", "web")
}

/// A deployment of `replicas` at version `version`, with `extra` HCL inside the block.
fn web(replicas: u32, version: &str, extra: &str) -> String {
    format!(
        r#"deployment "shop" "web" {{
  image = "busybox"
  command = ["sleep", "3600"]
  replicas = {replicas}
  env = {{ VERSION = "{version}" }}
{extra}}}
"#
    )
}

/// A readiness probe that never passes.
const NEVER_READY: &str = r#"  probes {
    readiness {
      exec { command = ["false"] }
      period = "1s"
    }
  }
"#;

/// Replicas running and published ready right now.
async fn ready_now(harness: &Harness) -> TestResult<usize> {
    let containers = harness.containers(&key()).await?;
    let ready: BTreeSet<String> = harness
        .store
        .readiness(&key())?
        .into_iter()
        .filter(|row| row.ready)
        .map(|row| row.container)
        .collect();
    Ok(containers
        .iter()
        .filter(|container| {
            container.state == ContainerState::Running
                && container.label(labels::ROLE) == Some("deployment")
                && ready.contains(&container.name)
        })
        .count())
}

/// Polls (virtual time) until `done`, sampling the ready count after every container change
/// and every `POLL`; returns its minimum.
async fn sample_until(
    harness: &Harness,
    what: &str,
    done: impl Fn(&Harness) -> TestResult<bool>,
) -> TestResult<usize> {
    let start = std::time::Instant::now();
    let mut lowest = usize::MAX;
    loop {
        let changed = harness.fake.changed();
        lowest = lowest.min(ready_now(harness).await?);
        if done(harness)? {
            return Ok(lowest);
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "{what} never happened; status {:?}, releases {:?}",
                harness.store.status(&key())?,
                harness.store.releases(&key(), 10)?
            )
            .into());
        }
        Harness::next_look(changed).await;
    }
}

/// Names of replicas created since call `mark`.
fn created_since(harness: &Harness, mark: usize) -> Vec<String> {
    harness
        .fake
        .calls()
        .into_iter()
        .skip(mark)
        .filter_map(|call| call.strip_prefix("create ").map(str::to_owned))
        .filter(|name| name.starts_with("shop-web."))
        .collect()
}

fn phases(harness: &Harness) -> TestResult<Vec<&'static str>> {
    Ok(harness
        .store
        .releases(&key(), 10)?
        .iter()
        .map(|release| release.phase.as_str())
        .collect())
}

#[tokio::test(start_paused = true)]
async fn a_version_that_never_becomes_ready_under_surge_keeps_every_ready_replica() -> TestResult {
    let mut harness = Harness::new()?;
    harness.options.rollout_deadline = Duration::from_secs(60);
    harness.start()?;
    harness.push(&[("web.hcl", &web(3, "1", ""))])?;
    let good = harness.converged(&key(), 3).await?;
    let mark = harness.fake.calls().len();
    harness.push(&[("web.hcl", &web(3, "2", NEVER_READY))])?;
    let lowest = sample_until(&harness, "the automatic rollback", |harness| {
        Ok(phases(harness)?.first() == Some(&"succeeded") && phases(harness)?.len() == 3)
    })
    .await?;
    assert!(
        lowest >= 3,
        "ready replicas dropped to {lowest} (< replicas)"
    );
    // One successor of the bad version was tried and retired; the old replicas never left.
    let created = created_since(&harness, mark);
    assert_eq!(created.len(), 1, "one bad successor: {created:?}");
    assert_eq!(phases(&harness)?, ["succeeded", "failed", "succeeded"]);
    let after = harness.converged(&key(), 3).await?;
    assert_eq!(ids(&after), ids(&good), "the same three old replicas");
    harness.stop().await
}

fn ids(containers: &[voodu_agent::runtime::Container]) -> Vec<String> {
    let mut ids: Vec<String> = containers.iter().map(|c| c.id.clone()).collect();
    ids.sort();
    ids
}

/// A pinned host port: a replacement removes the old replica first (no surge).
const PINNED: &str = "  ports = [\"3000:8080\"]\n";

#[tokio::test(start_paused = true)]
async fn a_version_that_never_becomes_ready_stops_after_one_slot_and_is_rolled_back() -> TestResult
{
    let mut harness = Harness::new()?;
    harness.options.rollout_deadline = Duration::from_secs(60);
    harness.start()?;
    harness.push(&[("web.hcl", &web(3, "1", PINNED))])?;
    let good = harness.converged(&key(), 3).await?;
    let good_hash = good[0]
        .label(labels::MANIFEST_HASH)
        .unwrap_or_default()
        .to_owned();
    let mark = harness.fake.calls().len();
    let started = tokio::time::Instant::now();
    harness.push(&[("web.hcl", &web(3, "2", &format!("{PINNED}{NEVER_READY}")))])?;
    let lowest = sample_until(&harness, "the automatic rollback", |harness| {
        Ok(phases(harness)?.first() == Some(&"succeeded") && phases(harness)?.len() == 3)
    })
    .await?;
    let took = started.elapsed();
    assert!(
        lowest >= 2,
        "ready replicas dropped to {lowest} (< replicas - 1)"
    );
    assert!(
        took >= Duration::from_secs(60) && took < Duration::from_secs(90),
        "rolled back after {took:?} with a 60s deadline"
    );
    // One slot of the bad version was tried, then the old version came back in its place.
    let created = created_since(&harness, mark);
    assert_eq!(
        created.len(),
        2,
        "one bad replica, one replacement: {created:?}"
    );
    assert_eq!(phases(&harness)?, ["succeeded", "failed", "succeeded"]);
    let releases = harness.store.releases(&key(), 10)?;
    assert!(
        releases[1]
            .message
            .contains("not ready within the rollout deadline of 1m"),
        "{}",
        releases[1].message
    );
    assert!(
        releases[0]
            .message
            .contains("automatic rollback to release"),
        "{}",
        releases[0].message
    );
    let after = harness.converged(&key(), 3).await?;
    assert!(
        after
            .iter()
            .all(|container| container.label(labels::MANIFEST_HASH) == Some(good_hash.as_str()))
    );
    let status = harness.store.status(&key())?.ok_or("status")?;
    assert_eq!(status.phase, "Ready");
    assert_eq!(harness.metrics.rollbacks("deployment"), 1);
    assert!(
        harness.store.pin(&key())?.is_some(),
        "the bad commit is paused for this resource"
    );

    // Not retried on its own: minutes later, nothing new was created.
    let mark = harness.fake.calls().len();
    harness.idle_for(Duration::from_secs(600)).await;
    assert_eq!(created_since(&harness, mark), Vec::<String>::new());
    // A newer commit that changes the resource is rolled out again.
    harness.push(&[("web.hcl", &web(3, "3", ""))])?;
    harness.converged(&key(), 3).await?;
    assert!(harness.store.pin(&key())?.is_none());
    assert_eq!(phases(&harness)?.first(), Some(&"succeeded"));
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_crash_looping_new_version_is_rolled_back_before_its_deadline() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("web.hcl", &web(2, "1", ""))])?;
    harness.converged(&key(), 2).await?;
    let started = tokio::time::Instant::now();
    let crashing = web(2, "2", "").replace(r#"["sleep", "3600"]"#, r#"["sh", "-c", "exit 3"]"#);
    harness.push(&[("web.hcl", &crashing)])?;
    let lowest = sample_until(&harness, "the rollback of a crash loop", |harness| {
        Ok(phases(harness)?.len() == 3 && phases(harness)?.first() == Some(&"succeeded"))
    })
    .await?;
    assert!(lowest >= 1, "ready replicas dropped to {lowest}");
    assert!(
        started.elapsed() < Duration::from_secs(300),
        "took {:?}",
        started.elapsed()
    );
    let failed = &harness.store.releases(&key(), 10)?[1];
    assert_eq!(failed.phase, ReleasePhase::Failed);
    assert!(
        failed
            .message
            .contains("crash-looping (restarted 3 times, last exit code 3)"),
        "{}",
        failed.message
    );
    harness.converged(&key(), 2).await?;
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_first_deploy_that_never_becomes_ready_fails_and_waits_for_a_new_commit() -> TestResult {
    let mut harness = Harness::new()?;
    harness.options.rollout_deadline = Duration::from_secs(30);
    harness.start()?;
    harness.push(&[("web.hcl", &web(2, "1", NEVER_READY))])?;
    let status = harness
        .status_where(&key(), |status| status.phase == "Failed")
        .await?;
    assert!(
        status
            .message
            .contains("no earlier release ran, so there is nothing to roll back to"),
        "{}",
        status.message
    );
    assert_eq!(phases(&harness)?, ["failed"]);
    let mark = harness.fake.calls().len();
    harness.idle_for(Duration::from_secs(600)).await;
    assert_eq!(
        created_since(&harness, mark),
        Vec::<String>::new(),
        "halted: not retried"
    );
    harness.push(&[("web.hcl", &web(2, "2", ""))])?;
    harness.converged(&key(), 2).await?;
    harness.stop().await
}

/// Issue 10 item 8, the resurrect case: deploy `web`, delete it in git, re-add it with a
/// version that never becomes ready. Its rollout is the first of a new incarnation: it fails
/// and stays failed (nothing to go back to), and the deleted incarnation's spec never comes
/// back, neither as desired state nor as containers, nor as a pin.
#[tokio::test(start_paused = true)]
async fn i10_a_re_added_resource_that_fails_is_not_rolled_back_to_its_deleted_self() -> TestResult {
    let mut harness = Harness::new()?;
    harness.options.rollout_deadline = Duration::from_secs(30);
    harness.start()?;
    let other = r#"deployment "shop" "api" {
  image = "busybox"
  command = ["sleep", "3600"]
}
"#;
    harness.push(&[("web.hcl", &web(2, "1", "")), ("api.hcl", other)])?;
    let deleted = harness.converged(&key(), 2).await?;
    let deleted_hash = deleted[0]
        .label(labels::MANIFEST_HASH)
        .unwrap_or_default()
        .to_owned();
    harness.push(&[("api.hcl", other)])?;
    harness.converged(&key(), 0).await?;
    let readded = harness.push(&[("web.hcl", &web(2, "2", NEVER_READY)), ("api.hcl", other)])?;
    let status = harness
        .status_where(&key(), |status| status.phase == "Failed")
        .await?;
    assert!(
        status.message.contains(
            "it was deleted from git and added again, and no release ran since, so there is nothing to roll back to"
        ),
        "{}",
        status.message
    );
    assert_eq!(phases(&harness)?, ["failed", "succeeded"]);
    assert_eq!(harness.metrics.rollbacks("deployment"), 0);
    assert!(harness.store.pin(&key())?.is_none(), "nothing is pinned");
    let desired = harness.store.desired(&key())?.ok_or("web is desired")?;
    assert_eq!(desired.commit, readded, "desired stays what git declares");
    assert_ne!(desired.spec_hash.as_str(), deleted_hash);

    // Halted, not retried, and the deleted version never comes back.
    let mark = harness.fake.calls().len();
    harness.idle_for(Duration::from_secs(600)).await;
    assert_eq!(created_since(&harness, mark), Vec::<String>::new());
    let containers = harness.containers(&key()).await?;
    assert!(
        containers
            .iter()
            .all(|container| container.label(labels::MANIFEST_HASH) != Some(deleted_hash.as_str())),
        "{containers:?}"
    );
    // A fixed commit rolls out as usual.
    harness.push(&[("web.hcl", &web(2, "3", "")), ("api.hcl", other)])?;
    harness.converged(&key(), 2).await?;
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_commit_during_a_slow_rollout_supersedes_it() -> TestResult {
    let mut harness = Harness::new()?;
    harness.options.ready_settle = Duration::from_secs(20);
    harness.start()?;
    harness.push(&[("web.hcl", &web(3, "1", ""))])?;
    harness.converged(&key(), 3).await?;
    harness.push(&[("web.hcl", &web(3, "2", ""))])?;
    // Wait until the slow rollout has replaced its first slot.
    let v2 = harness.store.desired(&key())?.ok_or("desired")?.spec_hash;
    loop {
        let containers = harness.containers(&key()).await?;
        if containers
            .iter()
            .any(|container| container.label(labels::MANIFEST_HASH) == Some(v2.as_str()))
        {
            break;
        }
        tokio::time::sleep(crate::support::harness::POLL).await;
    }
    harness.push(&[("web.hcl", &web(3, "3", ""))])?;
    let v3 = harness.store.desired(&key())?.ok_or("desired")?.spec_hash;
    let lowest = sample_until(&harness, "the v3 rollout", |harness| {
        Ok(phases(harness)?.first() == Some(&"succeeded") && phases(harness)?.len() == 3)
    })
    .await?;
    assert!(lowest >= 2, "ready replicas dropped to {lowest}");
    assert_eq!(phases(&harness)?, ["succeeded", "superseded", "succeeded"]);
    let superseded = &harness.store.releases(&key(), 10)?[1];
    assert!(
        superseded.message.contains("superseded by commit"),
        "{}",
        superseded.message
    );
    let after = harness.converged(&key(), 3).await?;
    assert!(
        after
            .iter()
            .all(|container| container.label(labels::MANIFEST_HASH) == Some(v3.as_str()))
    );
    harness.stop().await
}

/// The replicas a rollout replaces are the agent's own removals: their stop and destroy
/// events are no drift (no pass of their own, no `drift.repaired` to tell anyone of).
#[tokio::test(start_paused = true)]
async fn replicas_a_rollout_replaces_are_no_drift() -> TestResult {
    let mut harness = Harness::new()?;
    harness.options.resync = Duration::from_secs(3600);
    harness.start()?;
    harness.push(&[("web.hcl", &web(2, "1", ""))])?;
    let before = harness.converged(&key(), 2).await?;
    harness.push(&[("web.hcl", &web(2, "2", ""))])?;
    let after = loop {
        let after = harness.converged(&key(), 2).await?;
        if after
            .iter()
            .all(|new| before.iter().all(|old| old.id != new.id))
        {
            break after;
        }
        tokio::time::sleep(crate::support::harness::POLL).await;
    };
    // Every event of the replaced replicas has come and gone.
    harness.idle_for(Duration::from_secs(30)).await;
    assert_eq!(harness.converged(&key(), 2).await?, after);
    let drift: Vec<String> = harness
        .store
        .events_after(0, 1000)?
        .into_iter()
        .filter(|event| event.event.starts_with("drift"))
        .map(|event| format!("{} {}", event.event, event.message))
        .collect();
    assert_eq!(drift, Vec::<String>::new());
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn stopped_and_removed_replicas_are_repaired_at_once_through_events() -> TestResult {
    let mut harness = Harness::new()?;
    harness.options.resync = Duration::from_secs(3600);
    harness.start()?;
    harness.push(&[("web.hcl", &web(2, "1", ""))])?;
    let replicas = harness.converged(&key(), 2).await?;
    let started = tokio::time::Instant::now();
    // Stopped by hand: started again, same container.
    harness.fake.exit(&replicas[0].id);
    let after = harness.converged(&key(), 2).await?;
    assert!(after.iter().any(|container| container.id == replicas[0].id));
    // Removed by hand: a new replica takes its place.
    harness.fake.remove(&replicas[1].id).await?;
    let after = harness.converged(&key(), 2).await?;
    assert!(after.iter().all(|container| container.id != replicas[1].id));
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}, the resync is an hour",
        started.elapsed()
    );
    // People are told of the repair once the pass converged (`drift.repaired`).
    let mut repaired = Vec::new();
    for _ in 0..600 {
        repaired = harness
            .store
            .events_after(0, 1000)?
            .into_iter()
            .filter(|event| event.event == "drift.repaired")
            .collect();
        if !repaired.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!repaired.is_empty(), "no drift.repaired event");
    for event in &repaired {
        assert_eq!(event.resource, "deployment/shop/web");
        assert_eq!(event.data["seen_by"], "event");
    }
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn without_events_the_resync_repairs_drift_and_removes_only_labelled_leftovers() -> TestResult
{
    let mut harness = Harness::new()?;
    harness.options.container_events = false;
    harness.options.resync = Duration::from_secs(30);
    harness.start()?;
    harness.push(&[("web.hcl", &web(2, "1", ""))])?;
    let replicas = harness.converged(&key(), 2).await?;
    let agent = harness.store.agent_id()?;
    let stray = |name: &str, with_labels: bool| {
        let mut spec = ContainerSpec {
            name: name.to_owned(),
            image: "busybox".to_owned(),
            command: Some(vec!["sleep".to_owned(), "3600".to_owned()]),
            ..ContainerSpec::default()
        };
        if with_labels {
            for (label, value) in [
                (labels::AGENT, agent.as_str()),
                (labels::KIND, "deployment"),
                (labels::SCOPE, "shop"),
                (labels::NAME, "gone"),
                (labels::ROLE, "deployment"),
            ] {
                spec.labels.insert(label.to_owned(), value.to_owned());
            }
        }
        spec
    };
    let orphan = harness.fake.create(&stray("shop-gone.ab12", true)).await?;
    harness.fake.start(&orphan).await?;
    let foreign = harness.fake.create(&stray("someone-elses", false)).await?;
    harness.fake.start(&foreign).await?;
    let started = tokio::time::Instant::now();
    harness.fake.exit(&replicas[0].id);
    harness.fake.remove(&replicas[1].id).await?;
    // The resync finds the drift and the pass it queues repairs it: two replicas run again.
    loop {
        let running = harness
            .containers(&key())
            .await?
            .iter()
            .filter(|container| container.state == ContainerState::Running)
            .count();
        if running == 2 {
            break;
        }
        let took = started.elapsed();
        assert!(
            took <= Duration::from_secs(30) + Duration::from_secs(10),
            "not repaired after {took:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Without events the new replica's probe runner starts from the next resync's list, so
    // the resource is Ready again after that one.
    harness.converged(&key(), 2).await?;
    let all: Vec<String> = harness
        .fake
        .list(&[])
        .await?
        .into_iter()
        .map(|container| container.name)
        .collect();
    assert!(
        !all.contains(&"shop-gone.ab12".to_owned()),
        "labelled leftover removed: {all:?}"
    );
    assert!(
        all.contains(&"someone-elses".to_owned()),
        "unlabelled container untouched: {all:?}"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_crash_looping_replica_backs_off_and_status_says_so() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("web.hcl", &web(1, "1", ""))])?;
    let replica = harness.converged(&key(), 1).await?.remove(0);
    // The first crash is repaired at once.
    harness.fake.exit(&replica.id);
    harness.converged(&key(), 1).await?;
    let second_crash = tokio::time::Instant::now();
    harness.fake.exit(&replica.id);
    let status = harness
        .status_where(&key(), |status| status.message.contains("crash-looping"))
        .await?;
    assert_eq!(status.phase, "Degraded");
    assert!(
        status.message.contains("next start in"),
        "{}",
        status.message
    );
    harness.converged(&key(), 1).await?;
    let waited = second_crash.elapsed();
    assert!(
        waited >= Duration::from_secs(10),
        "started again after {waited:?}, before its 10s back-off"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn the_autoscaler_scales_up_and_down_within_cooldowns_without_touching_the_hash() -> TestResult
{
    let mut harness = Harness::new()?;
    harness.options.autoscale_interval = Duration::from_secs(5);
    harness.start()?;
    let autoscaled = r#"deployment "shop" "web" {
  image = "busybox"
  command = ["sleep", "3600"]
  autoscale {
    min = 1
    max = 3
    cpu_target = 50
    cooldown_up = "30s"
    cooldown_down = "60s"
  }
}
"#;
    harness.push(&[("web.hcl", autoscaled)])?;
    let first = harness.converged(&key(), 1).await?.remove(0);
    let hash = harness.store.desired(&key())?.ok_or("desired")?.spec_hash;
    harness.fake.set_cpu_percent(&first.id, 90.0);
    let t0 = tokio::time::Instant::now();
    harness.converged(&key(), 2).await?;
    let first_up = t0.elapsed();
    // Idle newcomers are left out of the mean: still 90%, but the next step waits 30s.
    harness.converged(&key(), 3).await?;
    let second_up = t0.elapsed();
    assert!(
        first_up <= Duration::from_secs(10),
        "first scale-up after {first_up:?}"
    );
    assert!(
        second_up >= first_up + Duration::from_secs(25),
        "second scale-up {second_up:?} within the 30s cooldown of the first ({first_up:?})"
    );
    let three = harness.containers(&key()).await?;
    assert!(
        three.iter().any(|container| container.id == first.id),
        "the survivor was not churned"
    );
    assert_eq!(
        harness.store.desired(&key())?.ok_or("desired")?.spec_hash,
        hash
    );
    assert_eq!(
        harness
            .store
            .desired(&key())?
            .ok_or("desired")?
            .replicas_override,
        Some(3)
    );
    // Idle: down one, then the next only after the 60s cooldown.
    for container in &three {
        harness.fake.set_cpu_percent(&container.id, 5.0);
    }
    let t1 = tokio::time::Instant::now();
    harness.converged(&key(), 2).await?;
    let first_down = t1.elapsed();
    harness.converged(&key(), 1).await?;
    let second_down = t1.elapsed();
    assert!(
        second_down >= first_down + Duration::from_secs(55),
        "second scale-down {second_down:?} within the 60s cooldown of the first ({first_down:?})"
    );
    let status = harness.store.status(&key())?.ok_or("status")?;
    assert_eq!(status.detail.json()["autoscaled_replicas"], 1);
    // Dropping `autoscale` clears the override: the manifest's count rules again.
    harness.push(&[("web.hcl", &web(2, "1", ""))])?;
    harness.converged(&key(), 2).await?;
    assert_eq!(harness.store.replicas_override(&key())?, None);
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_bucket_change_rolls_its_consumers_at_once() -> TestResult {
    let mut harness = Harness::new()?;
    harness.options.resync = Duration::from_secs(3600);
    harness.start()?;
    harness.push(&[("web.hcl", &web(2, "1", ""))])?;
    let before = harness.converged(&key(), 2).await?;
    // Let every timer of the first rollout run out: only the bucket change may act now.
    harness.idle_for(Duration::from_secs(30)).await;
    harness.store.config_set(
        "shop",
        "web",
        &[("GREETING".to_owned(), "hello".to_owned())].into(),
    )?;
    let started = tokio::time::Instant::now();
    // Converged again on two replicas that carry the new value, without a commit or resync.
    let after = loop {
        let containers = harness.converged(&key(), 2).await?;
        let fresh = containers.iter().all(|container| {
            harness
                .fake
                .spec_of(&container.id)
                .is_some_and(|spec| spec.env.contains(&"GREETING=hello".to_owned()))
        });
        if fresh {
            break containers;
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!("the bucket change did not roll {}: {containers:?}", key()).into());
        }
        tokio::time::sleep(crate::support::harness::POLL).await;
    };
    assert!(
        after
            .iter()
            .all(|container| before.iter().all(|old| old.id != container.id))
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_version_failing_liveness_never_takes_ready_replicas_below_replicas_minus_one()
-> TestResult {
    let mut harness = Harness::new()?;
    harness.options.rollout_deadline = Duration::from_secs(120);
    harness.start()?;
    harness.push(&[("web.hcl", &web(3, "1", ""))])?;
    harness.converged(&key(), 3).await?;
    let dying = r#"  probes {
    liveness {
      exec { command = ["false"] }
      period = "1s"
      failure_threshold = 1
    }
  }
"#;
    harness.push(&[("web.hcl", &web(3, "2", dying))])?;
    let lowest = sample_until(
        &harness,
        "the rollback of a version failing liveness",
        |harness| Ok(phases(harness)?.len() == 3 && phases(harness)?.first() == Some(&"succeeded")),
    )
    .await?;
    assert!(lowest >= 2, "ready replicas dropped to {lowest}");
    harness.converged(&key(), 3).await?;
    harness.stop().await
}
