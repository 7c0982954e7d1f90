//! `TempRepo`: a bare "remote" and a working repository in a temp dir, so the agent fetches a
//! real repository over `file://`. Plain commits are written in process with gix (blobs, trees,
//! the commit, the index and the ref, as `git add -A && git commit` leaves them); signed
//! commits, reverts and any other command go through the `git` CLI on the same repository.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use gix::bstr::BString;
use gix::objs::tree::EntryKind;

use super::TestResult;

pub struct TempRepo {
    dir: tempfile::TempDir,
    /// A commit was written in process and the index not yet brought up to it: the next `git`
    /// command that reads the index gets it first (most tests never run one).
    index_behind: AtomicBool,
}

impl TempRepo {
    /// An empty bare remote with branch `main`, and a working repository at `work/` whose
    /// objects the remote borrows (`objects/info/alternates`): publishing a commit is then
    /// one ref update instead of a push's seven processes, and the remote serves it as any
    /// repository does.
    pub fn new() -> TestResult<TempRepo> {
        let dir = tempfile::tempdir()?;
        let repo = TempRepo {
            dir,
            index_behind: AtomicBool::new(false),
        };
        init_git_dir(&repo.remote_path(), true)?;
        init_git_dir(&repo.work().join(".git"), false)?;
        std::fs::write(
            repo.remote_path().join("objects/info/alternates"),
            format!("{}\n", repo.work().join(".git/objects").display()),
        )?;
        Ok(repo)
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    pub fn remote_path(&self) -> PathBuf {
        self.dir.path().join("remote.git")
    }

    /// `file://` URL of the bare remote.
    pub fn url(&self) -> String {
        format!("file://{}", self.remote_path().display())
    }

    /// Writes a file in the working clone (creating directories).
    pub fn write(&self, path: &str, contents: &str) -> TestResult<&TempRepo> {
        let full = self.work().join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(full, contents)?;
        Ok(self)
    }

    pub fn remove(&self, path: &str) -> TestResult<&TempRepo> {
        std::fs::remove_file(self.work().join(path))?;
        Ok(self)
    }

    /// Commits everything in the working clone (`git add -A && git commit --allow-empty`, in
    /// process: no `.gitignore` is honoured, none is used here) and pushes to the remote;
    /// returns the SHA. The index is brought up to the commit when a `git` command next needs
    /// it (`sync_index`).
    pub fn commit(&self, message: &str) -> TestResult<String> {
        let work = self.work();
        let repo = gix::open_opts(&work, gix::open::Options::isolated())?;
        let tree = write_tree(&repo, &work, true)?.ok_or("the top tree is always written")?;
        let branch = self.head_ref()?;
        let parent = match std::fs::read_to_string(&branch) {
            Ok(sha) => Some(gix::ObjectId::from_hex(sha.trim().as_bytes())?),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(error.into()),
        };
        let signature = gix::actor::Signature {
            name: "test".into(),
            email: "test@example.invalid".into(),
            time: gix::date::Time::now_utc(),
        };
        let commit = gix::objs::Commit {
            tree,
            parents: parent.into_iter().collect(),
            author: signature.clone(),
            committer: signature,
            encoding: None,
            message: format!("{message}\n").into(),
            extra_headers: Vec::new(),
        };
        let id = repo.write_object(&commit)?.detach().to_string();
        write_ref(&branch, &id)?;
        self.index_behind.store(true, Ordering::Relaxed);
        self.publish(id)
    }

    /// Commits everything signed (`git -c … commit -S`, the `-c` settings choosing the format
    /// and key) and pushes; returns the SHA.
    pub fn commit_signed(&self, config: &[String], message: &str) -> TestResult<String> {
        git(&self.work(), &["add", "-A"])?;
        let mut args: Vec<&str> = config.iter().map(String::as_str).collect();
        args.extend(["commit", "-q", "--allow-empty", "-S", "-m", message]);
        git(&self.work(), &args)?;
        self.push()
    }

    /// Rewrites the HEAD commit's message in place, keeping its signature header (so the
    /// signature no longer covers the payload), and pushes the result; returns its SHA.
    pub fn tamper_head(&self, new_message: &str) -> TestResult<String> {
        self.sync_index()?;
        let object = git(&self.work(), &["cat-file", "commit", "HEAD"])?;
        let (headers, _) = object
            .split_once("\n\n")
            .ok_or("a commit object has a blank line before its message")?;
        let forged = self.root().join("forged-commit");
        std::fs::write(&forged, format!("{headers}\n\n{new_message}\n"))?;
        let path = forged.display().to_string();
        let sha = git(&self.work(), &["hash-object", "-t", "commit", "-w", &path])?;
        git(&self.work(), &["update-ref", "refs/heads/main", &sha])?;
        git(&self.work(), &["reset", "-q", "--hard", &sha])?;
        self.push()
    }

    /// `git revert --no-edit <sha>` and push; returns the revert commit's SHA.
    pub fn revert(&self, sha: &str) -> TestResult<String> {
        self.sync_index()?;
        git(&self.work(), &["revert", "--no-edit", sha])?;
        self.push()
    }

    /// The working repository's HEAD commit: read from its loose ref (what `git commit` writes)
    /// without a process, else from `git rev-parse` (a detached or packed HEAD).
    pub fn head(&self) -> TestResult<String> {
        let loose = std::fs::read_to_string(self.head_ref()?)
            .ok()
            .map(|sha| sha.trim().to_owned())
            .filter(|sha| sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit()));
        match loose {
            Some(sha) => Ok(sha),
            None => git(&self.work(), &["rev-parse", "HEAD"]),
        }
    }

    /// The loose ref file of the branch HEAD names (`HEAD` itself when detached).
    fn head_ref(&self) -> TestResult<PathBuf> {
        let git_dir = self.work().join(".git");
        let head = std::fs::read_to_string(git_dir.join("HEAD"))?;
        Ok(match head.trim().strip_prefix("ref: ") {
            Some(name) => git_dir.join(name),
            None => git_dir.join("HEAD"),
        })
    }

    pub fn git(&self, args: &[&str]) -> TestResult<String> {
        self.sync_index()?;
        git(&self.work(), args)
    }

    /// Writes the index of the HEAD commit, as `git add -A && git commit` leaves it, when an
    /// in-process commit left it behind; a `git` command then sees a clean tree. (`commit -S`
    /// needs none: its `git add -A` rewrites the index from the work tree.)
    fn sync_index(&self) -> TestResult {
        if self.index_behind.swap(false, Ordering::Relaxed) {
            let repo = gix::open_opts(self.work(), gix::open::Options::isolated())?;
            let tree = repo.head_commit()?.tree_id()?.detach();
            repo.index_from_tree(&tree)?.write(Default::default())?;
        }
        Ok(())
    }

    /// Points the remote's `main` at the working repository's HEAD, as `git push --force
    /// origin HEAD:main` would.
    fn push(&self) -> TestResult<String> {
        self.publish(self.head()?)
    }

    /// Points the remote's `main` at `sha` (the remote has the objects through its
    /// alternates), with `write_ref`: a fetch in progress reads the old or the new commit,
    /// never a torn file.
    fn publish(&self, sha: String) -> TestResult<String> {
        write_ref(&self.remote_path().join("refs/heads/main"), &sha)?;
        Ok(sha)
    }
}

/// A repository as `git init --template= -b main` makes it, less the directories git and gix
/// make when they need them (`objects/pack`, `refs/tags`): `HEAD` on `main`, a config,
/// `objects/info` (for the remote's alternates) and `refs/heads`.
fn init_git_dir(git_dir: &Path, bare: bool) -> TestResult {
    for sub in ["objects/info", "refs/heads"] {
        std::fs::create_dir_all(git_dir.join(sub))?;
    }
    std::fs::write(git_dir.join("HEAD"), "ref: refs/heads/main\n")?;
    let logs = if bare {
        ""
    } else {
        "\tlogallrefupdates = true\n"
    };
    std::fs::write(
        git_dir.join("config"),
        format!(
            "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = {bare}\n{logs}"
        ),
    )?;
    Ok(())
}

/// Writes the tree of `dir` (files, executables and symlinks) and returns its id, or `None`
/// for a directory with no file (git records no empty directory; the top one is written by
/// the caller as the empty tree). `top` skips the `.git` directory.
fn write_tree(repo: &gix::Repository, dir: &Path, top: bool) -> TestResult<Option<gix::ObjectId>> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if top && name == ".git" {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type()?;
        let (mode, oid) = if kind.is_symlink() {
            let target = std::fs::read_link(&path)?;
            let target = target.to_str().ok_or("a symlink target is not UTF-8")?;
            (EntryKind::Link, repo.write_blob(target)?.detach())
        } else if kind.is_dir() {
            match write_tree(repo, &path, false)? {
                Some(tree) => (EntryKind::Tree, tree),
                None => continue,
            }
        } else {
            let executable = entry.metadata()?.permissions().mode() & 0o111 != 0;
            let mode = if executable {
                EntryKind::BlobExecutable
            } else {
                EntryKind::Blob
            };
            (mode, repo.write_blob(std::fs::read(&path)?)?.detach())
        };
        let filename = name.to_str().ok_or("a file name is not UTF-8")?;
        entries.push(gix::objs::tree::Entry {
            mode: mode.into(),
            filename: BString::from(filename),
            oid,
        });
    }
    if entries.is_empty() && !top {
        return Ok(None);
    }
    entries.sort();
    Ok(Some(
        repo.write_object(&gix::objs::Tree { entries })?.detach(),
    ))
}

/// Points the loose ref at `path` to `sha` as `git update-ref` does: written to `<path>.lock`
/// and renamed over `path`, so a reader sees the old or the new commit, never a torn file.
fn write_ref(path: &Path, sha: &str) -> TestResult {
    let mut lock = path.as_os_str().to_owned();
    lock.push(".lock");
    std::fs::write(&lock, format!("{sha}\n"))?;
    std::fs::rename(&lock, path)?;
    Ok(())
}

/// Runs git with a fixed identity and no user or system config.
pub fn git(dir: &Path, args: &[&str]) -> TestResult<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        // No `git maintenance run --auto` after each commit: a process per commit for nothing.
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "maintenance.auto")
        .env("GIT_CONFIG_VALUE_0", "false")
        .env("GIT_AUTHOR_NAME", "test")
        .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
        .env("GIT_COMMITTER_NAME", "test")
        .env("GIT_COMMITTER_EMAIL", "test@example.invalid")
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}
