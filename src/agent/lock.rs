//! The data dir's lock: one agent per `--data-dir`, held for the agent's life.
//!
//! An advisory exclusive lock (`flock`) on `<data-dir>/lock`, which holds the holder's pid.
//! The kernel drops it when the process ends, however it ends, so a stale file never blocks a
//! restart. Commands that read state or edit config (`status`, `releases`, `config`,
//! `rollback`) never take it: they work while the agent runs.

use std::fs::{File, TryLockError};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

/// The lock file's name inside the data dir.
pub(crate) const LOCK_FILE: &str = "lock";

/// Why the data dir could not be locked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LockError {
    #[error(
        "data dir {dir} is in use by another voodu-agent ({holder}): stop that agent first, or give this one its own --data-dir",
        dir = dir.display()
    )]
    Held { dir: PathBuf, holder: String },
    #[error("cannot lock {path}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; dropping it releases the data dir.
#[derive(Debug)]
pub(crate) struct DataDirLock {
    _file: File,
}

/// Takes the data dir's lock without waiting, and writes this process's pid into it.
pub(crate) fn lock(data_dir: &Path) -> Result<DataDirLock, LockError> {
    let path = data_dir.join(LOCK_FILE);
    let io_error = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    // No truncation before the lock is ours: the holder's pid is in the file.
    let mut file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_error)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let holder = match text.trim().parse::<u32>() {
                Ok(pid) => format!("pid {pid}"),
                // It has the lock but has not written its pid yet.
                Err(_) => "pid not yet recorded".to_owned(),
            };
            return Err(LockError::Held {
                dir: data_dir.to_owned(),
                holder,
            });
        }
        Err(TryLockError::Error(source)) => return Err(io_error(source)),
    }
    file.set_len(0).map_err(io_error)?;
    file.rewind().map_err(io_error)?;
    writeln!(file, "{}", std::process::id()).map_err(io_error)?;
    file.flush().map_err(io_error)?;
    Ok(DataDirLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn a_second_lock_names_the_holder_and_a_released_lock_is_taken_again() -> TestResult {
        let dir = tempfile::tempdir()?;
        let held = lock(dir.path())?;
        let recorded = std::fs::read_to_string(dir.path().join(LOCK_FILE))?;
        assert_eq!(recorded.trim(), std::process::id().to_string());
        // flock locks belong to an open file: a second open in this process conflicts too.
        match lock(dir.path()) {
            Err(error @ LockError::Held { .. }) => {
                let message = error.to_string();
                let pid = format!("(pid {})", std::process::id());
                assert!(message.contains(&pid), "{message}");
                assert!(
                    message.contains("in use by another voodu-agent"),
                    "{message}"
                );
            }
            other => return Err(format!("expected Held, got {other:?}").into()),
        }
        drop(held);
        let again = lock(dir.path())?;
        drop(again);
        Ok(())
    }
}
