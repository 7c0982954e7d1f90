//! `voodu-agent maintenance on|off SCOPE/NAME`: the ingress answers every request routed to a
//! deployment with 503, a maintenance page and `Retry-After`, while its replicas keep running
//! (`store::Maintenance`, one transaction with its activity row); then nudges the running
//! agent, whose router loads the new proxy config at once. `maintenance` (or `list`) lists
//! what is in maintenance.
//!
//! Invariants: `on` refuses a name that declares neither a deployment nor an ingress, and a
//! message or retry-after past its bound, changing nothing; `off` of a name not in
//! maintenance changes nothing and says so; text the operator gave is printed escaped.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::sync::{AgentArgs, nudge};
use super::time;
use crate::manifest::spec::Spec;
use crate::model::text::Esc;
use crate::model::{Kind, ResourceKey};
use crate::store::{
    MAINTENANCE_MESSAGE, MAX_MAINTENANCE_MESSAGE, MAX_RETRY_AFTER_SECS, Maintenance, Store,
};

#[derive(Debug, Args)]
pub(super) struct MaintenanceArgs {
    #[command(subcommand)]
    action: Option<Action>,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Serve a 503 maintenance page for every ingress route to SCOPE/NAME (a deployment, or
    /// an ingress: then the deployment it routes to); the replicas keep running. Again on a
    /// deployment in maintenance: changes its message and retry-after.
    On(OnArgs),
    /// Route traffic to SCOPE/NAME's replicas again.
    Off(OffArgs),
    /// List what is in maintenance (also `maintenance` alone).
    List(ListArgs),
}

#[derive(Debug, Args)]
struct OnArgs {
    /// A deployment (SCOPE/NAME or deployment/SCOPE/NAME) or an ingress (ingress/SCOPE/NAME,
    /// or SCOPE/NAME when no deployment has that name).
    #[arg(value_name = "SCOPE/NAME")]
    resource: String,
    /// The page's message (at most 1 KiB; shown HTML-escaped). Default: "This service is
    /// down for maintenance."
    #[arg(long, value_name = "TEXT")]
    message: Option<String>,
    /// The `Retry-After` header the page is served with, from 1s to 24h.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    retry_after: Duration,
    /// Print the stored row and how the agent was told, as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    agent: AgentArgs,
}

#[derive(Debug, Args)]
struct OffArgs {
    /// The deployment (or the ingress routing to it) given to `maintenance on`.
    #[arg(value_name = "SCOPE/NAME")]
    resource: String,
    /// Print what was done as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    agent: AgentArgs,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `maintenance on|off --json`.
#[derive(Debug, serde::Serialize)]
struct ChangeView {
    resource: String,
    maintenance: Option<Maintenance>,
    /// Whether the call changed anything (`off` of a deployment not in maintenance: no).
    changed: bool,
    nudge: Option<super::unpin::NudgeView>,
}

pub(super) fn run(data_dir: &Path, args: &MaintenanceArgs) -> anyhow::Result<ExitCode> {
    match &args.action {
        Some(Action::On(on)) => run_on(data_dir, on),
        Some(Action::Off(off)) => run_off(data_dir, off),
        Some(Action::List(list)) => run_list(data_dir, list.json),
        None => run_list(data_dir, false),
    }
}

/// The deployment `reference` names: SCOPE/NAME (a deployment, else an ingress by that
/// name), or KIND/SCOPE/NAME with KIND `deployment` or `ingress`. `Ok(None)` when nothing
/// by that name is declared.
fn deployment_of(store: &Store, reference: &str) -> anyhow::Result<Option<(String, String)>> {
    let parts: Vec<&str> = reference.split('/').collect();
    let (kinds, scope, name): (&[Kind], &str, &str) = match parts.as_slice() {
        ["deployment", scope, name] => (&[Kind::Deployment], scope, name),
        ["ingress", scope, name] => (&[Kind::Ingress], scope, name),
        [scope, name] => (&[Kind::Deployment, Kind::Ingress], scope, name),
        _ => anyhow::bail!(
            "{}: give SCOPE/NAME, deployment/SCOPE/NAME or ingress/SCOPE/NAME",
            Esc(reference)
        ),
    };
    if name.is_empty() {
        anyhow::bail!("{}: the name is empty", Esc(reference));
    }
    for kind in kinds {
        let key = ResourceKey::new(*kind, scope, name);
        match store.desired(&key)?.map(|desired| desired.spec) {
            Some(Spec::Ingress(ingress)) => {
                return Ok(Some((
                    (*scope).to_owned(),
                    ingress.effective_service(name).to_owned(),
                )));
            }
            Some(_) => return Ok(Some(((*scope).to_owned(), (*name).to_owned()))),
            None => {}
        }
    }
    Ok(None)
}

/// Whether a declared ingress routes to deployment `scope/name`.
fn routed(store: &Store, scope: &str, name: &str) -> anyhow::Result<bool> {
    Ok(store.desired_all()?.iter().any(|desired| {
        desired.key.scope == scope
            && matches!(&desired.spec, Spec::Ingress(ingress)
                if ingress.effective_service(&desired.key.name) == name)
    }))
}

fn run_on(data_dir: &Path, args: &OnArgs) -> anyhow::Result<ExitCode> {
    let message = args.message.as_deref().unwrap_or(MAINTENANCE_MESSAGE);
    if message.len() > MAX_MAINTENANCE_MESSAGE {
        anyhow::bail!(
            "--message is {} bytes; at most {MAX_MAINTENANCE_MESSAGE} are shown",
            message.len()
        );
    }
    let retry_after = args.retry_after.as_secs();
    if !(1..=MAX_RETRY_AFTER_SECS).contains(&retry_after) {
        anyhow::bail!(
            "--retry-after {}: give from 1s to 24h",
            humantime::format_duration(args.retry_after)
        );
    }
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let Some((scope, name)) = deployment_of(&store, &args.resource)? else {
        anyhow::bail!(
            "{}: no deployment or ingress by that name is declared (`voodu-agent status` lists them); nothing changed",
            Esc(&args.resource)
        );
    };
    let routed = routed(&store, &scope, &name)?;
    let row = store.maintenance_on(&scope, &name, message, retry_after)?;
    drop(store);
    let answer = nudge(data_dir, &args.agent, None);
    let resource = format!("deployment/{scope}/{name}");
    if args.json {
        let view = ChangeView {
            resource,
            maintenance: Some(row),
            changed: true,
            nudge: Some(super::unpin::NudgeView::of(answer)),
        };
        println!("{}", serde_json::to_string_pretty(&view)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{}: in maintenance: its ingress routes answer 503 with \"{}\" (Retry-After: {retry_after}s); the replicas keep running",
        Esc(&resource),
        Esc(&row.message)
    );
    if !routed {
        eprintln!(
            "warning: no ingress routes to {}: the page shows once one does",
            Esc(&resource)
        );
    }
    super::unpin::report_nudge(answer);
    Ok(ExitCode::SUCCESS)
}

fn run_off(data_dir: &Path, args: &OffArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    // A deployment gone from git can still be taken out of maintenance by its name.
    let (scope, name) = match deployment_of(&store, &args.resource)? {
        Some(found) => found,
        None => match args.resource.split('/').collect::<Vec<_>>().as_slice() {
            [scope, name] | ["deployment", scope, name] => {
                ((*scope).to_owned(), (*name).to_owned())
            }
            _ => anyhow::bail!(
                "{}: no deployment or ingress by that name is declared",
                Esc(&args.resource)
            ),
        },
    };
    let changed = store.maintenance_off(&scope, &name)?;
    drop(store);
    let resource = format!("deployment/{scope}/{name}");
    let answer = changed.then(|| nudge(data_dir, &args.agent, None));
    if args.json {
        let view = ChangeView {
            resource,
            maintenance: None,
            changed,
            nudge: answer.map(super::unpin::NudgeView::of),
        };
        println!("{}", serde_json::to_string_pretty(&view)?);
        return Ok(ExitCode::SUCCESS);
    }
    match answer {
        Some(answer) => {
            println!(
                "{}: out of maintenance: its ingress routes go to the replicas again",
                Esc(&resource)
            );
            super::unpin::report_nudge(answer);
        }
        None => println!("{}: not in maintenance; nothing changed", Esc(&resource)),
    }
    Ok(ExitCode::SUCCESS)
}

fn run_list(data_dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadOnly)?;
    let rows = store.maintenance_all()?;
    super::print_view(json, &rows, |rows| {
        if rows.is_empty() {
            println!("nothing is in maintenance");
            return;
        }
        println!(
            "{:<36} {:<20} {:<16} {:>11}  MESSAGE",
            "DEPLOYMENT", "SINCE", "BY", "RETRY-AFTER"
        );
        for row in rows {
            print_row(row);
        }
    })
}

/// One row of the list.
fn print_row(row: &Maintenance) {
    let by = row.actor.as_deref().unwrap_or(&row.origin);
    println!(
        "{:<36} {:<20} {:<16} {:>10}s  {}",
        Esc(&format!("{}/{}", row.scope, row.name)),
        time(row.since),
        Esc(by),
        row.retry_after,
        Esc(&row.message)
    );
}
