//! Writing to the watched repository: image automation's commit mode (issue 27). gix cannot
//! push (GitoxideLabs/gitoxide#306), so this module drives the `git` executable, in a private
//! working clone under the data directory: fetch the branch tip, let the caller edit manifest
//! files, commit (SSH-signed when a key is given), and `git push <url> HEAD:refs/heads/<b>`.
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
    /// For ssh remotes: accept an unknown host key (`StrictHostKeyChecking=accept-new`).
    pub ssh_accept_new_host_keys: bool,
}

/// Why nothing was pushed.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("cannot run git ({what}): {message}")]
    Git { what: String, message: String },
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

/// What an edit pass changed: `Ok(None)` = nothing to change in this file.
pub type EditResult = Result<Option<String>, String>;

/// Commits the edits `edit` makes (called with each manifest file's path and text on the
/// branch tip, every attempt) and pushes them. Returns the pushed commit, or the tip when the
/// edits were already there (nothing to commit).
pub fn commit_and_push(
    options: &PushOptions,
    message: &str,
    edit: &mut dyn FnMut(&str, &str) -> EditResult,
    finish: &mut dyn FnMut() -> Result<(), String>,
) -> Result<CommitSha, PushError> {
    let target = if options.push_branch.is_empty() {
        options.branch.as_str()
    } else {
        options.push_branch.as_str()
    };
    for _ in 0..MAX_ATTEMPTS {
        prepare(options, target)?;
        let tip = git(options, &["rev-parse", "HEAD"], "read the tip")?;
        let tip = String::from_utf8_lossy(&tip.stdout).trim().to_owned();
        let conflict = |message: String| PushError::Conflict {
            branch: target.to_owned(),
            tip: tip.chars().take(12).collect(),
            message,
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
        git(options, &["init", "-q"], "create the working clone")?;
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
    out.sort();
    out
}

fn run(options: &PushOptions, args: &[&str]) -> Result<Output, PushError> {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(&options.work_dir)
        .args([
            "-c",
            &format!("user.name={}", options.author_name),
            "-c",
            &format!("user.email={}", options.author_email),
            "-c",
            "commit.gpgsign=false",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .stdin(std::process::Stdio::null());
    if options.ssh_accept_new_host_keys {
        command.env("GIT_SSH_COMMAND", "ssh -o StrictHostKeyChecking=accept-new");
    }
    command.output().map_err(|error| PushError::Git {
        what: args.first().copied().unwrap_or("git").to_owned(),
        message: format!("{error} (is `git` installed?)"),
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
