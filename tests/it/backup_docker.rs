//! Backups tied to releases (issue 50), with the real binary, real restic (Debian's) and a
//! local repository on a real engine: a snapshot, files deleted, `restore` brings them back
//! byte for byte (a tree hash of the volume before and after); retention keeps exactly the
//! `keep` set; a release whose new code corrupts the data, then `rollback --with-data`; a
//! backup that fails holds a `before_release` release with nothing replaced; kill -9 during a
//! backup leaves no snapshot recorded that restic did not finish; and `exec` mode against a
//! real PostgreSQL (`voodu-postgres`, built from Debian's packages by scripts/docker-setup):
//! `pg_dump` through exec, a table dropped, restored, its row read back.
//!
//! Limits in `wait_until` are liveness bounds, not timing assertions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::e2e_docker::Env;
use crate::support::{TestResult, test_image, wait_until};

const LIMIT: Duration = Duration::from_secs(120);

/// A backup's repository and password file in the env's temp dir.
struct Restic {
    repository: PathBuf,
    password_file: PathBuf,
}

impl Restic {
    fn new(env: &Env) -> TestResult<Restic> {
        let root = env.dir.path().join("backups");
        std::fs::create_dir_all(&root)?;
        let password_file = root.join("restic.pass");
        std::fs::write(&password_file, "correct horse battery staple\n")?;
        Ok(Restic {
            repository: root.join("repo"),
            password_file,
        })
    }

    /// The flags the agent needs to be allowed these host paths.
    fn policy(env: &Env) -> Vec<String> {
        vec![
            "--allow-bind-root".to_owned(),
            env.dir.path().join("backups").display().to_string(),
        ]
    }

    /// `restic snapshots --json` of the repository, run by hand.
    fn snapshots(&self) -> TestResult<Vec<Value>> {
        let output = Command::new("restic")
            .args(["--repo"])
            .arg(&self.repository)
            .args(["snapshots", "--json", "--no-lock"])
            .env("RESTIC_PASSWORD_FILE", &self.password_file)
            .output()?;
        if !output.status.success() {
            return Err(format!(
                "restic snapshots: {}",
                String::from_utf8_lossy(&output.stderr)
            )
            .into());
        }
        Ok(serde_json::from_slice(&output.stdout)?)
    }
}

/// A statefulset `db` of one pod with one claim `data` at /data, its command `command`, and
/// `backup { … }` with `extra` lines.
fn statefulset(env: &Env, restic: &Restic, command: &str, env_v: &str, extra: &str) -> String {
    format!(
        r#"statefulset "{scope}" "db" {{
  image   = "{image}"
  command = ["sh", "-c", "{command}"]
  env     = {{ V = "{env_v}" }}
  volume_claim "data" {{
    mount_path = "/data"
  }}
  backup {{
    repository    = "{repository}"
    password_file = "{password}"
{extra}
  }}
}}
"#,
        scope = env.scope(),
        image = test_image(),
        repository = restic.repository.display(),
        password = restic.password_file.display(),
    )
}

/// The host directory of the pod's claim volume.
fn volume_dir(env: &Env) -> TestResult<PathBuf> {
    let name = format!("voodu-{}-db-data-0", env.scope());
    let output = Command::new("docker")
        .args(["volume", "inspect", "--format", "{{.Mountpoint}}", &name])
        .output()?;
    if !output.status.success() {
        return Err(format!("no volume {name}").into());
    }
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

/// A hash of a tree: every entry's relative path, kind, mode and bytes, in path order.
fn tree_hash(root: &Path) -> TestResult<String> {
    use std::os::unix::fs::PermissionsExt as _;
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) -> TestResult {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            let relative = path.strip_prefix(root)?.display().to_string();
            let meta = std::fs::symlink_metadata(&path)?;
            let mode = meta.permissions().mode() & 0o7777;
            if meta.is_dir() {
                out.insert(relative, format!("dir {mode:o}"));
                walk(root, &path, out)?;
            } else if meta.is_file() {
                let digest = Sha256::digest(std::fs::read(&path)?);
                out.insert(relative, format!("file {mode:o} {digest:x}"));
            } else {
                out.insert(relative, format!("other {mode:o}"));
            }
        }
        Ok(())
    }
    let mut entries = BTreeMap::new();
    walk(root, root, &mut entries)?;
    Ok(format!("{:x}", Sha256::digest(format!("{entries:?}"))))
}

/// `backups SCOPE/db --json` (`SCOPE/pg` once a `pg` statefulset is declared).
fn runs(env: &Env) -> TestResult<Vec<Value>> {
    let name = if env.repo.work().join("pg.hcl").exists() {
        "pg"
    } else {
        "db"
    };
    let reference = format!("{}/{name}", env.scope());
    Ok(serde_json::from_str(
        &env.cli(&["backups", &reference, "--json"])?,
    )?)
}

/// Waits for run `id` to end; its row.
fn ended(env: &Env, id: i64) -> TestResult<Value> {
    wait_until(LIMIT, &format!("data run #{id} to end"), || {
        runs(env).ok()?.into_iter().find(|run| {
            run["id"] == id
                && ["succeeded", "failed", "superseded"]
                    .contains(&run["state"].as_str().unwrap_or(""))
        })
    })
}

/// The run id a `backup`/`restore` command printed (`… run #N asked for …`).
fn run_id(printed: &str) -> TestResult<i64> {
    let after = printed.split("run #").nth(1).ok_or("no run id printed")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    Ok(digits.parse()?)
}

/// The pod's container `docker ps` shows running, and its id.
fn pod(env: &Env) -> TestResult<crate::e2e_docker::Row> {
    wait_until(LIMIT, "the pod to run", || {
        env.containers()
            .ok()?
            .into_iter()
            .find(|row| row.name == format!("{}-db.0", env.scope()) && row.state == "running")
    })
}

/// The statefulset in `status --json`.
fn db_status(env: &Env) -> TestResult<Option<Value>> {
    let status = env.status()?;
    Ok(status["resources"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .find(|resource| resource["scope"] == env.scope() && resource["name"] == "db"))
}

fn ready(env: &Env) -> TestResult<Value> {
    wait_until(LIMIT, "the statefulset to be Ready", || {
        db_status(env)
            .ok()?
            .filter(|resource| resource["phase"] == "Ready")
    })
}

#[test]
#[ignore = "needs a Docker engine and restic: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_snapshot_restores_the_claim_byte_for_byte_and_retention_keeps_the_keep_set() -> TestResult {
    Env::new()?.run(|env| {
        let restic = Restic::new(env)?;
        let manifest = statefulset(
            env,
            &restic,
            "sleep 3600",
            "1",
            "    mode = \"stop\"\n    keep {\n      last = 2\n    }",
        );
        env.repo.write("db.hcl", &manifest)?;
        env.repo.commit("db with a backup block")?;
        env.start_agent_with(
            &Restic::policy(env)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )?;
        ready(env)?;
        let before_pod = pod(env)?;

        // Files of several kinds and modes in the claim.
        let dir = volume_dir(env)?;
        std::fs::create_dir_all(dir.join("nested/deeper"))?;
        std::fs::write(dir.join("a.txt"), "alpha\n")?;
        std::fs::write(
            dir.join("nested/b.bin"),
            (0..=255u8).cycle().take(300_000).collect::<Vec<u8>>(),
        )?;
        std::fs::write(dir.join("nested/deeper/c"), "")?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir.join("a.txt"), std::fs::Permissions::from_mode(0o600))?;
        }
        let hash_before = tree_hash(&dir)?;

        let reference = format!("{}/db", env.scope());
        let backup = run_id(&env.cli(&["backup", &reference])?)?;
        let run = ended(env, backup)?;
        assert_eq!(run["state"], "succeeded", "{run}");
        let snapshot = run["snapshots"][format!("voodu-{}-db-data-0", env.scope())]
            .as_str()
            .ok_or("the backup recorded no snapshot of the claim")?
            .to_owned();
        // stop mode: the pod was stopped and started again (same container), and is Ready.
        ready(env)?;
        assert_eq!(
            pod(env)?.id,
            before_pod.id,
            "stop mode restarts the same pod"
        );

        // The files are deleted; restore brings them back byte for byte.
        std::fs::remove_dir_all(dir.join("nested"))?;
        std::fs::write(dir.join("a.txt"), "clobbered")?;
        assert_ne!(tree_hash(&volume_dir(env)?)?, hash_before);
        let restore = run_id(&env.cli(&["restore", &reference, "--snapshot", &snapshot[..8]])?)?;
        let run = ended(env, restore)?;
        assert_eq!(run["state"], "succeeded", "{run}");
        ready(env)?;
        assert_eq!(
            tree_hash(&volume_dir(env)?)?,
            hash_before,
            "the claim is as it was backed up"
        );
        // The old contents were kept aside only until the pod was Ready again.
        let parent = volume_dir(env)?
            .parent()
            .ok_or("a volume dir has a parent")?
            .to_owned();
        let leftovers: Vec<String> = std::fs::read_dir(&parent)?
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name.contains("voodu-"))
            .collect();
        assert!(
            leftovers.is_empty(),
            "left beside the volume: {leftovers:?}"
        );

        // Retention: three more backups, keep { last = 2 } leaves exactly the two newest.
        let mut newest = Vec::new();
        for _ in 0..3 {
            std::fs::write(
                volume_dir(env)?.join("counter"),
                format!("{}", newest.len()),
            )?;
            let id = run_id(&env.cli(&["backup", &reference])?)?;
            let run = ended(env, id)?;
            assert_eq!(run["state"], "succeeded", "{run}");
            newest.push(
                run["snapshots"][format!("voodu-{}-db-data-0", env.scope())]
                    .as_str()
                    .ok_or("no snapshot")?
                    .to_owned(),
            );
        }
        let mut kept: Vec<String> = restic
            .snapshots()?
            .iter()
            // The agent records restic's short ids (the first 8 hex digits).
            .filter_map(|snapshot| snapshot["short_id"].as_str().map(ToOwned::to_owned))
            .collect();
        kept.sort();
        let mut expected = newest[1..].to_vec();
        expected.sort();
        assert_eq!(kept, expected, "restic keeps exactly the keep set");

        // A verify restores the newest backup into scratch and finds every byte.
        let verify = run_id(&env.cli(&["backup", &reference, "--verify"])?)?;
        let run = ended(env, verify)?;
        assert_eq!(run["state"], "succeeded", "{run}");
        let shown = wait_until(LIMIT, "status to show the verify", || {
            db_status(env)
                .ok()?
                .filter(|resource| resource["backup"]["last_verify"]["id"] == verify)
        })?;
        assert_eq!(shown["backup"]["last"]["state"], "succeeded", "{shown}");
        // A repository whose data rotted fails its verify, and people are told. (A pack
        // file deleted outright would fail too, after restic's own retries of the read.)
        let packs: Vec<PathBuf> = std::fs::read_dir(restic.repository.join("data"))?
            .flatten()
            .flat_map(|sub| {
                std::fs::read_dir(sub.path())
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .map(|entry| entry.path())
            .collect();
        assert!(!packs.is_empty(), "no pack file in the repository");
        for pack in &packs {
            let mut bytes = std::fs::read(pack)?;
            for byte in bytes.iter_mut().skip(100).step_by(97) {
                *byte ^= 0xff;
            }
            std::fs::write(pack, bytes)?;
        }
        let verify = run_id(&env.cli(&["backup", &reference, "--verify"])?)?;
        let run = ended(env, verify)?;
        assert_eq!(run["state"], "failed", "{run}");
        let store = voodu_agent::store::Store::open_read_only(&env.data_dir().join("state.db"))?;
        let events = store.events_after(0, 10_000)?;
        assert!(
            events
                .iter()
                .any(|event| event.event == "backup.verify_failed"),
            "{events:?}"
        );

        // /metrics: the newest backup's figures.
        let address = env.http_address()?;
        let (_, text) = crate::support::http::get_blocking(&address, "/metrics")?;
        for name in [
            "voodu_backup_last_success_timestamp_seconds",
            "voodu_backup_last_verified_timestamp_seconds",
            "voodu_backup_size_bytes",
            "voodu_backup_duration_seconds",
        ] {
            assert!(
                text.lines().any(|line| line.starts_with(&format!(
                    "{name}{{resource=\"statefulset/{}/db\"}}",
                    env.scope()
                ))),
                "{name} in {text}"
            );
        }
        Ok(())
    })
}

#[test]
#[ignore = "needs a Docker engine and restic: scripts/test runs it (cargo test -- --include-ignored)"]
fn rollback_with_data_brings_back_the_code_and_the_data_and_a_failed_backup_holds_the_release()
-> TestResult {
    Env::new()?.run(|env| {
        let restic = Restic::new(env)?;
        let keep = "    before_release = true";
        // v1 writes the data once; v2's code corrupts it when it starts.
        let v1 = statefulset(
            env,
            &restic,
            "[ -f /data/important ] || echo good > /data/important; sleep 3600",
            "1",
            keep,
        );
        env.repo.write("db.hcl", &v1)?;
        env.repo.commit("db v1")?;
        env.start_agent_with(
            &Restic::policy(env)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )?;
        let v1_status = ready(env)?;
        let v1_hash = v1_status["spec_hash"]
            .as_str()
            .ok_or("a spec hash")?
            .to_owned();
        let important = volume_dir(env)?.join("important");
        wait_until(LIMIT, "v1 to write its data", || {
            (std::fs::read_to_string(&important).ok()? == "good\n").then_some(())
        })?;

        let v2 = statefulset(
            env,
            &restic,
            "echo corrupt > /data/important; sleep 3600",
            "2",
            keep,
        );
        env.repo.write("db.hcl", &v2)?;
        env.repo
            .commit("db v2: a migration that corrupts the data")?;
        wait_until(LIMIT, "v2 to corrupt the data", || {
            (std::fs::read_to_string(&important).ok()? == "corrupt\n").then_some(())
        })?;
        let v2_status = ready(env)?;
        assert_ne!(v2_status["spec_hash"], v1_hash.as_str());
        // v2's release recorded the backup taken before it touched the pod.
        let reference = format!("{}/db", env.scope());
        let before_v2 = runs(env)?
            .into_iter()
            .find(|run| {
                run["reason"] == "before_release" && run["release"] == v2_status["release"]["id"]
            })
            .ok_or("no before_release backup of v2's release")?;
        assert_eq!(before_v2["state"], "succeeded", "{before_v2}");

        // Code and data back.
        let v1_release = v1_status["release"]["id"].as_i64().ok_or("v1's release")?;
        let printed = env.cli(&[
            "rollback",
            &reference,
            "--release",
            &v1_release.to_string(),
            "--with-data",
        ])?;
        let restore = run_id(
            printed
                .lines()
                .find(|line| line.contains("with data"))
                .ok_or(printed.clone())?,
        )?;
        let run = ended(env, restore)?;
        assert_eq!(run["state"], "succeeded", "{run}");
        wait_until(LIMIT, "v1's code with v1's data", || {
            let status = db_status(env).ok()??;
            let data = std::fs::read_to_string(volume_dir(env).ok()?.join("important")).ok()?;
            (status["phase"] == "Ready"
                && status["spec_hash"] == v1_hash.as_str()
                && data == "good\n")
                .then_some(())
        })?;

        // A backup that cannot be taken (wrong password) holds the next release: status
        // says why and nothing is replaced.
        // (A commit that changes the resource in git hands the pinned resource back.)
        let running = pod(env)?;
        std::fs::write(&restic.password_file, "not the password\n")?;
        let v3 = statefulset(env, &restic, "sleep 3600", "3", keep);
        env.repo.write("db.hcl", &v3)?;
        env.repo.commit("db v3")?;
        let held = wait_until(LIMIT, "the release to be held by its failed backup", || {
            db_status(env).ok()?.filter(|resource| {
                resource["reason"] == "BackupFailed"
                    && resource["message"].as_str().unwrap_or("").contains("held")
            })
        })?;
        assert!(
            held["message"]
                .as_str()
                .unwrap_or("")
                .contains("before_release backup failed"),
            "{held}"
        );
        assert!(
            !held["message"]
                .as_str()
                .unwrap_or("")
                .contains("not the password"),
            "the password never shows: {held}"
        );
        let still = pod(env)?;
        assert_eq!(still.id, running.id, "nothing was replaced");
        assert_eq!(still.hash, running.hash);
        // With the password back, the held release goes on.
        std::fs::write(&restic.password_file, "correct horse battery staple\n")?;
        wait_until(
            Duration::from_secs(180),
            "the held release to roll out",
            || {
                let resource = db_status(env).ok()??;
                (resource["phase"] == "Ready" && resource["spec_hash"] != running.hash.as_str())
                    .then_some(())
            },
        )?;
        Ok(())
    })
}

#[test]
#[ignore = "needs a Docker engine and restic: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_backup_cut_by_kill_9_records_no_half_snapshot_and_the_next_one_succeeds() -> TestResult {
    Env::new()?.run(|env| {
        let restic = Restic::new(env)?;
        let manifest = statefulset(env, &restic, "sleep 3600", "1", "    mode = \"live\"");
        env.repo.write("db.hcl", &manifest)?;
        env.repo.commit("db, live backups")?;
        let policy = Restic::policy(env);
        let flags: Vec<&str> = policy.iter().map(String::as_str).collect();
        env.start_agent_with(&flags)?;
        ready(env)?;
        // Enough incompressible data that restic is still at work when the agent dies.
        let dir = volume_dir(env)?;
        let mut random = std::fs::File::open("/dev/urandom")?;
        let mut file = std::fs::File::create(dir.join("big"))?;
        std::io::copy(
            &mut std::io::Read::take(&mut random, 400 * 1024 * 1024),
            &mut file,
        )?;
        drop(file);

        let reference = format!("{}/db", env.scope());
        let first = run_id(&env.cli(&["backup", &reference])?)?;
        wait_until(LIMIT, "restic to be at work", || {
            let run = runs(env).ok()?.into_iter().find(|run| run["id"] == first)?;
            // This repository's `restic … backup` (other tests run restic beside this one).
            let pattern = format!("restic.*{}.* backup ", restic.repository.display());
            let restic_runs = Command::new("pgrep").args(["-f", &pattern]).output().ok()?;
            (run["state"] == "running" && restic_runs.status.success()).then_some(())
        })?;
        // kill -9: restic dies with the agent (nothing is left to finish a snapshot).
        // Dropping the agent child is SIGKILL and a wait.
        drop(env.agent.take());
        wait_until(LIMIT, "restic to be gone with the agent", || {
            let repository = restic.repository.display().to_string();
            let listed = Command::new("pgrep")
                .args(["-f", &repository])
                .output()
                .ok()?;
            (!listed.status.success()).then_some(())
        })?;
        assert!(
            restic.snapshots()?.is_empty(),
            "no snapshot of the cut backup"
        );

        env.start_agent_with(&flags)?;
        let run = ended(env, first)?;
        assert_eq!(
            run["state"], "succeeded",
            "the step ran again after the restart: {run}"
        );
        let recorded: Vec<String> = run["snapshots"]
            .as_object()
            .ok_or("snapshots")?
            .values()
            .filter_map(|id| id.as_str().map(ToOwned::to_owned))
            .collect();
        let in_repository: Vec<String> = restic
            .snapshots()?
            .iter()
            // The agent records restic's short ids (the first 8 hex digits).
            .filter_map(|snapshot| snapshot["short_id"].as_str().map(ToOwned::to_owned))
            .collect();
        assert_eq!(
            in_repository, recorded,
            "the repository holds what was recorded, no more"
        );
        let next = run_id(&env.cli(&["backup", &reference])?)?;
        assert_eq!(ended(env, next)?["state"], "succeeded");
        Ok(())
    })
}

#[test]
#[ignore = "needs a Docker engine, restic and the voodu-postgres image: scripts/test runs it (cargo test -- --include-ignored)"]
fn exec_mode_dumps_a_real_postgres_and_restores_a_dropped_table() -> TestResult {
    Env::new()?.run(|env| {
        let restic = Restic::new(env)?;
        let manifest = format!(
            r#"statefulset "{scope}" "pg" {{
  image = "{image}"
  volume_claim "data" {{
    mount_path = "/var/lib/postgresql/data"
  }}
  backup {{
    repository      = "{repository}"
    password_file   = "{password}"
    mode            = "exec"
    command         = ["pg_dump", "-U", "postgres", "-Fc", "postgres"]
    restore_command = ["pg_restore", "-U", "postgres", "--clean", "--if-exists", "-d", "postgres"]
  }}
}}
"#,
            scope = env.scope(),
            image = std::env::var("VOODU_POSTGRES_IMAGE")
                .unwrap_or_else(|_| "voodu-postgres:latest".to_owned()),
            repository = restic.repository.display(),
            password = restic.password_file.display(),
        );
        env.repo.write("pg.hcl", &manifest)?;
        env.repo.commit("postgres with exec backups")?;
        let policy = Restic::policy(env);
        env.start_agent_with(&policy.iter().map(String::as_str).collect::<Vec<_>>())?;
        let name = format!("{}-pg.0", env.scope());
        let psql = |sql: &str| -> TestResult<String> {
            let output = Command::new("docker")
                .args(["exec", &name, "psql", "-U", "postgres", "-tAc", sql])
                .output()?;
            if !output.status.success() {
                return Err(
                    format!("psql {sql}: {}", String::from_utf8_lossy(&output.stderr)).into(),
                );
            }
            Ok(String::from_utf8(output.stdout)?.trim().to_owned())
        };
        wait_until(LIMIT, "postgres to answer", || {
            psql("select 1").ok().filter(|out| out == "1")
        })?;
        psql("create table orders (id int primary key, item text)")?;
        psql("insert into orders values (42, 'the answer')")?;

        let reference = format!("{}/pg", env.scope());
        let backup = run_id(&env.cli(&["backup", &reference])?)?;
        let run = ended(env, backup)?;
        assert_eq!(run["state"], "succeeded", "{run}");
        psql("drop table orders")?;
        assert!(psql("select item from orders where id = 42").is_err());

        let restore = run_id(&env.cli(&["restore", &reference])?)?;
        let run = ended(env, restore)?;
        assert_eq!(run["state"], "succeeded", "{run}");
        assert_eq!(psql("select item from orders where id = 42")?, "the answer");
        Ok(())
    })
}

#[test]
#[ignore = "needs a Docker engine and restic: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_deployments_named_volume_is_backed_up_and_restored() -> TestResult {
    Env::new()?.run(|env| {
        let restic = Restic::new(env)?;
        let volume = format!("{}-uploads", env.scope());
        let manifest = format!(
            r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = 2
  volumes  = ["{volume}:/srv/uploads"]
  backup {{
    volume        = "{volume}"
    repository    = "{repository}"
    password_file = "{password}"
  }}
}}
"#,
            scope = env.scope(),
            image = test_image(),
            repository = restic.repository.display(),
            password = restic.password_file.display(),
        );
        env.repo.write("web.hcl", &manifest)?;
        let sha = env.repo.commit("web with a named volume, backed up")?;
        let policy = Restic::policy(env);
        env.start_agent_with(&policy.iter().map(String::as_str).collect::<Vec<_>>())?;
        let before = env.converged(&sha, 2, None)?;
        let result = (|| -> TestResult {
            let output = Command::new("docker")
                .args(["volume", "inspect", "--format", "{{.Mountpoint}}", &volume])
                .output()?;
            let dir = PathBuf::from(String::from_utf8(output.stdout)?.trim());
            std::fs::create_dir_all(dir.join("2026"))?;
            std::fs::write(
                dir.join("2026/avatar.png"),
                (0..=255u8).cycle().take(50_000).collect::<Vec<u8>>(),
            )?;
            let hash_before = tree_hash(&dir)?;

            let reference = format!("{}/web", env.scope());
            let backup = run_id(&env.cli(&["backup", &reference])?)?;
            let run = ended_of(env, "web", backup)?;
            assert_eq!(run["state"], "succeeded", "{run}");
            assert!(run["snapshots"][&volume].is_string(), "{run}");
            // Both replicas were stopped and started again: the same containers, running.
            let after = env.converged(&sha, 2, None)?;
            assert_eq!(
                after.iter().map(|row| &row.id).collect::<Vec<_>>(),
                before.iter().map(|row| &row.id).collect::<Vec<_>>()
            );

            std::fs::remove_dir_all(dir.join("2026"))?;
            let restore = run_id(&env.cli(&["restore", &reference])?)?;
            let run = ended_of(env, "web", restore)?;
            assert_eq!(run["state"], "succeeded", "{run}");
            env.converged(&sha, 2, None)?;
            assert_eq!(
                tree_hash(&dir)?,
                hash_before,
                "the named volume is as it was backed up"
            );
            Ok(())
        })();
        drop(env.agent.take());
        let _ = Command::new("docker")
            .args(["rm", "-f"])
            .args(env.containers()?.iter().map(|row| row.id.clone()))
            .output();
        let _ = Command::new("docker")
            .args(["volume", "rm", &volume])
            .output();
        result
    })
}

/// Waits for run `id` of `SCOPE/name` to end; its row.
fn ended_of(env: &Env, name: &str, id: i64) -> TestResult<Value> {
    let reference = format!("{}/{name}", env.scope());
    wait_until(LIMIT, &format!("data run #{id} of {name} to end"), || {
        let listed: Vec<Value> =
            serde_json::from_str(&env.cli(&["backups", &reference, "--json"]).ok()?).ok()?;
        listed.into_iter().find(|run| {
            run["id"] == id
                && ["succeeded", "failed", "superseded"]
                    .contains(&run["state"].as_str().unwrap_or(""))
        })
    })
}
