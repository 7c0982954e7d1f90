//! Issue 10 item 3, in the running agent: a commit asking for more than the host policy
//! allows is rejected whole (the last good commit keeps running), and an agent restarted with
//! a policy that allows it judges that same commit again and applies it.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use voodu_agent::manifest::Policy;
use voodu_agent::manifest::spec::Spec;
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::runtime::{Containers, FakeRuntime};
use voodu_agent::store::{Phase, ReleasePhase, Store};

use crate::support::{TempRepo, TestResult};

const GOOD: &str = r#"deployment "shop" "web" {
  image = "busybox"
}
"#;
const GREEDY: &str = r#"deployment "shop" "web" {
  image = "busybox"
  cap_add = ["SYS_ADMIN"]
  docker_options = ["--privileged"]
}
"#;

/// Starts the agent over `repo` on `data` with `policy`, polling every 100 ms.
fn start(
    repo: &TempRepo,
    data: &std::path::Path,
    policy: Policy,
) -> TestResult<(
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    start_on(repo, data, policy, Arc::new(FakeRuntime::new()))
}

/// `start` on a prepared fake engine.
fn start_on(
    repo: &TempRepo,
    data: &std::path::Path,
    policy: Policy,
    fake: Arc<FakeRuntime>,
) -> TestResult<(
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    // A restart on the same data dir: the previous agent's lock must be gone first.
    crate::support::agent::wait_data_dir_unlocked(data)?;
    let mut config = crate::support::agent::fake_agent_config(repo, data);
    config.sync.policy.merge(policy);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(voodu_agent::agent::run_with_runtime(
        config,
        fake,
        None,
        shutdown.clone().cancelled_owned(),
    ));
    Ok((shutdown, task))
}

async fn until(what: &str, mut check: impl FnMut() -> TestResult<bool>) -> TestResult {
    let step = Duration::from_millis(20);
    crate::support::until(Duration::from_secs(20), step, what, || {
        Ok(check()?.then_some(()))
    })
    .await
}

fn web_docker_options(store: &Store) -> TestResult<Vec<String>> {
    let key = ResourceKey::new(Kind::Deployment, "shop", "web");
    let desired = store.desired_all()?;
    let web = desired
        .iter()
        .find(|desired| desired.key == key)
        .ok_or("web is desired")?;
    match &web.spec {
        Spec::Deployment(spec) => Ok(spec.container.docker_options.clone()),
        other => Err(format!("web is a deployment, not {:?}", other.kind()).into()),
    }
}

#[tokio::test]
async fn a_commit_beyond_the_policy_is_rejected_until_the_host_allows_it() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", GOOD)?;
    let good = repo.commit("web")?;
    let data = tempfile::tempdir()?;
    let (shutdown, agent) = start(&repo, data.path(), Policy::default())?;
    let store = Store::open(&data.path().join("state.db"))?;
    let applied = |sha: &str| -> TestResult<bool> {
        Ok(store
            .commit_summary()?
            .last_applied
            .is_some_and(|record| record.sha.as_str() == sha))
    };
    until("the good commit applied", || applied(&good)).await?;

    repo.write("web.hcl", GREEDY)?;
    let greedy = repo.commit("privileged web")?;
    until("the greedy commit rejected", || {
        Ok(store
            .commit_summary()?
            .last_rejected
            .is_some_and(|record| record.sha.as_str() == greedy))
    })
    .await?;
    let summary = store.commit_summary()?;
    let rejected = summary.last_rejected.ok_or("rejected")?;
    assert_eq!(
        rejected
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "web.hcl:3:3: capability SYS_ADMIN (cap_add) is refused by the host policy; start the agent with --allow-cap SYS_ADMIN to allow it",
            "web.hcl:4:3: privileged containers are refused by the host policy; start the agent with --allow-privileged to allow them",
        ]
    );
    assert_eq!(summary.last_applied.ok_or("applied")?.sha.as_str(), good);
    assert!(
        web_docker_options(&store)?.is_empty(),
        "desired state is still the good commit's"
    );
    shutdown.cancel();
    agent.await??;

    // The operator allows it: the same commit is judged again at start and applied.
    let allowing = Policy {
        allow_privileged: true,
        allow_cap: vec!["SYS_ADMIN".into()],
        ..Policy::default()
    };
    let (shutdown, agent) = start(&repo, data.path(), allowing)?;
    if let Err(error) = until("the greedy commit applied", || applied(&greedy)).await {
        if agent.is_finished() {
            return Err(format!("{error}; the agent ended: {:?}", agent.await).into());
        }
        return Err(error);
    }
    assert_eq!(web_docker_options(&store)?, ["--privileged"]);
    // The same SHA, rejected before and applied now: `status` no longer says it was rejected.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
        .args(["status", "--data-dir"])
        .arg(data.path())
        .output()?;
    let text = String::from_utf8(status.stdout)?;
    assert!(text.contains(&greedy[..12]), "{text}");
    assert!(!text.contains("the latest commit was rejected"), "{text}");
    shutdown.cancel();
    agent.await??;
    Ok(())
}

/// Issue 23 item 9: a volume named like a statefulset's claim that the agent did not create
/// (no `createdby=voodu` label: made by hand, holding foreign data) is never mounted: the
/// statefulset fails with the reason and the setting that adopts it, no pod is created; an
/// agent started with `--adopt-volume NAME` mounts it.
#[tokio::test]
async fn a_foreign_volume_is_not_mounted_as_a_claim_until_adopted() -> TestResult {
    const DB: &str = r#"statefulset "data" "db" {
  image = "busybox"
  volume_claim "pg" {
    mount_path = "/var/lib/pg"
  }
}
"#;
    let claim = "voodu-data-db-pg-0";
    let key = ResourceKey::new(Kind::Statefulset, "data", "db");
    let repo = TempRepo::new()?;
    repo.write("db.hcl", DB)?;
    let first = repo.commit("db")?;
    let data = tempfile::tempdir()?;
    let fake = Arc::new(FakeRuntime::new());
    // `docker volume create voodu-data-db-pg-0` by someone else.
    fake.ensure_volume(claim, &std::collections::BTreeMap::new())
        .await?;
    let (shutdown, agent) = start_on(&repo, data.path(), Policy::default(), Arc::clone(&fake))?;
    let store = Store::open(&data.path().join("state.db"))?;
    // The pass that meets the volume writes its error first; the release's failure (what
    // the status keeps) follows.
    let refusal = format!(
        "statefulset/data/db: volume {claim} already exists and was not created by voodu (no createdby=voodu label): the agent does not mount data it did not make; remove it (docker volume rm {claim}) for a fresh one, or, only if you know who wrote it, start the agent with --adopt-volume {claim} to hand its data to the resource mounting it (whoever could create a volume of that name chose what it holds: another tenant of this engine, another source)"
    );
    let release_failed = format!(
        "release #1 (commit {}) failed: {refusal}; no earlier release ran, so there is nothing to roll back to; a new commit retries",
        &first[..12]
    );
    // The release's failure is recorded once. The status follows in either order with the
    // pass's own error (a retried pass may write it after the release's words), so wait for
    // both rather than for one wording a poll can miss.
    let (mut release, mut status) = (None, None);
    let failed = until("db's release to fail on the foreign volume", || {
        release = store.latest_release(&key)?;
        status = store.status(&key)?;
        Ok(release
            .as_ref()
            .is_some_and(|release| release.phase == ReleasePhase::Failed)
            && status.as_ref().is_some_and(|status| {
                status.phase == Phase::Failed
                    && (status.message == release_failed || status.message == refusal)
            }))
    })
    .await;
    if let Err(error) = failed {
        return Err(format!("{error}; the release: {release:?}; the status: {status:?}").into());
    }
    let release = release.ok_or("the release")?;
    assert_eq!((release.id, release.commit.as_str()), (1, first.as_str()));
    assert!(release.message.contains(&refusal), "{}", release.message);
    assert!(
        !fake.calls().iter().any(|call| call.starts_with("create ")),
        "no pod was created: {:?}",
        fake.calls()
    );
    shutdown.cancel();
    agent.await??;

    let adopting = Policy {
        adopt_volume: vec![claim.to_owned()],
        ..Policy::default()
    };
    let (shutdown, agent) = start_on(&repo, data.path(), adopting, Arc::clone(&fake))?;
    until("the pod to mount the adopted volume", || {
        Ok(fake.calls().iter().any(|call| call.starts_with("create ")))
    })
    .await?;
    shutdown.cancel();
    agent.await??;
    let pods = fake.list(&[("voodu.scope", "data")]).await?;
    let pod = pods.first().ok_or("a pod")?;
    assert_eq!(
        fake.spec_of(&pod.id).ok_or("spec")?.binds,
        [format!("{claim}:/var/lib/pg")]
    );
    Ok(())
}

/// A bind allowed as written but resolving, through a symlink on the host (one a container
/// with an allowed bind could plant), to a refused path is rejected at sync.
#[test]
fn a_bind_through_a_symlink_to_a_refused_path_is_rejected() -> TestResult {
    let host = tempfile::tempdir()?;
    let root = std::fs::canonicalize(host.path())?;
    std::os::unix::fs::symlink("/etc", root.join("link"))?;
    std::fs::create_dir(root.join("data"))?;
    let root_text = root.to_str().ok_or("utf-8 path")?;
    let repo = TempRepo::new()?;
    let data = tempfile::tempdir()?;
    let store = Arc::new(Store::open(&data.path().join("state.db"))?);
    let mut options = voodu_agent::sync::SyncOptions::new(data.path().to_owned());
    options.policy.allow_bind_root = vec![root_text.to_owned()];
    let syncer = voodu_agent::sync::Syncer::new(
        voodu_agent::git::Source::new(
            voodu_agent::git::SourceOptions {
                url: repo.url(),
                branch: "main".into(),
                paths: Vec::new(),
                token_file: None,
                ..Default::default()
            },
            data.path(),
        ),
        Arc::clone(&store),
        options,
    )?;
    let deployment = |source: &str| {
        format!(
            r#"deployment "shop" "web" {{
  image = "busybox"
  volumes = ["{root_text}/{source}:/mnt"]
}}
"#
        )
    };
    for (source, expected) in [
        ("data/sub", Vec::new()),
        (
            "link/passwd",
            vec![format!(
                "web.hcl:1:1: bind mount of {root_text}/link/passwd resolves to /etc/passwd on this host: bind mount of /etc/passwd (under /etc: a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc/passwd to allow it"
            )],
        ),
    ] {
        repo.write("web.hcl", &deployment(source))?;
        let sha = repo.commit(source)?;
        let got = match syncer.sync_once(&std::sync::atomic::AtomicBool::new(false))? {
            voodu_agent::sync::SyncOutcome::Applied { commit, .. } if commit.as_str() == sha => {
                Vec::new()
            }
            voodu_agent::sync::SyncOutcome::Rejected {
                commit,
                diagnostics,
            } if commit.as_str() == sha => diagnostics.0.iter().map(ToString::to_string).collect(),
            other => return Err(format!("{source}: unexpected {other:?}").into()),
        };
        assert_eq!(got, expected, "{source}");
    }
    Ok(())
}
