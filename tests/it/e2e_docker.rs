//! The walking skeleton, accepted end to end: the real `voodu-agent` binary watching a real
//! git repo (`file://`) and driving a real Docker engine. Push deploys, an edit rolls out one
//! replica at a time, scaling keeps survivors, a broken commit changes nothing, deleting the
//! manifest prunes, `git revert` brings it back; and a `kill -9` mid-rollout converges after a
//! restart without duplicates.
//!
//! Releases and rollback, the same way: `git revert` is an ordinary rollout that `releases`
//! shows; `voodu-agent rollback` re-applies an earlier release and pins the resource until a
//! commit changes it in git or `voodu-agent unpin`.
//!
//! State is read the way an operator would: `voodu-agent status --json`, `releases --json`,
//! the agent's `/status`, and `docker ps`. Limits in `wait_until` are liveness bounds, not
//! timing assertions.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use voodu_agent::http::WebhookSecret;

use crate::support::http::{get, memory_of, metric, parse_metrics};
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

pub(crate) const AGENT: &str = env!("CARGO_BIN_EXE_voodu-agent");
const LIMIT: Duration = Duration::from_secs(60);

/// One container of the scope, as `docker ps -a` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) state: String,
    pub(crate) hash: String,
}

/// The agent child process; killed (SIGKILL) and reaped on drop.
pub(crate) struct Agent {
    child: Child,
}

impl Agent {
    pub(crate) fn start(
        repo: &TempRepo,
        data_dir: &Path,
        log: &Path,
        extra: &[&str],
    ) -> TestResult<Agent> {
        let stderr = File::options().create(true).append(true).open(log)?;
        // A 1 s poll unless the caller sets its own interval.
        let interval: &[&str] = if extra.contains(&"--interval") {
            &[]
        } else {
            &["--interval", "1s"]
        };
        let child = Command::new(AGENT)
            .args(extra)
            .args(interval)
            .args(["--repo", &repo.url(), "--listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data_dir)
            .env("RUST_LOG", "info,voodu_agent=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()?;
        Ok(Agent { child })
    }

    /// SIGKILL, no chance to clean up.
    fn kill_9(&mut self) -> TestResult {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `docker events` stream for the scope, written to a file; killed on drop.
pub(crate) struct Events {
    child: Child,
    out: PathBuf,
}

/// One container event: when (unix seconds), the action, the container's name, and the signal
/// of a `kill` (`<no value>` for the others).
pub(crate) type TimedEvent = (f64, String, String, String);

impl Events {
    /// Streams events from `since` on: `--since` replays what happened before the stream
    /// subscribed, so no event is lost to the subscription racing the test. Start it before the
    /// change whose events a test reads: the engine keeps only its last 256 events for a later
    /// `docker events --since` query, and the tests beside this one can push a roll's first
    /// events out of them.
    pub(crate) fn start(scope: &str, since: SystemTime, out: PathBuf) -> TestResult<Events> {
        let since = since.duration_since(UNIX_EPOCH)?;
        let since = format!("{}.{:09}", since.as_secs(), since.subsec_nanos());
        let child = Command::new("docker")
            .args(["events", "--since", &since])
            .args([
                "--filter",
                &format!("label=voodu.scope={scope}"),
                "--filter",
                "type=container",
            ])
            .args([
                "--format",
                "{{.TimeNano}} {{.Action}} {{.Actor.Attributes.name}} {{.Actor.Attributes.signal}}",
            ])
            .stdin(Stdio::null())
            .stdout(File::create(&out)?)
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Events { child, out })
    }

    /// The events seen so far, in order.
    pub(crate) fn timed(&self) -> TestResult<Vec<TimedEvent>> {
        Ok(std::fs::read_to_string(&self.out)?
            .lines()
            .filter_map(|line| {
                let mut parts = line.splitn(4, ' ');
                let nanos: f64 = parts.next()?.parse().ok()?;
                Some((
                    nanos / 1e9,
                    parts.next()?.to_owned(),
                    parts.next()?.to_owned(),
                    parts.next().unwrap_or_default().to_owned(),
                ))
            })
            .collect())
    }

    /// `(action, container name)` pairs seen so far.
    pub(crate) fn seen(&self) -> TestResult<Vec<(String, String)>> {
        Ok(self
            .timed()?
            .into_iter()
            .map(|(_, action, name, _)| (action, name))
            .collect())
    }

    /// The events seen once `done` holds for them (the stream reaches the file a moment after
    /// the engine acted), or what was seen after `limit`.
    pub(crate) fn timed_once(
        &self,
        limit: Duration,
        done: impl Fn(&[TimedEvent]) -> bool,
    ) -> TestResult<Vec<TimedEvent>> {
        wait_until(limit, "the event stream", || {
            let events = self.timed().ok()?;
            done(&events).then_some(events)
        })
        .or_else(|_| self.timed())
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temp repo, a temp data dir, a scope, and the agent. Field order is drop order: the agent
/// dies before `DockerGuard` removes the scope's containers, so nothing recreates them.
pub(crate) struct Env {
    pub(crate) agent: Option<Agent>,
    pub(crate) guard: DockerGuard,
    pub(crate) repo: TempRepo,
    pub(crate) dir: tempfile::TempDir,
}

impl Env {
    pub(crate) fn new() -> TestResult<Env> {
        let scope = unique("t");
        Ok(Env {
            agent: None,
            guard: DockerGuard::new(&scope),
            repo: TempRepo::new()?,
            dir: tempfile::tempdir()?,
        })
    }

    pub(crate) fn scope(&self) -> &str {
        &self.guard.scope
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub(crate) fn log(&self) -> PathBuf {
        self.dir.path().join("agent.log")
    }

    pub(crate) fn start_agent(&mut self) -> TestResult {
        self.start_agent_with(&[])
    }

    pub(crate) fn start_agent_with(&mut self, extra: &[&str]) -> TestResult {
        self.agent = Some(Agent::start(
            &self.repo,
            &self.data_dir(),
            &self.log(),
            extra,
        )?);
        Ok(())
    }

    /// Runs a scenario; on failure (an error or a failed assertion) prints the agent log,
    /// status and containers.
    pub(crate) fn run(mut self, scenario: impl FnOnce(&mut Env) -> TestResult) -> TestResult {
        let result = scenario(&mut self);
        if result.is_err() {
            self.dump();
        }
        result
    }

    pub(crate) fn dump(&self) {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        eprintln!("---- agent log ({}) ----\n{log}", self.log().display());
        eprintln!("---- status ----\n{:#?}", self.status());
        eprintln!("---- docker ps -a ----\n{:#?}", self.containers());
    }

    /// `docker ps -a` for the scope, sorted by name.
    pub(crate) fn containers(&self) -> TestResult<Vec<Row>> {
        let output = Command::new("docker")
            .args([
                "ps",
                "-a",
                "--no-trunc",
                "--filter",
                &format!("label=voodu.scope={}", self.scope()),
            ])
            .args([
                "--format",
                r#"{{.ID}} {{.Names}} {{.State}} {{.Label "voodu.manifest_hash"}}"#,
            ])
            .output()?;
        if !output.status.success() {
            return Err(format!(
                "docker ps failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )
            .into());
        }
        let mut rows: Vec<Row> = String::from_utf8(output.stdout)?
            .lines()
            .map(|line| {
                let mut fields = line.split(' ').map(ToOwned::to_owned);
                Row {
                    id: fields.next().unwrap_or_default(),
                    name: fields.next().unwrap_or_default(),
                    state: fields.next().unwrap_or_default(),
                    hash: fields.next().unwrap_or_default(),
                }
            })
            .collect();
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(rows)
    }

    /// `voodu-agent status --json`; an error before the agent created its state.
    pub(crate) fn status(&self) -> TestResult<Value> {
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

    /// Runs a `voodu-agent` subcommand on this data dir; its stdout, or an error with stderr.
    pub(crate) fn cli(&self, args: &[&str]) -> TestResult<String> {
        let output = Command::new(AGENT)
            .args(args)
            .arg("--data-dir")
            .arg(self.data_dir())
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

    /// `voodu-agent releases <scope>/web --json`.
    pub(crate) fn releases(&self) -> TestResult<Value> {
        let reference = format!("{}/web", self.scope());
        Ok(serde_json::from_str(
            &self.cli(&["releases", &reference, "--json"])?,
        )?)
    }

    /// The address the running agent recorded for its HTTP side, once it accepts connections:
    /// just after a restart the store still names the stopped agent's address (killed and
    /// waited for, so nothing accepts there) until the new one records its own.
    pub(crate) fn http_address(&self) -> TestResult<String> {
        let recorded = || -> TestResult<String> {
            let store =
                voodu_agent::store::Store::open_read_only(&self.data_dir().join("state.db"))?;
            Ok(store
                .meta(voodu_agent::agent::META_HTTP_ADDR)?
                .ok_or("the agent recorded no HTTP address")?)
        };
        wait_until(
            LIMIT,
            "the agent's HTTP address to accept connections",
            || {
                let address = recorded().ok()?;
                let socket: std::net::SocketAddr = address.parse().ok()?;
                std::net::TcpStream::connect_timeout(&socket, Duration::from_secs(1)).ok()?;
                Some(address)
            },
        )
    }

    /// Waits until the running agent has counted `n` more syncs (polls) than now, on its
    /// `/metrics`: a counter, where a sleep would only hope a poll happened.
    pub(crate) fn polled(&self, n: u32) -> TestResult {
        let address = self.http_address()?;
        let syncs = || -> TestResult<f64> {
            let (_, text) = crate::support::http::get_blocking(&address, "/metrics")?;
            Ok(metric(&parse_metrics(&text)?, "voodu_syncs_total", &[]))
        };
        let target = syncs()? + f64::from(n);
        wait_until(LIMIT, &format!("{n} more polls"), || {
            syncs().ok().filter(|count| *count >= target)
        })?;
        Ok(())
    }

    /// This scope's `web` resource in `status --json`, if listed.
    pub(crate) fn resource(&self) -> TestResult<Option<Value>> {
        let status = self.status()?;
        let resources = status["resources"].as_array().cloned().unwrap_or_default();
        Ok(resources
            .into_iter()
            .find(|resource| resource["scope"] == self.scope() && resource["name"] == "web"))
    }

    pub(crate) fn write_web(&self, replicas: usize, v: &str) -> TestResult {
        let manifest = format!(
            r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = {replicas}
  env      = {{ V = "{v}" }}
}}
"#,
            scope = self.scope(),
            image = test_image(),
        );
        self.repo.write("app/web.hcl", &manifest)?;
        Ok(())
    }

    /// Waits until the scope has exactly `replicas` containers, all running with one hash
    /// (other than `not_hash`), and status shows the resource Ready with that hash and
    /// `replicas` running, `last_applied` at `sha`. Returns the containers.
    pub(crate) fn converged(
        &self,
        sha: &str,
        replicas: usize,
        not_hash: Option<&str>,
    ) -> TestResult<Vec<Row>> {
        let what = format!("{replicas} running replicas of commit {sha}");
        wait_until(LIMIT, &what, || {
            let rows = self.containers().ok()?;
            let status = self.status().ok()?;
            let resource = self.resource().ok()??;
            let hash = resource["spec_hash"].as_str()?;
            let ready = rows.len() == replicas
                && rows
                    .iter()
                    .all(|row| row.state == "running" && row.hash == hash)
                && not_hash != Some(hash)
                && resource["phase"] == "Ready"
                && resource["running_replicas"] == replicas
                && resource["desired_replicas"] == replicas
                && status["last_applied"]["sha"] == sha;
            ready.then_some(rows)
        })
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump();
        }
    }
}

fn ids(rows: &[Row]) -> BTreeSet<String> {
    rows.iter().map(|row| row.id.clone()).collect()
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn walking_skeleton_end_to_end() -> TestResult {
    Env::new()?.run(walking_skeleton)
}

fn walking_skeleton(env: &mut Env) -> TestResult {
    let scope = env.scope().to_owned();
    let prefix = format!("{scope}-web.");

    // a. push → two running replicas, Ready, release succeeded for the pushed commit.
    env.write_web(2, "1")?;
    let first = env.repo.commit("web: 2 replicas")?;
    env.start_agent()?;
    let rows = env.converged(&first, 2, None)?;
    let hash_1 = rows[0].hash.clone();
    assert!(
        rows.iter().all(|row| row.name.starts_with(&prefix)),
        "replica names: {rows:?}"
    );
    let release = wait_until(LIMIT, "release of the first commit to succeed", || {
        let release = env.resource().ok()??["release"].clone();
        (release["phase"] == "succeeded").then_some(release)
    })?;
    assert_eq!(release["commit"], first.as_str());

    // b. edit env → rolled out one slot at a time, each successor first (surge): create,
    //    destroy, create, destroy.
    let events = Events::start(&scope, SystemTime::now(), env.dir.path().join("events.log"))?;
    env.write_web(2, "2")?;
    let second = env.repo.commit("web: V=2")?;
    let rows = env.converged(&second, 2, Some(&hash_1))?;
    let hash_2 = rows[0].hash.clone();
    let rollout = wait_until(LIMIT, "docker events of the rollout", || {
        let seen: Vec<(String, String)> = events
            .seen()
            .ok()?
            .into_iter()
            .filter(|(action, name)| {
                name.starts_with(&prefix) && (action == "create" || action == "destroy")
            })
            .collect();
        (seen.len() >= 4).then_some(seen)
    })?;
    drop(events);
    let actions: Vec<&str> = rollout.iter().map(|(action, _)| action.as_str()).collect();
    assert_eq!(
        actions,
        ["create", "destroy", "create", "destroy"],
        "rollout events: {rollout:?}"
    );
    let created: BTreeSet<&str> = rollout
        .iter()
        .filter(|(a, _)| a == "create")
        .map(|(_, n)| n.as_str())
        .collect();
    let now: BTreeSet<&str> = rows.iter().map(|row| row.name.as_str()).collect();
    assert_eq!(
        created, now,
        "the created containers are the ones now running"
    );
    // Issue 24 item 5: a surge line names no old replica (which one goes is decided when the
    // successor is ready); each retired line names the replica it removed, each once.
    let log = std::fs::read_to_string(env.log())?;
    let surges: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("successor started (surge)"))
        .collect();
    assert_eq!(surges.len(), 2, "{surges:?}");
    assert!(
        surges.iter().all(|line| !line.contains("old=")),
        "{surges:?}"
    );
    for (_, destroyed) in rollout.iter().filter(|(action, _)| action == "destroy") {
        let retired = log
            .lines()
            .filter(|line| {
                line.contains("outdated replica retired") && line.contains(destroyed.as_str())
            })
            .count();
        assert_eq!(retired, 1, "{destroyed} retired once in the log:\n{log}");
    }
    let release = env.resource()?.ok_or("web is in status")?["release"].clone();
    assert_eq!(
        (release["commit"].as_str(), release["phase"].as_str()),
        (Some(second.as_str()), Some("succeeded"))
    );

    // c. scale 2 → 3: survivors keep their ids, one new replica, same hash.
    let before = ids(&rows);
    env.write_web(3, "2")?;
    let third = env.repo.commit("web: 3 replicas")?;
    let rows = env.converged(&third, 3, None)?;
    let hash_3 = rows[0].hash.clone();
    assert_eq!(hash_3, hash_2, "scaling does not change the spec hash");
    let after = ids(&rows);
    assert!(
        before.is_subset(&after),
        "survivors {before:?} kept in {after:?}"
    );
    assert_eq!(after.len(), 3);

    // d. a broken commit is rejected with path:line:col and changes nothing on the host.
    env.repo.write(
        "app/broken.hcl",
        r#"deployment "x" "y" {
  image = 
}
"#,
    )?;
    let broken = env.repo.commit("broken manifest")?;
    let rejected = wait_until(LIMIT, "the broken commit to be rejected", || {
        let status = env.status().ok()?;
        (status["last_rejected"]["sha"] == broken.as_str()).then(|| status["last_rejected"].clone())
    })?;
    assert_eq!(rejected["outcome"], "rejected");
    let errors: Vec<&str> = rejected["errors"]
        .as_array()
        .ok_or("errors")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !errors.is_empty() && errors.iter().all(|error| error.starts_with(BROKEN_AT)),
        "errors should point at {BROKEN_AT}: {errors:?}"
    );
    let diagnostic = &rejected["diagnostics"][0];
    assert_eq!(diagnostic["path"], "app/broken.hcl");
    assert_eq!(
        format!(
            "app/broken.hcl:{}:{}: ",
            diagnostic["line"], diagnostic["col"]
        ),
        BROKEN_AT,
        "diagnostics agree with errors"
    );
    let status = env.status()?;
    assert_eq!(
        status["last_applied"]["sha"],
        third.as_str(),
        "the host keeps the last good commit"
    );
    // Two more polls (so one whole cycle after the rejection): still nothing touched.
    env.polled(2)?;
    assert_eq!(
        env.containers()?,
        rows,
        "a rejected commit changes nothing on the host"
    );
    env.repo.remove("app/broken.hcl")?;
    let fixed = env.repo.commit("remove broken manifest")?;
    let rows = env.converged(&fixed, 3, None)?;
    assert_eq!(
        ids(&rows),
        after,
        "the fix commit changes nothing on the host either"
    );

    // e. delete the manifest → every container of the scope gone, and the resource.
    env.repo.remove("app/web.hcl")?;
    let deleted = env.repo.commit("remove web")?;
    wait_until(LIMIT, "web pruned", || {
        let pruned = env.containers().ok()?.is_empty()
            && env.resource().ok()?.is_none()
            && env.status().ok()?["last_applied"]["sha"] == deleted.as_str();
        pruned.then_some(())
    })?;

    // f. git revert of the delete → three replicas back, with the hash of step c.
    let reverted = env.repo.revert(&deleted)?;
    let rows = env.converged(&reverted, 3, None)?;
    assert!(
        rows.iter().all(|row| row.hash == hash_3),
        "revert restores hash {hash_3}: {rows:?}"
    );
    assert!(
        ids(&rows).is_disjoint(&after),
        "pruned containers do not come back; new ones do"
    );
    Ok(())
}

/// Where the parser reports the missing value in `app/broken.hcl`.
const BROKEN_AT: &str = "app/broken.hcl:2:11: ";

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn kill_9_during_rollout_converges_without_duplicates() -> TestResult {
    Env::new()?.run(kill_9_during_rollout)
}

fn kill_9_during_rollout(env: &mut Env) -> TestResult {
    env.write_web(4, "1")?;
    let first = env.repo.commit("web: 4 replicas")?;
    env.start_agent()?;
    let rows = env.converged(&first, 4, None)?;
    let hash_1 = rows[0].hash.clone();

    env.write_web(4, "2")?;
    let second = env.repo.commit("web: V=2")?;
    let at_kill = wait_until(LIMIT, "the first replica of the rollout", || {
        let rows = env.containers().ok()?;
        rows.iter()
            .any(|row| !row.hash.is_empty() && row.hash != hash_1)
            .then_some(rows)
    })?;
    env.agent.as_mut().ok_or("agent running")?.kill_9()?;
    let old_left = at_kill.iter().filter(|row| row.hash == hash_1).count();
    assert!(
        old_left > 0,
        "the kill must land mid-rollout, with old replicas left: {at_kill:#?}"
    );

    env.start_agent()?;
    let rows = env.converged(&second, 4, Some(&hash_1))?;
    // No leftovers and nothing on its way: stable after another whole poll cycle.
    env.polled(2)?;
    assert_eq!(env.containers()?, rows, "stable after convergence");
    let names: BTreeSet<&str> = rows.iter().map(|row| row.name.as_str()).collect();
    assert_eq!(names.len(), 4, "distinct replica names: {rows:?}");
    let release = env.resource()?.ok_or("web is in status")?["release"].clone();
    assert_eq!(
        (release["commit"].as_str(), release["phase"].as_str()),
        (Some(second.as_str()), Some("succeeded"))
    );
    Ok(())
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn git_revert_is_an_ordinary_rollout_the_release_list_shows() -> TestResult {
    Env::new()?.run(revert_flow)
}

fn revert_flow(env: &mut Env) -> TestResult {
    env.write_web(2, "1")?;
    let first = env.repo.commit("web: V=1")?;
    env.start_agent()?;
    let hash_1 = env.converged(&first, 2, None)?[0].hash.clone();
    env.write_web(2, "2")?;
    let second = env.repo.commit("web: V=2")?;
    let hash_2 = env.converged(&second, 2, Some(&hash_1))?[0].hash.clone();

    let reverted = env.repo.revert(&second)?;
    let rows = env.converged(&reverted, 2, Some(&hash_2))?;
    assert!(
        rows.iter().all(|row| row.hash == hash_1),
        "the revert runs the first spec again: {rows:?}"
    );
    let releases = wait_until(LIMIT, "the revert's release to succeed", || {
        let releases = env.releases().ok()?;
        (releases["releases"][0]["phase"] == "succeeded").then_some(releases)
    })?;
    let list: Vec<(&str, &str, &str)> = releases["releases"]
        .as_array()
        .ok_or("releases")?
        .iter()
        .map(|release| {
            (
                release["commit"].as_str().unwrap_or_default(),
                release["spec_hash"].as_str().unwrap_or_default(),
                release["phase"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        list,
        [
            (reverted.as_str(), hash_1.as_str(), "succeeded"),
            (second.as_str(), hash_2.as_str(), "succeeded"),
            (first.as_str(), hash_1.as_str(), "succeeded"),
        ]
    );
    let first_id = &releases["releases"][2]["id"];
    assert_eq!(
        releases["releases"][0]["message"],
        format!("same spec as release #{first_id} (commit {})", &first[..12])
    );
    assert_eq!(releases["releases"][0]["rolled_back_from"], Value::Null);
    assert_eq!(releases["pin"], Value::Null, "a revert pins nothing");
    let table = env.cli(&["releases", &format!("{}/web", env.scope())])?;
    assert!(table.contains(&reverted[..12]), "{table}");
    Ok(())
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn rollback_pins_until_unpin_or_a_commit_that_changes_the_resource() -> TestResult {
    Env::new()?.run(rollback_flow)
}

fn rollback_flow(env: &mut Env) -> TestResult {
    let reference = format!("{}/web", env.scope());
    env.write_web(2, "1")?;
    let first = env.repo.commit("web: V=1")?;
    env.start_agent()?;
    let hash_1 = env.converged(&first, 2, None)?[0].hash.clone();
    env.write_web(2, "2")?;
    let second = env.repo.commit("web: V=2")?;
    let hash_2 = env.converged(&second, 2, Some(&hash_1))?[0].hash.clone();

    // a. rollback → the first spec runs again, pinned; git (commit 2) now differs.
    let said = env.cli(&["rollback", &reference])?;
    assert!(
        said.contains(&format!("(commit {})", &first[..12])),
        "{said}"
    );
    assert!(said.contains("the agent is applying it now"), "{said}");
    let rows = env.converged(&second, 2, Some(&hash_2))?;
    assert!(rows.iter().all(|row| row.hash == hash_1), "{rows:?}");
    let pin = wait_until(LIMIT, "the pin in status", || {
        let resource = env.resource().ok()??;
        (resource["release"]["phase"] == "succeeded").then(|| resource["pin"].clone())
    })?;
    assert_eq!(pin["commit"], first.as_str());
    assert_eq!(pin["git_commit"], second.as_str());
    assert_eq!(pin["git_differs"], true);
    let releases = env.releases()?;
    assert_eq!(releases["releases"][0]["commit"], first.as_str());
    assert_eq!(releases["releases"][0]["phase"], "succeeded");
    assert_eq!(releases["releases"][1]["commit"], second.as_str());
    assert_eq!(releases["releases"][1]["phase"], "rolled-back");
    assert_eq!(
        releases["releases"][0]["rolled_back_from"],
        releases["releases"][1]["id"]
    );
    // The operator's view over HTTP is the document `status --json` prints. (A poll between
    // the two reads moves the health checks' times: those are left out. A pass between them
    // moves the resource's `updated_at`: the pair is read again, a few times at most.)
    let mut pair = (Value::Null, Value::Null);
    for _ in 0..5 {
        let (code, body) = crate::support::http::get_blocking(&env.http_address()?, "/status")?;
        assert_eq!(code, 200);
        pair = (
            without_check_times(serde_json::from_str::<Value>(&body)?),
            without_check_times(env.status()?),
        );
        if pair.0 == pair.1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(pair.0, pair.1);
    let text = env.cli(&["status"])?;
    assert!(
        text.contains("is PINNED to commit") && text.contains("git now differs"),
        "{text}"
    );

    // b. a commit that leaves web alone keeps the pin and the running replicas.
    env.repo.write("README.md", "notes\n")?;
    let unrelated = env.repo.commit("docs")?;
    let kept = env.converged(&unrelated, 2, Some(&hash_2))?;
    assert_eq!(ids(&kept), ids(&rows), "nothing replaced");
    assert_eq!(
        env.resource()?.ok_or("web")?["pin"]["commit"],
        first.as_str()
    );

    // c. unpin → git's version (the second spec) again, no pin.
    let said = env.cli(&["unpin", &reference])?;
    assert!(said.contains("back to git's version"), "{said}");
    let rows = env.converged(&unrelated, 2, Some(&hash_1))?;
    assert!(rows.iter().all(|row| row.hash == hash_2), "{rows:?}");
    assert_eq!(env.resource()?.ok_or("web")?["pin"], Value::Null);

    // d. rollback again, then a commit that changes web: the pin clears and git wins.
    env.cli(&["rollback", &reference, "--to", &first[..10]])?;
    env.converged(&unrelated, 2, Some(&hash_2))?;
    env.write_web(2, "3")?;
    let third = env.repo.commit("web: V=3")?;
    let rows = env.converged(&third, 2, Some(&hash_1))?;
    assert!(rows.iter().all(|row| row.hash != hash_2), "{rows:?}");
    let resource = env.resource()?.ok_or("web")?;
    assert_eq!(resource["pin"], Value::Null, "the commit cleared the pin");
    assert_eq!(resource["release"]["commit"], third.as_str());
    Ok(())
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_webhook_flood_keeps_the_agents_memory_bounded() -> TestResult {
    Env::new()?.run(webhook_flood)
}

/// The real binary in its own process, so its memory is its own: 10,000 signed 16 KiB
/// webhooks (156 MiB) for two new commits raise its peak resident memory by far less than
/// that, and cost at most one fetch per SHA.
fn webhook_flood(env: &mut Env) -> TestResult {
    const SECRET: &str = "flood-secret";
    let secret_file = env.dir.path().join("webhook.secret");
    std::fs::write(&secret_file, SECRET)?;
    env.write_web(1, "1")?;
    let first = env.repo.commit("web")?;
    // No polls and no ref watch during the flood: only webhooks may cause fetches.
    env.start_agent_with(&[
        "--interval",
        "1h",
        "--no-watch",
        "--webhook-secret-file",
        &secret_file.display().to_string(),
    ])?;
    env.converged(&first, 1, None)?;
    let mut shas = Vec::new();
    for n in 0..2 {
        env.repo.write("README.md", &format!("notes {n}\n"))?;
        shas.push(env.repo.commit("docs")?);
    }
    let pid = env.agent.as_ref().ok_or("agent running")?.child.id();
    let address = env.http_address()?;
    let peak_before = memory_of(pid, "VmHWM")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (answered, fetches) = runtime.block_on(async {
        let client = crate::support::http::client()?;
        let metrics_url = format!("http://{address}/metrics");
        let syncs = |text: String| -> TestResult<f64> {
            Ok(metric(&parse_metrics(&text)?, "voodu_syncs_total", &[]))
        };
        let before = syncs(get(&client, &metrics_url).await?.1)?;
        let answered = crate::support::http::flood(
            &client,
            &format!("http://{address}/hooks/git"),
            &WebhookSecret::new(SECRET),
            &shas,
            10_000,
        )
        .await?;
        env.converged(shas.last().ok_or("shas")?, 1, None)?;
        let after = syncs(get(&client, &metrics_url).await?.1)?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((answered, after - before))
    })?;
    let peak_after = memory_of(pid, "VmHWM")?;
    let rss_after = memory_of(pid, "VmRSS")?;
    println!(
        "flood: {answered} answered, {fetches} fetches; agent peak RSS {} KiB -> {} KiB (now {} KiB)",
        peak_before / 1024,
        peak_after / 1024,
        rss_after / 1024
    );
    assert_eq!(answered, 10_000);
    assert!(
        (1.0..=2.0).contains(&fetches),
        "{fetches} fetches for 2 new SHAs"
    );
    let grown = peak_after.saturating_sub(peak_before);
    assert!(
        grown < 40 * 1024 * 1024,
        "the agent's peak memory grew by {} MiB over a 156 MiB flood",
        grown / (1024 * 1024)
    );
    Ok(())
}

/// `document` without the times every poll and probe moves (`checked_at`, `last_success_at`).
fn without_check_times(mut document: Value) -> Value {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove("checked_at");
                map.remove("last_success_at");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut document);
    document
}
