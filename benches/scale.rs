//! Benchmark: the agent at scale against the engine's own floor (issue 15).
//!
//! On the local Docker engine, with the locally built test image, one run prints:
//! - **to running**: N deployments × M replicas from one commit (real binary, release build,
//!   webhook-triggered) until the engine lists N×M running, against the same N×M containers
//!   (same labels, network, aliases, init, restart policy, ulimits and log options as the
//!   agent's) created and started directly through the API (bollard), P at a time, where P is
//!   the agent's own parallelism: `--concurrency` keys × min(M, 16) replicas of a key;
//! - **RSS**: the agent idle before the commit, and idle with the N×M containers;
//! - **idle CPU**: the agent's CPU time over a window (`VOODU_BENCH_IDLE_SECS`, 60) with
//!   nothing to do but its timers, with the periodic resync out of the window (`--resync 1h`);
//! - **resync**: the agent restarted on the same data dir with `--resync 2s`: its CPU over the
//!   same window, less the idle figure, per resync (every resync lists the engine's containers
//!   once and compares them with desired state).
//!
//! `cargo bench --bench scale` (N=`VOODU_BENCH_DEPLOYMENTS` 100, M=`VOODU_BENCH_REPLICAS` 5,
//! `VOODU_BENCH_CONCURRENCY` 4; `VOODU_AGENT_BIN` runs another build of the agent, to compare
//! two versions with the same bench). Figures are printed, never asserted; everything it created
//! is removed at the end. Under `cargo test --all-targets` it runs 3 × 2 with a 2 s window as
//! a smoke test of the bench itself (with `VOODU_DOCKER_TESTS=1`). The engine-free half of
//! issue 15's table (the agent's own overhead on the fake runtime, engine calls per pass,
//! commit → plan) is `benches/overhead.rs` and `benches/plan.rs`.

mod support;

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::CreateContainerOptionsBuilder;
use support::{AgentProcess, Repo, Result, cpu_time, memory_kib, ms, replica_body};
use voodu_agent::model::{Kind, ResourceKey};

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

struct Shape {
    deployments: usize,
    replicas: usize,
    concurrency: usize,
    idle_window: Duration,
}

impl Shape {
    fn containers(&self) -> usize {
        self.deployments * self.replicas
    }

    /// Creates in flight at once in the agent: keys in parallel × replicas of a key at once.
    fn parallelism(&self) -> usize {
        self.concurrency * self.replicas.min(16)
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
            concurrency: support::env_number("VOODU_BENCH_CONCURRENCY", 4.0)? as usize,
            idle_window: Duration::from_secs_f64(support::env_number(
                "VOODU_BENCH_IDLE_SECS",
                60.0,
            )?),
        }
    } else {
        println!("scale: smoke run under `cargo test` (not a measurement; use `cargo bench`)");
        Shape {
            deployments: 3,
            replicas: 2,
            concurrency: 4,
            idle_window: Duration::from_secs(2),
        }
    };
    support::ensure_network(&docker).await?;
    println!(
        "scale: {} deployments x {} replicas of {image} ({} containers), agent --concurrency {}, API baseline {} at a time; {} binary",
        shape.deployments,
        shape.replicas,
        shape.containers(),
        shape.concurrency,
        shape.parallelism(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );

    let settled = support::settle(Duration::from_secs(120)).await?;
    println!("machine quiet after {:.1} s", settled.as_secs_f64());
    let baseline = direct(&docker, &image, &shape).await?;
    println!(
        "API direct: {} running after {:.1} s",
        shape.containers(),
        baseline.as_secs_f64()
    );
    let agent = through_agent(&docker, &image, &shape).await?;
    let per_minute = |cpu: Duration| cpu.as_secs_f64() * 60.0 / shape.idle_window.as_secs_f64();
    println!();
    println!("| figure | measured | goal |");
    println!("|---|---|---|");
    println!(
        "| {} replicas ({} deployments) running, agent / API direct at parallelism {} | {:.1} s / {:.1} s = {:.3} | ≤ 1.05 |",
        shape.containers(),
        shape.deployments,
        shape.parallelism(),
        agent.running.as_secs_f64(),
        baseline.as_secs_f64(),
        agent.running.as_secs_f64() / baseline.as_secs_f64()
    );
    println!(
        "| … and every resource Ready in status (incl. the 3 s ready settle) | {:.1} s | |",
        agent.ready.as_secs_f64()
    );
    println!(
        "| idle RSS / with {} containers | {:.1} MiB / {:.1} MiB | ≤ 16 MiB / ≤ 32 MiB |",
        shape.containers(),
        agent.rss_idle as f64 / 1024.0,
        agent.rss_loaded as f64 / 1024.0
    );
    println!(
        "| idle CPU with {} containers (no resync in the window) | {:.0} ms per minute | flat |",
        shape.containers(),
        per_minute(agent.idle_cpu) * 1000.0
    );
    println!(
        "| resync over {} containers: agent CPU per resync ({} resyncs in the window) | {:.1} ms | one list call, ≤ 20 ms |",
        shape.containers(),
        agent.n_resyncs,
        agent.resync_cpu.as_secs_f64() * 1000.0
    );
    if !support::measuring() {
        println!("(smoke run of the bench; these figures are not a measurement)");
    }
    Ok(())
}

/// The floor: every container created and started through the API, `parallelism` at a time,
/// timed until the engine lists them all running.
async fn direct(docker: &Docker, image: &str, shape: &Shape) -> Result<Duration> {
    let scope = support::unique("scaleb");
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(shape.parallelism()));
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
                &scope,
                shape.containers(),
                started,
                Duration::from_secs(1800),
            )
            .await
        }
    };
    support::remove_scope(docker, &scope).await?;
    result
}

struct AgentFigures {
    running: Duration,
    ready: Duration,
    rss_idle: u64,
    rss_loaded: u64,
    idle_cpu: Duration,
    resync_cpu: Duration,
    n_resyncs: u32,
}

/// The agent's path: an agent synced on a repo without manifests gets a commit declaring the
/// N deployments and a webhook; then idle and resync figures over the converged host.
async fn through_agent(docker: &Docker, image: &str, shape: &Shape) -> Result<AgentFigures> {
    let dir = tempfile::tempdir()?;
    let scope = support::unique("scalea");
    let result = agent_run(dir.path(), docker, image, shape, &scope).await;
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
) -> Result<AgentFigures> {
    let repo = Repo::new(dir)?;
    repo.write("README.md", "scale bench\n")?;
    let initial = repo.commit("initial")?;
    let data_dir = dir.join("data");
    let log = dir.join("agent.log");
    let concurrency = shape.concurrency.to_string();
    let args = |resync: &'static str| {
        vec![
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
        ]
    };
    let mut agent = AgentProcess::start(&repo, &data_dir, &log, &args("1h"))?;
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
    let before = cpu_time(agent.pid())?;
    tokio::time::sleep(shape.idle_window).await;
    let idle_cpu = cpu_time(agent.pid())?.saturating_sub(before);
    agent.stop();

    // The same host under an agent that resyncs every 2 s: its CPU over the same window, less
    // the idle figure, spread over the resyncs the window held.
    let mut agent = AgentProcess::start(&repo, &data_dir, &log, &args("2s"))?;
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
        "agent: {} running after {:.1} s, Ready after {:.1} s; CPU over {:.0} s: {:.0} ms idle, {:.0} ms resyncing every 2 s",
        shape.containers(),
        running.as_secs_f64(),
        ready.as_secs_f64(),
        shape.idle_window.as_secs_f64(),
        ms(idle_cpu),
        ms(resync_window)
    );
    Ok(AgentFigures {
        running,
        ready,
        rss_idle,
        rss_loaded,
        idle_cpu,
        resync_cpu,
        n_resyncs,
    })
}
