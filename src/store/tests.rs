//! Store tests: a real SQLite file in a temp dir, never faked. Manifests come from small inline
//! HCL through `manifest::load`, as the sync stage builds them.

use super::*;
use std::collections::BTreeMap;

use crate::manifest;
use crate::manifest::{Diagnostics, Manifest};
use crate::model::{CommitSha, Kind, ResourceKey, Snapshot, SourceFile};

type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A store on a fresh file; the temp dir lives as long as the fixture.
struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    store: Store,
}

fn fixture() -> TestResult<Fixture> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let store = Store::open(&path)?;
    Ok(Fixture {
        _dir: dir,
        path,
        store,
    })
}

/// The commit SHA numbered `n` (40 hex digits).
fn sha(n: u32) -> CommitSha {
    CommitSha::new(format!("{n:040x}"))
}

fn key(name: &str) -> ResourceKey {
    ResourceKey::new(Kind::Deployment, "s", name)
}

/// Decodes one inline manifest file, as the sync stage would.
fn manifest(text: &str) -> TestResult<Manifest> {
    Ok(manifest::load(
        &Snapshot {
            commit: sha(0),
            files: vec![SourceFile {
                path: "app.hcl".to_owned(),
                contents: text.as_bytes().to_vec(),
            }],
            refused: Vec::new(),
        },
        &manifest::LoadOptions::standalone(),
    )?)
}

/// Applies `text` as commit number `n`.
fn apply(store: &Store, n: u32, text: &str) -> TestResult<ApplySummary> {
    Ok(store.apply_commit(&sha(n), &manifest(text)?)?)
}

const WEB_API: &str = r#"
deployment "s" "web" {
  image    = "busybox"
  replicas = 2
}
deployment "s" "api" {
  image = "busybox"
}
"#;

/// The journal as `(key, op, generation, commit number)` rows, oldest first.
fn journal(store: &Store) -> TestResult<Vec<(String, Op, i64, CommitSha)>> {
    Ok(store
        .journal_after(0, usize::MAX)?
        .into_iter()
        .map(|entry| {
            (
                entry.key.to_string(),
                entry.op,
                entry.generation,
                entry.commit,
            )
        })
        .collect())
}

/// Desired state as `(key, generation, commit, replicas)` rows, ordered by key.
fn desired(store: &Store) -> TestResult<Vec<(String, i64, CommitSha, usize)>> {
    let mut rows = Vec::new();
    for key in store.desired_keys()? {
        let desired = store
            .desired(&key)?
            .ok_or("a listed key has a desired row")?;
        rows.push((
            key.to_string(),
            desired.generation,
            desired.commit,
            desired.n_replicas,
        ));
    }
    Ok(rows)
}

fn put(key: &str, generation: i64, commit: u32) -> (String, Op, i64, CommitSha) {
    (key.to_owned(), Op::Put, generation, sha(commit))
}

fn delete(key: &str, generation: i64, commit: u32) -> (String, Op, i64, CommitSha) {
    (key.to_owned(), Op::Delete, generation, sha(commit))
}

#[test]
fn first_apply_puts_every_resource_at_generation_one() -> TestResult {
    let f = fixture()?;
    let summary = apply(&f.store, 1, WEB_API)?;
    assert_eq!(summary.puts, [key("api"), key("web")]);
    assert!(summary.deletes.is_empty());
    assert_eq!(
        desired(&f.store)?,
        [
            ("deployment/s/api".to_owned(), 1, sha(1), 1),
            ("deployment/s/web".to_owned(), 1, sha(1), 2),
        ]
    );
    assert_eq!(
        journal(&f.store)?,
        [put("deployment/s/api", 1, 1), put("deployment/s/web", 1, 1)]
    );
    let commits = f.store.commit_summary()?;
    let applied = commits
        .last_applied
        .ok_or("the commit is recorded as applied")?;
    assert_eq!(
        (applied.sha.clone(), applied.applied, applied.errors.len()),
        (sha(1), true, 0)
    );
    assert_eq!(commits.last_seen, Some(applied));
    assert_eq!(commits.last_rejected, None);
    Ok(())
}

#[test]
fn reapplying_identical_specs_appends_nothing() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    let (desired_before, journal_before) = (desired(&f.store)?, journal(&f.store)?);

    let summary = apply(&f.store, 2, WEB_API)?;

    assert_eq!(summary, ApplySummary::default());
    assert_eq!(
        desired(&f.store)?,
        desired_before,
        "generation and commit stay"
    );
    assert_eq!(journal(&f.store)?, journal_before);
    let commits = f.store.commit_summary()?;
    assert_eq!(commits.last_applied.map(|record| record.sha), Some(sha(2)));
    Ok(())
}

#[test]
fn changing_one_resource_appends_one_put_at_the_next_generation() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    let changed = WEB_API.replace("replicas = 2", "replicas = 3");

    let summary = apply(&f.store, 2, &changed)?;

    assert_eq!(summary.puts, [key("web")]);
    assert!(summary.deletes.is_empty());
    assert_eq!(
        desired(&f.store)?,
        [
            ("deployment/s/api".to_owned(), 1, sha(1), 1),
            ("deployment/s/web".to_owned(), 2, sha(2), 3),
        ]
    );
    assert_eq!(
        journal(&f.store)?,
        [
            put("deployment/s/api", 1, 1),
            put("deployment/s/web", 1, 1),
            put("deployment/s/web", 2, 2),
        ]
    );
    Ok(())
}

#[test]
fn removing_a_resource_deletes_its_row_and_appends_a_delete() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;

    let summary = apply(
        &f.store,
        2,
        "deployment \"s\" \"web\" {\n  image    = \"busybox\"\n  replicas = 2\n}\n",
    )?;

    assert!(summary.puts.is_empty());
    assert_eq!(summary.deletes, [key("api")]);
    assert_eq!(f.store.desired(&key("api"))?, None);
    assert_eq!(
        desired(&f.store)?,
        [("deployment/s/web".to_owned(), 1, sha(1), 2)]
    );
    assert_eq!(
        journal(&f.store)?,
        [
            put("deployment/s/api", 1, 1),
            put("deployment/s/web", 1, 1),
            delete("deployment/s/api", 2, 2),
        ]
    );
    Ok(())
}

#[test]
fn reject_commit_records_diagnostics_and_touches_nothing_else() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    let (desired_before, journal_before) = (desired(&f.store)?, journal(&f.store)?);
    let diagnostics = manifest("deployment \"s\" \"web\" {\n  image = \n}\n")
        .expect_err("a syntax error")
        .downcast::<Diagnostics>()
        .map_err(|_| "load fails with Diagnostics")?;

    f.store.reject_commit(&sha(2), &diagnostics)?;

    let commits = f.store.commit_summary()?;
    let rejected = commits.last_rejected.ok_or("the rejection is recorded")?;
    assert_eq!((rejected.sha.clone(), rejected.applied), (sha(2), false));
    let located: Vec<(&str, usize, usize)> = rejected
        .errors
        .iter()
        .map(|diagnostic| (diagnostic.path.as_str(), diagnostic.line, diagnostic.col))
        .collect();
    assert_eq!(located, [("app.hcl", 2, 11)]);
    assert_eq!(rejected.errors, diagnostics.0, "messages round-trip too");
    assert_eq!(commits.last_seen, Some(rejected));
    assert_eq!(commits.last_applied.map(|record| record.sha), Some(sha(1)));
    assert_eq!(desired(&f.store)?, desired_before);
    assert_eq!(journal(&f.store)?, journal_before);
    Ok(())
}

#[test]
fn a_failing_apply_leaves_no_rows_behind() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    let (desired_before, journal_before) = (desired(&f.store)?, journal(&f.store)?);
    let mut head = f.store.subscribe();
    head.mark_unchanged();
    // Another connection makes the LAST statement of apply_commit (recording the commit) fail,
    // after desired and the journal were already written inside the transaction.
    let other = Connection::open(&f.path)?;
    other.execute_batch(
        "CREATE TRIGGER fail_commits BEFORE INSERT ON commits BEGIN SELECT RAISE(ABORT, 'boom'); END;",
    )?;
    // Touches all three kinds of write: an update (web), an insert (db), a delete (api).
    let changed = r#"
deployment "s" "web" {
  image    = "busybox"
  replicas = 5
}
deployment "s" "db" {
  image = "busybox"
}
"#;

    let error = apply(&f.store, 2, changed).expect_err("the trigger aborts the apply");

    assert!(error.to_string().contains("boom"), "{error}");
    assert_eq!(desired(&f.store)?, desired_before);
    assert_eq!(journal(&f.store)?, journal_before);
    assert_eq!(
        f.store.commit_summary()?.last_seen.map(|record| record.sha),
        Some(sha(1))
    );
    assert!(
        !head.has_changed()?,
        "no journal head is announced for a rolled-back apply"
    );
    // The same apply goes through once the obstacle is gone: nothing half-done was left.
    other.execute_batch("DROP TRIGGER fail_commits;")?;
    let summary = apply(&f.store, 2, changed)?;
    assert_eq!(
        (summary.puts, summary.deletes),
        (vec![key("db"), key("web")], vec![key("api")])
    );
    Ok(())
}

#[test]
fn journal_after_returns_rows_in_order_up_to_the_limit() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    apply(&f.store, 2, "")?;
    let all = f.store.journal_after(0, usize::MAX)?;
    let seqs: Vec<i64> = all.iter().map(|entry| entry.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    // (after, limit) → expected seqs
    let cases: &[(i64, usize, &[i64])] = &[
        (0, 2, &[1, 2]),
        (2, 10, &[3, 4]),
        (1, 1, &[2]),
        (4, 10, &[]),
        (0, 0, &[]),
    ];
    for &(after, limit, expected) in cases {
        let got: Vec<i64> = f
            .store
            .journal_after(after, limit)?
            .iter()
            .map(|entry| entry.seq)
            .collect();
        assert_eq!(got, expected, "journal_after({after}, {limit})");
    }
    Ok(())
}

#[test]
fn cursor_defaults_to_zero_and_persists_across_reopen() -> TestResult {
    let f = fixture()?;
    assert_eq!(f.store.cursor("reconciler")?, 0);
    f.store.set_cursor("reconciler", 3)?;
    f.store.set_cursor("reconciler", 7)?;
    f.store.set_cursor("other", 1)?;
    drop(f.store);

    let reopened = Store::open(&f.path)?;
    assert_eq!(reopened.cursor("reconciler")?, 7);
    assert_eq!(reopened.cursor("other")?, 1);
    assert_eq!(reopened.cursor("never-set")?, 0);
    Ok(())
}

#[test]
fn reopening_keeps_data_and_the_schema_is_at_the_latest_version() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    let (desired_before, journal_before) = (desired(&f.store)?, journal(&f.store)?);
    drop(f.store);

    let reopened = Store::open(&f.path)?;
    assert_eq!(desired(&reopened)?, desired_before);
    assert_eq!(journal(&reopened)?, journal_before);
    assert_eq!(
        *reopened.subscribe().borrow(),
        2,
        "the head starts at the stored journal"
    );
    let version: i64 =
        Connection::open(&f.path)?.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    assert_eq!(usize::try_from(version)?, schema::MIGRATIONS.len());
    Ok(())
}

#[test]
fn a_schema_newer_than_known_is_refused() -> TestResult {
    let f = fixture()?;
    drop(f.store);
    let known = i64::try_from(schema::MIGRATIONS.len())?;
    Connection::open(&f.path)?.pragma_update(None, "user_version", known + 1)?;

    for name in ["open", "open_read_only"] {
        let opened = match name {
            "open" => Store::open(&f.path),
            _ => Store::open_read_only(&f.path),
        };
        match opened {
            Err(Error::SchemaTooNew {
                found,
                known: got_known,
                ..
            }) => {
                assert_eq!((found, got_known), (known + 1, known), "{name}");
            }
            Err(other) => return Err(format!("{name}: expected SchemaTooNew, got {other}").into()),
            Ok(_) => return Err(format!("{name}: a newer schema must be refused").into()),
        }
    }
    Ok(())
}

#[test]
fn a_migration_keeps_a_copy_of_the_previous_schema_and_a_newer_schema_names_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let known = schema::MIGRATIONS.len();
    let older = known - 1;
    {
        let connection = Connection::open(&path)?;
        for migration in &schema::MIGRATIONS[..older] {
            connection.execute_batch(migration)?;
        }
        connection.pragma_update(None, "user_version", i64::try_from(older)?)?;
        connection.execute(
            "INSERT INTO meta (key, value) VALUES ('agent_id', 'a1')",
            [],
        )?;
    }
    let store = Store::open(&path)?;
    assert_eq!(store.agent_id()?, "a1");
    let backup = schema_backup(&path, i64::try_from(older)?);
    let kept = Connection::open(&backup)?;
    let (version, agent): (i64, String) = kept.query_row(
        "SELECT (SELECT user_version FROM pragma_user_version), value FROM meta WHERE key = 'agent_id'",
        [],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    assert_eq!((version, agent.as_str()), (i64::try_from(older)?, "a1"));
    drop(kept);
    // A database at the current schema migrates nothing and keeps no copy.
    drop(store);
    Store::open(&path)?;
    assert!(!schema_backup(&path, i64::try_from(known)?).exists());

    // A newer agent migrated this one's database (it kept the copy at this schema), then the
    // operator went back to this binary: the refusal names the copy and how to restore it.
    std::fs::copy(&path, schema_backup(&path, i64::try_from(known)?))?;
    Connection::open(&path)?.pragma_update(None, "user_version", i64::try_from(known + 1)?)?;
    let message = match Store::open(&path) {
        Err(error) => error.to_string(),
        Ok(_) => return Err("a newer schema must be refused".into()),
    };
    let shown = path.display();
    assert_eq!(
        message,
        format!(
            "state database {shown} has schema version {}, newer than this agent knows ({known}); a newer voodu-agent migrated it and kept it as it was at schema {known} in {shown}.schema-{known}.bak: to go back to this version, stop the agent and run `rm -f {shown}-wal {shown}-shm && cp {shown}.schema-{known}.bak {shown}` (the agent id is the same, so its containers stay its own; what was recorded since the upgrade is lost), or upgrade voodu-agent",
            known + 1
        )
    );
    Ok(())
}

#[test]
fn a_read_only_store_sees_the_writes_of_the_open_store() -> TestResult {
    let f = fixture()?;
    let reader = Store::open_read_only(&f.path)?;
    assert!(reader.desired_keys()?.is_empty());

    apply(&f.store, 1, WEB_API)?;

    assert_eq!(desired(&reader)?, desired(&f.store)?);
    assert_eq!(journal(&reader)?.len(), 2);
    assert_eq!(
        reader
            .commit_summary()?
            .last_applied
            .map(|record| record.sha),
        Some(sha(1))
    );
    assert!(
        reader.set_cursor("reconciler", 1).is_err(),
        "a read-only store does not write"
    );
    Ok(())
}

#[test]
fn subscribers_see_the_new_journal_head_after_apply() -> TestResult {
    let f = fixture()?;
    let mut head = f.store.subscribe();
    assert!(!head.has_changed()?);
    assert_eq!(*head.borrow(), 0);

    apply(&f.store, 1, WEB_API)?;

    assert!(head.has_changed()?);
    assert_eq!(*head.borrow_and_update(), 2);
    Ok(())
}

/// `promote` / `abort` queue the deployment for a pass: one journal PUT of its desired row as
/// it stands (same generation and commit, nothing else changed), announced to subscribers;
/// nothing for a resource not in desired state.
#[test]
fn queue_pass_appends_a_put_of_the_row_as_it_stands() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    let desired_before = desired(&f.store)?;
    let mut head = f.store.subscribe();
    head.borrow_and_update();

    assert!(f.store.queue_pass(&key("web"))?);

    assert!(head.has_changed()?);
    assert_eq!(*head.borrow_and_update(), 3);
    assert_eq!(
        desired(&f.store)?,
        desired_before,
        "desired state unchanged"
    );
    assert_eq!(
        journal(&f.store)?,
        [
            put("deployment/s/api", 1, 1),
            put("deployment/s/web", 1, 1),
            put("deployment/s/web", 1, 1),
        ]
    );
    assert!(!f.store.queue_pass(&key("nope"))?);
    assert!(!head.has_changed()?);
    assert_eq!(journal(&f.store)?.len(), 3);
    Ok(())
}

#[test]
fn releases_are_listed_newest_first() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    let web = key("web");
    assert_eq!(f.store.latest_release(&web)?, None);
    let desired = f.store.desired(&web)?.ok_or("web is desired")?;

    let first = f.store.begin_release(&desired)?;
    f.store
        .finish_release(first.id, ReleasePhase::Failed, "unhealthy")?;
    let second = f.store.begin_release(&desired)?;
    assert_eq!(
        f.store.latest_release(&web)?,
        Some(second.clone()),
        "begin returns what is stored"
    );
    f.store
        .finish_release(second.id, ReleasePhase::Succeeded, "")?;

    let releases = f.store.releases(&web, 10)?;
    let summary: Vec<(i64, ReleasePhase, &str, bool)> = releases
        .iter()
        .map(|release| {
            (
                release.id,
                release.phase,
                release.message.as_str(),
                release.finished_at.is_some(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (second.id, ReleasePhase::Succeeded, "", true),
            (first.id, ReleasePhase::Failed, "unhealthy", true),
        ]
    );
    assert_eq!(
        (&releases[0].commit, &releases[0].snapshot),
        (&sha(1), &desired.spec_json)
    );
    assert_eq!(f.store.releases(&web, 1)?.len(), 1);
    assert_eq!(
        f.store.latest_release(&web)?.map(|release| release.id),
        Some(second.id)
    );
    assert!(
        f.store.releases(&key("api"), 10)?.is_empty(),
        "releases are per resource"
    );
    Ok(())
}

#[test]
fn agent_id_is_sixteen_hex_digits_and_stable_across_reopen() -> TestResult {
    let f = fixture()?;
    let id = f.store.agent_id()?;
    assert_eq!(id.len(), 16, "{id}");
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    assert_eq!(f.store.agent_id()?, id);
    drop(f.store);
    assert_eq!(Store::open(&f.path)?.agent_id()?, id);
    Ok(())
}

// ---- releases, rollback and pins -------------------------------------------------------

/// `deployment "s" "web"` with env `V = v`, plus an `api` whose env is `a`.
fn web_v(v: &str, a: &str) -> String {
    format!(
        "deployment \"s\" \"web\" {{\n  image = \"busybox\"\n  env = {{ V = \"{v}\" }}\n}}\ndeployment \"s\" \"api\" {{\n  image = \"busybox\"\n  env = {{ A = \"{a}\" }}\n}}\n"
    )
}

/// Applies `text` as commit `n` and records a release of `web` for it ending in `phase`, as
/// the reconciler would.
fn rollout(store: &Store, n: u32, text: &str, phase: ReleasePhase) -> TestResult<Release> {
    apply(store, n, text)?;
    let desired = store.desired(&key("web"))?.ok_or("web is desired")?;
    let release = store.begin_release(&desired)?;
    store.finish_release(release.id, phase, "")?;
    Ok(store
        .latest_release(&key("web"))?
        .ok_or("the release is stored")?)
}

fn web_spec(store: &Store) -> TestResult<(String, CommitSha)> {
    let desired = store.desired(&key("web"))?.ok_or("web is desired")?;
    Ok((desired.spec_json, desired.commit))
}

#[test]
fn release_history_keeps_the_newest_ten_per_resource() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    let web = f.store.desired(&key("web"))?.ok_or("web")?;
    let api = f.store.desired(&key("api"))?.ok_or("api")?;
    f.store.begin_release(&api)?;
    let ids: Vec<i64> = (0..13)
        .map(|_| f.store.begin_release(&web).map(|release| release.id))
        .collect::<Result<_>>()?;
    let kept: Vec<i64> = f
        .store
        .releases(&key("web"), usize::MAX)?
        .iter()
        .map(|release| release.id)
        .collect();
    let newest_ten: Vec<i64> = ids
        .iter()
        .rev()
        .take(RELEASE_HISTORY_LIMIT)
        .copied()
        .collect();
    assert_eq!(kept, newest_ten);
    assert_eq!(
        f.store.releases(&key("api"), usize::MAX)?.len(),
        1,
        "retention is per resource"
    );
    Ok(())
}

#[test]
fn a_revert_is_an_ordinary_release_that_names_the_earlier_one() -> TestResult {
    let f = fixture()?;
    let first = rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    rollout(&f.store, 2, &web_v("2", "a"), ReleasePhase::Succeeded)?;
    let revert = rollout(&f.store, 3, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    assert_eq!(revert.commit, sha(3), "keyed to the revert commit");
    assert_eq!(revert.spec_hash, first.spec_hash);
    assert_eq!(revert.rolled_back_from, None);
    assert_eq!(
        revert.message,
        format!(
            "same spec as release #{} (commit {})",
            first.id,
            sha(1).short()
        )
    );
    Ok(())
}

#[test]
fn rollback_reapplies_the_previous_release_and_pins_in_one_step() -> TestResult {
    let f = fixture()?;
    let first = rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    let second = rollout(&f.store, 2, &web_v("2", "a"), ReleasePhase::Succeeded)?;
    let git_version = web_spec(&f.store)?;
    let generation = f.store.desired(&key("web"))?.ok_or("web")?.generation;
    let mut head = f.store.subscribe();
    head.borrow_and_update();

    let outcome = f.store.rollback(&key("web"), None)?;

    assert_eq!(
        outcome.target.id, first.id,
        "default: the previous release that ran"
    );
    assert!(outcome.git_differs);
    let desired = f.store.desired(&key("web"))?.ok_or("web")?;
    assert_eq!(
        (
            &desired.spec_json,
            &desired.commit,
            &desired.spec_hash,
            desired.generation
        ),
        (&first.snapshot, &sha(1), &first.spec_hash, generation + 1)
    );
    let last_row = journal(&f.store)?.pop().ok_or("a journal row")?;
    assert_eq!(last_row, put("deployment/s/web", generation + 1, 1));
    assert!(head.has_changed()?, "the reconciler is woken");
    let releases = f.store.releases(&key("web"), 10)?;
    let phases: Vec<(i64, ReleasePhase, Option<i64>)> = releases
        .iter()
        .map(|release| (release.id, release.phase, release.rolled_back_from))
        .collect();
    assert_eq!(
        phases,
        [
            (
                outcome.release.id,
                ReleasePhase::Progressing,
                Some(second.id)
            ),
            (second.id, ReleasePhase::RolledBack, None),
            (first.id, ReleasePhase::Succeeded, None),
        ]
    );
    assert_eq!(releases[0].commit, sha(1));
    let pin = f.store.pin(&key("web"))?.ok_or("pinned")?;
    assert_eq!(
        (
            pin.release_id,
            &pin.commit,
            pin.git_spec.as_ref(),
            pin.git_commit.as_ref()
        ),
        (
            outcome.release.id,
            &sha(1),
            Some(&git_version.0),
            Some(&git_version.1)
        )
    );
    // A reconcile finishing late cannot mark the rolled-back release succeeded.
    f.store
        .finish_release(second.id, ReleasePhase::Succeeded, "late")?;
    let second_now = f.store.releases(&key("web"), 10)?[1].clone();
    assert_eq!(second_now.phase, ReleasePhase::RolledBack);
    assert!(
        !second_now.message.contains("late"),
        "{}",
        second_now.message
    );
    Ok(())
}

#[test]
fn commits_leave_a_pinned_resource_alone_until_git_changes_it() -> TestResult {
    let f = fixture()?;
    rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    rollout(&f.store, 2, &web_v("2", "a"), ReleasePhase::Succeeded)?;
    f.store.rollback(&key("web"), None)?;
    let pinned = web_spec(&f.store)?;

    // Commit 3 changes api only: web keeps its snapshot and its pin, no journal row for it.
    let rows_before = journal(&f.store)?.len();
    let summary = apply(&f.store, 3, &web_v("2", "b"))?;
    assert_eq!(summary.puts, [key("api")]);
    assert!(summary.unpinned.is_empty());
    assert_eq!(web_spec(&f.store)?, pinned);
    assert!(f.store.pin(&key("web"))?.is_some());
    assert_eq!(journal(&f.store)?.len(), rows_before + 1);

    // Commit 4 changes web in git: the pin clears and git wins, in that same transaction.
    let summary = apply(&f.store, 4, &web_v("3", "b"))?;
    assert_eq!(summary.unpinned, [key("web")]);
    assert_eq!(summary.puts, [key("web")]);
    assert_eq!(f.store.pin(&key("web"))?, None);
    let (spec, commit) = web_spec(&f.store)?;
    assert_eq!(commit, sha(4));
    assert!(spec.contains("\"V\":\"3\""), "{spec}");
    Ok(())
}

#[test]
fn removing_a_pinned_resource_from_git_clears_the_pin_and_prunes_it() -> TestResult {
    let f = fixture()?;
    rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    rollout(&f.store, 2, &web_v("2", "a"), ReleasePhase::Succeeded)?;
    f.store.rollback(&key("web"), None)?;
    let summary = apply(
        &f.store,
        3,
        "deployment \"s\" \"api\" {\n  image = \"busybox\"\n  env = { A = \"a\" }\n}\n",
    )?;
    assert_eq!(
        (summary.deletes, summary.unpinned),
        (vec![key("web")], vec![key("web")])
    );
    assert_eq!(f.store.desired(&key("web"))?, None);
    assert_eq!(f.store.pin(&key("web"))?, None);
    Ok(())
}

#[test]
fn unpin_gives_the_resource_back_to_git() -> TestResult {
    let f = fixture()?;
    rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    rollout(&f.store, 2, &web_v("2", "a"), ReleasePhase::Succeeded)?;
    let git_version = web_spec(&f.store)?;
    f.store.rollback(&key("web"), None)?;
    let generation = f.store.desired(&key("web"))?.ok_or("web")?.generation;

    let outcome = f.store.unpin(&key("web"))?;

    assert_eq!((outcome.git_commit, outcome.changed), (Some(sha(2)), true));
    assert_eq!(web_spec(&f.store)?, git_version);
    assert_eq!(
        journal(&f.store)?.pop().ok_or("a row")?,
        put("deployment/s/web", generation + 1, 2)
    );
    assert_eq!(f.store.pin(&key("web"))?, None);
    match f.store.unpin(&key("web")) {
        Err(Error::NotPinned { key: unpinned }) => assert_eq!(unpinned, key("web")),
        other => return Err(format!("expected NotPinned, got {other:?}").into()),
    }
    Ok(())
}

#[test]
fn rollback_targets_by_commit_prefix_and_refuses_what_never_ran() -> TestResult {
    let f = fixture()?;
    match f.store.rollback(&key("web"), None) {
        Err(Error::Rollback { message, .. }) => {
            assert_eq!(message, "no releases are recorded for it")
        }
        other => return Err(format!("expected a refusal, got {other:?}").into()),
    }
    let first = rollout(&f.store, 0x1a, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    let failed = rollout(&f.store, 0x2b, &web_v("2", "a"), ReleasePhase::Failed)?;
    rollout(&f.store, 0x3c, &web_v("3", "a"), ReleasePhase::Succeeded)?;
    let refusal = |to: &str| match f.store.rollback(&key("web"), Some(to)) {
        Err(Error::Rollback { message, .. }) => Ok(message),
        other => Err(format!("--to {to}: expected a refusal, got {other:?}")),
    };
    assert_eq!(
        refusal(sha(0x2b).as_str())?,
        format!(
            "release #{} of commit {} is failed: only a release that ran can be rolled back to",
            failed.id,
            sha(0x2b).short()
        )
    );
    assert!(refusal("abc")?.contains("too short"));
    assert!(refusal("ffff")?.contains("no kept release has commit ffff"));
    assert!(refusal("0000")?.contains("matches releases of 3 commits"));
    // The full SHA, or an unambiguous prefix, works; upper case too.
    let outcome = f
        .store
        .rollback(&key("web"), Some(&sha(0x1a).as_str().to_uppercase()))?;
    assert_eq!(outcome.target.id, first.id);
    Ok(())
}

/// A new database is made from the script the migrations' result is read back into
/// (`newest_schema`), not by running them on the file: it must be the database the migrations
/// make of an old one, object for object, at the same version.
#[test]
fn a_new_database_has_the_schema_the_migrations_make() -> TestResult {
    assert!(
        super::newest_schema().is_some(),
        "new databases are made from the script, not migrated"
    );
    let dir = tempfile::tempdir()?;
    let fresh = dir.path().join("fresh.db");
    let migrated = dir.path().join("migrated.db");
    Store::open(&fresh)?;
    {
        let connection = Connection::open(&migrated)?;
        connection.execute_batch(schema::MIGRATIONS[0])?;
        connection.pragma_update(None, "user_version", 1)?;
        connection.execute(
            "INSERT INTO meta (key, value) VALUES ('agent_id', 'a1')",
            [],
        )?;
    }
    Store::open(&migrated)?;
    let describe = |path: &std::path::Path| -> TestResult<(i64, Vec<Vec<Option<String>>>)> {
        let connection = Connection::open(path)?;
        let version = connection.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        let mut statement = connection
            .prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")?;
        let objects = statement
            .query_map([], |row| (0..4).map(|i| row.get(i)).collect())?
            .collect::<rusqlite::Result<Vec<Vec<Option<String>>>>>()?;
        Ok((version, objects))
    };
    let (fresh_version, fresh_objects) = describe(&fresh)?;
    let (migrated_version, migrated_objects) = describe(&migrated)?;
    assert_eq!(fresh_version, i64::try_from(schema::MIGRATIONS.len())?);
    assert_eq!(fresh_version, migrated_version);
    assert!(fresh_objects.len() > 20, "{fresh_objects:?}");
    assert_eq!(fresh_objects, migrated_objects);
    Ok(())
}

#[test]
fn a_version_one_database_migrates_and_keeps_its_releases() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    {
        let connection = Connection::open(&path)?;
        connection.execute_batch(schema::MIGRATIONS[0])?;
        connection.pragma_update(None, "user_version", 1)?;
        // Every agent made its id on first open.
        connection.execute(
            "INSERT INTO meta (key, value) VALUES ('agent_id', 'a1')",
            [],
        )?;
        connection.execute(
            "INSERT INTO releases (kind, scope, name, commit_sha, spec_hash, snapshot, phase, started_at)
             VALUES ('deployment', 's', 'web', ?1, 'h', '{}', 'succeeded', 1)",
            params![sha(1).as_str()],
        )?;
    }
    let store = Store::open(&path)?;
    let releases = store.releases(&key("web"), 10)?;
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].rolled_back_from, None);
    assert!(store.pins()?.is_empty());
    Ok(())
}

#[test]
fn journal_rows_from_another_process_wake_subscribers_once_noticed() -> TestResult {
    let f = fixture()?;
    rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    rollout(&f.store, 2, &web_v("2", "a"), ReleasePhase::Succeeded)?;
    let mut head = f.store.subscribe();
    head.borrow_and_update();
    // The `rollback` command opens its own handle, as another process does.
    let command = Store::open(&f.path)?;
    command.rollback(&key("web"), None)?;
    assert!(
        !head.has_changed()?,
        "another handle's writes are not announced here"
    );
    f.store.notice_external_writes()?;
    assert!(head.has_changed()?);
    let seen = *head.borrow_and_update();
    assert_eq!(seen, journal(&f.store)?.len() as i64);
    f.store.notice_external_writes()?;
    assert!(!head.has_changed()?, "nothing new, no wake-up");
    Ok(())
}

#[test]
fn commit_records_and_meta_values_are_looked_up_by_key() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    f.store.reject_commit(&sha(2), &Diagnostics(Vec::new()))?;
    let applied = f.store.commit_record(&sha(1))?.ok_or("commit 1 recorded")?;
    let rejected = f.store.commit_record(&sha(2))?.ok_or("commit 2 recorded")?;
    assert!(applied.applied && !rejected.applied);
    assert!(rejected.seq > applied.seq);
    assert_eq!(f.store.commit_record(&sha(3))?, None);
    assert_eq!(f.store.meta("http_addr")?, None);
    f.store.set_meta("http_addr", Some("127.0.0.1:1"))?;
    f.store.set_meta("http_addr", Some("127.0.0.1:2"))?;
    assert_eq!(f.store.meta("http_addr")?.as_deref(), Some("127.0.0.1:2"));
    f.store.set_meta("http_addr", None)?;
    assert_eq!(f.store.meta("http_addr")?, None);
    Ok(())
}

#[test]
fn handles_opening_a_new_database_at_once_migrate_it_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let handles: Vec<std::thread::JoinHandle<Result<String>>> = (0..8)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || Store::open(&path)?.agent_id())
        })
        .collect();
    let mut ids = Vec::new();
    for handle in handles {
        ids.push(handle.join().map_err(|_| "open thread panicked")??);
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "one agent id for one database: {ids:?}");
    Ok(())
}

#[test]
fn a_job_run_is_finished_once_and_trimming_keeps_the_newest_and_the_running() -> TestResult {
    let fixture = fixture()?;
    let store = &fixture.store;
    let job = ResourceKey::new(Kind::Job, "ops", "migrate");
    let mut ids = Vec::new();
    for (n, outcome) in [
        Some(RunStatus::Succeeded),
        Some(RunStatus::Failed),
        Some(RunStatus::Succeeded),
        Some(RunStatus::Failed),
        None,
        Some(RunStatus::Succeeded),
    ]
    .into_iter()
    .enumerate()
    {
        let id = store.begin_job_run(&job, &format!("{n:04x}"), "h", &format!("c{n}"))?;
        if let Some(status) = outcome {
            assert!(store.finish_job_run(id, status, Some(0), "", "out\n", 1_000 + n as i64)?);
        }
        ids.push(id);
    }
    assert!(
        !store.finish_job_run(ids[0], RunStatus::Failed, Some(9), "late", "", 5)?,
        "a finished run stays as it ended"
    );
    let first = store
        .job_runs(&job)?
        .into_iter()
        .find(|run| run.id == ids[0])
        .ok_or("run")?;
    assert_eq!(
        (first.status, first.exit_code, first.ended_at),
        (RunStatus::Succeeded, Some(0), Some(1_000))
    );
    let dropped = store.trim_job_runs(&job, 1, 1)?;
    assert_eq!(dropped, ["c2", "c1", "c0"]);
    let kept: Vec<String> = store
        .job_runs(&job)?
        .into_iter()
        .map(|run| run.container)
        .collect();
    assert_eq!(
        kept,
        ["c5", "c4", "c3"],
        "newest first; the running one stays"
    );
    store.delete_job_runs(&job)?;
    assert!(store.job_runs(&job)?.is_empty());
    Ok(())
}

/// Issue 53: a commit applied but replaced by the next one before any of its releases
/// started gets `commit.superseded` (its commit status ends), once; a commit whose release
/// ran, or one the next commit does not touch, does not.
#[test]
fn a_commit_replaced_before_its_rollout_started_is_told_superseded_once() -> TestResult {
    let f = fixture()?;
    rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    let api = f
        .store
        .begin_release(&f.store.desired(&key("api"))?.ok_or("api")?)?;
    f.store
        .finish_release(api.id, ReleasePhase::Succeeded, "")?;
    // Commit 2 changes web; commit 3 changes web again before web's release of 2 began.
    apply(&f.store, 2, &web_v("2", "a"))?;
    apply(&f.store, 3, &web_v("3", "a"))?;
    // Commit 4 changes only api: 3's web release has not begun, but web is still 3's to roll.
    apply(&f.store, 4, &web_v("3", "b"))?;
    let superseded = |store: &Store| -> TestResult<Vec<(String, String)>> {
        Ok(store
            .events_after(0, 100)?
            .into_iter()
            .filter(|event| event.event == "commit.superseded")
            .map(|event| {
                (
                    event.commit,
                    event.data["superseded_by"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect())
    };
    assert_eq!(
        superseded(&f.store)?,
        [(sha(2).as_str().to_owned(), sha(3).as_str().to_owned())]
    );
    // Commit 5 changes web: 3 never rolled it (superseded), 1's release ran (left alone), 2
    // was told already.
    apply(&f.store, 5, &web_v("5", "b"))?;
    assert_eq!(
        superseded(&f.store)?,
        [
            (sha(2).as_str().to_owned(), sha(3).as_str().to_owned()),
            (sha(3).as_str().to_owned(), sha(5).as_str().to_owned()),
        ]
    );
    Ok(())
}

/// Issue 53: a replica's probe verdict turning is an outbox event on the transition only:
/// ready → failing once (not at every failed probe, nor a start's "not ready"), at most one
/// `probe.failing` per resource per gap, and its recovery once.
#[test]
fn probe_turns_are_events_on_the_transition_only() -> TestResult {
    let f = fixture()?;
    let row = |container: &str, ready: bool, reason: &str| crate::store::Readiness {
        container: container.to_owned(),
        container_id: format!("id-{container}"),
        key: key("web"),
        ready,
        reason: reason.to_owned(),
        address: "10.0.0.2".to_owned(),
        updated_at: 1,
    };
    let probe_events = |store: &Store| -> TestResult<Vec<(String, String)>> {
        Ok(store
            .events_of(
                "deployment/s/web",
                &["probe.failing", "probe.recovered"],
                50,
            )?
            .into_iter()
            .rev()
            .map(|event| (event.event, event.message))
            .collect())
    };
    // A start: not ready until the probe passes; no event.
    f.store
        .put_readiness(&row("web-1", false, "running for less than 5s"))?;
    f.store.put_readiness(&row("web-1", true, ""))?;
    f.store.put_readiness(&row("web-2", true, ""))?;
    assert!(probe_events(&f.store)?.is_empty());
    // web-1 fails, again and again: one event.
    for n in 0..5 {
        f.store.put_readiness(&row(
            "web-1",
            false,
            &format!("readiness probe: answered 500 ({n})"),
        ))?;
    }
    // web-2 fails within the gap: not told; web-1 recovers: told.
    f.store
        .put_readiness(&row("web-2", false, "readiness probe: answered 500"))?;
    f.store.put_readiness(&row("web-2", true, ""))?;
    f.store.put_readiness(&row("web-1", true, ""))?;
    f.store.put_readiness(&row("web-1", true, ""))?;
    assert_eq!(
        probe_events(&f.store)?,
        [
            (
                "probe.failing".to_owned(),
                "replica web-1 is failing: readiness probe: answered 500 (0)".to_owned()
            ),
            (
                "probe.recovered".to_owned(),
                "replica web-1 passes its probes again".to_owned()
            ),
        ]
    );
    assert_eq!(
        crate::store::runs::probe_turn(Some((true, "")), false, "stopped"),
        None,
        "a stop is no probe failing"
    );
    Ok(())
}

#[test]
fn a_new_release_supersedes_one_in_flight_and_an_operator_rollback_never_targets_it() -> TestResult
{
    let f = fixture()?;
    let first = rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    // Commit 2 starts a rollout that commit 3 supersedes before it finishes.
    apply(&f.store, 2, &web_v("2", "a"))?;
    let second = f
        .store
        .begin_release(&f.store.desired(&key("web"))?.ok_or("web")?)?;
    apply(&f.store, 3, &web_v("3", "a"))?;
    let third = f
        .store
        .begin_release(&f.store.desired(&key("web"))?.ok_or("web")?)?;
    let second_now = &f.store.releases(&key("web"), 10)?[1];
    assert_eq!(second_now.id, second.id);
    assert_eq!(second_now.phase, ReleasePhase::Superseded);
    assert!(
        second_now
            .message
            .contains(&format!("superseded by commit {}", sha(3).short())),
        "{}",
        second_now.message
    );
    // Commit 2's status hears that its rollout will not end (notify's commit statuses), with
    // the source of the resource.
    let events = f.store.events_after(0, 100)?;
    let superseded: Vec<_> = events
        .iter()
        .filter(|event| event.event == "rollout.superseded")
        .collect();
    assert_eq!(superseded.len(), 1, "{events:#?}");
    assert_eq!(superseded[0].commit, sha(2).as_str());
    assert_eq!(superseded[0].resource, "deployment/s/web");
    assert_eq!(superseded[0].data["superseded_by"], sha(3).as_str());
    assert_eq!(superseded[0].data["release"], second.id);
    assert_eq!(superseded[0].data["source"], "");
    // The operator rolls back while 3 is still in flight: 3 never ran, so it ends superseded
    // (not rolled-back), and a later default rollback cannot take it for a good release.
    let outcome = f.store.rollback(&key("web"), None)?;
    assert_eq!(outcome.target.id, first.id);
    let third_now = f
        .store
        .releases(&key("web"), 10)?
        .into_iter()
        .find(|release| release.id == third.id)
        .ok_or("third")?;
    assert_eq!(third_now.phase, ReleasePhase::Superseded);
    Ok(())
}

#[test]
fn an_automatic_rollback_fails_halts_and_pins_in_one_step_and_respects_newer_commits() -> TestResult
{
    let f = fixture()?;
    let good = rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    apply(&f.store, 2, &web_v("2", "a"))?;
    let bad = f
        .store
        .begin_release(&f.store.desired(&key("web"))?.ok_or("web")?)?;
    let outcome = f
        .store
        .auto_rollback(&bad, "not ready within the rollout deadline of 5m")?;
    let AutoRollback::Done(rollback) = outcome else {
        return Err(format!("expected a rollback, got {outcome:?}").into());
    };
    assert_eq!(rollback.target.id, good.id);
    let releases = f.store.releases(&key("web"), 10)?;
    assert_eq!(releases[1].id, bad.id);
    assert_eq!(releases[1].phase, ReleasePhase::Failed);
    assert!(f.store.release_hooks(bad.id)?.contains_key(HALT_MARK));
    assert!(
        releases[0]
            .message
            .starts_with("automatic rollback to release"),
        "{}",
        releases[0].message
    );
    assert_eq!(releases[0].rolled_back_from, Some(bad.id));
    assert_eq!(
        f.store.desired(&key("web"))?.ok_or("web")?.spec_hash,
        good.spec_hash
    );
    assert!(f.store.pin(&key("web"))?.is_some());

    // A rollback that fails is halted, never rolled back further.
    let again = f.store.auto_rollback(&releases[0], "crash loop")?;
    assert_eq!(again, AutoRollback::Halted);
    assert_eq!(
        f.store.latest_release(&key("web"))?.ok_or("latest")?.phase,
        ReleasePhase::Failed
    );

    // A failure noticed after a newer commit changed the resource changes nothing.
    apply(&f.store, 3, &web_v("3", "a"))?;
    let newer = f
        .store
        .begin_release(&f.store.desired(&key("web"))?.ok_or("web")?)?;
    let stale = f.store.auto_rollback(&bad, "late")?;
    assert_eq!(stale, AutoRollback::Superseded);
    assert_eq!(
        f.store.latest_release(&key("web"))?.ok_or("latest")?.id,
        newer.id
    );

    // With nothing that ran before, the failed release is halted where it stands.
    apply(
        &f.store,
        4,
        "deployment \"s\" \"solo\" {\n  image = \"busybox\"\n}\n",
    )?;
    let solo = f
        .store
        .begin_release(&f.store.desired(&key("solo"))?.ok_or("solo")?)?;
    assert_eq!(
        f.store.auto_rollback(&solo, "never ready")?,
        AutoRollback::Halted
    );
    assert!(f.store.release_hooks(solo.id)?.contains_key(HALT_MARK));
    Ok(())
}

#[test]
fn a_retried_rollback_is_still_a_rollback() -> TestResult {
    let f = fixture()?;
    rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    rollout(&f.store, 2, &web_v("2", "a"), ReleasePhase::Succeeded)?;
    let rollback = f.store.rollback(&key("web"), None)?.release;
    f.store
        .finish_release(rollback.id, ReleasePhase::Failed, "image gone")?;
    let failed = f.store.latest_release(&key("web"))?.ok_or("latest")?;
    let desired = f.store.desired(&key("web"))?.ok_or("web")?;
    let retry = f.store.retry_release(&failed, &desired)?;
    assert_eq!(retry.rolled_back_from, rollback.rolled_back_from);
    assert_eq!(retry.phase, ReleasePhase::Progressing);
    Ok(())
}

#[test]
fn the_autoscalers_count_holds_within_bounds_and_goes_with_autoscale() -> TestResult {
    let f = fixture()?;
    let scaled = |max: u32| {
        format!(
            "deployment \"s\" \"web\" {{\n  image = \"busybox\"\n  autoscale {{\n    min = 2\n    max = {max}\n    cpu_target = 50\n  }}\n}}\n"
        )
    };
    apply(&f.store, 1, &scaled(5))?;
    assert_eq!(
        f.store.desired(&key("web"))?.ok_or("web")?.n_replicas,
        2,
        "min seeds replicas"
    );
    f.store
        .set_replicas_override(&key("web"), 4, "mean CPU 90%")?;
    let desired = f.store.desired(&key("web"))?.ok_or("web")?;
    assert_eq!(
        (desired.n_replicas, desired.replicas_override),
        (4, Some(4))
    );
    // A commit narrowing the bounds narrows the count.
    apply(&f.store, 2, &scaled(3))?;
    let desired = f.store.desired(&key("web"))?.ok_or("web")?;
    assert_eq!(
        (desired.n_replicas, desired.replicas_override),
        (3, Some(3))
    );
    assert_eq!(
        f.store.replicas_override(&key("web"))?.map(|(n, _, _)| n),
        Some(4),
        "kept as decided"
    );
    // Dropping `autoscale` drops the count.
    apply(
        &f.store,
        3,
        "deployment \"s\" \"web\" {\n  image = \"busybox\"\n  replicas = 1\n}\n",
    )?;
    let desired = f.store.desired(&key("web"))?.ok_or("web")?;
    assert_eq!((desired.n_replicas, desired.replicas_override), (1, None));
    assert_eq!(f.store.replicas_override(&key("web"))?, None);
    Ok(())
}

// ---- lost or damaged state (issue 10 item 4) -----------------------------------------------

/// How a test damages the data dir before opening `state.db` (the path is passed in).
type Damage = fn(&Path) -> TestResult;

/// Opening a damaged `state.db` is `Unusable`, naming the file and the problem, telling how
/// to recover; the file is left as found (no fresh start over it).
fn check_unusable(name: &str, damage: Damage, problem: &str) -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    damage(&path)?;
    let before = std::fs::read(&path).ok();
    for (how, opened) in [
        ("open", Store::open(&path).map(drop)),
        ("open_read_only", Store::open_read_only(&path).map(drop)),
    ] {
        if how == "open_read_only" && before.is_none() {
            continue; // nothing to read: the CLI says "no agent state" before opening
        }
        match opened {
            Err(Error::Unusable {
                path: named,
                problem: found,
            }) if named == path => {
                assert!(
                    found.contains(problem),
                    "{name} ({how}): problem {found:?} lacks {problem:?}"
                );
            }
            Err(other) => {
                return Err(format!("{name} ({how}): expected Unusable, got {other}").into());
            }
            Ok(()) => return Err(format!("{name} ({how}): opened a damaged database").into()),
        }
    }
    let message = Store::open(&path)
        .err()
        .map(|error| error.to_string())
        .unwrap_or_default();
    assert!(
        message.contains(&path.display().to_string()) && message.contains("--adopt"),
        "{name}: {message}"
    );
    assert!(
        std::fs::read(&path).ok() == before,
        "{name}: the file was changed"
    );
    Ok(())
}

#[test]
fn a_damaged_or_emptied_state_db_is_an_error_never_a_fresh_start() -> TestResult {
    let cases: &[(&str, Damage, &str)] = &[
        (
            "zero-length file",
            |path| Ok(std::fs::write(path, b"")?),
            "the file is empty (0 bytes)",
        ),
        (
            "zeroed file",
            |path| Ok(std::fs::write(path, vec![0u8; 8192])?),
            "file is not a database",
        ),
        (
            "garbage bytes",
            |path| {
                Ok(std::fs::write(
                    path,
                    b"not sqlite at all, just some text ".repeat(200),
                )?)
            },
            "file is not a database",
        ),
        (
            "another program's database",
            |path| Ok(Connection::open(path)?.execute_batch("CREATE TABLE t (x);")?),
            "not a voodu-agent database (1 tables",
        ),
        (
            "an empty SQLite database",
            |path| Ok(Connection::open(path)?.execute_batch("PRAGMA application_id = 7;")?),
            "empty SQLite database",
        ),
        (
            "agent id deleted",
            |path| {
                drop(Store::open(path)?);
                Connection::open(path)?.execute("DELETE FROM meta WHERE key = 'agent_id'", [])?;
                Ok(())
            },
            "it holds no agent id",
        ),
        (
            "meta table dropped",
            |path| {
                drop(Store::open(path)?);
                Connection::open(path)?.execute_batch("DROP TABLE meta;")?;
                Ok(())
            },
            "no such table: meta",
        ),
        (
            "deleted, its write-ahead log left behind",
            |path| {
                let mut wal = path.as_os_str().to_owned();
                wal.push("-wal");
                std::fs::write(PathBuf::from(wal), b"an old log")?;
                Ok(())
            },
            "write-ahead log",
        ),
    ];
    for (name, damage, problem) in cases {
        check_unusable(name, *damage, problem)?;
    }
    Ok(())
}

#[test]
fn a_new_database_is_made_whole_with_its_identity_and_adoption_replaces_it() -> TestResult {
    let f = fixture()?;
    let id = f.store.agent_id()?;
    let key = f.store.env_key()?;
    assert_eq!(key.len(), 64, "the digest key is made with the database");
    let leftovers: Vec<String> = std::fs::read_dir(f.path.parent().ok_or("no parent")?)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".new-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    f.store.adopt_identity("0123456789abcdef", Some("k"))?;
    assert_eq!(f.store.agent_id()?, "0123456789abcdef");
    assert_eq!(f.store.env_key()?, "k");
    f.store.adopt_identity("fedcba9876543210", None)?;
    drop(f.store);
    let reopened = Store::open(&f.path)?;
    assert_eq!(reopened.agent_id()?, "fedcba9876543210");
    assert_eq!(
        reopened.env_key()?,
        "k",
        "no key given: the current one stays"
    );
    assert_ne!(reopened.agent_id()?, id);
    Ok(())
}

/// Issue 10 item 8: deploy `web`, delete it in git, re-add it with a version that fails. The
/// automatic rollback must not resurrect the deleted incarnation's spec: the failed release is
/// halted, nothing is pinned, desired stays git's. The operator's default rollback refuses
/// too; `--to SHA` may still name the old release.
#[test]
fn i10_a_re_added_resource_is_never_rolled_back_to_its_deleted_incarnation() -> TestResult {
    let f = fixture()?;
    let api_only = "deployment \"s\" \"api\" {\n  image = \"busybox\"\n  env = { A = \"a\" }\n}\n";
    let old = rollout(&f.store, 1, &web_v("1", "a"), ReleasePhase::Succeeded)?;
    rollout(&f.store, 2, &web_v("2", "a"), ReleasePhase::Succeeded)?;
    apply(&f.store, 3, api_only)?;
    apply(&f.store, 4, &web_v("3", "a"))?;
    let readded = f.store.desired(&key("web"))?.ok_or("web is desired")?;
    assert_eq!(readded.incarnation, old.incarnation + 1);
    let failing = f.store.begin_release(&readded)?;
    assert_eq!(failing.incarnation, readded.incarnation);

    assert_eq!(
        f.store.auto_rollback(&failing, "never ready")?,
        AutoRollback::Halted
    );
    let latest = f.store.latest_release(&key("web"))?.ok_or("latest")?;
    assert_eq!(
        (latest.id, latest.phase),
        (failing.id, ReleasePhase::Failed)
    );
    assert!(f.store.release_hooks(failing.id)?.contains_key(HALT_MARK));
    assert_eq!(f.store.pin(&key("web"))?, None);
    assert_eq!(web_spec(&f.store)?, (readded.spec_json.clone(), sha(4)));

    match f.store.rollback(&key("web"), None) {
        Err(Error::Rollback { message, .. }) => assert_eq!(
            message,
            "no release that ran since it was last added to git has a different spec (releases from before it was deleted are only gone back to with --to SHA)"
        ),
        other => return Err(format!("expected a refusal, got {other:?}").into()),
    }
    let chosen = f.store.rollback(&key("web"), Some(sha(1).as_str()))?;
    assert_eq!(chosen.target.id, old.id);
    assert_eq!(
        chosen.release.incarnation, readded.incarnation,
        "a rollback release belongs to the incarnation it runs in"
    );

    // A second life that ran is gone back to as usual, and a third starts afresh again.
    let second = rollout(&f.store, 5, &web_v("4", "a"), ReleasePhase::Succeeded)?;
    apply(&f.store, 6, &web_v("5", "a"))?;
    let bad = f
        .store
        .begin_release(&f.store.desired(&key("web"))?.ok_or("web")?)?;
    let AutoRollback::Done(outcome) = f.store.auto_rollback(&bad, "never ready")? else {
        return Err("expected a rollback within the incarnation".into());
    };
    assert_eq!(outcome.target.id, second.id);
    apply(&f.store, 7, api_only)?;
    apply(&f.store, 8, &web_v("1", "a"))?;
    assert_eq!(
        f.store.desired(&key("web"))?.ok_or("web")?.incarnation,
        readded.incarnation + 1
    );
    Ok(())
}

#[test]
fn status_phases_and_reasons_round_trip_and_an_unknown_text_is_reported() -> TestResult {
    let f = fixture()?;
    for phase in Phase::ALL {
        assert_eq!(Phase::parse(phase.as_str())?, phase);
        let status = ResourceStatus {
            reason: (phase == Phase::Failed).then_some(FailureReason::PullFailed),
            ..ResourceStatus::new(phase, "m")
        };
        f.store.put_status(&key("web"), &status)?;
        assert_eq!(
            f.store.status(&key("web"))?.as_ref(),
            Some(&status),
            "{phase}"
        );
    }
    for reason in FailureReason::ALL {
        assert_eq!(FailureReason::parse(reason.as_str())?, reason);
    }
    // A row from a newer agent (or damage): the reader says so, never guesses.
    let cases = [
        ("phase = 'Exploded'", "status phase \"Exploded\""),
        (
            "phase = 'Failed', reason = 'Gremlins'",
            "status reason \"Gremlins\"",
        ),
    ];
    for (set, expected) in cases {
        Connection::open(&f.path)?.execute(&format!("UPDATE status SET {set}"), [])?;
        let error = f.store.status(&key("web")).err().ok_or("an error")?;
        assert!(matches!(error, Error::Unknown { .. }), "{error}");
        assert_eq!(
            error.to_string(),
            format!("state database holds an unreadable row: {expected}")
        );
        // A handler about to replace the row starts afresh instead.
        assert_eq!(f.store.previous_status(&key("web"))?, None);
    }
    Ok(())
}

#[test]
fn statuses_failed_with_finds_keys_by_reason_only() -> TestResult {
    let f = fixture()?;
    let cases = [
        (
            "pull",
            ResourceStatus::failed(FailureReason::PullFailed, "x"),
        ),
        (
            "image",
            ResourceStatus::failed(FailureReason::ImageMissing, "x"),
        ),
        (
            "deadline",
            ResourceStatus::failed(FailureReason::RolloutDeadline, "pulling it failed"),
        ),
        (
            "retrying",
            ResourceStatus {
                reason: Some(FailureReason::PullFailed),
                ..ResourceStatus::new(Phase::Progressing, "x")
            },
        ),
        (
            "ready",
            ResourceStatus::new(Phase::Ready, "pulling it failed"),
        ),
    ];
    for (name, status) in &cases {
        f.store.put_status(&key(name), status)?;
    }
    let found = f
        .store
        .statuses_failed_with(&[FailureReason::ImageMissing, FailureReason::PullFailed])?;
    assert_eq!(found, [key("image"), key("pull")]);
    Ok(())
}

/// Migration 10 moves "halted" out of the hooks record into the release's own `halted` state.
#[test]
fn migration_ten_moves_the_halt_out_of_the_hooks_record() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let cases = [
        (
            "failed",
            r#"{"rollout":{"failed":"deadline","at":1}}"#,
            true,
        ),
        ("failed", r#"{"pre_command":{"exit_code":1}}"#, true),
        (
            "failed",
            r#"{"pre_command":{"exit_code":0},"command":{"exit_code":2}}"#,
            true,
        ),
        ("failed", r#"{"command":{"error":"could not start"}}"#, true),
        ("failed", r#"{"pre_command":{"exit_code":0}}"#, false),
        ("failed", "{}", false),
        ("succeeded", r#"{"post_command":{"exit_code":1}}"#, false),
    ];
    {
        let connection = Connection::open(&path)?;
        for migration in &schema::MIGRATIONS[..9] {
            connection.execute_batch(migration)?;
        }
        connection.pragma_update(None, "user_version", 9)?;
        connection.execute(
            "INSERT INTO meta (key, value) VALUES ('agent_id', 'a1')",
            [],
        )?;
        for (n, (phase, hooks, _)) in cases.iter().enumerate() {
            connection.execute(
                "INSERT INTO releases (id, kind, scope, name, commit_sha, spec_hash, snapshot, phase, started_at, hooks)
                 VALUES (?1, 'deployment', 's', 'web', ?2, 'h', '{}', ?3, 1, ?4)",
                params![i64::try_from(n)? + 1, sha(1).as_str(), phase, hooks],
            )?;
        }
    }
    let store = Store::open(&path)?;
    for (n, (phase, hooks, halted)) in cases.iter().enumerate() {
        let id = i64::try_from(n)? + 1;
        assert_eq!(store.release_halted(id)?, *halted, "{phase} {hooks}");
    }
    Ok(())
}

#[test]
fn desired_of_reads_the_named_resources_that_exist_and_skips_unreadable_rows() -> TestResult {
    let f = fixture()?;
    apply(
        &f.store,
        1,
        r#"
deployment "a" "web" {
  image = "busybox"
}
deployment "a" "api" {
  image = "busybox"
}
ingress "a" "web" {
  host = "web.example.com"
}
deployment "b" "web" {
  image = "busybox"
}
"#,
    )?;
    let names = |found: Vec<Desired>| -> Vec<String> {
        found.into_iter().map(|d| d.key.to_string()).collect()
    };
    let asked = [
        ResourceKey::new(Kind::Ingress, "a", "web"),
        ResourceKey::new(Kind::Ingress, "a", "missing"),
        ResourceKey::new(Kind::Deployment, "a", "api"),
        ResourceKey::new(Kind::Deployment, "b", "web"),
    ];
    assert_eq!(
        names(f.store.desired_of(&asked)?),
        ["ingress/a/web", "deployment/a/api", "deployment/b/web"]
    );
    assert_eq!(names(f.store.desired_of(&[])?), Vec::<String>::new());
    assert_eq!(
        names(f.store.desired_of_kind(Kind::Ingress)?),
        ["ingress/a/web"]
    );
    // One damaged row is left out of every list and reported by its own read.
    Connection::open(&f.path)?.execute(
        "UPDATE desired SET spec = 'not json' WHERE scope = 'a' AND name = 'api'",
        [],
    )?;
    assert_eq!(
        names(f.store.desired_of(&asked)?),
        ["ingress/a/web", "deployment/b/web"]
    );
    assert_eq!(
        names(f.store.desired_of_kind(Kind::Deployment)?),
        ["deployment/a/web", "deployment/b/web"]
    );
    assert_eq!(f.store.desired_all()?.len(), 3);
    assert!(matches!(
        f.store.desired(&asked[2]),
        Err(Error::Spec { .. })
    ));
    Ok(())
}

#[test]
fn buckets_of_reads_the_named_buckets_that_exist() -> TestResult {
    let f = fixture()?;
    let pairs = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    f.store.config_set("a", "", &pairs(&[("SCOPE", "1")]))?;
    f.store
        .config_set("a", "web", &pairs(&[("APP", "2"), ("B", "3")]))?;
    f.store
        .config_set("shared", "db", &pairs(&[("URL", "x")]))?;
    f.store.config_set("b", "web", &pairs(&[("OTHER", "4")]))?;
    let name = |scope: &str, name: &str| (scope.to_owned(), name.to_owned());
    let found = f.store.buckets_of(&[
        name("shared", "db"),
        name("shared", "missing"),
        name("a", ""),
        name("a", "web"),
    ])?;
    let expected: Buckets = [
        (name("a", ""), pairs(&[("SCOPE", "1")])),
        (name("a", "web"), pairs(&[("APP", "2"), ("B", "3")])),
        (name("shared", "db"), pairs(&[("URL", "x")])),
    ]
    .into_iter()
    .collect();
    assert_eq!(found, expected);
    // The same buckets as the whole table holds for those names.
    let all = f.store.buckets()?;
    for (bucket, values) in &found {
        assert_eq!(all.get(bucket), Some(values));
    }
    assert_eq!(all.len(), 4);
    Ok(())
}

#[test]
fn config_changes_are_logged_with_keyed_digests_never_values() -> TestResult {
    let f = fixture()?;
    let store = Store::open(&f.path)?.acting_as(Who::new(Origin::Cli, Some("ops")));
    let set = |value: &str| -> TestResult<String> {
        store.config_set(
            "s",
            "web",
            &BTreeMap::from([("TOKEN".to_owned(), value.to_owned())]),
        )?;
        let (rows, _) = store.activity(0, 10)?;
        let last = rows.last().ok_or("a row")?;
        assert_eq!(
            (last.action.as_str(), last.origin.as_str()),
            ("config.set", "cli")
        );
        assert_eq!(last.resource.as_deref(), Some("config/s/web"));
        assert!(!format!("{rows:?}").contains(value), "{rows:?}");
        Ok(last.data["keys"][0]["digest"]
            .as_str()
            .ok_or("digest")?
            .to_owned())
    };
    let first = set("alpha-secret")?;
    let second = set("beta-secret")?;
    store.config_unset("s", "web", &["TOKEN".to_owned()])?;
    let third = set("alpha-secret")?;
    assert_eq!(first.len(), 12);
    assert_ne!(first, second, "a changed value changes the digest");
    assert_eq!(first, third, "the same value gives the same digest");
    // Keyed: not the plain SHA-256 prefix of the value voodu writes.
    use sha2::Digest as _;
    let plain: String = sha2::Sha256::digest(b"alpha-secret")[..6]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    assert_ne!(first, plain);
    let (rows, _) = store.activity(0, 10)?;
    assert_eq!(
        rows.iter()
            .map(|row| row.action.as_str())
            .collect::<Vec<_>>(),
        ["config.set", "config.set", "config.unset", "config.set"]
    );
    Ok(())
}

#[test]
fn the_activity_log_keeps_30_days_and_pages_by_time() -> TestResult {
    let f = fixture()?;
    apply(&f.store, 1, WEB_API)?;
    let old = now_unix() - ACTIVITY_RETENTION_SECS - 10;
    rusqlite::Connection::open(&f.path)?.execute(
        "INSERT INTO activity (at, action, origin, outcome) VALUES (?1, 'commit.apply', 'poll', 'succeeded')",
        [old],
    )?;
    assert_eq!(f.store.activity(0, 100)?.0.len(), 2);
    // The next write prunes what is past the retention.
    apply(&f.store, 2, "")?;
    let (rows, truncated) = f.store.activity(0, 100)?;
    assert!(!truncated);
    assert!(rows.iter().all(|row| row.at > old), "{rows:?}");
    let (page, truncated) = f.store.activity(0, 1)?;
    assert!(truncated);
    assert_eq!(page.len(), 1);
    assert_eq!(
        page[0].commit,
        Some(sha(2)),
        "the newest rows of the window"
    );
    assert!(f.store.activity(now_unix() + 60, 100)?.0.is_empty());
    Ok(())
}

#[test]
fn activity_outcomes_of_an_existing_state_db_read_back_as_written_and_an_unknown_one_is_kept()
-> TestResult {
    let f = fixture()?;
    // Every text rows were written with before the outcome was an enum, then one only a
    // newer agent would write.
    let texts = [
        "succeeded",
        "failed",
        "held",
        "requested",
        "started",
        "superseded",
        "halted",
        "progressing",
        "rolled-back",
        "paused-by-a-newer-agent",
    ];
    let connection = rusqlite::Connection::open(&f.path)?;
    for text in texts {
        connection.execute(
            "INSERT INTO activity (at, action, origin, outcome) VALUES (?1, 'rollout', 'agent', ?2)",
            rusqlite::params![now_unix(), text],
        )?;
    }
    let (rows, _) = f.store.activity(0, 100)?;
    let read: Vec<&str> = rows.iter().map(|row| row.outcome.as_str()).collect();
    assert_eq!(read, texts);
    assert_eq!(rows[0].outcome, ActivityOutcome::Succeeded);
    assert_eq!(rows[8].outcome, ActivityOutcome::RolledBack);
    assert_eq!(
        rows[9].outcome,
        ActivityOutcome::Unknown("paused-by-a-newer-agent".to_owned())
    );
    assert_eq!(
        serde_json::to_string(&rows.iter().map(|row| &row.outcome).collect::<Vec<_>>())?,
        serde_json::to_string(&texts)?,
        "the JSON is the stored text"
    );
    Ok(())
}

#[test]
fn approve_marks_only_held_commits_and_says_what_is_held() -> TestResult {
    use crate::manifest::triggers::{Held, TriggerState};
    let f = fixture()?;
    let held = TriggerState {
        path: ".voodu/web.yml".into(),
        name: "web".into(),
        applied: None,
        held: Some(Held {
            commit: sha(7),
            file: "web.hcl".into(),
            since: 1,
            approval: None,
        }),
        inactive: String::new(),
    };
    f.store.with(|connection| {
        let tx = connection.transaction()?;
        triggers::save_states(&tx, "", &[held], Some(&sha(7)))?;
        tx.commit()?;
        Ok(())
    })?;
    assert_eq!(f.store.trigger_base()?, Some(sha(7)));
    let refused = f
        .store
        .approve(&sha(8).to_string())
        .err()
        .map(|error| error.to_string());
    assert_eq!(
        refused.as_deref(),
        Some(&*format!(
            "no trigger holds a commit \"{}\" (held: {} (web)); see `voodu-agent status`",
            sha(8),
            sha(7).short()
        ))
    );
    assert!(f.store.approve("00000").is_err(), "a prefix needs 7 digits");
    assert!(!f.store.approvals_pending()?);
    let approved = f.store.approve(&sha(7).as_str()[..10])?;
    assert_eq!(approved[0].trigger, "web");
    assert!(f.store.approvals_pending()?);
    let states = f.store.trigger_states()?;
    assert!(
        states[0]
            .held
            .as_ref()
            .is_some_and(|held| held.approval.is_some())
    );
    Ok(())
}

/// An approval written while a sync decides a commit (a config change re-applying it, say)
/// survives that sync's rewrite of the triggers for the same held commit, so the next sync
/// applies it; one for a commit no longer held goes with its hold. (Seen as a lost approval:
/// `approve` said "applying it now" and nothing came.)
#[test]
fn an_approval_made_while_a_commit_is_decided_is_not_lost() -> TestResult {
    use crate::manifest::triggers::{Held, TriggerState};
    let f = fixture()?;
    let holding = |commit: CommitSha| TriggerState {
        path: ".voodu/web.yml".into(),
        name: "web".into(),
        applied: None,
        held: Some(Held {
            commit,
            file: "web.hcl".into(),
            since: 1,
            approval: None,
        }),
        inactive: String::new(),
    };
    let save = |state: TriggerState| {
        f.store.with(|connection| {
            let tx = connection.transaction()?;
            triggers::save_states(&tx, "", &[state], Some(&sha(9)))?;
            tx.commit()?;
            Ok(())
        })
    };
    save(holding(sha(7)))?;
    // The sync read the holds (no approval yet); the operator approves; the sync writes.
    let decided = holding(sha(7));
    f.store.approve(sha(7).as_str())?;
    save(decided)?;
    assert!(f.store.approvals_pending()?, "the approval was kept");
    // A newer push replaced the hold: the approval of the older commit goes with it.
    save(holding(sha(8)))?;
    assert!(!f.store.approvals_pending()?);
    Ok(())
}

/// What a resync reads (`desired_summaries`, no spec parsed where no autoscaler count
/// applies) agrees with the full read, also while the autoscaler's count is narrowed by a
/// commit; `desired_autoscaling` finds the autoscaled deployment and nothing else.
#[test]
fn summaries_and_the_autoscalers_read_agree_with_the_full_read() -> TestResult {
    let f = fixture()?;
    let agree = |store: &Store| -> TestResult {
        let full: Vec<(ResourceKey, String, usize)> = store
            .desired_all()?
            .into_iter()
            .map(|desired| {
                (
                    desired.key,
                    desired.spec_hash.to_string(),
                    desired.n_replicas,
                )
            })
            .collect();
        let summaries: Vec<(ResourceKey, String, usize)> = store
            .desired_summaries()?
            .into_iter()
            .map(|summary| {
                (
                    summary.key,
                    summary.spec_hash.to_string(),
                    summary.n_replicas,
                )
            })
            .collect();
        assert_eq!(summaries, full);
        Ok(())
    };
    let manifest = |max: u32| {
        format!(
            "deployment \"s\" \"web\" {{\n  image = \"busybox\"\n  autoscale {{\n    min = 2\n    max = {max}\n    cpu_target = 50\n  }}\n}}\ndeployment \"s\" \"api\" {{\n  image = \"busybox\"\n  replicas = 3\n  env = {{ NOTE = \"autoscale\" }}\n}}\n"
        )
    };
    apply(&f.store, 1, &manifest(5))?;
    agree(&f.store)?;
    f.store
        .set_replicas_override(&key("web"), 4, "mean CPU 90%")?;
    agree(&f.store)?;
    apply(&f.store, 2, &manifest(3))?;
    agree(&f.store)?;
    let autoscaled: Vec<ResourceKey> = f
        .store
        .desired_autoscaling()?
        .into_iter()
        .filter(|desired| super::desired::has_autoscale(&desired.spec))
        .map(|desired| desired.key)
        .collect();
    assert_eq!(autoscaled, [key("web")]);
    Ok(())
}
