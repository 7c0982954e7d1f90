//! The binary as a process among others (issue 10, items 6 and 9): a log reader that goes
//! away or stops reading never stops the agent, a closed stdout never makes a command panic,
//! and exit code 2 means pending changes only.

use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{
    DockerGuard, TempRepo, TestResult, state_with_one_deployment, unique, wait_until,
};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
}

/// What happens to the agent's stderr once it runs.
#[derive(Debug, Clone, Copy)]
enum LogReader {
    /// The reader goes away (the read end is closed): writes fail with EPIPE.
    Gone,
    /// The reader stays but never reads: the pipe fills and writes would block.
    NeverReads,
}

/// Kills the agent if the test fails before it stopped it.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn deployment(scope: &str, version: &str) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image = "{}"
  command = ["sleep", "600"]
  env = {{ VERSION = "{version}" }}
}}
"#,
        crate::support::test_image()
    )
}

/// The first resource's phase and release commit, from `status --json`.
fn deployed(data_dir: &std::path::Path) -> Option<(String, String)> {
    let output = agent()
        .args(["status", "--json", "--data-dir"])
        .arg(data_dir)
        .output()
        .ok()?;
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
    let resource = &json["resources"][0];
    Some((
        resource["phase"].as_str()?.to_owned(),
        resource["release"]["commit"].as_str()?.to_owned(),
    ))
}

/// Starts the agent with its stderr a pipe, lets it deploy, does `reader` to the pipe,
/// pushes a commit and waits for it to deploy, then sends SIGTERM: the agent exits, cleanly,
/// within 5 s.
fn check(reader: LogReader) -> TestResult {
    let scope = unique("log");
    let _guard = DockerGuard::new(&scope);
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &deployment(&scope, "1"))?;
    let first = repo.commit("v1")?;
    let data = tempfile::tempdir()?;
    let mut child = Reap(
        agent()
            .args(["--repo", &repo.url(), "--interval", "1s", "--listen", "off"])
            .args(["--no-ingress", "--log", "trace"])
            .arg("--data-dir")
            .arg(data.path())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let data_dir = data.path();
    let is_ready = |sha: &str| {
        let sha = sha.to_owned();
        move || deployed(data_dir).filter(|(phase, commit)| phase == "Ready" && *commit == sha)
    };
    wait_until(
        Duration::from_secs(60),
        "the first deploy",
        is_ready(&first),
    )?;
    let stderr = child.0.stderr.take().ok_or("stderr")?;
    // `NeverReads` keeps the read end open until the end of the test and never reads it.
    let _held = match reader {
        LogReader::Gone => {
            drop(stderr);
            None
        }
        LogReader::NeverReads => Some(stderr),
    };
    repo.write("web.hcl", &deployment(&scope, "2"))?;
    let second = repo.commit("v2")?;
    wait_until(
        Duration::from_secs(60),
        &format!("the second deploy with the log reader {reader:?}"),
        is_ready(&second),
    )?;
    let pid = child.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()?
            .success()
    );
    let exit = wait_until(
        Duration::from_secs(5),
        &format!("the agent to exit on SIGTERM with the log reader {reader:?}"),
        || child.0.try_wait().ok().flatten(),
    )?;
    assert!(exit.success(), "{reader:?}: exit status {exit:?}");
    Ok(())
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn r10_a_lost_or_stuck_log_reader_neither_stops_syncing_nor_sigterm() -> TestResult {
    check(LogReader::Gone)?;
    check(LogReader::NeverReads)?;
    Ok(())
}

/// Runs `args` (in `dir`) with stdout a pipe whose read end is already closed: the command
/// ends quietly (141, as a program killed by SIGPIPE, or 0) and prints no panic.
fn check_closed_stdout(dir: &std::path::Path, args: &[&str]) -> TestResult {
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    let output = agent()
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()?;
    let stderr = String::from_utf8(output.stderr)?;
    assert!(
        matches!(output.status.code(), Some(0 | 141)),
        "{args:?}: exit {:?}, stderr {stderr}",
        output.status
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert_eq!(stderr, "", "{args:?}");
    Ok(())
}

#[test]
fn r10_every_command_exits_quietly_into_a_closed_pipe() -> TestResult {
    let dir = tempfile::tempdir()?;
    state_with_one_deployment(dir.path(), "a")?;
    let data_dir = dir.path().to_str().ok_or("utf-8 temp dir")?;
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/repo");
    for args in [
        vec!["status", "--data-dir", data_dir],
        vec!["status", "--json", "--data-dir", data_dir],
        vec!["releases", "s/web", "--data-dir", data_dir],
        vec!["plan", "--repo", examples, "--data-dir", data_dir],
        vec!["validate", examples],
        vec!["--help"],
    ] {
        check_closed_stdout(dir.path(), &args)?;
    }
    Ok(())
}

#[test]
fn r10_usage_errors_exit_1_so_2_means_pending_changes_only() -> TestResult {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().to_str().ok_or("utf-8 temp dir")?;
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["--no-such-flag"],
            1,
            "unexpected argument '--no-such-flag'",
        ),
        (
            &["plan", "--detailed-exitcode", "--bogus"],
            1,
            "unexpected argument '--bogus'",
        ),
        (&["releases"], 1, "required arguments were not provided"),
        (
            &["status", "--interval", "x"],
            1,
            "unexpected argument '--interval'",
        ),
        (
            &["--interval", "soon", "--data-dir", data_dir],
            1,
            "invalid value 'soon'",
        ),
        (&["--help"], 0, ""),
        (&["plan", "--help"], 0, ""),
        (&["--version"], 0, ""),
    ];
    for (args, expected_code, expected_stderr) in cases {
        let output = agent().args(*args).output()?;
        let stderr = String::from_utf8(output.stderr)?;
        assert_eq!(
            output.status.code(),
            Some(*expected_code),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains(expected_stderr), "{args:?}: {stderr}");
        if *expected_code == 0 {
            assert!(!output.stdout.is_empty(), "{args:?} printed nothing");
        }
    }
    Ok(())
}

#[test]
fn r10_a_stderr_whose_reader_is_gone_does_not_hide_the_exit_code() -> TestResult {
    // The error path writes to a closed stderr: exit 1, no panic (exit 101).
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    let mut child = agent()
        .env("VOODU_AGENT_DATA_DIR", "/nonexistent")
        .stderr(Stdio::from(writer))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .ok_or("stdout")?
        .read_to_string(&mut stdout)?;
    let exit = child.wait()?;
    assert_eq!(exit.code(), Some(1), "{stdout}");
    Ok(())
}
