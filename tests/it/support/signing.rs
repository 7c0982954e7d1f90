//! Signing keys made with the real tools, for `git commit -S`: an SSH key from `ssh-keygen`
//! (git's `gpg.format=ssh`) and an OpenPGP key from `gpg` in a private GNUPGHOME, each with the
//! file the agent is told to trust (`allowed_signers`, an exported public keyring).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::TestResult;

/// An ed25519 SSH signing key in its own temp dir.
pub struct SshSigner {
    dir: tempfile::TempDir,
    pub principal: String,
}

impl SshSigner {
    pub fn new(principal: &str) -> TestResult<SshSigner> {
        let dir = tempfile::tempdir()?;
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", principal, "-f"])
            .arg(dir.path().join("key")))?;
        Ok(SshSigner {
            dir,
            principal: principal.to_owned(),
        })
    }

    pub fn private_key(&self) -> PathBuf {
        self.dir.path().join("key")
    }

    /// `principal ssh-ed25519 AAAA…`: this key's line of an allowed_signers file.
    pub fn allowed_signers_line(&self) -> TestResult<String> {
        let public = std::fs::read_to_string(self.dir.path().join("key.pub"))?;
        let mut fields = public.split_whitespace();
        let (Some(kind), Some(key)) = (fields.next(), fields.next()) else {
            return Err("ssh-keygen wrote no public key".into());
        };
        Ok(format!("{} {kind} {key}\n", self.principal))
    }

    /// An allowed_signers file trusting this key, written into `dir`.
    pub fn allowed_signers(&self, dir: &Path) -> TestResult<PathBuf> {
        let path = dir.join("allowed_signers");
        std::fs::write(&path, self.allowed_signers_line()?)?;
        Ok(path)
    }

    /// The `git -c` settings that sign with this key.
    pub fn git_config(&self) -> Vec<String> {
        vec![
            "-c".into(),
            "gpg.format=ssh".into(),
            "-c".into(),
            format!("user.signingkey={}", self.private_key().display()),
        ]
    }

    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    pub fn fingerprint(&self) -> TestResult<String> {
        let output = run(Command::new("ssh-keygen")
            .arg("-lf")
            .arg(self.dir.path().join("key.pub")))?;
        output
            .split_whitespace()
            .nth(1)
            .map(ToOwned::to_owned)
            .ok_or_else(|| "ssh-keygen -l printed no fingerprint".into())
    }
}

/// An OpenPGP signing key in a private GNUPGHOME; its gpg-agent is stopped on drop.
pub struct GpgSigner {
    dir: tempfile::TempDir,
    pub fingerprint: String,
}

impl GpgSigner {
    /// Whether `gpg` is installed (`scripts/test-deps` installs gnupg).
    pub fn available() -> bool {
        Command::new("gpg").arg("--version").output().is_ok()
    }

    pub fn new(user: &str) -> TestResult<GpgSigner> {
        // A short path: gpg-agent's socket lives in GNUPGHOME and sockets have a 108-byte cap.
        let dir = tempfile::Builder::new().prefix("g").tempdir_in("/tmp")?;
        let home = dir.path().join("h");
        std::fs::create_dir(&home)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
        }
        let mut signer = GpgSigner {
            dir,
            fingerprint: String::new(),
        };
        run(signer
            .gpg()
            .args(["--batch", "--passphrase", "", "--quick-generate-key"])
            .args([user, "ed25519", "sign", "never"]))?;
        let listing = run(signer
            .gpg()
            .args(["--batch", "--with-colons", "--list-secret-keys"]))?;
        let fingerprint = listing
            .lines()
            .find_map(|line| line.strip_prefix("fpr:"))
            .and_then(|rest| rest.trim_matches(':').rsplit(':').next())
            .ok_or("gpg listed no fingerprint")?
            .to_owned();
        signer.fingerprint = fingerprint;
        // A wrapper git can run as `gpg.program`: gpg on this GNUPGHOME.
        let wrapper = signer.dir.path().join("gpg");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nGNUPGHOME='{}' exec gpg \"$@\"\n",
                signer.home().display()
            ),
        )?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        }
        Ok(signer)
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("h")
    }

    fn gpg(&self) -> Command {
        let mut command = Command::new("gpg");
        command.env("GNUPGHOME", self.home());
        command
    }

    /// The public key, armored (`gpg --export --armor`), written to `path`.
    pub fn export(&self, path: &Path) -> TestResult<PathBuf> {
        let armored = run(self
            .gpg()
            .args(["--batch", "--export", "--armor", &self.fingerprint]))?;
        std::fs::write(path, armored)?;
        Ok(path.to_owned())
    }

    /// The public key, binary (`gpg --export`), written to `path`.
    pub fn export_binary(&self, path: &Path) -> TestResult<PathBuf> {
        let binary = run_bytes(self.gpg().args(["--batch", "--export", &self.fingerprint]))?;
        std::fs::write(path, binary)?;
        Ok(path.to_owned())
    }

    /// The `git -c` settings that sign with this key.
    pub fn git_config(&self) -> Vec<String> {
        vec![
            "-c".into(),
            "gpg.format=openpgp".into(),
            "-c".into(),
            format!("gpg.program={}", self.dir.path().join("gpg").display()),
            "-c".into(),
            format!("user.signingkey={}", self.fingerprint),
        ]
    }
}

impl Drop for GpgSigner {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .env("GNUPGHOME", self.home())
            .args(["--kill", "gpg-agent"])
            .output();
    }
}

fn run(command: &mut Command) -> TestResult<String> {
    Ok(String::from_utf8(run_bytes(command)?)?)
}

fn run_bytes(command: &mut Command) -> TestResult<Vec<u8>> {
    let output = command.output()?;
    if !output.status.success() {
        return Err(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(output.stdout)
}
