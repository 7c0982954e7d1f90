//! Commits: `apply_commit` (one transaction per accepted commit: desired, journal, blobs and
//! the commit record) and `reject_commit`, and the records `status` reads back.
//!
//! Invariants: an accepted commit changes desired, appends its journal rows and records
//! itself together or not at all; a rejected one adds one `commits` row and touches nothing
//! else.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, params};

use super::activity::{self, ActivityOutcome, Entry, Who};
use super::desired::{
    Op, append_journal, delete_override, has_autoscale, key_from_row, put_desired,
};
use super::{Error, Result, Store, now_unix, releases, triggers};
use crate::manifest::spec::Spec;
use crate::manifest::triggers::{Decision, Verdict};
use crate::manifest::{Diagnostic, Diagnostics, Manifest};
use crate::model::{CommitSha, ResourceKey};

/// Who asked for a commit, and for a repository with deploy trigger files, the firing
/// decision it was loaded with.
#[derive(Debug, Clone, Copy)]
pub struct CommitContext<'a> {
    pub(crate) who: &'a Who,
    /// `None`: no trigger files (the `--path` mode); the remembered triggers are cleared.
    pub(crate) triggers: Option<&'a Decision>,
    /// A rejection because the commit is not signed by a trusted key (`--verify-commits`):
    /// told as `signature.refused` too.
    pub(crate) unsigned: bool,
}

/// Most resource keys one activity row lists.
const MAX_KEYS_LISTED: usize = 50;

/// What `apply_commit` changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplySummary {
    pub puts: Vec<ResourceKey>,
    pub(crate) deletes: Vec<ResourceKey>,
    /// Pinned resources whose pin this commit cleared, because git changed them.
    pub(crate) unpinned: Vec<ResourceKey>,
}

/// A commit the agent processed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRecord {
    /// Position in the `commits` table: later records have larger numbers.
    pub(crate) seq: i64,
    pub sha: CommitSha,
    pub applied: bool,
    pub errors: Vec<Diagnostic>,
    /// The warnings an applied commit was accepted with (a resource declared twice, …).
    pub(crate) warnings: Vec<Diagnostic>,
    pub seen_at: i64,
}

/// The last seen, applied and rejected commits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitSummary {
    pub last_seen: Option<CommitRecord>,
    pub last_applied: Option<CommitRecord>,
    pub last_rejected: Option<CommitRecord>,
}

impl Store {
    /// Applies one accepted commit in ONE transaction: diff against desired, upsert changed
    /// resources, delete vanished ones, append the journal rows, record the commit.
    pub fn apply_commit(&self, sha: &CommitSha, manifest: &Manifest) -> Result<ApplySummary> {
        self.apply_commit_as(
            sha,
            manifest,
            CommitContext {
                who: &self.who,
                triggers: None,
                unsigned: false,
            },
        )
    }

    /// `apply_commit`, recording who asked and, with deploy triggers, what they decided: in
    /// the same transaction the triggers are remembered, each resource is keyed to the commit
    /// its file was read at (a trigger that did not fire keeps its older commit), and the
    /// activity log gets the commit, its holds, approvals and unpins.
    pub(crate) fn apply_commit_as(
        &self,
        sha: &CommitSha,
        manifest: &Manifest,
        context: CommitContext<'_>,
    ) -> Result<ApplySummary> {
        let file_commits: BTreeMap<&str, &CommitSha> = context
            .triggers
            .map(|decision| {
                crate::model::map_of(
                    decision
                        .files
                        .iter()
                        .map(|(file, commit, _)| (file.as_str(), commit)),
                )
            })
            .unwrap_or_default();
        let (summary, head) = self.with(|connection| {
            let tx = connection.transaction()?;
            let previous_applied: Option<String> = tx
                .query_row(
                    "SELECT sha FROM commits WHERE outcome = 'applied' AND source = ?1 ORDER BY seq DESC LIMIT 1",
                    params![self.source],
                    |row| row.get(0),
                )
                .optional()?;
            let mut current: BTreeMap<ResourceKey, (String, i64)> = BTreeMap::new();
            {
                let mut statement = tx.prepare_cached("SELECT kind, scope, name, spec, generation FROM desired WHERE source = ?1")?;
                let rows = statement.query_map(params![self.source], |row| <(String, String, String, String, i64)>::try_from(row))?;
                for row in rows {
                    let (kind, scope, name, spec, generation) = row?;
                    current.insert(key_from_row(&kind, scope, name)?, (spec, generation));
                }
            }
            // What another source holds is refused here, in the applying transaction, so two
            // sources applying at once cannot both take it (sync checks first, for its place).
            let taken = super::claims::conflicts(&tx, &self.source, manifest)?;
            if !taken.is_empty() {
                return Err(Error::Claimed(taken));
            }
            super::claims::record(&tx, &self.source, manifest)?;
            let pins = releases::git_specs_of_pins(&tx)?;
            let mut summary = ApplySummary::default();
            let now = now_unix();
            for resource in &manifest.resources {
                let key = &resource.key;
                // Made once per resource: a file unchanged since an earlier commit is not
                // serialised again (`Resource::spec_json`).
                let spec_json = resource.spec_json();
                let current_row = current.remove(key);
                if let Some(git_spec) = pins.get(key) {
                    if git_spec.as_deref() == Some(spec_json) {
                        // Git still declares what it declared at pin time: the pin holds.
                        continue;
                    }
                    releases::delete_pin(&tx, key)?;
                    summary.unpinned.push(key.clone());
                }
                let generation = match current_row {
                    Some((old_spec, _)) if old_spec == spec_json => continue,
                    Some((_, generation)) => generation + 1,
                    None => 1,
                };
                let commit = file_commits
                    .get(resource.origin.path.as_str())
                    .copied()
                    .unwrap_or(sha);
                put_desired(&tx, key, &resource.spec, spec_json, generation, commit, &self.source)?;
                if !has_autoscale(&resource.spec) {
                    delete_override(&tx, key)?;
                }
                summary.puts.push(key.clone());
            }
            for (key, (_, generation)) in current {
                if let Some(git_spec) = pins.get(&key) {
                    if git_spec.is_none() {
                        // Pinned while absent from git, and git still does not declare it.
                        continue;
                    }
                    releases::delete_pin(&tx, &key)?;
                    summary.unpinned.push(key.clone());
                }
                tx.execute(
                    "DELETE FROM desired WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                    params![key.kind.as_str(), key.scope, key.name],
                )?;
                append_journal(&tx, &key, Op::Delete, generation + 1, sha)?;
                delete_override(&tx, &key)?;
                summary.deletes.push(key);
            }
            // Asset bytes travel with the commit; bytes no desired asset uses any more go.
            for (digest, bytes) in &manifest.blobs {
                tx.execute(
                    "INSERT OR IGNORE INTO blobs (source, digest, bytes) VALUES (?1, ?2, ?3)",
                    params![self.source, digest, bytes],
                )?;
            }
            tx.execute("CREATE TEMP TABLE IF NOT EXISTS live_blobs (digest TEXT PRIMARY KEY)", [])?;
            tx.execute("DELETE FROM live_blobs", [])?;
            for digest in manifest.resources.iter().flat_map(|resource| match &resource.spec {
                Spec::Asset(asset) => asset.files.values().map(|file| file.digest.as_str()).collect::<Vec<_>>(),
                // SOPS env files: their encrypted bytes, decrypted only when a container is made.
                spec => spec.sealed_digests(),
            }) {
                tx.execute("INSERT OR IGNORE INTO live_blobs (digest) VALUES (?1)", params![digest])?;
            }
            tx.execute("DELETE FROM blobs WHERE source = ?1 AND digest NOT IN (SELECT digest FROM live_blobs)", params![self.source])?;
            let warnings = (!manifest.warnings.is_empty()).then(|| {
                serde_json::to_string(&manifest.warnings).expect("diagnostics are strings and numbers")
            });
            tx.execute(
                "INSERT INTO commits (sha, outcome, errors, seen_at, warnings, source) VALUES (?1, 'applied', NULL, ?2, ?3, ?4)",
                params![sha.as_str(), now, warnings, self.source],
            )?;
            match context.triggers {
                Some(decision) => triggers::save_states(&tx, &self.source, &decision.states, Some(sha))?,
                None => triggers::save_states(&tx, &self.source, &[], None)?,
            }
            record_apply(&tx, &self.source, sha, &summary, context, previous_applied.as_deref())?;
            super::holds::clear_in(&tx, &self.source, sha, context.who)?;
            let head: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM journal", [], |row| row.get(0))?;
            tx.commit()?;
            Ok((summary, head))
        })?;
        // Wake the reconciler only when rows were appended.
        self.shared.journal_head.send_if_modified(|current| {
            let moved = *current != head;
            *current = head;
            moved
        });
        self.mark_changed();
        Ok(summary)
    }

    /// Records a rejected commit with its diagnostics; desired and the journal stay as they are.
    pub fn reject_commit(&self, sha: &CommitSha, diagnostics: &Diagnostics) -> Result<()> {
        self.reject_commit_as(
            sha,
            diagnostics,
            CommitContext {
                who: &self.who,
                triggers: None,
                unsigned: false,
            },
        )
    }

    /// `reject_commit`, recording who asked. Approvals in `context.triggers` are refused
    /// with it: cleared (the holds stay) and recorded as failed.
    pub(crate) fn reject_commit_as(
        &self,
        sha: &CommitSha,
        diagnostics: &Diagnostics,
        context: CommitContext<'_>,
    ) -> Result<()> {
        let errors =
            serde_json::to_string(&diagnostics.0).expect("diagnostics are strings and numbers");
        let first = diagnostics
            .0
            .first()
            .map(ToString::to_string)
            .unwrap_or_default();
        let result = self.with(|connection| {
            let tx = connection.transaction()?;
            tx.execute(
                "INSERT INTO commits (sha, outcome, errors, seen_at, source) VALUES (?1, 'rejected', ?2, ?3, ?4)",
                params![sha.as_str(), errors, now_unix(), self.source],
            )?;
            let mut entry = Entry::new("commit.reject", context.who, ActivityOutcome::Failed);
            entry.commit = Some(sha);
            entry.source = &self.source;
            entry.message = &first;
            entry.data = serde_json::json!({
                "problems": diagnostics.0.len(),
                "errors": diagnostics.0.iter().take(MAX_KEYS_LISTED).map(ToString::to_string).collect::<Vec<_>>(),
            });
            activity::record(&tx, &entry)?;
            if context.unsigned {
                super::outbox::put(
                    &tx,
                    &super::outbox::NewEvent {
                        event: "signature.refused",
                        resource: "",
                        commit: Some(sha),
                        message: &first,
                        data: serde_json::Value::Null,
                        source: &self.source,
                    },
                )?;
            }
            for outcome in context.triggers.map(|decision| decision.outcomes.as_slice()).unwrap_or_default() {
                if let Verdict::Approved { commit, by } = &outcome.verdict {
                    triggers::clear_approvals(&tx, &self.source, commit)?;
                    let who = Who::new(context.who.origin, Some(by));
                    let resource = format!("trigger/{}", outcome.name);
                    let message = format!("refused: the commit with it is rejected: {first}");
                    let mut entry = Entry::new("approve", &who, ActivityOutcome::Failed);
                    entry.commit = Some(commit);
                    entry.source = &self.source;
                    entry.resource = Some(&resource);
                    entry.message = &message;
                    activity::record(&tx, &entry)?;
                }
            }
            tx.commit()?;
            Ok(())
        });
        self.mark_changed();
        result
    }

    /// The last seen, applied and rejected commits.
    pub fn commit_summary(&self) -> Result<CommitSummary> {
        self.with(|connection| {
            let query = |filter: &str| -> Result<Option<CommitRecord>> {
                let sql = format!(
                    "SELECT seq, sha, outcome, errors, seen_at, warnings FROM commits WHERE source = ?1 {filter} ORDER BY seq DESC LIMIT 1"
                );
                connection
                    .query_row(&sql, params![self.source], commit_row)
                    .optional()?
                    .map(commit_record)
                    .transpose()
            };
            Ok(CommitSummary {
                last_seen: query("")?,
                last_applied: query("AND outcome = 'applied'")?,
                last_rejected: query("AND outcome = 'rejected'")?,
            })
        })
    }

    /// The newest record of commit `sha`, if the agent processed it.
    pub fn commit_record(&self, sha: &CommitSha) -> Result<Option<CommitRecord>> {
        self.with(|connection| {
            connection
                .query_row(
                    "SELECT seq, sha, outcome, errors, seen_at, warnings FROM commits WHERE sha = ?1 AND source = ?2
                     ORDER BY seq DESC LIMIT 1",
                    params![sha.as_str(), self.source],
                    commit_row,
                )
                .optional()?
                .map(commit_record)
                .transpose()
        })
    }
}

/// The activity rows of an applied commit: the commit (when it is new, or changed anything),
/// each hold, approval and unpin.
fn record_apply(
    tx: &rusqlite::Transaction<'_>,
    source: &str,
    sha: &CommitSha,
    summary: &ApplySummary,
    context: CommitContext<'_>,
    previous_applied: Option<&str>,
) -> rusqlite::Result<()> {
    let names = |keys: &[ResourceKey]| -> Vec<String> {
        keys.iter()
            .take(MAX_KEYS_LISTED)
            .map(ToString::to_string)
            .collect()
    };
    let outcomes = context
        .triggers
        .map(|decision| decision.outcomes.as_slice())
        .unwrap_or_default();
    let verdict_names = |wanted: fn(&Verdict) -> bool| -> Vec<&str> {
        outcomes
            .iter()
            .filter(|outcome| wanted(&outcome.verdict))
            .map(|outcome| outcome.name.as_str())
            .collect()
    };
    let holds = outcomes.iter().any(|outcome| {
        matches!(
            outcome.verdict,
            Verdict::Held { .. } | Verdict::Approved { .. }
        )
    });
    let changed =
        !(summary.puts.is_empty() && summary.deletes.is_empty() && summary.unpinned.is_empty());
    if changed || holds || previous_applied != Some(sha.as_str()) {
        let message = format!(
            "{} changed, {} deleted",
            summary.puts.len(),
            summary.deletes.len()
        );
        let mut data = serde_json::json!({
            "changed": names(&summary.puts),
            "deleted": names(&summary.deletes),
        });
        if context.triggers.is_some() {
            data["triggers"] = serde_json::json!({
                "fired": verdict_names(|verdict| matches!(verdict, Verdict::Fired { .. })),
                "held": verdict_names(|verdict| matches!(verdict, Verdict::Held { .. })),
                "approved": verdict_names(|verdict| matches!(verdict, Verdict::Approved { .. })),
                "skipped": verdict_names(|verdict| matches!(verdict, Verdict::Skipped)),
                "inactive": verdict_names(|verdict| matches!(verdict, Verdict::Inactive(_))),
            });
        }
        let mut entry = Entry::new("commit.apply", context.who, ActivityOutcome::Succeeded);
        entry.commit = Some(sha);
        entry.source = source;
        entry.message = &message;
        entry.data = data;
        activity::record(tx, &entry)?;
        let touched: Vec<String> = summary
            .puts
            .iter()
            .chain(&summary.deletes)
            .map(ToString::to_string)
            .collect();
        super::outbox::supersede_unfinished(tx, source, sha, &touched)?;
    }
    for outcome in outcomes {
        let resource = format!("trigger/{}", outcome.name);
        match &outcome.verdict {
            Verdict::Held { replaced } => {
                let message = match replaced {
                    Some(replaced) => format!(
                        "deploy: manual: held until `voodu-agent approve {}`; replaces the held commit {}",
                        sha.short(),
                        replaced.short()
                    ),
                    None => format!(
                        "deploy: manual: held until `voodu-agent approve {}`",
                        sha.short()
                    ),
                };
                let mut entry = Entry::new("trigger.hold", context.who, ActivityOutcome::Held);
                entry.commit = Some(sha);
                entry.source = source;
                entry.resource = Some(&resource);
                entry.message = &message;
                entry.data = serde_json::json!({ "trigger_file": outcome.path });
                activity::record(tx, &entry)?;
                // The held commit it replaces will never be approved: its status ends.
                if let Some(replaced) = replaced
                    && replaced != sha
                {
                    super::outbox::put_superseded(
                        tx,
                        source,
                        replaced,
                        sha,
                        "while it was held for approval",
                    )?;
                }
            }
            Verdict::Approved { commit, by } => {
                let who = Who::new(context.who.origin, Some(by));
                let message = format!(
                    "applied at its own commit while the branch is at {}",
                    sha.short()
                );
                let mut entry = Entry::new("approve", &who, ActivityOutcome::Succeeded);
                entry.commit = Some(commit);
                entry.source = source;
                entry.resource = Some(&resource);
                entry.message = &message;
                entry.data = serde_json::json!({ "trigger_file": outcome.path });
                activity::record(tx, &entry)?;
            }
            _ => {}
        }
    }
    for key in &summary.unpinned {
        let resource = key.to_string();
        let mut entry = Entry::new("unpin", context.who, ActivityOutcome::Succeeded);
        entry.commit = Some(sha);
        entry.resource = Some(&resource);
        entry.message = "the commit changes it in git: the rollback pin is cleared";
        activity::record(tx, &entry)?;
    }
    Ok(())
}

type CommitRow = (i64, String, String, Option<String>, i64, Option<String>);

fn commit_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<CommitRow> {
    CommitRow::try_from(row)
}

fn diagnostics_of(json: Option<String>, what: &'static str) -> Result<Vec<Diagnostic>> {
    match json {
        Some(json) => {
            serde_json::from_str(&json).map_err(|source| Error::Diagnostics { what, source })
        }
        None => Ok(Vec::new()),
    }
}

fn commit_record(
    (seq, sha, outcome, errors, seen_at, warnings): CommitRow,
) -> Result<CommitRecord> {
    Ok(CommitRecord {
        seq,
        sha: CommitSha::new(sha),
        applied: outcome == "applied",
        errors: diagnostics_of(errors, "errors")?,
        warnings: diagnostics_of(warnings, "warnings")?,
        seen_at,
    })
}
