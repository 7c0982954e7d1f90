//! `Harness`: a store in a temp dir, the fake runtime and an in-process reconciler with paused
//! time, for the fast reconcile tests (`reconcile`, `health`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use voodu_agent::manifest;
use voodu_agent::model::{CommitSha, ResourceKey, Snapshot, SourceFile};
use voodu_agent::reconcile::{self, ReconcileOptions};
use voodu_agent::runtime::{Container, ContainerState, FakeRuntime, labels};
use voodu_agent::store::Store;

use super::TestResult;

/// How often waits re-read the store, in virtual time.
/// Every poll costs real time (store reads) while paused time stands still, and the timers
/// the tests measure are whole seconds: 100 ms keeps a minute of virtual time at 600 polls.
pub const POLL: Duration = Duration::from_millis(100);

/// A store in a temp dir, a fake runtime, and a reconciler task that can be restarted.
pub struct Harness {
    pub _dir: tempfile::TempDir,
    pub store: Arc<Store>,
    pub fake: Arc<FakeRuntime>,
    pub options: ReconcileOptions,
    pub metrics: Arc<voodu_agent::metrics::Metrics>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    task: Option<tokio::task::JoinHandle<reconcile::Result<()>>>,
    commits: usize,
}

impl Harness {
    pub fn new() -> TestResult<Harness> {
        Harness::with_fake(FakeRuntime::new())
    }

    /// A harness around a prepared fake (known images, a registry).
    pub fn with_fake(fake: FakeRuntime) -> TestResult<Harness> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(Store::open(&dir.path().join("state.db"))?);
        Ok(Harness {
            _dir: dir,
            store,
            fake: Arc::new(fake),
            options: ReconcileOptions::default(),
            metrics: Arc::new(voodu_agent::metrics::Metrics::new()),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            task: None,
            commits: 0,
        })
    }

    pub fn start(&mut self) -> TestResult {
        self.shutdown = CancellationToken::new();
        self.tracker = TaskTracker::new();
        let deps = reconcile::Deps {
            store: self.store.clone(),
            runtime: self.fake.clone(),
            metrics: self.metrics.clone(),
            assets_root: self._dir.path().join("assets"),
            tracker: self.tracker.clone(),
            handles: reconcile::Handles::default(),
        };
        self.task = Some(tokio::spawn(reconcile::run(
            deps,
            self.options.clone(),
            self.shutdown.clone(),
        )));
        Ok(())
    }

    pub async fn stop(&mut self) -> TestResult {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await??;
        }
        self.tracker.close();
        self.tracker.wait().await;
        Ok(())
    }

    /// Whether the reconciler task is still running (it only ends at shutdown).
    pub fn reconciler_running(&self) -> bool {
        self.task.as_ref().is_some_and(|task| !task.is_finished())
    }

    /// Applies a commit made of these files, as the sync stage would.
    pub fn push(&mut self, files: &[(&str, &str)]) -> TestResult<CommitSha> {
        self.commits += 1;
        apply_files(&self.store, self.commits, files)
    }

    /// Waits until a container changes state or `POLL` of virtual time passes, whichever is
    /// first; `changed` must come from `self.fake.changed()` taken before the caller looked.
    /// For sampling only: right after a change the handler that made it may not have written
    /// its status yet, so waits for a converged state sleep `POLL` instead (by then every
    /// task that could run has run).
    pub async fn next_look(changed: tokio::sync::futures::Notified<'_>) {
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(POLL) => {}
        }
    }

    /// Lets `span` of virtual time pass before an absence is checked ("not retried", "no tick
    /// fires"). Not a hopeful sleep: paused time moves only when every task waits, so each
    /// timer due within `span` (retries, resyncs, probes, cron ticks) fires, and the work it
    /// starts runs, before this returns.
    pub async fn idle_for(&self, span: Duration) {
        tokio::time::sleep(span).await;
    }

    pub async fn containers(&self, key: &ResourceKey) -> TestResult<Vec<Container>> {
        use voodu_agent::runtime::Containers;
        Ok(self
            .fake
            .list(&[
                (labels::SCOPE, key.scope.as_str()),
                (labels::NAME, key.name.as_str()),
            ])
            .await?)
    }

    /// Waits (real-time bound: paused virtual time runs ahead while blocking store calls run)
    /// until `key` has exactly `n` running containers with the desired hash and status Ready.
    pub async fn converged(&self, key: &ResourceKey, n: usize) -> TestResult<Vec<Container>> {
        let start = Instant::now();
        loop {
            let desired = self.store.desired(key)?;
            let containers = self.containers(key).await?;
            let ready = self
                .store
                .status(key)?
                .is_some_and(|status| status.phase == "Ready");
            if let Some(desired) = desired {
                let all_current = containers.iter().all(|container| {
                    container.state == ContainerState::Running
                        && container.label(labels::MANIFEST_HASH)
                            == Some(desired.spec_hash.as_str())
                });
                if ready && all_current && containers.len() == n {
                    return Ok(containers);
                }
            } else if n == 0 && containers.is_empty() && self.store.status(key)?.is_none() {
                return Ok(containers);
            }
            if start.elapsed() > Duration::from_secs(20) {
                return Err(format!(
                    "{key} did not converge on {n} replicas: {containers:?}, status {:?}",
                    self.store.status(key)?
                )
                .into());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the status of `key` satisfies `check`.
    pub async fn status_where(
        &self,
        key: &ResourceKey,
        check: impl Fn(&voodu_agent::store::ResourceStatus) -> bool,
    ) -> TestResult<voodu_agent::store::ResourceStatus> {
        status_where(&self.store, key, "a matching status", check).await
    }

    /// `create`/`remove` calls (names resolved) made since call number `from`.
    pub fn churn_since(&self, from: usize) -> Vec<String> {
        self.fake
            .calls()
            .into_iter()
            .skip(from)
            .filter(|call| call.starts_with("create ") || call.starts_with("remove "))
            .map(|call| call.split(' ').next().unwrap_or_default().to_owned())
            .collect()
    }
}

/// Waits (every `POLL`, real-time bound) until the status of `key` in `store` satisfies
/// `check` (`what` names it in the error); the harness's and the ingress tests' one way to
/// wait for a status.
pub async fn status_where(
    store: &Store,
    key: &ResourceKey,
    what: &str,
    check: impl Fn(&voodu_agent::store::ResourceStatus) -> bool,
) -> TestResult<voodu_agent::store::ResourceStatus> {
    let what = format!("{what} ({key})");
    super::until(Duration::from_secs(60), POLL, &what, || {
        Ok(store.status(key)?.filter(|status| check(status)))
    })
    .await
    .map_err(|error| match store.status(key) {
        Ok(status) => format!("{error}; status {status:?}").into(),
        Err(_) => error,
    })
}

/// Applies commit number `n` made of `files` to `store`, as the sync stage would.
pub fn apply_files(store: &Store, n: usize, files: &[(&str, &str)]) -> TestResult<CommitSha> {
    let commit = CommitSha::new(format!("{n:040x}"));
    let snapshot = Snapshot {
        commit: commit.clone(),
        files: files
            .iter()
            .map(|(path, text)| SourceFile {
                path: (*path).to_owned(),
                contents: text.as_bytes().to_vec(),
            })
            .collect(),
        refused: Vec::new(),
    };
    let manifest = manifest::load(&snapshot, &manifest::LoadOptions::standalone())?;
    store.apply_commit(&commit, &manifest)?;
    Ok(commit)
}
