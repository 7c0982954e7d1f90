//! Deploy windows and a freeze on a real Docker engine (issue 52, acceptance 3): the real
//! `voodu-agent` binary with `--window`, read as an operator would (`status --json`, `docker
//! ps`). A deny window ending about a minute after the push holds the commit while the old
//! container keeps running, then the agent rolls the new one out by itself when the window
//! ends; `freeze` holds the next push, `rollback` still works during the freeze, and
//! `unfreeze` applies the held commit.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::e2e_docker::AGENT;
use crate::sources_docker::{Agent, LogOnFailure, containers, status};
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

const LIMIT: Duration = Duration::from_secs(90);

fn web(scope: &str, v: &str) -> String {
    format!(
        "deployment \"{scope}\" \"web\" {{\n  image    = \"{}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = 1\n  env      = {{ V = \"{v}\" }}\n}}\n",
        test_image()
    )
}

/// `voodu-agent ARGS --data-dir DIR`: its stdout, or its stderr as the error.
fn cli(data_dir: &Path, args: &[&str]) -> TestResult<String> {
    let output = Command::new(AGENT)
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "voodu-agent {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// Waits until `scope` runs exactly one container, with `V=v`.
fn runs(scope: &str, v: &str, limit: Duration) -> TestResult<String> {
    wait_until(
        limit,
        &format!("{scope} runs V={v}"),
        || match containers(scope).ok()?.as_slice() {
            [(id, found)] if found == v => Some(id.clone()),
            _ => None,
        },
    )
}

/// Waits until `status --json` shows `sha` held.
fn held(data_dir: &Path, sha: &str) -> TestResult<serde_json::Value> {
    wait_until(LIMIT, &format!("{sha} held"), || {
        let status = status(data_dir).ok()?;
        (status["held"]["commit"] == sha).then_some(status)
    })
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_window_and_a_freeze_hold_commits_on_the_real_engine() -> TestResult {
    let scope = unique("win");
    let _guard = DockerGuard::new(&scope);
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &web(&scope, "1"))?;
    let first = repo.commit("v1")?;
    let dir = tempfile::tempdir()?;
    let (data_dir, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    // A deny window that began this minute and ends 75 s from now.
    let now = chrono::Utc::now().timestamp();
    let start = now - now % 60;
    let opens = now + 75;
    let started = chrono::DateTime::from_timestamp(start, 0).ok_or("a time")?;
    let rule = format!(
        "deny {} * * * {}s UTC",
        started.format("%M %H"),
        opens - start
    );
    let agent = Agent::start(&data_dir, &log, &["--repo", &repo.url(), "--window", &rule])?;
    let mut guard = LogOnFailure(&log, true);
    // Held at start; `approve --now` lets it through the closed window.
    held(&data_dir, &first)?;
    assert!(
        containers(&scope)?.is_empty(),
        "nothing runs before the approval"
    );
    cli(&data_dir, &["approve", "--now", &first])?;
    let v1 = runs(&scope, "1", LIMIT)?;

    // A push inside the window: held, the old container keeps running.
    repo.write("web.hcl", &web(&scope, "2"))?;
    let second = repo.commit("v2")?;
    cli(&data_dir, &["sync"])?;
    let waiting = held(&data_dir, &second)?;
    assert_eq!(waiting["held"]["until"], opens, "{waiting:#}");
    assert_eq!(
        waiting["last_applied"]["sha"],
        first.as_str(),
        "{waiting:#}"
    );
    assert_eq!(containers(&scope)?, [(v1.clone(), "1".to_owned())]);
    // The window ends: rolled out with no push (the agent polls once an hour here).
    runs(&scope, "2", Duration::from_secs(180))?;
    assert!(
        chrono::Utc::now().timestamp() >= opens,
        "rolled out before the window ended"
    );

    // Freeze: the next push is held; a rollback still works; unfreeze applies the push.
    cli(&data_dir, &["freeze", "--reason", "sale"])?;
    repo.write("web.hcl", &web(&scope, "3"))?;
    let third = repo.commit("v3")?;
    cli(&data_dir, &["sync"])?;
    let frozen = held(&data_dir, &third)?;
    assert_eq!(frozen["held"]["frozen"], true, "{frozen:#}");
    let text = cli(&data_dir, &["status"])?;
    assert!(
        text.contains("frozen until `voodu-agent unfreeze`: sale"),
        "{text}"
    );
    assert_eq!(containers(&scope)?.len(), 1);
    cli(&data_dir, &["rollback", &format!("{scope}/web")])?;
    runs(&scope, "1", LIMIT)?;
    cli(&data_dir, &["unfreeze"])?;
    runs(&scope, "3", LIMIT)?;
    let after = status(&data_dir)?;
    assert_eq!(after["last_applied"]["sha"], third.as_str(), "{after:#}");
    assert!(after["held"].is_null(), "{after:#}");
    guard.1 = false;
    agent.stop()
}
