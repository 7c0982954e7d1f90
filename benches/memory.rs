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

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Repo, Result, env_number, memory_kib, path_str};

fn main() -> Result {
    let measuring = support::measuring();
    if !support::engine_allowed("memory") {
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
    let repo = Repo::new(root.path())?;
    let remote = &repo.remote;
    let data = root.path().join("data");
    repo.write("README.md", "no manifests yet\n")?;
    let first = repo.commit("start")?;
    let mut agent = Agent(
        Command::new(support::agent())
            .args([
                "--repo",
                path_str(remote)?,
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
    std::thread::sleep(support::figure_wait(Duration::from_secs(3)));
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
        repo.write("broken.hcl", &broken_manifest(index, commit_bytes))?;
        let sha = repo.commit(&format!("broken {index}"))?;
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
    std::thread::sleep(support::figure_wait(Duration::from_secs(5)));
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

/// Waits until `status --json` shows `sha` as `field` (`last_applied`, `last_rejected`).
fn wait_for(data: &Path, field: &str, sha: &str, agent: &mut Agent) -> Result {
    let started = Instant::now();
    loop {
        let output = Command::new(support::agent())
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
