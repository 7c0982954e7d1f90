//! `env_file = [...]`: dotenv files read from the repository, and SOPS-encrypted ones kept
//! by digest for the host to decrypt.

use std::collections::BTreeMap;

use super::super::reader::{DecodeCx, Reader};
use super::super::sources::Read;
use super::super::values;
use crate::manifest::Mode;
use crate::manifest::spec::{EncryptedEnv, sha256_hex};

/// `env_file = [...]`: read from the repo and merged in order (later wins), under `env`. A
/// file carrying SOPS metadata (`manifest::sops`) is not read for values: its variables are
/// named (they are in clear in the file) and its encrypted bytes kept by digest, to be
/// decrypted on the host; a later file or `env` still wins over the variables it names.
pub(super) fn env_files(
    cx: &mut DecodeCx<'_>,
    r: &mut Reader<'_>,
) -> (BTreeMap<String, String>, Vec<EncryptedEnv>) {
    let mut merged = BTreeMap::new();
    let mut encrypted: Vec<EncryptedEnv> = Vec::new();
    let Some(paths) = r.strings(cx, "env_file") else {
        return (merged, encrypted);
    };
    let span = r.span_of("env_file");
    for path in paths {
        match cx.read_file(&path) {
            Read::Bytes(bytes) => {
                if let Some(parsed) = crate::manifest::sops::parse(&bytes) {
                    match parsed {
                        Ok(file) if file.format == crate::manifest::sops::SopsFormat::Binary => {
                            cx.error(
                                span.clone(),
                                format!("env_file {path:?} is a binary SOPS file; encrypt an env file as dotenv, YAML or JSON (sops --input-type dotenv) so its variables are named"),
                            );
                        }
                        Ok(file) => {
                            let keys: Vec<String> = file
                                .top_level_keys()
                                .into_iter()
                                .map(ToOwned::to_owned)
                                .collect();
                            for name in &keys {
                                if let Err(problem) = values::env_name(name) {
                                    cx.error(
                                        span.clone(),
                                        format!("env_file {path:?}: {name:?}: {problem}"),
                                    );
                                }
                                merged.remove(name);
                                for earlier in &mut encrypted {
                                    earlier.keys.retain(|key| key != name);
                                }
                            }
                            let digest = sha256_hex(&bytes);
                            cx.blobs.insert(digest.clone(), bytes);
                            encrypted.push(EncryptedEnv {
                                path: path.clone(),
                                digest,
                                keys,
                            });
                        }
                        Err(problem) => cx.error(
                            span.clone(),
                            format!("env_file {path:?} is not a readable SOPS file: {problem}"),
                        ),
                    }
                    continue;
                }
                match crate::manifest::parse_env_file(&String::from_utf8_lossy(&bytes)) {
                    Ok(read) => {
                        for (name, value) in &read {
                            if let Err(problem) =
                                values::env_name(name).and_then(|()| values::env_value(value))
                            {
                                cx.error(
                                    span.clone(),
                                    format!("env_file {path:?}: {name:?}: {problem}"),
                                );
                            }
                            for earlier in &mut encrypted {
                                earlier.keys.retain(|key| key != name);
                            }
                        }
                        merged.extend(read);
                    }
                    Err(problem) => cx.error(span.clone(), format!("env_file {path:?} {problem}")),
                }
            }
            Read::Failed(message) if message.is_missing() && cx.env.mode == Mode::Validate => {
                cx.warn(
                    span.clone(),
                    format!("env_file {message}; the agent rejects a commit without it"),
                );
            }
            Read::Failed(message) => {
                cx.error(span.clone(), format!("env_file {message}"));
            }
        }
    }
    encrypted.retain(|file| !file.keys.is_empty());
    (merged, encrypted)
}
