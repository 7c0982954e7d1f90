//! The vocabulary every stage shares: kinds, resource keys, commit SHAs, spec hashes, the
//! snapshot of manifest files read from one commit, and the small parsers several stages need
//! (ports, durations, asset paths).
//!
//! Invariant: this module depends on nothing else in the crate (layer 0).

mod assets;
mod docker_options;
mod host_paths;
pub(crate) mod hosts;
pub mod image_policy;
pub mod logs;
pub mod names;
pub mod policy;
mod ports;
pub mod previews;
pub mod scopes;
mod snapshot;
pub(crate) mod text;
pub mod tls;
mod units;
pub mod url_hosts;

pub(crate) use assets::{UNSCOPED_ASSETS, asset_dir, is_ref_segment, resolve_asset_refs};
pub(crate) use docker_options::control_character;
pub use docker_options::{DockerOptions, DockerOptionsError, ExtraHostError};
pub use hosts::{HostNameError, HostSelection};
pub use image_policy::{
    ImagePolicy, PolicyError, image_tag, is_valid_tag, registry_host, split_image,
};
pub use policy::Policy;
pub use ports::{PortMapping, parse_ports};
pub use snapshot::{
    BlobId, FileRead, FileSize, FileSource, MANIFEST_EXTENSIONS, MAX_MANIFEST_BYTES,
    MAX_TRIGGER_FILE_BYTES, MemoryFiles, Snapshot, SourceFile, TRIGGER_DIR, is_manifest_path,
    is_trigger_path,
};
pub(crate) use units::{
    parse_cpus, parse_docker_size, parse_go_duration, parse_memory, parse_ulimit,
};

use std::fmt;

/// The bridge network voodu attaches every container to.
pub(crate) const DEFAULT_NETWORK: &str = "voodu0";

/// What names one repository whatever the URL's form: `host/owner/name` in lower case for
/// https, ssh and scp-like URLs (no user, port, `.git` or trailing `/`), the absolute path
/// for a local one
/// (as given: `git::repo_identity` makes it absolute first). Two URLs of one repository (its https and ssh URLs) give the same.
pub fn repo_identity(url: &str) -> String {
    let url = url.trim();
    let (host, path) = if let Some((_, rest)) = url.split_once("://") {
        match rest.split_once('/') {
            Some((authority, path)) => (authority, path),
            None => (rest, ""),
        }
    } else if let Some((authority, path)) = url
        .split_once(':')
        .filter(|(authority, _)| authority.contains('@') && !authority.contains('/'))
    {
        (authority, path)
    } else {
        return url.trim_end_matches('/').to_owned();
    };
    if url.starts_with("file://") {
        return format!("/{}", path.trim_end_matches('/'));
    }
    let host = host.rsplit('@').next().unwrap_or(host);
    let host = host.split(':').next().unwrap_or(host);
    let path = path.trim_matches('/');
    let path = path.strip_suffix(".git").unwrap_or(path);
    format!(
        "{}/{}",
        host.to_ascii_lowercase(),
        path.to_ascii_lowercase()
    )
}

/// The closed set of resource kinds the store and the reconciler know.
///
/// `app` is parser sugar (deployment + ingress) and plugin macros expand to statefulsets, so
/// neither appears here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Asset,
    Cronjob,
    Deployment,
    Ingress,
    Job,
    Registry,
    Statefulset,
}

impl Kind {
    /// Every kind, in the order voodu replays them on boot (alphabetical).
    pub(crate) const ALL: [Kind; 7] = [
        Kind::Asset,
        Kind::Cronjob,
        Kind::Deployment,
        Kind::Ingress,
        Kind::Job,
        Kind::Registry,
        Kind::Statefulset,
    ];

    /// The lowercase name used in labels, the store and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Asset => "asset",
            Kind::Cronjob => "cronjob",
            Kind::Deployment => "deployment",
            Kind::Ingress => "ingress",
            Kind::Job => "job",
            Kind::Registry => "registry",
            Kind::Statefulset => "statefulset",
        }
    }

    /// Parses the lowercase name produced by [`Kind::as_str`].
    pub(crate) fn parse(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.as_str() == text)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identity of one resource: `(kind, scope, name)`. Scope is empty for unscoped kinds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    pub kind: Kind,
    pub scope: String,
    pub name: String,
}

impl ResourceKey {
    pub fn new(kind: Kind, scope: impl Into<String>, name: impl Into<String>) -> ResourceKey {
        ResourceKey {
            kind,
            scope: scope.into(),
            name: name.into(),
        }
    }

    /// voodu's AppID: `<scope>-<name>`, or `<name>` when the scope is empty. It prefixes
    /// container names.
    pub(crate) fn app_id(&self) -> String {
        if self.scope.is_empty() {
            self.name.clone()
        } else {
            format!("{}-{}", self.scope, self.name)
        }
    }
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scope.is_empty() {
            write!(f, "{}/{}", self.kind, self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind, self.scope, self.name)
        }
    }
}

/// A full hex commit id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommitSha(String);

impl CommitSha {
    pub fn new(hex: impl Into<String>) -> CommitSha {
        CommitSha(hex.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, for logs and tables.
    pub(crate) fn short(&self) -> &str {
        self.0.get(..12).unwrap_or(&self.0)
    }
}

impl fmt::Display for CommitSha {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lowercase hex sha256 of a spec's hashed fields; decides whether replicas are replaced.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpecHash(String);

impl SpecHash {
    pub(crate) fn new(hex: impl Into<String>) -> SpecHash {
        SpecHash(hex.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, for tables.
    pub(crate) fn short(&self) -> &str {
        self.0.get(..12).unwrap_or(&self.0)
    }
}

impl fmt::Display for SpecHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `n_bytes` random bytes as hex, seeded from the std hasher's per-process random keys.
pub fn random_hex(n_bytes: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    while out.len() < n_bytes * 2 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        out.push_str(&format!("{:016x}", hasher.finish()));
    }
    out.truncate(n_bytes * 2);
    out
}

/// `pairs` as a map, inserted one by one (a later key wins, as with `collect`).
///
/// `collect` into a `BTreeMap` first sorts the pairs with std's stable sort, and that sort
/// is compiled anew for every iterator type a map is collected from (≈ 4.5 KB of the binary
/// each; 41 of them, issue 54); inserting shares one `insert` per map type. Both make about
/// n log n comparisons; the maps of a commit's whole manifest on the agent's hot path
/// (`plan::plan_all`'s, the validate index's) are still collected.
pub fn map_of<K: Ord, V>(
    pairs: impl IntoIterator<Item = (K, V)>,
) -> std::collections::BTreeMap<K, V> {
    let mut map = std::collections::BTreeMap::new();
    map.extend(pairs);
    map
}

/// `map_of` for pairs that may fail (rows of a table): the first error, else the map.
pub fn try_map_of<K: Ord, V, E>(
    pairs: impl IntoIterator<Item = Result<(K, V), E>>,
) -> Result<std::collections::BTreeMap<K, V>, E> {
    let mut map = std::collections::BTreeMap::new();
    for pair in pairs {
        let (key, value) = pair?;
        map.insert(key, value);
    }
    Ok(map)
}
