//! The agent as a systemd service (issue 14 item 1): the unit `voodu-agent install` writes
//! passes `systemd-analyze verify`, the environment file holds the flags given, the agent
//! speaks the notify protocol to a real datagram socket (READY=1 once it runs, WATCHDOG=1
//! while it does, STOPPING=1 on SIGTERM) with every setting read from `VOODU_*` variables,
//! and `cargo deb` builds a package that installs the binary, the unit and the environment
//! file, and starts nothing.
//!
//! There is no running systemd here (a container without an init): `systemctl enable --now`
//! cannot be run, so the install's last step is tested by the parts systemd would run.

use std::io::BufRead as _;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{TempRepo, TestResult};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
}

/// Kills the process if the test fails before it ended.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn require(tool: &str) -> TestResult {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if found {
        Ok(())
    } else {
        Err(format!("{tool} is missing (scripts/test-deps installs it)").into())
    }
}

/// `systemd-analyze verify` on `unit`: exit 0 and not a word about the unit (unknown keys
/// are only warnings, so silence is checked too).
fn verify_unit(unit: &Path) -> TestResult {
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(unit)
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!(
        "systemd-analyze verify {}: {}",
        unit.display(),
        output.status
    );
    let about_unit: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("voodu-agent"))
        .collect();
    assert!(
        output.status.success() && about_unit.is_empty(),
        "systemd-analyze verify {}: {stderr}",
        unit.display()
    );
    Ok(())
}

#[test]
#[ignore = "needs systemd-analyze (scripts/test-deps installs systemd): scripts/test runs it"]
fn installed_unit_verifies_and_env_file_holds_the_flags_given() -> TestResult {
    require("systemd-analyze")?;
    let root = tempfile::tempdir()?;
    let secret = root.path().join("webhook.secret");
    std::fs::write(&secret, "s3cret\n")?;
    let output = agent()
        .arg("install")
        .arg("--root")
        .arg(root.path())
        .args(["--json", "--repo", "https://git.example.org/ops/deploy.git"])
        .args([
            "--branch",
            "prod",
            "--path",
            "hosts/web-1",
            "--path",
            "common",
        ])
        .args(["--listen", "0.0.0.0:8687", "--webhook-secret-file"])
        .arg(&secret)
        // The installer's own environment is not copied into the service.
        .env("VOODU_CONCURRENCY", "9")
        .output()?;
    assert!(
        output.status.success(),
        "install: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let view: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    assert_eq!(view["enabled"], false, "{view:#}");
    let unit = root.path().join("etc/systemd/system/voodu-agent.service");
    let env_file = root.path().join("etc/voodu-agent/voodu-agent.env");
    assert_eq!(view["unit"], unit.display().to_string());
    verify_unit(&unit)?;
    let unit_text = std::fs::read_to_string(&unit)?;
    for line in [
        "Type=notify",
        "StateDirectory=voodu-agent",
        "Restart=on-failure",
        "WatchdogSec=30s",
        "EnvironmentFile=/etc/voodu-agent/voodu-agent.env",
        &format!(
            "ExecStart={}",
            std::fs::canonicalize(env!("CARGO_BIN_EXE_voodu-agent"))?.display()
        ),
    ] {
        assert!(
            unit_text.lines().any(|unit_line| unit_line == line),
            "{line}"
        );
    }
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&env_file)?.permissions().mode() & 0o777,
        0o600
    );
    let env_text = std::fs::read_to_string(&env_file)?;
    let variables: Vec<&str> = env_text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .collect();
    assert_eq!(
        variables,
        [
            "VOODU_REPO=\"https://git.example.org/ops/deploy.git\"",
            "VOODU_BRANCH=\"prod\"",
            "VOODU_PATH=\"hosts/web-1,common\"",
            "VOODU_LISTEN=\"0.0.0.0:8687\"",
            &format!("VOODU_WEBHOOK_SECRET_FILE=\"{}\"", secret.display()),
        ]
    );
    // A second install keeps the first file as `.old`.
    let again = agent()
        .arg("install")
        .arg("--root")
        .arg(root.path())
        .args(["--repo", "https://git.example.org/ops/other.git"])
        .output()?;
    assert!(again.status.success());
    assert_eq!(
        std::fs::read_to_string(root.path().join("etc/voodu-agent/voodu-agent.env.old"))?,
        env_text
    );
    Ok(())
}

/// The agent binary under a fake service manager: every setting from `VOODU_*` variables
/// (no flag), `NOTIFY_SOCKET` a datagram socket this test reads, a 400 ms watchdog.
#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn agent_notifies_ready_watchdog_and_stopping_with_env_settings() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("README.md", "nothing deployed\n")?;
    repo.commit("empty")?;
    let dir = tempfile::tempdir()?;
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path)?;
    socket.set_read_timeout(Some(Duration::from_secs(60)))?;
    let data_dir = dir.path().join("data");
    let mut child = Reap(
        agent()
            .env("VOODU_REPO", repo.url())
            .env("VOODU_AGENT_DATA_DIR", &data_dir)
            .env("VOODU_LISTEN", "127.0.0.1:0")
            .env("VOODU_NO_INGRESS", "yes")
            .env("VOODU_INTERVAL", "1h")
            .env("VOODU_LOG_FORMAT", "json")
            .env("NOTIFY_SOCKET", &socket_path)
            .env("WATCHDOG_USEC", "400000")
            .env_remove("WATCHDOG_PID")
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let mut messages = Vec::new();
    let mut buffer = [0u8; 1024];
    let mut receive_until = |wanted: &str, messages: &mut Vec<String>| -> TestResult {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let n = socket.recv(&mut buffer)?;
            let message = String::from_utf8_lossy(&buffer[..n]).into_owned();
            let done = message.lines().any(|line| line == wanted);
            messages.push(message);
            if done {
                return Ok(());
            }
        }
        Err(format!("no {wanted} in {messages:?}").into())
    };
    receive_until("READY=1", &mut messages)?;
    let ready = messages.last().cloned().unwrap_or_default();
    assert!(
        ready.contains(&format!("STATUS=watching {}", repo.url())),
        "{ready}"
    );
    // Keep-alives arrive every 200 ms.
    let before = messages.len();
    receive_until("WATCHDOG=1", &mut messages)?;
    receive_until("WATCHDOG=1", &mut messages)?;
    assert!(messages.len() >= before + 2);
    // SAFETY: kill(2) on the child's pid, which is alive (not reaped) here.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    receive_until("STOPPING=1", &mut messages)?;
    let status = child.0.wait()?;
    assert!(status.success(), "{status}");
    println!("notifications: {messages:?}");
    // The log was JSON (VOODU_LOG_FORMAT), one object per line.
    let stderr = child.0.stderr.take().ok_or("piped stderr")?;
    let mut n_lines = 0;
    for line in std::io::BufReader::new(stderr).lines() {
        let line = line?;
        let object: serde_json::Value =
            serde_json::from_str(&line).map_err(|error| format!("not JSON: {line}: {error}"))?;
        assert!(
            object["level"].is_string() && object["message"].is_string(),
            "{line}"
        );
        n_lines += 1;
    }
    assert!(n_lines > 0);
    Ok(())
}

/// The path cargo-deb writes the package to, built from this checkout. It packages the binary
/// this test run already built (`CARGO_BIN_EXE_voodu-agent`, laid out where the package's
/// asset `target/release/voodu-agent` points in a scratch target directory) with
/// `--no-build`: a release build of every dependency took most of a fresh clone's CI time,
/// and what this test checks is the package (assets, unit, conffile, maintainer scripts),
/// not the optimiser. `--fast` compresses faster: the default on the stripped binary took
/// 52 s of the test's 58.
fn build_package(out: &Path) -> TestResult<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let target = tempfile::tempdir()?;
    std::fs::create_dir_all(target.path().join("release"))?;
    std::fs::copy(
        env!("CARGO_BIN_EXE_voodu-agent"),
        target.path().join("release/voodu-agent"),
    )?;
    let started = Instant::now();
    let output = Command::new("cargo")
        .args(["deb", "--locked", "--no-build", "--fast", "--output"])
        .arg(out)
        .arg("--manifest-path")
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", target.path())
        .output()?;
    if !output.status.success() {
        return Err(format!("cargo deb: {}", String::from_utf8_lossy(&output.stderr)).into());
    }
    println!(
        "cargo deb --locked --no-build --fast: {:.0?}",
        started.elapsed()
    );
    let deb = std::fs::read_dir(out)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "deb"))
        .ok_or("cargo deb wrote no .deb")?;
    Ok(deb)
}

fn run(command: &mut Command) -> TestResult<String> {
    let output = command.output()?;
    if !output.status.success() {
        return Err(format!("{command:?}: {}", String::from_utf8_lossy(&output.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `cargo deb` (of the binary the tests built), then `dpkg -c` and `dpkg -i --root` into an empty root:
/// the binary, the unit and the environment file are installed, the maintainer scripts
/// enable and start nothing, and the installed binary runs.
#[test]
#[ignore = "needs cargo-deb and dpkg (scripts/test-deps installs cargo-deb): scripts/test runs it"]
fn debian_package_installs_binary_and_unit_and_starts_nothing() -> TestResult {
    require("cargo-deb")?;
    require("dpkg")?;
    let out = tempfile::tempdir()?;
    let deb = build_package(out.path())?;
    println!("package: {}", deb.display());
    let contents = run(Command::new("dpkg-deb").arg("-c").arg(&deb))?;
    for path in [
        "./usr/bin/voodu-agent",
        "./usr/lib/systemd/system/voodu-agent.service",
        "./etc/voodu-agent/voodu-agent.env",
        // The shell's conventions (dist/completions, dist/man; cargo-deb gzips the man page).
        "./usr/share/bash-completion/completions/voodu-agent",
        "./usr/share/zsh/vendor-completions/_voodu-agent",
        "./usr/share/fish/vendor_completions.d/voodu-agent.fish",
        "./usr/share/man/man1/voodu-agent.1.gz",
    ] {
        assert!(
            contents.lines().any(|line| line.ends_with(path)),
            "{path} not in:\n{contents}"
        );
    }
    // Cronjob time zones are read from the host's database.
    let depends = run(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Depends"))?;
    assert!(
        depends.split(',').any(|item| item.trim() == "tzdata"),
        "Depends: {depends}"
    );
    // The maintainer scripts neither enable nor start the unit: they only keep an admin's
    // enablement across upgrades (`was-enabled`) and restart a running agent on upgrade.
    let scripts = tempfile::tempdir()?;
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(&deb)
        .arg(scripts.path()))?;
    let postinst = std::fs::read_to_string(scripts.path().join("postinst")).unwrap_or_default();
    println!("postinst:\n{postinst}");
    let lines: Vec<&str> = postinst.lines().map(str::trim).collect();
    for (index, line) in lines.iter().enumerate() {
        if line.starts_with("deb-systemd-helper enable") {
            // Only inside `if deb-systemd-helper --quiet was-enabled …`.
            let condition = lines[..index]
                .iter()
                .rev()
                .find(|line| line.starts_with("if "));
            assert!(
                condition.is_some_and(|condition| condition.contains("was-enabled")),
                "postinst enables the unit: {line}"
            );
        }
        if line.starts_with("deb-systemd-invoke") {
            assert!(
                line.contains("try-restart"),
                "postinst starts the unit: {line}"
            );
        }
        assert!(
            !line.contains("systemctl start") && !line.contains("systemctl enable"),
            "{line}"
        );
    }
    let conffiles = std::fs::read_to_string(scripts.path().join("conffiles"))?;
    assert!(
        conffiles.contains("/etc/voodu-agent/voodu-agent.env"),
        "{conffiles}"
    );
    // Install into an empty root (its own dpkg database): files land, scripts run
    // outside a chroot (there is no shell in it) and do nothing there without systemd.
    let root = tempfile::tempdir()?;
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/log"] {
        std::fs::create_dir_all(root.path().join(dir))?;
    }
    std::fs::write(root.path().join("var/lib/dpkg/status"), "")?;
    run(Command::new("dpkg")
        .arg(format!("--root={}", root.path().display()))
        .args([
            "--force-depends",
            "--force-script-chrootless",
            "--force-not-root",
        ])
        .arg("-i")
        .arg(&deb))?;
    let binary = root.path().join("usr/bin/voodu-agent");
    let unit = root
        .path()
        .join("usr/lib/systemd/system/voodu-agent.service");
    let env_file = root.path().join("etc/voodu-agent/voodu-agent.env");
    let completion = root
        .path()
        .join("usr/share/bash-completion/completions/voodu-agent");
    let man = root.path().join("usr/share/man/man1/voodu-agent.1.gz");
    for path in [&binary, &unit, &env_file, &completion, &man] {
        assert!(path.exists(), "{} not installed", path.display());
    }
    // What the package ships is what the installed binary generates.
    assert_eq!(
        std::fs::read_to_string(&completion)?,
        run(Command::new(&binary).args(["completions", "bash"]))?
    );
    assert!(
        !root
            .path()
            .join("etc/systemd/system/multi-user.target.wants/voodu-agent.service")
            .exists(),
        "the package enabled the unit"
    );
    let version = run(Command::new(&binary).arg("--version"))?;
    println!("installed: {}", version.trim());
    assert!(version.starts_with("voodu-agent "), "{version}");
    let status = run(Command::new("dpkg")
        .arg(format!("--root={}", root.path().display()))
        .args(["-s", "voodu-agent"]))?;
    assert!(status.contains("Status: install ok installed"), "{status}");
    Ok(())
}
