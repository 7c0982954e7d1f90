//! Benchmark: what following several repositories costs (issue 26, acceptance 3; issue 54):
//! the real binary with `--sources` over 1, 20 and 100 repositories (`VOODU_BENCH_SOURCES`, a
//! comma-separated list of sizes), each repository on this host (`file://`) holding one asset
//! in its own scope, every source polled each second (`poll = "1s"`), `--no-watch`,
//! `--no-ingress`. Printed, per binary and size:
//! - **idle RSS** once every source applied its commit and the agent settled (3 s), and
//!   **steady RSS** at the end of the CPU window below, once the threads the start-up's
//!   burst of syncs started have idled out (tokio's blocking threads after 10 s, the agent's
//!   pool's after 5 s);
//! - **unchanged-poll CPU**: the agent's CPU time over a window in which every poll finds its
//!   branch unchanged, per second and per source-poll, and beside it the CPU of the processes
//!   it started and waited for in that window (`git upload-pack`, per poll).
//!
//! What an unchanged poll of a repository on this host costs is a read of two ref files (its
//! branch and the mirror's); an https or ssh remote's is one ref listing over the network,
//! which this bench does not measure.
//!
//! The binaries (`VOODU_AGENT_BINS`, colon-separated, to compare two builds; else
//! `VOODU_AGENT_BIN` or the one cargo built) and the sizes alternate, three runs each; medians
//! are printed. A size a binary refuses (more sources than it follows) is said and skipped.
//! `cargo bench --bench sources`. Under `cargo test --all-targets` (with
//! `VOODU_DOCKER_TESTS=1`) it runs 1 and 2 sources once over a short window as a smoke test
//! of the bench. Figures are printed, never asserted.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Repo, Result, children_cpu_time, cpu_time, memory_kib};

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

/// One side's figures.
struct Figures {
    rss_kib: u64,
    steady_rss_kib: u64,
    cpu_per_second: Duration,
    children_per_second: Duration,
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
    let sizes: Vec<usize> = if measuring {
        std::env::var("VOODU_BENCH_SOURCES")
            .unwrap_or_else(|_| "1,20,100".to_owned())
            .split(',')
            .map(|size| size.trim().parse::<usize>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|error| format!("VOODU_BENCH_SOURCES: {error}"))?
    } else {
        println!("sources: smoke run under `cargo test` (not a measurement; use `cargo bench`)");
        vec![1, 2]
    };
    let binaries: Vec<String> = match std::env::var("VOODU_AGENT_BINS") {
        Ok(list) => list.split(':').map(str::to_owned).collect(),
        Err(_) => vec![support::agent()],
    };
    let runs = if measuring { 3 } else { 1 };
    let window = support::figure_wait(Duration::from_secs(20));
    let dir = tempfile::tempdir()?;
    // (binary, size) → the runs' figures; `None` once the binary refused the size.
    let mut figures: Vec<(usize, usize, Option<Vec<Figures>>)> = Vec::new();
    for binary in 0..binaries.len() {
        for &n in &sizes {
            figures.push((binary, n, Some(Vec::new())));
        }
    }
    for run in 0..runs {
        for (binary, n, measured) in &mut figures {
            let Some(list) = measured else { continue };
            let side_dir = dir.path().join(format!("run{run}-{binary}-{n}"));
            let name = &binaries[*binary];
            match side(&side_dir, name, *n, window).await {
                Ok(side) => {
                    println!(
                        "run {}: {name} {n:>3} source(s): idle RSS {:.1} MiB, steady {:.1} MiB, unchanged polls {:.0}/s, CPU {:.2} ms/s ({:.3} ms per source-poll; started processes {:.3} ms per poll)",
                        run + 1,
                        side.rss_kib as f64 / 1024.0,
                        side.steady_rss_kib as f64 / 1024.0,
                        side.polls,
                        support::ms(side.cpu_per_second),
                        support::ms(side.cpu_per_second) / side.polls.max(1.0),
                        support::ms(side.children_per_second) / side.polls.max(1.0),
                    );
                    list.push(side);
                }
                Err(error) if run == 0 => {
                    println!("{name} {n:>3} source(s): skipped ({error})");
                    *measured = None;
                }
                Err(error) => return Err(error),
            }
        }
    }
    for (binary, n, measured) in &figures {
        let Some(list) = measured.as_ref().filter(|list| !list.is_empty()) else {
            continue;
        };
        let median_mib = |value: fn(&Figures) -> u64| {
            let mut values: Vec<u64> = list.iter().map(value).collect();
            values.sort_unstable();
            values[values.len() / 2] as f64 / 1024.0
        };
        let per_poll = |value: fn(&Figures) -> Duration| {
            let mut values: Vec<f64> = list
                .iter()
                .map(|f| support::ms(value(f)) / f.polls.max(1.0))
                .collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        println!(
            "median of {}: {} {n:>3} source(s): idle RSS {:.1} MiB, steady {:.1} MiB, {:.3} ms agent CPU per source-poll, {:.3} ms in started processes",
            list.len(),
            binaries[*binary],
            median_mib(|f| f.rss_kib),
            median_mib(|f| f.steady_rss_kib),
            per_poll(|f| f.cpu_per_second),
            per_poll(|f| f.children_per_second),
        );
    }
    Ok(())
}

/// Starts the agent on `n` fresh repositories, waits until each applied, then measures.
async fn side(dir: &Path, binary: &str, n: usize, window: Duration) -> Result<Figures> {
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
    let log = dir.join("agent.log");
    let mut agent = Agent::start(binary, &sources, &data_dir, &log)?;
    let started = Instant::now();
    loop {
        if let Some(status) = agent.0.try_wait()? {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            let last = said.lines().rev().find(|line| !line.trim().is_empty());
            return Err(format!("the agent exited: {status}: {}", last.unwrap_or("")).into());
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
    let (cpu_before, children_before, syncs_before, at) = (
        cpu_time(pid)?,
        children_cpu_time(pid)?,
        syncs()?,
        Instant::now(),
    );
    tokio::time::sleep(window).await;
    let (cpu_after, children_after, syncs_after) =
        (cpu_time(pid)?, children_cpu_time(pid)?, syncs()?);
    let seconds = at.elapsed().as_secs_f64();
    let steady_rss_kib = memory_kib(pid, "VmRSS")?;
    agent.stop();
    Ok(Figures {
        rss_kib,
        steady_rss_kib,
        cpu_per_second: (cpu_after - cpu_before).div_f64(seconds),
        children_per_second: children_after
            .saturating_sub(children_before)
            .div_f64(seconds),
        polls: (syncs_after - syncs_before) / seconds,
    })
}

/// The agent with `--sources`; killed when dropped.
struct Agent(Child);

impl Agent {
    fn start(binary: &str, sources: &Path, data_dir: &Path, log: &Path) -> Result<Agent> {
        let child = Command::new(binary)
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
