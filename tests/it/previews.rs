//! Branch previews on the fake runtime (issue 52): the single `--repo` source with
//! `--preview-*`. A push to a matching branch applies its manifests in the preview's scopes as
//! the internal source `#<slug>`, with a copy of the base's buckets less the generated keys;
//! deleting the branch removes its containers, its claim's volume and its buckets, never the
//! base's; a base commit may not deploy a preview's scope.

use std::time::Duration;

use voodu_agent::model::previews::PreviewRules;
use voodu_agent::runtime::Containers as _;
use voodu_agent::runtime::labels;

use crate::previews_docker::{delete_branch, push_branch};
use crate::support::agent::{TestAgent, TestAgentOptions};
use crate::support::{TempRepo, TestResult};

fn files(text: &str) -> String {
    format!(
        "deployment \"shop\" \"web\" {{\n  image    = \"busybox\"\n  command  = [\"echo\", \"{text}\"]\n  replicas = 1\n}}\n\nstatefulset \"shop\" \"db\" {{\n  image    = \"busybox\"\n  replicas = 1\n  volume_claim \"data\" {{\n    mount_path = \"/data\"\n  }}\n}}\n\ningress \"shop\" \"web\" {{\n  host = \"shop.test\"\n  port = 8080\n}}\n"
    )
}

#[tokio::test]
async fn a_pushed_branch_is_previewed_in_its_own_scopes_and_removed_with_its_volume() -> TestResult
{
    let repo = TempRepo::new()?;
    repo.write("shop.hcl", &files("base"))?;
    let main = repo.commit("base")?;
    let agent = TestAgent::start(
        repo,
        TestAgentOptions {
            interval: Duration::from_millis(100),
            previews: Some(PreviewRules {
                branches: "preview/*".to_owned(),
                separator: "-pr-".to_owned(),
                host: "{slug}.preview.test".to_owned(),
                ttl: Duration::from_secs(3600),
                max: 3,
            }),
            ..TestAgentOptions::default()
        },
    )
    .await?;
    agent.applied(&main).await?;
    let base_volume = "voodu-shop-db-data-0".to_owned();
    agent
        .until("the base's claim", |_| {
            Ok(agent
                .fake
                .volume_names()
                .contains(&base_volume)
                .then_some(()))
        })
        .await?;

    // The base web's bucket: a preview gets a copy, less the keys the agent generates.
    agent.store.config_set(
        "shop",
        "web",
        &[
            ("A".to_owned(), "1".to_owned()),
            ("POSTGRES_PASSWORD".to_owned(), "the-base-secret".to_owned()),
        ]
        .into(),
    )?;
    push_branch(&agent.repo, &main, "preview/feat-x", &files("feat-x"))?;
    let row = agent
        .until("the preview applied", |store| {
            Ok(store
                .previews(None)?
                .into_iter()
                .find(|row| row.slug == "feat-x" && row.state == "live"))
        })
        .await?;
    assert_eq!(
        (row.source.as_str(), row.branch.as_str(), row.hosts.as_str()),
        ("", "preview/feat-x", "feat-x.preview.test")
    );
    assert!(row.scopes.contains("shop-pr-feat-x"), "{row:?}");
    let buckets = agent.store.buckets()?;
    let copied = buckets.get(&("shop-pr-feat-x".to_owned(), "web".to_owned()));
    assert_eq!(
        copied.map(|values| values.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["A".to_owned()])
    );
    assert!(agent.store.meta("host_policy:#feat-x")?.is_some());
    let preview_volume = "voodu-shop-pr-feat-x-db-data-0".to_owned();
    agent
        .until("the preview's containers and claim", |_| {
            Ok(agent
                .fake
                .volume_names()
                .contains(&preview_volume)
                .then_some(()))
        })
        .await?;
    assert!(
        !agent
            .fake
            .list(&[(labels::SCOPE, "shop-pr-feat-x")])
            .await?
            .is_empty()
    );

    delete_branch(&agent.repo, "preview/feat-x")?;
    agent
        .until("the preview forgotten", |store| {
            Ok(store.previews(None)?.is_empty().then_some(()))
        })
        .await?;
    assert!(
        agent
            .fake
            .list(&[(labels::SCOPE, "shop-pr-feat-x")])
            .await?
            .is_empty()
    );
    assert!(
        agent
            .store
            .buckets()?
            .keys()
            .all(|(scope, _)| scope != "shop-pr-feat-x")
    );
    // Its source's per-source state goes too.
    assert_eq!(agent.store.meta("host_policy:#feat-x")?, None);
    let volumes = agent.fake.volume_names();
    assert!(
        !volumes.contains(&preview_volume) && volumes.contains(&base_volume),
        "{volumes:?}"
    );
    assert!(
        !agent
            .fake
            .list(&[(labels::SCOPE, "shop")])
            .await?
            .is_empty()
    );

    // The base may not deploy a preview's scope.
    agent.repo.write(
        "shop.hcl",
        &format!(
            "{}\ndeployment \"shop-pr-x\" \"web\" {{\n  image = \"busybox\"\n}}\n",
            files("base")
        ),
    )?;
    let bad = agent.repo.commit("a preview scope")?;
    let rejected = agent
        .until("the base's commit rejected", |store| {
            Ok(store
                .commit_summary()?
                .last_rejected
                .filter(|record| record.sha.as_str() == bad))
        })
        .await?;
    let errors: Vec<String> = rejected.errors.iter().map(ToString::to_string).collect();
    assert!(
        errors
            .iter()
            .any(|error| error.starts_with("shop.hcl:20:1:")
                && error.contains("is branch preview `#x`'s")),
        "{errors:?}"
    );
    agent.stop().await
}
