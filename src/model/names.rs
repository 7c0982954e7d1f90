//! How long the names a manifest gives may be, and the names derived from them: a scope, a
//! resource name, an asset key or a volume claim becomes a file name under the data dir, a
//! container, volume or service name on the engine, or a DNS name, and each of those has a
//! limit the engine or the kernel enforces only when the agent uses it (a write failing every
//! second, a pod nobody can resolve). The manifest stage refuses a name whose derived names
//! would not fit, at the line that wrote it; the functions here build the derived names, so a
//! test can check the bounds against the very names the runtime uses.
//!
//! Invariant: every name derived from names within these bounds fits its own limit
//! (`NAME_MAX` for a file name or a local volume's directory, `DNS_LABEL_MAX` for a label).

use super::ResourceKey;

#[cfg(test)]
/// Longest file name (one path component) on Linux, in bytes.
pub(crate) const NAME_MAX: usize = 255;

/// Longest label of a DNS name, in bytes (RFC 1035); resolvers refuse longer ones.
pub(crate) const DNS_LABEL_MAX: usize = 63;

/// Longest scope or resource name: each is a directory under `<data-dir>/assets` and a DNS
/// label of the resource's aliases (`<name>.<scope>`).
pub(crate) const MAX_NAME: usize = DNS_LABEL_MAX;

/// Longest statefulset name: a pod's DNS alias `<name>-<ordinal>.<scope>` puts the name and
/// the ordinal (`-` and up to 3 digits, replicas being at most 1000) in one DNS label.
pub(crate) const MAX_STATEFULSET_NAME: usize = DNS_LABEL_MAX - 4;

/// Longest asset key: the key is the file name of `<data-dir>/assets/<scope>/<name>/<key>`,
/// and the file is first written as `.<key>.tmp-<pid>-<n>` beside it (37 more bytes at most);
/// both fit `NAME_MAX` with room to spare.
pub const MAX_ASSET_KEY: usize = 128;

/// Longest `volume_claim` name: part of the Docker volume `voodu-<scope>-<name>-<claim>-<n>`,
/// which the local driver keeps in a directory of that name (`NAME_MAX`).
pub(crate) const MAX_CLAIM: usize = DNS_LABEL_MAX;

/// voodu's Docker volume of claim `claim` of statefulset pod `ordinal` (spec §6.1).
pub(crate) fn claim_volume(key: &ResourceKey, claim: &str, ordinal: usize) -> String {
    format!("voodu-{}-{claim}-{ordinal}", key.app_id())
}

/// The problem with `text` as a name of at most `max` bytes, naming what it becomes.
pub(crate) fn too_long(text: &str, max: usize, becomes: &str) -> Option<String> {
    (text.len() > max).then(|| {
        format!(
            "is {} bytes long, above the limit of {max}: it becomes {becomes}; shorten it",
            text.len()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    #[test]
    fn the_longest_names_derive_names_that_fit() {
        let scope = "s".repeat(MAX_NAME);
        let name = "n".repeat(MAX_STATEFULSET_NAME);
        let claim = "c".repeat(MAX_CLAIM);
        let key = ResourceKey::new(Kind::Statefulset, scope.as_str(), name.as_str());
        let last_ordinal = 999; // replicas are at most 1000 (manifest::spec::bounds)
        let volume = claim_volume(&key, &claim, last_ordinal);
        assert!(volume.len() <= NAME_MAX, "{} bytes: {volume}", volume.len());
        let pod_label = format!("{name}-{last_ordinal}");
        assert!(pod_label.len() <= DNS_LABEL_MAX, "{pod_label}");
    }

    #[test]
    fn a_name_at_the_limit_passes_and_one_more_byte_does_not() {
        assert_eq!(
            too_long(&"k".repeat(MAX_ASSET_KEY), MAX_ASSET_KEY, "a file"),
            None
        );
        let refusal = too_long(&"k".repeat(MAX_ASSET_KEY + 1), MAX_ASSET_KEY, "a file");
        assert_eq!(
            refusal.as_deref(),
            Some("is 129 bytes long, above the limit of 128: it becomes a file; shorten it")
        );
    }
}
