//! Deploy windows and freezes with the agent in process over a real git repo (the fake
//! runtime): a commit pushed while a window is closed is held (`status` says until when, the
//! last applied commit keeps running) and applied when the window opens, with no new push;
//! `approve --now` lets a held commit through; `freeze` holds, `rollback` still works during
//! the freeze, `unfreeze` applies the held commit. The CLI is the real binary against the
//! running agent.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use voodu_agent::git::{Source, SourceOptions};
use voodu_agent::manifest::window::WindowRule;
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::store::{Origin, Store, Who};
use voodu_agent::sync::{Clock, SyncOptions, SyncOutcome, Syncer};

use crate::support::{TempRepo, TestAgent, TestAgentOptions, TestResult};

const AGENT: &str = env!("CARGO_BIN_EXE_voodu-agent");

fn deployment(version: &str) -> String {
    format!(
        "deployment \"shop\" \"api\" {{\n  image = \"busybox\"\n  command = [\"sleep\", \"3600\"]\n  env = {{ V = \"{version}\" }}\n}}\n"
    )
}

/// Runs `voodu-agent ARGS --data-dir DIR` off the runtime's workers (the agent serves the
/// command's nudge on them); its stdout, or its stderr as the error.
async fn cli(data_dir: &std::path::Path, args: &[&str]) -> TestResult<String> {
    let (data_dir, args) = (
        data_dir.to_owned(),
        args.iter().map(ToString::to_string).collect::<Vec<_>>(),
    );
    let output = tokio::task::spawn_blocking(move || {
        Command::new(AGENT)
            .args(&args)
            .arg("--data-dir")
            .arg(&data_dir)
            .env("USER", "alice")
            .env_remove("SUDO_USER")
            .output()
            .map(|output| (args, output))
    })
    .await??;
    let (args, output) = output;
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

/// The commit the desired `shop/api` was last changed by.
fn desired_commit(agent: &TestAgent) -> TestResult<String> {
    let api = ResourceKey::new(Kind::Deployment, "shop", "api");
    Ok(agent
        .store
        .desired(&api)?
        .ok_or("shop/api is desired")?
        .commit
        .to_string())
}

/// The activity log as `action outcome short-sha` lines.
fn activity(agent: &TestAgent) -> TestResult<Vec<String>> {
    let (rows, _) = agent.store.activity(0, 200)?;
    Ok(rows
        .iter()
        .map(|row| {
            format!(
                "{} {} {}",
                row.action,
                row.outcome,
                row.commit
                    .as_ref()
                    .map_or("-", |commit| &commit.as_str()[..7])
            )
        })
        .collect())
}

fn at(text: &str) -> TestResult<i64> {
    Ok(chrono::DateTime::parse_from_rfc3339(text)?.timestamp())
}

/// The sync stage with its clock injected (no waiting): a commit inside a deny window is
/// accepted and held until the window ends, loaded again only once that time is reached, and
/// then applied with no new commit; meanwhile a newer commit replaces the held one and a bad
/// one is rejected at once with its location (dropping the hold).
#[test]
fn the_sync_stage_holds_a_commit_until_its_clock_reaches_the_opening() -> TestResult {
    let clock = Arc::new(AtomicI64::new(at("2026-11-27T12:10:00Z")?));
    let repo = TempRepo::new()?;
    repo.write("deploy/api.hcl", &deployment("1"))?;
    let first = repo.commit("v1")?;
    let data = tempfile::tempdir()?;
    let store = Arc::new(Store::open(&data.path().join("state.db"))?);
    let source = Source::new(
        SourceOptions {
            url: repo.url(),
            branch: "main".to_owned(),
            ..Default::default()
        },
        data.path(),
    );
    let mut options = SyncOptions::new(data.path().to_owned());
    options.windows = vec![WindowRule::new("lunch", "deny", "0 12 * * *", "UTC", "1h")?];
    options.clock = Clock::new({
        let clock = clock.clone();
        move || clock.load(Ordering::SeqCst)
    });
    let syncer = Syncer::new(source, Arc::clone(&store), options)?;
    let sync = || syncer.sync_once_as(&AtomicBool::new(false), &Who::new(Origin::Poll, None));
    let set = |text: &str| -> TestResult {
        clock.store(at(text)?, Ordering::SeqCst);
        Ok(())
    };
    let one = at("2026-11-27T13:00:00Z")?;
    match sync()? {
        SyncOutcome::Held { commit, until, why } => {
            assert_eq!(commit.as_str(), first);
            assert_eq!(until, Some(one));
            assert!(why.starts_with("inside the deny window \"lunch\""), "{why}");
        }
        other => return Err(format!("expected held, got {other:?}").into()),
    }
    assert!(store.commit_summary()?.last_applied.is_none());
    set("2026-11-27T12:59:59Z")?;
    assert!(
        matches!(sync()?, SyncOutcome::Unchanged(_)),
        "not due before the opening"
    );
    set("2026-11-27T13:00:00Z")?;
    match sync()? {
        SyncOutcome::Applied { commit, .. } => assert_eq!(commit.as_str(), first),
        other => return Err(format!("expected applied at the opening, got {other:?}").into()),
    }
    assert!(store.hold()?.is_none());

    // The next day's window: a newer commit replaces the held one.
    set("2026-11-28T12:05:00Z")?;
    repo.write("deploy/api.hcl", &deployment("2"))?;
    let second = repo.commit("v2")?;
    assert!(matches!(sync()?, SyncOutcome::Held { .. }));
    repo.write("deploy/api.hcl", &deployment("3"))?;
    let third = repo.commit("v3")?;
    assert!(matches!(sync()?, SyncOutcome::Held { .. }));
    let hold = store.hold()?.ok_or("held")?;
    assert_eq!(hold.commit.as_str(), third);
    let (rows, _) = store.activity(0, 100)?;
    let replaced = rows
        .iter()
        .find(|row| {
            row.action == "commit.hold" && row.commit.as_ref().is_some_and(|c| c.as_str() == third)
        })
        .ok_or("the hold of the third commit is logged")?;
    assert_eq!(replaced.data["replaces"], second.as_str());
    // A bad commit is rejected at once, inside the window, with its location.
    repo.write(
        "deploy/api.hcl",
        "deployment \"shop\" \"api\" {\n  imge = \"x\"\n}\n",
    )?;
    let bad = repo.commit("typo")?;
    match sync()? {
        SyncOutcome::Rejected {
            commit,
            diagnostics,
        } => {
            assert_eq!(commit.as_str(), bad);
            assert!(
                diagnostics.to_string().contains("deploy/api.hcl:2:3"),
                "{diagnostics}"
            );
        }
        other => return Err(format!("expected rejected, got {other:?}").into()),
    }
    assert!(store.hold()?.is_none(), "a rejected tip drops the hold");
    assert_eq!(
        store
            .commit_summary()?
            .last_applied
            .map(|record| record.sha.to_string()),
        Some(first)
    );
    Ok(())
}

/// A syncer over `repo` on a fresh data dir whose clock reads `clock`, with `windows`.
fn syncer(
    repo: &TempRepo,
    clock: &Arc<AtomicI64>,
    windows: Vec<WindowRule>,
) -> TestResult<(tempfile::TempDir, Arc<Store>, Syncer)> {
    let data = tempfile::tempdir()?;
    let store = Arc::new(Store::open(&data.path().join("state.db"))?);
    let source = Source::new(
        SourceOptions {
            url: repo.url(),
            branch: "main".to_owned(),
            ..Default::default()
        },
        data.path(),
    );
    let mut options = SyncOptions::new(data.path().to_owned());
    options.windows = windows;
    options.clock = Clock::new({
        let clock = clock.clone();
        move || clock.load(Ordering::SeqCst)
    });
    let syncer = Syncer::new(source, Arc::clone(&store), options)?;
    Ok((data, store, syncer))
}

/// A trigger file's `window:` holds the commits that fire that trigger, and only those: a
/// commit firing only another trigger applies at once.
#[test]
fn a_trigger_files_window_holds_only_the_commits_that_fire_it() -> TestResult {
    let clock = Arc::new(AtomicI64::new(at("2026-11-27T12:10:00Z")?));
    let repo = TempRepo::new()?;
    repo.write(
        ".voodu/api.yml",
        "on:\n  push:\n    branches: [main]\n    paths: [\"apps/api/**\"]\napply:\n  file: deploy/api.hcl\nwindow:\n  - name: lunch\n    kind: deny\n    schedule: \"0 12 * * *\"\n    duration: 1h\n",
    )?;
    repo.write(
        ".voodu/web.yml",
        "on:\n  push:\n    branches: [main]\n    paths: [\"apps/web/**\"]\napply:\n  file: deploy/web.hcl\n",
    )?;
    repo.write("deploy/api.hcl", &deployment("1"))?;
    repo.write(
        "deploy/web.hcl",
        &deployment("1").replace("\"api\"", "\"web\""),
    )?;
    repo.write("apps/api/main.go", "1")?;
    repo.write("apps/web/index.html", "1")?;
    let first = repo.commit("both")?;
    let (_data, store, syncer) = syncer(&repo, &clock, Vec::new())?;
    let sync = || syncer.sync_once_as(&AtomicBool::new(false), &Who::new(Origin::Poll, None));
    // The first commit fires both: api's lunch window holds it.
    match sync()? {
        SyncOutcome::Held { commit, until, why } => {
            assert_eq!(commit.as_str(), first);
            assert_eq!(until, Some(at("2026-11-27T13:00:00Z")?));
            assert!(why.contains(".voodu/api.yml: lunch"), "{why}");
        }
        other => return Err(format!("expected held, got {other:?}").into()),
    }
    clock.store(at("2026-11-27T13:00:00Z")?, Ordering::SeqCst);
    assert!(matches!(sync()?, SyncOutcome::Applied { .. }));
    // The next lunch: a web-only commit applies at once, an api one is held.
    clock.store(at("2026-11-28T12:10:00Z")?, Ordering::SeqCst);
    repo.write("apps/web/index.html", "2")?;
    let web_only = repo.commit("web")?;
    match sync()? {
        SyncOutcome::Applied { commit, .. } => assert_eq!(commit.as_str(), web_only),
        other => return Err(format!("expected the web commit applied, got {other:?}").into()),
    }
    repo.write("apps/api/main.go", "2")?;
    let api = repo.commit("api")?;
    match sync()? {
        SyncOutcome::Held { commit, .. } => assert_eq!(commit.as_str(), api),
        other => return Err(format!("expected the api commit held, got {other:?}").into()),
    }
    assert_eq!(store.hold()?.map(|hold| hold.commit.to_string()), Some(api));
    Ok(())
}

/// Issue 52 acceptance 3: a window that opens about a minute after the push holds the commit
/// (status: held until the opening; the old commit keeps running), then applies it when the
/// window opens, with no new push (the agent polls once an hour here: only its own wake at
/// the opening applies it). `approve --now` lets the first commit through the closed window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_opening_a_minute_after_the_push_holds_the_commit_then_applies_it() -> TestResult {
    // A deny window that began this minute and ends 70 s from now.
    let now = chrono::Utc::now();
    let start = now.timestamp() - now.timestamp() % 60;
    let opens = now.timestamp() + 70;
    let started = chrono::DateTime::from_timestamp(start, 0).ok_or("a time")?;
    let rule = WindowRule::new(
        "release-freeze",
        "deny",
        &started.format("%M %H * * *").to_string(),
        "UTC",
        &format!("{}s", opens - start),
    )?;
    let repo = TempRepo::new()?;
    repo.write("deploy/api.hcl", &deployment("1"))?;
    let first = repo.commit("v1")?;
    let agent = TestAgent::start(
        repo,
        TestAgentOptions {
            windows: vec![rule],
            ..TestAgentOptions::default()
        },
    )
    .await?;
    let data_dir = agent.data_dir();
    // Held at start: nothing was ever applied.
    agent
        .until("the first commit held", |store| {
            Ok(store.hold()?.filter(|hold| hold.commit.as_str() == first))
        })
        .await?;
    assert!(agent.store.commit_summary()?.last_applied.is_none());
    // `approve --now`: through the closed window.
    let said = cli(&data_dir, &["approve", "--now", &first[..10]]).await?;
    assert!(said.contains("--now"), "{said}");
    agent.applied(&first).await?;
    assert!(agent.store.hold()?.is_none());

    // The push: accepted, checked, held.
    agent.repo.write("deploy/api.hcl", &deployment("2"))?;
    let second = agent.repo.commit("v2")?;
    cli(&data_dir, &["sync"]).await?;
    let hold = agent
        .until("the second commit held", |store| {
            Ok(store.hold()?.filter(|hold| hold.commit.as_str() == second))
        })
        .await?;
    assert_eq!(hold.until, Some(opens), "held until the deny window ends");
    assert!(
        hold.reason
            .contains("inside the deny window \"release-freeze\""),
        "{}",
        hold.reason
    );
    let status = cli(&data_dir, &["status"]).await?;
    let until = chrono::DateTime::from_timestamp(opens, 0)
        .ok_or("a time")?
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    assert!(
        status.contains(&format!("{} held until {until}", &second[..12])),
        "{status}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&cli(&data_dir, &["status", "--json"]).await?)?;
    assert_eq!(json["held"]["commit"], second.as_str());
    assert_eq!(json["held"]["until"], opens);
    // The old commit keeps running.
    assert_eq!(
        agent
            .store
            .commit_summary()?
            .last_applied
            .map(|record| record.sha.to_string()),
        Some(first.clone())
    );
    assert_eq!(desired_commit(&agent)?, first);

    // The window opens: applied without a push.
    agent
        .until_within(
            Duration::from_secs(150),
            "the held commit applied",
            |store| {
                Ok(store
                    .commit_summary()?
                    .last_applied
                    .filter(|record| record.sha.as_str() == second)
                    .map(|_| ()))
            },
        )
        .await?;
    assert!(
        chrono::Utc::now().timestamp() >= opens,
        "applied before the window opened"
    );
    assert_eq!(desired_commit(&agent)?, second);
    assert!(agent.store.hold()?.is_none());
    let log = activity(&agent)?;
    let (s1, s2) = (&first[..7], &second[..7]);
    for expected in [
        format!("commit.hold held {s1}"),
        format!("approve requested {s1}"),
        format!("commit.release succeeded {s1}"),
        format!("commit.hold held {s2}"),
        format!("commit.release succeeded {s2}"),
    ] {
        assert!(log.contains(&expected), "{expected:?} not in {log:#?}");
    }
    agent.stop().await
}

/// Issue 52 acceptance 3: `freeze` holds a push, `rollback` still works during the freeze,
/// `unfreeze` applies the held commit at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freeze_holds_a_push_rollback_works_during_it_and_unfreeze_applies_it() -> TestResult {
    let api = ResourceKey::new(Kind::Deployment, "shop", "api");
    let repo = TempRepo::new()?;
    repo.write("deploy/api.hcl", &deployment("1"))?;
    let first = repo.commit("v1")?;
    let agent = TestAgent::start(repo, TestAgentOptions::default()).await?;
    let data_dir = agent.data_dir();
    let rolled_out = |sha: String| {
        let api = api.clone();
        move |store: &voodu_agent::store::Store| {
            Ok(store.latest_release(&api)?.filter(|release| {
                release.commit.as_str() == sha && release.phase.as_str() == "succeeded"
            }))
        }
    };
    agent.applied(&first).await?;
    let v1 = agent
        .until("v1 rolled out", rolled_out(first.clone()))
        .await?;
    agent.repo.write("deploy/api.hcl", &deployment("2"))?;
    let second = agent.repo.commit("v2")?;
    cli(&data_dir, &["sync"]).await?;
    agent.applied(&second).await?;
    agent
        .until("v2 rolled out", rolled_out(second.clone()))
        .await?;

    let said = cli(
        &data_dir,
        &[
            "freeze",
            "--reason",
            "black friday \u{1b}[31m",
            "--until",
            "2h",
        ],
    )
    .await?;
    assert!(said.contains("froze every source until"), "{said}");
    agent.repo.write("deploy/api.hcl", &deployment("3"))?;
    let third = agent.repo.commit("v3")?;
    cli(&data_dir, &["sync"]).await?;
    let hold = agent
        .until("the third commit held", |store| {
            Ok(store.hold()?.filter(|hold| hold.commit.as_str() == third))
        })
        .await?;
    assert!(hold.frozen);
    assert!(hold.reason.starts_with("frozen until "), "{}", hold.reason);
    let status = cli(&data_dir, &["status"]).await?;
    assert!(status.contains("FROZEN"), "{status}");
    assert!(
        status.contains(&format!("{} held until", &third[..12])),
        "{status}"
    );
    // The reason is printed escaped.
    assert!(status.contains("black friday"), "{status}");
    assert!(!status.contains('\u{1b}'), "{status}");
    assert_eq!(desired_commit(&agent)?, second);

    // `rollback` during the freeze: v1's spec runs again, pinned.
    cli(&data_dir, &["rollback", "shop/api"]).await?;
    agent
        .until("the rollback rolled out", |store| {
            Ok(store.latest_release(&api)?.filter(|release| {
                release.spec_hash == v1.spec_hash
                    && release.rolled_back_from.is_some()
                    && release.phase.as_str() == "succeeded"
            }))
        })
        .await?;
    assert!(agent.store.pin(&api)?.is_some(), "the rollback pins");
    assert_eq!(
        agent.store.hold()?.map(|hold| hold.commit.to_string()),
        Some(third.clone()),
        "still held"
    );

    // `unfreeze`: the held commit applies at once.
    let said = cli(&data_dir, &["unfreeze"]).await?;
    assert!(said.contains("unfroze every source"), "{said}");
    agent.applied(&third).await?;
    assert_eq!(desired_commit(&agent)?, third);
    assert!(agent.store.hold()?.is_none());
    let log = activity(&agent)?;
    let s3 = &third[..7];
    for expected in [
        "freeze succeeded -".to_owned(),
        format!("commit.hold held {s3}"),
        "unfreeze succeeded -".to_owned(),
        format!("commit.release succeeded {s3}"),
    ] {
        assert!(log.contains(&expected), "{expected:?} not in {log:#?}");
    }
    assert!(
        log.iter().any(|line| line.starts_with("rollback ")),
        "the rollback is in the log: {log:#?}"
    );
    agent.stop().await
}
