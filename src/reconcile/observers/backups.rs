//! The backup schedules: asks for a statefulset's (or a deployment's) scheduled backups and verifies when they
//! come round, and queues the key (its handler runs them, `handlers/data.rs`).
//!
//! A backup is due when its `schedule` has a minute after the last scheduled backup was asked
//! for (or after the agent started, for a resource that never had one): a fire time missed
//! while the agent was down is run once at the next look, never once per missed minute. A
//! verify is due `verify` after the last one was asked for, once a backup succeeded. The
//! schedules are looked at every [`LOOK`], on the reconciler's one timer; between those looks,
//! every [`PENDING_LOOK`], one query finds the runs a command (another process: `backup`,
//! `restore`, `rollback --with-data`) asked for, and queues their keys.
//!
//! Invariants: this task only writes requests and queues keys; it never touches a container
//! or a repository; a key with an open run gets no second request (its handler works on the
//! oldest open run first).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::model::ResourceKey;
use crate::reconcile::context::{Ctx, blocking};
use crate::reconcile::handlers::data;
use crate::reconcile::run::timer::What;
use crate::runtime::Runtime;
use crate::store::{DataReason, DataWhat, NewDataRun, Store, now_unix};

/// How often the schedules are looked at (a schedule's unit is the minute).
pub(crate) const LOOK: Duration = Duration::from_secs(10);
/// How often runs a command asked for (another process, `backup`, `restore`) are looked for:
/// one indexed query.
pub(crate) const PENDING_LOOK: Duration = Duration::from_secs(1);

/// The scheduler task: looks for asked-for runs every [`PENDING_LOOK`] and at the schedules
/// every [`LOOK`], until `shutdown`.
pub(crate) async fn run<R: Runtime>(ctx: Arc<Ctx<R>>, shutdown: CancellationToken) {
    let started = now_unix();
    let mut ticks = ctx.timer.every(What::Cron, PENDING_LOOK, PENDING_LOOK);
    let mut last_look: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = ticks.tick() => {}
        }
        let now = tokio::time::Instant::now();
        let schedules = last_look.is_none_or(|at| now.duration_since(at) >= LOOK);
        if schedules {
            last_look = Some(now);
        }
        let looked = blocking(&ctx.store, move |store| {
            if schedules {
                ask(store, started, now_unix())
            } else {
                store.pending_data_runs()
            }
        })
        .await;
        match looked {
            Ok(keys) => {
                for key in keys {
                    ctx.timer.requeue(key);
                }
            }
            Err(error) => tracing::warn!(%error, "cannot look at the backup schedules"),
        }
    }
}

/// Asks for every backup and verify due at `now`; the keys to queue.
pub(crate) fn ask(store: &Store, started: i64, now: i64) -> crate::store::Result<Vec<ResourceKey>> {
    let mut asked = Vec::new();
    for desired in &store.desired_with_backup()? {
        let Some(backup) = desired.spec.backup() else {
            continue;
        };
        let key = &desired.key;
        if let Some(open) = store.open_data_run(key)? {
            // Asked for by a command (another process): its pass starts it.
            if open.state == crate::store::DataState::Pending {
                asked.push(key.clone());
            }
            continue;
        }
        let last = store.last_data_run(key, DataWhat::Backup, Some(DataReason::Schedule))?;
        let after = last.map_or(started, |run| run.requested_at);
        let mut run = None;
        if data::due(backup, after, now) {
            run = Some(NewDataRun {
                what: DataWhat::Backup,
                reason: DataReason::Schedule,
                release_id: None,
                only_ordinal: None,
                snapshots: std::collections::BTreeMap::new(),
            });
        } else if let Some(every) = backup.verify_every()
            && let Some(good) = store.last_good_backup(key)?
        {
            let last = store.last_data_run(key, DataWhat::Verify, None)?;
            let every = i64::try_from(every.as_secs()).unwrap_or(i64::MAX);
            let due = last.is_none_or(|last| now - last.requested_at >= every);
            if due && !good.snapshots.is_empty() {
                run = Some(NewDataRun {
                    what: DataWhat::Verify,
                    reason: DataReason::Schedule,
                    release_id: None,
                    only_ordinal: None,
                    snapshots: good.snapshots,
                });
            }
        }
        if let Some(run) = run {
            store.request_data_run(key, &run)?;
            asked.push(key.clone());
        }
    }
    Ok(asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest;
    use crate::model::{CommitSha, Kind, Snapshot, SourceFile};
    use crate::store::DataState;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    const DB: &str = r#"
statefulset "s" "db" {
  image = "busybox"
  volume_claim "data" {
    mount_path = "/data"
  }
  backup {
    repository    = "/srv/backups/db"
    password_file = "/srv/backups/pass"
    schedule      = "0 3 * * *"
    verify        = "daily"
  }
}
"#;

    fn store_with_db() -> Result<(tempfile::TempDir, Store), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(&dir.path().join("state.db"))?;
        let commit = CommitSha::new(format!("{:040x}", 1));
        let snapshot = Snapshot {
            commit: commit.clone(),
            files: vec![SourceFile {
                path: "db.hcl".to_owned(),
                contents: DB.as_bytes().to_vec(),
            }],
            refused: Vec::new(),
        };
        let loaded = manifest::load(&snapshot, &manifest::LoadOptions::standalone())?;
        store.apply_commit(&commit, &loaded)?;
        Ok((dir, store))
    }

    /// 2026-11-29 at `hour:minute` UTC, Unix seconds.
    fn at(hour: i64, minute: i64) -> i64 {
        1_795_910_400 + hour * 3600 + minute * 60
    }

    #[test]
    fn a_schedule_asks_once_per_fire_time_and_a_verify_follows_a_good_backup() -> TestResult {
        let (_dir, store) = store_with_db()?;
        let key = ResourceKey::new(Kind::Statefulset, "s", "db");
        // Started at 02:00: nothing due before 03:00.
        assert!(ask(&store, at(2, 0), at(2, 59))?.is_empty());
        assert_eq!(ask(&store, at(2, 0), at(3, 0))?, std::slice::from_ref(&key));
        let run = store.open_data_run(&key)?.ok_or("a backup was asked for")?;
        assert_eq!(
            (run.what, run.reason),
            (DataWhat::Backup, DataReason::Schedule)
        );
        // While it is open: no second request, the key is queued again (it is pending).
        assert_eq!(ask(&store, at(2, 0), at(3, 1))?, std::slice::from_ref(&key));
        assert_eq!(store.data_runs(&key, 10)?.len(), 1);
        let snapshots = std::collections::BTreeMap::from([(
            "voodu-s-db-data-0".to_owned(),
            "abcd1234".to_owned(),
        )]);
        store.advance_data_run(run.id, 1, "done", &snapshots, 10)?;
        store.finish_data_run(run.id, DataState::Succeeded, "ok")?;
        // The backup succeeded: a verify of it is due (none was ever run), of its snapshots.
        assert_eq!(ask(&store, at(2, 0), at(3, 2))?, std::slice::from_ref(&key));
        let verify = store.open_data_run(&key)?.ok_or("a verify was asked for")?;
        assert_eq!(
            (verify.what, verify.snapshots),
            (DataWhat::Verify, snapshots)
        );
        store.finish_data_run(verify.id, DataState::Succeeded, "ok")?;
        // Nothing more today: the next backup is at 03:00 tomorrow, the next verify a day on.
        assert!(ask(&store, at(2, 0), at(23, 59))?.is_empty());
        assert_eq!(store.data_runs(&key, 10)?.len(), 2);
        Ok(())
    }
}
