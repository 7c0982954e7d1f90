//! Docker Swarm (`--runtime swarm`): what a deployment's service needs next, and which parts
//! of a resource Swarm can run (`swarm_gaps`: refused, with the reason) or runs differently
//! (`swarm_notes`). Pure, shared by the handlers, `plan --runtime swarm` and `validate
//! --runtime swarm`, so they cannot disagree.
//!
//! Invariants: a service whose spec digest and replica count match gets no step (Swarm's
//! own rolling update replaces tasks, one at a time, by the service's `update_config`); a
//! replica count alone is a `Scale`, which replaces no task; while Swarm still updates, or
//! tasks of another version still run, the plan is `Wait`, never a second update.

use crate::manifest::spec::{Container, Spec};
use crate::model::DockerOptions;
use crate::runtime::{Service, Task, TaskState, labels};

/// The label on a service holding the digest of the spec the agent sent
/// (`ServiceSpec::digest`).
pub const SERVICE_DIGEST: &str = "voodu.service_digest";

/// One step towards a deployment's service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceStep {
    /// No service yet.
    Create,
    /// The spec changed (or was changed by hand): a rolling update.
    Update,
    /// Only the replica count differs.
    Scale { from: u64, to: u64 },
    /// Swarm is converging (an update in progress, tasks of another version, tasks
    /// starting): nothing to send, look again.
    Wait(String),
}

/// What the deployment's service should be.
#[derive(Debug, Clone, Copy)]
pub struct ServiceTarget<'a> {
    pub(crate) digest: &'a str,
    pub(crate) replicas: u64,
    pub(crate) spec_hash: &'a str,
    pub(crate) env_digest: &'a str,
}

impl ServiceTarget<'_> {
    /// Whether a task (or a template) with these labels runs the target version.
    pub(crate) fn is_current(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        labels.get(labels::MANIFEST_HASH).map(String::as_str) == Some(self.spec_hash)
            && labels.get(labels::ENV_DIGEST).map(String::as_str) == Some(self.env_digest)
    }
}

/// The step a deployment's service needs, given the service and its tasks.
pub fn plan_service(
    target: &ServiceTarget<'_>,
    service: Option<&Service>,
    tasks: &[Task],
) -> Vec<ServiceStep> {
    let Some(service) = service else {
        return vec![ServiceStep::Create];
    };
    let in_progress = service
        .update
        .as_ref()
        .is_some_and(|update| update.state.in_progress());
    let drifted = service.label(SERVICE_DIGEST) != Some(target.digest)
        || !target.is_current(&service.task_labels);
    if drifted && !in_progress {
        return vec![ServiceStep::Update];
    }
    if !in_progress && service.replicas != Some(target.replicas) {
        return vec![ServiceStep::Scale {
            from: service.replicas.unwrap_or(0),
            to: target.replicas,
        }];
    }
    if in_progress {
        return vec![ServiceStep::Wait(
            "Swarm is updating the service".to_owned(),
        )];
    }
    let live: Vec<&Task> = tasks
        .iter()
        .filter(|task| task.desired == TaskState::Running && !task.state.ended())
        .collect();
    let old = live
        .iter()
        .filter(|task| !target.is_current(&task.labels))
        .count();
    if old > 0 {
        return vec![ServiceStep::Wait(format!(
            "{old} task(s) of another version still run"
        ))];
    }
    let running = live
        .iter()
        .filter(|task| task.state == TaskState::Running)
        .count();
    if u64::try_from(running).unwrap_or(u64::MAX) < target.replicas {
        return vec![ServiceStep::Wait(format!(
            "{running} of {} task(s) running",
            target.replicas
        ))];
    }
    Vec::new()
}

/// What Swarm cannot run of a container spec, each with the reason.
fn container_gaps(container: &Container) -> Vec<String> {
    let mut gaps = Vec::new();
    if !container.network_mode.is_empty() {
        gaps.push(format!(
            "network_mode = {:?}: Swarm services join overlay networks only",
            container.network_mode
        ));
    }
    match DockerOptions::parse(&container.docker_options) {
        Ok(options) => {
            let unsupported = [
                (options.privileged, "--privileged"),
                (!options.devices.is_empty(), "--device"),
                (options.gpus.is_some(), "--gpus"),
                (options.pid.is_some(), "--pid"),
                (options.ipc.is_some(), "--ipc"),
                (!options.security_opt.is_empty(), "--security-opt"),
                (!options.tmpfs.is_empty(), "--tmpfs"),
                (options.shm_size.is_some(), "--shm-size"),
                (options.memory_swap.is_some(), "--memory-swap"),
                (options.memory_reservation.is_some(), "--memory-reservation"),
                (options.cpuset_cpus.is_some(), "--cpuset-cpus"),
                (options.cpu_shares.is_some(), "--cpu-shares"),
                (options.oom_kill_disable, "--oom-kill-disable"),
            ];
            for (used, flag) in unsupported {
                if used {
                    gaps.push(format!(
                        "docker_options {flag}: a Swarm service has no such setting"
                    ));
                }
            }
        }
        Err(problem) => gaps.push(format!("docker_options: {problem}")),
    }
    gaps
}

/// What of `spec` Docker Swarm cannot run, each with its reason: a resource with any is
/// refused under `--runtime swarm` (status `SwarmUnsupported`, `plan` shows `fail`) before
/// anything is touched, so its old version runs on.
pub fn swarm_gaps(spec: &Spec) -> Vec<String> {
    let mut gaps = spec.container().map(container_gaps).unwrap_or_default();
    let inits = match spec {
        Spec::Deployment(deployment) => deployment.inits.len(),
        Spec::Statefulset(statefulset) => statefulset.inits.len(),
        _ => 0,
    };
    if inits > 0 {
        gaps.push("init containers: a Swarm task runs one container; run the setup in the image's entrypoint, or as a job".to_owned());
    }
    if let Some(strategy) = spec.strategy() {
        gaps.push(format!("{} {{}} shifts traffic on the agent's own ingress by replica, where Swarm's routing mesh balances a service's tasks itself: remove the block (a Swarm service rolls out with update_config)", strategy.name()));
    }
    if spec.backup().is_some() {
        gaps.push("backup {} runs on the container engine only: it stops the pods or execs in them and reads their volumes on the agent's host, where a Swarm task may run on any node; remove the block, or back the data up with a cronjob".to_owned());
    }
    gaps
}

/// How `spec` runs differently under Swarm than on one host (it maps, with these notes);
/// empty when it runs the same.
pub fn swarm_notes(spec: &Spec) -> Vec<String> {
    let mut notes = Vec::new();
    match spec {
        Spec::Deployment(deployment) => {
            if deployment.probes.is_some() {
                notes.push("probes run as the service's health check, in the task (http_get needs wget, tcp_socket nc in the image); on_probe is not delivered".to_owned());
            }
            if deployment.release.is_some() {
                notes.push("release hooks run as replicated-job services, on whichever node Swarm picks (a named volume they write is that node's)".to_owned());
            }
            if deployment.autoscale.is_some() {
                notes.push(
                    "autoscale samples the CPU of the tasks on the agent's node only".to_owned(),
                );
            }
            if deployment
                .drain
                .as_ref()
                .is_some_and(|drain| !drain.timeout.is_empty())
            {
                notes.push("drain.timeout is not applied (Swarm stops a task after stop_grace_period = drain.grace)".to_owned());
            }
            if !deployment.ports.is_empty() {
                notes.push("ports are published in host mode on the node each task runs on, on every interface".to_owned());
            }
            if !matches!(deployment.effective_restart(), "always" | "unless-stopped") {
                notes.push(format!(
                    "restart = {:?}: Swarm restarts a replica's task whatever its exit",
                    deployment.effective_restart()
                ));
            }
        }
        Spec::Statefulset(statefulset) => {
            notes.push("each pod is pinned to the node it first ran on (its volumes are node-local): a pod whose node is lost stays down until the node is back".to_owned());
            if statefulset.probes.is_some() {
                notes.push("probes run as each pod's health check, in the task (http_get needs wget, tcp_socket nc in the image)".to_owned());
            }
        }
        Spec::Ingress(ingress) => {
            notes.push("served by the proxy service, Caddy on every node (host-mode ports), which balances over the deployment's running tasks (`tasks.<service>` on the overlay network)".to_owned());
            if ingress.tls.as_ref().is_some_and(|tls| tls.enabled) {
                notes.push(
                    "each node's Caddy gets its own certificates (its data is a node-local volume)"
                        .to_owned(),
                );
            }
        }
        _ => {}
    }
    if let Some(container) = spec.container() {
        let host_binds = container
            .volumes
            .iter()
            .filter(|volume| volume.starts_with('/'))
            .count();
        if host_binds > 0 {
            notes.push(format!("{host_binds} bind mount(s) of a host path mount that path on whichever node runs the task"));
        }
        let asset_path_used = container
            .command
            .iter()
            .flatten()
            .chain(container.env.values())
            .any(|text| text.contains("${asset."));
        if asset_path_used {
            notes.push("`${asset.…}` in command or env names a file on the agent's node only (asset files become Swarm configs only where a volume mounts them)".to_owned());
        }
        if container
            .extra_hosts
            .iter()
            .any(|host| host.ends_with(":host-gateway"))
        {
            notes.push("extra_hosts `host-gateway` has no Swarm form and is left out".to_owned());
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::runtime::{UpdateState, UpdateStatus};

    fn labels_of(hash: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::MANIFEST_HASH.to_owned(), hash.to_owned()),
            (labels::ENV_DIGEST.to_owned(), "env".to_owned()),
        ])
    }

    fn service(digest: &str, hash: &str, replicas: u64, update: Option<UpdateState>) -> Service {
        Service {
            id: "s".into(),
            name: "shop-web".into(),
            version: 1,
            labels: BTreeMap::from([(SERVICE_DIGEST.to_owned(), digest.to_owned())]),
            task_labels: labels_of(hash),
            image: "busybox".into(),
            replicas: Some(replicas),
            update: update.map(|state| UpdateStatus {
                state,
                message: String::new(),
                started_at: 0,
            }),
            constraints: Vec::new(),
        }
    }

    fn task(hash: &str, state: TaskState) -> Task {
        Task {
            id: "t".into(),
            service_id: "s".into(),
            slot: Some(1),
            node_id: "n".into(),
            desired: TaskState::Running,
            state,
            message: String::new(),
            error: String::new(),
            since: 0,
            labels: labels_of(hash),
            image: "busybox".into(),
            container_id: String::new(),
            exit_code: None,
        }
    }

    #[test]
    fn a_service_gets_one_step_or_none() {
        let target = ServiceTarget {
            digest: "d2",
            replicas: 2,
            spec_hash: "h2",
            env_digest: "env",
        };
        let running = [
            task("h2", TaskState::Running),
            task("h2", TaskState::Running),
        ];
        type Case = (&'static str, Option<Service>, Vec<Task>, Vec<ServiceStep>);
        let cases: Vec<Case> = vec![
            ("none yet", None, vec![], vec![ServiceStep::Create]),
            (
                "converged",
                Some(service("d2", "h2", 2, Some(UpdateState::Completed))),
                running.to_vec(),
                vec![],
            ),
            (
                "new spec",
                Some(service("d1", "h1", 2, None)),
                vec![task("h1", TaskState::Running)],
                vec![ServiceStep::Update],
            ),
            (
                "changed by hand: the template's labels differ",
                Some(service("d2", "h1", 2, None)),
                running.to_vec(),
                vec![ServiceStep::Update],
            ),
            (
                "replicas only",
                Some(service("d2", "h2", 3, None)),
                running.to_vec(),
                vec![ServiceStep::Scale { from: 3, to: 2 }],
            ),
            (
                "Swarm still updating",
                Some(service("d2", "h2", 2, Some(UpdateState::Updating))),
                running.to_vec(),
                vec![ServiceStep::Wait("Swarm is updating the service".into())],
            ),
            (
                "Swarm rolling back: no second update while it does",
                Some(service("d1", "h1", 2, Some(UpdateState::RollbackStarted))),
                running.to_vec(),
                vec![ServiceStep::Wait("Swarm is updating the service".into())],
            ),
            (
                "an old task still runs",
                Some(service("d2", "h2", 2, Some(UpdateState::Completed))),
                vec![
                    task("h2", TaskState::Running),
                    task("h1", TaskState::Running),
                ],
                vec![ServiceStep::Wait(
                    "1 task(s) of another version still run".into(),
                )],
            ),
            (
                "a task still starting",
                Some(service("d2", "h2", 2, None)),
                vec![
                    task("h2", TaskState::Running),
                    task("h2", TaskState::Starting),
                ],
                vec![ServiceStep::Wait("1 of 2 task(s) running".into())],
            ),
        ];
        for (what, service, tasks, expected) in cases {
            assert_eq!(
                plan_service(&target, service.as_ref(), &tasks),
                expected,
                "{what}"
            );
        }
    }

    /// A statefulset's `backup {}` is the container engine's: refused under Swarm, the
    /// same statefulset without it runs.
    #[test]
    fn a_backup_block_is_a_gap() {
        let statefulset = |json: serde_json::Value| {
            Spec::Statefulset(serde_json::from_value(json).expect("a statefulset spec"))
        };
        let claims = serde_json::json!([{"name": "data", "mount_path": "/data"}]);
        let plain = statefulset(serde_json::json!({"image": "postgres", "volume_claims": claims}));
        assert!(swarm_gaps(&plain).is_empty(), "{:?}", swarm_gaps(&plain));
        let backed_up = statefulset(serde_json::json!({
            "image": "postgres",
            "volume_claims": claims,
            "backup": {"repository": "/srv/b", "password_file": "/etc/p"},
        }));
        let gaps = swarm_gaps(&backed_up);
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert!(
            gaps[0].starts_with("backup {} runs on the container engine only"),
            "{gaps:?}"
        );
    }

    fn deployment(json: serde_json::Value) -> Spec {
        Spec::Deployment(serde_json::from_value(json).expect("a deployment spec"))
    }

    /// Release hooks run under Swarm (with a note); init containers are still refused.
    #[test]
    fn release_hooks_map_with_a_note_and_init_containers_are_a_gap() {
        let hooks = serde_json::json!({"pre_command": ["true"], "command": ["true"]});
        let with_hooks = deployment(serde_json::json!({"image": "busybox", "release": hooks}));
        assert!(
            swarm_gaps(&with_hooks).is_empty(),
            "{:?}",
            swarm_gaps(&with_hooks)
        );
        let notes = swarm_notes(&with_hooks);
        assert!(
            notes.iter().any(|note| note.starts_with(
                "release hooks run as replicated-job services, on whichever node Swarm picks"
            )),
            "{notes:?}"
        );
        let with_inits = deployment(serde_json::json!({
            "image": "busybox",
            "release": hooks,
            "inits": [{"name": "seed", "command": ["true"]}],
        }));
        let gaps = swarm_gaps(&with_inits);
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert!(gaps[0].starts_with("init containers: "), "{gaps:?}");
        let plain = deployment(serde_json::json!({"image": "busybox"}));
        assert!(swarm_gaps(&plain).is_empty());
        assert!(
            !swarm_notes(&plain)
                .iter()
                .any(|note| note.contains("release hooks")),
        );
    }
}
