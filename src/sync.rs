//! One sync: fetch the repo, and when the branch moved (or the config buckets changed, since
//! `${VAR}` reads them), read the commit, load its manifests, put its assets on the host and
//! write the outcome to the store.
//!
//! With deploy trigger files (`.voodu/**/*.yml`) the commit is read as the triggers decide
//! (`manifest::triggers`): each trigger's file at the commit it last fired, after a tree diff
//! from the last applied commit says which fire now.
//!
//! A deploy window or a freeze (`manifest::window`, `store/holds.rs`) holds an accepted commit
//! before anything of it is written (`SyncOutcome::Held`); it is loaded again when its hold is
//! due (the opening reached, the freeze lifted, `approve --now`), or when the branch moves.
//!
//! Invariants: an unchanged SHA with unchanged buckets, no approved hold and no due held commit
//! ends the sync after the ref negotiation, one read of the config version, one of the approvals
//! and one of the held commit (no tree walk;
//! the only store write is the one-row upsert recording the fetch's outcome for `status`); a
//! commit is applied in
//! one store transaction or recorded as rejected with all its diagnostics, never half-applied;
//! a rejected commit writes nothing on the host (assets are written only once it is
//! accepted). Blocking: run on a blocking thread.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::assets::sops::Keyring;
use crate::assets::{self, UrlCache};
use crate::git::{Source, TrustedKeys, VerifyMode};
use crate::manifest::spec::Spec;
use crate::manifest::triggers::{self, Decision, Situation, Trigger, Verdict};
use crate::manifest::window::{self, Gate, WindowRule};
use crate::manifest::{self, Diagnostic, Diagnostics, LoadOptions, Mode, Policy, Vars};
use crate::model::policy::{OwnedPaths, resolve_on_host};
use crate::model::scopes::Ownership;
use crate::model::{
    BlobId, CommitSha, FileRead, FileSource, MAX_MANIFEST_BYTES, Snapshot, SourceFile, random_hex,
};
use crate::store::{ApplySummary, CommitContext, HEALTH_FETCH, META_HOST_SELECTION, Store, Who};

/// What one sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The branch still points at the last processed commit.
    Unchanged(CommitSha),
    Applied {
        commit: CommitSha,
        summary: ApplySummary,
        warnings: Vec<Diagnostic>,
        /// With deploy trigger files: what each trigger did for this commit.
        triggers: Vec<triggers::Outcome>,
    },
    Rejected {
        commit: CommitSha,
        diagnostics: Diagnostics,
    },
    /// Accepted, but a deploy window or a freeze holds it (`manifest::window`): the last
    /// applied commit keeps running until `until` (when known), `why`.
    Held {
        commit: CommitSha,
        until: Option<i64>,
        why: String,
    },
}

/// Fetching, writing assets or recording failed; the next sync tries again from scratch.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Git(#[from] crate::git::Error),
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error("writing assets: {0}")]
    Assets(#[from] crate::assets::Error),
    /// The host policy given to the syncer is unusable.
    #[error("{0}")]
    Policy(String),
}

/// How commits are loaded.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// `<data-dir>`: assets and the `url()` cache live under it.
    pub(crate) data_dir: PathBuf,
    /// The agent environment variables `${VAR}` may read (`--allow-env`), with their values.
    pub(crate) allowed_env: BTreeMap<String, String>,
    pub(crate) max_file_bytes: u64,
    pub(crate) max_url_bytes: u64,
    /// The time all `url()` fetches of one commit may take together (`--url-budget`).
    pub url_budget: std::time::Duration,
    /// Where the agent's HTTP side listens: `url()` never fetches from it.
    pub(crate) own_address: Option<std::net::SocketAddr>,
    /// What commits may ask of the host; default-deny (README "Host policy").
    pub policy: Policy,
    /// Commit signatures to require (`--verify-commits`); `None`: none.
    pub trust: Option<CommitTrust>,
    /// The age identities SOPS files are opened with (`--age-identity`).
    pub(crate) keyring: Arc<Keyring>,
    /// Which source may deploy which scope (`--sources`); the single `--repo` source owns
    /// every scope.
    pub ownership: Arc<Ownership>,
    /// This source's deploy windows (`window` blocks, `--window`); empty: always open.
    pub windows: Vec<WindowRule>,
    /// The wall clock windows and freezes are judged by, and fetches recorded at (tests set
    /// their own).
    pub clock: Clock,
    /// A branch preview's rules and slug: its manifests are read with scopes and hosts
    /// mapped (`manifest::previews`); `None` for a source's own branch.
    pub(crate) preview: Option<(crate::model::previews::PreviewRules, String)>,
}

/// A wall clock in Unix seconds: the system's by default.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> i64 + Send + Sync>);

impl Clock {
    /// A clock reading `now` (a test's).
    pub fn new(now: impl Fn() -> i64 + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(now))
    }

    pub(crate) fn now(&self) -> i64 {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new(crate::store::now_unix)
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

/// `--verify-commits` and the keys it trusts.
#[derive(Debug, Clone)]
pub struct CommitTrust {
    pub mode: VerifyMode,
    pub keys: Arc<TrustedKeys>,
    /// Names the configuration (mode and the key files' digests): a commit judged under
    /// another one is judged again after a restart.
    pub fingerprint: String,
}

impl CommitTrust {
    /// Verification in `mode` against the keys of the given files (git's allowed_signers
    /// format, an OpenPGP keyring); an error names a file that cannot be used.
    pub fn load(
        mode: VerifyMode,
        ssh_signers: Option<&std::path::Path>,
        pgp_keys: Option<&std::path::Path>,
    ) -> anyhow::Result<CommitTrust> {
        use anyhow::Context as _;
        use sha2::{Digest as _, Sha256};
        let keys = TrustedKeys::load(ssh_signers, pgp_keys)?;
        if keys.is_empty() {
            anyhow::bail!("the trusted key files list no key");
        }
        let mut fingerprint = Sha256::new();
        fingerprint.update(mode.as_str());
        for path in [ssh_signers, pgp_keys].into_iter().flatten() {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            fingerprint.update(Sha256::digest(&bytes));
        }
        Ok(CommitTrust {
            mode,
            keys: Arc::new(keys),
            fingerprint: crate::model::text::hex(&fingerprint.finalize()),
        })
    }
}

impl SyncOptions {
    pub fn new(data_dir: PathBuf) -> SyncOptions {
        SyncOptions {
            allowed_env: BTreeMap::new(),
            max_file_bytes: manifest::DEFAULT_MAX_FILE_BYTES,
            max_url_bytes: assets::DEFAULT_MAX_URL_BYTES,
            url_budget: assets::DEFAULT_URL_BUDGET,
            own_address: None,
            policy: Policy {
                data_dir: Some(
                    std::path::absolute(&data_dir)
                        .unwrap_or_else(|_| data_dir.clone())
                        .display()
                        .to_string(),
                ),
                ..Policy::default()
            },
            data_dir,
            trust: None,
            keyring: Arc::new(Keyring::default()),
            ownership: Arc::new(Ownership::single()),
            windows: Vec::new(),
            clock: Clock::default(),
            preview: None,
        }
    }
}

/// The hint an undefined `${VAR}` shows in the agent.
pub(crate) const MISSING_VAR_HINT: &str = "set it in a config bucket this file reads (`voodu-agent config set SCOPE[/NAME] {var}=…`) or let the agent read it from its environment (`--allow-env {var}`),";

/// The `meta` key holding the host policy the agent last ran with (JSON), which `plan` applies.
pub const META_HOST_POLICY: &str = "host_policy";
/// The `meta` key naming the commit-signature configuration the agent last ran with.
const META_COMMIT_TRUST: &str = "commit_trust";
/// The `meta` key of the scopes a source last ran with (`--sources`).
const META_SCOPES: &str = "scopes";

/// At most this many diagnostics of one commit are kept (recorded, logged, answered to
/// `?wait`); the last one kept says how many more there were. A commit with a million
/// problems must not cost a million diagnostics of memory, nor a row of that size per commit.
pub(crate) const MAX_DIAGNOSTICS: usize = 100;
/// Longest diagnostic message kept, in bytes; the rest is cut.
pub(crate) const MAX_DIAGNOSTIC_MESSAGE_BYTES: usize = 1024;

/// The trigger files the mirror refused (`(path, why)`), as diagnostics at their first line.
pub(crate) fn refusals(refused: Vec<(String, String)>) -> Vec<Diagnostic> {
    refused
        .into_iter()
        .map(|(path, message)| Diagnostic {
            path,
            line: 1,
            col: 1,
            message,
        })
        .collect()
}

/// Bounds `diagnostics` to [`MAX_DIAGNOSTICS`], each message to
/// [`MAX_DIAGNOSTIC_MESSAGE_BYTES`], and gives the excess memory back.
fn bounded(mut diagnostics: Vec<Diagnostic>) -> Vec<Diagnostic> {
    if diagnostics.len() > MAX_DIAGNOSTICS {
        let more = diagnostics.len() - (MAX_DIAGNOSTICS - 1);
        diagnostics.truncate(MAX_DIAGNOSTICS);
        let last = &mut diagnostics[MAX_DIAGNOSTICS - 1];
        last.message = format!("… and {more} more problem(s) not shown (fix the ones above first)");
    }
    for diagnostic in &mut diagnostics {
        if diagnostic.message.len() > MAX_DIAGNOSTIC_MESSAGE_BYTES {
            let end =
                crate::model::text::cut(&diagnostic.message, MAX_DIAGNOSTIC_MESSAGE_BYTES).len();
            diagnostic.message.truncate(end);
            diagnostic.message.push_str(" [message cut]");
        }
        diagnostic.message.shrink_to_fit();
    }
    diagnostics.shrink_to_fit();
    diagnostics
}

/// What the last sync processed: the commit and the config version it was loaded with.
type Seen = (CommitSha, i64);

/// How often (seconds) a source whose fetches keep succeeding refreshes its fetch's health
/// row (`checked_at`, `last_success_at`): `status` and `/metrics` may show a success this old.
const FETCH_OK_REFRESH_SECONDS: i64 = 30;

/// Carries a source and the store between syncs, remembering what it last processed.
pub struct Syncer {
    source: Source,
    store: Arc<Store>,
    options: SyncOptions,
    fetcher: UrlCache,
    last_seen: Mutex<Option<Seen>>,
    /// When this syncer last wrote a successful fetch to the store (its clock's Unix
    /// seconds), while every fetch since succeeded too (`record_fetch`); `None` after a
    /// failure or before the first.
    fetch_ok_written: Mutex<Option<i64>>,
    /// Decoded manifest files by blob id, so a commit parses only the files it changed.
    decoded: manifest::DecodeCache,
}

impl Syncer {
    /// Starts from the last commit the store recorded, so a restart does not re-read it,
    /// unless the host policy or the host selection (`--host`, `--host-label`) changed
    /// since: then that commit is judged again.
    pub fn new(source: Source, store: Arc<Store>, options: SyncOptions) -> Result<Syncer, Error> {
        let policy = serde_json::to_string(&options.policy)
            .expect("a policy is booleans and lists of strings");
        let hosts = serde_json::to_string(source.hosts()).expect("a host selection is strings");
        let trust = options
            .trust
            .as_ref()
            .map_or_else(|| "none".to_owned(), |trust| trust.fingerprint.clone());
        let scopes = options.ownership.patterns_of(store.source());
        // Each source remembers what it was judged under: one source's start must not make
        // another's look unchanged.
        let keys = [
            store.source_key(META_HOST_POLICY),
            store.source_key(META_HOST_SELECTION),
            store.source_key(META_COMMIT_TRUST),
            store.source_key(META_SCOPES),
        ];
        let same_policy = store.meta(&keys[0])?.as_deref() == Some(policy.as_str())
            && store.meta(&keys[1])?.as_deref() == Some(hosts.as_str())
            && store.meta(&keys[2])?.unwrap_or_else(|| "none".to_owned()) == trust
            && store.meta(&keys[3])?.unwrap_or_default() == scopes;
        let last_seen = match store.commit_summary()?.last_seen {
            Some(record) if same_policy => Some((record.sha, store.config_version()?)),
            _ => None,
        };
        store.set_meta(&keys[0], Some(&policy))?;
        store.set_meta(&keys[1], Some(&hosts))?;
        store.set_meta(&keys[2], Some(&trust))?;
        store.set_meta(&keys[3], Some(&scopes))?;
        let url_hosts = manifest::UrlHosts::parse(&options.policy.allow_url_host)
            .map_err(|error| Error::Policy(error.to_string()))?;
        let fetcher = UrlCache::new(&options.data_dir, options.max_url_bytes)
            .guarded(url_hosts, options.own_address);
        Ok(Syncer {
            source,
            store,
            options,
            fetcher,
            last_seen: Mutex::new(last_seen),
            fetch_ok_written: Mutex::new(None),
            decoded: manifest::DecodeCache::default(),
        })
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The options this syncer loads commits with.
    pub(crate) fn options(&self) -> &SyncOptions {
        &self.options
    }

    /// The store handle of this syncer's source.
    pub(crate) fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Runs one sync as a poll would; see `sync_once_as`.
    pub fn sync_once(&self, interrupt: &AtomicBool) -> Result<SyncOutcome, Error> {
        self.sync_once_as(interrupt, &Who::new(crate::store::Origin::Poll, None))
    }

    /// Runs one sync asked for by `who` (recorded in the activity log with what it applied).
    /// Blocking; a set `interrupt` stops it during the fetch or before the fetched commit is
    /// loaded, never halfway through applying it. An unchanged branch with unchanged config
    /// buckets ends after the ref negotiation unless a held commit was approved.
    pub fn sync_once_as(&self, interrupt: &AtomicBool, who: &Who) -> Result<SyncOutcome, Error> {
        let fetched = self.source.fetch(interrupt);
        self.record_fetch(&fetched);
        let commit = fetched?;
        // A safe point: shutdown need not wait for a commit to load; the next agent syncs it.
        if interrupt.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(crate::git::Error::Interrupted.into());
        }
        let mut last_seen = crate::base::lock(&self.last_seen);
        if self.nothing_new(&commit, last_seen.as_ref())? {
            return Ok(SyncOutcome::Unchanged(commit));
        }
        let outcome = self.load_and_apply(&commit, who);
        // Loading a commit allocates in proportion to its size (a 5 MB manifest parses into
        // hundreds of MB of syntax tree), all freed by now: hand it back to the system, with
        // what SQLite cached of the pages the commit wrote.
        if let Err(error) = self.store.shrink_memory() {
            tracing::debug!(%error, "cannot shrink the store's cache");
        }
        crate::git::give_memory_back();
        let outcome = outcome?;
        // Generated secrets bump the config version: remember the version after them.
        *last_seen = Some((commit, self.store.config_version()?));
        Ok(outcome)
    }

    /// A poll answered without a fetch, for a sweep over many sources (`agent::poll`): the
    /// commit when `sync_once_as` would find its branch unchanged from the ref files alone (a
    /// repository on this host whose ref and mirror ref did not move) and nothing new to do; the fetch's outcome is recorded as that sync records it. `None`:
    /// only a sync can say (a remote, a moved ref, new buckets, an approval, a due hold, a sync
    /// of this source running now). Blocking.
    pub fn poll_without_fetch(&self) -> Result<Option<CommitSha>, Error> {
        let last_seen = match self.last_seen.try_lock() {
            Ok(last_seen) => last_seen,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(None),
        };
        let Some(commit) = self.source.unchanged_tip() else {
            return Ok(None);
        };
        self.record_fetch(&Ok(commit.clone()));
        Ok(self
            .nothing_new(&commit, last_seen.as_ref())?
            .then_some(commit))
    }

    /// Whether `commit` fetched means nothing to do: the commit and the config version
    /// `last_seen` holds, no approval waiting and no held commit due.
    fn nothing_new(&self, commit: &CommitSha, last_seen: Option<&Seen>) -> Result<bool, Error> {
        let Some((seen_commit, seen_version)) = last_seen else {
            return Ok(false);
        };
        Ok(seen_commit == commit
            && *seen_version == self.store.config_version()?
            && !self.store.approvals_pending()?
            && !self.hold_due()?)
    }

    /// Removes every resource of this source (a branch preview torn down): an empty desired
    /// state applied as of its last commit, in one transaction, the asset files of its scopes
    /// cleaned. `None` when it never applied a commit.
    pub(crate) fn remove_all(&self, who: &Who) -> Result<Option<ApplySummary>, Error> {
        let Some(last) = self.store.commit_summary()?.last_seen else {
            return Ok(None);
        };
        let empty = manifest::Manifest::default();
        let summary = self.store.apply_commit_as(
            &last.sha,
            &empty,
            CommitContext {
                who,
                triggers: None,
                unsigned: false,
            },
        )?;
        self.clean_assets(
            &empty,
            &assets::assets_root(&self.options.data_dir),
            &last.sha,
        )?;
        Ok(Some(summary))
    }

    /// Records how the fetch ended for `status` (the whole error chain, and since when it
    /// fails); an interrupted fetch says nothing about the remote. A success after a success
    /// is written once per `FETCH_OK_REFRESH_SECONDS` only (or when the clock went back): a
    /// source polled each second would otherwise write a transaction a second to say nothing
    /// new (issue 54).
    fn record_fetch(&self, fetched: &Result<CommitSha, crate::git::Error>) {
        let chain;
        let outcome = match fetched {
            Ok(_) => Ok(()),
            Err(crate::git::Error::Interrupted) => return,
            Err(error) => {
                chain = crate::git::error_chain(error);
                Err(chain.as_str())
            }
        };
        let mut ok_written = crate::base::lock(&self.fetch_ok_written);
        let now = self.options.clock.now();
        if outcome.is_ok()
            && ok_written.is_some_and(|at| (at..at + FETCH_OK_REFRESH_SECONDS).contains(&now))
        {
            return;
        }
        match self
            .store
            .record_health_at(&self.store.source_key(HEALTH_FETCH), outcome, now)
        {
            Ok(()) => *ok_written = outcome.is_ok().then_some(now),
            Err(error) => {
                *ok_written = None;
                tracing::warn!(%error, "cannot record the fetch outcome");
            }
        }
    }

    fn load_and_apply(&self, commit: &CommitSha, who: &Who) -> Result<SyncOutcome, Error> {
        if let Some(untrusted) = self.untrusted(commit)? {
            return self.reject_unsigned(commit, who, untrusted);
        }
        let (trigger_files, refused) = self.source.read_trigger_files(commit)?;
        if trigger_files.is_empty() && refused.is_empty() {
            let (snapshot, ids) = self.source.read_snapshot_with_ids(commit)?;
            let files = self.source.files_at(commit)?;
            return self.apply_snapshot(commit, who, (&snapshot, &ids), &files, None);
        }
        let refusals = refusals(refused);
        let parsed = triggers::parse_all(&trigger_files);
        let triggers = match parsed {
            Ok(triggers) if refusals.is_empty() => triggers,
            Ok(_) => return self.reject(commit, who, refusals, None),
            Err(mut problems) => {
                problems.extend(refusals);
                return self.reject(commit, who, problems, None);
            }
        };
        let previous = self.store.trigger_states()?;
        let changed = match self.store.trigger_base()? {
            Some(base) => self.source.changed_paths(&base, commit)?,
            None => None,
        };
        let watched = self.source.watched_paths();
        let situation = Situation {
            branch: self.source.branch(),
            commit,
            changed: changed.as_deref(),
            watched: &watched,
            hosts: self.source.hosts(),
            now: crate::store::now_unix(),
        };
        let decision = triggers::decide(&triggers, &previous, &situation);
        let approving = decision
            .outcomes
            .iter()
            .any(|outcome| matches!(outcome.verdict, Verdict::Approved { .. }));
        let outcome = self.apply_decision(commit, who, &triggers, &previous, &decision)?;
        if approving && matches!(outcome, SyncOutcome::Rejected { .. }) {
            // The approvals are refused with that commit (and cleared): the commit itself
            // still deserves its chance without them.
            let previous = self.store.trigger_states()?;
            let decision = triggers::decide(&triggers, &previous, &situation);
            return self.apply_decision(commit, who, &triggers, &previous, &decision);
        }
        Ok(outcome)
    }

    /// Reads the files `decision` names, each at its commit, and applies them.
    fn apply_decision(
        &self,
        commit: &CommitSha,
        who: &Who,
        triggers: &[Trigger],
        previous: &[triggers::TriggerState],
        decision: &Decision,
    ) -> Result<SyncOutcome, Error> {
        let mut files = Vec::new();
        let mut problems = Vec::new();
        // Every active trigger's file must be there now, fired or not: a mistake in a trigger
        // file is reported with the commit that makes it, not when the trigger next fires.
        let here = self.source.files_at(commit)?;
        for trigger in triggers {
            let active = decision.outcomes.iter().any(|outcome| {
                outcome.path == trigger.path && !matches!(outcome.verdict, Verdict::Inactive(_))
            });
            let read_below = decision
                .files
                .iter()
                .any(|(file, at, _)| file == &trigger.apply_file && at == commit);
            if active
                && !read_below
                && let Some(problem) = file_problem(
                    &here.read(&trigger.apply_file, MAX_MANIFEST_BYTES),
                    &trigger.apply_file,
                    commit,
                )
            {
                problems.push(trigger.at_apply_file(problem));
            }
        }
        for (file, at, trigger_path) in &decision.files {
            let located = |message: String| match triggers
                .iter()
                .find(|trigger| &trigger.path == trigger_path)
            {
                Some(trigger) => trigger.at_apply_file(message),
                None => Diagnostic {
                    path: trigger_path.clone(),
                    line: 1,
                    col: 1,
                    message,
                },
            };
            let read = self.source.files_at(at)?.read(file, MAX_MANIFEST_BYTES);
            match file_problem(&read, file, at) {
                Some(problem) => problems.push(located(problem)),
                None => {
                    if let FileRead::File(contents) = read {
                        files.push(SourceFile {
                            path: file.clone(),
                            contents,
                        });
                    }
                }
            }
        }
        if !problems.is_empty() {
            return self.reject(commit, who, problems, Some(decision));
        }
        let snapshot = Snapshot {
            commit: commit.clone(),
            files,
            refused: Vec::new(),
        };
        let manifests: Vec<(String, CommitSha)> = decision
            .files
            .iter()
            .map(|(file, at, _)| (file.clone(), at.clone()))
            .collect();
        let files = self.source.triggered_files(commit, &manifests)?;
        // Trigger-selected files come from several commits and carry no blob ids: not cached.
        let outcome = self.apply_snapshot(commit, who, (&snapshot, &[]), &files, Some(decision))?;
        if matches!(outcome, SyncOutcome::Applied { .. }) {
            for state in &decision.states {
                let was = previous.iter().find(|before| before.path == state.path);
                if !state.inactive.is_empty()
                    && was.is_none_or(|was| was.inactive != state.inactive)
                {
                    tracing::warn!(trigger = %state.name, file = %state.path, "trigger never fires on this host: {}", state.inactive);
                }
            }
            for state in &decision.removed {
                tracing::info!(trigger = %state.name, file = %state.path, "trigger file removed: the resources of its manifest go unless another trigger declares them");
            }
        }
        Ok(outcome)
    }

    /// Records `problems` as the rejection of `commit`.
    fn reject(
        &self,
        commit: &CommitSha,
        who: &Who,
        problems: Vec<Diagnostic>,
        decision: Option<&Decision>,
    ) -> Result<SyncOutcome, Error> {
        self.record_rejection(commit, who, problems, decision, false)
    }

    /// Records the rejection of a commit not signed by a trusted key (`untrusted` says why):
    /// told as `signature.refused` too.
    fn reject_unsigned(
        &self,
        commit: &CommitSha,
        who: &Who,
        untrusted: Diagnostic,
    ) -> Result<SyncOutcome, Error> {
        self.record_rejection(commit, who, vec![untrusted], None, true)
    }

    fn record_rejection(
        &self,
        commit: &CommitSha,
        who: &Who,
        problems: Vec<Diagnostic>,
        decision: Option<&Decision>,
        unsigned: bool,
    ) -> Result<SyncOutcome, Error> {
        let diagnostics = Diagnostics(bounded(problems));
        // The tip is rejected: a commit held before it would never apply.
        self.store.drop_hold()?;
        self.store.reject_commit_as(
            commit,
            &diagnostics,
            CommitContext {
                who,
                triggers: decision,
                unsigned,
            },
        )?;
        Ok(SyncOutcome::Rejected {
            commit: commit.clone(),
            diagnostics,
        })
    }

    /// Loads `snapshot` under the host policy (through the decode cache, for files with blob
    /// ids) and applies it (with `decision`, for a repository with trigger files).
    fn apply_snapshot(
        &self,
        commit: &CommitSha,
        who: &Who,
        (snapshot, ids): (&Snapshot, &[Option<BlobId>]),
        files: &dyn FileSource,
        decision: Option<&Decision>,
    ) -> Result<SyncOutcome, Error> {
        let manifest = match self.load((snapshot, ids), files)? {
            Ok(manifest) => manifest,
            Err(diagnostics) => return self.reject(commit, who, diagnostics.0, decision),
        };
        let refused = self.refusals(&manifest)?;
        if !refused.is_empty() {
            return self.reject(commit, who, refused, decision);
        }
        // Accepted: a closed deploy window or a freeze holds it here, before anything of it
        // is written.
        if let Gate::Closed { until, why, frozen } = self.gate(commit, decision)? {
            if self.store.record_hold(commit, until, &why, frozen)? {
                tracing::info!(
                    commit = commit.short(),
                    until = until.map(window::rfc3339),
                    "commit held: {why}"
                );
            }
            return Ok(SyncOutcome::Held {
                commit: commit.clone(),
                until,
                why,
            });
        }
        for request in &manifest.secrets {
            let (scope, name) = &request.bucket;
            if self
                .store
                .ensure_config(scope, name, &request.key, || random_hex(24))?
            {
                tracing::info!(bucket = %format!("{scope}/{name}"), key = %request.key, "generated a secret");
            }
        }
        let assets_root = assets::assets_root(&self.options.data_dir);
        let written = match assets::materialise(&manifest, &assets_root, &self.options.keyring) {
            Ok(written) => written,
            Err(error) => {
                let Some((asset, why)) = error.refused_asset() else {
                    return Err(error.into());
                };
                // Trying again cannot help: the commit is rejected at the asset's block (files
                // of other assets written before it are put back by the asset handler).
                let refusal = asset_refusal(&manifest, asset, &why);
                return self.reject(commit, who, vec![refusal], decision);
            }
        };
        if written > 0 {
            tracing::info!(commit = commit.short(), files = written, "assets written");
        }
        let applied = self.store.apply_commit_as(
            commit,
            &manifest,
            CommitContext {
                who,
                triggers: decision,
                unsigned: false,
            },
        );
        let summary = match applied {
            Ok(summary) => summary,
            // Another source took it since the check above.
            Err(crate::store::Error::Claimed(taken)) => {
                let claimed = taken
                    .iter()
                    .map(crate::store::ClaimConflict::diagnostic)
                    .collect();
                return self.reject(commit, who, claimed, decision);
            }
            Err(error) => return Err(error.into()),
        };
        self.clean_assets(&manifest, &assets_root, commit)?;
        Ok(SyncOutcome::Applied {
            commit: commit.clone(),
            summary,
            warnings: bounded(manifest.warnings),
            triggers: decision
                .map(|decision| decision.outcomes.clone())
                .unwrap_or_default(),
        })
    }

    /// Whether `commit` may be applied now: this source's windows, the windows of the triggers
    /// `decision` fires, and a freeze in force; open for a commit `approve --now` released.
    fn gate(&self, commit: &CommitSha, decision: Option<&Decision>) -> Result<Gate, Error> {
        let hold = self.store.hold()?;
        if hold.is_some_and(|hold| &hold.commit == commit && hold.released_by.is_some()) {
            return Ok(Gate::Open);
        }
        let now = self.options.clock.now();
        let freeze = self.store.freeze_in_force(now)?;
        let mut rule_sets: Vec<&[WindowRule]> = vec![&self.options.windows];
        if let Some(decision) = decision {
            rule_sets.extend(decision.firing_windows());
        }
        Ok(window::gate(&rule_sets, freeze.as_ref(), now))
    }

    /// Whether the held commit is due again although the branch did not move: released by
    /// `approve --now`, its window's opening reached, or its freeze lifted.
    fn hold_due(&self) -> Result<bool, Error> {
        let Some(hold) = self.store.hold()? else {
            return Ok(false);
        };
        let now = self.options.clock.now();
        Ok(hold.released_by.is_some()
            || hold.until.is_some_and(|until| until <= now)
            || (hold.frozen && self.store.freeze_in_force(now)?.is_none())
            || (!hold.frozen && self.store.freeze_in_force(now)?.is_some()))
    }

    /// Loads the commit's manifests with this source's variables (only the buckets of its own
    /// scopes), fetching its `url()` sources within the budget. The inner `Err`: the
    /// diagnostics that reject the commit.
    fn load(
        &self,
        (snapshot, ids): (&Snapshot, &[Option<BlobId>]),
        files: &dyn FileSource,
    ) -> Result<Result<manifest::Manifest, Diagnostics>, Error> {
        // Only the buckets of this source's own scopes reach its `${VAR}`s.
        let source = self.store.source();
        let mut buckets = self.store.buckets()?;
        buckets.retain(|(scope, _), _| self.options.ownership.allows(source, scope));
        let vars = Vars {
            buckets,
            globals: self.options.allowed_env.clone(),
        };
        // A preview's files are mapped: their text is not their blob's, so not cached.
        let mapped;
        let (snapshot, ids) = match &self.options.preview {
            Some((rules, slug)) => {
                mapped = manifest::previews::rewrite(snapshot, rules, slug);
                (&mapped, &[][..])
            }
            None => (snapshot, ids),
        };
        let options = LoadOptions {
            vars: &vars,
            files,
            fetcher: None,
            mode: Mode::Apply,
            max_file_bytes: self.options.max_file_bytes,
            missing_var_hint: MISSING_VAR_HINT,
        };
        Ok(assets::load_fetching_urls(
            &self.fetcher,
            self.options.url_budget,
            (snapshot, ids, &self.decoded),
            &options,
            Some(&self.options.policy),
        ))
    }

    /// Why the commit may not apply, the first kind found: scopes another source owns, what
    /// another source holds (hosts, ports, named volumes; checked again, and recorded, in the
    /// transaction that applies the commit), SOPS files the host's identities cannot open,
    /// binds through symlinks. Empty: it may apply.
    fn refusals(&self, manifest: &manifest::Manifest) -> Result<Vec<Diagnostic>, Error> {
        let foreign = foreign_scopes(manifest, self.store.source(), &self.options.ownership);
        if !foreign.is_empty() {
            return Ok(foreign);
        }
        let claimed: Vec<Diagnostic> = self
            .store
            .claim_conflicts(manifest)?
            .iter()
            .map(crate::store::ClaimConflict::diagnostic)
            .collect();
        if !claimed.is_empty() {
            return Ok(claimed);
        }
        let sealed = sealed_refusals(manifest, &self.options.keyring);
        if !sealed.is_empty() {
            return Ok(sealed);
        }
        Ok(bind_refusals_on_this_host(
            manifest,
            &self.options.policy,
            &self.options.data_dir,
        ))
    }

    /// Removes the files of assets no longer declared by this source (the files of other
    /// sources' assets stay: they are not this commit's to remove).
    fn clean_assets(
        &self,
        manifest: &manifest::Manifest,
        assets_root: &std::path::Path,
        commit: &CommitSha,
    ) -> Result<(), Error> {
        let source = self.store.source();
        let live: BTreeSet<(String, String)> = manifest
            .resources
            .iter()
            .filter(|resource| matches!(resource.spec, Spec::Asset(_)))
            .map(|resource| (resource.key.scope.clone(), resource.key.name.clone()))
            .chain(
                self.store
                    .keys_of_other_sources(crate::model::Kind::Asset)?
                    .into_iter()
                    .map(|key| (key.scope, key.name)),
            )
            .collect();
        let removed = assets::remove_unused(assets_root, &live, &|scope| {
            self.options.ownership.allows(source, scope)
        })?;
        if removed > 0 {
            tracing::info!(
                commit = commit.short(),
                assets = removed,
                "files of removed assets cleaned"
            );
        }
        Ok(())
    }
}

/// The rejection of a commit whose asset this host can never write (`why`), at the asset's
/// block.
fn asset_refusal(
    manifest: &manifest::Manifest,
    asset: &crate::model::ResourceKey,
    why: &str,
) -> Diagnostic {
    let at = manifest
        .resources
        .iter()
        .find(|resource| &resource.key == asset)
        .map(|resource| resource.origin.clone())
        .unwrap_or_else(|| Diagnostic {
            path: asset.to_string(),
            line: 0,
            col: 0,
            message: String::new(),
        });
    Diagnostic {
        message: format!(
            "this host cannot write the files of {asset}: {why}; rename or shorten the key"
        ),
        ..at
    }
}

/// The resources of the commit in scopes its source may not deploy, each at its block,
/// naming the scope and the source that owns it (`--sources`).
pub(crate) fn foreign_scopes(
    manifest: &manifest::Manifest,
    source: &str,
    ownership: &Ownership,
) -> Vec<Diagnostic> {
    manifest
        .resources
        .iter()
        .filter(|resource| !ownership.allows(source, &resource.key.scope))
        .map(|resource| {
            let scope = &resource.key.scope;
            let shown = if scope.is_empty() {
                "the unscoped resources (\"\")".to_owned()
            } else {
                format!("scope `{scope}`")
            };
            let owner = match ownership.source_of(scope) {
                Some(preview) if crate::model::previews::split_source(&preview).is_some() => {
                    format!("{shown} is branch preview `{preview}`'s: a preview's scopes are deployed only from its branch")
                }
                Some(owner) => format!("{shown} belongs to source `{owner}`"),
                None => format!("no source of --sources may deploy {shown}"),
            };
            Diagnostic {
                message: format!(
                    "{} may not be deployed by source `{source}` (its scopes: {}): {owner}; declare it in that source's repository, or give the scope to this source in the --sources file",
                    resource.key,
                    ownership.patterns_of(source)
                ),
                ..resource.origin.clone()
            }
        })
        .collect()
}

/// What is wrong with what `apply.file` `file` names at commit `at`, if anything.
fn file_problem(read: &FileRead, file: &str, at: &CommitSha) -> Option<String> {
    match read {
        FileRead::File(_) => None,
        FileRead::TooLarge(size) => Some(format!(
            "apply.file {file} is {size} at commit {}; at most {MAX_MANIFEST_BYTES} bytes of a manifest are read",
            at.short()
        )),
        FileRead::Missing => Some(format!(
            "apply.file {file} does not exist at commit {}",
            at.short()
        )),
        FileRead::Symlink(_) => Some(format!(
            "apply.file {file} is a symlink at commit {}; name a regular manifest file",
            at.short()
        )),
        FileRead::NotAFile => Some(format!(
            "apply.file {file} is not a file at commit {} (a directory?); it names one manifest file, as in voodu",
            at.short()
        )),
        FileRead::Error(message) => Some(format!(
            "apply.file {file} cannot be read at commit {}: {message}",
            at.short()
        )),
    }
}

impl Syncer {
    /// With `--verify-commits`, why `commit` may not be applied: the first commit of the
    /// checked range without a trusted signature, as a diagnostic of the commit as a whole.
    fn untrusted(&self, commit: &CommitSha) -> Result<Option<Diagnostic>, Error> {
        let Some(trust) = &self.options.trust else {
            return Ok(None);
        };
        let since = match trust.mode {
            VerifyMode::Tip => None,
            VerifyMode::All => self
                .store
                .commit_summary()?
                .last_applied
                .map(|record| record.sha),
        };
        match self
            .source
            .verify(&trust.keys, trust.mode, since.as_ref(), commit)?
        {
            Ok(verified) => {
                tracing::info!(
                    commit = commit.short(),
                    signer = %verified.tip_signer,
                    commits = verified.n_commits,
                    "commit signature verified"
                );
                Ok(None)
            }
            Err(untrusted) => {
                let mode = trust.mode.as_str();
                let message = if untrusted.commit == *commit {
                    format!(
                        "not signed by a trusted key: {} (--verify-commits {mode}); nothing of this commit was applied",
                        untrusted.refusal
                    )
                } else {
                    format!(
                        "not signed by a trusted key: {} (--verify-commits {mode}: every commit since the last applied one{} must be); nothing of {} was applied",
                        untrusted.refusal,
                        since
                            .as_ref()
                            .map(|since| format!(", {},", since.short()))
                            .unwrap_or_default(),
                        commit.short()
                    )
                };
                tracing::warn!(commit = commit.short(), untrusted = untrusted.commit.short(), reason = %untrusted.refusal, "commit refused: signature");
                Ok(Some(Diagnostic {
                    path: format!("commit {}", untrusted.commit.short()),
                    line: 0,
                    col: 0,
                    message,
                }))
            }
        }
    }
}

/// The SOPS env files of the commit that this host cannot open (no identity, no matching key,
/// MAC mismatch, a value no environment variable can hold), each at the resource that reads
/// it. Decrypted values are dropped here: they live in memory only while being checked.
pub(crate) fn sealed_refusals(manifest: &manifest::Manifest, keyring: &Keyring) -> Vec<Diagnostic> {
    let mut opened: BTreeMap<&str, Result<(), String>> = BTreeMap::new();
    let mut refusals = Vec::new();
    for resource in &manifest.resources {
        let Some(container) = resource.spec.container() else {
            continue;
        };
        for sealed in &container.env_sealed {
            let outcome = opened.entry(sealed.digest.as_str()).or_insert_with(|| {
                if keyring.is_empty() {
                    return Err("is SOPS-encrypted and the agent holds no age identity; start it with --age-identity FILE".to_owned());
                }
                let bytes = manifest
                    .blobs
                    .get(&sealed.digest)
                    .ok_or("is missing from the commit's files")?;
                let file = manifest::sops::parse(bytes)
                    .ok_or("is not a SOPS file")?
                    .map_err(|why| format!("is not a readable SOPS file: {why}"))?;
                let plain = keyring
                    .open(&file)
                    .map_err(|error| format!("cannot be decrypted: {error}"))?;
                for (name, value) in plain.env().map_err(|error| format!("cannot be used as an env file: {error}"))? {
                    if value.contains('\0') {
                        return Err(format!("{name:?}: a value holds a NUL byte, which no environment variable can"));
                    }
                }
                Ok(())
            });
            if let Err(why) = outcome {
                refusals.push(Diagnostic {
                    message: format!("env_file {:?} {why}", sealed.path),
                    ..resource.origin.clone()
                });
            }
        }
    }
    // SOPS-encrypted asset sources: decrypted here to check, written by `materialise`.
    for resource in &manifest.resources {
        let Spec::Asset(asset) = &resource.spec else {
            continue;
        };
        for (key, file) in asset.files.iter().filter(|(_, file)| file.sealed) {
            let why = if keyring.is_empty() {
                Some("is SOPS-encrypted and the agent holds no age identity; start it with --age-identity FILE".to_owned())
            } else {
                let one = std::collections::BTreeMap::from([(key.clone(), file.clone())]);
                assets::prepare(&one, &|digest| manifest.blobs.get(digest).cloned(), keyring)
                    .err()
                    .map(|error| format!("cannot be decrypted: {error}"))
            };
            if let Some(why) = why {
                refusals.push(Diagnostic {
                    message: format!("asset key `{key}`: file({:?}) {why}", file.origin),
                    ..resource.origin.clone()
                });
            }
        }
    }
    refusals
}

/// Bind sources that the host policy allows as written but that resolve, through symlinks on
/// this host, to a path it refuses (a container with an allowed bind can plant such a link).
/// Located at the resource's block: the manifest stage has no host to look at. The gate at the
/// sink judges the same once more when the container is created.
fn bind_refusals_on_this_host(
    manifest: &manifest::Manifest,
    policy: &Policy,
    data_dir: &std::path::Path,
) -> Vec<Diagnostic> {
    let data_dir = std::path::absolute(data_dir)
        .unwrap_or_else(|_| data_dir.to_owned())
        .display()
        .to_string();
    let owned = OwnedPaths::for_data_dir(&data_dir);
    let mut refusals = Vec::new();
    for resource in &manifest.resources {
        let Some(container) = resource.spec.container() else {
            continue;
        };
        for source in container
            .volumes
            .iter()
            .filter_map(|volume| manifest::bind_source(volume, &data_dir))
        {
            // The manifest stage judged `source` as written: what is left is where it leads.
            let refusal = policy.resolved_bind_refusal(&source, &owned, |path| {
                resolve_on_host(std::path::Path::new(path))
            });
            // Where it leads must be this source's too (an asset file of its own scopes).
            let foreign = policy.seal.as_ref().and_then(|seal| {
                let resolved = resolve_on_host(std::path::Path::new(&source)).ok()?;
                seal.bind_refusal(&resolved, &owned)
            });
            for message in refusal.into_iter().chain(foreign) {
                refusals.push(Diagnostic {
                    message,
                    ..resource.origin.clone()
                });
            }
        }
    }
    refusals
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poll sweep leaves a source alone while a sync of it runs (that sync holds what it
    /// last saw), rather than waiting the sync out, and answers again once it ended.
    #[test]
    fn a_sweep_does_not_wait_for_a_sync_in_flight() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work)?;
        let git = |args: &[&str]| -> Result<(), Box<dyn std::error::Error>> {
            let status = std::process::Command::new("git")
                .arg("-C")
                .arg(&work)
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "commit.gpgsign=false",
                ])
                .args(args)
                .stdout(std::process::Stdio::null())
                .status()?;
            if status.success() {
                Ok(())
            } else {
                Err(format!("git {args:?}: {status}").into())
            }
        };
        git(&["init", "-q", "-b", "main"])?;
        std::fs::write(
            work.join("a.hcl"),
            "asset \"s\" \"cfg\" {\n  app = \"x\"\n}\n",
        )?;
        git(&["add", "."])?;
        git(&["commit", "-qm", "one"])?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data)?;
        let store = Arc::new(Store::open(&data.join("state.db"))?);
        let source = Source::new(
            crate::git::SourceOptions {
                url: format!("file://{}", work.display()),
                branch: "main".to_owned(),
                ..Default::default()
            },
            &data,
        );
        let syncer = Syncer::new(source, store, SyncOptions::new(data.clone()))?;
        let outcome = syncer.sync_once(&AtomicBool::new(false))?;
        assert!(
            matches!(outcome, SyncOutcome::Applied { .. }),
            "{outcome:?}"
        );
        let tip = syncer.poll_without_fetch()?;
        assert!(tip.is_some(), "unchanged after the sync");

        let in_flight = crate::base::lock(&syncer.last_seen);
        assert_eq!(syncer.poll_without_fetch()?, None, "a sync in flight");
        drop(in_flight);
        assert_eq!(syncer.poll_without_fetch()?, tip);
        Ok(())
    }

    fn diagnostic(index: usize, message: &str) -> Diagnostic {
        Diagnostic {
            path: "big.hcl".to_owned(),
            line: index + 1,
            col: 3,
            message: message.to_owned(),
        }
    }

    /// Bounds `n` diagnostics with `message`: how many are kept, and the last one's text.
    fn check(n: usize, message: &str, expected_len: usize, expected_last: &str) {
        let kept = bounded((0..n).map(|index| diagnostic(index, message)).collect());
        assert_eq!(kept.len(), expected_len, "{n} diagnostics");
        let last = kept.last().map(ToString::to_string).unwrap_or_default();
        assert_eq!(last, expected_last, "{n} diagnostics");
    }

    #[test]
    fn a_rejected_commit_keeps_a_bounded_number_of_diagnostics_and_bytes() {
        check(0, "x", 0, "");
        check(
            3,
            "unknown attribute `imge`",
            3,
            "big.hcl:3:3: unknown attribute `imge`",
        );
        check(100, "x", 100, "big.hcl:100:3: x");
        check(
            100_000,
            "x",
            100,
            "big.hcl:100:3: … and 99901 more problem(s) not shown (fix the ones above first)",
        );
        let long = "é".repeat(1000);
        check(
            1,
            &long,
            1,
            &format!("big.hcl:1:3: {} [message cut]", "é".repeat(512)),
        );
    }
}
