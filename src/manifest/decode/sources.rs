//! What `file()`, `env_file` and `url()` read, through the sources `load` is given: repo files
//! at the commit (`FileSource`) and a URL fetcher. No IO of its own.
//!
//! Invariant: `file()` and `env_file` paths are confined to the repo tree: relative to the
//! manifest's directory, never absolute, never climbing above the repo root with `..`, and a
//! symlink is followed only while it stays inside the repo.

use std::time::Duration;

use crate::manifest::{Mode, UrlError, UrlFetcher};
use crate::model::{FileRead, FileSize, FileSource};

/// Symlinks followed before giving up (a loop, or a very deep chain).
const MAX_SYMLINKS: usize = 8;

/// Everything a load reads besides the manifests themselves.
pub(crate) struct LoadEnv<'a> {
    pub(crate) files: &'a dyn FileSource,
    pub(crate) fetcher: Option<&'a dyn UrlFetcher>,
    pub(crate) mode: Mode,
    pub(crate) max_file_bytes: u64,
}

/// A file read for `file()` or `env_file`.
pub(crate) enum Read {
    Bytes(Vec<u8>),
    Failed(ReadError),
}

/// Why a `file()` / `env_file` path gives no bytes; each variant holds the path as written.
/// Display is the reason; `kinds` reports it at the call's `path:line:col`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReadError {
    #[error(
        "{path:?} is absolute: manifests read files of the repo only, relative to the manifest's directory"
    )]
    Absolute { path: String },
    #[error("{path:?} leads out of the repo")]
    OutOfRepo { path: String },
    #[error("{path:?} is {size}; the limit is {limit} bytes (--max-file-size)")]
    TooLarge {
        path: String,
        size: FileSize,
        limit: u64,
    },
    #[error(
        "{path:?} is a symlink to an absolute path ({target:?}): only links inside the repo are followed"
    )]
    AbsoluteSymlink { path: String, target: String },
    #[error("{path:?} is a symlink leading out of the repo ({target:?})")]
    SymlinkOutOfRepo { path: String, target: String },
    /// Not in the commit: `validate` reports this as a warning, the agent as an error.
    #[error("{path:?} does not exist in the repo (looked for {resolved:?})")]
    Missing { path: String, resolved: String },
    #[error("{path:?} is not a regular file")]
    NotAFile { path: String },
    #[error("{path:?} cannot be read: {message}")]
    Unreadable { path: String, message: String },
    #[error("{path:?}: too many symlinks (a loop?)")]
    SymlinkLoop { path: String },
}

impl ReadError {
    /// The path is not in the commit (rather than refused).
    pub(crate) fn is_missing(&self) -> bool {
        matches!(self, ReadError::Missing { .. })
    }
}

impl LoadEnv<'_> {
    /// Reads `path`, written in the manifest at `manifest_path`, from the repo.
    pub(crate) fn read_file(&self, manifest_path: &str, path: &str) -> Read {
        let path_owned = || path.to_owned();
        if path.starts_with('/') || path.starts_with('\\') {
            return Read::Failed(ReadError::Absolute { path: path_owned() });
        }
        let dir = manifest_path.rsplit_once('/').map_or("", |(dir, _)| dir);
        let Some(mut resolved) = join_confined(dir, path) else {
            return Read::Failed(ReadError::OutOfRepo { path: path_owned() });
        };
        for _ in 0..=MAX_SYMLINKS {
            match self
                .files
                .read_for(manifest_path, &resolved, self.max_file_bytes)
            {
                // Told from the object header: none of it was read.
                FileRead::TooLarge(size) => {
                    return Read::Failed(ReadError::TooLarge {
                        path: path_owned(),
                        size,
                        limit: self.max_file_bytes,
                    });
                }
                FileRead::File(bytes) => {
                    let size = bytes.len() as u64;
                    if size > self.max_file_bytes {
                        return Read::Failed(ReadError::TooLarge {
                            path: path_owned(),
                            size: FileSize::Exact(size),
                            limit: self.max_file_bytes,
                        });
                    }
                    return Read::Bytes(bytes);
                }
                FileRead::Symlink(target) => {
                    if target.starts_with('/') {
                        return Read::Failed(ReadError::AbsoluteSymlink {
                            path: path_owned(),
                            target,
                        });
                    }
                    let link_dir = resolved.rsplit_once('/').map_or("", |(dir, _)| dir);
                    match join_confined(link_dir, &target) {
                        Some(next) => resolved = next,
                        None => {
                            return Read::Failed(ReadError::SymlinkOutOfRepo {
                                path: path_owned(),
                                target,
                            });
                        }
                    }
                }
                FileRead::Missing => {
                    return Read::Failed(ReadError::Missing {
                        path: path_owned(),
                        resolved,
                    });
                }
                FileRead::NotAFile => {
                    return Read::Failed(ReadError::NotAFile { path: path_owned() });
                }
                FileRead::Error(message) => {
                    return Read::Failed(ReadError::Unreadable {
                        path: path_owned(),
                        message,
                    });
                }
            }
        }
        Read::Failed(ReadError::SymlinkLoop { path: path_owned() })
    }

    /// Fetches `url`; `None` in validate mode, where URLs are checked but not fetched.
    pub(crate) fn fetch(
        &self,
        url: &str,
        timeout: Duration,
        stale_ok: bool,
    ) -> Option<Result<Vec<u8>, UrlError>> {
        let fetcher = self.fetcher?;
        Some(fetcher.fetch(url, timeout, stale_ok))
    }
}

/// `dir/path` normalised (`.` and `..` resolved), or `None` when it climbs above the root.
pub(crate) fn join_confined(dir: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = dir.split('/').filter(|part| !part.is_empty()).collect();
    for part in path.split(['/', '\\']) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MemoryFiles;

    fn env(files: &MemoryFiles) -> LoadEnv<'_> {
        LoadEnv {
            files,
            fetcher: None,
            mode: Mode::Apply,
            max_file_bytes: 8,
        }
    }

    fn outcome(read: Read) -> String {
        match read {
            Read::Bytes(bytes) => format!("ok {}", String::from_utf8_lossy(&bytes)),
            Read::Failed(error) if error.is_missing() => format!("missing {error}"),
            Read::Failed(error) => format!("refused {error}"),
        }
    }

    #[test]
    fn paths_are_confined_to_the_repo() {
        let mut files = MemoryFiles::default();
        files.file("app/conf/a.txt", b"a");
        files.file("common/b.txt", b"b");
        files.file("big.txt", b"0123456789");
        files.link("app/link", "../common/b.txt");
        files.link("app/out", "../../etc/passwd");
        files.link("app/abs", "/etc/passwd");
        files.link("app/loop", "loop");
        let env = env(&files);
        let read = |path: &str| outcome(env.read_file("app/m.hcl", path));
        assert_eq!(read("./conf/a.txt"), "ok a");
        assert_eq!(read("../common/b.txt"), "ok b");
        assert_eq!(read("link"), "ok b");
        assert!(
            read("../../x").starts_with("refused"),
            "{}",
            read("../../x")
        );
        assert!(read("/etc/passwd").starts_with("refused"));
        assert!(read("out").starts_with("refused"));
        assert!(read("abs").starts_with("refused"));
        assert!(read("loop").starts_with("refused"));
        assert!(read("nope").starts_with("missing"));
        assert!(read("../big.txt").contains("limit is 8 bytes"));
    }

    #[test]
    fn joins_normalise() {
        assert_eq!(join_confined("a/b", "../c/./d").as_deref(), Some("a/c/d"));
        assert_eq!(join_confined("", "x").as_deref(), Some("x"));
        assert_eq!(join_confined("a", "../.."), None);
    }
}
