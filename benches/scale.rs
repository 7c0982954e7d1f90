//! Benchmark: the agent at scale against the engine's own floor (issues 15 and 29).
//!
//! On the local Docker engine, with the locally built test image, one run prints:
//! - **to running**: N deployments × M replicas from one commit (real binary, release build,
//!   webhook-triggered) until the engine lists N×M running, against the same N×M containers
//!   (same labels, network, aliases, init, restart policy, ulimits and log options as the
//!   agent's) created and started directly through the API (bollard), P at a time, where P is
//!   the agent's own parallelism: its create slots (`--create-concurrency`, which every key's
//!   pass draws on); and
//!   against the same containers by `docker run -d`, 16 processes at a time (a script's
//!   `xargs -P16`; its options translated from the API side's container, so the two cannot
//!   drift apart; skipped, and said so, without a `docker` executable);
//! - **RSS**: the agent idle before the commit, and idle with the N×M containers;
//! - **idle CPU**: the agent's CPU time over a window (`VOODU_BENCH_IDLE_SECS`, 60) with
//!   nothing to do but its timers, with the periodic resync out of the window (`--resync 1h`);
//! - **resync**: the agent restarted on the same data dir with `--resync 2s`: its CPU over the
//!   same window, less the idle figure, per resync (every resync lists the engine's containers
//!   once and compares them with desired state).
//!
//! The three sides run in `VOODU_BENCH_ROUNDS` rounds (3), each round in another order, each
//! side on a quiet machine; the table gives medians over the rounds (the idle and resync
//! windows: the first round's) and the runs are printed above it.
//!
//! `cargo bench --bench scale` (N=`VOODU_BENCH_DEPLOYMENTS` 100, M=`VOODU_BENCH_REPLICAS` 5,
//! `VOODU_BENCH_CONCURRENCY` 8 keys, `VOODU_BENCH_CREATES` 16 create slots; `VOODU_AGENT_BIN`
//! runs another build of the agent, to compare two versions with the same bench). Figures are
//! printed, never asserted; everything it created is removed at the end. Each side also prints
//! the CPU the engine's daemons spent over it (`dockerd` and `containerd`, from `/proc`).
//! Under `cargo test --all-targets` it runs 3 × 2 once with a 2 s window
//! as a smoke test of the bench itself (with `VOODU_DOCKER_TESTS=1`). The engine-free half of
//! issue 15's table (the agent's own overhead on the fake runtime, engine calls per pass,
//! commit → plan) is `benches/overhead.rs` and `benches/plan.rs`.
//!
//! `VOODU_BENCH_EXACT_OFF=<agent binary>` runs issue 48's comparison instead (`scale/exact.rs`):
//! the same first deploy from an image in a local registry, with image resolution and
//! signature verification on (this agent) and off (that binary, e.g. the previous release
//! `scripts/previous-release` builds), alternated. The smoke run takes that path too, with
//! `VOODU_PREVIOUS_AGENT`.

mod support;

#[path = "scale/exact.rs"]
mod exact;

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, EndpointSettings, HostConfig};
use bollard::query_parameters::CreateContainerOptionsBuilder;
use support::{AgentProcess, Repo, Result, cpu_time, memory_kib, ms, replica_body};
use voodu_agent::model::{Kind, ResourceKey};

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    deployments: usize,
    replicas: usize,
    concurrency: usize,
    /// The agent's `--create-concurrency`: creates in flight at once, every key's pass
    /// drawing on them; the API side runs as many at a time.
    creates: usize,
    idle_window: Duration,
    /// Rounds of the sides, each round in another order.
    rounds: usize,
}

impl Shape {
    fn containers(&self) -> usize {
        self.deployments * self.replicas
    }
}

async fn bench() -> Result {
    if !support::engine_allowed("scale") {
        return Ok(());
    }
    let docker = match support::connect().await {
        Ok(docker) => docker,
        Err(error) => {
            println!("SKIPPED scale: no Docker engine ({error}); run scripts/docker-setup");
            return Ok(());
        }
    };
    let image =
        std::env::var("VOODU_TEST_IMAGE").unwrap_or_else(|_| "voodu-busybox:latest".to_owned());
    let shape = if support::measuring() {
        Shape {
            deployments: support::env_number("VOODU_BENCH_DEPLOYMENTS", 100.0)? as usize,
            replicas: support::env_number("VOODU_BENCH_REPLICAS", 5.0)? as usize,
            concurrency: support::env_number("VOODU_BENCH_CONCURRENCY", 8.0)? as usize,
            creates: support::env_number("VOODU_BENCH_CREATES", 16.0)? as usize,
            idle_window: Duration::from_secs_f64(support::env_number(
                "VOODU_BENCH_IDLE_SECS",
                60.0,
            )?),
            rounds: (support::env_number("VOODU_BENCH_ROUNDS", 3.0)? as usize).max(1),
        }
    } else {
        println!("scale: smoke run under `cargo test` (not a measurement; use `cargo bench`)");
        Shape {
            deployments: 3,
            replicas: 2,
            concurrency: 8,
            creates: 16,
            idle_window: Duration::from_secs(2),
            rounds: 1,
        }
    };
    support::ensure_network(&docker).await?;
    println!(
        "scale: {} deployments x {} replicas of {image} ({} containers), agent --concurrency {} --create-concurrency {}, API baseline {} at a time, {} rounds; {} bench, agent {}",
        shape.deployments,
        shape.replicas,
        shape.containers(),
        shape.concurrency,
        shape.creates,
        shape.creates,
        shape.rounds,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        support::agent()
    );

    // Issue 48's comparison, on its own when asked for: resolution and verification on / off.
    let exact_off = std::env::var("VOODU_BENCH_EXACT_OFF").ok();
    if support::measuring()
        && let Some(off) = &exact_off
    {
        return exact::compare(&docker, &image, &shape, off).await;
    }

    // The sides take turns, each round in another order (a side that always ran second
    // would always find the engine with the previous side's removals just behind it), and
    // every figure is the median over the rounds.
    let sides = [Side::Api, Side::Cli, Side::Agent];
    let cli = docker_cli_present();
    if !cli {
        println!("SKIPPED the `docker run` side: no `docker` executable on PATH");
    }
    let mut api = Vec::new();
    let mut cli_runs = Vec::new();
    let mut agents = Vec::new();
    for round in 0..shape.rounds {
        for side in (0..sides.len()).map(|i| sides[(i + round) % sides.len()]) {
            if side == Side::Cli && !cli {
                continue;
            }
            let settled = support::settle(Duration::from_secs(120)).await?;
            println!(
                "round {}, {side:?}: machine quiet after {:.1} s",
                round + 1,
                settled.as_secs_f64()
            );
            let engine_before = engine_cpu();
            match side {
                Side::Api => {
                    let took = direct(&docker, &image, &shape).await?;
                    println!(
                        "API direct, {} at a time: {} running after {:.1} s",
                        shape.creates,
                        shape.containers(),
                        took.as_secs_f64()
                    );
                    api.push(took);
                }
                Side::Cli => {
                    let took = docker_run(&docker, &image, &shape).await?;
                    println!(
                        "`docker run -d`, {CLI_PARALLELISM} processes at a time: {} running after {:.1} s",
                        shape.containers(),
                        took.as_secs_f64()
                    );
                    cli_runs.push(took);
                }
                Side::Agent => {
                    // The idle and resync windows once, in the first round.
                    agents.push(
                        through_agent(
                            &docker,
                            &image,
                            &shape,
                            agents.is_empty(),
                            &Setup::default(),
                        )
                        .await?,
                    );
                }
            }
            // What the side made the engine's daemons spend (its containers' own processes,
            // runc and the shims are not in it), from the start to the containers' removal.
            println!(
                "  dockerd + containerd CPU over the {side:?} side: {:.1} s",
                engine_cpu().saturating_sub(engine_before).as_secs_f64()
            );
        }
    }
    let runs = |values: &[Duration]| {
        values
            .iter()
            .map(|value| format!("{:.1}", value.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let agent_running: Vec<Duration> = agents.iter().map(|agent| agent.running).collect();
    println!();
    println!(
        "runs (s): agent {}; API direct {}; docker run {}",
        runs(&agent_running),
        runs(&api),
        runs(&cli_runs)
    );
    let running = support::median(&mut agent_running.clone());
    let ready = support::median(&mut agents.iter().map(|agent| agent.ready).collect::<Vec<_>>());
    let kib_median = |values: Vec<u64>| {
        let mut values = values;
        values.sort_unstable();
        values[values.len() / 2] as f64 / 1024.0
    };
    let rss_idle = kib_median(agents.iter().map(|agent| agent.rss_idle).collect());
    let rss_loaded = kib_median(agents.iter().map(|agent| agent.rss_loaded).collect());
    let windows = agents
        .iter()
        .find_map(|agent| agent.windows.as_ref())
        .ok_or("no agent round measured the idle and resync windows")?;
    let per_minute = |cpu: Duration| cpu.as_secs_f64() * 60.0 / shape.idle_window.as_secs_f64();
    println!(
        "| figure (medians of {} rounds, sides alternated) | measured | goal |",
        shape.rounds
    );
    println!("|---|---|---|");
    if !cli_runs.is_empty() {
        let cli_median = support::median(&mut cli_runs);
        println!(
            "| {} replicas ({} deployments) running, agent / `docker run -d` ×{} at -P{CLI_PARALLELISM} | {:.1} s / {:.1} s = {:.3} | ≤ 0.95 |",
            shape.containers(),
            shape.deployments,
            shape.containers(),
            running.as_secs_f64(),
            cli_median.as_secs_f64(),
            running.as_secs_f64() / cli_median.as_secs_f64()
        );
    }
    let baseline = support::median(&mut api);
    println!(
        "| the same, agent / API direct at parallelism {} | {:.1} s / {:.1} s = {:.3} | ≤ 1.05 |",
        shape.creates,
        running.as_secs_f64(),
        baseline.as_secs_f64(),
        running.as_secs_f64() / baseline.as_secs_f64()
    );
    println!(
        "| … and every resource Ready in status (incl. the 3 s ready settle) | {:.1} s | |",
        ready.as_secs_f64()
    );
    println!(
        "| idle RSS / with {} containers | {rss_idle:.1} MiB / {rss_loaded:.1} MiB | ≤ 16 MiB / ≤ 32 MiB |",
        shape.containers(),
    );
    println!(
        "| idle CPU with {} containers (no resync in the window; first round) | {:.0} ms per minute | flat |",
        shape.containers(),
        per_minute(windows.idle_cpu) * 1000.0
    );
    println!(
        "| resync over {} containers: agent CPU per resync ({} resyncs in the window; first round) | {:.1} ms | one list call, ≤ 20 ms |",
        shape.containers(),
        windows.n_resyncs,
        windows.resync_cpu.as_secs_f64() * 1000.0
    );
    if !support::measuring() {
        println!("(smoke run of the bench; these figures are not a measurement)");
        // The smoke run takes the comparison's path too, against the previous release
        // (scripts/test builds it).
        match exact_off.or_else(|| std::env::var("VOODU_PREVIOUS_AGENT").ok()) {
            Some(off) => exact::compare(&docker, &image, &shape, &off).await?,
            None => println!(
                "scale: the digest comparison's smoke run needs VOODU_BENCH_EXACT_OFF or VOODU_PREVIOUS_AGENT (scripts/test sets it)"
            ),
        }
    }
    Ok(())
}

/// One way of getting the containers running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Created and started through the API (bollard), `Shape::parallelism` at a time.
    Api,
    /// `docker run -d` once per container, as a script would (`xargs -P16`).
    Cli,
    /// The agent, from one commit.
    Agent,
}

/// `docker run` processes at once on the CLI side: issue 29's `xargs -P16`.
const CLI_PARALLELISM: usize = 16;

fn docker_cli_present() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("docker").is_file()))
}

/// A script's way: `docker run -d` once per container, `CLI_PARALLELISM` processes at a time,
/// each with the options of the API side's container (`docker_run_args`), timed until the
/// engine lists them all running.
async fn docker_run(docker: &Docker, image: &str, shape: &Shape) -> Result<Duration> {
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
fn docker_run_args(name: &str, mut body: ContainerCreateBody) -> Result<Vec<String>> {
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
fn engine_cpu() -> Duration {
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
async fn direct(docker: &Docker, image: &str, shape: &Shape) -> Result<Duration> {
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
async fn until_running(
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

struct AgentFigures {
    running: Duration,
    ready: Duration,
    rss_idle: u64,
    rss_loaded: u64,
    windows: Option<Windows>,
}

/// The agent's CPU over the idle window, and per resync.
struct Windows {
    idle_cpu: Duration,
    resync_cpu: Duration,
    n_resyncs: u32,
}

/// What an agent side adds to the plain bench: another binary, flags, files in the repo's
/// first commit.
#[derive(Debug, Default)]
struct Setup {
    bin: Option<String>,
    args: Vec<String>,
    files: Vec<(String, String)>,
}

/// The agent's path: an agent synced on a repo without manifests gets a commit declaring the
/// N deployments and a webhook; then, with `windows`, idle and resync figures over the
/// converged host.
async fn through_agent(
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

async fn agent_run(
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
    let args = |resync: &'static str| {
        let mut args = vec![
            "--interval",
            "1h",
            "--no-watch",
            "--no-ingress",
            "--listen",
            "127.0.0.1:0",
            "--log",
            "warn",
            "--resync",
            resync,
            "--concurrency",
            concurrency.as_str(),
            "--create-concurrency",
            creates.as_str(),
        ];
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
            &format!(
                "deployment \"{scope}\" \"{name}\" {{\n  image    = \"{image}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = {}\n}}\n",
                shape.replicas
            ),
        )?;
        keys.push(ResourceKey::new(Kind::Deployment, scope, &name));
    }
    let sha = repo.commit("scale: every deployment")?;
    // The baseline's 500 removals ran just before: time the agent on a quiet machine too.
    let settled = support::settle(Duration::from_secs(120)).await?;
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
    if !windows {
        agent.stop();
        return Ok(AgentFigures {
            running,
            ready,
            rss_idle,
            rss_loaded,
            windows: None,
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
    })
}
