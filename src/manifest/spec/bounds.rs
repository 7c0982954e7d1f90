//! The upper bound of every number a manifest can give, in one place. Validation enforces
//! each at the line that breaks it; the reconciler clamps to the same bounds, so desired state
//! an older agent stored unchecked (`replicas = 1e12`) cannot make it allocate in proportion.
//!
//! Invariant: every bound here is listed in the README's "Limits" table, with why.

use std::time::Duration;

/// Replicas of one deployment or statefulset (also `autoscale.min`/`max`): one host runs
/// them all, and planning holds one step per replica.
pub(crate) const MAX_REPLICAS: i64 = 1000;

/// `MAX_REPLICAS` as a count, for the reconciler's clamps.
pub(crate) const MAX_REPLICA_COUNT: usize = MAX_REPLICAS as usize;

/// Published ports of one bridge-mode resource once ranges are expanded: each is a Docker
/// proxy and firewall rule; wider ranges call for `network_mode = "host"` (which publishes
/// nothing, so the bound does not apply there).
pub(crate) const MAX_PUBLISHED_PORTS: usize = 10_000;

/// Timeouts and cool-downs (job, init and release timeouts, autoscale cool-downs): a week.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest `image_update.interval`.
pub(crate) const MAX_IMAGE_SCAN_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

/// `drain.grace`, the SIGTERM → SIGKILL gap of a replica being stopped: an hour.
pub(crate) const MAX_STOP_GRACE: Duration = Duration::from_secs(3600);

/// Probe timing (`initial_delay`, `period`, `timeout`) and `lb.interval`: an hour.
pub(crate) const MAX_PROBE_DURATION: Duration = Duration::from_secs(3600);

/// A `url()` asset fetch blocks the commit's sync while it runs: five minutes.
pub(crate) const MAX_FETCH_TIMEOUT: Duration = Duration::from_secs(300);

/// `restart = "on-failure:N"`: restarts Docker attempts.
pub(crate) const MAX_RESTART_RETRIES: i64 = 1000;

/// Probe `failure_threshold` and `success_threshold`.
pub(crate) const MAX_PROBE_THRESHOLD: i64 = 1000;

/// `keep_releases`, `successful_history_limit`, `failed_history_limit`: records and stopped
/// containers kept per resource.
pub(crate) const MAX_HISTORY: i64 = 100;

/// `depends_on.resources`: resources one resource starts after.
pub(crate) const MAX_DEPENDENCIES: usize = 64;

/// `depends_on.resources`: one entry's length (a kind and two names fit in 140).
pub(crate) const MAX_DEPENDENCY_ENTRY: usize = 160;

/// `logs.max_files`: rotated log files kept per container.
pub(crate) const MAX_LOG_FILES: i64 = 100;

/// `logs.max_size`: one log file, in bytes (1 GiB).
pub(crate) const MAX_LOG_SIZE: i64 = 1 << 30;

/// `resources.limits.cpu`, in cores (Docker's own minimum is 0.01).
pub(crate) const MAX_CPUS: i64 = 1024;

/// `resources.limits.memory` and `docker_options` sizes, in bytes (16 TiB; Docker's own
/// minimum memory limit is 6 MiB).
pub(crate) const MAX_MEMORY: i64 = crate::model::DockerOptions::MAX_SIZE;

/// Docker refuses a memory limit below 6 MiB.
pub(crate) const MIN_MEMORY: i64 = 6 << 20;

/// `volume_claim.size`, in bytes (1 PiB).
pub(crate) const MAX_VOLUME_SIZE: i64 = 1 << 50;

/// A `ulimits` value that is not unlimited (`-1`): 2⁴⁰ covers byte-valued limits such as
/// `memlock`; above it write -1.
pub(crate) const MAX_ULIMIT: i64 = 1 << 40;

/// Plugin-owned nested blocks of one deployment or statefulset: each is stored and shown
/// with the resource.
pub(crate) const MAX_PLUGIN_BLOCKS: usize = 64;

/// A Go duration written `"1h30m"`, for messages.
pub(crate) fn show_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// A statefulset's `backup.timeout`: a day (restic must finish, and the pods of a `stop`
/// backup stay stopped, until then).
pub(crate) const MAX_BACKUP_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A statefulset's `backup.timeout`, at least: a second.
pub(crate) const MIN_BACKUP_TIMEOUT: Duration = Duration::from_secs(1);

/// `backup.keep.last` / `daily` / `weekly` / `monthly`: snapshots kept per count.
pub(crate) const MAX_BACKUP_KEEP: i64 = 1000;
