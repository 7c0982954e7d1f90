//! Issue 27, acceptance 3: image automation's commit mode against real git repositories (a bare
//! remote and a human's clone, `git` executable): the bump touches only the tag, and a human
//! commit that lands between the agent's fetch and its push is kept, the bump redone on it.

use std::path::Path;
use std::process::Command;

use voodu_agent::agent::image_commit::bump_in_git;
use voodu_agent::git::push::{PushOptions, commit_and_push};
use voodu_agent::manifest::image_edit::set_image_tag;
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::reconcile::image_scan::Bump;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MANIFEST: &str = "# shop\ndeployment \"shop\" \"web\" {\n  image = \"app:1.4.2\"  # followed\n  image_update { range = \"~1.4\" }\n}\n";

fn git(dir: &Path, args: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=human",
            "-c",
            "user.email=human@example.invalid",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()?;
    if !output.status.success() {
        return Err(format!("git {args:?}: {}", String::from_utf8_lossy(&output.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// A bare remote with `m/shop.hcl` on `main`, and a human's clone of it.
fn remote(root: &Path) -> Result<(String, std::path::PathBuf), Box<dyn std::error::Error>> {
    let bare = root.join("remote.git");
    let human = root.join("human");
    std::fs::create_dir_all(&human)?;
    git(
        root,
        &[
            "init",
            "-q",
            "--template=",
            "--bare",
            "-b",
            "main",
            bare.to_str().ok_or("path")?,
        ],
    )?;
    git(&human, &["init", "-q", "--template=", "-b", "main"])?;
    std::fs::create_dir_all(human.join("m"))?;
    std::fs::write(human.join("m/shop.hcl"), MANIFEST)?;
    git(&human, &["add", "."])?;
    git(&human, &["commit", "-q", "-m", "initial"])?;
    git(
        &human,
        &["push", "-q", bare.to_str().ok_or("path")?, "main"],
    )?;
    Ok((bare.display().to_string(), human))
}

fn options(url: &str, work_dir: &Path) -> PushOptions {
    PushOptions {
        url: url.to_owned(),
        branch: "main".to_owned(),
        push_branch: String::new(),
        paths: vec!["m".to_owned()],
        work_dir: work_dir.to_path_buf(),
        signing_key: None,
        author_name: "voodu-agent".to_owned(),
        author_email: "voodu-agent@localhost".to_owned(),
        ssh_command: None,
        token_file: None,
        ca_file: None,
    }
}

fn bump() -> Bump {
    Bump {
        key: ResourceKey::new(Kind::Deployment, "shop", "web"),
        source: String::new(),
        repository: "app".to_owned(),
        from_tag: "1.4.2".to_owned(),
        to_tag: "1.4.3".to_owned(),
        push_branch: String::new(),
    }
}

#[test]
fn a_bump_changes_only_the_tag_and_lists_the_change() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (url, human) = remote(dir.path())?;
    let sha = bump_in_git(&options(&url, &dir.path().join("work")), &[bump()])?;
    git(&human, &["pull", "-q", &url, "main"])?;
    assert_eq!(git(&human, &["rev-parse", "HEAD"])?, sha.as_str());
    let diff = git(&human, &["diff", "-U0", "HEAD~1", "HEAD"])?;
    let changed: Vec<&str> = diff
        .lines()
        .filter(|line| {
            (line.starts_with('+') || line.starts_with('-'))
                && !line.starts_with("+++")
                && !line.starts_with("---")
        })
        .collect();
    assert_eq!(
        changed,
        [
            "-  image = \"app:1.4.2\"  # followed",
            "+  image = \"app:1.4.3\"  # followed"
        ]
    );
    assert_eq!(
        git(&human, &["log", "-1", "--format=%B"])?,
        "Update app to 1.4.3\n\nshop/web: app:1.4.2 → app:1.4.3"
    );
    // Once there, the same bump commits nothing.
    let again = bump_in_git(&options(&url, &dir.path().join("work")), &[bump()])?;
    assert_eq!(again, sha);
    Ok(())
}

#[test]
fn a_human_commit_between_fetch_and_push_is_kept_and_the_bump_redone_on_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (url, human) = remote(dir.path())?;
    let mut attempts = 0;
    let mut edit = |path: &str, text: &str| {
        attempts += 1;
        if attempts == 1 {
            // The human pushes after the agent fetched: the agent's push must be refused.
            let mut human_text =
                std::fs::read_to_string(human.join(path)).map_err(|e| e.to_string())?;
            human_text.push_str("# reviewed by a human\n");
            std::fs::write(human.join(path), human_text).map_err(|e| e.to_string())?;
            git(&human, &["commit", "-q", "-am", "human edit"]).map_err(|e| e.to_string())?;
            git(&human, &["push", "-q", &url, "main"]).map_err(|e| e.to_string())?;
        }
        set_image_tag(text, Kind::Deployment, "shop", "web", "app", "1.4.3")
            .map(|edit| edit.map(|edit| edit.text))
            .map_err(|error| error.to_string())
    };
    let sha = commit_and_push(
        &options(&url, &dir.path().join("work")),
        "Update app to 1.4.3",
        &mut edit,
        &mut || Ok(()),
    )?;
    assert_eq!(attempts, 2, "the refused push was redone once");
    git(&human, &["pull", "-q", "--ff-only", &url, "main"])?;
    assert_eq!(git(&human, &["rev-parse", "HEAD"])?, sha.as_str());
    assert_eq!(
        git(&human, &["log", "-1", "--format=%s", "HEAD~1"])?,
        "human edit"
    );
    let text = std::fs::read_to_string(human.join("m/shop.hcl"))?;
    assert_eq!(
        text,
        MANIFEST.replace("app:1.4.2", "app:1.4.3") + "# reviewed by a human\n"
    );
    Ok(())
}

#[test]
fn an_image_moved_to_another_repository_is_a_conflict_and_nothing_is_pushed() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (url, human) = remote(dir.path())?;
    std::fs::write(
        human.join("m/shop.hcl"),
        MANIFEST.replace("app:1.4.2", "other:9"),
    )?;
    git(&human, &["commit", "-q", "-am", "switch image"])?;
    git(&human, &["push", "-q", &url, "main"])?;
    let tip = git(&human, &["rev-parse", "HEAD"])?;
    let error = bump_in_git(&options(&url, &dir.path().join("work")), &[bump()])
        .expect_err("a conflict")
        .to_string();
    assert!(error.contains("not a tag of app"), "{error}");
    assert_eq!(
        git(dir.path(), &["--git-dir", &url, "rev-parse", "main"])?,
        tip
    );
    Ok(())
}
