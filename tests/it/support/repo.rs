//! `TempRepo`: a bare "remote" and a working clone in a temp dir, driven with the `git` CLI
//! (as gitoxide's `make_*.sh` fixtures do), so the agent fetches a real repository over
//! `file://`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::TestResult;

pub struct TempRepo {
    dir: tempfile::TempDir,
}

impl TempRepo {
    /// An empty bare remote with branch `main`, and a clone of it at `work/`.
    pub fn new() -> TestResult<TempRepo> {
        let dir = tempfile::tempdir()?;
        let repo = TempRepo { dir };
        git(
            repo.dir.path(),
            &["init", "-q", "--bare", "-b", "main", "remote.git"],
        )?;
        git(repo.dir.path(), &["init", "-q", "-b", "main", "work"])?;
        git(
            &repo.work(),
            &[
                "remote",
                "add",
                "origin",
                &repo.remote_path().display().to_string(),
            ],
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

    /// `git revert --no-edit <sha>` and push; returns the revert commit's SHA.
    pub fn revert(&self, sha: &str) -> TestResult<String> {
        git(&self.work(), &["revert", "--no-edit", sha])?;
        self.push()
    }

    pub fn head(&self) -> TestResult<String> {
        git(&self.work(), &["rev-parse", "HEAD"])
    }

    pub fn git(&self, args: &[&str]) -> TestResult<String> {
        git(&self.work(), args)
    }

    fn push(&self) -> TestResult<String> {
        git(
            &self.work(),
            &["push", "-q", "--force", "origin", "HEAD:main"],
        )?;
        self.head()
    }
}

/// Runs git with a fixed identity and no user or system config.
pub fn git(dir: &Path, args: &[&str]) -> TestResult<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
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
