//! Issue 23 item 1 on a real engine: a bind source built from an interpolated value
//! (`${asset…}/../../../etc`) never becomes a mount of the host's `/etc`. The agent (the real
//! binary, default policy) rejects the commit with its location and keeps the last good one
//! running, and no container of the scope ever mounts `/etc`; the sink itself (`Guarded` over
//! the real `DockerRuntime`) refuses the folded request before the engine sees it, as it does a
//! log driver that ships output to the host's loopback.
//!
//! Limits in `wait_until` are liveness bounds.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use voodu_agent::model::policy::OwnedPaths;
use voodu_agent::runtime::{
    ContainerSpec, Containers, DockerRuntime, Error, Guarded, Rules, labels,
};

use crate::e2e_docker::{Env, Events};
use crate::support::{DockerGuard, TestResult, test_image, unique, wait_until};

const LIMIT: Duration = Duration::from_secs(60);

fn manifest(scope: &str, volume: &str) -> String {
    format!(
        r#"asset "{scope}" "a" {{
  k = "hello"
}}

deployment "{scope}" "web" {{
  image   = "{image}"
  command = ["sleep", "3600"]
  volumes = ["{volume}"]
}}
"#,
        image = test_image(),
    )
}

/// Every host path mounted into a container of `scope`, existing or stopped.
fn mounted_sources(scope: &str) -> TestResult<Vec<String>> {
    let ids = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=voodu.scope={scope}"),
        ])
        .output()?;
    let ids: Vec<String> = String::from_utf8(ids.stdout)?
        .split_whitespace()
        .map(ToOwned::to_owned)
        .collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let output = Command::new("docker")
        .arg("inspect")
        .args(["--format", "{{range .Mounts}}{{.Source}}\n{{end}}"])
        .args(&ids)
        .output()?;
    Ok(String::from_utf8(output.stdout)?
        .lines()
        .filter(|line| !line.is_empty())
        .map(ToOwned::to_owned)
        .collect())
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i23_an_interpolated_walk_to_etc_is_rejected_and_never_mounted() -> TestResult {
    Env::new()?.run(walk_to_etc)
}

fn walk_to_etc(env: &mut Env) -> TestResult {
    let scope = env.scope().to_owned();
    let events = Events::start(&scope, SystemTime::now(), env.dir.path().join("events.log"))?;
    let asset = format!("${{asset.{scope}.a.k}}");
    env.repo.write(
        "app/web.hcl",
        &manifest(&scope, &format!("{asset}:/etc/app.conf:ro")),
    )?;
    let good = env.repo.commit("web with its asset file")?;
    env.start_agent_with(&["--ready-settle", "1s"])?;
    wait_until(LIMIT, "web to be Ready", || {
        let status = env.status().ok()?;
        (status["last_applied"]["sha"] == good.as_str()).then_some(())?;
        status["resources"]
            .as_array()?
            .iter()
            .find(|resource| resource["scope"] == scope.as_str() && resource["name"] == "web")
            .filter(|web| web["phase"] == "Ready")
            .map(|_| ())
    })?;
    let before = env.containers()?;

    let walk = format!("{asset}/../../../../../../../../../../../../etc:/host-etc");
    env.repo.write("app/web.hcl", &manifest(&scope, &walk))?;
    let bad = env
        .repo
        .commit("web mounts the host's /etc through its asset path")?;
    let rejected = wait_until(LIMIT, "the walk to be rejected", || {
        let status = env.status().ok()?;
        (status["last_rejected"]["sha"] == bad.as_str()).then(|| status["last_rejected"].clone())
    })?;
    let errors: Vec<String> = rejected["errors"]
        .as_array()
        .ok_or("errors")?
        .iter()
        .filter_map(|error| error.as_str().map(ToOwned::to_owned))
        .collect();
    assert_eq!(
        errors,
        [
            "app/web.hcl:8:3: bind mount of /etc (a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc to allow it"
        ],
    );
    assert_eq!(env.status()?["last_applied"]["sha"], good.as_str());
    env.polled(2)?;
    assert_eq!(
        env.containers()?,
        before,
        "a rejected commit changes nothing"
    );
    let created = events
        .seen()?
        .iter()
        .filter(|(action, _)| action == "create")
        .count();
    assert_eq!(
        created,
        before.len(),
        "only the good commit's containers were created"
    );
    let sources = mounted_sources(&scope)?;
    assert!(
        !sources
            .iter()
            .any(|source| source == "/etc" || source.starts_with("/etc/")),
        "no mount of /etc: {sources:?}"
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
async fn i23_the_sink_refuses_on_a_real_engine_what_the_policy_forbids() -> TestResult {
    let scope = unique("t");
    let _guard = DockerGuard::new(&scope);
    let data = tempfile::tempdir()?;
    let data_dir = data.path().display().to_string();
    let docker = Arc::new(DockerRuntime::connect().await?);
    let runtime = Guarded::new(
        Arc::clone(&docker),
        Rules::new(
            voodu_agent::model::Policy {
                data_dir: Some(data_dir.clone()),
                ..voodu_agent::model::Policy::default()
            },
            OwnedPaths::for_data_dir(&data_dir),
        ),
    );
    runtime.ensure_network("voodu0").await?;
    let spec = |name: &str, binds: Vec<String>| ContainerSpec {
        name: format!("{scope}-{name}"),
        image: test_image(),
        command: Some(vec!["sleep".to_owned(), "60".to_owned()]),
        labels: [(labels::SCOPE.to_owned(), scope.clone())].into(),
        binds,
        networks: vec!["voodu0".to_owned()],
        ..ContainerSpec::default()
    };
    // What `${asset.<scope>.a.k}/../…/etc` becomes once resolved under the data dir.
    let walk = format!("{data_dir}/assets/{scope}/a/k/../../../../../../../../../../../../etc:/x");
    match runtime.create(&spec("walk", vec![walk])).await {
        Err(Error::Refused { message }) => assert_eq!(
            message,
            "bind mount of /etc (a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc to allow it"
        ),
        other => return Err(format!("not refused: {other:?}").into()),
    }
    let mut logging = spec("syslog", Vec::new());
    logging.options = voodu_agent::model::DockerOptions::parse(&[
        "--log-driver=syslog".to_owned(),
        "--log-opt=syslog-address=tcp://127.0.0.1:5140".to_owned(),
    ])?;
    assert!(matches!(
        runtime.create(&logging).await,
        Err(Error::Refused { .. })
    ));
    assert!(
        docker
            .list(&[(labels::SCOPE, scope.as_str())])
            .await?
            .is_empty(),
        "nothing reached the engine"
    );
    // The asset file itself is the agent's own, and passes the same rules.
    let file = data.path().join("assets").join(&scope).join("a");
    std::fs::create_dir_all(&file)?;
    std::fs::write(file.join("k"), "hello")?;
    let id = runtime
        .create(&spec(
            "file",
            vec![format!("{}:/etc/app.conf:ro", file.join("k").display())],
        ))
        .await?;
    runtime.remove(&id).await?;
    Ok(())
}
