//! A fleet of agents on one repository (issue 16, scope 1): each host applies the shared
//! manifests and its own `hosts/<name>/` (and `labels/<label>/`), a broken host manifest is
//! rejected on that host only, and `fleet status` reads every agent's `/status` into one
//! table. Agents run in process on the fake runtime; `fleet status` is the real binary.
//! The 20-agent figures on the real engine are `benches/fleet.rs`.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use voodu_agent::model::HostSelection;
use voodu_agent::runtime::FakeRuntime;
use voodu_agent::store::Store;

use crate::support::agent::fake_agent_config;
use crate::support::http::Capture;
use crate::support::{TempRepo, TestResult, until};

/// One in-process agent of the fleet.
struct Host {
    address: SocketAddr,
    store: Store,
    data: Arc<tempfile::TempDir>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Host {
    async fn start(repo: &TempRepo, name: &str, labels: &[&str]) -> TestResult<Host> {
        Host::start_in(Arc::new(tempfile::tempdir()?), repo, name, labels).await
    }

    /// Starts an agent on `data` (a data dir another agent may have used before).
    async fn start_in(
        data: Arc<tempfile::TempDir>,
        repo: &TempRepo,
        name: &str,
        labels: &[&str],
    ) -> TestResult<Host> {
        // A restart on a data dir: the previous agent's lock must be gone first.
        crate::support::agent::wait_data_dir_unlocked(data.path())?;
        let labels: Vec<String> = labels.iter().map(|label| (*label).to_owned()).collect();
        let config = voodu_agent::agent::AgentConfig {
            hosts: HostSelection::for_host(name, &labels)?,
            ..fake_agent_config(repo, data.path())
        };
        let state_db = config.state_db();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(voodu_agent::agent::run_with_runtime(
            config,
            Arc::new(FakeRuntime::new()),
            Some(listener),
            shutdown.clone().cancelled_owned(),
        ));
        let store = until(
            Duration::from_secs(30),
            Duration::from_millis(10),
            "state.db",
            || {
                Ok(state_db
                    .exists()
                    .then(|| Store::open(&state_db).ok())
                    .flatten())
            },
        )
        .await?;
        Ok(Host {
            address,
            store,
            data,
            shutdown,
            task,
        })
    }

    /// Waits until the agent has seen `sha` (applied or rejected); whether it applied it.
    async fn seen(&self, sha: &str) -> TestResult<bool> {
        until(
            Duration::from_secs(30),
            Duration::from_millis(10),
            &format!("commit {sha} seen"),
            || {
                if self.task.is_finished() {
                    return Err("the agent stopped before seeing the commit".into());
                }
                let summary = self.store.commit_summary()?;
                Ok(summary
                    .last_seen
                    .filter(|seen| seen.sha.as_str() == sha)
                    .map(|seen| seen.applied))
            },
        )
        .await
    }

    fn names(&self) -> TestResult<Vec<String>> {
        let mut names: Vec<String> = self
            .store
            .desired_keys()?
            .into_iter()
            .map(|key| key.name)
            .collect();
        names.sort();
        Ok(names)
    }

    async fn stop(self) -> TestResult {
        self.shutdown.cancel();
        self.task.await??;
        Ok(())
    }
}

fn deployment(name: &str) -> String {
    format!(
        "deployment \"shop\" \"{name}\" {{\n  image = \"busybox\"\n  command = [\"sleep\", \"3600\"]\n}}\n"
    )
}

fn statefulset(name: &str) -> String {
    format!(
        "statefulset \"shop\" \"{name}\" {{\n  image = \"busybox\"\n  command = [\"sleep\", \"3600\"]\n  replicas = 1\n}}\n"
    )
}

fn fleet_status(file: &std::path::Path, extra: &[&str]) -> TestResult<(bool, String, String)> {
    let output = Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
        .args(["fleet", "status", "--agents"])
        .arg(file)
        .args(extra)
        .output()?;
    Ok((
        output.status.success(),
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_host_applies_its_own_set_and_a_broken_host_manifest_is_rejected_there_only()
-> TestResult {
    let repo = TempRepo::new()?;
    repo.write("common/web.hcl", &deployment("web"))?
        .write("hosts/a/db.hcl", &statefulset("db-a"))?
        .write("hosts/b/db.hcl", &statefulset("db-b"))?
        .write("labels/edge/proxy.hcl", &deployment("edge"))?;
    let first = repo.commit("a fleet")?;
    let a = Host::start(&repo, "a", &["edge"]).await?;
    let b = Host::start(&repo, "b", &[]).await?;
    let c = Host::start(&repo, "c", &[]).await?;
    for host in [&a, &b, &c] {
        assert!(
            host.seen(&first).await?,
            "the first commit is applied everywhere"
        );
    }
    assert_eq!(a.names()?, ["db-a", "edge", "web"]);
    assert_eq!(b.names()?, ["db-b", "web"]);
    assert_eq!(c.names()?, ["web"]);

    // A mistake in b's directory: b rejects the commit and keeps running the first one; a
    // and c never read that file and apply the commit (with its shared change).
    repo.write(
        "hosts/b/broken.hcl",
        "deployment \"shop\" \"x\" {\n  imag = \"busybox\"\n}\n",
    )?
    .write("common/api.hcl", &deployment("api"))?;
    let second = repo.commit("break b, add api")?;
    assert!(a.seen(&second).await?);
    assert!(!b.seen(&second).await?, "b rejects the commit");
    assert!(c.seen(&second).await?);
    assert_eq!(a.names()?, ["api", "db-a", "edge", "web"]);
    assert_eq!(b.names()?, ["db-b", "web"], "b keeps its last good set");
    assert_eq!(c.names()?, ["api", "web"]);
    let rejected = b
        .store
        .commit_summary()?
        .last_rejected
        .ok_or("b recorded no rejection")?;
    assert!(
        rejected
            .errors
            .iter()
            .all(|error| error.path == "hosts/b/broken.hcl"),
        "{:?}",
        rejected.errors
    );

    // `fleet status` over the three, an agent that is not there and one that never answers.
    let dir = tempfile::tempdir()?;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    let file = dir.path().join("fleet");
    std::fs::write(
        &file,
        format!(
            "# the test fleet\na http://{}\nb http://{}/\nc http://{}\ngone http://{closed}\nsilent http://{}\n",
            a.address,
            b.address,
            c.address,
            silent.local_addr()?
        ),
    )?;
    // The table is read at the same time (each waits out the silent agent's 2 s).
    let table_run = Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
        .args(["fleet", "status", "--agents"])
        .arg(&file)
        .args(["--timeout", "2s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let (ok, stdout, stderr) = fleet_status(&file, &["--json", "--timeout", "2s"])?;
    assert!(ok, "{stderr}");
    let view: serde_json::Value = serde_json::from_str(&stdout)?;
    let agents = view["agents"].as_array().ok_or("no agents")?;
    let state = |name: &str| {
        agents
            .iter()
            .find(|agent| agent["name"] == name)
            .map(|agent| agent["state"].as_str().unwrap_or_default().to_owned())
    };
    assert_eq!(view["newest"], second.as_str());
    assert_eq!(state("b").as_deref(), Some("rejected"), "{stdout}");
    assert_eq!(state("gone").as_deref(), Some("unreachable"));
    assert_eq!(state("silent").as_deref(), Some("unreachable"));
    for name in ["a", "c"] {
        // Ready or still converging on the fake runtime, never behind or rejected.
        let seen = state(name).unwrap_or_default();
        assert!(
            ["ok", "progressing"].contains(&seen.as_str()),
            "{name}: {stdout}"
        );
    }
    let b_row = agents
        .iter()
        .find(|agent| agent["name"] == "b")
        .ok_or("no b")?;
    assert_eq!(b_row["host"], "b");
    assert_eq!(b_row["applied"], first.as_str());
    assert!(
        b_row["rejected"]["errors"][0]
            .as_str()
            .is_some_and(|error| error.starts_with("hosts/b/broken.hcl:2:3: ")),
        "{stdout}"
    );
    let silent_row = agents
        .iter()
        .find(|agent| agent["name"] == "silent")
        .ok_or("no row")?;
    assert_eq!(silent_row["error"], "no answer within 2s", "{stdout}");

    // The table: one row per agent and the tally.
    let output = table_run.wait_with_output()?;
    let table = String::from_utf8(output.stdout)?;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        table.contains("5 agents: ") && table.contains("1 rejected, 2 unreachable"),
        "{table}"
    );
    let b_line = table
        .lines()
        .find(|line| line.starts_with("b "))
        .ok_or("no b line")?;
    assert!(
        b_line.contains("rejected") && b_line.contains("hosts/b/broken.hcl:2:3"),
        "{b_line}"
    );

    // `status` says which host an agent is.
    let (_, body) = crate::support::http::get(
        &crate::support::http::client()?,
        &format!("http://{}/status", a.address),
    )
    .await?;
    let status: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(status["host"], "a");
    assert_eq!(status["host_labels"], serde_json::json!(["edge"]));

    for host in [a, b, c] {
        host.stop().await?;
    }
    drop(silent);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_renamed_on_its_data_dir_judges_the_last_commit_again() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("common/web.hcl", &deployment("web"))?
        .write("hosts/a/db.hcl", &statefulset("db-a"))?
        .write("hosts/b/db.hcl", &statefulset("db-b"))?;
    let sha = repo.commit("two hosts")?;
    let a = Host::start(&repo, "a", &[]).await?;
    assert!(a.seen(&sha).await?);
    assert_eq!(a.names()?, ["db-a", "web"]);
    let data = a.data.clone();
    a.stop().await?;
    // Same data dir, same commit, now host b: the commit is read again for b.
    let b = Host::start_in(data, &repo, "b", &[]).await?;
    until(
        Duration::from_secs(30),
        Duration::from_millis(10),
        "b's set",
        || {
            if b.task.is_finished() {
                return Err("agent b stopped".into());
            }
            Ok((b.names()? == ["db-b", "web"]).then_some(()))
        },
    )
    .await?;
    assert_eq!(
        b.store
            .host_selection()?
            .and_then(|hosts| hosts.host)
            .as_deref(),
        Some("b")
    );
    b.stop().await
}

#[test]
fn fleet_status_sends_each_token_and_never_prints_it() -> TestResult {
    let capture = Capture::start()?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("web.token"), "s3cret-token\n")?;
    let file = dir.path().join("fleet");
    std::fs::write(&file, format!("web {} web.token\n", capture.url("")))?;
    let (ok, stdout, stderr) = fleet_status(&file, &["--timeout", "5s"])?;
    assert!(ok, "{stderr}");
    let requests = capture.received();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/status");
    assert_eq!(
        requests[0].headers.get("authorization").map(String::as_str),
        Some("Bearer s3cret-token")
    );
    // The capture answers an empty body: the row says why, and no output names the token.
    assert!(
        stdout.contains("not a voodu-agent status document"),
        "{stdout}"
    );
    assert!(!stdout.contains("s3cret") && !stderr.contains("s3cret"));
    // A missing token file is that row's error, naming the file.
    std::fs::write(&file, format!("web {} missing.token\n", capture.url("")))?;
    let (ok, stdout, _) = fleet_status(&file, &[])?;
    assert!(ok);
    assert!(stdout.contains("cannot read token file"), "{stdout}");
    Ok(())
}

#[test]
fn plan_and_validate_take_a_host() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("common/web.hcl", &deployment("web"))?
        .write("hosts/a/db.hcl", &statefulset("db-a"))?
        .write("hosts/b/db.hcl", &statefulset("db"))?
        .write("hosts/c/db.hcl", &statefulset("db"))?;
    let data = tempfile::tempdir()?;
    let run = |args: &[&str]| -> TestResult<(Option<i32>, String)> {
        let output = Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .args(args)
            .arg("--data-dir")
            .arg(data.path())
            .current_dir(repo.work())
            .output()?;
        Ok((
            output.status.code(),
            String::from_utf8(output.stdout)? + &String::from_utf8(output.stderr)?,
        ))
    };
    let (code, plan) = run(&["plan", "--host", "a"])?;
    assert_eq!(code, Some(0), "{plan}");
    assert!(plan.contains("on host a:"), "{plan}");
    assert!(plan.contains("statefulset/shop/db-a") && plan.contains("deployment/shop/web"));
    assert!(!plan.contains("statefulset/shop/db "), "{plan}");
    // b and c declare the same key: validated host by host, both are fine.
    let (code, out) = run(&["validate"])?;
    assert_eq!(code, Some(0), "{out}");
    for host in ["a", "b", "c"] {
        assert!(
            out.contains(&format!(
                "hosts/{host}/ with the shared manifests: ok: 2 resources"
            )),
            "{out}"
        );
    }
    repo.write(
        "hosts/c/bad.hcl",
        "job \"shop\" \"j\" {\n  imagee = \"x\"\n}\n",
    )?;
    let (code, out) = run(&["validate"])?;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("hosts/c/bad.hcl:2:3: "), "{out}");
    assert!(
        out.contains("hosts/a/ with the shared manifests: ok"),
        "{out}"
    );
    let (code, out) = run(&["validate", "--host", "a"])?;
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = run(&["validate", "--host", "Not_A_Label"])?;
    assert_eq!(code, Some(1));
    assert!(out.contains("is not a DNS label"), "{out}");
    Ok(())
}
