//! Git stage: keep a bare mirror of the watched repo in the data dir, fetch it with gix,
//! resolve the branch to a commit SHA, and read manifest blobs at that commit (`tree.rs`).
//! `trigger.rs` merges what asks for a sync (poll ticks, webhooks, local ref changes) into one
//! coalescing channel.
//!
//! Invariant: an unchanged poll costs one ref negotiation: when the remote branch tip equals
//! the mirror's, no pack is requested and no tree is read. For a repository on this host the
//! negotiation is a read of two ref files: its branch and the mirror's, both still at the tip
//! this process's last negotiation found (`Source::unchanged_local_tip`); anything else (a
//! moved, symbolic or missing ref, a mirror started again) negotiates with `git upload-pack`.
//! gix is blocking: callers run `fetch` on a blocking thread and pass an interrupt flag tied
//! to shutdown.

mod error;
mod fetch;
mod http;
mod memory;
pub mod push;
mod tree;
pub mod trigger;
mod upload_pack;
mod verify;
mod workdir;

pub use error::{Error, Result};

/// The trigger files of a commit or directory (`.voodu/**/*.yml`) in path order, and the
/// refused ones (symlinks) with why.
pub(crate) type TriggerFiles = (Vec<crate::model::SourceFile>, Vec<(String, String)>);
pub(crate) use memory::give_memory_back;
pub(crate) use tree::{CommitFiles, TriggeredFiles};
pub use verify::{MAX_VERIFIED_COMMITS, Refusal, TrustedKeys, Untrusted, Verified, VerifyMode};
pub use workdir::{WORKDIR_COMMIT, WorkdirFiles, read_workdir, read_workdir_triggers};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::model::{CommitSha, HostSelection, Snapshot};

/// Where to fetch from and what to read.
#[derive(Debug, Clone, Default)]
pub struct SourceOptions {
    /// `file://`, `https://`, `ssh://` / scp-like URL, or a plain local path.
    pub url: String,
    pub branch: String,
    /// Repo-relative directories (or files) to read manifests from; empty = the whole tree.
    pub paths: Vec<String>,
    /// For https: a file holding a token, sent as the password of the URL's user (a GitLab
    /// deploy token's name, Bitbucket's `x-token-auth`), else of [`DEFAULT_TOKEN_USER`].
    pub token_file: Option<PathBuf>,
    /// For https: a PEM file of CA certificates trusted beside the system's.
    pub ca_file: Option<PathBuf>,
    /// For ssh: accept the key of a host not in known_hosts yet and remember it
    /// (`StrictHostKeyChecking=accept-new`); otherwise an unknown host is refused.
    pub ssh_accept_new_host_keys: bool,
    /// For ssh: the private key to authenticate with (`ssh -i FILE -o IdentitiesOnly=yes`);
    /// otherwise ssh's own (the agent's user's `~/.ssh`, an ssh-agent).
    pub ssh_key_file: Option<PathBuf>,
    /// The largest file `file()` and `env_file` read (`--max-file-size`). Blobs larger than
    /// this and than a manifest can be (`model::MAX_MANIFEST_BYTES`) are not fetched.
    pub max_file_bytes: u64,
}

/// The user a token is sent as when the URL names none: what GitHub, Gitea and Forgejo take.
pub(crate) const DEFAULT_TOKEN_USER: &str = "x-access-token";

/// The ssh command with `SourceOptions::ssh_accept_new_host_keys`.
const SSH_ACCEPT_NEW: &str = "ssh -o StrictHostKeyChecking=accept-new";

impl SourceOptions {
    /// The ssh command fetches run (git's `core.sshCommand`, a shell command line), when the
    /// options ask for more than plain `ssh`.
    pub(crate) fn ssh_command(&self) -> Option<String> {
        let mut command = match &self.ssh_key_file {
            // Checked by `check`: no `'` in it, so single quotes keep it one word.
            Some(key) => format!("ssh -i '{}' -o IdentitiesOnly=yes", key.display()),
            None if self.ssh_accept_new_host_keys => return Some(SSH_ACCEPT_NEW.to_owned()),
            None => return None,
        };
        if self.ssh_accept_new_host_keys {
            command.push_str(" -o StrictHostKeyChecking=accept-new");
        }
        Some(command)
    }
}

impl SourceOptions {
    /// Checks what can be checked before the first fetch: a token is never sent in clear
    /// text (an `http://` URL with a token file is refused rather than fetched without it),
    /// and the CA file holds certificates.
    pub(crate) fn check(&self) -> Result<()> {
        let url = normalize_url(&self.url);
        if self.token_file.is_some() && url.to_ascii_lowercase().starts_with("http://") {
            return Err(Error::TokenOverHttp { url });
        }
        if let Some(path) = &self.ca_file {
            ca_certificates(path)?;
        }
        if let Some(key) = &self.ssh_key_file {
            let problem = |message: &str| Error::SshKeyFile {
                path: key.clone(),
                message: message.to_owned(),
            };
            if !key.is_absolute() || key.to_string_lossy().contains(['\'', '\n', '\0']) {
                return Err(problem(
                    "give an absolute path without `'` or line breaks in it",
                ));
            }
            if let Err(error) = std::fs::metadata(key) {
                return Err(problem(&error.to_string()));
            }
        }
        Ok(())
    }
}

/// The certificates of a PEM file; at least one.
fn ca_certificates(path: &Path) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    let problem = |message: String| Error::CaFile {
        path: path.to_owned(),
        message,
    };
    let pem = std::fs::read(path).map_err(|error| problem(error.to_string()))?;
    let certificates = rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|error| problem(error.to_string()))?;
    if certificates.is_empty() {
        return Err(problem("no PEM certificate in it".to_owned()));
    }
    Ok(certificates)
}

/// A watched repository and its bare mirror under the data dir.
pub struct Source {
    options: SourceOptions,
    url: String,
    mirror: PathBuf,
    tree_reads: AtomicU64,
    negotiations: AtomicU64,
    /// The manifest blobs of the last snapshot read (`tree::BlobMemo`).
    blob_memo: std::sync::Mutex<tree::BlobMemo>,
    /// Which manifests this host applies (`model::hosts`); every one unless `selecting`.
    hosts: HostSelection,
    /// What this process's last negotiation found the branch at: its ref's target and the
    /// commit it names, and the remote's git directory when it is on this host, found then
    /// rather than by each poll (`Source::unchanged_local_tip`).
    negotiated: std::sync::Mutex<Option<(gix::ObjectId, gix::ObjectId, Option<PathBuf>)>>,
}

impl Source {
    /// A source mirroring `options.url` into `<data_dir>/repo.git`. Plain paths are made
    /// absolute, so the agent can be started from anywhere.
    pub fn new(options: SourceOptions, data_dir: &Path) -> Source {
        let url = normalize_url(&options.url);
        Source {
            options,
            url,
            mirror: data_dir.join("repo.git"),
            tree_reads: AtomicU64::new(0),
            negotiations: AtomicU64::new(0),
            blob_memo: std::sync::Mutex::default(),
            hosts: HostSelection::every_host(),
            negotiated: std::sync::Mutex::default(),
        }
    }

    /// This source reading only the manifests `hosts` applies (a fleet's host selection).
    pub(crate) fn selecting(mut self, hosts: HostSelection) -> Source {
        self.hosts = hosts;
        self
    }

    /// The host selection `read_snapshot` applies.
    pub(crate) fn hosts(&self) -> &HostSelection {
        &self.hosts
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn branch(&self) -> &str {
        &self.options.branch
    }

    /// The watched `--path` prefixes, normalised (`./deploy/` is `deploy`); empty for the
    /// whole repo.
    pub(crate) fn watched_paths(&self) -> Vec<String> {
        self.options
            .paths
            .iter()
            .map(|path| tree::normalize_watched_path(path))
            .filter(|path| !path.is_empty())
            .collect()
    }

    /// How many times this source walked a commit's tree (tests prove unchanged polls do not).
    pub fn tree_reads(&self) -> u64 {
        self.tree_reads.load(Ordering::Relaxed)
    }

    /// How many times this source negotiated with its remote (tests prove an unchanged poll of
    /// a repository on this host does not).
    pub fn negotiations(&self) -> u64 {
        self.negotiations.load(Ordering::Relaxed)
    }

    /// Negotiates refs with the remote and fetches the branch when its tip moved. Returns the
    /// branch's commit. Blocking.
    pub fn fetch(&self, interrupt: &AtomicBool) -> Result<CommitSha> {
        if let Some(tip) = self.unchanged_tip() {
            return Ok(tip);
        }
        let local_ref = format!("refs/heads/{}", self.options.branch);
        let repo = self.open_mirror_for_fetch()?;
        let local_tip = self.local_tip(&repo, &local_ref);
        let refspec = format!("+{local_ref}:{local_ref}");
        let (target, remote_tip) = self.negotiate(&repo, &[refspec], interrupt, |remote_refs| {
            let (target, remote_tip) = remote_refs
                .iter()
                .find_map(|reference| {
                    let (name, target, peeled) = reference.unpack();
                    (name == local_ref.as_str())
                        .then(|| target.map(|target| (target, peeled.unwrap_or(target))))
                })
                .flatten()
                .ok_or_else(|| Error::BranchNotFound {
                    url: self.url.clone(),
                    branch: self.options.branch.clone(),
                })?;
            // An unchanged tip needs no pack: this poll was one ref negotiation.
            Ok((
                (target.to_owned(), remote_tip.to_owned()),
                local_tip.as_deref() != Some(remote_tip),
            ))
        })?;
        let remote_git_dir = trigger::local_git_dir(&self.url);
        *crate::base::lock(&self.negotiated) = Some((target, remote_tip, remote_git_dir));
        Ok(CommitSha::new(remote_tip.to_hex().to_string()))
    }

    /// What `fetch` returns when it can answer from two ref files alone (see
    /// `unchanged_local_tip`): the branch's commit, unchanged since the last negotiation.
    /// `None`: only a fetch can say. Blocking (two small file reads).
    pub(crate) fn unchanged_tip(&self) -> Option<CommitSha> {
        let local_ref = format!("refs/heads/{}", self.options.branch);
        self.unchanged_local_tip(&local_ref)
            .map(|tip| CommitSha::new(tip.to_hex().to_string()))
    }

    /// For a repository on this host (a path or `file://`): the branch's commit when neither
    /// its ref nor the mirror's moved since this process's last negotiation, read from their
    /// ref files (a loose ref, else `packed-refs`) without starting `git upload-pack` or
    /// opening the mirror. `None` for any other remote, a moved, symbolic or missing ref, or
    /// a mirror started again since: the fetch negotiates then.
    fn unchanged_local_tip(&self, local_ref: &str) -> Option<gix::ObjectId> {
        let negotiated = crate::base::lock(&self.negotiated);
        let (target, tip, Some(remote)) = negotiated.as_ref()? else {
            return None;
        };
        let unchanged = |git_dir: &Path| ref_target(git_dir, local_ref) == Some(*target);
        (unchanged(remote) && unchanged(&self.mirror)).then_some(*tip)
    }

    /// The remote's branches matching `pattern` (a branch name, or a prefix ending in `*`)
    /// with their tips: one ref listing, no pack. For branch previews. Blocking.
    pub(crate) fn list_branches(
        &self,
        pattern: &str,
        interrupt: &AtomicBool,
    ) -> Result<Vec<(String, CommitSha)>> {
        let repo = self.open_mirror_for_fetch()?;
        let refspec = format!("refs/heads/{pattern}:refs/previews/{pattern}");
        let prefix = pattern.strip_suffix('*');
        self.negotiate(&repo, &[refspec], interrupt, |remote_refs| {
            let listed = remote_refs
                .iter()
                .filter_map(|reference| {
                    let (name, target, peeled) = reference.unpack();
                    let branch = std::str::from_utf8(name.as_ref())
                        .ok()?
                        .strip_prefix("refs/heads/")?;
                    let matches = match prefix {
                        Some(prefix) => branch.starts_with(prefix) && branch.len() > prefix.len(),
                        None => branch == pattern,
                    };
                    let tip = peeled.or(target)?;
                    matches.then(|| (branch.to_owned(), CommitSha::new(tip.to_hex().to_string())))
                })
                .take(crate::model::previews::MAX_LISTED)
                .collect();
            Ok((listed, false))
        })
    }

    /// Fetches every branch and tag, then resolves `rev` (a full commit SHA, a branch or a
    /// tag name) to a commit. For `plan --rev`. Blocking.
    pub(crate) fn fetch_rev(&self, rev: &str, interrupt: &AtomicBool) -> Result<CommitSha> {
        let repo = self.open_mirror_for_fetch()?;
        let refspecs = [
            "+refs/heads/*:refs/heads/*".to_owned(),
            "+refs/tags/*:refs/tags/*".to_owned(),
        ];
        self.negotiate(&repo, &refspecs, interrupt, |_| Ok(((), true)))?;
        let repo = self.open_mirror()?;
        let is_sha = rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit());
        let id = if is_sha {
            gix::ObjectId::from_hex(rev.as_bytes()).ok()
        } else {
            [format!("refs/heads/{rev}"), format!("refs/tags/{rev}")]
                .iter()
                .find_map(|name| {
                    let mut reference = repo.find_reference(name.as_str()).ok()?;
                    reference.peel_to_id().ok().map(|id| id.detach())
                })
        };
        let commit = id
            .and_then(|id| repo.find_commit(id).ok().map(|commit| commit.id))
            .ok_or_else(|| Error::RevNotFound {
                url: self.url.clone(),
                rev: rev.to_owned(),
            })?;
        Ok(CommitSha::new(commit.to_hex().to_string()))
    }

    /// Connects with `refspecs`, lets `decide` look at the remote's refs, and receives a pack
    /// when it says so (`fetch.rs`): the blobs this source's readers read, and every blob
    /// the mirror holds already. A pack that refers to a blob the mirror left out (a thin
    /// pack: the server takes the mirror to hold every object of its commits) cannot be
    /// indexed; the mirror is then fetched anew, once, which no such pack can refer to.
    fn negotiate<T>(
        &self,
        repo: &gix::Repository,
        refspecs: &[String],
        interrupt: &AtomicBool,
        decide: impl Fn(&[gix::protocol::handshake::Ref]) -> Result<(T, bool)>,
    ) -> Result<T> {
        self.negotiations.fetch_add(1, Ordering::Relaxed);
        match self.fetch_into(repo, refspecs, interrupt, &decide)? {
            Ok(value) => Ok(value),
            Err(left_out_base) => {
                tracing::warn!(
                    mirror = %self.mirror.display(),
                    error = %error_chain(&left_out_base),
                    "the server sent a change against a blob the mirror left out: fetching the mirror anew"
                );
                let repo = self.start_mirror_again(repo.clone())?;
                self.fetch_into(&repo, refspecs, interrupt, &decide)?
                    .map_err(|error| self.fetch_error(error_chain(&error)))
            }
        }
    }

    /// A failed fetch, with what ssh says when the remote is an ssh one.
    fn fetch_error(&self, message: String) -> Error {
        Error::Fetch {
            url: self.url.clone(),
            message: match ssh_diagnosis(&self.url, self.options.ssh_accept_new_host_keys) {
                Some(diagnosis) => format!("{message}: ssh says: {diagnosis}"),
                None => message,
            },
        }
    }

    /// One fetch into `repo` ([`Source::negotiate`]); `Ok(Err(_))` when the pack referred to a
    /// blob the mirror left out.
    fn fetch_into<T>(
        &self,
        repo: &gix::Repository,
        refspecs: &[String],
        interrupt: &AtomicBool,
        decide: &impl Fn(&[gix::protocol::handshake::Ref]) -> Result<(T, bool)>,
    ) -> Result<std::result::Result<T, gix::Error>> {
        // gix errors nest deeply ("transport handshake failed" over an I/O error over a TLS
        // error): keep the whole chain, so status shows the root cause.
        let via = if self.url.to_ascii_lowercase().starts_with("http") {
            let certificates = match &self.options.ca_file {
                Some(path) => ca_certificates(path)?,
                None => Vec::new(),
            };
            let tls = crate::model::tls::client_config_trusting(certificates)
                .map_err(|error| self.fetch_error(error.to_string()))?;
            fetch::Via::Http(
                http::Client::new(tls).map_err(|error| self.fetch_error(error.to_string()))?,
            )
        } else {
            fetch::Via::Gix(
                repo.transport_options(self.url.as_str(), None)
                    .map_err(|error| self.fetch_error(error_chain(&error)))?,
            )
        };
        let token = self.token()?;
        let token_user = token_user(&self.url);
        let authenticate = move |action| match (&token, action) {
            (Some(token), gix::credentials::helper::Action::Get(context)) => {
                Ok(Some(gix::credentials::protocol::Outcome {
                    identity: gix::sec::identity::Account {
                        username: token_user.clone(),
                        password: token.clone(),
                        oauth_refresh_token: None,
                    },
                    next: context.into(),
                }))
            }
            // Without a token there is nothing to answer the server's 401 with: say so, instead
            // of gix's "no credentials were returned".
            (None, gix::credentials::helper::Action::Get(_)) => {
                use gix::error::ErrorExt as _;
                Err(gix::error::message(
                    "the server asks for credentials (HTTP 401) and no --git-token-file is set",
                )
                .raise())
            }
            _ => Ok(None),
        };
        // The mirror's limit never shrinks: a reader of smaller blobs asks for what it holds
        // (`open_mirror_for_fetch` made sure that is at least what this source reads).
        let blob_limit = fetch::BlobLimit::of(repo.path()).or_else(|| self.blob_limit());
        let request = fetch::Request {
            url: &self.url,
            refspecs,
            via,
            blob_limit,
        };
        match fetch::fetch(repo, request, authenticate, interrupt, decide) {
            Ok(value) => Ok(Ok(value)),
            Err(fetch::Failure::Decide(error)) => Err(error),
            Err(fetch::Failure::Gix(_) | fetch::Failure::LeftOutBase(_))
                if interrupt.load(Ordering::Relaxed) =>
            {
                Err(Error::Interrupted)
            }
            Err(fetch::Failure::LeftOutBase(error)) => Ok(Err(error)),
            Err(fetch::Failure::Gix(error)) => Err(self.fetch_error(error_chain(&error))),
        }
    }

    /// The limit this source's fetches leave blobs out from: what its largest reader reads
    /// (a manifest, or `file()` at `SourceOptions::max_file_bytes`) is always fetched.
    fn blob_limit(&self) -> Option<fetch::BlobLimit> {
        fetch::BlobLimit::for_reads(
            self.options
                .max_file_bytes
                .max(crate::model::MAX_MANIFEST_BYTES),
        )
    }

    /// The mirror, ready for a fetch: started again when this source's readers read blobs
    /// larger than the ones its earlier fetches left out (`--max-file-size` was raised), so
    /// no reader meets a hole where a file should be.
    fn open_mirror_for_fetch(&self) -> Result<gix::Repository> {
        let repo = self.open_mirror()?;
        let Some(held) = fetch::BlobLimit::of(repo.path()) else {
            return Ok(repo);
        };
        if self.blob_limit().is_some_and(|wanted| wanted <= held) {
            return Ok(repo);
        }
        tracing::warn!(
            mirror = %self.mirror.display(),
            held = held.bytes(),
            "the mirror left out blobs this source now reads (a larger --max-file-size): fetching it again whole"
        );
        self.start_mirror_again(repo)
    }

    /// Removes the mirror (`repo`) and makes it again, empty: the next fetch brings it whole
    /// up to this source's blob limit.
    fn start_mirror_again(&self, repo: gix::Repository) -> Result<gix::Repository> {
        drop(repo);
        std::fs::remove_dir_all(&self.mirror).map_err(|error| Error::Mirror {
            path: self.mirror.clone(),
            message: error.to_string(),
        })?;
        self.open_mirror()
    }

    /// Reads every manifest file under the configured paths at `sha` that this host applies,
    /// from the mirror's object database (no worktree). Blocking.
    pub fn read_snapshot(&self, sha: &CommitSha) -> Result<Snapshot> {
        Ok(self.read_snapshot_with_ids(sha)?.0)
    }

    /// `read_snapshot`, with each file's blob id (`ids[i]` for `files[i]`), for
    /// `manifest::load_cached`. Blobs the previous read read are not decompressed again.
    /// Blocking.
    pub fn read_snapshot_with_ids(
        &self,
        sha: &CommitSha,
    ) -> Result<(Snapshot, Vec<Option<crate::model::BlobId>>)> {
        self.tree_reads.fetch_add(1, Ordering::Relaxed);
        let repo = self.open_mirror()?;
        let mut memo = crate::base::lock(&self.blob_memo);
        tree::read_snapshot(&repo, sha, &self.options.paths, &self.hosts, &mut memo)
    }

    /// Verifies the signatures `mode` asks for on the way to `tip`: the tip alone, or every
    /// commit since `since` (the last applied commit). `Ok(Err(_))` names the first commit
    /// that is not trusted and why. Blocking.
    pub fn verify(
        &self,
        keys: &TrustedKeys,
        mode: VerifyMode,
        since: Option<&CommitSha>,
        tip: &CommitSha,
    ) -> Result<std::result::Result<Verified, Untrusted>> {
        let repo = self.open_mirror()?;
        verify::verify(&repo, keys, mode, since, tip)
    }

    /// The files of commit `sha`, for `file()` and `env_file`. Blocking.
    pub fn files_at(&self, sha: &CommitSha) -> Result<CommitFiles> {
        CommitFiles::new(self.open_mirror()?, sha)
    }

    /// The trigger files of commit `sha` (`.voodu/**/*.yml`) and the refused ones
    /// (symlinks). Blocking.
    pub fn read_trigger_files(&self, sha: &CommitSha) -> Result<TriggerFiles> {
        tree::read_trigger_files(&self.open_mirror()?, sha)
    }

    /// The paths that differ between `from` and `to`; `None` when `from` is not an ancestor
    /// of `to` (or not in the mirror). Blocking.
    pub(crate) fn changed_paths(
        &self,
        from: &CommitSha,
        to: &CommitSha,
    ) -> Result<Option<Vec<String>>> {
        tree::changed_paths(&self.open_mirror()?, from, to)
    }

    /// The files of `manifests` (each at its own commit) for `file()`, other reads at
    /// `default`. Blocking.
    pub(crate) fn triggered_files(
        &self,
        default: &CommitSha,
        manifests: &[(String, CommitSha)],
    ) -> Result<TriggeredFiles> {
        TriggeredFiles::new(&self.open_mirror()?, default, manifests)
    }

    fn open_mirror(&self) -> Result<gix::Repository> {
        let mirror_error = |message: String| Error::Mirror {
            path: self.mirror.clone(),
            message,
        };
        let mut repo = if self.mirror.join("HEAD").exists() {
            gix::open(&self.mirror).map_err(|error| mirror_error(error_chain(&error)))?
        } else {
            init_mirror(&self.mirror).map_err(|error| mirror_error(error_chain(&error)))?;
            gix::open(&self.mirror).map_err(|error| mirror_error(error_chain(&error)))?
        };
        if let Some(command) = self.options.ssh_command() {
            // In memory only: the mirror's config file is not changed.
            let mut config = repo.config_snapshot_mut();
            config
                .set_value(&gix::config::tree::Core::SSH_COMMAND, command.as_str())
                .and_then(|_| config.set_value(&gix::config::tree::Ssh::VARIANT, "ssh"))
                .map_err(|error| mirror_error(error_chain(&error)))?;
        }
        Ok(repo)
    }

    fn local_tip(&self, repo: &gix::Repository, local_ref: &str) -> Option<gix::ObjectId> {
        let mut reference = repo.find_reference(local_ref).ok()?;
        reference.peel_to_id().ok().map(|id| id.detach())
    }

    fn token(&self) -> Result<Option<String>> {
        let Some(path) = &self.options.token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|source| Error::TokenFile {
            path: path.clone(),
            source,
        })?;
        Ok(Some(text.trim().to_owned()))
    }
}

/// The object the ref `name` of the repository at `git_dir` points at, from its ref files (a
/// loose ref, else `packed-refs`); `None` for a symbolic or missing ref, or a repository
/// keeping its refs elsewhere (a reftable).
fn ref_target(git_dir: &Path, name: &str) -> Option<gix::ObjectId> {
    if git_dir.join("reftable").exists() {
        return None;
    }
    let store = gix::refs::file::Store::at(git_dir.to_owned(), gix::hash::Kind::Sha1);
    match store.try_find(name).ok()??.target {
        gix::refs::Target::Object(id) => Some(id),
        gix::refs::Target::Symbolic(_) => None,
    }
}

/// Makes an empty bare repository at `path` holding only what a fetch uses: the object and ref
/// directories, a config, and `HEAD`, written last, so a start interrupted part way finds no
/// `HEAD` and makes it again. Not `gix::init_bare` (or `git init`): they also write 13 sample
/// hooks, a description and `info/exclude`, and probe the file system with scratch files; the
/// mirror runs no hook and has no work tree.
fn init_mirror(path: &Path) -> std::io::Result<()> {
    for dir in ["objects/pack", "refs/heads"] {
        std::fs::create_dir_all(path.join(dir))?;
    }
    std::fs::write(
        path.join("config"),
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n",
    )?;
    std::fs::write(path.join("HEAD"), "ref: refs/heads/main\n")
}

/// The user a token is sent as: the URL's (`https://USER@host/…`), else
/// [`DEFAULT_TOKEN_USER`].
pub(crate) fn token_user(url: &str) -> String {
    gix::url::parse(gix::bstr::BStr::new(url))
        .ok()
        .and_then(|parsed| parsed.user().map(ToOwned::to_owned))
        .filter(|user| !user.is_empty())
        .unwrap_or_else(|| DEFAULT_TOKEN_USER.to_owned())
}

/// `error` and every source under it, joined with `: `, so the root cause is never lost. A
/// source whose text its parent already quotes adds nothing and is skipped.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !cause_text.is_empty() && !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// For an ssh remote, what `ssh` itself says when asked to reach it (host key verification
/// failed, permission denied, …). gix's ssh transport prints that to the agent's stderr and
/// reports only "failed to fill whole buffer", so after a failed fetch the agent asks once
/// more, non-interactively and with nothing to send, and keeps ssh's words. `None` for other
/// remotes, or when ssh says nothing.
fn ssh_diagnosis(url: &str, accept_new_host_keys: bool) -> Option<String> {
    let parsed = gix::url::parse(gix::bstr::BStr::new(url)).ok()?;
    if parsed.scheme != gix::url::Scheme::Ssh {
        return None;
    }
    let host = parsed.host()?;
    let path = parsed.path.to_string();
    // Never let a URL smuggle an option to ssh or a quote into the remote command.
    if host.starts_with('-')
        || path.contains('\'')
        || parsed.user().is_some_and(|user| user.starts_with('-'))
    {
        return None;
    }
    let target = match parsed.user() {
        Some(user) => format!("{user}@{host}"),
        None => host.to_owned(),
    };
    let mut command = std::process::Command::new("ssh");
    command.args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]);
    if accept_new_host_keys {
        command.args(["-o", "StrictHostKeyChecking=accept-new"]);
    }
    if let Some(port) = parsed.port {
        command.arg("-p").arg(port.to_string());
    }
    let output = command
        .arg("--")
        .arg(target)
        .arg(format!("git-upload-pack '{path}'"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .ok()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .take(5)
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// URLs pass through; a plain path that exists locally becomes an absolute path.
fn normalize_url(url: &str) -> String {
    let looks_like_url = url.contains("://") || (url.contains('@') && url.contains(':'));
    if looks_like_url {
        return url.to_owned();
    }
    std::fs::canonicalize(url).map_or_else(|_| url.to_owned(), |path| path.display().to_string())
}

/// What names the repository at `url` (`model::repo_identity`), a local path made absolute.
pub(crate) fn repo_identity(url: &str) -> String {
    crate::model::repo_identity(&normalize_url(url.trim()))
}

#[cfg(test)]
mod tests {
    use super::{Source, SourceOptions, error_chain, repo_identity, token_user};

    #[test]
    fn one_repository_has_one_identity_whatever_its_url() {
        for url in [
            "https://github.com/Acme/Shop.git",
            "https://user@github.com/acme/shop",
            "ssh://git@github.com:22/acme/shop.git",
            "git@github.com:acme/shop.git",
            "https://github.com/acme/shop/",
        ] {
            assert_eq!(repo_identity(url), "github.com/acme/shop", "{url}");
        }
        assert_eq!(repo_identity("file:///srv/git/shop"), "/srv/git/shop");
        assert_eq!(repo_identity("/srv/git/nowhere/"), "/srv/git/nowhere");
        assert_ne!(
            repo_identity("https://github.com/acme/shop"),
            repo_identity("https://github.com/acme/blog")
        );
    }

    #[test]
    fn tokens_go_as_the_urls_user() {
        let cases = [
            (
                "https://gitlab+deploy-token-7@gitlab.example.com/ops/deploy.git",
                "gitlab+deploy-token-7",
            ),
            (
                "https://x-token-auth@bitbucket.org/team/repo.git",
                "x-token-auth",
            ),
            ("https://github.com/org/repo.git", "x-access-token"),
            ("not a url", "x-access-token"),
        ];
        for (url, user) in cases {
            assert_eq!(token_user(url), user, "{url}");
        }
    }

    #[test]
    fn a_token_over_plain_http_and_a_bad_ca_file_are_refused()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let options = |url: &str| SourceOptions {
            url: url.to_owned(),
            token_file: Some(dir.path().join("token")),
            ..SourceOptions::default()
        };
        let error = options("HTTP://git.example.org/r.git")
            .check()
            .expect_err("refused");
        assert!(error.to_string().contains("in clear text"), "{error}");
        assert!(options("https://git.example.org/r.git").check().is_ok());
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "not a certificate\n")?;
        let error = SourceOptions {
            ca_file: Some(not_pem),
            ..options("https://git.example.org/r.git")
        }
        .check()
        .expect_err("refused");
        assert!(error.to_string().contains("no PEM certificate"), "{error}");
        Ok(())
    }

    /// `--git-ssh-accept-new-host-keys` reaches gix as the ssh command it runs, in memory.
    #[test]
    fn accepting_new_host_keys_sets_the_ssh_command() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        for (accept, expected) in [(true, Some(super::SSH_ACCEPT_NEW)), (false, None)] {
            let source = Source::new(
                SourceOptions {
                    url: "ssh://git@example.org/r.git".to_owned(),
                    ssh_accept_new_host_keys: accept,
                    ..SourceOptions::default()
                },
                dir.path(),
            );
            let repo = source.open_mirror()?;
            let command = repo.ssh_connect_options()?.command;
            assert_eq!(
                command.as_deref().and_then(|command| command.to_str()),
                expected,
                "{accept}"
            );
        }
        // The mirror's config file is not changed.
        let config = std::fs::read_to_string(dir.path().join("repo.git/config"))?;
        assert!(!config.contains("accept-new"), "{config}");
        let key = dir.path().join("deploy_key");
        std::fs::write(&key, "not checked here")?;
        let options = SourceOptions {
            url: "ssh://git@example.org/r.git".to_owned(),
            ssh_key_file: Some(key.clone()),
            ssh_accept_new_host_keys: true,
            ..SourceOptions::default()
        };
        options.check()?;
        let source = Source::new(options, &dir.path().join("keyed"));
        let command = source.open_mirror()?.ssh_connect_options()?.command;
        assert_eq!(
            command.as_deref().and_then(|command| command.to_str()),
            Some(
                format!(
                    "ssh -i '{}' -o IdentitiesOnly=yes -o StrictHostKeyChecking=accept-new",
                    key.display()
                )
                .as_str()
            )
        );
        for bad in ["relative/key", "/tmp/it's"] {
            let options = SourceOptions {
                ssh_key_file: Some(bad.into()),
                ..SourceOptions::default()
            };
            assert!(options.check().is_err(), "{bad} accepted");
        }
        Ok(())
    }

    /// An error with a message and an optional source, like gix's nested errors.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1
                .as_deref()
                .map(|layer| layer as &(dyn std::error::Error + 'static))
        }
    }

    fn chain(messages: &[&'static str]) -> Layer {
        messages
            .iter()
            .rev()
            .fold(None, |source, message| {
                Some(Layer(message, source.map(Box::new)))
            })
            .expect("at least one message")
    }

    #[test]
    fn error_chain_keeps_the_root_cause() {
        let check = |messages: &[&'static str], expected: &str| {
            assert_eq!(error_chain(&chain(messages)), expected, "{messages:?}");
        };
        check(&["alone"], "alone");
        check(
            &[
                "Transport handshake failed",
                "An IO error occurred when talking to the server",
                "invalid peer certificate: UnknownIssuer",
            ],
            "Transport handshake failed: An IO error occurred when talking to the server: invalid peer certificate: UnknownIssuer",
        );
        // A parent that already quotes its source does not repeat it.
        check(
            &["cannot connect: refused", "refused", "os error 111"],
            "cannot connect: refused: os error 111",
        );
    }
}
