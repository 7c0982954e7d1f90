//! Branch previews on the fake runtime (issue 52): the single `--repo` source with
//! `--preview-*`. A push to a matching branch applies its manifests in the preview's scopes as
//! the internal source `#<slug>`, with a copy of the base's buckets less the generated keys;
//! deleting the branch removes its containers, its claim's volume and its buckets, never the
//! base's; a base commit may not deploy a preview's scope. The previews' policy and caps: a
//! preview above a cap, or binding a host path the previews' policy forbids, is rejected at
//! its lines while the base with the same manifest runs; a preview container without a limit
//! gets the cap.

use std::time::Duration;

use voodu_agent::model::policy::{Caps, Policy};
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
                policy: None,
                caps: Default::default(),
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

#[tokio::test]
async fn a_preview_above_its_caps_or_its_policy_is_refused_where_the_base_runs() -> TestResult {
    let shared = tempfile::tempdir()?;
    let shared_path = shared.path().display().to_string();
    let base = format!(
        "deployment \"shop\" \"web\" {{\n  image    = \"busybox\"\n  replicas = 2\n  volumes  = [\"{shared_path}:/data\"]\n  resources {{\n    limits {{\n      memory = \"256Mi\"\n      cpu    = \"2\"\n    }}\n  }}\n}}\n\ndeployment \"shop\" \"worker\" {{\n  image   = \"busybox\"\n  command = [\"sleep\", \"3600\"]\n  autoscale {{\n    min        = 1\n    max        = 4\n    cpu_target = 70\n  }}\n}}\n"
    );
    let fits = "deployment \"shop\" \"worker\" {\n  image   = \"busybox\"\n  command = [\"sleep\", \"3600\"]\n}\n";
    let repo = TempRepo::new()?;
    repo.write("shop.hcl", &base)?;
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
                // The previews' policy allows no bind root: narrower than the agent's.
                policy: Some(Policy::default()),
                caps: Caps {
                    max_replicas: Some(1),
                    memory: Some(128 << 20),
                    cpus: Some(1_000_000_000),
                },
            }),
            policy: Some(Policy {
                allow_bind_root: vec![shared_path.clone()],
                ..Policy::default()
            }),
            ..TestAgentOptions::default()
        },
    )
    .await?;
    // The base runs with the manifest: two replicas, its bind, its limits.
    agent.applied(&main).await?;
    wait_containers(&agent, "shop", 3).await?;

    // The same manifest as a preview: refused at each line that asks too much.
    push_branch(&agent.repo, &main, "preview/big", &base)?;
    let row = agent
        .until("the big preview rejected", |store| {
            Ok(store
                .previews(None)?
                .into_iter()
                .find(|row| row.slug == "big" && row.message.starts_with("rejected")))
        })
        .await?;
    let message = row.message;
    assert!(
        message.contains("shop.hcl:3:3:") && message.contains("max_replicas = 1"),
        "{message}"
    );
    assert!(
        message.contains("shop.hcl:4:3:") && message.contains(&shared_path),
        "{message}"
    );
    assert!(
        message.contains("shop.hcl:5:3:")
            && message.contains("memory limit")
            && message.contains("cpu limit"),
        "{message}"
    );
    // The autoscaler's bound is a replica count too.
    assert!(
        message.contains("shop.hcl:16:3:") && message.contains("autoscale.max"),
        "{message}"
    );
    assert!(
        agent
            .fake
            .list(&[(labels::SCOPE, "shop-pr-big")])
            .await?
            .is_empty()
    );

    // A preview that fits: its container without limits gets the caps at the sink.
    push_branch(&agent.repo, &main, "preview/small", fits)?;
    wait_containers(&agent, "shop-pr-small", 1).await?;
    let container = agent
        .fake
        .list(&[(labels::SCOPE, "shop-pr-small")])
        .await?
        .pop()
        .ok_or("no container")?;
    let spec = agent.fake.spec_of(&container.id).ok_or("no spec")?;
    assert_eq!(
        (spec.memory, spec.nano_cpus),
        (Some(128 << 20), Some(1_000_000_000))
    );
    // The base's worker, the same block, has no limit.
    let base_worker = agent
        .fake
        .list(&[(labels::SCOPE, "shop"), (labels::NAME, "worker")])
        .await?
        .pop()
        .ok_or("no base worker")?;
    let spec = agent.fake.spec_of(&base_worker.id).ok_or("no spec")?;
    assert_eq!((spec.memory, spec.nano_cpus), (None, None));
    agent.stop().await
}

/// Waits (liveness bound) until `scope` has `n` containers.
async fn wait_containers(agent: &TestAgent, scope: &str, n: usize) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let found = agent.fake.list(&[(labels::SCOPE, scope)]).await?.len();
        if found == n {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{scope}: {found} containers, not {n}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_webhook_push_to_a_preview_branch_polls_its_previews_at_once() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("shop.hcl", &files("base"))?;
    let main = repo.commit("base")?;
    let agent = TestAgent::start(
        repo,
        TestAgentOptions {
            // Only the start-up poll: the next is an hour away.
            previews: Some(PreviewRules {
                branches: "preview/*".to_owned(),
                separator: "-pr-".to_owned(),
                host: "{slug}.preview.test".to_owned(),
                ttl: Duration::from_secs(3600),
                max: 3,
                policy: None,
                caps: Caps::default(),
            }),
            ..TestAgentOptions::default()
        },
    )
    .await?;
    agent.applied(&main).await?;
    let sha = push_branch(&agent.repo, &main, "preview/hooked", &files("hooked"))?;
    let client = crate::support::http::client()?;
    let (status, answer) = crate::support::http::post(
        &client,
        &agent.url("/hooks/git"),
        &[("X-GitHub-Event", "push".to_owned())],
        crate::support::http::push_body("preview/hooked", &sha),
    )
    .await?;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["result"], "accepted", "{answer}");
    agent
        .until("the hooked preview applied", |store| {
            Ok(store
                .previews(None)?
                .into_iter()
                .find(|row| row.slug == "hooked" && row.state == "live" && row.commit == sha))
        })
        .await?;
    // A push to a branch nobody follows or previews is still ignored.
    let (status, answer) = crate::support::http::post(
        &client,
        &agent.url("/hooks/git"),
        &[("X-GitHub-Event", "push".to_owned())],
        crate::support::http::push_body("other", &sha),
    )
    .await?;
    assert_eq!(
        (status, &answer["result"]),
        (202, &"ignored".into()),
        "{answer}"
    );
    agent.stop().await
}
