//! Deployment handler: converge `<scope>-<name>.<rid>` containers on the desired replica
//! count (the autoscaler's, while `autoscale {}` is set), spec hash and environment, by
//! executing the health-gated steps of `plan::plan_replicas` through the runtime. A replica is
//! current when both its spec hash and its environment digest match, so a config bucket
//! change rolls the replicas the way a spec change does.
//!
//! Each pass is the one replicated pass (`replicated.rs`): observe (replicas, their readiness),
//! decide (`plan` then `gate`), act, observe again, record. A rollout therefore spans passes: a pass replaces one
//! slot and returns; the new replica's readiness (published by the probes) queues the next
//! pass, which replaces the next slot. A newer commit simply makes the next pass work towards
//! the newer spec (its release supersedes the one in flight).
//!
//! Invariants: replacements go one slot at a time and only once every current replica is
//! ready (`gate`); missing replicas (first deploy, scale-up) are created and started together,
//! each in one of the agent's create slots (`create_concurrency`, shared by every key); every
//! replica runs its init containers first; a rollout (a spec hash the latest release does not
//! have) opens a release keyed to the desired
//! commit, runs its `release` hooks once before touching replicas, and ends succeeded once
//! converged with every replica ready, or failed on its deadline, a crash-looping new replica
//! or a permanent error, and is then rolled back automatically (`rollout`); a crashed replica
//! is started again with a back-off (`gate::CrashLoops`), and status says so.

use std::collections::{BTreeMap, BTreeSet};

use futures_util::StreamExt as _;

use super::container::{Identity, Launch, aliases};
use super::hooks::HookSet;
use super::inits::{Inits, advance_inits, drop_inits, inits_in_flight};
use super::launch::{EnvSource, build_spec, create_and_start, identity_vars};
use super::replicas::{Observed, Waits, start_again};
use super::replicated::{self, Replicated, drain_and_remove};
use super::rollout::Report;
use crate::manifest::spec::container_port;
use crate::manifest::spec::rollout::Strategy;
use crate::manifest::spec::{Container as ContainerSpec, DeploymentSpec, Drain, Init};
use crate::model::{Kind, ResourceKey, random_hex};
use crate::reconcile::plan::gate;
use crate::reconcile::plan::{Step, Target, plan_canary, plan_replicas};
use crate::reconcile::{context::Ctx, error::Result, run::action::Action};
use crate::runtime::{Container, ContainerState, Runtime};
use crate::store::{DeploymentDetail, Desired, Detail, Release, ReplicaDetail, ResourceStatus};

/// One pass of a deployment on containers (`engine::deployment` chooses it).
pub(super) async fn reconcile<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<Action> {
    let Some(desired) = super::desired_or_remove(
        ctx,
        key,
        replicated::remove_everything(ctx, key, Vec::new()),
    )
    .await?
    else {
        return Ok(Action::Done);
    };
    let spec = spec_of!(key, desired, Deployment);
    super::refuse_unappliable(key, &desired.spec)?;
    replicated::pass(ctx, &desired, Deployment::new(&desired, spec)).await
}

/// A deployment in one pass: interchangeable replicas, one environment for all of them.
/// Under Swarm, `swarm::deployment` wraps it (environment, target, report, hooks).
pub(super) struct Deployment<'a> {
    pub(super) desired: &'a Desired,
    pub(super) spec: &'a DeploymentSpec,
    /// Set by `build`.
    pub(super) launch: Launch,
    /// The environment of the release hooks (no replica identity); set by `build`.
    hook_env: Vec<String>,
    /// Set by `set_release`.
    release_id: i64,
    /// What the release's images run as; set by `set_pins`, put in `launch` by `build`.
    pub(super) pins: Option<std::sync::Arc<crate::reconcile::handlers::pins::Pins>>,
}

impl<'a> Deployment<'a> {
    pub(super) fn new(desired: &'a Desired, spec: &'a DeploymentSpec) -> Deployment<'a> {
        Deployment {
            desired,
            spec,
            launch: Launch::default(),
            hook_env: Vec::new(),
            release_id: 0,
            pins: None,
        }
    }

    /// How long a replica of this deployment gets between SIGTERM and SIGKILL.
    fn grace(&self) -> std::time::Duration {
        Drain::grace_of(self.spec.drain.as_ref())
    }

    pub(super) fn target(&self) -> Target<'_> {
        Target {
            spec_hash: &self.desired.spec_hash,
            n_replicas: self.desired.n_replicas,
            env_digest: Some(&self.launch.env_digest),
            images: self
                .launch
                .pins
                .as_deref()
                .map(crate::reconcile::handlers::pins::Pins::label),
            surge: self.spec.surges(),
        }
    }
}

impl<R: Runtime> Replicated<R> for Deployment<'_> {
    type Step = Step;

    fn data_subject(&self) -> Option<(&crate::manifest::spec::Backup, super::data::Subject<'_>)> {
        let backup = self.spec.backup.as_ref()?;
        Some((
            backup,
            super::data::Subject::Shared {
                volume: &backup.volume,
            },
        ))
    }

    fn build(&mut self, ctx: &Ctx<R>, env_source: &EnvSource) -> Result<()> {
        let key = &self.desired.key;
        let container = &self.spec.container;
        let (env, env_digest) = env_source.env(ctx, key, container, identity_vars(key))?;
        self.hook_env = env_source.env(ctx, key, container, Vec::new())?.0;
        self.launch = Launch {
            env,
            env_digest,
            ports: self.spec.ports.clone(),
            restart: self.spec.effective_restart().to_owned(),
            default_ulimits: ctx.default_ulimits.clone(),
            probes: self.spec.probes.as_deref().cloned(),
            pins: self.pins.clone(),
            ..Launch::default()
        };
        Ok(())
    }

    fn set_release(&mut self, release: &Release) {
        self.release_id = release.id;
    }

    pins_in!(pins);

    fn report(&self) -> Report<'_> {
        let key = &self.desired.key;
        Report {
            key,
            on_deploy: self.spec.on_deploy.as_ref(),
            image: self.spec.container.effective_image(key),
        }
    }

    fn images(&self) -> (&ContainerSpec, &[Init]) {
        (&self.spec.container, &self.spec.inits)
    }

    fn is_current(&self, container: &Container) -> bool {
        self.target().is_current(container)
    }

    fn plan(&self, observed: &Observed) -> Vec<Step> {
        plan_replicas(Some(&self.target()), &observed.actual)
    }

    fn strategy(&self) -> Option<(&Strategy, u16)> {
        let strategy = self.spec.strategy.as_ref()?;
        let port = self
            .spec
            .ports
            .iter()
            .find_map(|port| container_port(port))
            .unwrap_or(80);
        Some((strategy, port))
    }

    fn canary_steps(&self, observed: &Observed, canary: usize) -> Vec<Step> {
        plan_canary(&self.target(), &observed.actual, canary)
    }

    fn touches(step: &Step) -> bool {
        matches!(step, Step::Create | Step::Replace { .. })
    }

    fn is_replace(step: &Step) -> bool {
        matches!(step, Step::Replace { .. } | Step::Retire { .. })
    }

    fn gate(&self, steps: Vec<Step>, observed: &Observed) -> Vec<Step> {
        gate::gate(
            steps,
            &observed.waiting,
            &observed.ready_names(),
            self.desired.n_replicas,
            self.spec.surges(),
        )
    }

    fn release_hooks(&self) -> Option<HookSet<'_>> {
        Some(HookSet {
            key: &self.desired.key,
            spec: self.spec,
            env: &self.hook_env,
            pins: self.pins.as_ref(),
        })
    }

    async fn execute(
        &self,
        ctx: &Ctx<R>,
        steps: &[Step],
        observed: &Observed,
        waits: &mut Waits,
    ) -> Result<()> {
        let taken: BTreeSet<String> = observed
            .actual
            .iter()
            .map(|container| container.name.clone())
            .collect();
        execute(ctx, self, steps, &observed.inits, taken, waits).await
    }

    async fn detail(
        &self,
        _ctx: &Ctx<R>,
        status: ResourceStatus,
        observed: &Observed,
    ) -> Result<ResourceStatus> {
        Ok(with_detail(status, observed, &self.target(), self.desired))
    }
}

/// `status` with the replica counts and readiness of `observed` (`running_replicas`: current
/// ones running) and, while autoscaled, the autoscaler's count.
fn with_detail(
    mut status: ResourceStatus,
    observed: &Observed,
    target: &Target<'_>,
    desired: &Desired,
) -> ResourceStatus {
    status.running_replicas = observed
        .actual
        .iter()
        .filter(|container| {
            target.is_current(container) && container.state == ContainerState::Running
        })
        .count();
    let replicas: Vec<ReplicaDetail> = observed
        .actual
        .iter()
        .map(|container| ReplicaDetail {
            name: container.name.clone(),
            current: target.is_current(container),
            state: format!("{:?}", container.state).to_lowercase(),
            ready: observed.is_ready(container),
            reason: observed.reason(container).to_owned(),
        })
        .collect();
    let ready = observed
        .actual
        .iter()
        .filter(|container| observed.is_ready(container))
        .count();
    status.detail = Detail::Deployment(DeploymentDetail {
        autoscaled_replicas: desired.replicas_override,
        ready_replicas: ready,
        replicas,
    });
    status
}

/// Runs the gated steps. Crashed replicas whose back-off is still running are skipped and
/// listed in `waits`, as are new replicas whose init containers run.
async fn execute<R: Runtime>(
    ctx: &Ctx<R>,
    work: &Deployment<'_>,
    steps: &[Step],
    inits: &[Container],
    mut taken: BTreeSet<String>,
    waits: &mut Waits,
) -> Result<()> {
    let key = &work.desired.key;
    let creates = steps
        .iter()
        .any(|step| matches!(step, Step::Create | Step::Replace { .. }));
    // Replicas whose init containers are in flight are the first this pass creates; those
    // no create takes up any more (scaled down meanwhile) go at the end.
    let mut in_flight = if creates || !work.spec.inits.is_empty() {
        let app = key.app_id();
        inits_in_flight(
            ctx,
            key,
            inits,
            work.desired.spec_hash.as_str(),
            |replica| taken.contains(&format!("{app}.{replica}")),
        )
        .await?
    } else {
        BTreeMap::new()
    };
    let n_creates = steps
        .iter()
        .filter(|step| matches!(step, Step::Create))
        .count();
    let mut creates_done = false;
    let mut slots = Slots {
        taken: &mut taken,
        in_flight: &mut in_flight,
        waits,
    };
    for step in steps {
        match step {
            // The plan lists creates together; they run as one batch at the first of them.
            Step::Create if creates_done => {}
            Step::Create => {
                creates_done = true;
                let names = create_replicas(ctx, work, n_creates, &mut slots).await?;
                if !names.is_empty() {
                    tracing::info!(%key, containers = ?names, "replicas created");
                }
            }
            Step::Start { id, name } => start_again(ctx, key, id, name, slots.waits).await?,
            Step::Replace { surge: true, .. } => {
                // Which outdated replica goes is decided when the successor is ready (the
                // `retired` line names it): the planned name is only the slot's place in the
                // roll, the same at every slot, so it is not logged as the old replica.
                if let Some(new_name) = create_replicas(ctx, work, 1, &mut slots).await?.pop() {
                    tracing::info!(%key, new = %new_name, "successor started (surge); an outdated replica is retired once it is ready");
                }
            }
            Step::Replace { id, name, .. } => {
                drain_and_remove(ctx, key, id, work.grace()).await?;
                let new_name = create_replicas(ctx, work, 1, &mut slots).await?.pop();
                tracing::info!(%key, old = %name, new = ?new_name, "replica replaced");
            }
            Step::Remove { id, name } => {
                drain_and_remove(ctx, key, id, work.grace()).await?;
                tracing::info!(%key, container = %name, "replica removed");
            }
            Step::Retire { id, name } => {
                drain_and_remove(ctx, key, id, work.grace()).await?;
                tracing::info!(%key, container = %name, "outdated replica retired (its successor is ready)");
            }
        }
    }
    for (replica, ids) in in_flight {
        drop_inits(ctx, key, &replica, &ids).await?;
    }
    Ok(())
}

/// What the creates of one pass draw on: the names taken, the replicas whose init containers
/// are in flight (taken up first), and what is left waiting.
struct Slots<'s> {
    taken: &'s mut BTreeSet<String>,
    in_flight: &'s mut BTreeMap<String, Vec<String>>,
    waits: &'s mut Waits,
}

/// Creates and starts `n` new replicas concurrently, each in one of the agent's create slots,
/// each once its init containers succeeded: a replica whose inits still run is listed in
/// `slots.waits` and created by a later pass (the inits' end queues it). Replicas whose inits
/// are in flight come first; the others get ids unique among the names taken, which grow by
/// the new ones. Their readiness is the gate's business. Returns the names created; on
/// failure, the first error after every create has ended (replicas that did start stay and
/// count next pass).
async fn create_replicas<R: Runtime>(
    ctx: &Ctx<R>,
    work: &Deployment<'_>,
    n: usize,
    slots: &mut Slots<'_>,
) -> Result<Vec<String>> {
    let key = &work.desired.key;
    let identity = |replica_id: String| Identity {
        name: format!("{}.{replica_id}", key.app_id()),
        kind: Kind::Deployment,
        role: Kind::Deployment.as_str().to_owned(),
        name_label: key.name.clone(),
        replica_id,
        ordinal: None,
        spec_hash: Some(work.desired.spec_hash.to_string()),
        release_id: Some(work.release_id.to_string()),
        aliases: aliases(key, None),
    };
    let mut identities = Vec::with_capacity(n);
    while identities.len() < n {
        let Some(replica_id) = slots.in_flight.keys().next().cloned() else {
            break;
        };
        slots.in_flight.remove(&replica_id);
        let pod = identity(replica_id);
        slots.taken.insert(pod.name.clone());
        identities.push(pod);
    }
    while identities.len() < n {
        let pod = identity(random_hex(2));
        if slots.taken.insert(pod.name.clone()) {
            identities.push(pod);
        }
    }
    // Collected first: a lazy `map` closure inside the stream makes the handler future's
    // lifetimes too general for `spawn`.
    let creates: Vec<_> = identities
        .iter()
        .map(|identity| create_replica(ctx, work, identity))
        .collect();
    let results: Vec<Result<Created>> = futures_util::stream::iter(creates)
        .buffer_unordered(ctx.options.create_concurrency.max(1))
        .collect()
        .await;
    let mut names = Vec::with_capacity(n);
    let mut first_error = None;
    for result in results {
        match result {
            Ok(Created::Started(name)) => names.push(name),
            Ok(Created::Waiting(what, wait)) => slots.waits.inits.push((what, wait)),
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    if let Some(error) = first_error {
        return Err(error);
    }
    Ok(names)
}

/// What one create came to.
enum Created {
    Started(String),
    /// Its init containers run (`Inits::Waiting`).
    Waiting(String, Option<std::time::Duration>),
}

/// Moves one replica's init containers on and, once they all succeeded, creates and starts
/// it; a container that cannot start is removed again.
async fn create_replica<R: Runtime>(
    ctx: &Ctx<R>,
    work: &Deployment<'_>,
    identity: &Identity,
) -> Result<Created> {
    let key = &work.desired.key;
    let inits = &work.spec.inits;
    if let Inits::Waiting(what, wait) = advance_inits(
        ctx,
        key,
        identity,
        &work.spec.container,
        &work.launch,
        inits,
    )
    .await?
    {
        return Ok(Created::Waiting(what, wait));
    }
    let container = build_spec(ctx, key, identity, &work.spec.container, &work.launch)?;
    create_and_start(ctx, key, &container).await?;
    Ok(Created::Started(container.name))
}
