//! Docker Swarm's units, in the crate's own types: a service (a task template, a mode, a
//! rolling-update policy), its tasks, the nodes they run on, configs. The `Swarm` verbs take
//! and return these; `docker_service.rs` maps them to the engine's API, `fake/swarm.rs`
//! models them in memory.
//!
//! Invariant: a `ServiceSpec` is all the agent sends: the same spec gives the same
//! `digest`, so a service whose `voodu.service_digest` label matches needs no update.

use std::collections::BTreeMap;
use std::time::Duration;

use super::ContainerSpec;

/// What the overlay network standing for a container network is named after: `voodu0` is
/// `voodu0-swarm` under Swarm.
pub(crate) const OVERLAY_SUFFIX: &str = "-swarm";

/// The overlay network a manifest's network `name` is under Swarm (a bridge network of the
/// same name may exist on the engine for containers).
pub(crate) fn overlay(name: &str) -> String {
    format!("{name}{OVERLAY_SUFFIX}")
}

/// How a service runs its tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceMode {
    /// `replicas` tasks, kept running.
    Replicated { replicas: u64 },
    /// Runs to completion once (`replicated-job`, one task at a time).
    ReplicatedJob,
    /// One task on every node the placement allows, kept running (the ingress proxy).
    Global,
}

/// Which task of a slot goes first in a rolling update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateOrder {
    /// The new task starts and is healthy before the old one stops (a surge).
    StartFirst,
    /// The old task stops first (a host port or a node-local volume cannot be shared).
    StopFirst,
}

/// `update_config` (and `rollback_config`, with the same order and `pause` on failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdatePolicy {
    pub order: UpdateOrder,
    /// How long a new task must run (and stay healthy) before the next slot: the
    /// readiness window.
    pub monitor: Duration,
    /// Whether a failed update is rolled back by Swarm (`failure_action rollback`; else
    /// `pause`).
    pub rollback_on_failure: bool,
}

/// A health check Swarm runs in each task's container (`HEALTHCHECK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// `["CMD", …]` or `["CMD-SHELL", "…"]`.
    pub test: Vec<String>,
    pub interval: Duration,
    pub timeout: Duration,
    pub retries: u64,
    pub start_period: Duration,
}

/// A config mounted as a file in each task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMount {
    pub config_id: String,
    pub config_name: String,
    /// Absolute path in the container.
    pub target: String,
}

/// A port published on the node a task runs on (host mode: the routing mesh may be
/// unavailable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub published: u16,
    pub target: u16,
    pub(crate) protocol: String,
}

/// Everything needed to create or update one service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    pub name: String,
    /// Labels of the service itself (ownership, release); the task's container labels are
    /// `task.labels`.
    pub labels: BTreeMap<String, String>,
    /// The task template: image, command, env, container labels, mounts (`binds`, named
    /// volumes or absolute host paths), networks (overlay) with `aliases`, limits, ulimits,
    /// capabilities, log options, `docker_options` the service API has. Ports are
    /// `published`; the container spec's own `ports` are ignored.
    pub task: ContainerSpec,
    pub mode: ServiceMode,
    pub update: UpdatePolicy,
    /// Placement constraints (`node.id==…`, `node.labels.…==…`).
    pub constraints: Vec<String>,
    pub configs: Vec<ConfigMount>,
    pub published: Vec<HostPort>,
    pub health: Option<HealthCheck>,
    /// SIGTERM to SIGKILL (`stop_grace_period`).
    pub stop_grace: Duration,
    /// Restart failed tasks (a job's tasks are not restarted).
    pub restart_on_failure: bool,
    /// Labels of the named volumes the task mounts, by volume name: a node creates a
    /// missing volume with them.
    pub volume_labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl ServiceSpec {
    /// A digest of everything but the replica count, the placement (the agent's choice of
    /// node, kept across updates), the configs' ids (their names carry their content) and
    /// the labels in `volatile` (the release a spec was applied for): equal digests need no
    /// update.
    pub(crate) fn digest(&self, volatile: &[&str]) -> String {
        use sha2::Digest as _;
        let mut stable = self.clone();
        if let ServiceMode::Replicated { replicas } = &mut stable.mode {
            *replicas = 0;
        }
        stable.constraints.clear();
        for config in &mut stable.configs {
            config.config_id.clear();
        }
        for label in volatile {
            stable.labels.remove(*label);
        }
        // The Debug form: every field, maps in key order. An agent whose spec types change
        // updates each service once, as a changed spec hash would.
        let hash = sha2::Sha256::digest(format!("{stable:?}").as_bytes());
        hash.iter()
            .take(12)
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }
}

/// Where a Swarm update stands (`UpdateStatus.State`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateState {
    Updating,
    Paused,
    Completed,
    RollbackStarted,
    RollbackPaused,
    RollbackCompleted,
}

impl UpdateState {
    pub(crate) fn parse(text: &str) -> Option<UpdateState> {
        Some(match text {
            "updating" => UpdateState::Updating,
            "paused" => UpdateState::Paused,
            "completed" => UpdateState::Completed,
            "rollback_started" => UpdateState::RollbackStarted,
            "rollback_paused" => UpdateState::RollbackPaused,
            "rollback_completed" => UpdateState::RollbackCompleted,
            _ => return None,
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            UpdateState::Updating => "updating",
            UpdateState::Paused => "paused",
            UpdateState::Completed => "completed",
            UpdateState::RollbackStarted => "rollback_started",
            UpdateState::RollbackPaused => "rollback_paused",
            UpdateState::RollbackCompleted => "rollback_completed",
        }
    }

    /// Swarm gave up on the update (rolled it back, or paused it).
    pub(crate) fn failed(self) -> bool {
        matches!(
            self,
            UpdateState::Paused
                | UpdateState::RollbackStarted
                | UpdateState::RollbackPaused
                | UpdateState::RollbackCompleted
        )
    }

    /// Tasks are still being replaced.
    pub(crate) fn in_progress(self) -> bool {
        matches!(self, UpdateState::Updating | UpdateState::RollbackStarted)
    }
}

/// A service as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub id: String,
    pub name: String,
    /// The version an update must name (optimistic concurrency).
    pub version: u64,
    /// The current spec's service labels.
    pub(crate) labels: BTreeMap<String, String>,
    /// The current spec's task container labels and image.
    pub task_labels: BTreeMap<String, String>,
    pub(crate) image: String,
    /// `None` for a job.
    pub replicas: Option<u64>,
    /// The last rolling update (`UpdateStatus`); `None` before any.
    pub update: Option<UpdateStatus>,
    pub constraints: Vec<String>,
}

/// A service's last rolling update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateStatus {
    pub state: UpdateState,
    pub message: String,
    /// When it started (Unix seconds): an update started before a release began is not
    /// that release's.
    pub(crate) started_at: i64,
}

impl Service {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// A task's state, as Swarm reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaskState {
    /// New, pending, assigned, accepted, ready, preparing, starting.
    Starting,
    Running,
    Complete,
    Shutdown,
    Failed,
    Rejected,
    /// Remove, orphaned, or a state this agent does not know.
    Other,
}

impl TaskState {
    pub(crate) fn parse(text: &str) -> TaskState {
        match text {
            "new" | "allocated" | "pending" | "assigned" | "accepted" | "ready" | "preparing"
            | "starting" => TaskState::Starting,
            "running" => TaskState::Running,
            "complete" => TaskState::Complete,
            "shutdown" => TaskState::Shutdown,
            "failed" => TaskState::Failed,
            "rejected" => TaskState::Rejected,
            _ => TaskState::Other,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TaskState::Starting => "starting",
            TaskState::Running => "running",
            TaskState::Complete => "complete",
            TaskState::Shutdown => "shutdown",
            TaskState::Failed => "failed",
            TaskState::Rejected => "rejected",
            TaskState::Other => "other",
        }
    }

    /// The task has ended (it will not run again).
    pub fn ended(self) -> bool {
        matches!(
            self,
            TaskState::Complete | TaskState::Shutdown | TaskState::Failed | TaskState::Rejected
        )
    }
}

/// One task of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub id: String,
    pub(crate) service_id: String,
    /// A replicated service's slot (1-based); `None` for a job's task.
    pub slot: Option<u64>,
    /// Where it was scheduled; empty while pending.
    pub(crate) node_id: String,
    /// What Swarm wants of it: `Running` for current tasks, `Shutdown` for ones going away.
    pub desired: TaskState,
    pub state: TaskState,
    /// The state's message, and the error of a failed or rejected task.
    pub(crate) message: String,
    pub error: String,
    /// When it entered its state (Unix seconds).
    pub since: i64,
    /// The labels of the spec it runs (its container labels).
    pub labels: BTreeMap<String, String>,
    pub(crate) image: String,
    pub container_id: String,
    pub exit_code: Option<i64>,
}

/// A node's readiness as the managers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Ready,
    Down,
    Unknown,
}

/// A swarm node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: String,
    pub hostname: String,
    pub state: NodeState,
    /// `active`, `pause` or `drain`.
    pub availability: String,
    pub manager: bool,
}

/// What the engine is to a swarm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwarmNode {
    pub node_id: String,
    /// Only a manager can run services.
    pub manager: bool,
}

/// A config as listed (its data is never read back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwarmConfig {
    pub(crate) id: String,
    pub name: String,
    pub(crate) labels: BTreeMap<String, String>,
}

/// The largest config Swarm stores, in bytes.
pub(crate) const MAX_CONFIG_BYTES: usize = 500 * 1024;

/// A replicated service of three running `task`, for tests.
#[cfg(test)]
pub(crate) fn fixture(task: ContainerSpec) -> ServiceSpec {
    ServiceSpec {
        name: "shop-web".into(),
        labels: BTreeMap::from([("voodu.release_id".into(), "3".into())]),
        task,
        mode: ServiceMode::Replicated { replicas: 3 },
        update: UpdatePolicy {
            order: UpdateOrder::StartFirst,
            monitor: Duration::from_secs(3),
            rollback_on_failure: true,
        },
        constraints: Vec::new(),
        configs: Vec::new(),
        published: Vec::new(),
        health: None,
        stop_grace: Duration::from_secs(10),
        restart_on_failure: true,
        volume_labels: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ServiceSpec {
        fixture(ContainerSpec {
            image: "busybox".into(),
            ..ContainerSpec::default()
        })
    }

    #[test]
    fn the_digest_ignores_replicas_and_volatile_labels_only() {
        let base = spec();
        let digest = base.digest(&["voodu.release_id"]);
        assert_eq!(digest.len(), 24);
        let mut scaled = base.clone();
        scaled.mode = ServiceMode::Replicated { replicas: 5 };
        scaled.labels.insert("voodu.release_id".into(), "4".into());
        assert_eq!(scaled.digest(&["voodu.release_id"]), digest);
        let mut changed = base.clone();
        changed.task.image = "busybox:1".into();
        assert_ne!(changed.digest(&["voodu.release_id"]), digest);
        assert_ne!(base.digest(&[]), digest);
    }

    #[test]
    fn states_parse_as_swarm_names_them() {
        assert_eq!(
            UpdateState::parse("rollback_completed"),
            Some(UpdateState::RollbackCompleted)
        );
        assert!(
            UpdateState::RollbackStarted.failed() && UpdateState::RollbackStarted.in_progress()
        );
        assert!(!UpdateState::Completed.failed());
        assert_eq!(UpdateState::parse("nonsense"), None);
        assert_eq!(TaskState::parse("preparing"), TaskState::Starting);
        assert_eq!(TaskState::parse("orphaned"), TaskState::Other);
        assert!(TaskState::Rejected.ended() && !TaskState::Running.ended());
    }
}
