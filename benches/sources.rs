//! Benchmark: what following several repositories costs (issue 26, acceptance 3): the real
//! binary with `--sources` over 1 and over 20 repositories (`VOODU_BENCH_SOURCES`), each
//! repository holding one asset in its own scope, every source polled each second
//! (`poll = "1s"`), `--no-watch`, `--no-ingress`. Printed, per side:
//! - **idle RSS** once every source applied its commit and the agent settled;
//! - **unchanged-poll CPU**: the agent's CPU time over a window in which every poll finds its
//!   branch unchanged (one ref negotiation each), per second and per poll.
//!
//! The sides alternate, three runs each; medians and the 20-to-1 ratios are printed.
//! `cargo bench --bench sources`. Under `cargo test --all-targets` (with
//! `VOODU_DOCKER_TESTS=1`) it runs 1 and 2 sources once over a short window as a smoke test
//! of the bench. Figures are printed, never asserted.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Repo, Result, cpu_time, memory_kib};

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

/// One side's figures.
struct Figures {
    rss_kib: u64,
    cpu_per_second: Duration,
    polls: f64,
}

async fn bench() -> Result {
    if !support::engine_allowed("sources") {
        return Ok(());
    }
    if let Err(error) = support::connect().await {
        println!("SKIPPED sources: no Docker engine ({error}); run scripts/docker-setup");
        return Ok(());
    }
    let measuring = support::measuring();
    let many = if measuring {
        support::env_number("VOODU_BENCH_SOURCES", 20.0)? as usize
    } else {
        println!("sources: smoke run under `cargo test` (not a measurement; use `cargo bench`)");
        2
    };
    let runs = if measuring { 3 } else { 1 };
    let window = support::figure_wait(Duration::from_secs(20));
    let dir = tempfile::tempdir()?;
    let mut one = Vec::new();
    let mut several = Vec::new();
    for run in 0..runs {
        for (n, figures) in [(1, &mut one), (many, &mut several)] {
            let measured = side(&dir.path().join(format!("run{run}-{n}")), n, window).await?;
            println!(
                "run {}: {n:>2} source(s): idle RSS {:.1} MiB, unchanged polls {:.0}/s, CPU {:.2} ms/s ({:.3} ms per poll)",
                run + 1,
                measured.rss_kib as f64 / 1024.0,
                measured.polls,
                support::ms(measured.cpu_per_second),
                support::ms(measured.cpu_per_second) / measured.polls.max(1.0)
            );
            figures.push(measured);
        }
    }
    let median_rss = |figures: &[Figures]| {
        let mut values: Vec<u64> = figures.iter().map(|f| f.rss_kib).collect();
        values.sort_unstable();
        values[values.len() / 2] as f64 / 1024.0
    };
    let median_cpu = |figures: &[Figures]| {
        let mut values: Vec<Duration> = figures.iter().map(|f| f.cpu_per_second).collect();
        support::ms(support::median(&mut values))
    };
    let (rss_1, rss_n) = (median_rss(&one), median_rss(&several));
    let (cpu_1, cpu_n) = (median_cpu(&one), median_cpu(&several));
    println!(
        "median of {runs}: idle RSS {rss_1:.1} MiB with 1 source, {rss_n:.1} MiB with {many} (x{:.2}); unchanged-poll CPU {cpu_1:.2} ms/s with 1, {cpu_n:.2} ms/s with {many} (x{:.2}, {:.3} ms per source-poll)",
        rss_n / rss_1,
        cpu_n / cpu_1.max(0.001),
        cpu_n / many as f64
    );
    Ok(())
}

/// Starts the agent on `n` fresh repositories, waits until each applied, then measures.
async fn side(dir: &Path, n: usize, window: Duration) -> Result<Figures> {
    std::fs::create_dir_all(dir)?;
    let mut blocks = String::new();
    let mut commits = Vec::new();
    for index in 0..n {
        let repo_dir = dir.join(format!("repo{index}"));
        std::fs::create_dir_all(&repo_dir)?;
        let repo = Repo::new(&repo_dir)?;
        let scope = format!("s{index:02}");
        repo.write(
            "config.hcl",
            &format!("asset \"{scope}\" \"cfg\" {{\n  app = \"setting {index}\"\n}}\n"),
        )?;
        commits.push((format!("repo{index}"), repo.commit("one asset")?));
        blocks.push_str(&format!(
            "source \"repo{index}\" {{\n  url    = \"{}\"\n  scopes = [\"{scope}\"]\n  poll   = \"1s\"\n}}\n",
            repo.url()
        ));
    }
    let sources = dir.join("sources.hcl");
    std::fs::write(&sources, blocks)?;
    let data_dir = dir.join("data");
    let mut agent = Agent::start(&sources, &data_dir, &dir.join("agent.log"))?;
    let started = Instant::now();
    loop {
        if let Some(status) = agent.0.try_wait()? {
            return Err(format!("the agent exited: {status}").into());
        }
        let store = voodu_agent::store::Store::open_read_only(&data_dir.join("state.db")).ok();
        let applied = store.is_some_and(|store| {
            commits.iter().all(|(name, sha)| {
                store
                    .for_source(name)
                    .commit_summary()
                    .is_ok_and(|summary| {
                        summary
                            .last_applied
                            .is_some_and(|record| record.sha.as_str() == sha)
                    })
            })
        });
        if applied {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!("{n} sources never all applied").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Settled: start-up work done, a few polls behind it.
    tokio::time::sleep(support::figure_wait(Duration::from_secs(3))).await;
    let pid = agent.0.id();
    let rss_kib = memory_kib(pid, "VmRSS")?;
    let syncs = || -> Result<f64> {
        let store = voodu_agent::store::Store::open_read_only(&data_dir.join("state.db"))?;
        let address = store
            .meta(voodu_agent::agent::META_HTTP_ADDR)?
            .ok_or("no HTTP address recorded")?;
        let (_, text) = support::get(&address, "/metrics")?;
        Ok(text
            .lines()
            .filter(|line| line.starts_with("voodu_syncs_total{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    };
    let (cpu_before, syncs_before, at) = (cpu_time(pid)?, syncs()?, Instant::now());
    tokio::time::sleep(window).await;
    let (cpu_after, syncs_after) = (cpu_time(pid)?, syncs()?);
    let seconds = at.elapsed().as_secs_f64();
    agent.stop();
    Ok(Figures {
        rss_kib,
        cpu_per_second: (cpu_after - cpu_before).div_f64(seconds),
        polls: (syncs_after - syncs_before) / seconds,
    })
}

/// The agent with `--sources`; killed when dropped.
struct Agent(Child);

impl Agent {
    fn start(sources: &Path, data_dir: &Path, log: &Path) -> Result<Agent> {
        let child = Command::new(support::agent())
            .arg("--sources")
            .arg(sources)
            .args([
                "--no-watch",
                "--no-ingress",
                "--listen",
                "127.0.0.1:0",
                "--log",
                "warn",
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()?;
        Ok(Agent(child))
    }

    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
