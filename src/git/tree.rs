//! Reads manifest blobs at one commit straight from the object database.
//!
//! Invariant: only blobs under the configured paths whose extension is a manifest extension
//! are read; symlinks and submodules are never followed (a symlinked manifest is refused: it is
//! listed in the snapshot, so the commit is rejected with a diagnostic naming it), and paths stay repo-relative with `/` separators.

use gix::bstr::ByteSlice;

use super::{Error, Result};
use crate::model::{CommitSha, Snapshot, SourceFile, is_manifest_path};

pub(super) fn read_snapshot(
    repo: &gix::Repository,
    sha: &CommitSha,
    paths: &[String],
) -> Result<Snapshot> {
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
        if !watched || !is_manifest_path(&path) {
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
        let blob = repo
            .find_object(entry.oid)
            .map_err(|error| read_error(format!("{path}: {error}")))?;
        files.push(SourceFile {
            path,
            contents: blob.data.clone(),
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Snapshot {
        commit: sha.clone(),
        files,
        refused,
    })
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
    fn read(&self, path: &str) -> crate::model::FileRead {
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
        match entry.object() {
            Ok(object) if mode.is_link() => {
                FileRead::Symlink(String::from_utf8_lossy(&object.data).into_owned())
            }
            Ok(object) => FileRead::File(object.data.clone()),
            Err(error) => FileRead::Error(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{is_under, normalize_watched_path};

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
