//! `deployment "scope" "name" { … }`: the fields this agent decodes, voodu's controller
//! defaults, and the spec hash.
//!
//! Invariant: the spec hash follows voodu's deployment hash (spec/voodu-format.md §5): the
//! same JSON keys in the same order, computed after controller defaults; `replicas` and
//! `health_check` stay out of it, so scaling never replaces a running replica.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model::{ResourceKey, SpecHash};

/// A decoded deployment, as stored in the journal's desired state and in release snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentSpec {
    /// Empty means voodu's build mode; the controller default is `<AppID>:latest`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<String>,
    /// voodu's parser default is `"/"`; only ingress health checks read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_add: Vec<String>,
}

/// The bridge network voodu attaches every container to.
pub const DEFAULT_NETWORK: &str = "voodu0";
/// voodu's controller default restart policy.
pub const DEFAULT_RESTART: &str = "unless-stopped";

impl DeploymentSpec {
    /// The image to run: the manifest's, or voodu's build-mode default `<AppID>:latest`.
    pub fn effective_image(&self, key: &ResourceKey) -> String {
        if self.image.is_empty() {
            format!("{}:latest", key.app_id())
        } else {
            self.image.clone()
        }
    }

    /// Desired replica count: omitted or below 1 means 1, as voodu's controller does.
    pub fn n_replicas(&self) -> usize {
        self.replicas
            .map_or(1, |replicas| usize::try_from(replicas.max(1)).unwrap_or(1))
    }

    pub fn effective_restart(&self) -> &str {
        self.restart
            .as_deref()
            .filter(|restart| !restart.is_empty())
            .unwrap_or(DEFAULT_RESTART)
    }

    /// `networks` (or the legacy `network`), with `voodu0` appended when absent. The first
    /// entry is the primary network.
    pub fn effective_networks(&self) -> Vec<String> {
        let mut networks = if self.networks.is_empty() {
            self.network.iter().cloned().collect::<Vec<_>>()
        } else {
            self.networks.clone()
        };
        if !networks.iter().any(|network| network == DEFAULT_NETWORK) {
            networks.push(DEFAULT_NETWORK.to_owned());
        }
        networks
    }

    /// Ports after voodu's loopback normalisation (spec §6.4).
    pub fn normalized_ports(&self) -> Vec<String> {
        self.ports.iter().map(|port| normalize_port(port)).collect()
    }

    /// voodu's deployment spec hash over the fields this agent decodes.
    pub fn spec_hash(&self, key: &ResourceKey) -> SpecHash {
        let mut networks = self.effective_networks();
        networks.sort();
        let sorted = |items: &[String]| {
            let mut items = items.to_vec();
            items.sort();
            items
        };
        let hashed = HashedDeployment {
            image: self.effective_image(key),
            command: self.command.clone(),
            ports: none_if_empty(self.normalized_ports()),
            volumes: none_if_empty(self.volumes.clone()),
            env: (!self.env.is_empty()).then(|| self.env.clone()),
            networks,
            network_mode: String::new(),
            restart: self.effective_restart().to_owned(),
            extra_hosts: none_if_empty(sorted(&self.extra_hosts)),
            cap_add: none_if_empty(sorted(&self.cap_add)),
            logs: HashedLogs {
                max_size: "10m",
                max_files: 3,
            },
        };
        let json = serde_json::to_string(&hashed).expect("a struct of strings always serialises");
        SpecHash::new(hex(&Sha256::digest(go_json_escape(&json).as_bytes())))
    }
}

/// voodu's `normalizePort`: `[…` unchanged; no `:` → `127.0.0.1::<p>`; one `:` →
/// `127.0.0.1:<p>`; two or more → unchanged.
pub fn normalize_port(port: &str) -> String {
    if port.starts_with('[') {
        return port.to_owned();
    }
    match port.matches(':').count() {
        0 => format!("127.0.0.1::{port}"),
        1 => format!("127.0.0.1:{port}"),
        _ => port.to_owned(),
    }
}

/// The JSON voodu hashes, field order included (Go marshals in declaration order).
#[derive(Serialize)]
struct HashedDeployment {
    image: String,
    command: Option<Vec<String>>,
    ports: Option<Vec<String>>,
    volumes: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    networks: Vec<String>,
    network_mode: String,
    restart: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    extra_hosts: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cap_add: Option<Vec<String>>,
    logs: HashedLogs,
}

#[derive(Serialize)]
struct HashedLogs {
    max_size: &'static str,
    max_files: u32,
}

fn none_if_empty(items: Vec<String>) -> Option<Vec<String>> {
    (!items.is_empty()).then_some(items)
}

/// Go's `encoding/json` escapes `<`, `>`, `&`, U+2028 and U+2029 inside strings; serde_json
/// does not. Those characters can only occur inside JSON strings, so a plain replace is exact.
fn go_json_escape(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    fn key() -> ResourceKey {
        ResourceKey::new(Kind::Deployment, "shop", "web")
    }

    fn base() -> DeploymentSpec {
        DeploymentSpec {
            image: "busybox".into(),
            command: Some(vec!["sleep".into(), "1000".into()]),
            replicas: Some(2),
            env: BTreeMap::from([("A".into(), "1".into())]),
            ..DeploymentSpec::default()
        }
    }

    #[test]
    fn ports_normalise_to_loopback_like_voodu() {
        assert_eq!(normalize_port("80"), "127.0.0.1::80");
        assert_eq!(normalize_port("8080:80"), "127.0.0.1:8080:80");
        assert_eq!(normalize_port("0.0.0.0:8080:80"), "0.0.0.0:8080:80");
        assert_eq!(normalize_port("[::1]:80:80"), "[::1]:80:80");
    }

    #[test]
    fn replicas_and_health_check_stay_out_of_the_hash() {
        let before = base().spec_hash(&key());
        let mut scaled = base();
        scaled.replicas = Some(7);
        scaled.health_check = Some("/up".into());
        assert_eq!(scaled.spec_hash(&key()), before);
    }

    #[test]
    fn every_hashed_field_changes_the_hash() {
        let before = base().spec_hash(&key());
        type Edit = (&'static str, fn(&mut DeploymentSpec));
        let edits: Vec<Edit> = vec![
            ("image", |s| s.image = "other".into()),
            ("command", |s| s.command = None),
            ("env", |s| {
                s.env.insert("B".into(), "2".into());
            }),
            ("ports", |s| s.ports = vec!["80".into()]),
            ("volumes", |s| s.volumes = vec!["/a:/b".into()]),
            ("restart", |s| s.restart = Some("always".into())),
            ("networks", |s| s.networks = vec!["backend".into()]),
            ("extra_hosts", |s| s.extra_hosts = vec!["a:1.2.3.4".into()]),
            ("cap_add", |s| s.cap_add = vec!["NET_ADMIN".into()]),
        ];
        for (field, edit) in edits {
            let mut spec = base();
            edit(&mut spec);
            assert_ne!(spec.spec_hash(&key()), before, "{field} must be hashed");
        }
    }

    #[test]
    fn defaults_hash_like_their_explicit_values() {
        let mut explicit = base();
        explicit.restart = Some(DEFAULT_RESTART.into());
        explicit.networks = vec![DEFAULT_NETWORK.into()];
        assert_eq!(explicit.spec_hash(&key()), base().spec_hash(&key()));
    }

    #[test]
    fn go_escaping_matches_encoding_json() {
        assert_eq!(
            go_json_escape(r#"{"a":"<&>"}"#),
            r#"{"a":"\u003c\u0026\u003e"}"#
        );
    }
}
