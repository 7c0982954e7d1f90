//! `voodu-agent convert`: over the Compose corpus (docker/awesome-compose:
//! `VOODU_COMPOSE_CORPUS_DIR`, else `tests/fixtures/compose-corpus`), every file converts or
//! names what it cannot carry at line:col, and every converted set passes `validate` and
//! `plan`; the CLI's `-o`, `--scope`, stdout, `.env` and `--force`; and
//! `scripts/fetch-compose-corpus` against a local upstream.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::TestResult;

/// Compose files in the pinned awesome-compose commit (scripts/fetch-compose-corpus).
const CORPUS_FILES: usize = 39;

/// Where the Compose corpus is, as the build saw it (build.rs).
pub(crate) fn compose_corpus() -> PathBuf {
    option_env!("VOODU_COMPOSE_CORPUS_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/compose-corpus"),
        PathBuf::from,
    )
}

/// Every `*/compose.y*ml` of awesome-compose, sorted.
pub(crate) fn corpus_files() -> TestResult<Vec<PathBuf>> {
    let root = compose_corpus().join("awesome-compose");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&root)? {
        let dir = entry?.path();
        for name in ["compose.yaml", "compose.yml"] {
            if dir.join(name).is_file() {
                files.push(dir.join(name));
            }
        }
    }
    files.sort();
    Ok(files)
}

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn convert(file: &Path, args: &[&str]) -> TestResult<Output> {
    // TAG is the variable the CLI test sets itself.
    Ok(agent()
        .arg("convert")
        .arg(file)
        .args(args)
        .env_remove("TAG")
        .output()?)
}

/// Every stderr line of a conversion is `FILE:LINE:COL: KEY: not carried|note: …` at a
/// position that exists in the file and holds text, or the closing summary.
fn check_notes(file: &Path, stderr: &str) -> Result<usize, String> {
    let source = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    let lines: Vec<&str> = source.lines().collect();
    let prefix = format!("{}:", file.display());
    let mut notes = 0;
    for line in stderr.lines() {
        if line.starts_with("convert: ") {
            continue;
        }
        let rest = line
            .strip_prefix(&prefix)
            .ok_or_else(|| format!("a line not naming the file: {line}"))?;
        let mut parts = rest.splitn(3, ':');
        let (Some(l), Some(c), Some(message)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("no line:col: {line}"));
        };
        let (l, c): (usize, usize) = (
            l.parse().map_err(|_| format!("line of {line}"))?,
            c.parse().map_err(|_| format!("col of {line}"))?,
        );
        let at = lines
            .get(l - 1)
            .and_then(|text| text.chars().nth(c - 1))
            .ok_or_else(|| format!("{l}:{c} is not in the file: {line}"))?;
        if at.is_whitespace() {
            return Err(format!("{l}:{c} points at blank space: {line}"));
        }
        if !(message.contains(": not carried: ") || message.contains(": note: ")) {
            return Err(format!("neither `not carried` nor `note`: {line}"));
        }
        notes += 1;
    }
    Ok(notes)
}

#[cfg_attr(
    voodu_compose_corpus_missing,
    ignore = "needs the Compose corpus (tests/fixtures/compose-corpus, or VOODU_COMPOSE_CORPUS_DIR): scripts/test says how"
)]
#[test]
fn every_corpus_file_converts_names_what_it_cannot_carry_and_validates() -> TestResult {
    let files = corpus_files()?;
    assert_eq!(
        files.len(),
        CORPUS_FILES,
        "awesome-compose at the pinned commit has {CORPUS_FILES} Compose files"
    );
    let temp = tempfile::tempdir()?;
    let mut failures = Vec::new();
    let mut total_notes = 0;
    for file in &files {
        let project = file
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let out = temp.path().join(&project);
        let output = convert(file, &["-o", &out.to_string_lossy()])?;
        let stderr = text(&output.stderr);
        if output.status.code() != Some(0) {
            failures.push(format!(
                "{}: convert exited {:?}:\n{stderr}",
                file.display(),
                output.status.code()
            ));
            continue;
        }
        match check_notes(file, &stderr) {
            Ok(n) => total_notes += n,
            Err(problem) => failures.push(format!("{}: {problem}", file.display())),
        }
        let validate = agent().arg("validate").arg(&out).output()?;
        if validate.status.code() != Some(0) {
            failures.push(format!(
                "{}: the converted set fails validate:\n{}{}",
                file.display(),
                text(&validate.stdout),
                text(&validate.stderr)
            ));
        }
        // plan under a policy that allows the project's own bind mounts: what remains refused
        // is only what the host policy must decide (the Docker socket, capabilities, host
        // networks), each said as such.
        let data = temp.path().join(format!("{project}.data"));
        std::fs::create_dir_all(&data)?;
        let root = file.parent().map(Path::to_path_buf).unwrap_or_default();
        let plan = agent()
            .arg("plan")
            .arg("--repo")
            .arg(&out)
            .arg("--data-dir")
            .arg(&data)
            .arg("--allow-bind-root")
            .arg(&root)
            .output()?;
        let plan_out = format!("{}{}", text(&plan.stdout), text(&plan.stderr));
        let refusals_only = plan_out
            .lines()
            .filter(|l| l.contains(".hcl:"))
            .all(|l| l.contains("host policy"));
        if plan.status.code() != Some(0) && !refusals_only {
            failures.push(format!(
                "{}: plan fails beyond the host policy:\n{plan_out}",
                file.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        total_notes > CORPUS_FILES,
        "the corpus has keys the agent does not carry"
    );
    Ok(())
}

const SMALL: &str = "services:\n  web:\n    image: busybox:${TAG:-latest}\n    command: httpd -f\n    ports: [\"8080:80\"]\n    expose: [80]\n  db:\n    image: postgres\n    volumes: [data:/var/lib/postgresql/data]\nvolumes:\n  data:\n";

#[test]
fn convert_writes_files_prints_to_stdout_and_refuses_to_overwrite() -> TestResult {
    let temp = tempfile::tempdir()?;
    let project = temp.path().join("Shop App");
    std::fs::create_dir_all(&project)?;
    let file = project.join("compose.yaml");
    std::fs::write(&file, SMALL)?;

    // The `.env` beside the file, under the environment (which wins, as in Compose).
    std::fs::write(project.join(".env"), "TAG=1.36\n")?;
    let output = agent()
        .arg("convert")
        .arg(&file)
        .env("TAG", "1.37")
        .output()?;
    assert!(
        text(&output.stdout).contains("image = \"busybox:1.37\""),
        "{}",
        text(&output.stdout)
    );

    // stdout, scope from the directory name (Compose's project name).
    let output = convert(&file, &[])?;
    assert!(
        text(&output.stdout).contains("image = \"busybox:1.36\""),
        "{}",
        text(&output.stdout)
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("// ---- web.hcl") && stdout.contains("// ---- db.hcl"),
        "{stdout}"
    );
    assert!(
        stdout.contains("deployment \"shopapp\" \"web\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("statefulset \"shopapp\" \"db\""),
        "{stdout}"
    );
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:6:5: services.web.expose: not carried:",
            file.display()
        )),
        "{stderr}"
    );

    // -o DIR with --scope: one file per service, which validate accepts.
    let out = temp.path().join("out");
    let output = convert(&file, &["--scope", "shop", "-o", &out.to_string_lossy()])?;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let mut names: Vec<String> = std::fs::read_dir(&out)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    assert_eq!(names, ["db.hcl", "web.hcl"]);
    assert!(std::fs::read_to_string(out.join("web.hcl"))?.contains("deployment \"shop\" \"web\""));
    assert_eq!(
        agent().arg("validate").arg(&out).output()?.status.code(),
        Some(0)
    );

    // A second run refuses to overwrite, writes nothing; --force overwrites.
    std::fs::write(out.join("web.hcl"), "// edited\n")?;
    let output = convert(&file, &["--scope", "other", "-o", &out.to_string_lossy()])?;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("refusing to overwrite"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(std::fs::read_to_string(out.join("web.hcl"))?, "// edited\n");
    assert!(
        std::fs::read_to_string(out.join("db.hcl"))?.contains("\"shop\""),
        "db.hcl untouched"
    );
    let output = convert(
        &file,
        &["--scope", "other", "-o", &out.to_string_lossy(), "--force"],
    )?;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(std::fs::read_to_string(out.join("web.hcl"))?.contains("deployment \"other\" \"web\""));

    // An invalid file: exit 1 with line:col; a bad scope is refused.
    std::fs::write(&file, "services:\n  web: [\n")?;
    let output = convert(&file, &[])?;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).starts_with(&format!("{}:", file.display())),
        "{}",
        text(&output.stderr)
    );
    std::fs::write(&file, SMALL)?;
    let output = convert(&file, &["--scope", "../x"])?;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("--scope"),
        "{}",
        text(&output.stderr)
    );
    Ok(())
}

/// `scripts/fetch-compose-corpus` against a local upstream (`VOODU_COMPOSE_CORPUS_URL`): the
/// commit asked, verified and laid out as `awesome-compose/`, cached; a commit id that is not
/// a full one, or an upstream without Compose files, is refused.
#[test]
fn fetch_compose_corpus_lays_out_the_pinned_commit_and_refuses_others() -> TestResult {
    let fetch = |cache: &Path, url: &str, commit: &str| -> TestResult<Output> {
        Ok(Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch-compose-corpus"))
            .env("XDG_CACHE_HOME", cache)
            .env("VOODU_COMPOSE_CORPUS_URL", url)
            .env("VOODU_COMPOSE_CORPUS_COMMIT", commit)
            .env("GIT_ALLOW_PROTOCOL", "file")
            .output()?)
    };
    let repo = crate::support::TempRepo::new()?;
    repo.write(
        "app/compose.yaml",
        "services:\n  web:\n    image: busybox\n",
    )?;
    let commit = repo.commit("a project")?;
    let cache = tempfile::tempdir()?;
    let output = fetch(cache.path(), &repo.url(), &commit)?;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let dir = PathBuf::from(text(&output.stdout).trim());
    assert_eq!(
        dir,
        cache
            .path()
            .join("voodu-agent/compose-corpus")
            .join(&commit)
    );
    assert!(dir.join("awesome-compose/app/compose.yaml").is_file());
    assert_eq!(std::fs::read_to_string(dir.join("COMMIT"))?.trim(), commit);
    // Cached: a second run contacts nothing (the upstream is gone).
    let url = repo.url();
    drop(repo);
    let again = fetch(cache.path(), &url, &commit)?;
    assert!(again.status.success(), "{}", text(&again.stderr));

    let output = fetch(cache.path(), &url, "main")?;
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("not a full 40-hex commit id"));

    let empty = crate::support::TempRepo::new()?;
    empty.write("README.md", "nothing\n")?;
    let commit = empty.commit("no compose files")?;
    let output = fetch(cache.path(), &empty.url(), &commit)?;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("no */compose.y*ml files"),
        "{}",
        text(&output.stderr)
    );
    Ok(())
}
