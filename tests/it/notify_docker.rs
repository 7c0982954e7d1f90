//! Issue 28 accepted on a real engine with the real binary: a rollout that fails is told
//! exactly once (`rollout.failed`, and one failure status for its commit), even to receivers
//! that were down for 30 s while it happened (the outbox), and the agent kept reconciling
//! meanwhile (another deployment committed during the outage became ready).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::e2e_docker::Env;
use crate::support::http::{Capture, Captured};
use crate::support::{TestResult, test_image, wait_until};

const LIMIT: Duration = Duration::from_secs(120);

fn deployment(scope: &str, name: &str, version: &str, extra: &str) -> String {
    format!(
        r#"deployment "{scope}" "{name}" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = 2
  env      = {{ V = "{version}" }}
{extra}}}
"#,
        image = test_image(),
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

/// Every event in the generic sink's bodies.
fn events(received: &[Captured]) -> Vec<Value> {
    received
        .iter()
        .filter_map(|request| serde_json::from_str::<Value>(&request.body).ok())
        .flat_map(|body| body["events"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn state_of(request: &Captured) -> String {
    serde_json::from_str::<Value>(&request.body)
        .ok()
        .and_then(|body| body["state"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_failed_rollout_is_told_once_even_to_receivers_that_were_down_for_30s() -> TestResult {
    Env::new()?.run(|env| {
        let generic = Capture::start()?;
        let github = Capture::start()?;
        let dir = env.dir.path().to_owned();
        std::fs::write(dir.join("ci-url"), generic.url("/ci"))?;
        std::fs::write(dir.join("gh-token"), "ghp_test\n")?;
        let file = dir.join("notify.hcl");
        std::fs::write(
            &file,
            format!(
                r#"notify "ci" {{
  type     = "generic"
  url_file = "{ci}"
  scopes   = ["{scope}"]
  interval = "1s"
}}
commit_status "origin" {{
  provider   = "github"
  api_url    = "{api}"
  repository = "acme/deploy"
  token_file = "{token}"
  interval   = "1s"
}}
"#,
                ci = dir.join("ci-url").display(),
                scope = env.scope(),
                api = github.url(""),
                token = dir.join("gh-token").display(),
            ),
        )?;
        let scope = env.scope().to_owned();
        env.repo
            .write("app/web.hcl", &deployment(&scope, "web", "1", ""))?;
        let v1 = env.repo.commit("web v1")?;
        let file = file.display().to_string();
        env.start_agent_with(&[
            "--ready-settle",
            "1s",
            "--rollout-deadline",
            "15s",
            "--notify",
            &file,
        ])?;
        env.converged(&v1, 2, None)?;
        wait_until(LIMIT, "v1's rollout to be told", || {
            events(&generic.received())
                .iter()
                .any(|event| event["event"] == "rollout.succeeded")
                .then_some(())
        })?;

        // Both receivers go down; a version that never becomes ready fails and is rolled back.
        generic.answer_with(503);
        github.answer_with(503);
        let down = Instant::now();
        env.repo
            .write("app/web.hcl", &deployment(&scope, "web", "2", NEVER_READY))?;
        let v2 = env.repo.commit("web v2: never ready")?;
        wait_until(LIMIT, "the automatic rollback", || {
            let releases = env.releases().ok()?;
            let phases: Vec<String> = releases["releases"]
                .as_array()?
                .iter()
                .filter_map(|release| release["phase"].as_str().map(str::to_owned))
                .collect();
            (phases == ["succeeded", "failed", "succeeded"]).then_some(())
        })?;
        // Meanwhile the agent goes on: another deployment becomes ready.
        env.repo
            .write("app/api.hcl", &deployment(&scope, "api", "1", ""))?;
        env.repo.commit("api")?;
        wait_until(LIMIT, "api Ready while the receivers are down", || {
            let status = env.status().ok()?;
            status["resources"]
                .as_array()?
                .iter()
                .any(|resource| resource["name"] == "api" && resource["phase"] == "Ready")
                .then_some(())
        })?;
        if let Some(rest) = Duration::from_secs(30).checked_sub(down.elapsed()) {
            std::thread::sleep(rest);
        }
        assert!(generic.refused() > 0, "the generic sink tried meanwhile");
        assert!(github.refused() > 0, "the status sink tried meanwhile");
        let told = |events: &[Value]| {
            events
                .iter()
                .filter(|event| event["event"] == "rollout.failed")
                .count()
        };
        assert_eq!(told(&events(&generic.received())), 0, "nothing got through");

        // Back up: both get what they missed, once.
        generic.answer_with(200);
        github.answer_with(200);
        let v2_path = format!("/repos/acme/deploy/statuses/{v2}");
        wait_until(LIMIT, "the failure to reach both receivers", || {
            let failed = told(&events(&generic.received())) > 0;
            let status = github
                .received()
                .iter()
                .any(|request| request.path == v2_path && state_of(request) == "failure");
            let rolled_back = events(&generic.received())
                .iter()
                .any(|event| event["event"] == "rollout.rolled_back");
            (failed && status && rolled_back).then_some(())
        })?;
        let all = events(&generic.received());
        let failed: Vec<&Value> = all
            .iter()
            .filter(|event| event["event"] == "rollout.failed")
            .collect();
        assert_eq!(failed.len(), 1, "{all:#?}");
        assert_eq!(failed[0]["commit"], v2.as_str());
        assert_eq!(failed[0]["resource"], format!("deployment/{scope}/web"));
        let failures = github
            .received()
            .iter()
            .filter(|request| request.path == v2_path && state_of(request) == "failure")
            .count();
        assert_eq!(failures, 1, "one failure status for {v2}");
        let ids: Vec<i64> = all
            .iter()
            .filter_map(|event| event["id"].as_i64())
            .collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(ids, sorted, "in order, each once");
        Ok(())
    })
}
