//! `image_update { … }` inside a `deployment`, `statefulset`, `job` or `cronjob` (agent
//! extension; voodu carries it as a plugin block): follow the image repository's tags by a
//! policy, and commit the chosen tag into the manifest (`commit`) or only report it (`report`).
//!
//! Invariants: a stored `ImageUpdate` was checked at decode (its policy builds, its interval is a
//! duration within bounds); it is out of every spec hash, so adding, changing or removing the
//! block never replaces a running replica.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::{ImagePolicy, PolicyError, parse_go_duration};

/// The default scan interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// The shortest interval accepted: a registry is somebody else's service.
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// A checked `image_update` block, as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageUpdate {
    /// `semver` (default), `numerical` or `alphabetical`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub policy: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub range: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filter: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub extract: String,
    /// A Go duration; empty = `DEFAULT_INTERVAL`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interval: String,
    /// `commit` (default) or `report`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    /// `commit` mode: push the bump to this branch instead of the watched one (for review).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub push_branch: String,
}

impl ImageUpdate {
    /// The policy the fields describe (checked at decode, so an error here means a stored
    /// spec from another version).
    pub fn policy(&self) -> Result<ImagePolicy, PolicyError> {
        ImagePolicy::new(&self.policy, &self.range, &self.filter, &self.extract)
    }

    /// How often the repository is scanned.
    pub fn interval(&self) -> Duration {
        parse_go_duration(&self.interval)
            .unwrap_or(DEFAULT_INTERVAL)
            .max(MIN_INTERVAL)
    }

    /// Whether the chosen tag is committed to git (else only reported).
    pub fn commits(&self) -> bool {
        self.mode != "report"
    }
}
