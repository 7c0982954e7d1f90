//! One replicated pass, written once for the replicated kinds (deployment, statefulset) on
//! both engines (containers, and Docker Swarm's services in `handlers/swarm`): observe →
//! release → plan → gate → act → record. What differs between the kinds — their
//! environment, target and plan, their gate, how a replica is created, replaced or removed,
//! the status detail, the release hooks, and on Swarm what a replica is (a task) and when
//! Swarm itself gave up — is the `Replicated` trait each kind implements.
//!
//! A pass works under the release `rollout::current_release` gives it, builds the kind's
//! environment (an environment that cannot be built is an error of the pass, bug 1 of issue
//! 11), prepares a rollout before its first replica is touched (image, release hooks), gives
//! up on a rollout past its deadline or with a crash-looping new replica, acts on the gated
//! steps, observes again and records. Every decision about the release is the rollout state
//! machine's (`rollout_state::next`), fed the error's class from `retry::class`; no pass
//! inspects an error itself. It returns an `Action`: `RequeueAfter` while a rollout waits or a
//! back-off runs, `AwaitChange` while halted or after a rollout failed before touching
//! replicas, `Done` otherwise; errors go to the error policy.

use std::sync::Arc;
use std::time::Duration;

use super::data;
use super::hooks::{self, HookSet};
use super::launch::{EnvSource, images_of, ready_to_create};
use super::progressive::{self, Move};
use super::replicas::{
    Observed, Waits, fail_rollout, inspect_waiting, not_done, observe, put_status, rollout_failure,
};
use super::rollout::{self, Report};
use crate::manifest::spec::rollout::Strategy;
use crate::manifest::spec::{Backup, Container as ContainerSpec, Drain, Init, Spec};
use crate::model::ResourceKey;
use crate::reconcile::handlers::pins::{self, Pins};
use crate::reconcile::handlers::rollout_state::{self, Effect, RolloutPhase, Seen, Stage};
use crate::reconcile::plan::depends;
use crate::reconcile::plan::gate::NewReplica;
use crate::reconcile::run::retry;
use crate::reconcile::{
    context::Ctx, context::blocking, error::Error, error::Result, run::action::Action,
};
use crate::runtime::{Container, Runtime};
use crate::store::{Desired, FailureReason, Phase, Release, ReleasePhase, ResourceStatus};

/// How soon a resource waiting for its dependencies looks again by itself (a dependency's
/// `Ready` queues it at once: this covers what the agent forgot in a restart).
const DEPENDENCY_RECHECK: Duration = Duration::from_secs(10);
/// While a canary's replicas come up, the pass looks again this soon by itself (their
/// readiness queues it sooner).
const CANARY_RECHECK: Duration = Duration::from_secs(5);

/// What a replicated kind brings to the pass.
pub(super) trait Replicated<R: Runtime>: Send + Sync {
    /// One step of the kind's plan.
    type Step: Send + Sync;

    /// Builds the environment of every replica from `env_source`; nothing below is called
    /// before it succeeded.
    fn build(&mut self, ctx: &Ctx<R>, env_source: &EnvSource) -> Result<()>;
    /// The release new replicas are labelled with.
    fn set_release(&mut self, release: &Release);
    /// What the release's images run as (`reconcile::handlers::pins`): new replicas are created from
    /// it, and a replica of another resolution is outdated. Called before `build`, which
    /// builds the replicas with it.
    fn set_pins(&mut self, pins: Option<Arc<Pins>>);
    /// What `set_pins` gave.
    fn pins(&self) -> Option<&Pins>;
    /// What the end of a release reports.
    fn report(&self) -> Report<'_>;
    /// The main container and inits, whose images a rollout needs.
    fn images(&self) -> (&ContainerSpec, &[Init]);
    /// Whether a replica is of the target version.
    fn is_current(&self, container: &Container) -> bool;
    /// The replicas and their readiness: the key's containers and the readiness the probe
    /// runners published (the Swarm kinds observe tasks).
    fn observe(
        &self,
        ctx: &Ctx<R>,
        key: &ResourceKey,
    ) -> impl Future<Output = Result<Observed>> + Send {
        observe(ctx, key, |container| self.is_current(container))
    }
    /// Before the first replica of a rollout is touched: the networks exist and the images
    /// are present (pulled when missing).
    fn prepare(&self, ctx: &Ctx<R>, key: &ResourceKey) -> impl Future<Output = Result<()>> + Send {
        async move {
            let (container, inits) = self.images();
            let mut images = images_of(key, container, inits, &ctx.assets_root);
            // The release's bytes: a digest the host lost is pulled by its digest.
            if let Some(pins) = self.pins() {
                for image in &mut images {
                    *image = pins.pin(image).to_owned();
                }
            }
            ready_to_create(ctx, key, container, &images).await
        }
    }
    /// The steps from what `observed` saw to the target.
    fn plan(&self, observed: &Observed) -> Vec<Self::Step>;
    /// The new replicas still waiting, with their restarts (crash-loop detection).
    fn new_replicas(
        &self,
        ctx: &Ctx<R>,
        observed: &Observed,
        release: &Release,
    ) -> impl Future<Output = Vec<NewReplica>> + Send {
        inspect_waiting(ctx, observed, release)
    }
    /// When to look again while the engine converges on its own (Swarm starting or
    /// replacing tasks, or a node lost: no event tells the agent), besides the rollout
    /// re-check and back-offs.
    fn look_again(&self, _observed: &Observed) -> Option<Duration> {
        None
    }
    /// Why the engine itself gave up on the rollout of `release`, if it did (Swarm rolled
    /// its update back): the release fails with this reason, as on its deadline.
    fn gave_up(&self, _observed: &Observed, _release: &Release) -> Option<(FailureReason, String)> {
        None
    }
    /// Whether a step creates or replaces a replica (a rollout's image must be there first).
    /// The kind's progressive strategy (`canary {}`, `blue_green {}`) and the port its
    /// replicas serve on; `None`: rolls out the ordinary way.
    fn strategy(&self) -> Option<(&Strategy, u16)> {
        None
    }
    /// Steps that bring the current version to `canary` replicas beside the outdated ones,
    /// leaving those as they are (`plan::plan_canary`); only asked when `strategy` is `Some`.
    fn canary_steps(&self, _observed: &Observed, _canary: usize) -> Vec<Self::Step> {
        Vec::new()
    }
    fn touches(step: &Self::Step) -> bool;
    /// Whether a step replaces a replica (never while halted).
    fn is_replace(step: &Self::Step) -> bool;
    /// The steps the health gate lets through now.
    fn gate(&self, steps: Vec<Self::Step>, observed: &Observed) -> Vec<Self::Step>;
    /// The release hooks run before the first replica of a rollout is touched (after the
    /// images are there) and once it converged (`hooks.rs`). None by default (statefulsets
    /// have no hooks in voodu).
    fn release_hooks(&self) -> Option<HookSet<'_>> {
        None
    }
    /// What the kind's `backup {}` reads (`data/`: a statefulset's claims by ordinal, a
    /// deployment's named volume): its data runs are asked before a rollout's first
    /// replacement, and a run in flight holds the pass. None by default.
    fn data_subject(&self) -> Option<(&Backup, data::Subject<'_>)> {
        None
    }
    /// Runs the gated steps; a crashed replica whose back-off still runs is listed in
    /// `waits`.
    fn execute(
        &self,
        ctx: &Ctx<R>,
        steps: &[Self::Step],
        observed: &Observed,
        waits: &mut Waits,
    ) -> impl Future<Output = Result<()>> + Send;
    /// `status` with the replica counts and the kind's `detail`.
    fn detail(
        &self,
        ctx: &Ctx<R>,
        status: ResourceStatus,
        observed: &Observed,
    ) -> impl Future<Output = Result<ResourceStatus>> + Send;
}

/// One pass of a replicated resource towards `desired`, in its stages: the release and what
/// it runs (`prepare`), a failed release's retry, the rollout's preparation before its first
/// replica (`before_first_replica`), a failing rollout's rollback, the gated steps, and what
/// the pass records (`settle`). A stage returning `Some(action)` ends the pass.
pub(super) async fn pass<R: Runtime, K: Replicated<R>>(
    ctx: &Ctx<R>,
    desired: &Desired,
    kind: K,
) -> Result<Action> {
    let key = &desired.key;
    let release = rollout::current_release(ctx, desired).await?;
    let halted = rollout::halted(ctx, &release, desired).await?;
    let status = ResourceStatus {
        desired_replicas: desired.n_replicas,
        spec_hash: desired.spec_hash.to_string(),
        release_id: Some(release.id),
        ..ResourceStatus::new(Phase::Progressing, "")
    };
    let phase = RolloutPhase::of(&release, halted);
    let mut pass = Pass {
        ctx,
        kind,
        release,
        phase,
        status,
    };
    let env_source = match pass.prepare(key).await? {
        Ok(env_source) => env_source,
        Err(action) => return Ok(action),
    };
    let observed = pass.kind.observe(ctx, key).await?;
    let steps = pass.kind.plan(&observed);
    let touches_replicas = steps.iter().any(K::touches);
    if pass.phase == RolloutPhase::Failed
        && touches_replicas
        && let Some(action) = pass
            .retry_failed(desired, key, &env_source, &observed)
            .await?
    {
        return Ok(action);
    }
    pass.kind.set_release(&pass.release);
    pass.phase = RolloutPhase::of(&pass.release, halted);
    // A hook of an older release still running was superseded by this one.
    hooks::supersede(ctx, pass.kind.release_hooks(), &pass.release).await?;
    // A backup or restore in flight holds everything else; a release with `before_release`
    // waits for its backup here, before its hooks and its first replacement.
    // Only a rollout that replaces a pod changes what its data is read by; creating a
    // missing one (a first deploy, a scale-up) does not.
    let rolling_out = pass.phase == RolloutPhase::Progressing && steps.iter().any(K::is_replace);
    let gate = match pass.kind.data_subject() {
        Some(subject) => {
            data::gate(ctx, key, subject, &pass.release, rolling_out, &observed).await?
        }
        None => data::Gate::Open,
    };
    if let data::Gate::Hold {
        action,
        message,
        failed,
    } = gate
    {
        pass.status.message = if message.is_empty() {
            "a data run (backup or restore) is in progress".to_owned()
        } else {
            message
        };
        if failed {
            pass.status.phase = Phase::Failed;
            pass.status.reason = Some(FailureReason::BackupFailed);
        }
        let status = pass
            .kind
            .detail(ctx, pass.status.clone(), &observed)
            .await?;
        put_status(ctx, key, status).await?;
        return Ok(action);
    }
    // Start-up order: a first replica, or a rollout's first, waits until what the resource
    // depends on is ready (`plan::depends`), before its images and release hooks.
    let starting = depends::starting(
        touches_replicas,
        steps.iter().any(K::is_replace),
        !observed.actual.is_empty(),
        observed
            .actual
            .iter()
            .any(|container| pass.kind.is_current(container)),
    );
    if starting && let Some(action) = pass.wait_for_dependencies(desired, &observed).await? {
        return Ok(action);
    }
    if pass.phase == RolloutPhase::Progressing
        && touches_replicas
        && let Some(action) = pass.before_first_replica(key, &observed).await?
    {
        return Ok(action);
    }
    // A progressive rollout (`canary {}`, `blue_green {}`) brings the new release's replicas
    // up beside the old ones, holds for its pauses, analyses and switches, or aborts; once it
    // hands over, the ordinary rollout goes on.
    let canary = match pass.kind.strategy() {
        Some((strategy, port)) if pass.phase == RolloutPhase::Progressing => {
            let kind = &pass.kind;
            let subject = progressive::Subject {
                key,
                release: &pass.release,
                n_replicas: desired.n_replicas,
                port,
            };
            let is_current = |container: &Container| kind.is_current(container);
            let drive = progressive::drive(ctx, &subject, strategy, &observed, &is_current);
            drive.await?
        }
        _ => Move::Off,
    };
    let steps = match &canary {
        Move::Off => steps,
        Move::Scale { canary, .. } => pass.kind.canary_steps(&observed, *canary),
        Move::Hold { .. } => Vec::new(),
        Move::Abort { reason } => return pass.abort_canary(key, &observed, reason).await,
    };
    let new_replicas = pass.kind.new_replicas(ctx, &observed, &pass.release).await;
    if let Some(action) = pass
        .roll_back_if_failing(&steps, &observed, &new_replicas)
        .await?
    {
        return Ok(action);
    }

    // Act on what the health gate lets through (a canary's own steps only add or remove its
    // replicas beside the stable ones); a halted resource is repaired (removals, starts,
    // creates) but never rolled.
    let mut now_steps = match canary {
        Move::Off => pass.kind.gate(steps, &observed),
        _ => steps,
    };
    if pass.phase == RolloutPhase::Halted {
        now_steps.retain(|step| !K::is_replace(step));
    }
    let mut waits = Waits::default();
    let result = pass
        .kind
        .execute(ctx, &now_steps, &observed, &mut waits)
        .await;
    // A pass that acted looks again; one that did nothing records what it saw (a change of
    // the host since then is an event or a readiness change, each of which queues a pass).
    let observed = if now_steps.is_empty() {
        observed
    } else {
        pass.kind.observe(ctx, key).await?
    };
    // Readiness is the probe runners' (`reconcile::observers::probes`); routes may have changed.
    ctx.router.wake();
    if let Err(error) = result {
        if pass.phase == RolloutPhase::Progressing {
            ctx.memory
                .rollouts
                .note_error(pass.release.id, error.to_string());
        }
        return pass
            .fail_with_detail(&observed, error, Stage::Replicas)
            .await;
    }
    let mut action = match canary {
        Move::Scale { message, .. } => {
            pass.status.message = message;
            Action::RequeueAfter(CANARY_RECHECK)
        }
        Move::Hold { action, message } => {
            pass.status.message = message;
            action
        }
        _ => pass.settle(&observed, &new_replicas, &waits).await?,
    };
    // A replica whose liveness failed is replaced once its back-off ends: look again then
    // (the probe runner asked for this pass only; this answer is the key's next pass).
    if let Some(wait) = ctx.memory.liveness_failed.wait(
        observed
            .actual
            .iter()
            .map(|container| container.id.as_str()),
        tokio::time::Instant::now(),
    ) {
        action = action.sooner(Action::RequeueAfter(wait));
    }
    let status = pass.kind.detail(ctx, pass.status, &observed).await?;
    put_status(ctx, key, status).await?;
    Ok(action)
}

/// One pass in flight: the kind, the release it works under, where that release stands, and
/// the status it will record.
struct Pass<'a, R: Runtime, K> {
    ctx: &'a Ctx<R>,
    kind: K,
    release: Release,
    phase: RolloutPhase,
    status: ResourceStatus,
}

impl<R: Runtime, K: Replicated<R>> Pass<'_, R, K> {
    /// The pass ends on `error` (the error policy and the state machine decide what follows).
    async fn fail(&self, status: ResourceStatus, error: Error, stage: Stage) -> Result<Action> {
        on_error(
            self.ctx,
            &self.kind,
            &self.release,
            self.phase,
            status,
            error,
            stage,
        )
        .await
    }

    /// `fail`, with the kind's status detail of what the pass observed.
    async fn fail_with_detail(
        &self,
        observed: &Observed,
        error: Error,
        stage: Stage,
    ) -> Result<Action> {
        let status = self
            .kind
            .detail(self.ctx, self.status.clone(), observed)
            .await?;
        self.fail(status, error, stage).await
    }

    /// What the release's images run as, resolved once when it starts (every replica is built
    /// from it, and one of another resolution of this spec is outdated), and the kind's
    /// environment built: the environment sources, or the action ending the pass.
    async fn prepare(
        &mut self,
        key: &ResourceKey,
    ) -> Result<std::result::Result<EnvSource, Action>> {
        if let Err(error) = pin(self.ctx, &mut self.kind, key, &self.release).await {
            let status = self.status.clone();
            return self.fail(status, error, Stage::Prepare).await.map(Err);
        }
        let env_source = EnvSource::load(self.ctx, key, self.kind.images().0).await?;
        if let Err(error) = self.kind.build(self.ctx, &env_source) {
            // Bug 1: an environment that cannot be built fails the pass (and the rollout in
            // flight) as any error does, instead of leaving the resource `Ready`.
            if self.phase != RolloutPhase::Progressing {
                self.status.phase = Phase::Degraded;
            }
            let status = self.status.clone();
            return self.fail(status, error, Stage::Prepare).await.map(Err);
        }
        Ok(Ok(env_source))
    }

    /// A release that failed before touching replicas (its image): another attempt once the
    /// image can be had; until then the old replicas run on and nothing new is recorded.
    async fn retry_failed(
        &mut self,
        desired: &Desired,
        key: &ResourceKey,
        env_source: &EnvSource,
        observed: &Observed,
    ) -> Result<Option<Action>> {
        let (container, inits) = self.kind.images();
        match rollout::retry_failed(self.ctx, &self.release, desired, container, inits).await {
            Ok(retry) => {
                self.release = retry;
                self.status.release_id = Some(self.release.id);
                // The attempt's own resolution, and the replicas built from it.
                let pinned = match pin(self.ctx, &mut self.kind, key, &self.release).await {
                    Ok(()) => self.kind.build(self.ctx, env_source),
                    Err(error) => Err(error),
                };
                match pinned {
                    Ok(()) => Ok(None),
                    Err(error) => {
                        let status = self.status.clone();
                        self.fail(status, error, Stage::Prepare).await.map(Some)
                    }
                }
            }
            Err(error) => {
                self.status.phase = Phase::Failed;
                self.status.reason = Some(error.reason());
                self.fail_with_detail(observed, error, Stage::Prepare)
                    .await
                    .map(Some)
            }
        }
    }

    /// A start (`plan::depends::starting`) of a resource whose dependencies are not all
    /// ready: status says what it waits for, the dependencies' `Ready` queues it
    /// (`wake::Dependents`), and it looks again after `DEPENDENCY_RECHECK` regardless.
    async fn wait_for_dependencies(
        &mut self,
        desired: &Desired,
        observed: &Observed,
    ) -> Result<Option<Action>> {
        let key = &desired.key;
        let dependencies = desired
            .spec
            .container()
            .and_then(|container| container.depends_on.as_ref())
            .map(|depends_on| depends_on.resource_keys(&key.scope))
            .unwrap_or_default();
        if dependencies.is_empty() {
            return Ok(None);
        }
        let states = blocking(&self.ctx.store, move |store| {
            dependencies
                .into_iter()
                .map(|dependency| {
                    let desired = store.desired(&dependency)?;
                    let status = store.status(&dependency)?;
                    let state = depends::DependencyState::of(
                        desired.as_ref().map(|desired| desired.spec_hash.as_str()),
                        status
                            .as_ref()
                            .map(|status| (status.phase, status.spec_hash.as_str())),
                    );
                    Ok((dependency, state))
                })
                .collect::<crate::store::Result<Vec<_>>>()
        })
        .await?;
        let Some(wait) = depends::wait(true, &states) else {
            return Ok(None);
        };
        self.ctx.memory.dependents.wait(key, &wait.on);
        tracing::debug!(%key, waiting = %wait.message, "start-up order: not starting yet");
        self.status.message = wait.message;
        let status = self
            .kind
            .detail(self.ctx, self.status.clone(), observed)
            .await?;
        put_status(self.ctx, key, status).await?;
        Ok(Some(Action::RequeueAfter(DEPENDENCY_RECHECK)))
    }

    /// Before the first replica of a rollout is touched: the image, then the release hooks
    /// (started here; a pass never waits for one: its end queues the next pass).
    async fn before_first_replica(
        &mut self,
        key: &ResourceKey,
        observed: &Observed,
    ) -> Result<Option<Action>> {
        let (ctx, release) = (self.ctx, &self.release);
        let prepared = match self.kind.prepare(ctx, key).await {
            Ok(()) => match hooks::before_rollout(ctx, self.kind.release_hooks(), release).await {
                Ok(hooks::Before::Done) => Ok(()),
                Ok(hooks::Before::Running(stage)) => {
                    self.status.message = format!(
                        "release #{}: running its {} hook; replicas are replaced once it succeeded",
                        release.id,
                        stage.name()
                    );
                    let status = self.kind.detail(ctx, self.status.clone(), observed).await?;
                    put_status(ctx, key, status).await?;
                    return Ok(Some(Action::Done));
                }
                Ok(hooks::Before::Failed(failed)) => Err((failed, Stage::Hooks)),
                Err(error) => Err((error, Stage::Prepare)),
            },
            Err(error) => Err((error, Stage::Prepare)),
        };
        match prepared {
            Ok(()) => Ok(None),
            Err((error, stage)) => self
                .fail_with_detail(observed, error, stage)
                .await
                .map(Some),
        }
    }

    /// An aborted progressive rollout: the new release's replicas go (the hosts route to the
    /// old ones), then the release fails and the automatic rollback and pin rules apply.
    async fn abort_canary(
        &mut self,
        key: &ResourceKey,
        observed: &Observed,
        reason: &str,
    ) -> Result<Action> {
        let steps = self.kind.canary_steps(observed, 0);
        let mut waits = Waits::default();
        let removed = self
            .kind
            .execute(self.ctx, &steps, observed, &mut waits)
            .await;
        self.ctx.router.wake();
        if let Err(error) = removed {
            return self
                .fail_with_detail(observed, error, Stage::Replicas)
                .await;
        }
        let observed = self.kind.observe(self.ctx, key).await?;
        let status = self
            .kind
            .detail(self.ctx, self.status.clone(), &observed)
            .await?;
        fail_rollout(
            self.ctx,
            &self.release,
            (FailureReason::RolloutAborted, reason),
            &self.kind.report(),
            status,
        )
        .await?;
        Ok(Action::Done)
    }

    /// A rollout that ran out of time, or whose new replica keeps crashing, is rolled back.
    async fn roll_back_if_failing(
        &self,
        steps: &[K::Step],
        observed: &Observed,
        new_replicas: &[NewReplica],
    ) -> Result<Option<Action>> {
        let release = &self.release;
        let failure = match release.phase {
            ReleasePhase::Progressing => self.kind.gave_up(observed, release),
            _ => None,
        }
        .or_else(|| rollout_failure(self.ctx, release, steps.is_empty(), observed, new_replicas));
        let seen = Seen {
            gave_up: failure.is_some(),
            ..Seen::default()
        };
        let (_, Effect::FailAndRollBack) = rollout_state::next(self.phase, seen) else {
            return Ok(None);
        };
        let (failure, reason) = failure.unwrap_or((FailureReason::RolloutDeadline, String::new()));
        let status = self
            .kind
            .detail(self.ctx, self.status.clone(), observed)
            .await?;
        fail_rollout(
            self.ctx,
            release,
            (failure, &reason),
            &self.kind.report(),
            status,
        )
        .await?;
        // Rolled back: the rollback's journal row queues the next pass. Superseded: so did
        // the newer commit's.
        Ok(Some(Action::Done))
    }

    /// After the steps ran: where the release stands now (succeeded, ready, still rolling,
    /// halted), its post hook, the status message, and when to look again.
    async fn settle(
        &mut self,
        observed: &Observed,
        new_replicas: &[NewReplica],
        waits: &Waits,
    ) -> Result<Action> {
        let (ctx, release, status) = (self.ctx, &self.release, &mut self.status);
        let seen = Seen {
            converged: self.kind.plan(observed).is_empty(),
            all_ready: observed.waiting.is_empty(),
            ..Seen::default()
        };
        let effect = rollout_state::next(self.phase, seen).1;
        if !matches!(effect, Effect::Succeed | Effect::Ready) {
            let recheck = not_done(
                status,
                observed,
                new_replicas,
                waits,
                effect == Effect::KeepWaiting,
            )
            .into_iter()
            .chain(self.kind.look_again(observed))
            .min();
            if effect != Effect::StayHalted {
                return Ok(recheck.map_or(Action::Done, Action::RequeueAfter));
            }
            // Halted until desired state changes: repaired (removals, starts, creates), never
            // rolled, and status says why.
            status.phase = Phase::Failed;
            status.reason = Some(FailureReason::Halted);
            status.message.clone_from(&release.message);
            return Ok(recheck.map_or(Action::AwaitChange, Action::RequeueAfter));
        }
        status.phase = Phase::Ready;
        if release.rolled_back_from.is_some() {
            // Running a rollback (automatic or the operator's): status keeps saying why.
            status.message.clone_from(&release.message);
        }
        if effect == Effect::Succeed {
            match hooks::after_rollout(ctx, self.kind.release_hooks(), release).await? {
                hooks::After::Done(note) => {
                    rollout::succeed(ctx, release, &self.kind.report(), &note).await?;
                }
                // The release succeeds once it ended (its end queues the next pass).
                hooks::After::Running => {
                    status.message = format!(
                        "release #{}: rolled out; running its post_command hook",
                        release.id
                    );
                }
            }
        }
        // An engine that converges on its own (Swarm) is looked at again.
        Ok(self
            .kind
            .look_again(observed)
            .map_or(Action::Done, Action::RequeueAfter))
    }
}

/// Gives `kind` the pins of `release`: recorded, or resolved now for a release in progress
/// (a release that ended unresolved, or a legacy one, runs its tags).
async fn pin<R: Runtime, K: Replicated<R>>(
    ctx: &Ctx<R>,
    kind: &mut K,
    key: &ResourceKey,
    release: &Release,
) -> Result<()> {
    let pins = if release.phase == ReleasePhase::Progressing || release.images.is_some() {
        let (container, inits) = kind.images();
        let images = images_of(key, container, inits, &ctx.assets_root);
        pins::of_release(ctx, key, release, &images).await?
    } else {
        None
    };
    kind.set_pins(pins);
    Ok(())
}

/// An error of the pass at `stage`, as the rollout state machine decides: the rollout in
/// flight fails (before touching replicas, or rolled back), or `status` (its phase set by the
/// caller) is written and the error goes to the error policy.
async fn on_error<R: Runtime, K: Replicated<R>>(
    ctx: &Ctx<R>,
    kind: &K,
    release: &Release,
    phase: RolloutPhase,
    mut status: ResourceStatus,
    error: Error,
    stage: Stage,
) -> Result<Action> {
    let seen = Seen {
        error: Some((retry::class(&error), stage)),
        ..Seen::default()
    };
    let report = kind.report();
    status.message = error.to_string();
    match rollout_state::next(phase, seen).1 {
        effect @ (Effect::FailBeforeRollout | Effect::FailAndHalt) => {
            let halt = effect == Effect::FailAndHalt;
            rollout::fail_before_rollout(ctx, release, &status.message, &report, halt).await?;
            status.phase = Phase::Failed;
            status.reason = Some(error.reason());
            put_status(ctx, report.key, status).await?;
            Ok(Action::AwaitChange)
        }
        Effect::FailAndRollBack => {
            let reason = status.message.clone();
            fail_rollout(ctx, release, (error.reason(), &reason), &report, status).await?;
            Ok(Action::Done)
        }
        _ => {
            put_status(ctx, report.key, status).await?;
            Err(error)
        }
    }
}

/// Stops a replica with its resource's drain grace (SIGTERM, SIGKILL once `grace` has
/// passed: voodu 2026's `drain.grace`), then removes it. A stop the engine refuses is cut
/// short and logged, and the removal goes on: a drain never wedges a roll. Its stop and
/// destroy events are the agent's own doing, not drift (`wake::OwnRemovals`).
pub(super) async fn drain_and_remove<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    id: &str,
    grace: Duration,
) -> Result<()> {
    ctx.memory.own_removals.note(id);
    let unrouted = unroute(ctx, key, id).await;
    let stopped = ctx.runtime.stop(id, grace).await;
    if let Err(error) = stopped {
        tracing::warn!(%key, container = id, %error, "could not stop the replica gracefully; removing it now (forced cut)");
    }
    let removed = ctx.runtime.remove(id).await;
    if unrouted {
        ctx.memory.draining.remove(id);
    }
    removed.map_err(|source| Error::Runtime {
        key: key.clone(),
        source,
    })
}

/// The longest a drain waits for the router to leave the replica out of its routes (one
/// router pass and proxy load; a stalled proxy never holds a removal longer).
const UNROUTE_WAIT: Duration = Duration::from_secs(2);

/// Leaves replica `id` of `key` out of the ingress routes before it stops, when it is an
/// upstream (a ready replica with an address, the Docker ingress on): its stop then never
/// meets a request the proxy already sent it, nor a proxy reload cutting the retry of one.
/// Waits for the router pass that follows (its report), at most `UNROUTE_WAIT`. Whether it
/// was left out (the caller forgets it once removed).
async fn unroute<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey, id: &str) -> bool {
    if ctx.options.ingress.is_none() || ctx.options.engine != crate::reconcile::Engine::Docker {
        return false;
    }
    let owner = key.clone();
    let container = id.to_owned();
    let routed = blocking(&ctx.store, move |store| {
        Ok(store
            .readiness(&owner)?
            .into_iter()
            .any(|row| row.container_id == container && row.ready && !row.address.is_empty()))
    })
    .await
    .unwrap_or(false);
    if !routed {
        return false;
    }
    ctx.memory.draining.insert(id);
    let mut reports = ctx.router.subscribe_report();
    let generation = ctx.router.wake_generation();
    let served = async {
        loop {
            if reports.borrow_and_update().served_wake >= generation {
                return;
            }
            if reports.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = served => {}
        () = ctx.timer.sleep(crate::reconcile::run::timer::What::Router, UNROUTE_WAIT) => {
            tracing::debug!(%key, container = id, "the router did not confirm leaving the replica out in time; stopping it anyway");
        }
    }
    true
}

/// The drain grace of a resource that left the repo: its last release's, else Docker's.
async fn last_grace<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Duration {
    let owner = key.clone();
    let snapshot = blocking(&ctx.store, move |store| store.latest_release(&owner))
        .await
        .ok()
        .flatten();
    let drain = snapshot.and_then(
        |release| match Spec::from_json(key.kind, &release.snapshot) {
            Ok(Spec::Deployment(spec)) => spec.drain,
            Ok(Spec::Statefulset(spec)) => spec.drain,
            _ => None,
        },
    );
    Drain::grace_of(drain.as_ref())
}

/// The resource left the repo: its containers go — `first` (the kind's own order: a
/// statefulset's pods from the highest ordinal down) before the rest of the key's containers
/// and its release containers — then their readiness rows and its status.
pub(super) async fn remove_everything<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    first: Vec<(String, String)>,
) -> Result<()> {
    let mut owned = first;
    let mut listed: Vec<(String, String)> =
        super::replicas::list_of(ctx, key, &super::replicas::owned_filter(&ctx.agent_id, key))
            .await?
            .into_iter()
            .map(|container| (container.id, container.name))
            .collect();
    listed.extend(super::oneshot::release_units(ctx, key).await?);
    for (id, name) in listed {
        if !owned.iter().any(|(owned_id, _)| *owned_id == id) {
            owned.push((id, name));
        }
    }
    let grace = last_grace(ctx, key).await;
    for (id, name) in &owned {
        tracing::info!(%key, container = %name, "removing: resource left the repo");
        drain_and_remove(ctx, key, id, grace).await?;
    }
    let key = key.clone();
    let names: Vec<String> = owned.into_iter().map(|(_, name)| name).collect();
    blocking(&ctx.store, move |store| {
        store.forget_readiness(&names)?;
        // Its backups and restores end with it (their snapshots stay in the repository).
        store.supersede_data_runs(&key, "the resource left the repo")?;
        store.delete_status(&key)
    })
    .await?;
    ctx.router.wake();
    Ok(())
}
