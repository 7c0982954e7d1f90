//! Deploy trigger files (`.voodu/**/*.yml`) and the activity log, on real repos (gix over
//! `file://`) and a real store: which commits fire which trigger, holds and approvals, a
//! broken trigger file rejecting the whole commit, pruning, force-pushes; then the agent in
//! process through a scripted day, read back with `voodu-agent activity --json`.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::Value;
use voodu_agent::git::{Source, SourceOptions};
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::store::{Origin, Store, Who};
use voodu_agent::sync::{SyncOptions, SyncOutcome, Syncer};

use crate::support::http::{client, post};
use crate::support::{TempRepo, TestAgent, TestAgentOptions, TestResult};

const AGENT: &str = env!("CARGO_BIN_EXE_voodu-agent");

/// A trigger file: branches, paths (may be empty), the file it applies, manual or not.
fn trigger(paths: &[&str], file: &str, manual: bool) -> String {
    let paths = if paths.is_empty() {
        String::new()
    } else {
        format!(
            "    paths: [{}]\n",
            paths
                .iter()
                .map(|path| format!("\"{path}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    format!(
        "on:\n  push:\n    branches: [main]\n{paths}apply:\n  file: {file}\n{}",
        if manual { "deploy: manual\n" } else { "" }
    )
}

fn deployment(name: &str, version: &str) -> String {
    format!(
        "deployment \"shop\" \"{name}\" {{\n  image = \"busybox\"\n  command = [\"sleep\", \"3600\"]\n  env = {{ V = \"{version}\" }}\n}}\n"
    )
}

/// A syncer over `repo` on a fresh data dir.
struct Agent {
    _data: tempfile::TempDir,
    store: Arc<Store>,
    syncer: Syncer,
}

impl Agent {
    fn new(repo: &TempRepo, paths: &[&str]) -> TestResult<Agent> {
        let data = tempfile::tempdir()?;
        let store = Arc::new(Store::open(&data.path().join("state.db"))?);
        let source = Source::new(
            SourceOptions {
                url: repo.url(),
                branch: "main".to_owned(),
                paths: paths.iter().map(|path| (*path).to_owned()).collect(),
                token_file: None,
                ..Default::default()
            },
            data.path(),
        );
        let syncer = Syncer::new(
            source,
            Arc::clone(&store),
            SyncOptions::new(data.path().to_owned()),
        )?;
        Ok(Agent {
            _data: data,
            store,
            syncer,
        })
    }

    fn sync(&self) -> TestResult<SyncOutcome> {
        Ok(self.syncer.sync_once_as(
            &AtomicBool::new(false),
            &Who::new(Origin::Webhook, Some("octocat")),
        )?)
    }

    /// Syncs; `sha` must be applied; returns each trigger's verdict as `name: verdict`.
    fn applied(&self, sha: &str) -> TestResult<Vec<String>> {
        match self.sync()? {
            SyncOutcome::Applied {
                commit, triggers, ..
            } if commit.as_str() == sha => Ok(triggers
                .iter()
                .map(|outcome| format!("{}: {}", outcome.name, verdict(&outcome.verdict)))
                .collect()),
            other => Err(format!("expected {sha} applied, got {other:?}").into()),
        }
    }

    fn rejected(&self, sha: &str) -> TestResult<Vec<String>> {
        match self.sync()? {
            SyncOutcome::Rejected {
                commit,
                diagnostics,
            } if commit.as_str() == sha => {
                Ok(diagnostics.0.iter().map(ToString::to_string).collect())
            }
            other => Err(format!("expected {sha} rejected, got {other:?}").into()),
        }
    }

    /// Desired resources as `name@commit-prefix V=version`.
    fn desired(&self) -> TestResult<Vec<String>> {
        Ok(self
            .store
            .desired_all()?
            .into_iter()
            .map(|desired| {
                let version = desired
                    .spec
                    .container()
                    .and_then(|container| container.env.get("V").cloned())
                    .unwrap_or_default();
                format!(
                    "{}@{} V={version}",
                    desired.key.name,
                    &desired.commit.as_str()[..7]
                )
            })
            .collect())
    }
}

fn verdict(verdict: &voodu_agent::manifest::triggers::Verdict) -> String {
    use voodu_agent::manifest::triggers::Verdict;
    match verdict {
        Verdict::Fired { .. } => "fired".into(),
        Verdict::Held { .. } => "held".into(),
        Verdict::Approved { commit, .. } => format!("approved {}", &commit.as_str()[..7]),
        Verdict::Skipped => "skipped".into(),
        Verdict::Inactive(why) => format!("inactive: {why}"),
    }
}

fn short(sha: &str) -> &str {
    &sha[..7]
}

/// Two apps, each with a trigger on its own paths; the manifests live outside those paths
/// (`deploy/`), so a commit can change a manifest without touching its trigger's paths.
fn two_apps(repo: &TempRepo) -> TestResult {
    repo.write(
        ".voodu/api.yml",
        &trigger(&["apps/api/**"], "deploy/api.hcl", false),
    )?;
    repo.write(
        ".voodu/web.yml",
        &trigger(&["apps/web/**"], "deploy/web.hcl", false),
    )?;
    repo.write("deploy/api.hcl", &deployment("api", "1"))?;
    repo.write("deploy/web.hcl", &deployment("web", "1"))?;
    repo.write("apps/api/main.go", "package main // 1\n")?;
    repo.write("apps/web/index.html", "<p>1</p>\n")?;
    Ok(())
}

#[test]
fn a_commit_fires_only_the_triggers_whose_paths_it_touches() -> TestResult {
    let repo = TempRepo::new()?;
    two_apps(&repo)?;
    repo.write("README.md", "not deployed\n")?;
    let first = repo.commit("two apps")?;
    let agent = Agent::new(&repo, &[])?;
    assert_eq!(agent.applied(&first)?, ["api: fired", "web: fired"]);
    let c1 = short(&first).to_owned();
    assert_eq!(
        agent.desired()?,
        [format!("api@{c1} V=1"), format!("web@{c1} V=1")]
    );

    // Both manifests change, but only apps/web/ is touched: web fires, api keeps V=1.
    repo.write("deploy/api.hcl", &deployment("api", "2"))?;
    repo.write("deploy/web.hcl", &deployment("web", "2"))?;
    repo.write("apps/web/index.html", "<p>2</p>\n")?;
    let second = repo.commit("web change (and a pending api manifest edit)")?;
    assert_eq!(agent.applied(&second)?, ["api: skipped", "web: fired"]);
    let c2 = short(&second).to_owned();
    assert_eq!(
        agent.desired()?,
        [format!("api@{c1} V=1"), format!("web@{c2} V=2")]
    );

    // Touching apps/api/ fires api: its manifest is read at this commit (V=2), keyed to it.
    repo.write("apps/api/main.go", "package main // 2\n")?;
    let third = repo.commit("api change")?;
    assert_eq!(agent.applied(&third)?, ["api: fired", "web: skipped"]);
    let c3 = short(&third).to_owned();
    assert_eq!(
        agent.desired()?,
        [format!("api@{c3} V=2"), format!("web@{c2} V=2")]
    );

    // A commit touching neither changes nothing, and prunes nothing.
    repo.write("README.md", "still not deployed\n")?;
    let fourth = repo.commit("docs")?;
    assert_eq!(agent.applied(&fourth)?, ["api: skipped", "web: skipped"]);
    assert_eq!(
        agent.desired()?,
        [format!("api@{c3} V=2"), format!("web@{c2} V=2")]
    );

    // A force-push to unrelated history: every trigger fires.
    repo.git(&["checkout", "-q", "--orphan", "fresh"])?;
    repo.write("deploy/web.hcl", &deployment("web", "3"))?;
    let forced = repo.commit("rewritten history")?;
    assert_eq!(agent.applied(&forced)?, ["api: fired", "web: fired"]);
    let c5 = short(&forced).to_owned();
    // api fired with an unchanged spec: its resource keeps the commit that last changed it.
    assert_eq!(
        agent.desired()?,
        [format!("api@{c3} V=2"), format!("web@{c5} V=3")]
    );
    Ok(())
}

#[test]
fn a_manual_trigger_holds_its_commit_until_approved() -> TestResult {
    let repo = TempRepo::new()?;
    two_apps(&repo)?;
    repo.write(
        ".voodu/web.yml",
        &trigger(&["apps/web/**"], "deploy/web.hcl", true),
    )?;
    let first = repo.commit("web is manual")?;
    let agent = Agent::new(&repo, &[])?;
    assert_eq!(agent.applied(&first)?, ["api: fired", "web: held"]);
    let c1 = short(&first).to_owned();
    assert_eq!(agent.desired()?, [format!("api@{c1} V=1")]);

    // Approving a commit nobody holds is a clear error.
    let error = agent
        .store
        .approve("deadbeef")
        .err()
        .map(|error| error.to_string());
    assert_eq!(
        error.as_deref(),
        Some(&*format!(
            "no trigger holds a commit \"deadbeef\" (held: {} (web)); see `voodu-agent status`",
            &first[..12]
        ))
    );

    // A newer web push replaces the hold.
    repo.write("deploy/web.hcl", &deployment("web", "2"))?;
    repo.write("apps/web/index.html", "<p>2</p>\n")?;
    let second = repo.commit("web v2")?;
    assert_eq!(agent.applied(&second)?, ["api: skipped", "web: held"]);
    let states = agent.store.trigger_states()?;
    assert_eq!(
        states[1].held.as_ref().map(|held| held.commit.as_str()),
        Some(second.as_str())
    );
    assert!(
        agent.store.approve(&first).is_err(),
        "the replaced hold is gone"
    );

    // An api commit meanwhile; then the approval applies web exactly at its held commit.
    repo.write("apps/api/main.go", "package main // 2\n")?;
    let third = repo.commit("api")?;
    // web keeps its hold (its paths were not touched).
    assert_eq!(agent.applied(&third)?, ["api: fired", "web: skipped"]);
    assert_eq!(
        agent.store.trigger_states()?[1]
            .held
            .as_ref()
            .map(|held| held.commit.as_str()),
        Some(second.as_str())
    );
    let approved = agent.store.approve(&second[..10])?;
    assert_eq!(approved.len(), 1);
    assert!(agent.store.approvals_pending()?);
    let c2 = short(&second).to_owned();
    assert_eq!(
        agent.applied(&third)?,
        ["api: skipped", format!("web: approved {c2}").as_str()]
    );
    assert_eq!(
        agent.desired()?,
        [format!("api@{c1} V=1"), format!("web@{c2} V=2")]
    );
    assert!(!agent.store.approvals_pending()?);
    assert!(matches!(agent.sync()?, SyncOutcome::Unchanged(_)));
    Ok(())
}

#[test]
fn a_broken_trigger_file_rejects_the_whole_commit_with_its_position() -> TestResult {
    let repo = TempRepo::new()?;
    two_apps(&repo)?;
    let first = repo.commit("good")?;
    let agent = Agent::new(&repo, &[])?;
    agent.applied(&first)?;
    let before = agent.desired()?;

    repo.write(
        ".voodu/web.yml",
        "on:\n  push:\n    branch: [main]\napply:\n  file: deploy/web.hcl\n",
    )?;
    repo.write("deploy/api.hcl", &deployment("api", "9"))?;
    repo.write("apps/api/main.go", "package main // 9\n")?;
    let broken = repo.commit("typo in web.yml")?;
    assert_eq!(
        agent.rejected(&broken)?,
        [
            ".voodu/web.yml:3:5: unknown key \"branch\" in on.push (known: branches, tags, paths) (did you mean `branches`?)",
            ".voodu/web.yml:2:3: on.push needs branches or tags: a trigger that matches nothing never fires",
        ]
    );
    assert_eq!(
        agent.desired()?,
        before,
        "nothing of the commit was applied"
    );

    // A trigger naming a file the commit does not have: located at its apply.file.
    repo.write(
        ".voodu/web.yml",
        &trigger(&["apps/web/**"], "deploy/nope.hcl", false),
    )?;
    let missing = repo.commit("web names a missing file")?;
    assert_eq!(
        agent.rejected(&missing)?,
        [format!(
            ".voodu/web.yml:6:9: apply.file deploy/nope.hcl does not exist at commit {}",
            &missing[..12]
        )]
    );
    assert_eq!(agent.desired()?, before);
    let status = voodu_agent::http::status::build(&agent.store)?;
    assert_eq!(
        status.last_rejected.map(|commit| commit.errors),
        Some(vec![format!(
            ".voodu/web.yml:6:9: apply.file deploy/nope.hcl does not exist at commit {}",
            &missing[..12]
        )])
    );

    // Fixed: the api change the rejected commits carried fires now (diffed from the last
    // applied commit), and web's file changed trigger fires as new.
    repo.write(
        ".voodu/web.yml",
        &trigger(&["apps/web/**"], "deploy/web.hcl", false),
    )?;
    let fixed = repo.commit("fixed")?;
    assert_eq!(agent.applied(&fixed)?, ["api: fired", "web: skipped"]);
    Ok(())
}

#[test]
fn deleting_a_trigger_file_prunes_its_resources_and_other_branches_never_fire() -> TestResult {
    let repo = TempRepo::new()?;
    two_apps(&repo)?;
    repo.write(
        ".voodu/prod.yml",
        "on:\n  push:\n    tags: ['v*']\napply:\n  file: deploy/api.hcl\n",
    )?;
    let first = repo.commit("api, web and a tag trigger")?;
    let agent = Agent::new(&repo, &[])?;
    assert_eq!(
        agent.applied(&first)?,
        [
            "api: fired",
            "prod: inactive: on.push has only tags (v*); the agent tracks branch main and never sees a tag push",
            "web: fired"
        ]
    );
    let status = voodu_agent::http::status::build(&agent.store)?;
    let prod = status
        .triggers
        .iter()
        .find(|view| view.name == "prod")
        .ok_or("prod")?;
    assert_eq!(prod.state, "inactive");

    repo.remove(".voodu/web.yml")?;
    let second = repo.commit("web is no longer deployed by this repo")?;
    agent.applied(&second)?;
    let names: Vec<String> = agent
        .store
        .desired_all()?
        .into_iter()
        .map(|desired| desired.key.name)
        .collect();
    assert_eq!(names, ["api"]);

    // Without any trigger file, the repo is read as before (--path mode: everything).
    repo.remove(".voodu/api.yml")?;
    repo.remove(".voodu/prod.yml")?;
    let third = repo.commit("no triggers")?;
    agent.applied(&third)?;
    assert_eq!(agent.store.desired_all()?.len(), 2);
    assert!(agent.store.trigger_states()?.is_empty());
    Ok(())
}

#[test]
fn file_reads_of_a_trigger_that_did_not_fire_stay_at_its_commit() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write(
        ".voodu/api.yml",
        &trigger(&["apps/api/**"], "apps/api/voodu.hcl", false),
    )?;
    repo.write(
        ".voodu/web.yml",
        &trigger(&["apps/web/**"], "apps/web/voodu.hcl", false),
    )?;
    repo.write(
        "apps/api/voodu.hcl",
        "asset \"shop\" \"api-cfg\" {\n  version = file(\"../../shared/version.txt\")\n}\n",
    )?;
    repo.write("apps/web/voodu.hcl", &deployment("web", "1"))?;
    repo.write("shared/version.txt", "1")?;
    let first = repo.commit("api reads shared/version.txt")?;
    let agent = Agent::new(&repo, &[])?;
    agent.applied(&first)?;
    let asset = ResourceKey::new(Kind::Asset, "shop", "api-cfg");
    let before = agent.store.desired(&asset)?.ok_or("the asset")?;
    repo.write("shared/version.txt", "2")?;
    repo.write("apps/web/index.html", "x")?;
    let second = repo.commit("shared file changes with a web commit")?;
    assert_eq!(agent.applied(&second)?, ["api: skipped", "web: fired"]);
    let after = agent.store.desired(&asset)?.ok_or("the asset")?;
    assert_eq!(
        after.spec_json, before.spec_json,
        "api's file() is read at api's commit"
    );
    assert_eq!(after.commit.as_str(), first);
    // When api fires, the file is read at its new commit.
    repo.write("apps/api/main.go", "x")?;
    let third = repo.commit("api")?;
    agent.applied(&third)?;
    let fired = agent.store.desired(&asset)?.ok_or("the asset")?;
    assert_ne!(fired.spec_json, before.spec_json);
    assert_eq!(fired.commit.as_str(), third);
    Ok(())
}

#[test]
fn activity_records_commits_holds_approvals_and_config_without_values() -> TestResult {
    let repo = TempRepo::new()?;
    two_apps(&repo)?;
    repo.write(
        ".voodu/web.yml",
        &trigger(&["apps/web/**"], "deploy/web.hcl", true),
    )?;
    let first = repo.commit("first")?;
    let agent = Agent::new(&repo, &[])?;
    agent.applied(&first)?;
    let cli = Store::open(agent.store.path())?.acting_as(Who::new(Origin::Cli, Some("ops")));
    cli.config_set(
        "shop",
        "api",
        &std::collections::BTreeMap::from([(
            "DB_PASSWORD".to_owned(),
            "s3cr3t-hunter2".to_owned(),
        )]),
    )?;
    cli.approve(&first)?;
    agent.applied(&first)?;
    let (rows, truncated) = agent.store.activity(0, 100)?;
    assert!(!truncated);
    let lines: Vec<String> = rows
        .iter()
        .map(|row| {
            format!(
                "{} {} {}{} {} {}",
                row.action,
                row.outcome,
                row.origin,
                row.actor
                    .as_deref()
                    .map(|actor| format!(":{actor}"))
                    .unwrap_or_default(),
                row.resource.as_deref().unwrap_or("-"),
                row.commit
                    .as_ref()
                    .map_or("-", |commit| &commit.as_str()[..7]),
            )
        })
        .collect();
    let c1 = short(&first);
    assert_eq!(
        lines,
        [
            format!("commit.apply succeeded webhook:octocat - {c1}"),
            format!("trigger.hold held webhook:octocat trigger/web {c1}"),
            "config.set succeeded cli:ops config/shop/api -".to_owned(),
            format!("approve requested cli:ops trigger/web {c1}"),
            // The agent re-applies the commit for the bucket change and the approval.
            format!("commit.apply succeeded webhook:octocat - {c1}"),
            format!("approve succeeded webhook:ops trigger/web {c1}"),
        ]
    );
    let config = &rows[2];
    assert_eq!(config.data["keys"][0]["key"], "DB_PASSWORD");
    let digest = config.data["keys"][0]["digest"]
        .as_str()
        .ok_or("a digest")?;
    assert_eq!(digest.len(), 12);
    let everything = format!("{rows:?}");
    assert!(!everything.contains("s3cr3t-hunter2"), "{everything}");
    Ok(())
}

fn cli(data_dir: &std::path::Path, args: &[&str]) -> TestResult<String> {
    let output = Command::new(AGENT)
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env("USER", "alice")
        .env_remove("SUDO_USER")
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "voodu-agent {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// Issue 12 acceptance 4: a scripted day — apply, reject, rollback, config set, approve —
/// read back as `voodu-agent activity --json`, with no config value anywhere in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i12_a_scripted_day_in_the_activity_log() -> TestResult {
    const SECRET_VALUE: &str = "pa55-w0rd-never-logged";
    let repo = TempRepo::new()?;
    two_apps(&repo)?;
    repo.write(
        ".voodu/web.yml",
        &trigger(&["apps/web/**"], "deploy/web.hcl", true),
    )?;
    let first = repo.commit("morning: api and a manual web")?;
    let agent = TestAgent::start(repo, TestAgentOptions::default()).await?;
    let data_dir = agent.data_dir();
    let client = client()?;
    let hook = agent.url("/hooks/git?wait=true");
    let push = |sha: &str| {
        format!(r#"{{"ref":"refs/heads/main","after":"{sha}","pusher":{{"name":"octocat"}}}}"#)
            .into_bytes()
    };
    let api = ResourceKey::new(Kind::Deployment, "shop", "api");
    // 1. apply (the start-up poll applies the first commit; web is held).
    agent.applied(&first).await?;
    agent
        .until("api's first rollout", |store| {
            Ok(store
                .latest_release(&api)?
                .filter(|release| release.phase.as_str() == "succeeded"))
        })
        .await?;
    // 2. reject: a typo, pushed through the webhook.
    agent.repo.write(
        "deploy/api.hcl",
        "deployment \"shop\" \"api\" {\n  imge = \"x\"\n}\n",
    )?;
    agent
        .repo
        .write("apps/api/main.go", "package main // 2\n")?;
    let typo = agent.repo.commit("typo")?;
    let (status, answer) = post(
        &client,
        &hook,
        &[("x-github-event", "push".into())],
        push(&typo),
    )
    .await?;
    assert_eq!(
        (status, answer["result"].as_str()),
        (422, Some("rejected")),
        "{answer}"
    );
    // 3. a good api commit, rolled out.
    agent
        .repo
        .write("deploy/api.hcl", &deployment("api", "2"))?;
    let good = agent.repo.commit("api v2")?;
    let (status, answer) = post(
        &client,
        &hook,
        &[("x-github-event", "push".into())],
        push(&good),
    )
    .await?;
    assert_eq!(
        (status, answer["result"].as_str()),
        (200, Some("applied")),
        "{answer}"
    );
    agent
        .until("api's v2 rollout", |store| {
            Ok(store.latest_release(&api)?.filter(|release| {
                release.commit.as_str() == good && release.phase.as_str() == "succeeded"
            }))
        })
        .await?;
    // 4. rollback (operator), 5. config set, 6. approve.
    cli(&data_dir, &["rollback", "shop/api"])?;
    cli(
        &data_dir,
        &[
            "config",
            "set",
            "shop/api",
            &format!("DB_PASSWORD={SECRET_VALUE}"),
        ],
    )?;
    // Off the runtime's workers (the agent serves the CLI's nudge on them), and what the CLI
    // said about its nudge goes into the failure message.
    let approve = {
        let (data_dir, first) = (data_dir.clone(), first.clone());
        tokio::task::spawn_blocking(move || {
            Command::new(AGENT)
                .args(["approve", &first, "--data-dir"])
                .arg(&data_dir)
                .env("USER", "alice")
                .env_remove("SUDO_USER")
                .output()
        })
        .await??
    };
    assert!(approve.status.success(), "{approve:?}");
    let said = format!(
        "approve said: {}{}",
        String::from_utf8_lossy(&approve.stdout),
        String::from_utf8_lossy(&approve.stderr)
    );
    // A liveness bound of two minutes: under a loaded suite the approval waits behind the
    // syncs the rollback and the config change asked for.
    agent
        .until_within(
            std::time::Duration::from_secs(120),
            "web applied by the approval",
            |store| {
                Ok(store
                    .desired(&ResourceKey::new(Kind::Deployment, "shop", "web"))?
                    .filter(|desired| desired.commit.as_str() == first))
            },
        )
        .await
        .map_err(|error| format!("{error}; {said}"))?;
    // The day ends with web's rollout: once it has succeeded nothing more is written, so the
    // CLI's and the HTTP side's reads below see the same log.
    let web = ResourceKey::new(Kind::Deployment, "shop", "web");
    agent
        .until("web's rollout after the approval", |store| {
            Ok(store.latest_release(&web)?.filter(|release| {
                release.commit.as_str() == first && release.phase.as_str() == "succeeded"
            }))
        })
        .await?;

    let json = cli(&data_dir, &["activity", "--json", "--since", "1h"])?;
    println!("{json}");
    assert!(
        !json.contains(SECRET_VALUE),
        "a config value reached the activity log"
    );
    let view: Value = serde_json::from_str(&json)?;
    let entries = view["entries"].as_array().ok_or("entries")?;
    let seen = |action: &str, outcome: &str| {
        entries
            .iter()
            .find(|entry| entry["action"] == action && entry["outcome"] == outcome)
            .cloned()
    };
    let rejected = seen("commit.reject", "failed").ok_or("the rejection")?;
    assert_eq!(rejected["commit"], typo.as_str());
    assert_eq!(
        (&rejected["origin"], &rejected["actor"]),
        (&Value::from("webhook"), &Value::from("octocat"))
    );
    assert_eq!(
        rejected["message"],
        "deploy/api.hcl:2:3: unknown attribute `imge` in deployment (did you mean `image`?)"
    );
    let applied = entries
        .iter()
        .find(|entry| entry["action"] == "commit.apply" && entry["commit"] == good.as_str())
        .ok_or("the good commit")?;
    assert_eq!(applied["data"]["changed"][0], "deployment/shop/api");
    assert_eq!(applied["data"]["triggers"]["fired"][0], "api");
    let rollout = entries
        .iter()
        .find(|entry| {
            entry["action"] == "rollout"
                && entry["outcome"] == "succeeded"
                && entry["commit"] == good.as_str()
        })
        .ok_or("the rollout of v2")?;
    assert_eq!(
        (&rollout["origin"], &rollout["resource"]),
        (&Value::from("agent"), &Value::from("deployment/shop/api"))
    );
    for (action, outcome) in [
        ("rollback", "succeeded"),
        ("pin", "succeeded"),
        ("config.set", "succeeded"),
        ("approve", "requested"),
    ] {
        let entry = seen(action, outcome).ok_or(format!("{action} {outcome}"))?;
        assert_eq!(
            (&entry["origin"], &entry["actor"]),
            (&Value::from("cli"), &Value::from("alice")),
            "{entry}"
        );
    }
    let config = seen("config.set", "succeeded").ok_or("config")?;
    assert_eq!(config["resource"], "config/shop/api");
    assert_eq!(config["data"]["keys"][0]["key"], "DB_PASSWORD");
    assert_eq!(
        config["data"]["keys"][0]["digest"].as_str().map(str::len),
        Some(12)
    );
    let approved = seen("approve", "succeeded").ok_or("the approval applied")?;
    assert_eq!(
        (&approved["commit"], &approved["actor"]),
        (&Value::from(first.as_str()), &Value::from("alice"))
    );
    assert!(seen("trigger.hold", "held").is_some());
    // The same document over HTTP.
    let (status, body) =
        crate::support::http::get(&client, &agent.url("/activity?since=1h&limit=1000")).await?;
    assert_eq!(status, 200);
    let over_http: Value = serde_json::from_str(&body)?;
    assert_eq!(
        over_http["entries"].as_array().map(Vec::len),
        Some(entries.len())
    );
    assert!(!body.contains(SECRET_VALUE));
    agent.stop().await
}

#[test]
fn validate_and_plan_understand_trigger_files() -> TestResult {
    let repo = TempRepo::new()?;
    two_apps(&repo)?;
    repo.write(
        ".voodu/web.yml",
        &trigger(&["apps/web/**"], "deploy/web.hcl", true),
    )?;
    let first = repo.commit("api and a manual web")?;
    let agent = Agent::new(&repo, &[])?;
    agent.applied(&first)?;
    let data_dir = agent._data.path().to_owned();

    // plan of a new revision: web's commit is held, api is skipped and keeps its commit.
    repo.write("deploy/web.hcl", &deployment("web", "2"))?;
    repo.write("apps/web/index.html", "<p>2</p>\n")?;
    let second = repo.commit("web v2")?;
    let output = Command::new(AGENT)
        .args([
            "plan",
            "--repo",
            &repo.url(),
            "--rev",
            "main",
            "--json",
            "--data-dir",
        ])
        .arg(&data_dir)
        .output()?;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let plan: Value = serde_json::from_slice(&output.stdout)?;
    let verdicts: Vec<(String, String)> = plan["triggers"]
        .as_array()
        .ok_or("triggers")?
        .iter()
        .map(|trigger| {
            (
                trigger["name"].as_str().unwrap_or_default().to_owned(),
                trigger["verdict"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            ("api".to_owned(), "skipped".to_owned()),
            ("web".to_owned(), "held".to_owned())
        ]
    );
    assert_eq!(plan["triggers"][1]["held"], second.as_str());
    assert_eq!(
        plan["summary"]["create"], 0,
        "a held web creates nothing: {plan}"
    );
    assert_eq!(
        plan["resources"].as_array().map(Vec::len),
        Some(1),
        "{plan}"
    );
    assert_eq!(plan["resources"][0]["name"], "api");

    // validate: a broken trigger file is reported at its position, exit 1.
    repo.write(
        ".voodu/web.yml",
        "on:\n  push:\n    branches: [main]\napply:\n  file: deploy/gone.hcl\n",
    )?;
    let output = Command::new(AGENT)
        .args(["validate"])
        .arg(repo.work())
        .output()?;
    assert_eq!(output.status.code(), Some(1));
    let text = String::from_utf8(output.stdout)?;
    assert!(
        text.starts_with(".voodu/web.yml:5:9: apply.file deploy/gone.hcl does not exist\n"),
        "{text}"
    );
    repo.write(
        ".voodu/web.yml",
        &trigger(&["apps/web/**"], "deploy/web.hcl", true),
    )?;
    let output = Command::new(AGENT)
        .args(["validate"])
        .arg(repo.work())
        .output()?;
    let text = String::from_utf8(output.stdout)?;
    assert!(output.status.success(), "{text}");
    assert!(text.contains("ok: 2 resources in 2 files"), "{text}");
    Ok(())
}
