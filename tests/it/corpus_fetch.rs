//! `scripts/fetch-corpus` (issue 25): voodu's examples fetched at a pinned commit into a cache
//! outside the work tree, verified by commit id and laid out as `voodu-examples/`. Against a
//! local upstream only (a bare repository in a temp dir, `VOODU_CORPUS_URL`): no test here
//! contacts any other address.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::{TempRepo, TestResult};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch-corpus")
}

/// Runs the script with the cache under `cache`, the upstream `url` and the commit asked.
fn fetch(cache: &Path, url: &str, commit: &str) -> TestResult<Output> {
    Ok(Command::new("bash")
        .arg(script())
        .env("XDG_CACHE_HOME", cache)
        .env("VOODU_CORPUS_URL", url)
        .env("VOODU_CORPUS_COMMIT", commit)
        // Local transports only, whatever the URL says.
        .env("GIT_ALLOW_PROTOCOL", "file")
        .output()?)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// An upstream whose `examples/` holds two sets, and a file outside it.
fn upstream() -> TestResult<(TempRepo, String)> {
    let repo = TempRepo::new()?;
    repo.write("examples/app/web.hcl", "deployment \"s\" \"web\" {}\n")?
        .write("examples/ingress/README.md", "notes\n")?
        .write("src/main.go", "package main\n")?;
    let commit = repo.commit("examples")?;
    Ok((repo, commit))
}

#[test]
fn the_pinned_commit_is_fetched_into_the_cache_and_laid_out_as_voodu_examples() -> TestResult {
    let (repo, commit) = upstream()?;
    let cache = tempfile::tempdir()?;
    let output = fetch(cache.path(), &repo.url(), &commit)?;
    assert!(output.status.success(), "{}", stderr(&output));
    let dir = PathBuf::from(String::from_utf8(output.stdout.clone())?.trim());
    assert_eq!(
        dir,
        cache.path().join("voodu-agent/corpus").join(&commit),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("voodu-examples/app/web.hcl"))?,
        "deployment \"s\" \"web\" {}\n"
    );
    assert!(dir.join("voodu-examples/ingress/README.md").is_file());
    assert!(!dir.join("src").exists(), "only examples/ is laid out");
    assert_eq!(
        std::fs::read_to_string(dir.join("COMMIT"))?.trim(),
        commit.as_str()
    );
    // A second run reads the cache: with the upstream gone it still answers.
    std::fs::remove_dir_all(repo.remote_path())?;
    let again = fetch(cache.path(), &repo.url(), &commit)?;
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(PathBuf::from(String::from_utf8(again.stdout)?.trim()), dir);
    Ok(())
}

#[test]
fn a_commit_the_upstream_does_not_have_is_refused_and_nothing_is_cached() -> TestResult {
    let (repo, commit) = upstream()?;
    let cache = tempfile::tempdir()?;
    // Well formed, but not upstream's: the pinned id of docs/voodu-format.md.
    let wrong = "513408025ef3a3c660fdb4d957f39f5f4bb7c18d";
    assert_ne!(wrong, commit);
    let output = fetch(cache.path(), &repo.url(), wrong)?;
    assert!(!output.status.success(), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(&format!("could not fetch {wrong}")),
        "{}",
        stderr(&output)
    );
    assert!(output.stdout.is_empty());
    let corpus = cache.path().join("voodu-agent/corpus");
    let left: Vec<_> = std::fs::read_dir(&corpus)?.collect();
    assert!(left.is_empty(), "left in the cache: {left:?}");
    Ok(())
}

#[test]
fn a_branch_name_or_a_short_id_is_refused_before_any_fetch() -> TestResult {
    let (repo, commit) = upstream()?;
    let cache = tempfile::tempdir()?;
    for asked in ["main", &commit[..12], &commit.to_uppercase()] {
        let output = fetch(cache.path(), &repo.url(), asked)?;
        assert_eq!(
            output.status.code(),
            Some(2),
            "{asked}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains("is not a full 40-hex commit id"),
            "{}",
            stderr(&output)
        );
    }
    assert!(!cache.path().join("voodu-agent").exists());
    Ok(())
}

#[test]
fn the_script_pins_the_commit_docs_voodu_format_names() -> TestResult {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(root.join("scripts/fetch-corpus"))?;
    let docs = std::fs::read_to_string(root.join("docs/voodu-format.md"))?;
    let pinned = script
        .lines()
        .find_map(|line| line.strip_prefix("pinned="))
        .ok_or("scripts/fetch-corpus has no `pinned=` line")?;
    assert_eq!(pinned.len(), 40, "{pinned}");
    assert!(
        docs.contains(&format!("commit **`{pinned}`**")),
        "docs/voodu-format.md does not name {pinned}"
    );
    Ok(())
}
