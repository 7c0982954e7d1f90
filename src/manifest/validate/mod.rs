//! Checks across resources, once every file is decoded: duplicate identities, references
//! (`${asset.…}`, `depends_on.assets`, `${ref.…}`, `depends_on.resources` and its cycles:
//! `depends`), overlapping ingress routes; and the
//! stamping of asset digests into their consumers (`_asset_digests`, spec §5.3).
//!
//! A resource declared twice in one file is an error (as in voodu). Declared in two files, the
//! later file in path order wins, as `voodu apply` on a directory does, and a warning names
//! both places: voodu's own example folders hold such alternatives, and every one of them must
//! load. Two ingresses routing the same host and path is a warning too: the first by key wins,
//! deterministically, as voodu's own examples route one host from several ingresses.
//!
//! The agent reads a whole repo at a commit, so (unlike voodu, which also consults what an
//! earlier apply left on the server) a reference resolves only against this commit: an asset
//! that is not declared here would be pruned anyway.
//!
//! The rules for one key are in `rules`; `index` keeps every declaration by key between loads
//! and runs the rules again for the keys a commit touches alone (a commit that changes one
//! file of 1,000 re-checks that file's keys and the keys that read them).
//!
//! Invariant: a reference that does not resolve is an error at the line that wrote it.

mod depends;
mod index;
mod rules;

pub(crate) use index::{CheckIndex, Checked};

/// Names become parts of container names, DNS aliases and file paths: one charset for all.
pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("must not be empty");
    }
    if name.len() > crate::model::names::MAX_NAME {
        return Err("is longer than 63 characters (it becomes a DNS label and a directory name)");
    }
    if name.contains("..") || name.contains('/') || name.contains('\0') {
        return Err("must not contain `..`, `/` or NUL");
    }
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    {
        return Err(
            "must start with a letter or digit and use only letters, digits, `_`, `.` and `-`",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn names_are_confined() {
        assert!(check_name("web-1").is_ok());
        assert!(check_name("api_http").is_ok());
        for bad in ["", "a/b", "..", "a..b", "-x", "a b", "a\0"] {
            assert!(check_name(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
