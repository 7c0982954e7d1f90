//! The service verbs of `FakeRuntime`: a single-manager swarm in memory, as the contract
//! suite checks it against a real single-node swarm.
//!
//! Tasks are decided when a service is created or updated: a task of an unknown image is
//! rejected; a replicated task whose command ends (as the fake's interpreter reads it) or
//! whose health check fails fails; any other runs (a job's task completes or fails as its
//! command does, or runs until `finish_task`). A rolling update replaces every slot's task
//! at once and completes, or — when a new task fails and the spec asks for a rollback —
//! ends in `rollback_completed` with the previous spec back and the old tasks still running
//! (Swarm keeps one previous spec).
//!
//! Invariant: every verb the contract suite checks behaves as the engine does (names are
//! unique, a stale version conflicts, a config in use cannot be removed, removing what is
//! gone succeeds); anything a test assumes beyond that must be added to the suite first.

use std::collections::BTreeMap;

use super::{FakeRuntime, Run, interpret};
use crate::runtime::service::{
    Node, NodeState, Service, ServiceMode, ServiceSpec, SwarmConfig, SwarmNode, Task, TaskState,
    UpdateState, UpdateStatus,
};
use crate::runtime::{Error, RegistryAuth, Result, Swarm};

/// The fake swarm.
#[derive(Default)]
pub(super) struct FakeSwarm {
    services: BTreeMap<String, FakeService>,
    configs: BTreeMap<String, FakeConfig>,
    /// `None`: the default single node, this manager.
    nodes: Option<Vec<Node>>,
    next_id: u64,
}

struct FakeService {
    id: String,
    spec: ServiceSpec,
    previous: Option<ServiceSpec>,
    version: u64,
    update: Option<UpdateStatus>,
    tasks: Vec<Task>,
}

struct FakeConfig {
    name: String,
    labels: BTreeMap<String, String>,
    data: Vec<u8>,
}

/// The node the fake runs on.
const NODE: &str = "fakenode1";

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(0))
}

fn matches(labels: &BTreeMap<String, String>, filter: &[(&str, &str)]) -> bool {
    filter
        .iter()
        .all(|(key, value)| labels.get(*key).map(String::as_str) == Some(*value))
}

/// The spec without what a rolling update ignores (replicas, service labels).
fn template(spec: &ServiceSpec) -> ServiceSpec {
    let mut template = spec.clone();
    if let ServiceMode::Replicated { replicas } = &mut template.mode {
        *replicas = 0;
    }
    template.labels.clear();
    template.name.clear();
    template
}

/// How a new task of `spec` ends up: `Ok(state)` or `Err((state, error, exit code))`.
fn outcome(
    fake: &FakeRuntime,
    spec: &ServiceSpec,
) -> std::result::Result<TaskState, (TaskState, String, Option<i64>)> {
    if !fake.knows_image(&spec.task.image) {
        return Err((
            TaskState::Rejected,
            format!("No such image: {}", spec.task.image),
            None,
        ));
    }
    if let Some(health) = &spec.health {
        let command = match health.test.as_slice() {
            [kind, rest @ ..] if kind == "CMD" => rest.to_vec(),
            [kind, script] if kind == "CMD-SHELL" => {
                vec!["sh".to_owned(), "-c".to_owned(), script.clone()]
            }
            _ => Vec::new(),
        };
        if let Run::Exited(code, _) = interpret(Some(&command))
            && code != 0
        {
            return Err((
                TaskState::Failed,
                "task: non-zero exit (137): dockerexec: unhealthy container".to_owned(),
                Some(137),
            ));
        }
    }
    match (interpret(spec.task.command.as_deref()), &spec.mode) {
        (Run::Running(_), _) => Ok(TaskState::Running),
        (Run::Exited(0, _), ServiceMode::ReplicatedJob) => Ok(TaskState::Complete),
        (Run::Exited(code, _), _) => Err((
            TaskState::Failed,
            format!("task: non-zero exit ({code})"),
            Some(code),
        )),
    }
}

impl FakeRuntime {
    fn swarm_lock(&self) -> std::sync::MutexGuard<'_, FakeSwarm> {
        self.swarm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The spec service `name` was last created or updated with.
    pub fn service_spec(&self, name: &str) -> Option<ServiceSpec> {
        self.swarm_lock()
            .services
            .values()
            .find(|service| service.spec.name == name)
            .map(|service| service.spec.clone())
    }

    /// The content of config `name`.
    pub fn config_data(&self, name: &str) -> Option<Vec<u8>> {
        self.swarm_lock()
            .configs
            .values()
            .find(|config| config.name == name)
            .map(|config| config.data.clone())
    }

    /// Replaces the fake swarm's nodes (the first is this manager).
    pub fn set_nodes(&self, nodes: Vec<Node>) {
        self.swarm_lock().nodes = Some(nodes);
    }

    /// Ends a running task as its container would, with `code` (a job's run).
    pub fn finish_task(&self, task_id: &str, code: i64) {
        let mut swarm = self.swarm_lock();
        for service in swarm.services.values_mut() {
            for task in &mut service.tasks {
                if task.id == task_id && task.state == TaskState::Running {
                    task.state = if code == 0 {
                        TaskState::Complete
                    } else {
                        TaskState::Failed
                    };
                    task.exit_code = Some(code);
                    if code != 0 {
                        task.error = format!("task: non-zero exit ({code})");
                    }
                    task.since = now();
                }
            }
        }
    }

    /// Makes the tasks of `node_id` as a lost node's look: Swarm reschedules replicated
    /// tasks that are not pinned to it; pinned ones wait, pending.
    pub fn lose_node(&self, node_id: &str) {
        let mut swarm = self.swarm_lock();
        if let Some(nodes) = &mut swarm.nodes {
            for node in nodes.iter_mut().filter(|node| node.id == node_id) {
                node.state = NodeState::Down;
            }
        }
        let other = swarm.nodes.as_ref().and_then(|nodes| {
            nodes
                .iter()
                .find(|node| node.state == NodeState::Ready)
                .map(|node| node.id.clone())
        });
        let mut next = swarm.next_id;
        for service in swarm.services.values_mut() {
            let pinned = service
                .spec
                .constraints
                .iter()
                .any(|constraint| constraint == &format!("node.id=={node_id}"));
            let mut moved = Vec::new();
            for task in &mut service.tasks {
                if task.node_id == node_id && task.desired == TaskState::Running {
                    task.desired = TaskState::Shutdown;
                    task.state = TaskState::Other;
                    task.message = "node is down".to_owned();
                    let mut replacement = task.clone();
                    next += 1;
                    replacement.id = format!("task{next}");
                    replacement.desired = TaskState::Running;
                    replacement.since = now();
                    match (&other, pinned) {
                        (Some(other), false) => {
                            replacement.node_id.clone_from(other);
                            replacement.state = TaskState::Running;
                            replacement.message = "started".to_owned();
                        }
                        _ => {
                            replacement.node_id.clear();
                            replacement.state = TaskState::Starting;
                            replacement.message = "pending task scheduling".to_owned();
                            replacement.error =
                                "no suitable node (scheduling constraints not satisfied)"
                                    .to_owned();
                        }
                    }
                    moved.push(replacement);
                }
            }
            service.tasks.extend(moved);
        }
        swarm.next_id = next;
    }

    /// Every config `spec` mounts must exist.
    fn check_configs(&self, spec: &ServiceSpec) -> Result<()> {
        let swarm = self.swarm_lock();
        for config in &spec.configs {
            if !swarm.configs.contains_key(&config.config_id) {
                return Err(Error::Invalid {
                    message: format!("config {} not found", config.config_name),
                });
            }
        }
        Ok(())
    }
}

/// The node a task of `spec` is placed on: the one a `node.id==…` constraint names, else
/// this manager.
fn placed(spec: &ServiceSpec) -> String {
    spec.constraints
        .iter()
        .find_map(|constraint| constraint.strip_prefix("node.id=="))
        .unwrap_or(NODE)
        .to_owned()
}

/// A task of `spec` for `slot`, as `outcome` decides it.
fn new_task(
    fake: &FakeRuntime,
    service_id: &str,
    spec: &ServiceSpec,
    slot: Option<u64>,
    id: u64,
) -> Task {
    let (state, error, exit_code) = match outcome(fake, spec) {
        Ok(state) => (
            state,
            String::new(),
            (state == TaskState::Complete).then_some(0),
        ),
        Err((state, error, code)) => (state, error, code),
    };
    Task {
        id: format!("task{id}"),
        service_id: service_id.to_owned(),
        slot,
        node_id: placed(spec),
        desired: if matches!(spec.mode, ServiceMode::ReplicatedJob) {
            TaskState::Complete
        } else {
            TaskState::Running
        },
        state,
        message: state.as_str().to_owned(),
        error,
        since: now(),
        labels: spec.task.labels.clone(),
        image: spec.task.image.clone(),
        container_id: format!("ctr-task{id}"),
        exit_code,
    }
}

fn replicas(spec: &ServiceSpec) -> u64 {
    match spec.mode {
        ServiceMode::Replicated { replicas } => replicas,
        // The fake swarm runs a global service's one task on its manager.
        ServiceMode::ReplicatedJob | ServiceMode::Global => 1,
    }
}

/// A running task of `spec` for `slot`.
fn running_task(spec: &ServiceSpec, service_id: &str, slot: u64, id: u64) -> Task {
    Task {
        id: format!("task{id}"),
        service_id: service_id.to_owned(),
        slot: Some(slot),
        node_id: placed(spec),
        desired: TaskState::Running,
        state: TaskState::Running,
        message: "started".to_owned(),
        error: String::new(),
        since: now(),
        labels: spec.task.labels.clone(),
        image: spec.task.image.clone(),
        container_id: format!("ctr-task{id}"),
        exit_code: None,
    }
}

/// Ends a rolling update of `service` to `spec`: completed with a new task per slot, or
/// (`failure`: the failed task's id; Swarm's message then says only "rollback completed")
/// rolled back, as Swarm does: the spec before the update
/// stays current with its tasks, and the failed spec becomes the previous one. Uses task
/// ids after `next`; returns how many.
fn finish_update(
    service: &mut FakeService,
    spec: ServiceSpec,
    failure: Option<String>,
    next: u64,
) -> u64 {
    let started_at = service
        .update
        .as_ref()
        .map_or_else(now, |update| update.started_at);
    if failure.is_some() {
        service.previous = Some(spec);
        // The update, then its rollback.
        service.version += 1;
        service.update = Some(UpdateStatus {
            state: UpdateState::RollbackCompleted,
            message: "rollback completed".to_owned(),
            started_at,
        });
        return 0;
    }
    for task in &mut service.tasks {
        if task.desired == TaskState::Running {
            task.desired = TaskState::Shutdown;
            task.state = TaskState::Shutdown;
        }
    }
    let mut used = 0;
    for slot in 1..=replicas(&spec) {
        used += 1;
        service
            .tasks
            .push(running_task(&spec, &service.id, slot, next + used));
    }
    service.previous = Some(std::mem::replace(&mut service.spec, spec));
    service.version += 1;
    service.update = Some(UpdateStatus {
        state: UpdateState::Completed,
        message: "update completed".to_owned(),
        started_at,
    });
    used
}

impl Swarm for FakeRuntime {
    async fn swarm_node(&self) -> Result<Option<SwarmNode>> {
        self.enter("swarm_node", "")?;
        Ok(Some(SwarmNode {
            node_id: NODE.to_owned(),
            manager: true,
        }))
    }

    async fn list_nodes(&self) -> Result<Vec<Node>> {
        self.enter("list_nodes", "")?;
        Ok(self.swarm_lock().nodes.clone().unwrap_or_else(|| {
            vec![Node {
                id: NODE.to_owned(),
                hostname: "fake-1".to_owned(),
                state: NodeState::Ready,
                availability: "active".to_owned(),
                manager: true,
            }]
        }))
    }

    async fn ensure_overlay(&self, name: &str) -> Result<()> {
        self.enter("ensure_overlay", name)?;
        self.lock().networks.insert(name.to_owned());
        Ok(())
    }

    async fn list_services(&self, filter: &[(&str, &str)]) -> Result<Vec<Service>> {
        self.enter("list_services", "")?;
        let swarm = self.swarm_lock();
        Ok(swarm
            .services
            .values()
            .filter(|service| matches(&service.spec.labels, filter))
            .map(|service| Service {
                id: service.id.clone(),
                name: service.spec.name.clone(),
                version: service.version,
                labels: service.spec.labels.clone(),
                task_labels: service.spec.task.labels.clone(),
                image: service.spec.task.image.clone(),
                replicas: match service.spec.mode {
                    ServiceMode::Replicated { replicas } => Some(replicas),
                    ServiceMode::ReplicatedJob | ServiceMode::Global => None,
                },
                update: service.update.clone(),
                constraints: service.spec.constraints.clone(),
            })
            .collect())
    }

    async fn create_service(
        &self,
        spec: &ServiceSpec,
        _auth: Option<&RegistryAuth>,
    ) -> Result<String> {
        self.enter("create_service", &spec.name)?;
        self.check_configs(spec)?;
        let mut swarm = self.swarm_lock();
        if swarm
            .services
            .values()
            .any(|service| service.spec.name == spec.name)
        {
            return Err(Error::Conflict {
                name: spec.name.clone(),
                message: format!(
                    "name conflicts with an existing object: service {} already exists",
                    spec.name
                ),
            });
        }
        swarm.next_id += 1;
        let id = format!("svc{}", swarm.next_id);
        let mut tasks = Vec::new();
        let slots: Vec<Option<u64>> = match spec.mode {
            ServiceMode::Replicated { replicas } => (1..=replicas).map(Some).collect(),
            ServiceMode::ReplicatedJob => vec![None],
            // One node in the fake swarm: one task, in slot 1 as a replica's.
            ServiceMode::Global => vec![Some(1)],
        };
        for slot in slots {
            swarm.next_id += 1;
            tasks.push(new_task(self, &id, spec, slot, swarm.next_id));
        }
        swarm.services.insert(
            id.clone(),
            FakeService {
                id: id.clone(),
                spec: spec.clone(),
                previous: None,
                version: 1,
                update: None,
                tasks,
            },
        );
        Ok(id)
    }

    async fn update_service(
        &self,
        id: &str,
        version: u64,
        spec: &ServiceSpec,
        _auth: Option<&RegistryAuth>,
    ) -> Result<()> {
        self.enter("update_service", &spec.name)?;
        self.check_configs(spec)?;
        // Decided before the swarm is locked: `outcome` reads the fake's images.
        let probe = new_task(self, id, spec, Some(1), 0);
        let mut swarm = self.swarm_lock();
        let mut next = swarm.next_id;
        let service = swarm.services.get_mut(id).ok_or_else(|| Error::NotFound {
            what: format!("service {id}"),
        })?;
        if service.version != version {
            return Err(Error::Conflict {
                name: spec.name.clone(),
                message: format!(
                    "update out of sequence: version {version}, the service is at {}",
                    service.version
                ),
            });
        }
        if template(&service.spec) == template(spec) {
            // Labels or replicas only: no task replaced.
            let (from, to) = (replicas(&service.spec), replicas(spec));
            for task in &mut service.tasks {
                if task.slot.is_some_and(|slot| slot > to) && task.desired == TaskState::Running {
                    task.desired = TaskState::Shutdown;
                    task.state = TaskState::Shutdown;
                }
            }
            for slot in from + 1..=to {
                next += 1;
                service
                    .tasks
                    .push(running_task(&service.spec, id, slot, next));
            }
            service.spec = spec.clone();
            service.version += 1;
            swarm.next_id = next;
            return Ok(());
        }
        let failure = probe
            .state
            .ended()
            .then(|| format!("task{}", next + 1))
            .filter(|_| spec.update.rollback_on_failure);
        if probe.state.ended() {
            // The failed new task stays in the history of slot 1.
            next += 1;
            let mut failed = probe.clone();
            failed.id = format!("task{next}");
            failed.desired = TaskState::Shutdown;
            service.tasks.push(failed);
        }
        service.update = Some(UpdateStatus {
            state: UpdateState::Updating,
            message: "update in progress".to_owned(),
            started_at: now(),
        });
        let used = finish_update(service, spec.clone(), failure, next);
        swarm.next_id = next + used;
        Ok(())
    }

    async fn remove_service(&self, id: &str) -> Result<()> {
        self.enter("remove_service", id)?;
        self.swarm_lock().services.remove(id);
        Ok(())
    }

    async fn list_tasks(&self, service_id: &str) -> Result<Vec<Task>> {
        self.enter("list_tasks", service_id)?;
        Ok(self
            .swarm_lock()
            .services
            .get(service_id)
            .map(|service| service.tasks.clone())
            .unwrap_or_default())
    }

    async fn task_logs(&self, task_id: &str, _tail: usize) -> Result<String> {
        self.enter("task_logs", task_id)?;
        let swarm = self.swarm_lock();
        let spec = swarm.services.values().find_map(|service| {
            service
                .tasks
                .iter()
                .any(|task| task.id == task_id)
                .then(|| service.spec.clone())
        });
        Ok(match spec {
            Some(spec) => match interpret(spec.task.command.as_deref()) {
                Run::Exited(_, output) | Run::Running(output) => output,
            },
            None => String::new(),
        })
    }

    async fn create_config(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        data: &[u8],
    ) -> Result<String> {
        self.enter("create_config", name)?;
        if data.len() > crate::runtime::service::MAX_CONFIG_BYTES {
            return Err(Error::Invalid {
                message: "config data must be at most 500 KB".to_owned(),
            });
        }
        let mut swarm = self.swarm_lock();
        if swarm.configs.values().any(|config| config.name == name) {
            return Err(Error::Conflict {
                name: name.to_owned(),
                message: format!("config {name} already exists"),
            });
        }
        swarm.next_id += 1;
        let id = format!("cfg{}", swarm.next_id);
        swarm.configs.insert(
            id.clone(),
            FakeConfig {
                name: name.to_owned(),
                labels: labels.clone(),
                data: data.to_vec(),
            },
        );
        Ok(id)
    }

    async fn list_configs(&self, filter: &[(&str, &str)]) -> Result<Vec<SwarmConfig>> {
        self.enter("list_configs", "")?;
        Ok(self
            .swarm_lock()
            .configs
            .iter()
            .filter(|(_, config)| matches(&config.labels, filter))
            .map(|(id, config)| SwarmConfig {
                id: id.clone(),
                name: config.name.clone(),
                labels: config.labels.clone(),
            })
            .collect())
    }

    async fn remove_config(&self, id: &str) -> Result<()> {
        self.enter("remove_config", id)?;
        let mut swarm = self.swarm_lock();
        let users: Vec<String> = swarm
            .services
            .values()
            .filter(|service| {
                service
                    .spec
                    .configs
                    .iter()
                    .chain(
                        service
                            .previous
                            .iter()
                            .flat_map(|previous| &previous.configs),
                    )
                    .any(|config| config.config_id == id)
            })
            .map(|service| service.spec.name.clone())
            .collect();
        if let Some(name) = swarm.configs.get(id).map(|config| config.name.clone())
            && !users.is_empty()
        {
            return Err(Error::Invalid {
                message: format!(
                    "rpc error: code = InvalidArgument desc = config '{name}' is in use by the following service: {}",
                    users.join(", ")
                ),
            });
        }
        swarm.configs.remove(id);
        Ok(())
    }
}
