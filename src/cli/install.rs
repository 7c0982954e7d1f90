//! `voodu-agent install RUN-FLAGS…`: install the agent as a systemd service in one command.
//!
//! Checks the flags exactly as `voodu-agent RUN-FLAGS…` would take them, writes them as
//! `VOODU_*` variables to `/etc/voodu-agent/voodu-agent.env` (mode 0600; the old one kept as
//! `.env.old`), writes the unit (`dist/systemd/voodu-agent.service`, built in, with
//! `ExecStart` set to this binary) to `/etc/systemd/system/`, then `systemctl daemon-reload`
//! and `systemctl enable --now voodu-agent`, which returns once the agent said `READY=1`.
//!
//! It also writes the shell's completions (bash, zsh, fish) and the man page where the Debian
//! package puts them (`cli/shell.rs`). With `--root DIR` the files go under DIR and nothing is
//! started (packaging, tests).
//!
//! Invariants: only the flags given on this command line are written (the installer's own
//! `VOODU_*` environment is not copied into the service); a value the environment file
//! cannot hold (a newline, a `,` inside one item of a list) is refused before anything is
//! written; a relative path (`--sources deploy.hcl`, a local `--repo`) is written absolute,
//! as the service, started in another directory, must read it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::Context as _;
use clap::parser::ValueSource;
use clap::{Args, CommandFactory as _, FromArgMatches as _};
use serde::Serialize;

/// The unit as shipped in the repository and the Debian package.
pub(super) const UNIT: &str = include_str!("../../dist/systemd/voodu-agent.service");
/// The unit's name.
const UNIT_NAME: &str = "voodu-agent.service";
/// Where the packaged binary lives (the unit's `ExecStart`).
const PACKAGED_BINARY: &str = "/usr/bin/voodu-agent";

#[derive(Debug, Args)]
pub(super) struct InstallArgs {
    /// Write the files under this directory instead of `/`, and start nothing.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Enable the service (started at boot) without starting it now.
    #[arg(long)]
    no_start: bool,
    /// Print what was done as JSON.
    #[arg(long)]
    json: bool,
    /// The agent's flags, as `voodu-agent --repo URL …` takes them (`--repo` is required).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "RUN-FLAGS"
    )]
    run_flags: Vec<OsString>,
}

/// `install --json`.
#[derive(Debug, Serialize)]
struct InstallView {
    unit: String,
    env_file: String,
    /// The variables written, `NAME=value` (file paths and settings; never a secret).
    variables: Vec<String>,
    /// The completions and the man page written.
    shell_files: Vec<String>,
    enabled: bool,
    started: bool,
    /// `systemctl is-active` after the start: `active` once the agent said READY=1.
    active: Option<String>,
}

pub(super) fn run(args: &InstallArgs) -> anyhow::Result<ExitCode> {
    let variables = variables(&args.run_flags)?;
    let root = args.root.clone().unwrap_or_else(|| PathBuf::from("/"));
    let executable = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .context("cannot find this binary's path for the unit's ExecStart")?;
    let unit_path = root.join("etc/systemd/system").join(UNIT_NAME);
    let env_path = root.join("etc/voodu-agent/voodu-agent.env");
    write_file(&unit_path, &unit_text(&executable), 0o644)?;
    if env_path.exists() {
        let mut old = env_path.clone().into_os_string();
        old.push(".old");
        std::fs::copy(&env_path, &old)
            .with_context(|| format!("cannot keep the old {}", env_path.display()))?;
    }
    write_file(&env_path, &env_text(&variables), 0o600)?;
    // Completions and the man page are a convenience: a host whose /usr cannot be written
    // still gets its service.
    let mut shell_files = Vec::new();
    for file in super::shell::install_files(&root)? {
        let written = write_bytes(&file.path, &file.bytes, 0o644);
        match written {
            Ok(()) => shell_files.push(file.path.display().to_string()),
            Err(error) => eprintln!("voodu-agent: warning: {error:#}"),
        }
    }
    let mut view = InstallView {
        unit: unit_path.display().to_string(),
        env_file: env_path.display().to_string(),
        variables: variables
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect(),
        shell_files,
        enabled: false,
        started: false,
        active: None,
    };
    if args.root.is_none() {
        if !Path::new("/run/systemd/system").is_dir() {
            anyhow::bail!(
                "{} and {} are written, but systemd is not running on this host: start the agent with your service manager, or in the foreground with `voodu-agent --repo …`",
                view.unit,
                view.env_file
            );
        }
        systemctl(&["daemon-reload"])?;
        if args.no_start {
            systemctl(&["enable", UNIT_NAME])?;
        } else {
            // Type=notify: returns once the agent said READY=1 (or failed to).
            systemctl(&["enable", "--now", UNIT_NAME]).with_context(|| {
                format!("the service did not start: see `systemctl status {UNIT_NAME}` and `journalctl -u {UNIT_NAME}`")
            })?;
            view.started = true;
        }
        view.enabled = true;
        view.active = Some(is_active());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        println!("wrote {}", view.unit);
        println!("wrote {} ({} settings)", view.env_file, variables.len());
        for file in &view.shell_files {
            println!("wrote {file}");
        }
        match (&view.active, view.started) {
            (Some(active), true) => println!("{UNIT_NAME} enabled and started: {active}"),
            (_, false) if view.enabled => {
                println!("{UNIT_NAME} enabled; start it with `systemctl start {UNIT_NAME}`")
            }
            _ => println!("nothing started (--root)"),
        }
    }
    match view.active.as_deref() {
        Some(active) if view.started && active != "active" => Ok(ExitCode::from(1)),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// The `VOODU_*` variables for the run flags given: each flag set on this command line, by
/// its environment variable, lists joined with `,` (or the flag's own delimiter). Fails as `voodu-agent RUN-FLAGS…`
/// would on a bad flag or value, and without `--repo`.
fn variables(run_flags: &[OsString]) -> anyhow::Result<Vec<(String, String)>> {
    let command = super::Cli::command();
    let argv = std::iter::once(OsString::from("voodu-agent")).chain(run_flags.iter().cloned());
    let matches = command
        .clone()
        .try_get_matches_from(argv)
        .map_err(|error| anyhow::anyhow!("{}", error.render().to_string().trim_end()))?;
    let cli = super::Cli::from_arg_matches(&matches)?;
    if cli.command.is_some() {
        anyhow::bail!("give the agent's flags (`--repo URL …`), not a command");
    }
    super::run::check(&cli.run)?;
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let mut variables = Vec::new();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if matches.value_source(id) != Some(ValueSource::CommandLine) {
            continue;
        }
        let Some(env) = arg.get_env().and_then(|env| env.to_str()) else {
            continue;
        };
        let values: Vec<String> = matches
            .get_raw(id)
            .into_iter()
            .flatten()
            .map(|value| absolute(arg, &value.to_string_lossy(), &cwd))
            .collect();
        let values = if values.is_empty() {
            // A flag without a value (`--adopt`).
            vec!["true".to_owned()]
        } else {
            values
        };
        // `,` unless the flag reads its variable split by another (`--window`: `;`).
        let delimiter = arg.get_value_delimiter().unwrap_or(',');
        for value in &values {
            if value.contains(['\n', '\r', '\0']) {
                anyhow::bail!(
                    "--{}: a value with a line break cannot go in an environment file",
                    arg.get_long().unwrap_or(id)
                );
            }
            if values.len() > 1 && value.contains(delimiter) {
                anyhow::bail!(
                    "--{}: {value:?} contains `{delimiter}`, which separates the items of {env}",
                    arg.get_long().unwrap_or(id)
                );
            }
        }
        variables.push((env.to_owned(), values.join(&delimiter.to_string())));
    }
    Ok(variables)
}

/// `value` of `arg` as the service must read it: a relative path made absolute against `cwd`
/// (the flags of files and directories, a program given with a `/`, a `--repo` that is a
/// local path);
/// anything else (a URL, `--policy default`, `--path` inside the repository) as given.
fn absolute(arg: &clap::Arg, value: &str, cwd: &Path) -> String {
    use clap::ValueHint;
    let path = |text: &str| -> String {
        if text.is_empty() || Path::new(text).is_absolute() {
            return text.to_owned();
        }
        // An existing path as the kernel resolves it (`..`, symlinks); else joined, where
        // `components` drops the `.` ones (`./x` → `x`).
        let joined = cwd.join(text);
        let joined = std::fs::canonicalize(&joined)
            .unwrap_or_else(|_| joined.components().collect::<PathBuf>());
        joined.display().to_string()
    };
    match (arg.get_id().as_str(), arg.get_value_hint()) {
        ("policy", _) if value == "default" => value.to_owned(),
        ("repo", _) => {
            // A URL (`scheme://`) or scp-like `host:path` (a `:` before any `/`) stays.
            let remote = value.contains("://")
                || value
                    .find(':')
                    .is_some_and(|colon| !value[..colon].contains('/'));
            if remote {
                value.to_owned()
            } else {
                path(value)
            }
        }
        (_, ValueHint::ExecutablePath) if value.contains('/') => path(value),
        (_, ValueHint::FilePath | ValueHint::DirPath | ValueHint::AnyPath) => path(value),
        _ => value.to_owned(),
    }
}

/// The shipped unit with `ExecStart` set to `executable`.
fn unit_text(executable: &Path) -> String {
    let mut text = String::with_capacity(UNIT.len() + 64);
    for line in UNIT.lines() {
        if line.starts_with("ExecStart=") && executable != Path::new(PACKAGED_BINARY) {
            text.push_str(&format!("ExecStart={}", executable.display()));
        } else {
            text.push_str(line);
        }
        text.push('\n');
    }
    text
}

/// The environment file: a header and one `NAME="value"` line per variable (systemd's
/// quoting: `\` and `"` escaped).
fn env_text(variables: &[(String, String)]) -> String {
    let mut text = String::from(
        "# voodu-agent's settings, written by `voodu-agent install` and read by voodu-agent.service.\n# Every flag of `voodu-agent` can be set here as VOODU_<FLAG>; see `voodu-agent --help`.\n# After a change: systemctl restart voodu-agent\n",
    );
    for (name, value) in variables {
        let quoted = value.replace('\\', "\\\\").replace('"', "\\\"");
        text.push_str(&format!("{name}=\"{quoted}\"\n"));
    }
    text
}

/// Writes `text` to `path` atomically (a temp file renamed over it) with `mode`.
fn write_file(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    write_bytes(path, text.as_bytes(), mode)
}

/// [`write_file`] of bytes.
fn write_bytes(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt as _;
    let parent = path.parent().context("a file has a parent directory")?;
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let mut file = tempfile::NamedTempFile::new_in(parent)
        .with_context(|| format!("cannot write in {}", parent.display()))?;
    file.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn systemctl(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("systemctl")
        .args(args)
        .output()
        .context("cannot run systemctl")?;
    if !output.status.success() {
        anyhow::bail!(
            "systemctl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

fn is_active() -> String {
    Command::new("systemctl")
        .args(["is-active", UNIT_NAME])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_else(|error| format!("unknown ({error})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(text: &[&str]) -> Vec<OsString> {
        text.iter().map(OsString::from).collect()
    }

    #[test]
    fn given_flags_become_their_variables() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cret\n")?;
        let secret = secret.to_str().expect("utf-8 temp path");
        let variables = variables(&flags(&[
            "--repo",
            "https://gitlab.example.org/ops/deploy.git",
            "--path",
            "hosts/web-1",
            "--path=common",
            "--adopt",
            "--interval",
            "1m",
            "--allow-cap",
            "NET_ADMIN,SYS_TIME",
            "--listen",
            "0.0.0.0:8687",
            "--webhook-secret-file",
            secret,
        ]))?;
        let text = env_text(&variables).replace(secret, "SECRET-FILE");
        expect_test::expect![[r#"
            # voodu-agent's settings, written by `voodu-agent install` and read by voodu-agent.service.
            # Every flag of `voodu-agent` can be set here as VOODU_<FLAG>; see `voodu-agent --help`.
            # After a change: systemctl restart voodu-agent
            VOODU_REPO="https://gitlab.example.org/ops/deploy.git"
            VOODU_PATH="hosts/web-1,common"
            VOODU_INTERVAL="1m"
            VOODU_LISTEN="0.0.0.0:8687"
            VOODU_WEBHOOK_SECRET_FILE="SECRET-FILE"
            VOODU_ADOPT="true"
            VOODU_ALLOW_CAP="NET_ADMIN,SYS_TIME"
        "#]]
        .assert_eq(&text);
        Ok(())
    }

    /// The service starts elsewhere: relative paths are written absolute, the rest as given.
    #[test]
    fn relative_paths_are_written_absolute() -> anyhow::Result<()> {
        let cwd = std::env::current_dir()?;
        let dir = tempfile::tempdir()?;
        let sources = dir.path().join("sources.hcl");
        std::fs::write(
            &sources,
            "source \"apps\" {\n  url = \"https://git.example.org/apps.git\"\n  scopes = [\"apps\"]\n}\n",
        )?;
        // A relative path, as an operator in that directory writes it.
        let relative = pathdiff(&sources, &cwd);
        let written = variables(&flags(&[
            "--sources",
            &relative,
            "--policy",
            "default",
            "--data-dir",
            "./state",
            "--restic",
            "restic",
        ]))?;
        let value = |name: &str| {
            written
                .iter()
                .find(|(variable, _)| variable == name)
                .map(|(_, value)| value.clone())
        };
        assert_eq!(
            value("VOODU_SOURCES").as_deref(),
            Some(sources.to_str().expect("utf-8"))
        );
        assert_eq!(value("VOODU_POLICY").as_deref(), Some("default"));
        assert_eq!(
            value("VOODU_AGENT_DATA_DIR"),
            Some(cwd.join("state").display().to_string())
        );
        assert_eq!(value("VOODU_RESTIC").as_deref(), Some("restic"));
        let repo = |given: &str| -> anyhow::Result<String> {
            let written = variables(&flags(&["--repo", given]))?;
            Ok(written[0].1.clone())
        };
        for remote in [
            "https://git.example.org/a.git",
            "git@git.example.org:ops/deploy.git",
            "file:///srv/deploy",
            "/srv/deploy",
        ] {
            assert_eq!(repo(remote)?, remote);
        }
        assert_eq!(repo("./deploy")?, cwd.join("deploy").display().to_string());
        Ok(())
    }

    /// `path` relative to `base` (both absolute), with `..` as needed.
    fn pathdiff(path: &Path, base: &Path) -> String {
        let path: Vec<_> = path.components().collect();
        let base: Vec<_> = base.components().collect();
        let common = path.iter().zip(&base).take_while(|(a, b)| a == b).count();
        let mut relative = PathBuf::new();
        for _ in common..base.len() {
            relative.push("..");
        }
        for component in &path[common..] {
            relative.push(component);
        }
        relative.display().to_string()
    }

    #[test]
    fn bad_flags_are_refused_before_anything_is_written() {
        let cases: &[(&[&str], &str)] = &[
            (&["--branch", "x"], "no --repo given"),
            (
                &["--repo", "r", "--interval", "soon"],
                "invalid value 'soon'",
            ),
            (
                &["--repo", "r", "--frobnicate"],
                "unexpected argument '--frobnicate'",
            ),
            (&["status"], "not a command"),
            (
                &[
                    "--repo",
                    "http://example.org/r.git",
                    "--git-token-file",
                    "/t",
                ],
                "clear text",
            ),
            (
                &["--repo", "r", "--window", "allow 0 9 * * * forever"],
                "--window: window rule",
            ),
        ];
        for (given, expected) in cases {
            let error = variables(&flags(given)).expect_err("refused");
            let text = format!("{error:#}");
            assert!(text.contains(expected), "{given:?}: {text}");
        }
    }

    #[test]
    fn windows_go_in_their_variable_split_by_semicolons() -> anyhow::Result<()> {
        let found = variables(&flags(&[
            "--repo",
            "r",
            "--window",
            "allow 0 9 * * 1,3 8h",
            "--window",
            "deny @daily 1h",
        ]))?;
        assert!(
            found.contains(&(
                "VOODU_WINDOW".to_owned(),
                "allow 0 9 * * 1,3 8h;deny @daily 1h".to_owned()
            )),
            "{found:?}"
        );
        Ok(())
    }

    #[test]
    fn the_unit_runs_this_binary_unless_it_is_the_packaged_one() {
        let unit = unit_text(Path::new("/opt/voodu/voodu-agent"));
        assert!(
            unit.contains("\nExecStart=/opt/voodu/voodu-agent\n"),
            "{unit}"
        );
        assert!(
            unit.contains("\nType=notify\n") && unit.contains("\nStateDirectory=voodu-agent\n")
        );
        assert_eq!(unit_text(Path::new(PACKAGED_BINARY)), UNIT);
    }
}
