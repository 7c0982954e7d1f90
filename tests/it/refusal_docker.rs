//! Issue 10 item 9 on a real engine with the real binary: a spec the engine refuses (Docker
//! answers HTTP 500 "unable to find user nosuchuser" when it starts a container whose `--user`
//! the image lacks) is permanent, not "engine unavailable": the resource is Failed with the
//! engine's message at once, tried once (one container created), not retried on the backoff
//! schedule, while a valid resource of the same commit runs and later commits still deploy.
//!
//! The refused spec asks for nothing a host policy guards (no device, no privilege), so the
//! test holds whatever policy the agent runs with. Limits in `wait_until` are liveness bounds.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::e2e_docker::{Env, Events};
use crate::support::{TestResult, test_image, wait_until};

const LIMIT: Duration = Duration::from_secs(60);

pub(crate) fn deployment(scope: &str, name: &str, version: &str, extra: &str) -> String {
    format!(
        r#"deployment "{scope}" "{name}" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  env      = {{ V = "{version}" }}
{extra}}}
"#,
        image = test_image(),
    )
}

/// `name` of this scope in `status --json`, if listed.
fn resource(env: &Env, name: &str) -> Option<Value> {
    let status = env.status().ok()?;
    status["resources"]
        .as_array()?
        .iter()
        .find(|resource| resource["scope"] == env.scope() && resource["name"] == name)
        .cloned()
}

/// Containers named `<scope>-<name>.…` created since the events stream started.
fn created(events: &Events, env: &Env, name: &str) -> TestResult<usize> {
    let prefix = format!("{}-{name}.", env.scope());
    Ok(events
        .seen()?
        .iter()
        .filter(|(action, container)| action == "create" && container.starts_with(&prefix))
        .count())
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i10_a_spec_the_engine_refuses_is_failed_at_once_and_not_retried() -> TestResult {
    Env::new()?.run(refused_spec)
}

fn refused_spec(env: &mut Env) -> TestResult {
    let scope = env.scope().to_owned();
    let events = Events::start(&scope, SystemTime::now(), env.dir.path().join("events.log"))?;
    let refused = r#"  docker_options = ["--user", "nosuchuser"]
"#;
    env.repo
        .write("app/web.hcl", &deployment(&scope, "web", "1", ""))?
        .write("app/bad.hcl", &deployment(&scope, "bad", "1", refused))?;
    env.repo
        .commit("web, and bad with a user the image lacks")?;
    env.start_agent_with(&["--ready-settle", "1s"])?;

    let bad = wait_until(LIMIT, "bad to be Failed", || {
        resource(env, "bad").filter(|bad| bad["phase"] == "Failed")
    })?;
    let message = bad["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the engine refused the request")
            && message.contains("unable to find user nosuchuser"),
        "the engine's message: {message}"
    );
    assert!(!message.contains("unavailable"), "{message}");
    wait_until(LIMIT, "web to be Ready next to it", || {
        resource(env, "web").filter(|web| web["phase"] == "Ready")
    })?;

    // Later work goes on (a commit that changes web deploys), and bad was tried once: a
    // transient error would have been retried 1 s, 2 s, 4 s… after the first try.
    env.repo
        .write("app/web.hcl", &deployment(&scope, "web", "2", ""))?;
    let second = env.repo.commit("web: V=2")?;
    wait_until(LIMIT, "web to roll out the second commit", || {
        let web = resource(env, "web")?;
        (web["phase"] == "Ready" && web["release"]["commit"] == second.as_str()).then_some(())
    })?;
    // The events stream has caught up to web's second replica: bad's count is final so far.
    wait_until(LIMIT, "docker events of web's second replica", || {
        (created(&events, env, "web").ok()? == 2).then_some(())
    })?;
    assert_eq!(created(&events, env, "bad")?, 1, "bad was created once");
    let log = std::fs::read_to_string(env.log())?;
    assert!(
        !log.lines()
            .any(|line| line.contains("will retry") && line.contains("/bad")),
        "no retry was scheduled for bad"
    );
    let bad = resource(env, "bad").ok_or("bad is in status")?;
    assert_eq!(bad["phase"], "Failed");
    assert_eq!(bad["release"]["phase"], "failed");
    Ok(())
}
