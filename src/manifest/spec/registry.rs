//! `registry "name"` (spec §2.8): credentials for private image pulls. Unscoped.
//!
//! Invariant: the token never appears in `Debug` output; views that show a registry print
//! its url, username and helper only.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::KindSpec;
use super::hash::go_json_sha256;
use crate::model::{ResourceKey, SpecHash};

#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrySpec {
    /// A bare host[:port], e.g. `ghcr.io`.
    pub(crate) url: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) username: String,
    /// The token or password (`token` wins when both are given).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) token: String,
    /// A docker credential helper name (`ecr-login`, `gcr`, …) instead of a token.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) helper: String,
}

impl KindSpec for RegistrySpec {
    const HASHED: &'static [&'static str] = &["url", "username", "token", "helper"];
    const HASHES_CONTAINER: bool = false;

    fn spec_hash(&self, _: &ResourceKey) -> SpecHash {
        go_json_sha256(self)
    }

    fn summary(&self) -> String {
        format!("credentials for {}", self.url)
    }
}

impl fmt::Debug for RegistrySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistrySpec")
            .field("url", &self.url)
            .field("username", &self.username)
            .field(
                "token",
                &if self.token.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("helper", &self.helper)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_token() {
        let spec = RegistrySpec {
            url: "ghcr.io".into(),
            username: "bot".into(),
            token: "ghp_secret".into(),
            helper: String::new(),
        };
        let shown = format!("{spec:?}");
        assert!(!shown.contains("ghp_secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }
}
