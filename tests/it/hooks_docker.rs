//! Issue 5's hooks accepted on a real engine with the real binary: `release {}` runs
//! `pre_command`, then `command`, before any replica of the release is created, and
//! `post_command` once the rollout converged; every replica runs its `init` containers in
//! declaration order first; `on_deploy` reaches a local HTTP server with voodu's payload.
//! Failure paths: a failing `pre_command` fails the release and the old replicas keep running
//! (the `failure` target hears of it); a failing `post_command` is recorded only; a failing
//! init fails the rollout, which is rolled back. And a config bucket change rolls the
//! replicas that read it, with the new value in their environment.
//!
//! Order is read from `docker events` (`start` of each container), state the way an operator
//! reads it (`status`, `releases`, `docker inspect`). Limits in `wait_until` are liveness
//! bounds, not timing assertions.

use std::process::Command;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::e2e_docker::{Env, Events, Row};
use crate::support::http::{Capture, Captured};
use crate::support::{TestResult, test_image, wait_until};

const LIMIT: Duration = Duration::from_secs(90);

/// Ready after 1s running; a stuck rollout fails after 20s.
/// The receiver is on loopback: `on_deploy` reaches it only where the host allows it, as
/// `url()` (issue 47).
const FLAGS: &[&str] = &[
    "--ready-settle",
    "1s",
    "--rollout-deadline",
    "20s",
    "--allow-url-host",
    "127.0.0.1",
];

/// `web` with two replicas, version `v`, init containers `first` and `second` (the second
/// running `second_init`), release hooks and `on_deploy` targets on `capture`.
fn web(env: &Env, capture: &Capture, v: &str, pre: &str, post: &str, second_init: &str) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = 2
  env      = {{ V = "{v}" }}

  init "first" {{
    command = ["sh", "-c", "true"]
  }}
  init "second" {{
    command = {second_init}
  }}

  release {{
    pre_command  = {pre}
    command      = ["true"]
    post_command = {post}
  }}

  on_deploy {{
    success {{
      url = "{success}"
    }}
    failure {{
      url = "{failure}"
    }}
  }}
}}
"#,
        scope = env.scope(),
        image = test_image(),
        success = capture.url("/deployed"),
        failure = capture.url("/failed"),
    )
}

const OK: &str = r#"["true"]"#;

/// The `web` replicas (not init or release containers) of the scope.
fn replicas(env: &Env) -> TestResult<Vec<Row>> {
    let marker = format!("{}-web.", env.scope());
    Ok(env
        .containers()?
        .into_iter()
        .filter(|row| row.name.starts_with(&marker))
        .collect())
}

/// Releases of `web`, newest first.
fn releases(env: &Env) -> TestResult<Vec<Value>> {
    Ok(env.releases()?["releases"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Names of containers of the scope in the order the engine started them.
fn started(events: &Events) -> TestResult<Vec<String>> {
    Ok(events
        .seen()?
        .into_iter()
        .filter(|(action, _)| action == "start")
        .map(|(_, name)| name)
        .collect())
}

fn position(names: &[String], name: &str) -> TestResult<usize> {
    names
        .iter()
        .position(|started| started == name)
        .ok_or_else(|| format!("{name} never started: {names:?}").into())
}

/// The `on_deploy` deliveries to `path`, bodies parsed.
fn deliveries(capture: &Capture, path: &str) -> TestResult<Vec<(Captured, Value)>> {
    capture
        .received()
        .into_iter()
        .filter(|request| request.path == path)
        .map(|request| {
            let body = serde_json::from_str(&request.body)?;
            Ok((request, body))
        })
        .collect()
}

fn env_of(id: &str) -> TestResult<Vec<String>> {
    let output = Command::new("docker")
        .args(["inspect", "--format", "{{json .Config.Env}}", id])
        .output()?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned().into());
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn release_hooks_init_containers_on_deploy_and_a_bucket_change_on_docker() -> TestResult {
    let capture = Capture::start()?;
    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();
        let events = Events::start(&scope, SystemTime::now(), env.dir.path().join("events"))?;

        // 1. First release: pre_command, command, then per replica init first, init second,
        //    the replica; post_command after convergence; a success delivery.
        env.repo
            .write("app/web.hcl", &web(env, &capture, "1", OK, OK, OK))?;
        let v1 = env.repo.commit("web v1")?;
        env.start_agent_with(FLAGS)?;
        let first = env.converged(&v1, 2, None)?;
        let release = releases(env)?[0]["id"].as_i64().ok_or("release id")?;
        let post = format!("{scope}-web-release.{release}-post");
        let order = wait_until(LIMIT, "post_command to start", || {
            let names = started(&events).ok()?;
            names.contains(&post).then_some(names)
        })?;
        let pre_at = position(&order, &format!("{scope}-web-release.{release}-pre"))?;
        let command_at = position(&order, &format!("{scope}-web-release.{release}"))?;
        let post_at = position(&order, &post)?;
        assert!(pre_at < command_at, "{order:?}");
        for replica in &first {
            let rid = replica.name.rsplit('.').next().ok_or("replica id")?;
            let init_first = position(&order, &format!("{scope}-web-init-first-{rid}"))?;
            let init_second = position(&order, &format!("{scope}-web-init-second-{rid}"))?;
            let main = position(&order, &replica.name)?;
            assert!(
                command_at < init_first && init_first < init_second && init_second < main,
                "{order:?}"
            );
            assert!(main < post_at, "{order:?}");
        }
        let success = wait_until(LIMIT, "the success delivery", || {
            deliveries(&capture, "/deployed")
                .ok()
                .filter(|list| !list.is_empty())
        })?;
        let (request, body) = &success[0];
        assert_eq!(request.method, "POST");
        assert_eq!(request.headers["user-agent"], "voodu-deploy-webhook");
        assert_eq!(body["kind"], "deployment");
        assert_eq!(body["scope"], scope.as_str());
        assert_eq!(body["name"], "web");
        assert_eq!(body["status"], "success");
        assert_eq!(body["release_id"], release.to_string());
        assert_eq!(body["image"], test_image());
        eprintln!("on_deploy success body: {}", request.body);

        // 2. A failing pre_command: the release fails before any replica is touched.
        env.repo.write(
            "app/web.hcl",
            &web(env, &capture, "2", r#"["sh", "-c", "exit 3"]"#, OK, OK),
        )?;
        env.repo.commit("web v2: pre_command fails")?;
        let failed = wait_until(LIMIT, "the pre_command failure", || {
            let newest = releases(env).ok()?.into_iter().next()?;
            (newest["phase"] == "failed").then_some(newest)
        })?;
        let message = failed["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("pre_command") && message.contains("exit code 3"),
            "{message}"
        );
        let failure = wait_until(LIMIT, "the failure delivery", || {
            deliveries(&capture, "/failed")
                .ok()
                .filter(|list| !list.is_empty())
        })?;
        assert_eq!(failure[0].1["status"], "failure");
        assert!(
            failure[0].1["error"]
                .as_str()
                .is_some_and(|error| error.contains("pre_command")),
            "{}",
            failure[0].0.body
        );
        let ids = |rows: &[Row]| rows.iter().map(|row| row.id.clone()).collect::<Vec<_>>();
        let kept = replicas(env)?;
        assert_eq!(
            ids(&kept),
            ids(&first),
            "the previous replicas keep running"
        );
        assert!(kept.iter().all(|row| row.state == "running"));

        // 3. A failing post_command is recorded, and the release stands.
        env.repo.write(
            "app/web.hcl",
            &web(env, &capture, "3", OK, r#"["sh", "-c", "exit 4"]"#, OK),
        )?;
        let v3 = env.repo.commit("web v3: post_command fails")?;
        let third = env.converged(&v3, 2, None)?;
        let newest = wait_until(
            LIMIT,
            "release 3 to succeed with its post_command run",
            || {
                let newest = releases(env).ok()?.into_iter().next()?;
                (newest["phase"] == "succeeded" && newest["hooks"].get("post_command").is_some())
                    .then_some(newest)
            },
        )?;
        assert_eq!(newest["commit"], v3.as_str());
        assert_eq!(newest["hooks"]["post_command"]["exit_code"], 4, "{newest}");
        assert_eq!(newest["hooks"]["pre_command"]["exit_code"], 0, "{newest}");
        assert_eq!(newest["hooks"]["command"]["exit_code"], 0, "{newest}");
        assert!(
            newest["message"]
                .as_str()
                .is_some_and(|message| message.contains("post_command failed: exit code 4")),
            "{newest}"
        );

        // 4. A bucket change rolls the replicas that read it, without a commit.
        let bucket = format!("{scope}/web");
        env.cli(&["config", "set", &bucket, "GREETING=hello"])?;
        let rolled = wait_until(LIMIT, "replicas with the new bucket value", || {
            let rows = replicas(env).ok()?;
            let fresh = rows.len() == 2
                && rows.iter().all(|row| {
                    row.state == "running"
                        && third.iter().all(|old| old.id != row.id)
                        && env_of(&row.id)
                            .is_ok_and(|env| env.contains(&"GREETING=hello".to_owned()))
                });
            fresh.then_some(rows)
        })?;
        assert_eq!(rolled.len(), 2);

        // 5. A failing init container: the new replica never starts, the rollout fails on
        //    its deadline and is rolled back; the replicas run the last good spec again.
        env.repo.write(
            "app/web.hcl",
            &web(env, &capture, "4", OK, OK, r#"["sh", "-c", "exit 5"]"#),
        )?;
        let v4 = env.repo.commit("web v4: init second fails")?;
        let list = wait_until(LIMIT, "the rollback after the init failure", || {
            let list = releases(env).ok()?;
            let phases: Vec<&str> = list
                .iter()
                .take(2)
                .filter_map(|release| release["phase"].as_str())
                .collect();
            (phases == ["succeeded", "failed"] && list[1]["commit"] == v4.as_str()).then_some(list)
        })?;
        let failed = list[1]["message"].as_str().unwrap_or_default();
        assert!(
            failed.contains("rollout deadline")
                && failed
                    .contains(r#"init container "second" failed after 1 attempt(s): exit code 5"#),
            "{failed}"
        );
        eprintln!("init failure: release #{} {failed}", list[1]["id"]);
        assert!(list[0]["rolled_back_from"].is_i64(), "{:?}", list[0]);
        wait_until(LIMIT, "two replicas of the rolled-back spec", || {
            let rows = replicas(env).ok()?;
            let resource = env.resource().ok()??;
            (rows.len() == 2
                && rows.iter().all(|row| row.state == "running")
                && resource["phase"] == "Ready"
                && rows
                    .iter()
                    .all(|row| Some(row.hash.as_str()) == resource["spec_hash"].as_str())
                && rows[0].hash == third[0].hash)
                .then_some(())
        })?;
        eprintln!(
            "hooks: start order {} containers; deliveries: {} success, {} failure",
            started(&events)?.len(),
            deliveries(&capture, "/deployed")?.len(),
            deliveries(&capture, "/failed")?.len()
        );
        Ok(())
    })
}
