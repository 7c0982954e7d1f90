//! Store tests: a real SQLite file in a temp dir, never faked. Manifests come from small inline
//! HCL through `manifest::load`, as the sync stage builds them.

use super::*;
use crate::manifest;
use crate::model::{Snapshot, SourceFile};

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
