//! The three ways a bench gets N deployments × M replicas running on the local engine, shared by
//! `benches/scale.rs` and `benches/mttp.rs`: the agent from one pushed commit (`through_agent`),
//! the same containers created and started through the API (`direct`, bollard at the agent's
//! create concurrency: the engine's own ceiling), and `docker run -d` of them at `xargs -P16`
//! (`docker_run`, its options translated from the API side's container so the sides cannot drift
//! apart). Each side removes what it made.

// Each bench uses its part of these.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, EndpointSettings, HostConfig};
use bollard::query_parameters::CreateContainerOptionsBuilder;
use voodu_agent::model::{Kind, ResourceKey};

use crate::support::{self, AgentProcess, Repo, Result, cpu_time, memory_kib, ms, replica_body};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) deployments: usize,
    pub(crate) replicas: usize,
    pub(crate) concurrency: usize,
    /// The agent's `--create-concurrency`: creates in flight at once, every key's pass
    /// drawing on them; the API side runs as many at a time.
    pub(crate) creates: usize,
    pub(crate) idle_window: Duration,
    /// The longest a side waits for a quiet machine before it starts.
    pub(crate) settle: Duration,
    /// Rounds of the sides, each round in another order.
    pub(crate) rounds: usize,
}

impl Shape {
    pub(crate) fn containers(&self) -> usize {
        self.deployments * self.replicas
    }
}

/// One way of getting the containers running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Created and started through the API (bollard), `Shape::parallelism` at a time.
    Api,
    /// `docker run -d` once per container, as a script would (`xargs -P16`).
    Cli,
    /// The agent, from one commit.
    Agent,
}

/// `docker run` processes at once on the CLI side: issue 29's `xargs -P16`.
pub(crate) const CLI_PARALLELISM: usize = 16;

pub(crate) fn docker_cli_present() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("docker").is_file()))
}

/// A script's way: `docker run -d` once per container, `CLI_PARALLELISM` processes at a time,
/// each with the options of the API side's container (`docker_run_args`), timed until the
/// engine lists them all running.
pub(crate) async fn docker_run(docker: &Docker, image: &str, shape: &Shape) -> Result<Duration> {
    let scope = support::unique("scalec");
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(CLI_PARALLELISM));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for deployment in 0..shape.deployments {
        for index in 0..shape.replicas {
            let name = format!("d{deployment:04}");
            let args = docker_run_args(
                &format!("{scope}-{name}.{index:04x}"),
                replica_body(image, &scope, &name, index),
            )?;
            let semaphore = semaphore.clone();
            tasks.spawn(async move {
                let _permit = semaphore.acquire_owned().await?;
                let output = tokio::process::Command::new("docker")
                    .args(&args)
                    .stdout(std::process::Stdio::null())
                    .output()
                    .await?;
                if !output.status.success() {
                    return Err(format!(
                        "docker run: {}",
                        String::from_utf8_lossy(&output.stderr).trim()
                    )
                    .into());
                }
                Result::Ok(())
            });
        }
    }
    until_running(docker, &scope, shape, started, tasks).await
}

/// `docker run -d` arguments for the container `body` describes, option by option, so the CLI
/// side creates what the API side creates; a field of `body` this does not translate is an
/// error rather than a difference between the sides.
pub(crate) fn docker_run_args(name: &str, mut body: ContainerCreateBody) -> Result<Vec<String>> {
    let mut args = vec![
        "run".to_owned(),
        "-d".to_owned(),
        "--name".to_owned(),
        name.to_owned(),
    ];
    let mut push = |flag: &str, value: String| {
        args.push(flag.to_owned());
        args.push(value);
    };
    let mut labels: Vec<_> = body.labels.take().unwrap_or_default().into_iter().collect();
    labels.sort();
    for (label, value) in labels {
        push("--label", format!("{label}={value}"));
    }
    for variable in body.env.take().unwrap_or_default() {
        push("-e", variable);
    }
    let mut host = body.host_config.take().unwrap_or_default();
    if let Some(policy) = host.restart_policy.take().and_then(|policy| policy.name) {
        push("--restart", policy.to_string());
    }
    for extra in host.extra_hosts.take().unwrap_or_default() {
        push("--add-host", extra);
    }
    if let Some(network) = host.network_mode.take() {
        push("--network", network);
    }
    for ulimit in host.ulimits.take().unwrap_or_default() {
        let (Some(name), Some(soft), Some(hard)) = (ulimit.name, ulimit.soft, ulimit.hard) else {
            return Err("a ulimit without its name or values".into());
        };
        push("--ulimit", format!("{name}={soft}:{hard}"));
    }
    if let Some(log) = host.log_config.take() {
        if let Some(driver) = log.typ {
            push("--log-driver", driver);
        }
        let mut options: Vec<_> = log.config.unwrap_or_default().into_iter().collect();
        options.sort();
        for (option, value) in options {
            push("--log-opt", format!("{option}={value}"));
        }
    }
    let endpoints = body
        .networking_config
        .take()
        .and_then(|config| config.endpoints_config)
        .unwrap_or_default();
    for (network, mut endpoint) in endpoints {
        for alias in endpoint.aliases.take().unwrap_or_default() {
            push("--network-alias", alias);
        }
        if endpoint != EndpointSettings::default() {
            return Err(format!("endpoint {network}: {endpoint:?} not translated").into());
        }
    }
    if host.init.take() == Some(true) {
        args.push("--init".to_owned());
    }
    let image = body.image.take().ok_or("no image")?;
    let command = body.cmd.take().unwrap_or_default();
    if host != HostConfig::default() || body != ContainerCreateBody::default() {
        return Err(format!("not translated to `docker run`: {host:?} {body:?}").into());
    }
    args.push(image);
    args.extend(command);
    Ok(args)
}

/// The CPU time the engine's daemons (`dockerd`, `containerd`) have used so far (zero
/// where `/proc` shows neither).
pub(crate) fn engine_cpu() -> Duration {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| matches!(comm.trim_end(), "dockerd" | "containerd"))
        })
        .filter_map(|pid| cpu_time(pid).ok())
        .sum()
}

/// The floor: every container created and started through the API, `parallelism` at a time,
/// timed until the engine lists them all running.
pub(crate) async fn direct(docker: &Docker, image: &str, shape: &Shape) -> Result<Duration> {
    let scope = support::unique("scaleb");
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(shape.creates));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for deployment in 0..shape.deployments {
        for index in 0..shape.replicas {
            let (docker, semaphore, scope, image) = (
                docker.clone(),
                semaphore.clone(),
                scope.clone(),
                image.to_owned(),
            );
            tasks.spawn(async move {
                let _permit = semaphore.acquire_owned().await?;
                let name = format!("d{deployment:04}");
                let body = replica_body(&image, &scope, &name, index);
                let options = CreateContainerOptionsBuilder::default()
                    .name(&format!("{scope}-{name}.{index:04x}"))
                    .build();
                let created = docker.create_container(Some(options), body).await?;
                docker.start_container(&created.id, None).await?;
                Result::Ok(())
            });
        }
    }
    until_running(docker, &scope, shape, started, tasks).await
}

/// The end of a baseline side: every task that creates and starts `scope`'s containers has
/// ended, then the engine lists them all running; how long since `started`. The scope's
/// containers are removed either way.
pub(crate) async fn until_running(
    docker: &Docker,
    scope: &str,
    shape: &Shape,
    started: Instant,
    mut tasks: tokio::task::JoinSet<Result>,
) -> Result<Duration> {
    let mut failure = None;
    while let Some(joined) = tasks.join_next().await {
        if let Err(error) = joined.map_err(Into::into).and_then(|result| result) {
            failure.get_or_insert(error);
        }
    }
    let result = match failure {
        Some(error) => Err(error),
        None => {
            support::wait_running(
                docker,
                scope,
                shape.containers(),
                started,
                Duration::from_secs(1800),
            )
            .await
        }
    };
    support::remove_scope(docker, scope).await?;
    result
}

pub(crate) struct AgentFigures {
    pub(crate) running: Duration,
    pub(crate) ready: Duration,
    pub(crate) rss_idle: u64,
    pub(crate) rss_loaded: u64,
    pub(crate) windows: Option<Windows>,
    /// With `Setup::probe`: the latencies measured on the converged host.
    pub(crate) latencies: Option<Latencies>,
}

/// Issue 54's two latencies, on the host the agent converged, each to the agent's own create
/// call (its `creating a container` log line, timestamped when the call is made):
/// - **change**: one deployment's file changed and pushed → the first create of its new
///   replicas, from the moment the bench sends the webhook;
/// - **drift**: one replica removed behind the agent's back (`docker rm -f`) → the create
///   of its replacement, from the engine's `destroy` event.
#[derive(Debug, Default)]
pub(crate) struct Latencies {
    pub(crate) change: Vec<Duration>,
    pub(crate) drift: Vec<Duration>,
}

/// The agent's CPU over the idle window, and per resync.
pub(crate) struct Windows {
    pub(crate) idle_cpu: Duration,
    pub(crate) resync_cpu: Duration,
    pub(crate) n_resyncs: u32,
}

/// What an agent side adds to the plain bench: another binary, flags, files in the repo's
/// first commit.
#[derive(Debug, Default)]
pub(crate) struct Setup {
    pub(crate) bin: Option<String>,
    pub(crate) args: Vec<String>,
    pub(crate) files: Vec<(String, String)>,
    /// Samples of each `Latencies` figure to take once the agent converged (none: 0).
    pub(crate) probe: usize,
}

/// The agent's path: an agent synced on a repo without manifests gets a commit declaring the
/// N deployments and a webhook; then, with `windows`, idle and resync figures over the
/// converged host.
pub(crate) async fn through_agent(
    docker: &Docker,
    image: &str,
    shape: &Shape,
    windows: bool,
    setup: &Setup,
) -> Result<AgentFigures> {
    let dir = tempfile::tempdir()?;
    let scope = support::unique("scalea");
    let result = agent_run(dir.path(), docker, image, shape, &scope, windows, setup).await;
    support::remove_scope(docker, &scope).await?;
    if result.is_err() {
        eprintln!(
            "agent log:\n{}",
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
        );
    }
    result
}

pub(crate) async fn agent_run(
    dir: &std::path::Path,
    docker: &Docker,
    image: &str,
    shape: &Shape,
    scope: &str,
    windows: bool,
    setup: &Setup,
) -> Result<AgentFigures> {
    let repo = Repo::new(dir)?;
    repo.write("README.md", "scale bench\n")?;
    for (path, text) in &setup.files {
        repo.write(path, text)?;
    }
    let initial = repo.commit("initial")?;
    let data_dir = dir.join("data");
    let log = dir.join("agent.log");
    let concurrency = shape.concurrency.to_string();
    let creates = shape.creates.to_string();
    // The create log lines `Latencies` reads, in JSON with their timestamps.
    let log_filter = if setup.probe > 0 {
        "warn,voodu_agent::runtime::docker=debug"
    } else {
        "warn"
    };
    let args = |resync: &'static str| {
        let mut args = vec![
            "--interval",
            "1h",
            "--no-watch",
            "--no-ingress",
            "--listen",
            "127.0.0.1:0",
            "--log",
            log_filter,
            "--resync",
            resync,
            "--concurrency",
            concurrency.as_str(),
            "--create-concurrency",
            creates.as_str(),
        ];
        if setup.probe > 0 {
            args.extend(["--log-format", "json"]);
        }
        args.extend(setup.args.iter().map(String::as_str));
        args
    };
    let bin = setup.bin.clone().unwrap_or_else(support::agent);
    let mut agent = AgentProcess::start_bin(&bin, &repo, &data_dir, &log, &args("1h"))?;
    let address = agent
        .synced(&initial)
        .await?
        .ok_or("the agent does not say where it listens")?;
    tokio::time::sleep(support::figure_wait(Duration::from_secs(3))).await;
    let rss_idle = memory_kib(agent.pid(), "VmRSS")?;
    println!(
        "agent idle, before the commit: {}",
        support::memory_line(agent.pid())?
    );

    let mut keys = Vec::new();
    for deployment in 0..shape.deployments {
        let name = format!("d{deployment:04}");
        repo.write(
            &format!("apps/{name}.hcl"),
            &deployment_file(scope, &name, image, shape.replicas, 3600),
        )?;
        keys.push(ResourceKey::new(Kind::Deployment, scope, &name));
    }
    let sha = repo.commit("scale: every deployment")?;
    // The baseline's 500 removals ran just before: time the agent on a quiet machine too.
    let settled = support::settle(shape.settle).await?;
    println!("machine quiet after {:.1} s", settled.as_secs_f64());
    let started = Instant::now();
    let body = format!(r#"{{"ref":"refs/heads/main","after":"{sha}"}}"#);
    let hook_address = address.clone();
    let webhook =
        tokio::task::spawn_blocking(move || support::post(&hook_address, "/hooks/git", &body));
    let running = support::wait_running(
        docker,
        scope,
        shape.containers(),
        started,
        Duration::from_secs(1800),
    )
    .await?;
    let (status, answer, _) = webhook.await??;
    if !(200..300).contains(&status) {
        return Err(format!("webhook answered {status}: {answer}").into());
    }
    let ready = agent
        .ready(&keys, started, Duration::from_secs(1800))
        .await?;

    // Idle with everything converged: let the last passes and probes settle first.
    tokio::time::sleep(support::figure_wait(Duration::from_secs(5))).await;
    let rss_loaded = memory_kib(agent.pid(), "VmRSS")?;
    println!(
        "agent idle with {} containers: {}",
        shape.containers(),
        support::memory_line(agent.pid())?
    );
    println!(
        "agent: {} running after {:.1} s, Ready after {:.1} s",
        shape.containers(),
        running.as_secs_f64(),
        ready.as_secs_f64()
    );
    let latencies = if setup.probe > 0 {
        let mut probe = Probe {
            docker,
            repo: &repo,
            address: &address,
            log: &log,
            scope,
            image,
            replicas: shape.replicas,
        };
        let mut latencies = Latencies::default();
        for sample in 0..setup.probe.min(shape.deployments) {
            latencies.change.push(probe.change(sample).await?);
        }
        for sample in 0..setup.probe.min(shape.deployments) {
            latencies
                .drift
                .push(probe.drift(shape.deployments - 1 - sample).await?);
        }
        Some(latencies)
    } else {
        None
    };
    if !windows {
        agent.stop();
        return Ok(AgentFigures {
            running,
            ready,
            rss_idle,
            rss_loaded,
            windows: None,
            latencies,
        });
    }
    let before = cpu_time(agent.pid())?;
    tokio::time::sleep(shape.idle_window).await;
    let idle_cpu = cpu_time(agent.pid())?.saturating_sub(before);
    agent.stop();

    // The same host under an agent that resyncs every 2 s: its CPU over the same window, less
    // the idle figure, spread over the resyncs the window held.
    let mut agent = AgentProcess::start_bin(&bin, &repo, &data_dir, &log, &args("2s"))?;
    agent.synced(&sha).await?;
    agent
        .ready(&keys, Instant::now(), Duration::from_secs(600))
        .await?;
    // Boot replay visits every key once: wait it out so the window holds resyncs only.
    tokio::time::sleep(support::figure_wait(Duration::from_secs(10))).await;
    let before = cpu_time(agent.pid())?;
    tokio::time::sleep(shape.idle_window).await;
    let resync_window = cpu_time(agent.pid())?.saturating_sub(before);
    agent.stop();
    let n_resyncs = (shape.idle_window.as_secs_f64() / 2.0).floor().max(1.0) as u32;
    let resync_cpu = resync_window.saturating_sub(idle_cpu) / n_resyncs;
    println!(
        "agent CPU over {:.0} s: {:.0} ms idle, {:.0} ms resyncing every 2 s",
        shape.idle_window.as_secs_f64(),
        ms(idle_cpu),
        ms(resync_window)
    );
    Ok(AgentFigures {
        running,
        ready,
        rss_idle,
        rss_loaded,
        windows: Some(Windows {
            idle_cpu,
            resync_cpu,
            n_resyncs,
        }),
        latencies,
    })
}

/// The deployment file the agent side writes for `name`; `sleep` changes its spec.
fn deployment_file(scope: &str, name: &str, image: &str, replicas: usize, sleep: u32) -> String {
    format!(
        "deployment \"{scope}\" \"{name}\" {{\n  image    = \"{image}\"\n  command  = [\"sleep\", \"{sleep}\"]\n  replicas = {replicas}\n}}\n"
    )
}

/// What `Latencies` needs of a converged agent side.
struct Probe<'a> {
    docker: &'a Docker,
    repo: &'a Repo,
    address: &'a str,
    log: &'a std::path::Path,
    scope: &'a str,
    image: &'a str,
    replicas: usize,
}

impl Probe<'_> {
    /// Deployment `index`'s file changed and pushed: from the webhook's send to the agent's
    /// first create for it; then waits until the rollout has replaced its replicas.
    async fn change(&mut self, index: usize) -> Result<Duration> {
        let name = format!("d{index:04}");
        self.repo.write(
            &format!("apps/{name}.hcl"),
            &deployment_file(self.scope, &name, self.image, self.replicas, 3601),
        )?;
        let sha = self.repo.commit(&format!("change {name}"))?;
        let sent = std::time::SystemTime::now();
        let body = format!(r#"{{"ref":"refs/heads/main","after":"{sha}"}}"#);
        let address = self.address.to_owned();
        let (status, answer, _) =
            tokio::task::spawn_blocking(move || support::post(&address, "/hooks/git", &body))
                .await??;
        if !(200..300).contains(&status) {
            return Err(format!("webhook answered {status}: {answer}").into());
        }
        let created = self.create_logged(&name, sent).await?;
        // The rollout goes on: its old replicas leave before the next sample.
        self.replaced(&name, "3601").await?;
        Ok(created.duration_since(sent)?)
    }

    /// One replica of deployment `index` removed by force: from the engine's `destroy`
    /// event to the agent's create of its replacement; then waits until it runs.
    async fn drift(&mut self, index: usize) -> Result<Duration> {
        use futures_util::StreamExt as _;
        let name = format!("d{index:04}");
        let victim = self
            .containers(&name, false)
            .await?
            .into_iter()
            .find_map(|container| container.id)
            .ok_or_else(|| format!("no running replica of {name}"))?;
        let events = std::collections::HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            ("event".to_owned(), vec!["destroy".to_owned()]),
            ("container".to_owned(), vec![victim.clone()]),
        ]);
        // From a second before the removal: the stream's request goes out when it is first
        // polled, after the removal.
        let since = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?
            - Duration::from_secs(1))
        .as_secs()
        .to_string();
        let mut stream = self.docker.events(Some(
            bollard::query_parameters::EventsOptionsBuilder::default()
                .since(&since)
                .filters(&events)
                .build(),
        ));
        let remove = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
            .force(true)
            .build();
        self.docker.remove_container(&victim, Some(remove)).await?;
        let event = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .map_err(|_| "no destroy event")?
            .ok_or("the engine ended its event stream")??;
        let nanos = event.time_nano.ok_or("a destroy event without its time")?;
        let destroyed = std::time::UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos)?);
        let created = self.create_logged(&name, destroyed).await?;
        self.replaced(&name, "").await?;
        Ok(created.duration_since(destroyed)?)
    }

    /// The containers of deployment `name` (stopped ones too with `all`).
    async fn containers(
        &self,
        name: &str,
        all: bool,
    ) -> Result<Vec<bollard::models::ContainerSummary>> {
        let filters = std::collections::HashMap::from([(
            "label".to_owned(),
            vec![
                format!("voodu.scope={}", self.scope),
                format!("voodu.name={name}"),
            ],
        )]);
        let options = bollard::query_parameters::ListContainersOptionsBuilder::default()
            .all(all)
            .filters(&filters)
            .build();
        Ok(self.docker.list_containers(Some(options)).await?)
    }

    /// When the agent logged its first create of a `name` replica at or after `since`.
    async fn create_logged(
        &self,
        name: &str,
        since: std::time::SystemTime,
    ) -> Result<std::time::SystemTime> {
        let prefix = format!("{}-{name}.", self.scope);
        let started = Instant::now();
        loop {
            let log = std::fs::read_to_string(self.log)?;
            let found = log
                .lines()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .filter(|line| line["message"] == "creating a container")
                .filter(|line| {
                    line["container"]
                        .as_str()
                        .is_some_and(|name| name.starts_with(&prefix))
                })
                .filter_map(|line| humantime::parse_rfc3339(line["timestamp"].as_str()?).ok())
                .find(|at| *at >= since);
            if let Some(at) = found {
                return Ok(at);
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(format!("the agent logged no create of {prefix}* in 60 s").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `name` runs exactly its replicas again, each with `sleep` in its command
    /// (any command: empty).
    async fn replaced(&self, name: &str, sleep: &str) -> Result {
        let started = Instant::now();
        loop {
            let containers = self.containers(name, true).await?;
            let done = containers.len() == self.replicas
                && containers.iter().all(|container| {
                    container.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
                        && container
                            .command
                            .as_deref()
                            .is_some_and(|command| command.contains(sleep))
                });
            if done {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(120) {
                return Err(format!("{name} was not replaced in 120 s").into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
