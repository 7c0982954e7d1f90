//! Atomic file writes: a temp file in the destination directory, fsync, rename, fsync of the
//! directory. A reader sees the old bytes or the new ones, never a torn file.
//!
//! Invariant: every path written here is below the root the caller passes, which is checked
//! here and not trusted from the caller's joins.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::Error;

/// Writes `bytes` to `path` atomically. `root` must be an ancestor of `path`.
pub(crate) fn write_atomic(root: &Path, path: &Path, bytes: &[u8]) -> Result<(), Error> {
    write_atomic_mode(root, path, bytes, None)
}

/// `write_atomic`, the file created with `mode` (e.g. 0o600 for a decrypted secret: the temp
/// file has it before a byte is written, so the clear bytes are never readable by others).
pub(crate) fn write_atomic_mode(
    root: &Path,
    path: &Path,
    bytes: &[u8],
    mode: Option<u32>,
) -> Result<(), Error> {
    let io_error = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let parent = confined_parent(root, path)?;
    fs::create_dir_all(&parent).map_err(io_error)?;
    // A directory where the file goes (voodu's layout changed, or a hand edit) is replaced.
    if path.is_dir() {
        fs::remove_dir_all(path).map_err(io_error)?;
    }
    let temp = temp_path(path);
    let result = (|| {
        let mut options = fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        if let Some(mode) = mode {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(mode);
        }
        #[cfg(not(unix))]
        let _ = mode;
        let mut file = options.open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)?;
        File::open(&parent)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result.map_err(io_error)
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    // One per write, also between threads: two sources' syncs may write one file (a `url()`
    // both fetch) at the same time.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    path.with_file_name(temp_name(&name, std::process::id(), write))
}

/// The temp file's name beside file `name`: the longest name written (an asset key's bound,
/// `model::names::MAX_ASSET_KEY`, leaves room for it).
fn temp_name(name: &str, pid: u32, write: u64) -> String {
    format!(".{name}.tmp-{pid}-{write}")
}

fn confined_parent(root: &Path, path: &Path) -> Result<PathBuf, Error> {
    let escapes = path
        .components()
        .any(|component| matches!(component, std::path::Component::ParentDir));
    match path.parent() {
        Some(parent)
            if !escapes && path.starts_with(root) && parent != root.parent().unwrap_or(root) =>
        {
            Ok(parent.to_owned())
        }
        _ => Err(Error::Confinement {
            path: path.to_owned(),
            root: root.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_whole_files_and_stay_under_the_root() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("assets");
        let file = root.join("s/n/k");
        write_atomic(&root, &file, b"one")?;
        write_atomic(&root, &file, b"two")?;
        assert_eq!(fs::read(&file)?, b"two");
        let leftovers: Vec<_> = fs::read_dir(root.join("s/n"))?.collect();
        assert_eq!(leftovers.len(), 1, "no temp file is left behind");
        fs::create_dir_all(root.join("s/n/d"))?;
        write_atomic(&root, &root.join("s/n/d"), b"file now")?;
        assert_eq!(fs::read(root.join("s/n/d"))?, b"file now");
        assert!(write_atomic(&root, &root.join("../x"), b"no").is_err());
        assert!(write_atomic(&root, &dir.path().join("elsewhere"), b"no").is_err());
        Ok(())
    }

    #[test]
    fn the_temp_file_of_the_longest_asset_key_fits_a_file_name() {
        use crate::model::names::{MAX_ASSET_KEY, NAME_MAX};
        let longest = temp_name(&"k".repeat(MAX_ASSET_KEY), u32::MAX, u64::MAX);
        assert!(longest.len() <= NAME_MAX, "{} bytes", longest.len());
    }
}
