//! `job "scope" "name"` (spec §2.5) and `cronjob "scope" "name"` (spec §2.6).
//!
//! voodu has no spec hash for jobs (spec §5.1); the agent needs one, because a job runs to
//! completion once per spec hash. Invariant: the job hash covers what changes a run (image,
//! command, env, mounts, networking, limits, timeout, asset digests), not the history limits;
//! the cronjob hash adds the schedule fields to its job's hash.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{Container, Logs, is_false, is_zero};
use super::deployment::asset_lines;
use super::hash::{HashedHostOptions, go_json_sha256, non_empty};
use super::{KindSpec, image_text};
use crate::model::{ResourceKey, SpecHash};

/// A one-shot job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    #[serde(flatten)]
    pub(crate) container: Container,
    /// Go duration; empty means no deadline.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) timeout: String,
    /// Default 3 (spec §2.5: 0 → 3).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) successful_history_limit: i64,
    /// Default 1 (spec §2.5: 0 → 1).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) failed_history_limit: i64,
    #[serde(
        rename = "_asset_digests",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub(crate) asset_digests: BTreeMap<String, String>,
}

impl JobSpec {
    pub(crate) fn successful_history(&self) -> usize {
        history_limit(self.successful_history_limit, 3)
    }

    pub(crate) fn failed_history(&self) -> usize {
        history_limit(self.failed_history_limit, 1)
    }

    fn hashed(&self, key: &ResourceKey) -> HashedJob {
        let container = &self.container;
        let mut networks = container.effective_networks();
        networks.sort_unstable();
        HashedJob {
            image: container.effective_image(key),
            command: container.command.clone(),
            volumes: non_empty(&container.volumes),
            env: (!container.env.is_empty()).then(|| container.env.clone()),
            env_from: non_empty(&container.env_from),
            networks: non_empty(&networks),
            network_mode: container.network_mode.clone(),
            host_options: HashedHostOptions::of(container),
            logs: Some(container.logs.clone()),
            timeout: self.timeout.clone(),
            assets: asset_lines(&self.asset_digests),
        }
    }
}

impl KindSpec for JobSpec {
    const HASHED: &'static [&'static str] = &["env_from", "timeout"];
    const HASHES_CONTAINER: bool = true;

    /// The agent's job hash: a job runs once per value of it.
    fn spec_hash(&self, key: &ResourceKey) -> SpecHash {
        go_json_sha256(&self.hashed(key))
    }

    fn container(&self) -> Option<&Container> {
        Some(&self.container)
    }

    fn asset_digests_mut(&mut self) -> Option<&mut BTreeMap<String, String>> {
        Some(&mut self.asset_digests)
    }

    fn summary(&self) -> String {
        format!("runs {} once", image_text(&self.container.image))
    }
}

/// A history limit: 0 or less means `default`; clamped to `MAX_HISTORY` (desired state an
/// older agent stored may hold any number).
fn history_limit(value: i64, default: usize) -> usize {
    if value <= 0 {
        default
    } else {
        usize::try_from(value.min(super::bounds::MAX_HISTORY)).unwrap_or(default)
    }
}

/// A scheduled job. The job fields sit flat at the HCL root and under `job` in JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronjobSpec {
    pub(crate) schedule: String,
    pub(crate) job: JobSpec,
    /// `""` (= Allow), `Allow` or `Forbid`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) concurrency_policy: String,
    /// IANA name; empty means UTC.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) timezone: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub(crate) suspend: bool,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) successful_history_limit: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) failed_history_limit: i64,
}

impl CronjobSpec {
    pub(crate) fn successful_history(&self) -> usize {
        history_limit(self.successful_history_limit, 3)
    }

    pub(crate) fn failed_history(&self) -> usize {
        history_limit(self.failed_history_limit, 1)
    }
}

impl KindSpec for CronjobSpec {
    const HASHED: &'static [&'static str] = &[
        "schedule",
        "timezone",
        "suspend",
        "concurrency_policy",
        "job",
    ];
    const HASHES_CONTAINER: bool = false;

    /// The agent's cronjob hash: the job's hash plus the schedule fields.
    fn spec_hash(&self, key: &ResourceKey) -> SpecHash {
        go_json_sha256(&HashedCronjob {
            schedule: &self.schedule,
            timezone: &self.timezone,
            suspend: self.suspend,
            concurrency_policy: &self.concurrency_policy,
            job: self.job.hashed(key),
        })
    }

    fn container(&self) -> Option<&Container> {
        Some(&self.job.container)
    }

    fn asset_digests_mut(&mut self) -> Option<&mut BTreeMap<String, String>> {
        Some(&mut self.job.asset_digests)
    }

    fn summary(&self) -> String {
        format!(
            "runs {} on {:?}",
            image_text(&self.job.container.image),
            self.schedule
        )
    }
}

#[derive(Serialize)]
struct HashedJob {
    image: String,
    command: Option<Vec<String>>,
    volumes: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    env_from: Option<Vec<String>>,
    networks: Option<Vec<String>>,
    network_mode: String,
    #[serde(flatten)]
    host_options: HashedHostOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    logs: Option<Logs>,
    timeout: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    assets: Option<Vec<String>>,
}

#[derive(Serialize)]
struct HashedCronjob<'a> {
    schedule: &'a str,
    timezone: &'a str,
    suspend: bool,
    concurrency_policy: &'a str,
    job: HashedJob,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::spec::hash::check_hash_edits;
    use crate::model::Kind;

    fn key() -> ResourceKey {
        ResourceKey::new(Kind::Job, "ops", "migrate")
    }

    fn base() -> JobSpec {
        let mut spec = JobSpec::default();
        spec.container.image = "busybox".into();
        spec.container.command = Some(vec!["true".into()]);
        spec
    }

    #[test]
    fn run_fields_are_hashed_and_history_limits_are_not() {
        type Edit = fn(&mut JobSpec);
        let hashed: &[(&str, Edit)] = &[
            ("env_from", |s| s.container.env_from = vec!["ops".into()]),
            ("timeout", |s| s.timeout = "1m".into()),
            ("_asset_digests", |s| {
                s.asset_digests = BTreeMap::from([("a.b".into(), "00".into())]);
            }),
        ];
        let not_hashed: &[(&str, Edit)] = &[
            ("successful_history_limit", |s| {
                s.successful_history_limit = 9
            }),
            ("failed_history_limit", |s| s.failed_history_limit = 9),
        ];
        check_hash_edits(base, |spec| spec.spec_hash(&key()), hashed, not_hashed);
    }

    #[test]
    fn history_limits_default_like_voodu() {
        let spec = base();
        assert_eq!((spec.successful_history(), spec.failed_history()), (3, 1));
        let cron = CronjobSpec {
            successful_history_limit: 5,
            ..CronjobSpec::default()
        };
        assert_eq!((cron.successful_history(), cron.failed_history()), (5, 1));
    }

    #[test]
    fn cronjob_hash_covers_schedule_and_job() {
        let cron = CronjobSpec {
            schedule: "* * * * *".into(),
            job: base(),
            ..CronjobSpec::default()
        };
        let before = cron.spec_hash(&key());
        let mut schedule = cron.clone();
        schedule.schedule = "*/5 * * * *".into();
        assert_ne!(schedule.spec_hash(&key()), before);
        let mut job = cron.clone();
        job.job.container.image = "other".into();
        assert_ne!(job.spec_hash(&key()), before);
        let mut limits = cron;
        limits.failed_history_limit = 4;
        assert_eq!(limits.spec_hash(&key()), before);
    }
}
