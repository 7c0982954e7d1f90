//! `voodu-agent convert compose.yaml [--scope S] [-o DIR]`: a Compose file → voodu HCL
//! (`manifest::compose`), each key not carried over named on stderr as
//! `compose.yaml:12:5: services.web.expose: not carried: …`.
//!
//! Reads the Compose file, the `.env` beside it (the environment wins over it, as in Compose)
//! and the files it names (`env_file`, configs' and secrets' `file`), each bounded. Without
//! `-o` the HCL goes to stdout; with `-o DIR` one file per service (`<service>.hcl`) and
//! `compose-assets.hcl` for configs and secrets, refusing to overwrite an existing file unless
//! `--force` (checked for every file before any is written). Exit 1 when the file is invalid
//! or nothing could be converted; notes alone exit 0.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::manifest::compose::{self, MAX_FILE_BYTES, MAX_READ_BYTES, Options};
use crate::model::text::escape;

#[derive(Debug, Args)]
pub(super) struct ConvertArgs {
    /// The Compose file (compose.yaml, docker-compose.yml).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// The scope of the resources written. Default: the Compose project name (`name:`, else
    /// the file's directory name, lower-cased as Compose does).
    #[arg(long, value_name = "SCOPE")]
    scope: Option<String>,
    /// Write one file per service (and compose-assets.hcl) into DIR (created if missing)
    /// instead of printing the HCL.
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    output: Option<PathBuf>,
    /// With -o: overwrite files that exist.
    #[arg(long)]
    force: bool,
    /// Convert the services of this Compose profile too (repeatable; also COMPOSE_PROFILES).
    #[arg(long = "profile", value_name = "NAME")]
    profiles: Vec<String>,
}

/// Reads at most `max` bytes of `path`, refusing a longer file.
fn read_bounded(path: &Path, max: usize) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut text = String::new();
    file.take(max as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if text.len() > max {
        return Err(format!("it is larger than {max} bytes"));
    }
    Ok(text)
}

pub(super) fn run(args: &ConvertArgs) -> anyhow::Result<ExitCode> {
    let shown = args.file.display().to_string();
    let text = read_bounded(&args.file, MAX_FILE_BYTES)
        .map_err(|why| anyhow::anyhow!("{}: {why}", escape(&shown)))?;
    let absolute = std::fs::canonicalize(&args.file)
        .with_context(|| format!("{}: cannot resolve its path", escape(&shown)))?;
    let base = absolute.parent().map(Path::to_path_buf).unwrap_or_default();
    let default_project = base
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut vars: BTreeMap<String, String> = match read_bounded(&base.join(".env"), MAX_READ_BYTES)
    {
        Ok(text) => compose::dotenv(&text),
        Err(_) => BTreeMap::new(),
    };
    vars.extend(std::env::vars());
    let mut profiles = args.profiles.clone();
    if let Some(more) = vars.get("COMPOSE_PROFILES") {
        profiles.extend(
            more.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
        );
    }
    let read = |name: &str| read_bounded(&base.join(name), MAX_READ_BYTES);
    let options = Options {
        base_dir: base.to_string_lossy().into_owned(),
        scope: args.scope.clone(),
        default_project,
        vars,
        profiles,
        read: &read,
    };
    let conversion = match compose::convert(&text, &options) {
        Ok(conversion) => conversion,
        Err(error) => {
            eprintln!(
                "{}",
                escape(&format!(
                    "{shown}:{}:{}: {}",
                    error.line, error.col, error.message
                ))
            );
            return Ok(ExitCode::from(1));
        }
    };
    for note in &conversion.notes {
        eprintln!("{}", note.show(&shown));
    }
    let services = conversion
        .files
        .iter()
        .filter(|f| f.name != "compose-assets.hcl")
        .count();
    match &args.output {
        None => {
            for (index, file) in conversion.files.iter().enumerate() {
                if index > 0 {
                    println!();
                }
                println!("// ---- {}", file.name);
                print!("{}", file.text);
            }
        }
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", escape(&dir.display().to_string())))?;
            let existing: Vec<String> = conversion
                .files
                .iter()
                .map(|f| dir.join(&f.name))
                .filter(|p| p.exists())
                .map(|p| p.display().to_string())
                .collect();
            if !existing.is_empty() && !args.force {
                eprintln!(
                    "{}",
                    escape(&format!(
                        "convert: refusing to overwrite {} (pass --force to overwrite)",
                        existing.join(", ")
                    ))
                );
                return Ok(ExitCode::from(1));
            }
            for file in &conversion.files {
                let path = dir.join(&file.name);
                std::fs::write(&path, &file.text).with_context(|| {
                    format!("cannot write {}", escape(&path.display().to_string()))
                })?;
            }
            eprintln!(
                "{}",
                escape(&format!(
                    "convert: {services} service(s) of {shown} written to {} as scope {:?}; {} note(s) above",
                    dir.display(),
                    conversion.scope,
                    conversion.notes.len()
                ))
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
