//! Opening SOPS files with the host's age identities (`--age-identity`): the data key is
//! unwrapped from the file's age stanza (`assets::age`), every `ENC[AES256_GCM,data:…,iv:…,
//! tag:…,type:…]` value is decrypted with AES-256-GCM (32-byte IV, the value's path `a:b:` as
//! additional data), and the MAC — SHA-512 over the values in file order, itself encrypted with
//! `lastmodified` as additional data — must match before anything is used.
//!
//! Invariants: identities come from the agent's own files, never from the repository; a
//! decrypted value lives in memory only, for as long as its caller needs it, and appears in no
//! error, log line or `Debug` output (errors name the file and the reason: no matching key,
//! MAC mismatch, malformed); `Keyring`'s `Debug` shows recipients only.

use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead as _, KeyInit as _, Payload};
use sha2::{Digest as _, Sha512};

use super::age;
use crate::manifest::sops::{Node, SopsFile, SopsFormat};

/// Why a SOPS file cannot be opened. Never carries a decrypted value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SopsError {
    #[error(
        "no matching key: the file is encrypted for {recipients}; the agent holds {held} (--age-identity)"
    )]
    NoMatchingKey { recipients: String, held: String },
    #[error(
        "MAC mismatch: the values were changed without sops (or the file was damaged); re-encrypt it with sops"
    )]
    MacMismatch,
    #[error("{0}")]
    Unsupported(String),
    #[error("malformed SOPS file: {0}")]
    Malformed(String),
}

/// Why `--age-identity` files cannot be used. Names the file, never its contents.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("cannot read age identity file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{} line {line}: not an age identity (want AGE-SECRET-KEY-1…; plugin and SSH identities are not supported)",
        path.display()
    )]
    NotIdentity { path: PathBuf, line: usize },
    #[error("{} holds no age identity", path.display())]
    Empty { path: PathBuf },
}

/// Why one `ENC[AES256_GCM,…]` value does not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum ValueError {
    #[error("not an ENC[AES256_GCM,…] value")]
    NotEncrypted,
    #[error("a field without `:`")]
    Field,
    #[error("{0} is not base64")]
    Base64(&'static str),
    #[error("data, iv, tag or type is missing")]
    Missing,
    #[error("iv must be 32 bytes and tag 16")]
    Lengths,
    #[error("bad data key length")]
    KeyLength,
    #[error("authentication failed (wrong key, or the value or its path changed)")]
    Authentication,
}

/// The age identities the agent decrypts with. `Debug` shows their recipients only.
#[derive(Default)]
pub struct Keyring {
    identities: Vec<age::Identity>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("recipients", &self.recipients())
            .finish()
    }
}

impl Keyring {
    /// Reads age identity files (`age-keygen` output: `AGE-SECRET-KEY-1…` lines, `#`
    /// comments). An error names the file, never its contents.
    pub fn load(paths: &[impl AsRef<Path>]) -> Result<Keyring, KeyringError> {
        let mut identities = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let text = std::fs::read_to_string(path).map_err(|source| KeyringError::Read {
                path: path.to_owned(),
                source,
            })?;
            let before = identities.len();
            for (index, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let identity: age::Identity =
                    line.parse().map_err(|_| KeyringError::NotIdentity {
                        path: path.to_owned(),
                        line: index + 1,
                    })?;
                identities.push(identity);
            }
            if identities.len() == before {
                return Err(KeyringError::Empty {
                    path: path.to_owned(),
                });
            }
        }
        Ok(Keyring { identities })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.identities.is_empty()
    }

    /// The public recipients (`age1…`) of the identities held.
    pub(crate) fn recipients(&self) -> Vec<String> {
        self.identities
            .iter()
            .map(age::Identity::recipient)
            .collect()
    }

    /// Decrypts `file` whole and checks its MAC.
    pub fn open(&self, file: &SopsFile) -> Result<Plain, SopsError> {
        if file.metadata.key_groups > 1 {
            return Err(SopsError::Unsupported(
                "key groups with Shamir's secret sharing are not supported; encrypt for age recipients directly".to_owned(),
            ));
        }
        let data_key = self.data_key(file)?;
        let mut mac = Sha512::new();
        let mut branches = Vec::with_capacity(file.branches.len());
        for branch in &file.branches {
            let mut path: Vec<String> = Vec::new();
            let mut entries = Vec::with_capacity(branch.len());
            for (key, value) in branch {
                path.push(key.clone());
                entries.push((
                    key.clone(),
                    decrypt_node(&data_key, file, value, &mut path, &mut mac)?,
                ));
                path.pop();
            }
            branches.push(entries);
        }
        let computed: String = mac
            .finalize()
            .iter()
            .map(|byte| format!("{byte:02X}"))
            .collect();
        let stored = decrypt_value(
            &data_key,
            &file.metadata.mac,
            &rfc3339(&file.metadata.lastmodified),
        )
        .map_err(|_| SopsError::MacMismatch)?;
        if !constant_time_eq(&stored.0, computed.as_bytes()) {
            return Err(SopsError::MacMismatch);
        }
        Ok(Plain {
            format: file.format,
            branches,
        })
    }

    fn data_key(&self, file: &SopsFile) -> Result<[u8; 32], SopsError> {
        if file.metadata.age.is_empty() {
            return Err(SopsError::Unsupported(format!(
                "the file is encrypted for {} only; the agent decrypts with age recipients (sops --age)",
                if file.metadata.other_keys.is_empty() {
                    "no key".to_owned()
                } else {
                    file.metadata.other_keys.join(", ")
                }
            )));
        }
        let held = self.recipients();
        for stanza in &file.metadata.age {
            if !held.contains(&stanza.recipient) {
                continue;
            }
            let key = age::decrypt(&self.identities, stanza.enc.as_bytes()).map_err(|error| {
                SopsError::Malformed(format!("the age stanza for {}: {error}", stanza.recipient))
            })?;
            return key
                .try_into()
                .map_err(|_| SopsError::Malformed("the data key is not 32 bytes".to_owned()));
        }
        Err(SopsError::NoMatchingKey {
            recipients: file
                .metadata
                .age
                .iter()
                .map(|stanza| stanza.recipient.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            held: if held.is_empty() {
                "no identity".to_owned()
            } else {
                held.join(", ")
            },
        })
    }
}

/// A decrypted SOPS file. `Debug` shows its shape, never a value.
pub struct Plain {
    format: SopsFormat,
    branches: Vec<Vec<(String, Node)>>,
}

impl std::fmt::Debug for Plain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plain")
            .field("format", &self.format)
            .field(
                "keys",
                &self.branches.first().map(|branch| {
                    branch
                        .iter()
                        .map(|(key, _)| key.as_str())
                        .collect::<Vec<_>>()
                }),
            )
            .finish()
    }
}

impl Plain {
    /// The file as environment variables: the top-level entries of a dotenv, YAML or JSON file
    /// (scalars only: a nested value cannot be an environment variable).
    pub fn env(&self) -> Result<Vec<(String, String)>, SopsError> {
        if self.format == SopsFormat::Binary {
            return Err(SopsError::Unsupported(
                "a binary SOPS file is not a list of variables; encrypt the env file as dotenv (sops --input-type dotenv) or use it as an asset".to_owned(),
            ));
        }
        let mut env = Vec::new();
        for (key, value) in self.branches.first().into_iter().flatten() {
            let text = match value {
                Node::Str(text) | Node::Float(text) => text.clone(),
                Node::Int(number) => number.to_string(),
                Node::Bool(flag) => flag.to_string(),
                Node::Null => String::new(),
                Node::Bytes(_) => {
                    return Err(SopsError::Unsupported(format!(
                        "{key:?} is not UTF-8 text; an environment variable must be"
                    )));
                }
                Node::Map(_) | Node::List(_) => {
                    return Err(SopsError::Unsupported(format!(
                        "{key:?} holds a nested value; an env file's values must be scalars"
                    )));
                }
            };
            env.push((key.clone(), text));
        }
        Ok(env)
    }

    /// The decrypted file as `sops --decrypt` would write it: a binary file's bytes, dotenv
    /// lines, JSON (keys sorted) or YAML (comments dropped).
    pub fn file_bytes(&self) -> Result<Vec<u8>, SopsError> {
        match self.format {
            SopsFormat::Binary => match self
                .branches
                .first()
                .and_then(|branch| branch.iter().find(|(key, _)| key == "data"))
            {
                Some((_, Node::Str(text))) => Ok(text.clone().into_bytes()),
                Some((_, Node::Bytes(bytes))) => Ok(bytes.clone()),
                _ => Err(SopsError::Malformed(
                    "a binary file without `data`".to_owned(),
                )),
            },
            SopsFormat::Dotenv => {
                let mut out = String::new();
                for (key, value) in self.env()? {
                    out.push_str(&key);
                    out.push('=');
                    out.push_str(&value.replace('\n', "\\n"));
                    out.push('\n');
                }
                Ok(out.into_bytes())
            }
            SopsFormat::Json => {
                let value = self
                    .branches
                    .first()
                    .map(|branch| json_map(branch))
                    .unwrap_or_default();
                let mut text = serde_json::to_string_pretty(&serde_json::Value::Object(value))
                    .map_err(|error| SopsError::Malformed(error.to_string()))?;
                text.push('\n');
                Ok(text.into_bytes())
            }
            SopsFormat::Yaml => {
                let mut out = String::new();
                for (index, branch) in self.branches.iter().enumerate() {
                    if index > 0 {
                        out.push('\n');
                    }
                    let mut emitter = yaml_rust2::YamlEmitter::new(&mut out);
                    emitter
                        .dump(&yaml_map(branch))
                        .map_err(|error| SopsError::Malformed(format!("{error:?}")))?;
                    out.push('\n');
                }
                Ok(out.into_bytes())
            }
        }
    }
}

fn json_map(entries: &[(String, Node)]) -> serde_json::Map<String, serde_json::Value> {
    // Inserted, not collected: see `model::map_of`.
    let mut map = serde_json::Map::new();
    for (key, value) in entries {
        map.insert(key.clone(), json_value(value));
    }
    map
}

fn json_value(node: &Node) -> serde_json::Value {
    match node {
        Node::Map(entries) => serde_json::Value::Object(json_map(entries)),
        Node::List(items) => serde_json::Value::Array(items.iter().map(json_value).collect()),
        Node::Str(text) => serde_json::Value::String(text.clone()),
        Node::Int(number) => serde_json::Value::from(*number),
        Node::Float(text) => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(
                || serde_json::Value::String(text.clone()),
                serde_json::Value::Number,
            ),
        Node::Bool(flag) => serde_json::Value::Bool(*flag),
        Node::Null => serde_json::Value::Null,
        Node::Bytes(bytes) => {
            serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned())
        }
    }
}

fn yaml_map(entries: &[(String, Node)]) -> yaml_rust2::Yaml {
    let mut map = yaml_rust2::yaml::Hash::new();
    for (key, value) in entries {
        map.insert(yaml_rust2::Yaml::String(key.clone()), yaml_value(value));
    }
    yaml_rust2::Yaml::Hash(map)
}

fn yaml_value(node: &Node) -> yaml_rust2::Yaml {
    use yaml_rust2::Yaml;
    match node {
        Node::Map(entries) => yaml_map(entries),
        Node::List(items) => Yaml::Array(items.iter().map(yaml_value).collect()),
        Node::Str(text) => Yaml::String(text.clone()),
        Node::Int(number) => Yaml::Integer(*number),
        Node::Float(text) => Yaml::Real(text.clone()),
        Node::Bool(flag) => Yaml::Boolean(*flag),
        Node::Null => Yaml::Null,
        Node::Bytes(bytes) => Yaml::String(String::from_utf8_lossy(bytes).into_owned()),
    }
}

/// Decrypts a value tree in place order, feeding the MAC as SOPS does: every non-null leaf
/// (only the encrypted ones with `mac_only_encrypted`), as the bytes of its plaintext. Lists
/// add no path segment (SOPS's `walkSlice`).
fn decrypt_node(
    data_key: &[u8; 32],
    file: &SopsFile,
    node: &Node,
    path: &mut Vec<String>,
    mac: &mut Sha512,
) -> Result<Node, SopsError> {
    let mac_only_encrypted = file.metadata.mac_only_encrypted;
    Ok(match node {
        Node::Map(entries) => {
            let mut out = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                path.push(key.clone());
                let decrypted = decrypt_node(data_key, file, value, path, mac);
                path.pop();
                out.push((key.clone(), decrypted?));
            }
            Node::Map(out)
        }
        Node::List(items) => Node::List(
            items
                .iter()
                .map(|item| decrypt_node(data_key, file, item, path, mac))
                .collect::<Result<_, _>>()?,
        ),
        Node::Str(text) if text.starts_with("ENC[AES256_GCM,") => {
            let additional = format!("{}:", path.join(":"));
            let (plain, kind) = decrypt_value(data_key, text, &additional).map_err(|why| {
                SopsError::Malformed(format!(
                    "cannot decrypt the value at {}: {why}",
                    path.join(".")
                ))
            })?;
            mac.update(&plain);
            match String::from_utf8(plain) {
                Ok(plain) => typed(plain, &kind),
                Err(bytes) => Node::Bytes(bytes.into_bytes()),
            }
        }
        Node::Null => Node::Null,
        plain => {
            if !mac_only_encrypted {
                mac.update(mac_bytes(plain).as_bytes());
            }
            plain.clone()
        }
    })
}

/// SOPS's `ToBytes` of a value left in clear (`_unencrypted` keys).
fn mac_bytes(node: &Node) -> String {
    match node {
        Node::Str(text) => text.clone(),
        Node::Int(number) => number.to_string(),
        Node::Float(text) => text
            .parse::<f64>()
            .map_or_else(|_| text.clone(), |value| format!("{value}")),
        Node::Bool(true) => "True".to_owned(),
        Node::Bool(false) => "False".to_owned(),
        Node::Bytes(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Node::Null | Node::Map(_) | Node::List(_) => String::new(),
    }
}

/// A decrypted value as its `type:` says.
fn typed(plain: String, kind: &str) -> Node {
    match kind {
        "int" => plain.parse().map_or(Node::Str(plain), Node::Int),
        "float" => Node::Float(plain),
        "bool" => Node::Bool(plain.eq_ignore_ascii_case("true")),
        _ => Node::Str(plain),
    }
}

/// Opens one `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]`: the plaintext and its type.
fn decrypt_value(
    data_key: &[u8; 32],
    value: &str,
    additional: &str,
) -> Result<(Vec<u8>, String), ValueError> {
    let inner = value
        .strip_prefix("ENC[AES256_GCM,")
        .and_then(|rest| rest.strip_suffix(']'))
        .ok_or(ValueError::NotEncrypted)?;
    let mut data = None;
    let mut iv = None;
    let mut tag = None;
    let mut kind = None;
    for part in inner.split(',') {
        let (name, field) = part.split_once(':').ok_or(ValueError::Field)?;
        match name {
            "data" => data = Some(from_base64(field).ok_or(ValueError::Base64("data"))?),
            "iv" => iv = Some(from_base64(field).ok_or(ValueError::Base64("iv"))?),
            "tag" => tag = Some(from_base64(field).ok_or(ValueError::Base64("tag"))?),
            "type" => kind = Some(field.to_owned()),
            _ => {}
        }
    }
    let (Some(mut data), Some(iv), Some(tag), Some(kind)) = (data, iv, tag, kind) else {
        return Err(ValueError::Missing);
    };
    if iv.len() != 32 || tag.len() != 16 {
        return Err(ValueError::Lengths);
    }
    type Aes256Gcm32 = aes_gcm::AesGcm<aes_gcm::aes::Aes256, aes_gcm::aead::consts::U32>;
    let cipher = Aes256Gcm32::new_from_slice(data_key).map_err(|_| ValueError::KeyLength)?;
    data.extend_from_slice(&tag);
    let nonce = aes_gcm::Nonce::<aes_gcm::aead::consts::U32>::from_slice(&iv);
    let plain = cipher
        .decrypt(
            nonce,
            Payload {
                msg: &data,
                aad: additional.as_bytes(),
            },
        )
        .map_err(|_| ValueError::Authentication)?;
    Ok((plain, kind))
}

/// `lastmodified` as Go's `time.RFC3339` writes it back (SOPS re-formats the parsed time):
/// UTC as `Z`, no fractional seconds.
fn rfc3339(text: &str) -> String {
    let Ok(time) = chrono::DateTime::parse_from_rfc3339(text) else {
        return text.to_owned();
    };
    let offset = time.offset().local_minus_utc();
    // The wall time at the offset, as the Unix time that reads the same in UTC.
    let wall = crate::base::utc_date_time(time.timestamp() + i64::from(offset), 'T');
    if offset == 0 {
        return format!("{wall}Z");
    }
    let sign = if offset < 0 { '-' } else { '+' };
    let minutes = offset.unsigned_abs() / 60;
    format!("{wall}{sign}{:02}:{:02}", minutes / 60, minutes % 60)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Standard base64 with padding.
fn from_base64(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    /// As Go's `time.RFC3339` prints the parsed time: `Z` for UTC, the offset otherwise, no
    /// fractional seconds; text that is not a time is used as it is.
    #[test]
    fn lastmodified_is_written_back_as_go_does() {
        assert_eq!(rfc3339("2024-03-05T10:11:12Z"), "2024-03-05T10:11:12Z");
        assert_eq!(
            rfc3339("2024-03-05T10:11:12.123456Z"),
            "2024-03-05T10:11:12Z"
        );
        assert_eq!(rfc3339("2024-03-05T10:11:12+00:00"), "2024-03-05T10:11:12Z");
        assert_eq!(
            rfc3339("2024-03-05T00:30:00+05:30"),
            "2024-03-05T00:30:00+05:30"
        );
        assert_eq!(
            rfc3339("2024-01-01T00:00:00-08:00"),
            "2024-01-01T00:00:00-08:00"
        );
        assert_eq!(rfc3339("yesterday"), "yesterday");
    }
}
