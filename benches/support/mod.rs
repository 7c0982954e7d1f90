//! What the benches that drive the real binary and the engine share: a git repository made
//! with the git CLI (a bare remote and a working clone), the `voodu-agent` binary as a child
//! process with its store read beside it, figures of a process read from `/proc`, and the few
//! engine calls a baseline needs (bollard, as the agent uses it).
//!
//! Each bench includes this module with `mod support;` and uses part of it.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, HostConfigLogConfig, NetworkCreateRequest,
    NetworkingConfig, ResourcesUlimits, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    EventsOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};

pub type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[path = "../../tests/it/support/cosign.rs"]
pub mod cosign;
/// Debian's `docker-registry` and cosign signatures, as the Docker tests make them.
#[path = "../../tests/it/support/distribution.rs"]
pub mod distribution;

/// The name the shared test helpers use for `Result`.
pub type TestResult<T = ()> = Result<T>;

/// Polls `check` until it returns `Some`, or fails after `limit` with `what` (the shared test
/// helpers' wait; a liveness bound).
pub fn wait_until<T>(
    limit: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if start.elapsed() > limit {
            return Err(format!("timed out after {limit:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The binary under test: `VOODU_AGENT_BIN` when set (another build, to compare two versions
/// with the same bench), else the one cargo built with the bench's profile (release under
/// `cargo bench`).
pub fn agent() -> String {
    std::env::var("VOODU_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_voodu-agent").to_owned())
}

/// The engine's network every managed container joins.
pub const NETWORK: &str = "voodu0";

/// True under `cargo bench` (which passes `--bench`); false under `cargo test --all-targets`,
/// where a bench runs once, small, as a smoke test of itself.
pub fn measuring() -> bool {
    std::env::args().any(|arg| arg == "--bench")
}

/// A wait that only the figures need (memory settling, an idle or quiet window): `full` when
/// measuring, a fifth of it in a smoke run, which runs the same code but whose figures are
/// not a measurement (issue 25: the smoke runs are part of every `scripts/test`).
pub fn figure_wait(full: Duration) -> Duration {
    if measuring() { full } else { full / 5 }
}

/// Whether a bench that needs the engine may run: always when measuring, and under `cargo
/// test` only with `VOODU_DOCKER_TESTS=1` (scripts/test sets it). Prints SKIPPED otherwise.
pub fn engine_allowed(bench: &str) -> bool {
    if measuring() || std::env::var("VOODU_DOCKER_TESTS").as_deref() == Ok("1") {
        return true;
    }
    println!(
        "SKIPPED {bench} smoke run: needs a Docker engine; set VOODU_DOCKER_TESTS=1 (scripts/test does)"
    );
    false
}

/// `name` from the environment as a number, else `default`.
pub fn env_number(name: &str, default: f64) -> Result<f64> {
    match std::env::var(name) {
        Ok(text) => Ok(text
            .parse()
            .map_err(|error| format!("{name}={text}: {error}"))?),
        Err(_) => Ok(default),
    }
}

pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

pub fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// `prefix` and eight hex digits that differ from run to run.
pub fn unique(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    format!("{prefix}{:08x}", hasher.finish() as u32)
}

pub fn path_str(path: &Path) -> Result<&str> {
    Ok(path.to_str().ok_or("a non-UTF-8 temp path")?)
}

/// Runs git in `dir` with no user or system configuration; stdout, trimmed.
pub fn git(dir: &Path, args: &[&str]) -> Result<String> {
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

/// A bare remote plus a working clone on branch `main`, driven with the git CLI.
pub struct Repo {
    pub work: PathBuf,
    pub remote: PathBuf,
}

impl Repo {
    pub fn new(dir: &Path) -> Result<Repo> {
        let repo = Repo {
            work: dir.join("work"),
            remote: dir.join("remote.git"),
        };
        git(
            dir,
            &[
                "init",
                "-q",
                "--template=",
                "--bare",
                "-b",
                "main",
                "remote.git",
            ],
        )?;
        git(dir, &["init", "-q", "--template=", "-b", "main", "work"])?;
        git(
            &repo.work,
            &["remote", "add", "origin", path_str(&repo.remote)?],
        )?;
        Ok(repo)
    }

    /// Writes `contents` at `path` of the working clone, making its directories.
    pub fn write(&self, path: &str, contents: &str) -> Result {
        let path = self.work.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, contents)?;
        Ok(())
    }

    /// Commits everything and pushes it to the remote's `main`; the new commit's SHA.
    pub fn commit(&self, message: &str) -> Result<String> {
        git(&self.work, &["add", "-A"])?;
        git(&self.work, &["commit", "-q", "-m", message])?;
        git(&self.work, &["push", "-q", "origin", "HEAD:main"])?;
        git(&self.work, &["rev-parse", "HEAD"])
    }

    pub fn url(&self) -> String {
        format!("file://{}", self.remote.display())
    }
}

/// The agent binary as a child process on `repo`; killed when dropped.
pub struct AgentProcess {
    pub child: Child,
    pub data_dir: PathBuf,
}

impl AgentProcess {
    /// Starts `voodu-agent --repo <repo> --data-dir <data_dir>` with `args`, its stderr to `log`.
    pub fn start(repo: &Repo, data_dir: &Path, log: &Path, args: &[&str]) -> Result<AgentProcess> {
        AgentProcess::start_bin(&agent(), repo, data_dir, log, args)
    }

    /// `start` with another agent binary.
    pub fn start_bin(
        bin: &str,
        repo: &Repo,
        data_dir: &Path,
        log: &Path,
        args: &[&str],
    ) -> Result<AgentProcess> {
        let child = Command::new(bin)
            .args(["--repo", &repo.url()])
            .args(args)
            .arg("--data-dir")
            .arg(data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(log)?,
            )
            .spawn()?;
        Ok(AgentProcess {
            child,
            data_dir: data_dir.to_owned(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn store(&self) -> Option<voodu_agent::store::Store> {
        voodu_agent::store::Store::open_read_only(&self.data_dir.join("state.db")).ok()
    }

    /// Waits until the agent has seen `commit` (applied or rejected); its HTTP address when
    /// it listens.
    pub async fn synced(&mut self, commit: &str) -> Result<Option<String>> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(format!("the agent exited: {status}").into());
            }
            // Reads fail while the agent still creates its database: try again.
            if let Some(store) = self.store()
                && let Ok(summary) = store.commit_summary()
                && summary
                    .last_seen
                    .is_some_and(|seen| seen.sha.as_str() == commit)
            {
                return Ok(store
                    .meta(voodu_agent::agent::META_HTTP_ADDR)
                    .ok()
                    .flatten());
            }
            if started.elapsed() > Duration::from_secs(300) {
                return Err(format!("the agent never synced commit {commit}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every resource in `keys` has status Ready; how long since `started`.
    pub async fn ready(
        &self,
        keys: &[voodu_agent::model::ResourceKey],
        started: Instant,
        limit: Duration,
    ) -> Result<Duration> {
        loop {
            if let Some(store) = self.store()
                && keys.iter().all(|key| {
                    store
                        .status(key)
                        .is_ok_and(|status| status.is_some_and(|status| status.phase == "Ready"))
                })
            {
                return Ok(started.elapsed());
            }
            if started.elapsed() > limit {
                return Err(format!("{} resources never all became Ready", keys.len()).into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then a kill if it has not exited within 30 s.
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
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

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`, `RssAnon`, …).
pub fn memory_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|line| line.starts_with(&format!("{field}:")))
        .ok_or_else(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(line.split_whitespace().nth(1).ok_or("no value")?.parse()?)
}

/// `VmRSS` split into heap and stacks (`RssAnon`) and mapped files (`RssFile`: the binary's
/// and libraries' pages in use), with the thread count: where a process's memory is.
pub fn memory_line(pid: u32) -> Result<String> {
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))?
        .lines()
        .find_map(|line| line.strip_prefix("Threads:").map(|n| n.trim().to_owned()))
        .unwrap_or_default();
    Ok(format!(
        "VmRSS {:.1} MiB (RssAnon {:.1} MiB, RssFile {:.1} MiB), {threads} threads",
        memory_kib(pid, "VmRSS")? as f64 / 1024.0,
        memory_kib(pid, "RssAnon")? as f64 / 1024.0,
        memory_kib(pid, "RssFile")? as f64 / 1024.0,
    ))
}

/// CPU time (user + system) `pid` has used so far, from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Result<Duration> {
    // After the name: state is field 3, utime 14 and stime 15 (1-based, proc(5)).
    stat_cpu(pid, 11)
}

/// The CPU time of the processes `pid` started and waited for (`cutime` + `cstime`).
pub fn children_cpu_time(pid: u32) -> Result<Duration> {
    // After the name: cutime is field 16 and cstime 17 (1-based, proc(5)).
    stat_cpu(pid, 13)
}

/// Two adjacent tick counts of `/proc/PID/stat`, from `at` counting after the command name,
/// as a duration.
fn stat_cpu(pid: u32, at: usize) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces: fields count from the closing parenthesis.
    let after = stat.rsplit_once(')').ok_or("no ) in stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(at).ok_or("a short stat")?.parse::<u64>()?
        + fields.get(at + 1).ok_or("a short stat")?.parse::<u64>()?;
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = u64::try_from(per_second)
        .ok()
        .filter(|&hz| hz > 0)
        .unwrap_or(100);
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// `GET path` over a plain socket → status and body.
pub fn get(address: &str, path: &str) -> Result<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("no end of headers")?;
    let status = head.split_whitespace().nth(1).ok_or("no status")?.parse()?;
    Ok((status, body.to_owned()))
}

/// `POST path` with `body` over a plain socket → status, body and when the answer arrived.
pub fn post(address: &str, path: &str, body: &str) -> Result<(u16, String, Instant)> {
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
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

pub async fn connect() -> Result<Docker> {
    let docker = Docker::connect_with_local_defaults()?
        .negotiate_version()
        .await?;
    docker.ping().await?;
    Ok(docker)
}

pub async fn ensure_network(docker: &Docker) -> Result {
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

/// The create request the agent makes for a replica of `scope/name` (see
/// `reconcile/handlers/container.rs`), for the baselines.
pub fn replica_body(image: &str, scope: &str, name: &str, index: usize) -> ContainerCreateBody {
    let labels = HashMap::from([
        ("createdby".to_owned(), "voodu".to_owned()),
        ("voodu.kind".to_owned(), "deployment".to_owned()),
        ("voodu.scope".to_owned(), scope.to_owned()),
        ("voodu.name".to_owned(), name.to_owned()),
        ("voodu.replica_id".to_owned(), format!("{index:04x}")),
    ]);
    let ulimit = |name: &str, value: i64| ResourcesUlimits {
        name: Some(name.to_owned()),
        soft: Some(value),
        hard: Some(value),
    };
    ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: Some(vec!["sleep".to_owned(), "3600".to_owned()]),
        env: Some(vec![
            format!("VOODU_NAME={name}"),
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
            ulimits: Some(vec![
                ulimit("nofile", within_hard_limit(65_536, "Max open files")),
                ulimit("nproc", within_hard_limit(4_096, "Max processes")),
            ]),
            log_config: Some(HostConfigLogConfig {
                typ: Some("json-file".to_owned()),
                config: Some(HashMap::from([
                    ("max-size".to_owned(), "10m".to_owned()),
                    ("max-file".to_owned(), "3".to_owned()),
                ])),
            }),
            ..HostConfig::default()
        }),
        networking_config: Some(NetworkingConfig {
            endpoints_config: Some(HashMap::from([(
                NETWORK.to_owned(),
                EndpointSettings {
                    aliases: Some(vec![format!("{name}.{scope}")]),
                    ..EndpointSettings::default()
                },
            )])),
        }),
        ..ContainerCreateBody::default()
    }
}

/// `wanted` clamped to this process's hard limit `label` (as `/proc/self/limits` names it),
/// as the agent clamps voodu's default ulimits to what the host can grant.
fn within_hard_limit(wanted: i64, label: &str) -> i64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find_map(|line| line.strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().nth(1)?.parse::<i64>().ok())
        .map_or(wanted, |hard| wanted.min(hard))
}

/// The ids of the containers labelled `voodu.scope=scope` (stopped ones too), and how many run.
pub async fn scope_containers(docker: &Docker, scope: &str) -> Result<(Vec<String>, usize)> {
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

/// Waits until the machine is quiet (at least 90 % of its CPU idle over one second), at
/// most `limit`: removing hundreds of containers leaves work behind in the kernel and the
/// engine (network namespaces, mounts) that would otherwise be charged to whatever is timed
/// next. Returns how long it waited.
pub async fn settle(limit: Duration) -> Result<Duration> {
    fn busy_and_total() -> Result<(u64, u64)> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .ok_or("an empty /proc/stat")?
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()?;
        let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
        let total: u64 = fields.iter().sum();
        Ok((total - idle, total))
    }
    let started = Instant::now();
    while started.elapsed() < limit {
        let (busy, total) = busy_and_total()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (busy_after, total_after) = busy_and_total()?;
        let elapsed = total_after.saturating_sub(total).max(1);
        if (busy_after.saturating_sub(busy) as f64) / (elapsed as f64) < 0.10 {
            break;
        }
    }
    Ok(started.elapsed())
}

/// Waits until `n` containers of `scope` run; how long since `started`. It follows the
/// containers' `start` events (replayed from `started`'s second, so none is missed) and lists
/// the scope only when `n` have started, or after a second without a start: a list makes the
/// engine walk every container on the host, and polling one every few milliseconds would
/// load the engine of the side being timed (the baselines list once, at their end).
pub async fn wait_running(
    docker: &Docker,
    scope: &str,
    n: usize,
    started: Instant,
    limit: Duration,
) -> Result<Duration> {
    use futures_util::StreamExt as _;
    let since = std::time::SystemTime::now()
        .checked_sub(started.elapsed())
        .unwrap_or(std::time::UNIX_EPOCH)
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        .to_string();
    let filters = HashMap::from([
        ("type".to_owned(), vec!["container".to_owned()]),
        ("event".to_owned(), vec!["start".to_owned()]),
        ("label".to_owned(), vec![format!("voodu.scope={scope}")]),
    ]);
    let options = EventsOptionsBuilder::default()
        .since(&since)
        .filters(&filters)
        .build();
    let mut events = docker.events(Some(options));
    let mut seen = std::collections::HashSet::new();
    let mut look = true;
    loop {
        if look && scope_containers(docker, scope).await?.1 >= n {
            return Ok(started.elapsed());
        }
        let left = limit.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(format!("{n} containers of {scope} never ran").into());
        }
        look = match tokio::time::timeout(left.min(Duration::from_secs(1)), events.next()).await {
            Ok(Some(event)) => {
                if let Some(id) = event?.actor.and_then(|actor| actor.id) {
                    seen.insert(id);
                }
                seen.len() >= n
            }
            Ok(None) => return Err("the engine ended its event stream".into()),
            // A second without a start: look (a replica may have been replaced).
            Err(_) => true,
        };
    }
}

/// Removes every container of `scope`, 16 at a time.
pub async fn remove_scope(docker: &Docker, scope: &str) -> Result {
    let (ids, _) = scope_containers(docker, scope).await?;
    let options = RemoveContainerOptionsBuilder::default().force(true).build();
    for chunk in ids.chunks(16) {
        let removals = chunk
            .iter()
            .map(|id| docker.remove_container(id, Some(options.clone())));
        for result in futures_util::future::join_all(removals).await {
            if let Err(error) = result {
                eprintln!("cleanup: {error}");
            }
        }
    }
    Ok(())
}

/// The store of an agent started in process, once the agent has opened (and made) it.
pub async fn store_once_opened(state_db: &Path) -> Result<voodu_agent::store::Store> {
    let started = Instant::now();
    loop {
        if let Ok(store) = voodu_agent::store::Store::open_read_only(state_db)
            && store.commit_summary().is_ok()
        {
            return Ok(store);
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err("the agent never opened its store".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
