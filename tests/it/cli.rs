//! The binary as a user runs it: exit codes, error messages, `status --json` shape, and a
//! clean stop on SIGTERM.

use std::process::{Command, Stdio};
use std::time::Duration;

use voodu_agent::manifest::{self, Diagnostic, Diagnostics};
use voodu_agent::model::{CommitSha, Snapshot, SourceFile};
use voodu_agent::store::Store;

use crate::support::{
    DockerGuard, TempRepo, TestResult, state_with_one_deployment, unique, wait_until,
};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
}

#[test]
fn running_without_repo_explains_what_to_do() -> TestResult {
    let output = agent()
        .env("VOODU_AGENT_DATA_DIR", "/nonexistent")
        .output()?;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr)?;
    assert!(
        stderr.contains("no --repo given: run `voodu-agent --repo <URL|PATH>`"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn worker_and_create_slot_counts_out_of_bounds_are_refused() -> TestResult {
    for (flag, value) in [
        ("--concurrency", "0"),
        ("--concurrency", "257"),
        ("--create-concurrency", "0"),
        ("--create-concurrency", "100000"),
    ] {
        let output = agent()
            .args(["--repo", "/nonexistent", flag, value])
            .env("VOODU_AGENT_DATA_DIR", "/nonexistent")
            .output()?;
        let stderr = String::from_utf8(output.stderr)?;
        assert_eq!(output.status.code(), Some(1), "{flag} {value}: {stderr}");
        assert!(
            stderr.contains(&format!("invalid value '{value}' for '{flag}"))
                && stderr.contains("is not in 1..=256"),
            "{stderr}"
        );
    }
    Ok(())
}

#[test]
fn listening_off_loopback_without_a_secret_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let output = agent()
        .args([
            "--repo",
            "/nonexistent",
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()?;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr)?;
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without a webhook secret"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn status_without_state_names_the_data_dir() -> TestResult {
    let dir = tempfile::tempdir()?;
    let output = agent()
        .args(["status", "--data-dir"])
        .arg(dir.path())
        .output()?;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr)?;
    assert!(
        stderr.contains("no agent state at") && stderr.contains("state.db"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn status_json_shows_commits_errors_and_resources() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Store::open(&dir.path().join("state.db"))?;
    let good = CommitSha::new("a".repeat(40));
    let snapshot = Snapshot {
        commit: good.clone(),
        files: vec![SourceFile {
            path: "web.hcl".into(),
            contents: b"deployment \"s\" \"web\" {\n  image = \"busybox\"\n}\n".to_vec(),
        }],
        refused: Vec::new(),
    };
    store.apply_commit(
        &good,
        &manifest::load(&snapshot, &manifest::LoadOptions::standalone())?,
    )?;
    let bad = CommitSha::new("b".repeat(40));
    store.reject_commit(
        &bad,
        &Diagnostics(vec![Diagnostic {
            path: "web.hcl".into(),
            line: 2,
            col: 3,
            message: "unknown attribute `imge` in deployment".into(),
        }]),
    )?;
    drop(store);
    let output = agent()
        .args(["status", "--json", "--data-dir"])
        .arg(dir.path())
        .output()?;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    assert_eq!(json["last_seen"]["sha"], bad.as_str());
    assert_eq!(json["last_applied"]["sha"], good.as_str());
    assert_eq!(json["last_rejected"]["outcome"], "rejected");
    assert_eq!(
        json["last_rejected"]["errors"][0],
        "web.hcl:2:3: unknown attribute `imge` in deployment"
    );
    assert_eq!(json["last_rejected"]["diagnostics"][0]["line"], 2);
    assert_eq!(
        json["resources"],
        serde_json::json!([]),
        "no reconcile ran yet"
    );
    let text = agent()
        .args(["status", "--data-dir"])
        .arg(dir.path())
        .output()?;
    let text = String::from_utf8(text.stdout)?;
    assert!(
        text.contains("the latest commit was rejected") && text.contains("web.hcl:2:3:"),
        "{text}"
    );
    Ok(())
}

/// Runs `voodu-agent <args> --data-dir <dir>` → exit code, stdout, stderr.
fn run_in(dir: &std::path::Path, args: &[&str]) -> TestResult<(Option<i32>, String, String)> {
    let output = agent().args(args).arg("--data-dir").arg(dir).output()?;
    Ok((
        output.status.code(),
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    ))
}

#[test]
fn releases_rollback_and_unpin_explain_what_they_cannot_do() -> TestResult {
    let dir = tempfile::tempdir()?;
    state_with_one_deployment(dir.path(), "c")?;

    let (code, _, stderr) = run_in(dir.path(), &["releases", "s/nope"])?;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("no resource s/nope is known to this agent"),
        "{stderr}"
    );
    let (code, stdout, _) = run_in(dir.path(), &["releases", "s/web"])?;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("(no releases recorded)"), "{stdout}");
    let (code, _, stderr) = run_in(dir.path(), &["rollback", "s/web"])?;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("cannot roll back deployment/s/web: no releases are recorded for it"),
        "{stderr}"
    );
    let (code, _, stderr) = run_in(dir.path(), &["unpin", "deployment/s/web"])?;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("deployment/s/web is not pinned"),
        "{stderr}"
    );
    Ok(())
}

/// `plan` says a release of a deployment with `canary {}` rolls out as a canary, step by step.
#[test]
fn plan_says_a_change_rolls_out_as_a_canary() -> TestResult {
    let state = tempfile::tempdir()?;
    state_with_one_deployment(state.path(), "c")?;
    let repo = tempfile::tempdir()?;
    std::fs::write(
        repo.path().join("web.hcl"),
        "deployment \"s\" \"web\" {\n  image = \"busybox:1.36\"\n  canary {\n    step {\n      weight = 10\n      pause  = \"until_promoted\"\n    }\n    step {\n      weight = 100\n    }\n  }\n}\n",
    )?;
    let dir = repo.path().to_str().ok_or("utf-8 path")?;
    let (code, stdout, stderr) = run_in(state.path(), &["plan", "--repo", dir])?;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "rolled out as a canary: 10% (until promoted) → 100%, judged by replica health"
        ),
        "{stdout}"
    );
    Ok(())
}

/// `promote` and `abort` leave their request on a deployment's rollout in state.db, in the
/// activity log and the outbox; with no rollout in flight they exit 1 and record nothing.
#[test]
fn promote_and_abort_record_their_request_or_say_nothing_is_in_flight() -> TestResult {
    use voodu_agent::store::{RolloutPhase, RolloutState};
    let dir = tempfile::tempdir()?;
    state_with_one_deployment(dir.path(), "c")?;
    let (code, _, stderr) = run_in(dir.path(), &["promote", "s/web"])?;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("deployment/s/web: no canary or blue/green rollout is in flight"),
        "{stderr}"
    );
    let store = Store::open(&dir.path().join("state.db"))?;
    let mut state = RolloutState::start("s", "web", "abc", "canary");
    state.phase = RolloutPhase::Paused;
    state.share = 10;
    state.canary_replicas = 1;
    store.save_rollout(&state, None)?;
    drop(store);
    let (code, stdout, stderr) = run_in(dir.path(), &["promote", "s/web"])?;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("deployment/s/web: promote requested") && stdout.contains("at 10 %"),
        "{stdout}"
    );
    let (code, stdout, stderr) = run_in(dir.path(), &["abort", "s/web"])?;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let store = Store::open(&dir.path().join("state.db"))?;
    let stored = store.rollout_state("s", "web")?.ok_or("stored")?;
    assert!(stored.promote_requested && stored.abort_requested);
    let events: Vec<String> = store
        .events_after(0, 10)?
        .into_iter()
        .map(|event| event.event)
        .filter(|event| event.starts_with("rollout."))
        .collect();
    assert_eq!(events, ["rollout.promoted", "rollout.aborted"]);
    drop(store);
    let (code, stdout, stderr) = run_in(dir.path(), &["status"])?;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(
            "deployment/s/web canary release abc: paused, step 1 at 10 % (1 canary replica(s))"
        ) && stdout.contains("promote requested, abort requested"),
        "{stdout}"
    );
    let (_, stdout, _) = run_in(dir.path(), &["status", "--json"])?;
    let json: serde_json::Value = serde_json::from_str(&stdout)?;
    assert_eq!(json["rollouts"][0]["share"], 10);
    assert_eq!(json["rollouts"][0]["phase"], "paused");
    Ok(())
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn sigterm_stops_the_agent_cleanly() -> TestResult {
    let scope = unique("sig");
    let _guard = DockerGuard::new(&scope);
    let repo = TempRepo::new()?;
    repo.write(
        "web.hcl",
        &format!(
            r#"deployment "{scope}" "web" {{
  image = "{}"
  command = ["sleep", "600"]
}}
"#,
            crate::support::test_image()
        ),
    )?;
    repo.commit("web")?;
    let data = tempfile::tempdir()?;
    let mut child = agent()
        .args([
            "--repo",
            &repo.url(),
            "--interval",
            "1s",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(data.path())
        .stderr(Stdio::piped())
        .spawn()?;
    let status_says_ready = || {
        let output = agent()
            .args(["status", "--json", "--data-dir"])
            .arg(data.path())
            .output()
            .ok()?;
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        (json["resources"][0]["phase"] == "Ready").then_some(())
    };
    wait_until(
        Duration::from_secs(60),
        "the agent to converge",
        status_says_ready,
    )?;
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()?
            .success()
    );
    let exit = wait_until(Duration::from_secs(30), "the agent to exit", || {
        child.try_wait().ok().flatten()
    })?;
    assert!(exit.success(), "exit status {exit:?}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().ok_or("stderr")?, &mut stderr)?;
    assert!(stderr.contains("shutting down"), "{stderr}");
    Ok(())
}

/// A statefulset's `backup {}` (an extension) runs on the container engine only: `validate
/// --runtime swarm` refuses it at the statefulset's block; without the flag it validates.
#[test]
fn validate_under_swarm_refuses_a_backup() -> TestResult {
    let repo = tempfile::tempdir()?;
    std::fs::write(
        repo.path().join("db.hcl"),
        r#"statefulset "shop" "db" {
  image = "postgres:16"
  volume_claim "data" { mount_path = "/var/lib/postgresql/data" }
  backup {
    repository    = "/srv/backups/shop-db"
    password_file = "/srv/backups/shop-db.pass"
  }
}
"#,
    )?;
    let state = tempfile::tempdir()?;
    let dir = repo.path().to_str().ok_or("utf-8 path")?;
    let (code, stdout, stderr) = run_in(state.path(), &["validate", dir])?;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let (code, stdout, stderr) = run_in(state.path(), &["validate", dir, "--runtime", "swarm"])?;
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "db.hcl:1:1: cannot run under Docker Swarm: backup {} runs on the container engine only"
        ),
        "{stdout}{stderr}"
    );
    Ok(())
}

/// A deployment's `canary {}` (an extension) shifts traffic on the agent's own ingress:
/// `validate --runtime swarm` refuses it at the deployment's block; without the flag it
/// validates, and `plan` says the change rolls out as a canary.
#[test]
fn validate_under_swarm_refuses_a_canary_and_plan_names_the_strategy() -> TestResult {
    let repo = tempfile::tempdir()?;
    std::fs::write(
        repo.path().join("web.hcl"),
        r#"deployment "shop" "web" {
  image = "busybox"
  replicas = 10
  canary {
    step {
      weight = 10
      pause  = "1m"
    }
    step {
      weight = 100
    }
    analysis {
      http {
        path              = "/health"
        samples           = 20
        max_error_percent = 5
      }
    }
  }
}
"#,
    )?;
    let state = tempfile::tempdir()?;
    let dir = repo.path().to_str().ok_or("utf-8 path")?;
    let (code, stdout, stderr) = run_in(state.path(), &["validate", dir])?;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let (code, stdout, stderr) = run_in(state.path(), &["validate", dir, "--runtime", "swarm"])?;
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("web.hcl:1:1: cannot run under Docker Swarm: canary {} shifts traffic on the agent's own ingress"),
        "{stdout}{stderr}"
    );
    Ok(())
}

/// Issue 10 item 3: `validate` checks the format alone unless given a policy (a file or
/// flags); `plan` applies the flags, else the policy the agent recorded in state.db, else the
/// default-deny policy. Each refusal is `path:line:col: message` naming the setting.
#[test]
fn validate_and_plan_apply_the_host_policy() -> TestResult {
    let repo = tempfile::tempdir()?;
    std::fs::write(
        repo.path().join("web.hcl"),
        r#"deployment "s" "web" {
  image = "busybox"
  volumes = ["/var/run/docker.sock:/var/run/docker.sock"]
  docker_options = ["--privileged"]
}
"#,
    )?;
    let allowing = repo.path().join("allowing.json");
    std::fs::write(
        &allowing,
        r#"{"allow-privileged": true, "allow-bind-root": ["/var/run/docker.sock"]}"#,
    )?;
    let half = repo.path().join("half.json");
    std::fs::write(&half, r#"{"allow-privileged": true}"#)?;
    let unknown = repo.path().join("unknown.json");
    std::fs::write(&unknown, r#"{"allow-everything": true}"#)?;
    let no_state = tempfile::tempdir()?;
    let recorded = tempfile::tempdir()?;
    let store = Store::open(&recorded.path().join("state.db"))?;
    store.set_meta(
        voodu_agent::sync::META_HOST_POLICY,
        Some(&std::fs::read_to_string(&allowing)?),
    )?;
    drop(store);
    let dir = repo.path().to_str().ok_or("utf-8 path")?;
    let bind = "web.hcl:3:3: bind mount of /var/run/docker.sock (under /var/run: runtime sockets, the Docker socket among them) is refused by the host policy; start the agent with --allow-bind-root /var/run/docker.sock to allow it";
    let privileged = "web.hcl:4:3: privileged containers are refused by the host policy; start the agent with --allow-privileged to allow them";
    let ok = "ok: 1 resource in 1 file (1 deployment)";
    let half = half.to_str().ok_or("utf-8 path")?;
    let allowing = allowing.to_str().ok_or("utf-8 path")?;
    let unknown = unknown.to_str().ok_or("utf-8 path")?;
    // (data dir, args, exit code, stdout lines (validate) or stderr lines (plan)).
    let cases: &[(&std::path::Path, &[&str], i32, &[&str])] = &[
        (no_state.path(), &["validate", dir], 0, &[ok]),
        (
            no_state.path(),
            &["validate", dir, "--policy", "default"],
            1,
            &[
                bind,
                privileged,
                "2 errors in 1 file; nothing would be applied",
            ],
        ),
        (
            no_state.path(),
            &["validate", dir, "--policy", half],
            1,
            &[bind, "1 error in 1 file; nothing would be applied"],
        ),
        (
            no_state.path(),
            &[
                "validate",
                dir,
                "--policy",
                half,
                "--allow-bind-root",
                "/var/run/docker.sock",
            ],
            0,
            &[ok],
        ),
        (
            no_state.path(),
            &["validate", dir, "--policy", allowing],
            0,
            &[ok],
        ),
        (
            no_state.path(),
            &["plan", "--repo", dir],
            1,
            &[
                bind,
                privileged,
                "plan: 2 error(s) in working-tree; the agent would reject this commit and keep running the last good one",
            ],
        ),
        (
            no_state.path(),
            &["plan", "--repo", dir, "--allow-privileged"],
            1,
            &[
                bind,
                "plan: 1 error(s) in working-tree; the agent would reject this commit and keep running the last good one",
            ],
        ),
        (
            no_state.path(),
            &["plan", "--repo", dir, "--policy", allowing],
            0,
            &[],
        ),
        (recorded.path(), &["plan", "--repo", dir], 0, &[]),
    ];
    for (data_dir, args, code, expected) in cases {
        let (got_code, stdout, stderr) = run_in(data_dir, args)?;
        assert_eq!(got_code, Some(*code), "{args:?}: {stdout}{stderr}");
        let shown = if args[0] == "validate" {
            &stdout
        } else {
            &stderr
        };
        let lines: Vec<&str> = shown
            .lines()
            .filter(|line| !line.contains("Docker engine"))
            .collect();
        if args[0] == "validate" || *code != 0 {
            assert_eq!(lines, *expected, "{args:?}");
        }
    }
    let (code, _, stderr) = run_in(no_state.path(), &["validate", dir, "--policy", unknown])?;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("is not a host policy")
            && stderr.contains("unknown field `allow-everything`"),
        "{stderr}"
    );
    Ok(())
}

/// Issue 14 item 2: the flags of `run` come from `VOODU_*` variables too, and are checked
/// as flags are: a token file with a plain-http repo, both from the environment, is refused
/// before anything starts, with what to do.
#[test]
fn run_settings_come_from_voodu_variables_and_a_token_over_http_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken\n")?;
    let output = agent()
        .env("VOODU_REPO", "http://git.example.org/ops/deploy.git")
        .env("VOODU_GIT_TOKEN_FILE", &token)
        .env("VOODU_AGENT_DATA_DIR", dir.path().join("data"))
        .output()?;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr)?;
    assert!(
        stderr.contains("a token would go to http://git.example.org/ops/deploy.git in clear text: use an https:// URL, or drop --git-token-file"),
        "{stderr}"
    );
    assert!(!dir.path().join("data").exists(), "nothing was started");
    // A value the flag would refuse is refused from the variable, naming both.
    let output = agent()
        .env("VOODU_REPO", "/nonexistent")
        .env("VOODU_INTERVAL", "soon")
        .output()?;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr)?;
    assert!(
        stderr.contains("invalid value 'soon' for '--interval"),
        "{stderr}"
    );
    // --help lists the variables.
    let help = String::from_utf8(agent().arg("--help").output()?.stdout)?;
    for variable in [
        "[env: VOODU_REPO=",
        "[env: VOODU_GIT_CA_FILE=",
        "[env: VOODU_LOG_FORMAT=",
    ] {
        assert!(help.contains(variable), "{variable} not in --help");
    }
    // --version names the commit it was built from.
    let version = String::from_utf8(agent().arg("--version").output()?.stdout)?;
    assert!(
        version.starts_with("voodu-agent 0.") && version.contains(" (commit "),
        "{version}"
    );
    Ok(())
}

/// Issue 14 item 2: `--json` on `validate` and `config get/list`, parseable and complete.
#[test]
fn validate_and_config_speak_json() -> TestResult {
    let repo = tempfile::tempdir()?;
    std::fs::write(
        repo.path().join("web.hcl"),
        "deployment \"s\" \"web\" {\n  image = \"busybox\"\n}\n",
    )?;
    let output = agent()
        .args(["validate", "--json"])
        .arg(repo.path())
        .output()?;
    assert_eq!(output.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    assert_eq!(json["ok"], true, "{json:#}");
    assert_eq!(json["resources"]["deployment"], 1, "{json:#}");
    std::fs::write(
        repo.path().join("bad.hcl"),
        "deployment \"s\" \"x\" {\n  image = \n}\n",
    )?;
    let output = agent()
        .args(["validate", "--json"])
        .arg(repo.path())
        .output()?;
    assert_eq!(output.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    assert_eq!(json["ok"], false);
    assert_eq!(json["errors"][0]["path"], "bad.hcl", "{json:#}");
    assert_eq!(json["errors"][0]["line"], 2, "{json:#}");
    assert!(json["errors"][0]["col"].is_u64() && json["errors"][0]["message"].is_string());

    let data = tempfile::tempdir()?;
    let (code, _, stderr) = run_in(
        data.path(),
        &["config", "set", "shop/web", "A=1", "B=two words"],
    )?;
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, _) = run_in(
        data.path(),
        &["config", "get", "shop/web", "--json", "A", "C"],
    )?;
    assert_eq!(code, Some(1), "C is missing");
    let json: serde_json::Value = serde_json::from_str(&stdout)?;
    assert_eq!(
        json,
        serde_json::json!({"bucket": "shop/web", "values": {"A": "1"}, "missing": ["C"]})
    );
    let (code, stdout, _) = run_in(data.path(), &["config", "list", "--json"])?;
    assert_eq!(code, Some(0));
    let json: serde_json::Value = serde_json::from_str(&stdout)?;
    assert_eq!(
        json,
        serde_json::json!([{"bucket": "shop/web", "keys": ["A", "B"]}])
    );
    Ok(())
}

/// Issue 23 item 7: data holding terminal escapes (a file name, a message quoting the repo or
/// the engine) reaches every human-readable output escaped: no raw ESC or BEL byte, and the
/// escaped form shown.
#[test]
fn human_outputs_escape_terminal_control_characters() -> TestResult {
    const NASTY: &str = "\x1b[2J\x07";
    const SHOWN: &str = "\\x1b[2J\\x07";
    let data = tempfile::tempdir()?;
    crate::support::state_with_one_deployment(data.path(), "a")?;
    let store = Store::open(&data.path().join("state.db"))?;
    let key =
        voodu_agent::model::ResourceKey::new(voodu_agent::model::Kind::Deployment, "s", "web");
    let desired = store.desired(&key)?.ok_or("web is desired")?;
    let release = store.begin_release(&desired)?;
    store.finish_release(
        release.id,
        voodu_agent::store::ReleasePhase::Failed,
        &format!("probe `sh -c {NASTY}` failed"),
    )?;
    store.put_status(
        &key,
        &voodu_agent::store::ResourceStatus::new(
            voodu_agent::store::Phase::Degraded,
            format!("engine says {NASTY}\nforged line"),
        ),
    )?;
    store.reject_commit(
        &CommitSha::new("b".repeat(40)),
        &Diagnostics(vec![Diagnostic {
            path: format!("we{NASTY}b.hcl"),
            line: 2,
            col: 3,
            message: format!("unknown attribute `{NASTY}`"),
        }]),
    )?;
    drop(store);
    let repo = tempfile::tempdir()?;
    std::fs::write(
        repo.path().join(format!("x{NASTY}.hcl")),
        "deployment \"s\" \"x\" {\n  imge = \"busybox\"\n}\n",
    )?;
    let repo_dir = repo.path().to_str().ok_or("utf-8 path")?;
    let no_state = tempfile::tempdir()?;
    let cases: &[(&std::path::Path, &[&str])] = &[
        (data.path(), &["status"]),
        (data.path(), &["activity"]),
        (data.path(), &["releases", "s/web"]),
        (no_state.path(), &["validate", repo_dir]),
        (no_state.path(), &["plan", "--repo", repo_dir]),
    ];
    for (data_dir, args) in cases {
        let output = agent()
            .args(*args)
            .arg("--data-dir")
            .arg(data_dir)
            .output()?;
        let all = [output.stdout.as_slice(), output.stderr.as_slice()].concat();
        let text = String::from_utf8_lossy(&all);
        assert!(
            !all.iter().any(|byte| matches!(byte, 0x1b | 0x07)),
            "{args:?} printed a raw ESC or BEL: {text}"
        );
        assert!(text.contains(SHOWN), "{args:?}: {text}");
    }
    Ok(())
}
