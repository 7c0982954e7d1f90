//! A container's environment, merged in voodu's order (spec §4.4), later layers winning:
//! the `env_from` buckets in declared order (`"a/b"` is app bucket `b` of scope `a`, a bare
//! `"x"` app bucket `x` of the resource's own scope), the resource's scope bucket, its app
//! bucket, the identity variables (`VOODU_SCOPE`, `VOODU_NAME`, …), then the manifest's `env`
//! with `${asset.…}` and `${ref.…}` resolved, beside the variables of its SOPS env files (the
//! manifest made their keys disjoint from `env`'s; values decrypted by the caller).
//!
//! Invariants: pure; values never appear in errors; `digest` is keyed with the agent's own
//! secret, so the `voodu.env_digest` label tells whether a container's environment is current
//! without letting anyone who can `docker inspect` guess the values behind it.

use std::collections::{BTreeMap, BTreeSet};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::manifest::spec::{Container, Spec};
use crate::model::{Kind, ResourceKey, resolve_asset_refs};
use crate::store::{Buckets, Desired};

/// Why an environment cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvError {
    /// Every `env_from` bucket is missing (voodu: a permanent error).
    NoBuckets(Vec<String>),
    /// A `${ref.…}` whose target has no value yet (voodu: transient, retried).
    Unresolved(Vec<String>),
    /// A SOPS env file this host cannot open now (its identity was removed, its blob is
    /// gone); the message names the file, never a value.
    Encrypted(String),
}

impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvError::NoBuckets(references) => write!(
                f,
                "env_from [{}]: none of these config buckets exists; set them with `voodu-agent config set SCOPE/NAME KEY=VALUE`",
                references.join(", ")
            ),
            EnvError::Encrypted(why) => f.write_str(why),
            EnvError::Unresolved(references) => write!(
                f,
                "unresolved reference(s): {} (the ingress has no status yet)",
                references.join(", ")
            ),
        }
    }
}

impl std::error::Error for EnvError {}

/// Everything the merge reads besides the spec.
pub(crate) struct EnvInputs<'a> {
    pub(crate) key: &'a ResourceKey,
    pub(crate) buckets: &'a Buckets,
    /// Identity variables, e.g. `VOODU_REPLICA_ORDINAL` for a statefulset pod.
    pub(crate) identity: Vec<(String, String)>,
    pub(crate) assets_root: &'a std::path::Path,
    /// `${ref.<kind>.<name>.<field>}` values that exist now, keyed `kind.name.field`.
    pub(crate) references: &'a BTreeMap<String, String>,
    /// The variables of the container's SOPS env files (`env_sealed`), decrypted; their keys
    /// are disjoint from `env`'s.
    pub(crate) sealed: &'a [(String, String)],
}

/// The merged environment as `KEY=VALUE` entries, sorted by key.
pub(crate) fn container_env(
    inputs: &EnvInputs<'_>,
    container: &Container,
) -> Result<Vec<String>, EnvError> {
    let key = inputs.key;
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    if !container.env_from.is_empty() {
        let mut found = false;
        for reference in &container.env_from {
            if let Some(values) = inputs.buckets.get(&env_from_bucket(key, reference)) {
                found = true;
                env.extend(values.clone());
            }
        }
        if !found {
            return Err(EnvError::NoBuckets(container.env_from.clone()));
        }
    }
    for bucket in own_buckets(key) {
        if let Some(values) = inputs.buckets.get(&bucket) {
            env.extend(values.clone());
        }
    }
    env.extend(inputs.identity.iter().cloned());
    let mut unresolved = Vec::new();
    for (name, value) in &container.env {
        let value = resolve_asset_refs(value, inputs.assets_root);
        env.insert(
            name.clone(),
            resolve_refs(&value, inputs.references, &mut unresolved),
        );
    }
    env.extend(inputs.sealed.iter().cloned());
    if !unresolved.is_empty() {
        return Err(EnvError::Unresolved(unresolved));
    }
    Ok(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
}

/// The buckets `container_env` reads for `container` of `key`: its `env_from` buckets, then
/// the resource's scope and app buckets (a pass reads these and no others).
pub(crate) fn bucket_names(key: &ResourceKey, container: &Container) -> Vec<(String, String)> {
    let mut names: Vec<(String, String)> = container
        .env_from
        .iter()
        .map(|reference| env_from_bucket(key, reference))
        .collect();
    names.extend(own_buckets(key));
    names
}

/// The ingresses of its own scope whose `${ref.ingress.<name>.…}` values `container`'s `env`
/// uses (a pass reads these ingresses, and the deployments they route to, and no others).
pub(crate) fn referenced_ingresses(container: &Container) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for value in container.env.values() {
        let mut rest = value.as_str();
        while let Some(start) = rest.find("${ref.") {
            let after = &rest[start + "${ref.".len()..];
            let Some(end) = after.find('}') else {
                break;
            };
            let mut parts = after[..end].split('.');
            if let (Some("ingress" | "ingresss"), Some(name)) = (parts.next(), parts.next()) {
                names.insert(name.to_owned());
            }
            rest = &after[end + 1..];
        }
    }
    names
}

/// The bucket an `env_from` entry names: `"a/b"` is bucket `b` of scope `a`, a bare `"x"`
/// bucket `x` of the resource's own scope.
fn env_from_bucket(key: &ResourceKey, reference: &str) -> (String, String) {
    match reference.split_once('/') {
        Some((scope, name)) => (scope.to_owned(), name.to_owned()),
        None => (key.scope.clone(), reference.to_owned()),
    }
}

/// The resource's scope bucket and its app bucket, in merge order.
fn own_buckets(key: &ResourceKey) -> [(String, String); 2] {
    [
        (key.scope.clone(), String::new()),
        (key.scope.clone(), key.name.clone()),
    ]
}

/// The `${ref.ingress.<name>.<field>}` values of one scope, from the desired ingresses: `host`,
/// `service`, `port` (as the ingress resolves it: explicit, else the deployment's first
/// container port, else 80) and `url`. Keys are `ingress.<name>.<field>`, and voodu's naive
/// plural `ingresss.…` too.
pub(crate) fn ingress_references(desired: &[Desired], scope: &str) -> BTreeMap<String, String> {
    let mut values = BTreeMap::new();
    for resource in desired {
        let Spec::Ingress(ingress) = &resource.spec else {
            continue;
        };
        if resource.key.scope != scope {
            continue;
        }
        let service = ingress.effective_service(&resource.key.name).to_owned();
        let deployment = desired.iter().find_map(|other| match &other.spec {
            Spec::Deployment(deployment)
                if other.key.kind == Kind::Deployment
                    && other.key.scope == scope
                    && other.key.name == service =>
            {
                Some(deployment)
            }
            _ => None,
        });
        // The same resolution the ingress router and the ingress's status use.
        let port = crate::reconcile::router::routes::ingress_port(ingress, deployment).to_string();
        let url = crate::reconcile::router::routes::ingress_url(ingress);
        for (field, value) in [
            ("host", ingress.host.clone()),
            ("service", service.clone()),
            ("port", port),
            ("url", url),
        ] {
            for kind in ["ingress", "ingresss"] {
                values.insert(
                    format!("{kind}.{}.{field}", resource.key.name),
                    value.clone(),
                );
            }
        }
    }
    values
}

/// Replaces each `${ref.kind.name.field}` by its value, noting the ones without a value.
fn resolve_refs(
    value: &str,
    references: &BTreeMap<String, String>,
    unresolved: &mut Vec<String>,
) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${ref.") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "${ref.".len()..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let reference = &after[..end];
        match references.get(reference) {
            Some(resolved) => out.push_str(resolved),
            None => {
                unresolved.push(reference.to_owned());
                out.push_str(&rest[start..start + "${ref.".len() + end + 1]);
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The keyed digest of an environment (`voodu.env_digest`): lowercase hex HMAC-SHA256.
pub(crate) fn digest(secret: &[u8], env: &[String]) -> String {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
    for entry in env {
        mac.update(entry.as_bytes());
        mac.update(b"\n");
    }
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    fn bucket(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn inputs<'a>(
        key: &'a ResourceKey,
        buckets: &'a Buckets,
        references: &'a BTreeMap<String, String>,
    ) -> EnvInputs<'a> {
        EnvInputs {
            key,
            buckets,
            identity: vec![
                ("VOODU_NAME".into(), "web".into()),
                ("VOODU_SCOPE".into(), "prod".into()),
            ],
            assets_root: std::path::Path::new("/data/assets"),
            references,
            sealed: &[],
        }
    }

    #[test]
    fn layers_merge_in_voodus_order() -> Result<(), EnvError> {
        let key = ResourceKey::new(Kind::Deployment, "prod", "web");
        let buckets: Buckets = [
            (
                ("shared".into(), "db".into()),
                bucket(&[("A", "from-a/b"), ("B", "from-a/b"), ("Z", "z")]),
            ),
            (
                ("prod".into(), "cache".into()),
                bucket(&[("B", "from-bare"), ("C", "from-bare")]),
            ),
            (
                ("prod".into(), String::new()),
                bucket(&[("C", "scope"), ("D", "scope")]),
            ),
            (
                ("prod".into(), "web".into()),
                bucket(&[("D", "app"), ("E", "app"), ("VOODU_NAME", "app")]),
            ),
        ]
        .into();
        let references =
            BTreeMap::from([("ingress.web.host".to_owned(), "web.example".to_owned())]);
        let container = Container {
            env_from: vec!["shared/db".into(), "cache".into()],
            env: bucket(&[
                ("E", "manifest"),
                ("CONF", "${asset.prod.cfg.conf}"),
                ("URL", "https://${ref.ingress.web.host}/x"),
            ]),
            ..Container::default()
        };
        let env = container_env(&inputs(&key, &buckets, &references), &container)?;
        assert_eq!(
            env,
            [
                "A=from-a/b",
                "B=from-bare",
                "C=scope",
                "CONF=/data/assets/prod/cfg/conf",
                "D=app",
                "E=manifest",
                "URL=https://web.example/x",
                "VOODU_NAME=web",
                "VOODU_SCOPE=prod",
                "Z=z",
            ]
        );
        // A pass reads only the buckets `bucket_names` lists; the merge over those alone is
        // the merge over every bucket there is (here plus two it does not name).
        let mut more = buckets.clone();
        more.insert(("prod".into(), "api".into()), bucket(&[("X", "other app")]));
        more.insert(
            ("staging".into(), String::new()),
            bucket(&[("X", "other scope")]),
        );
        let names = bucket_names(&key, &container);
        let read: Buckets = more
            .iter()
            .filter(|(name, _)| names.contains(name))
            .map(|(name, values)| (name.clone(), values.clone()))
            .collect();
        assert_eq!(read, buckets);
        assert_eq!(
            container_env(&inputs(&key, &read, &references), &container)?,
            container_env(&inputs(&key, &more, &references), &container)?
        );
        // References are read only for the ingresses some value names.
        assert_eq!(
            referenced_ingresses(&container),
            BTreeSet::from(["web".to_owned()])
        );
        let plain = Container {
            env: bucket(&[
                ("E", "manifest"),
                ("A", "${ref.ingresss.api.url}${ref.ingress.web.port}"),
                ("B", "${ref.job.x.y} ${ref.ingress.broken"),
            ]),
            ..container.clone()
        };
        assert_eq!(
            referenced_ingresses(&plain),
            BTreeSet::from(["api".to_owned(), "web".to_owned()])
        );
        Ok(())
    }

    #[test]
    fn missing_buckets_and_refs_are_reported_without_values() {
        let key = ResourceKey::new(Kind::Deployment, "prod", "web");
        let buckets: Buckets = [(
            ("prod".into(), String::new()),
            bucket(&[("SECRET", "hunter2")]),
        )]
        .into();
        let references = BTreeMap::new();
        let mut container = Container {
            env_from: vec!["nope".into()],
            ..Container::default()
        };
        let error =
            container_env(&inputs(&key, &buckets, &references), &container).expect_err("no bucket");
        assert_eq!(error, EnvError::NoBuckets(vec!["nope".into()]));
        container.env_from.clear();
        container.env = bucket(&[("H", "${ref.ingress.web.host}")]);
        let error =
            container_env(&inputs(&key, &buckets, &references), &container).expect_err("no ref");
        assert_eq!(error, EnvError::Unresolved(vec!["ingress.web.host".into()]));
        assert!(!error.to_string().contains("hunter2"));
    }

    #[test]
    fn digests_are_keyed_and_change_with_any_value() {
        let env = vec!["A=1".to_owned(), "B=2".to_owned()];
        let one = digest(b"key-one", &env);
        assert_eq!(one.len(), 64);
        assert_eq!(one, digest(b"key-one", &env), "deterministic");
        assert_ne!(one, digest(b"key-two", &env), "keyed");
        assert_ne!(
            one,
            digest(b"key-one", &["A=1".to_owned(), "B=3".to_owned()])
        );
    }
}
