//! Jobs and cronjobs end to end: the real `voodu-agent` binary over a real git repo driving a
//! real Docker engine. A job that succeeds and one that fails keep their history (exit code,
//! duration, the tail of their logs) in `status --json`; a job past its timeout is removed and
//! fails; a changed job runs again; a removed job takes its containers; a `* * * * *`
//! cronjob fires within the test (voodu's grammar has minute granularity: within 60 s).

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

const AGENT: &str = env!("CARGO_BIN_EXE_voodu-agent");
/// Liveness bound of one wait (a minutely cronjob needs up to 60 s plus its run).
const LIMIT: Duration = Duration::from_secs(100);

/// The agent child (killed first on drop, so nothing recreates what the guard then removes),
/// a repo, a data dir and the scope's guard.
struct Env {
    agent: Option<Child>,
    guard: DockerGuard,
    repo: TempRepo,
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> TestResult<Env> {
        Ok(Env {
            agent: None,
            guard: DockerGuard::new(&unique("j")),
            repo: TempRepo::new()?,
            dir: tempfile::tempdir()?,
        })
    }

    fn scope(&self) -> &str {
        &self.guard.scope
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("agent.log")
    }

    fn start_agent(&mut self) -> TestResult {
        let stderr = File::create(self.log())?;
        self.agent = Some(
            Command::new(AGENT)
                .args(["--repo", &self.repo.url(), "--interval", "1s"])
                .args(["--listen", "127.0.0.1:0", "--data-dir"])
                .arg(self.data_dir())
                .env("RUST_LOG", "info,voodu_agent=debug")
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()?,
        );
        Ok(())
    }

    /// Runs a scenario; on failure prints the agent log, status and containers.
    fn run(mut self, scenario: impl FnOnce(&mut Env) -> TestResult) -> TestResult {
        let result = scenario(&mut self);
        if result.is_err() {
            let log = std::fs::read_to_string(self.log()).unwrap_or_default();
            eprintln!("---- agent log ----\n{log}");
            eprintln!("---- status ----\n{:#?}", self.status());
            eprintln!("---- docker ps -a ----\n{:?}", self.containers("job"));
        }
        result
    }

    /// `voodu-agent status --json`.
    fn status(&self) -> TestResult<Value> {
        let output = Command::new(AGENT)
            .args(["status", "--json", "--data-dir"])
            .arg(self.data_dir())
            .output()?;
        if !output.status.success() {
            return Err(
                format!("status failed: {}", String::from_utf8_lossy(&output.stderr)).into(),
            );
        }
        Ok(serde_json::from_slice(&output.stdout)?)
    }

    /// `kind/scope/name` in `status --json`, once the agent has written it.
    fn resource(&self, kind: &str, name: &str) -> Option<Value> {
        let status = self.status().ok()?;
        status["resources"].as_array()?.iter().find_map(|resource| {
            (resource["kind"] == kind
                && resource["scope"] == self.scope()
                && resource["name"] == name)
                .then(|| resource.clone())
        })
    }

    /// Waits until the resource's newest run has ended (with `runs` runs in its history).
    fn ended(&self, kind: &str, name: &str, runs: usize) -> TestResult<Value> {
        wait_until(
            LIMIT,
            &format!("{runs} ended run(s) of {kind} {name}"),
            || {
                let resource = self.resource(kind, name)?;
                let history = resource["detail"]["history"].as_array()?;
                let ended = history.len() == runs
                    && history[0]["status"] != "running"
                    && resource["running_replicas"] == 0;
                ended.then_some(resource)
            },
        )
    }

    /// `(name, state, labels…)` of the scope's containers of `kind`.
    fn containers(&self, kind: &str) -> TestResult<Vec<Vec<String>>> {
        let output = Command::new("docker")
            .args(["ps", "-a", "--filter"])
            .arg(format!("label=voodu.scope={}", self.scope()))
            .args(["--filter", &format!("label=voodu.kind={kind}")])
            .args([
                "--format",
                r#"{{.Names}} {{.State}} {{.Label "voodu.role"}} {{.Label "voodu.replica_id"}} {{.Label "voodu.spec_hash"}}"#,
            ])
            .output()?;
        Ok(String::from_utf8(output.stdout)?
            .lines()
            .map(|line| line.split(' ').map(ToOwned::to_owned).collect())
            .collect())
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let _ = agent.kill();
            let _ = agent.wait();
        }
    }
}

fn job(scope: &str, name: &str, body: &str) -> String {
    format!(
        r#"job "{scope}" "{name}" {{
  image = "{}"
{body}
}}
"#,
        test_image()
    )
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn jobs_on_docker_keep_their_history() -> TestResult {
    Env::new()?.run(jobs_on_docker)
}

fn jobs_on_docker(env: &mut Env) -> TestResult {
    let scope = env.scope().to_owned();
    env.repo.write(
        "jobs/ok.hcl",
        &job(
            &scope,
            "ok",
            r#"  command = ["sh", "-c", "echo hello; echo world"]"#,
        ),
    )?;
    env.repo.write(
        "jobs/bad.hcl",
        &job(
            &scope,
            "bad",
            r#"  command = ["sh", "-c", "echo oops >&2; exit 7"]"#,
        ),
    )?;
    env.repo.write(
        "jobs/slow.hcl",
        &job(
            &scope,
            "slow",
            r#"  command = ["sleep", "300"]
  timeout = "2s""#,
        ),
    )?;
    env.repo.commit("three jobs")?;
    env.start_agent()?;

    let ok = env.ended("job", "ok", 1)?;
    let run = &ok["detail"]["history"][0];
    assert_eq!(ok["phase"], "Succeeded");
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["exit_code"], 0);
    assert_eq!(run["logs_tail"], "hello\nworld\n");
    assert!(
        run["duration_seconds"].as_i64().is_some_and(|d| d >= 0),
        "{run}"
    );
    let run_id = run["run_id"].as_str().ok_or("run id")?.to_owned();
    assert_eq!(run["container"], format!("{scope}-ok.{run_id}"));

    let bad = env.ended("job", "bad", 1)?;
    let run = &bad["detail"]["history"][0];
    assert_eq!(bad["phase"], "Failed");
    assert_eq!(run["status"], "failed");
    assert_eq!(run["exit_code"], 7);
    assert_eq!(run["error"], "exit code 7");
    assert_eq!(run["logs_tail"], "oops\n");
    assert!(run["ended_at"].is_string() && run["started_at"].is_string());

    let slow = env.ended("job", "slow", 1)?;
    assert_eq!(slow["detail"]["history"][0]["error"], "timed out after 2s");

    // The runs that ended stay as exited containers (docker logs works); the timed-out one
    // was removed.
    let containers = env.containers("job")?;
    let names: Vec<&str> = containers.iter().map(|row| row[0].as_str()).collect();
    assert_eq!(containers.len(), 2, "{containers:?}");
    assert!(names.contains(&format!("{scope}-ok.{run_id}").as_str()));
    for row in &containers {
        assert_eq!(row[1], "exited", "{row:?}");
        assert_eq!(row[2], "job", "{row:?}");
        assert_eq!(row[4].len(), 64, "spec hash label: {row:?}");
    }

    // A changed job runs again; both runs are kept (successful_history_limit 3).
    env.repo.write(
        "jobs/ok.hcl",
        &job(&scope, "ok", r#"  command = ["sh", "-c", "echo again"]"#),
    )?;
    env.repo.commit("ok: again")?;
    let ok = env.ended("job", "ok", 2)?;
    assert_eq!(ok["detail"]["history"][0]["logs_tail"], "again\n");
    assert_eq!(ok["detail"]["history"][1]["run_id"], run_id.as_str());
    assert_ne!(
        ok["detail"]["history"][0]["spec_hash"],
        ok["detail"]["history"][1]["spec_hash"]
    );

    // Jobs leaving the repo take their containers and status.
    for file in ["jobs/ok.hcl", "jobs/bad.hcl", "jobs/slow.hcl"] {
        env.repo.remove(file)?;
    }
    env.repo.commit("no jobs")?;
    wait_until(LIMIT, "the jobs' containers and status gone", || {
        let gone = env.containers("job").ok()?.is_empty()
            && ["ok", "bad", "slow"]
                .iter()
                .all(|name| env.resource("job", name).is_none());
        gone.then_some(())
    })?;
    Ok(())
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_cronjob_fires_on_docker_within_a_minute() -> TestResult {
    Env::new()?.run(cronjob_on_docker)
}

fn cronjob_on_docker(env: &mut Env) -> TestResult {
    let scope = env.scope().to_owned();
    env.repo.write(
        "cron.hcl",
        &format!(
            r#"cronjob "{scope}" "tick" {{
  schedule = "* * * * *"
  image = "{}"
  command = ["sh", "-c", "echo tick"]
}}
"#,
            test_image()
        ),
    )?;
    env.repo.commit("a minutely cronjob")?;
    env.start_agent()?;
    let scheduled = wait_until(LIMIT, "the cronjob's first position", || {
        env.resource("cronjob", "tick")
            .filter(|resource| resource["detail"]["next_run"].is_string())
    })?;
    assert_eq!(scheduled["detail"]["timezone"], "UTC");
    // Seen before its first tick (unless the agent started a hair before a minute boundary
    // and the tick beat this read), it is scheduled for the next minute and fires then.
    let expected = scheduled["detail"]["history"]
        .as_array()
        .is_some_and(Vec::is_empty)
        .then(|| scheduled["detail"]["next_run"].clone());
    if expected.is_some() {
        assert_eq!(scheduled["phase"], "Scheduled");
        assert_eq!(scheduled["detail"]["last_scheduled"], Value::Null);
    }
    let fired = env.ended("cronjob", "tick", 1)?;
    let run = &fired["detail"]["history"][0];
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["logs_tail"], "tick\n");
    if let Some(next_run) = expected {
        assert_eq!(
            fired["detail"]["last_scheduled"], next_run,
            "it fired for the scheduled minute"
        );
    }
    let containers = env.containers("cronjob")?;
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(containers[0][2], "cronjob");
    assert_eq!(
        containers[0][0],
        format!(
            "{scope}-tick.{}",
            run["run_id"].as_str().unwrap_or_default()
        )
    );
    Ok(())
}
