//! Benchmark: backups of a statefulset's claims with restic (issue 50, acceptance 3).
//!
//! On the local Docker engine, with the locally built test image and the host's restic, one
//! agent (real binary, release build) runs a statefulset `db` of one pod with one
//! `volume_claim`, its `backup { mode = "live" }` (no pod stop: the time is restic's and the
//! agent's own), and an unrelated deployment `web` of one replica. The claim's volume is
//! filled once with `VOODU_BENCH_BACKUP_MIB` (1024) MiB of incompressible data (64 MiB files
//! from /dev/urandom). One run prints, as medians over `VOODU_BENCH_ROUNDS` (3) rounds, each
//! round with the sides in the other order:
//! - **backup time**: the agent's backup (`voodu-agent backup db`, polled through `backups
//!   --json` every 50 ms until the run ended `succeeded`) against `restic backup` by hand on
//!   the same directory, each into an empty repository (removed and `restic init`ed before
//!   every side, untimed), so that deduplication favours neither. The agent's figure is
//!   given twice: from the command (which includes the backup scheduler's pick-up of the
//!   request, `observers::backups`) and from the moment `backups --json` first shows the run
//!   `running` (restic's work and the agent's own: `backup --json` and, once per repository
//!   in the agent's life, its `cat config` and `unlock`, each a repository open of its own);
//! - **RSS**: the agent's VmRSS idle just before the command, and its largest sample (every
//!   100 ms) until the run ended: restic is a child process, its memory is not the agent's;
//! - **an unrelated change while a backup runs**: a commit changing `web`'s env (announced by
//!   webhook) until the engine runs a `web` container of the new manifest hash, with no backup
//!   running and while the agent backs up the claim (the run seen `running` first).
//!
//! `cargo bench --bench backup` (`VOODU_AGENT_BIN` runs another build of the agent). Figures
//! are printed, never asserted; everything it created (containers by scope label, the claim's
//! volume, temp dirs with the repositories) is removed at the end. The data is in the page
//! cache for both sides (written just before, read by every side). Under `cargo test
//! --all-targets` it runs once with 16 MiB as a smoke test of the bench itself (with
//! `VOODU_DOCKER_TESTS=1`).

mod support;

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::ListContainersOptionsBuilder;
use support::{AgentProcess, Repo, Result, memory_kib};
use voodu_agent::model::{Kind, ResourceKey};

/// How long any one wait may take (a liveness bound, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(900);

/// The poll of `backups --json`.
const POLL: Duration = Duration::from_millis(50);

/// The agent's RSS sampling period during a backup.
const SAMPLE: Duration = Duration::from_millis(100);

/// The size of each file the claim is filled with.
const FILE_MIB: u64 = 64;

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

async fn bench() -> Result {
    if !support::engine_allowed("backup") {
        return Ok(());
    }
    let docker = match support::connect().await {
        Ok(docker) => docker,
        Err(error) => {
            println!("SKIPPED backup: no Docker engine ({error}); run scripts/docker-setup");
            return Ok(());
        }
    };
    let restic_version = match Command::new("restic").arg("version").output() {
        Ok(output) if output.status.success() => {
            String::from_utf8_lossy(&output.stdout).trim().to_owned()
        }
        _ => {
            println!("SKIPPED backup: no restic on PATH");
            return Ok(());
        }
    };
    let (mib, rounds) = if support::measuring() {
        (
            support::env_number("VOODU_BENCH_BACKUP_MIB", 1024.0)? as u64,
            (support::env_number("VOODU_BENCH_ROUNDS", 3.0)? as usize).max(1),
        )
    } else {
        println!("backup: smoke run under `cargo test` (not a measurement; use `cargo bench`)");
        (16, 1)
    };
    let image =
        std::env::var("VOODU_TEST_IMAGE").unwrap_or_else(|_| "voodu-busybox:latest".to_owned());
    support::ensure_network(&docker).await?;
    println!(
        "backup: one claim of {mib} MiB (live mode), {rounds} rounds; {restic_version}; {} bench, agent {}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        support::agent()
    );

    let dir = tempfile::tempdir()?;
    let scope = support::unique("bkb");
    let volume = format!("voodu-{scope}-db-data-0");
    let result = run(&docker, dir.path(), &scope, &volume, &image, mib, rounds).await;
    if result.is_err() {
        eprintln!(
            "agent log:\n{}",
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
        );
    }
    support::remove_scope(&docker, &scope).await?;
    if let Err(error) = docker
        .remove_volume(
            &volume,
            Some(
                bollard::query_parameters::RemoveVolumeOptionsBuilder::default()
                    .force(true)
                    .build(),
            ),
        )
        .await
    {
        eprintln!("cleanup: volume {volume}: {error}");
    }
    result
}

/// What a round's sides share.
struct Bench<'a> {
    docker: &'a Docker,
    repo: Repo,
    data_dir: PathBuf,
    scope: String,
    image: String,
    /// Host directory of the claim's volume.
    claim: PathBuf,
    agent_repo: PathBuf,
    hand_repo: PathBuf,
    hand_cache: PathBuf,
    password_file: PathBuf,
    /// The agent's HTTP address (the webhook).
    address: String,
    /// `web`'s env value, changed by every change side.
    version: u32,
}

/// One agent backup's figures.
struct AgentBackup {
    from_command: Duration,
    from_running: Option<Duration>,
    rss_idle: u64,
    rss_max: u64,
}

#[allow(clippy::too_many_arguments)]
async fn run(
    docker: &Docker,
    dir: &Path,
    scope: &str,
    volume: &str,
    image: &str,
    mib: u64,
    rounds: usize,
) -> Result {
    let backups = dir.join("backups");
    std::fs::create_dir_all(&backups)?;
    let password_file = backups.join("restic.pass");
    std::fs::write(&password_file, "correct horse battery staple\n")?;
    let agent_repo = backups.join("agent-repo");

    let repo = Repo::new(dir)?;
    repo.write(
        "db.hcl",
        &format!(
            r#"statefulset "{scope}" "db" {{
  image   = "{image}"
  command = ["sleep", "3600"]
  volume_claim "data" {{
    mount_path = "/data"
  }}
  backup {{
    repository    = "{repository}"
    password_file = "{password}"
    mode          = "live"
  }}
}}
"#,
            repository = agent_repo.display(),
            password = password_file.display(),
        ),
    )?;
    repo.write("web.hcl", &web(scope, image, 0))?;
    let initial = repo.commit("db and web")?;
    let data_dir = dir.join("data");
    let log = dir.join("agent.log");
    let backups_root = support::path_str(&backups)?.to_owned();
    let mut agent = AgentProcess::start(
        &repo,
        &data_dir,
        &log,
        &[
            "--interval",
            "1h",
            "--no-watch",
            "--no-ingress",
            "--listen",
            "127.0.0.1:0",
            "--log",
            "warn",
            "--resync",
            "1h",
            "--allow-bind-root",
            &backups_root,
        ],
    )?;
    let address = agent
        .synced(&initial)
        .await?
        .ok_or("the agent does not say where it listens")?;
    let keys = [
        ResourceKey::new(Kind::Statefulset, scope, "db"),
        ResourceKey::new(Kind::Deployment, scope, "web"),
    ];
    agent.ready(&keys, Instant::now(), LIMIT).await?;

    let claim = PathBuf::from(
        docker
            .inspect_volume(volume)
            .await?
            .mountpoint
            .trim()
            .to_owned(),
    );
    let filled = Instant::now();
    fill(&claim, mib)?;
    println!(
        "claim {} filled with {mib} MiB from /dev/urandom in {:.1} s",
        claim.display(),
        filled.elapsed().as_secs_f64()
    );

    let mut bench = Bench {
        docker,
        repo,
        data_dir,
        scope: scope.to_owned(),
        image: image.to_owned(),
        claim,
        agent_repo,
        hand_repo: backups.join("hand-repo"),
        hand_cache: dir.join("hand-cache"),
        password_file,
        address,
        version: 0,
    };
    let mut agent_runs = Vec::new();
    let mut hand_runs = Vec::new();
    let mut idle_changes = Vec::new();
    let mut busy_changes = Vec::new();
    for round in 0..rounds {
        let agent_first = round % 2 == 0;
        for agent_side in [agent_first, !agent_first] {
            settle(round, if agent_side { "agent" } else { "by hand" }).await?;
            if agent_side {
                let figures = agent_backup(&bench, &agent).await?;
                println!(
                    "round {}, agent backup: {:.2} s from the command, {} from `running`; RSS idle {:.1} MiB, max during {:.1} MiB",
                    round + 1,
                    figures.from_command.as_secs_f64(),
                    figures
                        .from_running
                        .map_or("never seen".to_owned(), |took| format!(
                            "{:.2} s",
                            took.as_secs_f64()
                        )),
                    figures.rss_idle as f64 / 1024.0,
                    figures.rss_max as f64 / 1024.0,
                );
                agent_runs.push(figures);
            } else {
                let took = hand_backup(&bench)?;
                println!(
                    "round {}, restic backup by hand: {:.2} s",
                    round + 1,
                    took.as_secs_f64()
                );
                hand_runs.push(took);
            }
        }
        for busy in [!agent_first, agent_first] {
            settle(
                round,
                if busy {
                    "change during a backup"
                } else {
                    "change, no backup"
                },
            )
            .await?;
            let took = change(&mut bench, &agent, busy).await?;
            println!(
                "round {}, web changed → new replica running, {}: {:.2} s",
                round + 1,
                if busy {
                    "while the agent backs up"
                } else {
                    "no backup running"
                },
                took.as_secs_f64()
            );
            if busy {
                busy_changes.push(took);
            } else {
                idle_changes.push(took);
            }
        }
    }
    agent.stop();
    print_table(
        mib,
        rounds,
        &agent_runs,
        &mut hand_runs,
        &mut idle_changes,
        &mut busy_changes,
    );
    if !support::measuring() {
        println!("(smoke run of the bench; these figures are not a measurement)");
    }
    Ok(())
}

async fn settle(round: usize, side: &str) -> Result {
    // The smoke run shares the machine with the test suite: it never goes quiet.
    if !support::measuring() {
        return Ok(());
    }
    let settled = support::settle(Duration::from_secs(60)).await?;
    println!(
        "round {}, {side}: machine quiet after {:.1} s",
        round + 1,
        settled.as_secs_f64()
    );
    Ok(())
}

fn print_table(
    mib: u64,
    rounds: usize,
    agent_runs: &[AgentBackup],
    hand_runs: &mut [Duration],
    idle_changes: &mut [Duration],
    busy_changes: &mut [Duration],
) {
    let secs = |values: &[Duration]| {
        values
            .iter()
            .map(|value| format!("{:.2}", value.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut from_command: Vec<Duration> = agent_runs.iter().map(|run| run.from_command).collect();
    let mut from_running: Vec<Duration> = agent_runs
        .iter()
        .filter_map(|run| run.from_running)
        .collect();
    let mut waits: Vec<Duration> = agent_runs
        .iter()
        .filter_map(|run| Some(run.from_command.saturating_sub(run.from_running?)))
        .collect();
    println!();
    println!(
        "runs (s): agent from the command {}; agent from `running` {}; by hand {}; change with no backup {}; change during a backup {}",
        secs(&from_command),
        secs(&from_running),
        secs(hand_runs),
        secs(idle_changes),
        secs(busy_changes)
    );
    let kib_median = |values: Vec<i64>| {
        let mut values = values;
        values.sort_unstable();
        values[values.len() / 2] as f64 / 1024.0
    };
    let rss_idle = kib_median(agent_runs.iter().map(|run| run.rss_idle as i64).collect());
    let rss_max = kib_median(agent_runs.iter().map(|run| run.rss_max as i64).collect());
    let rss_growth = kib_median(
        agent_runs
            .iter()
            .map(|run| run.rss_max as i64 - run.rss_idle as i64)
            .collect(),
    );
    let hand = support::median(hand_runs).as_secs_f64();
    let command = support::median(&mut from_command).as_secs_f64();
    println!("| figure (medians of {rounds} rounds, sides alternated) | measured | goal |");
    println!("|---|---|---|");
    println!(
        "| {mib} MiB claim backed up (empty repository), agent from the command to `succeeded` / `restic backup` by hand | {command:.2} s / {hand:.2} s = {:.3} | ≤ 1.10 |",
        command / hand
    );
    if from_running.is_empty() {
        println!("| … agent from `running` to `succeeded` | never seen `running` | ≤ 1.10 |");
    } else {
        let running = support::median(&mut from_running).as_secs_f64();
        println!(
            "| … agent from the run seen `running` to `succeeded` / by hand | {running:.2} s / {hand:.2} s = {:.3} | ≤ 1.10 |",
            running / hand
        );
        println!(
            "| … of which the command to `running` (the backup scheduler's pick-up) | {:.2} s | |",
            support::median(&mut waits).as_secs_f64()
        );
    }
    println!(
        "| agent VmRSS idle before / max during the backup (100 ms samples) / difference | {rss_idle:.1} MiB / {rss_max:.1} MiB / {rss_growth:+.1} MiB | within 2 MiB |"
    );
    let busy = support::median(busy_changes).as_secs_f64();
    let idle = support::median(idle_changes).as_secs_f64();
    println!(
        "| unrelated deployment changed → its new replica running, during a backup / no backup | {busy:.2} s / {idle:.2} s = {:.3} | |",
        busy / idle
    );
}

/// `web`'s manifest: one replica whose env holds `version`.
fn web(scope: &str, image: &str, version: u32) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = 1
  env      = {{ V = "{version}" }}
}}
"#
    )
}

/// Fills `dir` with `mib` MiB of /dev/urandom, in files of [`FILE_MIB`].
fn fill(dir: &Path, mib: u64) -> Result {
    let mut left = mib;
    let mut index = 0;
    while left > 0 {
        let size = left.min(FILE_MIB);
        let mut source = std::fs::File::open("/dev/urandom")?.take(size * 1024 * 1024);
        let mut file = std::fs::File::create(dir.join(format!("fill-{index:03}.bin")))?;
        std::io::copy(&mut source, &mut file)?;
        file.sync_all()?;
        left -= size;
        index += 1;
    }
    Ok(())
}

/// An empty, initialised repository at `path` (what was there removed first).
fn fresh_repo(path: &Path, password_file: &Path) -> Result {
    if path.exists() {
        std::fs::remove_dir_all(path)?;
    }
    let output = Command::new("restic")
        .arg("--repo")
        .arg(path)
        .args(["init", "--quiet"])
        .env("RESTIC_PASSWORD_FILE", password_file)
        .output()?;
    if !output.status.success() {
        return Err(format!("restic init: {}", String::from_utf8_lossy(&output.stderr)).into());
    }
    Ok(())
}

/// `voodu-agent ARGS --data-dir D`: its stdout.
fn cli(data_dir: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new(support::agent())
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .stdin(Stdio::null())
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "voodu-agent {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// Asks the agent for a backup of `db`; the run's id.
fn request_backup(bench: &Bench<'_>) -> Result<i64> {
    let printed = cli(&bench.data_dir, &["backup", &format!("{}/db", bench.scope)])?;
    let after = printed
        .split("run #")
        .nth(1)
        .ok_or_else(|| format!("no run id printed: {printed}"))?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    Ok(digits.parse()?)
}

/// Polls `backups --json` every [`POLL`] until run `id`'s state is one of `states`; the state
/// and when it was seen.
async fn poll_run(bench: &Bench<'_>, id: i64, states: &[&str]) -> Result<(String, Instant)> {
    let started = Instant::now();
    loop {
        let listed = cli(
            &bench.data_dir,
            &["backups", &format!("{}/db", bench.scope), "--json"],
        )?;
        let seen = Instant::now();
        let runs: Vec<serde_json::Value> = serde_json::from_str(&listed)?;
        if let Some(run) = runs.iter().find(|run| run["id"] == id) {
            let state = run["state"].as_str().unwrap_or("");
            if states.contains(&state) {
                if ["failed", "superseded"].contains(&state) {
                    return Err(format!("backup run #{id} ended {state}: {run}").into());
                }
                return Ok((state.to_owned(), seen));
            }
        }
        if started.elapsed() > LIMIT {
            return Err(format!("backup run #{id} never reached {states:?}").into());
        }
        tokio::time::sleep(POLL).await;
    }
}

const ENDED: &[&str] = &["succeeded", "failed", "superseded"];

/// The agent's side: a backup into an empty repository, timed from the command, and from the
/// run seen `running`, with the agent's RSS sampled throughout.
async fn agent_backup(bench: &Bench<'_>, agent: &AgentProcess) -> Result<AgentBackup> {
    fresh_repo(&bench.agent_repo, &bench.password_file)?;
    let pid = agent.pid();
    let rss_idle = memory_kib(pid, "VmRSS")?;
    let sampler = Sampler::start(pid);
    let started = Instant::now();
    let id = request_backup(bench)?;
    let mut states = vec!["running"];
    states.extend_from_slice(ENDED);
    let (state, seen) = poll_run(bench, id, &states).await?;
    let running = (state == "running").then_some(seen);
    let (_, ended) = poll_run(bench, id, ENDED).await?;
    let rss_max = sampler.stop()?.max(rss_idle);
    Ok(AgentBackup {
        from_command: ended - started,
        from_running: running.map(|running| ended - running),
        rss_idle,
        rss_max,
    })
}

/// The baseline: `restic backup` of the claim's directory by hand, into an empty repository.
fn hand_backup(bench: &Bench<'_>) -> Result<Duration> {
    fresh_repo(&bench.hand_repo, &bench.password_file)?;
    if bench.hand_cache.exists() {
        std::fs::remove_dir_all(&bench.hand_cache)?;
    }
    let started = Instant::now();
    let output = Command::new("restic")
        .arg("--repo")
        .arg(&bench.hand_repo)
        .args(["backup", "."])
        .current_dir(&bench.claim)
        .env("RESTIC_PASSWORD_FILE", &bench.password_file)
        .env("RESTIC_CACHE_DIR", &bench.hand_cache)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    let took = started.elapsed();
    if !output.status.success() {
        return Err(format!(
            "restic backup by hand: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(took)
}

/// A change of `web`'s env, committed and announced by webhook, until the engine runs a
/// `web` container of another manifest hash; with `busy`, while the agent backs up the claim
/// (asked for first, and seen `running` before the commit; waited for to succeed after).
async fn change(bench: &mut Bench<'_>, agent: &AgentProcess, busy: bool) -> Result<Duration> {
    let old = web_containers(bench)
        .await?
        .pop()
        .ok_or("no web replica running")?;
    let backup = if busy {
        fresh_repo(&bench.agent_repo, &bench.password_file)?;
        let id = request_backup(bench)?;
        let (state, _) = poll_run(bench, id, &["running", "succeeded"]).await?;
        if state != "running" {
            println!("  (the backup ended before the change could be committed)");
        }
        Some(id)
    } else {
        None
    };
    bench.version += 1;
    bench
        .repo
        .write("web.hcl", &web(&bench.scope, &bench.image, bench.version))?;
    let sha = bench.repo.commit(&format!("web v{}", bench.version))?;
    let started = Instant::now();
    let body = format!(r#"{{"ref":"refs/heads/main","after":"{sha}"}}"#);
    let address = bench.address.clone();
    let webhook = tokio::task::spawn_blocking(move || support::post(&address, "/hooks/git", &body));
    let took = loop {
        if web_containers(bench).await?.iter().any(|hash| *hash != old) {
            break started.elapsed();
        }
        if started.elapsed() > LIMIT {
            return Err("web's new replica never ran".into());
        }
        tokio::time::sleep(POLL).await;
    };
    let (status, answer, _) = webhook.await??;
    if !(200..300).contains(&status) {
        return Err(format!("webhook answered {status}: {answer}").into());
    }
    if let Some(id) = backup {
        poll_run(bench, id, ENDED).await?;
    }
    // The old replica gone and web Ready again before the next side.
    let key = ResourceKey::new(Kind::Deployment, &bench.scope, "web");
    agent
        .ready(std::slice::from_ref(&key), Instant::now(), LIMIT)
        .await?;
    wait_single_web(bench).await?;
    Ok(took)
}

/// The manifest hashes of the running `web` containers.
async fn web_containers(bench: &Bench<'_>) -> Result<Vec<String>> {
    let filters = HashMap::from([(
        "label".to_owned(),
        vec![
            format!("voodu.scope={}", bench.scope),
            "voodu.name=web".to_owned(),
        ],
    )]);
    let options = ListContainersOptionsBuilder::default()
        .filters(&filters)
        .build();
    let containers = bench.docker.list_containers(Some(options)).await?;
    Ok(containers
        .into_iter()
        .filter(|container| {
            container.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
        })
        .filter_map(|container| container.labels?.get("voodu.manifest_hash").cloned())
        .collect())
}

/// Waits until one `web` container runs (the rollout's old one removed).
async fn wait_single_web(bench: &Bench<'_>) -> Result {
    let started = Instant::now();
    while web_containers(bench).await?.len() != 1 {
        if started.elapsed() > LIMIT {
            return Err("web never came back to one replica".into());
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// The largest VmRSS of a process, sampled every [`SAMPLE`] on a thread until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<u64>>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut max = 0;
            while !flag.load(Ordering::Relaxed) {
                max = max.max(memory_kib(pid, "VmRSS")?);
                std::thread::sleep(SAMPLE);
            }
            Ok(max.max(memory_kib(pid, "VmRSS")?))
        });
        Sampler { stop, thread }
    }

    /// The largest sample, in KiB.
    fn stop(self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| "the RSS sampler panicked")?
    }
}
