//! Issue 12: the scripts the `postgres` and `redis` expansions write into their assets, run
//! with `sh` against stand-in `postgres`, `pg_isready`, `pg_basebackup`, `psql`,
//! `docker-entrypoint.sh` and `redis-server` that record how they were called. This proves
//! each pod's role and what it runs (the primary starts as is; a standby clones the primary
//! it is told, once, then streams from it; a redis replica follows its master; sentinels
//! watch the master the config bucket names). It does not prove replication itself: no
//! postgres or redis image is on this host (see docs/differences-from-voodu.md).
//!
//! The scripts are taken from a loaded manifest (the bytes the agent would write).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use voodu_agent::manifest::spec::Spec;
use voodu_agent::manifest::{self, LoadOptions};
use voodu_agent::model::{CommitSha, Snapshot, SourceFile};

use crate::support::TestResult;

/// The files of asset `key` of the manifest `text` expands to, by asset key.
fn asset_files(text: &str, key: &str) -> TestResult<BTreeMap<String, String>> {
    let snapshot = Snapshot {
        commit: CommitSha::new("0".repeat(40)),
        files: vec![SourceFile {
            path: "db.hcl".into(),
            contents: text.as_bytes().to_vec(),
        }],
        refused: Vec::new(),
    };
    let manifest = manifest::load(&snapshot, &LoadOptions::standalone())
        .map_err(|diagnostics| diagnostics.to_string())?;
    let Some(Spec::Asset(asset)) = manifest
        .resources
        .iter()
        .find(|resource| resource.key.to_string() == key)
        .map(|resource| &resource.spec)
    else {
        return Err(format!("no asset {key}").into());
    };
    let mut files = BTreeMap::new();
    for (name, file) in &asset.files {
        let bytes = manifest.blobs.get(&file.digest).ok_or("blob")?;
        files.insert(name.clone(), String::from_utf8(bytes.clone())?);
    }
    Ok(files)
}

/// A scratch dir with stand-in programs in `bin/` that append `<name> <args>` (and, for
/// the ones given, a line of their environment) to `calls.log`.
struct Stage {
    dir: tempfile::TempDir,
    /// The shell the scripts run under: `sh` (dash here, as in Debian-based images) or
    /// `busybox sh` (as in Alpine-based ones).
    shell: &'static [&'static str],
}

impl Stage {
    fn new(shell: &'static [&'static str], stubs: &[(&str, &str)]) -> TestResult<Stage> {
        let dir = tempfile::tempdir()?;
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin)?;
        for (name, extra) in stubs {
            let path = bin.join(name);
            std::fs::write(
                &path,
                format!("#!/bin/sh\necho \"{name} $*\" >> \"$STAGE/calls.log\"\n{extra}\nexit 0\n"),
            )?;
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
        Ok(Stage { dir, shell })
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    /// Runs `script` with `sh` and `env`; the exit code and stderr.
    fn run(&self, script: &str, env: &[(&str, &str)]) -> TestResult<(i32, String)> {
        let script_path = self.path("script.sh");
        std::fs::write(&script_path, script)?;
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let output = Command::new(self.shell[0])
            .args(&self.shell[1..])
            .arg(&script_path)
            .env_clear()
            .env("PATH", path)
            .env("STAGE", self.dir.path())
            .envs(env.iter().copied())
            .output()?;
        Ok((
            output.status.code().unwrap_or(-1),
            String::from_utf8(output.stderr)?,
        ))
    }

    /// The calls logged since the last `take_calls`.
    fn take_calls(&self) -> TestResult<Vec<String>> {
        let log = self.path("calls.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        Ok(text.lines().map(str::to_owned).collect())
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

const POSTGRES: &str = r#"postgres "clowk-lp" "db" {
  version  = "16"
  replicas = 3
  pg_config = { max_connections = 50 }
}
"#;

fn postgres_roles(shell: &'static [&'static str]) -> TestResult {
    let files = asset_files(POSTGRES, "asset/clowk-lp/db")?;
    let entrypoint = &files["entrypoint"];
    let stage = Stage::new(
        shell,
        &[
            ("postgres", "echo 'postgres (PostgreSQL) 16.4'"),
            ("pg_isready", ""),
            (
                "pg_basebackup",
                "echo \"PGPASSWORD=$PGPASSWORD\" >> \"$STAGE/calls.log\"; while [ $# -gt 0 ]; do if [ \"$1\" = -D ]; then mkdir -p \"$2\" && echo 16 > \"$2/PG_VERSION\"; fi; shift; done",
            ),
            ("docker-entrypoint.sh", ""),
        ],
    )?;
    let pgdata = stage.path("data/pgdata");
    let pgdata_text = pgdata.display().to_string();
    let env = |ordinal: &'static str, primary: Option<&'static str>| {
        let mut env = vec![
            ("PGDATA", pgdata_text.clone()),
            ("PGPORT", "5432".to_owned()),
            ("PG_NAME", "db".to_owned()),
            ("PG_SCOPE_SUFFIX", ".clowk-lp.voodu".to_owned()),
            ("PG_REPLICATION_USER", "replicator".to_owned()),
            ("POSTGRES_REPLICATION_PASSWORD", "se'cret".to_owned()),
            ("VOODU_REPLICA_ORDINAL", ordinal.to_owned()),
        ];
        if let Some(primary) = primary {
            env.push(("PG_PRIMARY_ORDINAL", primary.to_owned()));
        }
        env
    };
    let run = |env: Vec<(&'static str, String)>| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        stage.run(entrypoint, &env)
    };
    let conninfo = || -> Vec<String> {
        read(&pgdata.join("postgresql.auto.conf"))
            .lines()
            .filter(|line| line.starts_with("primary_conninfo"))
            .map(str::to_owned)
            .collect()
    };

    // Pod 0: the primary starts as it is, with the WAL a standby needs kept.
    let (code, _) = run(env("0", None))?;
    assert_eq!(code, 0);
    assert_eq!(
        stage.take_calls()?,
        [
            "postgres --version",
            "docker-entrypoint.sh postgres -p 5432 -c wal_keep_size=1GB"
        ]
    );

    // Pod 1, first boot: waits for pod 0, clones it once, starts in recovery streaming from it.
    let (code, stderr) = run(env("1", None))?;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stage.take_calls()?,
        [
            "postgres --version".to_owned(),
            "pg_isready -h db-0.clowk-lp.voodu -p 5432 -t 5".to_owned(),
            format!(
                "pg_basebackup -h db-0.clowk-lp.voodu -p 5432 -U replicator -D {pgdata_text} -X stream"
            ),
            "PGPASSWORD=se'cret".to_owned(),
            "docker-entrypoint.sh postgres -p 5432 -c wal_keep_size=1GB".to_owned(),
        ]
    );
    assert!(pgdata.join("standby.signal").exists());
    assert!(!stage.path("data/.voodu-basebackup-incomplete").exists());
    let expected = "primary_conninfo = 'host=db-0.clowk-lp.voodu port=5432 user=replicator password=se''cret application_name=db-1'";
    assert_eq!(conninfo(), [expected]);

    // Next boot: no second clone, one conninfo line.
    let (code, _) = run(env("1", None))?;
    assert_eq!(code, 0);
    assert_eq!(
        stage.take_calls()?,
        [
            "postgres --version",
            "docker-entrypoint.sh postgres -p 5432 -c wal_keep_size=1GB"
        ]
    );
    assert_eq!(conninfo(), [expected]);

    // The config bucket moved the primary to pod 2: pod 1 follows it at its next boot.
    let (code, _) = run(env("1", Some("2")))?;
    assert_eq!(code, 0);
    assert_eq!(
        conninfo(),
        [
            "primary_conninfo = 'host=db-2.clowk-lp.voodu port=5432 user=replicator password=se''cret application_name=db-1'"
        ]
    );
    let _ = stage.take_calls()?;

    // Pod 1 promoted (PG_PRIMARY_ORDINAL = 1): it forgets its old primary.
    std::fs::remove_file(pgdata.join("standby.signal"))?;
    let (code, _) = run(env("1", Some("1")))?;
    assert_eq!(code, 0);
    assert_eq!(conninfo(), Vec::<String>::new());
    let _ = stage.take_calls()?;

    // The same data as a standby again (the primary moved away): refused, never a 2nd primary.
    let (code, stderr) = run(env("1", Some("0")))?;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("its data was last used by a primary"),
        "{stderr}"
    );
    assert_eq!(
        stage.take_calls()?,
        ["postgres --version"],
        "postgres is not started"
    );

    // A clone cut short is wiped and done again.
    std::fs::write(stage.path("data/.voodu-basebackup-incomplete"), "")?;
    std::fs::write(pgdata.join("half-copied"), "x")?;
    let (code, stderr) = run(env("1", None))?;
    assert_eq!(code, 0, "{stderr}");
    assert!(!pgdata.join("half-copied").exists());
    assert!(
        stage
            .take_calls()?
            .iter()
            .any(|call| call.starts_with("pg_basebackup -h db-0.clowk-lp.voodu"))
    );
    Ok(())
}

fn postgres_12(shell: &'static [&'static str]) -> TestResult {
    let files = asset_files(POSTGRES, "asset/clowk-lp/db")?;
    let stage = Stage::new(
        shell,
        &[
            ("postgres", "echo 'postgres (PostgreSQL) 12.19'"),
            ("docker-entrypoint.sh", ""),
        ],
    )?;
    let pgdata = stage.path("data/pgdata").display().to_string();
    let (code, _) = stage.run(&files["entrypoint"], &[("PGDATA", &pgdata)])?;
    assert_eq!(code, 0);
    assert_eq!(
        stage.take_calls()?.last().map(String::as_str),
        Some("docker-entrypoint.sh postgres -p 5432 -c wal_keep_segments=64")
    );
    Ok(())
}

fn replication_role(shell: &'static [&'static str]) -> TestResult {
    let files = asset_files(POSTGRES, "asset/clowk-lp/db")?;
    let stage = Stage::new(shell, &[("psql", "cat >> \"$STAGE/calls.log\"")])?;
    let pgdata = stage.path("pgdata");
    std::fs::create_dir(&pgdata)?;
    std::fs::write(
        pgdata.join("pg_hba.conf"),
        "host all all all scram-sha-256\n",
    )?;
    let pgdata_text = pgdata.display().to_string();
    let (code, stderr) = stage.run(
        &files["init_replication_sh"],
        &[
            ("PGDATA", &pgdata_text),
            ("POSTGRES_USER", "postgres"),
            ("PG_REPLICATION_USER", "replicator"),
            ("POSTGRES_REPLICATION_PASSWORD", "se'cret"),
        ],
    )?;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stage.take_calls()?,
        [
            "psql -v ON_ERROR_STOP=1 --username postgres --dbname postgres",
            "CREATE ROLE \"replicator\" WITH REPLICATION LOGIN PASSWORD 'se''cret';",
        ]
    );
    assert!(read(&pgdata.join("pg_hba.conf")).ends_with("host replication replicator all md5\n"));
    Ok(())
}

fn redis_roles(shell: &'static [&'static str]) -> TestResult {
    let files = asset_files(
        "redis \"clowk-lp\" \"redis\" {\n  replicas = 3\n}\n",
        "asset/clowk-lp/redis",
    )?;
    let stage = Stage::new(shell, &[("redis-server", "")])?;
    let run = |ordinal: &str, master: Option<&str>| -> TestResult<Vec<String>> {
        let mut env = vec![
            ("REDIS_NAME", "redis"),
            ("REDIS_SCOPE_SUFFIX", ".clowk-lp.voodu"),
            ("REDIS_PASSWORD", "pw"),
            ("VOODU_REPLICA_ORDINAL", ordinal),
        ];
        if let Some(master) = master {
            env.push(("REDIS_MASTER_ORDINAL", master));
        }
        let (code, stderr) = stage.run(&files["entrypoint"], &env)?;
        assert_eq!(code, 0, "{stderr}");
        stage.take_calls()
    };
    let common = "redis-server /etc/redis/redis.conf --replica-announce-ip";
    assert_eq!(
        run("0", None)?,
        [format!(
            "{common} redis-0.clowk-lp.voodu --requirepass pw --masterauth pw"
        )]
    );
    assert_eq!(
        run("2", None)?,
        [format!(
            "{common} redis-2.clowk-lp.voodu --requirepass pw --masterauth pw --replicaof redis-0.clowk-lp.voodu 6379"
        )]
    );
    assert_eq!(
        run("0", Some("1"))?,
        [format!(
            "{common} redis-0.clowk-lp.voodu --requirepass pw --masterauth pw --replicaof redis-1.clowk-lp.voodu 6379"
        )],
        "after a failover recorded in the bucket, pod 0 is a replica"
    );
    Ok(())
}

fn sentinels(shell: &'static [&'static str]) -> TestResult {
    let files = asset_files(
        "redis \"clowk-lp\" \"quorum\" {\n  sentinel { monitor = \"clowk-lp/redis\" }\n}\n",
        "asset/clowk-lp/quorum",
    )?;
    let stage = Stage::new(shell, &[("redis-server", "")])?;
    // The script's fixed paths, moved into the scratch dir (nothing else is changed).
    let state = stage.path("state").display().to_string();
    let overrides = stage.path("conf.d").display().to_string();
    let script = files["sentinel_entrypoint"]
        .replace("/var/lib/sentinel", &state)
        .replace("/etc/sentinel/conf.d", &overrides);
    let env = [
        ("REDIS_NAME", "quorum"),
        ("REDIS_SCOPE_SUFFIX", ".clowk-lp.voodu"),
        ("VOODU_REPLICA_ORDINAL", "1"),
        ("VOODU_MONITOR_SCOPE", "clowk-lp"),
        ("VOODU_MONITOR_NAME", "redis"),
        ("VOODU_REDIS_REPLICAS", "3"),
        ("REDIS_PASSWORD", "pw"),
    ];
    let (code, stderr) = stage.run(&script, &env)?;
    assert_eq!(code, 0, "{stderr}");
    let conf = format!("{state}/sentinel.conf");
    assert_eq!(
        stage.take_calls()?,
        [format!("redis-server {conf} --sentinel")]
    );
    let written = read(Path::new(&conf));
    assert_eq!(
        written.lines().collect::<Vec<_>>(),
        [
            "port 26379",
            &format!("dir {state}"),
            "sentinel resolve-hostnames yes",
            "sentinel announce-hostnames yes",
            "sentinel announce-ip quorum-1.clowk-lp.voodu",
            "sentinel monitor voodu-master redis-0.clowk-lp.voodu 6379 2",
            "sentinel down-after-milliseconds voodu-master 5000",
            "sentinel failover-timeout voodu-master 30000",
            "sentinel parallel-syncs voodu-master 1",
            "sentinel auth-pass voodu-master pw",
            &format!("include {overrides}/*.conf"),
        ]
    );
    // What sentinel learnt is kept across boots; the rest follows the bucket (master 2 now).
    std::fs::write(
        &conf,
        format!(
            "{written}sentinel myid 0123abcd\nsentinel known-sentinel voodu-master quorum-0.clowk-lp.voodu 26379 77aa\ncurrent-epoch 4\nsentinel monitor voodu-master redis-0.clowk-lp.voodu 6379 2\n"
        ),
    )?;
    let mut moved = env.to_vec();
    moved.push(("REDIS_MASTER_ORDINAL", "2"));
    let (code, _) = stage.run(&script, &moved)?;
    assert_eq!(code, 0);
    let rewritten = read(Path::new(&conf));
    assert!(rewritten.contains("sentinel monitor voodu-master redis-2.clowk-lp.voodu 6379 2\n"));
    assert!(!rewritten.contains("redis-0.clowk-lp.voodu"));
    assert!(rewritten.ends_with(
        "sentinel myid 0123abcd\nsentinel known-sentinel voodu-master quorum-0.clowk-lp.voodu 26379 77aa\ncurrent-epoch 4\n"
    ));
    Ok(())
}

const SH: &[&str] = &["sh"];
const BUSYBOX: &[&str] = &["busybox", "sh"];

#[test]
fn i12_postgres_pods_take_their_role_from_their_ordinal() -> TestResult {
    postgres_roles(SH)
}

#[test]
fn i12_postgres_before_13_keeps_wal_by_segments() -> TestResult {
    postgres_12(SH)
}

#[test]
fn i12_the_primary_creates_the_replication_role_on_its_first_boot() -> TestResult {
    replication_role(SH)
}

#[test]
fn i12_redis_pods_follow_the_master_the_bucket_names() -> TestResult {
    redis_roles(SH)
}

#[test]
fn i12_sentinels_watch_the_master_and_keep_what_they_learnt() -> TestResult {
    sentinels(SH)
}

/// The same, under busybox's shell and tools, as in the Alpine images (`redis:7-alpine`,
/// `postgres:16-alpine`).
#[cfg_attr(
    voodu_busybox_missing,
    ignore = "needs busybox on PATH: scripts/test-deps installs it"
)]
#[test]
fn i12_the_scripts_run_under_busybox_as_in_alpine_images() -> TestResult {
    postgres_roles(BUSYBOX)?;
    postgres_12(BUSYBOX)?;
    replication_role(BUSYBOX)?;
    redis_roles(BUSYBOX)?;
    sentinels(BUSYBOX)
}
