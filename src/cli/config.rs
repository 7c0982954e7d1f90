//! `voodu-agent config set|get|unset|list SCOPE[/NAME] …`: the host-local config buckets in
//! `state.db` (spec §4): `${VAR}` values for manifests and the environment of the containers
//! that read them. `SCOPE` alone is the scope-level bucket; `SCOPE/NAME` an app bucket.
//!
//! Works while the agent runs (SQLite WAL); the agent re-applies the current commit on its
//! next poll when a bucket changed. `list` shows keys only; `get` prints values (it is the
//! operator asking).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::store::Store;

#[derive(Debug, Args)]
pub(super) struct ConfigArgs {
    #[command(subcommand)]
    action: ConfigAction,
}

#[derive(Debug, Subcommand)]
enum ConfigAction {
    /// Set KEY=VALUE pairs in a bucket.
    Set {
        /// `SCOPE` (scope-level bucket) or `SCOPE/NAME` (app bucket).
        bucket: String,
        #[arg(required = true, value_name = "KEY=VALUE")]
        pairs: Vec<String>,
    },
    /// Print a bucket's values (all, or the given keys).
    Get {
        bucket: String,
        keys: Vec<String>,
        /// Print `{"bucket", "values": {KEY: VALUE}, "missing": [KEY]}`.
        #[arg(long)]
        json: bool,
    },
    /// Remove keys from a bucket.
    Unset {
        bucket: String,
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// List buckets and their keys (values are not shown).
    List {
        /// Only this bucket.
        bucket: Option<String>,
        /// Print `[{"bucket", "keys": [KEY]}]`.
        #[arg(long)]
        json: bool,
    },
}

fn parse_bucket(text: &str) -> anyhow::Result<(String, String)> {
    let (scope, name) = match text.split_once('/') {
        Some((scope, name)) => (scope, name),
        None => (text, ""),
    };
    let valid = |part: &str| {
        part.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
            && !part.contains("..")
    };
    if !valid(scope) || (!name.is_empty() && !valid(name)) {
        anyhow::bail!("{text:?} is not SCOPE or SCOPE/NAME (letters, digits, `_`, `.`, `-`)");
    }
    Ok((scope.to_owned(), name.to_owned()))
}

fn valid_key(key: &str) -> bool {
    key.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(super) fn run(args: &ConfigArgs, data_dir: &Path) -> anyhow::Result<ExitCode> {
    let db = data_dir.join("state.db");
    match &args.action {
        ConfigAction::Set { bucket, pairs } => {
            let (scope, name) = parse_bucket(bucket)?;
            let mut values = BTreeMap::new();
            for pair in pairs {
                let Some((key, value)) = pair.split_once('=') else {
                    anyhow::bail!("{pair:?} is not KEY=VALUE");
                };
                if !valid_key(key) {
                    anyhow::bail!("{key:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)");
                }
                values.insert(key.to_owned(), value.to_owned());
            }
            std::fs::create_dir_all(data_dir)
                .with_context(|| format!("cannot create {}", data_dir.display()))?;
            let store = Store::open(&db)?.acting_as(super::cli_who());
            let changed = store.config_set(&scope, &name, &values)?;
            println!(
                "{} changed in {bucket}: {}",
                changed.len(),
                changed.join(" ")
            );
        }
        ConfigAction::Get { bucket, keys, json } => {
            let (scope, name) = parse_bucket(bucket)?;
            let store = open_existing(&db)?;
            let values = store.config_get(&scope, &name)?;
            let mut missing = Vec::new();
            let mut shown = BTreeMap::new();
            for (key, value) in &values.0 {
                if keys.is_empty() || keys.contains(key) {
                    shown.insert(key.as_str(), value.as_str());
                }
            }
            for key in keys {
                if !values.0.contains_key(key) {
                    missing.push(key.as_str());
                }
            }
            if *json {
                let view = serde_json::json!({
                    "bucket": bucket,
                    "values": shown,
                    "missing": missing,
                });
                println!("{}", serde_json::to_string_pretty(&view)?);
                return Ok(if missing.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                });
            }
            for (key, value) in &shown {
                println!("{key}={value}");
            }
            if !missing.is_empty() {
                eprintln!("not set in {bucket}: {}", missing.join(" "));
                return Ok(ExitCode::from(1));
            }
        }
        ConfigAction::Unset { bucket, keys } => {
            let (scope, name) = parse_bucket(bucket)?;
            let store = Store::open(&db)?.acting_as(super::cli_who());
            let removed = store.config_unset(&scope, &name, keys)?;
            println!(
                "{} removed from {bucket}: {}",
                removed.len(),
                removed.join(" ")
            );
        }
        ConfigAction::List { bucket, json } => {
            let filter = bucket.as_deref().map(parse_bucket).transpose()?;
            let store = open_existing(&db)?;
            let mut listed = Vec::new();
            for ((scope, name), values) in store.buckets()? {
                if filter
                    .as_ref()
                    .is_some_and(|wanted| wanted != &(scope.clone(), name.clone()))
                {
                    continue;
                }
                let shown = if name.is_empty() {
                    scope
                } else {
                    format!("{scope}/{name}")
                };
                let keys: Vec<String> = values.keys().cloned().collect();
                if !*json {
                    println!("{shown}: {}", keys.join(" "));
                }
                listed.push(serde_json::json!({ "bucket": shown, "keys": keys }));
            }
            if *json {
                println!("{}", serde_json::to_string_pretty(&listed)?);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn open_existing(db: &Path) -> anyhow::Result<Store> {
    if !db.exists() {
        anyhow::bail!("no agent state at {} (pass --data-dir)", db.display());
    }
    Ok(Store::open_read_only(db)?)
}
