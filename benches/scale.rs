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
#[path = "scale/sides.rs"]
mod sides;

use std::time::Duration;

use sides::{
    CLI_PARALLELISM, Setup, Shape, Side, direct, docker_cli_present, docker_run, engine_cpu,
    through_agent,
};
use support::Result;

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
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
            settle: Duration::from_secs(120),
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
            settle: Duration::from_secs(120),
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
            let settled = support::settle(shape.settle).await?;
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
