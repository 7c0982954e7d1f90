//! The `postgres` and `redis` plugin macros (spec §2.9), expanded in the agent instead of by
//! voodu's downloaded plugins: each becomes a `statefulset` with the plugin's defaults, and
//! `redis` also an `asset` holding its config and entrypoint.
//!
//! Everything the operator writes wins over a default (`env` merges per key; redis `volumes`
//! merge by container path); an operator `probes {}` replaces both default probes. Passwords
//! are never in the manifest unless the operator writes one: the expansion asks for a
//! generated one in the resource's own config bucket (`SecretRequest`), whose values every
//! container of the resource gets in its environment (spec §4.3). Defaults the agent had to
//! choose are listed in docs/differences-from-voodu.md.

use std::collections::BTreeMap;

use hcl::edit::Span;
use hcl::edit::structure::Block;

use super::decode::Cx;
use super::decode::reader::Reader;
use super::spec::{
    AssetFile, AssetSpec, ExecAction, Probe, Probes, Spec, StatefulsetSpec, TcpSocket, VolumeClaim,
    sha256_hex,
};
use crate::model::{Kind, ResourceKey};

/// A config-bucket key that must exist before the resource runs; generated when missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRequest {
    /// The app bucket `(scope, name)`.
    pub bucket: (String, String),
    pub key: String,
}

/// What one macro block expands to.
pub(crate) struct Expansion {
    pub(crate) specs: Vec<(Kind, Spec)>,
    pub(crate) secrets: Vec<SecretRequest>,
}

/// Expands a `postgres` or `redis` block whose statefulset key is `key`.
pub(crate) fn expand(cx: &mut Cx<'_>, block: &Block, key: &ResourceKey) -> Expansion {
    let macro_name = block.ident.as_str();
    let mut reader = Reader::new(macro_name, "", &block.body, block.ident.span());
    if let Some(plugin) = reader.block(cx, "plugin") {
        let mut p = reader.nested(plugin, "");
        let _ = p.string(cx, "version");
        let _ = p.string(cx, "repo");
        p.finish(cx);
        cx.warn(
            plugin.ident.span(),
            format!("`plugin {{}}` is ignored: this agent expands `{macro_name}` itself and installs no plugins"),
        );
    }
    let expansion = if macro_name == "postgres" {
        postgres(cx, &mut reader, key)
    } else {
        redis(cx, &mut reader, key)
    };
    reader.finish(cx);
    expansion
}

fn is_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && text.len() <= 63
}

fn postgres(cx: &mut Cx<'_>, r: &mut Reader<'_>, key: &ResourceKey) -> Expansion {
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
    let mut spec = super::decode::statefulset_for_macro(cx, r);
    if spec.replicas.is_some_and(|replicas| replicas > 1) {
        cx.error(
            r.span_of("replicas"),
            "postgres with replicas > 1 (streaming standbys) is not supported by this agent: use replicas = 1",
        );
    }
    if spec.container.image.is_empty() {
        spec.container.image = "postgres:latest".to_owned();
    }
    let mut env = BTreeMap::from([
        ("POSTGRES_USER".to_owned(), user.clone()),
        ("POSTGRES_DB".to_owned(), database.clone()),
        (
            "POSTGRES_INITDB_ARGS".to_owned(),
            format!("--locale={locale} --encoding={encoding}"),
        ),
        ("PGPORT".to_owned(), port.to_string()),
        (
            "PGDATA".to_owned(),
            "/var/lib/postgresql/data/pgdata".to_owned(),
        ),
    ]);
    let mut secrets = Vec::new();
    if password.is_empty() {
        secrets.push(own_secret(key, "POSTGRES_PASSWORD"));
    } else {
        env.insert("POSTGRES_PASSWORD".to_owned(), password);
    }
    merge_env(&mut spec, env);
    if spec.container.command.is_none() && !pg_config.is_empty() {
        let mut command = vec!["postgres".to_owned()];
        for (name, value) in &pg_config {
            command.push("-c".to_owned());
            command.push(format!("{name}={value}"));
        }
        spec.container.command = Some(command);
    }
    if spec.volume_claims.is_empty() {
        spec.volume_claims.push(VolumeClaim {
            name: "data".to_owned(),
            mount_path: "/var/lib/postgresql/data".to_owned(),
            size: String::new(),
        });
    }
    if spec.probes.is_none() {
        spec.probes = Some(Probes {
            liveness: Some(Probe {
                tcp_socket: Some(TcpSocket { port }),
                initial_delay: "20s".to_owned(),
                period: "10s".to_owned(),
                failure_threshold: 3,
                ..Probe::default()
            }),
            readiness: Some(Probe {
                exec: Some(ExecAction {
                    command: vec![
                        "pg_isready".to_owned(),
                        "-U".to_owned(),
                        user,
                        "-d".to_owned(),
                        database,
                        "-p".to_owned(),
                        port.to_string(),
                    ],
                }),
                period: "5s".to_owned(),
                failure_threshold: 1,
                success_threshold: 2,
                ..Probe::default()
            }),
            startup: None,
        });
    }
    Expansion {
        specs: vec![(Kind::Statefulset, Spec::Statefulset(spec))],
        secrets,
    }
}

/// The redis config the expansion materialises as asset key `redis_conf`.
const REDIS_CONF: &str = "# Written by voodu-agent's redis expansion.\nbind 0.0.0.0\nport 6379\ndir /data\nappendonly yes\nprotected-mode no\n";

/// The entrypoint, asset key `entrypoint`: requires the generated password when present.
const REDIS_ENTRYPOINT: &str = "#!/bin/sh\n# Written by voodu-agent's redis expansion.\nset -e\nif [ -n \"$REDIS_PASSWORD\" ]; then\n  exec redis-server /etc/voodu/redis.conf --requirepass \"$REDIS_PASSWORD\" \"$@\"\nfi\nexec redis-server /etc/voodu/redis.conf \"$@\"\n";

fn redis(cx: &mut Cx<'_>, r: &mut Reader<'_>, key: &ResourceKey) -> Expansion {
    r.refuse(
        &["sentinel"],
        "redis sentinel mode is not supported by this agent; run a plain redis or declare the statefulsets yourself",
    );
    let mut spec = super::decode::statefulset_for_macro(cx, r);
    if spec.container.image.is_empty() {
        spec.container.image = "redis:7-alpine".to_owned();
    }
    if spec.ports.is_empty() {
        spec.ports.push("6379".to_owned());
    }
    if spec.container.command.is_none() {
        spec.container.command = Some(vec!["sh".to_owned(), "/etc/voodu/entrypoint.sh".to_owned()]);
    }
    let reference = |asset_key: &str| {
        if key.scope.is_empty() {
            format!("${{asset.{}.{asset_key}}}", key.name)
        } else {
            format!("${{asset.{}.{}.{asset_key}}}", key.scope, key.name)
        }
    };
    let defaults = [
        format!("{}:/etc/voodu/redis.conf:ro", reference("redis_conf")),
        format!("{}:/etc/voodu/entrypoint.sh:ro", reference("entrypoint")),
    ];
    let destination = |volume: &str| volume.split(':').nth(1).map(str::to_owned);
    for default in defaults {
        let taken = spec
            .container
            .volumes
            .iter()
            .any(|volume| destination(volume) == destination(&default));
        if !taken {
            spec.container.volumes.push(default);
        }
    }
    if spec.volume_claims.is_empty() {
        spec.volume_claims.push(VolumeClaim {
            name: "data".to_owned(),
            mount_path: "/data".to_owned(),
            size: String::new(),
        });
    }
    if spec.probes.is_none() {
        spec.probes = Some(Probes {
            liveness: Some(Probe {
                tcp_socket: Some(TcpSocket { port: 6379 }),
                period: "10s".to_owned(),
                failure_threshold: 3,
                ..Probe::default()
            }),
            readiness: Some(Probe {
                exec: Some(ExecAction {
                    command: vec![
                        "sh".to_owned(),
                        "-c".to_owned(),
                        "redis-cli -a \"$REDIS_PASSWORD\" --no-auth-warning ping | grep -q PONG"
                            .to_owned(),
                    ],
                }),
                period: "5s".to_owned(),
                failure_threshold: 1,
                success_threshold: 2,
                ..Probe::default()
            }),
            startup: None,
        });
    }
    let mut asset = AssetSpec::default();
    for (asset_key, content) in [("redis_conf", REDIS_CONF), ("entrypoint", REDIS_ENTRYPOINT)] {
        let digest = sha256_hex(content.as_bytes());
        cx.blobs.insert(digest.clone(), content.as_bytes().to_vec());
        asset.files.insert(
            asset_key.to_owned(),
            AssetFile {
                source: "inline".to_owned(),
                origin: String::new(),
                on_failure: String::new(),
                digest,
                size: content.len() as u64,
                sealed: false,
            },
        );
    }
    // The default volumes refer to the expansion's own asset: record them like written refs.
    for volume in &spec.container.volumes {
        for asset_key in ["redis_conf", "entrypoint"] {
            if volume.starts_with(&reference(asset_key)) {
                cx.record_reference(
                    super::interpolate::Reference::Asset {
                        scope: (!key.scope.is_empty()).then(|| key.scope.clone()),
                        name: key.name.clone(),
                        key: asset_key.to_owned(),
                    },
                    r.anchor.clone(),
                );
            }
        }
    }
    Expansion {
        specs: vec![
            (Kind::Asset, Spec::Asset(asset)),
            (Kind::Statefulset, Spec::Statefulset(spec)),
        ],
        secrets: vec![own_secret(key, "REDIS_PASSWORD")],
    }
}

fn own_secret(key: &ResourceKey, name: &str) -> SecretRequest {
    SecretRequest {
        bucket: (key.scope.clone(), key.name.clone()),
        key: name.to_owned(),
    }
}

/// Defaults under the operator's `env` (operator wins per key).
fn merge_env(spec: &mut StatefulsetSpec, defaults: BTreeMap<String, String>) {
    for (name, value) in defaults {
        spec.container.env.entry(name).or_insert(value);
    }
}
