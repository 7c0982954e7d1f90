//! A working directory as a manifest source, for `validate DIR` and `plan --repo DIR`: the same
//! `Snapshot` and `FileSource` a commit gives, read from disk instead of the object database.
//!
//! Invariants: as for commits, only manifest files under the watched paths are read, `.git` is
//! skipped, a symlinked manifest is refused (listed in `Snapshot::refused`), and `FileSource`
//! reports symlinks as links (the manifest stage decides whether to follow them), so nothing
//! outside the directory is read through this module.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Error, Result};
use crate::model::{
    CommitSha, FileRead, FileSize, FileSource, Snapshot, SourceFile, is_manifest_path,
};

/// The name a working directory's snapshot carries in place of a commit SHA.
pub const WORKDIR_COMMIT: &str = "working-tree";

/// Reads the manifests of `root` (restricted to `paths`, repo-relative; empty = everything).
pub fn read_workdir(root: &Path, paths: &[String]) -> Result<Snapshot> {
    let read_error = |message: String| Error::Read {
        sha: format!("{WORKDIR_COMMIT} {}", root.display()),
        message,
    };
    if !root.is_dir() {
        return Err(read_error("not a directory".to_owned()));
    }
    let mut files = Vec::new();
    let mut refused = Vec::new();
    let mut all = Vec::new();
    walk(root, "", &mut all).map_err(|error| read_error(error.to_string()))?;
    let prefixes: Vec<String> = paths
        .iter()
        .map(|path| super::tree::normalize_watched_path(path))
        .filter(|path| !path.is_empty())
        .collect();
    for prefix in &prefixes {
        let exists = all
            .iter()
            .any(|(path, _)| path == prefix || path.starts_with(&format!("{prefix}/")));
        if !exists {
            refused.push((
                prefix.clone(),
                "watched --path does not exist; check --path".to_owned(),
            ));
        }
    }
    for (path, kind) in all {
        let watched = prefixes.is_empty()
            || prefixes
                .iter()
                .any(|prefix| path == *prefix || path.starts_with(&format!("{prefix}/")));
        if !watched || !is_manifest_path(&path) {
            continue;
        }
        match kind {
            Entry::Link => refused.push((
                path,
                "manifest is a symlink; manifests must be regular files in the repo".to_owned(),
            )),
            Entry::File => {
                match read_bounded(&root.join(&path), crate::model::MAX_MANIFEST_BYTES)
                    .map_err(|error| read_error(format!("{path}: {error}")))?
                {
                    FileRead::TooLarge(size) => refused.push((
                        path,
                        format!(
                            "manifest is {size}; at most {} bytes are read (split it into several files)",
                            crate::model::MAX_MANIFEST_BYTES
                        ),
                    )),
                    FileRead::File(contents) => files.push(SourceFile { path, contents }),
                    _ => {}
                }
            }
            Entry::Dir => {}
        }
    }
    files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Ok(Snapshot {
        commit: CommitSha::new(WORKDIR_COMMIT),
        files,
        refused,
    })
}

/// The trigger files of `root` (`.voodu/**/*.yml`), in path order, and the refused ones
/// (symlinks).
pub fn read_workdir_triggers(root: &Path) -> Result<super::TriggerFiles> {
    let read_error = |message: String| Error::Read {
        sha: format!("{WORKDIR_COMMIT} {}", root.display()),
        message,
    };
    let mut files = Vec::new();
    let mut refused = Vec::new();
    if !root.join(crate::model::TRIGGER_DIR).is_dir() {
        return Ok((files, refused));
    }
    let mut all = Vec::new();
    walk(root, crate::model::TRIGGER_DIR, &mut all)
        .map_err(|error| read_error(error.to_string()))?;
    for (path, kind) in all {
        if !crate::model::is_trigger_path(&path) {
            continue;
        }
        match kind {
            Entry::Link => refused.push((
                path,
                "trigger file is a symlink; trigger files must be regular files in the repo"
                    .to_owned(),
            )),
            Entry::File => {
                match read_bounded(&root.join(&path), crate::model::MAX_TRIGGER_FILE_BYTES)
                    .map_err(|error| read_error(format!("{path}: {error}")))?
                {
                    FileRead::TooLarge(size) => refused.push((
                        path,
                        format!(
                            "trigger file is {size}; at most {} are read",
                            crate::model::MAX_TRIGGER_FILE_BYTES
                        ),
                    )),
                    FileRead::File(contents) => files.push(SourceFile { path, contents }),
                    _ => {}
                }
            }
            Entry::Dir => {}
        }
    }
    files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Ok((files, refused))
}

/// The file at `path` when it is at most `max_bytes` long (`File`), else its size
/// (`TooLarge`): the size is taken from the file system first, and no more than `max_bytes`
/// + 1 bytes are read even if the file grows meanwhile.
fn read_bounded(path: &Path, max_bytes: u64) -> std::io::Result<FileRead> {
    use std::io::Read as _;
    let file = fs::File::open(path)?;
    let size = file.metadata()?.len();
    if size > max_bytes {
        return Ok(FileRead::TooLarge(FileSize::Exact(size)));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Ok(FileRead::TooLarge(FileSize::Exact(bytes.len() as u64)));
    }
    Ok(FileRead::File(bytes))
}

enum Entry {
    File,
    Link,
    Dir,
}

fn walk(root: &Path, relative: &str, out: &mut Vec<(String, Entry)>) -> std::io::Result<()> {
    let dir = if relative.is_empty() {
        root.to_owned()
    } else {
        root.join(relative)
    };
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<std::io::Result<_>>()?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        if relative.is_empty() && name == ".git" {
            continue;
        }
        let path = if relative.is_empty() {
            name
        } else {
            format!("{relative}/{name}")
        };
        let file_type = entry.file_type()?;
        if file_type.is_symlink() {
            out.push((path, Entry::Link));
        } else if file_type.is_dir() {
            walk(root, &path, out)?;
            out.push((path, Entry::Dir));
        } else if file_type.is_file() {
            out.push((path, Entry::File));
        }
    }
    Ok(())
}

/// The files of a working directory, for `file()` and `env_file`.
pub struct WorkdirFiles {
    root: PathBuf,
}

impl WorkdirFiles {
    pub fn new(root: &Path) -> WorkdirFiles {
        WorkdirFiles {
            root: root.to_owned(),
        }
    }
}

impl FileSource for WorkdirFiles {
    fn read(&self, path: &str, max_bytes: u64) -> FileRead {
        // The manifest stage hands over normalised repo-relative paths; refuse anything else.
        if path.split('/').any(|part| part == ".." || part.is_empty()) || path.starts_with('/') {
            return FileRead::Error(format!("{path:?} is not a normalised repo path"));
        }
        let full = self.root.join(path);
        let metadata = match fs::symlink_metadata(&full) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return FileRead::Missing,
            Err(error) => return FileRead::Error(error.to_string()),
        };
        if metadata.file_type().is_symlink() {
            return match fs::read_link(&full) {
                Ok(target) => FileRead::Symlink(target.to_string_lossy().into_owned()),
                Err(error) => FileRead::Error(error.to_string()),
            };
        }
        if !metadata.is_file() {
            return FileRead::NotAFile;
        }
        if metadata.len() > max_bytes {
            return FileRead::TooLarge(FileSize::Exact(metadata.len()));
        }
        read_bounded(&full, max_bytes).unwrap_or_else(|error| FileRead::Error(error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_manifests_and_refuses_symlinks() -> std::result::Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        fs::create_dir_all(dir.path().join("deploy/sub"))?;
        fs::create_dir_all(dir.path().join(".git"))?;
        fs::write(dir.path().join("deploy/a.hcl"), "x")?;
        fs::write(dir.path().join("deploy/sub/b.voodu"), "y")?;
        fs::write(dir.path().join("deploy/notes.md"), "z")?;
        fs::write(dir.path().join(".git/c.hcl"), "no")?;
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("deploy/evil.hcl"))?;
        let snapshot = read_workdir(dir.path(), &[])?;
        let paths: Vec<&str> = snapshot
            .files
            .iter()
            .map(|file| file.path.as_str())
            .collect();
        assert_eq!(paths, ["deploy/a.hcl", "deploy/sub/b.voodu"]);
        assert_eq!(snapshot.refused.len(), 1);
        assert_eq!(snapshot.refused[0].0, "deploy/evil.hcl");
        let files = WorkdirFiles::new(dir.path());
        assert_eq!(
            files.read("deploy/a.hcl", 64),
            FileRead::File(b"x".to_vec())
        );
        assert_eq!(
            files.read("deploy/evil.hcl", 64),
            FileRead::Symlink("/etc/hostname".into())
        );
        assert_eq!(files.read("nope", 64), FileRead::Missing);
        fs::write(dir.path().join("deploy/big.txt"), [b'x'; 65])?;
        assert_eq!(
            files.read("deploy/big.txt", 64),
            FileRead::TooLarge(FileSize::Exact(65))
        );
        assert_eq!(
            files.read("deploy/big.txt", 65),
            FileRead::File(vec![b'x'; 65])
        );
        assert_eq!(files.read("deploy", 64), FileRead::NotAFile);
        assert!(matches!(files.read("../x", 64), FileRead::Error(_)));
        let missing = read_workdir(dir.path(), &["nowhere".into()])?;
        assert_eq!(missing.refused[0].0, "nowhere");
        Ok(())
    }
}
