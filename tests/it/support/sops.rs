//! SOPS files made by the real tools: an age identity from `age-keygen` and files encrypted
//! by `sops` (scripts/test-deps installs both).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::TestResult;

/// An age identity in its own temp dir, and `sops` encrypting for it.
pub struct AgeKey {
    dir: tempfile::TempDir,
    pub recipient: String,
}

impl AgeKey {
    /// Whether `sops` and `age-keygen` are installed.
    pub fn tools_available() -> bool {
        ["sops", "age-keygen"].iter().all(|tool| {
            Command::new(tool)
                .arg("--version")
                .env("SOPS_DISABLE_VERSION_CHECK", "1")
                .output()
                .is_ok()
        })
    }

    pub fn new() -> TestResult<AgeKey> {
        let dir = tempfile::tempdir()?;
        let identity = dir.path().join("identity.txt");
        let output = Command::new("age-keygen")
            .arg("-o")
            .arg(&identity)
            .output()?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned().into());
        }
        let text = std::fs::read_to_string(&identity)?;
        let recipient = text
            .lines()
            .find_map(|line| line.strip_prefix("# public key: "))
            .ok_or("age-keygen wrote no public key")?
            .to_owned();
        Ok(AgeKey { dir, recipient })
    }

    /// The identity file (`--age-identity`).
    pub fn identity(&self) -> PathBuf {
        self.dir.path().join("identity.txt")
    }

    /// `sops --encrypt --age <recipient>` of `plain` as `format` (dotenv, yaml, json, binary).
    pub fn encrypt(&self, plain: &[u8], format: &str) -> TestResult<Vec<u8>> {
        let input = self.dir.path().join(format!("plain.{format}"));
        std::fs::write(&input, plain)?;
        let output = Command::new("sops")
            .env("SOPS_DISABLE_VERSION_CHECK", "1")
            .args(["--encrypt", "--age", &self.recipient])
            .args(["--input-type", format, "--output-type", format])
            .arg(&input)
            .output()?;
        std::fs::remove_file(&input)?;
        if !output.status.success() {
            return Err(format!("sops failed: {}", String::from_utf8_lossy(&output.stderr)).into());
        }
        Ok(output.stdout)
    }

    /// Writes `sops --encrypt` of `plain` to `path`.
    pub fn encrypt_to(&self, path: &Path, plain: &[u8], format: &str) -> TestResult {
        let encrypted = self.encrypt(plain, format)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, encrypted)?;
        Ok(())
    }
}
