//! `voodu-agent status`: what the agent last saw, applied and rejected, and each resource's
//! state, read from state.db (read-only, so it works while the agent runs).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use crate::store::{CommitRecord, Store};

#[derive(Debug, Args)]
pub(super) struct StatusArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The JSON document `status --json` prints.
#[derive(Debug, Serialize)]
pub(crate) struct StatusView {
    pub(crate) last_seen: Option<CommitView>,
    pub(crate) last_applied: Option<CommitView>,
    pub(crate) last_rejected: Option<CommitView>,
    pub(crate) resources: Vec<ResourceView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct CommitView {
    pub(crate) sha: String,
    pub(crate) outcome: &'static str,
    pub(crate) seen_at: i64,
    /// `path:line:col: message`, one per problem (rejected commits only).
    pub(crate) errors: Vec<String>,
    pub(crate) diagnostics: Vec<DiagnosticView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct DiagnosticView {
    pub(crate) path: String,
    pub(crate) line: usize,
    pub(crate) col: usize,
    pub(crate) message: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct ResourceView {
    pub(crate) kind: String,
    pub(crate) scope: String,
    pub(crate) name: String,
    pub(crate) phase: String,
    pub(crate) message: String,
    pub(crate) desired_replicas: usize,
    pub(crate) running_replicas: usize,
    pub(crate) spec_hash: String,
    pub(crate) release: Option<ReleaseView>,
    pub(crate) updated_at: i64,
}

#[derive(Debug, Serialize)]
pub(crate) struct ReleaseView {
    pub(crate) id: i64,
    pub(crate) commit: String,
    pub(crate) phase: &'static str,
}

fn commit_view(record: CommitRecord) -> CommitView {
    CommitView {
        sha: record.sha.to_string(),
        outcome: if record.applied {
            "applied"
        } else {
            "rejected"
        },
        seen_at: record.seen_at,
        errors: record.errors.iter().map(ToString::to_string).collect(),
        diagnostics: record
            .errors
            .into_iter()
            .map(|diagnostic| DiagnosticView {
                path: diagnostic.path,
                line: diagnostic.line,
                col: diagnostic.col,
                message: diagnostic.message,
            })
            .collect(),
    }
}

/// Builds the status document from the store.
pub(crate) fn build(store: &Store) -> crate::store::Result<StatusView> {
    let commits = store.commit_summary()?;
    let mut resources = Vec::new();
    for (key, status) in store.statuses()? {
        let release = store.latest_release(&key)?.map(|release| ReleaseView {
            id: release.id,
            commit: release.commit.to_string(),
            phase: release.phase.as_str(),
        });
        resources.push(ResourceView {
            kind: key.kind.to_string(),
            scope: key.scope,
            name: key.name,
            phase: status.phase,
            message: status.message,
            desired_replicas: status.desired_replicas,
            running_replicas: status.running_replicas,
            spec_hash: status.spec_hash,
            release,
            updated_at: status.updated_at,
        });
    }
    Ok(StatusView {
        last_seen: commits.last_seen.map(commit_view),
        last_applied: commits.last_applied.map(commit_view),
        last_rejected: commits.last_rejected.map(commit_view),
        resources,
    })
}

pub(super) fn run(data_dir: &Path, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let db = data_dir.join("state.db");
    if !db.exists() {
        anyhow::bail!(
            "no agent state at {}: start the agent with `voodu-agent --repo URL --data-dir {}` first",
            db.display(),
            data_dir.display()
        );
    }
    let store = Store::open_read_only(&db)?;
    let view = build(&store).context("cannot read agent state")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print_table(&view);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(view: &StatusView) {
    let line = |label: &str, commit: &Option<CommitView>| match commit {
        Some(commit) => println!(
            "{label:<14} {} ({})",
            &commit.sha[..commit.sha.len().min(12)],
            commit.outcome
        ),
        None => println!("{label:<14} -"),
    };
    line("last seen", &view.last_seen);
    line("last applied", &view.last_applied);
    line("last rejected", &view.last_rejected);
    if let Some(rejected) = &view.last_rejected {
        let is_latest = view
            .last_seen
            .as_ref()
            .is_some_and(|seen| seen.sha == rejected.sha);
        if is_latest {
            println!(
                "\nthe latest commit was rejected; the host keeps running the last applied one:"
            );
            for error in &rejected.errors {
                println!("  {error}");
            }
        }
    }
    println!();
    println!(
        "{:<36} {:>7} {:>7}  {:<12} {:<12} {:<8} MESSAGE",
        "RESOURCE", "DESIRED", "RUNNING", "PHASE", "HASH", "RELEASE"
    );
    for resource in &view.resources {
        let key = if resource.scope.is_empty() {
            format!("{}/{}", resource.kind, resource.name)
        } else {
            format!("{}/{}/{}", resource.kind, resource.scope, resource.name)
        };
        let release = resource.release.as_ref().map_or_else(
            || "-".to_owned(),
            |release| {
                format!(
                    "{}@{}",
                    release.id,
                    &release.commit[..release.commit.len().min(7)]
                )
            },
        );
        println!(
            "{key:<36} {:>7} {:>7}  {:<12} {:<12} {:<8} {}",
            resource.desired_replicas,
            resource.running_replicas,
            resource.phase,
            &resource.spec_hash[..resource.spec_hash.len().min(12)],
            release,
            resource.message
        );
    }
}
