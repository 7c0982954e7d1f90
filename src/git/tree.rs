//! Reads manifest blobs at one commit straight from the object database.
//!
//! Invariant: only blobs under the configured paths whose extension is a manifest extension,
//! and that the host selection applies (`model::hosts`), are read; symlinks and submodules are never followed (a symlinked manifest is refused: it is
//! listed in the snapshot, so the commit is rejected with a diagnostic naming it), and paths stay repo-relative with `/` separators.
//! Every blob's size is read from its object header first ([`read_blob`]): one over its
//! limit (a manifest's, a trigger file's, `--max-file-size` for `file()`) is refused unread,
//! and no other blob (an unreferenced one) is ever opened.

use gix::bstr::ByteSlice;

use super::{Error, Result};
use crate::model::{
    BlobId, CommitSha, FileSize, HostSelection, Snapshot, SourceFile, is_manifest_path,
};

/// The manifest blobs the last [`read_snapshot`] read, by id, so the next read of a commit
/// that changed few files decompresses those alone. Holds one read's blobs, at most
/// [`BlobMemo::MAX_BYTES`] of them and none over [`BlobMemo::MAX_BLOB_BYTES`].
#[derive(Default)]
pub(super) struct BlobMemo {
    blobs: std::collections::HashMap<gix::ObjectId, Vec<u8>>,
}

impl BlobMemo {
    const MAX_BYTES: usize = 8 * 1024 * 1024;
    const MAX_BLOB_BYTES: usize = 256 * 1024;
}

/// Reads the manifests at `sha` with their blob ids (`ids[i]` for `files[i]`), taking the
/// bytes of blobs `memo` holds from it, and leaving in `memo` the blobs of this read.
pub(super) fn read_snapshot(
    repo: &gix::Repository,
    sha: &CommitSha,
    paths: &[String],
    hosts: &HostSelection,
    memo: &mut BlobMemo,
) -> Result<(Snapshot, Vec<Option<BlobId>>)> {
    let read_error = |message: String| Error::Read {
        sha: sha.to_string(),
        message,
    };
    let tree = repo
        .find_tree(tree_of(repo, sha)?)
        .map_err(|error| read_error(error.to_string()))?;
    let mut recorder = gix::traverse::tree::Recorder::default();
    tree.traverse()
        .breadthfirst(&mut recorder)
        .map_err(|error| read_error(error.to_string()))?;
    let prefixes: Vec<String> = paths
        .iter()
        .map(|path| normalize_watched_path(path))
        .filter(|path| !path.is_empty())
        .collect();
    let mut refused = Vec::new();
    // A watched path that matches nothing would read as "the repo declares nothing" and prune
    // every resource: refuse the commit instead.
    for prefix in &prefixes {
        let exists = recorder
            .records
            .iter()
            .any(|entry| is_under(&entry.filepath.to_str_lossy(), prefix));
        if !exists {
            refused.push((
                prefix.clone(),
                "watched --path does not exist in this commit; check --path (nothing was applied)"
                    .to_owned(),
            ));
        }
    }
    let mut files = Vec::new();
    for entry in recorder.records {
        let path = entry.filepath.to_str_lossy().into_owned();
        let watched = prefixes.is_empty() || prefixes.iter().any(|prefix| is_under(&path, prefix));
        // Another host's manifests are not read at all: a mistake there is that host's.
        if !watched || !is_manifest_path(&path) || !hosts.selects(&path, &prefixes) {
            continue;
        }
        if entry.mode.is_link() {
            refused.push((
                path,
                "manifest is a symlink; manifests must be regular files in the repo".to_owned(),
            ));
            continue;
        }
        if !entry.mode.is_blob() {
            continue;
        }
        if let Some(contents) = memo.blobs.get(&entry.oid) {
            files.push((
                SourceFile {
                    path,
                    contents: contents.clone(),
                },
                entry.oid,
            ));
            continue;
        }
        match read_blob(repo, entry.oid, crate::model::MAX_MANIFEST_BYTES)
            .map_err(|error| read_error(format!("{path}: {error}")))?
        {
            Blob::Bytes(contents) => files.push((SourceFile { path, contents }, entry.oid)),
            Blob::TooLarge(size) => refused.push((
                path,
                format!(
                    "manifest is {size}; at most {} bytes are read (split it into several files)",
                    crate::model::MAX_MANIFEST_BYTES
                ),
            )),
        }
    }
    files.sort_unstable_by(|a, b| a.0.path.cmp(&b.0.path));
    memo.blobs.clear();
    let mut kept = 0;
    for (file, id) in &files {
        if file.contents.len() > BlobMemo::MAX_BLOB_BYTES {
            continue;
        }
        kept += file.contents.len();
        if kept > BlobMemo::MAX_BYTES {
            break;
        }
        memo.blobs.insert(*id, file.contents.clone());
    }
    let ids = files
        .iter()
        .map(|(_, id)| Some(BlobId::new(id.as_bytes())))
        .collect();
    let snapshot = Snapshot {
        commit: sha.clone(),
        files: files.into_iter().map(|(file, _)| file).collect(),
        refused,
    };
    Ok((snapshot, ids))
}

/// The trigger files of commit `sha` (`.voodu/**/*.yml`), in path order, and the ones
/// refused (symlinks), read from the `.voodu` subtree only.
pub(super) fn read_trigger_files(
    repo: &gix::Repository,
    sha: &CommitSha,
) -> Result<super::TriggerFiles> {
    let read_error = |message: String| Error::Read {
        sha: sha.to_string(),
        message,
    };
    let root = repo
        .find_tree(tree_of(repo, sha)?)
        .map_err(|error| read_error(error.to_string()))?;
    let Some(entry) = root
        .lookup_entry([crate::model::TRIGGER_DIR.as_bytes()])
        .map_err(|error| read_error(error.to_string()))?
    else {
        return Ok((Vec::new(), Vec::new()));
    };
    if !entry.mode().is_tree() {
        return Ok((Vec::new(), Vec::new()));
    }
    let subtree = repo
        .find_tree(entry.object_id())
        .map_err(|error| read_error(error.to_string()))?;
    let mut recorder = gix::traverse::tree::Recorder::default();
    subtree
        .traverse()
        .breadthfirst(&mut recorder)
        .map_err(|error| read_error(error.to_string()))?;
    let mut files = Vec::new();
    let mut refused = Vec::new();
    for entry in recorder.records {
        let path = format!(
            "{}/{}",
            crate::model::TRIGGER_DIR,
            entry.filepath.to_str_lossy()
        );
        if !crate::model::is_trigger_path(&path) {
            continue;
        }
        if entry.mode.is_link() {
            refused.push((
                path,
                "trigger file is a symlink; trigger files must be regular files in the repo"
                    .to_owned(),
            ));
            continue;
        }
        if !entry.mode.is_blob() {
            continue;
        }
        match read_blob(repo, entry.oid, crate::model::MAX_TRIGGER_FILE_BYTES)
            .map_err(|error| read_error(format!("{path}: {error}")))?
        {
            Blob::Bytes(contents) => files.push(SourceFile { path, contents }),
            Blob::TooLarge(size) => refused.push((
                path,
                format!(
                    "trigger file is {size}; at most {} are read",
                    crate::model::MAX_TRIGGER_FILE_BYTES
                ),
            )),
        }
    }
    files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Ok((files, refused))
}

/// An object of the mirror that gix could not find or decode (its own error, kept).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ObjectError(#[source] Box<dyn std::error::Error + Send + Sync>);

impl ObjectError {
    fn new(error: impl std::error::Error + Send + Sync + 'static) -> ObjectError {
        ObjectError(Box::new(error))
    }
}

/// What [`read_blob`] found: the blob's bytes, or its size when that is over the limit.
enum Blob {
    Bytes(Vec<u8>),
    /// From the object header, or the mirror's blob limit for a blob its fetches left out:
    /// none of the content was decompressed.
    TooLarge(FileSize),
}

/// Reads blob `id` whole only when its object header says it is at most `max_bytes` long;
/// otherwise its size alone. A blob the mirror lacks is one its fetches left out for its
/// size (`fetch::BlobLimit`), when the mirror has a limit. The one place this module reads
/// blob content.
fn read_blob(
    repo: &gix::Repository,
    id: gix::ObjectId,
    max_bytes: u64,
) -> std::result::Result<Blob, ObjectError> {
    let size = match repo.find_header(id) {
        Ok(header) => header.size(),
        Err(error) => {
            return match super::fetch::BlobLimit::of(repo.path()) {
                Some(limit) if !repo.has_object(id) => {
                    Ok(Blob::TooLarge(FileSize::AtLeast(limit.bytes())))
                }
                _ => Err(ObjectError::new(error)),
            };
        }
    };
    if size > max_bytes {
        return Ok(Blob::TooLarge(FileSize::Exact(size)));
    }
    let object = repo.find_object(id).map_err(ObjectError::new)?;
    Ok(Blob::Bytes(object.detach().data))
}

/// How far back `changed_paths` looks for the earlier commit among the later one's ancestors.
const MAX_ANCESTRY_WALK: usize = 10_000;

/// The paths (files, symlinks, submodules) that differ between commits `from` and `to`, or
/// `None` when `from` is not an ancestor of `to` within [`MAX_ANCESTRY_WALK`] commits (a
/// force-push, another branch's history) or is not in the mirror at all: the caller treats
/// every path as changed. Unchanged subtrees are skipped by their ids, so the cost is in
/// proportion to what changed.
pub(super) fn changed_paths(
    repo: &gix::Repository,
    from: &CommitSha,
    to: &CommitSha,
) -> Result<Option<Vec<String>>> {
    let read_error = |message: String| Error::Read {
        sha: to.to_string(),
        message,
    };
    let Ok(from_id) = gix::ObjectId::from_hex(from.as_str().as_bytes()) else {
        return Ok(None);
    };
    if repo.find_commit(from_id).is_err() {
        return Ok(None);
    }
    let to_id = gix::ObjectId::from_hex(to.as_str().as_bytes())
        .map_err(|error| read_error(error.to_string()))?;
    if !is_ancestor(repo, from_id, to_id) {
        return Ok(None);
    }
    let mut changed = Vec::new();
    let mut work: Vec<(String, Option<gix::ObjectId>, Option<gix::ObjectId>)> = vec![(
        String::new(),
        Some(tree_of(repo, from)?),
        Some(tree_of(repo, to)?),
    )];
    while let Some((prefix, old, new)) = work.pop() {
        let old_entries = tree_entries(repo, old).map_err(|error| read_error(error.to_string()))?;
        let new_entries = tree_entries(repo, new).map_err(|error| read_error(error.to_string()))?;
        let names: std::collections::BTreeSet<&String> =
            old_entries.keys().chain(new_entries.keys()).collect();
        for name in names {
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let old_entry = old_entries.get(name);
            let new_entry = new_entries.get(name);
            if old_entry == new_entry {
                continue;
            }
            let subtree = |entry: Option<&(bool, gix::ObjectId)>| {
                entry.and_then(|(is_tree, id)| is_tree.then_some(*id))
            };
            let is_file =
                |entry: Option<&(bool, gix::ObjectId)>| entry.is_some_and(|(is_tree, _)| !is_tree);
            if is_file(old_entry) || is_file(new_entry) {
                changed.push(path.clone());
            }
            let (old_tree, new_tree) = (subtree(old_entry), subtree(new_entry));
            if old_tree.is_some() || new_tree.is_some() {
                work.push((path, old_tree, new_tree));
            }
        }
    }
    changed.sort_unstable();
    Ok(Some(changed))
}

/// A tree's entries by name: whether each is a tree, and its object id (a mode change
/// alone, such as the executable bit, is not a change of what the file says).
fn tree_entries(
    repo: &gix::Repository,
    tree: Option<gix::ObjectId>,
) -> std::result::Result<std::collections::BTreeMap<String, (bool, gix::ObjectId)>, ObjectError> {
    let mut entries = std::collections::BTreeMap::new();
    let Some(tree) = tree else {
        return Ok(entries);
    };
    let tree = repo.find_tree(tree).map_err(ObjectError::new)?;
    let decoded = tree.decode().map_err(ObjectError::new)?;
    for entry in decoded.entries {
        entries.insert(
            entry.filename.to_str_lossy().into_owned(),
            (entry.mode.is_tree(), entry.oid.to_owned()),
        );
    }
    Ok(entries)
}

/// Whether `ancestor` is `descendant` or one of its ancestors, looking at most
/// [`MAX_ANCESTRY_WALK`] commits back.
fn is_ancestor(repo: &gix::Repository, ancestor: gix::ObjectId, descendant: gix::ObjectId) -> bool {
    let mut seen = std::collections::HashSet::new();
    let mut queue = std::collections::VecDeque::from([descendant]);
    while let Some(id) = queue.pop_front() {
        if id == ancestor {
            return true;
        }
        if seen.len() >= MAX_ANCESTRY_WALK || !seen.insert(id) {
            continue;
        }
        if let Ok(commit) = repo.find_commit(id) {
            queue.extend(commit.parent_ids().map(|parent| parent.detach()));
        }
    }
    false
}

/// The tree id of commit `sha`.
fn tree_of(repo: &gix::Repository, sha: &CommitSha) -> Result<gix::ObjectId> {
    let read_error = |error: &dyn std::fmt::Display| Error::Read {
        sha: sha.to_string(),
        message: error.to_string(),
    };
    let id =
        gix::ObjectId::from_hex(sha.as_str().as_bytes()).map_err(|error| read_error(&error))?;
    Ok(repo
        .find_commit(id)
        .map_err(|error| read_error(&error))?
        .tree_id()
        .map_err(|error| read_error(&error))?
        .detach())
}

/// Whether repo path `path` is `prefix` or lies under it.
fn is_under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// `./deploy/`, `deploy` and `/deploy` all mean `deploy`; `.` and `./` mean the whole repo.
pub(super) fn normalize_watched_path(path: &str) -> String {
    path.split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// The files manifests read (`file()`, `env_file`) when they come from several commits:
/// deploy triggers keep each trigger's manifest at the commit it last fired, so a
/// manifest's files are read at that manifest's commit; other reads at `default`.
pub(crate) struct TriggeredFiles {
    default: CommitFiles,
    by_manifest: std::collections::BTreeMap<String, CommitFiles>,
}

impl TriggeredFiles {
    pub(super) fn new(
        repo: &gix::Repository,
        default: &CommitSha,
        manifests: &[(String, CommitSha)],
    ) -> Result<TriggeredFiles> {
        let mut by_manifest = std::collections::BTreeMap::new();
        for (path, sha) in manifests {
            by_manifest.insert(path.clone(), CommitFiles::new(repo.clone(), sha)?);
        }
        Ok(TriggeredFiles {
            default: CommitFiles::new(repo.clone(), default)?,
            by_manifest,
        })
    }
}

impl crate::model::FileSource for TriggeredFiles {
    fn read(&self, path: &str, max_bytes: u64) -> crate::model::FileRead {
        self.default.read(path, max_bytes)
    }

    fn read_for(&self, manifest_path: &str, path: &str, max_bytes: u64) -> crate::model::FileRead {
        self.by_manifest
            .get(manifest_path)
            .unwrap_or(&self.default)
            .read(path, max_bytes)
    }
}

/// The longest symlink target read (Linux's `PATH_MAX`).
const MAX_LINK_TARGET_BYTES: u64 = 4096;

/// The files of one commit, read by path from the object database (`file()`, `env_file`).
pub struct CommitFiles {
    repo: gix::Repository,
    tree: gix::ObjectId,
}

impl CommitFiles {
    pub(super) fn new(repo: gix::Repository, sha: &CommitSha) -> Result<CommitFiles> {
        let tree = tree_of(&repo, sha)?;
        Ok(CommitFiles { repo, tree })
    }
}

impl crate::model::FileSource for CommitFiles {
    fn read(&self, path: &str, max_bytes: u64) -> crate::model::FileRead {
        use crate::model::FileRead;
        let tree = match self.repo.find_tree(self.tree) {
            Ok(tree) => tree,
            Err(error) => return FileRead::Error(error.to_string()),
        };
        let entry = match tree.lookup_entry(path.split('/').map(str::as_bytes)) {
            Ok(Some(entry)) => entry,
            Ok(None) => return FileRead::Missing,
            Err(error) => return FileRead::Error(error.to_string()),
        };
        let mode = entry.mode();
        if !(mode.is_blob() || mode.is_link()) {
            return FileRead::NotAFile;
        }
        // A symlink's blob is its target path: bounded by what a path can be.
        let max_bytes = if mode.is_link() {
            MAX_LINK_TARGET_BYTES
        } else {
            max_bytes
        };
        match read_blob(&self.repo, entry.object_id(), max_bytes) {
            Ok(Blob::Bytes(bytes)) if mode.is_link() => {
                FileRead::Symlink(String::from_utf8_lossy(&bytes).into_owned())
            }
            Ok(Blob::Bytes(bytes)) => FileRead::File(bytes),
            Ok(Blob::TooLarge(size)) if mode.is_link() => FileRead::Error(format!(
                "a symlink whose target is {size}; at most {MAX_LINK_TARGET_BYTES} bytes are read"
            )),
            Ok(Blob::TooLarge(size)) => FileRead::TooLarge(size),
            Err(error) => FileRead::Error(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{CommitFiles, is_under, normalize_watched_path};
    use crate::model::{CommitSha, FileRead, FileSize, FileSource};

    /// A commit in `repo` whose tree is `entries` (sorted by name), each `(name, is_link,
    /// blob id)`.
    fn commit_of(
        repo: &gix::Repository,
        entries: &[(&str, bool, gix::ObjectId)],
    ) -> Result<CommitSha, Box<dyn std::error::Error>> {
        use gix::objs::tree::{Entry, EntryKind};
        let tree = gix::objs::Tree {
            entries: entries
                .iter()
                .map(|(name, is_link, oid)| Entry {
                    mode: if *is_link {
                        EntryKind::Link
                    } else {
                        EntryKind::Blob
                    }
                    .into(),
                    filename: (*name).into(),
                    oid: *oid,
                })
                .collect(),
        };
        let signature = gix::actor::Signature {
            name: "test".into(),
            email: "test@example.invalid".into(),
            time: gix::date::Time::new(0, 0),
        };
        let commit = gix::objs::Commit {
            tree: repo.write_object(&tree)?.detach(),
            parents: Default::default(),
            author: signature.clone(),
            committer: signature,
            encoding: None,
            message: "test\n".into(),
            extra_headers: Vec::new(),
        };
        Ok(CommitSha::new(repo.write_object(&commit)?.to_string()))
    }

    /// `read_blob`'s refusals as `CommitFiles` reports them: a symlink target over 4 KiB with
    /// its size; a blob the mirror lacks is an error, or "at least" the mirror's blob limit
    /// once the mirror records one (its fetches left such blobs out).
    #[test]
    fn long_link_targets_and_left_out_blobs_are_refused_with_their_size()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let repo = gix::init_bare(dir.path())?;
        let long = repo.write_blob("a".repeat(5000))?.detach();
        let absent = gix::ObjectId::from_hex(b"0123456789abcdef0123456789abcdef01234567")?;
        let sha = commit_of(
            &repo,
            &[
                ("absent", false, absent),
                ("absent-link", true, absent),
                ("long", true, long),
            ],
        )?;
        let files = CommitFiles::new(repo.clone(), &sha)?;
        assert_eq!(
            files.read("long", 1 << 20),
            FileRead::Error(
                "a symlink whose target is 5000 bytes; at most 4096 bytes are read".to_owned()
            )
        );
        assert!(matches!(files.read("absent", 1 << 20), FileRead::Error(_)));

        std::fs::write(dir.path().join("blob-limit"), "8388609\n")?;
        assert_eq!(
            files.read("absent", 1 << 20),
            FileRead::TooLarge(FileSize::AtLeast(8_388_609))
        );
        assert_eq!(
            files.read("absent-link", 1 << 20),
            FileRead::Error(
                "a symlink whose target is at least 8388609 bytes (the agent does not fetch blobs this large); at most 4096 bytes are read"
                    .to_owned()
            )
        );
        Ok(())
    }

    #[test]
    fn a_path_is_under_its_prefix_or_equal_to_it_only() {
        assert!(is_under("deploy", "deploy"));
        assert!(is_under("deploy/web.hcl", "deploy"));
        assert!(!is_under("deploy-old/web.hcl", "deploy"));
        assert!(!is_under("other/deploy/web.hcl", "deploy"));
    }

    #[test]
    fn watched_paths_normalise() {
        for (input, expected) in [
            ("./deploy/", "deploy"),
            ("deploy", "deploy"),
            ("/a/./b", "a/b"),
            (".", ""),
            ("./", ""),
        ] {
            assert_eq!(normalize_watched_path(input), expected, "{input}");
        }
    }
}
