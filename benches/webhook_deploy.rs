//! Benchmark: a webhook with `?wait=true` → all 10 replicas of a new deployment running,
//! against creating and starting the same 10 containers with bollard directly.
//!
//! Each run, on the local Docker engine and the locally built test image:
//! - baseline: 10 × (create + start) with bollard, all at once, with the same name pattern,
//!   labels, env, network, init and restart policy the agent uses; timed from the first
//!   request until the engine lists 10 running containers;
//! - agent: the real `voodu-agent` binary (release build, already running and synced on a
//!   repo without the deployment) gets a pushed commit declaring 10 replicas, then
//!   `POST /hooks/git?wait=true` for it; timed from sending the webhook until the engine lists
//!   10 running replicas. Also printed: when the webhook answered (commit in desired state)
//!   and when `status` said Ready (after the agent's one start settle of 500 ms).
//!
//! Prints every run and the medians; the goal is agent / baseline ≤ 1.10 (issue 15). Run with
//! `cargo bench --bench webhook_deploy` (`VOODU_BENCH_RUNS`, default 7). Without a Docker
//! engine it prints SKIPPED and exits 0. Timings are printed, never asserted. Under
//! `cargo test --all-targets` (no `--bench` argument) it runs once as a smoke test of the
//! bench itself, and says its figures are not a measurement.

mod support;

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::CreateContainerOptionsBuilder;
use futures_util::future::join_all;

use support::{AgentProcess, Repo, Result, median, ms, replica_body};
use voodu_agent::model::{Kind, ResourceKey};

const REPLICAS: usize = 10;
/// How long a run may take before the bench gives up.
const LIMIT: Duration = Duration::from_secs(120);

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

async fn bench() -> Result {
    let measuring = support::measuring();
    if !support::engine_allowed("webhook_deploy") {
        return Ok(());
    }
    let docker = match support::connect().await {
        Ok(docker) => docker,
        Err(error) => {
            println!(
                "SKIPPED webhook_deploy: no Docker engine ({error}); run scripts/docker-setup"
            );
            return Ok(());
        }
    };
    let image =
        std::env::var("VOODU_TEST_IMAGE").unwrap_or_else(|_| "voodu-busybox:latest".to_owned());
    let runs: usize = if measuring {
        std::env::var("VOODU_BENCH_RUNS")
            .ok()
            .and_then(|runs| runs.parse().ok())
            .unwrap_or(7)
    } else {
        println!(
            "webhook_deploy: smoke run under `cargo test` (not a measurement; use `cargo bench`)"
        );
        1
    };
    support::ensure_network(&docker).await?;
    println!(
        "webhook_deploy: {REPLICAS} replicas of {image}, {runs} runs{}",
        if measuring { " (+1 warm-up)" } else { "" }
    );
    let mut baseline = Vec::new();
    let mut to_running = Vec::new();
    let mut to_answer = Vec::new();
    let mut to_ready = Vec::new();
    // A warm-up run first when measuring: the first containers of a fresh engine are slower.
    for run in usize::from(!measuring)..=runs {
        let direct = bollard_direct(&docker, &image).await?;
        let agent = through_agent(&docker, &image).await?;
        if run == 0 {
            println!(
                "warm-up: bollard {:.0} ms, agent {:.0} ms",
                ms(direct),
                ms(agent.running)
            );
            continue;
        }
        println!(
            "run {run}: bollard direct {:>6.0} ms | agent: webhook answered {:>5.0} ms, 10 running {:>6.0} ms, status Ready {:>6.0} ms",
            ms(direct),
            ms(agent.answered),
            ms(agent.running),
            ms(agent.ready)
        );
        baseline.push(direct);
        to_running.push(agent.running);
        to_answer.push(agent.answered);
        to_ready.push(agent.ready);
    }
    let (baseline, running) = (median(&mut baseline), median(&mut to_running));
    println!(
        "median bollard direct (create+start x{REPLICAS}, concurrent): {:.0} ms",
        ms(baseline)
    );
    println!(
        "median webhook ?wait=true answered (commit in desired state): {:.0} ms",
        ms(median(&mut to_answer))
    );
    println!(
        "median webhook → {REPLICAS} replicas running: {:.0} ms",
        ms(running)
    );
    println!(
        "median webhook → status Ready (incl. 500 ms start settle): {:.0} ms",
        ms(median(&mut to_ready))
    );
    println!();
    println!("| figure | measured | goal |");
    println!("|---|---|---|");
    println!(
        "| webhook → {REPLICAS} replicas running / bollard direct (median of {}) | {:.0} ms / {:.0} ms = {:.3} | ≤ 1.10 |",
        to_running.len(),
        ms(running),
        ms(baseline),
        running.as_secs_f64() / baseline.as_secs_f64()
    );
    Ok(())
}

/// The baseline: 10 containers as the agent would make them, created and started at once.
async fn bollard_direct(docker: &Docker, image: &str) -> Result<Duration> {
    let scope = support::unique("benchb");
    let started = Instant::now();
    let creates = (0..REPLICAS).map(|index| {
        let scope = scope.clone();
        async move {
            let body = replica_body(image, &scope, "web", index);
            let options = CreateContainerOptionsBuilder::default()
                .name(&format!("{scope}-web.{index:04x}"))
                .build();
            let created = docker.create_container(Some(options), body).await?;
            docker.start_container(&created.id, None).await?;
            Ok::<_, bollard::errors::Error>(())
        }
    });
    let results = join_all(creates).await;
    let result = match results.into_iter().find(|result| result.is_err()) {
        Some(Err(error)) => Err(error.into()),
        _ => support::wait_running(docker, &scope, REPLICAS, started, LIMIT).await,
    };
    support::remove_scope(docker, &scope).await?;
    result
}

struct AgentTimes {
    answered: Duration,
    running: Duration,
    ready: Duration,
}

/// The agent's path: running agent, pushed commit, webhook with `?wait=true`.
async fn through_agent(docker: &Docker, image: &str) -> Result<AgentTimes> {
    let dir = tempfile::tempdir()?;
    let scope = support::unique("bencha");
    let repo = Repo::new(dir.path())?;
    repo.write("README.md", "bench\n")?;
    let initial = repo.commit("initial")?;
    let data_dir = dir.path().join("data");
    // Polling only hourly and not watching the repo: only the webhook triggers the sync.
    let mut agent = AgentProcess::start(
        &repo,
        &data_dir,
        &dir.path().join("agent.log"),
        &[
            "--interval",
            "1h",
            "--listen",
            "127.0.0.1:0",
            "--no-watch",
            "--log",
            "warn",
        ],
    )?;
    let result = async {
        let address = agent
            .synced(&initial)
            .await?
            .ok_or("the agent does not say where it listens")?;
        repo.write(
            "web.hcl",
            &format!(
                "deployment \"{scope}\" \"web\" {{\n  image    = \"{image}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = {REPLICAS}\n}}\n"
            ),
        )?;
        let sha = repo.commit("web: 10 replicas")?;
        let started = Instant::now();
        let body = format!(r#"{{"ref":"refs/heads/main","after":"{sha}"}}"#);
        let webhook = tokio::task::spawn_blocking(move || {
            support::post(&address, "/hooks/git?wait=true", &body)
        });
        let running_at = support::wait_running(docker, &scope, REPLICAS, started, LIMIT).await?;
        let (status, answer, arrived) = webhook.await??;
        if status != 200 {
            return Err(format!("webhook answered {status}: {answer}").into());
        }
        let answered = arrived.saturating_duration_since(started);
        let key = ResourceKey::new(Kind::Deployment, &scope, "web");
        let ready = agent.ready(&[key], started, LIMIT).await?;
        Ok(AgentTimes {
            answered,
            running: running_at,
            ready,
        })
    }
    .await;
    agent.stop();
    support::remove_scope(docker, &scope).await?;
    if result.is_err() {
        eprintln!(
            "agent log:\n{}",
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
        );
    }
    result
}
