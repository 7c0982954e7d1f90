//! Canary rollouts (`canary {}`, issue 51) on the fake runtime with paused time: a new release
//! comes up as the step's share of replicas beside the stable ones, pauses (timed, or until
//! `promote`), advances, and at 100 % the ordinary rollout replaces the stable replicas; an
//! `abort` removes the canary replicas, fails the release and rolls back; a restarted agent
//! resumes the step it was at without creating more canary replicas. The same with the real
//! engine, the real Caddy and a real Prometheus: `canary_docker`.

use std::time::Duration;

use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::runtime::{Container, labels};
use voodu_agent::store::{RolloutPhase, RolloutRequest};

use crate::support::{Harness, TestResult};

fn web() -> ResourceKey {
    ResourceKey::new(Kind::Deployment, "shop", "web")
}

/// Four replicas at `version`, rolled out by `steps` (`step {…}` blocks).
fn manifest(version: &str, steps: &str) -> String {
    format!(
        r#"deployment "shop" "web" {{
  image    = "busybox"
  command  = ["sleep", "3600"]
  replicas = 4
  env      = {{ V = "{version}" }}
  canary {{
{steps}
  }}
}}
"#
    )
}

/// The replicas of each spec hash: (old, new) counts against `old`'s hash.
fn split(containers: &[Container], old: &str) -> (usize, usize) {
    let old_count = containers
        .iter()
        .filter(|c| c.label(labels::MANIFEST_HASH) == Some(old))
        .count();
    (old_count, containers.len() - old_count)
}

async fn rollout_where(
    harness: &Harness,
    check: impl Fn(&voodu_agent::store::RolloutState) -> bool,
) -> TestResult<voodu_agent::store::RolloutState> {
    crate::support::until(
        Duration::from_secs(60),
        crate::support::harness::POLL,
        "a matching rollout",
        || {
            Ok(harness
                .store
                .rollout_state("shop", "web")?
                .filter(|s| check(s)))
        },
    )
    .await
}

/// Waits (real-time bound: the rollout's pauses and windows are wall-clock, as they survive
/// a restart) until `key`'s containers satisfy `check`.
async fn containers_where(
    harness: &Harness,
    check: impl Fn(&[Container]) -> bool,
) -> TestResult<Vec<Container>> {
    let start = std::time::Instant::now();
    loop {
        let containers = harness.containers(&web()).await?;
        if check(&containers) {
            return Ok(containers);
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("containers never matched: {containers:#?}").into());
        }
        tokio::time::sleep(crate::support::harness::POLL).await;
    }
}

/// A harness running 4 replicas of `first` (its v1 manifest): the harness, those replicas and
/// their spec hash.
async fn running_v1(first: &str) -> TestResult<(Harness, Vec<Container>, String)> {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("web.hcl", first)])?;
    let replicas = harness.converged(&web(), 4).await?;
    let hash = replicas[0]
        .label(labels::MANIFEST_HASH)
        .unwrap_or_default()
        .to_owned();
    Ok((harness, replicas, hash))
}

#[tokio::test(start_paused = true)]
async fn a_canary_steps_through_its_shares_pauses_and_promote_then_replaces_the_stable_ones()
-> TestResult {
    let steps = r#"    step {
      weight = 25
      pause  = "2s"
    }
    step {
      weight = 50
      pause  = "until_promoted"
    }
    step { weight = 100 }"#;
    let (mut harness, _, old) = running_v1(&manifest("1", steps)).await?;

    harness.push(&[("web.hcl", &manifest("2", steps))])?;
    // Step 1: one new replica (25 % of 4) beside the 4 stable ones, then the timed pause.
    let paused = rollout_where(&harness, |s| s.phase == RolloutPhase::Paused).await?;
    assert_eq!(
        (paused.step, paused.share, paused.canary_replicas),
        (0, 25, 1)
    );
    assert!(paused.paused_until.is_some(), "{paused:?}");
    assert_eq!(split(&harness.containers(&web()).await?, &old), (4, 1));
    let status = harness.store.status(&web())?.ok_or("no status")?;
    assert!(
        status.message.contains("canary step 1/3: 25 %"),
        "{status:?}"
    );

    // Past the pause: step 2, two new replicas, paused until promoted (no deadline fails it).
    harness.idle_for(Duration::from_secs(31)).await;
    let second =
        rollout_where(&harness, |s| s.step == 1 && s.phase == RolloutPhase::Paused).await?;
    assert_eq!((second.share, second.canary_replicas), (50, 2));
    assert!(second.paused_until.is_none(), "{second:?}");
    harness.idle_for(Duration::from_secs(120)).await;
    assert_eq!(
        split(&harness.containers(&web()).await?, &old),
        (4, 2),
        "{:?} {:#?}",
        harness.store.status(&web())?,
        harness.store.releases(&web(), 10)?
    );
    assert_eq!(
        harness.store.rollout_state("shop", "web")?.map(|s| s.step),
        Some(1)
    );

    // A restarted agent resumes the step: no more canary replicas than it allows.
    harness.stop().await?;
    harness.start()?;
    harness.idle_for(Duration::from_secs(40)).await;
    assert_eq!(split(&harness.containers(&web()).await?, &old), (4, 2));

    // promote: 100 % → the ordinary rollout replaces the stable replicas.
    harness
        .store
        .request_rollout("shop", "web", RolloutRequest::Promote)?
        .ok_or("no rollout in flight")?;
    harness.idle_for(Duration::from_secs(31)).await;
    let done = rollout_where(&harness, |s| s.phase == RolloutPhase::Promoted).await?;
    assert_eq!(done.share, 100);
    let last = harness.converged(&web(), 4).await?;
    assert_eq!(split(&last, &old), (0, 4));
    let release = harness
        .store
        .releases(&web(), 10)?
        .into_iter()
        .next()
        .ok_or("no release")?;
    assert_eq!(release.phase.as_str(), "succeeded", "{release:?}");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn abort_removes_the_canary_fails_the_release_and_rolls_back() -> TestResult {
    let steps = r#"    step {
      weight = 50
      pause  = "until_promoted"
    }
    step { weight = 100 }"#;
    let (mut harness, first, old) = running_v1(&manifest("1", steps)).await?;
    let stable: Vec<String> = first.iter().map(|c| c.id.clone()).collect();

    harness.push(&[("web.hcl", &manifest("2", steps))])?;
    rollout_where(&harness, |s| s.phase == RolloutPhase::Paused).await?;
    assert_eq!(split(&harness.containers(&web()).await?, &old), (4, 2));
    harness
        .store
        .request_rollout("shop", "web", RolloutRequest::Abort)?
        .ok_or("no rollout in flight")?;
    harness.idle_for(Duration::from_secs(31)).await;
    let aborted = rollout_where(&harness, |s| s.phase == RolloutPhase::Aborted).await?;
    assert_eq!(aborted.share, 50);
    // The canary replicas are gone; the stable ones never moved.
    harness.idle_for(Duration::from_secs(5)).await;
    let left = harness.containers(&web()).await?;
    assert_eq!(split(&left, &old), (4, 0), "{left:?}");
    let mut ids: Vec<String> = left.iter().map(|c| c.id.clone()).collect();
    ids.sort();
    let mut stable = stable;
    stable.sort();
    assert_eq!(ids, stable);
    let releases = harness.store.releases(&web(), 10)?;
    assert!(
        releases
            .iter()
            .any(|r| matches!(r.phase.as_str(), "failed" | "rolled_back")
                && r.message.contains("canary aborted at 50 %")),
        "{releases:#?}"
    );
    Ok(())
}

/// Four replicas at `version`, rolled out blue/green.
fn blue_green(version: &str, auto_promote: bool) -> String {
    format!(
        r#"deployment "shop" "web" {{
  image    = "busybox"
  command  = ["sleep", "3600"]
  replicas = 4
  env      = {{ V = "{version}" }}
  blue_green {{
    preview_host = "preview.shop.test"
    auto_promote = {auto_promote}
    keep_old     = "3s"
  }}
}}
"#
    )
}

#[tokio::test(start_paused = true)]
async fn blue_green_brings_the_new_release_up_whole_waits_for_promote_keeps_the_old_then_retires_it()
-> TestResult {
    let (mut harness, _, old) = running_v1(&blue_green("1", false)).await?;

    harness.push(&[("web.hcl", &blue_green("2", false))])?;
    let paused = rollout_where(&harness, |s| s.phase == RolloutPhase::Paused).await?;
    assert_eq!(paused.strategy, "blue_green");
    let containers = harness.containers(&web()).await?;
    assert_eq!(split(&containers, &old), (4, 4));
    // The new release's replicas are recorded for the router (the preview host's).
    let mut new_names: Vec<String> = containers
        .iter()
        .filter(|c| c.label(labels::MANIFEST_HASH) != Some(old.as_str()))
        .map(|c| c.name.clone())
        .collect();
    new_names.sort();
    assert_eq!(paused.green, new_names);
    // Waiting for promote never uses the rollout deadline up.
    harness.idle_for(Duration::from_secs(600)).await;
    assert_eq!(split(&harness.containers(&web()).await?, &old), (4, 4));

    harness
        .store
        .request_rollout("shop", "web", RolloutRequest::Promote)?
        .ok_or("no rollout in flight")?;
    harness.idle_for(Duration::from_secs(31)).await;
    let promoted = rollout_where(&harness, |s| s.phase == RolloutPhase::Promoted).await?;
    assert!(promoted.paused_until.is_some(), "{promoted:?}");
    // The old release is kept for keep_old (3 s), then retired by the ordinary rollout.
    let last = containers_where(&harness, |c| split(c, &old) == (0, 4)).await?;
    assert_eq!(last.len(), 4);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn blue_green_abort_after_promote_switches_back_then_removes_the_new_release() -> TestResult {
    let (mut harness, first, old) = running_v1(&blue_green("1", true)).await?;
    let mut stable: Vec<String> = first.iter().map(|c| c.id.clone()).collect();
    stable.sort();

    harness.push(&[("web.hcl", &blue_green("2", true))])?;
    // auto_promote: promoted as soon as the new release is ready.
    rollout_where(&harness, |s| s.phase == RolloutPhase::Promoted).await?;
    assert_eq!(split(&harness.containers(&web()).await?, &old), (4, 4));
    harness
        .store
        .request_rollout("shop", "web", RolloutRequest::Abort)?
        .ok_or("no rollout in flight")?;
    harness.idle_for(Duration::from_secs(31)).await;
    rollout_where(&harness, |s| s.phase == RolloutPhase::Aborted).await?;
    // The hosts switch back first; the new replicas go once the switch window is over.
    let left = containers_where(&harness, |c| split(c, &old) == (4, 0)).await?;
    let mut ids: Vec<String> = left.iter().map(|c| c.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, stable, "{left:?}");
    let releases = harness.store.releases(&web(), 10)?;
    assert!(
        releases
            .iter()
            .any(|r| r.message.contains("blue/green aborted: switched back")),
        "{releases:#?}"
    );
    Ok(())
}
