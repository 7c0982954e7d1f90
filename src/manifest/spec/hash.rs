//! Spec-hash helpers: voodu hashes `encoding/json.Marshal` of a fixed struct with SHA-256
//! (spec §5.1). serde_json with structs whose fields are declared in voodu's order gives the
//! same bytes once Go's extra HTML escapes are applied.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::model::SpecHash;

/// SHA-256 of the Go-JSON encoding of `value`, as lowercase hex.
pub(crate) fn go_json_sha256(value: &impl Serialize) -> SpecHash {
    let json = serde_json::to_string(value).expect("hash structs hold strings, numbers and maps");
    SpecHash::new(sha256_hex(go_json_escape(&json).as_bytes()))
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::model::text::hex(&Sha256::digest(bytes))
}

/// Go's `encoding/json` escapes `<`, `>`, `&`, U+2028 and U+2029 inside strings; serde_json
/// does not. Those characters can only occur inside JSON strings, so a plain replace is exact.
pub(crate) fn go_json_escape(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// `None` for an empty list (Go's nil slice marshals as `null`, or is omitted).
pub(crate) fn non_empty<T: Clone>(items: &[T]) -> Option<Vec<T>> {
    (!items.is_empty()).then(|| items.to_vec())
}

/// A sorted copy, `None` when empty.
pub(crate) fn sorted(items: &[String]) -> Option<Vec<String>> {
    let mut items = non_empty(items)?;
    items.sort();
    Some(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_escaping_matches_encoding_json() {
        assert_eq!(
            go_json_escape(r#"{"a":"<&>"}"#),
            r#"{"a":"\u003c\u0026\u003e"}"#
        );
    }

    #[test]
    fn sha256_of_empty_input_is_the_known_digest() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
