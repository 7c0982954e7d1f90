//! The backup schedules: asks for a statefulset's scheduled backups and verifies when they
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

use crate::manifest::spec::Spec;
use crate::model::{Kind, ResourceKey};
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
    for desired in store.desired_of_kind(Kind::Statefulset)? {
        let Spec::Statefulset(spec) = &desired.spec else {
            continue;
        };
        let Some(backup) = spec.backup.as_ref() else {
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
