//! The vocabulary every stage shares: kinds, resource keys, commit SHAs, spec hashes and the
//! snapshot of manifest files read from one commit.
//!
//! Invariant: this module depends on nothing else in the crate (layer 0).

use std::fmt;

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
    pub const ALL: [Kind; 7] = [
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
    pub fn parse(text: &str) -> Option<Kind> {
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
    pub fn app_id(&self) -> String {
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
    pub fn short(&self) -> &str {
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
    pub fn new(hex: impl Into<String>) -> SpecHash {
        SpecHash(hex.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, for tables.
    pub fn short(&self) -> &str {
        self.0.get(..12).unwrap_or(&self.0)
    }
}

impl fmt::Display for SpecHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One published port: `host_ip:host_port:container_port/protocol`, host port optional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub host_ip: String,
    pub host_port: Option<u16>,
    pub container_port: u16,
    pub protocol: String,
}

/// Parses a voodu-normalised port (`ip:host:container[/proto]`, `ip::container`, …) into one
/// mapping per port; ranges (`8000-8010`, on either side) expand as `docker run -p` does.
/// `None` when the text is not a port spec.
pub fn parse_ports(text: &str) -> Option<Vec<PortMapping>> {
    let (address, protocol) = match text.rsplit_once('/') {
        Some((address, protocol)) => (address, protocol.to_ascii_lowercase()),
        None => (text, "tcp".to_owned()),
    };
    if !matches!(protocol.as_str(), "tcp" | "udp" | "sctp") {
        return None;
    }
    let (host_ip, rest) = if let Some(stripped) = address.strip_prefix('[') {
        let (ip, rest) = stripped.split_once("]:")?;
        (ip.to_owned(), rest)
    } else {
        match address.matches(':').count() {
            0 | 1 => (String::new(), address),
            _ => {
                let (ip, rest) = address.split_once(':')?;
                (ip.to_owned(), rest)
            }
        }
    };
    let (host, container) = match rest.split_once(':') {
        Some((host, container)) => (host, container),
        None => ("", rest),
    };
    let range = |text: &str| -> Option<(u16, u16)> {
        let (start, end) = match text.split_once('-') {
            Some((start, end)) => (start.parse().ok()?, end.parse().ok()?),
            None => {
                let port = text.parse().ok()?;
                (port, port)
            }
        };
        (start > 0 && start <= end).then_some((start, end))
    };
    let (first, last) = range(container)?;
    let host = if host.is_empty() {
        None
    } else {
        Some(range(host)?)
    };
    if let Some((host_first, host_last)) = host
        && host_last - host_first != last - first
    {
        return None;
    }
    Some(
        (first..=last)
            .map(|container_port| PortMapping {
                host_ip: host_ip.clone(),
                host_port: host.map(|(host_first, _)| host_first + (container_port - first)),
                container_port,
                protocol: protocol.clone(),
            })
            .collect(),
    )
}

/// File extensions voodu reads as HCL manifests (compared lower-cased).
pub const MANIFEST_EXTENSIONS: &[&str] = &["hcl", "voodu", "vdu", "vd"];

/// True when `path` names a manifest file by its extension.
pub fn is_manifest_path(path: &str) -> bool {
    path.rsplit_once('.').is_some_and(|(stem, extension)| {
        !stem.is_empty()
            && !stem.ends_with('/')
            && MANIFEST_EXTENSIONS.contains(&extension.to_ascii_lowercase().as_str())
    })
}

/// One manifest file read from a commit: its repo-relative path and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    pub path: String,
    pub contents: Vec<u8>,
}

/// Everything the manifest stage may read for one commit. The manifest stage does no IO of
/// its own: what is not in the snapshot does not exist for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub commit: CommitSha,
    /// Manifest files in lexical path order.
    pub files: Vec<SourceFile>,
    /// Entries the reader refused (a symlinked manifest, say): `(path, why)`. The manifest
    /// stage turns each into a diagnostic, so the commit is rejected with a clear reason.
    pub refused: Vec<(String, String)>,
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

/// The directory under `<data-dir>/assets` holding unscoped assets. A scope cannot be named
/// this (scopes start with a letter or digit), so the two layouts never collide.
pub const UNSCOPED_ASSETS: &str = "_unscoped";

/// Where asset `scope`/`name` keeps its files: `<assets_root>/<scope>/<name>`, or
/// `<assets_root>/_unscoped/<name>` for an unscoped asset.
pub fn asset_dir(assets_root: &std::path::Path, scope: &str, name: &str) -> std::path::PathBuf {
    let scope = if scope.is_empty() {
        UNSCOPED_ASSETS
    } else {
        scope
    };
    assets_root.join(scope).join(name)
}

/// Replaces every `${asset.<scope>.<name>.<key>}` / `${asset.<name>.<key>}` in `text` by the
/// host path of that file under `assets_root`; anything else is left as it is.
pub fn resolve_asset_refs(text: &str, assets_root: &std::path::Path) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${asset.") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "${asset.".len()..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let segments: Vec<&str> = after[..end].split('.').collect();
        let path = match segments.as_slice() {
            [scope, name, key] => Some(asset_dir(assets_root, scope, name).join(key)),
            [name, key] => Some(asset_dir(assets_root, "", name).join(key)),
            _ => None,
        };
        match path {
            Some(path) => out.push_str(&path.to_string_lossy()),
            None => out.push_str(&rest[start..start + "${asset.".len() + end + 1]),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// What a [`FileSource`] finds at a repo path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRead {
    File(Vec<u8>),
    /// A symlink and its target as written (relative or absolute).
    Symlink(String),
    Missing,
    /// A directory, submodule or other non-file entry.
    NotAFile,
    Error(String),
}

/// Read access to the files of one repo state (a commit's tree, or a working directory), for
/// `file()` and `env_file`. Paths are repo-relative with `/` separators, already normalised.
pub trait FileSource {
    fn read(&self, path: &str) -> FileRead;
}

/// An in-memory [`FileSource`], for tests and for sources that hold no other files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryFiles {
    entries: std::collections::BTreeMap<String, FileRead>,
}

impl MemoryFiles {
    pub const fn new() -> MemoryFiles {
        MemoryFiles {
            entries: std::collections::BTreeMap::new(),
        }
    }

    pub fn file(&mut self, path: &str, contents: &[u8]) -> &mut MemoryFiles {
        self.entries
            .insert(path.to_owned(), FileRead::File(contents.to_vec()));
        self
    }

    pub fn link(&mut self, path: &str, target: &str) -> &mut MemoryFiles {
        self.entries
            .insert(path.to_owned(), FileRead::Symlink(target.to_owned()));
        self
    }
}

impl FileSource for MemoryFiles {
    fn read(&self, path: &str) -> FileRead {
        self.entries.get(path).cloned().unwrap_or(FileRead::Missing)
    }
}

/// Parses a Go duration (`"300ms"`, `"1.5h"`, `"2h45m"`, `"0"`), as voodu's manifests write
/// them. Negative durations are refused.
pub fn parse_go_duration(text: &str) -> Option<std::time::Duration> {
    let text = text.strip_prefix('+').unwrap_or(text);
    if text == "0" {
        return Some(std::time::Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * seconds;
        rest = tail;
    }
    std::time::Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn asset_refs_resolve_to_host_paths() {
        let root = std::path::Path::new("/data/assets");
        assert_eq!(
            resolve_asset_refs("${asset.data.pg-config.conf}:/etc/pg.conf:ro", root),
            "/data/assets/data/pg-config/conf:/etc/pg.conf:ro"
        );
        assert_eq!(
            resolve_asset_refs("x ${asset.ca.pem} ${VAR} ${asset.a}", root),
            "x /data/assets/_unscoped/ca/pem ${VAR} ${asset.a}"
        );
    }

    #[test]
    fn go_durations_parse_like_time_parse_duration() {
        for (text, expected) in [
            ("0", Duration::ZERO),
            ("30s", Duration::from_secs(30)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("300ms", Duration::from_millis(300)),
            ("2h45m", Duration::from_secs(9900)),
            ("10us", Duration::from_micros(10)),
        ] {
            assert_eq!(parse_go_duration(text), Some(expected), "{text}");
        }
        for bad in ["", "10", "s", "1x", "-1s", "1..2s", "5 m"] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?} must be refused");
        }
    }

    #[test]
    fn normalised_ports_parse() {
        let one = |text: &str| {
            let ports = parse_ports(text).expect("valid");
            assert_eq!(ports.len(), 1, "{text}");
            ports.into_iter().next().expect("one port")
        };
        let port = one("127.0.0.1::80");
        assert_eq!(
            (port.host_ip.as_str(), port.host_port, port.container_port),
            ("127.0.0.1", None, 80)
        );
        let port = one("127.0.0.1:8080:80/udp");
        assert_eq!(
            (port.host_port, port.protocol.as_str()),
            (Some(8080), "udp")
        );
        let port = one("[::1]:81:80");
        assert_eq!((port.host_ip.as_str(), port.host_port), ("::1", Some(81)));
        let range = parse_ports("127.0.0.1:9000-9002:8000-8002").expect("a range");
        let pairs: Vec<(Option<u16>, u16)> = range
            .iter()
            .map(|p| (p.host_port, p.container_port))
            .collect();
        assert_eq!(
            pairs,
            [(Some(9000), 8000), (Some(9001), 8001), (Some(9002), 8002)]
        );
        assert_eq!(
            parse_ports("127.0.0.1::16384-16386/udp").map(|p| p.len()),
            Some(3)
        );
        for bad in [
            "127.0.0.1::http",
            "127.0.0.1:1-3:1-2",
            "127.0.0.1::0",
            "80/icmp",
            "127.0.0.1::5-1",
        ] {
            assert_eq!(parse_ports(bad), None, "{bad}");
        }
    }
}
