//! What the `postgres` and `redis` macros expand to: the specs, environment, commands,
//! mounts and secrets each pod gets, and the problems reported where they are written. The
//! scripts themselves are run, with stand-in postgres and redis binaries, by the integration
//! test `tests/it/macro_scripts.rs`.

use std::collections::BTreeMap;

use super::super::spec::{Spec, StatefulsetSpec};
use super::super::tests::snapshot;
use super::super::{Diagnostics, LoadOptions, Manifest, load};

fn load_text(text: &str) -> Result<Manifest, Diagnostics> {
    load(&snapshot(&[("m/db.hcl", text)]), &LoadOptions::standalone())
}

fn statefulset(manifest: &Manifest, key: &str) -> StatefulsetSpec {
    let spec = manifest
        .resources
        .iter()
        .find(|resource| resource.key.to_string() == key)
        .map(|resource| resource.spec.clone());
    match spec {
        Some(Spec::Statefulset(spec)) => spec,
        other => panic!("{key} is not a statefulset: {other:?}"),
    }
}

/// The asset `key`'s files as text, by asset key.
fn files(manifest: &Manifest, key: &str) -> BTreeMap<String, String> {
    let Some(Spec::Asset(asset)) = manifest
        .resources
        .iter()
        .find(|resource| resource.key.to_string() == key)
        .map(|resource| &resource.spec)
    else {
        panic!("{key} is not an asset");
    };
    asset
        .files
        .iter()
        .map(|(name, file)| {
            let bytes = manifest.blobs.get(&file.digest).expect("blob stored");
            (name.clone(), String::from_utf8_lossy(bytes).into_owned())
        })
        .collect()
}

fn secrets(manifest: &Manifest) -> Vec<String> {
    manifest
        .secrets
        .iter()
        .map(|secret| format!("{}/{}:{}", secret.bucket.0, secret.bucket.1, secret.key))
        .collect()
}

fn messages(diagnostics: &[super::super::Diagnostic]) -> Vec<String> {
    diagnostics.iter().map(ToString::to_string).collect()
}

#[test]
fn postgres_replicas_run_one_primary_and_streaming_standbys() -> Result<(), Diagnostics> {
    let manifest = load_text(
        r#"postgres "clowk-lp" "db" {
  version  = "16"
  replicas = 3
  database = "app"
  pg_config = {
    max_connections = 50
    shared_buffers  = "256MB"
  }
}
"#,
    )?;
    let pg = statefulset(&manifest, "statefulset/clowk-lp/db");
    assert_eq!(pg.container.image, "postgres:16", "version picks the tag");
    assert_eq!(pg.replicas, Some(3));
    assert_eq!(
        pg.container.command.as_deref(),
        Some(
            &[
                "sh",
                "/usr/local/bin/voodu-postgres-entrypoint",
                "-c",
                "max_connections=50",
                "-c",
                "shared_buffers=256MB"
            ]
            .map(String::from)[..]
        ),
        "every pod runs the role-aware entrypoint; pg_config applies from the first boot"
    );
    let env: Vec<(&str, &str)> = pg
        .container
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        env,
        [
            ("PGDATA", "/var/lib/postgresql/data/pgdata"),
            ("PGPORT", "5432"),
            ("PG_NAME", "db"),
            ("PG_REPLICATION_USER", "replicator"),
            ("PG_SCOPE_SUFFIX", ".clowk-lp.voodu"),
            ("POSTGRES_DB", "app"),
            ("POSTGRES_INITDB_ARGS", "--locale=C.UTF-8 --encoding=UTF8"),
            ("POSTGRES_USER", "postgres"),
        ],
        "no password and no primary ordinal in the spec: both come from the config bucket"
    );
    assert_eq!(
        secrets(&manifest),
        [
            "clowk-lp/db:POSTGRES_PASSWORD",
            "clowk-lp/db:POSTGRES_REPLICATION_PASSWORD"
        ]
    );
    assert_eq!(
        pg.container.volumes,
        [
            "${asset.clowk-lp.db.entrypoint}:/usr/local/bin/voodu-postgres-entrypoint:ro",
            "${asset.clowk-lp.db.init_replication_sh}:/docker-entrypoint-initdb.d/00_create_replication.sh:ro",
        ]
    );
    assert_eq!(pg.volume_claims[0].mount_path, "/var/lib/postgresql/data");
    assert_eq!(
        pg.roles().as_deref(),
        Some("postgres: primary pod 0 and 2 streaming standbys (pods 1–2)")
    );
    let scripts = files(&manifest, "asset/clowk-lp/db");
    assert_eq!(
        scripts.keys().collect::<Vec<_>>(),
        ["entrypoint", "init_replication_sh"]
    );
    assert!(scripts["entrypoint"].contains("pg_basebackup -h \"$host\""));
    assert!(scripts["init_replication_sh"].contains("WITH REPLICATION LOGIN"));
    assert_eq!(
        pg.asset_digests.keys().collect::<Vec<_>>(),
        ["clowk-lp.db.entrypoint", "clowk-lp.db.init_replication_sh"],
        "a new script version rolls the pods"
    );
    Ok(())
}

#[test]
fn postgres_operator_fields_win_and_stale_fields_warn() -> Result<(), Diagnostics> {
    let manifest = load_text(
        r#"postgres "data" "pg" {
  image    = "postgres:17"
  version  = "16"
  password = "dev"
  command  = ["postgres"]
  volumes  = ["/srv/init.sh:/docker-entrypoint-initdb.d/00_create_replication.sh:ro"]
  wal_archive {
    enabled = true
  }
}
"#,
    )?;
    let pg = statefulset(&manifest, "statefulset/data/pg");
    assert_eq!(pg.container.image, "postgres:17");
    assert_eq!(
        pg.container.command.as_deref(),
        Some(&["postgres".to_owned()][..])
    );
    assert_eq!(
        pg.container
            .env
            .get("POSTGRES_PASSWORD")
            .map(String::as_str),
        Some("dev")
    );
    assert_eq!(
        secrets(&manifest),
        ["data/pg:POSTGRES_REPLICATION_PASSWORD"]
    );
    assert_eq!(
        pg.container.volumes,
        [
            "/srv/init.sh:/docker-entrypoint-initdb.d/00_create_replication.sh:ro",
            "${asset.data.pg.entrypoint}:/usr/local/bin/voodu-postgres-entrypoint:ro",
        ],
        "an operator mount at a default's path replaces it"
    );
    assert_eq!(
        messages(&manifest.warnings),
        [
            "m/db.hcl:3:3: postgres `version` \"16\" is ignored: `image` (postgres:17) is set and wins",
            "m/db.hcl:7:3: `wal_archive {}` is ignored: voodu-postgres no longer has a WAL archive and voodu drops the block; archive WAL yourself (`pg_config = { archive_mode = \"on\", archive_command = … }`)",
        ]
    );
    Ok(())
}

#[test]
fn postgres_problems_are_reported_where_written() {
    let Err(diagnostics) = load_text(
        "postgres \"data\" \"pg\" {\n  version = \"16 beta\"\n  replication_user = \"postgres\"\n}\n",
    ) else {
        panic!("must be rejected");
    };
    assert_eq!(
        messages(&diagnostics.0),
        [
            "m/db.hcl:2:3: postgres `version` \"16 beta\" is not an image tag: write e.g. \"16\" or \"16.4-alpine\" (it picks the image postgres:<version>)",
            "m/db.hcl:3:3: postgres `replication_user` must differ from `user`",
        ]
    );
}

#[test]
fn redis_replicas_run_one_master_and_replicas() -> Result<(), Diagnostics> {
    let manifest = load_text(
        "redis \"clowk-lp\" \"redis\" {\n  image    = \"redis:8\"\n  replicas = 3\n  volumes  = [\"/srv/users.conf:/etc/redis/conf.d/users.conf:ro\"]\n}\n",
    )?;
    let redis = statefulset(&manifest, "statefulset/clowk-lp/redis");
    assert_eq!(
        redis.container.command.as_deref(),
        Some(
            &[
                "sh".to_owned(),
                "/usr/local/bin/voodu-redis-entrypoint".to_owned()
            ][..]
        )
    );
    assert_eq!(redis.ports, ["6379"]);
    assert_eq!(
        redis.container.volumes,
        [
            "/srv/users.conf:/etc/redis/conf.d/users.conf:ro",
            "${asset.clowk-lp.redis.redis_conf}:/etc/redis/redis.conf:ro",
            "${asset.clowk-lp.redis.entrypoint}:/usr/local/bin/voodu-redis-entrypoint:ro",
        ]
    );
    assert_eq!(
        redis
            .container
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>(),
        ["REDIS_NAME=redis", "REDIS_SCOPE_SUFFIX=.clowk-lp.voodu"]
    );
    assert_eq!(secrets(&manifest), ["clowk-lp/redis:REDIS_PASSWORD"]);
    assert_eq!(
        redis.roles().as_deref(),
        Some("redis: master pod 0 and 2 replicas (pods 1–2)")
    );
    let conf = &files(&manifest, "asset/clowk-lp/redis")["redis_conf"];
    assert!(conf.contains("include /etc/redis/conf.d/*.conf"), "{conf}");
    Ok(())
}

#[test]
fn a_sentinel_block_runs_a_quorum_watching_the_data_redis() -> Result<(), Diagnostics> {
    let manifest = load_text(
        r#"redis "clowk-lp" "redis" {
  replicas = 3
}
redis "clowk-lp" "quorum" {
  env_from = ["clowk-lp/redis", "shared/ops"]
  sentinel {
    monitor = "clowk-lp/redis"
  }
  env = { VOODU_CONTROLLER_URL = "http://host.docker.internal:8080" }
}
"#,
    )?;
    let quorum = statefulset(&manifest, "statefulset/clowk-lp/quorum");
    assert_eq!(quorum.replicas, Some(3), "three sentinels unless told");
    assert_eq!(quorum.container.image, "redis:7-alpine");
    assert_eq!(quorum.ports, ["26379"]);
    assert_eq!(
        quorum.container.command.as_deref(),
        Some(
            &[
                "sh".to_owned(),
                "/usr/local/bin/voodu-sentinel-entrypoint".to_owned()
            ][..]
        )
    );
    assert_eq!(
        quorum.container.env_from,
        ["shared/ops", "clowk-lp/redis"],
        "the monitored redis's bucket (password, master ordinal) comes last, once"
    );
    assert_eq!(
        quorum
            .container
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>(),
        [
            "REDIS_NAME=quorum",
            "REDIS_SCOPE_SUFFIX=.clowk-lp.voodu",
            "VOODU_CONTROLLER_URL=http://host.docker.internal:8080",
            "VOODU_MONITOR_NAME=redis",
            "VOODU_MONITOR_SCOPE=clowk-lp",
            "VOODU_REDIS_REPLICAS=3",
        ]
    );
    assert_eq!(quorum.volume_claims[0].mount_path, "/var/lib/sentinel");
    assert!(
        quorum.probes.is_none(),
        "the plugin gives sentinels no probes"
    );
    assert_eq!(
        quorum.roles().as_deref(),
        Some("redis sentinel: 3 sentinel(s), quorum 2, watching clowk-lp/redis")
    );
    assert_eq!(
        files(&manifest, "asset/clowk-lp/quorum")
            .keys()
            .collect::<Vec<_>>(),
        ["sentinel_entrypoint"]
    );
    assert_eq!(
        secrets(&manifest),
        ["clowk-lp/redis:REDIS_PASSWORD"],
        "a sentinel generates no password of its own"
    );
    Ok(())
}

#[test]
fn sentinel_problems_are_reported_where_written() {
    let cases = [
        (
            "replicas = 2\n  sentinel { monitor = \"s/data\" }",
            "m/db.hcl:2:3: a redis sentinel quorum of 2 replicas is refused: 2 sentinels need both to agree, so losing one stops failover; use 1 (an observer, no failover) or 3 or more",
        ),
        (
            "sentinel { monitor = \"other/data\" }",
            "m/db.hcl:2:14: sentinel.monitor \"other/data\" is in scope \"other\", but this sentinel is in \"s\": a sentinel watches a redis of its own scope",
        ),
        (
            "sentinel { monitor = \"s/q\" }",
            "m/db.hcl:2:14: sentinel.monitor \"s/q\" names this sentinel itself: name the data redis it watches",
        ),
        (
            "sentinel { monitor = \"data\" }",
            "m/db.hcl:2:14: sentinel.monitor \"data\" must name the redis to watch as \"scope/name\", e.g. monitor = \"s/redis\"",
        ),
    ];
    for (body, expected) in cases {
        let text = format!("redis \"s\" \"q\" {{\n  {body}\n}}\n");
        match load_text(&text) {
            Ok(_) => panic!("{body}: must be rejected"),
            Err(diagnostics) => assert_eq!(messages(&diagnostics.0), [expected], "{body}"),
        }
    }
}

#[test]
fn a_disabled_sentinel_block_leaves_a_data_redis() -> Result<(), Diagnostics> {
    let manifest = load_text(
        "redis \"s\" \"r\" {\n  sentinel {\n    enabled = false\n    monitor = \"s/x\"\n  }\n}\n",
    )?;
    let redis = statefulset(&manifest, "statefulset/s/r");
    assert_eq!(redis.ports, ["6379"]);
    assert_eq!(secrets(&manifest), ["s/r:REDIS_PASSWORD"]);
    Ok(())
}

#[test]
fn a_sentinel_watching_an_undeclared_redis_is_warned_about() -> Result<(), Diagnostics> {
    let manifest = load_text(
        "redis \"s\" \"quorum\" {\n  sentinel { monitor = \"s/data\" }\n}\nstatefulset \"s\" \"data\" {\n  image = \"redis:8\"\n}\n",
    )?;
    assert_eq!(
        messages(&manifest.warnings),
        [
            "m/db.hcl:1:1: sentinel watches redis \"data\" of scope \"s\", which this commit does not declare; its pods wait for that redis's config bucket"
        ],
        "a plain statefulset is no redis: it has no password bucket for the sentinels"
    );
    Ok(())
}

/// A macro's statefulset takes the `backup {}` extension as a plain one does; the macro's own
/// claim is what a `stop` backup reads.
#[test]
fn a_macro_statefulset_takes_a_backup_block() -> Result<(), Diagnostics> {
    let manifest = load_text(
        r#"
postgres "shop" "db" {
  backup {
    repository      = "/srv/backups/shop-db"
    password_file   = "/srv/backups/shop-db.pass"
    mode            = "exec"
    command         = ["pg_dump", "-U", "postgres", "-Fc", "app"]
    restore_command = ["pg_restore", "-U", "postgres", "--clean", "-d", "app"]
  }
}
redis "shop" "cache" {
  backup {
    repository    = "s3:s3.amazonaws.com/shop-cache"
    password_file = "/srv/backups/shop-cache.pass"
  }
}
"#,
    )?;
    let pg = statefulset(&manifest, "statefulset/shop/db");
    let backup = pg.backup.expect("the postgres backup");
    assert_eq!(backup.mode, crate::manifest::spec::BackupMode::Exec);
    assert_eq!(backup.command[0], "pg_dump");
    let cache = statefulset(&manifest, "statefulset/shop/cache");
    assert!(!cache.volume_claims.is_empty());
    assert_eq!(
        cache.backup.map(|backup| backup.mode),
        Some(crate::manifest::spec::BackupMode::Stop)
    );
    Ok(())
}
