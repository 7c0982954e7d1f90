//! git + sync tests: real repos made with the `git` CLI (a bare remote and a working clone)
//! fetched over `file://` by the agent's gix source, synced into a real SQLite store.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use voodu_agent::git::{self, Source, SourceOptions};
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::store::Store;
use voodu_agent::sync::{Clock, SyncOptions, SyncOutcome, Syncer};

use crate::support::{TempRepo, TestResult};

fn options(url: String, paths: &[&str]) -> SourceOptions {
    SourceOptions {
        url,
        branch: "main".to_owned(),
        paths: paths.iter().map(|path| (*path).to_owned()).collect(),
        token_file: None,
        ..Default::default()
    }
}

/// A syncer on a fresh data dir, watching `paths` of the repo's `main`.
struct Agent {
    data: tempfile::TempDir,
    store: Arc<Store>,
    syncer: Syncer,
}

impl Agent {
    fn new(repo: &TempRepo, paths: &[&str]) -> TestResult<Agent> {
        Agent::with_clock(repo, paths, Clock::default())
    }

    /// `new` with the syncer reading `clock` (when fetches are recorded, windows).
    fn with_clock(repo: &TempRepo, paths: &[&str], clock: Clock) -> TestResult<Agent> {
        let data = tempfile::tempdir()?;
        let store = Arc::new(Store::open(&data.path().join("state.db"))?);
        let source = Source::new(options(repo.url(), paths), data.path());
        let mut sync_options = SyncOptions::new(data.path().to_owned());
        sync_options.clock = clock;
        let syncer = Syncer::new(source, Arc::clone(&store), sync_options)?;
        Ok(Agent {
            data,
            store,
            syncer,
        })
    }

    fn db(&self) -> PathBuf {
        self.data.path().join("state.db")
    }

    fn sync(&self) -> TestResult<SyncOutcome> {
        Ok(self.syncer.sync_once(&AtomicBool::new(false))?)
    }

    /// Syncs and expects the commit `sha` to be applied.
    fn sync_applied(&self, sha: &str) -> TestResult<voodu_agent::store::ApplySummary> {
        match self.sync()? {
            SyncOutcome::Applied {
                commit, summary, ..
            } if commit.as_str() == sha => Ok(summary),
            other => Err(format!("expected {sha} applied, got {other:?}").into()),
        }
    }

    /// Syncs and expects the commit `sha` to be rejected; returns its diagnostics as
    /// `path:line:col: message` lines.
    fn sync_rejected(&self, sha: &str) -> TestResult<Vec<String>> {
        match self.sync()? {
            SyncOutcome::Rejected {
                commit,
                diagnostics,
            } if commit.as_str() == sha => {
                Ok(diagnostics.0.iter().map(ToString::to_string).collect())
            }
            other => Err(format!("expected {sha} rejected, got {other:?}").into()),
        }
    }

    /// Desired keys as `kind/scope/name` strings.
    fn desired(&self) -> TestResult<Vec<String>> {
        Ok(self
            .store
            .desired_keys()?
            .iter()
            .map(ToString::to_string)
            .collect())
    }

    /// The journal as `OP key@generation` lines.
    fn journal(&self) -> TestResult<Vec<String>> {
        Ok(self
            .store
            .journal_after(0, usize::MAX)?
            .iter()
            .map(|entry| format!("{:?} {}@{}", entry.op, entry.key, entry.generation))
            .collect())
    }
}

fn deployment(name: &str) -> String {
    format!(
        r#"deployment "s" "{name}" {{
  image = "busybox"
}}
"#
    )
}

#[test]
fn first_fetch_mirrors_the_repo_and_resolves_the_branch() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &deployment("web"))?;
    let sha = repo.commit("web")?;
    let plain_path = repo.remote_path().display().to_string();
    for url in [repo.url(), plain_path] {
        let data = tempfile::tempdir()?;
        let source = Source::new(options(url.clone(), &[]), data.path());

        let fetched = source.fetch(&AtomicBool::new(false))?;

        assert_eq!(fetched.as_str(), sha, "{url}");
        let mirror = data.path().join("repo.git");
        assert!(
            mirror.join("HEAD").is_file(),
            "{url}: a mirror in the data dir"
        );
        assert_eq!(
            crate::support::repo::git(&mirror, &["rev-parse", "--is-bare-repository", "main"])?,
            format!("true\n{sha}"),
            "{url}: git reads the mirror as a bare repository at the fetched commit"
        );
        assert!(
            !mirror.join("hooks").exists() && !mirror.join("description").exists(),
            "{url}: no template files in the mirror"
        );
        let snapshot = source.read_snapshot(&fetched)?;
        let files: Vec<&str> = snapshot
            .files
            .iter()
            .map(|file| file.path.as_str())
            .collect();
        assert_eq!(files, ["web.hcl"], "{url}");
    }
    Ok(())
}

/// Issue 29: each file of a snapshot comes with its git blob id, and a read that reuses the
/// previous read's blobs gives what a fresh source reads.
#[test]
fn snapshots_carry_blob_ids_and_a_reused_read_equals_a_fresh_one() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("a.hcl", &deployment("a"))?;
    repo.write("b.hcl", &deployment("b"))?;
    repo.commit("one")?;
    let data = tempfile::tempdir()?;
    let source = Source::new(options(repo.url(), &[]), data.path());
    let first = source.fetch(&AtomicBool::new(false))?;
    source.read_snapshot_with_ids(&first)?;
    repo.write("b.hcl", &deployment("b2"))?;
    let sha = repo.commit("two")?;
    let second = source.fetch(&AtomicBool::new(false))?;
    let (snapshot, ids) = source.read_snapshot_with_ids(&second)?;
    let fresh = Source::new(options(repo.url(), &[]), data.path()).read_snapshot(&second)?;
    assert_eq!(snapshot, fresh);
    assert_eq!(
        String::from_utf8_lossy(&snapshot.files[1].contents),
        deployment("b2")
    );
    for (file, id) in snapshot.files.iter().zip(&ids) {
        let output = std::process::Command::new("git")
            .arg("-C")
            .arg(repo.work())
            .args(["rev-parse", &format!("{sha}:{}", file.path)])
            .output()?;
        let expected = String::from_utf8(output.stdout)?;
        let id = id.as_ref().map(ToString::to_string);
        assert_eq!(id.as_deref(), Some(expected.trim()), "{}", file.path);
    }
    Ok(())
}

#[test]
fn unchanged_poll_neither_walks_the_tree_nor_writes_the_store() -> TestResult {
    let (repo, agent, sha, now) = web_applied_on_test_clock()?;
    // A second connection reads every row of every table, and SQLite's `data_version`, which
    // moves at any other connection's commit. The fetch's health row is written again only
    // once its refresh is due (30 s), so a poll 29 s later writes nothing at all.
    now.fetch_add(29, Ordering::Relaxed);
    let probe = rusqlite::Connection::open(agent.db())?;
    let data_version = || probe.query_row("PRAGMA data_version", [], |row| row.get::<_, i64>(0));
    let store_rows = || -> rusqlite::Result<String> {
        let tables: Vec<String> = probe
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")?
            .query_map([], |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let mut dump = String::new();
        for table in tables {
            let mut statement = probe.prepare(&format!("SELECT * FROM \"{table}\""))?;
            let columns = statement.column_count();
            let mut rows = statement.query([])?;
            while let Some(row) = rows.next()? {
                dump.push_str(&table);
                for index in 0..columns {
                    dump.push_str(&format!(" {:?}", row.get_ref(index)?));
                }
                dump.push('\n');
            }
        }
        Ok(dump)
    };
    let commit_rows = || {
        probe.query_row("SELECT COUNT(*) FROM commits", [], |row| {
            row.get::<_, i64>(0)
        })
    };
    let (version_before, commits_before) = (store_rows()?, commit_rows()?);
    let data_version_before = data_version()?;
    let tree_reads_before = agent.syncer.source().tree_reads();

    let outcome = agent.sync()?;

    match outcome {
        SyncOutcome::Unchanged(commit) => assert_eq!(commit.as_str(), sha),
        other => return Err(format!("expected Unchanged, got {other:?}").into()),
    }
    assert_eq!(
        agent.syncer.source().tree_reads(),
        tree_reads_before,
        "no tree walk"
    );
    assert_eq!(store_rows()?, version_before, "no store write");
    assert_eq!(
        data_version()?,
        data_version_before,
        "no commit of any table"
    );
    assert_eq!(commit_rows()?, commits_before, "no commit recorded");

    // Control: the same probe does see the store's writes, so the checks above can fail.
    repo.write("api.hcl", &deployment("api"))?;
    let next = repo.commit("api")?;
    agent.sync_applied(&next)?;
    assert_eq!(agent.syncer.source().tree_reads(), tree_reads_before + 1);
    assert_ne!(
        store_rows()?,
        version_before,
        "the probe sees a store write"
    );
    assert_ne!(
        data_version()?,
        data_version_before,
        "the probe sees a commit"
    );
    assert_eq!(commit_rows()?, commits_before + 1);
    Ok(())
}

/// A repository with one deployment, applied by an agent reading `test_clock`.
fn web_applied_on_test_clock() -> TestResult<(TempRepo, Agent, String, Arc<AtomicI64>)> {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &deployment("web"))?;
    let sha = repo.commit("web")?;
    let (clock, now) = test_clock();
    let agent = Agent::with_clock(&repo, &[], clock)?;
    agent.sync_applied(&sha)?;
    Ok((repo, agent, sha, now))
}

/// A clock at a fixed time that the test moves on.
fn test_clock() -> (Clock, Arc<AtomicI64>) {
    let now = Arc::new(AtomicI64::new(1_800_000_000));
    let read = Arc::clone(&now);
    (Clock::new(move || read.load(Ordering::Relaxed)), now)
}

/// The fetch's health row is not refreshed by each unchanged poll, only every 30 s, but a
/// failure is written by the poll that meets it, and the success after it by the poll that
/// meets that.
#[test]
fn a_failed_fetch_and_the_recovery_after_it_are_written_at_once() -> TestResult {
    let (repo, agent, _, now) = web_applied_on_test_clock()?;
    let fetch = || -> TestResult<voodu_agent::store::Health> {
        Ok(agent.store.health("fetch")?.ok_or("no fetch health row")?)
    };
    let first = fetch()?;
    assert!(first.is_ok(), "{first:?}");

    now.fetch_add(1, Ordering::Relaxed);
    assert!(matches!(agent.sync()?, SyncOutcome::Unchanged(_)));
    assert_eq!(fetch()?, first, "a success after a success is not written");

    let moved = repo.root().join("moved.git");
    std::fs::rename(repo.remote_path(), &moved)?;
    assert!(agent.sync().is_err(), "a missing remote fails the sync");
    let failed = fetch()?;
    assert!(
        !failed.is_ok(),
        "the failure is recorded at once: {failed:?}"
    );
    assert_eq!(failed.last_success_at, first.last_success_at);

    std::fs::rename(&moved, repo.remote_path())?;
    now.fetch_add(1, Ordering::Relaxed);
    assert!(matches!(agent.sync()?, SyncOutcome::Unchanged(_)));
    let recovered = fetch()?;
    assert!(
        recovered.is_ok(),
        "the recovery is recorded at once: {recovered:?}"
    );
    assert!(
        recovered.last_success_at > first.last_success_at,
        "{recovered:?} after {first:?}"
    );

    // Refreshed once its 30 s are up, not before.
    now.fetch_add(29, Ordering::Relaxed);
    agent.sync()?;
    assert_eq!(fetch()?, recovered);
    now.fetch_add(1, Ordering::Relaxed);
    agent.sync()?;
    let refreshed = fetch()?;
    assert!(
        refreshed.last_success_at > recovered.last_success_at,
        "{refreshed:?} after {recovered:?}"
    );
    Ok(())
}

/// An unchanged poll of a repository on this host reads its branch and the mirror's from their
/// ref files, without negotiating (no `git upload-pack`); a moved branch, refs packed by `git
/// gc`, a mirror started again and a deleted branch are still seen by negotiating.
#[test]
fn an_unchanged_local_poll_reads_refs_without_negotiating() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &deployment("web"))?;
    let first = repo.commit("web")?;
    let agent = Agent::new(&repo, &[])?;
    agent.sync_applied(&first)?;
    let source = agent.syncer.source();
    let interrupt = AtomicBool::new(false);
    let negotiated = source.negotiations();
    assert_eq!(negotiated, 1);
    assert_eq!(source.fetch(&interrupt)?.as_str(), first);
    assert!(matches!(agent.sync()?, SyncOutcome::Unchanged(_)));
    assert_eq!(
        source.negotiations(),
        negotiated,
        "unchanged: no negotiation"
    );

    repo.write("api.hcl", &deployment("api"))?;
    let second = repo.commit("api")?;
    agent.sync_applied(&second)?;
    assert_eq!(source.negotiations(), negotiated + 1, "moved: negotiated");
    assert_eq!(source.fetch(&interrupt)?.as_str(), second);
    assert_eq!(source.negotiations(), negotiated + 1);

    // Refs packed on the remote's side are read from `packed-refs`.
    crate::support::repo::git(&repo.remote_path(), &["pack-refs", "--all"])?;
    assert!(!repo.remote_path().join("refs/heads/main").exists());
    assert_eq!(source.fetch(&interrupt)?.as_str(), second);
    assert_eq!(
        source.negotiations(),
        negotiated + 1,
        "packed: no negotiation"
    );

    // A mirror started again (its branch gone) negotiates, and brings the commit back.
    let mirror = agent.data.path().join("repo.git");
    std::fs::remove_dir_all(&mirror)?;
    assert_eq!(source.fetch(&interrupt)?.as_str(), second);
    assert_eq!(
        source.negotiations(),
        negotiated + 2,
        "no mirror: negotiated"
    );
    assert!(mirror.join("refs/heads/main").exists());

    // A deleted branch is not found, as a negotiation says.
    crate::support::repo::git(
        &repo.remote_path(),
        &["update-ref", "-d", "refs/heads/main"],
    )?;
    let error = source.fetch(&interrupt).expect_err("the branch is gone");
    assert!(
        matches!(error, git::Error::BranchNotFound { .. }),
        "{error}"
    );
    assert_eq!(source.negotiations(), negotiated + 3);
    Ok(())
}

/// A poll sweep's check (`poll_without_fetch`) answers only what a sync would have found
/// unchanged from the ref files: nothing before the first sync, the commit after it, and
/// nothing once the branch moves or a config bucket changes; a sync then brings it back. It
/// never negotiates. (A sync in flight: `sync.rs`'s own test.)
#[test]
fn a_sweep_answers_an_unchanged_local_poll_and_leaves_anything_new_to_a_sync() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &deployment("web"))?;
    let first = repo.commit("web")?;
    let agent = Agent::new(&repo, &[])?;
    let answer = || -> TestResult<Option<String>> {
        Ok(agent
            .syncer
            .poll_without_fetch()?
            .map(|commit| commit.as_str().to_owned()))
    };
    assert_eq!(answer()?, None, "never negotiated: a sync must fetch");
    agent.sync_applied(&first)?;
    let negotiated = agent.syncer.source().negotiations();
    assert_eq!(answer()?.as_deref(), Some(first.as_str()));
    assert_eq!(answer()?.as_deref(), Some(first.as_str()));
    assert_eq!(agent.syncer.source().negotiations(), negotiated);

    repo.write("api.hcl", &deployment("api"))?;
    let second = repo.commit("api")?;
    assert_eq!(answer()?, None, "the branch moved");
    agent.sync_applied(&second)?;
    assert_eq!(answer()?.as_deref(), Some(second.as_str()));

    agent
        .store
        .config_set("s", "web", &[("TAG".to_owned(), "1.0".to_owned())].into())?;
    assert_eq!(answer()?, None, "a bucket changed");
    agent.sync_applied(&second)?;
    assert_eq!(answer()?.as_deref(), Some(second.as_str()));
    assert_eq!(
        agent.syncer.source().negotiations(),
        negotiated + 1,
        "only the moved branch negotiated"
    );
    Ok(())
}

#[test]
fn a_new_commit_is_detected_and_applied() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &deployment("web"))?;
    let first = repo.commit("web")?;
    let agent = Agent::new(&repo, &[])?;
    agent.sync_applied(&first)?;

    repo.write("api.hcl", &deployment("api"))?;
    let second = repo.commit("api")?;
    let summary = agent.sync_applied(&second)?;

    assert_eq!(
        summary.puts,
        [ResourceKey::new(Kind::Deployment, "s", "api")]
    );
    assert_eq!(
        agent.journal()?,
        ["Put deployment/s/web@1", "Put deployment/s/api@1"]
    );
    Ok(())
}

#[test]
fn a_force_push_to_unrelated_history_is_applied() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &deployment("web"))?;
    let first = repo.commit("web")?;
    let agent = Agent::new(&repo, &[])?;
    agent.sync_applied(&first)?;

    repo.git(&["checkout", "-q", "--orphan", "rewrite"])?;
    repo.remove("web.hcl")?;
    repo.write("api.hcl", &deployment("api"))?;
    let rewritten = repo.commit("unrelated history")?;
    assert!(
        repo.git(&["merge-base", &first, &rewritten]).is_err(),
        "the histories share nothing"
    );

    agent.sync_applied(&rewritten)?;

    assert_eq!(agent.desired()?, ["deployment/s/api"]);
    assert_eq!(
        agent.journal()?,
        [
            "Put deployment/s/web@1",
            "Put deployment/s/api@1",
            "Delete deployment/s/web@2"
        ]
    );
    Ok(())
}

#[test]
fn only_manifests_under_the_watched_paths_are_read() -> TestResult {
    const BROKEN: &str = r#"deployment "s" "broken" {
"#;
    // (path, contents, read?)
    let files: &[(&str, &str, bool)] = &[
        ("deploy/web.hcl", &deployment("web"), true),
        ("deploy/sub/db.voodu", &deployment("db"), true),
        ("deploy/notes.txt", BROKEN, false),
        ("deploy/README.md", BROKEN, false),
        ("deploy-old/broken.hcl", BROKEN, false),
        ("other/api.hcl", &deployment("api"), false),
        ("other/broken.hcl", BROKEN, false),
        ("root.hcl", &deployment("root"), false),
    ];
    let repo = TempRepo::new()?;
    for (path, contents, _) in files {
        repo.write(path, contents)?;
    }
    let sha = repo.commit("mixed tree")?;
    let agent = Agent::new(&repo, &["deploy/"])?;

    agent.sync_applied(&sha)?;

    assert_eq!(agent.desired()?, ["deployment/s/db", "deployment/s/web"]);
    let snapshot = agent
        .syncer
        .source()
        .read_snapshot(&voodu_agent::model::CommitSha::new(sha))?;
    let read: Vec<&str> = snapshot
        .files
        .iter()
        .map(|file| file.path.as_str())
        .collect();
    let mut expected: Vec<&str> = files
        .iter()
        .filter(|file| file.2)
        .map(|file| file.0)
        .collect();
    expected.sort_unstable();
    assert_eq!(read, expected);
    Ok(())
}

#[test]
fn a_symlinked_manifest_rejects_the_commit() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("real/web.hcl", &deployment("web"))?;
    std::os::unix::fs::symlink("real/web.hcl", repo.work().join("link.hcl"))?;
    let sha = repo.commit("symlinked manifest")?;
    let agent = Agent::new(&repo, &[])?;

    let diagnostics = agent.sync_rejected(&sha)?;

    assert_eq!(
        diagnostics,
        ["link.hcl:1:1: manifest is a symlink; manifests must be regular files in the repo"]
    );
    assert!(agent.desired()?.is_empty());
    Ok(())
}

#[test]
fn a_broken_commit_leaves_the_store_as_the_good_one_left_it() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &deployment("web"))?;
    let good = repo.commit("good")?;
    let agent = Agent::new(&repo, &[])?;
    agent.sync_applied(&good)?;
    let (desired_before, journal_before) = (agent.desired()?, agent.journal()?);

    repo.write(
        "api.hcl",
        r#"deployment "s" "api" {
  image = 
}
"#,
    )?;
    repo.remove("web.hcl")?;
    let broken = repo.commit("broken")?;
    let diagnostics = agent.sync_rejected(&broken)?;

    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    assert!(
        diagnostics[0].starts_with("api.hcl:2:11: HCL syntax error"),
        "{diagnostics:?}"
    );
    assert_eq!(agent.desired()?, desired_before);
    assert_eq!(agent.journal()?, journal_before);
    let commits = agent.store.commit_summary()?;
    assert_eq!(
        commits.last_applied.map(|record| record.sha.to_string()),
        Some(good)
    );
    assert_eq!(
        commits.last_rejected.map(|record| record.sha.to_string()),
        Some(broken)
    );

    repo.write("api.hcl", &deployment("api"))?;
    let fixed = repo.commit("fixed")?;
    agent.sync_applied(&fixed)?;
    assert_eq!(agent.desired()?, ["deployment/s/api"]);
    Ok(())
}

#[test]
fn a_missing_branch_is_branch_not_found() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &deployment("web"))?;
    repo.commit("web")?;
    let data = tempfile::tempdir()?;
    let source = Source::new(
        SourceOptions {
            branch: "does-not-exist".to_owned(),
            ..options(repo.url(), &[])
        },
        data.path(),
    );

    match source.fetch(&AtomicBool::new(false)) {
        Err(git::Error::BranchNotFound { branch, .. }) => assert_eq!(branch, "does-not-exist"),
        other => return Err(format!("expected BranchNotFound, got {other:?}").into()),
    }
    Ok(())
}

#[test]
fn a_watched_path_missing_from_the_commit_rejects_it_instead_of_pruning_everything() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("deploy/web.hcl", &deployment("web"))?;
    let good = repo.commit("web")?;
    let agent = Agent::new(&repo, &["./deploy/"])?;
    agent.sync_applied(&good)?;
    assert_eq!(
        agent.desired()?,
        ["deployment/s/web"],
        "`./deploy/` means `deploy`"
    );

    repo.git(&["mv", "deploy", "deploy-v2"])?;
    let moved = repo.commit("rename the watched folder")?;
    let errors = agent.sync_rejected(&moved)?;
    assert_eq!(
        errors,
        [
            "deploy:1:1: watched --path does not exist in this commit; check --path (nothing was applied)"
        ]
    );
    assert_eq!(agent.desired()?, ["deployment/s/web"], "nothing was pruned");
    Ok(())
}

/// `${VAR}` resolves from the config bucket a block reads; a bucket change re-applies the
/// same commit (no new commit needed), and a poll with neither a new commit nor a bucket
/// change stays a no-op.
#[test]
fn variables_come_from_config_buckets_and_a_bucket_change_reapplies_the_commit() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write(
        "web.hcl",
        r#"deployment "prod" "web" {
  image = "busybox:${TAG}"
  env_from = ["shared"]
}
"#,
    )?;
    let sha = repo.commit("web")?;
    let agent = Agent::new(&repo, &[])?;
    let errors = agent.sync_rejected(&sha)?;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("web.hcl:2:20: undefined variable `TAG`"),
        "{errors:?}"
    );
    assert!(
        agent.desired()?.is_empty(),
        "a rejected commit reaches nothing"
    );

    agent
        .store
        .config_set("shared", "", &[("TAG".to_owned(), "1.0".to_owned())].into())?;
    agent.sync_applied(&sha)?;
    let image = |agent: &Agent| -> TestResult<String> {
        let key = voodu_agent::model::ResourceKey::new(
            voodu_agent::model::Kind::Deployment,
            "prod",
            "web",
        );
        match agent.store.desired(&key)?.map(|desired| desired.spec) {
            Some(voodu_agent::manifest::spec::Spec::Deployment(spec)) => Ok(spec.container.image),
            other => Err(format!("no deployment: {other:?}").into()),
        }
    };
    assert_eq!(image(&agent)?, "busybox:1.0");

    // The block's own app bucket wins over the env_from bucket.
    agent.store.config_set(
        "prod",
        "web",
        &[("TAG".to_owned(), "2.0".to_owned())].into(),
    )?;
    agent.sync_applied(&sha)?;
    assert_eq!(image(&agent)?, "busybox:2.0");
    assert!(matches!(agent.sync()?, SyncOutcome::Unchanged(_)));
    Ok(())
}

/// Assets land under the data dir only once a commit is accepted; a rejected commit leaves
/// the previous files alone; an asset removed from the repo has its files cleaned.
#[test]
fn assets_are_written_for_accepted_commits_only_and_cleaned_when_removed() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("conf/app.conf", "v1\n")?;
    repo.write(
        "deploy/app.hcl",
        r#"asset "prod" "cfg" {
  conf = file("../conf/app.conf")
  motd = "hello"
}
deployment "prod" "web" {
  image = "busybox"
  volumes = ["${asset.prod.cfg.conf}:/etc/app.conf:ro"]
}
"#,
    )?;
    let first = repo.commit("asset")?;
    let agent = Agent::new(&repo, &["deploy"])?;
    agent.sync_applied(&first)?;
    let conf = agent.data.path().join("assets/prod/cfg/conf");
    assert_eq!(std::fs::read_to_string(&conf)?, "v1\n");
    assert_eq!(
        std::fs::read_to_string(agent.data.path().join("assets/prod/cfg/motd"))?,
        "hello"
    );

    // A commit that changes the file but breaks elsewhere changes nothing on the host.
    repo.write("conf/app.conf", "v2\n")?;
    repo.write(
        "deploy/broken.hcl",
        r#"deployment "prod" "x" {
  imagee = "y"
}
"#,
    )?;
    let broken = repo.commit("broken")?;
    agent.sync_rejected(&broken)?;
    assert_eq!(std::fs::read_to_string(&conf)?, "v1\n");

    repo.remove("deploy/broken.hcl")?;
    let fixed = repo.commit("fixed")?;
    agent.sync_applied(&fixed)?;
    assert_eq!(std::fs::read_to_string(&conf)?, "v2\n");

    repo.write(
        "deploy/app.hcl",
        r#"deployment "prod" "web" {
  image = "busybox"
}
"#,
    )?;
    let removed = repo.commit("no asset")?;
    agent.sync_applied(&removed)?;
    assert!(
        !agent.data.path().join("assets/prod").exists(),
        "files of a removed asset are cleaned"
    );
    Ok(())
}

/// Truncates the loose object of `rev` in the bare repository `git_dir` to its first 64 bytes:
/// its header (type and size) still reads, its content no longer does.
fn cut_loose_object(git_dir: &std::path::Path, rev: &str) -> TestResult<String> {
    let id = crate::support::repo::git(git_dir, &["rev-parse", rev])?;
    let path = git_dir.join("objects").join(&id[..2]).join(&id[2..]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)?
        .set_len(64)?;
    Ok(id)
}

/// Issue 23, item 6: a blob's size comes from its object header, before any content. The
/// oversized blobs here are cut short in the mirror (`cut_loose_object`): reading their
/// content fails, so a refusal that names their full size proves it was told from the header
/// alone, and nothing read them.
#[test]
fn oversized_blobs_are_refused_from_their_header_without_reading_them() -> TestResult {
    use voodu_agent::manifest::{self, LoadOptions};
    use voodu_agent::model::{
        FileRead, FileSize, FileSource, MAX_MANIFEST_BYTES, MAX_TRIGGER_FILE_BYTES,
    };

    let repo = TempRepo::new()?;
    repo.write(
        "app.hcl",
        "asset \"s\" \"big\" {\n  k = file(\"big.bin\")\n}\n",
    )?;
    repo.write("big.bin", &"x".repeat(5_000_000))?;
    repo.write(
        "huge.hcl",
        &"#\n".repeat(MAX_MANIFEST_BYTES as usize / 2 + 1),
    )?;
    repo.write(
        ".voodu/deploy.yml",
        &"#\n".repeat(MAX_TRIGGER_FILE_BYTES as usize / 2 + 1),
    )?;
    let sha = repo.commit("three oversized blobs")?;
    let data = tempfile::tempdir()?;
    let mirror = data.path().join("repo.git");
    crate::support::repo::git(
        repo.root(),
        &[
            "clone",
            "-q",
            "--template=",
            "--bare",
            "--local",
            &repo.work().display().to_string(),
            &mirror.display().to_string(),
        ],
    )?;
    for rev in ["HEAD:big.bin", "HEAD:huge.hcl", "HEAD:.voodu/deploy.yml"] {
        let id = cut_loose_object(&mirror, rev)?;
        // The header reads, the content does not: a read of it would fail.
        assert!(crate::support::repo::git(&mirror, &["cat-file", "-s", &id]).is_ok());
        assert!(
            crate::support::repo::git(&mirror, &["cat-file", "blob", &id]).is_err(),
            "{rev} must be unreadable"
        );
    }
    // The mirror is there already: nothing is fetched.
    let source = Source::new(options(repo.url(), &[]), data.path());
    let sha = voodu_agent::model::CommitSha::new(sha);

    let snapshot = source.read_snapshot(&sha)?;
    let read: Vec<&str> = snapshot
        .files
        .iter()
        .map(|file| file.path.as_str())
        .collect();
    assert_eq!(read, ["app.hcl"]);
    assert_eq!(
        snapshot.refused,
        [(
            "huge.hcl".to_owned(),
            "manifest is 8388610 bytes; at most 8388608 bytes are read (split it into several files)"
                .to_owned()
        )]
    );
    let (triggers, refused) = source.read_trigger_files(&sha)?;
    assert!(triggers.is_empty());
    assert_eq!(
        refused,
        [(
            ".voodu/deploy.yml".to_owned(),
            "trigger file is 65538 bytes; at most 65536 are read".to_owned()
        )]
    );

    let files = source.files_at(&sha)?;
    assert_eq!(
        files.read("big.bin", 1024 * 1024),
        FileRead::TooLarge(FileSize::Exact(5_000_000))
    );
    // Allowed to read it, the reader finds the content cut: the refusal above never got there.
    assert!(
        matches!(files.read("big.bin", 5_000_000), FileRead::Error(_)),
        "{:?}",
        files.read("big.bin", 5_000_000)
    );

    let load = LoadOptions {
        files: &files,
        ..LoadOptions::standalone()
    };
    let snapshot = voodu_agent::model::Snapshot {
        refused: Vec::new(),
        ..snapshot
    };
    let diagnostics = manifest::load(&snapshot, &load).expect_err("file() over the limit");
    assert_eq!(
        diagnostics.to_string(),
        "app.hcl:2:7: file(): \"big.bin\" is 5000000 bytes; the limit is 1048576 bytes (--max-file-size)"
    );
    Ok(())
}

/// Whether the mirror under `data` holds the blob at `rev` of the repo's work tree.
fn mirror_has(repo: &TempRepo, data: &std::path::Path, rev: &str) -> TestResult<bool> {
    let id = crate::support::repo::git(&repo.work(), &["rev-parse", rev])?;
    let mirror = gix::open(data.join("repo.git"))?;
    Ok(mirror.has_object(gix::ObjectId::from_hex(id.trim().as_bytes())?))
}

/// The same refusals through a real fetch and sync: the commit is rejected with each path.
/// Issue 29: the fetch asks for no blob over what a reader reads (here a manifest's 8 MiB,
/// above `--max-file-size`), so the unreferenced 9 MB blob, the 9 MB one `file()` names and
/// the oversized manifest never reach the mirror, and their refusals say "at least"; a blob
/// under that (over `--max-file-size`) is fetched and refused with its size.
#[test]
fn oversized_files_reject_the_commit_and_blobs_no_reader_reads_are_not_fetched() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write(
        "app.hcl",
        "asset \"s\" \"big\" {\n  k = file(\"big.bin\")\n  l = file(\"small.bin\")\n}\n",
    )?;
    repo.write("big.bin", &"x".repeat(9_000_000))?;
    repo.write("unread.bin", &"y".repeat(9_000_000))?;
    repo.write("small.bin", &"z".repeat(1024 * 1024 + 1))?;
    repo.write(
        "huge.hcl",
        &"#\n".repeat(voodu_agent::model::MAX_MANIFEST_BYTES as usize / 2 + 1),
    )?;
    let sha = repo.commit("oversized")?;
    let agent = Agent::new(&repo, &[])?;

    let diagnostics = agent.sync_rejected(&sha)?;

    let limit = voodu_agent::model::MAX_MANIFEST_BYTES + 1;
    assert_eq!(
        diagnostics,
        [
            format!(
                "app.hcl:2:7: file(): \"big.bin\" is at least {limit} bytes (the agent does not fetch blobs this large); the limit is 1048576 bytes (--max-file-size)"
            ),
            "app.hcl:3:7: file(): \"small.bin\" is 1048577 bytes; the limit is 1048576 bytes (--max-file-size)".to_owned(),
            format!(
                "huge.hcl:1:1: manifest is at least {limit} bytes (the agent does not fetch blobs this large); at most 8388608 bytes are read (split it into several files)"
            ),
        ]
    );
    assert!(agent.desired()?.is_empty());
    for rev in ["HEAD:big.bin", "HEAD:unread.bin", "HEAD:huge.hcl"] {
        assert!(!mirror_has(&repo, agent.data.path(), rev)?, "{rev} fetched");
    }
    // Under the limit, a blob comes as before (over --max-file-size, yet a manifest's size).
    assert!(mirror_has(&repo, agent.data.path(), "HEAD:small.bin")?);
    assert_eq!(
        std::fs::read_to_string(agent.data.path().join("repo.git/blob-limit"))?,
        format!("{limit}\n")
    );
    Ok(())
}

/// A file shrunk below the limit: git sends it as a change against its earlier, larger
/// version (a thin pack), which the mirror left out, so the pack cannot be indexed. The
/// source fetches the mirror anew (no commit there, so no change against a left-out blob)
/// and the commit arrives.
#[test]
fn a_file_shrunk_below_the_limit_arrives_though_sent_as_a_change_to_a_left_out_blob() -> TestResult
{
    // Incompressible bytes, so git's delta is what makes the shrunk file small on the wire.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut large = Vec::with_capacity(9_000_000);
    while large.len() < 9_000_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        large.extend_from_slice(&state.to_le_bytes());
    }
    let repo = TempRepo::new()?;
    repo.write("app.hcl", &deployment("web"))?;
    std::fs::write(repo.work().join("big.bin"), &large)?;
    let first = repo.commit("a large file")?;
    let data = tempfile::tempdir()?;
    let source = Source::new(options(repo.url(), &[]), data.path());
    assert_eq!(source.fetch(&AtomicBool::new(false))?.as_str(), first);
    assert!(!mirror_has(&repo, data.path(), "HEAD:big.bin")?);

    large.truncate(7_000_000);
    std::fs::write(repo.work().join("big.bin"), &large)?;
    let second = repo.commit("the file shrunk below the limit")?;

    assert_eq!(source.fetch(&AtomicBool::new(false))?.as_str(), second);
    assert!(mirror_has(&repo, data.path(), "HEAD:big.bin")?);
    Ok(())
}

/// Raising `--max-file-size` over what the mirror left out starts the mirror again, whole up
/// to the new limit; a reader of smaller files after it fetches with the larger limit, so
/// the mirror does not shrink back and refetch in turn.
#[test]
fn a_larger_max_file_size_fetches_the_blobs_the_mirror_left_out() -> TestResult {
    use voodu_agent::model::{FileRead, FileSize, FileSource};
    let repo = TempRepo::new()?;
    repo.write("app.hcl", &deployment("web"))?;
    repo.write("big.bin", &"x".repeat(9_000_000))?;
    let first = voodu_agent::model::CommitSha::new(repo.commit("a large file")?);
    let data = tempfile::tempdir()?;
    let fetch = |max_file_bytes: u64| -> TestResult<voodu_agent::model::CommitSha> {
        let source = Source::new(
            SourceOptions {
                max_file_bytes,
                ..options(repo.url(), &[])
            },
            data.path(),
        );
        Ok(source.fetch(&AtomicBool::new(false))?)
    };
    let read = |max_bytes: u64| -> TestResult<FileRead> {
        let source = Source::new(options(repo.url(), &[]), data.path());
        Ok(source.files_at(&first)?.read("big.bin", max_bytes))
    };

    assert_eq!(fetch(0)?, first);
    assert!(!mirror_has(&repo, data.path(), "HEAD:big.bin")?);
    let limit = voodu_agent::model::MAX_MANIFEST_BYTES + 1;
    assert_eq!(
        read(10_000_000)?,
        FileRead::TooLarge(FileSize::AtLeast(limit))
    );

    assert_eq!(fetch(10_000_000)?, first);
    assert!(matches!(read(10_000_000)?, FileRead::File(bytes) if bytes.len() == 9_000_000));
    assert_eq!(
        std::fs::read_to_string(data.path().join("repo.git/blob-limit"))?,
        "10000001\n"
    );

    repo.write("other.bin", &"y".repeat(9_500_000))?;
    let second = repo.commit("another large file")?;
    assert_eq!(fetch(0)?.as_str(), second);
    assert!(mirror_has(&repo, data.path(), "HEAD:other.bin")?);
    assert_eq!(
        std::fs::read_to_string(data.path().join("repo.git/blob-limit"))?,
        "10000001\n"
    );
    Ok(())
}
