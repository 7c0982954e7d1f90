//! Writing to the watched repository: image automation's commit mode (issue 27). gix cannot
//! push (GitoxideLabs/gitoxide#306), so this module drives the `git` executable, in a private
//! working clone under the data directory: fetch the branch tip, let the caller edit manifest
//! files, commit (SSH-signed when a key is given), and `git push <url> HEAD:refs/heads/<b>`.
//!
//! Credentials: over https the source's token (`--git-token-file`) is handed to `git` through
//! `GIT_ASKPASS`, a helper script in a private (0700) temporary directory that prints the token
//! from the environment of that one `git` process: never on a command line (`ps` shows those),
//! never in a file, and no configured credential helper runs (`credential.helper` is reset, so
//! nothing stores it). A token is never sent over plain `http://`; an `https://` remote without a
//! token is refused before anything runs (git would only fail asking for a password).
//!
//! Invariants: never a force push; a push the remote refuses as non-fast-forward (a human
//! commit landed since the fetch) is redone on the new tip, up to `MAX_ATTEMPTS`, the edit
//! recomputed there; an edit the caller refuses on the new tip (a conflict) is returned as an
//! error, nothing pushed; the mirror the agent syncs from is not touched (the next fetch brings
//! the pushed commit like any other).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::model::{CommitSha, is_manifest_path};

/// Tries before a racing remote is reported.
pub const MAX_ATTEMPTS: usize = 3;

/// Where and how to push.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// The remote, as `git` takes it (a path, `file://`, `https://`, `ssh://`).
    pub url: String,
    /// The watched branch (the base of every bump).
    pub branch: String,
    /// Where the bump goes: the watched branch when empty.
    pub push_branch: String,
    /// Repo-relative directories whose manifests are edited; empty = the whole tree.
    pub paths: Vec<String>,
    /// The private working clone (created when missing).
    pub work_dir: PathBuf,
    /// An SSH private key: commits are signed with it (`gpg.format = ssh`).
    pub signing_key: Option<PathBuf>,
    /// The commit author and committer.
    pub author_name: String,
    pub author_email: String,
    /// For ssh remotes: the ssh command the source fetches with (its deploy key, accepting
    /// an unknown host key), as `SourceOptions::ssh_command` makes it.
    pub ssh_command: Option<String>,
    /// For https remotes: a file holding the token sent as the password (of the URL's user,
    /// else `x-access-token`), as the source fetches with.
    pub token_file: Option<PathBuf>,
    /// For https remotes: a PEM file of CA certificates the remote's certificate is checked
    /// against (`http.sslCAInfo`).
    pub ca_file: Option<PathBuf>,
}

/// Why nothing was pushed.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("cannot run git ({what}): {message}")]
    Git { what: String, message: String },
    #[error(
        "commit mode cannot push to {url}: {reason}; give the source a token (--git-token-file, or `token_file` in --sources) with write access, or use an ssh:// remote, or `mode = \"report\"`"
    )]
    NoCredential { url: String, reason: &'static str },
    #[error("the edit cannot be made on {branch} at {tip}: {message}")]
    Conflict {
        branch: String,
        tip: String,
        message: String,
    },
    #[error(
        "the push to {branch} was refused {attempts} times as the branch moved each time; the next scan tries again"
    )]
    Raced { branch: String, attempts: usize },
}

/// What an edit pass changed: `Ok(None)` = nothing to change in this file; `Err` (the
/// caller's own error) stops the bump as a `PushError::Conflict` saying it.
pub type EditResult<E> = Result<Option<String>, E>;

/// Why a `git` command gave no output.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("{0} (is `git` installed?)")]
    Spawn(#[source] std::io::Error),
    #[error("no answer within {}s; stopped", .0.as_secs())]
    Deadline(std::time::Duration),
    #[error("{0}")]
    Wait(#[source] std::io::Error),
}

/// Commits the edits `edit` makes (called with each manifest file's path and text on the
/// branch tip, every attempt) and pushes them. Returns the pushed commit, or the tip when the
/// edits were already there (nothing to commit).
pub fn commit_and_push<E: std::fmt::Display>(
    options: &PushOptions,
    message: &str,
    edit: &mut dyn FnMut(&str, &str) -> EditResult<E>,
    finish: &mut dyn FnMut() -> Result<(), E>,
) -> Result<CommitSha, PushError> {
    let target = if options.push_branch.is_empty() {
        options.branch.as_str()
    } else {
        options.push_branch.as_str()
    };
    check_credential(options)?;
    for _ in 0..MAX_ATTEMPTS {
        prepare(options, target)?;
        let tip = git(options, &["rev-parse", "HEAD"], "read the tip")?;
        let tip = String::from_utf8_lossy(&tip.stdout).trim().to_owned();
        let conflict = |error: E| PushError::Conflict {
            branch: target.to_owned(),
            tip: tip.chars().take(12).collect(),
            message: error.to_string(),
        };
        let mut changed = Vec::new();
        for path in manifest_files(&options.work_dir, &options.paths) {
            let full = options.work_dir.join(&path);
            let Ok(text) = std::fs::read_to_string(&full) else {
                continue;
            };
            if let Some(edited) = edit(&path, &text).map_err(&conflict)? {
                std::fs::write(&full, edited).map_err(|error| PushError::Git {
                    what: format!("write {path}"),
                    message: error.to_string(),
                })?;
                changed.push(path);
            }
        }
        finish().map_err(&conflict)?;
        if changed.is_empty() {
            return Ok(CommitSha::new(tip));
        }
        let mut add = vec!["add", "--"];
        add.extend(changed.iter().map(String::as_str));
        git(options, &add, "stage the edit")?;
        let mut commit: Vec<String> = Vec::new();
        if let Some(key) = &options.signing_key {
            commit.extend([
                "-c".to_owned(),
                "gpg.format=ssh".to_owned(),
                "-c".to_owned(),
                format!("user.signingkey={}", key.display()),
            ]);
        }
        commit.extend([
            "commit".to_owned(),
            "-q".to_owned(),
            "--no-verify".to_owned(),
        ]);
        if options.signing_key.is_some() {
            commit.push("-S".to_owned());
        }
        commit.extend(["-m".to_owned(), message.to_owned()]);
        let commit: Vec<&str> = commit.iter().map(String::as_str).collect();
        git(options, &commit, "commit")?;
        let head = git(options, &["rev-parse", "HEAD"], "read the commit")?;
        let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
        let refspec = format!("HEAD:refs/heads/{target}");
        let pushed = run(
            options,
            &["push", "--porcelain", "--", &options.url, &refspec],
        )?;
        if pushed.status.success() {
            return Ok(CommitSha::new(head));
        }
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&pushed.stdout),
            String::from_utf8_lossy(&pushed.stderr)
        );
        let raced = [
            "non-fast-forward",
            "fetch first",
            "[rejected]",
            "stale info",
        ]
        .iter()
        .any(|sign| said.contains(sign));
        if !raced {
            return Err(PushError::Git {
                what: format!("push to {target}"),
                message: last_lines(&said),
            });
        }
        tracing::info!(
            branch = target,
            "the branch moved during an image bump; redoing it on the new tip"
        );
    }
    Err(PushError::Raced {
        branch: target.to_owned(),
        attempts: MAX_ATTEMPTS,
    })
}

/// Fetches `target` (or, when it does not exist yet, the watched branch) and checks it out
/// clean, detached.
fn prepare(options: &PushOptions, target: &str) -> Result<(), PushError> {
    if !options.work_dir.join(".git").exists() {
        std::fs::create_dir_all(&options.work_dir).map_err(|error| PushError::Git {
            what: format!("create {}", options.work_dir.display()),
            message: error.to_string(),
        })?;
        // No template: its sample hooks would never run (`core.hooksPath=/dev/null`).
        git(
            options,
            &["init", "-q", "--template="],
            "create the working clone",
        )?;
    }
    let fetch = |branch: &str| {
        run(
            options,
            &[
                "fetch",
                "-q",
                "--no-tags",
                "--",
                &options.url,
                &format!("+refs/heads/{branch}:refs/voodu/base"),
            ],
        )
    };
    let fetched = fetch(target)?;
    if !fetched.status.success() {
        let fetched = fetch(&options.branch)?;
        if !fetched.status.success() {
            return Err(PushError::Git {
                what: format!("fetch {} from {}", options.branch, options.url),
                message: last_lines(&String::from_utf8_lossy(&fetched.stderr)),
            });
        }
    }
    git(
        options,
        &["checkout", "-q", "-f", "--detach", "refs/voodu/base"],
        "check out the tip",
    )?;
    git(
        options,
        &["clean", "-q", "-f", "-d", "-x"],
        "clean the working clone",
    )?;
    Ok(())
}

/// Manifest files under `paths` (repo-relative, `/`-separated), sorted; `.git` skipped, links
/// not followed.
fn manifest_files(root: &Path, paths: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == ".git" {
                continue;
            }
            let path = format!("{prefix}{name}");
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push((entry.path(), format!("{path}/")));
            } else if kind.is_file() && is_manifest_path(&path) {
                let watched = paths.is_empty()
                    || paths.iter().any(|watched| {
                        let watched = watched.trim_matches('/');
                        watched.is_empty()
                            || path == watched
                            || path.starts_with(&format!("{watched}/"))
                    });
                if watched {
                    out.push(path);
                }
            }
        }
    }
    out.sort_unstable();
    out
}

/// Refuses what cannot work or would leak: a token over plain http, an https remote without
/// a token.
fn check_credential(options: &PushOptions) -> Result<(), PushError> {
    let scheme = options
        .url
        .split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase())
        .unwrap_or_default();
    let reason = match (scheme.as_str(), &options.token_file) {
        ("http", Some(_)) => "a token is never sent over plain http://",
        ("https", None) => "an https remote needs a token and the source has none",
        _ => return Ok(()),
    };
    Err(PushError::NoCredential {
        url: redact_url(&options.url),
        reason,
    })
}

/// `url` without a password written into it.
fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("redacted"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

/// What hands the token to one `git` process: the askpass helper in its private directory
/// (removed when dropped) and the environment that points `git` at it.
pub(crate) struct Askpass {
    _dir: tempfile::TempDir,
    pub(crate) env: Vec<(&'static str, std::ffi::OsString)>,
}

/// The helper: git runs it with its prompt as the argument (`Username for '…': `, `Password
/// for '…': `) and reads the answer from its output. It holds no secret.
const ASKPASS_SCRIPT: &str = "#!/bin/sh\ncase \"$1\" in\n  Username*) printf '%s\\n' \"$VOODU_GIT_USER\" ;;\n  *) printf '%s\\n' \"$VOODU_GIT_TOKEN\" ;;\nesac\n";

impl Askpass {
    /// The helper for `token` sent as `user`'s password.
    pub(crate) fn new(user: &str, token: &str) -> std::io::Result<Askpass> {
        use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
        let dir = tempfile::Builder::new().prefix("voodu-askpass").tempdir()?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
        let script = dir.path().join("askpass");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .open(&script)?;
        std::io::Write::write_all(&mut file, ASKPASS_SCRIPT.as_bytes())?;
        drop(file);
        Ok(Askpass {
            env: vec![
                ("GIT_ASKPASS", script.into_os_string()),
                ("VOODU_GIT_USER", user.into()),
                ("VOODU_GIT_TOKEN", token.into()),
            ],
            _dir: dir,
        })
    }
}

/// The askpass helper for a network command (`fetch`, `push`) to an https remote with a token.
fn askpass_for(options: &PushOptions, args: &[&str]) -> Result<Option<Askpass>, PushError> {
    let network = matches!(args.first(), Some(&"fetch" | &"push"));
    let Some(path) = options.token_file.as_ref().filter(|_| network) else {
        return Ok(None);
    };
    let failed = |message: String| PushError::Git {
        what: "hand the token to git".to_owned(),
        message,
    };
    let token = std::fs::read_to_string(path).map_err(|error| {
        failed(format!(
            "cannot read the token file {}: {error}",
            path.display()
        ))
    })?;
    Askpass::new(&super::token_user(&options.url), token.trim())
        .map(Some)
        .map_err(|error| failed(error.to_string()))
}

fn run(options: &PushOptions, args: &[&str]) -> Result<Output, PushError> {
    let askpass = askpass_for(options, args)?;
    let mut command = Command::new("git");
    command.arg("-C").arg(&options.work_dir).args([
        // No configured helper asks for, or stores, the token.
        "-c",
        "credential.helper=",
        "-c",
        &format!("user.name={}", options.author_name),
        "-c",
        &format!("user.email={}", options.author_email),
        "-c",
        "commit.gpgsign=false",
        "-c",
        "core.hooksPath=/dev/null",
    ]);
    if let Some(ca_file) = &options.ca_file {
        command
            .arg("-c")
            .arg(format!("http.sslCAInfo={}", ca_file.display()));
    }
    command
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .stdin(std::process::Stdio::null());
    if let Some(ssh_command) = &options.ssh_command {
        command.env("GIT_SSH_COMMAND", ssh_command);
    }
    if let Some(askpass) = &askpass {
        command.envs(askpass.env.iter().map(|(name, value)| (name, value)));
    }
    let what = args.first().copied().unwrap_or("git");
    output_within(&mut command, GIT_DEADLINE).map_err(|error| PushError::Git {
        what: what.to_owned(),
        message: error.to_string(),
    })
}

/// How long one `git` command may take (a clone, a fetch or a push of a deploy repository):
/// a remote that stops answering fails the bump instead of holding its thread.
const GIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs `command` to its end, or kills it once `limit` has passed; its output either way.
/// The pipes are drained while it runs, so a chatty command cannot block on a full pipe.
fn output_within(command: &mut Command, limit: std::time::Duration) -> Result<Output, RunError> {
    use std::io::Read as _;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(RunError::Spawn)?;
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                // At most 1 MiB kept: the last lines of stderr are all that is shown.
                let _ = pipe.by_ref().take(1 << 20).read_to_end(&mut bytes);
                let _ = std::io::copy(&mut pipe, &mut std::io::sink());
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|pipe| Box::new(pipe) as Box<dyn std::io::Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|pipe| Box::new(pipe) as Box<dyn std::io::Read + Send>),
    );
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::Deadline(limit));
            }
            Err(error) => return Err(RunError::Wait(error)),
        }
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

fn git(options: &PushOptions, args: &[&str], what: &str) -> Result<Output, PushError> {
    let output = run(options, args)?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(PushError::Git {
            what: what.to_owned(),
            message: last_lines(&String::from_utf8_lossy(&output.stderr)),
        })
    }
}

fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    lines[lines.len().saturating_sub(3)..].join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A git that does not finish is stopped at the deadline; its output is kept otherwise.
    #[test]
    fn a_command_past_its_deadline_is_stopped() -> Result<(), Box<dyn std::error::Error>> {
        let mut hanging = Command::new("sleep");
        hanging.arg("30");
        let error = output_within(&mut hanging, std::time::Duration::from_millis(100))
            .err()
            .ok_or("a 30 s sleep finished within 100 ms")?;
        assert!(error.to_string().contains("no answer within"), "{error}");
        let mut chatty = Command::new("sh");
        chatty.args(["-c", "head -c 300000 /dev/zero; echo done >&2"]);
        let output = output_within(&mut chatty, std::time::Duration::from_secs(60))?;
        assert_eq!(
            output.stdout.len(),
            300_000,
            "the pipe was drained while it ran"
        );
        assert_eq!(String::from_utf8(output.stderr)?, "done\n");
        Ok(())
    }

    /// git takes the token from the helper (asked through `git credential fill`, which is
    /// what a push does; no network), with no configured helper, and the helper's directory is
    /// private and holds no secret.
    #[test]
    fn git_gets_the_token_through_askpass_only() -> Result<(), Box<dyn std::error::Error>> {
        let token = "s3cret-token-value";
        let askpass = Askpass::new("x-access-token", token)?;
        let script = askpass
            .env
            .iter()
            .find(|(name, _)| *name == "GIT_ASKPASS")
            .map(|(_, value)| std::path::PathBuf::from(value))
            .ok_or("no GIT_ASKPASS")?;
        use std::os::unix::fs::PermissionsExt as _;
        let dir_mode = std::fs::metadata(script.parent().ok_or("no dir")?)?
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        assert!(!std::fs::read_to_string(&script)?.contains(token));
        let home = tempfile::tempdir()?;
        // A configured helper that would store the token: reset by `credential.helper=`.
        let stored = home.path().join("stored");
        std::fs::write(
            home.path().join(".gitconfig"),
            format!(
                "[credential]\n\thelper = store --file {}\n",
                stored.display()
            ),
        )?;
        let mut child = Command::new("git")
            .args(["-c", "credential.helper=", "credential", "fill"])
            .env("HOME", home.path())
            .env("GIT_TERMINAL_PROMPT", "0")
            .env_remove("GIT_ASKPASS")
            .env_remove("SSH_ASKPASS")
            .envs(askpass.env.iter().map(|(name, value)| (name, value)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        std::io::Write::write_all(
            child.stdin.as_mut().ok_or("no stdin")?,
            b"protocol=https\nhost=git.example.invalid\n\n",
        )?;
        let output = child.wait_with_output()?;
        let said = String::from_utf8(output.stdout)?;
        assert!(output.status.success(), "{said}");
        assert!(said.contains("username=x-access-token\n"), "{said}");
        assert!(said.contains(&format!("password={token}\n")), "{said}");
        let _ = Command::new("git")
            .args(["-c", "credential.helper=", "credential", "approve"])
            .env("HOME", home.path())
            .output()?;
        assert!(!stored.exists(), "no helper stored the token");
        Ok(())
    }

    #[test]
    fn https_without_a_token_and_tokens_over_http_are_refused() {
        let options = |url: &str, token: bool| PushOptions {
            url: url.to_owned(),
            branch: "main".to_owned(),
            push_branch: String::new(),
            paths: Vec::new(),
            work_dir: PathBuf::new(),
            signing_key: None,
            author_name: "a".to_owned(),
            author_email: "a@b".to_owned(),
            ssh_command: None,
            token_file: token.then(|| PathBuf::from("token")),
            ca_file: None,
        };
        for (url, token, refused) in [
            ("https://git.example.invalid/a/b.git", false, true),
            ("http://git.example.invalid/a/b.git", true, true),
            ("https://git.example.invalid/a/b.git", true, false),
            ("ssh://git@git.example.invalid/a/b.git", false, false),
            ("/srv/git/deploy.git", false, false),
        ] {
            // Judged before anything runs (no directory made, no git started).
            let result = check_credential(&options(url, token));
            assert_eq!(
                matches!(result, Err(PushError::NoCredential { .. })),
                refused,
                "{url}: {result:?}"
            );
        }
    }
}
