//! The work of one data-run unit (`Work`), owned by its task: restic on a pod's claims (a
//! backup of each volume's directory, a restore swapped in beside the live one), on an exec
//! command's stream (a dump piped into restic, a snapshot piped into the restore command), or
//! on a scratch directory (a verify). It touches volume directories and runs restic and
//! `exec`; it never creates, stops or removes a container (the pass does).
//!
//! Invariants: an exec backup's stream reaches its end in restic only once the command
//! exited 0 (`GatedEof`); a restored tree replaces the live one by two renames on the same
//! file system, the old one kept as `_data.voodu-before-<run>`; a verify's scratch directory is
//! removed whatever the outcome.

use std::collections::BTreeMap;
use std::future::Future as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};

use super::{Done, PIPE_BYTES, aside, tags};
use crate::manifest::spec::BackupMode;
use crate::model::ResourceKey;
use crate::restic::{Repo, Restic};
use crate::runtime::Runtime;
use crate::store::DataWhat;

/// What one unit does, owned (it outlives the pass).
pub(super) struct Work<R: Runtime> {
    pub(super) restic: Restic,
    pub(super) repo: Repo,
    pub(super) runtime: Arc<R>,
    pub(super) key: ResourceKey,
    pub(super) host: String,
    pub(super) run: i64,
    pub(super) what: DataWhat,
    pub(super) mode: BackupMode,
    pub(super) deadline: Duration,
    pub(super) volumes: Vec<String>,
    pub(super) snapshots: BTreeMap<String, String>,
    pub(super) pod: Option<String>,
    pub(super) dump: String,
    pub(super) command: Vec<String>,
    pub(super) restore_command: Vec<String>,
    /// Where a verify restores to (`<data-dir>/restic-verify`).
    pub(super) scratch: PathBuf,
    /// What a verify must find: the bytes its backup read.
    pub(super) expected_bytes: u64,
}

impl<R: Runtime> Work<R> {
    /// Does the unit's work; its outcome, or why it failed (no password in it).
    pub(super) async fn run(self) -> std::result::Result<Done, String> {
        self.restic
            .prepare(&self.repo, self.deadline)
            .await
            .map_err(|error| error.to_string())?;
        let outcome = self.work().await;
        if outcome.is_err() {
            // A lock, a repository moved or re-created: the next unit looks again.
            self.restic.forget_prepared(&self.repo);
        }
        outcome
    }

    async fn work(&self) -> std::result::Result<Done, String> {
        match (self.what, self.mode) {
            (DataWhat::Backup, BackupMode::Exec) => self.backup_exec().await,
            (DataWhat::Backup, _) => self.backup_claims().await,
            (DataWhat::Restore, BackupMode::Exec) => self.restore_exec().await,
            (DataWhat::Restore, _) => self.restore_claims().await,
            (DataWhat::Verify, _) => self.verify().await,
        }
    }

    async fn path(&self, volume: &str) -> std::result::Result<Option<PathBuf>, String> {
        self.runtime
            .volume_path(volume)
            .await
            .map_err(|error| format!("volume {volume}: {error}"))
    }

    async fn backup_claims(&self) -> std::result::Result<Done, String> {
        let mut done = Done {
            snapshots: BTreeMap::new(),
            bytes: 0,
        };
        for volume in &self.volumes {
            // A pod never created has no volume yet, and an empty claim holds nothing
            // (restic refuses an empty snapshot): nothing to keep.
            let Some(path) = self.path(volume).await? else {
                continue;
            };
            let listed = path.clone();
            let empty = tokio::task::spawn_blocking(move || {
                std::fs::read_dir(listed).map(|mut entries| entries.next().is_none())
            })
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| format!("volume {volume} at {}: {error}", path.display()))?;
            if empty {
                continue;
            }
            let summary = self
                .restic
                .backup_dir(
                    &self.repo,
                    &path,
                    &tags(&self.key, volume),
                    &self.host,
                    self.deadline,
                )
                .await
                .map_err(|error| format!("backing up {volume}: {error}"))?;
            done.bytes = done.bytes.saturating_add(summary.bytes);
            done.snapshots.insert(volume.clone(), summary.snapshot_id);
        }
        Ok(done)
    }

    async fn backup_exec(&self) -> std::result::Result<Done, String> {
        let pod = self.pod.clone().ok_or("the pod is gone")?;
        let (writer, reader) = tokio::io::duplex(PIPE_BYTES);
        let (verdict, gate) = tokio::sync::oneshot::channel();
        let dump_tags = tags(&self.key, &self.dump);
        let dump = self.restic.backup_stdin(
            &self.repo,
            &self.dump,
            &dump_tags,
            &self.host,
            GatedEof {
                inner: reader,
                verdict: gate,
                passed: false,
            },
            self.deadline,
        );
        let exec = async {
            let outcome = self
                .runtime
                .exec_piped(&pod, &self.command, None, Some(Box::new(writer)))
                .await;
            // restic sees the end of the stream only once the command ended well.
            let _ = verdict.send(matches!(&outcome, Ok(outcome) if outcome.exit_code == 0));
            outcome
        };
        let (stored, ran) = tokio::join!(dump, exec);
        let ran = ran.map_err(|error| format!("running the backup command: {error}"))?;
        if ran.exit_code != 0 {
            return Err(format!(
                "the backup command exited with {}: {}",
                ran.exit_code,
                crate::model::text::cut(ran.output.trim(), 512)
            ));
        }
        let summary = stored.map_err(|error| format!("storing the dump: {error}"))?;
        Ok(Done {
            snapshots: BTreeMap::from([(self.dump.clone(), summary.snapshot_id)]),
            bytes: summary.bytes,
        })
    }

    async fn restore_claims(&self) -> std::result::Result<Done, String> {
        let mut bytes = 0u64;
        for volume in &self.volumes {
            let Some(snapshot) = self.snapshots.get(volume) else {
                continue;
            };
            let Some(path) = self.path(volume).await? else {
                return Err(format!("volume {volume} is not on this host"));
            };
            let staging = path.with_file_name(format!("_data.voodu-restore-{}", self.run));
            let fresh = staging.clone();
            tokio::task::spawn_blocking(move || {
                let _ = std::fs::remove_dir_all(&fresh);
                std::fs::create_dir_all(&fresh)
            })
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| format!("{}: {error}", staging.display()))?;
            self.restic
                .restore(&self.repo, snapshot, &staging, self.deadline)
                .await
                .map_err(|error| format!("restoring {volume}: {error}"))?;
            let (live, kept) = (path.clone(), aside(&path, self.run));
            bytes += tokio::task::spawn_blocking(move || swap_in(&live, &staging, &kept))
                .await
                .map_err(|error| error.to_string())?
                .map_err(|error| format!("putting {volume} back: {error}"))?;
        }
        Ok(Done {
            snapshots: BTreeMap::new(),
            bytes,
        })
    }

    /// `restic check`, then every snapshot of the last good backup restored into a scratch
    /// directory (a dump through `restic dump`): what comes back must be as many bytes as the
    /// backup read.
    async fn verify(&self) -> std::result::Result<Done, String> {
        self.restic
            .check(&self.repo, self.deadline)
            .await
            .map_err(|error| format!("restic check: {error}"))?;
        // Every snapshot of the backup is still in the repository (retention keeps the
        // newest, which is the one a verify restores).
        let held = self
            .restic
            .snapshots(
                &self.repo,
                &[format!("voodu.resource={}", self.key)],
                self.deadline,
            )
            .await
            .map_err(|error| format!("listing the snapshots: {error}"))?;
        if let Some((holds, missing)) = self.snapshots.iter().find(|(_, id)| {
            !held
                .iter()
                .any(|snapshot| snapshot.id.starts_with(id.as_str()))
        }) {
            return Err(format!(
                "snapshot {missing} of {holds} is not in the repository any more"
            ));
        }
        let scratch = self.scratch.join(self.run.to_string());
        let mut bytes = 0u64;
        let result = async {
            for (holds, snapshot) in &self.snapshots {
                let target = scratch.join(holds);
                let made = target.clone();
                tokio::task::spawn_blocking(move || std::fs::create_dir_all(made))
                    .await
                    .map_err(|error| error.to_string())?
                    .map_err(|error| format!("{}: {error}", target.display()))?;
                self.restic
                    .restore(&self.repo, snapshot, &target, self.deadline)
                    .await
                    .map_err(|error| format!("restoring {holds} ({snapshot}): {error}"))?;
                let counted = target.clone();
                bytes += tokio::task::spawn_blocking(move || tree_bytes(&counted))
                    .await
                    .map_err(|error| error.to_string())?;
            }
            Ok::<(), String>(())
        }
        .await;
        let gone = scratch.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(gone)).await;
        result?;
        if bytes != self.expected_bytes {
            return Err(format!(
                "the snapshots restored {bytes} bytes where the backup read {}",
                self.expected_bytes
            ));
        }
        Ok(Done {
            snapshots: BTreeMap::new(),
            bytes,
        })
    }

    async fn restore_exec(&self) -> std::result::Result<Done, String> {
        let pod = self.pod.clone().ok_or("the pod is gone")?;
        let snapshot = self
            .snapshots
            .get(&self.dump)
            .ok_or_else(|| format!("no snapshot of {} to restore", self.dump))?;
        let (writer, reader) = tokio::io::duplex(PIPE_BYTES);
        let dump = self
            .restic
            .dump(&self.repo, snapshot, &self.dump, writer, self.deadline);
        let exec =
            self.runtime
                .exec_piped(&pod, &self.restore_command, Some(Box::new(reader)), None);
        let (dumped, ran) = tokio::join!(dump, exec);
        dumped.map_err(|error| format!("reading the dump: {error}"))?;
        let ran = ran.map_err(|error| format!("running the restore command: {error}"))?;
        if ran.exit_code != 0 {
            return Err(format!(
                "the restore command exited with {}: {}",
                ran.exit_code,
                crate::model::text::cut(ran.output.trim(), 512)
            ));
        }
        Ok(Done {
            snapshots: BTreeMap::new(),
            bytes: 0,
        })
    }
}

/// Puts the restored tree `staging` in place of the volume's `live` directory, keeping the
/// old one as `kept`; the new root takes the old root's owner and mode (a database's data
/// directory must keep them). Returns the bytes restored.
fn swap_in(live: &Path, staging: &Path, kept: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let meta = std::fs::metadata(live)?;
    std::os::unix::fs::chown(staging, Some(meta.uid()), Some(meta.gid()))?;
    std::fs::set_permissions(
        staging,
        std::fs::Permissions::from_mode(meta.mode() & 0o7777),
    )?;
    if kept.exists() {
        std::fs::remove_dir_all(kept)?;
    }
    std::fs::rename(live, kept)?;
    std::fs::rename(staging, live)?;
    Ok(tree_bytes(live))
}

fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => tree_bytes(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |meta| meta.len()),
            _ => 0,
        })
        .sum()
}

/// A reader whose end is held until `verdict` says the stream is whole: a `false` (or a
/// dropped sender) turns the end into an error, so the reader's consumer (restic) is cut
/// before it can record what it read.
struct GatedEof<T> {
    inner: T,
    verdict: tokio::sync::oneshot::Receiver<bool>,
    passed: bool,
}

impl<T: AsyncRead + Unpin> AsyncRead for GatedEof<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() == before && !self.passed => {
                match Pin::new(&mut self.verdict).poll(cx) {
                    Poll::Ready(Ok(true)) => {
                        self.passed = true;
                        Poll::Ready(Ok(()))
                    }
                    Poll::Ready(_) => Poll::Ready(Err(std::io::Error::other(
                        "the backup command failed: its output is not a backup",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            other => other,
        }
    }
}
