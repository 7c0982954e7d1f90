//! The shell's conventions, as a user meets them: bash completes the commands through the
//! generated completion function, `--help` is grouped by topic, NO_COLOR and `--color` are
//! honoured, and `install` puts the completions and the man page in place.

use std::process::Command;

use crate::support::TestResult;

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
}

fn stdout(command: &mut Command) -> TestResult<String> {
    let output = command.output()?;
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// Loads the generated bash completion into a plain bash (no bash-completion package, no rc
/// files), finds the function `complete -p` registered for voodu-agent, and calls it as
/// readline does for each line (COMP_WORDS, COMP_CWORD, COMP_LINE, COMP_POINT); prints each
/// line's COMPREPLY after a `== LINE` marker.
const DRIVER: &str = r#"
set -u
source "$1"
spec=$(complete -p voodu-agent)
fn=$(sed -E 's/.* -F ([^ ]+) .*/\1/' <<<"$spec")
shift
for line in "$@"; do
  COMP_LINE=$line
  COMP_POINT=${#COMP_LINE}
  read -ra COMP_WORDS <<<"$line"
  if [[ $line == *" " ]]; then COMP_WORDS+=(""); fi
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  "$fn" voodu-agent "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}" 2>/dev/null
  echo "== $line"
  printf '%s\n' "${COMPREPLY[@]}"
done
"#;

#[test]
fn bash_completes_the_commands() -> TestResult {
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("voodu-agent.bash");
    std::fs::write(&script, stdout(agent().args(["completions", "bash"]))?)?;
    let output = stdout(
        Command::new("bash")
            .args(["--norc", "--noprofile", "-c", DRIVER, "driver"])
            .arg(&script)
            .args([
                "voodu-agent ",
                "voodu-agent sta",
                "voodu-agent rel",
                "voodu-agent releases --",
                "voodu-agent --log-format ",
            ]),
    )?;
    println!("{output}");
    let replies = |line: &str| -> Vec<&str> {
        output
            .split(&format!("== {line}\n"))
            .nth(1)
            .unwrap_or_default()
            .lines()
            .take_while(|reply| !reply.starts_with("== "))
            .collect()
    };
    let first = replies("voodu-agent ");
    for command in ["status", "releases", "rollback", "install", "--repo"] {
        assert!(first.contains(&command), "{command} not in {first:?}");
    }
    assert_eq!(replies("voodu-agent sta"), ["status"]);
    assert_eq!(replies("voodu-agent rel"), ["releases"]);
    let flags = replies("voodu-agent releases --");
    assert!(
        flags.contains(&"--json") && flags.contains(&"--data-dir"),
        "{flags:?}"
    );
    assert!(!flags.contains(&"--repo"), "{flags:?}");
    assert_eq!(replies("voodu-agent --log-format "), ["text", "json"]);
    Ok(())
}

#[test]
fn help_is_grouped_by_topic() -> TestResult {
    let help = stdout(agent().arg("--help"))?;
    let headings: Vec<&str> = help
        .lines()
        .filter(|line| !line.starts_with(' ') && line.ends_with(':'))
        .collect();
    for heading in [
        "Commands:",
        "Source:",
        "Reconcile:",
        "HTTP:",
        "Notifications:",
        "Ingress:",
        "Host policy:",
        "Fleet:",
    ] {
        assert!(headings.contains(&heading), "{heading} not in {headings:?}");
    }
    // A flag sits under its topic.
    // A section runs to the next heading (a line that is not indented).
    let section = |heading: &str| -> String {
        help.split(&format!("\n{heading}\n"))
            .nth(1)
            .unwrap_or_default()
            .lines()
            .take_while(|line| line.is_empty() || line.starts_with(' '))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let ingress = section("Ingress:");
    assert!(ingress.contains("--ingress-image"), "{ingress}");
    assert!(!ingress.contains("--repo"), "{ingress}");
    // The hidden commands stay out of the help.
    assert!(!help.contains("completions"), "{help}");
    Ok(())
}

/// `--color always` colours the help (so the check below can see escapes), CLICOLOR_FORCE
/// does in `auto`, and NO_COLOR or `--color never` remove every escape, in the help and in a
/// usage error.
#[test]
fn no_color_and_color_never_print_no_escapes() -> TestResult {
    let has_escape = |text: &[u8]| text.contains(&0x1b);
    let help = |args: &[&str], env: &[(&str, &str)]| -> TestResult<Vec<u8>> {
        let mut command = agent();
        command.args(args).arg("--help").env_remove("NO_COLOR");
        for (name, value) in env {
            command.env(name, value);
        }
        Ok(command.output()?.stdout)
    };
    assert!(has_escape(&help(&["--color", "always"], &[])?));
    assert!(has_escape(&help(&[], &[("CLICOLOR_FORCE", "1")])?));
    assert!(has_escape(&help(&[], &[("VOODU_COLOR", "always")])?));
    assert!(!has_escape(&help(
        &[],
        &[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")]
    )?));
    assert!(!has_escape(&help(
        &["--color", "never"],
        &[("CLICOLOR_FORCE", "1")]
    )?));
    assert!(!has_escape(&help(
        &["status", "--color=never"],
        &[("CLICOLOR_FORCE", "1")]
    )?));
    let usage = |color: &str| -> TestResult<(Option<i32>, Vec<u8>)> {
        let output = agent()
            .args(["--color", color, "--frobnicate"])
            .env_remove("NO_COLOR")
            .output()?;
        Ok((output.status.code(), output.stderr))
    };
    let (code, stderr) = usage("always")?;
    assert_eq!(code, Some(1));
    assert!(has_escape(&stderr));
    let (code, stderr) = usage("never")?;
    assert_eq!(code, Some(1));
    assert!(!has_escape(&stderr), "{}", String::from_utf8_lossy(&stderr));
    Ok(())
}

/// `install --root DIR` writes the completions and the gzipped man page where the Debian
/// package does, and a relative `--sources` as an absolute path.
#[test]
fn install_writes_completions_man_page_and_absolute_paths() -> TestResult {
    let work = tempfile::tempdir()?;
    std::fs::write(
        work.path().join("sources.hcl"),
        "source \"apps\" {\n  url = \"https://git.example.org/apps.git\"\n  scopes = [\"apps\"]\n}\n",
    )?;
    let root = tempfile::tempdir()?;
    let output = stdout(
        agent()
            .current_dir(work.path())
            .arg("install")
            .arg("--root")
            .arg(root.path())
            .args(["--sources", "sources.hcl"]),
    )?;
    println!("{output}");
    let env = std::fs::read_to_string(root.path().join("etc/voodu-agent/voodu-agent.env"))?;
    let work_dir = std::fs::canonicalize(work.path())?;
    assert!(
        env.contains(&format!(
            "VOODU_SOURCES=\"{}\"",
            work_dir.join("sources.hcl").display()
        )) || env.contains(&format!(
            "VOODU_SOURCES=\"{}\"",
            work.path().join("sources.hcl").display()
        )),
        "{env}"
    );
    let bash = std::fs::read_to_string(
        root.path()
            .join("usr/share/bash-completion/completions/voodu-agent"),
    )?;
    assert_eq!(bash, stdout(agent().args(["completions", "bash"]))?);
    for path in [
        "usr/share/zsh/vendor-completions/_voodu-agent",
        "usr/share/fish/vendor_completions.d/voodu-agent.fish",
    ] {
        assert!(root.path().join(path).is_file(), "{path}");
        assert!(output.contains(path), "{output}");
    }
    let man = root.path().join("usr/share/man/man1/voodu-agent.1.gz");
    let gz = std::fs::read(&man)?;
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "not gzip");
    // The same text `man` prints, as `man -l` reads it.
    let unzipped = stdout(Command::new("gzip").arg("-dc").arg(&man))?;
    assert_eq!(unzipped, stdout(agent().arg("man"))?);
    assert!(unzipped.contains(".SH SOURCE"), "{unzipped}");
    Ok(())
}
