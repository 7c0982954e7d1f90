//! `TempRepo`: a bare "remote" and a working repository in a temp dir, driven with the `git` CLI
//! (as gitoxide's `make_*.sh` fixtures do), so the agent fetches a real repository over
//! `file://`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::TestResult;

pub struct TempRepo {
    dir: tempfile::TempDir,
}

impl TempRepo {
    /// An empty bare remote with branch `main`, and a working repository at `work/` whose
    /// objects the remote borrows (`objects/info/alternates`): publishing a commit is then
    /// one ref update instead of a push's seven processes, and the remote serves it as any
    /// repository does.
    pub fn new() -> TestResult<TempRepo> {
        let dir = tempfile::tempdir()?;
        let repo = TempRepo { dir };
        git(
            repo.dir.path(),
            &[
                "init",
                "-q",
                "--template=",
                "--bare",
                "-b",
                "main",
                "remote.git",
            ],
        )?;
        git(
            repo.dir.path(),
            &["init", "-q", "--template=", "-b", "main", "work"],
        )?;
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

    /// Commits everything in the working clone and pushes to the remote; returns the SHA.
    pub fn commit(&self, message: &str) -> TestResult<String> {
        git(&self.work(), &["add", "-A"])?;
        git(
            &self.work(),
            &["commit", "-q", "--allow-empty", "-m", message],
        )?;
        self.push()
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
        git(&self.work(), &["revert", "--no-edit", sha])?;
        self.push()
    }

    /// The working repository's HEAD commit: read from its loose ref (what `git commit` writes)
    /// without a process, else from `git rev-parse` (a detached or packed HEAD).
    pub fn head(&self) -> TestResult<String> {
        let git_dir = self.work().join(".git");
        let loose = std::fs::read_to_string(git_dir.join("HEAD"))
            .ok()
            .and_then(|head| {
                let name = head.trim().strip_prefix("ref: ")?.to_owned();
                std::fs::read_to_string(git_dir.join(name)).ok()
            })
            .map(|sha| sha.trim().to_owned())
            .filter(|sha| sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit()));
        match loose {
            Some(sha) => Ok(sha),
            None => git(&self.work(), &["rev-parse", "HEAD"]),
        }
    }

    pub fn git(&self, args: &[&str]) -> TestResult<String> {
        git(&self.work(), args)
    }

    /// Points the remote's `main` at the working repository's HEAD, as `git push --force
    /// origin HEAD:main` would (the remote has the objects through its alternates): the loose
    /// ref written as `git update-ref` writes it, to `main.lock` and renamed over `main`, so a
    /// fetch in progress reads the old or the new commit, never a torn file.
    fn push(&self) -> TestResult<String> {
        let head = self.head()?;
        let heads = self.remote_path().join("refs/heads");
        let lock = heads.join("main.lock");
        std::fs::write(&lock, format!("{head}\n"))?;
        std::fs::rename(&lock, heads.join("main"))?;
        Ok(head)
    }
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
