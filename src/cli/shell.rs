//! The shell's conventions: completions (bash, zsh, fish) and the man page, generated from
//! the clap definition (`voodu-agent completions SHELL`, `voodu-agent man`), and where they
//! are installed.
//!
//! Invariant: the copies in `dist/completions/` and `dist/man/` (what the Debian package
//! ships) are byte for byte what these functions generate (a test compares them), and
//! `install` writes these same bytes to the same paths the package uses, so a host has one copy
//! whichever way the agent came.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory as _, ValueEnum};

/// The shells completions are generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Args)]
pub(super) struct CompletionsArgs {
    /// The shell to print the completion script of.
    #[arg(value_enum)]
    shell: Shell,
}

/// The program name completions are registered for.
const BIN: &str = "voodu-agent";

/// The command line definition as the generated files describe it: the crate's version
/// without the commit, so the files change only when the CLI does.
fn definition() -> clap::Command {
    super::Cli::command()
        .version(env!("CARGO_PKG_VERSION"))
        .bin_name(BIN)
}

/// The completion script of `shell`.
pub(super) fn completion(shell: Shell) -> Vec<u8> {
    let mut command = definition();
    let mut out = Vec::new();
    match shell {
        Shell::Bash => {
            clap_complete::generate(clap_complete::Shell::Bash, &mut command, BIN, &mut out);
            // clap_complete 4.6 spells a subcommand's state `voodu__subcmd__agent__subcmd__X`
            // in its case arms but `voodu__agent__subcmd__X` where it sets it, for a bin name
            // with a `-` (clap-rs/clap#6421, open): no subcommand's flags would complete.
            // The arms are renamed to what the loop sets (tests/it/shell.rs drives it).
            let text =
                String::from_utf8_lossy(&out).replace("voodu__subcmd__agent", "voodu__agent");
            out = text.into_bytes();
        }
        Shell::Zsh => {
            clap_complete::generate(clap_complete::Shell::Zsh, &mut command, BIN, &mut out)
        }
        Shell::Fish => {
            clap_complete::generate(clap_complete::Shell::Fish, &mut command, BIN, &mut out)
        }
    }
    out
}

/// The man page, voodu-agent(1), in roff.
pub(super) fn man_page() -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    clap_mangen::Man::new(definition())
        .section("1")
        .manual("voodu-agent")
        .render(&mut out)?;
    Ok(out)
}

/// `voodu-agent completions SHELL`.
pub(super) fn run_completions(args: &CompletionsArgs) -> anyhow::Result<ExitCode> {
    write_stdout(&completion(args.shell))
}

/// `voodu-agent man`.
pub(super) fn run_man() -> anyhow::Result<ExitCode> {
    write_stdout(&man_page()?)
}

fn write_stdout(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            Ok(ExitCode::from(super::EXIT_BROKEN_PIPE))
        }
        Err(error) => Err(error.into()),
    }
}

/// One file of the shell's conventions: where it goes (relative to `/`), what it holds, and
/// the copy the package ships (relative to the checkout).
#[derive(Debug)]
pub(super) struct ShellFile {
    pub(super) path: PathBuf,
    pub(super) bytes: Vec<u8>,
}

/// Where the package puts each file (Debian's places: bash-completion's directory, zsh's
/// vendor-completions, fish's vendor_completions.d, man1 gzipped as cargo-deb does), and so
/// where `install` writes them.
pub(super) const BASH_PATH: &str = "usr/share/bash-completion/completions/voodu-agent";
pub(super) const ZSH_PATH: &str = "usr/share/zsh/vendor-completions/_voodu-agent";
pub(super) const FISH_PATH: &str = "usr/share/fish/vendor_completions.d/voodu-agent.fish";
pub(super) const MAN_PATH: &str = "usr/share/man/man1/voodu-agent.1.gz";

/// The files `install` writes under `root`: the three completions and the gzipped man page.
pub(super) fn install_files(root: &Path) -> anyhow::Result<Vec<ShellFile>> {
    let mut man = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    man.write_all(&man_page()?)?;
    let man = man.finish()?;
    Ok(vec![
        ShellFile {
            path: root.join(BASH_PATH),
            bytes: completion(Shell::Bash),
        },
        ShellFile {
            path: root.join(ZSH_PATH),
            bytes: completion(Shell::Zsh),
        },
        ShellFile {
            path: root.join(FISH_PATH),
            bytes: completion(Shell::Fish),
        },
        ShellFile {
            path: root.join(MAN_PATH),
            bytes: man,
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The package ships `dist/completions/*` and `dist/man/voodu-agent.1` (Cargo.toml's
    /// `[package.metadata.deb]` assets): they must be what the binary generates. After a
    /// change to the CLI, regenerate them with `scripts/gen-shell-files`.
    #[test]
    fn shipped_files_are_what_the_cli_generates() -> anyhow::Result<()> {
        let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist");
        let cases = [
            ("completions/voodu-agent.bash", completion(Shell::Bash)),
            ("completions/_voodu-agent", completion(Shell::Zsh)),
            ("completions/voodu-agent.fish", completion(Shell::Fish)),
            ("man/voodu-agent.1", man_page()?),
        ];
        let mut stale = Vec::new();
        for (path, generated) in cases {
            let shipped = std::fs::read(dist.join(path)).unwrap_or_default();
            if shipped != generated {
                stale.push(path);
            }
        }
        assert!(
            stale.is_empty(),
            "dist/{stale:?} differ from what the CLI generates: run scripts/gen-shell-files"
        );
        Ok(())
    }

    #[test]
    fn the_generated_files_name_the_commands_and_flags() -> anyhow::Result<()> {
        let bash = String::from_utf8(completion(Shell::Bash))?;
        assert!(bash.contains("complete -F _voodu__agent"), "{bash}");
        for word in [
            "status",
            "releases",
            "rollback",
            "--repo",
            "--data-dir",
            "--color",
        ] {
            assert!(bash.contains(word), "{word} not in the bash completion");
        }
        let zsh = String::from_utf8(completion(Shell::Zsh))?;
        assert!(zsh.starts_with("#compdef voodu-agent"), "{zsh}");
        let fish = String::from_utf8(completion(Shell::Fish))?;
        assert!(fish.contains("complete -c voodu-agent"), "{fish}");
        let man = String::from_utf8(man_page()?)?;
        assert!(man.contains(".TH voodu-agent 1"), "{man}");
        // The flags' sections, as in `--help`.
        for heading in ["SOURCE", "RECONCILE", "INGRESS", "HOST POLICY"] {
            assert!(
                man.contains(&format!(".SH \"{heading}\""))
                    || man.contains(&format!(".SH {heading}")),
                "{heading} not in the man page"
            );
        }
        Ok(())
    }

    #[test]
    fn install_writes_the_packaged_paths_and_a_gzipped_man_page() -> anyhow::Result<()> {
        let files = install_files(Path::new("/root-x"))?;
        let paths: Vec<_> = files
            .iter()
            .map(|file| file.path.display().to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "/root-x/usr/share/bash-completion/completions/voodu-agent",
                "/root-x/usr/share/zsh/vendor-completions/_voodu-agent",
                "/root-x/usr/share/fish/vendor_completions.d/voodu-agent.fish",
                "/root-x/usr/share/man/man1/voodu-agent.1.gz",
            ]
        );
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(files[3].bytes.as_slice()),
            &mut text,
        )?;
        assert_eq!(text.as_bytes(), man_page()?.as_slice());
        Ok(())
    }
}
