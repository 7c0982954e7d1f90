//! The flags of what the agent trusts in a repository and the keys it holds: which commit
//! signatures it requires (`--verify-commits`, `--trusted-ssh-signers`, `--trusted-pgp-keys`)
//! and the age identities it opens SOPS files with (`--age-identity`). Shared by the agent and
//! `plan`, so a plan judges a commit as the agent would.
//!
//! Invariant: trust is configured on the host only; nothing in the repository can turn
//! verification off or add a key.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};

use crate::assets::sops::Keyring;
use crate::git::VerifyMode;
use crate::sync::CommitTrust;

/// `--verify-commits` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum VerifyArg {
    /// The commit to apply (the branch tip) must carry a trusted signature.
    Tip,
    /// Every commit since the last applied one must (the tip alone for the first).
    All,
}

#[derive(Debug, Args, Default)]
#[command(next_help_heading = "Signed commits and secrets")]
pub(super) struct TrustArgs {
    /// Require trusted commit signatures before applying a commit: `tip` (the commit to
    /// apply) or `all` (every commit since the last applied one). Off by default. A commit
    /// that fails is rejected like a broken manifest.
    #[arg(long, env = "VOODU_VERIFY_COMMITS", value_name = "tip|all")]
    verify_commits: Option<VerifyArg>,
    /// SSH keys trusted to sign commits: git's allowed_signers format
    /// (`principals [namespaces="git"] ssh-ed25519 AAAA…`).
    #[arg(long, env = "VOODU_TRUSTED_SSH_SIGNERS", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    trusted_ssh_signers: Option<PathBuf>,
    /// OpenPGP public keys trusted to sign commits: a keyring file, armored or binary
    /// (`gpg --export --armor KEYID… > FILE`).
    #[arg(long, env = "VOODU_TRUSTED_PGP_KEYS", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    trusted_pgp_keys: Option<PathBuf>,
    /// An age identity file (`age-keygen` output; repeatable) to decrypt the repository's
    /// SOPS files with (README "Secrets in the repository"). Never read from the repository.
    #[arg(
        long = "age-identity",
        env = "VOODU_AGE_IDENTITY",
        value_name = "FILE", value_hint = clap::ValueHint::FilePath,
        value_delimiter = ','
    )]
    age_identities: Vec<PathBuf>,
}

impl TrustArgs {
    /// The age identities of `--age-identity` (none: SOPS files are refused).
    pub(super) fn to_keyring(&self) -> anyhow::Result<Arc<Keyring>> {
        Ok(Arc::new(
            Keyring::load(&self.age_identities).map_err(anyhow::Error::msg)?,
        ))
    }

    /// The verification to run, or `None` when `--verify-commits` is not given; an error for
    /// flags that contradict each other or key files that cannot be used.
    pub(super) fn to_commit_trust(&self) -> anyhow::Result<Option<CommitTrust>> {
        let Some(mode) = self.verify_commits else {
            if self.trusted_ssh_signers.is_some() || self.trusted_pgp_keys.is_some() {
                anyhow::bail!(
                    "--trusted-ssh-signers / --trusted-pgp-keys have no effect without --verify-commits tip|all"
                );
            }
            return Ok(None);
        };
        if self.trusted_ssh_signers.is_none() && self.trusted_pgp_keys.is_none() {
            anyhow::bail!(
                "--verify-commits needs the keys to trust: --trusted-ssh-signers FILE and/or --trusted-pgp-keys FILE"
            );
        }
        let mode = match mode {
            VerifyArg::Tip => VerifyMode::Tip,
            VerifyArg::All => VerifyMode::All,
        };
        Ok(Some(CommitTrust::load(
            mode,
            self.trusted_ssh_signers.as_deref(),
            self.trusted_pgp_keys.as_deref(),
        )?))
    }
}
