//! age v1 decryption for X25519 identities (c2sp.org/age): what SOPS's age stanzas need and
//! no more. An identity is read from its `AGE-SECRET-KEY-1…` Bech32 text; an age file (ASCII
//! armored as SOPS stores it, or binary) is opened by unwrapping its file key from an
//! `X25519` stanza, checking the header MAC, then decrypting the STREAM payload chunk by chunk.
//! The primitives are RustCrypto's (X25519, ChaCha20-Poly1305, HMAC-SHA-256); this module is
//! the format only.
//!
//! Invariants: nothing is returned unless the header MAC and every payload chunk verify; an
//! error never carries key material or plaintext; a stanza of another type (scrypt, plugins,
//! post-quantum) is skipped, as the format asks of an identity that does not implement it.

use base64::Engine as _;
use chacha20poly1305::ChaCha20Poly1305;
use chacha20poly1305::aead::{Aead as _, KeyInit as _};
use hmac::Mac as _;

use crate::base::hmac_sha256;

const SECRET_HRP: &str = "age-secret-key-";
const RECIPIENT_HRP: &str = "age";
const VERSION_LINE: &[u8] = b"age-encryption.org/v1\n";
const X25519_INFO: &[u8] = b"age-encryption.org/v1/X25519";
const ARMOR_BEGIN: &str = "-----BEGIN AGE ENCRYPTED FILE-----";
const ARMOR_END: &str = "-----END AGE ENCRYPTED FILE-----";
/// Plaintext bytes per payload chunk; each chunk carries a 16-byte tag more.
const CHUNK: usize = 64 * 1024;
const TAG: usize = 16;
/// Stanzas read from one header at most (a file is encrypted for a handful of recipients).
const MAX_STANZAS: usize = 256;

/// Why an age file cannot be opened. Never carries a key or plaintext.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgeError {
    #[error("not an age identity: {0}")]
    Identity(&'static str),
    #[error("malformed ASCII armor: {0}")]
    Armor(&'static str),
    #[error("malformed age header: {0}")]
    Header(&'static str),
    #[error("no identity matches any of the file's X25519 recipients")]
    NoMatch,
    #[error("the header's MAC does not match: the file was changed or damaged")]
    HeaderMac,
    #[error("the payload does not decrypt: {0}")]
    Payload(&'static str),
}

/// An X25519 identity. `Debug` shows its recipient only.
pub struct Identity {
    secret: x25519_dalek::StaticSecret,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("recipient", &self.recipient())
            .finish()
    }
}

impl std::str::FromStr for Identity {
    type Err = AgeError;

    /// `AGE-SECRET-KEY-1…` as `age-keygen` writes it (Bech32, one case throughout).
    fn from_str(text: &str) -> Result<Identity, AgeError> {
        let (hrp, data) = bech32::decode(text).ok_or(AgeError::Identity("not Bech32"))?;
        if hrp != SECRET_HRP {
            return Err(AgeError::Identity("not an AGE-SECRET-KEY-1… key"));
        }
        let bytes: [u8; 32] = data
            .try_into()
            .map_err(|_| AgeError::Identity("the key is not 32 bytes"))?;
        Ok(Identity {
            secret: x25519_dalek::StaticSecret::from(bytes),
        })
    }
}

impl Identity {
    /// The public recipient, `age1…`.
    pub fn recipient(&self) -> String {
        bech32::encode(
            RECIPIENT_HRP,
            x25519_dalek::PublicKey::from(&self.secret).as_bytes(),
        )
    }

    /// The file key of an `X25519` stanza addressed to this identity: `None` when the stanza's
    /// body does not open with it (another recipient's).
    fn unwrap(&self, share: &[u8; 32], body: &[u8; 32]) -> Result<Option<[u8; 16]>, AgeError> {
        let share_point = x25519_dalek::PublicKey::from(*share);
        let shared = self.secret.diffie_hellman(&share_point);
        if !shared.was_contributory() {
            return Err(AgeError::Header("an X25519 share of low order"));
        }
        let recipient = x25519_dalek::PublicKey::from(&self.secret);
        let mut salt = [0u8; 64];
        salt[..32].copy_from_slice(share);
        salt[32..].copy_from_slice(recipient.as_bytes());
        let wrap_key = hkdf_sha256(shared.as_bytes(), &salt, X25519_INFO);
        let cipher = ChaCha20Poly1305::new(&wrap_key.into());
        match cipher.decrypt(&[0u8; 12].into(), body.as_slice()) {
            Ok(key) => key
                .try_into()
                .map(Some)
                .map_err(|_| AgeError::Header("a file key that is not 16 bytes")),
            Err(_) => Ok(None),
        }
    }
}

/// Decrypts an age file (armored or binary) with the first identity that opens one of its
/// `X25519` stanzas.
pub fn decrypt(identities: &[Identity], file: &[u8]) -> Result<Vec<u8>, AgeError> {
    let binary;
    let file = match std::str::from_utf8(file) {
        Ok(text) if text.trim_start().starts_with(ARMOR_BEGIN) => {
            binary = dearmor(text)?;
            binary.as_slice()
        }
        _ => file,
    };
    let header = Header::parse(file)?;
    let mut file_key = None;
    'stanzas: for stanza in &header.stanzas {
        let [kind, share] = stanza.args.as_slice() else {
            if stanza.args.first().map(String::as_str) == Some("X25519") {
                return Err(AgeError::Header(
                    "an X25519 stanza without exactly one share",
                ));
            }
            continue;
        };
        if kind != "X25519" {
            continue;
        }
        let share: [u8; 32] = raw_base64(share)
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or(AgeError::Header("an X25519 share that is not 32 bytes"))?;
        let body: [u8; 32] = stanza
            .body
            .as_slice()
            .try_into()
            .map_err(|_| AgeError::Header("an X25519 stanza body that is not 32 bytes"))?;
        for identity in identities {
            if let Some(key) = identity.unwrap(&share, &body)? {
                file_key = Some(key);
                break 'stanzas;
            }
        }
    }
    let file_key = file_key.ok_or(AgeError::NoMatch)?;
    let mac_key = hkdf_sha256(&file_key, &[], b"header");
    let mut mac = hmac_sha256(&mac_key);
    mac.update(header.authenticated);
    mac.verify_slice(&header.mac)
        .map_err(|_| AgeError::HeaderMac)?;
    payload(&file_key, header.payload)
}

/// The STREAM payload: a 16-byte nonce, then 64 KiB chunks, the last one flagged.
fn payload(file_key: &[u8; 16], payload: &[u8]) -> Result<Vec<u8>, AgeError> {
    let (nonce, mut rest) = payload
        .split_at_checked(16)
        .ok_or(AgeError::Payload("no nonce"))?;
    let cipher = ChaCha20Poly1305::new(&hkdf_sha256(file_key, nonce, b"payload").into());
    let mut plain = Vec::with_capacity(rest.len());
    let mut counter: u128 = 0;
    loop {
        let (chunk, after) = rest.split_at(rest.len().min(CHUNK + TAG));
        let last = after.is_empty();
        let mut chunk_nonce = [0u8; 12];
        chunk_nonce[..11].copy_from_slice(&counter.to_be_bytes()[5..]);
        chunk_nonce[11] = u8::from(last);
        let opened = cipher.decrypt(&chunk_nonce.into(), chunk).map_err(|_| {
            AgeError::Payload("a chunk fails its authentication (changed or cut short)")
        })?;
        if opened.is_empty() && counter > 0 {
            return Err(AgeError::Payload("an empty final chunk"));
        }
        plain.extend_from_slice(&opened);
        if last {
            return Ok(plain);
        }
        rest = after;
        counter += 1;
    }
}

/// A parsed header: its stanzas, the bytes its MAC covers (up to and including `---`), the
/// MAC, and the payload after it.
struct Header<'a> {
    stanzas: Vec<Stanza>,
    authenticated: &'a [u8],
    mac: Vec<u8>,
    payload: &'a [u8],
}

struct Stanza {
    args: Vec<String>,
    body: Vec<u8>,
}

impl<'a> Header<'a> {
    fn parse(file: &'a [u8]) -> Result<Header<'a>, AgeError> {
        let mut rest = file
            .strip_prefix(VERSION_LINE)
            .ok_or(AgeError::Header("not an age-encryption.org/v1 file"))?;
        let mut stanzas = Vec::new();
        loop {
            let offset = file.len() - rest.len();
            let (line, after) = split_line(rest)?;
            if line.starts_with(b"---") {
                let mac = line
                    .strip_prefix(b"--- ")
                    .filter(|mac| mac.len() == 43)
                    .and_then(|mac| std::str::from_utf8(mac).ok())
                    .and_then(raw_base64)
                    .ok_or(AgeError::Header(
                        "a MAC line that is not `--- ` and 32 bytes of base64",
                    ))?;
                if stanzas.is_empty() {
                    return Err(AgeError::Header("no recipient stanza"));
                }
                return Ok(Header {
                    stanzas,
                    authenticated: &file[..offset + 3],
                    mac,
                    payload: after,
                });
            }
            let args = line
                .strip_prefix(b"-> ")
                .and_then(|args| std::str::from_utf8(args).ok())
                .ok_or(AgeError::Header(
                    "a line that starts neither a stanza nor the MAC",
                ))?;
            let args: Vec<String> = args.split(' ').map(str::to_owned).collect();
            if args
                .iter()
                .any(|arg| arg.is_empty() || !arg.bytes().all(|byte| byte.is_ascii_graphic()))
            {
                return Err(AgeError::Header(
                    "an empty or non-printable stanza argument",
                ));
            }
            if stanzas.len() == MAX_STANZAS {
                return Err(AgeError::Header("more than 256 recipient stanzas"));
            }
            rest = after;
            let mut body = Vec::new();
            loop {
                let (line, after) = split_line(rest)?;
                rest = after;
                let text = std::str::from_utf8(line)
                    .ok()
                    .filter(|text| text.len() <= 64)
                    .ok_or(AgeError::Header("a stanza body line over 64 columns"))?;
                body.extend(raw_base64(text).ok_or(AgeError::Header(
                    "a stanza body that is not canonical base64",
                ))?);
                if text.len() < 64 {
                    break;
                }
            }
            stanzas.push(Stanza { args, body });
        }
    }
}

/// One `\n`-terminated line and what follows it.
fn split_line(text: &[u8]) -> Result<(&[u8], &[u8]), AgeError> {
    let end = text
        .iter()
        .position(|&byte| byte == b'\n')
        .ok_or(AgeError::Header("the header ends before its MAC line"))?;
    Ok((&text[..end], &text[end + 1..]))
}

/// The strict PEM of the format's ASCII armor: the label lines, then padded base64 in lines of
/// 64 columns, the last one shorter or equal; whitespace only around the block, LF or CRLF.
fn dearmor(text: &str) -> Result<Vec<u8>, AgeError> {
    let mut lines = text
        .trim()
        .lines()
        .map(|line| line.strip_suffix('\r').unwrap_or(line));
    if lines.next() != Some(ARMOR_BEGIN) {
        return Err(AgeError::Armor(
            "the first line is not -----BEGIN AGE ENCRYPTED FILE-----",
        ));
    }
    let lines: Vec<&str> = lines.collect();
    let Some((&end, body)) = lines.split_last() else {
        return Err(AgeError::Armor("no -----END AGE ENCRYPTED FILE----- line"));
    };
    if end != ARMOR_END {
        return Err(AgeError::Armor(
            "the last line is not -----END AGE ENCRYPTED FILE-----",
        ));
    }
    let Some((last, full)) = body.split_last() else {
        return Err(AgeError::Armor("no data between the label lines"));
    };
    if full.iter().any(|line| line.len() != 64) || last.is_empty() || last.len() > 64 {
        return Err(AgeError::Armor(
            "lines of base64 must be 64 columns, the last one at most",
        ));
    }
    base64::engine::general_purpose::STANDARD
        .decode(body.concat())
        .map_err(|_| AgeError::Armor("the data is not canonical base64"))
}

/// Unpadded, canonical base64 (a trailing `=` or stray low bits are refused).
fn raw_base64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(text)
        .ok()
}

/// HKDF-SHA-256 (RFC 5869) with 32 bytes of output: one HMAC to extract, one to expand.
fn hkdf_sha256(ikm: &[u8], salt: &[u8], info: &[u8]) -> [u8; 32] {
    let mut extract = hmac_sha256(salt);
    extract.update(ikm);
    let prk: [u8; 32] = extract.finalize().into_bytes().into();
    let mut expand = hmac_sha256(&prk);
    expand.update(info);
    expand.update(&[1]);
    expand.finalize().into_bytes().into()
}

/// Bech32 (BIP 173) as age uses it: one case throughout, checksum constant 1, no length cap
/// beyond what a key needs.
mod bech32 {
    const CHARSET: &[u8; 32] = b"qpzry9x8gf2tvdw0s3jn54khce6mua7l";

    fn polymod(values: impl Iterator<Item = u8>) -> u32 {
        const GENERATOR: [u32; 5] = [0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3];
        let mut check: u32 = 1;
        for value in values {
            let top = check >> 25;
            check = ((check & 0x01ff_ffff) << 5) ^ u32::from(value);
            for (bit, generator) in GENERATOR.iter().enumerate() {
                if (top >> bit) & 1 == 1 {
                    check ^= generator;
                }
            }
        }
        check
    }

    fn expand(hrp: &str) -> impl Iterator<Item = u8> + '_ {
        hrp.bytes()
            .map(|byte| byte >> 5)
            .chain(std::iter::once(0))
            .chain(hrp.bytes().map(|byte| byte & 31))
    }

    /// The human-readable part (lower case) and the bytes, if `text` is valid Bech32.
    pub(super) fn decode(text: &str) -> Option<(String, Vec<u8>)> {
        if text.len() > 200 || !text.is_ascii() {
            return None;
        }
        let lower = text.to_ascii_lowercase();
        if lower != text && text.to_ascii_uppercase() != text {
            return None;
        }
        let (hrp, data) = lower.rsplit_once('1')?;
        if hrp.is_empty() || data.len() < 6 || !hrp.bytes().all(|byte| (33..=126).contains(&byte)) {
            return None;
        }
        let values: Vec<u8> = data
            .bytes()
            .map(|byte| CHARSET.iter().position(|&c| c == byte).map(|at| at as u8))
            .collect::<Option<_>>()?;
        if polymod(expand(hrp).chain(values.iter().copied())) != 1 {
            return None;
        }
        let mut bytes = Vec::with_capacity(values.len() * 5 / 8);
        let (mut acc, mut bits) = (0u32, 0u32);
        for value in &values[..values.len() - 6] {
            acc = (acc << 5) | u32::from(*value);
            bits += 5;
            if bits >= 8 {
                bits -= 8;
                bytes.push((acc >> bits) as u8);
            }
            acc &= (1 << bits) - 1;
        }
        // Leftover bits are padding: fewer than five, all zero.
        (bits < 5 && acc == 0).then(|| (hrp.to_owned(), bytes))
    }

    /// `bytes` under `hrp` (lower case).
    pub(super) fn encode(hrp: &str, bytes: &[u8]) -> String {
        let mut values = Vec::with_capacity(bytes.len() * 8 / 5 + 7);
        let (mut acc, mut bits) = (0u32, 0u32);
        for byte in bytes {
            acc = (acc << 8) | u32::from(*byte);
            bits += 8;
            while bits >= 5 {
                bits -= 5;
                values.push(((acc >> bits) & 31) as u8);
            }
            acc &= (1 << bits) - 1;
        }
        if bits > 0 {
            values.push(((acc << (5 - bits)) & 31) as u8);
        }
        let check = polymod(
            expand(hrp)
                .chain(values.iter().copied())
                .chain(std::iter::repeat_n(0, 6)),
        ) ^ 1;
        values.extend((0..6).map(|index| ((check >> (5 * (5 - index))) & 31) as u8));
        let mut text = String::with_capacity(hrp.len() + 1 + values.len());
        text.push_str(hrp);
        text.push('1');
        text.extend(
            values
                .iter()
                .map(|&value| char::from(CHARSET[usize::from(value)])),
        );
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // c2sp.org/age's own example identity and its recipient.
    const SPEC_IDENTITY: &str =
        "AGE-SECRET-KEY-1GFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPQ4EGAEX";
    const SPEC_RECIPIENT: &str = "age1zvkyg2lqzraa2lnjvqej32nkuu0ues2s82hzrye869xeexvn73equnujwj";

    #[test]
    fn the_specs_identity_has_the_specs_recipient() {
        let identity: Identity = SPEC_IDENTITY.parse().expect("parses");
        assert_eq!(identity.recipient(), SPEC_RECIPIENT);
        assert_eq!(
            format!("{identity:?}"),
            format!("Identity {{ recipient: {SPEC_RECIPIENT:?} }}")
        );
        let lower: Identity = SPEC_IDENTITY
            .to_ascii_lowercase()
            .parse()
            .expect("one case");
        assert_eq!(lower.recipient(), SPEC_RECIPIENT);
    }

    #[test]
    fn a_damaged_or_foreign_key_is_not_an_identity() {
        let mut flipped = SPEC_IDENTITY.to_owned();
        flipped.replace_range(20..21, "Q");
        assert_ne!(&flipped, SPEC_IDENTITY);
        for text in [
            flipped.as_str(),
            SPEC_RECIPIENT,
            "AGE-SECRET-KEY-1gfpyysjzgfpyysjzgfpyysjzgfpyysjzgfpyysjzgfpyysjzgfpq4egaex",
            "AGE-PLUGIN-YUBIKEY-1QQQQQQ",
            "",
        ] {
            assert!(text.parse::<Identity>().is_err(), "{text}");
        }
    }

    #[test]
    fn hkdf_matches_rfc_5869_test_case_1() {
        let okm = hkdf_sha256(
            &[0x0b; 22],
            &(0u8..=0x0c).collect::<Vec<_>>(),
            &(0xf0u8..=0xf9).collect::<Vec<_>>(),
        );
        let hex: String = okm.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(
            hex,
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
        );
    }

    // `printf 'hello, voodu' | age -a -r <SPEC_RECIPIENT>` (age 1.1.1).
    const HELLO: &str = "-----BEGIN AGE ENCRYPTED FILE-----\nYWdlLWVuY3J5cHRpb24ub3JnL3YxCi0+IFgyNTUxOSBybWhhcnNOTC9Lb25RTml4\nTnpBMStRRm0zL25ySWUwTm9iTTEwRnNSZ3pzCjdPZmVwcm52Y1lXMmF3aVVRS2J2\nWEtsanZ2OWNnYjBoNWdkM1JIWnlvaXcKLS0tIGsvbUk3blVHbmdhK2tGZ29QVkVp\nOFN1Q240Rmw4S1pMK1ViRXV5NE5EeFkK1Tu+LVw4PEfIPugouG0tPfIYUva0b0tW\nIzqdZAIiLj2PkAeX/ZZi1Zn6Hoo=\n-----END AGE ENCRYPTED FILE-----\n";

    fn spec_identity() -> Identity {
        SPEC_IDENTITY.parse().expect("parses")
    }

    #[test]
    fn a_file_the_age_tool_encrypted_opens() {
        assert_eq!(
            decrypt(&[spec_identity()], HELLO.as_bytes()),
            Ok(b"hello, voodu".to_vec())
        );
        let binary = dearmor(HELLO).expect("armor");
        assert_eq!(
            decrypt(&[spec_identity()], &binary),
            Ok(b"hello, voodu".to_vec())
        );
        let crlf = HELLO.replace('\n', "\r\n");
        assert_eq!(
            decrypt(&[spec_identity()], crlf.as_bytes()),
            Ok(b"hello, voodu".to_vec())
        );
    }

    #[test]
    fn a_changed_byte_anywhere_is_refused_and_another_key_matches_nothing() {
        let binary = dearmor(HELLO).expect("armor");
        let mac_line = binary
            .windows(4)
            .position(|w| w == b"--- ")
            .expect("mac line");
        let payload = binary[mac_line..]
            .iter()
            .position(|&b| b == b'\n')
            .expect("end")
            + mac_line
            + 1;
        // The share, the stanza body, the MAC, the nonce, the chunk.
        for at in [40, 80, mac_line + 10, payload + 3, binary.len() - 1] {
            let mut changed = binary.clone();
            changed[at] ^= 0x01;
            let result = decrypt(&[spec_identity()], &changed);
            assert!(result.is_err(), "byte {at}: {result:?}");
        }
        let mut mac_changed = binary.clone();
        mac_changed[mac_line + 10] ^= 0x01;
        assert_eq!(
            decrypt(&[spec_identity()], &mac_changed),
            Err(AgeError::HeaderMac)
        );
        assert!(matches!(
            decrypt(&[spec_identity()], &binary[..binary.len() - 1]),
            Err(AgeError::Payload(_))
        ));
        let other = Identity {
            secret: x25519_dalek::StaticSecret::from([7u8; 32]),
        };
        assert_eq!(decrypt(&[other], HELLO.as_bytes()), Err(AgeError::NoMatch));
        assert_eq!(decrypt(&[], HELLO.as_bytes()), Err(AgeError::NoMatch));
    }

    #[test]
    fn armor_outside_the_strict_form_is_refused() {
        let trailing = format!("{HELLO}junk\n");
        let short_line = HELLO.replacen("Tml4\n", "Tml4\n\n", 1);
        assert_ne!(short_line, HELLO);
        let no_end = HELLO.replace("-----END AGE ENCRYPTED FILE-----", "");
        for text in [trailing, short_line, no_end] {
            assert!(
                matches!(
                    decrypt(&[spec_identity()], text.as_bytes()),
                    Err(AgeError::Armor(_))
                ),
                "{text}"
            );
        }
    }
}
