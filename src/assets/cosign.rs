//! cosign's signatures of image digests, verified with public keys (no keyless, no
//! transparency log): what the runtime guard requires before it lets a container of a
//! signed-only repository be created.
//!
//! The format (sigstore/cosign `specs/SIGNATURE_SPEC.md`, `pkg/oci/remote`): the signatures of
//! `repo@sha256:<hex>` are the layers of the manifest tagged `sha256-<hex>.sig` in the same
//! repository; each layer (`application/vnd.dev.cosign.simplesigning.v1+json`) is a
//! simple-signing payload, `{"critical": {"identity": {"docker-reference": …}, "image":
//! {"docker-manifest-digest": "sha256:…"}, "type": "cosign container image signature"},
//! "optional": …}`, and its annotation `dev.cosignproject.cosign/signature` the base64
//! signature of the payload's bytes: ECDSA P-256 over SHA-256 (ASN.1 DER), cosign's keys; or
//! Ed25519 (Ed25519ph, SHA-512 prehash, as cosign signs with imported keys, or pure).
//!
//! Invariants: a digest is verified only by a payload whose signature verifies under a
//! trusted key AND whose `docker-manifest-digest` is that digest (a signature copied from
//! another image names another digest) AND whose type is cosign's; the payload's bytes are
//! the blob the registry served, checked against its digest (`registry::blob`); every
//! refusal says which of these failed. Pure but for `verify`, which asks the registry.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Weak};

use base64::Engine as _;
use sha2::Digest as _;

use super::registry::{self, Credentials, Scanner};

/// The annotation holding a layer's signature.
const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The media type of a signature layer.
const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// `critical.type` of a cosign signature payload.
const SIGNATURE_TYPE: &str = "cosign container image signature";
/// Most signature layers looked at (a manifest may carry many).
const MAX_SIGNATURES: usize = 16;

/// One trusted public key.
#[derive(Clone)]
pub enum PublicKey {
    P256(p256::ecdsa::VerifyingKey),
    Ed25519(ed25519_dalek::VerifyingKey),
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PublicKey::P256(_) => "PublicKey::P256",
            PublicKey::Ed25519(_) => "PublicKey::Ed25519",
        })
    }
}

/// The DER prefix of a P-256 SubjectPublicKeyInfo (id-ecPublicKey, prime256v1), before the
/// 65-byte uncompressed point.
const P256_SPKI: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
/// The DER prefix of an Ed25519 SubjectPublicKeyInfo, before the 32-byte key.
const ED25519_SPKI: &[u8] = &[
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// Why a text holds no usable public key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("a BEGIN PUBLIC KEY block without its END")]
    Unterminated,
    #[error("a public key is not base64: {0}")]
    Base64(#[source] base64::DecodeError),
    #[error(
        "no `-----BEGIN PUBLIC KEY-----` block (a PEM public key, as `cosign generate-key-pair` writes cosign.pub)"
    )]
    NoKey,
    #[error("a P-256 public key whose point is not on the curve")]
    P256Point,
    #[error("an Ed25519 public key that is not 32 bytes")]
    Ed25519Length,
    #[error("an Ed25519 public key that is not a point")]
    Ed25519Point,
    #[error("a public key that is neither ECDSA P-256 nor Ed25519 (cosign's keys are P-256)")]
    Algorithm,
}

/// A `--require-signature` key file that cannot be read or holds no key.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("--require-signature key file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--require-signature key file {path}: {source}")]
    Key {
        path: String,
        #[source]
        source: KeyError,
    },
}

/// Every `-----BEGIN PUBLIC KEY-----` block of `text` (SPKI, PEM): P-256 or Ed25519 keys.
pub fn parse_public_keys(text: &str) -> Result<Vec<PublicKey>, KeyError> {
    let mut keys = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN PUBLIC KEY-----") {
        let after = &rest[start + "-----BEGIN PUBLIC KEY-----".len()..];
        let end = after
            .find("-----END PUBLIC KEY-----")
            .ok_or(KeyError::Unterminated)?;
        let body: String = after[..end].split_whitespace().collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(KeyError::Base64)?;
        keys.push(public_key(&der)?);
        rest = &after[end..];
    }
    if keys.is_empty() {
        return Err(KeyError::NoKey);
    }
    Ok(keys)
}

fn public_key(der: &[u8]) -> Result<PublicKey, KeyError> {
    if let Some(point) = der.strip_prefix(P256_SPKI) {
        return p256::ecdsa::VerifyingKey::from_sec1_bytes(point)
            .map(PublicKey::P256)
            .map_err(|_| KeyError::P256Point);
    }
    if let Some(bytes) = der.strip_prefix(ED25519_SPKI) {
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| KeyError::Ed25519Length)?;
        return ed25519_dalek::VerifyingKey::from_bytes(&bytes)
            .map(PublicKey::Ed25519)
            .map_err(|_| KeyError::Ed25519Point);
    }
    Err(KeyError::Algorithm)
}

impl PublicKey {
    /// Whether `signature` (raw bytes) is this key's over `payload`.
    fn verifies(&self, payload: &[u8], signature: &[u8]) -> bool {
        match self {
            PublicKey::P256(key) => {
                use p256::ecdsa::signature::Verifier as _;
                let Ok(signature) = p256::ecdsa::Signature::from_der(signature)
                    .or_else(|_| p256::ecdsa::Signature::from_slice(signature))
                else {
                    return false;
                };
                key.verify(payload, &signature).is_ok()
            }
            PublicKey::Ed25519(key) => {
                let Ok(signature) = ed25519_dalek::Signature::from_slice(signature) else {
                    return false;
                };
                use ed25519_dalek::Digest as _;
                let mut prehash = ed25519_dalek::Sha512::new();
                prehash.update(payload);
                key.verify_strict(payload, &signature).is_ok()
                    || key.verify_prehashed(prehash, None, &signature).is_ok()
            }
        }
    }
}

/// The host policy's signature rules (`--require-signature`), their keys read.
#[derive(Debug, Clone, Default)]
pub struct Signatures {
    rules: Vec<Trusted>,
    /// The verifications in flight, by digest: releases that resolve the same digest at once
    /// wait for the first one's answer instead of asking the registry each.
    in_flight: Arc<std::sync::Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>>,
}

/// One rule with its keys.
#[derive(Debug, Clone)]
pub struct Trusted {
    pub rule: crate::model::policy::SignatureRule,
    pub(crate) keys: Vec<PublicKey>,
    /// What a verification under these keys is remembered by (`fingerprint`).
    pub fingerprint: String,
}

impl Signatures {
    /// Reads the key files of `policy`'s rules; a file that cannot be read or holds no key
    /// is an error naming it (the agent does not start).
    pub fn load(policy: &crate::model::Policy) -> Result<Signatures, LoadError> {
        let mut rules = Vec::new();
        for rule in &policy.require_signature {
            let mut keys = Vec::new();
            let mut texts = Vec::new();
            for path in &rule.keys {
                let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
                    path: path.clone(),
                    source,
                })?;
                keys.extend(parse_public_keys(&text).map_err(|source| LoadError::Key {
                    path: path.clone(),
                    source,
                })?);
                texts.push(text);
            }
            rules.push(Trusted {
                rule: rule.clone(),
                keys,
                fingerprint: fingerprint(&texts),
            });
        }
        Ok(Signatures {
            rules,
            in_flight: Arc::default(),
        })
    }

    /// Holds `digest`'s verification for the caller: one verification of a digest at a time
    /// (the next caller finds it remembered). The map forgets a digest once nobody holds it.
    pub(crate) async fn one_at_a_time(&self, digest: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut in_flight = crate::base::lock(&self.in_flight);
            in_flight.retain(|_, held| held.strong_count() > 0);
            match in_flight.get(digest).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    in_flight.insert(digest.to_owned(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }

    /// The rule covering `repository`, the first one listed.
    pub fn for_repository(&self, repository: &str) -> Option<&Trusted> {
        self.rules
            .iter()
            .find(|trusted| trusted.rule.covers(repository))
    }

    /// Each rule with its keys' fingerprint (what the runtime's guard checks by).
    pub fn fingerprints(&self) -> Vec<(crate::model::policy::SignatureRule, String)> {
        self.rules
            .iter()
            .map(|trusted| (trusted.rule.clone(), trusted.fingerprint.clone()))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// Why a digest is not verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unverified {
    /// No `sha256-<hex>.sig` manifest, or one without a signature layer.
    NoSignature,
    /// Signatures that none of the trusted keys verifies (another key, or a payload changed
    /// after signing).
    UntrustedKey,
    /// A signature that verifies but names another image: copied from it.
    OtherDigest(String),
    /// A payload that is not a cosign signature payload.
    BadPayload(String),
    /// The registry could not be asked (a network or registry failure: tried again later).
    Registry(String),
}

impl Unverified {
    /// The reason as a metric label and an event field.
    pub fn reason(&self) -> &'static str {
        match self {
            Unverified::NoSignature => "no_signature",
            Unverified::UntrustedKey => "untrusted_key",
            Unverified::OtherDigest(_) => "other_digest",
            Unverified::BadPayload(_) => "bad_payload",
            Unverified::Registry(_) => "registry",
        }
    }
}

impl fmt::Display for Unverified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unverified::NoSignature => f.write_str("no cosign signature is stored for this digest (no `sha256-<hex>.sig` manifest with a signature); sign it with `cosign sign --key …`"),
            Unverified::UntrustedKey => f.write_str("its signatures verify under none of the trusted keys (signed by another key, or the payload was changed)"),
            Unverified::OtherDigest(digest) => write!(f, "its signature names another image ({digest}): a signature copied from it"),
            Unverified::BadPayload(why) => write!(f, "its signature payload is not cosign's: {why}"),
            Unverified::Registry(why) => write!(f, "the registry could not be asked for its signature: {why}"),
        }
    }
}

/// Whether `payload`, signed by `signature_b64`, verifies `digest` under `keys`.
pub fn check(
    keys: &[PublicKey],
    digest: &str,
    payload: &[u8],
    signature_b64: &str,
) -> Result<(), Unverified> {
    let signature = base64::engine::general_purpose::STANDARD
        .decode(signature_b64.trim())
        .map_err(|_| Unverified::UntrustedKey)?;
    if !keys.iter().any(|key| key.verifies(payload, &signature)) {
        return Err(Unverified::UntrustedKey);
    }
    #[derive(serde::Deserialize)]
    struct Payload {
        critical: Critical,
    }
    #[derive(serde::Deserialize)]
    struct Critical {
        image: Image,
        #[serde(rename = "type")]
        kind: String,
    }
    #[derive(serde::Deserialize)]
    struct Image {
        #[serde(rename = "docker-manifest-digest")]
        digest: String,
    }
    let payload: Payload = serde_json::from_slice(payload)
        .map_err(|error| Unverified::BadPayload(error.to_string()))?;
    if payload.critical.kind != SIGNATURE_TYPE {
        return Err(Unverified::BadPayload(format!(
            "its type is {:?}",
            payload.critical.kind
        )));
    }
    if payload.critical.image.digest != digest {
        return Err(Unverified::OtherDigest(payload.critical.image.digest));
    }
    Ok(())
}

/// A fingerprint of `keys` (what a verification is remembered under): a change of keys
/// verifies every digest again.
pub fn fingerprint(pem_texts: &[String]) -> String {
    let mut hasher = sha2::Sha256::new();
    for text in pem_texts {
        hasher.update(text.trim().as_bytes());
        hasher.update(b"\n");
    }
    hasher.finalize()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Verifies `repository@digest` against `keys`: fetches its signature manifest and the
/// payloads, checks each until one verifies. `Err(Unverified::Registry)` is a registry that
/// could not be asked (tried again), every other error a refusal.
pub(crate) async fn verify(
    client: &Scanner,
    repository: &str,
    digest: &str,
    credentials: Option<&Credentials>,
    keys: &[PublicKey],
) -> Result<(), Unverified> {
    let registry_error = |error: registry::RegistryError| Unverified::Registry(error.to_string());
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return Err(Unverified::BadPayload(format!(
            "{digest} is not a sha256 digest"
        )));
    };
    let tag = format!("sha256-{hex}.sig");
    let Some(manifest) = registry::manifest(client, repository, &tag, credentials)
        .await
        .map_err(registry_error)?
    else {
        return Err(Unverified::NoSignature);
    };
    #[derive(serde::Deserialize)]
    struct SignatureManifest {
        #[serde(default)]
        layers: Vec<Layer>,
    }
    #[derive(serde::Deserialize)]
    struct Layer {
        #[serde(rename = "mediaType", default)]
        media_type: String,
        digest: String,
        #[serde(default)]
        annotations: std::collections::BTreeMap<String, String>,
    }
    let parsed: SignatureManifest = serde_json::from_slice(&manifest.bytes)
        .map_err(|error| Unverified::BadPayload(format!("its signature manifest: {error}")))?;
    let mut refusal = Unverified::NoSignature;
    for layer in parsed
        .layers
        .iter()
        .filter(|layer| layer.media_type == SIMPLE_SIGNING)
        .take(MAX_SIGNATURES)
    {
        let Some(signature) = layer.annotations.get(SIGNATURE_ANNOTATION) else {
            continue;
        };
        let Some(payload) = registry::blob(client, repository, &layer.digest, credentials)
            .await
            .map_err(registry_error)?
        else {
            continue;
        };
        match check(keys, digest, &payload, signature) {
            Ok(()) => return Ok(()),
            // The most telling refusal wins: a copied signature over a bad key.
            Err(error) => {
                if matches!(refusal, Unverified::NoSignature | Unverified::UntrustedKey) {
                    refusal = error;
                }
            }
        }
    }
    Err(refusal)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signature made by cosign itself: containers/image's test fixture (commit df7e80d2,
    /// `signature/fixtures/cosign.pub` and `dir-img-cosign-valid/signature-1`), an image
    /// signed with `cosign sign` and a P-256 key.
    const COSIGN_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEFNLqFhf4fiN6o/glAuYnq2jYUeL0
vRuLu/z39pmbVwS9ff5AYnlwaP9sxREajdLY9ynM6G1sy6AAmb7Z63TsLg==
-----END PUBLIC KEY-----
";
    const PAYLOAD: &str = r#"{"critical":{"identity":{"docker-reference":"192.168.64.2:5000/cosign-signed-single-sample"},"image":{"docker-manifest-digest":"sha256:634a8f35b5f16dcf4aaa0822adc0b1964bb786fca12f6831de8ddc45e5986a00"},"type":"cosign container image signature"},"optional":null}"#;
    const SIGNATURE: &str = "MEYCIQDmtamqYPjMg81nqeBhptrPls44aA/r7PwLmspINJY4MwIhANKRpqe2E9UCBtGFdPoz/8jAbaQm4uP4h+IpwKTE6ClR";
    const DIGEST: &str = "sha256:634a8f35b5f16dcf4aaa0822adc0b1964bb786fca12f6831de8ddc45e5986a00";

    #[tokio::test]
    async fn one_verification_of_a_digest_at_a_time() {
        let signatures = Signatures::default();
        let first = signatures.one_at_a_time("sha256:aa").await;
        // Another digest is not held up by it.
        let other = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            signatures.one_at_a_time("sha256:bb"),
        )
        .await;
        assert!(other.is_ok());
        // The same digest waits until the first lets go.
        let waiting = signatures.clone();
        let second = tokio::spawn(async move {
            let _held = waiting.one_at_a_time("sha256:aa").await;
        });
        tokio::task::yield_now().await;
        assert!(!second.is_finished());
        drop(first);
        assert!(second.await.is_ok());
        drop(other);
        // Nobody holds anything: the map forgets the digests at the next call.
        drop(signatures.one_at_a_time("sha256:cc").await);
        let held = signatures.in_flight.lock().map(|in_flight| {
            in_flight
                .values()
                .filter(|lock| lock.strong_count() > 0)
                .count()
        });
        assert_eq!(held.ok(), Some(0));
    }

    #[test]
    fn a_signature_made_by_cosign_verifies() -> Result<(), Box<dyn std::error::Error>> {
        let keys = parse_public_keys(COSIGN_PUB)?;
        assert_eq!(check(&keys, DIGEST, PAYLOAD.as_bytes(), SIGNATURE), Ok(()));
        Ok(())
    }

    #[test]
    fn a_changed_payload_another_digest_or_another_key_is_refused()
    -> Result<(), Box<dyn std::error::Error>> {
        let keys = parse_public_keys(COSIGN_PUB)?;
        // One character of the payload changed.
        let tampered = PAYLOAD.replace("5000", "5001");
        assert_eq!(
            check(&keys, DIGEST, tampered.as_bytes(), SIGNATURE),
            Err(Unverified::UntrustedKey)
        );
        // A good signature of another image, offered for this one.
        let other = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
        assert_eq!(
            check(&keys, other, PAYLOAD.as_bytes(), SIGNATURE),
            Err(Unverified::OtherDigest(DIGEST.to_owned()))
        );
        // Another P-256 key.
        let other =
            p256::ecdsa::SigningKey::from_slice(&[7; 32]).map_err(|error| error.to_string())?;
        let other_keys = [PublicKey::P256(*other.verifying_key())];
        assert_eq!(
            check(&other_keys, DIGEST, PAYLOAD.as_bytes(), SIGNATURE),
            Err(Unverified::UntrustedKey)
        );
        assert!(parse_public_keys("not a key").is_err());
        Ok(())
    }

    #[test]
    fn ed25519_signatures_pure_and_prehashed_verify() -> Result<(), Box<dyn std::error::Error>> {
        use ed25519_dalek::Signer as _;
        let signing = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
        let key = signing.verifying_key();
        let mut der = ED25519_SPKI.to_vec();
        der.extend_from_slice(key.as_bytes());
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(&der)
        );
        let keys = parse_public_keys(&pem)?;
        let payload = PAYLOAD.as_bytes();
        let pure = signing.sign(payload);
        let mut prehash = <ed25519_dalek::Sha512 as ed25519_dalek::Digest>::new();
        ed25519_dalek::Digest::update(&mut prehash, payload);
        let prehashed = signing
            .sign_prehashed(prehash, None)
            .map_err(|error| error.to_string())?;
        for signature in [pure, prehashed] {
            let encoded = base64::engine::general_purpose::STANDARD.encode(signature.to_bytes());
            assert_eq!(check(&keys, DIGEST, payload, &encoded), Ok(()));
        }
        Ok(())
    }
}
