//! The `postgres` and `redis` plugin macros (spec §2.9; voodu 2026), expanded in the agent
//! instead of by voodu's downloaded plugins (`thadeu/voodu-postgres`, `thadeu/voodu-redis`):
//! each becomes an `asset` holding the scripts its pods run and a `statefulset` set up the
//! way the plugin sets it up: ordinal 0 (or the ordinal the config bucket names) is the
//! postgres primary or the redis master, every other ordinal a streaming standby or a
//! replica; `redis { sentinel { monitor = "scope/name" } }` runs a sentinel quorum instead.
//! `postgres.rs` and `redis.rs` hold each macro; the `*.sh` files beside them are the
//! scripts, written into the asset verbatim.
//!
//! Everything the operator writes wins over a default (`env` merges per key; `volumes` merge
//! by container path); an operator `probes {}` replaces both default probes; an operator
//! `command` replaces the role-aware entrypoint (and with it replication). Passwords are never
//! in the manifest unless the operator writes one: the expansion asks for generated ones in
//! the resource's own config bucket (`SecretRequest`), whose values every container of the
//! resource gets in its environment (spec §4.3). Defaults the agent had to choose are listed
//! in docs/differences-from-voodu.md.
//!
//! Invariant: an expansion is a pure function of the block (and the resource's key): the
//! role of a pod is decided when it starts, from its environment, so the same spec serves
//! every ordinal and a change of primary needs no new commit.

mod postgres;
mod redis;

use std::collections::BTreeMap;

use hcl::edit::Span;
use hcl::edit::structure::Block;

use super::decode::reader::{DecodeCx, Reader};
use super::interpolate::Reference;
use super::spec::{
    AssetFile, AssetSpec, ExecAction, Probe, Probes, Spec, StatefulsetSpec, TcpSocket, VolumeClaim,
    sha256_hex,
};
use crate::model::{Kind, ResourceKey};

/// A config-bucket key that must exist before the resource runs; generated when missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRequest {
    /// The app bucket `(scope, name)`.
    pub(crate) bucket: (String, String),
    pub key: String,
}

/// What one macro block expands to.
pub(crate) struct Expansion {
    pub(crate) specs: Vec<(Kind, Spec)>,
    pub(crate) secrets: Vec<SecretRequest>,
}

/// Expands a `postgres` or `redis` block whose statefulset key is `key`.
pub(crate) fn expand(cx: &mut DecodeCx<'_>, block: &Block, key: &ResourceKey) -> Expansion {
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
        postgres::expand(cx, &mut reader, key)
    } else {
        redis::expand(cx, &mut reader, key)
    };
    reader.finish(cx);
    expansion
}

/// The asset a macro writes beside its statefulset: the same scope and name, one file per
/// `(key, content)`, each mounted read-only at its path by `mount_files`.
struct Files {
    asset: AssetSpec,
    /// `(asset key, container path)`, in mount order.
    mounts: Vec<(&'static str, &'static str)>,
}

impl Files {
    /// The asset of `files` (`(asset key, content, container path)`), each mounted read-only.
    fn new(cx: &mut DecodeCx<'_>, files: &[(&'static str, &str, &'static str)]) -> Files {
        let mut asset = Files {
            asset: AssetSpec::default(),
            mounts: Vec::new(),
        };
        for (key, content, path) in files {
            asset.add(cx, key, content, path);
        }
        asset
    }

    /// Adds a file the statefulset mounts read-only at `path`.
    fn add(&mut self, cx: &mut DecodeCx<'_>, key: &'static str, content: &str, path: &'static str) {
        let digest = sha256_hex(content.as_bytes());
        cx.blobs.insert(digest.clone(), content.as_bytes().to_vec());
        self.asset.files.insert(
            key.to_owned(),
            AssetFile {
                source: "inline".to_owned(),
                origin: String::new(),
                on_failure: String::new(),
                digest,
                size: content.len() as u64,
                sealed: false,
            },
        );
        self.mounts.push((key, path));
    }

    /// Mounts every file into `spec` unless the operator mounts something at that path, and
    /// records the references the mounts make (as written ones would be).
    fn mount_into(
        &self,
        cx: &mut DecodeCx<'_>,
        r: &Reader<'_>,
        key: &ResourceKey,
        spec: &mut StatefulsetSpec,
    ) {
        let destination = |volume: &str| volume.split(':').nth(1).map(str::to_owned);
        for (asset_key, path) in &self.mounts {
            let mount = format!("{}:{path}:ro", asset_reference(key, asset_key));
            let taken = spec
                .container
                .volumes
                .iter()
                .any(|volume| destination(volume) == destination(&mount));
            if taken {
                continue;
            }
            spec.container.volumes.push(mount);
            cx.record_reference(
                Reference::Asset {
                    scope: (!key.scope.is_empty()).then(|| key.scope.clone()),
                    name: key.name.clone(),
                    key: (*asset_key).to_owned(),
                },
                r.anchor.clone(),
            );
        }
    }

    /// The macro's expansion: this asset, then `spec` with the files mounted (`mount_into`)
    /// and its default volume claim (`default_claim`: `(name, mount path)`).
    fn expansion(
        self,
        cx: &mut DecodeCx<'_>,
        r: &Reader<'_>,
        key: &ResourceKey,
        mut spec: StatefulsetSpec,
        (claim, mount_path): (&str, &str),
        secrets: Vec<SecretRequest>,
    ) -> Expansion {
        self.mount_into(cx, r, key, &mut spec);
        default_claim(&mut spec, claim, mount_path);
        Expansion {
            specs: vec![
                (Kind::Asset, Spec::Asset(self.asset)),
                (Kind::Statefulset, Spec::Statefulset(spec)),
            ],
            secrets,
        }
    }
}

/// `${asset.<scope>.<name>.<key>}` of the macro's own asset (`${asset.<name>.<key>}` unscoped).
fn asset_reference(key: &ResourceKey, asset_key: &str) -> String {
    if key.scope.is_empty() {
        format!("${{asset.{}.{asset_key}}}", key.name)
    } else {
        format!("${{asset.{}.{}.{asset_key}}}", key.scope, key.name)
    }
}

/// The DNS suffix of a pod name of `key`'s scope: `.<scope>.voodu` (`.voodu` unscoped), as
/// the statefulset handler's aliases give every pod `<name>-<n><suffix>`.
fn scope_suffix(scope: &str) -> String {
    if scope.is_empty() {
        ".voodu".to_owned()
    } else {
        format!(".{scope}.voodu")
    }
}

fn is_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && text.len() <= 63
}

/// Every key a macro generates in its resource's own bucket (`own_secret`): a branch
/// preview copies its base scope's buckets without them, so it gets fresh ones.
pub(crate) const GENERATED_KEYS: &[&str] = &[
    "POSTGRES_PASSWORD",
    "POSTGRES_REPLICATION_PASSWORD",
    "REDIS_PASSWORD",
];

fn own_secret(key: &ResourceKey, name: &str) -> SecretRequest {
    debug_assert!(
        GENERATED_KEYS.contains(&name),
        "{name} is not in GENERATED_KEYS"
    );
    SecretRequest {
        bucket: (key.scope.clone(), key.name.clone()),
        key: name.to_owned(),
    }
}

/// Defaults under the operator's `env` (operator wins per key).
/// The macro's volume claim `name` at `mount_path`, unless the block declares its own claims.
fn default_claim(spec: &mut StatefulsetSpec, name: &str, mount_path: &str) {
    if spec.volume_claims.is_empty() {
        spec.volume_claims.push(VolumeClaim {
            name: name.to_owned(),
            mount_path: mount_path.to_owned(),
            size: String::new(),
        });
    }
}

fn merge_env(spec: &mut StatefulsetSpec, defaults: BTreeMap<String, String>) {
    for (name, value) in defaults {
        spec.container.env.entry(name).or_insert(value);
    }
}

/// The probes a macro's pods get when the block declares none, as voodu's plugins set them
/// up: liveness the port open (every 10s after `liveness_delay`, 3 failures), readiness
/// `readiness` exits 0 (every 5s, 1 failure, 2 successes).
fn default_probes(port: i64, liveness_delay: &str, readiness: Vec<String>) -> Probes {
    Probes {
        liveness: Some(Probe {
            tcp_socket: Some(TcpSocket { port }),
            initial_delay: liveness_delay.to_owned(),
            period: "10s".to_owned(),
            failure_threshold: 3,
            ..Probe::default()
        }),
        readiness: Some(Probe {
            exec: Some(ExecAction { command: readiness }),
            period: "5s".to_owned(),
            failure_threshold: 1,
            success_threshold: 2,
            ..Probe::default()
        }),
        startup: None,
    }
}

#[cfg(test)]
mod tests;
