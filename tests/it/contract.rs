//! The runtime contract: the same checks run against `FakeRuntime` and a real Docker engine
//! through `DockerRuntime`, so what reconcile tests assume of the fake holds on Docker.
//!
//! Each check is a generic `check_*` function; `contract!` turns it into `fake_*` (always
//! runs) and `docker_*` (ignored unless run with `--include-ignored`, as scripts/test does). Every container carries
//! `voodu.scope=<scope>`, so `DockerGuard` removes it even when a check fails. The test image
//! has no `LABEL`s of its own, so listed labels are exactly the ones a spec sets.

use std::collections::BTreeMap;
use std::process::Command;

use voodu_agent::runtime::{
    ContainerSpec, ContainerState, Containers, DockerRuntime, Error, FakeRuntime, Informer,
    PortMapping, Runtime, labels,
};

use crate::support::{DockerGuard, TestResult, test_image, unique};

/// The network every check attaches its containers to (the agent's default network).
const NETWORK: &str = "voodu0";

/// Generates `fake_<check>` and `docker_<check>` tests from one `check_<check>` function.
macro_rules! contract {
    ($($check:ident => $fake:ident, $docker:ident;)*) => {$(
        #[tokio::test]
        async fn $fake() -> TestResult {
            let scope = unique("t");
            let runtime = FakeRuntime::with_images(&[&test_image()]);
            // Volumes keep their files in a directory of their own, as the local driver's.
            let volumes = tempfile::tempdir()?;
            runtime.set_volume_root(volumes.path());
            $check(&runtime, &scope).await
        }

        #[tokio::test]
        #[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
        async fn $docker() -> TestResult {
            let scope = unique("t");
            // Dropped last: the containers (DockerGuard) go first, then their network.
            let _network = NetworkGuard(network_name(&scope));
            let _guard = DockerGuard::new(&scope);
            let runtime = DockerRuntime::connect().await?;
            $check(&runtime, &scope).await
        }
    )*};
}

contract! {
    check_ensure_network => fake_ensure_network, docker_ensure_network;
    check_create_then_start => fake_create_then_start, docker_create_then_start;
    check_list_filters_by_labels => fake_list_filters_by_labels, docker_list_filters_by_labels;
    check_duplicate_name_conflicts => fake_duplicate_name_conflicts, docker_duplicate_name_conflicts;
    check_remove_is_idempotent => fake_remove_is_idempotent, docker_remove_is_idempotent;
    check_stop_then_remove => fake_stop_then_remove, docker_stop_then_remove;
    check_missing_image => fake_missing_image, docker_missing_image;
    check_labels_round_trip => fake_labels_round_trip, docker_labels_round_trip;
    check_exit_code_output_and_wait => fake_exit_code_output_and_wait, docker_exit_code_output_and_wait;
    check_inspect_and_exec => fake_inspect_and_exec, docker_inspect_and_exec;
    check_volumes => fake_volumes, docker_volumes;
    check_volume_path => fake_volume_path, docker_volume_path;
    check_exec_piped => fake_exec_piped, docker_exec_piped;
    check_images => fake_images, docker_images;
    check_events => fake_events, docker_events;
    check_list_by_id => fake_list_by_id, docker_list_by_id;
    check_cpu_percent => fake_cpu_percent, docker_cpu_percent;
    check_published_ports => fake_published_ports, docker_published_ports;
    check_log_stream => fake_log_stream, docker_log_stream;
}

/// A network name of the check's own, so checks never share (or delete) each other's.
fn network_name(scope: &str) -> String {
    format!("{scope}-net")
}

/// `docker network rm`s a check's own network on drop (a missing one is fine).
struct NetworkGuard(String);

impl Drop for NetworkGuard {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["network", "rm", &self.0])
            .output();
    }
}

/// Docker only: concurrent `ensure_network` calls leave exactly one network by that name (the
/// engine itself would accept several).
#[tokio::test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
async fn docker_ensure_network_races_create_one_network() -> TestResult {
    let scope = unique("t");
    let network = network_name(&scope);
    let _network = NetworkGuard(network.clone());
    let runtime = DockerRuntime::connect().await?;
    let (a, b, c) = tokio::join!(
        runtime.ensure_network(&network),
        runtime.ensure_network(&network),
        runtime.ensure_network(&network)
    );
    a?;
    b?;
    c?;
    runtime.ensure_network(&network).await?;
    assert_eq!(networks_named(&network)?, 1, "networks named {network}");
    Ok(())
}

/// How many networks the engine has by exactly this name.
fn networks_named(network: &str) -> TestResult<usize> {
    let output = Command::new("docker")
        .args([
            "network",
            "ls",
            "-q",
            "--filter",
            &format!("name=^{network}$"),
        ])
        .output()?;
    Ok(String::from_utf8(output.stdout)?.lines().count())
}

/// Docker only: two agents (two processes, so no shared lock) that created the same network at
/// once leave two networks by that name, and every use of the name is then "ambiguous";
/// `ensure_network` removes the duplicates, keeping the same one whichever agent runs it.
#[tokio::test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
async fn docker_ensure_network_removes_a_duplicate_another_process_made() -> TestResult {
    let scope = unique("t");
    let network = network_name(&scope);
    let _network = NetworkGuard(network.clone());
    let docker = bollard::Docker::connect_with_local_defaults()?
        .negotiate_version()
        .await?;
    for _ in 0..2 {
        // The engine of Debian 12 accepts the same name twice (newer engines may refuse).
        let request = bollard::models::NetworkCreateRequest {
            name: network.clone(),
            driver: Some("bridge".to_owned()),
            ..Default::default()
        };
        let _ = docker.create_network(request).await;
    }
    let made = networks_named(&network)?;
    DockerRuntime::connect()
        .await?
        .ensure_network(&network)
        .await?;
    DockerRuntime::connect()
        .await?
        .ensure_network(&network)
        .await?;
    assert_eq!(
        networks_named(&network)?,
        1,
        "{made} networks named {network} before ensure_network"
    );
    Ok(())
}

/// A `sleep 300` container on the test image, on `voodu0`, labelled with the scope.
fn spec(scope: &str, name: &str) -> ContainerSpec {
    ContainerSpec {
        name: format!("{scope}-{name}"),
        image: test_image(),
        command: Some(vec!["sleep".to_owned(), "300".to_owned()]),
        labels: BTreeMap::from([(labels::SCOPE.to_owned(), scope.to_owned())]),
        restart: "no".to_owned(),
        networks: vec![NETWORK.to_owned()],
        ..ContainerSpec::default()
    }
}

/// Ids and states of the scope's containers, sorted by name.
async fn listed<R: Runtime>(
    runtime: &R,
    filter: &[(&str, &str)],
) -> TestResult<Vec<(String, String, ContainerState)>> {
    let mut containers: Vec<_> = runtime
        .list(filter)
        .await?
        .into_iter()
        .map(|container| (container.name, container.id, container.state))
        .collect();
    containers.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(containers)
}

async fn check_ensure_network<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    let network = network_name(scope);
    let mut on_network = spec(scope, "net");
    on_network.networks = vec![network.clone()];

    // Before the network exists the container never runs. The fake refuses at create; Docker
    // 20.10 creates it and refuses at start, newer engines refuse at create (404 both).
    let outcome = match runtime.create(&on_network).await {
        Err(error) => Err(error),
        Ok(id) => {
            let started = runtime.start(&id).await;
            runtime.remove(&id).await?;
            started
        }
    };
    assert!(
        matches!(outcome, Err(Error::NotFound { .. })),
        "a container on a missing network: expected NotFound, got {outcome:?}"
    );
    assert_eq!(listed(runtime, &[(labels::SCOPE, scope)]).await?, vec![]);

    // Idempotent, also when two callers race (the engine would accept two same-named networks).
    let (first, second) = tokio::join!(
        runtime.ensure_network(&network),
        runtime.ensure_network(&network)
    );
    first?;
    second?;
    runtime.ensure_network(&network).await?;

    let id = runtime.create(&on_network).await?;
    runtime.start(&id).await?;
    let containers = listed(runtime, &[(labels::SCOPE, scope)]).await?;
    assert_eq!(
        containers,
        vec![(on_network.name.clone(), id.clone(), ContainerState::Running)]
    );
    runtime.remove(&id).await?;
    Ok(())
}

async fn check_create_then_start<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let web = spec(scope, "web");
    let id = runtime.create(&web).await?;
    assert!(!id.is_empty(), "create returns the container id");
    let scope_filter = [(labels::SCOPE, scope)];
    assert_eq!(
        listed(runtime, &scope_filter).await?,
        vec![(web.name.clone(), id.clone(), ContainerState::Created)]
    );
    runtime.start(&id).await?;
    assert_eq!(
        listed(runtime, &scope_filter).await?,
        vec![(web.name.clone(), id.clone(), ContainerState::Running)]
    );
    runtime.remove(&id).await?;
    Ok(())
}

async fn check_list_filters_by_labels<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let mut a = spec(scope, "a");
    a.labels.insert(labels::NAME.to_owned(), "a".to_owned());
    let mut b = spec(scope, "b");
    b.labels.insert(labels::NAME.to_owned(), "b".to_owned());
    let a_id = runtime.create(&a).await?;
    let b_id = runtime.create(&b).await?;
    runtime.start(&a_id).await?;

    // `b` was never started: listed all the same, as Created.
    let only_a = listed(runtime, &[(labels::SCOPE, scope), (labels::NAME, "a")]).await?;
    assert_eq!(
        only_a,
        vec![(a.name.clone(), a_id.clone(), ContainerState::Running)]
    );
    let only_b = listed(runtime, &[(labels::SCOPE, scope), (labels::NAME, "b")]).await?;
    assert_eq!(
        only_b,
        vec![(b.name.clone(), b_id.clone(), ContainerState::Created)]
    );
    let both = listed(runtime, &[(labels::SCOPE, scope)]).await?;
    assert_eq!(
        both,
        vec![
            (a.name.clone(), a_id.clone(), ContainerState::Running),
            (b.name.clone(), b_id.clone(), ContainerState::Created),
        ]
    );
    // Every pair must match: a value that no container has selects nothing.
    assert_eq!(
        listed(runtime, &[(labels::SCOPE, scope), (labels::NAME, "c")]).await?,
        vec![]
    );
    assert_eq!(
        listed(
            runtime,
            &[(labels::SCOPE, scope), (labels::KIND, "deployment")]
        )
        .await?,
        vec![]
    );

    runtime.remove(&a_id).await?;
    runtime.remove(&b_id).await?;
    Ok(())
}

async fn check_duplicate_name_conflicts<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let web = spec(scope, "web");
    let id = runtime.create(&web).await?;
    let mut again = web.clone();
    again
        .labels
        .insert(labels::NAME.to_owned(), "second".to_owned());
    match runtime.create(&again).await {
        Err(Error::Conflict { name, .. }) => assert_eq!(name, web.name),
        other => {
            return Err(format!(
                "a second container named {}: expected Conflict, got {other:?}",
                web.name
            )
            .into());
        }
    }
    // The first container is untouched and still the only one.
    assert_eq!(
        listed(runtime, &[(labels::SCOPE, scope)]).await?,
        vec![(web.name.clone(), id.clone(), ContainerState::Created)]
    );
    runtime.remove(&id).await?;
    Ok(())
}

async fn check_remove_is_idempotent<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let running = spec(scope, "running");
    let created = spec(scope, "created");
    let running_id = runtime.create(&running).await?;
    runtime.start(&running_id).await?;
    let created_id = runtime.create(&created).await?;

    runtime.remove(&running_id).await?;
    assert_eq!(
        listed(runtime, &[(labels::SCOPE, scope)]).await?,
        vec![(
            created.name.clone(),
            created_id.clone(),
            ContainerState::Created
        )]
    );
    runtime.remove(&running_id).await?;
    runtime.remove(&created_id).await?;
    runtime.remove(&created_id).await?;
    runtime.remove(&format!("{:064}", 0)).await?;
    assert_eq!(listed(runtime, &[(labels::SCOPE, scope)]).await?, vec![]);
    // The name is free again.
    let id = runtime.create(&running).await?;
    runtime.remove(&id).await?;
    Ok(())
}

/// `stop` ends a running container (one that exits on SIGTERM: `sleep` under the init) and
/// is a no-op on a stopped or gone one; `remove` then takes it away.
async fn check_stop_then_remove<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let id = runtime.create(&spec(scope, "stopped")).await?;
    runtime.start(&id).await?;
    let grace = std::time::Duration::from_secs(5);
    runtime.stop(&id, grace).await?;
    assert!(!runtime.inspect(&id).await?.running, "stopped by SIGTERM");
    runtime.stop(&id, grace).await?;
    runtime.remove(&id).await?;
    runtime.stop(&id, grace).await?;
    assert_eq!(listed(runtime, &[(labels::SCOPE, scope)]).await?, vec![]);
    Ok(())
}

async fn check_missing_image<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let mut missing = spec(scope, "missing");
    missing.image = format!("voodu-no-such-image-{scope}:latest");
    match runtime.create(&missing).await {
        Err(Error::ImageMissing { image, .. }) => assert_eq!(image, missing.image),
        other => {
            return Err(format!("a missing image: expected ImageMissing, got {other:?}").into());
        }
    }
    assert_eq!(listed(runtime, &[(labels::SCOPE, scope)]).await?, vec![]);
    Ok(())
}

async fn check_labels_round_trip<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let mut web = spec(scope, "web");
    web.labels.extend(
        [
            (labels::CREATED_BY, labels::CREATED_BY_VALUE),
            (labels::KIND, "deployment"),
            (labels::NAME, "web"),
            (labels::MANIFEST_HASH, "0123456789abcdef"),
            (labels::CREATED_AT, "2024-01-02T03:04:05Z"),
            ("contract.empty", ""),
            ("contract.spaces", "a value with spaces"),
            ("contract.equals", "k=v,x=y"),
            ("contract.unicode", "héllo ✓"),
        ]
        .map(|(key, value)| (key.to_owned(), value.to_owned())),
    );
    let id = runtime.create(&web).await?;
    runtime.start(&id).await?;
    let containers = runtime.list(&[(labels::SCOPE, scope)]).await?;
    let [container] = containers.as_slice() else {
        return Err(format!("expected one container, listed {containers:?}").into());
    };
    assert_eq!(container.id, id);
    assert_eq!(container.name, web.name);
    assert_eq!(container.labels, web.labels);
    assert_eq!(
        container.label(labels::MANIFEST_HASH),
        Some("0123456789abcdef")
    );
    // A filter on a label with an odd value still selects by exact match.
    let by_value = runtime
        .list(&[
            (labels::SCOPE, scope),
            ("contract.spaces", "a value with spaces"),
        ])
        .await?;
    assert_eq!(
        by_value.len(),
        1,
        "filter by a value with spaces: {by_value:?}"
    );
    runtime.remove(&id).await?;
    Ok(())
}

/// A one-shot container: `wait` returns its exit code, `inspect` shows it stopped with that
/// code, `logs` returns its output (tail counts lines).
async fn check_exit_code_output_and_wait<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let mut job = spec(scope, "job");
    job.command = Some(vec![
        "sh".to_owned(),
        "-c".to_owned(),
        "echo hello; echo world; exit 3".to_owned(),
    ]);
    let id = runtime.create(&job).await?;
    runtime.start(&id).await?;
    assert_eq!(runtime.wait(&id).await?, 3);
    let inspection = runtime.inspect(&id).await?;
    assert_eq!((inspection.running, inspection.exit_code), (false, Some(3)));
    assert_eq!(runtime.logs(&id, 10).await?, "hello\nworld\n");
    assert_eq!(runtime.logs(&id, 1).await?, "world\n");
    let mut ok = spec(scope, "ok");
    ok.command = Some(vec!["true".to_owned()]);
    let ok_id = runtime.create(&ok).await?;
    runtime.start(&ok_id).await?;
    assert_eq!(runtime.wait(&ok_id).await?, 0);
    runtime.remove(&id).await?;
    runtime.remove(&ok_id).await?;
    Ok(())
}

/// A running container has an address on its network; `exec` returns the command's exit code
/// and output.
async fn check_inspect_and_exec<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let web = spec(scope, "web");
    let id = runtime.create(&web).await?;
    runtime.start(&id).await?;
    let inspection = runtime.inspect(&id).await?;
    assert!(inspection.running);
    assert_eq!(
        inspection.exit_code, None,
        "a running container has no exit code"
    );
    assert_eq!(inspection.name, web.name);
    let address = inspection
        .ip_addresses
        .get(NETWORK)
        .ok_or("an address on the network")?;
    assert!(address.parse::<std::net::Ipv4Addr>().is_ok(), "{address}");
    let outcome = runtime
        .exec(
            &id,
            &[
                "sh".to_owned(),
                "-c".to_owned(),
                "echo probe; exit 4".to_owned(),
            ],
        )
        .await?;
    assert_eq!((outcome.exit_code, outcome.output.as_str()), (4, "probe\n"));
    assert_eq!(runtime.exec(&id, &["true".to_owned()]).await?.exit_code, 0);
    assert_eq!(runtime.exec(&id, &["false".to_owned()]).await?.exit_code, 1);
    runtime.remove(&id).await?;
    assert!(matches!(
        runtime.inspect(&id).await,
        Err(Error::NotFound { .. })
    ));
    Ok(())
}

/// Named volumes: created once with their labels, listed by label, kept while mounted,
/// removed on request (a missing one is fine).
async fn check_volumes<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let name = format!("{scope}-data-0");
    let volume_labels = BTreeMap::from([(labels::SCOPE.to_owned(), scope.to_owned())]);
    runtime.ensure_volume(&name, &volume_labels).await?;
    runtime.ensure_volume(&name, &volume_labels).await?;
    let listed: Vec<String> = runtime
        .list_volumes(&[(labels::SCOPE, scope)])
        .await?
        .into_iter()
        .map(|volume| volume.name)
        .collect();
    assert_eq!(listed, std::slice::from_ref(&name));
    let mut user = spec(scope, "user");
    user.binds = vec![format!("{name}:/data")];
    let id = runtime.create(&user).await?;
    assert!(
        runtime.remove_volume(&name).await.is_err(),
        "a mounted volume stays"
    );
    runtime.remove(&id).await?;
    runtime.remove_volume(&name).await?;
    runtime.remove_volume(&name).await?;
    assert!(
        runtime
            .list_volumes(&[(labels::SCOPE, scope)])
            .await?
            .is_empty()
    );
    Ok(())
}

/// A named volume's files are in one host directory (`volume_path`); a volume that does
/// not exist has none.
async fn check_volume_path<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    let name = format!("{scope}-data-0");
    assert_eq!(runtime.volume_path(&name).await?, None);
    let volume_labels = BTreeMap::from([(labels::SCOPE.to_owned(), scope.to_owned())]);
    runtime.ensure_volume(&name, &volume_labels).await?;
    let path = runtime
        .volume_path(&name)
        .await?
        .ok_or("an existing volume has a directory")?;
    assert!(path.is_dir(), "{}", path.display());
    std::fs::write(path.join("written-on-the-host"), "kept")?;
    // Asked again: the same directory, with what was written there.
    let again = runtime.volume_path(&name).await?.ok_or("still there")?;
    assert_eq!(
        std::fs::read_to_string(again.join("written-on-the-host"))?,
        "kept"
    );
    runtime.remove_volume(&name).await?;
    assert_eq!(runtime.volume_path(&name).await?, None);
    Ok(())
}

/// A piped exec: the command's stdout is streamed to the writer (not into the outcome), its
/// stdin read from the reader to its end, and its exit code returned.
async fn check_exec_piped<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    use tokio::io::AsyncReadExt as _;
    runtime.ensure_network(NETWORK).await?;
    let id = runtime.create(&spec(scope, "piped")).await?;
    runtime.start(&id).await?;
    let (writer, mut reader) = tokio::io::duplex(64 * 1024);
    let outcome = runtime
        .exec_piped(
            &id,
            &[
                "sh".to_owned(),
                "-c".to_owned(),
                "echo dumped; exit 3".to_owned(),
            ],
            None,
            Some(Box::new(writer)),
        )
        .await?;
    let mut out = String::new();
    reader.read_to_string(&mut out).await?;
    assert_eq!((outcome.exit_code, out.as_str()), (3, "dumped\n"));
    // stdin to the end, through `cat`, back out.
    let (writer, mut reader) = tokio::io::duplex(64 * 1024);
    let input: &'static [u8] = b"line one\nline two\n";
    let outcome = runtime
        .exec_piped(
            &id,
            &["cat".to_owned()],
            Some(Box::new(input)),
            Some(Box::new(writer)),
        )
        .await?;
    let mut out = String::new();
    reader.read_to_string(&mut out).await?;
    assert_eq!(
        (outcome.exit_code, out.as_str()),
        (0, "line one\nline two\n")
    );
    runtime.remove(&id).await?;
    Ok(())
}

/// The test image is present; an unknown one is not, and pulling it fails.
async fn check_images<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    assert!(runtime.image_present(&test_image()).await?);
    let missing = format!("voodu-missing-{scope}:1");
    assert!(!runtime.image_present(&missing).await?);
    assert!(runtime.pull(&missing, None).await.is_err());
    Ok(())
}

/// `events` reports a container's start, its exit (`die`) and its removal (`destroy`), with
/// its labels, to a subscriber filtering by them; other containers' events are filtered out.
async fn check_events<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    use futures_util::StreamExt as _;
    runtime.ensure_network(NETWORK).await?;
    let mut events = runtime.events(&[(labels::SCOPE, scope)]);
    let mut job = spec(scope, "events");
    job.command = Some(vec!["sh".to_owned(), "-c".to_owned(), "exit 0".to_owned()]);
    let id = runtime.create(&job).await?;
    runtime.start(&id).await?;
    runtime.wait(&id).await?;
    runtime.remove(&id).await?;
    let mut seen = Vec::new();
    let deadline = std::time::Duration::from_secs(20);
    while !seen.iter().any(|action: &String| action == "destroy") {
        let event = tokio::time::timeout(deadline, events.next())
            .await
            .map_err(|_| format!("no destroy event within {deadline:?}; saw {seen:?}"))?
            .ok_or("the event stream ended")??;
        assert_eq!(
            event.labels.get(labels::SCOPE).map(String::as_str),
            Some(scope)
        );
        if event.id == id && ["start", "die", "destroy"].contains(&event.action.as_str()) {
            seen.push(event.action);
        }
    }
    assert_eq!(seen, ["start", "die", "destroy"]);
    Ok(())
}

/// The chunks of `stream` as text, until it ends (bounded).
async fn read_all(mut stream: voodu_agent::runtime::LogChunks) -> TestResult<String> {
    use futures_util::StreamExt as _;
    let mut text = String::new();
    let deadline = std::time::Duration::from_secs(30);
    while let Some(chunk) = tokio::time::timeout(deadline, stream.next())
        .await
        .map_err(|_| format!("the log stream did not end within {deadline:?}; read {text:?}"))?
    {
        text.push_str(&String::from_utf8(chunk?)?);
    }
    Ok(text)
}

/// `log_stream` reads a container's output: `tail` keeps the last lines, without `follow` the
/// stream ends at once, with it the stream ends when the container stops; an unknown
/// container is `NotFound`.
async fn check_log_stream<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    use voodu_agent::runtime::LogOptions;
    runtime.ensure_network(NETWORK).await?;
    let mut printer = spec(scope, "logs");
    printer.command = Some(vec![
        "sh".to_owned(),
        "-c".to_owned(),
        "echo one; echo two; echo three; sleep 300".to_owned(),
    ]);
    let id = runtime.create(&printer).await?;
    runtime.start(&id).await?;
    // The engine writes the output a moment after the start.
    let mut all = String::new();
    for _ in 0..100 {
        all = read_all(runtime.log_stream(&id, LogOptions::default())).await?;
        if all.lines().count() >= 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(all, "one\ntwo\nthree\n");
    let tail = LogOptions {
        tail: Some(2),
        ..LogOptions::default()
    };
    assert_eq!(
        read_all(runtime.log_stream(&id, tail)).await?,
        "two\nthree\n"
    );
    let follow = LogOptions {
        tail: Some(1),
        follow: true,
        ..LogOptions::default()
    };
    let followed = tokio::spawn(read_all(runtime.log_stream(&id, follow)));
    // Still open while the container runs.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !followed.is_finished(),
        "a followed stream ended while its container runs"
    );
    runtime.stop(&id, std::time::Duration::from_secs(1)).await?;
    assert_eq!(followed.await??, "three\n");
    let gone = "0".repeat(64);
    let mut missing = runtime.log_stream(&gone, LogOptions::default());
    use futures_util::StreamExt as _;
    assert!(
        matches!(missing.next().await, Some(Err(Error::NotFound { .. }))),
        "an unknown container is NotFound"
    );
    Ok(())
}

/// `list_by_id` answers as `list` does, for the ids it is given; an id of no container is
/// left out.
async fn check_list_by_id<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let (a, b) = (spec(scope, "a"), spec(scope, "b"));
    let a_id = runtime.create(&a).await?;
    let b_id = runtime.create(&b).await?;
    runtime.start(&a_id).await?;
    let gone = "0".repeat(64);
    let mut by_id = runtime
        .list_by_id(&[a_id.clone(), b_id.clone(), gone])
        .await?;
    by_id.sort_by(|x, y| x.name.cmp(&y.name));
    let mut by_label = runtime.list(&[(labels::SCOPE, scope)]).await?;
    by_label.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(by_id, by_label);
    assert_eq!(
        by_id
            .iter()
            .map(|container| (container.name.as_str(), container.state))
            .collect::<Vec<_>>(),
        [
            (a.name.as_str(), ContainerState::Running),
            (b.name.as_str(), ContainerState::Created)
        ]
    );
    runtime.remove(&a_id).await?;
    assert_eq!(runtime.list_by_id(&[a_id]).await?, []);
    runtime.remove(&b_id).await?;
    Ok(())
}

#[tokio::test]
async fn fake_informer_follows_what_another_client_does() -> TestResult {
    let runtime = std::sync::Arc::new(FakeRuntime::with_images(&[&test_image()]));
    check_informer(runtime, &unique("t")).await
}

#[tokio::test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
async fn docker_informer_follows_what_another_client_does() -> TestResult {
    let scope = unique("t");
    let _guard = DockerGuard::new(&scope);
    let runtime = std::sync::Arc::new(DockerRuntime::connect().await?);
    check_informer(runtime, &scope).await
}

/// The informer (the agent's containers in memory) answers a resource's list as the engine
/// does, after what the agent did through it and after what another client did, once the
/// event of that was handed on.
async fn check_informer<R: Runtime>(runtime: std::sync::Arc<R>, scope: &str) -> TestResult {
    use futures_util::StreamExt as _;
    runtime.ensure_network(NETWORK).await?;
    // The scope is the informer's agent id too.
    let informer = Informer::new(runtime.clone(), scope, true);
    let agent = [(labels::AGENT, scope)];
    let mut events = informer.events(&agent);
    assert_eq!(informer.list(&agent).await?, []);
    let replica = |name: &str| {
        let mut spec = spec(scope, name);
        spec.labels
            .insert(labels::AGENT.to_owned(), scope.to_owned());
        spec.labels
            .insert(labels::NAME.to_owned(), "web".to_owned());
        spec
    };
    let web = [(labels::AGENT, scope), (labels::NAME, "web")];
    let seen = async |informer: &Informer<R>| -> TestResult<Vec<(String, ContainerState)>> {
        let mut seen: Vec<_> = informer
            .list(&web)
            .await?
            .into_iter()
            .map(|container| (container.name, container.state))
            .collect();
        seen.sort_by(|x, y| x.0.cmp(&y.0));
        let mut engine: Vec<_> = runtime
            .list(&web)
            .await?
            .into_iter()
            .map(|container| (container.name, container.state))
            .collect();
        engine.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(seen, engine, "the informer and the engine disagree");
        Ok(seen)
    };
    let mut handed_on = async |id: &str, action: &str| -> TestResult {
        let wait = std::time::Duration::from_secs(20);
        loop {
            let event = tokio::time::timeout(wait, events.next())
                .await
                .map_err(|_| format!("no {action} of {id} within {wait:?}"))?
                .ok_or("the event stream ended")??;
            if event.id == id && event.action == action {
                return Ok(());
            }
        }
    };
    let first = replica("web-1");
    let id = informer.create(&first).await?;
    informer.start(&id).await?;
    assert_eq!(
        seen(&informer).await?,
        [(first.name.clone(), ContainerState::Running)]
    );
    // Another client stops it, removes it, and makes another.
    runtime.stop(&id, std::time::Duration::from_secs(1)).await?;
    handed_on(&id, "die").await?;
    assert_eq!(
        seen(&informer).await?,
        [(first.name.clone(), ContainerState::Exited)]
    );
    runtime.remove(&id).await?;
    handed_on(&id, "destroy").await?;
    assert_eq!(seen(&informer).await?, []);
    let second = replica("web-2");
    let other = runtime.create(&second).await?;
    handed_on(&other, "create").await?;
    assert_eq!(
        seen(&informer).await?,
        [(second.name.clone(), ContainerState::Created)]
    );
    runtime.remove(&other).await?;
    Ok(())
}

/// `cpu_percent` of a running container is a finite, non-negative figure.
async fn check_cpu_percent<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let web = spec(scope, "cpu");
    let id = runtime.create(&web).await?;
    runtime.start(&id).await?;
    let percent = runtime.cpu_percent(&id).await?;
    assert!(percent.is_finite() && percent >= 0.0, "{percent}");
    runtime.remove(&id).await?;
    Ok(())
}

/// A port published on an unspecified host port gets one from the engine, which `inspect`
/// shows while the container runs (the ingress reads Caddy's admin port this way); a stopped
/// container publishes nothing.
async fn check_published_ports<R: Runtime>(runtime: &R, scope: &str) -> TestResult {
    runtime.ensure_network(NETWORK).await?;
    let mut web = spec(scope, "ports");
    web.ports = vec![
        PortMapping {
            host_ip: "127.0.0.1".to_owned(),
            host_port: None,
            container_port: 2019,
            protocol: "tcp".to_owned(),
        },
        PortMapping {
            host_ip: "127.0.0.1".to_owned(),
            host_port: Some(0),
            container_port: 80,
            protocol: "tcp".to_owned(),
        },
    ];
    let id = runtime.create(&web).await?;
    assert_eq!(runtime.inspect(&id).await?.published_ports, vec![]);
    runtime.start(&id).await?;
    let inspection = runtime.inspect(&id).await?;
    let published: Vec<(u16, &str, &str)> = inspection
        .published_ports
        .iter()
        .map(|port| {
            (
                port.container_port,
                port.protocol.as_str(),
                port.host_ip.as_str(),
            )
        })
        .collect();
    assert_eq!(
        published,
        vec![(80, "tcp", "127.0.0.1"), (2019, "tcp", "127.0.0.1")]
    );
    let admin = inspection
        .published_tcp_port(2019)
        .ok_or("2019 published")?;
    let http = inspection.published_tcp_port(80).ok_or("80 published")?;
    assert!(admin.host_port > 0 && http.host_port > 0);
    assert_ne!(admin.host_port, http.host_port);
    assert_eq!(inspection.published_tcp_port(443), None);
    let plain = spec(scope, "plain");
    let plain_id = runtime.create(&plain).await?;
    runtime.start(&plain_id).await?;
    assert_eq!(runtime.inspect(&plain_id).await?.published_ports, vec![]);
    runtime.remove(&plain_id).await?;
    runtime.remove(&id).await?;
    Ok(())
}
