//! Benchmark: the agent's resident memory after many large rejected commits (issue 10).
//!
//! The real `voodu-agent` binary watches a local repository (first commit: no manifests, so
//! nothing runs on the engine), then gets N commits, one after the other, each replacing one
//! `broken.hcl` of M MB whose every block has an unknown attribute: every commit is rejected
//! with thousands of diagnostics. Printed from `/proc/PID/status`: VmRSS when idle before,
//! VmHWM (the peak), and VmRSS when idle after; the goal is after ≤ 1.5 × idle before.
//!
//! `cargo bench --bench memory` (release build): 200 commits of 5 MB
//! (`VOODU_BENCH_COMMITS`, `VOODU_BENCH_COMMIT_MB` change them). The agent connects to the
//! Docker engine at start (it creates nothing on it); without one this prints SKIPPED and
//! exits 0. Figures are printed, never asserted. Under `cargo test --all-targets` (no
//! `--bench` argument) it runs 3 commits of 0.1 MB as a smoke test of the bench itself,
//! when `VOODU_DOCKER_TESTS=1`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const AGENT: &str = env!("CARGO_BIN_EXE_voodu-agent");

fn main() -> Result {
    let measuring = std::env::args().any(|arg| arg == "--bench");
    if !measuring && std::env::var("VOODU_DOCKER_TESTS").as_deref() != Ok("1") {
        println!(
            "SKIPPED memory smoke run: needs a Docker engine; set VOODU_DOCKER_TESTS=1 (scripts/test does)"
        );
        return Ok(());
    }
    if !Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
    {
        println!("SKIPPED memory: no Docker engine answers");
        return Ok(());
    }
    let (n_commits, commit_bytes) = if measuring {
        (
            env_number("VOODU_BENCH_COMMITS", 200.0)? as usize,
            (env_number("VOODU_BENCH_COMMIT_MB", 5.0)? * 1024.0 * 1024.0) as usize,
        )
    } else {
        (3, 100 * 1024)
    };
    let root = tempfile::tempdir()?;
    let remote = root.path().join("remote.git");
    let work = root.path().join("work");
    let data = root.path().join("data");
    git(
        root.path(),
        &["init", "-q", "--bare", "-b", "main", path_str(&remote)?],
    )?;
    git(
        root.path(),
        &["clone", "-q", path_str(&remote)?, path_str(&work)?],
    )?;
    git(&work, &["config", "user.email", "bench@voodu.invalid"])?;
    git(&work, &["config", "user.name", "bench"])?;
    git(&work, &["checkout", "-q", "-b", "main"])?;
    std::fs::write(work.join("README.md"), "no manifests yet\n")?;
    let first = commit_and_push(&work, "start")?;
    let mut agent = Agent(
        Command::new(AGENT)
            .args([
                "--repo",
                path_str(&remote)?,
                "--interval",
                "1s",
                "--listen",
                "off",
            ])
            .args([
                "--no-ingress",
                "--log",
                "warn",
                "--data-dir",
                path_str(&data)?,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let pid = agent.0.id();
    wait_for(&data, "last_applied", &first, &mut agent)?;
    std::thread::sleep(Duration::from_secs(3));
    let idle = memory_kib(pid, "VmRSS")?;
    let idle_anon = memory_kib(pid, "RssAnon")?;
    println!(
        "{} binary; idle before: VmRSS {} KiB (RssAnon {idle_anon} KiB); pushing {n_commits} rejected commits of {:.1} MB",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        idle,
        commit_bytes as f64 / 1024.0 / 1024.0
    );
    let started = Instant::now();
    for index in 0..n_commits {
        std::fs::write(
            work.join("broken.hcl"),
            broken_manifest(index, commit_bytes),
        )?;
        let sha = commit_and_push(&work, &format!("broken {index}"))?;
        wait_for(&data, "last_rejected", &sha, &mut agent)?;
        if (index + 1) % (n_commits / 8).max(1) == 0 {
            println!(
                "  {:>3} rejected after {:>5.0} s: VmRSS {} KiB",
                index + 1,
                started.elapsed().as_secs_f64(),
                memory_kib(pid, "VmRSS")?
            );
        }
    }
    std::thread::sleep(Duration::from_secs(5));
    let after = memory_kib(pid, "VmRSS")?;
    let peak = memory_kib(pid, "VmHWM")?;
    println!(
        "idle before: VmRSS {idle} KiB | peak VmHWM {peak} KiB | idle after: VmRSS {after} KiB | after / before = {:.2} (goal ≤ 1.5)",
        after as f64 / idle as f64
    );
    println!(
        "idle after, of which: RssAnon {} KiB, RssFile {} KiB (mapped pack files, the binary)",
        memory_kib(pid, "RssAnon")?,
        memory_kib(pid, "RssFile")?
    );
    if !measuring {
        println!("(smoke run of the bench; these figures are not a measurement)");
    }
    Ok(())
}

/// Kills the agent when the bench ends, however it ends.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn env_number(name: &str, default: f64) -> Result<f64> {
    match std::env::var(name) {
        Ok(text) => Ok(text.parse()?),
        Err(_) => Ok(default),
    }
}

fn path_str(path: &Path) -> Result<&str> {
    Ok(path.to_str().ok_or("a non-UTF-8 temp path")?)
}

/// About `bytes` of well-formed HCL in which every block has an unknown attribute (one
/// diagnostic each), different for every `index`.
fn broken_manifest(index: usize, bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 128);
    let mut block = 0;
    while text.len() < bytes {
        text.push_str(&format!(
            "deployment \"bench\" \"c{index}-b{block}\" {{\n  image = \"voodu-busybox:latest\"\n  imge  = \"a typo that makes the commit rejected, {index}/{block}\"\n}}\n"
        ));
        block += 1;
    }
    text
}

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new("git").args(args).current_dir(dir).output()?;
    if !output.status.success() {
        return Err(format!("git {args:?}: {}", String::from_utf8_lossy(&output.stderr)).into());
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

fn commit_and_push(work: &Path, message: &str) -> Result<String> {
    git(work, &["add", "-A"])?;
    git(work, &["commit", "-q", "-m", message])?;
    git(work, &["push", "-q", "origin", "main"])?;
    git(work, &["rev-parse", "HEAD"])
}

/// Waits until `status --json` shows `sha` as `field` (`last_applied`, `last_rejected`).
fn wait_for(data: &Path, field: &str, sha: &str, agent: &mut Agent) -> Result {
    let started = Instant::now();
    loop {
        let output = Command::new(AGENT)
            .args(["status", "--json", "--data-dir", path_str(data)?])
            .output()?;
        if let Ok(json) = serde_json::from_slice::<serde_json::Value>(&output.stdout)
            && json[field]["sha"] == sha
        {
            return Ok(());
        }
        if let Some(exit) = agent.0.try_wait()? {
            return Err(format!("the agent exited ({exit}) before {field} was {sha}").into());
        }
        if started.elapsed() > Duration::from_secs(300) {
            return Err(format!("{field} never became {sha}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn memory_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|line| line.starts_with(&format!("{field}:")))
        .ok_or_else(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(line.split_whitespace().nth(1).ok_or("no value")?.parse()?)
}
