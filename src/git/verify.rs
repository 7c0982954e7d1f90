//! Commit signature verification: SSH signatures (`gpg.format=ssh`, sshsig) against git's
//! `allowed_signers` file, OpenPGP signatures against a keyring of public keys. gix extracts
//! each commit's signature and the bytes it signs; `ssh-key` and `pgp` check them.
//!
//! Invariants: trust comes from the agent's own configuration only, never from the repository;
//! a commit is trusted only when its signature verifies with a key of the configured files
//! (an unsigned commit, an unknown key, a bad signature or an unsupported format are each
//! refused with a reason that names the commit and the key); "every commit" mode checks each
//! commit reachable from the tip and not from the last applied commit, at most
//! [`MAX_VERIFIED_COMMITS`] of them. Blocking (object reads).

use std::path::{Path, PathBuf};

use gix::bstr::ByteSlice as _;

use super::{Error, Result};
use crate::model::CommitSha;

/// The most commits one sync verifies in "every commit" mode; a longer range is refused
/// (a push of more commits than this since the last applied one must be split).
pub const MAX_VERIFIED_COMMITS: usize = 100_000;

/// Which commits must carry a trusted signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyMode {
    /// The commit to apply (the branch tip).
    Tip,
    /// Every commit since the last applied one (the tip alone when none was applied yet).
    All,
}

impl VerifyMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            VerifyMode::Tip => "tip",
            VerifyMode::All => "all",
        }
    }
}

/// One line of an `allowed_signers` file: who the key is, and the key.
#[derive(Debug, Clone)]
struct AllowedSigner {
    principals: String,
    key: ssh_key::PublicKey,
    /// `namespaces="…"`: when given, the key is trusted for these namespaces only.
    namespaces: Option<Vec<String>>,
    /// `valid-after` / `valid-before`, as unix seconds, compared with the committer time.
    valid_after: Option<i64>,
    valid_before: Option<i64>,
}

/// The keys commits may be signed with, read from the agent's configuration at start-up.
#[derive(Default)]
pub struct TrustedKeys {
    ssh: Vec<AllowedSigner>,
    pgp: Vec<pgp::composed::SignedPublicKey>,
    /// The files they were read from, for messages.
    ssh_file: Option<PathBuf>,
    pgp_file: Option<PathBuf>,
}

impl std::fmt::Debug for TrustedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustedKeys")
            .field("ssh_signers", &self.ssh.len())
            .field("pgp_keys", &self.pgp.len())
            .finish()
    }
}

impl TrustedKeys {
    /// Reads an `allowed_signers` file (git's `gpg.ssh.allowedSignersFile` format) and/or a
    /// keyring of OpenPGP public keys (armored or binary, as `gpg --export [--armor]` writes).
    pub fn load(ssh_signers: Option<&Path>, pgp_keys: Option<&Path>) -> Result<TrustedKeys> {
        let mut keys = TrustedKeys::default();
        if let Some(path) = ssh_signers {
            let text = std::fs::read_to_string(path).map_err(|error| Error::TrustedKeys {
                path: path.to_owned(),
                message: error.to_string(),
            })?;
            keys.ssh = parse_allowed_signers(&text).map_err(|error| Error::TrustedKeys {
                path: path.to_owned(),
                message: error.to_string(),
            })?;
            keys.ssh_file = Some(path.to_owned());
        }
        if let Some(path) = pgp_keys {
            let bytes = std::fs::read(path).map_err(|error| Error::TrustedKeys {
                path: path.to_owned(),
                message: error.to_string(),
            })?;
            keys.pgp = parse_pgp_keyring(&bytes).map_err(|error| Error::TrustedKeys {
                path: path.to_owned(),
                message: error.to_string(),
            })?;
            keys.pgp_file = Some(path.to_owned());
        }
        Ok(keys)
    }

    /// How many keys there are.
    pub(crate) fn len(&self) -> usize {
        self.ssh.len() + self.pgp.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks one signature over `payload`. `committed_at` (unix seconds) is the time
    /// `valid-after`/`valid-before` are compared with, as git does.
    pub(crate) fn check(
        &self,
        signature: &[u8],
        payload: &[u8],
        committed_at: i64,
    ) -> std::result::Result<String, Refusal> {
        let text = signature.trim_start();
        if text.starts_with(b"-----BEGIN SSH SIGNATURE-----") {
            self.check_ssh(text, payload, committed_at)
        } else if text.starts_with(b"-----BEGIN PGP SIGNATURE-----") {
            self.check_pgp(text, payload)
        } else {
            Err(Refusal::Unsupported(
                "not an SSH or OpenPGP signature (x509/S/MIME signatures are not supported)"
                    .to_owned(),
            ))
        }
    }

    fn check_ssh(
        &self,
        armored: &[u8],
        payload: &[u8],
        committed_at: i64,
    ) -> std::result::Result<String, Refusal> {
        let signature = ssh_key::SshSig::from_pem(armored)
            .map_err(|error| Refusal::BadSignature(format!("unreadable SSH signature: {error}")))?;
        let fingerprint = signature
            .public_key()
            .fingerprint(ssh_key::HashAlg::Sha256)
            .to_string();
        let algorithm = signature.public_key().algorithm();
        let Some(signer) = self.ssh.iter().find(|signer| {
            signer.key.key_data() == signature.public_key()
                && signer
                    .namespaces
                    .as_ref()
                    .is_none_or(|namespaces| namespaces.iter().any(|n| n == "git"))
                && signer.valid_after.is_none_or(|after| committed_at >= after)
                && signer
                    .valid_before
                    .is_none_or(|before| committed_at < before)
        }) else {
            let listed = self
                .ssh
                .iter()
                .any(|signer| signer.key.key_data() == signature.public_key());
            let why = match (&self.ssh_file, listed) {
                (None, _) => " (no --trusted-ssh-signers is given)".to_owned(),
                (Some(_), true) => {
                    " (listed, but not for namespace \"git\" or not valid at the commit's time)"
                        .to_owned()
                }
                (Some(path), false) => format!(" (not in {})", path.display()),
            };
            return Err(Refusal::UnknownKey(format!(
                "{fingerprint} ({algorithm}){why}"
            )));
        };
        if signature.namespace() != "git" {
            return Err(Refusal::BadSignature(format!(
                "signed by {fingerprint} for namespace {:?}, not \"git\"",
                signature.namespace()
            )));
        }
        signer
            .key
            .verify("git", payload, &signature)
            .map_err(|error| Refusal::BadSignature(format!("by {fingerprint}: {error}")))?;
        Ok(format!("ssh {fingerprint} ({})", signer.principals))
    }

    fn check_pgp(&self, armored: &[u8], payload: &[u8]) -> std::result::Result<String, Refusal> {
        use pgp::composed::{Deserializable as _, DetachedSignature};
        use pgp::types::KeyDetails as _;
        let unreadable =
            |error: String| Refusal::BadSignature(format!("unreadable OpenPGP signature: {error}"));
        let signature_block =
            |typ: &pgp::armor::BlockType| matches!(typ, pgp::armor::BlockType::Signature);
        let packets = dearmor(armored, signature_block)
            .map_err(unreadable)?
            .ok_or_else(|| unreadable("no armored block".to_owned()))?;
        let signature = DetachedSignature::from_bytes(&packets[..])
            .map_err(|error| unreadable(error.to_string()))?;
        let issuers: Vec<String> = signature
            .signature
            .issuer_fingerprint()
            .iter()
            .map(|fingerprint| format!("{fingerprint:X}"))
            .chain(
                signature
                    .signature
                    .issuer_key_id()
                    .iter()
                    .map(|key_id| hex_upper(key_id.as_ref())),
            )
            .collect();
        let issued_by = |fingerprint: &pgp::types::Fingerprint, key_id: &pgp::types::KeyId| {
            let fingerprint = format!("{fingerprint:X}");
            let key_id = hex_upper(key_id.as_ref());
            issuers
                .iter()
                .any(|issuer| *issuer == fingerprint || *issuer == key_id)
        };
        let name = issuers
            .first()
            .cloned()
            .unwrap_or_else(|| "(no issuer)".to_owned());
        for key in &self.pgp {
            let user = key
                .details
                .users
                .first()
                .map(|user| String::from_utf8_lossy(user.id.id()).into_owned())
                .unwrap_or_default();
            let primary = &key.primary_key;
            if issued_by(&primary.fingerprint(), &primary.legacy_key_id()) {
                return signature
                    .verify(primary, payload)
                    .map(|()| format!("openpgp {:X} ({user})", primary.fingerprint()))
                    .map_err(|error| Refusal::BadSignature(format!("by {name}: {error}")));
            }
            for subkey in &key.public_subkeys {
                if issued_by(&subkey.key.fingerprint(), &subkey.key.legacy_key_id()) {
                    return signature
                        .verify(&subkey.key, payload)
                        .map(|()| {
                            format!(
                                "openpgp {:X} (subkey of {:X}, {user})",
                                subkey.key.fingerprint(),
                                primary.fingerprint()
                            )
                        })
                        .map_err(|error| Refusal::BadSignature(format!("by {name}: {error}")));
                }
            }
        }
        let why = match &self.pgp_file {
            None => " (no --trusted-pgp-keys is given)".to_owned(),
            Some(path) => format!(" (not in {})", path.display()),
        };
        Err(Refusal::UnknownKey(format!("{name} (OpenPGP){why}")))
    }
}

/// Why a commit is not trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Unsigned,
    UnknownKey(String),
    BadSignature(String),
    Unsupported(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unsigned => f.write_str("unsigned"),
            Refusal::UnknownKey(key) => write!(f, "unknown key {key}"),
            Refusal::BadSignature(why) => write!(f, "bad signature {why}"),
            Refusal::Unsupported(why) => write!(f, "unsupported signature: {why}"),
        }
    }
}

/// A commit that failed verification: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untrusted {
    pub(crate) commit: CommitSha,
    pub(crate) refusal: Refusal,
}

/// What a verification checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// How many commits were checked.
    pub n_commits: usize,
    /// Who signed the tip.
    pub(crate) tip_signer: String,
}

/// Verifies the commits `mode` asks for: `tip`, or every commit reachable from `tip` and not
/// from `since` (the last applied commit; `None`: the tip alone). `Ok(Err(_))` names the first
/// untrusted commit, newest first.
pub(super) fn verify(
    repo: &gix::Repository,
    keys: &TrustedKeys,
    mode: VerifyMode,
    since: Option<&CommitSha>,
    tip: &CommitSha,
) -> Result<std::result::Result<Verified, Untrusted>> {
    let read_error = |sha: &CommitSha, error: &dyn std::fmt::Display| Error::Read {
        sha: sha.to_string(),
        message: error.to_string(),
    };
    let tip_id = object_id(tip)?;
    let since_id = match (mode, since) {
        (VerifyMode::All, Some(since)) if since != tip => {
            // A last applied commit the mirror no longer has (a force push that dropped it
            // and a garbage collection since) cannot bound the range: check the tip alone.
            object_id(since)
                .ok()
                .filter(|id| repo.find_commit(*id).is_ok())
        }
        _ => None,
    };
    let ids: Vec<gix::ObjectId> = match since_id {
        None => vec![tip_id],
        Some(since_id) => {
            let walk = repo
                .rev_walk([tip_id])
                .with_hidden([since_id])
                .all()
                .map_err(|error| read_error(tip, &error))?;
            let mut ids = Vec::new();
            for info in walk {
                let info = info.map_err(|error| read_error(tip, &error))?;
                if ids.len() == MAX_VERIFIED_COMMITS {
                    return Ok(Err(Untrusted {
                        commit: tip.clone(),
                        refusal: Refusal::Unsupported(format!(
                            "more than {MAX_VERIFIED_COMMITS} commits since the last applied one; verify mode `all` checks at most that many per sync"
                        )),
                    }));
                }
                ids.push(info.id);
            }
            ids
        }
    };
    let mut tip_signer = String::new();
    for id in &ids {
        let sha = CommitSha::new(id.to_hex().to_string());
        let commit = repo
            .find_commit(*id)
            .map_err(|error| read_error(&sha, &error))?;
        let committed_at = commit
            .committer()
            .map_err(|error| read_error(&sha, &error))?
            .seconds();
        let signature = commit
            .signature()
            .map_err(|error| read_error(&sha, &error))?;
        let Some((signature, signed)) = signature else {
            return Ok(Err(Untrusted {
                commit: sha,
                refusal: Refusal::Unsigned,
            }));
        };
        match keys.check(&signature, &signed.to_bstring(), committed_at) {
            Ok(signer) => {
                if *id == tip_id {
                    tip_signer = signer;
                }
            }
            Err(refusal) => {
                return Ok(Err(Untrusted {
                    commit: sha,
                    refusal,
                }));
            }
        }
    }
    Ok(Ok(Verified {
        n_commits: ids.len(),
        tip_signer,
    }))
}

fn object_id(sha: &CommitSha) -> Result<gix::ObjectId> {
    gix::ObjectId::from_hex(sha.as_str().as_bytes()).map_err(|error| Error::Read {
        sha: sha.to_string(),
        message: error.to_string(),
    })
}

fn hex_upper(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02X}");
        out
    })
}

/// Why an `allowed_signers` file is refused, by line.
#[derive(Debug, thiserror::Error)]
enum SignersError {
    #[error("line {line}: no public key (want `principals [options] ssh-ed25519 AAAA…`)")]
    NoKey { line: usize },
    #[error("line {line}: {source}")]
    Key {
        line: usize,
        #[source]
        source: ssh_key::Error,
    },
    #[error("line {line}: {option}={value:?} is not YYYYMMDD[HHMM[SS]][Z]")]
    Time {
        line: usize,
        option: &'static str,
        value: String,
    },
    #[error("line {line}: cert-authority keys are not supported; list the signing keys themselves")]
    CertAuthority { line: usize },
    #[error("line {line}: unknown option {option:?}")]
    Option { line: usize, option: String },
}

/// Why an OpenPGP keyring is refused.
#[derive(Debug, thiserror::Error)]
enum KeyringError {
    #[error("{0}")]
    Parse(#[source] pgp::errors::Error),
    #[error("a key's self-signatures do not verify: {0}")]
    Bindings(#[source] pgp::errors::Error),
    #[error("holds a secret key: give the agent public keys only (`gpg --export --armor KEYID`)")]
    Secret,
    #[error("holds no OpenPGP public key")]
    Empty,
    #[error("{0}, not keys (`gpg --export --armor KEYID` writes keys)")]
    Armor(String),
}

/// Parses git's `allowed_signers` format (ssh-keygen(1) "ALLOWED SIGNERS"): per line
/// `principals [options] keytype base64-key [comment]`; `#` lines and blank lines skipped.
fn parse_allowed_signers(text: &str) -> std::result::Result<Vec<AllowedSigner>, SignersError> {
    let mut signers = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let tokens = split_quoted(line);
        let Some((principals, rest)) = tokens.split_first() else {
            continue;
        };
        let key_at = rest
            .iter()
            .position(|token| is_key_type(token))
            .ok_or(SignersError::NoKey { line: number })?;
        let mut signer = AllowedSigner {
            principals: principals.trim_matches('"').to_owned(),
            key: ssh_key::PublicKey::from_openssh(&rest[key_at..].join(" ")).map_err(|source| {
                SignersError::Key {
                    line: number,
                    source,
                }
            })?,
            namespaces: None,
            valid_after: None,
            valid_before: None,
        };
        for option in rest[..key_at]
            .iter()
            .flat_map(|options| split_options(options))
        {
            let (name, value) = option
                .split_once('=')
                .map_or((option.as_str(), ""), |(name, value)| {
                    (name, value.trim_matches('"'))
                });
            match name.to_ascii_lowercase().as_str() {
                "namespaces" => {
                    signer.namespaces =
                        Some(value.split(',').map(|n| n.trim().to_owned()).collect());
                }
                "valid-after" => {
                    signer.valid_after =
                        Some(parse_ssh_time(value).ok_or_else(|| SignersError::Time {
                            line: number,
                            option: "valid-after",
                            value: value.to_owned(),
                        })?);
                }
                "valid-before" => {
                    signer.valid_before =
                        Some(parse_ssh_time(value).ok_or_else(|| SignersError::Time {
                            line: number,
                            option: "valid-before",
                            value: value.to_owned(),
                        })?);
                }
                "cert-authority" => {
                    return Err(SignersError::CertAuthority { line: number });
                }
                other => {
                    return Err(SignersError::Option {
                        line: number,
                        option: other.to_owned(),
                    });
                }
            }
        }
        signers.push(signer);
    }
    Ok(signers)
}

fn is_key_type(token: &str) -> bool {
    token.starts_with("ssh-") || token.starts_with("ecdsa-sha2-") || token.starts_with("sk-")
}

/// Splits on whitespace outside double quotes.
fn split_quoted(line: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !current.is_empty() {
                    tokens.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        tokens.push(current);
    }
    tokens
}

/// Splits an options token on commas outside double quotes.
fn split_options(options: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in options.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            ',' if !quoted => parts.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
}

/// `YYYYMMDD[HHMM[SS]]` with an optional `Z`, as unix seconds; read as UTC (ssh-keygen reads
/// a time without `Z` in the local zone: the agent's hosts run in UTC as a rule).
fn parse_ssh_time(text: &str) -> Option<i64> {
    let digits = text.strip_suffix(['Z', 'z']).unwrap_or(text);
    if !matches!(digits.len(), 8 | 12 | 14) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let field = |range: std::ops::Range<usize>| -> Option<u32> { digits.get(range)?.parse().ok() };
    let date = chrono::NaiveDate::from_ymd_opt(
        i32::try_from(field(0..4)?).ok()?,
        field(4..6)?,
        field(6..8)?,
    )?;
    let hour = if digits.len() >= 12 { field(8..10)? } else { 0 };
    let minute = if digits.len() >= 12 {
        field(10..12)?
    } else {
        0
    };
    let second = if digits.len() == 14 {
        field(12..14)?
    } else {
        0
    };
    Some(
        date.and_hms_opt(hour, minute, second)?
            .and_utc()
            .timestamp(),
    )
}

/// Reads OpenPGP public keys (armored or binary, one or many); each key's self-signatures
/// and subkey bindings must verify.
///
/// An armored keyring is dearmored here and both forms are parsed from bytes: pgp's own
/// "armored or binary" reader compiles its whole packet parser twice, once per reader type
/// (≈ 0.1 MB of the binary).
fn parse_pgp_keyring(
    bytes: &[u8],
) -> std::result::Result<Vec<pgp::composed::SignedPublicKey>, KeyringError> {
    use pgp::composed::PublicOrSecret;
    // As pgp tells them: a binary packet starts with its high bit set.
    let binary: std::borrow::Cow<'_, [u8]> = if bytes.first().is_some_and(|byte| byte & 0x80 != 0) {
        std::borrow::Cow::Borrowed(bytes)
    } else {
        let keys = |typ: &pgp::armor::BlockType| {
            matches!(
                typ,
                pgp::armor::BlockType::PublicKey | pgp::armor::BlockType::PrivateKey
            )
        };
        match dearmor(bytes, keys).map_err(KeyringError::Armor)? {
            Some(packets) => std::borrow::Cow::Owned(packets),
            None => return Err(KeyringError::Empty),
        }
    };
    let parsed = PublicOrSecret::from_bytes_many(&binary[..]).map_err(KeyringError::Parse)?;
    let mut keys = Vec::new();
    for key in parsed {
        match key.map_err(KeyringError::Parse)? {
            PublicOrSecret::Public(key) => {
                key.verify_bindings().map_err(KeyringError::Bindings)?;
                keys.push(key);
            }
            PublicOrSecret::Secret(_) => return Err(KeyringError::Secret),
        }
    }
    if keys.is_empty() {
        return Err(KeyringError::Empty);
    }
    Ok(keys)
}

/// The packets of an armored block (its first), which must be of a type `wanted` accepts;
/// else why not, or `Ok(None)` for no block at all. Every OpenPGP input is dearmored here and
/// parsed from bytes: pgp's own readers of armor compile its packet parser once more for
/// their reader type (≈ 0.1 MB of the binary).
fn dearmor(
    armored: &[u8],
    wanted: fn(&pgp::armor::BlockType) -> bool,
) -> std::result::Result<Option<Vec<u8>>, String> {
    use std::io::Read as _;
    let mut dearmor = pgp::armor::Dearmor::new(armored);
    dearmor.read_header().map_err(|error| error.to_string())?;
    match &dearmor.typ {
        Some(typ) if wanted(typ) => {}
        Some(other) => return Err(format!("is an armored {other} block")),
        None => return Ok(None),
    }
    let mut packets = Vec::new();
    dearmor
        .read_to_end(&mut packets)
        .map_err(|error| error.to_string())?;
    Ok(Some(packets))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED25519: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINWPRYKWnomdl8wTIACQAT/gh53ooAWqOw0V/34fOFTU";

    #[test]
    fn allowed_signers_lines_parse_as_git_writes_them()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        let text = format!(
            "# team keys\n\nalice@example.com {ED25519} alice laptop\n\"bob@example.com,carol@example.com\" namespaces=\"git,file\",valid-after=20240101,valid-before=\"20300101Z\" {ED25519}\n"
        );
        let signers = parse_allowed_signers(&text)?;
        assert_eq!(signers.len(), 2);
        assert_eq!(signers[0].principals, "alice@example.com");
        assert_eq!(signers[0].namespaces, None);
        assert_eq!(signers[1].principals, "bob@example.com,carol@example.com");
        assert_eq!(
            signers[1].namespaces.as_deref(),
            Some(&["git".to_owned(), "file".to_owned()][..])
        );
        assert_eq!(signers[1].valid_after, Some(1_704_067_200));
        assert_eq!(signers[1].valid_before, Some(1_893_456_000));
        let refused = |text: &str| {
            parse_allowed_signers(text)
                .err()
                .map(|error| error.to_string())
                .unwrap_or_default()
        };
        assert!(refused("alice").contains("line 1: no public key"));
        assert!(
            refused(&format!("a cert-authority {ED25519}"))
                .contains("cert-authority keys are not supported")
        );
        assert!(refused(&format!("a bogus=1 {ED25519}")).contains("unknown option \"bogus\""));
        assert!(refused("a ssh-ed25519 notbase64").starts_with("line 1:"));
        assert!(refused(&format!("a valid-after=2024 {ED25519}")).contains("valid-after"));
        Ok(())
    }

    #[test]
    fn refusals_read_as_status_shows_them() {
        assert_eq!(Refusal::Unsigned.to_string(), "unsigned");
        assert_eq!(
            Refusal::UnknownKey("SHA256:abc (ED25519)".into()).to_string(),
            "unknown key SHA256:abc (ED25519)"
        );
        assert_eq!(
            Refusal::BadSignature("by SHA256:abc: signature error".into()).to_string(),
            "bad signature by SHA256:abc: signature error"
        );
    }

    #[test]
    fn keyrings_without_public_keys_are_refused() {
        assert!(parse_pgp_keyring(b"").is_err());
        assert!(parse_pgp_keyring(b"not a key").is_err());
        let signature = b"-----BEGIN PGP SIGNATURE-----\n\nAAAA\n-----END PGP SIGNATURE-----\n";
        let refused = parse_pgp_keyring(signature)
            .err()
            .map(|error| error.to_string())
            .unwrap_or_default();
        assert!(
            refused.contains("is an armored PGP SIGNATURE block, not keys"),
            "{refused}"
        );
    }
}
