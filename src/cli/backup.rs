//! `voodu-agent backup SCOPE/NAME`, `backups SCOPE/NAME` and `restore SCOPE/NAME`: ask the
//! running agent for a backup or a restore of a statefulset's claims (`backup {}`), and list
//! what its data runs did. A request is a row of state.db (`Store::request_data_run`, with its
//! activity row); the agent's backup scheduler picks it up within its next look
//! (`observers::backups::PENDING_LOOK`, a second) and the statefulset's own passes run it.
//!
//! `rollback --with-data` (`rollback.rs`) asks for its restore through `restore_request`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;

use crate::http::status::resolve;
use crate::model::text::Esc;
use crate::model::{Kind, ResourceKey};
use crate::store::{DataReason, DataRun, DataState, DataWhat, NewDataRun, Store};

#[derive(Debug, Args)]
pub(super) struct BackupArgs {
    /// The resource: SCOPE/NAME, or KIND/SCOPE/NAME (a statefulset or a deployment).
    #[arg(value_name = "SCOPE/NAME")]
    resource: String,
    /// Verify the newest successful backup instead (as `verify = "…"` does on its period):
    /// `restic check`, then its snapshots restored into a scratch directory, which must hold
    /// as many bytes as the backup read.
    #[arg(long)]
    verify: bool,
}

#[derive(Debug, Args)]
pub(super) struct BackupsArgs {
    /// The resource: SCOPE/NAME, or KIND/SCOPE/NAME (a statefulset or a deployment).
    #[arg(value_name = "SCOPE/NAME")]
    resource: String,
    /// Print the runs as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(super) struct RestoreArgs {
    /// The resource: SCOPE/NAME, or KIND/SCOPE/NAME (a statefulset or a deployment).
    #[arg(value_name = "SCOPE/NAME")]
    resource: String,
    /// The snapshot to put back (a restic snapshot id, or its first 8+ hex digits, as
    /// `backups` lists them). Default: the newest successful backup.
    #[arg(long, value_name = "ID", conflicts_with = "release")]
    snapshot: Option<String>,
    /// Put back the snapshots taken before release N rolled out (its `before_release`
    /// backup).
    #[arg(long, value_name = "N")]
    release: Option<i64>,
    /// Only this pod's claims (by ordinal; a statefulset's).
    #[arg(long, value_name = "K")]
    ordinal: Option<i64>,
}

/// The statefulset or deployment `reference` names, checked to declare a `backup {}`.
fn backed_up(store: &Store, reference: &str) -> anyhow::Result<ResourceKey> {
    let key = resolve(store, reference)?;
    if !matches!(key.kind, Kind::Statefulset | Kind::Deployment) {
        bail!("{key} is neither a statefulset nor a deployment: only they declare backup {{}}");
    }
    let desired = store
        .desired(&key)?
        .with_context(|| format!("{key} is not declared on this host"))?;
    if desired.spec.backup().is_none() {
        bail!("{key} declares no backup {{}} block: there is nothing to back up or restore from");
    }
    Ok(key)
}

pub(super) fn run_backup(data_dir: &Path, args: &BackupArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let key = backed_up(&store, &args.resource)?;
    let request = if args.verify {
        let good = store
            .last_good_backup(&key)?
            .with_context(|| format!("{key} has no successful backup to verify"))?;
        NewDataRun {
            what: DataWhat::Verify,
            reason: DataReason::Manual,
            release_id: None,
            only_ordinal: None,
            snapshots: good.snapshots,
        }
    } else {
        NewDataRun {
            what: DataWhat::Backup,
            reason: DataReason::Manual,
            release_id: None,
            only_ordinal: None,
            snapshots: BTreeMap::new(),
        }
    };
    let id = store.request_data_run(&key, &request)?;
    println!(
        "{key}: {} run #{id} asked for; the agent starts it within {} s (`voodu-agent backups {}/{}` shows it)",
        request.what.as_str(),
        crate::reconcile::BACKUP_LOOK.as_secs(),
        Esc(&key.scope),
        Esc(&key.name)
    );
    Ok(ExitCode::SUCCESS)
}

/// The snapshots a restore puts back: those of `release`'s `before_release` backup, the
/// backup holding `snapshot`, or the newest successful backup; only pod `ordinal`'s when
/// given.
pub(super) fn restore_request(
    store: &Store,
    key: &ResourceKey,
    snapshot: Option<&str>,
    release: Option<i64>,
    ordinal: Option<i64>,
) -> anyhow::Result<NewDataRun> {
    let (mut snapshots, source) = match (snapshot, release) {
        (_, Some(release)) => {
            let run = store
                .release_backup(release)?
                .filter(|run| run.key == *key && run.state == DataState::Succeeded)
                .with_context(|| {
                    format!("release #{release} of {key} has no successful before_release backup")
                })?;
            (run.snapshots, format!("release #{release}'s backup"))
        }
        (Some(prefix), None) => {
            if prefix.len() < 8 || !prefix.bytes().all(|byte| byte.is_ascii_hexdigit()) {
                bail!(
                    "--snapshot wants a restic snapshot id (at least 8 hex digits), not {prefix:?}"
                );
            }
            let runs = store.data_runs(key, crate::store::DATA_RUN_HISTORY)?;
            let holding = crate::model::map_of(
                runs.iter()
                    .filter(|run| run.what == DataWhat::Backup && run.state == DataState::Succeeded)
                    .flat_map(|run| run.snapshots.iter())
                    .filter(|(_, id)| id.starts_with(prefix))
                    .map(|(holds, id)| (holds.clone(), id.clone())),
            );
            if holding.is_empty() {
                bail!(
                    "no backup of {key} recorded snapshot {prefix} (see `voodu-agent backups {}/{}`)",
                    key.scope,
                    key.name
                );
            }
            (holding, format!("snapshot {prefix}"))
        }
        (None, None) => {
            let run = store
                .last_good_backup(key)?
                .with_context(|| format!("{key} has no successful backup to restore"))?;
            (run.snapshots, format!("backup run #{}", run.id))
        }
    };
    let mut only_ordinal = ordinal;
    if let Some(ordinal) = ordinal {
        snapshots.retain(|holds, _| ordinal_of(holds) == Some(ordinal));
    } else {
        // One snapshot's pod alone is restored (the others keep running).
        let ordinals: std::collections::BTreeSet<i64> = snapshots
            .keys()
            .filter_map(|holds| ordinal_of(holds))
            .collect();
        if ordinals.len() == 1 && snapshot.is_some() {
            only_ordinal = ordinals.into_iter().next();
        }
    }
    if snapshots.is_empty() {
        bail!(
            "{source} holds nothing of pod {}",
            ordinal.unwrap_or_default()
        );
    }
    Ok(NewDataRun {
        what: DataWhat::Restore,
        reason: DataReason::Manual,
        release_id: None,
        only_ordinal,
        snapshots,
    })
}

/// The pod ordinal a snapshot holds: the claim volume's `-<n>` suffix, or the dump's
/// `-<n>.dump`.
fn ordinal_of(holds: &str) -> Option<i64> {
    let stem = holds.strip_suffix(".dump").unwrap_or(holds);
    stem.rsplit('-').next()?.parse().ok()
}

pub(super) fn run_restore(data_dir: &Path, args: &RestoreArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadWrite)?;
    let key = backed_up(&store, &args.resource)?;
    if key.kind == Kind::Deployment && args.ordinal.is_some() {
        bail!(
            "{key} is a deployment: its replicas share one volume, restored whole; leave out --ordinal"
        );
    }
    let request = restore_request(
        &store,
        &key,
        args.snapshot.as_deref(),
        args.release,
        args.ordinal,
    )?;
    let id = store.request_data_run(&key, &request)?;
    println!(
        "{key}: restore run #{id} asked for ({} snapshot(s)); the agent stops the pods, puts the claims back (the old contents kept aside until the pods are Ready again) and starts them; it starts within {} s",
        request.snapshots.len(),
        crate::reconcile::BACKUP_LOOK.as_secs()
    );
    Ok(ExitCode::SUCCESS)
}

/// `backups --json`: one run.
#[derive(Debug, serde::Serialize)]
struct RunView {
    id: i64,
    what: &'static str,
    reason: &'static str,
    state: &'static str,
    release: Option<i64>,
    ordinal: Option<i64>,
    snapshots: BTreeMap<String, String>,
    bytes: i64,
    message: String,
    requested_at: String,
    ended_at: Option<String>,
}

impl RunView {
    fn of(run: &DataRun) -> RunView {
        RunView {
            id: run.id,
            what: run.what.as_str(),
            reason: run.reason.as_str(),
            state: run.state.as_str(),
            release: run.release_id,
            ordinal: run.only_ordinal,
            snapshots: run.snapshots.clone(),
            bytes: run.bytes,
            message: run.message.clone(),
            requested_at: crate::base::rfc3339_seconds(run.requested_at),
            ended_at: run.ended_at.map(crate::base::rfc3339_seconds),
        }
    }
}

pub(super) fn run_list(data_dir: &Path, args: &BackupsArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadOnly)?;
    let key = backed_up(&store, &args.resource)?;
    let runs = store.data_runs(&key, crate::store::DATA_RUN_HISTORY)?;
    if args.json {
        let views: Vec<RunView> = runs.iter().map(RunView::of).collect();
        println!("{}", serde_json::to_string_pretty(&views)?);
        return Ok(ExitCode::SUCCESS);
    }
    if runs.is_empty() {
        println!("{key}: no backup, restore or verify yet");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<6} {:<8} {:<15} {:<10} {:<8} {:<20} MESSAGE",
        "RUN", "WHAT", "REASON", "STATE", "RELEASE", "REQUESTED"
    );
    for run in &runs {
        println!(
            "{:<6} {:<8} {:<15} {:<10} {:<8} {:<20} {}",
            run.id,
            run.what.as_str(),
            run.reason.as_str(),
            run.state.as_str(),
            run.release_id.map_or("-".to_owned(), |id| format!("#{id}")),
            crate::base::rfc3339_seconds(run.requested_at),
            Esc(&run.message)
        );
        for (holds, id) in &run.snapshots {
            println!("{:<6} {} {}", "", Esc(holds), Esc(id));
        }
    }
    Ok(ExitCode::SUCCESS)
}
