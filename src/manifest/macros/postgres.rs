//! `postgres "scope" "name" { … }` (spec §2.9; voodu-postgres da3253d): a statefulset whose
//! pods run `postgres-entrypoint.sh`. The pod whose ordinal is `PG_PRIMARY_ORDINAL` (0 unless
//! the resource's config bucket says otherwise) is the primary; with `replicas > 1` every
//! other pod clones it once with `pg_basebackup` and streams from it as a hot standby, as the
//! plugin sets them up: a `replication_user` role with a generated
//! `POSTGRES_REPLICATION_PASSWORD`, created on the primary's first boot by
//! `postgres-init-replication.sh`, no replication slots but a bounded `wal_keep_size`.
//!
//! `version = "16"` (voodu's cross-vm docs) picks the image tag when `image` is not set.
//! `wal_archive {}`, a block voodu-postgres no longer has, is ignored with a warning, as
//! voodu's controller drops unknown keys of a plugin block.

use std::collections::BTreeMap;

use hcl::edit::Span;

use super::{Expansion, Files, Reader, is_identifier, merge_env, own_secret, scope_suffix};
use crate::manifest::decode::reader::DecodeCx;
use crate::manifest::spec::{Macro, Probes};
use crate::model::ResourceKey;

/// The entrypoint every pod runs (asset key `entrypoint`).
const ENTRYPOINT: &str = include_str!("postgres-entrypoint.sh");
const ENTRYPOINT_PATH: &str = "/usr/local/bin/voodu-postgres-entrypoint";

/// Run once after initdb on the primary (asset key `init_replication_sh`).
const INIT_REPLICATION: &str = include_str!("postgres-init-replication.sh");
const INIT_REPLICATION_PATH: &str = "/docker-entrypoint-initdb.d/00_create_replication.sh";

pub(super) fn expand(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, key: &ResourceKey) -> Expansion {
    let fields = fields(cx, r);
    let mut spec = crate::manifest::decode::kinds::statefulset_for_macro(cx, r);
    spec.expanded_from = Some(Macro::Postgres);
    if spec.container.image.is_empty() {
        spec.container.image = if fields.version.is_empty() {
            "postgres:latest".to_owned()
        } else {
            format!("postgres:{}", fields.version)
        };
    } else if !fields.version.is_empty() {
        cx.warn(
            r.span_of("version"),
            format!(
                "postgres `version` {:?} is ignored: `image` ({}) is set and wins",
                fields.version, spec.container.image
            ),
        );
    }
    let mut env = BTreeMap::from([
        ("POSTGRES_USER".to_owned(), fields.user.clone()),
        ("POSTGRES_DB".to_owned(), fields.database.clone()),
        (
            "POSTGRES_INITDB_ARGS".to_owned(),
            format!("--locale={} --encoding={}", fields.locale, fields.encoding),
        ),
        ("PGPORT".to_owned(), fields.port.to_string()),
        (
            "PGDATA".to_owned(),
            "/var/lib/postgresql/data/pgdata".to_owned(),
        ),
        ("PG_NAME".to_owned(), key.name.clone()),
        ("PG_SCOPE_SUFFIX".to_owned(), scope_suffix(&key.scope)),
        ("PG_REPLICATION_USER".to_owned(), fields.replication_user),
    ]);
    let mut secrets = vec![own_secret(key, "POSTGRES_REPLICATION_PASSWORD")];
    if fields.password.is_empty() {
        secrets.insert(0, own_secret(key, "POSTGRES_PASSWORD"));
    } else {
        env.insert("POSTGRES_PASSWORD".to_owned(), fields.password);
    }
    merge_env(&mut spec, env);
    if spec.container.command.is_none() {
        let mut command = vec!["sh".to_owned(), ENTRYPOINT_PATH.to_owned()];
        for (name, value) in &fields.pg_config {
            command.push("-c".to_owned());
            command.push(format!("{name}={value}"));
        }
        spec.container.command = Some(command);
    }
    if spec.probes.is_none() {
        spec.probes = Some(Box::new(default_probes(
            fields.port,
            fields.user,
            fields.database,
        )));
    }
    let files = Files::new(
        cx,
        &[
            ("entrypoint", ENTRYPOINT, ENTRYPOINT_PATH),
            (
                "init_replication_sh",
                INIT_REPLICATION,
                INIT_REPLICATION_PATH,
            ),
        ],
    );
    let claim = ("data", "/var/lib/postgresql/data");
    files.expansion(cx, r, key, spec, claim, secrets)
}

/// The postgres macro's own fields, with voodu's defaults.
struct Fields {
    database: String,
    user: String,
    password: String,
    locale: String,
    encoding: String,
    pg_config: BTreeMap<String, String>,
    replication_user: String,
    port: i64,
    version: String,
}

/// Reads and checks the macro's own fields (the statefulset fields are read after them).
fn fields(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Fields {
    let database = r
        .string(cx, "database")
        .unwrap_or_else(|| "postgres".to_owned());
    let user = r
        .string(cx, "user")
        .unwrap_or_else(|| "postgres".to_owned());
    let password = r.string(cx, "password").unwrap_or_default();
    let locale = r
        .string(cx, "initdb_locale")
        .unwrap_or_else(|| "C.UTF-8".to_owned());
    let encoding = r
        .string(cx, "initdb_encoding")
        .unwrap_or_else(|| "UTF8".to_owned());
    let pg_config = r.map(cx, "pg_config").unwrap_or_default();
    let extensions = r.strings(cx, "extensions").unwrap_or_default();
    let replication_user = r
        .string(cx, "replication_user")
        .unwrap_or_else(|| "replicator".to_owned());
    let port = r.int(cx, "port").unwrap_or(5432);
    let version = r.string(cx, "version").unwrap_or_default();
    if let Some(archive) = r.block(cx, "wal_archive") {
        cx.warn(
            archive.ident.span(),
            "`wal_archive {}` is ignored: voodu-postgres no longer has a WAL archive and voodu drops the block; archive WAL yourself (`pg_config = { archive_mode = \"on\", archive_command = … }`)",
        );
    }
    for (field, value) in [
        ("database", &database),
        ("user", &user),
        ("replication_user", &replication_user),
    ] {
        if !is_identifier(value) {
            cx.error(
                r.span_of(field),
                format!(
                    "postgres `{field}` {value:?} must match ^[a-zA-Z_][a-zA-Z0-9_]*$ (1–63 chars)"
                ),
            );
        }
    }
    for extension in &extensions {
        if !is_identifier(extension) {
            cx.error(
                r.span_of("extensions"),
                format!("postgres extension {extension:?} is not an identifier"),
            );
        }
    }
    if replication_user == user {
        cx.error(
            r.span_of("replication_user"),
            "postgres `replication_user` must differ from `user`",
        );
    }
    for config_key in pg_config.keys() {
        let valid = config_key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase())
            && config_key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            cx.error(
                r.span_of("pg_config"),
                format!("postgres pg_config key {config_key:?} must match ^[a-z][a-z0-9_]*$"),
            );
        }
    }
    if !(1..=65535).contains(&port) {
        cx.error(
            r.span_of("port"),
            format!("postgres `port` must be 1–65535, got {port}"),
        );
    }
    if !version.is_empty() && !is_tag(&version) {
        cx.error(
            r.span_of("version"),
            format!(
                "postgres `version` {version:?} is not an image tag: write e.g. \"16\" or \"16.4-alpine\" (it picks the image postgres:<version>)"
            ),
        );
    }
    Fields {
        database,
        user,
        password,
        locale,
        encoding,
        pg_config,
        replication_user,
        port,
        version,
    }
}

/// voodu-postgres's probes when the block declares none: the port open, then `pg_isready`.
fn default_probes(port: i64, user: String, database: String) -> Probes {
    let pg_isready = vec![
        "pg_isready".to_owned(),
        "-U".to_owned(),
        user,
        "-d".to_owned(),
        database,
        "-p".to_owned(),
        port.to_string(),
    ];
    super::default_probes(port, "20s", pg_isready)
}

/// Docker's tag grammar: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn is_tag(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && text.len() <= 128
}
