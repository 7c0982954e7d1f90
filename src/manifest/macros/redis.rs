//! `redis "scope" "name" { … }` (spec §2.9; voodu-redis 4dd3b77): a statefulset whose pods
//! run `redis-entrypoint.sh` with `redis.conf`. The pod whose ordinal is
//! `REDIS_MASTER_ORDINAL` (0 unless the resource's config bucket says otherwise) is the
//! master; with `replicas > 1` every other pod replicates it, as the plugin sets them up.
//!
//! With a `sentinel { monitor = "scope/name" }` block the resource is a sentinel quorum
//! instead (`redis-sentinel-entrypoint.sh`): `replicas` sentinels (default 3; 2 is refused,
//! since a quorum of 2 out of 2 survives no loss) on port 26379 watching the monitored redis
//! of the same scope, whose config bucket (its password and master ordinal) they read
//! through `env_from`. `enabled = false` turns the block off. voodu's failover hook, which
//! calls its controller back, has no counterpart: after a failover, record the new master
//! with `voodu-agent config set <scope>/<name> REDIS_MASTER_ORDINAL=<n>`.

use std::collections::BTreeMap;

use hcl::edit::Span;

use super::{Expansion, Files, Reader, merge_env, own_secret, scope_suffix};
use crate::manifest::decode::reader::DecodeCx;
use crate::manifest::spec::{Macro, StatefulsetSpec};
use crate::model::{Kind, ResourceKey};

/// The data redis's config (asset key `redis_conf`).
const CONF: &str = include_str!("redis.conf");
const CONF_PATH: &str = "/etc/redis/redis.conf";

/// The data redis's entrypoint (asset key `entrypoint`).
const ENTRYPOINT: &str = include_str!("redis-entrypoint.sh");
const ENTRYPOINT_PATH: &str = "/usr/local/bin/voodu-redis-entrypoint";

/// A sentinel's entrypoint (asset key `sentinel_entrypoint`).
const SENTINEL_ENTRYPOINT: &str = include_str!("redis-sentinel-entrypoint.sh");
const SENTINEL_ENTRYPOINT_PATH: &str = "/usr/local/bin/voodu-sentinel-entrypoint";

const DEFAULT_IMAGE: &str = "redis:7-alpine";

pub(super) fn expand(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, key: &ResourceKey) -> Expansion {
    let monitor = sentinel(cx, r, key);
    let mut spec = crate::manifest::decode::kinds::statefulset_for_macro(cx, r);
    if spec.container.image.is_empty() {
        spec.container.image = DEFAULT_IMAGE.to_owned();
    }
    merge_env(
        &mut spec,
        BTreeMap::from([
            ("REDIS_NAME".to_owned(), key.name.clone()),
            ("REDIS_SCOPE_SUFFIX".to_owned(), scope_suffix(&key.scope)),
        ]),
    );
    match monitor {
        Some(monitor) => sentinel_quorum(cx, r, key, spec, &monitor),
        None => data_redis(cx, r, key, spec),
    }
}

fn data_redis(
    cx: &mut DecodeCx<'_>,
    r: &Reader<'_>,
    key: &ResourceKey,
    mut spec: StatefulsetSpec,
) -> Expansion {
    spec.expanded_from = Some(Macro::Redis);
    if spec.ports.is_empty() {
        spec.ports.push("6379".to_owned());
    }
    if spec.container.command.is_none() {
        spec.container.command = Some(vec!["sh".to_owned(), ENTRYPOINT_PATH.to_owned()]);
    }
    let files = Files::new(
        cx,
        &[
            ("redis_conf", CONF, CONF_PATH),
            ("entrypoint", ENTRYPOINT, ENTRYPOINT_PATH),
        ],
    );
    if spec.probes.is_none() {
        let ping = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            "redis-cli -a \"$REDIS_PASSWORD\" --no-auth-warning ping | grep -q PONG".to_owned(),
        ];
        spec.probes = Some(Box::new(super::default_probes(6379, "", ping)));
    }
    let secrets = vec![own_secret(key, "REDIS_PASSWORD")];
    files.expansion(cx, r, key, spec, ("data", "/data"), secrets)
}

fn sentinel_quorum(
    cx: &mut DecodeCx<'_>,
    r: &Reader<'_>,
    key: &ResourceKey,
    mut spec: StatefulsetSpec,
    monitor: &ResourceKey,
) -> Expansion {
    spec.expanded_from = Some(Macro::RedisSentinel);
    let replicas = *spec.replicas.get_or_insert(3);
    if replicas == 2 || replicas < 1 {
        cx.error(
            r.span_of("replicas"),
            format!(
                "a redis sentinel quorum of {replicas} replicas is refused: 2 sentinels need both to agree, so losing one stops failover; use 1 (an observer, no failover) or 3 or more"
            ),
        );
    }
    if spec.ports.is_empty() {
        spec.ports.push("26379".to_owned());
    }
    if spec.container.command.is_none() {
        spec.container.command = Some(vec!["sh".to_owned(), SENTINEL_ENTRYPOINT_PATH.to_owned()]);
    }
    merge_env(
        &mut spec,
        BTreeMap::from([
            ("VOODU_MONITOR_SCOPE".to_owned(), monitor.scope.clone()),
            ("VOODU_MONITOR_NAME".to_owned(), monitor.name.clone()),
            ("VOODU_REDIS_REPLICAS".to_owned(), replicas.to_string()),
        ]),
    );
    // The monitored redis's bucket (its password, its master ordinal) comes last, once.
    let bucket = format!("{}/{}", monitor.scope, monitor.name);
    spec.container.env_from.retain(|name| *name != bucket);
    spec.container.env_from.push(bucket);
    let files = Files::new(
        cx,
        &[(
            "sentinel_entrypoint",
            SENTINEL_ENTRYPOINT,
            SENTINEL_ENTRYPOINT_PATH,
        )],
    );
    let claim = ("state", "/var/lib/sentinel");
    files.expansion(cx, r, key, spec, claim, Vec::new())
}

/// The redis a `sentinel {}` block monitors, or `None` without the block (or when
/// `enabled = false`). Problems are reported at their field.
fn sentinel(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, key: &ResourceKey) -> Option<ResourceKey> {
    let block = r.block(cx, "sentinel")?;
    let mut s = r.nested(block, "");
    let enabled = s.bool(cx, "enabled").unwrap_or(true);
    let monitor = s.string(cx, "monitor").unwrap_or_default();
    let monitor_span = s.span_of("monitor").or_else(|| block.ident.span());
    s.finish(cx);
    if !enabled {
        return None;
    }
    let parts: Vec<&str> = monitor.split('/').map(str::trim).collect();
    let [scope, name] = parts.as_slice() else {
        cx.error(
            monitor_span,
            format!(
                "sentinel.monitor {monitor:?} must name the redis to watch as \"scope/name\", e.g. monitor = \"{}/redis\"",
                key.scope
            ),
        );
        return None;
    };
    if scope.is_empty() || name.is_empty() {
        cx.error(
            monitor_span,
            format!("sentinel.monitor {monitor:?} needs both a scope and a name"),
        );
        return None;
    }
    if *scope != key.scope {
        cx.error(
            monitor_span,
            format!(
                "sentinel.monitor {monitor:?} is in scope {scope:?}, but this sentinel is in {:?}: a sentinel watches a redis of its own scope",
                key.scope
            ),
        );
        return None;
    }
    if *name == key.name {
        cx.error(
            monitor_span,
            format!("sentinel.monitor {monitor:?} names this sentinel itself: name the data redis it watches"),
        );
        return None;
    }
    Some(ResourceKey::new(Kind::Statefulset, *scope, *name))
}
