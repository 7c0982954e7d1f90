//! A replica's init containers (spec §7.6), moved on by each pass of its resource: the
//! first that has not succeeded is started, watched while it runs, or tried again after
//! voodu's pause. Each attempt is a one-shot unit (`oneshot.rs`) that no pass waits for: its
//! end queues the next pass.
//!
//! Invariants: init containers run in declaration order, per replica, before its main
//! container; an attempt that exits non-zero is left in place for inspection (as voodu
//! does) and replaced by the next attempt; one that times out is removed; units of a
//! superseded spec, or of a replica no longer wanted, are removed.

use std::collections::BTreeMap;
use std::time::Duration;

use super::container::{INIT_ROLE, Identity, Launch};
use super::oneshot::{self, Exit, OneShot, Stand};
use crate::manifest::spec::{Container, Init};
use crate::model::{ResourceKey, parse_go_duration};
use crate::reconcile::{context::Ctx, error::Error, error::Result};
use crate::runtime::{Runtime, labels};

/// voodu's per-attempt init timeout when none is given.
const DEFAULT_INIT_TIMEOUT: Duration = Duration::from_secs(600);
/// voodu's pause between init attempts.
const INIT_RETRY_PAUSE: Duration = Duration::from_secs(2);

/// Where a pod's init chain stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Inits {
    /// Every init container succeeded (or there are none): the pod's container may be created.
    Done,
    /// One runs, or pauses between attempts: what it waits for, and when to look again
    /// (`None`: the run's end queues the pass).
    Waiting(String, Option<Duration>),
}

/// The unit name of `init` for the pod `pod`.
fn init_name(key: &ResourceKey, init: &Init, pod: &Identity) -> String {
    format!(
        "{}-init-{}-{}",
        key.app_id(),
        init.name,
        pod.ordinal
            .map_or_else(|| pod.replica_id.clone(), |ordinal| ordinal.to_string())
    )
}

/// Moves one replica's init chain on (the pod `pod` is about to be created): the first init
/// that has not succeeded is started, or watched while it runs, or, once it failed, tried
/// again after voodu's pause (`retries` more times); once all succeeded, their units go. A pass never waits for one: each is a
/// one-shot unit (`oneshot.rs`) whose end queues the next pass. An init whose attempts are
/// used up fails the pass (`Error::Init`, retried by the error policy: the retry starts the
/// init afresh); its last attempt stays for inspection until then. Each init runs like its
/// pod (same volumes, networks, aliases and environment) with its own image, command,
/// resources, ulimits and `docker_options` where it sets them.
pub(crate) async fn advance_inits<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    pod: &Identity,
    container: &Container,
    launch: &Launch,
    inits: &[Init],
) -> Result<Inits> {
    for init in inits {
        let name = init_name(key, init, pod);
        let timeout = parse_go_duration(&init.timeout)
            .filter(|timeout| !timeout.is_zero())
            .unwrap_or(DEFAULT_INIT_TIMEOUT);
        let attempts = 1 + u32::try_from(init.retries.clamp(0, 5)).unwrap_or(0);
        let made = ctx.runs.attempts(&name);
        let next = match oneshot::stand(ctx, key, &name, timeout).await? {
            Some(Stand::Running) => {
                return Ok(Inits::Waiting(
                    format!(
                        "replica {}: init container {} is running (attempt {}/{attempts})",
                        pod.name,
                        init.name,
                        made.max(1)
                    ),
                    None,
                ));
            }
            Some(Stand::Ended { exit, .. }) if exit.succeeded() => continue,
            Some(Stand::Ended {
                id, exit, attempt, ..
            }) => {
                let attempt = attempt.max(made);
                if attempt >= attempts {
                    if !ctx.runs.report_once(&id) {
                        // Reported once already: this is the error policy's retry.
                        1
                    } else {
                        tracing::warn!(%key, init = %init.name, attempt, attempts, %exit, "init container failed; its attempts are used up");
                        return Err(Error::Init {
                            key: key.clone(),
                            init: init.name.clone(),
                            attempts: i64::from(attempts),
                            exit_code: exit.code(),
                            timeout,
                        });
                    }
                } else {
                    tracing::warn!(%key, init = %init.name, attempt, attempts, %exit, "init container failed");
                    // A timed-out attempt is gone already: its pause was its timeout.
                    let since = if exit == Exit::TimedOut {
                        INIT_RETRY_PAUSE
                    } else {
                        ctx.runs.ended_for(&id)
                    };
                    if let Some(pause) = INIT_RETRY_PAUSE
                        .checked_sub(since)
                        .filter(|pause| !pause.is_zero())
                    {
                        return Ok(Inits::Waiting(
                            format!(
                                "replica {}: init container {} failed ({exit}); attempt {} of {attempts} starts in {}s",
                                pod.name,
                                init.name,
                                attempt + 1,
                                pause.as_secs().max(1)
                            ),
                            Some(pause),
                        ));
                    }
                    attempt + 1
                }
            }
            // Never started, or a timed-out attempt removed: the next attempt (the first
            // again once a used-up chain was reported).
            None if made >= attempts => 1,
            None => made + 1,
        };
        start_init(ctx, key, pod, container, launch, init, &name, next, timeout).await?;
        return Ok(Inits::Waiting(
            format!(
                "replica {}: init container {} started (attempt {next}/{attempts})",
                pod.name, init.name
            ),
            None,
        ));
    }
    // Every init succeeded: their units go before the pod is created (a create that fails
    // then runs the chain again, as voodu does).
    for init in inits {
        let name = init_name(key, init, pod);
        oneshot::remove_named(ctx, key, &name).await?;
        ctx.runs.set_attempts(&name, 0);
    }
    Ok(Inits::Done)
}

/// Starts attempt `attempt` of `init` (a previous attempt's unit is removed first).
#[allow(clippy::too_many_arguments)]
async fn start_init<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    pod: &Identity,
    container: &Container,
    launch: &Launch,
    init: &Init,
    name: &str,
    attempt: u32,
    timeout: Duration,
) -> Result<()> {
    let mut init_container = container.clone();
    init_container.resources = init.resources.clone();
    if !init.ulimits.is_empty() {
        init_container.ulimits = init.ulimits.clone();
    }
    if !init.docker_options.is_empty() {
        init_container.docker_options = init.docker_options.clone();
    }
    let run = OneShot {
        identity: Identity {
            name: name.to_owned(),
            role: INIT_ROLE.to_owned(),
            ..pod.clone()
        },
        container: &init_container,
        launch: Launch {
            image: Some(if init.image.is_empty() {
                container.effective_image(key)
            } else {
                init.image.clone()
            }),
            command: Some(init.command.clone()),
            restart: String::new(),
            ports: Vec::new(),
            tty: true,
            ..launch.clone()
        },
        spec_hash: pod.spec_hash.as_deref().unwrap_or_default(),
        // Init containers run on containers only (Swarm refuses them).
        asset_digests: &BTreeMap::new(),
        labels: BTreeMap::from([(labels::ATTEMPT.to_owned(), attempt.to_string())]),
        timeout,
    };
    tracing::info!(%key, init = %init.name, pod = %pod.name, attempt, "starting init container");
    oneshot::start(ctx, key, &run).await?;
    ctx.runs.set_attempts(name, attempt);
    Ok(())
}

/// The init containers of `key` in flight, by replica id (a deployment's random id, a
/// statefulset pod's ordinal), from `units` (the pass's observation of them): the unit ids
/// of each replica still to be created, of the desired spec hash `spec_hash`. Units of
/// another spec hash (a newer spec superseded them) and units of a replica `created` says
/// exists already are removed.
pub(crate) async fn inits_in_flight<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    units: &[crate::runtime::Container],
    spec_hash: &str,
    created: impl Fn(&str) -> bool,
) -> Result<BTreeMap<String, Vec<String>>> {
    let mut in_flight: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for unit in units {
        let replica = unit
            .label(labels::REPLICA_ID)
            .unwrap_or_default()
            .to_owned();
        if unit.label(labels::MANIFEST_HASH) == Some(spec_hash) && !created(&replica) {
            in_flight.entry(replica).or_default().push(unit.id.clone());
        } else {
            tracing::info!(%key, unit = %unit.name, "removing an init container a newer spec (or its created replica) superseded");
            oneshot::remove(ctx, key, &unit.id).await?;
        }
    }
    Ok(in_flight)
}

/// Removes the init units `ids` of a replica no longer to be created (scaled down while its
/// inits ran).
pub(crate) async fn drop_inits<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    replica: &str,
    ids: &[String],
) -> Result<()> {
    for id in ids {
        tracing::info!(%key, replica, "removing an init container of a replica no longer wanted");
        oneshot::remove(ctx, key, id).await?;
    }
    Ok(())
}
