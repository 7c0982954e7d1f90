//! Issue 12 (voodu 2026): a plugin-owned nested block (`trafik {}`, a typo such as `probs {}`)
//! does not reject its commit; at apply its resource fails with voodu's "belongs to a plugin
//! named …, which is not installed" message before any of its containers is touched, its
//! containers from an earlier commit run on, and the other resources of the commit apply.
//! Fake runtime, real SQLite, paused time.

use std::time::Duration;

use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::store::{FailureReason, ReleasePhase};

use crate::support::{Harness, TestResult};

fn deployment(name: &str, env: &str, extra: &str) -> String {
    format!(
        r#"deployment "shop" "{name}" {{
  image = "busybox"
  command = ["sleep", "3600"]
  replicas = 2
  env = {{ V = "{env}" }}
{extra}}}
"#
    )
}

const TRAFIK: &str = "  trafik \"sip\" {\n    port = 5060\n  }\n";

fn env_of(harness: &Harness, id: &str) -> Vec<String> {
    harness
        .fake
        .spec_of(id)
        .map(|spec| spec.env)
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn i12_a_plugin_block_fails_its_resource_and_leaves_its_containers_running() -> TestResult {
    let web = ResourceKey::new(Kind::Deployment, "shop", "web");
    let api = ResourceKey::new(Kind::Deployment, "shop", "api");
    let mut harness = Harness::new()?;
    harness.start()?;
    let first = harness.push(&[
        ("web.hcl", &deployment("web", "1", "")),
        ("api.hcl", &deployment("api", "1", "")),
    ])?;
    let running = harness.converged(&web, 2).await?;
    harness.converged(&api, 2).await?;
    let calls_before = harness.fake.calls().len();

    // The same commit changes both; only web gains a plugin block.
    harness.push(&[
        ("web.hcl", &deployment("web", "2", TRAFIK)),
        ("api.hcl", &deployment("api", "2", "")),
    ])?;
    let status = harness
        .status_where(&web, |status| {
            status.reason == Some(FailureReason::PluginNotInstalled)
        })
        .await?;
    assert_eq!(status.phase, "Failed");
    assert_eq!(
        status.message,
        "deployment/shop/web: block \"trafik\" belongs to a plugin named \"trafik\", which is not installed — run `vd plugins:install <source>` or remove the block (at web.hcl:6:3; voodu-agent installs no plugins)"
    );
    let api_now = harness.converged(&api, 2).await?;
    assert!(
        api_now
            .iter()
            .all(|container| env_of(&harness, &container.id).contains(&"V=2".to_owned())),
        "the other resource of the commit applies"
    );
    harness.idle_for(Duration::from_secs(120)).await;
    let web_now = harness.containers(&web).await?;
    let ids = |containers: &[voodu_agent::runtime::Container]| {
        let mut ids: Vec<String> = containers.iter().map(|c| c.id.clone()).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&web_now), ids(&running), "web's replicas are untouched");
    assert!(
        web_now
            .iter()
            .all(|container| env_of(&harness, &container.id).contains(&"V=1".to_owned()))
    );
    let web_changes: Vec<String> = harness
        .fake
        .calls_by_name()
        .into_iter()
        .skip(calls_before)
        .filter(|call| {
            ["create", "start", "stop", "remove"]
                .iter()
                .any(|verb| call.starts_with(&format!("{verb} shop-web")))
        })
        .collect();
    assert_eq!(
        web_changes,
        Vec::<String>::new(),
        "nothing changed web's replicas"
    );
    let release = harness.store.latest_release(&web)?.ok_or("a release")?;
    assert_eq!(
        (release.commit, release.phase),
        (first, ReleasePhase::Succeeded),
        "no release opens for a resource that cannot be applied"
    );

    // Removing the block lets the pending change roll out.
    harness.push(&[
        ("web.hcl", &deployment("web", "2", "")),
        ("api.hcl", &deployment("api", "2", "")),
    ])?;
    let rolled = harness.converged(&web, 2).await?;
    assert!(
        rolled
            .iter()
            .all(|container| env_of(&harness, &container.id).contains(&"V=2".to_owned()))
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn i12_a_typo_in_a_statefulset_fails_at_apply_naming_the_block_it_resembles() -> TestResult {
    let pg = ResourceKey::new(Kind::Statefulset, "data", "pg");
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[(
        "pg.hcl",
        r#"statefulset "data" "pg" {
  image   = "busybox"
  command = ["sleep", "3600"]
  probs {
    readiness {
      exec { command = ["true"] }
    }
  }
}
"#,
    )])?;
    let status = harness
        .status_where(&pg, |status| status.phase == "Failed")
        .await?;
    assert_eq!(status.reason, Some(FailureReason::PluginNotInstalled));
    assert_eq!(
        status.message,
        "statefulset/data/pg: block \"probs\" belongs to a plugin named \"probs\", which is not installed — run `vd plugins:install <source>` or remove the block (at pg.hcl:4:3; did you mean `probes`?)"
    );
    assert_eq!(harness.containers(&pg).await?.len(), 0, "no pod is created");
    harness.stop().await
}
