//! Issue 23 item 5: a name that becomes a file name is bounded at parse, with its location,
//! and a file the host still cannot write rejects its commit instead of wedging the sync.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use voodu_agent::model::names::MAX_ASSET_KEY;
use voodu_agent::store::Store;
use voodu_agent::sync::{SyncOptions, SyncOutcome, Syncer};

use crate::support::{TempRepo, TestResult};

fn syncer(repo: &TempRepo, state: &Path, data_dir: &Path) -> TestResult<Syncer> {
    let store = Arc::new(Store::open(&state.join("state.db"))?);
    let source = voodu_agent::git::Source::new(
        voodu_agent::git::SourceOptions {
            url: repo.url(),
            branch: "main".into(),
            paths: Vec::new(),
            token_file: None,
            ..Default::default()
        },
        state,
    );
    Ok(Syncer::new(
        source,
        store,
        SyncOptions::new(data_dir.to_owned()),
    )?)
}

fn asset_with_key(key: &str) -> String {
    format!("asset \"shop\" \"conf\" {{\n  {key} = \"x\"\n}}\n")
}

/// Commits `text` as `conf.hcl` and syncs it: `Ok(None)` when applied, else the diagnostics.
fn commit_and_sync(
    repo: &TempRepo,
    syncer: &Syncer,
    text: &str,
) -> TestResult<Option<Vec<String>>> {
    repo.write("conf.hcl", text)?;
    let sha = repo.commit("conf")?;
    match syncer.sync_once(&AtomicBool::new(false))? {
        SyncOutcome::Applied { commit, .. } if commit.as_str() == sha => Ok(None),
        SyncOutcome::Rejected {
            commit,
            diagnostics,
        } if commit.as_str() == sha => Ok(Some(
            diagnostics.0.iter().map(ToString::to_string).collect(),
        )),
        other => Err(format!("unexpected {other:?}").into()),
    }
}

#[test]
fn a_long_asset_key_is_refused_at_its_line_and_one_at_the_limit_is_written() -> TestResult {
    let repo = TempRepo::new()?;
    let data = tempfile::tempdir()?;
    let syncer = syncer(&repo, data.path(), data.path())?;
    let long = "k".repeat(250);
    let got = commit_and_sync(&repo, &syncer, &asset_with_key(&long))?;
    assert_eq!(
        got,
        Some(vec![format!(
            "conf.hcl:2:3: asset key \"{}\"… is 250 bytes long, above the limit of {MAX_ASSET_KEY}: it becomes the file name of `<data-dir>/assets/<scope>/<name>/<key>`; shorten it",
            "k".repeat(32)
        )])
    );
    let at_limit = "k".repeat(MAX_ASSET_KEY);
    assert_eq!(
        commit_and_sync(&repo, &syncer, &asset_with_key(&at_limit))?,
        None
    );
    let file = data.path().join("assets/shop/conf").join(&at_limit);
    assert_eq!(std::fs::read(&file)?, b"x");
    Ok(())
}

/// Defence in depth: a data dir so deep that a valid key's path passes PATH_MAX (4096).
/// The write fails with ENAMETOOLONG; the commit is rejected at the asset's block and the
/// next commit applies (before, the sync failed on the same commit every second, forever).
#[test]
fn a_file_the_host_cannot_write_rejects_its_commit_and_the_next_one_applies() -> TestResult {
    let repo = TempRepo::new()?;
    let state = tempfile::tempdir()?;
    let mut deep = state.path().join("d");
    while deep.as_os_str().len() < 3950 {
        deep.push("d".repeat(200));
    }
    let syncer = syncer(&repo, state.path(), &deep)?;
    let key = "k".repeat(MAX_ASSET_KEY);
    let got = commit_and_sync(&repo, &syncer, &asset_with_key(&key))?.ok_or("applied")?;
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0]
            == format!(
                "conf.hcl:1:1: this host cannot write the files of asset/shop/conf: writing \"{}…\" under the assets directory: File name too long (os error 36); rename or shorten the key",
                "k".repeat(40)
            ),
        "{got:?}"
    );
    assert_eq!(
        commit_and_sync(
            &repo,
            &syncer,
            "asset \"shop\" \"conf\" {\n  k = \"x\"\n}\n"
        )?,
        None,
        "the next commit applies"
    );
    assert_eq!(std::fs::read(deep.join("assets/shop/conf/k"))?, b"x");
    Ok(())
}
