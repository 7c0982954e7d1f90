//! `asset ["scope"] "name" { key = source … }` (spec §2.7): named files materialised on the
//! host under `<data-dir>/assets/[<scope>/]<name>/<key>`.
//!
//! Invariant: the spec records each key's source and the sha256 of its bytes; the bytes
//! themselves travel beside the manifest (`Manifest::blobs`) and are kept in the store by
//! digest, so a spec stays small and two keys with the same bytes share one blob.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::KindSpec;
use super::hash::go_json_sha256;
use crate::model::{ResourceKey, SpecHash};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssetSpec {
    pub files: BTreeMap<String, AssetFile>,
}

impl KindSpec for AssetSpec {
    const HASHED: &'static [&'static str] = &["files"];
    const HASHES_CONTAINER: bool = false;

    /// Changes exactly when some key's bytes (or the key set) change.
    fn spec_hash(&self, _: &ResourceKey) -> SpecHash {
        let digests: BTreeMap<&str, &str> = crate::model::map_of(
            self.files
                .iter()
                .map(|(key, file)| (key.as_str(), file.digest.as_str())),
        );
        go_json_sha256(&digests)
    }

    fn summary(&self) -> String {
        format!("{} file(s)", self.files.len())
    }
}

/// One key of an asset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssetFile {
    /// `inline`, `file` or `url`.
    pub(crate) source: String,
    /// `file`: the repo path read; `url`: the URL fetched.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) origin: String,
    /// `url` only: `error` or `stale` (default; `skip` behaves as `stale`, as in voodu).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) on_failure: String,
    /// Lowercase hex sha256 of the bytes.
    pub digest: String,
    pub(crate) size: u64,
    /// `file` only: the source is SOPS-encrypted. The digest and size are the encrypted
    /// file's; the host decrypts it with its age identities and writes the clear bytes with
    /// mode 0600 (agent extension).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) sealed: bool,
}
