//! Spec-hash helpers: voodu hashes `encoding/json.Marshal` of a fixed struct with SHA-256
//! (spec §5.1). serde_json with structs whose fields are declared in voodu's order gives the
//! same bytes once Go's extra HTML escapes are applied.

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::common::{Container, Resources};
use crate::model::SpecHash;

/// SHA-256 of the Go-JSON encoding of `value`, as lowercase hex.
pub(crate) fn go_json_sha256(value: &impl Serialize) -> SpecHash {
    let json = serde_json::to_string(value).expect("hash structs hold strings, numbers and maps");
    let json = if json.contains(ESCAPED) {
        go_json_escape(&json)
    } else {
        json
    };
    SpecHash::new(sha256_hex(json.as_bytes()))
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::model::text::hex(&Sha256::digest(bytes))
}

/// What Go's `encoding/json` escapes that serde_json does not.
const ESCAPED: [char; 5] = ['<', '>', '&', '\u{2028}', '\u{2029}'];

/// Go's `encoding/json` escapes `<`, `>`, `&`, U+2028 and U+2029 inside strings; serde_json
/// does not. Those characters can only occur inside JSON strings, so a plain replace is exact.
/// One pass (a spec hash per resource per plan).
pub(crate) fn go_json_escape(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// `None` for an empty list (Go's nil slice marshals as `null`, or is omitted).
pub(crate) fn non_empty<T: Clone>(items: &[T]) -> Option<Vec<T>> {
    (!items.is_empty()).then(|| items.to_vec())
}

/// A sorted copy, `None` when empty.
pub(crate) fn sorted(items: &[String]) -> Option<Vec<String>> {
    let mut items = non_empty(items)?;
    items.sort_unstable();
    Some(items)
}

/// The container's host-facing options, in voodu's order, as every workload kind's hash has
/// them after `network_mode` and `restart`: flattened into the kind's struct, they print as
/// its own fields would.
#[derive(Serialize)]
pub(super) struct HashedHostOptions {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) extra_hosts: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cap_add: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) ulimits: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) docker_options: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) resources: Option<Resources>,
}

impl HashedHostOptions {
    /// `container`'s options, as voodu hashes them (`extra_hosts` and `cap_add` sorted).
    pub(super) fn of(container: &Container) -> HashedHostOptions {
        HashedHostOptions {
            extra_hosts: sorted(&container.extra_hosts),
            cap_add: sorted(&container.cap_add),
            ulimits: (!container.ulimits.is_empty()).then(|| container.ulimits.clone()),
            docker_options: non_empty(&container.docker_options),
            resources: container.resources.clone(),
        }
    }
}

/// Named edits of a spec, for the hash tests: `(field, edit)`.
#[cfg(test)]
pub(crate) type Edits<'a, S> = &'a [(&'a str, fn(&mut S))];

/// A workload kind's spec, for the hash tests (`check_hash_edits`).
#[cfg(test)]
pub(crate) trait Workload {
    fn container_mut(&mut self) -> &mut Container;
}

#[cfg(test)]
macro_rules! workloads {
    ($($kind:ty),*) => {
        $(impl Workload for $kind {
            fn container_mut(&mut self) -> &mut Container {
                &mut self.container
            }
        })*
    };
}

#[cfg(test)]
workloads!(
    super::DeploymentSpec,
    super::StatefulsetSpec,
    super::JobSpec
);

/// Test support for each workload kind's hash tests: applies each edit to a fresh `base()`;
/// the hash must change for every container field (`CONTAINER_HASHED`) and every one of
/// `hashed`, for none of `not_hashed`.
#[cfg(test)]
pub(crate) fn check_hash_edits<S: Workload>(
    base: fn() -> S,
    hash: impl Fn(&S) -> SpecHash,
    hashed: Edits<'_, S>,
    not_hashed: Edits<'_, S>,
) {
    let before = hash(&base());
    let changes = |field: &str, edit: &dyn Fn(&mut S), hashed: bool| {
        let mut spec = base();
        edit(&mut spec);
        if hashed {
            assert_ne!(hash(&spec), before, "{field} must be hashed");
        } else {
            assert_eq!(hash(&spec), before, "{field} must not be hashed");
        }
    };
    for (field, edit) in CONTAINER_HASHED {
        changes(field, &|spec| edit(spec.container_mut()), true);
    }
    for (field, edit) in hashed {
        changes(field, edit, true);
    }
    for (field, edit) in not_hashed {
        changes(field, edit, false);
    }
}

/// The container fields in every workload kind's hash (spec §5.2), one edit each; each
/// changes what the kinds' test specs (`base`) hold.
#[cfg(test)]
const CONTAINER_HASHED: Edits<'static, Container> = &[
    ("image", |c| c.image = "other".into()),
    ("command", |c| c.command = Some(vec!["other".into()])),
    ("volumes", |c| c.volumes = vec!["/a:/b".into()]),
    ("env", |c| {
        c.env.insert("EDITED".into(), "2".into());
    }),
    ("networks", |c| c.networks = vec!["backend".into()]),
    ("network", |c| c.network = "backend".into()),
    ("network_mode", |c| c.network_mode = "host".into()),
    ("extra_hosts", |c| c.extra_hosts = vec!["a:1.2.3.4".into()]),
    ("cap_add", |c| c.cap_add = vec!["NET_ADMIN".into()]),
    ("ulimits", |c| {
        c.ulimits = BTreeMap::from([("nofile".into(), "1:1".into())]);
    }),
    ("docker_options", |c| {
        c.docker_options = vec!["--shm-size=1g".into()]
    }),
    ("resources (empty)", |c| {
        c.resources = Some(Resources::default())
    }),
    ("resources", |c| {
        c.resources = Some(Resources {
            limits: Some(super::common::Limits {
                cpu: "1".into(),
                memory: String::new(),
            }),
        });
    }),
    ("logs", |c| c.logs.max_files = 9),
    ("logs (max_size)", |c| c.logs.max_size = "1m".into()),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_escaping_matches_encoding_json() {
        assert_eq!(
            go_json_escape(r#"{"a":"<&>"}"#),
            r#"{"a":"\u003c\u0026\u003e"}"#
        );
        assert_eq!(go_json_escape("é\u{2028}x\u{2029}ü"), "é\\u2028x\\u2029ü");
    }

    #[test]
    fn sha256_of_empty_input_is_the_known_digest() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
