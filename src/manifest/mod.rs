//! Manifest stage: a commit's `Snapshot` → the set of resources it declares, or every problem
//! in it.
//!
//! Per file: the pre-pass marks interpolations (`lex`), hcl-edit parses, `decode` turns blocks
//! into per-kind specs (resolving `${VAR}`, reading `file()`/`env_file` through the given
//! `FileSource` and `url()` through the given `UrlFetcher`); then `validate` checks across
//! files and stamps asset digests into their consumers. Files are decoded on every core when
//! there are several, and `load_cached` reuses a file's decode by its blob id (`cache`).
//!
//! Invariants: this stage does no IO of its own; it reads only the snapshot and the sources it
//! is handed. A commit is accepted whole or rejected whole: `load` returns every diagnostic of
//! every file, never a partial manifest.

mod cache;
pub(crate) mod compose;
mod decode;
mod diagnostic;
pub mod image_edit;
mod interpolate;
#[cfg(any(test, fuzzing))]
#[doc(hidden)]
pub(crate) mod invariants;
mod lex;
mod macros;
mod policy;
pub(crate) mod previews;
pub mod sops;
pub mod spec;
pub mod triggers;
mod validate;
pub mod window;
pub(crate) mod yaml;

pub(crate) use crate::model::url_hosts::UrlHosts;
pub use cache::{CacheStats, DecodeCache};
pub(crate) use decode::Resource;
pub(crate) use diagnostic::LineIndex;
pub use diagnostic::{Diagnostic, Diagnostics};
pub use interpolate::Vars;
pub(crate) use macros::{GENERATED_KEYS, SecretRequest};
pub use policy::{DEFAULT_DATA_DIR, Policy, bind_source};

use std::collections::BTreeMap;
use std::time::Duration;

use crate::model::{BlobId, FileSource, Snapshot};

/// Whether a load feeds the agent, or only checks (`validate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Everything must resolve: missing files and failed fetches reject the commit.
    Apply,
    /// A static check: a `file()` or `env_file` that is missing is a warning, and `url()` is
    /// checked for form but not fetched.
    Validate,
}

/// Fetches `url()` asset sources (with whatever caching the caller keeps).
pub trait UrlFetcher {
    /// The body of `url`, or why not. `stale_ok`: a cached copy may stand in when the fetch
    /// fails (voodu's `on_failure = "stale"`).
    fn fetch(&self, url: &str, timeout: Duration, stale_ok: bool) -> Result<Vec<u8>, UrlError>;
}

/// Why a `UrlFetcher` returned no body: the fetcher's own error, shown as it is in the
/// diagnostic of the `url()` (fetchers differ: the agent's cache, a load's recorder, tests').
pub type UrlError = Box<dyn std::error::Error + Send + Sync>;

/// One `url()` fetch a load asks for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct UrlRequest {
    pub(crate) url: String,
    pub(crate) timeout: Duration,
    /// A cached copy may stand in when the fetch fails (`on_failure` other than `error`).
    pub(crate) stale_ok: bool,
}

/// A fetcher that fetches nothing and notes what was asked: the first pass of a load whose
/// `url()` sources are then fetched together (`assets::load_fetching_urls`), so that decoding
/// never waits on the network. Its loads fail where a `url()` is; only the requests count.
#[derive(Debug, Default)]
pub(crate) struct UrlRecorder {
    requests: std::sync::Mutex<std::collections::BTreeSet<UrlRequest>>,
}

impl UrlRecorder {
    /// What the loads through this recorder asked for, each once, in order.
    pub(crate) fn into_requests(self) -> Vec<UrlRequest> {
        self.requests
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .into_iter()
            .collect()
    }
}

/// What a `UrlRecorder` answers every fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not fetched yet")]
pub(crate) struct NotFetchedYet;

impl UrlFetcher for UrlRecorder {
    fn fetch(&self, url: &str, timeout: Duration, stale_ok: bool) -> Result<Vec<u8>, UrlError> {
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(UrlRequest {
                url: url.to_owned(),
                timeout,
                stale_ok,
            });
        Err(NotFetchedYet.into())
    }
}

/// Default cap on one `file()` / `env_file` read (voodu's whole `/apply` body cap).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Everything `load` reads besides the snapshot.
pub struct LoadOptions<'a> {
    pub vars: &'a Vars,
    /// The other files of the repo state: `file()`, `env_file`.
    pub files: &'a dyn FileSource,
    /// `None` in validate mode.
    pub fetcher: Option<&'a dyn UrlFetcher>,
    pub mode: Mode,
    pub max_file_bytes: u64,
    /// How to supply a missing `${NAME}` (`{var}` is replaced by the variable name), shown
    /// in "undefined variable" errors: differs between the agent and `validate`.
    pub missing_var_hint: &'a str,
}

impl LoadOptions<'static> {
    /// Apply mode with no config values, no other repo files and no URL fetcher: for
    /// manifests that need none of them (tests, benchmarks).
    pub fn standalone() -> LoadOptions<'static> {
        static NO_VARS: Vars = Vars {
            buckets: BTreeMap::new(),
            globals: BTreeMap::new(),
        };
        static NO_FILES: crate::model::MemoryFiles = crate::model::MemoryFiles::new();
        LoadOptions {
            vars: &NO_VARS,
            files: &NO_FILES,
            fetcher: None,
            mode: Mode::Apply,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            missing_var_hint: "supply {var}",
        }
    }
}

/// The resources one commit declares, ordered by key, and what they need beside them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Shared, not copied, with the decode cache: a resource of an unchanged file is the one
    /// an earlier load accepted (immutable: change a copy, `Arc::unwrap_or_clone`).
    pub resources: Vec<std::sync::Arc<Resource>>,
    /// Asset bytes by sha256 digest.
    pub blobs: BTreeMap<String, Vec<u8>>,
    /// Config-bucket keys that must exist (generated passwords of `postgres` / `redis`).
    pub secrets: Vec<SecretRequest>,
    /// Problems that do not reject the commit.
    pub warnings: Vec<Diagnostic>,
}

/// Parses and validates every file of the snapshot: the format alone, no host policy.
pub fn load(snapshot: &Snapshot, options: &LoadOptions<'_>) -> Result<Manifest, Diagnostics> {
    load_with_policy(snapshot, options, None)
}

/// `load`, and with a policy, a commit that asks for more than it allows is rejected whole,
/// each refusal at the field that asks for it.
pub fn load_with_policy(
    snapshot: &Snapshot,
    options: &LoadOptions<'_>,
    policy: Option<&Policy>,
) -> Result<Manifest, Diagnostics> {
    load_inner(snapshot, options, policy, None)
}

/// `load_with_policy` through `cache`: a file whose path and blob id (`ids[i]` for
/// `snapshot.files[i]`; `None`, or a short `ids`: not cacheable) it holds, decoded under the
/// same inputs, is not parsed again. Returns what `load_with_policy` returns.
pub fn load_cached(
    snapshot: &Snapshot,
    ids: &[Option<BlobId>],
    options: &LoadOptions<'_>,
    policy: Option<&Policy>,
    cache: &DecodeCache,
) -> Result<Manifest, Diagnostics> {
    load_inner(snapshot, options, policy, Some((cache, ids)))
}

fn load_inner(
    snapshot: &Snapshot,
    options: &LoadOptions<'_>,
    policy: Option<&Policy>,
    cache: Option<(&DecodeCache, &[Option<BlobId>])>,
) -> Result<Manifest, Diagnostics> {
    let env = decode::LoadEnv {
        files: options.files,
        fetcher: options.fetcher,
        mode: options.mode,
        max_file_bytes: options.max_file_bytes,
    };
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut blobs = BTreeMap::new();
    for (path, why) in &snapshot.refused {
        errors.push(Diagnostic {
            path: path.clone(),
            line: 1,
            col: 1,
            message: why.clone(),
        });
    }
    let (results, held): (Vec<std::sync::Arc<cache::FileResult>>, bool) = match cache {
        Some((cache, ids)) => cache.decode(&snapshot.files, ids, options, &env),
        None => {
            let files: Vec<&crate::model::SourceFile> = snapshot.files.iter().collect();
            let results = cache::decode_all(&files, options, &env, cache::default_threads());
            (
                results.into_iter().map(std::sync::Arc::new).collect(),
                false,
            )
        }
    };
    for result in &results {
        errors.extend(result.errors.iter().cloned());
        warnings.extend(result.warnings.iter().cloned());
        blobs.extend(
            result
                .blobs
                .iter()
                .map(|(digest, bytes)| (digest.clone(), bytes.clone())),
        );
    }
    let secrets = results
        .iter()
        .flat_map(|result| result.decoded.iter())
        .flat_map(|item| item.secrets.iter().cloned())
        .collect();
    // The checks across files, with the host policy: through the cache's index, they run
    // again for the keys this commit touches alone.
    let checked = match cache {
        Some((cache, _)) => cache.check(&snapshot.files, results, policy, held),
        None => validate::CheckIndex::default().check(&results, policy),
    };
    errors.extend(checked.errors);
    warnings.extend(checked.warnings);
    let resources = checked.resources;
    let by_location =
        |a: &Diagnostic, b: &Diagnostic| (&a.path, a.line, a.col).cmp(&(&b.path, b.line, b.col));
    errors.sort_by(by_location);
    warnings.sort_by(by_location);
    if errors.is_empty() {
        // Keep only blobs a resource uses (a rejected duplicate may have added some).
        let mut used: std::collections::BTreeSet<&str> = resources
            .iter()
            .filter_map(|resource| match &resource.spec {
                spec::Spec::Asset(asset) => {
                    Some(asset.files.values().map(|file| file.digest.as_str()))
                }
                _ => None,
            })
            .flatten()
            .collect();
        used.extend(
            resources
                .iter()
                .flat_map(|resource| resource.spec.sealed_digests()),
        );
        blobs.retain(|digest, _| used.contains(digest.as_str()));
        Ok(Manifest {
            resources,
            blobs,
            secrets,
            warnings,
        })
    } else {
        Err(Diagnostics(errors))
    }
}

/// Why env-file text does not parse: the 1-based line and what it holds. The caller adds which
/// file (and, for an `env_file`, the manifest's `path:line:col` that names it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvFileError {
    #[error("line {line}: missing '=' (line: {text:?})")]
    MissingEquals { line: usize, text: String },
}

/// Parses env-file text (voodu's `env_file` format, spec §4.1): `KEY=VALUE` lines, blank and
/// `#` lines skipped, an optional `export ` prefix, one pair of surrounding quotes removed, no
/// escapes. Later lines win. The error names the line.
pub fn parse_env_file(text: &str) -> Result<BTreeMap<String, String>, EnvFileError> {
    let mut values = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            return Err(EnvFileError::MissingEquals {
                line: number + 1,
                text: line.to_owned(),
            });
        };
        let value = value.trim();
        let value = ['"', '\'']
            .iter()
            .find_map(|quote| value.strip_prefix(*quote)?.strip_suffix(*quote))
            .unwrap_or(value);
        values.insert(key.trim().to_owned(), value.to_owned());
    }
    Ok(values)
}

#[cfg(test)]
mod bad_input;
#[cfg(test)]
mod fuzz_regressions;
#[cfg(test)]
pub(crate) mod tests;
