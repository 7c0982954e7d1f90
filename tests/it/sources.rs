//! Several repositories on one agent (issue 26), in process on the fake runtime: each source
//! deploys its own scopes; a commit declaring another source's scope is rejected whole at the
//! resource, naming the owner, and changes nothing; a revert rolls back only its source's
//! resources; a webhook syncs only the source of the repository it names (and verifies with
//! that source's secret); an unreachable source shows its fetch error while the others
//! deploy; a data dir made with `--repo` is adopted by the source of the same repository
//! without touching a container. The same on a real engine: `sources_docker.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use voodu_agent::http::WebhookSecret;
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::runtime::{Containers, FakeRuntime, labels};
use voodu_agent::store::Store;

use crate::support::agent::{fake_agent_config, wait_data_dir_unlocked};
use crate::support::http::{client, get, post};
use crate::support::{TempRepo, TestResult, until};

const LIMIT: Duration = Duration::from_secs(30);

fn deployment(scope: &str, name: &str, image: &str) -> String {
    format!("deployment {scope:?} {name:?} {{\n  image = {image:?}\n  replicas = 1\n}}\n")
}

/// An in-process agent following the sources of `sources_hcl` (or `--repo` of `single`).
struct Agent {
    address: SocketAddr,
    store: Store,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Agent {
    async fn start(
        data_dir: &std::path::Path,
        fake: Arc<FakeRuntime>,
        single: &TempRepo,
        sources_hcl: Option<&str>,
    ) -> TestResult<Agent> {
        wait_data_dir_unlocked(data_dir)?;
        let sources = match sources_hcl {
            Some(text) => {
                voodu_agent::agent::sources::parse("sources.hcl", text, Duration::from_secs(3600))?
            }
            None => Vec::new(),
        };
        let config = voodu_agent::agent::AgentConfig {
            // Only the start-up poll: the test asks for every other sync.
            interval: Duration::from_secs(3600),
            sources,
            ..fake_agent_config(single, data_dir)
        };
        let state_db = config.state_db();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(voodu_agent::agent::run_with_runtime(
            config,
            fake,
            Some(listener),
            shutdown.clone().cancelled_owned(),
        ));
        let store = until(LIMIT, Duration::from_millis(10), "state.db", || {
            Ok(state_db
                .exists()
                .then(|| Store::open(&state_db).ok())
                .flatten())
        })
        .await?;
        Ok(Agent {
            address,
            store,
            shutdown,
            task,
        })
    }

    /// Waits until source `name` applied `sha`.
    async fn applied(&self, name: &str, sha: &str) -> TestResult {
        let source = self.store.for_source(name);
        until(
            LIMIT,
            Duration::from_millis(10),
            &format!("{name} applies {sha}"),
            || {
                Ok(source
                    .commit_summary()?
                    .last_applied
                    .filter(|record| record.sha.as_str() == sha)
                    .map(|_| ()))
            },
        )
        .await
    }

    async fn stop(self) -> TestResult {
        self.shutdown.cancel();
        self.task.await??;
        Ok(())
    }
}

/// The running containers of `scope/name`, by id.
async fn containers(fake: &FakeRuntime, scope: &str, name: &str) -> TestResult<Vec<String>> {
    let mut ids: Vec<String> = fake
        .list(&[(labels::SCOPE, scope), (labels::NAME, name)])
        .await?
        .into_iter()
        .map(|container| container.id)
        .collect();
    ids.sort();
    Ok(ids)
}

/// Waits (liveness bound) until `scope/name` has a container of `image`.
async fn running(fake: &FakeRuntime, scope: &str, name: &str, image: &str) -> TestResult {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let listed = fake
            .list(&[(labels::SCOPE, scope), (labels::NAME, name)])
            .await?;
        // Created from the bytes its release pinned (a local-only image: its id).
        if listed
            .iter()
            .any(|container| container.image == fake.pinned(image))
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            let all = fake.list(&[]).await?;
            return Err(format!("{scope}/{name} never ran {image}: {all:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn each_source_deploys_its_scopes_and_may_not_touch_another_sources() -> TestResult {
    let (platform, shop, blog) = (TempRepo::new()?, TempRepo::new()?, TempRepo::new()?);
    platform.write("edge.hcl", &deployment("ingress", "proxy", "proxy:1"))?;
    let platform_1 = platform.commit("platform")?;
    shop.write("shop.hcl", &deployment("shop", "web", "shop:1"))?;
    let shop_1 = shop.commit("shop")?;
    blog.write("blog.hcl", &deployment("blog", "web", "blog:1"))?;
    let blog_1 = blog.commit("blog")?;
    let data = tempfile::tempdir()?;
    let blog_secret = data.path().join("blog-hook");
    std::fs::write(&blog_secret, "blog-secret\n")?;
    let sources = format!(
        r#"
source "platform" {{
  url    = "{}"
  scopes = ["ingress", ""]
}}
source "shop" {{
  url    = "{}"
  scopes = ["shop"]
}}
source "blog" {{
  url    = "{}"
  scopes = ["blog"]
  webhook_secret_file = "{}"
}}
source "gone" {{
  url    = "file:///nonexistent/voodu/repo.git"
  scopes = ["gone"]
}}
"#,
        platform.url(),
        shop.url(),
        blog.url(),
        blog_secret.display()
    );
    let fake = Arc::new(FakeRuntime::new());
    let data_dir = data.path().join("data");
    let agent = Agent::start(&data_dir, fake.clone(), &platform, Some(&sources)).await?;
    agent.applied("platform", &platform_1).await?;
    agent.applied("shop", &shop_1).await?;
    agent.applied("blog", &blog_1).await?;
    running(&fake, "ingress", "proxy", "proxy:1").await?;
    running(&fake, "shop", "web", "shop:1").await?;
    running(&fake, "blog", "web", "blog:1").await?;
    // Each outbox event carries its source in its data: a commit's, and a resource's (the
    // source that applied it).
    let events = agent.store.events_after(0, 1000)?;
    for (name, sha) in [
        ("platform", &platform_1),
        ("shop", &shop_1),
        ("blog", &blog_1),
    ] {
        let applied = events
            .iter()
            .find(|event| event.event == "commit.applied" && event.commit == sha.as_str())
            .ok_or(format!("no commit.applied of {name}: {events:#?}"))?;
        assert_eq!(applied.data["source"], name, "{applied:#?}");
    }
    let rollout = events
        .iter()
        .find(|event| event.resource == "deployment/shop/web")
        .ok_or(format!("no event of deployment/shop/web: {events:#?}"))?;
    assert_eq!(rollout.data["source"], "shop", "{rollout:#?}");
    let owners = agent.store.sources_of_desired()?;
    let key = |scope: &str| {
        ResourceKey::new(
            Kind::Deployment,
            scope,
            if scope == "ingress" { "proxy" } else { "web" },
        )
    };
    assert_eq!(owners.get(&key("shop")).map(String::as_str), Some("shop"));
    assert_eq!(owners.get(&key("blog")).map(String::as_str), Some("blog"));
    assert_eq!(
        owners.get(&key("ingress")).map(String::as_str),
        Some("platform")
    );

    // A resource is in the status document once its handler wrote its status, which may
    // come after its container runs.
    for scope in ["shop", "blog"] {
        crate::support::harness::status_where(&agent.store, &key(scope), "a status", |_| true)
            .await?;
    }

    // The unreachable source shows its fetch error; the others deployed all the same.
    let http = client()?;
    let (code, body) = get(&http, &format!("http://{}/status", agent.address)).await?;
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&body)?;
    let source = |name: &str| {
        status["sources"]
            .as_array()
            .and_then(|sources| sources.iter().find(|source| source["name"] == name))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(source("gone")["fetch"]["state"], "failing", "{status:#}");
    assert!(
        source("gone")["fetch"]["error"]
            .as_str()
            .is_some_and(|error| error.contains("nonexistent")),
        "{status:#}"
    );
    assert_eq!(source("shop")["fetch"]["state"], "ok", "{status:#}");
    assert_eq!(source("shop")["last_applied"]["sha"], shop_1.as_str());
    let web = status["resources"]
        .as_array()
        .and_then(|resources| {
            resources
                .iter()
                .find(|resource| resource["scope"] == "blog")
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(web["source"], "blog", "{status:#}");

    // The dashboard: a line per source, a source column, and a filter by source.
    let (code, page) = get(&http, &format!("http://{}/ui?source=shop", agent.address)).await?;
    assert_eq!(code, 200);
    assert!(
        page.contains("<h2>Sources</h2>") && page.contains("<th>Source</th>"),
        "{page}"
    );
    assert!(
        page.contains("failing: ") && page.contains("nonexistent"),
        "the unreachable source's fetch: {page}"
    );
    assert!(
        page.contains("<tr data-key=\"deployment/blog/web\" hidden>"),
        "{page}"
    );
    assert!(
        page.contains("<tr data-key=\"deployment/shop/web\">"),
        "{page}"
    );

    // Blog declares a resource in shop's scope: rejected whole, at the block, naming the
    // owner; blog's own change in the same commit is not applied either.
    let shop_ids = containers(&fake, "shop", "web").await?;
    blog.write(
        "blog.hcl",
        &format!(
            "{}{}",
            deployment("blog", "web", "blog:2"),
            deployment("shop", "evil", "evil:1")
        ),
    )?;
    let blog_bad = blog.commit("blog reaches into shop")?;
    let hook = format!("http://{}/hooks/git?wait=true", agent.address);
    let secret = WebhookSecret::new("blog-secret");
    let body = serde_json::json!({
        "ref": "refs/heads/main",
        "after": blog_bad,
        "repository": { "clone_url": blog.url() },
    })
    .to_string()
    .into_bytes();
    let signed = |body: &[u8], secret: &WebhookSecret| {
        vec![
            ("x-github-event", "push".to_owned()),
            ("x-hub-signature-256", secret.sign(body)),
            ("content-type", "application/json".to_owned()),
        ]
    };
    let (code, answer) = post(&http, &hook, &signed(&body, &secret), body.clone()).await?;
    assert_eq!(
        (code, &answer["result"]),
        (422, &serde_json::json!("rejected")),
        "{answer:#}"
    );
    assert_eq!(answer["source"], "blog");
    let errors = answer["errors"].to_string();
    assert!(
        errors.contains("blog.hcl:5:1:")
            && errors.contains("deployment/shop/evil")
            && errors.contains("belongs to source `shop`"),
        "{errors}"
    );
    assert_eq!(
        agent
            .store
            .for_source("blog")
            .commit_summary()?
            .last_applied
            .map(|record| record.sha.to_string()),
        Some(blog_1.clone())
    );
    assert!(
        !agent
            .store
            .sources_of_desired()?
            .contains_key(&ResourceKey::new(Kind::Deployment, "shop", "evil"))
    );
    assert_eq!(
        containers(&fake, "shop", "web").await?,
        shop_ids,
        "shop's containers untouched"
    );
    running(&fake, "blog", "web", "blog:1").await?;

    // The same push signed with another source's secret (the agent's has none): refused.
    let (code, answer) = post(
        &http,
        &hook,
        &signed(&body, &WebhookSecret::new("shop-secret")),
        body,
    )
    .await?;
    assert_eq!(code, 401, "{answer:#}");

    // A webhook naming the shop repository syncs shop only: blog's new good commit waits.
    blog.write("blog.hcl", &deployment("blog", "web", "blog:3"))?;
    let blog_3 = blog.commit("blog 3")?;
    shop.write("shop.hcl", &deployment("shop", "web", "shop:2"))?;
    let shop_2 = shop.commit("shop 2")?;
    let body = serde_json::json!({
        "ref": "refs/heads/main",
        "after": shop_2,
        "repository": { "full_name": "x/y", "clone_url": shop.url() },
    })
    .to_string()
    .into_bytes();
    let (code, answer) = post(&http, &hook, &[("x-github-event", "push".to_owned())], body).await?;
    assert_eq!(
        (code, &answer["result"]),
        (200, &serde_json::json!("applied")),
        "{answer:#}"
    );
    assert_eq!(answer["source"], "shop");
    running(&fake, "shop", "web", "shop:2").await?;
    assert_eq!(
        agent
            .store
            .for_source("blog")
            .commit_summary()?
            .last_seen
            .map(|record| record.sha.to_string()),
        Some(blog_bad.clone()),
        "the shop push did not sync blog"
    );
    // A push naming a repository no source follows is ignored.
    let body = serde_json::json!({
        "ref": "refs/heads/main",
        "repository": { "clone_url": "https://git.example.com/someone/else.git" },
    })
    .to_string()
    .into_bytes();
    let (code, answer) = post(&http, &hook, &[("x-github-event", "push".to_owned())], body).await?;
    assert_eq!(
        (code, &answer["result"]),
        (202, &serde_json::json!("ignored")),
        "{answer:#}"
    );

    // `git revert` in shop rolls shop back; blog and the platform are not touched.
    let blog_ids = containers(&fake, "blog", "web").await?;
    let proxy_ids = containers(&fake, "ingress", "proxy").await?;
    let shop_3 = shop.revert(&shop_2)?;
    let body = serde_json::json!({ "ref": "refs/heads/main", "after": shop_3 })
        .to_string()
        .into_bytes();
    let (code, answer) = post(&http, &format!("{hook}&source=shop"), &[], body).await?;
    assert_eq!(
        (code, &answer["result"]),
        (200, &serde_json::json!("applied")),
        "{answer:#}"
    );
    running(&fake, "shop", "web", "shop:1").await?;
    assert_eq!(containers(&fake, "blog", "web").await?, blog_ids);
    assert_eq!(containers(&fake, "ingress", "proxy").await?, proxy_ids);
    assert_ne!(blog_3, blog_1);
    agent.stop().await
}

/// Acceptance 2: an agent started with `--sources` on a data dir made with `--repo` adopts
/// its history as the source of the same repository: same containers, no new release.
#[tokio::test]
async fn a_data_dir_made_with_repo_is_adopted_by_the_source_of_that_repository() -> TestResult {
    let (shop, blog) = (TempRepo::new()?, TempRepo::new()?);
    shop.write("shop.hcl", &deployment("shop", "web", "shop:1"))?;
    let shop_1 = shop.commit("shop")?;
    blog.write("blog.hcl", &deployment("blog", "web", "blog:1"))?;
    let blog_1 = blog.commit("blog")?;
    let data = tempfile::tempdir()?;
    let data_dir = data.path().join("data");
    let fake = Arc::new(FakeRuntime::new());
    let single = Agent::start(&data_dir, fake.clone(), &shop, None).await?;
    single.applied("", &shop_1).await?;
    running(&fake, "shop", "web", "shop:1").await?;
    let before = containers(&fake, "shop", "web").await?;
    let key = ResourceKey::new(Kind::Deployment, "shop", "web");
    let releases_before = single.store.releases(&key, 100)?.len();
    single.stop().await?;

    let sources = format!(
        "source \"blog\" {{\n  url = \"{}\"\n  scopes = [\"blog\"]\n}}\nsource \"shop\" {{\n  url = \"{}\"\n  scopes = [\"shop\"]\n}}\n",
        blog.url(),
        shop.url()
    );
    let agent = Agent::start(&data_dir, fake.clone(), &shop, Some(&sources)).await?;
    agent.applied("blog", &blog_1).await?;
    agent.applied("shop", &shop_1).await?;
    running(&fake, "blog", "web", "blog:1").await?;
    assert_eq!(
        containers(&fake, "shop", "web").await?,
        before,
        "the same containers"
    );
    assert_eq!(
        agent.store.releases(&key, 100)?.len(),
        releases_before,
        "no new release"
    );
    assert_eq!(
        agent
            .store
            .sources_of_desired()?
            .get(&key)
            .map(String::as_str),
        Some("shop")
    );
    assert!(
        agent.store.commit_summary()?.last_seen.is_none(),
        "nothing is left of the single source"
    );
    assert!(
        data_dir.join("sources/shop/repo.git").exists(),
        "the mirror moved with it"
    );
    agent.stop().await
}

/// `validate` and `plan` as one source of several: a resource in a scope the source does not
/// own is an error at its block, naming the owner, as the agent would reject it.
#[test]
fn validate_and_plan_check_a_sources_scopes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let repo = dir.path().join("blog");
    std::fs::create_dir_all(&repo)?;
    std::fs::write(
        repo.join("blog.hcl"),
        format!(
            "{}{}",
            deployment("blog", "web", "blog:1"),
            deployment("shop", "evil", "evil:1")
        ),
    )?;
    let sources = dir.path().join("sources.hcl");
    std::fs::write(
        &sources,
        "source \"shop\" {\n  url = \"/srv/shop\"\n  scopes = [\"shop\"]\n}\nsource \"blog\" {\n  url = \"/srv/blog\"\n  scopes = [\"blog\"]\n}\n",
    )?;
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
    let sources_arg = sources.display().to_string();
    let repo_arg = repo.display().to_string();
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
        out.contains("blog.hcl:5:1: deployment/shop/evil may not be deployed by source `blog`")
            && out.contains("belongs to source `shop`"),
        "{out}"
    );
    let (code, out) = run(&["validate", &repo_arg, "--sources", &sources_arg])?;
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("name the one these manifests are with --source NAME"),
        "{out}"
    );
    let (code, out) = run(&[
        "plan",
        "--repo",
        &repo_arg,
        "--sources",
        &sources_arg,
        "--source",
        "blog",
    ])?;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("blog.hcl:5:1:") && out.contains("may not deploy these scopes"),
        "{out}"
    );
    std::fs::write(repo.join("blog.hcl"), deployment("blog", "web", "blog:1"))?;
    let (code, out) = run(&[
        "validate",
        &repo_arg,
        "--sources",
        &sources_arg,
        "--source",
        "blog",
    ])?;
    assert_eq!(code, Some(0), "{out}");
    Ok(())
}
