//! Identity and the data dir (issue 10 item 4), with the real binary on a real engine: one
//! agent per data dir (a second one exits naming the holder's pid, while `status` and
//! `config` keep working), and a lost state.db never turns into a silent new identity: the
//! agent refuses to start while this data dir's containers remain, and `--adopt` takes them
//! over without duplicates. Limits are liveness bounds, not timing assertions.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::e2e_docker::{AGENT, Env};
use crate::support::{TestResult, wait_until};

const LIMIT: Duration = Duration::from_secs(60);

/// An agent process on the env's repo and data dir, killed on drop.
struct Running(Child);

impl Running {
    fn start(env: &Env, extra: &[&str], log: &Path) -> TestResult<Running> {
        let child = Command::new(AGENT)
            .args(extra)
            .args(["--interval", "1s", "--repo", &env.repo.url()])
            .args(["--listen", "127.0.0.1:0", "--no-ingress", "--data-dir"])
            .arg(env.data_dir())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(log)?,
            )
            .spawn()?;
        Ok(Running(child))
    }

    /// Waits for the process to exit by itself; its exit code.
    fn exit_code(&mut self) -> TestResult<Option<i32>> {
        let status = wait_until(LIMIT, "the agent to exit", || {
            self.0.try_wait().ok().flatten()
        })?;
        Ok(status.code())
    }

    /// SIGTERM, and wait for the clean stop.
    fn stop(&mut self) -> TestResult {
        Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()?;
        self.exit_code()?;
        Ok(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Container ids of the scope, sorted.
fn ids(env: &Env) -> TestResult<Vec<String>> {
    let mut ids: Vec<String> = env.containers()?.into_iter().map(|row| row.id).collect();
    ids.sort();
    Ok(ids)
}

/// `docker ps -a` ids (or with `running`, running ones) labelled `voodu.scope=<scope>`.
fn scope_ids(scope: &str, running: bool) -> TestResult<Vec<String>> {
    let mut command = Command::new("docker");
    command
        .args(["ps", "-aq", "--no-trunc", "--filter"])
        .arg(format!("label=voodu.scope={scope}"));
    if running {
        command.args(["--filter", "status=running"]);
    }
    let mut ids: Vec<String> = String::from_utf8(command.output()?.stdout)?
        .split_whitespace()
        .map(ToOwned::to_owned)
        .collect();
    ids.sort();
    Ok(ids)
}

/// Whether `status --json` shows `scope/name` Ready.
fn ready(env: &Env, scope: &str, name: &str) -> bool {
    env.status().is_ok_and(|status| {
        status["resources"].as_array().is_some_and(|resources| {
            resources.iter().any(|resource| {
                resource["scope"] == scope
                    && resource["name"] == name
                    && resource["phase"] == "Ready"
            })
        })
    })
}

/// A one-pod statefulset with one claim, in `scope`.
fn write_db(env: &Env, scope: &str) -> TestResult {
    let manifest = format!(
        r#"statefulset "{scope}" "db" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = 1
  env      = {{ V = "1" }}
  volume_claim "data" {{
    mount_path = "/data"
  }}
}}
"#,
        image = crate::support::test_image(),
    );
    env.repo.write("data/db.hcl", &manifest)?;
    Ok(())
}

/// The `voodu.agent` labels on the scope's containers, deduplicated.
fn agent_ids(env: &Env) -> TestResult<Vec<String>> {
    let output = Command::new("docker")
        .args(["ps", "-a", "--filter"])
        .arg(format!("label=voodu.scope={}", env.scope()))
        .args([
            "--format",
            r#"{{.Label "voodu.agent"}} {{.Label "voodu.data_dir"}}"#,
        ])
        .output()?;
    let mut ids: Vec<String> = String::from_utf8(output.stdout)?
        .lines()
        .map(ToOwned::to_owned)
        .collect();
    ids.sort();
    ids.dedup();
    Ok(ids)
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_second_agent_on_one_data_dir_exits_naming_the_holders_pid() -> TestResult {
    Env::new()?.run(|env| {
        env.write_web(1, "1")?;
        let sha = env.repo.commit("web: 1 replica")?;
        let first = Running::start(env, &[], &env.log())?;
        let before = env.converged(&sha, 1, None)?;

        let second_log = env.dir.path().join("second.log");
        let mut second = Running::start(env, &[], &second_log)?;
        assert_eq!(second.exit_code()?, Some(1), "the second agent must exit 1");
        let stderr = std::fs::read_to_string(&second_log)?;
        let expected = format!(
            "data dir {} is in use by another voodu-agent (pid {})",
            env.data_dir().display(),
            first.0.id()
        );
        assert!(stderr.contains(&expected), "{stderr}");
        // The second agent touched no container. (Checked before the config change below:
        // the first agent rolls the replica for it.)
        assert_eq!(ids(env)?, {
            let mut ids: Vec<String> = before.into_iter().map(|row| row.id).collect();
            ids.sort();
            ids
        });

        // Reading state and editing config do not take the lock.
        assert_eq!(env.status()?["last_applied"]["sha"], sha.as_str());
        env.cli(&["config", "set", env.scope(), "K=V"])?;
        env.cli(&["releases", &format!("{}/web", env.scope())])?;
        drop(first);
        Ok(())
    })
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_lost_state_db_is_refused_and_adopt_converges_without_duplicates() -> TestResult {
    Env::new()?.run(|env| {
        // A statefulset in a second scope: its pod has a fixed name and a volume.
        let db_scope = format!("{}s", env.scope());
        let _db_guard = crate::support::DockerGuard::new(&db_scope);
        env.write_web(2, "1")?;
        write_db(env, &db_scope)?;
        let sha = env.repo.commit("web: 2 replicas, db: 1 pod")?;
        let mut agent = Running::start(env, &[], &env.log())?;
        env.converged(&sha, 2, None)?;
        wait_until(LIMIT, "the db pod to be Ready", || {
            ready(env, &db_scope, "db").then_some(())
        })?;
        let old = ids(env)?;
        let old_db = scope_ids(&db_scope, true)?;
        assert_eq!(old_db.len(), 1, "one db pod");
        let data_dir = std::fs::canonicalize(env.data_dir())?;
        let labels = agent_ids(env)?;
        let [label] = labels.as_slice() else {
            return Err(format!("one agent id and data dir on the replicas: {labels:?}").into());
        };
        let (old_agent, marker) = label.split_once(' ').ok_or("two labels")?;
        assert_eq!(marker, data_dir.display().to_string(), "voodu.data_dir");
        agent.stop()?;

        // The operator loses state.db (its log and index files too).
        for file in ["state.db", "state.db-wal", "state.db-shm"] {
            let _ = std::fs::remove_file(env.data_dir().join(file));
        }
        let refused_log = env.dir.path().join("refused.log");
        let mut refused = Running::start(env, &[], &refused_log)?;
        assert_eq!(
            refused.exit_code()?,
            Some(1),
            "a lost state.db must stop the start"
        );
        let stderr = std::fs::read_to_string(&refused_log)?;
        for fragment in [
            format!("data dir {} has lost its state", env.data_dir().display()),
            "state.db is missing".to_owned(),
            format!("agent {old_agent}: 3 containers and 1 volume on this engine"),
            "start again with --adopt".to_owned(),
            format!("docker rm -f $(docker ps -aq --filter label=voodu.agent={old_agent})"),
        ] {
            assert!(stderr.contains(&fragment), "lacks {fragment:?}:\n{stderr}");
        }
        assert!(
            !env.data_dir().join("state.db").exists(),
            "a refused start leaves the data dir as it found it"
        );
        assert_eq!(ids(env)?, old, "a refused start touches no container");
        assert_eq!(scope_ids(&db_scope, false)?, old_db);

        // --adopt: the old identity and its digest key, the same two containers, no others.
        let mut adopted = Running::start(env, &["--adopt"], &env.log())?;
        env.converged(&sha, 2, None)?;
        assert_eq!(ids(env)?, old, "the old containers are kept, none added");
        wait_until(LIMIT, "the adopted db pod to be Ready", || {
            ready(env, &db_scope, "db").then_some(())
        })?;
        assert_eq!(scope_ids(&db_scope, false)?, old_db, "the db pod is kept");
        assert_eq!(agent_ids(env)?, labels.clone());
        let status = env.status()?;
        assert_eq!(status["last_applied"]["sha"], sha.as_str());
        // A new commit is applied by the adopted identity, still without duplicates.
        env.write_web(3, "1")?;
        let scaled = env.repo.commit("web: 3 replicas")?;
        let rows = env.converged(&scaled, 3, None)?;
        let kept = old
            .iter()
            .filter(|id| rows.iter().any(|row| &row.id == *id))
            .count();
        assert_eq!(kept, 2, "scaling keeps the adopted replicas: {rows:?}");
        adopted.stop()?;

        // A zeroed state.db is an error naming the file, never a fresh start.
        std::fs::write(env.data_dir().join("state.db"), b"")?;
        let zeroed_log = env.dir.path().join("zeroed.log");
        let mut zeroed = Running::start(env, &[], &zeroed_log)?;
        assert_eq!(zeroed.exit_code()?, Some(1));
        let stderr = std::fs::read_to_string(&zeroed_log)?;
        let expected = format!(
            "state database {} is unusable: the file is empty (0 bytes)",
            env.data_dir().join("state.db").display()
        );
        assert!(stderr.contains(&expected), "{stderr}");
        Ok(())
    })
}
