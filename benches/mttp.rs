//! Benchmark: mean time to production in Flux's shape (issue 54): from a push to every object
//! Ready, for 100, 500 and 1,000 deployments of one replica and 100 deployments of ten, on the
//! local Docker engine with the locally built test image.
//!
//! For each size, in `VOODU_BENCH_ROUNDS` rounds (3), each round in another order, on a quiet
//! machine (`scale/sides.rs` holds the three sides):
//! - **agent**: the real binary (release build, `--no-ingress`, `--concurrency 8`,
//!   `--create-concurrency 16`) synced on a repository without manifests gets one commit
//!   declaring every deployment, one file each, and its webhook; timed until the engine lists
//!   every replica running, and until `status` says every deployment Ready (a replica without
//!   a readiness probe is Ready once it ran `--ready-settle`, 3 s, without restarting);
//! - **`docker run -d`** of the same containers (the same labels, network, aliases, init,
//!   restart policy, ulimits and log options), 16 processes at a time: a script's `xargs -P16`;
//! - **bollard direct**: the same containers created and started through the API, 16 at a
//!   time, the agent's create concurrency: the engine's own ceiling.
//!
//! Printed: every run, then one table of medians with the ratios, the agent's RSS idle before
//! the commit and with every container, and Flux's published figures beside them. The ratio to
//! `docker run` is given twice: both sides until running, and the agent's Ready against the
//! same containers running plus the same settle (the gate the agent holds itself to).
//!
//! At the largest single-replica size the first agent round also times, on the converged
//! host, `VOODU_BENCH_PROBE` (3) samples of: one deployment's file changed and pushed → the
//! agent's first create call for it, and one replica removed with `docker rm -f` → the create
//! call of its replacement (from the engine's `destroy` event); each from the agent's own
//! timestamped log line at the call.
//!
//! `cargo bench --bench mttp`; `VOODU_BENCH_SIZES` (`100x1,500x1,1000x1,100x10`) changes the
//! sizes, `VOODU_AGENT_BIN` runs another build of the agent, `VOODU_BENCH_SETTLE_SECS` (120)
//! bounds each side's wait for a quiet machine, `VOODU_BENCH_SIDES` (`agent,api,cli`) picks
//! the sides. Figures are printed, never
//! asserted; everything the bench created is removed. Without a Docker engine it prints
//! SKIPPED. Under `cargo test --all-targets` (with `VOODU_DOCKER_TESTS=1`) it runs 3 × 1 and
//! 2 × 2 once as a smoke test of the bench itself.

mod support;

#[path = "scale/sides.rs"]
mod sides;

use std::time::Duration;

use sides::{
    AgentFigures, CLI_PARALLELISM, Setup, Shape, Side, direct, docker_cli_present, docker_run,
    through_agent,
};
use support::Result;

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

/// The agent's default `--ready-settle`: a replica without a probe is Ready once it ran this
/// long.
const READY_SETTLE: Duration = Duration::from_secs(3);

/// Flux's published mean time to production for Kustomizations (fluxcd/flux-benchmark,
/// RESULTS.md: kustomize-controller with 2 CPUs and concurrency 20 on a 16-core runner, Kind
/// with 3 nodes; each app a Deployment scaled to zero, a service account, a service and an
/// ingress): objects, then Flux v2.6.0's time to all Ready and memory (the figures issue 54
/// quotes), then Flux v2.9.0's.
const FLUX: [(&str, &str, &str, &str, &str); 3] = [
    ("100", "28s", "32 MiB", "26s", "134 MiB"),
    ("500", "2m2s", "122 MiB", "2m0s", "183 MiB"),
    ("1,000", "4m16s", "175 MiB", "4m13s", "223 MiB"),
];

/// What one size's runs gave.
struct SizeRuns {
    shape: Shape,
    agents: Vec<AgentFigures>,
    api: Vec<Duration>,
    cli: Vec<Duration>,
}

async fn bench() -> Result {
    if !support::engine_allowed("mttp") {
        return Ok(());
    }
    let docker = match support::connect().await {
        Ok(docker) => docker,
        Err(error) => {
            println!("SKIPPED mttp: no Docker engine ({error}); run scripts/docker-setup");
            return Ok(());
        }
    };
    let image =
        std::env::var("VOODU_TEST_IMAGE").unwrap_or_else(|_| "voodu-busybox:latest".to_owned());
    let measuring = support::measuring();
    let sizes = if measuring {
        std::env::var("VOODU_BENCH_SIZES")
            .unwrap_or_else(|_| "100x1,500x1,1000x1,100x10".to_owned())
    } else {
        println!("mttp: smoke run under `cargo test` (not a measurement; use `cargo bench`)");
        "3x1,2x2".to_owned()
    };
    let rounds = if measuring {
        (support::env_number("VOODU_BENCH_ROUNDS", 3.0)? as usize).max(1)
    } else {
        1
    };
    // How long each side waits for a quiet machine (under 10 % busy) before it starts.
    // (The smoke run, beside the tests, never finds the machine quiet: it hardly waits.)
    let settle = Duration::from_secs_f64(support::env_number(
        "VOODU_BENCH_SETTLE_SECS",
        if measuring { 120.0 } else { 1.0 },
    )?);
    let probe = if measuring {
        support::env_number("VOODU_BENCH_PROBE", 3.0)? as usize
    } else {
        1
    };
    // The agent's `--concurrency` (resources reconciled at once).
    let concurrency = support::env_number("VOODU_BENCH_CONCURRENCY", 8.0)? as usize;
    let shapes = sizes
        .split(',')
        .map(|size| {
            let (deployments, replicas) = size.trim().split_once('x').ok_or_else(|| {
                format!("VOODU_BENCH_SIZES: {size:?} is not DEPLOYMENTSxREPLICAS")
            })?;
            Result::Ok(Shape {
                deployments: deployments.parse()?,
                replicas: replicas.parse()?,
                concurrency,
                creates: 16,
                idle_window: Duration::ZERO,
                rounds,
                settle,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // The latencies are taken at the largest single-replica size.
    let probed = shapes
        .iter()
        .enumerate()
        .filter(|(_, shape)| shape.replicas == 1)
        .max_by_key(|(_, shape)| shape.deployments)
        .map(|(at, _)| at);
    support::ensure_network(&docker).await?;
    // The sides to run (`VOODU_BENCH_SIDES`, all three by default).
    let wanted: Vec<String> = std::env::var("VOODU_BENCH_SIDES")
        .unwrap_or_else(|_| "agent,api,cli".to_owned())
        .split(',')
        .map(|side| side.trim().to_lowercase())
        .collect();
    let cli = docker_cli_present();
    if !cli {
        println!("SKIPPED the `docker run` side: no `docker` executable on PATH");
    }
    println!(
        "mttp: sizes {sizes} of {image}, {rounds} rounds per side alternated; agent --concurrency {concurrency} --create-concurrency 16 --no-ingress; {} bench, agent {}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        support::agent()
    );

    let mut results = Vec::new();
    for (at, shape) in shapes.into_iter().enumerate() {
        let mut runs = SizeRuns {
            shape,
            agents: Vec::new(),
            api: Vec::new(),
            cli: Vec::new(),
        };
        let sides: Vec<Side> = [Side::Agent, Side::Api, Side::Cli]
            .into_iter()
            .filter(|side| wanted.contains(&format!("{side:?}").to_lowercase()))
            .collect();
        for round in 0..rounds {
            for side in (0..sides.len()).map(|i| sides[(i + round) % sides.len()]) {
                if side == Side::Cli && !cli {
                    continue;
                }
                let settled = support::settle(shape.settle).await?;
                let label = format!(
                    "{} x {}, round {}, {side:?}",
                    shape.deployments,
                    shape.replicas,
                    round + 1
                );
                match side {
                    Side::Agent => {
                        let setup = Setup {
                            probe: if Some(at) == probed && runs.agents.is_empty() {
                                probe
                            } else {
                                0
                            },
                            ..Setup::default()
                        };
                        let figures = through_agent(&docker, &image, &shape, false, &setup).await?;
                        println!(
                            "{label} (quiet after {:.1} s): running {:.1} s, Ready {:.1} s, RSS {:.1} MiB idle / {:.1} MiB with {} containers",
                            settled.as_secs_f64(),
                            figures.running.as_secs_f64(),
                            figures.ready.as_secs_f64(),
                            figures.rss_idle as f64 / 1024.0,
                            figures.rss_loaded as f64 / 1024.0,
                            shape.containers()
                        );
                        runs.agents.push(figures);
                    }
                    Side::Api => {
                        let took = direct(&docker, &image, &shape).await?;
                        println!(
                            "{label} (quiet after {:.1} s): running {:.1} s",
                            settled.as_secs_f64(),
                            took.as_secs_f64()
                        );
                        runs.api.push(took);
                    }
                    Side::Cli => {
                        let took = docker_run(&docker, &image, &shape).await?;
                        println!(
                            "{label} (quiet after {:.1} s): running {:.1} s",
                            settled.as_secs_f64(),
                            took.as_secs_f64()
                        );
                        runs.cli.push(took);
                    }
                }
            }
        }
        results.push(runs);
        // The table so far after each size: a long run cut short keeps what it measured.
        table(&results);
    }
    if !measuring {
        println!("(smoke run of the bench; these figures are not a measurement)");
    }
    Ok(())
}

fn secs(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

fn median_kib(values: impl Iterator<Item = u64>) -> f64 {
    let mut values: Vec<u64> = values.collect();
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0) as f64 / 1024.0
}

/// The medians of every size, their ratios, and Flux's figures.
fn table(results: &[SizeRuns]) {
    println!();
    println!(
        "| deployments × replicas | agent: push → running | push → all Ready | `docker run -d` -P{CLI_PARALLELISM} | agent / docker run (running; Ready vs running + {} s) | bollard direct, 16 at a time | agent / bollard (running) | agent RSS: idle / loaded |",
        READY_SETTLE.as_secs()
    );
    println!("|---|---|---|---|---|---|---|---|");
    for runs in results {
        let running = support::median(
            &mut runs
                .agents
                .iter()
                .map(|agent| agent.running)
                .collect::<Vec<_>>(),
        );
        let ready = support::median(
            &mut runs
                .agents
                .iter()
                .map(|agent| agent.ready)
                .collect::<Vec<_>>(),
        );
        let api = if runs.api.is_empty() {
            None
        } else {
            Some(support::median(&mut runs.api.clone()))
        };
        let (cli, cli_ratio) = if runs.cli.is_empty() {
            ("skipped".to_owned(), "—".to_owned())
        } else {
            let cli = support::median(&mut runs.cli.clone());
            (
                secs(cli),
                format!(
                    "{:.3}; {:.3}",
                    running.as_secs_f64() / cli.as_secs_f64(),
                    ready.as_secs_f64() / (cli + READY_SETTLE).as_secs_f64()
                ),
            )
        };
        println!(
            "| {} × {} | {} | {} | {cli} | {cli_ratio} | {} | {} | {:.1} / {:.1} MiB |",
            runs.shape.deployments,
            runs.shape.replicas,
            secs(running),
            secs(ready),
            api.map_or_else(|| "skipped".to_owned(), secs),
            api.map_or_else(
                || "—".to_owned(),
                |api| format!("{:.3}", running.as_secs_f64() / api.as_secs_f64())
            ),
            median_kib(runs.agents.iter().map(|agent| agent.rss_idle)),
            median_kib(runs.agents.iter().map(|agent| agent.rss_loaded)),
        );
    }
    println!();
    println!("runs (s), per size: agent running | agent Ready | docker run | bollard direct");
    let list = |values: &mut dyn Iterator<Item = Duration>| {
        values
            .map(|value| format!("{:.1}", value.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for runs in results {
        println!(
            "  {} × {}: {} | {} | {} | {}",
            runs.shape.deployments,
            runs.shape.replicas,
            list(&mut runs.agents.iter().map(|agent| agent.running)),
            list(&mut runs.agents.iter().map(|agent| agent.ready)),
            list(&mut runs.cli.iter().copied()),
            list(&mut runs.api.iter().copied()),
        );
    }
    for runs in results {
        let Some(latencies) = runs
            .agents
            .iter()
            .find_map(|agent| agent.latencies.as_ref())
        else {
            continue;
        };
        let median_ms =
            |values: &[Duration]| support::median(&mut values.to_vec()).as_secs_f64() * 1000.0;
        let each = |values: &[Duration]| {
            values
                .iter()
                .map(|value| format!("{:.1}", value.as_secs_f64() * 1000.0))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "| among {} deployments: one file changed, webhook sent → first create call | {:.1} ms (runs {} ms) | ≤ 50 ms |",
            runs.shape.deployments,
            median_ms(&latencies.change),
            each(&latencies.change)
        );
        println!(
            "| among {} containers: `docker rm -f` of one, destroy event → replacement create call | {:.1} ms (runs {} ms) | ≤ 100 ms |",
            runs.shape.containers(),
            median_ms(&latencies.drift),
            each(&latencies.drift)
        );
    }
    println!();
    println!(
        "Flux, Kustomizations (fluxcd/flux-benchmark RESULTS.md; Deployments scaled to zero on Kind, kustomize-controller 2 CPUs): objects | v2.6.0 all Ready, memory | v2.9.0 all Ready, memory"
    );
    for (objects, took, memory, took_now, memory_now) in FLUX {
        println!("  {objects} | {took}, {memory} | {took_now}, {memory_now}");
    }
}
