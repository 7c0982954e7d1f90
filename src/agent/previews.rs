//! Branch previews of one source (`model::previews`): each poll lists the remote's branches
//! matching `branches` (one ref listing, no pack: an unchanged poll costs that and one store
//! read), decides (`model::previews::decide`, pure) and acts. A preview is the internal source
//! `<source>#<slug>`: its own mirror of its branch, its own `Syncer` (its own store handle,
//! seal and mapping of scopes and hosts), so it is fetched, checked, applied and reconciled as
//! every source is. Removing it applies an empty desired state to that source (its
//! containers, routes and asset files go as any removed resource's), then, once its
//! containers are gone, removes its volumes (a preview owns its data), its own network
//! (`scopes::preview_network`, which its containers joined in place of the base's) and its
//! mirror. Its syncer judges its commits by the agent's policy narrowed by the previews'
//! (`Policy::narrowed`) and their caps.
//!
//! Invariants: a preview's source owns only its mapped scopes (`Ownership::allows`), so its
//! commit can reach nothing of the base scope; a removal is retried on the next poll until
//! everything is gone, and the preview's row is forgotten (branch deleted) or kept as
//! `expired` (ttl) only then.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::git::{Source, SourceOptions};
use crate::model::HostSelection;
use crate::model::previews::{self, Known, PreviewRules, State, Step};
use crate::model::scopes::{Ownership, Seal};
use crate::runtime::{Runtime, labels};
use crate::store::{PreviewRow, Store, Who};
use crate::sync::{SyncOptions, SyncOutcome, Syncer};

/// The bucket of a scope a new preview's buckets are made of, in place of the scope's own.
const PREVIEW_BUCKET: &str = "preview";

/// How long a removal waits for the preview's containers to go before the next poll tries
/// again.
const REMOVAL_WAIT: Duration = Duration::from_secs(60);

/// The previews of one source.
pub(crate) struct Previews<R> {
    pub(crate) name: String,
    pub(crate) rules: PreviewRules,
    pub(crate) options: SourceOptions,
    pub(crate) hosts: HostSelection,
    /// `<data-dir>/sources/NAME` (or the data dir): previews' mirrors live under `previews/`.
    pub(crate) dir: PathBuf,
    pub(crate) interval: Duration,
    pub(crate) store: Arc<Store>,
    /// The base source's sync options: each preview's are these with its seal and mapping.
    pub(crate) sync: SyncOptions,
    pub(crate) ownership: Arc<Ownership>,
    pub(crate) runtime: Arc<R>,
    /// Woken by a webhook push to a previewed branch: the next poll starts at once.
    pub(crate) wake: Arc<tokio::sync::Notify>,
}

impl<R: Runtime> Previews<R> {
    /// Polls every `interval` until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let this = Arc::new(self);
        let syncers: Arc<std::sync::Mutex<BTreeMap<String, Arc<Syncer>>>> = Arc::default();
        let lister = Arc::new(
            Source::new(this.options.clone(), &this.dir.join("previews"))
                .selecting(this.hosts.clone()),
        );
        tracing::info!(source = %this.name, branches = %this.rules.branches, "branch previews on");
        // Set on shutdown: the poll in flight stops at its fetch's next safe point.
        let interrupt = Arc::new(AtomicBool::new(false));
        loop {
            let mut blocking = {
                let this = Arc::clone(&this);
                let syncers = Arc::clone(&syncers);
                let lister = Arc::clone(&lister);
                let interrupt = Arc::clone(&interrupt);
                tokio::task::spawn_blocking(move || this.poll(&lister, &syncers, &interrupt))
            };
            let finished = tokio::select! {
                finished = &mut blocking => finished,
                () = shutdown.cancelled() => {
                    interrupt.store(true, std::sync::atomic::Ordering::Relaxed);
                    blocking.await
                }
            };
            if shutdown.is_cancelled() {
                return;
            }
            match finished {
                Ok(Ok(removals)) => {
                    for (slug, expired) in removals {
                        if let Err(error) = this.finish_removal(&slug, expired, &shutdown).await {
                            tracing::warn!(source = %this.name, %slug, %error, "preview not removed yet; next poll tries again");
                        }
                    }
                }
                Ok(Err(error)) => {
                    tracing::warn!(source = %this.name, error = %format!("{error:#}"), "previews: poll failed")
                }
                Err(error) => tracing::error!(%error, "previews: poll task failed"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(this.interval) => {}
                () = this.wake.notified() => {
                    tracing::debug!(source = %this.name, "previews: polled now (a webhook push)");
                }
            }
        }
    }

    /// One poll: list, decide, apply and refuse; returns the previews whose desired state was
    /// emptied, to remove the rest of (with whether the ttl removed them).
    fn poll(
        &self,
        lister: &Source,
        syncers: &std::sync::Mutex<BTreeMap<String, Arc<Syncer>>>,
        interrupt: &AtomicBool,
    ) -> anyhow::Result<Vec<(String, bool)>> {
        let listed: Vec<(String, String)> = lister
            .list_branches(&self.rules.branches, interrupt)?
            .into_iter()
            .map(|(branch, commit)| (branch, commit.as_str().to_owned()))
            .collect();
        let rows = self.store.previews(Some(&self.name))?;
        let known: Vec<Known> = rows
            .iter()
            .map(|row| Known {
                slug: row.slug.clone(),
                branch: row.branch.clone(),
                commit: row.commit.clone(),
                created: row.created,
                pushed: row.pushed,
                state: State::parse(&row.state),
            })
            .collect();
        let now = crate::store::now_unix();
        let steps = previews::decide(&self.rules, &known, &listed, now);
        let mut removals = Vec::new();
        for step in steps {
            // One preview's failure (its fetch, its store write) does not hold up the others.
            match self.act(step, &rows, syncers, interrupt, now) {
                Ok(removed) => removals.extend(removed),
                Err(error) if interrupt.load(std::sync::atomic::Ordering::Relaxed) => {
                    return Err(error);
                }
                Err(error) => {
                    tracing::warn!(source = %self.name, error = %format!("{error:#}"), "preview: next poll tries again");
                }
            }
        }
        Ok(removals)
    }

    /// Takes one step of a poll's decision; the preview removed, with whether its ttl ran
    /// out, when the step removed one.
    fn act(
        &self,
        step: Step,
        rows: &[PreviewRow],
        syncers: &std::sync::Mutex<BTreeMap<String, Arc<Syncer>>>,
        interrupt: &AtomicBool,
        now: i64,
    ) -> anyhow::Result<Option<(String, bool)>> {
        let row_of = |slug: &str| rows.iter().find(|row| row.slug == slug);
        match step {
            Step::Apply {
                slug,
                branch,
                commit,
            } => {
                if row_of(&slug).is_none_or(|row| row.state != "live") {
                    self.copy_buckets(&slug)?;
                }
                let syncer = self.syncer(syncers, &slug, &branch)?;
                let outcome =
                    syncer.sync_once_as(interrupt, &Who::new(crate::store::Origin::Poll, None))?;
                let message = match &outcome {
                    SyncOutcome::Rejected { diagnostics, .. } => {
                        tracing::error!(source = %self.name, %slug, "preview commit rejected:\n{diagnostics}");
                        format!("rejected: {diagnostics}")
                    }
                    _ => String::new(),
                };
                let before = row_of(&slug);
                let pushed = match before {
                    Some(row) if row.commit == commit && row.state == "live" => row.pushed,
                    _ => now,
                };
                self.record(
                    &slug,
                    (&branch, &commit),
                    (State::Live, message),
                    (before.map_or(now, |row| row.created), pushed),
                )?;
                tracing::info!(source = %self.name, %slug, %branch, commit = %&commit[..commit.len().min(12)], "preview applied");
                Ok(None)
            }
            Step::Refuse {
                slug,
                branch,
                commit,
                message,
            } => {
                tracing::warn!(source = %self.name, %slug, %branch, "{message}");
                self.record(
                    &slug,
                    (&branch, &commit),
                    (State::Refused, message),
                    (now, now),
                )?;
                Ok(None)
            }
            Step::Remove { slug, why, expired } => {
                let branch = row_of(&slug)
                    .map(|row| row.branch.clone())
                    .unwrap_or_default();
                let syncer = self.syncer(syncers, &slug, &branch)?;
                syncer.remove_all(&Who::new(crate::store::Origin::Poll, None))?;
                tracing::info!(source = %self.name, %slug, "removing the preview: {why}");
                crate::base::lock(syncers).remove(&slug);
                Ok(Some((slug, expired)))
            }
        }
    }

    /// The preview's internal source name.
    fn source_of(&self, slug: &str) -> String {
        previews::preview_source(&self.name, slug)
    }

    /// Gives a new preview its config buckets: per scope of the source, its bucket `preview`
    /// (into the preview scope's scope-level bucket) when it has one, else a copy of its
    /// buckets without the keys the agent generates (the preview generates its own). A bucket
    /// the preview has already is left as it is.
    fn copy_buckets(&self, slug: &str) -> anyhow::Result<()> {
        let buckets = self.store.buckets()?;
        let base_scopes: std::collections::BTreeSet<&String> = buckets
            .keys()
            .filter(|(scope, _)| self.ownership.allows(&self.name, scope))
            .map(|(scope, _)| scope)
            .collect();
        for scope in base_scopes {
            let Some(mapped) = self.rules.map_scope(scope, slug) else {
                continue;
            };
            let preview = buckets.get(&(scope.clone(), PREVIEW_BUCKET.to_owned()));
            let copies: Vec<(&str, BTreeMap<String, String>)> = match preview {
                Some(values) => vec![("", values.clone())],
                None => buckets
                    .iter()
                    .filter(|((of, _), _)| of == scope)
                    .map(|((_, name), values)| {
                        let kept = crate::model::map_of(
                            values
                                .iter()
                                .filter(|(key, _)| {
                                    !crate::manifest::GENERATED_KEYS.contains(&key.as_str())
                                })
                                .map(|(key, value)| (key.clone(), value.clone())),
                        );
                        (name.as_str(), kept)
                    })
                    .collect(),
            };
            for (name, values) in copies {
                if values.is_empty() || buckets.contains_key(&(mapped.clone(), name.to_owned())) {
                    continue;
                }
                self.store.config_set(&mapped, name, &values)?;
                tracing::info!(source = %self.name, %slug, bucket = %format!("{mapped}/{name}"), keys = values.len(), "preview bucket copied");
            }
        }
        Ok(())
    }

    /// Removes the config buckets of the preview's scopes.
    fn remove_buckets(&self, slug: &str) -> anyhow::Result<()> {
        let source = self.source_of(slug);
        for ((scope, name), values) in self.store.buckets()? {
            if self.ownership.allows(&source, &scope) {
                let keys: Vec<String> = values.into_keys().collect();
                self.store.config_unset(&scope, &name, &keys)?;
            }
        }
        Ok(())
    }

    /// The syncer of preview `slug` following `branch`, made on first use.
    fn syncer(
        &self,
        syncers: &std::sync::Mutex<BTreeMap<String, Arc<Syncer>>>,
        slug: &str,
        branch: &str,
    ) -> anyhow::Result<Arc<Syncer>> {
        if let Some(syncer) = crate::base::lock(syncers).get(slug) {
            return Ok(Arc::clone(syncer));
        }
        let source_name = self.source_of(slug);
        let mut options = self.options.clone();
        options.branch = branch.to_owned();
        let source = Source::new(options, &self.mirror_dir(slug)).selecting(self.hosts.clone());
        let store = Arc::new(self.store.for_source(&source_name));
        let mut sync = self.sync.clone();
        // The previews' policy narrows the agent's; their caps apply (README "Branch previews").
        if let Some(policy) = &self.rules.policy {
            sync.policy = sync.policy.narrowed(policy);
        }
        sync.policy.caps = self.rules.caps;
        sync.policy.seal = Some(Seal::new(&source_name, Arc::clone(&self.ownership)));
        sync.preview = Some((self.rules.clone(), slug.to_owned()));
        let syncer = Arc::new(Syncer::new(source, store, sync)?);
        crate::base::lock(syncers).insert(slug.to_owned(), Arc::clone(&syncer));
        Ok(syncer)
    }

    fn mirror_dir(&self, slug: &str) -> PathBuf {
        self.dir.join("previews").join(slug)
    }

    /// Records the preview's row, with its hosts and scopes as its source holds them.
    fn record(
        &self,
        slug: &str,
        (branch, commit): (&str, &str),
        (state, message): (State, String),
        (created, pushed): (i64, i64),
    ) -> anyhow::Result<()> {
        let source = self.source_of(slug);
        let hosts: Vec<String> = self
            .store
            .claims(crate::manifest::spec::ClaimKind::Host)?
            .into_iter()
            .filter(|(_, holder)| holder.source == source)
            .map(|(host, _)| host)
            .collect();
        let scopes = self.store.scopes_of_source(&source)?;
        let ttl = i64::try_from(self.rules.ttl.as_secs()).unwrap_or(i64::MAX);
        let mut message = message;
        let mut end = message.len().min(crate::sync::MAX_DIAGNOSTIC_MESSAGE_BYTES);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        self.store.record_preview(&PreviewRow {
            source: self.name.clone(),
            slug: slug.to_owned(),
            branch: branch.to_owned(),
            commit: commit.to_owned(),
            state: state.as_str().to_owned(),
            message,
            hosts: hosts.join(","),
            scopes: scopes.join(","),
            created,
            pushed,
            expires: pushed.saturating_add(ttl),
        })?;
        Ok(())
    }

    /// Once the preview's containers are gone (waiting up to `REMOVAL_WAIT`), removes its
    /// volumes and its mirror, and forgets it (or keeps it as expired).
    async fn finish_removal(
        self: &Arc<Self>,
        slug: &str,
        expired: bool,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        let source = self.source_of(slug);
        let ours = |labels: &BTreeMap<String, String>| {
            labels
                .get(labels::SCOPE)
                .is_some_and(|scope| self.ownership.allows(&source, scope))
        };
        let filter = [(labels::CREATED_BY, labels::CREATED_BY_VALUE)];
        let deadline = tokio::time::Instant::now() + REMOVAL_WAIT;
        loop {
            let left = self
                .runtime
                .list(&filter)
                .await?
                .into_iter()
                .filter(|container| ours(&container.labels))
                .count();
            if left == 0 {
                break;
            }
            if tokio::time::Instant::now() >= deadline || shutdown.is_cancelled() {
                anyhow::bail!("{left} containers of the preview still run");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        for volume in self.runtime.list_volumes(&filter).await? {
            if ours(&volume.labels) {
                self.runtime.remove_volume(&volume.name).await?;
                tracing::info!(source = %self.name, %slug, volume = %volume.name, "preview volume removed");
            }
        }
        // After its containers: the preview's own network (the proxy is disconnected from it).
        let network = self.ownership.network_of_source(&source);
        if crate::model::scopes::is_preview_network(&network) {
            self.runtime.remove_network(&network).await?;
            tracing::info!(source = %self.name, %slug, %network, "preview network removed");
        }
        // The store and the mirror, off the async threads.
        let (this, owned) = (Arc::clone(self), slug.to_owned());
        tokio::task::spawn_blocking(move || this.forget(&owned, expired)).await??;
        tracing::info!(source = %self.name, %slug, "preview removed");
        Ok(())
    }

    /// The last of a removal: the preview's buckets, its source's state, its mirror and its
    /// row (kept as expired when its TTL removed it). Blocking: on a blocking thread.
    fn forget(&self, slug: &str, expired: bool) -> anyhow::Result<()> {
        let source = self.source_of(slug);
        self.remove_buckets(slug)?;
        self.store.forget_source_state(&source)?;
        let mirror = self.mirror_dir(slug);
        if mirror.exists() {
            std::fs::remove_dir_all(&mirror)?;
        }
        let rows = self.store.previews(Some(&self.name))?;
        match rows.into_iter().find(|row| row.slug == slug) {
            Some(row) if expired => self.store.record_preview(&PreviewRow {
                state: State::Expired.as_str().to_owned(),
                message: format!(
                    "removed: no push for {}",
                    humantime::format_duration(self.rules.ttl)
                ),
                hosts: String::new(),
                scopes: String::new(),
                ..row
            })?,
            _ => self.store.forget_preview(&self.name, slug)?,
        }
        Ok(())
    }
}

/// Starts the previews task of each source with previews, on `tracker`; what wakes each
/// (a webhook push to a previewed branch), by source name.
pub(crate) fn spawn<R: Runtime>(
    syncers: &[(&super::SourceConfig, Arc<Syncer>)],
    (data_dir, hosts): (&std::path::Path, &HostSelection),
    (ownership, runtime): (&Arc<Ownership>, &Arc<R>),
    tracker: &tokio_util::task::TaskTracker,
    shutdown: &CancellationToken,
) -> BTreeMap<String, crate::http::PreviewWake> {
    let mut wakes = BTreeMap::new();
    for (source, syncer) in syncers {
        let Some(rules) = &source.previews else {
            continue;
        };
        let wake = Arc::new(tokio::sync::Notify::new());
        wakes.insert(
            source.name.clone(),
            crate::http::PreviewWake {
                rules: rules.clone(),
                wake: Arc::clone(&wake),
            },
        );
        let mut options = source.options.clone();
        options.max_file_bytes = syncer.options().max_file_bytes;
        let previews = Previews {
            name: source.name.clone(),
            rules: rules.clone(),
            options,
            hosts: hosts.clone(),
            dir: super::source_dir(data_dir, &source.name),
            interval: source.interval,
            store: Arc::new(syncer.store().for_source("")),
            sync: syncer.options().clone(),
            ownership: Arc::clone(ownership),
            runtime: Arc::clone(runtime),
            wake,
        };
        tracker.spawn(previews.run(shutdown.clone()));
    }
    wakes
}
