//! Benchmark: commit → plan, for 1,000 and 10,000 generated resources (issue 3).
//!
//! A real git repo in a temp dir holds N resources in 100 files (deployments with env,
//! ports, probes and an asset reference; one ingress and one asset per ten deployments).
//! Each run reads the commit's manifests from the object database (gix, no worktree), loads
//! them (parse, interpolate, validate, stamp digests) and plans them against a desired state
//! in which a tenth of the resources differ. Prints the median of each stage over the runs
//! (wall clock, and the CPU time of the thread doing it, which a machine loaded by other work
//! inflates far less) and the 10k/1k ratio against issue 15's goals. Run: `cargo bench --bench
//! plan`; `VOODU_BENCH_RUNS` (9) changes the runs, `VOODU_BENCH_ONLY=N` measures N resources
//! alone (for a profiler: `valgrind --tool=callgrind target/release/deps/plan-… --bench`).
//!
//! First it prints issue 29's two goal figures, before and after in one run (`goal_figures`):
//! commit → plan for 10,000 resources in 1,000 files when one file changed (goal ≤ 10 ms) and
//! when everything is new (goal ≤ 200 ms, files parsed on every core), each under the default
//! host policy, as the agent loads. Run: `cargo bench
//! --bench plan` (medians of `VOODU_BENCH_RUNS`, at least 3 meaningful); `VOODU_BENCH_ONLY=goal`
//! prints these alone, `VOODU_BENCH_PROFILE_CACHED=1` runs the cached side alone (a profiler's
//! view of a load that parses nothing).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use voodu_agent::git::{Source, SourceOptions};
use voodu_agent::manifest::{self, DecodeCache, LoadOptions, Manifest, Policy};
use voodu_agent::model::ResourceKey;
use voodu_agent::reconcile::plan::{Action, CurrentSpec, plan_all};

/// The agent binary's allocator (`src/main.rs`), so the figures are the agent's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs per size (`VOODU_BENCH_RUNS`, default 9).
fn n_runs() -> usize {
    std::env::var("VOODU_BENCH_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(9)
}

/// CPU time this thread has used (user + system).
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which lives for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Files the resources are spread over (`VOODU_BENCH_FILES`, default 100).
fn n_files() -> usize {
    std::env::var("VOODU_BENCH_FILES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100)
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args([
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.com",
        ])
        .args(args)
        .current_dir(dir)
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

/// The manifests of `n` resources, spread over `FILES` files; `variant` changes every tenth
/// deployment's image, so planning one variant against the other finds 10% to replace.
fn manifests(n: usize, variant: u32) -> BTreeMap<String, String> {
    manifests_in(n, n_files(), |_| variant)
}

/// The manifests of `n` resources in `n_files` files, file `f` at variant `variant(f)`.
fn manifests_in(
    n: usize,
    n_files: usize,
    variant_of: impl Fn(usize) -> u32,
) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let per_file = n.div_ceil(n_files);
    let mut made = 0;
    for file in 0..n_files {
        let variant = variant_of(file);
        let mut text = String::new();
        for i in 0..per_file {
            if made == n {
                break;
            }
            let id = file * per_file + i;
            let scope = format!("s{}", id % 50);
            let version = if id.is_multiple_of(10) { variant } else { 0 };
            if id % 10 == 1 {
                let _ = write!(
                    text,
                    "asset \"{scope}\" \"cfg{id}\" {{\n  conf = \"setting = {id}\\n\"\n}}\n\n"
                );
            } else if id % 10 == 2 {
                // Routes to the deployment two ids back, in that deployment's scope.
                let target = id - 2;
                let _ = write!(
                    text,
                    "ingress \"s{}\" \"web{id}\" {{\n  host = \"web{id}.example.com\"\n  service = \"web{target}\"\n  port = 8080\n  tls {{ email = \"ops@example.com\" }}\n}}\n\n",
                    target % 50
                );
            } else {
                // Mounts the asset of its group of ten.
                let asset = id - id % 10 + 1;
                let _ = write!(
                    text,
                    "deployment \"{scope}\" \"web{id}\" {{\n  image    = \"registry.example.com/app:{version}.{id}\"\n  command  = [\"serve\", \"--port\", \"8080\"]\n  replicas = {}\n  ports    = [\"8080\"]\n  env = {{\n    APP_ENV = \"production\"\n    LOG     = \"info\"\n    ID      = \"{id}\"\n  }}\n  volumes = [\"${{asset.s{}.cfg{asset}.conf}}:/etc/app.conf:ro\"]\n  probes {{\n    readiness {{\n      http_get {{\n        path = \"/health\"\n        port = 8080\n      }}\n      period = \"5s\"\n    }}\n  }}\n}}\n\n",
                    1 + id % 3,
                    asset % 50
                );
            }
            made += 1;
        }
        files.insert(format!("deploy/f{file:03}.hcl"), text);
    }
    files
}

fn write_commit(repo: &Path, files: &BTreeMap<String, String>, message: &str) {
    for (path, text) in files {
        let full = repo.join(path);
        std::fs::create_dir_all(full.parent().expect("has a parent")).expect("mkdir");
        std::fs::write(full, text).expect("write");
    }
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", message]);
}

/// The desired state a host holds once `manifest` is applied, as the store gives it back:
/// each spec with its own JSON, apart from the loaded resources.
fn desired_state(manifest: &Manifest) -> BTreeMap<ResourceKey, CurrentSpec> {
    manifest
        .resources
        .iter()
        .map(|resource| {
            let current = CurrentSpec::new(resource.spec.clone());
            (resource.key.clone(), current)
        })
        .collect()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

struct Figures {
    read: Duration,
    load: Duration,
    plan: Duration,
    total: Duration,
    /// CPU time of the whole read → plan.
    cpu: Duration,
}

fn bench(n: usize) -> Figures {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir");
    git(&repo, &["init", "-q", "-b", "main"]);
    write_commit(&repo, &manifests(n, 0), "current");
    write_commit(&repo, &manifests(n, 1), "next");
    let source = Source::new(
        SourceOptions {
            url: repo.display().to_string(),
            branch: "main".into(),
            paths: vec!["deploy".into()],
            token_file: None,
            ..Default::default()
        },
        &dir.path().join("data"),
    );
    let head = source.fetch(&AtomicBool::new(false)).expect("fetch");
    let options = LoadOptions::standalone();
    // The desired state the host holds now: the previous commit.
    let previous = {
        let mut previous = manifests(n, 0);
        let snapshot = voodu_agent::model::Snapshot {
            commit: head.clone(),
            files: std::mem::take(&mut previous)
                .into_iter()
                .map(|(path, text)| voodu_agent::model::SourceFile {
                    path,
                    contents: text.into_bytes(),
                })
                .collect(),
            refused: Vec::new(),
        };
        manifest::load(&snapshot, &options).expect("previous commit loads")
    };
    let current = desired_state(&previous);
    let mut read = Vec::new();
    let mut load = Vec::new();
    let mut plan = Vec::new();
    let mut total = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..n_runs() {
        let cpu_start = thread_cpu();
        let start = Instant::now();
        let snapshot = source.read_snapshot(&head).expect("read");
        let read_done = Instant::now();
        let manifest: Manifest = manifest::load(&snapshot, &options).expect("loads");
        let load_done = Instant::now();
        let plans = plan_all(&manifest, &current, &BTreeMap::new(), &BTreeMap::new());
        let plan_done = Instant::now();
        cpu.push(thread_cpu().saturating_sub(cpu_start));
        let replaced = plans
            .iter()
            .filter(|plan| plan.action == Action::Replace)
            .count();
        assert_eq!(manifest.resources.len(), n);
        assert!(
            replaced >= n / 20,
            "a tenth of the deployments change: {replaced}"
        );
        read.push(read_done - start);
        load.push(load_done - read_done);
        plan.push(plan_done - load_done);
        total.push(plan_done - start);
    }
    Figures {
        read: median(read),
        load: median(load),
        plan: median(plan),
        total: median(total),
        cpu: median(cpu),
    }
}

/// Resources and files of the goal figures (issue 29): 10,000 resources in 1,000 files.
const GOAL_RESOURCES: usize = 10_000;
const GOAL_FILES: usize = 1_000;

/// One side of a goal figure: read + load + plan, medians.
#[derive(Default)]
struct Side {
    read: Vec<Duration>,
    load: Vec<Duration>,
    plan: Vec<Duration>,
    total: Vec<Duration>,
}

impl Side {
    fn show(self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        format!(
            "{:.1} ms (read {:.1}, load {:.1}, plan {:.1})",
            ms(median(self.total)),
            ms(median(self.read)),
            ms(median(self.load)),
            ms(median(self.plan)),
        )
    }
}

/// Reads `head` through `source`, loads it through `cache` under the host policy the agent
/// starts with (the default: every load of the agent has one) and plans it against `current`.
fn measure(
    source: &Source,
    cache: &DecodeCache,
    head: &voodu_agent::model::CommitSha,
    current: &BTreeMap<ResourceKey, CurrentSpec>,
    side: &mut Side,
) {
    let options = LoadOptions::standalone();
    let start = Instant::now();
    let (snapshot, ids) = source.read_snapshot_with_ids(head).expect("read");
    let read_done = Instant::now();
    let policy = Policy::default();
    let manifest =
        manifest::load_cached(&snapshot, &ids, &options, Some(&policy), cache).expect("loads");
    let load_done = Instant::now();
    let plans = plan_all(&manifest, current, &BTreeMap::new(), &BTreeMap::new());
    let plan_done = Instant::now();
    assert_eq!(manifest.resources.len(), GOAL_RESOURCES);
    assert_eq!(plans.len(), GOAL_RESOURCES);
    side.read.push(read_done - start);
    side.load.push(load_done - read_done);
    side.plan.push(plan_done - load_done);
    side.total.push(plan_done - start);
}

/// The two goal figures, each side alternated within every run: "before" decodes every file
/// on one thread with no cache and reads every blob (a fresh `Source`), as the agent did;
/// "after" is the agent's path now (`Syncer`: one `Source`, one `DecodeCache`, every core).
/// One file changed: each run commits a new version of one file of the 1,000, and "after"
/// loads it with the other 999 cached from earlier runs. Everything new: "after" starts from
/// an empty cache and a fresh `Source` too.
fn goal_figures() -> [(Side, Side); 2] {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir");
    git(&repo, &["init", "-q", "-b", "main"]);
    write_commit(
        &repo,
        &manifests_in(GOAL_RESOURCES, GOAL_FILES, |_| 0),
        "base",
    );
    let data = dir.path().join("data");
    let source_options = SourceOptions {
        url: repo.display().to_string(),
        branch: "main".into(),
        paths: vec!["deploy".into()],
        token_file: None,
        ..Default::default()
    };
    let source = Source::new(source_options.clone(), &data);
    let base = source.fetch(&AtomicBool::new(false)).expect("fetch");
    let cache = DecodeCache::default();
    // The desired state the host holds: the base commit (loaded once, which warms the cache).
    let current = {
        let (snapshot, ids) = source.read_snapshot_with_ids(&base).expect("read");
        let loaded =
            manifest::load_cached(&snapshot, &ids, &LoadOptions::standalone(), None, &cache);
        desired_state(&loaded.expect("base loads"))
    };
    if std::env::var_os("VOODU_BENCH_PROFILE_CACHED").is_some() {
        // For a profiler: the cached side alone, every file a hit.
        let mut side = Side::default();
        for _ in 0..200 {
            measure(&source, &cache, &base, &current, &mut side);
        }
        println!("cached: {}", side.show());
        std::process::exit(0);
    }
    let before = || DecodeCache::new(0).with_threads(1);
    let (mut changed_off, mut changed_on) = (Side::default(), Side::default());
    let (mut new_off, mut new_on) = (Side::default(), Side::default());
    for run in 0..n_runs() {
        let variant = u32::try_from(run).expect("few runs") + 2;
        let one = manifests_in(GOAL_RESOURCES, GOAL_FILES, |file| {
            if file == GOAL_FILES / 2 { variant } else { 0 }
        });
        let path = format!("deploy/f{:03}.hcl", GOAL_FILES / 2);
        let changed: BTreeMap<String, String> =
            one.into_iter().filter(|(name, _)| *name == path).collect();
        write_commit(&repo, &changed, "one file");
        let head = source.fetch(&AtomicBool::new(false)).expect("fetch");
        let fresh = || Source::new(source_options.clone(), &data);
        measure(&fresh(), &before(), &head, &current, &mut changed_off);
        measure(&source, &cache, &head, &current, &mut changed_on);
        measure(&fresh(), &before(), &head, &current, &mut new_off);
        measure(
            &fresh(),
            &DecodeCache::default(),
            &head,
            &current,
            &mut new_on,
        );
    }
    [(changed_off, changed_on), (new_off, new_on)]
}

fn main() {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    // `cargo bench` passes `--bench`; under `cargo test` (a debug build) run a small smoke
    // pass only: it proves the pipeline works, and debug timings would mean nothing.
    if !std::env::args().any(|arg| arg == "--bench") {
        let figures = bench(200);
        println!(
            "plan bench smoke run (200 resources, debug build): {:.1} ms; real figures: cargo bench --bench plan",
            ms(figures.total)
        );
        return;
    }
    if let Some(only) = std::env::var("VOODU_BENCH_ONLY")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        let figures = bench(only);
        println!(
            "{only} resources: total {:.1} ms, CPU {:.1} ms (median of {})",
            ms(figures.total),
            ms(figures.cpu),
            n_runs()
        );
        return;
    }
    let goal_only = std::env::var("VOODU_BENCH_ONLY").is_ok_and(|only| only == "goal");
    let [changed, new] = goal_figures();
    println!(
        "commit → plan, {GOAL_RESOURCES} resources in {GOAL_FILES} files, median of {} runs, the sides alternated (read = gix tree read, load = parse + interpolate + validate, plan = diff against desired); before = one thread, no decode cache, every blob read; after = the agent now",
        n_runs()
    );
    println!();
    println!("| figure | before | after | goal |");
    println!("|---|---|---|---|");
    for (name, (off, on), goal) in [
        ("one file of 1,000 changed", changed, 10.0),
        ("everything new", new, 200.0),
    ] {
        println!(
            "| commit → plan, 10k resources, {name} | {} | {} | ≤ {goal} ms |",
            off.show(),
            on.show()
        );
    }
    if goal_only {
        return;
    }
    println!();
    println!(
        "{} files; commit → plan, median of {} runs (read = gix tree read, load = parse + interpolate + validate, plan = diff against desired; CPU = the calling thread's CPU time for all three: files are parsed on other threads too, so it no longer counts all the work)",
        n_files(),
        n_runs()
    );
    let small = bench(1_000);
    let large = bench(10_000);
    println!();
    println!("| figure | measured | goal |");
    println!("|---|---|---|");
    for (n, figures, goal) in [(1_000, &small, 25.0), (10_000, &large, 250.0)] {
        println!(
            "| commit → plan, {n} resources | {:.1} ms (read {:.1}, load {:.1}, plan {:.1}); CPU {:.1} ms | ≤ {goal} ms |",
            ms(figures.total),
            ms(figures.read),
            ms(figures.load),
            ms(figures.plan),
            ms(figures.cpu),
        );
    }
    println!(
        "| commit → plan, 10k / 1k | {:.2} (CPU {:.2}) | ≤ 11 |",
        ms(large.total) / ms(small.total),
        ms(large.cpu) / ms(small.cpu)
    );
}
