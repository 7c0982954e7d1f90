//! Spec-hash helpers: voodu hashes `encoding/json.Marshal` of a fixed struct with SHA-256
//! (spec §5.1). serde_json with structs whose fields are declared in voodu's order gives the
//! same bytes once Go's extra HTML escapes are applied.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::model::SpecHash;

/// SHA-256 of the Go-JSON encoding of `value`, as lowercase hex.
pub(crate) fn go_json_sha256(value: &impl Serialize) -> SpecHash {
    let json = serde_json::to_string(value).expect("hash structs hold strings, numbers and maps");
    let json = if json.contains(ESCAPED) {
        go_json_escape(&json)
    } else {
        json
    };
    SpecHash::new(sha256_hex(json.as_bytes()))
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::model::text::hex(&Sha256::digest(bytes))
}

/// What Go's `encoding/json` escapes that serde_json does not.
const ESCAPED: [char; 5] = ['<', '>', '&', '\u{2028}', '\u{2029}'];

/// Go's `encoding/json` escapes `<`, `>`, `&`, U+2028 and U+2029 inside strings; serde_json
/// does not. Those characters can only occur inside JSON strings, so a plain replace is exact.
/// One pass (a spec hash per resource per plan).
pub(crate) fn go_json_escape(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
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

/// Named edits of a spec, for the hash tests: `(field, edit)`.
#[cfg(test)]
pub(crate) type Edits<'a, S> = &'a [(&'a str, fn(&mut S))];

/// Test support for each kind's hash tests: applies each of `edits` to a fresh `base()`; the
/// hash must change for every one of them when `hashed`, for none of them otherwise.
#[cfg(test)]
pub(crate) fn check_edits<S>(
    base: fn() -> S,
    hash: impl Fn(&S) -> SpecHash,
    edits: Edits<'_, S>,
    hashed: bool,
) {
    let before = hash(&base());
    for (field, edit) in edits {
        let mut spec = base();
        edit(&mut spec);
        if hashed {
            assert_ne!(hash(&spec), before, "{field} must be hashed");
        } else {
            assert_eq!(hash(&spec), before, "{field} must not be hashed");
        }
    }
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
        assert_eq!(go_json_escape("é\u{2028}x\u{2029}ü"), "é\\u2028x\\u2029ü");
    }

    #[test]
    fn sha256_of_empty_input_is_the_known_digest() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
