//! Image automation's view (issue 27): one entry per resource with `image_update` (its image,
//! policy, mode, the tag it runs and the newer tag its policy chose, its repository's last
//! scan, what of the registry's listing that scan left out, and what committing did). `voodu-agent images [--json]` prints it, `status` carries
//! it as `images`, and `/metrics` reads `update_available` from it.
//!
//! Invariants: built from store reads only, by `build` alone, so the command, the status
//! document and the metrics cannot disagree; a dedicated serialisable type.

use serde::Serialize;

use crate::model::split_image;
use crate::store::{ImageScan, Store};

/// One followed image.
#[derive(Debug, Clone, Serialize)]
pub struct ImageView {
    /// `kind/scope/name`.
    pub resource: String,
    pub(crate) kind: String,
    pub(crate) scope: String,
    pub(crate) name: String,
    /// The source that declares it (`--sources`); absent for the single `--repo` source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<String>,
    /// The image as desired state runs it (`127.0.0.1:5000/app:1.4.2`).
    pub image: String,
    /// The image without its tag.
    pub repository: String,
    /// `semver ~1.4`, `numerical /^main-([0-9]+)$/ → $1`, …
    pub policy: String,
    /// `commit` or `report`.
    pub mode: String,
    /// The tag it runs.
    pub current_tag: String,
    /// The newer tag the policy chose; `None` when the image is current (or never scanned).
    pub latest_tag: Option<String>,
    /// True when `latest_tag` is set: a newer tag is available.
    pub update_available: bool,
    /// Unix time of the decision.
    pub checked_at: i64,
    /// Unix time of the last scan of the repository (successful or not); `None`: never.
    pub scanned_at: Option<i64>,
    /// Unix time of the last successful scan.
    pub scan_succeeded_at: Option<i64>,
    /// The last scan's error (wrong credentials, an unreachable registry, …); `None` when ok.
    pub scan_error: Option<String>,
    /// What of the registry's listing the last successful scan left out (`registry listed
    /// more than 20000 tags; the first 20000 were considered`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scan_note: Option<String>,
    /// The registry asked not to be scanned before this (Retry-After).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_not_before: Option<i64>,
    /// The commit that wrote `latest_tag` (commit mode).
    pub commit: Option<String>,
    /// Why committing `latest_tag` failed (a conflict, a refused push, no credential).
    pub commit_error: Option<String>,
}

/// Every followed image, by resource.
pub fn build(store: &Store) -> crate::store::Result<Vec<ImageView>> {
    let scans = store.image_scans()?;
    let updates = store.image_updates()?;
    if updates.is_empty() {
        return Ok(Vec::new());
    }
    let sources = store.sources_of_desired()?;
    Ok(updates
        .into_iter()
        .map(|row| {
            let scan: Option<&ImageScan> =
                scans.iter().find(|scan| scan.repository == row.repository);
            let current_tag = split_image(&row.image)
                .map(|(_, tag)| tag.to_owned())
                .unwrap_or_default();
            let latest_tag = (!row.latest.is_empty()).then(|| row.latest.clone());
            ImageView {
                resource: row.key.to_string(),
                kind: row.key.kind.as_str().to_owned(),
                scope: row.key.scope.clone(),
                name: row.key.name.clone(),
                source: sources
                    .get(&row.key)
                    .filter(|source| !source.is_empty())
                    .cloned(),
                update_available: latest_tag.is_some(),
                latest_tag,
                current_tag,
                image: row.image,
                repository: row.repository,
                policy: row.policy,
                mode: row.mode,
                checked_at: row.checked_at,
                scanned_at: scan.map(|scan| scan.scanned_at),
                scan_succeeded_at: scan.and_then(|scan| scan.tags_at),
                scan_error: scan
                    .map(|scan| scan.error.clone())
                    .filter(|error| !error.is_empty()),
                scan_note: scan
                    .map(|scan| scan.note.clone())
                    .filter(|note| !note.is_empty()),
                retry_not_before: scan
                    .map(|scan| scan.not_before)
                    .filter(|not_before| scan.is_some_and(|scan| *not_before > scan.scanned_at)),
                commit: (!row.commit_sha.is_empty()).then_some(row.commit_sha),
                commit_error: (!row.commit_error.is_empty()).then_some(row.commit_error),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Kind, ResourceKey};
    use crate::store::ImageUpdateRow;

    #[test]
    fn a_newer_tag_and_a_failed_scan_are_shown() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(&dir.path().join("state.db"))?;
        let listed = "registry listed more than 20000 tags; the first 20000 were considered";
        store.record_image_scan(
            "reg/app",
            Ok((&["1.4.2".to_owned(), "1.4.3".to_owned()], listed)),
            0,
            100,
        )?;
        store.record_image_scan("reg/app", Err("401 Unauthorized"), 0, 160)?;
        let row = |name: &str, latest: &str| ImageUpdateRow {
            key: ResourceKey::new(Kind::Deployment, "shop", name),
            image: "reg/app:1.4.2".into(),
            repository: "reg/app".into(),
            policy: "semver ~1.4".into(),
            mode: "report".into(),
            latest: latest.into(),
            checked_at: 160,
            commit_sha: String::new(),
            commit_error: String::new(),
        };
        store.record_image_updates(&[row("web", "1.4.3"), row("api", "")])?;
        let views = build(&store)?;
        let web = views
            .iter()
            .find(|view| view.name == "web")
            .ok_or("no web")?;
        assert_eq!(
            (
                web.current_tag.as_str(),
                web.latest_tag.as_deref(),
                web.update_available
            ),
            ("1.4.2", Some("1.4.3"), true)
        );
        assert_eq!(
            (
                web.scanned_at,
                web.scan_succeeded_at,
                web.scan_error.as_deref(),
                web.scan_note.as_deref()
            ),
            (Some(160), Some(100), Some("401 Unauthorized"), Some(listed))
        );
        let api = views
            .iter()
            .find(|view| view.name == "api")
            .ok_or("no api")?;
        assert!(!api.update_available && api.latest_tag.is_none());
        Ok(())
    }
}
