//! The restic executable, run by the agent: back up a directory or a stream into a restic
//! repository, restore or dump it, list, forget, check and unlock.
//!
//! `restic` knows nothing of manifests or Docker: it takes a [`Repo`] (the repository string and
//! the host file holding its password) and paths, and runs Debian's `restic` (0.14 in bookworm)
//! as a child process, through tokio.
//!
//! **Invariant:** the password reaches restic only as `RESTIC_PASSWORD_FILE` in the child's
//! environment, which is cleared first: the child sees `PATH`, `HOME`, `RESTIC_CACHE_DIR` and
//! `RESTIC_PASSWORD_FILE`, nothing the agent inherited. The password is never in an argument, a
//! log line or an error text.
//!
//! **Invariant:** every call has a deadline; past it the child is killed. The child also dies
//! with the agent (`PR_SET_PDEATHSIG`), so an agent killed with -9 leaves no restic behind, only
//! a stale lock, which [`Restic::unlock`] removes.
//!
//! Input is hostile: a repository, snapshot id, file name, tag or host beginning with `-` is
//! refused before anything runs (restic would read it as a flag), and values go after their flag
//! with `=`. What restic prints is bounded: the last 8 KiB of stderr for error texts, and stdout
//! read line by line with a bound on a line's length.
//!
//! restic 0.14's exit codes: 0 success, 1 a fatal error (no snapshot made), 3 `backup` could not
//! read some of its source files (the snapshot was made, incomplete); anything else is reported
//! with its code. Why a call failed is read from stderr: "wrong password or no key found", and
//! "Is there a repository at the following location?" for a repository that is not there.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// A restic repository and the host file holding its password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Repo {
    pub(crate) repository: String,
    pub(crate) password_file: PathBuf,
}

/// Retention: restic forget --keep-last/--keep-daily/--keep-weekly/--keep-monthly (0 = not passed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Keep {
    pub(crate) last: u32,
    pub(crate) daily: u32,
    pub(crate) weekly: u32,
    pub(crate) monthly: u32,
}

/// What one `restic backup` made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    /// The snapshot's short id (its first 8 hex digits, as restic's summary names it), which
    /// restic takes wherever an id goes.
    pub(crate) snapshot_id: String,
    /// restic's `total_bytes_processed`.
    pub(crate) bytes: u64,
    /// restic's `total_files_processed`.
    pub(crate) files: u64,
}

/// One snapshot as `restic snapshots --json` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub(crate) struct Snapshot {
    pub(crate) id: String,
    pub(crate) time: String,
    #[serde(default)]
    pub(crate) tags: Vec<String>,
    #[serde(default)]
    pub(crate) paths: Vec<String>,
}

/// Running restic failed. Each variant names the command and the repository (with any password
/// in its URL replaced by `***`); none carries the repository's password.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(
        "restic is not installed ({binary} not found): install Debian's `restic` package (apt-get install restic)"
    )]
    BinaryMissing { binary: PathBuf },
    #[error("cannot start restic {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("restic password file {path}: {message}")]
    PasswordFile { path: PathBuf, message: String },
    /// The host policy refuses a host path restic would be handed (a local repository, the
    /// password file), judged on its final form (folded, symlinks resolved).
    #[error("restic {what} {path}: {refusal}")]
    HostPolicy {
        what: &'static str,
        path: String,
        refusal: String,
    },
    #[error("restic {what} {value:?} refused: {reason}")]
    Refused {
        what: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("restic {command} source {path}: {message}")]
    Source {
        command: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("restic {command} on {repository}: wrong password or no key found")]
    WrongPassword {
        command: &'static str,
        repository: String,
    },
    #[error("restic {command}: no repository at {repository}, or it cannot be reached: {stderr}")]
    RepoUnavailable {
        command: &'static str,
        repository: String,
        stderr: String,
    },
    #[error("restic {command} on {repository} timed out after {after:?} and was killed")]
    Timeout {
        command: &'static str,
        repository: String,
        after: Duration,
    },
    #[error(
        "restic backup on {repository} could not read some source files (exit code 3): snapshot {snapshot_id} is incomplete: {stderr}"
    )]
    Incomplete {
        repository: String,
        snapshot_id: String,
        stderr: String,
    },
    #[error("restic {command} on {repository} failed with {status}: {stderr}")]
    Failed {
        command: &'static str,
        repository: String,
        status: String,
        stderr: String,
    },
    #[error("restic {command} on {repository}: unexpected output: {message}")]
    Output {
        command: &'static str,
        repository: String,
        message: String,
    },
    #[error("restic {command} on {repository}: {what}: {source}")]
    Io {
        command: &'static str,
        repository: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The restic binary and the cache directory every run uses (also the child's `HOME`).
#[derive(Debug, Clone)]
pub(crate) struct Restic {
    binary: PathBuf,
    cache_dir: PathBuf,
    /// The host policy every host path restic is handed passes (`guarded`); none in tests
    /// of this module.
    gate: Option<std::sync::Arc<PathGate>>,
    /// Repositories `prepare` checked and unlocked in this process (shared by clones).
    prepared: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

/// The host policy's bind rules, with the agent's own paths, judging restic's host paths.
#[derive(Debug)]
struct PathGate {
    policy: crate::model::policy::Policy,
    owned: crate::model::policy::OwnedPaths,
}

impl PathGate {
    /// `path` as a bind mount's source would be judged: absolute, folded, symlinks resolved.
    fn judge(&self, what: &'static str, path: &str) -> Result<(), Error> {
        use crate::model::policy::{normalize_path, resolve_on_host};
        let refuse = |refusal: String| Error::HostPolicy {
            what,
            path: path.to_owned(),
            refusal,
        };
        let folded =
            normalize_path(path).ok_or_else(|| refuse("not an absolute path".to_owned()))?;
        match self
            .policy
            .resolved_bind_refusal(&folded, &self.owned, |folded| {
                resolve_on_host(Path::new(folded))
            }) {
            Some(refusal) => Err(refuse(refusal)),
            None => Ok(()),
        }
    }
}

/// How much of restic's stderr an error keeps: the end, where restic says why it stopped.
const STDERR_TAIL: usize = 8 * 1024;
/// The longest stdout line read: `snapshots --json` and `forget --json` print one JSON array on
/// one line, about 400 bytes a snapshot, so this holds tens of thousands. A longer line is
/// dropped (and the call then fails for want of its output), never buffered without end.
const MAX_LINE: usize = 16 * 1024 * 1024;
/// The child's `PATH`: fixed, not the agent's (sftp: repositories run `ssh` from it).
const CHILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Restic {
    pub(crate) fn new(binary: impl Into<PathBuf>, cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            cache_dir: cache_dir.into(),
            gate: None,
            prepared: std::sync::Arc::default(),
        }
    }

    /// Every call judges the host paths it hands restic (the password file, a local
    /// repository) with `policy`'s bind rules first, on their final form: what a manifest
    /// named passed the manifest stage, but a symlink may have moved since.
    pub(crate) fn guarded(
        mut self,
        policy: crate::model::policy::Policy,
        owned: crate::model::policy::OwnedPaths,
    ) -> Self {
        self.gate = Some(std::sync::Arc::new(PathGate { policy, owned }));
        self
    }

    /// Once per repository in this process: [`Self::ensure_repo`], then [`Self::unlock`] (the
    /// stale locks an agent killed with -9 left). Each opens the repository (its key
    /// derivation, about half a second); after a failure of any call on the repository,
    /// [`Self::forget_prepared`] makes the next `prepare` do both again.
    pub(crate) async fn prepare(&self, repo: &Repo, deadline: Duration) -> Result<(), Error> {
        if crate::base::lock(&self.prepared).contains(&repo.repository) {
            return Ok(());
        }
        let started = Instant::now();
        self.ensure_repo(repo, deadline).await?;
        self.unlock(repo, remaining(deadline, started)).await?;
        crate::base::lock(&self.prepared).insert(repo.repository.clone());
        Ok(())
    }

    /// The next [`Self::prepare`] of `repo` checks and unlocks it again.
    pub(crate) fn forget_prepared(&self, repo: &Repo) {
        crate::base::lock(&self.prepared).remove(&repo.repository);
    }

    /// Initialises the repository when none is there (never over an existing one: a wrong
    /// password is an error, not a reason to init).
    pub(crate) async fn ensure_repo(&self, repo: &Repo, deadline: Duration) -> Result<(), Error> {
        let started = Instant::now();
        // `cat config` needs the key: it tells "there, and the password opens it" from "there,
        // wrong password" from "not there".
        match self
            .run(repo, "cat", args(["cat", "config"]), Io::none(), deadline)
            .await
        {
            Ok(_) => Ok(()),
            Err(Error::RepoUnavailable { .. }) => {
                // restic init itself refuses to write over an existing repository.
                self.run(
                    repo,
                    "init",
                    args(["init"]),
                    Io::none(),
                    remaining(deadline, started),
                )
                .await
                .map(drop)
            }
            Err(error) => Err(error),
        }
    }

    /// `restic backup` of the *contents* of `dir`: run in `dir` on `.`, so that [`Self::restore`]
    /// puts back exactly dir's contents at its target, with no absolute path prefix. `tags` are
    /// passed as `--tag`, `host` as `--host`.
    pub(crate) async fn backup_dir(
        &self,
        repo: &Repo,
        dir: &Path,
        tags: &[String],
        host: &str,
        deadline: Duration,
    ) -> Result<Summary, Error> {
        match std::fs::metadata(dir) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => {
                return Err(Error::Source {
                    command: "backup",
                    path: dir.to_owned(),
                    message: "not a directory".to_owned(),
                });
            }
            Err(error) => {
                return Err(Error::Source {
                    command: "backup",
                    path: dir.to_owned(),
                    message: error.to_string(),
                });
            }
        }
        let mut arguments = args(["backup", "--json"]);
        push_tags_and_host(&mut arguments, tags, host)?;
        arguments.push(".".into());
        let mut io = Io::none();
        io.cwd = Some(dir);
        let outcome = self.run(repo, "backup", arguments, io, deadline).await;
        self.summarise(repo, outcome)
    }

    /// `restic backup --stdin --stdin-filename <filename>` fed from `input` until EOF.
    pub(crate) async fn backup_stdin(
        &self,
        repo: &Repo,
        filename: &str,
        tags: &[String],
        host: &str,
        mut input: impl AsyncRead + Send + Unpin,
        deadline: Duration,
    ) -> Result<Summary, Error> {
        refuse_flag("file name", filename)?;
        let mut arguments = args(["backup", "--json", "--stdin"]);
        arguments.push(format!("--stdin-filename={filename}").into());
        push_tags_and_host(&mut arguments, tags, host)?;
        let mut io = Io::none();
        io.input = Some(&mut input);
        let outcome = self.run(repo, "backup", arguments, io, deadline).await;
        self.summarise(repo, outcome)
    }

    /// Restores snapshot `id` into `target` (an empty directory): afterwards target holds what
    /// [`Self::backup_dir`] read from its dir, byte for byte, with modes and times.
    pub(crate) async fn restore(
        &self,
        repo: &Repo,
        id: &str,
        target: &Path,
        deadline: Duration,
    ) -> Result<(), Error> {
        refuse_flag("snapshot id", id)?;
        let mut target_argument = OsString::from("--target=");
        target_argument.push(target);
        let mut arguments = args(["restore"]);
        arguments.push(target_argument);
        arguments.push("--".into());
        arguments.push(id.into());
        self.run(repo, "restore", arguments, Io::none(), deadline)
            .await
            .map(drop)
    }

    /// `restic dump <id> <filename>` streamed into `output` (restores a stdin backup). On an
    /// error `output` may have had part of the file already.
    pub(crate) async fn dump(
        &self,
        repo: &Repo,
        id: &str,
        filename: &str,
        mut output: impl AsyncWrite + Send + Unpin,
        deadline: Duration,
    ) -> Result<(), Error> {
        refuse_flag("snapshot id", id)?;
        refuse_flag("file name", filename)?;
        let mut arguments = args(["dump", "--"]);
        arguments.push(id.into());
        arguments.push(filename.into());
        let mut io = Io::none();
        io.output = Some(&mut output);
        self.run(repo, "dump", arguments, io, deadline).await?;
        output.flush().await.map_err(|source| Error::Io {
            command: "dump",
            repository: redact(&repo.repository),
            what: "writing the dumped file",
            source,
        })
    }

    /// Snapshots carrying every tag in `tags` (restic `--tag a,b` semantics), oldest first.
    pub(crate) async fn snapshots(
        &self,
        repo: &Repo,
        tags: &[String],
        deadline: Duration,
    ) -> Result<Vec<Snapshot>, Error> {
        let mut arguments = args(["snapshots", "--json"]);
        if !tags.is_empty() {
            check_tags(tags)?;
            arguments.push(format!("--tag={}", tags.join(",")).into());
        }
        let lines = self
            .run(repo, "snapshots", arguments, Io::none(), deadline)
            .await?;
        let mut snapshots: Vec<Snapshot> = parse_array(repo, "snapshots", &lines)?;
        sort_oldest_first(&mut snapshots);
        Ok(snapshots)
    }

    /// `restic forget --tag … --keep-… --group-by tags --prune` for the snapshots carrying
    /// every tag in `tags`; returns the ids removed. A `Keep` of all zeros forgets nothing
    /// (without running restic); empty `tags` are refused (that would be every snapshot).
    ///
    /// `--group-by tags`: `--tag` picks the snapshots carrying these tags, and grouping by the
    /// whole tag set applies the policy to each set apart, so snapshots that carry these tags
    /// and others form groups of their own, and no other tags' snapshots count. Host and paths
    /// are left out of the grouping: the same backup from a renamed host or a moved directory
    /// (a `backup_dir` records its absolute path) stays one series under one policy.
    pub(crate) async fn forget(
        &self,
        repo: &Repo,
        tags: &[String],
        keep: Keep,
        deadline: Duration,
    ) -> Result<Vec<String>, Error> {
        if keep == Keep::default() {
            return Ok(Vec::new());
        }
        if tags.is_empty() {
            return Err(Error::Refused {
                what: "forget tags",
                value: String::new(),
                reason: "no tags would forget across every snapshot in the repository",
            });
        }
        check_tags(tags)?;
        let mut arguments = args(["forget", "--json", "--group-by=tags", "--prune"]);
        arguments.push(format!("--tag={}", tags.join(",")).into());
        for (flag, count) in [
            ("last", keep.last),
            ("daily", keep.daily),
            ("weekly", keep.weekly),
            ("monthly", keep.monthly),
        ] {
            if count > 0 {
                arguments.push(format!("--keep-{flag}={count}").into());
            }
        }
        let lines = self
            .run(repo, "forget", arguments, Io::none(), deadline)
            .await?;
        #[derive(serde::Deserialize)]
        struct Group {
            #[serde(default)]
            remove: Option<Vec<Snapshot>>,
        }
        // `--prune` prints its report after the JSON, on the same stdout.
        let groups: Vec<Group> = parse_array(repo, "forget", &lines)?;
        Ok(groups
            .into_iter()
            .flat_map(|group| group.remove.unwrap_or_default())
            .map(|snapshot| snapshot.id)
            .collect())
    }

    /// `restic check --read-data-subset=1%`: the structure, and 1% of the data packs read back
    /// (restic 0.14 has `--read-data-subset`; a random 1% each run covers the repository over
    /// time without reading all of it every time).
    pub(crate) async fn check(&self, repo: &Repo, deadline: Duration) -> Result<(), Error> {
        self.run(
            repo,
            "check",
            args(["check", "--read-data-subset=1%"]),
            Io::none(),
            deadline,
        )
        .await
        .map(drop)
    }

    /// `restic unlock`: removes only stale locks (a process that died, e.g. an agent killed with
    /// -9, leaves one); without `--remove-all`, a live process's lock stays.
    pub(crate) async fn unlock(&self, repo: &Repo, deadline: Duration) -> Result<(), Error> {
        self.run(repo, "unlock", args(["unlock"]), Io::none(), deadline)
            .await
            .map(drop)
    }

    /// Turns a backup's output into a [`Summary`]. The summary line names the snapshot by its
    /// short id (restic 0.14: the first 8 hex digits), which every restic command takes in
    /// its place; looking up the full id would open the repository once more (its key
    /// derivation, about half a second) for every snapshot.
    fn summarise(
        &self,
        repo: &Repo,
        outcome: Result<Vec<String>, Error>,
    ) -> Result<Summary, Error> {
        let (lines, incomplete) = match outcome {
            Ok(lines) => (lines, None),
            Err(Error::Failed { status, stderr, .. }) if status == exit_code_text(3) => {
                (Vec::new(), Some(stderr))
            }
            Err(error) => return Err(error),
        };
        #[derive(serde::Deserialize)]
        struct Line {
            message_type: String,
            #[serde(default)]
            snapshot_id: String,
            #[serde(default)]
            total_bytes_processed: u64,
            #[serde(default)]
            total_files_processed: u64,
        }
        let summary = lines
            .iter()
            .rev()
            .filter_map(|line| serde_json::from_str::<Line>(line).ok())
            .find(|line| line.message_type == "summary" && !line.snapshot_id.is_empty());
        if let Some(stderr) = incomplete {
            return Err(Error::Incomplete {
                repository: redact(&repo.repository),
                snapshot_id: summary.map(|line| line.snapshot_id).unwrap_or_default(),
                stderr,
            });
        }
        let Some(summary) = summary else {
            return Err(Error::Output {
                command: "backup",
                repository: redact(&repo.repository),
                message: "no summary line with a snapshot id".to_owned(),
            });
        };
        refuse_flag("snapshot id", &summary.snapshot_id)?;
        Ok(Summary {
            snapshot_id: summary.snapshot_id,
            bytes: summary.total_bytes_processed,
            files: summary.total_files_processed,
        })
    }

    /// Runs restic with `arguments` on `repo` under `deadline`; returns stdout's lines (none
    /// when `io.output` takes stdout).
    async fn run(
        &self,
        repo: &Repo,
        command: &'static str,
        arguments: Vec<OsString>,
        io: Io<'_>,
        deadline: Duration,
    ) -> Result<Vec<String>, Error> {
        let repository = redact(&repo.repository);
        refuse_flag("repository", &repository)?;
        if let Some(gate) = &self.gate {
            gate.judge("password file", &repo.password_file.to_string_lossy())?;
            let local = repo
                .repository
                .strip_prefix("local:")
                .unwrap_or(&repo.repository);
            if local.starts_with('/') {
                gate.judge("repository", local)?;
            }
        }
        match std::fs::metadata(&repo.password_file) {
            Ok(metadata) if metadata.is_file() => {}
            Ok(_) => {
                return Err(Error::PasswordFile {
                    path: repo.password_file.clone(),
                    message: "not a regular file".to_owned(),
                });
            }
            Err(error) => {
                return Err(Error::PasswordFile {
                    path: repo.password_file.clone(),
                    message: error.to_string(),
                });
            }
        }
        let io_error = |what: &'static str| {
            let repository = repository.clone();
            move |source| Error::Io {
                command,
                repository,
                what,
                source,
            }
        };
        // A stat and a mkdir: one system call each, not worth a blocking task.
        std::fs::create_dir_all(&self.cache_dir)
            .map_err(io_error("creating the cache directory"))?;

        let mut child_command = tokio::process::Command::new(&self.binary);
        let mut repository_argument = OsString::from("--repo=");
        repository_argument.push(&repo.repository);
        child_command
            .arg(repository_argument)
            .args(&arguments)
            .env_clear()
            .env("PATH", CHILD_PATH)
            .env("HOME", &self.cache_dir)
            .env("RESTIC_CACHE_DIR", &self.cache_dir)
            .env("RESTIC_PASSWORD_FILE", &repo.password_file)
            .stdin(if io.input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = io.cwd {
            child_command.current_dir(dir);
        }
        let parent = std::process::id();
        // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
        // calls are allowed: prctl and getppid are plain system calls, and the errors are built
        // from an errno without allocating.
        unsafe {
            child_command.pre_exec(move || {
                // restic dies with the thread that spawned it: tokio's worker threads live as
                // long as the runtime, and the agent's runtime as long as the process.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The agent died between fork and prctl: no signal will come.
                if u32::try_from(libc::getppid()).ok() != Some(parent) {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let mut child = match child_command.spawn() {
            Ok(child) => child,
            Err(source)
                if source.kind() == std::io::ErrorKind::NotFound && !self.binary.exists() =>
            {
                return Err(Error::BinaryMissing {
                    binary: self.binary.clone(),
                });
            }
            Err(source) => {
                return Err(Error::Spawn {
                    binary: self.binary.clone(),
                    source,
                });
            }
        };
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let Io { input, output, .. } = io;

        let work = async {
            let feed = async {
                if let (Some(input), Some(mut stdin)) = (input, stdin) {
                    // restic stopping early (a wrong password) breaks the pipe: its exit status
                    // says why, so a write error here is not the error reported.
                    let fed = tokio::io::copy(input, &mut stdin).await;
                    drop(stdin);
                    return fed.map(drop);
                }
                Ok(())
            };
            let read_stdout = async {
                let Some(stdout) = stdout else {
                    return Ok(Vec::new());
                };
                match output {
                    Some(output) => {
                        tokio::io::copy(&mut BufReader::new(stdout), output).await?;
                        Ok(Vec::new())
                    }
                    None => read_lines(stdout).await,
                }
            };
            let read_stderr = async {
                match stderr {
                    Some(stderr) => tail(stderr).await,
                    None => Ok(String::new()),
                }
            };
            let (fed, lines, stderr_tail) = tokio::join!(feed, read_stdout, read_stderr);
            let status = child.wait().await;
            (fed, lines, stderr_tail, status)
        };
        let (fed, lines, stderr_tail, status) = match tokio::time::timeout(deadline, work).await {
            Ok(done) => done,
            Err(_) => {
                // kill_on_drop would do it too, but not before this returns.
                let _ = child.kill().await;
                return Err(Error::Timeout {
                    command,
                    repository,
                    after: deadline,
                });
            }
        };
        let status = status.map_err(io_error("waiting for restic"))?;
        let stderr_tail = stderr_tail.map_err(io_error("reading restic's stderr"))?;
        if !status.success() {
            return Err(classify(command, repository, status, stderr_tail));
        }
        fed.map_err(io_error("feeding restic's stdin"))?;
        lines.map_err(io_error("reading restic's stdout"))
    }
}

/// What a run reads from and writes to beside its arguments.
struct Io<'a> {
    cwd: Option<&'a Path>,
    input: Option<&'a mut (dyn AsyncRead + Send + Unpin)>,
    output: Option<&'a mut (dyn AsyncWrite + Send + Unpin)>,
}

impl Io<'_> {
    fn none() -> Self {
        Self {
            cwd: None,
            input: None,
            output: None,
        }
    }
}

fn args<const N: usize>(words: [&str; N]) -> Vec<OsString> {
    words.into_iter().map(OsString::from).collect()
}

fn remaining(deadline: Duration, started: Instant) -> Duration {
    deadline.saturating_sub(started.elapsed())
}

/// A value beginning with `-` would be read as a flag where it goes as a separate argument.
fn refuse_flag(what: &'static str, value: &str) -> Result<(), Error> {
    if value.starts_with('-') {
        return Err(Error::Refused {
            what,
            value: value.to_owned(),
            reason: "it begins with '-'",
        });
    }
    if value.is_empty() {
        return Err(Error::Refused {
            what,
            value: String::new(),
            reason: "it is empty",
        });
    }
    Ok(())
}

/// restic splits a `--tag` value at commas: a tag holding one would be two.
fn check_tags(tags: &[String]) -> Result<(), Error> {
    for tag in tags {
        refuse_flag("tag", tag)?;
        if tag.contains(',') {
            return Err(Error::Refused {
                what: "tag",
                value: tag.clone(),
                reason: "restic splits tags at ','",
            });
        }
    }
    Ok(())
}

fn push_tags_and_host(
    arguments: &mut Vec<OsString>,
    tags: &[String],
    host: &str,
) -> Result<(), Error> {
    check_tags(tags)?;
    refuse_flag("host", host)?;
    for tag in tags {
        arguments.push(format!("--tag={tag}").into());
    }
    arguments.push(format!("--host={host}").into());
    Ok(())
}

/// The repository as errors show it: a password in a URL's user info becomes `***`
/// (`rest:https://user:secret@host/` → `rest:https://user:***@host/`).
fn redact(repository: &str) -> String {
    let Some(scheme_end) = repository.find("://") else {
        return repository.to_owned();
    };
    let authority_start = scheme_end + 3;
    let authority_end = repository[authority_start..]
        .find('/')
        .map_or(repository.len(), |end| authority_start + end);
    let authority = &repository[authority_start..authority_end];
    let Some(at) = authority.rfind('@') else {
        return repository.to_owned();
    };
    let Some(colon) = authority[..at].find(':') else {
        return repository.to_owned();
    };
    format!(
        "{}{}:***{}",
        &repository[..authority_start],
        &authority[..colon],
        &repository[authority_start + at..]
    )
}

fn exit_code_text(code: i32) -> String {
    format!("exit code {code}")
}

fn classify(
    command: &'static str,
    repository: String,
    status: std::process::ExitStatus,
    stderr: String,
) -> Error {
    if stderr.contains("wrong password or no key found") {
        return Error::WrongPassword {
            command,
            repository,
        };
    }
    if stderr.contains("Is there a repository at the following location?") {
        return Error::RepoUnavailable {
            command,
            repository,
            stderr,
        };
    }
    let status = match status.code() {
        Some(code) => exit_code_text(code),
        None => {
            use std::os::unix::process::ExitStatusExt;
            format!("signal {}", status.signal().unwrap_or_default())
        }
    };
    Error::Failed {
        command,
        repository,
        status,
        stderr,
    }
}

/// Parses the first stdout line that is a JSON array (`forget --prune` prints text after it).
fn parse_array<T: serde::de::DeserializeOwned>(
    repo: &Repo,
    command: &'static str,
    lines: &[String],
) -> Result<Vec<T>, Error> {
    let Some(line) = lines.iter().find(|line| line.starts_with('[')) else {
        return Err(Error::Output {
            command,
            repository: redact(&repo.repository),
            message: "no JSON array".to_owned(),
        });
    };
    serde_json::from_str(line).map_err(|error| Error::Output {
        command,
        repository: redact(&repo.repository),
        message: error.to_string(),
    })
}

fn sort_oldest_first(snapshots: &mut [Snapshot]) {
    snapshots.sort_by_cached_key(|snapshot| snapshot.time.parse::<jiff::Timestamp>().ok());
}

/// stdout's lines, each at most [`MAX_LINE`] bytes (a longer one is dropped), without their
/// `\n`; `backup --json`'s status lines are dropped as they come, the rest kept.
async fn read_lines(stdout: impl AsyncRead + Unpin) -> std::io::Result<Vec<String>> {
    let mut reader = BufReader::new(stdout);
    let mut lines = Vec::new();
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            break;
        }
        let (chunk, ended) = match buffer.iter().position(|byte| *byte == b'\n') {
            Some(end) => (&buffer[..end], Some(end + 1)),
            None => (buffer, None),
        };
        if line.len() + chunk.len() > MAX_LINE {
            too_long = true;
            line.clear();
        } else if !too_long {
            line.extend_from_slice(chunk);
        }
        let consumed = ended.unwrap_or(buffer.len());
        reader.consume(consumed);
        if ended.is_some() {
            if !too_long {
                keep_line(&mut lines, &line);
            }
            line.clear();
            too_long = false;
        }
    }
    if !too_long && !line.is_empty() {
        keep_line(&mut lines, &line);
    }
    Ok(lines)
}

fn keep_line(lines: &mut Vec<String>, line: &[u8]) {
    // A long backup prints a status line several times a second: keeping them would grow
    // without bound.
    if line.starts_with(br#"{"message_type":"status""#) {
        return;
    }
    lines.push(String::from_utf8_lossy(line).into_owned());
}

/// The last [`STDERR_TAIL`] bytes of stderr, read to its end.
async fn tail(mut stderr: impl AsyncRead + Unpin) -> std::io::Result<String> {
    let mut kept: Vec<u8> = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n_read = stderr.read(&mut buffer).await?;
        if n_read == 0 {
            break;
        }
        kept.extend_from_slice(&buffer[..n_read]);
        if kept.len() > STDERR_TAIL {
            kept.drain(..kept.len() - STDERR_TAIL);
        }
    }
    Ok(String::from_utf8_lossy(&kept).trim().to_owned())
}

#[cfg(test)]
mod tests {
    //! Real restic (Debian's, scripts/test-deps installs it) on repositories in temp dirs.

    use super::*;
    use std::os::unix::fs::PermissionsExt;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    const DEADLINE: Duration = Duration::from_secs(60);
    const PASSWORD: &str = "correct horse battery staple";

    /// A repository path (not yet initialised), its password file and a restic with a cache.
    struct Fixture {
        scratch: tempfile::TempDir,
        restic: Restic,
        repo: Repo,
    }

    impl Fixture {
        fn new() -> Result<Self, Box<dyn std::error::Error>> {
            let binary = Path::new("/usr/bin/restic");
            if !binary.exists() {
                return Err(
                    "restic is not installed (/usr/bin/restic): run scripts/test-deps".into(),
                );
            }
            let scratch = tempfile::tempdir()?;
            let password_file = scratch.path().join("password");
            std::fs::write(&password_file, PASSWORD)?;
            let restic = Restic::new(binary, scratch.path().join("cache"));
            let repo = Repo {
                repository: scratch.path().join("repo").display().to_string(),
                password_file,
            };
            Ok(Self {
                scratch,
                restic,
                repo,
            })
        }

        async fn initialised() -> Result<Self, Box<dyn std::error::Error>> {
            let fixture = Self::new()?;
            fixture.restic.ensure_repo(&fixture.repo, DEADLINE).await?;
            Ok(fixture)
        }

        fn path(&self, name: &str) -> PathBuf {
            self.scratch.path().join(name)
        }
    }

    fn tags(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    /// One entry of a tree: relative path, mode, mtime (seconds), and a file's contents.
    type Entry = (PathBuf, u32, i64, Vec<u8>);

    /// Every entry under `root`, sorted.
    fn tree(root: &Path) -> std::io::Result<Vec<Entry>> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<Entry>) -> std::io::Result<()> {
            for entry in std::fs::read_dir(dir)? {
                let path = entry?.path();
                let metadata = std::fs::symlink_metadata(&path)?;
                let relative = path.strip_prefix(root).map_err(std::io::Error::other)?;
                let contents = if metadata.is_file() {
                    std::fs::read(&path)?
                } else {
                    Vec::new()
                };
                use std::os::unix::fs::MetadataExt;
                out.push((
                    relative.to_owned(),
                    metadata.mode(),
                    metadata.mtime(),
                    contents,
                ));
                if metadata.is_dir() {
                    walk(root, &path, out)?;
                }
            }
            Ok(())
        }
        let mut out = Vec::new();
        walk(root, root, &mut out)?;
        out.sort_unstable();
        Ok(out)
    }

    #[tokio::test]
    async fn a_directory_restores_byte_for_byte_with_modes() -> TestResult {
        let fixture = Fixture::initialised().await?;
        let source = fixture.path("source");
        std::fs::create_dir_all(source.join("nested/deeper"))?;
        std::fs::write(source.join("top.txt"), "top\n")?;
        std::fs::write(source.join("nested/secret.key"), [0u8, 1, 2, 255])?;
        std::fs::write(source.join("nested/deeper/run.sh"), "#!/bin/sh\n")?;
        std::fs::set_permissions(
            source.join("nested/secret.key"),
            std::fs::Permissions::from_mode(0o600),
        )?;
        std::fs::set_permissions(
            source.join("nested/deeper/run.sh"),
            std::fs::Permissions::from_mode(0o755),
        )?;
        std::fs::set_permissions(
            source.join("nested"),
            std::fs::Permissions::from_mode(0o750),
        )?;

        let summary = fixture
            .restic
            .backup_dir(
                &fixture.repo,
                &source,
                &tags(&["volume"]),
                "host-a",
                DEADLINE,
            )
            .await?;
        assert_eq!(summary.snapshot_id.len(), 8, "the short id: {summary:?}");
        assert_eq!(summary.files, 3);
        assert_eq!(summary.bytes, 4 + 4 + 10);

        let target = fixture.path("target");
        std::fs::create_dir(&target)?;
        fixture
            .restic
            .restore(&fixture.repo, &summary.snapshot_id, &target, DEADLINE)
            .await?;
        assert_eq!(tree(&target)?, tree(&source)?);

        let listed = fixture
            .restic
            .snapshots(&fixture.repo, &tags(&["volume"]), DEADLINE)
            .await?;
        assert_eq!(listed.len(), 1);
        assert!(listed[0].id.starts_with(&summary.snapshot_id), "{listed:?}");
        assert_eq!(listed[0].tags, tags(&["volume"]));
        Ok(())
    }

    #[tokio::test]
    async fn a_stdin_backup_dumps_back_the_same_bytes() -> TestResult {
        let fixture = Fixture::initialised().await?;
        let input: Vec<u8> = (0..200_000u32).flat_map(|n| n.to_le_bytes()).collect();
        let summary = fixture
            .restic
            .backup_stdin(
                &fixture.repo,
                "db.dump",
                &tags(&["postgres", "app"]),
                "host-a",
                input.as_slice(),
                DEADLINE,
            )
            .await?;
        assert_eq!(summary.bytes, input.len() as u64);
        let mut output = Vec::new();
        fixture
            .restic
            .dump(
                &fixture.repo,
                &summary.snapshot_id,
                "db.dump",
                &mut output,
                DEADLINE,
            )
            .await?;
        assert!(output == input, "the dump differs from what was backed up");
        Ok(())
    }

    #[tokio::test]
    async fn a_wrong_password_is_its_own_error_and_never_shown() -> TestResult {
        let fixture = Fixture::initialised().await?;
        let wrong = fixture.path("wrong-password");
        std::fs::write(&wrong, "hunter2-not-it")?;
        let repo = Repo {
            password_file: wrong,
            ..fixture.repo.clone()
        };
        let error = fixture
            .restic
            .snapshots(&repo, &[], DEADLINE)
            .await
            .err()
            .ok_or("snapshots with a wrong password succeeded")?;
        assert!(matches!(error, Error::WrongPassword { .. }), "{error:?}");
        let text = format!("{error} {error:?}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains(PASSWORD), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn ensure_repo_inits_once_and_never_over_a_wrong_password() -> TestResult {
        let fixture = Fixture::new()?;
        fixture.restic.ensure_repo(&fixture.repo, DEADLINE).await?;
        assert!(fixture.path("repo/config").is_file());
        // Again: already there, nothing to do.
        fixture.restic.ensure_repo(&fixture.repo, DEADLINE).await?;
        let config_before = std::fs::read(fixture.path("repo/config"))?;

        let wrong = fixture.path("wrong-password");
        std::fs::write(&wrong, "not the password")?;
        let repo = Repo {
            password_file: wrong,
            ..fixture.repo.clone()
        };
        let error = fixture
            .restic
            .ensure_repo(&repo, DEADLINE)
            .await
            .err()
            .ok_or("ensure_repo with a wrong password succeeded")?;
        assert!(matches!(error, Error::WrongPassword { .. }), "{error:?}");
        assert_eq!(std::fs::read(fixture.path("repo/config"))?, config_before);
        assert_eq!(std::fs::read_dir(fixture.path("repo/keys"))?.count(), 1);
        Ok(())
    }

    #[tokio::test]
    async fn forget_keeps_the_newest_of_its_tags_only() -> TestResult {
        let fixture = Fixture::initialised().await?;
        let mut made = Vec::new();
        for round in 0..4 {
            let summary = fixture
                .restic
                .backup_stdin(
                    &fixture.repo,
                    "db.dump",
                    &tags(&["db"]),
                    "host-a",
                    format!("round {round}").as_bytes(),
                    DEADLINE,
                )
                .await?;
            made.push(summary.snapshot_id);
        }
        let mut others = Vec::new();
        for round in 0..3 {
            let summary = fixture
                .restic
                .backup_stdin(
                    &fixture.repo,
                    "other.dump",
                    &tags(&["other"]),
                    "host-a",
                    format!("other {round}").as_bytes(),
                    DEADLINE,
                )
                .await?;
            others.push(summary.snapshot_id);
        }
        let keep = Keep {
            last: 2,
            ..Keep::default()
        };
        let removed = fixture
            .restic
            .forget(&fixture.repo, &tags(&["db"]), keep, DEADLINE)
            .await?;
        // forget names them by full id, a backup by short id.
        let mut removed: Vec<String> = removed.iter().map(|id| id[..8].to_owned()).collect();
        removed.sort_unstable();
        let mut expected_removed = made[..2].to_vec();
        expected_removed.sort_unstable();
        assert_eq!(removed, expected_removed);

        let left: Vec<String> = fixture
            .restic
            .snapshots(&fixture.repo, &tags(&["db"]), DEADLINE)
            .await?
            .into_iter()
            .map(|snapshot| snapshot.id[..8].to_owned())
            .collect();
        assert_eq!(left, made[2..].to_vec());
        let other_left: Vec<String> = fixture
            .restic
            .snapshots(&fixture.repo, &tags(&["other"]), DEADLINE)
            .await?
            .into_iter()
            .map(|snapshot| snapshot.id[..8].to_owned())
            .collect();
        assert_eq!(other_left, others);

        // All zeros forgets nothing, and runs nothing.
        let none = fixture
            .restic
            .forget(&fixture.repo, &tags(&["db"]), Keep::default(), DEADLINE)
            .await?;
        assert!(none.is_empty());
        fixture.restic.check(&fixture.repo, DEADLINE).await?;
        fixture.restic.unlock(&fixture.repo, DEADLINE).await?;
        Ok(())
    }

    /// A reader that never ends and never yields anything.
    struct Endless;

    impl AsyncRead for Endless {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            _context: &mut std::task::Context<'_>,
            _buffer: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_passed_deadline_kills_restic_and_records_nothing() -> TestResult {
        let fixture = Fixture::initialised().await?;
        let started = Instant::now();
        let error = fixture
            .restic
            .backup_stdin(
                &fixture.repo,
                "never.dump",
                &tags(&["slow"]),
                "host-a",
                Endless,
                Duration::from_secs(1),
            )
            .await
            .err()
            .ok_or("a backup of an endless stream finished")?;
        assert!(
            matches!(error, Error::Timeout { after, .. } if after == Duration::from_secs(1)),
            "{error:?}"
        );
        assert!(error.to_string().contains("timed out after 1s"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(10));
        fixture.restic.unlock(&fixture.repo, DEADLINE).await?;
        let snapshots = fixture
            .restic
            .snapshots(&fixture.repo, &[], DEADLINE)
            .await?;
        assert!(snapshots.is_empty(), "{snapshots:?}");
        Ok(())
    }

    #[tokio::test]
    async fn flags_in_values_are_refused_without_running_anything() -> TestResult {
        // A binary that does not exist: reaching the spawn would be BinaryMissing.
        let scratch = tempfile::tempdir()?;
        let password_file = scratch.path().join("password");
        std::fs::write(&password_file, PASSWORD)?;
        let restic = Restic::new(
            scratch.path().join("no-restic"),
            scratch.path().join("cache"),
        );
        let repo = Repo {
            repository: "--insecure-tls".to_owned(),
            password_file: password_file.clone(),
        };
        let error = restic
            .snapshots(&repo, &[], DEADLINE)
            .await
            .err()
            .ok_or("a repository beginning with '-' ran")?;
        assert!(
            matches!(
                error,
                Error::Refused {
                    what: "repository",
                    ..
                }
            ),
            "{error:?}"
        );
        let repo = Repo {
            repository: scratch.path().join("repo").display().to_string(),
            password_file,
        };
        let error = restic
            .restore(&repo, "--help", scratch.path(), DEADLINE)
            .await
            .err()
            .ok_or("a snapshot id beginning with '-' ran")?;
        assert!(matches!(error, Error::Refused { .. }), "{error:?}");
        let error = restic
            .snapshots(&repo, &tags(&["a,b"]), DEADLINE)
            .await
            .err()
            .ok_or("a tag with a comma ran")?;
        assert!(matches!(error, Error::Refused { .. }), "{error:?}");
        // And with sane values the missing binary is named, with what to install.
        let error = restic
            .snapshots(&repo, &[], DEADLINE)
            .await
            .err()
            .ok_or("a missing binary ran")?;
        assert!(matches!(error, Error::BinaryMissing { .. }), "{error:?}");
        assert!(error.to_string().contains("restic"), "{error}");
        Ok(())
    }

    #[tokio::test]
    async fn a_missing_password_file_is_named_before_spawning() -> TestResult {
        let scratch = tempfile::tempdir()?;
        let restic = Restic::new("/usr/bin/restic", scratch.path().join("cache"));
        let repo = Repo {
            repository: scratch.path().join("repo").display().to_string(),
            password_file: scratch.path().join("absent"),
        };
        let error = restic
            .ensure_repo(&repo, DEADLINE)
            .await
            .err()
            .ok_or("ran without a password file")?;
        assert!(matches!(error, Error::PasswordFile { .. }), "{error:?}");
        assert!(error.to_string().contains("absent"), "{error}");
        let repo = Repo {
            password_file: scratch.path().to_owned(),
            ..repo
        };
        let error = restic
            .ensure_repo(&repo, DEADLINE)
            .await
            .err()
            .ok_or("ran with a directory as password file")?;
        assert!(error.to_string().contains("not a regular file"), "{error}");
        assert!(!scratch.path().join("repo").exists());
        Ok(())
    }

    #[tokio::test]
    async fn host_paths_pass_the_policy_on_their_final_form_before_anything_runs() -> TestResult {
        let scratch = tempfile::tempdir()?;
        let allowed = scratch.path().join("allowed");
        let outside = scratch.path().join("outside");
        std::fs::create_dir_all(&allowed)?;
        std::fs::create_dir_all(&outside)?;
        std::fs::write(outside.join("secret"), PASSWORD)?;
        std::fs::write(allowed.join("password"), PASSWORD)?;
        let policy = crate::model::policy::Policy {
            allow_bind_root: vec![allowed.display().to_string()],
            ..crate::model::policy::Policy::default()
        };
        let restic = Restic::new("/usr/bin/restic", scratch.path().join("cache"))
            .guarded(policy, crate::model::policy::OwnedPaths::default());
        let refused = |repo: Repo| {
            let restic = restic.clone();
            async move { restic.ensure_repo(&repo, DEADLINE).await.err() }
        };
        // A repository outside the roots: refused, nothing created.
        let error = refused(Repo {
            repository: outside.join("repo").display().to_string(),
            password_file: allowed.join("password"),
        })
        .await
        .ok_or("a repository outside the bind roots was used")?;
        assert!(
            matches!(
                error,
                Error::HostPolicy {
                    what: "repository",
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(!outside.join("repo").exists());
        // A password file under the root that is a symlink out of it: judged where it points.
        std::os::unix::fs::symlink(outside.join("secret"), allowed.join("link"))?;
        let error = refused(Repo {
            repository: allowed.join("repo").display().to_string(),
            password_file: allowed.join("link"),
        })
        .await
        .ok_or("a password file resolving outside the bind roots was read")?;
        assert!(
            matches!(
                error,
                Error::HostPolicy {
                    what: "password file",
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error.to_string().contains("resolves to"), "{error}");
        assert!(!allowed.join("repo").exists());
        // `..` folded: the same refusal.
        let error = refused(Repo {
            repository: format!("{}/../outside/repo", allowed.display()),
            password_file: allowed.join("password"),
        })
        .await
        .ok_or("a repository escaping by .. was used")?;
        assert!(matches!(error, Error::HostPolicy { .. }), "{error:?}");
        Ok(())
    }

    #[tokio::test]
    async fn the_child_sees_only_its_four_variables_and_no_password_argument() -> TestResult {
        let scratch = tempfile::tempdir()?;
        let password_file = scratch.path().join("password");
        std::fs::write(&password_file, PASSWORD)?;
        let seen = scratch.path().join("seen");
        let fake = scratch.path().join("fake-restic");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\n{{ env; echo \"ARGS $*\"; }} > '{}'\n",
                seen.display()
            ),
        )?;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
        let cache = scratch.path().join("cache");
        let restic = Restic::new(&fake, &cache);
        let repo = Repo {
            repository: scratch.path().join("repo").display().to_string(),
            password_file: password_file.clone(),
        };
        restic.unlock(&repo, DEADLINE).await?;
        let seen = std::fs::read_to_string(&seen)?;
        let mut names: Vec<&str> = seen
            .lines()
            .filter(|line| !line.starts_with("ARGS "))
            .filter_map(|line| line.split_once('=').map(|(name, _)| name))
            // What sh itself sets.
            .filter(|name| !["PWD", "SHLVL", "_", "OLDPWD"].contains(name))
            .collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["HOME", "PATH", "RESTIC_CACHE_DIR", "RESTIC_PASSWORD_FILE"],
            "{seen}"
        );
        assert!(
            seen.contains(&format!("RESTIC_PASSWORD_FILE={}", password_file.display())),
            "{seen}"
        );
        assert!(
            seen.contains(&format!("HOME={}", cache.display())),
            "{seen}"
        );
        assert!(!seen.contains(PASSWORD), "{seen}");
        assert!(
            seen.contains(&format!("ARGS --repo={} unlock", repo.repository)),
            "{seen}"
        );
        Ok(())
    }

    #[test]
    fn passwords_in_repository_urls_are_redacted() {
        assert_eq!(
            redact("rest:https://user:secret@backup.example:8000/repo"),
            "rest:https://user:***@backup.example:8000/repo"
        );
        assert_eq!(redact("/srv/restic"), "/srv/restic");
        assert_eq!(redact("sftp:user@host:/srv"), "sftp:user@host:/srv");
        assert_eq!(redact("rest:https://host/a:b@c"), "rest:https://host/a:b@c");
    }
}
