//! Issue 12 acceptance 3, on Docker with the real binary: a trigger with
//! `paths = ["apps/api/**"]` applies a commit that touches `apps/api/` and ignores one that
//! touches only `apps/web/`; a `deploy: manual` trigger holds its commit (shown in `status`)
//! until `voodu-agent approve`.

use std::time::Duration;

use serde_json::Value;

use crate::e2e_docker::Env;
use crate::support::{TestResult, test_image, wait_until};

const LIMIT: Duration = Duration::from_secs(60);

fn deployment(scope: &str, name: &str, version: &str) -> String {
    format!(
        r#"deployment "{scope}" "{name}" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  env      = {{ V = "{version}" }}
}}
"#,
        image = test_image(),
    )
}

/// The running containers of `name` in the scope, as `(id, V)`; V read from the engine.
fn running(env: &Env, name: &str) -> TestResult<Vec<(String, String)>> {
    let prefix = format!("{}-{name}.", env.scope());
    let mut found = Vec::new();
    for row in env.containers()? {
        if !row.name.starts_with(&prefix) || row.state != "running" {
            continue;
        }
        let output = std::process::Command::new("docker")
            .args([
                "inspect",
                "--format",
                "{{range .Config.Env}}{{println .}}{{end}}",
                &row.id,
            ])
            .output()?;
        let version = String::from_utf8(output.stdout)?
            .lines()
            .find_map(|line| line.strip_prefix("V=").map(ToOwned::to_owned))
            .unwrap_or_default();
        found.push((row.id, version));
    }
    Ok(found)
}

fn trigger_view(status: &Value, name: &str) -> Option<Value> {
    status["triggers"]
        .as_array()?
        .iter()
        .find(|trigger| trigger["name"] == name)
        .cloned()
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i12_trigger_paths_and_manual_deploys_on_docker() -> TestResult {
    Env::new()?.run(trigger_paths_and_manual)
}

fn trigger_paths_and_manual(env: &mut Env) -> TestResult {
    let scope = env.scope().to_owned();
    // api's manifest lives outside its paths, so a commit can change it without touching
    // apps/api/: only the paths decide whether api fires.
    env.repo.write(
        ".voodu/api.yml",
        "name: api\non:\n  push:\n    branches: [main]\n    paths: [\"apps/api/**\"]\napply:\n  file: deploy/api.hcl\n",
    )?;
    env.repo.write(
        ".voodu/web.yml",
        "on:\n  push:\n    branches: [main]\n    paths: [\"apps/web/**\"]\napply:\n  file: deploy/web.hcl\ndeploy: manual\n",
    )?;
    env.repo
        .write("deploy/api.hcl", &deployment(&scope, "api", "1"))?;
    env.repo
        .write("deploy/web.hcl", &deployment(&scope, "web", "1"))?;
    env.repo.write("apps/api/main.go", "// 1\n")?;
    env.repo.write("apps/web/index.html", "1\n")?;
    let first = env.repo.commit("api and a manual web")?;
    env.start_agent()?;

    // The first commit fires api; web (manual) is held and shown as held.
    let api_1 = wait_until(LIMIT, "api V=1 running", || {
        running(env, "api")
            .ok()
            .filter(|rows| rows.len() == 1 && rows[0].1 == "1")
    })?;
    let status = wait_until(LIMIT, "web held in status", || {
        let status = env.status().ok()?;
        (trigger_view(&status, "web")?["state"] == "held").then_some(status)
    })?;
    assert_eq!(status["last_applied"]["sha"], first.as_str());
    let web = trigger_view(&status, "web").ok_or("web")?;
    assert_eq!(web["held"]["commit"], first.as_str());
    assert_eq!(
        web["held"]["approve_with"],
        format!("voodu-agent approve {first}")
    );
    assert!(
        running(env, "web")?.is_empty(),
        "a held trigger deploys nothing"
    );

    // A commit touching only apps/web/ (and api's manifest outside its paths): api is
    // ignored — its container stays, V=1 — and web's hold moves to the new commit.
    env.repo
        .write("deploy/api.hcl", &deployment(&scope, "api", "2"))?;
    env.repo.write("apps/web/index.html", "2\n")?;
    let web_only = env.repo.commit("web only")?;
    let status = wait_until(LIMIT, "the web-only commit applied", || {
        let status = env.status().ok()?;
        (status["last_applied"]["sha"] == web_only.as_str()).then_some(status)
    })?;
    let api = trigger_view(&status, "api").ok_or("api")?;
    assert_eq!(
        api["applied"]["commit"],
        first.as_str(),
        "api ignored the web-only commit"
    );
    assert_eq!(
        trigger_view(&status, "web").ok_or("web")?["held"]["commit"],
        web_only.as_str()
    );
    env.polled(2)?;
    assert_eq!(running(env, "api")?, api_1, "api's container untouched");
    assert!(running(env, "web")?.is_empty());

    // A commit touching apps/api/: api fires and reads its manifest at this commit (V=2).
    env.repo.write("apps/api/main.go", "// 2\n")?;
    let api_commit = env.repo.commit("api change")?;
    let api_2 = wait_until(LIMIT, "api replaced with V=2", || {
        running(env, "api")
            .ok()
            .filter(|rows| rows.len() == 1 && rows[0].1 == "2" && rows[0].0 != api_1[0].0)
    })?;
    let releases: Value =
        serde_json::from_str(&env.cli(&["releases", &format!("{scope}/api"), "--json"])?)?;
    assert_eq!(
        releases["releases"][0]["commit"],
        api_commit.as_str(),
        "the release is keyed to the commit that fired"
    );

    // Approving a commit nobody holds fails; approving the held one deploys web at it.
    let refused = std::process::Command::new(crate::e2e_docker::AGENT)
        .args(["approve", &first, "--data-dir"])
        .arg(env.data_dir())
        .output()?;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("no trigger holds a commit"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let said = env.cli(&["approve", &web_only])?;
    assert!(said.contains("approved commit"), "{said}");
    wait_until(LIMIT, "web running after approve", || {
        running(env, "web")
            .ok()
            .filter(|rows| rows.len() == 1 && rows[0].1 == "1")
    })?;
    let status = env.status()?;
    let web = trigger_view(&status, "web").ok_or("web")?;
    assert_eq!(web["state"], "active");
    assert_eq!(web["applied"]["commit"], web_only.as_str());
    assert_eq!(
        running(env, "api")?,
        api_2,
        "approving web leaves api alone"
    );

    let activity: Value = serde_json::from_str(&env.cli(&["activity", "--json"])?)?;
    let approvals: Vec<&Value> = activity["entries"]
        .as_array()
        .ok_or("entries")?
        .iter()
        .filter(|entry| entry["action"] == "approve")
        .collect();
    assert_eq!(approvals.len(), 2, "{approvals:?}");
    assert_eq!(approvals[0]["outcome"], "requested");
    assert_eq!(approvals[1]["outcome"], "succeeded");
    Ok(())
}
