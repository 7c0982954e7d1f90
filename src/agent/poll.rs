//! Polling the sources. A repository on this host is polled in a sweep: every such source
//! polled at the same interval is checked in one blocking job per tick, and only those the
//! check cannot answer (a moved ref, new buckets, an approval, a due hold, a first poll) are
//! asked for a sync. A remote's poll is a ref listing over the network, so each remote keeps
//! its own ticker (`trigger::poll`), phased across the interval, and every tick asks for a
//! sync.
//!
//! Why a sweep: an unchanged local poll is two ref files and three prepared store reads, a few
//! tens of microseconds; handing it to a blocking thread and back, once per source, cost more
//! than the reads (an async worker woken by its timer, a pool thread woken, the worker woken
//! again). A sweep pays those wake-ups once for all of its sources.
//!
//! Invariants: a source the sweep answers is one whose sync would have ended `Unchanged` after
//! the same reads (`Syncer::poll_without_fetch`), and it is counted as such a sync in
//! `voodu_syncs_total`; anything else gets the sync request a per-source poll would have made.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::git::trigger::{self, SyncReason, SyncRequest, SyncRequests};
use crate::metrics::Metrics;
use crate::sync::Syncer;

/// One source to poll: its syncer, its sync requests, and whether it is a repository on this
/// host (swept) or a remote (its own ticker).
pub(super) struct Polled {
    pub(super) syncer: Arc<Syncer>,
    pub(super) requests: SyncRequests,
    pub(super) interval: Duration,
    pub(super) local: bool,
}

/// Starts the polls of `sources` on `tracker`: one sweep per interval over the local ones, one
/// phased ticker per remote.
pub(super) fn spawn(
    sources: Vec<Polled>,
    metrics: &Arc<Metrics>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) {
    let mut sweeps: BTreeMap<Duration, Vec<Swept>> = BTreeMap::new();
    let (local, remote): (Vec<Polled>, Vec<Polled>) =
        sources.into_iter().partition(|polled| polled.local);
    for polled in local {
        sweeps.entry(polled.interval).or_default().push(Swept {
            syncer: polled.syncer,
            requests: polled.requests,
        });
    }
    for (interval, members) in sweeps {
        tracker.spawn(sweep_every(
            members,
            interval,
            metrics.clone(),
            shutdown.clone(),
        ));
    }
    let count = remote.len();
    for (index, polled) in remote.into_iter().enumerate() {
        let phase = trigger::poll_phase(polled.interval, index, count);
        tracker.spawn(trigger::poll(
            polled.requests,
            (polled.interval, phase),
            shutdown.clone(),
        ));
    }
}

/// A source of a sweep.
struct Swept {
    syncer: Arc<Syncer>,
    requests: SyncRequests,
}

/// Sweeps `members` at once and then every `interval`, until shutdown.
async fn sweep_every(
    members: Vec<Swept>,
    interval: Duration,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let members = Arc::new(members);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let swept = members.clone();
        // A panic in the job (none is known) leaves every source to its sync.
        let answers = crate::pool::run_as_task(move || sweep(&swept))
            .await
            .unwrap_or_default();
        let mut asked = 0_usize;
        for (index, member) in members.iter().enumerate() {
            match answers.get(index).copied().flatten() {
                Some(elapsed) => metrics.record_sync("unchanged", elapsed),
                None => {
                    asked += 1;
                    member.requests.request(SyncRequest {
                        reason: SyncReason::Poll,
                        commit: None,
                        actor: None,
                    });
                }
            }
        }
        tracing::debug!(
            sources = members.len(),
            asked,
            "poll sweep: the others are unchanged"
        );
    }
}

/// Checks every member without a fetch (`Syncer::poll_without_fetch`): for each, how long
/// its check took when it found nothing new, `None` when it needs a sync. Blocking.
fn sweep(members: &[Swept]) -> Vec<Option<Duration>> {
    // What another process wrote to the journal (a rollback by the CLI) is looked for once:
    // every source's store handle shares the one database, as the sync loop's check before
    // each sync does.
    if let Some(first) = members.first()
        && let Err(error) = first.syncer.store().notice_external_writes()
    {
        tracing::warn!(%error, "cannot check the journal for rollbacks");
    }
    members
        .iter()
        .map(|member| {
            let started = Instant::now();
            match member.syncer.poll_without_fetch() {
                Ok(Some(_)) => Some(started.elapsed()),
                Ok(None) => None,
                // The sync asked for instead meets the error again and reports it.
                Err(error) => {
                    tracing::debug!(%error, "poll sweep: cannot check the source; a sync will");
                    None
                }
            }
        })
        .collect()
}
