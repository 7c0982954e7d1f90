//! `run` wiring: open the store, connect the runtime, and run the sync loop and the
//! reconciler until shutdown.
//!
//! Invariant: every task is spawned on this module's `TaskTracker` and stops on its
//! `CancellationToken`; `run` returns only after all of them finished.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::git::{Source, SourceOptions};
use crate::reconcile::{self, Ctx, ReconcileOptions};
use crate::runtime::{DockerRuntime, Runtime};
use crate::store::Store;
use crate::sync::{SyncOptions, SyncOutcome, Syncer};

/// Everything `run` needs, validated.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub source: SourceOptions,
    pub data_dir: PathBuf,
    /// Time between polls of the remote.
    pub interval: Duration,
    pub sync: SyncOptions,
    pub reconcile: ReconcileOptions,
}

impl AgentConfig {
    pub fn state_db(&self) -> PathBuf {
        self.data_dir.join("state.db")
    }
}

/// Runs the agent against the local Docker engine until `shutdown` fires.
pub async fn run(config: AgentConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let runtime = DockerRuntime::connect()
        .await
        .context("cannot reach the Docker engine (is dockerd running, and may this user use /var/run/docker.sock?)")?;
    run_with_runtime(config, Arc::new(runtime), shutdown).await
}

/// Runs the agent with any runtime (tests pass the fake).
pub async fn run_with_runtime<R: Runtime>(
    config: AgentConfig,
    runtime: Arc<R>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let db = config.state_db();
    let store = Arc::new(tokio::task::spawn_blocking(move || Store::open(&db)).await??);
    let agent_id = store.agent_id()?;
    let source = Source::new(config.source.clone(), &config.data_dir);
    tracing::info!(
        repo = source.url(),
        branch = source.branch(),
        data_dir = %config.data_dir.display(),
        agent_id,
        "voodu-agent starting"
    );
    let syncer = Arc::new(Syncer::new(source, store.clone(), config.sync.clone())?);
    let ctx = Arc::new(Ctx {
        store,
        runtime,
        agent_id,
        assets_root: crate::assets::assets_root(&config.data_dir),
        options: config.reconcile.clone(),
    });

    let tracker = TaskTracker::new();
    let reconciler = tracker.spawn(reconcile::run(ctx, shutdown.clone()));
    tracker.spawn(sync_loop(syncer, config.interval, shutdown.clone()));
    tracker.close();
    tokio::select! {
        () = shutdown.cancelled() => {}
        finished = reconciler => {
            // The reconciler only ends early on a store failure: stop everything.
            shutdown.cancel();
            finished.context("reconciler task")?.context("reconciler stopped")?;
        }
    }
    tracing::info!("shutting down: letting in-flight work finish");
    tracker.wait().await;
    Ok(())
}

/// Polls the remote every `interval` (and once at start) until shutdown.
async fn sync_loop(syncer: Arc<Syncer>, interval: Duration, shutdown: CancellationToken) {
    let interrupt = Arc::new(AtomicBool::new(false));
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let syncer_for_task = syncer.clone();
        let interrupt_for_task = interrupt.clone();
        let task =
            tokio::task::spawn_blocking(move || syncer_for_task.sync_once(&interrupt_for_task));
        let outcome = tokio::select! {
            outcome = task => outcome,
            () = shutdown.cancelled() => {
                interrupt.store(true, Ordering::Relaxed);
                return;
            }
        };
        match outcome {
            Ok(Ok(SyncOutcome::Unchanged(commit))) => {
                tracing::debug!(commit = commit.short(), "repo unchanged")
            }
            Ok(Ok(SyncOutcome::Applied {
                commit,
                summary,
                warnings,
            })) => {
                for warning in &warnings {
                    tracing::warn!(commit = commit.short(), "{warning}");
                }
                tracing::info!(
                    commit = commit.short(),
                    changed = summary.puts.len(),
                    deleted = summary.deletes.len(),
                    "commit applied"
                );
            }
            Ok(Ok(SyncOutcome::Rejected {
                commit,
                diagnostics,
            })) => tracing::error!(
                commit = commit.short(),
                "commit rejected; the host keeps running the last good commit:\n{diagnostics}"
            ),
            Ok(Err(error)) => {
                tracing::warn!(%error, "sync failed; next try in {}", humantime::format_duration(interval))
            }
            Err(join_error) => tracing::error!(%join_error, "sync task failed"),
        }
    }
}
