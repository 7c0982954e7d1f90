//! Benchmark: the agent's own cost without an engine (issue 15), in process on the fake
//! runtime, for 1,000 deployments of one replica each (`VOODU_BENCH_RESOURCES`), one per file
//! (`VOODU_BENCH_PER_FILE`: issue 54's figure is 10,000 in files of 10):
//! - **first commit**: from the agent's start (the commit is already pushed) until every
//!   deployment is Ready, the CPU this process used meanwhile, and the runtime calls by verb;
//! - **one file changed** (`VOODU_BENCH_CHANGES` times, 3, another file each time): a commit
//!   that changes the env of one file's deployments, then its webhook: the time from sending
//!   the webhook to the first create call (issue 54: ≤ 50 ms at 10,000, median printed), until
//!   they are rolled and Ready, and the runtime calls it caused, split by whether they name a
//!   changed deployment (the goal is reconcile work for those only);
//! - **resync**: runtime `list` calls and CPU per resync with `--resync 1s` over a window, less
//!   the same window idle.
//!
//! The fake runtime answers at once, so what is timed is the agent alone: git, manifest, store
//! and reconciler. `cargo bench --bench overhead`; under `cargo test --all-targets` it runs
//! 50 resources as a smoke test of the bench itself. Figures are printed, never asserted.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{Repo, Result, cpu_time};
use tokio_util::sync::CancellationToken;
use voodu_agent::agent::{AgentConfig, HttpConfig};
use voodu_agent::git::SourceOptions;
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::reconcile::ReconcileOptions;
use voodu_agent::runtime::FakeRuntime;
use voodu_agent::store::Store;

/// The agent binary's allocator (`src/main.rs`), so the figures are the agent's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

fn deployment(name: &str, env: &str) -> String {
    format!(
        "deployment \"bench\" \"{name}\" {{\n  image   = \"voodu-busybox:latest\"\n  command = [\"sleep\", \"3600\"]\n  env     = {{ VERSION = \"{env}\" }}\n}}\n"
    )
}

/// Longer than a rollout's re-check (5 s after its first pass): no call for this long is quiet
/// (a fifth of it in a smoke run: `support::figure_wait`).
const QUIET: Duration = Duration::from_secs(6);

/// The agent in process on `repo` with the fake runtime; `resync` as `--resync`.
struct InProcess {
    fake: Arc<FakeRuntime>,
    store: Store,
    address: std::net::SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl InProcess {
    async fn start(
        repo: &Repo,
        data_dir: &std::path::Path,
        fake: Arc<FakeRuntime>,
        resync: Duration,
    ) -> Result<InProcess> {
        let config = AgentConfig {
            source: SourceOptions {
                url: repo.url(),
                branch: "main".into(),
                paths: Vec::new(),
                token_file: None,
                ..Default::default()
            },
            hosts: voodu_agent::model::HostSelection::every_host(),
            data_dir: data_dir.to_owned(),
            interval: Duration::from_secs(3600),
            sync: voodu_agent::sync::SyncOptions::new(data_dir.to_owned()),
            reconcile: ReconcileOptions {
                ready_settle: Duration::ZERO,
                resync,
                ..ReconcileOptions::default()
            },
            http: HttpConfig::default(),
            watch_local: false,
            adopt: false,
            service: Default::default(),
            notify: None,
            image_signing_key: None,
            sources: Vec::new(),
            previews: None,
        };
        let state_db = config.state_db();
        let shutdown = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let task = tokio::spawn(voodu_agent::agent::run_with_runtime(
            config,
            fake.clone(),
            Some(listener),
            shutdown.clone().cancelled_owned(),
        ));
        // The store exists once the agent has opened it.
        let store = support::store_once_opened(&state_db).await?;
        Ok(InProcess {
            fake,
            store,
            address,
            shutdown,
            task,
        })
    }

    /// Waits until `check` holds on the store (polled every 5 ms).
    async fn until(&self, what: &str, check: impl Fn(&Store) -> bool) -> Result {
        let started = Instant::now();
        while !check(&self.store) {
            if started.elapsed() > Duration::from_secs(600) {
                return Err(format!("never: {what}").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// Waits until the runtime has seen no call for `QUIET`; when the last call was seen.
    async fn quiet(&self) -> Result<Instant> {
        let mut seen = (self.fake.calls().len(), Instant::now());
        let started = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let n_calls = self.fake.calls().len();
            if n_calls != seen.0 {
                seen = (n_calls, Instant::now());
            } else if seen.1.elapsed() >= support::figure_wait(QUIET) {
                return Ok(seen.1);
            }
            if started.elapsed() > Duration::from_secs(600) {
                return Err("the agent never went quiet".into());
            }
        }
    }

    async fn stop(self) -> Result {
        self.shutdown.cancel();
        self.task.await??;
        Ok(())
    }
}

/// How many of each Ready.
fn n_ready(store: &Store) -> usize {
    store.statuses().map_or(0, |statuses| {
        statuses
            .iter()
            .filter(|(_, status)| status.phase == "Ready")
            .count()
    })
}

/// The bench's deployment names (`d` and five digits) a runtime call mentions.
fn deployments_named(call: &str) -> impl Iterator<Item = &str> {
    call.match_indices('d').filter_map(|(at, _)| {
        let name = call.get(at..at + 6)?;
        name[1..]
            .bytes()
            .all(|byte| byte.is_ascii_digit())
            .then_some(name)
    })
}

/// Calls by verb.
fn by_verb(calls: &[String]) -> BTreeMap<String, usize> {
    let mut verbs = BTreeMap::new();
    for call in calls {
        let verb = call.split_whitespace().next().unwrap_or_default();
        *verbs.entry(verb.to_owned()).or_insert(0) += 1;
    }
    verbs
}

/// `list` calls by the label keys they filter on (`agent` alone is a list of everything the
/// agent owns; `agent,kind,scope,name,role` one resource's replicas).
fn lists_by_filter(calls: &[String]) -> BTreeMap<String, usize> {
    let mut shapes = BTreeMap::new();
    for call in calls {
        let Some(filter) = call.strip_prefix("list ") else {
            continue;
        };
        let shape = filter
            .split(',')
            .filter_map(|pair| pair.split_once('=').map(|(key, _)| key))
            .map(|key| key.strip_prefix("voodu.").unwrap_or(key))
            .collect::<Vec<_>>()
            .join(",");
        *shapes.entry(shape).or_insert(0) += 1;
    }
    shapes
}

async fn bench() -> Result {
    let n: usize = if support::measuring() {
        support::env_number("VOODU_BENCH_RESOURCES", 1000.0)? as usize
    } else {
        println!("overhead: smoke run under `cargo test` (not a measurement; use `cargo bench`)");
        50
    };
    // Deployments per file: `VOODU_BENCH_PER_FILE` (1; issue 54's layout is 10,000 in files
    // of 10).
    let per_file = (support::env_number("VOODU_BENCH_PER_FILE", 1.0)? as usize).max(1);
    let n_files = n.div_ceil(per_file);
    let file_path = |file: usize| format!("apps/f{file:05}.hcl");
    let file_text = |file: usize, env: &str| {
        (file * per_file..((file + 1) * per_file).min(n))
            .map(|id| deployment(&format!("d{id:05}"), env))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let pid = std::process::id();
    let dir = tempfile::tempdir()?;
    let repo = Repo::new(dir.path())?;
    for file in 0..n_files {
        repo.write(&file_path(file), &file_text(file, "1"))?;
    }
    let first = repo.commit("every deployment")?;
    let data_dir = dir.path().join("data");
    println!(
        "overhead: {n} deployments x 1 replica in {n_files} files on the fake runtime, in process; {} build",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );

    // First commit: start → every deployment Ready.
    let cpu_before = cpu_time(pid)?;
    let started = Instant::now();
    let fake = Arc::new(FakeRuntime::new());
    let agent = InProcess::start(&repo, &data_dir, fake.clone(), Duration::from_secs(3600)).await?;
    agent
        .until(&format!("{n} deployments Ready"), |store| {
            n_ready(store) == n
        })
        .await?;
    let first_wall = started.elapsed();
    let first_cpu = cpu_time(pid)?.saturating_sub(cpu_before);
    let first_calls = agent.fake.calls();
    println!(
        "first commit {}: {n} Ready after {:.0} ms wall, {:.0} ms CPU; runtime calls {:?} ({:.1} per deployment)",
        &first[..8],
        first_wall.as_secs_f64() * 1000.0,
        first_cpu.as_secs_f64() * 1000.0,
        by_verb(&first_calls),
        first_calls.len() as f64 / n as f64
    );
    println!(
        "… of which lists by filter {:?}",
        lists_by_filter(&first_calls)
    );

    // Readiness rows and the passes they requeue go on after status says Ready, and a rollout's
    // last re-check comes 5 s after its first pass: wait until the runtime sees no call for
    // `QUIET`, and say how long that took.
    let quiet = agent.quiet().await?;
    println!(
        "… and quiet (no runtime call for {:.1} s) {:.0} ms after the start, {} runtime calls in all {:?} ({:.1} per deployment)",
        support::figure_wait(QUIET).as_secs_f64(),
        (quiet - started).as_secs_f64() * 1000.0,
        agent.fake.calls().len(),
        by_verb(&agent.fake.calls()),
        agent.fake.calls().len() as f64 / n as f64
    );
    // Idle: a window with nothing to do and no resync in it.
    let window = support::figure_wait(Duration::from_secs(10));
    let idle_before = cpu_time(pid)?;
    let calls_before = agent.fake.calls().len();
    tokio::time::sleep(window).await;
    let idle_cpu = cpu_time(pid)?.saturating_sub(idle_before);
    let idle_calls = agent.fake.calls()[calls_before..].to_vec();
    println!(
        "idle {:.0} s: {:.0} ms CPU (bench's own polling included), runtime calls {:?}{}",
        window.as_secs_f64(),
        idle_cpu.as_secs_f64() * 1000.0,
        by_verb(&idle_calls),
        idle_calls
            .first()
            .map(|call| format!(", the first: {call:?}"))
            .unwrap_or_default()
    );

    // One file changed among the files, `changes` times (a different file each time).
    let changes = if support::measuring() {
        (support::env_number("VOODU_BENCH_CHANGES", 3.0)? as usize).clamp(1, n_files)
    } else {
        1
    };
    let mut first_creates = Vec::new();
    for change in 0..changes {
        let file = (n_files / 2 + change) % n_files;
        let changed: Vec<String> = (file * per_file..((file + 1) * per_file).min(n))
            .map(|id| format!("d{id:05}"))
            .collect();
        repo.write(&file_path(file), &file_text(file, "2"))?;
        let commit = repo.commit("one file changes")?;
        let keys: Vec<ResourceKey> = changed
            .iter()
            .map(|name| ResourceKey::new(Kind::Deployment, "bench", name))
            .collect();
        let hashes_before: Vec<String> = keys
            .iter()
            .map(|key| {
                agent
                    .store
                    .status(key)
                    .map(|status| status.map(|status| status.spec_hash).unwrap_or_default())
            })
            .collect::<std::result::Result<_, _>>()?;
        let calls_before = agent.fake.calls().len();
        let cpu_before = cpu_time(pid)?;
        let started = Instant::now();
        let address = agent.address.to_string();
        let body = format!(r#"{{"ref":"refs/heads/main","after":"{commit}"}}"#);
        let (status, answer, _) =
            tokio::task::spawn_blocking(move || support::post(&address, "/hooks/git", &body))
                .await??;
        if !(200..300).contains(&status) {
            return Err(format!("webhook answered {status}: {answer}").into());
        }
        agent
            .until("the changed deployments rolled and Ready", |store| {
                keys.iter().zip(&hashes_before).all(|(key, before)| {
                    store.status(key).ok().flatten().is_some_and(|status| {
                        status.phase == "Ready" && &status.spec_hash != before
                    })
                }) && n_ready(store) == n
            })
            .await?;
        let change_wall = started.elapsed();
        let change_cpu = cpu_time(pid)?.saturating_sub(cpu_before);
        let calls = agent.fake.calls_by_name()[calls_before..].to_vec();
        // When the first create call of the change came, from the webhook's send.
        let first_create = calls
            .iter()
            .position(|call| call.starts_with("create "))
            .and_then(|at| agent.fake.call_instants().get(calls_before + at).copied())
            .ok_or("the change created nothing")?
            .saturating_duration_since(started);
        first_creates.push(first_create);
        let naming = |call: &&String| {
            deployments_named(call).any(|name| !changed.iter().any(|changed| changed == name))
        };
        let about_others: Vec<String> = calls.iter().filter(naming).cloned().collect();
        println!(
            "one file ({} deployments) changed among {n_files} ({n} deployments): webhook sent → first create call {:.1} ms; rolled and Ready after {:.0} ms wall, {:.0} ms CPU; runtime calls {:?}, of which {} name another deployment {:?}",
            changed.len(),
            first_create.as_secs_f64() * 1000.0,
            change_wall.as_secs_f64() * 1000.0,
            change_cpu.as_secs_f64() * 1000.0,
            by_verb(&calls),
            about_others.len(),
            by_verb(&about_others),
        );
    }
    println!(
        "| one file of {n_files} changed ({n} deployments declared): webhook sent → first create call, median of {changes} | {:.1} ms | ≤ 50 ms |",
        support::median(&mut first_creates).as_secs_f64() * 1000.0
    );
    agent.stop().await?;

    // Resync every second over the same host (the same fake): boot replay first visits every
    // key once, which the wait for the replay's last pass leaves out of the window.
    let agent = InProcess::start(&repo, &data_dir, fake, Duration::from_secs(1)).await?;
    let replayed = agent.fake.calls().len();
    agent
        .until("boot replay done", |_| {
            agent.fake.calls().len() >= replayed + n
        })
        .await?;
    tokio::time::sleep(support::figure_wait(Duration::from_secs(2))).await;
    let before = cpu_time(pid)?;
    let calls_before = agent.fake.calls().len();
    tokio::time::sleep(window).await;
    let resync_cpu = cpu_time(pid)?.saturating_sub(before);
    let resync_calls = by_verb(&agent.fake.calls()[calls_before..]);
    let n_lists = resync_calls.get("list").copied().unwrap_or(0).max(1);
    println!(
        "resync every 1 s for {:.0} s: runtime calls {resync_calls:?}; CPU {:.0} ms, less idle = {:.2} ms per list",
        window.as_secs_f64(),
        resync_cpu.as_secs_f64() * 1000.0,
        resync_cpu.saturating_sub(idle_cpu).as_secs_f64() * 1000.0 / n_lists as f64
    );
    agent.stop().await?;
    if !support::measuring() {
        println!("(smoke run of the bench; these figures are not a measurement)");
    }
    Ok(())
}
