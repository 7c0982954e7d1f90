//! Assets stage: put each `asset`'s files on the host, under
//! `<data-dir>/assets/<scope>/<name>/<key>` (`_unscoped/<name>/<key>` for unscoped assets),
//! before the commit's journal rows are written, so a consumer never starts without its file.
//! The `url()` fetcher with its cache lives here too (`fetch`).
//!
//! Invariants: every write is atomic (`write`); a file whose bytes already match is not
//! rewritten (its inode stays, so running containers keep their bind mount); only files under
//! the assets root are ever written or removed. Blocking: call from a blocking thread.

pub mod age;
pub mod cosign;
mod fetch;
pub mod registry;
pub mod sops;
pub mod url_guard;
mod write;

pub(crate) use fetch::{
    DEFAULT_MAX_URL_BYTES, DEFAULT_URL_BUDGET, MAX_URL_BUDGET, UrlCache, load_fetching_urls,
};

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::manifest::Manifest;
use crate::manifest::spec::{Spec, sha256_hex};
use crate::model::{ResourceKey, UNSCOPED_ASSETS, asset_dir};

/// An asset file could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is outside the assets directory {root}; refusing to write it")]
    Confinement { path: PathBuf, root: PathBuf },
    #[error("asset bytes for digest {digest} are missing from the commit")]
    MissingBlob { digest: String },
    #[error("asset key `{key}` (a SOPS file): {message}")]
    Encrypted { key: String, message: String },
    #[error("asset {asset}: {source}")]
    Asset {
        /// Boxed, as the source is: the error stays small inside other stages' errors.
        asset: Box<ResourceKey>,
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// The asset whose files this host can never write as the commit gives them (a name
    /// the file system refuses, a path outside the assets directory): its commit is rejected
    /// rather than tried again. `None` for what may pass on a later try (a full disk).
    /// With the asset, why, in a line short enough to show (a path the host refuses may be
    /// thousands of bytes long: only the end of its file name is shown).
    pub(crate) fn refused_asset(&self) -> Option<(&ResourceKey, String)> {
        let Error::Asset { asset, source } = self else {
            return None;
        };
        let why = match source.as_ref() {
            Error::Io { path, source } if self.is_permanent() => {
                let name = path
                    .file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let shown = if name.chars().count() > 40 {
                    format!("{}…", name.chars().take(40).collect::<String>())
                } else {
                    name
                };
                format!("writing {shown:?} under the assets directory: {source}")
            }
            other if other.is_permanent() => other.to_string(),
            _ => return None,
        };
        Some((asset.as_ref(), why))
    }

    fn is_permanent(&self) -> bool {
        match self {
            Error::Confinement { .. } => true,
            Error::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::InvalidFilename | std::io::ErrorKind::InvalidInput
            ),
            Error::Asset { source, .. } => source.is_permanent(),
            Error::MissingBlob { .. } | Error::Encrypted { .. } => false,
        }
    }
}

/// One asset's files as they must be on disk: key → digest of the bytes to write, the clear
/// bytes of its SOPS-encrypted keys (in memory only), and which keys those are (written 0600).
pub(crate) struct Prepared {
    pub(crate) files: AssetFiles,
    plain: BTreeMap<String, Vec<u8>>,
    private: BTreeSet<String>,
}

impl Prepared {
    /// The bytes for `digest`: a decrypted key's, else `blob`'s.
    fn bytes(&self, digest: &str, blob: &dyn Fn(&str) -> Option<Vec<u8>>) -> Option<Vec<u8>> {
        self.plain.get(digest).cloned().or_else(|| blob(digest))
    }
}

/// Decrypts the SOPS-encrypted keys of an asset with `keyring`: their on-disk digest is the
/// clear bytes' (computed here, never stored: a digest of a short secret could be guessed).
pub(crate) fn prepare(
    files: &BTreeMap<String, crate::manifest::spec::AssetFile>,
    blob: &dyn Fn(&str) -> Option<Vec<u8>>,
    keyring: &sops::Keyring,
) -> Result<Prepared, Error> {
    let mut prepared = Prepared {
        files: AssetFiles::new(),
        plain: BTreeMap::new(),
        private: BTreeSet::new(),
    };
    for (key, file) in files {
        if !file.sealed {
            prepared.files.insert(key.clone(), file.digest.clone());
            continue;
        }
        let encrypted = |message: String| Error::Encrypted {
            key: key.clone(),
            message,
        };
        let bytes = blob(&file.digest).ok_or_else(|| Error::MissingBlob {
            digest: file.digest.clone(),
        })?;
        let parsed = crate::manifest::sops::parse(&bytes)
            .ok_or_else(|| encrypted("is not a SOPS file".to_owned()))?
            .map_err(|error| encrypted(error.to_string()))?;
        let clear = keyring
            .open(&parsed)
            .and_then(|plain| plain.file_bytes())
            .map_err(|error| encrypted(error.to_string()))?;
        let digest = sha256_hex(&clear);
        prepared.files.insert(key.clone(), digest.clone());
        prepared.plain.insert(digest, clear);
        prepared.private.insert(key.clone());
    }
    Ok(prepared)
}

/// `<data-dir>/assets`.
pub(crate) fn assets_root(data_dir: &Path) -> PathBuf {
    data_dir.join("assets")
}

/// One asset's files: key → digest.
pub(crate) type AssetFiles = BTreeMap<String, String>;

/// Writes every asset of `manifest` under `assets_root`, removing files of keys an asset no
/// longer declares. Returns how many files were (re)written; an error names the asset
/// (`Error::Asset`).
pub(crate) fn materialise(
    manifest: &Manifest,
    assets_root: &Path,
    keyring: &sops::Keyring,
) -> Result<usize, Error> {
    let mut written = 0;
    for resource in &manifest.resources {
        let Spec::Asset(asset) = &resource.spec else {
            continue;
        };
        let blob = |digest: &str| manifest.blobs.get(digest).cloned();
        let of_asset = |source| Error::Asset {
            asset: Box::new(resource.key.clone()),
            source: Box::new(source),
        };
        let prepared = prepare(&asset.files, &blob, keyring).map_err(of_asset)?;
        written += write_prepared(
            assets_root,
            &resource.key.scope,
            &resource.key.name,
            &prepared,
            &blob,
        )
        .map_err(of_asset)?;
    }
    Ok(written)
}

/// `write_asset` for prepared files: decrypted keys are written with mode 0600.
pub(crate) fn write_prepared(
    assets_root: &Path,
    scope: &str,
    name: &str,
    prepared: &Prepared,
    blob: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<usize, Error> {
    write_files(
        assets_root,
        scope,
        name,
        &prepared.files,
        &|digest| prepared.bytes(digest, blob),
        &prepared.private,
    )
}

#[cfg(test)]
/// Makes one asset's directory hold exactly `files`, reading bytes through `blob`. Returns how
/// many files were (re)written. Used by `materialise` and to repair drift on the host.
pub(crate) fn write_asset(
    assets_root: &Path,
    scope: &str,
    name: &str,
    files: &AssetFiles,
    blob: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<usize, Error> {
    write_files(assets_root, scope, name, files, blob, &BTreeSet::new())
}

fn write_files(
    assets_root: &Path,
    scope: &str,
    name: &str,
    files: &AssetFiles,
    blob: &dyn Fn(&str) -> Option<Vec<u8>>,
    private: &BTreeSet<String>,
) -> Result<usize, Error> {
    let dir = asset_dir(assets_root, scope, name);
    let mut written = 0;
    for (key, digest) in files {
        let path = dir.join(key);
        if file_digest(&path).as_deref() == Some(digest.as_str()) {
            continue;
        }
        let bytes = blob(digest).ok_or_else(|| Error::MissingBlob {
            digest: digest.clone(),
        })?;
        let mode = private.contains(key).then_some(0o600);
        write::write_atomic_mode(assets_root, &path, &bytes, mode)?;
        written += 1;
    }
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            if !files.contains_key(&file_name) {
                let path = entry.path();
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                removed.map_err(|source| Error::Io { path, source })?;
            }
        }
    }
    Ok(written)
}

/// The digest of each file of one asset as found on disk (`None` for a missing key).
pub(crate) fn check_asset(
    assets_root: &Path,
    scope: &str,
    name: &str,
    files: &AssetFiles,
) -> BTreeMap<String, Option<String>> {
    let dir = asset_dir(assets_root, scope, name);
    crate::model::map_of(
        files
            .keys()
            .map(|key| (key.clone(), file_digest(&dir.join(key)))),
    )
}

fn file_digest(path: &Path) -> Option<String> {
    std::fs::read(path).ok().map(|bytes| sha256_hex(&bytes))
}

/// Removes the directories of assets that are not in `live` (`(scope, name)`; scope empty for
/// unscoped) in the scopes `owned` says are the caller's, and scope directories left empty.
/// With several sources each sync cleans only its own scopes: another source may be writing
/// its new assets at the same time, before its commit is in the store.
pub(crate) fn remove_unused(
    assets_root: &Path,
    live: &BTreeSet<(String, String)>,
    owned: &dyn Fn(&str) -> bool,
) -> Result<usize, Error> {
    let mut removed = 0;
    let Ok(scopes) = std::fs::read_dir(assets_root) else {
        return Ok(0);
    };
    for scope_entry in scopes.flatten() {
        let scope_dir = scope_entry.path();
        if !scope_dir.is_dir() {
            continue;
        }
        let scope_name = scope_entry.file_name().to_string_lossy().into_owned();
        let scope = if scope_name == UNSCOPED_ASSETS {
            String::new()
        } else {
            scope_name
        };
        // Another source's scope (`--sources`): its sync writes and removes those files.
        if !owned(&scope) {
            continue;
        }
        let Ok(names) = std::fs::read_dir(&scope_dir) else {
            continue;
        };
        for name_entry in names.flatten() {
            let name = name_entry.file_name().to_string_lossy().into_owned();
            if !live.contains(&(scope.clone(), name)) {
                let path = name_entry.path();
                std::fs::remove_dir_all(&path).map_err(|source| Error::Io { path, source })?;
                removed += 1;
            }
        }
        if std::fs::read_dir(&scope_dir).is_ok_and(|mut entries| entries.next().is_none()) {
            let _ = std::fs::remove_dir(&scope_dir);
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assets_are_written_kept_and_pruned() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("assets");
        let blobs: BTreeMap<String, Vec<u8>> = [b"one".to_vec(), b"two".to_vec()]
            .into_iter()
            .map(|bytes| (sha256_hex(&bytes), bytes))
            .collect();
        let blob = |digest: &str| blobs.get(digest).cloned();
        let files = |pairs: &[(&str, &[u8])]| -> AssetFiles {
            pairs
                .iter()
                .map(|(key, bytes)| ((*key).to_owned(), sha256_hex(bytes)))
                .collect()
        };
        let both = files(&[("a", b"one"), ("b", b"two")]);
        assert_eq!(write_asset(&root, "s", "n", &both, &blob)?, 2);
        assert_eq!(
            write_asset(&root, "s", "n", &both, &blob)?,
            0,
            "unchanged files are not rewritten"
        );
        assert_eq!(
            write_asset(&root, "s", "n", &files(&[("a", b"two")]), &blob)?,
            1
        );
        assert_eq!(std::fs::read(root.join("s/n/a"))?, b"two");
        assert!(!root.join("s/n/b").exists(), "an undeclared key is removed");
        write_asset(&root, "", "global", &files(&[("pem", b"one")]), &blob)?;
        assert!(root.join("_unscoped/global/pem").exists());
        write_asset(&root, "other", "n", &files(&[("a", b"one")]), &blob)?;
        let live = BTreeSet::from([(String::new(), "global".to_owned())]);
        assert_eq!(remove_unused(&root, &live, &|scope| scope != "other")?, 1);
        assert!(
            !root.join("s").exists(),
            "an emptied scope directory goes too"
        );
        assert!(root.join("_unscoped/global/pem").exists());
        assert!(
            root.join("other/n/a").exists(),
            "another source's scope is left to it"
        );
        Ok(())
    }
}
