//! Backups on the fake runtime with real restic and real SQLite (issue 50): the order in
//! which a `stop` backup touches the pods (each stopped, snapshotted, started, Ready before
//! the next is stopped), a restore that removes the pod, swaps the claim back in and lets the
//! pass make the pod again, and a `before_release` backup taken before a rollout's first
//! replacement. Real time, not paused: restic is a child process, and a paused clock would run
//! its deadline out while it works. The fake keeps each volume's files in a temp dir
//! (`FakeRuntime::set_volume_root`), where restic reads and restores them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::store::{DataReason, DataState, DataWhat, NewDataRun};

use crate::support::{Harness, TestResult, until};

fn key() -> ResourceKey {
    ResourceKey::new(Kind::Statefulset, "data", "db")
}

/// `statefulset "data" "db"`: `replicas` pods with one claim, a `stop` backup with
/// `before_release`, and `V` in its env.
fn db(backups: &Path, replicas: u32, v: &str) -> String {
    format!(
        r#"statefulset "data" "db" {{
  image    = "busybox"
  command  = ["sleep", "3600"]
  replicas = {replicas}
  env      = {{ V = "{v}" }}
  volume_claim "data" {{
    mount_path = "/data"
  }}
  backup {{
    repository     = "{repository}"
    password_file  = "{password}"
    before_release = true
  }}
}}
"#,
        repository = backups.join("repo").display(),
        password = backups.join("pass").display(),
    )
}

fn restic_installed() -> TestResult {
    if Path::new("/usr/bin/restic").exists() {
        Ok(())
    } else {
        Err("restic is not installed (/usr/bin/restic): run scripts/test-deps".into())
    }
}

/// A harness whose fake keeps volumes under its own temp dir, with a short settle time.
fn harness(volumes: &Path) -> TestResult<Harness> {
    let mut harness = Harness::new()?;
    harness.fake.set_volume_root(volumes);
    harness.options.ready_settle = Duration::from_millis(200);
    Ok(harness)
}

async fn ended(harness: &Harness, id: i64) -> TestResult<voodu_agent::store::DataRun> {
    until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        &format!("data run #{id} to end"),
        || Ok(harness.store.data_run(id)?.filter(|run| run.state.ended())),
    )
    .await
}

fn request(harness: &Harness, run: NewDataRun) -> TestResult<i64> {
    Ok(harness.store.request_data_run(&key(), &run)?)
}

fn manual(what: DataWhat, snapshots: BTreeMap<String, String>) -> NewDataRun {
    NewDataRun {
        what,
        reason: DataReason::Manual,
        release_id: None,
        only_ordinal: None,
        snapshots,
    }
}

/// The `stop`/`start`/`remove`/`create` calls on the pods since call `from`, by name.
fn pod_calls(harness: &Harness, from: usize) -> Vec<String> {
    harness
        .fake
        .calls_by_name()
        .into_iter()
        .skip(from)
        .filter(|call| {
            ["stop ", "start ", "remove ", "create "]
                .iter()
                .any(|verb| call.starts_with(verb))
                && call.contains("data-db.")
        })
        .map(|call| call.split(' ').take(2).collect::<Vec<_>>().join(" "))
        .collect()
}

#[tokio::test]
async fn a_stop_backup_takes_one_pod_at_a_time_and_a_restore_puts_the_claim_back() -> TestResult {
    restic_installed()?;
    let scratch = tempfile::tempdir()?;
    let backups = scratch.path().join("backups");
    std::fs::create_dir_all(&backups)?;
    std::fs::write(backups.join("pass"), "a password\n")?;
    let volumes = scratch.path().join("volumes");
    let mut harness = harness(&volumes)?;
    harness.start()?;
    harness.push(&[("db.hcl", &db(&backups, 2, "1"))])?;
    harness.converged(&key(), 2).await?;
    for ordinal in 0..2 {
        std::fs::write(
            volumes
                .join(format!("voodu-data-db-data-{ordinal}"))
                .join("rows"),
            format!("rows of pod {ordinal}\n"),
        )?;
    }

    // A backup: pod 0 stopped, started and Ready before pod 1 is stopped.
    let from = harness.fake.calls().len();
    let id = request(&harness, manual(DataWhat::Backup, BTreeMap::new()))?;
    let run = ended(&harness, id).await?;
    assert_eq!(run.state, DataState::Succeeded, "{run:?}");
    assert_eq!(
        pod_calls(&harness, from),
        [
            "stop data-db.0",
            "start data-db.0",
            "stop data-db.1",
            "start data-db.1"
        ]
    );
    assert_eq!(run.snapshots.len(), 2, "{run:?}");
    harness.converged(&key(), 2).await?;

    // A restore of pod 1 alone: removed, its claim put back, made again by the pass.
    let claim = volumes.join("voodu-data-db-data-1");
    std::fs::write(claim.join("rows"), "lost\n")?;
    let from = harness.fake.calls().len();
    let only_pod_1: BTreeMap<String, String> = run
        .snapshots
        .iter()
        .filter(|(volume, _)| volume.ends_with("-1"))
        .map(|(volume, id)| (volume.clone(), id.clone()))
        .collect();
    let restore = NewDataRun {
        only_ordinal: Some(1),
        ..manual(DataWhat::Restore, only_pod_1)
    };
    let id = request(&harness, restore)?;
    let run = ended(&harness, id).await?;
    assert_eq!(run.state, DataState::Succeeded, "{run:?}");
    assert_eq!(
        std::fs::read_to_string(claim.join("rows"))?,
        "rows of pod 1\n"
    );
    let calls = pod_calls(&harness, from);
    assert!(
        calls.starts_with(&["stop data-db.1".to_owned(), "remove data-db.1".to_owned()])
            && calls.contains(&"create data-db.1".to_owned())
            && !calls.iter().any(|call| call.ends_with("data-db.0")),
        "{calls:?}"
    );
    // The old contents were dropped once the pods were Ready again.
    let beside: Vec<String> = std::fs::read_dir(&volumes)?
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("voodu-before") || name.contains("voodu-restore"))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");
    harness.converged(&key(), 2).await?;

    // A rollout with before_release: its backup ends before the first pod is replaced.
    let from = harness.fake.calls().len();
    harness.push(&[("db.hcl", &db(&backups, 2, "2"))])?;
    harness.converged(&key(), 2).await?;
    let release = harness
        .store
        .latest_release(&key())?
        .ok_or("the rollout's release")?;
    let backup = harness
        .store
        .release_backup(release.id)?
        .ok_or("no before_release backup")?;
    assert_eq!(backup.state, DataState::Succeeded, "{backup:?}");
    let calls = pod_calls(&harness, from);
    // A replacement drains (stops) the pod, then removes it.
    let first_replacement = calls
        .iter()
        .position(|call| call.starts_with("remove "))
        .ok_or("the rollout replaced pods")?
        .saturating_sub(1);
    assert_eq!(
        calls[..first_replacement],
        [
            "stop data-db.0",
            "start data-db.0",
            "stop data-db.1",
            "start data-db.1"
        ],
        "the backup ran whole before the rollout touched a pod: {calls:?}"
    );
    harness.stop().await?;
    Ok(())
}

/// `deployment "data" "web"`: 2 replicas sharing the named volume `uploads`, backed up.
fn web(backups: &Path) -> String {
    format!(
        r#"deployment "data" "web" {{
  image    = "busybox"
  command  = ["sleep", "3600"]
  replicas = 2
  volumes  = ["uploads:/srv/uploads"]
  backup {{
    volume        = "uploads"
    repository    = "{repository}"
    password_file = "{password}"
  }}
}}
"#,
        repository = backups.join("repo").display(),
        password = backups.join("pass").display(),
    )
}

#[tokio::test]
async fn a_deployment_backs_up_its_named_volume_with_every_replica_stopped() -> TestResult {
    use voodu_agent::runtime::Containers as _;
    restic_installed()?;
    let scratch = tempfile::tempdir()?;
    let backups = scratch.path().join("backups");
    std::fs::create_dir_all(&backups)?;
    std::fs::write(backups.join("pass"), "a password\n")?;
    let volumes = scratch.path().join("volumes");
    let mut harness = harness(&volumes)?;
    // Docker makes a named volume when a container first mounts it; the fake is told.
    harness
        .fake
        .ensure_volume("uploads", &BTreeMap::new())
        .await?;
    std::fs::write(volumes.join("uploads").join("avatar.png"), "png bytes")?;
    harness.start()?;
    let web_key = ResourceKey::new(Kind::Deployment, "data", "web");
    harness.push(&[("web.hcl", &web(&backups))])?;
    harness.converged(&web_key, 2).await?;

    let from = harness.fake.calls().len();
    let id = harness
        .store
        .request_data_run(&web_key, &manual(DataWhat::Backup, BTreeMap::new()))?;
    let run = ended(&harness, id).await?;
    assert_eq!(run.state, DataState::Succeeded, "{run:?}");
    assert!(run.snapshots.contains_key("uploads"), "{run:?}");
    let calls: Vec<String> = harness
        .fake
        .calls_by_name()
        .into_iter()
        .skip(from)
        .filter(|call| call.starts_with("stop ") || call.starts_with("start "))
        .map(|call| call.split(' ').next().unwrap_or_default().to_owned())
        .collect();
    // Both replicas stopped before the snapshot, both started after it.
    assert_eq!(calls, ["stop", "stop", "start", "start"], "{calls:?}");
    harness.converged(&web_key, 2).await?;

    std::fs::write(volumes.join("uploads").join("avatar.png"), "overwritten")?;
    let id = harness
        .store
        .request_data_run(&web_key, &manual(DataWhat::Restore, run.snapshots.clone()))?;
    let restored = ended(&harness, id).await?;
    assert_eq!(restored.state, DataState::Succeeded, "{restored:?}");
    assert_eq!(
        std::fs::read_to_string(volumes.join("uploads").join("avatar.png"))?,
        "png bytes"
    );
    harness.converged(&web_key, 2).await?;
    harness.stop().await?;
    Ok(())
}
