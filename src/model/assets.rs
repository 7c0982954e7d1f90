//! Where asset files live on the host, and how `${asset.…}` references become those paths.
//!
//! Invariant: scoped assets live under `<root>/<scope>/<name>`, unscoped ones under
//! `<root>/_unscoped/<name>`; no scope can be named `_unscoped`, so the two never collide.

/// The directory under `<data-dir>/assets` holding unscoped assets. A scope cannot be named
/// this (scopes start with a letter or digit), so the two layouts never collide.
pub(crate) const UNSCOPED_ASSETS: &str = "_unscoped";

/// Where asset `scope`/`name` keeps its files: `<assets_root>/<scope>/<name>`, or
/// `<assets_root>/_unscoped/<name>` for an unscoped asset.
pub(crate) fn asset_dir(
    assets_root: &std::path::Path,
    scope: &str,
    name: &str,
) -> std::path::PathBuf {
    let scope = if scope.is_empty() {
        UNSCOPED_ASSETS
    } else {
        scope
    };
    assets_root.join(scope).join(name)
}

/// Whether `segment` is one part of a dotted reference (`${asset.<scope>.<name>.<key>}`,
/// `${ref.…}`): a letter or digit, then letters, digits, `_` or `-` (voodu's grammar).
pub(crate) fn is_ref_segment(segment: &str) -> bool {
    let mut chars = segment.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Replaces every `${asset.<scope>.<name>.<key>}` / `${asset.<name>.<key>}` in `text` by the
/// host path of that file under `assets_root`; anything else is left as it is.
pub(crate) fn resolve_asset_refs(text: &str, assets_root: &std::path::Path) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${asset.") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "${asset.".len()..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let segments: Vec<&str> = after[..end].split('.').collect();
        // Only voodu's reference grammar resolves: a segment that is a path (`/etc/x`, `..`)
        // or empty leaves the text as it is, so no reference reaches outside its asset.
        let path = match segments.as_slice() {
            segments if !segments.iter().all(|segment| is_ref_segment(segment)) => None,
            [scope, name, key] => Some(asset_dir(assets_root, scope, name).join(key)),
            [name, key] => Some(asset_dir(assets_root, "", name).join(key)),
            _ => None,
        };
        match path {
            Some(path) => out.push_str(&path.to_string_lossy()),
            None => out.push_str(&rest[start..start + "${asset.".len() + end + 1]),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asset_refs_resolve_to_host_paths() {
        let root = std::path::Path::new("/data/assets");
        assert_eq!(
            resolve_asset_refs("${asset.data.pg-config.conf}:/etc/pg.conf:ro", root),
            "/data/assets/data/pg-config/conf:/etc/pg.conf:ro"
        );
        assert_eq!(
            resolve_asset_refs("x ${asset.ca.pem} ${VAR} ${asset.a}", root),
            "x /data/assets/_unscoped/ca/pem ${VAR} ${asset.a}"
        );
    }
}
