//! Command line: flags → validated config → the command, and its exit code.
//!
//! `voodu-agent --repo URL` runs the agent in the foreground; subcommands inspect its state
//! (`status`, `releases`, `activity`, `logs`) or steer it (`rollback`, `unpin`, `approve`, `sync`,
//! `maintenance`) through state.db and the agent's HTTP side; `fleet status` reads many agents
//! over HTTP.
//!
//! Exit codes, for scripts and CI:
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (also `--help`, `--version`) |
//! | 1 | error, including a usage error (unknown flag, missing argument) |
//! | 2 | `plan --detailed-exitcode` only: the plan has changes |
//! | 130 | the agent got a second SIGTERM/SIGINT and stopped at once |
//! | 141 | stdout was closed before the output was written (`status \| head -1`); quiet |
//!
//! Invariant: 2 means pending changes and nothing else, so clap's own usage-error code (2)
//! is mapped to 1. Output never panics: every `println!`, `print!` and `eprintln!` under
//! `cli/` resolves to the macros below (a `macro_rules!` defined before the `mod` lines
//! shadows std's in those modules), which end the process quietly when stdout is a closed
//! pipe and ignore a closed stderr.

/// Exit code when stdout is closed under us: what a shell reports for a program killed by
/// SIGPIPE (128 + 13), without a message.
const EXIT_BROKEN_PIPE: u8 = 141;

/// Writes formatted text to stdout; a closed pipe ends the process quietly
/// ([`EXIT_BROKEN_PIPE`]), any other write error ends it with exit 1 and the error.
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::cli::stdout_write(::std::format_args!($($arg)*))
    };
}

/// [`print!`] with a newline.
macro_rules! println {
    () => {
        $crate::cli::stdout_write(::std::format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::stdout_write(::std::format_args!("{}\n", ::std::format_args!($($arg)*)))
    };
}

/// Writes a line to stderr, ignoring failure (there is nowhere left to report it).
macro_rules! eprintln {
    ($($arg:tt)*) => {
        $crate::cli::stderr_write(::std::format_args!("{}\n", ::std::format_args!($($arg)*)))
    };
}

mod activity;
mod approve;
mod backup;
mod config;
mod convert;
mod fleet;
mod freeze;
mod images;
mod install;
mod log;
mod logs;
mod maintenance;
mod notify;
mod plan;
mod redeploy;
mod releases;
mod rollback;
mod rollout;
mod run;
mod shell;
mod status;
mod sync;
mod trust;
mod unpin;
mod validate;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::store::{Origin, Store, Who};

/// GitOps for a Docker host: watches a git repository of voodu HCL manifests and makes the
/// local Docker engine match it.
///
/// `git push` deploys, `git revert` rolls back. Run the agent with `voodu-agent --repo URL`;
/// inspect it with `voodu-agent status` and `voodu-agent releases SCOPE/NAME`; in an
/// emergency, `voodu-agent rollback SCOPE/NAME` re-applies an earlier release and pins it.
#[derive(Debug, Parser)]
#[command(name = "voodu-agent", version = VERSION_TEXT, args_conflicts_with_subcommands = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: run::RunArgs,
    /// Where the agent keeps its git mirror and state.db. Default: under systemd the
    /// service's state directory ($STATE_DIRECTORY, /var/lib/voodu-agent), else
    /// $XDG_STATE_HOME/voodu-agent, else ~/.local/state/voodu-agent; the commands that read
    /// an agent's state fall back to /var/lib/voodu-agent when that has the only state.db.
    #[arg(long, global = true, env = "VOODU_AGENT_DATA_DIR", value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    data_dir: Option<PathBuf>,
    /// When to colour what is printed (help, usage errors, the log on a terminal): `auto`
    /// colours a terminal unless NO_COLOR is set (CLICOLOR_FORCE forces it), `always`,
    /// `never`.
    #[arg(long, global = true, env = "VOODU_COLOR", value_name = "WHEN", value_enum, default_value_t = clap::ColorChoice::Auto)]
    color: clap::ColorChoice,
}

/// `--version`: the crate's version and the commit it was built from.
const VERSION_TEXT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("VOODU_AGENT_COMMIT"),
    ")"
);

/// The parser of a boolean flag, so its environment variable may say `1`/`0`, `yes`/`no`,
/// `on`/`off` or `true`/`false`, as systemd environment files do.
fn boolish() -> clap::builder::BoolishValueParser {
    clap::builder::BoolishValueParser::new()
}

/// The data dir of the packaged service (`StateDirectory=voodu-agent`).
const SERVICE_DATA_DIR: &str = crate::manifest::DEFAULT_DATA_DIR;

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the last seen, applied and rejected commits and every resource's state and pin.
    /// Works while the agent runs.
    Status(status::StatusArgs),
    /// Edit or read the host-local config buckets: `${VAR}` values and container environment
    /// (`config set SCOPE[/NAME] KEY=VALUE…`, `get`, `unset`, `list`).
    Config(config::ConfigArgs),
    /// Show what this host would create, update, replace, delete or leave if the given
    /// manifests were applied (exit 2 with --detailed-exitcode when there are changes).
    Plan(plan::PlanArgs),
    /// Check a directory of manifests (no git, no agent needed): every problem as
    /// `path:line:col: message`. Exit 0 when the set would be accepted, 1 otherwise.
    Validate(validate::ValidateArgs),
    /// Write voodu HCL for a Compose file: each service a deployment (a statefulset when it
    /// keeps data in a named volume of its own); every key not carried over is named on
    /// stderr as `compose.yaml:LINE:COL: KEY: not carried: WHY`. README "From Docker Compose".
    Convert(convert::ConvertArgs),
    /// Image automation: each resource's `image_update` policy, the tag it runs, the newer
    /// tag its policy found, the mode, and its repository's last scan (time and error).
    Images(images::ImagesArgs),
    /// List a resource's releases (one per rollout, keyed to its commit), newest first.
    Releases(releases::ReleasesArgs),
    /// Re-apply an earlier release of a resource and pin it: auto-sync is paused for it until
    /// a commit changes it in git or `voodu-agent unpin`.
    Rollback(rollback::RollbackArgs),
    /// Clear a rollback pin: the resource follows git again.
    Unpin(unpin::UnpinArgs),
    /// End the pause of a deployment's canary step (or switch a blue/green release's main
    /// host to it): the rollout goes on. Exit 1 when no rollout is in flight.
    Promote(rollout::RolloutArgs),
    /// Stop a deployment's canary or blue/green rollout: traffic goes back to the stable
    /// release at once, the new replicas are removed and the release fails.
    Abort(rollout::RolloutArgs),
    /// Ask the running agent for a backup of a statefulset's claims now (`backup {}`), or
    /// with --verify a verify of its newest backup.
    Backup(backup::BackupArgs),
    /// List a statefulset's backups, restores and verifies, with their snapshots.
    Backups(backup::BackupsArgs),
    /// Put a statefulset's claims back from a snapshot: the agent stops its pods, restores
    /// them (the old contents kept aside until the pods are Ready again) and starts them.
    Restore(backup::RestoreArgs),
    /// Roll out what a resource declares now as a new release whose images are resolved anew
    /// (a mutable tag that moved runs what it names now; nothing else changes).
    Redeploy(redeploy::RedeployArgs),
    /// Ask the running agent to fetch now (and, with --wait, say how the commit ended).
    Sync(sync::SyncArgs),
    /// The output of a resource's containers (replicas, init containers, release hooks, job
    /// and cron runs), interleaved and prefixed with each container's name; `-f` follows
    /// (new containers join, stopped ones leave). Secrets the agent knows are masked.
    Logs(logs::LogsArgs),
    /// Maintenance mode: `maintenance on SCOPE/NAME [--message TEXT]` makes the ingress answer
    /// every request routed to a deployment with 503, a maintenance page and Retry-After,
    /// while its replicas keep running; `off` routes to them again; `list` (or nothing) lists.
    Maintenance(maintenance::MaintenanceArgs),
    /// Apply a commit a `deploy: manual` trigger file holds (see `status`): exactly that
    /// commit's manifest, for the trigger(s) holding it. Exit 1 when no trigger holds it.
    Approve(approve::ApproveArgs),
    /// Hold every new commit (of --source, else of every source) until --until or
    /// `unfreeze`: accepted and checked, not applied (`status` says HELD until …). `rollback`
    /// and `approve --now` still work.
    Freeze(freeze::FreezeArgs),
    /// Lift a freeze (of --source, else the freeze of every source): a held commit applies
    /// at once.
    Unfreeze(freeze::UnfreezeArgs),
    /// Show the activity log: every change the agent made or was asked to make (commits,
    /// holds and approvals, rollouts, rollbacks, pins, config changes), kept 30 days.
    Activity(activity::ActivityArgs),
    /// Many agents on one repository (`fleet status --agents FILE`): one table of which host
    /// runs which commit, which is degraded, rejected, behind or unreachable.
    Fleet(fleet::FleetArgs),
    /// Install the agent as a systemd service: `voodu-agent install --repo URL [FLAGS…]`
    /// writes the unit and /etc/voodu-agent/voodu-agent.env (the flags as VOODU_*
    /// variables), then enables and starts it (ready once it answers).
    Install(install::InstallArgs),
    /// Notifications: `notify test NAME --notify FILE` sends a test message to one sink of the
    /// file and says whether it was delivered.
    Notify(notify::NotifyArgs),
    /// Print the completion script of a shell (bash, zsh, fish), generated from this
    /// command line: `source <(voodu-agent completions bash)`. The package and `install`
    /// put them in place.
    #[command(hide = true)]
    Completions(shell::CompletionsArgs),
    /// Print the man page, voodu-agent(1), in roff: `voodu-agent man | man -l -`.
    #[command(hide = true)]
    Man,
}

/// How a command opens state.db.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    ReadOnly,
    ReadWrite,
}

/// Opens the agent's state.db, with a helpful error when the agent never ran there.
fn open_store(data_dir: &Path, access: Access) -> anyhow::Result<Store> {
    let db = data_dir.join("state.db");
    if !db.exists() {
        anyhow::bail!(
            "no agent state at {}: start the agent with `voodu-agent --repo URL --data-dir {}` first",
            db.display(),
            data_dir.display()
        );
    }
    Ok(match access {
        Access::ReadOnly => Store::open_read_only(&db)?,
        Access::ReadWrite => Store::open(&db)?.acting_as(cli_who()),
    })
}

/// Prints `view` as pretty JSON with `--json` (`json`), else as `text` prints it.
fn print_view<T: serde::Serialize + ?Sized>(
    json: bool,
    view: &T,
    text: impl FnOnce(&T),
) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(view)?);
    } else {
        text(view);
    }
    Ok(ExitCode::SUCCESS)
}

/// A Unix time as RFC 3339 (UTC, seconds): `YYYY-MM-DDTHH:MM:SSZ`.
fn time(unix: i64) -> String {
    crate::base::rfc3339_seconds(unix.max(0))
}

/// Who a command's changes are recorded as made by in the activity log: `cli`, and the
/// user running it (`SUDO_USER` when run through sudo, else `USER` or `LOGNAME`), as the
/// user's environment says.
pub(crate) fn cli_who() -> Who {
    Who::new(Origin::Cli, cli_user().as_deref())
}

/// The user running this command, as its environment says.
pub(crate) fn cli_user() -> Option<String> {
    ["SUDO_USER", "USER", "LOGNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|user| !user.is_empty()))
}

/// The data dir from the flag (or `VOODU_AGENT_DATA_DIR`), systemd's `STATE_DIRECTORY`, or
/// the per-user default. For a command other than `run` (`reads_service`), a per-user
/// default without a state.db gives way to the service's data dir when that has one, so
/// `sudo voodu-agent status` finds the service.
fn data_dir(flag: Option<PathBuf>, reads_service: bool) -> anyhow::Result<PathBuf> {
    if let Some(dir) = flag.filter(|dir| !dir.as_os_str().is_empty()) {
        return Ok(dir);
    }
    // systemd: `StateDirectory=voodu-agent` sets it (a `:`-separated list; ours is first).
    if let Some(dirs) = std::env::var_os("STATE_DIRECTORY").filter(|dirs| !dirs.is_empty()) {
        let dirs = dirs.to_string_lossy().into_owned();
        let first = dirs.split(':').next().unwrap_or_default();
        return Ok(PathBuf::from(first));
    }
    let user_default =
        if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|dir| !dir.is_empty()) {
            PathBuf::from(state).join("voodu-agent")
        } else {
            match std::env::var_os("HOME").filter(|dir| !dir.is_empty()) {
                Some(home) => PathBuf::from(home).join(".local/state/voodu-agent"),
                None => PathBuf::from(SERVICE_DATA_DIR),
            }
        };
    let service = Path::new(SERVICE_DATA_DIR);
    if reads_service && !user_default.join("state.db").exists() && service.join("state.db").exists()
    {
        return Ok(service.to_owned());
    }
    Ok(user_default)
}

/// Parses the command line and runs it. `main` is only this.
pub fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let choice = color_choice(&args, std::env::var_os("VOODU_COLOR").as_deref());
    let _ = COLOR.set(choice);
    // The parser is dropped before the command runs: kept, its ≈ 0.4 MB of heap stayed for
    // the agent's whole life (heaptrack).
    let cli = {
        let mut command = <Cli as clap::CommandFactory>::command().color(choice);
        match command
            .try_get_matches_from_mut(args)
            .and_then(|matches| <Cli as clap::FromArgMatches>::from_arg_matches(&matches))
        {
            Ok(cli) => cli,
            Err(error) => return usage_exit(&error.format(&mut command)),
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            log::stderr_line(&format!("voodu-agent: {error:#}"));
            ExitCode::from(1)
        }
    }
}

/// `--color` as given (before parsing: help and usage errors are coloured by it): the last
/// `--color WHEN` / `--color=WHEN` before a `--`, else `VOODU_COLOR`, else `auto`. A value
/// that is not a choice counts as `auto` here; the parser then reports it.
fn color_choice(args: &[std::ffi::OsString], env: Option<&std::ffi::OsStr>) -> clap::ColorChoice {
    use clap::ValueEnum as _;
    let parse = |text: &std::ffi::OsStr| {
        text.to_str()
            .and_then(|text| clap::ColorChoice::from_str(text, true).ok())
    };
    let mut given = None;
    let mut words = args.iter().skip(1);
    while let Some(word) = words.next() {
        if word == "--" {
            break;
        }
        if word == "--color" {
            given = words.next().map(|value| parse(value));
        } else if let Some(value) = word.to_str().and_then(|word| word.strip_prefix("--color=")) {
            given = Some(parse(std::ffi::OsStr::new(value)));
        }
    }
    match given {
        Some(choice) => choice.unwrap_or(clap::ColorChoice::Auto),
        None => env.and_then(parse).unwrap_or(clap::ColorChoice::Auto),
    }
}

/// The `--color` of this process, set once by [`main`].
static COLOR: std::sync::OnceLock<clap::ColorChoice> = std::sync::OnceLock::new();

/// Whether what the agent writes itself to stderr (the log's levels) is coloured: by
/// `--color`, and for `auto` when stderr is a terminal and NO_COLOR is unset or empty
/// (no-color.org).
pub(crate) fn colour_stderr() -> bool {
    let choice = COLOR.get().copied().unwrap_or(clap::ColorChoice::Auto);
    colour(
        choice,
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty()),
    )
}

/// [`colour_stderr`]'s decision.
fn colour(choice: clap::ColorChoice, terminal: bool, no_color: bool) -> bool {
    match choice {
        clap::ColorChoice::Always => true,
        clap::ColorChoice::Never => false,
        clap::ColorChoice::Auto => terminal && !no_color,
    }
}

/// Prints clap's message (help and version to stdout, errors to stderr) and maps it to an
/// exit code: 0 for help and version, 1 for a usage error, never 2.
fn usage_exit(error: &clap::Error) -> ExitCode {
    let printed = error.print();
    if !error.use_stderr() {
        return match printed {
            Err(failure) if failure.kind() == std::io::ErrorKind::BrokenPipe => {
                ExitCode::from(EXIT_BROKEN_PIPE)
            }
            _ => ExitCode::SUCCESS,
        };
    }
    ExitCode::from(1)
}

/// Backs `print!`/`println!` in `cli/`: see the module docs.
pub(crate) fn stdout_write(text: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_fmt(text).and_then(|()| stdout.flush());
    match written {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(EXIT_BROKEN_PIPE.into())
        }
        Err(error) => {
            stderr_write(format_args!(
                "voodu-agent: cannot write to stdout: {error}\n"
            ));
            std::process::exit(1)
        }
    }
}

/// Backs `eprintln!` in `cli/`: see the module docs.
pub(crate) fn stderr_write(text: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = std::io::stderr().lock().write_fmt(text);
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let data_dir = data_dir(cli.data_dir, cli.command.is_some())?;
    match cli.command {
        Some(Command::Status(args)) => status::run(&data_dir, &args),
        Some(Command::Validate(args)) => validate::run(&args, &data_dir),
        Some(Command::Plan(args)) => plan::run(&args, &data_dir),
        Some(Command::Convert(args)) => convert::run(&args),
        Some(Command::Config(args)) => config::run(&args, &data_dir),
        Some(Command::Releases(args)) => releases::run(&data_dir, &args),
        Some(Command::Images(args)) => images::run(&data_dir, &args),
        Some(Command::Rollback(args)) => rollback::run(&data_dir, &args),
        Some(Command::Unpin(args)) => unpin::run(&data_dir, &args),
        Some(Command::Promote(args)) => {
            rollout::run(&data_dir, &args, crate::store::RolloutRequest::Promote)
        }
        Some(Command::Abort(args)) => {
            rollout::run(&data_dir, &args, crate::store::RolloutRequest::Abort)
        }
        Some(Command::Backup(args)) => backup::run_backup(&data_dir, &args),
        Some(Command::Backups(args)) => backup::run_list(&data_dir, &args),
        Some(Command::Restore(args)) => backup::run_restore(&data_dir, &args),
        Some(Command::Redeploy(args)) => redeploy::run(&data_dir, &args),
        Some(Command::Sync(args)) => sync::run(&data_dir, &args),
        Some(Command::Approve(args)) => approve::run(&data_dir, &args),
        Some(Command::Maintenance(args)) => maintenance::run(&data_dir, &args),
        Some(Command::Freeze(args)) => freeze::run_freeze(&data_dir, &args),
        Some(Command::Unfreeze(args)) => freeze::run_unfreeze(&data_dir, &args),
        Some(Command::Logs(args)) => logs::run(&data_dir, &args),
        Some(Command::Activity(args)) => activity::run(&data_dir, &args),
        Some(Command::Fleet(args)) => fleet::run(&args),
        Some(Command::Install(args)) => install::run(&args),
        Some(Command::Notify(args)) => notify::run(&args),
        Some(Command::Completions(args)) => shell::run_completions(&args),
        Some(Command::Man) => shell::run_man(),
        None => run::run(cli.run, data_dir),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    /// Every flag of `run` (the top-level command: `voodu-agent --repo …`) can be set from
    /// the environment, as a systemd environment file does: `VOODU_` and the flag's name in
    /// upper snake case, shown in `--help`. A flag added without `env = "VOODU_…"` fails here.
    #[test]
    fn every_run_flag_reads_a_voodu_environment_variable() {
        let command = Cli::command();
        let mut problems = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for arg in command.get_arguments() {
            if matches!(
                arg.get_action(),
                clap::ArgAction::Help
                    | clap::ArgAction::HelpShort
                    | clap::ArgAction::HelpLong
                    | clap::ArgAction::Version
            ) {
                continue;
            }
            let Some(long) = arg.get_long() else {
                problems.push(format!("{}: not a --flag", arg.get_id()));
                continue;
            };
            let expected = match long {
                // Its name since before the convention; documented and kept.
                "data-dir" => "VOODU_AGENT_DATA_DIR".to_owned(),
                _ => format!("VOODU_{}", long.to_uppercase().replace('-', "_")),
            };
            match arg.get_env().and_then(|env| env.to_str()) {
                Some(env) if env == expected => {}
                Some(env) => problems.push(format!("--{long}: env {env}, expected {expected}")),
                None => problems.push(format!("--{long}: no env (add env = \"{expected}\")")),
            }
            if arg.is_hide_env_set() {
                problems.push(format!("--{long}: its environment variable is hidden"));
            }
            if !seen.insert(expected.clone()) {
                problems.push(format!("{expected}: used twice"));
            }
        }
        assert!(problems.is_empty(), "{problems:#?}");
        assert!(seen.len() > 30, "only {} flags seen: {seen:?}", seen.len());
    }

    #[test]
    fn color_is_read_before_parsing() {
        use clap::ColorChoice::{Always, Auto, Never};
        let args = |text: &[&str]| -> Vec<std::ffi::OsString> {
            std::iter::once("voodu-agent")
                .chain(text.iter().copied())
                .map(std::ffi::OsString::from)
                .collect()
        };
        let env = Some(std::ffi::OsStr::new("never"));
        assert_eq!(color_choice(&args(&["--help"]), None), Auto);
        assert_eq!(color_choice(&args(&["--help"]), env), Never);
        assert_eq!(
            color_choice(&args(&["--color", "always", "--help"]), env),
            Always
        );
        assert_eq!(
            color_choice(&args(&["status", "--color=never"]), None),
            Never
        );
        assert_eq!(
            color_choice(&args(&["--color=always", "--color", "never"]), None),
            Never
        );
        assert_eq!(color_choice(&args(&["--color", "purple"]), env), Auto);
        assert_eq!(
            color_choice(&args(&["--", "--color", "always"]), None),
            Auto
        );
        assert!(colour(Always, false, true));
        assert!(!colour(Never, true, false));
        assert!(colour(Auto, true, false));
        assert!(!colour(Auto, true, true), "NO_COLOR");
        assert!(!colour(Auto, false, false), "not a terminal");
    }

    /// The agent's flags are grouped by topic in `--help` (and the man page's sections).
    #[test]
    fn run_flags_are_grouped_by_topic() {
        let command = Cli::command();
        let mut headings = Vec::new();
        for arg in command.get_arguments().filter(|arg| !arg.is_hide_set()) {
            let heading = arg.get_help_heading();
            if heading.is_none() {
                let long = arg.get_long().unwrap_or_default();
                assert!(
                    ["data-dir", "color", "help", "version"].contains(&long),
                    "--{long} has no help_heading"
                );
            }
            if let Some(heading) = heading
                && !headings.contains(&heading)
            {
                headings.push(heading);
            }
        }
        assert!(headings.len() >= 8, "{headings:?}");
    }

    /// Boolean flags take what environment files write (`1`, `yes`, `true`, `on`, …).
    #[test]
    fn boolean_flags_take_environment_file_spellings() {
        use clap::builder::TypedValueParser as _;
        for (text, expected) in [
            ("1", true),
            ("yes", true),
            ("true", true),
            ("on", true),
            ("0", false),
            ("no", false),
            ("false", false),
        ] {
            let parsed = boolish()
                .parse_ref(&Cli::command(), None, std::ffi::OsStr::new(text))
                .expect("boolish");
            assert_eq!(parsed, expected, "{text}");
        }
    }
}
