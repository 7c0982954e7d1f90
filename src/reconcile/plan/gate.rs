//! Decide, while replicas roll or crash: which planned steps may run now (the health gate),
//! whether a rollout has failed, and how long a crash-looping replica waits before the agent
//! starts it again. Pure: readiness, restart counts and time are passed in, so the rules are
//! tested without a runtime; `CrashLoops` and `RolloutClock` only remember instants.
//!
//! Invariants: at most one outdated replica is replaced per gate, only when no create runs in
//! the same pass and every replica of the target version is ready, and a ready one only when
//! `replicas` stay ready after the pass's removals; so with remove-then-create slots a rollout
//! never takes ready replicas below `replicas − 1`. Removals, starts and creates never wait
//! (they never lower readiness below that); a rollout fails on its deadline or on a new replica that keeps crashing,
//! never on a replica that is merely slow within the deadline.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::lock;
use crate::reconcile::plan::{StatefulStep, Step};
use crate::runtime::{Container, ContainerState};

/// Restarts of a new replica after which the rollout fails without waiting for its deadline.
pub(crate) const CRASH_LOOP_RESTARTS: u32 = 3;
/// Back-off before the agent starts a crashed replica again: doubling from this…
const BACKOFF_BASE: Duration = Duration::from_secs(10);
/// …up to this.
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A rollout clock entry is dropped this long after its rollout began.
const FORGET_ROLLOUT: Duration = Duration::from_secs(86_400);
/// A replica that ran this long since its last start by the agent starts with a clean record.
const BACKOFF_RESET: Duration = Duration::from_secs(600);

/// A replica's readiness as the probes last published it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplicaReadiness {
    pub(crate) ready: bool,
    pub(crate) reason: String,
}

/// A replica of the target version that is not ready (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub(crate) name: String,
    pub(crate) reason: String,
}

/// The replicas of the target version (`is_current`) that are not ready, with why.
pub(crate) fn waiting(
    actual: &[Container],
    is_current: impl Fn(&Container) -> bool,
    readiness: &BTreeMap<String, ReplicaReadiness>,
) -> Vec<Waiting> {
    actual
        .iter()
        .filter(|container| is_current(container))
        .filter_map(|container| {
            let reason = match (container.state, readiness.get(&container.name)) {
                (ContainerState::Running, Some(row)) if row.ready => return None,
                (ContainerState::Running, Some(row)) if !row.reason.is_empty() => {
                    row.reason.clone()
                }
                (ContainerState::Running, Some(_)) => "not ready".to_owned(),
                (ContainerState::Running, None) => "no probe result yet".to_owned(),
                (state, _) => format!("{state:?}").to_lowercase(),
            };
            Some(Waiting {
                name: container.name.clone(),
                reason,
            })
        })
        .collect()
}

/// The steps of `plan_replicas` that may run now: every removal, start and create, and at
/// most one replacement. A replacement waits while replicas are being created in this pass or
/// any replica of the target version is `waiting` (the previous slot is not ready).
///
/// Without surge (`surge == false`), a ready victim also waits until, after this pass's
/// removals, `n_replicas` replicas are ready (so removing it leaves at least
/// `n_replicas − 1`); unready outdated replicas go first: replacing them costs no readiness.
///
/// With surge, a replacement only adds the successor, so it needs no ready count; a `Retire`
/// goes once removing it still leaves `n_replicas` ready (an unready one goes at once), and
/// while one is held back no further successor is started. Ready replicas never drop below
/// `n_replicas`. `ready`: the replicas (any version) running and ready.
pub(crate) fn gate(
    steps: Vec<Step>,
    waiting: &[Waiting],
    ready: &BTreeSet<String>,
    n_replicas: usize,
    surge: bool,
) -> Vec<Step> {
    let is_ready = |step: &Step| match step {
        Step::Replace { name, .. } | Step::Remove { name, .. } | Step::Retire { name, .. } => {
            ready.contains(name)
        }
        _ => false,
    };
    let (replaces, now): (Vec<Step>, Vec<Step>) = steps
        .into_iter()
        .partition(|step| matches!(step, Step::Replace { .. }));
    let (mut retires, mut now): (Vec<Step>, Vec<Step>) = now
        .into_iter()
        .partition(|step| matches!(step, Step::Retire { .. }));
    let removed_ready = now
        .iter()
        .filter(|step| matches!(step, Step::Remove { .. }) && is_ready(step))
        .count();
    let mut ready_after = ready.len().saturating_sub(removed_ready);
    // Unready ones first: retiring them costs no readiness.
    retires.sort_by_key(|step| is_ready(step));
    let mut held_back = false;
    for retire in retires {
        if !is_ready(&retire) {
            now.push(retire);
        } else if ready_after > n_replicas {
            ready_after -= 1;
            now.push(retire);
        } else {
            held_back = true;
        }
    }
    let creating = now.iter().any(|step| matches!(step, Step::Create));
    if creating || !waiting.is_empty() {
        return now;
    }
    let victim = replaces
        .into_iter()
        .enumerate()
        .min_by_key(|(index, step)| (is_ready(step), *index))
        .map(|(_, step)| step);
    match victim {
        // An unready victim is replaced in place even when surging: it costs no readiness,
        // and it is not worth a replica more (a superseded rollout's replica, a crashed one).
        Some(Step::Replace { id, name, .. }) if !ready.contains(&name) => {
            now.push(Step::Replace {
                id,
                name,
                surge: false,
            });
        }
        Some(victim) if surge && !held_back => now.push(victim),
        Some(victim) if !surge && ready_after >= n_replicas => now.push(victim),
        _ => {}
    }
    now
}

/// The ordered form of `gate`, for statefulset pods (`plan_statefulset` order): every removal
/// and start, then at most one create or replacement — the first in plan order that
/// Kubernetes' `OrderedReady` allows. `unready`: the ordinals below `replicas` whose pod exists
/// but is not running and ready (any version); `down`: those of them not running at all. A
/// pod is created, or a down pod replaced (to fix it), only while every pod below it is ready;
/// a running pod is replaced only while every pod is ready, so a rolling update never takes
/// two pods down at once, and a pod that is merely not ready (yet) is waited for.
pub(crate) fn gate_ordered(
    steps: Vec<StatefulStep>,
    unready: &BTreeSet<usize>,
    down: &BTreeSet<usize>,
) -> Vec<StatefulStep> {
    let below_ready = |ordinal: usize| unready.range(..ordinal).next().is_none();
    let allowed = |step: &StatefulStep| match step {
        StatefulStep::Create { ordinal } => below_ready(*ordinal),
        StatefulStep::Replace { ordinal, .. } if down.contains(ordinal) => below_ready(*ordinal),
        StatefulStep::Replace { .. } => unready.is_empty(),
        StatefulStep::Remove { .. } | StatefulStep::Start { .. } => true,
    };
    let mut now = Vec::new();
    let mut next = None;
    for step in steps {
        match step {
            StatefulStep::Remove { .. } | StatefulStep::Start { .. } => now.push(step),
            StatefulStep::Create { .. } | StatefulStep::Replace { .. } => {
                if next.is_none() && allowed(&step) {
                    next = Some(step);
                }
            }
        }
    }
    now.extend(next);
    now
}

/// What a new replica has been through, for `rollout_failure`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewReplica {
    pub(crate) name: String,
    /// Created by the release being checked (only those can fail it: an older replica's
    /// lifetime restarts say nothing about this release).
    pub(crate) this_release: bool,
    /// Restarts seen: the engine's restart count, or the agent's own starts, whichever is more.
    pub(crate) restarts: u32,
    pub(crate) last_exit_code: Option<i64>,
}

/// The first new replica of this release that restarted `CRASH_LOOP_RESTARTS` times: the
/// rollout fails for it (`rollout_failure`).
pub(crate) fn crash_looping(new_replicas: &[NewReplica]) -> Option<&NewReplica> {
    new_replicas
        .iter()
        .find(|replica| replica.this_release && replica.restarts >= CRASH_LOOP_RESTARTS)
}

/// Why a rollout has failed, if it has: a new replica crash-looping, or the deadline passed
/// with replicas still waiting or steps still to do.
pub(crate) fn rollout_failure(
    elapsed: Duration,
    deadline: Duration,
    converged: bool,
    waiting: &[Waiting],
    new_replicas: &[NewReplica],
) -> Option<String> {
    if let Some(crashing) = crash_looping(new_replicas) {
        let exit = crashing
            .last_exit_code
            .map_or_else(String::new, |code| format!(", last exit code {code}"));
        return Some(format!(
            "new replica {} is crash-looping (restarted {} times{exit})",
            crashing.name, crashing.restarts
        ));
    }
    if elapsed < deadline || (converged && waiting.is_empty()) {
        return None;
    }
    let pending = match waiting.first() {
        Some(first) if waiting.len() > 1 => format!(
            "{} (and {} more) not ready: {}",
            first.name,
            waiting.len() - 1,
            first.reason
        ),
        Some(first) => format!("{} not ready: {}", first.name, first.reason),
        None => "replicas still to replace".to_owned(),
    };
    Some(format!(
        "not ready within the rollout deadline of {}: {pending}",
        human(deadline)
    ))
}

/// `90s` → `1m30s`, as Go prints durations (the flags take the same form).
pub(crate) fn human(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match (seconds / 60, seconds % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

/// Back-off before the `restarts`-th start by the agent of a crashed replica: the first is
/// at once (a container stopped by hand comes back without delay), then 10s, 20s, 40s, …
/// up to 5m.
pub(crate) fn backoff(restarts: u32) -> Duration {
    if restarts == 0 {
        return Duration::ZERO;
    }
    let doublings = (restarts - 1).min(16);
    BACKOFF_BASE
        .saturating_mul(1_u32 << doublings)
        .min(BACKOFF_MAX)
}

/// The agent's starts of crashed replicas, by container id (a re-created statefulset pod
/// keeps its name but starts with a clean record), for the crash-loop back-off.
#[derive(Debug, Default)]
pub(crate) struct CrashLoops {
    starts: Mutex<HashMap<String, (u32, Instant)>>,
}

impl CrashLoops {
    /// Asks to start container `id` again at `now`: `Ok(restarts so far, this one included)`, or
    /// `Err(wait)` while its back-off runs.
    pub(crate) fn try_start(&self, id: &str, now: Instant) -> Result<u32, Duration> {
        let mut starts = lock(&self.starts);
        let (restarts, last) = starts.get(id).copied().unwrap_or((0, now));
        let since = now.saturating_duration_since(last);
        let restarts = if since >= BACKOFF_RESET { 0 } else { restarts };
        let wait = backoff(restarts).saturating_sub(since);
        if restarts > 0 && !wait.is_zero() {
            return Err(wait);
        }
        starts.insert(id.to_owned(), (restarts + 1, now));
        Ok(restarts + 1)
    }

    /// Starts of container `id` by the agent within the reset window.
    pub(crate) fn restarts(&self, id: &str, now: Instant) -> u32 {
        lock(&self.starts)
            .get(id)
            .filter(|(_, last)| now.saturating_duration_since(*last) < BACKOFF_RESET)
            .map_or(0, |(restarts, _)| *restarts)
    }

    /// Forgets containers that are gone.
    pub(crate) fn retain(&self, alive: impl Fn(&str) -> bool) {
        lock(&self.starts).retain(|id, _| alive(id));
    }
}

/// When each in-flight rollout's deadline started, on the async clock (paused in tests), by
/// release id: at the first pass that checks it, which comes after the release's hooks
/// (`pre_command`, `command`), so their run time never counts. After an agent restart the
/// deadline starts again: an agent that was down is no reason to fail a rollout.
#[derive(Debug, Default)]
pub(crate) struct RolloutClock {
    started: Mutex<HashMap<i64, Instant>>,
    /// The last error a pass of each rollout met (an init container failing, say), so a
    /// rollout failed on its deadline says what held it up.
    last_error: Mutex<HashMap<i64, String>>,
}

impl RolloutClock {
    /// How long release `id`'s rollout has been under its deadline.
    pub(crate) fn elapsed(&self, id: i64, now: Instant) -> Duration {
        let mut started = lock(&self.started);
        // Releases that ended without `finish` (superseded) are forgotten a day later.
        started.retain(|_, start| now.saturating_duration_since(*start) < FORGET_ROLLOUT);
        lock(&self.last_error).retain(|id, _| started.contains_key(id));
        let start = *started.entry(id).or_insert(now);
        now.saturating_duration_since(start)
    }

    /// Starts release `id`'s deadline again at `now`: a canary holding (a pause, an analysis)
    /// never uses its deadline up; each step gets the whole of it to bring its replicas up.
    pub(crate) fn restart(&self, id: i64, now: Instant) {
        lock(&self.started).insert(id, now);
    }

    /// Remembers the error a pass of release `id`'s rollout met.
    pub(crate) fn note_error(&self, id: i64, error: String) {
        lock(&self.last_error).insert(id, error);
    }

    /// The last error a pass of release `id`'s rollout met, if any.
    pub(crate) fn last_error(&self, id: i64) -> Option<String> {
        lock(&self.last_error).get(&id).cloned()
    }

    /// Forgets a release that is no longer in flight.
    pub(crate) fn finish(&self, id: i64) {
        lock(&self.started).remove(&id);
        lock(&self.last_error).remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_step_names as names;
    use super::*;
    use crate::model::SpecHash;
    use crate::reconcile::plan::Target;
    use crate::runtime::labels;

    fn replica(name: &str, hash: &str, state: ContainerState) -> Container {
        Container {
            id: format!("id-{name}"),
            name: name.to_owned(),
            image: "img".to_owned(),
            labels: BTreeMap::from([(labels::MANIFEST_HASH.to_owned(), hash.to_owned())]),
            state,
        }
    }

    fn readiness(rows: &[(&str, bool)]) -> BTreeMap<String, ReplicaReadiness> {
        rows.iter()
            .map(|(name, ready)| {
                (
                    (*name).to_owned(),
                    ReplicaReadiness {
                        ready: *ready,
                        reason: if *ready {
                            String::new()
                        } else {
                            "probe failing".to_owned()
                        },
                    },
                )
            })
            .collect()
    }

    use ContainerState::{Exited, Running};

    /// A surge roll of three, pass by pass: after every pass the gated steps are applied (a
    /// replacement adds an unready successor, a retire or removal takes a replica away), then
    /// every successor becomes ready on alternate passes. Ready replicas never drop below
    /// three, and the roll ends with three new ones.
    #[test]
    fn a_surge_roll_never_drops_ready_replicas_below_replicas() {
        let hash = SpecHash::new("new");
        let target = target(&hash, 3, true);
        let mut actual = vec![
            replica("a", "old", Running),
            replica("b", "old", Running),
            replica("c", "old", Running),
        ];
        let mut ready: BTreeSet<String> = ["a", "b", "c"].map(str::to_owned).into();
        let mut passes = Vec::new();
        for pass in 0..20 {
            let rows: BTreeMap<String, ReplicaReadiness> = actual
                .iter()
                .map(|c| {
                    let ready = ready.contains(&c.name);
                    (
                        c.name.clone(),
                        ReplicaReadiness {
                            ready,
                            reason: String::new(),
                        },
                    )
                })
                .collect();
            let wait = waiting(&actual, |c| target.is_current(c), &rows);
            let steps = crate::reconcile::plan::plan_replicas(Some(&target), &actual);
            let gated = gate(steps, &wait, &ready, 3, true);
            passes.push(names(&gated));
            for step in gated {
                match step {
                    Step::Replace { .. } => {
                        actual.push(replica(&format!("n{pass}"), "new", Running));
                    }
                    Step::Retire { name, .. } | Step::Remove { name, .. } => {
                        actual.retain(|c| c.name != name);
                        ready.remove(&name);
                    }
                    other => panic!("unexpected {other:?}"),
                }
                assert!(
                    ready.len() >= 3,
                    "ready dropped to {} after {passes:?}",
                    ready.len()
                );
            }
            if pass % 2 == 1 {
                ready.extend(actual.iter().map(|c| c.name.clone()));
            }
        }
        assert!(actual.iter().all(|c| target.is_current(c)), "{actual:?}");
        assert_eq!((actual.len(), ready.len()), (3, 3));
        // One successor at a time; each outdated replica retired once its successor is ready.
        let steps: Vec<String> = passes.concat();
        assert_eq!(
            steps,
            [
                "replace a",
                "retire c",
                "replace a",
                "retire b",
                "replace a",
                "retire a",
            ],
            "{passes:?}"
        );
    }

    fn ready_set(rows: &BTreeMap<String, ReplicaReadiness>) -> BTreeSet<String> {
        rows.iter()
            .filter(|(_, row)| row.ready)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// A deployment target of `n_replicas` with spec hash `new`.
    fn target(hash: &SpecHash, n_replicas: usize, surge: bool) -> Target<'_> {
        Target {
            spec_hash: hash,
            n_replicas,
            env_digest: None,
            images: None,
            surge,
        }
    }

    /// What the gate lets through of the plan for `actual` with `rows` of readiness.
    fn gated(
        target: &Target<'_>,
        actual: &[Container],
        rows: &BTreeMap<String, ReplicaReadiness>,
    ) -> Vec<Step> {
        let wait = waiting(actual, |c| target.is_current(c), rows);
        let steps = crate::reconcile::plan::plan_replicas(Some(target), actual);
        gate(
            steps,
            &wait,
            &ready_set(rows),
            target.n_replicas,
            target.surge,
        )
    }

    #[test]
    fn a_surge_replaces_an_unready_outdated_replica_in_place_first() {
        let hash = SpecHash::new("new");
        let target = target(&hash, 3, true);
        let gated = |actual: &[Container], rows: &BTreeMap<String, ReplicaReadiness>| {
            gated(&target, actual, rows)
                .iter()
                .map(|step| match step {
                    Step::Replace {
                        name, surge: false, ..
                    } => format!("replace {name} in place"),
                    other => names(std::slice::from_ref(other)).concat(),
                })
                .collect::<Vec<_>>()
        };
        // Three ready replicas of v1 and one unready of a superseded v2 (all outdated).
        // Planned to be replaced, the unready one is replaced in place (no replica more, no
        // readiness lost); the retire of a ready v1 replica waits (it would leave two ready).
        let actual = [
            replica("a", "v2", Running),
            replica("b", "v1", Running),
            replica("c", "v1", Running),
            replica("d", "v1", Running),
        ];
        let rows = readiness(&[("a", false), ("b", true), ("c", true), ("d", true)]);
        assert_eq!(gated(&actual, &rows), ["replace a in place"]);
        // Planned to be retired, it goes at once, and a successor surges beside the rest.
        let actual = [
            replica("b", "v1", Running),
            replica("c", "v1", Running),
            replica("d", "v1", Running),
            replica("x", "v2", Running),
        ];
        let rows = readiness(&[("b", true), ("c", true), ("d", true), ("x", false)]);
        assert_eq!(gated(&actual, &rows), ["retire x", "replace b"]);
    }

    #[test]
    fn one_slot_at_a_time_and_only_after_the_new_replica_is_ready() {
        let hash = SpecHash::new("new");
        let target = target(&hash, 3, false);
        let gated = |actual: &[Container], rows: &BTreeMap<String, ReplicaReadiness>| {
            names(&gated(&target, actual, rows))
        };
        // All old and ready: one replacement, not three.
        let actual = [
            replica("a", "old", Running),
            replica("b", "old", Running),
            replica("c", "old", Running),
        ];
        let rows = readiness(&[("a", true), ("b", true), ("c", true)]);
        assert!(waiting(&actual, |c| target.is_current(c), &rows).is_empty());
        assert_eq!(gated(&actual, &rows), ["replace a"]);
        // The new one is not ready yet: nothing is replaced.
        let actual = [
            replica("b", "old", Running),
            replica("c", "old", Running),
            replica("n1", "new", Running),
        ];
        let rows = readiness(&[("b", true), ("c", true), ("n1", false)]);
        assert_eq!(
            waiting(&actual, |c| target.is_current(c), &rows),
            [Waiting {
                name: "n1".to_owned(),
                reason: "probe failing".to_owned()
            }]
        );
        assert!(gated(&actual, &rows).is_empty());
        // Without any probe result it waits too.
        let rows = readiness(&[("b", true), ("c", true)]);
        let wait = waiting(&actual, |c| target.is_current(c), &rows);
        assert_eq!(wait[0].reason, "no probe result yet");
        // Ready: the next slot, the unready old replica first (it costs no readiness).
        let rows = readiness(&[("b", true), ("c", false), ("n1", true)]);
        assert_eq!(gated(&actual, &rows), ["replace c"]);
    }

    #[test]
    fn a_replacement_never_takes_ready_replicas_below_replicas_minus_one() {
        let hash = SpecHash::new("new");
        let target = target(&hash, 3, false);
        let gated = |actual: &[Container], rows: &BTreeMap<String, ReplicaReadiness>| {
            names(&gated(&target, actual, rows))
        };
        // The new replica of the first slot was removed (liveness): its successor is created,
        // and no ready old replica goes in the same pass.
        let actual = [replica("b", "old", Running), replica("c", "old", Running)];
        let rows = readiness(&[("b", true), ("c", true)]);
        assert_eq!(gated(&actual, &rows), ["create"]);
        // One old replica is unready: the other ready one stays until a third is ready, but
        // the unready one may go.
        let actual = [
            replica("a", "old", Running),
            replica("b", "old", Running),
            replica("n1", "new", Running),
        ];
        let rows = readiness(&[("a", true), ("b", false), ("n1", true)]);
        assert_eq!(gated(&actual, &rows), ["replace b"]);
        let rows = readiness(&[("a", true), ("b", true), ("n1", true)]);
        assert_eq!(gated(&actual, &rows), ["replace a"]);
        let actual = [
            replica("a", "old", Running),
            replica("n1", "new", Running),
            replica("n2", "new", Exited),
        ];
        let rows = readiness(&[("a", true), ("n1", true)]);
        assert_eq!(
            gated(&actual, &rows),
            ["start n2"],
            "n2 is waiting: a stays"
        );
    }

    #[test]
    fn removals_starts_and_creates_never_wait() {
        let hash = SpecHash::new("new");
        let target = Target {
            spec_hash: &hash,
            n_replicas: 2,
            env_digest: None,
            images: None,
            surge: false,
        };
        let actual = [
            replica("n1", "new", Exited),
            replica("o1", "old", Running),
            replica("o2", "old", Running),
        ];
        let rows = readiness(&[("o1", true), ("o2", true)]);
        let wait = waiting(&actual, |c| target.is_current(c), &rows);
        assert_eq!(wait[0].reason, "exited");
        let steps = crate::reconcile::plan::plan_replicas(Some(&target), &actual);
        assert_eq!(
            names(&gate(steps, &wait, &ready_set(&rows), 2, false)),
            ["remove o2", "start n1"],
            "the replacement of o1 waits for n1; the extra o2 goes at once"
        );
        let target = Target {
            n_replicas: 1,
            ..target
        };
        let steps = crate::reconcile::plan::plan_replicas(Some(&target), &actual);
        assert_eq!(
            names(&gate(steps, &wait, &ready_set(&rows), 1, false)),
            ["remove o1", "remove o2", "start n1"]
        );
    }

    #[test]
    fn pods_come_up_one_at_a_time_each_ready_before_the_next() {
        let replace = |ordinal: usize| StatefulStep::Replace {
            ordinal,
            id: format!("id{ordinal}"),
            name: format!("db.{ordinal}"),
        };
        let steps = vec![
            StatefulStep::Remove {
                ordinal: Some(3),
                id: "id3".to_owned(),
                name: "db.3".to_owned(),
            },
            StatefulStep::Create { ordinal: 1 },
            replace(2),
            replace(0),
        ];
        let kinds = |steps: &[StatefulStep]| -> Vec<String> {
            steps
                .iter()
                .map(|step| match step {
                    StatefulStep::Create { ordinal } => format!("create {ordinal}"),
                    StatefulStep::Start { ordinal, .. } => format!("start {ordinal}"),
                    StatefulStep::Replace { ordinal, .. } => format!("replace {ordinal}"),
                    StatefulStep::Remove { ordinal, .. } => format!("remove {ordinal:?}"),
                })
                .collect()
        };
        let none = BTreeSet::new();
        let set = |ordinals: &[usize]| -> BTreeSet<usize> { ordinals.iter().copied().collect() };
        assert_eq!(
            kinds(&gate_ordered(steps.clone(), &none, &none)),
            ["remove Some(3)", "create 1"]
        );
        // Pod 0 not ready (yet) holds every create and replacement…
        assert_eq!(
            kinds(&gate_ordered(steps.clone(), &set(&[0]), &none)),
            ["remove Some(3)"]
        );
        // …but pod 0 down (exited) is replaced to fix it, and the creates wait for it: a
        // failed first rollout fixed by a commit.
        assert_eq!(
            kinds(&gate_ordered(steps, &set(&[0]), &set(&[0]))),
            ["remove Some(3)", "replace 0"]
        );
        let replaces = vec![replace(2), replace(0)];
        assert_eq!(
            kinds(&gate_ordered(replaces.clone(), &none, &none)),
            ["replace 2"]
        );
        // A rolling update waits while any pod is not ready, itself included…
        assert_eq!(
            kinds(&gate_ordered(replaces.clone(), &set(&[1]), &none)),
            Vec::<String>::new()
        );
        assert_eq!(
            kinds(&gate_ordered(replaces.clone(), &set(&[2]), &none)),
            Vec::<String>::new()
        );
        // …a down pod is replaced once every pod below it is ready, and a pod not ready
        // below it holds that.
        assert_eq!(
            kinds(&gate_ordered(replaces.clone(), &set(&[2]), &set(&[2]))),
            ["replace 2"]
        );
        assert_eq!(
            kinds(&gate_ordered(replaces, &set(&[1, 2]), &set(&[2]))),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_rollout_fails_on_its_deadline_or_on_a_crash_loop_only() {
        let minute = Duration::from_secs(60);
        let slow = [Waiting {
            name: "web.ab12".to_owned(),
            reason: "readiness probe: GET /health answered HTTP 503".to_owned(),
        }];
        assert_eq!(rollout_failure(minute / 2, minute, false, &slow, &[]), None);
        assert_eq!(
            rollout_failure(minute, minute, false, &slow, &[]).as_deref(),
            Some(
                "not ready within the rollout deadline of 1m: web.ab12 not ready: readiness probe: GET /health answered HTTP 503"
            )
        );
        assert_eq!(
            rollout_failure(minute * 2, minute, true, &[], &[]),
            None,
            "done is done"
        );
        assert_eq!(
            rollout_failure(minute * 2, minute, false, &[], &[]).as_deref(),
            Some("not ready within the rollout deadline of 1m: replicas still to replace")
        );
        let crashing = [NewReplica {
            name: "web.ab12".to_owned(),
            this_release: true,
            restarts: 3,
            last_exit_code: Some(1),
        }];
        assert_eq!(
            rollout_failure(Duration::ZERO, minute, false, &slow, &crashing).as_deref(),
            Some("new replica web.ab12 is crash-looping (restarted 3 times, last exit code 1)")
        );
        let restarting_once = [NewReplica {
            restarts: 2,
            ..crashing[0].clone()
        }];
        assert_eq!(
            rollout_failure(Duration::ZERO, minute, false, &slow, &restarting_once),
            None
        );
        let older = [NewReplica {
            this_release: false,
            ..crashing[0].clone()
        }];
        assert_eq!(
            rollout_failure(Duration::ZERO, minute, false, &slow, &older),
            None,
            "an older replica's restarts do not fail this release"
        );
    }

    #[test]
    fn crash_loop_back_off_doubles_and_resets() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(2), Duration::from_secs(20));
        assert_eq!(backoff(6), Duration::from_secs(300));
        assert_eq!(backoff(40), Duration::from_secs(300));
        let loops = CrashLoops::default();
        let t0 = Instant::now();
        assert_eq!(
            loops.try_start("a", t0),
            Ok(1),
            "the first restart is at once"
        );
        assert_eq!(
            loops.try_start("a", t0 + Duration::from_secs(4)),
            Err(Duration::from_secs(6))
        );
        assert_eq!(loops.try_start("a", t0 + Duration::from_secs(10)), Ok(2));
        assert_eq!(loops.restarts("a", t0 + Duration::from_secs(11)), 2);
        assert_eq!(
            loops.try_start("a", t0 + Duration::from_secs(25)),
            Err(Duration::from_secs(5))
        );
        // Ten quiet minutes clear the record.
        let later = t0 + Duration::from_secs(10 + 600);
        assert_eq!(loops.restarts("a", later), 0);
        assert_eq!(loops.try_start("a", later), Ok(1));
        loops.retain(|name| name != "a");
        assert_eq!(loops.restarts("a", later), 0);
    }

    #[test]
    fn the_rollout_clock_starts_at_its_first_check() {
        let clock = RolloutClock::default();
        let now = Instant::now();
        assert_eq!(clock.elapsed(7, now), Duration::ZERO);
        assert_eq!(
            clock.elapsed(7, now + Duration::from_secs(35)),
            Duration::from_secs(35)
        );
        clock.finish(7);
        assert_eq!(
            clock.elapsed(7, now + Duration::from_secs(40)),
            Duration::ZERO
        );
        assert_eq!(human(Duration::from_secs(90)), "1m30s");
        assert_eq!(human(Duration::from_secs(300)), "5m");
        assert_eq!(human(Duration::from_secs(15)), "15s");
    }
}
