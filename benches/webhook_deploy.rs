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
//! Prints every run and the medians; the goal is agent / baseline ≤ 1.25. Run with
//! `cargo bench --bench webhook_deploy` (`VOODU_BENCH_RUNS`, default 7). Without a Docker
//! engine it prints SKIPPED and exits 0. Timings are printed, never asserted. Under
//! `cargo test --all-targets` (no `--bench` argument) it runs once as a smoke test of the
//! bench itself, and says its figures are not a measurement.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, NetworkCreateRequest, NetworkingConfig,
    RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};
use futures_util::future::join_all;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const AGENT: &str = env!("CARGO_BIN_EXE_voodu-agent");
const REPLICAS: usize = 10;
const NETWORK: &str = "voodu0";

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

async fn bench() -> Result {
    let measuring = std::env::args().any(|arg| arg == "--bench");
    if !measuring && std::env::var("VOODU_DOCKER_TESTS").as_deref() != Ok("1") {
        println!(
            "SKIPPED webhook_deploy smoke run: needs a Docker engine; set VOODU_DOCKER_TESTS=1 (scripts/test does)"
        );
        return Ok(());
    }
    let docker = match connect().await {
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
    ensure_network(&docker).await?;
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
    println!(
        "ratio agent / bollard (to running): {:.3} (goal <= 1.25)",
        running.as_secs_f64() / baseline.as_secs_f64()
    );
    Ok(())
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

async fn connect() -> Result<Docker> {
    let docker = Docker::connect_with_local_defaults()?
        .negotiate_version()
        .await?;
    docker.ping().await?;
    Ok(docker)
}

async fn ensure_network(docker: &Docker) -> Result {
    if docker.inspect_network(NETWORK, None).await.is_err() {
        let request = NetworkCreateRequest {
            name: NETWORK.to_owned(),
            driver: Some("bridge".to_owned()),
            ..NetworkCreateRequest::default()
        };
        docker.create_network(request).await?;
    }
    Ok(())
}

fn unique(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    format!("{prefix}{:08x}", hasher.finish() as u32)
}

/// Containers labelled with `scope`, and how many of them run.
async fn running(docker: &Docker, scope: &str) -> Result<(Vec<String>, usize)> {
    let filters = HashMap::from([("label".to_owned(), vec![format!("voodu.scope={scope}")])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let containers = docker.list_containers(Some(options)).await?;
    let n_running = containers
        .iter()
        .filter(|container| {
            container.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
        })
        .count();
    Ok((
        containers
            .into_iter()
            .filter_map(|container| container.id)
            .collect(),
        n_running,
    ))
}

async fn wait_running(docker: &Docker, scope: &str, started: Instant) -> Result<Duration> {
    loop {
        if running(docker, scope).await?.1 >= REPLICAS {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!("{REPLICAS} replicas of {scope} never ran").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn remove_scope(docker: &Docker, scope: &str) -> Result {
    let (ids, _) = running(docker, scope).await?;
    let options = RemoveContainerOptionsBuilder::default().force(true).build();
    for id in ids {
        let _ = docker.remove_container(&id, Some(options.clone())).await;
    }
    Ok(())
}

/// The baseline: 10 containers as the agent would make them, created and started at once.
async fn bollard_direct(docker: &Docker, image: &str) -> Result<Duration> {
    let scope = unique("benchb");
    let started = Instant::now();
    let creates = (0..REPLICAS).map(|index| {
        let scope = scope.clone();
        async move {
            let name = format!("{scope}-web.{index:04x}");
            let labels = HashMap::from([
                ("createdby".to_owned(), "voodu".to_owned()),
                ("voodu.kind".to_owned(), "deployment".to_owned()),
                ("voodu.scope".to_owned(), scope.clone()),
                ("voodu.name".to_owned(), "web".to_owned()),
                ("voodu.replica_id".to_owned(), format!("{index:04x}")),
            ]);
            let body = ContainerCreateBody {
                image: Some(image.to_owned()),
                cmd: Some(vec!["sleep".to_owned(), "3600".to_owned()]),
                env: Some(vec![
                    format!("VOODU_NAME=web"),
                    format!("VOODU_SCOPE={scope}"),
                ]),
                labels: Some(labels),
                host_config: Some(HostConfig {
                    restart_policy: Some(RestartPolicy {
                        name: Some(RestartPolicyNameEnum::UNLESS_STOPPED),
                        maximum_retry_count: None,
                    }),
                    init: Some(true),
                    extra_hosts: Some(vec!["host.docker.internal:host-gateway".to_owned()]),
                    network_mode: Some(NETWORK.to_owned()),
                    ..HostConfig::default()
                }),
                networking_config: Some(NetworkingConfig {
                    endpoints_config: Some(HashMap::from([(
                        NETWORK.to_owned(),
                        EndpointSettings {
                            aliases: Some(vec![format!("web.{scope}")]),
                            ..EndpointSettings::default()
                        },
                    )])),
                }),
                ..ContainerCreateBody::default()
            };
            let options = CreateContainerOptionsBuilder::default().name(&name).build();
            let created = docker.create_container(Some(options), body).await?;
            docker.start_container(&created.id, None).await?;
            Ok::<_, bollard::errors::Error>(())
        }
    });
    let results = join_all(creates).await;
    let result = match results.into_iter().find(|result| result.is_err()) {
        Some(Err(error)) => Err(error.into()),
        _ => wait_running(docker, &scope, started).await,
    };
    remove_scope(docker, &scope).await?;
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
    let scope = unique("bencha");
    let repo = Repo::new(dir.path())?;
    repo.write("README.md", "bench\n")?;
    let initial = repo.commit("initial")?;
    let data_dir = dir.path().join("data");
    let mut agent = AgentProcess::start(&repo, &data_dir, &dir.path().join("agent.log"))?;
    let result = async {
        let address = agent.synced(&initial).await?;
        repo.write(
            "web.hcl",
            &format!(
                "deployment \"{scope}\" \"web\" {{\n  image    = \"{image}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = {REPLICAS}\n}}\n"
            ),
        )?;
        let sha = repo.commit("web: 10 replicas")?;
        let started = Instant::now();
        let body = format!(r#"{{"ref":"refs/heads/main","after":"{sha}"}}"#);
        let webhook = tokio::task::spawn_blocking(move || post(&address, "/hooks/git?wait=true", &body));
        let running_at = wait_running(docker, &scope, started).await?;
        let (status, answer, arrived) = webhook.await??;
        if status != 200 {
            return Err(format!("webhook answered {status}: {answer}").into());
        }
        let answered = arrived.saturating_duration_since(started);
        let ready = agent.ready(&scope, started).await?;
        Ok(AgentTimes {
            answered,
            running: running_at,
            ready,
        })
    }
    .await;
    agent.stop();
    remove_scope(docker, &scope).await?;
    if result.is_err() {
        eprintln!(
            "agent log:\n{}",
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
        );
    }
    result
}

/// `POST path` with `body` over a plain socket → status, body and when the answer arrived.
fn post(address: &str, path: &str, body: &str) -> Result<(u16, String, Instant)> {
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    stream.write_all(
        format!(
            "POST {path} HTTP/1.0\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let arrived = Instant::now();
    let (head, body) = response.split_once("\r\n\r\n").ok_or("no end of headers")?;
    let status = head.split_whitespace().nth(1).ok_or("no status")?.parse()?;
    Ok((status, body.to_owned(), arrived))
}

/// A bare remote plus a working clone, driven with the git CLI.
struct Repo {
    work: PathBuf,
    remote: PathBuf,
}

impl Repo {
    fn new(dir: &Path) -> Result<Repo> {
        let repo = Repo {
            work: dir.join("work"),
            remote: dir.join("remote.git"),
        };
        git(dir, &["init", "-q", "--bare", "-b", "main", "remote.git"])?;
        git(dir, &["init", "-q", "-b", "main", "work"])?;
        git(
            &repo.work,
            &[
                "remote",
                "add",
                "origin",
                &repo.remote.display().to_string(),
            ],
        )?;
        Ok(repo)
    }

    fn write(&self, path: &str, contents: &str) -> Result {
        std::fs::write(self.work.join(path), contents)?;
        Ok(())
    }

    fn commit(&self, message: &str) -> Result<String> {
        git(&self.work, &["add", "-A"])?;
        git(&self.work, &["commit", "-q", "-m", message])?;
        git(&self.work, &["push", "-q", "origin", "HEAD:main"])?;
        git(&self.work, &["rev-parse", "HEAD"])
    }
}

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.invalid")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.invalid")
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

/// The agent binary, polling only hourly and not watching the repo: only the webhook
/// triggers the sync under test.
struct AgentProcess {
    child: Child,
    data_dir: PathBuf,
}

impl AgentProcess {
    fn start(repo: &Repo, data_dir: &Path, log: &Path) -> Result<AgentProcess> {
        let child = Command::new(AGENT)
            .args(["--repo", &format!("file://{}", repo.remote.display())])
            .args([
                "--interval",
                "1h",
                "--listen",
                "127.0.0.1:0",
                "--no-watch",
                "--log",
                "warn",
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()?;
        Ok(AgentProcess {
            child,
            data_dir: data_dir.to_owned(),
        })
    }

    fn store(&self) -> Option<voodu_agent::store::Store> {
        voodu_agent::store::Store::open_read_only(&self.data_dir.join("state.db")).ok()
    }

    /// Waits until the agent listens and has processed `commit`; returns its address.
    async fn synced(&mut self, commit: &str) -> Result<String> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(format!("the agent exited: {status}").into());
            }
            // Reads fail while the agent still creates its database: try again.
            if let Some(store) = self.store()
                && let (Ok(Some(address)), Ok(summary)) = (
                    store.meta(voodu_agent::agent::META_HTTP_ADDR),
                    store.commit_summary(),
                )
                && summary
                    .last_seen
                    .is_some_and(|seen| seen.sha.as_str() == commit)
            {
                return Ok(address);
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err("the agent never synced its first commit".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `status` says the deployment is Ready.
    async fn ready(&self, scope: &str, started: Instant) -> Result<Duration> {
        let key = voodu_agent::model::ResourceKey::new(
            voodu_agent::model::Kind::Deployment,
            scope,
            "web",
        );
        loop {
            if let Some(store) = self.store()
                && store
                    .status(&key)
                    .is_ok_and(|status| status.is_some_and(|status| status.phase == "Ready"))
            {
                return Ok(started.elapsed());
            }
            if started.elapsed() > Duration::from_secs(120) {
                return Err("the deployment never became Ready".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
