//! What the manifest stage reads: the manifest files of one commit (`Snapshot`) and, through
//! `FileSource`, the other files of that repo state (for `file()` and `env_file`).
//!
//! Invariant: paths are repo-relative with `/` separators; the manifest stage does no IO of its
//! own, so what is not in a snapshot or a `FileSource` does not exist for it.

use super::CommitSha;

/// The largest manifest file read, in bytes. A larger one is refused from its size in the
/// object header (or the file system), before any of it is read.
pub const MAX_MANIFEST_BYTES: u64 = 8 * 1024 * 1024;

/// The largest trigger file (`.voodu/**/*.yml`) read, in bytes; a larger one is refused
/// unread, as a larger manifest is.
pub const MAX_TRIGGER_FILE_BYTES: u64 = 64 * 1024;

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

/// The directory, at the repo root, that holds voodu's deploy trigger files.
pub const TRIGGER_DIR: &str = ".voodu";

/// True when `path` names a deploy trigger file: under `.voodu/` at the repo root (any
/// depth), ending in `.yml` or `.yaml` (compared lower-cased). Manifests may live in
/// `.voodu/` too; the extension tells them apart.
pub fn is_trigger_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix(".voodu/") else {
        return false;
    };
    let Some((stem, extension)) = rest.rsplit_once('.') else {
        return false;
    };
    !stem.is_empty()
        && !stem.ends_with('/')
        && matches!(extension.to_ascii_lowercase().as_str(), "yml" | "yaml")
}

/// One manifest file read from a commit: its repo-relative path and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    pub path: String,
    pub contents: Vec<u8>,
}

/// The content id of a manifest file: its git blob id. Equal ids, equal bytes: a loader may
/// reuse what it decoded from a file with the same path and id (`manifest::DecodeCache`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobId(Box<[u8]>);

impl BlobId {
    pub fn new(bytes: &[u8]) -> BlobId {
        BlobId(bytes.into())
    }
}

/// Lowercase hex, as git shows it.
impl std::fmt::Display for BlobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
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

impl Snapshot {
    /// Keeps only the manifests (and refusals) `hosts` applies, given the watched `--path`
    /// prefixes (`super::hosts`).
    pub(crate) fn keep_for(&mut self, hosts: &super::HostSelection, watched: &[String]) {
        self.files.retain(|file| hosts.selects(&file.path, watched));
        self.refused
            .retain(|(path, _)| hosts.selects(path, watched));
    }
}

/// What a [`FileSource`] finds at a repo path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRead {
    File(Vec<u8>),
    /// A file larger than the reader was asked to read. None of its content was read.
    TooLarge(FileSize),
    /// A symlink and its target as written (relative or absolute).
    Symlink(String),
    Missing,
    /// A directory, submodule or other non-file entry.
    NotAFile,
    Error(String),
}

/// How large a file refused for its size is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileSize {
    /// Its size in bytes, from the object header or the file system.
    Exact(u64),
    /// A blob the mirror does not hold: its fetches leave out blobs of this many bytes or
    /// more (`git::fetch`).
    AtLeast(u64),
}

impl std::fmt::Display for FileSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileSize::Exact(bytes) => write!(f, "{bytes} bytes"),
            FileSize::AtLeast(bytes) => write!(
                f,
                "at least {bytes} bytes (the agent does not fetch blobs this large)"
            ),
        }
    }
}

/// Read access to the files of one repo state (a commit's tree, or a working directory), for
/// `file()` and `env_file`. Paths are repo-relative with `/` separators, already normalised.
///
/// Every read is bounded: a file larger than `max_bytes` is [`FileRead::TooLarge`], told
/// from its size before any content is read.
pub trait FileSource {
    fn read(&self, path: &str, max_bytes: u64) -> FileRead;

    /// Reads `path` on behalf of the manifest file `manifest_path`. A source whose manifests
    /// come from several commits (deploy triggers keep each trigger's files at the commit it
    /// last fired) reads at that manifest's commit; every other source reads `path`.
    fn read_for(&self, manifest_path: &str, path: &str, max_bytes: u64) -> FileRead {
        let _ = manifest_path;
        self.read(path, max_bytes)
    }
}

/// An in-memory [`FileSource`], for tests and for sources that hold no other files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryFiles {
    entries: std::collections::BTreeMap<String, FileRead>,
}

impl MemoryFiles {
    pub(crate) const fn new() -> MemoryFiles {
        MemoryFiles {
            entries: std::collections::BTreeMap::new(),
        }
    }

    #[cfg(test)]
    pub(crate) fn file(&mut self, path: &str, contents: &[u8]) -> &mut MemoryFiles {
        self.entries
            .insert(path.to_owned(), FileRead::File(contents.to_vec()));
        self
    }

    #[cfg(test)]
    pub(crate) fn link(&mut self, path: &str, target: &str) -> &mut MemoryFiles {
        self.entries
            .insert(path.to_owned(), FileRead::Symlink(target.to_owned()));
        self
    }
}

impl FileSource for MemoryFiles {
    fn read(&self, path: &str, max_bytes: u64) -> FileRead {
        match self.entries.get(path) {
            Some(FileRead::File(bytes)) if bytes.len() as u64 > max_bytes => {
                FileRead::TooLarge(FileSize::Exact(bytes.len() as u64))
            }
            Some(read) => read.clone(),
            None => FileRead::Missing,
        }
    }
}
