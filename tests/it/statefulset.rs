//! Statefulsets (issue 5): stable ordinals and names, per-ordinal volumes that are never
//! removed, scale up bottom-up, scale down and rolling replacement top-down, one pod at a
//! time. On the fake runtime (real SQLite, paused time), the order of every create, start and
//! remove is read from `FakeRuntime::calls()`; on Docker, the real binary's scale, roll,
//! prune and re-create are watched with `docker events` and `docker exec`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::runtime::{Container, ContainerState, Containers, labels};
use voodu_agent::store::ReleasePhase;

use crate::e2e_docker::{Agent, Events};
use crate::support::Harness;
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

fn db_key() -> ResourceKey {
    ResourceKey::new(Kind::Statefulset, "data", "db")
}

/// `statefulset "data" "db"` with one `data` claim, an init container and `V` in its env.
fn db(replicas: u32, v: &str) -> String {
    format!(
        r#"statefulset "data" "db" {{
  image    = "busybox"
  command  = ["sleep", "3600"]
  replicas = {replicas}
  env      = {{ V = "{v}" }}
  volume_claim "data" {{
    mount_path = "/data"
  }}
  init "seed" {{
    command = ["true"]
  }}
}}
"#
    )
}

/// The pods of `data/db` (init containers excluded), by ordinal.
async fn pods(harness: &Harness) -> TestResult<Vec<Container>> {
    let mut pods: Vec<Container> = harness
        .containers(&db_key())
        .await?
        .into_iter()
        .filter(|container| container.label(labels::ROLE) == Some("statefulset"))
        .collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(pods)
}

/// The calls since `from` that change the host (`create`, `start`, `remove`, `ensure_volume`,
/// `remove_volume`), by container name.
fn changes_since(harness: &Harness, from: usize) -> Vec<String> {
    harness
        .fake
        .calls_by_name()
        .into_iter()
        .skip(from)
        .filter(|call| {
            let verb = call.split(' ').next().unwrap_or_default();
            matches!(
                verb,
                "create" | "start" | "remove" | "ensure_volume" | "remove_volume"
            )
        })
        .collect()
}

/// Only the calls on pods (`data-db.<n>`).
fn pod_changes_since(harness: &Harness, from: usize) -> Vec<String> {
    changes_since(harness, from)
        .into_iter()
        .filter(|change| change.contains(" data-db."))
        .collect()
}

fn mark(harness: &Harness) -> usize {
    harness.fake.calls().len()
}

#[tokio::test(start_paused = true)]
async fn pods_get_ordinal_names_labels_aliases_env_and_volumes() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    let commit = harness.push(&[("db.hcl", &db(2, "1"))])?;
    harness.converged(&db_key(), 2).await?;
    let pods = pods(&harness).await?;
    let mut digests = BTreeSet::new();
    for (ordinal, pod) in pods.iter().enumerate() {
        assert_eq!(pod.name, format!("data-db.{ordinal}"));
        for (label, value) in [
            (labels::KIND, "statefulset"),
            (labels::ROLE, "statefulset"),
            (labels::SCOPE, "data"),
            (labels::NAME, "db"),
            (labels::REPLICA_ORDINAL, &ordinal.to_string()),
            (labels::REPLICA_ID, &ordinal.to_string()),
        ] {
            assert_eq!(pod.label(label), Some(value), "{label} of {}", pod.name);
        }
        digests.insert(
            pod.label(labels::ENV_DIGEST)
                .ok_or("env digest")?
                .to_owned(),
        );
        let spec = harness.fake.spec_of(&pod.id).ok_or("spec")?;
        assert_eq!(
            spec.aliases,
            [
                format!("db-{ordinal}.data"),
                format!("db-{ordinal}.data.voodu"),
                "db.data".to_owned(),
                "db.data.voodu".to_owned(),
            ]
        );
        for variable in [
            "VOODU_SCOPE=data".to_owned(),
            "VOODU_NAME=db".to_owned(),
            format!("VOODU_REPLICA_ORDINAL={ordinal}"),
            format!("VOODU_REPLICA_ID={ordinal}"),
            "V=1".to_owned(),
        ] {
            assert!(spec.env.contains(&variable), "{variable} in {:?}", spec.env);
        }
        assert_eq!(spec.binds, [format!("voodu-data-db-data-{ordinal}:/data")]);
    }
    assert_eq!(digests.len(), 2, "each pod has its own environment digest");
    let volumes = harness
        .fake
        .list_volumes(&[(labels::SCOPE, "data")])
        .await?;
    assert_eq!(
        volumes.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        ["voodu-data-db-data-0", "voodu-data-db-data-1"]
    );
    let agent_id = harness.store.agent_id()?;
    for (ordinal, volume) in volumes.iter().enumerate() {
        let expected: BTreeMap<String, String> = [
            ("createdby", "voodu"),
            ("voodu.kind", "statefulset"),
            ("voodu.scope", "data"),
            ("voodu.name", "db"),
            ("voodu.replica_ordinal", &ordinal.to_string()),
            ("voodu.claim", "data"),
            ("voodu.agent", &agent_id),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(volume.labels, expected);
    }
    // Volumes, then the init chain, then the pod; pod 0 before pod 1. The init's end queues
    // the pass that creates the pod (which ensures the volumes again).
    assert_eq!(
        changes_since(&harness, 0),
        [
            "ensure_volume voodu-data-db-data-0",
            "create data-db-init-seed-0",
            "start data-db-init-seed-0",
            "ensure_volume voodu-data-db-data-0",
            "remove data-db-init-seed-0",
            "create data-db.0",
            "start data-db.0",
            "ensure_volume voodu-data-db-data-1",
            "create data-db-init-seed-1",
            "start data-db-init-seed-1",
            "ensure_volume voodu-data-db-data-1",
            "remove data-db-init-seed-1",
            "create data-db.1",
            "start data-db.1",
        ]
    );
    let status = harness.store.status(&db_key())?.ok_or("status")?;
    assert_eq!(
        (
            status.phase.as_str(),
            status.desired_replicas,
            status.running_replicas
        ),
        ("Ready", 2, 2)
    );
    let detail = status.detail.json();
    let detail_pods = detail["pods"].as_array().ok_or("detail.pods")?;
    assert_eq!(detail_pods.len(), 2);
    assert_eq!(detail_pods[1]["name"], "data-db.1");
    assert_eq!(detail_pods[1]["volumes"][0], "voodu-data-db-data-1");
    assert_eq!(detail_pods[1]["current"], true);
    let release = harness.store.latest_release(&db_key())?.ok_or("release")?;
    assert_eq!(
        (release.commit, release.phase),
        (commit, ReleasePhase::Succeeded)
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn scale_up_goes_bottom_up_and_scale_down_top_down_keeping_volumes() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("db.hcl", &db(1, "1"))])?;
    harness.converged(&db_key(), 1).await?;
    let first = pods(&harness).await?;
    let from = mark(&harness);
    harness.push(&[("db.hcl", &db(4, "1"))])?;
    harness.converged(&db_key(), 4).await?;
    // One at a time, lowest ordinal first.
    assert_eq!(
        pod_changes_since(&harness, from),
        [
            "create data-db.1",
            "start data-db.1",
            "create data-db.2",
            "start data-db.2",
            "create data-db.3",
            "start data-db.3",
        ]
    );
    let four = pods(&harness).await?;
    assert!(
        first
            .iter()
            .all(|pod| four.iter().any(|now| now.id == pod.id)),
        "pod 0 is not touched by a scale-up"
    );
    let from = mark(&harness);
    harness.push(&[("db.hcl", &db(1, "1"))])?;
    harness.converged(&db_key(), 1).await?;
    assert_eq!(
        pod_changes_since(&harness, from),
        ["remove data-db.3", "remove data-db.2", "remove data-db.1"]
    );
    assert_eq!(
        harness.fake.volume_names(),
        [
            "voodu-data-db-data-0",
            "voodu-data-db-data-1",
            "voodu-data-db-data-2",
            "voodu-data-db-data-3",
        ],
        "scale-down keeps every volume"
    );
    let status = harness.store.status(&db_key())?.ok_or("status")?;
    let detail = status.detail.json();
    let kept: Vec<&str> = detail["volumes"]
        .as_array()
        .ok_or("detail.volumes")?
        .iter()
        .filter(|volume| volume["kept"] == true)
        .filter_map(|volume| volume["name"].as_str())
        .collect();
    assert_eq!(
        kept,
        [
            "voodu-data-db-data-1",
            "voodu-data-db-data-2",
            "voodu-data-db-data-3"
        ]
    );
    // Scaling up again brings the same volumes back to the same ordinals.
    harness.push(&[("db.hcl", &db(3, "1"))])?;
    let again = harness.converged(&db_key(), 3).await?;
    for pod in &again {
        let ordinal = pod.label(labels::REPLICA_ORDINAL).ok_or("ordinal")?;
        let spec = harness.fake.spec_of(&pod.id).ok_or("spec")?;
        assert_eq!(spec.binds, [format!("voodu-data-db-data-{ordinal}:/data")]);
    }
    assert_eq!(
        harness.store.releases(&db_key(), 10)?.len(),
        1,
        "scaling is not a rollout"
    );
    assert!(
        changes_since(&harness, 0)
            .iter()
            .all(|change| !change.starts_with("remove_volume"))
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_does_not_stay_up_holds_back_the_next_ordinals() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    // Scale-up: pod 0 exits at once and crash-loops, so pods 1 and 2 are never created and
    // the first rollout fails (nothing earlier to roll back to).
    let failing = db(3, "1").replace(r#"["sleep", "3600"]"#, r#"["false"]"#);
    harness.push(&[("db.hcl", &failing)])?;
    let status = harness
        .status_where(&db_key(), |status| status.phase == "Failed")
        .await?;
    assert!(
        status.message.contains("data-db.0 is crash-looping"),
        "{}",
        status.message
    );
    harness.idle_for(Duration::from_secs(60)).await;
    let created: Vec<String> = pod_changes_since(&harness, 0)
        .into_iter()
        .filter(|change| change.starts_with("create"))
        .collect();
    assert_eq!(created, ["create data-db.0"]);
    // A rollout to a command that exits: pod 2 is replaced, crash-loops, and the rollout is
    // rolled back (pod 2 again, on the old spec); pods 1 and 0 are never touched.
    harness.push(&[("db.hcl", &db(3, "1"))])?;
    let before = harness.converged(&db_key(), 3).await?;
    let from = mark(&harness);
    harness.push(&[("db.hcl", &failing.replace(r#""1""#, r#""2""#))])?;
    harness
        .status_where(&db_key(), |status| {
            status.phase == "Ready"
                && harness
                    .store
                    .releases(&db_key(), 1)
                    .is_ok_and(|releases| releases[0].rolled_back_from.is_some())
        })
        .await?;
    let replaced: Vec<String> = pod_changes_since(&harness, from)
        .into_iter()
        .filter(|change| change.starts_with("remove") || change.starts_with("create"))
        .collect();
    assert_eq!(
        replaced,
        [
            "remove data-db.2",
            "create data-db.2",
            "remove data-db.2",
            "create data-db.2"
        ]
    );
    let phases: Vec<&str> = harness
        .store
        .releases(&db_key(), 10)?
        .iter()
        .map(|release| release.phase.as_str())
        .collect();
    assert_eq!(phases[..2], ["succeeded", "failed"]);
    let now = pods(&harness).await?;
    for pod in before.iter().filter(|pod| pod.name != "data-db.2") {
        assert!(
            now.iter()
                .any(|now| now.id == pod.id && now.state == ContainerState::Running),
            "{} untouched",
            pod.name
        );
    }
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_spec_change_replaces_pods_top_down_with_names_volumes_and_init_kept() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("db.hcl", &db(3, "1"))])?;
    let before = harness.converged(&db_key(), 3).await?;
    let volumes = harness.fake.volume_names();
    let from = mark(&harness);
    let commit = harness.push(&[("db.hcl", &db(3, "2"))])?;
    let after = harness.converged(&db_key(), 3).await?;
    let changes: Vec<String> = changes_since(&harness, from)
        .into_iter()
        .filter(|change| !change.starts_with("start data-db-init"))
        .collect();
    let mut expected = Vec::new();
    for ordinal in [2, 1, 0] {
        expected.extend([
            format!("remove data-db.{ordinal}"),
            format!("ensure_volume voodu-data-db-data-{ordinal}"),
            format!("create data-db-init-seed-{ordinal}"),
            // The init's end queues the pass that creates the pod.
            format!("ensure_volume voodu-data-db-data-{ordinal}"),
            format!("remove data-db-init-seed-{ordinal}"),
            format!("create data-db.{ordinal}"),
            format!("start data-db.{ordinal}"),
        ]);
    }
    assert_eq!(
        changes, expected,
        "highest ordinal first, each pod's init chain again, one at a time"
    );
    let names = |pods: &[Container]| -> BTreeSet<String> {
        pods.iter().map(|pod| pod.name.clone()).collect()
    };
    assert_eq!(names(&before), names(&after), "names are kept");
    assert!(
        before
            .iter()
            .all(|old| after.iter().all(|new| new.id != old.id)),
        "every pod replaced"
    );
    assert_eq!(harness.fake.volume_names(), volumes, "same volumes");
    for pod in &after {
        let spec = harness.fake.spec_of(&pod.id).ok_or("spec")?;
        assert!(spec.env.contains(&"V=2".to_owned()));
    }
    let release = harness.store.latest_release(&db_key())?.ok_or("release")?;
    assert_eq!(
        (release.commit, release.phase),
        (commit, ReleasePhase::Succeeded)
    );
    assert_eq!(harness.store.releases(&db_key(), 10)?.len(), 2);
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_config_bucket_change_rolls_every_pod_top_down() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("db.hcl", &db(2, "1"))])?;
    harness.converged(&db_key(), 2).await?;
    harness.stop().await?;
    harness.store.config_set(
        "data",
        "db",
        &BTreeMap::from([("SECRET".to_owned(), "s2".to_owned())]),
    )?;
    let from = mark(&harness);
    harness.start()?;
    // Converged again, and on the new environment.
    let start = std::time::Instant::now();
    let after = loop {
        let after = harness.converged(&db_key(), 2).await?;
        let mut rolled = true;
        for pod in &after {
            let spec = harness.fake.spec_of(&pod.id).ok_or("spec")?;
            rolled &= spec.env.contains(&"SECRET=s2".to_owned());
        }
        if rolled {
            break after;
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err("the pods never got the new bucket value".into());
        }
        tokio::time::sleep(crate::support::harness::POLL).await;
    };
    let removes: Vec<String> = pod_changes_since(&harness, from)
        .into_iter()
        .filter(|change| change.starts_with("remove") || change.starts_with("create"))
        .collect();
    assert_eq!(
        removes,
        [
            "remove data-db.1",
            "create data-db.1",
            "remove data-db.0",
            "create data-db.0"
        ]
    );
    assert_eq!(after.len(), 2);
    assert_eq!(
        harness.store.releases(&db_key(), 10)?.len(),
        1,
        "an environment change is no new release"
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn prune_removes_pods_top_down_and_keeps_volumes_for_a_re_add() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("db.hcl", &db(3, "1"))])?;
    harness.converged(&db_key(), 3).await?;
    let volumes = harness.fake.volume_names();
    assert_eq!(volumes.len(), 3);
    let from = mark(&harness);
    harness.push(&[])?;
    harness.converged(&db_key(), 0).await?;
    assert_eq!(
        pod_changes_since(&harness, from),
        ["remove data-db.2", "remove data-db.1", "remove data-db.0"]
    );
    assert_eq!(harness.fake.volume_names(), volumes, "prune keeps volumes");
    assert!(harness.store.status(&db_key())?.is_none());
    // Back in the repo: the same volumes, ordinal by ordinal.
    harness.push(&[("db.hcl", &db(3, "1"))])?;
    for pod in harness.converged(&db_key(), 3).await? {
        let ordinal = pod.label(labels::REPLICA_ORDINAL).ok_or("ordinal")?;
        let spec = harness.fake.spec_of(&pod.id).ok_or("spec")?;
        assert_eq!(spec.binds, [format!("voodu-data-db-data-{ordinal}:/data")]);
    }
    assert_eq!(harness.fake.volume_names(), volumes);
    assert!(
        changes_since(&harness, 0)
            .iter()
            .all(|change| !change.starts_with("remove_volume"))
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn stopped_pods_are_started_again_in_ordinal_order() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[("db.hcl", &db(3, "1"))])?;
    let before = harness.converged(&db_key(), 3).await?;
    harness.stop().await?;
    for pod in before.iter().filter(|pod| pod.name != "data-db.1") {
        harness.fake.exit(&pod.id);
    }
    let from = mark(&harness);
    harness.start()?;
    let after = harness.converged(&db_key(), 3).await?;
    assert_eq!(
        pod_changes_since(&harness, from),
        ["start data-db.0", "start data-db.2"]
    );
    let ids = |pods: &[Container]| -> BTreeSet<String> {
        pods.iter().map(|pod| pod.id.clone()).collect()
    };
    assert_eq!(ids(&before), ids(&after), "started, not re-created");
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn a_half_done_rollout_resumes_after_a_crash_without_duplicates() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    let sleep = |seconds: &str| db(3, "1").replace(r#""3600""#, seconds);
    harness.push(&[("db.hcl", &sleep(r#""3600""#))])?;
    harness.converged(&db_key(), 3).await?;
    harness.stop().await?;
    // A crash mid-rollout: pod 2 already replaced (new spec hash; same environment, so its
    // copied digest label stays right), pod 1 removed but not created again, pod 0 old.
    harness.push(&[("db.hcl", &sleep(r#""3601""#))])?;
    let desired = harness.store.desired(&db_key())?.ok_or("desired")?;
    let old = pods(&harness).await?;
    let replaced_2 = {
        let mut spec = harness.fake.spec_of(&old[2].id).ok_or("spec")?;
        harness.fake.remove(&old[2].id).await?;
        spec.labels
            .insert(labels::MANIFEST_HASH.into(), desired.spec_hash.to_string());
        let id = harness.fake.create(&spec).await?;
        harness.fake.start(&id).await?;
        id
    };
    harness.fake.remove(&old[1].id).await?;
    let from = mark(&harness);
    harness.start()?;
    let after = harness.converged(&db_key(), 3).await?;
    assert_eq!(
        pod_changes_since(&harness, from),
        [
            "create data-db.1",
            "start data-db.1",
            "remove data-db.0",
            "create data-db.0",
            "start data-db.0",
        ],
        "pod 1 comes back first, then the rollout goes on with pod 0; pod 2 is left alone"
    );
    assert!(after.iter().any(|pod| pod.id == replaced_2));
    assert_eq!(
        after
            .iter()
            .filter(|pod| pod.state == ContainerState::Running)
            .count(),
        3
    );
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn the_redis_macro_runs_as_a_statefulset_with_its_data_volume() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[(
        "cache.hcl",
        r#"redis "data" "cache" {
  image = "busybox"
  command = ["sleep", "3600"]
}
"#,
    )])?;
    let key = ResourceKey::new(Kind::Statefulset, "data", "cache");
    // The macro's readiness probe runs `redis-cli`, which the busybox stand-in lacks: the pod
    // runs and the rollout waits on it, saying why.
    harness
        .status_where(&key, |status| {
            status
                .message
                .contains("waiting for data-cache.0 to be ready (readiness probe")
        })
        .await?;
    let pods = harness.containers(&key).await?;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].name, "data-cache.0");
    assert_eq!(pods[0].state, ContainerState::Running);
    let spec = harness.fake.spec_of(&pods[0].id).ok_or("spec")?;
    assert!(
        spec.binds
            .contains(&"voodu-data-cache-data-0:/data".to_owned()),
        "{:?}",
        spec.binds
    );
    harness.stop().await
}

/// Issue 12: `postgres { replicas = 2 }` runs two pods of one spec, the role-aware entrypoint
/// mounted in each; they differ by their ordinal (the entrypoint's primary/standby switch)
/// and their own DNS name, the one a standby dials (`<name>-0<PG_SCOPE_SUFFIX>`). (The
/// passwords come from the resource's bucket, which sync fills; this harness applies directly.)
#[tokio::test(start_paused = true)]
async fn i12_postgres_pods_share_one_spec_and_differ_by_ordinal() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[(
        "pg.hcl",
        r#"postgres "data" "pg" {
  image    = "busybox"
  replicas = 2
  probes {}
}
"#,
    )])?;
    let key = ResourceKey::new(Kind::Statefulset, "data", "pg");
    let pods = harness.converged(&key, 2).await?;
    let mut pods = pods;
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    for (ordinal, pod) in pods.iter().enumerate() {
        let spec = harness.fake.spec_of(&pod.id).ok_or("spec")?;
        assert_eq!(
            spec.command,
            Some(vec![
                "sh".to_owned(),
                "/usr/local/bin/voodu-postgres-entrypoint".to_owned()
            ])
        );
        for variable in [
            format!("VOODU_REPLICA_ORDINAL={ordinal}"),
            "PG_NAME=pg".to_owned(),
            "PG_SCOPE_SUFFIX=.data.voodu".to_owned(),
            "PG_REPLICATION_USER=replicator".to_owned(),
        ] {
            assert!(spec.env.contains(&variable), "{variable} in {:?}", spec.env);
        }
        assert_eq!(spec.aliases[1], format!("pg-{ordinal}.data.voodu"));
        let mounts: Vec<&str> = spec
            .binds
            .iter()
            .filter_map(|bind| bind.split(':').nth(1))
            .collect();
        assert_eq!(
            mounts,
            [
                "/usr/local/bin/voodu-postgres-entrypoint",
                "/docker-entrypoint-initdb.d/00_create_replication.sh",
                "/var/lib/postgresql/data",
            ]
        );
    }
    harness.stop().await
}

/// Docker: how long the agent may take to converge a step (a liveness bound).
const LIMIT: Duration = Duration::from_secs(60);

/// The real binary on a real engine: a scope of its own, the statefulset `db` in it.
struct DockerDb {
    agent: Option<Agent>,
    guard: DockerGuard,
    repo: TempRepo,
    dir: tempfile::TempDir,
}

impl DockerDb {
    fn scope(&self) -> &str {
        &self.guard.scope
    }

    fn pod(&self, ordinal: usize) -> String {
        format!("{}-db.{ordinal}", self.scope())
    }

    fn write(&self, replicas: usize, v: &str) -> TestResult {
        let manifest = format!(
            r#"statefulset "{scope}" "db" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = {replicas}
  env      = {{ V = "{v}" }}
  volume_claim "data" {{
    mount_path = "/data"
  }}
}}
"#,
            scope = self.scope(),
            image = test_image(),
        );
        self.repo.write("data/db.hcl", &manifest)?;
        Ok(())
    }

    fn docker(&self, args: &[&str]) -> TestResult<String> {
        let output = Command::new("docker").args(args).output()?;
        if !output.status.success() {
            return Err(format!(
                "docker {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            )
            .into());
        }
        Ok(String::from_utf8(output.stdout)?)
    }

    /// `(name, state, spec hash)` of the scope's pods, by name.
    fn pods(&self) -> TestResult<Vec<(String, String, String)>> {
        let filter = format!("label=voodu.scope={}", self.scope());
        let listed = self.docker(&[
            "ps",
            "-a",
            "--filter",
            &filter,
            "--filter",
            "label=voodu.role=statefulset",
            "--format",
            r#"{{.Names}} {{.State}} {{.Label "voodu.manifest_hash"}}"#,
        ])?;
        let mut pods: Vec<(String, String, String)> = listed
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(' ').map(ToOwned::to_owned);
                Some((fields.next()?, fields.next()?, fields.next()?))
            })
            .collect();
        pods.sort();
        Ok(pods)
    }

    fn volumes(&self) -> TestResult<Vec<String>> {
        let filter = format!("label=voodu.scope={}", self.scope());
        let listed = self.docker(&["volume", "ls", "-q", "--filter", &filter])?;
        let mut names: Vec<String> = listed.lines().map(ToOwned::to_owned).collect();
        names.sort();
        Ok(names)
    }

    /// The statefulset in `status --json`, if listed.
    fn resource(&self) -> TestResult<Option<Value>> {
        let output = Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .args(["status", "--json", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .output()?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned().into());
        }
        let status: Value = serde_json::from_slice(&output.stdout)?;
        Ok(status["resources"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .find(|resource| {
                resource["kind"] == "statefulset"
                    && resource["scope"] == self.scope()
                    && resource["name"] == "db"
            }))
    }

    /// Waits until exactly pods `0..n` run with one hash (not `not_hash`) and status says
    /// Ready with that hash; returns the hash.
    fn converged(&self, n: usize, not_hash: Option<&str>) -> TestResult<String> {
        wait_until(LIMIT, &format!("{n} running pods"), || {
            let pods = self.pods().ok()?;
            let resource = self.resource().ok()??;
            let hash = resource["spec_hash"].as_str()?.to_owned();
            let names: Vec<String> = (0..n).map(|ordinal| self.pod(ordinal)).collect();
            let ready = pods.iter().map(|pod| pod.0.clone()).collect::<Vec<_>>() == names
                && pods.iter().all(|pod| pod.1 == "running" && pod.2 == hash)
                && not_hash != Some(hash.as_str())
                && resource["phase"] == "Ready"
                && resource["running_replicas"] == n;
            ready.then_some(hash)
        })
    }

    /// `voodu-agent plan` of the working clone (uncommitted edits included) on this host.
    fn plan(&self, json: bool) -> TestResult<String> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_voodu-agent"));
        command
            .arg("plan")
            .arg("--repo")
            .arg(self.repo.work())
            .arg("--data-dir")
            .arg(self.dir.path().join("data"));
        if json {
            command.arg("--json");
        }
        let output = command.output()?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned().into());
        }
        Ok(String::from_utf8(output.stdout)?)
    }

    fn exec(&self, ordinal: usize, script: &str) -> TestResult<String> {
        self.docker(&["exec", &self.pod(ordinal), "sh", "-c", script])
    }

    /// Pod names of `create`/`destroy` events seen by `events`, in order.
    fn pod_events(&self, events: &Events, n: usize) -> TestResult<Vec<String>> {
        let prefix = format!("{}-db.", self.scope());
        wait_until(LIMIT, &format!("{n} pod events"), || {
            let seen: Vec<String> = events
                .seen()
                .ok()?
                .into_iter()
                .filter(|(action, name)| {
                    name.starts_with(&prefix) && (action == "create" || action == "destroy")
                })
                .map(|(action, name)| format!("{action} {name}"))
                .collect();
            (seen.len() >= n).then_some(seen)
        })
    }

    fn dump(&self) {
        let log = std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default();
        eprintln!("---- agent log ----\n{log}");
        eprintln!("---- pods ----\n{:#?}", self.pods());
        eprintln!("---- volumes ----\n{:#?}", self.volumes());
    }
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn statefulset_scale_roll_prune_and_re_add_keep_ordinals_and_volumes() -> TestResult {
    let mut db = DockerDb {
        agent: None,
        guard: DockerGuard::new(&unique("t")),
        repo: TempRepo::new()?,
        dir: tempfile::tempdir()?,
    };
    let result = docker_scenario(&mut db);
    if result.is_err() {
        db.dump();
    }
    // The agent stops before the guard removes the scope's containers and volumes.
    db.agent = None;
    result
}

fn docker_scenario(db: &mut DockerDb) -> TestResult {
    let events = Events::start(
        db.scope(),
        SystemTime::now(),
        db.dir.path().join("events.log"),
    )?;
    // One pod, then three: created 0, 1, 2 in that order.
    db.write(1, "1")?;
    db.repo.commit("db: 1 pod")?;
    db.agent = Some(Agent::start(
        &db.repo,
        &db.dir.path().join("data"),
        &db.dir.path().join("agent.log"),
        &[],
    )?);
    db.converged(1, None)?;
    db.write(3, "1")?;
    db.repo.commit("db: 3 pods")?;
    let hash_1 = db.converged(3, None)?;
    let created = db.pod_events(&events, 3)?;
    assert_eq!(
        created,
        (0..3)
            .map(|ordinal| format!("create {}", db.pod(ordinal)))
            .collect::<Vec<_>>(),
        "scale-up goes bottom-up"
    );
    drop(events);
    let volumes: Vec<String> = (0..3)
        .map(|ordinal| format!("voodu-{}-db-data-{ordinal}", db.scope()))
        .collect();
    assert_eq!(db.volumes()?, volumes);
    let labels = db.docker(&[
        "volume",
        "inspect",
        "--format",
        "{{json .Labels}}",
        &volumes[1],
    ])?;
    let labels: BTreeMap<String, String> = serde_json::from_str(&labels)?;
    for (label, value) in [
        ("createdby", "voodu"),
        ("voodu.kind", "statefulset"),
        ("voodu.scope", db.scope()),
        ("voodu.name", "db"),
        ("voodu.replica_ordinal", "1"),
        ("voodu.claim", "data"),
    ] {
        assert_eq!(
            labels.get(label).map(String::as_str),
            Some(value),
            "{label}"
        );
    }
    for ordinal in 0..3 {
        db.exec(ordinal, &format!("echo marker-{ordinal} > /data/marker"))?;
        assert_eq!(
            db.exec(ordinal, "echo $VOODU_REPLICA_ORDINAL")?.trim(),
            ordinal.to_string()
        );
    }

    // A spec change rolls the pods highest ordinal first, names and volumes kept.
    let events = Events::start(
        db.scope(),
        SystemTime::now(),
        db.dir.path().join("events-roll.log"),
    )?;
    db.write(3, "2")?;
    // `plan` shows what the agent is about to do, ordinal by ordinal.
    let plan: Value = serde_json::from_str(&db.plan(true)?)?;
    let planned = plan["resources"]
        .as_array()
        .ok_or("plan resources")?
        .iter()
        .find(|resource| resource["kind"] == "statefulset" && resource["scope"] == db.scope())
        .ok_or("db in the plan")?
        .clone();
    assert_eq!(planned["action"], "replace");
    let steps: Vec<String> = (0..3)
        .rev()
        .map(|ordinal| {
            format!(
                "replace pod {ordinal} ({}), same name and volumes",
                db.pod(ordinal)
            )
        })
        .collect();
    assert_eq!(planned["steps"], serde_json::json!(steps));
    let text = db.plan(false)?;
    assert!(
        text.contains("env changed; pod(s) 2, 1, 0 replaced one at a time"),
        "{text}"
    );
    db.repo.commit("db: V=2")?;
    let hash_2 = db.converged(3, Some(&hash_1))?;
    let rolled = db.pod_events(&events, 6)?;
    drop(events);
    let mut expected = Vec::new();
    for ordinal in [2, 1, 0] {
        expected.push(format!("destroy {}", db.pod(ordinal)));
        expected.push(format!("create {}", db.pod(ordinal)));
    }
    assert_eq!(rolled, expected, "rolling replacement goes top-down");
    for ordinal in 0..3 {
        assert_eq!(
            db.exec(ordinal, "cat /data/marker")?.trim(),
            format!("marker-{ordinal}"),
            "pod {ordinal} kept its volume"
        );
        assert_eq!(db.exec(ordinal, "echo $V")?.trim(), "2");
    }

    // Scale down to one: 2 then 1 removed, their volumes kept.
    let events = Events::start(
        db.scope(),
        SystemTime::now(),
        db.dir.path().join("events-down.log"),
    )?;
    db.write(1, "2")?;
    db.repo.commit("db: 1 pod")?;
    assert_eq!(
        db.converged(1, None)?,
        hash_2,
        "scaling keeps the spec hash"
    );
    assert_eq!(
        db.pod_events(&events, 2)?,
        [
            format!("destroy {}", db.pod(2)),
            format!("destroy {}", db.pod(1))
        ],
        "scale-down goes top-down"
    );
    drop(events);
    assert_eq!(db.volumes()?, volumes, "scale-down keeps volumes");
    let resource = db.resource()?.ok_or("db in status")?;
    let kept: Vec<&str> = resource["detail"]["volumes"]
        .as_array()
        .ok_or("detail.volumes in status --json")?
        .iter()
        .filter(|volume| volume["kept"] == true)
        .filter_map(|volume| volume["name"].as_str())
        .collect();
    assert_eq!(
        kept,
        volumes[1..].iter().map(String::as_str).collect::<Vec<_>>()
    );

    // Out of the repo: the pod goes, the volumes stay.
    db.repo.remove("data/db.hcl")?;
    db.repo.commit("db: removed")?;
    wait_until(LIMIT, "db pruned", || {
        let gone = db.pods().ok()?.is_empty() && db.resource().ok()?.is_none();
        gone.then_some(())
    })?;
    assert_eq!(db.volumes()?, volumes, "prune keeps volumes");

    // Back in the repo: the pods find their data again.
    db.write(2, "2")?;
    db.repo.commit("db: back")?;
    db.converged(2, None)?;
    for ordinal in 0..2 {
        assert_eq!(
            db.exec(ordinal, "cat /data/marker")?.trim(),
            format!("marker-{ordinal}")
        );
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_build_mode_statefulset_runs_the_built_image() -> TestResult {
    let mut harness = Harness::new()?;
    harness.start()?;
    harness.push(&[(
        "db.hcl",
        r#"statefulset "data" "db" {
  command = ["sleep", "3600"]
}
"#,
    )])?;
    let pods = harness.converged(&db_key(), 1).await?;
    assert_eq!(pods[0].image, harness.fake.pinned("data-db:latest"));
    harness.stop().await
}
