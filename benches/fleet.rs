//! Benchmark: a fleet of agents on one repository (issue 16, acceptance 1).
//!
//! N agents (the real binary, each its own data dir, `--host host-NN`, `--no-ingress`,
//! `--listen 127.0.0.1:0`, `--no-watch`) on one machine and one Docker engine, one
//! repository with shared and per-host manifests: `common/` holds deployments every host
//! runs (replica names carry a random id, so agents never collide), `hosts/host-NN/` a
//! statefulset of that host only (distinct names: statefulset pod names are fixed). Printed:
//! - **webhook fan-out**: a push adding one shared deployment and one statefulset per host,
//!   then `POST /hooks/git` to every agent at once: time from the push until the last host
//!   has every resource Ready (and the median host);
//! - **polling**: the agents restarted with `--interval 5s`; a push adding another shared
//!   deployment and statefulset per host, no webhook: the same times;
//! - the agents' total RSS (idle, converged) and CPU time (during each convergence, and idle
//!   over a window);
//! - `voodu-agent fleet status` over all of them, then after a push that breaks one host's
//!   manifest: that host `rejected`, every other one `ok`.
//!
//! `cargo bench --bench fleet` (N = `VOODU_BENCH_AGENTS`, 20). Figures are printed, never
//! asserted; the fleet-status outcomes are checked (a wrong table fails the bench). Every
//! container it created is removed at the end. Under `cargo test --all-targets` it runs 3
//! agents as a smoke test of the bench itself (with `VOODU_DOCKER_TESTS=1`).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::{AgentProcess, Repo, Result, cpu_time, memory_kib};
use voodu_agent::model::{Kind, ResourceKey};

/// How long one convergence may take before the bench gives up.
const LIMIT: Duration = Duration::from_secs(600);

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

async fn bench() -> Result {
    if !support::engine_allowed("fleet") {
        return Ok(());
    }
    let docker = match support::connect().await {
        Ok(docker) => docker,
        Err(error) => {
            println!("SKIPPED fleet: no Docker engine ({error}); run scripts/docker-setup");
            return Ok(());
        }
    };
    let image =
        std::env::var("VOODU_TEST_IMAGE").unwrap_or_else(|_| "voodu-busybox:latest".to_owned());
    let n = if support::measuring() {
        support::env_number("VOODU_BENCH_AGENTS", 20.0)? as usize
    } else {
        println!("fleet: smoke run under `cargo test` (not a measurement; use `cargo bench`)");
        3
    };
    support::ensure_network(&docker).await?;
    let scope = support::unique("fleet");
    let dir = tempfile::tempdir()?;
    let result = run(dir.path(), &image, &scope, n).await;
    // Agents are stopped (dropped) by now; their containers go.
    support::remove_scope(&docker, &scope).await?;
    let (left, _) = support::scope_containers(&docker, &scope).await?;
    println!("cleanup: {} container(s) of scope {scope} left", left.len());
    if result.is_err() {
        for index in 1..=n {
            let log = dir.path().join(format!("{}.log", host(index)));
            eprintln!(
                "--- {} log:\n{}",
                host(index),
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }
    result
}

fn host(index: usize) -> String {
    format!("host-{index:02}")
}

/// One agent of the fleet and what the bench knows of it.
struct Member {
    name: String,
    process: AgentProcess,
    address: String,
}

struct Fleet {
    members: Vec<Member>,
    dir: PathBuf,
}

impl Fleet {
    /// Starts `n` agents with `args`, each on its data dir under `dir`, and waits until
    /// each has seen `commit`.
    async fn start(
        dir: &Path,
        repo: &Repo,
        n: usize,
        args: &[&str],
        commit: &str,
    ) -> Result<Fleet> {
        let mut members = Vec::new();
        for index in 1..=n {
            let name = host(index);
            let mut all: Vec<&str> = vec![
                "--host",
                &name,
                "--no-ingress",
                "--no-watch",
                "--listen",
                "127.0.0.1:0",
                "--log",
                "warn",
            ];
            all.extend_from_slice(args);
            let process = AgentProcess::start(
                repo,
                &dir.join(&name),
                &dir.join(format!("{name}.log")),
                &all,
            )?;
            members.push(Member {
                name,
                process,
                address: String::new(),
            });
        }
        for member in &mut members {
            member.process.synced(commit).await?;
            // The address is recorded just after the first sync: wait for it too.
            let started = Instant::now();
            member.address = loop {
                let recorded = member.process.store().and_then(|store| {
                    store
                        .meta(voodu_agent::agent::META_HTTP_ADDR)
                        .ok()
                        .flatten()
                });
                if let Some(address) = recorded {
                    break address;
                }
                if started.elapsed() > LIMIT {
                    return Err(format!("{} never said where it listens", member.name).into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
        }
        Ok(Fleet {
            members,
            dir: dir.to_owned(),
        })
    }

    fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .map(|member| member.process.pid())
            .collect()
    }

    fn rss_kib(&self) -> Result<u64> {
        self.pids()
            .into_iter()
            .map(|pid| memory_kib(pid, "VmRSS"))
            .sum()
    }

    fn cpu(&self) -> Result<Duration> {
        self.pids().into_iter().map(cpu_time).sum()
    }

    /// Waits until every agent has every key of `keys(host)` Ready; each host's time since
    /// `started`, sorted.
    async fn converged(
        &self,
        keys: impl Fn(&str) -> Vec<ResourceKey>,
        started: Instant,
    ) -> Result<Vec<Duration>> {
        let mut times = Vec::new();
        let mut pending: Vec<&Member> = self.members.iter().collect();
        while !pending.is_empty() {
            let mut still = Vec::new();
            for member in pending {
                let wanted = keys(&member.name);
                let ready = member.process.store().is_some_and(|store| {
                    wanted.iter().all(|key| {
                        store.status(key).is_ok_and(|status| {
                            status.is_some_and(|status| status.phase == "Ready")
                        })
                    })
                });
                if ready {
                    times.push(started.elapsed());
                } else {
                    still.push(member);
                }
            }
            pending = still;
            if started.elapsed() > LIMIT {
                return Err(format!("{} host(s) never converged", pending.len()).into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        times.sort();
        Ok(times)
    }

    /// Waits until every agent has seen `commit`.
    async fn seen(&mut self, commit: &str) -> Result {
        for member in &mut self.members {
            member.process.synced(commit).await?;
        }
        Ok(())
    }

    fn fleet_file(&self) -> Result<PathBuf> {
        let file = self.dir.join("fleet");
        let lines: String = self
            .members
            .iter()
            .map(|member| format!("{} http://{}\n", member.name, member.address))
            .collect();
        std::fs::write(&file, lines)?;
        Ok(file)
    }

    fn stop(self) {
        for mut member in self.members {
            member.process.stop();
        }
    }
}

/// `voodu-agent fleet status` over `file`: the table and the JSON document.
fn fleet_status(file: &Path) -> Result<(String, serde_json::Value)> {
    let run = |json: bool| -> Result<String> {
        let mut command = std::process::Command::new(support::agent());
        command.args(["fleet", "status", "--agents"]).arg(file);
        if json {
            command.arg("--json");
        }
        let output = command.output()?;
        if !output.status.success() {
            return Err(format!(
                "fleet status failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )
            .into());
        }
        Ok(String::from_utf8(output.stdout)?)
    };
    let table = run(false)?;
    let json = serde_json::from_str(&run(true)?)?;
    Ok((table, json))
}

/// The state `fleet status` gave each agent, by name.
fn states(view: &serde_json::Value) -> Vec<(String, String)> {
    view["agents"]
        .as_array()
        .map(|agents| {
            agents
                .iter()
                .map(|agent| {
                    (
                        agent["name"].as_str().unwrap_or_default().to_owned(),
                        agent["state"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn deployment(scope: &str, name: &str, image: &str) -> String {
    format!(
        "deployment \"{scope}\" \"{name}\" {{\n  image    = \"{image}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = 1\n}}\n"
    )
}

fn statefulset(scope: &str, name: &str, image: &str) -> String {
    format!(
        "statefulset \"{scope}\" \"{name}\" {{\n  image    = \"{image}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = 1\n}}\n"
    )
}

fn summary(label: &str, times: &[Duration]) -> String {
    format!(
        "{label}: last host converged {:.2} s after the push, median host {:.2} s, first {:.2} s",
        times.last().copied().unwrap_or_default().as_secs_f64(),
        times[times.len() / 2].as_secs_f64(),
        times.first().copied().unwrap_or_default().as_secs_f64(),
    )
}

async fn run(dir: &Path, image: &str, scope: &str, n: usize) -> Result {
    let repo = Repo::new(dir)?;
    repo.write("README.md", "fleet bench\n")?;
    let initial = repo.commit("initial")?;
    println!(
        "fleet: {n} agents ({} binary), one engine, image {image}, scope {scope}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );

    // 1. Webhook fan-out.
    let fleet = Fleet::start(dir, &repo, n, &["--interval", "1h"], &initial).await?;
    tokio::time::sleep(support::figure_wait(Duration::from_secs(2))).await;
    let rss_idle = fleet.rss_kib()?;
    repo.write("common/web.hcl", &deployment(scope, "web", image))?;
    for index in 1..=n {
        repo.write(
            &format!("hosts/{}/db.hcl", host(index)),
            &statefulset(scope, &format!("db-{index:02}"), image),
        )?;
    }
    let first = repo.commit("fleet: web everywhere, a db per host")?;
    let cpu_before = fleet.cpu()?;
    let started = Instant::now();
    let body = format!(r#"{{"ref":"refs/heads/main","after":"{first}"}}"#);
    let hooks: Vec<_> = fleet
        .members
        .iter()
        .map(|member| {
            let (address, body) = (member.address.clone(), body.clone());
            tokio::task::spawn_blocking(move || support::post(&address, "/hooks/git", &body))
        })
        .collect();
    for hook in hooks {
        let (status, answer, _) = hook.await??;
        if !(200..300).contains(&status) {
            return Err(format!("webhook answered {status}: {answer}").into());
        }
    }
    let keys_first = |name: &str| {
        let index = &name["host-".len()..];
        vec![
            ResourceKey::new(Kind::Deployment, scope, "web"),
            ResourceKey::new(Kind::Statefulset, scope, format!("db-{index}")),
        ]
    };
    let webhook_times = fleet.converged(keys_first, started).await?;
    let webhook_cpu = fleet.cpu()?.saturating_sub(cpu_before);
    tokio::time::sleep(support::figure_wait(Duration::from_secs(3))).await;
    let rss_converged = fleet.rss_kib()?;
    let before = fleet.cpu()?;
    let idle_window = Duration::from_secs(if support::measuring() { 30 } else { 2 });
    tokio::time::sleep(idle_window).await;
    let idle_cpu = fleet.cpu()?.saturating_sub(before);
    fleet.stop();

    // 2. Polling every 5 s, no webhook.
    let mut fleet = Fleet::start(dir, &repo, n, &["--interval", "5s"], &first).await?;
    fleet.converged(keys_first, Instant::now()).await?;
    repo.write("common/api.hcl", &deployment(scope, "api", image))?;
    for index in 1..=n {
        repo.write(
            &format!("hosts/{}/cache.hcl", host(index)),
            &statefulset(scope, &format!("cache-{index:02}"), image),
        )?;
    }
    let cpu_before = fleet.cpu()?;
    let started = Instant::now();
    let second = repo.commit("fleet: api everywhere, a cache per host")?;
    let keys_second = |name: &str| {
        let index = &name["host-".len()..];
        vec![
            ResourceKey::new(Kind::Deployment, scope, "api"),
            ResourceKey::new(Kind::Statefulset, scope, format!("cache-{index}")),
        ]
    };
    let polling_times = fleet.converged(keys_second, started).await?;
    let polling_cpu = fleet.cpu()?.saturating_sub(cpu_before);
    fleet.seen(&second).await?;

    // 3. `fleet status` over every agent, then a broken manifest on one host.
    let file = fleet.fleet_file()?;
    let (table, view) = fleet_status(&file)?;
    println!(
        "\n$ voodu-agent fleet status --agents {}\n{table}",
        file.display()
    );
    let all = states(&view);
    if all.len() != n || all.iter().any(|(_, state)| state != "ok") {
        return Err(format!("fleet status after convergence: {all:?}").into());
    }
    let broken = host(n.min(7));
    repo.write(
        &format!("hosts/{broken}/broken.hcl"),
        &format!("deployment \"{scope}\" \"oops\" {{\n  imagee = \"{image}\"\n}}\n"),
    )?;
    let third = repo.commit("break one host's manifest")?;
    fleet.seen(&third).await?;
    let (table, view) = fleet_status(&file)?;
    println!(
        "$ voodu-agent fleet status --agents {} (after breaking {broken})\n{table}",
        file.display()
    );
    let all = states(&view);
    let wrong: Vec<&(String, String)> = all
        .iter()
        .filter(|(name, state)| {
            (*name == broken) != (state == "rejected") || (*name != broken && state != "ok")
        })
        .collect();
    if all.len() != n || !wrong.is_empty() {
        return Err(format!("after breaking {broken}: {all:?}").into());
    }
    fleet.stop();

    let mib = |kib: u64| kib as f64 / 1024.0;
    println!("| figure ({n} agents, one engine) | measured |");
    println!("|---|---|");
    for (label, times, cpu) in [
        ("webhook fan-out", &webhook_times, webhook_cpu),
        ("polling every 5 s", &polling_times, polling_cpu),
    ] {
        println!(
            "| {label}: push → last host converged (every resource Ready, 3 s settle included) | {:.2} s (median host {:.2} s) |",
            times.last().copied().unwrap_or_default().as_secs_f64(),
            times[times.len() / 2].as_secs_f64()
        );
        println!(
            "| {label}: agents' CPU time during it, total | {:.2} s |",
            cpu.as_secs_f64()
        );
    }
    println!(
        "| total RSS, idle before the push / converged | {:.1} MiB / {:.1} MiB ({:.1} MiB per agent converged) |",
        mib(rss_idle),
        mib(rss_converged),
        mib(rss_converged) / n as f64
    );
    println!(
        "| idle CPU of all agents over {} s | {:.0} ms |",
        idle_window.as_secs(),
        idle_cpu.as_secs_f64() * 1000.0
    );
    println!("{}", summary("webhook", &webhook_times));
    println!("{}", summary("polling", &polling_times));
    if !support::measuring() {
        println!("(smoke run of the bench; these figures are not a measurement)");
    }
    Ok(())
}
