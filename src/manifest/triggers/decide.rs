//! The firing decision, pure: given the trigger files of a new commit, what the agent
//! remembers of each trigger, the tracked branch and the paths changed since the last applied
//! commit, which triggers fire, which are held for `approve`, and which manifest files at
//! which commits make up desired state.
//!
//! The model: each trigger keeps the commit it last fired at and the file it applied then
//! (`Applied`). Desired state is the union, over the triggers that can fire on this host, of
//! their file at that commit; a trigger that does not fire keeps its resources exactly as
//! they were (nothing is pruned because a push touched other paths). A file named by two
//! triggers is read at the newest commit either fired at (each firing applies the whole file,
//! as in voodu).
//!
//! Invariants: a trigger fires when its branch filter matches and it is new to the agent
//! (first commit, or it became active), the changed paths are unknown (unrelated history), it
//! has no `paths`, or a changed path matches one; a `deploy: manual` trigger that fires is
//! held at that commit instead (a newer firing replaces the held commit and drops an approval
//! not yet applied); an approved hold is applied at its commit in this decision; a trigger
//! whose branch filter excludes the tracked branch, or whose file lies outside `--path`, is
//! inactive and contributes nothing; a trigger file deleted from the repo contributes nothing.

use std::collections::BTreeMap;

use super::Trigger;
use crate::model::{CommitSha, HostSelection};

/// What the agent remembers of one trigger between commits (a row of the store's
/// `triggers` table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerState {
    /// The trigger file: its identity.
    pub(crate) path: String,
    pub(crate) name: String,
    /// The commit it last fired (or was approved) at, and the file it applied then.
    pub(crate) applied: Option<Applied>,
    /// A `deploy: manual` firing waiting for `voodu-agent approve`.
    pub held: Option<Held>,
    /// Why it never fires on this host; empty while it can.
    pub(crate) inactive: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub(crate) commit: CommitSha,
    pub(crate) file: String,
    /// Order of firings: of two triggers naming one file, the later firing's commit is read.
    pub(crate) seq: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub commit: CommitSha,
    pub(crate) file: String,
    /// Unix time it was held.
    pub(crate) since: i64,
    /// Set by `voodu-agent approve`; the next decision applies the hold.
    pub(crate) approval: Option<Approval>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// Who approved (as the approving command saw its user); may be empty.
    pub(crate) by: String,
    pub(crate) at: i64,
}

/// The commit being decided and where it stands.
#[derive(Debug, Clone)]
pub struct Situation<'a> {
    /// The branch the agent tracks.
    pub(crate) branch: &'a str,
    pub(crate) commit: &'a CommitSha,
    /// Paths changed since the last applied commit; `None` when unknown (no applied commit,
    /// or the history is unrelated, as after a force-push): every active trigger fires.
    pub(crate) changed: Option<&'a [String]>,
    /// `--path` prefixes (normalised, no trailing `/`); empty means the whole repo.
    pub(crate) watched: &'a [String],
    /// Which manifests this host applies (a fleet's `hosts/<name>/`, `labels/<label>/`): a
    /// trigger whose `apply.file` is another host's never fires here.
    pub(crate) hosts: &'a HostSelection,
    pub(crate) now: i64,
}

/// What one trigger does for this commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its file is applied at this commit (`first`: new to the agent or changed paths
    /// unknown, so its `paths` were not consulted).
    Fired { first: bool },
    /// `deploy: manual`: held at this commit until approved; `replaced` is the held commit
    /// this one replaces.
    Held { replaced: Option<CommitSha> },
    /// An approved hold applied now.
    Approved { commit: CommitSha, by: String },
    /// The push touched none of its `paths`: it keeps what it applied.
    Skipped,
    /// It never fires on this host, and why.
    Inactive(String),
}

/// One trigger's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub(crate) path: String,
    pub name: String,
    pub(crate) manual: bool,
    pub verdict: Verdict,
    /// The hold it still has after this decision (a skipped manual trigger keeps its hold).
    pub(crate) held: Option<CommitSha>,
    /// Its `window` rules (an extension): a firing waits for them (`Decision::firing_windows`).
    pub(crate) windows: Vec<crate::manifest::window::WindowRule>,
}

/// The decision for one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// One per trigger file of the commit, in path order.
    pub(crate) outcomes: Vec<Outcome>,
    /// What to remember of each trigger afterwards (replaces the whole table).
    pub(crate) states: Vec<TriggerState>,
    /// Desired state: each manifest file with the commit it is read at and the trigger whose
    /// firing put it there (its `path`), in file order.
    pub(crate) files: Vec<(String, CommitSha, String)>,
    /// Remembered triggers whose file is gone from the repo (their resources are pruned).
    pub(crate) removed: Vec<TriggerState>,
}

/// Decides commit `situation.commit` for `triggers` (its trigger files) given `previous`
/// (what the agent remembered).
pub fn decide(
    triggers: &[Trigger],
    previous: &[TriggerState],
    situation: &Situation<'_>,
) -> Decision {
    let previous_by_path: BTreeMap<&str, &TriggerState> =
        crate::model::map_of(previous.iter().map(|state| (state.path.as_str(), state)));
    let mut seq = previous
        .iter()
        .filter_map(|state| state.applied.as_ref().map(|applied| applied.seq))
        .max()
        .unwrap_or(0);
    let mut outcomes = Vec::new();
    let mut states = Vec::new();
    for trigger in triggers {
        let before = previous_by_path.get(trigger.path.as_str()).copied();
        let (outcome, state) = decide_one(trigger, before, situation, &mut seq);
        outcomes.push(outcome);
        states.push(state);
    }
    let removed = previous
        .iter()
        .filter(|state| !triggers.iter().any(|trigger| trigger.path == state.path))
        .cloned()
        .collect();
    let files = desired_files(&states);
    Decision {
        outcomes,
        states,
        files,
        removed,
    }
}

impl Decision {
    /// The `window` rules of each trigger that fires in this decision: the commit applies
    /// only when every set is open (an approved `deploy: manual` hold is not held again).
    pub(crate) fn firing_windows(&self) -> Vec<&[crate::manifest::window::WindowRule]> {
        self.outcomes
            .iter()
            .filter(|outcome| {
                matches!(outcome.verdict, Verdict::Fired { .. }) && !outcome.windows.is_empty()
            })
            .map(|outcome| outcome.windows.as_slice())
            .collect()
    }
}

/// The next firing's sequence number.
fn next_seq(seq: &mut i64) -> i64 {
    *seq += 1;
    *seq
}

/// One trigger's verdict and what to remember of it; `before` is what was remembered.
fn decide_one(
    trigger: &Trigger,
    before: Option<&TriggerState>,
    situation: &Situation<'_>,
    seq: &mut i64,
) -> (Outcome, TriggerState) {
    if let Some(reason) = inactive_reason(trigger, situation) {
        return (
            Outcome {
                path: trigger.path.clone(),
                name: trigger.name.clone(),
                manual: trigger.manual,
                verdict: Verdict::Inactive(reason.clone()),
                held: None,
                windows: Vec::new(),
            },
            TriggerState {
                path: trigger.path.clone(),
                name: trigger.name.clone(),
                applied: None,
                held: None,
                inactive: reason,
            },
        );
    }
    let first =
        before.is_none_or(|state| !state.inactive.is_empty()) || situation.changed.is_none();
    let fires = first
        || situation
            .changed
            .is_some_and(|changed| trigger.matches_paths(changed));
    let mut applied = before.and_then(|state| state.applied.clone());
    let mut held = before.and_then(|state| state.held.clone());
    let already_applied_here = applied.as_ref().is_some_and(|applied| {
        &applied.commit == situation.commit && applied.file == trigger.apply_file
    });
    let mut verdict = Verdict::Skipped;
    if fires && !trigger.manual {
        if !already_applied_here {
            applied = Some(Applied {
                commit: situation.commit.clone(),
                file: trigger.apply_file.clone(),
                seq: next_seq(seq),
            });
        }
        held = None;
        verdict = Verdict::Fired { first };
    } else if fires && !already_applied_here {
        let same = held
            .as_ref()
            .is_some_and(|held| &held.commit == situation.commit);
        if !same {
            let replaced = held.as_ref().map(|held| held.commit.clone());
            held = Some(Held {
                commit: situation.commit.clone(),
                file: trigger.apply_file.clone(),
                since: situation.now,
                approval: None,
            });
            verdict = Verdict::Held { replaced };
        }
    }
    if let Some(approved) = held
        .as_ref()
        .filter(|held| held.approval.is_some())
        .cloned()
    {
        applied = Some(Applied {
            commit: approved.commit.clone(),
            file: approved.file.clone(),
            seq: next_seq(seq),
        });
        held = None;
        verdict = Verdict::Approved {
            commit: approved.commit,
            by: approved
                .approval
                .map(|approval| approval.by)
                .unwrap_or_default(),
        };
    }
    (
        Outcome {
            path: trigger.path.clone(),
            name: trigger.name.clone(),
            manual: trigger.manual,
            verdict,
            held: held.as_ref().map(|held| held.commit.clone()),
            windows: trigger.windows.clone(),
        },
        TriggerState {
            path: trigger.path.clone(),
            name: trigger.name.clone(),
            applied,
            held,
            inactive: String::new(),
        },
    )
}

/// Desired state from the triggers' states: one entry per file, the newest firing wins.
fn desired_files(states: &[TriggerState]) -> Vec<(String, CommitSha, String)> {
    let mut files: BTreeMap<String, (CommitSha, String, i64)> = BTreeMap::new();
    for state in states {
        if let Some(applied) = &state.applied {
            let newer = files
                .get(&applied.file)
                .is_none_or(|(_, _, seq)| applied.seq > *seq);
            if newer {
                files.insert(
                    applied.file.clone(),
                    (applied.commit.clone(), state.path.clone(), applied.seq),
                );
            }
        }
    }
    files
        .into_iter()
        .map(|(file, (commit, trigger, _))| (file, commit, trigger))
        .collect()
}

/// Why `trigger` never fires on this host, if it does not.
fn inactive_reason(trigger: &Trigger, situation: &Situation<'_>) -> Option<String> {
    if !trigger.matches_branch(situation.branch) {
        return Some(if trigger.branches.is_empty() {
            format!(
                "on.push has only tags ({}); the agent tracks branch {} and never sees a tag push",
                trigger.tags.join(", "),
                situation.branch
            )
        } else {
            format!(
                "on.push.branches [{}] does not match the tracked branch {}",
                trigger.branches.join(", "),
                situation.branch
            )
        });
    }
    let watched = situation.watched.is_empty()
        || situation.watched.iter().any(|prefix| {
            trigger
                .apply_file
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        });
    if !watched {
        return Some(format!(
            "apply.file {} is outside --path {}",
            trigger.apply_file,
            situation.watched.join(", ")
        ));
    }
    situation
        .hosts
        .refusal(&trigger.apply_file, situation.watched)
        .map(|refusal| format!("apply.file {refusal}"))
}
