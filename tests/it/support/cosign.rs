//! Signing images for the signature tests as `cosign sign --key` stores them (Debian's skopeo
//! cannot write sigstore signatures: its package disables them), following cosign's
//! specification (`specs/SIGNATURE_SPEC.md`): the simple-signing payload naming the digest,
//! an ECDSA P-256 (SHA-256, ASN.1 DER) signature of its bytes in the layer annotation
//! `dev.cosignproject.cosign/signature`, one layer per signature of an OCI manifest tagged
//! `sha256-<hex>.sig` in the image's repository, pushed through the registry API.
//! `benches/scale.rs` includes this file too.

use base64::Engine as _;
use p256::ecdsa::signature::Signer as _;

use super::TestResult;

/// A cosign key pair (deterministic from `seed`, so tests can tell keys apart).
pub struct Signer {
    key: p256::ecdsa::SigningKey,
}

/// The DER prefix of a P-256 SubjectPublicKeyInfo, before the uncompressed point.
const P256_SPKI: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

impl Signer {
    pub fn new(seed: u8) -> TestResult<Signer> {
        let mut secret = [seed; 32];
        secret[0] = 1;
        Ok(Signer {
            key: p256::ecdsa::SigningKey::from_slice(&secret)?,
        })
    }

    /// The public key as `cosign.pub` holds it (SPKI PEM).
    pub fn public_pem(&self) -> String {
        let point = self.key.verifying_key().to_encoded_point(false);
        let mut der = P256_SPKI.to_vec();
        der.extend_from_slice(point.as_bytes());
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|chunk| std::str::from_utf8(chunk).unwrap_or_default())
            .collect();
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            lines.join("\n")
        )
    }

    /// The base64 signature of `payload`.
    pub fn sign(&self, payload: &[u8]) -> String {
        let signature: p256::ecdsa::Signature = self.key.sign(payload);
        base64::engine::general_purpose::STANDARD.encode(signature.to_der().as_bytes())
    }
}

/// cosign's simple-signing payload for `repository@digest`.
pub fn payload(repository: &str, digest: &str) -> Vec<u8> {
    format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"{repository}"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
    )
    .into_bytes()
}

/// A registry to push signatures to: `host` with basic credentials.
pub struct Registry<'a> {
    pub host: &'a str,
    pub username: &'a str,
    pub password: &'a str,
}

impl Registry<'_> {
    fn client(&self) -> TestResult<reqwest::blocking::Client> {
        // reqwest without a crypto provider of its own (the agent installs ring's at start).
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(reqwest::blocking::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()?)
    }

    /// Uploads `bytes` as a blob of `name` (monolithic upload); its digest.
    fn put_blob(&self, name: &str, bytes: &[u8]) -> TestResult<String> {
        let client = self.client()?;
        let digest = format!("sha256:{}", voodu_agent::manifest::spec::sha256_hex(bytes));
        let started = client
            .post(format!("http://{}/v2/{name}/blobs/uploads/", self.host))
            .basic_auth(self.username, Some(self.password))
            .send()?;
        if started.status().as_u16() != 202 {
            return Err(format!("starting an upload: HTTP {}", started.status()).into());
        }
        let location = started
            .headers()
            .get("location")
            .and_then(|value| value.to_str().ok())
            .ok_or("no upload location")?
            .to_owned();
        let url = if location.starts_with("http") {
            location
        } else {
            format!("http://{}{location}", self.host)
        };
        let separator = if url.contains('?') { '&' } else { '?' };
        let done = client
            .put(format!("{url}{separator}digest={digest}"))
            .basic_auth(self.username, Some(self.password))
            .header("content-type", "application/octet-stream")
            .body(bytes.to_vec())
            .send()?;
        if !done.status().is_success() {
            return Err(format!("uploading a blob: HTTP {}", done.status()).into());
        }
        Ok(digest)
    }

    /// Pushes the signature manifest of `name@digest` (tag `sha256-<hex>.sig`) with one
    /// layer per `(payload, signature)`.
    pub fn push_signatures(
        &self,
        name: &str,
        digest: &str,
        signatures: &[(Vec<u8>, String)],
    ) -> TestResult {
        let config =
            br#"{"architecture":"","os":"","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#;
        let config_digest = self.put_blob(name, config)?;
        let mut layers = Vec::new();
        for (payload, signature) in signatures {
            let layer_digest = self.put_blob(name, payload)?;
            layers.push(serde_json::json!({
                "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                "size": payload.len(),
                "digest": layer_digest,
                "annotations": { "dev.cosignproject.cosign/signature": signature }
            }));
        }
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "size": config.len(),
                "digest": config_digest
            },
            "layers": layers
        });
        let tag = format!(
            "sha256-{}.sig",
            digest
                .strip_prefix("sha256:")
                .ok_or("not a sha256 digest")?
        );
        let pushed = self
            .client()?
            .put(format!("http://{}/v2/{name}/manifests/{tag}", self.host))
            .basic_auth(self.username, Some(self.password))
            .header("content-type", "application/vnd.oci.image.manifest.v1+json")
            .body(serde_json::to_vec(&manifest)?)
            .send()?;
        if !pushed.status().is_success() {
            return Err(format!(
                "pushing the signature manifest: HTTP {}: {}",
                pushed.status(),
                pushed.text().unwrap_or_default()
            )
            .into());
        }
        Ok(())
    }
}
